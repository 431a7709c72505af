import FuzzSupport

/// A message's payload past the frame layer: the first byte is the type, the rest the payload.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzMessages(_ data: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let start = data else { return 0 }
    let bytes = UnsafeRawBufferPointer(start: start, count: count)
    guard let type = bytes.first else { return 0 }
    let payload = ByteBuffer(bytes: bytes.dropFirst())
    for flags in [FrameFlags(), FrameFlags.more] {
        let header = FrameHeader(payloadLength: UInt32(payload.readableBytes), type: type, flags: flags, id: 7)
        Check.decodeBothWays(Frame(header: header, payload: payload))
    }
    return 0
}

/// SwiftPM links an executable's `main` to this symbol (libFuzzer brings a `main` of its own, which calls
/// `LLVMFuzzerTestOneInput` the same way); libFuzzer's driver takes over from here.
@_cdecl("FuzzMessages_main")
public func entry(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>) -> CInt {
    runFuzzer(argc, argv) { fuzzMessages($0, $1) }
}
