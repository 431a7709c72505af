import Foundation

/// Threads of their own for tests whose work blocks: an engine's fsync, a synchronous loop over thousands of
/// `dlopen`s. Run on the cooperative pool (two threads on a two-core machine), such work holds back every other
/// test's timers and wake-ups: a whole `swift test` once stalled 16 to 27 s at start-up, and a client test whose
/// connect timeout is 300 ms saw 31 s pass. `try await offThePool { ... }` runs the body's synchronous parts here.
public final class BlockingWorkExecutor: TaskExecutor, @unchecked Sendable {
    /// Shared by every test of the process; its threads live as long as it.
    public static let shared = BlockingWorkExecutor(threads: 2)

    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []
    private var next = 0

    public init(threads: Int) {
        for index in 0..<threads {
            let thread = Thread { self.serve() }
            thread.name = "blocking-work-\(index)"
            thread.start()
        }
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    private func serve() {
        while true {
            condition.lock()
            while next == jobs.count { condition.wait() }
            let job = jobs[next]
            next += 1
            if next == jobs.count {
                jobs.removeAll(keepingCapacity: true)
                next = 0
            }
            condition.unlock()
            job.runSynchronously(on: asUnownedTaskExecutor())
        }
    }
}

/// Runs `body`, and the tasks it starts, on `BlockingWorkExecutor.shared` rather than the cooperative pool.
public func offThePool<T: Sendable>(_ body: () async throws -> T) async rethrows -> T {
    try await withTaskExecutorPreference(BlockingWorkExecutor.shared, operation: body)
}
