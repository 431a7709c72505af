import NIOCore
import Testing
import Wire

/// Builds a frame by hand: header fields, then a hex payload. `length` overrides the header's length field.
func rawFrame(
    type: UInt8, flags: UInt8 = 0, reserved: UInt16 = 0, id: UInt32 = 1, payload hex: String = "",
    length: UInt32? = nil
) -> ByteBuffer {
    let payload = Hex.decode(hex)!
    var out = ByteBuffer()
    out.writeMultipleIntegers(length ?? UInt32(payload.readableBytes), type, flags, reserved, id)
    out.writeImmutableBuffer(payload)
    return out
}

/// Decodes one frame and its message the way a server (client messages) or a client (server messages) would.
func decodeAsPeer(_ bytes: ByteBuffer, fromClient: Bool, maxFrameLength: Int = WireProtocol.defaultMaxFrameLength)
    throws(WireError)
{
    var buffer = bytes
    guard let frame = try FrameDecoder(maxFrameLength: maxFrameLength).decode(&buffer) else {
        throw WireError(.malformed, "incomplete")
    }
    if fromClient {
        _ = try ClientMessage(frame: frame)
    } else {
        var assembler = ServerMessageAssembler()
        _ = try assembler.receive(frame)
    }
}

struct BadInput: CustomTestStringConvertible, Sendable {
    var what: String
    var bytes: ByteBuffer
    var fromClient: Bool = true
    var maxFrameLength: Int = WireProtocol.defaultMaxFrameLength
    var code: ErrorCode

    var testDescription: String { what }
}

let store = "0005 6e6f746573"  // text "notes"

let badInputs: [BadInput] = [
    BadInput(
        what: "length over the maximum, refused from the header alone",
        bytes: rawFrame(type: 0x10, length: 16 * 1024 * 1024), code: .frameTooLarge),
    BadInput(what: "length 0xFFFFFFFF", bytes: rawFrame(type: 0x10, length: .max), code: .frameTooLarge),
    BadInput(
        what: "over the small cap before the handshake",
        bytes: rawFrame(type: 0x01, payload: String(repeating: "00", count: 1100)),
        maxFrameLength: WireProtocol.handshakeMaxFrameLength, code: .frameTooLarge),
    BadInput(what: "reserved header bytes set", bytes: rawFrame(type: 0x10, reserved: 1), code: .malformed),
    BadInput(what: "undefined flag", bytes: rawFrame(type: 0x10, flags: 0x02), code: .invalidFlags),
    BadInput(what: "more flag on a request", bytes: rawFrame(type: 0x10, flags: 0x01), code: .invalidFlags),
    BadInput(
        what: "more flag on an answer that cannot span", bytes: rawFrame(type: 0x41, flags: 0x01), fromClient: false,
        code: .invalidFlags),
    BadInput(what: "type 0x00", bytes: rawFrame(type: 0x00), code: .unknownMessageType),
    BadInput(what: "type 0x3F", bytes: rawFrame(type: 0x3F), code: .unknownMessageType),
    BadInput(what: "type 0xC0", bytes: rawFrame(type: 0xC0), fromClient: false, code: .unknownMessageType),
    BadInput(what: "type 0xFF", bytes: rawFrame(type: 0xFF), code: .unknownMessageType),
    BadInput(what: "a server type sent by a client", bytes: rawFrame(type: 0x41), code: .unexpectedMessage),
    BadInput(
        what: "a client type sent by a server", bytes: rawFrame(type: 0x10), fromClient: false,
        code: .unexpectedMessage),
    BadInput(what: "trailing bytes after ping", bytes: rawFrame(type: 0x10, payload: "00"), code: .malformed),
    BadInput(
        what: "trailing bytes after count", bytes: rawFrame(type: 0x1B, payload: store + "ff"), code: .malformed),
    BadInput(what: "text length past the end", bytes: rawFrame(type: 0x1B, payload: "0009 6e6f"), code: .malformed),
    BadInput(what: "text cut inside its length", bytes: rawFrame(type: 0x1B, payload: "00"), code: .malformed),
    BadInput(what: "invalid UTF-8 store name", bytes: rawFrame(type: 0x1B, payload: "0002 c328"), code: .malformed),
    BadInput(
        what: "store name ASCII for eight bytes, then not UTF-8", bytes: rawFrame(type: 0x1B, payload: "0009 6162636465666768c3"),
        code: .malformed),
    BadInput(
        what: "invalid UTF-8 item id (lone continuation byte)",
        bytes: rawFrame(type: 0x15, payload: store + "00 00000001 0001 80"), code: .malformed),
    BadInput(
        what: "overlong UTF-8 encoding", bytes: rawFrame(type: 0x1B, payload: "0002 c0af"), code: .malformed),
    BadInput(
        what: "UTF-16 surrogate encoded in UTF-8", bytes: rawFrame(type: 0x1B, payload: "0003 eda080"),
        code: .malformed),
    BadInput(
        what: "id count far larger than the bytes left",
        bytes: rawFrame(type: 0x15, payload: store + "00 ffffffff 0001 61"), code: .malformed),
    BadInput(
        what: "item count larger than the bytes left",
        bytes: rawFrame(type: 0x14, payload: store + "00 00000002 0001 61 00000000"), code: .malformed),
    BadInput(
        what: "payload length past the end",
        bytes: rawFrame(type: 0x14, payload: store + "00 00000001 0001 61 00001000 7b7d"), code: .malformed),
    BadInput(
        what: "inserted item's id past the end",
        bytes: rawFrame(type: 0x14, payload: store + "00 00000001 0009 61 00000000"), code: .malformed),
    BadInput(
        what: "inserted item's id not UTF-8",
        bytes: rawFrame(type: 0x14, payload: store + "00 00000001 0001 80 00000000"), code: .malformed),
    BadInput(
        what: "inserted item's payload length cut short",
        bytes: rawFrame(type: 0x14, payload: store + "00 00000002 0001 61 00000002 7b7d 0001 62 0000"), code: .malformed),
    BadInput(
        what: "record count larger than the bytes left", bytes: rawFrame(
            type: 0x80, payload: "0000000000000001 0000000000000001 0000000000000001 7fffffff"), fromClient: false,
        code: .malformed),
    BadInput(what: "unknown condition tag", bytes: rawFrame(type: 0x16, payload: store + "09"), code: .malformed),
    BadInput(
        what: "condition cut short", bytes: rawFrame(type: 0x16, payload: store + "01 0000"), code: .malformed),
    BadInput(what: "unknown chain op", bytes: rawFrame(type: 0x18, payload: store + "00 00000001 07"), code: .malformed),
    BadInput(what: "unknown namespace", bytes: rawFrame(type: 0x20, payload: "03" + store), code: .malformed),
    BadInput(what: "unknown start tag", bytes: rawFrame(type: 0x1D, payload: "00" + store + "05"), code: .malformed),
    BadInput(what: "unknown cursor tag", bytes: rawFrame(type: 0x1A, payload: store + "02 00000000"), code: .malformed),
    BadInput(
        what: "boolean that is not 0 or 1",
        bytes: rawFrame(type: 0x45, payload: "02 0000000000000001 0000000000000001"), fromClient: false,
        code: .malformed),
    BadInput(
        what: "unknown value state", bytes: rawFrame(type: 0x83, payload: "0000000000000001 0000000000000001 03"),
        fromClient: false, code: .malformed),
    BadInput(
        what: "unknown engine status",
        bytes: rawFrame(type: 0x43, payload: "00000001 0001 61 0001 62 07 0001 0000 00000000 0000"),
        fromClient: false, code: .malformed),
    BadInput(
        what: "unknown event op", bytes: rawFrame(
            type: 0x81, payload: "0000000000000001 0000000000000001 00000001 03 00000000"), fromClient: false,
        code: .malformed),
    BadInput(what: "hello with wrong magic", bytes: rawFrame(type: 0x01, payload: "48545450 01 0001 0000"), code: .badHandshake),
    BadInput(what: "hello with no versions", bytes: rawFrame(type: 0x01, payload: "5342524b 00 0000"), code: .badHandshake),
    BadInput(
        what: "hello with 17 versions",
        bytes: rawFrame(type: 0x01, payload: "5342524b 11" + String(repeating: "0001", count: 17) + "0000"),
        code: .badHandshake),
    BadInput(
        what: "hello with a 300-byte client name",
        bytes: rawFrame(type: 0x01, payload: "5342524b 01 0001 012c" + String(repeating: "61", count: 300)),
        code: .badHandshake),
    BadInput(what: "hello cut inside the magic", bytes: rawFrame(type: 0x01, payload: "5342"), code: .badHandshake),
]

@Suite struct MalformedInputTests {
    @Test(arguments: badInputs)
    func isRefusedWithATypedError(input: BadInput) {
        do {
            try decodeAsPeer(input.bytes, fromClient: input.fromClient, maxFrameLength: input.maxFrameLength)
            Issue.record("accepted: \(input.what)")
        } catch {
            #expect(error.code == input.code, "\(input.what): \(error)")
            #expect(!error.message.isEmpty)
        }
    }

    @Test func aLengthOverTheCapIsRefusedBeforeThePayloadArrives() {
        // Only the 12 header bytes are there; the decoder must not wait for 16 MiB.
        var header = rawFrame(type: 0x10, length: 64 * 1024 * 1024)
        #expect(header.readableBytes == 12)
        #expect(throws: WireError(.frameTooLarge, "frame of 67108876 bytes is over the maximum of 16777216")) {
            try FrameDecoder(maxFrameLength: WireProtocol.defaultMaxFrameLength).decode(&header)
        }
    }

    @Test func aTruncatedFrameWaitsThenFailsAtTheEndOfTheStream() throws {
        let whole = rawFrame(type: 0x1B, payload: store)
        for cut in 0..<whole.readableBytes {
            var partial = whole.getSlice(at: 0, length: cut)!
            var decoder = FrameToMessageDecoder(maxFrameLength: WireProtocol.defaultMaxFrameLength)
            #expect(try decoder.decode(buffer: &partial) == nil)
            #expect(partial.readableBytes == cut, "nothing consumed")
            if cut > 0 {
                #expect(throws: WireError.self) { try decoder.decodeLast(buffer: &partial, seenEOF: true) }
            }
        }
    }

    @Test func aContinuationThatDoesNotMatchItsFirstFrameIsRefused() throws {
        var first = ByteBuffer()
        try ServerMessage.StoreLoaded(epoch: 1, sequence: 1, count: 0, elements: []).encodeFrame(
            id: 1, flags: .more, into: &first)
        var second = ByteBuffer()
        try ServerMessage.StoreLoaded(epoch: 2, sequence: 1, count: 0, elements: []).encodeFrame(id: 1, into: &second)
        var assembler = ServerMessageAssembler()
        let decoder = FrameDecoder(maxFrameLength: .max)
        #expect(try assembler.receive(try #require(try decoder.decode(&first))) == nil)
        #expect(throws: WireError.self) { try assembler.receive(try #require(try decoder.decode(&second))) }
    }

    @Test func anotherPushWhileASnapshotIsUnfinishedIsRefused() throws {
        var first = ByteBuffer()
        try ServerMessage.StoreLoaded(epoch: 1, sequence: 1, count: 0, elements: []).encodeFrame(
            id: 1, flags: .more, into: &first)
        var second = ByteBuffer()
        try ServerMessage.StoreEvent(epoch: 1, sequence: 2, elements: []).encodeFrame(id: 1, into: &second)
        var assembler = ServerMessageAssembler()
        let decoder = FrameDecoder(maxFrameLength: .max)
        _ = try assembler.receive(try #require(try decoder.decode(&first)))
        let error = try #require(throws: WireError.self) {
            try assembler.receive(try #require(try decoder.decode(&second)))
        }
        #expect(error.code == .unexpectedMessage)
    }

    @Test func textOver65535BytesCannotBeEncoded() {
        var out = ByteBuffer()
        let error = try? #require(throws: WireError.self) {
            try ClientMessage.count(.init(store: String(repeating: "x", count: 70_000))).encode(id: 1, into: &out)
        }
        #expect(error?.code == .malformed)
        #expect(out.readableBytes == 0)
        // An item's id too (its id and payload are written in one go, checked first).
        let item = Item(id: ItemID(String(repeating: "i", count: 70_000)), payload: Payload("{}"))
        let itemError = try? #require(throws: WireError.self) {
            try ClientMessage.insert(.init(store: "s", items: [item])).encode(id: 1, into: &out)
        }
        #expect(itemError?.code == .malformed)
        #expect(itemError?.message.contains("item id") == true)
        #expect(out.readableBytes == 0)
    }
}
