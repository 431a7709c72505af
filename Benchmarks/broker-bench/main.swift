// broker-bench: the daemon through its socket, as clients see it. Starts the storebrokerd built beside this
// binary on a temporary socket and data directory for each engine, and measures sequential latency,
// pipelined and concurrent write throughput (group commit), batch inserts and reading 10,000 items.
// Results and the command that reproduces them: docs/BENCHMARKS.md.
import Foundation
import NIOCore
import StoreBrokerClient
import Wire

struct Options {
    var engines = ["sqlite", "memory"]
    var runs = 3
    var dbusBurst = false
    /// `--library SOCKET`: sequential insert latency through BrokerConnection and RemoteStore on a running daemon.
    var librarySocket: String?
    /// `--shapes connection,client_executor,remotestore,executor,mirror` (the default: all): which of --library's
    /// measurements run.
    var libraryShapes: Set<String> = ["connection", "client_executor", "remotestore", "executor", "mirror"]
    /// `--count N`: sequential inserts per --library shape.
    var libraryCount = 2000

    init(_ arguments: [String]) {
        var iterator = arguments.makeIterator()
        while let argument = iterator.next() {
            switch argument {
            case "--runs": runs = Int(iterator.next() ?? "") ?? runs
            case "--engine": engines = (iterator.next() ?? "").split(separator: ",").map(String.init)
            case "--dbus-burst": dbusBurst = true
            case "--library": librarySocket = iterator.next()
            case "--shapes": libraryShapes = Set((iterator.next() ?? "").split(separator: ",").map(String.init))
            case "--count": libraryCount = Int(iterator.next() ?? "") ?? libraryCount
            default:
                FileHandle.standardError.write(Data("usage: broker-bench [--runs N] [--engine sqlite,memory] [--dbus-burst] [--library SOCKET [--shapes connection,client_executor,remotestore,executor,mirror] [--count N]]\n".utf8))
                exit(64)
            }
        }
    }
}

let binDirectory = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent().path

/// Starts a process with a clean signal mask (a task's thread may block SIGTERM, and children inherit it:
/// PITFALLS.md); stdout and stderr go to `output` (or stay the bench's).
func spawn(_ arguments: [String], output: String? = nil) throws -> pid_t {
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var empty = sigset_t()
    sigemptyset(&empty)
    posix_spawnattr_setsigmask(&attributes, &empty)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK))
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    if let output {
        posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
    }
    let argv = arguments.map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    var pid: pid_t = 0
    guard posix_spawn(&pid, arguments[0], &actions, &attributes, argv, environ) == 0 else { throw POSIXError(.EIO) }
    return pid
}

func stopProcess(_ pid: pid_t, _ signal: Int32 = SIGTERM) {
    kill(pid, signal)
    var status: Int32 = 0
    waitpid(pid, &status, 0)
}

/// The daemon under test, started from this binary's directory.
final class DaemonProcess {
    let directory: String
    let socket: String
    let pid: pid_t

    /// `dbus`: a bus address to signal on; `nil`: `--no-dbus`.
    init(engine: String, dbus: String? = nil) throws {
        var template = Array("/tmp/sb-bench-XXXXXX".utf8CString)
        directory = String(cString: mkdtemp(&template)!)
        socket = directory + "/s.sock"
        let arguments = [
            binDirectory + "/storebrokerd", "--socket", socket, "--data-dir", directory + "/data", "--engine", engine,
            "--log-level", "warning",
        ] + (dbus.map { ["--dbus-address", $0] } ?? ["--no-dbus"])
        pid = try spawn(arguments)
    }

    func connect() async throws -> BrokerConnection {
        for _ in 0..<600 {
            if let connection = try? await BrokerConnection.connect(socketPath: socket, clientName: "broker-bench") {
                return connection
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw POSIXError(.ETIMEDOUT)
    }

    func stop() {
        stopProcess(pid)
        try? FileManager.default.removeItem(atPath: directory)
    }
}

func item(_ id: String, bytes: Int) -> Item { item(id, pad: padding(bytes)) }

/// `item(_:bytes:)` with its padding made once (`padding(bytes)`): a timed loop then builds only what the load
/// generator builds per request, the id (making 180 characters one by one was 5% of a library shape's samples).
func item(_ id: String, pad: String) -> Item {
    Item(id: ItemID(id), payload: Payload("{\"id\":\"\(id)\",\"pad\":\"" + pad + "\"}"))
}

func padding(_ bytes: Int) -> String { String(repeating: "x", count: max(0, bytes - 20)) }

func seconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
}

func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }

func percentile(_ values: [Double], _ p: Double) -> Double {
    let sorted = values.sorted()
    return sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
}

/// One engine's figures for one run.
struct Figures {
    var sequentialP50 = 0.0  // s per insert, one client waiting for each
    var sequentialP99 = 0.0
    var getP50 = 0.0  // s per getItems of one id
    var pipelined = 0.0  // inserts/s, one connection, 64 in flight
    var concurrent = 0.0  // inserts/s, 8 connections each waiting for each
    var batch = 0.0  // items/s, batches of 1,000 × 200 B
    var read10k = 0.0  // s to read 10,000 × 1 KB items
}

func measure(engine: String) async throws -> Figures {
    let daemon = try DaemonProcess(engine: engine)
    defer { daemon.stop() }
    let connection = try await daemon.connect()
    var figures = Figures()
    let clock = ContinuousClock()

    // Sequential single-item inserts and gets: latency.
    var latencies: [Double] = []
    for n in 0..<2000 {
        let start = clock.now
        _ = try await connection.send(.insert(.init(store: "seq", items: [item("\(n)", bytes: 200)])))
        latencies.append(seconds(clock.now - start))
    }
    figures.sequentialP50 = median(latencies)
    figures.sequentialP99 = percentile(latencies, 0.99)
    latencies = []
    for n in 0..<2000 {
        let start = clock.now
        _ = try await connection.send(.getItems(.init(store: "seq", ids: [ItemID("\(n)")])))
        latencies.append(seconds(clock.now - start))
    }
    figures.getP50 = median(latencies)

    // Pipelined: 20,000 inserts, 64 in flight on one connection.
    var start = clock.now
    try await withThrowingTaskGroup(of: Void.self) { group in
        for n in 0..<20_000 {
            if n >= 64 { try await group.next() }
            group.addTask { _ = try await connection.send(.insert(.init(store: "pipe", items: [item("\(n)", bytes: 200)]))) }
        }
        try await group.waitForAll()
    }
    figures.pipelined = 20_000 / seconds(clock.now - start)

    // Concurrent: 8 connections, each 1,000 inserts one after the other, into one store.
    var connections: [BrokerConnection] = []
    for _ in 0..<8 { connections.append(try await daemon.connect()) }
    start = clock.now
    try await withThrowingTaskGroup(of: Void.self) { group in
        for (index, client) in connections.enumerated() {
            group.addTask {
                for n in 0..<1000 {
                    _ = try await client.send(.insert(.init(store: "many", items: [item("c\(index)-\(n)", bytes: 200)])))
                }
            }
        }
        try await group.waitForAll()
    }
    figures.concurrent = 8000 / seconds(clock.now - start)
    for client in connections { await client.close() }

    // Batches: 20 × 1,000 items.
    start = clock.now
    for batch in 0..<20 {
        let items = (0..<1000).map { item("b\(batch)-\($0)", bytes: 200) }
        _ = try await connection.send(.insert(.init(store: "batch", items: items)))
    }
    figures.batch = 20_000 / seconds(clock.now - start)

    // Read 10,000 × 1 KB.
    for batch in 0..<10 {
        _ = try await connection.send(.insert(.init(store: "read", items: (0..<1000).map { item("r\(batch)-\($0)", bytes: 1000) })))
    }
    var reads: [Double] = []
    for _ in 0..<5 {
        start = clock.now
        guard case .rangeResult(let range) = try await connection.send(.queryRange(.init(store: "read"))),
            range.elements.count == 10_000
        else { fatalError("the read did not return 10,000 items") }
        reads.append(seconds(clock.now - start))
    }
    figures.read10k = median(reads)
    await connection.close()
    return figures
}

/// 10,000 single-item inserts from 8 connections at once (1,250 each, each waiting for its answer): writes/s.
func burst(_ daemon: DaemonProcess) async throws -> Double {
    var connections: [BrokerConnection] = []
    for _ in 0..<8 { connections.append(try await daemon.connect()) }
    let clock = ContinuousClock()
    let start = clock.now
    try await withThrowingTaskGroup(of: Void.self) { group in
        for (index, client) in connections.enumerated() {
            group.addTask {
                for n in 0..<1250 {
                    _ = try await client.send(.insert(.init(store: "burst", items: [item("c\(index)-\(n)", bytes: 200)])))
                }
            }
        }
        try await group.waitForAll()
    }
    let rate = 10_000 / seconds(clock.now - start)
    for client in connections { await client.close() }
    return rate
}

/// The D-Bus cost: the same burst with --no-dbus, and with signals to a private dbus-daemon that a
/// dbus-monitor listens to (every signal delivered to a listener).
func dbusBurst(runs: Int) async throws {
    var template = Array("/tmp/sb-bus-XXXXXX".utf8CString)
    let directory = String(cString: mkdtemp(&template)!)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let address = "unix:path=\(directory)/bus"
    let bus = try spawn(["/usr/bin/dbus-daemon", "--session", "--nofork", "--address=\(address)"], output: directory + "/bus.log")
    defer { stopProcess(bus) }
    try await Task.sleep(for: .milliseconds(300))
    let monitorOutput = directory + "/monitor.out"
    let monitor = try spawn(
        ["/usr/bin/dbus-monitor", "--address", address, "type='signal',interface='org.storebroker.StoreBroker1'"], output: monitorOutput)
    defer { stopProcess(monitor) }
    var without: [Double] = []
    var with: [Double] = []
    for _ in 0..<runs {
        let plain = try DaemonProcess(engine: "sqlite")
        without.append(try await burst(plain))
        plain.stop()
        let signalling = try DaemonProcess(engine: "sqlite", dbus: address)
        with.append(try await burst(signalling))
        signalling.stop()
    }
    try await Task.sleep(for: .milliseconds(500))
    let text = (try? String(contentsOfFile: monitorOutput, encoding: .utf8)) ?? ""
    let signals = text.components(separatedBy: "member=StoreEvent").count - 1
    let ids = text.components(separatedBy: "      string \"c").count - 1
    print("| burst of 10,000 writes (8 clients, sqlite) | writes/s |")
    print("|---|---:|")
    print("| --no-dbus | \(String(format: "%.0f", median(without))) |")
    print("| D-Bus on, dbus-monitor listening | \(String(format: "%.0f", median(with))) |")
    print("")
    print("ratio (D-Bus on / off): \(String(format: "%.2f", median(with) / median(without))); runs off: "
        + without.map { String(format: "%.0f", $0) }.joined(separator: ", ") + "; on: " + with.map { String(format: "%.0f", $0) }.joined(separator: ", "))
    print("the monitor received \(signals) StoreEvent signals carrying \(ids) ids for \(10_000 * runs) writes")
}

/// A note as RemoteStore sees it (a 200-byte item, like the load generator's -d 200).
struct Note: Codable, Identifiable, Sendable {
    var id: String
    var text: String
}

/// What this process used: CPU seconds (user + system, every thread) and context switches (voluntary and not).
func processUsage() -> (cpu: Double, switches: Int) {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    let cpu = Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    return (cpu, usage.ru_nvcsw + usage.ru_nivcsw)
}

/// What `measureInserts` hands each call, made before it runs: `value(n)` for n in -100..<count (its warm-up's
/// negative `n` included).
func prepared<Value>(_ count: Int, _ make: (Int) -> Value) -> (Int) -> Value {
    let values = (-100..<count).map(make)
    return { values[$0 + 100] }
}

/// Times `count` sequential calls of `insert(n)` (after 100 untimed ones, with negative `n`); prints `NAME_p50_us`, `NAME_p99_us`, and this process's CPU
/// (`NAME_cpu_us`) and context switches (`NAME_switches`) per insert.
func measureInserts(_ name: String, count: Int, _ insert: (Int) async throws -> Void) async rethrows {
    for n in 0..<100 { try await insert(-1 - n) }  // warm up: the connection, the mirror's load, lazy metadata
    let clock = ContinuousClock()
    var latencies: [Double] = []
    latencies.reserveCapacity(count)
    let before = processUsage()
    for n in 0..<count {
        let start = clock.now
        try await insert(n)
        latencies.append(seconds(clock.now - start))
    }
    let after = processUsage()
    print("\(name)_p50_us \(median(latencies) * 1e6)")
    print("\(name)_p99_us \(percentile(latencies, 0.99) * 1e6)")
    print("\(name)_cpu_us \((after.cpu - before.cpu) * 1e6 / Double(count))")
    print("\(name)_switches \(Double(after.switches - before.switches) / Double(count))")
}

/// 2,000 sequential inserts of one 200-byte item through BrokerConnection, then through RemoteStore.insert (which
/// also waits for its mirror to show the write), from an ordinary task and from one on the client's executor;
/// one "name value" per line (see measureInserts). The items are made before the clock starts (`prepared`): a
/// call is timed, not the app's making of its value (the load generator, likewise, times from its flush).
func libraryLatency(socket: String, shapes: Set<String>, count: Int) async throws {
    let pad = padding(200)
    if shapes.contains("connection") {
        let connection = try await BrokerConnection.connect(socketPath: socket, clientName: "broker-bench")
        let requests = prepared(count) { ClientMessage.insert(.init(store: "library-connection", items: [item("\($0)", pad: pad)])) }
        try await measureInserts("connection", count: count) { n in _ = try await connection.send(requests(n)) }
        await connection.close()
    }
    let client = BrokerClient(socketPath: socket, clientName: "broker-bench")
    if shapes.contains("client_executor") {
        // The connection's own cost without JSON or a mirror: raw inserts from a task on the client's executor.
        let requests = prepared(count) { ClientMessage.insert(.init(store: "library-raw", items: [item("\($0)", pad: pad)])) }
        try await withTaskExecutorPreference(client.executor) {
            try await measureInserts("client_executor", count: count) { n in _ = try await client.send(requests(n)) }
        }
    }
    // Loaded before the clock starts: an app's first write waits for its mirror's load, not each one after it
    // (a round on a store earlier rounds filled otherwise decoded those items within its measured inserts).
    let store = try await RemoteStore<Note>(client: client, loading: "library-store")
    let text = String(repeating: "x", count: 180)
    if shapes.contains("remotestore") {
        let notes = prepared(count) { Note(id: "\($0)", text: text) }
        try await measureInserts("remotestore", count: count) { n in try await store.insert(notes(n)) }
    }
    if shapes.contains("executor") {
        // The same from a task that prefers the client's executor: no hand-off between threads per request.
        let notes = prepared(count) { Note(id: "e\($0)", text: text) }
        try await withTaskExecutorPreference(client.executor) {
            try await measureInserts("remotestore_executor", count: count) { n in try await store.insert(notes(n)) }
        }
    }
    store.close()
    await client.close()
    if shapes.contains("mirror") {
        for size in [100, 100_000] {
            print("mirror_\(size)_events_per_s \(try await mirrorApplyRate(socket: socket, size: size))")
        }
    }
}

/// Events per second a RemoteStore mirror of `size` items applies: another connection pipelines 20,000
/// single-item inserts (windows of 500) while the mirror follows; timed from the first send until the mirror
/// holds the last commit. The same rate for 100 and 100,000 items means an event costs what it changes, not a
/// copy of the table.
func mirrorApplyRate(socket: String, size: Int) async throws -> Double {
    let name = "mirror-\(size)"
    let text = String(repeating: "x", count: 180)
    func item(_ id: String, bytes: Int) -> Item { Item(id: ItemID(id), payload: Payload(#"{"id":"\#(id)","text":"\#(text)"}"#)) }
    let writer = try await BrokerConnection.connect(socketPath: socket, clientName: "broker-bench-writer")
    for start in stride(from: 0, to: size, by: 10_000) {
        let items = (start..<min(size, start + 10_000)).map { item("\($0)", bytes: 200) }
        _ = try await writer.send(.insert(.init(store: name, items: items)))
    }
    let client = BrokerClient(socketPath: socket, clientName: "broker-bench-mirror")
    let store = try await RemoteStore<Note>(client: client, loading: name)
    let events = 20_000
    let clock = ContinuousClock()
    let start = clock.now
    var last: UInt64 = 0
    for window in stride(from: 0, to: events, by: 500) {
        let requests = (window..<window + 500).map { ClientMessage.insert(.init(store: name, items: [item("new-\($0)", bytes: 200)])) }
        for case .success(.writeResult(let result)) in try await writer.send(requests) { last = max(last, result.sequence) }
    }
    try await store.waitUntilSeen(sequence: last)
    let elapsed = seconds(clock.now - start)
    store.close()
    await client.close()
    await writer.close()
    return Double(events) / elapsed
}

let options = Options(Array(CommandLine.arguments.dropFirst()))
if let socket = options.librarySocket {
    try await libraryLatency(socket: socket, shapes: options.libraryShapes, count: options.libraryCount)
    exit(0)
}
if options.dbusBurst {
    try await dbusBurst(runs: options.runs)
    exit(0)
}
print("broker-bench: \(options.runs) runs per engine, medians of the runs (\(StoreBrokerVersion.string))")
print("| engine | insert p50 | insert p99 | get p50 | pipelined inserts/s | 8 clients inserts/s | batch items/s | read 10,000 × 1 KB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for engine in options.engines {
    var runs: [Figures] = []
    for _ in 0..<options.runs { runs.append(try await measure(engine: engine)) }
    let collected = runs
    func m(_ key: KeyPath<Figures, Double> & Sendable) -> Double { median(collected.map { $0[keyPath: key] }) }
    print(
        "| \(engine) | \(String(format: "%.0f µs", m(\.sequentialP50) * 1e6)) | \(String(format: "%.0f µs", m(\.sequentialP99) * 1e6)) "
            + "| \(String(format: "%.0f µs", m(\.getP50) * 1e6)) | \(String(format: "%.0f", m(\.pipelined))) "
            + "| \(String(format: "%.0f", m(\.concurrent))) | \(String(format: "%.0f", m(\.batch))) "
            + "| \(String(format: "%.4f s", m(\.read10k))) |")
}
