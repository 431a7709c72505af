#if canImport(Glibc)
import Glibc
#endif
import BrokerCore
import BrokerServer
import Foundation
import Logging
import StoreBrokerClient

/// A broker for tests: the daemon `storebrokerd` runs (`BrokerDaemon`, its services in one group) in this process, on a temporary socket and data directory, with no D-Bus. Engines are loaded from the
/// engine search path, which includes the directory of the running test binary: depend on the engine
/// products (e.g. `storebroker-engine-sqlite`) so that `swift build` puts them there.
///
/// ```swift
/// try await withTemporaryBroker { client in
///     let notes = RemoteStore<Note>(client: client, name: "notes")
///     try await notes.insert(Note(id: "1", text: "milk"))
/// }
/// ```
///
/// `body` runs on the caller's actor (a `@MainActor` test may touch its main-actor state in it). Within it,
/// `BrokerClient.shared` is this broker's client: a property wrapper made there without a client
/// (`@RemoteStoredValue(key:)`) uses the temporary broker, never the user's real one.
public func withTemporaryBroker<T>(
    engine: String = "sqlite", logger: Logger = Logger(label: "storebroker.testing", factory: { _ in SwiftLogNoOpLogHandler() }),
    configure: @Sendable (inout ServerConfiguration) -> Void = { _ in },
    isolation: isolated (any Actor)? = #isolation,
    _ body: (BrokerClient) async throws -> T
) async throws -> T {
    let broker = try await TemporaryBroker(engine: engine, logger: logger, configure: configure)
    do {
        let result = try await BrokerClient.$scoped.withValue(
            broker.client, operation: { try await body(broker.client) }, isolation: isolation)
        await broker.remove()
        return result
    } catch {
        await broker.remove()
        throw error
    }
}

/// A temporary broker that can be stopped and started again on the same data (for reconnect tests).
public final class TemporaryBroker: Sendable {
    /// The directory holding the socket and the data; removed by `remove()`.
    public let directory: String
    public let configuration: ServerConfiguration
    /// A client of this broker (it reconnects by itself after `restart()`).
    public let client: BrokerClient
    private let logger: Logger
    private let daemon: LockedDaemon

    /// The running daemon and the task that runs its services (a broker in a test lives beside the test's own
    /// tasks, not inside one of them).
    private final class LockedDaemon: @unchecked Sendable {
        private let lock = NSLock()
        private var daemon: (BrokerDaemon, Task<Void, Never>)?
        var value: (BrokerDaemon, Task<Void, Never>)? {
            get { lock.withLock { daemon } }
            set { lock.withLock { daemon = newValue } }
        }
    }

    public init(
        engine: String = "sqlite", logger: Logger = Logger(label: "storebroker.testing", factory: { _ in SwiftLogNoOpLogHandler() }),
        configure: @Sendable (inout ServerConfiguration) -> Void = { _ in }
    ) async throws {
        var template = Array("/tmp/sbt-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw DaemonError.system(.configuration, "cannot create a temporary directory in /tmp") }
        directory = String(cString: made)
        var configuration = ServerConfiguration(
            socketPath: directory + "/s.sock",
            broker: BrokerConfiguration(dataDirectory: directory + "/data", defaultEngine: engine),
            environmentEnginePath: ProcessInfo.processInfo.environment["STOREBROKER_ENGINE_PATH"], dbus: .disabled)
        configure(&configuration)
        self.configuration = configuration
        self.logger = logger
        self.daemon = LockedDaemon()
        self.client = BrokerClient(socketPath: configuration.socketPath, clientName: "storebroker-testing")
        do {
            try await start()
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
    }

    /// Starts the broker (after `stop()`).
    public func start() async throws {
        let started = try BrokerDaemon(configuration: configuration, logger: logger)
        let running = Task { _ = try? await started.run() }  // its failure is `ready()`'s to throw
        do {
            try await started.ready()
        } catch {
            await running.value
            throw error
        }
        daemon.value = (started, running)
    }

    /// Stops it gracefully, as SIGTERM would.
    public func stop() async {
        guard let (running, task) = daemon.value else { return }
        daemon.value = nil
        await running.shutdown()
        await task.value
    }

    /// Stops and starts it again on the same socket and data.
    public func restart() async throws {
        await stop()
        try await start()
    }

    /// Stops it and deletes its directory.
    public func remove() async {
        await client.close()
        await stop()
        try? FileManager.default.removeItem(atPath: directory)
    }
}
