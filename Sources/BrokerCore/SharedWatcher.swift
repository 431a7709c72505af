import Glibc
import Locking
import Logging
import StoreModel

/// Listens for other brokers' commits to a shared engine's stores (ABI 2.1's watch) on a thread of its own,
/// which only waits on the watch's descriptor and reads its notices: the catch-ups themselves run on each store's
/// writer. Once a second it also asks again for the stores whose last catch-up failed, and opens or remakes a
/// watch it could not open or lost (a database down at start-up, a server restart): every store may have
/// changed meanwhile, so it then says so (`changed(nil, nil)`).
final class SharedWatcher: Sendable {
    /// A pipe whose write end `stop()` closes: the thread's poll wakes and the thread ends.
    private let stopRead: Int32
    private let stopWrite: Locked<Int32>

    /// `changed`: a store's name and its position after the change when known, or nil for every store; `tick`:
    /// once a second.
    init(
        engine: any SharedStorageEngine, options: [String: String], logger: Logger,
        changed: @escaping @Sendable (String?, Position?) -> Void, tick: @escaping @Sendable () -> Void
    ) throws(BrokerError) {
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0 else {
            throw BrokerError(.internalError, "cannot make the watcher's pipe: \(String(cString: strerror(errno)))")
        }
        for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        stopRead = ends[0]
        stopWrite = Locked(ends[1])
        let loop = Loop(
            engine: engine, options: options, stop: stopRead, logger: logger, changed: changed, tick: tick)
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
        let engine: any SharedStorageEngine
        let options: [String: String]
        /// Nil until opened (and again once lost for good: it is opened anew).
        var watch: (any EngineWatch)?
        let stop: Int32
        var descriptor: Int32 = -1
        let logger: Logger
        let changed: @Sendable (String?, Position?) -> Void
        let tick: @Sendable () -> Void
        /// Failing since: logged once per streak.
        var failing = false

        init(
            engine: any SharedStorageEngine, options: [String: String], stop: Int32, logger: Logger,
            changed: @escaping @Sendable (String?, Position?) -> Void, tick: @escaping @Sendable () -> Void
        ) {
            self.engine = engine
            self.options = options
            self.stop = stop
            self.logger = logger
            self.changed = changed
            self.tick = tick
        }

        func run() {
            var lastTick = monotonicNanoseconds()
            var opened = false
            while true {
                if watch == nil { open(after: opened) }
                opened = opened || watch != nil
                var fds = [pollfd(fd: stop, events: Int16(POLLIN), revents: 0), pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)]
                let ready = poll(&fds, descriptor >= 0 ? 2 : 1, 1000)
                if ready < 0, errno == EINTR { continue }
                if fds[0].revents != 0 { break }
                if monotonicNanoseconds() - lastTick >= 1_000_000_000 {
                    lastTick = monotonicNanoseconds()
                    tick()
                }
                guard let watch, descriptor < 0 || fds[1].revents != 0 else { continue }
                do throws(EngineFailure) {
                    descriptor = try watch.changes(changed)
                    recovered()
                } catch {
                    descriptor = -1
                    failed(error)
                }
            }
            close(stop)
            watch?.close()
        }

        /// Opens the watch; once it had been open before, or after a failed first try, every store may have
        /// changed meanwhile.
        private func open(after opened: Bool) {
            do throws(EngineFailure) {
                let made = try engine.watch(options: options)
                watch = made
                descriptor = made.descriptor
                if opened || failing { changed(nil, nil) }
                recovered()
            } catch {
                failed(error)
            }
        }

        private func recovered() {
            guard failing else { return }
            failing = false
            logger.notice("watching engine \(engine.name)'s shared stores again")
        }

        private func failed(_ error: EngineFailure) {
            guard !failing else { return }
            failing = true
            logger.error(
                "cannot watch engine \(engine.name)'s shared stores (trying again every second): \(error.description)")
        }
    }
}
