#if canImport(Glibc)
import Glibc
#endif
import BrokerCore
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import Synchronization
import UnixSignals
import Wire

/// Listens on the daemon's socket. Binds in `run`: a temporary name in the socket's directory, renamed into
/// place once it accepts (or the socket systemd handed over); stops accepting at the graceful shutdown.
final class Listener: Service, Sendable {
    private let configuration: ServerConfiguration
    /// Makes the bootstrap when the listener binds (a `ServerBootstrap` is not `Sendable`).
    private let makeBootstrap: @Sendable () -> ServerBootstrap
    private let logger: Logger
    /// Happens once the socket is in place, or with why it never will be.
    let listening = Occurrence<DaemonError?>()
    /// Set once by `run` when it listens (the inode of the socket file it put in place, nil for a handed-over
    /// socket); read by the daemon after `run`.
    private let bound = Mutex<(listened: Bool, inode: ino_t?)>((false, nil))

    init(configuration: ServerConfiguration, logger: Logger, bootstrap: @escaping @Sendable () -> ServerBootstrap) {
        self.configuration = configuration
        self.makeBootstrap = bootstrap
        self.logger = logger
    }

    /// Whether it listened: what start-up made is then the daemon's to keep.
    var listened: Bool { bound.withLock { $0.listened } }
    /// The inode of the socket file it put in place; nil for a handed-over socket or before binding.
    var socketInode: ino_t? { bound.withLock { $0.inode } }

    func run() async throws {
        let channel: any Channel
        do throws(DaemonError) {
            channel = try await bind()
        } catch {
            listening.happen(error)
            throw error
        }
        var ready: Logger.Metadata = [
            "socket": "\(configuration.inheritedSocket.map { "fd \($0) from systemd" } ?? configuration.socketPath)",
            "data": "\(configuration.broker.dataDirectory)", "engine": "\(configuration.broker.defaultEngine)",
            "version": "\(StoreBrokerVersion.string)",
        ]
        if !configuration.allowRules.isEmpty {
            ready["allow"] = "\(configuration.allowRules.map(\.description).joined(separator: ","))"
        }
        if case .disabled = configuration.dbus { ready["dbus"] = "off" }
        logger.info("storebrokerd ready", metadata: ready)
        listening.happen(nil)
        try? await gracefulShutdown()
        logger.info("shutting down")
        try? await channel.close()
    }

    private func bind() async throws(DaemonError) -> any Channel {
        let bootstrap = makeBootstrap()
        if let inherited = configuration.inheritedSocket {
            do {
                let channel = try await bootstrap.withBoundSocket(inherited).get()
                bound.withLock { $0.listened = true }
                return channel
            } catch {
                throw DaemonError(
                    .socket, "cannot use the socket handed over by systemd (fd \(inherited)): \(error)", underlying: error)
            }
        }
        let socketPath = configuration.socketPath
        let temporary = DaemonPaths.parent(of: socketPath) + "/.storebrokerd-\(getpid()).sock"
        guard temporary.utf8.count <= SocketPath.maxLength else {
            throw DaemonError(.socket, "the socket path is too long to bind beside it (\(temporary))")
        }
        unlink(temporary)
        let channel: any Channel
        do {
            channel = try await bootstrap.bind(unixDomainSocketPath: temporary).get()
        } catch {
            throw DaemonError(.socket, "cannot listen on \(temporary): \(error)", underlying: error)
        }
        let mode: mode_t = configuration.allowRules.isEmpty ? 0o600 : 0o666
        guard chmod(temporary, mode) == 0, rename(temporary, socketPath) == 0 else {
            let failure = DaemonError.system(.socket, "cannot put the socket in place at \(socketPath)")
            unlink(temporary)
            try? await channel.close()
            throw failure
        }
        bound.withLock { $0 = (true, DaemonPaths.inode(of: socketPath)) }
        return channel
    }
}

/// The broker as a service: at the graceful shutdown it refuses new writes, finishes and answers the queued ones
/// and closes every engine store.
struct BrokerService: Service {
    let broker: Broker

    func run() async throws {
        try? await gracefulShutdown()
        await broker.shutdown()
    }
}

/// The broker's threads for blocking work: NIO's thread pool, started at once (`--writer-threads` threads). A
/// service of its own, the first in the group so the last to stop: engine work (a read of a store not loaded
/// yet, say) is done on these threads until every connection has closed.
struct BlockingThreads: BlockingExecutor, Service {
    let pool: NIOThreadPool

    init(count: Int) {
        pool = NIOThreadPool(numberOfThreads: max(1, count))
        pool.start()
    }

    func execute(_ job: @escaping @Sendable () -> Void) {
        // Whatever the state: a job answers writes. Once the pool has stopped (after the last connection), one
        // would run on the thread that submits it; nothing does then.
        pool.submit { _ in job() }
    }

    func run() async throws {
        try? await gracefulShutdown()
        try? await pool.shutdownGracefully()
    }
}

/// Says goodbye to every connection at the graceful shutdown and waits until each has closed (at most `timeout`).
struct ConnectionCloser: Service {
    let registry: ConnectionRegistry
    let message: String
    let timeout: Duration

    func run() async throws {
        try? await gracefulShutdown()
        await registry.closeAll(message: message, timeout: timeout)
    }
}

/// Logs each shutdown signal storebrokerd receives (the service group, which traps them too, begins the
/// shutdown). First in the group, so shut down last: a second signal during the shutdown is logged as well.
struct SignalLog: Service {
    let signals: [UnixSignal]
    let logger: Logger

    func run() async throws {
        for await signal in await UnixSignalsSequence(trapping: signals).cancelOnGracefulShutdown() {
            logger.info("received \(signal)")
        }
    }
}
