import NIOCore
import Testing
import Wire

/// One encoding of a push serves every subscriber: `forEachFrame(withID:)` hands out its frames with another
/// subscription id (short frames copied, long ones as a new header and the shared payload), `writeFrames(withID:
/// into:)` appends them so to a buffer, and what comes out decodes to the same message with that id, whether it
/// spans one frame or many.
@Suite struct SharedFramesTests {
    static func event(items: Int, payloadLength: Int) -> ServerMessage {
        let records = (0..<items).map { n in
            ItemRecord(
                id: ItemID("item-\(n)"), createdAt: 1, updatedAt: 2,
                payload: Payload(ByteBuffer(repeating: UInt8(truncatingIfNeeded: n), count: payloadLength)))
        }
        return .storeEvent(.init(epoch: 7, sequence: 42, elements: [.insert(records: records)]))
    }

    static func records(_ message: ServerMessage?) -> [ItemRecord] {
        guard case .storeEvent(let event)? = message else { return [] }
        return event.elements.flatMap { step -> [ItemRecord] in
            if case .insert(let records) = step { return records }
            return []
        }
    }

    @Test(arguments: [(1, 10), (3, 2000), (40, 1000)])
    func reheadedFramesDecodeToTheSameMessage(items: Int, payloadLength: Int) throws {
        let message = Self.event(items: items, payloadLength: payloadLength)
        var shared = ByteBuffer()
        try message.encode(id: 0, maxFrameLength: 8192, into: &shared)
        for id: UInt32 in [1, 77, .max] {
            var stream = ByteBuffer()
            var pieces = 0
            shared.forEachFrame(withID: id) { piece in
                var piece = piece
                pieces += 1
                stream.writeBuffer(&piece)
            }
            #expect(stream.readableBytes == shared.readableBytes)
            // Gathered into a buffer that already holds something: the same bytes after it.
            var gathered = ByteBuffer(bytes: [1, 2, 3])
            shared.writeFrames(withID: id, into: &gathered)
            #expect(gathered.readBytes(length: 3) == [1, 2, 3])
            #expect(gathered == stream)
            let decoder = FrameDecoder(maxFrameLength: 8192)
            var assembler = ServerMessageAssembler()
            var decoded: ServerMessage?
            var frames = 0
            while let frame = try decoder.decode(&stream) {
                frames += 1
                #expect(frame.header.id == id)
                if let whole = try assembler.receive(frame) { decoded = whole }
            }
            // A split event comes back with its insert cut where the frames were cut: compare the records in order.
            #expect(Self.records(decoded) == Self.records(message))
            #expect(frames >= (items * payloadLength > 8192 ? 2 : 1))
            #expect(pieces >= frames)
        }
        // The shared bytes themselves were not changed by re-heading.
        #expect(shared.getInteger(at: 8, as: UInt32.self) == 0)
    }
}
