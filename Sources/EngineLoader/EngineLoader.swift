import BrokerCore
import CStorageEngine
import Synchronization
import Wire

#if canImport(Glibc)
import Glibc
#endif

/// Finds storage engines on a search path and loads them with `dlopen`, once each.
///
/// A library is loaded with `RTLD_NOW | RTLD_LOCAL` (a missing symbol fails at load, and engines cannot see
/// each other's symbols) and never unloaded: unloading code that may have started threads or registered
/// runtime metadata is not safe. Before anything in the library is called, the file must be a regular file
/// owned by this user or root and writable by nobody else; after `storebroker_engine_entry` returns, the
/// table's ABI major, size and members are checked before any of them is called.
public final class EngineLoader: Sendable {
    public let searchPath: EngineSearchPath
    private let loaded = Mutex<[String: LoadedEngine]>([:])

    public init(searchPath: EngineSearchPath) {
        self.searchPath = searchPath
    }

    /// The path of engine `name`: the first match on the search path.
    public func locate(_ name: String) throws(EngineLoadError) -> String {
        if let problem = Naming.problem(withName: name) {
            throw EngineLoadError(.invalidName, path: nil, "engine name \(name.debugDescription): \(problem)")
        }
        let candidates = searchPath.directories.map { $0 + "/" + EngineSearchPath.fileName(for: name) }
        guard let path = candidates.first(where: { access($0, F_OK) == 0 }) else {
            throw EngineLoadError(
                .notFound, path: nil,
                "engine \(name.debugDescription) not found; searched: "
                    + (candidates.isEmpty ? "(no directories)" : candidates.joined(separator: ", ")))
        }
        return path
    }

    /// Loads engine `name` (once; later calls return the same engine).
    public func load(_ name: String) throws(EngineLoadError) -> LoadedEngine {
        let path = try locate(name)
        return try load(path: path, expectedName: name)
    }

    /// Loads the engine library at `path` (absolute).
    public func load(path: String, expectedName: String? = nil) throws(EngineLoadError) -> LoadedEngine {
        if let engine = loaded.withLock({ $0[path] }) { return engine }
        let engine = try Self.open(path: path, expectedName: expectedName)
        return loaded.withLock { cache in
            if let existing = cache[path] { return existing }
            cache[path] = engine
            return engine
        }
    }

    /// Whether the library at `path` is loaded by this loader.
    public func isLoaded(path: String) -> Bool {
        loaded.withLock { $0[path] != nil }
    }

    /// One engine file on the search path and how it stands.
    public struct Listing: Hashable, Sendable {
        public var name: String
        public var path: String
        /// The engine, if it loads.
        public var info: EngineInfo
    }

    /// Every engine file on the search path, in search order, loaded or not. Listing loads each file that is
    /// not loaded yet (that is how its version is known); a file shadowed by an earlier one of the same name is
    /// listed as unusable.
    public func list() -> [Listing] {
        var listings: [Listing] = []
        var firstPath: [String: String] = [:]
        for directory in searchPath.directories {
            for fileName in Self.fileNames(in: directory).sorted() {
                guard let name = EngineSearchPath.engineName(inFileName: fileName) else { continue }
                let path = directory + "/" + fileName
                var info = EngineInfo(
                    name: name, path: path, status: .unusable, abiMajor: 0, abiMinor: 0, capabilities: [], detail: "")
                if let first = firstPath[name] {
                    info.detail = "shadowed by \(first), found earlier on the search path"
                } else {
                    firstPath[name] = path
                    let wasLoaded = isLoaded(path: path)
                    do {
                        let engine = try load(path: path, expectedName: name)
                        info = engine.info
                        info.status = wasLoaded ? .loaded : .available
                    } catch {
                        info.detail = error.message
                    }
                }
                listings.append(Listing(name: name, path: path, info: info))
            }
        }
        return listings
    }

    static func fileNames(in directory: String) -> [String] {
        guard let dir = opendir(directory) else { return [] }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            names.append(name)
        }
        return names
    }

    // MARK: Loading one file

    private static func open(path: String, expectedName: String?) throws(EngineLoadError) -> LoadedEngine {
        guard path.hasPrefix("/") else {
            throw EngineLoadError(.loadFailed, path: path, "engine paths must be absolute")
        }
        try checkFile(path)
        guard let handle = dlopen(path, RTLD_NOW | RTLD_LOCAL) else {
            let reason = dlerror().map { String(cString: $0) } ?? "unknown dlopen error"
            throw EngineLoadError(.loadFailed, path: path, "cannot load: \(reason)")
        }
        // From here the library stays loaded, even on failure: its initializers have run.
        guard let symbol = dlsym(handle, SB_ENGINE_ENTRY_SYMBOL) else {
            throw EngineLoadError(
                .missingSymbol, path: path, "not a storebroker engine: it does not export \(SB_ENGINE_ENTRY_SYMBOL)")
        }
        let entry = unsafeBitCast(symbol, to: storebroker_engine_entry_fn.self)
        guard let table = entry() else {
            throw EngineLoadError(.invalidEngine, path: path, "\(SB_ENGINE_ENTRY_SYMBOL) returned NULL")
        }
        return try LoadedEngine(table: table, path: path, expectedName: expectedName)
    }

    /// A regular ELF file, owned by this user or root, writable by no one else.
    private static func checkFile(_ path: String) throws(EngineLoadError) {
        var info = stat()
        guard stat(path, &info) == 0 else {
            throw EngineLoadError(.loadFailed, path: path, "cannot stat: \(String(cString: strerror(errno)))")
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw EngineLoadError(.notSharedObject, path: path, "not a regular file")
        }
        guard info.st_uid == getuid() || info.st_uid == 0 else {
            throw EngineLoadError(
                .unsafePermissions, path: path,
                "refused: owned by uid \(info.st_uid), not by this user (uid \(getuid())) or root")
        }
        if info.st_mode & S_IWOTH != 0 {
            throw EngineLoadError(.unsafePermissions, path: path, "refused: the file is world-writable")
        }
        if info.st_mode & S_IWGRP != 0, info.st_gid != getgid() || info.st_uid != getuid() {
            throw EngineLoadError(.unsafePermissions, path: path, "refused: the file is writable by another group")
        }
        let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw EngineLoadError(.loadFailed, path: path, "cannot open: \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        var magic = [UInt8](repeating: 0, count: 4)
        guard read(fd, &magic, 4) == 4, magic == [0x7F, 0x45, 0x4C, 0x46] else {
            throw EngineLoadError(.notSharedObject, path: path, "not a shared object (no ELF header)")
        }
    }
}
