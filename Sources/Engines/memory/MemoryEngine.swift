import CStorageEngine
import OrderedStorage
import StorageEngineKit

#if canImport(Glibc)
import Glibc
#endif

// The memory engine: stores live in the process only and start empty on every open. For tests and
// previews. Atomic (apply rolls back through the table's undo log), not persistent.

@_cdecl("storebroker_engine_entry")
public func storebrokerEngineEntry() -> UnsafePointer<storebroker_engine> { memoryEngineTable }

nonisolated(unsafe) private let memoryEngineTable = EngineExport.table(for: MemoryEngine())

final class MemoryEngine: EngineDefinition {
    let name = "memory"
    let version = "1.0.0"
    let capabilities = UInt64(SB_CAP_ATOMIC | SB_CAP_NONBLOCKING)
    let optionKeys = [FailureInjection.optionKey]

    func checkOptions(_ options: [String: String]) throws(EngineError) {
        _ = try FailureInjection(options: options)
    }

    func open(directory: String, store: String, options: [String: String]) throws(EngineError)
        -> (store: any EngineStoreImplementation, sequence: UInt64)
    {
        (MemoryStore(failure: try FailureInjection(options: options)), 0)
    }

    func drop(directory: String, store: String, options: [String: String]) throws(EngineError) {}
}

/// One item: its key's bytes then its payload's, in one array (one allocation per item), hashed and compared by
/// the key alone, so the table finds an item by the key bytes a call hands in.
struct Entry: TableKey {
    var bytes: [UInt8]
    var keyLength: Int

    init(key: sb_bytes, payload: sb_bytes) {
        keyLength = key.length
        bytes = []
        bytes.reserveCapacity(key.length + payload.length)
        if let data = key.data { bytes.append(contentsOf: UnsafeBufferPointer(start: data, count: key.length)) }
        if let data = payload.data { bytes.append(contentsOf: UnsafeBufferPointer(start: data, count: payload.length)) }
    }

    static func hash(_ key: UnsafeRawBufferPointer) -> Int {
        var hasher = Hasher()
        hasher.combine(bytes: key)
        return hasher.finalize()
    }

    var tableHash: Int { bytes.withUnsafeBytes { Self.hash(UnsafeRawBufferPointer(rebasing: $0[..<keyLength])) } }

    func hash(into hasher: inout Hasher) { hasher.combine(tableHash) }

    static func == (lhs: Entry, rhs: Entry) -> Bool {
        rhs.bytes.withUnsafeBytes { lhs.hasKey(UnsafeRawBufferPointer(rebasing: $0[..<rhs.keyLength])) }
    }

    func hasKey(_ key: UnsafeRawBufferPointer) -> Bool {
        guard key.count == keyLength else { return false }
        return bytes.withUnsafeBytes { mine in keyLength == 0 || memcmp(mine.baseAddress!, key.baseAddress!, keyLength) == 0 }
    }

    /// Calls `body` with an `sb_item` pointing into the entry.
    func withItem<R>(_ stamps: Stamps, _ body: (UnsafePointer<sb_item>) -> R) -> R {
        bytes.withUnsafeBufferPointer { all in
            var item = sb_item(
                key: sb_bytes(data: all.baseAddress, length: keyLength),
                payload: sb_bytes(data: all.baseAddress.map { $0 + keyLength }, length: all.count - keyLength),
                created_at: stamps.createdAt, updated_at: stamps.updatedAt)
            return withUnsafePointer(to: &item, body)
        }
    }
}

struct Stamps {
    var createdAt: UInt64
    var updatedAt: UInt64
}

extension sb_bytes {
    var raw: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: data, count: length) }
}

final class MemoryStore: EngineStoreImplementation {
    private var table = OrderedTable<Entry, Stamps>()
    private var sequence: UInt64 = 0
    private let failure: FailureInjection

    init(failure: FailureInjection) {
        self.failure = failure
    }

    func apply(_ steps: UnsafeBufferPointer<sb_step>, sequence: UInt64) throws(EngineError) {
        // One step either happens or throws before it changes anything: no undo log needed.
        let logged = steps.count > 1
        if logged { table.begin() }
        do throws(EngineError) {
            for (index, step) in steps.enumerated() {
                try failure.check(stepIndex: index)
                try step.checkKey()
                switch Int(step.kind) {
                case SB_STEP_PUT:
                    table.put(
                        Entry(key: step.key, payload: step.payload),
                        Stamps(createdAt: step.created_at, updatedAt: step.updated_at))
                case SB_STEP_REMOVE:
                    let key = step.key.raw
                    table.remove(hash: Entry.hash(key), matching: { $0.hasKey(key) })
                case SB_STEP_REMOVE_ALL: table.removeAll()
                default: throw EngineError.invalid("unknown step kind \(step.kind)")
                }
            }
        } catch {
            if logged { table.rollback() }
            throw error
        }
        if logged { table.commit() }
        self.sequence = sequence
    }

    func scan(emit: (UnsafePointer<sb_item>) -> Bool) throws(EngineError) {
        var stopped = false
        table.forEach { entry, stamps in
            stopped = !entry.withItem(stamps, emit)
            return !stopped
        }
        if stopped { throw EngineError.stopped }
    }

    func count() throws(EngineError) -> UInt64 { UInt64(table.count) }

    func close() {}
}
