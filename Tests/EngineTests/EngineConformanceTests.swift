import BrokerCore
import EngineLoader
import Foundation
import NIOCore
import Testing
import Wire

/// Every engine we ship, and the C example, loaded through the loader exactly as the daemon loads them.
let allEngines = ["memory", "sqlite", "disk", "c-example"]
/// The engines that declare `persistent`; `persistenceIsDeclaredHonestly` checks this list against the engines.
let persistentEngines = ["sqlite", "disk", "c-example"]

/// How many items the big-apply case writes and reads back.
func bigApplySize(_ engine: String) -> Int { engine == "disk" ? 10_000 : 100_000 }

@Suite struct EngineConformanceTests {
    func engine(_ name: String) throws -> LoadedEngine {
        try sharedLoader.load(name)
    }

    /// Opens a store in a fresh directory, runs `body`, closes it.
    func withStore(
        _ name: String, options: [String: String] = [:],
        _ body: (LoadedEngine, any EngineStore, String) async throws -> Void
    ) async throws {
        let engine = try engine(name)
        try await withTemporaryDirectory { directory in
            let store = try engine.open(directory: directory, store: "conformance", options: options)
            do {
                try await body(engine, store, directory)
            } catch {
                store.close()
                throw error
            }
            store.close()
        }
    }

    /// Opens the suite's store in `directory` (again, for a persistent engine).
    func reopen(_ engine: LoadedEngine, _ directory: String, options: [String: String] = [:]) async throws
        -> any EngineStore
    {
        try engine.open(directory: directory, store: "conformance", options: options)
    }

    @Test(arguments: allEngines)
    func describesItself(name: String) throws {
        let engine = try engine(name)
        #expect(engine.name == name)
        #expect(!engine.version.isEmpty)
        #expect(engine.capabilities.contains(.atomic), "every engine we ship is atomic")
        #expect(engine.optionKeys.contains("fail_after_steps"))
        #expect(engine.abiMajor == 1)
        #expect(throws: EngineLoadError.self) { try engine.validate(options: ["no_such_option": "1"]) }
    }

    @Test func persistenceIsDeclaredHonestly() throws {
        for name in allEngines {
            #expect(try engine(name).capabilities.contains(.persistent) == persistentEngines.contains(name), "\(name)")
        }
    }

    @Test(arguments: allEngines)
    func aNewStoreIsEmptyAtSequenceZero(name: String) async throws {
        try await withStore(name) { (_, store, _) async throws in
            #expect(store.openedSequence == 0)
            #expect(try await store.count() == 0)
            #expect(try await store.scanAll().isEmpty)
            #expect(try await store.allKeys().isEmpty)
            #expect(try await store.get([Array("a".utf8)]) == [nil])
            #expect(try await store.contains(Array("a".utf8)) == false)
        }
    }

    @Test(arguments: allEngines)
    func everyReadAfterPuts(name: String) async throws {
        try await withStore(name) { (_, store, _) async throws in
            try store.apply(
                [.put(record("b", "B", created: 10, updated: 11)), .put(record("a", "A", created: 20, updated: 21)),
                 .put(record("c", "C", created: 30, updated: 31))], sequence: 1)
            let all = try store.scanAll()
            #expect(keys(all) == ["b", "a", "c"], "insertion order, not key order")
            #expect(all[0] == record("b", "B", created: 10, updated: 11))
            #expect(try await store.allKeys().map { String(decoding: $0, as: UTF8.self) } == ["b", "a", "c"])
            #expect(try await store.count() == 3)
            let got = try store.get([Array("c".utf8), Array("zz".utf8), Array("b".utf8)])
            #expect(got == [record("c", "C", created: 30, updated: 31), nil, record("b", "B", created: 10, updated: 11)])
            #expect(try await store.contains(Array("a".utf8)))
            #expect(try await store.contains(Array("z".utf8)) == false)
        }
    }

    @Test(arguments: allEngines)
    func anOverwriteKeepsItsPlaceAndTheGivenTimes(name: String) async throws {
        try await withStore(name) { (_, store, _) async throws in
            try store.apply([.put(record("a", "1", created: 5, updated: 5)), .put(record("b", "2"))], sequence: 1)
            try store.apply([.put(record("a", "changed", created: 5, updated: 99))], sequence: 2)
            let all = try store.scanAll()
            #expect(keys(all) == ["a", "b"])
            #expect(all[0] == record("a", "changed", created: 5, updated: 99))
        }
    }

    @Test(arguments: allEngines)
    func aRemovedKeyPutAgainGoesLast(name: String) async throws {
        try await withStore(name) { (_, store, _) async throws in
            try store.apply([.put(record("a", "1")), .put(record("b", "2")), .put(record("c", "3"))], sequence: 1)
            try store.apply([.remove(key: Array("a".utf8)), .remove(key: Array("absent".utf8))], sequence: 2)
            #expect(keys(try await store.scanAll()) == ["b", "c"])
            try store.apply([.put(record("a", "again"))], sequence: 3)
            #expect(keys(try await store.scanAll()) == ["b", "c", "a"])
            // Within one apply too, and the last put of a key wins while the first fixes its place.
            try store.apply(
                [.remove(key: Array("b".utf8)), .put(record("b", "x")), .put(record("d", "1")), .put(record("d", "2"))],
                sequence: 4)
            let all = try store.scanAll()
            #expect(keys(all) == ["c", "a", "b", "d"])
            #expect(all.last?.payload == ByteBuffer(string: "2"))
        }
    }

    @Test(arguments: allEngines)
    func removeAllThenPutsInOneApply(name: String) async throws {
        try await withStore(name) { (_, store, _) async throws in
            try store.apply([.put(record("a", "1")), .put(record("b", "2"))], sequence: 1)
            try store.apply([.removeAll, .put(record("z", "26")), .put(record("a", "new"))], sequence: 2)
            #expect(keys(try await store.scanAll()) == ["z", "a"])
            #expect(try await store.count() == 2)
        }
    }

    @Test(arguments: allEngines)
    func bytesAreKeptExactly(name: String) async throws {
        try await withStore(name) { (_, store, _) async throws in
            let weirdKeys: [[UInt8]] = [[0], [0, 0, 1], [0xFF, 0xFE], [0xC3, 0x28], Array("é".utf8), [0x2F, 0x2E, 0x2E]]
            let records = weirdKeys.enumerated().map { index, key in
                record(bytes: key, payload: [0, UInt8(index), 0xFF, 0], created: UInt64(index), updated: UInt64.max - 1)
            }
            let empty = record(bytes: [7], payload: [])
            try store.apply((records + [empty]).map { .put($0) }, sequence: 1)
            #expect(try await store.scanAll() == records + [empty])
            #expect(try await store.get(weirdKeys) == records)
            #expect(try await store.allKeys() == weirdKeys + [[7]])
            // "é" precomposed and decomposed are different keys.
            #expect(try await store.contains(Array("e\u{301}".utf8)) == false)
        }
    }

    @Test(arguments: allEngines)
    func anEmptyApplyRecordsOnlyTheSequence(name: String) async throws {
        try await withStore(name) { (engine, store, directory) async throws in
            try store.apply([.put(record("a", "1"))], sequence: 1)
            try store.apply([], sequence: 2)
            #expect(keys(try await store.scanAll()) == ["a"])
            guard engine.capabilities.contains(.persistent) else { return }
            store.close()
            let again = try await reopen(engine, directory)
            #expect(again.openedSequence == 2)
            again.close()
        }
    }

    @Test(arguments: allEngines)
    func aFailedApplyLeavesNothingBehind(name: String) async throws {
        let engine = try engine(name)
        try await withTemporaryDirectory { directory in
            var store = try await reopen(engine, directory)
            try store.apply([.put(record("a", "1")), .put(record("b", "2"))], sequence: 1)
            let before = try store.scanAll()
            store.close()

            store = try await reopen(engine, directory, options: ["fail_after_steps": "3"])
            if !engine.capabilities.contains(.persistent) {
                try store.apply([.put(record("a", "1")), .put(record("b", "2"))], sequence: 1)
            }
            let failing: [EngineStep] = [
                .put(record("a", "overwritten")), .remove(key: Array("b".utf8)), .put(record("new", "x")),
                .put(record("never", "y")), .removeAll,
            ]
            let error = try await #require(throws: EngineFailure.self) { try await store.apply(failing, sequence: 2) }
            #expect(error.code == .injected)
            #expect(try await store.scanAll() == before, "memory unchanged after a failed apply")
            #expect(try await store.count() == 2)
            store.close()

            guard engine.capabilities.contains(.persistent) else { return }
            let reopened = try await reopen(engine, directory)
            #expect(reopened.openedSequence == 1, "the failed apply's sequence was not recorded")
            #expect(try await reopened.scanAll() == before, "nothing of the failed apply survives a reopen")
            reopened.close()
        }
    }

    @Test(arguments: persistentEngines)
    func orderTimesAndSequenceSurviveAReopen(name: String) async throws {
        let engine = try engine(name)
        try await withTemporaryDirectory { directory in
            let store = try await reopen(engine, directory)
            try store.apply((0..<50).map { .put(record("k\(49 - $0)", "v\($0)", created: UInt64($0), updated: 7)) }, sequence: 1)
            try store.apply([.remove(key: Array("k49".utf8)), .put(record("k10", "over", created: 39, updated: 8))], sequence: 2)
            try store.apply([.put(record("k49", "back", created: 100, updated: 100))], sequence: 3)
            let before = try store.scanAll()
            store.close()
            let reopened = try await reopen(engine, directory)
            #expect(reopened.openedSequence == 3)
            #expect(try await reopened.scanAll() == before)
            #expect(keys(try await reopened.scanAll()).last == "k49")
            reopened.close()
        }
    }

    @Test func aMemoryStoreStartsEmptyOnEveryOpen() async throws {
        print("EngineConformanceTests: persistence cases are skipped for memory (it does not declare persistent)")
        let engine = try engine("memory")
        try await withTemporaryDirectory { directory in
            let store = try engine.open(directory: directory, store: "s", options: [:])
            try store.apply([.put(record("a", "1"))], sequence: 1)
            store.close()
            let again = try engine.open(directory: directory, store: "s", options: [:])
            #expect(again.openedSequence == 0)
            #expect(try await again.count() == 0)
            again.close()
        }
    }

    @Test(arguments: allEngines)
    func dropDeletesEverything(name: String) async throws {
        let engine = try engine(name)
        try await withTemporaryDirectory { directory in
            let store = try await reopen(engine, directory)
            try store.apply([.put(record("a", "1"))], sequence: 1)
            store.close()
            try engine.drop(directory: directory, store: "conformance", options: [:])
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory).isEmpty, "drop leaves no file")
            let reopened = try await reopen(engine, directory)
            #expect(reopened.openedSequence == 0)
            #expect(try await reopened.count() == 0)
            reopened.close()
            // Dropping a store with no data is not an error.
            try engine.drop(directory: directory, store: "conformance", options: [:])
            try engine.drop(directory: directory, store: "conformance", options: [:])
        }
    }

    @Test(arguments: allEngines)
    func aBigApplyIsWrittenAndReadBack(name: String) async throws {
        let size = bigApplySize(name)
        try await withStore(name) { (engine, store, directory) async throws in
            let records = (0..<size).map { record("item-\($0)", "{\"n\":\($0),\"pad\":\"xxxxxxxxxxxxxxxx\"}", created: UInt64($0), updated: UInt64($0)) }
            try store.apply(records.map { .put($0) }, sequence: 1)
            #expect(try await store.count() == UInt64(size))
            let all = try store.scanAll()
            #expect(all.count == size)
            #expect(all == records)
            let some = [Array("item-\(size - 1)".utf8), Array("item-0".utf8), Array("item-\(size)".utf8)]
            #expect(try await store.get(some) == [records[size - 1], records[0], nil])
            guard engine.capabilities.contains(.persistent) else { return }
            store.close()
            let reopened = try await reopen(engine, directory)
            #expect(try await reopened.scanAll() == records)
            reopened.close()
        }
    }
}
