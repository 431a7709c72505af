import Foundation
import Locking
import NIOCore
import StoreModel
import Wire

// What every mirror (a store's, a value's) is made of: the follower that keeps its subscription alive, the
// callers waiting for it (to load, to reach a position), and the life of its load state.

/// Follows one subscription for as long as its owner lives: reconnects with a capped backoff when the broker
/// goes away, resumes from the last point the owner has seen (or a fresh snapshot when the broker says the
/// history is gone), and starts over after `lagged`. The owner's `handle` runs on the connection's event loop
/// as each push is read (`PushReceiver`): a commit reaches the mirror with no task hop, so a write's answer
/// usually finds its commit already applied.
struct SubscriptionFollower: Sendable {
    let client: BrokerClient
    let namespace: Namespace
    let name: String

    /// Runs until cancelled or until `handle` throws (returned). `resumePoint` is asked before each
    /// (re)subscription. When the broker stays out of reach for the client's `connectTimeout`, `unavailable` is
    /// told (once per outage) and the follower goes on trying. `subscribed` is told the connection and id of each
    /// subscription once the broker answered it, and `nil` once it is over (for writes that silence it).
    func run(
        resumePoint: @Sendable () -> SubscriptionStart,
        unavailable: @Sendable (StoreBrokerError) -> Void,
        subscribed: @escaping @Sendable ((connection: BrokerConnection, id: UInt32)?) -> Void = { _ in },
        handle: @escaping @Sendable (Push) throws(StoreBrokerError) -> Void
    ) async -> StoreBrokerError? {
        var backoff: Duration = .milliseconds(20)
        let clock = ContinuousClock()
        var outageSince: ContinuousClock.Instant?
        var told = false
        while !Task.isCancelled {
            do throws(StoreBrokerError) {
                let connection = try await client.connection()
                // Told on the event loop as the broker's answer is read, before the subscription's first push (a
                // caller woken by that push, the snapshot, may write at once).
                let subscription = DirectSubscription(handle: handle) { id in subscribed((connection, id)) }
                let id = try await connection.subscribe(namespace, name: name, from: resumePoint(), receiver: subscription)
                backoff = .milliseconds(20)
                outageSince = nil
                told = false
                let outcome = await withTaskCancellationHandler {
                    await subscription.outcome()
                } onCancel: {
                    subscription.finish(.cancelled)
                }
                subscribed(nil)
                switch outcome {
                case .lagged: continue  // subscribe again from where the mirror is
                case .closed(let error): throw error
                case .failed(let error):
                    try? await connection.unsubscribe(id: id)
                    return error
                case .cancelled:
                    try? await connection.unsubscribe(id: id)
                    return nil
                }
            } catch where error.isUnavailable || error.kind == .timedOut {
                let since = outageSince ?? clock.now
                outageSince = since
                if !told, clock.now - since >= client.connectTimeout || error.kind == .timedOut {
                    told = true
                    unavailable(
                        StoreBrokerError(
                            error.kind, code: error.code,
                            "\(error.message) (for \(Self.describe(clock.now - since)); retrying in the background)",
                            underlying: error))
                }
                try? await Task.sleep(for: min(backoff, client.connectTimeout))
                backoff = min(backoff * 2, .seconds(1))
            } catch {
                return error
            }
        }
        return nil
    }

    private static func describe(_ duration: Duration) -> String {
        let milliseconds = duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
        return milliseconds >= 1000 ? "\(milliseconds / 1000) s" : "\(milliseconds) ms"
    }
}

/// One subscription of a follower: applies each push as the connection reads it and says how it ended.
final class DirectSubscription: PushReceiver {
    enum Outcome: Sendable {
        /// The broker lagged it: subscribe again from the mirror's position.
        case lagged
        /// The connection went away.
        case closed(StoreBrokerError)
        /// Applying a push failed (an item that does not decode): the mirror stops.
        case failed(StoreBrokerError)
        case cancelled
    }

    private let handle: @Sendable (Push) throws(StoreBrokerError) -> Void
    private let onStart: @Sendable (UInt32) -> Void
    private let state = Locked<(outcome: Outcome?, waiter: CheckedContinuation<Outcome, Never>?)>((nil, nil))

    init(
        handle: @escaping @Sendable (Push) throws(StoreBrokerError) -> Void,
        started: @escaping @Sendable (UInt32) -> Void = { _ in }
    ) {
        self.handle = handle
        onStart = started
    }

    func started(id: UInt32) { onStart(id) }

    func receive(_ push: Push) {
        guard state.withLock({ $0.outcome == nil }) else { return }
        do throws(StoreBrokerError) {
            try handle(push)
        } catch {
            finish(.failed(error))
        }
    }

    func ended(_ error: StoreBrokerError?) { finish(error.map { .closed($0) } ?? .lagged) }

    /// The first outcome wins.
    func finish(_ outcome: Outcome) {
        let waiter = state.withLock { state -> CheckedContinuation<Outcome, Never>? in
            guard state.outcome == nil else { return nil }
            state.outcome = outcome
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: outcome)
    }

    func outcome() async -> Outcome {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Outcome? in
                if let outcome = state.outcome { return outcome }
                state.waiter = continuation
                return nil
            }
            if let now { continuation.resume(returning: now) }
        }
    }
}

/// The callers waiting on a mirror: for its first load, or until it has seen a position. Each waits under a
/// key, so that cancelling its task takes it out.
@usableFromInline
struct MirrorWaiters {
    @usableFromInline typealias Continuation = CheckedContinuation<Result<Void, StoreBrokerError>, Never>

    private var loads: [UInt64: Continuation] = [:]
    private var positions: [UInt64: (epoch: UInt64?, sequence: UInt64, continuation: Continuation)] = [:]
    private var nextKey: UInt64 = 0
    /// Every epoch the mirror has been at: a write's epoch that came and went (the store was dropped since)
    /// releases its waiters.
    private var seen: Set<UInt64> = []
    /// The epoch `advance` put in `seen` last.
    private var lastSeen: UInt64?
    /// The broker is out of reach, and the waiters were told so: one that comes meanwhile is told at once. Cleared
    /// when the follower has subscribed again.
    var outage: StoreBrokerError?

    mutating func makeKey() -> UInt64 {
        nextKey += 1
        return nextKey
    }

    /// `epoch` nil: whatever the epoch, once the mirror's sequence is at least `sequence`.
    @usableFromInline
    func isReached(epoch: UInt64?, sequence: UInt64, mirror: (epoch: UInt64, sequence: UInt64)) -> Bool {
        guard let epoch else { return mirror.sequence >= sequence }
        return (mirror.epoch == epoch && mirror.sequence >= sequence) || (seen.contains(epoch) && mirror.epoch != epoch)
    }

    mutating func waitForLoad(key: UInt64, _ continuation: Continuation) { loads[key] = continuation }

    mutating func waitForPosition(key: UInt64, epoch: UInt64?, sequence: UInt64, _ continuation: Continuation) {
        positions[key] = (epoch, sequence, continuation)
    }

    /// Takes a waiter out (its task was cancelled).
    mutating func remove(_ key: UInt64) -> Continuation? {
        loads.removeValue(forKey: key) ?? positions.removeValue(forKey: key)?.continuation
    }

    /// The mirror loaded: every load waiter.
    mutating func takeLoads() -> [Continuation] {
        defer { loads = [:] }
        return Array(loads.values)
    }

    /// The waiters the mirror's new position releases.
    @usableFromInline mutating func advance(to mirror: (epoch: UInt64, sequence: UInt64)) -> [Continuation] {
        if mirror.epoch != lastSeen {  // an epoch is hashed into `seen` once, not per commit
            seen.insert(mirror.epoch)
            lastSeen = mirror.epoch
        }
        guard !positions.isEmpty else { return [] }
        var released: [Continuation] = []
        for (key, entry) in positions where isReached(epoch: entry.epoch, sequence: entry.sequence, mirror: mirror) {
            released.append(entry.continuation)
            positions[key] = nil
        }
        return released
    }

    /// Everyone (the mirror stopped, or lost the broker).
    mutating func takeAll() -> [Continuation] {
        defer {
            loads = [:]
            positions = [:]
        }
        return Array(loads.values) + positions.values.map(\.continuation)
    }
}

/// The part of a mirror's locked state (a store's, a value's) that loading, waiting and stopping share.
@usableFromInline
protocol MirrorState {
    associatedtype Update: Sendable
    var phase: LoadState<Void> { get set }
    var epoch: UInt64 { get }
    var sequence: UInt64 { get }
    var waiters: MirrorWaiters { get set }
    var streams: [UInt64: BoundedStream<Update, Never>.Feed] { get set }
}

extension MirrorState {
    @inlinable var position: (epoch: UInt64, sequence: UInt64) { (epoch, sequence) }
    @inlinable var isLoaded: Bool { if case .value = phase { true } else { false } }
    var isStopped: Bool {
        if case .error(let error) = phase { return !(error.isUnavailable || error.kind == .timedOut) }
        return false
    }
}

extension Locked where Value: MirrorState {
    /// Suspends under a fresh key until `register` (called under the lock, unless the task is already
    /// cancelled) or a later event resumes it; cancelling the task resumes it with `cancelled`.
    private func suspend(
        _ what: String, _ register: (inout Value, UInt64, MirrorWaiters.Continuation) -> Result<Void, StoreBrokerError>?
    ) async throws(StoreBrokerError) {
        let key = withLock { $0.waiters.makeKey() }
        let cancelled = StoreBrokerError(.cancelled, "the task waiting for \(what) was cancelled")
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: MirrorWaiters.Continuation) in
                let now = withLock { state -> Result<Void, StoreBrokerError>? in
                    if Task.isCancelled { return .failure(cancelled) }
                    return register(&state, key, continuation)
                }
                if let now { continuation.resume(returning: now) }
            }
        } onCancel: {
            withLock { $0.waiters.remove(key) }?.resume(returning: .failure(cancelled))
        }
        try result.get()
    }

    /// Returns once the first state is loaded; throws what stopped the mirror, or `cannotConnect` once the
    /// broker has been out of reach for the client's `connectTimeout`.
    func waitUntilLoaded(_ what: String) async throws(StoreBrokerError) {
        try await suspend(what) { state, key, continuation in
            switch state.phase {
            case .value: return .success(())
            case .error(let error): return .failure(error)
            case .idle, .loading:
                state.waiters.waitForLoad(key: key, continuation)
                return nil
            }
        }
    }

    /// Returns once the mirror holds the commit at (epoch, sequence) (any epoch when `epoch` is nil); throws
    /// when the mirror stops or loses the broker first.
    @inlinable nonisolated(nonsending) func waitUntilReached(
        _ what: @autoclosure () -> String, epoch: UInt64?, sequence: UInt64
    ) async throws(StoreBrokerError) {
        // Usually already there (a write's answer is resumed after the pushes its read brought): no suspension.
        // The usual case is decided from the mirror's position alone: `waiters`, read through the protocol, is a
        // copy of its three collections (a retain and release of each, per write). Inlined, so that the app's
        // build specializes it for its mirror: a generic call looked the mirror's type up at run time per write.
        let reached = withLock { state in
            guard state.isLoaded else { return false }
            if epoch == nil || epoch == state.epoch, state.sequence >= sequence { return true }
            return state.waiters.isReached(epoch: epoch, sequence: sequence, mirror: state.position)
        }
        if reached, !Task.isCancelled { return }
        try await suspendUntilReached(what(), epoch: epoch, sequence: sequence)
    }

    /// `waitUntilReached` once the mirror is not there yet: waits for it.
    @usableFromInline func suspendUntilReached(_ what: String, epoch: UInt64?, sequence: UInt64) async throws(StoreBrokerError) {
        try await suspend(what) { state, key, continuation in
            if case .error(let error) = state.phase { return .failure(error) }
            if state.isLoaded, state.waiters.isReached(epoch: epoch, sequence: sequence, mirror: state.position) {
                return .success(())
            }
            if let outage = state.waiters.outage { return .failure(outage) }
            state.waiters.waitForPosition(key: key, epoch: epoch, sequence: sequence, continuation)
            return nil
        }
    }

    /// The broker has been out of reach for the connect timeout: a mirror that has not loaded says so in its
    /// load state; every waiter gets the error (the follower goes on trying).
    func unavailable(_ error: StoreBrokerError) {
        let waiting = withLock { state -> [MirrorWaiters.Continuation] in
            guard !state.isStopped else { return [] }
            if !state.isLoaded { state.phase = .error(error) }
            state.waiters.outage = error
            return state.waiters.takeAll()
        }
        for waiter in waiting { waiter.resume(returning: .failure(error)) }
    }

    /// The follower has subscribed again after an outage: waiters wait again.
    func reachable() {
        withLock { state in
            if state.waiters.outage != nil { state.waiters.outage = nil }
        }
    }

    /// The mirror stops for good: waiters get the error, streams end.
    func stop(with failure: StoreBrokerError) {
        let (waiting, streams) = withLock { state in
            state.phase = .error(failure)
            defer { state.streams = [:] }
            return (state.waiters.takeAll(), Array(state.streams.values))
        }
        for waiter in waiting { waiter.resume(returning: .failure(failure)) }
        for stream in streams { stream.finish() }
    }
}

/// JSON for a mirror's items or value: written by `PayloadJSON`, or by the mirror's own `JSONEncoder` where that
/// one leaves off (the same bytes), and read by one `JSONDecoder` per mirror (a new pair per call showed in
/// profiles of `RemoteStore.insert`). Keys are sorted, so equal values are equal bytes; a payload is decoded in
/// place, not copied into a `Data` first.
@usableFromInline
struct MirrorCoding: Sendable {
    private let encoder: JSONEncoder
    private let decoder = JSONDecoder()
    private let payloads = PayloadJSON()

    init() {
        encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
    }

    /// The value's JSON: `PayloadJSON`'s, or `JSONEncoder`'s (the same bytes) where that one leaves it.
    @usableFromInline func encode(_ value: some Encodable) throws -> Payload {
        if let bytes = payloads.encode(value) { return Payload(bytes) }
        return Payload(ByteBuffer(bytes: try encoder.encode(value)))
    }

    func decode<Value: Decodable>(_ type: Value.Type, from payload: Payload) throws -> Value {
        try payload.bytes.withUnsafeReadableBytes { bytes in
            guard let base = bytes.baseAddress else { return try decoder.decode(type, from: Data()) }
            let borrowed = Data(bytesNoCopy: UnsafeMutableRawPointer(mutating: base), count: bytes.count, deallocator: .none)
            return try decoder.decode(type, from: borrowed)
        }
    }
}

/// The values a mirror's own writes encoded, by their bytes, from encoding until the mirror has shown the
/// write: when the broker's event brings those bytes back, the mirror takes the value instead of decoding it
/// (JSON decoding was a tenth of the client's CPU per `RemoteStore.insert`). Equal bytes decode to an equal
/// value, so a match is exact; a miss (another process's write) decodes as before.
@usableFromInline
final class WrittenValues<Value: Sendable>: Sendable {
    fileprivate struct Entry {
        var value: Value
        var writes: Int  // writes of these bytes in flight
    }

    private let entries = Locked<[Payload: Entry]>([:])

    /// Holds each value, encoded as the payload at its index, until `forget(_:)` with the same payloads.
    @usableFromInline func note(_ payloads: [Payload], _ values: [Value]) {
        guard !payloads.isEmpty else { return }
        entries.withLock { entries in
            for index in payloads.indices {
                entries[payloads[index], default: Entry(value: values[index], writes: 0)].writes += 1
            }
        }
    }

    @usableFromInline func forget(_ payloads: [Payload]) {
        guard !payloads.isEmpty else { return }
        entries.withLock { entries in
            for payload in payloads {
                guard let entry = entries[payload] else { continue }
                if entry.writes > 1 { entries[payload]!.writes -= 1 } else { entries[payload] = nil }
            }
        }
    }

    /// How many distinct payloads writes in flight hold (0 once every write is shown: nothing is kept longer).
    var count: Int { entries.withLock { $0.count } }

    /// The writes in flight as they are now (a copy that shares the table's storage: no lock per lookup).
    func snapshot() -> Snapshot { Snapshot(entries: entries.withLock { $0 }) }

    struct Snapshot {
        fileprivate let entries: [Payload: Entry]

        /// The value a write in flight encoded as exactly these bytes.
        func value(for payload: Payload) -> Value? { entries.isEmpty ? nil : entries[payload]?.value }
    }
}
