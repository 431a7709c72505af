import Foundation
import NIOCore
import StoreBrokerClient
import StoreBrokerTesting
import Testing
import Wire

@Suite struct RemoteValueBehaviour {
    @Test func defaultSetResetAndAStreamThatStartsWithTheCurrentValue() async throws {
        try await withTemporaryBroker { client in
            let theme = RemoteValue(client: client, key: "theme", default: "light")
            try await theme.valueHasLoaded()
            #expect(theme.value == "light")
            let seen = Collected<String>()
            let themeValues = theme.values  // registered now, before the writes below
            let watching = Task { for await value in themeValues { seen.append(value) } }
            try await theme.set("dark")
            #expect(theme.value == "dark")
            try await theme.reset()
            #expect(theme.value == "light")
            #expect(await seen.waitFor(count: 3))
            #expect(seen.all == ["light", "dark", "light"])
            watching.cancel()
            // Another process sees it: loaded after the write, and kept current after that.
            try await theme.set("blue")
            let other = RemoteValue(client: BrokerClient(socketPath: client.socketPath), key: "theme", default: "x")
            try await other.valueHasLoaded()
            #expect(other.value == "blue")
            let otherSeen = Collected<String>()
            let otherValues = other.values
            let following = Task { for await value in otherValues { otherSeen.append(value) } }
            try await theme.set("green")
            #expect(await otherSeen.waitFor(count: 2))
            #expect(otherSeen.all == ["blue", "green"])
            following.cancel()
        }
    }

    @Test func helpersAreCompareAndSet() async throws {
        try await withTemporaryBroker { client in
            let flag = RemoteValue(client: client, key: "flag", default: false)
            try await flag.toggle()
            #expect(flag.value == true)
            let tags = RemoteValue<[String]>(client: client, key: "tags", default: [])
            try await tags.append("a")
            try await tags.append("b")
            try await tags.togglePresence("a")
            try await tags.togglePresence("c")
            #expect(tags.value == ["b", "c"])
            let scores = RemoteValue<[String: Int]>(client: client, key: "scores", default: [:])
            try await scores.update(key: "ann", value: 3)
            try await scores.update(key: "bob", value: 5)
            try await scores.update(key: "ann", value: nil)
            #expect(scores.value == ["bob": 5])
        }
    }

    @Test func concurrentTogglesFromTwoClientsLoseNothing() async throws {
        try await withTemporaryBroker { client in
            let a = RemoteValue(client: client, key: "flag", default: false)
            let b = RemoteValue(client: BrokerClient(socketPath: client.socketPath), key: "flag", default: false)
            let list = RemoteValue<[Int]>(client: client, key: "list", default: [])
            let otherList = RemoteValue<[Int]>(client: BrokerClient(socketPath: client.socketPath), key: "list", default: [])
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { for n in 0..<100 { try await a.toggle(); try await list.append(n) } }
                group.addTask { for n in 100..<200 { try await b.toggle(); try await otherList.append(n) } }
                try await group.waitForAll()
            }
            // Read the broker's state (a mirror may still be one event behind the other client's last write).
            guard case .valueResult(let flag) = try await client.send(.getValue(.init(name: "flag"))),
                case .valueResult(let appended) = try await client.send(.getValue(.init(name: "list"))),
                case .set(let flagBytes) = flag.state, case .set(let listBytes) = appended.state
            else {
                Issue.record("the values are not set")
                return
            }
            #expect(flag.sequence == 200)  // every toggle committed once
            #expect(String(buffer: flagBytes.bytes) == "false")
            let numbers = try JSONDecoder().decode([Int].self, from: Data(listBytes.bytes.readableBytesView))
            #expect(numbers.count == 200 && Set(numbers) == Set(0..<200))
        }
    }

    @Test func secureValuesSetReadAndRemove() async throws {
        try await withTemporaryBroker { client in
            let token = RemoteSecureValue<String>(client: client, key: "token")
            try await token.valueHasLoaded()
            #expect(token.value == nil)
            try await token.set("s3cr3t")
            #expect(token.value == "s3cr3t")
            let other = RemoteSecureValue<String>(client: BrokerClient(socketPath: client.socketPath), key: "token")
            try await other.valueHasLoaded()
            #expect(other.value == "s3cr3t")
            try await token.set(nil)
            #expect(token.value == nil)
        }
    }

    /// As a store's mirror (RemoteStoreBehaviour): a value this process sets is kept as it was set, what another
    /// process sets is decoded (a field the encoding leaves out shows which), secure values alike.
    @Test func aValueKeepsItsOwnWritesAsWrittenAndDecodesOthers() async throws {
        try await withTemporaryBroker { client in
            let draft = try await RemoteValue(client: client, loading: "draft", default: Draft(id: "", text: ""))
            let otherClient = BrokerClient(socketPath: client.socketPath)
            let other = try await RemoteValue(client: otherClient, loading: "draft", default: Draft(id: "", text: ""))
            try await draft.set(Draft(id: "1", text: "one", unsaved: 1))
            #expect(draft.value.unsaved == 1)
            try await other.waitUntilSeen(sequence: draft.sequence)
            #expect(other.value == Draft(id: "1", text: "one", unsaved: 0))
            let secret = RemoteSecureValue<Draft>(client: client, key: "secret-draft")
            try await secret.valueHasLoaded()
            try await secret.set(Draft(id: "2", text: "two", unsaved: 2))
            #expect(secret.value?.unsaved == 2)
            await otherClient.close()
        }
    }
}

final class Collected<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var values: [T] = []

    func append(_ value: T) { lock.withLock { values.append(value) } }
    var all: [T] { lock.withLock { values } }

    func waitFor(count: Int) async -> Bool {
        for _ in 0..<1000 {
            if all.count >= count { return true }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return false
    }
}
