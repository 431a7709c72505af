import Foundation
import StoreBrokerClient
import Wire

/// Sends many items to a store: in batches within the broker's limits (its `maxBatch` and frame size), several
/// batches in flight at once and in order, with a progress bar on stderr when it is a terminal.
struct ItemUpload {
    let connection: BrokerConnection
    let store: String
    var label = ""
    /// Batches sent back to back before waiting for their answers.
    var window = 8

    /// Consecutive batches within the broker's item count and frame size.
    func batches(_ items: [Item]) -> [[Item]] {
        let welcome = connection.welcome
        let budget = Int(welcome.maxFrameLength) - 1024
        var batches: [[Item]] = []
        var current: [Item] = []
        var size = 0
        for item in items {
            let length = item.id.string.utf8.count + item.payload.count + 8
            if !current.isEmpty, current.count >= Int(welcome.maxBatch) || size + length > budget {
                batches.append(current)
                current = []
                size = 0
            }
            current.append(item)
            size += length
        }
        if !current.isEmpty { batches.append(current) }
        return batches
    }

    /// Inserts `items` in order; only the first batch carries `condition`. Returns the last commit's result
    /// (`nil` when nothing changed). Stops at the first failure (the batches before it stay committed).
    func send(_ items: [Item], condition: Condition) async throws -> ServerMessage.WriteResult? {
        let all = batches(items)
        let progress = Progress(label: label.isEmpty ? "inserting into \(store)" : label, total: items.count)
        var last: ServerMessage.WriteResult?
        var done = 0
        var index = 0
        while index < all.count {
            let slice = all[index..<min(index + window, all.count)]
            let requests = slice.enumerated().map { offset, batch in
                ClientMessage.insert(
                    .init(store: store, condition: index + offset == 0 ? condition : .unconditional, items: batch))
            }
            for (batch, result) in zip(slice, try await connection.send(requests)) {
                let answer = try result.get()
                guard case .writeResult(let write) = answer else { throw unexpected(answer) }
                if write.committed { last = write }
                done += batch.count
            }
            progress.show(done)
            index += slice.count
        }
        progress.finish()
        return last
    }
}

/// `label: 45,000/100,000 items (45%)` redrawn in place on stderr, only when stderr is a terminal.
struct Progress {
    let label: String
    let total: Int
    let enabled = isatty(STDERR_FILENO) == 1

    func show(_ done: Int) {
        guard enabled, total > 0 else { return }
        let line = "\r\(label): \(done.formatted())/\(total.formatted()) items (\(done * 100 / total)%)"
        FileHandle.standardError.write(Data(line.utf8))
    }

    func finish() {
        if enabled, total > 0 { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}
