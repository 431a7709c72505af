#if canImport(Glibc)
import Glibc
#endif
import Dispatch
import Foundation
import NIOCore
@testable import StoreBrokerClient
import StoreBrokerTesting
import Synchronization
import Testing

/// The client's own loop (`ClientLoop`): its tasks and timers, and its sockets' reads and writes.
@Suite struct ClientLoopBehaviour {
    @Test func timersRunInDeadlineOrderOnTheLoopAndACancelledOneNever() async throws {
        let loop = ClientLoop.shared
        let order = Mutex<[Int]>([])
        func note(_ n: Int) -> @Sendable () -> Void {
            { order.withLock { $0.append(loop.inEventLoop ? n : -n) } }
        }
        let late = loop.scheduleTask(in: .milliseconds(60), note(3))
        let cancelled = loop.scheduleTask(in: .milliseconds(30), note(99))
        let early = loop.scheduleTask(in: .milliseconds(10), note(1))
        let middle = loop.scheduleTask(in: .milliseconds(40), note(2))
        cancelled.cancel()
        try await early.futureResult.get()
        try await middle.futureResult.get()
        try await late.futureResult.get()
        await #expect(throws: EventLoopError.self) { try await cancelled.futureResult.get() }
        #expect(order.withLock { $0 } == [1, 2, 3])
    }

    @Test func tasksFromManyThreadsAllRunOnTheLoopInEachThreadsOrder() async throws {
        let loop = ClientLoop.shared
        let seen = Mutex<(next: [Int], wrong: Int)>(([0, 0, 0, 0], 0))
        // From plain threads (never block the cooperative pool): 4 × 10,000 tasks at once.
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            Thread {
                DispatchQueue.concurrentPerform(iterations: 4) { thread in
                    for n in 0..<10_000 {
                        loop.execute {
                            seen.withLock { seen in
                                if !loop.inEventLoop || seen.next[thread] != n { seen.wrong += 1 }
                                seen.next[thread] = n + 1
                            }
                        }
                    }
                }
                done.resume()
            }.start()
        }
        // Submitted after every task above: it runs after them.
        try await loop.submit {}.get()
        let result = seen.withLock { $0 }
        #expect(result.next == [10_000, 10_000, 10_000, 10_000])
        #expect(result.wrong == 0)
    }

    /// A request bigger than the socket's buffer is written partly by its caller and the rest by the loop as
    /// the socket drains; pipelined ones are written by the loop; a 16 MB answer arrives over many reads.
    @Test func writesBiggerThanTheSocketAndAnswersOfManyReadsArriveWhole() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let connection = try await client.connection()
            func item(_ n: Int) -> Item {
                let letter = Character(UnicodeScalar(UInt8(ascii: "a") + UInt8(n % 26)))
                return Item(id: ItemID("big-\(n)"), payload: Payload("\"" + String(repeating: letter, count: 1_000_000) + "\""))
            }
            let first = try await connection.write("big", .insert((0..<8).map(item)))
            #expect(first.committed)
            let pipelined = try await connection.write(
                "big", pipelined: stride(from: 8, to: 16, by: 2).map { (.insert([item($0), item($0 + 1)]), .unconditional) })
            #expect(pipelined.allSatisfy { (try? $0.get())?.committed == true })
            // Small requests right behind the big ones keep their order.
            #expect(try await connection.count("big").value == 16)
            let records = try await connection.records("big").value
            #expect(records.map(\.id) == (0..<16).map { ItemID("big-\($0)") })
            #expect(records.map(\.payload) == (0..<16).map { item($0).payload })
        }
    }

    @Test func aSocketPathTooLongIsCannotConnectSayingSo() async throws {
        let error = await #expect(throws: StoreBrokerError.self) {
            try await BrokerConnection.connect(socketPath: "/tmp/" + String(repeating: "x", count: 200), clientName: "t")
        }
        #expect(error?.kind == .cannotConnect)
        #expect(error?.message.contains("too long") == true)
    }

    /// A listener whose backlog is full (it never accepts): connecting is tried again until the limit, then
    /// fails as `cannotConnect` saying so; nothing hangs.
    @Test func aFullBacklogIsTriedUntilTheLimitThenCannotConnect() async throws {
        let path = "/tmp/storebroker-backlog-\(UInt64.random(in: 0..<1 << 60)).sock"
        let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: path.utf8)
            raw[path.utf8.count] = 0
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        #expect(bound == 0)
        #expect(listen(listener, 0) == 0)
        defer {
            close(listener)
            unlink(path)
        }
        // Fill the backlog.
        var fillers: [CInt] = []
        defer { for filler in fillers { close(filler) } }
        for _ in 0..<64 {
            guard case .connected(let filler) = RequestLine.connect(unixDomainSocketPath: path) else { break }
            fillers.append(filler)
        }
        guard case .failed(EAGAIN) = RequestLine.connect(unixDomainSocketPath: path) else {
            Issue.record("the backlog did not fill")
            return
        }
        let clock = ContinuousClock()
        let start = clock.now
        let error = await #expect(throws: StoreBrokerError.self) {
            try await BrokerConnection.connect(socketPath: path, clientName: "t", handshakeTimeout: .milliseconds(300))
        }
        #expect(error?.kind == .cannotConnect)
        #expect(error?.message.contains("did not accept the connection in time") == true)
        #expect(clock.now - start >= .milliseconds(300))
        // Ends soon after the limit; a loaded test run can hold a 2 ms sleep back for seconds (8.9 s seen).
        #expect(clock.now - start < .seconds(60))
    }

    /// Connections opened, used, subscribed and closed by many tasks at once, some closed with requests in flight:
    /// every call ends (answered, or failed as unavailable), the loop keeps serving, and no descriptor is left.
    @Test func manyConnectionsOpenedAndClosedAtOnceAllEnd() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let socketPath = client.socketPath
            let before = try FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count
            try await withThrowingTaskGroup(of: Void.self) { group in
                for worker in 0..<16 {
                    group.addTask {
                        for round in 0..<10 {
                            let connection = try await BrokerConnection.connect(socketPath: socketPath, clientName: "stress")
                            let subscription = try await connection.subscribe(name: "stress-\(worker)")
                            _ = try await connection.write(
                                "stress-\(worker)", .insert([Item(id: ItemID("\(round)"), payload: Payload("{}"))]))
                            if round % 2 == 0 {
                                // Closed with a request in flight: it ends, answered or unavailable.
                                async let late = connection.count("stress-\(worker)")
                                await connection.close()
                                do { _ = try await late } catch { #expect((error as? StoreBrokerError)?.isUnavailable == true) }
                            } else {
                                try await connection.unsubscribe(subscription)
                                await connection.close()
                            }
                            #expect(!connection.isOpen)
                        }
                    }
                }
                try await group.waitForAll()
            }
            // The loop still serves: a fresh connection answers.
            let connection = try await BrokerConnection.connect(socketPath: socketPath, clientName: "after")
            #expect(try await connection.count("stress-0").value == 10)
            await connection.close()
            // The broker (in this process) closes its side as it reads each close: given a moment.
            var after = Int.max
            for _ in 0..<100 {
                after = try FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count
                if after <= before + 2 { break }
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect(after <= before + 2, "descriptors: \(before) before, \(after) after")
        }
    }
}
