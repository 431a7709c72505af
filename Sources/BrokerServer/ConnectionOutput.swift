import NIOCore
import Wire

/// The bytes a connection owes its socket, in the order they must leave: answers and pushes gathered into one
/// buffer, so that a turn is one channel write and one flush however many answers it gave (a channel write per
/// answer pays NIO's bookkeeping per buffer for every one). A write of `largeWrite` bytes or more is not copied:
/// it becomes a buffer of its own, after what was gathered before it.
struct ConnectionOutput {
    /// Small writes, gathered. Empty (no storage) until the first write of a turn takes `spare`.
    private var gathering = ByteBuffer()
    /// Whole buffers that leave before `gathering`, in order: only when a large write came.
    private var before: [ByteBuffer] = []
    private var beforeBytes = 0
    /// The last buffer handed out, taken again for the next turn's writes: by then the channel has written it and
    /// let go, so clearing it reuses its storage (a fresh buffer per turn would be the only allocation of a
    /// pipelined ping). If the channel still holds it, clearing allocates, as a fresh buffer would.
    private var spare = ByteBuffer()

    /// What `gathering` starts with: 16 write acknowledgements are 640 bytes.
    static let capacity = 1024
    /// The largest spare kept: an idle connection holds at most this (32 MiB at 4,096 connections).
    static let spareLimit = 8 * 1024
    /// From this size a write is handed on as it is: copying it would cost more than a buffer of its own.
    static let largeWrite = 16 * 1024

    /// The bytes held, not yet handed out.
    var count: Int { beforeBytes + gathering.readableBytes }

    /// Appends `message`'s frames, or, when it cannot be sent (too long for a frame, say), the error frame that says
    /// so in its place.
    mutating func append(_ message: ServerMessage, id: UInt32, maxFrameLength: Int) {
        prepareGathering()
        Self.encode(message, id: id, maxFrameLength: maxFrameLength, into: &gathering)
    }

    /// Appends `message`'s frames to `buffer`, or the error frame that says why it cannot be sent.
    static func encode(_ message: ServerMessage, id: UInt32, maxFrameLength: Int, into buffer: inout ByteBuffer) {
        let start = buffer.writerIndex
        do {
            try message.encode(id: id, maxFrameLength: maxFrameLength, into: &buffer)
        } catch {
            buffer.moveWriterIndex(to: start)
            buffer.writeImmutableBuffer(ServerSession.errorFrame(error, id: id))
        }
    }

    /// Appends encoded frames: copied when short, kept as they are when long.
    mutating func append(_ bytes: ByteBuffer) {
        guard bytes.readableBytes < Self.largeWrite else { return appendWhole(bytes) }
        prepareGathering()
        gathering.writeImmutableBuffer(bytes)
    }

    /// Appends a push's frames (encoded once for every subscriber, with id 0) with this connection's subscription
    /// id: copied with the id set when short (one copy), else re-headed frame by frame, each piece gathered or kept
    /// whole as any write is (a long payload stays shared with the other subscribers).
    mutating func append(push bytes: ByteBuffer, subscriptionID: UInt32) {
        guard bytes.readableBytes < Self.largeWrite else {
            bytes.forEachFrame(withID: subscriptionID) { append($0) }
            return
        }
        prepareGathering()
        bytes.writeFrames(withID: subscriptionID, into: &gathering)
    }

    /// The next buffer to write, in order; `nil` when everything was handed out.
    mutating func next() -> ByteBuffer? {
        if !before.isEmpty {
            let first = before.removeFirst()
            beforeBytes -= first.readableBytes
            return first
        }
        guard gathering.readableBytes > 0 else { return nil }
        let out = gathering
        spare = out.capacity <= Self.spareLimit ? out : ByteBuffer()
        gathering = ByteBuffer()
        return out
    }

    /// Every buffer still held, in order (the connection's last writes before it closes).
    mutating func takeAll() -> [ByteBuffer] {
        var all: [ByteBuffer] = []
        while let next = next() { all.append(next) }
        return all
    }

    /// Lets go of everything, the spare included.
    mutating func discard() {
        self = ConnectionOutput()
    }

    private mutating func appendWhole(_ bytes: ByteBuffer) {
        if gathering.readableBytes > 0 {
            beforeBytes += gathering.readableBytes
            before.append(gathering)
            gathering = ByteBuffer()
        }
        beforeBytes += bytes.readableBytes
        before.append(bytes)
    }

    /// Gives `gathering` storage for the turn: the spare emptied, or a new buffer.
    private mutating func prepareGathering() {
        guard gathering.capacity == 0 else { return }
        var buffer = spare
        spare = ByteBuffer()
        if buffer.capacity >= Self.capacity, buffer.capacity <= Self.spareLimit {
            buffer.clear()
            gathering = buffer
        } else {
            gathering = ByteBufferAllocator().buffer(capacity: Self.capacity)
        }
    }
}
