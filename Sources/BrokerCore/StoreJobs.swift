import StoreModel

/// A group's apply, on a thread for blocking work (or on the owner, for an open store of a nonblocking engine):
/// creates the store first when this is its first commit, and records the first commit in the manifest.
struct ApplyJob {
    let place: EnginePlace
    let engine: any StorageEngine
    let store: (any EngineStore)?
    let manifest: Manifest?
    let shared: Bool
    let steps: [EngineStep]
    let base: Position
    let epoch: UInt64
    let sequence: UInt64
    /// A shared store's commits, as the log records them.
    let records: [(sequence: UInt64, record: [UInt8])]

    struct Applied {
        /// The store, created by this job.
        var created: (engine: any StorageEngine, store: any EngineStore, manifest: Manifest)?
        /// The manifest, now recording the first commit (or adopted as the shared database has it).
        var manifest: Manifest?
        var failure: BrokerError?
        /// Another broker committed first (a shared store): nothing was applied (`failure` says so).
        var lost = false
        /// How long the apply alone took, in nanoseconds.
        var applyTook: UInt64 = 0
    }

    func run() -> Applied {
        var applied = Applied(manifest: nil)
        var manifest = self.manifest
        do throws(BrokerError) {
            let open: any EngineStore
            if let store {
                open = store
                // A shared store stays open when another broker drops it (it is named by name): its place here is
                // made again when it is created again.
                if manifest == nil, shared {
                    let adopted = try place.adopt(engine: engine, existing: nil, epoch: epoch)
                    manifest = adopted
                    applied.manifest = adopted
                }
            } else {
                let (made, created) = try place.create(engine: engine, existing: manifest, epoch: epoch)
                applied.created = (engine, created, made)
                manifest = made
                open = created
            }
            let started = monotonicNanoseconds()
            if shared, let sharedStore = open as? any SharedEngineStore {
                // Committed only if no other broker committed since the position planned against.
                try EnginePlace.engineCall { () throws(EngineFailure) in
                    try sharedStore.apply(steps, at: base, epoch: epoch, commits: records)
                }
            } else {
                try EnginePlace.engineCall { () throws(EngineFailure) in try open.apply(steps, sequence: sequence) }
            }
            applied.applyTook = monotonicNanoseconds() - started
        } catch  where (error.underlying as? EngineFailure)?.code == .conflict && shared {
            // Tried again after a catch-up; the error is the answer once the attempts run out.
            applied.lost = true
            applied.failure = error
            return applied
        } catch {
            applied.failure = error
            return applied
        }
        if let current = manifest, !current.committed, let updated = place.recordCommitted(current) {
            applied.manifest = updated
            if applied.created != nil { applied.created!.manifest = updated }
        }
        return applied
    }
}

/// A shared store's catch-up, on a thread for blocking work: the commits other brokers made since `position`, or
/// what else happened to the store meanwhile (dropped, created again, its log no longer reaching back), as effects
/// the owner takes in, in order.
struct CatchUpJob: @unchecked Sendable {
    // `@unchecked Sendable`: the engine store is the owner's, handed to this job while the writer waits for it.
    let place: EnginePlace
    let engine: (any StorageEngine)?
    let store: (any EngineStore)?
    let position: Position
    let manifest: Manifest?

    enum Change {
        case commits([Commit])
        case droppedElsewhere
        case reloaded(StoreContents, Position, Manifest?)
    }
    typealias Finding = CatchUpFinding<Change>

    func run() -> ([Finding], BrokerError?) { EnginePlace.catchUp(catchUp) }

    private func catchUp(into effects: inout [Finding]) throws(BrokerError) {
        var store = self.store
        var position = self.position
        var manifest = self.manifest
        let name = place.storeName
        for _ in 0..<4 {
            guard let (engine, shared) = try place.sharedStore(known: engine, store: &store, findings: &effects) else {
                return
            }
            func read(epoch: UInt64, after: UInt64) throws(BrokerError) -> (position: Position, commits: [Commit]) {
                try EnginePlace.commits(of: shared, epoch: epoch, after: after) {
                    (sequence, record) throws(BrokerError) in
                    Commit(
                        epoch: epoch, sequence: sequence,
                        steps: try CommitRecord.decode(record, store: name, sequence: sequence))
                }
            }
            do throws(BrokerError) {
                let read1 = try read(epoch: position.epoch, after: position.sequence)
                if read1.position.epoch == position.epoch {
                    // Behind this broker: the database lost commits it holds (restored, a replica promoted).
                    if read1.position.sequence < position.sequence {
                        return try reload(shared, engine: engine, manifest: manifest, into: &effects)
                    }
                    effects.append(.change(.commits(read1.commits)))
                    return
                }
                if position.epoch != 0 {
                    // Dropped by another broker (and perhaps created again): what this broker held of it ends.
                    if manifest != nil {
                        do throws(BrokerError) {
                            try place.forget()
                        } catch {
                            place.environment.logger.warning(
                                "cannot remove the place of a store another broker dropped: \(error.message)")
                        }
                    }
                    effects.append(.change(.droppedElsewhere))
                    position = Position(epoch: 0, sequence: 0)
                    manifest = nil
                    continue
                }
                guard read1.position.epoch != 0 else { return }
                // Created by another broker: from its first commit.
                let adopted = try place.adopt(engine: engine, existing: manifest, epoch: read1.position.epoch)
                effects.append(.adopted(adopted))
                manifest = adopted
                let read2 = try read(epoch: read1.position.epoch, after: 0)
                if read2.position.epoch == adopted.epoch {
                    effects.append(.change(.commits(read2.commits)))
                    return
                }
            } catch  where (error.underlying as? EngineFailure)?.code == .gone {
                return try reload(shared, engine: engine, manifest: manifest, into: &effects)
            }
        }
    }

    /// The commit log no longer reaches back to this store's position: the store as the database holds it now.
    private func reload(
        _ shared: any SharedEngineStore, engine: any StorageEngine, manifest: Manifest?, into effects: inout [Finding]
    ) throws(BrokerError) {
        var contents = StoreContents()
        let position = try EnginePlace.engineCall { () throws(EngineFailure) in try shared.load { contents.load($0) } }
        let adopted =
            position.epoch == 0 ? nil : try place.adopt(engine: engine, existing: manifest, epoch: position.epoch)
        effects.append(.change(.reloaded(contents, position, adopted)))
    }
}

/// What a store's and a namespace's catch-ups share: the run that keeps its findings when it fails, the shared
/// store (opened for the catch-up when none is open) and the reading of its commit log.
extension EnginePlace {
    /// `body`'s findings, and the error that ended it, if any (the findings before it still count).
    static func catchUp<Change>(
        _ body: (inout [CatchUpFinding<Change>]) throws(BrokerError) -> Void
    ) -> ([CatchUpFinding<Change>], BrokerError?) {
        var findings: [CatchUpFinding<Change>] = []
        do throws(BrokerError) {
            try body(&findings)
            return (findings, nil)
        } catch {
            return (findings, error)
        }
    }

    /// The engine (`known`, else the default), and its store as a shared one: `store` when open, else opened now
    /// (a finding, and `store` from then on); nil when the engine does not share its stores.
    func sharedStore<Change>(
        known: (any StorageEngine)?, store: inout (any EngineStore)?, findings: inout [CatchUpFinding<Change>]
    ) throws(BrokerError) -> (engine: any StorageEngine, shared: any SharedEngineStore)? {
        let engine: any StorageEngine
        if let known {
            engine = known
        } else {
            engine = try environment.engines.engine(named: environment.configuration.defaultEngine)
        }
        guard Self.isShared(engine) else { return nil }
        if store == nil {
            let opened = try open(engine)
            store = opened
            findings.append(.opened(engine, opened))
        }
        return (store as? any SharedEngineStore).map { (engine, $0) }
    }

    /// The log's commits of `epoch` after `after`, each decoded by `decode`, and the position the log is at; a
    /// record that cannot be decoded is the error.
    static func commits<Decoded>(
        of shared: any SharedEngineStore, epoch: UInt64, after: UInt64,
        _ decode: (UInt64, UnsafeRawBufferPointer) throws(BrokerError) -> Decoded
    ) throws(BrokerError) -> (position: Position, commits: [Decoded]) {
        var decoded: [Decoded] = []
        var unreadable: BrokerError?
        let position = try engineCall { () throws(EngineFailure) in
            try shared.commits(epoch: epoch, after: after) { sequence, record in
                guard unreadable == nil else { return }
                do throws(BrokerError) {
                    decoded.append(try decode(sequence, record))
                } catch {
                    unreadable = error
                }
            }
        }
        if let unreadable { throw unreadable }
        return (position, decoded)
    }
}
