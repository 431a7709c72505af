// The messages that carry StoreModel's words as they are: a write's operation, its result and a subscription's
// pushes. Both ends use them (the daemon sends pushes, the client library turns them back), so they live with
// the codec; the daemon's mapping of requests onto its core's commands stays in BrokerServer.

extension ClientMessage {
    /// The request for `operation` on `store`: one of `insert`, `remove`, `removeAll` or `chain`.
    public static func write(store: String, _ operation: WriteOperation, condition: Condition = .unconditional) -> ClientMessage {
        switch operation {
        case .insert(let items): .insert(.init(store: store, condition: condition, items: items))
        case .remove(let ids): .remove(.init(store: store, condition: condition, ids: ids))
        case .removeAll: .removeAll(.init(store: store, condition: condition))
        case .chain(let steps): .chain(.init(store: store, condition: condition, steps: steps))
        }
    }

    /// `setValue`, or `resetValue` when `value` is nil.
    public static func setValue(namespace: Namespace, name: String, value: Payload?, condition: Condition) -> ClientMessage {
        if let value {
            .setValue(.init(namespace: namespace, name: name, condition: condition, value: value))
        } else {
            .resetValue(.init(namespace: namespace, name: name, condition: condition))
        }
    }
}

extension CommitResult {
    public init(_ result: ServerMessage.WriteResult) {
        self.init(committed: result.committed, epoch: result.epoch, sequence: result.sequence)
    }
}

extension Position {
    public init(_ notice: some PositionedMessage) {
        self.init(epoch: notice.epoch, sequence: notice.sequence)
    }
}

/// A message that names an (epoch, sequence).
public protocol PositionedMessage {
    var epoch: UInt64 { get }
    var sequence: UInt64 { get }
}

extension ServerMessage.StoreLoaded: PositionedMessage {}
extension ServerMessage.CountResult: PositionedMessage {}
extension SequencedList: PositionedMessage {}
extension ValueStateMessage: PositionedMessage {}
extension SequenceNotice: PositionedMessage {}

extension Push {
    /// The push as the protocol sends it.
    public var message: ServerMessage {
        switch self {
        case .storeLoaded(let at, let records):
            .storeLoaded(
                .init(epoch: at.epoch, sequence: at.sequence, count: UInt64(records.count), elements: records))
        case .storeEvent(let commit):
            .storeEvent(.init(epoch: commit.epoch, sequence: commit.sequence, elements: commit.steps))
        case .valueLoaded(let at, let state): .valueLoaded(.init(epoch: at.epoch, sequence: at.sequence, state: state))
        case .valueEvent(let at, let state): .valueEvent(.init(epoch: at.epoch, sequence: at.sequence, state: state))
        case .historyGone(let at): .historyGone(.init(epoch: at.epoch, sequence: at.sequence))
        case .lagged(let at): .lagged(.init(epoch: at.epoch, sequence: at.sequence))
        case .dropped(let at): .dropped(.init(epoch: at.epoch, sequence: at.sequence))
        }
    }

    /// The push a message carries; nil for a message that is not a push (or `goodbye`, which ends the
    /// connection rather than a subscription).
    public init?(_ message: ServerMessage) {
        switch message {
        case .storeLoaded(let m): self = .storeLoaded(Position(m), m.elements)
        case .storeEvent(let m): self = .storeEvent(Commit(epoch: m.epoch, sequence: m.sequence, steps: m.elements))
        case .valueLoaded(let m): self = .valueLoaded(Position(m), m.state)
        case .valueEvent(let m): self = .valueEvent(Position(m), m.state)
        case .historyGone(let m): self = .historyGone(Position(m))
        case .lagged(let m): self = .lagged(Position(m))
        case .dropped(let m): self = .dropped(Position(m))
        default: return nil
        }
    }
}
