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
    public struct Pong: EmptyMessage {
        public static var type: MessageType { .pong }
        public init() {}
    }

    /// `storeList` (0x42): `list<StoreInfo> stores`, in name byte order. May span frames.
    public struct StoreList: ListMessage {
        public static var type: MessageType { .storeList }
        public var elements: [StoreInfo]

        public init(elements: [StoreInfo]) {
            self.elements = elements
        }
    }

    /// `engineList` (0x43): `list<EngineInfo> engines`, in search-path order. May span frames.
    public struct EngineList: ListMessage {
        public static var type: MessageType { .engineList }
        public var elements: [EngineInfo]

        public init(elements: [EngineInfo]) {
            self.elements = elements
        }
    }

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
    public struct ItemsResult: SequencedListMessage {
        public static var type: MessageType { .itemsResult }
        public var epoch: UInt64
        public var sequence: UInt64
        public var elements: [ItemSlot]

        public init(epoch: UInt64, sequence: UInt64, elements: [ItemSlot]) {
            self.epoch = epoch
            self.sequence = sequence
            self.elements = elements
        }
    }

    /// `rangeResult` (0x47): `u64 epoch, u64 sequence, list<ItemRecord> records`, in store order, all from
    /// the snapshot at `sequence`. May span frames.
    public struct RangeResult: SequencedListMessage {
        public static var type: MessageType { .rangeResult }
        public var epoch: UInt64
        public var sequence: UInt64
        public var elements: [ItemRecord]

        public init(epoch: UInt64, sequence: UInt64, elements: [ItemRecord]) {
            self.epoch = epoch
            self.sequence = sequence
            self.elements = elements
        }
    }

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
    public struct IDList: SequencedListMessage {
        public static var type: MessageType { .idList }
        public var epoch: UInt64
        public var sequence: UInt64
        public var elements: [ItemID]

        public init(epoch: UInt64, sequence: UInt64, elements: [ItemID]) {
            self.epoch = epoch
            self.sequence = sequence
            self.elements = elements
        }
    }

    /// `subscribed` (0x4A): `u32 subscriptionID`. Answers `subscribe`; every push of this subscription
    /// carries the id in its header.
    public struct Subscribed: SubscriptionIDMessage {
        public static var type: MessageType { .subscribed }
        public var subscriptionID: UInt32

        public init(subscriptionID: UInt32) {
            self.subscriptionID = subscriptionID
        }
    }

    /// `unsubscribed` (0x4B): `u32 subscriptionID`. Answers `unsubscribe`; no push of it follows.
    public struct Unsubscribed: SubscriptionIDMessage {
        public static var type: MessageType { .unsubscribed }
        public var subscriptionID: UInt32

        public init(subscriptionID: UInt32) {
            self.subscriptionID = subscriptionID
        }
    }

    /// `valueResult` (0x4C): `u64 epoch, u64 sequence, ValueState state`. Answers `getValue`; an unset value
    /// ("not found") has state `unset`, and its sequence still counts.
    public struct ValueResult: ValueStateMessage {
        public static var type: MessageType { .valueResult }
        public var epoch: UInt64
        public var sequence: UInt64
        public var state: ValueState

        public init(epoch: UInt64, sequence: UInt64, state: ValueState) {
            self.epoch = epoch
            self.sequence = sequence
            self.state = state
        }
    }

    /// `error` (0x7F): `u16 code, text message`. Answers a request that failed (id = its id), or, with id 0,
    /// reports a protocol error just before the server closes.
    public struct ErrorResult: CodeMessage {
        public static var type: MessageType { .error }
        public var code: ErrorCode
        public var message: String

        public init(code: ErrorCode, message: String) {
            self.code = code
            self.message = message
        }
    }

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
    public struct StoreEvent: SequencedListMessage {
        public static var type: MessageType { .storeEvent }
        public var epoch: UInt64
        public var sequence: UInt64
        public var elements: [EventStep]

        public init(epoch: UInt64, sequence: UInt64, elements: [EventStep]) {
            self.epoch = epoch
            self.sequence = sequence
            self.elements = elements
        }

        public static func fragment(_ step: EventStep, maxLength: Int) -> [EventStep] {
            switch step {
            case .insert(let records):
                chunk(records, maxLength: maxLength) { 2 + $0.id.string.utf8.count + 20 + $0.payload.count }
                    .map { .insert(records: $0) }
            case .remove(let ids):
                chunk(ids, maxLength: maxLength) { 2 + $0.string.utf8.count }.map { .remove(ids: $0) }
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

    /// `valueLoaded` (0x82): `u64 epoch, u64 sequence, ValueState state`: the state a value subscription
    /// starts with (`setWithheld` for a set secure value).
    public struct ValueLoaded: ValueStateMessage {
        public static var type: MessageType { .valueLoaded }
        public var epoch: UInt64
        public var sequence: UInt64
        public var state: ValueState

        public init(epoch: UInt64, sequence: UInt64, state: ValueState) {
            self.epoch = epoch
            self.sequence = sequence
            self.state = state
        }
    }

    /// `valueEvent` (0x83): `u64 epoch, u64 sequence, ValueState state`: a set (`set`, or `setWithheld` for
    /// a secure value) or a reset (`unset`).
    public struct ValueEvent: ValueStateMessage {
        public static var type: MessageType { .valueEvent }
        public var epoch: UInt64
        public var sequence: UInt64
        public var state: ValueState

        public init(epoch: UInt64, sequence: UInt64, state: ValueState) {
            self.epoch = epoch
            self.sequence = sequence
            self.state = state
        }
    }

    /// `lagged` (0x84): `u64 epoch, u64 sequence` (the last sequence delivered). The subscriber's buffer
    /// overflowed; the subscription has ended. Subscribe again, resuming from `sequence`.
    public struct Lagged: SequenceMessage {
        public static var type: MessageType { .lagged }
        public var epoch: UInt64
        public var sequence: UInt64

        public init(epoch: UInt64, sequence: UInt64) {
            self.epoch = epoch
            self.sequence = sequence
        }
    }

    /// `historyGone` (0x85): `u64 epoch, u64 sequence` (the current ones). The resume point is no longer
    /// held (or the epoch changed); a `storeLoaded` snapshot follows on the same subscription.
    public struct HistoryGone: SequenceMessage {
        public static var type: MessageType { .historyGone }
        public var epoch: UInt64
        public var sequence: UInt64

        public init(epoch: UInt64, sequence: UInt64) {
            self.epoch = epoch
            self.sequence = sequence
        }
    }

    /// `dropped` (0x86): `u64 epoch, u64 sequence` (of the store as it was dropped). The subscription goes
    /// on: if the store is created again, its events follow with the new epoch, from sequence 1.
    public struct Dropped: SequenceMessage {
        public static var type: MessageType { .dropped }
        public var epoch: UInt64
        public var sequence: UInt64

        public init(epoch: UInt64, sequence: UInt64) {
            self.epoch = epoch
            self.sequence = sequence
        }
    }

    /// `goodbye` (0xBF): `u16 code, text message`, id 0. The server closes the connection after it
    /// (`shuttingDown`, or a limit).
    public struct Goodbye: CodeMessage {
        public static var type: MessageType { .goodbye }
        public var code: ErrorCode
        public var message: String

        public init(code: ErrorCode, message: String) {
            self.code = code
            self.message = message
        }
    }
}
