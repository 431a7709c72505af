/// An error found while decoding or encoding protocol bytes.
///
/// Every failure of the codec is a `WireError`; nothing else is thrown. `code` is the stable number that a
/// server puts in its `error` answer; `message` says, for a human, what was wrong and where.
public struct WireError: Error, Hashable, Sendable, CustomStringConvertible {
    public var code: ErrorCode
    public var message: String

    public init(_ code: ErrorCode, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code.name): \(message)" }

    static func malformed(_ message: String) -> WireError { WireError(.malformed, message) }

    static func truncated(_ field: String) -> WireError {
        WireError(.malformed, "truncated: the payload ends inside \(field)")
    }
}
