import Logging
import Synchronization
import Wire

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
    /// Pushes that may wait for one subscriber before it is told it lagged (`--subscriber-buffer`).
    public var subscriberBuffer: Int
    /// The largest item payload (`--max-item`).
    public var maxItemLength: Int
    /// The most items, ids or steps in one request (`--max-batch`).
    public var maxBatch: Int
    /// The most write requests one engine transaction may carry (group commit).
    public var maxGroupCommit: Int

    public init(
        dataDirectory: String, defaultEngine: String = "sqlite", engineOptions: [String: [String: String]] = [:],
        history: Int = 1024, subscriberBuffer: Int = 1024, maxItemLength: Int = 1 << 20, maxBatch: Int = 10_000,
        maxGroupCommit: Int = 512
    ) {
        self.dataDirectory = dataDirectory
        self.defaultEngine = defaultEngine
        self.engineOptions = engineOptions
        self.history = history
        self.subscriberBuffer = subscriberBuffer
        self.maxItemLength = maxItemLength
        self.maxBatch = maxBatch
        self.maxGroupCommit = maxGroupCommit
    }
}

/// Where a broker gets its engines. The daemon implements it with `EngineLoader` (dlopen); tests may hand
/// engines over directly.
public protocol EngineProvider: Sendable {
    /// The engine called `name`, or `engineUnavailable` saying why not.
    func engine(named name: String) throws(WireError) -> any StorageEngine
    /// Every engine the broker could use, for `listEngines`.
    func engineList() -> [EngineInfo]
}

/// The stores of one data directory and the requests on them, with no networking.
///
/// Every method answers through `reply`, once, possibly on another thread and possibly before it returns.
/// Requests are carried out in the order they are submitted per store (writes keep that order in their
/// sequences); reads answer from memory.
public final class Broker: Sendable {
    public let configuration: BrokerConfiguration
    private let environment: StoreEnvironment
    private let stores = Mutex<[String: ManagedStore]>([:])

    /// Prepares the data directory (creating it with mode 0700 if missing).
    public init(configuration: BrokerConfiguration, engines: any EngineProvider, logger: Logger) throws(WireError) {
        self.configuration = configuration
        let directory = DataDirectory(root: configuration.dataDirectory)
        try directory.prepare()
        try directory.removeLeftovers()
        self.environment = StoreEnvironment(
            directory: directory, engines: engines, configuration: configuration, logger: logger)
    }

    private func store(_ name: String) -> ManagedStore {
        stores.withLock { stores in
            if let store = stores[name] { return store }
            let store = ManagedStore(name: name, environment: environment)
            stores[name] = store
            return store
        }
    }

    /// Carries out `request` (anything but `hello`, `subscribe` and `unsubscribe`).
    public func handle(_ request: ClientMessage, reply: @escaping Reply) {
        do throws(WireError) {
            try RequestLimits(configuration).check(request)
        } catch {
            return reply(.failure(error))
        }
        switch request {
        case .ping: reply(.success(.pong(.init())))
        case .listEngines: reply(.success(.engineList(.init(elements: environment.engines.engineList()))))
        case .listStores:
            Task {
                do throws(WireError) {
                    reply(.success(.storeList(.init(elements: try await self.storeInfos()))))
                } catch {
                    reply(.failure(error))
                }
            }
        case .getStoreInfo(let m): store(m.store).info(reply)
        case .count(let m): store(m.store).count(reply)
        case .getItems(let m): store(m.store).items(m.ids, reply)
        case .queryRange(let m): store(m.store).range(after: m.after, limit: m.limit, reply)
        case .listIDs(let m): store(m.store).ids(after: m.after, limit: m.limit, reply)
        case .insert(let m): submit(m.store, .write(.insert(m.items)), m.condition, reply)
        case .remove(let m): submit(m.store, .write(.remove(m.ids)), m.condition, reply)
        case .removeAll(let m): submit(m.store, .write(.removeAll), m.condition, reply)
        case .chain(let m): submit(m.store, .write(.chain(m.steps)), m.condition, reply)
        case .drop(let m): submit(m.store, .drop, m.condition, reply)
        case .getValue, .setValue, .resetValue:
            reply(.failure(WireError(.notSupported, "values and secure values are not supported by this broker yet")))
        case .hello, .subscribe, .unsubscribe:
            reply(.failure(WireError(.unexpectedMessage, "\(request.type.name) is handled by the connection")))
        }
    }

    private func submit(_ name: String, _ kind: PendingWrite.Kind, _ condition: Condition, _ reply: @escaping Reply) {
        store(name).submit(PendingWrite(kind: kind, condition: condition, reply: reply))
    }

    /// Every existing store, in name byte order.
    private func storeInfos() async throws(WireError) -> [StoreInfo] {
        var infos: [StoreInfo] = []
        for name in try environment.directory.storeNames() {
            let store = store(name)
            try await store.loaded()
            let info = store.currentInfo()
            if info.sequence > 0 { infos.append(info) }
        }
        return infos
    }

    /// Starts `subscription` on its store: answered by `subscribed`, its pushes queued in the subscription.
    public func subscribe(_ subscription: Subscription, start: SubscriptionStart, reply: @escaping Reply) {
        guard subscription.namespace == .store else {
            return reply(
                .failure(WireError(.notSupported, "values and secure values are not supported by this broker yet")))
        }
        if let problem = Naming.problem(withName: subscription.name) {
            return reply(.failure(WireError(.invalidName, "invalid store name: \(problem)")))
        }
        store(subscription.name).subscribe(subscription, start: start, reply)
    }

    /// Ends `subscription`; no push of it is queued afterwards.
    public func unsubscribe(_ subscription: Subscription) {
        let store = stores.withLock { $0[subscription.name] }
        if let store { store.unsubscribe(subscription) } else { subscription.cancel() }
    }

    /// Refuses new writes, finishes the queued ones and closes every engine store.
    public func shutdown() async {
        let all = stores.withLock { Array($0.values) }
        await withTaskGroup(of: Void.self) { group in
            for store in all { group.addTask { await store.shutdown() } }
        }
    }
}

extension ClientMessage {
    /// The store a request is about, if any.
    public var storeName: String? {
        switch self {
        case .getStoreInfo(let m): m.store
        case .insert(let m): m.store
        case .remove(let m): m.store
        case .removeAll(let m): m.store
        case .drop(let m): m.store
        case .chain(let m): m.store
        case .getItems(let m): m.store
        case .queryRange(let m): m.store
        case .count(let m): m.store
        case .listIDs(let m): m.store
        case .subscribe(let m): m.namespace == .store ? m.name : nil
        default: nil
        }
    }

    /// Whether the request changes a store or value.
    public var isWrite: Bool {
        switch self {
        case .insert, .remove, .removeAll, .drop, .chain, .setValue, .resetValue: true
        default: false
        }
    }
}
