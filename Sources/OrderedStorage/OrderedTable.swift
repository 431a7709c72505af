// No dependencies: shared by the broker's in-memory stores and the engines written in Swift.

/// Key-value pairs in insertion order, with transactions: the ordered map an engine needs.
///
/// A put of an existing key keeps its position; a put of a new key (or of a key removed earlier) goes last.
/// Removal leaves a hole that is compacted away later, so positions stay stable during a transaction.
/// Between `begin()` and `commit()` every change is logged; `rollback()` undoes them in reverse, so a failed
/// apply leaves the table exactly as it was, in time proportional to the changes made (not to the table).
///
/// Everything is `@inlinable`: the broker's memory and the engines use it on their hot paths, and a generic type
/// used across modules unspecialized goes through value witnesses for every copy, hash and comparison.
public struct OrderedTable<Key: Hashable, Value> {
    @usableFromInline var slots: [(key: Key, value: Value)?] = []
    @usableFromInline var index: [Key: Int] = [:]
    @usableFromInline var undo: [Undo]?

    @usableFromInline enum Undo {
        case restore(slot: Int, entry: (key: Key, value: Value))
        case unappend(key: Key)
        case restoreAll(slots: [(key: Key, value: Value)?], index: [Key: Int])
    }

    @inlinable
    public init() {}

    @inlinable
    public var count: Int { index.count }

    @inlinable
    public func value(for key: Key) -> Value? {
        index[key].flatMap { slots[$0]?.value }
    }

    @inlinable
    public func contains(_ key: Key) -> Bool { index[key] != nil }

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
        guard let position = index[key] else { return false }
        for slot in slots[(position + 1)...] {
            guard let slot else { continue }
            if try !body(slot.key, slot.value) { break }
        }
        return true
    }

    /// Sets `key`; returns the previous value.
    @discardableResult
    @inlinable
    public mutating func put(_ key: Key, _ value: Value) -> Value? {
        if let position = index[key], let old = slots[position] {
            undo?.append(.restore(slot: position, entry: old))
            slots[position] = (key, value)
            return old.value
        }
        undo?.append(.unappend(key: key))
        index[key] = slots.count
        slots.append((key, value))
        return nil
    }

    /// Removes `key`; returns the removed value.
    @discardableResult
    @inlinable
    public mutating func remove(_ key: Key) -> Value? {
        guard let position = index.removeValue(forKey: key), let old = slots[position] else { return nil }
        if undo == nil {
            slots[position] = nil
            compactIfSparse()
        } else {
            undo!.append(.restore(slot: position, entry: old))
            slots[position] = nil
        }
        return old.value
    }

    @inlinable
    public mutating func removeAll() {
        undo?.append(.restoreAll(slots: slots, index: index))
        slots = []
        index = [:]
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
                slots[position] = old
                index[old.key] = position
            case .unappend(let key):
                slots.removeLast()
                index.removeValue(forKey: key)
            case .restoreAll(let oldSlots, let oldIndex):
                slots = oldSlots
                index = oldIndex
            }
        }
    }

    @usableFromInline mutating func compactIfSparse() {
        let holes = slots.count - index.count
        guard holes > 64, holes > index.count else { return }
        slots = slots.filter { $0 != nil }
        for (position, slot) in slots.enumerated() {
            index[slot!.key] = position
        }
    }
}


extension OrderedTable: Sendable where Key: Sendable, Value: Sendable {}
extension OrderedTable.Undo: Sendable where Key: Sendable, Value: Sendable {}
