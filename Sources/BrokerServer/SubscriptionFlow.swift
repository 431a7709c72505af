import BrokerCore
import DequeModule
import Logging
import NIOCore
import Synchronization
import Wire

/// A connection's subscriptions and the flow of their pushes to the socket, with no I/O: a subscription's pushes
/// follow its `subscribed` answer (never before it), leave in order while the socket takes them, and one the socket
/// stopped taking goes on first when it drains. Only the subscriptions that said they have pushes waiting are gone
/// through, never every one (a connection may hold 20,000).
struct SubscriptionFlow {
    private let quota: SubscriptionQuota
    private let make: (UInt32, Namespace, String) -> Subscription
    private var subscriptions: [UInt32: Subscription] = [:]
    /// Subscriptions whose `subscribed` answer has gone out, so their pushes may follow.
    private var flowing = Set<UInt32>()
    /// Subscriptions with pushes waiting, in the order they said so, not yet drained.
    private var ready = Deque<UInt32>()
    private var nextID: UInt32 = 1

    /// `make` builds the queue a `subscribe`'s pushes go to (its wake-up is the handler's business).
    init(quota: SubscriptionQuota, make: @escaping (UInt32, Namespace, String) -> Subscription) {
        self.quota = quota
        self.make = make
    }

    subscript(id: UInt32) -> Subscription? { subscriptions[id] }

    /// A new subscription, within this connection's cap and the daemon's total; its pushes wait for `flow(_:)`.
    mutating func open(_ namespace: Namespace, _ name: String) -> Result<Subscription, WireError> {
        if subscriptions.count >= quota.perConnection {
            return .failure(
                WireError(
                    .tooManySubscriptions,
                    "this connection holds \(subscriptions.count) subscriptions, the most it may "
                        + "(--max-subscriptions); unsubscribe first, or open another connection"))
        }
        guard quota.take() else {
            return .failure(
                WireError(
                    .tooManySubscriptions,
                    "the daemon holds \(quota.total) subscriptions for all its connections, the most it may "
                        + "(--max-total-subscriptions); unsubscribe first, or try again later"))
        }
        let id = nextID
        nextID &+= 1
        if nextID == 0 { nextID = 1 }
        let made = make(id, namespace, name)
        subscriptions[id] = made
        return .success(made)
    }

    /// Ends subscription `id` on this side (an `unsubscribe`, or its `subscribe` failed): the subscription, if it
    /// was open.
    @discardableResult
    mutating func close(_ id: UInt32) -> Subscription? {
        guard let subscription = subscriptions.removeValue(forKey: id) else { return nil }
        quota.give()
        flowing.remove(id)
        return subscription
    }

    /// Every subscription, ended (the connection closed).
    mutating func closeAll() -> Dictionary<UInt32, Subscription>.Values {
        let all = subscriptions.values
        quota.give(subscriptions.count)
        subscriptions = [:]
        flowing = []
        ready = []
        return all
    }

    /// Subscription `id`'s `subscribed` answer went out: what it was offered before (its snapshot, history) may
    /// follow now.
    mutating func flow(_ id: UInt32) {
        guard subscriptions[id] != nil else { return }
        flowing.insert(id)
        ready.append(id)
    }

    /// These subscriptions have pushes waiting (each says so once, when its empty buffer gets a push).
    mutating func waiting(_ ids: [UInt32]) {
        ready.append(contentsOf: ids)
    }

    /// Appends the pushes waiting to `output` while it holds at most `room` bytes. A push that cannot be encoded
    /// ends its subscription with `lagged` in its place (skipping it would be a gap).
    mutating func drain(into output: inout ConnectionOutput, room: Int, maxFrameLength: Int, logger: Logger) {
        while output.count <= room, let id = ready.first {
            guard flowing.contains(id), let subscription = subscriptions[id] else {
                ready.removeFirst()  // gone, or not flowing yet (it is drained when its `subscribed` goes out)
                continue
            }
            var drained = false
            pushing: while output.count <= room {
                let pushes = subscription.take(max: 32)
                if pushes.isEmpty {
                    drained = true
                    break
                }
                for shared in pushes {
                    // Encoded once for every subscriber of the commit (with id 0); each connection writes the
                    // frames with its own subscription id.
                    let encoded = shared.encoded { push in
                        // Room for a small event at once (an empty buffer grows from 16 bytes by doubling).
                        var out = ByteBufferAllocator().buffer(capacity: 512)
                        do throws(WireError) {
                            try push.message.encode(id: 0, maxFrameLength: maxFrameLength, into: &out)
                        } catch {
                            logger.warning(
                                "ending subscriptions: a push cannot be sent: \(error.message)",
                                metadata: ["store": "\(subscription.name)"])
                            out.clear()
                        }
                        return out
                    }
                    guard encoded.readableBytes > 0 else {
                        output.append(subscription.endBefore(shared.push).message, id: id, maxFrameLength: maxFrameLength)
                        break pushing
                    }
                    output.append(push: encoded, subscriptionID: id)
                }
            }
            if subscription.isEnded, !subscription.hasPending {
                close(id)  // it lagged: the notice is out; the subscription is over
                drained = true
            }
            guard drained else { break }  // the socket is full: this one goes on first when it drains
            ready.removeFirst()
        }
    }
}

/// The subscriptions every connection together holds, against a cap per connection (each connection counts its
/// own) and a total (`--max-total-subscriptions`): a subscription costs the daemon about 1.3 KB before any push,
/// so without a total, `--max-connections` × `--max-subscriptions` of them could take gigabytes.
final class SubscriptionQuota: Sendable {
    let perConnection: Int
    let total: Int
    private let held = Atomic<Int>(0)

    init(perConnection: Int, total: Int) {
        self.perConnection = perConnection
        self.total = total
    }

    /// Subscriptions held now, all connections together.
    var heldCount: Int { held.load(ordering: .relaxed) }

    /// Counts one more subscription, unless all connections together hold `total` already.
    func take() -> Bool {
        guard held.add(1, ordering: .relaxed).newValue > total else { return true }
        held.subtract(1, ordering: .relaxed)
        return false
    }

    /// Gives back `count` subscriptions that have ended.
    func give(_ count: Int = 1) {
        held.subtract(count, ordering: .relaxed)
    }
}
