import NIOCore

/// Version negotiation.
public enum Handshake {
    /// The highest version both sides speak, or `unsupportedVersion` naming both lists.
    public static func chooseVersion(
        offered: [UInt16], supported: [UInt16] = WireProtocol.supportedVersions
    ) throws(WireError) -> UInt16 {
        guard let version = Set(offered).intersection(supported).max() else {
            throw WireError(
                .unsupportedVersion,
                "no common protocol version: the client offers \(offered.map(String.init).joined(separator: ", ")), "
                    + "the server speaks \(supported.map(String.init).joined(separator: ", "))")
        }
        return version
    }
}

/// The server's side of one connection, with no I/O: feed it the bytes received, carry out what it returns.
///
/// It enforces the handshake (the first frame must be a `hello`, under the small pre-handshake frame cap,
/// offering a common version), then raises the frame cap and turns frames into requests. A frame whose
/// message is unknown or malformed is refused alone (`refuse`: an `error` with that frame's id) and the
/// connection goes on, since frame boundaries are intact; a frame over the cap, a corrupt header or a bad
/// handshake ends the connection (`close`: an `error` with id 0, then close).
public struct ServerSession: Sendable {
    public enum State: Hashable, Sendable {
        case awaitingHello
        case established(version: UInt16, clientName: String)
        case closed
    }

    public enum Action: Hashable, Sendable {
        /// Send these bytes (the `welcome`).
        case reply(ByteBuffer)
        /// Carry out this request and answer it with `id`.
        case request(id: UInt32, ClientMessage)
        /// Send these bytes (an `error` for one frame); the connection goes on.
        case refuse(ByteBuffer)
        /// Send these bytes (an `error` with id 0), then close the connection.
        case close(ByteBuffer)
    }

    /// What the server announces in its `welcome`.
    public struct Limits: Hashable, Sendable {
        public var serverVersion: String
        public var maxFrameLength: Int
        public var maxItemLength: Int
        public var maxBatch: Int
        public var maxInFlight: Int

        public init(
            serverVersion: String = StoreBrokerVersion.string,
            maxFrameLength: Int = WireProtocol.defaultMaxFrameLength, maxItemLength: Int = 1024 * 1024,
            maxBatch: Int = 10_000, maxInFlight: Int = 128
        ) {
            self.serverVersion = serverVersion
            self.maxFrameLength = maxFrameLength
            self.maxItemLength = maxItemLength
            self.maxBatch = maxBatch
            self.maxInFlight = maxInFlight
        }
    }

    public private(set) var state: State = .awaitingHello
    public let limits: Limits
    public let supportedVersions: [UInt16]
    private var decoder = FrameDecoder(maxFrameLength: WireProtocol.handshakeMaxFrameLength)

    public init(limits: Limits = Limits(), supportedVersions: [UInt16] = WireProtocol.supportedVersions) {
        self.limits = limits
        self.supportedVersions = supportedVersions
    }

    /// The next action for the bytes in `buffer`, or `nil` when a whole frame is not there yet (or the
    /// session is closed). Call it until it returns `nil`.
    public mutating func next(from buffer: inout ByteBuffer) -> Action? {
        if case .closed = state { return nil }
        let frame: Frame
        do {
            guard let decoded = try decoder.decode(&buffer) else { return nil }
            frame = decoded
        } catch {
            return close(error)
        }
        guard case .established = state else { return handshake(frame) }
        // A second hello is unexpected whatever it holds (its bytes are not even decoded).
        if frame.header.type == MessageType.hello.rawValue {
            return .refuse(Self.errorFrame(WireError(.unexpectedMessage, "hello was already received"), id: frame.header.id))
        }
        let id = frame.header.id
        do {
            return .request(id: id, try ClientMessage(frame: consume frame))
        } catch {
            return .refuse(Self.errorFrame(error, id: id))
        }
    }

    private mutating func handshake(_ frame: Frame) -> Action {
        guard frame.header.type == MessageType.hello.rawValue else {
            return close(
                WireError(.badHandshake, "the first frame must be a hello (0x01), got type 0x\(String(frame.header.type, radix: 16))"))
        }
        let hello: ClientMessage.Hello
        do {
            guard case .hello(let decoded) = try ClientMessage(frame: frame) else { preconditionFailure("type checked") }
            hello = decoded
        } catch {
            // Whatever is wrong with it (truncated, trailing bytes, a wrong magic), it is not a valid hello.
            return close(error.code == .badHandshake ? error : WireError(.badHandshake, "not a valid hello: \(error.message)"))
        }
        do {
            let version = try Handshake.chooseVersion(offered: hello.versions, supported: supportedVersions)
            let welcome = ServerMessage.Welcome(
                version: version, serverVersion: limits.serverVersion, maxFrameLength: UInt32(limits.maxFrameLength),
                maxItemLength: UInt32(limits.maxItemLength), maxBatch: UInt32(limits.maxBatch),
                maxInFlight: UInt32(limits.maxInFlight))
            var out = ByteBuffer()
            try welcome.encodeFrame(id: frame.header.id, into: &out)
            state = .established(version: version, clientName: hello.clientName)
            decoder.maxFrameLength = limits.maxFrameLength
            return .reply(out)
        } catch {
            return close(error)
        }
    }

    private mutating func close(_ error: WireError) -> Action {
        state = .closed
        return .close(Self.errorFrame(error, id: 0))
    }

    /// An `error` frame for `error`.
    public static func errorFrame(_ error: WireError, id: UInt32) -> ByteBuffer {
        var out = ByteBuffer()
        // Keep the text within a text field whatever the error says.
        var message = error.message
        if message.utf8.count > 4096 { message = String(message.utf8.prefix(4096)) ?? "\(error.code.name)" }
        try! ServerMessage.ErrorResult(code: error.code, message: message).encodeFrame(id: id, into: &out)
        return out
    }
}

/// The client's side of one connection, with no I/O: send `hello()`, feed it the bytes received.
///
/// After the `welcome` it accepts frames up to the server's limit and joins messages that span frames.
/// Anything the server sends that breaks the protocol ends the session (`failed`): a client cannot
/// resynchronize with a server it no longer understands.
public struct ClientSession: Sendable {
    public enum State: Hashable, Sendable {
        case awaitingWelcome
        case established(ServerMessage.Welcome)
        case closed
    }

    public enum Event: Hashable, Sendable {
        /// The handshake is done.
        case established(ServerMessage.Welcome)
        /// A whole answer (id = request id) or push (id = subscription id).
        case message(id: UInt32, ServerMessage)
        /// The session is over: the server refused the handshake or broke the protocol.
        case failed(WireError)
    }

    public private(set) var state: State = .awaitingWelcome
    public let clientName: String
    public let versions: [UInt16]
    private var decoder = FrameDecoder(maxFrameLength: WireProtocol.handshakeMaxFrameLength)
    private var assembler = ServerMessageAssembler()

    public init(clientName: String, versions: [UInt16] = WireProtocol.supportedVersions) {
        self.clientName = clientName
        self.versions = versions
    }

    /// The `hello` frame (id 0) to send first.
    public func hello() throws(WireError) -> ByteBuffer {
        var out = ByteBuffer()
        try ClientMessage.Hello(versions: versions, clientName: clientName).encodeFrame(id: 0, into: &out)
        return out
    }

    /// The largest frame the server accepts now.
    public var maxFrameLength: Int {
        if case .established(let welcome) = state { return Int(welcome.maxFrameLength) }
        return WireProtocol.handshakeMaxFrameLength
    }

    /// Writes a request with id `id`, within the server's frame limit.
    public func encode(_ request: ClientMessage, id: UInt32, into out: inout ByteBuffer) throws(WireError) {
        try request.encode(id: id, maxFrameLength: maxFrameLength, into: &out)
    }

    /// The next event for the bytes in `buffer`, or `nil` when none is complete yet (or the session is over).
    public mutating func next(from buffer: inout ByteBuffer) -> Event? {
        do {
            while true {
                if case .closed = state { return nil }
                guard let frame = try decoder.decode(&buffer) else { return nil }
                guard case .established = state else { return try handshake(frame) }
                if let message = try assembler.receive(frame) {
                    return .message(id: frame.header.id, message)
                }
            }
        } catch {
            state = .closed
            return .failed(error)
        }
    }

    private mutating func handshake(_ frame: Frame) throws(WireError) -> Event {
        switch try ServerMessage(frame: frame) {
        case .welcome(let welcome):
            guard versions.contains(welcome.version) else {
                throw WireError(.unsupportedVersion, "the server chose version \(welcome.version), which was not offered")
            }
            state = .established(welcome)
            decoder.maxFrameLength = Int(welcome.maxFrameLength)
            return .established(welcome)
        case .error(let error):
            throw WireError(error.code, error.message)
        case let other:
            throw WireError(.badHandshake, "the server answered hello with \(other.type.name)")
        }
    }
}
