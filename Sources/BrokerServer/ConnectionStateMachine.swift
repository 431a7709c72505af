import BrokerCore
import DequeModule
import Logging
import NIOCore
import Wire

/// One client connection's state, with no I/O: the protocol session, the requests in flight and their answers
/// in request order, read-your-writes holds, subscriptions and their first push after `subscribed`, the byte
/// budgets, the timeouts, half-close and closing.
///
/// Each event (bytes read, an answer from the broker, the socket draining, a timer) goes in through a method;
/// what the connection must do comes out as `Action`s, in order, which `ConnectionHandler` performs. The
/// machine never touches the channel: what it needs to know of the socket comes with each event as an
/// `IOState`. It runs on the connection's event loop only.
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

    enum Action {
        /// Write these bytes (an answer, a push, `welcome`); `flush` follows.
        case write(ByteBuffer)
        /// Write these frames of a push (encoded once for every subscriber, with id 0) with this subscription id;
        /// `flush` follows.
        case writePush(ByteBuffer, subscriptionID: UInt32)
        /// Flush at the end of the turn, after the turn's answers (`takeOutput`) are written.
        case flush
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
        case cancelFrameTimeout
        /// Call `recheck(io:)` after this long (held back by the total byte budget, which others free).
        case scheduleRecheck(Duration)
        /// Write this last word, then close (after the client closes, or a linger time).
        case closeAfter(ByteBuffer)
        /// Close once everything written so far is out.
        case closeWhenWritten

        /// The bytes this action puts on the socket (`write` and `writePush`; 0 for the others).
        var outputBytes: Int {
            switch self {
            case .write(let bytes), .writePush(let bytes, _): bytes.readableBytes
            default: 0
            }
        }
    }

    private static let answerCapacity = 512
    /// What `output` starts with: the answers of a pipelined read cycle (16 write acknowledgements are 640 bytes).
    private static let outputCapacity = 1024

    private struct Slot {
        var id: UInt32
        var answer: ByteBuffer?
        var opensSubscription: UInt32?
    }

    private struct Held {
        var slot: UInt64
        var request: ConnectionRequest
    }

    private let configuration: Configuration
    private let budget: ByteBudget
    /// The subscriptions this connection and all together may hold; `subscriptions` counts in it.
    private let quota: SubscriptionQuota
    private let makeSubscription: (UInt32, Namespace, String) -> Subscription
    private var logger: Logger
    private var session: ServerSession
    private var input = ByteBuffer()

    /// Requests not yet answered on the wire, in request order; `base` is the absolute index of the first.
    private var slots = Deque<Slot>()
    private var base: UInt64 = 0
    /// Writes whose answer has not arrived, in slot order (writes start in slot order). An answered one is marked
    /// (`answeredBit`) and removed lazily at the front, so the oldest open write is found in O(1) amortized (a
    /// `Set` of the answered ones would hash every answer twice).
    private var openWrites = Deque<UInt64>()
    private static let answeredBit: UInt64 = 1 << 63
    /// Requests held back so that a read sees this connection's earlier writes (and later requests keep
    /// their order behind it).
    private var held = Deque<Held>()

    private var subscriptions: [UInt32: Subscription] = [:]
    /// Subscriptions whose `subscribed` answer has gone out, so their pushes may follow.
    private var flowing = Set<UInt32>()
    /// Subscriptions that said they have pushes waiting (`pushesWaiting`), in that order, not yet drained: only
    /// these are gone through, never every subscription of the connection (a connection may hold 20,000 of them,
    /// too many to go through, sorted, for every push).
    private var ready = Deque<UInt32>()
    private var nextSubscriptionID: UInt32 = 1

    private var readHeld = false
    /// The slot of the read handed out that has neither been answered nor come back from the handler
    /// (`startReturned`). The next request waits: a read is answered at once from memory, and its answer (up
    /// to a whole store) must count against the budgets before another request is started. Writes are
    /// answered after their commit, with a few bytes, so the requests of one read cycle start together and
    /// share a commit.
    private var awaitingStart: UInt64?
    private var closing = false
    /// The client shut its sending side: answer what it asked, then close.
    private var inputClosed = false
    /// Bytes of answers ready but not yet written (waiting behind an earlier request).
    private var readyBytes = 0
    /// What this connection counts for in `budget` now.
    private var accounted = 0
    private var handshakeArmed = false
    private var frameTimerArmed = false
    private var recheckArmed = false
    /// Frames decoded so far, and the partial frame now buffered (after which frame, since when).
    private var framesSeen: UInt64 = 0
    private var partialFrame: (index: UInt64, since: NIODeadline)?

    /// The socket as of the current event, and the bytes written since (not yet in `bufferedBytes`).
    private var io = IOState(isWritable: true, bufferedBytes: 0, now: .uptimeNanoseconds(0))
    private var emitted = 0
    private var actions: [Action] = []
    /// Answers given in request order, encoded straight into one buffer as they come (a buffer of their own each,
    /// copied again when the turn's writes are gathered, would be two allocations and a copy per answer); it goes
    /// out as one `write`, before the next action that must follow it on the socket, or when the handler takes it at
    /// the end of the turn (`takeOutput`).
    private var output = ByteBuffer()
    /// The last buffer `output` handed out, taken again for the next answers: by then the channel has written
    /// it and let go, so clearing it reuses its storage (a fresh buffer per read cycle would be the only
    /// allocation of a pipelined ping). If the channel still holds it, clearing allocates, as a fresh buffer would.
    private var spareOutput = ByteBuffer()
    /// The largest spare kept: an idle connection holds at most this (32 MiB at 4,096 connections).
    private static let spareOutputLimit = 8 * 1024

    /// `makeSubscription` builds the queue a `subscribe`'s pushes go to (its wake-up is the handler's business).
    init(
        configuration: Configuration, budget: ByteBudget, subscriptions quota: SubscriptionQuota, logger: Logger,
        makeSubscription: @escaping (UInt32, Namespace, String) -> Subscription
    ) {
        self.configuration = configuration
        self.budget = budget
        self.quota = quota
        self.logger = logger
        self.makeSubscription = makeSubscription
        self.session = ServerSession(limits: configuration.limits)
    }

    // MARK: Events

    /// The connection is open: the handshake must complete in time.
    mutating func activate(io: IOState) -> [Action] {
        begin(io)
        budget.connectionOpened()
        handshakeArmed = true
        emit(.scheduleHandshakeTimeout(configuration.timeouts.handshake))
        return end()
    }

    /// Bytes arrived.
    mutating func received(_ bytes: ByteBuffer, io: IOState) -> [Action] {
        begin(io)
        guard !closing else { return end() }  // after the last word, input is read and dropped until the close
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
            readHeld = true
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
    /// event, one flush.
    mutating func answered(
        _ answers: some Sequence<(UInt64, Result<BrokerAnswer, BrokerError>)>, io: IOState
    ) -> [Action] {
        begin(io)
        for (slot, result) in answers { take(slot: slot, result) }
        return answersTaken()
    }

    /// The answer of `slot`, recorded (it goes out once the answers before it have).
    private mutating func take(slot: UInt64, _ result: consuming Result<BrokerAnswer, BrokerError>) {
        if awaitingStart == slot {
            awaitingStart = nil
            startHeld()
        }
        switch consume result {
        case .success(let answer): record(slot: slot, .success(answer.message()))
        case .failure(let error): record(slot: slot, .failure(error.wireError))
        }
    }

    /// After answers were taken: those next in request order go out, and requests they held back start.
    private mutating func answersTaken() -> [Action] {
        flushAnswers()
        emit(.flush)
        processInput()
        resumeReading()
        closeIfDone()
        return end()
    }

    /// The handler handed the `start` of `slot` to the broker. When its answer came at once, `answered`
    /// already went on and this does nothing.
    mutating func startReturned(slot: UInt64, io: IOState) -> [Action] {
        guard awaits(slot: slot) else { return [] }
        begin(io)
        awaitingStart = nil
        startHeld()
        processInput()
        return end()
    }

    /// Whether the next request waits for the handler to come back from the start of `slot`.
    func awaits(slot: UInt64) -> Bool { awaitingStart == slot }

    /// Subscriptions `ids` have pushes waiting (each says so once, when its empty buffer gets a push).
    mutating func pushesWaiting(_ ids: [UInt32], io: IOState) -> [Action] {
        begin(io)
        ready.append(contentsOf: ids)
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
        if closing {
            // Our last word (an error, goodbye) is on its way and the client has nothing more to say: close
            // once what is written is out, rather than keep the connection for the linger time.
            emit(.closeWhenWritten)
            return end()
        }
        // A half-close: the requests already sent are still answered (closeIfDone), then the connection closes.
        inputClosed = true
        processInput()
        closeIfDone()
        return end()
    }

    mutating func handshakeTimeout(io: IOState) -> [Action] {
        begin(io)
        handshakeArmed = false
        timedOut("no hello within \(configuration.timeouts.handshake)")
        return end()
    }

    mutating func frameTimeout(io: IOState) -> [Action] {
        begin(io)
        frameTimerArmed = false
        if let partial = partialFrame {
            if partial.index == framesSeen, partial.since + .init(configuration.timeouts.frame) <= io.now {
                timedOut("a frame was left incomplete for \(configuration.timeouts.frame)")
            } else {
                watchPartialFrame()  // another frame since: its own deadline
            }
        }
        return end()
    }

    mutating func recheck(io: IOState) -> [Action] {
        begin(io)
        recheckArmed = false
        account()
        processInput()
        return end()
    }

    /// Shutdown: the answers that are ready, then `goodbye`, then close.
    mutating func goodbye(_ message: String, io: IOState) -> [Action] {
        begin(io)
        guard !closing else { return end() }
        flushAnswers()
        drainSubscriptions()
        closing = true
        var out = ByteBuffer()
        try? ServerMessage.goodbye(.init(code: .shuttingDown, message: message)).encode(
            id: 0, maxFrameLength: configuration.limits.maxFrameLength, into: &out)
        emit(.closeAfter(out))
        return end()
    }

    /// The connection is gone: forget everything, end every subscription.
    mutating func closed() -> [Action] {
        closing = true
        actions = []
        output = ByteBuffer()
        spareOutput = ByteBuffer()
        if handshakeArmed { emit(.cancelHandshakeTimeout) }
        if frameTimerArmed { emit(.cancelFrameTimeout) }
        handshakeArmed = false
        frameTimerArmed = false
        budget.adjust(by: -accounted)
        budget.connectionClosed()
        accounted = 0
        readyBytes = 0
        input = ByteBuffer()
        slots = []
        openWrites = []
        for subscription in subscriptions.values { emit(.unsubscribe(subscription)) }
        quota.give(subscriptions.count)
        subscriptions = [:]
        flowing = []
        ready = []
        held = []
        return end()
    }

    /// The answers encoded into the turn's buffer and not yet handed out as a `write`: the handler takes them when
    /// it has performed every action of the turn, before it writes and flushes. They stay across the events of one
    /// turn (a read's answer is an event of its own, and a buffer per event would be two allocations and a copy per
    /// read) and count as emitted in each (`begin`).
    mutating func takeOutput() -> ByteBuffer? {
        guard output.readableBytes > 0 else { return nil }
        defer {
            keepSpare(output)
            output = ByteBuffer()
        }
        return output
    }

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

    // MARK: Turns

    private mutating func begin(_ io: IOState) {
        self.io = io
        // Answers still in `output` are not in the handler's count yet.
        emitted = output.readableBytes
        actions.removeAll(keepingCapacity: true)
    }

    private mutating func end() -> [Action] {
        // The array goes out whole; `recycle` brings its storage back once it has been performed, so a turn
        // neither allocates nor regrows one.
        let out = actions
        actions = []
        return out
    }

    /// Takes back the array a turn returned, once its actions have been performed, to emit the next turn's
    /// actions into the same storage.
    mutating func recycle(_ performed: inout [Action]) {
        guard actions.isEmpty, performed.capacity > 0 else { return }
        performed.removeAll(keepingCapacity: true)
        swap(&actions, &performed)
    }

    private mutating func emit(_ action: consuming Action) {
        switch action {
        case .write, .writePush, .closeAfter, .closeWhenWritten: emitOutput()
        default: break
        }
        emitted += action.outputBytes
        actions.append(action)
    }

    /// The answers encoded into `output` so far, as one write ahead of an action that must follow them on the
    /// socket (their bytes are already in `emitted`).
    private mutating func emitOutput() {
        guard output.readableBytes > 0 else { return }
        actions.append(.write(output))
        keepSpare(output)
        output = ByteBuffer()
    }

    /// Whether the socket takes more: writable when the event came, and not filled past the watermark since.
    private var writable: Bool {
        io.isWritable && io.bufferedBytes + emitted <= configuration.highWatermark
    }

    // MARK: Input

    private var canRead: Bool {
        mutating get { closing || (input.readableBytes < budget.perConnection && mayStartRequests()) }
    }

    /// Whether another request may start: under the in-flight cap, the socket taking answers, this
    /// connection's unsent answers under its byte cap, and, when all connections together hold more than
    /// `--max-total-bytes`, this one under its share (a connection that holds nothing is always served).
    private mutating func mayStartRequests() -> Bool {
        guard slots.count < configuration.limits.maxInFlight, writable else { return false }
        let unsent = readyBytes + io.bufferedBytes + emitted
        guard unsent < budget.perConnection else { return false }
        if accounted > 0, !budget.allows(accounted) {
            if !recheckArmed {
                recheckArmed = true
                emit(.scheduleRecheck(.milliseconds(50)))
            }
            return false
        }
        return true
    }

    /// Brings this connection's count in the shared budget up to date.
    private mutating func account() {
        let now = input.readableBytes + readyBytes + io.bufferedBytes + emitted
        if now != accounted {
            budget.adjust(by: now - accounted)
            accounted = now
        }
    }

    private mutating func resumeReading() {
        guard readHeld, !inputClosed, canRead else { return }
        readHeld = false
        emit(.read)
    }

    /// Turns buffered bytes into requests while the in-flight cap and the socket allow.
    private mutating func processInput() {
        var progress = true
        while progress {
            progress = false
            while !closing, awaitingStart == nil, mayStartRequests(), let step = session.next(from: &input) {
                progress = true
                framesSeen &+= 1
                switch consume step {
                case .reply(let welcome):
                    if handshakeArmed {
                        handshakeArmed = false
                        emit(.cancelHandshakeTimeout)
                    }
                    if case .established(let version, let name) = session.state {
                        logger[metadataKey: "client"] = "\(name)"
                        logger.debug("handshake done", metadata: ["protocol": "\(version)"])
                        emit(.established(clientName: name))
                    }
                    emit(.write(welcome))
                case .refuse(let error):
                    let id = error.getInteger(at: error.readerIndex + 8, as: UInt32.self) ?? 0
                    slots.append(Slot(id: id, answer: error))
                    readyBytes += error.readableBytes
                case .close(let error):
                    logger.debug("closing the connection after a protocol error")
                    flushAnswers()
                    closing = true
                    emit(.closeAfter(error))
                    return
                case .request(let id, let message):
                    accept(id: id, message)
                }
            }
            // Answers given at once free their slots here, which may let more buffered requests in.
            flushAnswers()
        }
        emit(.flush)
        account()
        resumeReading()
        watchPartialFrame()
        closeIfDone()
    }

    /// A frame begun must be finished within the frame timeout, unless the daemon itself stopped reading.
    private mutating func watchPartialFrame() {
        let waitingForClient = input.readableBytes > 0 && !readHeld && !closing && mayStartRequests()
        guard waitingForClient else {
            // The timer, if armed, is left to fire and find nothing to time out (or a later partial frame, whose
            // own deadline it sets): under pipelining most reads end inside a frame, so a timer per partial frame
            // would be scheduled and cancelled on nearly every read. It is cancelled when the connection closes.
            partialFrame = nil
            return
        }
        if partialFrame?.index != framesSeen {
            partialFrame = (framesSeen, io.now)
        }
        guard !frameTimerArmed, let started = partialFrame?.since else { return }
        frameTimerArmed = true
        emit(.scheduleFrameTimeout(started + .init(configuration.timeouts.frame)))
    }

    /// The handshake or a frame took too long: an error, then close.
    private mutating func timedOut(_ what: String) {
        guard !closing else { return }
        logger.debug("closing a connection: \(what)")
        closing = true
        emit(.closeAfter(ServerSession.errorFrame(WireError(.timedOut, what), id: 0)))
    }

    /// After a half-close, closes once every request has been answered and written.
    private mutating func closeIfDone() {
        guard inputClosed, !closing, slots.isEmpty else { return }
        if input.readableBytes > 0, session.state != .closed {
            logger.debug("the client half-closed in the middle of a frame")
        }
        closing = true
        emit(.closeWhenWritten)
    }

    // MARK: Requests

    private mutating func accept(id: UInt32, _ message: consuming ClientMessage) {
        let slot = base + UInt64(slots.count)
        slots.append(Slot(id: id, answer: nil))
        // The only message that is no request: `hello` (`message.type` would box the message to find out).
        guard let request = ConnectionRequest(message) else {
            let error = WireError(.unexpectedMessage, "\(MessageType.hello.name) is only the first message of a connection")
            return record(slot: slot, .failure(error))
        }
        if held.isEmpty, mayStart(request, slot: slot) {
            start(request, slot: slot)
        } else {
            held.append(Held(slot: slot, request: request))
        }
    }

    /// A read waits for this connection's earlier writes, so a client reads its own writes.
    private mutating func mayStart(_ request: ConnectionRequest, slot: UInt64) -> Bool {
        if request.isWrite { return true }
        while let oldest = openWrites.first, oldest & Self.answeredBit != 0 { openWrites.removeFirst() }
        return (openWrites.first ?? .max) > slot
    }

    private mutating func startHeld() {
        while awaitingStart == nil, let first = held.indices.first, mayStart(held[first].request, slot: held[first].slot) {
            let next = held.removeFirst()  // moved out, not copied
            start(next.request, slot: next.slot)
        }
    }

    private mutating func start(_ request: consuming ConnectionRequest, slot: UInt64) {
        switch consume request {
        case .ping:
            record(slot: slot, .success(.pong(.init())))
        case .command(let command):
            var subscription: Subscription?
            if case .subscribe = command {
                if subscriptions.count >= quota.perConnection {
                    let error = WireError(
                        .tooManySubscriptions,
                        "this connection holds \(subscriptions.count) subscriptions, the most it may "
                            + "(--max-subscriptions); unsubscribe first, or open another connection")
                    return record(slot: slot, .failure(error))
                }
                guard quota.take() else {
                    let error = WireError(
                        .tooManySubscriptions,
                        "the daemon holds \(quota.total) subscriptions for all its connections, the most it may "
                            + "(--max-total-subscriptions); unsubscribe first, or try again later")
                    return record(slot: slot, .failure(error))
                }
            }
            if case .subscribe(let namespace, let name, _) = command {
                let subscriptionID = nextSubscriptionID
                nextSubscriptionID &+= 1
                if nextSubscriptionID == 0 { nextSubscriptionID = 1 }
                let made = makeSubscription(subscriptionID, namespace, name)
                subscriptions[subscriptionID] = made
                slots[Int(slot - base)].opensSubscription = subscriptionID
                subscription = made
            }
            if command.isWrite { openWrites.append(slot) } else { awaitingStart = slot }
            emit(.start(slot: slot, command: command, subscription: subscription))
        case .quietWrite(let subscriptionID, let command):
            // Only a subscription of this connection is named; the broker silences it only if it follows the store
            // written (`BrokerRequest.subscription`). An unknown id (one that lagged and was forgotten) names none:
            // a plain write, nothing is lost.
            openWrites.append(slot)
            emit(.start(slot: slot, command: command, subscription: subscriptions[subscriptionID]))
        case .unsubscribe(let subscriptionID):
            if let subscription = subscriptions.removeValue(forKey: subscriptionID) {
                quota.give()
                flowing.remove(subscriptionID)
                emit(.unsubscribe(subscription))
                record(slot: slot, .success(.unsubscribed(.init(subscriptionID: subscription.id))))
            } else {
                record(
                    slot: slot, .failure(WireError(.notFound, "no subscription \(subscriptionID) on this connection")))
            }
        }
    }

    // MARK: Output

    /// Keeps the answer of `slot` until the answers before it have gone out.
    private mutating func record(slot: UInt64, _ result: consuming Result<ServerMessage, WireError>) {
        let openWrite = openWriteIndex(slot)
        if let openWrite { openWrites[openWrite] |= Self.answeredBit }
        let wasWrite = openWrite != nil
        guard slot >= base, slot - base < UInt64(slots.count) else { return }  // the connection went away
        let index = Int(slot - base)
        let id = slots[index].id
        // Set on each path that keeps the answer, not made empty first: `ByteBuffer()` is a copy of one shared empty
        // buffer, a reference count on an object every connection touches.
        var out: ByteBuffer
        switch consume result {
        case .success(let message):
            if index == 0, slots[0].opensSubscription == nil {
                // Next in request order: it goes out now, encoded where the turn's answers gather, and its slot is
                // free. (An answer that opens a subscription goes through `flushAnswers`, which starts its pushes.)
                if output.capacity == 0 { output = Self.reuse(&spareOutput) }
                let maxFrameLength = configuration.limits.maxFrameLength
                emitted += Self.append(message, id: id, maxFrameLength: maxFrameLength, to: &output)
                slots.removeFirst()
                base += 1
                if wasWrite { startHeld() }
                return
            }
            // Room for most answers at once: an empty buffer grows by doubling from the frame header's 16 bytes,
            // four or five reallocations for a one-item answer.
            out = ByteBufferAllocator().buffer(capacity: Self.answerCapacity)
            Self.append(message, id: id, maxFrameLength: configuration.limits.maxFrameLength, to: &out)
        case .failure(let error):
            out = ServerSession.errorFrame(error, id: id)
            if let subscriptionID = slots[index].opensSubscription {
                if subscriptions.removeValue(forKey: subscriptionID) != nil { quota.give() }
                slots[index].opensSubscription = nil
            }
        }
        slots[index].answer = out
        readyBytes += out.readableBytes
        if wasWrite { startHeld() }
    }

    /// Keeps `buffer`, just handed out, as the next turn's spare, unless it is larger than a spare may be.
    private mutating func keepSpare(_ buffer: ByteBuffer) {
        spareOutput = buffer.capacity <= Self.spareOutputLimit ? buffer : ByteBuffer()
    }

    /// The spare emptied for the turn's answers (its storage once the channel has let go of it), or a new buffer.
    private static func reuse(_ spare: inout ByteBuffer) -> ByteBuffer {
        var buffer = spare
        spare = ByteBuffer()
        guard buffer.capacity >= outputCapacity, buffer.capacity <= spareOutputLimit else {
            return ByteBufferAllocator().buffer(capacity: outputCapacity)
        }
        buffer.clear()
        return buffer
    }

    /// Appends `message`'s frames to `buffer`, or, when it cannot be sent (too long for a frame, say), the error
    /// frame that says so in its place; returns the bytes appended.
    ///
    /// Static: a method of the machine writing into `output`, one of its own properties, makes Swift copy the whole
    /// machine for each call (the read of `self` overlaps the `inout` access), 15 retains and releases of shared
    /// objects per answer.
    @discardableResult
    private static func append(
        _ message: ServerMessage, id: UInt32, maxFrameLength: Int, to buffer: inout ByteBuffer
    ) -> Int {
        let start = buffer.writerIndex
        do {
            try message.encode(id: id, maxFrameLength: maxFrameLength, into: &buffer)
        } catch {
            buffer.moveWriterIndex(to: start)
            buffer.writeImmutableBuffer(ServerSession.errorFrame(error, id: id))
        }
        return buffer.writerIndex - start
    }

    /// Where `slot` is in `openWrites`, if it is a write not answered yet.
    private func openWriteIndex(_ slot: UInt64) -> Int? {
        guard let first = openWrites.first, slot >= first & ~Self.answeredBit else { return nil }
        // Slots are increasing: a binary search finds it.
        var low = 0
        var high = openWrites.count
        while low < high {
            let middle = (low + high) / 2
            if openWrites[middle] & ~Self.answeredBit < slot { low = middle + 1 } else { high = middle }
        }
        // Equal only while unanswered: an answered one carries the mark.
        return low < openWrites.count && openWrites[low] == slot ? low : nil
    }

    /// Writes the answers that are next in request order.
    private mutating func flushAnswers() {
        var opened = false
        while let first = slots.first, let answer = first.answer {
            readyBytes -= answer.readableBytes
            emit(.write(answer))
            if let subscriptionID = first.opensSubscription, subscriptions[subscriptionID] != nil {
                flowing.insert(subscriptionID)
                // What it was offered before (its snapshot, history) woke the connection while it could not
                // flow yet: drained now.
                ready.append(subscriptionID)
                opened = true
            }
            slots.removeFirst()
            base += 1
        }
        if opened { drainSubscriptions() }
    }

    /// Writes the pushes of the subscriptions that are ready while the socket takes them; one the socket stopped
    /// taking stays first in line.
    private mutating func drainSubscriptions() {
        guard !closing else { return }
        var wrote = false
        while writable, let subscriptionID = ready.first {
            guard flowing.contains(subscriptionID), let subscription = subscriptions[subscriptionID] else {
                ready.removeFirst()  // gone, or not flowing yet (it is drained when its `subscribed` goes out)
                continue
            }
            var drained = false
            pushing: while writable {
                let pushes = subscription.take(max: 32)
                if pushes.isEmpty {
                    drained = true
                    break
                }
                for shared in pushes {
                    // Encoded once for every subscriber of the commit (with id 0); each connection writes the
                    // frames with its own subscription id.
                    let encoded = shared.encoded { push in
                        // Room for a small event at once (an empty buffer grows from 16 bytes by doubling).
                        var out = ByteBufferAllocator().buffer(capacity: Self.answerCapacity)
                        do throws(WireError) {
                            try push.message.encode(id: 0, maxFrameLength: configuration.limits.maxFrameLength, into: &out)
                        } catch {
                            logger.warning(
                                "ending subscriptions: a push cannot be sent: \(error.message)",
                                metadata: ["store": "\(subscription.name)"])
                            out.clear()
                        }
                        return out
                    }
                    guard encoded.readableBytes > 0 else {
                        // Never skipped (that would be a gap): the subscription ends with `lagged` in its place.
                        var out = ByteBuffer()
                        try? subscription.endBefore(shared.push).message.encode(
                            id: subscriptionID, maxFrameLength: configuration.limits.maxFrameLength, into: &out)
                        emit(.write(out))
                        wrote = true
                        break pushing
                    }
                    emit(.writePush(encoded, subscriptionID: subscriptionID))
                    wrote = true
                }
            }
            if subscription.isEnded, !subscription.hasPending {
                // It lagged: the notice is out; the subscription is over.
                if subscriptions.removeValue(forKey: subscriptionID) != nil { quota.give() }
                flowing.remove(subscriptionID)
                drained = true
            }
            guard drained else { break }  // the socket is full: this one goes on first when it drains
            ready.removeFirst()
        }
        if wrote { emit(.flush) }
    }
}
