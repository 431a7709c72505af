import Wire

/// The checks every request passes before it reaches a store: valid names and ids, items within the size
/// limit, batches within the count limit. Each failure answers that request alone.
struct RequestLimits {
    let maxItemLength: Int
    let maxBatch: Int

    init(_ configuration: BrokerConfiguration) {
        maxItemLength = configuration.maxItemLength
        maxBatch = configuration.maxBatch
    }

    func check(_ request: ClientMessage) throws(WireError) {
        if let store = request.storeName { try checkName(store) }
        switch request {
        case .insert(let m): try checkItems(m.items, total: m.items.count)
        case .remove(let m): try checkIDs(m.ids, total: m.ids.count)
        case .getItems(let m): try checkIDs(m.ids, total: m.ids.count)
        case .queryRange(let m): if let after = m.after { try checkID(after) }
        case .listIDs(let m): if let after = m.after { try checkID(after) }
        case .chain(let m):
            var total = m.steps.count
            for step in m.steps {
                switch step {
                case .insert(let items): total += items.count
                case .remove(let ids): total += ids.count
                case .removeAll: break
                }
            }
            try checkBatch(total)
            for step in m.steps {
                switch step {
                case .insert(let items): try checkItems(items, total: 0)
                case .remove(let ids): try checkIDs(ids, total: 0)
                case .removeAll: break
                }
            }
        case .getValue(let m): try checkName(m.name)
        case .setValue(let m): try checkName(m.name)
        case .resetValue(let m): try checkName(m.name)
        default: break
        }
    }

    private func checkName(_ name: String) throws(WireError) {
        if let problem = Naming.problem(withName: name) {
            throw WireError(.invalidName, "invalid name \(name.debugDescription): \(problem)")
        }
    }

    private func checkID(_ id: ItemID) throws(WireError) {
        if let problem = Naming.problem(withID: id) {
            throw WireError(.invalidID, "invalid id \(String(id.string.prefix(64)).debugDescription): \(problem)")
        }
    }

    private func checkBatch(_ total: Int) throws(WireError) {
        if total > maxBatch {
            throw WireError(.batchTooLarge, "the request holds \(total) items, ids or steps; the limit is \(maxBatch)")
        }
    }

    private func checkItems(_ items: [Item], total: Int) throws(WireError) {
        try checkBatch(total)
        for item in items {
            try checkID(item.id)
            if item.payload.count > maxItemLength {
                throw WireError(
                    .itemTooLarge,
                    "item \(String(item.id.string.prefix(64)).debugDescription) is \(item.payload.count) bytes; "
                        + "the limit is \(maxItemLength)")
            }
        }
    }

    private func checkIDs(_ ids: [ItemID], total: Int) throws(WireError) {
        try checkBatch(total)
        for id in ids { try checkID(id) }
    }
}
