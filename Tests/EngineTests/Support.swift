import BrokerCore
import EngineLoader
import Foundation
import NIOCore
@_exported import EngineConformance
import TestSupport

/// A directory under /tmp, removed when `body` returns.
func withTemporaryDirectory<T>(_ body: (String) async throws -> T) async throws -> T {
    try await TestSupport.withTemporaryDirectory(prefix: "sb-engine", body)
}

/// The engines built beside the test bundle, found the way the daemon finds them.
let sharedLoader = EngineLoader(searchPath: .standard())

/// The directory the repository's root is in (for the C header).
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().path
