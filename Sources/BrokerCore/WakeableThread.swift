import Glibc
import Locking

/// A thread of its own for work that blocks in a system call (libdbus, a shared engine's notices), and the one
/// way its owner wakes it (a pipe, so that the wait can include a descriptor of the work's): `wait` sleeps until `wake()`, until a descriptor of the work's is readable, or until a
/// timeout; `stop()` wakes it for good (`isStopping`); `join()` waits until the body has returned.
///
/// The daemon's owner loop never blocks; these threads wait on descriptors of foreign libraries (libdbus, a
/// shared engine's watch). (The threads that call engines are the `BlockingExecutor`'s.)
public final class WakeableThread: Sendable {
    /// A pipe: a byte written to `wakeWrite` ends the thread's `wait`.
    private let wakeRead: Int32
    private let wakeWrite: Int32
    private let state = Locked(State())
    /// The body has returned, or will never run.
    private let end = Occurrence<Void>()

    private struct State {
        var started = false
        var stopping = false
    }

    private let name: String

    /// The wake-up pipe; the thread starts with `start`.
    public init(name: String) throws(BrokerError) {
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0 else {
            throw BrokerError(.internalError, "cannot make \(name)'s wake-up pipe: \(String(cString: strerror(errno)))")
        }
        for end in ends {
            _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
        }
        wakeRead = ends[0]
        wakeWrite = ends[1]
        self.name = name
    }

    /// Starts the thread, running `body` with this handle (once).
    public func start(_ body: @escaping @Sendable (WakeableThread) -> Void) throws(BrokerError) {
        let first = state.withLock { state in
            defer { state.started = true }
            return !state.started
        }
        precondition(first, "\(name) started twice")
        let name = name
        let start = Start { [self] in
            // Named, or it keeps the name of the thread that started it and profiles cannot tell them apart
            // (`pthread_setname_np` is not visible through Glibc; `/proc/thread-self/comm` is the same name).
            let comm = open("/proc/thread-self/comm", O_WRONLY)
            if comm >= 0 {
                _ = String(name.prefix(15)).utf8CString.withUnsafeBufferPointer { write(comm, $0.baseAddress, $0.count - 1) }
                close(comm)
            }
            body(self)
            end.happen(())
        }
        var thread = pthread_t()
        let status = pthread_create(&thread, nil, { context in
            Unmanaged<Start>.fromOpaque(context!).takeRetainedValue().run()
            return nil
        }, Unmanaged.passRetained(start).toOpaque())
        guard status == 0 else {
            Unmanaged.passUnretained(start).release()
            end.happen(())
            throw BrokerError(.internalError, "cannot start \(name): \(String(cString: strerror(status)))")
        }
        pthread_detach(thread)
    }

    deinit {
        close(wakeRead)
        close(wakeWrite)
    }

    /// What the new thread runs (its name, the body, then its end is told), handed to it as one object.
    private final class Start: Sendable {
        let run: @Sendable () -> Void
        init(_ run: @escaping @Sendable () -> Void) { self.run = run }
    }

    /// Whether `stop()` was called: the body is to return.
    public var isStopping: Bool { state.withLock { $0.stopping } }

    /// Ends the current or next `wait` early.
    public func wake() {
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
    }

    /// Asks the body to return (`isStopping`) and wakes it.
    public func stop() {
        state.withLock { $0.stopping = true }
        wake()
    }

    /// Sleeps until `wake()`, `stop()`, `descriptor` (when not negative) becoming readable, or `milliseconds`
    /// passing (negative: no limit). True when `descriptor` is readable.
    @discardableResult
    public func wait(milliseconds: Int32, descriptor: Int32 = -1) -> Bool {
        var fds = [pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0), pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)]
        let ready = poll(&fds, descriptor >= 0 ? 2 : 1, milliseconds)
        if ready > 0, fds[0].revents != 0 {
            var drain = (UInt64(0), UInt64(0), UInt64(0), UInt64(0))
            while withUnsafeMutableBytes(of: &drain, { read(wakeRead, $0.baseAddress, $0.count) }) > 0 {}
        }
        return ready > 0 && descriptor >= 0 && fds[1].revents != 0
    }

    /// Returns once the body has returned (at once if the thread never started).
    public func join() async {
        guard state.withLock({ $0.started }) else { return }
        await end.wait()
    }
}
