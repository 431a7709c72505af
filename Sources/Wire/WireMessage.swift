import NIOCore

/// The payload of one message type.
public protocol WireMessage: Hashable, Sendable, Codable {
    static var type: MessageType { get }
    /// Decodes the payload; the caller checks afterwards that every byte was consumed.
    init(payload: inout ByteBuffer) throws(WireError)
    func encode(payload: inout ByteBuffer) throws(WireError)
}

/// A message whose last field is a list that may be spread over several frames.
///
/// Every frame of such a message is a complete message of the same type and id; all but the last carry the
/// `more` flag; the fields before the list are the same in every frame; the receiver concatenates the
/// lists. A single element is never split, except where its `fragments(maxLength:)` says how (event steps).
public protocol SplittableMessage: WireMessage {
    associatedtype Element: WireCodable
    var elements: [Element] { get set }
    /// Writes every field before the list.
    func encodeHead(payload: inout ByteBuffer) throws(WireError)
}

extension SplittableMessage {
    public func encode(payload: inout ByteBuffer) throws(WireError) {
        try encodeHead(payload: &payload)
        try payload.writeWireList(elements)
    }

    /// Appends the elements of the next frame of the same message, after checking that its other fields
    /// match the first frame's.
    public mutating func appendContinuation(_ next: Self) throws(WireError) {
        var head = self
        head.elements = []
        var nextHead = next
        nextHead.elements = []
        guard head == nextHead else {
            throw WireError.malformed("a continuation frame of \(Self.type.name) does not match the first frame")
        }
        elements.append(contentsOf: next.elements)
    }
}

extension WireMessage {
    /// Writes this message as one frame; throws `frameTooLarge` (writing nothing) if it does not fit.
    public func encodeFrame(
        id: UInt32, flags: FrameFlags = [], maxFrameLength: Int = WireProtocol.defaultMaxFrameLength,
        into out: inout ByteBuffer
    ) throws(WireError) {
        let start = out.writeFrameHeader(type: Self.type, flags: flags, id: id)
        do {
            try encode(payload: &out)
        } catch {
            out.moveWriterIndex(to: start)
            throw error
        }
        let length = out.writerIndex - start
        guard length <= maxFrameLength else {
            out.moveWriterIndex(to: start)
            throw WireError(
                .frameTooLarge,
                "a \(Self.type.name) message needs \(length) bytes, over the frame maximum of \(maxFrameLength)")
        }
        out.patchFrameLength(frameStart: start)
    }
}

extension SplittableMessage {
    /// Writes this message as one or more frames of at most `maxFrameLength` bytes each.
    public func encodeFrames(id: UInt32, maxFrameLength: Int, into out: inout ByteBuffer) throws(WireError) {
        let original = out.writerIndex
        do {
            if try encodeOneFrame(id: id, maxFrameLength: maxFrameLength, into: &out) { return }
            try encodeFramesUnchecked(id: id, maxFrameLength: maxFrameLength, into: &out)
        } catch {
            out.moveWriterIndex(to: original)
            throw error
        }
    }

    /// The whole message as one frame, straight into `out`, when it fits (most answers): true. Otherwise
    /// writes nothing and returns false; it stops as soon as the frame is over the limit, so a message of many
    /// frames costs at most one frame's worth of encoding here.
    private func encodeOneFrame(id: UInt32, maxFrameLength: Int, into out: inout ByteBuffer) throws(WireError) -> Bool {
        let start = out.writeFrameHeader(type: Self.type, flags: [], id: id)
        try encodeHead(payload: &out)
        out.writeInteger(UInt32(elements.count))
        for element in elements {
            try element.encode(wire: &out)
            if out.writerIndex - start > maxFrameLength {
                out.moveWriterIndex(to: start)
                return false
            }
        }
        if out.writerIndex - start > maxFrameLength {
            out.moveWriterIndex(to: start)
            return false
        }
        out.patchFrameLength(frameStart: start)
        return true
    }

    private func encodeFramesUnchecked(id: UInt32, maxFrameLength: Int, into out: inout ByteBuffer) throws(WireError) {
        var scratch = ByteBuffer()
        try encodeHead(payload: &scratch)
        let room = maxFrameLength - WireProtocol.headerLength - scratch.readableBytes - 4
        guard room > 0 else {
            throw WireError(.frameTooLarge, "the fields of a \(Self.type.name) message do not fit in one frame")
        }
        var pieces: [Element] = []
        pieces.reserveCapacity(elements.count)
        for element in elements {
            pieces.append(contentsOf: element.fragments(maxLength: room))
        }
        var next = 0
        repeat {
            let start = out.writeFrameHeader(type: Self.type, flags: [], id: id)
            try encodeHead(payload: &out)
            let countIndex = out.writerIndex
            out.writeInteger(UInt32(0))
            var written: UInt32 = 0
            while next < pieces.count {
                let mark = out.writerIndex
                try pieces[next].encode(wire: &out)
                if out.writerIndex - start > maxFrameLength {
                    out.moveWriterIndex(to: mark)
                    guard written > 0 else {
                        throw WireError(
                            .frameTooLarge,
                            "one item, id or step is too large for a frame of \(maxFrameLength) bytes (--max-frame)")
                    }
                    break
                }
                written += 1
                next += 1
            }
            out.setInteger(written, at: countIndex)
            if next < pieces.count {
                out.setInteger(FrameFlags.more.rawValue, at: start + 5)
            }
            out.patchFrameLength(frameStart: start)
        } while next < pieces.count
    }
}
