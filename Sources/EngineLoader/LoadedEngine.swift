import BrokerCore
import CStorageEngine
import Locking
import NIOCore
import StoreModel

#if canImport(Glibc)
import Glibc
#endif

/// An engine loaded from a shared library, seen through the `StorageEngine` interface.
///
/// Every call into the library blocks the calling thread, which the broker makes one of its threads for blocking
/// work (or its owner loop, for an engine that declares `nonblocking`; never the cooperative pool). Each open store
/// holds a lock around its calls, which is what serializes calls on one store as the ABI requires, whoever
/// calls.
///
/// `@unchecked Sendable`: the only state is the engine's table, which the ABI declares immutable and readable
/// from any thread.
public final class LoadedEngine: SharedStorageEngine, @unchecked Sendable {
    private let table: UnsafePointer<storebroker_engine>
    /// The engine's table as far as the engine's `struct_size` reaches, the rest zero (NULL): a member a minor
    /// version added is never read past an older engine's table.
    fileprivate let functions: storebroker_engine
    /// Whether the table holds ABI 2.1's shared-store members (all of them, non-NULL) and the engine declares
    /// `shared`.
    public let sharesStores: Bool
    public let path: String
    public let name: String
    public let version: String
    public let capabilities: EngineCapabilities
    public let optionKeys: [String]
    public let abiMajor: UInt16
    public let abiMinor: UInt16

    /// What `storectl engines` shows for this engine.
    public var info: EngineInfo {
        EngineInfo(
            name: name, path: path, status: .loaded, abiMajor: abiMajor, abiMinor: abiMinor,
            capabilities: capabilities, detail: version)
    }

    /// The ABI this host speaks.
    public static let hostABI = (major: UInt16(SB_ENGINE_ABI_MAJOR), minor: UInt16(SB_ENGINE_ABI_MINOR))

    init(table: UnsafePointer<storebroker_engine>, path: String, expectedName: String?) throws(EngineLoadError) {
        // Read the version and size first, from their fixed offsets, before trusting anything else.
        let raw = UnsafeRawPointer(table)
        let major = raw.loadUnaligned(fromByteOffset: 0, as: UInt16.self)
        let minor = raw.loadUnaligned(fromByteOffset: 2, as: UInt16.self)
        let size = Int(raw.loadUnaligned(fromByteOffset: 4, as: UInt32.self))
        let host = Self.hostABI
        guard major == host.major else {
            throw EngineLoadError(
                .abiMismatch, path: path,
                "built for engine ABI \(major).\(minor); this host speaks \(host.major).\(host.minor) and loads "
                    + "major \(host.major) only"
                    + (major == 1 && host.major == 2
                        ? " (2.0 cut get, keys and contains and added check_options: docs/ENGINE-ABI.md \"Versions\")" : ""))
        }
        let needed = Self.firstAddedMember
        guard size >= needed else {
            throw EngineLoadError(
                .abiMismatch, path: path,
                "its table is \(size) bytes; engine ABI \(host.major).0 needs at least \(needed)")
        }
        var t = storebroker_engine()
        withUnsafeMutableBytes(of: &t) { target in
            target.copyMemory(from: UnsafeRawBufferPointer(start: raw, count: min(size, target.count)))
        }
        guard t.name != nil, t.version != nil, t.option_keys != nil, t.check_options != nil, t.open != nil,
            t.close != nil, t.drop != nil, t.apply != nil, t.scan != nil, t.count != nil
        else {
            throw EngineLoadError(.invalidEngine, path: path, "its table has a NULL member")
        }
        let name = String(cString: t.name)
        if let expectedName, name != expectedName {
            throw EngineLoadError(
                .invalidEngine, path: path, "the engine calls itself \(name.debugDescription), not \(expectedName.debugDescription)")
        }
        var keys: [String] = []
        var cursor = t.option_keys!
        while let key = cursor.pointee {
            keys.append(String(cString: key))
            cursor += 1
        }
        self.table = table
        self.path = path
        self.name = name
        self.version = String(cString: t.version)
        self.capabilities = EngineCapabilities(rawValue: UInt32(truncatingIfNeeded: t.capabilities))
        self.optionKeys = keys
        self.abiMajor = major
        self.abiMinor = minor
        self.functions = t
        let shared = EngineCapabilities(rawValue: UInt32(truncatingIfNeeded: t.capabilities)).contains(.shared)
        let complete = t.load != nil && t.apply_at != nil && t.commits_since != nil && t.watch_open != nil
            && t.watch_changes != nil && t.watch_close != nil && t.list_stores != nil
        guard !shared || complete else {
            throw EngineLoadError(
                .invalidEngine, path: path,
                "it declares SB_CAP_SHARED but its table lacks ABI 2.1's shared-store members (or has a NULL one)")
        }
        self.sharesStores = shared
    }

    /// The size of ABI 2.0's table: the offset of the first member 2.1 added.
    static let firstAddedMember = MemoryLayout<storebroker_engine>.offset(of: \storebroker_engine.load)!

    /// Fails for an option key the engine does not declare, then for a value the engine's `check_options`
    /// refuses (no store or file is touched).
    public func validate(options: [String: String]) throws(EngineLoadError) {
        for key in options.keys.sorted() where !optionKeys.contains(key) {
            throw EngineLoadError(
                .unknownOption, path: path,
                "engine \(name) has no option \(key.debugDescription); it accepts: "
                    + (optionKeys.isEmpty ? "(none)" : optionKeys.joined(separator: ", ")))
        }
        do throws(EngineFailure) {
            try withOptions(options) { (list, count) throws(EngineFailure) in
                var error = sb_error()
                try check(table.pointee.check_options(table, list, count, &error), &error)
            }
        } catch {
            throw EngineLoadError(.invalidOption, path: path, "engine \(name) refuses its options: \(error.message)", underlying: error)
        }
    }

    /// The capabilities under `options` (ABI 2.2's `capabilities_under`): `nonblocking` as the engine says for
    /// them, every other bit as its table's `capabilities`.
    public func capabilities(options: [String: String]) -> EngineCapabilities {
        guard let under = functions.capabilities_under else { return capabilities }
        guard let bits = try? withOptions(options, { list, count in under(table, list, count) }) else { return capabilities }
        var result = capabilities
        if EngineCapabilities(rawValue: UInt32(truncatingIfNeeded: bits)).contains(.nonblocking) {
            result.insert(.nonblocking)
        } else {
            result.remove(.nonblocking)
        }
        return result
    }

    /// What a power cut may take of the acknowledged applies under `options`, in milliseconds (ABI 2.2;
    /// `UInt64.max`: any number). An engine built for an older minor version is held to 0.
    public func powerLossWindow(options: [String: String]) throws(EngineFailure) -> UInt64 {
        guard let window = functions.power_loss_window else { return 0 }
        return try withOptions(options) { (list, count) throws(EngineFailure) in
            var error = sb_error()
            var milliseconds: UInt64 = 0
            try check(window(table, list, count, &milliseconds, &error), &error)
            return milliseconds
        }
    }

    public func open(directory: String, store: String, options: [String: String]) throws(EngineFailure)
        -> any EngineStore
    {
        try withOptions(options) { (list, count) throws(EngineFailure) in
            var handle: OpaquePointer?
            var sequence: UInt64 = 0
            var error = sb_error()
            let status = table.pointee.open(table, directory, store, list, count, &handle, &sequence, &error)
            try check(status, &error)
            guard let handle else {
                throw EngineFailure(.internalError, "open returned SB_OK without a store", engine: name)
            }
            return LoadedStore(engine: self, handle: handle, sequence: sequence)
        }
    }

    public func drop(directory: String, store: String, options: [String: String]) throws(EngineFailure) {
        try withOptions(options) { (list, count) throws(EngineFailure) in
            var error = sb_error()
            try check(table.pointee.drop(table, directory, store, list, count, &error), &error)
        }
    }

    public func storeNames(options: [String: String]) throws(EngineFailure) -> [String] {
        guard sharesStores, let list = functions.list_stores else {
            throw EngineFailure(.unsupported, "the engine does not share its stores", engine: name)
        }
        return try withOptions(options) { (options, count) throws(EngineFailure) in
            var error = sb_error()
            let names = Collector<[String]>([])
            let status = list(table, options, count, { context, name in
                if let name { Unmanaged<Collector<[String]>>.fromOpaque(context!).takeUnretainedValue().values.append(String(cString: name)) }
                return 0
            }, Unmanaged.passUnretained(names).toOpaque(), &error)
            try check(status, &error)
            return names.values
        }
    }

    public func watch(options: [String: String]) throws(EngineFailure) -> any EngineWatch {
        guard sharesStores else { throw EngineFailure(.unsupported, "the engine does not share its stores", engine: name) }
        return try withOptions(options) { (list, count) throws(EngineFailure) in
            var handle: OpaquePointer?
            var descriptor: Int32 = -1
            var error = sb_error()
            try check(functions.watch_open(table, list, count, &handle, &descriptor, &error), &error)
            guard let handle else { throw EngineFailure(.internalError, "watch_open returned SB_OK without a watch", engine: name) }
            return LoadedWatch(engine: self, handle: handle, descriptor: descriptor)
        }
    }

    /// Throws the engine's report unless `status` is SB_OK.
    func check(_ status: Int32, _ error: inout sb_error) throws(EngineFailure) {
        guard status != SB_OK else { return }
        let message = withUnsafeBytes(of: &error.message) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
        throw EngineFailure(
            EngineFailure.Code(rawValue: status), message.isEmpty ? "(the engine gave no message)" : message,
            engine: name)
    }

    /// Runs `body` with the options as a C array of `sb_option`, valid during the call.
    private func withOptions<T>(
        _ options: [String: String], _ body: (UnsafePointer<sb_option>?, Int) throws(EngineFailure) -> T
    ) throws(EngineFailure) -> T {
        let strings = options.sorted { $0.key < $1.key }.map { (strdup($0.key)!, strdup($0.value)!) }
        defer {
            for (key, value) in strings {
                free(key)
                free(value)
            }
        }
        let list = strings.map { sb_option(key: $0.0, value: $0.1) }
        return try list.withUnsafeBufferPointer { (buffer) throws(EngineFailure) in
            try body(buffer.baseAddress, buffer.count)
        }
    }
}

/// One store opened through a `LoadedEngine`.
///
/// `@unchecked Sendable`: the store handle is touched only while `closed`'s lock is held, which serializes every
/// call (the broker makes them from one writer at a time, so the lock is never contended there).
public final class LoadedStore: SharedEngineStore, @unchecked Sendable {
    let engine: LoadedEngine
    private let handle: OpaquePointer
    /// Held during each call; true once closed.
    private let closed = Locked(false)
    public let openedSequence: UInt64

    init(engine: LoadedEngine, handle: OpaquePointer, sequence: UInt64) {
        self.engine = engine
        self.handle = handle
        self.openedSequence = sequence
    }

    deinit {
        if !closed.withLock({ $0 }) { engine.functions.close(handle) }
    }

    /// Runs one call, refusing calls after `close`.
    private func call<T>(_ body: (OpaquePointer, inout sb_error) throws(EngineFailure) -> T) throws(EngineFailure) -> T {
        try closed.withLock { (closed) throws(EngineFailure) -> T in
            guard !closed else { throw EngineFailure(.invalid, "the store is closed", engine: engine.name) }
            var error = sb_error()
            return try body(handle, &error)
        }
    }

    public func apply(_ steps: [EngineStep], sequence: UInt64) throws(EngineFailure) {
        try call { [engine] (handle, error) throws(EngineFailure) in
            try StepArena.withSteps(steps) { (cSteps, count) throws(EngineFailure) in
                try engine.check(engine.functions.apply(handle, cSteps, count, sequence, &error), &error)
            }
        }
    }

    public func scan(_ visit: (ScannedRecord) -> Void) throws(EngineFailure) {
        try scan { record in
            visit(record)
            return true
        }
    }

    /// Every record in the store's order until `visit` returns false: the engine must then stop at once and fail
    /// with `stopped` (SB_ERR_STOPPED), which this throws.
    public func scan(while visit: (ScannedRecord) -> Bool) throws(EngineFailure) {
        try call { [engine] (handle, error) throws(EngineFailure) in
            // The engine calls back once per item; the visit is valid only during this call.
            var failure: EngineFailure?
            withoutActuallyEscaping(visit) { visit in
                let visitor = Collector(visit)
                let status = engine.functions.scan(handle, { context, item in
                    let go = Unmanaged<Collector<(ScannedRecord) -> Bool>>.fromOpaque(context!).takeUnretainedValue().values(
                        ScannedRecord(item!.pointee))
                    return go ? 0 : 1
                }, Unmanaged.passUnretained(visitor).toOpaque(), &error)
                do throws(EngineFailure) {
                    try engine.check(status, &error)
                } catch {
                    failure = error
                }
            }
            if let failure { throw failure }
        }
    }

    public func load(_ visit: (ScannedRecord) -> Void) throws(EngineFailure) -> Position {
        try call { [engine] (handle, error) throws(EngineFailure) in
            guard let load = engine.functions.load else { throw EngineFailure(.unsupported, "no load (ABI 2.1)", engine: engine.name) }
            var position = sb_position()
            let status = withoutActuallyEscaping(visit) { visit in
                let visitor = Collector(visit)
                return load(handle, { context, item in
                    Unmanaged<Collector<(ScannedRecord) -> Void>>.fromOpaque(context!).takeUnretainedValue().values(
                        ScannedRecord(item!.pointee))
                    return 0
                }, Unmanaged.passUnretained(visitor).toOpaque(), &position, &error)
            }
            try engine.check(status, &error)
            return Position(epoch: position.epoch, sequence: position.sequence)
        }
    }

    public func apply(
        _ steps: [EngineStep], at expected: Position, epoch: UInt64, commits: [(sequence: UInt64, record: [UInt8])]
    ) throws(EngineFailure) {
        try call { [engine] (handle, error) throws(EngineFailure) in
            guard let applyAt = engine.functions.apply_at else {
                throw EngineFailure(.unsupported, "no apply_at (ABI 2.1)", engine: engine.name)
            }
            try StepArena.withSteps(steps) { (cSteps, count) throws(EngineFailure) in
                try withCommits(commits) { (cCommits, commitCount) throws(EngineFailure) in
                    try engine.check(
                        applyAt(
                            handle, cSteps, count, sb_position(epoch: expected.epoch, sequence: expected.sequence), epoch,
                            cCommits, commitCount, &error), &error)
                }
            }
        }
    }

    public func commits(
        epoch: UInt64, after: UInt64, _ visit: (UInt64, UnsafeRawBufferPointer) -> Void
    ) throws(EngineFailure) -> Position {
        try call { [engine] (handle, error) throws(EngineFailure) in
            guard let since = engine.functions.commits_since else {
                throw EngineFailure(.unsupported, "no commits_since (ABI 2.1)", engine: engine.name)
            }
            var position = sb_position()
            let status = withoutActuallyEscaping(visit) { visit in
                let visitor = Collector(visit)
                return since(handle, epoch, after, { context, commit in
                    let commit = commit!.pointee
                    Unmanaged<Collector<(UInt64, UnsafeRawBufferPointer) -> Void>>.fromOpaque(context!).takeUnretainedValue()
                        .values(commit.sequence, UnsafeRawBufferPointer(start: commit.record.data, count: commit.record.length))
                    return 0
                }, Unmanaged.passUnretained(visitor).toOpaque(), &position, &error)
            }
            try engine.check(status, &error)
            return Position(epoch: position.epoch, sequence: position.sequence)
        }
    }

    /// The commits as C structs pointing into their records, valid during `body`.
    private func withCommits<T>(
        _ commits: [(sequence: UInt64, record: [UInt8])], _ body: (UnsafePointer<sb_commit>?, Int) throws(EngineFailure) -> T
    ) throws(EngineFailure) -> T {
        // The records stay alive and unchanged during the call (`commits` holds them).
        var cCommits: [sb_commit] = []
        cCommits.reserveCapacity(commits.count)
        for commit in commits {
            let bytes = commit.record.withUnsafeBufferPointer { sb_bytes(data: $0.baseAddress, length: $0.count) }
            cCommits.append(sb_commit(sequence: commit.sequence, record: bytes))
        }
        return try withExtendedLifetime(commits) { () throws(EngineFailure) -> T in
            try cCommits.withUnsafeBufferPointer { (buffer) throws(EngineFailure) -> T in try body(buffer.baseAddress, buffer.count) }
        }
    }

    public func count() throws(EngineFailure) -> UInt64 {
        try call { [engine] (handle, error) throws(EngineFailure) in
            var count: UInt64 = 0
            try engine.check(engine.functions.count(handle, &count, &error), &error)
            return count
        }
    }

    public func close() {
        closed.withLock { closed in
            guard !closed else { return }
            closed = true
            engine.functions.close(handle)
        }
    }
}

/// A watch opened through a `LoadedEngine` (one caller at a time: the broker's watcher thread).
public final class LoadedWatch: EngineWatch, @unchecked Sendable {
    let engine: LoadedEngine
    private let handle: OpaquePointer
    public let descriptor: Int32
    private let closed = Locked(false)

    init(engine: LoadedEngine, handle: OpaquePointer, descriptor: Int32) {
        self.engine = engine
        self.handle = handle
        self.descriptor = descriptor
    }

    deinit { close() }

    public func changes(_ changed: (String?, Position?) -> Void) throws(EngineFailure) -> Int32 {
        try closed.withLock { [engine, handle] (closed) throws(EngineFailure) -> Int32 in
            guard !closed else { throw EngineFailure(.invalid, "the watch is closed", engine: engine.name) }
            var error = sb_error()
            var descriptor: Int32 = -1
            let status = withoutActuallyEscaping(changed) { changed in
                let visitor = Collector(changed)
                return engine.functions.watch_changes!(handle, { context, name, position in
                    Unmanaged<Collector<(String?, Position?) -> Void>>.fromOpaque(context!).takeUnretainedValue().values(
                        name.map { String(cString: $0) },
                        position.map { Position(epoch: $0.pointee.epoch, sequence: $0.pointee.sequence) })
                    return 0
                }, Unmanaged.passUnretained(visitor).toOpaque(), &descriptor, &error)
            }
            try engine.check(status, &error)
            return descriptor
        }
    }

    public func close() {
        closed.withLock { closed in
            guard !closed else { return }
            closed = true
            engine.functions.watch_close!(handle)
        }
    }
}

/// What an engine's callback reaches through its context pointer (collected values, or a visit); lives only
/// during one call.
private final class Collector<Value> {
    var values: Value
    init(_ values: Value) { self.values = values }
}

extension sb_bytes {
    /// A copy of the bytes.
    var array: [UInt8] {
        guard let data, length > 0 else { return [] }
        return Array(UnsafeBufferPointer(start: data, count: length))
    }
}

extension ScannedRecord {
    /// An item an engine handed out, its bytes borrowed for as long as the engine's callback runs.
    init(_ item: sb_item) {
        self.init(
            key: UnsafeRawBufferPointer(start: item.key.data, count: item.key.length),
            payload: UnsafeRawBufferPointer(start: item.payload.data, count: item.payload.length),
            createdAt: item.created_at, updatedAt: item.updated_at)
    }
}

/// The C steps of one `apply`, in one allocation. A put points straight into its record's buffers (the item the
/// broker keeps: nothing is copied); a removed key's bytes are copied in behind the steps.
enum StepArena {
    static func withSteps<T>(
        _ steps: [EngineStep], _ body: (UnsafePointer<sb_step>?, Int) throws(EngineFailure) -> T
    ) throws(EngineFailure) -> T {
        var total = 0
        for index in steps.indices { if case .remove(let key) = steps[index] { total += key.count } }
        // One allocation: the C steps, then the removed keys' bytes.
        let stepBytes = steps.count * MemoryLayout<sb_step>.stride
        // malloc's alignment suits sb_step; Swift's aligned allocation goes through posix_memalign.
        let block = UnsafeMutableRawBufferPointer(start: malloc(max(stepBytes + total, 1))!, count: stepBytes + total)
        defer { free(block.baseAddress) }
        let cSteps = block.baseAddress!.bindMemory(to: sb_step.self, capacity: steps.count)
        var offset = stepBytes
        func place(_ bytes: UnsafeRawBufferPointer) -> sb_bytes {
            guard bytes.count > 0 else { return sb_bytes(data: nil, length: 0) }
            let target = UnsafeMutableRawBufferPointer(rebasing: block[offset..<(offset + bytes.count)])
            target.copyMemory(from: bytes)
            offset += bytes.count
            return sb_bytes(data: target.baseAddress!.assumingMemoryBound(to: UInt8.self), length: bytes.count)
        }
        // The storage stays alive and unchanged for the whole call: `steps` holds every record's kept item, which
        // is never written once made, so the pointers `withKeyAndPayload` gives stay valid past its closure.
        func pointing(at bytes: UnsafeRawBufferPointer) -> sb_bytes {
            bytes.isEmpty ? sb_bytes(data: nil, length: 0)
                : sb_bytes(data: bytes.baseAddress!.assumingMemoryBound(to: UInt8.self), length: bytes.count)
        }
        let none = sb_bytes(data: nil, length: 0)
        for index in steps.indices {  // not `for step in steps`: that copies each step out
            let cStep: sb_step
            switch steps[index] {
            case .put(let record):
                cStep = record.withKeyAndPayload { key, payload in
                    sb_step(
                        kind: UInt32(SB_STEP_PUT), reserved: 0, key: pointing(at: key), payload: pointing(at: payload),
                        created_at: record.createdAt, updated_at: record.updatedAt)
                }
            case .remove(let key):
                cStep = sb_step(
                    kind: UInt32(SB_STEP_REMOVE), reserved: 0, key: key.withUnsafeBytes(place), payload: none,
                    created_at: 0, updated_at: 0)
            case .removeAll:
                cStep = sb_step(
                    kind: UInt32(SB_STEP_REMOVE_ALL), reserved: 0, key: none, payload: none, created_at: 0, updated_at: 0)
            }
            (cSteps + index).initialize(to: cStep)
        }
        return try body(steps.isEmpty ? nil : UnsafePointer(cSteps), steps.count)
    }

}
