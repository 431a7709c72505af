import Foundation
import TestSupport
import StoreBrokerClient
import Testing
import Wire

extension Integration {
    /// Many writers, subscribers that keep up, fall behind or come back: counts and orders, never times.
    @Suite struct Concurrency {
        @Test func twentyWriterProcessesAndEverySubscriberSeesTheSameEventsWithoutGaps() async throws {
            // --max-batch 5: each writer's 50 items become 10 commits, so commits of different writers interleave.
            try await Daemon.with(arguments: ["--max-batch", "5"]) { daemon in
                let watchers = [try await daemon.watch("shared"), try await daemon.watch("shared"), try await daemon.watch("shared")]
                let writers = try (0..<20).map { writer in
                    try ChildProcess(
                        [binDirectory + "/storectl", "--socket", daemon.socketPath, "insert", "shared"],
                        stdin: (0..<50).map { "{\"id\":\"p\(writer)-\($0)\"}\n" }.joined(),
                        stdoutPath: daemon.directory + "/writer-\(writer).out",
                        stderrPath: daemon.directory + "/writer-\(writer).err", in: daemon.directory)
                }
                for writer in writers {
                    #expect(await writer.wait(atMost: 120) == 0, "\(writer.stderr)")
                }
                #expect(try await daemon.storectl(["count", "shared"]).stdout == "1000\n")
                for watcher in watchers { #expect(await watcher.waitFor(sequence: 200)) }
                for watcher in watchers { await watcher.stop() }

                let reference = watchers[0].lines
                for watcher in watchers.dropFirst() { #expect(watcher.lines == reference) }
                let events = watchers[0].objects.dropFirst()
                #expect(events.map { $0["sequence"] as! Int } == Array(1...200))
                let ids = events.flatMap { $0["ids"] as! [String] }
                #expect(ids.count == 1000)
                #expect(Set(ids).count == 1000)
                // Each writer's items arrive in its own order.
                for writer in 0..<20 {
                    let mine = ids.filter { $0.hasPrefix("p\(writer)-") }
                    #expect(mine == (0..<50).map { "p\(writer)-\($0)" })
                }
            }
        }

        @Test func stalledSubscriberIsToldItLaggedWhileWritersFinish() async throws {
            try await Daemon.with(arguments: ["--subscriber-buffer", "8"]) { daemon in
                let stalled = try RawClient(socketPath: daemon.socketPath)
                try stalled.handshake()
                try stalled.request(.subscribe(.init(name: "busy")), id: 1)
                // The writers never wait for the reader that does not read.
                let payload = String(repeating: "x", count: 4000)
                let connection = try await daemon.connect()
                for n in 0..<600 {
                    _ = try await connection.send(
                        .insert(.init(store: "busy", items: [Item(id: ItemID("\(n)"), payload: Payload("{\"x\":\"\(payload)\"}"))])))
                }
                #expect(try await daemon.storectl(["count", "busy"]).stdout == "600\n")
                // Now it reads: subscribed, the snapshot, a run of events without gaps, then `lagged` naming the
                // last sequence it was sent.
                guard case .subscribed(let subscribed)? = try stalled.nextMessage()?.message else {
                    Issue.record("no subscribed answer")
                    return
                }
                var sequences: [UInt64] = []
                var lagged: ServerMessage.Lagged?
                while lagged == nil, let (id, message) = try stalled.nextMessage() {
                    #expect(id == subscribed.subscriptionID)
                    switch message {
                    case .storeLoaded(let loaded): sequences.append(loaded.sequence)
                    case .storeEvent(let event): sequences.append(event.sequence)
                    case .lagged(let notice): lagged = notice
                    default: Issue.record("unexpected \(message.type.name)")
                    }
                }
                guard let lagged else {
                    Issue.record("no lagged notice")
                    return
                }
                #expect(sequences.count < 600)
                #expect(sequences == Array(sequences[0]...(sequences[0] + UInt64(sequences.count) - 1)))
                #expect(lagged.sequence == sequences.last)
                // It resubscribes from there and catches up.
                try stalled.request(.subscribe(.init(name: "busy", start: .resume(epoch: lagged.epoch, sequence: lagged.sequence))), id: 2)
                var last = lagged.sequence
                while last < 600, let (_, message) = try stalled.nextMessage() {
                    switch message {
                    case .subscribed: continue
                    case .storeEvent(let event):
                        #expect(event.sequence == last + 1)
                        last = event.sequence
                    case .historyGone, .storeLoaded:
                        // With the default history (1024) the resume point is always held.
                        Issue.record("history gone after lagging at \(lagged.sequence)")
                        return
                    default: Issue.record("unexpected \(message.type.name)")
                    }
                }
                #expect(last == 600)
            }
        }

        @Test func resumeGetsExactlyTheMissedEventsOrHistoryGone() async throws {
            try await Daemon.with(arguments: ["--history", "10"]) { daemon in
                for n in 1...5 { _ = try await daemon.storectl(["insert", "s", "{\"id\":\"\(n)\"}"]) }
                let first = try await daemon.watch("s")
                await first.stop()
                let loaded = first.objects[0]
                #expect(loaded["op"] as? String == "loaded" && loaded["sequence"] as? Int == 5)
                // Missed while away: sequences 6 to 8.
                for n in 6...8 { _ = try await daemon.storectl(["insert", "s", "{\"id\":\"\(n)\"}"]) }
                let resumed = try await daemon.watch("s", ["--from", "5"])
                #expect(await resumed.waitFor(sequence: 8))
                await resumed.stop()
                #expect(resumed.objects.map { $0["op"] as! String } == ["resumed", "insert", "insert", "insert"])
                #expect(resumed.objects.dropFirst().map { $0["sequence"] as! Int } == [6, 7, 8])
                #expect(resumed.objects.dropFirst().map { $0["ids"] as! [String] } == [["6"], ["7"], ["8"]])

                // Beyond the history (10 commits kept, 20 more made): told so, then a fresh snapshot.
                for n in 9...28 { _ = try await daemon.storectl(["insert", "s", "{\"id\":\"\(n)\"}"]) }
                let gone = try await daemon.watch("s", ["--from", "8"])
                #expect(await eventually { gone.objects.count >= 3 })
                await gone.stop()
                #expect(gone.objects.map { $0["op"] as! String } == ["resumed", "history-gone", "loaded"])
                #expect(gone.objects[2]["sequence"] as? Int == 28 && gone.objects[2]["count"] as? Int == 28)

                // A resume point from before a drop: the epoch changed.
                let epoch = loaded["epoch"] as! Int
                _ = try await daemon.storectl(["drop", "s"])
                _ = try await daemon.storectl(["insert", "s", #"{"id":"new"}"#])
                let dropped = try await daemon.watch("s", ["--from", "28", "--epoch", String(epoch)])
                #expect(await eventually { dropped.objects.count >= 3 })
                await dropped.stop()
                #expect(dropped.objects.map { $0["op"] as! String } == ["resumed", "history-gone", "loaded"])
                #expect(dropped.objects[2]["sequence"] as? Int == 1 && dropped.objects[2]["epoch"] as? Int != epoch)
            }
        }

        @Test func subscribersOfADroppedStoreAreToldAndFollowTheNewStore() async throws {
            try await Daemon.with { daemon in
                _ = try await daemon.storectl(["insert", "s", #"{"id":"a"}"#])
                let watcher = try await daemon.watch("s")
                _ = try await daemon.storectl(["drop", "s"])
                _ = try await daemon.storectl(["insert", "s", #"{"id":"b"}"#])
                #expect(await eventually { watcher.objects.count >= 3 })
                await watcher.stop()
                #expect(watcher.objects.map { $0["op"] as! String } == ["loaded", "dropped", "insert"])
                #expect(watcher.objects[1]["sequence"] as? Int == 1)
                #expect(watcher.objects[2]["sequence"] as? Int == 1 && watcher.objects[2]["ids"] as? [String] == ["b"])
            }
        }

        @Test func failedChainsLeaveNoTraceAndReadersNeverSeeHalfAChain() async throws {
            // The engine fails any transaction of more than 12 steps: a whole chain fails at commit.
            try await Daemon.with(arguments: ["--engine", "memory", "--engine-option", "memory.fail_after_steps=12"]) { daemon in
                let items = (0..<10).map { "{\"op\":\"insert\",\"item\":{\"id\":\"\($0)\",\"g\":0}}\n" }.joined()
                #expect(try await daemon.storectl(["apply", "s"], stdin: items).stdout == "1\n")
                let watcher = try await daemon.watch("s")
                let failing = "{\"op\":\"removeAll\"}\n" + (0..<20).map { "{\"op\":\"insert\",\"item\":{\"id\":\"n\($0)\"}}\n" }.joined()
                let failed = try await daemon.storectl(["apply", "s"], stdin: failing)
                #expect(failed.status == 74, "\(failed.stderr)")
                #expect(failed.stderr.contains("injected"))
                let conflict = try await daemon.storectl(["apply", "s", "--expect", "9"], stdin: "{\"op\":\"removeAll\"}\n")
                #expect(conflict.status == 75)
                let invalid = try await daemon.storectl(["apply", "s"], stdin: "{\"op\":\"removeAll\"}\n{\"op\":\"remove\",\"id\":\"\"}\n")
                #expect(invalid.status == 65)
                #expect(try await daemon.storectl(["query", "s"]).stdout == items.split(separator: "\n").map {
                    String($0.dropFirst(#"{"op":"insert","item":"#.count).dropLast()) + "\n" }.joined())
                // Generations: removeAll + 10 inserts (11 steps) per chain, while a reader polls.
                let connection = try await daemon.connect()
                let reader = Task {
                    var views = 0
                    while !Task.isCancelled {
                        guard case .rangeResult(let range) = try await connection.send(.queryRange(.init(store: "s"))) else { continue }
                        let generations = Set(range.elements.map { String(buffer: $0.payload.bytes) .split(separator: ":").last! })
                        #expect(range.elements.count == 10, "a reader saw \(range.elements.count) items")
                        #expect(generations.count == 1, "a reader saw a mix: \(generations)")
                        views += 1
                    }
                    return views
                }
                for generation in 1...40 {
                    let chain = "{\"op\":\"removeAll\"}\n" + (0..<10).map { "{\"op\":\"insert\",\"item\":{\"id\":\"\($0)\",\"g\":\(generation)}}\n" }.joined()
                    #expect(try await daemon.storectl(["apply", "s"], stdin: chain).stdout == "\(generation + 1)\n")
                }
                reader.cancel()
                let views = try await reader.value
                #expect(views > 0)
                #expect(await watcher.waitFor(sequence: 41))
                await watcher.stop()
                // No event from the failed chains; each chain's event is whole (remove of 10, insert of 10).
                let events = watcher.objects.dropFirst()
                #expect(Set(events.map { $0["sequence"] as! Int }) == Set(2...41))
                #expect(events.count == 80)
            }
        }
    }
}
