// CRC-32C (Castagnoli, the polynomial of iSCSI, ext4 and LevelDB's log), eight bytes per step ("slicing by 8"):
// the checksum of every log record and snapshot. A table-driven byte-at-a-time CRC runs at about one byte per
// cycle; eight tables read a 64-bit word per step, which keeps a 5 MB commit group's checksum under its write.

package enum CRC32C {
    /// Eight tables of 256 entries, one after another: table k maps a byte to its CRC contribution k bytes on.
    private static let tables: [UInt32] = {
        var tables = [UInt32](repeating: 0, count: 8 * 256)
        for byte in 0..<256 {
            var crc = UInt32(byte)
            for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0x82F6_3B78 : crc >> 1 }
            tables[byte] = crc
        }
        for k in 1..<8 {
            for byte in 0..<256 {
                let previous = tables[(k - 1) * 256 + byte]
                tables[k * 256 + byte] = (previous >> 8) ^ tables[Int(previous & 0xff)]
            }
        }
        return tables
    }()

    /// The CRC of `bytes` continued from `crc` (0 to start).
    package static func update(_ crc: UInt32, _ bytes: UnsafeRawBufferPointer) -> UInt32 {
        guard var p = bytes.baseAddress else { return crc }
        var n = bytes.count
        var c = ~crc
        tables.withUnsafeBufferPointer { t in
            while n >= 8 {
                let word = UInt64(littleEndian: p.loadUnaligned(as: UInt64.self))
                let low = UInt32(truncatingIfNeeded: word) ^ c
                let high = UInt32(truncatingIfNeeded: word >> 32)
                c = t[7 * 256 + Int(low & 0xff)] ^ t[6 * 256 + Int((low >> 8) & 0xff)]
                    ^ t[5 * 256 + Int((low >> 16) & 0xff)] ^ t[4 * 256 + Int(low >> 24)]
                    ^ t[3 * 256 + Int(high & 0xff)] ^ t[2 * 256 + Int((high >> 8) & 0xff)]
                    ^ t[1 * 256 + Int((high >> 16) & 0xff)] ^ t[Int(high >> 24)]
                p += 8
                n -= 8
            }
            while n > 0 {
                c = t[Int((c ^ UInt32(p.load(as: UInt8.self))) & 0xff)] ^ (c >> 8)
                p += 1
                n -= 1
            }
        }
        return ~c
    }

    package static func checksum(_ bytes: UnsafeRawBufferPointer) -> UInt32 { update(0, bytes) }
}
