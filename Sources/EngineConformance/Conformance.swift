import BrokerCore
import EngineLoader
import Foundation
import NIOCore
import TestSupport

/// The engine conformance suite: every property an engine must have to serve a store (docs/ENGINE-ABI.md),
/// checked through the C ABI exactly as the daemon loads engines. `storebroker-engine-check` runs it against any
/// engine file; the package's tests run it against every engine it ships and against deliberately broken ones.
public enum Conformance {
    /// Every property, in the order they are checked.
    public static let properties: [Property] = Properties.all

    /// The child a kill round spawns (`storebroker-engine-check --crash-child ...`); returns its exit status.
    public static func crashChild(_ arguments: [String]) -> Int32 {
        CrashRound.child(arguments)
    }

    /// Checks one property of `engine`; never throws (a failure is a result).
    public static func check(_ property: Property, _ engine: LoadedEngine, setup: Setup) async -> Outcome {
        if let reason = property.skip(engine) { return .skipped(reason) }
        do {
            try await withTemporaryDirectory(prefix: "sb-conformance") { directory in
                try await property.body(Context(engine: engine, setup: setup, directory: directory))
            }
            return .passed
        } catch let violation as Violation {
            return .failed(violation.message)
        } catch let failure as EngineFailure {
            return .failed("an unexpected engine failure: \(failure.description)")
        } catch {
            return .failed("\(error)")
        }
    }
}

/// What a run is given besides the engine.
public struct Setup: Sendable {
    /// Options passed to every `open`, `drop` and `check_options` (`--option KEY=VALUE`).
    public var options: [String: String]
    /// The checker's executable, which `posix_spawn`s itself as the child it kills (`--crash-child`).
    public var checker: String
    /// Kill rounds per crash property.
    public var rounds: Int
    /// Items in the big apply.
    public var bigApply: Int

    public init(options: [String: String] = [:], checker: String, rounds: Int = 4, bigApply: Int = 50_000) {
        self.options = options
        self.checker = checker
        self.rounds = rounds
        self.bigApply = bigApply
    }
}

/// One property: a name to report it by (`--only NAME`), what it claims, and the check.
public struct Property: Sendable {
    public let name: String
    public let claim: String
    /// Why the property does not apply to an engine (a persistence property for a memory engine), or nil.
    let skip: @Sendable (LoadedEngine) -> String?
    let body: @Sendable (Context) async throws -> Void

    init(
        _ name: String, _ claim: String, skip: @escaping @Sendable (LoadedEngine) -> String? = { _ in nil },
        _ body: @escaping @Sendable (Context) async throws -> Void
    ) {
        self.name = name
        self.claim = claim
        self.skip = skip
        self.body = body
    }
}

public enum Outcome: Sendable, Equatable {
    case passed
    case failed(String)
    case skipped(String)
}

/// A property does not hold: what was seen.
struct Violation: Error {
    let message: String
}

/// Fails the property with `message` unless `condition` holds.
func require(_ condition: @autoclosure () throws -> Bool, _ message: @autoclosure () -> String) throws {
    guard try condition() else { throw Violation(message: message()) }
}

/// Runs `body`, which must fail with an engine error whose code is in `codes`; returns that error.
@discardableResult
func requireFailure(
    _ codes: Set<EngineFailure.Code>, _ what: String, _ body: () throws -> Void
) throws -> EngineFailure {
    do {
        try body()
    } catch let failure as EngineFailure {
        try require(
            codes.contains(failure.code),
            "\(what) failed with \(failure.code), expected \(codes.map(\.description).sorted().joined(separator: " or ")): \(failure.message)")
        return failure
    }
    throw Violation(message: "\(what) succeeded; it must fail")
}

/// A property's surroundings: the engine, the options, and a directory of its own.
struct Context: Sendable {
    let engine: LoadedEngine
    let setup: Setup
    let directory: String

    var persistent: Bool { engine.capabilities.contains(.persistent) }

    /// The directory of store `name` (created), as the daemon gives each store one of its own.
    func storeDirectory(_ name: String = "store") throws -> String {
        let path = directory + "/" + name
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    /// The name of the store in `directory`: the same for every open of that directory, and another for every
    /// other directory and run, so that an engine whose stores live in a shared database (SB_CAP_SHARED, named
    /// by name, not by directory) sees a new store wherever a file engine sees a new directory.
    func storeName(_ directory: String) -> String {
        Context.storeName(directory)
    }

    static func storeName(_ directory: String) -> String {
        "conformance" + directory.split(separator: "/").suffix(2).map { "-" + $0 }.joined()
    }

    func open(_ directory: String, extra: [String: String] = [:]) throws -> LoadedStore {
        let store = try engine.open(
            directory: directory, store: storeName(directory), options: setup.options.merging(extra) { $1 })
        guard let loaded = store as? LoadedStore else { throw Violation(message: "the loader returned another kind of store") }
        return loaded
    }

    /// Opens a new store in a directory of its own, hands it to `body`, closes.
    func withNewStore<T>(_ body: (LoadedStore) throws -> T) throws -> T {
        try withStore(try storeDirectory(), body)
    }

    /// Opens, hands the store to `body`, closes.
    func withStore<T>(_ directory: String, extra: [String: String] = [:], _ body: (LoadedStore) throws -> T) throws -> T {
        let store = try open(directory, extra: extra)
        defer { store.close() }
        return try body(store)
    }
}

/// Records as the suite writes and expects them.
public func record(_ key: String, _ payload: String, created: UInt64 = 1, updated: UInt64 = 1) -> EngineRecord {
    EngineRecord(key: Array(key.utf8), payload: ByteBuffer(string: payload), createdAt: created, updatedAt: updated)
}

public func record(bytes key: [UInt8], payload: [UInt8], created: UInt64 = 1, updated: UInt64 = 1) -> EngineRecord {
    EngineRecord(key: key, payload: ByteBuffer(bytes: payload), createdAt: created, updatedAt: updated)
}

/// The keys of records, as text.
public func keys(_ records: [EngineRecord]) -> [String] {
    records.map { String(decoding: $0.key, as: UTF8.self) }
}

/// A short description of records for a failure message.
func describe(_ records: [EngineRecord]) -> String {
    let shown = records.prefix(6).map { record -> String in
        let key = String(decoding: record.key, as: UTF8.self)
        return (key.count > 24 ? String(key.prefix(21)) + "…(\(record.key.count) bytes)" : key)
            + "=" + String(decoding: record.payload.readableBytesView.prefix(24), as: UTF8.self)
    }
    return "\(records.count) items [" + shown.joined(separator: ", ") + (records.count > 6 ? ", …" : "") + "]"
}

extension LoadedStore {
    /// The count and the scan, checked against each other.
    func contents() throws -> [EngineRecord] {
        let counted = try count()
        let all = try scanAll()
        try require(counted == UInt64(all.count), "count says \(counted) but scan yields \(all.count) items")
        return all
    }

    /// Fails unless the store holds exactly `expected` (count and scan), naming `what` was checked.
    func requireContents(_ expected: [EngineRecord], _ what: String) throws {
        let all = try contents()
        try require(all == expected, "\(what): expected \(describe(expected)), scan yields \(describe(all))")
    }
}
