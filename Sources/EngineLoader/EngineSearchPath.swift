#if canImport(Glibc)
import Glibc
#endif

/// The directories searched for engines, in order (PRODUCT.md): the `--engine-path` directories, then
/// `STOREBROKER_ENGINE_PATH` (colon-separated), then the directory of the daemon binary, then
/// `<bindir>/../lib/storebroker/engines`. Every entry is made absolute, so only absolute paths reach `dlopen`.
public struct EngineSearchPath: Hashable, Sendable {
    public var directories: [String]

    public init(directories: [String]) {
        var seen = Set<String>()
        self.directories = directories.map(Self.absolute).filter { seen.insert($0).inserted }
    }

    /// The standard path. `environmentPath` is the value of `STOREBROKER_ENGINE_PATH`, read by the caller;
    /// `executablePath` defaults to this process's binary.
    public static func standard(
        engineDirectories: [String] = [], environmentPath: String? = nil,
        executablePath: String? = currentExecutablePath()
    ) -> EngineSearchPath {
        var directories = engineDirectories
        if let environmentPath {
            directories += environmentPath.split(separator: ":", omittingEmptySubsequences: true).map(String.init)
        }
        if let executablePath {
            let bindir = parent(of: executablePath)
            directories.append(bindir)
            directories.append(parent(of: bindir) + "/lib/storebroker/engines")
        }
        return EngineSearchPath(directories: directories)
    }

    /// The file name of engine `name`.
    public static func fileName(for name: String) -> String { "libstorebroker-engine-\(name).so" }

    /// The engine name in a file name, if it is one.
    public static func engineName(inFileName fileName: String) -> String? {
        let prefix = "libstorebroker-engine-"
        let suffix = ".so"
        guard fileName.hasPrefix(prefix), fileName.hasSuffix(suffix), fileName.count > prefix.count + suffix.count
        else { return nil }
        return String(fileName.dropFirst(prefix.count).dropLast(suffix.count))
    }

    /// This process's binary, from /proc/self/exe.
    public static func currentExecutablePath() -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard length > 0 else { return nil }
        return String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    static func parent(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    static func absolute(_ path: String) -> String {
        if path.hasPrefix("/") { return normalized(path) }
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        guard getcwd(&buffer, buffer.count) != nil else { return normalized("/" + path) }
        let cwd = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return normalized(cwd + "/" + path)
    }

    /// Removes `.`, empty components and a trailing slash (`..` is kept: it is resolved by the kernel).
    static func normalized(_ path: String) -> String {
        let parts = path.split(separator: "/").filter { $0 != "." }
        return "/" + parts.joined(separator: "/")
    }
}
