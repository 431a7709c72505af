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

    public enum DBusSetting: Hashable, Sendable {
        case sessionBus
        case address(String)
        case disabled
    }

    public init(
        socketPath: String, broker: BrokerConfiguration, engineDirectories: [String] = [],
        environmentEnginePath: String? = nil, maxFrameLength: Int = WireProtocol.defaultMaxFrameLength,
        maxInFlight: Int = 128, dbus: DBusSetting = .sessionBus
    ) {
        self.socketPath = socketPath
        self.broker = broker
        self.engineDirectories = engineDirectories
        self.environmentEnginePath = environmentEnginePath
        self.maxFrameLength = maxFrameLength
        self.maxInFlight = maxInFlight
        self.dbus = dbus
    }

    var limits: ServerSession.Limits {
        ServerSession.Limits(
            maxFrameLength: maxFrameLength, maxItemLength: broker.maxItemLength, maxBatch: broker.maxBatch,
            maxInFlight: maxInFlight)
    }
}
