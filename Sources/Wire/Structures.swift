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

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        self.init(try buffer.readWireText("item id"))
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        try buffer.writeWireText(string, "item id")
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

/// What a conditional write expects to find. `u8 tag`, then the tag's fields.
public enum Condition: Hashable, Sendable, Codable {
    /// Tag 0: write whatever the current state.
    case unconditional
    /// Tag 1, `u64 sequence`: the store (in its current epoch) or the value is at exactly this sequence.
    case sequence(UInt64)
    /// Tag 2: the store does not exist, or the value is unset.
    case absent
    /// Tag 3, `u64 epoch, u64 sequence`: the store or value is at this epoch and this sequence.
    case epochSequence(epoch: UInt64, sequence: UInt64)
}

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

/// Which namespace a name lives in. `u8`.
public enum Namespace: UInt8, Hashable, Sendable, Codable, CaseIterable {
    /// Stores of items.
    case store = 0
    /// Values (Boutique's @StoredValue).
    case value = 1
    /// Secure values (@SecurelyStoredValue): encrypted at rest, never sent in pushes.
    case secureValue = 2
}

/// Where a subscription starts. `u8 tag`, then the tag's fields.
public enum SubscriptionStart: Hashable, Sendable, Codable {
    /// Tag 0: a `loaded` snapshot first, then every later event.
    case snapshot
    /// Tag 1, `u64 epoch, u64 sequence`: every event after this one, or `historyGone` then a snapshot.
    case resume(epoch: UInt64, sequence: UInt64)
}

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

/// The state of a value or secure value. `u8 tag`, then the tag's fields.
public enum ValueState: Hashable, Sendable, Codable {
    /// Tag 0: unset (never set, or reset).
    case unset
    /// Tag 1, `bytes value`: set, with its bytes.
    case set(Payload)
    /// Tag 2: set, bytes withheld (a secure value in a push).
    case setWithheld
}

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
            buffer.writeWireBytes(payload.bytes)
        case .setWithheld: buffer.writeInteger(2, as: UInt8.self)
        }
    }
}

/// An item as a client writes it: `ItemID id, bytes payload`.
public struct Item: WireCodable {
    public var id: ItemID
    public var payload: Payload

    public init(id: ItemID, payload: Payload) {
        self.id = id
        self.payload = payload
    }

    public static var minEncodedLength: Int { 2 + 4 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        id = try ItemID(wire: &buffer)
        payload = Payload(try buffer.readWireBytes("payload"))
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        try id.encode(wire: &buffer)
        buffer.writeWireBytes(payload.bytes)
    }
}

/// An item as the broker holds it: `ItemID id, u64 createdAt, u64 updatedAt, bytes payload`.
/// Times are milliseconds since the Unix epoch, stamped by the daemon.
public struct ItemRecord: WireCodable {
    public var id: ItemID
    public var createdAt: UInt64
    public var updatedAt: UInt64
    public var payload: Payload

    public init(id: ItemID, createdAt: UInt64, updatedAt: UInt64, payload: Payload) {
        self.id = id
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.payload = payload
    }

    public static var minEncodedLength: Int { 2 + 8 + 8 + 4 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        id = try ItemID(wire: &buffer)
        createdAt = try buffer.readWire(UInt64.self, "createdAt")
        updatedAt = try buffer.readWire(UInt64.self, "updatedAt")
        payload = Payload(try buffer.readWireBytes("payload"))
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        try id.encode(wire: &buffer)
        buffer.writeMultipleIntegers(createdAt, updatedAt)
        buffer.writeWireBytes(payload.bytes)
    }
}

/// One answer slot of a get-by-ids, in request order. `u8 tag`: 0 then `ItemID` (missing), 1 then
/// `ItemRecord` (present).
public enum ItemSlot: WireCodable {
    case missing(ItemID)
    case present(ItemRecord)

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
public enum ChainStep: WireCodable {
    case insert(items: [Item])
    case remove(ids: [ItemID])
    case removeAll

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
public enum EventStep: WireCodable {
    case insert(records: [ItemRecord])
    case remove(ids: [ItemID])

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
            Self.chunk(records, maxLength: maxLength) { 2 + $0.id.string.utf8.count + 20 + $0.payload.count }
                .map { .insert(records: $0) }
        case .remove(let ids):
            Self.chunk(ids, maxLength: maxLength) { 2 + $0.string.utf8.count }.map { .remove(ids: $0) }
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
public struct StoreInfo: WireCodable {
    public var name: String
    public var epoch: UInt64
    public var sequence: UInt64
    public var count: UInt64
    public var engine: String

    public init(name: String, epoch: UInt64, sequence: UInt64, count: UInt64, engine: String) {
        self.name = name
        self.epoch = epoch
        self.sequence = sequence
        self.count = count
        self.engine = engine
    }

    public static var minEncodedLength: Int { 2 + 8 + 8 + 8 + 2 }

    /// The epoch of a store that cannot be served whose manifest cannot be read either.
    public static let unknownEpoch = UInt64.max

    /// The store exists but cannot be served (its engine cannot be loaded, its files are lost or damaged):
    /// listed with an epoch and sequence 0, a combination no healthy store has. A request on it says why.
    public var isBroken: Bool { epoch != 0 && sequence == 0 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        name = try buffer.readWireText("store name")
        epoch = try buffer.readWire(UInt64.self, "epoch")
        sequence = try buffer.readWire(UInt64.self, "sequence")
        count = try buffer.readWire(UInt64.self, "count")
        engine = try buffer.readWireText("engine name")
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        try buffer.writeWireText(name, "store name")
        buffer.writeMultipleIntegers(epoch, sequence, count)
        try buffer.writeWireText(engine, "engine name")
    }
}

/// `u8`: how an engine file on the search path stands.
public enum EngineStatus: UInt8, Hashable, Sendable, Codable {
    /// 0: a file on the search path that passes the checks made before loading; not opened, so its version and
    /// ABI are not known (a listing never loads a file: that would run its code).
    case found = 0
    /// 1: loaded by the daemon; version and ABI are the engine's.
    case loaded = 1
    /// 2: refused; `detail` says why (unsafe permissions, not an engine, a wrong ABI, shadowed...).
    case refused = 2
}

/// `u32` capability bits an engine reports.
public struct EngineCapabilities: OptionSet, Hashable, Sendable, Codable {
    public var rawValue: UInt32

    public init(rawValue: UInt32) {
        self.rawValue = rawValue
    }

    /// Bit 0: data survives a restart.
    public static let persistent = EngineCapabilities(rawValue: 1 << 0)
    /// Bit 1: `apply` is all-or-nothing, so chains are allowed.
    public static let atomic = EngineCapabilities(rawValue: 1 << 1)
}

/// `text name, text path, u8 status, u16 abiMajor, u16 abiMinor, u32 capabilities, text detail`.
/// `detail` is the engine's version text, or why it cannot be used.
public struct EngineInfo: WireCodable {
    public var name: String
    public var path: String
    public var status: EngineStatus
    public var abiMajor: UInt16
    public var abiMinor: UInt16
    public var capabilities: EngineCapabilities
    public var detail: String

    public init(
        name: String, path: String, status: EngineStatus, abiMajor: UInt16, abiMinor: UInt16,
        capabilities: EngineCapabilities, detail: String
    ) {
        self.name = name
        self.path = path
        self.status = status
        self.abiMajor = abiMajor
        self.abiMinor = abiMinor
        self.capabilities = capabilities
        self.detail = detail
    }

    public static var minEncodedLength: Int { 2 + 2 + 1 + 2 + 2 + 4 + 2 }

    public init(wire buffer: inout ByteBuffer) throws(WireError) {
        name = try buffer.readWireText("engine name")
        path = try buffer.readWireText("engine path")
        status = try buffer.readWireEnum(EngineStatus.self, "engine status")
        abiMajor = try buffer.readWire(UInt16.self, "abiMajor")
        abiMinor = try buffer.readWire(UInt16.self, "abiMinor")
        capabilities = EngineCapabilities(rawValue: try buffer.readWire(UInt32.self, "capabilities"))
        detail = try buffer.readWireText("engine detail")
    }

    public func encode(wire buffer: inout ByteBuffer) throws(WireError) {
        try buffer.writeWireText(name, "engine name")
        try buffer.writeWireText(path, "engine path")
        buffer.writeMultipleIntegers(status.rawValue, abiMajor, abiMinor, capabilities.rawValue)
        try buffer.writeWireText(detail, "engine detail")
    }
}
