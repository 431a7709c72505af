import NIOCore
import StoreModel

/// What one write request does to a store, worked out before the engine sees it.
struct PlannedWrite {
    /// The steps of the event (only what really changes), in request order.
    var events: [EventStep]
    /// The engine steps that make the same change.
    var engineSteps: [EngineStep]
}

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

    private struct Touched {
        /// The current record; `nil` once removed.
        var record: ItemRecord?
        /// Where a planned request appended the id (`appended`), if one did.
        var appendedAt: Int?
    }

    init(base: StoreContents) {
        self.base = base
    }

    private func current(_ id: ItemID) -> ItemRecord? {
        if !overlay.isEmpty, let touched = overlay[id] { return touched.record }
        if baseCleared || (!hidden.isEmpty && hidden.contains(id)) { return nil }
        return base.record(id)
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

    /// Plans one request; `nil` when it changes nothing. `now` stamps the records it writes. `last` says no
    /// request is planned after this one, so what it does need not be remembered for the next.
    mutating func plan(_ operation: WriteOperation, now: UInt64, last: Bool = false) -> PlannedWrite? {
        var planned = PlannedWrite(events: [], engineSteps: [])
        switch operation {
        case .insert(let items): insert(items, now: now, remember: !last, into: &planned)
        case .remove(let ids): remove(ids, into: &planned)
        case .removeAll: removeAll(into: &planned)
        case .chain(let steps):
            for step in steps {
                switch step {
                case .insert(let items): insert(items, now: now, remember: true, into: &planned)
                case .remove(let ids): remove(ids, into: &planned)
                case .removeAll: removeAll(into: &planned)
                }
            }
        }
        return planned.events.isEmpty ? nil : planned
    }

    /// In one batch the first occurrence of an id fixes its position and the last payload wins. Each id is
    /// hashed once to find repeats, once per table that may hold it (the overlay, the committed contents), and
    /// once more when `remember` records it for the requests planned after this one.
    private mutating func insert(
        _ items: [Item], now: UInt64, remember: Bool, into planned: inout PlannedWrite
    ) {
        guard !items.isEmpty else { return }
        var records: [ItemRecord] = []
        var fresh: [Bool] = []
        records.reserveCapacity(items.count)
        fresh.reserveCapacity(items.count)
        var positions: [ItemID: Int] = [:]
        if items.count > 1 { positions.reserveCapacity(items.count) }
        for item in items {
            if items.count > 1, let earlier = positions.updateValue(records.count, forKey: item.id) {
                positions[item.id] = earlier
                records[earlier].payload = Self.kept(item)
                continue
            }
            if let existing = current(item.id) {
                records.append(
                    ItemRecord(id: item.id, createdAt: existing.createdAt, updatedAt: now, payload: Self.kept(item)))
                fresh.append(false)
            } else {
                records.append(ItemRecord(id: item.id, createdAt: now, updatedAt: now, payload: Self.kept(item)))
                fresh.append(true)
            }
        }
        planned.engineSteps.reserveCapacity(planned.engineSteps.count + records.count)
        for record in records {
            planned.engineSteps.append(
                .put(
                    EngineRecord(
                        key: Array(record.id.string.utf8), payload: record.payload.bytes, createdAt: record.createdAt,
                        updatedAt: record.updatedAt)))
        }
        if remember {
            overlay.reserveCapacity(overlay.count + records.count)
            for (record, isNew) in zip(records, fresh) {
                let position = appended.count
                modify(&overlay[record.id, default: Touched()]) { touched in
                    touched.record = record
                    if isNew { touched.appendedAt = position }
                }
                if isNew { appended.append(record.id) }
            }
        }
        append(.insert(records: records), to: &planned)
    }

    /// The payload of a record: it outlives the request (memory, history), so it owns its bytes, in one
    /// allocation with the id's bytes in front, as memory keeps an item (`StoreContents`).
    private static func kept(_ item: Item) -> Payload {
        item.payload.bytes.withUnsafeReadableBytes { payload in
            item.id.string.utf8.withContiguousStorageIfAvailable {
                Payload(owning: payload, prefix: UnsafeRawBufferPointer($0))
            } ?? Array(item.id.string.utf8).withUnsafeBytes { Payload(owning: payload, prefix: $0) }
        }
    }

    private mutating func remove(_ ids: [ItemID], into planned: inout PlannedWrite) {
        var removed: [ItemID] = []
        for id in ids where current(id) != nil {
            markRemoved(id)
            removed.append(id)
            planned.engineSteps.append(.remove(key: Array(id.string.utf8)))
        }
        guard !removed.isEmpty else { return }
        append(.remove(ids: removed), to: &planned)
    }

    private mutating func markRemoved(_ id: ItemID) {
        overlay[id, default: Touched()].record = nil
        if !baseCleared, base.contains(id) { hidden.insert(id) }
    }

    private mutating func removeAll(into planned: inout PlannedWrite) {
        let ids = currentIDs()
        guard !ids.isEmpty else { return }
        baseCleared = true
        hidden = []
        overlay = [:]
        appended = []
        planned.engineSteps.append(.removeAll)
        append(.remove(ids: ids), to: &planned)
    }

    /// Adds a step to the event, merging it into the previous step of the same op.
    private func append(_ step: EventStep, to planned: inout PlannedWrite) {
        switch (planned.events.last, step) {
        case (.insert(let previous)?, .insert(let records)):
            // Merge only when no id repeats, so the event still says exactly what happened in order.
            let seen = Set(previous.map(\.id))
            if records.allSatisfy({ !seen.contains($0.id) }) {
                planned.events[planned.events.count - 1] = .insert(records: previous + records)
                return
            }
        case (.remove(let previous)?, .remove(let ids)):
            planned.events[planned.events.count - 1] = .remove(ids: previous + ids)
            return
        default: break
        }
        planned.events.append(step)
    }
}

/// Changes a value in place: `modify(&table[key, default: ...]) { ... }` finds the key once.
private func modify<T>(_ value: inout T, _ body: (inout T) -> Void) { body(&value) }
