// No dependencies: shared by the broker's in-memory stores and the engines written in Swift.

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
/// Everything is `@inlinable`: the broker's memory and the engines use it on their hot paths, and a generic type
/// used across modules unspecialized goes through value witnesses for every copy, hash and comparison.
public struct OrderedTable<Key: TableKey, Value> {
    @usableFromInline var slots: [(key: Key, value: Value)?] = []
    /// `0` is empty; otherwise the low 32 bits of the hash above the slot number plus one.
    @usableFromInline var buckets: [UInt64] = []
    @usableFromInline var live = 0
    @usableFromInline var undo: [Undo]?

    @usableFromInline enum Undo {
        case restore(slot: Int, entry: (key: Key, value: Value))
        case unappend
        case restoreAll(slots: [(key: Key, value: Value)?], buckets: [UInt64], live: Int)
    }

    @inlinable
    public init() {}

    @inlinable
    public var count: Int { live }

    /// Room for `capacity` keys without growing the index.
    @inlinable
    public mutating func reserveCapacity(_ capacity: Int) {
        slots.reserveCapacity(capacity)
        if Self.bucketCount(for: capacity) > buckets.count { rebuild(bucketCount: Self.bucketCount(for: capacity)) }
    }

    @inlinable
    public func value(for key: Key) -> Value? {
        guard let bucket = find(key, hash: key.tableHash).found else { return nil }
        return slots[Self.slot(buckets[bucket])]?.value
    }

    @inlinable
    public func contains(_ key: Key) -> Bool { find(key, hash: key.tableHash).found != nil }

    // Lookups by something other than a key (the broker's memory keeps an id's bytes inside its record and looks
    // them up by `ItemID`): `hash` must be the `tableHash` the matching key has.

    /// The pair whose key has `hash` and is accepted by `matches`.
    @inlinable
    public func entry(hash: Int, matching matches: (Key) -> Bool) -> (key: Key, value: Value)? {
        guard let bucket = find(hash: hash, matching: matches).found else { return nil }
        return slots[Self.slot(buckets[bucket])]
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
        for slot in slots[(Self.slot(buckets[bucket]) + 1)...] {
            guard let slot else { continue }
            if try !body(slot.key, slot.value) { break }
        }
        return true
    }

    /// Every pair, in order, until `body` returns `false`.
    @inlinable
    public func forEach(_ body: (_ key: Key, _ value: Value) throws -> Bool) rethrows {
        for slot in slots {
            guard let slot else { continue }
            if try !body(slot.key, slot.value) { return }
        }
    }

    /// The pairs after `key`, in order, until `body` returns `false`; `false` if `key` is not in the table.
    @discardableResult
    @inlinable
    public func forEach(after key: Key, _ body: (_ key: Key, _ value: Value) throws -> Bool) rethrows -> Bool {
        guard let bucket = find(key, hash: key.tableHash).found else { return false }
        for slot in slots[(Self.slot(buckets[bucket]) + 1)...] {
            guard let slot else { continue }
            if try !body(slot.key, slot.value) { break }
        }
        return true
    }

    /// Sets `key`; returns the previous value.
    @discardableResult
    @inlinable
    public mutating func put(_ key: Key, _ value: Value) -> Value? {
        let hash = key.tableHash
        let probe = find(key, hash: hash)
        if let bucket = probe.found {
            let position = Self.slot(buckets[bucket])
            let old = slots[position]!
            undo?.append(.restore(slot: position, entry: old))
            slots[position] = (key, value)
            return old.value
        }
        undo?.append(.unappend)
        if (live + 1) * 2 > buckets.count {
            // Grow: at most half the buckets in use keeps probes short.
            rebuild(bucketCount: Self.bucketCount(for: live + 1))
            buckets[find(key, hash: hash).empty] = Self.bucket(hash: hash, slot: slots.count)
        } else {
            buckets[probe.empty] = Self.bucket(hash: hash, slot: slots.count)
        }
        slots.append((key, value))
        live += 1
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
        let position = Self.slot(buckets[bucket])
        let old = slots[position]!
        deleteBucket(bucket)
        live -= 1
        slots[position] = nil
        if undo == nil {
            compactIfSparse()
        } else {
            undo!.append(.restore(slot: position, entry: old))
        }
        return old
    }

    @inlinable
    public mutating func removeAll() {
        undo?.append(.restoreAll(slots: slots, buckets: buckets, live: live))
        slots = []
        buckets = []
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
                    buckets[probe.empty] = Self.bucket(hash: hash, slot: position)
                    live += 1
                }
                slots[position] = old
            case .unappend:
                let last = slots[slots.count - 1]!
                deleteBucket(find(last.key, hash: last.key.tableHash).found!)
                slots.removeLast()
                live -= 1
            case .restoreAll(let oldSlots, let oldBuckets, let oldLive):
                slots = oldSlots
                buckets = oldBuckets
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

    /// The bucket holding the key `matches` accepts among those with this hash.
    @inlinable
    func find(hash: Int, matching matches: (Key) -> Bool) -> (found: Int?, empty: Int) {
        guard !buckets.isEmpty else { return (nil, 0) }
        let mask = buckets.count - 1
        let tag = UInt64(truncatingIfNeeded: UInt32(truncatingIfNeeded: hash))
        var index = Int(tag) & mask
        return buckets.withUnsafeBufferPointer { buckets in
            while true {
                let bucket = buckets[index]
                if bucket == 0 { return (nil, index) }
                if bucket >> 32 == tag, matches(slots[Self.slot(bucket)]!.key) { return (index, index) }
                index = (index + 1) & mask
            }
        }
    }

    /// Empties a bucket and shifts the buckets after it back, so that no probe ever needs a tombstone.
    @inlinable
    mutating func deleteBucket(_ start: Int) {
        let mask = buckets.count - 1
        var hole = start
        var index = (start + 1) & mask
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

    /// Re-lays the buckets into `bucketCount` buckets, with slot numbers mapped through `renumber`.
    @inlinable
    mutating func rebuild(bucketCount: Int, renumber: [Int]? = nil) {
        let old = buckets
        buckets = Array(repeating: 0, count: bucketCount)
        let mask = bucketCount - 1
        buckets.withUnsafeMutableBufferPointer { buckets in
            for var bucket in old where bucket != 0 {
                if let renumber {
                    bucket = bucket & ~0xFFFF_FFFF | UInt64(renumber[Self.slot(bucket)] + 1)
                }
                var index = Self.home(bucket, mask: mask)
                while buckets[index] != 0 { index = (index + 1) & mask }
                buckets[index] = bucket
            }
        }
    }

    @usableFromInline mutating func compactIfSparse() {
        let holes = slots.count - live
        guard holes > 64, holes > live else { return }
        var renumber = Array(repeating: -1, count: slots.count)
        var kept: [(key: Key, value: Value)?] = []
        kept.reserveCapacity(live)
        for (position, slot) in slots.enumerated() where slot != nil {
            renumber[position] = kept.count
            kept.append(slot)
        }
        slots = kept
        rebuild(bucketCount: Self.bucketCount(for: live), renumber: renumber)
    }
}

extension OrderedTable: Sendable where Key: Sendable, Value: Sendable {}
extension OrderedTable.Undo: Sendable where Key: Sendable, Value: Sendable {}
