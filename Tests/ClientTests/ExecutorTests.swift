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
}
