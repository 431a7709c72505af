import CStorageEngine
import OrderedStorage
import StorageEngineKit

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

    func open(directory: String, store: String, options: [String: String]) throws(EngineError)
        -> (store: any EngineStoreImplementation, sequence: UInt64)
    {
        (MemoryStore(failure: try FailureInjection(options: options)), 0)
    }

    func drop(directory: String, store: String, options: [String: String]) throws(EngineError) {}
}

struct Entry {
    var payload: [UInt8]
    var createdAt: UInt64
    var updatedAt: UInt64
}

final class MemoryStore: EngineStoreImplementation {
    private var table = OrderedTable<[UInt8], Entry>()
    private var sequence: UInt64 = 0
    private let failure: FailureInjection

    init(failure: FailureInjection) {
        self.failure = failure
    }

    func apply(_ steps: UnsafeBufferPointer<sb_step>, sequence: UInt64) throws(EngineError) {
        table.begin()
        do throws(EngineError) {
            for (index, step) in steps.enumerated() {
                try failure.check(stepIndex: index)
                switch Int(step.kind) {
                case SB_STEP_PUT:
                    table.put(
                        step.key.bytes,
                        Entry(payload: step.payload.bytes, createdAt: step.created_at, updatedAt: step.updated_at))
                case SB_STEP_REMOVE: table.remove(step.key.bytes)
                case SB_STEP_REMOVE_ALL: table.removeAll()
                default: throw EngineError.invalid("unknown step kind \(step.kind)")
                }
            }
        } catch {
            table.rollback()
            throw error
        }
        table.commit()
        self.sequence = sequence
    }

    func get(_ keys: UnsafeBufferPointer<sb_bytes>, emit: (Int, UnsafePointer<sb_item>?) -> Bool) throws(EngineError) {
        for (index, key) in keys.enumerated() {
            let bytes = key.bytes
            let keepGoing =
                if let entry = table.value(for: bytes) {
                    withItem(key: bytes, payload: entry.payload, createdAt: entry.createdAt, updatedAt: entry.updatedAt) {
                        emit(index, $0)
                    }
                } else {
                    emit(index, nil)
                }
            guard keepGoing else { throw EngineError.stopped }
        }
    }

    func scan(emit: (UnsafePointer<sb_item>) -> Bool) throws(EngineError) {
        try table.visit { key, entry in
            withItem(key: key, payload: entry.payload, createdAt: entry.createdAt, updatedAt: entry.updatedAt, emit)
        }
    }

    func count() throws(EngineError) -> UInt64 { UInt64(table.count) }

    func keys(emit: (sb_bytes) -> Bool) throws(EngineError) { try table.emitKeys(emit) }

    func contains(_ key: sb_bytes) throws(EngineError) -> Bool { table.contains(key.bytes) }

    func close() {}
}
