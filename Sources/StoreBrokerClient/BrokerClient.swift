#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Locking
import Wire

/// A client of the broker: one connection, opened on first use and opened again after the broker restarts.
///
/// `RemoteStore`, `RemoteValue` and `RemoteSecureValue` share a client; so may any number of tasks. A request
/// that fails because the connection went away is not retried (a write may or may not have been committed);
/// the next request reconnects.
public final class BrokerClient: Sendable {
    public let socketPath: String
    public let clientName: String
    private let current = Locked<BrokerConnection?>(nil)

    /// `socketPath` defaults to the broker's own rule (`STOREBROKER_SOCKET`, `XDG_RUNTIME_DIR`, `/tmp`).
    public init(socketPath: String = BrokerConnection.defaultSocketPath(), clientName: String = BrokerClient.processName) {
        self.socketPath = socketPath
        self.clientName = clientName
    }

    /// This process's name, for the broker's logs.
    public static var processName: String {
        String(CommandLine.arguments.first?.split(separator: "/").last ?? "client")
    }

    /// The open connection, connecting (again) if needed.
    public func connection() async throws(StoreBrokerError) -> BrokerConnection {
        if let open = current.withLock({ $0 }), open.isOpen { return open }
        let fresh = try await BrokerConnection.connect(socketPath: socketPath, clientName: clientName)
        let kept = current.withLock { current -> BrokerConnection in
            if let other = current, other.isOpen { return other }
            current = fresh
            return fresh
        }
        if kept !== fresh { await fresh.close() }
        return kept
    }

    /// Sends a request and returns its answer; an `error` answer is thrown as `refused` with its code.
    package func send(_ request: ClientMessage) async throws(StoreBrokerError) -> ServerMessage {
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

extension StoreBrokerError {
    /// The broker refused the write because its condition did not hold.
    public var isConflict: Bool { kind == .refused && code == .conflict }
    /// The broker could not be reached or went away.
    public var isUnavailable: Bool { kind == .cannotConnect || kind == .connectionClosed }
}

/// Follows one subscription for as long as its owner lives: reconnects with a capped backoff when the broker
/// goes away, resumes from the last point the owner has seen (or a fresh snapshot when the broker says the
/// history is gone), and starts over after `lagged`.
struct SubscriptionFollower: Sendable {
    let client: BrokerClient
    let namespace: Namespace
    let name: String

    /// Runs until cancelled or until `handle` throws something other than a lost connection (returned).
    /// `resumePoint` is asked before each (re)subscription.
    func run(
        resumePoint: @Sendable () -> SubscriptionStart,
        handle: @Sendable (Push) async throws -> Void
    ) async -> (any Error)? {
        var backoff: Duration = .milliseconds(20)
        while !Task.isCancelled {
            do {
                let connection = try await client.connection()
                for try await push in connection.follow(namespace, name: name, from: resumePoint()) {
                    backoff = .milliseconds(20)
                    try await handle(push)
                }
                // It ends without an error only if the subscription did: subscribe again from where we are.
            } catch let error as StoreBrokerError where error.isUnavailable {
                try? await Task.sleep(for: backoff)
                backoff = min(backoff * 2, .seconds(1))
            } catch is CancellationError {
                return nil
            } catch {
                return error
            }
        }
        return nil
    }
}

/// Callers waiting for a mirror to reach a write's (epoch, sequence).
struct SequenceWaiters {
    private var waiting: [(epoch: UInt64, sequence: UInt64, continuation: CheckedContinuation<Void, Never>)] = []
    /// Every epoch the mirror has been at: a write's epoch that came and went (the store was dropped since)
    /// releases its waiters.
    private var seen: Set<UInt64> = []

    func isReached(epoch: UInt64, sequence: UInt64, mirror: (epoch: UInt64, sequence: UInt64)) -> Bool {
        (mirror.epoch == epoch && mirror.sequence >= sequence) || (seen.contains(epoch) && mirror.epoch != epoch)
    }

    /// Registers a waiter, or returns `false` when the mirror is already there.
    mutating func wait(
        epoch: UInt64, sequence: UInt64, mirror: (epoch: UInt64, sequence: UInt64),
        _ continuation: CheckedContinuation<Void, Never>
    ) -> Bool {
        guard !isReached(epoch: epoch, sequence: sequence, mirror: mirror) else { return false }
        waiting.append((epoch, sequence, continuation))
        return true
    }

    /// The waiters the mirror's new position releases.
    mutating func advance(to mirror: (epoch: UInt64, sequence: UInt64)) -> [CheckedContinuation<Void, Never>] {
        seen.insert(mirror.epoch)
        var released: [CheckedContinuation<Void, Never>] = []
        var still: [(epoch: UInt64, sequence: UInt64, continuation: CheckedContinuation<Void, Never>)] = []
        for entry in waiting {
            if isReached(epoch: entry.epoch, sequence: entry.sequence, mirror: mirror) {
                released.append(entry.continuation)
            } else {
                still.append(entry)
            }
        }
        waiting = still
        return released
    }

    /// Everyone, when the mirror stops for good.
    mutating func releaseAll() -> [CheckedContinuation<Void, Never>] {
        defer { waiting = [] }
        return waiting.map(\.continuation)
    }
}

/// The part of a mirror's locked state (a store's, a value's) that loading, waiting and stopping share.
protocol MirrorState {
    associatedtype Update: Sendable
    var phase: LoadState<Void> { get set }
    var epoch: UInt64 { get }
    var sequence: UInt64 { get }
    var loadWaiters: [CheckedContinuation<Void, any Error>] { get set }
    var sequenceWaiters: SequenceWaiters { get set }
    var streams: [UUID: AsyncStream<Update>.Continuation] { get set }
}

extension MirrorState {
    var position: (epoch: UInt64, sequence: UInt64) { (epoch, sequence) }
    var isLoaded: Bool { if case .value = phase { true } else { false } }
}

extension Locked where Value: MirrorState {
    /// Returns once the first state is loaded; throws what stopped the mirror.
    func waitUntilLoaded() async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let now: Result<Void, any Error>? = withLock { state in
                switch state.phase {
                case .value: return .success(())
                case .error(let error): return .failure(error)
                case .idle, .loading:
                    state.loadWaiters.append(continuation)
                    return nil
                }
            }
            if let now { continuation.resume(with: now) }
        }
    }

    /// Returns once the mirror holds the commit at (epoch, sequence), or has stopped.
    func waitUntilReached(epoch: UInt64, sequence: UInt64) async {
        await withCheckedContinuation { continuation in
            let waiting = withLock { state in
                if case .error = state.phase { return false }
                return state.sequenceWaiters.wait(
                    epoch: epoch, sequence: sequence, mirror: state.position, continuation)
            }
            if !waiting { continuation.resume() }
        }
    }

    /// The mirror stops for good: waiters are released (load waiters with the error), streams end.
    func stop(with error: any Error) {
        let failure = error as? StoreBrokerError ?? StoreBrokerError(.protocolViolation, "\(error)", underlying: error)
        let (loaded, released, streams) = withLock { state in
            state.phase = .error(failure)
            defer {
                state.loadWaiters = []
                state.streams = [:]
            }
            return (state.loadWaiters, state.sequenceWaiters.releaseAll(), Array(state.streams.values))
        }
        for waiter in loaded { waiter.resume(throwing: error) }
        for waiter in released { waiter.resume() }
        for stream in streams { stream.finish() }
    }
}
