import Logging
import NIOCore

/// What every store and value namespace of a broker shares, and how their work is split between the owner and
/// the threads for blocking work.
///
/// One event loop, the owner, owns every store's and namespace's state: it alone reads and writes it, so no lock
/// guards it (as Redis's one thread owns every key). The server hands requests in on that loop, a read cycle's
/// requests at once, and the owner answers them there: reads from memory, writes once committed. Engine calls
/// that block (loads, the commits of an engine that is not `nonblocking`, drops, a shared database's catch-up)
/// run on `blocking`'s threads, one job per commit group, and hand their result back to the owner in one task.
struct StoreEnvironment: Sendable {
    let directory: DataDirectory
    let engines: any EngineProvider
    let configuration: BrokerConfiguration
    let logger: Logger
    var observers: [any CommitObserver] = []
    /// The event loop that owns the broker's state.
    let owner: any EventLoop
    /// The threads engine calls that block run on.
    let blocking: any BlockingExecutor
    /// The blocking jobs started and not yet back on the owner; shutdown waits for them all.
    let jobs = BlockingJobs()

    /// Runs `work` on a thread for blocking work, then `then` with its result on the owner. Called on the owner.
    ///
    /// `work` must not touch the owner's state: it gets what it needs as values and returns what the owner is to
    /// change (hence `Handover`: a value the owner gives up until it comes back).
    func offOwner<Result>(_ work: @escaping @Sendable () -> Result, then: @escaping (Result) -> Void) {
        owner.assertInEventLoop()
        jobs.started()
        let owner = owner
        let jobs = jobs
        let then = Handover(then)
        blocking.execute {
            let result = Handover(work())
            owner.execute {
                then.value(result.value)
                jobs.ended()
            }
        }
    }
}

/// A value passed between the owner and a blocking thread with no other holder while it travels: the sender gives
/// it up, so it is never used from two threads at once.
struct Handover<Value>: @unchecked Sendable {
    var value: Value
    init(_ value: Value) { self.value = value }
}

/// The blocking jobs a broker has started and not yet taken back on its owner (`StoreEnvironment.offOwner`).
/// Touched only on the owner.
final class BlockingJobs: @unchecked Sendable {
    private var running = 0
    private var whenNone: [() -> Void] = []

    func started() { running += 1 }

    func ended() {
        running -= 1
        guard running == 0, !whenNone.isEmpty else { return }
        let waiting = whenNone
        whenNone = []
        for body in waiting { body() }
    }

    /// Runs `body` once no job is running (now, if none is).
    func whenAllEnded(_ body: @escaping () -> Void) {
        if running == 0 { body() } else { whenNone.append(body) }
    }
}
