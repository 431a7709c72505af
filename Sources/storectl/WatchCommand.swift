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

            Examples:
              storectl watch notes
              storectl watch notes --from 42 --epoch 1932943310210146
            """)

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The store.") var store: String
    @Option(help: ArgumentHelp("Resume after this sequence instead of starting with a snapshot.", valueName: "sequence"))
    var from: UInt64?
    @Option(help: ArgumentHelp("The epoch --from belongs to (default: the store's current one).", valueName: "epoch"))
    var epoch: UInt64?

    func run() async throws {
        try await reporting {
            let connection = try await global.connect()
            var start = SubscriptionStart.snapshot
            if let from {
                var resumeEpoch = epoch
                if resumeEpoch == nil {
                    resumeEpoch = try await connection.storeInfo(store).epoch
                }
                start = .resume(epoch: resumeEpoch!, sequence: from)
                Output.line(
                    "{\"op\":\"resumed\",\"store\":\(JSON.string(store)),\"epoch\":\(resumeEpoch!),\"sequence\":\(from)}")
            }
            let name = JSON.string(store)
            // --timeout bounds everything up to the first line: a snapshot's "loaded" must arrive in time too.
            let watchdog = Watchdog()
            if case .snapshot = start, let timeout = global.requestTimeout {
                watchdog.arm(after: timeout) { await connection.close() }
            }
            do {
                for try await push in connection.follow(name: store, from: start) {
                    switch push {
                    case .storeLoaded(let at, let records):
                        watchdog.disarm()
                        Output.line(
                            "{\"op\":\"loaded\",\"store\":\(name),\"epoch\":\(at.epoch),"
                                + "\"sequence\":\(at.sequence),\"count\":\(records.count)}")
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
                    default:
                        break
                    }
                }
            } catch let error as StoreBrokerError {
                if watchdog.fired {
                    throw Failure(
                        Failure.unavailable, "the broker did not send \(store)'s snapshot within \(global.timeout) s")
                }
                throw error
            }
            // It ends without an error only if the broker ended the subscription.
            throw Failure(Failure.unavailable, "the subscription ended")
        }
    }
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
