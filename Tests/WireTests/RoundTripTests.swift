import NIOCore
import NIOTestUtils
import Testing
@testable import StoreModel
import Wire

@Suite struct RoundTripTests {
    @Test(arguments: samples.map(\.name))
    func everySampleRoundTrips(name: String) throws {
        let sample = try #require(samples.first { $0.name == name })
        let bytes = try sample.message.encoded(
            id: sample.id, maxFrameLength: sample.maxFrameLength ?? WireProtocol.defaultMaxFrameLength)
        let (id, decoded) = try AnyMessage.decodeOne(bytes)
        #expect(id == sample.id)
        #expect(decoded == sample.message)
        // `type` is a switch of its own: it names the type of the message in the case, as the frame does.
        switch sample.message {
        case .client(let message): #expect(message.type == Swift.type(of: message.body).type)
        case .server(let message): #expect(message.type == Swift.type(of: message.body).type)
        }
        #expect(bytes.getInteger(at: 4, as: UInt8.self) == sample.message.type.rawValue)
    }

    /// All samples back to back, as one stream.
    func stream() throws -> (ByteBuffer, [AnyMessage]) {
        var stream = ByteBuffer()
        for sample in samples {
            var bytes = try sample.message.encoded(
                id: sample.id, maxFrameLength: sample.maxFrameLength ?? WireProtocol.defaultMaxFrameLength)
            stream.writeBuffer(&bytes)
        }
        return (stream, samples.map(\.message))
    }

    func decodeAll(_ buffer: inout ByteBuffer, into messages: inout [AnyMessage], assembler: inout ServerMessageAssembler)
        throws
    {
        let decoder = FrameDecoder(maxFrameLength: WireProtocol.defaultMaxFrameLength)
        while let frame = try decoder.decode(&buffer) {
            if frame.header.type < 0x40 {
                messages.append(.client(try ClientMessage(frame: frame)))
            } else if let message = try assembler.receive(frame) {
                messages.append(.server(message))
            }
        }
    }

    /// An inserted item is decoded straight into what the daemon keeps: one allocation holding the id's bytes and
    /// the payload's (`KeptItem`), nothing of the frame's buffer.
    @Test func insertedItemsAreDecodedKept() throws {
        let items = [
            Item(id: "a", payload: Payload("{}")), Item(id: "é-2", payload: Payload("")),
            Item(id: "", payload: Payload(String(repeating: "x", count: 300))),
        ]
        let bytes = try AnyMessage.client(.insert(.init(store: "s", items: items))).encoded(id: 3)
        guard case (3, .client(.insert(let insert))) = try AnyMessage.decodeOne(bytes) else {
            Issue.record("not an insert")
            return
        }
        #expect(insert.elements == items)
        for (index, item) in insert.elements.enumerated() {
            let kept = try #require(item.keptItem, "item \(index) is not kept")
            kept.withIDAndPayload { id, payload in
                #expect(Array(id) == Array(items[index].id.string.utf8))
                #expect(payload.count == items[index].payload.count)
            }
        }
    }

    @Test func manyFramesInOneBuffer() throws {
        var (buffer, expected) = try stream()
        var messages: [AnyMessage] = []
        var assembler = ServerMessageAssembler()
        try decodeAll(&buffer, into: &messages, assembler: &assembler)
        #expect(messages == expected)
        #expect(buffer.readableBytes == 0)
    }

    @Test func oneByteAtATime() throws {
        let (all, expected) = try stream()
        var buffer = ByteBuffer()
        var messages: [AnyMessage] = []
        var assembler = ServerMessageAssembler()
        for byte in all.readableBytesView {
            buffer.writeInteger(byte)
            try decodeAll(&buffer, into: &messages, assembler: &assembler)
        }
        #expect(messages == expected)
        #expect(buffer.readableBytes == 0)
    }

    /// NIO's verifier feeds the decoder every split of the input and checks it behaves the same.
    @Test func nioDecoderVerifier() throws {
        var frames: [(ByteBuffer, [Frame])] = []
        for sample in samples.prefix(12) {
            var bytes = try sample.message.encoded(id: sample.id)
            let expected = try #require(try FrameDecoder(maxFrameLength: .max).decode(&bytes))
            frames.append((try sample.message.encoded(id: sample.id), [expected]))
        }
        try ByteToMessageDecoderVerifier.verifyDecoder(inputOutputPairs: frames) {
            FrameToMessageDecoder(maxFrameLength: WireProtocol.defaultMaxFrameLength)
        }
    }

    static func record(_ index: Int, payloadLength: Int = 40) -> ItemRecord {
        ItemRecord(
            id: ItemID("item-\(index)"), createdAt: UInt64(index), updatedAt: UInt64(index) + 1,
            payload: Payload(ByteBuffer(repeating: UInt8(truncatingIfNeeded: index), count: payloadLength)))
    }

    /// Decodes a stream of frames, checking each against the limit and the `more` flags.
    func framesOf(_ bytes: ByteBuffer, maxFrameLength: Int) throws -> [Frame] {
        var buffer = bytes
        var frames: [Frame] = []
        while let frame = try FrameDecoder(maxFrameLength: maxFrameLength).decode(&buffer) { frames.append(frame) }
        #expect(buffer.readableBytes == 0)
        for (index, frame) in frames.enumerated() {
            #expect(frame.header.flags.contains(.more) == (index < frames.count - 1))
        }
        return frames
    }

    @Test func aLargeSnapshotSpansFramesAndJoinsBack() throws {
        let records = (0..<1000).map { Self.record($0) }
        let message = ServerMessage.storeLoaded(.init(epoch: 5, sequence: 77, count: 1000, elements: records))
        var out = ByteBuffer()
        try message.encode(id: 3, maxFrameLength: 4096, into: &out)
        let frames = try framesOf(out, maxFrameLength: 4096)
        #expect(frames.count > 10)
        var assembler = ServerMessageAssembler()
        var result: [ServerMessage] = []
        for frame in frames {
            if let whole = try assembler.receive(frame) { result.append(whole) }
        }
        #expect(result == [message])
    }

    @Test func aHugeEventStepIsSentAsConsecutiveStepsOfTheSameOp() throws {
        let records = (0..<500).map { Self.record($0, payloadLength: 100) }
        let ids = (0..<800).map { ItemID("removed-\($0)") }
        let event = ServerMessage.StoreEvent(
            epoch: 1, sequence: 2, elements: [.insert(records: records), .remove(ids: ids)])
        var out = ByteBuffer()
        try ServerMessage.storeEvent(event).encode(id: 9, maxFrameLength: 2048, into: &out)
        var assembler = ServerMessageAssembler()
        var joined: ServerMessage?
        for frame in try framesOf(out, maxFrameLength: 2048) {
            joined = try assembler.receive(frame) ?? joined
        }
        guard case .storeEvent(let received) = try #require(joined) else {
            Issue.record("not an event")
            return
        }
        #expect(received.epoch == 1 && received.sequence == 2)
        var insertedRecords: [ItemRecord] = []
        var removedIDs: [ItemID] = []
        var sawRemove = false
        for step in received.elements {
            switch step {
            case .insert(let r):
                #expect(!sawRemove, "steps keep their order")
                insertedRecords += r
            case .remove(let i):
                sawRemove = true
                removedIDs += i
            }
        }
        #expect(insertedRecords == records)
        #expect(removedIDs == ids)
        #expect(received.elements.count > 2)
    }

    @Test func interleavedMultiFrameMessagesJoinByIDAndKind() throws {
        let range = ServerMessage.rangeResult(.init(epoch: 1, sequence: 1, elements: (0..<50).map { Self.record($0) }))
        let loaded = ServerMessage.storeLoaded(
            .init(epoch: 1, sequence: 1, count: 50, elements: (50..<100).map { Self.record($0) }))
        var a = ByteBuffer()
        var b = ByteBuffer()
        try range.encode(id: 4, maxFrameLength: 512, into: &a)
        // The same number as a subscription id: pushes and answers are told apart by their type.
        try loaded.encode(id: 4, maxFrameLength: 512, into: &b)
        let framesA = try framesOf(a, maxFrameLength: 512)
        let framesB = try framesOf(b, maxFrameLength: 512)
        var assembler = ServerMessageAssembler()
        var results: [ServerMessage] = []
        for index in 0..<max(framesA.count, framesB.count) {
            for frames in [framesA, framesB] where index < frames.count {
                if let whole = try assembler.receive(frames[index]) { results.append(whole) }
            }
        }
        #expect(Set(results) == [range, loaded])
        #expect(assembler.isIdle)
    }

    @Test func anElementLargerThanAFrameIsRefusedAndWritesNothing() throws {
        let message = ServerMessage.rangeResult(
            .init(epoch: 1, sequence: 1, elements: [Self.record(1, payloadLength: 5000)]))
        var out = ByteBuffer(string: "keep")
        #expect(throws: WireError.self) { try message.encode(id: 1, maxFrameLength: 4096, into: &out) }
        #expect(out == ByteBuffer(string: "keep"))
        do {
            try message.encode(id: 1, maxFrameLength: 4096, into: &out)
        } catch {
            #expect(error.code == .frameTooLarge)
            // Said in the user's words: the limit and its flag, never the wire message's name ("rangeResult").
            #expect(error.message == "one item, id or step is too large for a frame of 4096 bytes (--max-frame)")
        }
    }

    @Test func aRequestThatDoesNotFitInOneFrameIsRefused() throws {
        let items = (0..<100).map { Item(id: ItemID("i\($0)"), payload: Payload(ByteBuffer(repeating: 1, count: 100))) }
        var out = ByteBuffer()
        let error = try #require(throws: WireError.self) {
            try ClientMessage.insert(.init(store: "s", items: items)).encode(id: 1, maxFrameLength: 4096, into: &out)
        }
        #expect(error.code == .frameTooLarge)
        #expect(out.readableBytes == 0)
    }

    @Test func anEmptyListIsOneFrame() throws {
        var out = ByteBuffer()
        try ServerMessage.storeList(.init(elements: [])).encode(id: 1, maxFrameLength: 64, into: &out)
        #expect(try framesOf(out, maxFrameLength: 64).count == 1)
    }

    @Test func idsCompareAsBytes() {
        let precomposed = ItemID("\u{E9}")
        let decomposed = ItemID("e\u{301}")
        #expect(precomposed.string == decomposed.string, "Swift's String equality is canonical")
        #expect(precomposed != decomposed)
        #expect(Set([precomposed, decomposed]).count == 2)
    }

    @Test func theBytesOfAnIDSurviveTheRoundTrip() throws {
        let id = ItemID("e\u{301}")
        let message = AnyMessage.client(.remove(.init(store: "s", ids: [id])))
        let (_, decoded) = try AnyMessage.decodeOne(try message.encoded(id: 1))
        guard case .client(.remove(let remove)) = decoded else {
            Issue.record("not a remove")
            return
        }
        #expect(Array(remove.ids[0].string.utf8) == [0x65, 0xCC, 0x81])
    }

    @Test func anIDOverBytesIsTheSameIDAsItsString() throws {
        let text = ItemID("key:000000012345")  // 16 bytes: a heap string
        let frame = ByteBuffer(string: "xx" + "key:000000012345" + "payload")
        let view = try #require(ItemID(utf8: frame.getSlice(at: 2, length: 16)!))
        #expect(view == text && text == view && view.hashValue == text.hashValue && view.tableHash == text.tableHash)
        #expect(view.string == "key:000000012345" && view.utf8Count == 16)
        #expect(!(view < text) && !(text < view) && ItemID("key:0") < view && view < ItemID("key:1"))
        #expect(Naming.problem(withID: view) == nil)
        // A view of a larger buffer is copied when kept; one exactly its own size is kept as it is.
        #expect(view.compacted == view)
        guard case .text = view.compacted.storage else { Issue.record("a view of a frame was not compacted"); return }
        let exact = try #require(ItemID(utf8: Payload(ByteBuffer(string: "e\u{301}")).owned.bytes))
        guard case .bytes = exact.compacted.storage else { Issue.record("an exact view was copied"); return }
        #expect(exact == ItemID("e\u{301}") && exact != ItemID("\u{E9}"))
        // A kept item's id and payload: the same id and bytes as their plain forms, on the wire too.
        let item = Array("key:000000012345".utf8).withUnsafeBytes { id in
            Array("{}".utf8).withUnsafeBytes { KeptItem.make(id: id, payload: $0) }
        }
        let keptID = ItemID(kept: item), keptPayload = Payload(kept: item)
        #expect(keptID == text && keptID.hashValue == text.hashValue && keptID.tableHash == text.tableHash)
        #expect(keptPayload == Payload("{}") && keptPayload.hashValue == Payload("{}").hashValue)
        #expect(keptID.compacted.keptItem == nil && keptID.compacted == text)  // a kept id would keep the payload
        let record = ItemRecord(id: keptID, createdAt: 1, updatedAt: 2, payload: keptPayload)
        let plain = ItemRecord(id: text, createdAt: 1, updatedAt: 2, payload: Payload("{}"))
        let message = AnyMessage.server(.storeEvent(.init(epoch: 1, sequence: 1, elements: [.insert(records: [record])])))
        #expect(try message.encoded(id: 1)
            == AnyMessage.server(.storeEvent(.init(epoch: 1, sequence: 1, elements: [.insert(records: [plain])]))).encoded(id: 1))
        // Not UTF-8: refused, whether it starts with ASCII or not.
        #expect(ItemID(utf8: ByteBuffer(bytes: Array("abcdefgh".utf8) + [0xC3])) == nil)
        #expect(ItemID(utf8: ByteBuffer(bytes: [0xFF, 0x41])) == nil)
        #expect(Naming.problem(withID: try #require(ItemID(utf8: ByteBuffer(bytes: [0x41, 0x00])))) != nil)
    }

    /// Payloads compare by their bytes whatever holds them (a buffer, a slice of a larger one, a kept item).
    @Test func payloadsCompareByTheirBytes() {
        let kept = Array("k".utf8).withUnsafeBytes { id in Array("abc".utf8).withUnsafeBytes { KeptItem.make(id: id, payload: $0) } }
        var frame = ByteBuffer(string: "xxabcx")
        frame.moveReaderIndex(forwardBy: 2)
        let slice = Payload(frame.getSlice(at: frame.readerIndex, length: 3)!)
        #expect(Payload("abc") == Payload(kept: kept) && slice == Payload(kept: kept) && slice == Payload("abc"))
        #expect(slice.hashValue == Payload("abc").hashValue)
        #expect(Payload("abc") != Payload("abd") && Payload("abc") != Payload("bbc"))  // the last byte, the first
        #expect(Payload("abc") != Payload("ab") && Payload("") != Payload("a") && Payload("a") != Payload(""))
        #expect(Payload("") == Payload(ByteBuffer()) && Payload("") == Payload("").owned)
        let long = String(repeating: "x", count: 4096)
        #expect(Payload(long) == Payload(long).owned && Payload(long) != Payload(long.dropLast() + "y"))
    }

    @Test func namingRules() {
        #expect(Naming.problem(withName: "notes") == nil)
        #expect(Naming.problem(withName: "a.B_c-9") == nil)
        #expect(Naming.problem(withName: String(repeating: "x", count: 128)) == nil)
        for bad in ["", ".", "..", "a/b", "a b", "é", String(repeating: "x", count: 129), "a\u{0}"] {
            #expect(Naming.problem(withName: bad) != nil, "\(bad.debugDescription)")
        }
        #expect(Naming.problem(withID: "n1") == nil)
        #expect(Naming.problem(withID: ItemID(String(repeating: "é", count: 512))) == nil)
        #expect(Naming.problem(withID: ItemID(String(repeating: "é", count: 513))) != nil)
        #expect(Naming.problem(withID: "") != nil)
        #expect(Naming.problem(withID: "a\u{0}b") != nil)
    }
}
