import Foundation
import NIOCore
import Wire

/// A listener on a Unix socket that plays a broken broker, for the client's side of liveness: it accepts
/// every connection and then either closes it at once or holds it without ever answering. Its accept loop runs
/// on its own thread (blocking calls never on the cooperative pool) until `stop()`.
final class FakeBroker: @unchecked Sendable {
    enum Behaviour {
        case closeAtOnce, neverAnswer
        /// Runs the script on each connection (on the accept thread), then closes it.
        case script(@Sendable (ScriptedPeer) throws -> Void)
    }

    let socketPath: String
    private let listener: Int32
    private let behaviour: Behaviour
    private let lock = NSLock()
    private var held: [Int32] = []
    private var stopped = false
    private let finished = DispatchSemaphore(value: 0)

    init(socketPath: String, behaviour: Behaviour) throws {
        self.socketPath = socketPath
        self.behaviour = behaviour
        listener = try unixSocket(socketPath) { bind($0, $1, $2) }
        guard listen(listener, 128) == 0 else {
            close(listener)
            throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
        }
        Thread.detachNewThread { self.acceptLoop() }
    }

    private func acceptLoop() {
        while true {
            let connection = accept(listener, nil, nil)
            if connection < 0 {
                if errno == EINTR { continue }
                break  // the listener was shut down
            }
            switch behaviour {
            case .closeAtOnce: close(connection)
            case .neverAnswer: lock.withLock { held.append(connection) }
            case .script(let script):
                try? script(ScriptedPeer(fd: connection))
                close(connection)
            }
        }
        finished.signal()
    }

    /// Stops accepting, closes every held connection and removes the socket.
    func stop() {
        guard lock.withLock({ () -> Bool in
            defer { stopped = true }
            return !stopped
        }) else { return }
        shutdown(listener, Int32(SHUT_RDWR))
        finished.wait()
        close(listener)
        lock.withLock {
            held.forEach { close($0) }
            held = []
        }
        unlink(socketPath)
    }

    deinit { stop() }
}

/// The broker's side of one connection, for scripts: the handshake is answered by `ServerSession`; the script
/// reads requests and sends what it likes. Reads time out after 10 s (a script never hangs a test).
final class ScriptedPeer {
    let fd: Int32
    private var session = ServerSession()
    private var input = ByteBuffer()

    init(fd: Int32) {
        self.fd = fd
        setReadTimeout(fd, seconds: 10)
    }

    /// The next request (the handshake answered on the way), or nil at end of stream.
    func nextRequest() throws -> (id: UInt32, message: ClientMessage)? {
        while true {
            while let action = session.next(from: &input) {
                switch action {
                case .reply(let bytes), .refuse(let bytes): write(bytes)
                case .close(let bytes):
                    write(bytes)
                    return nil
                case .request(let id, let message): return (id, message)
                }
            }
            var chunk = [UInt8](repeating: 0, count: 65536)
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count <= 0 { return nil }
            input.writeBytes(chunk[..<count])
        }
    }

    func send(_ message: ServerMessage, id: UInt32) throws {
        var out = ByteBuffer()
        try message.encode(id: id, maxFrameLength: WireProtocol.defaultMaxFrameLength, into: &out)
        write(out)
    }

    /// Sends `answers` as one stream of bytes cut at `cuts` (offsets into it), each piece its own write 50 ms
    /// after the last: the client reads frames that end in the middle of a read, several in one read, and a
    /// header in pieces.
    func send(_ answers: [(ServerMessage, id: UInt32)], cutAt cuts: [Int]) throws {
        var out = ByteBuffer()
        for (message, id) in answers { try message.encode(id: id, maxFrameLength: WireProtocol.defaultMaxFrameLength, into: &out) }
        let bytes = Array(out.readableBytesView)
        var start = 0
        for end in cuts + [bytes.count] where end > start {
            sendAll(fd, Array(bytes[start..<min(end, bytes.count)]))
            start = end
            usleep(50_000)
        }
    }

    private func write(_ bytes: ByteBuffer) { sendAll(fd, Array(bytes.readableBytesView)) }
}
