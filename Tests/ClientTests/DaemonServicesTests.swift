import Foundation
import StoreBrokerClient
import StoreBrokerTesting
import Testing
import Wire

/// The daemon as services, run in-process the way `withTemporaryBroker` runs it (issue "A core that speaks its
/// own language", deliverable 3): ordered shutdown, nothing left running, no signal handlers.
@Suite(.serialized) struct DaemonServices {
    /// Writes pipelined right up to the shutdown are each answered (committed, or refused `shuttingDown`), none
    /// lost to the close; every committed one is there after a restart on the same data directory, which the
    /// stopped daemon has unlocked (the restart would fail otherwise).
    @Test func shutdownAnswersEveryWriteThenUnlocks() async throws {
        let broker = try await TemporaryBroker()
        let connection = try await BrokerConnection.connect(socketPath: broker.configuration.socketPath, clientName: "services-test")
        let requests = (0..<300).map { ClientMessage.insert(.init(store: "s", items: [Item(id: ItemID("\($0)"), payload: Payload("{}"))])) }
        async let answers = connection.send(requests)
        try await Task.sleep(for: .milliseconds(2))
        await broker.stop()
        let results = try await answers
        var committed = 0
        for result in results {
            switch result {
            case .success(.writeResult(let write)): if write.committed { committed += 1 }
            case .failure(let error): #expect(error.code == .shuttingDown, "\(error)")
            case .success(let other): Issue.record("unexpected \(other.type.name)")
            }
        }
        await connection.close()
        try await broker.start()
        let count = try await broker.client.send(.count(.init(store: "s")))
        guard case .countResult(let result) = count else { throw StoreBrokerError(.protocolViolation, "no count") }
        #expect(result.count == UInt64(committed))
        await broker.remove()
    }

    /// An in-process broker installs no signal handler: SIGTERM and SIGINT keep the disposition they had.
    @Test func anInProcessBrokerLeavesSignalsAlone() async throws {
        func dispositions() -> [UnsafeMutableRawPointer?] {
            [SIGTERM, SIGINT].map { signal in
                var action = sigaction()
                sigaction(signal, nil, &action)
                return unsafeBitCast(action.__sigaction_handler.sa_handler, to: UnsafeMutableRawPointer?.self)
            }
        }
        let before = dispositions()
        let broker = try await TemporaryBroker(engine: "memory")
        #expect(dispositions() == before)
        await broker.stop()
        #expect(dispositions() == before)
        await broker.remove()
    }
}
