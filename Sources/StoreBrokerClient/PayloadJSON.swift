import Foundation
import Locking
import NIOCore

/// A mirror's payloads as JSON, written straight into bytes as `encode(to:)` calls arrive: the very bytes
/// `JSONEncoder` with `.sortedKeys` writes on Linux (keys in UTF-8 order, `/` escaped, a whole number without
/// ".0", `Data` as base64, `URL` as its absolute string, `Date` as its own `Encodable` writes it), without the
/// tree of boxed values `JSONEncoder` builds first and writes after (that was an eighth of the client's CPU
/// per `RemoteStore.insert`).
///
/// Containers must be written in the order a value's encoding opens them, as synthesized `encode(to:)` does:
/// a nested container is done once its parent is written again. Anything else (a container written after
/// that, `superEncoder`, `Decimal`, a key given twice, a number JSON cannot hold, an error thrown by the
/// value) makes `encode` return `nil`, and the caller encodes with `JSONEncoder`, which writes the same bytes
/// or throws its own error.
///
/// One writer is kept from one encoding to the next (its object and its lists: four allocations of each
/// `RemoteStore.insert`'s encoding). An encoding takes the writer out while it runs, so encodings at the same time
/// each get one; a writer is kept again only when nothing else holds it (a container the value kept after its
/// `encode(to:)` returned would otherwise write into a later encoding).
final class PayloadJSON: Sendable {
    private struct Kept {
        var writer: PayloadJSONWriter?
        var made = 0
    }

    private let kept = Locked(Kept())

    /// The writers this encoder made (for tests: one, while its encodings do not overlap).
    var writersMade: Int { kept.withLock { $0.made } }

    /// The value's JSON in a buffer of its own, or `nil` where `JSONEncoder` must encode it (see above).
    func encode<T: Encodable>(_ value: T) -> ByteBuffer? {
        var writer = kept.withLock { kept in
            if let writer = kept.writer {
                kept.writer = nil
                return writer
            }
            kept.made += 1
            return PayloadJSONWriter()
        }
        let encoded = writer.encode(value)
        if isKnownUniquelyReferenced(&writer) { kept.withLock { $0.writer = writer } }
        return encoded
    }
}

/// A key of an unkeyed container's element in `codingPath` (one word: kept inline in an existential).
private struct IndexKey: CodingKey {
    let intValue: Int?
    init(index: Int) { intValue = index }
    init?(intValue: Int) { self.intValue = intValue }
    init?(stringValue: String) { nil }
    var stringValue: String { "Index \(intValue ?? 0)" }
}

private struct Unsupported: Error {}

/// The writer behind `PayloadJSON`: one object for the whole value, its open containers on a stack.
///
/// Its state is not checked for exclusive access at run time (`@exclusivity(unchecked)`): one writer is used by
/// one encoding on one thread, and the checks were a third of its time.
private final class PayloadJSONWriter: Encoder, @unchecked Sendable {  // used by one encoding at a time
    @exclusivity(unchecked) var bytes: [UInt8] = []
    @exclusivity(unchecked) var codingPath: [any CodingKey] = []
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    /// Set by a use left to JSONEncoder where no error can be thrown (`nestedContainer`, `superEncoder`).
    @exclusivity(unchecked) private var failed = false

    /// An open container: `{` or `[` written, its entries being written.
    private struct Frame {
        let id: Int
        let keyed: Bool
        /// The first of its entries in `entries` (keyed only).
        let entryBase: Int
        /// The first byte after its bracket.
        let start: Int
        /// `codingPath`'s length outside it.
        let pathDepth: Int
        var count = 0
        /// Its keys so far are in UTF-8 order, none twice (nothing to reorder when it closes).
        var ordered = true
    }

    /// A keyed container's entry: its key and where its bytes (`"key":value`) start.
    private struct Entry {
        let key: String
        let start: Int
    }

    @exclusivity(unchecked) private var frames: [Frame] = []
    @exclusivity(unchecked) private var entries: [Entry] = []
    @exclusivity(unchecked) private var nextID = 0

    /// What the value being encoded asked for: nothing yet (a value is due at the end of `bytes`), a container
    /// (by frame id), or a single value (written or not).
    private enum ValueState {
        case due
        case container(Int)
        case single(written: Bool)
    }

    @exclusivity(unchecked) private var state = ValueState.due
    /// `frames.count` when the value being encoded began: the frames below belong to the values around it.
    @exclusivity(unchecked) private var base = 0

    init() { bytes.reserveCapacity(256) }

    /// Writes `value` and returns its bytes; `nil` where it leaves the value to `JSONEncoder`. The writer is empty
    /// again after (its lists keep their capacity, its frame ids go on: a container of an earlier value names no
    /// frame of a later one).
    func encode<T: Encodable>(_ value: T) -> ByteBuffer? {
        defer {
            bytes.removeAll(keepingCapacity: true)
            codingPath.removeAll(keepingCapacity: true)
            frames.removeAll(keepingCapacity: true)
            entries.removeAll(keepingCapacity: true)
            (failed, state, base) = (false, .due, 0)
        }
        do {
            try self.value(value)
        } catch {
            return nil
        }
        guard !failed, closeFrames(downTo: 0) else { return nil }
        return ByteBuffer(bytes: bytes)
    }

    // MARK: Values

    /// Writes `value` at the end of `bytes` (its key or comma already written).
    func value<T: Encodable>(_ value: T) throws {
        if T.self == Data.self {
            string((value as! Data).base64EncodedString())
        } else if T.self == URL.self {
            string((value as! URL).absoluteString)
        } else if T.self == Decimal.self {
            throw unsupported()
        } else {
            let (outerState, outerBase) = (state, base)
            state = .due
            base = frames.count
            defer { (state, base) = (outerState, outerBase) }
            do {
                try value.encode(to: self)
            } catch {
                // Even if the value's caller catches it, what this value wrote so far stays: left to JSONEncoder.
                failed = true
                throw error
            }
            switch state {
            case .due:
                // Nothing encoded: JSONEncoder writes `{}` inside a container, and throws at the top.
                guard !frames.isEmpty else { throw unsupported() }
                bytes.append(contentsOf: [UInt8(ascii: "{"), UInt8(ascii: "}")])
            case .single(written: false):
                throw unsupported()
            case .container, .single(written: true):
                break
            }
            guard !failed, closeFrames(downTo: base) else { throw unsupported() }
        }
    }

    func string(_ text: String) {
        bytes.append(UInt8(ascii: "\""))
        var text = text
        text.withUTF8 { utf8 in
            guard let start = utf8.baseAddress else { return }
            var plain = 0  // the first byte not yet copied
            var index = 0
            while index < utf8.count {
                // Eight bytes at a time while none of them is escaped (most text).
                if index + 8 <= utf8.count, !Self.anyEscaped(UnsafeRawPointer(start + index).loadUnaligned(as: UInt64.self)) {
                    index += 8
                    continue
                }
                let end = min(index + 8, utf8.count)
                while index < end {
                    let byte = utf8[index]
                    if byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") || byte == UInt8(ascii: "/") {
                        bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[plain..<index]))
                        plain = index + 1
                        escape(byte)
                    }
                    index += 1
                }
            }
            bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[plain...]))
        }
        bytes.append(UInt8(ascii: "\""))
    }

    /// Whether any of the eight bytes in `word` is one JSON escapes here: below 0x20, `"`, `\` or `/` (bit tricks:
    /// a byte below n, or equal to n, sets its top bit in these expressions; bytes of 0x80 and above set none).
    private static func anyEscaped(_ word: UInt64) -> Bool {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        func zero(_ x: UInt64) -> UInt64 { (x &- ones) & ~x & highs }
        let below = (word &- ones &* 0x20) & ~word & highs
        return below | zero(word ^ (ones &* 0x22)) | zero(word ^ (ones &* 0x5C)) | zero(word ^ (ones &* 0x2F)) != 0
    }

    /// `byte`'s escape: `\"`, `\\`, `\/`, a short one for some controls, `\u00xx` for the others.
    private func escape(_ byte: UInt8) {
        bytes.append(UInt8(ascii: "\\"))
        switch byte {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): bytes.append(byte)
        case 0x08: bytes.append(UInt8(ascii: "b"))
        case 0x0C: bytes.append(UInt8(ascii: "f"))
        case 0x0A: bytes.append(UInt8(ascii: "n"))
        case 0x0D: bytes.append(UInt8(ascii: "r"))
        case 0x09: bytes.append(UInt8(ascii: "t"))
        default:
            func hex(_ digit: UInt8) -> UInt8 { digit < 10 ? UInt8(ascii: "0") + digit : UInt8(ascii: "a") + digit - 10 }
            bytes.append(contentsOf: [UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"), hex(byte >> 4), hex(byte & 0xF)])
        }
    }

    func integer(_ value: some FixedWidthInteger) {
        guard value != 0 else {
            bytes.append(UInt8(ascii: "0"))
            return
        }
        if value < 0 { bytes.append(UInt8(ascii: "-")) }
        // Digits from the last, into a stack buffer (a UInt64 has at most 20; Int128's 39 digits fit too).
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 40) { digits in
            var count = 0
            var rest = value
            while rest != 0 {
                let (quotient, remainder) = rest.quotientAndRemainder(dividingBy: 10)
                digits[39 - count] = UInt8(ascii: "0") + UInt8(remainder.magnitude)
                count += 1
                rest = quotient
            }
            bytes.append(contentsOf: UnsafeBufferPointer(rebasing: digits[(40 - count)...]))
        }
    }

    func float<F: BinaryFloatingPoint & LosslessStringConvertible>(_ value: F) throws {
        guard value.isFinite else { throw unsupported() }  // JSONEncoder throws its own error
        var text = value.description
        if text.hasSuffix(".0") { text.removeLast(2) }
        bytes.append(contentsOf: text.utf8)
    }

    func literal(_ text: StaticString) {
        bytes.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    // MARK: Containers

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        KeyedEncodingContainer(KeyedContainer<Key>(writer: self, frame: open(keyed: true), path: codingPath))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        UnkeyedContainer(writer: self, frame: open(keyed: false), path: codingPath)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer {
        switch state {
        case .due: state = .single(written: false)
        case .single(written: false): break
        default: failed = true
        }
        return SingleContainer(writer: self, path: codingPath)
    }

    /// The value's container: opened (`{` or `[` written) when the value asks first, the same one when it asks
    /// again; -1 (every use fails) otherwise.
    private func open(keyed: Bool) -> Int {
        switch state {
        case .due:
            let id = push(keyed: keyed, pathDepth: codingPath.count)
            state = .container(id)
            return id
        case .container(let id):
            if let index = frames.lastIndex(where: { $0.id == id }), frames[index].keyed == keyed { return id }
        case .single:
            break
        }
        failed = true
        return -1
    }

    private func push(keyed: Bool, pathDepth: Int) -> Int {
        nextID += 1
        bytes.append(keyed ? UInt8(ascii: "{") : UInt8(ascii: "["))
        frames.append(Frame(id: nextID, keyed: keyed, entryBase: entries.count, start: bytes.count, pathDepth: pathDepth))
        return nextID
    }

    /// Makes frame `id` the one written to: the nested containers above it closed. Throws when it is closed or
    /// belongs to a value around the one being encoded.
    private func select(_ id: Int) throws -> Int {
        guard !failed, let index = frames.lastIndex(where: { $0.id == id }), index >= base,
            closeFrames(downTo: index + 1)
        else { throw unsupported() }
        return index
    }

    /// Begins an entry of keyed frame `id`: comma, key and colon written.
    func beginEntry(_ id: Int, key: String) throws {
        let index = try select(id)
        if frames[index].count > 0 { bytes.append(UInt8(ascii: ",")) }
        if frames[index].count > 0, frames[index].ordered,
            !entries[entries.count - 1].key.utf8.lexicographicallyPrecedes(key.utf8)
        {
            frames[index].ordered = false
        }
        frames[index].count += 1
        entries.append(Entry(key: key, start: bytes.count))
        string(key)
        bytes.append(UInt8(ascii: ":"))
    }

    /// Begins an element of unkeyed frame `id`: the comma written; returns its index.
    func beginElement(_ id: Int) throws -> Int {
        let index = try select(id)
        let count = frames[index].count
        if count > 0 { bytes.append(UInt8(ascii: ",")) }
        frames[index].count += 1
        return count
    }

    /// The count of frame `id`'s entries (0 when it is gone).
    func count(of id: Int) -> Int { frames.last(where: { $0.id == id })?.count ?? 0 }

    /// A nested container in frame `id`'s current entry (begun by the caller).
    func nested(keyed: Bool) -> Int { push(keyed: keyed, pathDepth: codingPath.count) }

    /// Pushes `key` on `codingPath` for a nested container (popped as it closes).
    func enter(_ key: any CodingKey) { codingPath.append(key) }

    func fail() { failed = true }

    /// The error for a use left to JSONEncoder; the writer fails whether or not the caller catches it (what it
    /// wrote before the throw stays in `bytes`).
    private func unsupported() -> Unsupported {
        failed = true
        return Unsupported()
    }

    /// Closes the frames from `depth` up: brackets written, a keyed frame's entries put in key order. False when
    /// a key was given twice.
    private func closeFrames(downTo depth: Int) -> Bool {
        while frames.count > depth {
            let frame = frames.removeLast()
            if frame.keyed {
                if !frame.ordered, !reorder(frame) { return false }
                entries.removeSubrange(frame.entryBase...)
                bytes.append(UInt8(ascii: "}"))
            } else {
                bytes.append(UInt8(ascii: "]"))
            }
            codingPath.removeSubrange(frame.pathDepth...)
        }
        return true
    }

    /// Rewrites `frame`'s entries in key order (as JSONEncoder's `.sortedKeys` on Linux: UTF-8 order).
    private func reorder(_ frame: Frame) -> Bool {
        let mine = entries[frame.entryBase...]
        var spans: [(key: String, range: Range<Int>)] = []
        spans.reserveCapacity(mine.count)
        for (offset, entry) in mine.enumerated() {
            let next = frame.entryBase + offset + 1
            let end = next < entries.count ? entries[next].start - 1 : bytes.count  // less the comma
            spans.append((entry.key, entry.start..<end))
        }
        spans.sort { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
        for index in spans.indices.dropFirst() where spans[index].key == spans[index - 1].key { return false }
        var sorted: [UInt8] = []
        sorted.reserveCapacity(bytes.count - frame.start)
        for (offset, span) in spans.enumerated() {
            if offset > 0 { sorted.append(UInt8(ascii: ",")) }
            sorted.append(contentsOf: bytes[span.range])
        }
        bytes.replaceSubrange(frame.start..., with: sorted)
        return true
    }

    /// A single value container's value: at most one per value.
    func single() throws {
        guard case .single(written: false) = state, !failed else { throw unsupported() }
        state = .single(written: true)
    }

    /// A value that is not a container element's: its entry's key pushed on `codingPath` while it encodes.
    func child<T: Encodable>(_ value: T, key: any CodingKey) throws {
        codingPath.append(key)
        defer { codingPath.removeLast() }
        try self.value(value)
    }
}

private struct KeyedContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let writer: PayloadJSONWriter
    let frame: Int
    let path: [any CodingKey]
    var codingPath: [any CodingKey] { path }

    mutating func encodeNil(forKey key: Key) throws {
        try writer.beginEntry(frame, key: key.stringValue)
        writer.literal("null")
    }
    mutating func encode(_ value: Bool, forKey key: Key) throws {
        try writer.beginEntry(frame, key: key.stringValue)
        writer.literal(value ? "true" : "false")
    }
    mutating func encode(_ value: String, forKey key: Key) throws {
        try writer.beginEntry(frame, key: key.stringValue)
        writer.string(value)
    }
    mutating func encode(_ value: Double, forKey key: Key) throws {
        try writer.beginEntry(frame, key: key.stringValue)
        try writer.float(value)
    }
    mutating func encode(_ value: Float, forKey key: Key) throws {
        try writer.beginEntry(frame, key: key.stringValue)
        try writer.float(value)
    }
    mutating func encode(_ value: Int, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: Int8, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: Int16, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: Int32, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: Int64, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: UInt, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: UInt8, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: UInt16, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: UInt32, forKey key: Key) throws { try integer(value, key) }
    mutating func encode(_ value: UInt64, forKey key: Key) throws { try integer(value, key) }

    private func integer(_ value: some FixedWidthInteger, _ key: Key) throws {
        try writer.beginEntry(frame, key: key.stringValue)
        writer.integer(value)
    }

    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        try writer.beginEntry(frame, key: key.stringValue)
        try writer.child(value, key: key)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(
        keyedBy keyType: NestedKey.Type, forKey key: Key
    ) -> KeyedEncodingContainer<NestedKey> {
        KeyedEncodingContainer(KeyedContainer<NestedKey>(writer: writer, frame: nested(true, key), path: path + [key]))
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        UnkeyedContainer(writer: writer, frame: nested(false, key), path: path + [key])
    }

    private func nested(_ keyed: Bool, _ key: Key) -> Int {
        do {
            try writer.beginEntry(frame, key: key.stringValue)
        } catch {
            return -1
        }
        let id = writer.nested(keyed: keyed)
        writer.enter(key)
        return id
    }

    mutating func superEncoder() -> any Encoder { unsupported() }
    mutating func superEncoder(forKey key: Key) -> any Encoder { unsupported() }

    private func unsupported() -> any Encoder {
        writer.fail()
        return PayloadJSONWriter()  // written to and thrown away
    }
}

/// Where an unkeyed or single value container writes one value: `begin` starts it (an element's comma, or the
/// single value's claim) and says its index; the primitive `encode`s of both are these.
private protocol ValueSlot {
    var writer: PayloadJSONWriter { get }
    func begin() throws -> Int
}

extension ValueSlot {
    mutating func encodeNil() throws {
        _ = try begin()
        writer.literal("null")
    }
    mutating func encode(_ value: Bool) throws {
        _ = try begin()
        writer.literal(value ? "true" : "false")
    }
    mutating func encode(_ value: String) throws {
        _ = try begin()
        writer.string(value)
    }
    mutating func encode(_ value: Double) throws {
        _ = try begin()
        try writer.float(value)
    }
    mutating func encode(_ value: Float) throws {
        _ = try begin()
        try writer.float(value)
    }
    mutating func encode(_ value: Int) throws { try integer(value) }
    mutating func encode(_ value: Int8) throws { try integer(value) }
    mutating func encode(_ value: Int16) throws { try integer(value) }
    mutating func encode(_ value: Int32) throws { try integer(value) }
    mutating func encode(_ value: Int64) throws { try integer(value) }
    mutating func encode(_ value: UInt) throws { try integer(value) }
    mutating func encode(_ value: UInt8) throws { try integer(value) }
    mutating func encode(_ value: UInt16) throws { try integer(value) }
    mutating func encode(_ value: UInt32) throws { try integer(value) }
    mutating func encode(_ value: UInt64) throws { try integer(value) }

    private func integer(_ value: some FixedWidthInteger) throws {
        _ = try begin()
        writer.integer(value)
    }
}

private struct UnkeyedContainer: UnkeyedEncodingContainer, ValueSlot {
    let writer: PayloadJSONWriter
    let frame: Int
    let path: [any CodingKey]
    var codingPath: [any CodingKey] { path }
    var count: Int { writer.count(of: frame) }

    func begin() throws -> Int { try writer.beginElement(frame) }

    mutating func encode<T: Encodable>(_ value: T) throws {
        let index = try begin()
        try writer.child(value, key: IndexKey(index: index))
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        let (id, key) = nested(true)
        return KeyedEncodingContainer(KeyedContainer<NestedKey>(writer: writer, frame: id, path: path + [key]))
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let (id, key) = nested(false)
        return UnkeyedContainer(writer: writer, frame: id, path: path + [key])
    }

    private func nested(_ keyed: Bool) -> (Int, IndexKey) {
        guard let index = try? begin() else { return (-1, IndexKey(index: 0)) }
        let id = writer.nested(keyed: keyed)
        writer.enter(IndexKey(index: index))
        return (id, IndexKey(index: index))
    }

    mutating func superEncoder() -> any Encoder {
        writer.fail()
        return PayloadJSONWriter()
    }
}

private struct SingleContainer: SingleValueEncodingContainer, ValueSlot {
    let writer: PayloadJSONWriter
    let path: [any CodingKey]
    var codingPath: [any CodingKey] { path }

    func begin() throws -> Int {
        try writer.single()
        return 0
    }

    mutating func encode<T: Encodable>(_ value: T) throws {
        _ = try begin()
        try writer.value(value)
    }
}
