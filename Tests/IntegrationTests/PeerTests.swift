import Foundation
import TestSupport
import Testing

/// Runs Tests/python/peer_client.py as user `nobody` (setpriv), speaking the protocol to `socket`.
private func asNobody(_ socket: String, _ arguments: [String], in directory: String) async throws -> String {
    let script = try String(
        contentsOfFile: repositoryRoot + "/Tests/python/peer_client.py", encoding: .utf8)
    let child = try ChildProcess(
        ["/usr/bin/setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c", script, socket]
            + arguments, stdoutPath: directory + "/nobody.out", stderrPath: directory + "/nobody.err", in: directory)
    _ = await child.wait(atMost: 30)
    return child.stdout.trimmingCharacters(in: .whitespacesAndNewlines) + child.stderr
}


private let canSwitchUser = getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv")

extension Integration {
    /// `--allow-uid`: other users, decided by SO_PEERCRED, with the modes PRODUCT.md gives.
    @Suite(.enabled(if: canSwitchUser, "needs root and setpriv to run a client as another user")) struct Peers {
        /// A daemon whose socket sits in a directory it creates itself, inside a directory the test opened to
        /// everyone for traversal only.
        private func withSharedDaemon(_ rules: [String], _ body: (Daemon) async throws -> Void) async throws {
            try await withTemporaryDirectory { directory in
                chmod(directory, 0o711)
                let daemon = Daemon(
                    in: directory, socketPath: directory + "/run/s.sock", arguments: rules.flatMap { ["--allow-uid", $0] })
                try await daemon.start()
                do {
                    try await body(daemon)
                } catch {
                    await daemon.stop()
                    throw error
                }
                await daemon.stop()
            }
        }

        @Test func allowedUsersReachTheirStoresButNeverSecureValues() async throws {
            try await withSharedDaemon(["nobody"]) { daemon in
                var info = stat()
                lstat(daemon.directory + "/run", &info)
                #expect(info.st_mode & 0o777 == 0o711)
                lstat(daemon.socketPath, &info)
                #expect(info.st_mode & 0o777 == 0o666)
                _ = try await daemon.storectl(["secret", "set", "token", "s3cr3t"])

                let socket = daemon.socketPath
                #expect(try await asNobody(socket, ["insert", "shared", "a", "{}"], in: daemon.directory) == "ok writeResult committed=1 sequence=1")
                #expect(try await asNobody(socket, ["count", "shared"], in: daemon.directory) == "ok countResult 1")
                #expect(try await asNobody(socket, ["set-value", "1", "theme", "1"], in: daemon.directory) == "ok writeResult committed=1 sequence=1")
                let secret = try await asNobody(socket, ["get-value", "2", "token"], in: daemon.directory)
                #expect(secret.hasPrefix("error 0x0107 secure values are only for the daemon's own user"), "\(secret)")
                let write = try await asNobody(socket, ["set-value", "2", "token", "\"x\""], in: daemon.directory)
                #expect(write.hasPrefix("error 0x0107"), "\(write)")
                // Nor their names.
                let names = try await asNobody(socket, ["list-values", "2"], in: daemon.directory)
                #expect(names.hasPrefix("error 0x0107 secure values are only for the daemon's own user"), "\(names)")
                #expect(try await daemon.storectl(["secret", "get", "token"]).stdout == "s3cr3t\n")
                #expect(try await daemon.storectl(["query", "shared"]).stdout == "{}\n")
            }
        }

        @Test func globsAndReadOnlyRulesAreEnforced() async throws {
            try await withSharedDaemon(["nobody:pub-*:ro", "nobody:inbox"]) { daemon in
                _ = try await daemon.storectl(["insert", "pub-news", #"{"id":"1"}"#])
                _ = try await daemon.storectl(["insert", "private", #"{"id":"1"}"#])
                let socket = daemon.socketPath
                let directory = daemon.directory
                #expect(try await asNobody(socket, ["count", "pub-news"], in: directory) == "ok countResult 1")
                let denied = try await asNobody(socket, ["insert", "pub-news", "2", "{}"], in: directory)
                #expect(denied == "error 0x0107 uid 65534 may not change store pub-news (read-only)")
                let hidden = try await asNobody(socket, ["count", "private"], in: directory)
                #expect(hidden == "error 0x0107 uid 65534 may not read store private")
                #expect(try await asNobody(socket, ["insert", "inbox", "m", "{}"], in: directory) == "ok writeResult committed=1 sequence=1")
                // The listing shows only what the peer may read.
                #expect(try await asNobody(socket, ["list-stores"], in: directory) == "ok storeList inbox,pub-news")
                _ = try await daemon.storectl(["value", "set", "pub-theme", "1"])
                _ = try await daemon.storectl(["value", "set", "private-theme", "1"])
                #expect(try await asNobody(socket, ["list-values", "1"], in: directory) == "ok valueList pub-theme")
                #expect(try await daemon.storectl(["count", "pub-news"]).stdout == "1\n")
            }
        }

        @Test func accessIsCheckedBeforeLimits() async throws {
            try await withTemporaryDirectory { directory in
                chmod(directory, 0o711)
                let daemon = Daemon(
                    in: directory, socketPath: directory + "/run/s.sock",
                    arguments: ["--allow-uid", "nobody:pub-*:ro", "--max-item", "16", "--log-level", "debug"])
                try await daemon.start()
                let big = String(repeating: "x", count: 64)
                // Read-only and too large: the access interceptor answers first.
                let denied = try await asNobody(daemon.socketPath, ["insert", "pub-a", "1", big], in: directory)
                #expect(denied.hasPrefix("error 0x0107"), "\(denied)")
                // The owner gets the limit.
                let limited = try await daemon.storectl(["insert", "pub-a", "{\"id\":\"1\",\"x\":\"\(big)\"}"])
                #expect(limited.status == 65 && limited.stderr.contains("itemTooLarge"))
                await daemon.stop()
                // The request log saw both, with the peer's uid.
                #expect(daemon.log.contains("error.code=permissionDenied") && daemon.log.contains("peer.uid=65534"))
            }
        }

        @Test func otherUsersAreRefusedWithAClearError() async throws {
            // Admit some other uid, so the socket is open to everyone, but not nobody.
            try await withSharedDaemon(["12345"]) { daemon in
                let refused = try await asNobody(daemon.socketPath, ["count", "s"], in: daemon.directory)
                #expect(refused.hasPrefix("error 0x0107 uid 65534 is not allowed on this broker"), "\(refused)")
                #expect(try await daemon.storectl(["ping"]).stdout == "pong\n")
            }
        }
    }
}
