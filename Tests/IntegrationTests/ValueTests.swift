import Foundation
import TestSupport
import Testing

extension Integration {
    /// Values and secure values through storectl and the real daemon, across restarts.
    @Suite struct Values {
        @Test func valuesSetGetResetWatchAndSurviveRestarts() async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory)
                try await daemon.start()
                var result = try await daemon.storectl(["value", "get", "theme"])
                #expect(result.status == 66 && result.stderr.contains("not set"))
                let watcher = try await daemon.watch("unused")  // keep the daemon busy with a store watcher too
                let valueWatch = try ChildProcess(
                    [binDirectory + "/storectl", "--socket", daemon.socketPath, "value", "watch", "theme"],
                    stdoutPath: directory + "/vw.out", stderrPath: directory + "/vw.err", in: directory)
                let valueWatcher = Watcher(valueWatch)
                #expect(await eventually { !valueWatcher.lines.isEmpty })

                #expect(try await daemon.storectl(["value", "set", "theme", #"{"dark": true}"#]).stdout == "1\n")
                #expect(try await daemon.storectl(["value", "set", "theme", #"{"dark": true}"#]).stdout == "")  // unchanged
                result = try await daemon.storectl(["value", "set", "theme", "--expect-unset", "{}"])
                #expect(result.status == 75 && result.stderr.contains("conflict"))
                result = try await daemon.storectl(["value", "set", "theme", "--expect", "7", "{}"])
                #expect(result.status == 75)
                #expect(try await daemon.storectl(["value", "set", "theme", "--expect", "1", #"{"dark":false}"#]).stdout == "2\n")
                #expect(try await daemon.storectl(["value", "get", "theme"]).stdout == "{\"dark\":false}\n")
                #expect(try await daemon.storectl(["value", "reset", "theme"]).stdout == "3\n")
                #expect(try await daemon.storectl(["value", "reset", "theme"]).stdout == "")
                #expect(try await daemon.storectl(["value", "set", "theme", "--expect-unset", "1"]).stdout == "4\n")
                result = try await daemon.storectl(["value", "set", "theme", "not json"])
                #expect(result.status == 65)
                result = try await daemon.storectl(["value", "set", "bad/name", "1"])
                #expect(result.status == 65)
                #expect(await valueWatcher.waitFor(sequence: 4))
                await valueWatcher.stop()
                await watcher.stop()
                #expect(
                    valueWatcher.lines == [
                        #"{"op":"loaded","name":"theme","epoch":0,"sequence":0,"value":null}"#,
                        #"{"op":"set","name":"theme","sequence":1,"value":{"dark": true}}"#,
                        #"{"op":"set","name":"theme","sequence":2,"value":{"dark":false}}"#,
                        #"{"op":"reset","name":"theme","sequence":3}"#,
                        #"{"op":"set","name":"theme","sequence":4,"value":1}"#,
                    ])

                // A restart keeps the value and its sequence, which keeps counting.
                #expect(await daemon.stop() == 0)
                try await daemon.start()
                #expect(try await daemon.storectl(["value", "get", "theme"]).stdout == "1\n")
                #expect(try await daemon.storectl(["value", "reset", "theme"]).stdout == "5\n")
                #expect(try await daemon.storectl(["value", "set", "theme", "--expect", "5", "2"]).stdout == "6\n")
                // Values are not stores.
                #expect(try await daemon.storectl(["stores"]).stdout == "")
                await daemon.stop()
            }
        }

        @Test func aPlantedSecretIsNeverInTheDataDirectoryTheLogsOrAWatch() async throws {
            let secret = "planted-\(UUID().uuidString)-secret"
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory, arguments: ["--log-level", "trace"])
                try await daemon.start()
                let watch = try ChildProcess(
                    [binDirectory + "/storectl", "--socket", daemon.socketPath, "secret", "watch", "token"],
                    stdoutPath: directory + "/sw.out", stderrPath: directory + "/sw.err", in: directory)
                let watcher = Watcher(watch)
                #expect(await eventually { !watcher.lines.isEmpty })
                #expect(try await daemon.storectl(["secret", "set", "token", secret]).stdout == "1\n")
                #expect(try await daemon.storectl(["secret", "get", "token"]).stdout == secret + "\n")
                #expect(try await daemon.storectl(["secret", "set", "token", "--expect", "1", secret + "2"]).stdout == "2\n")
                #expect(await watcher.waitFor(sequence: 2))
                // The key file: created, 32 bytes, mode 0600.
                let key = daemon.dataDirectory + "/secure-values.key"
                var info = stat()
                #expect(lstat(key, &info) == 0 && info.st_mode & 0o777 == 0o600 && info.st_size == 32)
                #expect(await daemon.stop() == 0)
                try await daemon.start()
                #expect(try await daemon.storectl(["secret", "get", "token"]).stdout == secret + "2\n")
                #expect(await daemon.stop() == 0)
                await watcher.stop()

                #expect(
                    watcher.lines == [
                        #"{"op":"loaded","name":"token","epoch":0,"sequence":0,"set":false}"#,
                        #"{"op":"set","name":"token","sequence":1}"#, #"{"op":"set","name":"token","sequence":2}"#,
                    ])
                // Grep every file the daemon wrote (data, WAL, logs) and every output for the secret's bytes.
                let enumerator = FileManager.default.enumerator(atPath: directory)!
                var files = 0
                while let relative = enumerator.nextObject() as? String {
                    let path = directory + "/" + relative
                    guard let data = FileManager.default.contents(atPath: path) else { continue }
                    files += 1
                    #expect(data.range(of: Data("planted-".utf8)) == nil, "the secret is in \(relative)")
                }
                #expect(files > 5)
            }
        }

        @Test func aKeyFileWithTheWrongModeOrOwnerStopsStartUpAndAWrongKeyFailsLoudly() async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory)
                try await daemon.start()
                _ = try await daemon.storectl(["secret", "set", "token", "s3cr3t"])
                await daemon.stop()
                let key = daemon.dataDirectory + "/secure-values.key"

                chmod(key, 0o644)
                var refused = try ChildProcess(daemon.arguments, stdoutPath: directory + "/a.log", stderrPath: directory + "/a.log", in: directory)
                #expect(await refused.wait(atMost: 30) == 1)
                #expect(refused.stderr.contains("mode 0644"))
                chmod(key, 0o600)
                if getuid() == 0 {
                    chown(key, 65534, 65534)
                    refused = try ChildProcess(daemon.arguments, stdoutPath: directory + "/b.log", stderrPath: directory + "/b.log", in: directory)
                    #expect(await refused.wait(atMost: 30) == 1)
                    #expect(refused.stderr.contains("belongs to uid 65534"))
                    chown(key, 0, 0)
                }
                // Another key: the secret cannot be decrypted, and that is an error, never an empty value.
                try Data((0..<32).map { UInt8($0) }).write(to: URL(fileURLWithPath: key))
                chmod(key, 0o600)
                try await daemon.start()
                let result = try await daemon.storectl(["secret", "get", "token"])
                #expect(result.status == 74)
                #expect(result.stderr.contains("cannot decrypt"))
                await daemon.stop()
            }
        }
    }
}
