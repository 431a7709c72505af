import Foundation
import Testing

extension Integration {
    /// The daemon's own files never share a namespace with users' names (issue "Bounded memory whatever clients
    /// do", items 6 and 7).
    @Suite struct DataDirectoryLayout {
        /// Names that look like the daemon's staging names are stores like any other: listed, and kept across a
        /// restart (before: acknowledged, then deleted at the next start, nothing logged; hidden from `stores`).
        /// The same strings as item ids, in every persistent engine (the disk engine keeps an item as a file of
        /// its own): read back intact.
        @Test(arguments: ["sqlite", "disk", "c-example"])
        func reservedLookingNamesSurviveARestart(engine: String) async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory, arguments: ["--engine", engine])
                try await daemon.start()
                let names = [".new-y", ".dropped-notes-1", ".hidden", "staging", "..x"]
                let items = names.map { #"{"id":"\#($0)","v":"\#($0) kept"}"# }
                for (index, name) in names.enumerated() {
                    #expect(try await daemon.storectl(["insert", name] + items.prefix(index + 1)).status == 0, "\(name)")
                }
                let listed = try await daemon.storectl(["stores", "--format", "ndjson"]).stdout
                for name in names { #expect(listed.contains("\"\(name)\""), "\(name) not listed: \(listed)") }
                await daemon.stop()
                try await daemon.start()
                for (index, name) in names.enumerated() {
                    let stored = try await daemon.storectl(["query", name])
                    #expect(stored.lines == Array(items.prefix(index + 1)), "\(name) (\(engine)): \(stored.stdout)")
                }
                #expect(!daemon.log.contains("warning"), "\(daemon.log)")
                await daemon.stop()
            }
        }

        /// A data directory of the first layout (no `staging`, creates and drops staged inside `stores`) is moved
        /// over at start-up: an interrupted create is deleted, a store named like a staging directory is kept (with
        /// a warning), and stores go on as they were.
        @Test func firstLayoutIsMigrated() async throws {
            try await withTemporaryDirectory { directory in
                let files = FileManager.default
                let daemon = Daemon(in: directory)
                try await daemon.start()
                for name in ["plain", "kept", "old"] {
                    _ = try await daemon.storectl(["insert", name, #"{"id":"a"}"#, #"{"id":"b"}"#])
                }
                await daemon.stop()
                // Make it look like the first layout wrote it.
                let stores = daemon.dataDirectory + "/stores"
                try files.removeItem(atPath: daemon.dataDirectory + "/staging")
                try files.moveItem(atPath: stores + "/kept", toPath: stores + "/.new-kept")
                try files.moveItem(atPath: stores + "/old", toPath: stores + "/.dropped-old-7")
                try files.createDirectory(atPath: stores + "/.new-half-42/data", withIntermediateDirectories: true)
                try "format=1\nengine=sqlite\nepoch=5\n".write(toFile: stores + "/.new-half-42/manifest", atomically: false, encoding: .utf8)
                try files.createDirectory(atPath: daemon.dataDirectory + "/.new-values-9/data", withIntermediateDirectories: true)

                try await daemon.start()
                #expect(try await daemon.storectl(["count", "plain"]).stdout == "2\n")
                #expect(try await daemon.storectl(["count", ".new-kept"]).stdout == "2\n")
                #expect(try await daemon.storectl(["count", ".dropped-old-7"]).stdout == "2\n")
                #expect(!files.fileExists(atPath: stores + "/.new-half-42"))
                #expect(!files.fileExists(atPath: daemon.dataDirectory + "/.new-values-9"))
                #expect(files.fileExists(atPath: daemon.dataDirectory + "/staging"))
                #expect(daemon.log.contains("kept \(stores)/.dropped-old-7 as the store .dropped-old-7"), "\(daemon.log)")
                // The new layout: a drop and a create of staging-like names leave nothing in `stores`.
                _ = try await daemon.storectl(["drop", ".dropped-old-7"])
                _ = try await daemon.storectl(["insert", ".new-z", #"{"id":"a"}"#])
                #expect(try files.contentsOfDirectory(atPath: stores).sorted() == [".new-kept", ".new-z", "plain"])
                await daemon.stop()
                try await daemon.start()
                #expect(!daemon.log.contains("first layout"), "migrated twice: \(daemon.log)")
                #expect(try await daemon.storectl(["count", ".new-z"]).stdout == "1\n")
                await daemon.stop()
            }
        }
    }
}

extension Integration {
    /// A store whose files are lost or damaged is shown broken, never served empty, and can be dropped (issue
    /// "Bounded memory whatever clients do", items 7 and 8).
    @Suite struct BrokenStores {
        /// Lost engine files: before, the store vanished from `stores`, `query` printed nothing with exit 0 and
        /// the next write re-created it at sequence 1 with the old epoch.
        @Test func lostEngineFilesAreABrokenStoreNotAnEmptyOne() async throws {
            try await withTemporaryDirectory { directory in
                let files = FileManager.default
                let daemon = Daemon(in: directory)
                try await daemon.start()
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"1"}"#, #"{"id":"2"}"#])
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"3"}"#])
                let epoch = try #require(try await daemon.storectl(["stores"]).stdout.firstMatch(of: /"epoch":(\d+)/)?.1)
                await daemon.stop()
                let manifest = try String(contentsOfFile: daemon.dataDirectory + "/stores/notes/manifest", encoding: .utf8)
                #expect(manifest.contains("committed=1"), "\(manifest)")
                let data = daemon.dataDirectory + "/stores/notes/data"
                for file in try files.contentsOfDirectory(atPath: data) { try files.removeItem(atPath: data + "/" + file) }
                // A crash between creating a store's directory and its first commit: still "does not exist".
                try files.createDirectory(atPath: daemon.dataDirectory + "/stores/fresh/data", withIntermediateDirectories: true)
                try "format=1\nengine=sqlite\nepoch=77\n".write(
                    toFile: daemon.dataDirectory + "/stores/fresh/manifest", atomically: false, encoding: .utf8)

                try await daemon.start()
                var result = try await daemon.storectl(["stores", "--format", "ndjson"])
                #expect(result.status == 0)
                #expect(result.stdout.contains(#"{"name":"notes","engine":"sqlite","epoch":\#(epoch),"sequence":0,"count":0,"broken":"#), "\(result.stdout)")
                #expect(!result.stdout.contains("fresh"))
                #expect(result.stderr.contains("lost or replaced"), "\(result.stderr)")
                result = try await daemon.storectl(["query", "notes"])
                #expect(result.status == 74)
                #expect(result.stderr.contains("store notes cannot be served"), "\(result.stderr)")
                result = try await daemon.storectl(["insert", "notes", #"{"id":"4"}"#])
                #expect(result.status == 74, "a write re-created it: \(result.stdout)")
                result = try await daemon.storectl(["watch", "notes", "--from", "2", "--epoch", String(epoch)])
                #expect(result.status == 74, "\(result.stdout)")
                #expect(try await daemon.storectl(["count", "fresh"]).stdout == "0\n")

                // The way out: drop it, then it starts afresh with a new epoch.
                result = try await daemon.storectl(["drop", "notes"])
                #expect(result.status == 0, "\(result.stderr)")
                #expect(try await daemon.storectl(["insert", "notes", #"{"id":"9"}"#]).stdout == "1\n")
                result = try await daemon.storectl(["stores", "--format", "ndjson"])
                #expect(!result.stdout.contains("\(epoch)") && !result.stdout.contains("broken"), "\(result.stdout)")
                await daemon.stop()
            }
        }

        /// One store whose engine is missing and one whose files are corrupt do not hide the others from `stores`
        /// (before: `stores` failed with engineUnavailable); a manifest written before `committed` existed is
        /// brought up to date when its store loads.
        @Test func brokenStoresDoNotHideTheOthers() async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory)
                try await daemon.start()
                for name in ["a", "gone-engine", "corrupt", "z"] {
                    _ = try await daemon.storectl(["insert", name, #"{"id":"1"}"#])
                }
                await daemon.stop()
                let stores = daemon.dataDirectory + "/stores"
                try "format=1\nengine=nosuch\nepoch=5\ncommitted=1\n".write(
                    toFile: stores + "/gone-engine/manifest", atomically: false, encoding: .utf8)
                for file in try FileManager.default.contentsOfDirectory(atPath: stores + "/corrupt/data") {
                    try String(repeating: "garbage ", count: 512).write(
                        toFile: stores + "/corrupt/data/" + file, atomically: false, encoding: .utf8)
                }
                // The first layout's manifest: no `committed` line.
                let old = try String(contentsOfFile: stores + "/a/manifest", encoding: .utf8).replacingOccurrences(of: "committed=1\n", with: "")
                try old.write(toFile: stores + "/a/manifest", atomically: false, encoding: .utf8)

                try await daemon.start()
                let result = try await daemon.storectl(["stores", "--format", "ndjson"])
                #expect(result.status == 0, "\(result.stderr)")
                let lines = result.lines
                #expect(lines.count == 4, "\(result.stdout)")
                #expect(lines.first?.hasPrefix(#"{"name":"a","engine":"sqlite""#) == true && lines.first?.contains("broken") == false)
                #expect(lines.contains { $0.hasPrefix(#"{"name":"gone-engine","engine":"nosuch","epoch":5,"sequence":0,"count":0,"broken":"#) })
                #expect(lines.contains { $0.hasPrefix(#"{"name":"corrupt","#) && $0.contains("broken") })
                #expect(lines.last?.hasPrefix(#"{"name":"z","#) == true && lines.last?.contains("broken") == false)
                #expect(try String(contentsOfFile: stores + "/a/manifest", encoding: .utf8).contains("committed=1"))
                #expect(try await daemon.storectl(["drop", "gone-engine"]).status == 0)
                #expect(try await daemon.storectl(["drop", "corrupt"]).status == 0)
                #expect(try await daemon.storectl(["stores", "--format", "ndjson"]).lines.count == 2)
                await daemon.stop()
            }
        }
    }
}
