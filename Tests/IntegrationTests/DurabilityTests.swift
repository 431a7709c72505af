import Foundation
import TestSupport
import StoreBrokerClient
import Testing
import Wire

extension Integration {
    /// What is acknowledged survives: a graceful restart keeps everything exactly, and `kill -9` loses no
    /// acknowledged write.
    @Suite struct Durability {
        @Test(arguments: ["sqlite", "disk", "wal"])
        func restartKeepsOrderPayloadsTimestampsAndSequence(engine: String) async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory, arguments: ["--engine", engine])
                try await daemon.start()
                _ = try await daemon.storectl(["insert", "s"], stdin: (0..<50).map { "{\"id\":\"\($0)\",\"v\":\($0)}\n" }.joined())
                _ = try await daemon.storectl(["insert", "s", #"{"id":"7","v":"replaced"}"#, #"{"id":"zz","v":"é\n"}"#])
                _ = try await daemon.storectl(["remove", "s", "3", "4"])
                _ = try await daemon.storectl(["insert", "s", #"{"id":"3","v":"back, last"}"#])
                let before = try await daemon.storectl(["query", "s", "--meta"])
                let beforeStores = try await daemon.storectl(["stores"])
                #expect(await daemon.stop() == 0)
                #expect(!FileManager.default.fileExists(atPath: daemon.socketPath))

                try await daemon.start()
                let after = try await daemon.storectl(["query", "s", "--meta"])
                #expect(after.stdout == before.stdout)
                #expect(try await daemon.storectl(["stores"]).stdout == beforeStores.stdout)
                #expect(beforeStores.stdout.contains("\"engine\":\"\(engine)\",") && beforeStores.stdout.contains("\"sequence\":4,"))
                let ids = after.lines.map { (try! JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any])["id"] as! String }
                #expect(ids == ["0", "1", "2"] + (5..<50).map(String.init) + ["zz", "3"])
                // The next write continues the sequence.
                #expect(try await daemon.storectl(["insert", "s", #"{"id":"next"}"#]).stdout == "5\n")
                // A store keeps its engine even when the default changes.
                await daemon.stop()
                let other = Daemon(in: directory, arguments: ["--engine", "memory"])
                try await other.start()
                #expect(try await other.storectl(["count", "s"]).stdout == "51\n")
                #expect(try await other.storectl(["stores"]).stdout.contains("\"engine\":\"\(engine)\""))
                await other.stop()
            }
        }

        /// The 1 KB cases write long enough that the sqlite engine's checkpoint thread is copying the log into
        /// the database, and the wal engine (64 KiB segments) is making snapshots, while the daemon is killed.
        @Test(arguments: [("sqlite", 300, 16), ("disk", 300, 16), ("sqlite", 3000, 1024), ("wal", 3000, 1024)])
        func killDashNineLosesNoAcknowledgedWrite(engine: String, killAfter: Int, payloadBytes: Int) async throws {
            try await withTemporaryDirectory { directory in
                let segments = engine == "wal" ? ["--engine-option", "wal.snapshot_log_bytes=65536"] : []
                let daemon = Daemon(in: directory, arguments: ["--engine", engine] + segments)
                try await daemon.start()
                let pid = daemon.process!.pid
                let acknowledged = try await writeUntilTheDaemonDies(daemon, payloadBytes: payloadBytes) { writer, n in
                    if writer == 0, n == killAfter { kill(pid, SIGKILL) }
                }
                await daemon.process?.wait()
                #expect(acknowledged.count >= killAfter)
                try await daemon.start()
                try await expectEveryAcknowledgedWrite(acknowledged, in: daemon)
                await daemon.stop()
            }
        }

        /// An engine that segfaults inside an apply (the C example wrapped to crash after 200 applies, half the
        /// time after writing the apply, half before) takes the daemon down; restarted, the daemon has every
        /// acknowledged write.
        @Test func anEngineThatSegfaultsInAnApplyLosesNoAcknowledgedWrite() async throws {
            try await withTemporaryDirectory { directory in
                let engines = directory + "/engines"
                try FileManager.default.createDirectory(atPath: engines, withIntermediateDirectories: false)
                let built = try await runCommand(
                    ["/usr/bin/cc", "-std=c11", "-O2", "-shared", "-fPIC", "-I", repositoryRoot + "/Sources/CStorageEngine/include",
                     "-o", engines + "/libstorebroker-engine-crashing.so",
                     repositoryRoot + "/Tests/engines/crashing-engine.c"],
                    in: directory)
                try #require(built == 0)
                let arguments = ["--engine", "crashing", "--engine-path", engines]
                let crashing = Daemon(
                    in: directory, arguments: arguments, launcher: ["/usr/bin/env", "STOREBROKER_TEST_CRASH_AFTER=200"])
                try await crashing.start()
                let acknowledged = try await writeUntilTheDaemonDies(crashing, payloadBytes: 16)
                #expect(await crashing.process?.wait() == 128 + SIGSEGV)
                #expect(acknowledged.count >= 100)
                let restarted = Daemon(in: directory, arguments: arguments)
                try await restarted.start()
                try await expectEveryAcknowledgedWrite(acknowledged, in: restarted)
                await restarted.stop()
            }
        }

        /// Four writers acknowledge single inserts into store `s` until the daemon dies under them;
        /// `afterWrite(writer, n)` runs after each acknowledged write. Returns the acknowledged ids.
        func writeUntilTheDaemonDies(
            _ daemon: Daemon, payloadBytes: Int, afterWrite: @escaping @Sendable (Int, Int) -> Void = { _, _ in }
        ) async throws -> [String] {
            try await withThrowingTaskGroup(of: [String].self) { group in
                for writer in 0..<4 {
                    group.addTask {
                        let connection = try await daemon.connect()
                        var done: [String] = []
                        let padding = String(repeating: "x", count: max(0, payloadBytes - 16))
                        for n in 0..<100_000 {
                            let id = "w\(writer)-\(n)"
                            do {
                                _ = try await connection.send(
                                    .insert(
                                        .init(
                                            store: "s",
                                            items: [Item(id: ItemID(id), payload: Payload("{\"n\":\(n),\"p\":\"\(padding)\"}"))])))
                                done.append(id)
                            } catch {
                                return done
                            }
                            afterWrite(writer, n)
                        }
                        return done
                    }
                }
                var all: [String] = []
                for try await ids in group { all += ids }
                return all
            }
        }

        /// After a restart: every acknowledged id is in store `s`, and its sequence counts the commits that
        /// survived (one per write).
        func expectEveryAcknowledgedWrite(_ acknowledged: [String], in daemon: Daemon) async throws {
            let stored = Set(try await daemon.storectl(["query", "s", "--meta"]).lines.map {
                (try! JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any])["id"] as! String
            })
            let lost = acknowledged.filter { !stored.contains($0) }
            #expect(lost.isEmpty, "acknowledged but lost: \(lost.prefix(10))")
            let info = try await daemon.storectl(["stores"]).stdout
            #expect(info.contains("\"sequence\":\(stored.count),"), "\(info)")
        }
    }
}

extension Integration {
    /// A full disk (a 4 MiB tmpfs): the disk engine recovers without a restart once space returns, and a store is
    /// readable after a restart with the disk still full (issue "Bounded memory whatever clients do", item 9).
    /// Before: writes kept failing ("a committed apply could not be installed") until a restart, and a restart
    /// on the full disk left the store unreadable.
    @Suite struct FullDisk {
        @Test func theDiskEngineRecoversWhenSpaceReturns() async throws {
            try await withTemporaryDirectory { directory in
                let mountPoint = directory + "/small"
                try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: false)
                guard try await runCommand(["/bin/mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mountPoint], in: directory) == 0 else {
                    print("FullDisk: skipped (cannot mount a tmpfs here; needs root)")
                    return
                }
                do {
                    try await fillEmptyAndRestart(directory: directory, mountPoint: mountPoint)
                } catch {
                    _ = try await runCommand(["/bin/umount", "-l", mountPoint], in: directory)
                    throw error
                }
                _ = try await runCommand(["/bin/umount", "-l", mountPoint], in: directory)
            }
        }

        /// A deterministic full disk for the sqlite engine, on any machine: a quota of 40 pages
        /// (`sqlite.max_page_count`). The write that does not fit fails with `storageFull` and changes nothing,
        /// the daemon goes on serving, and writes resume once removals free pages; a restart keeps everything
        /// acknowledged.
        @Test func theSQLiteEngineFailsCleanlyAtItsQuotaAndResumes() async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(
                    in: directory, arguments: ["--engine", "sqlite", "--engine-option", "sqlite.max_page_count=40"])
                try await daemon.start()
                let padding = String(repeating: "x", count: 2_000)
                var acknowledged: [String] = []
                var refused: ProcessResult?
                for index in 0..<200 {
                    let result = try await daemon.storectl(["insert", "quota", #"{"id":"\#(index)","p":"\#(padding)"}"#])
                    if result.status != 0 {
                        refused = result
                        break
                    }
                    acknowledged.append("\(index)")
                }
                let full = try #require(refused, "200 items of 2 KB fit in 40 pages")
                #expect(full.status == 74 && full.stderr.contains("storageFull"), "\(full.stderr)")
                #expect(acknowledged.count > 10)
                // Nothing of the refused write is in memory; the daemon serves reads and the other stores.
                #expect(try await daemon.storectl(["count", "quota"]).stdout == "\(acknowledged.count)\n")
                #expect(try await daemon.storectl(["query", "quota", "--id", "\(acknowledged.count)"]).status == 66)
                #expect(try await daemon.storectl(["insert", "other", #"{"id":"a"}"#]).status == 0)

                // Removing items frees pages: the next write fits.
                let removed = Array(acknowledged.prefix(acknowledged.count / 2))
                #expect(try await daemon.storectl(["remove", "quota"] + removed).status == 0)
                let again = try await daemon.storectl(["insert", "quota", #"{"id":"again","p":"\#(padding)"}"#])
                #expect(again.status == 0, "\(again.stderr)")
                let kept = Array(acknowledged.dropFirst(removed.count)) + ["again"]

                await daemon.stop()
                try await daemon.start()
                let ids = try await daemon.storectl(["query", "quota"]).lines.map {
                    (try! JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any])["id"] as! String
                }
                #expect(ids == kept)
                await daemon.stop()
            }
        }

        func fillEmptyAndRestart(directory: String, mountPoint: String) async throws {
            do {
                // Ballast to delete later: room coming back.
                let ballast = [mountPoint + "/ballast-1", mountPoint + "/ballast-2"]
                for path in ballast {
                    try Data(count: 600_000).write(to: URL(fileURLWithPath: path))
                }
                let daemon = Daemon(in: directory, dataDirectory: mountPoint + "/data", arguments: ["--engine", "disk"])
                try await daemon.start()
                /// Inserts one item at a time until the disk is full, then smaller ones until even those fail, so
                /// that some write finds room for its journal but not for its item file; returns how many were
                /// acknowledged.
                func fill(from start: Int) async throws -> Int {
                    var acknowledged = 0
                    var index = start
                    for size in [40_000, 20_000, 10_000, 5_000, 2_500, 1_200] {
                        let payload = String(repeating: "x", count: size)
                        for _ in 0..<100 {
                            index += 1
                            let result = try await daemon.storectl(["insert", "big", #"{"id":"\#(index)","p":"\#(payload)"}"#])
                            if result.status != 0 {
                                #expect(result.status == 74, "\(result.stderr)")
                                break
                            }
                            acknowledged += 1
                        }
                    }
                    return acknowledged
                }
                var acknowledged = try await fill(from: 0)
                #expect(try await daemon.storectl(["count", "big"]).stdout == "\(acknowledged)\n")

                // Room again: the very next write works, without a restart.
                try FileManager.default.removeItem(atPath: ballast[0])
                var result = try await daemon.storectl(["insert", "big", #"{"id":"after-room","p":"small"}"#])
                #expect(result.status == 0, "\(result.stderr)")
                acknowledged += 1
                acknowledged += try await fill(from: 1000)

                // Restarted with the disk still full: every acknowledged item is readable.
                await daemon.stop()
                try await daemon.start()
                result = try await daemon.storectl(["count", "big"])
                #expect(result.stdout == "\(acknowledged)\n", "\(result.stderr)")
                result = try await daemon.storectl(["query", "big", "--id", "after-room"])
                #expect(result.stdout == #"{"id":"after-room","p":"small"}"# + "\n", "\(result.stderr)")
                #expect(try await daemon.storectl(["query", "big"]).lines.count == acknowledged)
                try FileManager.default.removeItem(atPath: ballast[1])
                #expect(try await daemon.storectl(["insert", "big", #"{"id":"last","p":"small"}"#]).status == 0)
                await daemon.stop()
                try await daemon.start()
                #expect(try await daemon.storectl(["count", "big"]).stdout == "\(acknowledged + 1)\n")
                await daemon.stop()
            }
        }
    }
}
