import BrokerCore
import EngineLoader
import Foundation
import NIOCore
import Testing

/// The disk engine's journal, tested by copying a store's directory while it is open (what a crash or a
/// power cut leaves behind) and opening the copy.
@Suite struct DiskEngineRecoveryTests {
    /// Writes three applies with checkpoints off, copies the directory as a crash would leave it, and returns
    /// the expected records and the copy's path.
    func crashedStore(in directory: String) async throws -> (records: [EngineRecord], copy: String) {
        let disk = try sharedLoader.load("disk")
        let live = directory + "/live"
        try FileManager.default.createDirectory(atPath: live, withIntermediateDirectories: false)
        let store = try disk.open(directory: live, store: "s", options: ["checkpoint_every": "1000"])
        try store.apply((0..<20).map { .put(record("k\($0)", "v\($0)")) }, sequence: 1)
        try store.apply([.remove(key: Array("k3".utf8)), .put(record("k5", "five", created: 1, updated: 9))], sequence: 2)
        try store.apply([.put(record("k3", "back"))], sequence: 3)
        let records = try store.scanAll()
        let copy = directory + "/copy"
        try FileManager.default.copyItem(atPath: live, toPath: copy)
        await store.close()
        #expect(try FileManager.default.contentsOfDirectory(atPath: copy).filter { $0.hasPrefix("journal-") }.count == 3)
        return (records, copy)
    }

    @Test func journalsLeftByACrashAreReplayed() async throws {
        let disk = try sharedLoader.load("disk")
        try await withTemporaryDirectory { directory in
            let (records, copy) = try await crashedStore(in: directory)
            // Undo part of the install, as if the crash came in the middle of it.
            try FileManager.default.removeItem(atPath: copy + "/items/0000000000000015")
            let reopened = try disk.open(directory: copy, store: "s", options: [:])
            #expect(reopened.openedSequence == 3)
            #expect(try await reopened.scanAll() == records)
            #expect(keys(try await reopened.scanAll()).last == "k3")
            await reopened.close()
            #expect(try FileManager.default.contentsOfDirectory(atPath: copy).filter { $0.hasPrefix("journal-") }.isEmpty)
        }
    }

    @Test func anUncommittedJournalIsDiscarded() async throws {
        let disk = try sharedLoader.load("disk")
        try await withTemporaryDirectory { directory in
            let (records, copy) = try await crashedStore(in: directory)
            try Data("half a journal".utf8).write(to: URL(fileURLWithPath: copy + "/journal-0000000000000004.tmp"))
            let reopened = try disk.open(directory: copy, store: "s", options: [:])
            #expect(reopened.openedSequence == 3)
            #expect(try await reopened.scanAll() == records)
            await reopened.close()
        }
    }

    @Test func aDamagedJournalFailsLoudly() async throws {
        let disk = try sharedLoader.load("disk")
        try await withTemporaryDirectory { directory in
            let (_, copy) = try await crashedStore(in: directory)
            let path = copy + "/journal-0000000000000002"
            var bytes = try Data(contentsOf: URL(fileURLWithPath: path))
            bytes[30] ^= 0xFF
            try bytes.write(to: URL(fileURLWithPath: path))
            let error = try await #require(throws: EngineFailure.self) {
                _ = try disk.open(directory: copy, store: "s", options: [:])
            }
            #expect(error.code == .corrupt)
            #expect(error.message.contains("checksum"))
        }
    }

    @Test func aLostItemFileFailsLoudlyInsteadOfLoadingLess() async throws {
        let disk = try sharedLoader.load("disk")
        try await withTemporaryDirectory { directory in
            let store = try disk.open(directory: directory, store: "s", options: [:])
            try store.apply([.put(record("a", "1")), .put(record("b", "2"))], sequence: 1)
            await store.close()
            try FileManager.default.removeItem(atPath: directory + "/items/0000000000000001")
            let error = try await #require(throws: EngineFailure.self) {
                _ = try disk.open(directory: directory, store: "s", options: [:])
            }
            #expect(error.code == .corrupt)
        }
    }

    @Test func keysThatLookLikePathsStayInsideTheStore() async throws {
        let disk = try sharedLoader.load("disk")
        try await withTemporaryDirectory { directory in
            let store = try disk.open(directory: directory, store: "s", options: [:])
            let nasty: [[UInt8]] = [Array("../../escape".utf8), Array("/etc/passwd".utf8), [0x2E, 0x2E], [0x2F, 0]]
            try store.apply(nasty.map { .put(record(bytes: $0, payload: [1])) }, sequence: 1)
            await store.close()
            let items = try FileManager.default.contentsOfDirectory(atPath: directory + "/items")
            #expect(items.count == 4)
            #expect(items.allSatisfy { $0.count == 16 && $0.allSatisfy(\.isHexDigit) })
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory).sorted() == ["items", "state"])
        }
    }
}
