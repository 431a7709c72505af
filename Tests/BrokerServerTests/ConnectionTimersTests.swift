@testable import BrokerServer
import NIOCore
import Testing
import Wire

/// The handshake's and the frames' time limits.
@Suite struct ConnectionTimersTests {
    static let start = NIODeadline.uptimeNanoseconds(1_000_000_000)

    /// One timer for a partial frame, armed once; when it fires, the frame it watched is timed out only if no frame
    /// was decoded since and the limit has passed.
    @Test func aPartialFrameIsTimedOutOnlyIfNothingCameSince() {
        var watch = FrameWatch(limit: .seconds(30))
        #expect(watch.watch(waiting: true, now: Self.start) == Self.start + .seconds(30))
        #expect(watch.watch(waiting: true, now: Self.start + .seconds(1)) == nil, "armed twice")
        #expect(watch.fired(now: Self.start + .seconds(30)) == .timedOut)

        watch = FrameWatch(limit: .seconds(30))
        _ = watch.watch(waiting: true, now: Self.start)
        watch.decoded()  // the frame finished, and the next one began
        #expect(watch.fired(now: Self.start + .seconds(30)) == .watchAgain)
        #expect(watch.watch(waiting: true, now: Self.start + .seconds(30)) == Self.start + .seconds(60))
        #expect(watch.watch(waiting: false, now: Self.start + .seconds(31)) == nil)
        #expect(watch.fired(now: Self.start + .seconds(60)) == .idle, "a frame the daemon stopped reading timed out")
    }

    /// The handshake timer starts with the connection and stops at the welcome.
    @Test func theHelloStopsTheHandshakeTimer() throws {
        let h = ConnectionHarness()
        let opened = h.machine.activate(io: h.io())
        #expect(opened.contains { if case .scheduleHandshakeTimeout(.seconds(10)) = $0 { true } else { false } })
        #expect(h.machine.state == .awaitingHello)
        let actions = h.machine.received(try ConnectionHarness.frames([]), io: h.io())
        #expect(actions.contains { if case .cancelHandshakeTimeout = $0 { true } else { false } })
        #expect(actions.contains { if case .established(clientName: "t") = $0 { true } else { false } })
        #expect(h.machine.state == .established)
    }

    /// A handshake timer that was already due when the hello came (the same turn) finds the handshake done.
    @Test func aHandshakeTimerFiringAfterTheHelloDoesNothing() throws {
        let h = ConnectionHarness()
        _ = h.machine.activate(io: h.io())
        try h.greet()
        let step = h.take(h.machine.handshakeTimeout(io: h.io()))
        #expect(step.closed == nil && step.messages.isEmpty && h.machine.state == .established)
    }

    /// No hello in time: a `timedOut` error as the last word, then close.
    @Test func noHelloInTimeIsTheLastWord() throws {
        let h = ConnectionHarness()
        _ = h.machine.activate(io: h.io())
        let step = h.take(h.machine.handshakeTimeout(io: h.io()))
        #expect(step.closed == true)
        guard case .error(let error)? = step.messages.last?.1 else {
            Issue.record("no error: \(step.messages)")
            return
        }
        #expect(error.code == .timedOut)
        #expect(h.machine.state == .closing)
    }

    /// Half a frame that stays half past the frame timeout closes the connection with `timedOut`.
    @Test func aFrameLeftHalfTimesOut() throws {
        let h = ConnectionHarness()
        try h.greet()
        var ping = try ConnectionHarness.frames([(.ping(.init()), 1)], hello: false)
        let half = ping.readSlice(length: 5)!
        let armed = h.machine.received(half, io: h.io())
        guard case .scheduleFrameTimeout(let deadline)? = armed.first(where: { if case .scheduleFrameTimeout = $0 { true } else { false } }) else {
            Issue.record("no frame timer: \(armed)")
            return
        }
        h.now = deadline
        let step = h.take(h.machine.frameTimeout(io: h.io()))
        #expect(step.closed == true)
        guard case .error(let error)? = step.messages.last?.1 else {
            Issue.record("no error: \(step.messages)")
            return
        }
        #expect(error.code == .timedOut && error.message.contains("incomplete"))
    }
}
