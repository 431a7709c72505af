import NIOCore

/// Protocol-wide constants.
public enum WireProtocol {
    /// The protocol versions this library speaks, lowest first.
    public static let supportedVersions: [UInt16] = [1]
    /// The four bytes that open every `hello` payload: ASCII "SBRK".
    public static let magic: [UInt8] = [0x53, 0x42, 0x52, 0x4B]
    /// Bytes in a frame header.
    public static let headerLength = 12
    /// The default maximum length of a whole frame (header included) once the handshake is done: 16 MiB.
    public static let defaultMaxFrameLength = 16 * 1024 * 1024
    /// The maximum length of a whole frame before the handshake is done. A `hello` needs far less; the
    /// small cap means a peer that is not speaking this protocol costs the server almost nothing.
    public static let handshakeMaxFrameLength = 1024
    /// The longest client name a `hello` may carry, in bytes.
    public static let maxClientNameLength = 256
    /// The most protocol versions a `hello` may offer.
    public static let maxOfferedVersions = 16

    /// Bytes a frame needs besides one item's payload, for the message with the most around it: a `chain`
    /// holding one insert of one item with a 1,024-byte id, in a store with a 128-byte name, with an
    /// epoch-and-sequence condition. Every answer and push that carries an item (`rangeResult`, `itemsResult`,
    /// `storeLoaded`, `storeEvent`) and every other request needs less, so an item whose payload is at most
    /// `maxFrameLength - itemFrameReserve` can be written, read back and pushed in any of them.
    public static let itemFrameReserve =
        headerLength
        + (2 + Naming.maxNameLength)  // text store
        + (1 + 8 + 8)  // Condition, tag 3
        + 4 + 1 + 4  // list<ChainStep> count, op, list<Item> count
        + (2 + Naming.maxIDLength)  // ItemID
        + 4  // bytes payload: its length

    /// The largest item payload that fits `maxFrameLength` (see `itemFrameReserve`).
    public static func largestItem(maxFrameLength: Int) -> Int { maxFrameLength - itemFrameReserve }
}

/// The flags byte of a frame header.
public struct FrameFlags: OptionSet, Hashable, Sendable {
    public var rawValue: UInt8

    public init(rawValue: UInt8) {
        self.rawValue = rawValue
    }

    /// More frames of the same message follow (same type, same id). Only messages whose type allows it may
    /// set it; see `MessageType.allowsContinuation`.
    public static let more = FrameFlags(rawValue: 0x01)

    /// Every flag this version defines; any other bit set is an `invalidFlags` error.
    public static let defined: FrameFlags = [.more]
}

/// The fixed 12-byte header in front of every frame. All integers are big-endian.
///
/// ```
/// offset 0  u32  payload length (bytes after the header)
/// offset 4  u8   message type
/// offset 5  u8   flags
/// offset 6  u16  reserved, must be 0
/// offset 8  u32  id: the request id (requests and their answers) or the subscription id (pushes)
/// ```
public struct FrameHeader: Hashable, Sendable {
    public var payloadLength: UInt32
    /// The raw type byte; it may name a type this version does not know.
    public var type: UInt8
    public var flags: FrameFlags
    public var id: UInt32

    public init(payloadLength: UInt32, type: UInt8, flags: FrameFlags, id: UInt32) {
        self.payloadLength = payloadLength
        self.type = type
        self.flags = flags
        self.id = id
    }

    /// The length of the whole frame, header included.
    public var frameLength: Int { WireProtocol.headerLength + Int(payloadLength) }
}

/// One frame: its header and exactly `header.payloadLength` bytes of payload.
public struct Frame: Hashable, Sendable {
    public var header: FrameHeader
    public var payload: ByteBuffer

    public init(header: FrameHeader, payload: ByteBuffer) {
        self.header = header
        self.payload = payload
    }

    /// The payload, moved out of the frame it ends (reading `frame.payload` copies it: a reference count taken and
    /// dropped).
    consuming func takePayload() -> ByteBuffer { payload }
}

/// Splits a byte stream into frames, without ever buffering more than the connection's maximum frame.
///
/// The header is checked as soon as its 12 bytes are there: a length over `maxFrameLength` or a reserved field
/// that is not zero throws *before* the payload is awaited or any memory is sized by it. Both mean the stream
/// cannot be trusted any further; everything else about a frame (its type, flags and payload) is checked when
/// its message is decoded, and only that frame is refused. Until a whole frame is readable the buffer is left untouched (`decode` returns `nil`), so bytes may
/// arrive one at a time.
public struct FrameDecoder: Sendable {
    /// The largest whole frame (header included) accepted now. Start with
    /// `WireProtocol.handshakeMaxFrameLength` and raise it once the handshake is done.
    public var maxFrameLength: Int

    public init(maxFrameLength: Int = WireProtocol.handshakeMaxFrameLength) {
        self.maxFrameLength = maxFrameLength
    }

    /// Reads the next whole frame from `buffer`, or returns `nil` (consuming nothing) if it is not all there.
    public func decode(_ buffer: inout ByteBuffer) throws(WireError) -> Frame? {
        guard let header = try peekHeader(buffer) else { return nil }
        guard buffer.readableBytes >= header.frameLength else { return nil }
        buffer.moveReaderIndex(forwardBy: WireProtocol.headerLength)
        let payload = buffer.readSlice(length: Int(header.payloadLength))!
        return Frame(header: header, payload: payload)
    }

    /// Checks the header at the reader index, if its 12 bytes are readable, without consuming anything.
    public func peekHeader(_ buffer: ByteBuffer) throws(WireError) -> FrameHeader? {
        let start = buffer.readerIndex
        guard buffer.readableBytes >= WireProtocol.headerLength,
            let length = buffer.getInteger(at: start, as: UInt32.self),
            let type = buffer.getInteger(at: start + 4, as: UInt8.self),
            let flags = buffer.getInteger(at: start + 5, as: UInt8.self),
            let reserved = buffer.getInteger(at: start + 6, as: UInt16.self),
            let id = buffer.getInteger(at: start + 8, as: UInt32.self)
        else { return nil }
        let header = FrameHeader(payloadLength: length, type: type, flags: FrameFlags(rawValue: flags), id: id)
        guard header.frameLength <= maxFrameLength else {
            throw WireError(
                .frameTooLarge, "frame of \(header.frameLength) bytes is over the maximum of \(maxFrameLength)")
        }
        guard reserved == 0 else {
            throw WireError(.malformed, "reserved header bytes must be zero, got 0x\(String(reserved, radix: 16))")
        }
        return header
    }
}

/// `FrameDecoder` for a NIO pipeline: emits `Frame`s; a stream that ends inside a frame is an error.
public struct FrameToMessageDecoder: NIOSingleStepByteToMessageDecoder {
    public typealias InboundOut = Frame

    public var frameDecoder: FrameDecoder

    public init(maxFrameLength: Int = WireProtocol.handshakeMaxFrameLength) {
        frameDecoder = FrameDecoder(maxFrameLength: maxFrameLength)
    }

    public mutating func decode(buffer: inout ByteBuffer) throws -> Frame? {
        try frameDecoder.decode(&buffer)
    }

    public mutating func decodeLast(buffer: inout ByteBuffer, seenEOF: Bool) throws -> Frame? {
        if let frame = try frameDecoder.decode(&buffer) { return frame }
        if buffer.readableBytes > 0 {
            throw WireError.malformed("the stream ended inside a frame (\(buffer.readableBytes) bytes left over)")
        }
        return nil
    }
}

extension ByteBuffer {
    /// Appends the frames in these bytes (whole frames, encoded with any id) to `out` as frames with `id`: one
    /// copy of all of them, the ids set in `out`. The way to gather a shared push into a connection's output when
    /// it is short; `forEachFrame(withID:_:)` shares the payloads of long ones instead.
    public func writeFrames(withID id: UInt32, into out: inout ByteBuffer) {
        var frameStart = out.writerIndex
        out.writeImmutableBuffer(self)
        while out.writerIndex - frameStart >= WireProtocol.headerLength,
            let payloadLength = out.getInteger(at: frameStart, as: UInt32.self),
            out.writerIndex - frameStart >= WireProtocol.headerLength + Int(payloadLength)
        {
            out.setInteger(id, at: frameStart + 8)
            frameStart += WireProtocol.headerLength + Int(payloadLength)
        }
    }

    /// Hands out the frames in these bytes (whole frames, encoded with any id) as frames with `id`: a short frame
    /// copied with its id set, a long one as a new header and its payload shared, not copied. This is how one
    /// encoding of a push serves every subscriber.
    public func forEachFrame(withID id: UInt32, _ body: (ByteBuffer) -> Void) {
        var rest = self
        while rest.readableBytes >= WireProtocol.headerLength,
            let payloadLength = rest.getInteger(at: rest.readerIndex, as: UInt32.self),
            rest.readableBytes >= WireProtocol.headerLength + Int(payloadLength)
        {
            let frameLength = WireProtocol.headerLength + Int(payloadLength)
            if frameLength <= 1024 {
                var frame = ByteBufferAllocator().buffer(capacity: frameLength)
                var source = rest.readSlice(length: frameLength)!
                frame.writeBuffer(&source)
                frame.setInteger(id, at: frame.readerIndex + 8)
                body(frame)
            } else {
                var header = ByteBufferAllocator().buffer(capacity: WireProtocol.headerLength)
                var source = rest.readSlice(length: WireProtocol.headerLength)!
                header.writeBuffer(&source)
                header.setInteger(id, at: header.readerIndex + 8)
                body(header)
                body(rest.readSlice(length: Int(payloadLength))!)
            }
        }
    }

    /// Writes a frame header; returns the index of the length field so that it can be patched.
    @discardableResult
    mutating func writeFrameHeader(type: MessageType, flags: FrameFlags, id: UInt32) -> Int {
        let start = writerIndex
        writeMultipleIntegers(UInt32(0), type.rawValue, flags.rawValue, UInt16(0), id)
        return start
    }

    /// Sets the length field of the frame starting at `frameStart` from the bytes written since.
    mutating func patchFrameLength(frameStart: Int) {
        setInteger(UInt32(writerIndex - frameStart - WireProtocol.headerLength), at: frameStart)
    }
}
