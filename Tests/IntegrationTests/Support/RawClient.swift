import Foundation
import NIOCore
import Wire

/// A client that speaks the protocol byte by byte over a blocking socket, to send what a well-behaved client
/// never would. Reads time out (after 20 s unless told), so a test fails rather than hangs.
final class RawClient {
    let fd: Int32
    private var input = ByteBuffer()
    private var session = ClientSession(clientName: "raw-test")

    init(socketPath: String, timeout: Int = 20) throws {
        fd = try unixSocket(socketPath) { connect($0, $1, $2) }
        setReadTimeout(fd, seconds: timeout)
    }

    deinit { close(fd) }

    /// Ends the connection both ways now (the descriptor is closed when the client goes away).
    func disconnect() { shutdown(fd, Int32(SHUT_RDWR)) }

    func send(_ bytes: [UInt8]) { sendAll(fd, bytes) }

    func send(_ buffer: ByteBuffer) { sendAll(fd, Array(buffer.readableBytesView)) }

    /// Sends `hello` and reads the `welcome`.
    @discardableResult
    func handshake() throws -> ServerMessage.Welcome {
        send(try session.hello())
        switch try nextEvent() {
        case .established(let welcome): return welcome
        case .failed(let error): throw error  // a refusal: its code says why
        default: throw DaemonFailure("no welcome")
        }
    }

    func request(_ message: ClientMessage, id: UInt32) throws {
        var out = ByteBuffer()
        try session.encode(message, id: id, into: &out)
        send(out)
    }

    /// Sends `requests` in one write, with the ids after `id` (left at the last one), and returns their answers in
    /// request order; pushes that arrive meanwhile (their id is a subscription's) are skipped.
    func exchange(_ requests: [ClientMessage], id: inout UInt32) throws -> [ServerMessage] {
        let first = id + 1
        var out = ByteBuffer()
        for request in requests {
            id += 1
            try session.encode(request, id: id, into: &out)
        }
        send(out)
        var answers: [UInt32: ServerMessage] = [:]
        while answers.count < requests.count {
            guard let (answerID, message) = try nextMessage() else { throw DaemonFailure("closed") }
            if !message.type.isPush, (first...id).contains(answerID) { answers[answerID] = message }
        }
        return (first..<first + UInt32(requests.count)).map { answers[$0]! }
    }

    /// The next whole message (answers and pushes joined across frames), or `nil` at end of stream.
    func nextMessage() throws -> (id: UInt32, message: ServerMessage)? {
        switch try nextEvent() {
        case .message(let id, let message): return (id, message)
        case .established: throw DaemonFailure("a second welcome")
        case .failed(let error): throw error
        case nil: return nil
        }
    }

    private func nextEvent() throws -> ClientSession.Event? {
        while true {
            if let event = session.next(from: &input) { return event }
            guard try fill() else { return nil }
        }
    }

    /// The whole messages the next single `recv` completes (with what earlier reads left over): what one
    /// write of the daemon carried, when the client was waiting for it.
    func messagesOfOneRead() throws -> [(id: UInt32, message: ServerMessage)] {
        guard try fill() else { return [] }
        var messages: [(id: UInt32, message: ServerMessage)] = []
        while let event = session.next(from: &input) {
            guard case .message(let id, let message) = event else { throw DaemonFailure("not a message: \(event)") }
            messages.append((id, message))
        }
        return messages
    }

    /// The next raw frame, without the session (for answers to broken input), or `nil` at end of stream.
    func nextFrame() throws -> Frame? {
        let decoder = FrameDecoder(maxFrameLength: WireProtocol.defaultMaxFrameLength)
        while true {
            if let frame = try decoder.decode(&input) { return frame }
            guard try fill() else { return nil }
        }
    }

    /// Reads until the server closes; `false` if it did not close within the read timeout.
    func readsToEnd() -> Bool {
        while true {
            guard let more = try? fill() else { return false }
            if !more { return true }
        }
    }

    private func fill() throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if count == 0 { return false }
        if count < 0 {
            if errno == ECONNRESET { return false }
            throw DaemonFailure("read failed or timed out: \(String(cString: strerror(errno)))")
        }
        input.writeBytes(chunk[..<count])
        return true
    }
}

/// The error an `error` frame carries.
func errorCode(of frame: Frame?) -> ErrorCode? {
    guard let frame, case .error(let error)? = try? ServerMessage(frame: frame) else { return nil }
    return error.code
}

/// A frame header and payload, built by hand.
func rawFrame(type: UInt8, id: UInt32, payload: [UInt8], length: UInt32? = nil, reserved: UInt16 = 0) -> [UInt8] {
    var out = ByteBuffer()
    out.writeInteger(length ?? UInt32(payload.count))
    out.writeInteger(type)
    out.writeInteger(UInt8(0))
    out.writeInteger(reserved)
    out.writeInteger(id)
    out.writeBytes(payload)
    return Array(out.readableBytesView)
}

/// A Unix stream socket whose address is `path`, passed to `call` (`connect` or `bind`); closed and thrown on
/// failure.
func unixSocket(_ path: String, _ call: (Int32, UnsafePointer<sockaddr>, socklen_t) -> Int32) throws -> Int32 {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw POSIXError(.EIO) }
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
    let result = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { call(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    guard result == 0 else {
        let code = errno
        close(fd)
        throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
    }
    return fd
}

/// Reads on `fd` fail after `seconds` without data, so a test fails rather than hangs.
func setReadTimeout(_ fd: Int32, seconds: Int) {
    var timeout = timeval(tv_sec: seconds, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
}

/// Writes all of `bytes` (or stops when the peer is gone).
func sendAll(_ fd: Int32, _ bytes: [UInt8]) {
    var rest = bytes[...]
    while !rest.isEmpty {
        let written = rest.withUnsafeBytes { Foundation.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        if written <= 0 { return }
        rest = rest.dropFirst(written)
    }
}
