import BrokerCore
import Foundation
import NIOCore
import NIOPosix
import Synchronization
import StoreModel

/// An engine in the test process: records every apply, can hold an apply until released, can fail.
final class TestEngine: StorageEngine, EngineProvider {
    let name = "test"
    let version = "1"
    let capabilities: EngineCapabilities
    let optionKeys: [String] = []
    let state = Mutex(State())
    /// Applies wait here while it is closed (`hold()` / `release()`).
    let applies = Gate()
    /// Opens wait here while it is closed (`holdOpens()` / `releaseOpens()`).
    let opens = Gate()

    init(capabilities: EngineCapabilities = [.persistent, .atomic]) {
        self.capabilities = capabilities
    }

    struct State {
        var applies: [(steps: [EngineStep], sequence: UInt64)] = []
        /// The thread each apply ran on (`pthread_self`), in order.
        var applyThreads: [UInt] = []
        var stores: [String: TestEngineStore] = [:]
        var failNext = false
        /// The next drop fails (nothing is dropped).
        var failNextDrop = false
        /// Each apply sleeps this long, as a disk's fsync would.
        var applyDelay: Duration = .zero
        var opensStarted = 0
        var closes = 0
    }

    func engine(named name: String) throws(BrokerError) -> any StorageEngine {
        guard name == self.name else { throw BrokerError(.engineUnavailable, "no engine \(name)") }
        return self
    }

    func engineList() -> [EngineInfo] { [] }

    func open(directory: String, store: String, options: [String: String]) throws(EngineFailure) -> any EngineStore {
        state.withLock { $0.opensStarted += 1 }
        opens.pass()
        return state.withLock { state in
            if let open = state.stores[directory] { return open }
            let created = TestEngineStore(engine: self)
            state.stores[directory] = created
            return created
        }
    }

    func drop(directory: String, store: String, options: [String: String]) throws(EngineFailure) {
        let fail = state.withLock { state in
            defer { state.failNextDrop = false }
            return state.failNextDrop
        }
        if fail { throw EngineFailure(.io, "the disk refused the drop") }
        _ = state.withLock { $0.stores.removeValue(forKey: directory) }
    }

    /// From now on opens wait for `releaseOpens()`.
    func holdOpens() { opens.close() }
    func releaseOpens() { opens.open() }

    /// From now on applies wait for `release()`.
    func hold() { applies.close() }
    func release() { applies.open() }

    /// Waits (bounded) until `count` applies have started.
    func waitForApplies(_ count: Int) async -> Bool {
        for _ in 0..<2000 {
            if state.withLock({ $0.applies.count }) >= count { return true }
            try? await Task.sleep(for: .milliseconds(5))
        }
        return false
    }
}

final class TestEngineStore: EngineStore {
    let engine: TestEngine
    let records = Mutex<[EngineRecord]>([])
    let sequence = Mutex<UInt64>(0)

    init(engine: TestEngine) {
        self.engine = engine
    }

    var openedSequence: UInt64 { sequence.withLock { $0 } }

    func apply(_ steps: [EngineStep], sequence: UInt64) throws(EngineFailure) {
        let (fail, delay) = engine.state.withLock { state in
            state.applies.append((steps, sequence))
            state.applyThreads.append(UInt(pthread_self()))
            defer { state.failNext = false }
            return (state.failNext, state.applyDelay)
        }
        engine.applies.pass()
        if delay > .zero { usleep(UInt32(delay / .microseconds(1))) }
        if fail { throw EngineFailure(.io, "the disk caught fire") }
        records.withLock { records in
            // Where each key is, so that a large batch is not quadratic (4,096 items took seconds in debug).
            var positions = Dictionary(uniqueKeysWithValues: records.indices.map { (records[$0].key, $0) })
            for step in steps {
                switch step {
                case .put(let record):
                    if let index = positions[record.key] {
                        records[index] = record
                    } else {
                        positions[record.key] = records.count
                        records.append(record)
                    }
                case .remove(let key):
                    records.removeAll { $0.key == key }
                    positions = Dictionary(uniqueKeysWithValues: records.indices.map { (records[$0].key, $0) })
                case .removeAll:
                    records.removeAll()
                    positions = [:]
                }
            }
        }
        self.sequence.withLock { $0 = sequence }
    }

    func scan(_ visit: (ScannedRecord) -> Void) throws(EngineFailure) {
        for record in records.withLock({ $0 }) {
            record.key.withUnsafeBytes { key in
                var payload = record.payload
                payload.withUnsafeReadableBytes { payload in
                    visit(
                        ScannedRecord(key: key, payload: payload, createdAt: record.createdAt, updatedAt: record.updatedAt))
                }
            }
        }
    }
    func count() throws(EngineFailure) -> UInt64 { UInt64(records.withLock { $0.count }) }
    func close() { engine.state.withLock { $0.closes += 1 } }
}

/// Callers of `pass()` (engine calls, on a thread for blocking work) block while the gate is closed, and all go on when
/// it opens.
final class Gate: Sendable {
    private let closed = Mutex(false)

    func close() { closed.withLock { $0 = true } }
    func open() { closed.withLock { $0 = false } }

    /// Blocks while closed (bounded: a test that forgets to open it fails instead of hanging).
    func pass() {
        for _ in 0..<20_000 {
            if !closed.withLock({ $0 }) { return }
            usleep(1000)
        }
    }
}

/// A test broker's owner loop and the threads its engine calls that block run on: NIO's, as the daemon's (its own
/// per broker, so that a test holding an engine never starves another's).
struct TestThreads: BlockingExecutor {
    let pool: NIOThreadPool
    let loops = MultiThreadedEventLoopGroup(numberOfThreads: 1)

    init(_ count: Int = 4) {
        pool = NIOThreadPool(numberOfThreads: count)
        pool.start()
    }

    /// The broker's owner.
    var owner: any EventLoop { loops.next() }

    func execute(_ job: @escaping @Sendable () -> Void) {
        pool.submit { _ in job() }
    }

    func stop() async {
        try? await pool.shutdownGracefully()
        try? await loops.shutdownGracefully()
    }

    /// `stop()`, not waited for.
    func stopSoon() {
        pool.shutdownGracefully { _ in }
        loops.shutdownGracefully { _ in }
    }
}
