import StorageEngineKit

#if canImport(Glibc)
import Glibc
#endif

// What the log does to the snapshot it follows, and the store it makes: the merge that `count`, `scan` and a
// new snapshot all read the store through. The engine keeps no copy of the items (the daemon holds them all in
// memory); it reads them back from its files when asked, holding in memory only what the log changed, which a
// snapshot keeps bounded.

/// Key bytes compared and hashed as bytes; they belong to a mapping that outlives the value.
package struct KeyBytes: Hashable {
    package let bytes: UnsafeRawBufferPointer

    package static func == (a: KeyBytes, b: KeyBytes) -> Bool {
        a.bytes.count == b.bytes.count && (a.bytes.count == 0 || memcmp(a.bytes.baseAddress!, b.bytes.baseAddress!, a.bytes.count) == 0)
    }

    package func hash(into hasher: inout Hasher) { hasher.combine(bytes: bytes) }
}

/// The effect of log records on a snapshot, step by step, in the store's order rules: a put of a key the
/// snapshot may hold replaces it in place unless the log removed it first; every other put goes last.
package struct LogEffects {
    private struct Entry {
        var item: WALItem
        /// The put may replace a snapshot item in place: no remove or remove-all of its key came before it.
        var inPlace: Bool
        var alive = true
        var emitted = false
    }

    /// A remove-all came: no snapshot item survives.
    private var cleared = false
    /// Keys removed since the snapshot (before any later put of them).
    private var removed = Set<KeyBytes>()
    /// The entry of each key put since the snapshot and still present.
    private var touched: [KeyBytes: Int] = [:]
    private var entries: [Entry] = []

    package init() {}

    /// Nothing to change: the snapshot is the store.
    package var isEmpty: Bool { !cleared && removed.isEmpty && touched.isEmpty }

    package mutating func apply(_ step: LogStep) {
        switch step {
        case .put(let item):
            let key = KeyBytes(bytes: item.key)
            if let index = touched[key] {
                entries[index].item = item
            } else {
                touched[key] = entries.count
                entries.append(Entry(item: item, inPlace: !cleared && !removed.contains(key)))
            }
        case .remove(let bytes):
            let key = KeyBytes(bytes: bytes)
            if let index = touched.removeValue(forKey: key) { entries[index].alive = false }
            if !cleared { removed.insert(key) }
        case .removeAll:
            cleared = true
            removed = []
            touched = [:]
            entries = []
        }
    }

    /// The store's items in order: the snapshot's that survive, each replaced by its in-place put, then the
    /// other puts in the order they were made. Stops when `body` returns false (and returns false).
    package mutating func merge(
        into snapshot: SnapshotFile?, _ body: (WALItem) throws(EngineError) -> Bool
    ) throws(EngineError) -> Bool {
        if let snapshot, !cleared {
            let plain = isEmpty
            let completed = try snapshot.forEachItem { (item: WALItem) throws(EngineError) -> Bool in
                if plain { return try body(item) }
                let key = KeyBytes(bytes: item.key)
                if removed.contains(key) { return true }
                if let index = touched[key] {
                    guard entries[index].inPlace else { return true }
                    entries[index].emitted = true
                    return try body(entries[index].item)
                }
                return try body(item)
            }
            guard completed else { return false }
        }
        for entry in entries where entry.alive && !entry.emitted {
            guard try body(entry.item) else { return false }
        }
        return true
    }
}
