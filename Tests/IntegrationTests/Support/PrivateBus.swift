import Foundation
import TestSupport

/// A private `dbus-daemon` on a socket in a test directory (never the machine's session bus).
final class PrivateBus: @unchecked Sendable {
    let directory: String
    let socketPath: String
    private(set) var process: ChildProcess?
    private(set) var address = ""

    init(in directory: String) {
        self.directory = directory
        self.socketPath = directory + "/bus"
    }

    /// The address without the guid: stays valid across restarts of the bus on the same path.
    var stableAddress: String { "unix:path=\(socketPath)" }

    func start() async throws {
        unlink(socketPath)
        let output = directory + "/bus-\(UUID().uuidString).out"
        let child = try ChildProcess(
            ["/usr/bin/dbus-daemon", "--session", "--nofork", "--print-address=1", "--address=unix:path=\(socketPath)"],
            stdoutPath: output, stderrPath: directory + "/bus.err", in: directory)
        process = child
        guard await eventually(within: 30, { !child.stdout.isEmpty }) else {
            throw DaemonFailure("dbus-daemon printed no address: \(child.stderr)")
        }
        address = child.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func stop() async {
        process?.signal(SIGKILL)
        await process?.wait()
        process = nil
    }

    /// Whether `name` has an owner on the bus now (asked with dbus-send).
    func hasOwner(_ name: String) async throws -> Bool {
        let child = try ChildProcess(
            ["/usr/bin/dbus-send", "--bus=\(stableAddress)", "--print-reply", "--dest=org.freedesktop.DBus", "/org/freedesktop/DBus",
             "org.freedesktop.DBus.NameHasOwner", "string:\(name)"],
            stdoutPath: directory + "/owner.out", stderrPath: directory + "/owner.err", in: directory)
        await child.wait(atMost: 30)
        return child.stdout.contains("boolean true")
    }

    /// Waits (bounded) until `name` has an owner: readiness, not a sleep.
    func waitForOwner(_ name: String, within seconds: Double = 30) async throws -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if try await hasOwner(name) { return true }
            try await Task.sleep(for: .milliseconds(50))
        }
        return false
    }
}

/// One signal as dbus-monitor printed it.
struct MonitoredSignal: Equatable, CustomStringConvertible {
    var member: String
    var name: String
    var sequence: UInt64
    var operation = ""
    var ids: [String] = []
    var flag = false  // complete, or secure

    var description: String { "\(member)(\(name), \(sequence), \(operation), \(ids), \(flag))" }
}

/// `dbus-monitor` watching the broker's signals (a client nobody wrote for this project).
final class Monitor: @unchecked Sendable {
    let process: ChildProcess

    init(bus: PrivateBus, rule: String = "type='signal',interface='org.storebroker.StoreBroker1'") async throws {
        let name = UUID().uuidString
        process = try ChildProcess(
            ["/usr/bin/dbus-monitor", "--address", bus.stableAddress, rule],
            stdoutPath: bus.directory + "/\(name).mon", stderrPath: bus.directory + "/\(name).err", in: bus.directory)
        // dbus-monitor is listening once its own NameAcquired/NameLost shows.
        guard await eventually(within: 30, { self.process.stdout.contains("member=NameLost") || self.process.stdout.contains("member=NameAcquired") })
        else { throw DaemonFailure("dbus-monitor did not start: \(process.stderr)") }
    }

    var signals: [MonitoredSignal] {
        var out: [MonitoredSignal] = []
        var current: MonitoredSignal?
        var field = 0
        func finish() {
            if let done = current { out.append(done) }
            current = nil
        }
        for line in process.stdout.split(separator: "\n") {
            let text = line.trimmingCharacters(in: .whitespaces)
            if line.hasPrefix("signal ") || line.hasPrefix("method ") || line.hasPrefix("error ") {
                finish()
                if line.contains("interface=org.storebroker.StoreBroker1"), let member = line.components(separatedBy: "member=").last {
                    current = MonitoredSignal(member: member, name: "", sequence: 0)
                    field = 0
                }
                continue
            }
            guard current != nil else { continue }
            if text.hasPrefix("string \"") {
                let value = String(text.dropFirst(8).dropLast())
                if field == 3 {
                    current!.ids.append(value)
                    continue
                }
                if field == 0 { current!.name = value } else { current!.operation = value }
                field += 1
            } else if text.hasPrefix("uint64 ") {
                current!.sequence = UInt64(text.dropFirst(7)) ?? 0
                field = 2
            } else if text.hasPrefix("array [") {
                field = 3
            } else if text == "]" {
                field = 4
            } else if text.hasPrefix("boolean ") {
                current!.flag = text.hasSuffix("true")
            }
        }
        finish()
        return out
    }

    /// Waits until a signal matches.
    func waitFor(within seconds: Double = 30, _ matches: @escaping (MonitoredSignal) -> Bool) async -> Bool {
        await eventually(within: seconds) { self.signals.contains(where: matches) }
    }

    func stop() async {
        process.signal(SIGTERM)
        await process.wait(atMost: 10)
    }
}

/// StoreEvent signals with consecutive ones of the same store and operation merged, as the broker may do in
/// a burst: (store, operation, ids, last sequence).
func merged(_ signals: [MonitoredSignal]) -> [String] {
    var out: [(store: String, operation: String, ids: [String], sequence: UInt64)] = []
    for signal in signals where signal.member == "StoreEvent" {
        if let last = out.last, last.store == signal.name, last.operation == signal.operation {
            out[out.count - 1].ids += signal.ids
            out[out.count - 1].sequence = signal.sequence
        } else {
            out.append((signal.name, signal.operation, signal.ids, signal.sequence))
        }
    }
    return out.map { "\($0.store) \($0.operation) \($0.ids.joined(separator: ",")) @\($0.sequence)" }
}
