import Foundation
import Observation
import StoreBrokerClient
import StoreBrokerTesting
import TestSupport
import Testing

// What an app developer relies on (issue 16): mirrors never hang, chains never swallow a write, Observation and
// Boutique's shapes, typed errors, bounded buffers. Each against a temporary broker.

struct AppNote: Codable, Sendable, Identifiable, Equatable {
    var id: String
    var text: String
}

private func note(_ id: String, _ text: String = "") -> AppNote { AppNote(id: id, text: text.isEmpty ? "note \(id)" : text) }

private func nowhere() -> String { "/tmp/storebroker-nowhere-\(UInt64.random(in: 0..<1 << 60)).sock" }

@Suite struct MirrorsNeverHang {
    /// A waiter that comes once the mirror has been told the broker is away gets that error at once, as the waiters
    /// already there did; the follower goes on trying, and once it is back a waiter waits again. Before: it waited
    /// for the broker's return (issue 52, point 5). For a store's mirror and a value's.
    @Test func aWaiterThatComesDuringAnOutageIsToldAtOnce() async throws {
        try await expectWaitersToldDuringOutage { client in
            let notes = RemoteStore<AppNote>(client: client, name: "notes")
            try await notes.itemsHaveLoaded()
            return { () async throws(StoreBrokerError) in try await notes.waitUntilSeen(sequence: 99) }
        }
        try await expectWaitersToldDuringOutage { client in
            let theme = RemoteValue<String>(client: client, key: "theme", default: "light")
            try await theme.valueHasLoaded()
            return { () async throws(StoreBrokerError) in try await theme.waitUntilSeen(sequence: 99) }
        }
    }

    /// `mirror` makes a loaded mirror on a broker and returns a wait on it that the broker never answers; the broker
    /// goes away; the wait there then and the one that comes after are both told it is out of reach.
    private func expectWaitersToldDuringOutage(
        _ mirror: (BrokerClient) async throws -> @Sendable () async throws(StoreBrokerError) -> Void
    ) async throws {
        try await withTemporaryDirectory(prefix: "sbc") { directory in
            let socket = directory + "/away.sock"
            let broker = try await TemporaryBroker(engine: "memory") { $0.socketPath = socket }
            let wait = try await mirror(BrokerClient(socketPath: socket, connectTimeout: .milliseconds(300)))
            let outcome = { @Sendable () async -> StoreBrokerError? in
                do throws(StoreBrokerError) {
                    try await wait()
                    return nil
                } catch {
                    return error
                }
            }
            let early = Task { await outcome() }
            await broker.remove()
            // Out of reach: refused, or (a busy machine) not answering in time.
            func lostTheBroker(_ error: StoreBrokerError?) -> Bool { error?.isUnavailable == true || error?.kind == .timedOut }
            let told = await early.value
            #expect(lostTheBroker(told), "the waiter there when the broker went away: \(String(describing: told))")
            // Told already: the next waiter gets the error at once (bounded here, where it never returned).
            let late = Task { await outcome() }
            let bound = Task {
                try? await Task.sleep(for: .seconds(20))
                late.cancel()
            }
            let lateError = await late.value
            bound.cancel()
            #expect(lostTheBroker(lateError), "the waiter that came during the outage: \(String(describing: lateError))")
        }
    }

    @Test func loadingWithNoBrokerFailsWithinTheConnectTimeoutAndKeepsTrying() async throws {
        try await withTemporaryDirectory(prefix: "sbc") { directory in
            let socket = directory + "/late.sock"
            let client = BrokerClient(socketPath: socket, connectTimeout: .milliseconds(300))
            let notes = RemoteStore<AppNote>(client: client, name: "notes")
            let started = ContinuousClock.now
            do throws(StoreBrokerError) {
                try await notes.itemsHaveLoaded()
                Issue.record("itemsHaveLoaded returned with no broker running")
            } catch {
                #expect(error.kind == .cannotConnect)  // `error` is a StoreBrokerError: typed throws
                #expect(error.message.contains(socket) && error.message.contains("retrying in the background"))
            }
            // Within the connect timeout, give or take a busy test process (a hang would never end: no bound is
            // tight enough for a parallel test run on two cores, 30 s tells the two apart).
            #expect(ContinuousClock.now - started < .seconds(30))
            guard case .error(let error) = notes.loadState else {
                Issue.record("loadState is \(notes.loadState), not the error")
                return
            }
            #expect(error.isUnavailable)
            // The async initializer says the same.
            await #expect(throws: StoreBrokerError.self) { try await RemoteStore<AppNote>(client: client, loading: "notes") }

            // The broker appears: the mirror, still trying in the background, loads.
            let broker = try await TemporaryBroker(engine: "memory") { $0.socketPath = socket }
            try await broker.client.connection().write("notes", .insert([Item(id: "1", payload: Payload(#"{"id":"1","text":"late"}"#))]))
            #expect(await eventually { notes.loadState.value?.map(\.text) == ["late"] })
            try await notes.itemsHaveLoaded()
            await broker.remove()
        }
    }

    @Test func aWaitingTaskCanBeCancelledAndCloseReleasesWaiters() async throws {
        let client = BrokerClient(socketPath: nowhere(), connectTimeout: .seconds(120))
        let notes = RemoteStore<AppNote>(client: client, name: "notes")
        let waiting = Task { () -> StoreBrokerError? in
            do throws(StoreBrokerError) {
                try await notes.itemsHaveLoaded()
                return nil
            } catch {
                return error
            }
        }
        try await Task.sleep(for: .milliseconds(50))
        let started = ContinuousClock.now
        waiting.cancel()
        #expect(await waiting.value?.kind == .cancelled)
        #expect(ContinuousClock.now - started < .seconds(30))  // not the 120 s connect timeout

        let other = Task { () -> StoreBrokerError? in
            do throws(StoreBrokerError) {
                try await notes.waitUntilSeen(sequence: 5)
                return nil
            } catch {
                return error
            }
        }
        try await Task.sleep(for: .milliseconds(50))
        notes.close()
        #expect(await other.value?.kind == .closed)
        await #expect(throws: StoreBrokerError.self) { try await notes.itemsHaveLoaded() }
    }
}

@Suite struct BoutiqueShapes {
    @Test func observationSeesItemsSequenceValuesAndLoadState() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let notes = RemoteStore<AppNote>(client: client, name: "notes")
            let loadChanged = Flag()
            withObservationTracking { _ = notes.loadState } onChange: { loadChanged.set() }
            try await notes.itemsHaveLoaded()
            #expect(await eventually { loadChanged.isSet })

            let itemsChanged = Flag()
            let sequenceChanged = Flag()
            withObservationTracking { _ = notes.items } onChange: { itemsChanged.set() }
            withObservationTracking { _ = notes.sequence } onChange: { sequenceChanged.set() }
            // Another process writes: the mirror's change is seen through Observation.
            let other = BrokerClient(socketPath: client.socketPath)
            try await other.connection().write("notes", .insert([Item(id: "a", payload: Payload(#"{"id":"a","text":"x"}"#))]))
            #expect(await eventually { itemsChanged.isSet && sequenceChanged.isSet })
            #expect(notes.items == [AppNote(id: "a", text: "x")])

            let dark = RemoteValue(client: client, key: "dark", default: false)
            try await dark.valueHasLoaded()
            let valueChanged = Flag()
            withObservationTracking { _ = dark.value } onChange: { valueChanged.set() }
            try await RemoteValue(client: other, key: "dark", default: false).set(true)
            #expect(await eventually { valueChanged.isSet && dark.value })

            let token = RemoteSecureValue<String>(client: client, key: "token")
            try await token.valueHasLoaded()
            let secretChanged = Flag()
            withObservationTracking { _ = token.value } onChange: { secretChanged.set() }
            try await token.set("s3cr3t")
            #expect(secretChanged.isSet && token.value == "s3cr3t")
            await other.close()
        }
    }

    final class Settings {
        @RemoteStored var notes: [AppNote]
        @RemoteStoredValue var darkMode: Bool
        @RemoteSecurelyStoredValue<String> var token: String?

        init(client: BrokerClient, store: RemoteStore<AppNote>) {
            _notes = RemoteStored(in: store)
            _darkMode = RemoteStoredValue(wrappedValue: false, key: "dark-mode", client: client)
            _token = RemoteSecurelyStoredValue(key: "token", client: client)
        }
    }

    @Test func propertyWrappersReadTheMirrorsAndWriteThroughTheirProjections() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let settings = Settings(client: client, store: RemoteStore(client: client, name: "notes"))
            try await settings.$notes.itemsHaveLoaded()
            try await settings.$darkMode.valueHasLoaded()
            #expect(settings.notes.isEmpty && settings.darkMode == false && settings.token == nil)
            try await settings.$notes.insert(note("1"))
            try await settings.$darkMode.toggle()
            try await settings.$token.set("t")
            #expect(settings.notes == [note("1")] && settings.darkMode && settings.token == "t")
        }
    }

    /// Inside `withTemporaryBroker`, a property wrapper made without a client (Boutique's spelling) writes into
    /// the temporary broker, and the process's default client (the user's real broker, at `STOREBROKER_SOCKET`)
    /// is never even asked to connect; outside, `shared` is that default again.
    @Test func wrappersWithoutAClientUseTheTemporaryBrokerNeverTheRealOne() async throws {
        let attemptsBefore = BrokerClient.processDefault.connectAttempts.load(ordering: .relaxed)
        try await withTemporaryBroker(engine: "memory") { client in
            #expect(BrokerClient.shared === client)
            let answer = RemoteStoredValue(wrappedValue: 0, key: "answer")
            try await answer.projectedValue.set(42)
            let token = RemoteSecurelyStoredValue<String>(key: "token")
            try await token.projectedValue.set("s3cr3t")
            #expect(await Task { BrokerClient.shared }.value === client, "a child task left the scope")
            let check = try await RemoteValue<Int>(client: client, loading: "answer", default: 0)
            #expect(check.value == 42)
            check.close()
        }
        #expect(BrokerClient.shared === BrokerClient.processDefault)
        #expect(BrokerClient.processDefault.connectAttempts.load(ordering: .relaxed) == attemptsBefore)
    }

    @Test func asyncInitItemByIdConditionalWritesAndWaitingForASequence() async throws {
        try await withTemporaryBroker(engine: "memory") { client in
            let notes = try await RemoteStore<AppNote>(client: client, loading: "notes")
            #expect(notes.loadState.value != nil)
            let first = try await notes.insert([note("a"), note("b")])
            #expect(first == 1 && notes.sequence == 1)
            #expect(notes.item(id: "b") == note("b") && notes.item(id: "z") == nil)

            // Conditional writes: the expected sequence, as `storectl --expect`.
            #expect(try await notes.insert(note("c"), expecting: 1) == 2)
            do throws(StoreBrokerError) {
                try await notes.remove(id: "a", expecting: 1)
                Issue.record("a write expecting a stale sequence was committed")
            } catch {
                #expect(error.isConflict)
            }
            do throws(StoreBrokerError) {
                try await notes.chain().removeAll().insert(note("z")).run(expecting: 1)
                Issue.record("a chain expecting a stale sequence was committed")
            } catch {
                #expect(error.isConflict)
            }
            #expect(notes.items.map(\.id) == ["a", "b", "c"])
            #expect(try await notes.chain().removeAll().insert(note("z")).run(expecting: 2) == 3)
            #expect(notes.items.map(\.id) == ["z"])

            // Another process's write: wait until this mirror has seen its sequence.
            let other = try await RemoteStore<AppNote>(client: BrokerClient(socketPath: client.socketPath), loading: "notes")
            let theirs = try await other.insert(note("from-other"))
            try await notes.waitUntilSeen(sequence: theirs)
            #expect(notes.item(id: "from-other") != nil)

            let flag = try await RemoteValue(client: client, loading: "flag", default: 0)
            let otherFlag = RemoteValue(client: BrokerClient(socketPath: client.socketPath), key: "flag", default: 0)
            let set = try await otherFlag.set(7)
            try await flag.waitUntilSeen(sequence: set)
            #expect(flag.value == 7 && flag.sequence == set)
            do throws(StoreBrokerError) {
                try await flag.set(8, expecting: set - 1)
                Issue.record("a value write expecting a stale sequence was committed")
            } catch {
                #expect(error.isConflict)
            }
        }
    }

    @MainActor final class Screen {
        var titles: [String] = []
    }

    @MainActor @Test func aMainActorTestUsesATemporaryBroker() async throws {
        let screen = Screen()
        try await withTemporaryBroker(engine: "memory") { client in
            let notes = try await RemoteStore<AppNote>(client: client, loading: "notes")
            try await notes.insert(note("1", "milk"))
            screen.titles = notes.items.map(\.text)  // main-actor state, touched in the body
        }
        #expect(screen.titles == ["milk"])
    }
}

@Suite struct BoundedClientBuffers {
    @Test func aSlowEventReaderLagsAndResynchronizes() async throws {
        try await withTemporaryBroker(engine: "memory") { broker in
            let client = BrokerClient(socketPath: broker.socketPath, eventBuffer: 16)
            let notes = try await RemoteStore<AppNote>(client: client, loading: "notes")
            let events = notes.events  // registered now, not read until the writes are done
            for n in 1...200 { try await notes.insert(note("\(n)")) }
            var operations: [StoreEvent<AppNote>.Operation] = []
            var replica: [String] = []  // what a reader rebuilds from the stream alone
            var lagged: Int?
            for await event in events {
                operations.append(event.operation)
                #expect(!event.afterLag || event.operation == .loaded, "afterLag on \(event.operation)")
                if event.afterLag, lagged == nil { lagged = operations.count - 1 }
                // Boutique's exhaustive switch: lag is no case of its own, but a fresh `loaded` (`afterLag`).
                switch event.operation {
                case .initialized: break
                case .loaded: replica = event.items.map(\.id)
                case .insert: replica += event.items.map(\.id).filter { !replica.contains($0) }
                case .remove: replica.removeAll { id in event.items.contains { $0.id == id } }
                }
                if event.sequence == 200 { break }
            }
            // At most the buffer's worth before the lag; then every item at once, and what came after.
            let lag = try #require(lagged)
            #expect(lag <= 16)
            #expect(operations.count - lag <= 16 + 1)
            #expect(replica == (1...200).map { "\($0)" })
            #expect(notes.items.count == 200)
        }
    }

    @Test func anUnreadSubscriptionLagsAtTheLastPushTakenAndFollowResumesGapFree() async throws {
        try await withTemporaryBroker(engine: "memory") { broker in
            let connection = try await BrokerConnection.connect(socketPath: broker.socketPath, clientName: "slow", pushBuffer: 8)
            let writer = try await broker.connection()
            func write(_ n: Int) async throws {
                _ = try await writer.write("s", .insert([Item(id: ItemID("\(n)"), payload: Payload("\(n)"))]))
            }
            try await write(0)
            let subscription = try await connection.subscribe(name: "s")
            var pushes = subscription.pushes.makeAsyncIterator()
            guard case .storeLoaded(let at, _)? = try await pushes.next() else {
                Issue.record("no snapshot first")
                return
            }
            #expect(at.sequence == 1)
            for n in 1...100 { try await write(n) }
            try await connection.ping()  // every push sent before the pong has been read from the socket
            var rest: [Push] = []
            while let push = try await pushes.next() { rest.append(push) }
            // What the reader had not taken is gone; `lagged` names the last push it took.
            guard rest.count == 1, case .lagged(let lagged) = rest[0] else {
                Issue.record("expected one lagged, got \(rest)")
                return
            }
            #expect(lagged == at)
            try await connection.ping()  // the connection goes on

            // follow() lags the same way and resubscribes from the last push taken: nothing is skipped.
            var sequences: [UInt64] = []
            var notices = 0
            var follow = connection.follow(name: "s", from: .resume(epoch: at.epoch, sequence: at.sequence)).makeAsyncIterator()
            if case .storeEvent(let commit)? = try await follow.next() { sequences.append(commit.sequence) }
            for n in 101...150 { try await write(n) }
            try await connection.ping()
            while let push = try await follow.next() {
                switch push {
                case .storeEvent(let commit): sequences.append(commit.sequence)
                case .lagged: notices += 1
                default: Issue.record("unexpected \(push)")
                }
                if sequences.last == 151 { break }
            }
            #expect(notices >= 1)
            #expect(sequences == Array(2...151))
        }
    }
}
