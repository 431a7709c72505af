import CLibPQ
import CStorageEngine
import StorageEngineKit

#if canImport(Glibc)
import Glibc
#endif

// The postgres engine: stores in a PostgreSQL database, shared by every broker that opens a store of the same
// name with the same `conninfo` and `schema` (SB_CAP_SHARED). One connection per (conninfo, schema) for every
// store the process has open; each apply is one transaction that also records the store's sequence. Schema:
// docs/ENGINE-ABI.md ("The postgres engine").

@_cdecl("storebroker_engine_entry")
public func storebrokerEngineEntry() -> UnsafePointer<storebroker_engine> { postgresEngineTable }

nonisolated(unsafe) private let postgresEngineTable = EngineExport.table(for: PostgresEngine())

final class PostgresEngine: SharedEngineDefinition {
    let name = "postgres"
    let version = "1.0.0 (libpq \(PQlibVersion()))"
    let capabilities = UInt64(SB_CAP_PERSISTENT | SB_CAP_ATOMIC | SB_CAP_SHARED)
    let optionKeys = ["conninfo", "schema", "log_commits", FailureInjection.optionKey]
    let sessions = SessionRegistry()

    /// The options, checked.
    struct Settings {
        /// A libpq connection string ("host=/run/pg port=5433 dbname=stores"); empty: libpq's defaults and the
        /// PG* environment variables. Never put in a message: it may hold a password.
        var conninfo = ""
        /// The schema the engine's tables live in: a lowercase SQL identifier.
        var schema = "storebroker"
        /// Commits each store's log keeps: a broker further behind than this reloads the store.
        var logCommits: UInt64 = 10_000
        var failure: FailureInjection

        init(_ options: [String: String]) throws(EngineError) {
            conninfo = options["conninfo", default: ""]
            var parseError: UnsafeMutablePointer<CChar>?
            if let parsed = PQconninfoParse(conninfo, &parseError) {
                PQconninfoFree(parsed)
            } else {
                // libpq's message may quote part of the string (and so of a password): not repeated.
                if let parseError { PQfreemem(parseError) }
                throw EngineError.invalid("conninfo is not a valid libpq connection string (its text is not shown: it may hold a password)")
            }
            if let value = options["schema"] {
                let allowed = value.utf8.allSatisfy { ($0 >= 0x61 && $0 <= 0x7A) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x5F }
                guard allowed, let first = value.utf8.first, !(first >= 0x30 && first <= 0x39), value.utf8.count <= 63 else {
                    throw EngineError.invalid(
                        "schema must be a lowercase SQL identifier (a-z, 0-9, _; not starting with a digit; at most 63 bytes), got \(value.debugDescription)")
                }
                schema = value
            }
            logCommits = try EngineOptions.wholeNumber(options, "log_commits", of: "commits", atLeast: 1) ?? logCommits
            failure = try FailureInjection(options: options)
        }
    }

    func checkOptions(_ options: [String: String]) throws(EngineError) {
        _ = try Settings(options)
    }

    func open(directory: String, store: String, options: [String: String]) throws(EngineError)
        -> (store: any EngineStoreImplementation, sequence: UInt64)
    {
        let settings = try Settings(options)
        let shared = try sessions.acquire(settings)
        do throws(EngineError) {
            let opened = PostgresStore(
                name: store, shared: shared, registry: sessions, logCommits: settings.logCommits, failure: settings.failure)
            return (opened, try opened.openSequence())
        } catch {
            sessions.release(shared)
            throw error
        }
    }

    func drop(directory: String, store: String, options: [String: String]) throws(EngineError) {
        let settings = try Settings(options)
        let shared = try sessions.acquire(settings)
        defer { sessions.release(shared) }
        try shared.use { (session, tables) throws(EngineError) in
            try session.transaction { () throws(EngineError) in
                try session.run("DELETE FROM \(tables.items) WHERE store = $1", [.text(store)])
                try session.run("DELETE FROM \(tables.commits) WHERE store = $1", [.text(store)])
                try session.run("DELETE FROM \(tables.stores) WHERE name = $1", [.text(store)])
                try session.run(
                    "SELECT pg_notify($1, $2)", [.text(tables.channel), .text(Notice.payload(epoch: 0, sequence: 0, store: store))])
            }
        }
    }
}

extension PostgresEngine {
    func watch(options: [String: String]) throws(EngineError) -> (watch: any EngineWatchImplementation, descriptor: Int32) {
        let settings = try Settings(options)
        let watch = try Watch(conninfo: settings.conninfo, tables: Tables(schema: settings.schema))
        return (watch, watch.descriptor)
    }

    func storeNames(options: [String: String]) throws(EngineError) -> [String] {
        let settings = try Settings(options)
        let shared = try sessions.acquire(settings)
        defer { sessions.release(shared) }
        return try shared.use { (session, tables) throws(EngineError) in
            let rows = try session.run("SELECT name FROM \(tables.stores) WHERE epoch <> 0")
            return (0..<rows.rows).map { row in
                let name = rows.bytes(row, 0)
                return String(decoding: UnsafeBufferPointer(start: name.data, count: name.length), as: UTF8.self)
            }
        }
    }
}

/// The engine's table names in a schema, quoted.
struct Tables {
    let schema: String
    var stores: String { "\"\(schema)\".stores" }
    var items: String { "\"\(schema)\".items" }
    var meta: String { "\"\(schema)\".meta" }
    var commits: String { "\"\(schema)\".commits" }
    /// `advance(store, check, epoch, sequence, new epoch, new sequence, reserve)`: the first statement of every
    /// commit (see `create`).
    var advance: String { "\"\(schema)\".advance" }
    /// The notification channel commits and drops are announced on (the payload: the store's name).
    var channel: String { "storebroker.\(schema)" }

    /// The format this engine writes; a schema of another format is refused, never rewritten.
    static let format: UInt64 = 1

    /// Creates what is missing, under an advisory lock so that brokers starting at once do not race.
    func create(_ session: Session) throws(EngineError) {
        try session.transaction { () throws(EngineError) in
            try session.execute(
                """
                SELECT pg_advisory_xact_lock(hashtext('storebroker schema \(schema)'));
                CREATE SCHEMA IF NOT EXISTS "\(schema)";
                CREATE TABLE IF NOT EXISTS \(meta) (name text PRIMARY KEY, value bigint NOT NULL);
                INSERT INTO \(meta) (name, value) VALUES ('format', \(Self.format)) ON CONFLICT (name) DO NOTHING;
                CREATE TABLE IF NOT EXISTS \(stores) (
                    name text PRIMARY KEY,
                    epoch bigint NOT NULL DEFAULT 0,
                    sequence bigint NOT NULL DEFAULT 0,
                    next_position bigint NOT NULL DEFAULT 1
                );
                CREATE TABLE IF NOT EXISTS \(items) (
                    store text NOT NULL,
                    key bytea NOT NULL,
                    position bigint NOT NULL,
                    payload bytea NOT NULL,
                    created_at bigint NOT NULL,
                    updated_at bigint NOT NULL,
                    PRIMARY KEY (store, key)
                );
                CREATE INDEX IF NOT EXISTS items_order ON \(items) (store, position);
                -- The first statement of a commit: makes the store's row if missing, locks it, compares its
                -- position with the expected one (when asked: apply_at) and fails with SQLSTATE SB409 on
                -- another, then records the new position and reserves positions for new keys. Returns the first
                -- reserved position. (One function, so that a commit is one pipeline: nothing waits for its
                -- answer before the next statement is sent.)
                CREATE OR REPLACE FUNCTION \(advance)(
                    p_store text, p_check boolean, p_epoch bigint, p_sequence bigint, p_new_epoch bigint,
                    p_new_sequence bigint, p_reserve bigint) RETURNS bigint LANGUAGE plpgsql AS $body$
                DECLARE
                    found_epoch bigint;
                    found_sequence bigint;
                    base bigint;
                BEGIN
                    INSERT INTO \(stores) (name) VALUES (p_store) ON CONFLICT (name) DO NOTHING;
                    SELECT epoch, sequence, next_position INTO found_epoch, found_sequence, base
                        FROM \(stores) WHERE name = p_store FOR UPDATE;
                    IF p_check AND (found_epoch <> p_epoch OR found_sequence <> p_sequence) THEN
                        RAISE EXCEPTION 'store % is at epoch % sequence %; the commit expected epoch % sequence %',
                            p_store, found_epoch, found_sequence, p_epoch, p_sequence USING ERRCODE = 'SB409';
                    END IF;
                    UPDATE \(stores) SET epoch = coalesce(p_new_epoch, epoch), sequence = p_new_sequence,
                        next_position = base + p_reserve WHERE name = p_store;
                    RETURN base;
                END
                $body$;
                CREATE TABLE IF NOT EXISTS \(commits) (
                    store text NOT NULL,
                    epoch bigint NOT NULL,
                    sequence bigint NOT NULL,
                    record bytea NOT NULL,
                    PRIMARY KEY (store, sequence)
                );
                """)
            let format = try session.run("SELECT value FROM \(meta) WHERE name = 'format'")
            guard format.rows == 1, format.uint64(0, 0) == Self.format else {
                throw EngineError(
                    Int32(SB_ERR_UNSUPPORTED),
                    "schema \(schema) holds format \(format.rows == 1 ? String(format.uint64(0, 0)) : "none"); this engine reads format \(Self.format)")
            }
        }
    }
}

/// A connection shared by every store of one (conninfo, schema), one caller at a time.
final class SharedSession: @unchecked Sendable {
    let key: String
    let tables: Tables
    private let conninfo: String
    private var session: Session?
    private let lock = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    /// Guarded by the registry's lock.
    var users = 0

    init(key: String, conninfo: String, schema: String) {
        self.key = key
        self.conninfo = conninfo
        self.tables = Tables(schema: schema)
        pthread_mutex_init(lock, nil)
    }

    deinit {
        pthread_mutex_destroy(lock)
        lock.deallocate()
    }

    /// Runs `body` with the connection (made, or remade after a loss, first) and the schema ready.
    func use<T>(_ body: (Session, Tables) throws(EngineError) -> T) throws(EngineError) -> T {
        pthread_mutex_lock(lock)
        defer { pthread_mutex_unlock(lock) }
        let current: Session
        if let session {
            try session.ensureConnected()
            current = session
        } else {
            current = try Session(conninfo: conninfo)
            try tables.create(current)
            session = current
        }
        do throws(EngineError) {
            return try body(current, tables)
        } catch {
            // The connection was lost (a server restart) and nothing can have committed: once more, on a new one.
            guard !current.isConnected, !current.commitInDoubt, (try? current.ensureConnected()) != nil else { throw error }
            return try body(current, tables)
        }
    }
}

/// The shared connections, by (conninfo, schema); closed when their last store closes.
final class SessionRegistry: @unchecked Sendable {
    private var sessions: [String: SharedSession] = [:]
    private let lock = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)

    init() { pthread_mutex_init(lock, nil) }

    func acquire(_ settings: PostgresEngine.Settings) throws(EngineError) -> SharedSession {
        let key = settings.conninfo + "\u{0}" + settings.schema
        pthread_mutex_lock(lock)
        let shared = sessions[key] ?? SharedSession(key: key, conninfo: settings.conninfo, schema: settings.schema)
        sessions[key] = shared
        shared.users += 1
        pthread_mutex_unlock(lock)
        // Connect now, so that an unreachable server fails the open, not the first apply.
        do throws(EngineError) {
            try shared.use { (_, _) throws(EngineError) in }
        } catch {
            release(shared)
            throw error
        }
        return shared
    }

    func release(_ shared: SharedSession) {
        pthread_mutex_lock(lock)
        defer { pthread_mutex_unlock(lock) }
        shared.users -= 1
        if shared.users == 0, sessions[shared.key] === shared { sessions[shared.key] = nil }
    }
}
