import FuzzSupport

/// What a client sends, as the server's session reads it: the handshake, then requests, in pieces whose sizes
/// the first byte chooses (a frame split across reads).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzServerSession(_ data: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let start = data else { return 0 }
    let bytes = UnsafeRawBufferPointer(start: start, count: count)
    guard let first = bytes.first else { return 0 }
    let piece = Int(first % 64) + 1
    var session = ServerSession()
    var input = ByteBuffer()
    var offset = 1
    while offset < bytes.count, session.state != .closed {
        let end = min(bytes.count, offset + piece)
        input.writeBytes(UnsafeRawBufferPointer(rebasing: bytes[offset..<end]))
        offset = end
        while let action = session.next(from: &input) {
            switch action {
            case .request(let id, let message): Check.roundTrip(message, id: id)
            case .reply, .refuse: break
            case .close: break
            }
        }
    }
    return 0
}

/// SwiftPM links an executable's `main` to this symbol (libFuzzer brings a `main` of its own, which calls
/// `LLVMFuzzerTestOneInput` the same way); libFuzzer's driver takes over from here.
@_cdecl("FuzzServerSession_main")
public func entry(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>) -> CInt {
    runFuzzer(argc, argv) { fuzzServerSession($0, $1) }
}
