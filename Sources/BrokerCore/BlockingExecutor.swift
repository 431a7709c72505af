/// Threads made for work that blocks: the broker's engine calls (loads, commit groups, drops), which must never
/// run on an event loop or the cooperative pool. The server hands the broker one (NIO's `NIOThreadPool`); the
/// broker hands it jobs, each a writer's turn: it loads its place, or commits what its queue holds, calling its
/// engine synchronously. A place submits at most one job at a time, and that job runs until its queue is empty or
/// it has made `StoreEnvironment.groupsPerTurn` commit groups (then it submits itself again, behind the other places' jobs): a
/// store with work holds one thread, an idle store none, and a hand-off carries everything queued since the last.
public protocol BlockingExecutor: Sendable {
    /// Runs `job` on one of the threads, in submission order among the jobs waiting. A job must run even if the
    /// threads are stopping: it answers writes.
    func execute(_ job: @escaping @Sendable () -> Void)
}
