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

    func changes(_ changed: (String?) -> Void) throws(EngineError) -> Int32 {
        do throws(EngineError) {
            for name in try session.notices() { changed(name) }
            return session.descriptor
        } catch {
            guard !session.isConnected else { throw error }
            // Lost (a server restart): listen again on a new connection; what was announced meanwhile is lost,
            // so every store may have changed.
            try session.ensureConnected()
            try listen()
            changed(nil)
            return session.descriptor
        }
    }

    func close() {}
}
