import Foundation
import StoreBrokerClient
import TestSupport
import Testing
import Wire

extension Integration {
    /// The client library takes frames however the socket cuts them: a header in pieces, a frame ending in the
    /// middle of a read, several frames in one read (it reads whole frames where the socket put them and keeps
    /// only a partial one's bytes).
    @Suite struct ClientReads {
        @Test func answersCutAnywhereReachTheirCallers() async throws {
            try await withTemporaryDirectory(prefix: "client-reads") { directory in
                let broker = try FakeBroker(
                    socketPath: directory + "/cut.sock",
                    behaviour: .script { peer in
                        var asked: [(id: UInt32, store: String)] = []
                        while asked.count < 3, let (id, message) = try peer.nextRequest() {
                            if case .count(let count) = message { asked.append((id, count.store)) }
                        }
                        // Each store's count is its name's length: a wrong match of answer to caller shows.
                        let answers = asked.map { (ServerMessage.countResult(.init(epoch: 1, sequence: 2, count: UInt64($0.store.count))), id: $0.id) }
                        // Frames of 36 bytes: 3 bytes (a header in pieces), then to the middle of the second frame, then the rest.
                        try peer.send(answers, cutAt: [3, 50])
                        while try peer.nextRequest() != nil {}
                    })
                defer { broker.stop() }
                let connection = try await BrokerConnection.connect(socketPath: broker.socketPath, clientName: "cut")
                async let a = connection.count("a")
                async let bb = connection.count("bb")
                async let ccc = connection.count("ccc")
                let counts = try await [a.value, bb.value, ccc.value]
                #expect(counts == [1, 2, 3])
                await connection.close()
            }
        }
    }
}
