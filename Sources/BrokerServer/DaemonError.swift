/// Why the daemon cannot start: a message for the person who started it.
public struct DaemonError: Error, CustomStringConvertible, Sendable {
    public var message: String

    public init(_ message: String) {
        self.message = message
    }

    public var description: String { message }
}
