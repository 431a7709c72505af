import BrokerCore
import Wire

// The one place where the protocol meets the broker: a client's message becomes a `BrokerCommand` (or stays
// with the connection: ping, unsubscribe), and the broker's answers, pushes and errors become messages.

/// A request as the connection sees it: the connection's own business, or a command for the broker.
enum ConnectionRequest: Sendable {
    case ping
    case unsubscribe(subscriptionID: UInt32)
    case command(BrokerCommand)
    /// A write whose event the connection's subscription `subscriptionID` is not sent (`quietChain`).
    case quietWrite(subscriptionID: UInt32, BrokerCommand)

    /// `nil` for `hello`, which the session handles before any request reaches the connection.
    init?(_ message: consuming ClientMessage) {
        switch consume message {
        case .hello: return nil  // the only one: see `ConnectionStateMachine.accept`
        case .ping: self = .ping
        case .unsubscribe(let m): self = .unsubscribe(subscriptionID: m.subscriptionID)
        case .listStores: self = .command(.listStores)
        case .listEngines: self = .command(.listEngines)
        case .getStoreInfo(let m): self = .command(.storeInfo(store: m.store))
        case .count(let m): self = .command(.count(store: m.store))
        case .getItems(let m): self = .command(.get(store: m.store, ids: m.ids))
        case .queryRange(let m): self = .command(.range(store: m.store, after: m.after, limit: m.limit))
        case .listIDs(let m): self = .command(.ids(store: m.store, after: m.after, limit: m.limit))
        // Inserted items arrive kept (`Item(wire:)` copies each into its own allocation, on the loop): the
        // store's writer copies nothing.
        case .insert(let m): self = .command(.write(store: m.store, .insert(m.items), condition: m.condition))
        case .remove(let m): self = .command(.write(store: m.store, .remove(m.ids), condition: m.condition))
        case .removeAll(let m): self = .command(.write(store: m.store, .removeAll, condition: m.condition))
        case .chain(let m): self = .command(.write(store: m.store, .chain(m.steps), condition: m.condition))
        case .drop(let m): self = .command(.drop(store: m.store, condition: m.condition))
        case .getValue(let m): self = .command(.getValue(namespace: m.namespace, name: m.name))
        case .listValues(let m): self = .command(.listValues(namespace: m.namespace))
        case .setValue(let m):
            self = .command(.setValue(namespace: m.namespace, name: m.name, value: m.value, condition: m.condition))
        case .resetValue(let m):
            self = .command(.setValue(namespace: m.namespace, name: m.name, value: nil, condition: m.condition))
        case .subscribe(let m): self = .command(.subscribe(namespace: m.namespace, name: m.name, start: m.start))
        case .quietChain(let m):
            // No step: an empty chain, which changes nothing (as a plain `chain` of none).
            let operation = WriteOperation(steps: m.elements) ?? .chain([])
            self = .quietWrite(subscriptionID: m.subscriptionID, .write(store: m.store, operation, condition: m.condition))
        }
    }

    /// Whether the request changes a store or value (later reads on the connection wait for it).
    var isWrite: Bool {
        switch self {
        case .command(let command): command.isWrite
        case .quietWrite: true
        case .ping, .unsubscribe: false
        }
    }
}

extension BrokerAnswer {
    /// The answer as the protocol sends it (consumed: what it holds moves into the message, uncopied).
    consuming func message() -> ServerMessage {
        switch consume self {
        case .engines(let engines): .engineList(.init(elements: engines))
        case .stores(let stores): .storeList(.init(elements: stores))
        case .storeInfo(let info): .storeInfoResult(.init(info: info))
        case .count(let at, let count): .countResult(.init(epoch: at.epoch, sequence: at.sequence, count: count))
        case .items(let at, let slots): .itemsResult(.init(epoch: at.epoch, sequence: at.sequence, elements: slots))
        case .records(let at, let records):
            .rangeResult(.init(epoch: at.epoch, sequence: at.sequence, elements: records))
        case .ids(let at, let ids): .idList(.init(epoch: at.epoch, sequence: at.sequence, elements: ids))
        case .written(let result):
            .writeResult(.init(committed: result.committed, epoch: result.epoch, sequence: result.sequence))
        case .value(let at, let state): .valueResult(.init(epoch: at.epoch, sequence: at.sequence, state: state))
        case .values(let values): .valueList(.init(elements: values))
        case .subscribed(let id): .subscribed(.init(subscriptionID: id))
        }
    }
}

extension BrokerError.Code {
    /// The protocol's code for it: the projection that crosses the socket.
    var wireCode: ErrorCode {
        switch self {
        case .invalidName: .invalidName
        case .invalidID: .invalidID
        case .itemTooLarge: .itemTooLarge
        case .batchTooLarge: .batchTooLarge
        case .conflict: .conflict
        case .cursorGone: .cursorGone
        case .notFound: .notFound
        case .permissionDenied: .permissionDenied
        case .invalidRequest: .invalidRequest
        case .notSupported: .notSupported
        case .engineError: .engineError
        case .engineUnavailable: .engineUnavailable
        case .storageFull: .storageFull
        case .shuttingDown: .shuttingDown
        case .internalError: .internalError
        }
    }
}

extension BrokerError {
    /// What the client is told: the code and the message (the cause and the location stay in the daemon's log).
    var wireError: WireError { WireError(code.wireCode, message) }
}
