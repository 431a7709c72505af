import Foundation
import TestSupport

/// Mutated frames, seeded from the protocol's test vectors, sent over many raw connections (most after a valid
/// `hello`, so the message decoders and the session see them, not only the handshake; now and then a client
/// dies in the middle of a large frame) while a well-behaved client pings: the daemon must not crash, no ping may fail, and its descriptors and resident memory must come
/// back near their baseline once the fuzzing connections are gone.
struct LiveFuzzScenario {
    var frames: Int
    var connections: Int
    var vectorsPath: String
    var seed: UInt64

    func run() async throws -> [String: Any] {
        let (hello, seeds) = try Self.seeds(from: vectorsPath)
        let findings = Findings()
        return try await withTemporaryDirectory(prefix: "sb-fuzz") { directory in
            let broker = Broker(in: directory, arguments: ["--engine", "memory", "--frame-timeout", "2"])
            try await broker.start()
            let pinger = Pinger(broker: broker)
            pinger.start()
            try await Task.sleep(for: .seconds(1))
            let baselineDescriptors = broker.descriptors
            let baselineResident = broker.residentBytes

            let started = Date()
            let totals = await FuzzWorkers(
                socketPath: broker.socketPath, hello: hello, seeds: seeds, frames: frames, workers: connections,
                seed: seed
            ).run()
            let elapsed = Date().timeIntervalSince(started)
            let peakResident = broker.residentBytes

            // The daemon closes what the fuzzers left half open (their frames time out after 2 s).
            var descriptors = broker.descriptors
            let deadline = Date().addingTimeInterval(15)
            while descriptors > baselineDescriptors, Date() < deadline {
                try await Task.sleep(for: .milliseconds(200))
                descriptors = broker.descriptors
            }
            let resident = broker.residentBytes
            let pings = await pinger.stop()
            let alive = broker.isAlive
            if !alive { findings.record("daemon crashed", (try? String(contentsOfFile: broker.logPath, encoding: .utf8)) ?? "") }
            if pings.failed > 0 { findings.record("ping failed", pings.firstError ?? "") }
            if pings.succeeded == 0 { findings.record("ping failed", "no ping answered") }
            if descriptors > baselineDescriptors {
                findings.record("descriptors leaked", "\(descriptors) open after, \(baselineDescriptors) before")
            }
            let allowance = 64 << 20
            if resident > baselineResident + allowance {
                findings.record("memory not returned", "\(resident >> 20) MiB after, \(baselineResident >> 20) MiB before")
            }
            if alive { await broker.stop() }
            findings.report()
            return [
                "scenario": "live-fuzz", "frames": totals.frames, "connections": totals.connections,
                "closed_by_daemon": totals.closedByDaemon, "answer_bytes": totals.answerBytes,
                "large_frames_cut": totals.largeFramesCut,
                "seconds": elapsed, "pings_ok": pings.succeeded, "pings_failed": pings.failed,
                "descriptors_before": baselineDescriptors, "descriptors_after": descriptors,
                "resident_mib_before": Double(baselineResident) / 1_048_576,
                "resident_mib_peak": Double(peakResident) / 1_048_576,
                "resident_mib_after": Double(resident) / 1_048_576, "seed": String(seed),
                "violations": findings.summary, "passed": findings.isEmpty,
            ]
        }
    }

    /// The `hello` vector and every client vector's frames.
    static func seeds(from path: String) throws -> (hello: [UInt8], seeds: [[UInt8]]) {
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        guard let root = try JSONSerialization.jsonObject(with: data) as? [String: Any],
            let vectors = root["vectors"] as? [[String: Any]]
        else { throw Failure("\(path): no vectors") }
        var hello: [UInt8] = []
        var seeds: [[UInt8]] = []
        for vector in vectors where vector["direction"] as? String == "client" {
            guard let hex = vector["hex"] as? String else { continue }
            let bytes = stride(from: 0, to: hex.count, by: 2).compactMap {
                UInt8(hex.dropFirst($0).prefix(2), radix: 16)
            }
            if vector["type"] as? String == "hello" { hello = bytes }
            seeds.append(bytes)
        }
        guard !hello.isEmpty, seeds.count > 1 else { throw Failure("\(path): no hello or too few client vectors") }
        return (hello, seeds)
    }
}

/// A well-behaved client pinging every 5 ms.
final class Pinger: @unchecked Sendable {
    let broker: Broker
    private let lock = NSLock()
    private var succeeded = 0
    private var failed = 0
    private var firstError: String?
    private var task: Task<Void, Never>?

    init(broker: Broker) { self.broker = broker }

    func start() {
        task = Task.detached { [self] in
            guard let connection = try? await broker.connect(name: "pinger") else {
                lock.withLock { failed += 1; firstError = "cannot connect" }
                return
            }
            while !Task.isCancelled {
                do {
                    try await connection.ping()
                    lock.withLock { succeeded += 1 }
                } catch {
                    lock.withLock {
                        failed += 1
                        if firstError == nil { firstError = "\(error)" }
                    }
                }
                try? await Task.sleep(for: .milliseconds(5))
            }
            await connection.close()
        }
    }

    func stop() async -> (succeeded: Int, failed: Int, firstError: String?) {
        task?.cancel()
        await task?.value
        return lock.withLock { (succeeded, failed, firstError) }
    }
}

/// Threads with blocking sockets (the cooperative pool has two threads here: never block it).
struct FuzzWorkers: Sendable {
    var socketPath: String
    var hello: [UInt8]
    var seeds: [[UInt8]]
    var frames: Int
    var workers: Int
    var seed: UInt64

    struct Totals: Sendable {
        var frames = 0
        var connections = 0
        var closedByDaemon = 0
        var answerBytes = 0
        var largeFramesCut = 0
    }

    func run() async -> Totals {
        await withCheckedContinuation { continuation in
            let tally = Tally(workers: workers)
            let share = (frames + workers - 1) / workers
            for worker in 0..<workers {
                Thread {
                    let mine = fuzz(frames: share, seed: seed &+ UInt64(worker) &* 0x9E37_79B9)
                    if let totals = tally.add(mine) { continuation.resume(returning: totals) }
                }.start()
            }
        }
    }

    /// The workers' totals; the last one to finish gets them all.
    private final class Tally: @unchecked Sendable {
        private let lock = NSLock()
        private var totals = Totals()
        private var remaining: Int

        init(workers: Int) { remaining = workers }

        func add(_ mine: Totals) -> Totals? {
            lock.withLock {
                totals.frames += mine.frames
                totals.connections += mine.connections
                totals.closedByDaemon += mine.closedByDaemon
                totals.answerBytes += mine.answerBytes
                totals.largeFramesCut += mine.largeFramesCut
                remaining -= 1
                return remaining == 0 ? totals : nil
            }
        }
    }

    private func fuzz(frames: Int, seed: UInt64) -> Totals {
        var random = SeededGenerator(state: seed)
        var totals = Totals()
        while totals.frames < frames {
            let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            guard fd >= 0, connectUnix(fd, socketPath) else {
                if fd >= 0 { close(fd) }
                usleep(10_000)
                continue
            }
            totals.connections += 1
            var timeout = timeval(tv_sec: 1, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            var open = true
            if Int.random(in: 0..<10, using: &random) < 8 {
                open = send(fd, hello)
                totals.answerBytes += drain(fd, &open)
            }
            // Now and then a client dies in the middle of a large frame: 1–4 MiB of an 8 MiB request, then gone.
            if open, Int.random(in: 0..<40, using: &random) == 0 {
                var header: [UInt8] = [0, 0x80, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 9]
                header[4] = seeds.randomElement(using: &random)![4]
                let cut = Int.random(in: 1...4, using: &random) << 20
                _ = send(fd, header + [UInt8](repeating: UInt8.random(in: 0...255, using: &random), count: cut))
                totals.largeFramesCut += 1
                close(fd)
                continue
            }
            let count = Int.random(in: 1...40, using: &random)
            for _ in 0..<count where open && totals.frames < frames {
                let frame = mutate(seeds.randomElement(using: &random)!, &random)
                totals.frames += 1
                open = send(fd, frame)
                totals.answerBytes += drain(fd, &open)
            }
            if !open { totals.closedByDaemon += 1 }
            // Sometimes the end of a frame never comes: the daemon's frame timeout has to close it.
            if open, Int.random(in: 0..<20, using: &random) == 0 {
                _ = send(fd, [0, 0, 0, 40, 0x10, 0, 0, 0, 0, 0, 0, 1, 1, 2])
            }
            close(fd)
        }
        return totals
    }

    /// One of the ways frames go wrong, applied to a valid frame.
    private func mutate(_ frame: [UInt8], _ random: inout SeededGenerator) -> [UInt8] {
        var bytes = frame
        let interesting: [UInt8] = [0, 1, 0x7F, 0x80, 0xFE, 0xFF]
        switch Int.random(in: 0..<8, using: &random) {
        case 0:  // flip bits
            for _ in 0..<Int.random(in: 1...8, using: &random) {
                let at = Int.random(in: 0..<bytes.count, using: &random)
                bytes[at] ^= 1 << UInt8.random(in: 0..<8, using: &random)
            }
        case 1:  // interesting bytes in the payload
            if bytes.count > 12 {
                for _ in 0..<Int.random(in: 1...4, using: &random) {
                    bytes[Int.random(in: 12..<bytes.count, using: &random)] = interesting.randomElement(using: &random)!
                }
            }
        case 2:  // a wrong length, the payload unchanged
            let length = bytes.count - 12
            let lies = [0, 1, length - 1, length + 1, length * 2, 1024, 0x00FF_FFFF, Int(UInt32.max)]
            let lie = UInt32(truncatingIfNeeded: max(0, lies.randomElement(using: &random)!))
            withUnsafeBytes(of: lie.bigEndian) { bytes.replaceSubrange(0..<4, with: $0) }
        case 3:  // cut short
            bytes = Array(bytes.prefix(Int.random(in: 0..<bytes.count, using: &random)))
        case 4:  // an unknown or misplaced type
            bytes[4] = UInt8.random(in: 0...255, using: &random)
        case 5:  // flags and reserved bits
            bytes[5] = UInt8.random(in: 0...255, using: &random)
        case 6:  // junk appended inside the frame (length grown to match)
            let extra = (0..<Int.random(in: 1...64, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
            bytes += extra
            let length = UInt32(bytes.count - 12)
            withUnsafeBytes(of: length.bigEndian) { bytes.replaceSubrange(0..<4, with: $0) }
        default:  // two frames glued, the first cut
            let other = seeds.randomElement(using: &random)!
            bytes = Array(bytes.prefix(Int.random(in: 1...bytes.count, using: &random))) + other
        }
        return bytes
    }

    private func send(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if sent <= 0 { return false }
            offset += sent
        }
        return true
    }

    /// Waits up to 50 ms for the daemon to answer (a frame left incomplete gets no answer), then reads what
    /// has arrived; notes a close.
    private func drain(_ fd: Int32, _ open: inout Bool) -> Int {
        var total = 0
        var chunk = [UInt8](repeating: 0, count: 65_536)
        var waiting = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&waiting, 1, 50) > 0 else { return 0 }
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if count > 0 {
                total += count
                continue
            }
            if count == 0 { open = false }
            return total
        }
    }

    private func connectUnix(_ fd: Int32, _ path: String) -> Bool {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0
            }
        }
    }
}
