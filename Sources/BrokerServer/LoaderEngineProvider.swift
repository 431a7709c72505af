import BrokerCore
import EngineLoader
import Wire

/// Engines for the broker, loaded with dlopen from the search path.
struct LoaderEngineProvider: EngineProvider {
    let loader: EngineLoader

    func engine(named name: String) throws(BrokerError) -> any StorageEngine {
        do {
            return try loader.load(name)
        } catch {
            throw BrokerError(.engineUnavailable, error.description, underlying: error)
        }
    }

    func engineList() -> [EngineInfo] { loader.list().map(\.info) }

    /// Start-up checks: the default engine loads, and every engine named in an option loads and accepts it.
    func validate(_ configuration: BrokerConfiguration) throws(DaemonError) {
        do {
            _ = try loader.load(configuration.defaultEngine)
            for (name, options) in configuration.engineOptions.sorted(by: { $0.key < $1.key }) {
                try loader.load(name).validate(options: options)
            }
        } catch {
            throw DaemonError(.engine, error.description, underlying: error)
        }
    }
}
