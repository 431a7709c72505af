#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Locking
import NIOCore
import Synchronization
import Wire

/// A client of the broker: one connection, opened on first use and opened again after the broker restarts.
///
/// `RemoteStore`, `RemoteValue` and `RemoteSecureValue` share a client; so may any number of tasks. A request
/// that fails because the connection went away is not retried (a write may or may not have been committed);
/// the next request reconnects.
public final class BrokerClient: Sendable {
    public let socketPath: String
    public let clientName: String
    /// How long connecting (and the handshake) may take, and how long a mirror that has not loaded yet keeps
    /// trying before its `loadState` says `.error(cannotConnect)` (it keeps trying after that, in the background).
    public let connectTimeout: Duration
    /// How many events (a store's) or values a stream holds for a reader that has not taken them; past that a
    /// store's stream gives a fresh `loaded` (`afterLag`) and a value's keeps the newest.
    public let eventBuffer: Int
    /// Runs a task's jobs on the thread that serves the process's connections (`ClientLoop`), for a task that
    /// makes requests one after another (an import, a sync agent, a benchmark):
    ///
    /// ```swift
    /// try await withTaskExecutorPreference(client.executor) {
    ///     for note in notes { try await store.insert(note) }
    /// }
    /// ```
    ///
    /// Elsewhere the caller writes its request and the answer resumes it from the loop's thread, one hand-off
    /// between threads per request; on this executor there is none. What runs there holds up the reads of every
    /// connection of the process while it runs: keep long computations and blocking calls off it.
    public let executor: any TaskExecutor
    /// The loop every connection of this client (of the process) is served on.
    let eventLoop: any EventLoop
    private let current = Locked<BrokerConnection?>(nil)
    /// Connections this client tried to open.
    package let connectAttempts = Atomic<Int>(0)

    /// The client stores, values and property wrappers use when given none (`RemoteStore<Note>(name:)`,
    /// `@RemoteStoredValue(key:)`): inside
    /// `withTemporaryBroker` (and its task's child tasks) the temporary broker's client, so that a test cannot
    /// write into the user's real broker by accident; elsewhere `processDefault`. A wrapper keeps the client it
    /// was made with: one made outside the scope uses `processDefault` inside it too.
    public static var shared: BrokerClient { scoped ?? processDefault }

    /// The client of the default socket (`STOREBROKER_SOCKET`, `XDG_RUNTIME_DIR`, `/tmp`), made on first use.
    public static let processDefault = BrokerClient()

    /// What `shared` is within a scope (`withTemporaryBroker` sets it for its body).
    @TaskLocal package static var scoped: BrokerClient?

    /// `socketPath` defaults to the broker's own rule (`STOREBROKER_SOCKET`, `XDG_RUNTIME_DIR`, `/tmp`).
    public init(
        socketPath: String = BrokerConnection.defaultSocketPath(), clientName: String = BrokerClient.processName,
        connectTimeout: Duration = .seconds(5), eventBuffer: Int = 1024
    ) {
        self.socketPath = socketPath
        self.clientName = clientName
        self.connectTimeout = connectTimeout
        self.eventBuffer = eventBuffer
        self.eventLoop = ClientLoop.shared
        self.executor = EventLoopTaskExecutor(eventLoop)
    }

    /// This process's name, for the broker's logs.
    public static var processName: String {
        String(CommandLine.arguments.first?.split(separator: "/").last ?? "client")
    }

    /// The open connection, connecting (again) if needed. Runs on its caller's executor (`nonisolated(nonsending)`):
    /// the usual case, an open connection, costs no check of the task's executor, where a plain `async` call
    /// costs two.
    public nonisolated(nonsending) func connection() async throws(StoreBrokerError) -> BrokerConnection {
        if let open = current.withLock({ $0 }), open.isOpen { return open }
        connectAttempts.add(1, ordering: .relaxed)
        let fresh = try await BrokerConnection.connect(
            socketPath: socketPath, clientName: clientName, handshakeTimeout: connectTimeout)
        let kept = current.withLock { current -> BrokerConnection in
            if let other = current, other.isOpen { return other }
            current = fresh
            return fresh
        }
        if kept !== fresh { await fresh.close() }
        return kept
    }

    /// Sends a request and returns its answer; an `error` answer is thrown as `refused` with its code.
    package nonisolated(nonsending) func send(_ request: ClientMessage) async throws(StoreBrokerError) -> ServerMessage {
        try await connection().send(request)
    }

    /// Closes the connection; mirrors built on this client stop following the broker.
    public func close() async {
        let open = current.withLock { current in
            defer { current = nil }
            return current
        }
        await open?.close()
    }
}

/// How a mirror's load stands (ComposeStore's `Async`).
public enum LoadState<Value: Sendable>: Sendable {
    case idle
    case loading
    case value(Value)
    case error(StoreBrokerError)

    public var value: Value? {
        if case .value(let value) = self { return value }
        return nil
    }
}

extension LoadState where Value == Void {
    /// The same state, carrying `value` when loaded (`value` is evaluated only then).
    func carrying<Loaded>(_ value: @autoclosure () -> Loaded) -> LoadState<Loaded> {
        switch self {
        case .idle: .idle
        case .loading: .loading
        case .value: .value(value())
        case .error(let error): .error(error)
        }
    }
}

extension StoreBrokerError {
    /// The broker refused the write because its condition did not hold.
    public var isConflict: Bool { kind == .refused && code == .conflict }
    /// The broker could not be reached or went away.
    public var isUnavailable: Bool { kind == .cannotConnect || kind == .connectionClosed }
}

/// A task executor that runs jobs on the client's loop, after whatever the loop is doing (`BrokerClient.executor`).
/// A job made ready on the loop's thread while a connection there hands out the answers of a read (`ReadyJobs`)
/// runs as soon as they are all handed out, on that thread: not queued on the loop for its next turn.
final class EventLoopTaskExecutor: TaskExecutor {
    private let eventLoop: any EventLoop

    init(_ eventLoop: any EventLoop) { self.eventLoop = eventLoop }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        if eventLoop.inEventLoop, let ready = ReadyJobs.collecting() {
            ready.add(job, on: asUnownedTaskExecutor())
            return
        }
        eventLoop.execute { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}

/// The jobs of an event loop's task executors that answers read on that loop made ready, run by the reader once
/// it has handed out every answer of the read: a task that waits for its answer on the loop (`client.executor`)
/// goes on at once, without a trip through the loop's task queue (a lock, a closure, a clock read and a copy of
/// the queue per answer). One per thread, touched only by that thread.
final class ReadyJobs {
    private var jobs: [(job: UnownedJob, executor: UnownedTaskExecutor)] = []
    private var isCollecting = false
    /// The jobs run this way on this thread so far (for tests).
    private(set) var ran = 0

    /// `ran` of the calling thread (for tests; 0 where none ran).
    static var ranHere: Int { current().ran }

    /// The thread's jobs while a reader on it is collecting them, else nil.
    static func collecting() -> ReadyJobs? {
        guard let raw = pthread_getspecific(key) else { return nil }
        let ready = Unmanaged<ReadyJobs>.fromOpaque(raw).takeUnretainedValue()
        return ready.isCollecting ? ready : nil
    }

    func add(_ job: UnownedJob, on executor: UnownedTaskExecutor) { jobs.append((job, executor)) }

    /// Runs `handOut` collecting the jobs it makes ready, then runs them (and those they make ready, in order).
    /// Not nested: a reader called while another collects on this thread (it cannot be, as the loop reads only
    /// from `poll`) runs `handOut` without collecting.
    static func run(after handOut: () -> Void) {
        let ready = current()
        guard !ready.isCollecting else { return handOut() }
        ready.isCollecting = true
        defer { ready.isCollecting = false }
        handOut()
        var next = 0
        while next < ready.jobs.count {
            let (job, executor) = ready.jobs[next]
            next += 1
            ready.ran &+= 1
            job.runSynchronously(on: executor)
        }
        ready.jobs.removeAll(keepingCapacity: true)
    }

    /// The thread's, made on first use (and released when the thread ends).
    private static func current() -> ReadyJobs {
        if let raw = pthread_getspecific(key) { return Unmanaged<ReadyJobs>.fromOpaque(raw).takeUnretainedValue() }
        let made = ReadyJobs()
        pthread_setspecific(key, Unmanaged.passRetained(made).toOpaque())
        return made
    }

    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        let created = pthread_key_create(&key) { raw in
            if let raw { Unmanaged<ReadyJobs>.fromOpaque(raw).release() }
        }
        precondition(created == 0, "pthread_key_create failed: \(created)")
        return key
    }()
}
