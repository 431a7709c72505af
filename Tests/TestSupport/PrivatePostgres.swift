import Foundation

/// A PostgreSQL server of the test's own: a new cluster in a temporary directory, listening only on a Unix socket
/// in that directory (no TCP port), stopped and deleted afterwards. Any cluster Debian made is ignored.
///
/// `initdb` refuses to run as root: as root, the server and its tools run as the `postgres` user (through
/// `setpriv`, which execs, so the process the test holds is the server itself and its signals reach it).
/// The binaries are Debian's, under `/usr/lib/postgresql/VERSION/bin` (not on PATH), or `STOREBROKER_PG_BIN`.
public final class PrivatePostgres: @unchecked Sendable {
    /// The directory of the cluster and the socket.
    public let directory: String
    public let port = 5432
    private var server: ChildProcess?
    private let bin: String

    /// What the postgres engine's `conninfo` option takes.
    public var conninfo: String { "host=\(directory) port=\(port) user=postgres dbname=postgres" }
    /// The server's log, every start's (for failure messages).
    public var log: String {
        (0..<starts).map { (try? String(contentsOfFile: logPath($0), encoding: .utf8)) ?? "" }.joined()
    }
    private var starts = 0
    private func logPath(_ start: Int) -> String { directory + "/server-\(start).log" }

    public struct Unavailable: Error, CustomStringConvertible {
        public let description: String
    }

    /// Makes the cluster (`initdb`, UTF-8 with the C locale, whatever locales the machine has) in `directory`
    /// (which must exist and be empty but for what the test puts there) and starts the server.
    public init(directory: String, settings: [String: String] = [:]) async throws {
        self.directory = directory
        self.bin = try Self.binaries()
        self.settings = settings
        if getuid() == 0 {
            guard let user = getpwnam("postgres") else { throw Unavailable(description: "no postgres user (apt-get install postgresql)") }
            chown(directory, user.pointee.pw_uid, user.pointee.pw_gid)
        }
        let made = try await runProgram(
            asServerUser([bin + "/initdb", "-D", directory + "/data", "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--no-locale"]),
            in: directory)
        guard made.status == 0 else { throw Unavailable(description: "initdb failed (\(made.status)): \(made.stderr.suffix(800))") }
        try await start()
    }

    private let settings: [String: String]

    /// Starts the server (again, after `stop` or `kill`) and waits until it accepts connections.
    public func start() async throws {
        let path = logPath(starts)
        starts += 1
        var arguments = [bin + "/postgres", "-D", directory + "/data", "-k", directory, "-p", String(port), "-c", "listen_addresses="]
        // The tests' server trades crash safety of its own for speed: the tests kill brokers, never it.
        for (key, value) in (["fsync": "off", "full_page_writes": "off"].merging(settings) { $1 }).sorted(by: { $0.key < $1.key }) {
            arguments += ["-c", "\(key)=\(value)"]
        }
        let child = try ChildProcess(asServerUser(arguments), stdoutPath: directory + "/server.out", stderrPath: path, in: directory)
        server = child
        let ready = await eventually(within: 60) {
            ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").contains("ready to accept connections")
        }
        guard ready else {
            child.signal(SIGKILL)
            await child.wait()
            throw Unavailable(description: "the private PostgreSQL server did not start: \(log.suffix(800))")
        }
    }

    /// A fast shutdown (SIGINT: connections are cut, what committed is kept).
    public func stop() async {
        guard let server else { return }
        server.signal(SIGINT)
        await server.wait(atMost: 30)
        self.server = nil
    }

    /// Runs SQL through `psql` (as the server's user, on its socket); its output, unaligned, tuples only.
    public func query(_ sql: String) async throws -> String {
        let result = try await runProgram(
            asServerUser([bin + "/psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", directory, "-p", String(port), "-U", "postgres",
                "-d", "postgres", "-c", sql]),
            in: directory)
        guard result.status == 0 else { throw Unavailable(description: "psql failed: \(result.stderr.suffix(500))") }
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    private func asServerUser(_ arguments: [String]) -> [String] {
        guard getuid() == 0 else { return arguments }
        return ["/usr/bin/setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"] + arguments
    }

    private static func binaries() throws -> String {
        if let bin = ProcessInfo.processInfo.environment["STOREBROKER_PG_BIN"] { return bin }
        let root = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).compactMap(Int.init).sorted()
        guard let newest = versions.last, FileManager.default.fileExists(atPath: "\(root)/\(newest)/bin/postgres") else {
            throw Unavailable(description: "no PostgreSQL server under \(root) (scripts/setup.sh installs Debian's postgresql)")
        }
        return "\(root)/\(newest)/bin"
    }
}

/// A private PostgreSQL server for `body`, stopped and deleted afterwards.
public func withPrivatePostgres<T>(settings: [String: String] = [:], _ body: (PrivatePostgres) async throws -> T) async throws -> T {
    try await withTemporaryDirectory(prefix: "sb-pg") { directory in
        let server = try await PrivatePostgres(directory: directory, settings: settings)
        do {
            let value = try await body(server)
            await server.stop()
            return value
        } catch {
            await server.stop()
            throw error
        }
    }
}
