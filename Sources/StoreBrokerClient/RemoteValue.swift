import Foundation
import Locking
import NIOCore
import Observation
import StoreModel

/// One value (or secure value) of the broker, mirrored locally: what `RemoteValue` and `RemoteSecureValue`
/// are made of. Observable: reading `current`, `sequence` or `phase` in `withObservationTracking` (or a
/// SwiftUI body, through the public classes) tracks them.
final class ValueMirror<Value: Codable & Sendable>: Sendable, Observable {
    let client: BrokerClient
    let namespace: Namespace
    let name: String
    private let state: Locked<State>
    private let follower = Locked<Task<Void, Never>?>(nil)
    private let registrar = ObservationRegistrar()
    private let coding = MirrorCoding()
    // Made once (see RemoteStore's): a key path into a generic class is instantiated at run time.
    private let currentKey: KeyPath<ValueMirror, Value?> & Sendable = \.current
    private let sequenceKey: KeyPath<ValueMirror, UInt64> & Sendable = \.sequence
    private let phaseKey: KeyPath<ValueMirror, LoadState<Void>> & Sendable = \.phase

    private struct State: MirrorState, @unchecked Sendable {  // Value is Sendable; the continuations too
        var value: Value?
        var phase: LoadState<Void> = .idle
        var epoch: UInt64 = 0
        var sequence: UInt64 = 0
        var waiters = MirrorWaiters()
        var streams: [UInt64: BoundedStream<Value?, Never>.Feed] = [:]
        var nextStream: UInt64 = 0
    }

    private let written = WrittenValues<Value>()
    private var what: String { namespace == .secureValue ? "secure value \(name)" : "value \(name)" }

    init(client: BrokerClient, namespace: Namespace, name: String) {
        self.client = client
        self.namespace = namespace
        self.name = name
        self.state = Locked(State())
        let follower = SubscriptionFollower(client: client, namespace: namespace, name: name)
        let task = Task { [weak self] in
            self?.state.withLock { $0.phase = .loading }
            let failure = await follower.run(
                resumePoint: { [weak self] in self?.resumePoint() ?? .snapshot },
                unavailable: { [weak self] error in
                    guard let self else { return }
                    registrar.withMutation(of: self, keyPath: phaseKey) { state.unavailable(error) }
                },
                subscribed: { [weak self] route in if route != nil { self?.state.reachable() } },
                handle: { [weak self] push throws(StoreBrokerError) in try self?.apply(push) })
            guard let self, let failure else { return }
            registrar.withMutation(of: self, keyPath: phaseKey) { state.stop(with: failure) }
        }
        self.follower.withLock { $0 = task }
    }

    deinit { follower.withLock { $0?.cancel() } }

    func close() {
        follower.withLock { $0?.cancel() }
        registrar.withMutation(of: self, keyPath: phaseKey) {
            state.stop(with: StoreBrokerError(.closed, "\(what) was closed"))
        }
    }

    var current: Value? {
        registrar.access(self, keyPath: currentKey)
        return state.withLock { $0.value }
    }

    var sequence: UInt64 {
        registrar.access(self, keyPath: sequenceKey)
        return state.withLock { $0.sequence }
    }

    var phase: LoadState<Void> {
        registrar.access(self, keyPath: phaseKey)
        return state.withLock { $0.phase }
    }

    private func resumePoint() -> SubscriptionStart {
        state.withLock { $0.isLoaded ? .resume(epoch: $0.epoch, sequence: $0.sequence) : .snapshot }
    }

    /// The value these bytes hold: as this process wrote it when a write of it is in flight, else decoded.
    func decode(_ payload: Payload) throws(StoreBrokerError) -> Value {
        if let value = written.snapshot().value(for: payload) { return value }
        do {
            return try coding.decode(Value.self, from: payload)
        } catch {
            throw StoreBrokerError(.cannotDecode, "\(what) cannot be decoded: \(error)", underlying: error)
        }
    }

    func encode(_ value: Value) throws(StoreBrokerError) -> Payload {
        do {
            return try coding.encode(value)
        } catch {
            throw StoreBrokerError(.cannotEncode, "a new state of \(what) cannot be encoded: \(error)", underlying: error)
        }
    }

    /// The broker's current state of the value, fetched.
    func fetch() async throws(StoreBrokerError) -> (epoch: UInt64, sequence: UInt64, value: Value?) {
        let result = try await client.connection().value(name, in: namespace)
        let at = result.position
        switch result.value {
        case .set(let payload): return (at.epoch, at.sequence, try decode(payload))
        case .unset: return (at.epoch, at.sequence, nil)
        case .setWithheld: throw StoreBrokerError(.protocolViolation, "getValue was answered without the value")
        }
    }

    /// Applies a push as the connection reads it. A secure value never travels in a push (`setWithheld`): it is
    /// fetched (this process is the daemon's user) by a task, and applied unless a newer state came first.
    private func apply(_ push: Push) throws(StoreBrokerError) {
        let message: (epoch: UInt64, sequence: UInt64, state: ValueState)
        switch push {
        case .valueLoaded(let at, let state), .valueEvent(let at, let state): message = (at.epoch, at.sequence, state)
        default: return  // historyGone: a valueLoaded follows; lagged: the follower subscribes again
        }
        switch message.state {
        case .set(let payload): store((message.epoch, message.sequence, try decode(payload)))
        case .unset: store((message.epoch, message.sequence, nil))
        case .setWithheld:
            Task {
                do throws(StoreBrokerError) {
                    var update = try await fetch()
                    update.sequence = max(update.sequence, message.sequence)
                    store(update, unlessOlder: true)
                } catch {
                    // The connection went away: the follower resubscribes and this state comes again.
                }
            }
        }
    }

    private func store(_ update: (epoch: UInt64, sequence: UInt64, value: Value?), unlessOlder: Bool = false) {
        let loading = !state.withLock { $0.isLoaded }
        registrar.willSet(self, keyPath: currentKey)
        registrar.willSet(self, keyPath: sequenceKey)
        if loading { registrar.willSet(self, keyPath: phaseKey) }
        let (released, streams) = state.withLock { state -> ([MirrorWaiters.Continuation], [BoundedStream<Value?, Never>.Feed]) in
            if unlessOlder, state.isLoaded, state.epoch == update.epoch, state.sequence > update.sequence { return ([], []) }
            state.value = update.value
            state.epoch = update.epoch
            state.sequence = update.sequence
            state.phase = .value(())
            return (state.waiters.takeLoads() + state.waiters.advance(to: state.position), Array(state.streams.values))
        }
        if loading { registrar.didSet(self, keyPath: phaseKey) }
        registrar.didSet(self, keyPath: sequenceKey)
        registrar.didSet(self, keyPath: currentKey)
        // A reader that is behind gets the newest state in place of what it has not read: a value's history
        // is not what anyone waits for, its state is.
        for stream in streams where !stream.yield(update.value) { stream.replaceUnread(with: [update.value]) }
        for waiter in released { waiter.resume(returning: .success(())) }
    }

    func hasLoaded() async throws(StoreBrokerError) { try await state.waitUntilLoaded("\(what) to load") }

    func waitUntilSeen(sequence: UInt64) async throws(StoreBrokerError) {
        try await state.waitUntilReached("\(what) to reach sequence \(sequence)", epoch: nil, sequence: sequence)
    }

    /// The value now (once loaded), then every change.
    func stream() -> BoundedStream<Value?, Never> {
        let key = state.withLock { state -> UInt64 in
            state.nextStream += 1
            return state.nextStream
        }
        let (stream, feed) = BoundedStream<Value?, Never>.make(capacity: client.eventBuffer) { [weak self] in
            _ = self?.state.withLock { $0.streams.removeValue(forKey: key) }
        }
        let stopped = state.withLock { state -> Bool in
            if state.isLoaded { feed.yield(state.value) }
            if !state.isStopped { state.streams[key] = feed }
            return state.isStopped
        }
        if stopped { feed.finish() }
        return stream
    }

    /// Sets (or with `nil` resets) the value under `condition`; returns its sequence once the mirror has the
    /// change (or has stopped, or lost the broker: the write is committed all the same).
    @discardableResult
    func write(_ value: Value?, condition: Condition = .unconditional) async throws(StoreBrokerError) -> UInt64 {
        let payload = try value.map(encode)
        let payloads = payload.map { [$0] } ?? []
        if let payload, let value { written.note([payload], [value]) }
        defer { written.forget(payloads) }
        let result = try await client.connection().setValue(name, in: namespace, to: payload, condition: condition)
        guard result.committed else { return result.sequence }
        try? await state.waitUntilReached("\(what) to show a write", epoch: result.epoch, sequence: result.sequence)
        return result.sequence
    }

    /// Read, transform, write only if nobody wrote in between; again until that holds. Two processes
    /// updating at once both get their change in.
    func compareAndSet(_ transform: (Value?) -> Value?) async throws(StoreBrokerError) {
        while true {
            let (_, sequence, current) = try await fetch()
            do throws(StoreBrokerError) {
                try await write(transform(current), condition: .sequence(sequence))
                return
            } catch where error.isConflict {
                continue
            }
        }
    }
}

/// A value shared by every process (Boutique's `@StoredValue`): a default, `set`, `reset`, a stream of values,
/// and read-modify-write helpers that lose no update when several processes write at once. `value`,
/// `sequence` and `loadState` are observable (the Observation framework).
///
/// ```swift
/// let darkMode = RemoteValue(client: client, key: "dark-mode", default: false)
/// try await darkMode.toggle()
/// for await isDark in darkMode.values { ... }
/// ```
public final class RemoteValue<Value: Codable & Sendable>: Sendable {
    public let key: String
    public let defaultValue: Value
    private let mirror: ValueMirror<Value>

    /// Starts following the value at once; `value` is the default until it has loaded.
    public init(client: BrokerClient = .shared, key: String, default defaultValue: Value) {
        self.key = key
        self.defaultValue = defaultValue
        self.mirror = ValueMirror(client: client, namespace: .value, name: key)
    }

    /// Returns once the value has loaded; throws `cannotConnect` when the broker cannot be reached within the
    /// client's `connectTimeout`.
    public convenience init(client: BrokerClient = .shared, loading key: String, default defaultValue: Value) async throws(StoreBrokerError) {
        self.init(client: client, key: key, default: defaultValue)
        do throws(StoreBrokerError) {
            try await valueHasLoaded()
        } catch {
            close()
            throw error
        }
    }

    /// The value as last received, or the default when it is not set.
    public var value: Value { mirror.current ?? defaultValue }

    /// The value's sequence as last received: its commit, the one to wait for (`waitUntilSeen`) or expect
    /// (`set(_:expecting:)`).
    public var sequence: UInt64 { mirror.sequence }

    /// Idle, loading, loaded (the value), or the error that stopped the mirror (`cannotConnect` while the broker
    /// is out of reach before the first load: the mirror keeps trying).
    public var loadState: LoadState<Value> { mirror.phase.carrying(value) }

    /// Returns once the value has been received; throws as `RemoteStore.itemsHaveLoaded()` does.
    public func valueHasLoaded() async throws(StoreBrokerError) { try await mirror.hasLoaded() }

    /// Returns once this mirror has seen the value's commit `sequence` (another process's write, say).
    public func waitUntilSeen(sequence: UInt64) async throws(StoreBrokerError) {
        try await mirror.waitUntilSeen(sequence: sequence)
    }

    /// The value now, then every change (the default when it is reset). A reader that falls the client's
    /// `eventBuffer` values behind skips to the newest.
    public var values: AsyncMapSequence<BoundedStream<Value?, Never>, Value> {
        let defaultValue = defaultValue
        return mirror.stream().map { $0 ?? defaultValue }
    }

    /// Sets it; with `expecting`, only if its sequence is still that (else `refused` with code `conflict`).
    /// Returns its sequence after the write.
    @discardableResult
    public func set(_ value: Value, expecting sequence: UInt64? = nil) async throws(StoreBrokerError) -> UInt64 {
        try await mirror.write(value, condition: sequence.map { .sequence($0) } ?? .unconditional)
    }

    /// Unsets it: `value` is the default again.
    public func reset() async throws(StoreBrokerError) { try await mirror.write(nil) }

    /// Replaces the value with `transform(value)` as one compare-and-set: retried if another process wrote in
    /// between, so no update is lost.
    public func update(_ transform: (Value) -> Value) async throws(StoreBrokerError) {
        let defaultValue = defaultValue
        try await mirror.compareAndSet { transform($0 ?? defaultValue) }
    }

    /// Stops following the broker (waiters get `closed`).
    public func close() { mirror.close() }
}

extension RemoteValue where Value == Bool {
    /// Flips it, as one compare-and-set.
    public func toggle() async throws(StoreBrokerError) { try await update { !$0 } }
}

extension RemoteValue {
    /// Appends an element to an array value, as one compare-and-set.
    public func append<Element>(_ element: Element) async throws(StoreBrokerError) where Value == [Element] {
        try await update { $0 + [element] }
    }

    /// Removes the element if the array holds it, else appends it, as one compare-and-set.
    public func togglePresence<Element: Equatable>(_ element: Element) async throws(StoreBrokerError) where Value == [Element] {
        try await update { array in
            array.contains(element) ? array.filter { $0 != element } : array + [element]
        }
    }

    /// Sets (or with `nil` removes) one key of a dictionary value, as one compare-and-set.
    public func update<Key, Element>(key: Key, value: Element?) async throws(StoreBrokerError) where Value == [Key: Element] {
        try await update { dictionary in
            var copy = dictionary
            copy[key] = value
            return copy
        }
    }
}

/// A secure value (Boutique's `@SecurelyStoredValue`): encrypted at rest by the broker, readable only by the
/// daemon's own user; `nil` when not set, and setting `nil` removes it. Observable as `RemoteValue` is.
public final class RemoteSecureValue<Value: Codable & Sendable>: Sendable {
    public let key: String
    private let mirror: ValueMirror<Value>

    public init(client: BrokerClient = .shared, key: String) {
        self.key = key
        self.mirror = ValueMirror(client: client, namespace: .secureValue, name: key)
    }

    /// Returns once the value has loaded.
    public convenience init(client: BrokerClient = .shared, loading key: String) async throws(StoreBrokerError) {
        self.init(client: client, key: key)
        do throws(StoreBrokerError) {
            try await valueHasLoaded()
        } catch {
            close()
            throw error
        }
    }

    public var value: Value? { mirror.current }

    public var sequence: UInt64 { mirror.sequence }

    public var loadState: LoadState<Value?> { mirror.phase.carrying(value) }

    public func valueHasLoaded() async throws(StoreBrokerError) { try await mirror.hasLoaded() }

    public func waitUntilSeen(sequence: UInt64) async throws(StoreBrokerError) {
        try await mirror.waitUntilSeen(sequence: sequence)
    }

    /// The value now, then every change (the newest, for a reader that falls behind).
    public var values: BoundedStream<Value?, Never> { mirror.stream() }

    /// Sets it; `nil` removes it.
    @discardableResult
    public func set(_ value: Value?) async throws(StoreBrokerError) -> UInt64 { try await mirror.write(value) }

    public func reset() async throws(StoreBrokerError) { try await mirror.write(nil) }

    public func close() { mirror.close() }
}
