import StoreModel

/// Planning a store's group: what it does and what it needs of the store, apart from the store's state so that a
/// large group can be planned on a thread for blocking work (`ManagedStore.planningJob`).
extension ManagedStore {
    /// A group planned against the committed items: what each write does, the commits it makes and the engine's
    /// steps for them.
    struct Plan: PlannedGroup {
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

    enum Outcome {
        case failed(BrokerError)
        case unchanged(epoch: UInt64, sequence: UInt64)
        case committed(sequence: UInt64)
    }

    static func conflict(_ condition: Condition, epoch: UInt64, sequence: UInt64, store name: String)
        -> BrokerError?
    {
        guard !condition.holds(epoch: epoch, sequence: sequence, absent: sequence == 0) else { return nil }
        let now = sequence == 0 ? "does not exist" : "is at sequence \(sequence) (epoch \(epoch))"
        let expected = condition.expectation(absent: "that it does not exist")
        return BrokerError(.conflict, "store \(name) \(now); the write expected \(expected)")
    }

    /// Groups inserting this many items or more are planned on a thread for blocking work (`planningJob`): planning
    /// them on the owner would keep every other store's reads waiting for it (a group of 10,000 inserts into a store
    /// of 200,000 items: 30% of the owner's time for it).
    static var offOwnerItems: Int { 2048 }

    /// What planning a group needs of the store, taken on the owner: a planning job holds it while it plans, so the
    /// committed items (`contents`, shared) are only read meanwhile.
    struct Planning {
        var contents: StoreContents
        let base: Position
        let manifestEpoch: UInt64?
        let store: String
        let atomic: Bool
        let engineName: String
        let now: UInt64
    }

    /// Holds a planning job's `Planning` until the job takes it: the job lets go of the committed items before its
    /// plan goes back to the owner, whose publish then changes them in place (not a copy of the whole table).
    final class PlanningBox: @unchecked Sendable {
        // `@unchecked Sendable`: set on the owner, taken once by the job, which runs after.
        private var planning: Planning?
        init(_ planning: Planning) { self.planning = planning }
        func take() -> Planning {
            defer { planning = nil }
            return planning!
        }
    }

    /// Plans every request against the committed items plus the requests before it. Touches nothing of the store:
    /// it may run on a thread for blocking work.
    static func plan(_ writes: [PendingWrite], _ planning: consuming Planning) -> Plan {
        let atomic = planning.atomic
        let engineName = planning.engineName
        let name = planning.store
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
            if hashes.count > 1 { hashes.withUnsafeBufferPointer { planning.contents.warm($0) } }
        }
        let now = planning.now
        let base = planning.base
        var plan = Plan(
            writes: writes, outcomes: [], commits: [], silenced: [], steps: [], insertHints: [], base: base,
            epoch: base.epoch, sequence: base.sequence)
        plan.outcomes.reserveCapacity(writes.count)
        plan.commits.reserveCapacity(writes.count)
        // The planner holds a second reference to the committed items only while it plans: once it is gone, the
        // publish changes them in place.
        var planner = WritePlanner(base: planning.contents, items: items, remembered: items - lastItems)
        planning.contents = StoreContents()
        writes.withUnsafeBufferPointer { writes in
            for index in writes.indices {
                guard case .write(let operation) = writes[index].kind else {
                    preconditionFailure("drops are not grouped")
                }
                if let conflict = conflict(
                    writes[index].condition, epoch: plan.epoch, sequence: plan.sequence, store: name)
                {
                    plan.outcomes.append(.failed(conflict))
                    continue
                }
                // One operation is atomic whatever the engine; a chain of several is not without SB_CAP_ATOMIC.
                if case .chain(let chained) = operation, chained.count > 1, !atomic {
                    let refusal = "engine \(engineName) cannot apply a chain atomically, so store \(name) refuses chains"
                    plan.outcomes.append(.failed(BrokerError(.notSupported, refusal)))
                    continue
                }
                guard let events = planner.plan(operation, now: now, last: index == writes.count - 1) else {
                    plan.outcomes.append(.unchanged(epoch: plan.epoch, sequence: plan.sequence))
                    continue
                }
                if plan.sequence == 0 { plan.epoch = planning.manifestEpoch ?? Manifest.newEpoch() }
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
}

extension Condition {
    /// Whether it holds for a store or value at `epoch` and `sequence`; `absent`: it does not exist, or is unset.
    func holds(epoch: UInt64, sequence: UInt64, absent: Bool) -> Bool {
        switch self {
        case .unconditional: true
        case .sequence(let expected): expected == sequence
        case .absent: absent
        case .epochSequence(let expectedEpoch, let expected): expectedEpoch == epoch && expected == sequence
        }
    }

    /// What a write with this condition expected, as a conflict's message says it (`absent`: how absence is said).
    func expectation(absent: String) -> String {
        switch self {
        case .unconditional: "nothing"
        case .sequence(let sequence): "sequence \(sequence)"
        case .absent: absent
        case .epochSequence(let epoch, let sequence): "sequence \(sequence) in epoch \(epoch)"
        }
    }
}
