import NIOCore
@testable import StoreBrokerClient
import StoreBrokerTesting
import Testing

/// `BrokerClient.executor`: a task that prefers it makes its requests from the connection's own thread.
@Suite struct ClientExecutor {
    @Test func aTaskOnTheClientsExecutorWritesAndReadsItsOwnWritesWithNoHandOff() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let notes = try await RemoteStore<AppNote>(client: client, loading: "notes")
            let loop = client.eventLoop
            let sequences = try await withTaskExecutorPreference(client.executor) { () async throws -> [UInt64] in
                var sequences: [UInt64] = []
                for n in 0..<200 {
                    // Each request is sent from, and each answer resumes this task on, the connection's loop.
                    #expect(loop.inEventLoop)
                    sequences.append(try await notes.insert(AppNote(id: "\(n)", text: "note \(n)")))
                    #expect(loop.inEventLoop)
                    #expect(notes.item(id: "\(n)") != nil)
                }
                return sequences
            }
            #expect(sequences == Array(1...200))
            #expect(notes.items.count == 200)
            // Off the executor, the same store and client go on working.
            #expect(try await notes.remove(id: "0") == 201)
            #expect(notes.items.count == 199)
        }
    }

    @Test func anAnswerGoesOnWithItsTaskInTheReadThatBroughtIt() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let notes = try await RemoteStore<AppNote>(client: client, loading: "notes")
            let loop = client.eventLoop
            let before = try await loop.submit { ReadyJobs.ranHere }.get()
            try await withTaskExecutorPreference(client.executor) {
                for n in 0..<100 { try await notes.insert(AppNote(id: "\(n)", text: "note \(n)")) }
            }
            // Each answer resumed its task right after the read handed it out, not through the loop's queue.
            let after = try await loop.submit { ReadyJobs.ranHere }.get()
            #expect(after - before >= 100)
            #expect(notes.items.count == 100)
        }
    }

    @Test func tasksResumedByOneReadAllGoOnAndOneClosingFailsTheRestCleanly() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let notes = try await RemoteStore<AppNote>(client: client, loading: "notes")
            // Four tasks on the executor write at once: answers arrive several to a read, and each task's next
            // request is written from within the read that resumed it.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for writer in 0..<4 {
                    group.addTask(executorPreference: client.executor) {
                        for n in 0..<50 { try await notes.insert(AppNote(id: "\(writer)-\(n)", text: "x")) }
                    }
                }
                try await group.waitForAll()
            }
            #expect(notes.items.count == 200)
            // One task closes the connection while the others wait for answers: what was in flight fails as
            // unavailable (a later write connects again), none hangs.
            let outcomes = await withTaskGroup(of: Bool.self, returning: [Bool].self) { group in
                for writer in 0..<3 {
                    group.addTask(executorPreference: client.executor) {
                        do throws(StoreBrokerError) {
                            for n in 0..<1000 { try await notes.insert(AppNote(id: "late-\(writer)-\(n)", text: "x")) }
                            return true
                        } catch {
                            return error.isUnavailable
                        }
                    }
                }
                group.addTask(executorPreference: client.executor) {
                    try? await notes.insert(AppNote(id: "closer", text: "x"))
                    await client.close()
                    return true
                }
                return await group.reduce(into: []) { $0.append($1) }
            }
            #expect(outcomes.allSatisfy { $0 })
            // The client connects again for the next request.
            #expect(try await notes.insert(AppNote(id: "after", text: "x")) > 200)
        }
    }
}
