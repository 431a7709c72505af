import BrokerCore
import EngineLoader
import Foundation
import NIOCore
import TestSupport

/// A directory under /tmp, removed when `body` returns.
func withTemporaryDirectory<T>(_ body: (String) async throws -> T) async throws -> T {
    try await TestSupport.withTemporaryDirectory(prefix: "sb-engine", body)
}

/// The engines built beside the test bundle, found the way the daemon finds them.
let sharedLoader = EngineLoader(searchPath: .standard())

func record(_ key: String, _ payload: String, created: UInt64 = 1, updated: UInt64 = 1) -> EngineRecord {
    EngineRecord(key: Array(key.utf8), payload: ByteBuffer(string: payload), createdAt: created, updatedAt: updated)
}

func record(bytes key: [UInt8], payload: [UInt8], created: UInt64 = 1, updated: UInt64 = 1) -> EngineRecord {
    EngineRecord(key: key, payload: ByteBuffer(bytes: payload), createdAt: created, updatedAt: updated)
}

func keys(_ records: [EngineRecord]) -> [String] {
    records.map { String(decoding: $0.key, as: UTF8.self) }
}

/// The directory the repository's root is in (for the C header).
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().path
