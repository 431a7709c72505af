import Foundation
import NIOCore
import Testing
import Wire

/// docs/protocol-vectors.json, checked both ways: its bytes decode to its message, and its message (read
/// from the JSON) encodes to its bytes. The file is generated from `samples`; set
/// STOREBROKER_WRITE_VECTORS=1 to write it anew after a deliberate protocol change.
@Suite struct VectorTests {
    static let fileURL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("docs/protocol-vectors.json")

    struct VectorOut: Encodable {
        var name: String
        var direction: String
        var type: String
        var typeCode: String
        var id: UInt32
        var frames: Int
        var maxFrameLength: Int?
        var hex: String
        var body: any WireMessage

        enum CodingKeys: String, CodingKey { case name, direction, type, typeCode, id, frames, maxFrameLength, hex, body }

        func encode(to encoder: any Encoder) throws {
            var c = encoder.container(keyedBy: CodingKeys.self)
            try c.encode(name, forKey: .name)
            try c.encode(direction, forKey: .direction)
            try c.encode(type, forKey: .type)
            try c.encode(typeCode, forKey: .typeCode)
            try c.encode(id, forKey: .id)
            try c.encode(frames, forKey: .frames)
            try c.encodeIfPresent(maxFrameLength, forKey: .maxFrameLength)
            try c.encode(hex, forKey: .hex)
            try c.encode(body, forKey: .body)
        }
    }

    struct FileOut: Encodable {
        var about: String
        var protocolVersion: UInt16
        var vectors: [VectorOut]
    }

    static func generate() throws -> Data {
        let vectors = try samples.map { sample in
            let bytes = try sample.message.encoded(
                id: sample.id, maxFrameLength: sample.maxFrameLength ?? WireProtocol.defaultMaxFrameLength)
            let frames = try countFrames(bytes)
            return VectorOut(
                name: sample.name, direction: sample.message.type.isFromClient ? "client" : "server",
                type: sample.message.type.name, typeCode: String(format: "0x%02X", sample.message.type.rawValue),
                id: sample.id, frames: frames, maxFrameLength: sample.maxFrameLength, hex: Hex.encode(bytes),
                body: sample.message.body)
        }
        let file = FileOut(
            about: """
                Test vectors for the storebroker protocol (docs/PROTOCOL.md). Each vector is the exact bytes \
                (hex) of one message: one frame, or several when 'frames' > 1 (sent with the 'maxFrameLength' \
                given). 'body' is the decoded message: field names as in PROTOCOL.md; payloads (bytes) as \
                lowercase hex; tagged fields as {"caseName": {fields}}, with '_0' for an unnamed field.
                """,
            protocolVersion: 1, vectors: vectors)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        return try encoder.encode(file) + Data("\n".utf8)
    }

    static func countFrames(_ bytes: ByteBuffer) throws -> Int {
        var buffer = bytes
        var count = 0
        while try FrameDecoder(maxFrameLength: .max).decode(&buffer) != nil { count += 1 }
        return count
    }

    @Test func fileIsUpToDateWithTheSamples() throws {
        let generated = try Self.generate()
        if ProcessInfo.processInfo.environment["STOREBROKER_WRITE_VECTORS"] == "1" {
            try generated.write(to: Self.fileURL)
        }
        let onDisk = try Data(contentsOf: Self.fileURL)
        #expect(
            onDisk == generated,
            "docs/protocol-vectors.json differs from the samples; run with STOREBROKER_WRITE_VECTORS=1 if intended")
    }

    static let protocolDocURL = fileURL.deletingLastPathComponent().appendingPathComponent("PROTOCOL.md")

    /// The vectors section of docs/PROTOCOL.md: each frame's header fields, then its payload.
    static func renderMarkdown() throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        var out = "\n"
        for sample in samples {
            let type = sample.message.type
            var bytes = try sample.message.encoded(
                id: sample.id, maxFrameLength: sample.maxFrameLength ?? WireProtocol.defaultMaxFrameLength)
            var frames: [Frame] = []
            while let frame = try FrameDecoder(maxFrameLength: .max).decode(&bytes) { frames.append(frame) }
            out += "### `\(sample.name)`\n\n"
            out += "`\(type.name)` (0x\(String(format: "%02X", type.rawValue))), "
            out += type.isFromClient ? "client → server" : "server → client"
            out += ", id \(sample.id)"
            if let max = sample.maxFrameLength { out += ", \(frames.count) frames with `maxFrameLength` \(max)" }
            out += "\n\n```\n"
            for frame in frames {
                let h = frame.header
                out += String(
                    format: "header  %08x %02x %02x 0000 %08x\n", h.payloadLength, h.type, h.flags.rawValue, h.id)
                let payload = Array(frame.payload.readableBytesView)
                for start in stride(from: 0, to: payload.count, by: 16) {
                    let line = payload[start..<min(start + 16, payload.count)].map { String(format: "%02x", $0) }
                    out += (start == 0 ? "payload " : "        ") + line.joined(separator: " ") + "\n"
                }
            }
            out += "```\n\n"
            out += "body: `" + String(decoding: try encoder.encode(AnyBody(body: sample.message.body)), as: UTF8.self) + "`\n\n"
        }
        return out
    }

    struct AnyBody: Encodable {
        var body: any WireMessage
        func encode(to encoder: any Encoder) throws { try body.encode(to: encoder) }
    }

    @Test func protocolDocShowsEveryVector() throws {
        let doc = try String(contentsOf: Self.protocolDocURL, encoding: .utf8)
        let begin = try #require(doc.range(of: "<!-- vectors:begin -->\n"))
        let end = try #require(doc.range(of: "<!-- vectors:end -->"))
        let current = String(doc[begin.upperBound..<end.lowerBound])
        let rendered = try Self.renderMarkdown()
        if ProcessInfo.processInfo.environment["STOREBROKER_WRITE_VECTORS"] == "1" {
            try (doc[..<begin.upperBound] + rendered + doc[end.lowerBound...]).write(
                to: Self.protocolDocURL, atomically: true, encoding: .utf8)
        } else {
            #expect(current == rendered, "docs/PROTOCOL.md's vectors are stale; run with STOREBROKER_WRITE_VECTORS=1")
        }
    }

    static func loadFile() throws -> [[String: Any]] {
        let object = try JSONSerialization.jsonObject(with: Data(contentsOf: fileURL)) as? [String: Any]
        return try #require(object?["vectors"] as? [[String: Any]], "docs/protocol-vectors.json has no vectors")
    }

    /// Reads a message body of the same type as `like` from JSON.
    func decodeBody<M: WireMessage>(like _: M, from json: Data) throws -> M {
        try JSONDecoder().decode(M.self, from: json)
    }

    @Test func everyVectorDecodesToItsBodyAndItsBodyEncodesToItsBytes() throws {
        let vectors = try Self.loadFile()
        #expect(vectors.count == samples.count)
        for vector in vectors {
            let name = vector["name"] as! String
            let bytes = try #require(Hex.decode(vector["hex"] as! String), "\(name): hex")
            // Bytes to message.
            let (id, message) = try AnyMessage.decodeOne(bytes)
            #expect(message.type.name == vector["type"] as! String, "\(name)")
            #expect(String(format: "0x%02X", message.type.rawValue) == vector["typeCode"] as! String, "\(name)")
            #expect(id == vector["id"] as! UInt32, "\(name)")
            // JSON to message: the same message.
            let bodyJSON = try JSONSerialization.data(withJSONObject: vector["body"]!)
            let fromJSON = try decodeBody(like: message.body, from: bodyJSON)
            #expect(AnyHashable(fromJSON) == AnyHashable(message.body), "\(name)")
            // Message (from JSON) to bytes: the vector's bytes.
            var out = ByteBuffer()
            let maxFrame = vector["maxFrameLength"] as? Int ?? WireProtocol.defaultMaxFrameLength
            try encodeBody(fromJSON, id: id, maxFrameLength: maxFrame, into: &out)
            #expect(out == bytes, "\(name): encoding the JSON body gives other bytes")
        }
    }

    private func encodeBody(
        _ body: any WireMessage, id: UInt32, maxFrameLength: Int, into out: inout ByteBuffer
    ) throws {
        if let splittable = body as? any SplittableMessage {
            try splittable.encodeFrames(id: id, maxFrameLength: maxFrameLength, into: &out)
        } else {
            try body.encodeFrame(id: id, maxFrameLength: maxFrameLength, into: &out)
        }
    }

    @Test func everyMessageTypeHasAVector() throws {
        let covered = Set(try Self.loadFile().map { $0["type"] as! String })
        let all = Set(MessageType.allCases.map(\.name))
        #expect(covered == all, "types without a vector: \(all.subtracting(covered).sorted())")
    }

    /// A few frames written out by hand from docs/PROTOCOL.md, independently of the encoder.
    @Test(arguments: [
        // ping, id 1: empty payload.
        ("ping", "00000000 10 00 0000 00000001"),
        // hello, id 0: magic, 1 version (1), client name "storectl".
        ("hello", "00000011 01 00 0000 00000000  5342524b 01 0001 0008 73746f726563746c"),
        // insert, id 5: store "notes", unconditional, one item n1 = {"id":"n1"}.
        (
            "insert",
            "0000001f 14 00 0000 00000005  0005 6e6f746573 00 00000001 0002 6e31 0000000b 7b226964223a226e31227d"
        ),
        // writeResult, id 5: committed, epoch 99, sequence 4.
        ("writeResult", "00000011 45 00 0000 00000005  01 0000000000000063 0000000000000004"),
        // drop-if-absent, id 9: store "notes", condition tag 2.
        ("drop-if-absent", "00000008 17 00 0000 00000009  0005 6e6f746573 02"),
    ])
    func handWrittenFrames(name: String, hex: String) throws {
        let sample = try #require(samples.first { $0.name == name })
        #expect(try sample.message.encoded(id: sample.id) == Hex.decode(hex)!)
    }
}
