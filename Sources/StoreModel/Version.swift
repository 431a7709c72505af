/// The version of this storebroker build (daemon, CLI and libraries ship together).
public enum StoreBrokerVersion {
    public static let string = "0.1.0-dev"
}
