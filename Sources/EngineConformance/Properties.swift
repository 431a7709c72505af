import BrokerCore
import EngineLoader
import Foundation
import NIOCore
import StoreModel

/// The properties, each named as `storebroker-engine-check` reports it.
enum Properties {
    static let all: [Property] = [
        describesItself, newStoreIsEmpty, readsAfterPuts, overwriteKeepsPlace, removedKeyGoesLast, removeAllThenPuts,
        bytesKeptExactly, keyLengths, emptyApply, failedApply, stopOnRequest, badOptionValues, survivesReopen,
        memoryStartsEmpty, dropDeletesEverything, bigApply, threads, damagedStoreFails, killRecovery, durability, powerLoss,
    ] + SharedProperties.all

    static let persistentOnly: @Sendable (LoadedEngine) -> String? = {
        $0.capabilities.contains(.persistent) ? nil : "the engine does not declare SB_CAP_PERSISTENT"
    }

    /// What an apply leaves is read back only from a persistent engine: an engine without SB_CAP_PERSISTENT
    /// opens every store empty and the host reads a store only when it opens it, so nothing such an engine keeps
    /// is ever read (it may keep nothing: the memory engine keeps only the sequence). Its applies are still
    /// checked for what they refuse and report.
    static let readBackOnly: @Sendable (LoadedEngine) -> String? = {
        $0.capabilities.contains(.persistent)
            ? nil : "the engine does not declare SB_CAP_PERSISTENT: the host never reads back what its applies leave"
    }

    static let describesItself = Property(
        "describes-itself",
        "a name and version, ABI \(LoadedEngine.hostABI.major).x, option keys listing fail_after_steps, check_options accepting the given options"
    ) { context in
        let engine = context.engine
        try require(!engine.name.isEmpty && !engine.version.isEmpty, "an empty name or version")
        if let problem = Naming.problem(withEngineName: engine.name) { throw Violation(message: problem) }
        try require(engine.optionKeys.contains("fail_after_steps"), "option_keys does not list fail_after_steps")
        do throws(EngineLoadError) {
            try engine.validate(options: context.setup.options)
        } catch {
            throw Violation(message: "check_options refuses the given options: \(error.message)")
        }
    }

    static let newStoreIsEmpty = Property("new-store-is-empty", "a new store opens at sequence 0 with no items") { context in
        try context.withNewStore { store in
            try require(store.openedSequence == 0, "a new store opened at sequence \(store.openedSequence)")
            try require(try store.contents().isEmpty, "a new store has items")
        }
    }

    static let readsAfterPuts = Property(
        "reads-after-puts", "scan yields every item in insertion order with the times given; count agrees", skip: readBackOnly
    ) { context in
        try context.withNewStore { store in
            let written = [record("b", "B", created: 10, updated: 11), record("a", "A", created: 20, updated: 21),
                           record("c", "C", created: 30, updated: 31)]
            try store.apply(written.map { .put($0) }, sequence: 1)
            try store.requireContents(written, "insertion order, not key order")
        }
    }

    static let overwriteKeepsPlace = Property(
        "overwrite-keeps-place", "a put of an existing key replaces it in place with the given times", skip: readBackOnly
    ) { context in
        try context.withNewStore { store in
            try store.apply([.put(record("a", "1", created: 5, updated: 5)), .put(record("b", "2"))], sequence: 1)
            try store.apply([.put(record("a", "changed", created: 5, updated: 99))], sequence: 2)
            try store.requireContents([record("a", "changed", created: 5, updated: 99), record("b", "2")], "after the overwrite")
        }
    }

    static let removedKeyGoesLast = Property(
        "removed-key-goes-last",
        "a removed key put again goes last, across applies and within one; absent removes are no error; the last put of a key wins",
        skip: readBackOnly
    ) { context in
        try context.withNewStore { store in
            try store.apply([.put(record("a", "1")), .put(record("b", "2")), .put(record("c", "3"))], sequence: 1)
            try store.apply([.remove(key: Array("a".utf8)), .remove(key: Array("absent".utf8))], sequence: 2)
            try store.apply([.put(record("a", "again"))], sequence: 3)
            var all = try store.contents()
            try require(keys(all) == ["b", "c", "a"], "after remove and put again: \(keys(all)), expected [b, c, a]")
            try store.apply(
                [.remove(key: Array("b".utf8)), .put(record("b", "x")), .put(record("d", "1")), .put(record("d", "2"))],
                sequence: 4)
            all = try store.contents()
            try require(keys(all) == ["c", "a", "b", "d"], "within one apply: \(keys(all)), expected [c, a, b, d]")
            try require(all.last?.payload == ByteBuffer(string: "2"), "the last put of d did not win")
        }
    }

    static let removeAllThenPuts = Property(
        "remove-all-then-puts", "removeAll then puts in one apply leaves only the puts", skip: readBackOnly
    ) { context in
        try context.withNewStore { store in
            try store.apply([.put(record("a", "1")), .put(record("b", "2"))], sequence: 1)
            try store.apply([.removeAll, .put(record("z", "26")), .put(record("a", "new"))], sequence: 2)
            let all = try store.contents()
            try require(keys(all) == ["z", "a"], "\(keys(all)), expected [z, a]")
        }
    }

    static let bytesKeptExactly = Property(
        "bytes-kept-exactly", "keys and payloads are raw bytes (NUL, invalid UTF-8, empty payloads), compared as bytes",
        skip: readBackOnly
    ) { context in
        try context.withNewStore { store in
            let odd: [[UInt8]] = [[0], [0, 0, 1], [0xFF, 0xFE], [0xC3, 0x28], Array("é".utf8), Array("e\u{301}".utf8), [0x2F, 0x2E, 0x2E]]
            let written = odd.enumerated().map { index, key in
                record(bytes: key, payload: [0, UInt8(index), 0xFF, 0], created: UInt64(index), updated: UInt64.max - 1)
            } + [record(bytes: [7], payload: [])]
            try store.apply(written.map { .put($0) }, sequence: 1)
            try store.requireContents(written, "keys and payloads with odd bytes")
        }
    }

    static let keyLengths = Property(
        "key-lengths", "a 1,024-byte key is accepted (kept whole, and surviving a reopen, by a persistent engine); a longer or empty key fails with invalid and changes nothing"
    ) { context in
        let directory = try context.storeDirectory()
        let longest = (0..<1024).map { UInt8(truncatingIfNeeded: $0 * 7 + 1) }
        let nearly = Array(longest.prefix(1023)) + [0]
        let written = [record(bytes: longest, payload: Array("max".utf8)), record(bytes: nearly, payload: Array("near".utf8))]
        try context.withStore(directory) { store in
            try store.apply(written.map { .put($0) }, sequence: 1)
            if context.persistent { try store.requireContents(written, "two keys of 1,024 bytes differing in the last byte") }
            try requireFailure([.invalid], "a put of a 1,025-byte key") {
                try store.apply([.put(record(bytes: longest + [1], payload: [1]))], sequence: 2)
            }
            try requireFailure([.invalid], "a put of an empty key") {
                try store.apply([.put(record(bytes: [], payload: [1]))], sequence: 2)
            }
            if context.persistent { try store.requireContents(written, "after the refused keys") }
            try store.apply([.remove(key: nearly)], sequence: 2)
            if context.persistent { try store.requireContents([written[0]], "after a remove by a 1,024-byte key") }
        }
        guard context.persistent else { return }
        try context.withStore(directory) { store in
            let all = try store.contents()
            try require(all == [written[0]] && store.openedSequence == 2, "after a reopen: \(describe(all)) at sequence \(store.openedSequence)")
        }
    }

    static let emptyApply = Property("empty-apply", "an apply of no steps records only its sequence") { context in
        let directory = try context.storeDirectory()
        try context.withStore(directory) { store in
            try store.apply([.put(record("a", "1"))], sequence: 1)
            try store.apply([], sequence: 2)
            if context.persistent { try require(keys(try store.contents()) == ["a"], "an empty apply changed the items") }
        }
        guard context.persistent else { return }
        try context.withStore(directory) { store in
            try require(store.openedSequence == 2, "reopened at sequence \(store.openedSequence) after an empty apply of sequence 2")
        }
    }

    static let failedApply = Property(
        "failed-apply-leaves-nothing",
        "an apply failing at step N+1 (fail_after_steps=N) leaves nothing, now or after a reopen; the store stays usable and the next apply reuses the sequence"
    ) { context in
        let directory = try context.storeDirectory()
        let before = [record("a", "1"), record("b", "2")]
        try context.withStore(directory, extra: ["fail_after_steps": "3"]) { store in
            try store.apply(before.map { .put($0) }, sequence: 1)
            try requireFailure([.injected], "an apply of 5 steps with fail_after_steps=3") {
                try store.apply(
                    [.put(record("a", "overwritten")), .remove(key: Array("b".utf8)), .put(record("new", "x")),
                     .put(record("never", "y")), .removeAll], sequence: 2)
            }
            if context.persistent { try store.requireContents(before, "after the failed apply") }
            // The host goes on: the next apply carries the failed one's sequence.
            try store.apply([.put(record("c", "3"))], sequence: 2)
        }
        guard context.persistent else { return }
        try context.withStore(directory) { store in
            let all = try store.contents()
            let expected = before + [record("c", "3")]
            try require(store.openedSequence == 2 && all == expected,
                "reopened at sequence \(store.openedSequence) with \(describe(all)); expected 2 with \(describe(expected))")
        }
    }

    static let stopOnRequest = Property(
        "stop-on-request", "a scan whose sink asks to stop calls it no more and fails with stopped", skip: readBackOnly
    ) { context in
        try context.withNewStore { store in
            try store.apply((0..<5).map { .put(record("k\($0)", "v")) }, sequence: 1)
            var calls = 0
            do {
                try store.scan { _ in
                    calls += 1
                    return calls < 2
                }
                throw Violation(message: "the sink asked to stop at the 2nd item; the scan returned SB_OK after \(calls) calls")
            } catch let failure as EngineFailure {
                try require(failure.code == .stopped, "the scan failed with \(failure.codeName), expected stopped")
            }
            try require(calls == 2, "the sink asked to stop at the 2nd item but was called \(calls) times")
            try require(try store.contents().count == 5, "a stopped scan changed the store")
        }
    }

    static let badOptionValues = Property(
        "bad-option-values", "check_options and open refuse fail_after_steps=abc and -1 with invalid"
    ) { context in
        for value in ["abc", "-1", "", "3x"] {
            let options = context.setup.options.merging(["fail_after_steps": value]) { $1 }
            do {
                try context.engine.validate(options: options)
                throw Violation(message: "check_options accepts fail_after_steps=\(value.debugDescription)")
            } catch let error as EngineLoadError {
                try require(error.reason == .invalidOption, "check_options: \(error.message)")
            }
            try requireFailure([.invalid], "open with fail_after_steps=\(value.debugDescription)") {
                _ = try context.open(try context.storeDirectory(), extra: ["fail_after_steps": value])
            }
        }
    }

    static let survivesReopen = Property(
        "survives-reopen", "order, payloads, times and the sequence survive a close and reopen", skip: persistentOnly
    ) { context in
        let directory = try context.storeDirectory()
        let before = try context.withStore(directory) { store in
            try store.apply((0..<50).map { .put(record("k\(49 - $0)", "v\($0)", created: UInt64($0), updated: 7)) }, sequence: 1)
            try store.apply([.remove(key: Array("k49".utf8)), .put(record("k10", "over", created: 39, updated: 8))], sequence: 2)
            try store.apply([.put(record("k49", "back", created: 100, updated: 100))], sequence: 3)
            return try store.contents()
        }
        try context.withStore(directory) { store in
            let after = try store.contents()
            try require(store.openedSequence == 3, "reopened at sequence \(store.openedSequence), expected 3")
            try require(after == before, "before close: \(describe(before)); after reopen: \(describe(after))")
        }
    }

    static let memoryStartsEmpty = Property(
        "memory-starts-empty", "an engine without SB_CAP_PERSISTENT opens every store empty at 0",
        skip: { $0.capabilities.contains(.persistent) ? "the engine declares SB_CAP_PERSISTENT" : nil }
    ) { context in
        let directory = try context.storeDirectory()
        try context.withStore(directory) { try $0.apply([.put(record("a", "1"))], sequence: 1) }
        try context.withStore(directory) { store in
            try require(store.openedSequence == 0 && (try store.contents()).isEmpty, "reopened with data at \(store.openedSequence)")
        }
    }

    static let dropDeletesEverything = Property(
        "drop-deletes-everything", "drop leaves no file, the store reopens new, and dropping nothing is no error"
    ) { context in
        let directory = try context.storeDirectory()
        try context.withStore(directory) { try $0.apply([.put(record("a", "1"))], sequence: 1) }
        try context.engine.drop(directory: directory, store: context.storeName(directory), options: context.setup.options)
        let left = try FileManager.default.contentsOfDirectory(atPath: directory)
        try require(left.isEmpty, "drop left \(left.sorted())")
        try context.withStore(directory) { store in
            try require(store.openedSequence == 0 && (try store.contents()).isEmpty, "a dropped store reopened with data")
        }
        try context.engine.drop(directory: directory, store: context.storeName(directory), options: context.setup.options)
        try context.engine.drop(directory: directory, store: context.storeName(directory), options: context.setup.options)
    }

    static let bigApply = Property(
        "big-apply", "one apply of tens of thousands of puts (a merged commit group) succeeds (and is read back whole from a persistent engine)"
    ) { context in
        let directory = try context.storeDirectory()
        let size = context.setup.bigApply
        let written = (0..<size).map {
            record("item-\($0)", "{\"n\":\($0),\"pad\":\"xxxxxxxxxxxxxxxx\"}", created: UInt64($0), updated: UInt64($0))
        }
        try context.withStore(directory) { store in
            try store.apply(written.map { .put($0) }, sequence: 1)
            if context.persistent { try store.requireContents(written, "\(size) items written in one apply") }
        }
        guard context.persistent else { return }
        try context.withStore(directory) { store in
            try store.requireContents(written, "the big apply after a reopen")
        }
    }

    static let threads = Property(
        "threads",
        "stores opened, written (and read, when persistent) from 8 threads at once, and one store called from successive threads, as the header allows"
    ) { context in
        let failures = FailureList()
        let group = DispatchGroup()
        for thread in 0..<8 {
            group.enter()
            Thread {
                defer { group.leave() }
                do {
                    let directory = try context.storeDirectory("thread-\(thread)")
                    let expected = (1...100).map { record("t\(thread)-\($0)", "\($0)") }
                    try context.withStore(directory) { store in
                        for (index, item) in expected.enumerated() {
                            try store.apply([.put(item)], sequence: UInt64(index + 1))
                        }
                        if context.persistent {
                            let all = try store.contents()
                            try require(all == expected, "thread \(thread): \(describe(all))")
                        }
                    }
                } catch {
                    failures.add("\(error)")
                }
            }.start()
        }
        group.wait()
        if let first = failures.first { throw Violation(message: first) }
        // One store, each call from a new thread (never two at once).
        let store = try context.open(try context.storeDirectory("handed-over"))
        defer { store.close() }
        for index in 1...20 {
            let done = DispatchSemaphore(value: 0)
            Thread {
                do { try store.apply([.put(record("h\(index)", "x"))], sequence: UInt64(index)) } catch { failures.add("\(error)") }
                done.signal()
            }.start()
            done.wait()
        }
        if let first = failures.first { throw Violation(message: first) }
        if context.persistent { try require(try store.contents().count == 20, "applies from successive threads were lost") }
    }

    static let damagedStoreFails = Property(
        "damaged-store-fails",
        "a store whose files are overwritten with garbage fails to open (or load) rather than opening empty or short",
        skip: {
            $0.capabilities.contains(.shared)
                ? "the engine declares SB_CAP_SHARED: its stores live in a database, not in files of their directory"
                : persistentOnly($0)
        }
    ) { context in
        let directory = try context.storeDirectory()
        let written = (0..<20).map { record("k\($0)", "payload \($0)") }
        try context.withStore(directory) { store in
            try store.apply(written.map { .put($0) }, sequence: 1)
            try store.apply([.put(record("last", "x"))], sequence: 2)
        }
        let damaged = try damage(directory)
        try require(damaged > 0, "the engine wrote no file in its directory")
        let store: LoadedStore
        do {
            store = try context.open(directory)
        } catch is EngineFailure {
            return
        }
        defer { store.close() }
        let all: [EngineRecord]
        do {
            all = try store.contents()
        } catch is EngineFailure {
            return
        }
        let expected = written + [record("last", "x")]
        try require(
            store.openedSequence == 2 && all == expected,
            "every file overwritten with garbage, the store opened at sequence \(store.openedSequence) with \(describe(all)): "
                + "a damaged store must fail to open (SB_ERR_CORRUPT), never open empty or short")
    }

    /// Overwrites every regular file under `directory` with random bytes of the same length; returns how many.
    static func damage(_ directory: String) throws -> Int {
        var count = 0
        guard let walker = FileManager.default.enumerator(atPath: directory) else { return 0 }
        while let name = walker.nextObject() as? String {
            let path = directory + "/" + name
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), !isDirectory.boolValue else { continue }
            let size = (try FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.intValue ?? 0
            var generator = SystemRandomNumberGenerator()
            let garbage = Data((0..<max(size, 16)).map { _ in UInt8.random(in: 0...255, using: &generator) })
            try garbage.write(to: URL(fileURLWithPath: path))
            count += 1
        }
        return count
    }

    static let killRecovery = Property(
        "kill-recovery",
        "killed (SIGKILL) in the middle of applies, the store reopens at a sequence it committed with exactly that state: no half apply",
        skip: persistentOnly
    ) { context in
        for round in 1...context.setup.rounds {
            let outcome = try await CrashRound.run(context, round: round)
            try require(
                outcome.contents == CrashRound.model(at: outcome.opened),
                "round \(round): reopened at sequence \(outcome.opened) with \(describe(outcome.contents)); "
                    + "the state at \(outcome.opened) is \(describe(CrashRound.model(at: outcome.opened)))")
        }
    }

    static let durability = Property(
        "durability",
        "every apply that returned SB_OK before a SIGKILL is there after the reopen",
        skip: persistentOnly
    ) { context in
        for round in 1...context.setup.rounds {
            let outcome = try await CrashRound.run(context, round: round)
            try require(
                outcome.opened >= outcome.acknowledged,
                "round \(round): apply \(outcome.acknowledged) returned SB_OK before the kill, but the store reopened at sequence \(outcome.opened)")
            try require(
                outcome.opened <= outcome.acknowledged + 1,
                "round \(round): reopened at sequence \(outcome.opened), past the apply in flight (\(outcome.acknowledged + 1))")
        }
    }
}

extension Properties {
    static let powerLoss = Property(
        "power-loss",
        "after a simulated power cut (what no fsync or fdatasync made durable, of a file or of its directory, is lost: "
            + "all of it in odd rounds, a random part, in 512-byte sectors, in even ones) the store opens undamaged at an "
            + "apply it made, missing none acknowledged longer before the cut than its power_loss_window",
        skip: {
            $0.capabilities.contains(.shared)
                ? "the engine declares SB_CAP_SHARED: its stores live in a database, not in files of their directory"
                : persistentOnly($0)
        }
    ) { context in
        let window = try context.engine.powerLossWindow(options: context.setup.options)
        for round in 1...context.setup.rounds {
            let mode = round % 2 == 1 ? "every unsynced write lost" : "unsynced writes torn"
            let cut = try PowerCut(
                checker: context.setup.checker, shadow: context.directory + "/shadow-\(round)", torn: round % 2 == 0)
            // An engine that may lose a window runs longer than the window, so that what it acknowledged earlier
            // is held to survive.
            let bounded = window > 0 && window < .max
            let runFor = bounded ? Int(window) + 300...Int(window) + 1000 : 20...400
            let outcome: CrashRound.Outcome
            do {
                outcome = try await CrashRound.run(context, round: round, powerCut: cut, runFor: runFor)
            } catch let failure as EngineFailure {
                throw Violation(message: "round \(round) (\(mode)): the store does not open after the power cut: \(failure)")
            }
            // The window counts back from the child's last acknowledgement rather than the kill: a child stalled
            // after it (a starved machine, a sync that takes seconds) must not fail an engine whose syncs were
            // keeping up while it ran.
            let reference = bounded ? outcome.acknowledgements.last?.at ?? outcome.killedAt : outcome.killedAt
            let required =
                window == .max ? 0 : outcome.acknowledgements.last { $0.at &+ window <= reference }?.sequence ?? 0
            let promise = window == .max ? "any number" : "\(window) ms"
            try require(
                outcome.opened >= required,
                "round \(round) (\(mode)): apply \(required) returned SB_OK \(reference - (outcome.acknowledgements.first { $0.sequence == required }?.at ?? 0)) ms "
                    + "before \(bounded ? "the last apply that returned" : "the cut"), but the store reopened at sequence \(outcome.opened) "
                    + "(the engine's power_loss_window: \(promise))")
            try require(
                outcome.opened <= outcome.acknowledged + 1,
                "round \(round) (\(mode)): reopened at sequence \(outcome.opened), past the apply in flight (\(outcome.acknowledged + 1))")
            try require(
                outcome.contents == CrashRound.model(at: outcome.opened),
                "round \(round) (\(mode)): reopened at sequence \(outcome.opened) with \(describe(outcome.contents)); "
                    + "the state at \(outcome.opened) is \(describe(CrashRound.model(at: outcome.opened))): damaged")
        }
    }
}

/// Failures seen on other threads.
final class FailureList: @unchecked Sendable {
    private let lock = NSLock()
    private var messages: [String] = []

    func add(_ message: String) { lock.withLock { messages.append(message) } }
    var first: String? { lock.withLock { messages.first } }
}
