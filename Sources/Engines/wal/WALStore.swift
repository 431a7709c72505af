import CStorageEngine
import StorageEngineKit
import WALFormat
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One store of the wal engine. The host's calls (never two at once) own the segment being appended to; the
/// store's background threads sync it under `NORMAL` and fold closed segments into snapshots, so that no apply
/// waits for a snapshot: an apply that closes a segment pays one `fdatasync` of it and the creation of the next.
final class WALStore: EngineStoreImplementation {
    private let directory: String
    private let settings: WALSettings
    private let background: WALBackground
    private var threads: [pthread_t]
    /// The segment applies append to.
    private var log: LogSegment
    private(set) var sequence: UInt64
    private var encoder = RecordEncoder()
    private var cachedCount: (sequence: UInt64, count: UInt64)?
    /// The log size at which the next apply tries to close the segment.
    private var rotateAt: Int

    init(directory: String, settings: WALSettings) throws(EngineError) {
        self.directory = directory
        self.settings = settings
        let recovered = try Recovery.run(directory: directory)
        log = recovered.current
        sequence = recovered.sequence
        rotateAt = recovered.current.size + settings.snapshotLogBytes
        background = WALBackground(
            directory: directory, snapshot: recovered.snapshot, sealed: recovered.sealed,
            sealedThrough: recovered.current.first - 1)
        threads = try background.start(syncing: !settings.full)
    }

    func apply(_ steps: UnsafeBufferPointer<sb_step>, sequence: UInt64) throws(EngineError) {
        let failed = background.failed.load(ordering: .relaxed) ? background.syncFailure : log.syncFailure
        if let failed {
            throw EngineError.io("a sync of this store failed (\(failed.message)); it takes no write until it is opened again")
        }
        defer { encoder.shrink() }
        let record = try encoder.encode(steps, sequence: sequence, failure: settings.failure)
        try log.append(record, sync: settings.full)
        if !settings.full { background.unsynced(log) }
        self.sequence = sequence
        cachedCount = nil
        if log.size >= rotateAt { rotate() }
    }

    /// Closes the segment and starts the next, unless a snapshot is still being made or the snapshot is large
    /// enough that the log may grow to half its size first. A failure here fails no apply: the segment goes on
    /// growing and the next try comes a quarter threshold later.
    private func rotate() {
        let threshold = max(settings.snapshotLogBytes, background.snapshotBytes / 2)
        guard log.size >= threshold, background.idle else {
            rotateAt = log.size + max(settings.snapshotLogBytes / 4, threshold - log.size)
            return
        }
        do throws(EngineError) {
            // FULL: every record of the closed segment is synced already, and the next segment's header and name
            // are synced before a record goes into it. NORMAL: the apply runs on the daemon's owner loop, so it
            // syncs nothing; the sync thread syncs the closed segment, then the directory, then the new segment,
            // in that order, so that the new one never holds synced records behind a closed one's unsynced tail.
            let next = try LogSegment.create(directory: directory, first: sequence + 1, sync: settings.full)
            background.seal(log, through: sequence, synced: settings.full)
            log = next
            rotateAt = log.size + settings.snapshotLogBytes
        } catch {
            rotateAt = log.size + settings.snapshotLogBytes / 4
        }
    }

    func count() throws(EngineError) -> UInt64 {
        if let cachedCount, cachedCount.sequence == sequence { return cachedCount.count }
        var view = try background.view(current: log)
        var count: UInt64 = 0
        if view.plain, let snapshot = view.snapshot {
            count = snapshot.count
        } else {
            _ = try view.merge { _ in
                count += 1
                return true
            }
        }
        cachedCount = (sequence, count)
        return count
    }

    func scan(emit: (UnsafePointer<sb_item>) -> Bool) throws(EngineError) {
        var view = try background.view(current: log)
        let completed = try view.merge { item in
            var emitted = sb_item(
                key: sb_bytes(data: item.key.baseAddress?.assumingMemoryBound(to: UInt8.self), length: item.key.count),
                payload: sb_bytes(
                    data: item.payload.baseAddress?.assumingMemoryBound(to: UInt8.self), length: item.payload.count),
                created_at: item.createdAt, updated_at: item.updatedAt)
            return emit(&emitted)
        }
        if !completed { throw EngineError.stopped }
    }

    func close() {
        background.stop()
        for thread in threads { pthread_join(thread, nil) }
        // What NORMAL left unsynced is synced now, in order; close cannot fail, and what a failure here loses is
        // within NORMAL's window.
        if !settings.full { background.syncPending() }
        // A clean close folds a log of more than a megabyte into a snapshot: a store of 1,000,000 items whose log
        // was as long as the snapshot allows (half its size) took 1.9 s to load, its log merged in twice (count,
        // then scan), against a read of one file.
        background.fold(current: log, through: sequence, threshold: 1 << 20)
        encoder.release()
    }
}

/// A log segment open for appending. Only the host's calls append; the sync thread may sync it.
final class LogSegment: @unchecked Sendable {
    let path: String
    /// The first sequence it may hold.
    let first: UInt64
    let fd: Int32
    /// The end of its last whole record: where the next is written. Read and written by the host's calls only.
    private(set) var size: Int
    /// An `fdatasync` of an append failed: the record was cut off again, but the cut is not known to be durable
    /// and the pages the sync failed on are marked clean, so the segment takes nothing more (host's calls only).
    private(set) var syncFailure: EngineError?

    private init(path: String, first: UInt64, fd: Int32, size: Int) {
        self.path = path
        self.first = first
        self.fd = fd
        self.size = size
    }

    deinit { Glibc.close(fd) }

    /// A new, empty segment; with `sync`, its header and name are durable when it returns. A failure deletes it
    /// (and opening deletes one a crash left holding nothing inside the log).
    static func create(directory: String, first: UInt64, sync: Bool = true) throws(EngineError) -> LogSegment {
        let path = directory + "/" + WALFormat.logName(first: first)
        let fd = Glibc.open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw EngineError.errno("cannot create \(path)") }
        let segment = LogSegment(path: path, first: first, fd: fd, size: 0)
        do throws(EngineError) {
            try segment.append(WALFormat.logHeader(first: first), sync: sync)
            if sync { try Files.syncDirectory(directory) }
        } catch {
            unlink(path)
            throw error
        }
        return segment
    }

    /// An existing segment whose whole records end at `validEnd`: anything after is cut (a torn tail).
    static func open(path: String, first: UInt64, validEnd: Int) throws(EngineError) -> LogSegment {
        let fd = Glibc.open(path, O_RDWR | O_CLOEXEC)
        guard fd >= 0 else { throw EngineError.errno("cannot open \(path)") }
        let segment = LogSegment(path: path, first: first, fd: fd, size: validEnd)
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw EngineError.errno("cannot stat \(path)") }
        if Int(info.st_size) > validEnd {
            guard ftruncate(fd, off_t(validEnd)) == 0 else { throw EngineError.errno("cannot cut the torn tail of \(path)") }
            try segment.sync()
        }
        return segment
    }

    /// Writes `bytes` at the end and, with `sync`, makes them durable; on failure cuts them off again, so a
    /// failed append leaves the segment as it was.
    func append(_ bytes: UnsafeRawBufferPointer, sync: Bool) throws(EngineError) {
        var done = 0
        while done < bytes.count {
            let n = pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t(size + done))
            if n < 0, errno == EINTR { continue }
            guard n > 0 else {
                let error = EngineError.errno("cannot write \(path)")
                ftruncate(fd, off_t(size))
                throw error
            }
            done += n
        }
        if sync, fdatasync(fd) != 0 {
            let error = EngineError.errno("cannot sync \(path)")
            ftruncate(fd, off_t(size))
            fdatasync(fd)
            syncFailure = error
            throw error
        }
        size += bytes.count
    }

    func append(_ bytes: [UInt8], sync: Bool) throws(EngineError) {
        var failure: EngineError?
        bytes.withUnsafeBytes { bytes in
            do throws(EngineError) { try append(bytes, sync: sync) } catch { failure = error }
        }
        if let failure { throw failure }
    }

    func sync() throws(EngineError) {
        guard fdatasync(fd) == 0 else { throw EngineError.errno("cannot sync \(path)") }
    }
}
