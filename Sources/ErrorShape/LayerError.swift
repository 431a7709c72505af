#if canImport(Glibc)
import Glibc
#endif

// The one shape every layer's error has (the core's `BrokerError`, the loader's `EngineLoadError`, an engine's
// `EngineFailure`, the daemon's `DaemonError`, the client's `StoreBrokerError`, storectl's `Failure`, an engine
// plugin's `EngineError`): a stable code of the layer's own, a message for a human, the error it came from
// and where it was decided. The protocol's `ErrorCode` is the projection that crosses the socket; the cause
// and the location stay in the process that made the error (its log, `--verbose`).

/// Where in the source an error was made: enough to find the line that decided it, from a log.
public struct SourceLocation: Hashable, Sendable, CustomStringConvertible {
    public var fileID: String
    public var line: Int

    public init(fileID: StaticString = #fileID, line: UInt = #line) {
        self.fileID = "\(fileID)"
        self.line = Int(line)
    }

    public var description: String { "\(fileID):\(line)" }
}

/// An error with a layer's stable code, a message, a cause and a location.
public protocol LayerError: Error, CustomStringConvertible {
    /// The code's stable name (`conflict`, `notFound`, `socketInUse`...), for logs and scripts.
    var codeName: String { get }
    /// What went wrong, for a human, without the cause's own text unless the message chose to say it.
    var message: String { get }
    /// The error it came from, when something below this layer failed.
    var underlying: (any Error)? { get }
    /// Where it was decided.
    var location: SourceLocation { get }
}

extension LayerError {
    /// This error and its causes, outermost first (an underlying `LayerError` brings its own causes).
    public var causes: [any Error] {
        var chain: [any Error] = [self]
        var next = underlying
        while let cause = next, chain.count < 16 {
            chain.append(cause)
            next = (cause as? any LayerError)?.underlying
        }
        return chain
    }

    /// Everything known, on one line, for a log or `--verbose`: each error's code, message and location,
    /// outermost first, then a cause that is not a `LayerError` as it describes itself.
    public var detailedDescription: String {
        causes.map { error in
            if let layered = error as? any LayerError {
                "\(layered.codeName): \(layered.message) [\(layered.location)]"
            } else {
                "\(error)"
            }
        }.joined(separator: " <- ")
    }
}

/// A system call's failure (`errno`), as the underlying error of another.
public struct SystemError: Error, Hashable, Sendable, CustomStringConvertible {
    public var code: Int32

    public init(code: Int32) {
        self.code = code
    }

    /// The calling thread's `errno`, now.
    public static var current: SystemError { SystemError(code: errno) }

    public var description: String { String(cString: strerror(code)) }
}
