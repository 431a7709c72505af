import NIOCore
import Testing
import Wire

/// The largest item a server accepts (`WireProtocol.largestItem`) fits in one frame of every message that
/// carries it, with the longest id and store name (issue "Bounded memory whatever clients do", item 5).
@Suite struct ItemFitTests {
    static let maxFrame = 4096
    static let store = String(repeating: "s", count: Naming.maxNameLength)
    static let id = ItemID(String(repeating: "i", count: Naming.maxIDLength))

    static func messages(payloadLength: Int) -> [(String, AnyMessage)] {
        let payload = Payload(ByteBuffer(repeating: UInt8(ascii: "x"), count: payloadLength))
        let item = Item(id: id, payload: payload)
        let record = ItemRecord(id: id, createdAt: .max, updatedAt: .max, payload: payload)
        let condition = Condition.epochSequence(epoch: .max, sequence: .max)
        return [
            ("insert", .client(.insert(.init(store: store, condition: condition, items: [item])))),
            ("chain", .client(.chain(.init(store: store, condition: condition, steps: [.insert(items: [item])])))),
            ("setValue", .client(.setValue(.init(name: store, condition: condition, value: payload)))),
            ("rangeResult", .server(.rangeResult(.init(epoch: .max, sequence: .max, elements: [record])))),
            ("itemsResult", .server(.itemsResult(.init(epoch: .max, sequence: .max, elements: [.present(record)])))),
            ("storeLoaded", .server(.storeLoaded(.init(epoch: .max, sequence: .max, count: .max, elements: [record])))),
            ("storeEvent", .server(.storeEvent(.init(epoch: .max, sequence: .max, elements: [.insert(records: [record])])))),
            ("valueResult", .server(.valueResult(.init(epoch: .max, sequence: .max, state: .set(payload))))),
            ("valueEvent", .server(.valueEvent(.init(epoch: .max, sequence: .max, state: .set(payload))))),
        ]
    }

    @Test func theLargestItemFitsOneFrameOfEveryMessage() throws {
        let largest = WireProtocol.largestItem(maxFrameLength: Self.maxFrame)
        for (name, message) in Self.messages(payloadLength: largest) {
            let bytes = try message.encoded(id: 1, maxFrameLength: Self.maxFrame)
            #expect(bytes.readableBytes <= Self.maxFrame, "\(name): \(bytes.readableBytes) bytes")
            // One frame: its length field (the payload's) covers everything after the header.
            #expect(
                bytes.getInteger(at: 0, as: UInt32.self).map { Int($0) + WireProtocol.headerLength } == bytes.readableBytes,
                "\(name) spans frames")
        }
    }

    /// The reserve is exact: one byte more and the largest chain no longer fits.
    @Test func theReserveIsTight() throws {
        let largest = WireProtocol.largestItem(maxFrameLength: Self.maxFrame)
        let (_, chain) = Self.messages(payloadLength: largest + 1)[1]
        #expect(throws: WireError.self) { try chain.encoded(id: 1, maxFrameLength: Self.maxFrame) }
    }
}
