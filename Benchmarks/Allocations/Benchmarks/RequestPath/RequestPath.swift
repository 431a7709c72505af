#if canImport(Glibc)
import Glibc
#endif
import Benchmark
import NIOCore
import StoreBrokerTesting
import Wire

// The daemon's request path, from the socket read to the answer's write, counted in allocations: the real daemon
// (`BrokerDaemon`, as `storebrokerd` runs it) in this process with the memory engine, and a client that writes
// pre-encoded requests and reads the answers with plain system calls into buffers made once, so that every
// malloc an iteration counts is the daemon's. One iteration is one batch: the requests written at once, every
// answer read back.
//
// What the counts must hold to (docs/BENCHMARKS.md): a ping and a get keep nothing, so their mallocs are the
// transport's; an insert keeps its item, so one allocation per item is its own bytes.

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        // Times belong to the side-by-side run (docs/BENCHMARKS.md); a static threshold on them would only
        // measure how loaded the machine is.
        metrics: [.mallocCountTotal],
        warmupIterations: 100,
        maxDuration: .seconds(2),
        maxIterations: 1_000,
        // Allocation counts, not times, are the contract: a run may be slower on a loaded machine, never
        // allocate more. A per-batch p90 more than 10% or more than 2 allocations off the committed figure fails
        // (a single insert's batch takes 14 or 15: the p90 may land on either).
        thresholds: [.mallocCountTotal: .init(relative: [.p90: 10.0], absolute: [.p90: 2])]
    )
    // A count committed as 0 has no relative tolerance (package-benchmark takes the difference to 0 as 0%): it
    // must stay 0.
    let nothing: [BenchmarkMetric: BenchmarkThresholds] = [.mallocCountTotal: .init(absolute: [.p90: 0])]
    Benchmark.setup = { try await Fixture.start() }
    Benchmark.teardown = { await Fixture.stop() }

    for batch in [1, 16] {
        for request in [Request.ping, .get, .insert] {
            let configuration = Benchmark.Configuration(
                thresholds: request == .ping ? nothing : Benchmark.defaultConfiguration.thresholds)
            Benchmark("\(request)-x\(batch)", configuration: configuration) { benchmark in
                // Found before the measurement starts: only the round trips are counted.
                let round = Fixture.shared.round(request, batch: batch)
                benchmark.startMeasurement()
                for _ in benchmark.scaledIterations { round.run() }
                benchmark.stopMeasurement()
            }
        }
    }
}

/// What one batch asks.
enum Request: Sendable {
    case ping, get, insert
}

/// The broker and one raw connection to it, made once for every benchmark of the run.
final class Fixture: @unchecked Sendable {  // used by one benchmark at a time, on the runner's thread
    nonisolated(unsafe) private static var current: Fixture?
    static var shared: Fixture { current! }

    static let store = "bench"
    static let payload = Payload(String(repeating: "x", count: 200))

    let broker: TemporaryBroker
    let socket: Int32
    var maxFrameLength = WireProtocol.defaultMaxFrameLength
    var rounds: [String: Round] = [:]

    static func start() async throws {
        guard current == nil else { return }
        let broker = try await TemporaryBroker(engine: "memory")
        let fixture = try Fixture(broker: broker)
        current = fixture
        // The ids every get asks for exist before the first get.
        fixture.round(.insert, batch: 16).run()
    }

    static func stop() async {
        guard let fixture = current else { return }
        current = nil
        close(fixture.socket)
        await fixture.broker.remove()
    }

    private init(broker: TemporaryBroker) throws {
        self.broker = broker
        socket = try Self.connect(to: broker.configuration.socketPath)
        try handshake()
    }

    /// The round for `request` in batches of `batch`, encoded once.
    func round(_ request: Request, batch: Int) -> Round {
        let key = "\(request) \(batch)"
        if let round = rounds[key] { return round }
        var bytes = ByteBuffer()
        for index in 0..<batch {
            let id = ItemID("item-\(index)")
            let message: ClientMessage =
                switch request {
                case .ping: .ping(.init())
                case .get: .getItems(.init(store: Self.store, ids: [id]))
                case .insert: .insert(.init(store: Self.store, items: [Item(id: id, payload: Self.payload)]))
                }
            try! message.encode(id: UInt32(index + 1), maxFrameLength: maxFrameLength, into: &bytes)
        }
        let round = Round(socket: socket, requests: Array(bytes.readableBytesView), answers: batch)
        rounds[key] = round
        return round
    }

    private static func connect(to path: String) throws -> Int32 {
        let fd = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw Failure("socket: errno \(errno)") }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (offset, byte) in path.utf8.enumerated() { raw[offset] = byte }
        }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard connected == 0 else { throw Failure("connect \(path): errno \(errno)") }
        return fd
    }

    private func handshake() throws {
        var session = ClientSession(clientName: "allocations")
        let hello = try session.hello()
        Round.writeAll(socket, Array(hello.readableBytesView))
        var inbound = ByteBuffer()
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = read(socket, &chunk, chunk.count)
            guard count > 0 else { throw Failure("the broker closed during the handshake") }
            inbound.writeBytes(chunk[0..<count])
            switch session.next(from: &inbound) {
            case .established(let welcome)?:
                maxFrameLength = Int(welcome.maxFrameLength)
                return
            case .failed(let error)?: throw Failure("handshake: \(error)")
            case .message?: throw Failure("a message before the welcome")
            case nil: continue
            }
        }
    }
}

/// One batch's bytes, written at once; the answers are read until `answers` whole messages have arrived (a
/// message ends with a frame without the "more follows" flag). Nothing here allocates once made.
final class Round: @unchecked Sendable {
    let socket: Int32
    let requests: [UInt8]
    let answers: Int
    private let inbound: UnsafeMutableRawBufferPointer
    private var held = 0

    init(socket: Int32, requests: [UInt8], answers: Int) {
        self.socket = socket
        self.requests = requests
        self.answers = answers
        inbound = .allocate(byteCount: 1 << 20, alignment: 8)
    }

    static func writeAll(_ socket: Int32, _ bytes: [UInt8]) {
        bytes.withUnsafeBytes { raw in
            var sent = 0
            while sent < raw.count {
                let count = write(socket, raw.baseAddress! + sent, raw.count - sent)
                precondition(count > 0, "write: errno \(errno)")
                sent += count
            }
        }
    }

    func run() {
        Self.writeAll(socket, requests)
        var complete = 0
        while complete < answers {
            let count = read(socket, inbound.baseAddress! + held, inbound.count - held)
            precondition(count > 0, "the broker closed the connection")
            held += count
            var offset = 0
            while held - offset >= WireProtocol.headerLength {
                let length = Int(UInt32(bigEndian: inbound.loadUnaligned(fromByteOffset: offset, as: UInt32.self)))
                let frame = WireProtocol.headerLength + length
                guard held - offset >= frame else { break }
                let type = inbound[offset + 4]
                precondition(type != MessageType.error.rawValue, "the broker answered with an error")
                if inbound[offset + 5] & FrameFlags.more.rawValue == 0 { complete += 1 }
                offset += frame
            }
            if offset > 0 {
                memmove(inbound.baseAddress!, inbound.baseAddress! + offset, held - offset)
                held -= offset
            }
        }
        precondition(held == 0, "more answers than requests")
    }
}

struct Failure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
