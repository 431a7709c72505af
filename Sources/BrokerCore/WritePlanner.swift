import NIOCore
import StoreModel

/// Works out the effect of consecutive write requests on a store without touching it, so that several
/// requests can share one engine transaction (group commit) while each keeps its own sequence.
///
/// The committed contents stay untouched (readers keep reading them while the engine works); the changes of
/// the requests planned so far live in an overlay on top. After the engine has committed, the events are
/// replayed on the contents (`StoreContents.apply`).
struct WritePlanner {
    /// The committed contents.
    private let base: StoreContents
    /// Every committed id is gone (a removeAll was planned).
    private var baseCleared = false
    /// Committed ids removed by a planned request: their committed position no longer counts.
    private var hidden: Set<ItemID> = []
    /// What the requests planned so far did to each id they touched.
    private var overlay: [ItemID: Touched] = [:]
    /// Ids appended by planned requests, in order; an id appended twice counts at its latest position.
    private var appended: [ItemID] = []
    /// The engine steps of every request planned so far, in order: one transaction for the group.
    private(set) var engineSteps: [EngineStep] = []

    private struct Touched {
        /// The current record; `nil` once removed.
        var record: ItemRecord?
        /// Where a planned request appended the id (`appended`), if one did.
        var appendedAt: Int?
    }

    /// `items` is how many items the group's requests insert, `remembered` how many of them the requests after
    /// the first ones insert (all but the last request's), to reserve room for them once.
    init(base: StoreContents, items: Int = 0, remembered: Int = 0) {
        self.base = base
        engineSteps.reserveCapacity(items)
        if remembered > 0 {
            overlay.reserveCapacity(remembered)
            appended.reserveCapacity(remembered)
        }
    }

    /// When `id` was created, if it is present after the requests planned so far.
    /// `notInBase`: the committed contents are known not to hold `id` (`StoreContents.certainlyAbsent(hashes:)`).
    private func createdAt(_ id: ItemID, hash: Int? = nil, notInBase: Bool = false) -> UInt64? {
        if !overlay.isEmpty, let touched = overlay[id] { return touched.record?.createdAt }
        if notInBase || baseCleared || (!hidden.isEmpty && hidden.contains(id)) { return nil }
        return base.createdAt(id, hash: hash ?? id.tableHash)
    }

    /// Every id present after the requests planned so far, in store order.
    private func currentIDs() -> [ItemID] {
        var out: [ItemID] = []
        if !baseCleared {
            for id in base.ids where !hidden.contains(id) { out.append(id) }
        }
        for (position, id) in appended.enumerated() {
            if let touched = overlay[id], touched.appendedAt == position, touched.record != nil { out.append(id) }
        }
        return out
    }

    /// Plans one request: the steps of its event (only what really changes), `nil` when it changes nothing; its
    /// engine steps join `engineSteps`. `now` stamps the records it writes. `last` says no request is planned
    /// after this one, so what it does need not be remembered for the next.
    mutating func plan(_ operation: WriteOperation, now: UInt64, last: Bool = false) -> [EventStep]? {
        var events: [EventStep] = []
        switch operation {
        case .insert(let items): insert(items, now: now, remember: !last, into: &events)
        case .remove(let ids): remove(ids, into: &events)
        case .removeAll: removeAll(into: &events)
        case .chain(let steps):
            for step in steps {
                switch step {
                case .insert(let items): insert(items, now: now, remember: true, into: &events)
                case .remove(let ids): remove(ids, into: &events)
                case .removeAll: removeAll(into: &events)
                }
            }
        }
        return events.isEmpty ? nil : events
    }

    /// In one batch the first occurrence of an id fixes its position and the last payload wins. Each id is
    /// hashed once for finding repeats and the committed contents (`tableHash`), once more for the overlay when
    /// there is one, and once more when `remember` records it for the requests planned after this one.
    private mutating func insert(
        _ items: [Item], now: UInt64, remember: Bool, into events: inout [EventStep]
    ) {
        guard !items.isEmpty else { return }
        var records: [ItemRecord] = []
        records.reserveCapacity(items.count)
        let firstStep = engineSteps.count
        engineSteps.reserveCapacity(firstStep + items.count)
        if remember { overlay.reserveCapacity(overlay.count + items.count) }
        // Each id hashed once, for finding repeats and for the committed contents' index; and, for a batch, the
        // index's first bucket read for all ids before any lookup, so that their cache misses overlap (a batch
        // into a large store spent most of its lookups waiting for memory, one miss after another), an empty one
        // saying the id is new without a lookup.
        let hashes = items.count > 1 ? items.map { $0.id.tableHash } : []
        let absent = items.count > 1 && !baseCleared ? base.certainlyAbsent(hashes: hashes) : []
        var seen = items.count > 1 ? FirstSeen(capacity: items.count) : nil
        for index in items.indices {
            let (payload, key) = Self.kept(items[index])
            let id = items[index].id
            let hash = items.count > 1 ? hashes[index] : id.tableHash
            if let earlier = seen?.earlier(hash: hash, id: id, in: records, adding: records.count) {
                records[earlier].payload = payload
                engineSteps[firstStep + earlier] = .put(Self.engineRecord(records[earlier], key: key))
                if remember { overlay[id]?.record = records[earlier] }
                continue
            }
            let existing = createdAt(id, hash: hash, notInBase: !absent.isEmpty && absent[index])
            let record = ItemRecord(id: id, createdAt: existing ?? now, updatedAt: now, payload: payload)
            records.append(record)
            engineSteps.append(.put(Self.engineRecord(record, key: key)))
            guard remember else { continue }
            let position = appended.count
            modify(&overlay[id, default: Touched()]) { touched in
                touched.record = record
                if existing == nil { touched.appendedAt = position }
            }
            if existing == nil { appended.append(id) }
        }
        append(.insert(records: records), to: &events)
    }

    /// The payload of a record: it outlives the request (memory, history), so it owns its bytes, in one
    /// allocation with the id's bytes in front, as memory keeps an item (`StoreContents`); and the id's bytes
    /// as a view of that same allocation, for the engine.
    private static func kept(_ item: Item) -> (payload: Payload, key: ByteBuffer) {
        let payload = item.payload.bytes.withUnsafeReadableBytes { payload in
            item.id.string.utf8.withContiguousStorageIfAvailable {
                Payload(owning: payload, prefix: UnsafeRawBufferPointer($0))
            } ?? Array(item.id.string.utf8).withUnsafeBytes { Payload(owning: payload, prefix: $0) }
        }
        var key = payload.bytes
        let idLength = key.readerIndex
        key.moveReaderIndex(to: 0)
        key.moveWriterIndex(to: idLength)
        return (payload, key)
    }

    private static func engineRecord(_ record: ItemRecord, key: ByteBuffer) -> EngineRecord {
        EngineRecord(keyBytes: key, payload: record.payload.bytes, createdAt: record.createdAt, updatedAt: record.updatedAt)
    }

    private mutating func remove(_ ids: [ItemID], into events: inout [EventStep]) {
        var removed: [ItemID] = []
        for id in ids where createdAt(id) != nil {
            markRemoved(id)
            removed.append(id)
            engineSteps.append(.remove(key: Array(id.string.utf8)))
        }
        guard !removed.isEmpty else { return }
        append(.remove(ids: removed), to: &events)
    }

    private mutating func markRemoved(_ id: ItemID) {
        overlay[id, default: Touched()].record = nil
        if !baseCleared, base.contains(id) { hidden.insert(id) }
    }

    private mutating func removeAll(into events: inout [EventStep]) {
        let ids = currentIDs()
        guard !ids.isEmpty else { return }
        baseCleared = true
        hidden = []
        overlay = [:]
        appended = []
        engineSteps.append(.removeAll)
        append(.remove(ids: ids), to: &events)
    }

    /// Adds a step to the event, merging it into the previous step of the same op.
    private func append(_ step: EventStep, to events: inout [EventStep]) {
        switch (events.last, step) {
        case (.insert(let previous)?, .insert(let records)):
            // Merge only when no id repeats, so the event still says exactly what happened in order.
            let seen = Set(previous.map { $0.id })
            if records.allSatisfy({ !seen.contains($0.id) }) {
                events[events.count - 1] = .insert(records: previous + records)
                return
            }
        case (.remove(let previous)?, .remove(let ids)):
            events[events.count - 1] = .remove(ids: previous + ids)
            return
        default: break
        }
        events.append(step)
    }
}

/// The first record of each id in one insert: an open-addressed index of positions in the records, by the ids'
/// hashes (already computed for the committed contents' index), where a `Dictionary<ItemID, Int>` hashed every
/// id a second time.
private struct FirstSeen {
    /// Each bucket: the hash's low 32 bits and the position + 1 (0: empty).
    private var buckets: [UInt64]
    private let mask: Int

    init(capacity: Int) {
        var count = 16
        while count < capacity * 2 { count <<= 1 }
        buckets = Array(repeating: 0, count: count)
        mask = count - 1
    }

    /// The position of an earlier record with `id`, if there is one; else `position` is remembered for it.
    mutating func earlier(hash: Int, id: ItemID, in records: [ItemRecord], adding position: Int) -> Int? {
        let tag = UInt64(truncatingIfNeeded: UInt32(truncatingIfNeeded: hash))
        var index = Int(tag) & mask
        while true {
            let bucket = buckets[index]
            if bucket == 0 {
                buckets[index] = tag << 32 | UInt64(position + 1)
                return nil
            }
            let found = Int(bucket & 0xFFFF_FFFF) - 1
            if bucket >> 32 == tag, records[found].id == id { return found }
            index = (index + 1) & mask
        }
    }
}

/// Changes a value in place: `modify(&table[key, default: ...]) { ... }` finds the key once.
private func modify<T>(_ value: inout T, _ body: (inout T) -> Void) { body(&value) }

extension WriteOperation {
    /// How many items the operation inserts (repeats counted), for reserving room before planning.
    var insertedItemCount: Int {
        switch self {
        case .insert(let items): items.count
        case .remove, .removeAll: 0
        case .chain(let steps):
            steps.reduce(0) { total, step in
                if case .insert(let items) = step { total + items.count } else { total }
            }
        }
    }
}
