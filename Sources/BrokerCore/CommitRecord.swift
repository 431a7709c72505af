import NIOCore
import StoreModel

/// A commit's steps as a shared engine's commit log keeps them (ABI 2.1 `sb_commit.record`): the bytes another
/// broker reads back to apply the commit to its memory and hand its subscribers the same event. The engine
/// never reads them. All integers big-endian:
///
///     u8 format (1), u32 step count, then per step:
///       u8 kind (1 insert, 2 remove), u32 count, then per record
///         insert: u32 id length, id (UTF-8), u32 payload length, payload, u64 created at, u64 updated at
///         remove: u32 id length, id (UTF-8)
enum CommitRecord {
    static let format: UInt8 = 1

    static func encode(_ steps: [EventStep]) -> [UInt8] {
        var size = 5
        for step in steps {
            size += 5
            switch step {
            case .insert(let records):
                for index in records.indices { size += 24 + records[index].id.utf8Count + records[index].payload.count }
            case .remove(let ids):
                for id in ids { size += 4 + id.utf8Count }
            }
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(size)
        bytes.append(format)
        append(UInt32(steps.count), to: &bytes)
        for step in steps {
            switch step {
            case .insert(let records):
                bytes.append(1)
                append(UInt32(records.count), to: &bytes)
                for index in records.indices {
                    records[index].id.withUTF8 { append($0, to: &bytes) }
                    records[index].payload.withUnsafeReadableBytes { append($0, to: &bytes) }
                    append(records[index].createdAt, to: &bytes)
                    append(records[index].updatedAt, to: &bytes)
                }
            case .remove(let ids):
                bytes.append(2)
                append(UInt32(ids.count), to: &bytes)
                for id in ids { id.withUTF8 { append($0, to: &bytes) } }
            }
        }
        return bytes
    }

    /// The steps, or an error naming what is wrong (a record this broker cannot read is never half-applied).
    static func decode(_ bytes: UnsafeRawBufferPointer, store: String, sequence: UInt64) throws(BrokerError) -> [EventStep] {
        var reader = Reader(bytes: bytes)
        func corrupt(_ what: String) -> BrokerError {
            BrokerError(.engineError, "the commit log's record of store \(store) sequence \(sequence) is unreadable: \(what)")
        }
        guard let format = reader.byte(), format == Self.format else { throw corrupt("format \(bytes.first.map(String.init) ?? "none")") }
        guard let stepCount = reader.uint32() else { throw corrupt("cut short") }
        var steps: [EventStep] = []
        steps.reserveCapacity(Int(min(stepCount, 1024)))
        for _ in 0..<stepCount {
            guard let kind = reader.byte(), let count = reader.uint32() else { throw corrupt("cut short") }
            switch kind {
            case 1:
                var records: [ItemRecord] = []
                records.reserveCapacity(Int(min(count, 65536)))
                for _ in 0..<count {
                    guard let id = reader.chunk(), let payload = reader.chunk(), let created = reader.uint64(),
                        let updated = reader.uint64()
                    else { throw corrupt("cut short") }
                    guard ItemID.isValidUTF8(id) else { throw corrupt("an id that is not UTF-8") }
                    let item = KeptItem.make(id: id, payload: payload)
                    records.append(
                        ItemRecord(id: ItemID(kept: item), createdAt: created, updatedAt: updated, payload: Payload(kept: item)))
                }
                steps.append(.insert(records: records))
            case 2:
                var ids: [ItemID] = []
                ids.reserveCapacity(Int(min(count, 65536)))
                for _ in 0..<count {
                    guard let id = reader.chunk() else { throw corrupt("cut short") }
                    guard ItemID.isValidUTF8(id) else { throw corrupt("an id that is not UTF-8") }
                    ids.append(ItemID(validatedUTF8: ByteBuffer(bytes: id)))
                }
                steps.append(.remove(ids: ids))
            default:
                throw corrupt("step kind \(kind)")
            }
        }
        guard reader.atEnd else { throw corrupt("bytes after the last step") }
        return steps
    }

    /// A value's change (a namespace's commit): `u8 format (2), u32 key length, key, payload` (the payload as the
    /// namespace's engine store keeps it, sealed for a secure value).
    static let valueFormat: UInt8 = 2

    static func encodeValue(key: [UInt8], payload: ByteBuffer) -> [UInt8] {
        var bytes: [UInt8] = [valueFormat]
        bytes.reserveCapacity(5 + key.count + payload.readableBytes)
        key.withUnsafeBytes { append($0, to: &bytes) }
        payload.withUnsafeReadableBytes { bytes.append(contentsOf: $0) }
        return bytes
    }

    static func decodeValue(_ bytes: UnsafeRawBufferPointer, sequence: UInt64) throws(BrokerError) -> (key: [UInt8], payload: ByteBuffer) {
        var reader = Reader(bytes: bytes)
        guard reader.byte() == valueFormat, let key = reader.chunk() else {
            throw BrokerError(.engineError, "the commit log's record of a value at commit \(sequence) is unreadable")
        }
        return (Array(key), ByteBuffer(bytes: UnsafeRawBufferPointer(rebasing: bytes[reader.offset...])))
    }

    private static func append<T: FixedWidthInteger>(_ value: T, to bytes: inout [UInt8]) {
        withUnsafeBytes(of: value.bigEndian) { bytes.append(contentsOf: $0) }
    }

    private static func append(_ chunk: UnsafeRawBufferPointer, to bytes: inout [UInt8]) {
        append(UInt32(chunk.count), to: &bytes)
        bytes.append(contentsOf: chunk)
    }

    private struct Reader {
        let bytes: UnsafeRawBufferPointer
        var offset = 0

        var atEnd: Bool { offset == bytes.count }

        mutating func byte() -> UInt8? {
            guard offset < bytes.count else { return nil }
            defer { offset += 1 }
            return bytes[offset]
        }

        mutating func integer<T: FixedWidthInteger>(_: T.Type) -> T? {
            let size = MemoryLayout<T>.size
            guard bytes.count - offset >= size else { return nil }
            var value: T = 0
            for index in offset..<(offset + size) { value = value << 8 | T(bytes[index]) }
            offset += size
            return value
        }

        mutating func uint32() -> UInt32? { integer(UInt32.self) }
        mutating func uint64() -> UInt64? { integer(UInt64.self) }

        mutating func chunk() -> UnsafeRawBufferPointer? {
            guard let length = uint32(), bytes.count - offset >= Int(length) else { return nil }
            defer { offset += Int(length) }
            return UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + Int(length))])
        }
    }
}
