import Foundation
import NIOCore
import StoreBrokerClient
import TestSupport
import Testing

extension Integration {
    /// Two brokers on one private PostgreSQL server (the postgres engine, docs/DISTRIBUTED.md): each with its own
    /// socket, data directory and (where D-Bus is tested) private bus. Not skipped without PostgreSQL: the
    /// README's test command installs it, and a missing server fails these tests with what to install.
    @Suite struct Distributed {
        static func arguments(_ server: PrivatePostgres, _ more: [String] = []) -> [String] {
            ["--engine", "postgres", "--engine-option", "postgres.conninfo=\(server.conninfo)"] + more
        }

        /// Brokers A and B on one new server, stopped afterwards. `prepare` gets each broker's directory before
        /// it starts (its data directory will be DIRECTORY/data).
        func withTwoBrokers(
            arguments: (String) -> [String] = { _ in [] }, dbus: Bool = false, prepare: (String) throws -> Void = { _ in },
            _ body: (PrivatePostgres, Daemon, Daemon) async throws -> Void
        ) async throws {
            try await withPrivatePostgres { server in
                try await withTemporaryDirectory(prefix: "sb-two") { directory in
                    var brokers: [Daemon] = []
                    for name in ["a", "b"] {
                        try FileManager.default.createDirectory(atPath: directory + "/" + name, withIntermediateDirectories: false)
                        try prepare(directory + "/" + name)
                        brokers.append(
                            Daemon(
                                in: directory + "/" + name, arguments: Self.arguments(server, arguments(directory + "/" + name)),
                                dbus: dbus))
                    }
                    do {
                        for broker in brokers { try await broker.start() }
                        try await body(server, brokers[0], brokers[1])
                    } catch {
                        for broker in brokers { await broker.stop() }
                        throw error
                    }
                    for broker in brokers { await broker.stop() }
                }
            }
        }

        /// The insert events a watcher printed, as printed.
        static func events(_ watcher: Watcher) -> [String] {
            watcher.lines.filter { $0.contains(#""op":"insert""#) || $0.contains(#""op":"remove""#) }
        }

        @Test func writesThroughBothBrokersReachWatchersOnBothInTheSameOrder() async throws {
            try await withTwoBrokers { _, a, b in
                let watchers = [try await a.watch("notes"), try await b.watch("notes")]
                let clients = [try await a.connect(), try await b.connect()]
                // 4 writers on each broker, 25 inserts each, all at once: the brokers' commits interleave.
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for (side, client) in clients.enumerated() {
                        for writer in 0..<4 {
                            group.addTask {
                                for index in 0..<25 {
                                    _ = try await client.write(
                                        "notes", .insert([Item(id: ItemID("\(side)-\(writer)-\(index)"), payload: Payload("{\"n\":\(index)}"))]))
                                }
                            }
                        }
                    }
                    try await group.waitForAll()
                }
                for watcher in watchers { #expect(await watcher.waitFor(sequence: 200), "\(watcher.lines.suffix(3))") }
                let seen = watchers.map(Self.events)
                #expect(seen[0].count == 200)
                #expect(seen[0] == seen[1], "both watchers print the same events, in the same order")
                let sequences = watchers[1].objects.compactMap { $0["op"] as? String == "insert" ? $0["sequence"] as? Int : nil }
                #expect(sequences == Array(1...200), "gap-free")
                let counts = [try await a.storectl(["count", "notes"]).stdout, try await b.storectl(["count", "notes"]).stdout]
                #expect(counts == ["200\n", "200\n"])
                for client in clients { await client.close() }
                for watcher in watchers { await watcher.stop() }
            }
        }

        /// A store another broker created is listed and served by one that never saw it, with the same epoch;
        /// a drop through either ends it on both.
        @Test func aStoreCreatedElsewhereIsListedAndServed() async throws {
            try await withTwoBrokers { _, a, b in
                _ = try await a.storectl(["insert", "elsewhere", #"{"id":"x","n":1}"#])
                let listedOnA = try await a.storectl(["stores"]).stdout
                let listed = try await b.storectl(["stores"]).stdout
                #expect(listed == listedOnA && listed.contains(#""name":"elsewhere""#) && listed.contains(#""engine":"postgres""#), "\(listed)")
                #expect(try await b.storectl(["query", "elsewhere"]).stdout == "{\"id\":\"x\",\"n\":1}\n")
                _ = try await b.storectl(["drop", "elsewhere"])
                #expect(await eventually { (try? await a.storectl(["stores"]).stdout) == "" })
                #expect(try await a.storectl(["count", "elsewhere"]).stdout == "0\n")
            }
        }

        /// Compare-and-set from both brokers at once on one value: every increment that was acknowledged counts
        /// once, none is lost or doubled.
        @Test func compareAndSetFromBothBrokersCountsExactly() async throws {
            try await withTwoBrokers { _, a, b in
                let clients = [try await a.connect(), try await b.connect()]
                let total = 1_000
                let workers = 4  // per broker
                let share = total / (2 * workers)
                try await withThrowingTaskGroup(of: Int.self) { group in
                    for client in clients {
                        for _ in 0..<workers {
                            group.addTask {
                                var conflicts = 0
                                var done = 0
                                while done < share {
                                    let current = try await client.value("counter")
                                    var count = 0
                                    if case .set(let payload) = current.value { count = Int(String(buffer: payload.bytes)) ?? -1_000_000 }
                                    do {
                                        _ = try await client.setValue(
                                            "counter", to: Payload("\(count + 1)"), condition: .sequence(current.position.sequence))
                                        done += 1
                                    } catch let error as StoreBrokerError where error.code == .conflict {
                                        conflicts += 1
                                    }
                                }
                                return conflicts
                            }
                        }
                    }
                    var conflicts = 0
                    for try await lost in group { conflicts += lost }
                    print("compare-and-set: \(total) increments, \(conflicts) conflicts retried")
                }
                // B ends where A does once it has caught up (its watcher's notice may trail the last commit).
                for broker in [a, b] {
                    let reached = await eventually { (try? await broker.storectl(["value", "get", "counter"]).stdout) == "\(total)\n" }
                    let final = try await broker.storectl(["value", "get", "counter"]).stdout
                    #expect(reached, "the counter ends at \(final)")
                }
                for client in clients { await client.close() }
            }
        }

        /// Secure values are shared by brokers given the same key (docs/DISTRIBUTED.md): one sets, the other
        /// reads; the database holds only the ciphertext.
        @Test func secureValuesAreSharedByBrokersWithTheSameKey() async throws {
            var generator = SystemRandomNumberGenerator()
            let key = Data((0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) })
            try await withTwoBrokers(prepare: { directory in
                try FileManager.default.createDirectory(
                    atPath: directory + "/data", withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
                FileManager.default.createFile(
                    atPath: directory + "/data/secure-values.key", contents: key, attributes: [.posixPermissions: 0o600])
            }) { server, a, b in
                #expect(try await a.storectl(["secret", "set", "token"], stdin: "planted-secret\n").status == 0)
                #expect(await eventually { (try? await b.storectl(["secret", "get", "token"]).stdout) == "planted-secret\n" })
                let stored = try await server.query(
                    "SELECT count(*), bool_or(position(convert_to('planted-secret', 'UTF8') in payload) > 0) FROM storebroker.items WHERE store = '#secure-values'")
                #expect(stored == "1|f", "the database's record of the secret: \(stored)")
            }
        }

        /// A broker killed (SIGKILL) during writes loses nothing it acknowledged: the other broker has every
        /// acknowledged write, and so does the killed one once restarted.
        @Test func aBrokerKilledDuringWritesLosesNothingAcknowledged() async throws {
            try await withTwoBrokers { _, a, b in
                let client = try await a.connect()
                let acknowledged = Acknowledged()
                let writer = Task {
                    for index in 0..<100_000 {
                        do {
                            _ = try await client.write("orders", .insert([Item(id: ItemID("o\(index)"), payload: Payload("{}"))]))
                        } catch {
                            return
                        }
                        acknowledged.set(index + 1)
                    }
                }
                #expect(await eventually { acknowledged.value >= 50 })
                await a.crash()
                _ = await writer.value
                let written = acknowledged.value
                // Every acknowledged insert is there, in order, through B; at most the one in flight besides.
                #expect(await eventually { Int((try? await b.storectl(["count", "orders"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)) ?? "") ?? 0 >= written })
                let ids = try await b.storectl(["query", "orders", "--meta"]).lines.compactMap {
                    (try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])?["id"] as? String
                }
                #expect(Array(ids.prefix(written)) == (0..<written).map { "o\($0)" })
                #expect(ids.count <= written + 1)
                try await a.start()
                #expect(try await a.storectl(["count", "orders"]).stdout == "\(ids.count)\n")
            }
        }

        /// While PostgreSQL is down, writes fail with a clear error (exit 74, the engine's message) and reads are
        /// answered from memory; once it is back, both brokers write again and B's watcher sees A's commits,
        /// with no restart of either.
        @Test func brokersGiveClearErrorsWhilePostgresIsDownAndRecoverByThemselves() async throws {
            try await withTwoBrokers { server, a, b in
                #expect(try await a.storectl(["insert", "notes", #"{"id":"before"}"#]).status == 0)
                let watcher = try await b.watch("notes")
                #expect(await watcher.waitFor(sequence: 1))
                await server.stop()
                let failed = try await a.storectl(["insert", "notes", #"{"id":"during"}"#])
                #expect(failed.status == 74, "\(failed.stderr)")
                #expect(failed.stderr.contains("PostgreSQL"), "\(failed.stderr)")
                #expect(!failed.stderr.contains("conninfo") && !failed.stderr.contains("user=postgres"), "the connection string is never shown")
                #expect(try await b.storectl(["count", "notes"]).stdout == "1\n", "reads are served from memory")
                try await server.start()
                // The first write after the restart finds a connection the restart cut, before anything was sent
                // to commit: the engine makes a new one and goes on.
                let afterA = try await a.storectl(["insert", "notes", #"{"id":"after-a"}"#])
                #expect(afterA.stdout == "2\n", "\(afterA.stderr)")
                let afterB = try await b.storectl(["insert", "notes", #"{"id":"after-b"}"#])
                #expect(afterB.stdout == "3\n", "\(afterB.stderr)")
                #expect(
                    await watcher.waitFor(sequence: 3),
                    "B's watcher follows A's commits again: \(watcher.lines)\nA: \(a.log.suffix(3000))\nB: \(b.log.suffix(3000))")
                #expect(!(a.log + b.log).contains("user=postgres"), "no log line shows the connection string")
                await watcher.stop()
            }
        }

        /// A broker that fell further behind than the commit log keeps (`postgres.log_commits`) reloads the store:
        /// its watchers get `history-gone` and the store as it is now, and it goes on following.
        @Test func aBrokerBehindTheCommitLogReloadsAndSaysHistoryGone() async throws {
            try await withTwoBrokers(arguments: { _ in ["--engine-option", "postgres.log_commits=3"] }) { _, a, b in
                #expect(try await a.storectl(["insert", "notes", #"{"id":"0"}"#]).status == 0)
                let watcher = try await b.watch("notes")
                #expect(await watcher.waitFor(sequence: 1))
                // B stops taking notices (SIGSTOP) while A commits past the log's window.
                let paused = try #require(b.process)
                paused.signal(SIGSTOP)
                for index in 1...10 { _ = try await a.storectl(["insert", "notes", "{\"id\":\"\(index)\"}"]) }
                paused.signal(SIGCONT)
                #expect(await eventually { watcher.objects.contains { $0["op"] as? String == "history-gone" } }, "\(watcher.lines)")
                #expect(await watcher.waitFor(sequence: 11))
                let reloaded = watcher.objects.last { $0["op"] as? String == "loaded" }
                #expect(reloaded?["sequence"] as? Int == 11 && reloaded?["count"] as? Int == 11, "\(watcher.lines)")
                #expect(try await a.storectl(["insert", "notes", #"{"id":"12"}"#]).stdout == "12\n")
                #expect(await watcher.waitFor(sequence: 12), "followed after the reload: \(watcher.lines)")
                #expect(try await b.storectl(["count", "notes"]).stdout == "12\n")
                await watcher.stop()
            }
        }

        /// A database restored from a backup holds fewer commits than a broker: the broker converges on the
        /// database (its watchers get `history-gone` and the database's state), and writes go on from there.
        @Test func aBrokerAheadOfARestoredDatabaseReloadsFromIt() async throws {
            try await withTwoBrokers { server, a, _ in
                for id in 1...3 { _ = try await a.storectl(["insert", "notes", "{\"id\":\"\(id)\"}"]) }
                let watcher = try await a.watch("notes")
                // The database as a backup taken after the first commit left it.
                _ = try await server.query(
                    """
                    BEGIN;
                    DELETE FROM storebroker.items WHERE store = 'notes' AND key <> convert_to('1', 'UTF8');
                    DELETE FROM storebroker.commits WHERE store = 'notes' AND sequence > 1;
                    UPDATE storebroker.stores SET sequence = 1 WHERE name = 'notes';
                    COMMIT;
                    """)
                let written = try await a.storectl(["insert", "notes", #"{"id":"4"}"#])
                #expect(written.stdout == "2\n", "\(written.stderr)")
                #expect(await watcher.waitFor(sequence: 2))
                #expect(watcher.objects.contains { $0["op"] as? String == "history-gone" }, "\(watcher.lines)")
                #expect(try await a.storectl(["query", "notes"]).stdout == "{\"id\":\"1\"}\n{\"id\":\"4\"}\n")
                await watcher.stop()
            }
        }

        /// A broker started while the database is down starts all the same, refuses writes with a clear error,
        /// and serves and follows the shared stores once the database is back, with no restart.
        @Test func aBrokerStartedWhilePostgresIsDownServesOnceItIsBack() async throws {
            try await withTwoBrokers { server, a, b in
                #expect(try await a.storectl(["insert", "notes", #"{"id":"1"}"#]).stdout == "1\n")
                await b.stop()
                await server.stop()
                try await b.start()
                let refused = try await b.storectl(["insert", "notes", #"{"id":"2"}"#])
                #expect(refused.status == 74 && refused.stderr.contains("PostgreSQL"), "\(refused.stderr)")
                try await server.start()
                let watcher = try await b.watch("notes")
                #expect(await watcher.waitFor(sequence: 1), "\(watcher.lines)")
                #expect(try await a.storectl(["insert", "notes", #"{"id":"3"}"#]).stdout == "2\n")
                #expect(await watcher.waitFor(sequence: 2), "B follows A once its watch is open: \(watcher.lines)\n\(b.log.suffix(2000))")
                await watcher.stop()
            }
        }

        /// A commit through A is a D-Bus signal on B's bus, and a drop through A ends B's store too.
        @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/dbus-daemon")))
        func commitsThroughOneBrokerAreSignalsOnTheOthersBus() async throws {
            try await withTemporaryDirectory(prefix: "sb-bus") { busDirectory in
                let bus = PrivateBus(in: busDirectory)
                try await bus.start()
                defer { Task { await bus.stop() } }
                try await withTwoBrokers(arguments: { $0.hasSuffix("/b") ? ["--dbus-address", bus.stableAddress] : ["--no-dbus"] }, dbus: true) {
                    _, a, b in
                    #expect(try await bus.waitForOwner("org.storebroker.StoreBroker1"))
                    let monitor = try await Monitor(bus: bus)
                    let watcher = try await b.watch("notes")
                    _ = try await a.storectl(["insert", "notes", #"{"id":"x"}"#, #"{"id":"y"}"#])
                    _ = try await a.storectl(["remove", "notes", "x"])
                    // A store B has never loaded: B takes it in from its first commit, so its bus hears each one.
                    for id in ["o1", "o2"] { _ = try await a.storectl(["insert", "other", "{\"id\":\"\(id)\"}"]) }
                    _ = try await a.storectl(["drop", "notes"])
                    #expect(await monitor.waitFor { $0.member == "StoreEvent" && $0.sequence == 0 })
                    #expect(await monitor.waitFor { $0.name == "other" && $0.sequence == 2 })
                    await monitor.stop()
                    // Merged as the broker may merge a burst: remove x @2 then the drop's remove y @0.
                    #expect(merged(monitor.signals.filter { $0.name == "notes" }) == ["notes insert x,y @1", "notes remove x,y @0"])
                    #expect(merged(monitor.signals.filter { $0.name == "other" }) == ["other insert o1,o2 @2"], "\(monitor.signals)")
                    #expect(await eventually { watcher.objects.contains { $0["op"] as? String == "dropped" } }, "\(watcher.lines)")
                    let stores = try await b.storectl(["stores"]).stdout
                    #expect(!stores.contains("\"notes\"") && stores.contains("\"other\""), "\(stores)")
                    await watcher.stop()
                }
                await bus.stop()
            }
        }
    }
}

/// The last write a test's writer saw acknowledged.
private final class Acknowledged: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    var value: Int { lock.withLock { count } }
    func set(_ value: Int) { lock.withLock { count = value } }
}
