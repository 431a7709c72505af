import BrokerCore
import NIOCore

/// What the connections of the broker's owner loop hand over to each other within one turn of the loop: the
/// writes they read, submitted together, and the connections the broker has answered outside their own events,
/// each taken once.
///
/// Writes. With many clients each waiting for its answer, a read cycle holds one write. Submitted connection by
/// connection, each would be a group commit of its own, paying a group's fixed costs (the planner, the engine
/// call, the history, the broadcast) per write. Here the writes of the connections one turn reads after the first
/// are admitted into one `Broker.WriteBatch` as they arrive and submitted once, by a task on the loop (NIO runs a
/// turn's tasks after its I/O events): one group per store, and each connection takes the answers that commit gave
/// it in one batch and flushes once (it is `performing` while the batch is submitted). The turn's first writes are
/// submitted at once: a lone client's write waits for no task.
///
/// Answers. A commit that comes back from a blocking thread, or a load, answers many connections outside their
/// own events. Each connection gathers what it is given (answers, pushes waiting) and joins `answered` once; one
/// task takes them all, each connection taking its gathered answers as one event and flushing once.
final class LoopTurn: Sendable {
    private let broker: Broker
    private let eventLoop: any EventLoop
    private let turn: NIOLoopBoundBox<Turn>

    private struct Turn {
        var batch = Broker.WriteBatch()
        /// The batch the turn's first connection's writes are submitted in at once, kept emptied for the next turn
        /// (its lists keep their capacity: no allocation per turn).
        var first = Broker.WriteBatch()
        /// The connections whose writes are in `batch`, each once.
        var connections: [ConnectionHandler] = []
        /// The list the last submission emptied, kept for the next turn (no allocation per turn).
        var spare: [ConnectionHandler] = []
        var scheduled = false
        /// The connections with answers or pushes gathered outside their own events, each once.
        var answered: [ConnectionHandler] = []
        var spareAnswered: [ConnectionHandler] = []
        var answersScheduled = false

        /// The turn's batch and connections, taken out for submission; the next turn starts empty.
        mutating func take() -> (Broker.WriteBatch, [ConnectionHandler]) {
            var taken: [ConnectionHandler] = []
            swap(&taken, &connections)
            swap(&connections, &spare)
            scheduled = false
            var takenBatch = Broker.WriteBatch()
            swap(&takenBatch, &batch)
            return (takenBatch, taken)
        }

        /// The connections answered since the last time, taken out; the next ones start a new list.
        mutating func takeAnswered() -> [ConnectionHandler] {
            var taken: [ConnectionHandler] = []
            swap(&taken, &answered)
            swap(&answered, &spareAnswered)
            answersScheduled = false
            return taken
        }

        /// What a submission emptied, kept for the next turn.
        mutating func giveBack(_ emptied: consuming Broker.WriteBatch, _ list: consuming [ConnectionHandler]) {
            spare = list
            if batch.isEmpty { batch = emptied }
        }
    }

    /// For the connections of `broker`'s owner loop.
    init(broker: Broker) {
        self.broker = broker
        self.eventLoop = broker.owner
        turn = NIOLoopBoundBox.makeBoxSendingValue(Turn(), eventLoop: broker.owner)
    }

    /// Submits `requests` (writes; their commands are moved out, see `Broker.handle`) from `connection` now if they
    /// are the turn's first, else admits them, to be submitted at the end of this turn of the loop. A write an
    /// interceptor refuses is answered here.
    func add(_ requests: inout [BrokerRequest], context: RequestContext, from connection: ConnectionHandler) {
        guard turn.value.scheduled else {
            // The turn's first: at once (the connection is performing, so what the commit gives it is taken when
            // its actions are done); the task that ends the turn gathers the writes of the connections after it.
            turn.value.scheduled = true
            eventLoop.execute { self.submit() }
            var first = Broker.WriteBatch()
            swap(&first, &turn.value.first)
            broker.handle(&requests, context: context, into: &first)
            broker.submit(&first)
            swap(&first, &turn.value.first)
            return
        }
        // Taken out while the broker runs: a refusal answers the connection, which must not find the turn in use.
        var batch = Broker.WriteBatch()
        swap(&batch, &turn.value.batch)
        broker.handle(&requests, context: context, into: &batch)
        swap(&batch, &turn.value.batch)
        if !connection.writesInTurn {
            connection.writesInTurn = true
            turn.value.connections.append(connection)
        }
    }

    private func submit() {
        var (batch, connections) = turn.value.take()
        if !connections.isEmpty {  // else only the turn's first connection wrote: submitted already
            for connection in connections { connection.beginTakingAnswers() }
            broker.submit(&batch)
            for connection in connections {
                connection.writesInTurn = false
                connection.endTakingAnswers()
            }
            connections.removeAll(keepingCapacity: true)
        }
        turn.value.giveBack(batch, connections)
    }

    /// `connection` has gathered answers or pushes outside its own events: it takes them in the task that takes
    /// every such connection (scheduled by the first).
    func answered(_ connection: ConnectionHandler) {
        guard !connection.answersInTurn else { return }
        connection.answersInTurn = true
        turn.value.answered.append(connection)
        guard !turn.value.answersScheduled else { return }
        turn.value.answersScheduled = true
        eventLoop.execute { self.takeAnswered() }
    }

    private func takeAnswered() {
        var connections = turn.value.takeAnswered()
        for connection in connections {
            connection.answersInTurn = false
            connection.takeAnswered()
        }
        connections.removeAll(keepingCapacity: true)
        turn.value.spareAnswered = connections
    }
}
