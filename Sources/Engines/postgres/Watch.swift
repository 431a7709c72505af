import CStorageEngine
import StorageEngineKit

/// A watch on every store of a schema: a connection of its own that LISTENs on the schema's channel. Each commit
/// and drop NOTIFYs there with the store's name, delivered when its transaction commits.
final class Watch: EngineWatchImplementation {
    private let session: Session
    private let tables: Tables

    init(conninfo: String, tables: Tables) throws(EngineError) {
        session = try Session(conninfo: conninfo)
        self.tables = tables
        try listen()
    }

    var descriptor: Int32 { session.descriptor }

    private func listen() throws(EngineError) {
        try session.execute("LISTEN \"\(tables.channel)\"")
    }

    func changes(_ changed: (String?, sb_position?) -> Void) throws(EngineError) -> Int32 {
        do throws(EngineError) {
            for payload in try session.notices() {
                let (name, position) = Notice.parse(payload)
                changed(name, position)
            }
            return session.descriptor
        } catch {
            guard !session.isConnected else { throw error }
            // Lost (a server restart): listen again on a new connection; what was announced meanwhile is lost,
            // so every store may have changed.
            try session.ensureConnected()
            try listen()
            changed(nil, nil)
            return session.descriptor
        }
    }

    func close() {}
}

/// A notice's payload: `EPOCH SEQUENCE NAME`, the store's position after the commit (`0 0` after a drop).
enum Notice {
    static func payload(epoch: UInt64, sequence: UInt64, store: String) -> String { "\(epoch) \(sequence) \(store)" }

    /// The store and its position; a payload of another shape is taken as a bare name (position unknown).
    static func parse(_ payload: String) -> (String, sb_position?) {
        let parts = payload.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, let epoch = UInt64(parts[0]), let sequence = UInt64(parts[1]) else { return (payload, nil) }
        return (String(parts[2]), sb_position(epoch: epoch, sequence: sequence))
    }
}
