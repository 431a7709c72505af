import Foundation
import TestSupport
import Testing

/// Every integration suite runs one at a time: each starts real daemons, and the machine has 2 cores.
@Suite(.serialized) enum Integration {}

extension Integration {
    /// Every storectl command through the real daemon, with its exact output and exit code (docs/CLI.md).
    @Suite struct StoreCtlCommands {
        @Test func writesPrintTheNewSequenceAndQueriesPrintPayloadsExactly() async throws {
            try await Daemon.with { daemon in
                var result = try await daemon.storectl(["insert", "notes", #"{"id":"1","text":"milk"}"#, #"{"id":"2", "text": "eggs"}"#])
                #expect(result.status == 0)
                #expect(result.stdout == "1\n")
                // Replace in place, numeric id, a new id from stdin (NDJSON).
                result = try await daemon.storectl(["insert", "notes"], stdin: "{\"id\":\"1\",\"text\":\"oat milk\"}\n\n{\"id\":3}\n")
                #expect(result.stdout == "2\n")
                result = try await daemon.storectl(["query", "notes"])
                #expect(result.stdout == "{\"id\":\"1\",\"text\":\"oat milk\"}\n{\"id\":\"2\", \"text\": \"eggs\"}\n{\"id\":3}\n")
                result = try await daemon.storectl(["query", "notes", "--format", "json"])
                #expect(result.stdout == "[{\"id\":\"1\",\"text\":\"oat milk\"},{\"id\":\"2\", \"text\": \"eggs\"},{\"id\":3}]\n")
                result = try await daemon.storectl(["count", "notes"])
                #expect(result.stdout == "3\n")

                // Nothing changed: nothing printed, exit 0.
                result = try await daemon.storectl(["remove", "notes", "absent"])
                #expect(result.status == 0)
                #expect(result.stdout == "")
                result = try await daemon.storectl(["insert", "notes"], stdin: "")
                #expect(result.status == 0)
                #expect(result.stdout == "")

                result = try await daemon.storectl(["remove", "notes", "2", "absent"])
                #expect(result.stdout == "3\n")
                result = try await daemon.storectl(["query", "notes", "--after", "1", "--limit", "5"])
                #expect(result.stdout == "{\"id\":3}\n")
                result = try await daemon.storectl(["query", "notes", "--id", "3", "--id", "1"])
                #expect(result.stdout == "{\"id\":3}\n{\"id\":\"1\",\"text\":\"oat milk\"}\n")
                result = try await daemon.storectl(["query", "notes", "--id", "3", "--id", "2"])
                #expect(result.status == 66)
                #expect(result.stdout == "{\"id\":3}\n")
                #expect(result.stderr.contains("\"2\""))
                result = try await daemon.storectl(["query", "notes", "--after", "2"])
                #expect(result.status == 66)
                #expect(result.stderr.contains("cursor"))

                result = try await daemon.storectl(["clear", "notes"])
                #expect(result.stdout == "4\n")
                result = try await daemon.storectl(["count", "notes"])
                #expect(result.stdout == "0\n")
                result = try await daemon.storectl(["clear", "notes"])
                #expect(result.stdout == "")
                result = try await daemon.storectl(["stores"])
                #expect(result.lines.count == 1)
                #expect(result.stdout.contains("\"name\":\"notes\",\"engine\":\"sqlite\""))
                #expect(result.stdout.contains("\"sequence\":4,\"count\":0}"))

                result = try await daemon.storectl(["drop", "notes"])
                #expect(result.stdout == "0\n")
                result = try await daemon.storectl(["drop", "notes"])
                #expect(result.stdout == "")
                result = try await daemon.storectl(["stores"])
                #expect(result.stdout == "")
                // Reading a store that does not exist: empty, and it is not created.
                result = try await daemon.storectl(["query", "nothing"])
                #expect(result.status == 0 && result.stdout == "")
                result = try await daemon.storectl(["count", "nothing"])
                #expect(result.stdout == "0\n")
                result = try await daemon.storectl(["stores"])
                #expect(result.stdout == "")
            }
        }

        /// A mistyped command or subcommand is named, with the closest there is (exit 64), where the parser said "3
        /// unexpected arguments" or blamed `--socket`; an absent store is told apart from an absent item (both exit
        /// 66), where both read "not in store" (issue 52, point 4).
        @Test func aMistypedCommandGetsDidYouMeanAndAnAbsentStoreIsNotAnAbsentItem() async throws {
            try await Daemon.with { daemon in
                try await daemon.expectStorectl(
                    ["inser", "todo", #"{"id":"a"}"#], exits: 64, saying: "unknown command 'inser'; did you mean 'insert'?")
                try await daemon.expectStorectl(
                    ["value", "gett", "theme"], exits: 64,
                    saying: "unknown command 'value gett'; did you mean 'value get'?")
                let unknown = try await daemon.storectl(["frobnicate"])
                #expect(unknown.status == 64 && unknown.stderr.contains("unknown command 'frobnicate'"))
                #expect(!unknown.stderr.contains("did you mean"))
                _ = try await daemon.storectl(["insert", "todo", #"{"id":"a"}"#])
                try await daemon.expectStorectl(["get", "todo", "b"], exits: 66, saying: #"not in store todo: "b""#)
                for absent in [["get", "nosuchstore", "a"], ["query", "nosuchstore", "--id", "a"]] {
                    try await daemon.expectStorectl(absent, exits: 66, saying: "store nosuchstore does not exist")
                }
                // A watch of a store that does not exist (a typo, or one not made yet) says so while it waits.
                let watcher = try await daemon.watch("tod")
                defer { watcher.process.signal(SIGTERM) }
                #expect(
                    await eventually { watcher.process.stderr.contains("store tod does not exist yet") },
                    "\(watcher.process.stderr)")
                let existing = try await daemon.watch("todo")
                defer { existing.process.signal(SIGTERM) }
                #expect(!existing.process.stderr.contains("does not exist"))
            }
        }

        /// Bad JSON is told with its line and column, a value written as a bare word is told how to quote it, and a
        /// secret given in quotes is kept as given with a warning (issue 52, point 4: "not a JSON object" with no
        /// position for the first, "the value is not JSON: dark" for the second, and the quotes kept silently).
        @Test func badJSONSaysWhereAndValuesAndSecretsSayHowToQuote() async throws {
            try await Daemon.with { daemon in
                try await daemon.expectStorectl(["insert", "todo", #"{"id":"c","#], exits: 65, saying: "line 1, column 11")
                try await daemon.expectStorectl(
                    ["insert", "todo", "{\n\"id\":\"c\",\n\"x\": }"], exits: 65, saying: "line 3, column 6")
                try await daemon.expectStorectl(["insert", "todo", #"["c"]"#], exits: 65, saying: "not a JSON object")
                try await daemon.expectStorectl(["value", "set", "theme", "dark"], exits: 65, saying: #"'"dark"'"#)
                #expect(try await daemon.storectl(["value", "get", "theme"]).status == 66)
                try await daemon.expectStorectl(["secret", "set", "token", #""hunter2""#], exits: 0, saying: "quotes")
                let result = try await daemon.storectl(["secret", "set", "plain", "hunter2"])
                #expect(result.status == 0 && result.stderr.isEmpty, "\(result.stderr)")
                #expect(try await daemon.storectl(["secret", "get", "plain"]).stdout == "hunter2\n")
            }
        }

        /// A store, id or value that begins with `-` before `--` is refused with a pointer to `--` (exit 64), never
        /// taken for a cluster of short options that holds `-h` (which printed the help, exited 0 and did
        /// nothing: issue 52, point 4); after `--` it is what it says.
        @Test func anArgumentThatBeginsWithADashIsRefusedAndPointsToTheSeparator() async throws {
            try await Daemon.with { daemon in
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"-hid"}"#])
                for arguments in [
                    ["insert", "-dash", #"{"id":"1"}"#], ["remove", "notes", "-hid"], ["count", "-chat"],
                    ["value", "set", "n", "-12"],
                ] {
                    let refused = try await daemon.storectl(arguments)
                    #expect(refused.status == 64, "\(arguments): \(refused)")
                    #expect(refused.stderr.contains("goes after '--'"), "\(arguments): \(refused.stderr)")
                    // The example it gives puts `--` right after the command's name.
                    let command = arguments.prefix { ["insert", "remove", "count", "value", "set"].contains($0) }
                    #expect(refused.stderr.contains((["storectl"] + command + ["--"]).joined(separator: " ")), "\(refused.stderr)")
                    #expect(!refused.stdout.contains("OVERVIEW"), "\(arguments): help printed")
                }
                #expect(try await daemon.storectl(["count", "--", "-dash"]).stdout == "0\n")
                #expect(try await daemon.storectl(["count", "notes"]).stdout == "1\n")
                // After the separator: the store and the id are what they say.
                #expect(try await daemon.storectl(["insert", "--", "-dash", #"{"id":"1"}"#]).stdout == "1\n")
                #expect(try await daemon.storectl(["remove", "notes", "--", "-hid"]).stdout == "2\n")
                #expect(try await daemon.storectl(["value", "set", "--", "n", "-12"]).stdout == "1\n")
                #expect(try await daemon.storectl(["value", "get", "n"]).stdout == "-12\n")
                // -h alone is still the help; an option's negative value is still its value.
                let help = try await daemon.storectl(["count", "-h"])
                #expect(help.status == 0 && help.stdout.contains("OVERVIEW"))
                #expect(try await daemon.storectl(["query", "notes", "--limit", "-1"]).status == 64)
            }
        }

        @Test func metaCarriesIdsAndTimestamps() async throws {
            try await Daemon.with { daemon in
                _ = try await daemon.storectl(["insert", "s", #"{"id":"a","v":1}"#])
                let before = try await daemon.storectl(["query", "s", "--meta"])
                _ = try await daemon.storectl(["insert", "s", #"{"id":"a","v":2}"#, #"{"id":"b"}"#])
                let after = try await daemon.storectl(["query", "s", "--meta"])
                let first = try JSONSerialization.jsonObject(with: Data(before.lines[0].utf8)) as! [String: Any]
                let objects = after.lines.map { try! JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any] }
                #expect(objects.map { $0["id"] as? String } == ["a", "b"])
                #expect(objects[0]["createdAt"] as? Int == first["createdAt"] as? Int)
                #expect((objects[0]["updatedAt"] as! Int) >= (first["updatedAt"] as! Int))
                #expect((objects[0]["item"] as? [String: Any])?["v"] as? Int == 2)
                let now = Int(Date().timeIntervalSince1970 * 1000)
                #expect(abs((objects[1]["createdAt"] as! Int) - now) < 60_000)
            }
        }

        @Test func applyIsOneAtomicChain() async throws {
            try await Daemon.with { daemon in
                _ = try await daemon.storectl(["insert", "s", #"{"id":"x"}"#, #"{"id":"y"}"#])
                let operations = """
                    {"op":"removeAll"}
                    {"op":"insert","item":{"id":"a", "n": 1}}
                    {"op":"insert","item":{"id":"b"}}
                    {"op":"remove","id":"a"}
                    {"op":"insert","item":{"id":"a","n":2}}

                    """
                let watcher = try await daemon.watch("s")
                let result = try await daemon.storectl(["apply", "s"], stdin: operations)
                #expect(result.status == 0)
                #expect(result.stdout == "2\n")
                #expect(try await daemon.storectl(["query", "s"]).stdout == "{\"id\":\"b\"}\n{\"id\":\"a\",\"n\":2}\n")
                #expect(await watcher.waitFor(sequence: 2))
                await watcher.stop()
                let epoch = try #require(watcher.objects.first?["epoch"] as? Int)
                #expect(
                    Array(watcher.lines.dropFirst()) == [
                        #"{"op":"remove","store":"s","epoch":\#(epoch),"sequence":2,"step":1,"steps":4,"ids":["x","y"]}"#,
                        #"{"op":"insert","store":"s","epoch":\#(epoch),"sequence":2,"step":2,"steps":4,"ids":["a","b"],"items":[{"id":"a", "n": 1},{"id":"b"}]}"#,
                        #"{"op":"remove","store":"s","epoch":\#(epoch),"sequence":2,"step":3,"steps":4,"ids":["a"]}"#,
                        #"{"op":"insert","store":"s","epoch":\#(epoch),"sequence":2,"step":4,"steps":4,"ids":["a"],"items":[{"id":"a","n":2}]}"#,
                    ])
            }
        }

        @Test func badInputGetsExitCode65AndChangesNothing() async throws {
            try await Daemon.with { daemon in
                _ = try await daemon.storectl(["insert", "s", #"{"id":"keep"}"#])
                let cases: [([String], String?)] = [
                    (["insert", "s", #"{"id":true}"#], nil),
                    (["insert", "s", #"{"name":"no id"}"#], nil),
                    (["insert", "s", "not json"], nil),
                    (["insert", "s"], "{\"id\":\"ok\"}\n{\"id\":[1]}\n"),
                    (["insert", "bad/name", #"{"id":"1"}"#], nil),
                    (["insert", "..", #"{"id":"1"}"#], nil),
                    (["insert", String(repeating: "n", count: 129), #"{"id":"1"}"#], nil),
                    (["insert", "s", #"{"id":""}"#], nil),
                    (["insert", "s", "{\"id\":\"a\\u0000b\"}"], nil),
                    (["insert", "s", "{\"id\":\"\(String(repeating: "i", count: 1025))\"}"], nil),
                    (["apply", "s"], "{\"op\":\"insert\",\"item\":{\"id\":\"fine\"}}\n{\"op\":\"remove\",\"id\":\"\"}\n"),
                    (["apply", "s"], "{\"op\":\"explode\"}\n"),
                ]
                for (arguments, stdin) in cases {
                    let result = try await daemon.storectl(arguments, stdin: stdin)
                    #expect(result.status == 65, "\(arguments): \(result.stderr)")
                    #expect(result.stderr.hasPrefix("storectl: "), "\(arguments)")
                }
                #expect(try await daemon.storectl(["query", "s"]).stdout == "{\"id\":\"keep\"}\n")
                #expect(try await daemon.storectl(["stores", "--format", "json"]).stdout.contains("\"sequence\":1,"))
            }
        }

        @Test func sizeLimitsFromFlagsAndTheDebugRequestLog() async throws {
            try await Daemon.with(arguments: ["--max-item", "100", "--max-batch", "2", "--log-level", "debug"]) { daemon in
                var result = try await daemon.storectl(["insert", "s", "{\"id\":\"big\",\"x\":\"\(String(repeating: "x", count: 100))\"}"])
                #expect(result.status == 65 && result.stderr.contains("itemTooLarge"), "\(result.stderr)")
                result = try await daemon.storectl(["apply", "s"], stdin: "{\"op\":\"removeAll\"}\n{\"op\":\"remove\",\"id\":\"a\"}\n")
                #expect(result.status == 65 && result.stderr.contains("batchTooLarge"), "\(result.stderr)")
                // storectl splits what does not fit in one request: three items are two commits.
                #expect(try await daemon.storectl(["insert", "s"], stdin: "{\"id\":\"1\"}\n{\"id\":\"2\"}\n{\"id\":\"3\"}\n").stdout == "2\n")
                #expect(try await daemon.storectl(["count", "s"]).stdout == "3\n")
                #expect(daemon.log.contains("request=insert"))
                #expect(daemon.log.contains("error.code=itemTooLarge"))
                #expect(!daemon.log.contains("xxxxxxxx"))  // never a payload
            }
        }

        @Test func conditionalWritesConflictWithExitCode75() async throws {
            try await Daemon.with { daemon in
                #expect(try await daemon.storectl(["insert", "s", "--expect", "0", #"{"id":"a"}"#]).stdout == "1\n")
                var result = try await daemon.storectl(["insert", "s", "--expect", "0", #"{"id":"b"}"#])
                #expect(result.status == 75)
                #expect(result.stderr.contains("conflict"))
                result = try await daemon.storectl(["apply", "s", "--expect", "7"], stdin: "{\"op\":\"removeAll\"}\n")
                #expect(result.status == 75)
                #expect(try await daemon.storectl(["insert", "s", "--expect", "1", #"{"id":"b"}"#]).stdout == "2\n")
                #expect(try await daemon.storectl(["query", "s"]).stdout == "{\"id\":\"a\"}\n{\"id\":\"b\"}\n")
            }
        }

        @Test func enginesListsEveryEngineFileAndPingAnswers() async throws {
            try await Daemon.with { daemon in
                #expect(try await daemon.storectl(["ping"]).stdout == "pong\n")
                let engines = try await daemon.storectl(["engines", "--format", "ndjson"])
                #expect(engines.status == 0)
                let objects = engines.lines.map { try! JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any] }
                let byName = Dictionary(objects.map { ($0["name"] as! String, $0) }, uniquingKeysWith: { a, _ in a })
                #expect(byName["sqlite"]?["status"] as? String == "loaded")
                #expect(byName["memory"]?["status"] as? String == "found")
                #expect(byName["memory"]?["abi"] is NSNull)
                #expect(byName["sqlite"]?["abi"] as? String == "2.2")
                #expect(byName["sqlite"]?["capabilities"] as? [String] == ["persistent", "atomic"])
            }
        }

        @Test func aTerminalGetsTables() async throws {
            guard FileManager.default.isExecutableFile(atPath: "/usr/bin/script") else { return }
            try await Daemon.with { daemon in
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"1","text":"milk"}"#, #"{"id":"22","text":"eggs"}"#])
                // `script` runs storectl on a pseudo-terminal: the default format becomes the table.
                func onTerminal(_ arguments: String) async throws -> String {
                    let child = try ChildProcess(
                        ["/usr/bin/script", "-qec", "\(binDirectory)/storectl --socket \(daemon.socketPath) \(arguments)", "/dev/null"],
                        stdoutPath: daemon.directory + "/tty.out", stderrPath: daemon.directory + "/tty.err", in: daemon.directory)
                    #expect(await child.wait(atMost: 60) == 0, "\(child.stderr)")
                    return child.stdout.replacingOccurrences(of: "\r", with: "")
                }
                let query = try await onTerminal("query notes").split(separator: "\n").map(String.init)
                #expect(query.first?.hasPrefix("ID  UPDATED") == true, "\(query)")
                #expect(query.count == 3 && query[1].hasPrefix("1   ") && query[1].hasSuffix(#"{"id":"1","text":"milk"}"#))
                let stores = try await onTerminal("stores")
                #expect(stores.hasPrefix("NAME   COUNT  SEQUENCE  ENGINE  STATUS\nnotes  2      1         sqlite  ok"), "\(stores)")
            }
        }

        @Test func cannotConnectIsExitCode69() async throws {
            try await withTemporaryDirectory { directory in
                let result = try await runStorectl(["--socket", directory + "/none.sock", "count", "s"], in: directory)
                #expect(result.status == 69)
                #expect(result.stderr.contains("cannot connect"))
                let usage = try await runStorectl(["count"], in: directory)
                #expect(usage.status == 64)
            }
        }
    }
}
