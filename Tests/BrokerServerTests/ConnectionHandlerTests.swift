@testable import BrokerServer
import BrokerCore
import Logging
import NIOCore
import NIOEmbedded
import Testing
import TestSupport
import Wire

/// No engine: these tests never reach a store.
private struct NoEngines: EngineProvider {
    func engine(named name: String) throws(BrokerError) -> any StorageEngine {
        throw BrokerError(.engineUnavailable, "no engines in this test")
    }

    func engineList() -> [EngineInfo] { [] }
}

/// No threads for blocking work either: a job runs where it is handed in (these tests never reach an engine).
private struct NoThreads: BlockingExecutor {
    func execute(_ job: @escaping @Sendable () -> Void) { job() }
}

/// What the handler wrote, decoded as a client would (one session across reads).
final class Outbound {
    private var session = ClientSession(clientName: "t")
    private var bytes = ByteBuffer()

    init() {
        _ = try? session.hello()
    }

    /// Every message written since the last call.
    func read(_ channel: EmbeddedChannel) throws -> [(UInt32, ServerMessage)] {
        while let chunk = try channel.readOutbound(as: ByteBuffer.self) { add(chunk) }
        return messages()
    }

    func add(_ chunk: ByteBuffer) {
        var chunk = chunk
        bytes.writeBuffer(&chunk)
    }

    /// The messages the bytes added so far complete.
    func messages() -> [(UInt32, ServerMessage)] {
        var out: [(UInt32, ServerMessage)] = []
        while let event = session.next(from: &bytes) {
            switch event {
            case .established(let welcome): out.append((0, .welcome(welcome)))
            case .message(let id, let message): out.append((id, message))
            case .failed(let error): out.append((0, .error(.init(code: error.code, message: error.message))))
            }
        }
        return out
    }
}

/// The connection handler on an `EmbeddedChannel`, driven byte by byte with virtual time: the behaviour the
/// connection state machine must keep (issue "A core that speaks its own language", deliverable 2).
@Suite struct ConnectionHandlerTests {
    let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    func withChannel(
        handshake: Duration = .seconds(10), frame: Duration = .seconds(30),
        _ body: (EmbeddedChannel, Outbound) throws -> Void
    ) async throws {
        try await withTemporaryDirectory(prefix: "sb-conn") { directory in
            let loop = EmbeddedEventLoop()
            let broker = try Broker(
                configuration: BrokerConfiguration(dataDirectory: directory), engines: NoEngines(), owner: loop,
                blocking: NoThreads(), logger: logger)
            let settings = ConnectionHandler.Settings(
                broker: broker, turn: LoopTurn(broker: broker),
                machine: .init(
                    limits: ServerSession.Limits(), timeouts: Timeouts(handshake: handshake, frame: frame),
                    highWatermark: ConnectionHandler.writeBufferWaterMark.high),
                budget: ByteBudget(perConnection: 1 << 20, total: 1 << 24),
                subscriptions: SubscriptionQuota(perConnection: 1024, total: 65536), subscriberBuffer: 16,
                registry: ConnectionRegistry())
            let handler = ConnectionHandler(settings, context: .owner, logger: logger)
            let channel = EmbeddedChannel(handler: handler, loop: loop)
            try await channel.connect(to: SocketAddress(unixDomainSocketPath: "/tmp/test.sock")).get()
            try body(channel, Outbound())
            _ = try? channel.finish()
        }
    }

    func hello() throws -> ByteBuffer { try ClientSession(clientName: "t").hello() }

    func request(_ message: ClientMessage, id: UInt32) throws -> ByteBuffer {
        var out = ByteBuffer()
        try message.encode(id: id, maxFrameLength: WireProtocol.defaultMaxFrameLength, into: &out)
        return out
    }

    /// A hello and three pings in one read: the welcome, then the pongs in request order.
    @Test func pipelinedRequestsAreAnsweredInOrder() async throws {
        try await withChannel { channel, outbound in
            var bytes = try hello()
            for id in [7, 3, 9] as [UInt32] {
                var ping = try request(.ping(.init()), id: id)
                bytes.writeBuffer(&ping)
            }
            try channel.writeInbound(bytes)
            let got = try outbound.read(channel)
            #expect(got.count == 4)
            guard got.count == 4, case .welcome = got[0].1 else { return }
            #expect(got.dropFirst().map(\.0) == [7, 3, 9])
            #expect(got.dropFirst().allSatisfy { if case .pong = $0.1 { true } else { false } })
        }
    }

    /// No hello within --handshake-timeout: `error timedOut` (id 0), then the connection closes.
    @Test func noHelloInTimeIsAnError() async throws {
        try await withChannel(handshake: .seconds(10)) { channel, outbound in
            channel.embeddedEventLoop.advanceTime(by: .seconds(9))
            #expect(try outbound.read(channel).isEmpty)
            channel.embeddedEventLoop.advanceTime(by: .seconds(2))
            let got = try outbound.read(channel)
            guard case .error(let error)? = got.first?.1 else {
                Issue.record("no error: \(got)")
                return
            }
            #expect(error.code == .timedOut)
        }
    }

    /// Half a frame for longer than --frame-timeout: `error timedOut`; an idle established connection is kept.
    @Test func halfAFrameTimesOutButIdleDoesNot() async throws {
        try await withChannel(frame: .seconds(30)) { channel, outbound in
            try channel.writeInbound(try hello())
            _ = try outbound.read(channel)
            channel.embeddedEventLoop.advanceTime(by: .seconds(3600))  // idle for an hour: still served
            try channel.writeInbound(try request(.ping(.init()), id: 1))
            #expect(try outbound.read(channel).map(\.0) == [1])
            var ping = try request(.ping(.init()), id: 2)
            try channel.writeInbound(ping.readSlice(length: 5)!)
            channel.embeddedEventLoop.advanceTime(by: .seconds(31))
            guard case .error(let error)? = try outbound.read(channel).first?.1 else {
                Issue.record("a half-sent frame was kept")
                return
            }
            #expect(error.code == .timedOut)
        }
    }

    /// A half-close: what was asked is answered, then the connection closes.
    @Test func halfCloseAnswersThenCloses() async throws {
        try await withChannel { channel, outbound in
            var bytes = try hello()
            var ping = try request(.ping(.init()), id: 5)
            bytes.writeBuffer(&ping)
            try channel.writeInbound(bytes)
            channel.pipeline.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
            channel.embeddedEventLoop.run()
            #expect(try outbound.read(channel).map(\.0) == [0, 5])
            #expect(!channel.isActive, "the connection stayed open after its last answer")
        }
    }
}

@Suite struct WireMappingTests {
    /// Every code of the broker crosses the socket as the protocol's code of the same name (the protocol's
    /// codes are stable; a new broker code must be given a projection, or this fails).
    @Test func everyBrokerErrorCodeHasTheProtocolCodeOfItsName() {
        for code in BrokerError.Code.allCases {
            #expect(code.wireCode.name == code.name, "\(code)")
            #expect(ErrorCode.known.contains { $0.0 == code.wireCode })
        }
        let error = BrokerError(.conflict, "store s is at sequence 3", underlying: SystemError(code: 2))
        #expect(error.wireError == WireError(.conflict, "store s is at sequence 3"))  // no cause, no location
    }
}
