#if canImport(Glibc)
import Glibc
#endif
import DequeModule

/// The threads that stores' and value namespaces' writers run on: at most `limit` of them, started when work
/// first needs one, each sleeping on one condition variable when there is nothing to do.
///
/// A job is a writer's turn: it loads its place, or commits what its queue holds, calling its engine
/// synchronously (engines block; these threads are made for that, unlike an event loop or the cooperative
/// pool). A place submits at most one job at a time, and that job runs until its queue is empty (or it yields to
/// others after a number of commit groups), so a store is pinned to one thread while it has work and holds none
/// when idle. A job hands in everything queued since the last one: the hand-off carries a batch.
final class WriterPool: @unchecked Sendable {
    typealias Job = @Sendable () -> Void

    /// Commit groups a writer job makes before it lets other places' jobs have its thread.
    static let groupsPerTurn = 16

    let limit: Int
    // `@unchecked Sendable`: everything below is touched only with `mutex` held.
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private let workAvailable: UnsafeMutablePointer<pthread_cond_t>
    private var jobs = Deque<Job>()
    private var threads = 0
    private var idle = 0
    private var stopping = false

    init(limit: Int) {
        self.limit = max(1, limit)
        mutex = .allocate(capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        pthread_mutex_init(mutex, nil)
        workAvailable = .allocate(capacity: 1)
        workAvailable.initialize(to: pthread_cond_t())
        pthread_cond_init(workAvailable, nil)
    }

    deinit {
        pthread_cond_destroy(workAvailable)
        workAvailable.deallocate()
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Runs `job` on one of the threads: an idle one is woken, or a new one started while under the limit;
    /// otherwise it waits its turn. After `stop()` jobs still run (a shutdown finishing its writers).
    func run(_ job: @escaping Job) {
        pthread_mutex_lock(mutex)
        jobs.append(job)
        var wake = false
        var start = false
        if idle > 0 {
            wake = true
        } else if threads < limit {
            threads += 1
            start = true
        }
        pthread_mutex_unlock(mutex)
        // Signalled after unlocking: a thread woken while the mutex is still held wakes only to sleep again on
        // the mutex, a second futex round trip before the job starts (240 of them per 1,000 sqlite FULL inserts).
        if wake { pthread_cond_signal(workAvailable) }
        if start { startThread() }
    }

    /// Lets the threads end once no job is left. Jobs submitted later start a thread again.
    func stop() {
        pthread_mutex_lock(mutex)
        stopping = true
        pthread_cond_broadcast(workAvailable)
        pthread_mutex_unlock(mutex)
    }

    private func startThread() {
        let context = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        let status = pthread_create(&thread, nil, { context in
            let pool = Unmanaged<WriterPool>.fromOpaque(context!).takeRetainedValue()
            pool.serve()
            return nil
        }, context)
        precondition(status == 0, "cannot start a writer thread: \(String(cString: strerror(status)))")
        pthread_detach(thread)
    }

    /// Names the calling thread, or it keeps the name of the event loop that started it and profiles cannot tell
    /// them apart. (`pthread_setname_np` is not visible to Swift through Glibc; `/proc/thread-self/comm` is the
    /// same name.) Best effort: nothing depends on it.
    private static func nameThisThread(_ name: String) {
        let descriptor = open("/proc/thread-self/comm", O_WRONLY)
        guard descriptor >= 0 else { return }
        _ = name.utf8CString.withUnsafeBufferPointer { write(descriptor, $0.baseAddress, $0.count - 1) }
        close(descriptor)
    }

    private func serve() {
        Self.nameThisThread("sb-writer")
        pthread_mutex_lock(mutex)
        while true {
            while jobs.isEmpty, !stopping {
                idle += 1
                pthread_cond_wait(workAvailable, mutex)
                idle -= 1
            }
            guard let job = jobs.popFirst() else {
                threads -= 1  // stopping, and nothing left
                pthread_mutex_unlock(mutex)
                return
            }
            pthread_mutex_unlock(mutex)
            job()
            pthread_mutex_lock(mutex)
        }
    }
}
