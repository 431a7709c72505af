@testable import BrokerDBus
import Testing

@Suite struct SignalMerging {
    private func store(_ name: String, _ operation: String, _ sequence: UInt64, _ ids: [String], complete: Bool = true)
        -> DBusPublisher.Signal
    {
        DBusPublisher.Signal(kind: .store(operation: operation), name: name, sequence: sequence, ids: ids, complete: complete)
    }

    @Test func consecutiveSignalsOfOneStoreAndOperationMerge() {
        var first = store("notes", "insert", 1, ["a"])
        let same = first.merge(store("notes", "insert", 2, ["b", "c"]))
        #expect(same)
        #expect(first.ids == ["a", "b", "c"] && first.sequence == 2 && first.complete)
        let otherOperation = first.merge(store("notes", "remove", 3, ["a"]))
        let otherStore = first.merge(store("other", "insert", 3, ["x"]))
        #expect(!otherOperation && !otherStore)
        var value = DBusPublisher.Signal(kind: .value(secure: false), name: "v", sequence: 1)
        let values = value.merge(DBusPublisher.Signal(kind: .value(secure: false), name: "v", sequence: 2))
        #expect(!values)
    }

    @Test func mergingPastTheCapCutsTheIdsAndSaysSo() {
        let many = (0..<DBusPublisher.maxIDsPerSignal).map { "id\($0)" }
        var first = store("notes", "insert", 1, many)
        let merged = first.merge(store("notes", "insert", 2, ["one more"]))
        #expect(merged)
        #expect(first.ids.count == DBusPublisher.maxIDsPerSignal)
        #expect(!first.complete)
        #expect(first.sequence == 2)
    }

    @Test func aLongStepIsCutWhenQueued() {
        let publisher = DBusPublisher(bus: .address("unix:path=/nonexistent"), logger: .init(label: "test"))
        // storeCommitted cuts at maxIDsPerSignal and marks the signal incomplete (no thread started: it only queues).
        publisher.storeCommitted(
            store: "s", epoch: 1, sequence: 1,
            steps: [.remove(ids: (0...DBusPublisher.maxIDsPerSignal).map { .init("\($0)") })])
        #expect(publisher.queuedForTesting.map(\.complete) == [false])
        #expect(publisher.queuedForTesting.first?.ids.count == DBusPublisher.maxIDsPerSignal)
    }
}
