import BrokerCore
import EngineLoader
import Foundation
import NIOCore
import StoreModel

#if canImport(Glibc)
import Glibc
#endif

/// ABI 2.1's shared stores (SB_CAP_SHARED): what several brokers on one database rely on. Skipped for an engine
/// that does not share its stores.
enum SharedProperties {
    static let all: [Property] = [byName, applyAtPosition, oneWinsAtAPosition, dropEndsTheEpoch, watchNamesTheStore]

    static let sharedOnly: @Sendable (LoadedEngine) -> String? = {
        $0.sharesStores ? nil : "the engine does not declare SB_CAP_SHARED"
    }

    static func shared(_ store: LoadedStore) -> any SharedEngineStore { store }

    /// The logged commits after `after`, with the position.
    static func log(_ store: LoadedStore, epoch: UInt64, after: UInt64) throws -> (commits: [(UInt64, [UInt8])], position: Position) {
        var commits: [(UInt64, [UInt8])] = []
        let position = try store.commits(epoch: epoch, after: after) { commits.append(($0, Array($1))) }
        return (commits, position)
    }

    static func load(_ store: LoadedStore) throws -> (records: [EngineRecord], position: Position) {
        var records: [EngineRecord] = []
        let position = try store.load { records.append(EngineRecord($0)) }
        return (records, position)
    }

    /// Records as a host makes them: any bytes (an empty one, NULs, invalid UTF-8).
    static let records: [[UInt8]] = [Array("first".utf8), [], [0, 0xFF, 0xFE, 0, 7], Array(repeating: 0xAB, count: 70_000)]

    static let byName = Property(
        "shared-by-name",
        "a store is its name: opened in another directory it has the same items, position and log; load's position matches its items",
        skip: sharedOnly
    ) { context in
        let first = try context.storeDirectory("first")
        let name = context.storeName(first)
        try context.withStore(first) { store in
            try require(try load(store).position == Position(epoch: 0, sequence: 0), "a new store loads at a position other than {0, 0}")
            try store.apply(
                [.put(record("a", "1")), .put(record("b", "2"))], at: Position(epoch: 0, sequence: 0), epoch: 77,
                commits: [(1, records[0])])
        }
        let second = try context.storeDirectory("second")
        let store = try context.engine.open(directory: second, store: name, options: context.setup.options) as! LoadedStore
        defer { store.close() }
        let loaded = try load(store)
        try require(loaded.position == Position(epoch: 77, sequence: 1), "opened in another directory at \(loaded.position)")
        try require(keys(loaded.records) == ["a", "b"], "opened in another directory with \(describe(loaded.records))")
        let logged = try log(store, epoch: 77, after: 0)
        try require(logged.commits.map(\.0) == [1] && logged.commits.first?.1 == records[0], "the log read elsewhere: \(logged.commits.map(\.0))")
        let files = try FileManager.default.contentsOfDirectory(atPath: first) + FileManager.default.contentsOfDirectory(atPath: second)
        try require(files.isEmpty, "a shared engine wrote files in the store's directory: \(files)")
    }

    static let applyAtPosition = Property(
        "apply-at-position",
        "apply_at commits only at the expected position (else conflict, nothing written) and logs each commit's record byte for byte; commits_since reads them in order",
        skip: sharedOnly
    ) { context in
        try context.withNewStore { store in
            let start = Position(epoch: 0, sequence: 0)
            try store.apply([.put(record("a", "1"))], at: start, epoch: 5, commits: [(1, records[0]), (2, records[1])])
            for wrong in [start, Position(epoch: 5, sequence: 1), Position(epoch: 6, sequence: 2), Position(epoch: 5, sequence: 3)] {
                try requireFailure([.conflict], "apply_at expecting \(wrong) when the store is at {5, 2}") {
                    try store.apply([.put(record("z", "never"))], at: wrong, epoch: wrong.epoch == 0 ? 9 : wrong.epoch, commits: [(wrong.sequence + 1, [1])])
                }
            }
            try store.apply(
                [.remove(key: Array("a".utf8)), .put(record("b", "2"))], at: Position(epoch: 5, sequence: 2), epoch: 5,
                commits: [(3, records[2]), (4, records[3])])
            let loaded = try load(store)
            try require(keys(loaded.records) == ["b"] && loaded.position == Position(epoch: 5, sequence: 4),
                "after the refused and the accepted apply_at: \(describe(loaded.records)) at \(loaded.position)")
            let all = try log(store, epoch: 5, after: 0)
            try require(all.commits.map(\.0) == [1, 2, 3, 4], "commits_since 0 yields sequences \(all.commits.map(\.0))")
            try require(all.commits.map(\.1) == records, "the records read back differ from those written")
            try require(all.position == Position(epoch: 5, sequence: 4), "commits_since reports \(all.position)")
            let tail = try log(store, epoch: 5, after: 2)
            try require(tail.commits.map(\.0) == [3, 4], "commits_since 2 yields \(tail.commits.map(\.0))")
            let none = try log(store, epoch: 5, after: 4)
            try require(none.commits.isEmpty && none.position == Position(epoch: 5, sequence: 4), "commits_since 4 yields \(none.commits.map(\.0))")
            let other = try log(store, epoch: 6, after: 0)
            try require(other.commits.isEmpty && other.position == Position(epoch: 5, sequence: 4),
                "commits_since of another epoch yields \(other.commits.map(\.0)) and \(other.position)")
        }
    }

    static let oneWinsAtAPosition = Property(
        "one-wins-at-a-position",
        "two openings of one store (as two hosts have) applying at the same position from 8 threads: exactly one succeeds, the others conflict",
        skip: sharedOnly
    ) { context in
        let directory = try context.storeDirectory()
        let name = context.storeName(directory)
        let stores = try (0..<8).map { index in
            try context.engine.open(
                directory: try context.storeDirectory("host-\(index)"), store: name, options: context.setup.options) as! LoadedStore
        }
        defer { for store in stores { store.close() } }
        let outcomes = FailureList()
        let wins = Wins()
        DispatchQueue.concurrentPerform(iterations: stores.count) { index in
            do {
                try stores[index].apply(
                    [.put(record("k\(index)", "v"))], at: Position(epoch: 0, sequence: 0), epoch: 3,
                    commits: [(1, Array("host \(index)".utf8))])
                wins.add(index)
            } catch let failure as EngineFailure where failure.code == .conflict {
            } catch {
                outcomes.add("host \(index): \(error)")
            }
        }
        if let first = outcomes.first { throw Violation(message: first) }
        let winners = wins.all
        try require(winners.count == 1, "\(winners.count) of 8 applies at the same position succeeded")
        let loaded = try load(stores[0])
        try require(keys(loaded.records) == ["k\(winners[0])"], "the store holds \(describe(loaded.records)), not only the winner's put")
        let logged = try log(stores[0], epoch: 3, after: 0)
        try require(logged.commits.map(\.1) == [Array("host \(winners[0])".utf8)], "the log holds another record than the winner's")
    }

    static let dropEndsTheEpoch = Property(
        "drop-ends-the-epoch",
        "list_stores names a store that exists; after a drop it does not, the store loads empty at {0, 0}, its log is gone, and it can be created again with a new epoch",
        skip: sharedOnly
    ) { context in
        let directory = try context.storeDirectory()
        try context.withStore(directory) {
            try $0.apply([.put(record("a", "1"))], at: Position(epoch: 0, sequence: 0), epoch: 11, commits: [(1, [1])])
        }
        let name = context.storeName(directory)
        try require(try context.engine.storeNames(options: context.setup.options).contains(name), "list_stores does not name a store that exists")
        try context.engine.drop(directory: directory, store: name, options: context.setup.options)
        try require(!(try context.engine.storeNames(options: context.setup.options).contains(name)), "list_stores names a dropped store")
        try context.withStore(directory) { store in
            let loaded = try load(store)
            try require(loaded.records.isEmpty && loaded.position == Position(epoch: 0, sequence: 0), "after the drop: \(loaded.position)")
            let logged = try log(store, epoch: 11, after: 0)
            try require(logged.commits.isEmpty && logged.position.epoch == 0, "the dropped epoch's log: \(logged.commits.map(\.0))")
            try store.apply([.put(record("b", "2"))], at: Position(epoch: 0, sequence: 0), epoch: 12, commits: [(1, [2])])
            try require(try log(store, epoch: 12, after: 0).commits.map(\.1) == [[2]], "the new epoch's log")
        }
    }

    static let watchNamesTheStore = Property(
        "watch-names-the-store",
        "after an apply_at, the watch's descriptor becomes readable within 10 s and watch_changes names the store (with the position the commit left, when it gives one)",
        skip: sharedOnly
    ) { context in
        let watch = try context.engine.watch(options: context.setup.options)
        defer { watch.close() }
        var descriptor = watch.descriptor
        try require(descriptor >= 0, "watch_open gave descriptor \(descriptor)")
        let directory = try context.storeDirectory()
        let name = context.storeName(directory)
        try context.withStore(directory) {
            try $0.apply([.put(record("a", "1"))], at: Position(epoch: 0, sequence: 0), epoch: 1, commits: [(1, [1])])
        }
        var named: [String?] = []
        var positions: [Position] = []
        let deadline = Date().addingTimeInterval(10)
        while !named.contains(name), Date() < deadline {
            var poller = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            guard descriptor < 0 || poll(&poller, 1, 200) > 0 else { continue }
            descriptor = try watch.changes { changed, position in
                named.append(changed)
                if changed == name, let position { positions.append(position) }
            }
        }
        try require(named.contains(name), "watch_changes named \(named.map { $0 ?? "(any)" }) within 10 s, not \(name)")
        try require(
            positions.allSatisfy { $0 == Position(epoch: 1, sequence: 1) },
            "watch_changes gave the position \(positions) for a commit that left the store at {1, 1}")
    }
}

/// The indexes of the applies that succeeded, from several threads.
private final class Wins: @unchecked Sendable {
    private let lock = NSLock()
    private var indexes: [Int] = []
    func add(_ index: Int) { lock.withLock { indexes.append(index) } }
    var all: [Int] { lock.withLock { indexes } }
}
