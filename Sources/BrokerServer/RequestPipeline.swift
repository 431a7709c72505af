import DequeModule
import NIOCore

/// A connection's requests from their frames to their answers on the wire, with no I/O: answers leave in request
/// order, and a request that reads waits until this connection's earlier writes are answered (a client reads its
/// own writes), as do the requests after it (they keep their order behind it).
///
/// Requests are numbered by slot, an absolute index in the connection's life. A write starts at once; a read
/// (anything that is not a write) is answered from memory at once, and its answer (up to a whole store) must count
/// against the budgets before another request starts: so nothing starts after a read until its answer came or the
/// handler came back from starting it (`returned(slot:)`).
struct RequestPipeline<Request> {
    struct Slot {
        var id: UInt32
        var answer: ByteBuffer?
        /// The subscription this request opens (a `subscribe`): its pushes wait until its answer has gone out.
        var opensSubscription: UInt32?
    }

    struct Held {
        var slot: UInt64
        var request: Request
        var isWrite: Bool
    }

    /// Requests not yet answered on the wire, in request order; `base` is the slot of the first.
    private var slots = Deque<Slot>()
    private var base: UInt64 = 0
    /// Writes whose answer has not arrived, in slot order (writes start in slot order). An answered one is marked
    /// (`answeredBit`) and removed lazily at the front, so the oldest open write is found in O(1) amortized (a
    /// `Set` of the answered ones would hash every answer twice).
    private var openWrites = Deque<UInt64>()
    private static var answeredBit: UInt64 { 1 << 63 }
    /// Requests held back, in slot order.
    private(set) var held = Deque<Held>()
    /// The read handed out that has neither been answered nor come back from the handler.
    private(set) var awaitingStart: UInt64?
    /// Bytes of answers kept behind an earlier request, not yet written.
    private(set) var readyBytes = 0

    /// Requests taken and not yet answered on the wire.
    var inFlight: Int { slots.count }

    /// A new request with this frame id: its slot. `answer`: one it already has (a frame refused by the session).
    mutating func admit(id: UInt32, answer: ByteBuffer? = nil) -> UInt64 {
        slots.append(Slot(id: id, answer: answer))
        readyBytes += answer?.readableBytes ?? 0
        return base + UInt64(slots.count - 1)
    }

    /// Whether the request in `slot` may start now; else it must be held (`hold`).
    mutating func mayStart(isWrite: Bool, slot: UInt64) -> Bool {
        held.isEmpty && startable(isWrite: isWrite, slot: slot)
    }

    mutating func hold(_ request: consuming Request, slot: UInt64, isWrite: Bool) {
        held.append(Held(slot: slot, request: request, isWrite: isWrite))
    }

    /// The first held request, if it may start now (taken out: start it).
    mutating func nextHeld() -> Held? {
        guard let first = held.first, startable(isWrite: first.isWrite, slot: first.slot) else { return nil }
        return held.removeFirst()
    }

    /// The request in `slot` was handed to the broker.
    mutating func started(slot: UInt64, isWrite: Bool) {
        if isWrite { openWrites.append(slot) } else { awaitingStart = slot }
    }

    /// The request in `slot` opens this subscription.
    mutating func opens(subscription id: UInt32, slot: UInt64) {
        slots[Int(slot - base)].opensSubscription = id
    }

    /// The handler came back from starting `slot`, or its answer came: whether the pipeline was waiting for it.
    mutating func returned(slot: UInt64) -> Bool {
        guard awaitingStart == slot else { return false }
        awaitingStart = nil
        return true
    }

    /// Where an answer goes.
    enum Answered {
        /// The connection let go of the request (it closed).
        case gone
        /// Next in request order and opening no subscription: write it now (`removeFirst()` after).
        case next(id: UInt32)
        /// Behind an earlier request: keep its bytes with `keep(_:slot:)`.
        case behind(id: UInt32, opensSubscription: UInt32?)
    }

    /// The broker answered `slot`; `wasWrite` tells whether that was a write's answer (reads held behind it may
    /// start now).
    mutating func answered(slot: UInt64) -> (Answered, wasWrite: Bool) {
        let wasWrite = markAnswered(slot)
        guard slot >= base, slot - base < UInt64(slots.count) else { return (.gone, wasWrite) }
        let index = Int(slot - base)
        let opens = slots[index].opensSubscription
        if index == 0, opens == nil { return (.next(id: slots[0].id), wasWrite) }
        return (.behind(id: slots[index].id, opensSubscription: opens), wasWrite)
    }

    /// Keeps the encoded answer of `slot` until the answers before it have gone out. `subscribed`: the answer
    /// of a `subscribe` that succeeded, whose subscription flows once it is out.
    mutating func keep(_ answer: ByteBuffer, slot: UInt64, subscribed: Bool = false) {
        let index = Int(slot - base)
        slots[index].answer = answer
        if !subscribed { slots[index].opensSubscription = nil }
        readyBytes += answer.readableBytes
    }

    /// Frees the first slot, whose answer went out.
    mutating func removeFirst() {
        slots.removeFirst()
        base += 1
    }

    /// The first slot's answer if it has one (taken out, the slot freed): answers leave in request order.
    mutating func popAnswer() -> (answer: ByteBuffer, opensSubscription: UInt32?)? {
        guard let first = slots.first, let answer = first.answer else { return nil }
        readyBytes -= answer.readableBytes
        removeFirst()
        return (answer, first.opensSubscription)
    }

    /// Forgets every request (the connection closed).
    mutating func reset() {
        slots = []
        openWrites = []
        held = []
        readyBytes = 0
        awaitingStart = nil
    }

    /// A read waits for this connection's earlier writes; nothing starts while a read is awaited.
    private mutating func startable(isWrite: Bool, slot: UInt64) -> Bool {
        guard awaitingStart == nil else { return false }
        if isWrite { return true }
        while let oldest = openWrites.first, oldest & Self.answeredBit != 0 { openWrites.removeFirst() }
        return (openWrites.first ?? .max) > slot
    }

    /// Marks `slot` answered among the open writes; whether it was one.
    private mutating func markAnswered(_ slot: UInt64) -> Bool {
        guard let first = openWrites.first, slot >= first & ~Self.answeredBit else { return false }
        // Slots are increasing: a binary search finds it.
        var low = 0
        var high = openWrites.count
        while low < high {
            let middle = (low + high) / 2
            if openWrites[middle] & ~Self.answeredBit < slot { low = middle + 1 } else { high = middle }
        }
        // Equal only while unanswered: an answered one carries the mark.
        guard low < openWrites.count, openWrites[low] == slot else { return false }
        openWrites[low] |= Self.answeredBit
        return true
    }
}
