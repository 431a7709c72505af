@testable import BrokerCore
@testable import BrokerServer
import NIOCore
import Testing
import Wire

/// Budgets and back-pressure: when a connection takes more requests, and what it counts for daemon-wide.
@Suite struct BackPressureTests {
    /// The in-flight cap, a full socket and the connection's own byte cap each hold requests back.
    @Test func eachLimitOfTheConnectionHoldsRequestsBack() {
        var pressure = BackPressure(budget: ByteBudget(perConnection: 1000, total: 10_000))
        #expect(pressure.mayStart(inFlight: 1, maxInFlight: 2, writable: true, unsent: 0) == .start)
        #expect(pressure.mayStart(inFlight: 2, maxInFlight: 2, writable: true, unsent: 0) == .wait)
        #expect(pressure.mayStart(inFlight: 0, maxInFlight: 2, writable: false, unsent: 0) == .wait)
        #expect(pressure.mayStart(inFlight: 0, maxInFlight: 2, writable: true, unsent: 1000) == .wait)
    }

    /// Past the daemon's total, a connection over its share waits and asks once to look again; one that holds
    /// nothing is always served; what a connection counted is given back when it closes.
    @Test func pastTheTotalOnlyAShareIsServed() {
        let budget = ByteBudget(perConnection: 1000, total: 1000)
        var heavy = BackPressure(budget: budget)
        var idle = BackPressure(budget: budget)
        heavy.opened()
        idle.opened()
        heavy.account(900)
        #expect(heavy.mayStart(inFlight: 0, maxInFlight: 8, writable: true, unsent: 0) == .start, "under the total")
        budget.adjust(by: 200)  // another connection's bytes: the total is passed
        #expect(heavy.mayStart(inFlight: 0, maxInFlight: 8, writable: true, unsent: 0) == .waitForOthers)
        #expect(heavy.mayStart(inFlight: 0, maxInFlight: 8, writable: true, unsent: 0) == .wait, "a second recheck")
        #expect(idle.mayStart(inFlight: 0, maxInFlight: 8, writable: true, unsent: 0) == .start)
        heavy.rechecked()
        #expect(heavy.mayStart(inFlight: 0, maxInFlight: 8, writable: true, unsent: 0) == .waitForOthers)
        heavy.account(400)  // within its share: 1,000 / 2 connections
        #expect(heavy.mayStart(inFlight: 0, maxInFlight: 8, writable: true, unsent: 0) == .start)
        heavy.release()
        #expect(budget.heldBytes == 200)
    }

    /// Through the machine: an answer given at once that fills the socket holds the next request and reading
    /// until it drains.
    @Test func aLargeAnswerHoldsTheNextRequestUntilTheSocketDrains() throws {
        let h = ConnectionHarness()
        let bytes = try ConnectionHarness.frames([(.queryRange(.init(store: "s")), 1), (.queryRange(.init(store: "s")), 2)])
        var step = h.take(h.machine.received(bytes, io: h.io()))
        #expect(step.starts.map(\.0) == [0])
        let big = ByteBuffer(repeating: 0x78, count: 300 * 1024)
        let records = [ItemRecord(id: "a", createdAt: 1, updatedAt: 1, payload: Payload(big))]
        _ = h.machine.answered(slot: 0, .success(.records(Position(epoch: 1, sequence: 1), records)), io: h.io())
        // Not taken by the handler yet: the machine counts it as owed to the socket.
        #expect(h.machine.startReturned(slot: 0, io: h.io()).isEmpty)
        step = h.take(h.machine.recheck(io: h.io()))
        #expect(step.messages.map(\.0) == [1])
        #expect(step.starts.isEmpty, "the next read started while the socket was full")
        // Written, not yet sent: the channel counts it now.
        step = h.take(h.machine.readRequested(io: h.io(writable: false, buffered: 300 * 1024)))
        #expect(step.reads == 0)
        step = h.take(h.machine.writabilityChanged(io: h.io()))
        #expect(step.starts.map(\.0) == [1])
        #expect(step.reads == 1, "reading did not resume")
    }
}
