import Synchronization
import NIOCore
import OrderedStorage
import StoreModel

/// The committed items of one store, in store order, as the broker holds them in memory.
///
/// Only the store's writer changes it, and only by replaying the steps of a commit the engine has already made
/// durable (`apply(_:)`), the same steps every subscriber receives, so memory, engine and subscribers cannot
/// disagree.
///
/// An item is one allocation, its id's UTF-8 followed by its payload (`KeptItem`): the planner builds it so once,
/// its events and history share it, and memory keeps it with a reference per item in the table. A record read
/// back gets its id and payload as views of it (no copy, no `String`).
public struct StoreContents: Sendable {
    /// An item, the table's key: hashed and compared by the id's bytes, exactly as `ItemID` is, so an `ItemID`
    /// finds it.
    fileprivate struct StoredItem: TableKey, Sendable {
        let item: KeptItem

        var tableHash: Int { item.idHash }

        static func == (lhs: StoredItem, rhs: StoredItem) -> Bool { rhs.item.withID { lhs.hasID($0) } }

        func hash(into hasher: inout Hasher) { hasher.combine(tableHash) }

        @inline(__always)
        func hasID(_ id: ItemID) -> Bool {
            id.withUTF8 { hasID($0) }
        }

        @inline(__always)
        private func hasID(_ id: UnsafeRawBufferPointer) -> Bool {
            item.withID { mine in mine.count == id.count && IDBytes.equal(mine, id) }
        }

        var id: ItemID { ItemID(kept: item) }

        var payload: Payload { Payload(kept: item) }

        /// The record's kept item when the planner made it (its id and payload are views of the same one), else
        /// a copy made so. Inlined, the id's bytes read in place: an opaque call retains the id (see `ItemID.==`).
        @inline(__always)
        init(id: ItemID, payload: Payload) {
            if let item = payload.keptItem, id.keptItem?.isSame(as: item) == true {
                self.item = item
            } else {
                self.item = id.withUTF8 { id in payload.withUnsafeReadableBytes { KeptItem.make(id: id, payload: $0) } }
            }
        }

        init(id: UnsafeRawBufferPointer, payload: UnsafeRawBufferPointer) {
            item = KeptItem.make(id: id, payload: payload)
        }

        func record(createdAt: UInt64, updatedAt: UInt64, id: ItemID? = nil) -> ItemRecord {
            ItemRecord(id: id ?? self.id, createdAt: createdAt, updatedAt: updatedAt, payload: payload)
        }
    }

    fileprivate struct Stamps: Sendable {
        var createdAt: UInt64
        var updatedAt: UInt64
    }

    private var table = OrderedTable<StoredItem, Stamps>()

    public init() {}

    public var count: Int { table.count }

    /// Room for `count` items without growing.
    public mutating func reserveCapacity(_ count: Int) {
        table.reserveCapacity(min(count, 1 << 28))
    }

    /// Adds a record an engine hands out while the store loads, copied into storage of its own.
    mutating func load(_ scanned: ScannedRecord) {
        table.put(
            StoredItem(id: scanned.key, payload: scanned.payload),
            Stamps(createdAt: scanned.createdAt, updatedAt: scanned.updatedAt))
    }

    public func record(_ id: ItemID) -> ItemRecord? {
        guard let (item, stamps) = table.entry(hash: id.tableHash, matching: { $0.hasID(id) }) else { return nil }
        return item.record(createdAt: stamps.createdAt, updatedAt: stamps.updatedAt, id: id)
    }

    /// When the item was created, if the store holds it (`hash`: the id's `tableHash`): a lookup that copies nothing
    /// out.
    func createdAt(_ id: ItemID, hash: Int) -> UInt64? {
        table.value(hash: hash, matching: { $0.hasID(id) })?.createdAt
    }

    /// For each of these ids' hashes, whether no item can have it (`OrderedTable.certainlyAbsent(hash:)`): one
    /// pass over the index for a whole batch, its cache misses overlapping, before any id is looked up.
    func certainlyAbsent(hashes: [Int]) -> [Bool] {
        hashes.map { table.certainlyAbsent(hash: $0) }
    }

    /// Brings into the cache what looking up these ids will read (`OrderedTable.warm(hashes:)`), all before the
    /// first lookup, so that a group of single inserts into a large store does not wait for memory one id at a time.
    func warm(_ hashes: UnsafeBufferPointer<Int>) {
        let sum = table.warm(hashes: hashes)
        // The loads must happen. With their sum unused the optimizer removes them, and the lookups that follow
        // miss the cache twice each (the slot, then the kept item). A branch on the sum keeps them; it is
        // practically never taken, and harmless when it is.
        if _slowPath(sum == Self.improbableSum) { Self.warmedToTheImprobableSum() }
    }

    private static let improbableSum = Int(bitPattern: 0x5EED_CAFE_F00D_D00D)
    private static let improbableSums = Atomic<Int>(0)

    @inline(never)
    private static func warmedToTheImprobableSum() { improbableSums.add(1, ordering: .relaxed) }

    public func contains(_ id: ItemID) -> Bool {
        table.contains(hash: id.tableHash, matching: { $0.hasID(id) })
    }

    /// Every record, in store order.
    public var records: [ItemRecord] { collect(after: nil, limit: 0) { $0.record(createdAt: $1.createdAt, updatedAt: $1.updatedAt) } ?? [] }

    /// Every id, in store order.
    public var ids: [ItemID] { collect(after: nil, limit: 0) { item, _ in item.id } ?? [] }

    /// Up to `limit` records (0: no limit) after `cursor` (or from the start), in store order; `nil` when the
    /// cursor's id is not in the store.
    public func records(after cursor: ItemID?, limit: Int) -> [ItemRecord]? {
        collect(after: cursor, limit: limit) { $0.record(createdAt: $1.createdAt, updatedAt: $1.updatedAt) }
    }

    /// Like `records(after:limit:)`, ids only.
    public func ids(after cursor: ItemID?, limit: Int) -> [ItemID]? {
        collect(after: cursor, limit: limit) { item, _ in item.id }
    }

    private func collect<T>(after cursor: ItemID?, limit: Int, _ transform: (StoredItem, Stamps) -> T) -> [T]? {
        var out: [T] = []
        out.reserveCapacity(limit == 0 ? table.count : min(limit, table.count))
        let visit: (StoredItem, Stamps) -> Bool = { item, stamps in
            out.append(transform(item, stamps))
            return limit == 0 || out.count < limit
        }
        if let cursor {
            guard table.forEach(afterHash: cursor.tableHash, matching: { $0.hasID(cursor) }, visit) else { return nil }
        } else {
            table.forEach(visit)
        }
        return out
    }

    /// What the planner knew of an inserted record's id: its `tableHash`, and whether memory holds it when the
    /// record is replayed.
    struct InsertHint {
        var hash: Int
        var absent: Bool
    }

    /// What applying commits let go of: the items inserts replaced and removes took out, the table a `removeAll`
    /// emptied. Held by the caller and released where it chooses (the broker's writer, after its turn: the
    /// frees are then off the serial commit).
    struct Released: Sendable {
        fileprivate var items: [StoredItem] = []
        fileprivate var tables: [OrderedTable<StoredItem, Stamps>] = []
    }

    /// `apply(_:)` with the planner's hints for the inserted records, in order from `next` (which moves past
    /// them): an id is neither hashed nor, when absent, looked up a second time. What the steps replace or remove
    /// goes to `released` instead of being released here.
    mutating func apply(_ steps: [EventStep], hints: [InsertHint], from next: inout Int, released: inout Released) {
        for step in steps {
            switch step {
            case .insert(let records):
                for index in records.indices {
                    let hint = hints[next]
                    next += 1
                    if let old = table.put(
                        StoredItem(id: records[index].id, payload: records[index].payload),
                        Stamps(createdAt: records[index].createdAt, updatedAt: records[index].updatedAt),
                        hash: hint.hash, absent: hint.absent)
                    {
                        released.items.append(old.key)
                    }
                }
            case .remove(let ids): remove(ids, released: &released)
            }
        }
    }

    /// Removes `ids`, moving what goes to `released`.
    private mutating func remove(_ ids: [ItemID], released: inout Released) {
        if ids.count == table.count, ids.count > 64 {
            // A removeAll: cheaper to start over than to remove one by one (the old table goes whole).
            released.tables.append(table)
            table = OrderedTable()
        } else {
            for id in ids {
                if let old = table.remove(hash: id.tableHash, matching: { $0.hasID(id) }) { released.items.append(old.key) }
            }
        }
    }

    /// Replays the steps of a commit: inserted records replace in place or go last, removed ids go.
    public mutating func apply(_ steps: [EventStep]) {
        for step in steps {
            switch step {
            case .insert(let records):
                for index in records.indices {  // not `for record in records`: that copies each record out
                    table.put(
                        StoredItem(id: records[index].id, payload: records[index].payload),
                        Stamps(createdAt: records[index].createdAt, updatedAt: records[index].updatedAt))
                }
            case .remove(let ids):
                var released = Released()  // released at once
                remove(ids, released: &released)
            }
        }
    }
}
