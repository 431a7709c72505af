#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Locking
import NIOCore
import Synchronization

/// The thread that serves the client library's connections: it reads every connection's socket (`poll(2)`),
/// hands out what it read, writes what a full socket could not take, runs the timers of handshakes and
/// requests, and runs the jobs of tasks that prefer `BrokerClient.executor`. One per process.
///
/// It is an `EventLoop` (NIO's futures, promises and `NIOLoopBound` work with it), but not NIO's own: a read
/// here is a `read(2)` into the connection's buffer and the decoding of what it holds, without a channel
/// pipeline around it (NIO's channel machinery was a fifth of the client's time per request). Requests are
/// written by their callers (`RequestLine`), not by this thread.
final class ClientLoop: EventLoop, @unchecked Sendable {  // the queue under its lock; `sockets` on the thread only
    static let shared = ClientLoop(name: "storebroker-client")

    /// A timer: `run` once `deadline` has passed, unless cancelled first.
    private struct Timer {
        let id: UInt64
        let deadline: NIODeadline
        let run: @Sendable () -> Void
    }

    /// What other threads hand the loop: tasks to run, timers, and whether the loop was woken for them.
    private struct Queue {
        var tasks: [@Sendable () -> Void] = []
        /// Sorted by deadline (few: a handshake's, and one per connection with a request timeout).
        var timers: [Timer] = []
        var nextTimer: UInt64 = 0
        var woken = false
    }

    private let queue = Locked(Queue())
    /// The pipe that wakes the loop from `poll` (its read end is polled with the sockets).
    private let wakeRead: CInt
    private let wakeWrite: CInt
    /// Read only on the loop's thread: `pthread_self()` of the loop (set before it runs anything).
    private var loopThread = pthread_t()
    /// The sockets read here (on the loop's thread only).
    private var sockets: [ClientSocket] = []

    private init(name: String) {
        var ends: [CInt] = [-1, -1]
        guard pipe(&ends) == 0 else {
            fatalError("storebroker client: cannot make the loop's wake-up pipe: \(String(cString: strerror(errno)))")
        }
        for end in ends {
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
            _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
        }
        (wakeRead, wakeWrite) = (ends[0], ends[1])
        let started = DispatchSemaphore(value: 0)
        let thread = Thread { [self] in
            loopThread = pthread_self()
            started.signal()
            run()
        }
        thread.name = name
        thread.start()
        started.wait()
    }

    // MARK: EventLoop

    var inEventLoop: Bool { pthread_equal(pthread_self(), loopThread) != 0 }

    func execute(_ task: @escaping @Sendable () -> Void) {
        let wake = queue.withLock { queue -> Bool in
            queue.tasks.append(task)
            defer { queue.woken = true }
            return !queue.woken
        }
        if wake, !inEventLoop { self.wake() }
    }

    func scheduleTask<T>(deadline: NIODeadline, _ task: @escaping @Sendable () throws -> T) -> Scheduled<T> {
        let promise = makePromise(of: T.self)
        let id = queue.withLock { queue -> UInt64 in
            queue.nextTimer += 1
            let timer = Timer(id: queue.nextTimer, deadline: deadline) {
                do { promise.assumeIsolated().succeed(try task()) } catch { promise.fail(error) }
            }
            let index = queue.timers.firstIndex { $0.deadline > deadline } ?? queue.timers.endIndex
            queue.timers.insert(timer, at: index)
            return queue.nextTimer
        }
        if !inEventLoop { wake() }
        return Scheduled(promise: promise) { [self] in
            let removed = queue.withLock { queue -> Bool in
                guard let index = queue.timers.firstIndex(where: { $0.id == id }) else { return false }
                queue.timers.remove(at: index)
                return true
            }
            if removed { promise.fail(EventLoopError.cancelled) }
        }
    }

    func scheduleTask<T>(in delay: TimeAmount, _ task: @escaping @Sendable () throws -> T) -> Scheduled<T> {
        scheduleTask(deadline: .now() + delay, task)
    }

    func next() -> any EventLoop { self }
    func any() -> any EventLoop { self }
    func makeIterator() -> EventLoopIterator { EventLoopIterator([self]) }

    /// The process's loop is never shut down.
    func shutdownGracefully(queue: DispatchQueue, _ callback: @escaping @Sendable ((any Error)?) -> Void) {
        queue.async { callback(EventLoopError.unsupportedOperation) }
    }

    // MARK: Sockets

    /// Starts reading `socket` (on the loop).
    func register(_ socket: ClientSocket) {
        preconditionInEventLoop()
        sockets.append(socket)
    }

    /// Stops reading `socket` (on the loop).
    func deregister(_ socket: ClientSocket) {
        preconditionInEventLoop()
        sockets.removeAll { $0 === socket }
    }

    // MARK: The loop

    private func wake() {
        var byte: UInt8 = 1
        _ = Glibc.write(wakeWrite, &byte, 1)  // a full pipe has woken the loop already
    }

    private func run() {
        var polled: [pollfd] = []
        var polledSockets: [ClientSocket] = []
        var drained = [UInt8](repeating: 0, count: 64)
        while true {
            polled.removeAll(keepingCapacity: true)
            polledSockets.removeAll(keepingCapacity: true)
            polled.append(pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0))
            for socket in sockets {
                polled.append(pollfd(fd: socket.descriptor, events: socket.interest, revents: 0))
                polledSockets.append(socket)
            }
            if poll(&polled, nfds_t(polled.count), timeout()) > 0 {
                if polled[0].revents != 0 { while Glibc.read(wakeRead, &drained, drained.count) > 0 {} }
                // A socket closed while another is served is skipped by its own `serve`.
                for (index, socket) in polledSockets.enumerated() where polled[index + 1].revents != 0 {
                    socket.serve(polled[index + 1].revents)
                }
            }
            polledSockets.removeAll(keepingCapacity: true)
            runTimersAndTasks()
        }
    }

    /// How long `poll` may wait: not at all with tasks waiting, until the next timer, or for ever.
    private func timeout() -> CInt {
        queue.withLock { queue -> CInt in
            if !queue.tasks.isEmpty { return 0 }
            guard let next = queue.timers.first else {
                queue.woken = false
                return -1
            }
            queue.woken = false
            let left = next.deadline.uptimeNanoseconds.subtractingReportingOverflow(NIODeadline.now().uptimeNanoseconds)
            if left.overflow || left.partialValue == 0 { return 0 }
            // Rounded up: a timer never runs early, and the loop does not spin the last millisecond.
            return CInt(clamping: (left.partialValue + 999_999) / 1_000_000)
        }
    }

    /// Runs the timers that are due, then the tasks queued (taken in one turn of the lock; the clock is read
    /// only when there are timers).
    private func runTimersAndTasks() {
        let (due, tasks) = queue.withLock { queue -> ([Timer], [@Sendable () -> Void]) in
            var due: [Timer] = []
            if let first = queue.timers.first, first.deadline <= .now() {
                let now = NIODeadline.now()
                let end = queue.timers.firstIndex { $0.deadline > now } ?? queue.timers.endIndex
                due = Array(queue.timers[..<end])
                queue.timers.removeSubrange(..<end)
            }
            guard !queue.tasks.isEmpty else { return (due, []) }
            defer { queue.tasks = [] }
            return (due, queue.tasks)
        }
        for timer in due { timer.run() }
        for task in tasks { task() }
    }
}

/// One connection's socket as the loop serves it: what arrives is read into one buffer and handed to the
/// connection's handler in place (only a frame cut by a read waits there for its rest); bytes the socket
/// could not take when a request was written go out as it drains, in order. Touched only on the loop, but
/// `isActive`, which any thread may read.
final class ClientSocket: @unchecked Sendable {
    let descriptor: CInt
    let loop: ClientLoop
    /// Until the socket closes (then nil: the handler and the socket hold each other until then).
    private var handler: ClientHandler?
    private var input = ByteBuffer()
    /// Handed-over writes not yet written, each with what to call once it is written (or dropped by a close).
    private var output = CircularBuffer<(bytes: ByteBuffer, written: (() -> Void)?)>()
    private var closed = false
    private let active = Atomic<Bool>(true)
    /// The read buffer a socket keeps between reads: bigger ones (a large answer's) are let go once read.
    static let keptInputCapacity = 256 * 1024
    /// The most reads of one socket per turn of the loop.
    static let readsPerTurn = 16

    init(descriptor: CInt, loop: ClientLoop, handler: ClientHandler) {
        self.descriptor = descriptor
        self.loop = loop
        self.handler = handler
    }

    /// The loop starts reading it, and its handler says hello (on the loop).
    func start() {
        loop.register(self)
        handler?.activate(self)
    }

    /// Open: not closed by either side yet (any thread).
    var isActive: Bool { active.load(ordering: .relaxed) }

    /// What `poll` watches for: always input, and room to write while writes wait.
    var interest: Int16 { output.isEmpty ? Int16(POLLIN) : Int16(POLLIN) | Int16(POLLOUT) }

    /// The socket is ready (`poll`'s `revents`).
    func serve(_ revents: Int16) {
        guard !closed else { return }
        if revents & Int16(POLLNVAL) != 0 { return close(failure: EBADF) }  // never polled again
        if revents & Int16(POLLOUT) != 0 { flush() }
        if !closed, revents & (Int16(POLLIN) | Int16(POLLHUP) | Int16(POLLERR)) != 0 { readAvailable() }
    }

    /// Reads until the socket has nothing more (or `readsPerTurn` reads: a socket that never drains does not keep
    /// the loop from the others), handing the handler each read's whole frames; then tells it the read is
    /// complete (it resumes the callers answered).
    private func readAvailable() {
        var delivered = false
        defer { if delivered { handler?.readComplete() } }
        var reads = 0
        while !closed, reads < Self.readsPerTurn {
            reads += 1
            if input.readableBytes == 0 {
                if input.capacity > Self.keptInputCapacity { input = ByteBuffer() } else { input.clear() }
            }
            input.reserveCapacity(minimumWritableBytes: 16 * 1024)
            let room = input.writableBytes
            var failure: CInt = 0
            let count = input.withUnsafeMutableWritableBytes { bytes in
                let count = Glibc.read(descriptor, bytes.baseAddress, bytes.count)
                if count < 0 { failure = errno }
                return count
            }
            if count > 0 {
                input.moveWriterIndex(forwardBy: count)
                delivered = true
                handler?.read(&input)
                if input.readerIndex > input.capacity / 2 { input.discardReadBytes() }
                if count < room { return }  // the socket is drained (a stream socket fills what it can)
            } else if count == 0 {
                if delivered { handler?.readComplete() }
                delivered = false
                return close(failure: nil)
            } else if failure == EINTR {
                continue
            } else if failure == EAGAIN || failure == EWOULDBLOCK {
                return
            } else {
                if delivered { handler?.readComplete() }
                delivered = false
                return close(failure: failure)
            }
        }
    }

    /// Writes `bytes` after those waiting (at once when none wait); `written` is called once they are written,
    /// or dropped because the socket closed.
    func write(_ bytes: ByteBuffer, written: (() -> Void)? = nil) {
        guard !closed else {
            written?()
            return
        }
        output.append((bytes, written))
        if output.count == 1 { flush() }
    }

    /// Writes what waits, as far as the socket takes it.
    private func flush() {
        while var first = output.first {
            var failure: CInt = 0
            let count = first.bytes.withUnsafeReadableBytes { bytes in
                let count = Glibc.send(descriptor, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT))
                if count < 0 { failure = errno }
                return count
            }
            if count < 0 {
                if failure == EINTR { continue }
                if failure == EAGAIN || failure == EWOULDBLOCK { return }  // `poll` says when there is room
                return close(failure: failure)
            }
            first.bytes.moveReaderIndex(forwardBy: count)
            if first.bytes.readableBytes > 0 {
                output[output.startIndex] = first
                continue
            }
            output.removeFirst()
            first.written?()
        }
    }

    /// Closes the socket (once): the loop stops reading it, waiting writes are dropped, and the handler is told
    /// (`failure`: the error that closed it, nil for a close by either side).
    func close(failure: CInt?) {
        guard !closed else { return }
        closed = true
        active.store(false, ordering: .relaxed)
        loop.deregister(self)
        Glibc.close(descriptor)
        let dropped = output
        output.removeAll()
        for write in dropped { write.written?() }
        let handler = self.handler
        self.handler = nil
        handler?.closed(failure: failure)
    }
}
