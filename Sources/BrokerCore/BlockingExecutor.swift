/// Threads made for work that blocks: the broker's engine calls (loads, commit groups, drops, a shared database's
/// catch-up), which must never run on the owner loop or the cooperative pool. The server hands the broker one
/// (NIO's `NIOThreadPool`); the broker hands it one job per piece of work, whose result goes back to the owner
/// (`StoreEnvironment.offOwner`). A place has at most one job at a time: a store with work holds one thread, an
/// idle store none, and a commit job carries a whole group.
public protocol BlockingExecutor: Sendable {
    /// Runs `job` on one of the threads, in submission order among the jobs waiting. A job must run even if the
    /// threads are stopping: it answers writes.
    func execute(_ job: @escaping @Sendable () -> Void)
}
