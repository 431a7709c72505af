#if canImport(Glibc)
import Glibc
#endif

// Small POSIX helpers for engines that keep files. Every failure is an EngineError naming the file.

@_silgen_name("syncfs")
private func c_syncfs(_ fd: Int32) -> Int32

public enum Files {
    /// Reads a whole file; `nil` if it does not exist.
    public static func read(_ path: String) throws(EngineError) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw EngineError.errno("cannot open \(path)")
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw EngineError.errno("cannot stat \(path)") }
        var bytes = [UInt8](repeating: 0, count: Int(info.st_size))
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress! + done, $0.count - done) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else {
                if n == 0 { throw EngineError.corrupt("\(path) is shorter than its size") }
                throw EngineError.errno("cannot read \(path)")
            }
            done += n
        }
        return bytes
    }

    /// Writes `bytes` to `path` through `path.tmp` and a rename; `sync` fdatasyncs the file before the rename.
    public static func replace(_ path: String, with bytes: [UInt8], sync: Bool) throws(EngineError) {
        let temporary = path + ".tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw EngineError.errno("cannot create \(temporary)") }
        do throws(EngineError) {
            try writeAll(fd, bytes, temporary)
            if sync, fdatasync(fd) != 0 { throw EngineError.errno("cannot sync \(temporary)") }
        } catch {
            close(fd)
            unlink(temporary)
            throw error
        }
        close(fd)
        guard rename(temporary, path) == 0 else {
            let error = EngineError.errno("cannot rename \(temporary)")
            unlink(temporary)
            throw error
        }
    }

    /// Writes `bytes` to `path` in place (created or truncated), with no fsync.
    public static func overwrite(_ path: String, with bytes: [UInt8]) throws(EngineError) {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw EngineError.errno("cannot create \(path)") }
        defer { close(fd) }
        try writeAll(fd, bytes, path)
    }

    public static func writeAll(_ fd: Int32, _ bytes: [UInt8], _ path: String) throws(EngineError) {
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + done, $0.count - done) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw EngineError.errno("cannot write \(path)") }
            done += n
        }
    }

    public static func remove(_ path: String) throws(EngineError) {
        if unlink(path) != 0, errno != ENOENT { throw EngineError.errno("cannot delete \(path)") }
    }

    public static func makeDirectory(_ path: String) throws(EngineError) {
        if mkdir(path, 0o700) != 0, errno != EEXIST { throw EngineError.errno("cannot create \(path)") }
    }

    /// fsync on a directory: makes the names created, renamed and removed in it durable.
    public static func syncDirectory(_ path: String) throws(EngineError) {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw EngineError.errno("cannot open \(path)") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw EngineError.errno("cannot sync \(path)") }
    }

    /// syncfs: flushes every file of the filesystem that holds `path` (one call instead of one per file).
    public static func syncFilesystem(_ path: String) throws(EngineError) {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw EngineError.errno("cannot open \(path)") }
        defer { close(fd) }
        guard c_syncfs(fd) == 0 else { throw EngineError.errno("cannot sync the filesystem of \(path)") }
    }

    /// The names in a directory (not `.` or `..`); empty if it does not exist.
    public static func list(_ path: String) throws(EngineError) -> [String] {
        guard let dir = opendir(path) else {
            if errno == ENOENT { return [] }
            throw EngineError.errno("cannot list \(path)")
        }
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
}
