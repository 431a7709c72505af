import BrokerCore
import EngineLoader
import Foundation
import NIOCore
import TestSupport
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
            // An unfinished snapshot, an older snapshot and a segment the newest snapshot already holds: what a
            // crash between writing a snapshot and deleting what it replaced leaves.
            let unfinished = directory + "/snapshot-00000000000000ff.tmp"
            let older = [directory + "/snapshot-0000000000000001", directory + "/log-0000000000000001"]
            try Data("half a snapshot".utf8).write(to: URL(fileURLWithPath: unfinished))
            for path in older { try Data("old".utf8).write(to: URL(fileURLWithPath: path)) }
            let reopened = try wal.open(directory: directory, store: "s", options: Self.smallSegments)
            #expect(try reopened.scanAll() == records)
            #expect(!FileManager.default.fileExists(atPath: unfinished))
            // The older files stay until the next snapshot has read the newest whole.
            #expect(older.allSatisfy { FileManager.default.fileExists(atPath: $0) })
            for sequence in UInt64(401)...500 {
                try reopened.apply([.put(record("k\(sequence % 50)", String(repeating: "y", count: 100)))], sequence: sequence)
            }
            let cleaned = await eventually(within: 20) { older.allSatisfy { !FileManager.default.fileExists(atPath: $0) } }
            #expect(cleaned)
            reopened.close()
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

/// What a power cut under NORMAL can leave around a closed segment: its tail not yet synced, the next segment
/// created and perhaps named on disk, but with no record synced.
@Suite struct WALEngineSegmentTests {
    /// Two segments: the first closed after applies 1-20 (small segments), the newest holding the rest.
    func twoSegments(in directory: String) async throws -> (first: String, newest: String, records: [EngineRecord]) {
        let store = try sharedLoader.load("wal").open(
            directory: directory, store: "s", options: ["snapshot_log_bytes": "1000000000"])
        try store.apply((0..<20).map { .put(record("k\($0)", "v\($0)")) }, sequence: 1)
        let records = try store.scanAll()
        store.close()
        // A second segment, as a rotation after sequence 1 leaves it: the header only.
        let newest = directory + "/log-0000000000000002"
        var header = Array("sbwal-l1".utf8)
        withUnsafeBytes(of: UInt64(2).littleEndian) { header.append(contentsOf: $0) }
        try Data(header).write(to: URL(fileURLWithPath: newest))
        return (directory + "/log-0000000000000001", newest, records)
    }

    @Test(arguments: [true, false])
    func aTornClosedSegmentBeforeAnEmptyOneOpensAtItsLastWholeRecord(headerSynced: Bool) async throws {
        let wal = try sharedLoader.load("wal")
        try await withTemporaryDirectory { directory in
            let (first, newest, records) = try await twoSegments(in: directory)
            let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: first))
            try handle.seekToEnd()
            try handle.write(contentsOf: [UInt8](repeating: 0, count: 700))  // sectors that never reached the disk
            try handle.close()
            if !headerSynced { try Data(count: 16).write(to: URL(fileURLWithPath: newest)) }
            let reopened = try wal.open(directory: directory, store: "s", options: [:])
            #expect(reopened.openedSequence == 1)
            #expect(try reopened.scanAll() == records)
            try reopened.apply([.put(record("after", "cut"))], sequence: 2)
            reopened.close()
            // The empty newest segment went with the cut; the next apply followed the last whole record.
            #expect(!FileManager.default.fileExists(atPath: newest))
            let again = try wal.open(directory: directory, store: "s", options: [:])
            let after = try again.scanAll()
            #expect(again.openedSequence == 2 && keys(after).last == "after")
            again.close()
        }
    }

    /// A rotation that failed after creating the next segment left it, holding only its header, while the log
    /// went on in the segment before (the fix of a reviewer's finding: such a store was refused).
    @Test func aSegmentLeftByAFailedRotationIsDeleted() async throws {
        let wal = try sharedLoader.load("wal")
        try await withTemporaryDirectory { directory in
            let (_, leftover, _) = try await twoSegments(in: directory)  // log-2: a header only
            try FileManager.default.removeItem(atPath: leftover)
            let store = try wal.open(directory: directory, store: "s", options: [:])
            try store.apply([.put(record("a", "1"))], sequence: 2)
            try store.apply([.put(record("b", "2"))], sequence: 3)
            let records = try store.scanAll()
            store.close()
            var header = Array("sbwal-l1".utf8)
            withUnsafeBytes(of: UInt64(2).littleEndian) { header.append(contentsOf: $0) }
            try Data(header).write(to: URL(fileURLWithPath: leftover))  // starts inside log-1, which runs to 3
            let reopened = try wal.open(directory: directory, store: "s", options: [:])
            #expect(reopened.openedSequence == 3)
            #expect(try reopened.scanAll() == records)
            reopened.close()
            #expect(!FileManager.default.fileExists(atPath: leftover))
        }
    }

    @Test func aTornClosedSegmentBeforeRecordsIsDamage() async throws {
        let wal = try sharedLoader.load("wal")
        try await withTemporaryDirectory { directory in
            let (first, _, _) = try await twoSegments(in: directory)
            // The newest segment gets a whole record (sequence 2) while the closed one's tail is torn.
            let store = try wal.open(directory: directory, store: "s", options: [:])
            try store.apply([.put(record("late", "x"))], sequence: 2)
            store.close()
            var bytes = try Data(contentsOf: URL(fileURLWithPath: first))
            bytes[bytes.count - 3] ^= 0xFF
            try bytes.write(to: URL(fileURLWithPath: first))
            let error = try #require(throws: EngineFailure.self) {
                _ = try wal.open(directory: directory, store: "s", options: [:])
            }
            #expect(error.code == .corrupt)
            #expect(error.message.contains("holds records after it"))
        }
    }

    /// NORMAL applies never wait for I/O (the daemon commits them on its owner loop); FULL ones do.
    @Test func normalIsNonblockingAndFullIsNot() throws {
        let wal = try sharedLoader.load("wal")
        #expect(!wal.capabilities.contains(.nonblocking))
        #expect(wal.capabilities(options: [:]).contains(.nonblocking))
        #expect(wal.capabilities(options: ["synchronous": "NORMAL"]).contains(.nonblocking))
        #expect(!wal.capabilities(options: ["synchronous": "FULL"]).contains(.nonblocking))
        #expect(wal.capabilities(options: ["synchronous": "FULL"]) == wal.capabilities)
        #expect(try sharedLoader.load("sqlite").capabilities(options: [:]) == sharedLoader.load("sqlite").capabilities)
    }
}

/// A clean close folds a long log into a snapshot, so that the next open reads one file.
@Suite struct WALEngineFoldTests {
    /// 100 applies of 100 items of 200 bytes (about 2.3 MB of log) in one segment.
    func longLog(in directory: String) throws -> LoadedStore {
        let store = try sharedLoader.load("wal").open(directory: directory, store: "s", options: [:]) as! LoadedStore
        for sequence in UInt64(1)...100 {
            try store.apply(
                (0..<100).map { .put(record("k\(sequence)-\($0)", String(repeating: "p", count: 200))) }, sequence: sequence)
        }
        return store
    }

    @Test func aCleanCloseLeavesOneSnapshotAndTheStoreReopensFromIt() async throws {
        let wal = try sharedLoader.load("wal")
        try await withTemporaryDirectory { directory in
            let store = try longLog(in: directory)
            let records = try store.scanAll()
            store.close()
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["snapshot-0000000000000064"])
            let reopened = try wal.open(directory: directory, store: "s", options: [:])
            #expect(reopened.openedSequence == 100)
            #expect(try reopened.count() == 10_000)
            #expect(try reopened.scanAll() == records)
            try reopened.apply([.put(record("after", "fold"))], sequence: 101)
            reopened.close()
            let again = try wal.open(directory: directory, store: "s", options: [:])
            let after = try again.scanAll()
            #expect(again.openedSequence == 101 && after.count == 10_001 && keys(after).last == "after")
            again.close()
        }
    }

    /// A crash after the snapshot was renamed into place and before the folded segment was deleted: the segment
    /// is ignored, and deleted by the next snapshot.
    @Test func aFoldedSegmentLeftByACrashIsIgnoredThenDeleted() async throws {
        let wal = try sharedLoader.load("wal")
        try await withTemporaryDirectory { directory in
            let store = try longLog(in: directory)
            let records = try store.scanAll()
            let segment = try Data(contentsOf: URL(fileURLWithPath: directory + "/log-0000000000000001"))
            store.close()
            try segment.write(to: URL(fileURLWithPath: directory + "/log-0000000000000001"))
            let reopened = try wal.open(directory: directory, store: "s", options: [:])
            #expect(reopened.openedSequence == 100)
            #expect(try reopened.scanAll() == records)
            // It stays until the next snapshot has read the newest whole: here the fold of the next close.
            for sequence in UInt64(101)...200 {
                try reopened.apply(
                    (0..<100).map { .put(record("m\(sequence)-\($0)", String(repeating: "q", count: 200))) }, sequence: sequence)
            }
            reopened.close()
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["snapshot-00000000000000c8"])
        }
    }
}
