@testable import BrokerCore
@testable import BrokerServer
import NIOCore
import Testing
import Wire

/// Requests in flight: answers in request order, read-your-writes, one read at a time.
@Suite struct RequestPipelineTests {
    typealias Pipeline = RequestPipeline<String>

    /// A read behind an open write is held, and so is everything after it, until the write is answered.
    @Test func aReadWaitsForTheConnectionsEarlierWrites() {
        var pipeline = Pipeline()
        let write = pipeline.admit(id: 1)
        let writeStarts = pipeline.mayStart(isWrite: true, slot: write)
        #expect(writeStarts)
        pipeline.started(slot: write, isWrite: true)
        let read = pipeline.admit(id: 2)
        let readStarts = pipeline.mayStart(isWrite: false, slot: read)
        #expect(!readStarts)
        pipeline.hold("read", slot: read, isWrite: false)
        let laterWrite = pipeline.admit(id: 3)
        let laterStarts = pipeline.mayStart(isWrite: true, slot: laterWrite)
        #expect(!laterStarts, "a write overtook a held read")
        pipeline.hold("write", slot: laterWrite, isWrite: true)
        #expect(pipeline.held.count == 2 && pipeline.awaitingStart == nil)

        let (place, wasWrite) = pipeline.answered(slot: write)
        #expect(wasWrite)
        guard case .next(id: 1) = place else {
            Issue.record("the first answer is not next: \(place)")
            return
        }
        pipeline.removeFirst()
        let next = pipeline.nextHeld()
        #expect(next?.request == "read" && next?.slot == read)
        pipeline.started(slot: read, isWrite: false)
        let whileAwaited = pipeline.nextHeld()
        #expect(whileAwaited == nil, "a request started while a read was awaited")
        let returned = pipeline.returned(slot: read)
        let after = pipeline.nextHeld()
        #expect(returned && after?.request == "write")
    }

    /// A read is not held by a later write, nor by an earlier write already answered.
    @Test func onlyEarlierOpenWritesHoldARead() {
        var pipeline = Pipeline()
        let first = pipeline.admit(id: 1)
        pipeline.started(slot: first, isWrite: true)
        _ = pipeline.answered(slot: first)
        pipeline.removeFirst()
        let read = pipeline.admit(id: 2)
        let starts = pipeline.mayStart(isWrite: false, slot: read)
        #expect(starts)
        pipeline.started(slot: read, isWrite: false)
        let returned = (pipeline.returned(slot: read), pipeline.returned(slot: read))
        #expect(returned == (true, false), "a read returned twice, or never")
    }

    /// An answer behind an unanswered request is kept, counted, and leaves when the ones before it have.
    @Test func answersBehindAnEarlierRequestAreKeptInOrder() {
        var pipeline = Pipeline()
        let slots = (1...3).map { pipeline.admit(id: UInt32($0)) }
        for slot in slots { pipeline.started(slot: slot, isWrite: true) }
        for slot in slots.reversed().dropLast() {
            guard case .behind(let id, nil) = pipeline.answered(slot: slot).0 else {
                Issue.record("slot \(slot) is not behind")
                return
            }
            pipeline.keep(ByteBuffer(string: "answer \(id)"), slot: slot)
        }
        #expect(pipeline.readyBytes == 2 * "answer 2".utf8.count)
        let early = pipeline.popAnswer()
        #expect(early == nil, "an answer left before the first")
        guard case .next(id: 1) = pipeline.answered(slot: slots[0]).0 else {
            Issue.record("the first answer is not next")
            return
        }
        pipeline.removeFirst()
        let answers = [pipeline.popAnswer()?.answer, pipeline.popAnswer()?.answer]
        #expect(answers == [ByteBuffer(string: "answer 2"), ByteBuffer(string: "answer 3")])
        #expect(pipeline.inFlight == 0 && pipeline.readyBytes == 0)
    }

    /// A `subscribe`'s answer goes through the kept answers even when first, so its subscription starts flowing
    /// when it leaves; the connection closing makes every later answer `gone`.
    @Test func aSubscribedAnswerIsKeptAndAClosedPipelineForgets() {
        var pipeline = Pipeline()
        let slot = pipeline.admit(id: 7)
        pipeline.opens(subscription: 42, slot: slot)
        pipeline.started(slot: slot, isWrite: false)
        guard case .behind(id: 7, opensSubscription: 42) = pipeline.answered(slot: slot).0 else {
            Issue.record("a subscribed answer was not kept")
            return
        }
        pipeline.keep(ByteBuffer(string: "subscribed"), slot: slot, subscribed: true)
        let subscribed = pipeline.popAnswer()
        #expect(subscribed?.opensSubscription == 42)

        let write = pipeline.admit(id: 8)
        pipeline.started(slot: write, isWrite: true)
        pipeline.reset()
        guard case .gone = pipeline.answered(slot: write).0 else {
            Issue.record("an answer after the close was kept")
            return
        }
    }

    // MARK: Through the machine

    /// One read with an insert, a count and a ping: the insert starts; the count waits for it (read your
    /// writes) and the ping waits behind the count (order); the answers go out in request order.
    @Test func readsWaitForTheConnectionsWritesAndAnswersKeepRequestOrder() throws {
        let h = ConnectionHarness()
        let bytes = try ConnectionHarness.frames([
            (.insert(.init(store: "s", items: [Item(id: "a", payload: Payload("1"))])), 1),
            (.count(.init(store: "s")), 2), (.ping(.init()), 3),
        ])
        var step = h.take(h.machine.received(bytes, io: h.io()))
        #expect(step.messages.map(\.0) == [0])  // the welcome
        #expect(step.starts.map(\.0) == [0])
        step = h.take(h.machine.startReturned(slot: 0, io: h.io()))
        #expect(step.starts.isEmpty, "the count started before the insert was answered")

        step = h.take(h.machine.answered(slot: 0, .written(1), io: h.io()))
        #expect(step.starts.map(\.0) == [1])
        guard case .count = step.starts.first?.1 else {
            Issue.record("the held count did not start")
            return
        }
        #expect(step.messages.map(\.0) == [1])
        step = h.take(h.machine.startReturned(slot: 1, io: h.io()))  // the ping is answered by the connection itself
        #expect(step.messages.isEmpty, "the pong went out before the count's answer")
        step = h.take(h.machine.answered(slot: 1, .success(.count(Position(epoch: 7, sequence: 1), 1)), io: h.io()))
        #expect(step.messages.map(\.0) == [2, 3])
        guard case .countResult(let count) = step.messages.first?.1, case .pong = step.messages.last?.1 else {
            Issue.record("wrong answers: \(step.messages)")
            return
        }
        #expect(count.count == 1 && count.sequence == 1)
    }

    /// Writes answered out of order leave in request order; the answers of one event leave as one write.
    @Test func writeAnswersLeaveInRequestOrderAsOneWrite() throws {
        let h = ConnectionHarness()
        try h.greet()
        let inserts = (1...6).map { n in
            (ClientMessage.insert(.init(store: "s\(n)", items: [Item(id: "a", payload: Payload("\(n)"))])), UInt32(n))
        }
        var step = try h.send(inserts)
        #expect(step.starts.map(\.0) == [0, 1, 2, 3, 4, 5])
        step = h.take(h.machine.answered(slot: 2, .written(3), io: h.io()))
        #expect(step.messages.isEmpty, "the third answer went out before the first")
        step = h.take(h.machine.answered(slot: 0, .written(1), io: h.io()))
        #expect(step.messages.map(\.0) == [1])
        step = h.take(h.machine.answered(slot: 1, .written(2), io: h.io()))
        #expect(step.messages.map(\.0) == [2, 3])

        _ = h.machine.answered([(3, .written(4)), (4, .written(5)), (5, .written(6))], io: h.io())
        let first = h.machine.nextWrite()
        #expect(h.machine.nextWrite() == nil, "three answers in order took more than one write")
        #expect(h.messages(in: try #require(first)).map(\.0) == [4, 5, 6])
    }

    /// No more than `maxInFlight` requests start; the rest wait in the input.
    @Test func theInFlightCapHoldsRequestsBack() throws {
        let h = ConnectionHarness(maxInFlight: 2)
        let bytes = try ConnectionHarness.frames((1...4).map { (.insert(.init(store: "s", items: [])), UInt32($0)) })
        var started = h.take(h.machine.received(bytes, io: h.io())).starts.map(\.0)
        started += h.take(h.machine.startReturned(slot: 0, io: h.io())).starts.map(\.0)
        started += h.take(h.machine.startReturned(slot: 1, io: h.io())).starts.map(\.0)
        #expect(started == [0, 1])
        #expect(h.take(h.machine.answered(slot: 0, .written(1), io: h.io())).starts.map(\.0) == [2])
    }
}
