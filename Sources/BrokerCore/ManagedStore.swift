import DequeModule
import Logging
import NIOCore
import StoreModel

/// One store: its committed items in memory, its subscribers and history, and its writer (`PlaceWriter`, which
/// loads it, queues its writes and commits them in groups). Owned by the broker's owner loop (`StoreEnvironment`):
/// every method is called there, and only there is its state read or written.
///
/// Reads are answered from the committed items, also while a commit group is on a thread for blocking work (a
/// read never waits for a write in progress). Once the engine has committed a group, the store publishes it:
/// memory and history change in O(items changed), each commit is broadcast (one shared push per commit for every
/// subscriber, then the observers) and the group is answered.
///
/// A store that does not exist and has nothing going on (no queued write, no subscriber, nothing open) is let go
/// of (`retire`): the broker keeps no object per name a client merely asked about.
final class ManagedStore: WriterModel, @unchecked Sendable {
    // `@unchecked Sendable`: blocking jobs capture values made from the store, never its state, which only the owner
    // touches.
    let name: String
    private let environment: StoreEnvironment
    /// Asks the broker to let go of this store if there is nothing in it (`retireIfNothingHere()`).
    private let retire: (ManagedStore) -> Void
    private let initiallyStopping: Bool

    private(set) lazy var writer = PlaceWriter(
        model: self, environment: environment,
        place: EnginePlace(environment: environment, place: environment.directory.store(name), storeName: name),
        logger: logger, stopping: initiallyStopping)
    private var contents = StoreContents()
    /// The last events, oldest first, within `--history` commits and `--history-bytes`.
    private var history = EventHistory()
    private var subscribers: [ObjectIdentifier: Subscription] = [:]
    /// Subscriptions on their way in (admitted, waiting for the load).
    private var arriving = 0
    /// Let go of by the broker.
    private(set) var isRetired = false

    /// `stopping`: created during shutdown (a request that arrived late): it refuses writes from the start.
    /// `retire`: called when the store may hold nothing (the broker then calls `retireIfNothingHere()`).
    init(
        name: String, environment: StoreEnvironment, stopping: Bool = false,
        retire: @escaping (ManagedStore) -> Void = { _ in }
    ) {
        self.name = name
        self.environment = environment
        self.retire = retire
        initiallyStopping = stopping
    }

    private var logger: Logger {
        var logger = environment.logger
        logger[metadataKey: "store"] = "\(name)"
        return logger
    }

    /// Marks the store retired if it does not exist, nothing of it is open and nothing waits (nothing would be
    /// lost by letting go of it); true when it did. The broker calls it when the store asks, and forgets the store
    /// when it returns true.
    func retireIfNothingHere() -> Bool {
        guard !isRetired, writer.isIdle, writer.loading == .ready, !writer.stopping, writer.sequence == 0,
            writer.manifest == nil, writer.engineStore == nil, subscribers.isEmpty, arriving == 0
        else { return false }
        isRetired = true
        return true
    }

    func writerStopped() {
        if writer.sequence == 0 { retire(self) }
    }

    // MARK: Loading

    func loadJob() -> @Sendable () throws(BrokerError) -> (EnginePlace.Loaded?, StoreContents) {
        let place = writer.place
        return { () throws(BrokerError) in
            var contents = StoreContents()
            let loaded = try place.load(expect: { contents.reserveCapacity($0) }, visit: { contents.load($0) })
            return (loaded, contents)
        }
    }

    func install(_ contents: StoreContents) {
        self.contents = contents
        if let engine = writer.engine {
            logger.debug(
                "store loaded",
                metadata: ["engine": "\(engine.name)", "items": "\(contents.count)", "sequence": "\(writer.sequence)"])
        }
    }

    // MARK: Reads

    /// Answers from the committed state once loaded.
    private func read(
        _ reply: Reply, _ body: @escaping (borrowing StoreContents, Position) -> Result<BrokerAnswer, BrokerError>
    ) {
        guard writer.loading == .ready else {
            return writer.whenLoaded { failure in
                if let failure { return reply(.failure(failure)) }
                self.read(reply, body)
            }
        }
        reply(body(contents, writer.position))
        if writer.sequence == 0 { retire(self) }
    }

    func info(_ reply: Reply) {
        read(reply) { _, _ in .success(.storeInfo(self.currentInfo())) }
    }

    /// The store's info; call only when loaded.
    func currentInfo() -> StoreInfo {
        StoreInfo(
            name: name, epoch: writer.epoch, sequence: writer.sequence, count: UInt64(contents.count),
            engine: writer.sequence > 0 ? (writer.manifest?.engine ?? "") : "")
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
        page(after: cursor, reply) { contents, position in
            contents.records(after: cursor, limit: Int(limit)).map { .records(position, $0) }
        }
    }

    func ids(after cursor: ItemID?, limit: UInt32, _ reply: Reply) {
        page(after: cursor, reply) { contents, position in
            contents.ids(after: cursor, limit: Int(limit)).map { .ids(position, $0) }
        }
    }

    /// A page after `cursor`; `nil` from `body` when the cursor's item is gone.
    private func page(
        after cursor: ItemID?, _ reply: Reply,
        _ body: @escaping (borrowing StoreContents, Position) -> BrokerAnswer?
    ) {
        let name = name
        read(reply) { contents, position in
            body(contents, position).map { .success($0) } ?? .failure(Self.cursorGone(cursor, store: name))
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
        writer.whenLoaded { failure in
            self.arriving -= 1
            if let failure { return reply(.failure(failure)) }
            switch start {
            case .snapshot:
                self.offerSnapshot(to: subscription)
            case .resume(let epoch, let sequence):
                let now = self.writer.position
                if epoch == now.epoch, sequence == now.sequence {
                    break  // nothing missed
                } else if epoch == now.epoch, epoch != 0, sequence < now.sequence,
                    let oldest = self.history.oldestSequence, oldest <= sequence + 1
                {
                    for event in self.history.events where event.sequence > sequence {
                        subscription.offer(.storeEvent(event), at: event.position, force: true)
                    }
                } else {
                    subscription.offer(.historyGone(now), at: now, force: true)
                    self.offerSnapshot(to: subscription)
                }
            }
            self.subscribers[ObjectIdentifier(subscription)] = subscription
            reply(.success(.subscribed(subscriptionID: subscription.id)))
        }
    }

    private func offerSnapshot(to subscription: Subscription) {
        let position = writer.position
        subscription.offer(.storeLoaded(position, contents.records), at: position, force: true)
    }

    func unsubscribe(_ subscription: Subscription) {
        subscribers.removeValue(forKey: ObjectIdentifier(subscription))
        subscription.cancel()
        if writer.sequence == 0 { retire(self) }
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
                observer.storeCommitted(
                    store: name, epoch: commit.epoch, sequence: commit.sequence, steps: commit.steps)
            }
        }
        for key in ended { subscribers.removeValue(forKey: key) }
    }

    // MARK: Writes

    /// Queues writes, in order (`PlaceWriter.submit`).
    func submit(_ writes: inout [PendingWrite?]) { writer.submit(&writes) }

    private func planning(_ engine: any StorageEngine) -> Planning {
        Planning(
            contents: contents, base: writer.position, manifestEpoch: writer.manifest?.epoch, store: name,
            atomic: engine.capabilities.contains(.atomic), engineName: engine.name, now: environment.configuration.clock.milliseconds())
    }

    func plan(_ writes: [PendingWrite], engine: any StorageEngine) -> Plan? {
        planned(Self.plan(writes, planning(engine)))
    }

    func planningJob(_ writes: [PendingWrite], engine: any StorageEngine) -> (@Sendable () -> Plan)? {
        var items = 0
        for write in writes { items += write.weight }
        guard items >= Self.offOwnerItems else { return nil }
        let box = PlanningBox(planning(engine))
        let writes = Handover(writes)
        return { Self.plan(writes.value, box.take()) }
    }

    /// A plan, or nil (its writes answered here) when it changes nothing.
    func planned(_ plan: Plan) -> Plan? {
        guard plan.sequence != plan.base.sequence else {
            answer(plan.writes, plan.outcomes, epoch: plan.epoch)
            return nil
        }
        return plan
    }

    func sharedRecords(_ plan: Plan) -> [(sequence: UInt64, record: [UInt8])] {
        plan.commits.map { ($0.sequence, CommitRecord.encode($0.steps)) }
    }

    /// Committed: memory and history, in sequence order; then the broadcast and the answers. What they let go of is
    /// released after the answers.
    func publish(_ plan: Plan, applyTook: UInt64) {
        var released = StoreContents.Released()
        var evicted: [Commit] = []
        var nextHint = 0
        plan.commits.withUnsafeBufferPointer { commits in
            for index in commits.indices {
                contents.apply(commits[index].steps, hints: plan.insertHints, from: &nextHint, released: &released)
                remember(commits[index], evicted: &evicted)
            }
        }
        broadcast(plan.commits.map { (.storeEvent($0), $0.position) }, commits: plan.commits, silenced: plan.silenced)
        answer(plan.writes, plan.outcomes, epoch: plan.epoch)
        withExtendedLifetime((released, evicted)) {}
    }

    /// Into the history, within `--history` commits and `--history-bytes`.
    private func remember(_ commit: Commit, evicted: inout [Commit]) {
        let configuration = environment.configuration
        history.append(commit, maxCount: configuration.history, maxBytes: configuration.historyBytes, evicted: &evicted)
    }

    func answer(_ plan: Plan, failure: BrokerError) {
        let base = plan.base
        let failed = plan.outcomes.map { outcome -> Outcome in
            switch outcome {
            case .failed: outcome
            case .unchanged: .unchanged(epoch: base.epoch, sequence: base.sequence)
            case .committed: .failed(failure)
            }
        }
        answer(plan.writes, failed, epoch: base.epoch)
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
                    writes[index].reply(
                        .success(.written(CommitResult(committed: true, epoch: epoch, sequence: sequence))))
                }
            }
        }
    }

    /// A drop, the one write that goes alone: the engine's files and the place are deleted on a thread for blocking
    /// work, then memory is emptied and subscribers are told `dropped`.
    func performAlone(_ write: PendingWrite, _ done: @escaping () -> Void) {
        if let conflict = Self.conflict(write.condition, epoch: writer.epoch, sequence: writer.sequence, store: name) {
            write.reply(.failure(conflict))
            return done()
        }
        guard let manifest = writer.manifest else {
            write.reply(.success(.written(CommitResult(committed: false, epoch: 0, sequence: 0))))
            return done()
        }
        let (store, engine, place, engines) = (writer.engineStore, writer.engine, writer.place, environment.engines)
        writer.engineStore = nil
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
                self.writer.forgetLoad()
                write.reply(.failure(error))
                return done()
            }
            self.dropped(forgettingEngine: true, "store dropped")
            write.reply(.success(.written(CommitResult(committed: true, epoch: 0, sequence: 0))))
            done()
        }
    }

    /// The store was dropped: empty, at no position; subscribers hear `dropped`, observers a remove of every id
    /// it held, at sequence 0.
    private func dropped(forgettingEngine: Bool, _ message: Logger.Message) {
        let dropped = writer.position
        let removed = !environment.observers.isEmpty && contents.count > 0 ? contents.ids : []
        contents = StoreContents()
        writer.epoch = 0
        writer.sequence = 0
        writer.manifest = nil
        if forgettingEngine { writer.engine = nil }
        history = EventHistory()
        broadcast(
            [(.dropped(dropped), Position(epoch: 0, sequence: 0))],
            commits: removed.isEmpty ? [] : [Commit(epoch: 0, sequence: 0, steps: [.remove(ids: removed)])])
        logger.info(message, metadata: ["epoch": "\(dropped.epoch)", "sequence": "\(dropped.sequence)"])
    }

    // MARK: Shared stores

    /// A shared store's watcher says another broker may have committed: the writer catches up, before its next
    /// group. A store not loaded yet is loaded by replaying its commits from the first the log holds, so that this
    /// broker's observers (D-Bus) hear of every commit from then on.
    func follow() {
        guard !isRetired, !writer.stopping else { return }
        guard writer.loading == .unloaded else { return writer.requestCatchUp() }
        let job = CatchUpJob(
            place: writer.place, engine: nil, store: nil, position: Position(epoch: 0, sequence: 0), manifest: nil)
        writer.loadByCatchUp { job.run() }
    }

    /// Whether this store is loaded at `position` (its own commit's notice: nothing to catch up).
    func holds(_ position: Position) -> Bool { writer.loading == .ready && writer.position == position }

    /// Whether the last catch-up failed (the watcher asks again).
    var catchUpFailed: Bool { writer.catchUpFailed }

    func catchUpJob() -> @Sendable () -> ([CatchUpJob.Finding], BrokerError?) {
        let job = CatchUpJob(
            place: writer.place, engine: writer.engine, store: writer.engineStore, position: writer.position,
            manifest: writer.manifest)
        return { job.run() }
    }

    /// What a catch-up found, in order: into memory and history, and to subscribers and observers exactly as if
    /// made here (same sequences, same steps).
    func take(_ change: CatchUpJob.Change) {
        switch change {
        case .commits(let commits):
            guard let last = commits.last else { return }
            var evicted: [Commit] = []
            for commit in commits {
                contents.apply(commit.steps)
                remember(commit, evicted: &evicted)
            }
            writer.epoch = last.epoch
            writer.sequence = last.sequence
            broadcast(commits.map { (.storeEvent($0), $0.position) }, commits: commits)
        case .droppedElsewhere:
            // The engine store stays open: a shared store is named by its name, and its place here is made
            // again when it is created again.
            dropped(forgettingEngine: false, "store dropped by another broker")
        case .reloaded(let reloaded, let at, let adopted):
            contents = reloaded
            writer.epoch = at.epoch
            writer.sequence = at.sequence
            writer.manifest = adopted
            history = EventHistory()
            logger.notice(
                "reloaded from the shared database: other brokers' commits since this one's position are no longer logged"
            )
            guard !subscribers.isEmpty else { return }
            let snapshot = SharedPush(.storeLoaded(at, contents.records))
            for subscription in subscribers.values {
                subscription.offer(.historyGone(at), at: at, force: true)
                subscription.offer(snapshot, at: at, force: true)
            }
        }
    }
}
