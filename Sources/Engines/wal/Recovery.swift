import StorageEngineKit
import WALFormat

#if canImport(Glibc)
import Glibc
#endif

/// A snapshot file of the store: every item at `sequence`.
struct SnapshotInfo: Sendable {
    var path: String
    var sequence: UInt64
    var bytes: Int
}

/// Opening a store's directory: what a crash left is made whole or refused.
///
/// - `*.tmp` files are snapshots that were never finished: deleted.
/// - The newest snapshot is the base; older ones, and segments whose records it holds, were about to be
///   deleted: they are left alone, for the next snapshot to delete once it has read the newest whole.
/// - The segments that follow chain: each starts one after the last sequence before it, and their records'
///   sequences increase. The first record that does not check out ends the log and is cut off with all after
///   it: it was being written when the process died or the power went, and was never synced (FULL syncs each
///   record before its apply returns and a segment before the next starts; NORMAL syncs a closed segment, then
///   the directory, before the next segment's records). Later segments must hold no whole record (they are
///   deleted); one that does makes the cut damage, and the open fails.
/// - A store with no segment gets its first one.
enum Recovery {
    struct Recovered {
        var snapshot: SnapshotInfo?
        /// Closed segments not yet in a snapshot, oldest first.
        var sealed: [LogSegment]
        /// The newest segment, cut to its last whole record: applies append here.
        var current: LogSegment
        /// The last sequence recorded.
        var sequence: UInt64
    }

    static func run(directory: String) throws(EngineError) -> Recovered {
        let names = try Files.list(directory)
        for name in names where name.hasSuffix(".tmp") { try Files.remove(directory + "/" + name) }

        var snapshot: SnapshotInfo?
        let snapshots = names.compactMap { WALFormat.sequence(inName: $0, prefix: "snapshot-") }.sorted()
        if let newest = snapshots.last {
            let path = directory + "/" + WALFormat.snapshotName(sequence: newest)
            let file = try SnapshotFile(path)
            guard file.sequence == newest else { throw EngineError.corrupt("\(path) holds sequence \(file.sequence)") }
            snapshot = SnapshotInfo(path: path, sequence: newest, bytes: file.mapping.bytes.count)
        }
        let base = snapshot?.sequence ?? 0

        // Older snapshots and the segments the newest holds stay until the next snapshot has read the newest
        // whole (its checksum checked): were it damaged, they are what is left to recover from by hand. A
        // snapshot always ends where a segment does, so a segment is held whole when the next one starts at or
        // before the snapshot's sequence + 1, or when it is the last and starts at or before that sequence (a
        // close folded it in and died before deleting it).
        var firsts = names.compactMap { WALFormat.sequence(inName: $0, prefix: "log-") }.sorted()
        while firsts.count >= 2, firsts[1] <= base + 1 { firsts.removeFirst() }
        if let last = firsts.last, firsts.count == 1, last <= base, base > 0 { firsts = [] }
        guard let first = firsts.first else {
            return Recovered(
                snapshot: snapshot, sealed: [], current: try LogSegment.create(directory: directory, first: base + 1),
                sequence: base)
        }
        guard first == base + 1 else {
            throw EngineError.corrupt(
                "\(directory): the log starts at sequence \(first), after \(base): the commits between are missing")
        }

        // What each segment holds: its whole records' end, and why it stops there if not at a clean end.
        struct Scan {
            var first: UInt64
            var path: String
            /// The header is whole.
            var headed: Bool
            var end: Int
            var wholeRecords: Int
            var stop: String?
        }
        var sequence = base
        var scans: [Scan] = []
        var leftovers: [String] = []
        for first in firsts {
            let path = directory + "/" + WALFormat.logName(first: first)
            let mapping = try Mapping(path)
            // A segment starting inside the log before it is what a rotation that failed after creating it left:
            // it holds nothing (the log went on in the segment before), else the log is damaged.
            if first <= sequence, scans.last?.stop == nil {
                guard case .end = LogRecord.read(mapping.bytes, at: min(WALFormat.logHeaderSize, mapping.bytes.count))
                else { throw EngineError.corrupt("\(path) starts at sequence \(first), inside the log before it") }
                leftovers.append(path)
                continue
            }
            // After a segment that stops short the chain is broken by the cut: what follows must hold nothing.
            guard first == sequence + 1 || scans.last?.stop != nil else {
                throw EngineError.corrupt("\(path) starts at sequence \(first), but the log before it ends at \(sequence)")
            }
            let bytes = mapping.bytes
            let header = WALFormat.logHeader(first: first)
            guard bytes.count >= header.count, bytes.prefix(header.count).elementsEqual(header) else {
                // A segment cut short while it was created (its header never synced) holds nothing.
                guard bytes.prefix(header.count).allSatisfy({ $0 == 0 }) else {
                    throw EngineError.corrupt("\(path) is not a wal log segment starting at sequence \(first)")
                }
                scans.append(Scan(first: first, path: path, headed: false, end: 0, wholeRecords: 0, stop: "no header"))
                continue
            }
            var scan = Scan(first: first, path: path, headed: true, end: header.count, wholeRecords: 0)
            reading: while true {
                switch LogRecord.read(bytes, at: scan.end) {
                case .end:
                    break reading
                case .bad(let why):
                    scan.stop = "\(why) at byte \(scan.end)"
                    break reading
                case .record(let record):
                    guard record.sequence > sequence else {
                        throw EngineError.corrupt("\(path): sequence \(record.sequence) after \(sequence) at byte \(scan.end)")
                    }
                    sequence = record.sequence
                    scan.end = record.end
                    scan.wholeRecords += 1
                }
            }
            scans.append(scan)
        }
        // The log ends at the first segment that stops short, provided no later one holds a whole record: those
        // were created after it and never synced (NORMAL syncs a closed segment before the next one's records).
        // A segment that stops short with whole records after it is damage.
        if let short = scans.firstIndex(where: { $0.stop != nil }) {
            if let later = scans[(short + 1)...].first(where: { $0.wholeRecords > 0 }) {
                throw EngineError.corrupt("\(scans[short].path): \(scans[short].stop!), but \(later.path) holds records after it")
            }
            for unsynced in scans[(short + 1)...] { try Files.remove(unsynced.path) }
            scans.removeSubrange((short + 1)...)
        }
        for leftover in leftovers { try Files.remove(leftover) }
        var segments: [LogSegment] = []
        for scan in scans {
            let segment = try LogSegment.open(path: scan.path, first: scan.first, validEnd: scan.end)
            if !scan.headed { try segment.append(WALFormat.logHeader(first: scan.first), sync: true) }
            segments.append(segment)
        }
        // What a killed process left in the page cache (a NORMAL tail, a segment whose name was never synced) is
        // made durable, with the removals above, before anything is written after it: a FULL apply must never
        // sit behind bytes a power cut could still take.
        for segment in segments { try segment.sync() }
        try Files.syncDirectory(directory)
        let current = segments.removeLast()
        return Recovered(snapshot: snapshot, sealed: segments, current: current, sequence: sequence)
    }
}
