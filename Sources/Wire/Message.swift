import NIOCore

/// Every message a client sends.
public enum ClientMessage: Hashable, Sendable {
    case hello(Hello)  // 0x01
    case ping(Ping)  // 0x10
    case listStores(ListStores)  // 0x11
    case listEngines(ListEngines)  // 0x12
    case getStoreInfo(GetStoreInfo)  // 0x13
    case insert(Insert)  // 0x14
    case remove(Remove)  // 0x15
    case removeAll(RemoveAll)  // 0x16
    case drop(Drop)  // 0x17
    case chain(Chain)  // 0x18
    case getItems(GetItems)  // 0x19
    case queryRange(QueryRange)  // 0x1A
    case count(Count)  // 0x1B
    case listIDs(ListIDs)  // 0x1C
    case subscribe(Subscribe)  // 0x1D
    case unsubscribe(Unsubscribe)  // 0x1E
    case getValue(GetValue)  // 0x20
    case setValue(SetValue)  // 0x21
    case resetValue(ResetValue)  // 0x22
    case listValues(ListValues)  // 0x23
    case quietChain(QuietChain)  // 0x24

    /// The payload, as its own type.
    public var body: any WireMessage {
        switch self {
        case .hello(let m): m
        case .ping(let m): m
        case .listStores(let m): m
        case .listEngines(let m): m
        case .getStoreInfo(let m): m
        case .insert(let m): m
        case .remove(let m): m
        case .removeAll(let m): m
        case .drop(let m): m
        case .chain(let m): m
        case .getItems(let m): m
        case .queryRange(let m): m
        case .count(let m): m
        case .listIDs(let m): m
        case .subscribe(let m): m
        case .unsubscribe(let m): m
        case .getValue(let m): m
        case .setValue(let m): m
        case .resetValue(let m): m
        case .listValues(let m): m
        case .quietChain(let m): m
        }
    }

    /// Its type, without boxing the message into `body`'s existential (an allocation for most messages).
    public var type: MessageType {
        switch self {
        case .hello: .hello
        case .ping: .ping
        case .listStores: .listStores
        case .listEngines: .listEngines
        case .getStoreInfo: .getStoreInfo
        case .insert: .insert
        case .remove: .remove
        case .removeAll: .removeAll
        case .drop: .drop
        case .chain: .chain
        case .getItems: .getItems
        case .queryRange: .queryRange
        case .count: .count
        case .listIDs: .listIDs
        case .subscribe: .subscribe
        case .unsubscribe: .unsubscribe
        case .getValue: .getValue
        case .setValue: .setValue
        case .resetValue: .resetValue
        case .listValues: .listValues
        case .quietChain: .quietChain
        }
    }

    /// Decodes one frame sent by a client. Throws `unknownMessageType`, `unexpectedMessage` (a server type),
    /// `invalidFlags` (requests never span frames) or `malformed`.
    ///
    /// The frame is consumed: its payload is read in place, not copied (a copy is a reference count taken and
    /// dropped per request).
    public init(frame: consuming Frame) throws(WireError) {
        let type = try MessageType.checked(frame.header, fromClient: true)
        var payload = frame.takePayload()
        switch type {
        case .hello: self = .hello(try Hello(payload: &payload))
        case .ping: self = .ping(try Ping(payload: &payload))
        case .listStores: self = .listStores(try ListStores(payload: &payload))
        case .listEngines: self = .listEngines(try ListEngines(payload: &payload))
        case .getStoreInfo: self = .getStoreInfo(try GetStoreInfo(payload: &payload))
        case .insert: self = .insert(try Insert(payload: &payload))
        case .remove: self = .remove(try Remove(payload: &payload))
        case .removeAll: self = .removeAll(try RemoveAll(payload: &payload))
        case .drop: self = .drop(try Drop(payload: &payload))
        case .chain: self = .chain(try Chain(payload: &payload))
        case .getItems: self = .getItems(try GetItems(payload: &payload))
        case .queryRange: self = .queryRange(try QueryRange(payload: &payload))
        case .count: self = .count(try Count(payload: &payload))
        case .listIDs: self = .listIDs(try ListIDs(payload: &payload))
        case .subscribe: self = .subscribe(try Subscribe(payload: &payload))
        case .unsubscribe: self = .unsubscribe(try Unsubscribe(payload: &payload))
        case .getValue: self = .getValue(try GetValue(payload: &payload))
        case .setValue: self = .setValue(try SetValue(payload: &payload))
        case .resetValue: self = .resetValue(try ResetValue(payload: &payload))
        case .listValues: self = .listValues(try ListValues(payload: &payload))
        case .quietChain: self = .quietChain(try QuietChain(payload: &payload))
        default: throw WireError(.unexpectedMessage, "\(type.name) is a server message")
        }
        try requireFullyConsumed(payload, type)
    }

    /// Writes the message as one frame with request id `id`. A request never spans frames: one that does not
    /// fit in `maxFrameLength` throws `frameTooLarge` and writes nothing.
    ///
    /// Each case calls its own type's encoder: no message is boxed into `body`'s existential (an allocation and
    /// a copy per request) and no encoder is reached through a witness table.
    public func encode(
        id: UInt32, maxFrameLength: Int = WireProtocol.defaultMaxFrameLength, into out: inout ByteBuffer
    ) throws(WireError) {
        func one<M: WireMessage>(_ message: M) throws(WireError) {
            try message.encodeFrame(id: id, maxFrameLength: maxFrameLength, into: &out)
        }
        switch self {
        case .hello(let m): try one(m)
        case .ping(let m): try one(m)
        case .listStores(let m): try one(m)
        case .listEngines(let m): try one(m)
        case .getStoreInfo(let m): try one(m)
        case .insert(let m): try one(m)
        case .remove(let m): try one(m)
        case .removeAll(let m): try one(m)
        case .drop(let m): try one(m)
        case .chain(let m): try one(m)
        case .getItems(let m): try one(m)
        case .queryRange(let m): try one(m)
        case .count(let m): try one(m)
        case .listIDs(let m): try one(m)
        case .subscribe(let m): try one(m)
        case .unsubscribe(let m): try one(m)
        case .getValue(let m): try one(m)
        case .setValue(let m): try one(m)
        case .resetValue(let m): try one(m)
        case .listValues(let m): try one(m)
        case .quietChain(let m): try one(m)
        }
    }
}

/// Every message a server sends: answers and pushes.
public enum ServerMessage: Hashable, Sendable {
    case welcome(Welcome)  // 0x40
    case pong(Pong)  // 0x41
    case storeList(StoreList)  // 0x42
    case engineList(EngineList)  // 0x43
    case storeInfoResult(StoreInfoResult)  // 0x44
    case writeResult(WriteResult)  // 0x45
    case itemsResult(ItemsResult)  // 0x46
    case rangeResult(RangeResult)  // 0x47
    case countResult(CountResult)  // 0x48
    case idList(IDList)  // 0x49
    case subscribed(Subscribed)  // 0x4A
    case unsubscribed(Unsubscribed)  // 0x4B
    case valueResult(ValueResult)  // 0x4C
    case valueList(ValueList)  // 0x4D
    case error(ErrorResult)  // 0x7F
    case storeLoaded(StoreLoaded)  // 0x80
    case storeEvent(StoreEvent)  // 0x81
    case valueLoaded(ValueLoaded)  // 0x82
    case valueEvent(ValueEvent)  // 0x83
    case lagged(Lagged)  // 0x84
    case historyGone(HistoryGone)  // 0x85
    case dropped(Dropped)  // 0x86
    case goodbye(Goodbye)  // 0xBF

    /// The payload, as its own type.
    public var body: any WireMessage {
        switch self {
        case .welcome(let m): m
        case .pong(let m): m
        case .storeList(let m): m
        case .engineList(let m): m
        case .storeInfoResult(let m): m
        case .writeResult(let m): m
        case .itemsResult(let m): m
        case .rangeResult(let m): m
        case .countResult(let m): m
        case .idList(let m): m
        case .subscribed(let m): m
        case .unsubscribed(let m): m
        case .valueResult(let m): m
        case .valueList(let m): m
        case .error(let m): m
        case .storeLoaded(let m): m
        case .storeEvent(let m): m
        case .valueLoaded(let m): m
        case .valueEvent(let m): m
        case .lagged(let m): m
        case .historyGone(let m): m
        case .dropped(let m): m
        case .goodbye(let m): m
        }
    }

    /// Its type, without boxing the message into `body`'s existential (an allocation for most messages).
    public var type: MessageType {
        switch self {
        case .welcome: .welcome
        case .pong: .pong
        case .storeList: .storeList
        case .engineList: .engineList
        case .storeInfoResult: .storeInfoResult
        case .writeResult: .writeResult
        case .itemsResult: .itemsResult
        case .rangeResult: .rangeResult
        case .countResult: .countResult
        case .idList: .idList
        case .subscribed: .subscribed
        case .unsubscribed: .unsubscribed
        case .valueResult: .valueResult
        case .valueList: .valueList
        case .error: .error
        case .storeLoaded: .storeLoaded
        case .storeEvent: .storeEvent
        case .valueLoaded: .valueLoaded
        case .valueEvent: .valueEvent
        case .lagged: .lagged
        case .historyGone: .historyGone
        case .dropped: .dropped
        case .goodbye: .goodbye
        }
    }

    /// Decodes one frame sent by a server. For a message that spans frames this is one part of it; see
    /// `ServerMessageAssembler`.
    public init(frame: consuming Frame) throws(WireError) {
        let type = try MessageType.checked(frame.header, fromClient: false)
        var payload = frame.takePayload()
        switch type {
        case .welcome: self = .welcome(try Welcome(payload: &payload))
        case .pong: self = .pong(try Pong(payload: &payload))
        case .storeList: self = .storeList(try StoreList(payload: &payload))
        case .engineList: self = .engineList(try EngineList(payload: &payload))
        case .storeInfoResult: self = .storeInfoResult(try StoreInfoResult(payload: &payload))
        case .writeResult: self = .writeResult(try WriteResult(payload: &payload))
        case .itemsResult: self = .itemsResult(try ItemsResult(payload: &payload))
        case .rangeResult: self = .rangeResult(try RangeResult(payload: &payload))
        case .countResult: self = .countResult(try CountResult(payload: &payload))
        case .idList: self = .idList(try IDList(payload: &payload))
        case .subscribed: self = .subscribed(try Subscribed(payload: &payload))
        case .unsubscribed: self = .unsubscribed(try Unsubscribed(payload: &payload))
        case .valueResult: self = .valueResult(try ValueResult(payload: &payload))
        case .valueList: self = .valueList(try ValueList(payload: &payload))
        case .error: self = .error(try ErrorResult(payload: &payload))
        case .storeLoaded: self = .storeLoaded(try StoreLoaded(payload: &payload))
        case .storeEvent: self = .storeEvent(try StoreEvent(payload: &payload))
        case .valueLoaded: self = .valueLoaded(try ValueLoaded(payload: &payload))
        case .valueEvent: self = .valueEvent(try ValueEvent(payload: &payload))
        case .lagged: self = .lagged(try Lagged(payload: &payload))
        case .historyGone: self = .historyGone(try HistoryGone(payload: &payload))
        case .dropped: self = .dropped(try Dropped(payload: &payload))
        case .goodbye: self = .goodbye(try Goodbye(payload: &payload))
        default: throw WireError(.unexpectedMessage, "\(type.name) is a client message")
        }
        try requireFullyConsumed(payload, type)
    }

    /// Writes the message with id `id` (request id, or subscription id for a push) as one frame, or as
    /// several of at most `maxFrameLength` bytes each if its type allows it and it needs them.
    ///
    /// Every answer and push goes through here: each case calls its own type's encoder, so no message is boxed
    /// into an existential and no conformance is looked up at run time, as a `body as? any SplittableMessage`
    /// cast per answer would.
    public func encode(id: UInt32, maxFrameLength: Int, into out: inout ByteBuffer) throws(WireError) {
        func one<M: WireMessage>(_ message: M) throws(WireError) {
            try message.encodeFrame(id: id, maxFrameLength: maxFrameLength, into: &out)
        }
        func split<M: SplittableMessage>(_ message: M) throws(WireError) {
            try message.encodeFrames(id: id, maxFrameLength: maxFrameLength, into: &out)
        }
        switch self {
        case .welcome(let m): try one(m)
        case .pong(let m): try one(m)
        case .storeList(let m): try split(m)
        case .engineList(let m): try split(m)
        case .storeInfoResult(let m): try one(m)
        case .writeResult(let m): try one(m)
        case .itemsResult(let m): try split(m)
        case .rangeResult(let m): try split(m)
        case .countResult(let m): try one(m)
        case .idList(let m): try split(m)
        case .subscribed(let m): try one(m)
        case .unsubscribed(let m): try one(m)
        case .valueResult(let m): try one(m)
        case .valueList(let m): try split(m)
        case .error(let m): try one(m)
        case .storeLoaded(let m): try split(m)
        case .storeEvent(let m): try split(m)
        case .valueLoaded(let m): try one(m)
        case .valueEvent(let m): try one(m)
        case .lagged(let m): try one(m)
        case .historyGone(let m): try one(m)
        case .dropped(let m): try one(m)
        case .goodbye(let m): try one(m)
        }
    }

    /// Appends the next frame's part of a message that spans frames.
    mutating func appendContinuation(_ next: ServerMessage) throws(WireError) {
        switch (self, next) {
        case (.storeList(var m), .storeList(let n)): try m.appendContinuation(n); self = .storeList(m)
        case (.engineList(var m), .engineList(let n)): try m.appendContinuation(n); self = .engineList(m)
        case (.itemsResult(var m), .itemsResult(let n)): try m.appendContinuation(n); self = .itemsResult(m)
        case (.rangeResult(var m), .rangeResult(let n)): try m.appendContinuation(n); self = .rangeResult(m)
        case (.idList(var m), .idList(let n)): try m.appendContinuation(n); self = .idList(m)
        case (.valueList(var m), .valueList(let n)): try m.appendContinuation(n); self = .valueList(m)
        case (.storeLoaded(var m), .storeLoaded(let n)): try m.appendContinuation(n); self = .storeLoaded(m)
        case (.storeEvent(var m), .storeEvent(let n)): try m.appendContinuation(n); self = .storeEvent(m)
        default:
            throw WireError(
                .unexpectedMessage, "a \(next.type.name) frame arrived while a \(type.name) message was unfinished")
        }
    }
}

extension MessageType {
    /// The header's type, checked against the sender's direction and the `more` flag.
    static func checked(_ header: FrameHeader, fromClient: Bool) throws(WireError) -> MessageType {
        guard let type = MessageType(rawValue: header.type) else {
            throw WireError(.unknownMessageType, "unknown message type 0x\(String(header.type, radix: 16))")
        }
        guard FrameFlags.defined.isSuperset(of: header.flags) else {
            throw WireError(.invalidFlags, "undefined flag bits 0x\(String(header.flags.rawValue, radix: 16))")
        }
        if header.flags.contains(.more), fromClient || !type.allowsContinuation {
            throw WireError(.invalidFlags, "a \(type.name) message cannot span frames")
        }
        return type
    }
}

/// Joins the frames of server messages that span several frames.
///
/// Frames of one message come in order and share the type and id; frames of other messages (another
/// request's answer, another subscription's push) may come between them. Feed every frame in arrival order;
/// a whole message comes out when its last frame (the one without `more`) arrives.
public struct ServerMessageAssembler: Sendable {
    private struct Key: Hashable {
        var isPush: Bool
        var id: UInt32
    }

    private var pending: [Key: (message: ServerMessage, bytes: Int)] = [:]
    /// The most payload bytes one message may gather across its frames; past it the server is not trusted.
    public let maxMessageLength: Int

    public init(maxMessageLength: Int = 1 << 30) {
        self.maxMessageLength = maxMessageLength
    }

    /// Whether some message is waiting for more frames.
    public var isIdle: Bool { pending.isEmpty }

    /// Decodes `frame`; returns the message if it is complete, `nil` if more frames of it are to come.
    public mutating func receive(_ frame: Frame) throws(WireError) -> ServerMessage? {
        let message = try ServerMessage(frame: frame)
        let key = Key(isPush: message.type.isPush, id: frame.header.id)
        let more = frame.header.flags.contains(.more)
        if !more, pending.isEmpty { return message }  // a whole message, nothing gathering: no key to hash
        guard var (whole, bytes) = pending.removeValue(forKey: key) else {
            if more { pending[key] = (message, frame.payload.readableBytes) }
            return more ? nil : message
        }
        bytes += frame.payload.readableBytes
        guard bytes <= maxMessageLength else {
            throw WireError(
                .frameTooLarge, "a \(message.type.name) spanning frames grew past \(maxMessageLength) bytes")
        }
        try whole.appendContinuation(message)
        if more {
            pending[key] = (whole, bytes)
            return nil
        }
        return whole
    }
}
