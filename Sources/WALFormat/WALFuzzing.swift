import CStorageEngine
import StorageEngineKit

/// What the fuzz target `FuzzWALRecords` checks on any bytes read as a log segment: reading never crashes and
/// ends in a clean end or a reason; every record read holds steps that parse; encoding a record's steps again
/// gives the record's bytes exactly; and the log's effects merge. A violation stops the fuzzer.
public enum WALFuzzing {
    public static func check(_ bytes: UnsafeRawBufferPointer) {
        var effects = LogEffects()
        var encoder = RecordEncoder()
        defer { encoder.release() }
        var offset = 0
        reading: while true {
            switch LogRecord.read(bytes, at: offset) {
            case .end, .bad: break reading
            case .record(let record):
                var steps: [LogStep] = []
                do throws(EngineError) {
                    try record.forEachStep { steps.append($0) }
                } catch {
                    preconditionFailure("a record that was read has a step that does not parse: \(error)")
                }
                let again = encoded(steps, sequence: record.sequence, with: &encoder)
                precondition(
                    again.elementsEqual(UnsafeRawBufferPointer(rebasing: bytes[offset..<record.end])),
                    "a record encodes to other bytes")
                for step in steps { effects.apply(step) }
                precondition(record.end > offset, "a record of no bytes")
                offset = record.end
            }
        }
        do throws(EngineError) {
            _ = try effects.merge(into: nil) { _ in true }
        } catch {
            preconditionFailure("the effects of records that were read do not merge: \(error)")
        }
    }

    private static func encoded(_ steps: [LogStep], sequence: UInt64, with encoder: inout RecordEncoder) -> [UInt8] {
        func bytes(_ buffer: UnsafeRawBufferPointer) -> sb_bytes {
            sb_bytes(data: buffer.baseAddress?.assumingMemoryBound(to: UInt8.self), length: buffer.count)
        }
        let table = steps.map { step -> sb_step in
            var entry = sb_step()
            switch step {
            case .put(let item):
                entry.kind = UInt32(SB_STEP_PUT)
                entry.key = bytes(item.key)
                entry.payload = bytes(item.payload)
                entry.created_at = item.createdAt
                entry.updated_at = item.updatedAt
            case .remove(let key):
                entry.kind = UInt32(SB_STEP_REMOVE)
                entry.key = bytes(key)
            case .removeAll:
                entry.kind = UInt32(SB_STEP_REMOVE_ALL)
            }
            return entry
        }
        var bytes: [UInt8] = []
        table.withUnsafeBufferPointer { table in
            do throws(EngineError) {
                bytes = Array(try encoder.encode(table, sequence: sequence, failure: try FailureInjection(options: [:])))
            } catch {
                preconditionFailure("steps that were read do not encode: \(error)")
            }
        }
        return bytes
    }
}
