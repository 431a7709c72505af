import BrokerCore
import CSQLite
import EngineLoader
import Foundation
import NIOCore

// engine-bench: the storage engines through the loader, side by side with a process writing SQLite directly.
//
//   swift build -c release && .build/release/engine-bench [--runs N] [--dir DIR]
//
// Cases (each run on a fresh store, opened before and closed after the timed part; the median is reported):
//   apply-5000     one apply of 5,000 items of ~1 KB into an empty store
//   read-10000     reading back all 10,000 items (~1 KB each) of a store, in order
//   single-1000    1,000 applies of one item each, one after the other
// "sqlite-direct" is the same work done by this process on one SQLite file with the same schema, pragmas and
// one transaction per write, without the engine ABI: the cost the loader and the ABI add is the difference.

var runs = 5
var baseDirectory = FileManager.default.temporaryDirectory.path
var arguments = CommandLine.arguments.dropFirst().makeIterator()
while let argument = arguments.next() {
    switch argument {
    case "--runs": runs = Int(arguments.next() ?? "") ?? runs
    case "--dir": baseDirectory = arguments.next() ?? baseDirectory
    default:
        print("usage: engine-bench [--runs N] [--dir DIR]")
        exit(64)
    }
}

func payload(_ index: Int) -> ByteBuffer {
    let head = "{\"id\":\"item-\(index)\",\"title\":\"Item number \(index)\",\"body\":\""
    return ByteBuffer(string: head + String(repeating: "x", count: 1000 - head.utf8.count - 2) + "\"}")
}

let items5000 = (0..<5000).map { EngineRecord(key: Array("item-\($0)".utf8), payload: payload($0), createdAt: 1, updatedAt: 1) }
let items10000 = (0..<10000).map { EngineRecord(key: Array("item-\($0)".utf8), payload: payload($0), createdAt: 1, updatedAt: 1) }

@MainActor func freshDirectory() throws -> String {
    let path = baseDirectory + "/engine-bench-" + UUID().uuidString
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

func seconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
}

func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }

/// Times `body` `runs` times, each on a fresh directory: `prepare` (untimed) makes what `body` works on and
/// `finish` (untimed) releases it, so opening and closing stores is not counted.
@MainActor func measure<State>(
    _ prepare: (String) throws -> State, _ body: (State) throws -> Void, finish: (State) throws -> Void
) throws -> Double {
    var times: [Double] = []
    for _ in 0..<runs {
        let directory = try freshDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let state = try prepare(directory)
        let start = ContinuousClock.now
        try body(state)
        times.append(seconds(ContinuousClock.now - start))
        try finish(state)
    }
    return median(times)
}

struct Row {
    var engine: String
    var apply5000: Double
    var read10000: Double?
    var single1000: Double
}

let loader = EngineLoader(searchPath: .standard())
var rows: [Row] = []

for name in ["sqlite", "disk", "memory", "c-example"] {
    let engine = try loader.load(name)
    let open = { (directory: String) in try engine.open(directory: directory, store: "bench", options: [:]) }
    let close = { (store: any EngineStore) in store.close() }
    let apply = try measure(open, { store in try store.apply(items5000.map { .put($0) }, sequence: 1) }, finish: close)
    // Reading needs data that survives a reopen. An engine that keeps nothing (the memory engine: the broker holds
    // the items) has nothing to read.
    let read: Double? = engine.capabilities.contains(.persistent) ? try measure({ directory in
        let store = try open(directory)
        try store.apply(items10000.map { .put($0) }, sequence: 1)
        store.close()
        return try open(directory)
    }, { store in
        let all = try store.scanAll()
        precondition(all.count == 10000, "\(name) read \(all.count) of 10,000 items")
    }, finish: close) : nil
    let single = try measure(open, { store in
        for (index, item) in items5000.prefix(1000).enumerated() {
            try store.apply([.put(item)], sequence: UInt64(index + 1))
        }
    }, finish: close)
    rows.append(Row(engine: name, apply5000: apply, read10000: read, single1000: single))
}

// The same work straight on SQLite, in this process.
func sqliteDirect(_ path: String) -> OpaquePointer {
    var db: OpaquePointer?
    sqlite3_open(path + "/direct.sqlite3", &db)
    sqlite3_exec(
        db,
        """
        PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
        CREATE TABLE IF NOT EXISTS items (position INTEGER PRIMARY KEY, key BLOB NOT NULL UNIQUE,
            payload BLOB NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);
        """, nil, nil, nil)
    return db!
}

func insert(_ db: OpaquePointer, _ records: ArraySlice<EngineRecord>) {
    var statement: OpaquePointer?
    sqlite3_prepare_v2(
        db, "INSERT INTO items (key, payload, created_at, updated_at) VALUES (?1, ?2, ?3, ?4) "
            + "ON CONFLICT (key) DO UPDATE SET payload = excluded.payload", -1, &statement, nil)
    sqlite3_exec(db, "BEGIN IMMEDIATE", nil, nil, nil)
    for record in records {
        // Bound without copying (SQLITE_STATIC), as the engine does; the step runs while the bytes are pinned.
        record.key.withUnsafeBytes { key in
            record.payload.withUnsafeReadableBytes { payload in
                sqlite3_bind_blob(statement, 1, key.baseAddress, Int32(key.count), nil)
                sqlite3_bind_blob(statement, 2, payload.baseAddress, Int32(payload.count), nil)
                sqlite3_bind_int64(statement, 3, 1)
                sqlite3_bind_int64(statement, 4, 1)
                sqlite3_step(statement)
                sqlite3_reset(statement)
            }
        }
    }
    sqlite3_exec(db, "COMMIT", nil, nil, nil)
    sqlite3_finalize(statement)
}

let directApply = try measure(sqliteDirect, { db in insert(db, items5000[...]) }, finish: { sqlite3_close($0) })
let directRead = try measure({ directory in
    let db = sqliteDirect(directory)
    insert(db, items10000[...])
    return db
}, { db in
    var statement: OpaquePointer?
    sqlite3_prepare_v2(db, "SELECT key, payload, created_at, updated_at FROM items ORDER BY position", -1, &statement, nil)
    var records: [EngineRecord] = []
    while sqlite3_step(statement) == SQLITE_ROW {
        let key = Array(UnsafeRawBufferPointer(start: sqlite3_column_blob(statement, 0), count: Int(sqlite3_column_bytes(statement, 0))))
        var payload = ByteBuffer()
        payload.writeBytes(UnsafeRawBufferPointer(start: sqlite3_column_blob(statement, 1), count: Int(sqlite3_column_bytes(statement, 1))))
        records.append(EngineRecord(key: key, payload: payload, createdAt: UInt64(sqlite3_column_int64(statement, 2)), updatedAt: UInt64(sqlite3_column_int64(statement, 3))))
    }
    sqlite3_finalize(statement)
    precondition(records.count == 10000)
}, finish: { sqlite3_close($0) })
let directSingle = try measure(sqliteDirect, { db in
    for index in 0..<1000 { insert(db, items5000[index..<(index + 1)]) }
}, finish: { sqlite3_close($0) })
rows.append(Row(engine: "sqlite-direct", apply5000: directApply, read10000: directRead, single1000: directSingle))

func format(_ value: Double?) -> String { value.map { String(format: "%.4f s", $0) } ?? "—" }
print("| engine | apply 5,000 × 1 KB | read all 10,000 × 1 KB | 1,000 single-item applies |")
print("|---|---:|---:|---:|")
for row in rows {
    print("| \(row.engine) | \(format(row.apply5000)) | \(format(row.read10000)) | \(format(row.single1000)) |")
}
let sqlite = rows[0]
print("")
print("Median of \(runs) runs, in \(baseDirectory).")
print(String(format: "sqlite engine vs Bodega's SQLite engine reference on this kind of machine (0.07 s write 5,000; 0.055 s read 10,000): write %.2f×, read %.2f× of its time (goal: at most 0.5×)", sqlite.apply5000 / 0.07, sqlite.read10000! / 0.055))
print(String(format: "sqlite engine vs sqlite-direct: write %.2f×, read %.2f×, single applies %.2f×", sqlite.apply5000 / directApply, sqlite.read10000! / directRead, sqlite.single1000 / directSingle))
