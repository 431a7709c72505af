import CLibPQ
import CStorageEngine
import StorageEngineKit

#if canImport(Glibc)
import Glibc
#endif

/// One open store: a row of `stores` (its sequence and the next free position) and its rows of `items`.
final class PostgresStore: SharedEngineStoreImplementation {
    private let name: String
    private let shared: SharedSession
    private let registry: SessionRegistry
    private let failure: FailureInjection
    private let logCommits: UInt64
    private var closed = false

    /// Steps of one statement at most: a run of puts or removes longer than this is split, in one transaction.
    static let chunkSteps = 5_000
    /// Payload bytes of one statement at most (PostgreSQL refuses a value of 1 GiB or more).
    static let chunkBytes = 64 << 20

    init(name: String, shared: SharedSession, registry: SessionRegistry, logCommits: UInt64, failure: FailureInjection) {
        self.name = name
        self.logCommits = logCommits
        self.shared = shared
        self.registry = registry
        self.failure = failure
    }

    /// The store's sequence (0 for a store the database does not hold: its row is made by its first apply).
    func openSequence() throws(EngineError) -> UInt64 {
        try shared.use { (session, tables) throws(EngineError) in try position(session, tables).sequence }
    }

    func apply(_ steps: UnsafeBufferPointer<sb_step>, sequence: UInt64) throws(EngineError) {
        try check(steps)
        try shared.use { (session, tables) throws(EngineError) in
            let (writes, reserve) = statements(steps, tables)
            let advance = Statement(
                "SELECT \(tables.advance)($1, false, 0, 0, NULL, $2, $3)", [.text(name), .int8(sequence), .int8(reserve)])
            try committing(session, [advance] + writes, expect: { (session) throws(EngineError) in
                try self.position(session, tables).sequence == sequence
            })
        }
    }

    func apply(
        _ steps: UnsafeBufferPointer<sb_step>, at expected: sb_position, epoch: UInt64, commits: UnsafeBufferPointer<sb_commit>
    ) throws(EngineError) {
        try check(steps)
        guard let last = commits.last else { throw EngineError.invalid("apply_at without a commit") }
        guard expected.epoch == 0 || epoch == expected.epoch else {
            throw EngineError.invalid("apply_at with epoch \(epoch) at a position of epoch \(expected.epoch)")
        }
        try shared.use { (session, tables) throws(EngineError) in
            // The position is compared, and the row locked, by the first statement: on another position it
            // fails with SQLSTATE SB409 (conflict) and the rest of the pipeline is skipped.
            let (writes, reserve) = statements(steps, tables)
            var all = [
                Statement(
                    "SELECT \(tables.advance)($1, true, $2, $3, $4, $5, $6)",
                    [.text(name), .int8(expected.epoch), .int8(expected.sequence), .int8(epoch), .int8(last.sequence), .int8(reserve)])
            ]
            if expected.epoch == 0 {
                all.append(Statement("DELETE FROM \(tables.commits) WHERE store = $1", [.text(name)]))
            }
            all += writes
            var sequences = BinaryArray(of: OID.int8), records = BinaryArray(of: OID.bytea)
            for commit in commits {
                sequences.append(commit.sequence)
                records.append(commit.record)
            }
            all.append(
                Statement(
                    "INSERT INTO \(tables.commits) (store, epoch, sequence, record) SELECT $1, $2, s, r FROM unnest($3::int8[], $4::bytea[]) AS t (s, r)",
                    [.text(name), .int8(epoch), sequences.parameter, records.parameter]))
            if last.sequence > logCommits {
                // Only the commits this one pushes out of the window: a range from where the last trim ended,
                // so that no statement walks the index entries of rows deleted before (until a vacuum, a
                // `sequence <= N` scan visits every one: commits slowed down as the log turned over).
                all.append(
                    Statement(
                        "DELETE FROM \(tables.commits) WHERE store = $1 AND sequence > $2 AND sequence <= $3",
                        [.text(name), .int8(expected.sequence > logCommits ? expected.sequence - logCommits : 0),
                         .int8(last.sequence - logCommits)]))
            }
            all.append(
                Statement(
                    "SELECT pg_notify($1, $2)",
                    [.text(tables.channel), .text(Notice.payload(epoch: epoch, sequence: last.sequence, store: name))]))
            // Ours if the log holds our record at our last sequence (another broker's commit of that sequence
            // has another record; one with the same bytes made the same change).
            try committing(session, all, expect: { (session) throws(EngineError) in
                let row = try session.run(
                    "SELECT record FROM \(tables.commits) WHERE store = $1 AND epoch = $2 AND sequence = $3",
                    [.text(name), .int8(epoch), .int8(last.sequence)])
                guard row.rows == 1 else { return false }
                let stored = row.bytes(0, 0)
                return stored.length == last.record.length
                    && (stored.length == 0 || memcmp(stored.data!, last.record.data!, stored.length) == 0)
            })
        }
    }

    /// Commits read by the one statement a catch-up usually needs; more are read through a cursor.
    static let quickCommits = 64

    func commits(epoch: UInt64, after: UInt64, emit: (UnsafePointer<sb_commit>) -> Bool) throws(EngineError) -> sb_position {
        try shared.use { (session, tables) throws(EngineError) in
            // One statement, so one snapshot and one round trip: the position and the first commits after `after`.
            let rows = try session.run(
                """
                SELECT s.epoch, s.sequence, c.sequence, c.record FROM \(tables.stores) s
                LEFT JOIN LATERAL (
                    SELECT sequence, record FROM \(tables.commits)
                    WHERE store = s.name AND epoch = $2 AND s.epoch = $2 AND sequence > $3 AND sequence <= s.sequence
                    ORDER BY sequence LIMIT \(Self.quickCommits)
                ) c ON true
                WHERE s.name = $1 ORDER BY c.sequence
                """, [.text(name), .int8(epoch), .int8(after)])
            guard rows.rows > 0 else { return sb_position(epoch: 0, sequence: 0) }
            let position = sb_position(epoch: rows.uint64(0, 0), sequence: rows.uint64(0, 1))
            guard position.epoch == epoch, position.sequence > after else { return position }
            var next = after + 1
            for row in 0..<rows.rows where !rows.isNull(row, 2) {
                guard rows.uint64(row, 2) == next else { break }
                var commit = sb_commit(sequence: next, record: rows.bytes(row, 3))
                guard emit(&commit) else { throw EngineError.stopped }
                next += 1
            }
            if next == position.sequence + 1 { return position }
            guard next - after - 1 == UInt64(Self.quickCommits) else { throw gone(next) }
            // More than one statement's worth: the rest through a cursor (a later snapshot; logged commits never
            // change, so the two reads join up).
            return try commitsThroughCursor(session, tables, epoch: epoch, after: next - 1, emit: emit)
        }
    }

    private func commitsThroughCursor(
        _ session: Session, _ tables: Tables, epoch: UInt64, after: UInt64, emit: (UnsafePointer<sb_commit>) -> Bool
    ) throws(EngineError) -> sb_position {
        try session.transaction(Self.snapshot) { () throws(EngineError) in
            let position = try self.position(session, tables)
            guard position.epoch == epoch, position.sequence > after else { return position }
            var next = after + 1
            var stopped = false
            try session.eachRow(
                "SELECT sequence, record FROM \(tables.commits) WHERE store = $1 AND epoch = $2 AND sequence > $3 AND sequence <= $4 ORDER BY sequence",
                [.text(name), .int8(epoch), .int8(after), .int8(position.sequence)]
            ) { rows, row in
                guard rows.uint64(row, 0) == next else { return false }
                var commit = sb_commit(sequence: next, record: rows.bytes(row, 1))
                stopped = !emit(&commit)
                next += 1
                return !stopped
            }
            if stopped { throw EngineError.stopped }
            guard next == position.sequence + 1 else { throw gone(next) }
            return position
        }
    }

    private func gone(_ missing: UInt64) -> EngineError {
        EngineError(
            Int32(SB_ERR_GONE), "store \(name)'s commit log no longer holds commit \(missing) (it keeps the last \(logCommits))")
    }

    /// Refuses, before anything is sent, what an apply may not hold: a refused apply leaves nothing behind.
    private func check(_ steps: UnsafeBufferPointer<sb_step>) throws(EngineError) {
        for (index, step) in steps.enumerated() {
            try failure.check(stepIndex: index)
            try step.checkKey()
            guard (1...3).contains(Int(step.kind)) else { throw EngineError.invalid("unknown step kind \(step.kind)") }
        }
    }

    /// Runs a commit's statements in one transaction, sent as one pipeline (one round trip to the server and
    /// back, the COMMIT's wait for the disk included). A COMMIT whose answer was lost with the connection may
    /// have committed: what it wrote says which, read on a new connection (`committed`). One that did not
    /// commit, on a connection found cut (a server restart), is sent once more on a new one.
    private func committing(
        _ session: Session, _ statements: [Statement], expect committed: (Session) throws(EngineError) -> Bool
    ) throws(EngineError) {
        for attempt in 0..<2 {
            do throws(EngineError) {
                return try session.pipeline([Statement("BEGIN")] + statements + [Statement("COMMIT")])
            } catch {
                session.rollBack()
                guard !session.isConnected, (try? session.ensureConnected()) != nil else { throw error }
                if (try? committed(session)) == true { return }
                if attempt == 1 { throw error }
            }
        }
    }

    /// The statements that write `steps`, run by run (puts, removes, a removeAll), and how many positions the
    /// puts may take: `advance` reserves them, and each run of puts takes its part of them.
    private func statements(_ steps: UnsafeBufferPointer<sb_step>, _ tables: Tables) -> ([Statement], UInt64) {
        var statements: [Statement] = []
        var reserved: UInt64 = 0
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
            case SB_STEP_PUT:
                let (statement, keys) = put(run, offset: reserved, tables)
                statements.append(statement)
                reserved += keys
            case SB_STEP_REMOVE:
                var keys = BinaryArray(of: OID.bytea)
                for step in run { keys.append(step.key) }
                statements.append(
                    Statement("DELETE FROM \(tables.items) WHERE store = $1 AND key = ANY ($2::bytea[])", [.text(name), keys.parameter]))
            default:
                statements.append(Statement("DELETE FROM \(tables.items) WHERE store = $1", [.text(name)]))
            }
            start = end
        }
        // The reservation is the statements' last parameter where they need it: known only now.
        return (statements.map { $0.reserving(reserved) }, reserved)
    }

    /// A run of puts as one statement: each key once, at the place of its first put, with its last put's bytes
    /// (a statement may not touch a row twice). New keys take the positions `offset` on in the apply's
    /// reservation (`advance` moved `next_position` past it, so the reservation starts at `next_position` minus
    /// its size); existing keys keep theirs. Returns the statement and how many positions it may take.
    private func put(_ run: UnsafeBufferPointer<sb_step>, offset: UInt64, _ tables: Tables) -> (Statement, UInt64) {
        // Each key's last put, in the order of the keys' first puts; keys hashed where they lie (no copy).
        var order: [Int] = []
        var place: [BorrowedKey: Int] = [:]
        place.reserveCapacity(run.count)
        for (index, step) in run.enumerated() {
            let key = BorrowedKey(step.key)
            if let at = place[key] {
                order[at] = index
            } else {
                place[key] = order.count
                order.append(index)
            }
        }
        var keys = BinaryArray(of: OID.bytea), payloads = BinaryArray(of: OID.bytea)
        var created = BinaryArray(of: OID.int8), updated = BinaryArray(of: OID.int8)
        for index in order {
            let step = run[index]
            keys.append(step.key)
            payloads.append(step.payload)
            created.append(step.created_at)
            updated.append(step.updated_at)
        }
        let statement = Statement(
            """
            INSERT INTO \(tables.items) (store, key, payload, created_at, updated_at, position)
            SELECT $1, k, p, c, u, (SELECT next_position FROM \(tables.stores) WHERE name = $1) - $7 + $6 + o - 1
            FROM unnest($2::bytea[], $3::bytea[], $4::int8[], $5::int8[]) WITH ORDINALITY AS t (k, p, c, u, o)
            ON CONFLICT (store, key) DO UPDATE
                SET payload = excluded.payload, created_at = excluded.created_at, updated_at = excluded.updated_at
            """,
            [.text(name), keys.parameter, payloads.parameter, created.parameter, updated.parameter, .int8(offset)],
            needsReservation: true)
        return (statement, UInt64(order.count))
    }

    /// Every item in order, read through a cursor in one snapshot, a thousand rows per round trip.
    func scan(emit: (UnsafePointer<sb_item>) -> Bool) throws(EngineError) {
        _ = try load(emit: emit)
    }

    func load(emit: (UnsafePointer<sb_item>) -> Bool) throws(EngineError) -> sb_position {
        try shared.use { (session, tables) throws(EngineError) in
            try session.transaction(Self.snapshot) { () throws(EngineError) in
                let position = try self.position(session, tables)
                var stopped = false
                try session.eachRow(
                    "SELECT key, payload, created_at, updated_at FROM \(tables.items) WHERE store = $1 ORDER BY position",
                    [.text(name)]
                ) { rows, row in
                    var item = sb_item(
                        key: rows.bytes(row, 0), payload: rows.bytes(row, 1), created_at: rows.uint64(row, 2),
                        updated_at: rows.uint64(row, 3))
                    stopped = !emit(&item)
                    return !stopped
                }
                if stopped { throw EngineError.stopped }
                return position
            }
        }
    }

    /// A read-only transaction that sees one snapshot throughout.
    static let snapshot = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

    private func position(_ session: Session, _ tables: Tables) throws(EngineError) -> sb_position {
        let row = try session.run("SELECT epoch, sequence FROM \(tables.stores) WHERE name = $1", [.text(name)])
        return row.rows == 1 ? sb_position(epoch: row.uint64(0, 0), sequence: row.uint64(0, 1)) : sb_position(epoch: 0, sequence: 0)
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

/// A step's key where the host keeps it (valid for the whole apply), hashed and compared as bytes in place.
private struct BorrowedKey: Hashable {
    let bytes: UnsafeRawBufferPointer

    init(_ key: sb_bytes) { bytes = UnsafeRawBufferPointer(start: key.data, count: key.length) }

    func hash(into hasher: inout Hasher) { hasher.combine(bytes: bytes) }

    static func == (lhs: BorrowedKey, rhs: BorrowedKey) -> Bool {
        lhs.bytes.count == rhs.bytes.count
            && (lhs.bytes.isEmpty || memcmp(lhs.bytes.baseAddress!, rhs.bytes.baseAddress!, lhs.bytes.count) == 0)
    }
}
