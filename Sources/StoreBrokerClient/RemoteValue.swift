import Foundation
import Locking
import NIOCore
import StoreModel

/// One value (or secure value) of the broker, mirrored locally: what `RemoteValue` and `RemoteSecureValue`
/// are made of.
final class ValueMirror<Value: Codable & Sendable>: Sendable {
    let client: BrokerClient
    let namespace: Namespace
    let name: String
    private let state: Locked<State>
    private let follower = Locked<Task<Void, Never>?>(nil)

    private struct State: MirrorState, @unchecked Sendable {  // Value is Sendable; the continuations too
        var value: Value?
        var phase: LoadState<Void> = .idle
        var epoch: UInt64 = 0
        var sequence: UInt64 = 0
        var loadWaiters: [CheckedContinuation<Void, any Error>] = []
        var sequenceWaiters = SequenceWaiters()
        var streams: [UUID: AsyncStream<Value?>.Continuation] = [:]
    }

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
                handle: { [weak self] push in try await self?.apply(push) })
            if let failure { self?.state.stop(with: failure) }
        }
        self.follower.withLock { $0 = task }
    }

    deinit { close() }

    func close() { follower.withLock { $0?.cancel() } }

    var current: Value? { state.withLock { $0.value } }

    private func resumePoint() -> SubscriptionStart {
        state.withLock { $0.isLoaded ? .resume(epoch: $0.epoch, sequence: $0.sequence) : .snapshot }
    }

    static func decode(_ payload: Payload, name: String) throws -> Value {
        do {
            return try JSONDecoder().decode(Value.self, from: Data(payload.bytes.readableBytesView))
        } catch {
            throw StoreBrokerError(.cannotDecode, "value \(name) cannot be decoded: \(error)", underlying: error)
        }
    }

    static func encode(_ value: Value) throws -> Payload {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return Payload(ByteBuffer(bytes: try encoder.encode(value)))
    }

    /// The broker's current state of the value, fetched.
    func fetch() async throws -> (epoch: UInt64, sequence: UInt64, value: Value?) {
        let result = try await client.connection().value(name, in: namespace)
        let at = result.position
        switch result.value {
        case .set(let payload): return (at.epoch, at.sequence, try Self.decode(payload, name: name))
        case .unset: return (at.epoch, at.sequence, nil)
        case .setWithheld: throw StoreBrokerError(.protocolViolation, "getValue was answered without the value")
        }
    }

    private func apply(_ push: Push) async throws {
        let message: (epoch: UInt64, sequence: UInt64, state: ValueState)
        switch push {
        case .valueLoaded(let at, let state), .valueEvent(let at, let state): message = (at.epoch, at.sequence, state)
        default: return  // historyGone: a valueLoaded follows; lagged: the follower subscribes again
        }
        var update: (epoch: UInt64, sequence: UInt64, value: Value?)
        switch message.state {
        case .set(let payload): update = (message.epoch, message.sequence, try Self.decode(payload, name: name))
        case .unset: update = (message.epoch, message.sequence, nil)
        case .setWithheld:
            // A secure value never travels in a push: fetch it (this process is the daemon's user).
            update = try await fetch()
            update.sequence = max(update.sequence, message.sequence)
        }
        let (released, loaded, streams) = state.withLock { state in
            state.value = update.value
            state.epoch = update.epoch
            state.sequence = update.sequence
            state.phase = .value(())
            defer { state.loadWaiters = [] }
            return (state.sequenceWaiters.advance(to: state.position), state.loadWaiters, Array(state.streams.values))
        }
        for stream in streams { stream.yield(update.value) }
        for waiter in loaded { waiter.resume() }
        for waiter in released { waiter.resume() }
    }

    func hasLoaded() async throws { try await state.waitUntilLoaded() }

    /// The value now (once loaded), then every change.
    func stream() -> AsyncStream<Value?> {
        let (stream, continuation) = AsyncStream.makeStream(of: Value?.self)
        let key = UUID()
        state.withLock { state in
            if state.isLoaded { continuation.yield(state.value) }
            state.streams[key] = continuation
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.streams.removeValue(forKey: key) }
        }
        return stream
    }

    /// Sets (or with `nil` resets) the value under `condition`; returns once the mirror has the change.
    func write(_ value: Value?, condition: Condition = .unconditional) async throws {
        let payload = try value.map(Self.encode)
        let result = try await client.connection().setValue(name, in: namespace, to: payload, condition: condition)
        guard result.committed else { return }
        await state.waitUntilReached(epoch: result.epoch, sequence: result.sequence)
    }

    /// Read, transform, write only if nobody wrote in between; again until that holds. Two processes
    /// updating at once both get their change in.
    func compareAndSet(_ transform: (Value?) throws -> Value?) async throws {
        while true {
            let (_, sequence, current) = try await fetch()
            do {
                try await write(try transform(current), condition: .sequence(sequence))
                return
            } catch let error as StoreBrokerError where error.isConflict {
                continue
            }
        }
    }
}

/// A value shared by every process (Boutique's `@StoredValue`): a default, `set`, `reset`, a stream of values,
/// and read-modify-write helpers that lose no update when several processes write at once.
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

    public init(client: BrokerClient, key: String, default defaultValue: Value) {
        self.key = key
        self.defaultValue = defaultValue
        self.mirror = ValueMirror(client: client, namespace: .value, name: key)
    }

    /// The value as last received, or the default when it is not set.
    public var value: Value { mirror.current ?? defaultValue }

    /// Returns once the value has been received.
    public func valueHasLoaded() async throws { try await mirror.hasLoaded() }

    /// The value now, then every change (the default when it is reset).
    public var values: AsyncStream<Value> {
        let defaultValue = defaultValue
        let source = mirror.stream()
        return AsyncStream { continuation in
            let task = Task {
                for await value in source { continuation.yield(value ?? defaultValue) }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    public func set(_ value: Value) async throws { try await mirror.write(value) }

    /// Unsets it: `value` is the default again.
    public func reset() async throws { try await mirror.write(nil) }

    /// Replaces the value with `transform(value)` as one compare-and-set: retried if another process wrote in
    /// between, so no update is lost.
    public func update(_ transform: (Value) throws -> Value) async throws {
        let defaultValue = defaultValue
        try await mirror.compareAndSet { try transform($0 ?? defaultValue) }
    }

    /// Stops following the broker.
    public func close() { mirror.close() }
}

extension RemoteValue where Value == Bool {
    /// Flips it, as one compare-and-set.
    public func toggle() async throws { try await update { !$0 } }
}

extension RemoteValue {
    /// Appends an element to an array value, as one compare-and-set.
    public func append<Element>(_ element: Element) async throws where Value == [Element] {
        try await update { $0 + [element] }
    }

    /// Removes the element if the array holds it, else appends it, as one compare-and-set.
    public func togglePresence<Element: Equatable>(_ element: Element) async throws where Value == [Element] {
        try await update { array in
            array.contains(element) ? array.filter { $0 != element } : array + [element]
        }
    }

    /// Sets (or with `nil` removes) one key of a dictionary value, as one compare-and-set.
    public func update<Key, Element>(key: Key, value: Element?) async throws where Value == [Key: Element] {
        try await update { dictionary in
            var copy = dictionary
            copy[key] = value
            return copy
        }
    }
}

/// A secure value (Boutique's `@SecurelyStoredValue`): encrypted at rest by the broker, readable only by the
/// daemon's own user; `nil` when not set, and setting `nil` removes it.
public final class RemoteSecureValue<Value: Codable & Sendable>: Sendable {
    public let key: String
    private let mirror: ValueMirror<Value>

    public init(client: BrokerClient, key: String) {
        self.key = key
        self.mirror = ValueMirror(client: client, namespace: .secureValue, name: key)
    }

    public var value: Value? { mirror.current }

    public func valueHasLoaded() async throws { try await mirror.hasLoaded() }

    /// The value now, then every change.
    public var values: AsyncStream<Value?> { mirror.stream() }

    /// Sets it; `nil` removes it.
    public func set(_ value: Value?) async throws { try await mirror.write(value) }

    public func reset() async throws { try await mirror.write(nil) }

    public func close() { mirror.close() }
}
