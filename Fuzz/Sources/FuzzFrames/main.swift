import FuzzSupport

/// Bytes as a stream of frames: the frame decoder, then each frame's message decoders.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzFrames(_ data: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let start = data else { return 0 }
    var buffer = ByteBuffer(bytes: UnsafeRawBufferPointer(start: start, count: count))
    let decoder = FrameDecoder(maxFrameLength: 1 << 20)
    while let frame = try? decoder.decode(&buffer) {
        Check.decodeBothWays(frame)
    }
    return 0
}

/// SwiftPM links an executable's `main` to this symbol (libFuzzer brings a `main` of its own, which calls
/// `LLVMFuzzerTestOneInput` the same way); libFuzzer's driver takes over from here.
@_cdecl("FuzzFrames_main")
public func entry(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>) -> CInt {
    runFuzzer(argc, argv) { fuzzFrames($0, $1) }
}
