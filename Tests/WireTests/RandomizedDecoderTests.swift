import Foundation
import NIOCore
import Testing
import TestSupport
import Wire

/// Feeds random and mutated frames to the decoder. It must never crash or hang, must only ever throw
/// `WireError` (the decoding functions declare `throws(WireError)`, so the compiler holds that part), and
/// whatever it accepts must encode back to a message that decodes to the same thing.
///
/// The seed is printed; replay a failure with STOREBROKER_TEST_SEED=<seed>. STOREBROKER_FUZZ_INPUTS sets
/// the number of inputs (default 100,000).
@Suite struct RandomizedDecoderTests {
    @Test func randomAndMutatedFramesOnlyEverYieldTypedErrors() throws {
        let environment = ProcessInfo.processInfo.environment
        let seed = SeededGenerator.seedFromEnvironment()
        let inputs = environment["STOREBROKER_FUZZ_INPUTS"].flatMap { Int($0) } ?? 100_000
        print("RandomizedDecoderTests: seed \(seed) (replay with STOREBROKER_TEST_SEED=\(seed)), \(inputs) inputs")
        var rng = SeededGenerator(state: seed)

        let corpus = try samples.map {
            try $0.message.encoded(id: $0.id, maxFrameLength: $0.maxFrameLength ?? WireProtocol.defaultMaxFrameLength)
        }
        var accepted = 0
        var refused: [ErrorCode: Int] = [:]
        for index in 0..<inputs {
            let input = Self.makeInput(index: index, corpus: corpus, rng: &rng)
            do {
                accepted += try Self.decodeEverything(input)
            } catch {
                refused[error.code, default: 0] += 1
            }
        }
        print("RandomizedDecoderTests: \(accepted) messages accepted; refused: \(refused.map { "\($0.key.name) \($0.value)" }.sorted())")
        #expect(refused.values.reduce(0, +) > inputs / 2, "most random input must be refused")
        #expect(accepted > 0, "some mutations stay valid")
    }

    /// Half the inputs mutate a valid encoding; the other half are random headers and random bytes.
    static func makeInput(index: Int, corpus: [ByteBuffer], rng: inout SeededGenerator) -> ByteBuffer {
        if index % 2 == 0 {
            var bytes = Array(corpus[Int.random(in: 0..<corpus.count, using: &rng)].readableBytesView)
            for _ in 0..<Int.random(in: 1...4, using: &rng) {
                switch Int.random(in: 0..<6, using: &rng) {
                case 0 where !bytes.isEmpty:  // flip a byte
                    bytes[Int.random(in: 0..<bytes.count, using: &rng)] ^= UInt8.random(in: 1...255, using: &rng)
                case 1 where !bytes.isEmpty:  // cut the end
                    bytes.removeLast(Int.random(in: 1...bytes.count, using: &rng))
                case 2:  // insert random bytes
                    let at = Int.random(in: 0...bytes.count, using: &rng)
                    bytes.insert(
                        contentsOf: (0..<Int.random(in: 1...8, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) },
                        at: at)
                case 3 where bytes.count >= 4:  // make the length field agree with the (mutated) payload
                    let length = UInt32(max(0, bytes.count - 12))
                    bytes[0] = UInt8(length >> 24)
                    bytes[1] = UInt8(truncatingIfNeeded: length >> 16)
                    bytes[2] = UInt8(truncatingIfNeeded: length >> 8)
                    bytes[3] = UInt8(truncatingIfNeeded: length)
                case 4 where bytes.count > 16:  // overwrite a 32-bit field inside the payload with a large count
                    let at = Int.random(in: 12..<(bytes.count - 4), using: &rng)
                    for k in 0..<4 { bytes[at + k] = [0x7F, 0xFF, 0xFF, 0xFF, 0x00][Int.random(in: 0..<5, using: &rng)] }
                default:  // duplicate: two frames back to back
                    bytes += bytes
                }
            }
            return ByteBuffer(bytes: bytes)
        } else {
            let types = MessageType.allCases.map(\.rawValue)
            let payloadLength = Int.random(in: 0...64, using: &rng)
            var out = ByteBuffer()
            out.writeMultipleIntegers(
                Int.random(in: 0..<8, using: &rng) == 0 ? UInt32.random(in: 0...UInt32.max, using: &rng) : UInt32(payloadLength),
                Int.random(in: 0..<8, using: &rng) == 0 ? UInt8.random(in: 0...255, using: &rng) : types.randomElement(using: &rng)!,
                Int.random(in: 0..<8, using: &rng) == 0 ? UInt8.random(in: 0...255, using: &rng) : 0,
                UInt16(0), UInt32.random(in: 0...5, using: &rng))
            for _ in 0..<payloadLength { out.writeInteger(UInt8.random(in: 0...255, using: &rng)) }
            return out
        }
    }

    /// Decodes every frame of `input` as a peer would; re-encodes what it accepts and checks it decodes the same.
    static func decodeEverything(_ input: ByteBuffer) throws(WireError) -> Int {
        var buffer = input
        let decoder = FrameDecoder(maxFrameLength: 64 * 1024)
        var assembler = ServerMessageAssembler()
        var accepted = 0
        while let frame = try decoder.decode(&buffer) {
            if frame.header.type < 0x40 {
                let message = try ClientMessage(frame: frame)
                var again = ByteBuffer()
                try message.encode(id: frame.header.id, into: &again)
                let reread = try ClientMessage(frame: try decoder.decode(&again)!)
                precondition(reread == message, "client message does not survive re-encoding: \(message)")
                accepted += 1
            } else if let message = try assembler.receive(frame) {
                var again = ByteBuffer()
                try message.encode(id: frame.header.id, maxFrameLength: 64 * 1024, into: &again)
                var check = ServerMessageAssembler()
                var reread: ServerMessage?
                while let f = try decoder.decode(&again) { reread = try check.receive(f) ?? reread }
                precondition(reread == message, "server message does not survive re-encoding: \(message)")
                accepted += 1
            }
        }
        return accepted
    }
}
