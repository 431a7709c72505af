/// The hash of an id's bytes for the daemon's tables (`ItemID.tableHash`): keyed with secrets drawn at random
/// when the process first hashes, so that a client cannot choose ids that collide, and cheap for the short ids
/// stores hold.
///
/// Swift's `Hasher` (SipHash-1-3) is too slow for one hash per inserted id (docs/BENCHMARKS.md, "Figures behind
/// choices in the code"). Here an id of up to 16 bytes is read as two overlapping 64-bit words (every byte in
/// one of them), each 16 bytes more folded in by one 64 × 64 → 128-bit multiplication, and the result is folded
/// twice more with the length: a product's high and low halves XOR-ed, so every output bit depends on every
/// input bit. Every multiplication takes one operand XOR-ed with a secret the client cannot know, so no input
/// can make a product zero on purpose (the weakness of unkeyed multiply-fold hashes). The values are never
/// stored: they differ between processes, as `Hasher`'s do.
public enum IDHash {
    @usableFromInline
    struct Secrets: Sendable {
        @usableFromInline let seed: UInt64
        @usableFromInline let first: UInt64
        @usableFromInline let second: UInt64
        @usableFromInline let length: UInt64

        static func random() -> Secrets {
            var generator = SystemRandomNumberGenerator()
            return Secrets(
                seed: generator.next(), first: generator.next(), second: generator.next(), length: generator.next())
        }
    }

    @usableFromInline
    static let secrets = Secrets.random()

    /// The high and low halves of `a × b`, XOR-ed.
    @inlinable @inline(__always)
    static func fold(_ a: UInt64, _ b: UInt64) -> UInt64 {
        let product = a.multipliedFullWidth(by: b)
        return product.high ^ product.low
    }

    @inlinable @inline(__always)
    static func word(_ bytes: UnsafeRawBufferPointer, at offset: Int) -> UInt64 {
        UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
    }

    @inlinable @inline(__always)
    static func halfWord(_ bytes: UnsafeRawBufferPointer, at offset: Int) -> UInt64 {
        UInt64(UInt32(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt32.self)))
    }

    /// The hash of `bytes`.
    @inlinable
    public static func hash(_ bytes: UnsafeRawBufferPointer) -> Int {
        let secrets = Self.secrets
        let count = bytes.count
        var state = secrets.seed
        let a: UInt64
        let b: UInt64
        if count <= 16 {
            if count >= 8 {
                a = word(bytes, at: 0)
                b = word(bytes, at: count - 8)
            } else if count >= 4 {
                a = halfWord(bytes, at: 0)
                b = halfWord(bytes, at: count - 4)
            } else if count > 0 {
                // The first, middle and last bytes: all of them when there are at most three.
                a = UInt64(bytes[0]) << 16 | UInt64(bytes[count >> 1]) << 8 | UInt64(bytes[count - 1])
                b = 0
            } else {
                a = 0
                b = 0
            }
        } else {
            var offset = 0
            while count - offset > 16 {
                state = fold(word(bytes, at: offset) ^ secrets.first, word(bytes, at: offset + 8) ^ state)
                offset += 16
            }
            // The last 16 bytes (overlapping the words above when the count is not a multiple of 16).
            a = word(bytes, at: count - 16)
            b = word(bytes, at: count - 8)
        }
        let mixed = fold(a ^ secrets.first, b ^ state)
        return Int(truncatingIfNeeded: fold(mixed ^ secrets.second, UInt64(count) ^ secrets.length))
    }
}
