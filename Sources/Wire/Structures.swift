@_exported import StoreModel
import NIOCore

/// A value with a wire encoding of its own, used inside message payloads.
public protocol WireCodable: Hashable, Sendable, Codable {
    /// The fewest bytes an encoding can take (used to check element counts before allocating).
    static var minEncodedLength: Int { get }
    init(wire buffer: inout ByteBuffer) throws(WireError)
    func encode(wire buffer: inout ByteBuffer) throws(WireError)
    /// Consecutive values with the same meaning as this one, each encoding in at most `maxLength` bytes where
    /// that is possible; used to spread a long list over frames. The default keeps the value whole.
    func fragments(maxLength: Int) -> [Self]
}

extension WireCodable {
    public func fragments(maxLength: Int) -> [Self] { [self] }
}

extension ByteBuffer {
    mutating func readWireList<T: WireCodable>(_ field: StaticString, of _: T.Type = T.self) throws(WireError) -> [T] {
        try readWireList(field, minElementLength: T.minEncodedLength) { (buffer: inout ByteBuffer) throws(WireError) in
            try T(wire: &buffer)
        }
    }

    mutating func writeWireList<T: WireCodable>(_ elements: [T]) throws(WireError) {
        try writeWireList(elements) { (buffer: inout ByteBuffer, element: T) throws(WireError) in
            try element.encode(wire: &buffer)
        }
    }

    mutating func readWireEnum<T: RawRepresentable<UInt8>>(_: T.Type, _ field: StaticString) throws(WireError) -> T {
        let raw = try readWire(UInt8.self, field)
        guard let value = T(rawValue: raw) else { throw WireError.malformed("\(field) has unknown value \(raw)") }
        return value
    }
}

extension ItemID: WireCodable {
    public static var minEncodedLength: Int { 2 }

    /// A view of the frame's bytes (no `String` per id); what keeps an id beyond the request copies it
    /// (`ItemID.compacted`, or the broker's kept item).
    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        let length = Int(try buffer.readWire(UInt16.self, "item id"))
        guard let bytes = buffer.readSlice(length: length) else { throw WireError.truncated("item id") }
        guard let id = ItemID(utf8: bytes) else { throw WireError.malformed("item id is not valid UTF-8") }
        self = id
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        // The bytes in place (`withUTF8` rethrows untyped errors, so the result carries the error out).
        let written = withUTF8 { bytes in Result { () throws(WireError) in try buffer.writeWireText(utf8: bytes, "item id") } }
        try written.get()
    }
}

/// `u8 tag`: 0 none, then for 1 an `ItemID`. The id after which a range starts.
extension Optional where Wrapped == ItemID {
    init(wireCursor buffer: inout ByteBuffer) throws(WireError) {
        self = try buffer.readWireBool("cursor tag") ? try ItemID(wire: &buffer) : nil
    }

    func encode(wireCursor buffer: inout ByteBuffer) throws(WireError) {
        buffer.writeWireBool(self != nil)
        try self?.encode(wire: &buffer)
    }
}

/// `u8 tag`, then the tag's fields: 0 unconditional; 1 `u64 sequence`; 2 absent; 3 `u64 epoch, u64 sequence`.
extension Condition: WireCodable {
    public static var minEncodedLength: Int { 1 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        switch try buffer.readWire(UInt8.self, "condition tag") {
        case 0: self = .unconditional
        case 1: self = .sequence(try buffer.readWire(UInt64.self, "condition sequence"))
        case 2: self = .absent
        case 3:
            self = .epochSequence(
                epoch: try buffer.readWire(UInt64.self, "condition epoch"),
                sequence: try buffer.readWire(UInt64.self, "condition sequence"))
        case let tag: throw WireError.malformed("condition tag has unknown value \(tag)")
        }
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        switch self {
        case .unconditional: buffer.writeInteger(0, as: UInt8.self)
        case .sequence(let sequence): buffer.writeMultipleIntegers(UInt8(1), sequence)
        case .absent: buffer.writeInteger(2, as: UInt8.self)
        case .epochSequence(let epoch, let sequence): buffer.writeMultipleIntegers(UInt8(3), epoch, sequence)
        }
    }
}

/// `u8 tag`, then the tag's fields: 0 snapshot; 1 resume, `u64 epoch, u64 sequence`.
extension SubscriptionStart: WireCodable {
    public static var minEncodedLength: Int { 1 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        switch try buffer.readWire(UInt8.self, "start tag") {
        case 0: self = .snapshot
        case 1:
            self = .resume(
                epoch: try buffer.readWire(UInt64.self, "start epoch"),
                sequence: try buffer.readWire(UInt64.self, "start sequence"))
        case let tag: throw WireError.malformed("start tag has unknown value \(tag)")
        }
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        switch self {
        case .snapshot: buffer.writeInteger(0, as: UInt8.self)
        case .resume(let epoch, let sequence): buffer.writeMultipleIntegers(UInt8(1), epoch, sequence)
        }
    }
}

/// `u8 tag`, then the tag's fields: 0 unset; 1 set, `bytes value`; 2 set, bytes withheld.
extension ValueState: WireCodable {
    public static var minEncodedLength: Int { 1 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        switch try buffer.readWire(UInt8.self, "value state tag") {
        case 0: self = .unset
        case 1: self = .set(Payload(try buffer.readWireBytes("value")))
        case 2: self = .setWithheld
        case let tag: throw WireError.malformed("value state tag has unknown value \(tag)")
        }
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        switch self {
        case .unset: buffer.writeInteger(0, as: UInt8.self)
        case .set(let payload):
            buffer.writeInteger(1, as: UInt8.self)
            buffer.writeWirePayload(payload)
        case .setWithheld: buffer.writeInteger(2, as: UInt8.self)
        }
    }
}

/// An item as a client writes it: `ItemID id, bytes payload`.
extension Item: WireCodable {
    public static var minEncodedLength: Int { 2 + 4 }

    /// Decoded straight into a kept item (`KeptItem`: the id's bytes and the payload's copied into one allocation
    /// of their own), which is what the daemon keeps of an inserted item: no slices of the frame, whose storage
    /// each would retain and release, and no second pass to copy them on the loop or in the store's writer. The
    /// errors and their order are those of an id then a payload read one after the other.
    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        let idLength = Int(try buffer.readWire(UInt16.self, "item id"))
        enum Read {
            case item(KeptItem, length: Int)
            case failed(WireError)
        }
        // One look at the bytes for the checks and the copy (each look retains and releases the buffer's storage).
        let read = buffer.withUnsafeReadableBytes { bytes -> Read in
            guard bytes.count >= idLength else { return .failed(.truncated("item id")) }
            let id = UnsafeRawBufferPointer(rebasing: bytes[..<idLength])
            guard ItemID.isValidUTF8(id) else { return .failed(.malformed("item id is not valid UTF-8")) }
            let payloadStart = idLength + 4
            guard bytes.count >= payloadStart else { return .failed(.truncated("payload")) }
            let payloadLength = Int(UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: idLength, as: UInt32.self)))
            guard bytes.count - payloadStart >= payloadLength else { return .failed(.truncated("payload")) }
            let payload = UnsafeRawBufferPointer(rebasing: bytes[payloadStart..<(payloadStart + payloadLength)])
            return .item(KeptItem.make(id: id, payload: payload), length: payloadStart + payloadLength)
        }
        switch read {
        case .failed(let error): throw error
        case .item(let item, let length):
            buffer.moveReaderIndex(forwardBy: length)
            self.init(kept: item)
        }
    }

    /// The id's and the payload's bytes copied from where they lie, in one write (one capacity check and one
    /// access to the buffer's storage, not four).
    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        let written = id.withUTF8 { id in
            payload.withUnsafeReadableBytes { payload -> Bool in
                guard id.count <= UInt16.max else { return false }
                let length = 2 + id.count + 4 + payload.count
                buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: length) { out in
                    out.storeBytes(of: UInt16(id.count).bigEndian, toByteOffset: 0, as: UInt16.self)
                    UnsafeMutableRawBufferPointer(rebasing: out[2..<(2 + id.count)]).copyMemory(from: id)
                    out.storeBytes(of: UInt32(payload.count).bigEndian, toByteOffset: 2 + id.count, as: UInt32.self)
                    UnsafeMutableRawBufferPointer(rebasing: out[(6 + id.count)..<length]).copyMemory(from: payload)
                    return length
                }
                return true
            }
        }
        if !written { try id.encode(wire: &buffer) }  // refused there, with the id's error
    }
}

/// An item as the broker holds it: `ItemID id, u64 createdAt, u64 updatedAt, bytes payload`.
/// Times are milliseconds since the Unix epoch, stamped by the daemon.
extension ItemRecord: WireCodable {
    public static var minEncodedLength: Int { 2 + 8 + 8 + 4 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        self.init(
            id: try ItemID(wire: &buffer), createdAt: try buffer.readWire(UInt64.self, "createdAt"),
            updatedAt: try buffer.readWire(UInt64.self, "updatedAt"), payload: Payload(try buffer.readWireBytes("payload")))
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        try id.encode(wire: &buffer)
        buffer.writeMultipleIntegers(createdAt, updatedAt)
        buffer.writeWirePayload(payload)
    }
}

/// One answer slot of a get-by-ids, in request order. `u8 tag`: 0 then `ItemID` (missing), 1 then
/// `ItemRecord` (present).
extension ItemSlot: WireCodable {
    public static var minEncodedLength: Int { 1 + 2 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        self = try buffer.readWireBool("slot tag") ? .present(try ItemRecord(wire: &buffer)) : .missing(try ItemID(wire: &buffer))
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        switch self {
        case .missing(let id):
            buffer.writeWireBool(false)
            try id.encode(wire: &buffer)
        case .present(let record):
            buffer.writeWireBool(true)
            try record.encode(wire: &buffer)
        }
    }
}

/// One step of a chain. `u8 op`: 1 insert then `list<Item>`, 2 remove then `list<ItemID>`, 3 removeAll.
extension ChainStep: WireCodable {
    public static var minEncodedLength: Int { 1 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        switch try buffer.readWire(UInt8.self, "step op") {
        case 1: self = .insert(items: try buffer.readWireList("step items"))
        case 2: self = .remove(ids: try buffer.readWireList("step ids"))
        case 3: self = .removeAll
        case let op: throw WireError.malformed("chain step op has unknown value \(op)")
        }
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        switch self {
        case .insert(let items):
            buffer.writeInteger(1, as: UInt8.self)
            try buffer.writeWireList(items)
        case .remove(let ids):
            buffer.writeInteger(2, as: UInt8.self)
            try buffer.writeWireList(ids)
        case .removeAll:
            buffer.writeInteger(3, as: UInt8.self)
        }
    }
}

/// One step of a committed event. `u8 op`: 1 insert then `list<ItemRecord>`, 2 remove then `list<ItemID>`.
/// A removeAll is sent as a remove of every id it removed.
extension EventStep: WireCodable {
    public static var minEncodedLength: Int { 1 + 4 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        switch try buffer.readWire(UInt8.self, "step op") {
        case 1: self = .insert(records: try buffer.readWireList("step records"))
        case 2: self = .remove(ids: try buffer.readWireList("step ids"))
        case let op: throw WireError.malformed("event step op has unknown value \(op)")
        }
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        switch self {
        case .insert(let records):
            buffer.writeInteger(1, as: UInt8.self)
            try buffer.writeWireList(records)
        case .remove(let ids):
            buffer.writeInteger(2, as: UInt8.self)
            try buffer.writeWireList(ids)
        }
    }

    /// A step too long for one frame becomes consecutive steps of the same op.
    public func fragments(maxLength: Int) -> [EventStep] {
        switch self {
        case .insert(let records):
            Self.chunk(records, maxLength: maxLength) { 2 + $0.id.utf8Count + 20 + $0.payload.count }
                .map { .insert(records: $0) }
        case .remove(let ids):
            Self.chunk(ids, maxLength: maxLength) { 2 + $0.utf8Count }.map { .remove(ids: $0) }
        }
    }

    /// Consecutive runs of `elements` whose encoded step (op and count: 5 bytes) fits in `maxLength`.
    private static func chunk<T>(_ elements: [T], maxLength: Int, length: (T) -> Int) -> [[T]] {
        var chunks: [[T]] = []
        var current: [T] = []
        var used = 5
        for element in elements {
            let size = length(element)
            if used + size > maxLength, !current.isEmpty {
                chunks.append(current)
                current = []
                used = 5
            }
            current.append(element)
            used += size
        }
        if !current.isEmpty || chunks.isEmpty { chunks.append(current) }
        return chunks
    }
}

/// `text name, u64 epoch, u64 sequence, u64 count, text engine`. A store that does not exist has epoch 0,
/// sequence 0, count 0 and an empty engine name.
extension StoreInfo: WireCodable {
    public static var minEncodedLength: Int { 2 + 8 + 8 + 8 + 2 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        self.init(
            name: try buffer.readWireText("store name"), epoch: try buffer.readWire(UInt64.self, "epoch"),
            sequence: try buffer.readWire(UInt64.self, "sequence"), count: try buffer.readWire(UInt64.self, "count"),
            engine: try buffer.readWireText("engine name"))
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        try buffer.writeWireText(name, "store name")
        buffer.writeMultipleIntegers(epoch, sequence, count)
        try buffer.writeWireText(engine, "engine name")
    }
}

/// `text name, u64 epoch, u64 sequence, u8 set (0 or 1)`.
extension ValueInfo: WireCodable {
    public static var minEncodedLength: Int { 2 + 8 + 8 + 1 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        self.init(
            name: try buffer.readWireText("value name"), epoch: try buffer.readWire(UInt64.self, "epoch"),
            sequence: try buffer.readWire(UInt64.self, "sequence"), isSet: try buffer.readWireBool("set"))
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        try buffer.writeWireText(name, "value name")
        buffer.writeMultipleIntegers(epoch, sequence)
        buffer.writeWireBool(isSet)
    }
}

// EngineStatus is a `u8` (0 found, 1 loaded, 2 refused); EngineCapabilities a `u32` of bits (0 persistent, 1 atomic, 2 nonblocking, 3 shared).

/// `text name, text path, u8 status, u16 abiMajor, u16 abiMinor, u32 capabilities, text detail`.
/// `detail` is the engine's version text, or why it cannot be used.
extension EngineInfo: WireCodable {
    public static var minEncodedLength: Int { 2 + 2 + 1 + 2 + 2 + 4 + 2 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        self.init(
            name: try buffer.readWireText("engine name"), path: try buffer.readWireText("engine path"),
            status: try buffer.readWireEnum(EngineStatus.self, "engine status"),
            abiMajor: try buffer.readWire(UInt16.self, "abiMajor"), abiMinor: try buffer.readWire(UInt16.self, "abiMinor"),
            capabilities: EngineCapabilities(rawValue: try buffer.readWire(UInt32.self, "capabilities")),
            detail: try buffer.readWireText("engine detail"))
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        try buffer.writeWireText(name, "engine name")
        try buffer.writeWireText(path, "engine path")
        buffer.writeMultipleIntegers(status.rawValue, abiMajor, abiMinor, capabilities.rawValue)
        try buffer.writeWireText(detail, "engine detail")
    }
}
