// The reliability suite's driver (docs/RELIABILITY.md, scripts/reliability.sh): each subcommand runs one
// scenario against the storebrokerd built beside it, prints its figures as one JSON object on standard output
// and what it does on standard error, and exits 1 when a property it checks fails.
import ArgumentParser
import Foundation
import TestSupport

@main
struct Reliability: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "storebroker-reliability",
        abstract: "Crash rounds, live fuzzing and load against the real daemon, with figures.",
        subcommands: [SelfTest.self, Crash.self, LiveFuzz.self, Load.self])

    struct SelfTest: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "self-test", abstract: "The crash checks against stores damaged on purpose: each is caught.")

        func run() throws {
            let failures = CrashModel.selfTest()
            for failure in failures { log("self-test FAILED: \(failure)") }
            try conclude(["scenario": "self-test", "failures": failures.count, "passed": failures.isEmpty])
        }
    }

    struct Crash: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "kill -9 at random moments during acknowledged writes; check every restart against them.")
        @Option(help: "The engine of the stores.") var engine = "sqlite"
        @Option(help: "Rounds of write, kill, restart, check.") var rounds = 3
        @Option(help: "The seed (random when not given).") var seed: UInt64?

        func run() async throws {
            let seed = seed ?? SeededGenerator.seedFromEnvironment()
            log("crash \(engine): \(rounds) rounds, seed \(seed)")
            let figures = try await CrashScenario(engine: engine, rounds: rounds, seed: seed).run()
            try conclude(figures)
        }
    }

    struct LiveFuzz: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "live-fuzz",
            abstract: "Mutated frames over many connections while a well-behaved client pings.")
        @Option(help: "Mutated frames to send in all.") var frames = 10_000
        @Option(help: "Connections at once.") var connections = 20
        @Option(help: "The protocol's test vectors (the seeds).") var vectors = "docs/protocol-vectors.json"
        @Option(help: "The seed (random when not given).") var seed: UInt64?

        func run() async throws {
            let seed = seed ?? SeededGenerator.seedFromEnvironment()
            log("live fuzz: \(frames) frames over \(connections) connections at once, seed \(seed)")
            let figures = try await LiveFuzzScenario(
                frames: frames, connections: connections, vectorsPath: vectors, seed: seed
            ).run()
            try conclude(figures)
        }
    }

    struct Load: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Many connections with mixed operations and 16 watchers for a bounded time.")
        @Option(help: "Connections at once.") var connections = 200
        @Option(help: "Seconds of load.") var seconds = 10.0
        @Option(help: "Watchers of the store.") var watchers = 16
        @Option(help: "The engine of the store.") var engine = "sqlite"
        @Option(help: "The seed (random when not given).") var seed: UInt64?

        func run() async throws {
            let seed = seed ?? SeededGenerator.seedFromEnvironment()
            log("load: \(connections) connections, \(watchers) watchers, \(seconds) s, engine \(engine), seed \(seed)")
            let figures = try await LoadScenario(
                connections: connections, seconds: seconds, watchers: watchers, engine: engine, seed: seed
            ).run()
            try conclude(figures)
        }
    }
}

/// Prints the figures; exits 1 unless they say the scenario passed.
func conclude(_ figures: [String: Any]) throws {
    emit(figures)
    if figures["passed"] as? Bool != true { throw ExitCode(1) }
}
