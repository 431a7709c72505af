import NIOCore

// Payload layouts shared by several message types. A message type adopts one of these and gets its
// decoding and encoding from it; docs/PROTOCOL.md names the same layouts.

/// No fields.
public protocol EmptyMessage: WireMessage {
    init()
}

extension EmptyMessage {
    public init(payload: inout ByteBuffer) throws(WireError) { self.init() }
    public func encode(payload: inout ByteBuffer) throws(WireError) {}
}

/// `text store`.
public protocol StoreMessage: WireMessage {
    var store: String { get }
    init(store: String)
}

extension StoreMessage {
    public init(payload: inout ByteBuffer) throws(WireError) {
        self.init(store: try payload.readWireText("store"))
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        try payload.writeWireText(store, "store")
    }
}

/// `text store, Condition condition`.
public protocol StoreWriteMessage: WireMessage {
    var store: String { get }
    var condition: Condition { get }
    init(store: String, condition: Condition)
}

extension StoreWriteMessage {
    public init(payload: inout ByteBuffer) throws(WireError) {
        self.init(store: try payload.readWireText("store"), condition: try Condition(wire: &payload))
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        try payload.writeWireText(store, "store")
        try condition.encode(wire: &payload)
    }
}

/// `text store, Cursor after, u32 limit`, where `Cursor` is `u8 0`, or `u8 1` then an `ItemID`.
public protocol CursorMessage: WireMessage {
    var store: String { get }
    var after: ItemID? { get }
    var limit: UInt32 { get }
    init(store: String, after: ItemID?, limit: UInt32)
}

extension CursorMessage {
    public init(payload: inout ByteBuffer) throws(WireError) {
        self.init(
            store: try payload.readWireText("store"),
            after: try ItemID?(wireCursor: &payload),
            limit: try payload.readWire(UInt32.self, "limit"))
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        try payload.writeWireText(store, "store")
        try after.encode(wireCursor: &payload)
        payload.writeInteger(limit)
    }
}

/// `u64 epoch, u64 sequence`.
public protocol SequenceMessage: WireMessage {
    var epoch: UInt64 { get }
    var sequence: UInt64 { get }
    init(epoch: UInt64, sequence: UInt64)
}

extension SequenceMessage {
    public init(payload: inout ByteBuffer) throws(WireError) {
        self.init(epoch: try payload.readWire(UInt64.self, "epoch"), sequence: try payload.readWire(UInt64.self, "sequence"))
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        payload.writeMultipleIntegers(epoch, sequence)
    }
}

/// `u64 epoch, u64 sequence, ValueState state`.
public protocol ValueStateMessage: WireMessage {
    var epoch: UInt64 { get }
    var sequence: UInt64 { get }
    var state: ValueState { get }
    init(epoch: UInt64, sequence: UInt64, state: ValueState)
}

extension ValueStateMessage {
    public init(payload: inout ByteBuffer) throws(WireError) {
        self.init(
            epoch: try payload.readWire(UInt64.self, "epoch"),
            sequence: try payload.readWire(UInt64.self, "sequence"),
            state: try ValueState(wire: &payload))
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        payload.writeMultipleIntegers(epoch, sequence)
        try state.encode(wire: &payload)
    }
}

/// `u16 code, text message`.
public protocol CodeMessage: WireMessage {
    var code: ErrorCode { get }
    var message: String { get }
    init(code: ErrorCode, message: String)
}

extension CodeMessage {
    public init(payload: inout ByteBuffer) throws(WireError) {
        self.init(
            code: ErrorCode(rawValue: try payload.readWire(UInt16.self, "code")),
            message: try payload.readWireText("message"))
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        payload.writeInteger(code.rawValue)
        try payload.writeWireText(message, "message")
    }
}

/// `u64 epoch, u64 sequence, list<Element> elements`: an answer or push that may span frames.
public protocol SequencedListMessage: SplittableMessage {
    var epoch: UInt64 { get }
    var sequence: UInt64 { get }
    init(epoch: UInt64, sequence: UInt64, elements: [Element])
}

extension SequencedListMessage {
    public init(payload: inout ByteBuffer) throws(WireError) {
        self.init(
            epoch: try payload.readWire(UInt64.self, "epoch"),
            sequence: try payload.readWire(UInt64.self, "sequence"),
            elements: try payload.readWireList("elements"))
    }

    public func encodeHead(payload: inout ByteBuffer) throws(WireError) {
        payload.writeMultipleIntegers(epoch, sequence)
    }
}

/// `list<Element> elements` and nothing else.
public protocol ListMessage: SplittableMessage {
    init(elements: [Element])
}

extension ListMessage {
    public init(payload: inout ByteBuffer) throws(WireError) {
        self.init(elements: try payload.readWireList("elements"))
    }

    public func encodeHead(payload: inout ByteBuffer) throws(WireError) {}
}

/// `u32 subscriptionID`.
public protocol SubscriptionIDMessage: WireMessage {
    var subscriptionID: UInt32 { get }
    init(subscriptionID: UInt32)
}

extension SubscriptionIDMessage {
    public init(payload: inout ByteBuffer) throws(WireError) {
        self.init(subscriptionID: try payload.readWire(UInt32.self, "subscription id"))
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        payload.writeInteger(subscriptionID)
    }
}
