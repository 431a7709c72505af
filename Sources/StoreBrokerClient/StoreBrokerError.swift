import StoreModel

/// Why a request to the broker failed.
public struct StoreBrokerError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Kind: Hashable, Sendable {
        /// The socket could not be reached (no daemon, wrong path, no permission).
        case cannotConnect
        /// The broker answered the request with an error (`code` says which).
        case refused
        /// The broker said goodbye or the connection dropped; requests in flight have no answer.
        case connectionClosed
        /// The broker broke the protocol, or the client was asked to send something the protocol cannot carry.
        case protocolViolation
        /// The broker did not answer in time (connect, handshake or a request); the connection was closed.
        case timedOut
    }

    public var kind: Kind
    /// The wire error code, for `refused` (and for protocol errors that carry one).
    public var code: ErrorCode?
    public var message: String

    public init(_ kind: Kind, code: ErrorCode? = nil, _ message: String) {
        self.kind = kind
        self.code = code
        self.message = message
    }

    public var description: String {
        code.map { "\($0.name): \(message)" } ?? message
    }
}
