import Foundation
import TestSupport

/// A simulated power cut (the `power-loss` property): the child of a crash round runs with
/// `libstorebroker-powercut.so` preloaded (Sources/CPowerCut), which records in a shadow directory what each
/// successful `fsync`, `fdatasync`, `syncfs` or `sync` made durable: a file's bytes, a directory's entries, each
/// file and directory known by an id the library gives it when it is created (inode numbers are reused). After
/// the kill, `cut` replaces the store's directory with what a power cut would have left: only the entries its
/// directory syncs recorded, each file with its last synced bytes (`torn == false`) or, as a disk may write part
/// of what was never synced, with each 512-byte sector taken at random from the synced bytes or the written
/// ones and the length from either (`torn == true`). A file whose name was synced but never its bytes is empty.
struct PowerCut {
    static let libraryName = "libstorebroker-powercut.so"

    /// The library, beside the checker's executable.
    let library: String
    /// Where the library keeps its records.
    let shadow: String
    let torn: Bool

    init(checker: String, shadow: String, torn: Bool) throws {
        library = URL(fileURLWithPath: checker).deletingLastPathComponent().path + "/" + Self.libraryName
        guard FileManager.default.fileExists(atPath: library) else {
            throw Violation(message: "cannot simulate a power cut: \(library) is missing (swift build builds it beside the checker)")
        }
        self.shadow = shadow
        self.torn = torn
    }

    /// The child's environment: the library preloaded, recording `directory` (empty now, so recorded as empty).
    func environment(recording directory: String) throws -> [String: String] {
        let root = URL(fileURLWithPath: directory).resolvingSymlinksInPath().path
        try FileManager.default.createDirectory(atPath: shadow, withIntermediateDirectories: true)
        guard try FileManager.default.contentsOfDirectory(atPath: root).isEmpty else {
            throw Violation(message: "a power-cut round needs an empty store directory: \(root)")
        }
        try Data().write(to: URL(fileURLWithPath: shadow + "/names-" + id(ofInode: try Self.inode(root))))
        return ProcessInfo.processInfo.environment.merging([
            "LD_PRELOAD": library, "SB_POWERCUT_ROOT": root, "SB_POWERCUT_SHADOW": shadow,
        ]) { $1 }
    }

    /// Replaces `directory`'s tree with what the power cut leaves.
    func cut(_ directory: String) throws {
        var written: [String: String] = [:]
        try files(under: directory, into: &written)
        let after = directory + ".after-cut"
        try build(directory: id(ofInode: try Self.inode(directory)), at: after, written: written)
        try FileManager.default.removeItem(atPath: directory)
        try FileManager.default.moveItem(atPath: after, toPath: directory)
    }

    /// The id the library gave the file or directory with this inode (Sources/CPowerCut/powercut.c).
    private func id(ofInode inode: UInt64) -> String {
        (try? String(contentsOfFile: shadow + "/id-\(inode)", encoding: .utf8)) ?? "i\(inode)"
    }

    private func build(directory: String, at path: String, written: [String: String]) throws {
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
        let names = (try? String(contentsOfFile: shadow + "/names-" + directory, encoding: .utf8)) ?? ""
        for line in names.split(separator: "\n") {
            let fields = line.split(separator: " ", maxSplits: 2)
            guard fields.count == 3 else { throw Violation(message: "a bad shadow record: \(line)") }
            let (id, target) = (String(fields[1]), path + "/" + fields[2])
            if fields[0] == "d" {
                try build(directory: id, at: target, written: written)
                continue
            }
            let synced = (try? Data(contentsOf: URL(fileURLWithPath: shadow + "/content-" + id))) ?? Data()
            let current = written[id].flatMap { try? Data(contentsOf: URL(fileURLWithPath: $0)) } ?? synced
            try (torn ? Self.tear(synced, current) : synced).write(to: URL(fileURLWithPath: target))
        }
    }

    /// The synced bytes with a random part of the written ones over them, sector by sector.
    static func tear(_ synced: Data, _ written: Data) -> Data {
        let length = Bool.random() ? synced.count : written.count
        var out = Data(count: length)
        for start in stride(from: 0, to: length, by: 512) {
            let source = Bool.random() ? synced : written
            for index in start..<min(start + 512, length) where index < source.count {
                out[index] = source[source.startIndex + index]
            }
        }
        return out
    }

    private static func inode(_ path: String) throws -> UInt64 {
        var info = stat()
        guard stat(path, &info) == 0 else { throw Violation(message: "cannot stat \(path)") }
        return UInt64(info.st_ino)
    }

    /// Every regular file under `directory`, by id.
    private func files(under directory: String, into files: inout [String: String]) throws {
        for name in try FileManager.default.contentsOfDirectory(atPath: directory) {
            let path = directory + "/" + name
            var info = stat()
            guard lstat(path, &info) == 0 else { continue }
            if info.st_mode & S_IFMT == S_IFDIR {
                try self.files(under: path, into: &files)
            } else if info.st_mode & S_IFMT == S_IFREG {
                files[id(ofInode: UInt64(info.st_ino))] = path
            }
        }
    }
}
