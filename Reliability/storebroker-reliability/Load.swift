import Foundation
import StoreBrokerClient
import TestSupport

/// Many connections, each waiting for its answers, mixing writes (single, batch, remove) and reads (get,
/// count, range) on one store for a bounded time, while watchers follow it: no errors, every watcher sees the
/// same gap-free sequence of events, every acknowledged commit is among them, and the daemon's descriptors
/// and resident memory come back near their baseline once the connections are gone.
struct LoadScenario {
    var connections: Int
    var seconds: Double
    var watchers: Int
    var engine: String
    var seed: UInt64

    static let store = "load"
    /// Ids are drawn from a fixed space, so the store stays small whatever the rate.
    static let idSpace = 10_000

    func run() async throws -> [String: Any] {
        let findings = Findings()
        return try await withTemporaryDirectory(prefix: "sb-load") { directory in
            let broker = Broker(in: directory, arguments: ["--engine", engine])
            try await broker.start()
            let setup = try await broker.connect(name: "load-setup")
            _ = try await setup.write(Self.store, .insert([Item(id: "seed", payload: Payload("{}"))]))
            try await Task.sleep(for: .milliseconds(500))
            let baselineDescriptors = broker.descriptors
            let baselineResident = broker.residentBytes

            let watching = try await (0..<watchers).asyncMap { index in
                try await Watcher(broker: broker, name: "watcher-\(index)")
            }
            let acknowledged = Acknowledged()
            let sampler = Task.detached {
                var peak = 0
                while !Task.isCancelled {
                    peak = max(peak, broker.residentBytes)
                    try? await Task.sleep(for: .milliseconds(250))
                }
                return peak
            }
            let deadline = Date().addingTimeInterval(seconds)
            let counts = try await withThrowingTaskGroup(of: (requests: Int, errors: Int).self) { group in
                for index in 0..<connections {
                    group.addTask {
                        await Self.client(
                            broker: broker, index: index, until: deadline, seed: seed &+ UInt64(index),
                            acknowledged: acknowledged, findings: findings)
                    }
                }
                var total = (requests: 0, errors: 0)
                for try await count in group {
                    total.requests += count.requests
                    total.errors += count.errors
                }
                return total
            }
            sampler.cancel()
            let peakResident = await sampler.value

            // Every watcher must reach the store's last commit.
            let final = try await setup.storeInfo(Self.store).sequence
            var streams: [[UInt64: String]] = []
            for watcher in watching {
                streams.append(await watcher.stop(after: final, within: 30, findings: findings))
            }
            await setup.close()
            let reference = streams.first ?? [:]
            for (index, stream) in streams.enumerated().dropFirst() where stream != reference {
                findings.record("watchers disagree", "watcher \(index) saw \(stream.count) events, watcher 0 \(reference.count)")
            }
            for sequence in acknowledged.sequences where reference[sequence] == nil {
                findings.record("acknowledged commit not seen", "sequence \(sequence)")
            }

            var descriptors = broker.descriptors
            let settle = Date().addingTimeInterval(15)
            while descriptors > baselineDescriptors, Date() < settle {
                try await Task.sleep(for: .milliseconds(200))
                descriptors = broker.descriptors
            }
            try await Task.sleep(for: .seconds(2))
            let resident = broker.residentBytes
            if descriptors > baselineDescriptors {
                findings.record("descriptors leaked", "\(descriptors) open after, \(baselineDescriptors) before")
            }
            if resident > baselineResident + (64 << 20) {
                findings.record("memory not returned", "\(resident >> 20) MiB after, \(baselineResident >> 20) MiB before")
            }
            if !broker.isAlive { findings.record("daemon crashed", "") }
            await broker.stop()
            findings.report()
            return [
                "scenario": "load", "engine": engine, "connections": connections, "watchers": watchers,
                "seconds": seconds, "requests": counts.requests, "errors": counts.errors,
                "requests_per_second": Double(counts.requests) / seconds,
                "acknowledged_commits": acknowledged.sequences.count, "events_per_watcher": reference.count,
                "final_sequence": final, "descriptors_before": baselineDescriptors, "descriptors_after": descriptors,
                "resident_mib_before": Double(baselineResident) / 1_048_576,
                "resident_mib_peak": Double(peakResident) / 1_048_576,
                "resident_mib_after": Double(resident) / 1_048_576, "seed": String(seed),
                "violations": findings.summary, "passed": findings.isEmpty,
            ]
        }
    }

    /// One connection's mixed requests until the deadline, each waiting for its answer.
    private static func client(
        broker: Broker, index: Int, until deadline: Date, seed: UInt64, acknowledged: Acknowledged, findings: Findings
    ) async -> (requests: Int, errors: Int) {
        var random = SeededGenerator(state: seed)
        guard let connection = try? await broker.connect(name: "load-\(index)") else {
            findings.record("request failed", "connection \(index) could not connect")
            return (0, 1)
        }
        defer { Task { await connection.close() } }
        func id() -> ItemID { ItemID("k\(Int.random(in: 0..<idSpace, using: &random))") }
        var requests = 0
        var errors = 0
        while Date() < deadline, requests < 1_000_000 {
            requests += 1
            do throws(StoreBrokerError) {
                switch Int.random(in: 0..<10, using: &random) {
                case 0...3:
                    let item = Item(id: id(), payload: Payload(#"{"c":\#(index),"n":\#(requests)}"#))
                    acknowledged.add(try await connection.write(store, .insert([item])))
                case 4:
                    let items = (0..<10).map { _ in Item(id: id(), payload: Payload(#"{"c":\#(index)}"#)) }
                    acknowledged.add(try await connection.write(store, .insert(items)))
                case 5:
                    acknowledged.add(try await connection.write(store, .remove((0..<3).map { _ in id() })))
                case 6, 7:
                    _ = try await connection.items(store, ids: (0..<5).map { _ in id() })
                case 8:
                    _ = try await connection.count(store)
                default:
                    _ = try await connection.records(store, limit: 20)
                }
            } catch {
                errors += 1
                findings.record("request failed", "\(error)")
            }
        }
        return (requests, errors)
    }
}

/// The sequences of the commits acknowledged to the load's clients.
final class Acknowledged: @unchecked Sendable {
    private let lock = NSLock()
    private var values: [UInt64] = []

    func add(_ result: CommitResult) {
        guard result.committed else { return }
        lock.withLock { values.append(result.sequence) }
    }

    var sequences: [UInt64] { lock.withLock { values } }
}

/// A connection following the store from a snapshot: each commit's sequence and a digest of what it did, checked
/// gap-free as they come.
final class Watcher: @unchecked Sendable {
    private let connection: BrokerConnection
    private let lock = NSLock()
    private var events: [UInt64: String] = [:]
    private var last: UInt64?
    private var problems: [String] = []
    private var task: Task<Void, Never>?

    init(broker: Broker, name: String) async throws {
        // A watcher here must see every commit: under the full load (thousands of commits a second on two cores)
        // it falls behind and catches up once the load ends, so its buffer holds up to 2^20 pushes. With the
        // library's default (1,024) it would lag, and resume past the broker's history (ClientTests cover that).
        connection = try await broker.connect(name: name, pushBuffer: 1 << 20)
        let stream = connection.follow(.store, name: LoadScenario.store, from: .snapshot)
        task = Task.detached { [self] in
            do {
                for try await push in stream {
                    lock.withLock { take(push) }
                }
            } catch {
                if !Task.isCancelled { lock.withLock { problems.append("the stream failed: \(error)") } }
            }
        }
        // The snapshot comes first: the watcher is in place once it has arrived.
        let ready = Date().addingTimeInterval(10)
        while lock.withLock({ last == nil && problems.isEmpty }), Date() < ready {
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    /// Called with the lock held.
    private func take(_ push: Push) {
        switch push {
        case .storeLoaded(let position, _):
            if let last, position.sequence != last { problems.append("a snapshot at \(position.sequence) after \(last)") }
            last = position.sequence
        case .storeEvent(let commit):
            if let last, commit.sequence != last + 1 {
                problems.append("event \(commit.sequence) after \(last)")
            }
            last = commit.sequence
            events[commit.sequence] = commit.steps.map { step in
                switch step {
                case .insert(let records): "+" + records.map { "\($0.id.string)=\($0.payload.bytes.readableBytes)" }.joined(separator: ",")
                case .remove(let ids): "-" + ids.map(\.string).joined(separator: ",")
                }
            }.joined(separator: ";")
        case .lagged:
            break  // `follow` resumes from it: the next event must still be the one after `last`
        default:
            problems.append("unexpected \(push)")
        }
    }

    /// Waits until the watcher has seen `sequence` (at most `seconds`), stops, and returns what it saw.
    func stop(after sequence: UInt64, within seconds: Double, findings: Findings) async -> [UInt64: String] {
        let deadline = Date().addingTimeInterval(seconds)
        while lock.withLock({ (last ?? 0) < sequence }), Date() < deadline {
            try? await Task.sleep(for: .milliseconds(20))
        }
        task?.cancel()
        await connection.close()
        return lock.withLock {
            if (last ?? 0) < sequence { findings.record("watcher fell behind", "at \(last ?? 0) of \(sequence)") }
            for problem in problems { findings.record("watcher saw a gap", problem) }
            return events
        }
    }
}

extension Sequence {
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var out: [T] = []
        for element in self { out.append(try await transform(element)) }
        return out
    }
}
