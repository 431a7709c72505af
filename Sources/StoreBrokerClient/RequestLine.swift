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

    /// The writing side, locked while a request is encoded and written (its `send(2)` included), so frames
    /// leave whole and in id order.
    private struct Writer {
        /// The line's own descriptor of the socket (the loop reads another), -1 once it is closed.
        var descriptor: CInt
        /// Writes handed to the loop and not yet written: while any is, later ones follow the same way.
        var queued = 0
        /// The next request's id (only writers take ids).
        var nextID: UInt32 = 1
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

        /// Moves on to the next id (the one just used is taken).
        mutating func takeID() {
            nextID = nextID == UInt32.max ? 1 : nextID + 1
        }

        /// Writes `out` (its requests registered already) to the socket from the caller's thread when nothing
        /// waits in the loop before it, and what does not fit to the loop; false when the connection is closed.
        mutating func write(_ out: consuming ByteBuffer) -> Bool {
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
            guard let handOff = loopWriter else { return false }
            queued += 1
            handOff(out)
            return true
        }
    }

    /// The requests waiting for answers, under a lock of their own that is never held across a system call:
    /// the loop reading an answer never waits for a caller in `send(2)` (on one core, a caller preempted there
    /// by the broker it had just woken held the loop up until it ran again: 5% of the client's time).
    private struct Table {
        var pending: [UInt32: Pending] = [:]
        /// Set once the connection has failed: every later request fails with it.
        var failure: StoreBrokerError?
    }

    private let writer: Locked<Writer>
    private let table = Locked(Table())

    init(descriptor: CInt) {
        writer = Locked(Writer(descriptor: descriptor))
    }

    deinit {
        writer.withLock { writer in
            if writer.descriptor >= 0 { Glibc.close(writer.descriptor) }
        }
    }

    /// How bytes reach the loop's socket when the socket is full: called by the handler's writer, which must
    /// call `loopWrote()` once each is written or dropped.
    func attach(_ loopWriter: @escaping @Sendable (ByteBuffer) -> Void) {
        writer.withLock { $0.loopWriter = loopWriter }
    }

    func established(maxFrameLength: Int) {
        writer.withLock { $0.maxFrameLength = maxFrameLength }
    }

    /// Registers `entry` under the next id and writes `request`; returns the id, or the failure (nothing was
    /// registered or written).
    func send(_ request: ClientMessage, _ entry: Pending) -> Result<UInt32, StoreBrokerError> {
        // `send(_:)` for one request, without its lists: a request here is the usual write.
        writer.withLock { writer -> Result<UInt32, StoreBrokerError> in
            var out = writer.takeScratch()
            let id = writer.nextID
            do throws(WireError) {
                try request.encode(id: id, maxFrameLength: writer.maxFrameLength, into: &out)
            } catch {
                return .failure(StoreBrokerError(.protocolViolation, code: error.code, error.message))
            }
            if let failure = register(id, entry) { return .failure(failure) }
            writer.takeID()
            guard writer.write(out) else {
                // Taken back, unless the connection's failure took it first (and told its waiter).
                return unregister(id) ? .failure(Self.closed) : .success(id)
            }
            return .success(id)
        }
    }

    private static let closed = StoreBrokerError(.connectionClosed, "the connection to the broker closed")

    /// Registers and writes several requests back to back, in one write (pipelined, in this order); each gets
    /// its id or its failure (a request that cannot be encoded fails alone).
    func send(_ requests: some Collection<(ClientMessage, Pending)>) -> [Result<UInt32, StoreBrokerError>] {
        writer.withLock { writer -> [Result<UInt32, StoreBrokerError>] in
            var results: [Result<UInt32, StoreBrokerError>] = []
            results.reserveCapacity(requests.count)
            var encoded: [(UInt32, Pending)] = []
            encoded.reserveCapacity(requests.count)
            var out = writer.takeScratch()
            // Room for the whole batch at once: grown by doubling, a 4 MiB window of inserts was copied six times
            // into buffers up to twice its size.
            out.reserveCapacity(requests.reduce(0) { $0 + Self.sizeHint($1.0) })
            for (request, entry) in requests {
                let id = writer.nextID
                do throws(WireError) {
                    try request.encode(id: id, maxFrameLength: writer.maxFrameLength, into: &out)
                } catch {
                    results.append(.failure(StoreBrokerError(.protocolViolation, code: error.code, error.message)))
                    continue
                }
                writer.takeID()
                encoded.append((id, entry))
                results.append(.success(id))
            }
            guard !encoded.isEmpty else { return results }
            if let failure = register(encoded) { return results.map { _ in .failure(failure) } }
            guard writer.write(out) else {
                // Taken back, unless the connection's failure took them first (and told their waiters).
                return results.map { $0.flatMap { unregister($0) ? .failure(Self.closed) : .success($0) } }
            }
            return results
        }
    }

    /// About how many bytes `request` encodes to: a write's items (ids and payloads) and a little more.
    private static func sizeHint(_ request: ClientMessage) -> Int {
        func items(_ items: [Item]) -> Int { items.reduce(0) { $0 + $1.id.utf8Count + $1.payload.count + 8 } }
        return switch request {
        case .insert(let insert): 64 + items(insert.elements)
        case .chain(let chain):
            64 + chain.elements.reduce(0) { total, step in
                if case .insert(let inserted) = step { total + items(inserted) } else { total + 16 }
            }
        default: 64
        }
    }

    /// Makes `entries` wait for their answers, unless the connection has failed (then its failure).
    private func register(_ entries: [(UInt32, Pending)]) -> StoreBrokerError? {
        table.withLock { table in
            if let failure = table.failure { return failure }
            for (id, entry) in entries { table.pending[id] = entry }
            return nil
        }
    }

    /// `register(_:)` of one request, without a list to allocate (the usual write).
    private func register(_ id: UInt32, _ entry: Pending) -> StoreBrokerError? {
        table.withLock { table in
            if let failure = table.failure { return failure }
            table.pending[id] = entry
            return nil
        }
    }

    /// Whether `id` was still waiting (it no longer is).
    private func unregister(_ id: UInt32) -> Bool {
        table.withLock { $0.pending.removeValue(forKey: id) != nil }
    }

    /// A write handed to the loop is done (written or dropped).
    func loopWrote() {
        writer.withLock { $0.queued -= 1 }
    }

    /// The request `id` was answered: what waited for it (nil when nothing did).
    func answered(_ id: UInt32) -> Pending? {
        table.withLock { $0.pending.removeValue(forKey: id) }
    }

    func isPending(_ id: UInt32) -> Bool {
        table.withLock { $0.pending[id] != nil }
    }

    /// The connection failed: later requests fail with `error`; returns what was waiting.
    func fail(_ error: StoreBrokerError) -> [Pending] {
        table.withLock { table in
            if table.failure == nil { table.failure = error }
            defer { table.pending = [:] }
            return Array(table.pending.values)
        }
    }

    /// The socket has closed: the line's descriptor closes too (nothing more is written through it).
    func close() {
        writer.withLock { writer in
            if writer.descriptor >= 0 { Glibc.close(writer.descriptor) }
            writer.descriptor = -1
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
