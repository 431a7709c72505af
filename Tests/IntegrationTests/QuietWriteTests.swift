import Foundation
@testable import StoreBrokerClient
import TestSupport
import Testing
import Wire

extension Integration {
    /// `quietChain`: a write naming a subscription of its own connection, whose event that subscription is not
    /// pushed (its client applies the write itself) while every other subscriber gets it and history keeps it.
    @Suite struct QuietWrite {
        static func item(_ id: String) -> Item { Item(id: ItemID(id), payload: Payload("{\"id\":\"\(id)\"}")) }

        /// Subscribes `client` to `store` and reads the answer and the snapshot; returns the subscription id.
        static func subscribe(_ client: RawClient, _ store: String, id: UInt32, from start: SubscriptionStart = .snapshot) throws -> UInt32 {
            try client.request(.subscribe(.init(name: store, start: start)), id: id)
            guard case .subscribed(let subscribed)? = try read(until: id, on: client).answers[id] else {
                throw DaemonFailure("no subscribed answer")
            }
            return subscribed.subscriptionID
        }

        /// Reads until the answer to request `id`: the sequences of the events each subscription was pushed
        /// meanwhile, and every answer by request id.
        static func read(until id: UInt32, on client: RawClient) throws -> (events: [UInt32: [UInt64]], answers: [UInt32: ServerMessage]) {
            var events: [UInt32: [UInt64]] = [:]
            var answers: [UInt32: ServerMessage] = [:]
            while let (frameID, message) = try client.nextMessage() {
                if case .storeEvent(let event) = message { events[frameID, default: []].append(event.sequence) }
                guard !message.type.isPush else { continue }
                answers[frameID] = message
                if frameID == id { return (events, answers) }
            }
            throw DaemonFailure("the connection closed before the answer to \(id)")
        }

        @Test func theNamedSubscriptionIsNotPushedTheWriteEveryOtherOneIsAndHistoryKeepsIt() async throws {
            try await Daemon.with { daemon in
                let writer = try RawClient(socketPath: daemon.socketPath)
                let other = try RawClient(socketPath: daemon.socketPath)
                try writer.handshake()
                try other.handshake()
                let mirror = try Self.subscribe(writer, "notes", id: 1)
                let second = try Self.subscribe(writer, "notes", id: 2)  // another mirror on the same connection
                let watcher = try Self.subscribe(other, "notes", id: 1)

                try writer.request(
                    .quietChain(.init(subscriptionID: mirror, store: "notes", elements: [.insert(items: [Self.item("a")])])),
                    id: 10)
                try writer.request(.insert(.init(store: "notes", items: [Self.item("b")])), id: 11)
                let (pushed, answers) = try Self.read(until: 11, on: writer)
                guard case .writeResult(let quiet)? = answers[10], case .writeResult(let plain)? = answers[11] else {
                    throw DaemonFailure("answered \(answers)")
                }
                #expect(quiet.committed && quiet.sequence == 1 && plain.sequence == 2)
                #expect(pushed[mirror] == [2], "the named subscription skips the quiet write's commit, gets the next")
                #expect(pushed[second] == [1, 2], "a second subscription of the same connection gets both")

                var otherEvents: [UInt64] = []
                while otherEvents.count < 2, let (frameID, message) = try other.nextMessage() {
                    if case .storeEvent(let event) = message, frameID == watcher { otherEvents.append(event.sequence) }
                }
                #expect(otherEvents == [1, 2], "another connection's subscriber gets every commit")

                // History holds the quiet commit: resuming from before it replays it, on any subscription.
                let epoch = quiet.epoch
                let resumed = try Self.subscribe(writer, "notes", id: 20, from: .resume(epoch: epoch, sequence: 0))
                var replayed: [UInt64] = []
                while replayed.count < 2, let (frameID, message) = try writer.nextMessage() {
                    if case .storeEvent(let event) = message, frameID == resumed { replayed.append(event.sequence) }
                }
                #expect(replayed == [1, 2])
            }
        }

        @Test func anIdThatNamesNoSubscriptionOfThisConnectionToThatStoreSilencesNothing() async throws {
            try await Daemon.with { daemon in
                let writer = try RawClient(socketPath: daemon.socketPath)
                try writer.handshake()
                let notes = try Self.subscribe(writer, "notes", id: 1)
                let elsewhere = try Self.subscribe(writer, "other", id: 2)
                var id: UInt32 = 10
                for named in [UInt32(999), elsewhere] {
                    id += 1
                    try writer.request(
                        .quietChain(.init(subscriptionID: named, store: "notes", elements: [.insert(items: [Self.item("x\(id)")])])),
                        id: id)
                    let (pushed, answers) = try Self.read(until: id, on: writer)
                    guard case .writeResult(let result)? = answers[id], result.committed else {
                        throw DaemonFailure("a quietChain naming \(named) was answered \(answers)")
                    }
                    #expect(pushed[notes] == [result.sequence], "naming subscription \(named): the write is a plain one")
                }
            }
        }

        /// A broker from before `quietChain` answers it `unknownMessageType`: a `RemoteStore` then writes plainly
        /// on that connection (asking once), its commits come back as pushes, and it still takes what it wrote as
        /// written (the JSON here drops a field). The broker is a script.
        @Test func aBrokerWithoutQuietChainGetsPlainWritesAndTheMirrorStillKeepsWhatItWrote() async throws {
            struct Draft: Codable, Sendable, Identifiable {
                var id: String
                var unsaved = 0
                enum CodingKeys: String, CodingKey { case id }
            }
            final class Count: @unchecked Sendable {
                private let lock = NSLock()
                private var count = 0
                func add() { lock.withLock { count += 1 } }
                var value: Int { lock.withLock { count } }
            }
            let quietChains = Count()
            try await withTemporaryDirectory(prefix: "quiet-old") { directory in
                let old = try FakeBroker(
                    socketPath: directory + "/old.sock",
                    behaviour: .script { peer in
                        var sequence: UInt64 = 0
                        while let (id, message) = try peer.nextRequest() {
                            switch message {
                            case .subscribe:
                                try peer.send(.subscribed(.init(subscriptionID: 1)), id: id)
                                try peer.send(.storeLoaded(.init(epoch: 0, sequence: 0, count: 0, elements: [])), id: 1)
                            case .quietChain:
                                quietChains.add()
                                try peer.send(.error(.init(code: .unknownMessageType, message: "unknown type 0x24")), id: id)
                            case .insert(let insert):
                                sequence += 1
                                let records = insert.items.map {
                                    ItemRecord(id: $0.id, createdAt: 1, updatedAt: 1, payload: $0.payload)
                                }
                                try peer.send(.storeEvent(.init(epoch: 7, sequence: sequence, elements: [.insert(records: records)])), id: 1)
                                try peer.send(.writeResult(.init(committed: true, epoch: 7, sequence: sequence)), id: id)
                            default:
                                try peer.send(.error(.init(code: .invalidRequest, message: "not scripted")), id: id)
                            }
                        }
                    })
                defer { old.stop() }
                let client = BrokerClient(socketPath: old.socketPath)
                let store = try await RemoteStore<Draft>(client: client, loading: "drafts")
                try await store.insert(Draft(id: "a", unsaved: 1))
                try await store.insert(Draft(id: "b", unsaved: 2))
                #expect(store.items.map(\.unsaved) == [1, 2])
                #expect(store.sequence == 2)
                #expect(quietChains.value == 1, "asked once per connection")
                #expect(store.writesAppliedFromAnswers == 0)
                store.close()
                await client.close()
            }
        }

        /// One step is that step's own request (an insert of `--max-batch` items fits); several are a chain,
        /// whose steps count too.
        @Test func oneStepHasItsRequestsLimitsSeveralAChains() async throws {
            try await Daemon.with(arguments: ["--max-batch", "3"]) { daemon in
                let writer = try RawClient(socketPath: daemon.socketPath)
                try writer.handshake()
                let notes = try Self.subscribe(writer, "notes", id: 1)
                let three = ["a", "b", "c"].map(Self.item)
                var id: UInt32 = 1
                let answers = try writer.exchange(
                    [
                        .quietChain(.init(subscriptionID: notes, store: "notes", elements: [.insert(items: three)])),
                        .quietChain(
                            .init(subscriptionID: notes, store: "notes", elements: [.insert(items: [three[0]]), .remove(ids: [ItemID("b")])])),
                        .count(.init(store: "notes")),
                    ], id: &id)
                guard case .writeResult(let batch) = answers[0] else { throw DaemonFailure("answered \(answers[0])") }
                #expect(batch.committed && batch.sequence == 1)
                guard case .error(let refused) = answers[1] else { throw DaemonFailure("answered \(answers[1])") }
                #expect(refused.code == .batchTooLarge, "\(refused.message)")
                guard case .countResult(let count) = answers[2] else { throw DaemonFailure("answered \(answers[2])") }
                #expect(count.count == 3 && count.sequence == 1, "the refused chain changed nothing")
            }
        }
    }
}
