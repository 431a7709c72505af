import BrokerCore
import EngineLoader
import Foundation
import NIOCore
import Testing

/// The sqlite engine copies its write-ahead log into the database on a thread of its own (so no commit waits for
/// a checkpoint): the log is checkpointed while commits go on, nothing is lost, and closing stops the thread.
@Suite struct SQLiteCheckpointTests {
    private func fileSize(_ path: String) -> Int {
        ((try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? Int) ?? 0
    }

    @Test func theLogIsCheckpointedBesideTheCommitsAndNothingIsLost() async throws {
        let engine = try sharedLoader.load("sqlite")
        try await withTemporaryDirectory { directory in
            let database = directory + "/store.sqlite3"
            let store = try engine.open(directory: directory, store: "checkpoints", options: [:])
            let payload = ByteBuffer(repeating: 0x61, count: 4096)
            // 1,500 commits of one 4 KB item: more than 2 pages each, far past the 1,000 pages that wake the
            // checkpointer. Only a checkpoint writes pages into the database file itself.
            for n in 1...1500 {
                try store.apply(
                    [.put(EngineRecord(key: Array("k\(n % 700)".utf8), payload: payload, createdAt: 1, updatedAt: 2))],
                    sequence: UInt64(n))
            }
            var grown = false
            for _ in 0..<500 where !grown {
                grown = fileSize(database) > 1_000_000
                if !grown { try await Task.sleep(for: .milliseconds(10)) }
            }
            #expect(grown, "the database file is \(fileSize(database)) bytes: no checkpoint ran")
            store.close()

            let reopened = try engine.open(directory: directory, store: "checkpoints", options: [:])
            defer { reopened.close() }
            #expect(reopened.openedSequence == 1500)
            #expect(try reopened.count() == 700)
        }
    }
}
