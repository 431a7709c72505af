import DequeModule
import Logging
import NIOCore
import StoreModel

/// Encrypts secure values at rest. The daemon implements it with AES-GCM (swift-crypto); `name` is bound to
/// the ciphertext, so a sealed value cannot be moved to another name.
public protocol ValueSealer: Sendable {
    func seal(_ plaintext: ByteBuffer, name: String) throws(BrokerError) -> ByteBuffer
    func open(_ sealed: ByteBuffer, name: String) throws(BrokerError) -> ByteBuffer
}

/// Every value of one namespace (values, or secure values): Boutique's @StoredValue across processes. Owned by
/// the broker's owner loop, as a store is (`StoreEnvironment`).
///
/// All values of a namespace live in one engine store (`DATA/values`, `DATA/secure-values`), one record per
/// name: `u64 sequence, u8 state (0 unset, 1 set), bytes` (sealed for secure values). A reset keeps its record
/// as "unset" so that the value's sequence keeps counting and an old sequence never matches again. Each value
/// has its own sequence and events; the namespace has one epoch (its manifest's). Writes queue and are
/// committed in groups as a store's are (on the owner for a nonblocking engine, else one blocking job per group);
/// reads answer from memory.
final class ValueSpace: @unchecked Sendable {
    // `@unchecked Sendable`: blocking jobs capture the namespace for its immutable fields; its state is touched
    // only on the owner.
    let namespace: Namespace
    private let environment: StoreEnvironment
    private let sealer: (any ValueSealer)?
    private let clock: WallClock

    private struct Entry {
        var sequence: UInt64
        var value: ByteBuffer?
    }

    private var loaded = false
    private var loading = false
    private var waiting: [(BrokerError?) -> Void] = []
    private var values: [String: Entry] = [:]
    /// 0 until the namespace's first commit.
    private var epoch: UInt64 = 0
    /// The engine store's own sequence: +1 per commit of any value.
    private var commits: UInt64 = 0
    private var manifest: Manifest?
    private var engine: (any StorageEngine)?
    private var engineStore: (any EngineStore)?
    private var subscribers: [String: [ObjectIdentifier: Subscription]] = [:]
    private var pending = Deque<Write>()
    /// A group is being committed by a blocking job, or a catch-up reads the shared database.
    private var writing = false
    private var stopping = false
    private var idleWaiters: [() -> Void] = []
    /// Shared values (ABI 2.1): another broker may have committed; the writer catches up.
    private var catchUpWanted = false
    private(set) var catchUpFailed = false
    private var lostGroups = 0

    struct Write {
        var name: String
        /// `nil`: reset.
        var value: ByteBuffer?
        var condition: Condition
        var reply: Reply
    }

    init(namespace: Namespace, environment: StoreEnvironment, sealer: (any ValueSealer)?) {
        self.namespace = namespace
        self.environment = environment
        self.sealer = sealer
        clock = environment.configuration.clock
    }

    private var isSecure: Bool { namespace == .secureValue }

    private var place: EnginePlace {
        EnginePlace(
            environment: environment, place: environment.directory.values(namespace),
            storeName: Self.engineStoreName(namespace))
    }

    /// The name the engine is told: one no store can have ('#' is not allowed in one), so that an engine that
    /// names stores by name (a shared one) never mixes a namespace with a store called "values".
    static func engineStoreName(_ namespace: Namespace) -> String {
        namespace == .secureValue ? "#secure-values" : "#values"
    }

    private var logger: Logger {
        var logger = environment.logger
        logger[metadataKey: "namespace"] = "\(isSecure ? "secure-values" : "values")"
        return logger
    }

    /// Forgets a subscriber, and the name's table of them once it is empty: a client subscribing to many names in
    /// turn leaves nothing behind.
    private func removeSubscriber(_ key: ObjectIdentifier, of name: String) {
        guard subscribers[name]?.removeValue(forKey: key) != nil, subscribers[name]?.isEmpty == true else { return }
        subscribers[name] = nil
    }

    // MARK: Loading

    private func whenLoaded(_ body: @escaping (BrokerError?) -> Void) {
        if loaded { return body(nil) }
        waiting.append(body)
        if !loading { load() }
    }

    private func load() {
        loading = true
        let place = place
        let decode = self.decode
        environment.offOwner({ () -> Result<(EnginePlace.Loaded?, [String: Entry]), BrokerError> in
            Result { () throws(BrokerError) in
                var records: [EngineRecord] = []
                let loaded = try place.load(visit: { records.append(EngineRecord($0)) })
                var values: [String: Entry] = [:]
                for record in records {
                    let name = String(decoding: record.key, as: UTF8.self)
                    values[name] = try decode(record.payload, name)
                }
                return (loaded, values)
            }
        }) { result in
            self.loading = false
            switch result {
            case .success(let (loaded, values)):
                self.values = values
                self.commits = loaded?.position?.sequence ?? loaded?.store.openedSequence ?? 0
                self.epoch = self.commits > 0 ? (loaded?.position?.epoch ?? loaded?.manifest.epoch ?? 0) : 0
                self.manifest = loaded?.manifest
                self.engine = loaded?.engine
                self.engineStore = loaded?.store
                self.loaded = true
                let waiting = self.waiting
                self.waiting = []
                for body in waiting { body(nil) }
                self.startWriterIfNeeded()
                self.notifyIdleWaiters()
                if self.stopping { self.shutdown {} }
            case .failure(let error):
                self.logger.error("cannot load: \(error.message)", metadata: error.logMetadata)
                let (waiting, writes) = (self.waiting, self.pending)
                self.waiting = []
                self.pending = []
                for body in waiting { body(error) }
                for write in writes { write.reply(.failure(error)) }
                self.notifyIdleWaiters()
            }
        }
    }

    /// A record's payload: `u64 sequence, u8 state, bytes`.
    private func encode(_ entry: Entry, name: String) throws(BrokerError) -> ByteBuffer {
        var out = ByteBuffer()
        out.writeInteger(entry.sequence)
        if let value = entry.value {
            out.writeInteger(UInt8(1))
            var stored = value
            if let sealer { stored = try sealer.seal(value, name: name) }
            out.writeBuffer(&stored)
        } else {
            out.writeInteger(UInt8(0))
        }
        return out
    }

    /// Decodes a record's payload (on whatever thread reads it: it touches no state).
    private var decode: @Sendable (ByteBuffer, String) throws(BrokerError) -> Entry {
        let sealer = sealer
        return { (payload: ByteBuffer, name: String) throws(BrokerError) -> Entry in
            var payload = payload
            guard let sequence = payload.readInteger(as: UInt64.self), let tag = payload.readInteger(as: UInt8.self),
                tag <= 1
            else {
                throw BrokerError(.engineError, "the stored record of value \(name) is corrupt")
            }
            guard tag == 1 else { return Entry(sequence: sequence, value: nil) }
            if let sealer { return Entry(sequence: sequence, value: try sealer.open(payload, name: name)) }
            return Entry(sequence: sequence, value: payload)
        }
    }

    // MARK: Reads

    private func state(of entry: Entry?, withheld: Bool) -> ValueState {
        guard let value = entry?.value else { return .unset }
        return withheld ? .setWithheld : .set(Payload(value))
    }

    /// `valueResult`: an unset value answers state `unset`, with its sequence.
    func get(_ name: String, _ reply: Reply) {
        whenLoaded { failure in
            if let failure { return reply(.failure(failure)) }
            let entry = self.values[name]
            reply(
                .success(
                    .value(
                        Position(epoch: self.epoch, sequence: entry?.sequence ?? 0), self.state(of: entry, withheld: false))))
        }
    }

    /// Every value ever set (reset ones too, unset), in name byte order, that `grant` lets its peer read.
    func list(readableBy grant: Grant, _ reply: Reply) {
        whenLoaded { failure in
            if let failure { return reply(.failure(failure)) }
            let listed = self.values.compactMap { name, entry -> ValueInfo? in
                guard grant.allows(name, write: false) else { return nil }
                return ValueInfo(name: name, epoch: self.epoch, sequence: entry.sequence, isSet: entry.value != nil)
            }
            reply(.success(.values(listed.sorted { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) })))
        }
    }

    func subscribe(_ subscription: Subscription, start: SubscriptionStart, _ reply: Reply) {
        whenLoaded { failure in
            if let failure { return reply(.failure(failure)) }
            let name = subscription.name
            let entry = self.values[name]
            let position = Position(epoch: self.epoch, sequence: entry?.sequence ?? 0)
            let loaded = Push.valueLoaded(position, self.state(of: entry, withheld: self.isSecure))
            switch start {
            case .resume(let epoch, let sequence) where epoch == position.epoch && sequence == position.sequence:
                break  // nothing missed
            case .resume:
                // A value keeps no history but its latest state: anything else is "history gone".
                subscription.offer(.historyGone(position), at: position, force: true)
                subscription.offer(loaded, at: position, force: true)
            case .snapshot:
                subscription.offer(loaded, at: position, force: true)
            }
            self.subscribers[name, default: [:]][ObjectIdentifier(subscription)] = subscription
            reply(.success(.subscribed(subscriptionID: subscription.id)))
        }
    }

    func unsubscribe(_ subscription: Subscription) {
        removeSubscriber(ObjectIdentifier(subscription), of: subscription.name)
        subscription.cancel()
    }

    // MARK: Writes

    /// Queues writes, in order (all those of one turn of the owner at once).
    func submit(_ writes: [Write]) {
        guard isSecure == false || sealer != nil else {
            let error = BrokerError(.notSupported, "this broker has no key for secure values")
            for write in writes { write.reply(.failure(error)) }
            return
        }
        guard !stopping else {
            let error = BrokerError(.shuttingDown, "the broker is shutting down")
            for write in writes { write.reply(.failure(error)) }
            return
        }
        pending.append(contentsOf: writes)
        if loaded { startWriterIfNeeded() } else if !loading { load() }
    }

    private func startWriterIfNeeded() {
        guard loaded, !writing else { return }
        while !writing {
            if catchUpWanted {
                catchUpWanted = false
                writing = true
                return catchUp { self.writerGoesOn() }
            }
            guard !pending.isEmpty else { return notifyIdleWaiters() }
            let count = min(pending.count, max(1, environment.configuration.maxGroupCommit))
            let group = Array(pending.prefix(count))
            pending.removeFirst(count)
            commit(group)
        }
    }

    private func writerGoesOn() {
        writing = false
        startWriterIfNeeded()
        notifyIdleWaiters()
    }

    private var isIdle: Bool { !writing && pending.isEmpty && !loading && !catchUpWanted }

    private func notifyIdleWaiters() {
        guard isIdle, !idleWaiters.isEmpty else { return }
        let waiters = idleWaiters
        idleWaiters = []
        for waiter in waiters { waiter() }
    }

    private enum Outcome {
        case failed(BrokerError)
        case unchanged(sequence: UInt64)
        case committed(name: String, entry: Entry)
    }

    private func conflict(_ condition: Condition, name: String, entry: Entry?, epoch: UInt64) -> BrokerError? {
        let sequence = entry?.sequence ?? 0
        let holds: Bool
        switch condition {
        case .unconditional: holds = true
        case .sequence(let expected): holds = expected == sequence
        case .absent: holds = entry?.value == nil
        case .epochSequence(let expectedEpoch, let expected): holds = expectedEpoch == epoch && expected == sequence
        }
        if holds { return nil }
        let now = entry?.value == nil ? "is unset (at sequence \(sequence))" : "is set, at sequence \(sequence)"
        let expected: String
        switch condition {
        case .unconditional: expected = "nothing"
        case .sequence(let expectedSequence): expected = "sequence \(expectedSequence)"
        case .absent: expected = "it unset"
        case .epochSequence(let expectedEpoch, let expectedSequence):
            expected = "sequence \(expectedSequence) in epoch \(expectedEpoch)"
        }
        return BrokerError(.conflict, "\(isSecure ? "secure value" : "value") \(name) \(now); the write expected \(expected)")
    }

    private struct Plan {
        var outcomes: [Outcome] = []
        var steps: [EngineStep] = []
        var epoch: UInt64
        var commits: UInt64
    }

    /// Plans each write against the values as the writes before it leave them.
    private func plan(_ writes: [Write]) throws(BrokerError) -> Plan {
        let now = clock.milliseconds()
        var working: [String: Entry] = [:]
        var plan = Plan(epoch: epoch, commits: commits)
        for write in writes {
            let entry = working[write.name] ?? values[write.name]
            if let conflict = conflict(write.condition, name: write.name, entry: entry, epoch: plan.epoch) {
                plan.outcomes.append(.failed(conflict))
                continue
            }
            if write.value == entry?.value {
                plan.outcomes.append(.unchanged(sequence: entry?.sequence ?? 0))  // same bytes, or reset of unset
                continue
            }
            let next = Entry(sequence: (entry?.sequence ?? 0) + 1, value: write.value)
            working[write.name] = next
            if plan.commits == 0 { plan.epoch = manifest?.epoch ?? Manifest.newEpoch() }
            plan.commits += 1
            plan.steps.append(
                .put(
                    EngineRecord(
                        key: Array(write.name.utf8), payload: try encode(next, name: write.name), createdAt: now,
                        updatedAt: now)))
            plan.outcomes.append(.committed(name: write.name, entry: next))
        }
        return plan
    }

    /// Plans `writes` and has them applied: on the owner for a nonblocking engine, else by a blocking job (the
    /// writer waits for it).
    private func commit(_ writes: [Write]) {
        let plan: Plan
        do throws(BrokerError) {
            plan = try self.plan(writes)
        } catch {
            for write in writes { write.reply(.failure(error)) }
            return
        }
        guard !plan.steps.isEmpty else {
            for (write, outcome) in zip(writes, plan.outcomes) { answer(write, outcome, epoch: plan.epoch) }
            return
        }
        let engine: any StorageEngine
        do throws(BrokerError) {
            if let known = self.engine {
                engine = known
            } else {
                engine = try environment.engines.engine(named: environment.configuration.defaultEngine)
            }
        } catch {
            for write in writes { write.reply(.failure(error)) }
            return
        }
        let job = ApplyValues(
            place: place, engine: engine, store: engineStore, manifest: manifest, steps: plan.steps, epoch: plan.epoch,
            commits: plan.commits)
        if let store = engineStore, engine.capabilities.contains(.nonblocking), !EnginePlace.isShared(engine),
            manifest?.committed == true
        {
            let failure = Result { () throws(BrokerError) in
                try EnginePlace.engineCall { () throws(EngineFailure) in try store.apply(plan.steps, sequence: plan.commits) }
            }
            var applied = ApplyValues.Applied()
            if case .failure(let error) = failure { applied.failure = error }
            return finish(writes, plan, applied)
        }
        writing = true
        let handed = Handover(job)
        environment.offOwner({ handed.value.run() }) { applied in
            self.finish(writes, plan, applied)
            self.writerGoesOn()
        }
    }

    private func finish(_ writes: [Write], _ plan: Plan, _ applied: ApplyValues.Applied) {
        if let created = applied.created {
            engine = created.engine
            engineStore = created.store
        }
        if let updated = applied.manifest { manifest = updated }
        if applied.lost {
            lostGroups += 1
            if lostGroups < ManagedStore.sharedAttempts {
                for write in writes.reversed() { pending.prepend(write) }
                catchUpWanted = true
                return
            }
        }
        lostGroups = 0
        if let failure = applied.failure {
            logger.error("commit failed, nothing changed: \(failure.message)", metadata: failure.logMetadata)
            for (write, outcome) in zip(writes, plan.outcomes) {
                if case .committed = outcome { write.reply(.failure(failure)) } else { answer(write, outcome, epoch: plan.epoch) }
            }
            return
        }
        var changes: [(name: String, entry: Entry)] = []
        for outcome in plan.outcomes {
            guard case .committed(let name, let entry) = outcome else { continue }
            values[name] = entry
            changes.append((name, entry))
        }
        epoch = plan.epoch
        commits = plan.commits
        announce(changes, epoch: plan.epoch)
        for (write, outcome) in zip(writes, plan.outcomes) { answer(write, outcome, epoch: plan.epoch) }
    }

    /// Committed changes, in order, to their subscribers and the observers; subscribers that lagged or went away
    /// are forgotten.
    private func announce(_ changes: [(name: String, entry: Entry)], epoch: UInt64) {
        var ended: [(String, ObjectIdentifier)] = []
        for change in changes {
            let position = Position(epoch: epoch, sequence: change.entry.sequence)
            if let listening = subscribers[change.name] {
                let event = SharedPush(.valueEvent(position, self.state(of: change.entry, withheld: isSecure)))
                for (key, subscription) in listening where !subscription.offer(event, at: position) {
                    ended.append((change.name, key))
                }
            }
            for observer in environment.observers {
                observer.valueChanged(name: change.name, sequence: change.entry.sequence, secure: isSecure)
            }
        }
        for (name, key) in ended { removeSubscriber(key, of: name) }
    }

    private func answer(_ write: Write, _ outcome: Outcome, epoch: UInt64) {
        switch outcome {
        case .failed(let error): write.reply(.failure(error))
        case .unchanged(let sequence):
            write.reply(.success(.written(CommitResult(committed: false, epoch: epoch, sequence: sequence))))
        case .committed(_, let entry):
            write.reply(.success(.written(CommitResult(committed: true, epoch: epoch, sequence: entry.sequence))))
        }
    }

    // MARK: Shared values

    /// Another broker may have committed to this namespace: the writer catches up before its next group (a
    /// namespace not loaded yet reads the database when it loads).
    func follow(reaching position: Position? = nil) {
        guard loaded, !stopping else { return }
        // Already there (this broker's own commit): nothing to catch up.
        if let position, position.epoch == epoch, position.sequence == commits { return }
        catchUpWanted = true
        catchUpFailed = false
        startWriterIfNeeded()
    }

    /// Loads the namespace now (a shared one is followed from the start, so that every change another broker
    /// makes is announced here).
    func preload() {
        whenLoaded { _ in }
    }

    /// Takes in the changes other brokers committed since this namespace's position (`CatchUpValues`) and announces
    /// them as if made here, then `then`.
    private func catchUp(then: @escaping () -> Void) {
        let job = CatchUpValues(
            place: place, engine: engine, defaultEngine: environment.configuration.defaultEngine,
            engines: environment.engines, store: engineStore, epoch: epoch, commits: commits, manifest: manifest,
            decode: decode)
        environment.offOwner({ job.run() }) { (effects, failure) in
            for effect in effects {
                switch effect {
                case .opened(let engine, let store):
                    self.engine = engine
                    self.engineStore = store
                case .adopted(let adopted):
                    self.manifest = adopted
                case .changes(let fetched, let epoch):
                    guard let last = fetched.last else { continue }
                    for change in fetched { self.values[change.name] = change.entry }
                    self.epoch = epoch
                    self.commits = last.commit
                    self.announce(fetched.map { ($0.name, $0.entry) }, epoch: epoch)
                case .reloaded(let values, let position, let adopted):
                    var changes: [(name: String, entry: Entry)] = []
                    for (name, entry) in values where self.values[name]?.sequence != entry.sequence {
                        changes.append((name, entry))
                    }
                    self.values = values
                    self.epoch = position.epoch
                    self.commits = position.sequence
                    self.manifest = adopted
                    self.logger.notice(
                        "reloaded from the shared database: the commit log no longer reached back to this broker's position")
                    self.announce(changes.sorted { $0.entry.sequence < $1.entry.sequence }, epoch: position.epoch)
                }
            }
            if let failure {
                self.logger.error("cannot catch up with the shared database: \(failure.message)", metadata: failure.logMetadata)
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
            self.environment.offOwner({ handed.value.close() }) { _ in done() }
        }
    }

    private func whenIdle(_ body: @escaping () -> Void) {
        if isIdle { body() } else { idleWaiters.append(body) }
    }

    /// A group's apply on a thread for blocking work, creating the namespace's store on its first commit.
    private struct ApplyValues {
        let place: EnginePlace
        let engine: any StorageEngine
        let store: (any EngineStore)?
        let manifest: Manifest?
        let steps: [EngineStep]
        let epoch: UInt64
        let commits: UInt64

        struct Applied {
            var created: (engine: any StorageEngine, store: any EngineStore)?
            var manifest: Manifest?
            var failure: BrokerError?
            var lost = false
        }

        func run() -> Applied {
            var applied = Applied()
            var manifest = self.manifest
            do throws(BrokerError) {
                let open: any EngineStore
                if let store {
                    open = store
                } else {
                    let (made, created) = try place.create(engine: engine, existing: manifest, epoch: epoch)
                    applied.created = (engine, created)
                    applied.manifest = made
                    manifest = made
                    open = created
                }
                if EnginePlace.isShared(engine), let shared = open as? any SharedEngineStore {
                    // Shared with other brokers: committed only at the position planned against. Each change is one
                    // commit of the namespace, its record the change itself.
                    let base = commits - UInt64(steps.count)
                    var records: [(sequence: UInt64, record: [UInt8])] = []
                    for (index, step) in steps.enumerated() {
                        guard case .put(let record) = step else { continue }
                        records.append(
                            (base + UInt64(index) + 1, CommitRecord.encodeValue(key: record.key, payload: record.payload)))
                    }
                    let expected = Position(epoch: base == 0 ? 0 : epoch, sequence: base)
                    try EnginePlace.engineCall { () throws(EngineFailure) in
                        try shared.apply(steps, at: expected, epoch: epoch, commits: records)
                    }
                } else {
                    try EnginePlace.engineCall { () throws(EngineFailure) in try open.apply(steps, sequence: commits) }
                }
            } catch where (error.underlying as? EngineFailure)?.code == .conflict && EnginePlace.isShared(engine) {
                applied.lost = true
                return applied
            } catch {
                applied.failure = error
                return applied
            }
            if let current = manifest, !current.committed, let updated = place.recordCommitted(current) {
                applied.manifest = updated
            }
            return applied
        }
    }

    /// A shared namespace's catch-up on a thread for blocking work, as a store's (`CatchUpJob`).
    private struct CatchUpValues: @unchecked Sendable {
        // `@unchecked Sendable`: the engine store is the owner's, handed to this job while the writer waits for it.
        let place: EnginePlace
        let engine: (any StorageEngine)?
        let defaultEngine: String
        let engines: any EngineProvider
        let store: (any EngineStore)?
        let epoch: UInt64
        let commits: UInt64
        let manifest: Manifest?
        let decode: @Sendable (ByteBuffer, String) throws(BrokerError) -> Entry

        enum Effect {
            case opened(any StorageEngine, any EngineStore)
            case adopted(Manifest)
            case changes([(name: String, entry: Entry, commit: UInt64)], epoch: UInt64)
            case reloaded([String: Entry], Position, Manifest?)
        }

        func run() -> ([Effect], BrokerError?) {
            var effects: [Effect] = []
            do throws(BrokerError) {
                try catchUp(into: &effects)
                return (effects, nil)
            } catch {
                return (effects, error)
            }
        }

        private func catchUp(into effects: inout [Effect]) throws(BrokerError) {
            var store = self.store
            var manifest = self.manifest
            for _ in 0..<2 {
                let engine: any StorageEngine
                if let known = self.engine { engine = known } else { engine = try engines.engine(named: defaultEngine) }
                guard
                    let shared = try place.sharedStore(engine, current: store, keep: { opened in
                        store = opened
                        effects.append(.opened(engine, opened))
                    })
                else { return }
                var fetched: [(name: String, entry: Entry, commit: UInt64)] = []
                var unreadable: BrokerError?
                func read(epoch: UInt64, after: UInt64) throws(BrokerError) -> Position {
                    try EnginePlace.engineCall { () throws(EngineFailure) in
                        try shared.commits(epoch: epoch, after: after) { sequence, record in
                            guard unreadable == nil else { return }
                            do throws(BrokerError) {
                                let (key, payload) = try CommitRecord.decodeValue(record, sequence: sequence)
                                let name = String(decoding: key, as: UTF8.self)
                                fetched.append((name, try decode(payload, name), sequence))
                            } catch {
                                unreadable = error
                            }
                        }
                    }
                }
                do throws(BrokerError) {
                    var position = try read(epoch: epoch, after: commits)
                    if let unreadable { throw unreadable }
                    if position.epoch == epoch {
                        // Behind this broker: the database lost commits it holds (restored, a replica promoted).
                        if position.sequence < commits {
                            return try reload(shared, engine: engine, manifest: manifest, into: &effects)
                        }
                        effects.append(.changes(fetched, epoch: epoch))
                        return
                    }
                    guard position.epoch != 0 else { return }
                    guard epoch == 0 else { return try reload(shared, engine: engine, manifest: manifest, into: &effects) }
                    let adopted = try place.adopt(engine: engine, existing: manifest, epoch: position.epoch)
                    effects.append(.adopted(adopted))
                    manifest = adopted
                    fetched = []
                    position = try read(epoch: position.epoch, after: 0)
                    if let unreadable { throw unreadable }
                    if position.epoch == adopted.epoch {
                        effects.append(.changes(fetched, epoch: adopted.epoch))
                        return
                    }
                } catch where (error.underlying as? EngineFailure)?.code == .gone {
                    return try reload(shared, engine: engine, manifest: manifest, into: &effects)
                }
            }
        }

        /// The namespace as the database holds it now.
        private func reload(
            _ shared: any SharedEngineStore, engine: any StorageEngine, manifest: Manifest?, into effects: inout [Effect]
        ) throws(BrokerError) {
            var records: [EngineRecord] = []
            let position = try EnginePlace.engineCall { () throws(EngineFailure) in
                try shared.load { records.append(EngineRecord($0)) }
            }
            var values: [String: Entry] = [:]
            for record in records {
                let name = String(decoding: record.key, as: UTF8.self)
                values[name] = try decode(record.payload, name)
            }
            let adopted =
                position.epoch == 0 ? manifest : try place.adopt(engine: engine, existing: manifest, epoch: position.epoch)
            effects.append(.reloaded(values, position, adopted))
        }
    }
}
