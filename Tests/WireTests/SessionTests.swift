import NIOCore
import Testing
import Wire

@Suite struct SessionTests {
    /// Runs every action the server has for `bytes`.
    func serverActions(_ server: inout ServerSession, _ bytes: ByteBuffer) -> [ServerSession.Action] {
        var buffer = bytes
        var actions: [ServerSession.Action] = []
        while let action = server.next(from: &buffer) { actions.append(action) }
        return actions
    }

    func clientEvents(_ client: inout ClientSession, _ bytes: ByteBuffer) -> [ClientSession.Event] {
        var buffer = bytes
        var events: [ClientSession.Event] = []
        while let event = client.next(from: &buffer) { events.append(event) }
        return events
    }

    func errorCode(_ bytes: ByteBuffer) throws -> (UInt32, ErrorCode) {
        let (id, message) = try AnyMessage.decodeOne(bytes)
        guard case .server(.error(let error)) = message else { throw WireError(.malformed, "not an error: \(message)") }
        return (id, error.code)
    }

    @Test func handshakeThenPipelinedRequests() throws {
        var server = ServerSession(limits: .init(maxFrameLength: 64 * 1024))
        var client = ClientSession(clientName: "test")
        let actions = serverActions(&server, try client.hello())
        guard case .reply(let welcomeBytes) = try #require(actions.first), actions.count == 1 else {
            Issue.record("expected a welcome, got \(actions)")
            return
        }
        let events = clientEvents(&client, welcomeBytes)
        guard case .established(let welcome) = try #require(events.first) else {
            Issue.record("expected established, got \(events)")
            return
        }
        #expect(welcome.version == 1)
        #expect(welcome.maxFrameLength == 64 * 1024)
        #expect(server.state == .established(version: 1, clientName: "test"))

        // Three requests in one write; frames over the pre-handshake cap are fine now.
        var requests = ByteBuffer()
        let big = ClientMessage.insert(.init(store: "s", items: [Item(id: "a", payload: Payload(ByteBuffer(repeating: 1, count: 5000)))]))
        try client.encode(.ping(.init()), id: 1, into: &requests)
        try client.encode(big, id: 2, into: &requests)
        try client.encode(.count(.init(store: "s")), id: 3, into: &requests)
        #expect(
            serverActions(&server, requests) == [
                .request(id: 1, .ping(.init())), .request(id: 2, big), .request(id: 3, .count(.init(store: "s"))),
            ])
    }

    @Test func noCommonVersionIsAnExplicitErrorThenClose() throws {
        var server = ServerSession()
        var client = ClientSession(clientName: "future", versions: [7, 8])
        let actions = serverActions(&server, try client.hello())
        guard case .close(let bytes) = try #require(actions.first), actions.count == 1 else {
            Issue.record("expected close, got \(actions)")
            return
        }
        #expect(try errorCode(bytes) == (0, .unsupportedVersion))
        #expect(server.state == .closed)
        #expect(serverActions(&server, try client.hello()).isEmpty, "a closed session does nothing more")
        let events = clientEvents(&client, bytes)
        guard case .failed(let error) = try #require(events.first) else {
            Issue.record("expected failed, got \(events)")
            return
        }
        #expect(error.code == .unsupportedVersion)
        #expect(error.message.contains("7, 8"))
    }

    @Test func theHighestCommonVersionIsChosen() throws {
        #expect(try Handshake.chooseVersion(offered: [1, 2, 3], supported: [2, 3, 4]) == 3)
        #expect(throws: WireError.self) { try Handshake.chooseVersion(offered: [], supported: [1]) }
    }

    @Test func aFirstFrameThatIsNotHelloCloses() throws {
        var server = ServerSession()
        var ping = ByteBuffer()
        try ClientMessage.ping(.init()).encode(id: 1, into: &ping)
        guard case .close(let bytes) = try #require(serverActions(&server, ping).first) else {
            Issue.record("expected close")
            return
        }
        #expect(try errorCode(bytes) == (0, .badHandshake))
    }

    @Test func aPeerSpeakingSomethingElseIsCutOffAtTheSmallCap() throws {
        var server = ServerSession()
        // "GET / HTTP/1.1": its first four bytes read as a length of about 1.2 GB.
        guard case .close(let bytes) = try #require(serverActions(&server, ByteBuffer(string: "GET / HTTP/1.1\r\n\r\n")).first)
        else {
            Issue.record("expected close")
            return
        }
        #expect(try errorCode(bytes) == (0, .frameTooLarge))
    }

    @Test func badRequestsAreRefusedOneByOneAndTheConnectionGoesOn() throws {
        var server = ServerSession()
        let client = ClientSession(clientName: "test")
        _ = serverActions(&server, try client.hello())
        var stream = ByteBuffer()
        stream.writeImmutableBuffer(rawFrame(type: 0x3F, id: 10))  // unknown type
        stream.writeImmutableBuffer(rawFrame(type: 0x1B, id: 11, payload: "0002 c328"))  // invalid UTF-8
        stream.writeImmutableBuffer(rawFrame(type: 0x10, id: 12, payload: "00"))  // trailing byte
        stream.writeImmutableBuffer(try client.hello())  // a second hello
        stream.writeImmutableBuffer(rawFrame(type: 0x41, id: 13))  // a server message
        stream.writeImmutableBuffer(rawFrame(type: 0x10, id: 14))  // a good ping
        let actions = serverActions(&server, stream)
        #expect(actions.count == 6)
        var refused: [(UInt32, ErrorCode)] = []
        for action in actions.prefix(5) {
            guard case .refuse(let bytes) = action else {
                Issue.record("expected refuse, got \(action)")
                continue
            }
            refused.append(try errorCode(bytes))
        }
        #expect(refused.map(\.0) == [10, 11, 12, 0, 13])
        #expect(
            refused.map(\.1) == [.unknownMessageType, .malformed, .malformed, .unexpectedMessage, .unexpectedMessage])
        #expect(actions.last == .request(id: 14, .ping(.init())))
    }

    /// One rule for a second hello, whatever it holds (before: a bad magic got badHandshake): unexpectedMessage
    /// with the frame's id, and the connection goes on.
    @Test func aSecondHelloIsUnexpectedWhateverItHolds() throws {
        var server = ServerSession()
        let client = ClientSession(clientName: "test")
        _ = serverActions(&server, try client.hello())
        var stream = ByteBuffer()
        stream.writeImmutableBuffer(rawFrame(type: 0x01, id: 7, payload: "48545450 0001 0001 0000"))  // magic "HTTP"
        stream.writeImmutableBuffer(rawFrame(type: 0x01, id: 8, payload: "53"))  // truncated
        stream.writeImmutableBuffer(rawFrame(type: 0x10, id: 9))
        let actions = serverActions(&server, stream)
        #expect(actions.count == 3)
        var refused: [(UInt32, ErrorCode)] = []
        for case .refuse(let bytes) in actions { refused.append(try errorCode(bytes)) }
        #expect(refused.map(\.0) == [7, 8] && refused.map(\.1) == [.unexpectedMessage, .unexpectedMessage])
        #expect(actions.last == .request(id: 9, .ping(.init())))
    }

    /// A first hello that does not decode is not a valid hello: badHandshake, id 0, and a close (before:
    /// malformed).
    @Test func aMalformedFirstHelloIsABadHandshake() throws {
        for payload in ["53", "5342524b 0001", "5342524b 0001 0001 0000 ff"] {
            var server = ServerSession()
            guard case .close(let bytes) = try #require(serverActions(&server, rawFrame(type: 0x01, id: 3, payload: payload)).first)
            else {
                Issue.record("expected close for \(payload)")
                continue
            }
            #expect(try errorCode(bytes) == (0, .badHandshake), "\(payload)")
        }
    }

    @Test func anOversizedFrameAfterTheHandshakeCloses() throws {
        var server = ServerSession(limits: .init(maxFrameLength: 4096))
        let client = ClientSession(clientName: "test")
        _ = serverActions(&server, try client.hello())
        let actions = serverActions(&server, rawFrame(type: 0x10, length: 4097))
        guard case .close(let bytes) = try #require(actions.first) else {
            Issue.record("expected close, got \(actions)")
            return
        }
        #expect(try errorCode(bytes) == (0, .frameTooLarge))
    }

    @Test func theClientJoinsAnswersThatSpanFrames() throws {
        var server = ServerSession(limits: .init(maxFrameLength: 1024))
        var client = ClientSession(clientName: "test")
        guard case .reply(let welcome) = try #require(serverActions(&server, try client.hello()).first) else { return }
        _ = clientEvents(&client, welcome)
        let records = (0..<100).map { RoundTripTests.record($0) }
        let answer = ServerMessage.rangeResult(.init(epoch: 1, sequence: 2, elements: records))
        var bytes = ByteBuffer()
        try answer.encode(id: 5, maxFrameLength: 1024, into: &bytes)
        #expect(clientEvents(&client, bytes) == [.message(id: 5, answer)])
    }

    @Test func aClientRefusesAFrameOverTheAnnouncedLimit() throws {
        var server = ServerSession(limits: .init(maxFrameLength: 2048))
        var client = ClientSession(clientName: "test")
        guard case .reply(let welcome) = try #require(serverActions(&server, try client.hello()).first) else { return }
        _ = clientEvents(&client, welcome)
        let events = clientEvents(&client, rawFrame(type: 0x41, length: 5000))
        guard case .failed(let error) = try #require(events.first) else {
            Issue.record("expected failed, got \(events)")
            return
        }
        #expect(error.code == .frameTooLarge)
        #expect(client.state == .closed)
    }
}

@Suite struct AssemblerLimits {
    @Test func aMessageSpanningFramesCannotGrowPastTheLimit() throws {
        let stores = (0..<50).map { StoreInfo(name: "store-\($0)", epoch: 1, sequence: 2, count: 3, engine: "sqlite") }
        var bytes = ByteBuffer()
        try ServerMessage.storeList(.init(elements: stores)).encode(id: 1, maxFrameLength: 256, into: &bytes)
        let decoder = FrameDecoder(maxFrameLength: 256)
        var frames: [Frame] = []
        while let frame = try decoder.decode(&bytes) { frames.append(frame) }
        #expect(frames.count > 3)

        var generous = ServerMessageAssembler()
        var whole: ServerMessage?
        for frame in frames { whole = try generous.receive(frame) }
        #expect(whole == .storeList(.init(elements: stores)))

        var strict = ServerMessageAssembler(maxMessageLength: 600)
        #expect(throws: WireError.self) {
            for frame in frames { _ = try strict.receive(frame) }
        }
    }
}
