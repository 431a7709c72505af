import NIOCore

// The payloads of the messages a client sends: `hello` and the requests. Field order here is wire order.

extension ClientMessage {
    /// `hello` (0x01): `u8[4] magic "SBRK", u8 n (1…16), u16[n] versions, text clientName (≤ 256 bytes)`.
    /// The first frame on every connection; answered by `welcome` or by `error unsupportedVersion`.
    public struct Hello: WireMessage {
        public static var type: MessageType { .hello }
        /// The protocol versions the client speaks, in any order.
        public var versions: [UInt16]
        /// Free text for logs ("storectl", "notes-panel").
        public var clientName: String

        public init(versions: [UInt16] = WireProtocol.supportedVersions, clientName: String) {
            self.versions = versions
            self.clientName = clientName
        }

        public init(payload: inout ByteBuffer) throws(WireError) {
            guard let magic = payload.readBytes(length: 4), magic == WireProtocol.magic else {
                throw WireError(.badHandshake, "hello does not start with the magic bytes \"SBRK\"")
            }
            let count = Int(try payload.readWire(UInt8.self, "version count"))
            guard (1...WireProtocol.maxOfferedVersions).contains(count) else {
                throw WireError(.badHandshake, "hello must offer 1 to 16 versions, got \(count)")
            }
            versions = []
            for _ in 0..<count {
                versions.append(try payload.readWire(UInt16.self, "version"))
            }
            clientName = try payload.readWireText("client name")
            guard clientName.utf8.count <= WireProtocol.maxClientNameLength else {
                throw WireError(.badHandshake, "the client name is over 256 bytes")
            }
        }

        public func encode(payload: inout ByteBuffer) throws(WireError) {
            guard (1...WireProtocol.maxOfferedVersions).contains(versions.count),
                clientName.utf8.count <= WireProtocol.maxClientNameLength
            else {
                throw WireError(.badHandshake, "hello needs 1 to 16 versions and a client name of at most 256 bytes")
            }
            payload.writeBytes(WireProtocol.magic)
            payload.writeInteger(UInt8(versions.count))
            for version in versions {
                payload.writeInteger(version)
            }
            try payload.writeWireText(clientName, "client name")
        }
    }

    /// `ping` (0x10): empty. Answered by `pong`.
    public typealias Ping = EmptyMessage<Kinds.Ping>
    /// `listStores` (0x11): empty. Answered by `storeList`.
    public typealias ListStores = EmptyMessage<Kinds.ListStores>
    /// `listEngines` (0x12): empty. Answered by `engineList`: every engine file on the search path.
    public typealias ListEngines = EmptyMessage<Kinds.ListEngines>
    /// `getStoreInfo` (0x13): `text store`. Answered by `storeInfoResult`.
    public typealias GetStoreInfo = StoreRequest<Kinds.GetStoreInfo>
    /// `insert` (0x14): `text store, Condition condition, list<Item> items`. Answered by `writeResult`.
    public typealias Insert = StoreBatch<Kinds.Insert, Item>
    /// `remove` (0x15): `text store, Condition condition, list<ItemID> ids`. Answered by `writeResult`.
    public typealias Remove = StoreBatch<Kinds.Remove, ItemID>
    /// `removeAll` (0x16): `text store, Condition condition`. Answered by `writeResult`.
    public typealias RemoveAll = StoreWrite<Kinds.RemoveAll>
    /// `drop` (0x17): `text store, Condition condition`. Deletes the store and its data. Answered by
    /// `writeResult` (committed false when the store did not exist).
    public typealias Drop = StoreWrite<Kinds.Drop>
    /// `chain` (0x18): `text store, Condition condition, list<ChainStep> steps`. One atomic commit; it must
    /// fit in one frame. Answered by `writeResult`.
    public typealias Chain = StoreBatch<Kinds.Chain, ChainStep>
    /// `queryRange` (0x1A): `text store, Cursor after, u32 limit` (0: no limit). Answered by `rangeResult`:
    /// the items after the cursor in store order, or `error cursorGone`.
    public typealias QueryRange = CursorRequest<Kinds.QueryRange>
    /// `count` (0x1B): `text store`. Answered by `countResult`.
    public typealias Count = StoreRequest<Kinds.Count>
    /// `listIDs` (0x1C): `text store, Cursor after, u32 limit` (0: no limit). Answered by `idList`.
    public typealias ListIDs = CursorRequest<Kinds.ListIDs>
    /// `unsubscribe` (0x1E): `u32 subscriptionID`. Answered by `unsubscribed`; no push of that subscription
    /// follows the answer.
    public typealias Unsubscribe = SubscriptionMessage<Kinds.Unsubscribe>

    /// `quietChain` (0x24): `u32 subscriptionID, text store, Condition condition, list<ChainStep> steps`. A
    /// write by the mirror that `subscriptionID` (a subscription of this connection to `store`) feeds: the
    /// commit's event goes to every other subscriber as usual but is not pushed on that subscription, whose
    /// client applies the write itself from the answer (`writeResult`, its sequence). One step is that step's
    /// own request (`insert`, `remove`, `removeAll`: their limits), several are a `chain`. A subscription id that
    /// names no live subscription of this connection to `store` silences nothing: the write is a plain one.
    public struct QuietChain: WireMessage {
        public static var type: MessageType { .quietChain }
        public var subscriptionID: UInt32
        public var store: String
        public var condition: Condition
        public var elements: [ChainStep]

        public init(subscriptionID: UInt32, store: String, condition: Condition = .unconditional, elements: [ChainStep]) {
            self.subscriptionID = subscriptionID
            self.store = store
            self.condition = condition
            self.elements = elements
        }

        public init(payload: inout ByteBuffer) throws(WireError) {
            subscriptionID = try payload.readWire(UInt32.self, "subscription id")
            store = try payload.readWireText("store")
            condition = try Condition(wire: &payload)
            elements = try payload.readWireList("elements")
        }

        public func encode(payload: inout ByteBuffer) throws(WireError) {
            payload.writeInteger(subscriptionID)
            try payload.writeWireText(store, "store")
            try condition.encode(wire: &payload)
            try payload.writeWireList(elements)
        }
    }

    /// `getItems` (0x19): `text store, list<ItemID> ids`. Answered by `itemsResult`, one slot per id in
    /// request order.
    public struct GetItems: WireMessage {
        public static var type: MessageType { .getItems }
        public var store: String
        public var ids: [ItemID]

        public init(store: String, ids: [ItemID]) {
            self.store = store
            self.ids = ids
        }

        public init(payload: inout ByteBuffer) throws(WireError) {
            store = try payload.readWireText("store")
            ids = try payload.readWireList("ids")
        }

        public func encode(payload: inout ByteBuffer) throws(WireError) {
            try payload.writeWireText(store, "store")
            try payload.writeWireList(ids)
        }
    }

    /// `subscribe` (0x1D): `u8 namespace, text name, SubscriptionStart start`. Answered by `subscribed`
    /// (with the subscription id every push of it will carry), then pushes.
    public struct Subscribe: WireMessage {
        public static var type: MessageType { .subscribe }
        public var namespace: Namespace
        public var name: String
        public var start: SubscriptionStart

        public init(namespace: Namespace = .store, name: String, start: SubscriptionStart = .snapshot) {
            self.namespace = namespace
            self.name = name
            self.start = start
        }

        public init(payload: inout ByteBuffer) throws(WireError) {
            namespace = try payload.readWireEnum(Namespace.self, "namespace")
            name = try payload.readWireText("name")
            start = try SubscriptionStart(wire: &payload)
        }

        public func encode(payload: inout ByteBuffer) throws(WireError) {
            payload.writeInteger(namespace.rawValue)
            try payload.writeWireText(name, "name")
            try start.encode(wire: &payload)
        }
    }

    /// `getValue` (0x20): `u8 namespace (1 or 2), text name`. Answered by `valueResult`.
    public struct GetValue: WireMessage {
        public static var type: MessageType { .getValue }
        public var namespace: Namespace
        public var name: String

        public init(namespace: Namespace = .value, name: String) {
            self.namespace = namespace
            self.name = name
        }

        public init(payload: inout ByteBuffer) throws(WireError) {
            namespace = try payload.readWireEnum(Namespace.self, "namespace")
            name = try payload.readWireText("name")
        }

        public func encode(payload: inout ByteBuffer) throws(WireError) {
            payload.writeInteger(namespace.rawValue)
            try payload.writeWireText(name, "name")
        }
    }

    /// `listValues` (0x23): `u8 namespace (1 or 2)`. Answered by `valueList`: every value (or secure value)
    /// that was ever set, reset ones included, by name.
    public struct ListValues: WireMessage {
        public static var type: MessageType { .listValues }
        public var namespace: Namespace

        public init(namespace: Namespace = .value) {
            self.namespace = namespace
        }

        public init(payload: inout ByteBuffer) throws(WireError) {
            namespace = try payload.readWireEnum(Namespace.self, "namespace")
        }

        public func encode(payload: inout ByteBuffer) throws(WireError) {
            payload.writeInteger(namespace.rawValue)
        }
    }

    /// `setValue` (0x21): `u8 namespace (1 or 2), text name, Condition condition, bytes value`. Answered by
    /// `writeResult`.
    public struct SetValue: WireMessage {
        public static var type: MessageType { .setValue }
        public var namespace: Namespace
        public var name: String
        public var condition: Condition
        public var value: Payload

        public init(namespace: Namespace = .value, name: String, condition: Condition = .unconditional, value: Payload) {
            self.namespace = namespace
            self.name = name
            self.condition = condition
            self.value = value
        }

        public init(payload: inout ByteBuffer) throws(WireError) {
            namespace = try payload.readWireEnum(Namespace.self, "namespace")
            name = try payload.readWireText("name")
            condition = try Condition(wire: &payload)
            value = Payload(try payload.readWireBytes("value"))
        }

        public func encode(payload: inout ByteBuffer) throws(WireError) {
            payload.writeInteger(namespace.rawValue)
            try payload.writeWireText(name, "name")
            try condition.encode(wire: &payload)
            payload.writeWireBytes(value.bytes)
        }
    }

    /// `resetValue` (0x22): `u8 namespace (1 or 2), text name, Condition condition`. Answered by
    /// `writeResult` (committed false when the value was already unset).
    public struct ResetValue: WireMessage {
        public static var type: MessageType { .resetValue }
        public var namespace: Namespace
        public var name: String
        public var condition: Condition

        public init(namespace: Namespace = .value, name: String, condition: Condition = .unconditional) {
            self.namespace = namespace
            self.name = name
            self.condition = condition
        }

        public init(payload: inout ByteBuffer) throws(WireError) {
            namespace = try payload.readWireEnum(Namespace.self, "namespace")
            name = try payload.readWireText("name")
            condition = try Condition(wire: &payload)
        }

        public func encode(payload: inout ByteBuffer) throws(WireError) {
            payload.writeInteger(namespace.rawValue)
            try payload.writeWireText(name, "name")
            try condition.encode(wire: &payload)
        }
    }
}

extension StoreBatch where Element == Item {
    public init(store: String, condition: Condition = .unconditional, items: [Item]) {
        self.init(store: store, condition: condition, elements: items)
    }

    public var items: [Item] { elements }
}

extension StoreBatch where Element == ItemID {
    public init(store: String, condition: Condition = .unconditional, ids: [ItemID]) {
        self.init(store: store, condition: condition, elements: ids)
    }

    public var ids: [ItemID] { elements }
}

extension StoreBatch where Element == ChainStep {
    public init(store: String, condition: Condition = .unconditional, steps: [ChainStep]) {
        self.init(store: store, condition: condition, elements: steps)
    }

    public var steps: [ChainStep] { elements }
}
