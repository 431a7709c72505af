import CStorageEngine
@_exported import ErrorShape

#if canImport(Glibc)
import Glibc
#endif

// StorageEngineKit: write a storebroker storage engine in Swift. Implement `EngineDefinition` and
// `EngineStoreImplementation`, then export the C table from your library:
//
//     @_cdecl("storebroker_engine_entry")
//     public func storebrokerEngineEntry() -> UnsafePointer<storebroker_engine> { table }
//     nonisolated(unsafe) private let table = EngineExport.table(for: MyEngine())
//
// The kit turns the C calls into Swift calls and Swift errors into `sb_error` reports. It is linked into each
// engine library on its own; the host never links it (it loads engines only through the C ABI).

/// A failure an engine reports: an SB_ERR_* code and a message (what crosses the C ABI to the host), the error
/// it came from and where the engine decided it (for the engine's own tests and logs).
public struct EngineError: LayerError, Sendable {
    public var code: Int32
    public var message: String
    public var underlying: (any Error)?
    public var location: SourceLocation

    public init(
        _ code: Int32, _ message: String, underlying: (any Error)? = nil, fileID: StaticString = #fileID,
        line: UInt = #line
    ) {
        self.code = code
        self.message = message
        self.underlying = underlying
        self.location = SourceLocation(fileID: fileID, line: line)
    }

    public static func io(_ message: String, fileID: StaticString = #fileID, line: UInt = #line) -> EngineError {
        EngineError(Int32(SB_ERR_IO), message, fileID: fileID, line: line)
    }

    public static func invalid(_ message: String, fileID: StaticString = #fileID, line: UInt = #line) -> EngineError {
        EngineError(Int32(SB_ERR_INVALID), message, fileID: fileID, line: line)
    }

    public static func corrupt(_ message: String, fileID: StaticString = #fileID, line: UInt = #line) -> EngineError {
        EngineError(Int32(SB_ERR_CORRUPT), message, fileID: fileID, line: line)
    }

    public static let stopped = EngineError(Int32(SB_ERR_STOPPED), "stopped by the host")

    /// An I/O error from `errno`, naming what was being done. ENOSPC and EDQUOT become SB_ERR_FULL.
    public static func errno(
        _ what: String, _ code: Int32 = Glibc.errno, fileID: StaticString = #fileID, line: UInt = #line
    ) -> EngineError {
        let cause = SystemError(code: code)
        let status = code == ENOSPC || code == EDQUOT ? Int32(SB_ERR_FULL) : Int32(SB_ERR_IO)
        return EngineError(status, "\(what): \(cause)", underlying: cause, fileID: fileID, line: line)
    }

    /// The SB_ERR_* name: `io`, `corrupt`, `full`, `invalid`, `unsupported`, `stopped`, `internal`, `injected`.
    public var codeName: String {
        switch code {
        case Int32(SB_ERR_IO): "io"
        case Int32(SB_ERR_CORRUPT): "corrupt"
        case Int32(SB_ERR_FULL): "full"
        case Int32(SB_ERR_INVALID): "invalid"
        case Int32(SB_ERR_UNSUPPORTED): "unsupported"
        case Int32(SB_ERR_STOPPED): "stopped"
        case Int32(SB_ERR_INTERNAL): "internal"
        case Int32(SB_ERR_INJECTED): "injected"
        case Int32(SB_ERR_CONFLICT): "conflict"
        case Int32(SB_ERR_GONE): "gone"
        default: "engine-\(code)"
        }
    }

    public var description: String { "\(codeName): \(message)" }
}

/// An engine: its description, and opening and dropping stores.
public protocol EngineDefinition: AnyObject, Sendable {
    var name: String { get }
    var version: String { get }
    /// SB_CAP_* bits.
    var capabilities: UInt64 { get }
    var optionKeys: [String] { get }

    /// Checks option values without touching any store or file: throws `EngineError.invalid` naming the bad
    /// one. `open` and `drop` are given the same options, checked again.
    func checkOptions(_ options: [String: String]) throws(EngineError)
    /// Opens the store; returns it and the sequence of its last apply (0 if new).
    func open(directory: String, store: String, options: [String: String]) throws(EngineError)
        -> (store: any EngineStoreImplementation, sequence: UInt64)
    func drop(directory: String, store: String, options: [String: String]) throws(EngineError)
    /// What a power cut may take of the acknowledged applies under `options` (ABI 2.2's `power_loss_window`):
    /// milliseconds, or `SB_POWER_LOSS_UNBOUNDED`. An engine that syncs every apply before it returns says 0, the
    /// default.
    func powerLossWindow(_ options: [String: String]) throws(EngineError) -> UInt64
    /// The SB_CAP_* bits under `options` (ABI 2.2's `capabilities_under`): `capabilities`, unless the engine's
    /// applies block under some options and not others (SB_CAP_NONBLOCKING is the one bit that may differ).
    func capabilities(under options: [String: String]) -> UInt64
}

extension EngineDefinition {
    public func powerLossWindow(_ options: [String: String]) throws(EngineError) -> UInt64 { 0 }
    public func capabilities(under options: [String: String]) -> UInt64 { capabilities }
}

/// An engine whose stores live in a database several hosts share (SB_CAP_SHARED, ABI 2.1): it also watches them.
public protocol SharedEngineDefinition: EngineDefinition {
    /// Starts watching every store under `options`; the watch and the descriptor that becomes readable when
    /// stores may have changed.
    func watch(options: [String: String]) throws(EngineError) -> (watch: any EngineWatchImplementation, descriptor: Int32)
    /// The name of every store that exists under `options`.
    func storeNames(options: [String: String]) throws(EngineError) -> [String]
}

/// A watch (`watch_open`): one caller at a time.
public protocol EngineWatchImplementation: AnyObject {
    /// Hands `changed` each store the notices since the last call name, with its position after the change when
    /// known (a nil name: any store may have changed); the descriptor to wait on next (-1: call again after a
    /// short wait).
    func changes(_ changed: (String?, sb_position?) -> Void) throws(EngineError) -> Int32
    func close()
}

/// A store of a shared engine (ABI 2.1): loads in one snapshot, commits at an expected position, reads the log.
public protocol SharedEngineStoreImplementation: EngineStoreImplementation {
    /// Every item in order, and the position of that same snapshot.
    func load(emit: (UnsafePointer<sb_item>) -> Bool) throws(EngineError) -> sb_position
    /// `apply` only at `expected` (else SB_ERR_CONFLICT), recording `epoch` and logging `commits`.
    func apply(
        _ steps: UnsafeBufferPointer<sb_step>, at expected: sb_position, epoch: UInt64, commits: UnsafeBufferPointer<sb_commit>
    ) throws(EngineError)
    /// The logged commits of `epoch` after `after`, in order; the stored position.
    func commits(epoch: UInt64, after: UInt64, emit: (UnsafePointer<sb_commit>) -> Bool) throws(EngineError) -> sb_position
}

/// One open store. Calls never overlap (the host serializes them).
///
/// `scan`'s `emit` returns `false` when the host asks to stop; the implementation then stops at once and throws
/// `EngineError.stopped`.
public protocol EngineStoreImplementation: AnyObject {
    func apply(_ steps: UnsafeBufferPointer<sb_step>, sequence: UInt64) throws(EngineError)
    func scan(emit: (UnsafePointer<sb_item>) -> Bool) throws(EngineError)
    /// How many items the next `scan` yields.
    func count() throws(EngineError) -> UInt64
    func close()
}

extension sb_step {
    /// Refuses a key the ABI does not allow (empty, or longer than SB_MAX_KEY_LENGTH): the host never sends
    /// one, and an engine never stores a key cut short.
    public func checkKey() throws(EngineError) {
        guard kind != UInt32(SB_STEP_REMOVE_ALL) else { return }
        guard key.length >= 1, key.length <= Int(SB_MAX_KEY_LENGTH) else {
            throw EngineError.invalid("a key of \(key.length) bytes (keys are 1 to \(SB_MAX_KEY_LENGTH) bytes)")
        }
    }
}

/// Reading engines' options.
public enum EngineOptions {
    /// The whole number option `key` holds (nil when it is not given), at least `minimum`; otherwise
    /// `SB_ERR_INVALID` naming the key, what it counts (`unit`) and the value given.
    public static func wholeNumber<T: FixedWidthInteger>(
        _ options: [String: String], _ key: String, of unit: String, atLeast minimum: T = 0
    ) throws(EngineError) -> T? {
        guard let text = options[key] else { return nil }
        guard let value = T(text), value >= minimum else {
            throw EngineError.invalid(
                "\(key) must be a whole number of \(unit)\(minimum > 0 ? ", at least \(minimum)" : ""), got \(text.debugDescription)")
        }
        return value
    }
}

/// The test option every engine accepts: `fail_after_steps=N` makes `apply` fail after N steps.
public struct FailureInjection: Sendable {
    public static let optionKey = "fail_after_steps"
    public let afterSteps: Int?

    public init(options: [String: String]) throws(EngineError) {
        afterSteps = try EngineOptions.wholeNumber(options, Self.optionKey, of: "steps")
    }

    /// Throws SB_ERR_INJECTED when step `index` (0-based) is the one to fail at.
    public func check(stepIndex index: Int) throws(EngineError) {
        if let afterSteps, index == afterSteps {
            throw EngineError(Int32(SB_ERR_INJECTED), "failure injected after \(afterSteps) steps")
        }
    }
}

extension sb_bytes {
    /// A copy of the bytes.
    public var bytes: [UInt8] {
        guard let data, length > 0 else { return [] }
        return Array(UnsafeBufferPointer(start: data, count: length))
    }
}

/// Calls `body` with an `sb_item` pointing at the given bytes.
public func withItem<R>(
    key: [UInt8], payload: [UInt8], createdAt: UInt64, updatedAt: UInt64, _ body: (UnsafePointer<sb_item>) -> R
) -> R {
    key.withUnsafeBufferPointer { k in
        payload.withUnsafeBufferPointer { p in
            var item = sb_item(
                key: sb_bytes(data: k.baseAddress, length: k.count), payload: sb_bytes(data: p.baseAddress, length: p.count),
                created_at: createdAt, updated_at: updatedAt)
            return withUnsafePointer(to: &item, body)
        }
    }
}

/// Builds the C table for an engine.
public enum EngineExport {
    /// The table for `engine`, allocated once and never freed (it lives as long as the library).
    public static func table(for engine: any EngineDefinition) -> UnsafePointer<storebroker_engine> {
        let tableSize = MemoryLayout<storebroker_engine>.stride
        // The table, then a pointer to the Swift engine: the thunks find the engine from the table pointer
        // the host passes back, so no global state is needed.
        let raw = UnsafeMutableRawPointer.allocate(
            byteCount: tableSize + MemoryLayout<UnsafeRawPointer>.stride, alignment: 16)
        let keys = UnsafeMutablePointer<UnsafePointer<CChar>?>.allocate(capacity: engine.optionKeys.count + 1)
        for (index, key) in engine.optionKeys.enumerated() {
            keys[index] = UnsafePointer(strdup(key))
        }
        keys[engine.optionKeys.count] = nil
        let table = storebroker_engine(
            abi_major: UInt16(SB_ENGINE_ABI_MAJOR), abi_minor: UInt16(SB_ENGINE_ABI_MINOR),
            struct_size: UInt32(MemoryLayout<storebroker_engine>.size),
            name: UnsafePointer(strdup(engine.name)), version: UnsafePointer(strdup(engine.version)),
            capabilities: engine.capabilities, option_keys: UnsafePointer(keys),
            check_options: { table, options, count, error in
                report(error) { () throws(EngineError) in
                    try EngineExport.definition(table!).checkOptions(EngineExport.options(options, count))
                }
            },
            open: { table, directory, store, options, count, outStore, outSequence, error in
                report(error) { () throws(EngineError) in
                    let definition = EngineExport.definition(table!)
                    let opened = try definition.open(
                        directory: String(cString: directory!), store: String(cString: store!),
                        options: EngineExport.options(options, count))
                    outStore!.pointee = OpaquePointer(Unmanaged.passRetained(StoreBox(opened.store)).toOpaque())
                    outSequence!.pointee = opened.sequence
                }
            },
            close: { handle in
                let box = Unmanaged<StoreBox>.fromOpaque(UnsafeRawPointer(handle!))
                box.takeUnretainedValue().store.close()
                box.release()
            },
            drop: { table, directory, store, options, count, error in
                report(error) { () throws(EngineError) in
                    try EngineExport.definition(table!).drop(
                        directory: String(cString: directory!), store: String(cString: store!),
                        options: EngineExport.options(options, count))
                }
            },
            apply: { handle, steps, count, sequence, error in
                report(error) { () throws(EngineError) in
                    try EngineExport.store(handle).apply(UnsafeBufferPointer(start: steps, count: count), sequence: sequence)
                }
            },
            scan: { handle, sink, context, error in
                report(error) { () throws(EngineError) in
                    try EngineExport.store(handle).scan { sink!(context, $0) == 0 }
                }
            },
            count: { handle, outCount, error in
                report(error) { () throws(EngineError) in
                    outCount!.pointee = try EngineExport.store(handle).count()
                }
            },
            load: nil, apply_at: nil, commits_since: nil, watch_open: nil, watch_changes: nil, watch_close: nil,
            list_stores: nil,
            power_loss_window: { table, options, count, outWindow, error in
                report(error) { () throws(EngineError) in
                    outWindow!.pointee = try EngineExport.definition(table!).powerLossWindow(EngineExport.options(options, count))
                }
            },
            capabilities_under: { table, options, count in
                EngineExport.definition(table!).capabilities(under: EngineExport.options(options, count))
            })
        var filled = table
        if engine is any SharedEngineDefinition { EngineExport.fillShared(&filled) }
        raw.initializeMemory(as: storebroker_engine.self, to: filled)
        (raw + tableSize).storeBytes(
            of: Unmanaged.passRetained(EngineBox(engine)).toOpaque(), as: UnsafeMutableRawPointer.self)
        return UnsafePointer(raw.assumingMemoryBound(to: storebroker_engine.self))
    }

    /// The ABI 2.1 members, for an engine that shares its stores.
    static func fillShared(_ table: inout storebroker_engine) {
        table.load = { handle, sink, context, outPosition, error in
            report(error) { () throws(EngineError) in
                outPosition!.pointee = try EngineExport.sharedStore(handle).load { sink!(context, $0) == 0 }
            }
        }
        table.apply_at = { handle, steps, count, expected, epoch, commits, commitCount, error in
            report(error) { () throws(EngineError) in
                try EngineExport.sharedStore(handle).apply(
                    UnsafeBufferPointer(start: steps, count: count), at: expected, epoch: epoch,
                    commits: UnsafeBufferPointer(start: commits, count: commitCount))
            }
        }
        table.commits_since = { handle, epoch, after, sink, context, outPosition, error in
            report(error) { () throws(EngineError) in
                outPosition!.pointee = try EngineExport.sharedStore(handle).commits(epoch: epoch, after: after) {
                    sink!(context, $0) == 0
                }
            }
        }
        table.watch_open = { table, options, count, outWatch, outDescriptor, error in
            report(error) { () throws(EngineError) in
                guard let shared = EngineExport.definition(table!) as? any SharedEngineDefinition else {
                    throw EngineError(Int32(SB_ERR_UNSUPPORTED), "the engine does not share its stores")
                }
                let opened = try shared.watch(options: EngineExport.options(options, count))
                outWatch!.pointee = OpaquePointer(Unmanaged.passRetained(WatchBox(opened.watch)).toOpaque())
                outDescriptor!.pointee = opened.descriptor
            }
        }
        table.watch_changes = { handle, sink, context, outDescriptor, error in
            outDescriptor?.pointee = -1
            return report(error) { () throws(EngineError) in
                let watch = Unmanaged<WatchBox>.fromOpaque(UnsafeRawPointer(handle!)).takeUnretainedValue().watch
                outDescriptor!.pointee = try watch.changes { name, position in
                    guard let name else { return _ = sink!(context, nil, nil) }
                    if var position {
                        _ = name.withCString { sink!(context, $0, &position) }
                    } else {
                        _ = name.withCString { sink!(context, $0, nil) }
                    }
                }
            }
        }
        table.list_stores = { table, options, count, sink, context, error in
            report(error) { () throws(EngineError) in
                guard let shared = EngineExport.definition(table!) as? any SharedEngineDefinition else {
                    throw EngineError(Int32(SB_ERR_UNSUPPORTED), "the engine does not share its stores")
                }
                for name in try shared.storeNames(options: EngineExport.options(options, count)) {
                    _ = name.withCString { sink!(context, $0) }
                }
            }
        }
        table.watch_close = { handle in
            let box = Unmanaged<WatchBox>.fromOpaque(UnsafeRawPointer(handle!))
            box.takeUnretainedValue().watch.close()
            box.release()
        }
    }

    static func sharedStore(_ handle: OpaquePointer?) throws(EngineError) -> any SharedEngineStoreImplementation {
        guard let shared = store(handle) as? any SharedEngineStoreImplementation else {
            throw EngineError(Int32(SB_ERR_UNSUPPORTED), "the store is not shared")
        }
        return shared
    }

    static func definition(_ table: UnsafePointer<storebroker_engine>) -> any EngineDefinition {
        let pointer = UnsafeRawPointer(table).load(
            fromByteOffset: MemoryLayout<storebroker_engine>.stride, as: UnsafeMutableRawPointer.self)
        return Unmanaged<EngineBox>.fromOpaque(pointer).takeUnretainedValue().engine
    }

    static func store(_ handle: OpaquePointer?) -> any EngineStoreImplementation {
        Unmanaged<StoreBox>.fromOpaque(UnsafeRawPointer(handle!)).takeUnretainedValue().store
    }

    static func options(_ list: UnsafePointer<sb_option>?, _ count: Int) -> [String: String] {
        var options: [String: String] = [:]
        for option in UnsafeBufferPointer(start: list, count: count) {
            guard let key = option.key, let value = option.value else { continue }
            options[String(cString: key)] = String(cString: value)
        }
        return options
    }
}

private final class EngineBox {
    let engine: any EngineDefinition
    init(_ engine: any EngineDefinition) { self.engine = engine }
}

private final class WatchBox {
    let watch: any EngineWatchImplementation
    init(_ watch: any EngineWatchImplementation) { self.watch = watch }
}

private final class StoreBox {
    let store: any EngineStoreImplementation
    init(_ store: any EngineStoreImplementation) { self.store = store }
}

/// Runs `body`; on failure fills the host's error struct and returns the code.
private func report(_ report: UnsafeMutablePointer<sb_error>?, _ body: () throws(EngineError) -> Void) -> Int32 {
    do {
        try body()
        return Int32(SB_OK)
    } catch {
        if let report {
            report.pointee.code = error.code
            withUnsafeMutableBytes(of: &report.pointee.message) { buffer in
                let utf8 = Array(error.message.utf8.prefix(buffer.count - 1))
                buffer.copyBytes(from: utf8)
                buffer[utf8.count] = 0
            }
        }
        return error.code
    }
}
