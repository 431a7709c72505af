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
/// `init` does what can fail before anything listens: it checks the configuration and the engines, locks the
/// data directory and opens the broker. `run` runs the daemon's services in one `ServiceGroup` until a graceful
/// shutdown (storebrokerd: SIGTERM or SIGINT; in-process brokers: `shutdown()`): the listener binds in its `run`,
/// so the socket path appears only once connections are accepted. `storebrokerd` and the testing product run the
/// same code.
public final class BrokerDaemon: Sendable {
    public let configuration: ServerConfiguration
    public let broker: Broker
    private let logger: Logger
    private let lock: DataDirectoryLock
    /// What start-up made, removed if the daemon never came to listen.
    private let litter: StartupLitter
    private let group: ServiceGroup
    private let listener: Listener
    /// Happens when `run` has cleaned up: `shutdown()` returns then.
    private let finished = Occurrence<Void>()
    /// `run` is called once.
    private let ran = Atomic(false)

    /// Checks the configuration, locks the data directory and opens the broker; nothing listens yet (`run`).
    /// `signals`: those that begin a graceful shutdown (storebrokerd: SIGTERM and SIGINT; in-process brokers:
    /// none, they install no handlers).
    public init(configuration: ServerConfiguration, logger: Logger, signals: [UnixSignal] = []) throws(DaemonError) {
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

            do throws(BrokerError) {
                litter.directories += try FileOps.makeDirectory(dataDirectory, recursive: true)
            } catch {
                throw DaemonError(.dataDirectory, error.message, underlying: error)
            }
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
            let threads = BlockingThreads(count: configuration.broker.writerThreads)
            let broker: Broker
            do {
                // One loop owns every store and serves every connection, as Redis's one thread does: requests reach
                // their store with no hand-off between threads and no lock.
                broker = try Broker(
                    configuration: configuration.broker, engines: engines,
                    owner: MultiThreadedEventLoopGroup.singleton.next(), blocking: threads, logger: logger,
                    sealer: sealer, observers: publisher.map { [$0] } ?? [])
            } catch {
                threads.pool.shutdownGracefully { _ in }
                throw DaemonError(
                    .dataDirectory, "cannot prepare the data directory \(dataDirectory): \(error.message)", underlying: error)
            }

            let registry = ConnectionRegistry()
            let maxConnections = effectiveConnectionCap(configuration.maxConnections, logger: logger)
            let policy = AccessPolicy(ownUID: getuid(), rules: configuration.allowRules)
            let listener = Listener(configuration: configuration, logger: logger) {
                Self.makeBootstrap(
                    configuration: configuration, broker: broker, policy: policy, registry: registry,
                    maxConnections: maxConnections, logger: logger)
            }

            // Started in this order, shut down in reverse: stop accepting, then the broker (queued writes
            // finished and answered, engines closed), then D-Bus, then `goodbye` to every connection (closed after
            // `--shutdown-timeout` at the latest), then the threads for blocking work. The whole graceful shutdown
            // is bounded by `--shutdown-timeout` plus 5 s; past it the group cancels what is left.
            var services: [any Service] = []
            if !signals.isEmpty { services.append(SignalLog(signals: signals, logger: logger)) }
            services.append(threads)
            services.append(
                ConnectionCloser(
                    registry: registry, message: "storebrokerd is shutting down", timeout: configuration.shutdownTimeout))
            if let publisher { services.append(publisher) }
            services += [BrokerService(broker: broker), listener]
            var group = ServiceGroupConfiguration(
                services: services.map { ServiceGroupConfiguration.ServiceConfiguration(service: $0) },
                gracefulShutdownSignals: signals, cancellationSignals: [], logger: logger)
            group.maximumGracefulShutdownDuration = configuration.shutdownTimeout + .seconds(5)

            self.group = ServiceGroup(configuration: group)
            self.listener = listener
            self.configuration = configuration
            self.broker = broker
            self.logger = logger
            self.lock = lock!
            self.litter = litter
        } catch {
            // Nothing is left behind (docs/DAEMON.md).
            litter.remove()
            lock?.release()
            throw error
        }
    }

    /// Runs the services until a graceful shutdown has ended them; then removes the socket (if it is still
    /// ours) and releases the data directory. Throws when the daemon could not listen; what start-up made is then
    /// removed.
    public func run() async throws(DaemonError) {
        precondition(!ran.exchange(true, ordering: .relaxed), "BrokerDaemon.run() called twice")
        var failure: DaemonError?
        do {
            try await group.run()
        } catch let error as DaemonError {
            failure = error
        } catch {
            failure = DaemonError(.services, "the daemon's services stopped: \(error)", underlying: error)
        }
        if let socketInode = listener.socketInode, DaemonPaths.inode(of: configuration.socketPath) == socketInode {
            unlink(configuration.socketPath)
        }
        if !listener.listened { litter.remove() }  // nothing is left behind (docs/DAEMON.md)
        lock.release()
        // A run that ended before the listener bound (another service failed first) never listens.
        listener.listening.happen(failure ?? DaemonError(.services, "the daemon stopped before it listened"))
        finished.happen(())
        if let failure {
            logger.debug("stopped: \(failure.message)")
            throw failure
        }
        logger.info("stopped")
    }

    /// Returns once the daemon accepts connections (its socket in place), or throws why it never will.
    public func ready() async throws(DaemonError) {
        if let failure = await listener.listening.wait() { throw failure }
    }

    /// Stops, as SIGTERM would: no new connections, queued writes finished and answered, `goodbye` to every
    /// client, engines closed, the socket removed (if it is still ours), the data directory unlocked. Returns
    /// once `run` (which must have been called) has done all of it; safe to call more than once.
    public func shutdown() async {
        await group.triggerGracefulShutdown()
        _ = await finished.wait()
    }

    /// Runs until SIGTERM or SIGINT, then shuts down. The signal mask is reset first: a parent may have left
    /// SIGTERM blocked (../PITFALLS.md), and the daemon must always hear it.
    public static func run(configuration: ServerConfiguration, logger: Logger) async throws(DaemonError) {
        var empty = sigset_t()
        sigemptyset(&empty)
        pthread_sigmask(SIG_SETMASK, &empty, nil)
        signal(SIGPIPE, SIG_IGN)
        raiseDescriptorLimit(logger: logger)
        try await BrokerDaemon(configuration: configuration, logger: logger, signals: [.sigterm, .sigint]).run()
    }

    private static func makeBootstrap(
        configuration: ServerConfiguration, broker: Broker, policy: AccessPolicy, registry: ConnectionRegistry,
        maxConnections: Int, logger: Logger
    ) -> ServerBootstrap {
        let settings = ConnectionHandler.Settings(
            broker: broker, turn: LoopTurn(broker: broker),
            machine: .init(
                limits: configuration.limits,
                timeouts: Timeouts(handshake: configuration.handshakeTimeout, frame: configuration.frameTimeout),
                highWatermark: ConnectionHandler.writeBufferWaterMark.high),
            budget: ByteBudget(perConnection: configuration.maxConnectionBytes, total: configuration.maxTotalBytes),
            subscriptions: SubscriptionQuota(
                perConnection: configuration.maxSubscriptions, total: configuration.maxTotalSubscriptions),
            subscriberBuffer: configuration.broker.subscriberBuffer, registry: registry)
        let acceptTrouble = AcceptTroubleLog(logger: logger)
        let reserve = DescriptorReserve()
        return ServerBootstrap(group: broker.owner)
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
                            ConnectionHandler(settings, context: context, logger: connectionLogger))
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
}
