#if canImport(Glibc)
import Glibc
#endif
import Logging
import NIOCore
import StoreModel

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
    /// The threads for blocking engine calls (`--writer-threads`; the server makes them): a store whose engine
    /// blocks has one job on them per commit group; an idle store holds none.
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
/// The broker's state belongs to one event loop, its owner: requests handed in on another thread go to the owner
/// first, and every `reply` is called there, once, possibly before `handle` returns. Every request passes the
/// interceptor chain, then reaches its store or value namespace. Requests are carried out in the order they are
/// submitted per store (writes keep that order in their sequences); reads answer from memory.
public final class Broker: @unchecked Sendable {
    // `@unchecked Sendable`: the table of stores, `stopping` and the watchers are touched only on the owner.
    public let configuration: BrokerConfiguration
    public let interceptors: [any RequestInterceptor]
    /// The interceptors whose `observe` does something (`observesOutcomes`), in chain order.
    private let observers: [any RequestInterceptor]
    /// The interceptors whose `check` can refuse (`checksRequests`), in chain order.
    private let checkers: [any RequestInterceptor]
    private let environment: StoreEnvironment
    private var stores: [String: ManagedStore] = [:]
    /// Set by `shutdown`.
    private var stopping = false
    private let values: ValueSpace
    private let secureValues: ValueSpace
    /// The watch on the shared engine's stores (ABI 2.1), when the default engine shares them.
    private var watcher: SharedWatcher?

    /// The event loop that owns this broker's state and calls every reply.
    public var owner: any EventLoop { environment.owner }

    /// The built-in chain, in order: request logging (sees every request, rejected ones too), access control
    /// (`--allow-uid`), then the size and naming limits.
    public static func standardInterceptors(configuration: BrokerConfiguration, logger: Logger) -> [any RequestInterceptor] {
        [
            RequestLogInterceptor(logger: logger), AccessInterceptor(),
            LimitsInterceptor(maxItemLength: configuration.maxItemLength, maxBatch: configuration.maxBatch),
        ]
    }

    /// Prepares the data directory (creating it with mode 0700 if missing). `owner` owns the broker's state;
    /// engine calls that block run on `blocking`'s threads, which the caller stops after `shutdown()`. Without a
    /// `sealer`, secure values are refused (`notSupported`).
    public init(
        configuration: BrokerConfiguration, engines: any EngineProvider, owner: any EventLoop,
        blocking: any BlockingExecutor, logger: Logger, interceptors: [any RequestInterceptor]? = nil, sealer: (any ValueSealer)? = nil,
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
            owner: owner, blocking: blocking)
        self.environment = environment
        values = ValueSpace(namespace: .value, environment: environment, sealer: nil)
        secureValues = ValueSpace(namespace: .secureValue, environment: environment, sealer: sealer)
        try watchSharedStores(logger: logger)
    }

    /// When new stores go to an engine that shares them with other brokers: a watcher that makes this broker
    /// follow every store another broker commits to (docs/DISTRIBUTED.md).
    private func watchSharedStores(logger: Logger) throws(BrokerError) {
        guard let shared = environment.sharedDefaultEngine else { return }
        let owner = environment.owner
        watcher = try SharedWatcher(
            engine: shared, options: environment.options(shared), logger: logger,
            changed: { [weak self] name, position in
                owner.execute { [weak self] in self?.sharedStoreChanged(name, at: position) }
            },
            tick: { [weak self] in owner.execute { [weak self] in self?.retryFailedCatchUps() } })
        owner.execute {
            self.values.preload()
            self.secureValues.preload()
        }
        logger.info("following the stores engine \(shared.name) shares with other brokers")
    }

    /// Another broker committed to store `name` (nil: to any store), reaching `position` when the engine says so
    /// (a store already there, by its own commit, has nothing to do).
    private func sharedStoreChanged(_ name: String?, at position: Position?) {
        guard !stopping else { return }
        guard let name else {
            values.follow()
            secureValues.follow()
            for store in stores.values { store.follow() }
            return
        }
        switch name {
        case ValueSpace.engineStoreName(.value): return values.follow(reaching: position)
        case ValueSpace.engineStoreName(.secureValue): return secureValues.follow(reaching: position)
        default: break
        }
        // Not a name a store can have: a stranger's.
        guard Naming.problem(withName: name) == nil else { return }
        if let position, let known = stores[name], known.holds(position) { return }
        store(name).follow()
    }

    private func retryFailedCatchUps() {
        for space in [values, secureValues] where space.catchUpFailed { space.follow() }
        for store in stores.values where store.catchUpFailed { store.follow() }
    }

    /// Returns once the writer of store `name` is idle (for tests that need a write to find it so).
    func waitUntilWriterIdle(store name: String) async {
        await withCheckedContinuation { continuation in
            onOwner { self.store(name).writer.whenIdle { continuation.resume() } }
        }
    }

    private func store(_ name: String) -> ManagedStore {
        if let store = stores[name] { return store }
        let store = ManagedStore(
            name: name, environment: environment, stopping: stopping, retire: { [weak self] in self?.retire($0) })
        stores[name] = store
        return store
    }

    /// Forgets `store` if it holds nothing (a store that does not exist, with nothing queued, subscribed or open):
    /// a client that names a million stores that do not exist leaves nothing behind.
    private func retire(_ store: ManagedStore) {
        guard stores[store.name] === store, store.retireIfNothingHere() else { return }
        stores[store.name] = nil
    }

    /// Runs `body` on the owner: now when called there, else in a task.
    private func onOwner(_ body: @escaping @Sendable () -> Void) {
        if environment.owner.inEventLoop { body() } else { environment.owner.execute(body) }
    }

    private func valueSpace(_ namespace: Namespace) -> ValueSpace { namespace == .secureValue ? secureValues : values }

    /// Carries out `command` for a peer. A `subscribe` needs the `subscription` its pushes will be queued in.
    /// A read is answered here, with no array of requests around it, when called on the owner.
    public func handle(
        _ command: BrokerCommand, context: RequestContext = .owner, subscription: Subscription? = nil,
        reply: Reply
    ) {
        guard environment.owner.inEventLoop else {
            return environment.owner.execute {
                self.handle(command, context: context, subscription: subscription, reply: reply)
            }
        }
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
        guard environment.owner.inEventLoop else {
            let requests = Handover(requests)
            return environment.owner.execute { self.handle(requests.value, context: context) }
        }
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
    /// with the batch's other writes when it is submitted. Everything else is carried out now. On the owner only.
    /// Each request's command is moved out, on to its store or namespace (a payload-less one is left in its place):
    /// binding it from the array would copy it, a retain and a release of everything it holds.
    public func handle(_ requests: inout [BrokerRequest], context: RequestContext, into batch: inout WriteBatch) {
        environment.owner.assertInEventLoop()
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
                        .init(
                            name: name, value: value?.owned.bytes, condition: condition, submitter: context.submitter,
                            reply: reply))
                case let other:
                    perform(other, context: context, subscription: requests[index].subscription, reply: reply)
                }
            }
        }
    }

    /// Hands the writes of `batch` to their writers, one hand-off per store and namespace, and empties it. On the
    /// owner only.
    public func submit(_ batch: inout WriteBatch) {
        environment.owner.assertInEventLoop()
        // In first-seen order, each array moved out (iterating would copy it, and `submit` moves its writes on).
        for index in batch.storeWrites.indices {
            var writes: [PendingWrite?] = []
            swap(&writes, &batch.storeWrites[index].writes)
            store(batch.storeWrites[index].name).submit(&writes)
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
            storeInfos { result in
                reply(result.map { .stores($0.filter { context.grant.allows($0.name, write: false) }) })
            }
        case .storeInfo(let name): store(name).info(reply)
        case .count(let name): store(name).count(reply)
        case .get(let name, let ids): store(name).items(ids, reply)
        case .range(let name, let after, let limit): store(name).range(after: after, limit: limit, reply)
        case .ids(let name, let after, let limit): store(name).ids(after: after, limit: limit, reply)
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
                store(name).subscribe(subscription, start: start, reply)
            } else {
                valueSpace(namespace).subscribe(subscription, start: start, reply)
            }
        }
    }

    /// Every existing store, in name byte order: the stores of the data directory and, when the default engine
    /// shares its stores, those the database holds that this broker has not seen yet (other brokers created them).
    private func storeInfos(_ done: @escaping (Result<[StoreInfo], BrokerError>) -> Void) {
        let directory = environment.directory
        let shared = environment.sharedDefaultEngine
        let options = shared.map { environment.options($0) } ?? [:]
        // A directory listing and a query of the database: blocking work.
        environment.offOwner({
            Result { () throws(BrokerError) -> [String] in
                let names = try directory.storeNames()
                guard let shared else { return names }
                let elsewhere = try EnginePlace.engineCall { () throws(EngineFailure) in
                    try shared.storeNames(options: options)
                }.filter { Naming.problem(withName: $0) == nil }
                return Array(Set(names).union(elsewhere)).sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
            }
        }) { listed in
            switch listed {
            case .failure(let error): done(.failure(error))
            case .success(let names): self.storeInfos(names[...], into: [], done)
            }
        }
    }

    /// The infos of `names`, each store loaded in turn, appended to `infos`.
    private func storeInfos(
        _ names: ArraySlice<String>, into infos: [StoreInfo], _ done: @escaping (Result<[StoreInfo], BrokerError>) -> Void
    ) {
        guard let name = names.first else { return done(.success(infos)) }
        let store = store(name)
        store.writer.whenLoaded { failure in
            var infos = infos
            if failure != nil {
                // Listed, and marked: a store that exists but cannot be served has an epoch and sequence 0
                // (docs/PROTOCOL.md); a request on it answers why.
                let manifest = try? self.environment.directory.manifest(self.environment.directory.store(name))
                infos.append(
                    StoreInfo(
                        name: name, epoch: manifest?.epoch ?? StoreInfo.unknownEpoch, sequence: 0, count: 0,
                        engine: manifest?.engine ?? ""))
            } else {
                let info = store.currentInfo()
                if info.sequence > 0 { infos.append(info) }
            }
            self.storeInfos(names.dropFirst(), into: infos, done)
        }
    }

    /// Ends `subscription`; no push of it is queued afterwards.
    public func unsubscribe(_ subscription: Subscription) {
        onOwner {
            switch subscription.namespace {
            case .store:
                if let store = self.stores[subscription.name] { store.unsubscribe(subscription) } else { subscription.cancel() }
            case .value, .secureValue:
                self.valueSpace(subscription.namespace).unsubscribe(subscription)
            }
        }
    }

    /// Refuses new writes, finishes the queued ones and closes every engine store; returns once every blocking
    /// job the broker started (loads in flight included, whose engine stores are then closed) has come back.
    public func shutdown() async {
        if let watcher { await watcher.stop() }
        let owner = environment.owner
        let closed = owner.makePromise(of: Void.self)
        onOwner {
            self.stopping = true  // stores made from now on start stopped
            var open = self.stores.count + 2
            let jobs = self.environment.jobs
            let one = {
                open -= 1
                if open == 0 { jobs.whenAllEnded { closed.succeed() } }
            }
            for store in self.stores.values { store.writer.shutdown(one) }
            self.values.writer.shutdown(one)
            self.secureValues.writer.shutdown(one)
        }
        try? await closed.futureResult.get()
    }
}
