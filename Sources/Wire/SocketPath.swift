/// Where the broker's socket is, by PRODUCT.md's rule, shared by the daemon and every client:
/// `STOREBROKER_SOCKET` if set, else `$XDG_RUNTIME_DIR/storebroker/storebroker.sock`, else
/// `/tmp/storebroker-UID/storebroker.sock`. An empty or relative `XDG_RUNTIME_DIR` counts as unset.
public enum SocketPath {
    /// The longest path a Unix socket address holds (`sun_path` is 108 bytes with its terminating zero).
    public static let maxLength = 107

    public static func `default`(environment: [String: String], uid: UInt32) -> String {
        if let explicit = environment["STOREBROKER_SOCKET"], !explicit.isEmpty { return explicit }
        if let runtime = environment["XDG_RUNTIME_DIR"], runtime.hasPrefix("/") {
            return runtime + "/storebroker/storebroker.sock"
        }
        return "/tmp/storebroker-\(uid)/storebroker.sock"
    }
}
