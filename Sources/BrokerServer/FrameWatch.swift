import NIOCore

/// The frame timeout, with no I/O: a frame begun must be finished within `limit`, unless the daemon itself
/// stopped reading. Under pipelining most reads end inside a frame, so the timer is not scheduled and cancelled
/// per partial frame: one armed timer, when it fires, finds the frame it watched finished (and watches the next
/// partial one, by its own deadline) or timed out.
struct FrameWatch {
    let limit: Duration
    /// Frames decoded so far, and the partial frame now buffered (after which frame, since when).
    private var framesSeen: UInt64 = 0
    private var partial: (index: UInt64, since: NIODeadline)?
    private var armed = false

    init(limit: Duration) {
        self.limit = limit
    }

    /// A frame was decoded.
    mutating func decoded() { framesSeen &+= 1 }

    /// After input was processed: `waiting` tells whether the client owes the rest of a frame while the daemon
    /// reads. The deadline to schedule the timer at, when it must be armed.
    mutating func watch(waiting: Bool, now: NIODeadline) -> NIODeadline? {
        guard waiting else {
            partial = nil
            return nil
        }
        if partial?.index != framesSeen { partial = (framesSeen, now) }
        guard !armed, let since = partial?.since else { return nil }
        armed = true
        return since + .init(limit)
    }

    enum Fired {
        /// No frame is partial.
        case idle
        /// The frame watched is still partial past the limit.
        case timedOut
        /// Another frame since: watch it by its own deadline.
        case watchAgain
    }

    mutating func fired(now: NIODeadline) -> Fired {
        armed = false
        guard let partial else { return .idle }
        return partial.index == framesSeen && partial.since + .init(limit) <= now ? .timedOut : .watchAgain
    }
}
