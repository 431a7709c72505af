import BrokerCore
import DequeModule
import Logging
import NIOCore
import Synchronization
import Wire

/// One client connection: the protocol session, the requests in flight, the answers in request order and
/// the pushes of its subscriptions.
///
/// Everything here runs on the channel's event loop. The broker answers from other threads; answers hop back
/// with `execute`. Back-pressure: the handler stops reading when `maxInFlight` requests are unanswered or
/// when the socket's send buffer is full (the channel is not writable), so a client that pipelines without
/// reading cannot grow the daemon's memory; a subscriber that does not read fills its bounded subscription
/// buffer and is told it lagged.
final class ConnectionHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let broker: Broker
    private let limits: ServerSession.Limits
    private let subscriberBuffer: Int
    private let registry: ConnectionRegistry
    private let budget: ByteBudget
    private let timeouts: Timeouts
    private var requestContext: RequestContext
    private var logger: Logger
    private var session: ServerSession
    private var input = ByteBuffer()
    private var context: ChannelHandlerContext?

    /// Requests not yet answered on the wire, in request order; `base` is the absolute index of the first.
    private var slots = Deque<Slot>()
    private var base: UInt64 = 0
    /// Writes whose answer has not arrived.
    private var openWrites = Set<UInt64>()
    /// Requests held back so that a read sees this connection's earlier writes (and later requests keep
    /// their order behind it).
    private var held = Deque<Held>()

    private var subscriptions: [UInt32: Subscription] = [:]
    /// Subscriptions whose `subscribed` answer has gone out, so their pushes may follow.
    private var flowing = Set<UInt32>()
    private var nextSubscriptionID: UInt32 = 1

    private var readHeld = false
    private var closing = false
    /// The client shut its sending side: answer what it asked, then close.
    private var inputClosed = false
    /// Bytes of answers ready but not yet written (waiting behind an earlier request).
    private var readyBytes = 0
    /// What this connection counts for in `budget` now.
    private var accounted = 0
    private var recheck: Scheduled<Void>?
    private var handshakeTimer: Scheduled<Void>?
    private var frameTimer: Scheduled<Void>?
    /// Frames decoded so far, and the partial frame now buffered (after which frame, since when).
    private var framesSeen: UInt64 = 0
    private var partialFrame: (index: UInt64, since: NIODeadline)?
    /// Set while `processInput` runs: answers given synchronously (reads from memory) must not re-enter it.
    private var processing = false

    private struct Slot {
        var id: UInt32
        var answer: ByteBuffer?
        var opensSubscription: UInt32?
    }

    private struct Held {
        var slot: UInt64
        var id: UInt32
        var request: ConnectionRequest
    }

    init(
        broker: Broker, limits: ServerSession.Limits, subscriberBuffer: Int, registry: ConnectionRegistry,
        budget: ByteBudget, timeouts: Timeouts, context: RequestContext, logger: Logger
    ) {
        self.broker = broker
        self.budget = budget
        self.timeouts = timeouts
        self.requestContext = context
        self.limits = limits
        self.subscriberBuffer = subscriberBuffer
        self.registry = registry
        self.logger = logger
        self.session = ServerSession(limits: limits)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    /// The context holds this handler: keeping it past removal would be a cycle that outlives the connection.
    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        registry.add(context.channel, goodbye: NIOLoopBound(self, eventLoop: context.eventLoop))
        budget.connectionOpened()
        let loop = NIOLoopBound(self, eventLoop: context.eventLoop)
        handshakeTimer = context.eventLoop.scheduleTask(in: .init(timeouts.handshake)) {
            loop.value.timedOut("no hello within \(loop.value.timeouts.handshake)")
        }
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        closing = true
        handshakeTimer?.cancel()
        frameTimer?.cancel()
        recheck?.cancel()
        budget.adjust(by: -accounted)
        budget.connectionClosed()
        accounted = 0
        readyBytes = 0
        input = ByteBuffer()
        slots = []
        registry.remove(context.channel)
        for subscription in subscriptions.values { broker.unsubscribe(subscription) }
        subscriptions = [:]
        flowing = []
        held = []
        logger.debug("connection closed")
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        logger.debug("connection error: \(error)")
        context.close(promise: nil)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case .inputClosed = event as? ChannelEvent {
            if closing {
                // Our last word (an error, goodbye) is on its way and the client has nothing more to say: close
                // once what is written is out, rather than keep the connection for the linger time.
                let channel = context.channel
                context.writeAndFlush(wrapOutboundOut(ByteBuffer())).whenComplete { _ in channel.close(promise: nil) }
                return
            }
            // A half-close: the requests already sent are still answered (closeIfDone), then the connection closes.
            inputClosed = true
            processInput()
            closeIfDone()
        }
        context.fireUserInboundEventTriggered(event)
    }

    /// After a half-close, closes once every request has been answered and written.
    private func closeIfDone() {
        guard inputClosed, !closing, slots.isEmpty, let context else { return }
        if input.readableBytes > 0, session.state != .closed {
            logger.debug("the client half-closed in the middle of a frame")
        }
        closing = true
        // Writes complete in order: once this empty one is written, so is every answer before it.
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(ByteBuffer())).whenComplete { _ in channel.close(promise: nil) }
    }

    /// The handshake or a frame took too long: an error, then close.
    private func timedOut(_ what: String) {
        guard let context, !closing else { return }
        logger.debug("closing a connection: \(what)")
        closing = true
        let error = ServerSession.errorFrame(WireError(.timedOut, what), id: 0)
        context.channel.closeAfterLastWord(context.writeAndFlush(wrapOutboundOut(error)))
    }

    // MARK: Input

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !closing else { return }  // after the last word, input is read and dropped until the close
        var bytes = unwrapInboundIn(data)
        if input.readableBytes == 0 {
            input = bytes  // no copy: what was read becomes the input
        } else {
            input.writeBuffer(&bytes)
        }
        processInput()
    }

    func read(context: ChannelHandlerContext) {
        if canRead(context) {
            context.read()
        } else {
            readHeld = true
        }
    }

    private func canRead(_ context: ChannelHandlerContext) -> Bool {
        closing || (input.readableBytes < budget.perConnection && mayStartRequests(context))
    }

    /// Whether another request may start: under the in-flight cap, the socket taking answers, this
    /// connection's unsent answers under its byte cap, and, when all connections together hold more than
    /// `--max-total-bytes`, this one under its share (a connection that holds nothing is always served).
    private func mayStartRequests(_ context: ChannelHandlerContext) -> Bool {
        guard slots.count < limits.maxInFlight, context.channel.isWritable else { return false }
        let unsent = readyBytes + bufferedBytes(context)
        guard unsent < budget.perConnection else { return false }
        if accounted > 0, !budget.allows(accounted) {
            scheduleRecheck(context)
            return false
        }
        return true
    }

    private func bufferedBytes(_ context: ChannelHandlerContext) -> Int {
        (try? context.channel.syncOptions?.getOption(.bufferedWritableBytes)) ?? 0
    }

    /// Brings this connection's count in the shared budget up to date.
    private func account(_ context: ChannelHandlerContext) {
        let now = input.readableBytes + readyBytes + bufferedBytes(context)
        if now != accounted {
            budget.adjust(by: now - accounted)
            accounted = now
        }
    }

    /// Held back by the total budget, which other connections free: look again shortly.
    private func scheduleRecheck(_ context: ChannelHandlerContext) {
        guard recheck == nil else { return }
        let loop = NIOLoopBound(self, eventLoop: context.eventLoop)
        recheck = context.eventLoop.scheduleTask(in: .milliseconds(50)) {
            let handler = loop.value
            handler.recheck = nil
            guard let context = handler.context else { return }
            handler.account(context)
            handler.processInput()
        }
    }

    private func resumeReading() {
        guard readHeld, let context, !inputClosed, canRead(context) else { return }
        readHeld = false
        context.read()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            account(context)
            drainSubscriptions()
            processInput()
            resumeReading()
        }
        context.fireChannelWritabilityChanged()
    }

    /// Turns buffered bytes into requests while the in-flight cap and the socket allow.
    private func processInput() {
        guard let context, !processing else { return }
        processing = true
        defer { processing = false }
        var progress = true
        while progress {
            progress = false
            while !closing, mayStartRequests(context), let action = session.next(from: &input) {
                progress = true
                framesSeen &+= 1
                switch action {
                case .reply(let welcome):
                    handshakeTimer?.cancel()
                    handshakeTimer = nil
                    if case .established(let version, let name) = session.state {
                        logger[metadataKey: "client"] = "\(name)"
                        requestContext.clientName = name
                        logger.debug("handshake done", metadata: ["protocol": "\(version)"])
                    }
                    context.write(wrapOutboundOut(welcome), promise: nil)
                case .refuse(let error):
                    let id = error.getInteger(at: error.readerIndex + 8, as: UInt32.self) ?? 0
                    slots.append(Slot(id: id, answer: error))
                case .close(let error):
                    logger.debug("closing the connection after a protocol error")
                    flushAnswers()
                    closing = true
                    context.channel.closeAfterLastWord(context.writeAndFlush(wrapOutboundOut(error)))
                    return
                case .request(let id, let message):
                    accept(id: id, message)
                }
            }
            // Answers given at once free their slots here, which may let more buffered requests in.
            flushAnswers()
        }
        keepOnlyUnreadInput()
        context.flush()
        account(context)
        resumeReading()
        watchPartialFrame(context)
        closeIfDone()
    }

    /// Lets go of the bytes already decoded. What the daemon keeps of a request owns its bytes (payloads are
    /// copied when planned), so the receive buffer must not stay alive, nor grow, because of them: an empty
    /// input holds no storage, and the rest of a partial frame moves to storage of its own.
    private func keepOnlyUnreadInput() {
        if input.readableBytes == 0 {
            input = ByteBuffer()
        } else if input.readerIndex > 0 {
            var rest = ByteBufferAllocator().buffer(capacity: input.readableBytes)
            rest.writeBuffer(&input)
            input = rest
        }
    }

    /// A frame begun must be finished within the frame timeout, unless the daemon itself stopped reading.
    private func watchPartialFrame(_ context: ChannelHandlerContext) {
        let waitingForClient = input.readableBytes > 0 && !readHeld && !closing && mayStartRequests(context)
        guard waitingForClient else {
            frameTimer?.cancel()
            frameTimer = nil
            partialFrame = nil
            return
        }
        if partialFrame?.index != framesSeen {
            partialFrame = (framesSeen, context.eventLoop.now)  // the loop's clock (virtual in tests)
        }
        guard frameTimer == nil, let started = partialFrame?.since else { return }
        let loop = NIOLoopBound(self, eventLoop: context.eventLoop)
        frameTimer = context.eventLoop.scheduleTask(deadline: started + .init(timeouts.frame)) {
            let handler = loop.value
            handler.frameTimer = nil
            guard let context = handler.context, let partial = handler.partialFrame else { return }
            if partial.index == handler.framesSeen, partial.since + .init(handler.timeouts.frame) <= context.eventLoop.now {
                handler.timedOut("a frame was left incomplete for \(handler.timeouts.frame)")
            } else {
                handler.watchPartialFrame(context)  // another frame since: its own deadline
            }
        }
    }

    private func accept(id: UInt32, _ message: ClientMessage) {
        let slot = base + UInt64(slots.count)
        slots.append(Slot(id: id, answer: nil))
        guard let request = ConnectionRequest(message) else {
            let error = WireError(.unexpectedMessage, "\(message.type.name) is only the first message of a connection")
            return complete(slot: slot, id: id, .failure(error))
        }
        if held.isEmpty, mayStart(request, slot: slot) {
            start(request, id: id, slot: slot)
        } else {
            held.append(Held(slot: slot, id: id, request: request))
        }
    }

    /// A read waits for this connection's earlier writes, so a client reads its own writes.
    private func mayStart(_ request: ConnectionRequest, slot: UInt64) -> Bool {
        request.isWrite || (openWrites.min() ?? .max) > slot
    }

    private func startHeld() {
        while let next = held.first, mayStart(next.request, slot: next.slot) {
            held.removeFirst()
            start(next.request, id: next.id, slot: next.slot)
        }
    }

    private func start(_ request: ConnectionRequest, id: UInt32, slot: UInt64) {
        switch request {
        case .ping:
            complete(slot: slot, id: id, .success(.pong(.init())))
        case .command(let command):
            if case .subscribe(let namespace, let name, _) = command {
                let subscriptionID = nextSubscriptionID
                nextSubscriptionID &+= 1
                if nextSubscriptionID == 0 { nextSubscriptionID = 1 }
                let loop = NIOLoopBound(self, eventLoop: context!.eventLoop)
                let subscription = Subscription(
                    id: subscriptionID, namespace: namespace, name: name, capacity: subscriberBuffer,
                    wake: { loop.eventLoop.execute { loop.value.drainSubscriptions() } })
                subscriptions[subscriptionID] = subscription
                slots[Int(slot - base)].opensSubscription = subscriptionID
                broker.handle(
                    command, context: requestContext, subscription: subscription,
                    reply: replier(slot: slot, id: id, write: false))
            } else {
                if command.isWrite { openWrites.insert(slot) }
                broker.handle(command, context: requestContext, reply: replier(slot: slot, id: id, write: command.isWrite))
            }
        case .unsubscribe(let subscriptionID):
            if let subscription = subscriptions.removeValue(forKey: subscriptionID) {
                flowing.remove(subscriptionID)
                broker.unsubscribe(subscription)
                complete(slot: slot, id: id, .success(.unsubscribed(.init(subscriptionID: subscription.id))))
            } else {
                complete(
                    slot: slot, id: id,
                    .failure(WireError(.notFound, "no subscription \(subscriptionID) on this connection")))
            }
        }
    }

    private func replier(slot: UInt64, id: UInt32, write: Bool) -> Reply {
        let loop = NIOLoopBound(self, eventLoop: context!.eventLoop)
        return { answer in
            let result = answer.map(\.message).mapError(\.wireError)
            if loop.eventLoop.inEventLoop {
                loop.value.complete(slot: slot, id: id, result, write: write)
            } else {
                loop.eventLoop.execute { loop.value.complete(slot: slot, id: id, result, write: write) }
            }
        }
    }

    // MARK: Output

    private func complete(slot: UInt64, id: UInt32, _ result: Result<ServerMessage, WireError>, write: Bool = false) {
        if write {
            openWrites.remove(slot)
        }
        guard slot >= base, slot - base < UInt64(slots.count) else { return }  // the connection went away
        let index = Int(slot - base)
        var out = ByteBuffer()
        switch result {
        case .success(let message):
            do {
                try message.encode(id: id, maxFrameLength: limits.maxFrameLength, into: &out)
            } catch {
                out = ServerSession.errorFrame(error, id: id)
            }
        case .failure(let error):
            out = ServerSession.errorFrame(error, id: id)
            if let subscriptionID = slots[index].opensSubscription {
                subscriptions.removeValue(forKey: subscriptionID)
                slots[index].opensSubscription = nil
            }
        }
        slots[index].answer = out
        readyBytes += out.readableBytes
        if write { startHeld() }
        // Inside processInput (an answer given at once) the loop goes on and flushes at its end.
        guard !processing else { return }
        flushAnswers()
        context?.flush()
        processInput()
        resumeReading()
        closeIfDone()
    }

    /// Writes the answers that are next in request order.
    private func flushAnswers() {
        guard let context else { return }
        var opened = false
        while let first = slots.first, let answer = first.answer {
            readyBytes -= answer.readableBytes
            context.write(wrapOutboundOut(answer), promise: nil)
            if let subscriptionID = first.opensSubscription, subscriptions[subscriptionID] != nil {
                flowing.insert(subscriptionID)
                opened = true
            }
            slots.removeFirst()
            base += 1
        }
        if opened { drainSubscriptions() }
    }

    /// Writes queued pushes while the socket takes them.
    func drainSubscriptions() {
        guard let context, !closing else { return }
        var wrote = false
        for subscriptionID in flowing.sorted() {
            guard let subscription = subscriptions[subscriptionID] else { continue }
            pushing: while context.channel.isWritable {
                let pushes = subscription.take(max: 32)
                if pushes.isEmpty { break }
                for push in pushes {
                    var out = ByteBuffer()
                    do {
                        try push.message.encode(id: subscriptionID, maxFrameLength: limits.maxFrameLength, into: &out)
                    } catch {
                        // Never skipped (that would be a gap): the subscription ends with `lagged` in its place.
                        logger.warning(
                            "ending a subscription: a push cannot be sent: \(error.message)",
                            metadata: ["subscription": "\(subscriptionID)", "store": "\(subscription.name)"])
                        out.clear()
                        try? subscription.endBefore(push).message.encode(
                            id: subscriptionID, maxFrameLength: limits.maxFrameLength, into: &out)
                        context.write(wrapOutboundOut(out), promise: nil)
                        wrote = true
                        break pushing
                    }
                    context.write(wrapOutboundOut(out), promise: nil)
                    wrote = true
                }
            }
            if subscription.isEnded, !subscription.hasPending {
                // It lagged: the notice is out; the subscription is over.
                subscriptions.removeValue(forKey: subscriptionID)
                flowing.remove(subscriptionID)
            }
        }
        if wrote { context.flush() }
    }

    /// Shutdown: the answers that are ready, then `goodbye`, then close.
    func sayGoodbye(_ message: String) {
        guard let context, !closing else { return }
        flushAnswers()
        drainSubscriptions()
        closing = true
        var out = ByteBuffer()
        try? ServerMessage.goodbye(.init(code: .shuttingDown, message: message)).encode(
            id: 0, maxFrameLength: limits.maxFrameLength, into: &out)
        context.channel.closeAfterLastWord(context.writeAndFlush(wrapOutboundOut(out)))
    }
}

/// The time limits a connection lives under.
struct Timeouts: Sendable {
    /// From accept to a completed `hello`.
    var handshake: Duration
    /// From the first byte of a frame to its last, while the daemon is reading.
    var frame: Duration
}


/// The bytes every connection together holds for its client (unread requests, unsent answers), against a
/// cap per connection and a total.
final class ByteBudget: Sendable {
    let perConnection: Int
    let total: Int
    private let held = Atomic<Int>(0)
    private let connections = Atomic<Int>(0)

    init(perConnection: Int, total: Int) {
        self.perConnection = perConnection
        self.total = total
    }

    var heldBytes: Int { held.load(ordering: .relaxed) }

    func adjust(by delta: Int) {
        held.add(delta, ordering: .relaxed)
    }

    func connectionOpened() { connections.add(1, ordering: .relaxed) }
    func connectionClosed() { connections.subtract(1, ordering: .relaxed) }

    /// Whether a connection holding `bytes` may take more: always under the total; past it, only within its
    /// share of the total.
    func allows(_ bytes: Int) -> Bool {
        guard held.load(ordering: .relaxed) > total else { return true }
        return bytes <= total / max(1, connections.load(ordering: .relaxed))
    }
}

/// The open connections, so shutdown can say goodbye to each.
final class ConnectionRegistry: Sendable {
    private let connections = Mutex<[ObjectIdentifier: (any Channel, NIOLoopBound<ConnectionHandler>)]>([:])
    private let open = Atomic<Int>(0)

    /// Connections accepted and not yet closed (served or being refused).
    var count: Int { open.load(ordering: .relaxed) }

    /// Counts a connection from accept until it closes.
    func track(_ channel: any Channel) {
        open.add(1, ordering: .relaxed)
        channel.closeFuture.whenComplete { _ in self.open.subtract(1, ordering: .relaxed) }
    }

    func add(_ channel: any Channel, goodbye: NIOLoopBound<ConnectionHandler>) {
        connections.withLock { $0[ObjectIdentifier(channel)] = (channel, goodbye) }
    }

    func remove(_ channel: any Channel) {
        _ = connections.withLock { $0.removeValue(forKey: ObjectIdentifier(channel)) }
    }

    /// Sends `goodbye` on every connection and waits until they are closed; a client that does not take its
    /// last answers within `timeout` is closed anyway.
    func closeAll(message: String, timeout: Duration) async {
        let all = connections.withLock { Array($0.values) }
        for (channel, handler) in all {
            channel.eventLoop.execute { handler.value.sayGoodbye(message) }
            channel.eventLoop.scheduleTask(in: .init(timeout)) { channel.close(promise: nil) }
        }
        for (channel, _) in all {
            try? await channel.closeFuture.get()
        }
    }
}
