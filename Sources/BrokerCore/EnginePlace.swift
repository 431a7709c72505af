import Wire

/// Opening, creating and dropping the engine store behind a place (a store, or a value namespace), with
/// engine failures mapped to wire errors.
struct EnginePlace: Sendable {
    let environment: StoreEnvironment
    let place: DataDirectory.Place
    /// The name the engine is told (the store's name).
    let storeName: String

    struct Loaded {
        var manifest: Manifest
        var engine: any StorageEngine
        var store: any EngineStore
        var records: [EngineRecord]
    }

    private func options(_ engine: any StorageEngine) -> [String: String] {
        environment.configuration.engineOptions[engine.name] ?? [:]
    }

    /// What the place holds, or `nil` when it does not exist. An engine that cannot be loaded is an error,
    /// never an empty result.
    func load() async throws(WireError) -> Loaded? {
        guard let manifest = try environment.directory.manifest(place) else { return nil }
        let engine = try environment.engines.engine(named: manifest.engine)
        let store = try await open(engine)
        do throws(WireError) {
            let records = try await Self.engineCall { () throws(EngineFailure) in try await store.scanAll() }
            return Loaded(manifest: manifest, engine: engine, store: store, records: records)
        } catch {
            await store.close()
            throw error
        }
    }

    /// Creates the place (directory and manifest) unless `existing` says it exists, and opens its store.
    func create(engine: any StorageEngine, existing: Manifest?, epoch: UInt64) async throws(WireError)
        -> (Manifest, any EngineStore)
    {
        let manifest = existing ?? Manifest(engine: engine.name, epoch: epoch)
        if existing == nil { try environment.directory.create(place, manifest: manifest) }
        return (manifest, try await open(engine))
    }

    private func open(_ engine: any StorageEngine) async throws(WireError) -> any EngineStore {
        let directory = place.engineDirectory
        let storeName = storeName
        let options = options(engine)
        return try await Self.engineCall { () throws(EngineFailure) in
            try await engine.open(directory: directory, store: storeName, options: options)
        }
    }

    /// Deletes the engine's data and the place.
    func drop(engine: any StorageEngine) async throws(WireError) {
        let directory = place.engineDirectory
        let storeName = storeName
        let options = options(engine)
        try await Self.engineCall { () throws(EngineFailure) in
            try await engine.drop(directory: directory, store: storeName, options: options)
        }
        try environment.directory.remove(place)
    }

    /// Maps an engine's failure to the wire's error codes.
    static func engineCall<T>(_ body: () async throws(EngineFailure) -> T) async throws(WireError) -> T {
        do throws(EngineFailure) {
            return try await body()
        } catch {
            throw WireError(error.code == .full ? .storageFull : .engineError, error.description)
        }
    }
}
