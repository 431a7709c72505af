import DequeModule
import NIOCore
import StoreModel

/// A push as the broadcaster hands it to every subscriber of a commit: made once per commit, with the bytes
/// the first connection encodes it into kept for the others (only the subscription id differs between them,
/// and that lives in the frame headers, which each connection writes itself). Used on the owner loop only.
public final class SharedPush: @unchecked Sendable {
    public let push: Push
    private var encoding: ByteBuffer?

    public init(_ push: Push) {
        self.push = push
    }

    /// The encoded push: made by `encode` the first time, the same bytes (shared storage) afterwards.
    public func encoded(_ encode: (Push) -> ByteBuffer) -> ByteBuffer {
        if let encoding { return encoding }
        let made = encode(push)
        encoding = made
        return made
    }
}

/// One subscriber's view of a store: the pushes it has yet to receive, in order, in a bounded buffer.
///
/// The store offers pushes after each commit and never waits: when the buffer is full the subscription ends with
/// a `lagged` notice after what it already holds, and the store forgets it. The connection that owns the
/// subscription takes pushes out (`take(max:)`) when `wake` tells it there are some, as fast as its socket lets
/// it. Stores and connections live on the owner loop, so a subscription is used there only: no lock.
public final class Subscription: @unchecked Sendable {
    /// The server-assigned id every push of this subscription carries.
    public let id: UInt32
    public let namespace: Namespace
    public let name: String
    private let capacity: Int
    private let wake: @Sendable () -> Void
    private var queue = Deque<SharedPush>()
    private var ended = false
    private var wakePending = false
    /// The position of the last push queued, for the `lagged` notice.
    private var position = Position(epoch: 0, sequence: 0)

    /// `capacity` pushes may wait at once; `wake` is called when pushes arrive in an empty buffer, and again only
    /// after `take(max:)` emptied it.
    public init(
        id: UInt32, namespace: Namespace, name: String, capacity: Int, wake: @escaping @Sendable () -> Void
    ) {
        self.id = id
        self.namespace = namespace
        self.name = name
        self.capacity = max(1, capacity)
        self.wake = wake
    }

    /// Queues a push. `force` ignores the bound (the snapshot and the replayed history a subscription starts
    /// with). Returns `false` when the subscription is over (it lagged now, or was cancelled).
    @discardableResult
    func offer(_ push: Push, at position: Position, force: Bool = false) -> Bool {
        offer(SharedPush(push), at: position, force: force)
    }

    /// Queues a push shared with other subscribers (see `offer(_:at:force:)`).
    @discardableResult
    func offer(_ push: SharedPush, at position: Position, force: Bool = false) -> Bool {
        guard !ended else { return false }
        if !force, queue.count >= capacity {
            queue.append(SharedPush(.lagged(self.position)))
            ended = true
        } else {
            queue.append(push)
            self.position = position
        }
        if !wakePending {
            wakePending = true
            wake()
        }
        return !ended
    }

    /// Up to `max` pushes, oldest first. When this empties the buffer, the next offer wakes the owner again.
    public func take(max: Int) -> [SharedPush] {
        let count = Swift.min(max, queue.count)
        let out = Array(queue.prefix(count))
        queue.removeFirst(count)
        if queue.isEmpty { wakePending = false }
        return out
    }

    /// Whether pushes are waiting.
    public var hasPending: Bool { !queue.isEmpty }

    /// Whether the subscription ended (lagged or cancelled); pushes already queued still wait to be taken.
    public var isEnded: Bool { ended }

    /// Ends the subscription now, because `push` cannot be sent: what is queued is dropped, and the returned
    /// `lagged` notice (to send in its place) says where to resume: before that push's commit.
    public func endBefore(_ push: Push) -> Push {
        cancel()
        switch push {
        case .storeEvent(let event): return .lagged(Position(epoch: event.epoch, sequence: max(event.sequence, 1) - 1))
        case .valueEvent(let position, _):
            return .lagged(Position(epoch: position.epoch, sequence: max(position.sequence, 1) - 1))
        default: return .lagged(Position(epoch: 0, sequence: 0))  // a snapshot: resuming gets a fresh one
        }
    }

    /// Ends the subscription and drops what is queued.
    public func cancel() {
        ended = true
        queue.removeAll()
    }
}
