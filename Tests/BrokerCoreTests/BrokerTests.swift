import Foundation
import Logging
import NIOCore
import Synchronization
import TestSupport
import Testing

@testable import BrokerCore
@testable import StoreModel

/// A wall clock that moves only when a test moves it: timestamps differ because the test said so, never because
/// it slept.
final class HandClock: Sendable {
    private let now: Atomic<UInt64>

    init(at start: UInt64 = 1_000_000) { now = Atomic(start) }

    var milliseconds: UInt64 { now.load(ordering: .relaxed) }
    func advance(by milliseconds: UInt64) { now.add(milliseconds, ordering: .relaxed) }
    var wallClock: WallClock { WallClock { self.milliseconds } }
}

/// A broker over `TestEngine` in a temporary data directory, its commits stamped by `clock`.
private func withBroker(
    history: Int = 100, writerThreads: Int = 4, maxGroupWait: Duration = .milliseconds(1), maxGroupCommit: Int? = nil,
    engine: TestEngine = TestEngine(), clock: HandClock = HandClock(), _ body: (Broker, TestEngine) async throws -> Void
) async throws {
    try await withTemporaryDirectory(prefix: "sb-core") { directory in
        var configuration = BrokerConfiguration(
            dataDirectory: directory, defaultEngine: "test", history: history, writerThreads: writerThreads,
            maxGroupWait: maxGroupWait, clock: clock.wallClock)
        if let maxGroupCommit { configuration.maxGroupCommit = maxGroupCommit }
        let threads = TestThreads(writerThreads)
        let broker = try Broker(
            configuration: configuration, engines: engine, owner: threads.owner, blocking: threads,
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        try await body(broker, engine)
        await broker.shutdown()
        await threads.stop()
    }
}

private func ask(_ broker: Broker, _ request: BrokerCommand) async -> Result<BrokerAnswer, BrokerError> {
    await withCheckedContinuation { continuation in broker.handle(request) { continuation.resume(returning: $0) } }
}

private func item(_ id: String, _ payload: String = "{}") -> Item {
    Item(id: ItemID(id), payload: Payload(payload))
}

private func records(_ broker: Broker, _ store: String) async throws -> [ItemRecord] {
    guard case .success(.records(_, let records)) = await ask(broker, .range(store: store, after: nil, limit: 0)) else {
        throw BrokerError(.internalError, "no range")
    }
    return records
}

/// Asks store "s" for its count (on the owner it is answered at once) and hands it to `body`.
private func count(_ broker: Broker, _ body: @escaping @Sendable (UInt64) -> Void) {
    broker.handle(.count(store: "s")) { result in
        if case .success(.count(_, let count)) = result { body(count) }
    }
}

private func sequence(of result: Result<BrokerAnswer, BrokerError>) -> UInt64? {
    if case .success(.written(let write)) = result, write.committed { return write.sequence }
    return nil
}

@Suite struct StoreSemantics {
    @Test func insertReplacesInPlaceDeduplicatesBatchesAndReinsertedIdsGoLast() async throws {
        let clock = HandClock()
        try await withBroker(clock: clock) { broker, _ in
            #expect(
                sequence(
                    of: await ask(
                        broker, .write(store: "s", .insert([item("a", "1"), item("b", "1"), item("a", "2")])))) == 1)
            var all = try await records(broker, "s")
            #expect(all.map(\.id) == ["a", "b"])
            #expect(all.map { String(buffer: $0.payload.bytes) } == ["2", "1"])
            let createdA = all[0].createdAt
            #expect(createdA == clock.milliseconds && all[0].updatedAt == createdA)

            clock.advance(by: 5)
            #expect(sequence(of: await ask(broker, .write(store: "s", .insert([item("a", "3"), item("c")])))) == 2)
            all = try await records(broker, "s")
            #expect(all.map(\.id) == ["a", "b", "c"])
            #expect(all[0].createdAt == createdA && String(buffer: all[0].payload.bytes) == "3")
            #expect(all[0].updatedAt == createdA + 5, "a replaced item keeps createdAt, its updatedAt moves")

            #expect(sequence(of: await ask(broker, .write(store: "s", .remove(["a", "zz"])))) == 3)
            clock.advance(by: 5)
            #expect(sequence(of: await ask(broker, .write(store: "s", .insert([item("a", "4")])))) == 4)
            all = try await records(broker, "s")
            #expect(all.map(\.id) == ["b", "c", "a"])
            #expect(all[2].createdAt == createdA + 10, "a re-inserted id is created afresh")
        }
    }

    /// A large batch where every id comes five times, interleaved: first positions, last payloads (the planner's
    /// own index of first occurrences, by hash, must find every repeat among many ids).
    @Test func aLargeBatchOfRepeatsKeepsFirstPositionsAndLastPayloads() async throws {
        let clock = HandClock()
        try await withBroker(clock: clock) { broker, engine in
            _ = await ask(broker, .write(store: "s", .insert([item("x", "before")])))
            let created = try await records(broker, "s")[0].createdAt
            clock.advance(by: 5)
            let items = (0..<500).map { n in item("id-\(n % 100)", "\(n)") } + [item("x", "after")]
            #expect(sequence(of: await ask(broker, .write(store: "s", .insert(items)))) == 2)
            // One put per id reaches the engine (a repeat missed would be a put of its own, and a step of the event).
            #expect(engine.state.withLock { $0.applies.last?.steps.count } == 101)
            let all = try await records(broker, "s")
            #expect(all.map(\.id) == ["x"] + (0..<100).map { ItemID("id-\($0)") })
            #expect(all.map { String(buffer: $0.payload.bytes) } == ["after"] + (0..<100).map { "\(400 + $0)" })
            #expect(all[0].createdAt == created, "the batch found the id that was there: it keeps its createdAt")
            #expect(all[1].createdAt == created + 5)
        }
    }

    @Test func requestsThatChangeNothingTakeNoSequence() async throws {
        try await withBroker { broker, engine in
            let unchanged: [BrokerCommand] = [
                .write(store: "s", .insert([])), .write(store: "s", .remove(["x"])),
                .write(store: "s", .removeAll), .write(store: "s", .chain([.remove(ids: ["x"]), .removeAll])),
                .drop(store: "s"),
            ]
            for request in unchanged {
                guard case .success(.written(let result)) = await ask(broker, request) else {
                    Issue.record("\(request.name) failed")
                    continue
                }
                #expect(!result.committed && result.sequence == 0 && result.epoch == 0)
            }
            #expect(engine.state.withLock { $0.applies.isEmpty })
            guard case .success(.stores(let list)) = await ask(broker, .listStores) else { return }
            #expect(list.isEmpty)
        }
    }

    /// Stores that do not exist are let go of once nothing is going on in them, racing with what arrives for the
    /// same names meanwhile: reads, writes that change nothing and inserts on 300 fresh names at once lose no
    /// write and make no second writer (each store's insert is its sequence 1, its item there once), and a
    /// subscription to a store that does not exist keeps it, so the write that creates it reaches the subscriber.
    @Test func storesThatHoldNothingAreLetGoWithoutLosingAWriteOrASubscriber() async throws {
        for capabilities: EngineCapabilities in [[.persistent, .atomic], [.atomic, .nonblocking]] {
            try await withBroker(engine: TestEngine(capabilities: capabilities)) { broker, _ in
                let names = (0..<300).map { "fresh-\($0)" }
                let inserted = await withTaskGroup(of: (String, UInt64?)?.self) { group in
                    for name in names {
                        for _ in 0..<3 {
                            group.addTask {
                                _ = await ask(broker, .count(store: name))
                                return nil
                            }
                        }
                        group.addTask {
                            _ = await ask(broker, .write(store: name, .remove([ItemID("nothing")])))
                            return nil
                        }
                        group.addTask {
                            (name, sequence(of: await ask(broker, .write(store: name, .insert([item("a")])))))
                        }
                        group.addTask {
                            _ = await ask(broker, .get(store: name, ids: [ItemID("a")]))
                            return nil
                        }
                    }
                    var inserted: [String: UInt64?] = [:]
                    for await case (let name, let sequence)? in group { inserted[name] = sequence }
                    return inserted
                }
                for name in names {
                    #expect(inserted[name] == .some(1), "store \(name)")
                    let ids = try await records(broker, name).map(\.id)
                    #expect(ids == ["a"], "store \(name)")
                }
                let subscription = Subscription(id: 1, namespace: .store, name: "later", capacity: 100, wake: {})
                _ = await withCheckedContinuation { c in
                    broker.handle(
                        .subscribe(namespace: .store, name: "later", start: .snapshot), subscription: subscription
                    ) {
                        c.resume(returning: $0)
                    }
                }
                for _ in 0..<10 { _ = await ask(broker, .count(store: "later")) }  // each may try to let it go
                #expect(sequence(of: await ask(broker, .write(store: "later", .insert([item("x")])))) == 1)
                let pushes = subscription.take(max: 10).map(\.push)
                #expect(pushes.count == 2, "the snapshot, then the event of the write")
                guard pushes.count == 2, case .storeEvent(let event) = pushes[1] else { return }
                #expect(event.sequence == 1)
            }
        }
    }

    /// A store is let go of only when it holds nothing: not one with a subscriber, nor one with items.
    @Test func aStoreIsRetiredOnlyWhenItHoldsNothing() async throws {
        try await withTemporaryDirectory(prefix: "sb-retire") { directory in
            let engine = TestEngine()
            let dataDirectory = DataDirectory(root: directory)
            _ = try dataDirectory.prepare()
            let threads = TestThreads(1)
            defer { threads.stopSoon() }
            let environment = StoreEnvironment(
                directory: dataDirectory, engines: engine,
                configuration: BrokerConfiguration(dataDirectory: directory, defaultEngine: "test"),
                logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }), owner: threads.owner,
                blocking: threads)
            let owner = threads.owner
            /// `body` on the owner, once the reply it is given has been called.
            func onOwner(_ body: @escaping @Sendable (Reply) -> Void) async {
                _ = await withCheckedContinuation { c in owner.execute { body(Reply { c.resume(returning: $0) }) } }
            }
            func retired(_ store: ManagedStore) async throws -> Bool {
                try await owner.submit { store.retireIfNothingHere() }.get()
            }

            let empty = ManagedStore(name: "empty", environment: environment)
            await onOwner { empty.count($0) }  // loaded: it does not exist
            let watched = ManagedStore(name: "watched", environment: environment)
            let subscription = Subscription(id: 1, namespace: .store, name: "watched", capacity: 10, wake: {})
            await onOwner { watched.subscribe(subscription, start: .snapshot, $0) }
            #expect(try await !retired(watched), "a store with a subscriber was retired")
            let written = ManagedStore(name: "written", environment: environment)
            await onOwner { reply in
                var writes: [PendingWrite?] = [
                    PendingWrite(
                        kind: .write(.insert([item("a")])), condition: .unconditional, submitter: 1, reply: reply)
                ]
                written.submit(&writes)
            }
            #expect(try await !retired(written), "a store with items was retired")
            #expect(try await retired(empty))
            #expect(try await !retired(empty), "retired twice")
            #expect(engine.state.withLock { $0.applies.count } == 1)  // the one write to "written"
            await withCheckedContinuation { c in owner.execute { written.writer.shutdown { c.resume() } } }
            await withCheckedContinuation { c in owner.execute { watched.writer.shutdown { c.resume() } } }
        }
    }

    @Test func chainsAreOneCommitWithTheirStepsInOrder() async throws {
        try await withBroker { broker, engine in
            _ = await ask(broker, .write(store: "s", .insert([item("x"), item("y")])))
            let subscription = Subscription(id: 1, namespace: .store, name: "s", capacity: 100, wake: {})
            _ = await withCheckedContinuation { c in
                broker.handle(.subscribe(namespace: .store, name: "s", start: .snapshot), subscription: subscription) {
                    c.resume(returning: $0)
                }
            }
            let result = await ask(
                broker,
                .write(
                    store: "s",
                    .chain([
                        .removeAll, .insert(items: [item("a"), item("b")]), .remove(ids: ["a", "q"]),
                        .insert(items: [item("a")]),
                    ])))
            #expect(sequence(of: result) == 2)
            let ids = try await records(broker, "s").map(\.id)
            #expect(ids == ["b", "a"])
            #expect(engine.state.withLock { $0.applies.count } == 2)
            let pushes = subscription.take(max: 10).map(\.push)
            #expect(pushes.count == 2)
            guard case .storeEvent(let event) = pushes[1] else { return }
            #expect(event.sequence == 2)
            let shape = event.steps.map { step -> String in
                switch step {
                case .insert(let records): "+" + records.map(\.id.string).joined()
                case .remove(let ids): "-" + ids.map(\.string).joined()
                }
            }
            #expect(shape == ["-xy", "+ab", "-a", "+a"])
        }
    }

    @Test func readsNeverWaitForACommitAndConcurrentWritesShareOneTransaction() async throws {
        try await withBroker { broker, engine in
            _ = await ask(broker, .write(store: "s", .insert([item("first")])))
            engine.hold()
            let answers = Answers()
            broker.handle(.write(store: "s", .insert([item("w1")]))) { answers.add(0, $0) }
            #expect(await engine.waitForApplies(2))
            // The engine is stuck in a commit: reads still answer at once, from the committed state.
            #expect(try await records(broker, "s").map(\.id) == ["first"])
            for n in 1...9 {
                broker.handle(.write(store: "s", .insert([item("w\(n + 1)")]))) { answers.add(n, $0) }
            }
            engine.release()
            #expect(await engine.waitForApplies(3))
            try await answers.waitFor(10)
            #expect(answers.sequences == Array(2...11))
            // The nine writes queued behind the held commit went to the engine as one transaction.
            let applies = engine.state.withLock { $0.applies.map { ($0.steps.count, $0.sequence) } }
            #expect(applies.map(\.0) == [1, 1, 9])
            #expect(applies.map(\.1) == [1, 2, 11])
            #expect(try await records(broker, "s").map(\.id) == ["first"] + (1...10).map { ItemID("w\($0)") })
        }
    }

    @Test func aFailedCommitChangesNothingInMemory() async throws {
        try await withBroker { broker, engine in
            _ = await ask(broker, .write(store: "s", .insert([item("a")])))
            engine.state.withLock { $0.failNext = true }
            let failed = await ask(broker, .write(store: "s", .chain([.removeAll, .insert(items: [item("b")])])))
            guard case .failure(let error) = failed else {
                Issue.record("the commit did not fail")
                return
            }
            #expect(error.code == .engineError && error.message.contains("fire"))
            // The engine's own failure is kept as the cause, and the error says where it was decided.
            #expect((error.underlying as? EngineFailure)?.message.contains("fire") == true)
            #expect(error.location.fileID == "BrokerCore/EnginePlace.swift" && error.location.line > 0)
            #expect(error.logMetadata["error.underlying"] != nil)
            let ids = try await records(broker, "s").map(\.id)
            #expect(ids == ["a"])
            #expect(sequence(of: await ask(broker, .write(store: "s", .insert([item("c")])))) == 2)
        }
    }

    /// Without SB_CAP_ATOMIC a chain of several operations is refused (it could not be made atomic), but a
    /// one-operation chain is just that operation and commits (before: refused too).
    @Test func aNonAtomicEngineRefusesOnlyChainsOfSeveralOperations() async throws {
        try await withBroker(engine: TestEngine(capabilities: [.persistent])) { broker, engine in
            #expect(
                sequence(of: await ask(broker, .write(store: "s", .chain([.insert(items: [item("a"), item("b")])]))))
                    == 1)
            guard
                case .failure(let error) = await ask(
                    broker, .write(store: "s", .chain([.removeAll, .insert(items: [item("c")])])))
            else {
                Issue.record("a two-operation chain committed on a non-atomic engine")
                return
            }
            #expect(error.code == .notSupported && error.message.contains("cannot apply a chain atomically"))
            let ids = try await records(broker, "s").map(\.id)
            #expect(ids == ["a", "b"])
        }
    }

    @Test func conditionsCompareWithTheSequenceAtTheirTurn() async throws {
        try await withBroker { broker, _ in
            #expect(sequence(of: await ask(broker, .write(store: "s", .insert([item("a")]), condition: .absent))) == 1)
            guard
                case .failure(let conflict) = await ask(
                    broker, .write(store: "s", .insert([item("b")]), condition: .absent))
            else {
                Issue.record("no conflict")
                return
            }
            #expect(conflict.code == .conflict)
            #expect(sequence(of: await ask(broker, .write(store: "s", .removeAll, condition: .sequence(1)))) == 2)
            guard case .success(.count(let position, let count)) = await ask(broker, .count(store: "s")) else { return }
            #expect(count == 0 && position.sequence == 2)
        }
    }

    /// The items a commit replaces or removes, and the events history lets go of, are released once the commit is
    /// answered: soon after the answer.
    @Test func whatACommitReplacesOrRemovesIsFreedOnceTheWriterIsDone() async throws {
        try await withBroker(history: 1) { broker, engine in
            // The storage of the item memory holds for `id`, watched weakly from here on.
            func watch(_ id: String) async throws -> WeakStorage {
                let record = try await records(broker, "s").first { $0.id == ItemID(id) }
                return WeakStorage(try #require(record?.payload.keptItem).storage)
            }
            func expectFreed(_ watched: WeakStorage, _ what: Comment) async {
                engine.state.withLock { $0.applies.removeAll() }  // the test engine's log of steps holds items too
                for _ in 0..<400 where watched.storage != nil { try? await Task.sleep(for: .milliseconds(5)) }
                #expect(watched.storage == nil, what)
            }

            _ = await ask(broker, .write(store: "s", .insert([item("a", "1")])))
            let replaced = try await watch("a")
            #expect(sequence(of: await ask(broker, .write(store: "s", .insert([item("a", "2")])))) == 2)
            await expectFreed(replaced, "the replaced item")

            let removed = try await watch("a")
            #expect(sequence(of: await ask(broker, .write(store: "s", .remove(["a"])))) == 3)
            await expectFreed(removed, "the removed item")

            // A removeAll of more than 64 items hands the whole table over.
            _ = await ask(broker, .write(store: "s", .insert((0..<100).map { item("n\($0)", "\($0)") })))
            let emptied = try await watch("n7")
            #expect(sequence(of: await ask(broker, .write(store: "s", .removeAll))) == 5)
            await expectFreed(emptied, "an item of the table removeAll emptied")
            #expect(sequence(of: await ask(broker, .write(store: "s", .insert([item("n7", "again")])))) == 6)
            #expect(try await records(broker, "s").map(\.id) == ["n7"])
        }
    }
}

extension StoreSemantics {
    /// A store retired after a read (it did not exist and nothing was going on) is never answered from again: once
    /// another connection has created the store, the first sees it.
    @Test func aConnectionsCachedStoreIsNeverARetiredOne() async throws {
        try await withBroker { broker, _ in
            func ask(_ command: BrokerCommand, as context: RequestContext) async -> Result<BrokerAnswer, BrokerError> {
                await withCheckedContinuation { continuation in
                    broker.handle(command, context: context) { continuation.resume(returning: $0) }
                }
            }
            func count(as context: RequestContext) async -> UInt64? {
                guard case .success(.count(_, let count)) = await ask(.count(store: "s"), as: context) else {
                    return nil
                }
                return count
            }
            let reader = RequestContext(peer: Peer(uid: getuid(), pid: 1), grant: .owner, clientName: "reader")
            let writer = RequestContext(peer: Peer(uid: getuid(), pid: 2), grant: .owner, clientName: "writer")
            for round in 1...3 {
                // The reader asks about a store that does not exist (the broker retires it after answering) ...
                #expect(await count(as: reader) == 0, "round \(round)")
                try await Task.sleep(for: .milliseconds(5))
                // ... another connection creates it, and the reader's next read finds what it holds.
                #expect(sequence(of: await ask(.write(store: "s", .insert([item("i\(round)")])), as: writer)) == 1)
                #expect(await count(as: reader) == 1, "round \(round): the reader was answered by a retired store")
                // Dropped: the store does not exist again, for the next round.
                guard case .success(.written) = await ask(.drop(store: "s"), as: writer) else {
                    Issue.record("round \(round): the drop failed")
                    return
                }
                try await Task.sleep(for: .milliseconds(5))
            }
        }
    }
}

extension StoreSemantics {
    /// One context used with two brokers (as `RequestContext.owner` is in one process): each broker answers from
    /// its own store of that name, never from the one the other broker's read left in the context's lookup.
    @Test func aContextReadingTwoBrokersGetsEachOnesStore() async throws {
        try await withBroker { first, _ in
            try await withBroker { second, _ in
                let context = RequestContext(peer: Peer(uid: getuid(), pid: 3), grant: .owner, clientName: "both")
                func count(_ broker: Broker) async -> UInt64? {
                    let answer = await withCheckedContinuation { continuation in
                        broker.handle(.count(store: "s"), context: context) { continuation.resume(returning: $0) }
                    }
                    guard case .success(.count(_, let count)) = answer else { return nil }
                    return count
                }
                _ = await ask(first, .write(store: "s", .insert([item("a")])))
                _ = await ask(second, .write(store: "s", .insert([item("a"), item("b")])))
                for _ in 0..<3 {
                    #expect(await count(first) == 1)
                    #expect(await count(second) == 2)
                }
            }
        }
    }
}

/// A weak reference to an item's storage, to see when the daemon lets go of it.
private final class WeakStorage: @unchecked Sendable {
    weak var storage: KeptItem.Storage?
    init(_ storage: KeptItem.Storage) { self.storage = storage }
}

@Suite struct Subscriptions {
    @Test func aFullBufferEndsTheSubscriptionWithLaggedAfterWhatItHolds() {
        let subscription = Subscription(id: 3, namespace: .store, name: "s", capacity: 2, wake: {})
        let event = { (n: UInt64) in Push.storeEvent(Commit(epoch: 9, sequence: n, steps: [])) }
        #expect(subscriptionOffer(subscription, event(1), 1))
        #expect(subscriptionOffer(subscription, event(2), 2))
        #expect(!subscriptionOffer(subscription, event(3), 3))
        #expect(!subscriptionOffer(subscription, event(4), 4))
        let pushes = subscription.take(max: 10).map(\.push)
        #expect(pushes.count == 3)
        guard case .lagged(let position) = pushes.last else {
            Issue.record("the last push is not lagged")
            return
        }
        #expect(position == Position(epoch: 9, sequence: 2))
        #expect(subscription.isEnded)
    }
}

/// `offer` is internal (only stores offer); the test reaches it through `@testable`.
private func subscriptionOffer(_ subscription: Subscription, _ push: Push, _ sequence: UInt64) -> Bool {
    subscription.offer(push, at: Position(epoch: 9, sequence: sequence))
}

/// Answers arriving from the broker's threads.
private final class Answers: @unchecked Sendable {
    private let lock = NSLock()
    private var results: [Int: Result<BrokerAnswer, BrokerError>] = [:]

    func add(_ index: Int, _ result: Result<BrokerAnswer, BrokerError>) { lock.withLock { results[index] = result } }

    var sequences: [UInt64?] { lock.withLock { (0..<results.count).map { sequence(of: results[$0]!) } } }

    func waitFor(_ count: Int) async throws {
        for _ in 0..<2000 {
            if lock.withLock({ results.count }) >= count { return }
            try await Task.sleep(for: .milliseconds(5))
        }
        throw BrokerError(.internalError, "only \(lock.withLock { results.count }) answers")
    }
}

@Suite struct Writers {
    private static var thisThread: UInt {
        UInt(pthread_self())
    }

    /// Four writers that each wait for their acknowledgement, on an engine whose apply takes 20 ms (a slow fsync):
    /// the store's writer waits a little for the writers it has just answered, so that groups hold all four.
    /// Before: groups alternated between the one writer answered last and the three that queued meanwhile
    /// (43-50 applies for 100 writes; now 25). The wait is allowed 50 ms here, not the default 1 ms: with every
    /// test running at once, a task can take longer than 1 ms to be resumed and write again.
    @Test func writersWaitingForEachAcknowledgementShareSlowCommits() async throws {
        let engine = TestEngine()
        engine.state.withLock { $0.applyDelay = .milliseconds(20) }
        try await withBroker(maxGroupWait: .milliseconds(50), engine: engine) { broker, engine in
            _ = await ask(broker, .write(store: "s", .insert([item("first")])))
            let rounds = 25
            try await withThrowingTaskGroup(of: Void.self) { group in
                for writer in 0..<4 {
                    group.addTask {
                        let context = RequestContext(peer: RequestContext.owner.peer, grant: .owner, clientName: "")
                        for round in 0..<rounds {
                            let answer = await withCheckedContinuation { continuation in
                                broker.handle(
                                    [
                                        BrokerRequest(.write(store: "s", .insert([item("w\(writer)-\(round)")]))) {
                                            continuation.resume(returning: $0)
                                        }
                                    ], context: context)
                            }
                            guard sequence(of: answer) != nil else { throw BrokerError(.internalError, "\(answer)") }
                        }
                    }
                }
                try await group.waitForAll()
            }
            let groups = engine.state.withLock { $0.applies.dropFirst().map(\.steps.count) }
            #expect(groups.reduce(0, +) == 4 * rounds)
            #expect(groups.count <= 30, "group sizes \(groups)")
        }
    }

    /// What the writer waits for, decided without a clock.
    @Test func gatheringWaitsOnlyForWritersItAnsweredAfterASlowApply() {
        func writes(_ submitters: [UInt64]) -> [PendingWrite] {
            submitters.map {
                PendingWrite(kind: .drop, condition: .unconditional, submitter: $0, reply: Reply { _ in })
            }
        }
        var gathering = GroupGathering()
        // Slow: the four answered are awaited; the wait is as long as the apply; the last to come back ends it.
        gathering.committed(writes([1, 2, 3, 4]), applyTook: 400_000, queued: writes([]))
        #expect(gathering.submitted(by: 1) == false)
        #expect(gathering.beginWait(maximum: 1_000_000, queued: 0) == 400_000)
        #expect(gathering.submitted(by: 9) == false)
        #expect(gathering.submitted(by: 2) == false)
        #expect(gathering.submitted(by: 3) == false)
        #expect(gathering.submitted(by: 4) == true)
        gathering.endWait()
        // Capped; a writer with writes still queued is not waited for.
        gathering.committed(writes([1, 2]), applyTook: 50_000_000, queued: writes([2]))
        #expect(gathering.awaiting == [1])
        #expect(gathering.beginWait(maximum: 1_000_000, queued: 0) == 1_000_000)
        gathering.endWait()
        #expect(gathering.awaiting.isEmpty)
        // A lone writer that came back, and any apply faster than an fsync: no wait.
        gathering.committed(writes([1]), applyTook: 400_000, queued: writes([]))
        #expect(gathering.submitted(by: 1) == false)
        #expect(gathering.beginWait(maximum: 1_000_000, queued: 0) == nil)
        gathering.committed(writes([1, 2, 3]), applyTook: 20_000, queued: writes([]))
        #expect(gathering.beginWait(maximum: 1_000_000, queued: 0) == nil)
        // A group of `largeGroup` clients or more: no wait (its apply was mostly their writes).
        gathering.committed(writes(Array(1...8)), applyTook: 400_000, queued: writes([]))
        #expect(gathering.awaiting.isEmpty)
        #expect(gathering.beginWait(maximum: 1_000_000, queued: 0) == nil)
        gathering.committed(writes(Array(1...7) + [7, 7]), applyTook: 400_000, queued: writes([]))
        #expect(gathering.beginWait(maximum: 1_000_000, queued: 0) == 400_000)
        gathering.endWait()
        // `largeGroup` writes already queued: the next group is large without them, no wait.
        gathering.committed(writes([1, 2, 3]), applyTook: 400_000, queued: writes([]))
        #expect(gathering.beginWait(maximum: 1_000_000, queued: GroupGathering.largeGroup) == nil)
        #expect(gathering.beginWait(maximum: 1_000_000, queued: GroupGathering.largeGroup - 1) == 400_000)
        gathering.endWait()
        // --max-group-wait 0: never.
        gathering.committed(writes([1, 2, 3]), applyTook: 400_000, queued: writes([]))
        #expect(gathering.beginWait(maximum: 0, queued: 0) == nil)
    }

    /// The writes one read cycle of a connection produced reach the store's writer in one hand-off, so they
    /// share one engine transaction (before: each request was submitted on its own, and the writer started
    /// committing the first while the others were still being queued).
    @Test func aBatchOfRequestsIsOneHandOffAndOneTransaction() async throws {
        try await withBroker { broker, engine in
            _ = await ask(broker, .write(store: "s", .insert([item("first")])))
            let answers = Answers()
            broker.handle(
                (0..<16).map { n in
                    BrokerRequest(.write(store: "s", .insert([item("b\(n)")]))) { answers.add(n, $0) }
                })
            try await answers.waitFor(16)
            #expect(answers.sequences == Array(2...17))
            let applies = engine.state.withLock { $0.applies.map(\.steps.count) }
            #expect(applies == [1, 16])
        }
    }

    /// Requests planned in one group each see the ones before them: a replaced id keeps its place and creation
    /// time, a removed and re-inserted id goes last, a repeat within one batch keeps the first place and the last
    /// payload, and memory after the one transaction is what the requests one by one would have made.
    @Test func requestsOfOneGroupSeeTheOnesBeforeThem() async throws {
        let clock = HandClock()
        try await withBroker(clock: clock) { broker, engine in
            _ = await ask(broker, .write(store: "s", .insert([item("a", "0"), item("z", "0")])))
            let created = try await records(broker, "s")[0].createdAt
            clock.advance(by: 5)
            let answers = Answers()
            let group: [WriteOperation] = [
                .insert([item("b", "1"), item("c", "1"), item("b", "2")]),
                .insert([item("a", "3")]),
                .remove(["b", "b", "missing"]),
                .chain([.insert(items: [item("b", "4")]), .remove(ids: ["z"])]),
                .insert([item("c", "5")]),
            ]
            broker.handle(
                group.enumerated().map { n, operation in
                    BrokerRequest(.write(store: "s", operation)) { answers.add(n, $0) }
                })
            try await answers.waitFor(group.count)
            #expect(answers.sequences == Array(2...6))
            #expect(engine.state.withLock { $0.applies.count } == 2)
            let all = try await records(broker, "s")
            #expect(all.map(\.id) == ["a", "c", "b"])
            #expect(all.map { String(buffer: $0.payload.bytes) } == ["3", "5", "4"])
            #expect(all[0].createdAt == created && all[0].updatedAt == created + 5)
        }
    }

    /// A blocking engine is called on a thread for blocking work, never on the owner loop; a `nonblocking` engine
    /// whose store is open and idle commits on the owner, with no hand-off, whatever thread handed the write in.
    @Test func blockingEnginesRunOnBlockingThreadsNonblockingOnesOnTheOwner() async throws {
        for capabilities: EngineCapabilities in [[.persistent, .atomic], [.atomic, .nonblocking]] {
            try await withBroker(engine: TestEngine(capabilities: capabilities)) { broker, engine in
                _ = await ask(broker, .write(store: "s", .insert([item("created")])))  // a store's creation: blocking
                await broker.waitUntilWriterIdle(store: "s")
                let ownerThread = try await broker.owner.submit { Writers.thisThread }.get()
                let thread = Thread {
                    broker.handle([BrokerRequest(.write(store: "s", .insert([item("a")]))) { _ in }])
                }
                thread.start()
                #expect(await engine.waitForApplies(2))
                let applyThreads = engine.state.withLock { $0.applyThreads }
                guard applyThreads.count == 2 else { return }
                #expect(applyThreads[0] != ownerThread, "a store's creation ran on the owner")
                if capabilities.contains(.nonblocking) {
                    #expect(applyThreads[1] == ownerThread, "a nonblocking engine's commit was handed over")
                } else {
                    #expect(applyThreads[1] != ownerThread, "a blocking engine ran on the owner")
                }
            }
        }
    }

    /// The writes several peers hand in during one turn of an event loop, admitted into one `WriteBatch` and
    /// submitted once, are one group: one apply (a nonblocking engine, where each submit of an idle store commits
    /// at once: handled peer by peer, the same writes are two applies). Each peer's write keeps its own answer.
    @Test func aBatchOfSeveralPeersWritesIsOneGroup() async throws {
        try await withBroker(engine: TestEngine(capabilities: [.atomic, .nonblocking])) { broker, engine in
            _ = await ask(broker, .write(store: "s", .insert([item("created")])))
            await broker.waitUntilWriterIdle(store: "s")
            let peers = (0..<2).map { _ in
                RequestContext(peer: RequestContext.owner.peer, grant: .owner, clientName: "")
            }
            let answers = Answers()
            // One by one: each peer's write is a group of its own.
            for (index, peer) in peers.enumerated() {
                broker.handle(
                    [BrokerRequest(.write(store: "s", .insert([item("one-\(index)")]))) { answers.add(index, $0) }],
                    context: peer)
            }
            try await answers.waitFor(2)
            #expect(engine.state.withLock { $0.applies.count } == 3)
            // In one batch: one group, one apply with both peers' steps, each answered with its own sequence.
            let (appliesBeforeSubmit, emptied) = try await broker.owner.submit {
                var batch = Broker.WriteBatch()
                for (index, peer) in peers.enumerated() {
                    var requests = [
                        BrokerRequest(.write(store: "s", .insert([item("two-\(index)")]))) {
                            answers.add(2 + index, $0)
                        }
                    ]
                    broker.handle(&requests, context: peer, into: &batch)
                }
                let applies = engine.state.withLock { $0.applies.count }
                broker.submit(&batch)
                return (applies, batch.isEmpty)
            }.get()
            #expect(appliesBeforeSubmit == 3, "a batched write reached the store before submit")
            #expect(emptied)
            try await answers.waitFor(4)
            #expect(answers.sequences == [2, 3, 4, 5])
            let applies = engine.state.withLock { $0.applies }
            #expect(applies.count == 4)
            #expect(applies.last?.steps.count == 2)
            #expect(applies.last?.sequence == 5)
        }
    }

    /// For a nonblocking engine the owner commits queued groups one after another until they reach
    /// `PlaceWriter.inlineItems` items, then serves its other work before it goes on: a read handed in behind them
    /// is answered before the writes queued after them are committed. One write per group here, so the groups are
    /// known; each is small enough to be planned on the owner.
    @Test func theOwnerCommitsWithinABudgetBeforeServingOtherWork() async throws {
        let engine = TestEngine(capabilities: [.atomic, .nonblocking])
        try await withBroker(maxGroupCommit: 1, engine: engine) { broker, engine in
            _ = await ask(broker, .write(store: "s", .insert([item("created")])))
            await broker.waitUntilWriterIdle(store: "s")
            let answers = Answers()
            let seen = Mutex<UInt64?>(nil)
            let size = ManagedStore.offOwnerItems - 1
            let batches = (PlaceWriter<ManagedStore>.inlineItems + size - 1) / size  // reach the budget
            broker.owner.execute {
                var requests = [BrokerRequest(.write(store: "s", .insert([item("b")]))) { answers.add(0, $0) }]
                for batch in 0..<batches {
                    let items = (0..<size).map { item("m\(batch)-\($0)") }
                    requests.append(BrokerRequest(.write(store: "s", .insert(items))) { answers.add(1 + batch, $0) })
                }
                requests.append(
                    BrokerRequest(.write(store: "s", .insert([item("c")]))) { answers.add(1 + batches, $0) })
                broker.handle(requests)
            }
            broker.owner.execute { count(broker) { count in seen.withLock { $0 = count } } }
            try await answers.waitFor(2 + batches)
            #expect(answers.sequences == (0..<(2 + batches)).map { UInt64(2 + $0) })
            #expect(seen.withLock { $0 } == UInt64(2 + batches * size), "the read waited for every queued write")
        }
    }

    /// A group of `ManagedStore.offOwnerItems` items or more is planned on a thread for blocking work: reads handed in
    /// meanwhile are answered from the items before it, and the writes behind it wait for it.
    @Test func aLargeGroupIsPlannedOffTheOwnerWhileReadsGoOn() async throws {
        let engine = TestEngine(capabilities: [.atomic, .nonblocking])
        try await withBroker(maxGroupCommit: 1, engine: engine) { broker, engine in
            _ = await ask(broker, .write(store: "s", .insert([item("created")])))
            await broker.waitUntilWriterIdle(store: "s")
            let answers = Answers()
            let seen = Mutex<UInt64?>(nil)
            let large = (0..<ManagedStore.offOwnerItems).map { item("large-\($0)") }
            let ownerThread = try await broker.owner.submit { Writers.thisThread }.get()
            broker.owner.execute {
                broker.handle([
                    BrokerRequest(.write(store: "s", .insert(large))) { answers.add(0, $0) },
                    BrokerRequest(.write(store: "s", .insert([item("c")]))) { answers.add(1, $0) },
                ])
                count(broker) { count in seen.withLock { $0 = count } }
            }
            try await answers.waitFor(2)
            #expect(answers.sequences == [2, 3])
            #expect(seen.withLock { $0 } == 1, "the read waited for the large group")
            #expect(engine.state.withLock { $0.applyThreads.last } == ownerThread, "the memory engine's apply left the owner")
        }
    }

    /// A store whose engine is stuck holds one blocking thread; another store's commit starts meanwhile on another.
    @Test func aStuckStoreDoesNotHoldUpOthers() async throws {
        try await withBroker(writerThreads: 2) { broker, engine in
            _ = await ask(broker, .write(store: "a", .insert([item("x")])))
            _ = await ask(broker, .write(store: "b", .insert([item("x")])))
            engine.hold()
            let answers = Answers()
            broker.handle(.write(store: "a", .insert([item("y")]))) { answers.add(0, $0) }
            #expect(await engine.waitForApplies(3))
            broker.handle(.write(store: "b", .insert([item("y")]))) { answers.add(1, $0) }
            // Both applies are in the engine at once: b's did not wait behind a's.
            #expect(await engine.waitForApplies(4))
            engine.release()
            try await answers.waitFor(2)
            #expect(answers.sequences == [2, 2])
        }
    }
}

@Suite struct Shutdown {
    /// A store load in flight when shutdown begins is finished and its engine store closed before `shutdown`
    /// returns (the daemon then releases the data-directory lock): no task outlives shutdown. Before: shutdown
    /// returned at once and the late load left its engine store open for good.
    @Test func aLoadInFlightIsClosedBeforeShutdownReturns() async throws {
        try await withTemporaryDirectory(prefix: "sb-core") { directory in
            let engine = TestEngine()
            let configuration = BrokerConfiguration(dataDirectory: directory, defaultEngine: "test")
            let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
            let threads = TestThreads()
            defer { threads.stopSoon() }
            let first = try Broker(
                configuration: configuration, engines: engine, owner: threads.owner, blocking: threads, logger: logger)
            #expect(sequence(of: await ask(first, .write(store: "s", .insert([item("a")])))) == 1)
            await first.shutdown()

            let broker = try Broker(
                configuration: configuration, engines: engine, owner: threads.owner, blocking: threads, logger: logger)
            let opensBefore = engine.state.withLock { $0.opensStarted }
            let closesBefore = engine.state.withLock { $0.closes }
            engine.holdOpens()
            let answer = Task { await ask(broker, .count(store: "s")) }
            for _ in 0..<2000 where engine.state.withLock({ $0.opensStarted }) == opensBefore {
                try await Task.sleep(for: .milliseconds(5))
            }
            #expect(engine.state.withLock { $0.opensStarted } == opensBefore + 1, "the load never started")
            let shutdown = Task { await broker.shutdown() }
            try await Task.sleep(for: .milliseconds(50))  // let shutdown begin while the open is held
            engine.releaseOpens()
            await shutdown.value
            #expect(
                engine.state.withLock { $0.closes } == closesBefore + 1, "the late load's engine store was left open")
            _ = await answer.value
        }
    }
}

/// The writer's phases (`PlaceWriter`): one load for everyone waiting, one group in flight at a time and one
/// blocking job per group, the queue finished at shutdown.
@Suite struct WriterPhases {
    /// Counts the jobs handed to the threads for blocking work.
    private final class CountingThreads: BlockingExecutor {
        let threads: TestThreads
        let jobs = Mutex(0)

        init(threads: TestThreads) { self.threads = threads }

        func execute(_ job: @escaping @Sendable () -> Void) {
            jobs.withLock { $0 += 1 }
            threads.execute(job)
        }
    }

    private func withCountedBroker(
        engine: TestEngine, in directory: String? = nil, _ body: (Broker, CountingThreads) async throws -> Void
    ) async throws {
        guard let directory else {
            return try await withTemporaryDirectory(prefix: "sb-phases") { directory in
                try await withCountedBroker(engine: engine, in: directory, body)
            }
        }
        do {
            let threads = CountingThreads(threads: TestThreads(2))
            let broker = try Broker(
                configuration: BrokerConfiguration(
                    dataDirectory: directory, defaultEngine: "test", maxGroupWait: .zero),
                engines: engine, owner: threads.threads.owner, blocking: threads,
                logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
            try await body(broker, threads)
            await broker.shutdown()
            await threads.threads.stop()
        }
    }

    /// Writes queued while a group is in the engine wait, and then go together as the next group, planned on that
    /// group's result: two applies and two blocking jobs for five writes, with no sequence skipped or repeated.
    @Test func writesQueuedWhileAGroupIsAppliedAreTheNextGroupAndOneJob() async throws {
        let engine = TestEngine()
        try await withCountedBroker(engine: engine) { broker, threads in
            #expect(sequence(of: await ask(broker, .write(store: "s", .insert([item("created")])))) == 1)
            await broker.waitUntilWriterIdle(store: "s")
            engine.hold()
            let answers = Answers()
            broker.handle(.write(store: "s", .insert([item("a")]))) { answers.add(0, $0) }
            #expect(await engine.waitForApplies(2))
            let jobsBefore = threads.jobs.withLock { $0 }
            for index in 1...4 {
                broker.handle(.write(store: "s", .insert([item("b\(index)")]))) { answers.add(index, $0) }
            }
            try await Task.sleep(for: .milliseconds(20))
            #expect(engine.state.withLock { $0.applies.count } == 2, "a group was planned while another was applied")
            engine.release()
            try await answers.waitFor(5)
            #expect(answers.sequences == [2, 3, 4, 5, 6])
            let applies = engine.state.withLock { $0.applies }
            #expect(applies.count == 3)
            #expect(applies.last?.steps.count == 4 && applies.last?.sequence == 6)
            #expect(threads.jobs.withLock { $0 } == jobsBefore + 1, "the queued group was not one job")
        }
    }

    /// Every request that arrives while a store loads waits for that one load.
    @Test func oneLoadForEveryoneWaiting() async throws {
        let engine = TestEngine()
        try await withTemporaryDirectory(prefix: "sb-phases") { directory in
            try await withCountedBroker(engine: engine, in: directory) { broker, _ in
                #expect(sequence(of: await ask(broker, .write(store: "s", .insert([item("a")])))) == 1)
            }
            try await withCountedBroker(engine: engine, in: directory) { broker, _ in
                let opensBefore = engine.state.withLock { $0.opensStarted }
                engine.holdOpens()
                let answers = Answers()
                for index in 0..<5 {
                    broker.handle(.count(store: "s")) { answers.add(index, $0) }
                }
                try await Task.sleep(for: .milliseconds(20))
                engine.releaseOpens()
                try await answers.waitFor(5)
                #expect(engine.state.withLock { $0.opensStarted } == opensBefore + 1)
            }
        }
    }

    /// Shutdown finishes the writes queued before it and refuses those after it.
    @Test func shutdownFinishesTheQueueThenRefuses() async throws {
        let engine = TestEngine()
        try await withCountedBroker(engine: engine) { broker, _ in
            #expect(sequence(of: await ask(broker, .write(store: "s", .insert([item("created")])))) == 1)
            engine.hold()
            let answers = Answers()
            broker.handle(.write(store: "s", .insert([item("a")]))) { answers.add(0, $0) }
            #expect(await engine.waitForApplies(2))
            broker.handle(.write(store: "s", .insert([item("b")]))) { answers.add(1, $0) }
            let shutdown = Task { await broker.shutdown() }
            try await Task.sleep(for: .milliseconds(20))
            guard case .failure(let refused) = await ask(broker, .write(store: "s", .insert([item("late")]))) else {
                Issue.record("a write after shutdown began was taken")
                return
            }
            #expect(refused.code == .shuttingDown)
            engine.release()
            await shutdown.value
            try await answers.waitFor(2)
            #expect(answers.sequences == [2, 3])
        }
    }

    /// A drop the engine fails is answered with the error and the store is loaded again for the writes queued
    /// behind it, which are committed. Before: they waited for another request to come along, and a shutdown
    /// waiting for the store to be idle waited forever.
    @Test func writesQueuedBehindAFailedDropAreCarriedOut() async throws {
        let engine = TestEngine()
        try await withCountedBroker(engine: engine) { broker, _ in
            #expect(sequence(of: await ask(broker, .write(store: "s", .insert([item("a")])))) == 1)
            engine.state.withLock { $0.failNextDrop = true }
            let answers = Answers()
            broker.handle([
                BrokerRequest(.drop(store: "s")) { answers.add(0, $0) },
                BrokerRequest(.write(store: "s", .insert([item("b")]))) { answers.add(1, $0) },
            ])
            try await answers.waitFor(2)
            #expect(answers.sequences == [nil, 2], "the failed drop, then the write on the store it left")
        }
    }

    /// A reply that hands in another write while the writer is in its turn (an embedder's callback, on the owner)
    /// queues it for that turn: it never starts a second turn, and so never a second group beside the one in the
    /// engine. Before: the nested turn took the queue and left a group in the engine, the outer turn then found the
    /// queue empty and marked the writer idle, and the next write started a second group at once.
    @Test func aWriteHandedInByAReplyJoinsTheTurn() async throws {
        let engine = TestEngine()
        try await withCountedBroker(engine: engine) { broker, _ in
            #expect(sequence(of: await ask(broker, .write(store: "s", .insert([item("created")])))) == 1)
            await broker.waitUntilWriterIdle(store: "s")
            engine.hold()
            let answers = Answers()
            broker.owner.execute {
                broker.handle([
                    // Changes nothing: answered by the turn itself, whose reply hands in another write.
                    BrokerRequest(.write(store: "s", .remove([ItemID("absent")]))) { result in
                        answers.add(0, result)
                        broker.handle([BrokerRequest(.write(store: "s", .insert([item("b")]))) { answers.add(3, $0) }])
                    },
                    BrokerRequest(.drop(store: "s", condition: .sequence(999))) { answers.add(1, $0) },
                    BrokerRequest(.write(store: "s", .insert([item("a")]))) { answers.add(2, $0) },
                ])
            }
            #expect(await engine.waitForApplies(2))
            broker.handle(.write(store: "s", .insert([item("c")]))) { answers.add(4, $0) }
            try await Task.sleep(for: .milliseconds(20))
            #expect(engine.state.withLock { $0.applies.count } == 2, "a second group went to the engine")
            engine.release()
            try await answers.waitFor(5)
            #expect(answers.sequences == [nil, nil, 2, 3, 4])
        }
    }
}
