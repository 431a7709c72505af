#if canImport(Glibc)
import Glibc
#endif
import Locking
import Logging
import StoreModel
import Synchronization

/// How a broker behaves; built by the daemon from its flags (defaults documented in `storebrokerd --help`).
public struct BrokerConfiguration: Sendable {
    /// Where the stores live (`--data-dir`).
    public var dataDirectory: String
    /// The engine of new stores (`--engine`); existing stores keep the engine in their manifest.
    public var defaultEngine: String
    /// Options per engine name (`--engine-option NAME.KEY=VALUE`).
    public var engineOptions: [String: [String: String]]
    /// Commits kept per store for subscribers that resume (`--history`).
    public var history: Int
    /// Bytes of ids and payloads those commits may hold per store (`--history-bytes`); the oldest go first.
    public var historyBytes: Int
    /// Pushes that may wait for one subscriber before it is told it lagged (`--subscriber-buffer`).
    public var subscriberBuffer: Int
    /// The largest item payload (`--max-item`).
    public var maxItemLength: Int
    /// The most items, ids or steps in one request (`--max-batch`).
    public var maxBatch: Int
    /// The most write requests one engine transaction may carry (group commit).
    public var maxGroupCommit: Int
    /// The threads writers run on (`--writer-threads`; the server makes them): each store with work is pinned to
    /// one, calling its engine synchronously; an idle store holds none.
    public var writerThreads: Int
    /// The longest a store's writer waits, after a slow apply, for the writers it has just answered before it makes
    /// its next group (`--max-group-wait`; zero: never). See `GroupGathering`.
    public var maxGroupWait: Duration
    /// Where items' `createdAt` and `updatedAt` come from: the wall clock, or a clock a test moves by hand.
    public var clock: WallClock

    public init(
        dataDirectory: String, defaultEngine: String = "sqlite", engineOptions: [String: [String: String]] = [:],
        history: Int = 1024, historyBytes: Int = 64 << 20, subscriberBuffer: Int = 1024, maxItemLength: Int = 1 << 20, maxBatch: Int = 10_000,
        maxGroupCommit: Int = 512, writerThreads: Int = 4, maxGroupWait: Duration = .milliseconds(1),
        clock: WallClock = .system
    ) {
        self.dataDirectory = dataDirectory
        self.defaultEngine = defaultEngine
        self.engineOptions = engineOptions
        self.history = history
        self.historyBytes = historyBytes
        self.subscriberBuffer = subscriberBuffer
        self.maxItemLength = maxItemLength
        self.maxBatch = maxBatch
        self.maxGroupCommit = maxGroupCommit
        self.writerThreads = writerThreads
        self.maxGroupWait = maxGroupWait
        self.clock = clock
    }
}

/// The time a commit stamps on what it changes, in milliseconds since the Unix epoch. Read once per commit
/// group, by the writer.
public struct WallClock: Sendable {
    private let read: @Sendable () -> UInt64

    /// A clock that reads `read` (a test's hand-moved clock).
    public init(_ read: @escaping @Sendable () -> UInt64) { self.read = read }

    /// `CLOCK_REALTIME`.
    public static let system = WallClock {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return UInt64(now.tv_sec) * 1000 + UInt64(now.tv_nsec) / 1_000_000
    }

    public func milliseconds() -> UInt64 { read() }
}

/// Told of every commit, for broadcasting (the D-Bus publisher): a listener of the broadcaster, like the socket
/// subscribers. Called by the store's writer after the commit, outside any lock, in sequence order per store
/// or value; it must only hand the news over (a bounded queue), never block, since the commit's answers wait.
public protocol CommitObserver: Sendable {
    /// One commit of a store: its steps in order (a `removeAll` is a remove of every id). A drop is reported
    /// as a remove of every id the store held, at sequence 0.
    func storeCommitted(store: String, epoch: UInt64, sequence: UInt64, steps: [EventStep])
    /// A value or secure value was set or reset (names and sequences only, never the value).
    func valueChanged(name: String, sequence: UInt64, secure: Bool)
}

/// Where a broker gets its engines. The daemon implements it with `EngineLoader` (dlopen); tests may hand
/// engines over directly.
public protocol EngineProvider: Sendable {
    /// The engine called `name`, or `engineUnavailable` saying why not.
    func engine(named name: String) throws(BrokerError) -> any StorageEngine
    /// Every engine the broker could use, for `listEngines`.
    func engineList() -> [EngineInfo]
}

/// One request of a batch (`Broker.handle(_:context:)`): the command, the subscription a `subscribe` needs,
/// and where its answer goes.
public struct BrokerRequest: Sendable {
    public var command: BrokerCommand
    /// For a `subscribe`, the queue its pushes go to. For a store write, a subscription of the same peer to that
    /// store that is not offered the write's event (its client applies the write itself, from the answer);
    /// one of another store or namespace is ignored.
    public var subscription: Subscription?
    public var reply: Reply

    @inlinable
    public init(_ command: BrokerCommand, subscription: Subscription? = nil, reply: Reply) {
        self.command = command
        self.subscription = subscription
        self.reply = reply
    }

    public init(
        _ command: BrokerCommand, subscription: Subscription? = nil,
        reply: @escaping @Sendable (Result<BrokerAnswer, BrokerError>) -> Void
    ) {
        self.init(command, subscription: subscription, reply: Reply(reply))
    }
}

/// The stores and values of one data directory and the requests on them, with no networking.
///
/// Every request passes the interceptor chain, then reaches its store or value namespace; `reply` is called
/// once, possibly on another thread and possibly before `handle` returns. Requests are carried out in the
/// order they are submitted per store (writes keep that order in their sequences); reads answer from memory.
public final class Broker: Sendable {
    public let configuration: BrokerConfiguration
    public let interceptors: [any RequestInterceptor]
    /// The interceptors whose `observe` does something (`observesOutcomes`), in chain order.
    private let observers: [any RequestInterceptor]
    /// The interceptors whose `check` can refuse (`checksRequests`), in chain order.
    private let checkers: [any RequestInterceptor]
    private let environment: StoreEnvironment
    private let stores = Locked<[String: ManagedStore]>([:])
    /// Tells this broker from others in the process (`StoreLookup`): never reused, unlike an address.
    private let identity = Broker.identities.add(1, ordering: .relaxed).newValue
    private static let identities = Atomic<UInt64>(0)
    /// Set by `shutdown`.
    private let stopping = Locked(false)
    private let values: ValueSpace
    private let secureValues: ValueSpace
    /// Watches on the shared engine's stores (ABI 2.1), when the default engine shares them.
    private let watchers = Locked<[SharedWatcher]>([])

    /// The built-in chain, in order: request logging (sees every request, rejected ones too), access control
    /// (`--allow-uid`), then the size and naming limits.
    public static func standardInterceptors(configuration: BrokerConfiguration, logger: Logger) -> [any RequestInterceptor] {
        [
            RequestLogInterceptor(logger: logger), AccessInterceptor(),
            LimitsInterceptor(maxItemLength: configuration.maxItemLength, maxBatch: configuration.maxBatch),
        ]
    }

    /// Prepares the data directory (creating it with mode 0700 if missing). Engine calls run on `blocking`'s
    /// threads, which the caller stops after `shutdown()`. Without a `sealer`, secure values are refused
    /// (`notSupported`).
    public init(
        configuration: BrokerConfiguration, engines: any EngineProvider, blocking: any BlockingExecutor,
        logger: Logger, interceptors: [any RequestInterceptor]? = nil, sealer: (any ValueSealer)? = nil,
        observers: [any CommitObserver] = []
    ) throws(BrokerError) {
        self.configuration = configuration
        self.interceptors = interceptors ?? Self.standardInterceptors(configuration: configuration, logger: logger)
        self.observers = self.interceptors.filter(\.observesOutcomes)
        self.checkers = self.interceptors.filter(\.checksRequests)
        let directory = DataDirectory(root: configuration.dataDirectory)
        for note in try directory.prepare() { logger.warning("data directory of the first layout: \(note)") }
        try directory.removeLeftovers()
        let environment = StoreEnvironment(
            directory: directory, engines: engines, configuration: configuration, logger: logger, observers: observers,
            writers: blocking)
        self.environment = environment
        values = ValueSpace(namespace: .value, environment: environment, sealer: nil)
        secureValues = ValueSpace(namespace: .secureValue, environment: environment, sealer: sealer)
        try watchSharedStores(logger: logger)
    }

    /// When new stores go to an engine that shares them with other brokers: a watcher that makes this broker
    /// follow every store another broker commits to (docs/DISTRIBUTED.md).
    private func watchSharedStores(logger: Logger) throws(BrokerError) {
        guard let shared = environment.sharedDefaultEngine else { return }
        let watcher = try SharedWatcher(
            engine: shared, options: environment.options(shared), logger: logger,
            changed: { [weak self] name, position in self?.sharedStoreChanged(name, at: position) },
            tick: { [weak self] in self?.retryFailedCatchUps() })
        watchers.withLock { $0.append(watcher) }
        values.preload()
        secureValues.preload()
        logger.info("following the stores engine \(shared.name) shares with other brokers")
    }

    /// Another broker committed to store `name` (nil: to any store), reaching `position` when the engine says so
    /// (a store already there, by its own commit, has nothing to do).
    private func sharedStoreChanged(_ name: String?, at position: Position?) {
        guard !stopping.withLock({ $0 }) else { return }
        guard let name else {
            values.follow()
            secureValues.follow()
            for store in stores.withLock({ Array($0.values) }) { store.follow() }
            return
        }
        switch name {
        case ValueSpace.engineStoreName(.value): return values.follow(reaching: position)
        case ValueSpace.engineStoreName(.secureValue): return secureValues.follow(reaching: position)
        default: break
        }
        // Not a name a store can have: a stranger's.
        guard Naming.problem(withName: name) == nil else { return }
        if let position, let known = stores.withLock({ $0[name] }), known.holds(position) { return }
        store(name).follow()
    }

    private func retryFailedCatchUps() {
        for space in [values, secureValues] where space.catchUpFailed { space.follow() }
        for store in stores.withLock({ Array($0.values) }) where store.catchUpFailed { store.follow() }
    }

    /// Returns once the writer of store `name` is idle (for tests that need a write to find it so).
    func waitUntilWriterIdle(store name: String) async { await store(name).waitUntilWriterIdle() }

    private func store(_ name: String) -> ManagedStore {
        stores.withLock { stores in
            if let store = stores[name] { return store }
            let store = ManagedStore(
                name: name, environment: environment, stopping: stopping.withLock { $0 },
                retire: { [weak self] in self?.retire($0) })
            stores[name] = store
            return store
        }
    }

    /// `store(_:)` for a read of `context`: the store its last read named, if that is the name and the store has not
    /// been retired since, without the table of stores. That table's lock is shared by every connection and its
    /// key is the name's hash: a lookup per read would contend for that lock and hash the name every time.
    private func store(_ name: String, for context: RequestContext) -> ManagedStore {
        let cached = context.lookup.last.withLock { last -> ManagedStore? in
            guard let last, last.broker == identity, last.store.name == name else { return nil }
            return last.store
        }
        if let cached, !cached.isRetired { return cached }
        let found = store(name)
        context.lookup.last.withLock { $0 = StoreLookup.Entry(broker: identity, store: found) }
        return found
    }

    /// Forgets `store` if it holds nothing (a store that does not exist, with nothing queued, subscribed or open):
    /// a client that names a million stores that do not exist leaves nothing behind. Under the table's lock, so
    /// that whoever looks the name up next finds either this store, not yet retired, or a new one.
    private func retire(_ store: ManagedStore) {
        stores.withLock { stores in
            guard stores[store.name] === store, store.retireIfNothingHere() else { return }
            stores[store.name] = nil
        }
    }

    private func valueSpace(_ namespace: Namespace) -> ValueSpace { namespace == .secureValue ? secureValues : values }

    /// Carries out `command` for a peer. A `subscribe` needs the `subscription` its pushes will be queued in.
    /// A read is answered here, with no array of requests around it.
    public func handle(
        _ command: BrokerCommand, context: RequestContext = .owner, subscription: Subscription? = nil,
        reply: Reply
    ) {
        guard !command.isWrite else {
            return handle([BrokerRequest(command, subscription: subscription, reply: reply)], context: context)
        }
        guard !observers.isEmpty else {
            // The reply as it came (`admitted` would return a copy of it, a retain and release per request).
            if let error = rejection(of: command, context: context) { return reply(.failure(error)) }
            return perform(command, context: context, subscription: subscription, reply: reply)
        }
        guard let reply = admitted(command, context: context, reply) else { return }
        perform(command, context: context, subscription: subscription, reply: reply)
    }

    /// `handle(_:context:subscription:reply:)` with a closure for the answer.
    public func handle(
        _ command: BrokerCommand, context: RequestContext = .owner, subscription: Subscription? = nil,
        reply: @escaping @Sendable (Result<BrokerAnswer, BrokerError>) -> Void
    ) {
        handle(command, context: context, subscription: subscription, reply: Reply(reply))
    }

    /// Carries out the requests of one read cycle of a peer, in order. Reads are answered before this returns
    /// (from memory, on the caller's thread) unless their store is still loading; the writes for one store
    /// (or value namespace) reach its writer together, in one hand-off, and are answered after their commit.
    public func handle(_ requests: consuming [BrokerRequest], context: RequestContext = .owner) {
        var batch = WriteBatch()
        var requests = requests  // moved, not shared: the commands are moved out of it without copying the array
        handle(&requests, context: context, into: &batch)
        submit(&batch)
    }

    /// The writes of several peers' read cycles, admitted and waiting to reach their writers together
    /// (`submit(_:)`): a server that hands in everything one turn of its event loop read makes one group commit
    /// of the writes many connections sent, where a submit per connection would make a group of one each.
    public struct WriteBatch: Sendable {
        /// The writes for each store, in first-seen order. Optional: `submit` moves each out, leaving `nil` (a
        /// copy would retain what each holds).
        fileprivate var storeWrites: [(name: String, writes: [PendingWrite?])] = []
        fileprivate var valueWrites: [Namespace: [ValueSpace.Write]] = [:]
        /// Lists of writes that `submit` emptied, their capacity kept for the next batch: a new list per store and
        /// batch would be an allocation large enough (a kilobyte and more) to make glibc consolidate its fast bins
        /// every time.
        fileprivate var spare: [[PendingWrite?]] = []

        public init() {}

        public var isEmpty: Bool { storeWrites.isEmpty && valueWrites.isEmpty }

        /// A read cycle's writes are usually for one store, so the last one's name is compared first and nothing is
        /// hashed per request.
        fileprivate mutating func add(_ write: consuming PendingWrite, to name: String, expected: Int) {
            if let last = storeWrites.indices.last, storeWrites[last].name == name {
                storeWrites[last].writes.append(write)
            } else if let index = storeWrites.firstIndex(where: { $0.name == name }) {
                storeWrites[index].writes.append(write)
            } else {
                var writes = spare.popLast() ?? []
                if writes.capacity < expected { writes.reserveCapacity(expected) }
                writes.append(write)
                storeWrites.append((name, writes))
            }
        }

        /// Keeps an emptied list for a later store (a few: a batch rarely writes to many stores).
        fileprivate mutating func keep(_ emptied: consuming [PendingWrite?]) {
            if spare.count < 4, emptied.capacity <= 1024 { spare.append(emptied) }
        }
    }

    /// `handle(_:context:)` with the writes admitted into `batch` rather than submitted: they reach their writers
    /// with the batch's other writes when it is submitted. Everything else is carried out now.
    /// Each request's command is moved out, on to its store or namespace (a payload-less one is left in its place):
    /// binding it from the array would copy it, a retain and a release of everything it holds.
    public func handle(_ requests: inout [BrokerRequest], context: RequestContext, into batch: inout WriteBatch) {
        let expected = requests.count
        // Each request read in place, through a buffer pointer: binding it to a local, or reading
        // `requests[index]` from the array, copies it.
        requests.withUnsafeMutableBufferPointer { requests in
            for index in requests.indices {
                // Taken out first: checked in the array, it would be copied for the interceptors.
                var command = BrokerCommand.listEngines
                swap(&command, &requests[index].command)
                guard let reply = admitted(command, context: context, requests[index].reply) else { continue }
                switch consume command {
                case .write(let name, let write, let condition):
                    var silenced: ObjectIdentifier?
                    if let subscription = requests[index].subscription, subscription.namespace == .store,
                        subscription.name == name
                    {
                        silenced = ObjectIdentifier(subscription)
                    }
                    batch.add(
                        PendingWrite(
                            kind: .write(write), condition: condition, submitter: context.submitter, silenced: silenced,
                            reply: reply),
                        to: name, expected: expected)
                case .drop(let name, let condition):
                    batch.add(
                        PendingWrite(kind: .drop, condition: condition, submitter: context.submitter, reply: reply),
                        to: name, expected: expected)
                case .setValue(let namespace, let name, let value, let condition):
                    batch.valueWrites[namespace, default: []].append(
                        .init(name: name, value: value?.owned.bytes, condition: condition, reply: reply))
                case let other:
                    perform(other, context: context, subscription: requests[index].subscription, reply: reply)
                }
            }
        }
    }

    /// Hands the writes of `batch` to their writers, one hand-off per store and namespace, and empties it.
    public func submit(_ batch: inout WriteBatch) {
        // In first-seen order, each array moved out (iterating would copy it, and `submit` moves its writes on).
        for index in batch.storeWrites.indices {
            var writes: [PendingWrite?] = []
            swap(&writes, &batch.storeWrites[index].writes)
            // A store retired meanwhile leaves them: to the one the name finds now.
            while !store(batch.storeWrites[index].name).submit(&writes) {}
            batch.keep(writes)
        }
        batch.storeWrites.removeAll(keepingCapacity: true)
        for (namespace, writes) in batch.valueWrites { valueSpace(namespace).submit(writes) }
        batch.valueWrites.removeAll()
    }

    /// The reply for `command` that the observing interceptors see, or `nil` when a checking one refused it (then
    /// it is answered).
    @inline(__always)
    private func admitted(_ command: BrokerCommand, context: RequestContext, _ reply: Reply) -> Reply? {
        let reply = observed(command, context: context, reply)
        if let error = rejection(of: command, context: context) {
            reply(.failure(error))
            return nil
        }
        return reply
    }

    /// The first interceptor's refusal of `command`, if any.
    private func rejection(of command: BrokerCommand, context: RequestContext) -> BrokerError? {
        // By index: `for interceptor in interceptors` copies each one out, a retain and release of what it holds
        // (a logger's handler) that every connection's requests share.
        for index in checkers.indices {
            if let error = checkers[index].check(command, context: context) { return error }
        }
        return nil
    }

    /// `reply`, after every interceptor that observes has seen the outcome and how long it took (`reply` itself
    /// when none does: at the default log level a request costs no clock read and no closure here).
    private func observed(_ command: BrokerCommand, context: RequestContext, _ reply: Reply) -> Reply {
        if observers.isEmpty { return reply }
        let interceptors = observers
        let start = ContinuousClock.now
        return Reply { outcome in
            let duration = ContinuousClock.now - start
            for interceptor in interceptors {
                interceptor.observe(command, context: context, outcome: outcome, duration: duration)
            }
            reply(outcome)
        }
    }

    private func perform(
        _ command: BrokerCommand, context: RequestContext, subscription: Subscription?, reply: Reply
    ) {
        switch command {
        case .listEngines: reply(.success(.engines(environment.engines.engineList())))
        case .listStores:
            environment.tasks.spawn {
                do throws(BrokerError) {
                    let visible = try await self.storeInfos().filter { context.grant.allows($0.name, write: false) }
                    reply(.success(.stores(visible)))
                } catch {
                    reply(.failure(error))
                }
            }
        case .storeInfo(let name): store(name, for: context).info(reply)
        case .count(let name): store(name, for: context).count(reply)
        case .get(let name, let ids): store(name, for: context).items(ids, reply)
        case .range(let name, let after, let limit): store(name, for: context).range(after: after, limit: limit, reply)
        case .ids(let name, let after, let limit): store(name, for: context).ids(after: after, limit: limit, reply)
        case .write, .drop, .setValue:
            preconditionFailure("writes are handed to their writer by handle(_:context:)")
        case .getValue(let namespace, let name): valueSpace(namespace).get(name, reply)
        case .listValues(let namespace):
            valueSpace(namespace).list(readableBy: context.grant, reply)
        case .subscribe(let namespace, let name, let start):
            guard let subscription, subscription.namespace == namespace, subscription.name == name else {
                return reply(.failure(BrokerError(.internalError, "a subscribe reached the broker without its subscription")))
            }
            if namespace == .store {
                while !store(name).subscribe(subscription, start: start, reply) {}  // retired meanwhile: again
            } else {
                valueSpace(namespace).subscribe(subscription, start: start, reply)
            }
        }
    }

    /// The stores of the data directory and, when the default engine shares its stores, those the database holds
    /// that this broker has not seen yet (other brokers created them), in name byte order.
    private func storeNames() async throws(BrokerError) -> [String] {
        let names = try environment.directory.storeNames()
        guard let shared = environment.sharedDefaultEngine else { return names }
        let options = environment.options(shared)
        // A query of the database: on a writer thread, made for blocking calls, not on the task's.
        let listed: Result<[String], BrokerError> = await withCheckedContinuation { continuation in
            environment.onWriter {
                continuation.resume(
                    returning: Result { () throws(BrokerError) in
                        try EnginePlace.engineCall { () throws(EngineFailure) in try shared.storeNames(options: options) }
                    })
            }
        }
        let elsewhere = try listed.get().filter { Naming.problem(withName: $0) == nil }
        return Array(Set(names).union(elsewhere)).sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
    }

    /// Every existing store, in name byte order.
    private func storeInfos() async throws(BrokerError) -> [StoreInfo] {
        var infos: [StoreInfo] = []
        for name in try await storeNames() {
            let store = store(name)
            do throws(BrokerError) {
                try await store.loaded()
            } catch {
                // Listed, and marked: a store that exists but cannot be served has an epoch and sequence 0
                // (docs/PROTOCOL.md); a request on it answers why.
                let manifest = try? environment.directory.manifest(environment.directory.store(name))
                infos.append(
                    StoreInfo(
                        name: name, epoch: manifest?.epoch ?? StoreInfo.unknownEpoch, sequence: 0, count: 0,
                        engine: manifest?.engine ?? ""))
                continue
            }
            let info = store.currentInfo()
            if info.sequence > 0 { infos.append(info) }
        }
        return infos
    }

    /// Ends `subscription`; no push of it is queued afterwards.
    public func unsubscribe(_ subscription: Subscription) {
        switch subscription.namespace {
        case .store:
            let store = stores.withLock { $0[subscription.name] }
            if let store { store.unsubscribe(subscription) } else { subscription.cancel() }
        case .value, .secureValue:
            valueSpace(subscription.namespace).unsubscribe(subscription)
        }
    }

    /// Refuses new writes, finishes the queued ones and closes every engine store; returns once every task the
    /// broker started (loads in flight included, whose engine stores are then closed) has ended.
    public func shutdown() async {
        for watcher in watchers.withLock({ $0 }) { await watcher.stop() }
        let all = stores.withLock { stores in
            stopping.withLock { $0 = true }  // stores made from now on start stopped
            return Array(stores.values)
        }
        await withTaskGroup(of: Void.self) { group in
            for store in all { group.addTask { await store.shutdown() } }
            group.addTask { await self.values.shutdown() }
            group.addTask { await self.secureValues.shutdown() }
        }
        await environment.tasks.waitForAll()
    }
}

/// The store a connection's last read named (`Broker.store(_:for:)`): a connection reads one store, usually, and
/// asking the broker's table for it every time would take a lock every connection shares. Holds one store at
/// most, with the identity of the broker it came from (a context can be used with several brokers in one process:
/// `RequestContext.owner`); a retired one is looked up again.
final class StoreLookup: Sendable {
    struct Entry {
        /// `Broker.identity` (not a reference: a weak one costs an atomic operation on the broker, which every
        /// connection shares, per read).
        let broker: UInt64
        let store: ManagedStore
    }

    let last = Locked<Entry?>(nil)
}
