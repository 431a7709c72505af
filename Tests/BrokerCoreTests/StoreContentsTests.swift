@testable import BrokerCore
import NIOCore
@testable import StoreModel
import Testing

/// Memory keeps an item as one allocation (the id's bytes, then the payload): records read back are the ones
/// written, whether or not their payload came with the id in front.
@Suite struct StoreContentsTests {
    private func record(_ id: String, _ payload: String, prefixed: Bool) -> ItemRecord {
        guard prefixed else { return ItemRecord(id: ItemID(id), createdAt: 1, updatedAt: 2, payload: Payload(payload)) }
        // As the planner makes a record: one kept item, its id and payload views of it.
        let item = Array(id.utf8).withUnsafeBytes { id in
            Array(payload.utf8).withUnsafeBytes { KeptItem.make(id: id, payload: $0) }
        }
        return ItemRecord(id: ItemID(kept: item), createdAt: 1, updatedAt: 2, payload: Payload(kept: item))
    }

    @Test(arguments: [false, true])
    func recordsComeBackAsWritten(prefixed: Bool) {
        let ids = ["a", "é", "e\u{301}", "a-much-longer-id-than-fifteen-bytes", "b"]
        var contents = StoreContents()
        contents.apply([.insert(records: ids.enumerated().map { record($1, "payload \($0)", prefixed: prefixed) })])
        #expect(contents.count == 5)
        #expect(contents.records.map(\.id.string) == ids)
        #expect(contents.records.map { String(buffer: $0.payload.bytes) } == (0..<5).map { "payload \($0)" })
        // "é" and "e" + U+0301 are different ids: bytes, not canonical equivalence.
        #expect(contents.record("é").map { String(buffer: $0.payload.bytes) } == "payload 1")
        #expect(contents.record("e\u{301}").map { String(buffer: $0.payload.bytes) } == "payload 2")
        #expect(contents.record("missing") == nil)
        #expect(contents.records(after: "é", limit: 2)?.map(\.id.string) == ["e\u{301}", "a-much-longer-id-than-fifteen-bytes"])
        #expect(contents.ids(after: "zz", limit: 0) == nil)

        contents.apply([.insert(records: [record("a", "replaced", prefixed: prefixed)]), .remove(ids: ["é", "zz"])])
        #expect(contents.ids.map(\.string) == ["a", "e\u{301}", "a-much-longer-id-than-fifteen-bytes", "b"])
        #expect(contents.record("a").map { String(buffer: $0.payload.bytes) } == "replaced")
        #expect(!contents.contains("é") && contents.contains("b"))
    }

    @Test func aPayloadBuiltWithItsIDInFrontIsKeptWithoutACopy() {
        let written = record("shared-storage-id-0001", "the payload", prefixed: true)
        var contents = StoreContents()
        contents.apply([.insert(records: [written])])
        let read = contents.record("shared-storage-id-0001")!
        let address = { (payload: Payload) in payload.withUnsafeReadableBytes { $0.baseAddress } }
        #expect(address(read.payload) == address(written.payload))
        #expect(read == written)
    }
}

/// Ids are decoded as views of the request's frame (no `String` per id): whatever outlives the request (events,
/// history, memory) holds its own bytes, never the frame.
@Suite struct KeptIDsTests {
    @Test func recordsAndRemovedIDsHoldNothingOfTheRequestFrame() throws {
        let frame = ByteBuffer(string: String(repeating: "x", count: 4096) + "key:000000000001")
        let id = try #require(ItemID(utf8: frame.getSlice(at: 4096, length: 16)!))
        var contents = StoreContents()
        var planner = WritePlanner(base: contents)
        let planned = planner.plan(.insert([Item(id: id, payload: Payload(ByteBuffer(string: "p")))]), now: 1)
        let inserted = try #require(planned)
        guard case .insert(let records) = inserted[0], let kept = records[0].id.keptItem else {
            Issue.record("the record's id is not a view of its kept item")
            return
        }
        // Views of the item's own storage: its id then its payload, 17 bytes, not the 4,112-byte frame.
        #expect(records[0].id == id && records[0].payload.keptItem?.isSame(as: kept) == true)
        #expect(kept.idCount == 16 && kept.payloadCount == 1)
        contents.apply(inserted)

        var remover = WritePlanner(base: contents)
        let plannedRemoval = remover.plan(.remove([id]), now: 2)
        let removed = try #require(plannedRemoval)
        guard case .remove(let ids) = removed[0], case .text = ids[0].storage else {
            Issue.record("a removed id kept a view of the frame")
            return
        }
        var clearer = WritePlanner(base: contents)
        let plannedClear = clearer.plan(.removeAll, now: 2)
        let cleared = try #require(plannedClear)
        guard case .remove(let all) = cleared[0], case .text = all[0].storage else {
            Issue.record("a removeAll's id kept a view of the removed item")
            return
        }
        #expect(ids == [id] && all == [id])
    }

    @Test func aRemoveAllAfterAnInsertInTheSameGroupHoldsNothingOfTheFrame() throws {
        let frame = ByteBuffer(string: String(repeating: "x", count: 4096) + "key:000000000002")
        let id = try #require(ItemID(utf8: frame.getSlice(at: 4096, length: 16)!))
        // One chain: the removeAll's ids include the id its insert appended (as the request read it).
        var planner = WritePlanner(base: StoreContents())
        let planned = planner.plan(
            .chain([.insert(items: [Item(id: id, payload: Payload(ByteBuffer(string: "p")))]), .removeAll]), now: 1)
        let steps = try #require(planned)
        guard case .remove(let all) = try #require(steps.last), all == [id], case .text = all[0].storage else {
            Issue.record("a removeAll's id kept a view of the request's frame: \(steps)")
            return
        }
    }
}

/// The planner's hints (each inserted id's hash, and whether memory lacks it) let the replay skip hashing and
/// looking up again: replaying with them must leave exactly what replaying without them leaves, whatever a group
/// of requests does (repeats in a batch, chains, removes and a removeAll between inserts).
@Suite struct InsertHintTests {
    @Test func replayingWithHintsEqualsReplayingWithout() throws {
        var generator = SystemRandomNumberGenerator()
        for round in 0..<300 {
            var contents = StoreContents()
            for id in 0..<Int.random(in: 0..<6, using: &generator) {
                contents.apply([.insert(records: [ItemRecord(id: ItemID("i\(id)"), createdAt: 1, updatedAt: 1, payload: Payload(ByteBuffer(string: "base")))])])
            }
            func items() -> [Item] {
                (0..<Int.random(in: 1..<5, using: &generator)).map { _ in
                    Item(id: ItemID("i\(Int.random(in: 0..<8, using: &generator))"), payload: Payload(ByteBuffer(string: "r\(round)")))
                }
            }
            func operation() -> WriteOperation {
                switch Int.random(in: 0..<10, using: &generator) {
                case 0..<5: return .insert(items())
                case 5..<7: return .remove((0..<2).map { _ in ItemID("i\(Int.random(in: 0..<8, using: &generator))") })
                case 7: return .removeAll
                default:
                    return .chain([.insert(items: items()), .remove(ids: [ItemID("i\(Int.random(in: 0..<8, using: &generator))")]), .insert(items: items())])
                }
            }
            let operations = (0..<Int.random(in: 1..<5, using: &generator)).map { _ in operation() }
            var planner = WritePlanner(base: contents)
            var commits: [[EventStep]] = []
            for (index, operation) in operations.enumerated() {
                if let steps = planner.plan(operation, now: 2, last: index == operations.count - 1) { commits.append(steps) }
            }
            var hinted = contents
            var plain = contents
            var next = 0
            var released = StoreContents.Released()
            for steps in commits {
                hinted.apply(steps, hints: planner.insertHints, from: &next, released: &released)
                plain.apply(steps)
            }
            #expect(next == planner.insertHints.count)
            #expect(hinted.records == plain.records, "round \(round): \(operations)")
        }
    }
}
