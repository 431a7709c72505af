import Foundation
import TestSupport
import Testing

private let activator = "/usr/bin/systemd-socket-activate"

extension Integration {
    /// Socket activation: the daemon serves the socket systemd hands it and never unlinks it.
    @Suite(.enabled(if: FileManager.default.isExecutableFile(atPath: activator), "needs systemd-socket-activate"))
    struct SocketActivation {
        @Test func servesTheHandedSocketAndLeavesIt() async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory)
                // systemd-socket-activate binds the socket, then execs the daemon with LISTEN_FDS=1, fd 3.
                let child = try ChildProcess(
                    [activator, "--listen=" + daemon.socketPath, binDirectory + "/storebrokerd", "--data-dir", daemon.dataDirectory, "--no-dbus"],
                    stdoutPath: directory + "/log", stderrPath: directory + "/log", in: directory)
                // The socket exists before the daemon runs; the first connection is served once it is up.
                #expect(try await daemon.storectl(["ping", "--wait", "30"]).stdout == "pong\n")
                #expect(try await daemon.storectl(["insert", "s", #"{"id":"1"}"#]).stdout == "1\n")
                #expect(try await daemon.storectl(["count", "s"]).stdout == "1\n")
                child.signal(SIGTERM)
                #expect(await child.wait(atMost: 30) == 0)
                #expect(child.stderr.contains("fd 3 from systemd"))
                // Never unlinked: it belongs to systemd.
                var info = stat()
                #expect(lstat(daemon.socketPath, &info) == 0 && info.st_mode & S_IFMT == S_IFSOCK)
            }
        }
    }
}
