import Testing
import WALFormat

/// The wal engine's record format against fixed bytes: what docs/ENGINE-ABI.md ("wal") and Fuzz/seeds.py write.
@Suite struct WALFormatTests {
    @Test func crc32cHasItsCheckValue() {
        // The standard check value of CRC-32C (the Castagnoli polynomial, reflected): "123456789".
        #expect(Array("123456789".utf8).withUnsafeBytes { CRC32C.checksum($0) } == 0xE306_9283)
        // Any length, not only whole words.
        let bytes = (0..<1000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let whole = bytes.withUnsafeBytes { CRC32C.checksum($0) }
        let pieces = bytes.withUnsafeBytes { CRC32C.update(CRC32C.checksum(.init(rebasing: $0[..<13])), .init(rebasing: $0[13...])) }
        #expect(whole == pieces)
    }

    /// A put of "k1" = "hello" (created 1000, updated 2000) at sequence 1, byte for byte as documented.
    static let record: [UInt8] =
        [44, 0, 0, 0, 0, 0, 0, 0] + [0x09, 0xcc, 0x1d, 0x94]
        + [1, 0, 0, 0, 0, 0, 0, 0] + [1, 0, 0, 0]
        + [1] + [2, 0, 0, 0] + [5, 0, 0, 0] + [0xe8, 3, 0, 0, 0, 0, 0, 0] + [0xd0, 7, 0, 0, 0, 0, 0, 0]
        + Array("k1".utf8) + Array("hello".utf8)

    @Test func aDocumentedRecordReadsBack() throws {
        try Self.record.withUnsafeBytes { bytes in
            guard case .record(let record) = LogRecord.read(bytes, at: 0) else {
                Issue.record("the record does not read: \(LogRecord.read(bytes, at: 0))")
                return
            }
            #expect(record.sequence == 1 && record.stepCount == 1 && record.end == bytes.count)
            var puts: [(String, String, UInt64, UInt64)] = []
            try record.forEachStep { step in
                if case .put(let item) = step {
                    puts.append((String(decoding: item.key, as: UTF8.self), String(decoding: item.payload, as: UTF8.self), item.createdAt, item.updatedAt))
                }
            }
            #expect(puts.count == 1 && puts[0].0 == "k1" && puts[0].1 == "hello" && puts[0].2 == 1000 && puts[0].3 == 2000)
        }
    }

    @Test func aChangedByteIsNotARecord() {
        for index in Self.record.indices {
            var damaged = Self.record
            damaged[index] ^= 0x40
            damaged.withUnsafeBytes { bytes in
                if case .record = LogRecord.read(bytes, at: 0) { Issue.record("byte \(index) changed and the record still reads") }
            }
        }
    }
}
