import OrderedStorage
import StoreModel

/// The committed items of one store, in store order, as the broker holds them in memory.
///
/// Only the store's writer changes it, and only by replaying the steps of a commit the engine has already made
/// durable (`apply(_:)`), the same steps every subscriber receives, so memory, engine and subscribers cannot
/// disagree.
public struct StoreContents: Sendable {
    private var table = OrderedTable<ItemID, ItemRecord>()

    public init() {}

    public init(records: [ItemRecord]) {
        for record in records { table.put(record.id, record) }
    }

    public var count: Int { table.count }

    public func record(_ id: ItemID) -> ItemRecord? { table.value(for: id) }

    public func contains(_ id: ItemID) -> Bool { table.contains(id) }

    /// Every record, in store order.
    public var records: [ItemRecord] { collect(after: nil, limit: 0) { $1 } ?? [] }

    /// Every id, in store order.
    public var ids: [ItemID] { collect(after: nil, limit: 0) { id, _ in id } ?? [] }

    /// Up to `limit` records (0: no limit) after `cursor` (or from the start), in store order; `nil` when the
    /// cursor's id is not in the store.
    public func records(after cursor: ItemID?, limit: Int) -> [ItemRecord]? {
        collect(after: cursor, limit: limit) { $1 }
    }

    /// Like `records(after:limit:)`, ids only.
    public func ids(after cursor: ItemID?, limit: Int) -> [ItemID]? {
        collect(after: cursor, limit: limit) { id, _ in id }
    }

    private func collect<T>(after cursor: ItemID?, limit: Int, _ transform: (ItemID, ItemRecord) -> T) -> [T]? {
        var out: [T] = []
        out.reserveCapacity(limit == 0 ? table.count : min(limit, table.count))
        let visit: (ItemID, ItemRecord) -> Bool = { id, record in
            out.append(transform(id, record))
            return limit == 0 || out.count < limit
        }
        if let cursor {
            guard table.forEach(after: cursor, visit) else { return nil }
        } else {
            table.forEach(visit)
        }
        return out
    }

    /// Replays the steps of a commit: inserted records replace in place or go last, removed ids go.
    public mutating func apply(_ steps: [EventStep]) {
        for step in steps {
            switch step {
            case .insert(let records):
                for record in records { table.put(record.id, record) }
            case .remove(let ids):
                if ids.count == table.count, ids.count > 64 {
                    // A removeAll: cheaper to start over than to remove one by one.
                    table.removeAll()
                } else {
                    for id in ids { table.remove(id) }
                }
            }
        }
    }
}
