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
    /// What the requests planned so far did to each id they touched, found through `overlayIndex` by the ids'
    /// `tableHash` (computed once per id for the committed contents' index too; a `Dictionary` would hash each id
    /// again, twice per remembered insert).
    private var overlay: [(id: ItemID, touched: Touched)] = []
    private var overlayIndex = PositionIndex()
    /// Ids appended by planned requests, in order; an id appended twice counts at its latest position.
    private var appended: [ItemID] = []
    /// The engine steps of every request planned so far, in order: one transaction for the group.
    private(set) var engineSteps: [EngineStep] = []
    /// For every record the planned events insert, in the order replaying them meets them: its id's `tableHash`
    /// and whether the id is absent from memory at that point, so that the replay (`StoreContents.apply(_:hints:
    /// from:)`) neither hashes nor looks it up again.
    private(set) var insertHints: [StoreContents.InsertHint] = []
    /// The ids of the last step of the request being planned, when it is an insert that later steps of the same
    /// request tried to merge into (`append`); built on the first such try.
    private var lastStepIDs: Set<ItemID>?

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
        insertHints.reserveCapacity(items)
        if remembered > 0 {
            overlay.reserveCapacity(remembered)
            overlayIndex.reserveCapacity(remembered)
            appended.reserveCapacity(remembered)
        }
    }

    /// Where `id` is in `overlay`, if a planned request touched it.
    private func touched(_ id: ItemID, hash: Int) -> Int? {
        overlayIndex.position(hash: hash) { overlay[$0].id == id }
    }

    /// Where `id` is in `overlay`, added untouched if no planned request touched it yet.
    private mutating func touching(_ id: ItemID, hash: Int) -> Int {
        if let position = touched(id, hash: hash) { return position }
        overlayIndex.add(hash: hash, position: overlay.count)
        overlay.append((id, Touched()))
        return overlay.count - 1
    }

    /// When `id` was created, if it is present after the requests planned so far.
    /// `notInBase`: the committed contents are known not to hold `id` (`StoreContents.certainlyAbsent(hashes:)`).
    @inline(__always)  // an opaque call would retain the id it is given (see `ItemID.==`)
    private func createdAt(_ id: ItemID, hash: Int? = nil, notInBase: Bool = false) -> UInt64? {
        let hash = hash ?? id.tableHash
        if !overlay.isEmpty, let position = touched(id, hash: hash) { return overlay[position].touched.record?.createdAt }
        if notInBase || baseCleared || (!hidden.isEmpty && hidden.contains(id)) { return nil }
        return base.createdAt(id, hash: hash)
    }

    /// Every id present after the requests planned so far, in store order, compacted: a removeAll's event keeps
    /// them (history), and a view would keep a removed item's payload or a request's frame too.
    private func currentIDs() -> [ItemID] {
        var out: [ItemID] = []
        if !baseCleared {
            for id in base.ids where !hidden.contains(id) { out.append(id.compacted) }
        }
        for (position, id) in appended.enumerated() {
            guard let entry = touched(id, hash: id.tableHash) else { continue }
            if overlay[entry].touched.appendedAt == position, overlay[entry].touched.record != nil {
                out.append(id.compacted)
            }
        }
        return out
    }

    /// Plans one request: the steps of its event (only what really changes), `nil` when it changes nothing; its
    /// engine steps join `engineSteps`. `now` stamps the records it writes. `last` says no request is planned
    /// after this one, so what it does need not be remembered for the next.
    mutating func plan(_ operation: WriteOperation, now: UInt64, last: Bool = false) -> [EventStep]? {
        var events: [EventStep] = []
        lastStepIDs = nil
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
        Self.reserve(&engineSteps, firstStep + items.count)
        if remember {
            Self.reserve(&overlay, overlay.count + items.count)
            overlayIndex.reserveCapacity(overlay.count + items.count)
        }
        // Each id hashed once, for finding repeats and for the committed contents' index; and, for a batch, the
        // index's first bucket read for all ids before any lookup, so that their cache misses overlap (one miss
        // after another, a batch into a large store spends most of its lookups waiting for memory), an empty one
        // saying the id is new without a lookup.
        let hashes = items.count > 1 ? Self.hashes(items) : []
        let absent = items.count > 1 && !baseCleared ? base.certainlyAbsent(hashes: hashes) : []
        var seen = PositionIndex()
        if items.count > 1 { seen.reserveCapacity(items.count) }
        // Items and records are read in place (`items[index].id`), never bound to a local: a bound `Item` or
        // `ItemRecord` is a copy, a retain and a release of its id's storage and of its payload's.
        for index in items.indices {
            // Then, a chunk at a time (what a chunk reads stays in the cache until its lookups), the rest of what
            // the lookups read: the slots and the kept items (`StoreContents.warm`).
            if items.count > 1, !baseCleared, index % Self.warmChunk == 0 {
                let end = min(index + Self.warmChunk, items.count)
                hashes.withUnsafeBufferPointer { base.warm(UnsafeBufferPointer(rebasing: $0[index..<end])) }
            }
            let item = Self.kept(items, index)
            let payload = Payload(kept: item)
            let hash = items.count > 1 ? hashes[index] : items[index].id.tableHash
            if items.count > 1 {
                if let earlier = seen.position(hash: hash, where: { records[$0].id == items[index].id }) {
                    engineSteps[firstStep + earlier] = .put(
                        EngineRecord(kept: item, createdAt: records[earlier].createdAt, updatedAt: now))
                    records[earlier].id = ItemID(kept: item)  // not a view of the replaced item
                    records[earlier].payload = payload
                    if remember, let entry = touched(items[index].id, hash: hash) {
                        overlay[entry].touched.record = records[earlier]
                    }
                    continue
                }
                seen.add(hash: hash, position: records.count)
            }
            let existing = createdAt(items[index].id, hash: hash, notInBase: !absent.isEmpty && absent[index])
            // The engine's record straight from the kept item (its id is the key), not from the item record: that
            // would copy the record.
            engineSteps.append(.put(EngineRecord(kept: item, createdAt: existing ?? now, updatedAt: now)))
            insertHints.append(StoreContents.InsertHint(hash: hash, absent: existing == nil))
            records.append(ItemRecord(id: ItemID(kept: item), createdAt: existing ?? now, updatedAt: now, payload: payload))
            guard remember else { continue }
            let entry = touching(items[index].id, hash: hash)
            overlay[entry].touched.record = records[records.count - 1]
            if existing == nil {
                overlay[entry].touched.appendedAt = appended.count
                appended.append(items[index].id)
            }
        }
        append(.insert(records: records), to: &events)
    }

    /// The ids of a batch warmed together before their lookups (`insert`).
    private static var warmChunk: Int { 512 }

    /// Room for `count` elements, growing geometrically: `reserveCapacity` of exactly what one step of a chain
    /// needs reallocates (and copies) the whole array at every step.
    private static func reserve<Element>(_ array: inout [Element], _ count: Int) {
        if array.capacity < count { array.reserveCapacity(max(count, 2 * array.capacity)) }
    }

    /// Each item's id's `tableHash`, read in place (`items.map` would copy each item out; `ItemID.tableHash` is
    /// inlined, so nothing is retained).
    private static func hashes(_ items: [Item]) -> [Int] {
        var hashes: [Int] = []
        hashes.reserveCapacity(items.count)
        for index in items.indices { hashes.append(items[index].id.tableHash) }
        return hashes
    }

    /// The item a record keeps: it outlives the request (memory, history), so it owns its bytes, the id's then
    /// the payload's in one allocation (`KeptItem`), shared by the record's id and payload, memory and the
    /// engine's step. Only copies run while the request's bytes are borrowed: an opaque call there (the
    /// allocation) would make the caller retain them around it.
    ///
    /// It takes the array and the index, not the item: reading `items[index]` copies the item, and a copy alive
    /// across the allocation (an opaque call) is retained and released around it; each read here ends before it.
    ///
    /// An item the daemon decoded kept where it read the request (`Item(wire:)`, on the loop) is taken as it is.
    @inline(__always)
    private static func kept(_ items: [Item], _ index: Int) -> KeptItem {
        if let item = items[index].keptItem { return item }
        let idCount = items[index].id.utf8Count
        return KeptItem.make(idCount: idCount, payloadCount: items[index].payload.count) { storage in
            items[index].id.withUTF8 { bytes in
                if bytes.count > 0 { storage.baseAddress!.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
            }
            items[index].payload.withUnsafeReadableBytes { bytes in
                if bytes.count > 0 {
                    (storage.baseAddress! + idCount).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
                }
            }
        }
    }

    private mutating func remove(_ ids: [ItemID], into events: inout [EventStep]) {
        var removed: [ItemID] = []
        for id in ids where createdAt(id) != nil {
            markRemoved(id)
            removed.append(id.compacted)  // kept by history: not a view of the request's frame
            engineSteps.append(.remove(key: id.withUTF8 { Array($0) }))
        }
        guard !removed.isEmpty else { return }
        append(.remove(ids: removed), to: &events)
    }

    private mutating func markRemoved(_ id: ItemID) {
        overlay[touching(id, hash: id.tableHash)].touched.record = nil
        if !baseCleared, base.contains(id) { hidden.insert(id) }
    }

    private mutating func removeAll(into events: inout [EventStep]) {
        let ids = currentIDs()
        guard !ids.isEmpty else { return }
        baseCleared = true
        hidden = []
        overlay = []
        overlayIndex = PositionIndex()
        appended = []
        engineSteps.append(.removeAll)
        append(.remove(ids: ids), to: &events)
    }

    /// Adds a step to the event, merging it into the previous step of the same op, in place: a chain of many steps
    /// costs what one step of all their items costs (copying and hashing the merged step again for each step would
    /// make a chain of 5,000 one-item inserts take seconds).
    private mutating func append(_ step: EventStep, to events: inout [EventStep]) {
        let last = events.count - 1
        if last >= 0 {
            // Each case takes the last step's array and puts `.remove(ids: [])` in its place before appending, so that
            // the array has one owner and grows in place (a switch over a tuple of both steps would keep a copy alive).
            switch step {
            case .insert(let records):
                if case .insert(var previous) = events[last] {
                    // Merge only when no id repeats, so the event still says exactly what happened in order.
                    if lastStepIDs == nil { lastStepIDs = Set(previous.lazy.map(\.id)) }
                    if records.allSatisfy({ !lastStepIDs!.contains($0.id) }) {
                        for index in records.indices { lastStepIDs!.insert(records[index].id) }
                        events[last] = .remove(ids: [])
                        previous.append(contentsOf: records)
                        events[last] = .insert(records: previous)
                        return
                    }
                }
            case .remove(let ids):
                if case .remove(var previous) = events[last] {
                    events[last] = .remove(ids: [])
                    previous.append(contentsOf: ids)
                    events[last] = .remove(ids: previous)
                    return
                }
            }
        }
        lastStepIDs = nil
        events.append(step)
    }
}

/// Positions in an array of keys, by the keys' `tableHash` (already computed for the committed contents' index):
/// an open-addressed index of 8-byte buckets, each 32 bits of the hash and the position + 1 (0: empty), at most
/// half full. The caller tells a position's key from another with the same 32 bits.
struct PositionIndex {
    private var buckets: [UInt64] = []
    private var mask = -1
    private var count = 0

    /// Room for `capacity` positions without growing.
    mutating func reserveCapacity(_ capacity: Int) {
        guard capacity * 2 > buckets.count else { return }
        var size = 16
        while size < capacity * 2 { size <<= 1 }
        let old = buckets
        buckets = Array(repeating: 0, count: size)
        mask = size - 1
        for bucket in old where bucket != 0 { place(bucket) }
    }

    /// The position whose key `isKey` accepts among those with this hash.
    func position(hash: Int, where isKey: (Int) -> Bool) -> Int? {
        guard count > 0 else { return nil }
        let tag = UInt64(truncatingIfNeeded: UInt32(truncatingIfNeeded: hash))
        var index = Int(tag) & mask
        while true {
            let bucket = buckets[index]
            if bucket == 0 { return nil }
            if bucket >> 32 == tag, isKey(Int(bucket & 0xFFFF_FFFF) - 1) { return Int(bucket & 0xFFFF_FFFF) - 1 }
            index = (index + 1) & mask
        }
    }

    /// Records `position` for a key with this hash (not already recorded).
    mutating func add(hash: Int, position: Int) {
        if (count + 1) * 2 > buckets.count { reserveCapacity(max(8, count * 2)) }
        let tag = UInt64(truncatingIfNeeded: UInt32(truncatingIfNeeded: hash))
        place(tag << 32 | UInt64(position + 1))
        count += 1
    }

    private mutating func place(_ bucket: UInt64) {
        var index = Int(bucket >> 32) & mask
        while buckets[index] != 0 { index = (index + 1) & mask }
        buckets[index] = bucket
    }
}

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
