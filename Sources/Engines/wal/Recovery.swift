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
/// - The newest snapshot is the base; older ones, and segments whose records it holds (the next segment starts
///   at or before its sequence + 1), were about to be deleted: deleted.
/// - The segments that follow chain: each starts one after the last sequence before it, and their records'
///   sequences increase. A record that does not check out in any segment but the newest is damage. In the
///   newest, the first such record ends the log and is cut off with all after it: it was being written when
///   the process died or the power went, and was never acknowledged as synced (a segment is synced whole before
///   the next one starts).
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
            for older in snapshots.dropLast() { try Files.remove(directory + "/" + WALFormat.snapshotName(sequence: older)) }
        }
        let base = snapshot?.sequence ?? 0

        var firsts = names.compactMap { WALFormat.sequence(inName: $0, prefix: "log-") }.sorted()
        while firsts.count >= 2, firsts[1] <= base + 1 {
            try Files.remove(directory + "/" + WALFormat.logName(first: firsts.removeFirst()))
        }
        guard let first = firsts.first else {
            return Recovered(
                snapshot: snapshot, sealed: [], current: try LogSegment.create(directory: directory, first: base + 1),
                sequence: base)
        }
        guard first == base + 1 else {
            throw EngineError.corrupt(
                "\(directory): the log starts at sequence \(first), after \(base): the commits between are missing")
        }

        var sequence = base
        var segments: [LogSegment] = []
        for (index, first) in firsts.enumerated() {
            let path = directory + "/" + WALFormat.logName(first: first)
            let newest = index == firsts.count - 1
            guard first == sequence + 1 else {
                throw EngineError.corrupt("\(path) starts at sequence \(first), but the log before it ends at \(sequence)")
            }
            let mapping = try Mapping(path)
            let bytes = mapping.bytes
            let header = WALFormat.logHeader(first: first)
            guard bytes.count >= header.count, bytes.prefix(header.count).elementsEqual(header) else {
                // Only the newest segment can have been cut short while it was created.
                guard newest, bytes.prefix(header.count).allSatisfy({ $0 == 0 }) else {
                    throw EngineError.corrupt("\(path) is not a wal log segment starting at sequence \(first)")
                }
                let segment = try LogSegment.open(path: path, first: first, validEnd: 0)
                try segment.append(header, sync: true)
                segments.append(segment)
                continue
            }
            var offset = header.count
            reading: while true {
                switch LogRecord.read(bytes, at: offset) {
                case .end:
                    break reading
                case .bad(let why):
                    guard newest else { throw EngineError.corrupt("\(path): \(why) at byte \(offset)") }
                    break reading
                case .record(let record):
                    guard record.sequence > sequence else {
                        throw EngineError.corrupt("\(path): sequence \(record.sequence) after \(sequence) at byte \(offset)")
                    }
                    sequence = record.sequence
                    offset = record.end
                }
            }
            segments.append(try LogSegment.open(path: path, first: first, validEnd: offset))
        }
        let current = segments.removeLast()
        return Recovered(snapshot: snapshot, sealed: segments, current: current, sequence: sequence)
    }
}
