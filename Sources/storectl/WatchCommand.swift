import ArgumentParser
import Foundation
import Locking
import StoreBrokerClient

struct Watch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Follow a store's events as NDJSON, one line per step, flushed line by line.",
        discussion: """
            First {"op":"loaded","store","epoch","sequence","count"} (with --from: {"op":"resumed",...} instead,
            then the events after that sequence), then per commit one line per step, each with the commit's
            epoch and sequence and its place in the commit:
            {"op":"insert","store","epoch","sequence","step","steps","ids":[...],"items":[...]} or
            {"op":"remove","store","epoch","sequence","step","steps","ids":[...]}. --from N resumes after commit
            N completed: a consumer that saw commit N only in part (step < steps) resumes with --from N-1. Also {"op":"lagged",...} (this watcher fell behind;
            it resumes from the last sequence it printed), {"op":"history-gone",...} (a fresh "loaded" follows)
            and {"op":"dropped",...} (the store was dropped; events of a new store follow from sequence 1).
            Runs until interrupted, or exits 69 when the broker goes away.

            Several stores may be named at once; --all follows every store, and stores created later from their
            first commit on. With --follow it reconnects when the broker goes away and
            resumes after the last commit printed ({"op":"resumed",...}, then what followed).

            Examples:
              storectl watch notes
              storectl watch notes --from 42 --epoch 1932943310210146
            """)

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The stores: one or more, followed at once (each line names its store).", completion: .storeNames)
    var stores: [String] = []
    @Flag(help: "Every store, and each store created later from its first commit on.") var all = false
    @Option(help: ArgumentHelp("Resume after this sequence instead of starting with a snapshot.", valueName: "sequence"))
    var from: UInt64?
    @Option(help: ArgumentHelp("The epoch --from belongs to (default: the store's current one).", valueName: "epoch"))
    var epoch: UInt64?
    @Flag(help: "When the broker goes away (a restart), reconnect and resume after the last commit printed.")
    var follow = false

    func validate() throws {
        if all != stores.isEmpty { throw ValidationError(all ? "--all takes no store names" : "name a store, or give --all") }
        if from != nil, stores.count != 1 { throw ValidationError("--from resumes one store: name only one") }
        if epoch != nil, from == nil { throw ValidationError("--epoch goes with --from") }
        if Set(stores).count != stores.count { throw ValidationError("a store is named twice") }
    }

    func run() async throws {
        try await reporting {
            // Each store on a connection of its own; the first that ends (an error, or the broker going away
            // without --follow) ends the command.
            if all { return try await watchAll() }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for store in stores {
                    group.addTask { try await watch(store, from: from.map { (epoch ?? 0, $0) }) }
                }
                _ = try await group.next()
                group.cancelAll()
            }
        }
    }

    /// `--all`: the stores there are now from their snapshots, and a store that appears later (the list is
    /// asked for twice a second) from its first commit on: it is resumed after sequence 0 of its epoch, so its
    /// commits made before it was noticed come as events too (or `history-gone` and its snapshot, when the
    /// daemon no longer holds them).
    private func watchAll() async throws {
        let failure = FirstFailure()
        try await withThrowingTaskGroup(of: Void.self) { group in
            var watched: Set<String> = []
            var first = true
            while true {
                if let error = failure.error {
                    group.cancelAll()
                    throw error
                }
                let listed: [StoreInfo]
                do {
                    let connection = try await global.connect()
                    listed = try await connection.stores()
                    await connection.close()
                } catch where follow && Self.brokerAway(error) {
                    listed = []  // the broker is away: each store's watch reconnects by itself
                }
                for info in listed where !watched.contains(info.name) && !info.isBroken {
                    watched.insert(info.name)
                    let start: (UInt64, UInt64)? = first ? nil : (info.epoch, 0)
                    group.addTask {
                        do {
                            try await watch(info.name, from: start)
                        } catch {
                            failure.record(error)
                        }
                    }
                }
                first = false
                try await Task.sleep(for: .milliseconds(500))
            }
        }
    }

    /// Follows one store for as long as the command runs (from its snapshot, or after `from`); with --follow,
    /// across the broker going away.
    private func watch(_ store: String, from: (epoch: UInt64, sequence: UInt64)?) async throws {
        let name = JSON.string(store)
        // The commit the lines printed so far end with: where a reconnection resumes.
        var position = from
        var backoff: Duration = .milliseconds(100)
        var resuming = from != nil
        var away = false  // said on stderr once per absence
        while true {
            do {
                let connection = try await global.connect()
                var start = SubscriptionStart.snapshot
                if var resumeAt = position {
                    if resumeAt.epoch == 0 { resumeAt.epoch = try await connection.storeInfo(store).epoch }
                    start = .resume(epoch: resumeAt.epoch, sequence: resumeAt.sequence)
                    if resuming {
                        Output.line(
                            "{\"op\":\"resumed\",\"store\":\(name),\"epoch\":\(resumeAt.epoch),\"sequence\":\(resumeAt.sequence)}")
                    }
                }
                backoff = .milliseconds(100)
                away = false
                try await print(store, name: name, connection: connection, from: start) { position = $0 }
            } catch where follow && Self.brokerAway(error) {
                // The broker went away, or is not back yet (no socket, a stale one, one not yet renamed into
                // place, a daemon shutting down): try again, resuming after the last commit printed.
                if !away, case let failure as Failure = error {
                    away = true
                    FileHandle.standardError.write(
                        Data("storectl: \(failure.message); waiting for it to come back\n".utf8))
                }
                try await Task.sleep(for: backoff)
                backoff = min(backoff * 2, .seconds(2))
                resuming = position != nil
            }
        }
    }

    /// The broker is away (not listening, going away, shutting down): what --follow waits through. A failed
    /// connection comes as storectl's `Failure`, a broken subscription as the library's error.
    private static func brokerAway(_ error: any Error) -> Bool {
        switch error {
        case let failure as Failure: failure.code == Failure.unavailable
        case let error as StoreBrokerError: Failure(error).code == Failure.unavailable
        default: false
        }
    }

    /// Prints the store's pushes until the subscription ends; `printed` is told the commit each push ends at.
    private func print(
        _ store: String, name: String, connection: BrokerConnection, from start: SubscriptionStart,
        printed: ((epoch: UInt64, sequence: UInt64)?) -> Void
    ) async throws {
        // --timeout bounds everything up to the first line: a snapshot's "loaded" must arrive in time too.
        let watchdog = Watchdog()
        if case .snapshot = start, let timeout = global.requestTimeout {
            watchdog.arm(after: timeout) { await connection.close() }
        }
        defer { Task { await connection.close() } }
        do {
            for try await push in connection.follow(name: store, from: start) {
                switch push {
                case .storeLoaded(let at, let records):
                    watchdog.disarm()
                    Output.line(
                        "{\"op\":\"loaded\",\"store\":\(name),\"epoch\":\(at.epoch),"
                            + "\"sequence\":\(at.sequence),\"count\":\(records.count)}")
                    if at.sequence == 0 {
                        // Nothing to see yet: a typo, or a store not made yet (its first commit will show).
                        FileHandle.standardError.write(
                            Data("storectl: store \(store) does not exist yet; waiting for its first commit\n".utf8))
                    }
                    printed((at.epoch, at.sequence))
                case .storeEvent(let event):
                    // Each line says which step of how many it is: a consumer that stopped inside a commit
                    // knows it saw only part of it (and resumes with --from the sequence before it).
                    for (index, step) in event.steps.enumerated() {
                        let position =
                            "\"store\":\(name),\"epoch\":\(event.epoch),\"sequence\":\(event.sequence),"
                            + "\"step\":\(index + 1),\"steps\":\(event.steps.count)"
                        switch step {
                        case .insert(let records):
                            Output.line(
                                "{\"op\":\"insert\",\(position),"
                                    + "\"ids\":\(JSON.array(records.map { JSON.string($0.id.string) })),"
                                    + "\"items\":\(JSON.array(records.map { JSON.embed($0.payload.bytes) }))}")
                        case .remove(let ids):
                            Output.line(
                                "{\"op\":\"remove\",\(position),\"ids\":\(JSON.array(ids.map { JSON.string($0.string) }))}")
                        }
                    }
                    printed((event.epoch, event.sequence))
                case .lagged(let notice):
                    // The library resumes from here on its own: the stream goes on without a gap.
                    Output.line(
                        "{\"op\":\"lagged\",\"store\":\(name),\"epoch\":\(notice.epoch),\"sequence\":\(notice.sequence)}")
                case .historyGone(let notice):
                    Output.line(
                        "{\"op\":\"history-gone\",\"store\":\(name),\"epoch\":\(notice.epoch),"
                            + "\"sequence\":\(notice.sequence)}")
                case .dropped(let notice):
                    Output.line(
                        "{\"op\":\"dropped\",\"store\":\(name),\"epoch\":\(notice.epoch),\"sequence\":\(notice.sequence)}")
                    printed(nil)  // a store made again has a new epoch: a reconnection starts from its snapshot
                default:
                    break
                }
            }
        } catch {
            if watchdog.fired {
                throw Failure(Failure.unavailable, "the broker did not send \(store)'s snapshot within \(global.timeout) s")
            }
            throw error
        }
        // It ends without an error only if the broker ended the subscription.
        throw StoreBrokerError(.connectionClosed, "the subscription to \(store) ended")
    }
}

/// The first error of the stores `watch --all` follows: it ends the command.
private final class FirstFailure: Sendable {
    private let state = Locked<(any Error)?>(nil)

    var error: (any Error)? { state.withLock { $0 } }

    func record(_ error: any Error) { state.withLock { $0 = $0 ?? error } }
}

/// Closes the connection when the first line does not come in time; `fired` tells the caller why it closed.
private final class Watchdog: Sendable {
    private let state = Locked<(armed: Task<Void, Never>?, fired: Bool)>((nil, false))

    var fired: Bool { state.withLock { $0.fired } }

    func arm(after timeout: Duration, _ expire: @escaping @Sendable () async -> Void) {
        let task = Task {
            try? await Task.sleep(for: timeout)
            guard !Task.isCancelled, self.fire() else { return }
            await expire()
        }
        state.withLock { $0.armed = task }
    }

    /// True when it fires now (it was not disarmed first).
    private func fire() -> Bool {
        state.withLock {
            guard $0.armed != nil else { return false }
            $0.armed = nil
            $0.fired = true
            return true
        }
    }

    func disarm() {
        state.withLock {
            $0.armed?.cancel()
            $0.armed = nil
        }
    }
}
