import NIOCore

// The payloads of the messages a server sends: answers (id = request id) and pushes (id = subscription id).
// Field order here is wire order.

extension ServerMessage {
    /// `welcome` (0x40): `u16 version, text serverVersion, u32 maxFrameLength, u32 maxItemLength,
    /// u32 maxBatch, u32 maxInFlight`. Answers `hello`; from now on frames up to `maxFrameLength` bytes are
    /// accepted in both directions.
    public struct Welcome: WireMessage {
        public static var type: MessageType { .welcome }
        /// The protocol version chosen for this connection: the highest both sides speak.
        public var version: UInt16
        /// The daemon's version text, for logs.
        public var serverVersion: String
        /// The largest whole frame (header included) either side may send.
        public var maxFrameLength: UInt32
        /// The largest item payload or value, in bytes.
        public var maxItemLength: UInt32
        /// The most items, ids or steps in one request.
        public var maxBatch: UInt32
        /// The most requests a client may have sent and not yet seen answered; past it the server stops
        /// reading from the connection until answers have gone out.
        public var maxInFlight: UInt32

        public init(
            version: UInt16, serverVersion: String, maxFrameLength: UInt32, maxItemLength: UInt32,
            maxBatch: UInt32, maxInFlight: UInt32
        ) {
            self.version = version
            self.serverVersion = serverVersion
            self.maxFrameLength = maxFrameLength
            self.maxItemLength = maxItemLength
            self.maxBatch = maxBatch
            self.maxInFlight = maxInFlight
        }

        public init(payload: inout ByteBuffer) throws(WireError) {
            version = try payload.readWire(UInt16.self, "version")
            serverVersion = try payload.readWireText("server version")
            maxFrameLength = try payload.readWire(UInt32.self, "maxFrameLength")
            maxItemLength = try payload.readWire(UInt32.self, "maxItemLength")
            maxBatch = try payload.readWire(UInt32.self, "maxBatch")
            maxInFlight = try payload.readWire(UInt32.self, "maxInFlight")
        }

        public func encode(payload: inout ByteBuffer) throws(WireError) {
            payload.writeInteger(version)
            try payload.writeWireText(serverVersion, "server version")
            payload.writeMultipleIntegers(maxFrameLength, maxItemLength, maxBatch, maxInFlight)
        }
    }

    /// `pong` (0x41): empty. Answers `ping`.
    public typealias Pong = EmptyMessage<Kinds.Pong>

    /// `storeList` (0x42): `list<StoreInfo> stores`, in name byte order. May span frames.
    public typealias StoreList = ListMessage<Kinds.StoreList, StoreInfo>

    /// `engineList` (0x43): `list<EngineInfo> engines`, in search-path order. May span frames.
    public typealias EngineList = ListMessage<Kinds.EngineList, EngineInfo>

    /// `storeInfoResult` (0x44): `StoreInfo info`. Answers `getStoreInfo`.
    public struct StoreInfoResult: WireMessage {
        public static var type: MessageType { .storeInfoResult }
        public var info: StoreInfo

        public init(info: StoreInfo) {
            self.info = info
        }

        public init(payload: inout ByteBuffer) throws(WireError) {
            info = try StoreInfo(wire: &payload)
        }

        public func encode(payload: inout ByteBuffer) throws(WireError) {
            try info.encode(wire: &payload)
        }
    }

    /// `writeResult` (0x45): `u8 committed (0 or 1), u64 epoch, u64 sequence`. Answers every write once the
    /// engine has committed it and memory is updated. `committed` 0: the request changed nothing and took no
    /// sequence (`sequence` is then the current one).
    public struct WriteResult: WireMessage {
        public static var type: MessageType { .writeResult }
        public var committed: Bool
        public var epoch: UInt64
        public var sequence: UInt64

        public init(committed: Bool, epoch: UInt64, sequence: UInt64) {
            self.committed = committed
            self.epoch = epoch
            self.sequence = sequence
        }

        public init(payload: inout ByteBuffer) throws(WireError) {
            committed = try payload.readWireBool("committed")
            epoch = try payload.readWire(UInt64.self, "epoch")
            sequence = try payload.readWire(UInt64.self, "sequence")
        }

        public func encode(payload: inout ByteBuffer) throws(WireError) {
            payload.writeWireBool(committed)
            payload.writeMultipleIntegers(epoch, sequence)
        }
    }

    /// `itemsResult` (0x46): `u64 epoch, u64 sequence, list<ItemSlot> slots`, one slot per requested id, in
    /// request order. May span frames.
    public typealias ItemsResult = SequencedList<Kinds.ItemsResult, ItemSlot>

    /// `rangeResult` (0x47): `u64 epoch, u64 sequence, list<ItemRecord> records`, in store order, all from
    /// the snapshot at `sequence`. May span frames.
    public typealias RangeResult = SequencedList<Kinds.RangeResult, ItemRecord>

    /// `countResult` (0x48): `u64 epoch, u64 sequence, u64 count`.
    public struct CountResult: WireMessage {
        public static var type: MessageType { .countResult }
        public var epoch: UInt64
        public var sequence: UInt64
        public var count: UInt64

        public init(epoch: UInt64, sequence: UInt64, count: UInt64) {
            self.epoch = epoch
            self.sequence = sequence
            self.count = count
        }

        public init(payload: inout ByteBuffer) throws(WireError) {
            epoch = try payload.readWire(UInt64.self, "epoch")
            sequence = try payload.readWire(UInt64.self, "sequence")
            count = try payload.readWire(UInt64.self, "count")
        }

        public func encode(payload: inout ByteBuffer) throws(WireError) {
            payload.writeMultipleIntegers(epoch, sequence, count)
        }
    }

    /// `idList` (0x49): `u64 epoch, u64 sequence, list<ItemID> ids`, in store order. May span frames.
    public typealias IDList = SequencedList<Kinds.IDList, ItemID>

    /// `subscribed` (0x4A): `u32 subscriptionID`. Answers `subscribe`; every push of this subscription
    /// carries the id in its header.
    public typealias Subscribed = SubscriptionMessage<Kinds.Subscribed>

    /// `unsubscribed` (0x4B): `u32 subscriptionID`. Answers `unsubscribe`; no push of it follows.
    public typealias Unsubscribed = SubscriptionMessage<Kinds.Unsubscribed>

    /// `valueResult` (0x4C): `u64 epoch, u64 sequence, ValueState state`. Answers `getValue`; an unset value
    /// ("not found") has state `unset`, and its sequence still counts.
    public typealias ValueResult = ValueStateMessage<Kinds.ValueResult>

    /// `valueList` (0x4D): `list<ValueInfo> values`, in name byte order. Answers `listValues`. May span frames.
    public typealias ValueList = ListMessage<Kinds.ValueList, ValueInfo>

    /// `error` (0x7F): `u16 code, text message`. Answers a request that failed (id = its id), or, with id 0,
    /// reports a protocol error just before the server closes.
    public typealias ErrorResult = CodeMessage<Kinds.Error>

    /// `storeLoaded` (0x80): `u64 epoch, u64 sequence, u64 count, list<ItemRecord> records`: the snapshot a
    /// store subscription starts with, in store order; `count` is the total over all its frames. May span
    /// frames.
    public struct StoreLoaded: SplittableMessage {
        public static var type: MessageType { .storeLoaded }
        public var epoch: UInt64
        public var sequence: UInt64
        public var count: UInt64
        public var elements: [ItemRecord]

        public init(epoch: UInt64, sequence: UInt64, count: UInt64, elements: [ItemRecord]) {
            self.epoch = epoch
            self.sequence = sequence
            self.count = count
            self.elements = elements
        }

        public init(payload: inout ByteBuffer) throws(WireError) {
            epoch = try payload.readWire(UInt64.self, "epoch")
            sequence = try payload.readWire(UInt64.self, "sequence")
            count = try payload.readWire(UInt64.self, "count")
            elements = try payload.readWireList("records")
        }

        public func encodeHead(payload: inout ByteBuffer) throws(WireError) {
            payload.writeMultipleIntegers(epoch, sequence, count)
        }
    }

    /// `storeEvent` (0x81): `u64 epoch, u64 sequence, list<EventStep> steps`: one commit, its steps in
    /// order. May span frames; a step too long for one frame is sent as consecutive steps of the same op.
    public typealias StoreEvent = SequencedList<Kinds.StoreEvent, EventStep>

    /// `valueLoaded` (0x82): `u64 epoch, u64 sequence, ValueState state`: the state a value subscription
    /// starts with (`setWithheld` for a set secure value).
    public typealias ValueLoaded = ValueStateMessage<Kinds.ValueLoaded>

    /// `valueEvent` (0x83): `u64 epoch, u64 sequence, ValueState state`: a set (`set`, or `setWithheld` for
    /// a secure value) or a reset (`unset`).
    public typealias ValueEvent = ValueStateMessage<Kinds.ValueEvent>

    /// `lagged` (0x84): `u64 epoch, u64 sequence` (the last sequence delivered). The subscriber's buffer
    /// overflowed; the subscription has ended. Subscribe again, resuming from `sequence`.
    public typealias Lagged = SequenceNotice<Kinds.Lagged>

    /// `historyGone` (0x85): `u64 epoch, u64 sequence` (the current ones). The resume point is no longer
    /// held (or the epoch changed); a `storeLoaded` snapshot follows on the same subscription.
    public typealias HistoryGone = SequenceNotice<Kinds.HistoryGone>

    /// `dropped` (0x86): `u64 epoch, u64 sequence` (of the store as it was dropped). The subscription goes
    /// on: if the store is created again, its events follow with the new epoch, from sequence 1.
    public typealias Dropped = SequenceNotice<Kinds.Dropped>

    /// `goodbye` (0xBF): `u16 code, text message`, id 0. The server closes the connection after it
    /// (`shuttingDown`, or a limit).
    public typealias Goodbye = CodeMessage<Kinds.Goodbye>
}
