import BrokerCore
import EngineConformance
import EngineLoader
import StoreModel
import Testing
import TestSupport

/// Every engine we ship, and the C example, loaded through the loader exactly as the daemon loads them.
let allEngines = ["memory", "sqlite", "disk", "wal", "c-example"]
/// The engines that declare `persistent`; `persistenceIsDeclaredHonestly` checks this list against the engines.
let persistentEngines = ["sqlite", "disk", "wal", "c-example"]

/// Each property of the conformance suite (Sources/EngineConformance, what storebroker-engine-check runs) against
/// each shipped engine, in process; the kill rounds spawn the checker built beside the tests.
@Suite struct EngineConformanceTests {
    static let cases: [(String, String)] = allEngines.flatMap { engine in Conformance.properties.map { (engine, $0.name) } }
    static let setup = Setup(checker: binDirectory + "/storebroker-engine-check", rounds: 2, bigApply: 20_000)

    @Test(arguments: cases)
    func property(engine name: String, property: String) async throws {
        let engine = try sharedLoader.load(name)
        let checked = try #require(Conformance.properties.first { $0.name == property })
        // The engine's calls are synchronous (fsyncs, an apply of 20,000 items): off the cooperative pool.
        let outcome = await offThePool { await Conformance.check(checked, engine, setup: Self.setup) }
        if case .failed(let message) = outcome { Issue.record("\(name) \(property): \(message)") }
    }

    /// The wal engine again with 4 KiB segments and FULL: every property holds while segments close and
    /// snapshots are made behind the applies.
    @Test(arguments: Conformance.properties.map(\.name))
    func walWithASnapshotEveryFewKilobytes(property: String) async throws {
        let engine = try sharedLoader.load("wal")
        let checked = try #require(Conformance.properties.first { $0.name == property })
        var setup = Self.setup
        setup.options = ["snapshot_log_bytes": "4096", "synchronous": "FULL"]
        let outcome = await offThePool { [setup] in await Conformance.check(checked, engine, setup: setup) }
        if case .failed(let message) = outcome { Issue.record("wal \(property): \(message)") }
    }

    @Test(arguments: allEngines)
    func everyShippedEngineIsAtomic(name: String) throws {
        let engine = try sharedLoader.load(name)
        #expect(engine.capabilities.contains(.atomic))
        #expect(engine.abiMajor == LoadedEngine.hostABI.major)
        #expect(throws: EngineLoadError.self) { try engine.validate(options: ["no_such_option": "1"]) }
    }

    @Test func persistenceIsDeclaredHonestly() throws {
        for name in allEngines {
            #expect(try sharedLoader.load(name).capabilities.contains(.persistent) == persistentEngines.contains(name), "\(name)")
        }
    }
}

/// The postgres engine against a private PostgreSQL server: every property of the conformance suite, with the
/// store named by its directory (the engine keeps stores in the database by name).
@Suite struct PostgresEngineConformanceTests {
    @Test func everyPropertyHolds() async throws {
        let engine = try sharedLoader.load("postgres")
        #expect(engine.capabilities.isSuperset(of: [.persistent, .atomic, .shared]))
        try await withPrivatePostgres { server in
            let setup = Setup(
                options: ["conninfo": server.conninfo], checker: binDirectory + "/storebroker-engine-check", rounds: 2,
                bigApply: 20_000)
            for property in Conformance.properties {
                let outcome = await offThePool { await Conformance.check(property, engine, setup: setup) }
                if case .failed(let message) = outcome { Issue.record("postgres \(property.name): \(message)") }
            }
        }
    }
}

/// The postgres engine's commit log: read in one statement for a few commits, through a cursor beyond; its
/// window (`log_commits`), past which commits_since fails with `gone`.
@Suite struct PostgresCommitLogTests {
    @Test func manyCommitsAreReadWholeAndInOrder() async throws {
        let engine = try sharedLoader.load("postgres")
        try await withPrivatePostgres { server in
            try await withTemporaryDirectory { directory in
                let store = try engine.open(directory: directory, store: "long", options: ["conninfo": server.conninfo]) as! LoadedStore
                defer { store.close() }
                // 200 commits in 20 applies of 10: past the 64 one statement reads.
                for apply in UInt64(0)..<20 {
                    let commits = (1...10).map { (apply * 10 + UInt64($0), Array("record \(apply * 10 + UInt64($0))".utf8)) }
                    try store.apply(
                        [.put(record("k\(apply)", "v"))], at: Position(epoch: apply == 0 ? 0 : 4, sequence: apply * 10), epoch: 4,
                        commits: commits)
                }
                for after in [UInt64(0), 63, 64, 150, 199, 200] {
                    var seen: [(UInt64, [UInt8])] = []
                    let position = try store.commits(epoch: 4, after: after) { seen.append(($0, Array($1))) }
                    #expect(position == Position(epoch: 4, sequence: 200))
                    #expect(seen.map(\.0) == Array((after + 1)..<201), "after \(after)")
                    #expect(seen.allSatisfy { $0.1 == Array("record \($0.0)".utf8) }, "after \(after)")
                }
            }
        }
    }

    @Test func commitsBeyondTheWindowAreGone() async throws {
        let engine = try sharedLoader.load("postgres")
        try await withPrivatePostgres { server in
            try await withTemporaryDirectory { directory in
                let options = ["conninfo": server.conninfo, "log_commits": "2"]
                let store = try engine.open(directory: directory, store: "windowed", options: options) as! LoadedStore
                defer { store.close() }
                for sequence in UInt64(1)...5 {
                    try store.apply(
                        [.put(record("k\(sequence)", "v"))], at: Position(epoch: sequence == 1 ? 0 : 9, sequence: sequence - 1),
                        epoch: 9, commits: [(sequence, [UInt8(sequence)])])
                }
                var seen: [UInt64] = []
                let position = try store.commits(epoch: 9, after: 3) { sequence, _ in seen.append(sequence) }
                #expect(seen == [4, 5] && position == Position(epoch: 9, sequence: 5))
                for after in [UInt64(0), 2] {
                    let error = #expect(throws: EngineFailure.self) { try store.commits(epoch: 9, after: after) { _, _ in } }
                    #expect(error?.code == .gone, "after \(after): \(String(describing: error))")
                }
            }
        }
    }
}
