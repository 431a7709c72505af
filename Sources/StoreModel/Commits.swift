// What writes ask for and what they produce: the words the broker's core, the protocol and the client library
// share about commits. Plain values, no codec, no I/O.

/// A change to a store's items: what a write request asks for.
public enum WriteOperation: Sendable {
    case insert([Item])
    case remove([ItemID])
    case removeAll
    case chain([ChainStep])

    /// The steps as one operation: a single step is that step's own operation (with its limits: an insert of
    /// N items counts N, not N + 1 as a chain), several are a chain. Nil for no step.
    public init?(steps: consuming [ChainStep]) {
        guard steps.count == 1 else {
            if steps.isEmpty { return nil }
            self = .chain(steps)
            return
        }
        // Read, not removed: the array is usually shared with the message it came in (removing would copy it).
        switch steps[0] {
        case .insert(let items): self = .insert(items)
        case .remove(let ids): self = .remove(ids)
        case .removeAll: self = .removeAll
        }
    }
}

/// The outcome of a write: `committed` false when it changed nothing and took no sequence (the sequence is
/// then the current one).
public struct CommitResult: Hashable, Sendable {
    public var committed: Bool
    public var epoch: UInt64
    public var sequence: UInt64

    public init(committed: Bool, epoch: UInt64, sequence: UInt64) {
        self.committed = committed
        self.epoch = epoch
        self.sequence = sequence
    }
}

/// A store's or value's position: the epoch and the sequence of its last commit.
public struct Position: Hashable, Sendable {
    public var epoch: UInt64
    public var sequence: UInt64

    public init(epoch: UInt64, sequence: UInt64) {
        self.epoch = epoch
        self.sequence = sequence
    }
}

/// One commit of a store: its steps in order, under its sequence.
public struct Commit: Hashable, Sendable {
    public var epoch: UInt64
    public var sequence: UInt64
    public var steps: [EventStep]

    public init(epoch: UInt64, sequence: UInt64, steps: [EventStep]) {
        self.epoch = epoch
        self.sequence = sequence
        self.steps = steps
    }

    public var position: Position { Position(epoch: epoch, sequence: sequence) }
}

/// What a subscription delivers, in order.
public enum Push: Sendable {
    /// A store's whole content at a position (the start of a subscription, or after `historyGone`).
    case storeLoaded(Position, [ItemRecord])
    case storeEvent(Commit)
    /// A value's state at a position (the start of a subscription, or after `historyGone`).
    case valueLoaded(Position, ValueState)
    case valueEvent(Position, ValueState)
    /// The resume point is older than the history kept: a snapshot follows.
    case historyGone(Position)
    /// The subscriber fell too far behind: the subscription is over; resume from this position.
    case lagged(Position)
    /// The store was dropped (at this position); the subscription goes on with its re-creation.
    case dropped(Position)
}

extension Push {
    /// Where a reader that has taken this push resumes from (after `historyGone`, its stale point again: the
    /// broker then says `historyGone` once more and sends the snapshot).
    public var resumePosition: Position {
        switch self {
        case .storeLoaded(let at, _), .valueLoaded(let at, _), .valueEvent(let at, _), .dropped(let at),
            .historyGone(let at), .lagged(let at):
            at
        case .storeEvent(let commit): commit.position
        }
    }
}
