@testable import BrokerCore
@testable import BrokerServer
import Logging
import NIOCore
import Testing
import Wire

/// Subscriptions and their pushes: caps, the first push after `subscribed`, the socket's room, lag.
@Suite struct SubscriptionFlowTests {
    static let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    static func flow(_ quota: SubscriptionQuota, capacity: Int = 16) -> SubscriptionFlow {
        SubscriptionFlow(quota: quota) { id, namespace, name in
            Subscription(id: id, namespace: namespace, name: name, capacity: capacity, wake: {})
        }
    }

    /// The ids of the frames in `output`, and their message types, in order.
    static func frames(_ output: inout ConnectionOutput) throws -> [(id: UInt32, type: UInt8)] {
        let decoder = FrameDecoder()
        var out: [(UInt32, UInt8)] = []
        while var bytes = output.next() {
            while let frame = try decoder.decode(&bytes) { out.append((frame.header.id, frame.header.type)) }
        }
        return out
    }

    static func event(_ sequence: UInt64) -> Push {
        .storeEvent(Commit(epoch: 1, sequence: sequence, steps: [.remove(ids: ["a"])]))
    }

    /// A connection's cap and the daemon's total both refuse with `tooManySubscriptions`; ids count from 1; an
    /// ended subscription gives its place back.
    @Test func capsRefuseAndEndedSubscriptionsGiveBack() throws {
        let quota = SubscriptionQuota(perConnection: 2, total: 3)
        var one = Self.flow(quota)
        var two = Self.flow(quota)
        let first = try one.open(.store, "a").get()
        #expect(first.id == 1)
        #expect(try one.open(.store, "b").get().id == 2)
        guard case .failure(let perConnection) = one.open(.store, "c") else {
            Issue.record("a third subscription passed the connection's cap")
            return
        }
        #expect(perConnection.code == .tooManySubscriptions && perConnection.message.contains("--max-subscriptions"))
        _ = try two.open(.store, "a").get()
        guard case .failure(let total) = two.open(.store, "b") else {
            Issue.record("a subscription passed the total")
            return
        }
        #expect(total.message.contains("--max-total-subscriptions"))
        #expect(quota.heldCount == 3)
        #expect(one.close(first.id) === first)
        #expect(one.close(first.id) == nil)
        #expect(quota.heldCount == 2)
        _ = one.closeAll()
        _ = two.closeAll()
        #expect(quota.heldCount == 0)
    }

    /// Pushes wait until the subscription flows; then they leave in order with its id, as far as the room
    /// allows, and the one the socket stopped taking goes on first.
    @Test func pushesFollowSubscribedAndStopWhenTheSocketIsFull() throws {
        var flow = Self.flow(SubscriptionQuota(perConnection: 8, total: 8), capacity: 100)
        let a = try flow.open(.store, "a").get()
        let b = try flow.open(.store, "b").get()
        for sequence in 1...40 { a.offer(Self.event(UInt64(sequence)), at: Position(epoch: 1, sequence: UInt64(sequence))) }
        b.offer(Self.event(1), at: Position(epoch: 1, sequence: 1))
        flow.waiting([a.id, b.id])
        var output = ConnectionOutput()
        flow.drain(into: &output, room: 1 << 20, maxFrameLength: 1 << 20, logger: Self.logger)
        #expect(try Self.frames(&output).isEmpty, "a push left before its subscribed")

        flow.flow(a.id)
        flow.flow(b.id)
        flow.drain(into: &output, room: 0, maxFrameLength: 1 << 20, logger: Self.logger)
        // No room: one batch of 32 goes (the check is before each batch), the rest waits.
        var sent = try Self.frames(&output)
        #expect(sent.count == 32 && sent.allSatisfy { $0.id == a.id })
        flow.drain(into: &output, room: 1 << 20, maxFrameLength: 1 << 20, logger: Self.logger)
        sent = try Self.frames(&output)
        #expect(sent.map(\.id) == Array(repeating: a.id, count: 8) + [b.id], "\(sent)")
    }

    /// A subscription that lagged sends its `lagged` notice, then ends and gives its place back.
    @Test func aLaggedSubscriptionEndsAfterItsNotice() throws {
        let quota = SubscriptionQuota(perConnection: 8, total: 8)
        var flow = Self.flow(quota, capacity: 1)
        let a = try flow.open(.store, "a").get()
        flow.flow(a.id)
        a.offer(Self.event(1), at: Position(epoch: 1, sequence: 1))
        a.offer(Self.event(2), at: Position(epoch: 1, sequence: 2))
        var output = ConnectionOutput()
        flow.drain(into: &output, room: 1 << 20, maxFrameLength: 1 << 20, logger: Self.logger)
        let sent = try Self.frames(&output)
        #expect(sent.map(\.type) == [MessageType.storeEvent.rawValue, MessageType.lagged.rawValue])
        #expect(flow[a.id] == nil && quota.heldCount == 0)
    }

    // MARK: Through the machine

    /// Pushes queued before `subscribed` wait for it; then they follow it, in order.
    @Test func theFirstPushFollowsSubscribed() throws {
        let h = ConnectionHarness()
        let bytes = try ConnectionHarness.frames([(.subscribe(.init(name: "s")), 4)])
        var step = h.take(h.machine.received(bytes, io: h.io()))
        #expect(step.starts.count == 1)
        let subscription = try #require(h.made.first)
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
        let h = ConnectionHarness(subscriptions: quota)
        let other = ConnectionHarness(subscriptions: quota)
        _ = other.take(other.machine.received(try ConnectionHarness.frames([(.subscribe(.init(name: "o")), 1)]), io: other.io()))
        _ = other.take(other.machine.answered(slot: 0, .success(.subscribed(subscriptionID: other.made[0].id)), io: other.io()))
        #expect(quota.heldCount == 1)
        let requests = try ConnectionHarness.frames((0..<4).map { (.subscribe(.init(name: "s\($0)")), UInt32($0 + 1)) })
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
        step = try h.send([(.subscribe(.init(name: "s4")), 5)])
        guard case .error(let refused)? = step.messages.last?.1 else {
            Issue.record("a subscription past the total was not refused: \(step.messages)")
            return
        }
        #expect(refused.code == .tooManySubscriptions && refused.message.contains("--max-total-subscriptions"))
        #expect(quota.heldCount == 4)
        step = try h.send([(.unsubscribe(.init(subscriptionID: h.made[0].id)), 6)])
        #expect(quota.heldCount == 3)
        _ = h.machine.closed()
        #expect(quota.heldCount == 1)
        _ = other.machine.closed()
        #expect(quota.heldCount == 0)
    }
}
