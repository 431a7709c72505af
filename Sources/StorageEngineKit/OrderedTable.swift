import CStorageEngine

/// Key-value pairs in insertion order, with transactions: the ordered map an engine needs.
///
/// A put of an existing key keeps its position; a put of a new key (or of a key removed earlier) goes last.
/// Removal leaves a hole that is compacted away later, so positions stay stable during a transaction.
/// Between `begin()` and `commit()` every change is logged; `rollback()` undoes them in reverse, so a failed
/// apply leaves the table exactly as it was, in time proportional to the changes made (not to the table).
public struct OrderedTable<Value> {
    private var slots: [(key: [UInt8], value: Value)?] = []
    private var index: [[UInt8]: Int] = [:]
    private var undo: [Undo]?

    private enum Undo {
        case restore(slot: Int, entry: (key: [UInt8], value: Value))
        case unappend(key: [UInt8])
        case restoreAll(slots: [(key: [UInt8], value: Value)?], index: [[UInt8]: Int])
    }

    public init() {}

    public var count: Int { index.count }

    public func value(for key: [UInt8]) -> Value? {
        index[key].flatMap { slots[$0]?.value }
    }

    public func contains(_ key: [UInt8]) -> Bool { index[key] != nil }

    /// Every pair, in order.
    public func forEach(_ body: (_ key: [UInt8], _ value: Value) throws -> Bool) rethrows {
        for slot in slots {
            guard let slot else { continue }
            if try !body(slot.key, slot.value) { return }
        }
    }

    /// Sets `key`; returns the previous value.
    @discardableResult
    public mutating func put(_ key: [UInt8], _ value: Value) -> Value? {
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
    public mutating func remove(_ key: [UInt8]) -> Value? {
        guard let position = index.removeValue(forKey: key), let old = slots[position] else { return nil }
        undo?.append(.restore(slot: position, entry: old))
        slots[position] = nil
        return old.value
    }

    public mutating func removeAll() {
        undo?.append(.restoreAll(slots: slots, index: index))
        slots = []
        index = [:]
    }

    /// Starts logging changes.
    public mutating func begin() {
        precondition(undo == nil, "a transaction is already open")
        undo = []
    }

    /// Keeps the changes since `begin()`.
    public mutating func commit() {
        undo = nil
        compactIfSparse()
    }

    /// Undoes every change since `begin()`.
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

    private mutating func compactIfSparse() {
        let holes = slots.count - index.count
        guard holes > 64, holes > index.count else { return }
        slots = slots.filter { $0 != nil }
        for (position, slot) in slots.enumerated() {
            index[slot!.key] = position
        }
    }
}

extension OrderedTable {
    /// Visits every pair in order. `body` returns `false` when the host asked to stop, which throws
    /// `EngineError.stopped`; an error `body` throws ends the visit and is rethrown.
    public func visit(_ body: (_ key: [UInt8], _ value: Value) throws(EngineError) -> Bool) throws(EngineError) {
        var failure: EngineError?
        forEach { key, value in
            do throws(EngineError) {
                if try body(key, value) { return true }
                failure = .stopped
            } catch {
                failure = error
            }
            return false
        }
        if let failure { throw failure }
    }

    /// Hands every key to a host callback, in order (the `keys` call of the ABI).
    public func emitKeys(_ emit: (sb_bytes) -> Bool) throws(EngineError) {
        try visit { key, _ in key.withUnsafeBufferPointer { emit(sb_bytes(data: $0.baseAddress, length: $0.count)) } }
    }
}
