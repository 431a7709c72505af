#if canImport(Glibc)
import Glibc
#endif
import ErrorShape

/// Why the daemon cannot start: a code, a message for the person who started it, the error it came from and
/// where it was decided. `storebrokerd` prints the message; `--log-level debug` logs the rest.
public struct DaemonError: LayerError, Sendable {
    public enum Code: String, Hashable, Sendable {
        /// Settings that cannot work (limits that do not fit together, a relative path).
        case configuration
        /// Another storebrokerd has the socket or the data directory.
        case alreadyRunning
        /// The socket or its directory cannot be made, checked or listened on.
        case socket
        /// The data directory cannot be made, locked or read.
        case dataDirectory
        /// The secure-value key cannot be read or made.
        case secureValueKey
        /// The default engine, or an engine's options, cannot be used.
        case engine
        /// One of the daemon's services stopped with an error of its own.
        case services
    }

    public var code: Code
    public var message: String
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

    /// A system call's failure: "`what`: its `errno` text", with the `SystemError` as the cause.
    public static func system(
        _ code: Code, _ what: String, errno number: Int32 = errno, fileID: StaticString = #fileID, line: UInt = #line
    ) -> DaemonError {
        let cause = SystemError(code: number)
        return DaemonError(code, "\(what): \(cause)", underlying: cause, fileID: fileID, line: line)
    }

    public var codeName: String { code.rawValue }

    public var description: String { message }
}
