@testable import OrderedStorage
import Testing

/// The plain model the table must agree with: keys in order, values by key.
private struct Model {
    var order: [Int] = []
    var values: [Int: Int] = [:]

    mutating func put(_ key: Int, _ value: Int) -> Int? {
        let old = values.updateValue(value, forKey: key)
        if old == nil { order.append(key) }
        return old
    }

    mutating func remove(_ key: Int) -> Int? {
        guard let old = values.removeValue(forKey: key) else { return nil }
        order.removeAll { $0 == key }
        return old
    }

    var pairs: [[Int]] { order.map { [$0, values[$0]!] } }
}

/// A key whose hash is chosen by the test, to force long probe runs and wrap-around.
private struct Clashing: TableKey {
    var id: Int
    var tableHash: Int { id % 3 == 0 ? 7 : id &* 0x9E37_79B9 }
}

@Suite struct OrderedTableTests {
    private func pairs<K>(_ table: OrderedTable<K, Int>, _ key: (K) -> Int) -> [[Int]] {
        var out: [[Int]] = []
        table.forEach { k, v in
            out.append([key(k), v])
            return true
        }
        return out
    }

    @Test("warming reads the slots and keys of the keys present, and nothing for keys absent, even while the index grows")
    func warmingReadsOnlyWhereLookupsGo() {
        var table = OrderedTable<String, Int>()
        let absent = (0..<500).map { "absent-\($0)".tableHash }
        #expect(absent.withUnsafeBufferPointer { table.warm(hashes: $0) } == 0)  // no index yet
        for round in 0..<3 {
            // 1,000 more each round: the index doubles, and is still being moved when warmed.
            for n in (round * 1000)..<((round + 1) * 1000) { table.put(String(n), n) }
            let present = (0..<((round + 1) * 1000)).map { String($0).tableHash }
            #expect(present.withUnsafeBufferPointer { table.warm(hashes: $0) } != 0)
            // A bucket that holds another key's tag leads nowhere a lookup goes: nothing of it is read.
            #expect(absent.withUnsafeBufferPointer { table.warm(hashes: $0) } == 0)
        }
    }

    @Test("random puts, removes, removeAlls and rolled-back transactions agree with a plain model")
    func agreesWithModel() {
        // A fixed linear congruential sequence, so a failure repeats.
        var state: UInt64 = 14
        func next(_ bound: Int) -> Int {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int(state >> 33) % bound
        }
        var table = OrderedTable<String, Int>()
        var model = Model()
        for round in 0..<400 {
            let transaction = round % 3 == 0
            let saved = model
            if transaction { table.begin() }
            for _ in 0...next(60) {
                let key = next(300)
                switch next(100) {
                case 0..<55:
                    let value = next(1_000_000)
                    #expect(table.put(String(key), value) == model.put(key, value))
                case 55..<99:
                    #expect(table.remove(String(key)) == model.remove(key))
                default:
                    table.removeAll()
                    model = Model()
                }
                #expect(table.count == model.values.count)
            }
            if transaction {
                if round % 2 == 0 {
                    table.rollback()
                    model = saved
                } else {
                    table.commit()
                }
            }
            #expect(pairs(table, { Int($0)! }) == model.pairs)
            for key in 0..<300 {
                #expect(table.value(for: String(key)) == model.values[key])
                #expect(table.contains(String(key)) == (model.values[key] != nil))
            }
        }
    }

    @Test("keys sharing one hash probe past each other, across the end of the index, and survive removal")
    func clashingHashes() {
        var table = OrderedTable<Clashing, Int>()
        for id in 0..<3000 { table.put(Clashing(id: id), id) }
        for id in stride(from: 0, to: 3000, by: 2) { #expect(table.remove(Clashing(id: id)) == id) }
        #expect(table.count == 1500)
        for id in 0..<3000 { #expect(table.value(for: Clashing(id: id)) == (id % 2 == 1 ? id : nil)) }
        #expect(pairs(table, \.id).map { $0[0] } == Array(stride(from: 1, to: 3000, by: 2)))
    }

    /// The index doubles at 2,048 and 4,096 keys and then moves its old buckets a few per change: lookups, removals,
    /// rollbacks and copies made meanwhile all see every key exactly once.
    @Test("keys stay findable while the index grows in steps, through removals, rollbacks and copies")
    func growingInSteps() {
        var table = OrderedTable<String, Int>()
        var model = Model()
        var snapshot: (table: OrderedTable<String, Int>, model: Model)?
        func check(_ table: OrderedTable<String, Int>, _ model: Model, _ upTo: Int) {
            for key in 0..<upTo where (table.value(for: String(key)) != model.values[key]) {
                Issue.record("key \(key): \(String(describing: table.value(for: String(key)))), not \(String(describing: model.values[key]))")
                return
            }
            #expect(table.count == model.values.count)
        }
        for key in 0..<6000 {
            // Live keys reach 2,048 (the index doubles) near key 2,389 and 4,096 near key 4,779.
            if key == 2400 { snapshot = (table, model) }  // a copy taken while the old buckets are still moving
            if key == 4000 { table.begin() }
            _ = table.put(String(key), key)
            _ = model.put(key, key)
            if key % 7 == 3 {
                #expect(table.remove(String(key - 3)) == model.remove(key - 3))
            }
            if key == 5500 {  // a transaction across a doubling, rolled back while the buckets move
                let saved = snapshotOf(model, before: 4000)
                table.rollback()
                model = saved
            }
            if key % 97 == 0 { check(table, model, key + 1) }
        }
        check(table, model, 6000)
        #expect(pairs(table, { Int($0)! }) == model.pairs)
        if let snapshot {
            check(snapshot.table, snapshot.model, 6000)
            #expect(pairs(snapshot.table, { Int($0)! }) == snapshot.model.pairs)
        }
    }

    /// The slots live in segments of 4,096: appends, a rollback of appends and of a removeAll, a copy and a
    /// compaction across several segment boundaries keep the order and every value, and a copy is not changed by
    /// writes to the original.
    @Test("slots across segment boundaries: appends, rollbacks, copies, compaction")
    func acrossSegments() {
        let segment = SegmentedArray<Int>.segmentCapacity
        var table = OrderedTable<String, Int>()
        var model = Model()
        for key in 0..<(2 * segment + 10) {
            _ = table.put(String(key), key)
            _ = model.put(key, key)
        }
        let copy = table
        table.begin()
        for key in (2 * segment + 10)..<(3 * segment + 5) { _ = table.put(String(key), key) }
        table.removeAll()
        _ = table.put("after", 1)
        table.rollback()  // undoes the put, the removeAll and every append back across the boundary at 3 x 4,096
        #expect(pairs(table, { Int($0)! }) == model.pairs)
        for key in stride(from: 0, to: 2 * segment, by: 3) {  // enough holes to compact
            #expect(table.remove(String(key)) == model.remove(key))
        }
        for key in 0..<(2 * segment + 10) { _ = table.put(String(key), -key) }  // removed ones go last again
        for key in 0..<(2 * segment + 10) { _ = model.put(key, -key) }
        #expect(pairs(table, { Int($0)! }) == model.pairs)
        #expect(copy.count == 2 * segment + 10)
        #expect(pairs(copy, { Int($0)! }).map { $0[0] } == Array(0..<(2 * segment + 10)))
        #expect(copy.value(for: "5") == 5)

        var array = SegmentedArray<Int>()
        for n in 0..<(segment + 1) { array.append(n) }
        var other = array
        other[segment] = -1
        other[0] = -2
        #expect(array[segment] == segment && array[0] == 0)
        #expect(other.removeLast() == -1 && other.count == segment && other.segments.count == 1)
        #expect(Array(array) == Array(0...segment))
    }

    /// `certainlyAbsent(hash:)` never says so of a key the table holds, while the index grows and after removals.
    @Test("certainlyAbsent is never true for a key the table holds")
    func certainlyAbsentIsSafe() {
        var table = OrderedTable<String, Int>()
        var saidAbsent = 0
        var saidAbsentWhileMoving = 0
        for key in 0..<6000 {
            _ = table.put(String(key), key)
            if key % 5 == 0 { table.remove(String(key / 2)) }
            for probe in [key, key / 2, key + 1_000_000] where table.certainlyAbsent(hash: String(probe).tableHash) {
                #expect(table.value(for: String(probe)) == nil, "key \(probe) is there")
                saidAbsent += 1
                if table.drainBase != nil { saidAbsentWhileMoving += 1 }
            }
        }
        #expect(saidAbsent > 1000)  // it does say so of absent keys, or it would save no lookup
        #expect(saidAbsentWhileMoving > 100)  // and while an older index is being moved
    }

    /// The model as it was before key `before` was put (puts of 0..<before, with the same removals).
    private func snapshotOf(_ model: Model, before: Int) -> Model {
        var rebuilt = Model()
        for key in 0..<before {
            _ = rebuilt.put(key, key)
            if key % 7 == 3 { _ = rebuilt.remove(key - 3) }
        }
        return rebuilt
    }

    @Test("a put of a removed key goes last; forEach(after:) starts after the key")
    func order() {
        var table = OrderedTable<[UInt8], Int>()
        for (index, word) in ["a", "b", "c"].enumerated() { table.put(Array(word.utf8), index) }
        table.remove(Array("a".utf8))
        table.put(Array("a".utf8), 9)
        var after: [Int] = []
        #expect(table.forEach(after: Array("b".utf8)) { _, value in
            after.append(value)
            return true
        })
        #expect(after == [2, 9])
        #expect(!table.forEach(after: Array("z".utf8)) { _, _ in true })
    }
}
