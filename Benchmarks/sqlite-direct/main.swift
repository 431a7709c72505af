// sqlite-direct: the SQLite side of scripts/bench-side-by-side.sh — the same work a broker client asks for,
// done straight on one SQLite file in this process, with the pragmas the broker's sqlite engine uses (WAL, the
// given `synchronous`, a 5 s busy timeout) and its table shape. Prints one number: seconds.
//
//   sqlite-direct writer DB COUNT SYNCHRONOUS PREFIX   COUNT single-row autocommit inserts (several processes
//                                                      may write the same file at once)
//   sqlite-direct batch DB COUNT BYTES SYNCHRONOUS      COUNT rows of BYTES in one transaction
//   sqlite-direct read DB COUNT BYTES                   fills COUNT rows of BYTES, then times reading them all
//                                                      (the median of 5 reads)
import CSQLite
import Foundation

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("sqlite-direct: \(message)\n".utf8))
    exit(1)
}

func open(_ path: String, synchronous: String) -> OpaquePointer {
    var db: OpaquePointer?
    guard sqlite3_open(path, &db) == SQLITE_OK, let db else { fail("cannot open \(path)") }
    sqlite3_busy_timeout(db, 5000)
    exec(db, "PRAGMA journal_mode=WAL")
    exec(db, "PRAGMA synchronous=\(synchronous)")
    exec(
        db,
        """
        CREATE TABLE IF NOT EXISTS items (position INTEGER PRIMARY KEY, key BLOB NOT NULL UNIQUE,
            payload BLOB NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)
        """)
    return db
}

func exec(_ db: OpaquePointer, _ sql: String) {
    // Retried while another process holds the write lock past the busy timeout (never here, but cheap).
    while true {
        let status = sqlite3_exec(db, sql, nil, nil, nil)
        if status == SQLITE_OK { return }
        if status == SQLITE_BUSY { continue }
        fail("\(sql): \(String(cString: sqlite3_errmsg(db)))")
    }
}

func prepare(_ db: OpaquePointer, _ sql: String) -> OpaquePointer {
    var statement: OpaquePointer?
    guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK, let statement else {
        fail("\(sql): \(String(cString: sqlite3_errmsg(db)))")
    }
    return statement
}

let upsert =
    "INSERT INTO items (key, payload, created_at, updated_at) VALUES (?1, ?2, ?3, ?3) "
    + "ON CONFLICT (key) DO UPDATE SET payload = excluded.payload, updated_at = excluded.updated_at"

func put(_ statement: OpaquePointer, key: String, payload: [UInt8]) -> Int32 {
    let keyBytes = Array(key.utf8)
    sqlite3_bind_blob(statement, 1, keyBytes, Int32(keyBytes.count), csqlite_transient())
    sqlite3_bind_blob(statement, 2, payload, Int32(payload.count), csqlite_transient())
    sqlite3_bind_int64(statement, 3, Int64(Date().timeIntervalSince1970 * 1000))
    let status = sqlite3_step(statement)
    sqlite3_reset(statement)
    return status
}

func now() -> Double { Double(DispatchTime.now().uptimeNanoseconds) / 1e9 }

let arguments = Array(CommandLine.arguments.dropFirst())
guard let mode = arguments.first else { fail("usage: sqlite-direct writer|batch|read ...") }
switch (mode, arguments.count) {
case ("writer", 5):
    let db = open(arguments[1], synchronous: arguments[3])
    let count = Int(arguments[2])!
    let statement = prepare(db, upsert)
    let payload = [UInt8](repeating: UInt8(ascii: "x"), count: 200)
    let start = now()
    for index in 0..<count {
        while true {  // each insert acknowledged (committed) before the next, like a broker client's
            let status = put(statement, key: "\(arguments[4])-\(index)", payload: payload)
            if status == SQLITE_DONE { break }
            if status != SQLITE_BUSY { fail("insert: \(String(cString: sqlite3_errmsg(db)))") }
        }
    }
    print(String(format: "%.6f", now() - start))
case ("batch", 5):
    let db = open(arguments[1], synchronous: arguments[4])
    let count = Int(arguments[2])!
    let payload = [UInt8](repeating: UInt8(ascii: "x"), count: Int(arguments[3])!)
    let statement = prepare(db, upsert)
    let start = now()
    exec(db, "BEGIN IMMEDIATE")
    for index in 0..<count where put(statement, key: "batch-\(index)", payload: payload) != SQLITE_DONE {
        fail("insert: \(String(cString: sqlite3_errmsg(db)))")
    }
    exec(db, "COMMIT")
    print(String(format: "%.6f", now() - start))
case ("read", 4):
    let db = open(arguments[1], synchronous: "NORMAL")
    let count = Int(arguments[2])!
    let payload = [UInt8](repeating: UInt8(ascii: "x"), count: Int(arguments[3])!)
    let statement = prepare(db, upsert)
    exec(db, "BEGIN IMMEDIATE")
    for index in 0..<count { _ = put(statement, key: "read-\(index)", payload: payload) }
    exec(db, "COMMIT")
    var times: [Double] = []
    let select = prepare(db, "SELECT key, payload, created_at, updated_at FROM items ORDER BY position")
    for _ in 0..<5 {
        let start = now()
        var rows: [([UInt8], [UInt8])] = []
        rows.reserveCapacity(count)
        while sqlite3_step(select) == SQLITE_ROW {
            let key = [UInt8](UnsafeRawBufferPointer(start: sqlite3_column_blob(select, 0), count: Int(sqlite3_column_bytes(select, 0))))
            let value = [UInt8](UnsafeRawBufferPointer(start: sqlite3_column_blob(select, 1), count: Int(sqlite3_column_bytes(select, 1))))
            rows.append((key, value))
        }
        sqlite3_reset(select)
        times.append(now() - start)
        guard rows.count == count else { fail("read \(rows.count) rows, not \(count)") }
    }
    print(String(format: "%.6f", times.sorted()[2]))
default:
    fail("usage: sqlite-direct writer DB COUNT SYNCHRONOUS PREFIX | batch DB COUNT BYTES SYNCHRONOUS | read DB COUNT BYTES")
}
