import NIOCore
import StoreModel
import Testing
import TestSupport

/// `IDHash`, the keyed hash of ids the daemon's tables use (`ItemID.tableHash`).
@Suite struct IDHashTests {
    private func ids(_ count: Int, length: ClosedRange<Int>, seed: UInt64) -> [String] {
        var generator = SeededGenerator(state: seed)
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz0123456789-_:é€".unicodeScalars)
        return (0..<count).map { _ in
            let n = Int(generator.next() % UInt64(length.count)) + length.lowerBound
            return String(String.UnicodeScalarView((0..<n).map { _ in alphabet[Int(generator.next() % UInt64(alphabet.count))] }))
        }
    }

    /// A text id, a view of a buffer and a kept item's id: one hash for the same bytes (the table finds an item by
    /// any of them), for every length up to past two 16-byte blocks.
    @Test func everyFormOfAnIdHashesAlike() {
        for id in ids(400, length: 0...40, seed: 1) {
            let text = ItemID(id)
            let view = ItemID(utf8: ByteBuffer(string: id))!
            let keptItem = Array(id.utf8).withUnsafeBytes { bytes in
                KeptItem.make(id: bytes, payload: UnsafeRawBufferPointer(start: nil, count: 0))
            }
            #expect(text.tableHash == view.tableHash, "\(id)")
            #expect(text.tableHash == ItemID(kept: keptItem).tableHash, "\(id)")
            #expect(text.tableHash == Array(id.utf8).withUnsafeBytes { IDHash.hash($0) })
        }
    }

    /// 200,000 distinct ids (sequential, as load generators make them, and random of 1 to 40 bytes): no two share
    /// a 64-bit hash, and flipping any one bit of an id changes its hash.
    @Test func distinctIdsHashApart() {
        let all = Set((0..<100_000).map { "key:\($0)" } + ids(100_000, length: 1...40, seed: 2))
        let hashes = Set(all.map { ItemID($0).tableHash })
        #expect(hashes.count == all.count)
        for id in ids(300, length: 1...40, seed: 3) {
            var bytes = Array(id.utf8)
            let original = bytes.withUnsafeBytes { IDHash.hash($0) }
            for bit in 0..<(bytes.count * 8) {
                bytes[bit / 8] ^= 1 << (bit % 8)
                #expect(bytes.withUnsafeBytes { IDHash.hash($0) } != original, "\(id), bit \(bit)")
                bytes[bit / 8] ^= 1 << (bit % 8)
            }
        }
    }

    /// The table takes a bucket from the hash's low bits: sequential ids spread over them evenly (65,536 ids in
    /// 4,096 buckets by the low 12 bits: 16 each on average; a Poisson spread stays far below 48).
    @Test func lowBitsSpreadSequentialIds() {
        var buckets = [Int](repeating: 0, count: 4096)
        for n in 0..<65_536 { buckets[ItemID("item-\(n)").tableHash & 4095] += 1 }
        #expect(buckets.min()! > 0 && buckets.max()! < 48, "min \(buckets.min()!), max \(buckets.max()!)")
    }
}

