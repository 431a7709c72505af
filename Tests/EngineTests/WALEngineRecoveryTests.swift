import BrokerCore
import EngineLoader
import Foundation
import NIOCore
import Testing

/// The wal engine's files as a crash, a power cut or damage leave them (docs/ENGINE-ABI.md, "wal"): opened
/// through the loader as the daemon opens them.
@Suite struct WALEngineRecoveryTests {
    /// Small segments, so that a few hundred applies close several and make snapshots.
    static let smallSegments = ["snapshot_log_bytes": "4096", "synchronous": "FULL"]

    func names(_ directory: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: directory).sorted()
    }

    func bytes(_ directory: String, _ name: String) throws -> Data {
        try Data(contentsOf: URL(fileURLWithPath: directory + "/" + name))
    }

    func append(_ extra: [UInt8], to path: String) throws {
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        try handle.seekToEnd()
        try handle.write(contentsOf: extra)
        try handle.close()
    }

    /// Three applies in one segment; returns what they left.
    func threeApplies(in directory: String) async throws -> [EngineRecord] {
        let store = try sharedLoader.load("wal").open(directory: directory, store: "s", options: [:])
        try store.apply((0..<10).map { .put(record("k\($0)", "v\($0)")) }, sequence: 1)
        try store.apply([.remove(key: Array("k3".utf8)), .put(record("k5", "five", created: 1, updated: 9))], sequence: 2)
        try store.apply([.put(record("k3", "back"))], sequence: 3)
        let records = try store.scanAll()
        store.close()
        return records
    }

    @Test(arguments: [
        // A record header cut short.
        [UInt8](repeating: 7, count: 5),
        // A header promising more bytes than the file holds.
        [100, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4] + [UInt8](repeating: 0, count: 40),
        // A whole-length record whose checksum fails (sectors that never reached the disk read as zeros).
        [24, 0, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9] + [UInt8](repeating: 0, count: 24),
    ])
    func aTornTailIsCutAndTheStoreOpensAtItsLastWholeCommit(tail: [UInt8]) async throws {
        let wal = try sharedLoader.load("wal")
        try await withTemporaryDirectory { directory in
            let records = try await threeApplies(in: directory)
            let log = directory + "/log-0000000000000001"
            let whole = try bytes(directory, "log-0000000000000001").count
            try append(tail, to: log)
            let reopened = try wal.open(directory: directory, store: "s", options: [:])
            #expect(reopened.openedSequence == 3)
            #expect(try reopened.scanAll() == records)
            #expect(try bytes(directory, "log-0000000000000001").count == whole)
            // The next apply follows the last whole one and survives a reopen.
            try reopened.apply([.put(record("k10", "ten"))], sequence: 4)
            reopened.close()
            let again = try wal.open(directory: directory, store: "s", options: [:])
            #expect(again.openedSequence == 4)
            #expect(keys(try again.scanAll()).last == "k10")
            again.close()
        }
    }

    /// Writes until several segments were closed and folded into snapshots; returns what the store holds.
    func manyApplies(in directory: String) async throws -> [EngineRecord] {
        let store = try sharedLoader.load("wal").open(directory: directory, store: "s", options: Self.smallSegments)
        for sequence in UInt64(1)...400 {
            let id = "k\(sequence % 50)"
            if sequence % 7 == 0 {
                try store.apply([.remove(key: Array(id.utf8))], sequence: sequence)
            } else {
                try store.apply([.put(record(id, String(repeating: "x", count: 100) + "\(sequence)"))], sequence: sequence)
            }
        }
        let records = try store.scanAll()
        #expect(try store.count() == UInt64(records.count))
        store.close()
        return records
    }

    @Test func snapshotsAndTheLogAfterThemReopenAsTheStore() async throws {
        let wal = try sharedLoader.load("wal")
        try await withTemporaryDirectory { directory in
            let records = try await manyApplies(in: directory)
            #expect(try names(directory).contains { $0.hasPrefix("snapshot-") })
            let reopened = try wal.open(directory: directory, store: "s", options: Self.smallSegments)
            #expect(reopened.openedSequence == 400)
            #expect(try reopened.count() == UInt64(records.count))
            #expect(try reopened.scanAll() == records)
            reopened.close()
        }
    }

    @Test func whatACrashLeftAroundASnapshotIsCleanedUp() async throws {
        let wal = try sharedLoader.load("wal")
        try await withTemporaryDirectory { directory in
            let records = try await manyApplies(in: directory)
            let kept = try names(directory)
            // An unfinished snapshot, an older snapshot and a segment the newest snapshot already holds: what a
            // crash between writing a snapshot and deleting what it replaced leaves.
            try Data("half a snapshot".utf8).write(to: URL(fileURLWithPath: directory + "/snapshot-00000000000000ff.tmp"))
            try Data("old".utf8).write(to: URL(fileURLWithPath: directory + "/snapshot-0000000000000001"))
            try Data("old".utf8).write(to: URL(fileURLWithPath: directory + "/log-0000000000000001"))
            let reopened = try wal.open(directory: directory, store: "s", options: Self.smallSegments)
            #expect(try reopened.scanAll() == records)
            reopened.close()
            #expect(try names(directory) == kept)
        }
    }

    @Test func aMissingSnapshotOrSegmentFailsInsteadOfOpeningShort() async throws {
        let wal = try sharedLoader.load("wal")
        try await withTemporaryDirectory { directory in
            _ = try await manyApplies(in: directory)
            let snapshot = try #require(try names(directory).first { $0.hasPrefix("snapshot-") })
            try FileManager.default.removeItem(atPath: directory + "/" + snapshot)
            let error = try #require(throws: EngineFailure.self) {
                _ = try wal.open(directory: directory, store: "s", options: [:])
            }
            #expect(error.code == .corrupt)
            #expect(error.message.contains("missing"))
        }
    }

    @Test func aDamagedSnapshotFailsTheLoad() async throws {
        let wal = try sharedLoader.load("wal")
        try await withTemporaryDirectory { directory in
            _ = try await manyApplies(in: directory)
            let snapshot = try #require(try names(directory).first { $0.hasPrefix("snapshot-") })
            var damaged = try bytes(directory, snapshot)
            damaged[damaged.count / 2] ^= 0x01
            try damaged.write(to: URL(fileURLWithPath: directory + "/" + snapshot))
            let store = try wal.open(directory: directory, store: "s", options: [:])
            let error = try #require(throws: EngineFailure.self) { _ = try store.scanAll() }
            #expect(error.code == .corrupt)
            store.close()
        }
    }

    /// 20,000 replacing writes over 10 ids (about 5 MB of log) with 64 KiB segments: snapshots keep the files
    /// near the size of the items, not of the writes.
    @Test func snapshotsKeepTheFilesBounded() async throws {
        let wal = try sharedLoader.load("wal")
        try await withTemporaryDirectory { directory in
            let options = ["snapshot_log_bytes": "65536"]
            let store = try wal.open(directory: directory, store: "s", options: options)
            let payload = String(repeating: "p", count: 200)
            for sequence in UInt64(1)...20_000 {
                try store.apply([.put(record("id\(sequence % 10)", payload + "\(sequence)"))], sequence: sequence)
            }
            store.close()
            let files = try names(directory)
            let total = try files.reduce(0) { $0 + (try bytes(directory, $1).count) }
            #expect(total < 1 << 20, "\(total) bytes in \(files)")
            let reopened = try wal.open(directory: directory, store: "s", options: options)
            #expect(reopened.openedSequence == 20_000)
            #expect(try reopened.scanAll().map { String(buffer: $0.payload) }.sorted()
                == (19_991...20_000).map { payload + "\($0)" }.sorted())
            reopened.close()
        }
    }
}
