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
/// the broker's owner loop, as a store is; its writer is the same machine as a store's (`PlaceWriter`).
///
/// All values of a namespace live in one engine store (`DATA/values`, `DATA/secure-values`), one record per
/// name: `u64 sequence, u8 state (0 unset, 1 set), bytes` (sealed for secure values). A reset keeps its record
/// as "unset" so that the value's sequence keeps counting and an old sequence never matches again. Each value
/// has its own sequence and events; the namespace has one epoch (its manifest's), and the writer's sequence counts
/// the namespace's commits of any value. Reads answer from memory.
final class ValueSpace: WriterModel, @unchecked Sendable {
    // `@unchecked Sendable`: blocking jobs capture values made from the namespace, never its state, which only the
    // owner touches.
    let namespace: Namespace
    private let environment: StoreEnvironment
    private let sealer: (any ValueSealer)?

    struct Entry {
        var sequence: UInt64
        var value: ByteBuffer?
    }

    private(set) lazy var writer = PlaceWriter(
        model: self, environment: environment,
        place: EnginePlace(
            environment: environment, place: environment.directory.values(namespace),
            storeName: Self.engineStoreName(namespace)),
        logger: logger, stopping: false)
    private var values: [String: Entry] = [:]
    private var subscribers: [String: [ObjectIdentifier: Subscription]] = [:]

    struct Write: QueuedWrite {
        var name: String
        /// `nil`: reset.
        var value: ByteBuffer?
        var condition: Condition
        var submitter: UInt64
        var reply: Reply

        var weight: Int { 1 }
        var isAlone: Bool { false }
        var dropsBrokenPlace: Bool { false }
    }

    init(namespace: Namespace, environment: StoreEnvironment, sealer: (any ValueSealer)?) {
        self.namespace = namespace
        self.environment = environment
        self.sealer = sealer
    }

    private var isSecure: Bool { namespace == .secureValue }

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

    func loadJob() -> @Sendable () throws(BrokerError) -> (EnginePlace.Loaded?, [String: Entry]) {
        let place = writer.place
        let decode = self.decode
        return { () throws(BrokerError) in
            var records: [EngineRecord] = []
            let loaded = try place.load(visit: { records.append(EngineRecord($0)) })
            return (loaded, try Self.values(of: records, decode))
        }
    }

    func install(_ values: [String: Entry]) { self.values = values }

    /// The values these records hold, each named by its key.
    static func values(
        of records: [EngineRecord], _ decode: (ByteBuffer, String) throws(BrokerError) -> Entry
    ) throws(BrokerError) -> [String: Entry] {
        var values: [String: Entry] = [:]
        for record in records {
            let name = String(decoding: record.key, as: UTF8.self)
            values[name] = try decode(record.payload, name)
        }
        return values
    }

    /// Loads the namespace now (a shared one is followed from the start, so that every change another broker
    /// makes is announced here).
    func preload() {
        writer.whenLoaded { _ in }
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
        writer.whenLoaded { failure in
            if let failure { return reply(.failure(failure)) }
            let entry = self.values[name]
            reply(
                .success(
                    .value(
                        Position(epoch: self.writer.epoch, sequence: entry?.sequence ?? 0),
                        self.state(of: entry, withheld: false))))
        }
    }

    /// Every value ever set (reset ones too, unset), in name byte order, that `grant` lets its peer read.
    func list(readableBy grant: Grant, _ reply: Reply) {
        writer.whenLoaded { failure in
            if let failure { return reply(.failure(failure)) }
            let listed = self.values.compactMap { name, entry -> ValueInfo? in
                guard grant.allows(name, write: false) else { return nil }
                return ValueInfo(
                    name: name, epoch: self.writer.epoch, sequence: entry.sequence, isSet: entry.value != nil)
            }
            reply(.success(.values(listed.sorted { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) })))
        }
    }

    func subscribe(_ subscription: Subscription, start: SubscriptionStart, _ reply: Reply) {
        writer.whenLoaded { failure in
            if let failure { return reply(.failure(failure)) }
            let name = subscription.name
            let entry = self.values[name]
            let position = Position(epoch: self.writer.epoch, sequence: entry?.sequence ?? 0)
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
        var queued = writes.map(Optional.some)
        writer.submit(&queued)
    }

    enum Outcome {
        case failed(BrokerError)
        case unchanged(sequence: UInt64)
        case committed(name: String, entry: Entry)
    }

    private func conflict(_ condition: Condition, name: String, entry: Entry?, epoch: UInt64) -> BrokerError? {
        let sequence = entry?.sequence ?? 0
        guard !condition.holds(epoch: epoch, sequence: sequence, absent: entry?.value == nil) else { return nil }
        let now = entry?.value == nil ? "is unset (at sequence \(sequence))" : "is set, at sequence \(sequence)"
        let expected = condition.expectation(absent: "it unset")
        return BrokerError(
            .conflict, "\(isSecure ? "secure value" : "value") \(name) \(now); the write expected \(expected)")
    }

    struct Plan: PlannedGroup {
        var writes: [Write]
        var outcomes: [Outcome] = []
        var steps: [EngineStep] = []
        var base: Position
        var epoch: UInt64
        /// The namespace's commits after the group.
        var sequence: UInt64
    }

    /// Plans each write against the values as the writes before it leave them.
    func plan(_ writes: [Write], engine: any StorageEngine) -> Plan? {
        let now = environment.configuration.clock.milliseconds()
        var working: [String: Entry] = [:]
        let before = writer.sequence
        var plan = Plan(
            writes: writes, base: Position(epoch: before == 0 ? 0 : writer.epoch, sequence: before),
            epoch: writer.epoch, sequence: before)
        do throws(BrokerError) {
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
                if plan.sequence == 0 { plan.epoch = writer.manifest?.epoch ?? Manifest.newEpoch() }
                plan.sequence += 1
                plan.steps.append(
                    .put(
                        EngineRecord(
                            key: Array(write.name.utf8), payload: try encode(next, name: write.name), createdAt: now,
                            updatedAt: now)))
                plan.outcomes.append(.committed(name: write.name, entry: next))
            }
        } catch {
            for write in writes { write.reply(.failure(error)) }
            return nil
        }
        guard !plan.steps.isEmpty else {
            for (write, outcome) in zip(writes, plan.outcomes) { answer(write, outcome, epoch: plan.epoch) }
            return nil
        }
        return plan
    }

    /// Each change is one commit of the namespace, its record the change itself.
    func sharedRecords(_ plan: Plan) -> [(sequence: UInt64, record: [UInt8])] {
        plan.steps.enumerated().compactMap { index, step in
            guard case .put(let record) = step else { return nil }
            return (plan.base.sequence + UInt64(index) + 1, CommitRecord.encodeValue(key: record.key, payload: record.payload))
        }
    }

    func publish(_ plan: Plan, applyTook: UInt64) {
        var changes: [(name: String, entry: Entry)] = []
        for outcome in plan.outcomes {
            guard case .committed(let name, let entry) = outcome else { continue }
            values[name] = entry
            changes.append((name, entry))
        }
        announce(changes, epoch: plan.epoch)
        for (write, outcome) in zip(plan.writes, plan.outcomes) { answer(write, outcome, epoch: plan.epoch) }
    }

    func answer(_ plan: Plan, failure: BrokerError) {
        for (write, outcome) in zip(plan.writes, plan.outcomes) {
            if case .committed = outcome {
                write.reply(.failure(failure))
            } else {
                answer(write, outcome, epoch: plan.epoch)
            }
        }
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

    func performAlone(_ write: Write, _ done: @escaping () -> Void) {
        preconditionFailure("a value write is never carried out alone")
    }

    func writerStopped() {}

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

    // MARK: Shared values

    /// Another broker may have committed to this namespace: the writer catches up before its next group (a
    /// namespace not loaded yet reads the database when it loads).
    func follow(reaching position: Position? = nil) {
        guard writer.loading == .ready, !writer.stopping else { return }
        // Already there (this broker's own commit): nothing to catch up.
        if let position, position == writer.position { return }
        writer.requestCatchUp()
    }

    var catchUpFailed: Bool { writer.catchUpFailed }

    func catchUpJob() -> @Sendable () -> ([CatchUpValues.Finding], BrokerError?) {
        let job = CatchUpValues(
            place: writer.place, engine: writer.engine, store: writer.engineStore, epoch: writer.epoch,
            commits: writer.sequence, manifest: writer.manifest, decode: decode)
        return { job.run() }
    }

    /// Takes in the changes other brokers committed since this namespace's position and announces them as if made
    /// here.
    func take(_ change: CatchUpValues.Change) {
        switch change {
        case .changes(let fetched, let epoch):
            guard let last = fetched.last else { return }
            for change in fetched { values[change.name] = change.entry }
            writer.epoch = epoch
            writer.sequence = last.commit
            announce(fetched.map { ($0.name, $0.entry) }, epoch: epoch)
        case .reloaded(let reloaded, let position, let adopted):
            var changes: [(name: String, entry: Entry)] = []
            for (name, entry) in reloaded where values[name]?.sequence != entry.sequence {
                changes.append((name, entry))
            }
            values = reloaded
            writer.epoch = position.epoch
            writer.sequence = position.sequence
            writer.manifest = adopted
            logger.notice(
                "reloaded from the shared database: the commit log no longer reached back to this broker's position")
            announce(changes.sorted { $0.entry.sequence < $1.entry.sequence }, epoch: position.epoch)
        }
    }

    /// A shared namespace's catch-up on a thread for blocking work, as a store's (`CatchUpJob`).
    struct CatchUpValues: @unchecked Sendable {
        // `@unchecked Sendable`: the engine store is the owner's, handed to this job while the writer waits for it.
        let place: EnginePlace
        let engine: (any StorageEngine)?
        let store: (any EngineStore)?
        let epoch: UInt64
        let commits: UInt64
        let manifest: Manifest?
        let decode: @Sendable (ByteBuffer, String) throws(BrokerError) -> Entry

        enum Change {
            case changes([(name: String, entry: Entry, commit: UInt64)], epoch: UInt64)
            case reloaded([String: Entry], Position, Manifest?)
        }
        typealias Finding = CatchUpFinding<Change>

        func run() -> ([Finding], BrokerError?) { EnginePlace.catchUp(catchUp) }

        private func catchUp(into effects: inout [Finding]) throws(BrokerError) {
            var store = self.store
            var manifest = self.manifest
            for _ in 0..<2 {
                guard let (engine, shared) = try place.sharedStore(known: engine, store: &store, findings: &effects)
                else { return }
                func read(epoch: UInt64, after: UInt64) throws(BrokerError)
                    -> (position: Position, commits: [(name: String, entry: Entry, commit: UInt64)])
                {
                    try EnginePlace.commits(of: shared, epoch: epoch, after: after) {
                        (sequence, record) throws(BrokerError) in
                        let (key, payload) = try CommitRecord.decodeValue(record, sequence: sequence)
                        let name = String(decoding: key, as: UTF8.self)
                        return (name, try decode(payload, name), sequence)
                    }
                }
                do throws(BrokerError) {
                    let read1 = try read(epoch: epoch, after: commits)
                    if read1.position.epoch == epoch {
                        // Behind this broker: the database lost commits it holds (restored, a replica promoted).
                        if read1.position.sequence < commits {
                            return try reload(shared, engine: engine, manifest: manifest, into: &effects)
                        }
                        effects.append(.change(.changes(read1.commits, epoch: epoch)))
                        return
                    }
                    guard read1.position.epoch != 0 else { return }
                    guard epoch == 0 else {
                        return try reload(shared, engine: engine, manifest: manifest, into: &effects)
                    }
                    let adopted = try place.adopt(engine: engine, existing: manifest, epoch: read1.position.epoch)
                    effects.append(.adopted(adopted))
                    manifest = adopted
                    let read2 = try read(epoch: read1.position.epoch, after: 0)
                    if read2.position.epoch == adopted.epoch {
                        effects.append(.change(.changes(read2.commits, epoch: adopted.epoch)))
                        return
                    }
                } catch  where (error.underlying as? EngineFailure)?.code == .gone {
                    return try reload(shared, engine: engine, manifest: manifest, into: &effects)
                }
            }
        }

        /// The namespace as the database holds it now.
        private func reload(
            _ shared: any SharedEngineStore, engine: any StorageEngine, manifest: Manifest?,
            into effects: inout [Finding]
        ) throws(BrokerError) {
            var records: [EngineRecord] = []
            let position = try EnginePlace.engineCall { () throws(EngineFailure) in
                try shared.load { records.append(EngineRecord($0)) }
            }
            let values = try ValueSpace.values(of: records, decode)
            let adopted =
                position.epoch == 0
                ? manifest : try place.adopt(engine: engine, existing: manifest, epoch: position.epoch)
            effects.append(.change(.reloaded(values, position, adopted)))
        }
    }
}
