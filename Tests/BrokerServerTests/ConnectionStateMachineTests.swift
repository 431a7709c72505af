@testable import BrokerCore
@testable import BrokerServer
import Logging
import NIOCore
import Testing
import Wire

/// The connection state machine on its own: events in, actions out, no channel and no broker.
@Suite struct ConnectionStateMachineTests {
    typealias Machine = ConnectionStateMachine

    /// A machine, the subscriptions it made, and a client session that decodes what it writes.
    final class Harness {
        var machine: Machine
        private let outbound = Outbound()
        var now = NIODeadline.uptimeNanoseconds(1_000_000_000)

        init(maxInFlight: Int = 128, subscriptions: SubscriptionQuota = SubscriptionQuota(perConnection: 1024, total: 65536)) {
            let made = Box()
            machine = Machine(
                configuration: .init(
                    limits: ServerSession.Limits(maxInFlight: maxInFlight),
                    timeouts: Timeouts(handshake: .seconds(10), frame: .seconds(30)), highWatermark: 256 * 1024),
                budget: ByteBudget(perConnection: 1 << 20, total: 1 << 24), subscriptions: subscriptions,
                logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
                makeSubscription: { id, namespace, name in
                    let subscription = Subscription(id: id, namespace: namespace, name: name, capacity: 16, wake: {})
                    made.subscriptions.append(subscription)
                    return subscription
                })
            box = made
        }

        private let box: Box
        final class Box { var subscriptions: [Subscription] = [] }
        var made: [Subscription] { box.subscriptions }

        func io(writable: Bool = true, buffered: Int = 0) -> Machine.IOState {
            Machine.IOState(isWritable: writable, bufferedBytes: buffered, now: now)
        }

        /// The commands started, and every message written, decoded, in order.
        func take(_ actions: [Machine.Action]) -> (starts: [(UInt64, BrokerCommand)], messages: [(UInt32, ServerMessage)]) {
            var starts: [(UInt64, BrokerCommand)] = []
            for action in actions {
                switch action {
                case .write(let bytes): outbound.add(bytes)
                case .writePush(let bytes, let id): bytes.forEachFrame(withID: id) { outbound.add($0) }
                case .start(let slot, let command, _): starts.append((slot, command))
                default: break
                }
            }
            // The handler takes the turn's answers after performing its actions.
            if let output = machine.takeOutput() { outbound.add(output) }
            return (starts, outbound.messages())
        }
    }

    static func frames(_ messages: [(ClientMessage, UInt32)], hello: Bool = true) throws -> ByteBuffer {
        var out = hello ? try ClientSession(clientName: "t").hello() : ByteBuffer()
        for (message, id) in messages {
            try message.encode(id: id, maxFrameLength: WireProtocol.defaultMaxFrameLength, into: &out)
        }
        return out
    }

    /// One read with an insert, a count and a ping: the insert starts; the count waits for it (read your
    /// writes) and the ping waits behind the count (order); the answers go out in request order.
    @Test func readsWaitForTheConnectionsWritesAndAnswersKeepRequestOrder() throws {
        let h = Harness()
        let bytes = try Self.frames([
            (.insert(.init(store: "s", items: [Item(id: "a", payload: Payload("1"))])), 1),
            (.count(.init(store: "s")), 2), (.ping(.init()), 3),
        ])
        var step = h.take(h.machine.received(bytes, io: h.io()))
        #expect(step.messages.map(\.0) == [0])  // the welcome
        #expect(step.starts.map(\.0) == [0])
        step = h.take(h.machine.startReturned(slot: 0, io: h.io()))
        #expect(step.starts.isEmpty, "the count started before the insert was answered")

        step = h.take(h.machine.answered(slot: 0, .success(.written(.init(committed: true, epoch: 7, sequence: 1))), io: h.io()))
        #expect(step.starts.map(\.0) == [1])
        guard case .count = step.starts.first?.1 else {
            Issue.record("the held count did not start")
            return
        }
        #expect(step.messages.map(\.0) == [1])
        step = h.take(h.machine.startReturned(slot: 1, io: h.io()))  // the ping is answered by the connection itself
        #expect(step.messages.isEmpty, "the pong went out before the count's answer")
        step = h.take(h.machine.answered(slot: 1, .success(.count(Position(epoch: 7, sequence: 1), 1)), io: h.io()))
        #expect(step.messages.map(\.0) == [2, 3])
        guard case .countResult(let count) = step.messages.first?.1, case .pong = step.messages.last?.1 else {
            Issue.record("wrong answers: \(step.messages)")
            return
        }
        #expect(count.count == 1 && count.sequence == 1)
    }

    /// Writes answered out of order leave in request order; answers given in order leave as one write (encoded
    /// into the turn's buffer, not a buffer each).
    @Test func writeAnswersLeaveInRequestOrderAndInOrderOnesAsOneWrite() throws {
        let h = Harness()
        let inserts = (1...6).map { n in
            (ClientMessage.insert(.init(store: "s\(n)", items: [Item(id: "a", payload: Payload("\(n)"))])), UInt32(n))
        }
        var step = h.take(h.machine.received(try Self.frames(inserts), io: h.io()))
        #expect(step.starts.map(\.0) == [0, 1, 2, 3, 4, 5])
        func written(_ sequence: UInt64) -> Result<BrokerAnswer, BrokerError> {
            .success(.written(.init(committed: true, epoch: 1, sequence: sequence)))
        }
        step = h.take(h.machine.answered(slot: 2, written(3), io: h.io()))
        #expect(step.messages.isEmpty, "the third answer went out before the first")
        step = h.take(h.machine.answered(slot: 0, written(1), io: h.io()))
        #expect(step.messages.map(\.0) == [1])
        step = h.take(h.machine.answered(slot: 1, written(2), io: h.io()))
        #expect(step.messages.map(\.0) == [2, 3])

        let inOrder: [(UInt64, Result<BrokerAnswer, BrokerError>)] = [(3, written(4)), (4, written(5)), (5, written(6))]
        let actions = h.machine.answered(inOrder, io: h.io())
        let writes = actions.filter { if case .write = $0 { true } else { false } }
        #expect(writes.isEmpty, "three answers in order took \(writes.count) writes of their own")
        #expect(h.take(actions).messages.map(\.0) == [4, 5, 6], "the turn's output did not hold the three answers")
    }

    /// Pushes queued before `subscribed` wait for it; then they follow it, in order.
    @Test func theFirstPushFollowsSubscribed() throws {
        let h = Harness()
        let bytes = try Self.frames([(.subscribe(.init(name: "s")), 4)])
        var step = h.take(h.machine.received(bytes, io: h.io()))
        #expect(step.starts.count == 1)
        guard let subscription = h.made.first else {
            Issue.record("no subscription made")
            return
        }
        let position = Position(epoch: 3, sequence: 9)
        subscription.offer(.storeLoaded(position, []), at: position, force: true)
        step = h.take(h.machine.pushesWaiting([subscription.id], io: h.io()))
        #expect(step.messages.isEmpty, "a push went out before subscribed")
        step = h.take(h.machine.answered(slot: 0, .success(.subscribed(subscriptionID: subscription.id)), io: h.io()))
        #expect(step.messages.map(\.0) == [4, subscription.id])
        guard case .subscribed = step.messages.first?.1, case .storeLoaded = step.messages.last?.1 else {
            Issue.record("wrong order: \(step.messages)")
            return
        }
    }

    /// The daemon-wide count of subscriptions: each one taken counts, and every way one ends gives it back (a
    /// refused `subscribe`, a `subscribe` the broker fails, `unsubscribe`, the connection closing).
    @Test func everyEndedSubscriptionIsGivenBackToTheDaemonWideCount() throws {
        let quota = SubscriptionQuota(perConnection: 4, total: 4)
        let h = Harness(subscriptions: quota)
        let other = Harness(subscriptions: quota)
        _ = other.take(other.machine.received(try Self.frames([(.subscribe(.init(name: "o")), 1)]), io: other.io()))
        _ = other.take(other.machine.answered(slot: 0, .success(.subscribed(subscriptionID: other.made[0].id)), io: other.io()))
        #expect(quota.heldCount == 1)
        let requests = try Self.frames((0..<4).map { (.subscribe(.init(name: "s\($0)")), UInt32($0 + 1)) })
        var step = h.take(h.machine.received(requests, io: h.io()))
        // Subscriptions are answered in order; each starts once the one before is answered.
        for slot in 0..<3 {
            #expect(step.starts.count == 1, "slot \(slot): \(step.starts.count) started")
            let id = h.made[slot].id
            let answer: Result<BrokerAnswer, BrokerError> =
                slot == 2 ? .failure(BrokerError(.engineUnavailable, "no")) : .success(.subscribed(subscriptionID: id))
            step = h.take(h.machine.answered(slot: UInt64(slot), answer, io: h.io()))
        }
        // Two held here, one on the other connection; the failed one was given back, so the fourth is taken.
        #expect(quota.heldCount == 4)
        #expect(step.starts.count == 1)
        step = h.take(h.machine.answered(slot: 3, .success(.subscribed(subscriptionID: h.made[3].id)), io: h.io()))
        // The total is reached: a fifth is refused, on either connection, and counts nothing.
        step = h.take(h.machine.received(try Self.frames([(.subscribe(.init(name: "s4")), 5)], hello: false), io: h.io()))
        guard case .error(let refused)? = step.messages.last?.1 else {
            Issue.record("a subscription past the total was not refused: \(step.messages)")
            return
        }
        #expect(refused.code == .tooManySubscriptions && refused.message.contains("--max-total-subscriptions"))
        #expect(quota.heldCount == 4)
        step = h.take(h.machine.received(try Self.frames([(.unsubscribe(.init(subscriptionID: h.made[0].id)), 6)], hello: false), io: h.io()))
        #expect(quota.heldCount == 3)
        _ = h.machine.closed()
        #expect(quota.heldCount == 1)
        _ = other.machine.closed()
        #expect(quota.heldCount == 0)
    }

    /// An answer given at once that fills the socket holds the next request and reading until it drains.
    @Test func aLargeAnswerHoldsTheNextRequestUntilTheSocketDrains() throws {
        let h = Harness()
        let bytes = try Self.frames([(.queryRange(.init(store: "s")), 1), (.queryRange(.init(store: "s")), 2)])
        var step = h.take(h.machine.received(bytes, io: h.io()))
        #expect(step.starts.map(\.0) == [0])
        let big = ByteBuffer(repeating: 0x78, count: 300 * 1024)
        let records = [ItemRecord(id: "a", createdAt: 1, updatedAt: 1, payload: Payload(big))]
        let answer = h.machine.answered(slot: 0, .success(.records(Position(epoch: 1, sequence: 1), records)), io: h.io())
        step = h.take(answer)
        #expect(step.messages.map(\.0) == [1])
        // The handler has not written it yet: it counts it as buffered. The answer came at once, so the
        // handler's return from the start changes nothing.
        #expect(h.machine.startReturned(slot: 0, io: h.io(buffered: 300 * 1024)).isEmpty)
        step = h.take(h.machine.recheck(io: h.io(buffered: 300 * 1024)))
        #expect(step.starts.isEmpty, "the next read started while the socket was full")
        #expect(!h.machine.readRequested(io: h.io(writable: false, buffered: 300 * 1024)).contains { if case .read = $0 { true } else { false } })
        let drained = h.machine.writabilityChanged(io: h.io())
        #expect(h.take(drained).starts.map(\.0) == [1])
        #expect(drained.contains { if case .read = $0 { true } else { false } }, "reading did not resume")
    }

    /// No more than `maxInFlight` requests start; the rest wait in the input.
    @Test func theInFlightCapHoldsRequestsBack() throws {
        let h = Harness(maxInFlight: 2)
        let bytes = try Self.frames((1...4).map { (.insert(.init(store: "s", items: [])), UInt32($0)) })
        var started = h.take(h.machine.received(bytes, io: h.io())).starts.map(\.0)
        started += h.take(h.machine.startReturned(slot: 0, io: h.io())).starts.map(\.0)
        started += h.take(h.machine.startReturned(slot: 1, io: h.io())).starts.map(\.0)
        #expect(started == [0, 1])
        let written = CommitResult(committed: false, epoch: 0, sequence: 0)
        #expect(h.take(h.machine.answered(slot: 0, .success(.written(written)), io: h.io())).starts.map(\.0) == [2])
    }

    /// No hello in time: a `timedOut` error, then close; a half-close with nothing pending closes at once.
    @Test func timeoutsAndHalfClose() throws {
        let h = Harness()
        let opened = h.machine.activate(io: h.io())
        #expect(opened.contains { if case .scheduleHandshakeTimeout(.seconds(10)) = $0 { true } else { false } })
        let late = h.machine.handshakeTimeout(io: h.io())
        guard case .closeAfter(var last)? = late.first else {
            Issue.record("no last word: \(late)")
            return
        }
        let frame = try #require(try FrameDecoder().decode(&last))
        #expect(frame.header.type == MessageType.error.rawValue)

        let other = Harness()
        _ = other.machine.received(try Self.frames([]), io: other.io())
        let closed = other.machine.inputClosed(io: other.io())
        #expect(closed.contains { if case .closeWhenWritten = $0 { true } else { false } })
    }

    /// The buffer a turn's answers went out in is cleared and used for the next turn's once the channel has let go
    /// of it (no allocation per read cycle); while the channel still holds it, the next answers go to storage of
    /// their own and the bytes it holds never change.
    @Test func theAnswersBufferIsReusedOnlyOnceTheChannelLetsGoOfIt() throws {
        let h = Harness()
        _ = h.take(h.machine.received(try Self.frames([]), io: h.io()))  // the welcome
        func pings(_ ids: ClosedRange<UInt32>) throws -> ByteBuffer {
            _ = h.machine.received(try Self.frames(ids.map { (.ping(.init()), $0) }, hello: false), io: h.io())
            let output = h.machine.takeOutput()
            return try #require(output)
        }
        func address(_ buffer: ByteBuffer) -> UInt { buffer.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) } }
        func firstAnswered(_ buffer: ByteBuffer) -> UInt32? { buffer.getInteger(at: buffer.readerIndex + 8, as: UInt32.self) }

        // 100 answers outgrow a new buffer's capacity: what the next turn writes into tells which buffer it is.
        var written: ByteBuffer? = try pings(1...100)
        let grown = written!.capacity
        written = nil  // the channel wrote it and let go
        let held = try pings(101...101)
        #expect(grown > 1024 && held.capacity == grown, "the next turn's answers went to a new buffer")
        #expect(firstAnswered(held) == 101)
        let heldBytes = Array(held.readableBytesView)

        let next = try pings(102...102)  // `held` is still the channel's
        #expect(address(next) != address(held))
        #expect(firstAnswered(next) == 102)
        #expect(Array(held.readableBytesView) == heldBytes, "bytes the channel still held were overwritten")
    }

    struct MissingOutput: Error {}

    /// A buffer handed out is kept as the next turn's spare only up to 8 KiB: a connection that once answered a
    /// large burst does not hold that much while it idles. (Whether the machine still holds a buffer shows when the
    /// channel's copy is cleared and written: storage shared with the machine is copied first.)
    @Test func onlyASmallAnswersBufferIsKeptForTheNextTurn() throws {
        let h = Harness(maxInFlight: 4096)
        _ = h.take(h.machine.received(try Self.frames([]), io: h.io()))  // the welcome
        func heldByTheMachine(pings count: UInt32, from first: UInt32) throws -> (Bool, Int) {
            _ = h.machine.received(
                try Self.frames((first..<first + count).map { (.ping(.init()), $0) }, hello: false), io: h.io())
            guard var written = h.machine.takeOutput() else { throw MissingOutput() }  // the only reference here
            let storage = written.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) }
            written.clear()
            written.writeInteger(UInt8(1))
            return (written.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) } != storage, written.capacity)
        }
        let (smallKept, smallCapacity) = try heldByTheMachine(pings: 100, from: 1)
        #expect(smallCapacity <= 8 * 1024 && smallKept, "a small buffer was not kept for the next turn")
        let (largeKept, largeCapacity) = try heldByTheMachine(pings: 2000, from: 101)
        #expect(largeCapacity > 8 * 1024)
        #expect(!largeKept, "a buffer over 8 KiB was kept for the next turn")
    }
}
