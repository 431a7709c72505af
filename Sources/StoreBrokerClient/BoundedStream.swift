import Locking
import NIOCore

/// An asynchronous sequence with a bounded buffer: what the library hands out for events, values and pushes,
/// so that a consumer that stops reading costs at most `capacity` elements, never the process's memory.
///
/// The producer (the library) decides what a full buffer means: a store's events give a fresh `loaded` marked
/// `afterLag`, a value keeps its newest state, a subscription's pushes end with `lagged` and the
/// library subscribes again from there. It has one reader: iterating it twice shares the elements, and a second
/// reader waiting ends the first one's iteration.
public struct BoundedStream<Element: Sendable, Failure: Error>: AsyncSequence, Sendable {
    private let consumer: Consumer

    /// Makes the stream and the feed that fills it; `onTermination` runs once, when the stream finishes or its
    /// consumer is gone.
    static func make(
        capacity: Int, onTermination: @escaping @Sendable () -> Void = {}
    ) -> (stream: BoundedStream, feed: Feed) {
        let storage = Storage(capacity: capacity, onTermination: onTermination)
        return (BoundedStream(consumer: Consumer(storage)), Feed(storage: storage))
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(consumer: consumer) }

    public struct AsyncIterator: AsyncIteratorProtocol {
        fileprivate let consumer: Consumer

        public mutating func next() async throws(Failure) -> Element? {
            try await consumer.storage.next()
        }

        public mutating func next(isolation actor: isolated (any Actor)?) async throws(Failure) -> Element? {
            try await consumer.storage.next()
        }
    }

    /// The producer's side.
    @usableFromInline struct Feed: Sendable {
        fileprivate let storage: Storage

        /// Adds an element; `false` (and nothing added) when the buffer is full.
        @discardableResult
        @usableFromInline func yield(_ element: Element) -> Bool { storage.push(element) }

        /// Adds an element once the buffer has room (backpressure for a relay); `false` when the stream is over.
        func send(_ element: Element) async -> Bool { await storage.send(element) }

        /// Adds an element even to a full buffer: the one last word (`lagged`) before `finish()`.
        func yieldPastCapacity(_ element: Element) { _ = storage.push(element, pastCapacity: true) }

        /// Drops what the consumer has not read yet and puts `elements` in its place (a resynchronization).
        func replaceUnread(with elements: [Element]) { _ = storage.replaceUnread { _ in elements } }

        /// `replaceUnread(with:)` with elements made from the last element the reader took, in one step: the
        /// reader cannot take another in between (it would then be told of, or resumed from, a point it has
        /// passed). Returns that element.
        @discardableResult
        func replaceUnread(basedOnLastTaken make: (Element?) -> [Element]) -> Element? {
            storage.replaceUnread(make)
        }

        /// The elements not read yet.
        var unread: Int { storage.unread }


        func finish(throwing error: Failure? = nil) { storage.finish(error) }
    }

    /// Held only by the consumer's side: when the stream and its iterators are gone, the producer hears of it.
    fileprivate final class Consumer: Sendable {
        let storage: Storage
        init(_ storage: Storage) { self.storage = storage }
        deinit { storage.finish(nil) }
    }

    fileprivate final class Storage: Sendable {
        private struct State: @unchecked Sendable {  // elements are Sendable; so is the continuation
            var buffer = CircularBuffer<Element>()
            var waiting: CheckedContinuation<Result<Element?, Failure>, Never>?
            /// A producer waiting for room (`send`).
            var producer: CheckedContinuation<Bool?, Never>?
            var end: Result<Void, Failure>?
            var lastTaken: Element?
            var onTermination: (@Sendable () -> Void)?

            /// The first element, taken for a reader waiting for one (to be resumed outside the lock).
            mutating func handToWaitingReader() -> (CheckedContinuation<Result<Element?, Failure>, Never>, Element)? {
                guard let waiting, let first = buffer.popFirst() else { return nil }
                self.waiting = nil
                lastTaken = first
                return (waiting, first)
            }
        }

        let capacity: Int
        private let state: Locked<State>

        init(capacity: Int, onTermination: @escaping @Sendable () -> Void) {
            self.capacity = Swift.max(1, capacity)
            state = Locked(State(onTermination: onTermination))
        }

        var unread: Int { state.withLock { $0.buffer.count } }

        func replaceUnread(_ make: (Element?) -> [Element]) -> Element? {
            var taken: Element?
            let waiter = state.withLock { state -> (CheckedContinuation<Result<Element?, Failure>, Never>, Element)? in
                taken = state.lastTaken
                guard state.end == nil else { return nil }
                state.buffer.removeAll(keepingCapacity: true)
                state.buffer.append(contentsOf: make(state.lastTaken))
                return state.handToWaitingReader()
            }
            if let (continuation, element) = waiter { continuation.resume(returning: .success(element)) }
            return taken
        }

        func push(_ element: Element, pastCapacity: Bool = false) -> Bool {
            var accepted = false
            let waiter = state.withLock { state -> (CheckedContinuation<Result<Element?, Failure>, Never>, Element)? in
                guard state.end == nil, pastCapacity || state.buffer.count < capacity else { return nil }
                state.buffer.append(element)
                accepted = true
                return state.handToWaitingReader()
            }
            if let (continuation, element) = waiter { continuation.resume(returning: .success(element)) }
            return accepted
        }

        func send(_ element: Element) async -> Bool {
            while true {
                let outcome: Bool? = await withTaskCancellationHandler {
                    await withCheckedContinuation { (continuation: CheckedContinuation<Bool?, Never>) in
                        let room = state.withLock { state -> Bool? in
                            if state.end != nil || Task.isCancelled { return false }
                            if state.buffer.count < capacity { return true }
                            state.producer = continuation
                            return nil
                        }
                        if let room { continuation.resume(returning: room) }
                    }
                } onCancel: {
                    let producer = state.withLock { state in
                        defer { state.producer = nil }
                        return state.producer
                    }
                    producer?.resume(returning: false)
                }
                switch outcome {
                case true?: if push(element) { return true }  // else full again: wait again
                case false?: return false
                case nil: continue  // woken: look again
                }
            }
        }

        func finish(_ error: Failure?) {
            let (waiting, producer, onTermination) = state.withLock { state in
                if state.end == nil { state.end = error.map { .failure($0) } ?? .success(()) }
                defer {
                    state.waiting = nil
                    state.producer = nil
                    state.onTermination = nil
                }
                return (state.buffer.isEmpty ? state.waiting : nil, state.producer, state.onTermination)
            }
            onTermination?()
            producer?.resume(returning: false)
            waiting?.resume(returning: error.map { .failure($0) } ?? .success(nil))
        }

        func next() async throws(Failure) -> Element? {
            let result = await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Result<Element?, Failure>, Never>) in
                    var producer: CheckedContinuation<Bool?, Never>?
                    var superseded: CheckedContinuation<Result<Element?, Failure>, Never>?
                    let now = state.withLock { state -> Result<Element?, Failure>? in
                        if let first = state.buffer.popFirst() {
                            state.lastTaken = first
                            producer = state.producer
                            state.producer = nil
                            return .success(first)
                        }
                        switch state.end {
                        case .failure(let error)?:
                            state.end = .success(())  // thrown once, then the stream is over
                            return .failure(error)
                        case .success?: return .success(nil)
                        case nil:
                            if Task.isCancelled { return .success(nil) }
                            // One reader at a time: a second one waiting ends the first's iteration (no hang).
                            superseded = state.waiting
                            state.waiting = continuation
                            return nil
                        }
                    }
                    producer?.resume(returning: nil)  // room now: it looks again
                    superseded?.resume(returning: .success(nil))
                    if let now { continuation.resume(returning: now) }
                }
            } onCancel: {
                let waiting = state.withLock { state in
                    defer { state.waiting = nil }
                    return state.waiting
                }
                waiting?.resume(returning: .success(nil))
            }
            return try result.get()
        }
    }
}
