import NIOCore
import StoreModel

// What the broker is asked, what it answers and what it pushes to subscribers: its own language. The daemon
// maps the protocol's messages onto these (BrokerServer, `WireMapping`); a protocol change stops there.

/// One request to the broker.
public enum BrokerCommand: Sendable {
    /// The engines the broker could use.
    case listEngines
    /// Every existing store the peer may read, in name byte order.
    case listStores
    case storeInfo(store: String)
    case count(store: String)
    /// Items by id, in request order (missing ids answered as missing).
    case get(store: String, ids: [ItemID])
    /// Up to `limit` records after the cursor, in store order.
    case range(store: String, after: ItemID?, limit: UInt32)
    /// Up to `limit` ids after the cursor, in store order.
    case ids(store: String, after: ItemID?, limit: UInt32)
    case write(store: String, WriteOperation, condition: Condition = .unconditional)
    /// Deletes the store and its data.
    case drop(store: String, condition: Condition = .unconditional)
    /// `namespace` is `.value` or `.secureValue`.
    case getValue(namespace: Namespace, name: String)
    /// Every value (or secure value) ever set, reset ones included, by name; for another user only the values
    /// its rules let it read, and no secure values.
    case listValues(namespace: Namespace)
    /// `value` nil: reset.
    case setValue(namespace: Namespace, name: String, value: Payload?, condition: Condition)
    /// Needs the `Subscription` its pushes are queued in (`Broker.handle(_:subscription:)`).
    case subscribe(namespace: Namespace, name: String, start: SubscriptionStart)

    /// The command's name, for logs.
    public var name: String {
        switch self {
        case .listEngines: "listEngines"
        case .listStores: "listStores"
        case .storeInfo: "storeInfo"
        case .count: "count"
        case .get: "get"
        case .range: "range"
        case .ids: "ids"
        case .write(_, let write, _):
            switch write {
            case .insert: "insert"
            case .remove: "remove"
            case .removeAll: "removeAll"
            case .chain: "chain"
            }
        case .drop: "drop"
        case .getValue: "getValue"
        case .listValues: "listValues"
        case .setValue(_, _, let value, _): value == nil ? "resetValue" : "setValue"
        case .subscribe: "subscribe"
        }
    }

    /// The store, value or secure value the command is about, if any.
    public var target: (namespace: Namespace, name: String)? { withTarget { ($0, $1) } }

    /// `body` with the store, value or secure value the command is about (`nil` when there is none), the name read
    /// in place: `target` returns a copy, a retain and release of the name per request.
    public func withTarget<R, E: Error>(_ body: (Namespace, String) throws(E) -> R) throws(E) -> R? {
        switch self {
        case .listEngines, .listStores, .listValues: nil
        case .storeInfo(let store), .count(let store), .get(let store, _), .range(let store, _, _),
            .ids(let store, _, _), .write(let store, _, _), .drop(let store, _):
            try body(.store, store)
        case .getValue(let namespace, let name), .setValue(let namespace, let name, _, _),
            .subscribe(let namespace, let name, _):
            try body(namespace, name)
        }
    }

    /// Whether the command changes a store or value.
    public var isWrite: Bool {
        switch self {
        case .write, .drop, .setValue: true
        default: false
        }
    }
}

/// The answer to a command, each read at the position it was taken from.
public enum BrokerAnswer: Sendable {
    case engines([EngineInfo])
    case stores([StoreInfo])
    case storeInfo(StoreInfo)
    case count(Position, UInt64)
    case items(Position, [ItemSlot])
    case records(Position, [ItemRecord])
    case ids(Position, [ItemID])
    case written(CommitResult)
    case value(Position, ValueState)
    case values([ValueInfo])
    case subscribed(subscriptionID: UInt32)

    /// The answer's name, for logs.
    public var name: String {
        switch self {
        case .engines: "engines"
        case .stores: "stores"
        case .storeInfo: "storeInfo"
        case .count: "count"
        case .items: "items"
        case .records: "records"
        case .ids: "ids"
        case .written: "written"
        case .value: "value"
        case .values: "values"
        case .subscribed: "subscribed"
        }
    }
}
