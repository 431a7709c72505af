import DequeModule
import Locking
import StoreModel

// What a store's writer and a value namespace's writer share: failing a load and shutting down.

/// A write waiting in a writer's queue.
protocol QueuedWrite: Sendable {
    var reply: Reply { get }
}

/// The part of a writer's locked state (a store's, a value namespace's) that loading and shutdown share.
protocol WriterState {
    associatedtype Write: QueuedWrite
    /// Writes waiting for the writer, in order.
    var pending: Deque<Write> { get set }
    /// A writer job is queued or running on the writer pool.
    var writing: Bool { get set }
    /// Requests waiting for the load to finish.
    var waiting: [@Sendable (BrokerError?) -> Void] { get set }
    /// No new writes are accepted.
    var stopping: Bool { get set }
    /// Resumed when the writer goes idle.
    var idleWaiters: [CheckedContinuation<Void, Never>] { get set }
    var engineStore: (any EngineStore)? { get set }
    /// The engine of `engineStore`, once known.
    var engine: (any StorageEngine)? { get set }
    /// The place's manifest, once it exists.
    var manifest: Manifest? { get set }
    /// The load failed: back to "not loaded", so that the next request tries again.
    mutating func markLoadFailed()
    /// A shared store's writer is to take in other brokers' commits: work besides the queued writes, which the
    /// writer goes on for.
    var catchUpWanted: Bool { get set }
}

extension WriterState {
    /// Writing, or writes queued (a writer is about to start, or starts once loaded).
    var isBusy: Bool { writing || !pending.isEmpty }
}

extension Locked where Value: WriterState {
    /// A failed load: every request waiting for it and every write queued behind it gets the error, and a
    /// shutdown waiting for those writes goes on.
    func failLoad(_ error: BrokerError) {
        let (waiting, writes, idle) = withLock { state in
            state.markLoadFailed()
            defer {
                state.waiting = []
                state.pending = []
                state.idleWaiters = []
            }
            return (state.waiting, Array(state.pending), state.idleWaiters)
        }
        for body in waiting { body(error) }
        for write in writes { write.reply(.failure(error)) }
        for waiter in idle { waiter.resume() }
    }

    /// Keeps a store opened for the place outside a commit (a shared store read for other brokers' commits).
    func keep(_ store: any EngineStore, of engine: any StorageEngine) {
        withLock { state in
            state.engine = engine
            state.engineStore = store
        }
    }

    /// At the end of a writer's turn: true when writes are still queued (the writer goes on, as a new job on
    /// the pool); otherwise the writer stops, and a shutdown waiting for it to be idle goes on.
    func writerGoesOn() -> Bool {
        let (goesOn, idle) = withLock { state -> (Bool, [CheckedContinuation<Void, Never>]) in
            guard state.pending.isEmpty, !state.catchUpWanted else { return (true, []) }
            state.writing = false
            defer { state.idleWaiters = [] }
            return (false, state.idleWaiters)
        }
        for waiter in idle { waiter.resume() }
        return goesOn
    }

    /// After a commit: the manifest records that the place has committed (once; tried again at the next commit
    /// if it could not be written), so that engine files lost later are noticed.
    func recordFirstCommit(in place: @autoclosure () -> EnginePlace) {
        // Every commit asks; only the first finds work, so the others copy nothing and build no place.
        guard let manifest = withLock({ state in state.manifest.flatMap { $0.committed ? nil : $0 } }),
            let updated = place().recordCommitted(manifest)
        else { return }
        withLock { $0.manifest = updated }
    }

    /// Returns once no writer job is queued or running and no write waits (at once if that is so already).
    func waitUntilWriterIdle() async {
        await withCheckedContinuation { continuation in
            let idle = withLock { state in
                guard state.isBusy else { return true }
                state.idleWaiters.append(continuation)
                return false
            }
            if idle { continuation.resume() }
        }
    }

    /// Refuses new writes, waits for the queued ones to finish, then closes the engine store (on the writer
    /// pool: closing may block).
    func shutDownWriter(on environment: StoreEnvironment) async {
        withLock { $0.stopping = true }
        await waitUntilWriterIdle()
        let store = withLock { state in
            defer { state.engineStore = nil }
            return state.engineStore
        }
        guard let store else { return }
        await withCheckedContinuation { continuation in
            environment.onWriter {
                store.close()
                continuation.resume()
            }
        }
    }
}

/// The tasks and writer jobs a broker starts (store and namespace loads, writers, listings): counted from
/// before they start until they end, so that shutdown can wait for every one. None outlives
/// `Broker.shutdown()`.
final class TaskTracker: Sendable {
    private struct State {
        var running = 0
        var idleWaiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Locked(State())

    /// Runs `body` in a new task, counted until it returns.
    func spawn(_ body: @escaping @Sendable () async -> Void) {
        state.withLock { $0.running += 1 }
        Task {
            await body()
            self.finished()
        }
    }

    /// Runs `job` on `pool`, counted until it returns.
    func run(on pool: any BlockingExecutor, _ job: @escaping @Sendable () -> Void) {
        state.withLock { $0.running += 1 }
        pool.execute {
            job()
            self.finished()
        }
    }

    private func finished() {
        let waiters = state.withLock { state in
            state.running -= 1
            guard state.running == 0 else { return [CheckedContinuation<Void, Never>]() }
            defer { state.idleWaiters = [] }
            return state.idleWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Returns once no task is running (tasks they start are waited for too).
    func waitForAll() async {
        await withCheckedContinuation { continuation in
            let idle = state.withLock { state in
                guard state.running > 0 else { return true }
                state.idleWaiters.append(continuation)
                return false
            }
            if idle { continuation.resume() }
        }
    }
}
