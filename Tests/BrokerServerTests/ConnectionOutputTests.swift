@testable import BrokerServer
import NIOCore
import Testing
import Wire

/// The bytes owed to the socket: one write per turn, order kept around large writes, the spare's reuse.
@Suite struct ConnectionOutputTests {
    static func next(_ output: inout ConnectionOutput) throws -> ByteBuffer {
        let next = output.next()
        return try #require(next)
    }

    static func address(_ buffer: ByteBuffer) -> UInt {
        buffer.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) }
    }

    /// Small writes gather into one buffer; a large one is its own, in its place; push frames carry the
    /// subscription's id.
    @Test func smallWritesGatherAndLargeOnesKeepTheirPlace() throws {
        var output = ConnectionOutput()
        output.append(ByteBuffer(string: "a"))
        output.append(.pong(.init()), id: 9, maxFrameLength: 1 << 20)
        let large = ByteBuffer(repeating: 0x6c, count: ConnectionOutput.largeWrite)
        output.append(large)
        var push = ByteBuffer()
        try ServerMessage.pong(.init()).encode(id: 0, maxFrameLength: 1 << 20, into: &push)
        output.append(push: push, subscriptionID: 77)
        #expect(output.count == 1 + WireProtocol.headerLength + large.readableBytes + WireProtocol.headerLength)

        var first = try Self.next(&output)
        #expect(first.readString(length: 1) == "a")
        #expect(try FrameDecoder().decode(&first)?.header.id == 9)
        let second = try Self.next(&output)
        #expect(Self.address(second) == Self.address(large), "a large write was copied")
        var third = try Self.next(&output)
        #expect(try FrameDecoder().decode(&third)?.header.id == 77)
        #expect(output.next() == nil && output.count == 0)
    }

    /// A long push of short frames (a snapshot of many small items) is gathered like any write: a few buffers, not
    /// one per frame.
    @Test func aLongPushOfShortFramesIsGathered() throws {
        var push = ByteBuffer()
        for _ in 0..<2000 { try ServerMessage.pong(.init()).encode(id: 0, maxFrameLength: 1 << 20, into: &push) }
        #expect(push.readableBytes >= ConnectionOutput.largeWrite)
        var output = ConnectionOutput()
        output.append(push: push, subscriptionID: 5)
        var buffers = 0
        var decoder = FrameDecoder()
        var ids = Set<UInt32>()
        while var bytes = output.next() {
            buffers += 1
            while let frame = try decoder.decode(&bytes) { ids.insert(frame.header.id) }
        }
        #expect(buffers == 1, "\(buffers) buffers for one push")
        #expect(ids == [5])
    }

    /// The buffer a turn went out in is cleared and used for the next turn once the channel has let go of it
    /// (no allocation per read cycle); while the channel still holds it, the next writes go to storage of their
    /// own and the bytes it holds never change.
    @Test func theBufferIsReusedOnlyOnceTheChannelLetsGoOfIt() throws {
        var output = ConnectionOutput()
        func turn(_ count: Int, from first: UInt32) throws -> ByteBuffer {
            for id in first..<first + UInt32(count) { output.append(.pong(.init()), id: id, maxFrameLength: 1 << 20) }
            return try Self.next(&output)
        }
        func firstID(_ buffer: ByteBuffer) -> UInt32? { buffer.getInteger(at: buffer.readerIndex + 8, as: UInt32.self) }

        // 100 answers outgrow a new buffer's capacity: what the next turn writes into tells which buffer it is.
        var written: ByteBuffer? = try turn(100, from: 1)
        let grown = written!.capacity
        written = nil  // the channel wrote it and let go
        let held = try turn(1, from: 101)
        #expect(grown > ConnectionOutput.capacity && held.capacity == grown, "the next turn went to a new buffer")
        #expect(firstID(held) == 101)
        let heldBytes = Array(held.readableBytesView)

        let next = try turn(1, from: 102)  // `held` is still the channel's
        #expect(Self.address(next) != Self.address(held))
        #expect(firstID(next) == 102)
        #expect(Array(held.readableBytesView) == heldBytes, "bytes the channel still held were overwritten")
    }

    /// A buffer handed out is kept as the next turn's spare only up to `spareLimit`: a connection that once
    /// answered a large burst does not hold that much while it idles. (Whether the output still holds a buffer
    /// shows when the channel's copy is cleared and written: storage shared with it is copied first.)
    @Test func onlyASmallBufferIsKeptForTheNextTurn() throws {
        var output = ConnectionOutput()
        func keptAfter(pings count: UInt32) throws -> (Bool, Int) {
            for id in 0..<count { output.append(.pong(.init()), id: id, maxFrameLength: 1 << 20) }
            var written = try Self.next(&output)  // the only reference here
            let storage = Self.address(written)
            written.clear()
            written.writeInteger(UInt8(1))
            return (Self.address(written) != storage, written.capacity)
        }
        let (smallKept, smallCapacity) = try keptAfter(pings: 100)
        #expect(smallCapacity <= ConnectionOutput.spareLimit && smallKept, "a small buffer was not kept")
        let (largeKept, largeCapacity) = try keptAfter(pings: 2000)
        #expect(largeCapacity > ConnectionOutput.spareLimit)
        #expect(!largeKept, "a buffer over the limit was kept for the next turn")
    }
}
