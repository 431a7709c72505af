// Helpers shared by the test targets (not shipped).
import Foundation

/// SplitMix64: small, fast, and the same sequence for the same seed on every machine.
public struct SeededGenerator: RandomNumberGenerator {
    public var state: UInt64

    public init(state: UInt64) {
        self.state = state
    }

    /// A seed from `STOREBROKER_TEST_SEED`, else a random one; the caller prints it.
    public static func seedFromEnvironment() -> UInt64 {
        ProcessInfo.processInfo.environment["STOREBROKER_TEST_SEED"].flatMap { UInt64($0) }
            ?? UInt64.random(in: 1...UInt64.max)
    }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// A new directory `/tmp/PREFIX-XXXXXX` (short: socket paths must stay under 108 bytes), removed when `body`
/// returns.
public func withTemporaryDirectory<T>(prefix: String, _ body: (String) async throws -> T) async throws -> T {
    var template = Array("/tmp/\(prefix)-XXXXXX".utf8CString)
    guard let made = mkdtemp(&template) else { throw POSIXError(.EIO) }
    let path = String(cString: made)
    defer { try? FileManager.default.removeItem(atPath: path) }
    return try await body(path)
}
