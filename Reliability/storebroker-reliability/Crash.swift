import Foundation
import StoreBrokerClient
import TestSupport

/// Rounds of `kill -9` at a random moment while writers send acknowledged single inserts, batches and chains
/// (up to 2,500 items) to three stores; after each restart the stores are checked against a model built from
/// the acknowledgements: nothing acknowledged lost, no batch or chain in part, the commit order kept,
/// sequences gap-free and continuing, epochs unchanged.
struct CrashScenario {
    var engine: String
    var rounds: Int
    var seed: UInt64

    static let maxItems = 2_500

    func run() async throws -> [String: Any] {
        let findings = Findings()
        let model = CrashModel()
        var random = SeededGenerator(state: seed)
        var recoveries: [Double] = []
        var lifetimes: [Double] = []
        try await withTemporaryDirectory(prefix: "sb-crash") { directory in
            let broker = Broker(in: directory, arguments: ["--engine", engine])
            try await broker.start()
            for round in 0..<rounds {
                let lifetime = Double.random(in: 0.15...0.9, using: &random)
                lifetimes.append(lifetime)
                model.beginRound()
                do {
                    try await write(to: broker, round: round, for: lifetime, model: model, seed: random.next())
                    let started = Date()
                    try await broker.start()
                    recoveries.append(Date().timeIntervalSince(started))
                    try await verify(broker, round: round, model: model, findings: findings)
                } catch {
                    throw Failure("round \(round + 1): \(error)\nthe daemon's log ends:\n\(broker.logTail)")
                }
                log("crash \(engine): round \(round + 1) of \(rounds) checked (\(model.summaryLine))")
            }
            await broker.stop()
        }
        findings.report()
        var figures = model.figures
        figures["scenario"] = "crash"
        figures["engine"] = engine
        figures["rounds"] = rounds
        figures["seed"] = String(seed)
        figures["violations"] = findings.summary
        figures["restart_to_first_answer_s_max"] = recoveries.max() ?? 0
        figures["kill_after_s_min"] = lifetimes.min() ?? 0
        figures["kill_after_s_max"] = lifetimes.max() ?? 0
        figures["passed"] = findings.isEmpty
        return figures
    }

    /// Writers on their own connections until the daemon dies under them, killed after `lifetime` seconds.
    private func write(to broker: Broker, round: Int, for lifetime: Double, model: CrashModel, seed: UInt64) async throws {
        let pid = broker.pid!
        try await withThrowingTaskGroup(of: Void.self) { group in
            for writer in 0..<2 {
                group.addTask {
                    guard let connection = try? await broker.connect(name: "crash-single-\(writer)") else { return }
                    for n in 0..<1_000_000 {
                        let id = "r\(round)-s\(writer)-\(n)"
                        let payload = #"{"r":\#(round),"w":\#(writer),"n":\#(n)}"#
                        model.attemptSingle(id, payload: payload)
                        guard let result = try? await connection.write(
                            "singles", .insert([Item(id: ItemID(id), payload: Payload(payload))]))
                        else { return }
                        model.acknowledgeSingle(id, result)
                    }
                }
            }
            group.addTask {
                var random = SeededGenerator(state: seed)
                guard let connection = try? await broker.connect(name: "crash-batch") else { return }
                for n in 0..<100_000 {
                    let tag = "r\(round)-b\(n)"
                    let size = Self.size(&random)
                    model.attemptBatch(tag, size: size)
                    let items = (0..<size).map { Item(id: ItemID("\(tag)-\($0)"), payload: Payload(#"{"i":\#($0)}"#)) }
                    guard let result = try? await connection.write("batches", .insert(items)) else { return }
                    model.acknowledgeBatch(tag, result)
                }
            }
            group.addTask {
                var random = SeededGenerator(state: seed ^ 0x5555)
                guard let connection = try? await broker.connect(name: "crash-chain") else { return }
                for n in 0..<100_000 {
                    let tag = "r\(round)-c\(n)"
                    let size = Self.size(&random)
                    let items = (0..<size).map { Item(id: ItemID("\(tag)-\($0)"), payload: Payload(#"{"i":\#($0)}"#)) }
                    model.attemptChain(tag, size: size)
                    do throws(StoreBrokerError) {
                        let result = try await connection.write("chains", .chain([.removeAll, .insert(items: items)]))
                        model.acknowledgeChain(tag, result)
                    } catch {
                        // An engine without atomic applies refuses chains: nothing to check for it.
                        if error.code == .notSupported { model.chainsUnsupported() }
                        return
                    }
                }
            }
            group.addTask {
                try await Task.sleep(for: .seconds(lifetime))
                kill(pid, SIGKILL)
            }
            try await group.waitForAll()
        }
        await broker.kill9()
    }

    /// Mostly small, now and then up to 2,500 items.
    private static func size(_ random: inout SeededGenerator) -> Int {
        switch Int.random(in: 0..<10, using: &random) {
        case 0: Int.random(in: 500...maxItems, using: &random)
        case 1...3: Int.random(in: 50...500, using: &random)
        default: Int.random(in: 1...50, using: &random)
        }
    }

    private func verify(_ broker: Broker, round: Int, model: CrashModel, findings: Findings) async throws {
        let connection = try await broker.connect(name: "crash-check")
        defer { Task { await connection.close() } }
        for store in ["singles", "batches", "chains"] {
            let (info, records) = try await contents(of: store, connection)
            switch store {
            case "singles": model.checkSingles(records, info: info, findings: findings)
            case "batches": model.checkBatches(records, info: info, findings: findings)
            default: model.checkChains(records, info: info, findings: findings)
            }
            model.checkSequenceAndEpoch(store, info: info, findings: findings)
        }
    }

    /// The store's info and every record; a store never created is empty at sequence 0.
    private func contents(of store: String, _ connection: BrokerConnection) async throws -> (StoreInfo, [ItemRecord]) {
        do {
            let info = try await connection.storeInfo(store)
            let records = try await connection.records(store)
            guard records.position.sequence == info.sequence else {
                throw Failure("store \(store) changed while it was read")
            }
            return (info, records.value)
        } catch let error as StoreBrokerError where error.code == .notFound {
            return (StoreInfo(name: store, epoch: 0, sequence: 0, count: 0, engine: engine), [])
        }
    }
}

/// Everything the writers were told, and what the checks learned: the expectation for every later round.
final class CrashModel: @unchecked Sendable {
    private let lock = NSLock()

    /// An acknowledged write, or one found committed after a crash (its sequence then unknown).
    private struct Known {
        var size: Int
        var payload: String = ""
        var sequence: UInt64?
    }

    private var singles: [String: Known] = [:]
    private var singlesInFlight: [String: String] = [:]
    private var batches: [String: Known] = [:]
    private var batchAttempts: [String: Int] = [:]
    /// Chains in attempt order; the acknowledged ones have a sequence.
    private var chainOrder: [String] = []
    private var chains: [String: Known] = [:]
    private var chainAttempts: [String: Int] = [:]
    /// The chain the store held at the last check.
    private var chainPresent: String?
    private var chainsRefused = false

    private var epochs: [String: UInt64] = [:]
    private var checkedSequence: [String: UInt64] = [:]
    private var firstAcknowledged: [String: UInt64] = [:]
    private var acknowledgedSingles = 0
    private var acknowledgedBatches = 0
    private var acknowledgedBatchItems = 0
    private var acknowledgedChains = 0
    private var acknowledgedChainItems = 0
    private var foundUnacknowledged = 0

    var summaryLine: String {
        lock.withLock {
            "\(acknowledgedSingles) single writes, \(acknowledgedBatches) batches, \(acknowledgedChains) chains acknowledged so far"
        }
    }

    var figures: [String: Any] {
        lock.withLock {
            [
                "acknowledged_single_writes": acknowledgedSingles, "acknowledged_batches": acknowledgedBatches,
                "acknowledged_batch_items": acknowledgedBatchItems, "acknowledged_chains": acknowledgedChains,
                "acknowledged_chain_items": acknowledgedChainItems,
                "unacknowledged_writes_found_whole": foundUnacknowledged, "chains_supported": !chainsRefused,
            ]
        }
    }

    func beginRound() {
        lock.withLock { firstAcknowledged = [:] }
    }

    func attemptSingle(_ id: String, payload: String) {
        lock.withLock { singlesInFlight[id] = payload }
    }

    func acknowledgeSingle(_ id: String, _ result: CommitResult) {
        lock.withLock {
            let payload = singlesInFlight.removeValue(forKey: id) ?? ""
            singles[id] = Known(size: 1, payload: payload, sequence: result.sequence)
            acknowledgedSingles += 1
            acknowledge("singles", result)
        }
    }

    func attemptBatch(_ tag: String, size: Int) {
        lock.withLock { batchAttempts[tag] = size }
    }

    func acknowledgeBatch(_ tag: String, _ result: CommitResult) {
        lock.withLock {
            let size = batchAttempts[tag] ?? 0
            batches[tag] = Known(size: size, sequence: result.sequence)
            acknowledgedBatches += 1
            acknowledgedBatchItems += size
            acknowledge("batches", result)
        }
    }

    func attemptChain(_ tag: String, size: Int) {
        lock.withLock {
            chainAttempts[tag] = size
            chainOrder.append(tag)
        }
    }

    func acknowledgeChain(_ tag: String, _ result: CommitResult) {
        lock.withLock {
            let size = chainAttempts[tag] ?? 0
            chains[tag] = Known(size: size, sequence: result.sequence)
            acknowledgedChains += 1
            acknowledgedChainItems += size
            acknowledge("chains", result)
        }
    }

    func chainsUnsupported() {
        lock.withLock { chainsRefused = true }
    }

    /// Called with the lock held.
    private func acknowledge(_ store: String, _ result: CommitResult) {
        firstAcknowledged[store] = min(firstAcknowledged[store] ?? .max, result.sequence)
        ackEpochs[store, default: []].insert(result.epoch)
    }

    private var ackEpochs: [String: Set<UInt64>] = [:]

    // MARK: Checks

    /// Every acknowledged single is there with its payload, in the order of its sequence; nothing else is there
    /// but writes that were in flight; one commit per item, so the sequence is the count.
    func checkSingles(_ records: [ItemRecord], info: StoreInfo, findings: Findings) {
        lock.withLock {
            var position: [String: Int] = [:]
            for (index, record) in records.enumerated() {
                let id = record.id.string
                position[id] = index
                if singles[id] == nil {
                    if let payload = singlesInFlight[id] {
                        if String(buffer: record.payload.bytes) != payload { findings.record("payload changed", id) }
                        singles[id] = Known(size: 1, payload: payload, sequence: nil)
                        foundUnacknowledged += 1
                    } else {
                        findings.record("item never written", "singles/\(id)")
                    }
                }
            }
            singlesInFlight = [:]
            var ordered: [(UInt64, Int)] = []
            for (id, known) in singles {
                guard let at = position[id] else {
                    findings.record("acknowledged write lost", "singles/\(id)")
                    continue
                }
                if String(buffer: records[at].payload.bytes) != known.payload { findings.record("payload changed", "singles/\(id)") }
                if let sequence = known.sequence { ordered.append((sequence, at)) }
            }
            checkOrder(ordered, commits: records.count, info: info, findings: findings)
        }
    }

    /// Each batch is there whole (its items together, in order) or not at all; every acknowledged one is there;
    /// one commit per batch.
    func checkBatches(_ records: [ItemRecord], info: StoreInfo, findings: Findings) {
        lock.withLock {
            let runs = Self.runs(records, findings: findings, store: "batches")
            var ordered: [(UInt64, Int)] = []
            for run in runs {
                guard let size = batches[run.tag]?.size ?? batchAttempts[run.tag] else {
                    findings.record("item never written", "batches/\(run.tag)")
                    continue
                }
                if run.count != size { findings.record("batch in part", "\(run.tag): \(run.count) of \(size)") }
                if let known = batches[run.tag] {
                    if let sequence = known.sequence { ordered.append((sequence, run.start)) }
                } else {
                    batches[run.tag] = Known(size: size, sequence: nil)
                    foundUnacknowledged += 1
                }
            }
            let present = Set(runs.map(\.tag))
            for tag in batches.keys where !present.contains(tag) {
                findings.record("acknowledged write lost", "batches/\(tag)")
            }
            batchAttempts = [:]
            checkOrder(ordered, commits: runs.count, info: info, findings: findings)
        }
    }

    /// The store holds exactly one chain, whole: the last acknowledged one or one attempted after it.
    func checkChains(_ records: [ItemRecord], info: StoreInfo, findings: Findings) {
        lock.withLock {
            let runs = Self.runs(records, findings: findings, store: "chains")
            let lastAcknowledged = chainOrder.lastIndex { chains[$0]?.sequence != nil }
            guard runs.count <= 1 else {
                findings.record("chain in part", "\(runs.count) chains' items at once: \(runs.map(\.tag).prefix(3))")
                return
            }
            guard let run = runs.first else {
                if lastAcknowledged != nil || chainPresent != nil {
                    findings.record("acknowledged write lost", "chains: the store is empty")
                }
                chainOrder = []
                return
            }
            guard let index = chainOrder.firstIndex(of: run.tag), let size = chainAttempts[run.tag] else {
                findings.record("item never written", "chains/\(run.tag)")
                return
            }
            if run.count != size { findings.record("chain in part", "\(run.tag): \(run.count) of \(size)") }
            if let lastAcknowledged, index < lastAcknowledged {
                findings.record("acknowledged write lost", "chains: \(run.tag) after \(chainOrder[lastAcknowledged]) was acknowledged")
            }
            if chains[run.tag] == nil {
                chains[run.tag] = Known(size: size, sequence: nil)
                foundUnacknowledged += 1
            }
            // Every chain up to the one present committed (each its own commit), none after it.
            let committed = UInt64(index + 1)
            if info.sequence != committed {
                findings.record("sequence is not one per commit", "chains at \(info.sequence), \(committed) chains committed")
            }
            chainOrder = Array(chainOrder.prefix(index + 1))
            chainPresent = run.tag
        }
    }

    /// Sequences continue where the last check left them and epochs never change.
    func checkSequenceAndEpoch(_ store: String, info: StoreInfo, findings: Findings) {
        lock.withLock {
            // Gaps show in the counts above (one commit per single, batch or chain); here: no sequence given twice.
            if let checked = checkedSequence[store], let first = firstAcknowledged[store], first <= checked {
                findings.record("sequence given twice", "\(store): \(first) acknowledged after the store was at \(checked)")
            }
            if let checked = checkedSequence[store], info.sequence < checked {
                findings.record("sequence went back", "\(store): \(info.sequence) after \(checked)")
            }
            var seen = ackEpochs[store, default: []]
            if info.sequence > 0 { seen.insert(info.epoch) }
            if let epoch = epochs[store] { seen.insert(epoch) }
            if seen.count > 1 { findings.record("epoch changed", "\(store): \(seen.sorted())") }
            if let epoch = seen.first { epochs[store] = epoch }
            ackEpochs[store] = []
            checkedSequence[store] = info.sequence
        }
    }

    /// The acknowledged writes, sorted by sequence, sit at increasing positions; and the store's sequence
    /// counts its `commits` (each single write or batch one commit, nothing removed).
    private func checkOrder(_ ordered: [(UInt64, Int)], commits: Int, info: StoreInfo, findings: Findings) {
        let sorted = ordered.sorted { $0.0 < $1.0 }
        for (earlier, later) in zip(sorted, sorted.dropFirst()) where later.1 < earlier.1 {
            findings.record("order changed", "\(info.name): sequence \(later.0) before \(earlier.0)")
        }
        if info.sequence != UInt64(commits) {
            findings.record("sequence is not one per commit", "\(info.name) at \(info.sequence) after \(commits) commits")
        }
    }

    private struct Run {
        var tag: String
        var start: Int
        var count: Int
    }

    /// Consecutive items of one tag (`TAG-INDEX` ids); a tag's items must be together, indexes in order.
    private static func runs(_ records: [ItemRecord], findings: Findings, store: String) -> [Run] {
        var runs: [Run] = []
        for (position, record) in records.enumerated() {
            let id = record.id.string
            guard let dash = id.lastIndex(of: "-"), let index = Int(id[id.index(after: dash)...]) else {
                findings.record("item never written", "\(store)/\(id)")
                continue
            }
            let tag = String(id[..<dash])
            if let last = runs.last, last.tag == tag {
                if index != last.count { findings.record("order changed", "\(store)/\(id) at \(last.count)") }
                runs[runs.count - 1].count += 1
            } else {
                if runs.contains(where: { $0.tag == tag }) { findings.record("order changed", "\(store): \(tag) split") }
                if index != 0 { findings.record("order changed", "\(store)/\(id) first of its batch") }
                runs.append(Run(tag: tag, start: position, count: 1))
            }
        }
        return runs
    }
}

extension CrashModel {
    /// The checks against stores damaged on purpose: each damage must be reported under its property, and an
    /// intact store under none. Returns the failures (empty when every check catches what it should).
    static func selfTest() -> [String] {
        func record(_ id: String, _ payload: String) -> ItemRecord {
            ItemRecord(id: ItemID(id), createdAt: 1, updatedAt: 1, payload: Payload(payload))
        }
        func info(_ store: String, _ sequence: UInt64, epoch: UInt64 = 5) -> StoreInfo {
            StoreInfo(name: store, epoch: epoch, sequence: sequence, count: 0, engine: "test")
        }
        func ack(_ sequence: UInt64, epoch: UInt64 = 5) -> CommitResult {
            CommitResult(committed: true, epoch: epoch, sequence: sequence)
        }
        /// Two acknowledged singles, then `records` found with `info` after the crash.
        func singles(_ records: [ItemRecord], _ info: StoreInfo) -> [String: Int] {
            let model = CrashModel()
            let findings = Findings()
            for (id, sequence) in [("a", UInt64(1)), ("b", 2)] {
                model.attemptSingle(id, payload: "{\(id)}")
                model.acknowledgeSingle(id, ack(sequence))
            }
            model.checkSingles(records, info: info, findings: findings)
            model.checkSequenceAndEpoch("singles", info: info, findings: findings)
            return findings.summary
        }
        func batches(_ records: [ItemRecord]) -> [String: Int] {
            let model = CrashModel()
            let findings = Findings()
            model.attemptBatch("r0-b0", size: 3)
            model.acknowledgeBatch("r0-b0", ack(1))
            model.checkBatches(records, info: info("batches", 1), findings: findings)
            return findings.summary
        }
        func chains(_ records: [ItemRecord], _ info: StoreInfo) -> [String: Int] {
            let model = CrashModel()
            let findings = Findings()
            model.attemptChain("r0-c0", size: 2)
            model.acknowledgeChain("r0-c0", ack(1))
            model.attemptChain("r0-c1", size: 2)
            model.checkChains(records, info: info, findings: findings)
            return findings.summary
        }
        let a = record("a", "{a}")
        let b = record("b", "{b}")
        let cases: [(String, [String: Int], String?)] = [
            ("intact singles", singles([a, b], info("singles", 2)), nil),
            ("a lost single", singles([a], info("singles", 1)), "acknowledged write lost"),
            ("singles reordered", singles([b, a], info("singles", 2)), "order changed"),
            ("a payload changed", singles([a, record("b", "{x}")], info("singles", 2)), "payload changed"),
            ("a sequence gap", singles([a, b], info("singles", 3)), "sequence is not one per commit"),
            ("an item never written", singles([a, b, record("z", "{}")], info("singles", 3)), "item never written"),
            ("a new epoch", singles([a, b], info("singles", 2, epoch: 6)), "epoch changed"),
            ("an intact batch", batches((0..<3).map { record("r0-b0-\($0)", "{}") }), nil),
            ("a batch in part", batches((0..<2).map { record("r0-b0-\($0)", "{}") }), "batch in part"),
            ("a lost batch", batches([]), "acknowledged write lost"),
            ("the in-flight chain whole", chains([record("r0-c1-0", "{}"), record("r0-c1-1", "{}")], info("chains", 2)), nil),
            ("a chain in part", chains([record("r0-c1-0", "{}")], info("chains", 2)), "chain in part"),
            ("two chains at once", chains([record("r0-c0-0", "{}"), record("r0-c1-1", "{}")], info("chains", 2)), "chain in part"),
            ("a lost chain", chains([], info("chains", 0)), "acknowledged write lost"),
        ]
        var failures: [String] = []
        for (name, found, expected) in cases {
            if let expected {
                if found[expected] == nil { failures.append("\(name): not reported as \"\(expected)\" (found \(found))") }
            } else if !found.isEmpty {
                failures.append("\(name): reported \(found)")
            }
        }
        return failures
    }
}
