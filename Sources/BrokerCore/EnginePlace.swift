import StoreModel

extension StoreEnvironment {
    /// The engine new stores get, when it shares its stores with other brokers (ABI 2.1); nil otherwise.
    var sharedDefaultEngine: (any SharedStorageEngine)? {
        guard let engine = try? engines.engine(named: configuration.defaultEngine),
            let shared = engine as? any SharedStorageEngine, shared.sharesStores
        else { return nil }
        return shared
    }

    /// The options of `engine` (`--engine-option`).
    func options(_ engine: any StorageEngine) -> [String: String] {
        configuration.engineOptions[engine.name] ?? [:]
    }
}

/// Opening, creating and dropping the engine store behind a place (a store, or a value namespace), with
/// engine failures mapped to the broker's errors.
struct EnginePlace: Sendable {
    let environment: StoreEnvironment
    let place: DataDirectory.Place
    /// The name the engine is told (the store's name).
    let storeName: String

    struct Loaded {
        var manifest: Manifest
        var engine: any StorageEngine
        var store: any EngineStore
        /// A shared store's position, read in the same snapshot as its items (the manifest's epoch and the
        /// store's opened sequence otherwise).
        var position: Position?
    }

    /// Whether `engine` keeps its stores in a database other brokers share (ABI 2.1).
    static func isShared(_ engine: any StorageEngine) -> Bool {
        (engine as? any SharedStorageEngine)?.sharesStores == true
    }

    /// What the place holds, or `nil` when it does not exist: `expect` gets the engine's count of records (to
    /// reserve room), then `visit` every record in order, its bytes borrowed for the call. An engine that cannot
    /// be loaded is an error, never an empty result; so is an engine that opens at sequence 0 where the manifest
    /// records a commit (its files were lost or replaced): the place is then broken, not empty.
    func load(expect: (Int) -> Void = { _ in }, visit: (ScannedRecord) -> Void) throws(BrokerError) -> Loaded? {
        guard var manifest = try environment.directory.manifest(place) else {
            // A store another broker created may exist in the shared database with no manifest here yet.
            guard let shared = environment.sharedDefaultEngine else { return nil }
            return try loadShared(shared, manifest: nil, visit: visit)
        }
        let engine: any StorageEngine
        do throws(BrokerError) {
            engine = try environment.engines.engine(named: manifest.engine)
        } catch {
            throw error.context("\(describe) cannot be served: ")
        }
        if Self.isShared(engine) { return try loadShared(engine, manifest: manifest, visit: visit) }
        let store = try open(engine)
        do throws(BrokerError) {
            if manifest.committed, store.openedSequence == 0 {
                throw BrokerError(
                    .engineUnavailable,
                    "\(describe) cannot be served: its manifest records commits but engine \(engine.name) opens it "
                        + "empty (its files in \(place.engineDirectory) were lost or replaced); drop it to start over")
            }
            if !manifest.committed, store.openedSequence > 0, let updated = recordCommitted(manifest) {
                manifest = updated
            }
            try Self.engineCall { () throws(EngineFailure) in
                expect(Int(clamping: try store.count()))
                try store.scan(visit)
            }
            return Loaded(manifest: manifest, engine: engine, store: store)
        } catch {
            store.close()
            throw error
        }
    }

    /// A shared store, as the database holds it: nil (and the local place removed) when it does not exist there
    /// (never created, or dropped by another broker); otherwise its items and position, with the manifest here
    /// made or brought to the database's epoch.
    private func loadShared(
        _ engine: any StorageEngine, manifest: Manifest?, visit: (ScannedRecord) -> Void
    ) throws(BrokerError) -> Loaded? {
        let store = try open(engine)
        do throws(BrokerError) {
            guard let shared = store as? any SharedEngineStore else {
                throw BrokerError(.internalError, "engine \(engine.name) declares shared stores but its store is not one")
            }
            let position = try Self.engineCall { () throws(EngineFailure) in try shared.load(visit) }
            guard position.epoch != 0 else {
                store.close()
                try forget()
                return nil
            }
            let adopted = try adopt(engine: engine, existing: manifest, epoch: position.epoch)
            return Loaded(manifest: adopted, engine: engine, store: store, position: position)
        } catch {
            store.close()
            throw error
        }
    }

    /// The place of a shared store as the database has it: created here, or its manifest brought to `epoch`
    /// (another broker created the store, or dropped and created it again).
    func adopt(engine: any StorageEngine, existing: Manifest?, epoch: UInt64) throws(BrokerError) -> Manifest {
        let manifest = Manifest(engine: engine.name, epoch: epoch, committed: true)
        var found = existing
        if found == nil { found = try environment.directory.manifest(place) }
        if let existing = found {
            if existing != manifest { try environment.directory.rewrite(place, manifest: manifest) }
        } else {
            try environment.directory.create(place, manifest: manifest)
        }
        return manifest
    }

    /// Removes the place here (not the engine's data): a shared store another broker dropped.
    func forget() throws(BrokerError) {
        guard try environment.directory.manifest(place) != nil else { return }
        try environment.directory.remove(place)
    }

    private var describe: String {
        place.parent == environment.directory.storesDirectory ? "store \(storeName)" : "\(place.name)"
    }

    /// After the place's first commit: the manifest records it, so lost engine files are noticed. Returns the new
    /// manifest, or nil (logged) when it could not be written; then it is tried again at the next commit.
    func recordCommitted(_ manifest: Manifest) -> Manifest? {
        var updated = manifest
        updated.committed = true
        do throws(BrokerError) {
            try environment.directory.rewrite(place, manifest: updated)
            return updated
        } catch {
            environment.logger.warning(
                "cannot record the first commit of \(describe) in its manifest (tried again at the next commit): \(error.message)")
            return nil
        }
    }

    /// Deletes a place that cannot be loaded: through its engine when that can be loaded (a failure there is
    /// logged), then the directory with whatever is left in it.
    func dropBroken() throws(BrokerError) {
        if let manifest = try? environment.directory.manifest(place),
            let engine = try? environment.engines.engine(named: manifest.engine)
        {
            do throws(BrokerError) {
                return try drop(engine: engine)
            } catch {
                environment.logger.warning("engine \(engine.name) could not drop \(describe): \(error.message); removing its directory")
            }
        }
        try environment.directory.remove(place)
    }

    /// Creates the place (directory and manifest) unless `existing` says it exists, and opens its store.
    func create(engine: any StorageEngine, existing: Manifest?, epoch: UInt64) throws(BrokerError)
        -> (Manifest, any EngineStore)
    {
        let manifest = existing ?? Manifest(engine: engine.name, epoch: epoch)
        if existing == nil { try environment.directory.create(place, manifest: manifest) }
        return (manifest, try open(engine))
    }

    func open(_ engine: any StorageEngine) throws(BrokerError) -> any EngineStore {
        try Self.engineCall { () throws(EngineFailure) in
            try engine.open(directory: place.engineDirectory, store: storeName, options: environment.options(engine))
        }
    }

    /// Deletes the engine's data and the place.
    func drop(engine: any StorageEngine) throws(BrokerError) {
        try Self.engineCall { () throws(EngineFailure) in
            try engine.drop(directory: place.engineDirectory, store: storeName, options: environment.options(engine))
        }
        try environment.directory.remove(place)
    }

    /// Maps an engine's failure to the broker's error codes, keeping it as the cause.
    static func engineCall<T>(_ body: () throws(EngineFailure) -> T) throws(BrokerError) -> T {
        do throws(EngineFailure) {
            return try body()
        } catch {
            throw BrokerError(error.code == .full ? .storageFull : .engineError, error.description, underlying: error)
        }
    }
}
