import CLibPQ
import CStorageEngine
import StorageEngineKit

/// One open store: a row of `stores` (its sequence and the next free position) and its rows of `items`.
final class PostgresStore: EngineStoreImplementation {
    private let name: String
    private let shared: SharedSession
    private let registry: SessionRegistry
    private let failure: FailureInjection
    private var closed = false

    /// Steps of one statement at most: a run of puts or removes longer than this is split, in one transaction.
    static let chunkSteps = 5_000
    /// Payload bytes of one statement at most (PostgreSQL refuses a value of 1 GiB or more).
    static let chunkBytes = 64 << 20

    init(name: String, shared: SharedSession, registry: SessionRegistry, failure: FailureInjection) {
        self.name = name
        self.shared = shared
        self.registry = registry
        self.failure = failure
    }

    /// Creates the store's row if it is new; its sequence.
    func openSequence() throws(EngineError) -> UInt64 {
        try shared.use { (session, tables) throws(EngineError) in
            try session.run("INSERT INTO \(tables.stores) (name) VALUES ($1) ON CONFLICT (name) DO NOTHING", [.text(name)])
            let row = try session.run("SELECT sequence FROM \(tables.stores) WHERE name = $1", [.text(name)])
            return row.rows == 1 ? row.uint64(0, 0) : 0
        }
    }

    func apply(_ steps: UnsafeBufferPointer<sb_step>, sequence: UInt64) throws(EngineError) {
        // Checked before anything is sent: a refused apply leaves nothing behind.
        for (index, step) in steps.enumerated() {
            try failure.check(stepIndex: index)
            try step.checkKey()
            guard (1...3).contains(Int(step.kind)) else { throw EngineError.invalid("unknown step kind \(step.kind)") }
        }
        try shared.use { (session, tables) throws(EngineError) in
            do throws(EngineError) {
                try session.transaction { () throws(EngineError) in
                    var next = try lockRow(session, tables)
                    var start = 0
                    while start < steps.count {
                        let kind = Int(steps[start].kind)
                        var end = start + 1
                        var bytes = steps[start].payload.length
                        while end < steps.count, Int(steps[end].kind) == kind, kind != SB_STEP_REMOVE_ALL,
                            end - start < Self.chunkSteps, bytes + steps[end].payload.length <= Self.chunkBytes
                        {
                            bytes += steps[end].payload.length
                            end += 1
                        }
                        let run = UnsafeBufferPointer(rebasing: steps[start..<end])
                        switch kind {
                        case SB_STEP_PUT: next = try put(run, from: next, session, tables)
                        case SB_STEP_REMOVE: try remove(run, session, tables)
                        default: try session.run("DELETE FROM \(tables.items) WHERE store = $1", [.text(name)])
                        }
                        start = end
                    }
                    try session.run(
                        "UPDATE \(tables.stores) SET sequence = $2, next_position = $3 WHERE name = $1",
                        [.text(name), .int8(sequence), .int8(next)])
                }
            } catch {
                // A COMMIT whose answer was lost with the connection may have committed: the recorded sequence
                // says which (it is written in the same transaction), read on a new connection.
                guard !session.isConnected, (try? recordedSequence(session, tables)) == sequence
                else { throw error }
            }
        }
    }

    /// Locks the store's row for the transaction (creating it if the store was dropped meanwhile); the next
    /// free position.
    private func lockRow(_ session: Session, _ tables: Tables) throws(EngineError) -> UInt64 {
        let row = try session.run("SELECT next_position FROM \(tables.stores) WHERE name = $1 FOR UPDATE", [.text(name)])
        if row.rows == 1 { return row.uint64(0, 0) }
        try session.run("INSERT INTO \(tables.stores) (name) VALUES ($1)", [.text(name)])
        return 1
    }

    private func recordedSequence(_ session: Session, _ tables: Tables) throws(EngineError) -> UInt64? {
        try session.ensureConnected()
        let row = try session.run("SELECT sequence FROM \(tables.stores) WHERE name = $1", [.text(name)])
        return row.rows == 1 ? row.uint64(0, 0) : nil
    }

    /// A run of puts as one statement: each key once, at the place of its first put, with its last put's bytes
    /// (a statement may not touch a row twice). New keys take positions from `next`; existing keys keep theirs.
    private func put(
        _ run: UnsafeBufferPointer<sb_step>, from next: UInt64, _ session: Session, _ tables: Tables
    ) throws(EngineError) -> UInt64 {
        var order: [Int] = []
        var last: [[UInt8]: Int] = [:]
        for (index, step) in run.enumerated() {
            let key = step.key.bytes
            if last.updateValue(index, forKey: key) == nil { order.append(index) }
        }
        var keys = BinaryArray(of: OID.bytea), payloads = BinaryArray(of: OID.bytea)
        var created = BinaryArray(of: OID.int8), updated = BinaryArray(of: OID.int8)
        for first in order {
            let step = run[last[run[first].key.bytes]!]
            keys.append(step.key)
            payloads.append(step.payload)
            created.append(step.created_at)
            updated.append(step.updated_at)
        }
        try session.run(
            """
            INSERT INTO \(tables.items) (store, key, payload, created_at, updated_at, position)
            SELECT $1, k, p, c, u, $6 + o - 1
            FROM unnest($2::bytea[], $3::bytea[], $4::int8[], $5::int8[]) WITH ORDINALITY AS t (k, p, c, u, o)
            ON CONFLICT (store, key) DO UPDATE
                SET payload = excluded.payload, created_at = excluded.created_at, updated_at = excluded.updated_at
            """,
            [.text(name), keys.parameter, payloads.parameter, created.parameter, updated.parameter, .int8(next)])
        return next + UInt64(order.count)
    }

    private func remove(_ run: UnsafeBufferPointer<sb_step>, _ session: Session, _ tables: Tables) throws(EngineError) {
        var keys = BinaryArray(of: OID.bytea)
        for step in run { keys.append(step.key) }
        try session.run("DELETE FROM \(tables.items) WHERE store = $1 AND key = ANY ($2::bytea[])", [.text(name), keys.parameter])
    }

    /// Every item in order, read through a cursor in one snapshot, a thousand rows per round trip.
    func scan(emit: (UnsafePointer<sb_item>) -> Bool) throws(EngineError) {
        try shared.use { (session, tables) throws(EngineError) in
            try session.transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") { () throws(EngineError) in
                try session.run(
                    """
                    DECLARE sb_scan BINARY NO SCROLL CURSOR FOR
                    SELECT key, payload, created_at, updated_at FROM \(tables.items) WHERE store = $1 ORDER BY position
                    """, [.text(name)])
                while true {
                    let batch = try session.execute("FETCH FORWARD 1000 FROM sb_scan")
                    if batch.rows == 0 { break }
                    for row in 0..<batch.rows {
                        var item = sb_item(
                            key: batch.bytes(row, 0), payload: batch.bytes(row, 1), created_at: batch.uint64(row, 2),
                            updated_at: batch.uint64(row, 3))
                        guard emit(&item) else { throw EngineError.stopped }
                    }
                }
                try session.execute("CLOSE sb_scan")
            }
        }
    }

    func count() throws(EngineError) -> UInt64 {
        try shared.use { (session, tables) throws(EngineError) in
            try session.run("SELECT count(*) FROM \(tables.items) WHERE store = $1", [.text(name)]).uint64(0, 0)
        }
    }

    func close() {
        guard !closed else { return }
        closed = true
        registry.release(shared)
    }
}
