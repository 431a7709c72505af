import BrokerCore
import EngineLoader
import Foundation
import NIOCore
import TestSupport

/// A kill round: the checker `posix_spawn`s itself as a child (`--crash-child`) that applies a known sequence of
/// applies to one store, printing each sequence once its apply returned SB_OK; the parent kills it with SIGKILL
/// at a random moment, reopens the store and compares it with the model of the sequence it opened at. With a
/// `PowerCut`, the child runs with the power-cut library preloaded and the parent turns the store's files into
/// what a power cut would leave before it reopens them.
enum CrashRound {
    struct Outcome {
        /// The last sequence the child printed (its apply returned SB_OK).
        var acknowledged: UInt64
        /// Each sequence the child printed, with when (`monotonicMilliseconds`).
        var acknowledgements: [(sequence: UInt64, at: UInt64)]
        /// When the child was killed (`monotonicMilliseconds`).
        var killedAt: UInt64
        var opened: UInt64
        var contents: [EngineRecord]
    }

    /// The arguments that make the checker the child.
    static let childFlag = "--crash-child"

    /// `runFor`: how long the child applies after its first apply returned, in milliseconds, before the kill.
    static func run(
        _ context: Context, round: Int, powerCut: PowerCut? = nil, runFor: ClosedRange<Int> = 20...400
    ) async throws -> Outcome {
        let directory = try context.storeDirectory(powerCut == nil ? "crash" : "power-cut-\(round)")
        let output = context.directory + "/child-\(round).out"
        var arguments = [context.setup.checker, childFlag, context.engine.path, directory, context.storeName(directory)]
        for (key, value) in context.setup.options.sorted(by: { $0.key < $1.key }) { arguments += ["\(key)=\(value)"] }
        let child = try ChildProcess(
            arguments, stdoutPath: output, stderrPath: context.directory + "/child-\(round).err", in: context.directory,
            environment: try powerCut?.environment(recording: directory))
        // Let it commit a few applies, then kill it at a random moment.
        let started = await eventually(within: 60) { !completeLines(output).isEmpty || hasExited(child) }
        guard started, !completeLines(output).isEmpty else {
            child.signal(SIGKILL)
            await child.wait()
            throw Violation(message: "round \(round): the child made no apply: \(child.stderr.suffix(500))")
        }
        try await Task.sleep(for: .milliseconds(Int.random(in: runFor)))
        let killedAt = monotonicMilliseconds()
        child.signal(SIGKILL)
        let status = await child.wait()
        let acknowledgements = completeLines(output).compactMap { line -> (sequence: UInt64, at: UInt64)? in
            let fields = line.split(separator: " ")
            guard fields.count == 2, let sequence = UInt64(fields[0]), let at = UInt64(fields[1]) else { return nil }
            return (sequence, at)
        }
        guard status == 128 + SIGKILL else {
            throw Violation(message: "round \(round): the child exited with \(status) before the kill: \(child.stderr.suffix(500))")
        }
        try powerCut?.cut(directory)
        return try context.withStore(directory) { store in
            Outcome(
                acknowledged: acknowledgements.last?.sequence ?? 0, acknowledgements: acknowledgements, killedAt: killedAt,
                opened: store.openedSequence, contents: try store.contents())
        }
    }

    /// True once the child is gone or a zombie (not yet reaped: `ChildProcess` reaps it).
    private static func hasExited(_ child: ChildProcess) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(child.pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return true }
        return stat[close...].dropFirst(2).first == "Z"
    }

    /// The lines the child finished writing (a kill may cut the last one).
    private static func completeLines(_ path: String) -> [Substring] {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return [] }
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        lines.removeLast()  // after the last newline: empty, or a line cut short
        return lines
    }

    /// The steps of apply `sequence`: single puts, overwrites, removes, batches of 100 and of 2,500 items, and a
    /// removeAll every 50 applies (which keeps the store small).
    static func steps(_ sequence: UInt64) -> [EngineStep] {
        let k = sequence
        if k % 50 == 0 { return [.removeAll, .put(record("k\(k)", "v\(k)", created: k, updated: k))] }
        if k % 13 == 0 { return (0..<2_500).map { .put(record("c\(k)-\($0)", "chain \(k) item \($0)", created: k, updated: k)) } }
        if k % 7 == 0 {
            return (0..<100).map { .put(record("b\(k)-\($0)", "batch \(k)", created: k, updated: k)) }
                + [.remove(key: Array("k\(k - 1)".utf8))]
        }
        var steps: [EngineStep] = [.put(record("k\(k)", "v\(k)", created: k, updated: k))]
        if k % 3 == 0 { steps.append(.put(record("k\(k - 2)", "w\(k)", created: k, updated: k))) }
        return steps
    }

    /// The store after applies 1 through `sequence`.
    static func model(at sequence: UInt64) -> [EngineRecord] {
        guard sequence > 0 else { return [] }
        // Only the applies since the last removeAll matter.
        var items: [EngineRecord?] = []
        var index: [[UInt8]: Int] = [:]
        for k in (sequence - sequence % 50)...sequence where k > 0 {
            for step in steps(k) {
                switch step {
                case .removeAll:
                    items.removeAll()
                    index.removeAll()
                case .remove(let key):
                    if let at = index.removeValue(forKey: key) { items[at] = nil }
                case .put(let record):
                    if let at = index[record.key] {
                        items[at] = record
                    } else {
                        index[record.key] = items.count
                        items.append(record)
                    }
                }
            }
        }
        return items.compactMap { $0 }
    }

    /// The child: `CHECKER --crash-child ENGINE.so DIRECTORY STORE [KEY=VALUE ...]`. Opens the store and applies from
    /// the sequence after the one it opened at, printing each sequence once its apply returned, and when
    /// (`monotonicMilliseconds`); it stops by
    /// itself after 600 s, a safety net only: the parent kills it, but a parent whose task waits behind other
    /// tests' blocking work (the package's tests run every property of every engine at once on two threads) may
    /// come back a minute later; with 60 s, CI saw children finish before their kill.
    static func child(_ arguments: [String]) -> Int32 {
        guard arguments.count >= 3 else { return 64 }
        var options: [String: String] = [:]
        for pair in arguments.dropFirst(3) {
            guard let equals = pair.firstIndex(of: "=") else { return 64 }
            options[String(pair[..<equals])] = String(pair[pair.index(after: equals)...])
        }
        do {
            let engine = try EngineLoader(searchPath: EngineSearchPath(directories: [])).load(path: arguments[0])
            let store = try engine.open(directory: arguments[1], store: arguments[2], options: options)
            let deadline = Date().addingTimeInterval(600)
            var sequence = store.openedSequence
            while Date() < deadline {
                sequence += 1
                try store.apply(steps(sequence), sequence: sequence)
                let line = Array("\(sequence) \(monotonicMilliseconds())\n".utf8)
                _ = line.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
            }
            store.close()
            return 0
        } catch {
            FileHandle.standardError.write(Data("crash child: \(error)\n".utf8))
            return 1
        }
    }
}

/// CLOCK_MONOTONIC in milliseconds: one clock for the checker and its children.
func monotonicMilliseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1000 + UInt64(now.tv_nsec) / 1_000_000
}
