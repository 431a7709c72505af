#if canImport(Glibc)
import Glibc
#endif

/// Group commit for writers that wait for each acknowledgement.
///
/// A store's writer commits whatever is queued as one group. When each client waits for its answer before its
/// next write, that alone makes poor groups: the clients answered by one group come back while the next group
/// (made of those that queued meanwhile) is being committed, so groups alternate between few and many and a slow
/// apply (an `fsync`) is paid for every couple of writes. So, as PostgreSQL's `commit_delay` with
/// `commit_siblings` does, when the last apply was slow the writer waits a little for the submitters it has just
/// answered before it makes its next group: at most as long as that apply took (waiting longer than the apply
/// it would save is never worth it) and never more than `--max-group-wait`, and only for submitters that have nothing
/// queued. A lone client, a store whose applies are fast (the memory engine, sqlite `NORMAL`) and pipelined
/// clients with writes already queued never wait. Nor does a writer that has just answered `largeGroup` clients
/// or more (its slow apply was mostly their writes, not the fsync a wait would share), nor one with `largeGroup`
/// writes already queued (the next group is large without the ones it would wait for): with many clients, the
/// last of them comes back late and the writer would sit idle while most of them already wait (sqlite `FULL`, 50
/// clients each waiting for its answer: 21,000-22,000 inserts/s waiting for them, 23,000-27,000 not; 4 clients:
/// 6,800-8,300 waiting, 4,400-6,200 not).
struct GroupGathering {
    /// Applies faster than this are not worth waiting for.
    static let slowApply: UInt64 = 100_000
    /// Answered clients, or writes already queued, from which on the next group is large enough without waiting.
    static let largeGroup = 8

    /// Submitters answered by the last group that have nothing queued and have not handed in writes since.
    private(set) var awaiting: Set<UInt64> = []
    /// How long the last apply took, in nanoseconds.
    private var lastApply: UInt64 = 0
    /// The writer is waiting for `awaiting` to empty.
    private var writerWaits = false

    /// `submitter` handed in writes: true when that completes the group the writer is waiting for.
    mutating func submitted(by submitter: UInt64) -> Bool {
        guard !awaiting.isEmpty, awaiting.remove(submitter) != nil else { return false }
        return writerWaits && awaiting.isEmpty
    }

    /// A group was committed by an apply that took `nanoseconds`; `queued` is what waits behind it.
    mutating func committed<Write: QueuedWrite>(
        _ group: some Sequence<Write>, applyTook nanoseconds: UInt64, queued: some Sequence<Write>
    ) {
        lastApply = nanoseconds
        awaiting.removeAll(keepingCapacity: true)
        guard nanoseconds >= Self.slowApply else { return }
        for write in group { awaiting.insert(write.submitter) }
        guard awaiting.count < Self.largeGroup else { return awaiting.removeAll(keepingCapacity: true) }
        for write in queued where !awaiting.isEmpty { awaiting.remove(write.submitter) }
    }

    /// Before the next group, with `queued` writes waiting: how long, at most `maximum` nanoseconds, the writer
    /// should wait for the submitters it has just answered (nil: not at all). The writer then waits until
    /// `submitted(by:)` says the group is whole or the time is up.
    mutating func beginWait(maximum: UInt64, queued: Int) -> UInt64? {
        guard !awaiting.isEmpty, lastApply >= Self.slowApply, maximum > 0, queued < Self.largeGroup else { return nil }
        writerWaits = true
        return min(lastApply, maximum)
    }

    /// The wait is over (the group is whole, or the time ran out: those still missing are not waited for again).
    mutating func endWait() {
        writerWaits = false
        awaiting.removeAll(keepingCapacity: true)
    }
}

/// The monotonic clock, in nanoseconds.
func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}
