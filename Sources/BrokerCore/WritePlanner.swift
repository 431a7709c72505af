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
    private func createdAt(_ id: ItemID) -> UInt64? {
        if !overlay.isEmpty, let touched = overlay[id] { return touched.record?.createdAt }
        if baseCleared || (!hidden.isEmpty && hidden.contains(id)) { return nil }
        return base.createdAt(id)
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
    /// hashed once to find repeats, once per table that may hold it (the overlay, the committed contents), and
    /// once more when `remember` records it for the requests planned after this one.
    private mutating func insert(
        _ items: [Item], now: UInt64, remember: Bool, into events: inout [EventStep]
    ) {
        guard !items.isEmpty else { return }
        var records: [ItemRecord] = []
        records.reserveCapacity(items.count)
        var positions: [ItemID: Int] = [:]
        if items.count > 1 { positions.reserveCapacity(items.count) }
        let firstStep = engineSteps.count
        engineSteps.reserveCapacity(firstStep + items.count)
        if remember { overlay.reserveCapacity(overlay.count + items.count) }
        for item in items {
            let (payload, key) = Self.kept(item)
            if items.count > 1, let earlier = positions.updateValue(records.count, forKey: item.id) {
                positions[item.id] = earlier
                records[earlier].payload = payload
                engineSteps[firstStep + earlier] = .put(Self.engineRecord(records[earlier], key: key))
                if remember { overlay[item.id]?.record = records[earlier] }
                continue
            }
            let existing = createdAt(item.id)
            let record = ItemRecord(id: item.id, createdAt: existing ?? now, updatedAt: now, payload: payload)
            records.append(record)
            engineSteps.append(.put(Self.engineRecord(record, key: key)))
            guard remember else { continue }
            let position = appended.count
            modify(&overlay[item.id, default: Touched()]) { touched in
                touched.record = record
                if existing == nil { touched.appendedAt = position }
            }
            if existing == nil { appended.append(item.id) }
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
            let seen = Set(previous.map(\.id))
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
