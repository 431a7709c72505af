import Foundation
import TestSupport
import Testing

extension Integration {
    /// `storebroker-engine-check`, the real binary: every shipped engine passes; each deliberately broken engine
    /// (Tests/engines/broken-engine.c) fails, and the checker names the property it breaks.
    @Suite struct EngineCheck {
        static let checker = binDirectory + "/storebroker-engine-check"

        @Test(arguments: ["memory", "sqlite", "disk", "wal", "c-example"])
        func everyShippedEnginePasses(engine: String) async throws {
            try await withTemporaryDirectory { directory in
                let result = try await runProgram(
                    [Self.checker, binDirectory + "/libstorebroker-engine-\(engine).so", "--rounds", "3", "--big-apply", "20000"],
                    in: directory, atMost: 300)
                #expect(result.status == 0, "\(result.stdout)\(result.stderr)")
                #expect(result.stdout.contains("every property holds"))
                #expect(!result.stdout.contains("FAIL"))
            }
        }

        /// An engine that acknowledges an apply before writing it loses it in a kill and in a power cut alike; one
        /// that never syncs loses only in a power cut.
        @Test(arguments: [
            ("OPENS_EMPTY", ["damaged-store-fails"]), ("LOSES_LAST_APPLY", ["durability", "power-loss"]),
            ("IGNORES_STOPPED", ["stop-on-request"]), ("ACCEPTS_BAD_OPTIONS", ["bad-option-values"]),
            ("CUTS_KEYS", ["key-lengths"]), ("NEVER_SYNCS", ["power-loss"]),
        ])
        func aBrokenEngineFailsAndTheCheckerNamesWhy(defect: String, properties: [String]) async throws {
            try await withTemporaryDirectory { directory in
                let engine = directory + "/libstorebroker-engine-broken.so"
                let built = try await runCommand(
                    ["/usr/bin/cc", "-std=c11", "-O2", "-shared", "-fPIC", "-DBREAK_\(defect)",
                     "-I", repositoryRoot + "/Sources/CStorageEngine/include", "-o", engine,
                     repositoryRoot + "/Tests/engines/broken-engine.c"],
                    in: directory)
                try #require(built == 0)
                // Six kill rounds: a round may kill the engine that loses its last apply where nothing is held back
                // (one of three runs under load passed it with three).
                let result = try await runProgram([Self.checker, engine, "--rounds", "6", "--big-apply", "1000"], in: directory)
                #expect(result.status == 1, "\(result.stdout)\(result.stderr)")
                let failed = result.stdout.split(separator: "\n").filter { $0.hasPrefix("FAIL") }
                #expect(failed.map { $0.dropFirst(6).prefix { $0 != ":" } } == properties.map { Substring($0) }, "\(result.stdout)")
                #expect(result.stdout.contains(properties.count == 1 ? "1 property failed" : "\(properties.count) properties failed"))
            }
        }

        /// An engine that crashes under the checker fails the property it was running, saying so, and one that
        /// hangs fails it after `--timeout`: each property runs in a child process, so the checker itself goes on
        /// with the next property and exits 1.
        @Test func anEngineThatCrashesOrHangsFailsItsPropertyNotTheChecker() async throws {
            try await withTemporaryDirectory { directory in
                func build(_ source: String, _ output: String, defines: [String] = []) async throws {
                    let status = try await runCommand(
                        ["/usr/bin/cc", "-std=c11", "-O2", "-shared", "-fPIC"] + defines
                            + ["-I", repositoryRoot + "/Sources/CStorageEngine/include", "-o", output,
                               repositoryRoot + "/Tests/engines/" + source], in: directory)
                    try #require(status == 0)
                }
                let crashing = directory + "/libstorebroker-engine-crashing.so"
                try await build("crashing-engine.c", crashing)
                var environment = ProcessInfo.processInfo.environment
                environment["STOREBROKER_TEST_CRASH_AFTER"] = "0"  // its first apply segfaults
                let crashed = try ChildProcess(
                    [Self.checker, crashing, "--only", "reads-after-puts", "--only", "describes-itself"],
                    stdoutPath: directory + "/crashed.out", stderrPath: directory + "/crashed.err", in: directory,
                    environment: environment)
                #expect(await crashed.wait(atMost: 120) == 1, "\(crashed.stdout)\(crashed.stderr)")
                #expect(crashed.stdout.contains("ok    describes-itself"), "\(crashed.stdout)")
                #expect(crashed.stdout.contains("FAIL  reads-after-puts: the engine crashed (signal 11)"), "\(crashed.stdout)")

                let hanging = directory + "/libstorebroker-engine-broken.so"
                try await build("broken-engine.c", hanging, defines: ["-DBREAK_HANGS"])
                let hung = try await runProgram(
                    [Self.checker, hanging, "--only", "reads-after-puts", "--only", "describes-itself", "--timeout", "3"],
                    in: directory)
                #expect(hung.status == 1, "\(hung.stdout)\(hung.stderr)")
                #expect(hung.stdout.contains("FAIL  reads-after-puts: no result within 3 s"), "\(hung.stdout)")
                #expect(hung.stdout.contains("ok    describes-itself") && hung.stdout.contains("1 property failed"))
            }
        }

        /// The checker holds an engine to the name the daemon will load it by (its file's): an engine that calls
        /// itself otherwise, or a file the daemon would never find, is refused as the daemon refuses it.
        @Test func theCheckerRefusesWhatTheDaemonWouldNotLoad() async throws {
            try await withTemporaryDirectory { directory in
                let renamed = directory + "/libstorebroker-engine-other.so"
                try FileManager.default.copyItem(atPath: binDirectory + "/libstorebroker-engine-memory.so", toPath: renamed)
                let misnamed = try await runProgram([Self.checker, renamed, "--only", "describes-itself"], in: directory)
                #expect(misnamed.status == 2, "\(misnamed.stdout)\(misnamed.stderr)")
                #expect(misnamed.stderr.contains(#"the engine calls itself "memory", not "other""#), "\(misnamed.stderr)")
                let unnamed = directory + "/engine.so"
                try FileManager.default.copyItem(atPath: binDirectory + "/libstorebroker-engine-memory.so", toPath: unnamed)
                let stray = try await runProgram([Self.checker, unnamed, "--only", "describes-itself"], in: directory)
                #expect(stray.status == 2 && stray.stderr.contains("libstorebroker-engine-NAME.so"), "\(stray.stderr)")
            }
        }

        @Test func usageAndLoadErrorsHaveTheirOwnStatus() async throws {
            try await withTemporaryDirectory { directory in
                let none = try await runProgram([Self.checker], in: directory)
                #expect(none.status == 64 && none.stdout.contains("usage"))
                let missing = try await runProgram([Self.checker, directory + "/libstorebroker-engine-nothing.so"], in: directory)
                #expect(missing.status == 2 && missing.stderr.contains("cannot load"), "\(missing.stderr)")
                let unknown = try await runProgram([Self.checker, "x.so", "--only", "no-such-property"], in: directory)
                #expect(unknown.status == 64 && unknown.stderr.contains("--list"))
                let list = try await runProgram([Self.checker, "--list"], in: directory)
                #expect(list.status == 0 && list.stdout.contains("durability: ") && list.stdout.contains("kill-recovery: "))
                // Options reach every open: a bad one is the engine's to refuse, and the run says so.
                let bad = try await runProgram(
                    [Self.checker, binDirectory + "/libstorebroker-engine-sqlite.so", "--option", "synchronous=SOMETIMES",
                     "--only", "describes-itself"], in: directory)
                #expect(bad.status == 1 && bad.stdout.contains("SOMETIMES"), "\(bad.stdout)")
            }
        }
    }
}
