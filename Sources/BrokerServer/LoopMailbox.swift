import Locking
import NIOCore

/// The connections of one event loop that have answers or pushes waiting in their inboxes, taken by one task on
/// that loop.
///
/// A commit made on another thread (a writer, or the other event loop committing for the memory engine) answers
/// many connections at once. Each connection gathers its answers in its own inbox, and the inbox's connection
/// joins its loop's mailbox: only the first connection of a batch schedules the one task that takes them all (a
/// task per connection would be a task, a closure and often a wake-up of the loop per connection answered, as
/// many per commit as clients).
final class LoopMailbox: Sendable {
    let eventLoop: any EventLoop

    private struct State {
        var waiting: [NIOLoopBound<ConnectionHandler>] = []
        /// The list the last task emptied, kept for the next batch (no allocation per batch).
        var spare: [NIOLoopBound<ConnectionHandler>] = []
    }
    private let state = Locked(State())

    private init(eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    /// Adds a connection whose inbox has just been given something to take; true when the caller must hand off
    /// `schedule()` (the mailbox was empty: no task is on its way).
    func post(_ connection: NIOLoopBound<ConnectionHandler>) -> Bool {
        state.withLock { state in
            state.waiting.append(connection)
            return state.waiting.count == 1
        }
    }

    /// Schedules the task that takes every connection waiting.
    func schedule() {
        eventLoop.execute { self.takeAll() }
    }

    private func takeAll() {
        var connections = state.withLock { state in
            var taken: [NIOLoopBound<ConnectionHandler>] = []
            swap(&taken, &state.waiting)
            swap(&state.waiting, &state.spare)
            return taken
        }
        for index in connections.indices { connections[index].value.takeInbox() }
        connections.removeAll(keepingCapacity: true)
        state.withLock { state in
            if state.spare.capacity < connections.capacity { state.spare = connections }
        }
    }

    /// The mailbox of `eventLoop`: one per loop while connections of that loop hold it (they keep it, and it keeps
    /// its loop, alive; the registry only finds it, so that a test's short-lived loops are not kept forever).
    static func of(_ eventLoop: any EventLoop) -> LoopMailbox {
        registry.object(for: [ObjectIdentifier(eventLoop)]) { LoopMailbox(eventLoop: eventLoop) }
    }

    private static let registry = WeakRegistry<LoopMailbox>()
}

/// Objects found by key while something else holds them: an entry whose object is gone is dropped when the next
/// one is made.
final class WeakRegistry<Object: AnyObject & Sendable>: Sendable {
    private final class Entry: @unchecked Sendable {
        // `@unchecked Sendable`: written only at creation, under the registry's lock.
        weak var object: Object?
        init(_ object: Object) { self.object = object }
    }

    private let entries = Locked<[[ObjectIdentifier]: Entry]>([:])

    /// The live object for `key`, or the one `make` makes.
    func object(for key: [ObjectIdentifier], make: () -> Object) -> Object {
        entries.withLock { entries in
            if let existing = entries[key]?.object { return existing }
            entries = entries.filter { $0.value.object != nil }
            let made = make()
            entries[key] = Entry(made)
            return made
        }
    }
}
