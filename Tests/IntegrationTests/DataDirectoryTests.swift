import Foundation
import Testing

extension Integration {
    /// The daemon's own files never share a namespace with users' names (issue "Bounded memory whatever clients
    /// do", items 6 and 7).
    @Suite struct DataDirectoryLayout {
        /// Names that look like the daemon's staging names are stores like any other: listed, and kept across a
        /// restart (before: acknowledged, then deleted at the next start, nothing logged; hidden from `stores`).
        @Test func reservedLookingNamesSurviveARestart() async throws {
            try await withTemporaryDirectory { directory in
                let daemon = Daemon(in: directory)
                try await daemon.start()
                let names = [".new-y", ".dropped-notes-1", ".hidden", "staging", "..x"]
                for (index, name) in names.enumerated() {
                    let items = (0...index).map { #"{"id":"\#($0)"}"# }
                    #expect(try await daemon.storectl(["insert", name] + items).status == 0, "\(name)")
                }
                let listed = try await daemon.storectl(["stores", "--format", "ndjson"]).stdout
                for name in names { #expect(listed.contains("\"\(name)\""), "\(name) not listed: \(listed)") }
                await daemon.stop()
                try await daemon.start()
                for (index, name) in names.enumerated() {
                    #expect(try await daemon.storectl(["count", name]).stdout == "\(index + 1)\n", "\(name)")
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
