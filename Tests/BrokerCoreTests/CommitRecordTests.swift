@testable import BrokerCore
import NIOCore
import StoreModel
import Testing

/// The record a shared engine's commit log keeps of each commit (`CommitRecord`): read back exactly, and a record
/// this broker cannot read is an error naming the store and sequence, never a partial commit.
@Suite struct CommitRecordTests {
    static let steps: [EventStep] = [
        .insert(records: [
            ItemRecord(id: "a", createdAt: 1, updatedAt: 2, payload: Payload("{\"n\":1}")),
            ItemRecord(id: "é\u{0}x", createdAt: UInt64.max, updatedAt: 0, payload: Payload("")),
        ]),
        .remove(ids: ["b", "c"]),
        .insert(records: []),
    ]

    @Test func stepsAndValueChangesReadBackExactly() throws {
        let bytes = CommitRecord.encode(Self.steps)
        let decoded = try bytes.withUnsafeBytes { try CommitRecord.decode($0, store: "s", sequence: 1) }
        #expect(decoded == Self.steps)
        let value = CommitRecord.encodeValue(key: Array("theme".utf8), payload: ByteBuffer(bytes: [0, 1, 2, 255]))
        let (key, payload) = try value.withUnsafeBytes { try CommitRecord.decodeValue($0, sequence: 7) }
        #expect(key == Array("theme".utf8) && payload == ByteBuffer(bytes: [0, 1, 2, 255]))
    }

    @Test func everyCutAndAStrangeFormatIsRefusedByName() {
        let bytes = CommitRecord.encode(Self.steps)
        // Every prefix (a record cut short), a wrong format byte, a byte too many, an id that is not UTF-8.
        var bad: [[UInt8]] = (0..<bytes.count).map { Array(bytes.prefix($0)) }
        bad.append([9] + bytes.dropFirst())
        bad.append(bytes + [0])
        bad.append(CommitRecord.encode([.remove(ids: ["x"])]).dropLast() + [0xFF])
        for record in bad {
            let error = #expect(throws: BrokerError.self) {
                _ = try record.withUnsafeBytes { try CommitRecord.decode($0, store: "notes", sequence: 42) }
            }
            #expect(error?.message.contains("store notes sequence 42") == true, "\(record.count) bytes")
        }
        #expect(throws: BrokerError.self) { _ = try [UInt8]([2, 0, 0]).withUnsafeBytes { try CommitRecord.decodeValue($0, sequence: 1) } }
    }
}
