import CSQLite
import CStorageEngine
import StorageEngineKit

#if canImport(Glibc)
import Glibc
#endif

// The sqlite engine: one SQLite database per store (`store.sqlite3` in the store's directory), WAL mode,
// prepared statements, each apply in one IMMEDIATE transaction. The order column is the table's INTEGER PRIMARY
// KEY, so the store's order survives restarts and reads never depend on key order. No statement binds more
// than four parameters, so no batch or store size hits SQLITE_MAX_VARIABLE_NUMBER. Schema: docs/ENGINE-ABI.md.

@_cdecl("storebroker_engine_entry")
public func storebrokerEngineEntry() -> UnsafePointer<storebroker_engine> { sqliteEngineTable }

nonisolated(unsafe) private let sqliteEngineTable = EngineExport.table(for: SQLiteEngine())

final class SQLiteEngine: EngineDefinition {
    let name = "sqlite"
    let version = "1.0.0 (SQLite \(String(cString: sqlite3_libversion())))"
    let capabilities = UInt64(SB_CAP_PERSISTENT | SB_CAP_ATOMIC)
    let optionKeys = ["synchronous", "busy_timeout_ms", "max_page_count", FailureInjection.optionKey]

    static let fileName = "store.sqlite3"

    /// The options, checked: what `checkOptions` validates and `open` uses.
    struct Settings {
        var synchronous = "NORMAL"
        var busyTimeout: Int32 = 5000
        /// A quota: the database may grow to this many pages (SQLite's own limit is used, which cannot go below
        /// the pages the file already has); past it a write fails with SB_ERR_FULL and changes nothing.
        var maxPageCount: Int?
        var failure: FailureInjection

        init(_ options: [String: String]) throws(EngineError) {
            synchronous = options["synchronous", default: "NORMAL"].uppercased()
            guard ["OFF", "NORMAL", "FULL", "EXTRA"].contains(synchronous) else {
                throw EngineError.invalid("synchronous must be OFF, NORMAL, FULL or EXTRA, got \(synchronous.debugDescription)")
            }
            busyTimeout = try EngineOptions.wholeNumber(options, "busy_timeout_ms", of: "milliseconds") ?? busyTimeout
            maxPageCount = try EngineOptions.wholeNumber(options, "max_page_count", of: "pages", atLeast: 1)
            failure = try FailureInjection(options: options)
        }
    }

    func checkOptions(_ options: [String: String]) throws(EngineError) {
        _ = try Settings(options)
    }

    /// FULL and EXTRA sync the log at every commit; NORMAL syncs it only at checkpoints, so a power cut may take
    /// any number of the last commits (the database stays consistent). OFF may also damage it, which no value
    /// here can promise away: `power-loss` fails it.
    func powerLossWindow(_ options: [String: String]) throws(EngineError) -> UInt64 {
        ["FULL", "EXTRA"].contains(try Settings(options).synchronous) ? 0 : UInt64(SB_POWER_LOSS_UNBOUNDED)
    }

    func open(directory: String, store: String, options: [String: String]) throws(EngineError)
        -> (store: any EngineStoreImplementation, sequence: UInt64)
    {
        let settings = try Settings(options)
        let store = try SQLiteStore(
            path: directory + "/" + Self.fileName, synchronous: settings.synchronous, busyTimeout: settings.busyTimeout,
            maxPageCount: settings.maxPageCount, failure: settings.failure)
        return (store, try store.readSequence())
    }

    func drop(directory: String, store: String, options: [String: String]) throws(EngineError) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let path = directory + "/" + Self.fileName + suffix
            if unlink(path) != 0, errno != ENOENT { throw EngineError.errno("cannot delete \(path)") }
        }
    }
}

/// A prepared statement, reset after every use.
final class Statement {
    let handle: OpaquePointer
    private let db: OpaquePointer

    init(_ db: OpaquePointer, _ sql: String) throws(EngineError) {
        var statement: OpaquePointer?
        let status = sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard status == SQLITE_OK, let statement else { throw SQLiteStore.error(db, status, "prepare \(sql)") }
        self.handle = statement
        self.db = db
    }

    deinit { sqlite3_finalize(handle) }

    func bind(_ index: Int32, _ bytes: sb_bytes) {
        if bytes.length == 0 || bytes.data == nil {
            sqlite3_bind_zeroblob(handle, index, 0)
        } else {
            // SQLITE_STATIC: the bytes outlive the statement's use (it is reset before the call returns).
            sqlite3_bind_blob64(handle, index, bytes.data, sqlite3_uint64(bytes.length), csqlite_static())
        }
    }

    func bind(_ index: Int32, _ value: UInt64) {
        sqlite3_bind_int64(handle, index, sqlite3_int64(bitPattern: value))
    }

    /// Steps once: true for a row, false when done.
    func step() throws(EngineError) -> Bool {
        switch sqlite3_step(handle) {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        case let status: throw SQLiteStore.error(db, status, "step")
        }
    }

    func reset() {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
    }

    func blob(_ column: Int32) -> sb_bytes {
        let length = Int(sqlite3_column_bytes(handle, column))
        let data = sqlite3_column_blob(handle, column)?.assumingMemoryBound(to: UInt8.self)
        return sb_bytes(data: length > 0 ? data : nil, length: length)
    }

    func uint64(_ column: Int32) -> UInt64 {
        UInt64(bitPattern: sqlite3_column_int64(handle, column))
    }

    /// Runs `body` with the statement, resetting it afterwards whatever happens.
    func use<T>(_ body: (Statement) throws(EngineError) -> T) throws(EngineError) -> T {
        defer { reset() }
        return try body(self)
    }
}

final class SQLiteStore: EngineStoreImplementation {
    private let db: OpaquePointer
    private let failure: FailureInjection
    private let put, remove, removeAll, setSequence, scanAll, countAll: Statement
    private let begin, commit, rollback: Statement
    private let checkpoints: Checkpointer.Target

    init(
        path: String, synchronous: String, busyTimeout: Int32, maxPageCount: Int? = nil, failure: FailureInjection
    ) throws(EngineError) {
        var handle: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE
        let status = sqlite3_open_v2(path, &handle, flags, nil)
        guard status == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close_v2(handle)
            throw EngineError(SQLiteStore.code(status), "cannot open \(path): \(message)")
        }
        db = handle
        self.failure = failure
        do throws(EngineError) {
            sqlite3_busy_timeout(db, busyTimeout)
            try Self.exec(
                db,
                """
                PRAGMA journal_mode=WAL;
                PRAGMA synchronous=\(synchronous);
                CREATE TABLE IF NOT EXISTS items (
                    position INTEGER PRIMARY KEY,
                    key BLOB NOT NULL UNIQUE,
                    payload BLOB NOT NULL,
                    created_at INTEGER NOT NULL,
                    updated_at INTEGER NOT NULL
                );
                CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
                INSERT OR IGNORE INTO meta (name, value) VALUES ('format', 1), ('sequence', 0);
                """)
            if let maxPageCount { try Self.exec(db, "PRAGMA max_page_count=\(maxPageCount);") }
            put = try Statement(
                db,
                """
                INSERT INTO items (key, payload, created_at, updated_at) VALUES (?1, ?2, ?3, ?4)
                ON CONFLICT (key) DO UPDATE SET
                    payload = excluded.payload, created_at = excluded.created_at, updated_at = excluded.updated_at
                """)
            remove = try Statement(db, "DELETE FROM items WHERE key = ?1")
            removeAll = try Statement(db, "DELETE FROM items")
            setSequence = try Statement(db, "UPDATE meta SET value = ?1 WHERE name = 'sequence'")
            scanAll = try Statement(db, "SELECT key, payload, created_at, updated_at FROM items ORDER BY position")
            countAll = try Statement(db, "SELECT count(*) FROM items")
            begin = try Statement(db, "BEGIN IMMEDIATE")
            commit = try Statement(db, "COMMIT")
            rollback = try Statement(db, "ROLLBACK")
            checkpoints = Checkpointer.Target(path: path)
            Checkpointer.watch(db, checkpoints)
        } catch {
            sqlite3_close_v2(handle)
            throw error
        }
    }

    func readSequence() throws(EngineError) -> UInt64 {
        let statement = try Statement(db, "SELECT value FROM meta WHERE name = 'sequence'")
        return try statement.use { (s) throws(EngineError) in try s.step() ? s.uint64(0) : 0 }
    }

    func apply(_ steps: UnsafeBufferPointer<sb_step>, sequence: UInt64) throws(EngineError) {
        try begin.use { (s) throws(EngineError) in _ = try s.step() }
        do throws(EngineError) {
            for (index, step) in steps.enumerated() {
                try failure.check(stepIndex: index)
                try step.checkKey()
                switch Int(step.kind) {
                case SB_STEP_PUT:
                    try put.use { (s) throws(EngineError) in
                        s.bind(1, step.key)
                        s.bind(2, step.payload)
                        s.bind(3, step.created_at)
                        s.bind(4, step.updated_at)
                        _ = try s.step()
                    }
                case SB_STEP_REMOVE:
                    try remove.use { (s) throws(EngineError) in
                        s.bind(1, step.key)
                        _ = try s.step()
                    }
                case SB_STEP_REMOVE_ALL:
                    try removeAll.use { (s) throws(EngineError) in _ = try s.step() }
                default:
                    throw EngineError.invalid("unknown step kind \(step.kind)")
                }
            }
            try setSequence.use { (s) throws(EngineError) in
                s.bind(1, sequence)
                _ = try s.step()
            }
            try commit.use { (s) throws(EngineError) in _ = try s.step() }
        } catch {
            if sqlite3_get_autocommit(db) == 0 {
                rollback.reset()
                _ = sqlite3_step(rollback.handle)
                rollback.reset()
            }
            throw error
        }
    }

    func scan(emit: (UnsafePointer<sb_item>) -> Bool) throws(EngineError) {
        try scanAll.use { (s) throws(EngineError) in
            while try s.step() {
                var item = sb_item(key: s.blob(0), payload: s.blob(1), created_at: s.uint64(2), updated_at: s.uint64(3))
                guard emit(&item) else { throw EngineError.stopped }
            }
        }
    }

    func count() throws(EngineError) -> UInt64 {
        try countAll.use { (s) throws(EngineError) in try s.step() ? s.uint64(0) : 0 }
    }

    func close() {
        Checkpointer.shared.forget(checkpoints.path)
        // Statements are finalized by their deinit; close_v2 waits for that.
        sqlite3_close_v2(db)
    }

    static func exec(_ db: OpaquePointer, _ sql: String) throws(EngineError) {
        let status = sqlite3_exec(db, sql, nil, nil, nil)
        guard status == SQLITE_OK else { throw error(db, status, "setting up the database") }
    }

    static func code(_ status: Int32) -> Int32 {
        switch status & 0xFF {
        case SQLITE_FULL: Int32(SB_ERR_FULL)
        case SQLITE_CORRUPT, SQLITE_NOTADB: Int32(SB_ERR_CORRUPT)
        case SQLITE_MISUSE, SQLITE_INTERNAL: Int32(SB_ERR_INTERNAL)
        default: Int32(SB_ERR_IO)
        }
    }

    static func error(_ db: OpaquePointer, _ status: Int32, _ what: String) -> EngineError {
        EngineError(code(status), "SQLite \(what): \(String(cString: sqlite3_errmsg(db))) (code \(status))")
    }
}
