import DequeModule
import Locking
import Logging
import Synchronization
import StoreModel

/// Where the broker's answers to a peer's requests go: one receiver per peer (a connection), each answer with the
/// token its request was handed in with.
public protocol ReplyReceiver: AnyObject, Sendable {
    /// `result` is consumed: an answer handed on is moved, not copied.
    func receive(_ result: consuming Result<BrokerAnswer, BrokerError>, token: UInt64)
}

/// How the broker answers a request: once, from whatever thread finished it (`reply(result)`).
///
/// A receiver and a token, not a closure: a connection hands every request the same receiver, so handing a
/// request in allocates nothing (a closure capturing the request's slot would be one allocation per request).
/// A closure can still be the receiver (`Reply { result in ... }`).
public struct Reply: Sendable {
    private let receiver: any ReplyReceiver
    private let token: UInt64

    public init(_ receiver: any ReplyReceiver, token: UInt64) {
        self.receiver = receiver
        self.token = token
    }

    public init(_ body: @escaping @Sendable (Result<BrokerAnswer, BrokerError>) -> Void) {
        self.init(ClosureReceiver(body), token: 0)
    }

    public func callAsFunction(_ result: consuming Result<BrokerAnswer, BrokerError>) {
        receiver.receive(result, token: token)
    }

    private final class ClosureReceiver: ReplyReceiver {
        let body: @Sendable (Result<BrokerAnswer, BrokerError>) -> Void
        init(_ body: @escaping @Sendable (Result<BrokerAnswer, BrokerError>) -> Void) { self.body = body }
        func receive(_ result: consuming Result<BrokerAnswer, BrokerError>, token: UInt64) { body(result) }
    }
}

/// A write waiting for the store's writer.
struct PendingWrite: QueuedWrite {
    enum Kind: Sendable {
        case write(WriteOperation)
        case drop

        /// How many items the write inserts (repeats counted).
        var insertedItemCount: Int {
            switch self {
            case .write(let operation): operation.insertedItemCount
            case .drop: 0
            }
        }
    }

    var kind: Kind
    var condition: Condition
    /// Who handed the write in (`RequestContext.submitter`).
    var submitter: UInt64
    /// The subscription not offered this write's event (`BrokerRequest.subscription`): its client applies the
    /// write itself.
    var silenced: ObjectIdentifier? = nil
    var reply: Reply
}

/// What every store of a broker shares.
struct StoreEnvironment: Sendable {
    let directory: DataDirectory
    let engines: any EngineProvider
    let configuration: BrokerConfiguration
    let logger: Logger
    var observers: [any CommitObserver] = []
    /// The threads writers run on.
    let writers: any BlockingExecutor
    /// Commit groups a writer job makes before it lets other places' jobs have its thread.
    static let groupsPerTurn = 16
    /// Every task and writer job the broker's stores and namespaces start; shutdown waits for them all.
    var tasks = TaskTracker()

    /// Runs `job` on the writer pool, counted until it returns.
    func onWriter(_ job: @escaping @Sendable () -> Void) { tasks.run(on: writers, job) }
}

/// One store: its committed items in memory, its writer, its history and its subscribers.
///
/// The store is the only writer of its engine store. Writes queue in `pending` in the order they were
/// submitted (a connection hands in all the writes one read cycle produced for the store at once); the
/// store's writer, one job at a time on the broker's writer pool, takes them in groups, plans each against the
/// committed items plus the effects of those before it (`WritePlanner`), calls the engine synchronously with
/// one transaction for the whole group and, once the engine has committed, publishes: memory and history
/// change under the lock, in O(items changed). Then, outside the lock, it broadcasts the commits (one shared
/// push per commit for every subscriber, then the observers) and answers the group. Reads take the lock only
/// to copy what they answer, from the event loop, so they never wait for the engine.
///
/// When applies are slow (an `fsync`), the writer waits a little before a group for the writers its last group
/// answered, so that writers waiting for each acknowledgement share commits (`GroupGathering`).
///
/// A store that does not exist and has nothing going on (no queued write, no subscriber, nothing open) is let go
/// of (`retire`): the broker keeps no object per name a client merely asked about. A retired store still answers
/// the reads that reached it (as a store that does not exist, which it was when they looked it up), and sends the
/// writes and subscriptions that reach it back to the broker, which looks the name up again.
final class ManagedStore: Sendable {
    let name: String
    private let environment: StoreEnvironment
    private let state: Locked<State>
    /// Asks the broker to let go of this store if there is nothing in it (`retireIfNothingHere()`).
    private let retire: @Sendable (ManagedStore) -> Void
    /// Wakes the writer waiting to gather a group (`GroupGathering`).
    private let doorbell = Doorbell()
    /// `State.retired`, readable without the lock.
    private let retiredFlag = Atomic<Bool>(false)
    /// The configuration's figures the writer reads for every group, copied out once: reading one through
    /// `environment.configuration` copies the whole configuration (its strings and engine options retained and
    /// released), and the writer reads them several times per commit.
    private let limits: CommitLimits

    private struct CommitLimits {
        let maxGroupCommit: Int
        let maxGroupWaitNanoseconds: UInt64
        let history: Int
        let historyBytes: Int
        let clock: WallClock

        init(_ configuration: BrokerConfiguration) {
            clock = configuration.clock
            maxGroupCommit = configuration.maxGroupCommit
            maxGroupWaitNanoseconds = UInt64(configuration.maxGroupWait / .nanoseconds(1))
            history = configuration.history
            historyBytes = configuration.historyBytes
        }
    }

    private enum Phase {
        case unloaded, loading, ready
    }

    private struct State: WriterState {
        var phase = Phase.unloaded
        var waiting: [@Sendable (BrokerError?) -> Void] = []
        var contents = StoreContents()
        /// 0 while the store does not exist.
        var epoch: UInt64 = 0
        /// 0 while the store does not exist; +1 per commit.
        var sequence: UInt64 = 0
        var manifest: Manifest?
        var engine: (any StorageEngine)? {
            didSet { capabilities = engine?.capabilities }
        }
        /// `engine`'s capabilities, asked on every submit and group without copying the engine out (a retain
        /// and release of an object every event loop touches).
        private(set) var capabilities: EngineCapabilities?
        var engineStore: (any EngineStore)?
        /// The last events, oldest first, within `--history` commits and `--history-bytes`.
        var history = EventHistory()
        var subscribers: [ObjectIdentifier: Subscription] = [:]
        var pending = Deque<PendingWrite>()
        var writing = false
        var stopping = false
        var idleWaiters: [CheckedContinuation<Void, Never>] = []
        var gathering = GroupGathering()
        /// Subscriptions on their way in (admitted, waiting for the load).
        var arriving = 0
        /// Let go of by the broker: writes and subscriptions go back to it.
        var retired = false
        /// A shared store: another broker may have committed (its watcher said so); the writer catches up.
        var catchUpWanted = false
        /// The last catch-up failed (the database unreachable): the watcher asks again.
        var catchUpFailed = false

        /// The store does not exist, nothing of it is open and nothing waits: nothing would be lost by letting go
        /// of it.
        var holdsNothing: Bool {
            phase == .ready && sequence == 0 && manifest == nil && engineStore == nil && pending.isEmpty && !writing
                && subscribers.isEmpty && arriving == 0 && waiting.isEmpty && idleWaiters.isEmpty && !stopping
                && !catchUpWanted
        }

        mutating func markLoadFailed() { phase = .unloaded }

        var info: (epoch: UInt64, sequence: UInt64) { (epoch, sequence) }
        var position: Position { Position(epoch: epoch, sequence: sequence) }
    }

    /// `stopping`: created during shutdown (a request that arrived late): it refuses writes from the start.
    /// `retire`: called when the store may hold nothing (the broker then calls `retireIfNothingHere()`).
    init(
        name: String, environment: StoreEnvironment, stopping: Bool = false,
        retire: @escaping @Sendable (ManagedStore) -> Void = { _ in }
    ) {
        self.name = name
        self.environment = environment
        limits = CommitLimits(environment.configuration)
        self.retire = retire
        var state = State()
        state.stopping = stopping
        self.state = Locked(state)
    }

    private var logger: Logger {
        var logger = environment.logger
        logger[metadataKey: "store"] = "\(name)"
        return logger
    }

    // MARK: Loading

    /// Runs `body` once the store is loaded (at once if it is), with the error if it cannot be.
    func whenLoaded(_ body: @escaping @Sendable (BrokerError?) -> Void) {
        enum Action { case run, wait, load }
        let action = state.withLock { state -> Action in
            switch state.phase {
            case .ready: return .run
            case .loading:
                state.waiting.append(body)
                return .wait
            case .unloaded:
                state.waiting.append(body)
                state.phase = .loading
                return .load
            }
        }
        switch action {
        case .run: body(nil)
        case .wait: break
        case .load: environment.onWriter { self.load() }
        }
    }

    /// Waits until the store is loaded.
    func loaded() async throws(BrokerError) {
        let failure: BrokerError? = await withCheckedContinuation { continuation in
            whenLoaded { continuation.resume(returning: $0) }
        }
        if let failure { throw failure }
    }

    private var place: EnginePlace {
        EnginePlace(environment: environment, place: environment.directory.store(name), storeName: name)
    }

    private func load() {
        do throws(BrokerError) {
            var contents = StoreContents()
            let loaded = try place.load(expect: { contents.reserveCapacity($0) }, visit: { contents.load($0) })
            let sequence = loaded?.position?.sequence ?? loaded?.store.openedSequence ?? 0
            if let loaded {
                logger.debug(
                    "store loaded",
                    metadata: ["engine": "\(loaded.engine.name)", "items": "\(contents.count)", "sequence": "\(sequence)"])
            }
            let (waiting, late) = state.withLock { state in
                state.contents = contents
                state.sequence = sequence
                // A store whose directory exists but that never committed (a crash between the two) does not
                // exist yet; its first commit keeps the manifest's epoch.
                state.epoch = sequence > 0 ? (loaded?.position?.epoch ?? loaded?.manifest.epoch ?? 0) : 0
                state.manifest = loaded?.manifest
                state.engine = loaded?.engine
                // Loaded after shutdown began: readers are answered, but the engine store is closed now (shutdown
                // already closed the others and waits for this task).
                state.engineStore = state.stopping ? nil : loaded?.store
                state.phase = .ready
                defer { state.waiting = [] }
                return (state.waiting, state.stopping ? loaded?.store : nil)
            }
            late?.close()
            for body in waiting { body(nil) }
            startWriterIfNeeded()
        } catch {
            logger.error("cannot load store: \(error.message)", metadata: error.logMetadata)
            // An unconditional drop queued behind the failure is the way out for an operator: writes before it
            // fail with the error, the store is deleted without being loaded, and what follows starts afresh.
            let (before, drop) = state.withLock { state -> ([PendingWrite], PendingWrite?) in
                guard let index = state.pending.firstIndex(where: { write in
                    if case .drop = write.kind, case .unconditional = write.condition { return true }
                    return false
                }) else { return ([], nil) }
                let before = Array(state.pending.prefix(index))
                let drop = state.pending[index]
                state.pending.removeFirst(index + 1)
                return (before, drop)
            }
            guard let drop else { return state.failLoad(error) }
            for write in before { write.reply(.failure(error)) }
            do throws(BrokerError) {
                try place.dropBroken()
            } catch {
                logger.error("drop of a store that cannot be loaded failed: \(error.message)", metadata: error.logMetadata)
                drop.reply(.failure(error))
                return state.failLoad(error)
            }
            logger.notice("store dropped without loading it")
            drop.reply(.success(.written(CommitResult(committed: true, epoch: 0, sequence: 0))))
            load()
        }
    }

    // MARK: Reads

    /// Answers from the committed state once loaded.
    private func read(
        _ reply: Reply,
        _ body: @escaping @Sendable (borrowing StoreContents, Position) -> Result<BrokerAnswer, BrokerError>
    ) {
        // A loaded store (nearly always) is read in one acquisition of its lock, not one to see that it is loaded
        // and another to read: every reader and the writer's publishing contend for that lock.
        let (answered, absent) = state.withLock { state -> (Result<BrokerAnswer, BrokerError>?, Bool) in
            guard state.phase == .ready else { return (nil, false) }
            return (body(state.contents, Position(epoch: state.epoch, sequence: state.sequence)), state.sequence == 0)
        }
        if let answered {
            reply(answered)
            if absent { retire(self) }
            return
        }
        whenLoaded { failure in
            if let failure { return reply(.failure(failure)) }
            let (answer, absent) = self.state.withLock {
                (body($0.contents, Position(epoch: $0.epoch, sequence: $0.sequence)), $0.sequence == 0)
            }
            reply(answer)
            if absent { self.retire(self) }
        }
    }

    /// Marks the store retired if it holds nothing (`State.holdsNothing`); true when it did. The broker calls it
    /// with its table of stores locked, and forgets the store when it returns true.
    func retireIfNothingHere() -> Bool {
        state.withLock { state in
            guard !state.retired, state.holdsNothing else { return false }
            state.retired = true
            retiredFlag.store(true, ordering: .releasing)
            return true
        }
    }

    /// Whether the broker has let go of this store (`retireIfNothingHere()`): a connection's cached lookup
    /// (`StoreLookup`) then looks the name up again.
    var isRetired: Bool { retiredFlag.load(ordering: .acquiring) }

    func info(_ reply: Reply) {
        whenLoaded { failure in
            if let failure { return reply(.failure(failure)) }
            let info = self.currentInfo()
            reply(.success(.storeInfo(info)))
            if info.sequence == 0 { self.retire(self) }
        }
    }

    /// The store's info; call only when loaded.
    func currentInfo() -> StoreInfo {
        state.withLock { state in
            StoreInfo(
                name: name, epoch: state.epoch, sequence: state.sequence, count: UInt64(state.contents.count),
                engine: state.sequence > 0 ? (state.manifest?.engine ?? "") : "")
        }
    }

    func count(_ reply: Reply) {
        read(reply) { contents, position in
            .success(.count(position, UInt64(contents.count)))
        }
    }

    func items(_ ids: [ItemID], _ reply: Reply) {
        read(reply) { contents, position in
            let slots = ids.map { id in contents.record(id).map(ItemSlot.present) ?? .missing(id) }
            return .success(.items(position, slots))
        }
    }

    func range(after cursor: ItemID?, limit: UInt32, _ reply: Reply) {
        read(reply) { contents, position in
            guard let records = contents.records(after: cursor, limit: Int(limit)) else {
                return .failure(Self.cursorGone(cursor, store: self.name))
            }
            return .success(.records(position, records))
        }
    }

    func ids(after cursor: ItemID?, limit: UInt32, _ reply: Reply) {
        read(reply) { contents, position in
            guard let ids = contents.ids(after: cursor, limit: Int(limit)) else {
                return .failure(Self.cursorGone(cursor, store: self.name))
            }
            return .success(.ids(position, ids))
        }
    }

    private static func cursorGone(_ cursor: ItemID?, store: String) -> BrokerError {
        BrokerError(
            .cursorGone,
            "the cursor id \((cursor?.string ?? "").debugDescription) is no longer in store \(store); "
                + "start again from the beginning")
    }

    // MARK: Subscriptions

    /// Registers `subscription`: a snapshot, or the events after a resume point, or `historyGone` and a
    /// snapshot; then every event. The pushes are queued before the answer is given. False, and nothing done, when
    /// the store is retired: the broker looks it up again.
    func subscribe(_ subscription: Subscription, start: SubscriptionStart, _ reply: Reply) -> Bool {
        let admitted = state.withLock { state in
            guard !state.retired else { return false }
            state.arriving += 1
            return true
        }
        guard admitted else { return false }
        whenLoaded { failure in
            if let failure {
                self.state.withLock { $0.arriving -= 1 }
                return reply(.failure(failure))
            }
            self.state.withLock { state in
                state.arriving -= 1
                switch start {
                case .snapshot:
                    Self.offerSnapshot(state, to: subscription)
                case .resume(let epoch, let sequence):
                    if epoch == state.epoch, sequence == state.sequence {
                        break  // nothing missed
                    } else if epoch == state.epoch, epoch != 0, sequence < state.sequence,
                        let oldest = state.history.oldestSequence, oldest <= sequence + 1
                    {
                        for event in state.history.events where event.sequence > sequence {
                            subscription.offer(.storeEvent(event), at: event.position, force: true)
                        }
                    } else {
                        subscription.offer(.historyGone(state.position), at: state.position, force: true)
                        Self.offerSnapshot(state, to: subscription)
                    }
                }
                state.subscribers[ObjectIdentifier(subscription)] = subscription
            }
            reply(.success(.subscribed(subscriptionID: subscription.id)))
        }
        return true
    }

    private static func offerSnapshot(_ state: borrowing State, to subscription: Subscription) {
        subscription.offer(.storeLoaded(state.position, state.contents.records), at: state.position, force: true)
    }

    func unsubscribe(_ subscription: Subscription) {
        let absent = state.withLock { state in
            state.subscribers.removeValue(forKey: ObjectIdentifier(subscription))
            return state.sequence == 0
        }
        subscription.cancel()
        if absent { retire(self) }
    }

    /// After a commit, outside the lock and in sequence order: each push goes to every subscriber (its
    /// encoding made once, shared) but the one `silenced` names for it, if any (empty: none for any push), then
    /// the commits to the observers (D-Bus); subscribers that lagged or went away are forgotten. No shared push
    /// is made for a commit whose only subscriber is the silenced one.
    private func broadcast(
        _ pushes: @autoclosure () -> [(Push, Position)], to subscribers: [Subscription], commits: [Commit],
        silenced: [ObjectIdentifier?] = []
    ) {
        var ended: [ObjectIdentifier] = []
        // A store followed by one mirror that made every write of the group itself (`RemoteStore`): no push is
        // made at all, not even the list of them.
        let onlySilenced =
            subscribers.count == 1 && !silenced.isEmpty
            && silenced.allSatisfy { $0 == ObjectIdentifier(subscribers[0]) }
        if !subscribers.isEmpty, !onlySilenced {
            for (index, (push, position)) in pushes().enumerated() {
                let quiet = silenced.isEmpty ? nil : silenced[index]
                if let quiet, subscribers.count == 1, ObjectIdentifier(subscribers[0]) == quiet { continue }
                let shared = SharedPush(push)
                for subscription in subscribers where ObjectIdentifier(subscription) != quiet {
                    if !subscription.offer(shared, at: position) { ended.append(ObjectIdentifier(subscription)) }
                }
            }
        }
        for observer in environment.observers {
            for commit in commits {
                observer.storeCommitted(store: name, epoch: commit.epoch, sequence: commit.sequence, steps: commit.steps)
            }
        }
        if !ended.isEmpty {
            let absent = state.withLock { state in
                for key in ended { state.subscribers.removeValue(forKey: key) }
                return state.sequence == 0
            }
            if absent { retire(self) }
        }
    }

    // MARK: Writes

    /// Queues writes, in order; each is answered once committed (or refused). The server hands in every write
    /// one turn of an event loop read for this store, from all its connections, in one call (`Broker.WriteBatch`):
    /// one lock, at most one wake-up of the writer, one group.
    ///
    /// When the store's engine never blocks (`nonblocking`, the memory engine), its store is open and its
    /// writer idle, the first group is committed here, on the caller's thread (the connection's event loop),
    /// as Redis does: no hand-off to a writer thread and back. What queues meanwhile goes to the writer pool.
    ///
    /// Each write is moved into the queue and `writes` emptied, its capacity kept for the caller's next batch
    /// (`append(contentsOf:)` would copy each).
    ///
    /// Returns false, the writes untouched, when the store is retired: the broker hands them to the store it looks
    /// up again.
    func submit(_ writes: inout [PendingWrite?]) -> Bool {
        enum Next { case retired, refused, queued, commitHere }
        var completesGroup = false
        let hasDrop = writes.withUnsafeBufferPointer { writes in
            var hasDrop = false
            for index in writes.indices { if case .drop? = writes[index]?.kind { hasDrop = true } }
            return hasDrop
        }
        let next = state.withLock { state -> Next in
            guard !state.retired else { return .retired }
            guard !state.stopping else { return .refused }
            // The writes of one connection, or of several that one turn of an event loop read (each run of one
            // submitter is told to the gathering once).
            var lastSubmitter: UInt64?
            for index in writes.indices {
                var write: PendingWrite?
                swap(&write, &writes[index])
                let submitter = write!.submitter
                state.pending.append((consume write)!)
                if submitter != lastSubmitter {
                    lastSubmitter = submitter
                    if state.gathering.submitted(by: submitter) { completesGroup = true }
                }
            }
            // A drop (files removed) and a store's creation (directory, manifest) touch the disk: the pool's.
            guard state.phase == .ready, !state.writing, state.engineStore != nil,
                state.capabilities?.contains(.nonblocking) == true, !hasDrop
            else { return .queued }
            state.writing = true
            return .commitHere
        }
        if completesGroup { doorbell.ring() }
        switch next {
        case .retired:
            return false
        case .refused:
            let error = BrokerError(.shuttingDown, "the broker is shutting down")
            for index in writes.indices { writes[index]?.reply(.failure(error)) }
        case .commitHere:
            runWriter(groups: StoreEnvironment.groupsPerTurn, itemBudget: Self.inlineItems)
        case .queued:
            whenLoaded { failure in
                if failure == nil { self.startWriterIfNeeded() }
                // On failure `load()` has already answered every pending write.
            }
        }
        writes.removeAll(keepingCapacity: true)
        return true
    }

    private func startWriterIfNeeded() {
        let start = state.withLock { state -> Bool in
            guard state.phase == .ready, !state.writing, !state.pending.isEmpty || state.catchUpWanted else { return false }
            state.writing = true
            return true
        }
        if start { environment.onWriter { self.runWriter(groups: StoreEnvironment.groupsPerTurn) } }
    }

    private enum Batch {
        case group([PendingWrite])
        case drop(PendingWrite)
    }

    /// Items an event loop commits for a nonblocking engine before what queued meanwhile goes to the writer pool.
    /// Writes that other connections (other loops) queue while a loop commits are committed by that loop too,
    /// group after group: waking a writer thread that hands each answer back would put a thread hand-off in
    /// every waiting client's round trip; the budget keeps one loop from committing for long while its own
    /// connections wait (a group of large batches goes to the pool).
    static let inlineItems = 4096

    /// The writer's job: commits what is queued, group after group, until the queue is empty (the store then
    /// holds no thread), it has made `groups` groups, or the groups' items have reached `itemBudget` (the rest
    /// goes to the writer pool, behind the other stores' jobs).
    private func runWriter(groups: Int, itemBudget: Int = .max) {
        var items = 0
        var leftovers = Leftovers()
        for _ in 0..<groups where items < itemBudget {
            let (gathered, catchUp) = gatherGroup()
            if catchUp { HandOffs.gathering { catchUpReporting(leaving: &leftovers) } }
            guard gathered else { break }
            let batch = state.withLock { state -> Batch? in
                // Taken off the queue, not read from it: a read of `first` is a copy.
                guard let first = state.pending.popFirst() else { return nil }
                if case .drop = first.kind { return .drop(consume first) }
                state.pending.prepend(consume first)
                // An engine without atomic applies gets one request per transaction.
                let atomic = state.capabilities?.contains(.atomic) ?? true
                let limit = atomic ? max(1, limits.maxGroupCommit) : 1
                var group: [PendingWrite] = []
                group.reserveCapacity(min(limit, state.pending.count))
                while group.count < limit, let next = state.pending.popFirst() {
                    if case .drop = next.kind {
                        state.pending.prepend(consume next)
                        break
                    }
                    group.append(consume next)  // moved: without `consume` the optimizer copies it (two retains)
                }
                return .group(group)
            }
            guard let batch else { break }
            // What the commit gives each connection (events, answers) is handed to it at once, after it.
            HandOffs.gathering {
                switch batch {
                case .group(let writes):
                    writes.withUnsafeBufferPointer { writes in
                        for index in writes.indices { items += max(1, writes[index].kind.insertedItemCount) }
                    }
                    commit(writes, leaving: &leftovers)
                    leftovers.groups.append(writes)
                case .drop(let write): drop(write)
                }
            }
        }
        if state.writerGoesOn() {
            environment.onWriter { self.runWriter(groups: StoreEnvironment.groupsPerTurn) }
        } else if state.withLock({ $0.sequence == 0 }) {
            retire(self)  // writes that created nothing, or a drop
        }
        // Released here, once the next turn can start (on another loop or writer thread), not inside the turn.
        withExtendedLifetime(leftovers) {}
    }

    /// What a writer's turn let go of: the items its commits replaced or removed, the events history evicted, the
    /// engine's steps and the groups it answered. Released when the turn is over, off the serial path the next
    /// group waits on (released inside the commit, every release would lengthen that path). A turn is bounded
    /// (`StoreEnvironment.groupsPerTurn` groups), and so is this.
    private struct Leftovers {
        var contents = StoreContents.Released()
        var events: [Commit] = []
        var steps: [[EngineStep]] = []
        var groups: [[PendingWrite]] = []
    }

    /// Before a group: `gathered` false when nothing is queued. Otherwise, on a writer thread, waits a little for
    /// the writers the last group answered when its apply was slow (`GroupGathering`); never where the engine
    /// commits on the event loop (`nonblocking`). `catchUp`: a shared store's writer is to take other brokers'
    /// commits in first (read under the same lock: no second one per group).
    private func gatherGroup() -> (gathered: Bool, catchUp: Bool) {
        let maximum = limits.maxGroupWaitNanoseconds
        enum Next { case nothingQueued, go, wait(UInt64) }
        let (next, catchUp) = state.withLock { state -> (Next, Bool) in
            let catchUp = state.catchUpWanted
            state.catchUpWanted = false
            guard !state.pending.isEmpty else { return (.nothingQueued, catchUp) }
            guard !state.stopping, state.pending.count < limits.maxGroupCommit,
                let capabilities = state.capabilities, !capabilities.contains(.nonblocking)
            else { return (.go, catchUp) }
            doorbell.reset()
            return (state.gathering.beginWait(maximum: maximum).map(Next.wait) ?? .go, catchUp)
        }
        switch next {
        case .nothingQueued: return (false, catchUp)
        case .go: return (true, catchUp)
        case .wait(let nanoseconds):
            doorbell.wait(nanoseconds: nanoseconds)
            state.withLock { $0.gathering.endWait() }
            return (true, catchUp)
        }
    }

    private enum Outcome {
        case failed(BrokerError)
        case unchanged(epoch: UInt64, sequence: UInt64)
        case committed(sequence: UInt64)
    }

    private func conflict(_ condition: Condition, epoch: UInt64, sequence: UInt64) -> BrokerError? {
        let holds: Bool
        switch condition {
        case .unconditional: holds = true
        case .sequence(let expected): holds = expected == sequence
        case .absent: holds = sequence == 0
        case .epochSequence(let expectedEpoch, let expected): holds = expectedEpoch == epoch && expected == sequence
        }
        if holds { return nil }
        let now = sequence == 0 ? "does not exist" : "is at sequence \(sequence) (epoch \(epoch))"
        return BrokerError(.conflict, "store \(name) \(now); the write expected \(Self.describe(condition))")
    }

    private static func describe(_ condition: Condition) -> String {
        switch condition {
        case .unconditional: "nothing"
        case .sequence(let sequence): "sequence \(sequence)"
        case .absent: "that it does not exist"
        case .epochSequence(let epoch, let sequence): "sequence \(sequence) in epoch \(epoch)"
        }
    }

    /// The engine this store uses (the default engine for a store not created yet).
    private func resolveEngine() throws(BrokerError) -> any StorageEngine {
        if let engine = state.withLock({ $0.engine }) { return engine }
        return try environment.engines.engine(named: environment.configuration.defaultEngine)
    }

    /// Other brokers' commits a group may lose to, in a row, before its writes fail: each loss means another
    /// broker committed, so the brokers as a whole move on.
    static let sharedAttempts = 64

    private func commit(_ writes: [PendingWrite], leaving leftovers: inout Leftovers, attempt: Int = 1) {
        let engine: any StorageEngine
        do throws(BrokerError) {
            engine = try resolveEngine()
        } catch {
            for write in writes { write.reply(.failure(error)) }
            return
        }
        let atomic = engine.capabilities.contains(.atomic)
        let now = limits.clock.milliseconds()

        // Plan every request against the committed items plus the requests before it. Only this writer changes
        // the committed state, so it is planned against outside the lock: submitters and readers wait only for
        // the copy below and for the apply after the commit, never for planning.
        var items = 0
        var lastItems = 0
        // Writes, commits and steps are read through buffer pointers: `array[index].field` can copy the whole
        // element first (a retain and release of all it holds), a buffer pointer's element is read in place.
        writes.withUnsafeBufferPointer { writes in
            for index in writes.indices {
                lastItems = writes[index].kind.insertedItemCount
                items += lastItems
            }
        }
        let (committed, base, manifestEpoch) = state.withLock { ($0.contents, $0.info, $0.manifest?.epoch) }
        // Many single inserts: their ids' entries fetched from memory together before the planner looks them up
        // one by one (a batch does this for its own items).
        if writes.count > 1 {
            var hashes: [Int] = []
            hashes.reserveCapacity(writes.count)
            writes.withUnsafeBufferPointer { writes in
                for index in writes.indices {
                    if case .write(.insert(let items)) = writes[index].kind, items.count == 1 {
                        hashes.append(items[0].id.tableHash)
                    }
                }
            }
            if hashes.count > 1 { hashes.withUnsafeBufferPointer { committed.warm($0) } }
        }
        var epoch = base.epoch
        var sequence = base.sequence
        var outcomes: [Outcome] = []
        outcomes.reserveCapacity(writes.count)
        // The commits made, in order, built as they are planned (each request's events are moved in once), and
        // for each, the subscription it is not offered to (only once a write names one: usually none is kept).
        var commits: [Commit] = []
        commits.reserveCapacity(writes.count)
        var silenced: [ObjectIdentifier?] = []
        let steps: [EngineStep]
        let insertHints: [StoreContents.InsertHint]
        do {
            // Moved in (a copy would retain the table's storages once more, objects both event loops touch).
            var planner = WritePlanner(base: consume committed, items: items, remembered: items - lastItems)
            writes.withUnsafeBufferPointer { writes in
                for index in writes.indices {
                    guard case .write(let operation) = writes[index].kind else {
                        preconditionFailure("drops are not grouped")
                    }
                    if let conflict = conflict(writes[index].condition, epoch: epoch, sequence: sequence) {
                        outcomes.append(.failed(conflict))
                        continue
                    }
                    // One operation is atomic whatever the engine; a chain of several is not without SB_CAP_ATOMIC.
                    if case .chain(let chained) = operation, chained.count > 1, !atomic {
                        outcomes.append(
                            .failed(
                                BrokerError(
                                    .notSupported,
                                    "engine \(engine.name) cannot apply a chain atomically, so store \(name) refuses "
                                        + "chains")))
                        continue
                    }
                    guard let events = planner.plan(operation, now: now, last: index == writes.count - 1) else {
                        outcomes.append(.unchanged(epoch: epoch, sequence: sequence))
                        continue
                    }
                    if sequence == 0 { epoch = manifestEpoch ?? Manifest.newEpoch() }
                    sequence += 1
                    outcomes.append(.committed(sequence: sequence))
                    if let quiet = writes[index].silenced {
                        if silenced.isEmpty { silenced = Array(repeating: nil, count: commits.count) }
                        silenced.append(quiet)
                    } else if !silenced.isEmpty {
                        silenced.append(nil)
                    }
                    commits.append(Commit(epoch: epoch, sequence: sequence, steps: events))
                }
            }
            steps = planner.engineSteps
            insertHints = planner.insertHints
        }
        // The planner and its copy of the committed items are gone: the apply below changes them in place.
        let finalSequence = sequence

        guard finalSequence != base.sequence else {
            answer(writes, outcomes, epoch: epoch)
            return
        }
        // The apply alone (not a new store's creation) tells whether the next group is worth gathering.
        var applyTook: UInt64 = 0
        do throws(BrokerError) {
            let store = try engineStore(engine, epoch: epoch)
            let applyStarted = monotonicNanoseconds()
            if EnginePlace.isShared(engine), let shared = store as? any SharedEngineStore {
                // Committed only if no other broker committed since the position planned against.
                let records = commits.map { (sequence: $0.sequence, record: CommitRecord.encode($0.steps)) }
                try EnginePlace.engineCall { () throws(EngineFailure) in
                    try shared.apply(
                        steps, at: Position(epoch: base.epoch, sequence: base.sequence), epoch: epoch, commits: records)
                }
            } else {
                try EnginePlace.engineCall { () throws(EngineFailure) in
                    try store.apply(steps, sequence: finalSequence)
                }
            }
            applyTook = monotonicNanoseconds() - applyStarted
        } catch where (error.underlying as? EngineFailure)?.code == .conflict && attempt < Self.sharedAttempts {
            // Another broker committed first: take its commits in, then plan the same writes again.
            logger.debug("lost a commit to another broker; catching up", metadata: ["attempt": "\(attempt)"])
            catchUpReporting(leaving: &leftovers)
            return commit(writes, leaving: &leftovers, attempt: attempt + 1)
        } catch {
            logger.error(
                "commit failed, nothing changed: \(error.message)",
                metadata: error.logMetadata.merging(["requests": "\(writes.count)"]) { $1 })
            let failed = outcomes.map { outcome -> Outcome in
                switch outcome {
                case .failed: outcome
                case .unchanged: .unchanged(epoch: base.epoch, sequence: base.sequence)
                case .committed: .failed(error)
                }
            }
            answer(writes, failed, epoch: base.epoch)
            return
        }

        state.recordFirstCommit(in: place)

        // Committed: memory and history, in sequence order, under the lock; then the broadcast and the answers.
        // What they let go of is released after the writer's turn (`Leftovers`), the engine's steps with it.
        let limits = self.limits
        let subscribers = state.withLock { state in
            var nextHint = 0
            commits.withUnsafeBufferPointer { commits in
                for index in commits.indices {
                    state.contents.apply(
                        commits[index].steps, hints: insertHints, from: &nextHint, released: &leftovers.contents)
                    state.history.append(
                        commits[index], maxCount: limits.history, maxBytes: limits.historyBytes,
                        evicted: &leftovers.events)
                }
            }
            state.epoch = epoch
            state.sequence = finalSequence
            state.gathering.committed(writes, applyTook: applyTook, queued: state.pending)
            return Array(state.subscribers.values)
        }
        broadcast(
            commits.map { (.storeEvent($0), $0.position) }, to: subscribers, commits: commits, silenced: silenced)
        answer(writes, outcomes, epoch: epoch)
        leftovers.steps.append(steps)
    }

    private func answer(_ writes: [PendingWrite], _ outcomes: [Outcome], epoch: UInt64) {
        writes.withUnsafeBufferPointer { writes in
            for index in writes.indices {
                switch outcomes[index] {
                case .failed(let error): writes[index].reply(.failure(error))
                case .unchanged(let epoch, let sequence):
                    writes[index].reply(
                        .success(.written(CommitResult(committed: false, epoch: epoch, sequence: sequence))))
                case .committed(let sequence):
                    writes[index].reply(.success(.written(CommitResult(committed: true, epoch: epoch, sequence: sequence))))
                }
            }
        }
    }

    /// The open engine store, creating the store (directory, manifest, engine files) on its first commit.
    private func engineStore(_ engine: any StorageEngine, epoch: UInt64) throws(BrokerError) -> any EngineStore {
        // Once open (every commit but the first), nothing else is copied out under the lock.
        let (open, existing) = state.withLock { state in
            state.engineStore.map { ($0, state.manifest) } ?? (nil, state.manifest)
        }
        if let open {
            // A shared store stays open when another broker drops it (it is named by name): its place here is
            // made again when it is created again.
            if existing == nil, EnginePlace.isShared(engine) {
                let manifest = try place.adopt(engine: engine, existing: nil, epoch: epoch)
                state.withLock { $0.manifest = manifest }
            }
            return open
        }
        let (manifest, store) = try place.create(engine: engine, existing: existing, epoch: epoch)
        state.withLock { state in
            state.manifest = manifest
            state.engine = engine
            state.engineStore = store
        }
        logger.info("store created", metadata: ["engine": "\(engine.name)", "epoch": "\(manifest.epoch)"])
        return store
    }

    private func drop(_ write: PendingWrite) {
        let (info, manifest, engine, store) = state.withLock { ($0.info, $0.manifest, $0.engine, $0.engineStore) }
        if let conflict = conflict(write.condition, epoch: info.epoch, sequence: info.sequence) {
            return write.reply(.failure(conflict))
        }
        guard let manifest else {
            return write.reply(.success(.written(CommitResult(committed: false, epoch: 0, sequence: 0))))
        }
        do throws(BrokerError) {
            if let store {
                state.withLock { $0.engineStore = nil }
                store.close()
            }
            let dropper: any StorageEngine
            if let engine { dropper = engine } else { dropper = try environment.engines.engine(named: manifest.engine) }
            try place.drop(engine: dropper)
        } catch {
            logger.error("drop failed: \(error.message)", metadata: error.logMetadata)
            // Reload from whatever is left before the next request.
            state.withLock { $0.phase = .unloaded }
            return write.reply(.failure(error))
        }
        let (subscribers, removed) = emptied(forgettingEngine: true)
        // Observers hear of a drop as a remove of every id the store held, at sequence 0.
        let dropped = Position(epoch: info.epoch, sequence: info.sequence)
        broadcast(
            [(.dropped(dropped), Position(epoch: 0, sequence: 0))], to: subscribers,
            commits: removed.isEmpty ? [] : [Commit(epoch: 0, sequence: 0, steps: [.remove(ids: removed)])])
        logger.info("store dropped", metadata: ["epoch": "\(info.epoch)", "sequence": "\(info.sequence)"])
        write.reply(.success(.written(CommitResult(committed: true, epoch: 0, sequence: 0))))
    }

    // MARK: Shared stores

    /// A shared store's watcher says another broker may have committed: the writer catches up, before its next
    /// group. A store not loaded yet is loaded by replaying its commits from the first the log holds, so that
    /// this broker's observers (D-Bus) hear of every commit from then on (`loadByReplay`).
    func follow() {
        enum Next { case nothing, write, replay }
        let next = state.withLock { state -> Next in
            guard !state.retired, !state.stopping else { return .nothing }
            switch state.phase {
            case .loading:
                // The load reads the database as it is then; the writer catches up after it all the same.
                state.catchUpWanted = true
                return .nothing
            case .unloaded:
                state.phase = .loading
                return .replay
            case .ready:
                state.catchUpWanted = true
                state.catchUpFailed = false
                guard !state.writing else { return .nothing }
                state.writing = true
                return .write
            }
        }
        switch next {
        case .nothing: break
        case .write: environment.onWriter { self.runWriter(groups: StoreEnvironment.groupsPerTurn) }
        case .replay: environment.onWriter { self.loadByReplay() }
        }
    }

    /// Loads a store from nothing by taking in its commits from the first (or, when the log no longer reaches
    /// back, as the database holds it now), then answers what waited for the load. Falls back to a plain load.
    private func loadByReplay() {
        var leftovers = Leftovers()
        do throws(BrokerError) {
            try catchUp(leaving: &leftovers)
        } catch {
            logger.warning("cannot replay the store's commits, loading it instead: \(error.message)")
            let opened = state.withLock { state in
                defer { state.engineStore = nil }
                return state.engineStore
            }
            opened?.close()
            return load()
        }
        let waiting = state.withLock { state in
            state.phase = .ready
            defer { state.waiting = [] }
            return state.waiting
        }
        for body in waiting { body(nil) }
        startWriterIfNeeded()
        withExtendedLifetime(leftovers) {}
    }

    /// Whether this store is loaded at `position` (its own commit's notice: nothing to catch up).
    func holds(_ position: Position) -> Bool {
        state.withLock { $0.phase == .ready && $0.epoch == position.epoch && $0.sequence == position.sequence }
    }

    /// Whether the last catch-up failed (the watcher asks again).
    var catchUpFailed: Bool { state.withLock { $0.catchUpFailed } }

    /// `catchUp`, its failure logged and remembered (the watcher asks again later).
    private func catchUpReporting(leaving leftovers: inout Leftovers) {
        do throws(BrokerError) {
            try catchUp(leaving: &leftovers)
        } catch {
            logger.error("cannot catch up with the shared database: \(error.message)", metadata: error.logMetadata)
            state.withLock { $0.catchUpFailed = true }
        }
    }

    /// Brings memory up to the shared database: the commits other brokers made since this store's position are
    /// applied, kept in history and broadcast exactly as if made here (same sequences, same steps). A store
    /// dropped elsewhere is dropped here (`dropped` to subscribers); one created (again) elsewhere is taken from
    /// its first commit; when the commit log no longer reaches back, the store is reloaded (`historyGone` and a
    /// snapshot to subscribers).
    private func catchUp(leaving leftovers: inout Leftovers) throws(BrokerError) {
        for _ in 0..<4 {
            let (known, current, info, manifest) = state.withLock { ($0.engine, $0.engineStore, $0.info, $0.manifest) }
            let engine: any StorageEngine
            if let known { engine = known } else { engine = try resolveEngine() }
            guard
                let shared = try place.sharedStore(engine, current: current, keep: { state.keep($0, of: engine) })
            else { return }
            var fetched: [Commit] = []
            var unreadable: BrokerError?
            func read(epoch: UInt64, after: UInt64) throws(BrokerError) -> Position {
                let name = self.name
                return try EnginePlace.engineCall { () throws(EngineFailure) in
                    try shared.commits(epoch: epoch, after: after) { sequence, record in
                        guard unreadable == nil else { return }
                        do throws(BrokerError) {
                            let steps = try CommitRecord.decode(record, store: name, sequence: sequence)
                            fetched.append(Commit(epoch: epoch, sequence: sequence, steps: steps))
                        } catch {
                            unreadable = error
                        }
                    }
                }
            }
            do throws(BrokerError) {
                var position = try read(epoch: info.epoch, after: info.sequence)
                if let unreadable { throw unreadable }
                if position.epoch == info.epoch {
                    // Behind this broker: the database lost commits it holds (restored, a replica promoted).
                    if position.sequence < info.sequence { return try reload(shared, engine: engine) }
                    return publish(fetched, leaving: &leftovers)
                }
                if info.epoch != 0 {
                    // Dropped by another broker (and perhaps created again): what this broker held of it ends.
                    droppedElsewhere(info, manifest: manifest)
                    continue
                }
                guard position.epoch != 0 else { return }
                // Created by another broker: from its first commit.
                let adopted = try place.adopt(engine: engine, existing: manifest, epoch: position.epoch)
                state.withLock { $0.manifest = adopted }
                fetched = []
                position = try read(epoch: position.epoch, after: 0)
                if let unreadable { throw unreadable }
                if position.epoch == adopted.epoch { return publish(fetched, leaving: &leftovers) }
            } catch where (error.underlying as? EngineFailure)?.code == .gone {
                return try reload(shared, engine: engine)
            }
        }
    }

    /// Other brokers' commits, in order: into memory and history, then to subscribers and observers.
    private func publish(_ commits: [Commit], leaving leftovers: inout Leftovers) {
        guard let last = commits.last else { return }
        let limits = self.limits
        let subscribers = state.withLock { state in
            for commit in commits {
                state.contents.apply(commit.steps)
                state.history.append(
                    commit, maxCount: limits.history, maxBytes: limits.historyBytes, evicted: &leftovers.events)
            }
            state.epoch = last.epoch
            state.sequence = last.sequence
            return Array(state.subscribers.values)
        }
        broadcast(commits.map { (.storeEvent($0), $0.position) }, to: subscribers, commits: commits)
    }

    /// A store another broker dropped: emptied here, its place removed, subscribers told `dropped`.
    private func droppedElsewhere(_ info: (epoch: UInt64, sequence: UInt64), manifest: Manifest?) {
        if manifest != nil {
            do throws(BrokerError) {
                try place.forget()
            } catch {
                logger.warning("cannot remove the place of a store another broker dropped: \(error.message)")
            }
        }
        // The engine store stays open: a shared store is named by its name, and its place here is made again
        // when it is created again.
        let (subscribers, removed) = emptied(forgettingEngine: false)
        broadcast(
            [(.dropped(Position(epoch: info.epoch, sequence: info.sequence)), Position(epoch: 0, sequence: 0))],
            to: subscribers,
            commits: removed.isEmpty ? [] : [Commit(epoch: 0, sequence: 0, steps: [.remove(ids: removed)])])
        logger.info("store dropped by another broker", metadata: ["epoch": "\(info.epoch)", "sequence": "\(info.sequence)"])
    }

    /// The commit log no longer reaches back to this store's position: the store as the database holds it now,
    /// and to subscribers `historyGone` and that snapshot.
    private func reload(_ shared: any SharedEngineStore, engine: any StorageEngine) throws(BrokerError) {
        var contents = StoreContents()
        let position = try EnginePlace.engineCall { () throws(EngineFailure) in try shared.load { contents.load($0) } }
        let manifest = state.withLock { $0.manifest }
        let adopted = position.epoch == 0 ? nil : try place.adopt(engine: engine, existing: manifest, epoch: position.epoch)
        let subscribers = state.withLock { state in
            state.contents = contents
            state.epoch = position.epoch
            state.sequence = position.sequence
            state.manifest = adopted
            state.history = EventHistory()
            return Array(state.subscribers.values)
        }
        logger.notice("reloaded from the shared database: other brokers' commits since this one's position are no longer logged")
        guard !subscribers.isEmpty else { return }
        let snapshot = SharedPush(.storeLoaded(position, contents.records))
        for subscription in subscribers {
            subscription.offer(.historyGone(position), at: position, force: true)
            subscription.offer(snapshot, at: position, force: true)
        }
    }

    /// A dropped store's state: empty, at no position. Returns its subscribers and, when observers want them
    /// (they hear of a drop as a remove of every id), the ids it held.
    private func emptied(forgettingEngine: Bool) -> ([Subscription], [ItemID]) {
        state.withLock { state in
            let removed = !environment.observers.isEmpty && state.contents.count > 0 ? state.contents.ids : []
            state.contents = StoreContents()
            state.epoch = 0
            state.sequence = 0
            state.manifest = nil
            if forgettingEngine { state.engine = nil }
            state.history = EventHistory()
            return (Array(state.subscribers.values), removed)
        }
    }

    // MARK: Shutdown

    /// Refuses new writes, waits for the queued ones to finish, then closes the engine store.
    func shutdown() async { await state.shutDownWriter(on: environment) }

    /// Returns once this store's writer is idle (for tests that need a write to find it so).
    func waitUntilWriterIdle() async { await state.waitUntilWriterIdle() }
}

/// A store's recent events, for subscribers that resume: at most `maxCount` commits and `maxBytes` bytes
/// (ids and payloads), the oldest dropped first.
struct EventHistory {
    private(set) var events = Deque<Commit>()
    private var sizes = Deque<Int>()
    private(set) var bytes = 0

    var oldestSequence: UInt64? { events.first?.sequence }

    /// Appends `event`; the events it pushes out go to `evicted`, for the caller to release.
    mutating func append(_ event: Commit, maxCount: Int, maxBytes: Int, evicted: inout [Commit]) {
        let size = Self.size(of: event)
        events.append(event)
        sizes.append(size)
        bytes += size
        while let first = sizes.first, events.count > maxCount || bytes > maxBytes {
            evicted.append(events.removeFirst())
            sizes.removeFirst()
            bytes -= first
        }
    }

    /// The bytes an event keeps alive: its ids and payloads, plus a little per record.
    static func size(of event: Commit) -> Int {
        var total = 64
        for step in event.steps {
            switch step {
            case .insert(let records):
                for index in records.indices {  // not `for record in records`: that copies each record out
                    total += 32 + records[index].id.utf8Count + records[index].payload.count
                }
            case .remove(let ids):
                for id in ids { total += 16 + id.utf8Count }
            }
        }
        return total
    }
}
