import CStorageEngine
import StorageEngineKit

/// Encodes an apply as one log record in a buffer it keeps between applies.
package struct RecordEncoder {
    private var storage: UnsafeMutableRawPointer?
    private var capacity = 0

    package init() {}

    /// The record, after checking every step (key, kind, the injected failure): a refused apply writes nothing.
    package mutating func encode(
        _ steps: UnsafeBufferPointer<sb_step>, sequence: UInt64, failure: FailureInjection
    ) throws(EngineError) -> UnsafeRawBufferPointer {
        var size = WALFormat.recordHeaderSize + 12
        for (index, step) in steps.enumerated() {
            try failure.check(stepIndex: index)
            try step.checkKey()
            switch Int(step.kind) {
            case SB_STEP_PUT:
                guard step.payload.length <= Int(UInt32.max) else {
                    throw EngineError.invalid("a payload of \(step.payload.length) bytes")
                }
                size += 25 + step.key.length + step.payload.length
            case SB_STEP_REMOVE: size += 5 + step.key.length
            case SB_STEP_REMOVE_ALL: size += 1
            default: throw EngineError.invalid("unknown step kind \(step.kind)")
            }
        }
        guard steps.count <= Int(UInt32.max) else { throw EngineError.invalid("an apply of \(steps.count) steps") }
        if capacity < size {
            storage?.deallocate()
            capacity = max(size, 64 * 1024)
            storage = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 8)
        }
        let base = storage!
        var offset = 0
        func put<T: FixedWidthInteger>(_ value: T) {
            base.storeBytes(of: value.littleEndian, toByteOffset: offset, as: T.self)
            offset += MemoryLayout<T>.size
        }
        func put(_ bytes: sb_bytes) {
            if bytes.length > 0 { (base + offset).copyMemory(from: bytes.data!, byteCount: bytes.length) }
            offset += bytes.length
        }
        put(UInt64(size - WALFormat.recordHeaderSize))
        put(UInt32(0))
        put(sequence)
        put(UInt32(steps.count))
        for step in steps {
            put(UInt8(step.kind))
            switch Int(step.kind) {
            case SB_STEP_PUT:
                put(UInt32(step.key.length))
                put(UInt32(step.payload.length))
                put(step.created_at)
                put(step.updated_at)
                put(step.key)
                put(step.payload)
            case SB_STEP_REMOVE:
                put(UInt32(step.key.length))
                put(step.key)
            default: break
            }
        }
        let body = UnsafeRawBufferPointer(start: base + WALFormat.recordHeaderSize, count: size - WALFormat.recordHeaderSize)
        base.storeBytes(of: CRC32C.checksum(body).littleEndian, toByteOffset: 8, as: UInt32.self)
        return UnsafeRawBufferPointer(start: base, count: size)
    }

    /// Gives back a buffer a large apply grew (a commit group may hold hundreds of MiB).
    package mutating func shrink() {
        if capacity > 16 << 20 { release() }
    }

    package mutating func release() {
        storage?.deallocate()
        storage = nil
        capacity = 0
    }
}
