import BrokerCore
import Foundation
import Logging
import NIOCore
import Synchronization
import Testing
import StoreModel
import TestSupport

/// Records what it is asked, and rejects what `rejects` says.
private final class Recorder: RequestInterceptor, @unchecked Sendable {
    let name: String
    let log: Mutex<[String]>
    let shared: Journal
    let rejects: @Sendable (BrokerCommand) -> BrokerError?

    init(_ name: String, journal: Journal, rejects: @escaping @Sendable (BrokerCommand) -> BrokerError? = { _ in nil }) {
        self.name = name
        self.shared = journal
        self.log = Mutex([])
        self.rejects = rejects
    }

    func check(_ request: BrokerCommand, context: RequestContext) -> BrokerError? {
        shared.add("check \(name)")
        return rejects(request)
    }

    func observe(_ request: BrokerCommand, context: RequestContext, outcome: Result<BrokerAnswer, BrokerError>, duration: Duration) {
        switch outcome {
        case .success(let answer): shared.add("observe \(name) \(answer.name)")
        case .failure(let error): shared.add("observe \(name) \(error.code.name)")
        }
    }
}

private final class Journal: Sendable {
    private let entries = Mutex<[String]>([])
    func add(_ entry: String) { entries.withLock { $0.append(entry) } }
    func take() -> [String] {
        entries.withLock { entries in
            defer { entries = [] }
            return entries
        }
    }
}

private func ask(_ broker: Broker, _ request: BrokerCommand, _ context: RequestContext = .owner) async -> Result<BrokerAnswer, BrokerError> {
    await withCheckedContinuation { continuation in
        broker.handle(request, context: context) { continuation.resume(returning: $0) }
    }
}

private func code(_ result: Result<BrokerAnswer, BrokerError>) -> BrokerError.Code? {
    if case .failure(let error) = result { return error.code }
    return nil
}

private func withBroker(
    configuration: (String) -> BrokerConfiguration = { BrokerConfiguration(dataDirectory: $0, defaultEngine: "test") },
    interceptors: ((BrokerConfiguration) -> [any RequestInterceptor])? = nil, logger: Logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
    _ body: (Broker) async throws -> Void
) async throws {
    try await withTemporaryDirectory(prefix: "sb-core") { directory in
        let configuration = configuration(directory)
        let threads = TestThreads()
        let broker = try Broker(
            configuration: configuration, engines: TestEngine(), owner: threads.owner, blocking: threads, logger: logger,
            interceptors: interceptors?(configuration))
        try await body(broker)
        await broker.shutdown()
        await threads.stop()
    }
}

@Suite struct InterceptorChain {
    @Test func interceptorsRunInOrderTheFirstRejectionWinsAndEveryOneObserves() async throws {
        let journal = Journal()
        let chain: [any RequestInterceptor] = [
            Recorder("first", journal: journal),
            Recorder("second", journal: journal, rejects: { request in
                if case .count = request { return BrokerError(.permissionDenied, "no counting") }
                return nil
            }),
            Recorder("third", journal: journal),
        ]
        try await withBroker(interceptors: { _ in chain }) { broker in
            _ = await ask(broker, .listEngines)
            #expect(journal.take() == ["check first", "check second", "check third", "observe first engines", "observe second engines", "observe third engines"])
            let refused = await ask(broker, .count(store: "s"))
            #expect(code(refused) == .permissionDenied)
            #expect(
                journal.take() == [
                    "check first", "check second", "observe first permissionDenied", "observe second permissionDenied",
                    "observe third permissionDenied",
                ])
        }
    }

    @Test func theStandardChainIsLogThenAccessThenLimits() async throws {
        try await withBroker { broker in
            #expect(broker.interceptors.map(\.name) == ["log", "access", "limits"])
            // A read-only peer sending an oversized batch: access answers before limits does.
            let readOnly = RequestContext(
                peer: Peer(uid: 4242, pid: 1), grant: Grant(isOwner: false, rules: [AccessRule(uid: 4242, readOnly: true)]),
                clientName: "t")
            let huge = BrokerCommand.write(store: "s", .insert((0...10_000).map { Item(id: ItemID("\($0)"), payload: Payload("1")) }))
            #expect(code(await ask(broker, huge, readOnly)) == .permissionDenied)
            #expect(code(await ask(broker, huge)) == .batchTooLarge)
        }
    }

    @Test func limitsRejectEachKindOfBadRequest() async throws {
        try await withBroker(configuration: { BrokerConfiguration(dataDirectory: $0, defaultEngine: "test", maxItemLength: 8, maxBatch: 3) }) { broker in
            let cases: [(BrokerCommand, BrokerError.Code)] = [
                (.write(store: "s", .insert([Item(id: "a", payload: Payload("123456789"))])), .itemTooLarge),
                (.setValue(namespace: .value, name: "v", value: Payload("123456789"), condition: .unconditional), .itemTooLarge),
                (.write(store: "s", .remove(["a", "b", "c", "d"])), .batchTooLarge),
                (.write(store: "s", .chain([.removeAll, .insert(items: [Item(id: "a", payload: Payload("1")), Item(id: "b", payload: Payload("1"))]), .removeAll])), .batchTooLarge),
                (.count(store: "a b"), .invalidName),
                (.getValue(namespace: .value, name: ".."), .invalidName),
                (.getValue(namespace: .store, name: "v"), .invalidRequest),
                (.get(store: "s", ids: ["\u{0}"]), .invalidID),
            ]
            for (request, expected) in cases {
                #expect(code(await ask(broker, request)) == expected, "\(request.name)")
            }
            #expect(code(await ask(broker, .write(store: "s", .insert([Item(id: "a", payload: Payload("12345678"))])))) == nil)
        }
    }

    @Test func accessFollowsGlobsReadOnlyAndKeepsSecureValuesForTheOwner() async throws {
        try await withBroker { broker in
            let peer = RequestContext(
                peer: Peer(uid: 7, pid: 1),
                grant: Grant(isOwner: false, rules: [AccessRule(uid: 7, glob: "pub-*", readOnly: true), AccessRule(uid: 7, glob: "inbox")]),
                clientName: "t")
            #expect(code(await ask(broker, .count(store: "pub-a"), peer)) == nil)
            #expect(code(await ask(broker, .write(store: "pub-a", .insert([Item(id: "1", payload: Payload("1"))])), peer)) == .permissionDenied)
            #expect(code(await ask(broker, .write(store: "inbox", .insert([Item(id: "1", payload: Payload("1"))])), peer)) == nil)
            #expect(code(await ask(broker, .count(store: "secret-store"), peer)) == .permissionDenied)
            #expect(code(await ask(broker, .getValue(namespace: .value, name: "inbox"), peer)) == nil)
            #expect(code(await ask(broker, .getValue(namespace: .secureValue, name: "inbox"), peer)) == .permissionDenied)
            #expect(code(await ask(broker, .listEngines, peer)) == nil)
            #expect(AccessRule(parsing: "7:pub-*:ro") == AccessRule(uid: 7, glob: "pub-*", readOnly: true))
            #expect(AccessRule(parsing: "root")?.uid == 0)
            #expect(AccessRule(parsing: "7:x:rw") == nil)
            #expect(AccessPolicy(ownUID: 1000, rules: [AccessRule(uid: 7)]).grant(for: 8) == nil)
            #expect(AccessPolicy(ownUID: 1000).grant(for: 0) == .owner)
        }
    }

    /// The context keeps its fields in one shared object (a copy is one reference count): setting a field of one
    /// copy must not show in another, and must keep the context's `submitter`, which tells its writes from
    /// other contexts' when a writer gathers a group.
    @Test func aRequestContextIsAValueWhoseSubmitterSurvivesItsChanges() {
        let context = RequestContext(peer: Peer(uid: 7, pid: 1), grant: .owner, clientName: "")
        var named = context
        named.clientName = "app"
        named.peer = Peer(uid: 8, pid: 2)
        named.grant = Grant(isOwner: false, rules: [AccessRule(uid: 8)])
        #expect(context.clientName == "" && context.peer == Peer(uid: 7, pid: 1) && context.grant == .owner)
        #expect(named.clientName == "app" && named.peer == Peer(uid: 8, pid: 2) && !named.grant.isOwner)
        #expect(named.submitter == context.submitter)
        #expect(RequestContext(peer: Peer(uid: 7, pid: 1), grant: .owner, clientName: "").submitter != context.submitter)
    }

    @Test func theRequestLogSeesEveryRequestWithItsOutcomeButNoPayload() async throws {
        let lines = LogCapture()
        var logger = Logger(label: "test", factory: { _ in lines })
        logger.logLevel = .debug
        try await withBroker(logger: logger) { broker in
            _ = await ask(broker, .write(store: "s", .insert([Item(id: "a", payload: Payload("PAYLOAD-BYTES"))])))
            _ = await ask(broker, .count(store: "bad name"))
            _ = await ask(broker, .setValue(namespace: .secureValue, name: "token", value: Payload("SECRET-BYTES"), condition: .unconditional))
        }
        let requests = lines.messages.filter { $0.hasPrefix("request ") }
        #expect(requests.count == 3)
        #expect(requests[0].contains("request=insert") && requests[0].contains("name=s") && requests[0].contains("sequence=1"))
        #expect(requests[1].contains("error.code=invalidName"))
        #expect(requests[2].contains("request=setValue") && requests[2].contains("name=token"))
        #expect(!lines.messages.joined().contains("PAYLOAD-BYTES"))
        #expect(!lines.messages.joined().contains("SECRET-BYTES"))
    }
}

/// A log handler that keeps "message key=value ..." lines.
private final class LogCapture: LogHandler, @unchecked Sendable {
    private let lock = NSLock()
    private var lines: [String] = []
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let all = metadata.merging(event.metadata ?? [:]) { $1 }
        let line = "\(event.message) " + all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        lock.withLock { lines.append(line) }
    }

    var messages: [String] { lock.withLock { lines } }
}
