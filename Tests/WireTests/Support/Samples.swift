import NIOCore
import Wire

/// A message of either direction, as the tests handle them.
enum AnyMessage: Hashable, Sendable {
    case client(ClientMessage)
    case server(ServerMessage)

    var type: MessageType {
        switch self {
        case .client(let m): m.type
        case .server(let m): m.type
        }
    }

    var body: any WireMessage {
        switch self {
        case .client(let m): m.body
        case .server(let m): m.body
        }
    }

    func encoded(id: UInt32, maxFrameLength: Int = WireProtocol.defaultMaxFrameLength) throws -> ByteBuffer {
        var out = ByteBuffer()
        switch self {
        case .client(let m): try m.encode(id: id, maxFrameLength: maxFrameLength, into: &out)
        case .server(let m): try m.encode(id: id, maxFrameLength: maxFrameLength, into: &out)
        }
        return out
    }

    /// Decodes every frame in `bytes` as one message (joining frames that span), requiring nothing left over.
    static func decodeOne(_ bytes: ByteBuffer) throws -> (id: UInt32, message: AnyMessage) {
        var buffer = bytes
        let decoder = FrameDecoder(maxFrameLength: WireProtocol.defaultMaxFrameLength)
        var assembler = ServerMessageAssembler()
        var result: (UInt32, AnyMessage)?
        while let frame = try decoder.decode(&buffer) {
            precondition(result == nil, "more than one message")
            if frame.header.type < 0x40 {
                result = (frame.header.id, .client(try ClientMessage(frame: frame)))
            } else if let message = try assembler.receive(frame) {
                result = (frame.header.id, .server(message))
            }
        }
        precondition(buffer.readableBytes == 0 && assembler.isIdle, "left over bytes")
        return result!
    }
}

/// A named sample message: every message type has at least one, and every variant of every tagged field
/// appears in some sample. They are the source of docs/protocol-vectors.json.
struct Sample {
    var name: String
    var id: UInt32
    var message: AnyMessage
    /// Set for samples that show a message spread over several frames.
    var maxFrameLength: Int?
}

private func payload(_ json: String) -> Payload { Payload(json) }

private let note1 = ItemRecord(
    id: "n1", createdAt: 1_767_225_600_000, updatedAt: 1_767_225_600_000, payload: payload(#"{"id":"n1"}"#))
private let note2 = ItemRecord(
    id: "n2", createdAt: 1_767_225_600_001, updatedAt: 1_767_225_660_000, payload: payload(#"{"id":"n2","t":1}"#))

let samples: [Sample] = [
    // Handshake.
    Sample(name: "hello", id: 0, message: .client(.hello(.init(versions: [1], clientName: "storectl")))),
    Sample(
        name: "welcome", id: 0,
        message: .server(
            .welcome(
                .init(
                    version: 1, serverVersion: "0.1.0", maxFrameLength: 16_777_216, maxItemLength: 1_048_576,
                    maxBatch: 10_000, maxInFlight: 128)))),
    // Requests.
    Sample(name: "ping", id: 1, message: .client(.ping(.init()))),
    Sample(name: "listStores", id: 2, message: .client(.listStores(.init()))),
    Sample(name: "listEngines", id: 3, message: .client(.listEngines(.init()))),
    Sample(name: "getStoreInfo", id: 4, message: .client(.getStoreInfo(.init(store: "notes")))),
    Sample(
        name: "insert", id: 5,
        message: .client(
            .insert(.init(store: "notes", items: [Item(id: "n1", payload: payload(#"{"id":"n1"}"#))])))),
    Sample(
        name: "insert-if-sequence", id: 6,
        message: .client(
            .insert(
                .init(
                    store: "notes", condition: .sequence(7),
                    items: [
                        Item(id: "n1", payload: payload("1")), Item(id: "n2", payload: payload("2")),
                    ])))),
    Sample(name: "remove", id: 7, message: .client(.remove(.init(store: "notes", ids: ["n1", "n2"])))),
    Sample(name: "removeAll", id: 8, message: .client(.removeAll(.init(store: "notes")))),
    Sample(name: "drop-if-absent", id: 9, message: .client(.drop(.init(store: "notes", condition: .absent)))),
    Sample(
        name: "chain", id: 10,
        message: .client(
            .chain(
                .init(
                    store: "notes", condition: .epochSequence(epoch: 0x0102_0304_0506_0708, sequence: 42),
                    steps: [
                        .removeAll, .insert(items: [Item(id: "a", payload: payload("{}"))]), .remove(ids: ["b"]),
                    ])))),
    Sample(name: "getItems", id: 11, message: .client(.getItems(.init(store: "notes", ids: ["n1", "zz"])))),
    Sample(name: "queryRange", id: 12, message: .client(.queryRange(.init(store: "notes", after: nil, limit: 100)))),
    Sample(
        name: "queryRange-after", id: 13, message: .client(.queryRange(.init(store: "notes", after: "n1", limit: 0)))),
    Sample(name: "count", id: 14, message: .client(.count(.init(store: "notes")))),
    Sample(name: "listIDs", id: 15, message: .client(.listIDs(.init(store: "notes", after: "n1", limit: 10)))),
    Sample(name: "subscribe", id: 16, message: .client(.subscribe(.init(namespace: .store, name: "notes")))),
    Sample(
        name: "subscribe-resume", id: 17,
        message: .client(
            .subscribe(.init(namespace: .value, name: "theme", start: .resume(epoch: 99, sequence: 3))))),
    Sample(name: "unsubscribe", id: 18, message: .client(.unsubscribe(.init(subscriptionID: 1)))),
    Sample(name: "getValue", id: 19, message: .client(.getValue(.init(namespace: .value, name: "theme")))),
    Sample(
        name: "setValue", id: 20,
        message: .client(.setValue(.init(namespace: .value, name: "theme", value: payload(#""dark""#))))),
    Sample(
        name: "setValue-secure-if-absent", id: 21,
        message: .client(
            .setValue(.init(namespace: .secureValue, name: "token", condition: .absent, value: payload(#""s3""#))))
    ),
    Sample(
        name: "resetValue", id: 22,
        message: .client(.resetValue(.init(namespace: .value, name: "theme", condition: .sequence(4))))),
    Sample(name: "listValues", id: 23, message: .client(.listValues(.init(namespace: .value)))),
    Sample(
        name: "quietChain", id: 24,
        message: .client(
            .quietChain(
                .init(
                    subscriptionID: 3, store: "notes", condition: .sequence(7),
                    elements: [.insert(items: [Item(id: "n3", payload: payload(#"{"id":"n3"}"#))])])))),
    // Answers.
    Sample(name: "pong", id: 1, message: .server(.pong(.init()))),
    Sample(
        name: "storeList", id: 2,
        message: .server(
            .storeList(
                .init(elements: [StoreInfo(name: "notes", epoch: 99, sequence: 3, count: 2, engine: "sqlite")])))),
    Sample(
        name: "engineList", id: 3,
        message: .server(
            .engineList(
                .init(elements: [
                    EngineInfo(
                        name: "sqlite", path: "/usr/lib/storebroker/engines/libstorebroker-engine-sqlite.so",
                        status: .loaded, abiMajor: 1, abiMinor: 0, capabilities: [.persistent, .atomic],
                        detail: "1.0.0"),
                    EngineInfo(
                        name: "old", path: "/tmp/libstorebroker-engine-old.so", status: .refused, abiMajor: 2,
                        abiMinor: 0, capabilities: [], detail: "ABI major 2 is not supported"),
                ])))),
    Sample(
        name: "storeInfoResult", id: 4,
        message: .server(
            .storeInfoResult(.init(info: StoreInfo(name: "notes", epoch: 99, sequence: 3, count: 2, engine: "sqlite"))))
    ),
    Sample(name: "writeResult", id: 5, message: .server(.writeResult(.init(committed: true, epoch: 99, sequence: 4)))),
    Sample(
        name: "writeResult-unchanged", id: 7,
        message: .server(.writeResult(.init(committed: false, epoch: 99, sequence: 4)))),
    Sample(
        name: "itemsResult", id: 11,
        message: .server(.itemsResult(.init(epoch: 99, sequence: 4, elements: [.present(note1), .missing("zz")])))),
    Sample(
        name: "rangeResult", id: 12,
        message: .server(.rangeResult(.init(epoch: 99, sequence: 4, elements: [note1, note2])))),
    Sample(name: "countResult", id: 14, message: .server(.countResult(.init(epoch: 99, sequence: 4, count: 2)))),
    Sample(name: "idList", id: 15, message: .server(.idList(.init(epoch: 99, sequence: 4, elements: ["n2"])))),
    Sample(name: "subscribed", id: 16, message: .server(.subscribed(.init(subscriptionID: 1)))),
    Sample(name: "unsubscribed", id: 18, message: .server(.unsubscribed(.init(subscriptionID: 1)))),
    Sample(
        name: "valueResult", id: 19,
        message: .server(.valueResult(.init(epoch: 7, sequence: 4, state: .set(payload(#""dark""#)))))),
    Sample(name: "valueResult-unset", id: 19, message: .server(.valueResult(.init(epoch: 7, sequence: 5, state: .unset)))),
    Sample(
        name: "valueList", id: 23,
        message: .server(
            .valueList(
                .init(elements: [
                    ValueInfo(name: "gone", epoch: 7, sequence: 2, isSet: false),
                    ValueInfo(name: "theme", epoch: 7, sequence: 4, isSet: true),
                ])))),
    Sample(
        name: "error-conflict", id: 6,
        message: .server(.error(.init(code: .conflict, message: "expected sequence 7, store is at 8")))),
    // Connection errors (id 0, then a close) and the per-request forms of §11.
    Sample(
        name: "error-badHandshake", id: 0,
        message: .server(.error(.init(code: .badHandshake, message: "not a valid hello: truncated")))),
    Sample(
        name: "error-frameTooLarge", id: 0,
        message: .server(.error(.init(code: .frameTooLarge, message: "frame of 65548 bytes is over the maximum of 65536")))),
    Sample(
        name: "error-unexpectedMessage", id: 5,
        message: .server(.error(.init(code: .unexpectedMessage, message: "hello was already received")))),
    Sample(
        name: "error-timedOut", id: 0,
        message: .server(.error(.init(code: .timedOut, message: "no hello within 10 s")))),
    Sample(
        name: "error-tooManyConnections", id: 0,
        message: .server(.error(.init(code: .tooManyConnections, message: "the broker serves 4096 connections already")))),
    Sample(
        name: "error-tooManySubscriptions", id: 9,
        message: .server(
            .error(.init(code: .tooManySubscriptions, message: "this connection holds 1024 subscriptions, the most it may")))),
    // Pushes.
    Sample(
        name: "storeLoaded", id: 1,
        message: .server(.storeLoaded(.init(epoch: 99, sequence: 4, count: 2, elements: [note1, note2])))),
    Sample(
        name: "storeLoaded-two-frames", id: 1,
        message: .server(.storeLoaded(.init(epoch: 99, sequence: 4, count: 2, elements: [note1, note2]))),
        maxFrameLength: 90),
    Sample(
        name: "storeEvent", id: 1,
        message: .server(
            .storeEvent(.init(epoch: 99, sequence: 5, elements: [.remove(ids: ["n1", "n2"]), .insert(records: [note1])])))
    ),
    Sample(
        name: "valueLoaded-secure", id: 2,
        message: .server(.valueLoaded(.init(epoch: 7, sequence: 2, state: .setWithheld)))),
    Sample(
        name: "valueEvent", id: 3,
        message: .server(.valueEvent(.init(epoch: 7, sequence: 5, state: .set(payload(#""light""#)))))),
    Sample(name: "valueEvent-reset", id: 3, message: .server(.valueEvent(.init(epoch: 7, sequence: 6, state: .unset)))),
    Sample(name: "lagged", id: 1, message: .server(.lagged(.init(epoch: 99, sequence: 5)))),
    Sample(name: "historyGone", id: 1, message: .server(.historyGone(.init(epoch: 100, sequence: 12)))),
    Sample(name: "dropped", id: 1, message: .server(.dropped(.init(epoch: 99, sequence: 5)))),
    Sample(
        name: "goodbye", id: 0,
        message: .server(.goodbye(.init(code: .shuttingDown, message: "storebrokerd is shutting down")))),
]
