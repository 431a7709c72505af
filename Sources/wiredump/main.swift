import Foundation
import NIOCore
import Wire

// wiredump: decodes storebroker protocol bytes and prints one JSON line per message.
//
//   wiredump [--hex] [FILE]          frames from FILE (or stdin), raw bytes or, with --hex, hex text
//   wiredump --vectors FILE          every test vector of docs/protocol-vectors.json, decoded
//
// The type byte tells who sent a frame (below 0x40: a client), so a capture of both directions decodes.
// Frames of a message that spans several are joined before it is printed. Exit status 65 on bad input.

struct DumpLine: Encodable {
    var name: String?
    var id: UInt32
    var type: String
    var body: any WireMessage

    enum CodingKeys: String, CodingKey { case name, id, type, body }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encodeIfPresent(name, forKey: .name)
        try container.encode(id, forKey: .id)
        try container.encode(type, forKey: .type)
        try container.encode(body, forKey: .body)
    }
}

struct Vector: Decodable {
    var name: String
    var hex: String
}

struct VectorFile: Decodable {
    var vectors: [Vector]
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("wiredump: \(message)\n".utf8))
    exit(65)
}

/// Decodes every frame in `bytes`, printing each whole message.
func dump(_ bytes: ByteBuffer, name: String? = nil) throws(WireError) {
    var buffer = bytes
    let decoder = FrameDecoder(maxFrameLength: WireProtocol.defaultMaxFrameLength)
    var assembler = ServerMessageAssembler()
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    while let frame = try decoder.decode(&buffer) {
        let body: any WireMessage
        if frame.header.type < 0x40 {
            body = try ClientMessage(frame: frame).body
        } else if let message = try assembler.receive(frame) {
            body = message.body
        } else {
            continue
        }
        let line = DumpLine(name: name, id: frame.header.id, type: type(of: body).type.name, body: body)
        print(String(decoding: try! encoder.encode(line), as: UTF8.self))
    }
    if buffer.readableBytes > 0 {
        throw WireError(.malformed, "the input ends inside a frame (\(buffer.readableBytes) bytes left over)")
    }
    if !assembler.isIdle {
        throw WireError(.malformed, "the input ends before the last frame of a message that spans frames")
    }
}

var arguments = Array(CommandLine.arguments.dropFirst())
if arguments.contains("--help") || arguments.contains("-h") {
    print("USAGE: wiredump [--hex] [FILE]\n       wiredump --vectors FILE")
    exit(0)
}
do {
    if let index = arguments.firstIndex(of: "--vectors") {
        guard index + 1 < arguments.count else { fail("--vectors needs a file") }
        let data = try Data(contentsOf: URL(fileURLWithPath: arguments[index + 1]))
        let file = try JSONDecoder().decode(VectorFile.self, from: data)
        for vector in file.vectors {
            guard let bytes = Hex.decode(vector.hex) else { fail("vector \(vector.name) is not hex") }
            try dump(bytes, name: vector.name)
        }
    } else {
        let hex = arguments.contains("--hex")
        arguments.removeAll { $0 == "--hex" }
        let data =
            try arguments.first.map { try Data(contentsOf: URL(fileURLWithPath: $0)) }
            ?? FileHandle.standardInput.readDataToEndOfFile()
        let bytes: ByteBuffer
        if hex {
            guard let decoded = Hex.decode(String(decoding: data, as: UTF8.self)) else { fail("input is not hex") }
            bytes = decoded
        } else {
            bytes = ByteBuffer(bytes: data)
        }
        try dump(bytes)
    }
} catch let error as WireError {
    fail("\(error)")
} catch {
    fail("\(error)")
}
