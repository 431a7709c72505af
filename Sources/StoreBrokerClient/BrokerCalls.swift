@_exported import StoreModel
import Wire

// The broker's requests as typed calls: what applications and storectl use. The protocol's messages stay
// inside the library (`send` is `package`: the package's own tests and benchmarks may still speak it raw).

/// An answer read at a position: everything in it is from the commit at `position`.
public struct Positioned<Value: Sendable>: Sendable {
    public var position: Position
    public var value: Value

    public init(_ position: Position, _ value: Value) {
        self.position = position
        self.value = value
    }
}

/// What the broker announced when the connection opened: its version and the limits every request must keep.
public struct BrokerLimits: Sendable, Hashable {
    /// The protocol version in use on this connection.
    public var protocolVersion: UInt16
    /// The daemon's version text.
    public var serverVersion: String
    /// The largest frame either side may send, header included: a request's items must fit in it.
    public var maxFrameLength: UInt32
    /// The largest item payload or value, in bytes.
    public var maxItemLength: UInt32
    /// The most items, ids or steps in one request.
    public var maxBatch: UInt32
    /// The most requests in flight before the broker stops reading.
    public var maxInFlight: UInt32

    init(_ welcome: ServerMessage.Welcome) {
        protocolVersion = welcome.version
        serverVersion = welcome.serverVersion
        maxFrameLength = welcome.maxFrameLength
        maxItemLength = welcome.maxItemLength
        maxBatch = welcome.maxBatch
        maxInFlight = welcome.maxInFlight
    }
}

extension BrokerConnection {
    /// The broker's limits for this connection.
    public var limits: BrokerLimits { BrokerLimits(welcome) }

    /// Sends `request` and takes what `answer` extracts from the reply; any other reply breaks the protocol.
    private nonisolated(nonsending) func call<Answer>(
        _ request: ClientMessage, _ answer: (ServerMessage) -> Answer?
    ) async throws(StoreBrokerError) -> Answer {
        let reply = try await send(request)
        guard let value = answer(reply) else {
            throw StoreBrokerError(.protocolViolation, "\(request.type.name) was answered with \(reply.type.name)")
        }
        return value
    }

    /// Returns once the broker answered.
    public func ping() async throws(StoreBrokerError) {
        try await call(.ping(.init())) { if case .pong = $0 { () } else { nil } }
    }

    /// Every store this process may read, in name byte order.
    public func stores() async throws(StoreBrokerError) -> [StoreInfo] {
        try await call(.listStores(.init())) { if case .storeList(let m) = $0 { m.elements } else { nil } }
    }

    /// Every value (or, with `.secureValue`, secure value: for the daemon's own user only) ever set, reset ones
    /// included (`isSet` false), in name byte order; for another user only the values it may read.
    public func values(in namespace: Namespace = .value) async throws(StoreBrokerError) -> [ValueInfo] {
        try await call(.listValues(.init(namespace: namespace))) { if case .valueList(let m) = $0 { m.elements } else { nil } }
    }

    /// Every engine file on the daemon's search path, loaded or not.
    public func engines() async throws(StoreBrokerError) -> [EngineInfo] {
        try await call(.listEngines(.init())) { if case .engineList(let m) = $0 { m.elements } else { nil } }
    }

    /// A store's name, engine, position and count (epoch 0, sequence 0, no engine when it does not exist).
    public func storeInfo(_ store: String) async throws(StoreBrokerError) -> StoreInfo {
        try await call(.getStoreInfo(.init(store: store))) { if case .storeInfoResult(let m) = $0 { m.info } else { nil } }
    }

    /// The number of items (0 for a store that does not exist).
    public func count(_ store: String) async throws(StoreBrokerError) -> Positioned<UInt64> {
        try await call(.count(.init(store: store))) {
            if case .countResult(let m) = $0 { Positioned(Position(m), m.count) } else { nil }
        }
    }

    /// Items by id, one slot per id in the order given (a missing id is answered as missing).
    public func items(_ store: String, ids: [ItemID]) async throws(StoreBrokerError) -> Positioned<[ItemSlot]> {
        try await call(.getItems(.init(store: store, ids: ids))) {
            if case .itemsResult(let m) = $0 { Positioned(Position(m), m.elements) } else { nil }
        }
    }

    /// Up to `limit` items (0: all) after the id `after`, in store order, from one snapshot; `cursorGone` when
    /// `after` is no longer in the store.
    public func records(
        _ store: String, after: ItemID? = nil, limit: UInt32 = 0
    ) async throws(StoreBrokerError) -> Positioned<[ItemRecord]> {
        try await call(.queryRange(.init(store: store, after: after, limit: limit))) {
            if case .rangeResult(let m) = $0 { Positioned(Position(m), m.elements) } else { nil }
        }
    }

    /// Up to `limit` ids (0: all) after the id `after`, in store order.
    public func ids(
        _ store: String, after: ItemID? = nil, limit: UInt32 = 0
    ) async throws(StoreBrokerError) -> Positioned<[ItemID]> {
        try await call(.listIDs(.init(store: store, after: after, limit: limit))) {
            if case .idList(let m) = $0 { Positioned(Position(m), m.elements) } else { nil }
        }
    }

    /// Writes `operation` to `store` (created by its first write) as one commit, if `condition` holds
    /// (`conflict` otherwise). Returns once the broker committed it.
    public func write(
        _ store: String, _ operation: WriteOperation, condition: Condition = .unconditional
    ) async throws(StoreBrokerError) -> CommitResult {
        try await call(.write(store: store, operation, condition: condition), Self.commitResult)
    }

    /// `write(_:_:condition:)` of `steps` (one step is that step's own request, several a chain) by the mirror
    /// this connection's subscription `subscriptionID` to `store` feeds: the commit's event is not pushed on that
    /// subscription (`quietChain`), so its owner applies the write itself, when `seen` is told of the answer (on
    /// the event loop, in order with the subscription's pushes; told of a failure too, once). Throws what
    /// `isQuietChainRefusal` recognizes when the broker does not know `quietChain` (it is then not tried again on
    /// this connection) or the write fits a frame only without its 4 more bytes: send the plain write then.
    @usableFromInline
    package nonisolated(nonsending) func write(
        _ store: String, _ steps: [ChainStep], condition: Condition, quietFor subscriptionID: UInt32,
        seen: @escaping @Sendable (Result<CommitResult, StoreBrokerError>) -> Void
    ) async throws(StoreBrokerError) -> CommitResult {
        let request = ClientMessage.quietChain(
            .init(subscriptionID: subscriptionID, store: store, condition: condition, elements: steps))
        let reply: ServerMessage
        do throws(StoreBrokerError) {
            reply = try await send(request) { outcome in seen(outcome.flatMap(Self.commitOutcome)) }
        } catch {
            if error.kind == .refused, error.code == .unknownMessageType { refuseQuietChain() }
            throw error
        }
        return try Self.commitOutcome(reply).get()
    }

    /// Whether a write was refused for being a `quietChain` (see `write(_:_:condition:quietFor:seen:)`), and goes
    /// plain instead.
    @usableFromInline
    package static func isQuietChainRefusal(_ error: StoreBrokerError) -> Bool {
        (error.kind == .refused && error.code == .unknownMessageType)
            || (error.kind == .protocolViolation && error.code == .frameTooLarge)
    }

    private static func commitOutcome(_ reply: ServerMessage) -> Result<CommitResult, StoreBrokerError> {
        commitResult(reply).map(Result.success)
            ?? .failure(StoreBrokerError(.protocolViolation, "a write was answered with \(reply.type.name)"))
    }

    /// Several writes to `store` sent back to back (pipelined, committed in this order); their outcomes in the
    /// same order. One failing does not stop the others.
    public func write(
        _ store: String, pipelined writes: [(WriteOperation, Condition)]
    ) async throws(StoreBrokerError) -> [Result<CommitResult, StoreBrokerError>] {
        let requests = writes.map { ClientMessage.write(store: store, $0.0, condition: $0.1) }
        return try await send(requests).map { $0.flatMap(Self.commitOutcome) }
    }

    /// Deletes a store and its data (`committed` false when it did not exist).
    public func drop(_ store: String, condition: Condition = .unconditional) async throws(StoreBrokerError) -> CommitResult {
        try await call(.drop(.init(store: store, condition: condition)), Self.commitResult)
    }

    /// A value's state (`.value`) or a secure value's (`.secureValue`, readable only by the daemon's user).
    public func value(_ name: String, in namespace: Namespace = .value) async throws(StoreBrokerError) -> Positioned<ValueState> {
        try await call(.getValue(.init(namespace: namespace, name: name))) {
            if case .valueResult(let m) = $0 { Positioned(Position(m), m.state) } else { nil }
        }
    }

    /// Sets a value, or resets it when `value` is nil, if `condition` holds.
    public func setValue(
        _ name: String, in namespace: Namespace = .value, to value: Payload?, condition: Condition = .unconditional
    ) async throws(StoreBrokerError) -> CommitResult {
        try await call(.setValue(namespace: namespace, name: name, value: value, condition: condition), Self.commitResult)
    }

    private static func commitResult(_ reply: ServerMessage) -> CommitResult? {
        if case .writeResult(let m) = reply { CommitResult(m) } else { nil }
    }
}

extension BrokerConnection {
    /// Inserts `items` in order, in as many commits as the broker's limits require (its `maxBatch` and frame
    /// size), up to `window` of them in flight at once. Only the first commit carries `condition`. `progress`
    /// is told how many items are committed after each window. Returns the last commit's result (nil when
    /// nothing changed). Stops at the first failure; the commits before it stay.
    public func insertInBatches(
        _ store: String, _ items: [Item], condition: Condition = .unconditional, window: Int = 8,
        progress: (Int) -> Void = { _ in }
    ) async throws(StoreBrokerError) -> CommitResult? {
        var iterator = items.makeIterator()
        return try await insertInBatches(store, condition: condition, window: window, progress: progress) { iterator.next() }
    }

    /// Inserts the items `next` produces until it returns nil, as `insertInBatches(_:_:...)` does, holding only
    /// what is in flight: at most `window` requests or 4 MiB of items, whichever comes first (an import of a
    /// file larger than memory, say). When `next` throws, nothing of the batch being gathered is sent; the
    /// commits before it stay.
    public func insertInBatches(
        _ store: String, condition: Condition = .unconditional, window: Int = 8, progress: (Int) -> Void = { _ in },
        from next: () throws(StoreBrokerError) -> Item?
    ) async throws(StoreBrokerError) -> CommitResult? {
        let inFlight = 4 << 20
        // A request is at most half of what may be in flight, so that large items still go two or more at a time.
        let budget = min(Int(limits.maxFrameLength) - 1024, inFlight / 2)
        var last: CommitResult?
        var done = 0
        var firstCondition: Condition? = condition
        var ready: [[Item]] = []
        var readyBytes = 0
        var current: [Item] = []
        var size = 0
        func send(_ batches: [[Item]]) async throws(StoreBrokerError) {
            guard !batches.isEmpty else { return }
            let writes = batches.map { batch -> (WriteOperation, Condition) in
                defer { firstCondition = nil }
                return (.insert(batch), firstCondition ?? .unconditional)
            }
            for (batch, outcome) in zip(batches, try await write(store, pipelined: writes)) {
                let result = try outcome.get()
                if result.committed { last = result }
                done += batch.count
            }
            progress(done)
        }
        while let item = try next() {
            let length = item.id.utf8Count + item.payload.count + 8
            if !current.isEmpty, current.count >= Int(limits.maxBatch) || size + length > budget {
                ready.append(current)
                readyBytes += size
                current = []
                size = 0
                if ready.count >= max(1, window) || readyBytes >= inFlight {
                    try await send(ready)
                    ready = []
                    readyBytes = 0
                }
            }
            current.append(item)
            size += length
        }
        if !current.isEmpty { ready.append(current) }
        try await send(ready)
        return last
    }
}
