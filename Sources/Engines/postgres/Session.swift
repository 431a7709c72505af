import CLibPQ
import CStorageEngine
import StorageEngineKit

#if canImport(Glibc)
import Glibc
#endif

// One libpq connection and what the engine asks of it: statements with binary parameters and binary results,
// prepared once per connection, transactions that roll back on any failure, and libpq's failures as the ABI's
// codes. Never logs or reports the connection string: it may carry a password.

/// PostgreSQL type OIDs the engine binds (pg_type.h).
enum OID {
    static let bytea: Oid = 17
    static let int8: Oid = 20
    static let text: Oid = 25
    static let byteaArray: Oid = 1001
    static let int8Array: Oid = 1016
}

/// A parameter in PostgreSQL's binary format.
struct Parameter {
    var type: Oid
    var bytes: [UInt8]

    static func text(_ value: String) -> Parameter { Parameter(type: OID.text, bytes: Array(value.utf8)) }
    static func int8(_ value: Int64) -> Parameter { Parameter(type: OID.int8, bytes: BinaryArray.bigEndian(value)) }
    static func int8(_ value: UInt64) -> Parameter { int8(Int64(bitPattern: value)) }
}

/// A one-dimensional array in PostgreSQL's binary format (array_send): dimensions, then each element's length
/// and bytes. Elements are never NULL.
struct BinaryArray {
    private(set) var bytes: [UInt8] = []
    private(set) var count = 0
    private let elementType: Oid

    init(of elementType: Oid, reservingCapacity capacity: Int = 0) {
        self.elementType = elementType
        bytes.reserveCapacity(20 + capacity)
    }

    mutating func append(_ element: sb_bytes) {
        appendInt32(Int32(element.length))
        if let data = element.data, element.length > 0 {
            bytes.append(contentsOf: UnsafeBufferPointer(start: data, count: element.length))
        }
        count += 1
    }

    mutating func append(_ value: UInt64) {
        appendInt32(8)
        bytes.append(contentsOf: Self.bigEndian(Int64(bitPattern: value)))
        count += 1
    }

    /// The parameter: header (1 dimension, no NULLs, the element type, the length, lower bound 1) and elements.
    var parameter: Parameter {
        var header: [UInt8] = []
        header.reserveCapacity(20 + bytes.count)
        for field in [Int32(1), 0, Int32(bitPattern: elementType), Int32(count), 1] {
            header.append(contentsOf: Self.bigEndian(field))
        }
        header.append(contentsOf: bytes)
        return Parameter(type: elementType == OID.bytea ? OID.byteaArray : OID.int8Array, bytes: header)
    }

    private mutating func appendInt32(_ value: Int32) { bytes.append(contentsOf: Self.bigEndian(value)) }

    static func bigEndian<T: FixedWidthInteger>(_ value: T) -> [UInt8] {
        withUnsafeBytes(of: value.bigEndian) { Array($0) }
    }
}

/// One statement of a pipeline, with its parameters.
struct Statement {
    var sql: String
    var parameters: [Parameter]
    /// The statement's last parameter is the apply's reservation of positions, known once every statement is
    /// built (`reserving`).
    var needsReservation = false

    init(_ sql: String, _ parameters: [Parameter] = [], needsReservation: Bool = false) {
        self.sql = sql
        self.parameters = parameters
        self.needsReservation = needsReservation
    }

    func reserving(_ count: UInt64) -> Statement {
        guard needsReservation else { return self }
        return Statement(sql, parameters + [.int8(count)])
    }
}

/// A result, cleared when released.
final class QueryResult {
    let handle: OpaquePointer

    init(_ handle: OpaquePointer) { self.handle = handle }
    deinit { PQclear(handle) }

    var rows: Int { Int(PQntuples(handle)) }

    func bytes(_ row: Int, _ column: Int) -> sb_bytes {
        let length = Int(PQgetlength(handle, Int32(row), Int32(column)))
        let data = PQgetvalue(handle, Int32(row), Int32(column)).map { UnsafeRawPointer($0).assumingMemoryBound(to: UInt8.self) }
        return sb_bytes(data: length > 0 ? data : nil, length: length)
    }

    func isNull(_ row: Int, _ column: Int) -> Bool { PQgetisnull(handle, Int32(row), Int32(column)) == 1 }

    /// A binary int8 column.
    func uint64(_ row: Int, _ column: Int) -> UInt64 {
        let value = bytes(row, column)
        guard value.length == 8, let data = value.data else { return 0 }
        var result: UInt64 = 0
        for index in 0..<8 { result = result << 8 | UInt64(data[index]) }
        return result
    }
}

/// One connection to the server. Not thread-safe: `SharedSession` serializes its users.
final class Session {
    private var connection: OpaquePointer
    /// SQL text -> the name of its prepared statement on this connection (forgotten when the connection is reset).
    private var prepared: [String: String] = [:]

    init(conninfo: String) throws(EngineError) {
        guard let connection = PQconnectdb(conninfo) else { throw EngineError.io("libpq could not allocate a connection") }
        guard PQstatus(connection) == CONNECTION_OK else {
            let message = Self.message(connection)
            PQfinish(connection)
            throw EngineError.io("cannot connect to PostgreSQL: \(message)")
        }
        // Notices ("relation already exists, skipping") are not failures: libpq would print them on stderr.
        PQsetNoticeProcessor(connection, { _, _ in }, nil)
        self.connection = connection
    }

    deinit { PQfinish(connection) }

    /// Reconnects when the connection was lost (a server restart): the call that finds it lost fails, the next
    /// one goes on with a new connection.
    func ensureConnected() throws(EngineError) {
        guard PQstatus(connection) != CONNECTION_OK else { return }
        prepared = [:]
        PQreset(connection)
        guard PQstatus(connection) == CONNECTION_OK else {
            throw EngineError.io("cannot reach PostgreSQL: \(Self.message(connection))")
        }
    }

    /// The connection's socket (to poll for notices), -1 without a connection.
    var descriptor: Int32 { PQsocket(connection) }

    /// Reads what the server sent without blocking; the payloads of the notices among it, in order.
    func notices() throws(EngineError) -> [String] {
        guard PQconsumeInput(connection) == 1 else {
            throw EngineError.io("lost the connection to PostgreSQL: \(Self.message(connection))")
        }
        var payloads: [String] = []
        while let notice = PQnotifies(connection) {
            payloads.append(String(cString: notice.pointee.extra))
            PQfreemem(notice)
        }
        return payloads
    }

    var isConnected: Bool { PQstatus(connection) == CONNECTION_OK }

    var isIdle: Bool { PQtransactionStatus(connection) == PQTRANS_IDLE }

    /// Runs SQL with no parameters, through the simple protocol (several statements allowed).
    @discardableResult
    func execute(_ sql: String) throws(EngineError) -> QueryResult {
        try check(PQexec(connection, sql), sql)!
    }

    /// The name of `sql`'s prepared statement on this connection, prepared now if it is new.
    private func prepare(_ sql: String, _ parameters: [Parameter]) throws(EngineError) -> String {
        if let known = prepared[sql] { return known }
        let name = "sb\(prepared.count)"
        let types = parameters.map(\.type)
        _ = try check(PQprepare(connection, name, sql, Int32(types.count), types), sql)!
        prepared[sql] = name
        return name
    }

    /// Runs one statement, prepared on first use, with binary parameters and binary results.
    @discardableResult
    func run(_ sql: String, _ parameters: [Parameter] = []) throws(EngineError) -> QueryResult {
        let name = try prepare(sql, parameters)
        let result = Self.withValues(parameters) { values, lengths, formats in
            PQexecPrepared(connection, name, Int32(parameters.count), values, lengths, formats, 1)
        }
        return try check(result, sql)!
    }

    /// Queues a prepared statement in the pipeline; false when it could not be sent.
    private func queue(_ name: String, _ parameters: [Parameter]) -> Bool {
        Self.withValues(parameters) { values, lengths, formats in
            PQsendQueryPrepared(connection, name, Int32(parameters.count), values, lengths, formats, 1) == 1
        }
    }

    /// The parameters as libpq takes them (binary): values, lengths and formats, valid during `body`. One buffer
    /// holds every value, so that all pointers are valid at once; never empty, so that an empty value is an
    /// empty string, not a NULL pointer (which libpq sends as NULL).
    private static func withValues<T>(
        _ parameters: [Parameter], _ body: ([UnsafePointer<CChar>?], [Int32], [Int32]) -> T
    ) -> T {
        var offsets: [Int] = []
        var all: [UInt8] = []
        all.reserveCapacity(parameters.reduce(1) { $0 + $1.bytes.count })
        for parameter in parameters {
            offsets.append(all.count)
            all.append(contentsOf: parameter.bytes)
        }
        all.append(0)
        let lengths = parameters.map { Int32($0.bytes.count) }
        let formats = [Int32](repeating: 1, count: parameters.count)
        return all.withUnsafeBufferPointer { buffer in
            let base = UnsafeRawPointer(buffer.baseAddress!).assumingMemoryBound(to: CChar.self)
            return body(offsets.map { base + $0 }, lengths, formats)
        }
    }

    /// Runs `statements` as one pipeline: all sent, then one Sync, then every result read; a single round trip
    /// however many there are. The first failure the server answers is thrown; it skips every statement after it
    /// (so a transaction the statements began is left aborted: the caller rolls back). A lost connection is
    /// thrown as such, and leaves `commitInDoubt` set when it was lost after a COMMIT was sent and nothing before
    /// it had failed.
    func pipeline(_ statements: [Statement]) throws(EngineError) {
        commitInDoubt = false
        var names: [String] = []
        names.reserveCapacity(statements.count)
        for statement in statements { names.append(try prepare(statement.sql, statement.parameters)) }
        guard PQenterPipelineMode(connection) == 1 else {
            throw EngineError.io("PostgreSQL: cannot enter pipeline mode: \(Self.message(connection))")
        }
        defer {
            if PQexitPipelineMode(connection) != 1 {
                // Results left (a lost connection mid-read): drop them.
                while let left = PQgetResult(connection) { PQclear(left) }
                _ = PQexitPipelineMode(connection)
            }
        }
        var sent = statements.indices.allSatisfy { queue(names[$0], statements[$0].parameters) }
        sent = sent && PQpipelineSync(connection) == 1
        var refused: EngineError?
        if sent {
            // Each statement's results, then NULL; after a refusal, ABORTED for each; then the Sync's result.
            var synced = false
            for statement in statements where !synced && isConnected {
                while let result = PQgetResult(connection) {
                    let wrapped = QueryResult(result)
                    switch PQresultStatus(result) {
                    case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_EMPTY_QUERY, PGRES_PIPELINE_ABORTED: continue
                    case PGRES_PIPELINE_SYNC: synced = true
                    default:
                        // Answered by the server (a lost connection ends the reading below).
                        guard refused == nil, isConnected else { continue }
                        do throws(EngineError) {
                            _ = try check(wrapped.handle, statement.sql, keep: true)
                        } catch {
                            refused = error
                        }
                    }
                }
            }
            while !synced, isConnected, let result = PQgetResult(connection) {
                synced = PQresultStatus(result) == PGRES_PIPELINE_SYNC
                PQclear(result)
            }
        }
        guard isConnected else {
            commitInDoubt = sent && refused == nil && statements.last?.sql == "COMMIT"
            throw EngineError.io("lost the connection to PostgreSQL: \(Self.message(connection))")
        }
        if let refused { throw refused }
    }

    /// Hands `row` every row of a query, read through a cursor (`batch` rows per round trip), inside the current
    /// transaction; `row` returns false to stop.
    func eachRow(
        _ sql: String, _ parameters: [Parameter], batch: Int = 1000, _ row: (QueryResult, Int) throws(EngineError) -> Bool
    ) throws(EngineError) {
        try run("DECLARE sb_rows BINARY NO SCROLL CURSOR FOR " + sql, parameters)
        reading: while true {
            let rows = try execute("FETCH FORWARD \(batch) FROM sb_rows")
            if rows.rows == 0 { break }
            for index in 0..<rows.rows where try !row(rows, index) { break reading }
        }
        try execute("CLOSE sb_rows")
    }

    /// Runs `body` in a transaction: committed when it returns, rolled back when it throws.
    func transaction<T>(_ begin: String = "BEGIN", _ body: () throws(EngineError) -> T) throws(EngineError) -> T {
        commitInDoubt = false
        try execute(begin)
        do {
            let value = try body()
            commitInDoubt = true
            try execute("COMMIT")
            commitInDoubt = false
            return value
        } catch {
            rollBack()
            throw error
        }
    }

    /// The last transaction failed at its COMMIT: it may have committed (the answer can be lost with the
    /// connection). A failure before the COMMIT never committed.
    private(set) var commitInDoubt = false

    /// Leaves a failed or open transaction (nothing to do on a lost connection: the server rolled it back).
    func rollBack() {
        guard PQstatus(connection) == CONNECTION_OK, !isIdle else { return }
        if let result = PQexec(connection, "ROLLBACK") { PQclear(result) }
    }

    /// The result if it succeeded; else the failure, as an ABI code and a message. `keep`: the caller owns (and
    /// clears) the result.
    private func check(_ result: OpaquePointer?, _ sql: String, keep: Bool = false) throws(EngineError) -> QueryResult? {
        guard let result else { throw EngineError.io("PostgreSQL: \(Self.message(connection))") }
        let wrapped: QueryResult? = keep ? nil : QueryResult(result)
        switch PQresultStatus(result) {
        case PGRES_COMMAND_OK, PGRES_TUPLES_OK, PGRES_EMPTY_QUERY: return wrapped
        default: break
        }
        withExtendedLifetime(wrapped) {}
        let state = PQresultErrorField(result, clibpq_diag_sqlstate()).map { String(cString: $0) } ?? ""
        let primary = PQresultErrorField(result, clibpq_diag_message_primary()).map { String(cString: $0) }
        let message = primary ?? Self.message(connection)
        if PQstatus(connection) != CONNECTION_OK {
            throw EngineError.io("lost the connection to PostgreSQL: \(message)")
        }
        throw EngineError(Self.code(sqlState: state), "PostgreSQL \(state.isEmpty ? "" : "[\(state)] ")\(message)")
    }

    /// The ABI code for an SQLSTATE: disk full (53100) is `full`, data or index corruption (XX001, XX002)
    /// `corrupt`, an invalid name or value (class 22, 42) `invalid`, everything else (connections, conflicts,
    /// resources) `io`.
    static func code(sqlState state: String) -> Int32 {
        switch state {
        case "SB409": Int32(SB_ERR_CONFLICT)  // the engine's own: `advance` found another position
        case "53100": Int32(SB_ERR_FULL)
        case "XX001", "XX002": Int32(SB_ERR_CORRUPT)
        case _ where state.hasPrefix("22"): Int32(SB_ERR_INVALID)
        default: Int32(SB_ERR_IO)
        }
    }

    /// libpq's last message for the connection, on one line.
    static func message(_ connection: OpaquePointer) -> String {
        guard let text = PQerrorMessage(connection) else { return "unknown error" }
        let message = String(cString: text).split(whereSeparator: \.isNewline).joined(separator: " ")
        return message.isEmpty ? "unknown error" : message
    }
}
