import ArgumentParser
import BrokerCore
import BrokerServer
import Foundation
import Logging
import Wire

/// `storebrokerd`: parses flags and the environment into a `ServerConfiguration` and runs the daemon.
@main
struct StoreBrokerDaemonCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "storebrokerd",
        abstract: "The store broker: the only writer of named, ordered stores, shared over a Unix socket.",
        discussion: """
            Paths, when not given:
              socket  $STOREBROKER_SOCKET, else $XDG_RUNTIME_DIR/storebroker/storebroker.sock,
                      else /tmp/storebroker-UID/storebroker.sock
              data    $XDG_DATA_HOME/storebroker, else ~/.local/share/storebroker
              engines --engine-path dirs, $STOREBROKER_ENGINE_PATH (colon-separated), the daemon's own
                      directory, then <bindir>/../lib/storebroker/engines

            SIGTERM or SIGINT: stop accepting, finish queued writes, say goodbye to clients, close the
            engines, remove the socket, exit 0.

            Example:
              storebrokerd --socket /tmp/sb.sock --data-dir /tmp/sb-data --no-dbus --log-level debug
            """,
        version: "storebrokerd \(StoreBrokerVersion.string) (protocol \(WireProtocol.supportedVersions.map(String.init).joined(separator: ", ")))"
    )

    @Option(help: ArgumentHelp("The Unix socket to listen on.", valueName: "path"))
    var socket: String?

    @Option(name: .customLong("data-dir"), help: ArgumentHelp("Where the stores live.", valueName: "dir"))
    var dataDirectory: String?

    @Option(help: ArgumentHelp("The engine for new stores; existing stores keep theirs.", valueName: "name"))
    var engine: String = "sqlite"

    @Option(
        name: .customLong("engine-path"),
        help: ArgumentHelp("A directory searched for engines first (repeatable).", valueName: "dir"))
    var enginePaths: [String] = []

    @Option(
        name: .customLong("engine-option"),
        help: ArgumentHelp(
            "An option for engine NAME, e.g. sqlite.synchronous=FULL (repeatable); unknown keys are an error.",
            valueName: "name.key=value"))
    var engineOptions: [String] = []

    @Option(
        name: .customLong("dbus-address"),
        help: ArgumentHelp("The D-Bus bus to signal on (default: the session bus).", valueName: "addr"))
    var dbusAddress: String?

    @Flag(name: .customLong("no-dbus"), help: "Do not signal on D-Bus.")
    var noDBus = false

    @Option(
        name: .customLong("allow-uid"),
        help: ArgumentHelp(
            "Admit another user (a uid or user name) to every store and value, or to those matching GLOB, read-only "
                + "with :ro (repeatable). Secure values stay this user's. The socket becomes 0666, its new directory 0711.",
            valueName: "uid[:glob[:ro]]"))
    var allowUIDs: [String] = []

    @Option(help: ArgumentHelp("Commits kept per store for subscribers that resume.", valueName: "n"))
    var history: Int = 1024

    @Option(
        name: .customLong("history-bytes"),
        help: ArgumentHelp("Bytes of ids and payloads that history may hold per store.", valueName: "bytes"))
    var historyBytes: Int = 64 << 20

    @Option(
        name: .customLong("writer-threads"),
        help: ArgumentHelp(
            "Threads for engine calls that may block: loads, drops, and the commit groups of an engine that is not "
                + "nonblocking, one job per group; an idle store holds none.", valueName: "n"))
    var writerThreads: Int = 4

    @Option(
        name: .customLong("max-group-wait"),
        help: ArgumentHelp(
            "After a slow commit (an fsync), how long a store's writer may wait for the clients it has just answered "
                + "before its next commit, so that they share it; 0: never.", valueName: "microseconds"))
    var maxGroupWait: Int = 1000

    @Option(
        name: .customLong("subscriber-buffer"),
        help: ArgumentHelp("Pushes one subscriber may have waiting before it is told it lagged.", valueName: "n"))
    var subscriberBuffer: Int = 1024

    @Option(name: .customLong("max-frame"), help: ArgumentHelp("The largest frame, in bytes.", valueName: "bytes"))
    var maxFrame: Int = WireProtocol.defaultMaxFrameLength

    @Option(
        name: .customLong("max-item"),
        help: ArgumentHelp("The largest item payload, in bytes (default: 1 MiB, or less to fit --max-frame).", valueName: "bytes"))
    var maxItemOption: Int?

    var maxItem: Int { maxItemOption ?? min(1 << 20, WireProtocol.largestItem(maxFrameLength: maxFrame)) }

    @Option(
        name: .customLong("max-batch"), help: ArgumentHelp("The most items, ids or steps in one request.", valueName: "n"))
    var maxBatch: Int = 10_000

    @Option(
        name: .customLong("max-in-flight"),
        help: ArgumentHelp("Unanswered requests per connection before the daemon stops reading it.", valueName: "n"))
    var maxInFlight: Int = 128

    @Option(
        name: .customLong("max-subscriptions"),
        help: ArgumentHelp(
            "Subscriptions one connection may hold at once; one more is refused (tooManySubscriptions).", valueName: "n"))
    var maxSubscriptions: Int = 1024

    @Option(
        name: .customLong("max-total-subscriptions"),
        help: ArgumentHelp(
            "Subscriptions all connections together may hold at once (each costs about 1.3 KB); one more is refused "
                + "(tooManySubscriptions).", valueName: "n"))
    var maxTotalSubscriptions: Int = 65536

    @Option(
        name: .customLong("max-connections"),
        help: ArgumentHelp("Connections served at once; one more is refused (tooManyConnections).", valueName: "n"))
    var maxConnections: Int = 4096

    @Option(
        name: .customLong("max-connection-bytes"),
        help: ArgumentHelp(
            "Bytes one connection may hold (unread requests, unsent answers) before the daemon stops reading it.",
            valueName: "bytes"))
    var maxConnectionBytes: Int = 64 << 20

    @Option(
        name: .customLong("max-total-bytes"),
        help: ArgumentHelp(
            "Bytes all connections may hold together; past it only connections above their share wait.",
            valueName: "bytes"))
    var maxTotalBytes: Int = 512 << 20

    @Option(
        name: .customLong("handshake-timeout"),
        help: ArgumentHelp("Seconds a new connection has to send its hello.", valueName: "seconds"))
    var handshakeTimeout: Double = 10

    @Option(
        name: .customLong("frame-timeout"),
        help: ArgumentHelp("Seconds a frame may stay half sent (idle connections are never closed).", valueName: "seconds"))
    var frameTimeout: Double = 30

    @Option(
        name: .customLong("shutdown-timeout"),
        help: ArgumentHelp("Seconds clients get to take their last answers at shutdown.", valueName: "seconds"))
    var shutdownTimeout: Double = 10

    @Option(name: .customLong("listen-backlog"), help: ArgumentHelp("The socket's listen backlog.", valueName: "n"))
    var listenBacklog: Int = 4096

    @Option(
        name: .customLong("log-level"),
        help: ArgumentHelp("trace, debug, info, notice, warning, error or critical.", valueName: "level"))
    var logLevel: String = "info"

    func validate() throws {
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical")
        }
        for rule in allowUIDs where AccessRule(parsing: rule) == nil {
            throw ValidationError("--allow-uid takes UID[:GLOB[:ro]] (a uid or a user name), got \(rule)")
        }
        if dbusAddress != nil, noDBus { throw ValidationError("--dbus-address and --no-dbus exclude each other") }
        for (name, value) in [("--history", history), ("--subscriber-buffer", subscriberBuffer)] where value < 0 {
            throw ValidationError("\(name) cannot be negative")
        }
        guard subscriberBuffer >= 1 else { throw ValidationError("--subscriber-buffer must be at least 1") }
        guard (1...256).contains(writerThreads) else { throw ValidationError("--writer-threads must be 1 to 256") }
        guard (0...1_000_000).contains(maxGroupWait) else {
            throw ValidationError("--max-group-wait takes microseconds, 0 to 1000000")
        }
        guard maxFrame >= 4096, maxFrame <= Int(UInt32.max) else {
            throw ValidationError("--max-frame must be between 4096 and \(UInt32.max)")
        }
        guard maxItem >= 1, maxItem <= WireProtocol.largestItem(maxFrameLength: maxFrame) else {
            throw ValidationError(
                "--max-item must be at least 1 and fit in one frame with the largest id and store name: at most "
                    + "--max-frame minus \(WireProtocol.itemFrameReserve) (\(WireProtocol.largestItem(maxFrameLength: maxFrame)))")
        }
        guard maxBatch >= 1 else { throw ValidationError("--max-batch must be at least 1") }
        guard maxInFlight >= 1 else { throw ValidationError("--max-in-flight must be at least 1") }
        guard maxSubscriptions >= 1 else { throw ValidationError("--max-subscriptions must be at least 1") }
        guard maxTotalSubscriptions >= 1 else { throw ValidationError("--max-total-subscriptions must be at least 1") }
        guard historyBytes >= 0 else { throw ValidationError("--history-bytes cannot be negative") }
        guard maxConnections >= 1 else { throw ValidationError("--max-connections must be at least 1") }
        guard maxConnectionBytes >= maxFrame + 65536 else {
            throw ValidationError("--max-connection-bytes must hold a whole frame: at least --max-frame + 65536")
        }
        guard maxTotalBytes >= maxConnectionBytes else {
            throw ValidationError("--max-total-bytes must be at least --max-connection-bytes")
        }
        for (name, value) in [
            ("--handshake-timeout", handshakeTimeout), ("--frame-timeout", frameTimeout),
            ("--shutdown-timeout", shutdownTimeout),
        ] where !(value > 0 && value <= 86400) {
            throw ValidationError("\(name) takes seconds, more than 0 and at most 86400")
        }
        guard listenBacklog >= 1 else { throw ValidationError("--listen-backlog must be at least 1") }
        _ = try parsedEngineOptions()
    }

    func parsedEngineOptions() throws -> [String: [String: String]] {
        var options: [String: [String: String]] = [:]
        for option in engineOptions {
            guard let equals = option.firstIndex(of: "="), let dot = option[..<equals].firstIndex(of: "."),
                dot != option.startIndex, option.index(after: dot) < equals
            else {
                throw ValidationError("--engine-option takes NAME.KEY=VALUE (e.g. sqlite.synchronous=FULL), got \(option)")
            }
            let name = String(option[..<dot])
            let key = String(option[option.index(after: dot)..<equals])
            options[name, default: [:]][key] = String(option[option.index(after: equals)...])
        }
        return options
    }

    /// Enlarges glibc's thread cache first (`AllocatorTuning`: the daemon may execute itself once more), then
    /// parses the flags and runs.
    static func main() async {
        AllocatorTuning.reexecuteIfNeeded()
        await main(nil)
    }

    func run() async throws {
        let level = Logger.Level(rawValue: logLevel) ?? .info
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "storebrokerd")
        let environment = ProcessInfo.processInfo.environment
        let socketPath = absolute(socket ?? SocketPath.default(environment: environment, uid: getuid()))
        let data = absolute(dataDirectory ?? DaemonPaths.defaultDataDirectory(environment: environment))
        var configuration = ServerConfiguration(
            socketPath: socketPath,
            broker: BrokerConfiguration(
                dataDirectory: data, defaultEngine: engine, engineOptions: try parsedEngineOptions(), history: history,
                historyBytes: historyBytes, subscriberBuffer: subscriberBuffer, maxItemLength: maxItem, maxBatch: maxBatch,
                writerThreads: writerThreads, maxGroupWait: .microseconds(maxGroupWait)),
            engineDirectories: enginePaths.map(absolute),
            environmentEnginePath: environment["STOREBROKER_ENGINE_PATH"],
            maxFrameLength: maxFrame, maxInFlight: maxInFlight,
            dbus: noDBus
                ? .disabled : dbusAddress.map { .address($0) } ?? .sessionBus(address: environment["DBUS_SESSION_BUS_ADDRESS"]),
            allowRules: allowUIDs.compactMap(AccessRule.init(parsing:)),
            inheritedSocket: Self.socketFromSystemd(environment))
        configuration.maxConnections = maxConnections
        configuration.maxSubscriptions = maxSubscriptions
        configuration.maxTotalSubscriptions = maxTotalSubscriptions
        configuration.maxConnectionBytes = maxConnectionBytes
        configuration.maxTotalBytes = maxTotalBytes
        configuration.handshakeTimeout = .milliseconds(Int64(handshakeTimeout * 1000))
        configuration.frameTimeout = .milliseconds(Int64(frameTimeout * 1000))
        configuration.shutdownTimeout = .milliseconds(Int64(shutdownTimeout * 1000))
        configuration.listenBacklog = listenBacklog
        logger.debug("allocator", metadata: ["GLIBC_TUNABLES": "\(environment["GLIBC_TUNABLES"] ?? "")"])
        do {
            try await BrokerDaemon.run(configuration: configuration, logger: logger)
        } catch {
            logger.debug(
                "cannot start",
                metadata: [
                    "error.code": "\(error.codeName)", "error.location": "\(error.location)",
                    "error.causes": "\(error.detailedDescription)",
                ])
            FileHandle.standardError.write(Data("storebrokerd: \(error.message)\n".utf8))
            throw ExitCode(1)
        }
    }

    /// Socket activation (sd_listen_fds): `LISTEN_PID` is this process and `LISTEN_FDS` at least 1, so fd 3
    /// is a listening socket. The variables are removed so that children do not take them for theirs.
    static func socketFromSystemd(_ environment: [String: String]) -> Int32? {
        defer {
            unsetenv("LISTEN_PID")
            unsetenv("LISTEN_FDS")
            unsetenv("LISTEN_FDNAMES")
        }
        guard let pid = environment["LISTEN_PID"].flatMap({ Int32($0) }), pid == getpid(),
            let count = environment["LISTEN_FDS"].flatMap({ Int($0) }), count >= 1
        else { return nil }
        return 3
    }

    private func absolute(_ path: String) -> String {
        path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
    }
}
