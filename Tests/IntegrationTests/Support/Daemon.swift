import Foundation
import TestSupport
import StoreBrokerClient
import Testing
import Wire

/// The real storebrokerd on a temporary socket and data directory, with `--no-dbus`.
final class Daemon: @unchecked Sendable {
    let directory: String
    let socketPath: String
    let dataDirectory: String
    let extraArguments: [String]
    /// Whether the daemon may use D-Bus (then `extraArguments` say which bus); otherwise `--no-dbus`.
    let dbus: Bool
    /// A command the daemon is started through, e.g. `["prlimit", "--nofile=64:64", "--"]` (it must exec it).
    let launcher: [String]
    private(set) var process: ChildProcess?
    private var starts = 0

    init(
        in directory: String, socketPath: String? = nil, dataDirectory: String? = nil, arguments: [String] = [],
        dbus: Bool = false, launcher: [String] = []
    ) {
        self.launcher = launcher
        self.directory = directory
        self.socketPath = socketPath ?? directory + "/s.sock"
        self.dataDirectory = dataDirectory ?? directory + "/data"
        self.extraArguments = arguments
        self.dbus = dbus
    }

    var arguments: [String] {
        launcher + [binDirectory + "/storebrokerd", "--socket", socketPath, "--data-dir", dataDirectory] + (dbus ? [] : ["--no-dbus"])
            + extraArguments
    }

    var logPath: String { directory + "/daemon-\(ObjectIdentifier(self).hashValue)-\(starts).log" }
    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    /// Starts the daemon and waits until it answers (`storectl ping --wait`).
    func start() async throws {
        starts += 1
        let child = try ChildProcess(arguments, stdoutPath: logPath, stderrPath: logPath, in: directory)
        process = child
        for _ in 0..<120 {
            if try await storectl(["ping", "--wait", "0.5"]).status == 0 { return }
            var status: Int32 = 0
            if waitpid(child.pid, &status, WNOHANG) == child.pid {
                process = nil
                throw DaemonFailure("the daemon exited at start-up:\n\(child.stderr)")
            }
        }
        child.signal(SIGKILL)
        await child.wait()
        process = nil
        throw DaemonFailure("the daemon did not become ready in 60 s:\n\(child.stderr)")
    }

    /// SIGTERM and wait: the graceful path. Returns the exit status.
    @discardableResult
    func stop() async -> Int32 {
        defer { process = nil }
        return await process?.terminate(within: 30) ?? -1
    }

    /// SIGKILL: a crash.
    func crash() async {
        guard let process else { return }
        process.signal(SIGKILL)
        await process.wait()
        self.process = nil
    }

    /// Runs storectl against this daemon.
    func storectl(_ arguments: [String], stdin: String? = nil) async throws -> ProcessResult {
        try await runStorectl(["--socket", socketPath] + arguments, stdin: stdin, in: directory)
    }

    /// Runs storectl and expects it to exit with `status` and say `text` on stderr.
    func expectStorectl(
        _ arguments: [String], exits status: Int32, saying text: String,
        sourceLocation: Testing.SourceLocation = #_sourceLocation
    ) async throws {
        let result = try await storectl(arguments)
        #expect(result.status == status, "\(arguments): \(result.stderr)", sourceLocation: sourceLocation)
        #expect(result.stderr.contains(text), "\(arguments): \(result.stderr)", sourceLocation: sourceLocation)
    }

    /// Starts `storectl watch` in the background, its output in a file; returns once its first line is out.
    func watch(_ store: String, _ more: [String] = []) async throws -> Watcher {
        let name = "watch-\(UUID().uuidString)"
        let child = try ChildProcess(
            [binDirectory + "/storectl", "--socket", socketPath, "watch", store] + more,
            stdoutPath: directory + "/\(name).out", stderrPath: directory + "/\(name).err", in: directory)
        let watcher = Watcher(child)
        guard await eventually({ !watcher.lines.isEmpty }) else {
            child.signal(SIGKILL)
            throw DaemonFailure("watch printed nothing: \(child.stderr)")
        }
        return watcher
    }

    /// A client connection from this test process.
    func connect() async throws -> BrokerConnection {
        try await BrokerConnection.connect(socketPath: socketPath, clientName: "integration-test")
    }

    /// Runs `body` with a started daemon, stopping it afterwards (SIGKILL if it is stuck).
    static func with<T>(
        arguments: [String] = [], _ body: (Daemon) async throws -> T
    ) async throws -> T {
        try await withTemporaryDirectory { directory in
            let daemon = Daemon(in: directory, arguments: arguments)
            try await daemon.start()
            do {
                let result = try await body(daemon)
                await daemon.stop()
                return result
            } catch {
                await daemon.stop()
                throw error
            }
        }
    }
}

/// A `storectl watch` running in the background.
final class Watcher: @unchecked Sendable {
    let process: ChildProcess

    init(_ process: ChildProcess) {
        self.process = process
    }

    /// The complete lines printed so far.
    var lines: [String] {
        let text = process.stdout
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        lines.removeLast()  // the text after the last newline: incomplete (or empty)
        return lines
    }

    /// The parsed lines.
    var objects: [[String: Any]] {
        lines.compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
    }

    /// Waits until a line with this sequence is out.
    func waitFor(sequence: Int, within seconds: Double = 60) async -> Bool {
        await eventually(within: seconds) { objects.contains { ($0["sequence"] as? Int) == sequence } }
    }

    func stop() async {
        process.signal(SIGTERM)
        await process.wait(atMost: 10)
    }
}

struct DaemonFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Runs storectl with `arguments` and waits for it (killed after 60 s: no test hangs).
func runStorectl(_ arguments: [String], stdin: String? = nil, in directory: String) async throws -> ProcessResult {
    try await runProgram([binDirectory + "/storectl"] + arguments, stdin: stdin, in: directory)
}
