import CStorageEngine
import StorageEngineKit

// The memory engine: a store's items live in the broker's memory only, and start empty on every open. For
// tests, previews and caches. It keeps no items of its own: a store of an engine without SB_CAP_PERSISTENT
// opens empty every time, and the host reads a store only when it opens it, so a copy kept here would never be
// read (it cost a quarter of the daemon's CPU per 1,000-item batch, and a third of its memory). An apply checks
// its steps (keys, kinds, the injected failure) and keeps nothing, not even the sequence (a reopen starts at 0).
// Atomic, trivially: nothing an apply does outlives it.

@_cdecl("storebroker_engine_entry")
public func storebrokerEngineEntry() -> UnsafePointer<storebroker_engine> { memoryEngineTable }

nonisolated(unsafe) private let memoryEngineTable = EngineExport.table(for: MemoryEngine())

final class MemoryEngine: EngineDefinition {
    let name = "memory"
    let version = "2.0.0"
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

final class MemoryStore: EngineStoreImplementation {
    private let failure: FailureInjection

    init(failure: FailureInjection) {
        self.failure = failure
    }

    func apply(_ steps: UnsafeBufferPointer<sb_step>, sequence: UInt64) throws(EngineError) {
        for (index, step) in steps.enumerated() {
            try failure.check(stepIndex: index)
            try step.checkKey()
            guard (SB_STEP_PUT...SB_STEP_REMOVE_ALL).contains(Int(step.kind)) else {
                throw EngineError.invalid("unknown step kind \(step.kind)")
            }
        }
    }

    /// A store opens empty and keeps nothing: there is nothing to scan.
    func scan(emit: (UnsafePointer<sb_item>) -> Bool) throws(EngineError) {}

    func count() throws(EngineError) -> UInt64 { 0 }

    func close() {}
}
