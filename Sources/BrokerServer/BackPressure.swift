import Synchronization

/// A connection's share of the daemon's memory, with no I/O: whether another request may start, whether to read
/// more, and what the connection counts for in the daemon-wide `ByteBudget`. A connection stops taking requests
/// while its socket is full, its unsent answers reach its byte cap, or its in-flight cap is reached; when all
/// connections together hold more than `--max-total-bytes`, it takes more only within its share (one that holds
/// nothing is always served), and looks again after `recheckDelay`, as others free bytes without telling it.
struct BackPressure {
    let budget: ByteBudget
    /// What this connection counts for in `budget` now.
    private(set) var accounted = 0
    /// The channel asked for more bytes and was told to wait: reading goes on when requests may start again.
    var readHeld = false
    private var recheckArmed = false

    static let recheckDelay: Duration = .milliseconds(50)

    init(budget: ByteBudget) {
        self.budget = budget
    }

    /// The connection opened: it counts in the total's shares from now on.
    func opened() { budget.connectionOpened() }

    enum Verdict {
        case start
        case wait
        /// Wait, and look again after `recheckDelay`: other connections hold the total budget.
        case waitForOthers
    }

    /// Whether another request may start, with `unsent` bytes of answers not yet on the wire.
    mutating func mayStart(inFlight: Int, maxInFlight: Int, writable: Bool, unsent: Int) -> Verdict {
        guard inFlight < maxInFlight, writable, unsent < budget.perConnection else { return .wait }
        guard accounted == 0 || budget.allows(accounted) else {
            if recheckArmed { return .wait }
            recheckArmed = true
            return .waitForOthers
        }
        return .start
    }

    /// The recheck scheduled by `.waitForOthers` came.
    mutating func rechecked() { recheckArmed = false }

    /// Brings this connection's count in the shared budget to `held` bytes.
    mutating func account(_ held: Int) {
        guard held != accounted else { return }
        budget.adjust(by: held - accounted)
        accounted = held
    }

    /// The connection closed: everything it counted for is given back.
    mutating func release() {
        budget.adjust(by: -accounted)
        budget.connectionClosed()
        accounted = 0
    }
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
