import Foundation
import NIOCore
import Testing
import TestSupport
import Wire

extension Integration {
    /// Each kind of bad input gets a clear error or a close of that connection only; the daemon keeps serving
    /// everyone else and nothing acknowledged is lost.
    @Suite struct BadInput {
        /// A write acknowledged before the bad input, and checks after it that the daemon still serves and
        /// still has it.
        private func survives(_ daemon: Daemon, _ attack: () throws -> Void) async throws {
            let before = try await daemon.storectl(["insert", "kept", #"{"id":"\#(UUID().uuidString)"}"#])
            #expect(before.status == 0)
            let count = try await daemon.storectl(["count", "kept"]).stdout
            try attack()
            #expect(try await daemon.storectl(["ping"]).stdout == "pong\n")
            #expect(try await daemon.storectl(["count", "kept"]).stdout == count)
        }

        @Test func randomBytesCloseThatConnection() async throws {
            try await Daemon.with { daemon in
                let seed = SeededGenerator.seedFromEnvironment()
                print("randomBytes: seed \(seed) (replay with STOREBROKER_TEST_SEED=\(seed))")
                var random = SeededGenerator(state: seed)
                for _ in 0..<20 {
                    try await survives(daemon) {
                        let client = try RawClient(socketPath: daemon.socketPath)
                        client.send((0..<Int(random.next() % 4096 + 1)).map { _ in UInt8(truncatingIfNeeded: random.next()) })
                        // Either an error and a close, or (bytes that look like a short frame) a close when we go.
                        if let frame = try client.nextFrame() {
                            #expect(frame.header.id == 0)
                            #expect(errorCode(of: frame) != nil)
                        }
                    }
                }
            }
        }

        @Test func truncatedFrameThenDisconnect() async throws {
            try await Daemon.with { daemon in
                try await survives(daemon) {
                    let client = try RawClient(socketPath: daemon.socketPath)
                    try client.handshake()
                    var out = ByteBuffer()
                    try ClientMessage.insert(.init(store: "kept", items: [Item(id: "x", payload: Payload("{}"))]))
                        .encode(id: 1, maxFrameLength: 1 << 20, into: &out)
                    client.send(Array(out.readableBytesView.dropLast(3)))
                }
                #expect(try await daemon.storectl(["query", "kept", "--id", "x"]).status == 66)
            }
        }

        @Test func lengthOverTheCapClosesWithFrameTooLarge() async throws {
            try await Daemon.with(arguments: ["--max-frame", "65536"]) { daemon in
                try await survives(daemon) {
                    // Before the handshake the cap is 1 KiB: an HTTP request is cut off at its first bytes.
                    let http = try RawClient(socketPath: daemon.socketPath)
                    http.send(Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8))
                    #expect(errorCode(of: try http.nextFrame()) != nil)
                    #expect(http.readsToEnd())
                    // After it, the announced cap.
                    let client = try RawClient(socketPath: daemon.socketPath)
                    #expect(try client.handshake().maxFrameLength == 65536)
                    client.send(rawFrame(type: MessageType.insert.rawValue, id: 5, payload: [], length: 65536))
                    let frame = try client.nextFrame()
                    #expect(errorCode(of: frame) == .frameTooLarge)
                    #expect(frame?.header.id == 0)
                    #expect(client.readsToEnd())
                }
            }
        }

        @Test func wrongMagicAndWrongVersionAreRefused() async throws {
            try await Daemon.with { daemon in
                try await survives(daemon) {
                    let magic = try RawClient(socketPath: daemon.socketPath)
                    magic.send(rawFrame(type: 0x01, id: 0, payload: Array("HTTP".utf8) + [1, 0, 1, 0, 0]))
                    #expect(errorCode(of: try magic.nextFrame()) == .badHandshake)
                    #expect(magic.readsToEnd())

                    let version = try RawClient(socketPath: daemon.socketPath)
                    var hello = ByteBuffer()
                    try ClientMessage.hello(.init(versions: [99, 7], clientName: "future")).encode(
                        id: 0, maxFrameLength: 1024, into: &hello)
                    version.send(hello)
                    guard case .error(let error)? = try version.nextFrame().flatMap({ try ServerMessage(frame: $0) }) else {
                        Issue.record("no error for an unsupported version")
                        return
                    }
                    #expect(error.code == .unsupportedVersion)
                    #expect(error.message.contains("99"))
                    #expect(version.readsToEnd())
                }
            }
        }

        @Test func requestBeforeHandshakeIsRefused() async throws {
            try await Daemon.with { daemon in
                try await survives(daemon) {
                    let client = try RawClient(socketPath: daemon.socketPath)
                    client.send(rawFrame(type: MessageType.ping.rawValue, id: 1, payload: []))
                    #expect(errorCode(of: try client.nextFrame()) == .badHandshake)
                    #expect(client.readsToEnd())
                }
            }
        }

        /// PROTOCOL.md §6 and §11 as the daemon does them: a first hello that does not decode is badHandshake with
        /// id 0 and a close (before: malformed); a second hello, even with a bad magic, is unexpectedMessage with
        /// its id and the connection goes on (before: badHandshake).
        @Test func helloRulesMatchTheSpecification() async throws {
            try await Daemon.with { daemon in
                try await survives(daemon) {
                    let truncated = try RawClient(socketPath: daemon.socketPath)
                    truncated.send(rawFrame(type: 0x01, id: 4, payload: [0x53, 0x42]))
                    let refusal = try truncated.nextFrame()
                    #expect(errorCode(of: refusal) == .badHandshake && refusal?.header.id == 0)
                    #expect(truncated.readsToEnd())

                    let client = try RawClient(socketPath: daemon.socketPath)
                    try client.handshake()
                    client.send(rawFrame(type: 0x01, id: 5, payload: Array("HTTP".utf8) + [1, 0, 1, 0, 0]))
                    try client.request(.ping(.init()), id: 6)
                    let second = try client.nextMessage()
                    guard case .error(let error)? = second?.message else {
                        Issue.record("expected an error, got \(String(describing: second))")
                        return
                    }
                    #expect(second?.id == 5 && error.code == .unexpectedMessage)
                    let pong = try client.nextMessage()
                    #expect(pong?.id == 6)
                }
            }
        }

        @Test func unknownTypeAndMalformedRequestsAreRefusedAloneAndTheConnectionGoesOn() async throws {
            try await Daemon.with { daemon in
                try await survives(daemon) {
                    let client = try RawClient(socketPath: daemon.socketPath)
                    try client.handshake()
                    client.send(rawFrame(type: 0x3E, id: 7, payload: [1, 2, 3]))
                    client.send(rawFrame(type: MessageType.count.rawValue, id: 8, payload: [0xFF]))  // truncated text
                    try client.request(.ping(.init()), id: 9)
                    let first = try client.nextMessage()
                    let second = try client.nextMessage()
                    let third = try client.nextMessage()
                    guard case .error(let unknown)? = first?.message, case .error(let malformed)? = second?.message else {
                        Issue.record("expected two errors, got \(String(describing: first)) \(String(describing: second))")
                        return
                    }
                    #expect(first?.id == 7 && unknown.code == .unknownMessageType)
                    #expect(second?.id == 8 && malformed.code == .malformed)
                    #expect(third?.id == 9)
                    if case .pong? = third?.message {} else { Issue.record("no pong after the refused frames") }
                }
            }
        }

        @Test func invalidNamesAndIdsAreRefusedPerRequest() async throws {
            try await Daemon.with { daemon in
                try await survives(daemon) {
                    let client = try RawClient(socketPath: daemon.socketPath)
                    try client.handshake()
                    let requests: [(ClientMessage, ErrorCode)] = [
                        (.count(.init(store: "..")), .invalidName),
                        (.count(.init(store: "")), .invalidName),
                        (.count(.init(store: "a\u{0}b")), .invalidName),
                        (.count(.init(store: String(repeating: "x", count: 129))), .invalidName),
                        (.insert(.init(store: "s", items: [Item(id: "a\u{0}", payload: Payload("1"))])), .invalidID),
                        (.insert(.init(store: "s", items: [Item(id: ItemID(String(repeating: "é", count: 513)), payload: Payload("1"))])), .invalidID),
                        (.remove(.init(store: "s", ids: [""])), .invalidID),
                        (.queryRange(.init(store: "s", after: "", limit: 0)), .invalidID),
                        (.subscribe(.init(name: "../etc")), .invalidName),
                    ]
                    for (index, (request, _)) in requests.enumerated() { try client.request(request, id: UInt32(index + 1)) }
                    for (index, (_, code)) in requests.enumerated() {
                        let answer = try client.nextMessage()
                        #expect(answer?.id == UInt32(index + 1))
                        guard case .error(let error)? = answer?.message else {
                            Issue.record("request \(index + 1) was not refused")
                            continue
                        }
                        #expect(error.code == code, "request \(index + 1): \(error.message)")
                    }
                }
                #expect(try await daemon.storectl(["stores"]).lines.count == 1)  // only "kept"
            }
        }

        @Test func clientThatDisconnectsMidRequest() async throws {
            try await Daemon.with { daemon in
                try await survives(daemon) {
                    for round in 0..<10 {
                        let client = try RawClient(socketPath: daemon.socketPath)
                        try client.handshake()
                        let items = (0..<2000).map { Item(id: ItemID("r\(round)-\($0)"), payload: Payload("{\"n\":\($0)}")) }
                        try client.request(.insert(.init(store: "gone", items: items)), id: 1)
                        // Closed before the answer: the write may or may not commit, but whole or not at all.
                    }
                }
                let count = Int(try await daemon.storectl(["count", "gone"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines))!
                #expect(count % 2000 == 0)
            }
        }

        @Test func clientThatPipelinesWithoutReadingIsThrottled() async throws {
            try await Daemon.with(arguments: ["--max-in-flight", "64"]) { daemon in
                let client = try RawClient(socketPath: daemon.socketPath)
                try client.handshake()
                // 200,000 pings (2.4 MB) written without reading, on a non-blocking socket: the daemon stops
                // reading once 64 are unanswered and its answers fill the socket, so the writes must stall.
                let flags = fcntl(client.fd, F_GETFL)
                _ = fcntl(client.fd, F_SETFL, flags | O_NONBLOCK)
                var frame = ByteBuffer()
                try ClientMessage.ping(.init()).encode(id: 1, maxFrameLength: 1 << 20, into: &frame)
                let one = Array(frame.readableBytesView)
                var sent = 0
                var stalls = 0
                let total = 200_000
                while sent < total * one.count, stalls < 50 {
                    let offset = sent % one.count
                    var chunk: [UInt8] = Array(one[offset...])
                    while chunk.count < 65536 { chunk += one }
                    let written = chunk.withUnsafeBytes { send(client.fd, $0.baseAddress, min($0.count, total * one.count - sent), Int32(MSG_NOSIGNAL)) }
                    if written > 0 {
                        sent += written
                        stalls = 0
                    } else {
                        stalls += 1
                        try await Task.sleep(for: .milliseconds(10))
                    }
                }
                #expect(sent < total * one.count, "the daemon read everything without being read from")
                // Meanwhile everyone else is served.
                #expect(try await daemon.storectl(["insert", "other", #"{"id":"1"}"#]).stdout == "1\n")
                let rss = try String(contentsOfFile: "/proc/\(daemon.process!.pid)/status", encoding: .utf8)
                    .split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
                print("daemon \(rss) after \(sent) bytes of unread pings")
                // Reading now gets every answer, in order.
                _ = fcntl(client.fd, F_SETFL, flags)
                let whole = sent / one.count
                for _ in 0..<whole {
                    guard let answer = try client.nextMessage(), case .pong = answer.message else {
                        Issue.record("missing pong")
                        return
                    }
                }
            }
        }
        /// A chain of many one-item steps costs the daemon about what one insert (or remove) of as many items costs.
        /// Merging each step into the request's event used to copy, and hash, every record merged before it:
        /// quadratic in the steps, seconds of one event loop for one request within `--max-batch`.
        @Test func aChainOfManyStepsCostsWhatOneBatchCosts() async throws {
            try await Daemon.with { daemon in
                let count = 5_000  // a chain's items and steps count against --max-batch: 10,000 together
                func items(_ prefix: String) -> [Item] {
                    (0..<count).map { Item(id: ItemID("\(prefix)\($0)"), payload: Payload("{}")) }
                }
                let client = try RawClient(socketPath: daemon.socketPath)
                try client.handshake()
                func committed(_ message: ClientMessage, id: UInt32) throws -> Int {
                    let start = cpuTicks(of: daemon)
                    try client.request(message, id: id)
                    let answer = try client.nextMessage()
                    guard case .writeResult(let result)? = answer?.message, result.committed else {
                        Issue.record("request \(id) was not committed: \(String(describing: answer))")
                        return 0
                    }
                    return cpuTicks(of: daemon) - start
                }
                let batch = try committed(.insert(.init(store: "batch", items: items("b"))), id: 1)
                let chain = try committed(
                    .chain(.init(store: "chain", steps: items("c").map { ChainStep.insert(items: [$0]) })), id: 2)
                print("daemon CPU: one insert of \(count) items \(batch * 10) ms, a chain of \(count) one-item inserts \(chain * 10) ms")
                // Clock ticks of 10 ms: a generous bound, where the quadratic merge took seconds.
                #expect(chain <= max(10 * batch, 50), "the chain took \(chain * 10) ms of the daemon's CPU")
                #expect(try await daemon.storectl(["count", "chain"]).stdout == "\(count)\n")
                // The same for removes.
                let removeBatch = try committed(.remove(.init(store: "batch", ids: items("b").map(\.id))), id: 3)
                let removeChain = try committed(
                    .chain(.init(store: "chain", steps: items("c").map { ChainStep.remove(ids: [$0.id]) })), id: 4)
                print("daemon CPU: one remove of \(count) ids \(removeBatch * 10) ms, a chain of \(count) \(removeChain * 10) ms")
                #expect(removeChain <= max(10 * removeBatch, 50), "the chain took \(removeChain * 10) ms of the daemon's CPU")
                #expect(try await daemon.storectl(["count", "chain"]).stdout == "0\n")
            }
        }
    }
}
