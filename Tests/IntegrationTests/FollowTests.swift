import Foundation
import StoreBrokerClient
import Synchronization
import Testing
import Wire

extension Integration {
    /// `BrokerConnection.follow`: after `lagged` it subscribes again from the point the notice names, so the
    /// caller sees one gap-free stream (what storectl watch and the library's followers rely on).
    @Suite struct Follow {
        @Test func afterLaggedItResumesFromTheNoticesPoint() async throws {
            try await withTemporaryDirectory { directory in
                let starts = Mutex<[SubscriptionStart]>([])
                let fake = try FakeBroker(
                    socketPath: directory + "/fake.sock",
                    behaviour: .script { peer in
                        // First subscription: a snapshot, one event, then lagged at sequence 2.
                        guard case (let id, .subscribe(let first))? = try peer.nextRequest() else { return }
                        starts.withLock { $0.append(first.start) }
                        try peer.send(.subscribed(.init(subscriptionID: 1)), id: id)
                        try peer.send(.storeLoaded(.init(epoch: 7, sequence: 1, count: 0, elements: [])), id: 1)
                        try peer.send(.storeEvent(.init(epoch: 7, sequence: 2, elements: [.remove(ids: ["a"])])), id: 1)
                        try peer.send(.lagged(.init(epoch: 7, sequence: 2)), id: 1)
                        // The follower subscribes again by itself.
                        guard case (let again, .subscribe(let second))? = try peer.nextRequest() else { return }
                        starts.withLock { $0.append(second.start) }
                        try peer.send(.subscribed(.init(subscriptionID: 2)), id: again)
                        try peer.send(.storeEvent(.init(epoch: 7, sequence: 3, elements: [.remove(ids: ["b"])])), id: 2)
                        _ = try peer.nextRequest()  // until the client goes
                    })
                defer { fake.stop() }
                let connection = try await BrokerConnection.connect(socketPath: fake.socketPath, clientName: "follow-test", timeout: .seconds(10))
                var seen: [String] = []
                for try await push in connection.follow(name: "s") {
                    switch push {
                    case .storeLoaded(let at, _): seen.append("loaded \(at.sequence)")
                    case .storeEvent(let event): seen.append("event \(event.sequence)")
                    case .lagged(let notice): seen.append("lagged \(notice.sequence)")
                    default: seen.append("\(push.message.type.name)")
                    }
                    if seen.count == 4 { break }
                }
                await connection.close()
                #expect(seen == ["loaded 1", "event 2", "lagged 2", "event 3"])
                #expect(starts.withLock { $0 } == [.snapshot, .resume(epoch: 7, sequence: 2)])
            }
        }
    }
}
