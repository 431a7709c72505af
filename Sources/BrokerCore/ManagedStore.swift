import DequeModule
import NIOCore
import Logging
import StoreModel

/// One store: its committed items in memory, its writer, its history and its subscribers. Owned by the broker's
/// owner loop (`StoreEnvironment`): every method is called there, and only there is its state read or written.
///
/// The store is the only writer of its engine store. Writes queue in `pending` in the order they were submitted
/// (the server hands in all the writes one turn of the owner read for the store at once); the writer takes them
/// in groups, plans each group on the owner against the committed items plus the effects of the writes before it
/// (`WritePlanner`), has the engine apply the group in one transaction and, once it has committed, publishes:
/// memory and history change, the commits are broadcast (one shared push per commit for every subscriber, then
/// the observers) and the group is answered. An engine that never blocks (`nonblocking`, the memory engine)
/// applies on the owner, as Redis does; any other applies on a thread for blocking work, one job per group, while
/// the owner goes on answering reads from the committed items (a read never waits for a write in progress).
///
/// When applies are slow (an `fsync`), the writer waits a little before a group for the writers its last group
/// answered, so that writers waiting for each acknowledgement share commits (`GroupGathering`).
///
/// A store that does not exist and has nothing going on (no queued write, no subscriber, nothing open) is let go
/// of (`retire`): the broker keeps no object per name a client merely asked about.
final class ManagedStore: @unchecked Sendable {
    // `@unchecked Sendable`: blocking jobs capture the store for its immutable fields (`place`, `name`); its
    // state is touched only on the owner.
    let name: String
    private let environment: StoreEnvironment
    /// Asks the broker to let go of this store if there is nothing in it (`retireIfNothingHere()`).
    private let retire: (ManagedStore) -> Void
    /// The configuration's figures the writer reads for every group, copied out once.
    private let limits: CommitLimits

    private struct CommitLimits {
        let maxGroupCommit: Int
        let maxGroupWait: TimeAmount
        let history: Int
        let historyBytes: Int
        let clock: WallClock

        init(_ configuration: BrokerConfiguration) {
            clock = configuration.clock
            maxGroupCommit = max(1, configuration.maxGroupCommit)
            maxGroupWait = .nanoseconds(Int64(configuration.maxGroupWait / .nanoseconds(1)))
            history = configuration.history
            historyBytes = configuration.historyBytes
        }
    }

    private enum Loading {
        case unloaded, loading, ready
    }

    /// What the writer is doing.
    private enum WriterPhase {
        /// Nothing: the next submit (or load, or catch-up) starts it.
        case idle
        /// A job is on a blocking thread (a commit, a drop, a catch-up), or the owner has let its other work go first
        /// after a turn's budget: the writer goes on when it comes back.
        case working
        /// Waiting for the writers the last group answered (`GroupGathering`), until they have all submitted or
        /// the timer fires. `round` tells this wait's timer from an earlier one's that fired as it was cancelled.
        case gathering(Scheduled<Void>, round: UInt64)
    }

    private var loading = Loading.unloaded
    private var waiting: [(BrokerError?) -> Void] = []
    private var contents = StoreContents()
    /// 0 while the store does not exist.
    private var epoch: UInt64 = 0
    /// 0 while the store does not exist; +1 per commit.
    private var sequence: UInt64 = 0
    private var manifest: Manifest?
    private var engine: (any StorageEngine)? {
        didSet { capabilities = engine?.capabilities }
    }
    private var capabilities: EngineCapabilities?
    private var engineStore: (any EngineStore)?
    /// The last events, oldest first, within `--history` commits and `--history-bytes`.
    private var history = EventHistory()
    private var subscribers: [ObjectIdentifier: Subscription] = [:]
    private var pending = Deque<PendingWrite>()
    private var writer = WriterPhase.idle
    private var stopping: Bool
    private var idleWaiters: [() -> Void] = []
    private var gathering = GroupGathering()
    /// Counts the writer's waits for a group (`WriterPhase.gathering`).
    private var gatheringRounds: UInt64 = 0
    /// Subscriptions on their way in (admitted, waiting for the load).
    private var arriving = 0
    /// Let go of by the broker.
    private(set) var isRetired = false
    /// A shared store: another broker may have committed (its watcher said so); the writer catches up.
    private var catchUpWanted = false
    /// The last catch-up failed (the database unreachable): the watcher asks again.
    private(set) var catchUpFailed = false
    /// Groups lost in a row to other brokers' commits (a shared store), against `sharedAttempts`.
    private var lostGroups = 0

    /// `stopping`: created during shutdown (a request that arrived late): it refuses writes from the start.
    /// `retire`: called when the store may hold nothing (the broker then calls `retireIfNothingHere()`).
    init(
        name: String, environment: StoreEnvironment, stopping: Bool = false,
        retire: @escaping (ManagedStore) -> Void = { _ in }
    ) {
        self.name = name
        self.environment = environment
        limits = CommitLimits(environment.configuration)
        self.retire = retire
        self.stopping = stopping
    }

    private var logger: Logger {
        var logger = environment.logger
        logger[metadataKey: "store"] = "\(name)"
        return logger
    }

    private var place: EnginePlace {
        EnginePlace(environment: environment, place: environment.directory.store(name), storeName: name)
    }

    private var position: Position { Position(epoch: epoch, sequence: sequence) }

    /// The store does not exist, nothing of it is open and nothing waits: nothing would be lost by letting go of it.
    private var holdsNothing: Bool {
        guard case .idle = writer, loading == .ready else { return false }
        return sequence == 0 && manifest == nil && engineStore == nil && pending.isEmpty && subscribers.isEmpty
            && arriving == 0 && waiting.isEmpty && idleWaiters.isEmpty && !stopping && !catchUpWanted
    }

    /// Marks the store retired if it holds nothing; true when it did. The broker calls it when the store asks, and
    /// forgets the store when it returns true.
    func retireIfNothingHere() -> Bool {
        guard !isRetired, holdsNothing else { return false }
        isRetired = true
        return true
    }

    // MARK: Loading

    /// Runs `body` once the store is loaded (at once if it is), with the error if it cannot be.
    func whenLoaded(_ body: @escaping (BrokerError?) -> Void) {
        switch loading {
        case .ready: body(nil)
        case .loading: waiting.append(body)
        case .unloaded:
            waiting.append(body)
            load()
        }
    }

    private func load() {
        loading = .loading
        let place = place
        environment.offOwner({ () -> Result<(EnginePlace.Loaded?, StoreContents), BrokerError> in
            var contents = StoreContents()
            return Result { () throws(BrokerError) in
                let loaded = try place.load(expect: { contents.reserveCapacity($0) }, visit: { contents.load($0) })
                return (loaded, contents)
            }
        }) { result in
            switch result {
            case .success(let (loaded, contents)): self.loaded(loaded, contents)
            case .failure(let error): self.loadFailed(error)
            }
        }
    }

    private func loaded(_ loaded: EnginePlace.Loaded?, _ contents: StoreContents) {
        let sequence = loaded?.position?.sequence ?? loaded?.store.openedSequence ?? 0
        if let loaded {
            logger.debug(
                "store loaded",
                metadata: ["engine": "\(loaded.engine.name)", "items": "\(contents.count)", "sequence": "\(sequence)"])
        }
        self.contents = contents
        self.sequence = sequence
        // A store whose directory exists but that never committed (a crash between the two) does not exist yet;
        // its first commit keeps the manifest's epoch.
        epoch = sequence > 0 ? (loaded?.position?.epoch ?? loaded?.manifest.epoch ?? 0) : 0
        manifest = loaded?.manifest
        engine = loaded?.engine
        engineStore = loaded?.store
        becomeReady()
    }

    private func becomeReady() {
        loading = .ready
        let waiting = waiting
        self.waiting = []
        for body in waiting { body(nil) }
        startWriterIfNeeded()
        notifyIdleWaiters()
        if stopping { closeIfIdle() }
    }

    private func loadFailed(_ error: BrokerError) {
        logger.error("cannot load store: \(error.message)", metadata: error.logMetadata)
        // An unconditional drop queued behind the failure is the way out for an operator: writes before it fail
        // with the error, the store is deleted without being loaded, and what follows starts afresh.
        guard let index = pending.firstIndex(where: { write in
            if case .drop = write.kind, case .unconditional = write.condition { return true }
            return false
        })
        else { return failLoad(error) }
        for write in pending.prefix(index) { write.reply(.failure(error)) }
        let drop = pending[index]
        pending.removeFirst(index + 1)
        let place = place
        environment.offOwner({ Result { () throws(BrokerError) in try place.dropBroken() } }) { result in
            switch result {
            case .failure(let failure):
                self.logger.error(
                    "drop of a store that cannot be loaded failed: \(failure.message)", metadata: failure.logMetadata)
                drop.reply(.failure(failure))
                self.failLoad(failure)
            case .success:
                self.logger.notice("store dropped without loading it")
                drop.reply(.success(.written(CommitResult(committed: true, epoch: 0, sequence: 0))))
                self.load()
            }
        }
    }

    /// A failed load: every request waiting for it and every write queued behind it gets the error; the next
    /// request tries again.
    private func failLoad(_ error: BrokerError) {
        loading = .unloaded
        let (waiting, writes) = (waiting, pending)
        self.waiting = []
        pending = []
        for body in waiting { body(error) }
        for write in writes { write.reply(.failure(error)) }
        notifyIdleWaiters()
    }

    // MARK: Reads

    /// Answers from the committed state once loaded.
    private func read(_ reply: Reply, _ body: @escaping (borrowing StoreContents, Position) -> Result<BrokerAnswer, BrokerError>) {
        guard loading == .ready else {
            return whenLoaded { failure in
                if let failure { return reply(.failure(failure)) }
                self.read(reply, body)
            }
        }
        reply(body(contents, position))
        if sequence == 0 { retire(self) }
    }

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
        StoreInfo(
            name: name, epoch: epoch, sequence: sequence, count: UInt64(contents.count),
            engine: sequence > 0 ? (manifest?.engine ?? "") : "")
    }

    func count(_ reply: Reply) {
        read(reply) { contents, position in .success(.count(position, UInt64(contents.count))) }
    }

    func items(_ ids: [ItemID], _ reply: Reply) {
        read(reply) { contents, position in
            .success(.items(position, ids.map { id in contents.record(id).map(ItemSlot.present) ?? .missing(id) }))
        }
    }

    func range(after cursor: ItemID?, limit: UInt32, _ reply: Reply) {
        let name = name
        read(reply) { contents, position in
            guard let records = contents.records(after: cursor, limit: Int(limit)) else {
                return .failure(Self.cursorGone(cursor, store: name))
            }
            return .success(.records(position, records))
        }
    }

    func ids(after cursor: ItemID?, limit: UInt32, _ reply: Reply) {
        let name = name
        read(reply) { contents, position in
            guard let ids = contents.ids(after: cursor, limit: Int(limit)) else {
                return .failure(Self.cursorGone(cursor, store: name))
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

    /// Registers `subscription`: a snapshot, or the events after a resume point, or `historyGone` and a snapshot;
    /// then every event. The pushes are queued before the answer is given.
    func subscribe(_ subscription: Subscription, start: SubscriptionStart, _ reply: Reply) {
        arriving += 1
        whenLoaded { failure in
            self.arriving -= 1
            if let failure { return reply(.failure(failure)) }
            switch start {
            case .snapshot:
                self.offerSnapshot(to: subscription)
            case .resume(let epoch, let sequence):
                if epoch == self.epoch, sequence == self.sequence {
                    break  // nothing missed
                } else if epoch == self.epoch, epoch != 0, sequence < self.sequence,
                    let oldest = self.history.oldestSequence, oldest <= sequence + 1
                {
                    for event in self.history.events where event.sequence > sequence {
                        subscription.offer(.storeEvent(event), at: event.position, force: true)
                    }
                } else {
                    subscription.offer(.historyGone(self.position), at: self.position, force: true)
                    self.offerSnapshot(to: subscription)
                }
            }
            self.subscribers[ObjectIdentifier(subscription)] = subscription
            reply(.success(.subscribed(subscriptionID: subscription.id)))
        }
    }

    private func offerSnapshot(to subscription: Subscription) {
        subscription.offer(.storeLoaded(position, contents.records), at: position, force: true)
    }

    func unsubscribe(_ subscription: Subscription) {
        subscribers.removeValue(forKey: ObjectIdentifier(subscription))
        subscription.cancel()
        if sequence == 0 { retire(self) }
    }

    /// After a commit, in sequence order: each push goes to every subscriber (its encoding made once, shared) but
    /// the one `silenced` names for it, if any (empty: none for any push), then the commits to the observers
    /// (D-Bus); subscribers that lagged or went away are forgotten. No shared push is made for a commit whose
    /// only subscriber is the silenced one.
    private func broadcast(
        _ pushes: @autoclosure () -> [(Push, Position)], commits: [Commit], silenced: [ObjectIdentifier?] = []
    ) {
        var ended: [ObjectIdentifier] = []
        // A store followed by one mirror that made every write of the group itself (`RemoteStore`): no push is
        // made at all, not even the list of them.
        let only = subscribers.count == 1 ? subscribers.first?.key : nil
        let onlySilenced = only != nil && !silenced.isEmpty && silenced.allSatisfy { $0 == only }
        if !subscribers.isEmpty, !onlySilenced {
            for (index, (push, position)) in pushes().enumerated() {
                let quiet = silenced.isEmpty ? nil : silenced[index]
                if let quiet, quiet == only { continue }
                let shared = SharedPush(push)
                for (key, subscription) in subscribers where key != quiet {
                    if !subscription.offer(shared, at: position) { ended.append(key) }
                }
            }
        }
        for observer in environment.observers {
            for commit in commits {
                observer.storeCommitted(store: name, epoch: commit.epoch, sequence: commit.sequence, steps: commit.steps)
            }
        }
        for key in ended { subscribers.removeValue(forKey: key) }
    }

    // MARK: Writes

    /// Queues writes, in order; each is answered once committed (or refused). The server hands in every write one
    /// turn of the owner read for this store, from all its connections, in one call (`Broker.WriteBatch`): one
    /// group. Each write is moved into the queue and `writes` emptied, its capacity kept for the caller's next
    /// batch.
    func submit(_ writes: inout [PendingWrite?]) {
        guard !stopping else {
            let error = BrokerError(.shuttingDown, "the broker is shutting down")
            for index in writes.indices { writes[index]?.reply(.failure(error)) }
            writes.removeAll(keepingCapacity: true)
            return
        }
        // The writes of one connection, or of several that one turn of the owner read (each run of one submitter
        // is told to the gathering once).
        var completesGroup = false
        var lastSubmitter: UInt64?
        for index in writes.indices {
            var write: PendingWrite?
            swap(&write, &writes[index])
            let submitter = write!.submitter
            pending.append((consume write)!)
            if submitter != lastSubmitter {
                lastSubmitter = submitter
                if gathering.submitted(by: submitter) { completesGroup = true }
            }
        }
        writes.removeAll(keepingCapacity: true)
        if completesGroup, case .gathering(let timer, let round) = writer {
            timer.cancel()
            gatheringEnded(round: round)
            return
        }
        switch loading {
        case .ready: startWriterIfNeeded()
        case .loading: break  // the load starts the writer
        case .unloaded: load()
        }
    }

    private func startWriterIfNeeded() {
        guard loading == .ready, case .idle = writer, !pending.isEmpty || catchUpWanted else { return }
        writeTurn()
    }

    /// The writer stops: nothing is queued. A shutdown waiting for it goes on; a store that turned out not to
    /// exist is let go of.
    private func writerStopped() {
        writer = .idle
        notifyIdleWaiters()
        if loading == .ready, sequence == 0 { retire(self) }
    }

    private var isIdle: Bool {
        guard case .idle = writer else { return false }
        return pending.isEmpty && loading != .loading && !catchUpWanted
    }

    private func notifyIdleWaiters() {
        guard isIdle, !idleWaiters.isEmpty else { return }
        let waiters = idleWaiters
        idleWaiters = []
        for waiter in waiters { waiter() }
    }

    /// Items a turn commits on the owner for a nonblocking engine before the owner serves its other work (and comes
    /// back): one store's stream of large batches must not keep the owner's connections waiting.
    static let inlineItems = 4096

    /// One turn of the writer: takes in other brokers' commits if asked, then commits what is queued, group after
    /// group, on the owner for a nonblocking engine (within `inlineItems`) and otherwise through one blocking job
    /// per group, which comes back here when it is done.
    private func writeTurn() {
        var items = 0
        while true {
            if catchUpWanted {
                catchUpWanted = false
                writer = .working
                return catchUp { self.writerGoesOn() }
            }
            guard let first = pending.first else { return writerStopped() }
            if case .drop = first.kind {
                writer = .working
                return drop(pending.removeFirst())
            }
            guard items < Self.inlineItems else {
                writer = .working
                environment.owner.execute { self.writerGoesOn() }
                return
            }
            if let wait = gatheringWait() {
                gatheringRounds += 1
                let round = gatheringRounds
                writer = .gathering(
                    environment.owner.scheduleTask(in: wait) { self.gatheringEnded(round: round) }, round: round)
                return
            }
            let group = takeGroup()
            group.withUnsafeBufferPointer { group in
                for index in group.indices { items += max(1, group[index].kind.insertedItemCount) }
            }
            guard commit(group) else {
                writer = .working
                return
            }
        }
    }

    /// A job came back, or the owner served its other work: the writer goes on with what is queued.
    private func writerGoesOn() {
        writer = .idle
        if loading == .ready, pending.isEmpty, !catchUpWanted { return writerStopped() }
        startWriterIfNeeded()
    }

    /// The wait `round` is over: the group is whole, or its time is up. A timer that fired as it was cancelled
    /// finds the writer doing something else, and leaves it be.
    private func gatheringEnded(round: UInt64) {
        guard case .gathering(_, round) = writer else { return }
        gathering.endWait()
        writerGoesOn()
    }

    /// How long to wait for the writers the last group answered (`GroupGathering`): never for an engine that
    /// applies on the owner, a full group, or during shutdown.
    private func gatheringWait() -> TimeAmount? {
        guard !stopping, pending.count < limits.maxGroupCommit, let capabilities,
            !capabilities.contains(.nonblocking)
        else { return nil }
        let maximum = UInt64(max(0, limits.maxGroupWait.nanoseconds))
        return gathering.beginWait(maximum: maximum).map { .nanoseconds(Int64($0)) }
    }

    /// The next group: the writes up to the next drop, at most `--max-group-commit` (one for an engine without
    /// atomic applies).
    private func takeGroup() -> [PendingWrite] {
        let atomic = capabilities?.contains(.atomic) ?? true
        let limit = atomic ? limits.maxGroupCommit : 1
        var group: [PendingWrite] = []
        group.reserveCapacity(min(limit, pending.count))
        while group.count < limit, let next = pending.popFirst() {
            if case .drop = next.kind {
                pending.prepend(consume next)
                break
            }
            group.append(consume next)  // moved: without `consume` the optimizer copies it (two retains)
        }
        return group
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
        if let engine { return engine }
        return try environment.engines.engine(named: environment.configuration.defaultEngine)
    }

    /// Other brokers' commits a group may lose to, in a row, before its writes fail: each loss means another
    /// broker committed, so the brokers as a whole move on.
    static let sharedAttempts = 64

    /// A group planned against the committed items: what each write does, the commits it makes and the engine's
    /// steps for them.
    private struct Plan {
        var writes: [PendingWrite]
        var outcomes: [Outcome]
        var commits: [Commit]
        /// For each commit, the subscription it is not offered to (only once a write names one: usually empty).
        var silenced: [ObjectIdentifier?]
        var steps: [EngineStep]
        var insertHints: [StoreContents.InsertHint]
        var base: Position
        var epoch: UInt64
        var sequence: UInt64
    }

    /// Plans `writes` and has them applied: here, when the engine applies on the owner (true: the writer goes on),
    /// else by a blocking job that finishes the group when it comes back (false).
    private func commit(_ writes: [PendingWrite]) -> Bool {
        let engine: any StorageEngine
        do throws(BrokerError) {
            engine = try resolveEngine()
        } catch {
            for write in writes { write.reply(.failure(error)) }
            return true
        }
        let plan = self.plan(writes, atomic: engine.capabilities.contains(.atomic), engineName: engine.name)
        guard plan.sequence != plan.base.sequence else {
            answer(plan.writes, plan.outcomes, epoch: plan.epoch)
            return true
        }
        let shared = EnginePlace.isShared(engine)
        let job = ApplyJob(
            place: place, engine: engine, store: engineStore, manifest: manifest, shared: shared, steps: plan.steps,
            base: plan.base, epoch: plan.epoch, sequence: plan.sequence,
            records: shared ? plan.commits.map { ($0.sequence, CommitRecord.encode($0.steps)) } : [])
        if let store = engineStore, capabilities?.contains(.nonblocking) == true, !shared, manifest?.committed == true {
            // On the owner: an apply that never blocks costs less than the hand-off to a thread and back.
            var applied = ApplyJob.Applied(manifest: nil)
            let started = monotonicNanoseconds()
            do throws(BrokerError) {
                try EnginePlace.engineCall { () throws(EngineFailure) in try store.apply(plan.steps, sequence: plan.sequence) }
                applied.applyTook = monotonicNanoseconds() - started
            } catch {
                applied.failure = error
            }
            finish(plan, applied)
            return true
        }
        let handed = Handover(job)
        environment.offOwner({ handed.value.run() }) { applied in
            self.finish(plan, applied)
            self.writerGoesOn()
        }
        return false
    }

    /// Plans every request against the committed items plus the requests before it.
    private func plan(_ writes: [PendingWrite], atomic: Bool, engineName: String) -> Plan {
        var items = 0
        var lastItems = 0
        writes.withUnsafeBufferPointer { writes in
            for index in writes.indices {
                lastItems = writes[index].kind.insertedItemCount
                items += lastItems
            }
        }
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
            if hashes.count > 1 { hashes.withUnsafeBufferPointer { contents.warm($0) } }
        }
        let now = limits.clock.milliseconds()
        var plan = Plan(
            writes: writes, outcomes: [], commits: [], silenced: [], steps: [], insertHints: [], base: position,
            epoch: epoch, sequence: sequence)
        plan.outcomes.reserveCapacity(writes.count)
        plan.commits.reserveCapacity(writes.count)
        // The planner holds a second reference to the committed items only while it plans: once it is gone, the
        // publish changes them in place.
        var planner = WritePlanner(base: contents, items: items, remembered: items - lastItems)
        writes.withUnsafeBufferPointer { writes in
            for index in writes.indices {
                guard case .write(let operation) = writes[index].kind else { preconditionFailure("drops are not grouped") }
                if let conflict = conflict(writes[index].condition, epoch: plan.epoch, sequence: plan.sequence) {
                    plan.outcomes.append(.failed(conflict))
                    continue
                }
                // One operation is atomic whatever the engine; a chain of several is not without SB_CAP_ATOMIC.
                if case .chain(let chained) = operation, chained.count > 1, !atomic {
                    plan.outcomes.append(
                        .failed(
                            BrokerError(
                                .notSupported,
                                "engine \(engineName) cannot apply a chain atomically, so store \(name) refuses chains")))
                    continue
                }
                guard let events = planner.plan(operation, now: now, last: index == writes.count - 1) else {
                    plan.outcomes.append(.unchanged(epoch: plan.epoch, sequence: plan.sequence))
                    continue
                }
                if plan.sequence == 0 { plan.epoch = manifest?.epoch ?? Manifest.newEpoch() }
                plan.sequence += 1
                plan.outcomes.append(.committed(sequence: plan.sequence))
                if let quiet = writes[index].silenced {
                    if plan.silenced.isEmpty { plan.silenced = Array(repeating: nil, count: plan.commits.count) }
                    plan.silenced.append(quiet)
                } else if !plan.silenced.isEmpty {
                    plan.silenced.append(nil)
                }
                plan.commits.append(Commit(epoch: plan.epoch, sequence: plan.sequence, steps: events))
            }
        }
        plan.steps = planner.engineSteps
        plan.insertHints = planner.insertHints
        return plan
    }

    /// A group's apply came back: published and answered, or failed and answered, or lost to another broker's
    /// commit and queued again behind a catch-up.
    private func finish(_ plan: Plan, _ applied: ApplyJob.Applied) {
        if let created = applied.created {
            engine = created.engine
            engineStore = created.store
            manifest = created.manifest
            logger.info("store created", metadata: ["engine": "\(created.engine.name)", "epoch": "\(created.manifest.epoch)"])
        }
        if let adopted = applied.manifest { manifest = adopted }
        if applied.lost {
            lostGroups += 1
            if lostGroups < Self.sharedAttempts {
                // Another broker committed first: take its commits in, then plan the same writes again.
                logger.debug("lost a commit to another broker; catching up", metadata: ["attempt": "\(lostGroups)"])
                for write in plan.writes.reversed() { pending.prepend(write) }
                catchUpWanted = true
                return
            }
        }
        lostGroups = 0
        if let failure = applied.failure {
            logger.error(
                "commit failed, nothing changed: \(failure.message)",
                metadata: failure.logMetadata.merging(["requests": "\(plan.writes.count)"]) { $1 })
            let base = plan.base
            let failed = plan.outcomes.map { outcome -> Outcome in
                switch outcome {
                case .failed: outcome
                case .unchanged: .unchanged(epoch: base.epoch, sequence: base.sequence)
                case .committed: .failed(failure)
                }
            }
            return answer(plan.writes, failed, epoch: base.epoch)
        }
        // Committed: memory and history, in sequence order; then the broadcast and the answers. What they let go
        // of is released after the answers.
        var released = StoreContents.Released()
        var evicted: [Commit] = []
        var nextHint = 0
        plan.commits.withUnsafeBufferPointer { commits in
            for index in commits.indices {
                contents.apply(commits[index].steps, hints: plan.insertHints, from: &nextHint, released: &released)
                history.append(commits[index], maxCount: limits.history, maxBytes: limits.historyBytes, evicted: &evicted)
            }
        }
        epoch = plan.epoch
        sequence = plan.sequence
        gathering.committed(plan.writes, applyTook: applied.applyTook, queued: pending)
        broadcast(plan.commits.map { (.storeEvent($0), $0.position) }, commits: plan.commits, silenced: plan.silenced)
        answer(plan.writes, plan.outcomes, epoch: plan.epoch)
        withExtendedLifetime((released, evicted)) {}
    }

    private func answer(_ writes: [PendingWrite], _ outcomes: [Outcome], epoch: UInt64) {
        writes.withUnsafeBufferPointer { writes in
            for index in writes.indices {
                switch outcomes[index] {
                case .failed(let error): writes[index].reply(.failure(error))
                case .unchanged(let epoch, let sequence):
                    writes[index].reply(.success(.written(CommitResult(committed: false, epoch: epoch, sequence: sequence))))
                case .committed(let sequence):
                    writes[index].reply(.success(.written(CommitResult(committed: true, epoch: epoch, sequence: sequence))))
                }
            }
        }
    }

    private func drop(_ write: PendingWrite) {
        if let conflict = conflict(write.condition, epoch: epoch, sequence: sequence) {
            write.reply(.failure(conflict))
            return writerGoesOn()
        }
        guard let manifest else {
            write.reply(.success(.written(CommitResult(committed: false, epoch: 0, sequence: 0))))
            return writerGoesOn()
        }
        let (store, engine, place) = (engineStore, engine, place)
        let engines = environment.engines
        engineStore = nil
        let handed = Handover(store)
        environment.offOwner({
            Result { () throws(BrokerError) in
                handed.value?.close()
                let dropper: any StorageEngine
                if let engine { dropper = engine } else { dropper = try engines.engine(named: manifest.engine) }
                try place.drop(engine: dropper)
            }
        }) { result in
            if case .failure(let error) = result {
                self.logger.error("drop failed: \(error.message)", metadata: error.logMetadata)
                // Reload from whatever is left before the next request.
                self.loading = .unloaded
                write.reply(.failure(error))
                return self.writerGoesOn()
            }
            let dropped = self.position
            let removed = self.emptied(forgettingEngine: true)
            // Observers hear of a drop as a remove of every id the store held, at sequence 0.
            self.broadcast(
                [(.dropped(dropped), Position(epoch: 0, sequence: 0))],
                commits: removed.isEmpty ? [] : [Commit(epoch: 0, sequence: 0, steps: [.remove(ids: removed)])])
            self.logger.info("store dropped", metadata: ["epoch": "\(dropped.epoch)", "sequence": "\(dropped.sequence)"])
            write.reply(.success(.written(CommitResult(committed: true, epoch: 0, sequence: 0))))
            self.writerGoesOn()
        }
    }

    /// A dropped store's state: empty, at no position. Returns, when observers want them (they hear of a drop as a
    /// remove of every id), the ids it held.
    private func emptied(forgettingEngine: Bool) -> [ItemID] {
        let removed = !environment.observers.isEmpty && contents.count > 0 ? contents.ids : []
        contents = StoreContents()
        epoch = 0
        sequence = 0
        manifest = nil
        if forgettingEngine { engine = nil }
        history = EventHistory()
        return removed
    }

    // MARK: Shared stores

    /// A shared store's watcher says another broker may have committed: the writer catches up, before its next
    /// group. A store not loaded yet is loaded by replaying its commits from the first the log holds, so that this
    /// broker's observers (D-Bus) hear of every commit from then on.
    func follow() {
        guard !isRetired, !stopping else { return }
        switch loading {
        case .loading:
            // The load reads the database as it is then; the writer catches up after it all the same.
            catchUpWanted = true
        case .unloaded:
            loadByReplay()
        case .ready:
            catchUpWanted = true
            catchUpFailed = false
            startWriterIfNeeded()
        }
    }

    /// Whether this store is loaded at `position` (its own commit's notice: nothing to catch up).
    func holds(_ position: Position) -> Bool { loading == .ready && self.position == position }

    /// Loads a store from nothing by taking in its commits from the first (or, when the log no longer reaches
    /// back, as the database holds it now), then answers what waited for the load. Falls back to a plain load.
    private func loadByReplay() {
        loading = .loading
        let job = CatchUpJob(
            place: place, name: name, engine: nil, defaultEngine: environment.configuration.defaultEngine,
            engines: environment.engines, store: nil, position: Position(epoch: 0, sequence: 0), manifest: nil)
        environment.offOwner({ job.run() }) { (effects, failure) in
            if let failure {
                self.logger.warning("cannot replay the store's commits, loading it instead: \(failure.message)")
                let opened = effects.lazy.compactMap { effect -> (any EngineStore)? in
                    if case .opened(_, let store) = effect { return store }
                    return nil
                }.first
                if let opened { self.environment.offOwner({ Handover(opened).value.close() }) { _ in } }
                return self.load()
            }
            self.take(effects)
            self.becomeReady()
        }
    }

    /// Brings memory up to the shared database (`CatchUpJob`), then `then`.
    private func catchUp(then: @escaping () -> Void) {
        let job = CatchUpJob(
            place: place, name: name, engine: engine, defaultEngine: environment.configuration.defaultEngine,
            engines: environment.engines, store: engineStore, position: position, manifest: manifest)
        environment.offOwner({ job.run() }) { (effects, failure) in
            self.take(effects)
            if let failure {
                self.logger.error(
                    "cannot catch up with the shared database: \(failure.message)", metadata: failure.logMetadata)
                self.catchUpFailed = true
            }
            then()
        }
    }

    /// What a catch-up found, in order: into memory and history, and to subscribers and observers exactly as if
    /// made here (same sequences, same steps).
    private func take(_ effects: [CatchUpJob.Effect]) {
        for effect in effects {
            switch effect {
            case .opened(let engine, let store):
                self.engine = engine
                engineStore = store
            case .adopted(let adopted):
                manifest = adopted
            case .commits(let commits):
                guard let last = commits.last else { continue }
                var evicted: [Commit] = []
                for commit in commits {
                    contents.apply(commit.steps)
                    history.append(commit, maxCount: limits.history, maxBytes: limits.historyBytes, evicted: &evicted)
                }
                epoch = last.epoch
                sequence = last.sequence
                broadcast(commits.map { (.storeEvent($0), $0.position) }, commits: commits)
            case .droppedElsewhere:
                // The engine store stays open: a shared store is named by its name, and its place here is made
                // again when it is created again.
                let dropped = position
                let removed = emptied(forgettingEngine: false)
                broadcast(
                    [(.dropped(dropped), Position(epoch: 0, sequence: 0))],
                    commits: removed.isEmpty ? [] : [Commit(epoch: 0, sequence: 0, steps: [.remove(ids: removed)])])
                logger.info(
                    "store dropped by another broker",
                    metadata: ["epoch": "\(dropped.epoch)", "sequence": "\(dropped.sequence)"])
            case .reloaded(let reloaded, let at, let adopted):
                contents = reloaded
                epoch = at.epoch
                sequence = at.sequence
                manifest = adopted
                history = EventHistory()
                logger.notice(
                    "reloaded from the shared database: other brokers' commits since this one's position are no longer logged")
                guard !subscribers.isEmpty else { continue }
                let snapshot = SharedPush(.storeLoaded(at, contents.records))
                for subscription in subscribers.values {
                    subscription.offer(.historyGone(at), at: at, force: true)
                    subscription.offer(snapshot, at: at, force: true)
                }
            }
        }
    }

    // MARK: Shutdown

    /// Refuses new writes, finishes the queued ones, then closes the engine store; `done` runs when it is closed.
    func shutdown(_ done: @escaping () -> Void) {
        stopping = true
        whenIdle {
            guard let store = self.engineStore else { return done() }
            self.engineStore = nil
            let handed = Handover(store)
            self.environment.offOwner({ handed.value.close() }) { _ in done() }
        }
    }

    /// A store loaded once shutdown had begun: its engine store is closed once the writes queued meanwhile are done.
    private func closeIfIdle() {
        whenIdle {
            guard let store = self.engineStore else { return }
            self.engineStore = nil
            let handed = Handover(store)
            self.environment.offOwner({ handed.value.close() }) { _ in }
        }
    }

    /// Runs `body` once nothing is queued, loading or being written (now, if so).
    func whenIdle(_ body: @escaping () -> Void) {
        if isIdle { body() } else { idleWaiters.append(body) }
    }
}
