import BrokerCore
import CStorageEngine
import Locking
import StoreModel

#if canImport(Glibc)
import Glibc
#endif

/// Finds storage engines on a search path and loads them with `dlopen`, once each.
///
/// A library is loaded with `RTLD_NOW | RTLD_LOCAL` (a missing symbol fails at load, and engines cannot see
/// each other's symbols) and never unloaded: unloading code that may have started threads or registered
/// runtime metadata is not safe. Before anything in the library runs, the file is opened once, walking its
/// real path one directory at a time without following links, and that descriptor is checked and loaded
/// (`dlopen("/proc/self/fd/N")`), so the file checked is the file loaded. It must be a regular ELF file owned
/// by this user or root and writable by nobody else, and every directory above it (as named on the search
/// path and as it really is) must be owned by this user or root and not writable by others, unless it has the
/// sticky bit (like `/tmp`). After `storebroker_engine_entry` returns, the table's ABI major, size and members
/// are checked before any of them is called. Loads are serialized: a file is loaded at most once.
public final class EngineLoader: Sendable {
    public let searchPath: EngineSearchPath
    private let state = Locked<State>(State())

    private struct State {
        var loaded: [String: LoadedEngine] = [:]
        /// Why a file could not be loaded, for listings (which never load anything).
        var refused: [String: String] = [:]
    }

    public init(searchPath: EngineSearchPath) {
        self.searchPath = searchPath
    }

    /// The path of engine `name`: the first match on the search path.
    public func locate(_ name: String) throws(EngineLoadError) -> String {
        if let problem = Naming.problem(withEngineName: name) {
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

    /// Loads the engine library at `path` (absolute). Under the loader's lock: two callers never load the same
    /// file twice, nor two files at once.
    public func load(path: String, expectedName: String? = nil) throws(EngineLoadError) -> LoadedEngine {
        try state.withLock { state throws(EngineLoadError) -> LoadedEngine in
            if let engine = state.loaded[path] { return engine }
            do throws(EngineLoadError) {
                let engine = try Self.open(path: path, expectedName: expectedName)
                state.loaded[path] = engine
                state.refused[path] = nil
                return engine
            } catch {
                state.refused[path] = error.message
                throw error
            }
        }
    }

    /// Whether the library at `path` is loaded by this loader.
    public func isLoaded(path: String) -> Bool {
        state.withLock { $0.loaded[path] != nil }
    }

    /// One engine file on the search path and how it stands.
    public struct Listing: Hashable, Sendable {
        public var name: String
        public var path: String
        /// The engine, if it loads.
        public var info: EngineInfo
    }

    /// Every engine file on the search path, in search order, loaded or not, **without loading any**: a loaded
    /// file is `loaded` (with its version and ABI); one that a load refused, or that fails the checks made
    /// before loading (ownership, permissions, directories, ELF header), is `refused` with the reason; any
    /// other is `found`. A file shadowed by an earlier one of the same name is refused as shadowed.
    public func list() -> [Listing] {
        var listings: [Listing] = []
        var firstPath: [String: String] = [:]
        for directory in searchPath.directories {
            for fileName in ((try? FileOps.list(directory)) ?? []).sorted() {
                guard let name = EngineSearchPath.engineName(inFileName: fileName) else { continue }
                let path = directory + "/" + fileName
                var info = EngineInfo(
                    name: name, path: path, status: .refused, abiMajor: 0, abiMinor: 0, capabilities: [], detail: "")
                if let first = firstPath[name] {
                    info.detail = "shadowed by \(first), found earlier on the search path"
                } else {
                    firstPath[name] = path
                    let (engine, refusal) = state.withLock { ($0.loaded[path], $0.refused[path]) }
                    if let engine {
                        info = engine.info
                    } else if let refusal {
                        info.detail = refusal
                    } else {
                        do throws(EngineLoadError) {
                            close(try Self.openVerified(path: path))
                            info.status = .found
                        } catch {
                            info.detail = error.message
                        }
                    }
                }
                listings.append(Listing(name: name, path: path, info: info))
            }
        }
        return listings
    }

    // MARK: Loading one file

    private static func open(path: String, expectedName: String?) throws(EngineLoadError) -> LoadedEngine {
        let fd = try openVerified(path: path)
        // The very file checked: the descriptor, not the path, which may name another file by now. glibc knows a
        // loaded library by the name it was opened with, so that name must never name another file: the
        // descriptor of a library that loaded stays open for good (libraries are never unloaded either), and
        // its number is never reused.
        guard let handle = dlopen("/proc/self/fd/\(fd)", RTLD_NOW | RTLD_LOCAL) else {
            close(fd)
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

    /// Opens the engine file at `path` for loading, after checking everything that decides whether it is safe:
    /// the directories above it as named, then its real path walked from `/` one component at a time without
    /// following links (each directory checked through its own descriptor), then the file through the
    /// descriptor returned. Nobody but this user and root can have changed any of it in between.
    static func openVerified(path: String) throws(EngineLoadError) -> Int32 {
        guard path.hasPrefix("/") else {
            throw EngineLoadError(.loadFailed, path: path, "engine paths must be absolute")
        }
        var named = ""
        for component in path.split(separator: "/").dropLast() {
            named += "/" + component
            var info = stat()
            guard stat(named, &info) == 0 else {
                let cause = SystemError.current
                throw EngineLoadError(.loadFailed, path: path, "cannot inspect \(named): \(cause)", underlying: cause)
            }
            try checkDirectory(info, named, for: path)
        }
        guard let resolved = realpath(path, nil) else {
            let cause = SystemError.current
            throw EngineLoadError(.loadFailed, path: path, "cannot resolve: \(cause)", underlying: cause)
        }
        let real = String(cString: resolved)
        free(resolved)

        var directory = Glibc.open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directory >= 0 else { throw EngineLoadError(.loadFailed, path: path, "cannot open /") }
        var walked = ""
        let components = real.split(separator: "/")
        for (index, component) in components.enumerated() {
            var info = stat()
            guard fstat(directory, &info) == 0 else {
                close(directory)
                throw EngineLoadError(.loadFailed, path: path, "cannot inspect \(walked.isEmpty ? "/" : walked)")
            }
            do throws(EngineLoadError) {
                try checkDirectory(info, walked.isEmpty ? "/" : walked, for: path)
            } catch {
                close(directory)
                throw error
            }
            walked += "/" + component
            let last = index == components.count - 1
            let next = openat(directory, String(component), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | (last ? 0 : O_DIRECTORY))
            let code = errno
            close(directory)
            guard next >= 0 else {
                throw EngineLoadError(
                    .loadFailed, path: path,
                    code == ELOOP || code == ENOTDIR
                        ? "refused: \(walked) changed while it was being opened"
                        : "cannot open \(walked): \(String(cString: strerror(code)))")
            }
            directory = next
        }
        let fd = directory
        do throws(EngineLoadError) {
            try checkFile(fd, path)
        } catch {
            close(fd)
            throw error
        }
        return fd
    }

    /// A directory above an engine: owned by this user or root, and writable by no one else unless sticky.
    private static func checkDirectory(_ info: stat, _ directory: String, for path: String) throws(EngineLoadError) {
        try checkOwner(info, "the directory \(directory)", sticky: info.st_mode & S_ISVTX != 0, for: path)
    }

    /// Owned by this user or root, and writable by no one else (not by others, nor by a group other than the
    /// daemon user's own) unless `sticky` (others may then add entries, never replace ours).
    private static func checkOwner(_ info: stat, _ subject: String, sticky: Bool, for path: String) throws(EngineLoadError) {
        guard info.st_uid == getuid() || info.st_uid == 0 else {
            throw EngineLoadError(
                .unsafePermissions, path: path,
                "refused: \(subject) is owned by uid \(info.st_uid), not by this user (uid \(getuid())) or root")
        }
        guard !sticky else { return }
        if info.st_mode & S_IWOTH != 0 {
            throw EngineLoadError(.unsafePermissions, path: path, "refused: \(subject) is world-writable")
        }
        if info.st_mode & S_IWGRP != 0, info.st_gid != getgid() || info.st_uid != getuid() {
            throw EngineLoadError(.unsafePermissions, path: path, "refused: \(subject) is writable by another group")
        }
    }

    /// The open file: a regular ELF file, owned by this user or root, writable by no one else.
    private static func checkFile(_ fd: Int32, _ path: String) throws(EngineLoadError) {
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let cause = SystemError.current
            throw EngineLoadError(.loadFailed, path: path, "cannot stat: \(cause)", underlying: cause)
        }
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw EngineLoadError(.notSharedObject, path: path, "not a regular file")
        }
        try checkOwner(info, "the file", sticky: false, for: path)
        var magic = [UInt8](repeating: 0, count: 4)
        guard pread(fd, &magic, 4, 0) == 4, magic == [0x7F, 0x45, 0x4C, 0x46] else {
            throw EngineLoadError(.notSharedObject, path: path, "not a shared object (no ELF header)")
        }
    }
}
