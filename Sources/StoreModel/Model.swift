import NIOCore

// The data a store is made of and the words its requests use: shared by the broker's core, the wire protocol
// (which encodes them: Wire/Structures.swift) and the client library. Plain values, no codec, no I/O.

/// What a conditional write expects to find.
public enum Condition: Hashable, Sendable, Codable {
    /// Write whatever the current state.
    case unconditional
    /// The store (in its current epoch) or the value is at exactly this sequence.
    case sequence(UInt64)
    /// The store does not exist, or the value is unset.
    case absent
    /// The store or value is at this epoch and this sequence.
    case epochSequence(epoch: UInt64, sequence: UInt64)
}

/// Which namespace a name lives in.
public enum Namespace: UInt8, Hashable, Sendable, Codable, CaseIterable {
    /// Stores of items.
    case store = 0
    /// Values (Boutique's @StoredValue).
    case value = 1
    /// Secure values (@SecurelyStoredValue): encrypted at rest, never sent in pushes.
    case secureValue = 2
}

/// Where a subscription starts.
public enum SubscriptionStart: Hashable, Sendable, Codable {
    /// A snapshot first, then every later event.
    case snapshot
    /// Every event after this one, or `historyGone` then a snapshot.
    case resume(epoch: UInt64, sequence: UInt64)
}

/// The state of a value or secure value.
public enum ValueState: Hashable, Sendable, Codable {
    /// Unset (never set, or reset).
    case unset
    /// Set, with its bytes.
    case set(Payload)
    /// Set, bytes withheld (a secure value in a push).
    case setWithheld
}

/// An item as a client writes it.
public struct Item: Hashable, Sendable, Codable {
    public var id: ItemID
    public var payload: Payload

    public init(id: ItemID, payload: Payload) {
        self.id = id
        self.payload = payload
    }
}

extension Item {
    /// The id and payload of a kept item (views of it: no copy).
    public init(kept item: KeptItem) {
        self.init(id: ItemID(kept: item), payload: Payload(kept: item))
    }

    /// The kept item whose id and payload these are, if they are one's.
    @inlinable
    public var keptItem: KeptItem? {
        guard let item = payload.keptItem, id.keptItem?.isSame(as: item) == true else { return nil }
        return item
    }
}

/// An item as the broker holds it. Times are milliseconds since the Unix epoch, stamped by the daemon.
public struct ItemRecord: Hashable, Sendable, Codable {
    public var id: ItemID
    public var createdAt: UInt64
    public var updatedAt: UInt64
    public var payload: Payload

    public init(id: ItemID, createdAt: UInt64, updatedAt: UInt64, payload: Payload) {
        self.id = id
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.payload = payload
    }
}

/// One answer slot of a get-by-ids, in request order.
public enum ItemSlot: Hashable, Sendable, Codable {
    case missing(ItemID)
    case present(ItemRecord)
}

/// One step of a chain.
public enum ChainStep: Hashable, Sendable, Codable {
    case insert(items: [Item])
    case remove(ids: [ItemID])
    case removeAll
}

/// One step of a committed event. A removeAll is reported as a remove of every id it removed.
public enum EventStep: Hashable, Sendable, Codable {
    case insert(records: [ItemRecord])
    case remove(ids: [ItemID])
}

/// A store as listed. A store that does not exist has epoch 0, sequence 0, count 0 and an empty engine name.
public struct StoreInfo: Hashable, Sendable, Codable {
    public var name: String
    public var epoch: UInt64
    public var sequence: UInt64
    public var count: UInt64
    public var engine: String

    public init(name: String, epoch: UInt64, sequence: UInt64, count: UInt64, engine: String) {
        self.name = name
        self.epoch = epoch
        self.sequence = sequence
        self.count = count
        self.engine = engine
    }

    /// The epoch of a store that cannot be served whose manifest cannot be read either.
    public static let unknownEpoch = UInt64.max

    /// The store exists but cannot be served (its engine cannot be loaded, its files are lost or damaged):
    /// listed with an epoch and sequence 0, a combination no healthy store has. A request on it says why.
    public var isBroken: Bool { epoch != 0 && sequence == 0 }
}

/// A value (or secure value) as listed: its namespace's epoch, its own sequence, and whether it is set now (a
/// reset value is listed, unset, with the sequence of its reset).
public struct ValueInfo: Hashable, Sendable, Codable {
    public var name: String
    public var epoch: UInt64
    public var sequence: UInt64
    public var isSet: Bool

    public init(name: String, epoch: UInt64, sequence: UInt64, isSet: Bool) {
        self.name = name
        self.epoch = epoch
        self.sequence = sequence
        self.isSet = isSet
    }
}

/// How an engine file on the search path stands.
public enum EngineStatus: UInt8, Hashable, Sendable, Codable {
    /// A file on the search path that passes the checks made before loading; not opened, so its version and
    /// ABI are not known (a listing never loads a file: that would run its code).
    case found = 0
    /// Loaded by the daemon; version and ABI are the engine's.
    case loaded = 1
    /// Refused; `detail` says why (unsafe permissions, not an engine, a wrong ABI, shadowed...).
    case refused = 2
}

/// The capability bits an engine reports.
public struct EngineCapabilities: OptionSet, Hashable, Sendable, Codable {
    public var rawValue: UInt32

    public init(rawValue: UInt32) {
        self.rawValue = rawValue
    }

    /// Data survives a restart.
    public static let persistent = EngineCapabilities(rawValue: 1 << 0)
    /// `apply` is all-or-nothing, so chains are allowed.
    public static let atomic = EngineCapabilities(rawValue: 1 << 1)
    /// `apply` never waits for I/O (ABI 1.1): the broker may commit on the event loop the request came in on.
    public static let nonblocking = EngineCapabilities(rawValue: 1 << 2)
    /// The store's data lives in a database other brokers may share (ABI 2.1): a store is its name, not its
    /// directory.
    public static let shared = EngineCapabilities(rawValue: 1 << 3)
}

/// An engine as listed: `detail` is the engine's version text, or why it cannot be used.
public struct EngineInfo: Hashable, Sendable, Codable {
    public var name: String
    public var path: String
    public var status: EngineStatus
    public var abiMajor: UInt16
    public var abiMinor: UInt16
    public var capabilities: EngineCapabilities
    public var detail: String

    public init(
        name: String, path: String, status: EngineStatus, abiMajor: UInt16, abiMinor: UInt16,
        capabilities: EngineCapabilities, detail: String
    ) {
        self.name = name
        self.path = path
        self.status = status
        self.abiMajor = abiMajor
        self.abiMinor = abiMinor
        self.capabilities = capabilities
        self.detail = detail
    }
}
