import NIOCore
import StoreModel

// The storage engine interface as the broker sees it. BrokerCore declares it and never loads anything;
// EngineLoader implements it over engines loaded with dlopen (docs/ENGINE-ABI.md), and tests may implement it
// directly.

/// An item as an engine stores it. Keys are raw bytes (the UTF-8 of an item id, for the broker).
public struct EngineRecord: Hashable, Sendable {
    /// The key's bytes then the payload's: the item the broker keeps (`KeptItem`), so that a record the broker
    /// plans shares that storage (no copy, one reference) and the engine loader hands the engine pointers into
    /// it.
    private let item: KeptItem
    /// Milliseconds since the Unix epoch.
    public var createdAt: UInt64
    public var updatedAt: UInt64

    public init(key: [UInt8], payload: ByteBuffer, createdAt: UInt64, updatedAt: UInt64) {
        let item = key.withUnsafeBytes { key in payload.withUnsafeReadableBytes { KeptItem.make(id: key, payload: $0) } }
        self.init(kept: item, createdAt: createdAt, updatedAt: updatedAt)
    }

    /// A record over a kept item: its id is the key.
    init(kept item: KeptItem, createdAt: UInt64, updatedAt: UInt64) {
        self.item = item
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }

    /// The payload's bytes (a copy).
    public var payload: ByteBuffer { item.withPayload { ByteBuffer(bytes: $0) } }

    /// The key's bytes, copied.
    public var key: [UInt8] { item.withID { Array($0) } }

    /// The key's and the payload's bytes in place, valid while the record lives unchanged (the engine loader
    /// hands them to the engine for one call).
    public func withKeyAndPayload<T>(_ body: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> T) rethrows -> T {
        try item.withIDAndPayload(body)
    }

    public static func == (lhs: EngineRecord, rhs: EngineRecord) -> Bool {
        lhs.createdAt == rhs.createdAt && lhs.updatedAt == rhs.updatedAt
            && lhs.withKeyAndPayload { lk, lp in rhs.withKeyAndPayload { rk, rp in lk.elementsEqual(rk) && lp.elementsEqual(rp) } }
    }

    public func hash(into hasher: inout Hasher) {
        withKeyAndPayload { key, payload in
            hasher.combine(key.count)
            hasher.combine(bytes: key)
            hasher.combine(bytes: payload)
        }
        hasher.combine(createdAt)
        hasher.combine(updatedAt)
    }
}

/// One step of an engine transaction.
public enum EngineStep: Hashable, Sendable {
    /// Insert or replace; a replaced item keeps its position. The host passes the original `createdAt` when it
    /// replaces.
    case put(EngineRecord)
    /// Remove a key; an absent key is not an error.
    case remove(key: [UInt8])
    /// Remove every item.
    case removeAll
}

/// A failure reported by an engine or by loading one.
public struct EngineFailure: LayerError, Sendable {
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public var rawValue: Int32
        public init(rawValue: Int32) { self.rawValue = rawValue }

        // The engine ABI's SB_ERR_* values.
        public static let io = Code(rawValue: 1)
        public static let corrupt = Code(rawValue: 2)
        public static let full = Code(rawValue: 3)
        public static let invalid = Code(rawValue: 4)
        public static let unsupported = Code(rawValue: 5)
        public static let stopped = Code(rawValue: 6)
        public static let internalError = Code(rawValue: 7)
        public static let injected = Code(rawValue: 8)
        /// ABI 2.1: the stored position is not the expected one (another broker committed).
        public static let conflict = Code(rawValue: 9)
        /// ABI 2.1: the commit log no longer reaches back that far.
        public static let gone = Code(rawValue: 10)

        /// What it is called in messages and in the `code` field of the engine checker (`engine-N` when unknown).
        private static let names: [Code: (name: String, text: String)] = [
            .io: ("io", "I/O error"), .corrupt: ("corrupt", "corrupt data"), .full: ("full", "storage full"),
            .invalid: ("invalid", "invalid argument"), .unsupported: ("unsupported", "unsupported"),
            .stopped: ("stopped", "stopped"), .internalError: ("internal", "internal error"),
            .injected: ("injected", "injected failure"), .conflict: ("conflict", "conflict"),
            .gone: ("gone", "commit log gone"),
        ]

        public var description: String { Self.names[self]?.text ?? "engine error \(rawValue)" }
        var name: String { Self.names[self]?.name ?? "engine-\(rawValue)" }
    }

    public var code: Code
    public var message: String
    /// The engine's name, when known.
    public var engine: String?
    public var underlying: (any Error)?
    public var location: SourceLocation

    public init(
        _ code: Code, _ message: String, engine: String? = nil, underlying: (any Error)? = nil,
        fileID: StaticString = #fileID, line: UInt = #line
    ) {
        self.code = code
        self.message = message
        self.engine = engine
        self.underlying = underlying
        self.location = SourceLocation(fileID: fileID, line: line)
    }

    /// `io`, `corrupt`, `full`, `invalid`, `unsupported`, `stopped`, `internal`, `injected`, `conflict`, `gone`,
    /// or `engine-N`.
    public var codeName: String { code.name }

    public var description: String {
        (engine.map { "engine \($0): " } ?? "") + "\(code): \(message)"
    }
}

/// A storage engine: opens and drops stores. Calls block (see `EngineStore`).
public protocol StorageEngine: Sendable {
    var name: String { get }
    var version: String { get }
    var capabilities: EngineCapabilities { get }
    /// The capabilities under the engine's options (`--engine-option`): an engine may apply without blocking
    /// under some options only.
    func capabilities(options: [String: String]) -> EngineCapabilities
    /// The option keys `open` and `drop` accept.
    var optionKeys: [String] { get }

    /// Opens (creating if needed) a store whose data lives in `directory`, a directory for this store alone.
    func open(directory: String, store: String, options: [String: String]) throws(EngineFailure)
        -> any EngineStore
    /// Deletes the store's data from `directory`. The store must not be open.
    func drop(directory: String, store: String, options: [String: String]) throws(EngineFailure)
}

extension StorageEngine {
    public func capabilities(options: [String: String]) -> EngineCapabilities { capabilities }
}

/// One open store of an engine. Every call blocks until the engine is done: the broker makes them one at a time,
/// from a thread made for blocking work, or, for an engine that declares `nonblocking`, from its owner loop.
public protocol EngineStore: AnyObject, Sendable {
    /// The sequence recorded by the last `apply`, as read when the store was opened (0 for a new store).
    var openedSequence: UInt64 { get }

    /// Applies `steps` in order and records `sequence`, all or nothing.
    func apply(_ steps: [EngineStep], sequence: UInt64) throws(EngineFailure)
    /// Every record, in the store's order, handed to `visit` one at a time with its bytes borrowed for the call
    /// only: loading a store builds memory from them directly, with no array of every record in between.
    func scan(_ visit: (ScannedRecord) -> Void) throws(EngineFailure)
    /// How many records the next `scan` yields (memory is sized from it before the scan).
    func count() throws(EngineFailure) -> UInt64
    /// Releases the store. No other call may follow.
    func close()
}

/// An engine whose stores several brokers share (`shared`, ABI 2.1): it can watch them for other brokers'
/// commits.
public protocol SharedStorageEngine: StorageEngine {
    /// Whether this engine's stores are shared (the capability, and the ABI's members for it).
    var sharesStores: Bool { get }
    /// Starts watching every store under `options`.
    func watch(options: [String: String]) throws(EngineFailure) -> any EngineWatch
    /// The name of every store that exists under `options` (other brokers' included).
    func storeNames(options: [String: String]) throws(EngineFailure) -> [String]
}

/// A watch on a shared engine's stores: its descriptor becomes readable when stores may have changed.
public protocol EngineWatch: AnyObject, Sendable {
    var descriptor: Int32 { get }
    /// Hands `changed` each store named since the last call, with its position after the change when the
    /// engine knows it (a nil name: any may have changed); the descriptor to wait on next (-1: call again after a
    /// short wait). Never blocks on the database.
    func changes(_ changed: (String?, Position?) -> Void) throws(EngineFailure) -> Int32
    func close()
}

/// A store of a shared engine (ABI 2.1): loaded in one snapshot, committed only at the position the broker
/// planned against, with a log of commits other brokers read.
public protocol SharedEngineStore: EngineStore {
    /// Every record, as `scan`, and the position of that same snapshot.
    func load(_ visit: (ScannedRecord) -> Void) throws(EngineFailure) -> Position
    /// Applies `steps` only if the stored position is `expected` (else `.conflict`, nothing written), recording
    /// `epoch` and the last commit's sequence, and logging every commit's record.
    func apply(
        _ steps: [EngineStep], at expected: Position, epoch: UInt64, commits: [(sequence: UInt64, record: [UInt8])]
    ) throws(EngineFailure)
    /// The logged commits of `epoch` after sequence `after`, in order (`.gone` when the log no longer reaches
    /// back), and the stored position (another epoch: the store was dropped, nothing is visited).
    func commits(epoch: UInt64, after: UInt64, _ visit: (UInt64, UnsafeRawBufferPointer) -> Void) throws(EngineFailure)
        -> Position
}

/// A record an engine hands out during `scan`: its bytes are valid only inside the visit.
public struct ScannedRecord {
    public var key: UnsafeRawBufferPointer
    public var payload: UnsafeRawBufferPointer
    /// Milliseconds since the Unix epoch.
    public var createdAt: UInt64
    public var updatedAt: UInt64

    public init(key: UnsafeRawBufferPointer, payload: UnsafeRawBufferPointer, createdAt: UInt64, updatedAt: UInt64) {
        self.key = key
        self.payload = payload
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }
}

extension EngineStore {
    /// Every record, in the store's order, copied.
    public func scanAll() throws(EngineFailure) -> [EngineRecord] {
        var records: [EngineRecord] = []
        try scan { records.append(EngineRecord($0)) }
        return records
    }
}

extension EngineRecord {
    /// A copy of a scanned record.
    public init(_ scanned: ScannedRecord) {
        self.init(
            kept: KeptItem.make(id: scanned.key, payload: scanned.payload), createdAt: scanned.createdAt,
            updatedAt: scanned.updatedAt)
    }
}
