import Foundation
@testable import StoreBrokerClient
import StoreBrokerTesting
import Testing
import Wire

/// A `RemoteStore`'s writes name its own subscription (`quietChain`): the broker does not push their commits
/// back, and the mirror applies each from its answer, in sequence order with other processes' commits.
@Suite struct QuietWrites {
    @Test func aMirrorAppliesItsWritesFromTheirAnswersNotFromPushes() async throws {
        try await withTemporaryBroker { client in
            let store = try await RemoteStore<Note>(client: client, loading: "notes")
            try await store.insert(Note(id: "a", text: "one"))
            try await store.insert([Note(id: "b", text: "two"), Note(id: "a", text: "one again")])
            try await store.chain().remove(id: "b").insert(Note(id: "c", text: "three")).run()
            try await store.removeAll()
            try await store.insert(Note(id: "d", text: "four"))
            // Every write was applied from its answer: a commit pushed back would have been applied first (the
            // broker writes a commit's pushes before its answers), leaving the answer nothing to apply.
            #expect(store.writesAppliedFromAnswers == 5)
            #expect(store.items == [Note(id: "d", text: "four")])
            let fresh = try await RemoteStore<Note>(client: BrokerClient(socketPath: client.socketPath), loading: "notes")
            #expect(fresh.items == store.items && fresh.sequence == store.sequence)
            await fresh.client.close()
        }
    }

    /// The writer's own streams tell a quiet write's commit step for step as every other process's do (the
    /// broker's event merges adjacent steps of one kind and leaves out removes of ids that are not there).
    @Test func theWritersStreamsTellItsCommitsAsOtherProcessesSeeThem() async throws {
        try await withTemporaryBroker { client in
            let writer = try await RemoteStore<Note>(client: client, loading: "notes")
            let reader = try await RemoteStore<Note>(client: BrokerClient(socketPath: client.socketPath), loading: "notes")
            let logs = [writer, reader].map { store in
                changes(of: store) { "\($0.sequence) \($0.operation):\($0.items.map(\.id).joined(separator: ","))" }
            }
            let a = Note(id: "a", text: "a"), b = Note(id: "b", text: "b"), c = Note(id: "c", text: "c")
            try await writer.insert([a, b, c])
            try await writer.chain().remove(a).remove(b).remove(id: "absent").insert(a).insert(b).run()
            try await writer.chain().insert(c).insert(Note(id: "c", text: "again")).removeAll().removeAll().run()
            try await writer.chain().remove(id: "absent").insert(a).run()
            try await reader.waitUntilSeen(sequence: writer.sequence)
            #expect(await logs[1].0.waitFor(count: 7))
            #expect(await logs[0].0.waitFor(count: logs[1].0.all.count))
            #expect(logs[0].0.all == logs[1].0.all)
            for (_, task) in logs { task.cancel() }
            await reader.client.close()
        }
    }

    /// A quiet write the broker pushes back all the same (its subscription was being replaced: here, a name the
    /// broker does not know) is taken as written, not decoded: `Draft`'s JSON leaves `unsaved` out.
    @Test func aQuietWritePushedBackIsTakenAsWritten() async throws {
        try await withTemporaryBroker { client in
            let store = try await RemoteStore<Draft>(client: client, loading: "drafts")
            try await store.insert(Draft(id: "a", text: "one", unsaved: 1))
            store.misnameSubscription(0xFFFF_FF00)
            try await store.insert([Draft(id: "b", text: "two", unsaved: 2), Draft(id: "b", text: "two again", unsaved: 3)])
            try await store.chain().insert(Draft(id: "c", text: "three", unsaved: 4)).remove(id: "a").run()
            #expect(store.items.map(\.unsaved) == [3, 4])
            #expect(store.writesAppliedFromAnswers == 1, "the two pushed back were applied from their pushes")
        }
    }

    /// Two processes writing at once: each one's commits come back only to the other, so a mirror often gets
    /// another process's commit before the answer to its own earlier one. Both mirrors end equal to the broker,
    /// having told their streams every commit once, in sequence order.
    @Test func twoProcessesWritingAtOnceEndEqualWithGapFreeEvents() async throws {
        try await withTemporaryBroker { client in
            let first = try await RemoteStore<Note>(client: client, loading: "shared")
            let second = try await RemoteStore<Note>(client: BrokerClient(socketPath: client.socketPath), loading: "shared")
            let logs = [first, second].map { store in changes(of: store) { $0.sequence } }
            let rounds = 60
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (name, store) in [("f", first), ("s", second)] {
                    for n in 0..<rounds {
                        group.addTask {
                            try await store.insert(Note(id: "\(name)\(n % 20)", text: "\(name) \(n)"))
                            if n % 15 == 14 { try await store.remove(id: "\(name)\(n % 7)") }
                        }
                    }
                }
                try await group.waitForAll()
            }
            let connection = try await client.connection()
            let broker = try await connection.ids("shared")
            try await first.waitUntilSeen(sequence: broker.position.sequence)
            try await second.waitUntilSeen(sequence: broker.position.sequence)
            #expect(first.items.map(\.id) == broker.value.map(\.string))
            #expect(second.items == first.items)
            for (sequences, task) in logs {
                #expect(await sequences.waitFor(count: 1))
                // One event per commit here (single-step writes; a remove of an absent id commits nothing).
                let seen = sequences.all
                #expect(seen == Array(1...UInt64(seen.count)), "events skipped or repeated a commit: \(seen)")
                #expect(seen.last == broker.position.sequence)
                task.cancel()
            }
            #expect(first.writesAppliedFromAnswers + second.writesAppliedFromAnswers > 0)
            await second.client.close()
        }
    }
}

/// What `line` makes of each insert and remove `store` streams, collected by a task (cancel it when done). The
/// stream is made here, before the caller writes: a task may start after the writes.
private func changes<Line: Sendable>(
    of store: RemoteStore<Note>, _ line: @escaping @Sendable (StoreEvent<Note>) -> Line
) -> (Collected<Line>, Task<Void, Never>) {
    let lines = Collected<Line>()
    let events = store.events
    let task = Task {
        for await event in events where event.operation == .insert || event.operation == .remove {
            lines.append(line(event))
        }
    }
    return (lines, task)
}
