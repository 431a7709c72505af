import Foundation
import Locking
import NIOCore
import Observation
import OrderedStorage
import StoreModel

/// What happened to a `RemoteStore`'s items (Boutique's `StoreEvent`, with the same four operations: a
/// Boutique-style exhaustive `switch` over `operation` compiles).
public struct StoreEvent<Item: Sendable>: Sendable {
    public enum Operation: Hashable, Sendable {
        /// The stream started; nothing is loaded yet (`items` is empty).
        case initialized
        /// The items as loaded: the first load, after the broker lost this client's history, or after this
        /// stream's reader fell behind (`afterLag`).
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
    /// This `loaded` replaces events its stream's reader did not take: it fell more than the client's
    /// `eventBuffer` events behind, and those events are gone (other streams are unaffected). `items` is every
    /// item at `sequence`, so a reader that rebuilds from `loaded` misses nothing.
    public var afterLag: Bool

    @usableFromInline init(operation: Operation, items: [Item], sequence: UInt64, afterLag: Bool = false) {
        self.operation = operation
        self.items = items
        self.sequence = sequence
        self.afterLag = afterLag
    }
}

/// A store of the broker as a Boutique-like `Store`, shared by every process that opens it.
///
/// `items` is a local mirror kept current by a subscription; writes go to the broker, which is their only
/// writer, and return once the mirror has caught up with them, so a process reads its own writes. Items are
/// JSON (`JSONEncoder`'s bytes, see `PayloadJSON`); `cacheIdentifier` gives each its id. The mirror keeps the
/// items this process wrote as they were written (their commit is not decoded back); other processes' items are
/// decoded. `items`, `loadState` and `sequence` are observable (the Observation framework:
/// `withObservationTracking`, SwiftUI).
///
/// ```swift
/// let notes = try await RemoteStore<Note>(client: client, loading: "notes")   // returns once loaded
/// try await notes.insert(Note(id: "1", text: "milk"))
/// try await notes.chain().removeAll().insert(fresh).run()                     // one atomic commit
/// for await event in notes.events { ... }
/// ```
public final class RemoteStore<Item: Codable & Sendable>: Sendable, Observable {
    public let name: String
    public let client: BrokerClient
    // The write path (`insert` down to the mirror's `apply`) is `@inlinable`, what it touches `@usableFromInline`:
    // an app's `RemoteStore<Note>` is then specialized in the app's module, where unspecialized generic code spent
    // a tenth of the client's time per insert looking up metadata (docs/BENCHMARKS.md, "Figures behind choices in the code").
    @usableFromInline let identifier: @Sendable (Item) -> String
    @usableFromInline let state: Locked<Mirror>
    private let follower = Locked<Task<Void, Never>?>(nil)
    @usableFromInline let registrar = ObservationRegistrar()
    @usableFromInline let coding = MirrorCoding()
    @usableFromInline let written = WrittenValues<Item>()
    /// The follower's subscription now (its connection and id), which this process's writes on that connection
    /// name so that their commits are not pushed back to it (`quietChain`): the mirror applies them itself.
    @usableFromInline let quietRoute = Locked<(connection: BrokerConnection, id: UInt32)?>(nil)
    // The observed properties' key paths, made once: a key path into a generic class is instantiated at run
    // time (its pattern demangled) each time the expression runs, 13% of the client's time per insert when the
    // mirror made them per event.
    // `sequence` is observed through `items`'s key: every change of the mirror changes both (a commit moves the
    // sequence and is the items' only way to change), so their observers are told alike, for half the calls.
    @usableFromInline let itemsKey: KeyPath<RemoteStore, [Item]> & Sendable = \.items
    @usableFromInline let loadStateKey: KeyPath<RemoteStore, LoadState<[Item]>> & Sendable = \.loadState

    @usableFromInline struct Mirror: MirrorState, @unchecked Sendable {  // OrderedTable of Sendable items, under the lock
        @usableFromInline var table = OrderedTable<String, Item>()
        /// `table` as an array, made when first asked for after a change (so an event costs what it changes).
        @usableFromInline var array: [Item]?
        @usableFromInline var phase: LoadState<Void> = .idle
        @usableFromInline var epoch: UInt64 = 0
        @usableFromInline var sequence: UInt64 = 0
        @usableFromInline var waiters = MirrorWaiters()
        @usableFromInline var streams: [UInt64: BoundedStream<StoreEvent<Item>, Never>.Feed] = [:]
        @usableFromInline var nextStream: UInt64 = 0
        /// Writes of this process sent quietly and not answered yet, by a number of their own. While there are,
        /// an event that skips a sequence waits in `heldEvents`: the sequence skipped is such a write's, applied
        /// from its answer. (The broker writes a commit group's pushes before its answers, so another process's
        /// commit right after this one's can arrive first.)
        @usableFromInline var quietWrites: [UInt64: OwnWrite] = [:]
        @usableFromInline var nextQuietWrite: UInt64 = 0
        /// Events that arrived before the quiet writes they follow, by sequence.
        @usableFromInline var heldEvents: [UInt64: (event: Commit, decoded: [Item])] = [:]
        /// Quiet writes answered before the events they follow, by sequence.
        @usableFromInline var heldWrites: [UInt64: OwnWrite] = [:]
        /// Writes of this process applied from their answers (for tests).
        @usableFromInline var appliedFromAnswers = 0

        /// Whether the commit at (`epoch`, `sequence`) comes right after what the mirror holds.
        @inlinable func isNext(_ epoch: UInt64, _ sequence: UInt64) -> Bool {
            sequence == self.sequence + 1 && (epoch == self.epoch || self.sequence == 0)
        }

        /// Whether the mirror already holds the commit at (`epoch`, `sequence`).
        @inlinable func holds(_ epoch: UInt64, _ sequence: UInt64) -> Bool { epoch == self.epoch && sequence <= self.sequence }

        /// Applies an event, its inserted items decoded (in step order); `events` gets what streams are told.
        @inlinable mutating func apply(_ event: Commit, decoded: [Item], into events: inout [StoreEvent<Item>]) {
            // Events are made only for the streams there are (a mirror nobody streams makes none).
            let streamed = !streams.isEmpty
            var next = 0  // the first item of the next insert step in `decoded`
            for step in event.steps {
                switch step {
                case .insert(let records):
                    for index in records.indices { table.put(records[index].id.string, decoded[next + index]) }
                    if streamed {
                        let items = Array(decoded[next..<next + records.count])
                        events.append(StoreEvent(operation: .insert, items: items, sequence: event.sequence))
                    }
                    next += records.count
                case .remove(let ids):
                    remove(ids.lazy.map(\.string), at: event.sequence, streamed: streamed, into: &events)
                }
            }
            moved(to: event.epoch, event.sequence)
        }

        /// Applies a write of this process committed at (`epoch`, `sequence`) as the broker applied it, and tells
        /// the streams what its event would have: an insert step holds each id once, where it first occurs, with
        /// its last value; adjacent steps of one kind are one (inserts only when no id repeats); a remove that
        /// removed nothing is left out.
        @inlinable mutating func apply(
            _ write: OwnWrite, at epoch: UInt64, _ sequence: UInt64, into events: inout [StoreEvent<Item>]
        ) {
            var told = EventSteps(streamed: !streams.isEmpty)
            var next = 0  // the first value of the next insert step in `write.values`
            for step in write.steps {
                switch step {
                case .insert(let items) where items.count == 1:  // most writes: no table to find repeats in
                    let id = items[0].id.string
                    table.put(id, write.values[next])
                    if told.streamed { told.add(.insert, [id], [write.values[next]]) }
                    next += 1
                case .insert(let items):
                    var once = OrderedTable<String, Item>()
                    for index in items.indices { once.put(items[index].id.string, write.values[next + index]) }
                    next += items.count
                    var ids: [String] = []
                    var inserted: [Item] = []
                    once.forEach { id, item in
                        table.put(id, item)
                        if told.streamed {
                            ids.append(id)
                            inserted.append(item)
                        }
                        return true
                    }
                    told.add(.insert, ids, inserted)
                case .remove(let ids):
                    var removed: [Item] = []
                    for id in ids { if let item = table.remove(id.string) { removed.append(item) } }
                    told.add(.remove, [], removed)
                case .removeAll:
                    array = nil  // the steps before may have changed the table
                    if told.streamed { told.add(.remove, [], items()) }
                    table = OrderedTable()
                }
            }
            told.end(at: sequence, into: &events)
            moved(to: epoch, sequence)
        }

        @inlinable mutating func remove(
            _ ids: some Sequence<String>, at sequence: UInt64, streamed: Bool, into events: inout [StoreEvent<Item>]
        ) {
            var removed: [Item] = []
            for id in ids { if let item = table.remove(id) { removed.append(item) } }
            if streamed { events.append(StoreEvent(operation: .remove, items: removed, sequence: sequence)) }
        }

        @inlinable mutating func moved(to epoch: UInt64, _ sequence: UInt64) {
            array = nil
            self.epoch = epoch
            self.sequence = sequence
        }

        /// Applies what was held and now comes next, in sequence order, and forgets what the mirror holds already.
        @inlinable mutating func applyHeld(into events: inout [StoreEvent<Item>]) {
            guard !heldEvents.isEmpty || !heldWrites.isEmpty else { return }
            while true {
                let wanted = sequence + 1
                if let held = heldEvents.removeValue(forKey: wanted), isNext(held.event.epoch, wanted) {
                    apply(held.event, decoded: held.decoded, into: &events)
                } else if let held = heldWrites.removeValue(forKey: wanted), isNext(held.epoch, wanted) {
                    apply(held, at: held.epoch, wanted, into: &events)
                    appliedFromAnswers += 1
                } else {
                    break
                }
            }
            heldEvents = heldEvents.filter { !holds($0.value.event.epoch, $0.key) }
            heldWrites = heldWrites.filter { !holds($0.value.epoch, $0.key) }
        }

        @inlinable mutating func items() -> [Item] {
            if let array { return array }
            var out: [Item] = []
            out.reserveCapacity(table.count)
            table.forEach { _, item in
                out.append(item)
                return true
            }
            array = out
            return out
        }
    }

    /// A store whose items are identified by `cacheIdentifier`. Starts following the broker at once; `items`
    /// is empty until it has loaded (`itemsHaveLoaded()`, `loadState`).
    public convenience init(client: BrokerClient = .shared, name: String, cacheIdentifier: KeyPath<Item, String> & Sendable) {
        self.init(client: client, name: name, identifier: { $0[keyPath: cacheIdentifier] })
    }

    /// A store whose items are identified by `identifier`: what the initializers of `Identifiable` items pass, a
    /// property read, where a key path is applied by the runtime's generic key-path code for every item written.
    init(client: BrokerClient, name: String, identifier: @escaping @Sendable (Item) -> String) {
        self.client = client
        self.name = name
        self.identifier = identifier
        self.state = Locked(Mirror())
        start()
    }

    /// A store whose items are identified by `cacheIdentifier`, returned once its items have loaded; throws
    /// `cannotConnect` when the broker cannot be reached within the client's `connectTimeout`.
    public convenience init(
        client: BrokerClient = .shared, loading name: String, cacheIdentifier: KeyPath<Item, String> & Sendable
    ) async throws(StoreBrokerError) {
        try await self.init(client: client, loading: name, identifier: { $0[keyPath: cacheIdentifier] })
    }

    /// `init(client:loading:cacheIdentifier:)` with the identifier as a closure.
    convenience init(
        client: BrokerClient, loading name: String, identifier: @escaping @Sendable (Item) -> String
    ) async throws(StoreBrokerError) {
        self.init(client: client, name: name, identifier: identifier)
        do throws(StoreBrokerError) {
            try await itemsHaveLoaded()
        } catch {
            close()
            throw error
        }
    }

    deinit {
        follower.withLock { $0?.cancel() }
    }

    /// Stops following the broker: `items` keeps its last state, streams end, and whoever waits (for the load,
    /// for a sequence) gets `closed`.
    public func close() {
        follower.withLock { $0?.cancel() }
        registrar.withMutation(of: self, keyPath: loadStateKey) {
            state.stop(with: StoreBrokerError(.closed, "store \(name) was closed"))
        }
    }

    // MARK: Reading

    /// The items, in the store's order, as of the last event received.
    public var items: [Item] {
        registrar.access(self, keyPath: itemsKey)
        return state.withLock { $0.items() }
    }

    /// The item with this id, if the mirror holds one.
    public func item(id: String) -> Item? {
        registrar.access(self, keyPath: itemsKey)
        return state.withLock { $0.table.value(for: id) }
    }

    /// The store's sequence as of the last event received (0 before the first load): the commit `items` is at,
    /// and what a conditional write expects (`insert(_:expecting:)`).
    public var sequence: UInt64 {
        registrar.access(self, keyPath: itemsKey)  // see `itemsKey`
        return state.withLock { $0.sequence }
    }

    /// Idle, loading, loaded (the items), or the error that stopped the mirror, or `cannotConnect` while the
    /// broker is out of reach before the first load (the mirror keeps trying: it becomes `.value` once it loads).
    public var loadState: LoadState<[Item]> {
        registrar.access(self, keyPath: loadStateKey)
        return state.withLock { mirror in mirror.phase.carrying(mirror.items()) }
    }

    /// Returns once the first snapshot is loaded. Throws what stopped the mirror (an undecodable item, say),
    /// `cannotConnect` when the broker cannot be reached within the client's `connectTimeout` (the mirror keeps
    /// trying in the background), `cancelled` when the task is cancelled, `closed` after `close()`.
    public func itemsHaveLoaded() async throws(StoreBrokerError) {
        try await state.waitUntilLoaded("store \(name) to load")
    }

    /// Returns once this mirror has seen the store's commit `sequence` (another process's write, say), under
    /// the same rules as `itemsHaveLoaded()`: while the broker is out of reach (told once it has been for the
    /// `connectTimeout`), it throws that at once, until the mirror has subscribed again.
    public func waitUntilSeen(sequence: UInt64) async throws(StoreBrokerError) {
        try await state.waitUntilReached("store \(name) to reach sequence \(sequence)", epoch: nil, sequence: sequence)
    }

    /// Every change from now on: `initialized`, then `loaded` (at once if already loaded), then one event per
    /// step of each commit. A stream ends when the store is closed. A reader more than the client's
    /// `eventBuffer` events behind gets a fresh `loaded` (`afterLag`) instead of what it missed.
    public var events: BoundedStream<StoreEvent<Item>, Never> {
        let key = state.withLock { mirror -> UInt64 in
            mirror.nextStream += 1
            return mirror.nextStream
        }
        let (stream, feed) = BoundedStream<StoreEvent<Item>, Never>.make(capacity: client.eventBuffer) { [weak self] in
            _ = self?.state.withLock { $0.streams.removeValue(forKey: key) }
        }
        feed.yield(StoreEvent(operation: .initialized, items: [], sequence: 0))
        state.withLock { mirror in
            if mirror.isLoaded {
                feed.yield(StoreEvent(operation: .loaded, items: mirror.items(), sequence: mirror.sequence))
            }
            if !mirror.isStopped { mirror.streams[key] = feed }
        }
        if state.withLock({ $0.isStopped }) { feed.finish() }
        return stream
    }

    // MARK: Following the broker

    private func start() {
        let follower = SubscriptionFollower(client: client, namespace: .store, name: name)
        // Weak all the way: the follower must not keep the store alive (deinit cancels it).
        let task = Task { [weak self] in
            self?.state.withLock { $0.phase = .loading }
            let failure = await follower.run(
                resumePoint: { [weak self] in self?.resumePoint() ?? .snapshot },
                unavailable: { [weak self] error in
                    guard let self else { return }
                    registrar.withMutation(of: self, keyPath: loadStateKey) { state.unavailable(error) }
                },
                subscribed: { [weak self] route in
                    self?.quietRoute.withLock { $0 = route }
                    if route != nil { self?.state.reachable() }
                },
                handle: { [weak self] push throws(StoreBrokerError) in try self?.apply(push) })
            guard let self, let failure else { return }
            registrar.withMutation(of: self, keyPath: loadStateKey) { state.stop(with: failure) }
        }
        self.follower.withLock { $0 = task }
    }

    private func resumePoint() -> SubscriptionStart {
        state.withLock { mirror in mirror.isLoaded ? .resume(epoch: mirror.epoch, sequence: mirror.sequence) : .snapshot }
    }

    private func decode(_ record: ItemRecord) throws(StoreBrokerError) -> Item {
        do {
            return try coding.decode(Item.self, from: record.payload)
        } catch {
            throw StoreBrokerError(
                .cannotDecode, "item \(record.id.string.debugDescription) of store \(name) cannot be decoded: \(error)",
                underlying: error)
        }
    }

    /// Applies a push to the mirror, under the lock, in O(items it changes); then tells the streams and
    /// releases the waiters, outside it.
    private func apply(_ push: Push) throws(StoreBrokerError) {
        var events: [StoreEvent<Item>] = []
        var released: [MirrorWaiters.Continuation] = []
        var streams: [BoundedStream<StoreEvent<Item>, Never>.Feed] = []
        switch push {
        case .storeLoaded(let at, let records):
            var table = OrderedTable<String, Item>()
            for record in records { table.put(record.id.string, try decode(record)) }
            mutate(loadState: true) { mirror in
                mirror.table = table
                mirror.array = nil
                mirror.epoch = at.epoch
                mirror.sequence = at.sequence
                mirror.phase = .value(())
                events = [StoreEvent(operation: .loaded, items: mirror.items(), sequence: at.sequence)]
                mirror.applyHeld(into: &events)
                released = mirror.waiters.takeLoads() + mirror.waiters.advance(to: mirror.position)
                streams = Array(mirror.streams.values)
            }
        case .storeEvent(let event):
            // Each step's items, decoded outside the lock; what this process wrote is taken as it was written.
            let ownWrites = written.snapshot()
            // A quiet write is pushed back after all when the broker committed it while the mirror's subscription
            // was being replaced: then too the mirror takes what was written.
            let quietWrites = state.withLock { $0.quietWrites.isEmpty ? [] : Array($0.quietWrites.values) }
            var decoded: [Item] = []
            for step in event.steps {
                guard case .insert(let records) = step else { continue }
                decoded.reserveCapacity(decoded.count + records.count)
                for record in records {
                    if let item = ownWrites.value(for: record.payload) ?? OwnWrite.value(for: record, in: quietWrites) {
                        decoded.append(item)
                    } else {
                        decoded.append(try decode(record))
                    }
                }
            }
            mutate(loadState: false) { mirror in
                // A write of this process that the mirror applied from its answer, pushed all the same (its
                // subscription was being replaced when the broker committed it).
                if mirror.holds(event.epoch, event.sequence) { return }
                if !mirror.isNext(event.epoch, event.sequence), !mirror.quietWrites.isEmpty || !mirror.heldWrites.isEmpty {
                    mirror.heldEvents[event.sequence] = (event, decoded)
                    return
                }
                mirror.apply(event, decoded: decoded, into: &events)
                mirror.applyHeld(into: &events)
                released = mirror.waiters.advance(to: mirror.position)
                if !events.isEmpty { streams = Array(mirror.streams.values) }
            }
        case .dropped:
            mutate(loadState: false) { mirror in
                let gone = mirror.epoch
                mirror.heldEvents = mirror.heldEvents.filter { $0.value.event.epoch != gone }
                mirror.heldWrites = mirror.heldWrites.filter { $0.value.epoch != gone }
                let removed = mirror.items()
                mirror.table = OrderedTable()
                mirror.array = nil
                mirror.epoch = 0
                mirror.sequence = 0
                released = mirror.waiters.advance(to: mirror.position)
                streams = Array(mirror.streams.values)
                events = [StoreEvent(operation: .remove, items: removed, sequence: 0)]
            }
        default:
            return  // historyGone (a snapshot follows), lagged (the follower subscribes again)
        }
        tell(streams, events)
        for waiter in released { waiter.resume(returning: .success(())) }
    }

    /// A quiet write's answer, on the connection's event loop as it is read (where pushes are applied, so the
    /// streams are told in commit order): its commit applied to the mirror, or held until the commits before it
    /// have arrived; the streams told and the waiters released.
    @inlinable func applyAnswer(_ outcome: Result<CommitResult, StoreBrokerError>, of write: OwnWrite, number: UInt64) {
        var events: [StoreEvent<Item>] = []
        var released: [MirrorWaiters.Continuation] = []
        var streams: [BoundedStream<StoreEvent<Item>, Never>.Feed] = []
        mutate(loadState: false) { mirror in
            mirror.quietWrites[number] = nil
            guard case .success(let result) = outcome, result.committed,
                !mirror.holds(result.epoch, result.sequence)
            else { return }
            var committed = write
            committed.epoch = result.epoch
            guard mirror.isNext(result.epoch, result.sequence) else {
                mirror.heldWrites[result.sequence] = committed
                return
            }
            mirror.apply(committed, at: result.epoch, result.sequence, into: &events)
            mirror.appliedFromAnswers += 1
            mirror.applyHeld(into: &events)
            released = mirror.waiters.advance(to: mirror.position)
            if !events.isEmpty { streams = Array(mirror.streams.values) }
        }
        tell(streams, events)
        for waiter in released { waiter.resume(returning: .success(())) }
    }

    /// Gives each stream the events, in order (a stream too far behind lags).
    @inlinable func tell(_ streams: [BoundedStream<StoreEvent<Item>, Never>.Feed], _ events: [StoreEvent<Item>]) {
        for feed in streams {
            for event in events where !feed.yield(event) {
                lag(feed)
                break
            }
        }
    }

    /// A stream whose reader is `eventBuffer` events behind: what it has not read is replaced by a `loaded` of
    /// the items as they are now (`afterLag`; this commit included: no later event is in its place yet).
    @usableFromInline func lag(_ feed: BoundedStream<StoreEvent<Item>, Never>.Feed) {
        let (items, at) = state.withLock { ($0.items(), $0.sequence) }
        feed.replaceUnread(with: [StoreEvent(operation: .loaded, items: items, sequence: at, afterLag: true)])
    }

    /// Changes the mirror under the lock, telling observers of `items` and `sequence` (one key, see `itemsKey`)
    /// and of `loadState`.
    @inlinable func mutate(loadState: Bool, _ change: (inout Mirror) -> Void) {
        registrar.willSet(self, keyPath: itemsKey)
        if loadState { registrar.willSet(self, keyPath: loadStateKey) }
        state.withLock { change(&$0) }
        if loadState { registrar.didSet(self, keyPath: loadStateKey) }
        registrar.didSet(self, keyPath: itemsKey)
    }

    // MARK: Writing

    /// Writes in flight the mirror holds as written: payloads of plain writes, quiet writes (for tests: 0 once
    /// every write is shown).
    var writesInFlight: Int { written.count + state.withLock { $0.quietWrites.count } }

    /// Writes of this process the mirror applied from their answers, their commits not pushed back (for tests).
    var writesAppliedFromAnswers: Int { state.withLock { $0.appliedFromAnswers } }

    /// For tests: quiet writes name subscription `id` instead of the mirror's (one the broker does not know
    /// makes their commits come back as pushes, as when the subscription is being replaced).
    func misnameSubscription(_ id: UInt32) {
        quietRoute.withLock { route in route = route.map { ($0.connection, id) } }
    }

    @inlinable func payload(_ item: Item) throws(StoreBrokerError) -> StoreModel.Item {
        do {
            return StoreModel.Item(id: ItemID(identifier(item)), payload: try coding.encode(item))
        } catch {
            throw StoreBrokerError(.cannotEncode, "an item for store \(name) cannot be encoded: \(error)", underlying: error)
        }
    }

    /// The stream events of one commit applied from its answer, made as the broker makes its event's steps
    /// (`WritePlanner`): adjacent steps of one kind joined, an insert only when none of its ids repeats, and
    /// empty removes left out.
    @usableFromInline struct EventSteps {
        @usableFromInline let streamed: Bool
        @usableFromInline var operation: StoreEvent<Item>.Operation?
        @usableFromInline var items: [Item] = []
        @usableFromInline var ids: Set<String> = []
        @usableFromInline var made: [StoreEvent<Item>] = []

        @inlinable init(streamed: Bool) { self.streamed = streamed }

        /// A step's items (and, for an insert, their ids).
        @inlinable mutating func add(_ kind: StoreEvent<Item>.Operation, _ stepIDs: [String], _ stepItems: [Item]) {
            guard streamed, !stepItems.isEmpty else { return }
            if kind == operation, kind == .remove || stepIDs.allSatisfy({ !ids.contains($0) }) {
                items += stepItems
                ids.formUnion(stepIDs)
                return
            }
            flush()
            operation = kind
            items = stepItems
            ids = Set(stepIDs)
        }

        @inlinable mutating func end(at sequence: UInt64, into events: inout [StoreEvent<Item>]) {
            guard streamed else { return }  // no stream: nothing was gathered (and nothing costs a thing)
            flush()
            for index in made.indices { made[index].sequence = sequence }
            events += made
        }

        @inlinable mutating func flush() {
            if let operation { made.append(StoreEvent(operation: operation, items: items, sequence: 0)) }
            operation = nil
        }
    }

    /// A write of this process, as the mirror applies it from its answer.
    @usableFromInline struct OwnWrite: Sendable {
        @usableFromInline var epoch: UInt64
        @usableFromInline var steps: [ChainStep]
        /// The items of the insert steps, in their order.
        @usableFromInline var values: [Item]

        @inlinable init(epoch: UInt64, steps: [ChainStep], values: [Item]) {
            self.epoch = epoch
            self.steps = steps
            self.values = values
        }

        /// The value one of `writes` wrote as `record` (its id, then its very bytes), if any.
        static func value(for record: ItemRecord, in writes: [OwnWrite]) -> Item? {
            for write in writes {
                var next = 0
                for step in write.steps {
                    guard case .insert(let items) = step else { continue }
                    // The last occurrence of an id is the one committed.
                    for index in items.indices.reversed() where items[index].id == record.id {
                        if items[index].payload == record.payload { return write.values[next + index] }
                        break
                    }
                    next += items.count
                }
            }
            return nil
        }
    }

    /// Sends a write; returns the store's sequence after it once the mirror has the commit (or has stopped, or
    /// lost the broker: the write is committed all the same). `values` are the items of the insert steps, in
    /// their order: the mirror takes them as they are, never decoding what it wrote. On the connection the
    /// mirror follows the store on, the write names that subscription (`quietChain`): the broker does not push
    /// the commit back, and the mirror applies the write itself, in sequence order with the other commits.
    @inlinable nonisolated(nonsending) func write(
        _ steps: [ChainStep], values: [Item], expecting: UInt64?
    ) async throws(StoreBrokerError) -> UInt64 {
        guard !steps.isEmpty else { return sequence }
        let condition: Condition = expecting.map { .sequence($0) } ?? .unconditional
        let connection = try await client.connection()
        if let route = quietRoute.withLock({ $0 }), route.connection === connection,
            connection.takesQuietChain
        {
            do throws(StoreBrokerError) {
                return try await quietWrite(OwnWrite(epoch: 0, steps: steps, values: values), condition, connection, route.id)
            } catch where BrokerConnection.isQuietChainRefusal(error) {
                // An older broker, or a write that fits a frame only plain: sent plain below.
            }
        }
        var payloads: [Payload] = []
        payloads.reserveCapacity(values.count)
        for step in steps {
            guard case .insert(let records) = step else { continue }
            for record in records { payloads.append(record.payload) }
        }
        written.note(payloads, values)
        defer { written.forget(payloads) }
        let operation = WriteOperation(steps: steps) ?? .chain([])
        return await shown(try await connection.write(name, operation, condition: condition))
    }

    /// The store's sequence after a write, once the mirror shows it (or has stopped, or lost the broker).
    @inlinable nonisolated(nonsending) func shown(_ result: CommitResult) async -> UInt64 {
        guard result.committed else { return result.sequence }
        try? await state.waitUntilReached("store \(name) to show a write", epoch: result.epoch, sequence: result.sequence)
        return result.sequence
    }

    /// `write` naming the mirror's subscription `subscriptionID` on `connection`: the answer's commit is applied
    /// on the event loop as the answer is read (`applyAnswer`), before this resumes.
    @inlinable nonisolated(nonsending) func quietWrite(
        _ write: OwnWrite, _ condition: Condition, _ connection: BrokerConnection, _ subscriptionID: UInt32
    ) async throws(StoreBrokerError) -> UInt64 {
        // Kept in flight where an event that brings it back after all finds it (by id, then its bytes): no
        // table of payloads hashed per write.
        let number = state.withLock { mirror in
            mirror.nextQuietWrite += 1
            mirror.quietWrites[mirror.nextQuietWrite] = write
            return mirror.nextQuietWrite
        }
        // `self` held strongly: this task holds it until the answer anyway, and a weak reference is formed and
        // destroyed per write (an atomic on the object's side table each).
        let result = try await connection.write(name, write.steps, condition: condition, quietFor: subscriptionID) {
            outcome in self.applyAnswer(outcome, of: write, number: number)
        }
        return await shown(result)
    }

    /// Inserts an item, or replaces the one with its id in place. With `expecting`, only if the store's
    /// sequence is still that (else `refused` with code `conflict`: `error.isConflict`). Returns the store's
    /// sequence after the write.
    @discardableResult
    @inlinable
    public func insert(_ item: Item, expecting sequence: UInt64? = nil) async throws(StoreBrokerError) -> UInt64 {
        try await write([.insert(items: [try payload(item)])], values: [item], expecting: sequence)
    }

    /// Inserts items in one commit (the first occurrence of an id fixes its position, the last one wins).
    @discardableResult
    @inlinable
    public func insert(_ items: [Item], expecting sequence: UInt64? = nil) async throws(StoreBrokerError) -> UInt64 {
        var records: [StoreModel.Item] = []
        records.reserveCapacity(items.count)
        for item in items { records.append(try payload(item)) }
        return try await write(records.isEmpty ? [] : [.insert(items: records)], values: items, expecting: sequence)
    }

    @discardableResult
    @inlinable
    public func remove(_ item: Item, expecting sequence: UInt64? = nil) async throws(StoreBrokerError) -> UInt64 {
        try await remove(ids: [identifier(item)], expecting: sequence)
    }

    @discardableResult
    @inlinable
    public func remove(_ items: [Item], expecting sequence: UInt64? = nil) async throws(StoreBrokerError) -> UInt64 {
        try await remove(ids: items.map(identifier), expecting: sequence)
    }

    @discardableResult
    @inlinable
    public func remove(id: String, expecting sequence: UInt64? = nil) async throws(StoreBrokerError) -> UInt64 {
        try await remove(ids: [id], expecting: sequence)
    }

    @discardableResult
    @inlinable
    public func remove(ids: [String], expecting sequence: UInt64? = nil) async throws(StoreBrokerError) -> UInt64 {
        try await write(ids.isEmpty ? [] : [.remove(ids: ids.map { ItemID($0) })], values: [], expecting: sequence)
    }

    @discardableResult
    @inlinable
    public func removeAll(expecting sequence: UInt64? = nil) async throws(StoreBrokerError) -> UInt64 {
        try await write([.removeAll], values: [], expecting: sequence)
    }

    // MARK: Chains

    /// The start of a chain: steps committed together by `run()`, one atomic commit that nobody sees half done.
    ///
    /// ```swift
    /// try await notes.chain().removeAll().insert(fresh).run()
    /// ```
    public func chain() -> Chain { Chain(store: self) }

    /// Steps committed together by `run()`. Nothing is sent until then.
    public struct Chain: Sendable {
        @usableFromInline let store: RemoteStore
        @usableFromInline var steps: [ChainStep] = []
        @usableFromInline var values: [Item] = []  // the inserted items, in the order of their steps

        @usableFromInline init(store: RemoteStore) { self.store = store }

        public func insert(_ item: Item) throws(StoreBrokerError) -> Chain { try insert([item]) }

        public func insert(_ items: [Item]) throws(StoreBrokerError) -> Chain {
            var next = self
            var records: [StoreModel.Item] = []
            for item in items { records.append(try store.payload(item)) }
            next.steps.append(.insert(items: records))
            next.values += items
            return next
        }

        public func remove(_ item: Item) -> Chain { remove(ids: [store.identifier(item)]) }
        public func remove(_ items: [Item]) -> Chain { remove(ids: items.map(store.identifier)) }
        public func remove(id: String) -> Chain { remove(ids: [id]) }

        public func remove(ids: [String]) -> Chain {
            var next = self
            next.steps.append(.remove(ids: ids.map { ItemID($0) }))
            return next
        }

        public func removeAll() -> Chain {
            var next = self
            next.steps.append(.removeAll)
            return next
        }

        /// Commits every step at once (with `expecting`, only if the store is still at that sequence); returns
        /// the store's sequence after it.
        @discardableResult
        @inlinable
        public func run(expecting sequence: UInt64? = nil) async throws(StoreBrokerError) -> UInt64 {
            try await store.write(steps, values: values, expecting: sequence)
        }
    }
}

extension RemoteStore where Item: Identifiable, Item.ID == String {
    /// A store of `Identifiable` items with `String` ids.
    public convenience init(client: BrokerClient = .shared, name: String) {
        self.init(client: client, name: name, identifier: { $0.id })
    }

    /// A store of `Identifiable` items with `String` ids, returned once loaded.
    public convenience init(client: BrokerClient = .shared, loading name: String) async throws(StoreBrokerError) {
        try await self.init(client: client, loading: name, identifier: { $0.id })
    }
}

extension RemoteStore where Item: Identifiable, Item.ID == UUID {
    /// A store of `Identifiable` items with `UUID` ids (stored as their `uuidString`).
    public convenience init(client: BrokerClient = .shared, name: String) {
        self.init(client: client, name: name, identifier: { $0.id.uuidString })
    }

    /// A store of `Identifiable` items with `UUID` ids, returned once loaded.
    public convenience init(client: BrokerClient = .shared, loading name: String) async throws(StoreBrokerError) {
        try await self.init(client: client, loading: name, identifier: { $0.id.uuidString })
    }
}
