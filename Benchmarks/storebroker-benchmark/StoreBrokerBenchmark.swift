// storebroker-benchmark: the broker's protocol under load, measured the way redis-benchmark measures Redis.
//
// One event loop drives every client (redis-benchmark's default: one thread). Each client is a NIO channel
// whose handler sends the next window of -P requests from its read callback once the previous window is
// answered: no Swift task, continuation or thread hop per request, one flush per window. Requests are encoded
// with the Wire library; answers are only framed (header and `more` flag), never decoded, except that an
// `error` answer is counted. Latency is from the window's flush to the read that brought each answer, as
// redis-benchmark measures it (one clock read per read event). Each test's request is encoded once and copied
// with new ids written over its digits, as redis-benchmark fills its `__rand_int__` placeholders.
//
// Output: redis-benchmark's CSV columns with --csv (one row per test, named as -t names it), its one-line
// summary with -q, otherwise a short report. The client's own CPU time per request is printed too (on stderr
// with --csv), so its share of the cost is visible.
import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
import Wire

enum BenchTest: String, CaseIterable, ExpressibleByArgument {
    case ping, insert, get, batch, chain, range, fanout
}

@main
struct StoreBrokerBenchmark: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "storebroker-benchmark",
        abstract: "Load a running storebrokerd the way redis-benchmark loads Redis.",
        discussion: """
            Tests: ping; insert (one item of -d bytes); get (one id); batch (one insert of -b items); chain (an
            atomic insert of one item and remove of another); range (queryRange of up to --range-limit items,
            0 for all); fanout (one writer commits -n single inserts at --rate per second while --subscribers
            connections follow the store: the latency is insert-to-delivery at each subscriber, -c and -P unused).
            Ids are "key:NNNNNNNNNNNN", random below -r (the same id without -r), in store "bench" (--store). get
            and range first fill the store with min(-r, 10000) items (not timed).

            Example:
              storebroker-benchmark -s /tmp/sb.sock -c 50 -n 100000 -P 16 -t insert,get --csv
            """)

    @Option(name: .customShort("s"), help: "The broker's socket.") var socket: String
    @Option(name: .customShort("c"), help: "Clients (connections).") var clients = 50
    @Option(name: .customShort("n"), help: "Requests per test.") var requests = 100_000
    @Option(name: .customShort("P"), help: "Requests in flight per client (a window, one flush).") var pipeline = 1
    @Option(name: .customShort("d"), help: "Item payload bytes.") var dataSize = 3
    @Option(name: .customShort("r"), help: "Random ids below this (0: one id).") var keyspace = 0
    @Option(name: .customShort("b"), help: "Items per request in the batch test.") var batchItems = 100
    @Option(name: .customShort("t"), help: "Tests, comma-separated.") var tests = "ping,insert,get,batch,chain,range"
    @Option(help: "The store.") var store = "bench"
    @Option(help: "Items per range request (0: all).") var rangeLimit = 100
    @Option(help: "fanout: subscriber connections.") var subscribers = 32
    @Option(help: "fanout: the writer's commits per second.") var rate = 1000
    @Option(help: "fanout: the broker the writer commits through (default: -s). Another broker sharing the store (docs/DISTRIBUTED.md) makes the latency cross-broker.")
    var writerSocket: String?
    @Flag(help: "Ids 0, 1, 2... in sending order instead of random ones (to fill a store).") var sequentialIds = false
    @Flag(help: "redis-benchmark's CSV.") var csv = false
    @Flag(name: .customShort("q"), help: "One line per test.") var quiet = false

    func validate() throws {
        guard clients >= 1, requests >= 1, pipeline >= 1, dataSize >= 0, keyspace >= 0, batchItems >= 1 else {
            throw ValidationError("-c, -n, -P and -b must be at least 1; -d and -r at least 0")
        }
        for name in tests.split(separator: ",") where BenchTest(rawValue: String(name)) == nil {
            throw ValidationError("unknown test \(name); tests: \(BenchTest.allCases.map(\.rawValue).joined(separator: ","))")
        }
    }

    func run() throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? group.syncShutdownGracefully() }
        if csv {
            print("\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"")
        }
        for name in tests.split(separator: ",") {
            let test = BenchTest(rawValue: String(name))!
            let workload = Workload(
                test: test, store: store, dataSize: dataSize, keyspace: keyspace, batchItems: batchItems,
                rangeLimit: rangeLimit)
            workload.sequentialKeys = sequentialIds
            if test == .get || test == .range {
                try fill(group: group)
            }
            if test == .fanout {
                report(test, try FanOut.measure(
                    socket: socket, writerSocket: writerSocket ?? socket, store: store, subscribers: subscribers,
                    commits: requests, rate: rate, dataSize: dataSize, group: group))
                continue
            }
            let result = try Run.measure(
                workload, socket: socket, clients: clients, requests: requests, pipeline: pipeline, group: group)
            report(test, result)
        }
    }

    /// Puts min(-r, 10000) items in the store, so that get and range find something.
    private func fill(group: MultiThreadedEventLoopGroup) throws {
        let count = min(max(keyspace, 1), 10_000)
        let filler = Workload(
            test: .batch, store: store, dataSize: dataSize, keyspace: 0, batchItems: min(count, 100), rangeLimit: 0)
        filler.sequentialKeys = true
        _ = try Run.measure(
            filler, socket: socket, clients: 1, requests: (count + 99) / 100, pipeline: 16, group: group)
    }

    private func report(_ test: BenchTest, _ result: Run.Result) {
        let cpu = String(format: "%.1f", result.cpuMicrosecondsPerRequest)
        if csv {
            print(
                "\"\(test.rawValue)\",\"\(f(result.requestsPerSecond))\",\"\(ms(result.average))\",\"\(ms(result.percentile(0)))\","
                    + "\"\(ms(result.percentile(50)))\",\"\(ms(result.percentile(95)))\",\"\(ms(result.percentile(99)))\","
                    + "\"\(ms(result.percentile(100)))\"")
            FileHandle.standardError.write(Data("# \(test.rawValue): client CPU \(cpu) µs per request, \(result.errors) errors\n".utf8))
        } else if quiet {
            print("\(test.rawValue): \(f(result.requestsPerSecond)) requests per second, p50=\(f(result.percentile(50))) msec, client CPU \(cpu) µs/request")
        } else {
            print("====== \(test.rawValue) ======")
            print("  \(result.requests) requests completed in \(f(result.seconds)) seconds")
            print("  \(clients) parallel clients, pipeline \(pipeline), \(dataSize) bytes payload, \(result.errors) errors")
            print("  latency (msec): avg \(f(result.average)) min \(f(result.percentile(0))) p50 \(f(result.percentile(50))) p95 \(f(result.percentile(95))) p99 \(f(result.percentile(99))) max \(f(result.percentile(100)))")
            print("  throughput: \(f(result.requestsPerSecond)) requests per second")
            print("  client CPU: \(cpu) µs per request")
        }
    }

    private func f(_ value: Double) -> String { String(format: "%.3f", value) }
    /// A latency in the CSV, in milliseconds to a tenth of a microsecond (redis-benchmark writes whole ones:
    /// for a p50 near 14 µs that moved a ratio against it by up to 7%).
    private func ms(_ value: Double) -> String { String(format: "%.4f", value) }
}

/// What one test sends. Encodes each request into the window's buffer.
final class Workload: @unchecked Sendable {
    let test: BenchTest
    let store: String
    let payload: Payload
    let keyspace: Int
    let batchItems: Int
    let rangeLimit: Int
    /// Ids 0, 1, 2... instead of random ones (filling the store).
    var sequentialKeys = false
    private var next = 0
    /// A fast generator seeded once (as redis-benchmark uses `random()`): the system generator costs a
    /// `getrandom` system call per id, which weighed more than the daemon's work on a batch.
    private var random = SplitMix64(seed: UInt64.random(in: 0...UInt64.max))

    init(test: BenchTest, store: String, dataSize: Int, keyspace: Int, batchItems: Int, rangeLimit: Int) {
        self.test = test
        self.store = store
        self.payload = Payload(ByteBuffer(repeating: UInt8(ascii: "x"), count: dataSize))
        self.keyspace = keyspace
        self.batchItems = batchItems
        self.rangeLimit = rangeLimit
    }

    /// The test's request encoded once, with where each id's digits lie (`.none` until the first request;
    /// `.unusable` when it does not fit one frame, and the request is then encoded each time).
    private var template = TemplateState.none

    private enum TemplateState {
        case none
        case unusable
        case ready(frame: ByteBuffer, digits: [Int])
    }

    private func keyNumber() -> Int {
        if sequentialKeys {
            defer { next += 1 }
            return next
        }
        return keyspace > 0 ? Int.random(in: 0..<keyspace, using: &random) : 0
    }

    private func key() -> ItemID { ItemID(Self.keyText(keyNumber())) }

    /// Writes `number` as the 12 digits of a key (see `keyText`) at `offset`.
    private static func writeDigits(_ number: Int, at offset: Int, in bytes: UnsafeMutableRawBufferPointer) {
        var value = number
        for index in (0..<12).reversed() {
            bytes[offset + index] = UInt8(ascii: "0") + UInt8(value % 10)
            value /= 10
        }
    }

    /// The test's request encoded once with distinct placeholder ids, and the offset of each id's digits in it, in
    /// the order `key()` is asked for them; `.unusable` when it spans frames.
    private func makeTemplate(maxFrameLength: Int) throws(WireError) -> TemplateState {
        var placeholders: [String] = []
        let message = self.message { () -> ItemID in
            placeholders.append(Self.keyText(900_000_000_000 + placeholders.count))
            return ItemID(placeholders[placeholders.count - 1])
        }
        var frame = ByteBuffer()
        try message.encode(id: 0, maxFrameLength: maxFrameLength, into: &frame)
        let bytes = Array(frame.readableBytesView)
        // One frame only: a batch split into continuation frames is encoded each time.
        guard bytes.count == WireProtocol.headerLength + Int(frame.getInteger(at: 0, as: UInt32.self)!) else {
            return .unusable
        }
        var digits: [Int] = []
        var from = WireProtocol.headerLength
        for placeholder in placeholders {
            let text = Array(placeholder.utf8)
            guard from <= bytes.count - text.count,
                let found = (from...(bytes.count - text.count)).first(where: { bytes[$0..<$0 + text.count].elementsEqual(text) })
            else { return .unusable }
            digits.append(found + 4)
            from = found + text.count
        }
        return .ready(frame: frame, digits: digits)
    }

    /// `key:` and `number` in 12 digits, written in place (as redis-benchmark fills its `__rand_int__`): the
    /// client's cost per id must not weigh on the daemon's figures.
    static func keyText(_ number: Int) -> String {
        String(unsafeUninitializedCapacity: 16) { bytes in
            var value = number
            for (index, byte) in "key:".utf8.enumerated() { bytes[index] = byte }
            for index in (4..<16).reversed() {
                bytes[index] = UInt8(ascii: "0") + UInt8(value % 10)
                value /= 10
            }
            return 16
        }
    }

    /// The test's request, its ids from `key`, in order.
    private func message(key: () -> ItemID) -> ClientMessage {
        switch test {
        case .ping, .fanout: .ping(.init())  // fanout is measured by FanOut
        case .insert: .insert(.init(store: store, items: [Item(id: key(), payload: payload)]))
        case .get: .getItems(.init(store: store, ids: [key()]))
        case .batch: .insert(.init(store: store, items: (0..<batchItems).map { _ in Item(id: key(), payload: payload) }))
        case .chain: .chain(.init(store: store, steps: [.insert(items: [Item(id: key(), payload: payload)]), .remove(ids: [key()])]))
        case .range: .queryRange(.init(store: store, limit: UInt32(rangeLimit)))
        }
    }

    /// As redis-benchmark fills its `__rand_int__` placeholders: the request is encoded once, then each copy gets
    /// new ids written over the digits and its own request id (encoding each request, its item array and its id
    /// string, cost the client more than redis-benchmark spends per request). The daemon decodes every one whole.
    func encode(id: UInt32, maxFrameLength: Int, into out: inout ByteBuffer) throws(WireError) {
        if case .none = template { template = try makeTemplate(maxFrameLength: maxFrameLength) }
        guard case .ready(let frame, let digits) = template else {
            return try message(key: key).encode(id: id, maxFrameLength: maxFrameLength, into: &out)
        }
        let start = out.writerIndex - out.readerIndex
        out.writeImmutableBuffer(frame)
        out.withUnsafeMutableReadableBytes { bytes in
            let request = UnsafeMutableRawBufferPointer(rebasing: bytes[start...])
            request.storeBytes(of: id.bigEndian, toByteOffset: 8, as: UInt32.self)
            for offset in digits { Self.writeDigits(keyNumber(), at: offset, in: request) }
        }
    }
}

/// One test's run: every client on the one event loop; counters touched only there.
final class Run: @unchecked Sendable {
    struct Result {
        var requests: Int
        var seconds: Double
        var errors: Int
        /// Milliseconds, sorted.
        var latencies: [Double]
        var cpuSeconds: Double

        var requestsPerSecond: Double { Double(requests) / seconds }
        var average: Double { latencies.isEmpty ? 0 : latencies.reduce(0, +) / Double(latencies.count) }
        var cpuMicrosecondsPerRequest: Double { cpuSeconds * 1e6 / Double(max(requests, 1)) }

        func percentile(_ p: Double) -> Double {
            guard !latencies.isEmpty else { return 0 }
            let index = Int((p / 100 * Double(latencies.count - 1)).rounded())
            return latencies[min(max(index, 0), latencies.count - 1)]
        }
    }

    let workload: Workload
    let total: Int
    let pipeline: Int
    var issued = 0
    var answered = 0
    /// Clients whose handshake is done.
    var connected = 0
    var errors = 0
    var failure: (any Error)?
    /// Nanoseconds from a window's flush to each answer.
    var latencies: [UInt64]
    let done: EventLoopPromise<Void>

    init(workload: Workload, total: Int, pipeline: Int, done: EventLoopPromise<Void>) {
        self.workload = workload
        self.total = total
        self.pipeline = pipeline
        self.done = done
        latencies = []
        latencies.reserveCapacity(total)
    }

    /// How many requests the next window of a client may carry.
    func claim() -> Int {
        let count = min(pipeline, total - issued)
        issued += count
        return count
    }

    /// `count` answers arrived in one read, `latency` nanoseconds after their window's flush (one clock read per
    /// read, as redis-benchmark takes one per read event).
    func answered(_ count: Int, latency: UInt64, errors: Int) {
        latencies.append(contentsOf: repeatElement(latency, count: count))
        answered += count
        self.errors += errors
        if answered == total { done.succeed(()) }
    }

    func fail(_ error: any Error) {
        if failure == nil {
            failure = error
            done.fail(error)
        }
    }

    static func measure(
        _ workload: Workload, socket: String, clients: Int, requests: Int, pipeline: Int,
        group: MultiThreadedEventLoopGroup
    ) throws -> Result {
        let loop = group.next()
        let run = Run(workload: workload, total: requests, pipeline: pipeline, done: loop.makePromise())
        let ready = loop.makePromise(of: Void.self)
        let bootstrap = ClientBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(BenchClient(run: run, ready: ready, clients: clients))
                }
            }
        // Connect and handshake every client first; then all start together.
        var channels: [any Channel] = []
        for _ in 0..<clients {
            channels.append(try bootstrap.connect(unixDomainSocketPath: socket).wait())
        }
        try ready.futureResult.wait()
        let all = channels
        let cpuBefore = cpuSeconds()
        let start = DispatchTime.now().uptimeNanoseconds
        try loop.submit {
            for channel in all {
                try channel.pipeline.syncOperations.handler(type: BenchClient.self).start()
            }
        }.wait()
        try run.done.futureResult.wait()
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
        let cpu = cpuSeconds() - cpuBefore
        for channel in channels { try? channel.close().wait() }
        let latencies = try loop.submit { run.latencies.sorted().map { Double($0) / 1e6 } }.wait()
        return Result(requests: requests, seconds: seconds, errors: run.errors, latencies: latencies, cpuSeconds: cpu)
    }
}

/// This process's CPU time (user + system), in seconds.
func cpuSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
        + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

/// One connection: hello, then windows of requests sent from the read callback.
final class BenchClient: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let run: Run
    private let ready: EventLoopPromise<Void>
    private let clients: Int
    private var context: ChannelHandlerContext?
    private var input = ByteBuffer()
    private var established = false
    private var maxFrameLength = WireProtocol.defaultMaxFrameLength
    private var outstanding = 0
    private var windowStart: UInt64 = 0
    private var nextID: UInt32 = 1
    private var lastWindowBytes = 256

    init(run: Run, ready: EventLoopPromise<Void>, clients: Int) {
        self.run = run
        self.ready = ready
        self.clients = clients
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

    func channelActive(context: ChannelHandlerContext) {
        do {
            context.writeAndFlush(wrapOutboundOut(try ClientSession(clientName: "storebroker-benchmark").hello()), promise: nil)
        } catch {
            run.fail(error)
        }
    }

    func start() { sendWindow() }

    private func sendWindow() {
        guard let context else { return }
        let count = run.claim()
        guard count > 0 else { return }
        // Encoded into a local buffer (a stored one is an exclusivity check per request) with room for the last
        // window's bytes.
        var out = context.channel.allocator.buffer(capacity: lastWindowBytes)
        let workload = run.workload
        var id = nextID
        do {
            for _ in 0..<count {
                try workload.encode(id: id, maxFrameLength: maxFrameLength, into: &out)
                id &+= 1
            }
        } catch {
            return run.fail(error)
        }
        nextID = id
        lastWindowBytes = out.readableBytes
        outstanding = count
        windowStart = DispatchTime.now().uptimeNanoseconds
        context.writeAndFlush(wrapOutboundOut(out), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        if input.readableBytes == 0 {
            // The usual case: whole frames, read where NIO put them; only a partial one is kept.
            frames(in: &bytes)
            if bytes.readableBytes > 0 { input.writeBuffer(&bytes) }
        } else {
            input.writeBuffer(&bytes)
            var buffered = ByteBuffer()
            swap(&buffered, &input)
            frames(in: &buffered)
            buffered.discardReadBytes()
            swap(&buffered, &input)
        }
    }

    /// Takes the whole frames at the front of `buffer`: counts the answers (once per read), and sends the next
    /// window when this one is answered.
    private func frames(in buffer: inout ByteBuffer) {
        var answers = 0
        var errors = 0
        while buffer.readableBytes >= WireProtocol.headerLength,
            let length = buffer.getInteger(at: buffer.readerIndex, as: UInt32.self),
            buffer.readableBytes >= WireProtocol.headerLength + Int(length)
        {
            let type = buffer.getInteger(at: buffer.readerIndex + 4, as: UInt8.self)!
            let flags = FrameFlags(rawValue: buffer.getInteger(at: buffer.readerIndex + 5, as: UInt8.self)!)
            if !established {
                // The welcome (or a refusal), decoded once: its frame limit bounds our requests.
                let decoder = FrameDecoder(maxFrameLength: WireProtocol.handshakeMaxFrameLength)
                guard let frame = try? decoder.decode(&buffer), case .welcome(let welcome)? = try? ServerMessage(frame: frame) else {
                    let failure = BenchFailure("the broker refused the handshake (type 0x\(String(type, radix: 16)))")
                    ready.fail(failure)
                    return run.fail(failure)
                }
                maxFrameLength = Int(welcome.maxFrameLength)
                established = true
                run.connected += 1
                if run.connected == clients { ready.succeed(()) }
                continue
            }
            buffer.moveReaderIndex(forwardBy: WireProtocol.headerLength + Int(length))
            guard !flags.contains(.more) else { continue }  // the rest of a multi-frame answer follows
            answers += 1
            if type == MessageType.error.rawValue { errors += 1 }
        }
        guard answers > 0 else { return }
        outstanding -= answers
        run.answered(answers, latency: DispatchTime.now().uptimeNanoseconds - windowStart, errors: errors)
        if outstanding == 0 { sendWindow() }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        run.fail(error)
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        if run.answered < run.total { run.fail(BenchFailure("the broker closed a connection")) }
    }
}

struct BenchFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// fanout: one writer at a fixed rate, many subscribers; latency from the insert's send to its delivery at
/// each subscriber (payloads carry the send time; one process, one clock).
final class FanOut: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Shared by the writer and the subscribers, on the one event loop.
    final class State: @unchecked Sendable {
        var latencies: [UInt64] = []
        var delivered = 0
        var expected = 0
        var subscribed = 0
        let allSubscribed: EventLoopPromise<Void>
        let done: EventLoopPromise<Void>
        init(loop: any EventLoop) {
            allSubscribed = loop.makePromise()
            done = loop.makePromise()
        }
    }

    private let state: State
    private let store: String
    private let subscribers: Int
    private var session = ClientSession(clientName: "storebroker-benchmark")
    private var input = ByteBuffer()

    init(state: State, store: String, subscribers: Int) {
        self.state = state
        self.store = store
        self.subscribers = subscribers
    }

    func channelActive(context: ChannelHandlerContext) {
        do {
            context.write(wrapOutboundOut(try session.hello()), promise: nil)
            var out = ByteBuffer()
            try session.encode(.subscribe(.init(name: store)), id: 1, into: &out)
            context.writeAndFlush(wrapOutboundOut(out), promise: nil)
        } catch {
            state.done.fail(error)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        input.writeBuffer(&bytes)
        while let event = session.next(from: &input) {
            switch event {
            case .established: continue
            case .failed(let error):
                state.allSubscribed.fail(error)
                state.done.fail(error)
            case .message(_, .storeLoaded):
                state.subscribed += 1
                if state.subscribed == subscribers { state.allSubscribed.succeed(()) }
            case .message(_, .storeEvent(let event)):
                let now = DispatchTime.now().uptimeNanoseconds
                for case .insert(let records) in event.elements {
                    for record in records {
                        guard let sent = record.payload.bytes.getInteger(at: record.payload.bytes.readerIndex, as: UInt64.self)
                        else { continue }
                        state.latencies.append(now - sent)
                        state.delivered += 1
                        if state.delivered == state.expected { state.done.succeed(()) }
                    }
                }
            case .message(_, .lagged):
                state.done.fail(BenchFailure("a subscriber lagged"))
            case .message: continue
            }
        }
        input.discardReadBytes()
    }

    static func measure(
        socket: String, writerSocket: String, store: String, subscribers: Int, commits: Int, rate: Int, dataSize: Int,
        group: MultiThreadedEventLoopGroup
    ) throws -> Run.Result {
        let loop = group.next()
        let state = State(loop: loop)
        state.expected = subscribers * commits
        var channels: [any Channel] = []
        for _ in 0..<subscribers {
            channels.append(
                try ClientBootstrap(group: loop)
                    .channelInitializer { channel in
                        channel.eventLoop.makeCompletedFuture {
                            try channel.pipeline.syncOperations.addHandler(
                                FanOut(state: state, store: store, subscribers: subscribers))
                        }
                    }
                    .connect(unixDomainSocketPath: socket).wait())
        }
        try state.allSubscribed.futureResult.wait()
        // The writer: one insert every 1/rate s on its own connection, its answers only read.
        let writerReady = loop.makePromise(of: Void.self)
        let writerChannel = try ClientBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(AnswerSink(ready: writerReady))
                }
            }
            .connect(unixDomainSocketPath: writerSocket).wait()
        try writerReady.futureResult.wait()
        let padding = max(0, dataSize - 8)
        let cpuBefore = cpuSeconds()
        let start = DispatchTime.now().uptimeNanoseconds
        let interval = max(1, 1_000_000_000 / max(rate, 1))
        let counter = WriterCounter()
        let sent = try loop.submit { () -> RepeatedTask in
            loop.scheduleRepeatedTask(initialDelay: .zero, delay: .nanoseconds(Int64(interval))) { task in
                // Catch up to the schedule: commits due by now go out, each stamped when written.
                let due = min(commits, Int((DispatchTime.now().uptimeNanoseconds - start) / UInt64(interval)) + 1)
                var out = ByteBuffer()
                while counter.count < due {
                    var payload = ByteBuffer()
                    payload.writeInteger(DispatchTime.now().uptimeNanoseconds)
                    payload.writeRepeatingByte(UInt8(ascii: "x"), count: padding)
                    let key = ItemID("key:\(counter.count)")
                    try? ClientMessage.insert(.init(store: store, items: [Item(id: key, payload: Payload(payload))]))
                        .encode(id: UInt32(truncatingIfNeeded: counter.count + 1), maxFrameLength: WireProtocol.defaultMaxFrameLength, into: &out)
                    counter.count += 1
                }
                writerChannel.writeAndFlush(out, promise: nil)
                if counter.count == commits { task.cancel() }
            }
        }.wait()
        try state.done.futureResult.wait()
        sent.cancel()
        let seconds = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
        let cpu = cpuSeconds() - cpuBefore
        for channel in channels + [writerChannel] { try? channel.close().wait() }
        let latencies = try loop.submit { state.latencies.sorted().map { Double($0) / 1e6 } }.wait()
        return Run.Result(requests: commits, seconds: seconds, errors: 0, latencies: latencies, cpuSeconds: cpu)
    }
}

/// The fan-out writer's progress (touched on the event loop only).
final class WriterCounter: @unchecked Sendable {
    var count = 0
}

/// A connection that says hello and then only reads (the fan-out writer's answers).
final class AnswerSink: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private let ready: EventLoopPromise<Void>
    private var welcomed = false

    init(ready: EventLoopPromise<Void>) {
        self.ready = ready
    }

    func channelActive(context: ChannelHandlerContext) {
        do {
            context.writeAndFlush(wrapOutboundOut(try ClientSession(clientName: "storebroker-benchmark").hello()), promise: nil)
        } catch {
            ready.fail(error)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if !welcomed {
            welcomed = true
            ready.succeed(())
        }
    }
}

/// SplitMix64: statistically good enough for picking ids, a few instructions per number.
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
