import CStorageEngine
import StorageEngineKit
import WALFormat

#if canImport(Glibc)
import Glibc
#endif

// The wal engine: each store is an append-only log of its applies plus, from time to time, a snapshot of its
// items, both in the store's directory (LogFormat.swift has the layout; docs/ENGINE-ABI.md, "wal", the rules).
// The daemon keeps every item in memory, so an engine only has to make applies durable and give the items back
// when a store opens: one apply is one record, one `pwrite`, and under `synchronous=FULL` one `fdatasync`. The
// daemon's group commit makes a commit group one apply, so concurrent writers share that one sync.

@_cdecl("storebroker_engine_entry")
public func storebrokerEngineEntry() -> UnsafePointer<storebroker_engine> { walEngineTable }

nonisolated(unsafe) private let walEngineTable = EngineExport.table(for: WALEngine())

final class WALEngine: EngineDefinition {
    let name = "wal"
    let version = "1.0.0"
    let capabilities = UInt64(SB_CAP_PERSISTENT | SB_CAP_ATOMIC)
    let optionKeys = ["synchronous", "snapshot_log_bytes", FailureInjection.optionKey]

    func checkOptions(_ options: [String: String]) throws(EngineError) {
        _ = try WALSettings(options)
    }

    func open(directory: String, store: String, options: [String: String]) throws(EngineError)
        -> (store: any EngineStoreImplementation, sequence: UInt64)
    {
        let store = try WALStore(directory: directory, settings: try WALSettings(options))
        return (store, store.sequence)
    }

    /// NORMAL: an apply is one `pwrite` (the sync thread syncs), so the daemon commits on its owner loop as for
    /// the memory engine, without the hand-off to a thread and back; FULL: an apply waits for its `fdatasync`.
    func capabilities(under options: [String: String]) -> UInt64 {
        (try? WALSettings(options).full) == false ? capabilities | UInt64(SB_CAP_NONBLOCKING) : capabilities
    }

    /// FULL: none. NORMAL: the sync interval and as long again for the sync itself, as Redis says of `everysec`.
    func powerLossWindow(_ options: [String: String]) throws(EngineError) -> UInt64 {
        try WALSettings(options).full ? 0 : 2 * WALSettings.syncIntervalNanoseconds / 1_000_000
    }

    func drop(directory: String, store: String, options: [String: String]) throws(EngineError) {
        for name in try Files.list(directory)
        where name.hasPrefix("log-") || name.hasPrefix("snapshot-") || name.hasSuffix(".tmp") {
            try Files.remove(directory + "/" + name)
        }
    }
}

/// The options, checked.
struct WALSettings: Sendable {
    /// `FULL`: an apply is synced before it returns. `NORMAL`: written before it returns (it survives the
    /// process), synced within `syncInterval` (a power cut may lose that much, as Redis's `appendfsync everysec`).
    var full: Bool
    /// A log segment this long (or half the snapshot's size, if more) is closed and folded into a new snapshot.
    var snapshotLogBytes: Int
    var failure: FailureInjection

    static let syncIntervalNanoseconds: UInt64 = 1_000_000_000

    init(_ options: [String: String]) throws(EngineError) {
        let synchronous = options["synchronous", default: "NORMAL"].uppercased()
        guard synchronous == "FULL" || synchronous == "NORMAL" else {
            throw EngineError.invalid("synchronous must be FULL or NORMAL, got \(synchronous.debugDescription)")
        }
        full = synchronous == "FULL"
        snapshotLogBytes = try EngineOptions.wholeNumber(options, "snapshot_log_bytes", of: "bytes", atLeast: 4096) ?? 16 << 20
        failure = try FailureInjection(options: options)
    }
}
