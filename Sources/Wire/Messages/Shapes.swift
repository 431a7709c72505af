import NIOCore

// Payload layouts shared by several message types. Each layout is one generic struct; the message type is a
// phantom parameter (`Kind`), so `ClientMessage.RemoveAll` and `ClientMessage.Drop` share their code but stay
// distinct types. docs/PROTOCOL.md uses the same layouts.

/// Names the message type of a shared layout.
public protocol MessageKind: Sendable {
    static var type: MessageType { get }
}

/// No fields.
public struct EmptyMessage<Kind: MessageKind>: WireMessage {
    public static var type: MessageType { Kind.type }
    public init() {}
    public init(payload: inout ByteBuffer) throws(WireError) {}
    public func encode(payload: inout ByteBuffer) throws(WireError) {}
}

/// `text store`.
public struct StoreRequest<Kind: MessageKind>: WireMessage {
    public static var type: MessageType { Kind.type }
    public var store: String

    public init(store: String) {
        self.store = store
    }

    public init(payload: inout ByteBuffer) throws(WireError) {
        store = try payload.readWireText("store")
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        try payload.writeWireText(store, "store")
    }
}

/// `text store, Condition condition`.
public struct StoreWrite<Kind: MessageKind>: WireMessage {
    public static var type: MessageType { Kind.type }
    public var store: String
    public var condition: Condition

    public init(store: String, condition: Condition = .unconditional) {
        self.store = store
        self.condition = condition
    }

    public init(payload: inout ByteBuffer) throws(WireError) {
        store = try payload.readWireText("store")
        condition = try Condition(wire: &payload)
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        try payload.writeWireText(store, "store")
        try condition.encode(wire: &payload)
    }
}

/// `text store, Condition condition, list<Element> elements`.
public struct StoreBatch<Kind: MessageKind, Element: WireCodable>: WireMessage {
    public static var type: MessageType { Kind.type }
    public var store: String
    public var condition: Condition
    public var elements: [Element]

    public init(store: String, condition: Condition = .unconditional, elements: [Element]) {
        self.store = store
        self.condition = condition
        self.elements = elements
    }

    public init(payload: inout ByteBuffer) throws(WireError) {
        store = try payload.readWireText("store")
        condition = try Condition(wire: &payload)
        elements = try payload.readWireList("elements")
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        try payload.writeWireText(store, "store")
        try condition.encode(wire: &payload)
        try payload.writeWireList(elements)
    }
}

/// `text store, Cursor after, u32 limit`, where `Cursor` is `u8 0`, or `u8 1` then an `ItemID`.
public struct CursorRequest<Kind: MessageKind>: WireMessage {
    public static var type: MessageType { Kind.type }
    public var store: String
    /// Start after this id (`nil`: from the first item).
    public var after: ItemID?
    /// The most items to answer; 0 for no limit.
    public var limit: UInt32

    public init(store: String, after: ItemID? = nil, limit: UInt32 = 0) {
        self.store = store
        self.after = after
        self.limit = limit
    }

    public init(payload: inout ByteBuffer) throws(WireError) {
        store = try payload.readWireText("store")
        after = try ItemID?(wireCursor: &payload)
        limit = try payload.readWire(UInt32.self, "limit")
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        try payload.writeWireText(store, "store")
        try after.encode(wireCursor: &payload)
        payload.writeInteger(limit)
    }
}

/// `u32 subscriptionID`.
public struct SubscriptionMessage<Kind: MessageKind>: WireMessage {
    public static var type: MessageType { Kind.type }
    public var subscriptionID: UInt32

    public init(subscriptionID: UInt32) {
        self.subscriptionID = subscriptionID
    }

    public init(payload: inout ByteBuffer) throws(WireError) {
        subscriptionID = try payload.readWire(UInt32.self, "subscription id")
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        payload.writeInteger(subscriptionID)
    }
}

/// `u64 epoch, u64 sequence`.
public struct SequenceNotice<Kind: MessageKind>: WireMessage {
    public static var type: MessageType { Kind.type }
    public var epoch: UInt64
    public var sequence: UInt64

    public init(epoch: UInt64, sequence: UInt64) {
        self.epoch = epoch
        self.sequence = sequence
    }

    public init(payload: inout ByteBuffer) throws(WireError) {
        epoch = try payload.readWire(UInt64.self, "epoch")
        sequence = try payload.readWire(UInt64.self, "sequence")
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        payload.writeMultipleIntegers(epoch, sequence)
    }
}

/// `u64 epoch, u64 sequence, ValueState state`.
public struct ValueStateMessage<Kind: MessageKind>: WireMessage {
    public static var type: MessageType { Kind.type }
    public var epoch: UInt64
    public var sequence: UInt64
    public var state: ValueState

    public init(epoch: UInt64, sequence: UInt64, state: ValueState) {
        self.epoch = epoch
        self.sequence = sequence
        self.state = state
    }

    public init(payload: inout ByteBuffer) throws(WireError) {
        epoch = try payload.readWire(UInt64.self, "epoch")
        sequence = try payload.readWire(UInt64.self, "sequence")
        state = try ValueState(wire: &payload)
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        payload.writeMultipleIntegers(epoch, sequence)
        try state.encode(wire: &payload)
    }
}

/// `u16 code, text message`.
public struct CodeMessage<Kind: MessageKind>: WireMessage {
    public static var type: MessageType { Kind.type }
    public var code: ErrorCode
    public var message: String

    public init(code: ErrorCode, message: String) {
        self.code = code
        self.message = message
    }

    public init(payload: inout ByteBuffer) throws(WireError) {
        code = ErrorCode(rawValue: try payload.readWire(UInt16.self, "code"))
        message = try payload.readWireText("message")
    }

    public func encode(payload: inout ByteBuffer) throws(WireError) {
        payload.writeInteger(code.rawValue)
        try payload.writeWireText(message, "message")
    }
}

/// `list<Element> elements`; may span frames.
public struct ListMessage<Kind: MessageKind, Element: WireCodable>: SplittableMessage {
    public static var type: MessageType { Kind.type }
    public var elements: [Element]

    public init(elements: [Element]) {
        self.elements = elements
    }

    public init(payload: inout ByteBuffer) throws(WireError) {
        elements = try payload.readWireList("elements")
    }

    public func encodeHead(payload: inout ByteBuffer) throws(WireError) {}
}

/// `u64 epoch, u64 sequence, list<Element> elements`; may span frames.
public struct SequencedList<Kind: MessageKind, Element: WireCodable>: SplittableMessage {
    public static var type: MessageType { Kind.type }
    public var epoch: UInt64
    public var sequence: UInt64
    public var elements: [Element]

    public init(epoch: UInt64, sequence: UInt64, elements: [Element]) {
        self.epoch = epoch
        self.sequence = sequence
        self.elements = elements
    }

    public init(payload: inout ByteBuffer) throws(WireError) {
        epoch = try payload.readWire(UInt64.self, "epoch")
        sequence = try payload.readWire(UInt64.self, "sequence")
        elements = try payload.readWireList("elements")
    }

    public func encodeHead(payload: inout ByteBuffer) throws(WireError) {
        payload.writeMultipleIntegers(epoch, sequence)
    }
}

/// The phantom types naming each message type that uses a shared layout.
public enum Kinds {
    public enum Ping: MessageKind { public static var type: MessageType { .ping } }
    public enum ListStores: MessageKind { public static var type: MessageType { .listStores } }
    public enum ListEngines: MessageKind { public static var type: MessageType { .listEngines } }
    public enum GetStoreInfo: MessageKind { public static var type: MessageType { .getStoreInfo } }
    public enum Insert: MessageKind { public static var type: MessageType { .insert } }
    public enum Remove: MessageKind { public static var type: MessageType { .remove } }
    public enum RemoveAll: MessageKind { public static var type: MessageType { .removeAll } }
    public enum Drop: MessageKind { public static var type: MessageType { .drop } }
    public enum Chain: MessageKind { public static var type: MessageType { .chain } }
    public enum QuietChain: MessageKind { public static var type: MessageType { .quietChain } }
    public enum QueryRange: MessageKind { public static var type: MessageType { .queryRange } }
    public enum Count: MessageKind { public static var type: MessageType { .count } }
    public enum ListIDs: MessageKind { public static var type: MessageType { .listIDs } }
    public enum Unsubscribe: MessageKind { public static var type: MessageType { .unsubscribe } }
    public enum Pong: MessageKind { public static var type: MessageType { .pong } }
    public enum StoreList: MessageKind { public static var type: MessageType { .storeList } }
    public enum EngineList: MessageKind { public static var type: MessageType { .engineList } }
    public enum ItemsResult: MessageKind { public static var type: MessageType { .itemsResult } }
    public enum RangeResult: MessageKind { public static var type: MessageType { .rangeResult } }
    public enum IDList: MessageKind { public static var type: MessageType { .idList } }
    public enum Subscribed: MessageKind { public static var type: MessageType { .subscribed } }
    public enum Unsubscribed: MessageKind { public static var type: MessageType { .unsubscribed } }
    public enum ValueResult: MessageKind { public static var type: MessageType { .valueResult } }
    public enum ValueList: MessageKind { public static var type: MessageType { .valueList } }
    public enum Error: MessageKind { public static var type: MessageType { .error } }
    public enum StoreEvent: MessageKind { public static var type: MessageType { .storeEvent } }
    public enum ValueLoaded: MessageKind { public static var type: MessageType { .valueLoaded } }
    public enum ValueEvent: MessageKind { public static var type: MessageType { .valueEvent } }
    public enum Lagged: MessageKind { public static var type: MessageType { .lagged } }
    public enum HistoryGone: MessageKind { public static var type: MessageType { .historyGone } }
    public enum Dropped: MessageKind { public static var type: MessageType { .dropped } }
    public enum Goodbye: MessageKind { public static var type: MessageType { .goodbye } }
}
