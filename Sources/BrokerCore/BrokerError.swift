#if canImport(Glibc)
import Glibc
#endif
@_exported import ErrorShape
import Logging

/// Every failure the broker reports: a stable code, a message for a human, the error it came from (an
/// engine's failure, a system call's) and where it was decided.
///
/// The code is the broker's own; the daemon projects it onto the protocol's `ErrorCode` when it answers a
/// client (BrokerServer, `WireMapping`). Codes are never renamed or reused; new ones are only added.
public struct BrokerError: LayerError, Sendable {
    public enum Code: String, Hashable, Sendable, CaseIterable {
        /// A store or value name breaks the naming rules.
        case invalidName
        /// An item id breaks the id rules.
        case invalidID
        /// An item payload or a value is over `--max-item`.
        case itemTooLarge
        /// A request holds more items, ids or steps than `--max-batch`.
        case batchTooLarge
        /// A conditional write found another sequence; nothing changed.
        case conflict
        /// A range cursor names an id that is not in the store.
        case cursorGone
        /// The named thing does not exist.
        case notFound
        /// The peer may not do this.
        case permissionDenied
        /// Well formed, but not valid.
        case invalidRequest
        /// The store's engine (or the broker's set-up) cannot do this.
        case notSupported
        /// The storage engine or the data directory failed; nothing was committed.
        case engineError
        /// The store's engine cannot be loaded, or its files are lost: the store is not served.
        case engineUnavailable
        /// The disk is full; nothing was committed.
        case storageFull
        /// The broker is shutting down.
        case shuttingDown
        /// A bug in the broker.
        case internalError

        /// The code's stable name, as logged.
        public var name: String { rawValue }
    }

    public var code: Code
    public var message: String
    /// What caused it, when something below the broker failed (an `EngineFailure`, for one).
    public var underlying: (any Error)?
    public var location: SourceLocation

    public init(
        _ code: Code, _ message: String, underlying: (any Error)? = nil, fileID: StaticString = #fileID,
        line: UInt = #line
    ) {
        self.code = code
        self.message = message
        self.underlying = underlying
        self.location = SourceLocation(fileID: fileID, line: line)
    }

    /// The same failure, said of something larger ("store notes cannot be served: ..."); cause and location kept.
    public func context(_ prefix: String) -> BrokerError {
        var copy = self
        copy.message = prefix + message
        return copy
    }

    public var codeName: String { code.name }

    public var description: String { "\(code.name): \(message)" }

    /// For logs: the code, where it was decided and the cause, never a payload.
    public var logMetadata: Logger.Metadata {
        var metadata: Logger.Metadata = ["error.code": "\(code.name)", "error.location": "\(location)"]
        if let underlying { metadata["error.underlying"] = "\(underlying)" }
        return metadata
    }
}
