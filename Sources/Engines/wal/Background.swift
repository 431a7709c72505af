import StorageEngineKit
import WALFormat
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A store's background threads and what they share with the host's calls, under one mutex: the snapshot, the
/// closed segments waiting to be folded into the next one, and (under `NORMAL`) the segment written but not yet
/// synced. One thread syncs that segment within `WALSettings.syncIntervalNanoseconds` of its first unsynced
/// write; the other makes a snapshot of the store whenever a segment is closed. The mutex is held only to read
/// or change these fields, never across I/O; an apply takes it at most once (under `NORMAL`, uncontended but for
/// the sync thread's wake-ups once a second).
final class WALBackground: @unchecked Sendable {
    private let directory: String
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    // Guarded by `mutex`.
    private var snapshot: SnapshotInfo?
    private var sealed: [LogSegment]
    /// The last sequence in `sealed`.
    private var sealedThrough: UInt64 = 0
    private var unsyncedSegment: LogSegment?
    private var unsyncedSince: UInt64 = 0
    /// NORMAL: closed segments with writes not yet synced, oldest first, and whether the directory holds a
    /// segment created since its last sync: the sync thread syncs these before the newest segment.
    private var unsyncedClosed: [LogSegment] = []
    private var directoryUnsynced = false
    private var storedSyncFailure: EngineError?
    private var compacting = false
    private var retryAt: UInt64 = 0
    private var stopping = false

    /// A background sync failed: the next apply reports it (read without the mutex on every apply).
    let failed = Atomic<Bool>(false)
    /// Set by `stop`; a snapshot being written gives up when it sees it.
    private let stopped = Atomic<Bool>(false)

    init(directory: String, snapshot: SnapshotInfo?, sealed: [LogSegment], sealedThrough: UInt64) {
        self.directory = directory
        self.snapshot = snapshot
        self.sealed = sealed
        self.sealedThrough = sealedThrough
        pthread_mutex_init(mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(condition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    private func locked<T>(_ body: () throws(EngineError) -> T) throws(EngineError) -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body()
    }

    private func locked<T>(_ body: () -> T) -> T {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return body()
    }

    // MARK: For the host's calls

    var snapshotBytes: Int { locked { snapshot?.bytes ?? 0 } }

    /// No snapshot is being made or waiting to be.
    var idle: Bool { locked { sealed.isEmpty && !compacting } }

    /// `segment`, which holds the records through `through`, is closed: it goes into the next snapshot.
    /// With `synced == false` (NORMAL), its unsynced writes and the new segment's name are the sync thread's to
    /// sync, before the new segment's.
    func seal(_ segment: LogSegment, through: UInt64, synced: Bool) {
        locked {
            if unsyncedSegment === segment {
                unsyncedSegment = nil
                if !synced { unsyncedClosed.append(segment) }
            }
            if !synced { directoryUnsynced = true }
            sealed.append(segment)
            sealedThrough = through
            pthread_cond_broadcast(condition)
        }
    }

    /// `segment` was written and not synced (`NORMAL`).
    func unsynced(_ segment: LogSegment) {
        locked {
            guard unsyncedSegment == nil else { return }
            unsyncedSegment = segment
            unsyncedSince = monotonicNanoseconds()
            pthread_cond_broadcast(condition)
        }
    }

    /// The failure of a background sync. It stays: Linux marks the pages of a failed sync clean, so a later
    /// sync that succeeds proves nothing about them, and every apply fails until the store is opened again
    /// (opening reads what the file holds and syncs it).
    var syncFailure: EngineError? { locked { storedSyncFailure } }

    /// The store as its files hold it now: the snapshot and every segment after it, mapped while the mutex
    /// keeps a snapshot finishing meanwhile from deleting them, and the log's effects read from them.
    func view(current: LogSegment) throws(EngineError) -> StoreView {
        let (file, logs, base) = try locked { () throws(EngineError) in
            (
                try snapshot.map { (info) throws(EngineError) in try SnapshotFile(info.path) },
                try sealed.map { (segment) throws(EngineError) in try Mapping(segment.path, length: segment.size) },
                snapshot?.sequence ?? 0
            )
        }
        var view = StoreView(snapshot: file, logs: logs + [try Mapping(current.path, length: current.size)])
        try view.readLogs(after: base)
        return view
    }

    // MARK: The threads

    /// Starts the threads: one that makes snapshots and, under `NORMAL`, one that syncs. Two, because a snapshot
    /// of a large store takes long (its file is written and synced whole) and must not hold back the syncs that
    /// bound what a power cut takes: with one thread, the checker's power-loss property found a NORMAL store
    /// missing applies acknowledged more than two seconds before the cut, all written while a snapshot was made.
    func start(syncing: Bool) throws(EngineError) -> [pthread_t] {
        var threads = [try spawn { $0.runSnapshots() }]
        if syncing {
            do throws(EngineError) {
                threads.append(try spawn { $0.runSyncs() })
            } catch {
                stop()
                for thread in threads { pthread_join(thread, nil) }
                throw error
            }
        }
        return threads
    }

    private final class Start {
        let background: WALBackground
        let body: (WALBackground) -> Void
        init(_ background: WALBackground, _ body: @escaping (WALBackground) -> Void) {
            self.background = background
            self.body = body
        }
    }

    private func spawn(_ body: @escaping (WALBackground) -> Void) throws(EngineError) -> pthread_t {
        var thread = pthread_t()
        let context = Unmanaged.passRetained(Start(self, body)).toOpaque()
        let status = pthread_create(&thread, nil, { context in
            let start = Unmanaged<Start>.fromOpaque(context!).takeRetainedValue()
            start.body(start.background)
            return nil
        }, context)
        guard status == 0 else {
            Unmanaged<Start>.fromOpaque(context).release()
            throw EngineError.errno("cannot start a thread of the wal engine", status)
        }
        return thread
    }

    func stop() {
        stopped.store(true, ordering: .relaxed)
        locked {
            stopping = true
            pthread_cond_broadcast(condition)
        }
    }

    /// Waits on the condition until `deadline` (monotonic nanoseconds; `.max`: until woken). Called locked.
    private func wait(until deadline: UInt64) {
        if deadline == .max {
            pthread_cond_wait(condition, mutex)
        } else {
            var time = timespec(tv_sec: Int(deadline / 1_000_000_000), tv_nsec: Int(deadline % 1_000_000_000))
            pthread_cond_timedwait(condition, mutex, &time)
        }
    }

    /// The snapshot thread: folds closed segments into a new snapshot, then deletes what it replaced.
    private func runSnapshots() {
        pthread_mutex_lock(mutex)
        while !stopping {
            let now = monotonicNanoseconds()
            guard !sealed.isEmpty, now >= retryAt else {
                wait(until: sealed.isEmpty ? .max : retryAt)
                continue
            }
            compacting = true
            let (base, segments, through) = (snapshot, sealed, sealedThrough)
            pthread_mutex_unlock(mutex)
            let made = Result { () throws(EngineError) in try makeSnapshot(after: base, of: segments, through: through) }
            pthread_mutex_lock(mutex)
            compacting = false
            guard case .success(let new) = made else {
                // Counted from the failure: an attempt that takes longer than the interval is not made again at once.
                retryAt = monotonicNanoseconds() + WALSettings.syncIntervalNanoseconds
                continue
            }
            snapshot = new
            sealed.removeFirst(segments.count)
            pthread_mutex_unlock(mutex)
            removeHeld(by: new)
            pthread_mutex_lock(mutex)
        }
        pthread_mutex_unlock(mutex)
    }

    /// The sync thread (`NORMAL`): syncs closed segments and the directory at once, and the segment written since
    /// the last sync a sync interval after the first write it did not sync.
    private func runSyncs() {
        pthread_mutex_lock(mutex)
        while !stopping {
            if storedSyncFailure != nil {
                wait(until: .max)  // nothing newer is synced behind a failed sync
                continue
            }
            if !unsyncedClosed.isEmpty || directoryUnsynced {
                if let failure = syncClosedLocked() { fail(failure) }
                continue
            }
            guard let segment = unsyncedSegment else {
                wait(until: .max)
                continue
            }
            let due = unsyncedSince + WALSettings.syncIntervalNanoseconds
            guard monotonicNanoseconds() >= due else {
                wait(until: due)
                continue
            }
            unsyncedSegment = nil
            pthread_mutex_unlock(mutex)
            let failure: EngineError? = fdatasync(segment.fd) == 0 ? nil : EngineError.errno("cannot sync \(segment.path)")
            pthread_mutex_lock(mutex)
            if let failure { fail(failure) }
        }
        pthread_mutex_unlock(mutex)
    }

    /// Records a failed sync; called locked.
    private func fail(_ failure: EngineError) {
        storedSyncFailure = failure
        failed.store(true, ordering: .relaxed)
    }

    /// Syncs the closed segments and then the directory; called locked, unlocks around the syncs.
    private func syncClosedLocked() -> EngineError? {
        let (closed, directorySync) = (unsyncedClosed, directoryUnsynced)
        unsyncedClosed = []
        directoryUnsynced = false
        pthread_mutex_unlock(mutex)
        defer { pthread_mutex_lock(mutex) }
        do throws(EngineError) {
            for segment in closed { try segment.sync() }
            if directorySync { try Files.syncDirectory(directory) }
            return nil
        } catch {
            return error
        }
    }

    /// At close (the threads stopped): folds every segment, `current` (synced) last, into a snapshot through
    /// `through` when they hold more than `threshold` bytes, and deletes them and the old snapshot, so that the
    /// next open reads one file and merges nothing. A failure leaves the files as they were.
    func fold(current: LogSegment, through: UInt64, threshold: Int) {
        let segments = sealed + [current]
        guard segments.reduce(0, { $0 + $1.size - WALFormat.logHeaderSize }) > threshold,
            let new = try? makeSnapshot(after: snapshot, of: segments, through: through, stoppable: false)
        else { return }
        removeHeld(by: new)
        snapshot = new
        sealed = []
    }

    /// Deletes the older snapshots and the segments `snapshot` holds (it read them whole to be made); what a crash
    /// leaves of them is deleted after the next one.
    private func removeHeld(by snapshot: SnapshotInfo) {
        for name in (try? Files.list(directory)) ?? [] {
            if let sequence = WALFormat.sequence(inName: name, prefix: "snapshot-"), sequence < snapshot.sequence {
                unlink(directory + "/" + name)
            } else if let first = WALFormat.sequence(inName: name, prefix: "log-"), first <= snapshot.sequence {
                unlink(directory + "/" + name)
            }
        }
    }

    /// At close (the threads stopped): syncs what NORMAL left unsynced, in the sync thread's order.
    func syncPending() {
        pthread_mutex_lock(mutex)
        _ = syncClosedLocked()
        let segment = unsyncedSegment
        unsyncedSegment = nil
        pthread_mutex_unlock(mutex)
        try? segment?.sync()
    }

    /// A snapshot of `base` and `segments` (records through `through`), durable under its name.
    private func makeSnapshot(
        after base: SnapshotInfo?, of segments: [LogSegment], through: UInt64, stoppable: Bool = true
    ) throws(EngineError) -> SnapshotInfo {
        let file = try base.map { (info) throws(EngineError) in try SnapshotFile(info.path) }
        var view = StoreView(
            snapshot: file,
            logs: try segments.map { (segment) throws(EngineError) in try Mapping(segment.path, length: segment.size) })
        try view.readLogs(after: base?.sequence ?? 0)
        let path = directory + "/" + WALFormat.snapshotName(sequence: through)
        let writer = try SnapshotWriter(temporaryPath: path + ".tmp", sequence: through)
        do throws(EngineError) {
            let completed = try view.merge { (item) throws(EngineError) in
                try writer.add(item)
                return !stoppable || !stopped.load(ordering: .relaxed)
            }
            guard completed else { throw EngineError.stopped }
            try writer.finish(sequence: through, as: path)
            try Files.syncDirectory(directory)
        } catch {
            writer.abandon()
            throw error
        }
        return SnapshotInfo(path: path, sequence: through, bytes: writer.written)
    }
}

/// The store as its files hold it: a snapshot, the log segments after it, and their effects, which point into
/// the segments' mappings and so are used only while the view holds them.
struct StoreView {
    let snapshot: SnapshotFile?
    private let logs: [Mapping]
    private var effects = LogEffects()

    init(snapshot: SnapshotFile?, logs: [Mapping]) {
        self.snapshot = snapshot
        self.logs = logs
    }

    /// The log changes nothing: the snapshot (if any) is the store.
    var plain: Bool { effects.isEmpty }

    mutating func readLogs(after base: UInt64) throws(EngineError) {
        for log in logs { try effects.add(log, after: base) }
    }

    /// `LogEffects.merge`, the mappings kept alive throughout.
    mutating func merge(_ body: (WALItem) throws(EngineError) -> Bool) throws(EngineError) -> Bool {
        defer { withExtendedLifetime(logs) {} }
        return try effects.merge(into: snapshot, body)
    }
}

extension LogEffects {
    /// Adds the records of a log segment after sequence `base`. The segment's records were checked when the
    /// store opened or written by this process: one that does not check out now is damage.
    mutating func add(_ log: Mapping, after base: UInt64) throws(EngineError) {
        var offset = WALFormat.logHeaderSize
        while true {
            switch LogRecord.read(log.bytes, at: offset) {
            case .end: return
            case .bad(let why): throw EngineError.corrupt("\(log.path): \(why) at byte \(offset)")
            case .record(let record):
                if record.sequence > base { try record.forEachStep { apply($0) } }
                offset = record.end
            }
        }
    }
}

func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}
