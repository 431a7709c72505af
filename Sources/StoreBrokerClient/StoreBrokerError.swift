@_exported import ErrorShape
import StoreModel

/// Why a request to the broker failed: what kind of failure, the broker's code when it answered with one, a
/// message, the error it came from (a socket's, for one) and where in the library it was decided.
public struct StoreBrokerError: LayerError, Sendable {
    public enum Kind: String, Hashable, Sendable {
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
        /// An item or value the broker holds does not decode as the application's type (`underlying` says why).
        case cannotDecode
        /// An item or value could not be encoded as JSON (`underlying` says why); nothing was sent.
        case cannotEncode
        /// The task waiting was cancelled (typed throws cannot throw `CancellationError`); a write already sent
        /// may still be committed.
        case cancelled
        /// The mirror (`RemoteStore`, `RemoteValue`, ...) was closed by its owner.
        case closed
    }

    public var kind: Kind
    /// The broker's error code, for `refused` (and for protocol errors and goodbyes that carry one).
    public var code: ErrorCode?
    public var message: String
    public var underlying: (any Error)?
    public var location: SourceLocation

    public init(
        _ kind: Kind, code: ErrorCode? = nil, _ message: String, underlying: (any Error)? = nil,
        fileID: StaticString = #fileID, line: UInt = #line
    ) {
        self.kind = kind
        self.code = code
        self.message = message
        self.underlying = underlying
        self.location = SourceLocation(fileID: fileID, line: line)
    }

    /// The broker's code name when it gave one (`conflict`), else the kind (`cannotConnect`).
    public var codeName: String { code?.name ?? kind.rawValue }

    public var description: String {
        code.map { "\($0.name): \(message)" } ?? message
    }
}
