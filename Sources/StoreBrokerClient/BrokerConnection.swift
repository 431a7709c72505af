#if canImport(Glibc)
import Glibc
#endif
import Locking
import NIOCore
import Synchronization
import Wire

/// One connection to the broker: requests pipelined and answered in order, subscriptions as async streams.
///
/// ```swift
/// let connection = try await BrokerConnection.connect(clientName: "notes-panel")
/// let count = try await connection.count("notes").value
/// ```
public final class BrokerConnection: Sendable {
    /// What the broker announced: protocol version and limits (`limits` is its public face).
    package let welcome: ServerMessage.Welcome
    private let socket: ClientSocket
    private let handler: NIOLoopBound<ClientHandler>
    private let pushBuffer: Int
    private let line: RequestLine
    /// Whether a caller off the loop writes its request itself (no timeout to arm on the loop).
    private let writesDirectly: Bool
    /// The broker answered a `quietChain` with `unknownMessageType` (it is older): writes go plain. An atomic
    /// flag, read by every mirror write without a lock.
    private let quietChainRefused = Atomic<Bool>(false)

    /// Whether this connection's broker takes `quietChain` (as far as it has said).
    @usableFromInline var takesQuietChain: Bool { !quietChainRefused.load(ordering: .relaxed) }

    /// The broker answered a `quietChain` with `unknownMessageType`: no more on this connection.
    func refuseQuietChain() { quietChainRefused.store(true, ordering: .relaxed) }

    private init(
        welcome: ServerMessage.Welcome, socket: ClientSocket, handler: NIOLoopBound<ClientHandler>, pushBuffer: Int,
        line: RequestLine, timed: Bool
    ) {
        self.welcome = welcome
        self.socket = socket
        self.handler = handler
        self.pushBuffer = pushBuffer
        self.line = line
        writesDirectly = !timed
    }

    /// The socket path by PRODUCT.md's rule (`STOREBROKER_SOCKET`, `XDG_RUNTIME_DIR`, `/tmp/storebroker-UID`).
    public static func defaultSocketPath() -> String {
        var environment: [String: String] = [:]
        for name in ["STOREBROKER_SOCKET", "XDG_RUNTIME_DIR"] {
            if let value = getenv(name) { environment[name] = String(cString: value) }
        }
        return SocketPath.default(environment: environment, uid: getuid())
    }

    /// Connects and does the handshake. With a `timeout`, connecting, the handshake and then each request
    /// must finish within it, or fail with `timedOut` (the connection is then closed: answers come in order, so
    /// a late one cannot be told apart). `handshakeTimeout` bounds connecting and the handshake alone (it
    /// defaults to `timeout`). Subscriptions' pushes are never timed: a watcher may wait for hours.
    ///
    /// Each subscription buffers at most `pushBuffer` pushes its reader has not taken; past that, what the reader
    /// has not taken is dropped and the stream ends with `lagged` at the last push it took (the broker is told
    /// to stop sending), as the broker does with its own slow subscribers: a reader that stops reading costs
    /// bounded memory. `follow(...)` resumes from there by itself.
    ///
    /// The connection is served by the client library's own thread (`ClientLoop`): see `BrokerClient.executor`.
    public static func connect(
        socketPath: String = defaultSocketPath(), clientName: String, timeout: Duration? = nil,
        handshakeTimeout: Duration? = nil, pushBuffer: Int = 1024
    ) async throws(StoreBrokerError) -> BrokerConnection {
        let timeAmount = timeout.map(TimeAmount.init)
        let handshakeTime = (handshakeTimeout ?? timeout).map(TimeAmount.init)
        let loop = ClientLoop.shared
        // The request line keeps a descriptor of its own to write requests from the callers' threads; the loop
        // reads a duplicate. The handler says hello from the loop as soon as it serves the socket, and fulfils
        // `established` with the broker's welcome: no hop through the caller's task between connecting and the
        // hello (a busy process must not let the broker's handshake timeout run out on a connection it opened).
        let descriptor = try await connectSocket(socketPath, within: handshakeTimeout ?? timeout)
        let duplicate = fcntl(descriptor, F_DUPFD_CLOEXEC, 0)  // close-on-exec, as the original
        guard duplicate >= 0 else {
            let failure = errno
            let reason = String(cString: strerror(failure))
            Glibc.close(descriptor)
            throw StoreBrokerError(
                .cannotConnect, "cannot connect to the broker at \(socketPath): \(reason)",
                underlying: IOError(errnoCode: failure, reason: "dup"))
        }
        let line = RequestLine(descriptor: descriptor)
        let established = loop.makePromise(of: Established.self)
        let handler = ClientHandler(
            clientName: clientName, requestTimeout: timeAmount, handshakeTimeout: handshakeTime, pushBuffer: pushBuffer,
            established: established, line: line)
        let socket = ClientSocket(descriptor: duplicate, loop: loop, handler: handler)
        loop.execute { socket.start() }
        do {
            let (welcome, handler) = try await established.futureResult.get()
            return BrokerConnection(
                welcome: welcome, socket: socket, handler: handler, pushBuffer: pushBuffer, line: line, timed: timeAmount != nil)
        } catch {
            loop.execute { socket.close(failure: nil) }
            throw error as? StoreBrokerError ?? StoreBrokerError(.connectionClosed, "\(error)", underlying: error)
        }
    }

    /// A connected socket to `path`. A full backlog (the broker is slow to accept) is tried again until `within`
    /// has passed (10 s without it); any other failure is `cannotConnect` with the system's reason.
    private static func connectSocket(_ path: String, within limit: Duration?) async throws(StoreBrokerError) -> CInt {
        let clock = ContinuousClock()
        let deadline = clock.now + (limit ?? .seconds(10))
        while true {
            switch RequestLine.connect(unixDomainSocketPath: path) {
            case .connected(let descriptor):
                return descriptor
            case .failed(let failure) where failure == EAGAIN:
                if clock.now >= deadline {
                    throw StoreBrokerError(
                        .cannotConnect, "cannot connect to the broker at \(path): it did not accept the connection in time")
                }
                if Task.isCancelled {
                    throw StoreBrokerError(.cancelled, "connecting to the broker at \(path) was cancelled")
                }
                try? await Task.sleep(for: .milliseconds(2))
            case .failed(let failure):
                throw StoreBrokerError(
                    .cannotConnect, "cannot connect to the broker at \(path): \(describe(failure))",
                    underlying: IOError(errnoCode: failure, reason: "connect"))
            }
        }
    }

    /// What the handshake gives: the broker's welcome and the handler that serves the connection.
    typealias Established = (welcome: ServerMessage.Welcome, handler: NIOLoopBound<ClientHandler>)

    private static func describe(_ failure: CInt) -> String {
        failure == ENAMETOOLONG ? "the socket path is too long" : String(cString: strerror(failure))
    }

    /// Sends `request` and returns its answer; an `error` answer is thrown as `refused`. The typed calls
    /// (`BrokerCalls.swift`) are the public way in.
    package nonisolated(nonsending) func send(_ request: ClientMessage) async throws(StoreBrokerError) -> ServerMessage {
        // The caller writes its request itself (or, with a timeout to arm, hops to the event loop), and the answer
        // resumes it straight from the read that brought it: no future, no promise, no wake-up of the loop to send.
        let result = await withUnsafeContinuation { (continuation: Answer) in
            if socket.loop.inEventLoop {
                handler.value.send(request, continuation)
            } else if writesDirectly {
                if case .failure(let error) = line.send(request, .answer(continuation)) {
                    continuation.resume(returning: .failure(error))
                }
            } else {
                socket.loop.execute { [handler] in handler.value.send(request, continuation) }
            }
        }
        return try result.get()
    }

    /// Where an answer goes: the waiting caller.
    typealias Answer = UnsafeContinuation<Result<ServerMessage, StoreBrokerError>, Never>
    /// Told of an answer on the event loop as it is read (`send(_:seen:)`).
    package typealias AnswerSeen = @Sendable (Result<ServerMessage, StoreBrokerError>) -> Void

    /// `send(_:)`, and `seen` is told of the answer (or of the failure) once, on the connection's event loop as
    /// the answer is read: in order with the pushes read around it, before this returns. A mirror applies its
    /// own write there, where it applies the pushes.
    package nonisolated(nonsending) func send(
        _ request: ClientMessage, seen: @escaping AnswerSeen
    ) async throws(StoreBrokerError) -> ServerMessage {
        let result = await withUnsafeContinuation { (continuation: Answer) in
            if socket.loop.inEventLoop {
                handler.value.send(request, continuation, seen: seen)
            } else if writesDirectly {
                if case .failure(let error) = line.send(request, .answerSeen(continuation, seen)) {
                    seen(.failure(error))
                    continuation.resume(returning: .failure(error))
                }
            } else {
                socket.loop.execute { [handler] in handler.value.send(request, continuation, seen: seen) }
            }
        }
        return try result.get()
    }

    /// Sends several requests back to back (pipelined, in this order) and returns their outcomes in the same
    /// order; one failing does not stop the others.
    package func send(_ requests: [ClientMessage]) async throws(StoreBrokerError) -> [Result<ServerMessage, StoreBrokerError>] {
        // One hand-off for the whole batch: the answers are gathered on the loop and the caller resumes once (a
        // hop back per answer made a window of 500 writes 500 round trips between the caller's thread and the
        // loop). The caller writes the requests itself, as it does a single one: encoded in its own thread's
        // heap (encoded on the loop, an import's 4 MiB windows kept a second malloc arena of their own).
        let loop = socket.loop
        let gathered: EventLoopFuture<[Result<ServerMessage, any Error>]>
        if loop.inEventLoop {
            gathered = EventLoopFuture.whenAllComplete(handler.value.send(requests), on: loop)
        } else if writesDirectly {
            let promises = requests.map { _ in loop.makePromise(of: ServerMessage.self) }
            let written = line.send(zip(requests, promises.map { RequestLine.Pending.request($0) }).map { ($0, $1) })
            for (promise, result) in zip(promises, written) {
                if case .failure(let error) = result { promise.fail(error) }
            }
            gathered = EventLoopFuture.whenAllComplete(promises.map(\.futureResult), on: loop)
        } else {
            gathered = loop.flatSubmit { [handler] in EventLoopFuture.whenAllComplete(handler.value.send(requests), on: loop) }
        }
        let outcomes: [Result<ServerMessage, any Error>]
        do {
            outcomes = try await gathered.get()
        } catch {
            throw StoreBrokerError(.connectionClosed, "\(error)", underlying: error)
        }
        return outcomes.map { outcome in
            outcome.mapError { $0 as? StoreBrokerError ?? StoreBrokerError(.connectionClosed, "\($0)", underlying: $0) }
        }
    }

    /// Subscribes; the pushes arrive on the returned subscription's `pushes`, in order.
    public func subscribe(
        _ namespace: Namespace = .store, name: String, from start: SubscriptionStart = .snapshot
    ) async throws(StoreBrokerError) -> BrokerSubscription {
        let request = ClientMessage.subscribe(.init(namespace: namespace, name: name, start: start))
        do {
            return try await socket.loop.flatSubmit { [handler] in handler.value.subscribe(request) }.get()
        } catch {
            throw error as? StoreBrokerError ?? StoreBrokerError(.connectionClosed, "\(error)", underlying: error)
        }
    }

    /// Follows a store or value on this connection for as long as the stream is read: every push in order
    /// (`lagged` included, as a notice), and after `lagged` a new subscription resumes from the point it names,
    /// so the caller sees one gap-free stream (as long as the broker's history reaches back to that point; else
    /// `historyGone` and a fresh snapshot). It throws when the connection closes; it never reconnects
    /// (`BrokerClient`'s followers do). A reader more than `pushBuffer` pushes behind lags here: what it has not
    /// taken is replaced by `lagged` at the last push it took, and the follow resubscribes from there at once.
    public func follow(
        _ namespace: Namespace = .store, name: String, from start: SubscriptionStart = .snapshot
    ) -> BoundedStream<Push, StoreBrokerError> {
        let handler = handler
        let loop = socket.loop
        let follow = Locked<FollowSubscription?>(nil)
        let (stream, feed) = BoundedStream<Push, StoreBrokerError>.make(capacity: pushBuffer) {
            guard let started = follow.withLock({ $0 }) else { return }
            loop.execute { handler.value.stop(started) }
        }
        let started = FollowSubscription(namespace: namespace, name: name, start: start, feed: feed)
        follow.withLock { $0 = started }
        loop.execute { handler.value.start(started) }
        return stream
    }

    /// Ends a subscription; its stream finishes.
    public func unsubscribe(_ subscription: BrokerSubscription) async throws(StoreBrokerError) {
        try await unsubscribe(id: subscription.id)
    }

    /// Subscribes with a receiver that the connection calls on its event loop for each push as it is read: no
    /// buffer and no hop between reading a push and applying it (the mirrors' way). Returns the subscription's
    /// id; the receiver's `ended` is called once, after `lagged` or when the connection fails.
    package func subscribe(
        _ namespace: Namespace, name: String, from start: SubscriptionStart, receiver: any PushReceiver
    ) async throws(StoreBrokerError) -> UInt32 {
        let request = ClientMessage.subscribe(.init(namespace: namespace, name: name, start: start))
        do {
            return try await socket.loop.flatSubmit { [handler] in handler.value.subscribe(request, receiver: receiver) }.get()
        } catch {
            throw error as? StoreBrokerError ?? StoreBrokerError(.connectionClosed, "\(error)", underlying: error)
        }
    }

    /// Ends a subscription by its id; its stream finishes (or its receiver is told).
    package func unsubscribe(id: UInt32) async throws(StoreBrokerError) {
        _ = try await send(.unsubscribe(.init(subscriptionID: id)))
        socket.loop.execute { [handler] in handler.value.finishStream(id, error: nil) }
    }

    /// Whether the connection is still up (the broker has not closed it, nor has `close()` been called).
    public var isOpen: Bool { socket.isActive }

    /// Closes the connection; requests in flight fail with `connectionClosed`.
    public func close() async {
        let socket = socket
        await withCheckedContinuation { (closed: CheckedContinuation<Void, Never>) in
            socket.loop.execute {
                socket.close(failure: nil)
                closed.resume()
            }
        }
    }
}

/// A `follow(...)`: its stream, and where it subscribes (again) from. Touched only on the connection's event loop.
final class FollowSubscription: @unchecked Sendable {
    let namespace: Namespace
    let name: String
    let start: SubscriptionStart
    let feed: BoundedStream<Push, StoreBrokerError>.Feed
    /// The subscription serving it now, once the broker has answered.
    var id: UInt32?
    /// Its reader is gone: nothing more is subscribed.
    var stopped = false

    init(namespace: Namespace, name: String, start: SubscriptionStart, feed: BoundedStream<Push, StoreBrokerError>.Feed) {
        self.namespace = namespace
        self.name = name
        self.start = start
        self.feed = feed
    }
}

/// Takes a subscription's pushes on the connection's event loop, in order, as they are read. It must be quick
/// (it holds up the connection's reading: a slow receiver makes the broker lag the subscription, which bounds
/// memory on both sides).
package protocol PushReceiver: AnyObject, Sendable {
    /// The broker answered the subscribe with this id; the subscription's pushes follow.
    func started(id: UInt32)
    func receive(_ push: Push)
    /// Once: `nil` after `lagged` (the subscription is over), or the connection's failure.
    func ended(_ error: StoreBrokerError?)
}

/// A subscription's pushes (`storeLoaded`, `storeEvent`, `lagged`, `historyGone`, `dropped`), in order. The
/// stream ends after `lagged` (the subscription is over) and throws when the connection closes.
public struct BrokerSubscription: Sendable {
    public let id: UInt32
    public let pushes: BoundedStream<Push, StoreBrokerError>
}

/// The connection's protocol state, on the client's loop (`ClientLoop`), which hands it what its socket reads.
final class ClientHandler {
    private var session: ClientSession
    /// The socket, while it is open.
    private var socket: ClientSocket?
    /// Fulfilled by the broker's welcome; failed by anything that ends the connection before it.
    private var established: EventLoopPromise<BrokerConnection.Established>?
    /// Ids, what waits for each answer, and the way requests reach the socket (shared with the callers).
    let line: RequestLine
    /// Answers read in this read cycle, resumed at its end (`readComplete`).
    private var answered: [(BrokerConnection.Answer, Result<ServerMessage, StoreBrokerError>)] = []
    /// The list `resumeAnswered` last emptied, kept for the next read (no allocation per read).
    private var spareAnswered: [(BrokerConnection.Answer, Result<ServerMessage, StoreBrokerError>)] = []
    private var streams: [UInt32: Sink] = [:]
    private let pushBuffer: Int
    private let requestTimeout: TimeAmount?
    private let handshakeTimeout: TimeAmount?
    /// With a timeout: the unanswered requests, oldest first (answers come in request order), and the one timer
    /// that watches the oldest.
    private var unanswered = CircularBuffer<(id: UInt32, sent: NIODeadline, name: String)>()
    private var timer: Scheduled<Void>?

    private typealias Pending = RequestLine.Pending

    /// Where a subscription's pushes go: a bounded stream, or a receiver called at once.
    private enum Sink {
        case stream(BoundedStream<Push, StoreBrokerError>.Feed)
        case direct(any PushReceiver)
        case follow(FollowSubscription)

        func finish(_ error: StoreBrokerError?) {
            switch self {
            case .stream(let feed): feed.finish(throwing: error)
            case .direct(let receiver): receiver.ended(error)
            case .follow(let follow): follow.feed.finish(throwing: error)
            }
        }
    }

    init(
        clientName: String, requestTimeout: TimeAmount?, handshakeTimeout: TimeAmount?, pushBuffer: Int,
        established: EventLoopPromise<BrokerConnection.Established>, line: RequestLine
    ) {
        self.line = line
        self.pushBuffer = pushBuffer
        session = ClientSession(clientName: clientName)
        self.requestTimeout = requestTimeout
        self.handshakeTimeout = handshakeTimeout
        self.established = established
    }

    /// The loop serves the socket: says hello at once and, with a timeout, gives the broker that long to
    /// welcome us.
    func activate(_ socket: ClientSocket) {
        self.socket = socket
        let loop = NIOLoopBound(self, eventLoop: socket.loop)
        line.attach { bytes in loop.eventLoop.execute { loop.value.writeHandedOver(bytes) } }
        do {
            socket.write(try session.hello())
        } catch {
            fail(StoreBrokerError(.protocolViolation, error.message))
            socket.close(failure: nil)
            return
        }
        if let handshakeTimeout {
            _ = socket.loop.scheduleTask(in: handshakeTimeout) {
                guard loop.value.established != nil else { return }
                loop.value.timedOut("the broker did not answer the handshake within \(Self.describe(handshakeTimeout))")
            }
        }
    }

    /// Bytes the line could not write to the socket at once: the socket writes them, in order.
    private func writeHandedOver(_ bytes: ByteBuffer) {
        guard let socket else { return line.loopWrote() }
        let line = line
        socket.write(bytes) { line.loopWrote() }
    }

    static func describe(_ time: TimeAmount) -> String {
        let milliseconds = time.nanoseconds / 1_000_000
        return milliseconds % 1000 == 0 ? "\(milliseconds / 1000) s" : "\(milliseconds) ms"
    }

    /// No answer in time: everything pending fails with `timedOut` and the connection closes.
    private func timedOut(_ message: String) {
        fail(StoreBrokerError(.timedOut, message))
        socket?.close(failure: nil)
    }

    /// The socket has closed: every call fails at once.
    private static func closed<T>() -> EventLoopFuture<T> {
        ClientLoop.shared.makeFailedFuture(StoreBrokerError(.connectionClosed, "the connection to the broker closed"))
    }

    /// Fails everything with `timedOut` once the oldest unanswered request is older than the timeout.
    private func watchOldest() {
        guard timer == nil, let requestTimeout, let socket else { return }
        while let oldest = unanswered.first, !line.isPending(oldest.id) { unanswered.removeFirst() }
        guard let oldest = unanswered.first else { return }
        let deadline = oldest.sent + requestTimeout
        guard deadline > socket.loop.now else {
            return timedOut("the broker did not answer \(oldest.name) within \(Self.describe(requestTimeout))")
        }
        let loop = NIOLoopBound(self, eventLoop: socket.loop)
        timer = socket.loop.scheduleTask(deadline: deadline) {
            loop.value.timer = nil
            loop.value.watchOldest()
        }
    }

    func send(_ request: ClientMessage, _ continuation: BrokerConnection.Answer) {
        write(request, .answer(continuation)) { continuation.resume(returning: .failure($0)) }
    }

    func send(_ request: ClientMessage, _ continuation: BrokerConnection.Answer, seen: @escaping BrokerConnection.AnswerSeen) {
        write(request, .answerSeen(continuation, seen)) { error in
            seen(.failure(error))
            continuation.resume(returning: .failure(error))
        }
    }

    func send(_ request: ClientMessage) -> EventLoopFuture<ServerMessage> {
        guard let socket else { return Self.closed() }
        let promise = socket.loop.makePromise(of: ServerMessage.self)
        write(request, .request(promise)) { promise.fail($0) }
        return promise.futureResult
    }

    /// Several requests in one write (pipelined, in this order).
    func send(_ requests: [ClientMessage]) -> [EventLoopFuture<ServerMessage>] {
        guard let socket else { return requests.map { _ in Self.closed() } }
        let promises = requests.map { _ in socket.loop.makePromise(of: ServerMessage.self) }
        let results = line.send(zip(requests, promises.map { Pending.request($0) }).map { ($0, $1) })
        for (index, result) in results.enumerated() {
            switch result {
            case .failure(let error): promises[index].fail(error)
            case .success(let id):
                if requestTimeout != nil { unanswered.append((id, socket.loop.now, requests[index].type.name)) }
            }
        }
        if requestTimeout != nil { watchOldest() }
        return promises.map { $0.futureResult }
    }

    func subscribe(_ request: ClientMessage) -> EventLoopFuture<BrokerSubscription> {
        guard let socket else { return Self.closed() }
        let promise = socket.loop.makePromise(of: BrokerSubscription.self)
        write(request, .subscribe(promise)) { promise.fail($0) }
        return promise.futureResult
    }

    func subscribe(_ request: ClientMessage, receiver: any PushReceiver) -> EventLoopFuture<UInt32> {
        guard let socket else { return Self.closed() }
        let promise = socket.loop.makePromise(of: UInt32.self)
        write(request, .subscribeDirect(promise, receiver)) { promise.fail($0) }
        return promise.futureResult
    }

    private func write(_ request: ClientMessage, _ entry: Pending, fail: (StoreBrokerError) -> Void) {
        guard let socket else { return fail(StoreBrokerError(.connectionClosed, "the connection to the broker closed")) }
        switch line.send(request, entry) {
        case .failure(let error): return fail(error)
        case .success(let id):
            if requestTimeout != nil {
                unanswered.append((id, socket.loop.now, request.type.name))
                watchOldest()
            }
        }
    }

    /// Takes the whole frames at the front of `buffer` (the socket keeps a partial frame until its rest arrives).
    func read(_ buffer: inout ByteBuffer) {
        while let event = session.next(from: &buffer) {
            switch event {
            case .established(let welcome):
                line.established(maxFrameLength: Int(welcome.maxFrameLength))
                established?.succeed((welcome, NIOLoopBound(self, eventLoop: ClientLoop.shared)))
                established = nil
            case .failed(let error):
                fail(StoreBrokerError(established == nil ? .protocolViolation : .refused, code: error.code, error.message))
                socket?.close(failure: nil)
                return
            case .message(let id, let message):
                receive(id: id, message)
            }
        }
    }

    /// The answers of this read cycle go to their callers once every push in it has been handed on: a write's
    /// caller then finds a mirror that already holds the commit its answer acknowledges.
    /// A caller on this loop's `client.executor` goes on right after (`ReadyJobs`).
    func readComplete() {
        ReadyJobs.run(after: resumeAnswered)
    }

    private func resumeAnswered() {
        guard !answered.isEmpty else { return }
        // Swapped out, not copied: emptying a copy's shared storage allocated a new list for every read.
        var ready = spareAnswered
        spareAnswered = []
        swap(&ready, &answered)
        for (continuation, result) in ready { continuation.resume(returning: result) }
        ready.removeAll(keepingCapacity: true)
        spareAnswered = ready
    }

    private func receive(id: UInt32, _ message: ServerMessage) {
        if message.type.isPush {
            if case .goodbye(let goodbye) = message {
                fail(StoreBrokerError(.connectionClosed, code: goodbye.code, "the broker said goodbye: \(goodbye.message)"))
                return
            }
            guard let push = Push(message), let sink = streams[id] else { return }
            switch sink {
            case .direct(let receiver):
                receiver.receive(push)
                if case .lagged = push { finishStream(id, error: nil) }
            case .stream(let feed):
                if case .lagged = push {
                    feed.yieldPastCapacity(push)  // the broker's word always arrives
                    finishStream(id, error: nil)
                } else if !feed.yield(push) {
                    lag(id, feed)
                    feed.finish()
                }
            case .follow(let follow):
                if case .lagged(let at) = push {
                    follow.feed.yieldPastCapacity(push)
                    streams[id] = nil
                    subscribe(follow, from: .resume(epoch: at.epoch, sequence: at.sequence))
                } else if !follow.feed.yield(push) {
                    // The follow goes on from the last push its reader took (from its start if none).
                    let taken = lag(id, follow.feed)
                    subscribe(follow, from: taken.map { .resume(epoch: $0.epoch, sequence: $0.sequence) } ?? follow.start)
                }
            }
            return
        }
        guard let entry = line.answered(id) else { return }
        while let oldest = unanswered.first, !line.isPending(oldest.id) { unanswered.removeFirst() }
        switch (entry, message) {
        case (.answer(let continuation), .error(let error)):
            answered.append((continuation, .failure(StoreBrokerError(.refused, code: error.code, error.message))))
        case (.answer(let continuation), _):
            answered.append((continuation, .success(message)))
        case (.answerSeen(let continuation, let seen), .error(let error)):
            let failure = StoreBrokerError(.refused, code: error.code, error.message)
            seen(.failure(failure))
            answered.append((continuation, .failure(failure)))
        case (.answerSeen(let continuation, let seen), _):
            seen(.success(message))
            answered.append((continuation, .success(message)))
        case (.request(let promise), .error(let error)):
            promise.fail(StoreBrokerError(.refused, code: error.code, error.message))
        case (.subscribe(let promise), .error(let error)):
            promise.fail(StoreBrokerError(.refused, code: error.code, error.message))
        case (.subscribeDirect(let promise, _), .error(let error)):
            promise.fail(StoreBrokerError(.refused, code: error.code, error.message))
        case (.subscribeDirect(let promise, let receiver), .subscribed(let subscribed)):
            streams[subscribed.subscriptionID] = .direct(receiver)
            receiver.started(id: subscribed.subscriptionID)
            promise.succeed(subscribed.subscriptionID)
        case (.subscribeDirect(let promise, _), _):
            promise.fail(StoreBrokerError(.protocolViolation, "subscribe was answered with \(message.type.name)"))
        case (.subscribeFollow(let follow), .subscribed(let subscribed)):
            if follow.stopped {
                _ = send(.unsubscribe(.init(subscriptionID: subscribed.subscriptionID)))
            } else {
                follow.id = subscribed.subscriptionID
                streams[subscribed.subscriptionID] = .follow(follow)
            }
        case (.subscribeFollow(let follow), .error(let error)):
            follow.feed.finish(throwing: StoreBrokerError(.refused, code: error.code, error.message))
        case (.subscribeFollow(let follow), _):
            follow.feed.finish(throwing: StoreBrokerError(.protocolViolation, "subscribe was answered with \(message.type.name)"))
        case (.request(let promise), _):
            promise.succeed(message)
        case (.subscribe(let promise), .subscribed(let subscribed)):
            let (stream, feed) = BoundedStream<Push, StoreBrokerError>.make(capacity: pushBuffer)
            streams[subscribed.subscriptionID] = .stream(feed)
            promise.succeed(BrokerSubscription(id: subscribed.subscriptionID, pushes: stream))
        case (.subscribe(let promise), _):
            promise.fail(StoreBrokerError(.protocolViolation, "subscribe was answered with \(message.type.name)"))
        }
    }

    /// A reader `pushBuffer` pushes behind lags here, as the broker's own slow subscribers do: what it has not
    /// taken is replaced by `lagged` at the last push it took, and the broker stops sending for this subscription.
    /// Returns that push's position (`nil`: it took none).
    @discardableResult
    private func lag(_ id: UInt32, _ feed: BoundedStream<Push, StoreBrokerError>.Feed) -> Position? {
        // One step: read apart, the reader could take one more push in between, be told it lagged before it and
        // (a follow) get it again from the resubscription.
        let taken = feed.replaceUnread { last in [.lagged(last?.resumePosition ?? Position(epoch: 0, sequence: 0))] }?
            .resumePosition
        streams[id] = nil
        _ = send(.unsubscribe(.init(subscriptionID: id)))  // nobody waits for the answer
        return taken
    }

    func finishStream(_ id: UInt32, error: StoreBrokerError?) {
        streams.removeValue(forKey: id)?.finish(error)
    }

    /// A `follow(...)` begins: its first subscription.
    func start(_ follow: FollowSubscription) { subscribe(follow, from: follow.start) }

    /// Its reader is gone: the subscription serving it ends.
    func stop(_ follow: FollowSubscription) {
        follow.stopped = true
        guard let id = follow.id, case .follow(let current)? = streams[id], current === follow else { return }
        streams[id] = nil
        _ = send(.unsubscribe(.init(subscriptionID: id)))
    }

    private func subscribe(_ follow: FollowSubscription, from start: SubscriptionStart) {
        guard !follow.stopped else { return }
        follow.id = nil
        let request = ClientMessage.subscribe(.init(namespace: follow.namespace, name: follow.name, start: start))
        write(request, .subscribeFollow(follow)) { follow.feed.finish(throwing: $0) }
    }

    private func fail(_ error: StoreBrokerError) {
        resumeAnswered()
        timer?.cancel()
        timer = nil
        unanswered.removeAll()
        established?.fail(error)
        established = nil
        for entry in line.fail(error) {
            switch entry {
            case .answer(let continuation): continuation.resume(returning: .failure(error))
            case .answerSeen(let continuation, let seen):
                seen(.failure(error))
                continuation.resume(returning: .failure(error))
            case .request(let promise): promise.fail(error)
            case .subscribe(let promise): promise.fail(error)
            case .subscribeDirect(let promise, _): promise.fail(error)
            case .subscribeFollow(let follow): follow.feed.finish(throwing: error)
            }
        }
        let all = streams
        streams = [:]
        for sink in all.values { sink.finish(error) }
    }

    /// The socket closed: by either side (`failure` nil), or on an error.
    func closed(failure: CInt?) {
        socket = nil
        line.close()
        let message =
            if let failure, failure == ECONNRESET || failure == EPIPE {
                // A broker that closes while our bytes are unread resets the connection: it is still a close.
                "the broker closed the connection (reset)"
            } else if let failure {
                "connection error: \(String(cString: strerror(failure)))"
            } else if established != nil {
                "the broker closed the connection before the handshake"
            } else {
                "the connection to the broker closed"
            }
        fail(StoreBrokerError(.connectionClosed, message))
    }
}
