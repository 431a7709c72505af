#if canImport(Glibc)
import Glibc
#endif
import Locking
import NIOCore
import Wire

/// The one way a connection's requests reach the socket, from any thread, in the order of their ids, and
/// the requests waiting for their answers.
///
/// A caller writes its request to the socket itself (`send(2)` on a descriptor of the line's own, under the
/// line's lock), so a request costs the client's loop no wake-up: the loop only reads, and wakes once per
/// answer, as a client written around one thread does. Bytes that do not fit in the socket go to the loop
/// (`ClientSocket.write`), and every later request after them, until the loop has written them: the frames
/// never interleave and leave in id order.
final class RequestLine: Sendable {
    /// What a request is waiting with: resumed or completed on the event loop when its answer is read.
    enum Pending {
        case answer(BrokerConnection.Answer)
        /// An answer that `seen` is told of on the event loop as it is read, in order with the pushes around it,
        /// before the caller resumes (and of the failure, if there is no answer).
        case answerSeen(BrokerConnection.Answer, BrokerConnection.AnswerSeen)
        case request(EventLoopPromise<ServerMessage>)
        case subscribe(EventLoopPromise<BrokerSubscription>)
        case subscribeDirect(EventLoopPromise<UInt32>, any PushReceiver)
        case subscribeFollow(FollowSubscription)
    }

    private struct State {
        /// The line's own descriptor of the socket (the loop reads another), -1 once it is closed.
        var descriptor: CInt
        /// Writes handed to the loop and not yet written: while any is, later ones follow the same way.
        var queued = 0
        var nextID: UInt32 = 1
        var pending: [UInt32: Pending] = [:]
        /// Set once the connection has failed: every later request fails with it.
        var failure: StoreBrokerError?
        /// The largest frame the broker accepts (from its welcome).
        var maxFrameLength = WireProtocol.handshakeMaxFrameLength
        /// Hands bytes to the loop's socket (set once the handler serves it).
        var loopWriter: (@Sendable (ByteBuffer) -> Void)?
        /// The bytes of the last write, kept for the next (its storage is reused when the socket took them all).
        var scratch: ByteBuffer?
        /// The largest scratch buffer kept: a connection does not hold on to the memory of its biggest write.
        static let scratchCapacity = 64 * 1024

        /// The requests to write are encoded into this (empty; the scratch buffer when it is free).
        mutating func takeScratch() -> ByteBuffer {
            guard var out = scratch.take() else { return ByteBuffer() }
            out.clear()
            return out
        }

        /// Writes `out` (the requests `registered`, registered already) to the socket from the caller's thread
        /// when nothing waits in the loop before it, and what does not fit to the loop; false when the
        /// connection is closed (the requests are then taken out of `pending`).
        mutating func write(_ out: consuming ByteBuffer, registered: (inout [UInt32: Pending]) -> Void) -> Bool {
            if queued == 0, descriptor >= 0 {
                let written = out.withUnsafeReadableBytes { bytes in
                    Glibc.send(descriptor, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT))
                }
                if written == out.readableBytes {
                    // All written: its storage serves the next write (unless a big one made it big).
                    if out.capacity <= Self.scratchCapacity { scratch = out }
                    return true
                }
                // The socket is full (or failing: the loop then finds out and fails what is pending).
                if written > 0 { out.moveReaderIndex(forwardBy: written) }
            }
            guard let handOff = loopWriter else {
                registered(&pending)
                return false
            }
            queued += 1
            handOff(out)
            return true
        }
    }

    private let state: Locked<State>

    init(descriptor: CInt) {
        state = Locked(State(descriptor: descriptor))
    }

    deinit {
        state.withLock { state in
            if state.descriptor >= 0 { Glibc.close(state.descriptor) }
        }
    }

    /// How bytes reach the loop's socket when the socket is full: called by the handler's writer, which must
    /// call `loopWrote()` once each is written or dropped.
    func attach(_ writer: @escaping @Sendable (ByteBuffer) -> Void) {
        state.withLock { $0.loopWriter = writer }
    }

    func established(maxFrameLength: Int) {
        state.withLock { $0.maxFrameLength = maxFrameLength }
    }

    /// Registers `entry` under the next id and writes `request`; returns the id, or the failure (nothing was
    /// registered or written).
    func send(_ request: ClientMessage, _ entry: Pending) -> Result<UInt32, StoreBrokerError> {
        // `send(_:)` for one request, without its lists: a request here is the usual write.
        state.withLock { state -> Result<UInt32, StoreBrokerError> in
            if let failure = state.failure { return .failure(failure) }
            var out = state.takeScratch()
            let id = state.nextID
            do throws(WireError) {
                try request.encode(id: id, maxFrameLength: state.maxFrameLength, into: &out)
            } catch {
                return .failure(StoreBrokerError(.protocolViolation, code: error.code, error.message))
            }
            state.nextID = id == UInt32.max ? 1 : id + 1
            state.pending[id] = entry
            guard state.write(out, registered: { $0[id] = nil }) else { return .failure(Self.closed) }
            return .success(id)
        }
    }

    private static let closed = StoreBrokerError(.connectionClosed, "the connection to the broker closed")

    /// Registers and writes several requests back to back, in one write (pipelined, in this order); each gets
    /// its id or its failure (a request that cannot be encoded fails alone).
    func send(_ requests: some Collection<(ClientMessage, Pending)>) -> [Result<UInt32, StoreBrokerError>] {
        state.withLock { state -> [Result<UInt32, StoreBrokerError>] in
            if let failure = state.failure { return requests.map { _ in .failure(failure) } }
            var results: [Result<UInt32, StoreBrokerError>] = []
            results.reserveCapacity(requests.count)
            var registered: [UInt32] = []
            registered.reserveCapacity(requests.count)
            var out = state.takeScratch()
            for (request, entry) in requests {
                let id = state.nextID
                do throws(WireError) {
                    try request.encode(id: id, maxFrameLength: state.maxFrameLength, into: &out)
                } catch {
                    results.append(.failure(StoreBrokerError(.protocolViolation, code: error.code, error.message)))
                    continue
                }
                state.nextID = id == UInt32.max ? 1 : id + 1
                state.pending[id] = entry
                registered.append(id)
                results.append(.success(id))
            }
            guard out.readableBytes > 0 else { return results }
            guard state.write(out, registered: { pending in for id in registered { pending[id] = nil } }) else {
                return results.map { $0.flatMap { _ in .failure(Self.closed) } }
            }
            return results
        }
    }

    /// A write handed to the loop is done (written or dropped).
    func loopWrote() {
        state.withLock { $0.queued -= 1 }
    }

    /// The request `id` was answered: what waited for it (nil when nothing did).
    func answered(_ id: UInt32) -> Pending? {
        state.withLock { $0.pending.removeValue(forKey: id) }
    }

    func isPending(_ id: UInt32) -> Bool {
        state.withLock { $0.pending[id] != nil }
    }

    /// The connection failed: later requests fail with `error`; returns what was waiting.
    func fail(_ error: StoreBrokerError) -> [Pending] {
        state.withLock { state in
            if state.failure == nil { state.failure = error }
            defer { state.pending = [:] }
            return Array(state.pending.values)
        }
    }

    /// The socket has closed: the line's descriptor closes too (nothing more is written through it).
    func close() {
        state.withLock { state in
            if state.descriptor >= 0 { Glibc.close(state.descriptor) }
            state.descriptor = -1
        }
    }

    /// What connecting a socket gave: a connected descriptor, or the `errno` it failed with.
    enum Connected {
        case connected(CInt)
        case failed(CInt)
    }

    /// Connects a Unix socket without waiting (non-blocking and close-on-exec). A full backlog fails with
    /// `EAGAIN`: the caller tries again.
    static func connect(unixDomainSocketPath path: String) -> Connected {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard path.utf8.count < capacity else { return .failed(ENAMETOOLONG) }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: path.utf8)
            raw[path.utf8.count] = 0
        }
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { return .failed(errno) }
        let status = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard status == 0 else {
            let failure = errno
            Glibc.close(descriptor)
            return .failed(failure)
        }
        return .connected(descriptor)
    }
}
