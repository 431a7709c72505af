import DequeModule
import Logging
import NIOCore
import StoreModel

/// A write waiting in a writer's queue.
protocol QueuedWrite {
    var reply: Reply { get }
    /// Who handed it in (`RequestContext.submitter`): the group gathering waits for submitters.
    var submitter: UInt64 { get }
    /// The items it inserts, counted against the owner's budget for one turn (a write counts one at least).
    var weight: Int { get }
    /// A write carried out alone, never in a group (a store's drop).
    var isAlone: Bool { get }
    /// An unconditional drop: carried out even when the place cannot be loaded, which it deletes.
    var dropsBrokenPlace: Bool { get }
}

/// A group planned against the committed state: the engine's steps and the position they lead to.
protocol PlannedGroup {
    associatedtype Write: QueuedWrite
    var writes: [Write] { get }
    var steps: [EngineStep] { get }
    /// The position planned against.
    var base: Position { get }
    /// The position after the group (`sequence == base.sequence`: nothing changes).
    var epoch: UInt64 { get }
    var sequence: UInt64 { get }
}

/// What a catch-up with a shared database found, in order: the engine store it opened to read (the writer keeps
/// it), a manifest it adopted, or a change of the model's.
enum CatchUpFinding<Change> {
    case opened(any StorageEngine, any EngineStore)
    case adopted(Manifest)
    case change(Change)
}

/// What a place (a store, a value namespace) keeps besides its writer: its contents, subscribers and history. The
/// writer asks it to plan a group, and tells it what was committed.
protocol WriterModel: AnyObject {
    associatedtype Write: QueuedWrite
    associatedtype Contents
    associatedtype Plan: PlannedGroup where Plan.Write == Write
    associatedtype Change

    /// Reads the place, on a thread for blocking work: the engine store and the contents (`nil`: it does not
    /// exist).
    func loadJob() -> @Sendable () throws(BrokerError) -> (EnginePlace.Loaded?, Contents)
    /// The loaded contents, on the owner (the writer has taken the position, manifest and engine store).
    func install(_ contents: Contents)
    /// Plans `writes` against the committed state; answers and returns nil when the group changes nothing.
    func plan(_ writes: [Write], engine: any StorageEngine) -> Plan?
    /// A job that plans `writes` on a thread for blocking work, for a group too large to plan on the owner without
    /// keeping its other work waiting (nil: plan on the owner). It must only read the committed state.
    func planningJob(_ writes: [Write], engine: any StorageEngine) -> (@Sendable () -> Plan)?
    /// A plan made by a planning job, back on the owner: answered here, and nil, when it changes nothing.
    func planned(_ plan: Plan) -> Plan?
    /// A shared store's commit records for `plan` (each commit as the log keeps it).
    func sharedRecords(_ plan: Plan) -> [(sequence: UInt64, record: [UInt8])]
    /// The group committed (the writer has moved the position): memory, history, broadcast, answers.
    func publish(_ plan: Plan, applyTook: UInt64)
    /// The group failed: nothing changed.
    func answer(_ plan: Plan, failure: BrokerError)
    /// Carries out a write that goes alone (`QueuedWrite.isAlone`), calling `done` on the owner afterwards.
    func performAlone(_ write: Write, _ done: @escaping () -> Void)
    /// A catch-up with the shared database, on a thread for blocking work, from what the owner holds now.
    func catchUpJob() -> @Sendable () -> ([CatchUpFinding<Change>], BrokerError?)
    /// A change a catch-up found, on the owner, in order.
    func take(_ change: Change)
    /// The writer has nothing to do.
    func writerStopped()
}

extension WriterModel {
    /// A model whose groups stay small (a namespace's values) plans them on the owner.
    func planningJob(_ writes: [Write], engine: any StorageEngine) -> (@Sendable () -> Plan)? { nil }
    func planned(_ plan: Plan) -> Plan? { plan }
}

/// The writer of one place, owned by the broker's owner loop: loading, the queue of writes and its groups, the
/// engine store, a shared database's catch-up, and shutdown. A store and a value namespace run the same machine;
/// what they hold is their `WriterModel`'s.
///
/// Writes queue in the order they were submitted (the server hands in all the writes one turn of the owner read for
/// the place at once). The writer takes them in groups (up to `--max-group-commit`, one for an engine without
/// atomic applies), the model plans each group on the owner, and the engine applies it in one transaction: on the
/// owner for an engine that never blocks (`nonblocking`, the memory engine, as Redis does), else on a thread for
/// blocking work, one job per group, while the owner goes on serving reads from the committed state. When applies
/// are slow (an `fsync`), the writer waits a little before a group for the writers its last group answered, so that
/// writers waiting for each acknowledgement share commits (`GroupGathering`).
final class PlaceWriter<Model: WriterModel> {
    unowned let model: Model
    let environment: StoreEnvironment
    let place: EnginePlace
    let logger: Logger
    private let limits: Limits

    private struct Limits {
        let maxGroupCommit: Int
        let maxGroupWait: UInt64

        init(_ configuration: BrokerConfiguration) {
            maxGroupCommit = max(1, configuration.maxGroupCommit)
            maxGroupWait = UInt64(configuration.maxGroupWait / .nanoseconds(1))
        }
    }

    enum Loading {
        case unloaded, loading, ready
    }

    /// What the writer is doing.
    private enum Phase {
        /// Nothing: the next submit (or load, or catch-up) starts it.
        case idle
        /// A job is on a blocking thread (a commit, a drop, a catch-up), or the owner serves its other work after a
        /// turn's budget: the writer goes on when it comes back.
        case working
        /// Waiting for the writers the last group answered, until they have all submitted or the timer fires.
        /// `round` tells this wait's timer from an earlier one's that fired as it was cancelled.
        case gathering(Scheduled<Void>, round: UInt64)
    }

    private(set) var loading = Loading.unloaded
    private var waiting: [(BrokerError?) -> Void] = []
    /// 0 while the place does not exist.
    var epoch: UInt64 = 0
    /// 0 while the place does not exist; +1 per commit.
    var sequence: UInt64 = 0
    var manifest: Manifest?
    var engine: (any StorageEngine)? {
        didSet { capabilities = engine.map { $0.capabilities(options: environment.options($0)) } }
    }
    private var capabilities: EngineCapabilities?
    var engineStore: (any EngineStore)?
    private var pending = Deque<Model.Write>()
    private var phase = Phase.idle
    private(set) var stopping: Bool
    private var idleWaiters: [() -> Void] = []
    private var gathering = GroupGathering()
    private var gatheringRounds: UInt64 = 0
    /// A shared place: another broker may have committed (its watcher said so); the writer catches up.
    private(set) var catchUpWanted = false
    /// The last catch-up failed (the database unreachable): the watcher asks again.
    private(set) var catchUpFailed = false
    /// Groups lost in a row to other brokers' commits, against `sharedAttempts`.
    private var lostGroups = 0

    /// Other brokers' commits a group may lose to, in a row, before its writes fail: each loss means another
    /// broker committed, so the brokers as a whole move on.
    static var sharedAttempts: Int { 64 }

    /// Items a turn commits on the owner for a nonblocking engine before the owner serves its other work (and comes
    /// back): one place's stream of large batches must not keep the owner's connections waiting.
    static var inlineItems: Int { 4096 }

    init(model: Model, environment: StoreEnvironment, place: EnginePlace, logger: Logger, stopping: Bool) {
        self.model = model
        self.environment = environment
        self.place = place
        self.logger = logger
        self.stopping = stopping
        limits = Limits(environment.configuration)
    }

    var position: Position { Position(epoch: epoch, sequence: sequence) }

    /// Nothing queued, loading or being written.
    var isIdle: Bool {
        guard case .idle = phase else { return false }
        return pending.isEmpty && loading != .loading && !catchUpWanted && waiting.isEmpty
    }

    /// The engine this place uses (the default engine for a place not created yet).
    func resolveEngine() throws(BrokerError) -> any StorageEngine {
        if let engine { return engine }
        return try environment.engines.engine(named: environment.configuration.defaultEngine)
    }

    /// `StoreEnvironment.offOwner`, the model kept until `then` has run: the writer holds it unowned (it holds the
    /// writer), and a job in flight must find it.
    private func offOwner<Result>(_ work: @escaping @Sendable () -> Result, then: @escaping (Result) -> Void) {
        let model = model
        environment.offOwner(work) { result in withExtendedLifetime(model) { then(result) } }
    }

    // MARK: Loading

    /// Runs `body` once the place is loaded (at once if it is), with the error if it cannot be.
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
        let job = model.loadJob()
        offOwner({ Result { () throws(BrokerError) in try job() } }) { result in
            switch result {
            case .success(let (loaded, contents)):
                let sequence = loaded?.position?.sequence ?? loaded?.store.openedSequence ?? 0
                self.sequence = sequence
                // A place whose directory exists but that never committed (a crash between the two) does not
                // exist yet; its first commit keeps the manifest's epoch.
                self.epoch = sequence > 0 ? (loaded?.position?.epoch ?? loaded?.manifest.epoch ?? 0) : 0
                self.manifest = loaded?.manifest
                self.engine = loaded?.engine
                self.engineStore = loaded?.store
                self.model.install(contents)
                self.becomeReady()
            case .failure(let error): self.loadFailed(error)
            }
        }
    }

    /// Loaded (or caught up from nothing): what waited runs, then the writer.
    func becomeReady() {
        loading = .ready
        let waiting = waiting
        self.waiting = []
        for body in waiting { body(nil) }
        startIfNeeded()
        notifyIdleWaiters()
        // Loaded once shutdown had begun: its engine store is closed once the writes queued meanwhile are done.
        if stopping { shutdown {} }
    }

    private func loadFailed(_ error: BrokerError) {
        logger.error("cannot load: \(error.message)", metadata: error.logMetadata)
        // An unconditional drop queued behind the failure is the way out for an operator: writes before it fail
        // with the error, the place is deleted without being loaded, and what follows starts afresh.
        guard let index = pending.firstIndex(where: \.dropsBrokenPlace) else { return failLoad(error) }
        for write in pending.prefix(index) { write.reply(.failure(error)) }
        let drop = pending[index]
        pending.removeFirst(index + 1)
        let place = place
        offOwner({ Result { () throws(BrokerError) in try place.dropBroken() } }) { result in
            switch result {
            case .failure(let failure):
                self.logger.error(
                    "drop of a place that cannot be loaded failed: \(failure.message)", metadata: failure.logMetadata)
                drop.reply(.failure(failure))
                self.failLoad(failure)
            case .success:
                self.logger.notice("dropped without loading it")
                drop.reply(.success(.written(CommitResult(committed: true, epoch: 0, sequence: 0))))
                self.load()
            }
        }
    }

    /// A failed load: every request waiting for it and every write queued behind it gets the error; the next
    /// request tries again.
    private func failLoad(_ error: BrokerError) {
        loading = .unloaded
        // A catch-up asked for during the load is asked for again by the watcher (`catchUpFailed`).
        if catchUpWanted {
            catchUpWanted = false
            catchUpFailed = true
        }
        let (waiting, writes) = (waiting, pending)
        self.waiting = []
        pending = []
        for body in waiting { body(error) }
        for write in writes { write.reply(.failure(error)) }
        notifyIdleWaiters()
    }

    /// Loads the place by a catch-up from nothing (`job`), for a shared place followed from its first commit; falls
    /// back to a plain load.
    func loadByCatchUp(_ job: @escaping @Sendable () -> ([CatchUpFinding<Model.Change>], BrokerError?)) {
        loading = .loading
        offOwner(job) { findings, failure in
            guard let failure else {
                self.take(findings)
                return self.becomeReady()
            }
            self.logger.warning("cannot replay the commits, loading instead: \(failure.message)")
            // The store the catch-up opened is closed before the load opens it again.
            let opened = Handover(
                findings.compactMap { finding -> (any EngineStore)? in
                    if case .opened(_, let store) = finding { return store }
                    return nil
                })
            self.offOwner({ for store in opened.value { store.close() } }) { _ in self.load() }
        }
    }

    private func take(_ findings: [CatchUpFinding<Model.Change>]) {
        for finding in findings {
            switch finding {
            case .opened(let engine, let store):
                self.engine = engine
                engineStore = store
            case .adopted(let adopted):
                manifest = adopted
            case .change(let change):
                model.take(change)
            }
        }
    }

    // MARK: Writes

    /// Queues writes, in order; each is answered once committed (or refused). Each write is moved into the queue and
    /// `writes` emptied, its capacity kept for the caller's next batch.
    func submit(_ writes: inout [Model.Write?]) {
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
            var write: Model.Write?
            swap(&write, &writes[index])
            let submitter = write!.submitter
            pending.append((consume write)!)
            if submitter != lastSubmitter {
                lastSubmitter = submitter
                if gathering.submitted(by: submitter) { completesGroup = true }
            }
        }
        writes.removeAll(keepingCapacity: true)
        if completesGroup, case .gathering(let timer, let round) = phase {
            timer.cancel()
            return gatheringEnded(round: round)
        }
        switch loading {
        case .ready: startIfNeeded()
        case .loading: break  // the load starts the writer
        case .unloaded: load()
        }
    }

    /// The load failed to leave anything usable (a failed drop): the next request loads again.
    func forgetLoad() { loading = .unloaded }

    /// Another broker may have committed: the writer catches up before its next group (a place still loading, once
    /// loaded).
    func requestCatchUp() {
        catchUpWanted = true
        catchUpFailed = false
        startIfNeeded()
    }

    private func startIfNeeded() {
        guard loading == .ready, case .idle = phase, !pending.isEmpty || catchUpWanted else { return }
        turn()
    }

    /// One turn of the writer: takes in other brokers' commits if asked, then commits what is queued, group after
    /// group, on the owner for a nonblocking engine (within `inlineItems`) and otherwise through one blocking job
    /// per group, which comes back here when it is done.
    ///
    /// The writer is `working` for the whole turn: a write submitted meanwhile (by a reply the turn gives) joins the
    /// queue this turn takes from, and never starts a second turn.
    private func turn() {
        phase = .working
        var items = 0
        while true {
            if catchUpWanted {
                catchUpWanted = false
                return catchUp { self.goOn() }
            }
            guard let alone = pending.first?.isAlone else { return stopped() }
            if alone {
                // Done at once (a drop whose condition fails, of a store that does not exist): the turn goes on.
                var synchronous = true
                var doneAtOnce = false
                model.performAlone(pending.removeFirst()) {
                    if synchronous { doneAtOnce = true } else { self.goOn() }
                }
                synchronous = false
                if doneAtOnce { continue }
                return
            }
            guard items < Self.inlineItems else {
                return environment.owner.execute { self.goOn() }
            }
            if let wait = gatheringWait() {
                gatheringRounds += 1
                let round = gatheringRounds
                phase = .gathering(
                    environment.owner.scheduleTask(in: .nanoseconds(Int64(wait))) { self.gatheringEnded(round: round) },
                    round: round)
                return
            }
            let group = takeGroup()
            for write in group { items += max(1, write.weight) }
            guard commit(group) else { return }
        }
    }

    /// A job came back, or the owner served its other work: the writer goes on with what is queued.
    private func goOn() {
        phase = .idle
        switch loading {
        case .ready:
            if pending.isEmpty, !catchUpWanted { return stopped() }
            startIfNeeded()
        case .unloaded:
            // A failed drop left the place to be loaded again: by the writes queued behind it, if any.
            if pending.isEmpty { notifyIdleWaiters() } else { load() }
        case .loading:
            break  // the load starts the writer
        }
    }

    /// Nothing is queued: a shutdown waiting for it goes on.
    private func stopped() {
        phase = .idle
        notifyIdleWaiters()
        if loading == .ready { model.writerStopped() }
    }

    /// The wait `round` is over: the group is whole, or its time is up. A timer that fired as it was cancelled
    /// finds the writer doing something else, and leaves it be.
    private func gatheringEnded(round: UInt64) {
        guard case .gathering(_, round) = phase else { return }
        gathering.endWait()
        goOn()
    }

    /// How long to wait for the writers the last group answered (`GroupGathering`): never for an engine that
    /// applies on the owner, a full group, `GroupGathering.largeGroup` writes already queued, or during shutdown.
    private func gatheringWait() -> UInt64? {
        guard !stopping, pending.count < limits.maxGroupCommit, let capabilities,
            !capabilities.contains(.nonblocking)
        else { return nil }
        return gathering.beginWait(maximum: limits.maxGroupWait, queued: pending.count)
    }

    /// The next group: the writes up to the next one that goes alone, at most `--max-group-commit` (one for an
    /// engine without atomic applies).
    private func takeGroup() -> [Model.Write] {
        let atomic = capabilities?.contains(.atomic) ?? true
        let limit = atomic ? limits.maxGroupCommit : 1
        var group: [Model.Write] = []
        group.reserveCapacity(min(limit, pending.count))
        while group.count < limit, let next = pending.popFirst() {
            if next.isAlone {
                pending.prepend(consume next)
                break
            }
            group.append(consume next)  // moved: without `consume` the optimizer copies it (two retains)
        }
        return group
    }

    /// Plans `writes` and has them applied: here, when the group is planned on the owner and the engine applies
    /// there too (true: the turn goes on), else through blocking jobs, the last of which goes on (false).
    private func commit(_ writes: [Model.Write]) -> Bool {
        let engine: any StorageEngine
        do throws(BrokerError) {
            engine = try resolveEngine()
        } catch {
            for write in writes { write.reply(.failure(error)) }
            return true
        }
        if let planning = model.planningJob(writes, engine: engine) {
            offOwner(planning) { plan in
                guard let plan = self.model.planned(plan), !self.apply(plan, engine: engine) else { return self.goOn() }
            }
            return false
        }
        guard let plan = model.plan(writes, engine: engine) else { return true }
        return apply(plan, engine: engine)
    }

    /// Has the engine apply `plan`: here for an engine that never blocks (true: done), else by a blocking job that
    /// finishes the group and goes on when it comes back (false).
    private func apply(_ plan: Model.Plan, engine: any StorageEngine) -> Bool {
        let shared = EnginePlace.isShared(engine)
        let job = ApplyJob(
            place: place, engine: engine, store: engineStore, manifest: manifest, shared: shared, steps: plan.steps,
            base: plan.base, epoch: plan.epoch, sequence: plan.sequence,
            records: shared ? model.sharedRecords(plan) : [])
        if engineStore != nil, capabilities?.contains(.nonblocking) == true, !shared, manifest?.committed == true {
            // On the owner: an apply that never blocks costs less than the hand-off to a thread and back.
            finish(plan, job.run())
            return true
        }
        let handed = Handover(job)
        offOwner({ handed.value.run() }) { applied in
            self.finish(plan, applied)
            self.goOn()
        }
        return false
    }

    /// A group's apply came back: published, or failed and answered, or lost to another broker's commit and queued
    /// again behind a catch-up.
    private func finish(_ plan: Model.Plan, _ applied: ApplyJob.Applied) {
        if let created = applied.created {
            engine = created.engine
            engineStore = created.store
            manifest = created.manifest
            logger.info(
                "created", metadata: ["engine": "\(created.engine.name)", "epoch": "\(created.manifest.epoch)"])
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
            return model.answer(plan, failure: failure)
        }
        epoch = plan.epoch
        sequence = plan.sequence
        gathering.committed(plan.writes, applyTook: applied.applyTook, queued: pending)
        model.publish(plan, applyTook: applied.applyTook)
    }

    // MARK: Shared places

    /// Brings the model up to the shared database (its `catchUpJob`), then `then`.
    private func catchUp(then: @escaping () -> Void) {
        offOwner(model.catchUpJob()) { findings, failure in
            self.take(findings)
            if let failure {
                self.logger.error(
                    "cannot catch up with the shared database: \(failure.message)", metadata: failure.logMetadata)
                self.catchUpFailed = true
            }
            then()
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
            self.offOwner({ handed.value.close() }) { _ in done() }
        }
    }

    /// Runs `body` once nothing is queued, loading or being written (now, if so).
    func whenIdle(_ body: @escaping () -> Void) {
        if isIdle { body() } else { idleWaiters.append(body) }
    }

    private func notifyIdleWaiters() {
        guard isIdle, !idleWaiters.isEmpty else { return }
        let waiters = idleWaiters
        idleWaiters = []
        for waiter in waiters { waiter() }
    }
}
