// No dependencies: shared by the broker's in-memory stores and the engines written in Swift.

#if canImport(Glibc)
import Glibc
#endif

/// A key an `OrderedTable` can hold: hashed once per table operation through `tableHash`.
///
/// The default is the key's `hashValue` (Swift's per-process seeded hasher, so ids a client picks cannot be
/// made to collide on purpose); a key whose standard hashing is slow (an array of bytes, hashed element by
/// element) gives a faster one with the same guarantees.
public protocol TableKey: Hashable {
    var tableHash: Int { get }
}

extension TableKey {
    @inlinable
    public var tableHash: Int { hashValue }
}

extension String: TableKey {}

extension Array: TableKey where Element == UInt8 {
    /// The bytes hashed in one call (Swift's `Array.hash(into:)` feeds them one by one).
    @inlinable
    public var tableHash: Int {
        var hasher = Hasher()
        withUnsafeBytes { hasher.combine(bytes: $0) }
        return hasher.finalize()
    }
}

/// Key-value pairs in insertion order, with transactions: the ordered map an engine needs.
///
/// A put of an existing key keeps its position; a put of a new key (or of a key removed earlier) goes last.
/// Removal leaves a hole that is compacted away later, so positions stay stable during a transaction.
/// Between `begin()` and `commit()` every change is logged; `rollback()` undoes them in reverse, so a failed
/// apply leaves the table exactly as it was, in time proportional to the changes made (not to the table).
///
/// The index is an open-addressed table of 8-byte buckets, each holding 32 bits of the key's hash and the
/// key's slot: a key is hashed once per operation, a probe compares integers before it compares keys, and
/// growing or compacting the table moves buckets without hashing a key again. (A `Dictionary<Key, Int>`
/// hashes every key again when it grows, compares keys on every probe and takes three times the memory.)
///
/// The index grows without stopping one operation for long: the buckets live in `calloc`ed memory (the pages are
/// faulted in as they are first used, not all at once by zeroing), and when the index doubles, the old buckets
/// move into the new ones a few at a time, with each later change (`migrate`), while lookups search both.
/// Doubling a million-item index in one go takes 23 ms in this project's VM (13 ms of it zeroing 32 MB). The slots
/// live in segments of 4,096 (`SegmentedArray`): growing adds a segment and never copies the slots already there.
///
/// Everything is `@inlinable`: the broker's memory and the engines use it on their hot paths, and a generic type
/// used across modules unspecialized goes through value witnesses for every copy, hash and comparison.
public struct OrderedTable<Key: TableKey, Value> {
    /// The pairs in order, `nil` where one was removed; in segments, so that growing never copies them all.
    @usableFromInline var slots = SegmentedArray<(key: Key, value: Value)?>()
    /// `0` is empty; otherwise the low 32 bits of the hash above the slot number plus one.
    @usableFromInline var buckets: BucketStorage?
    /// While the index grows: the previous buckets, moved into `buckets` from index `drained` on; a moved or
    /// removed bucket there becomes `BucketStorage.moved`, so probes through it still reach what is left.
    @usableFromInline var draining: BucketStorage?
    @usableFromInline var drained = 0
    // The storages' addresses and masks, read by every lookup without touching the objects' reference counts;
    // set only through `setBuckets` and `setDraining`.
    @usableFromInline var bucketBase: UnsafeMutablePointer<UInt64>?
    @usableFromInline var bucketMask = -1
    @usableFromInline var drainBase: UnsafeMutablePointer<UInt64>?
    @usableFromInline var drainMask = -1
    @usableFromInline var live = 0
    @usableFromInline var undo: [Undo]?

    @usableFromInline enum Undo {
        case restore(slot: Int, entry: (key: Key, value: Value))
        case unappend
        case restoreAll(
            slots: SegmentedArray<(key: Key, value: Value)?>, buckets: BucketStorage?, draining: BucketStorage?,
            drained: Int,
            live: Int)
    }

    /// Old buckets moved per change while the index grows: at least 3 (the index doubles when half full, so
    /// the move ends before the next doubling whatever the mix of changes).
    @inlinable static var bucketsPerChange: Int { 8 }

    @inlinable
    public init() {}

    @inlinable
    public var count: Int { live }

    /// Room for `capacity` keys without growing the index.
    @inlinable
    public mutating func reserveCapacity(_ capacity: Int) {
        slots.reserveCapacity(capacity)
        if Self.bucketCount(for: capacity) > bucketCount { rebuild(bucketCount: Self.bucketCount(for: capacity)) }
    }

    @inlinable
    public func value(for key: Key) -> Value? {
        guard let bucket = find(key, hash: key.tableHash).found else { return nil }
        return slots[Self.slot(self.bucket(at: bucket))]?.value
    }

    @inlinable
    public func contains(_ key: Key) -> Bool { find(key, hash: key.tableHash).found != nil }

    // Lookups by something other than a key (the broker's memory keeps an id's bytes inside its record and looks
    // them up by `ItemID`): `hash` must be the `tableHash` the matching key has.

    /// The pair whose key has `hash` and is accepted by `matches`.
    @inlinable @inline(__always)
    public func entry(hash: Int, matching matches: (Key) -> Bool) -> (key: Key, value: Value)? {
        guard let bucket = find(hash: hash, matching: matches).found else { return nil }
        return slots[Self.slot(self.bucket(at: bucket))]
    }

    /// The value of the key with `hash` that `matches` accepts, read in place: the key is not copied out (for a
    /// key holding a reference, `entry` costs a retain and a release).
    @inlinable @inline(__always)
    public func value(hash: Int, matching matches: (Key) -> Bool) -> Value? {
        guard let bucket = find(hash: hash, matching: matches).found else { return nil }
        return slots[Self.slot(self.bucket(at: bucket))]?.value
    }

    /// Whether no key with `hash` can be in the table, known from the bucket where a lookup would start: it is
    /// empty, and so is the one in the older index while that is still being moved (its buckets are never
    /// emptied, only marked moved, so an empty one there ends every probe that reaches it). Done for many keys
    /// before looking each of them up, their cache misses overlap instead of coming one after another, and a key
    /// this answers `true` for needs no lookup.
    @inlinable
    public func certainlyAbsent(hash: Int) -> Bool {
        guard let buckets = bucketBase else { return true }
        let tag = Int(UInt32(truncatingIfNeeded: hash))
        guard buckets[tag & bucketMask] == 0 else { return false }
        guard let draining = drainBase else { return true }
        return draining[tag & drainMask] == 0
    }

    /// Reads what looking up each of `hashes` reads first (its bucket and, when the bucket carries the key's tag,
    /// the slot that bucket names and the key's `tableHash`), to have it in the cache: a caller about to look up
    /// many keys one after the other warms them all first. In three passes, each over all the keys, so that the
    /// loads of one pass do not wait for each other (a key's three loads depend on each other; the keys' do not)
    /// and their cache misses overlap. Returns nothing of use (0 when no bucket carried its key's tag), but the
    /// caller must use it, or the optimizer removes the loads.
    @inlinable
    public func warm(hashes: UnsafeBufferPointer<Int>) -> Int {
        guard let buckets = bucketBase, !hashes.isEmpty else { return 0 }
        return withUnsafeTemporaryAllocation(of: Int.self, capacity: hashes.count) { found in
            var sum = 0
            for index in hashes.indices {
                // Only a bucket with the key's tag leads where its lookup goes (a lookup skips the others' slots).
                let tag = UInt64(truncatingIfNeeded: UInt32(truncatingIfNeeded: hashes[index]))
                let bucket = buckets[Int(tag) & bucketMask]
                found[index] = bucket != 0 && bucket >> 32 == tag ? Self.slot(bucket) : -1
            }
            for index in hashes.indices where found[index] >= 0 {
                sum &+= Int(slots.touch(found[index]))
            }
            for index in hashes.indices where found[index] >= 0 {
                sum &+= slots[found[index]]?.key.tableHash ?? 0
            }
            return sum
        }
    }

    /// Whether a key with `hash` that `matches` accepts is present.
    @inlinable
    public func contains(hash: Int, matching matches: (Key) -> Bool) -> Bool {
        find(hash: hash, matching: matches).found != nil
    }

    /// Removes the pair whose key has `hash` and is accepted by `matches`; returns it.
    @discardableResult
    @inlinable
    public mutating func remove(hash: Int, matching matches: (Key) -> Bool) -> (key: Key, value: Value)? {
        guard let bucket = find(hash: hash, matching: matches).found else { return nil }
        return removeEntry(at: bucket)
    }

    /// The pairs after the key with `hash` accepted by `matches`, in order, until `body` returns `false`;
    /// `false` if there is no such key.
    @discardableResult
    @inlinable
    public func forEach(
        afterHash hash: Int, matching matches: (Key) -> Bool, _ body: (_ key: Key, _ value: Value) throws -> Bool
    ) rethrows -> Bool {
        guard let bucket = find(hash: hash, matching: matches).found else { return false }
        try slots.forEach(from: Self.slot(self.bucket(at: bucket)) + 1) { slot in
            guard let slot else { return true }
            return try body(slot.key, slot.value)
        }
        return true
    }

    /// Every pair, in order, until `body` returns `false`.
    @inlinable
    public func forEach(_ body: (_ key: Key, _ value: Value) throws -> Bool) rethrows {
        try slots.forEach(from: 0) { slot in
            guard let slot else { return true }
            return try body(slot.key, slot.value)
        }
    }

    /// The pairs after `key`, in order, until `body` returns `false`; `false` if `key` is not in the table.
    @discardableResult
    @inlinable
    public func forEach(after key: Key, _ body: (_ key: Key, _ value: Value) throws -> Bool) rethrows -> Bool {
        guard let bucket = find(key, hash: key.tableHash).found else { return false }
        try slots.forEach(from: Self.slot(self.bucket(at: bucket)) + 1) { slot in
            guard let slot else { return true }
            return try body(slot.key, slot.value)
        }
        return true
    }

    /// Sets `key`; returns the previous value. Key and value are taken, not copied (a key is often a reference).
    @discardableResult
    @inlinable
    public mutating func put(_ key: consuming Key, _ value: consuming Value) -> Value? {
        let hash = key.tableHash
        return put(key, value, hash: hash, absent: false)?.value
    }

    /// `put` of a key whose `tableHash` is `hash`, already computed; `absent` says the caller knows the key is not
    /// in the table (the broker's planner looked it up before the commit), so it is not looked up again: only the
    /// empty bucket where it goes is found. Returns the entry replaced, key and value, so that the caller decides
    /// where it is released (the broker releases it after its writer's turn).
    @discardableResult
    @inlinable
    public mutating func put(
        _ key: consuming Key, _ value: consuming Value, hash: Int, absent: Bool
    ) -> (key: Key, value: Value)? {
        // Where a new key goes: the empty bucket its lookup ended on, if it was looked up.
        var empty: Int?
        if !absent {
            let probe = find(key, hash: hash)
            if let bucket = probe.found {
                let position = Self.slot(self.bucket(at: bucket))
                let old = slots[position]!
                undo?.append(.restore(slot: position, entry: old))
                slots[position] = (key, value)
                migrate()
                return old
            }
            empty = probe.empty
        }
        undo?.append(.unappend)
        if (live + 1) * 2 > bucketCount {
            // Grow: at most half the buckets in use keeps probes short.
            grow(to: Self.bucketCount(for: live + 1))
            empty = nil
        }
        uniqueBuckets()[empty ?? emptyBucket(hash: hash)] = Self.bucket(hash: hash, slot: slots.count)
        slots.append((key, value))
        live += 1
        migrate()
        return nil
    }

    /// Removes `key`; returns the removed value.
    @discardableResult
    @inlinable
    public mutating func remove(_ key: Key) -> Value? {
        guard let bucket = find(key, hash: key.tableHash).found else { return nil }
        return removeEntry(at: bucket).value
    }

    @inlinable
    mutating func removeEntry(at bucket: Int) -> (key: Key, value: Value) {
        let position = Self.slot(self.bucket(at: bucket))
        let old = slots[position]!
        deleteBucket(at: bucket)
        live -= 1
        slots[position] = nil
        if undo == nil {
            compactIfSparse()
        } else {
            undo!.append(.restore(slot: position, entry: old))
        }
        migrate()
        return old
    }

    @inlinable
    public mutating func removeAll() {
        undo?.append(.restoreAll(slots: slots, buckets: buckets, draining: draining, drained: drained, live: live))
        slots = SegmentedArray()
        setBuckets(nil)
        setDraining(nil)
        drained = 0
        live = 0
    }

    /// Starts logging changes.
    @inlinable
    public mutating func begin() {
        precondition(undo == nil, "a transaction is already open")
        undo = []
    }

    /// Keeps the changes since `begin()`.
    @inlinable
    public mutating func commit() {
        undo = nil
        compactIfSparse()
    }

    /// Undoes every change since `begin()`.
    @inlinable
    public mutating func rollback() {
        guard let log = undo else { return }
        undo = nil
        for entry in log.reversed() {
            switch entry {
            case .restore(let position, let old):
                // The key's bucket was deleted (a removal) or still points here (a replacement).
                let hash = old.key.tableHash
                let probe = find(old.key, hash: hash)
                if probe.found == nil {
                    uniqueBuckets()[probe.empty] = Self.bucket(hash: hash, slot: position)
                    live += 1
                }
                slots[position] = old
            case .unappend:
                let last = slots[slots.count - 1]!
                deleteBucket(at: find(last.key, hash: last.key.tableHash).found!)
                slots.removeLast()
                live -= 1
            case .restoreAll(let oldSlots, let oldBuckets, let oldDraining, let oldDrained, let oldLive):
                slots = oldSlots
                setBuckets(oldBuckets)
                setDraining(oldDraining)
                drained = oldDrained
                live = oldLive
            }
        }
    }

    // MARK: The index

    @inlinable
    static func bucketCount(for keys: Int) -> Int {
        var count = 16
        while count < keys * 2 { count <<= 1 }
        return count
    }

    @inlinable
    static func bucket(hash: Int, slot: Int) -> UInt64 {
        UInt64(truncatingIfNeeded: UInt32(truncatingIfNeeded: hash)) << 32 | UInt64(slot + 1)
    }

    @inlinable
    static func slot(_ bucket: UInt64) -> Int { Int(bucket & 0xFFFF_FFFF) - 1 }

    @inlinable
    static func home(_ bucket: UInt64, mask: Int) -> Int { Int(bucket >> 32) & mask }

    /// The bucket holding `key`, or else the empty bucket where it would go.
    @inlinable
    func find(_ key: Key, hash: Int) -> (found: Int?, empty: Int) {
        find(hash: hash) { $0 == key }
    }

    @inlinable
    var bucketCount: Int { bucketMask + 1 }

    @inlinable
    mutating func setBuckets(_ storage: BucketStorage?) {
        buckets = storage
        bucketBase = storage?.base
        bucketMask = (storage?.count ?? 0) - 1
    }

    @inlinable
    mutating func setDraining(_ storage: BucketStorage?) {
        draining = storage
        drainBase = storage?.base
        drainMask = (storage?.count ?? 0) - 1
    }

    /// The bucket at a location `find` returned: an index into `buckets`, or `~index` into `draining`.
    @inlinable
    func bucket(at location: Int) -> UInt64 {
        location >= 0 ? bucketBase![location] : drainBase![~location]
    }

    /// The buckets, written in place once no copy of the table shares them.
    @inlinable
    mutating func uniqueBuckets() -> UnsafeMutablePointer<UInt64> {
        if !isKnownUniquelyReferenced(&buckets) { setBuckets(BucketStorage(copying: buckets!)) }
        return bucketBase!
    }

    @inlinable
    mutating func uniqueDraining() -> UnsafeMutablePointer<UInt64> {
        if !isKnownUniquelyReferenced(&draining) { setDraining(BucketStorage(copying: draining!)) }
        return drainBase!
    }

    /// The first empty bucket of `buckets` from where a key with `hash` would be looked up.
    @inlinable
    func emptyBucket(hash: Int) -> Int {
        let buckets = bucketBase!
        var index = Int(UInt32(truncatingIfNeeded: hash)) & bucketMask
        while buckets[index] != 0 { index = (index + 1) & bucketMask }
        return index
    }

    /// The location of the key `matches` accepts among those with this hash (`~index` when it is still in
    /// `draining`), and the empty bucket of `buckets` where such a key would go.
    @inlinable @inline(__always)
    func find(hash: Int, matching matches: (Key) -> Bool) -> (found: Int?, empty: Int) {
        guard let buckets = bucketBase else { return (nil, 0) }
        let tag = UInt64(truncatingIfNeeded: UInt32(truncatingIfNeeded: hash))
        var index = Int(tag) & bucketMask
        var empty = 0
        while true {
            let bucket = buckets[index]
            if bucket == 0 {
                empty = index
                break
            }
            if bucket >> 32 == tag, matches(slots[Self.slot(bucket)]!.key) { return (index, index) }
            index = (index + 1) & bucketMask
        }
        guard let draining = drainBase else { return (nil, empty) }
        index = Int(tag) & drainMask
        while true {
            let bucket = draining[index]
            if bucket == 0 { return (nil, empty) }
            if bucket != BucketStorage.moved, bucket >> 32 == tag, matches(slots[Self.slot(bucket)]!.key) {
                return (~index, empty)
            }
            index = (index + 1) & drainMask
        }
    }

    /// Empties the bucket at `location`: in `buckets`, shifting the buckets after it back, so that no probe ever
    /// needs a tombstone; in `draining`, marking it moved.
    @inlinable
    mutating func deleteBucket(at location: Int) {
        guard location >= 0 else {
            uniqueDraining()[~location] = BucketStorage.moved
            return
        }
        let buckets = uniqueBuckets()
        let mask = bucketCount - 1
        var hole = location
        var index = (location + 1) & mask
        while buckets[index] != 0 {
            let home = Self.home(buckets[index], mask: mask)
            // The bucket may fill the hole when its home is not cyclically in (hole, index].
            let distanceToHome = (index - home) & mask
            let distanceToHole = (index - hole) & mask
            if distanceToHome >= distanceToHole {
                buckets[hole] = buckets[index]
                hole = index
            }
            index = (index + 1) & mask
        }
        buckets[hole] = 0
    }

    /// Starts moving the buckets into `count` new ones (finishing a move still under way first).
    @inlinable
    mutating func grow(to count: Int) {
        migrate(all: true)
        if let buckets, live > 0 {
            setDraining(buckets)
            drained = 0
        }
        setBuckets(BucketStorage(count: count))
    }

    /// Moves the next few old buckets (or all of them) into `buckets`.
    @inlinable
    mutating func migrate(all: Bool = false) {
        // The count only: a reference held here would make `uniqueDraining` copy the old buckets.
        guard drainBase != nil else { return }
        let oldCount = drainMask + 1
        let end = all ? oldCount : min(oldCount, drained + Self.bucketsPerChange)
        let target = uniqueBuckets()
        let source = uniqueDraining()
        let mask = bucketCount - 1
        for position in drained..<end {
            let bucket = source[position]
            guard bucket != 0, bucket != BucketStorage.moved else { continue }
            var index = Self.home(bucket, mask: mask)
            while target[index] != 0 { index = (index + 1) & mask }
            target[index] = bucket
            source[position] = BucketStorage.moved
        }
        drained = end
        if drained == oldCount {
            setDraining(nil)
            drained = 0
        }
    }

    /// Re-lays the buckets into `bucketCount` buckets, with slot numbers mapped through `renumber`.
    @inlinable
    mutating func rebuild(bucketCount: Int, renumber: [Int]? = nil) {
        migrate(all: true)
        let old = buckets
        let fresh = BucketStorage(count: bucketCount)
        let mask = bucketCount - 1
        for position in 0..<(old?.count ?? 0) {
            var bucket = old!.base[position]
            guard bucket != 0 else { continue }
            if let renumber {
                bucket = bucket & ~0xFFFF_FFFF | UInt64(renumber[Self.slot(bucket)] + 1)
            }
            var index = Self.home(bucket, mask: mask)
            while fresh.base[index] != 0 { index = (index + 1) & mask }
            fresh.base[index] = bucket
        }
        setBuckets(fresh)
    }

    @usableFromInline mutating func compactIfSparse() {
        let holes = slots.count - live
        guard holes > 64, holes > live else { return }
        var renumber = Array(repeating: -1, count: slots.count)
        var kept = SegmentedArray<(key: Key, value: Value)?>()
        kept.reserveCapacity(live)
        for (position, slot) in slots.enumerated() where slot != nil {
            renumber[position] = kept.count
            kept.append(slot)
        }
        slots = kept
        rebuild(bucketCount: Self.bucketCount(for: live), renumber: renumber)
    }
}

// Unchecked only for the cached addresses: they point into the bucket storages the table holds, which are written
// only while uniquely referenced (copy-on-write), like an array's buffer.
extension OrderedTable: @unchecked Sendable where Key: Sendable, Value: Sendable {}
extension OrderedTable.Undo: Sendable where Key: Sendable, Value: Sendable {}

/// An index's buckets: zeroed memory from `calloc`, so a large index's pages are faulted in as they are first
/// written, not all at once; shared between copies of a table until one of them writes.
@usableFromInline
final class BucketStorage {
    /// A bucket of the index being drained that was moved or removed (never a real bucket: that would need
    /// 2^32 - 1 slots).
    @inlinable static var moved: UInt64 { .max }

    @usableFromInline let count: Int
    @usableFromInline let base: UnsafeMutablePointer<UInt64>

    @inlinable
    init(count: Int) {
        self.count = count
        base = calloc(count, MemoryLayout<UInt64>.stride)!.bindMemory(to: UInt64.self, capacity: count)
    }

    @inlinable
    init(copying other: BucketStorage) {
        count = other.count
        base = malloc(count * MemoryLayout<UInt64>.stride)!.bindMemory(to: UInt64.self, capacity: count)
        base.update(from: other.base, count: count)
    }

    deinit { free(base) }
}

extension BucketStorage: @unchecked Sendable {}  // written only through a table that owns it alone
