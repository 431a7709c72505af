import Foundation

/// What a finished process left.
public struct ProcessResult: Sendable {
    public var status: Int32
    public var stdout: String
    public var stderr: String

    public var lines: [String] { stdout.split(separator: "\n").map(String.init) }

    public init(status: Int32, stdout: String, stderr: String) {
        self.status = status
        self.stdout = stdout
        self.stderr = stderr
    }
}

/// The directory of the running executable (a test bundle, a tool of the package): `swift build` puts storebrokerd, storectl and the engines there.
public let binDirectory: String = {
    let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    return URL(fileURLWithPath: exe).deletingLastPathComponent().path
}()

/// A child process started with posix_spawn: a clean signal mask and default signal handlers (a parent in a
/// test may block SIGTERM, see PITFALLS.md), stdin from a file, stdout and stderr to files.
public final class ChildProcess: @unchecked Sendable {
    public let pid: pid_t
    public let stdoutPath: String
    public let stderrPath: String
    private var reaped: Int32?

    /// `environment` replaces the test's own environment when given; `blockedSignals` are blocked in the child
    /// (to play a careless parent).
    public init(
        _ arguments: [String], stdin: String? = nil, stdoutPath: String, stderrPath: String, in directory: String,
        environment: [String: String]? = nil, blockedSignals: [Int32] = []
    ) throws {
        self.stdoutPath = stdoutPath
        self.stderrPath = stderrPath
        let stdinPath = directory + "/stdin-\(UUID().uuidString)"
        try (stdin ?? "").write(toFile: stdinPath, atomically: false, encoding: .utf8)
        defer { unlink(stdinPath) }

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, stdinPath, O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, stdoutPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_addopen(&actions, 2, stderrPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        for signal in blockedSignals { sigaddset(&empty, signal) }
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGTERM, SIGINT, SIGPIPE, SIGHUP] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        let argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        let envp = environment.map { $0.map { strdup("\($0.key)=\($0.value)") } + [nil] }
        defer { envp?.forEach { free($0) } }
        var pid: pid_t = 0
        let status = envp.map { posix_spawn(&pid, arguments[0], &actions, &attributes, argv, $0) }
            ?? posix_spawn(&pid, arguments[0], &actions, &attributes, argv, environ)
        guard status == 0 else { throw POSIXError(POSIXErrorCode(rawValue: status) ?? .EIO) }
        self.pid = pid
    }

    public func signal(_ number: Int32) {
        if reaped == nil { kill(pid, number) }
    }

    /// Waits for the process to end (on a thread of its own, never blocking the test's executor).
    @discardableResult
    public func wait() async -> Int32 {
        if let reaped { return reaped }
        let pid = self.pid
        let status: Int32 = await withCheckedContinuation { continuation in
            Thread {
                var status: Int32 = 0
                while waitpid(pid, &status, 0) < 0, errno == EINTR {}
                let code = (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
                continuation.resume(returning: code)
            }.start()
        }
        reaped = status
        return status
    }

    /// Waits at most `seconds`, then SIGKILL: no test hangs on a stuck child.
    @discardableResult
    public func wait(atMost seconds: Double) async -> Int32 {
        let pid = self.pid
        let done = Flag()
        Thread {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                if done.isSet { return }
                Thread.sleep(forTimeInterval: 0.05)
            }
            if !done.isSet { kill(pid, SIGKILL) }
        }.start()
        let status = await wait()
        done.set()
        return status
    }

    /// SIGTERM, then SIGKILL after `seconds`: the exit status.
    @discardableResult
    public func terminate(within seconds: Double) async -> Int32 {
        signal(SIGTERM)
        return await wait(atMost: seconds)
    }

    public var stdout: String { (try? String(contentsOfFile: stdoutPath, encoding: .utf8)) ?? "" }
    public var stderr: String { (try? String(contentsOfFile: stderrPath, encoding: .utf8)) ?? "" }
}

/// A flag shared between threads.
public final class Flag: @unchecked Sendable {
    public init() {}

    private let lock = NSLock()
    private var value = false

    public var isSet: Bool { lock.withLock { value } }
    public func set() { lock.withLock { value = true } }
}

/// Runs a program (an absolute path, no shell) and waits for it (killed after `seconds`).
public func runProgram(
    _ arguments: [String], stdin: String? = nil, in directory: String, atMost seconds: Int = 60
) async throws -> ProcessResult {
    let name = UUID().uuidString
    let child = try ChildProcess(
        arguments, stdin: stdin, stdoutPath: directory + "/\(name).out", stderrPath: directory + "/\(name).err",
        in: directory)
    let status = await child.wait(atMost: Double(seconds))
    let result = ProcessResult(status: status, stdout: child.stdout, stderr: child.stderr)
    unlink(child.stdoutPath)
    unlink(child.stderrPath)
    return result
}


/// Polls `condition` every 20 ms, at most `seconds`: for waiting on something another process or task does
/// (a line in a file, a mirror catching up), never for timing.
public func eventually(within seconds: Double = 30, _ condition: () throws -> Bool) async rethrows -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return try condition()
}

/// `eventually` for a condition that awaits (a storectl run, a query): polled every 20 ms, at most `seconds`.
public func eventually(within seconds: Double = 30, _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return try await condition()
}
