import Foundation
import StoreBrokerClient
import Testing
import Wire

extension Integration {
    /// What is acknowledged survives: a graceful restart keeps everything exactly, and `kill -9` loses no
    /// acknowledged write.
    @Suite struct Durability {
        @Test(arguments: ["sqlite", "disk"])
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

        @Test(arguments: ["sqlite", "disk"])
        func killDashNineLosesNoAcknowledgedWrite(engine: String) async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory, arguments: ["--engine", engine])
                try await daemon.start()
                let pid = daemon.process!.pid
                // Writers acknowledge ids until the daemon dies under them.
                let acknowledged = try await withThrowingTaskGroup(of: [String].self) { group in
                    for writer in 0..<4 {
                        group.addTask {
                            let connection = try await daemon.connect()
                            var done: [String] = []
                            for n in 0..<100_000 {
                                let id = "w\(writer)-\(n)"
                                do {
                                    _ = try await connection.send(
                                        .insert(.init(store: "s", items: [Item(id: ItemID(id), payload: Payload("{\"n\":\(n)}"))])))
                                    done.append(id)
                                } catch {
                                    return done
                                }
                                if writer == 0, n == 300 { kill(pid, SIGKILL) }
                            }
                            return done
                        }
                    }
                    var all: [String] = []
                    for try await ids in group { all += ids }
                    return all
                }
                await daemon.process?.wait()
                #expect(acknowledged.count >= 300)
                try await daemon.start()
                let stored = Set(try await daemon.storectl(["query", "s", "--meta"]).lines.map {
                    (try! JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any])["id"] as! String
                })
                let lost = acknowledged.filter { !stored.contains($0) }
                #expect(lost.isEmpty, "acknowledged but lost: \(lost.prefix(10))")
                // The sequence counts every commit that survived.
                let info = try await daemon.storectl(["stores"]).stdout
                #expect(info.contains("\"sequence\":\(stored.count),"))
                await daemon.stop()
            }
        }
    }
}
