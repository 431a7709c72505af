import NIOCore
import OrderedStorage
import StoreModel

/// The committed items of one store, in store order, as the broker holds them in memory.
///
/// Only the store's writer changes it, and only by replaying the steps of a commit the engine has already made
/// durable (`apply(_:)`), the same steps every subscriber receives, so memory, engine and subscribers cannot
/// disagree.
public struct StoreContents: Sendable {
    /// A record without its id (the table's key holds that): 16 bytes less per item.
    private struct Stored: Sendable {
        var createdAt: UInt64
        var updatedAt: UInt64
        var payload: Payload

        init(createdAt: UInt64, updatedAt: UInt64, payload: Payload) {
            self.createdAt = createdAt
            self.updatedAt = updatedAt
            self.payload = payload
        }

        init(_ record: ItemRecord) {
            createdAt = record.createdAt
            updatedAt = record.updatedAt
            payload = record.payload
        }

        func record(_ id: ItemID) -> ItemRecord {
            ItemRecord(id: id, createdAt: createdAt, updatedAt: updatedAt, payload: payload)
        }
    }

    private var table = OrderedTable<ItemID, Stored>()

    public init() {}

    public init(records: [ItemRecord]) {
        table.reserveCapacity(records.count)
        for record in records { table.put(record.id, Stored(record)) }
    }

    public var count: Int { table.count }

    /// Room for `count` items without growing.
    public mutating func reserveCapacity(_ count: Int) {
        table.reserveCapacity(min(count, 1 << 28))
    }

    /// Adds a record an engine hands out while the store loads: the id and the payload in storage of their own,
    /// sized to them.
    mutating func load(_ scanned: ScannedRecord) {
        var payload = ByteBufferAllocator().buffer(capacity: scanned.payload.count)
        payload.writeBytes(scanned.payload)
        let id = ItemID(String(decoding: scanned.key, as: UTF8.self))
        table.put(id, Stored(createdAt: scanned.createdAt, updatedAt: scanned.updatedAt, payload: Payload(payload)))
    }

    public func record(_ id: ItemID) -> ItemRecord? { table.value(for: id)?.record(id) }

    public func contains(_ id: ItemID) -> Bool { table.contains(id) }

    /// Every record, in store order.
    public var records: [ItemRecord] { collect(after: nil, limit: 0) { $1.record($0) } ?? [] }

    /// Every id, in store order.
    public var ids: [ItemID] { collect(after: nil, limit: 0) { id, _ in id } ?? [] }

    /// Up to `limit` records (0: no limit) after `cursor` (or from the start), in store order; `nil` when the
    /// cursor's id is not in the store.
    public func records(after cursor: ItemID?, limit: Int) -> [ItemRecord]? {
        collect(after: cursor, limit: limit) { $1.record($0) }
    }

    /// Like `records(after:limit:)`, ids only.
    public func ids(after cursor: ItemID?, limit: Int) -> [ItemID]? {
        collect(after: cursor, limit: limit) { id, _ in id }
    }

    private func collect<T>(after cursor: ItemID?, limit: Int, _ transform: (ItemID, Stored) -> T) -> [T]? {
        var out: [T] = []
        out.reserveCapacity(limit == 0 ? table.count : min(limit, table.count))
        let visit: (ItemID, Stored) -> Bool = { id, record in
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
                for record in records { table.put(record.id, Stored(record)) }
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
