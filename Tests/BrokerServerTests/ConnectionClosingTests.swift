@testable import BrokerCore
@testable import BrokerServer
import NIOCore
import Testing
import Wire

/// How a connection ends: half-close, goodbye, a protocol error, the channel closing.
@Suite struct ConnectionClosingTests {
    /// After a half-close, the requests already sent are answered, then the connection closes without lingering;
    /// with nothing pending it closes at once.
    @Test func aHalfCloseAnswersWhatWasAskedThenCloses() throws {
        let h = ConnectionHarness()
        try h.greet()
        var step = try h.send([(.insert(.init(store: "s", items: [])), 1)])
        #expect(step.starts.count == 1)
        step = h.take(h.machine.inputClosed(io: h.io()))
        #expect(step.closed == nil && h.machine.state == .inputClosed)
        step = h.take(h.machine.answered(slot: 0, .written(1), io: h.io()))
        #expect(step.messages.map(\.0) == [1], "the answer was not the last write")
        #expect(step.closed == false && h.machine.state == .closing)

        let idle = ConnectionHarness()
        try idle.greet()
        #expect(idle.take(idle.machine.inputClosed(io: idle.io())).closed == false)
    }

    /// A connection held from reading (its in-flight cap reached) that the client half-closes does not read again
    /// once its last answer closes it.
    @Test func aHalfClosedConnectionNeverReadsAgain() throws {
        let h = ConnectionHarness(maxInFlight: 1)
        try h.greet()
        _ = try h.send([(.insert(.init(store: "s", items: [])), 1)])
        #expect(h.take(h.machine.readRequested(io: h.io())).reads == 0, "read past the in-flight cap")
        _ = h.take(h.machine.inputClosed(io: h.io()))
        let step = h.take(h.machine.answered(slot: 0, .written(1), io: h.io()))
        #expect(step.closed == false && step.reads == 0, "read after the close: \(step.reads)")
    }

    /// `goodbye`: the answers that are ready go out, then `goodbye`, then the connection lingers for the client to
    /// read it; what arrives after is dropped, and a half-close then closes at once.
    @Test func goodbyeFollowsTheReadyAnswersAndEndsTheInput() throws {
        let h = ConnectionHarness()
        try h.greet()
        let ping = h.machine.received(try ConnectionHarness.frames([(.ping(.init()), 3)], hello: false), io: h.io())
        // The pong is owed, not yet taken: it goes with the goodbye.
        var step = h.take(ping + h.machine.goodbye("bye", io: h.io()))
        #expect(step.closed == true)
        #expect(step.messages.map(\.0) == [3, 0])
        guard case .goodbye(let goodbye)? = step.messages.last?.1 else {
            Issue.record("no goodbye: \(step.messages)")
            return
        }
        #expect(goodbye.code == .shuttingDown && goodbye.message == "bye")
        step = try h.send([(.insert(.init(store: "s", items: [])), 4)])
        #expect(step.starts.isEmpty && step.messages.isEmpty, "a request after goodbye was served")
        #expect(h.take(h.machine.inputClosed(io: h.io())).closed == false)
    }

    /// A frame the session cannot take (here: a request before `hello`) is answered with an error as the last word.
    @Test func aProtocolErrorIsTheLastWord() throws {
        let h = ConnectionHarness()
        let step = h.take(h.machine.received(try ConnectionHarness.frames([(.ping(.init()), 1)], hello: false), io: h.io()))
        #expect(step.closed == true && step.starts.isEmpty)
        guard case .error = step.messages.last?.1 else {
            Issue.record("no error: \(step.messages)")
            return
        }
    }

    /// The channel closed: every subscription ends in the broker and is given back, the budget forgets the
    /// connection, and answers that come later are dropped.
    @Test func aClosedConnectionLetsGoOfEverything() throws {
        let quota = SubscriptionQuota(perConnection: 8, total: 8)
        let budget = ByteBudget(perConnection: 1 << 20, total: 1 << 24)
        let h = ConnectionHarness(subscriptions: quota, budget: budget)
        _ = h.machine.activate(io: h.io())
        try h.greet()
        _ = try h.send([(.subscribe(.init(name: "s")), 1), (.insert(.init(store: "s", items: [])), 2)])
        let closed = h.machine.closed()
        #expect(closed.contains { if case .unsubscribe = $0 { true } else { false } })
        #expect(quota.heldCount == 0 && budget.heldBytes == 0)
        #expect(h.take(h.machine.answered(slot: 1, .written(1), io: h.io())).messages.isEmpty)
        #expect(h.machine.state == .closed)
    }
}
