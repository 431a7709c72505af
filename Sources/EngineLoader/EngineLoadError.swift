import ErrorShape

/// Why an engine could not be found or loaded. Every case names the file (or the paths searched) and the reason.
public struct EngineLoadError: LayerError, Sendable {
    public enum Reason: String, Hashable, Sendable {
        /// No `libstorebroker-engine-NAME.so` on the search path.
        case notFound
        /// The engine name is not a valid name (it would not make a safe file name).
        case invalidName
        /// The file is not an ELF shared object.
        case notSharedObject
        /// `dlopen` failed (a missing dependency, a wrong architecture...).
        case loadFailed
        /// The library does not export `storebroker_engine_entry`.
        case missingSymbol
        /// The engine was built for another ABI major version, or its table is too short.
        case abiMismatch
        /// The file is writable by others, or owned by another user who is not root.
        case unsafePermissions
        /// The table is incomplete or inconsistent (a NULL member, a name that does not match the file).
        case invalidEngine
        /// An option the engine does not declare.
        case unknownOption
        /// An option value the engine's `check_options` refuses.
        case invalidOption
    }

    public var reason: Reason
    /// The file concerned, if there is one.
    public var path: String?
    public var message: String
    public var underlying: (any Error)?
    public var location: SourceLocation

    public init(
        _ reason: Reason, path: String?, _ message: String, underlying: (any Error)? = nil,
        fileID: StaticString = #fileID, line: UInt = #line
    ) {
        self.reason = reason
        self.path = path
        self.message = message
        self.underlying = underlying
        self.location = SourceLocation(fileID: fileID, line: line)
    }

    public var codeName: String { reason.rawValue }

    public var description: String {
        if let path { "\(path): \(message)" } else { message }
    }
}
