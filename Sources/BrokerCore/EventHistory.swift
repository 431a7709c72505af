import DequeModule
import StoreModel

/// A store's recent events, for subscribers that resume: at most `maxCount` commits and `maxBytes` bytes
/// (ids and payloads), the oldest dropped first.
struct EventHistory {
    private(set) var events = Deque<Commit>()
    private var sizes = Deque<Int>()
    private(set) var bytes = 0

    var oldestSequence: UInt64? { events.first?.sequence }

    /// Appends `event`; the events it pushes out go to `evicted`, for the caller to release.
    mutating func append(_ event: Commit, maxCount: Int, maxBytes: Int, evicted: inout [Commit]) {
        let size = Self.size(of: event)
        events.append(event)
        sizes.append(size)
        bytes += size
        while let first = sizes.first, events.count > maxCount || bytes > maxBytes {
            evicted.append(events.removeFirst())
            sizes.removeFirst()
            bytes -= first
        }
    }

    /// The bytes an event keeps alive: its ids and payloads, plus a little per record.
    static func size(of event: Commit) -> Int {
        var total = 64
        for step in event.steps {
            switch step {
            case .insert(let records):
                for index in records.indices {  // not `for record in records`: that copies each record out
                    total += 32 + records[index].id.utf8Count + records[index].payload.count
                }
            case .remove(let ids):
                for id in ids { total += 16 + id.utf8Count }
            }
        }
        return total
    }
}
