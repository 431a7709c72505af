#if canImport(Glibc)
import Glibc
#endif
import Logging
import Synchronization
import StoreModel

// The interceptor chain (ComposeStore's idea): every request passes through an ordered list of interceptors
// before it reaches a store. Each may let it pass, reject it with a typed error, and observe what came of it.
//
// Adding one: write a type that conforms to `RequestInterceptor`, then hand the broker a chain that includes
// it (`Broker(configuration:engines:owner:blocking:logger:interceptors:)`, starting from
// `Broker.standardInterceptors`). `check` runs on the broker's owner loop for every request, every connection's and
// every store's work waiting meanwhile: it must be quick and must not block.

/// Who sent a request: the peer's credentials, read with SO_PEERCRED when it connected.
public struct Peer: Hashable, Sendable {
    public var uid: UInt32
    public var pid: Int32

    public init(uid: UInt32, pid: Int32) {
        self.uid = uid
        self.pid = pid
    }
}

/// `--allow-uid UID[:STORE-GLOB[:ro]]`: another user admitted to every store and value (no glob, or `*`), to
/// those whose names match the glob (`fnmatch`), read-only with `:ro`. Secure values stay the daemon's
/// user's (and root's) alone.
public struct AccessRule: Hashable, Sendable, CustomStringConvertible {
    public var uid: UInt32
    public var glob: String
    public var readOnly: Bool

    public init(uid: UInt32, glob: String = "*", readOnly: Bool = false) {
        self.uid = uid
        self.glob = glob
        self.readOnly = readOnly
    }

    /// Parses `UID[:GLOB[:ro]]`; UID may also be a user name.
    public init?(parsing text: String) {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false).map(String.init)
        guard (1...3).contains(parts.count), !parts[0].isEmpty else { return nil }
        if let uid = UInt32(parts[0]) {
            self.uid = uid
        } else if let entry = getpwnam(parts[0]) {
            self.uid = entry.pointee.pw_uid
        } else {
            return nil
        }
        glob = parts.count > 1 && !parts[1].isEmpty ? parts[1] : "*"
        if parts.count == 3, parts[2] != "ro" { return nil }
        readOnly = parts.count == 3
    }

    func matches(_ name: String) -> Bool { fnmatch(glob, name, 0) == 0 }

    public var description: String { "\(uid):\(glob)\(readOnly ? ":ro" : "")" }
}

/// What one connection's peer may do, decided when it connects.
public struct Grant: Hashable, Sendable {
    /// The daemon's own user or root: everything.
    public var isOwner: Bool
    /// For another user: the rules that admit it.
    public var rules: [AccessRule]

    public static let owner = Grant(isOwner: true, rules: [])

    public init(isOwner: Bool, rules: [AccessRule]) {
        self.isOwner = isOwner
        self.rules = rules
    }

    /// Whether the peer may read (or, with `write`, change) the store or value `name`.
    public func allows(_ name: String, write: Bool) -> Bool {
        isOwner || rules.contains { $0.matches(name) && (!write || !$0.readOnly) }
    }
}

/// Who may connect: the daemon's user, root, and the `--allow-uid` rules.
public struct AccessPolicy: Hashable, Sendable {
    public var ownUID: UInt32
    public var rules: [AccessRule]

    public init(ownUID: UInt32, rules: [AccessRule] = []) {
        self.ownUID = ownUID
        self.rules = rules
    }

    /// The grant for a peer of `uid`, or `nil` when it is not admitted at all.
    public func grant(for uid: UInt32) -> Grant? {
        if uid == ownUID || uid == 0 { return .owner }
        let mine = rules.filter { $0.uid == uid }
        return mine.isEmpty ? nil : Grant(isOwner: false, rules: mine)
    }
}

/// Everything an interceptor knows about a request besides the request itself.
///
/// Its fields live in one object: every request carries its connection's context through the broker, and a copy
/// costs one reference count, not one for each field that holds a reference (the grant's rules, the client's
/// name). Setting a field makes a new object; `submitter` stays the context's.
public struct RequestContext: Sendable {
    private final class Fields: Sendable {
        let peer: Peer
        let grant: Grant
        let clientName: String
        let submitter: UInt64

        init(peer: Peer, grant: Grant, clientName: String, submitter: UInt64) {
            self.peer = peer
            self.grant = grant
            self.clientName = clientName
            self.submitter = submitter
        }
    }

    private var fields: Fields

    public var peer: Peer {
        get { fields.peer }
        set { fields = Fields(peer: newValue, grant: grant, clientName: clientName, submitter: submitter) }
    }
    public var grant: Grant {
        get { fields.grant }
        set { fields = Fields(peer: peer, grant: newValue, clientName: clientName, submitter: submitter) }
    }
    /// The name the client gave in its `hello`.
    public var clientName: String {
        get { fields.clientName }
        set { fields = Fields(peer: peer, grant: grant, clientName: newValue, submitter: submitter) }
    }
    /// Tells this context's requests from other contexts' (a connection's, for the daemon): a store's writer
    /// groups the writes of the writers it has just answered (see `ManagedStore`).
    public var submitter: UInt64 { fields.submitter }

    public init(peer: Peer, grant: Grant, clientName: String) {
        fields = Fields(
            peer: peer, grant: grant, clientName: clientName, submitter: Self.submitters.add(1, ordering: .relaxed).newValue)
    }

    private static let submitters = Atomic<UInt64>(0)

    /// The daemon itself (tests, the testing product).
    public static let owner = RequestContext(peer: Peer(uid: getuid(), pid: getpid()), grant: .owner, clientName: "")
}

/// One link of the chain.
public protocol RequestInterceptor: Sendable {
    /// For logs and docs.
    var name: String { get }
    /// Before the request goes on: `nil` to let it pass, or the error that answers it (the interceptors after
    /// this one are not asked).
    func check(_ command: BrokerCommand, context: RequestContext) -> BrokerError?
    /// After the request was answered (or rejected, by any interceptor): what it got and how long it took.
    func observe(
        _ command: BrokerCommand, context: RequestContext, outcome: Result<BrokerAnswer, BrokerError>,
        duration: Duration)
    /// Whether `observe` does anything: read once, when the broker is built. When no interceptor observes, a
    /// request's answer goes straight to its connection (no clock read, no closure around it). Defaults to true.
    var observesOutcomes: Bool { get }
    /// Whether `check` can refuse anything: read once, when the broker is built. An interceptor that only
    /// observes is not asked per request (asking an interceptor in an array copies it out). Defaults to true.
    var checksRequests: Bool { get }
}

extension RequestInterceptor {
    public var observesOutcomes: Bool { true }
    public var checksRequests: Bool { true }

    public func observe(
        _ command: BrokerCommand, context: RequestContext, outcome: Result<BrokerAnswer, BrokerError>,
        duration: Duration
    ) {}
}

/// `--allow-uid`: a peer of another user reaches only the stores and values its rules name, writes only
/// where they are not read-only, and never reaches secure values.
public struct AccessInterceptor: RequestInterceptor {
    public var name: String { "access" }
    public var observesOutcomes: Bool { false }
    public init() {}

    public func check(_ command: BrokerCommand, context: RequestContext) -> BrokerError? {
        guard !context.grant.isOwner else { return nil }  // read in place; the grant is copied only when needed
        let grant = context.grant
        if case .listValues(.secureValue) = command {
            return BrokerError(
                .permissionDenied, "secure values are only for the daemon's own user; uid \(context.peer.uid) is not")
        }
        guard let target = command.target else { return nil }  // listStores, listValues (filtered), listEngines
        if target.namespace == .secureValue {
            return BrokerError(
                .permissionDenied, "secure values are only for the daemon's own user; uid \(context.peer.uid) is not")
        }
        let what = target.namespace == .store ? "store" : "value"
        if command.isWrite {
            guard grant.allows(target.name, write: true) else {
                let readable = grant.allows(target.name, write: false)
                return BrokerError(
                    .permissionDenied,
                    "uid \(context.peer.uid) may not change \(what) \(target.name)\(readable ? " (read-only)" : "")")
            }
        } else if !grant.allows(target.name, write: false) {
            return BrokerError(.permissionDenied, "uid \(context.peer.uid) may not read \(what) \(target.name)")
        }
        return nil
    }
}

/// `--max-item`, `--max-batch` and the naming rules: valid names and ids, payloads within the size limit,
/// batches within the count limit. (`--max-frame` is enforced before there is a request at all: the codec
/// refuses a frame over the limit from its header.)
public struct LimitsInterceptor: RequestInterceptor {
    // Computed, not stored: with its two limits the interceptor fits an existential's inline buffer, so the broker's
    // list of interceptors holds it without a box that every request's check retains and releases.
    public var name: String { "limits" }
    public var observesOutcomes: Bool { false }
    public let maxItemLength: Int
    public let maxBatch: Int

    public init(maxItemLength: Int, maxBatch: Int) {
        self.maxItemLength = maxItemLength
        self.maxBatch = maxBatch
    }

    public func check(_ command: BrokerCommand, context: RequestContext) -> BrokerError? {
        do throws(BrokerError) {
            try checkThrowing(command)
            return nil
        } catch {
            return error
        }
    }

    private func checkThrowing(_ command: BrokerCommand) throws(BrokerError) {
        switch command {
        case .getValue(let namespace, _), .setValue(let namespace, _, _, _), .listValues(let namespace):
            try checkValueNamespace(namespace)
        default: break
        }
        try command.withTarget { (_, name) throws(BrokerError) in try checkName(name) }
        switch command {
        case .write(_, .insert(let items), _): try checkItems(items, total: items.count)
        case .write(_, .remove(let ids), _): try checkIDs(ids, total: ids.count)
        case .get(_, let ids): try checkIDs(ids, total: ids.count)
        case .range(_, let after, _), .ids(_, let after, _): if let after { try checkID(after) }
        case .write(_, .chain(let steps), _):
            try checkBatch(steps.reduce(steps.count) { total, step in
                switch step {
                case .insert(let items): total + items.count
                case .remove(let ids): total + ids.count
                case .removeAll: total
                }
            })
            for step in steps {
                switch step {
                case .insert(let items): try checkItems(items, total: 0)
                case .remove(let ids): try checkIDs(ids, total: 0)
                case .removeAll: break
                }
            }
        case .setValue(_, _, let value, _):
            if let value, value.count > maxItemLength {
                throw BrokerError(.itemTooLarge, "the value is \(value.count) bytes; the limit is \(maxItemLength)")
            }
        default: break
        }
    }

    private func checkValueNamespace(_ namespace: Namespace) throws(BrokerError) {
        guard namespace != .store else {
            throw BrokerError(.invalidRequest, "value requests take namespace 1 (value) or 2 (secure value)")
        }
    }

    private func checkName(_ name: String) throws(BrokerError) {
        if let problem = Naming.problem(withName: name) {
            throw BrokerError(.invalidName, "invalid name \(String(name.prefix(64)).debugDescription): \(problem)")
        }
    }

    @inline(__always)  // an opaque call would retain each id it is given (see `ItemID.==`)
    private func checkID(_ id: ItemID) throws(BrokerError) {
        if let problem = Naming.problem(withID: id) {
            throw BrokerError(.invalidID, "invalid id \(String(id.string.prefix(64)).debugDescription): \(problem)")
        }
    }

    private func checkBatch(_ total: Int) throws(BrokerError) {
        if total > maxBatch {
            throw BrokerError(.batchTooLarge, "the request holds \(total) items, ids or steps; the limit is \(maxBatch)")
        }
    }

    private func checkItems(_ items: [Item], total: Int) throws(BrokerError) {
        try checkBatch(total)
        for index in items.indices {
            // The explaining check only for an id found invalid: it hands the id to an opaque call, and the
            // caller keeps each id retained around such a call.
            if !Naming.isValid(id: items[index].id) { try checkID(items[index].id) }
            if items[index].payload.count > maxItemLength {
                let id = items[index].id.string.prefix(64)
                throw BrokerError(
                    .itemTooLarge,
                    "item \(String(id).debugDescription) is \(items[index].payload.count) bytes; "
                        + "the limit is \(maxItemLength)")
            }
        }
    }

    private func checkIDs(_ ids: [ItemID], total: Int) throws(BrokerError) {
        try checkBatch(total)
        for id in ids { try checkID(id) }
    }
}

/// At `--log-level debug`: one line per request with who sent it, what it named, what came of it and how
/// long it took. Never a payload or a value.
public struct RequestLogInterceptor: RequestInterceptor {
    public var name: String { "log" }
    public let logger: Logger
    /// Only at `--log-level debug`, where it logs a line per request.
    public var observesOutcomes: Bool { logger.logLevel <= .debug }
    public var checksRequests: Bool { false }

    public init(logger: Logger) {
        self.logger = logger
    }

    public func check(_ command: BrokerCommand, context: RequestContext) -> BrokerError? { nil }

    public func observe(
        _ command: BrokerCommand, context: RequestContext, outcome: Result<BrokerAnswer, BrokerError>,
        duration: Duration
    ) {
        guard logger.logLevel <= .debug else { return }
        var metadata: Logger.Metadata = [
            "request": "\(command.name)", "peer.uid": "\(context.peer.uid)", "peer.pid": "\(context.peer.pid)",
            "client": "\(context.clientName)",
            "duration.us": "\(duration.components.seconds * 1_000_000 + duration.components.attoseconds / 1_000_000_000_000)",
        ]
        if let target = command.target { metadata["name"] = "\(target.name)" }
        switch outcome {
        case .success(.written(let result)):
            metadata["committed"] = "\(result.committed)"
            metadata["sequence"] = "\(result.sequence)"
        case .success: break
        case .failure(let error): metadata.merge(error.logMetadata) { $1 }
        }
        logger.debug("request", metadata: metadata)
    }
}
