import Foundation
import TestSupport
import Testing

extension Integration {
    /// What a shell user needs to write secrets safely and to resynchronize without a race (issue 17, points 2
    /// and 4), through the real storectl and daemon.
    @Suite struct ShellResync {
        /// `secret set NAME` with no value reads it from standard input, never from the command line (where
        /// any user reads it in /proc); so does `value set NAME`. Empty or bad input changes nothing.
        @Test func secretsAndValuesComeFromStandardInputWhenNotGiven() async throws {
            try await Daemon.with { daemon in
                var result = try await daemon.storectl(["secret", "set", "token"], stdin: "s3cr3t\n")
                #expect(result.status == 0 && result.stdout == "1\n", "\(result.stderr)")
                #expect(try await daemon.storectl(["secret", "get", "token"]).stdout == "s3cr3t\n")
                // Only one final newline is taken off: a secret may end with spaces, or be several lines.
                result = try await daemon.storectl(["secret", "set", "token"], stdin: "two\nlines \n")
                #expect(result.status == 0)
                #expect(try await daemon.storectl(["secret", "get", "token"]).stdout == "two\nlines \n")
                result = try await daemon.storectl(["secret", "set", "token"], stdin: "")
                #expect(result.status == 65 && result.stderr.contains("no value given"), "\(result.stderr)")
                #expect(try await daemon.storectl(["secret", "get", "token"]).stdout == "two\nlines \n")

                result = try await daemon.storectl(["value", "set", "theme"], stdin: #"{"dark":true}"# + "\n")
                #expect(result.status == 0 && result.stdout == "1\n", "\(result.stderr)")
                #expect(try await daemon.storectl(["value", "get", "theme"]).stdout == #"{"dark":true}"# + "\n")
                result = try await daemon.storectl(["value", "set", "theme"], stdin: "not json")
                #expect(result.status == 65)
                #expect(try await daemon.storectl(["value", "get", "theme"]).stdout == #"{"dark":true}"# + "\n")
            }
        }

        /// `value get --meta` gives the sequence that `--expect` takes, set or not.
        @Test func valueGetMetaGivesTheSequenceForExpect() async throws {
            try await Daemon.with { daemon in
                var result = try await daemon.storectl(["value", "get", "theme", "--meta"])
                #expect(result.status == 0 && result.stdout == #"{"epoch":0,"sequence":0,"set":false}"# + "\n", "\(result)")
                _ = try await daemon.storectl(["value", "set", "theme", #"{"dark":true}"#])
                result = try await daemon.storectl(["value", "get", "theme", "--meta"])
                let meta = try #require(
                    try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any], "\(result)")
                let sequence = try #require(meta["sequence"] as? Int)
                #expect(sequence >= 1 && meta["set"] as? Bool == true)
                #expect((meta["value"] as? [String: Bool]) == ["dark": true])
                // The sequence it printed is the one a conditional write expects; a stale one conflicts.
                result = try await daemon.storectl(["value", "set", "theme", "--expect", "\(sequence)", #"{"dark":false}"#])
                #expect(result.status == 0 && result.stdout == "\(sequence + 1)\n")
                result = try await daemon.storectl(["value", "set", "theme", "--expect", "\(sequence)", "{}"])
                #expect(result.status == 75)
                _ = try await daemon.storectl(["value", "reset", "theme"])
                result = try await daemon.storectl(["value", "get", "theme", "--meta"])
                #expect(result.stdout.contains(#""sequence":\#(sequence + 2),"set":false}"#), "\(result)")
                // Secrets: the meta line carries the JSON string.
                _ = try await daemon.storectl(["secret", "set", "token", "s3cr3t"])
                result = try await daemon.storectl(["secret", "get", "token", "--meta"])
                #expect(result.stdout.hasSuffix(#""set":true,"value":"s3cr3t"}"# + "\n"), "\(result)")
            }
        }

        /// `export` says on standard error which commit its snapshot is at, and a watch from there sees exactly
        /// the commits that came after it; standard output stays what `import` reads.
        @Test func exportTellsTheSequenceToWatchFrom() async throws {
            try await Daemon.with { daemon in
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"a"}"#, #"{"id":"b"}"#])
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"c"}"#])
                let export = try await daemon.storectl(["export", "notes"])
                #expect(export.status == 0 && export.lines.count == 3)
                let said = try #require(
                    export.stderr.firstMatch(of: /exported 3 items of notes at sequence (\d+), epoch (\d+)/), "\(export.stderr)")
                #expect(said.1 == "2")
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"d"}"#])
                let watcher = try await daemon.watch("notes", ["--from", String(said.1), "--epoch", String(said.2)])
                #expect(await watcher.waitFor(sequence: 3))
                await watcher.stop()
                // `resumed` at the exported sequence, nothing of the exported commits again, and the next one.
                let objects = watcher.objects
                #expect(objects.first?["op"] as? String == "resumed" && objects.first?["sequence"] as? Int == 2)
                #expect(objects.dropFirst().allSatisfy { ($0["sequence"] as? Int ?? 0) > 2 }, "\(watcher.lines)")
                #expect(watcher.lines.contains { $0.contains(#""d""#) }, "\(watcher.lines)")
            }
        }
    }
}

extension Integration {
    /// One rule for numeric ids, and input that is not UTF-8 refused (issue 17, point 5).
    @Suite struct ShellInputRules {
        /// An integral number below 2^53 becomes its shortest decimal text; any other number is exit 65 naming
        /// the line, and nothing of that input is written.
        @Test func numericIdsFollowOneRule() async throws {
            try await Daemon.with { daemon in
                let input = [#"{"id":1.0}"#, #"{"id":1e3}"#, #"{"id":-0}"#, #"{"id":7}"#, #"{"id":-9007199254740991}"#]
                var result = try await daemon.storectl(["insert", "n"], stdin: input.joined(separator: "\n") + "\n")
                #expect(result.status == 0, "\(result.stderr)")
                result = try await daemon.storectl(["query", "n", "--meta"])
                let ids = result.lines.compactMap {
                    (try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])?["id"] as? String
                }
                #expect(ids == ["1", "1000", "0", "7", "-9007199254740991"], "\(result.stdout)")
                for bad in ["1.5", "9007199254740992", "1e300"] {
                    result = try await daemon.storectl(["insert", "m"], stdin: "{\"id\":\"ok\"}\n{\"id\":\(bad)}\n")
                    // The error line carries its code name, as docs/CLI.md says every error line does.
                    #expect(result.status == 65 && result.stderr.hasPrefix("storectl: badInput: line 2: "), "\(bad): \(result.stderr)")
                    #expect(result.stderr.contains("integer below 2^53"), "\(result.stderr)")
                }
                #expect(try await daemon.storectl(["count", "m"]).stdout == "0\n")
                let nowhere = try await runStorectl(["--socket", daemon.directory + "/nowhere.sock", "count", "m"], in: daemon.directory)
                #expect(nowhere.status == 69 && nowhere.stderr.hasPrefix("storectl: unavailable: cannot connect"), "\(nowhere.stderr)")
            }
        }

        /// A line of an import file that is not UTF-8 is exit 65 naming it, and nothing is written: no U+FFFD in
        /// place of what was given.
        @Test func invalidUTF8IsRefusedNotReplaced() async throws {
            try await Daemon.with { daemon in
                let file = daemon.directory + "/bad.ndjson"
                var bytes = Array(#"{"id":"a","text":"fine"}"#.utf8) + [0x0A]
                bytes += Array(#"{"id":"b","text":"caf"#.utf8) + [0xE9] + Array(#""}"#.utf8) + [0x0A]
                try Data(bytes).write(to: URL(fileURLWithPath: file))
                let result = try await daemon.storectl(["import", "n", file])
                #expect(result.status == 65 && result.stderr.contains("line 2: not valid UTF-8"), "\(result.stderr)")
                #expect(try await daemon.storectl(["count", "n"]).stdout == "0\n")
            }
        }
    }
}

extension Integration {
    /// `storectl get STORE ID`, as a redis-cli user reaches for (issue 17, point 7).
    @Suite struct ShellGet {
        @Test func getPrintsOneItemOrExits66() async throws {
            try await Daemon.with { daemon in
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"a", "text":"milk"}"#, #"{"id":7}"#])
                var result = try await daemon.storectl(["get", "notes", "a"])
                #expect(result.status == 0 && result.stdout == #"{"id":"a", "text":"milk"}"# + "\n", "\(result)")
                result = try await daemon.storectl(["get", "notes", "7", "--meta"])
                #expect(result.status == 0 && result.stdout.hasPrefix(#"{"id":"7","createdAt":"#), "\(result)")
                #expect(result.stdout.hasSuffix(#","item":{"id":7}}"# + "\n"), "\(result)")
                result = try await daemon.storectl(["get", "notes", "b"])
                #expect(result.status == 66 && result.stdout.isEmpty && result.stderr.contains(#"not in store notes: "b""#))
                result = try await daemon.storectl(["get", "nothing-here", "a"])
                #expect(result.status == 66)
                // Reading never creates the store.
                #expect(!(try await daemon.storectl(["stores"]).stdout.contains("nothing-here")))
            }
        }
    }
}

extension Integration {
    /// `watch` never loses part of a commit silently (issue 17, point 1): every line says which step of how
    /// many it is, `--from N` resumes after commit N completed (so a consumer cut inside commit N resumes from
    /// N-1 and sees all of it again), and a stale epoch says `history-gone`.
    @Suite struct WatchWholeCommits {
        @Test func linesCarryTheirStepAndAResumeFromTheCommitBeforeReplaysItWhole() async throws {
            try await Daemon.with { daemon in
                _ = try await daemon.storectl(["insert", "s", #"{"id":"first"}"#])  // sequence 1
                let steps = 3_000
                let chain = (0..<steps).map { $0 % 2 == 0 ? "{\"op\":\"insert\",\"item\":{\"id\":\"\($0)\"}}" : "{\"op\":\"remove\",\"id\":\"\($0 - 1)\"}" }
                let watcher = try await daemon.watch("s")
                #expect(try await daemon.storectl(["apply", "s"], stdin: chain.joined(separator: "\n") + "\n").stdout == "2\n")
                #expect(await watcher.waitFor(sequence: 2))
                #expect(await eventually { watcher.objects.count == 1 + steps })
                await watcher.stop()
                let events = Array(watcher.objects.dropFirst())
                let epoch = try #require(watcher.objects.first?["epoch"] as? Int)
                #expect(events.map { $0["step"] as? Int } == (1...steps).map { $0 })
                #expect(events.allSatisfy { $0["steps"] as? Int == steps && $0["sequence"] as? Int == 2 && $0["epoch"] as? Int == epoch })

                // A consumer that saw only part of commit 2 resumes from 1: commit 2 again, whole.
                let resumed = try await daemon.watch("s", ["--from", "1", "--epoch", "\(epoch)"])
                #expect(await eventually { resumed.objects.count == 1 + steps })
                await resumed.stop()
                #expect(resumed.objects.first?["op"] as? String == "resumed")
                #expect(resumed.objects.dropFirst().map { $0["step"] as? Int } == (1...steps).map { $0 })

                // Dropped and created again: resuming in the old epoch is history-gone and a fresh snapshot, never
                // a silent skip of the new store's first commits.
                _ = try await daemon.storectl(["drop", "s"])
                _ = try await daemon.storectl(["insert", "s", #"{"id":"new-1"}"#])
                _ = try await daemon.storectl(["insert", "s", #"{"id":"new-2"}"#])
                let stale = try await daemon.watch("s", ["--from", "2", "--epoch", "\(epoch)"])
                #expect(await eventually { stale.objects.contains { $0["op"] as? String == "loaded" } })
                await stale.stop()
                #expect(stale.objects.map { $0["op"] as? String } == ["resumed", "history-gone", "loaded"], "\(stale.lines)")
                #expect(stale.objects.last?["count"] as? Int == 2 && stale.objects.last?["epoch"] as? Int != epoch)
            }
        }
    }
}

extension Integration {
    /// `value list` and `secret list`, as a dconf user reaches for (issue 17, point 7).
    @Suite struct ShellListValues {
        @Test func valueAndSecretNamesAreListedInNameOrder() async throws {
            try await Daemon.with { daemon in
                #expect(try await daemon.storectl(["value", "list"]).stdout == "")
                _ = try await daemon.storectl(["value", "set", "theme", #"{"dark":true}"#])
                _ = try await daemon.storectl(["value", "set", "b-flag", "true"])
                _ = try await daemon.storectl(["value", "set", "gone", "1"])
                _ = try await daemon.storectl(["value", "reset", "gone"])
                _ = try await daemon.storectl(["secret", "set", "token", "s3cr3t"])
                #expect(try await daemon.storectl(["value", "list"]).stdout == "b-flag\ntheme\n")
                #expect(try await daemon.storectl(["value", "list", "--all"]).stdout == "b-flag\ngone\ntheme\n")
                let ndjson = try await daemon.storectl(["value", "list", "--all", "--format", "ndjson"]).lines
                #expect(ndjson.count == 3 && ndjson[1].hasPrefix(#"{"name":"gone","epoch":"#) && ndjson[1].hasSuffix(#""sequence":2,"set":false}"#), "\(ndjson)")
                // Secrets: names only, never the secret.
                let secrets = try await daemon.storectl(["secret", "list", "--format", "json"])
                #expect(secrets.stdout.contains(#""name":"token""#) && !secrets.stdout.contains("s3cr3t"), "\(secrets)")
                #expect(try await daemon.storectl(["secret", "list"]).stdout == "token\n")
                #expect(try await daemon.storectl(["value", "list", "--format", "yaml"]).status == 64)
            }
        }
    }
}

extension Integration {
    /// Output true to docs/CLI.md on a terminal (issue 17, point 6), through a pseudo-terminal (`script`).
    @Suite(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/script"), "needs script(1) for a terminal"))
    struct ShellTerminalOutput {
        /// Runs storectl on a pseudo-terminal 200 columns wide, with `environment` set; its output lines.
        private func onTerminal(_ daemon: Daemon, _ arguments: [String], environment: String = "") async throws -> [String] {
            let command = "stty cols 200; \(environment) \(binDirectory)/storectl --socket \(daemon.socketPath) "
                + arguments.map { "'\($0)'" }.joined(separator: " ")
            let result = try await runProgram(["/usr/bin/script", "-qec", command, "/dev/null"], in: daemon.directory)
            return result.stdout.replacingOccurrences(of: "\r", with: "").split(separator: "\n").map(String.init)
        }

        @Test func metaTablesTimesAndWideCharactersOnATerminal() async throws {
            try await Daemon.with { daemon in
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"a","text":"milk"}"#, #"{"id":"日本語","text":"茶"}"#])
                // --meta on a terminal prints the wrapped lines, as documented (not the table).
                var lines = try await onTerminal(daemon, ["query", "notes", "--meta"])
                #expect(lines.count == 2 && lines.allSatisfy { $0.hasPrefix(#"{"id":"#) && $0.contains(#""createdAt":"#) }, "\(lines)")
                // The table: local time (TZ), and the ITEM column where the header puts it, CJK ids included (two
                // columns per character).
                lines = try await onTerminal(daemon, ["query", "notes"], environment: "TZ=Asia/Tokyo")
                #expect(lines.count == 3, "\(lines)")
                #expect(lines.dropFirst().allSatisfy { $0.contains("+09:00") }, "\(lines)")
                let itemColumn = try #require(lines.first?.range(of: "ITEM")).lowerBound.utf16Offset(in: lines[0])
                for line in lines.dropFirst() {
                    let before = String(line[..<(line.range(of: "{")!.lowerBound)])
                    #expect(Table.width(before) == itemColumn, "\(lines)")
                }
                // An import's progress bar moves as batches commit (before: drawn once, at 100%).
                let file = daemon.directory + "/many.ndjson"
                try (0..<100_000).map { "{\"id\":\"\($0)\"}\n" }.joined().write(toFile: file, atomically: false, encoding: .utf8)
                let bar = try await onTerminal(daemon, ["import", "many", file]).joined(separator: "\n")
                let states = Set(bar.matches(of: /\((\d+)%\)/).map { String($0.1) })
                #expect(states.count >= 2 && states.contains("100"), "\(states)")
                // `secret set NAME` on a terminal asks without echo: the secret typed never shows.
                // (Typed after the prompt is up: what is typed ahead, the terminal itself echoes.)
                let typed = try await runProgram(
                    [
                        "/bin/bash", "-c",
                        "(sleep 1; printf 'typed-s3cr3t\\n') | /usr/bin/script -qec \"$0 --socket $1 secret set token\" /dev/null",
                        binDirectory + "/storectl", daemon.socketPath,
                    ], in: daemon.directory)
                #expect(typed.stdout.contains("secret token: ") && !typed.stdout.contains("typed-s3cr3t"), "\(typed.stdout)")
                #expect(try await daemon.storectl(["secret", "get", "token"]).stdout == "typed-s3cr3t\n")
                // --limit -1 says what it takes.
                let limit = try await daemon.storectl(["query", "notes", "--limit", "-1"])
                #expect(limit.status == 64 && limit.stderr.contains("--limit takes a number of items from 0"), "\(limit.stderr)")
            }
        }
    }
}

/// Terminal columns, as storectl's table counts them (a copy would drift: this is the test's own reading).
private enum Table {
    static func width(_ text: String) -> Int {
        text.unicodeScalars.reduce(0) { total, scalar in
            total + ((0x3000...0x9FFF).contains(scalar.value) || (0xFF00...0xFF60).contains(scalar.value) ? 2 : 1)
        }
    }
}

extension Integration {
    /// `import` streams its file (issue 17, point 3).
    @Suite struct ShellImport {
        /// A 100 MB file goes in with storectl's peak resident memory under 64 MiB (before: the whole file, then
        /// every item, were held at once: 441 MiB for a 105 MB file).
        @Test func aHundredMegabyteImportStaysUnder64MiB() async throws {
            try await Daemon.with(arguments: ["--engine", "memory"]) { daemon in
                let file = daemon.directory + "/big.ndjson"
                let text = String(repeating: "x", count: 10_200)
                var data = Data()
                data.reserveCapacity(102 << 20)
                for n in 0..<10_000 { data.append(contentsOf: Array("{\"id\":\"item-\(n)\",\"text\":\"\(text)\"}\n".utf8)) }
                try data.write(to: URL(fileURLWithPath: file))
                // The peak (VmHWM) read until the process is gone.
                let script = """
                    "$1" --socket "$2" import big "$3" >/dev/null & pid=$!; peak=0
                    while kill -0 $pid 2>/dev/null; do
                        now=$(awk '/VmHWM/ {print $2}' /proc/$pid/status 2>/dev/null); [ -n "$now" ] && peak=$now; sleep 0.02
                    done
                    wait $pid; echo "$? $peak"
                    """
                let result = try await runProgram(
                    ["/bin/bash", "-c", script, "import", binDirectory + "/storectl", daemon.socketPath, file], in: daemon.directory)
                let figures = result.stdout.split(separator: " ").compactMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
                #expect(figures.count == 2 && figures[0] == 0, "\(result)")
                let peak = figures.count == 2 ? figures[1] : Int.max
                print("import: 100 MB file, storectl peak resident \(peak / 1024) MiB")
                #expect(peak < 64 * 1024, "storectl's peak resident memory was \(peak / 1024) MiB")
                #expect(try await daemon.storectl(["count", "big"]).stdout == "10000\n")
            }
        }

        /// `--atomic` past the broker's limits says what to do instead, and writes nothing.
        @Test func atomicPastMaxBatchSaysWhatToDo() async throws {
            try await Daemon.with(arguments: ["--max-batch", "5"]) { daemon in
                let file = daemon.directory + "/ten.ndjson"
                try (0..<10).map { "{\"id\":\"\($0)\"}\n" }.joined().write(toFile: file, atomically: false, encoding: .utf8)
                let result = try await daemon.storectl(["import", "notes", file, "--atomic"])
                #expect(result.status == 65 && result.stderr.contains("import it without --atomic"), "\(result.stderr)")
                #expect(result.stderr.contains("--max-batch"))
                #expect(try await daemon.storectl(["count", "notes"]).stdout == "0\n")
                // Without --atomic the same file goes in, in several commits.
                #expect(try await daemon.storectl(["import", "notes", file]).status == 0)
                #expect(try await daemon.storectl(["count", "notes"]).stdout == "10\n")
            }
        }
    }
}

extension Integration {
    /// `watch` of several stores, and `watch --follow` across a daemon restart (issue 17, point 7).
    @Suite struct ShellWatchMore {
        @Test func severalStoresOnOneWatch() async throws {
            try await Daemon.with { daemon in
                _ = try await daemon.storectl(["insert", "a", #"{"id":"1"}"#])
                let watcher = try await daemon.watch("a", ["b"])
                #expect(await eventually { watcher.objects.filter { $0["op"] as? String == "loaded" }.count == 2 })
                _ = try await daemon.storectl(["insert", "b", #"{"id":"x"}"#])
                _ = try await daemon.storectl(["insert", "a", #"{"id":"2"}"#])
                #expect(await eventually { watcher.objects.filter { $0["op"] as? String == "insert" }.count == 2 })
                await watcher.stop()
                let inserts = watcher.objects.filter { $0["op"] as? String == "insert" }
                #expect(Set(inserts.map { "\($0["store"] as? String ?? "")@\($0["sequence"] as? Int ?? 0)" }) == ["b@1", "a@2"])
                let resumeTwo = try await daemon.storectl(["watch", "a", "b", "--from", "1"])
                #expect(resumeTwo.status == 64 && resumeTwo.stderr.contains("--from resumes one store"))
            }
        }

        /// `--all`: every store, and a store created later from its first commit on (its commits before it was
        /// noticed come as events, not folded into a snapshot).
        @Test func allStoresIncludingOnesCreatedLater() async throws {
            try await Daemon.with { daemon in
                _ = try await daemon.storectl(["insert", "a", #"{"id":"1"}"#])
                let watcher = try await daemon.watch("--all")
                #expect(await eventually { watcher.objects.contains { $0["op"] as? String == "loaded" && $0["store"] as? String == "a" } })
                for n in 1...3 { _ = try await daemon.storectl(["insert", "later", "{\"id\":\"\(n)\"}"]) }
                #expect(await eventually { watcher.objects.filter { $0["store"] as? String == "later" && $0["op"] as? String == "insert" }.count == 3 })
                await watcher.stop()
                let later = watcher.objects.filter { $0["store"] as? String == "later" }
                #expect(later.first?["op"] as? String == "resumed" && later.first?["sequence"] as? Int == 0, "\(watcher.lines)")
                #expect(later.dropFirst().map { $0["sequence"] as? Int } == [1, 2, 3], "\(watcher.lines)")
                #expect(try await daemon.storectl(["watch", "--all", "a"]).status == 64)
            }
        }

        /// A reconnection that finds no socket (the daemon down longer than the first retry) waits: the follower
        /// says once on stderr that the broker is away, and resumes when it is back (issue 52, point 5: it exited 69
        /// at the first reconnection that failed).
        @Test func followWaitsWhileTheSocketIsAbsent() async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory)
                try await daemon.start()
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"before"}"#])
                let follower = try await daemon.watch("notes", ["--follow"])
                #expect(await follower.waitFor(sequence: 1))
                _ = await daemon.stop()
                #expect(!FileManager.default.fileExists(atPath: daemon.socketPath))
                // Readiness, not a sleep: the follower has tried again, found no socket, and waits.
                #expect(
                    await eventually(within: 20) { follower.process.stderr.contains("waiting for it to come back") },
                    "\(follower.process.stderr)")
                try await daemon.start()
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"after"}"#])
                #expect(await follower.waitFor(sequence: 2, within: 30), "\(follower.lines) \(follower.process.stderr)")
                await follower.stop()
                await daemon.stop()
                let objects = follower.objects
                #expect(objects.filter { $0["op"] as? String == "insert" }.map { $0["sequence"] as? Int ?? 0 } == [2])
                #expect(objects.contains { $0["op"] as? String == "resumed" && $0["sequence"] as? Int == 1 }, "\(follower.lines)")
            }
        }

        @Test func followResumesAcrossARestart() async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory)
                try await daemon.start()
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"before"}"#])
                let follower = try await daemon.watch("notes", ["--follow"])
                let plain = try await daemon.watch("notes")
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"one"}"#])
                #expect(await follower.waitFor(sequence: 2))
                _ = await daemon.stop()
                // Without --follow, watch ends with 69 when the broker goes away; with it, it waits.
                #expect(await plain.process.wait(atMost: 10) == 69)
                try await daemon.start()
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"two"}"#])
                #expect(await follower.waitFor(sequence: 3, within: 30), "\(follower.lines)")
                await follower.stop()
                await daemon.stop()
                let objects = follower.objects
                // Each commit once, in order, and a `resumed` line where it came back.
                let commits = objects.filter { $0["op"] as? String == "insert" }.map { $0["sequence"] as? Int ?? 0 }
                #expect(commits == [2, 3], "\(follower.lines)")
                #expect(objects.contains { $0["op"] as? String == "resumed" && $0["sequence"] as? Int == 2 }, "\(follower.lines)")
            }
        }
    }
}

extension Integration {
    /// Shell completions offer the broker's store names and, for import, files (issue 17, point 7).
    @Suite struct ShellCompletions {
        @Test func storeNamesComeFromTheBrokerTheLineNames() async throws {
            try await Daemon.with { daemon in
                for store in ["notes", "news", "other"] { _ = try await daemon.storectl(["insert", store, #"{"id":"1"}"#]) }
                // What the generated bash script runs for `storectl --socket S query n<TAB>`.
                let words = ["storectl", "--socket", daemon.socketPath, "query", "n"]
                let result = try await runStorectl(
                    ["---completion", "query", "--", "positional@0", "4", "1"] + words, in: daemon.directory)
                #expect(result.status == 0 && result.lines == ["news", "notes"], "\(result)")
                // No broker: nothing offered, no error.
                let none = try await runStorectl(
                    ["---completion", "count", "--", "positional@0", "4", "0", "storectl", "--socket", daemon.directory + "/none.sock", "count", ""],
                    in: daemon.directory)
                #expect(none.status == 0 && none.stdout.isEmpty, "\(none)")
                // The scripts: store arguments ask storectl, import's file argument is a file.
                let bash = try await runStorectl(["--generate-completion-script", "bash"], in: daemon.directory).stdout
                #expect(bash.contains("---completion watch -- positional@0"))
                let importFunction = bash.components(separatedBy: "_storectl_import()").last ?? ""
                #expect(importFunction.contains("__storectl_add_completions -f"))
            }
        }
    }
}
