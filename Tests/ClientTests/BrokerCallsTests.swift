import Foundation
import StoreBrokerClient
import StoreBrokerTesting
import Testing

// The typed calls applications and storectl use: each request's answer as the library's types, positions
// included, and the broker's refusals as `StoreBrokerError`s with their codes. No protocol type is named here.

private func item(_ id: String) -> Item { Item(id: ItemID(id), payload: Payload(#"{"id":"\#(id)"}"#)) }

@Suite struct BrokerCallsTests {
    @Test func readsAndWritesAnswerWithPositions() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let connection = try await client.connection()
            try await connection.ping()
            let first = try await connection.write("notes", .insert([item("a"), item("b"), item("c")]))
            #expect(first.committed && first.sequence == 1)
            let removed = try await connection.write("notes", .remove(["b"]), condition: .sequence(1))
            #expect(removed.committed && removed.sequence == 2 && removed.epoch == first.epoch)

            let count = try await connection.count("notes")
            #expect(count.value == 2 && count.position == Position(epoch: first.epoch, sequence: 2))
            let records = try await connection.records("notes")
            #expect(records.value.map(\.id.string) == ["a", "c"] && records.position.sequence == 2)
            #expect(try await connection.records("notes", after: "a", limit: 1).value.map(\.id.string) == ["c"])
            #expect(try await connection.ids("notes").value.map(\.string) == ["a", "c"])
            let slots = try await connection.items("notes", ids: ["c", "b"]).value
            guard case .present(let c) = slots.first, case .missing(let b) = slots.last else {
                Issue.record("expected c present and b missing, got \(slots)")
                return
            }
            #expect(c.id.string == "c" && String(buffer: c.payload.bytes) == #"{"id":"c"}"# && b.string == "b")

            let info = try await connection.storeInfo("notes")
            #expect(info.name == "notes" && info.count == 2 && info.sequence == 2)
            #expect(try await connection.stores().map(\.name) == ["notes"])
            #expect(try await connection.engines().contains { $0.name == "memory" && $0.status == .loaded })

            let dropped = try await connection.drop("notes")
            #expect(dropped.committed)
            #expect(try await connection.count("notes").value == 0)
        }
    }

    @Test func refusalsAreStoreBrokerErrorsWithTheirCodes() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let connection = try await client.connection()
            _ = try await connection.write("notes", .insert([item("a")]))
            let conflict = await #expect(throws: StoreBrokerError.self) {
                try await connection.write("notes", .removeAll, condition: .sequence(7))
            }
            #expect(conflict?.isConflict == true)
            #expect(try await connection.storeInfo("nothing").epoch == 0)
            let gone = await #expect(throws: StoreBrokerError.self) { try await connection.records("notes", after: "zz") }
            #expect(gone?.kind == .refused && gone?.code == .cursorGone)
            let badName = await #expect(throws: StoreBrokerError.self) { try await connection.count("bad name/") }
            #expect(badName?.code == .invalidName)
            // Nothing was lost to the refusals.
            #expect(try await connection.count("notes").value == 1)
        }
    }

    /// Pipelined writes: one hand-off for the batch, the outcomes in order, one refusal among them alone.
    @Test func pipelinedWritesAnswerInOrderAndARefusalStaysItsOwn() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let connection = try await client.connection()
            func note(_ n: Int) -> Item { Item(id: ItemID("\(n)"), payload: Payload(#"{"n":\#(n)}"#)) }
            let outcomes = try await connection.write(
                "notes",
                pipelined: [
                    (.insert([note(1)]), .unconditional), (.insert([note(2)]), .sequence(999)),
                    (.insert([note(3)]), .unconditional),
                ] + (4..<500).map { (.insert([note($0)]), .unconditional) })
            #expect(outcomes.count == 499)
            #expect((try? outcomes[0].get())?.sequence == 1)
            #expect((try? outcomes[1].get()) == nil)
            if case .failure(let error) = outcomes[1] { #expect(error.isConflict) }
            #expect(outcomes[2...].map { (try? $0.get())?.sequence } == (2..<499).map { UInt64($0) })
            #expect(try await connection.count("notes").value == 498)
        }
    }

    /// No broker: the error says so, keeps the socket's own error as its cause and where it was decided.
    @Test func noBrokerIsCannotConnectWithItsCause() async throws {
        let error = await #expect(throws: StoreBrokerError.self) {
            try await BrokerConnection.connect(socketPath: "/tmp/storebroker-nobody-\(UInt64.random(in: 0..<1 << 60)).sock", clientName: "t")
        }
        #expect(error?.kind == .cannotConnect && error?.codeName == "cannotConnect")
        #expect(error?.underlying != nil)
        #expect(error?.location.fileID == "StoreBrokerClient/BrokerConnection.swift")
        #expect(error?.causes.count == 2)
    }

    @Test func valuesSetResetAndReadBack() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let connection = try await client.connection()
            let unset = try await connection.value("theme")
            #expect(unset.value == .unset)
            let set = try await connection.setValue("theme", to: Payload(#"{"dark":true}"#), condition: .absent)
            #expect(set.committed)
            let read = try await connection.value("theme")
            #expect(read.value == .set(Payload(#"{"dark":true}"#)) && read.position.sequence == set.sequence)
            let reset = try await connection.setValue("theme", to: nil, condition: .sequence(set.sequence))
            #expect(reset.committed && reset.sequence == set.sequence + 1)
            #expect(try await connection.value("theme").value == .unset)
        }
    }

    /// More items than one request may carry go in several commits within the broker's limits, in order.
    @Test func insertInBatchesKeepsToTheBrokersLimits() async throws {
        try await withTemporaryBroker(engine: "memory", configure: { $0.broker.maxBatch = 100 }) { client in
            let connection = try await client.connection()
            let limits = connection.limits
            let total = Int(limits.maxBatch) * 2 + 5
            var reported: [Int] = []
            let last = try await connection.insertInBatches(
                "bulk", (0..<total).map { item(String($0)) }, condition: .absent, window: 2
            ) { reported.append($0) }
            #expect(last?.sequence == 3)
            #expect(reported == [Int(limits.maxBatch) * 2, total])
            #expect(try await connection.ids("bulk").value.map(\.string) == (0..<total).map(String.init))
            // The condition is the first commit's only: a second run conflicts before writing anything.
            await #expect(throws: StoreBrokerError.self) {
                try await connection.insertInBatches("bulk", [item("x")], condition: .absent)
            }
            #expect(try await connection.count("bulk").value == UInt64(total))
        }
    }

    /// `follow` yields the library's pushes: the snapshot, then each commit with its steps.
    @Test func followYieldsPushes() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let connection = try await client.connection()
            _ = try await connection.write("notes", .insert([item("a")]))
            var pushes = connection.follow(name: "notes").makeAsyncIterator()
            guard case .storeLoaded(let at, let records)? = try await pushes.next() else {
                Issue.record("the first push is not the snapshot")
                return
            }
            #expect(at.sequence == 1 && records.map(\.id.string) == ["a"])
            _ = try await connection.write("notes", .chain([.removeAll, .insert(items: [item("b")])]))
            guard case .storeEvent(let commit)? = try await pushes.next() else {
                Issue.record("the second push is not the commit")
                return
            }
            #expect(commit.sequence == 2 && commit.steps.count == 2)
        }
    }

    /// Callers write their requests to the socket themselves; a request larger than the socket's buffer goes
    /// on through the connection's channel, and every request after it follows that way until it is out. Many
    /// tasks at once, large and small requests mixed: every request arrives whole, each answer reaches its own
    /// caller, and the connection stays usable.
    @Test func requestsLargerThanTheSocketBufferFromManyTasksArriveWholeAndInOrder() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let connection = try await client.connection()
            let large = String(repeating: "L", count: 700_000)  // several socket buffers
            func payload(_ task: Int, _ n: Int) -> String { n % 10 == 0 ? "\(task)-\(n)-" + large : "\(task)-\(n)" }
            let sequences = try await withThrowingTaskGroup(of: [UInt64].self) { group in
                for task in 0..<8 {
                    group.addTask {
                        var mine: [UInt64] = []
                        for n in 0..<30 {
                            let written = try await connection.write(
                                "mixed", .insert([Item(id: ItemID("\(task)-\(n)"), payload: Payload(#"{"p":"\#(payload(task, n))"}"#))]))
                            mine.append(written.sequence)
                        }
                        return mine
                    }
                }
                var all: [[UInt64]] = []
                for try await mine in group { all.append(mine) }
                return all
            }
            // Each task's writes committed in its order; together, every sequence once.
            for mine in sequences { #expect(mine == mine.sorted()) }
            #expect(sequences.flatMap { $0 }.sorted() == Array(1...240))
            let records = try await connection.records("mixed").value
            #expect(records.count == 240)
            for record in records {
                let id = record.id.string
                let parts = id.split(separator: "-").compactMap { Int($0) }
                #expect(String(buffer: record.payload.bytes) == #"{"p":"\#(payload(parts[0], parts[1]))"}"#, "item \(id)")
            }
            try await connection.ping()
        }
    }

    /// A connection's descriptors (the request line's own and the channel's duplicate of it) are close-on-exec: a
    /// process the app spawns does not inherit them and hold the connection open after the app closes it.
    @Test func aConnectionsSocketsAreCloseOnExec() async throws {
        /// What a descriptor of this process refers to ("socket:[inode]" for a socket), "" once it is closed.
        func link(_ descriptor: Int32) -> String {
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(descriptor)")) ?? ""
        }
        /// Each socket descriptor of this process, by the socket it refers to.
        func sockets() -> [Int32: String] {
            let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
            var found: [Int32: String] = [:]
            for descriptor in names.compactMap(Int32.init) {
                let link = link(descriptor)
                if link.hasPrefix("socket:") { found[descriptor] = link }
            }
            return found
        }
        try await withTemporaryBroker(engine: "memory") { client in
            let before = sockets()
            let connection = try await BrokerConnection.connect(socketPath: client.socketPath, clientName: "cloexec")
            try await connection.ping()
            // A connection's two descriptors refer to one socket (other tests may open sockets meanwhile).
            let opened = sockets().filter { before[$0.key] == nil }
            let paired = Dictionary(grouping: opened.keys, by: { opened[$0]! }).values.filter { $0.count == 2 }.flatMap { $0 }
            #expect(paired.count >= 2, "no socket with two new descriptors among \(opened)")
            // Tests running meanwhile close their sockets, and a number may be reused: a descriptor counts only if
            // it still refers to the socket it was listed with after its flags were read. This connection's pair
            // stays open until the end, so at least it is checked.
            var checked = 0
            for descriptor in paired {
                let flags = fcntl(descriptor, F_GETFD)
                guard flags >= 0, link(descriptor) == opened[descriptor] else { continue }
                checked += 1
                #expect(flags & FD_CLOEXEC != 0, "descriptor \(descriptor) is inherited by exec")
            }
            #expect(checked >= 2, "this connection's descriptors were not among those checked")
            await connection.close()
        }
    }
}
