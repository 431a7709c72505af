import StoreModel

/// Where the broker's answers to a peer's requests go: one receiver per peer (a connection), each answer with the
/// token its request was handed in with.
public protocol ReplyReceiver: AnyObject, Sendable {
    /// `result` is consumed: an answer handed on is moved, not copied.
    func receive(_ result: consuming Result<BrokerAnswer, BrokerError>, token: UInt64)
}

/// How the broker answers a request: once, from whatever thread finished it (`reply(result)`).
///
/// A receiver and a token, not a closure: a connection hands every request the same receiver, so handing a
/// request in allocates nothing (a closure capturing the request's slot would be one allocation per request).
/// A closure can still be the receiver (`Reply { result in ... }`).
public struct Reply: Sendable {
    private let receiver: any ReplyReceiver
    private let token: UInt64

    public init(_ receiver: any ReplyReceiver, token: UInt64) {
        self.receiver = receiver
        self.token = token
    }

    public init(_ body: @escaping @Sendable (Result<BrokerAnswer, BrokerError>) -> Void) {
        self.init(ClosureReceiver(body), token: 0)
    }

    public func callAsFunction(_ result: consuming Result<BrokerAnswer, BrokerError>) {
        receiver.receive(result, token: token)
    }

    private final class ClosureReceiver: ReplyReceiver {
        let body: @Sendable (Result<BrokerAnswer, BrokerError>) -> Void
        init(_ body: @escaping @Sendable (Result<BrokerAnswer, BrokerError>) -> Void) { self.body = body }
        func receive(_ result: consuming Result<BrokerAnswer, BrokerError>, token: UInt64) { body(result) }
    }
}

/// A write waiting for the store's writer.
struct PendingWrite: QueuedWrite {
    enum Kind: Sendable {
        case write(WriteOperation)
        case drop

        /// How many items the write inserts (repeats counted).
        var insertedItemCount: Int {
            switch self {
            case .write(let operation): operation.insertedItemCount
            case .drop: 0
            }
        }
    }

    var kind: Kind
    var condition: Condition
    /// Who handed the write in (`RequestContext.submitter`).
    var submitter: UInt64
    /// The subscription not offered this write's event (`BrokerRequest.subscription`): its client applies the
    /// write itself.
    var silenced: ObjectIdentifier? = nil
    var reply: Reply
}

extension PendingWrite {
    var weight: Int { kind.insertedItemCount }

    var isAlone: Bool {
        if case .drop = kind { return true }
        return false
    }

    var dropsBrokenPlace: Bool {
        if case .drop = kind, case .unconditional = condition { return true }
        return false
    }
}
