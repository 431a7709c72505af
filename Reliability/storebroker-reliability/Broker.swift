import Foundation
import StoreBrokerClient
import TestSupport

/// The release (or debug) storebrokerd built beside this tool, on a socket and data directory of its own.
final class Broker: @unchecked Sendable {
    let directory: String
    let socketPath: String
    let dataDirectory: String
    let arguments: [String]
    private(set) var process: ChildProcess?
    private var starts = 0

    init(in directory: String, arguments: [String]) {
        self.directory = directory
        socketPath = directory + "/s.sock"
        dataDirectory = directory + "/data"
        self.arguments = arguments
    }

    var pid: pid_t? { process?.pid }

    /// The end of the daemon's log (standard error), for a failure's message; a sanitizer's report from its start.
    var logTail: String {
        let text = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
        if let report = text.range(of: "==ERROR: ") { return String(text[report.lowerBound...].prefix(8_000)) }
        return String(text.suffix(4_000))
    }
    var logPath: String { directory + "/daemon-\(starts).log" }

    /// Starts the daemon and waits until it answers a ping (at most 60 s).
    func start() async throws {
        starts += 1
        let child = try ChildProcess(
            [binDirectory + "/storebrokerd", "--socket", socketPath, "--data-dir", dataDirectory, "--no-dbus",
             "--log-level", "warning"] + arguments,
            stdoutPath: logPath, stderrPath: logPath, in: directory)
        process = child
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            if let connection = try? await connect(name: "ready-check") {
                defer { Task { await connection.close() } }
                if (try? await connection.ping()) != nil { return }
            }
            if !isAlive {
                process = nil
                throw Failure("the daemon exited at start-up: \(child.stderr)")
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        child.signal(SIGKILL)
        await child.wait()
        process = nil
        throw Failure("the daemon did not answer within 60 s: \(child.stderr)")
    }

    /// `pushBuffer`: what a subscription may hold for a reader that is behind (the library's default is 1,024).
    func connect(name: String, pushBuffer: Int = 1024) async throws -> BrokerConnection {
        try await BrokerConnection.connect(socketPath: socketPath, clientName: name, timeout: .seconds(10), pushBuffer: pushBuffer)
    }

    /// Whether the process is still running (reaping it if it ended).
    var isAlive: Bool {
        guard let process else { return false }
        var status: Int32 = 0
        return waitpid(process.pid, &status, WNOHANG) == 0
    }

    func kill9() async {
        guard let process else { return }
        process.signal(SIGKILL)
        await process.wait()
        self.process = nil
    }

    /// SIGTERM, then SIGKILL after 30 s; the exit status.
    @discardableResult
    func stop() async -> Int32 {
        defer { process = nil }
        return await process?.terminate(within: 30) ?? -1
    }

    /// Resident memory, from /proc.
    var residentBytes: Int {
        guard let pid, let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") })
        else { return 0 }
        return (Int(line.split(separator: " ", omittingEmptySubsequences: true)[1]) ?? 0) * 1024
    }

    /// Open file descriptors, from /proc.
    var descriptors: Int {
        guard let pid else { return 0 }
        return (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? 0
    }
}

struct Failure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Properties a scenario checks: each violation is kept (the first few of each kind are printed).
final class Findings: @unchecked Sendable {
    private let lock = NSLock()
    private var counts: [String: Int] = [:]
    private var examples: [String: [String]] = [:]

    func record(_ property: String, _ example: @autoclosure () -> String) {
        lock.withLock {
            counts[property, default: 0] += 1
            if examples[property, default: []].count < 5 { examples[property, default: []].append(example()) }
        }
    }

    var isEmpty: Bool { lock.withLock { counts.isEmpty } }

    var summary: [String: Int] { lock.withLock { counts } }

    func report() {
        lock.withLock {
            for (property, count) in counts.sorted(by: { $0.key < $1.key }) {
                log("FAILED \(property): \(count) time(s), e.g. \(examples[property, default: []].joined(separator: "; "))")
            }
        }
    }
}

func log(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}

/// Prints the scenario's figures as one JSON object on standard output (the script collects them).
func emit(_ figures: [String: Any]) {
    let data = (try? JSONSerialization.data(withJSONObject: figures, options: [.sortedKeys])) ?? Data("{}".utf8)
    FileHandle.standardOutput.write(data + Data("\n".utf8))
}
