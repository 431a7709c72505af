import Glibc
import Logging
import StoreModel

/// Listens for other brokers' commits to a shared engine's stores (ABI 2.1's watch) on a thread of its own
/// (`WakeableThread`), which only waits on the watch's descriptor and reads its notices: the catch-ups themselves
/// run on each store's writer. Once a second it also asks again for the stores whose last catch-up failed, and opens or remakes a
/// watch it could not open or lost (a database down at start-up, a server restart): every store may have
/// changed meanwhile, so it then says so (`changed(nil, nil)`).
final class SharedWatcher: Sendable {
    private let thread: WakeableThread

    /// `changed`: a store's name and its position after the change when known, or nil for every store; `tick`:
    /// once a second.
    init(
        engine: any SharedStorageEngine, options: [String: String], logger: Logger,
        changed: @escaping @Sendable (String?, Position?) -> Void, tick: @escaping @Sendable () -> Void
    ) throws(BrokerError) {
        thread = try WakeableThread(name: "sb-shared-watch")
        try thread.start { thread in
            Self.run(on: thread, engine: engine, options: options, logger: logger, changed: changed, tick: tick)
        }
    }

    /// Ends the thread (within one wait) and the watch; returns once both have ended.
    func stop() async {
        thread.stop()
        await thread.join()
    }

    /// The thread's loop; its state is its own local variables.
    private static func run(
        on thread: WakeableThread, engine: any SharedStorageEngine, options: [String: String], logger: Logger,
        changed: @Sendable (String?, Position?) -> Void, tick: @Sendable () -> Void
    ) {
        /// Nil until opened, and again once lost for good: it is opened anew.
        var watch: (any EngineWatch)?
        var descriptor: Int32 = -1
        var opened = false
        /// Failing since: logged once per streak.
        var failing = false
        func failed(_ error: EngineFailure) {
            guard !failing else { return }
            failing = true
            logger.error(
                "cannot watch engine \(engine.name)'s shared stores (trying again every second): \(error.description)")
        }
        func recovered() {
            guard failing else { return }
            failing = false
            logger.notice("watching engine \(engine.name)'s shared stores again")
        }
        var lastTick = monotonicNanoseconds()
        while !thread.isStopping {
            if watch == nil {
                do throws(EngineFailure) {
                    let made = try engine.watch(options: options)
                    watch = made
                    descriptor = made.descriptor
                    // Open before, or a failed first try: every store may have changed meanwhile.
                    if opened || failing { changed(nil, nil) }
                    opened = true
                    recovered()
                } catch {
                    failed(error)
                }
            }
            let readable = thread.wait(milliseconds: 1000, descriptor: descriptor)
            if thread.isStopping { break }
            if monotonicNanoseconds() - lastTick >= 1_000_000_000 {
                lastTick = monotonicNanoseconds()
                tick()
            }
            guard let watch, descriptor < 0 || readable else { continue }
            do throws(EngineFailure) {
                descriptor = try watch.changes(changed)
                recovered()
            } catch {
                descriptor = -1
                failed(error)
            }
        }
        watch?.close()
    }
}
