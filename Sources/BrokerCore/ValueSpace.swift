import DequeModule
import Locking
import Logging
import NIOCore
import StoreModel

/// Encrypts secure values at rest. The daemon implements it with AES-GCM (swift-crypto); `name` is bound to
/// the ciphertext, so a sealed value cannot be moved to another name.
public protocol ValueSealer: Sendable {
    func seal(_ plaintext: ByteBuffer, name: String) throws(BrokerError) -> ByteBuffer
    func open(_ sealed: ByteBuffer, name: String) throws(BrokerError) -> ByteBuffer
}

/// Every value of one namespace (values, or secure values): Boutique's @StoredValue across processes.
///
/// All values of a namespace live in one engine store (`DATA/values`, `DATA/secure-values`), one record per
/// name: `u64 sequence, u8 state (0 unset, 1 set), bytes` (sealed for secure values). A reset keeps its record
/// as "unset" so that the value's sequence keeps counting and an old sequence never matches again. Each value
/// has its own sequence and events; the namespace has one epoch (its manifest's). Writes queue and are
/// committed in groups like a store's, by the same kind of writer job on the broker's writer pool; reads
/// answer from memory.
final class ValueSpace: Sendable {
    let namespace: Namespace
    private let environment: StoreEnvironment
    private let sealer: (any ValueSealer)?
    private let state: Locked<State>
    private let clock: WallClock

    private struct Entry {
        var sequence: UInt64
        var value: ByteBuffer?
    }

    private struct State: WriterState {
        var loaded = false
        var loading = false
        var waiting: [@Sendable (BrokerError?) -> Void] = []
        var values: [String: Entry] = [:]
        /// 0 until the namespace's first commit.
        var epoch: UInt64 = 0
        /// The engine store's own sequence: +1 per commit of any value.
        var commits: UInt64 = 0
        var manifest: Manifest?
        var engine: (any StorageEngine)?
        var engineStore: (any EngineStore)?
        var subscribers: [String: [ObjectIdentifier: Subscription]] = [:]
        var pending = Deque<Write>()
        var writing = false
        var stopping = false
        var idleWaiters: [CheckedContinuation<Void, Never>] = []

        mutating func markLoadFailed() { loading = false }

        /// Shared values (ABI 2.1): another broker may have committed; the writer catches up.
        var catchUpWanted = false
        var catchUpFailed = false

        /// Forgets a subscriber, and the name's table of them once it is empty: a client subscribing to many
        /// names in turn leaves nothing behind.
        mutating func removeSubscriber(_ key: ObjectIdentifier, of name: String) {
            guard subscribers[name]?.removeValue(forKey: key) != nil, subscribers[name]?.isEmpty == true else { return }
            subscribers[name] = nil
        }
    }

    struct Write: QueuedWrite {
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
        self.state = Locked(State())
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

    // MARK: Loading

    private func whenLoaded(_ body: @escaping @Sendable (BrokerError?) -> Void) {
        let (run, load) = state.withLock { state -> (Bool, Bool) in
            if state.loaded { return (true, false) }
            state.waiting.append(body)
            defer { state.loading = true }
            return (false, !state.loading)
        }
        if run { body(nil) }
        if load { environment.onWriter { self.load() } }
    }

    private func load() {
        do throws(BrokerError) {
            var records: [EngineRecord] = []
            let loaded = try place.load(visit: { records.append(EngineRecord($0)) })
            var values: [String: Entry] = [:]
            for record in records {
                let name = String(decoding: record.key, as: UTF8.self)
                values[name] = try decode(record.payload, name: name)
            }
            let (waiting, late) = state.withLock { state in
                state.values = values
                state.commits = loaded?.position?.sequence ?? loaded?.store.openedSequence ?? 0
                state.epoch = state.commits > 0 ? (loaded?.position?.epoch ?? loaded?.manifest.epoch ?? 0) : 0
                state.manifest = loaded?.manifest
                state.engine = loaded?.engine
                // Loaded after shutdown began: answered, but the engine store is closed now.
                state.engineStore = state.stopping ? nil : loaded?.store
                state.loaded = true
                state.loading = false
                defer { state.waiting = [] }
                return (state.waiting, state.stopping ? loaded?.store : nil)
            }
            late?.close()
            for body in waiting { body(nil) }
            startWriterIfNeeded()
        } catch {
            logger.error("cannot load: \(error.message)", metadata: error.logMetadata)
            state.failLoad(error)
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

    private func decode(_ payload: ByteBuffer, name: String) throws(BrokerError) -> Entry {
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

    // MARK: Reads

    private func state(of entry: Entry?, withheld: Bool) -> ValueState {
        guard let value = entry?.value else { return .unset }
        return withheld ? .setWithheld : .set(Payload(value))
    }

    /// `valueResult`: an unset value answers state `unset`, with its sequence.
    func get(_ name: String, _ reply: Reply) {
        whenLoaded { failure in
            if let failure { return reply(.failure(failure)) }
            let answer = self.state.withLock { state in
                let entry = state.values[name]
                return BrokerAnswer.value(
                    Position(epoch: state.epoch, sequence: entry?.sequence ?? 0), self.state(of: entry, withheld: false))
            }
            reply(.success(answer))
        }
    }

    /// Every value ever set (reset ones too, unset), in name byte order, that `grant` lets its peer read.
    func list(readableBy grant: Grant, _ reply: Reply) {
        whenLoaded { failure in
            if let failure { return reply(.failure(failure)) }
            let listed = self.state.withLock { state in
                state.values.compactMap { name, entry -> ValueInfo? in
                    guard grant.allows(name, write: false) else { return nil }
                    return ValueInfo(name: name, epoch: state.epoch, sequence: entry.sequence, isSet: entry.value != nil)
                }
            }
            reply(.success(.values(listed.sorted { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) })))
        }
    }

    func subscribe(_ subscription: Subscription, start: SubscriptionStart, _ reply: Reply) {
        whenLoaded { failure in
            if let failure { return reply(.failure(failure)) }
            let name = subscription.name
            self.state.withLock { state in
                let entry = state.values[name]
                let position = Position(epoch: state.epoch, sequence: entry?.sequence ?? 0)
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
                state.subscribers[name, default: [:]][ObjectIdentifier(subscription)] = subscription
            }
            reply(.success(.subscribed(subscriptionID: subscription.id)))
        }
    }

    func unsubscribe(_ subscription: Subscription) {
        state.withLock { $0.removeSubscriber(ObjectIdentifier(subscription), of: subscription.name) }
        subscription.cancel()
    }

    // MARK: Writes

    /// Queues writes, in order (all those of one read cycle of a connection at once).
    func submit(_ writes: [Write]) {
        guard isSecure == false || sealer != nil else {
            let error = BrokerError(.notSupported, "this broker has no key for secure values")
            for write in writes { write.reply(.failure(error)) }
            return
        }
        let queued = state.withLock { state -> Bool in
            guard !state.stopping else { return false }
            state.pending.append(contentsOf: writes)
            return true
        }
        guard queued else {
            let error = BrokerError(.shuttingDown, "the broker is shutting down")
            for write in writes { write.reply(.failure(error)) }
            return
        }
        whenLoaded { failure in
            if failure == nil { self.startWriterIfNeeded() }
        }
    }

    private func startWriterIfNeeded() {
        let start = state.withLock { state -> Bool in
            guard state.loaded, !state.writing, !state.pending.isEmpty || state.catchUpWanted else { return false }
            state.writing = true
            return true
        }
        if start { environment.onWriter { self.runWriter() } }
    }

    /// The writer's job, as a store's: groups until the queue is empty, or a turn's worth.
    private func runWriter() {
        for _ in 0..<StoreEnvironment.groupsPerTurn {
            // The group, and whether other brokers' commits are to be taken in first, under one lock.
            let (group, catchUp) = state.withLock { state -> ([Write], Bool) in
                let catchUp = state.catchUpWanted
                state.catchUpWanted = false
                let count = min(state.pending.count, max(1, environment.configuration.maxGroupCommit))
                defer { state.pending.removeFirst(count) }
                return (Array(state.pending.prefix(count)), catchUp)
            }
            if catchUp { HandOffs.gathering { catchUpReporting() } }
            guard !group.isEmpty else { break }
            HandOffs.gathering { commit(group) }
        }
        if state.writerGoesOn() { environment.onWriter { self.runWriter() } }
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

    private func commit(_ writes: [Write], attempt: Int = 1) {
        let now = clock.milliseconds()
        // Plan each write against the values as the writes before it leave them.
        let plan: Result<(outcomes: [Outcome], steps: [EngineStep], epoch: UInt64, commits: UInt64), BrokerError> =
            state.withLock { state in
                var working: [String: Entry] = [:]
                var epoch = state.epoch
                var commits = state.commits
                var outcomes: [Outcome] = []
                var steps: [EngineStep] = []
                do throws(BrokerError) {
                    for write in writes {
                        let entry = working[write.name] ?? state.values[write.name]
                        if let conflict = conflict(write.condition, name: write.name, entry: entry, epoch: epoch) {
                            outcomes.append(.failed(conflict))
                            continue
                        }
                        if write.value == entry?.value {
                            outcomes.append(.unchanged(sequence: entry?.sequence ?? 0))  // same bytes, or reset of unset
                            continue
                        }
                        let next = Entry(sequence: (entry?.sequence ?? 0) + 1, value: write.value)
                        working[write.name] = next
                        if commits == 0 { epoch = state.manifest?.epoch ?? Manifest.newEpoch() }
                        commits += 1
                        steps.append(
                            .put(
                                EngineRecord(
                                    key: Array(write.name.utf8), payload: try encode(next, name: write.name), createdAt: now,
                                    updatedAt: now)))
                        outcomes.append(.committed(name: write.name, entry: next))
                    }
                } catch {
                    return .failure(error)
                }
                return .success((outcomes, steps, epoch, commits))
            }
        let planned: (outcomes: [Outcome], steps: [EngineStep], epoch: UInt64, commits: UInt64)
        switch plan {
        case .failure(let error):
            for write in writes { write.reply(.failure(error)) }
            return
        case .success(let value): planned = value
        }
        if !planned.steps.isEmpty {
            do throws(BrokerError) {
                let store = try engineStore(epoch: planned.epoch)
                if let engine = state.withLock({ $0.engine }), EnginePlace.isShared(engine),
                    let shared = store as? any SharedEngineStore
                {
                    // Shared with other brokers: committed only at the position planned against. Each change is
                    // one commit of the namespace, its record the change itself.
                    let base = planned.commits - UInt64(planned.steps.count)
                    var records: [(sequence: UInt64, record: [UInt8])] = []
                    for (index, step) in planned.steps.enumerated() {
                        guard case .put(let record) = step else { continue }
                        records.append((base + UInt64(index) + 1, CommitRecord.encodeValue(key: record.key, payload: record.payload)))
                    }
                    let expected = Position(epoch: base == 0 ? 0 : planned.epoch, sequence: base)
                    try EnginePlace.engineCall { () throws(EngineFailure) in
                        try shared.apply(planned.steps, at: expected, epoch: planned.epoch, commits: records)
                    }
                } else {
                    try EnginePlace.engineCall { () throws(EngineFailure) in
                        try store.apply(planned.steps, sequence: planned.commits)
                    }
                }
            } catch where (error.underlying as? EngineFailure)?.code == .conflict && attempt < ManagedStore.sharedAttempts {
                catchUpReporting()
                return commit(writes, attempt: attempt + 1)
            } catch {
                logger.error("commit failed, nothing changed: \(error.message)", metadata: error.logMetadata)
                for (write, outcome) in zip(writes, planned.outcomes) {
                    if case .committed = outcome { write.reply(.failure(error)) } else { answer(write, outcome, epoch: planned.epoch) }
                }
                return
            }
            state.recordFirstCommit(in: place)
            // Published under the lock; broadcast outside it, in order.
            let changes = state.withLock { state in
                var changes: [(name: String, entry: Entry, subscribers: [Subscription])] = []
                for outcome in planned.outcomes {
                    guard case .committed(let name, let entry) = outcome else { continue }
                    state.values[name] = entry
                    changes.append((name, entry, Array((state.subscribers[name] ?? [:]).values)))
                }
                state.epoch = planned.epoch
                state.commits = planned.commits
                return changes
            }
            announce(changes, epoch: planned.epoch)
        }
        for (write, outcome) in zip(writes, planned.outcomes) { answer(write, outcome, epoch: planned.epoch) }
    }

    /// Committed changes, in order, to their subscribers and the observers; subscribers that lagged or went away
    /// are forgotten.
    private func announce(_ changes: [(name: String, entry: Entry, subscribers: [Subscription])], epoch: UInt64) {
        var ended: [(String, ObjectIdentifier)] = []
        for change in changes {
            let position = Position(epoch: epoch, sequence: change.entry.sequence)
            let event = SharedPush(.valueEvent(position, self.state(of: change.entry, withheld: isSecure)))
            for subscription in change.subscribers where !subscription.offer(event, at: position) {
                ended.append((change.name, ObjectIdentifier(subscription)))
            }
            for observer in environment.observers {
                observer.valueChanged(name: change.name, sequence: change.entry.sequence, secure: isSecure)
            }
        }
        if !ended.isEmpty {
            state.withLock { state in
                for (name, key) in ended { state.removeSubscriber(key, of: name) }
            }
        }
    }

    // MARK: Shared values

    /// Another broker may have committed to this namespace: the writer catches up before its next group (a
    /// namespace not loaded yet reads the database when it loads).
    func follow(reaching position: Position? = nil) {
        let start = state.withLock { state -> Bool in
            guard state.loaded, !state.stopping else { return false }
            // Already there (this broker's own commit): nothing to catch up.
            if let position, position.epoch == state.epoch, position.sequence == state.commits { return false }
            state.catchUpWanted = true
            state.catchUpFailed = false
            guard !state.writing else { return false }
            state.writing = true
            return true
        }
        if start { environment.onWriter { self.runWriter() } }
    }

    var catchUpFailed: Bool { state.withLock { $0.catchUpFailed } }

    /// Loads the namespace now (a shared one is followed from the start, so that every change another broker
    /// makes is announced here).
    func preload() {
        whenLoaded { _ in }
    }

    private func catchUpReporting() {
        do throws(BrokerError) {
            try catchUp()
        } catch {
            logger.error("cannot catch up with the shared database: \(error.message)", metadata: error.logMetadata)
            state.withLock { $0.catchUpFailed = true }
        }
    }

    /// Applies the changes other brokers committed since this namespace's position and announces them as if
    /// made here; reloads (announcing every value that differs) when the commit log no longer reaches back.
    private func catchUp() throws(BrokerError) {
        for _ in 0..<2 {
            let (known, current, epoch, commits, manifest) = state.withLock {
                ($0.engine, $0.engineStore, $0.epoch, $0.commits, $0.manifest)
            }
            let engine: any StorageEngine
            if let known { engine = known } else { engine = try environment.engines.engine(named: environment.configuration.defaultEngine) }
            guard
                let shared = try place.sharedStore(engine, current: current, keep: { state.keep($0, of: engine) })
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
                            fetched.append((name, try decode(payload, name: name), sequence))
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
                    if position.sequence < commits { return try reload(shared, engine: engine) }
                    return publish(fetched, epoch: epoch)
                }
                guard position.epoch != 0 else { return }
                guard epoch == 0 else { return try reload(shared, engine: engine) }
                let adopted = try place.adopt(engine: engine, existing: manifest, epoch: position.epoch)
                state.withLock { $0.manifest = adopted }
                fetched = []
                position = try read(epoch: position.epoch, after: 0)
                if let unreadable { throw unreadable }
                if position.epoch == adopted.epoch { return publish(fetched, epoch: adopted.epoch) }
            } catch where (error.underlying as? EngineFailure)?.code == .gone {
                return try reload(shared, engine: engine)
            }
        }
    }

    private func publish(_ fetched: [(name: String, entry: Entry, commit: UInt64)], epoch: UInt64) {
        guard let last = fetched.last else { return }
        let changes = state.withLock { state in
            var changes: [(name: String, entry: Entry, subscribers: [Subscription])] = []
            for change in fetched {
                state.values[change.name] = change.entry
                changes.append((change.name, change.entry, Array((state.subscribers[change.name] ?? [:]).values)))
            }
            state.epoch = epoch
            state.commits = last.commit
            return changes
        }
        announce(changes, epoch: epoch)
    }

    /// The namespace as the database holds it now; every value that differs is announced.
    private func reload(_ shared: any SharedEngineStore, engine: any StorageEngine) throws(BrokerError) {
        var records: [EngineRecord] = []
        let position = try EnginePlace.engineCall { () throws(EngineFailure) in
            try shared.load { records.append(EngineRecord($0)) }
        }
        var values: [String: Entry] = [:]
        for record in records {
            let name = String(decoding: record.key, as: UTF8.self)
            values[name] = try decode(record.payload, name: name)
        }
        let manifest = state.withLock { $0.manifest }
        let adopted = position.epoch == 0 ? manifest : try place.adopt(engine: engine, existing: manifest, epoch: position.epoch)
        let changes = state.withLock { state in
            var changes: [(name: String, entry: Entry, subscribers: [Subscription])] = []
            for (name, entry) in values where state.values[name]?.sequence != entry.sequence {
                changes.append((name, entry, Array((state.subscribers[name] ?? [:]).values)))
            }
            state.values = values
            state.epoch = position.epoch
            state.commits = position.sequence
            state.manifest = adopted
            return changes.sorted { $0.entry.sequence < $1.entry.sequence }
        }
        logger.notice("reloaded from the shared database: the commit log no longer reached back to this broker's position")
        announce(changes, epoch: position.epoch)
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

    private func engineStore(epoch: UInt64) throws(BrokerError) -> any EngineStore {
        let (open, existing, known) = state.withLock { ($0.engineStore, $0.manifest, $0.engine) }
        if let open { return open }
        let engine: any StorageEngine
        if let known { engine = known } else { engine = try environment.engines.engine(named: environment.configuration.defaultEngine) }
        let (manifest, store) = try place.create(engine: engine, existing: existing, epoch: epoch)
        state.withLock { state in
            state.manifest = manifest
            state.engine = engine
            state.engineStore = store
        }
        return store
    }

    func shutdown() async { await state.shutDownWriter(on: environment) }
}
