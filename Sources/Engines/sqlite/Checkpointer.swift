import CSQLite

#if canImport(Glibc)
import Glibc
#endif

/// Copies stores' write-ahead logs back into their databases on one thread of the engine's own, so that commits
/// never wait for a checkpoint.
///
/// SQLite's automatic checkpoint runs inside the commit that takes the log past 1,000 pages: that commit pays
/// for copying the pages and for the database's fsync, several milliseconds in which every write behind it
/// waits (the fan-out benchmark's p99: 2.8 ms against 0.4 ms for the memory engine). Here a store's log hook
/// only queues the store; the thread opens a connection of its own, runs a PASSIVE checkpoint (which never
/// blocks the writer) and closes it again, so an idle store holds no second connection, no descriptors and no
/// thread. A PASSIVE checkpoint seldom catches up while commits go on, so under sustained writes the log reaches
/// `inlineLimit` pages; there the commit checkpoints itself, as SQLite would, the log starts over, and it stays
/// bounded.
final class Checkpointer: @unchecked Sendable {  // all state under `mutex`
    static let shared = Checkpointer()
    static let backgroundPages: Int32 = 1000
    static let inlineLimit: Int32 = 4000

    /// What a store's log hook reaches through its context pointer (touched only by the hook, on the thread
    /// committing to the store).
    final class Target {
        let path: String
        /// The log's size at the last commit, to notice it started over.
        var lastPages: Int32 = 0
        /// The log's size at which the next background checkpoint is asked for.
        var nextRequest = Checkpointer.backgroundPages
        init(path: String) { self.path = path }
    }

    private var mutex = pthread_mutex_t()
    private var condition = pthread_cond_t()
    private var queue: [String] = []
    private var running: String?
    private var started = false

    private init() {
        pthread_mutex_init(&mutex, nil)
        pthread_cond_init(&condition, nil)
    }

    /// Installs the log hook on a store's connection; `target` must outlive the connection.
    static func watch(_ db: OpaquePointer, _ target: Target) {
        sqlite3_wal_hook(db, { context, db, _, pages in
            let target = Unmanaged<Target>.fromOpaque(context!).takeUnretainedValue()
            if pages < target.lastPages { target.nextRequest = Checkpointer.backgroundPages }  // the log started over
            target.lastPages = pages
            if pages >= Checkpointer.inlineLimit {
                sqlite3_wal_checkpoint_v2(db, nil, SQLITE_CHECKPOINT_PASSIVE, nil, nil)
            } else if pages >= target.nextRequest {
                // Once per `backgroundPages` the log grows, not at every commit past them: a checkpoint's own
                // fsyncs compete for the disk with the commits' (asked for at every commit, the thread ran one per
                // 3.5 commits, and a FULL commit's `fdatasync` took 204 µs instead of 158, both under strace).
                target.nextRequest = pages + Checkpointer.backgroundPages
                if !Checkpointer.shared.request(target.path) {
                    // No thread: the commit checkpoints itself, as SQLite's automatic checkpoint does.
                    sqlite3_wal_checkpoint_v2(db, nil, SQLITE_CHECKPOINT_PASSIVE, nil, nil)
                }
            }
            return SQLITE_OK
        }, Unmanaged.passUnretained(target).toOpaque())
    }

    /// Queues a checkpoint of `path` (once, however often asked); `false` when no thread could be started.
    func request(_ path: String) -> Bool {
        pthread_mutex_lock(&mutex)
        defer { pthread_mutex_unlock(&mutex) }
        if !started {
            var thread = pthread_t()
            guard pthread_create(&thread, nil, { _ in
                // Its own name in a profile (it would carry the name of the thread that started it).
                let comm = open("/proc/thread-self/comm", O_WRONLY)
                if comm >= 0 {
                    _ = write(comm, "sb-checkpoint", 13)
                    close(comm)
                }
                Checkpointer.shared.run()
                return nil
            }, nil) == 0 else { return false }
            pthread_detach(thread)
            started = true
        }
        if !queue.contains(path) {
            queue.append(path)
            pthread_cond_broadcast(&condition)
        }
        return true
    }

    /// Before a store closes (and perhaps is dropped): forgets its queued checkpoint and waits for one running.
    func forget(_ path: String) {
        pthread_mutex_lock(&mutex)
        queue.removeAll { $0 == path }
        while running == path { pthread_cond_wait(&condition, &mutex) }
        pthread_mutex_unlock(&mutex)
    }

    private func run() {
        while true {
            pthread_mutex_lock(&mutex)
            while queue.isEmpty { pthread_cond_wait(&condition, &mutex) }
            let path = queue.removeFirst()
            running = path
            pthread_mutex_unlock(&mutex)

            Self.checkpoint(path)

            pthread_mutex_lock(&mutex)
            running = nil
            pthread_cond_broadcast(&condition)
            pthread_mutex_unlock(&mutex)
        }
    }

    private static func checkpoint(_ path: String) {
        var db: OpaquePointer?
        defer { sqlite3_close_v2(db) }
        guard sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nil) == SQLITE_OK, let db else {
            return
        }
        // A connection learns the database is in WAL mode when it first reads it; until then a checkpoint
        // through it does nothing.
        sqlite3_exec(db, "PRAGMA journal_mode=WAL", nil, nil, nil)
        sqlite3_wal_checkpoint_v2(db, nil, SQLITE_CHECKPOINT_PASSIVE, nil, nil)
    }
}
