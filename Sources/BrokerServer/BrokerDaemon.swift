#if canImport(Glibc)
import Glibc
#endif
import BrokerCore
import BrokerDBus
import Dispatch
import EngineLoader
import Locking
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import UnixSignals
import Synchronization
import Wire

extension Channel {
    /// Closes once `lastWord` is written, without losing it: closing a socket that still holds unread input
    /// makes the kernel send a reset, and a reset can destroy the client's copy of the last word. So the
    /// output is shut down first (the client reads the last word, then end of stream), and the connection is
    /// closed when the client closes its side, or after `linger`.
    func closeAfterLastWord(_ lastWord: EventLoopFuture<Void>, linger: TimeAmount = .seconds(5)) {
        lastWord.whenComplete { _ in
            self.close(mode: .output, promise: nil)
            // Cancelled when the client closes first: a pending task would keep the channel alive until then.
            let deadline = self.eventLoop.scheduleTask(in: linger) { self.close(promise: nil) }
            self.closeFuture.whenComplete { _ in deadline.cancel() }
        }
    }
}

/// Answers a connection it will not serve with one `error` (id 0), then closes it: when the client closes its
/// side, or after `linger`.
final class RefusingHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private let error: WireError
    private let linger: TimeAmount

    init(error: WireError, linger: TimeAmount = .seconds(5)) {
        self.error = error
        self.linger = linger
    }

    func channelActive(context: ChannelHandlerContext) {
        context.channel.closeAfterLastWord(
            context.writeAndFlush(wrapOutboundOut(ServerSession.errorFrame(error, id: 0))), linger: linger)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}  // nothing it says matters

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // The client read the refusal and closed its side: nothing is left to say either way.
        if case .inputClosed = event as? ChannelEvent { context.close(promise: nil) }
    }
}

/// Says that accepting fails (typically EMFILE: out of file descriptors) once per episode, and when it works
/// again: an episode ends after 10 s without a failure, so a daemon living at its limit logs two lines, not two
/// per connection.
final class AcceptTroubleLog: Sendable {
    private let logger: Logger
    private let troubled = Atomic<Bool>(false)
    private let lastFailure = Locked<ContinuousClock.Instant>(.now)

    init(logger: Logger) {
        self.logger = logger
    }

    func report(_ error: IOError) {
        lastFailure.withLock { $0 = .now }
        if !troubled.exchange(true, ordering: .relaxed) {
            logger.warning(
                "cannot accept connections: \(error); retrying every 250 ms, refusing what it can with tooManyConnections (raise the descriptor limit or lower --max-connections)")
        }
    }

    func accepted() {
        guard troubled.load(ordering: .relaxed), lastFailure.withLock({ .now - $0 > .seconds(10) }) else { return }
        if troubled.exchange(false, ordering: .relaxed) {
            logger.notice("accepting connections again")
        }
    }
}

/// One descriptor kept in reserve (on /dev/null) so that a client can be told clearly that the daemon is out
/// of descriptors instead of waiting unanswered: when `accept` fails with EMFILE the reserve is given up, the
/// next connection accepted with it gets `tooManyConnections`, and the reserve is taken back when that
/// connection has closed.
final class DescriptorReserve: Sendable {
    private struct State {
        var fd: Int32 = -1
        var refuseNext = false
    }

    private let state = Locked(State())

    init() {
        restore()
    }

    /// Accepting failed for lack of descriptors: free the reserve for the next accept, to refuse it. True when
    /// it was there to free.
    func release() -> Bool {
        state.withLock { state in
            guard state.fd >= 0 else { return false }
            close(state.fd)
            state.fd = -1
            state.refuseNext = true
            return true
        }
    }

    /// Whether this accepted connection used the reserve and must be refused (asked once per connection).
    func takeRefusal() -> Bool {
        state.withLock { state in
            defer { state.refuseNext = false }
            return state.refuseNext
        }
    }

    /// Takes the reserve back (when it can: a descriptor may not be free yet; then at the next chance).
    func restore() {
        state.withLock { state in
            guard state.fd < 0 else { return }
            state.fd = open("/dev/null", O_RDONLY | O_CLOEXEC)
        }
    }
}

/// Raises the soft limit on open files to the hard limit: each connection is a descriptor.
func raiseDescriptorLimit(logger: Logger) {
    var limit = rlimit()
    guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
    let before = limit.rlim_cur
    limit.rlim_cur = limit.rlim_max
    if setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0 {
        logger.debug("raised the open-file limit from \(before) to \(limit.rlim_max)")
    }
}

/// The connections that can really be served: `--max-connections`, or fewer when the descriptor limit leaves
/// less room (keeping some descriptors for engines, D-Bus and refusing connections clearly).
func effectiveConnectionCap(_ configured: Int, logger: Logger) -> Int {
    var limit = rlimit()
    guard getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < rlim_t(Int32.max) else { return configured }
    let inUse = openDescriptorCount() ?? 32
    let room = Int(limit.rlim_cur) - inUse - 32
    if room < configured {
        logger.warning(
            "the open-file limit (\(limit.rlim_cur)) leaves room for \(max(1, room)) connections, fewer than --max-connections \(configured)")
        return max(1, room)
    }
    return configured
}

/// How many descriptors this process has open (the entries of /proc/self/fd).
func openDescriptorCount() -> Int? {
    guard let directory = opendir("/proc/self/fd") else { return nil }
    defer { closedir(directory) }
    var count = -2  // "." and ".."
    while readdir(directory) != nil { count += 1 }
    return count - 1  // the directory's own descriptor
}

/// The daemon: a broker on a data directory, listening on a Unix socket.
///
/// `start` is the one build function: `storebrokerd` calls it (through `run`), and so can tests and the
/// testing product, so they all run the same code.
public final class BrokerDaemon: Sendable {
    public let configuration: ServerConfiguration
    public let broker: Broker
    private let logger: Logger
    private let lock: DataDirectoryLock
    private let socketInode: ino_t?
    /// The daemon's services, shut down in reverse order: accepting, the broker, D-Bus, the connections.
    private let group: ServiceGroup
    /// `group.run()`, awaited by `shutdown` (and by `run`): nothing the daemon starts outlives it.
    private let running: Locked<Task<Void, Never>?> = Locked(nil)
    private let stopped = Locked<Bool>(false)

    private init(
        configuration: ServerConfiguration, broker: Broker, logger: Logger, serverChannel: any Channel,
        registry: ConnectionRegistry, lock: DataDirectoryLock, publisher: DBusPublisher?, socketInode: ino_t?,
        signals: [UnixSignal]
    ) {
        self.group = Self.services(
            configuration: configuration, broker: broker, logger: logger, serverChannel: serverChannel,
            registry: registry, publisher: publisher, signals: signals)
        self.configuration = configuration
        self.broker = broker
        self.logger = logger
        self.lock = lock
        self.socketInode = socketInode
    }

    /// Checks the configuration, locks the data directory, loads the default engine, and listens. The socket
    /// path appears only once the daemon accepts connections.
    public static func start(configuration: ServerConfiguration, logger: Logger) async throws(DaemonError) -> BrokerDaemon
    {
        try await start(configuration: configuration, logger: logger, signals: [])
    }

    /// `signals`: the signals that begin a graceful shutdown (storebrokerd: SIGTERM and SIGINT; in-process
    /// brokers: none, they install no handlers).
    static func start(
        configuration: ServerConfiguration, logger: Logger, signals: [UnixSignal]
    ) async throws(DaemonError) -> BrokerDaemon {
        let largest = WireProtocol.largestItem(maxFrameLength: configuration.maxFrameLength)
        guard configuration.broker.maxItemLength <= largest else {
            throw DaemonError(
                .configuration, "the largest item (\(configuration.broker.maxItemLength) bytes) must fit in one frame with the largest id "
                    + "and store name: at most \(largest) bytes for frames of \(configuration.maxFrameLength)")
        }
        let socketPath = configuration.socketPath
        let shared = !configuration.allowRules.isEmpty
        var litter = StartupLitter()
        var lock: DataDirectoryLock?
        do throws(DaemonError) {
            if configuration.inheritedSocket == nil {
                if let made = try DaemonPaths.prepareSocketDirectory(for: socketPath, mode: shared ? 0o711 : 0o700) {
                    litter.directories.append(made)
                }
                switch DaemonPaths.occupant(of: socketPath) {
                case .liveDaemon:
                    throw DaemonError(.alreadyRunning, "a storebrokerd is already listening on \(socketPath)")
                case .notASocket:
                    throw DaemonError(.socket, "\(socketPath) exists and is not a socket; refusing to replace it")
                case .staleSocket:
                    logger.info("replacing a stale socket", metadata: ["socket": "\(socketPath)"])
                case .nothing:
                    break
                }
            }

            let dataDirectory = configuration.broker.dataDirectory
            guard dataDirectory.hasPrefix("/") else {
                throw DaemonError(.configuration, "the data directory must be absolute: \(dataDirectory)")
            }
            // Engines first: checking them touches no file of ours.
            let loader = EngineLoader(
                searchPath: .standard(
                    engineDirectories: configuration.engineDirectories,
                    environmentPath: configuration.environmentEnginePath))
            let engines = LoaderEngineProvider(loader: loader)
            try engines.validate(configuration.broker)

            litter.directories += try DaemonPaths.makeDirectories(dataDirectory)
            let entriesBefore = DaemonPaths.entries(of: dataDirectory) ?? []
            lock = try DataDirectoryLock(directory: dataDirectory)
            // Only now are the data directory's files ours to clean up.
            litter.dataDirectory = dataDirectory
            litter.dataEntriesBefore = entriesBefore
            let sealer = try KeyFileSealer.load(dataDirectory: dataDirectory)
            let publisher: DBusPublisher?
            switch configuration.dbus {
            case .disabled: publisher = nil
            case .sessionBus(let address): publisher = DBusPublisher(bus: .session(address: address), logger: logger)
            case .address(let address): publisher = DBusPublisher(bus: .address(address), logger: logger)
            }
            let broker: Broker
            do {
                broker = try Broker(
                    configuration: configuration.broker, engines: engines, logger: logger, sealer: sealer,
                    observers: publisher.map { [$0] } ?? [])
            } catch {
                throw DaemonError(
                    .dataDirectory, "cannot prepare the data directory \(dataDirectory): \(error.message)", underlying: error)
            }

            let registry = ConnectionRegistry()
            let maxConnections = effectiveConnectionCap(configuration.maxConnections, logger: logger)
            let policy = AccessPolicy(ownUID: getuid(), rules: configuration.allowRules)
            let bootstrap = makeBootstrap(
                configuration: configuration, broker: broker, policy: policy, registry: registry,
                maxConnections: maxConnections, logger: logger)
            let serverChannel: any Channel
            if let inherited = configuration.inheritedSocket {
                do {
                    serverChannel = try await bootstrap.withBoundSocket(inherited).get()
                } catch {
                    throw DaemonError(
                        .socket, "cannot use the socket handed over by systemd (fd \(inherited)): \(error)", underlying: error)
                }
            } else {
                // Bind a temporary name in the same directory, then rename it into place.
                let temporary = DaemonPaths.parent(of: socketPath) + "/.storebrokerd-\(getpid()).sock"
                guard temporary.utf8.count <= SocketPath.maxLength else {
                    throw DaemonError(.socket, "the socket path is too long to bind beside it (\(temporary))")
                }
                unlink(temporary)
                do {
                    serverChannel = try await bootstrap.bind(unixDomainSocketPath: temporary).get()
                } catch {
                    throw DaemonError(.socket, "cannot listen on \(temporary): \(error)", underlying: error)
                }
                guard chmod(temporary, shared ? 0o666 : 0o600) == 0, rename(temporary, socketPath) == 0 else {
                    let failure = DaemonError.system(.socket, "cannot put the socket in place at \(socketPath)")
                    unlink(temporary)
                    try? await serverChannel.close()
                    throw failure
                }
            }
            var ready: Logger.Metadata = [
                "socket": "\(configuration.inheritedSocket.map { "fd \($0) from systemd" } ?? socketPath)",
                "data": "\(dataDirectory)", "engine": "\(configuration.broker.defaultEngine)",
                "version": "\(StoreBrokerVersion.string)",
            ]
            if shared { ready["allow"] = "\(configuration.allowRules.map(\.description).joined(separator: ","))" }
            if publisher == nil { ready["dbus"] = "off" }
            let daemon = BrokerDaemon(
                configuration: configuration, broker: broker, logger: logger, serverChannel: serverChannel,
                registry: registry, lock: lock!, publisher: publisher,
                socketInode: configuration.inheritedSocket == nil ? DaemonPaths.inode(of: socketPath) : nil,
                signals: signals)
            daemon.running.withLock { $0 = Task { await daemon.runServices() } }
            logger.info("storebrokerd ready", metadata: ready)
            return daemon
        } catch {
            // Nothing is left behind (docs/DAEMON.md).
            litter.remove()
            lock?.release()
            throw error
        }
    }

    private static func makeBootstrap(
        configuration: ServerConfiguration, broker: Broker, policy: AccessPolicy, registry: ConnectionRegistry,
        maxConnections: Int, logger: Logger
    ) -> ServerBootstrap {
        let limits = configuration.limits
        let subscriberBuffer = configuration.broker.subscriberBuffer
        let subscriptions = SubscriptionQuota(
            perConnection: configuration.maxSubscriptions, total: configuration.maxTotalSubscriptions)
        let budget = ByteBudget(perConnection: configuration.maxConnectionBytes, total: configuration.maxTotalBytes)
        let timeouts = Timeouts(handshake: configuration.handshakeTimeout, frame: configuration.frameTimeout)
        let acceptTrouble = AcceptTroubleLog(logger: logger)
        let reserve = DescriptorReserve()
        return ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: Int32(clamping: configuration.listenBacklog))
            .serverChannelInitializer { channel in
                // Out of descriptors (EMFILE): stop accepting for a moment instead of retrying at once, with one
                // log line per episode.
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(
                        AcceptBackoffHandler(shouldForwardIOErrorCaught: false) { error in
                            acceptTrouble.report(error)
                            // With the reserve freed, accept again at once: that connection is refused clearly.
                            if error.errnoCode == EMFILE || error.errnoCode == ENFILE, reserve.release() { return nil }
                            return .milliseconds(250)
                        })
                }
            }
            // Up to 16 reads of at most 64 KiB (NIO's adaptive allocator) per read cycle: 1 MiB, far under
            // --max-connection-bytes, and everything a pipelining client sent is taken in one cycle.
            .childChannelOption(.maxMessagesPerRead, value: 16)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelOption(.writeBufferWaterMark, value: ConnectionHandler.writeBufferWaterMark)
            .childChannelInitializer { channel in
                if reserve.takeRefusal() {
                    // Accepted with the reserve descriptor: say why it cannot be served, then take it back.
                    channel.closeFuture.whenComplete { _ in reserve.restore() }
                    let error = WireError(
                        .tooManyConnections,
                        "storebrokerd has run out of file descriptors (raise its limit, or lower --max-connections); try again later")
                    return channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(RefusingHandler(error: error, linger: .milliseconds(200)))
                    }
                }
                reserve.restore()
                registry.track(channel)
                acceptTrouble.accepted()
                if registry.count > maxConnections {
                    logger.debug("refused a connection: \(maxConnections) connections are open")
                    let error = WireError(
                        .tooManyConnections,
                        "storebrokerd serves at most \(maxConnections) connections at once (--max-connections); try again later")
                    return channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(RefusingHandler(error: error))
                    }
                }
                return peerCredentials(of: channel).flatMap { credentials in
                    var connectionLogger = logger
                    connectionLogger[metadataKey: "peer.pid"] = "\(credentials?.pid ?? 0)"
                    connectionLogger[metadataKey: "peer.uid"] = "\(credentials.map { String($0.uid) } ?? "?")"
                    guard let credentials, let grant = policy.grant(for: credentials.uid) else {
                        connectionLogger.warning("refused a peer of another user")
                        let error = WireError(
                            .permissionDenied,
                            "uid \(credentials.map { String($0.uid) } ?? "unknown") is not allowed on this broker "
                                + "(it serves uid \(policy.ownUID)\(policy.rules.isEmpty ? "" : " and the --allow-uid rules"))")
                        return channel.eventLoop.makeCompletedFuture {
                            try channel.pipeline.syncOperations.addHandler(RefusingHandler(error: error))
                        }
                    }
                    let context = RequestContext(
                        peer: Peer(uid: credentials.uid, pid: credentials.pid), grant: grant, clientName: "")
                    return channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(
                            ConnectionHandler(
                                broker: broker, limits: limits, subscriberBuffer: subscriberBuffer,
                                subscriptions: subscriptions, registry: registry, budget: budget, timeouts: timeouts, context: context,
                                logger: connectionLogger))
                    }
                }
            }
    }

    /// `struct ucred` (Glibc hides it behind _GNU_SOURCE): pid, uid, gid.
    struct PeerCredentials: Sendable {
        var pid: Int32 = 0
        var uid: UInt32 = 0
        var gid: UInt32 = 0
    }

    /// The peer's credentials (`SO_PEERCRED`), or `nil` when they cannot be read.
    private static func peerCredentials(of channel: any Channel) -> EventLoopFuture<PeerCredentials?> {
        guard let provider = channel as? any SocketOptionProvider else {
            return channel.eventLoop.makeSucceededFuture(nil)
        }
        let future: EventLoopFuture<PeerCredentials> = provider.unsafeGetSocketOption(
            level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(SO_PEERCRED))
        return future.map { Optional($0) }.recover { _ in nil }
    }

    /// The services, in start order; the group shuts them down in reverse: stop accepting, then the broker
    /// (queued writes finished and answered, engines closed), then D-Bus, then `goodbye` to every connection
    /// (closed after `--shutdown-timeout` at the latest). The whole graceful shutdown is bounded by
    /// `--shutdown-timeout` plus 5 s; past it the group cancels what is left.
    private static func services(
        configuration: ServerConfiguration, broker: Broker, logger: Logger, serverChannel: any Channel,
        registry: ConnectionRegistry, publisher: DBusPublisher?, signals: [UnixSignal]
    ) -> ServiceGroup {
        var services: [any Service] = []
        let shutdown = ShutdownTrigger()
        if !signals.isEmpty { services.append(SignalLog(signals: signals, logger: logger, shutdown: shutdown)) }
        services += [
            DaemonStep("connections") {
                await registry.closeAll(message: "storebrokerd is shutting down", timeout: configuration.shutdownTimeout)
            }
        ]
        if let publisher {
            services.append(DaemonStep("dbus", start: { publisher.start() }) { await publisher.stop() })
        }
        services.append(DaemonStep("broker") { await broker.shutdown() })
        services.append(
            DaemonStep("listener") {
                logger.info("shutting down")
                try? await serverChannel.close()
            })
        // The signals are the signal log's alone: it logs one, then begins the shutdown. Had the group trapped
        // them as well, its shutdown could end the log's wait before the log had seen the signal.
        var group = ServiceGroupConfiguration(
            services: services.map { ServiceGroupConfiguration.ServiceConfiguration(service: $0) },
            gracefulShutdownSignals: [], cancellationSignals: [], logger: logger)
        group.maximumGracefulShutdownDuration = configuration.shutdownTimeout + .seconds(5)
        let serviceGroup = ServiceGroup(configuration: group)
        shutdown.group.withLock { $0 = serviceGroup }
        return serviceGroup
    }

    private func runServices() async {
        do {
            try await group.run()
        } catch {
            logger.error("the daemon's services stopped with an error: \(error)")
        }
    }

    /// Stops: no new connections, queued writes finished and answered, `goodbye` to every client, engines
    /// closed, the socket removed (if it is still ours), the data directory unlocked. Safe to call more than
    /// once; returns when all of it is done.
    public func shutdown() async {
        await group.triggerGracefulShutdown()
        await finish()
    }

    /// Waits for the services to end, then removes the socket and releases the lock (once).
    private func finish() async {
        await running.withLock { $0 }?.value
        let first = stopped.withLock { stopped in
            defer { stopped = true }
            return !stopped
        }
        guard first else { return }
        if let socketInode, DaemonPaths.inode(of: configuration.socketPath) == socketInode {
            unlink(configuration.socketPath)
        }
        lock.release()
        logger.info("stopped")
    }

    /// Runs until SIGTERM or SIGINT (heard by the signal log, which begins the group's shutdown), then shuts down. The signal mask is reset
    /// first: a parent may have left SIGTERM blocked (../PITFALLS.md), and the daemon must always hear it.
    public static func run(configuration: ServerConfiguration, logger: Logger) async throws(DaemonError) {
        var empty = sigset_t()
        sigemptyset(&empty)
        pthread_sigmask(SIG_SETMASK, &empty, nil)
        signal(SIGPIPE, SIG_IGN)
        raiseDescriptorLimit(logger: logger)
        let daemon = try await start(configuration: configuration, logger: logger, signals: [.sigterm, .sigint])
        await daemon.finish()
    }
}

/// One part of the daemon as a service: `start` when the group runs, then it waits for the graceful shutdown
/// and does `stop` (or does it at once if the group is cancelled).
struct DaemonStep: Service, CustomStringConvertible {
    let description: String
    private let start: @Sendable () -> Void
    private let stop: @Sendable () async -> Void

    init(_ name: String, start: @escaping @Sendable () -> Void = {}, stop: @escaping @Sendable () async -> Void) {
        self.description = name
        self.start = start
        self.stop = stop
    }

    func run() async throws {
        start()
        try? await gracefulShutdown()
        await stop()
    }
}

/// The service group a signal shuts down, known once the group is made (after its services).
final class ShutdownTrigger: Sendable {
    let group = Locked<ServiceGroup?>(nil)
}

/// Hears the signals that end the daemon: says which one came, then begins the group's graceful shutdown. First
/// in the group, so it is shut down last and hears a second signal during the shutdown (logged; the shutdown
/// goes on).
struct SignalLog: Service {
    let signals: [UnixSignal]
    let logger: Logger
    let shutdown: ShutdownTrigger

    func run() async throws {
        for await signal in await UnixSignalsSequence(trapping: signals).cancelOnGracefulShutdown() {
            logger.info("received \(signal)")
            await shutdown.group.withLock { $0 }?.triggerGracefulShutdown()
        }
    }
}
