import Glibc
import Locking
import Logging
import StoreModel

/// Listens for other brokers' commits to a shared engine's stores (ABI 2.1's watch) on a thread of its own,
/// which only waits on the watch's descriptor and reads its notices: the catch-ups themselves run on each store's
/// writer. Once a second it also asks again for the stores whose last catch-up failed, and remakes a lost watch
/// (the engine then says "any store may have changed").
final class SharedWatcher: Sendable {
    private let watch: any EngineWatch
    /// A pipe whose write end `stop()` closes: the thread's poll wakes and the thread ends.
    private let stopRead: Int32
    private let stopWrite: Locked<Int32>

    /// `changed`: a store's name and its position after the change when known, or nil for every store; `tick`:
    /// once a second.
    init(
        engine: any SharedStorageEngine, options: [String: String], logger: Logger,
        changed: @escaping @Sendable (String?, Position?) -> Void, tick: @escaping @Sendable () -> Void
    ) throws(BrokerError) {
        watch = try EnginePlace.engineCall { () throws(EngineFailure) in try engine.watch(options: options) }
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0 else {
            watch.close()
            throw BrokerError(.internalError, "cannot make the watcher's pipe: \(String(cString: strerror(errno)))")
        }
        for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        stopRead = ends[0]
        stopWrite = Locked(ends[1])
        let loop = Loop(
            watch: watch, stop: stopRead, descriptor: watch.descriptor, logger: logger, engine: engine.name,
            changed: changed, tick: tick)
        let context = Unmanaged.passRetained(loop).toOpaque()
        var thread = pthread_t()
        let status = pthread_create(&thread, nil, { context in
            Unmanaged<Loop>.fromOpaque(context!).takeRetainedValue().run()
            return nil
        }, context)
        precondition(status == 0, "cannot start the shared-store watcher: \(String(cString: strerror(status)))")
        pthread_detach(thread)
    }

    /// Ends the thread (within one poll) and the watch.
    func stop() {
        stopWrite.withLock { descriptor in
            guard descriptor >= 0 else { return }
            close(descriptor)
            descriptor = -1
        }
    }

    private final class Loop: @unchecked Sendable {
        let watch: any EngineWatch
        let stop: Int32
        var descriptor: Int32
        let logger: Logger
        let engine: String
        let changed: @Sendable (String?, Position?) -> Void
        let tick: @Sendable () -> Void
        /// Failing since: logged once per streak.
        var failing = false

        init(
            watch: any EngineWatch, stop: Int32, descriptor: Int32, logger: Logger, engine: String,
            changed: @escaping @Sendable (String?, Position?) -> Void, tick: @escaping @Sendable () -> Void
        ) {
            self.watch = watch
            self.stop = stop
            self.descriptor = descriptor
            self.logger = logger
            self.engine = engine
            self.changed = changed
            self.tick = tick
        }

        func run() {
            var lastTick = monotonicNanoseconds()
            while true {
                var fds = [pollfd(fd: stop, events: Int16(POLLIN), revents: 0), pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)]
                let ready = poll(&fds, descriptor >= 0 ? 2 : 1, 1000)
                if ready < 0, errno == EINTR { continue }
                if fds[0].revents != 0 { break }
                if monotonicNanoseconds() - lastTick >= 1_000_000_000 {
                    lastTick = monotonicNanoseconds()
                    tick()
                }
                guard descriptor < 0 || fds[1].revents != 0 else { continue }
                do throws(EngineFailure) {
                    descriptor = try watch.changes(changed)
                    if failing {
                        failing = false
                        logger.notice("watching engine \(engine)'s shared stores again")
                    }
                } catch {
                    descriptor = -1
                    if !failing {
                        failing = true
                        logger.error(
                            "lost the watch on engine \(engine)'s shared stores (trying again every second): \(error.description)")
                    }
                }
            }
            close(stop)
            watch.close()
        }
    }
}
