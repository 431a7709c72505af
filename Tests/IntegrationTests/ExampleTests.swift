import Foundation
import TestSupport
import Testing

/// Runs a script of examples/ with the binaries of this build.
private func runExample(_ script: String, in directory: String) async throws -> ProcessResult {
    var environment = ProcessInfo.processInfo.environment
    environment["STOREBROKER_BIN"] = binDirectory
    let child = try ChildProcess(
        ["/bin/bash", repositoryRoot + "/examples/" + script], stdoutPath: directory + "/out",
        stderrPath: directory + "/err", in: directory, environment: environment)
    let status = await child.wait(atMost: 120)
    return ProcessResult(status: status, stdout: child.stdout, stderr: child.stderr)
}

extension Integration {
    /// Every example runs, with one command, and does what its README says.
    @Suite struct Examples {
        @Test func theStorectlWalkthrough() async throws {
            try await withTemporaryDirectory { directory in
                let result = try await runExample("storectl-walkthrough.sh", in: directory)
                #expect(result.status == 0, "\(result.stderr)")
                #expect(result.stdout.contains(#""sequence":3,"step":2,"steps":2,"ids":["3"],"items":[{"id":"3","text":"water plants"}]}"#))
                #expect(result.stdout.contains("hunter2"))
                // After the restart, the same items and the value.
                let tail = result.stdout.components(separatedBy: "restart").last ?? ""
                #expect(tail.contains(#""item":{"id":"1","text":"buy oat milk"}"#))
                #expect(tail.contains(#"{"dark":true}"#))
            }
        }

        @Test func theTwoProcessNotesDemo() async throws {
            try await withTemporaryDirectory { directory in
                let result = try await runExample("notes-demo.sh", in: directory)
                #expect(result.status == 0, "\(result.stderr)")
                #expect(result.stdout.contains("wrote: note 1 | note 4 | note 5 | added with a chain"))
                // The watcher, another process, saw every step and ends with the same items.
                let watcher = result.stdout.components(separatedBy: "== watcher").last ?? ""
                #expect(watcher.contains("insert 1=note 1 (done)"))
                #expect(watcher.contains("remove 3\ninsert 6=added with a chain"))
                #expect(watcher.contains("now: note 1 | note 4 | note 5 | added with a chain"))
            }
        }

        /// Every Swift snippet of docs/FROM-BOUTIQUE.md is the region of examples/from-boutique/FromBoutique.swift
        /// of its name (`// snippet: NAME` to `// end: NAME`), indented alike: the package compiles what the page shows.
        @Test func fromBoutiqueShowsCompiledSnippets() throws {
            let page = try String(contentsOfFile: repositoryRoot + "/docs/FROM-BOUTIQUE.md", encoding: .utf8)
            let source = try String(
                contentsOfFile: repositoryRoot + "/examples/from-boutique/FromBoutique.swift", encoding: .utf8)
            func dedented(_ lines: [Substring]) -> String {
                let indent = lines.filter { !$0.allSatisfy(\.isWhitespace) }.map { $0.prefix { $0 == " " }.count }.min() ?? 0
                return lines.map { $0.count >= indent ? String($0.dropFirst(indent)) : "" }.joined(separator: "\n")
            }
            let marked = page.components(separatedBy: "<!-- snippet: ").dropFirst()
            #expect(marked.count == 7, "the page's snippets: \(marked.count)")
            for block in marked {
                let name = String(block.prefix { $0 != " " })
                let shown = block.components(separatedBy: "```swift\n").dropFirst().first?.components(separatedBy: "\n```").first
                let lines = source.split(separator: "\n", omittingEmptySubsequences: false)
                guard let start = lines.firstIndex(where: { $0.hasSuffix("// snippet: \(name)") }),
                    let end = lines.firstIndex(where: { $0.hasSuffix("// end: \(name)") })
                else {
                    Issue.record("FromBoutique.swift has no snippet \(name)")
                    continue
                }
                #expect(shown == dedented(Array(lines[(start + 1)..<end])), "snippet \(name) differs from FromBoutique.swift")
            }
        }

        /// The README's client snippet is examples/readme-client/main.swift, top-level code: the two are the same
        /// text, and run against a daemon it writes what it says (every `insert`, `remove` and the chain).
        @Test func theReadmeClientSnippetWrites() async throws {
            let readme = try String(contentsOfFile: repositoryRoot + "/README.md", encoding: .utf8)
            let source = try String(contentsOfFile: repositoryRoot + "/examples/readme-client/main.swift", encoding: .utf8)
            let block = readme.components(separatedBy: "<!-- readme-client:begin").last?
                .components(separatedBy: "<!-- readme-client:end -->").first?
                .components(separatedBy: "```swift\n").last?.components(separatedBy: "```").first
            #expect(block == source, "README.md's client snippet differs from examples/readme-client/main.swift")

            try await Daemon.with { daemon in
                var environment = ProcessInfo.processInfo.environment
                environment["STOREBROKER_SOCKET"] = daemon.socketPath
                let child = try ChildProcess(
                    [binDirectory + "/readme-client"], stdoutPath: daemon.directory + "/readme.out",
                    stderrPath: daemon.directory + "/readme.err", in: daemon.directory, environment: environment)
                #expect(await child.wait(atMost: 60) == 0, "\(child.stderr)")
                #expect(child.stdout == """
                    ["milk", "bread"] bread
                    someone wrote in between: read again and retry
                    true s3cr3t

                    """)
                // Four commits: insert, insert, remove, the chain; the conditional insert was refused.
                let export = try await daemon.storectl(["export", "notes"])
                #expect(export.stdout == #"{"id":"1","text":"milk"}"# + "\n" + #"{"id":"4","text":"bread"}"# + "\n")
                let info = try await daemon.connect().storeInfo("notes")
                #expect(info.sequence == 4)
                #expect(try await daemon.storectl(["value", "get", "dark-mode"]).stdout == "true\n")
            }
        }

        @Test func twoProcessesToggling1000TimesEachLoseNoUpdate() async throws {
            try await Daemon.with { daemon in
                let togglers = try (0..<2).map { index in
                    try ChildProcess(
                        [binDirectory + "/notes-demo", "toggle", "--socket", daemon.socketPath, "--count", "1000"],
                        stdoutPath: daemon.directory + "/t\(index).out", stderrPath: daemon.directory + "/t\(index).err",
                        in: daemon.directory)
                }
                for toggler in togglers { #expect(await toggler.wait(atMost: 300) == 0, "\(toggler.stderr)") }
                // 2,000 toggles, each one commit: the value's sequence is 2,000 and the flag is back to false.
                let connection = try await daemon.connect()
                guard case .valueResult(let result) = try await connection.send(.getValue(.init(name: "demo-flag"))) else {
                    Issue.record("no value")
                    return
                }
                #expect(result.sequence == 2000)
                #expect(try await daemon.storectl(["value", "get", "demo-flag"]).stdout == "false\n")
            }
        }
    }

    /// import and export, and the shell completions.
    @Suite struct Transfer {
        @Test func importExportRoundTripOf100000Items() async throws {
            try await Daemon.with { daemon in
                let lines = (0..<100_000).map { "{\"id\":\"item-\($0)\",\"n\":\($0),\"text\":\"payload \($0)\"}" }
                let file = daemon.directory + "/in.ndjson"
                try (lines.joined(separator: "\n") + "\n").write(toFile: file, atomically: false, encoding: .utf8)
                let imported = try await daemon.storectl(["import", "big", file])
                #expect(imported.status == 0, "\(imported.stderr)")
                #expect(imported.stdout == "10\n")  // 10 batches of the default --max-batch (10,000)
                #expect(try await daemon.storectl(["count", "big"]).stdout == "100000\n")
                let exported = try await daemon.storectl(["export", "big"])
                #expect(exported.status == 0)
                #expect(exported.stdout == lines.joined(separator: "\n") + "\n")
                // Into another store atomically: too large for one request, refused, nothing written.
                let atomic = try await daemon.storectl(["import", "copy", file, "--atomic"])
                #expect(atomic.status == 65, "\(atomic.stderr)")
                #expect(try await daemon.storectl(["count", "copy"]).stdout == "0\n")
                let small = daemon.directory + "/small.ndjson"
                try (lines.prefix(500).joined(separator: "\n") + "\n").write(toFile: small, atomically: false, encoding: .utf8)
                #expect(try await daemon.storectl(["import", "copy", small, "--atomic"]).stdout == "1\n")
                #expect(try await daemon.storectl(["export", "copy"]).lines == Array(lines.prefix(500)))
            }
        }

        @Test func shellCompletionScripts() async throws {
            try await withTemporaryDirectory { directory in
                for shell in ["bash", "zsh", "fish"] {
                    let result = try await runStorectl(["--generate-completion-script", shell], in: directory)
                    #expect(result.status == 0)
                    for command in ["insert", "query", "watch", "secret", "import"] {
                        #expect(result.stdout.contains(command), "\(shell) completion lacks \(command)")
                    }
                }
            }
        }
    }
}
