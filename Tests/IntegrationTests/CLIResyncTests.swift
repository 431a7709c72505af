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
