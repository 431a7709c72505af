import Foundation
import TestSupport
import Testing

extension Integration {
    /// Start-up, paths and permissions, one daemon per data directory and socket, graceful shutdown.
    @Suite struct Lifecycle {
        @Test func createsItsDirectoriesPrivatelyAndRemovesItsSocketOnSIGTERM() async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory, socketPath: directory + "/run/deeper/s.sock")
                // The socket's directory and the data directory are created (mode 0700), the socket is 0600.
                try FileManager.default.createDirectory(atPath: directory + "/run", withIntermediateDirectories: false)
                try await daemon.start()
                #expect(mode(directory + "/run/deeper") == 0o700)
                #expect(mode(daemon.socketPath) == 0o600)
                #expect(mode(daemon.dataDirectory) == 0o700)
                let watcher = try await daemon.watch("s")
                #expect(await daemon.stop() == 0)
                #expect(!FileManager.default.fileExists(atPath: daemon.socketPath))
                // Clients are told why the connection ends.
                #expect(await watcher.process.wait(atMost: 10) == 69)
                #expect(watcher.process.stderr.contains("shutting down"))
            }
        }

        @Test func withNoConfigurationDaemonAndStorectlAgreeOnTheSocketAndDataDirectory() async throws {
            try await withTemporaryDirectory { directory in
                let environment = [
                    "XDG_RUNTIME_DIR": directory + "/runtime", "XDG_DATA_HOME": directory + "/share",
                    "HOME": directory, "PATH": "/usr/bin:/bin",
                ]
                try FileManager.default.createDirectory(atPath: directory + "/runtime", withIntermediateDirectories: false)
                let daemon = try ChildProcess(
                    [binDirectory + "/storebrokerd", "--no-dbus"], stdoutPath: directory + "/log", stderrPath: directory + "/log",
                    in: directory, environment: environment)
                func storectl(_ arguments: [String]) async throws -> ProcessResult {
                    let child = try ChildProcess(
                        [binDirectory + "/storectl"] + arguments, stdoutPath: directory + "/out", stderrPath: directory + "/err",
                        in: directory, environment: environment)
                    let status = await child.wait(atMost: 60)
                    return ProcessResult(status: status, stdout: child.stdout, stderr: child.stderr)
                }
                #expect(try await storectl(["ping", "--wait", "30"]).stdout == "pong\n")
                #expect(try await storectl(["insert", "s", #"{"id":"1"}"#]).stdout == "1\n")
                #expect(FileManager.default.fileExists(atPath: directory + "/runtime/storebroker/storebroker.sock"))
                #expect(mode(directory + "/runtime/storebroker") == 0o700)
                #expect(FileManager.default.fileExists(atPath: directory + "/share/storebroker/stores/s/manifest"))
                daemon.signal(SIGTERM)
                #expect(await daemon.wait(atMost: 30) == 0)
                #expect(!FileManager.default.fileExists(atPath: directory + "/runtime/storebroker/storebroker.sock"))
            }
        }

        @Test func sigtermWorksEvenWhenTheParentLeftItBlocked() async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory)
                let child = try ChildProcess(
                    daemon.arguments, stdoutPath: directory + "/log", stderrPath: directory + "/log", in: directory,
                    blockedSignals: [SIGTERM, SIGINT])
                #expect(try await daemon.storectl(["ping", "--wait", "30"]).status == 0)
                child.signal(SIGTERM)
                #expect(await child.wait(atMost: 30) == 0)
                #expect(child.stderr.contains("received SIGTERM"))
            }
        }

        @Test func aPeerOfAnotherUserIsRefused() async throws {
            guard getuid() == 0, FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") else { return }
            try await Daemon.with { daemon in
                // Open the way on purpose (the daemon's own modes would stop `nobody` before SO_PEERCRED does).
                chmod(daemon.directory, 0o755)
                chmod(daemon.socketPath, 0o666)
                let script = """
                    import socket, struct
                    s = socket.socket(socket.AF_UNIX)
                    s.connect("\(daemon.socketPath)")
                    hello = b"SBRK" + bytes([1]) + struct.pack(">H", 1) + struct.pack(">H", 6) + b"nobody"
                    s.sendall(struct.pack(">IBBHI", len(hello), 1, 0, 0, 0) + hello)
                    data = b""
                    while True:
                        chunk = s.recv(4096)
                        if not chunk: break
                        data += chunk
                    length, kind, flags, reserved, ident = struct.unpack(">IBBHI", data[:12])
                    code = struct.unpack(">H", data[12:14])[0]
                    print(hex(kind), ident, hex(code), data[16:].decode())
                    """
                let result = try ChildProcess(
                    ["/usr/bin/setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3", "-c", script],
                    stdoutPath: daemon.directory + "/peer.out", stderrPath: daemon.directory + "/peer.err", in: daemon.directory)
                let status = await result.wait(atMost: 30)
                #expect(status == 0, "\(result.stderr)")
                #expect(result.stdout.hasPrefix("0x7f 0 0x107 "), "\(result.stdout)")
                #expect(result.stdout.contains("not allowed"))
                #expect(try await daemon.storectl(["ping"]).stdout == "pong\n")
            }
        }

        @Test func aSecondDaemonOnTheSameSocketOrDataDirectoryExitsWithAClearMessage() async throws {
            try await Daemon.with { daemon in
                // Same socket, other data directory.
                let sameSocket = try ChildProcess(
                    [binDirectory + "/storebrokerd", "--socket", daemon.socketPath, "--data-dir", daemon.directory + "/other", "--no-dbus"],
                    stdoutPath: daemon.directory + "/second.log", stderrPath: daemon.directory + "/second.log", in: daemon.directory)
                #expect(await sameSocket.wait(atMost: 30) != 0)
                #expect(sameSocket.stderr.contains("already listening on \(daemon.socketPath)"))
                // Same data directory, other socket.
                let sameData = try ChildProcess(
                    [binDirectory + "/storebrokerd", "--socket", daemon.directory + "/other.sock", "--data-dir", daemon.dataDirectory, "--no-dbus"],
                    stdoutPath: daemon.directory + "/third.log", stderrPath: daemon.directory + "/third.log", in: daemon.directory)
                #expect(await sameData.wait(atMost: 30) != 0)
                #expect(sameData.stderr.contains("another storebrokerd is already using the data directory"))
                #expect(!FileManager.default.fileExists(atPath: daemon.directory + "/other.sock"))
                // The first one is untouched.
                #expect(try await daemon.storectl(["ping"]).stdout == "pong\n")
            }
        }

        @Test func aStaleSocketIsReplacedAndAnythingElseIsRefused() async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory)
                try await daemon.start()
                _ = try await daemon.storectl(["insert", "s", #"{"id":"1"}"#])
                await daemon.crash()
                #expect(FileManager.default.fileExists(atPath: daemon.socketPath))  // left behind by kill -9
                try await daemon.start()
                #expect(try await daemon.storectl(["count", "s"]).stdout == "1\n")
                await daemon.stop()

                try "not a socket".write(toFile: daemon.socketPath, atomically: false, encoding: .utf8)
                let refused = try ChildProcess(
                    daemon.arguments, stdoutPath: directory + "/refused.log", stderrPath: directory + "/refused.log", in: directory)
                #expect(await refused.wait(atMost: 30) != 0)
                #expect(refused.stderr.contains("is not a socket"))
                #expect(try String(contentsOfFile: daemon.socketPath, encoding: .utf8) == "not a socket")
            }
        }

        @Test func aSymbolicLinkAsSocketDirectoryIsRefused() async throws {
            try await withTemporaryDirectory { directory in
                try FileManager.default.createDirectory(atPath: directory + "/real", withIntermediateDirectories: false)
                try FileManager.default.createSymbolicLink(atPath: directory + "/link", withDestinationPath: directory + "/real")
                let daemon = try ChildProcess(
                    [binDirectory + "/storebrokerd", "--socket", directory + "/link/s.sock", "--data-dir", directory + "/data", "--no-dbus"],
                    stdoutPath: directory + "/log", stderrPath: directory + "/log", in: directory)
                #expect(await daemon.wait(atMost: 30) != 0)
                #expect(daemon.stderr.contains("symbolic link"))
            }
        }

        @Test func badConfigurationFailsAtStartUp() async throws {
            try await withTemporaryDirectory { directory in
                let cases: [([String], String)] = [
                    (["--engine-option", "sqlite.no_such_key=1"], "no option \"no_such_key\""),
                    // Values are checked at start-up too (check_options), for every engine given options.
                    (["--engine-option", "c-example.fail_after_steps=abc"], "fail_after_steps must be a whole number, got \"abc\""),
                    (["--engine-option", "sqlite.synchronous=SOMETIMES"], "SOMETIMES"),
                    (["--engine-option", "nonsense"], "NAME.KEY=VALUE"),
                    (["--engine", "nonexistent"], "nonexistent"),
                    (["--log-level", "loud"], "--log-level"),
                    (["--allow-uid", "1000:notes:rw"], "--allow-uid takes UID[:GLOB[:ro]]"),
                    (["--allow-uid", "no-such-user-here"], "--allow-uid takes UID[:GLOB[:ro]]"),
                    (["--max-subscriptions", "0"], "--max-subscriptions must be at least 1"),
                    (["--max-total-subscriptions", "0"], "--max-total-subscriptions must be at least 1"),
                ]
                for (extra, message) in cases {
                    let daemon = try ChildProcess(
                        [binDirectory + "/storebrokerd", "--socket", directory + "/s.sock", "--data-dir", directory + "/data", "--no-dbus"]
                            + extra, stdoutPath: directory + "/log", stderrPath: directory + "/log", in: directory)
                    #expect(await daemon.wait(atMost: 30) != 0, "\(extra)")
                    #expect(daemon.stderr.contains(message), "\(extra): \(daemon.stderr)")
                    #expect(!FileManager.default.fileExists(atPath: directory + "/s.sock"))
                }
                // A known option is accepted.
                let daemon = Daemon(in: directory, arguments: ["--engine-option", "sqlite.synchronous=FULL"])
                try await daemon.start()
                #expect(try await daemon.storectl(["insert", "s", #"{"id":"1"}"#]).stdout == "1\n")
                await daemon.stop()
            }
        }

        /// A start-up that fails leaves nothing behind: no data directory, socket directory, `.lock` or secure-value
        /// key it created (before: `.lock` and the key stayed), and nothing that was there before is touched.
        @Test func aFailedStartUpLeavesNothingBehind() async throws {
            try await withTemporaryDirectory { directory in
                func run(_ arguments: [String]) async throws -> ChildProcess {
                    let daemon = try ChildProcess(
                        [binDirectory + "/storebrokerd", "--no-dbus"] + arguments, stdoutPath: directory + "/log",
                        stderrPath: directory + "/log", in: directory)
                    #expect(await daemon.wait(atMost: 30) == 1, "\(arguments)")
                    return daemon
                }
                let files = FileManager.default
                // An engine that cannot be loaded: neither directory is made.
                var daemon = try await run(["--socket", directory + "/run/s.sock", "--data-dir", directory + "/data", "--engine", "nonexistent"])
                #expect(daemon.stderr.contains("nonexistent"))
                #expect(!files.fileExists(atPath: directory + "/run"))
                #expect(!files.fileExists(atPath: directory + "/data"))

                // A failure after the data directory was locked and the key made: the socket path fits, but the
                // temporary name it is bound under first does not.
                let long = directory + "/" + String(repeating: "p", count: 104 - directory.utf8.count)
                try files.createDirectory(atPath: long, withIntermediateDirectories: false)
                daemon = try await run(["--socket", long + "/s", "--data-dir", directory + "/data/deep"])
                #expect(daemon.stderr.contains("too long to bind beside it"), "\(daemon.stderr)")
                #expect(!files.fileExists(atPath: directory + "/data"), "\((try? files.subpathsOfDirectory(atPath: directory + "/data")) ?? [])")

                // The same failure on a data directory in use: what was there stays, nothing is added.
                let data = Daemon(in: directory)
                try await data.start()
                _ = try await data.storectl(["insert", "s", #"{"id":"1"}"#])
                _ = try await data.storectl(["secret", "set", "token", "abc"])
                await data.stop()
                let before = try files.subpathsOfDirectory(atPath: data.dataDirectory).sorted()
                let key = try Data(contentsOf: URL(fileURLWithPath: data.dataDirectory + "/secure-values.key"))
                daemon = try await run(["--socket", long + "/s", "--data-dir", data.dataDirectory])
                #expect(try files.subpathsOfDirectory(atPath: data.dataDirectory).sorted() == before)
                #expect(try Data(contentsOf: URL(fileURLWithPath: data.dataDirectory + "/secure-values.key")) == key)
                try await data.start()
                #expect(try await data.storectl(["count", "s"]).stdout == "1\n")
                #expect(try await data.storectl(["secret", "get", "token"]).stdout == "abc\n")
                await data.stop()
            }
        }

        @Test func versionAndHelp() async throws {
            try await withTemporaryDirectory { directory in
                let version = try ChildProcess(
                    [binDirectory + "/storebrokerd", "--version"], stdoutPath: directory + "/v", stderrPath: directory + "/e", in: directory)
                #expect(await version.wait(atMost: 30) == 0)
                #expect(version.stdout.hasPrefix("storebrokerd 0."))
                let help = try ChildProcess(
                    [binDirectory + "/storebrokerd", "--help"], stdoutPath: directory + "/h", stderrPath: directory + "/e2", in: directory)
                #expect(await help.wait(atMost: 30) == 0)
                for flag in ["--socket", "--data-dir", "--engine", "--engine-path", "--engine-option", "--no-dbus", "--history",
                    "--subscriber-buffer", "--max-frame", "--max-item", "--max-batch", "--max-group-wait", "--log-level"]
                {
                    #expect(help.stdout.contains(flag), "\(flag)")
                }
            }
        }
    }
}

private func mode(_ path: String) -> mode_t {
    var info = stat()
    lstat(path, &info)
    return info.st_mode & 0o7777
}
