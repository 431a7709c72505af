import BrokerCore
import Wire

/// Everything the daemon needs, built at the edge (flags and environment) by `storebrokerd` or a test.
public struct ServerConfiguration: Sendable {
    /// The socket to listen on.
    public var socketPath: String
    /// The stores and their limits.
    public var broker: BrokerConfiguration
    /// `--engine-path` directories, searched first.
    public var engineDirectories: [String]
    /// `STOREBROKER_ENGINE_PATH`, as read by the caller.
    public var environmentEnginePath: String?
    /// The largest frame accepted or sent (`--max-frame`).
    public var maxFrameLength: Int
    /// Requests a connection may have unanswered before the daemon stops reading from it.
    public var maxInFlight: Int
    /// D-Bus: the session bus, a given address, or off.
    public var dbus: DBusSetting
    /// `--allow-uid`: other users and what they may reach. With any, the socket's directory is created with
    /// mode 0711 and the socket gets 0666; `SO_PEERCRED` decides who is served.
    public var allowRules: [AccessRule]
    /// A listening socket handed over by systemd (`LISTEN_FDS`): used instead of binding `socketPath`, and
    /// never unlinked.
    public var inheritedSocket: Int32?
    /// How many bytes one connection may hold (unread requests and unsent answers) before the daemon stops
    /// reading from it (`--max-connection-bytes`). At least one frame's worth.
    public var maxConnectionBytes: Int = 64 << 20
    /// How many bytes all connections together may hold (`--max-total-bytes`); past it, only connections above
    /// their share stop being read, so a connection that holds nothing is always served.
    public var maxTotalBytes: Int = 512 << 20
    /// Connections served at once (`--max-connections`); one more is refused with `tooManyConnections`.
    public var maxConnections: Int = 4096
    /// Subscriptions one connection may hold at once (`--max-subscriptions`); one more is refused with
    /// `tooManySubscriptions`.
    public var maxSubscriptions: Int = 1024
    /// Subscriptions all connections together may hold at once (`--max-total-subscriptions`); one more is
    /// refused with `tooManySubscriptions`.
    public var maxTotalSubscriptions: Int = 65536
    /// A connection must complete its `hello` within this (`--handshake-timeout`).
    public var handshakeTimeout: Duration = .seconds(10)
    /// A frame begun must be complete within this (`--frame-timeout`); idle connections are never closed.
    public var frameTimeout: Duration = .seconds(30)
    /// At shutdown, how long clients get to take their last answers before their connections are closed
    /// (`--shutdown-timeout`).
    public var shutdownTimeout: Duration = .seconds(10)
    /// The listen backlog (`--listen-backlog`).
    public var listenBacklog: Int = 4096

    public enum DBusSetting: Hashable, Sendable {
        /// The session bus: `DBUS_SESSION_BUS_ADDRESS` as read by the caller, else `$XDG_RUNTIME_DIR/bus`.
        case sessionBus(address: String?)
        case address(String)
        case disabled
    }

    public init(
        socketPath: String, broker: BrokerConfiguration, engineDirectories: [String] = [],
        environmentEnginePath: String? = nil, maxFrameLength: Int = WireProtocol.defaultMaxFrameLength,
        maxInFlight: Int = 128, dbus: DBusSetting = .disabled, allowRules: [AccessRule] = [],
        inheritedSocket: Int32? = nil
    ) {
        self.socketPath = socketPath
        self.broker = broker
        self.engineDirectories = engineDirectories
        self.environmentEnginePath = environmentEnginePath
        self.maxFrameLength = maxFrameLength
        self.maxInFlight = maxInFlight
        self.dbus = dbus
        self.allowRules = allowRules
        self.inheritedSocket = inheritedSocket
    }

    var limits: ServerSession.Limits {
        ServerSession.Limits(
            maxFrameLength: maxFrameLength, maxItemLength: broker.maxItemLength, maxBatch: broker.maxBatch,
            maxInFlight: maxInFlight)
    }
}
