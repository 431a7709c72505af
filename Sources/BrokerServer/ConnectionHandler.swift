import BrokerCore
import DequeModule
import Locking
import Logging
import NIOCore
import Synchronization
import Wire

/// One client connection on its channel: performs what `ConnectionStateMachine` decides.
///
/// Everything here runs on the broker's owner loop, which every connection shares (`Broker.owner`). Each
/// channel event goes to the machine; the actions it returns are performed in order. An answer the broker gives
/// at once (a read from memory) arrives while actions are being performed: its actions queue behind the current
/// ones, and the connection flushes once when the queue is empty, so one read cycle is one flush however many
/// requests it carried.
///
/// The writes one read cycle starts go to the loop's `LoopTurn` together when the actions are done, and the
/// answers and pushes given outside the connection's own events come back through it (see there). The pushes are
/// taken first, so what one commit gives a connection (its event in a subscription and the answer to the write)
/// leaves in one write, the event first: a client that follows the store it writes to is woken once, with its
/// mirror already showing the write when the answer arrives.
final class ConnectionHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// What every connection of the daemon shares: made once, by the bootstrap.
    struct Settings: Sendable {
        var broker: Broker
        var turn: LoopTurn
        var machine: ConnectionStateMachine.Configuration
        var budget: ByteBudget
        var subscriptions: SubscriptionQuota
        /// Pushes a subscription may hold before it lags (`--subscriber-buffer`).
        var subscriberBuffer: Int
        var registry: ConnectionRegistry
    }

    private let settings: Settings
    private var broker: Broker { settings.broker }
    private var turn: LoopTurn { settings.turn }
    private var requestContext: RequestContext
    private var logger: Logger
    private var context: ChannelHandlerContext?
    private var machine: ConnectionStateMachine?

    private var pending = Deque<ConnectionStateMachine.Action>()
    /// The writes started by the actions being performed, handed to the loop's turn once they are done.
    private var writes: [BrokerRequest] = []
    private var spareWrites: [BrokerRequest] = []
    /// This connection has writes in `turn` this turn (`LoopTurn` lists each connection once).
    var writesInTurn = false
    /// This connection waits in `turn` to take its gathered answers.
    var answersInTurn = false
    /// Where the broker's answers to this connection go (made with the context; it holds this handler, so it is
    /// let go at removal).
    private var replies: ConnectionReplies?
    typealias Answer = (UInt64, Result<BrokerAnswer, BrokerError>)
    /// Write answers taken into the machine together, as one event, once the actions are done (or, given outside
    /// the connection's events, when the turn takes them).
    private var answeredHere: [Answer] = []
    private var spareAnswers: [Answer] = []
    /// The subscriptions with pushes waiting that the actions being performed have not taken yet (taken before
    /// `answeredHere`, so that a commit's event precedes its answer).
    private var pushesHere: [UInt32] = []
    /// What the channel held and the time when the actions being performed began; valid until they are done
    /// or something is flushed (nothing leaves the channel's buffer in between, so the bytes written to it
    /// since are all that changed).
    private var ioSnapshot: IOSnapshot?
    private var writtenSinceSnapshot = 0
    /// Actions are being performed: an event they cause (an answer given at once) queues its actions behind them.
    private var performing = false
    private var handshakeTimer: Scheduled<Void>?
    private var frameTimer: Scheduled<Void>?
    private var recheckTimer: Scheduled<Void>?

    /// The channel's write buffer marks (set by the daemon's bootstrap): past `high` the socket counts as full.
    static let writeBufferWaterMark = ChannelOptions.Types.WriteBufferWaterMark(low: 64 * 1024, high: 256 * 1024)

    init(_ settings: Settings, context: RequestContext, logger: Logger) {
        self.settings = settings
        self.requestContext = context
        self.logger = logger
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        let loop = NIOLoopBound(self, eventLoop: context.eventLoop)
        let subscriberBuffer = settings.subscriberBuffer
        replies = ConnectionReplies(loop: loop)
        machine = ConnectionStateMachine(
            configuration: settings.machine, budget: settings.budget, subscriptions: settings.subscriptions,
            logger: logger,
            makeSubscription: { id, namespace, name in
                Subscription(
                    id: id, namespace: namespace, name: name, capacity: subscriberBuffer,
                    wake: {
                        // On the owner, by the commit: its pushes leave with its answers.
                        let handler = loop.value
                        handler.pushesHere.append(id)
                        if !handler.performing { handler.turn.answered(handler) }
                    })
            })
    }

    /// The context holds this handler, and the machine's subscription factory holds it too: keeping either
    /// past removal would be a cycle that outlives the connection.
    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        machine = nil
        replies = nil
        pending = []
        writes = []
        spareWrites = []
        answeredHere = []
        spareAnswers = []
        pushesHere = []
    }

    // MARK: Events in

    func channelActive(context: ChannelHandlerContext) {
        settings.registry.add(context.channel, goodbye: NIOLoopBound(self, eventLoop: context.eventLoop))
        event { $0.activate(io: $1) }
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        handshakeTimer?.cancel()
        frameTimer?.cancel()
        recheckTimer?.cancel()
        settings.registry.remove(context.channel)
        if let actions = machine?.closed() { perform(actions) }
        logger.debug("connection closed")
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        logger.debug("connection error: \(error)")
        context.close(promise: nil)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case .inputClosed = event as? ChannelEvent {
            self.event { $0.inputClosed(io: $1) }
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let bytes = unwrapInboundIn(data)
        event { $0.received(bytes, io: $1) }
    }

    func read(context: ChannelHandlerContext) {
        event { $0.readRequested(io: $1) }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        ioSnapshot?.isWritable = context.channel.isWritable
        event { $0.writabilityChanged(io: $1) }
        context.fireChannelWritabilityChanged()
    }

    /// Shutdown: the answers that are ready, then `goodbye`, then close.
    func sayGoodbye(_ message: String) {
        event { $0.goodbye(message, io: $1) }
    }

    /// Feeds one event to the machine with the socket's state now, and performs what it decides.
    private func event(
        _ body: (inout ConnectionStateMachine, ConnectionStateMachine.IOState) -> [ConnectionStateMachine.Action]
    ) {
        guard let io = ioState() else { return }
        perform(body(&machine!, io))
    }

    /// The socket's state for an event now; `nil` once the connection is gone.
    private func ioState() -> ConnectionStateMachine.IOState? {
        guard let context, machine != nil else { return nil }
        let snapshot: IOSnapshot
        if let taken = ioSnapshot {
            snapshot = taken
        } else {
            // NIO answers an option through a chain of dynamic casts: asked once per batch of actions, not per
            // answer given while they are performed. So is writability (kept up to date by
            // `channelWritabilityChanged`): each ask is a retain and release of the channel.
            let channel = context.channel
            snapshot = IOSnapshot(
                channelBytes: (try? channel.syncOptions?.getOption(.bufferedWritableBytes)) ?? 0,
                isWritable: channel.isWritable, now: context.eventLoop.now)
            ioSnapshot = snapshot
            writtenSinceSnapshot = 0
        }
        return ConnectionStateMachine.IOState(
            isWritable: snapshot.isWritable,
            bufferedBytes: snapshot.channelBytes + writtenSinceSnapshot, now: snapshot.now)
    }

    // MARK: Actions out

    private func perform(_ actions: consuming [ConnectionStateMachine.Action]) {
        var actions = actions
        // Moved into `pending`, a payload-less action left in each place: iterating would copy each action (the
        // command it starts included).
        for index in actions.indices {
            var action = ConnectionStateMachine.Action.read
            swap(&action, &actions[index])
            pending.append(consume action)
        }
        machine?.recycle(&actions)
        guard !performing else { return }  // an answer given at once: its actions queue behind these
        performing = true
        defer {
            performing = false
            ioSnapshot = nil
        }
        while true {
            while let action = pending.popFirst() { execute(action) }
            if !writes.isEmpty {
                // A write refused at once (an interceptor) or committed here (the turn's first, for the memory
                // engine) answers into `answeredHere`: go round again. The others are answered once the loop has
                // submitted its turn's writes (`endTakingAnswers`).
                // The array is handed on whole and a spare takes its place; emptied after, it is the next spare: a
                // pipelined connection neither regrows them from one element every read cycle nor allocates a new
                // one (a copy emptied with `keepingCapacity` would, its buffer being still shared).
                var batch: [BrokerRequest] = []
                swap(&batch, &writes)
                swap(&writes, &spareWrites)
                turn.add(&batch, context: requestContext, from: self)
                batch.removeAll(keepingCapacity: true)
                spareWrites = batch
                continue
            }
            if !pushesHere.isEmpty {
                var ready: [UInt32] = []
                swap(&ready, &pushesHere)
                event { $0.pushesWaiting(ready, io: $1) }
                continue
            }
            if !answeredHere.isEmpty {
                var answers: [Answer] = []
                swap(&answers, &answeredHere)
                swap(&answeredHere, &spareAnswers)
                event { $0.answered(answers, io: $1) }
                answers.removeAll(keepingCapacity: true)
                spareAnswers = answers
                continue
            }
            if let context {
                // Into the channel under the snapshot its bytes were counted in: a writability event the write
                // raises must not take a snapshot of its own before the flush (it would count them twice, stay
                // stale past the flush, and a drain it starts would see a full socket that is not).
                var wrote = false
                while let bytes = machine?.nextWrite() {
                    writtenSinceSnapshot += bytes.readableBytes
                    context.write(wrapOutboundOut(bytes), promise: nil)
                    wrote = true
                }
                if wrote {
                    ioSnapshot = nil
                    context.flush()
                }
            }
            machine?.turnEnded()
            // The flush may drain the socket at once, and the writability event that says so give the machine
            // more to write (pushes that waited for room): go round again for it.
            if pending.isEmpty, machine?.owesWrites != true { break }
        }
    }

    private func execute(_ action: consuming ConnectionStateMachine.Action) {
        guard let context else { return }
        switch consume action {
        case .read:
            context.read()
        case .start(let slot, let command, let subscription):
            guard let replies else { return }
            let reply = Reply(replies, token: ConnectionReplies.token(slot: slot, isWrite: command.isWrite))
            if command.isWrite {
                // The command moves into the request: without `consume` the optimizer copies it (a retain and release
                // of each reference it holds). (Appending the request still copies it; `consume` does not help there.)
                writes.append(BrokerRequest(consume command, subscription: consume subscription, reply: consume reply))
            } else {
                broker.handle(command, context: requestContext, subscription: subscription, reply: reply)
                if machine?.awaits(slot: slot) == true { event { $0.startReturned(slot: slot, io: $1) } }
            }
        case .unsubscribe(let subscription):
            broker.unsubscribe(subscription)
        case .established(let clientName):
            logger[metadataKey: "client"] = "\(clientName)"
            requestContext.clientName = clientName
        case .scheduleHandshakeTimeout(let after):
            handshakeTimer = schedule(in: .init(after)) { $0.handshakeTimeout(io: $1) }
        case .cancelHandshakeTimeout:
            handshakeTimer?.cancel()
            handshakeTimer = nil
        case .scheduleFrameTimeout(let deadline):
            let loop = NIOLoopBound(self, eventLoop: context.eventLoop)
            frameTimer = context.eventLoop.scheduleTask(deadline: deadline) {
                loop.value.frameTimer = nil
                loop.value.event { $0.frameTimeout(io: $1) }
            }
        case .scheduleRecheck(let after):
            recheckTimer = schedule(in: .init(after)) { $0.recheck(io: $1) }
        case .close(var lastWrites, let lingering):
            ioSnapshot = nil
            let last = lastWrites.popLast() ?? ByteBuffer()
            for bytes in lastWrites { context.write(wrapOutboundOut(bytes), promise: nil) }
            // Writes complete in order: once the last is written, so is every answer before it.
            let written = context.writeAndFlush(wrapOutboundOut(last))
            if lingering {
                context.channel.closeAfterLastWord(written)
            } else {
                let channel = context.channel
                written.whenComplete { _ in channel.close(promise: nil) }
            }
        }
    }

    /// An answer from the broker. A write's waits to be taken with the others its commit gave.
    /// (Not through `event`: a closure capturing `result` would copy it.)
    fileprivate func answer(slot: UInt64, _ result: consuming Result<BrokerAnswer, BrokerError>, isWrite: Bool) {
        if isWrite {
            answeredHere.append((slot, result))
            if !performing { turn.answered(self) }
        } else if let io = ioState() {
            perform(machine!.answered(slot: slot, result, io: io))
        }
    }

    /// While the loop submits its turn's writes (`LoopTurn`): the answers and pushes the commit gives this
    /// connection on this loop wait, as they do while actions are performed, to be taken as one event after.
    func beginTakingAnswers() {
        performing = true
    }

    /// The answers and pushes the turn's commit gave, taken and flushed once.
    func endTakingAnswers() {
        performing = false
        perform([])
    }

    /// Everything answered outside this connection's events since the last time, as one event, after the pushes
    /// waiting.
    func takeAnswered() {
        perform([])
    }

    private func schedule(
        in delay: TimeAmount,
        _ body: @escaping @Sendable (inout ConnectionStateMachine, ConnectionStateMachine.IOState) -> [ConnectionStateMachine.Action]
    ) -> Scheduled<Void>? {
        guard let context else { return nil }
        let loop = NIOLoopBound(self, eventLoop: context.eventLoop)
        return context.eventLoop.scheduleTask(in: delay) { loop.value.event(body) }
    }
}

/// The broker's answers to one connection, given on the owner loop, which is the connection's.
private final class ConnectionReplies: ReplyReceiver {
    private let loop: NIOLoopBound<ConnectionHandler>
    /// A token's top bit: the request is a write.
    private static let writeBit: UInt64 = 1 << 63

    init(loop: NIOLoopBound<ConnectionHandler>) {
        self.loop = loop
    }

    static func token(slot: UInt64, isWrite: Bool) -> UInt64 { isWrite ? slot | writeBit : slot }

    func receive(_ result: consuming Result<BrokerAnswer, BrokerError>, token: UInt64) {
        loop.value.answer(slot: token & ~Self.writeBit, result, isWrite: token & Self.writeBit != 0)
    }
}

private struct IOSnapshot {
    var channelBytes: Int
    var isWritable: Bool
    var now: NIODeadline
}

/// The time limits a connection lives under.
struct Timeouts: Sendable {
    /// From accept to a completed `hello`.
    var handshake: Duration
    /// From the first byte of a frame to its last, while the daemon is reading.
    var frame: Duration
}


/// The open connections, so shutdown can say goodbye to each.
final class ConnectionRegistry: Sendable {
    private let connections = Locked<[ObjectIdentifier: (any Channel, NIOLoopBound<ConnectionHandler>)]>([:])
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
