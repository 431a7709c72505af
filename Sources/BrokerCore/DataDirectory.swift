#if canImport(Glibc)
import Glibc
#endif
import StoreModel

/// Where the broker keeps its stores and values (docs/DAEMON.md):
///
///     DATA/stores/NAME/manifest       a store's engine and epoch ("key=value" lines)
///     DATA/stores/NAME/data/          the engine's own files for this store
///     DATA/values/{manifest,data/}    every value, in one engine store
///     DATA/secure-values/...          every secure value, encrypted, in one engine store
///     DATA/staging/                   places being created or deleted (the daemon's own names)
///
/// A place (a store's directory, or a value namespace's) is created by writing its manifest in a directory
/// under `staging` and renaming it into place, so a place always has a manifest; it is dropped by renaming it
/// into `staging` before deleting it. `stores` holds users' names only: any valid name, `.new-x` included.
struct DataDirectory: Sendable {
    let root: String

    /// A directory holding a manifest and an engine's files.
    struct Place: Sendable {
        /// The directory it lives in.
        var parent: String
        var name: String

        var path: String { parent + "/" + name }
        var engineDirectory: String { path + "/data" }
        var manifestPath: String { path + "/manifest" }
    }

    var storesDirectory: String { root + "/stores" }
    var stagingDirectory: String { root + "/staging" }

    func store(_ name: String) -> Place { Place(parent: storesDirectory, name: name) }

    func values(_ namespace: Namespace) -> Place {
        Place(parent: root, name: namespace == .secureValue ? "secure-values" : "values")
    }

    /// Creates the root, the stores and staging directories (mode 0700) if missing, moving a data directory
    /// of the first layout over (see `migrateFirstLayout`). Returns what the move did, for the log.
    func prepare() throws(BrokerError) -> [String] {
        try FileOps.makeDirectory(root, recursive: true)
        try FileOps.makeDirectory(storesDirectory, recursive: false)
        var staging = stat()
        if stat(stagingDirectory, &staging) == 0 { return [] }
        let notes = try migrateFirstLayout()
        try FileOps.makeDirectory(stagingDirectory, recursive: false)
        try FileOps.syncDirectory(root)
        return notes
    }

    /// The first layout (no `staging` directory) staged creates and drops as `.new-NAME-N` and
    /// `.dropped-NAME-N` inside `stores`, beside users' stores of the same shape, and deleted them all at
    /// start-up. What such an entry holds decides what it is, so that nothing of a user's is lost:
    /// - `stores/.new-*` with no engine files: a create interrupted before the store's first open: deleted;
    /// - any other `stores/.new-*` or `stores/.dropped-*`: a user's store (or, rarely, a drop interrupted by a
    ///   crash): kept as the store of that name, with a note (drop it if it is the remains of a drop);
    /// - `.new-*` and `.dropped-*` beside `values` (names no user can give): deleted.
    private func migrateFirstLayout() throws(BrokerError) -> [String] {
        var notes: [String] = []
        for entry in try FileOps.list(root) where entry.hasPrefix(".new-") || entry.hasPrefix(".dropped-") {
            try FileOps.removeTree(root + "/" + entry)
        }
        for entry in try FileOps.list(storesDirectory) where entry.hasPrefix(".new-") || entry.hasPrefix(".dropped-") {
            let place = store(entry)
            if entry.hasPrefix(".new-"), (try? FileOps.list(place.engineDirectory))?.isEmpty ?? true {
                try FileOps.removeTree(place.path)
            } else {
                notes.append(
                    "kept \(place.path) as the store \(entry) (a data directory of the first layout cannot tell a "
                        + "store of that name from an interrupted create or drop; drop it if it is not wanted)")
            }
        }
        return notes
    }

    /// The names of the stores with a directory, in byte order.
    func storeNames() throws(BrokerError) -> [String] {
        try FileOps.list(storesDirectory).filter { Naming.problem(withName: $0) == nil }
            .sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
    }

    /// The manifest of `place`, or `nil` when it has no directory.
    func manifest(_ place: Place) throws(BrokerError) -> Manifest? {
        guard let text = try FileOps.readSmallFile(place.manifestPath) else { return nil }
        guard let manifest = Manifest(text: text) else {
            throw BrokerError(.engineError, "the manifest \(place.manifestPath) cannot be read")
        }
        return manifest
    }

    /// Creates `place` with its manifest, atomically.
    func create(_ place: Place, manifest: Manifest) throws(BrokerError) {
        let staging = stagingDirectory + "/new-\(UInt64.random(in: 0...UInt64.max))"
        try FileOps.makeDirectory(staging, recursive: false)
        try FileOps.makeDirectory(staging + "/data", recursive: false)
        try FileOps.writeDurably(staging + "/manifest", manifest.text)
        try FileOps.rename(staging, place.path)
        try FileOps.syncDirectory(place.parent)
    }

    /// Replaces `place`'s manifest atomically (a new file renamed over the old one).
    func rewrite(_ place: Place, manifest: Manifest) throws(BrokerError) {
        let temporary = place.path + "/manifest.new"
        try FileOps.writeDurably(temporary, manifest.text)
        try FileOps.rename(temporary, place.manifestPath)
        try FileOps.syncDirectory(place.path)
    }

    /// Deletes `place`: renamed away first, so a crash never leaves half of it.
    func remove(_ place: Place) throws(BrokerError) {
        let doomed = stagingDirectory + "/dropped-\(UInt64.random(in: 0...UInt64.max))"
        try FileOps.rename(place.path, doomed)
        try FileOps.syncDirectory(place.parent)
        try FileOps.removeTree(doomed)
    }

    /// Deletes leftovers of interrupted creates and drops: everything in `staging`.
    func removeLeftovers() throws(BrokerError) {
        for entry in try FileOps.list(stagingDirectory) {
            try FileOps.removeTree(stagingDirectory + "/" + entry)
        }
    }
}

/// What a store remembers about itself: the engine it was created with, its epoch, and whether it has
/// committed (so that an engine that comes back empty is known to have lost its files).
struct Manifest: Hashable, Sendable {
    static let format = 1
    var engine: String
    var epoch: UInt64
    /// The engine has acknowledged a commit. Written after the first one; a manifest written before this field
    /// existed gets it at the next load that finds commits.
    var committed: Bool

    var text: String {
        "format=\(Self.format)\nengine=\(engine)\nepoch=\(epoch)\n" + (committed ? "committed=1\n" : "")
    }

    init(engine: String, epoch: UInt64, committed: Bool = false) {
        self.engine = engine
        self.epoch = epoch
        self.committed = committed
    }

    init?(text: String) {
        var fields: [String: String] = [:]
        for line in text.split(separator: "\n") {
            guard let equals = line.firstIndex(of: "=") else { return nil }
            fields[String(line[..<equals])] = String(line[line.index(after: equals)...])
        }
        guard fields["format"] == String(Self.format), let engine = fields["engine"], !engine.isEmpty,
            let epoch = fields["epoch"].flatMap(UInt64.init), epoch != 0
        else { return nil }
        self.init(engine: engine, epoch: epoch, committed: fields["committed"] == "1")
    }

    /// A new store's epoch: random, non-zero, and exact in a JSON number (at most 2^53).
    static func newEpoch() -> UInt64 { UInt64.random(in: 1...(1 << 53)) }
}

/// Small POSIX file helpers; every failure becomes an `engineError` naming the path and errno.
public enum FileOps {
    static func failure(
        _ what: String, _ path: String, _ code: Int32 = errno, fileID: StaticString = #fileID, line: UInt = #line
    ) -> BrokerError {
        let cause = SystemError(code: code)
        return BrokerError(
            code == ENOSPC || code == EDQUOT ? .storageFull : .engineError, "\(what) \(path): \(cause)",
            underlying: cause, fileID: fileID, line: line)
    }

    /// Creates `path` (mode 0700), and its missing parents when `recursive`; returns the directories it created,
    /// outermost first.
    @discardableResult
    public static func makeDirectory(_ path: String, recursive: Bool) throws(BrokerError) -> [String] {
        var info = stat()
        if stat(path, &info) == 0 { return [] }
        var created: [String] = []
        if recursive, let slash = path.lastIndex(of: "/"), slash != path.startIndex {
            created = try makeDirectory(String(path[..<slash]), recursive: true)
        }
        if mkdir(path, 0o700) != 0, errno != EEXIST { throw failure("cannot create directory", path) }
        return created + [path]
    }

    /// The names in a directory, "." and ".." left out.
    public static func list(_ path: String) throws(BrokerError) -> [String] {
        guard let dir = opendir(path) else { throw failure("cannot list", path) }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            // Only as many bytes as the record holds: `entry.pointee.d_name` would copy all 256, past the end of
            // the last record in readdir's buffer (AddressSanitizer's heap-buffer-overflow in the full suite).
            let name = String(cString: (UnsafeRawPointer(entry) + MemoryLayout<dirent>.offset(of: \dirent.d_name)!)
                .assumingMemoryBound(to: CChar.self))
            if name != ".", name != ".." { names.append(name) }
        }
        return names
    }

    /// The file's text, or `nil` when it does not exist.
    static func readSmallFile(_ path: String) throws(BrokerError) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        if fd < 0 {
            if errno == ENOENT { return nil }
            throw failure("cannot open", path)
        }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = read(fd, &chunk, chunk.count)
            if count < 0 {
                if errno == EINTR { continue }
                throw failure("cannot read", path)
            }
            if count == 0 { break }
            bytes += chunk[..<count]
            if bytes.count > 1 << 20 { throw BrokerError(.engineError, "\(path) is too large to be a manifest") }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Writes `text` to a new file and syncs it.
    static func writeDurably(_ path: String, _ text: String) throws(BrokerError) {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw failure("cannot create", path) }
        defer { close(fd) }
        var bytes = Array(text.utf8)[...]
        while !bytes.isEmpty {
            let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            if written < 0 {
                if errno == EINTR { continue }
                throw failure("cannot write", path)
            }
            bytes = bytes.dropFirst(written)
        }
        guard fsync(fd) == 0 else { throw failure("cannot sync", path) }
    }

    static func rename(_ from: String, _ to: String) throws(BrokerError) {
        guard Glibc.rename(from, to) == 0 else { throw failure("cannot rename \(from) to", to) }
    }

    static func syncDirectory(_ path: String) throws(BrokerError) {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw failure("cannot open", path) }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw failure("cannot sync", path) }
    }

    /// Deletes `path` and everything under it; symbolic links are removed, never followed.
    static func removeTree(_ path: String) throws(BrokerError) {
        var info = stat()
        guard lstat(path, &info) == 0 else {
            if errno == ENOENT { return }
            throw failure("cannot inspect", path)
        }
        if info.st_mode & S_IFMT == S_IFDIR {
            for entry in try list(path) { try removeTree(path + "/" + entry) }
            guard rmdir(path) == 0 else { throw failure("cannot remove", path) }
        } else {
            guard unlink(path) == 0 else { throw failure("cannot remove", path) }
        }
    }
}
