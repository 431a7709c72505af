@testable import BrokerCore
@testable import BrokerServer
import Logging
import NIOCore
import Wire

/// A connection state machine on its own, with the subscriptions it made and a client session that decodes what
/// it writes: events in, actions and bytes out, no channel and no broker.
final class ConnectionHarness {
    typealias Machine = ConnectionStateMachine

    var machine: Machine
    private let outbound = Outbound()
    var now = NIODeadline.uptimeNanoseconds(1_000_000_000)
    private let box: Box
    final class Box { var subscriptions: [Subscription] = [] }
    var made: [Subscription] { box.subscriptions }

    init(
        maxInFlight: Int = 128, subscriptions: SubscriptionQuota = SubscriptionQuota(perConnection: 1024, total: 65536),
        budget: ByteBudget = ByteBudget(perConnection: 1 << 20, total: 1 << 24)
    ) {
        let made = Box()
        machine = Machine(
            configuration: .init(
                limits: ServerSession.Limits(maxInFlight: maxInFlight),
                timeouts: Timeouts(handshake: .seconds(10), frame: .seconds(30)), highWatermark: 256 * 1024),
            budget: budget, subscriptions: subscriptions,
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
            makeSubscription: { id, namespace, name in
                let subscription = Subscription(id: id, namespace: namespace, name: name, capacity: 16, wake: {})
                made.subscriptions.append(subscription)
                return subscription
            })
        box = made
    }

    func io(writable: Bool = true, buffered: Int = 0) -> Machine.IOState {
        Machine.IOState(isWritable: writable, bufferedBytes: buffered, now: now)
    }

    struct Step {
        var starts: [(UInt64, BrokerCommand)] = []
        var messages: [(UInt32, ServerMessage)] = []
        /// `close`'s `lingering`, if the step closed.
        var closed: Bool?
        var reads = 0
    }

    /// The commands started, whether it closed, and every message written, decoded, in order (the handler takes
    /// the turn's writes after performing its actions).
    func take(_ actions: [Machine.Action]) -> Step {
        var step = Step()
        for action in actions {
            switch action {
            case .start(let slot, let command, _): step.starts.append((slot, command))
            case .close(let writes, let lingering):
                for bytes in writes { outbound.add(bytes) }
                step.closed = lingering
            case .read: step.reads += 1
            default: break
            }
        }
        while let bytes = machine.nextWrite() { outbound.add(bytes) }
        step.messages = outbound.messages()
        return step
    }

    /// The messages these bytes, written after everything taken so far, complete.
    func messages(in bytes: ByteBuffer) -> [(UInt32, ServerMessage)] {
        outbound.add(bytes)
        return outbound.messages()
    }

    static func frames(_ messages: [(ClientMessage, UInt32)], hello: Bool = true) throws -> ByteBuffer {
        var out = hello ? try ClientSession(clientName: "t").hello() : ByteBuffer()
        for (message, id) in messages {
            try message.encode(id: id, maxFrameLength: WireProtocol.defaultMaxFrameLength, into: &out)
        }
        return out
    }

    /// The client's hello, taken (its welcome read).
    func greet() throws {
        _ = take(machine.received(try Self.frames([]), io: io()))
    }

    /// These requests, after the hello.
    func send(_ messages: [(ClientMessage, UInt32)]) throws -> Step {
        take(machine.received(try Self.frames(messages, hello: false), io: io()))
    }
}

extension Result<BrokerAnswer, BrokerError> {
    static func written(_ sequence: UInt64) -> Self {
        .success(.written(.init(committed: true, epoch: 1, sequence: sequence)))
    }
}
