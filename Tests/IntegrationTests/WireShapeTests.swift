import Foundation
import TestSupport
import Testing
import Wire

extension Integration {
    /// How answers leave the daemon: what one write carries, in what order.
    @Suite struct WireShape {
        /// A client that follows a store and writes to it plainly (not `quietChain`, which a Swift `RemoteStore`
        /// now sends) waits for its write's answer and for the write's event in its own subscription. Both come
        /// from one commit, so they leave in one write, the event first: one wake-up of the client, and a mirror
        /// that already shows the write when its answer arrives. (Before: the memory engine's answer left alone
        /// and the event in a second write.)
        @Test(arguments: ["memory", "sqlite"])
        func aCommitsEventAndItsAnswerLeaveInOneWriteEventFirst(engine: String) async throws {
            try await Daemon.with(arguments: ["--engine", engine]) { daemon in
                let client = try RawClient(socketPath: daemon.socketPath)
                try client.handshake()
                // The store exists before the subscription (its creation is not what is measured here).
                try client.request(.insert(.init(store: "mirrored", items: [Item(id: ItemID("first"), payload: Payload("{}"))])), id: 1)
                guard case .writeResult? = try client.nextMessage()?.message else { throw DaemonFailure("no answer to the first insert") }
                try client.request(.subscribe(.init(name: "mirrored")), id: 2)
                guard case .subscribed(let subscribed)? = try client.nextMessage()?.message,
                    case .storeLoaded? = try client.nextMessage()?.message
                else { throw DaemonFailure("no subscription with its snapshot") }
                for round in 0..<20 {
                    let id = UInt32(10 + round)
                    try client.request(
                        .insert(.init(store: "mirrored", items: [Item(id: ItemID("n\(round)"), payload: Payload("{\"n\":\(round)}"))])),
                        id: id)
                    let first = try client.messagesOfOneRead()
                    let shape = first.map { "\($0.message.type.name)@\($0.id)" }
                    guard first.count == 2, case .storeEvent(let event) = first[0].message, first[0].id == subscribed.subscriptionID,
                        case .writeResult(let result) = first[1].message, first[1].id == id
                    else {
                        Issue.record("round \(round) (\(engine)): one read gave \(shape); expected the event then the answer")
                        return
                    }
                    #expect(event.sequence == result.sequence)
                }
            }
        }
    }
}
