@_spi(CustomByteBufferAllocator) import NIOCore
import OrderedStorage

#if canImport(Glibc)
import Glibc
#endif

/// An item id: UTF-8 text compared **as bytes**.
///
/// Swift's `String` equality uses Unicode canonical equivalence ("é" precomposed equals "e" + U+0301);
/// ids must not, so `ItemID` compares and hashes the UTF-8 bytes. Its `string` keeps the bytes exactly as
/// received.
public struct ItemID: Hashable, TableKey, Sendable, Codable, Comparable, CustomStringConvertible,
    ExpressibleByStringLiteral
{
    public var string: String

    public init(_ string: String) {
        self.string = string
    }

    public init(stringLiteral value: String) {
        self.string = value
    }

    // Equality and hashing run several times per item a request writes (the planner, memory, the engine's
    // table): both read the UTF-8 bytes in place (a native or small string has them contiguous), never
    // iterating the view element by element nor copying the string.

    // Always inlined: an opaque call taking an id read from an array or a buffer makes the caller retain the
    // id's string around it (two atomic operations per id, several times per item of a batch).
    @inlinable @inline(__always)
    public static func == (lhs: ItemID, rhs: ItemID) -> Bool {
        let left = lhs.string.utf8, right = rhs.string.utf8
        guard left.count == right.count else { return false }
        let same = left.withContiguousStorageIfAvailable { l in
            right.withContiguousStorageIfAvailable { r in
                l.count == 0 || memcmp(l.baseAddress!, r.baseAddress!, l.count) == 0
            }
        }
        return (same ?? nil) ?? left.elementsEqual(right)
    }

    @inlinable @inline(__always)
    public func hash(into hasher: inout Hasher) {
        let utf8 = string.utf8
        if utf8.withContiguousStorageIfAvailable({ hasher.combine(bytes: UnsafeRawBufferPointer($0)) }) == nil {
            Array(utf8).withUnsafeBytes { hasher.combine(bytes: $0) }
        }
    }

    /// `hashValue`, spelled out so that it inlines (see `==`): the whole hash computed inside the closure that
    /// sees the bytes (finalized outside it, the optimizer kept a retain of the string around the call).
    @inlinable @inline(__always)
    public var tableHash: Int {
        string.utf8.withContiguousStorageIfAvailable { bytes in
            var hasher = Hasher()
            hasher.combine(bytes: UnsafeRawBufferPointer(bytes))
            return hasher.finalize()
        } ?? hashValue
    }

    /// Byte order of the UTF-8 encoding.
    public static func < (lhs: ItemID, rhs: ItemID) -> Bool {
        lhs.string.utf8.lexicographicallyPrecedes(rhs.string.utf8)
    }

    public var description: String { string }

    public init(from decoder: any Decoder) throws {
        string = try decoder.singleValueContainer().decode(String.self)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(string)
    }
}

/// Opaque bytes: an item's payload or a value, kept exactly as given. In JSON (test vectors, `wiredump`)
/// it is written as lowercase hex.
public struct Payload: Hashable, Sendable, Codable, CustomStringConvertible {
    public var bytes: ByteBuffer

    public init(_ bytes: ByteBuffer) {
        self.bytes = bytes
    }

    /// The UTF-8 bytes of `text` (a JSON document, typically).
    public init(_ text: String) {
        self.bytes = ByteBuffer(string: text)
    }

    @inlinable public var count: Int { bytes.readableBytes }

    /// The same bytes in storage of their own, sized to them. A payload decoded from a frame is a slice of the
    /// connection's receive buffer and keeps all of it alive; whatever is kept beyond the request (a store's
    /// items, its history, a value) must be this copy.
    ///
    /// The storage is exactly as long as the bytes: `ByteBufferAllocator.buffer(capacity:)` rounds up to a power
    /// of two (a 200-byte payload would take 256 bytes, a 600-byte one 1,024), and a store keeps every payload.
    public var owned: Payload {
        bytes.withUnsafeReadableBytes { Payload(owning: $0) }
    }

    /// A copy of `bytes` in storage of its own, exactly as long; with a `prefix`, the storage holds those bytes
    /// first, before the payload's reader index (the broker's memory keeps an item's id there: one allocation
    /// per item).
    public init(owning bytes: UnsafeRawBufferPointer, prefix: UnsafeRawBufferPointer = .init(start: nil, count: 0)) {
        let total = prefix.count + bytes.count
        guard total > 0 else {
            self.init(ByteBuffer())
            return
        }
        let storage = UnsafeMutableRawBufferPointer(start: malloc(total)!, count: total)
        if prefix.count > 0 { storage.copyMemory(from: prefix) }
        if bytes.count > 0 { UnsafeMutableRawBufferPointer(rebasing: storage[prefix.count...]).copyMemory(from: bytes) }
        // The default allocator frees with free(), which matches the malloc above.
        self.init(ByteBuffer(takingOwnershipOf: storage, allocator: ByteBufferAllocator(), readerIndex: prefix.count))
    }

    public var description: String { "\(count) bytes" }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let bytes = Hex.decode(text) else {
            throw DecodingError.dataCorrupted(
                .init(codingPath: decoder.codingPath, debugDescription: "payload is not a hex string"))
        }
        self.bytes = bytes
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(Hex.encode(bytes))
    }
}

/// Lowercase hex, as used by the test vectors.
public enum Hex {
    public static func encode(_ bytes: ByteBuffer) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.readableBytes * 2)
        for byte in bytes.readableBytesView {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Decodes hex digits (either case); white space is ignored. `nil` for anything else or an odd count.
    public static func decode(_ text: String) -> ByteBuffer? {
        var out = ByteBuffer()
        var high: UInt8?
        for char in text.utf8 {
            let nibble: UInt8
            switch char {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): nibble = char - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): nibble = char - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): nibble = char - UInt8(ascii: "A") + 10
            case UInt8(ascii: " "), UInt8(ascii: "\n"), UInt8(ascii: "\t"): continue
            default: return nil
            }
            if let h = high {
                out.writeInteger(h << 4 | nibble)
                high = nil
            } else {
                high = nibble
            }
        }
        return high == nil ? out : nil
    }
}

/// The rules PRODUCT.md sets for names and ids. The codec accepts any text; the server checks these and
/// answers `invalidName` / `invalidID` for that one request.
public enum Naming {
    /// The longest store or value name, in bytes.
    public static let maxNameLength = 128
    /// The longest item id, in bytes.
    public static let maxIDLength = 1024

    /// `nil` if `name` is a valid store or value name, else why not.
    public static func problem(withName name: String) -> String? {
        let utf8 = name.utf8
        if utf8.isEmpty { return "a name cannot be empty" }
        if utf8.count > maxNameLength { return "a name is at most \(maxNameLength) characters, got \(utf8.count)" }
        if name == "." || name == ".." { return "a name cannot be '.' or '..'" }
        for byte in utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "-"):
                continue
            default:
                return "a name may hold only A-Z a-z 0-9 . _ - (found \(name.debugDescription))"
            }
        }
        return nil
    }

    /// The longest engine name, in bytes.
    public static let maxEngineNameLength = 64

    /// `nil` if `name` is a valid engine name (the NAME of libstorebroker-engine-NAME.so), else why not: 1 to 64
    /// of A-Z a-z 0-9 _ -, starting with a letter or digit. No `.`, which separates the engine from the key in
    /// `--engine-option NAME.KEY=VALUE`.
    public static func problem(withEngineName name: String) -> String? {
        let utf8 = name.utf8
        if utf8.isEmpty { return "an engine name cannot be empty" }
        if utf8.count > maxEngineNameLength { return "an engine name is at most \(maxEngineNameLength) characters, got \(utf8.count)" }
        for (index, byte) in utf8.enumerated() {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                continue
            case UInt8(ascii: "_") where index > 0, UInt8(ascii: "-") where index > 0:
                continue
            default:
                return "an engine name holds only A-Z a-z 0-9 _ - and starts with a letter or digit (found \(name.debugDescription))"
            }
        }
        return nil
    }

    /// `nil` if `id` is a valid item id, else why not. Every item of every write is checked: inlined, with the
    /// bytes searched in place (see `ItemID.==`); the explanation is built out of line.
    @inlinable @inline(__always)
    public static func problem(withID id: ItemID) -> String? {
        let utf8 = id.string.utf8
        let valid = utf8.withContiguousStorageIfAvailable { bytes in
            bytes.count > 0 && bytes.count <= maxIDLength && memchr(bytes.baseAddress!, 0, bytes.count) == nil
        }
        return valid == true ? nil : explainProblem(withID: id)
    }

    @usableFromInline
    static func explainProblem(withID id: ItemID) -> String? {
        let count = id.string.utf8.count
        if count == 0 { return "an id cannot be empty" }
        if count > maxIDLength { return "an id is at most \(maxIDLength) bytes, got \(count)" }
        if id.string.utf8.contains(0) { return "an id cannot contain U+0000" }
        return nil
    }
}
