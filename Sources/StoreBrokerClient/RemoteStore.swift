import Foundation
import Locking
import NIOCore
import OrderedStorage
import StoreModel

/// What happened to a `RemoteStore`'s items (Boutique's `StoreEvent`).
public struct StoreEvent<Item: Sendable>: Sendable {
    public enum Operation: Hashable, Sendable {
        /// The stream started; nothing is loaded yet (`items` is empty).
        case initialized
        /// The items as loaded (first load, or a fresh snapshot after the broker lost this client's history).
        case loaded
        /// Items inserted or replaced.
        case insert
        /// Items removed (a `removeAll` removes every item; a dropped store removes what it held).
        case remove
    }

    public var operation: Operation
    public var items: [Item]
    /// The broker's sequence of the commit (0 for `initialized`).
    public var sequence: UInt64
}

/// A store of the broker as a Boutique-like `Store`, shared by every process that opens it.
///
/// `items` is a local mirror kept current by a subscription; writes go to the broker, which is their only
/// writer, and return once the mirror has caught up with them, so a process reads its own writes. Items are
/// JSON (`JSONEncoder`); `cacheIdentifier` gives each its id.
///
/// ```swift
/// let notes = RemoteStore<Note>(client: client, name: "notes")
/// try await notes.insert(Note(id: "1", text: "milk"))
/// try await notes.removeAll().insert(fresh).run()     // one atomic commit
/// for await event in notes.events { ... }
/// ```
public final class RemoteStore<Item: Codable & Sendable>: Sendable {
    public let name: String
    public let client: BrokerClient
    private let identifier: @Sendable (Item) -> String
    private let state: Locked<Mirror>
    private let follower = Locked<Task<Void, Never>?>(nil)

    private struct Mirror: MirrorState, @unchecked Sendable {  // OrderedTable of Sendable items, under the lock
        var items = OrderedTable<String, Item>()
        var phase: LoadState<Void> = .idle
        var epoch: UInt64 = 0
        var sequence: UInt64 = 0
        var loadWaiters: [CheckedContinuation<Void, any Error>] = []
        var sequenceWaiters = SequenceWaiters()
        var streams: [UUID: AsyncStream<StoreEvent<Item>>.Continuation] = [:]
    }

    /// A store whose items are identified by `cacheIdentifier`. Starts following the broker at once.
    public init(client: BrokerClient, name: String, cacheIdentifier: KeyPath<Item, String> & Sendable) {
        self.client = client
        self.name = name
        self.identifier = { $0[keyPath: cacheIdentifier] }
        self.state = Locked(Mirror())
        start()
    }

    deinit {
        follower.withLock { $0?.cancel() }
    }

    /// Stops following the broker; `items` keeps its last state.
    public func close() {
        follower.withLock { $0?.cancel() }
    }

    // MARK: Reading

    /// The items, in the store's order, as of the last event received.
    public var items: [Item] {
        state.withLock { mirror in
            var out: [Item] = []
            out.reserveCapacity(mirror.items.count)
            mirror.items.forEach { _, item in
                out.append(item)
                return true
            }
            return out
        }
    }

    /// Idle, loading, loaded (the items), or the error that stopped the mirror.
    public var loadState: LoadState<[Item]> {
        switch state.withLock({ $0.phase }) {
        case .idle: .idle
        case .loading: .loading
        case .value: .value(items)
        case .error(let error): .error(error)
        }
    }

    /// Returns once the first snapshot is loaded; throws what stopped the mirror (an undecodable item, say).
    public func itemsHaveLoaded() async throws { try await state.waitUntilLoaded() }

    /// Every change from now on: `initialized`, then `loaded` (at once if already loaded), then one event per
    /// step of each commit. A stream ends when the store is closed.
    public var events: AsyncStream<StoreEvent<Item>> {
        let (stream, continuation) = AsyncStream.makeStream(of: StoreEvent<Item>.self)
        let key = UUID()
        continuation.yield(StoreEvent(operation: .initialized, items: [], sequence: 0))
        state.withLock { mirror in
            if mirror.isLoaded {
                continuation.yield(StoreEvent(operation: .loaded, items: Self.all(mirror.items), sequence: mirror.sequence))
            }
            mirror.streams[key] = continuation
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.streams.removeValue(forKey: key) }
        }
        return stream
    }

    private static func all(_ table: OrderedTable<String, Item>) -> [Item] {
        var out: [Item] = []
        table.forEach { _, item in
            out.append(item)
            return true
        }
        return out
    }

    // MARK: Following the broker

    private func start() {
        let follower = SubscriptionFollower(client: client, namespace: .store, name: name)
        // Weak all the way: the follower must not keep the store alive (deinit cancels it).
        let task = Task { [weak self] in
            self?.state.withLock { $0.phase = .loading }
            let failure = await follower.run(
                resumePoint: { [weak self] in self?.resumePoint() ?? .snapshot },
                handle: { [weak self] push in try self?.apply(push) })
            if let failure { self?.state.stop(with: failure) }
        }
        self.follower.withLock { $0 = task }
    }

    private func resumePoint() -> SubscriptionStart {
        state.withLock { mirror in mirror.isLoaded ? .resume(epoch: mirror.epoch, sequence: mirror.sequence) : .snapshot }
    }

    private func decode(_ record: ItemRecord) throws -> Item {
        do {
            return try JSONDecoder().decode(Item.self, from: Data(record.payload.bytes.readableBytesView))
        } catch {
            throw StoreBrokerError(
                .cannotDecode, "item \(record.id.string.debugDescription) of store \(name) cannot be decoded: \(error)",
                underlying: error)
        }
    }

    private func apply(_ push: Push) throws {
        var events: [StoreEvent<Item>] = []
        var released: [CheckedContinuation<Void, Never>] = []
        var loaded: [CheckedContinuation<Void, any Error>] = []
        var streams: [AsyncStream<StoreEvent<Item>>.Continuation] = []
        switch push {
        case .storeLoaded(let at, let records):
            var table = OrderedTable<String, Item>()
            for record in records { table.put(record.id.string, try decode(record)) }
            let items = Self.all(table)
            state.withLock { mirror in
                mirror.items = table
                mirror.epoch = at.epoch
                mirror.sequence = at.sequence
                mirror.phase = .value(())
                loaded = mirror.loadWaiters
                mirror.loadWaiters = []
                released = mirror.sequenceWaiters.advance(to: mirror.position)
                streams = Array(mirror.streams.values)
            }
            events = [StoreEvent(operation: .loaded, items: items, sequence: at.sequence)]
        case .storeEvent(let event):
            var decoded: [(EventStep, [Item])] = []
            for step in event.steps {
                if case .insert(let records) = step { decoded.append((step, try records.map(decode))) } else { decoded.append((step, [])) }
            }
            state.withLock { mirror in
                for (step, items) in decoded {
                    switch step {
                    case .insert(let records):
                        for (record, item) in zip(records, items) { mirror.items.put(record.id.string, item) }
                        events.append(StoreEvent(operation: .insert, items: items, sequence: event.sequence))
                    case .remove(let ids):
                        let removed = ids.compactMap { mirror.items.remove($0.string) }
                        events.append(StoreEvent(operation: .remove, items: removed, sequence: event.sequence))
                    }
                }
                mirror.epoch = event.epoch
                mirror.sequence = event.sequence
                released = mirror.sequenceWaiters.advance(to: mirror.position)
                streams = Array(mirror.streams.values)
            }
        case .dropped:
            state.withLock { mirror in
                let removed = Self.all(mirror.items)
                mirror.items = OrderedTable()
                mirror.epoch = 0
                mirror.sequence = 0
                released = mirror.sequenceWaiters.advance(to: mirror.position)
                streams = Array(mirror.streams.values)
                events = [StoreEvent(operation: .remove, items: removed, sequence: 0)]
            }
        default:
            break  // historyGone (a snapshot follows), lagged (the follower subscribes again)
        }
        for continuation in streams {
            for event in events { continuation.yield(event) }
        }
        for waiter in loaded { waiter.resume() }
        for waiter in released { waiter.resume() }
    }

    // MARK: Writing

    private func payload(_ item: Item) throws -> StoreModel.Item {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return StoreModel.Item(id: ItemID(identifier(item)), payload: Payload(ByteBuffer(bytes: try encoder.encode(item))))
    }

    /// Sends a write; returns once the mirror has the commit (or the mirror stopped).
    fileprivate func write(_ steps: [ChainStep], condition: Condition = .unconditional) async throws {
        let operation: WriteOperation
        switch steps.count {
        case 0: return
        case 1:
            switch steps[0] {
            case .insert(let items): operation = .insert(items)
            case .remove(let ids): operation = .remove(ids)
            case .removeAll: operation = .removeAll
            }
        default: operation = .chain(steps)
        }
        let result = try await client.connection().write(name, operation, condition: condition)
        guard result.committed else { return }
        await state.waitUntilReached(epoch: result.epoch, sequence: result.sequence)
    }

    /// Inserts an item, or replaces the one with its id in place.
    public func insert(_ item: Item) async throws { try await write([.insert(items: [try payload(item)])]) }

    /// Inserts items in one commit (the first occurrence of an id fixes its position, the last one wins).
    public func insert(_ items: [Item]) async throws {
        guard !items.isEmpty else { return }
        try await write([.insert(items: try items.map(payload))])
    }

    public func remove(_ item: Item) async throws { try await remove(id: identifier(item)) }

    public func remove(_ items: [Item]) async throws { try await remove(ids: items.map(identifier)) }

    public func remove(id: String) async throws { try await remove(ids: [id]) }

    public func remove(ids: [String]) async throws {
        guard !ids.isEmpty else { return }
        try await write([.remove(ids: ids.map { ItemID($0) })])
    }

    public func removeAll() async throws { try await write([.removeAll]) }

    // MARK: Chains

    /// Steps committed together by `run()`: one atomic commit, never seen half done by anyone.
    public struct Operation: Sendable {
        fileprivate let store: RemoteStore
        fileprivate var steps: [ChainStep] = []

        public func insert(_ item: Item) throws -> Operation { try insert([item]) }

        public func insert(_ items: [Item]) throws -> Operation {
            var next = self
            next.steps.append(.insert(items: try items.map(store.payload)))
            return next
        }

        public func remove(_ item: Item) -> Operation { remove(ids: [store.identifier(item)]) }
        public func remove(_ items: [Item]) -> Operation { remove(ids: items.map(store.identifier)) }
        public func remove(id: String) -> Operation { remove(ids: [id]) }

        public func remove(ids: [String]) -> Operation {
            var next = self
            next.steps.append(.remove(ids: ids.map { ItemID($0) }))
            return next
        }

        public func removeAll() -> Operation {
            var next = self
            next.steps.append(.removeAll)
            return next
        }

        /// Commits every step at once. Nothing happens until it is called.
        public func run() async throws { try await store.write(steps) }
    }

    // The start of a chain: `try await store.removeAll().insert(items).run()`. These share their names with the
    // methods that write at once; they are disfavored, so `try await store.insert(item)` always writes, and a
    // chain is only what is followed by another step or `run()`.
    @_disfavoredOverload public func removeAll() -> Operation { Operation(store: self).removeAll() }
    @_disfavoredOverload public func insert(_ item: Item) throws -> Operation { try Operation(store: self).insert(item) }
    @_disfavoredOverload public func insert(_ items: [Item]) throws -> Operation { try Operation(store: self).insert(items) }
    @_disfavoredOverload public func remove(_ item: Item) -> Operation { Operation(store: self).remove(item) }
    @_disfavoredOverload public func remove(_ items: [Item]) -> Operation { Operation(store: self).remove(items) }
    @_disfavoredOverload public func remove(id: String) -> Operation { Operation(store: self).remove(id: id) }
    @_disfavoredOverload public func remove(ids: [String]) -> Operation { Operation(store: self).remove(ids: ids) }
}

extension RemoteStore where Item: Identifiable, Item.ID == String {
    /// A store of `Identifiable` items with `String` ids.
    public convenience init(client: BrokerClient, name: String) {
        self.init(client: client, name: name, cacheIdentifier: \Item.id)
    }
}

extension RemoteStore where Item: Identifiable, Item.ID == UUID {
    /// A store of `Identifiable` items with `UUID` ids (stored as their `uuidString`).
    public convenience init(client: BrokerClient, name: String) {
        self.init(client: client, name: name, cacheIdentifier: \Item.id.uuidString)
    }
}
