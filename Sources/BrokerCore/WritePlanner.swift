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
    /// The current record of every id a planned request touched; `nil` for removed.
    private var overlay: [ItemID: ItemRecord?] = [:]
    /// Ids appended by planned requests, in order; an id appended twice counts at its latest position.
    private var appended: [ItemID] = []
    private var appendPosition: [ItemID: Int] = [:]

    init(base: StoreContents) {
        self.base = base
    }

    private func current(_ id: ItemID) -> ItemRecord? {
        if let entry = overlay[id] { return entry }
        if baseCleared || hidden.contains(id) { return nil }
        return base.record(id)
    }

    /// Every id present after the requests planned so far, in store order.
    private func currentIDs() -> [ItemID] {
        var out: [ItemID] = []
        if !baseCleared {
            for id in base.ids where !hidden.contains(id) { out.append(id) }
        }
        for (position, id) in appended.enumerated() where appendPosition[id] == position {
            if case .some(.some) = overlay[id] { out.append(id) }
        }
        return out
    }

    /// Plans one request; `nil` when it changes nothing. `now` stamps the records it writes.
    mutating func plan(_ operation: WriteOperation, now: UInt64) -> PlannedWrite? {
        var planned = PlannedWrite(events: [], engineSteps: [])
        switch operation {
        case .insert(let items): insert(items, now: now, into: &planned)
        case .remove(let ids): remove(ids, into: &planned)
        case .removeAll: removeAll(into: &planned)
        case .chain(let steps):
            for step in steps {
                switch step {
                case .insert(let items): insert(items, now: now, into: &planned)
                case .remove(let ids): remove(ids, into: &planned)
                case .removeAll: removeAll(into: &planned)
                }
            }
        }
        return planned.events.isEmpty ? nil : planned
    }

    private mutating func insert(_ items: [Item], now: UInt64, into planned: inout PlannedWrite) {
        guard !items.isEmpty else { return }
        // In one batch the first occurrence fixes the position and the last payload wins.
        var unique: [(id: ItemID, payload: Payload)] = []
        if items.count == 1 {
            unique = [(items[0].id, items[0].payload)]
        } else {
            var order: [ItemID] = []
            var payloads: [ItemID: Payload] = [:]
            order.reserveCapacity(items.count)
            payloads.reserveCapacity(items.count)
            for item in items {
                if payloads.updateValue(item.payload, forKey: item.id) == nil { order.append(item.id) }
            }
            unique = order.map { ($0, payloads[$0]!) }
        }
        var records: [ItemRecord] = []
        records.reserveCapacity(unique.count)
        planned.engineSteps.reserveCapacity(planned.engineSteps.count + unique.count)
        for (id, submitted) in unique {
            // The record outlives the request (memory, history): its payload owns its bytes.
            let payload = submitted.owned
            let record: ItemRecord
            if let existing = current(id) {
                record = ItemRecord(id: id, createdAt: existing.createdAt, updatedAt: now, payload: payload)
            } else {
                record = ItemRecord(id: id, createdAt: now, updatedAt: now, payload: payload)
                appendPosition[id] = appended.count
                appended.append(id)
            }
            overlay[id] = .some(record)
            records.append(record)
            planned.engineSteps.append(
                .put(
                    EngineRecord(
                        key: Array(id.string.utf8), payload: record.payload.bytes, createdAt: record.createdAt,
                        updatedAt: record.updatedAt)))
        }
        append(.insert(records: records), to: &planned)
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
        overlay[id] = .some(nil)
        if !baseCleared, base.contains(id) { hidden.insert(id) }
    }

    private mutating func removeAll(into planned: inout PlannedWrite) {
        let ids = currentIDs()
        guard !ids.isEmpty else { return }
        baseCleared = true
        hidden = []
        overlay = [:]
        appended = []
        appendPosition = [:]
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
