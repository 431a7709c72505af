import Synchronization

/// Something that happens once, awaited by any number of tasks: the first `happen` decides the outcome, later
/// ones change nothing. (The daemon listening, its run ending; a blocking thread's body returning.)
public final class Occurrence<Outcome: Sendable>: Sendable {
    private enum State {
        case pending([CheckedContinuation<Outcome, Never>])
        case happened(Outcome)
    }

    private let state = Mutex(State.pending([]))

    public init() {}

    public func happen(_ outcome: Outcome) {
        let waiters = state.withLock { state -> [CheckedContinuation<Outcome, Never>] in
            guard case .pending(let waiters) = state else { return [] }
            state = .happened(outcome)
            return waiters
        }
        for waiter in waiters { waiter.resume(returning: outcome) }
    }

    /// Waits until it happened; its outcome.
    public func wait() async -> Outcome {
        await withCheckedContinuation { continuation in
            let happened = state.withLock { state -> Outcome? in
                switch state {
                case .pending(let waiters):
                    state = .pending(waiters + [continuation])
                    return nil
                case .happened(let outcome):
                    return outcome
                }
            }
            if let happened { continuation.resume(returning: happened) }
        }
    }
}
