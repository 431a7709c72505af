import BrokerCore
import Logging
import NIOCore
import Wire

/// One client connection's state, with no I/O: its life (`State`), and one sub-machine per concern, each with
/// its own tests: the requests in flight and their answers in order (`RequestPipeline`), the subscriptions and
/// their pushes (`SubscriptionFlow`), the byte budgets (`BackPressure`), the frame timeout (`FrameWatch`) and the
/// bytes owed to the socket (`ConnectionOutput`). The protocol session (`ServerSession`) decodes the frames.
///
/// Each event (bytes read, an answer from the broker, the socket draining, a timer) goes in through a method;
/// what the connection must do comes out as `Action`s, in order, and the bytes to write through `nextWrite()`,
/// which `ConnectionHandler` performs. The machine never touches the channel: what it needs to know of the socket
/// comes with each event as an `IOState`. It runs on the connection's event loop only.
struct ConnectionStateMachine {
    struct Configuration {
        var limits: ServerSession.Limits
        var timeouts: Timeouts
        /// The channel's high write watermark: past it the socket counts as full until it drains.
        var highWatermark: Int
    }

    /// What the socket looks like when an event arrives.
    struct IOState {
        var isWritable: Bool
        /// Bytes written to the channel and not yet sent.
        var bufferedBytes: Int
        var now: NIODeadline
    }

    enum State: Equatable {
        /// Open; the client has not completed its `hello` (the handshake timer runs).
        case awaitingHello
        /// Open; requests come.
        case established
        /// The client shut its sending side: what it asked is answered, then the connection closes.
        case inputClosed
        /// The last word (an error, `goodbye`) is on its way: input is read and dropped until the close.
        case closing
        case closed
    }

    enum Action {
        /// Ask the channel for more bytes.
        case read
        /// Hand a command to the broker; its answer comes back through `answered(slot:_:io:)`. `subscription`: the
        /// queue a `subscribe` fills, or the one a write's event is not offered to (`quietChain`).
        case start(slot: UInt64, command: BrokerCommand, subscription: Subscription?)
        /// End a subscription in the broker.
        case unsubscribe(Subscription)
        /// The handshake is done: requests now come from this client.
        case established(clientName: String)
        case scheduleHandshakeTimeout(Duration)
        case cancelHandshakeTimeout
        /// Call `frameTimeout(io:)` at this deadline.
        case scheduleFrameTimeout(NIODeadline)
        /// Call `recheck(io:)` after this long (held back by the total byte budget, which others free).
        case scheduleRecheck(Duration)
        /// Write these last bytes, then close: once the client closes or a linger time passed (`lingering`: the
        /// client must be able to read an error or `goodbye`), or once they are out.
        case close(lastWrites: [ByteBuffer], lingering: Bool)
    }

    private let configuration: Configuration
    private var logger: Logger
    private(set) var state = State.awaitingHello
    private var session: ServerSession
    private var input = ByteBuffer()
    private var pipeline = RequestPipeline<ConnectionRequest>()
    private var flow: SubscriptionFlow
    private var pressure: BackPressure
    private var frames: FrameWatch
    private var output = ConnectionOutput()

    /// The socket as of the current event; `output.count` bytes are owed to it on top.
    private var io = IOState(isWritable: true, bufferedBytes: 0, now: .uptimeNanoseconds(0))
    private var actions: [Action] = []

    /// `makeSubscription` builds the queue a `subscribe`'s pushes go to (its wake-up is the handler's business).
    init(
        configuration: Configuration, budget: ByteBudget, subscriptions quota: SubscriptionQuota, logger: Logger,
        makeSubscription: @escaping (UInt32, Namespace, String) -> Subscription
    ) {
        self.configuration = configuration
        self.logger = logger
        self.session = ServerSession(limits: configuration.limits)
        self.flow = SubscriptionFlow(quota: quota, make: makeSubscription)
        self.pressure = BackPressure(budget: budget)
        self.frames = FrameWatch(limit: configuration.timeouts.frame)
    }

    private var isClosing: Bool { state == .closing || state == .closed }

    // MARK: Events

    /// The connection is open: the handshake must complete in time.
    mutating func activate(io: IOState) -> [Action] {
        begin(io)
        pressure.opened()
        emit(.scheduleHandshakeTimeout(configuration.timeouts.handshake))
        return end()
    }

    /// Bytes arrived.
    mutating func received(_ bytes: ByteBuffer, io: IOState) -> [Action] {
        begin(io)
        guard !isClosing else { return end() }
        if input.readableBytes == 0 {
            input = bytes  // no copy: what was read becomes the input
        } else {
            var bytes = bytes
            input.writeBuffer(&bytes)
        }
        processInput()
        return end()
    }

    /// The channel asks whether to read more.
    mutating func readRequested(io: IOState) -> [Action] {
        begin(io)
        if canRead {
            emit(.read)
        } else {
            pressure.readHeld = true
        }
        return end()
    }

    /// The broker answered the request in `slot`.
    mutating func answered(slot: UInt64, _ result: consuming Result<BrokerAnswer, BrokerError>, io: IOState) -> [Action] {
        begin(io)
        take(slot: slot, result)
        return answersTaken()
    }

    /// The broker answered these requests (all the answers of one commit group for this connection, say): one
    /// event, one write.
    mutating func answered(
        _ answers: some Sequence<(UInt64, Result<BrokerAnswer, BrokerError>)>, io: IOState
    ) -> [Action] {
        begin(io)
        for (slot, result) in answers { take(slot: slot, result) }
        return answersTaken()
    }

    /// The handler handed the `start` of `slot` to the broker. When its answer came at once, `answered`
    /// already went on and this does nothing.
    mutating func startReturned(slot: UInt64, io: IOState) -> [Action] {
        guard awaits(slot: slot) else { return [] }
        begin(io)
        _ = pipeline.returned(slot: slot)
        startHeld()
        processInput()
        return end()
    }

    /// Whether the next request waits for the handler to come back from the start of `slot`.
    func awaits(slot: UInt64) -> Bool { pipeline.awaitingStart == slot }

    /// Subscriptions `ids` have pushes waiting (each says so once, when its empty buffer gets a push).
    mutating func pushesWaiting(_ ids: [UInt32], io: IOState) -> [Action] {
        begin(io)
        flow.waiting(ids)
        drainSubscriptions()
        return end()
    }

    mutating func writabilityChanged(io: IOState) -> [Action] {
        begin(io)
        if io.isWritable {
            account()
            drainSubscriptions()
            processInput()
            resumeReading()
        }
        return end()
    }

    /// The client shut its sending side.
    mutating func inputClosed(io: IOState) -> [Action] {
        begin(io)
        switch state {
        case .closing:
            // Our last word (an error, goodbye) is on its way and the client has nothing more to say: close
            // once what is written is out, rather than keep the connection for the linger time.
            emit(.close(lastWrites: [], lingering: false))
        case .awaitingHello, .established:
            // The requests already sent are still answered (closeIfDone), then the connection closes.
            state = .inputClosed
            processInput()
            closeIfDone()
        case .inputClosed, .closed:
            break
        }
        return end()
    }

    mutating func handshakeTimeout(io: IOState) -> [Action] {
        begin(io)
        // A timer already due when the hello came, in the same turn, finds the handshake done.
        if case .established = session.state { return end() }
        timedOut("no hello within \(configuration.timeouts.handshake)")
        return end()
    }

    mutating func frameTimeout(io: IOState) -> [Action] {
        begin(io)
        switch frames.fired(now: io.now) {
        case .idle: break
        case .timedOut: timedOut("a frame was left incomplete for \(configuration.timeouts.frame)")
        case .watchAgain: watchPartialFrame()
        }
        return end()
    }

    mutating func recheck(io: IOState) -> [Action] {
        begin(io)
        pressure.rechecked()
        account()
        processInput()
        return end()
    }

    /// Shutdown: the answers that are ready, then `goodbye`, then close.
    mutating func goodbye(_ message: String, io: IOState) -> [Action] {
        begin(io)
        guard !isClosing else { return end() }
        flushAnswers()
        drainSubscriptions()
        output.append(
            .goodbye(.init(code: .shuttingDown, message: message)), id: 0,
            maxFrameLength: configuration.limits.maxFrameLength)
        close(lingering: true)
        return end()
    }

    /// The connection is gone: forget everything, end every subscription. (The handler cancels the timers.)
    mutating func closed() -> [Action] {
        state = .closed
        actions = []
        output.discard()
        pressure.release()
        input = ByteBuffer()
        pipeline.reset()
        for subscription in flow.closeAll() { emit(.unsubscribe(subscription)) }
        return end()
    }

    /// After the handler performed the actions of a turn: the bytes to write, in order (nothing once closing: the
    /// last writes went with `close`). They stay across the events of one turn (a read's answer is an event of its
    /// own), so a turn is one write, however many events it had.
    mutating func nextWrite() -> ByteBuffer? {
        guard !isClosing else {
            output.discard()
            return nil
        }
        return output.next()
    }

    /// Whether `nextWrite()` has bytes to hand out.
    var owesWrites: Bool { output.count > 0 && !isClosing }

    /// After the actions of a turn were performed: lets go of the bytes already decoded. What the daemon keeps
    /// of a request owns its bytes, so the receive buffer must not stay alive, nor grow, because of them: an
    /// empty input holds no storage, and the rest of a partial frame moves to storage of its own.
    mutating func turnEnded() {
        if input.readableBytes == 0 {
            if input.capacity > 0 { input = ByteBuffer() }
        } else if input.readerIndex > 0 {
            var rest = ByteBufferAllocator().buffer(capacity: input.readableBytes)
            rest.writeBuffer(&input)
            input = rest
        }
    }

    /// Takes back the array a turn returned, once its actions have been performed, to emit the next turn's
    /// actions into the same storage (a turn neither allocates nor regrows one).
    mutating func recycle(_ performed: inout [Action]) {
        guard actions.isEmpty, performed.capacity > 0 else { return }
        performed.removeAll(keepingCapacity: true)
        swap(&actions, &performed)
    }

    // MARK: Turns

    private mutating func begin(_ io: IOState) {
        self.io = io
        actions.removeAll(keepingCapacity: true)
    }

    private mutating func end() -> [Action] {
        let out = actions
        actions = []
        return out
    }

    private mutating func emit(_ action: consuming Action) {
        actions.append(action)
    }

    /// After answers were taken: those next in request order go out, and requests they held back start.
    private mutating func answersTaken() -> [Action] {
        flushAnswers()
        processInput()
        resumeReading()
        closeIfDone()
        return end()
    }

    // MARK: Input

    /// Whether the socket takes more: writable when the event came, and not filled past the watermark since.
    private var writable: Bool {
        io.isWritable && io.bufferedBytes + output.count <= configuration.highWatermark
    }

    private var canRead: Bool {
        mutating get { isClosing || (input.readableBytes < pressure.budget.perConnection && mayStartRequests()) }
    }

    private mutating func mayStartRequests() -> Bool {
        let verdict = pressure.mayStart(
            inFlight: pipeline.inFlight, maxInFlight: configuration.limits.maxInFlight, writable: writable,
            unsent: pipeline.readyBytes + io.bufferedBytes + output.count)
        switch verdict {
        case .start: return true
        case .wait: return false
        case .waitForOthers:
            emit(.scheduleRecheck(BackPressure.recheckDelay))
            return false
        }
    }

    /// Brings this connection's count in the shared budget up to date.
    private mutating func account() {
        pressure.account(input.readableBytes + pipeline.readyBytes + io.bufferedBytes + output.count)
    }

    private mutating func resumeReading() {
        guard pressure.readHeld, state != .inputClosed, canRead else { return }
        pressure.readHeld = false
        emit(.read)
    }

    /// Turns buffered bytes into requests while the in-flight cap and the socket allow.
    private mutating func processInput() {
        var progress = true
        while progress {
            progress = false
            while !isClosing, pipeline.awaitingStart == nil, mayStartRequests(), let step = session.next(from: &input) {
                progress = true
                frames.decoded()
                switch consume step {
                case .reply(let welcome):
                    if state == .awaitingHello { state = .established }
                    emit(.cancelHandshakeTimeout)
                    if case .established(let version, let name) = session.state {
                        logger[metadataKey: "client"] = "\(name)"
                        logger.debug("handshake done", metadata: ["protocol": "\(version)"])
                        emit(.established(clientName: name))
                    }
                    output.append(welcome)
                case .refuse(let error):
                    let id = error.getInteger(at: error.readerIndex + 8, as: UInt32.self) ?? 0
                    _ = pipeline.admit(id: id, answer: error)
                case .close(let error):
                    logger.debug("closing the connection after a protocol error")
                    flushAnswers()
                    output.append(error)
                    close(lingering: true)
                    return
                case .request(let id, let message):
                    accept(id: id, message)
                }
            }
            // Answers given at once free their slots here, which may let more buffered requests in.
            flushAnswers()
        }
        account()
        resumeReading()
        watchPartialFrame()
        closeIfDone()
    }

    /// A frame begun must be finished within the frame timeout, unless the daemon itself stopped reading.
    private mutating func watchPartialFrame() {
        let waiting = input.readableBytes > 0 && !pressure.readHeld && !isClosing && mayStartRequests()
        if let deadline = frames.watch(waiting: waiting, now: io.now) { emit(.scheduleFrameTimeout(deadline)) }
    }

    // MARK: Closing

    /// The handshake or a frame took too long: an error, then close.
    private mutating func timedOut(_ what: String) {
        guard !isClosing else { return }
        logger.debug("closing a connection: \(what)")
        output.append(ServerSession.errorFrame(WireError(.timedOut, what), id: 0))
        close(lingering: true)
    }

    /// After a half-close, closes once every request has been answered and written.
    private mutating func closeIfDone() {
        guard state == .inputClosed, pipeline.inFlight == 0 else { return }
        if input.readableBytes > 0, session.state != .closed {
            logger.debug("the client half-closed in the middle of a frame")
        }
        pressure.readHeld = false  // the client sends nothing more: never read again
        close(lingering: false)
    }

    /// Everything owed to the socket goes with the close; nothing is written after it.
    private mutating func close(lingering: Bool) {
        state = .closing
        emit(.close(lastWrites: output.takeAll(), lingering: lingering))
    }

    // MARK: Requests

    private mutating func accept(id: UInt32, _ message: consuming ClientMessage) {
        let slot = pipeline.admit(id: id)
        // The only message that is no request: `hello` (`message.type` would box the message to find out).
        guard let request = ConnectionRequest(message) else {
            let error = WireError(.unexpectedMessage, "\(MessageType.hello.name) is only the first message of a connection")
            return record(slot: slot, .failure(error))
        }
        let isWrite = request.isWrite
        if pipeline.mayStart(isWrite: isWrite, slot: slot) {
            start(request, slot: slot)
        } else {
            pipeline.hold(request, slot: slot, isWrite: isWrite)
        }
    }

    private mutating func startHeld() {
        while let next = pipeline.nextHeld() { start(next.request, slot: next.slot) }
    }

    private mutating func start(_ request: consuming ConnectionRequest, slot: UInt64) {
        switch consume request {
        case .ping:
            record(slot: slot, .success(.pong(.init())))
        case .command(let command):
            var subscription: Subscription?
            if case .subscribe(let namespace, let name, _) = command {
                switch flow.open(namespace, name) {
                case .failure(let error): return record(slot: slot, .failure(error))
                case .success(let made):
                    pipeline.opens(subscription: made.id, slot: slot)
                    subscription = made
                }
            }
            pipeline.started(slot: slot, isWrite: command.isWrite)
            emit(.start(slot: slot, command: command, subscription: subscription))
        case .quietWrite(let subscriptionID, let command):
            // Only a subscription of this connection is named; the broker silences it only if it follows the store
            // written (`BrokerRequest.subscription`). An unknown id (one that lagged and was forgotten) names none:
            // a plain write, nothing is lost.
            pipeline.started(slot: slot, isWrite: true)
            emit(.start(slot: slot, command: command, subscription: flow[subscriptionID]))
        case .unsubscribe(let subscriptionID):
            if let subscription = flow.close(subscriptionID) {
                emit(.unsubscribe(subscription))
                record(slot: slot, .success(.unsubscribed(.init(subscriptionID: subscription.id))))
            } else {
                record(
                    slot: slot, .failure(WireError(.notFound, "no subscription \(subscriptionID) on this connection")))
            }
        }
    }

    // MARK: Answers

    /// The answer of `slot`, recorded (it goes out once the answers before it have).
    private mutating func take(slot: UInt64, _ result: consuming Result<BrokerAnswer, BrokerError>) {
        if pipeline.returned(slot: slot) { startHeld() }
        switch consume result {
        case .success(let answer): record(slot: slot, .success(answer.message()))
        case .failure(let error): record(slot: slot, .failure(error.wireError))
        }
    }

    /// Writes the answer of `slot` if it is next in request order, else keeps it until the answers before it
    /// have gone out.
    private mutating func record(slot: UInt64, _ result: consuming Result<ServerMessage, WireError>) {
        let (place, wasWrite) = pipeline.answered(slot: slot)
        let maxFrameLength = configuration.limits.maxFrameLength
        switch place {
        case .gone:
            return
        case .next(let id):
            switch consume result {
            case .success(let message): output.append(message, id: id, maxFrameLength: maxFrameLength)
            case .failure(let error): output.append(ServerSession.errorFrame(error, id: id))
            }
            pipeline.removeFirst()
        case .behind(let id, let opensSubscription):
            switch consume result {
            case .success(let message):
                // Room for most answers at once: an empty buffer grows by doubling from the frame header's 16
                // bytes, four or five reallocations for a one-item answer.
                var out = ByteBufferAllocator().buffer(capacity: 512)
                ConnectionOutput.encode(message, id: id, maxFrameLength: maxFrameLength, into: &out)
                pipeline.keep(out, slot: slot, subscribed: opensSubscription != nil)
            case .failure(let error):
                pipeline.keep(ServerSession.errorFrame(error, id: id), slot: slot)
                if let opensSubscription { flow.close(opensSubscription) }
            }
        }
        if wasWrite { startHeld() }
    }

    /// Writes the answers that are next in request order; a `subscribed` among them lets its pushes follow.
    private mutating func flushAnswers() {
        var opened = false
        while let (answer, opensSubscription) = pipeline.popAnswer() {
            output.append(answer)
            if let opensSubscription {
                flow.flow(opensSubscription)
                opened = true
            }
        }
        if opened { drainSubscriptions() }
    }

    private mutating func drainSubscriptions() {
        guard !isClosing else { return }
        let room = io.isWritable ? configuration.highWatermark - io.bufferedBytes : -1
        flow.drain(into: &output, room: room, maxFrameLength: configuration.limits.maxFrameLength, logger: logger)
    }
}
