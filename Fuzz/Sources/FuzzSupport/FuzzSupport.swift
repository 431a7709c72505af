import CFuzzerDriver
@_exported import NIOCore
@_exported import Wire

/// Runs libFuzzer with `argv`'s flags on `target`: the body of each fuzz target's `main`.
public func runFuzzer(
    _ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>,
    _ target: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt {
    var count = argc
    var arguments: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = argv
    return LLVMFuzzerRunDriver(&count, &arguments, target)
}

/// The properties every target checks on what it decoded: a message that decodes encodes again, and decodes
/// to itself. A violation stops the fuzzer (`preconditionFailure`) with the input saved as a crash.
public enum Check {
    public static func roundTrip(_ message: ClientMessage, id: UInt32) {
        var out = ByteBuffer()
        do {
            try message.encode(id: id, into: &out)
        } catch {
            // A decoded request too large to send back in one frame of the default size is possible only past
            // 16 MiB; inputs are far smaller.
            preconditionFailure("a decoded \(message.type.name) does not encode: \(error)")
        }
        guard let frame = try? FrameDecoder(maxFrameLength: WireProtocol.defaultMaxFrameLength).decode(&out),
            let again = try? ClientMessage(frame: frame)
        else { preconditionFailure("an encoded \(message.type.name) does not decode") }
        precondition(again == message, "\(message.type.name) changed in a round trip")
    }

    public static func roundTrip(_ message: ServerMessage, id: UInt32) {
        var out = ByteBuffer()
        do {
            try message.encode(id: id, maxFrameLength: WireProtocol.defaultMaxFrameLength, into: &out)
        } catch {
            preconditionFailure("a decoded \(message.type.name) does not encode: \(error)")
        }
        let decoder = FrameDecoder(maxFrameLength: WireProtocol.defaultMaxFrameLength)
        while out.readableBytes > 0 {
            guard let frame = try? decoder.decode(&out), (try? ServerMessage(frame: frame)) != nil else {
                preconditionFailure("an encoded \(message.type.name) does not decode")
            }
        }
    }

    /// Decodes `frame` both ways (a client's request, a server's answer), checking what decodes.
    public static func decodeBothWays(_ frame: Frame) {
        if let message = try? ClientMessage(frame: frame) { roundTrip(message, id: frame.header.id) }
        if let message = try? ServerMessage(frame: frame) { roundTrip(message, id: frame.header.id) }
    }
}
