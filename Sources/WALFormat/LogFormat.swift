import CStorageEngine
import StorageEngineKit

#if canImport(Glibc)
import Glibc
#endif

// The wal engine's files (docs/ENGINE-ABI.md, "wal"). Every integer is little-endian.
//
//   log-<first sequence, 16 hex digits>   a log segment: "sbwal-l1", the first sequence it may hold (u64), then
//                                         records: body length (u64), CRC-32C of the body (u32), then the body:
//                                         the apply's sequence (u64), its step count (u32), its steps
//     a step: kind (u8); a put: key length (u32), payload length (u32), created_at (u64), updated_at (u64), key,
//     payload; a remove: key length (u32), key; a remove-all: nothing more
//   snapshot-<sequence, 16 hex digits>    every item at that sequence in the store's order: "sbwal-s1", the
//                                         sequence (u64), each item as a put's fields without the kind, then the
//                                         item count (u64), the sequence again (u64), the CRC-32C of everything
//                                         before it (u32) and "sbwal-e1"
//
// The decoding here is total: any bytes yield records, a clean end, or a reason they do not check out (the fuzz
// target `FuzzWALRecords` holds it to that, through `WALFuzzing`).

package enum WALFormat {
    package static let logMagic = Array("sbwal-l1".utf8)
    package static let snapshotMagic = Array("sbwal-s1".utf8)
    package static let snapshotEnd = Array("sbwal-e1".utf8)
    package static let logHeaderSize = 16
    package static let recordHeaderSize = 12
    package static let snapshotHeaderSize = 16
    package static let snapshotTrailerSize = 28
    package static let maximumKeyLength = Int(SB_MAX_KEY_LENGTH)

    package static func logName(first: UInt64) -> String { "log-" + hex(first) }
    package static func snapshotName(sequence: UInt64) -> String { "snapshot-" + hex(sequence) }

    /// The sequence a file name carries after `prefix` (exactly 16 lowercase hex digits), or nil.
    package static func sequence(inName name: String, prefix: String) -> UInt64? {
        guard name.hasPrefix(prefix) else { return nil }
        let digits = name.dropFirst(prefix.count)
        guard digits.count == 16, digits.allSatisfy({ $0.isHexDigit && !$0.isUppercase }) else { return nil }
        return UInt64(digits, radix: 16)
    }

    private static func hex(_ value: UInt64) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }

    package static func logHeader(first: UInt64) -> [UInt8] {
        var header = logMagic
        withUnsafeBytes(of: first.littleEndian) { header.append(contentsOf: $0) }
        return header
    }
}

/// Reads little-endian fields from bytes it does not own; every read returns nil past the end.
package struct ByteReader {
    package let bytes: UnsafeRawBufferPointer
    package var offset: Int

    package init(_ bytes: UnsafeRawBufferPointer, at offset: Int = 0) {
        self.bytes = bytes
        self.offset = offset
    }

    package var remaining: Int { bytes.count - offset }

    package mutating func take(_ count: Int) -> UnsafeRawBufferPointer? {
        guard count >= 0, count <= remaining else { return nil }
        defer { offset += count }
        return UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + count)])
    }

    package mutating func integer<T: FixedWidthInteger>(_: T.Type = T.self) -> T? {
        guard let field = take(MemoryLayout<T>.size) else { return nil }
        return T(littleEndian: field.loadUnaligned(as: T.self))
    }

    /// A put's fields (or a snapshot item): nil if short or if the key is empty or too long.
    package mutating func item() -> WALItem? {
        guard let keyLength = integer(UInt32.self), let payloadLength = integer(UInt32.self),
            let createdAt = integer(UInt64.self), let updatedAt = integer(UInt64.self),
            (1...WALFormat.maximumKeyLength).contains(Int(keyLength)),
            let key = take(Int(keyLength)), let payload = take(Int(payloadLength))
        else { return nil }
        return WALItem(key: key, payload: payload, createdAt: createdAt, updatedAt: updatedAt)
    }

    package mutating func step() -> LogStep? {
        switch integer(UInt8.self).map(Int.init) {
        case SB_STEP_PUT: item().map(LogStep.put)
        case SB_STEP_REMOVE:
            integer(UInt32.self).flatMap { length in
                (1...WALFormat.maximumKeyLength).contains(Int(length)) ? take(Int(length)).map(LogStep.remove) : nil
            }
        case SB_STEP_REMOVE_ALL: .removeAll
        default: nil
        }
    }
}

/// An item as the files hold it; its bytes belong to the mapping it was read from.
package struct WALItem {
    package var key: UnsafeRawBufferPointer
    package var payload: UnsafeRawBufferPointer
    package var createdAt: UInt64
    package var updatedAt: UInt64
}

package enum LogStep {
    case put(WALItem)
    case remove(UnsafeRawBufferPointer)
    case removeAll
}

/// One whole record of a log segment.
package struct LogRecord {
    package var sequence: UInt64
    package var stepCount: Int
    /// The steps' bytes, checked to hold exactly `stepCount` well-formed steps.
    package var steps: UnsafeRawBufferPointer
    /// Where the next record starts.
    package var end: Int

    package func forEachStep(_ body: (LogStep) throws(EngineError) -> Void) throws(EngineError) {
        var reader = ByteReader(steps)
        for _ in 0..<stepCount {
            // Checked when the record was read: a step that no longer parses means the bytes moved.
            guard let step = reader.step() else { throw EngineError(Int32(SB_ERR_INTERNAL), "a checked log record no longer parses") }
            try body(step)
        }
    }
}

package enum RecordRead {
    case record(LogRecord)
    /// The segment ends here, cleanly.
    case end
    /// The bytes from here on are not a whole record: why.
    case bad(String)
}

extension LogRecord {
    /// The record at `offset` of a segment's bytes.
    package static func read(_ bytes: UnsafeRawBufferPointer, at offset: Int) -> RecordRead {
        var reader = ByteReader(bytes, at: offset)
        guard reader.remaining > 0 else { return .end }
        guard let length = reader.integer(UInt64.self), let checksum = reader.integer(UInt32.self) else {
            return .bad("a record header cut short")
        }
        guard length >= 12, length <= UInt64(reader.remaining), let body = reader.take(Int(length)) else {
            return .bad("a record of \(length) bytes where \(reader.remaining) remain")
        }
        guard CRC32C.checksum(body) == checksum else { return .bad("a record whose checksum fails") }
        var fields = ByteReader(body)
        let sequence = fields.integer(UInt64.self)!
        let stepCount = Int(fields.integer(UInt32.self)!)
        let steps = UnsafeRawBufferPointer(rebasing: body[12...])
        var walker = ByteReader(steps)
        for index in 0..<stepCount {
            guard walker.step() != nil else { return .bad("a record whose step \(index) is malformed") }
        }
        guard walker.remaining == 0 else { return .bad("a record with bytes after its last step") }
        return .record(LogRecord(sequence: sequence, stepCount: stepCount, steps: steps, end: reader.offset))
    }
}

/// A file mapped read-only, whole or its first `length` bytes; unmapped when released. Files are only appended
/// to or replaced by a rename while mapped, never cut, so a mapping never faults.
package final class Mapping {
    package let bytes: UnsafeRawBufferPointer
    package let path: String

    package init(_ path: String, length: Int? = nil) throws(EngineError) {
        self.path = path
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw EngineError.errno("cannot open \(path)") }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw EngineError.errno("cannot stat \(path)") }
        let size = min(Int(info.st_size), length ?? Int.max)
        guard size > 0 else {
            bytes = UnsafeRawBufferPointer(start: nil, count: 0)
            return
        }
        guard let base = mmap(nil, size, PROT_READ, MAP_PRIVATE, fd, 0), base != MAP_FAILED else {
            throw EngineError.errno("cannot map \(path)")
        }
        madvise(base, size, MADV_SEQUENTIAL)
        bytes = UnsafeRawBufferPointer(start: base, count: size)
    }

    deinit {
        if let base = bytes.baseAddress { munmap(UnsafeMutableRawPointer(mutating: base), bytes.count) }
    }
}

/// A snapshot file, its header and trailer checked; its items' checksum is checked as they are read.
package struct SnapshotFile {
    package let mapping: Mapping
    package let sequence: UInt64
    package let count: UInt64

    package init(_ path: String) throws(EngineError) {
        mapping = try Mapping(path)
        let bytes = mapping.bytes
        let minimum = WALFormat.snapshotHeaderSize + WALFormat.snapshotTrailerSize
        guard bytes.count >= minimum, bytes.prefix(8).elementsEqual(WALFormat.snapshotMagic),
            bytes.suffix(8).elementsEqual(WALFormat.snapshotEnd)
        else { throw EngineError.corrupt("\(path) is not a whole wal snapshot") }
        var header = ByteReader(bytes, at: 8)
        var trailer = ByteReader(bytes, at: bytes.count - WALFormat.snapshotTrailerSize)
        let sequence = header.integer(UInt64.self)!
        count = trailer.integer(UInt64.self)!
        guard trailer.integer(UInt64.self)! == sequence else {
            throw EngineError.corrupt("\(path) names two different sequences")
        }
        self.sequence = sequence
    }

    /// Every item in order, until `body` returns false (then false); fails if an item does not parse, the
    /// count disagrees or the checksum fails, which may be after some items were handed out.
    package func forEachItem(_ body: (WALItem) throws(EngineError) -> Bool) throws(EngineError) -> Bool {
        let bytes = mapping.bytes
        let itemsEnd = bytes.count - WALFormat.snapshotTrailerSize
        var reader = ByteReader(UnsafeRawBufferPointer(rebasing: bytes[..<itemsEnd]), at: WALFormat.snapshotHeaderSize)
        var checksum: UInt32 = 0
        var checked = 0
        var seen: UInt64 = 0
        while reader.remaining > 0 {
            guard let item = reader.item() else {
                throw EngineError.corrupt("\(mapping.path): item \(seen) does not parse")
            }
            seen += 1
            // The checksum follows the reading a megabyte at a time, while the bytes are still in cache.
            if reader.offset - checked >= 1 << 20 {
                checksum = CRC32C.update(checksum, UnsafeRawBufferPointer(rebasing: bytes[checked..<reader.offset]))
                checked = reader.offset
            }
            guard try body(item) else { return false }
        }
        checksum = CRC32C.update(checksum, UnsafeRawBufferPointer(rebasing: bytes[checked..<(itemsEnd + 16)]))
        var trailer = ByteReader(bytes, at: itemsEnd + 16)
        guard seen == count, trailer.integer(UInt32.self)! == checksum else {
            throw EngineError.corrupt("\(mapping.path) fails its checksum")
        }
        return true
    }
}

/// Writes a snapshot through a buffer, with its checksum; `finish` makes it durable under its final name.
package final class SnapshotWriter {
    package let temporaryPath: String
    private var fd: Int32
    private var buffer: [UInt8] = []
    private var checksum: UInt32 = 0
    private var count: UInt64 = 0
    /// The bytes written so far.
    package private(set) var written = 0

    package init(temporaryPath: String, sequence: UInt64) throws(EngineError) {
        self.temporaryPath = temporaryPath
        fd = open(temporaryPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw EngineError.errno("cannot create \(temporaryPath)") }
        buffer.reserveCapacity(1 << 20 + 64 * 1024)
        buffer.append(contentsOf: WALFormat.snapshotMagic)
        append(sequence)
    }

    private func append<T: FixedWidthInteger>(_ value: T) {
        withUnsafeBytes(of: value.littleEndian) { buffer.append(contentsOf: $0) }
    }

    package func add(_ item: WALItem) throws(EngineError) {
        append(UInt32(item.key.count))
        append(UInt32(item.payload.count))
        append(item.createdAt)
        append(item.updatedAt)
        buffer.append(contentsOf: item.key)
        buffer.append(contentsOf: item.payload)
        count += 1
        if buffer.count >= 1 << 20 { try flush() }
    }

    private func flush() throws(EngineError) {
        checksum = buffer.withUnsafeBytes { CRC32C.update(checksum, $0) }
        try Files.writeAll(fd, buffer, temporaryPath)
        written += buffer.count
        buffer.removeAll(keepingCapacity: true)
    }

    /// Writes the trailer, syncs, and renames the file to `path`; the caller syncs the directory.
    package func finish(sequence: UInt64, as path: String) throws(EngineError) {
        append(count)
        append(sequence)
        checksum = buffer.withUnsafeBytes { CRC32C.update(checksum, $0) }
        append(checksum)
        buffer.append(contentsOf: WALFormat.snapshotEnd)
        try Files.writeAll(fd, buffer, temporaryPath)
        written += buffer.count
        buffer = []
        guard fdatasync(fd) == 0 else { throw EngineError.errno("cannot sync \(temporaryPath)") }
        close(fd)
        fd = -1
        guard rename(temporaryPath, path) == 0 else { throw EngineError.errno("cannot rename \(temporaryPath)") }
    }

    /// Gives up: the file is closed and deleted.
    package func abandon() {
        if fd >= 0 { close(fd) }
        fd = -1
        unlink(temporaryPath)
    }
}
