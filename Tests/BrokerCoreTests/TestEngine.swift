import BrokerCore
import Foundation
import NIOCore
import Synchronization
import Wire

/// An engine in the test process: records every apply, can hold an apply until released, can fail.
final class TestEngine: StorageEngine, EngineProvider {
    let name = "test"
    let version = "1"
    let capabilities: EngineCapabilities = [.persistent, .atomic]
    let optionKeys: [String] = []
    let state = Mutex(State())

    struct State {
        var applies: [(steps: [EngineStep], sequence: UInt64)] = []
        var stores: [String: TestEngineStore] = [:]
        var holding = false
        var held: [CheckedContinuation<Void, Never>] = []
        var failNext = false
        /// Opens wait for `releaseOpens()` while set.
        var holdingOpens = false
        var heldOpens: [CheckedContinuation<Void, Never>] = []
        var opensStarted = 0
        var closes = 0
    }

    func engine(named name: String) throws(WireError) -> any StorageEngine {
        guard name == self.name else { throw WireError(.engineUnavailable, "no engine \(name)") }
        return self
    }

    func engineList() -> [EngineInfo] { [] }

    func open(directory: String, store: String, options: [String: String]) async throws(EngineFailure) -> any EngineStore {
        let mustWait = state.withLock { state in
            state.opensStarted += 1
            return state.holdingOpens
        }
        if mustWait {
            await withCheckedContinuation { continuation in
                let resumeNow = state.withLock { state -> Bool in
                    guard state.holdingOpens else { return true }
                    state.heldOpens.append(continuation)
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        }
        return state.withLock { state in
            if let open = state.stores[directory] { return open }
            let created = TestEngineStore(engine: self)
            state.stores[directory] = created
            return created
        }
    }

    func drop(directory: String, store: String, options: [String: String]) async throws(EngineFailure) {
        _ = state.withLock { $0.stores.removeValue(forKey: directory) }
    }

    /// From now on opens wait for `releaseOpens()`.
    func holdOpens() { state.withLock { $0.holdingOpens = true } }

    func releaseOpens() {
        let held = state.withLock { state in
            state.holdingOpens = false
            defer { state.heldOpens = [] }
            return state.heldOpens
        }
        for continuation in held { continuation.resume() }
    }

    /// From now on applies wait for `release()`.
    func hold() { state.withLock { $0.holding = true } }

    func release() {
        let held = state.withLock { state in
            state.holding = false
            defer { state.held = [] }
            return state.held
        }
        for continuation in held { continuation.resume() }
    }

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

    func apply(_ steps: [EngineStep], sequence: UInt64) async throws(EngineFailure) {
        let (mustWait, fail) = engine.state.withLock { state in
            state.applies.append((steps, sequence))
            defer { state.failNext = false }
            return (state.holding, state.failNext)
        }
        if mustWait {
            await withCheckedContinuation { continuation in
                let resumeNow = engine.state.withLock { state -> Bool in
                    guard state.holding else { return true }
                    state.held.append(continuation)
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        }
        if fail { throw EngineFailure(.io, "the disk caught fire") }
        records.withLock { records in
            for step in steps {
                switch step {
                case .put(let record):
                    if let index = records.firstIndex(where: { $0.key == record.key }) {
                        records[index] = record
                    } else {
                        records.append(record)
                    }
                case .remove(let key): records.removeAll { $0.key == key }
                case .removeAll: records.removeAll()
                }
            }
        }
        self.sequence.withLock { $0 = sequence }
    }

    func get(_ keys: [[UInt8]]) async throws(EngineFailure) -> [EngineRecord?] {
        records.withLock { records in keys.map { key in records.first { $0.key == key } } }
    }

    func scanAll() async throws(EngineFailure) -> [EngineRecord] { records.withLock { $0 } }
    func count() async throws(EngineFailure) -> UInt64 { UInt64(records.withLock { $0.count }) }
    func allKeys() async throws(EngineFailure) -> [[UInt8]] { records.withLock { $0.map(\.key) } }
    func contains(_ key: [UInt8]) async throws(EngineFailure) -> Bool { records.withLock { $0.contains { $0.key == key } } }
    func close() async { engine.state.withLock { $0.closes += 1 } }
}
