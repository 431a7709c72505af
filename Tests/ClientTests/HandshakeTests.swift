#if canImport(Glibc)
import Glibc
#endif
import Foundation
import StoreBrokerClient
import StoreBrokerTesting
import Testing

// A process whose tasks are slow to get a thread (a test run's cooperative pool busy with other suites; an app
// at launch) must still complete the handshake of a connection it has opened: the hello goes out from the event
// loop as soon as the socket connects, never after a hop through the caller's task. Found by CI, where two
// client tests failed with "the broker closed the connection before the handshake" after the broker's handshake
// timeout ran out on a connection whose task had not yet been scheduled to say hello.

/// Runs every job half a second late, on a thread of its own: a task whose turn comes slowly.
private final class LateExecutor: TaskExecutor, @unchecked Sendable {
    let delay: UInt32

    init(delayMicroseconds: UInt32) { delay = delayMicroseconds }

    func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        let delay = delay
        Thread.detachNewThread {
            usleep(delay)
            unowned.runSynchronously(on: executor)
        }
    }
}

@Suite struct HandshakeTests {
    @Test func aConnectionWhoseTaskIsLateStillCompletesItsHandshake() async throws {
        let broker = try await TemporaryBroker(engine: "memory") { $0.handshakeTimeout = .milliseconds(200) }
        let late = LateExecutor(delayMicroseconds: 600_000)
        let outcome = await withTaskExecutorPreference(late) { () async -> Result<Void, StoreBrokerError> in
            do throws(StoreBrokerError) {
                let connection = try await BrokerConnection.connect(
                    socketPath: broker.configuration.socketPath, clientName: "late-task")
                try await connection.ping()
                await connection.close()
                return .success(())
            } catch {
                return .failure(error)
            }
        }
        await broker.remove()
        #expect(throws: Never.self) { try outcome.get() }
    }
}
