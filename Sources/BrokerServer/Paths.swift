#if canImport(Glibc)
import Glibc
#endif
import BrokerCore
import Synchronization
import Wire

/// File-system checks and set-up for the daemon's socket and data directory (PRODUCT.md "Interfaces").
public enum DaemonPaths {
    /// `$XDG_DATA_HOME/storebroker`, else `~/.local/share/storebroker` (home from the password database when
    /// `HOME` is unset). An empty or relative `XDG_DATA_HOME` counts as unset.
    public static func defaultDataDirectory(environment: [String: String]) -> String {
        if let data = environment["XDG_DATA_HOME"], data.hasPrefix("/") { return data + "/storebroker" }
        var home = environment["HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil }
        if home == nil, let entry = getpwuid(getuid()), let dir = entry.pointee.pw_dir { home = String(cString: dir) }
        return (home ?? "/") + "/.local/share/storebroker"
    }

    /// The names in `directory` (nil when it cannot be read).
    static func entries(of directory: String) -> Set<String>? {
        (try? FileOps.list(directory)).map(Set.init)
    }

    static func parent(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    /// Makes sure the socket's directory is safe: created with `mode` when missing (and only then given a
    /// mode); an existing one must be a real directory owned by us or by root, never a symbolic link. Returns
    /// the directory when it created it.
    static func prepareSocketDirectory(for socketPath: String, mode: mode_t) throws(DaemonError) -> String? {
        guard socketPath.hasPrefix("/") else { throw DaemonError(.socket, "the socket path must be absolute: \(socketPath)") }
        guard socketPath.utf8.count <= SocketPath.maxLength else {
            throw DaemonError(
                .socket, "the socket path is \(socketPath.utf8.count) bytes; a Unix socket path holds at most "
                    + "\(SocketPath.maxLength): \(socketPath)")
        }
        let directory = parent(of: socketPath)
        var info = stat()
        var created: String?
        if lstat(directory, &info) != 0 {
            guard errno == ENOENT else { throw DaemonError.system(.socket, "cannot inspect \(directory)") }
            // Create missing ancestors (mode 0700 for ours), the directory itself with `mode`.
            let grandparent = parent(of: directory)
            var parentInfo = stat()
            if stat(grandparent, &parentInfo) != 0 {
                throw DaemonError(.socket, "the socket directory's parent \(grandparent) does not exist")
            }
            guard mkdir(directory, mode) == 0 || errno == EEXIST else {
                throw DaemonError.system(.socket, "cannot create the socket directory \(directory)")
            }
            created = directory
            // mkdir applies the umask; the mode must be exactly what was asked.
            _ = chmod(directory, mode)
            guard lstat(directory, &info) == 0 else {
                throw DaemonError.system(.socket, "cannot inspect \(directory)")
            }
        }
        if info.st_mode & S_IFMT == S_IFLNK {
            throw DaemonError(.socket, "the socket directory \(directory) is a symbolic link; refusing to use it")
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw DaemonError(.socket, "the socket directory \(directory) is not a directory")
        }
        guard info.st_uid == getuid() || info.st_uid == 0 else {
            throw DaemonError(
                .socket, "the socket directory \(directory) belongs to uid \(info.st_uid), not to this user (\(getuid())); "
                    + "refusing to use it")
        }
        return created
    }

    /// What is at the socket path now.
    enum Occupant {
        case nothing
        case staleSocket
        case liveDaemon
        case notASocket
    }

    static func occupant(of socketPath: String) -> Occupant {
        var info = stat()
        guard lstat(socketPath, &info) == 0 else { return .nothing }
        guard info.st_mode & S_IFMT == S_IFSOCK else { return .notASocket }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .staleSocket }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            let bytes = Array(socketPath.utf8.prefix(SocketPath.maxLength))
            raw.copyBytes(from: bytes)
        }
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        return connected == 0 ? .liveDaemon : .staleSocket
    }

    /// The inode of `path`, to tell later whether the socket file is still ours.
    static func inode(of path: String) -> ino_t? {
        var info = stat()
        return lstat(path, &info) == 0 ? info.st_ino : nil
    }
}

/// `flock` on the data directory: one daemon per data directory. Held until `release()` (or deinit).
final class DataDirectoryLock: Sendable {
    private let fd: Int32
    private let released = Atomic(false)

    init(directory: String) throws(DaemonError) {
        let path = directory + "/.lock"
        // A daemon whose start-up fails removes the file it locked; one that opened it just before must not
        // then hold a lock on a file no longer there: the lock counts only while the path is still its file.
        // A lock just released may still be held for a moment by a child being spawned (its copy of the
        // descriptor lives until its exec): a busy lock is tried again for a second before it counts.
        var busyTries = 0
        for _ in 0..<200 {
            let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
            guard fd >= 0 else { throw DaemonError.system(.dataDirectory, "cannot open \(path)") }
            guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
                let code = errno
                close(fd)
                if code == EWOULDBLOCK {
                    busyTries += 1
                    if busyTries < 50 {
                        usleep(20_000)
                        continue
                    }
                    throw DaemonError(.alreadyRunning, "another storebrokerd is already using the data directory \(directory)")
                }
                throw DaemonError.system(.dataDirectory, "cannot lock \(path)", errno: code)
            }
            var held = stat()
            var named = stat()
            if fstat(fd, &held) == 0, stat(path, &named) == 0, held.st_ino == named.st_ino, held.st_dev == named.st_dev {
                self.fd = fd
                return
            }
            close(fd)
        }
        throw DaemonError(.dataDirectory, "cannot lock \(path): it keeps being replaced")
    }

    /// Lets another daemon use the directory.
    func release() {
        if !released.exchange(true, ordering: .relaxed) { close(fd) }
    }

    deinit { release() }
}

/// What a start-up created, so that a start-up that fails leaves nothing behind: directories it made (removed
/// only while empty), and the lock and key files that were not there before.
struct StartupLitter {
    var directories: [String] = []
    var dataDirectory: String?
    var dataEntriesBefore: Set<String> = []

    /// Removes it all: new files the daemon owns, new empty directories in the data directory, then the
    /// directories made, innermost first. Never anything that was there before the start-up.
    func remove() {
        if let dataDirectory, let now = DaemonPaths.entries(of: dataDirectory) {
            for name in now.subtracting(dataEntriesBefore) {
                let path = dataDirectory + "/" + name
                var info = stat()
                guard lstat(path, &info) == 0 else { continue }
                if info.st_mode & S_IFMT == S_IFDIR {
                    rmdir(path)  // fails, and so keeps it, unless empty
                } else if name == ".lock" || name == KeyFileSealer.fileName {
                    unlink(path)
                }
            }
        }
        for directory in directories.reversed() { rmdir(directory) }
    }
}
