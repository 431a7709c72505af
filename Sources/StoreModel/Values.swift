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
///
/// An id is a `String` or a view of bytes already held elsewhere: a decoded frame (no allocation per id of a
/// request) or an item the broker keeps, whose storage holds the id in front of the payload (no `String` per
/// id in memory or history). Both compare, hash and encode alike; `compacted` copies a view that would keep a
/// larger buffer alive.
public struct ItemID: Hashable, TableKey, Sendable, Codable, Comparable, CustomStringConvertible,
    ExpressibleByStringLiteral
{
    @usableFromInline
    enum Storage: Sendable {
        case text(String)
        /// The readable bytes, valid UTF-8.
        case bytes(ByteBuffer)
        /// The id of an item the broker keeps: the bytes in front of its payload.
        case kept(KeptItem)
    }

    @usableFromInline
    var storage: Storage

    public init(_ string: String) {
        storage = .text(string)
    }

    public init(stringLiteral value: String) {
        storage = .text(value)
    }

    /// The id of a kept item (a view of the bytes in front of its payload: no copy).
    public init(kept item: KeptItem) {
        storage = .kept(item)
    }

    /// An id over the readable bytes of `bytes`, which the caller knows are valid UTF-8 (a view of them: no copy).
    public init(validatedUTF8 bytes: ByteBuffer) {
        storage = .bytes(bytes)
    }

    /// An id over the readable bytes of `bytes` (a view of them: no copy); `nil` if they are not valid UTF-8.
    public init?(utf8 bytes: ByteBuffer) {
        guard bytes.withUnsafeReadableBytes(Self.isValidUTF8) else { return nil }
        storage = .bytes(bytes)
    }

    /// Whether `bytes` are valid UTF-8, as an id's must be (`UTF8Text.isValid`).
    public static func isValidUTF8(_ bytes: UnsafeRawBufferPointer) -> Bool { UTF8Text.isValid(bytes) }

    /// The id as text (a view's bytes are decoded into a new `String`).
    public var string: String {
        get {
            switch storage {
            case .text(let text): text
            case .bytes(let bytes): String(decoding: bytes.readableBytesView, as: UTF8.self)
            case .kept(let item): item.withID { String(decoding: $0, as: UTF8.self) }
            }
        }
        set { storage = .text(newValue) }
    }

    /// The id's UTF-8 bytes in place, for the duration of `body`.
    @inlinable @inline(__always)
    public func withUTF8<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        switch storage {
        case .text(let text):
            if let result = try text.utf8.withContiguousStorageIfAvailable({ try body(UnsafeRawBufferPointer($0)) }) {
                return result
            }
            return try Array(text.utf8).withUnsafeBytes(body)
        case .bytes(let bytes):
            return try bytes.withUnsafeReadableBytes(body)
        case .kept(let item):
            return try item.withID(body)
        }
    }

    /// The kept item this is the id of, if it is one.
    @inlinable
    public var keptItem: KeptItem? {
        if case .kept(let item) = storage { item } else { nil }
    }

    /// How many bytes the id's UTF-8 takes.
    @inlinable
    public var utf8Count: Int {
        switch storage {
        case .text(let text): text.utf8.count
        case .bytes(let bytes): bytes.readableBytes
        case .kept(let item): item.idCount
        }
    }

    /// The same id, holding no more memory than its own: a view of a larger buffer (a request's frame, a kept
    /// item's id and payload) becomes a `String`. For ids that outlive what they were read from (history).
    public var compacted: ItemID {
        switch storage {
        case .text: return self
        case .bytes(let bytes): return bytes.storageCapacity > bytes.readableBytes ? ItemID(string) : self
        case .kept(let item): return item.payloadCount > 0 ? ItemID(string) : self
        }
    }

    // Equality and hashing run several times per item a request writes (the planner, memory, the engine's
    // table): both read the UTF-8 bytes in place, never iterating element by element nor copying. Always
    // inlined: an opaque call taking an id read from an array or a buffer makes the caller retain the id's
    // storage around it (two atomic operations per id, several times per item of a batch).
    @inlinable @inline(__always)
    public static func == (lhs: ItemID, rhs: ItemID) -> Bool {
        guard lhs.utf8Count == rhs.utf8Count else { return false }
        return lhs.withUTF8 { l in
            rhs.withUTF8 { r in IDBytes.equal(l, r) }
        }
    }

    @inlinable @inline(__always)
    public func hash(into hasher: inout Hasher) {
        withUTF8 { hasher.combine(bytes: $0) }
    }

    /// `hashValue`, spelled out so that it inlines (see `==`): the whole hash computed inside the closure that
    /// sees the bytes (finalized outside it, the optimizer keeps a retain of the string around the call).
    /// A kept item's id has it already (`KeptItem.idHash`).
    @inlinable @inline(__always)
    public var tableHash: Int {
        if case .kept(let item) = storage { return item.idHash }
        return withUTF8 { Self.tableHash(of: $0) }
    }

    /// The `tableHash` of an id whose UTF-8 is `bytes` (`IDHash`: keyed per process, cheaper than `Hasher`).
    @inlinable @inline(__always)
    public static func tableHash(of bytes: UnsafeRawBufferPointer) -> Int {
        IDHash.hash(bytes)
    }

    /// Byte order of the UTF-8 encoding.
    public static func < (lhs: ItemID, rhs: ItemID) -> Bool {
        lhs.withUTF8 { l in
            rhs.withUTF8 { r in
                let common = min(l.count, r.count)
                let order = common == 0 ? 0 : memcmp(l.baseAddress!, r.baseAddress!, common)
                return order != 0 ? order < 0 : l.count < r.count
            }
        }
    }

    public var description: String { string }

    public init(from decoder: any Decoder) throws {
        storage = .text(try decoder.singleValueContainer().decode(String.self))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(string)
    }
}

/// Byte comparisons for ids, in Swift rather than `memcmp`/`memchr`: an id is short, and a C call while an id's
/// bytes are borrowed makes the caller retain their storage around it (the optimizer cannot see that the call
/// releases nothing); these inline into the caller and read eight bytes at a time.
public enum IDBytes {
    /// Whether `a` and `b`, of the same length, hold the same bytes.
    @inlinable @inline(__always)
    public static func equal(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
        let count = a.count
        var index = 0
        while index + 8 <= count {
            if a.loadUnaligned(fromByteOffset: index, as: UInt64.self)
                != b.loadUnaligned(fromByteOffset: index, as: UInt64.self) { return false }
            index += 8
        }
        while index < count {
            if a[index] != b[index] { return false }
            index += 1
        }
        return true
    }

    /// Whether `bytes` holds a zero byte.
    @inlinable @inline(__always)
    public static func containsZero(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var index = 0
        while index + 8 <= bytes.count {
            let word = bytes.loadUnaligned(fromByteOffset: index, as: UInt64.self)
            // A zero byte, and only one, leaves its high bit set here.
            if (word &- 0x0101_0101_0101_0101) & ~word & 0x8080_8080_8080_8080 != 0 { return true }
            index += 8
        }
        while index < bytes.count {
            if bytes[index] == 0 { return true }
            index += 1
        }
        return false
    }
}

/// An item as the broker keeps it: one allocation holding the object's header, the id's bytes, then the
/// payload's, exactly as long (a `ByteBuffer` would add an object of its own, 80 bytes and a `malloc` per item).
/// Made once, where the request is decoded (`Item(wire:)`, on the connection's event loop) or when a store loads;
/// the commit's event, history, memory and the engine's steps share it, `ItemID(kept:)` and `Payload(kept:)`
/// being views of its two parts. The id's `tableHash` is computed once, when it is made. Never changed once made.
public struct KeptItem: @unchecked Sendable {  // its storage never changes once made
    /// The one allocation: the counts as its header, then the bytes.
    @usableFromInline
    final class Storage: ManagedBuffer<Counts, UInt8> {}

    @usableFromInline
    struct Counts {
        @usableFromInline var id: Int
        @usableFromInline var payload: Int
        /// The id's `tableHash`.
        @usableFromInline var hash: Int

        @inlinable
        init(id: Int, payload: Int) {
            self.id = id
            self.payload = payload
            hash = 0
        }
    }

    @usableFromInline
    let storage: Storage

    @inlinable
    init(storage: Storage) {
        self.storage = storage
    }

    /// The id's bytes, then the payload's, copied in.
    public static func make(id: UnsafeRawBufferPointer, payload: UnsafeRawBufferPointer) -> KeptItem {
        make(idCount: id.count, payloadCount: payload.count) { bytes in
            if id.count > 0 { bytes.baseAddress!.copyMemory(from: id.baseAddress!, byteCount: id.count) }
            if payload.count > 0 {
                (bytes.baseAddress! + id.count).copyMemory(from: payload.baseAddress!, byteCount: payload.count)
            }
        }
    }

    /// Room for `idCount + payloadCount` bytes, which `fill` writes (all of them).
    @inlinable @inline(__always)
    public static func make(idCount: Int, payloadCount: Int, fill: (UnsafeMutableRawBufferPointer) -> Void) -> KeptItem {
        let storage = unsafeDowncast(
            Storage.create(minimumCapacity: idCount + payloadCount) { _ in Counts(id: idCount, payload: payloadCount) },
            to: Storage.self)
        storage.header.hash = storage.withUnsafeMutablePointerToElements { bytes in
            fill(UnsafeMutableRawBufferPointer(start: bytes, count: idCount + payloadCount))
            return ItemID.tableHash(of: UnsafeRawBufferPointer(start: bytes, count: idCount))
        }
        return KeptItem(storage: storage)
    }

    @inlinable public var idCount: Int { storage.header.id }
    /// The id's `tableHash`, computed when the item was made.
    @inlinable public var idHash: Int { storage.header.hash }
    @inlinable public var payloadCount: Int { storage.header.payload }

    /// Whether both are the same item (the same allocation), not merely equal bytes.
    @inlinable
    public func isSame(as other: KeptItem) -> Bool { storage === other.storage }

    /// The id's and the payload's bytes in place, valid while `body` runs.
    @inlinable @inline(__always)
    public func withIDAndPayload<R>(_ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        let counts = storage.header
        return try storage.withUnsafeMutablePointerToElements { bytes in
            try body(
                UnsafeRawBufferPointer(start: bytes, count: counts.id),
                UnsafeRawBufferPointer(start: bytes + counts.id, count: counts.payload))
        }
    }

    @inlinable @inline(__always)
    public func withID<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try withIDAndPayload { id, _ in try body(id) }
    }

    @inlinable @inline(__always)
    public func withPayload<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try withIDAndPayload { _, payload in try body(payload) }
    }
}

/// Opaque bytes: an item's payload or a value, kept exactly as given. In JSON (test vectors, `wiredump`)
/// it is written as lowercase hex.
///
/// A `ByteBuffer` (what a frame decodes to: a slice of it), or the payload of an item the broker keeps
/// (`KeptItem`). Both compare, hash and encode alike; `bytes` of a kept one is a copy.
public struct Payload: Hashable, Sendable, Codable, CustomStringConvertible {
    @usableFromInline
    enum Storage: Sendable {
        case buffer(ByteBuffer)
        case kept(KeptItem)
    }

    @usableFromInline
    var storage: Storage

    public init(_ bytes: ByteBuffer) {
        storage = .buffer(bytes)
    }

    /// The UTF-8 bytes of `text` (a JSON document, typically).
    public init(_ text: String) {
        storage = .buffer(ByteBuffer(string: text))
    }

    /// The payload of a kept item (a view of it: no copy).
    public init(kept item: KeptItem) {
        storage = .kept(item)
    }

    /// The bytes as a buffer (for a kept item's payload, a copy).
    public var bytes: ByteBuffer {
        get {
            switch storage {
            case .buffer(let bytes): bytes
            case .kept(let item): item.withPayload { ByteBuffer(bytes: $0) }
            }
        }
        set { storage = .buffer(newValue) }
    }

    /// The kept item this is the payload of, if it is one.
    @inlinable
    public var keptItem: KeptItem? {
        if case .kept(let item) = storage { item } else { nil }
    }

    @inlinable public var count: Int {
        switch storage {
        case .buffer(let bytes): bytes.readableBytes
        case .kept(let item): item.payloadCount
        }
    }

    /// The bytes in place, valid while `body` runs.
    @inlinable @inline(__always)
    public func withUnsafeReadableBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        switch storage {
        case .buffer(let bytes): try bytes.withUnsafeReadableBytes(body)
        case .kept(let item): try item.withPayload(body)
        }
    }

    /// Compared with `memcmp`: `elementsEqual` compares byte by byte through a closure, and every
    /// `RemoteStore.insert` compares payloads (its written values are looked up by payload).
    public static func == (lhs: Payload, rhs: Payload) -> Bool {
        let count = lhs.count
        guard count == rhs.count else { return false }
        guard count > 0 else { return true }
        return lhs.withUnsafeReadableBytes { l in
            rhs.withUnsafeReadableBytes { r in memcmp(l.baseAddress!, r.baseAddress!, count) == 0 }
        }
    }

    public func hash(into hasher: inout Hasher) {
        withUnsafeReadableBytes { hasher.combine(bytes: $0) }
    }

    /// The same bytes in storage of their own, sized to them. A payload decoded from a frame is a slice of the
    /// connection's receive buffer and keeps all of it alive; whatever is kept beyond the request (a store's
    /// items, its history, a value) must be this copy.
    ///
    /// The storage is exactly as long as the bytes: `ByteBufferAllocator.buffer(capacity:)` rounds up to a power
    /// of two (a 200-byte payload would take 256 bytes, a 600-byte one 1,024), and a store keeps every payload.
    public var owned: Payload {
        withUnsafeReadableBytes { bytes in
            let total = bytes.count
            guard total > 0 else { return Payload(ByteBuffer()) }
            let storage = UnsafeMutableRawBufferPointer(start: malloc(total)!, count: total)
            storage.copyMemory(from: bytes)
            // The default allocator frees with free(), which matches the malloc above.
            return Payload(ByteBuffer(takingOwnershipOf: storage, allocator: ByteBufferAllocator(), readerIndex: 0))
        }
    }

    public var description: String { "\(count) bytes" }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let bytes = Hex.decode(text) else {
            throw DecodingError.dataCorrupted(
                .init(codingPath: decoder.codingPath, debugDescription: "payload is not a hex string"))
        }
        storage = .buffer(bytes)
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
        isValid(id: id) ? nil : explainProblem(withID: id)
    }

    /// `problem(withID:) == nil`, without the explanation: nothing but reads of the id's bytes, so a caller
    /// checking ids in an array keeps none of them retained (an id handed on to an opaque call is).
    @inlinable @inline(__always)
    public static func isValid(id: ItemID) -> Bool {
        id.withUTF8 { bytes in bytes.count > 0 && bytes.count <= maxIDLength && !IDBytes.containsZero(bytes) }
    }

    @usableFromInline
    static func explainProblem(withID id: ItemID) -> String? {
        let count = id.utf8Count
        if count == 0 { return "an id cannot be empty" }
        if count > maxIDLength { return "an id is at most \(maxIDLength) bytes, got \(count)" }
        if id.withUTF8({ $0.contains(0) }) { return "an id cannot contain U+0000" }
        return nil
    }
}

/// Text the protocol carries (ids, names) checked and made from its UTF-8 bytes: ASCII, the usual case, checked
/// eight bytes at a time and decoded without a second look; anything else by String's validating initializer,
/// which runs as unspecialized generic code (metadata lookups at each call: too slow for the store name of every
/// request).
public enum UTF8Text {
    /// Whether `bytes` are valid UTF-8.
    public static func isValid(_ bytes: UnsafeRawBufferPointer) -> Bool {
        isASCII(bytes) || String(validating: bytes.bindMemory(to: UInt8.self), as: UTF8.self) != nil
    }

    /// `bytes` as a string; `nil` if they are not valid UTF-8.
    public static func string(_ bytes: UnsafeRawBufferPointer) -> String? {
        let utf8 = bytes.bindMemory(to: UInt8.self)
        return isASCII(bytes) ? String(decoding: utf8, as: UTF8.self) : String(validating: utf8, as: UTF8.self)
    }

    private static func isASCII(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var index = 0
        while index + 8 <= bytes.count {
            if bytes.loadUnaligned(fromByteOffset: index, as: UInt64.self) & 0x8080_8080_8080_8080 != 0 { return false }
            index += 8
        }
        while index < bytes.count, bytes[index] < 0x80 { index += 1 }
        return index == bytes.count
    }
}
