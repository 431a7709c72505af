import ArgumentParser
import Foundation
import StoreBrokerClient

/// `storectl`: the broker from the command line. Each command parses, talks through `BrokerConnection`, and
/// prints; docs/CLI.md documents every output and exit code.
@main
struct StoreCtl: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "storectl",
        abstract: "Read, write and watch the stores of a running storebrokerd.",
        discussion: """
            The socket is --socket, else $STOREBROKER_SOCKET, else $XDG_RUNTIME_DIR/storebroker/storebroker.sock,
            else /tmp/storebroker-UID/storebroker.sock.

            Exit codes: 0 ok, 64 usage, 65 bad input, 66 not found, 69 cannot reach the broker, 70 internal,
            74 engine or storage error, 75 conflict, 76 protocol error, 77 permission denied.

            Examples:
              storectl insert notes '{"id":"1","text":"milk"}'
              storectl query notes --meta
              storectl watch notes
            """,
        version: "storectl \(StoreBrokerVersion.string)",
        subcommands: [
            Ping.self, Insert.self, Remove.self, Clear.self, Drop.self, Apply.self, Get.self, Query.self, Count.self,
            Stores.self, Engines.self, Watch.self, ValueCommand.self, SecretCommand.self, Import.self, Export.self,
        ]
    )

    /// `storectl --socket PATH COMMAND ...`: global options may come before the command; they are moved to the
    /// end (before a `--`), where the command's own `GlobalOptions` reads them, however deep the command is.
    static func main() async {
        var arguments = Array(CommandLine.arguments.dropFirst())
        // A negative number after an option that takes one is its value, not an option ("--limit -1" would
        // otherwise say "Missing value for '--limit'"): joined as "--limit=-1", it reaches the command's check.
        var index = 0
        while index + 1 < arguments.count, arguments[..<index].last != "--" {
            if arguments[index].hasPrefix("--"), !arguments[index].contains("="), arguments[index + 1].hasPrefix("-"),
                Double(arguments[index + 1]) != nil
            {
                arguments[index] += "=" + arguments.remove(at: index + 1)
            }
            index += 1
        }
        var hoisted: [String] = []
        while let first = arguments.first, let option = ["--socket", "--timeout"].first(where: { first.hasPrefix($0) }) {
            hoisted.append(arguments.removeFirst())
            if first == option, !arguments.isEmpty { hoisted.append(arguments.removeFirst()) }
        }
        if arguments.isEmpty {
            arguments = hoisted
        } else {
            arguments.insert(contentsOf: hoisted, at: arguments.firstIndex(of: "--") ?? arguments.endIndex)
        }
        // storectl has no short option but -h: any other word of a single dash before `--` is a store, an id or a
        // value that begins with a dash. Left to the parser, it is a cluster of short options (one holding `h`
        // printed the help and exited 0, having done nothing) or an unknown option.
        if let dashed = arguments.prefix(while: { $0 != "--" }).firstIndex(where: Self.beginsWithADash) {
            // `--` right after the command's name: everything after it is the command's arguments.
            var command = 0
            while command < dashed, Self.commandNames.contains(arguments[command]) { command += 1 }
            let example = (["storectl"] + arguments[..<command] + ["--"] + arguments[command...dashed] + ["..."])
                .joined(separator: " ")
            FileHandle.standardError.write(
                Data("Error: '\(arguments[dashed])' is not an option: a store, id or value that begins with '-' goes after '--' (\(example))\n".utf8))
            Foundation.exit(Failure.usage)
        }
        // A mistyped command: named, with the closest there is. Left to the parser, its words are "unexpected
        // arguments" of the root command, or the first option after them is blamed.
        if let (typed, closest) = Self.unknownCommand(in: arguments) {
            let hint = closest.map { "; did you mean '\($0)'?" } ?? ""
            FileHandle.standardError.write(
                Data("Error: unknown command '\(typed)'\(hint) (storectl --help lists the commands)\n".utf8))
            Foundation.exit(Failure.usage)
        }
        await Self.main(arguments)
    }

    /// The command or subcommand `arguments` start with when no command has that name, and the closest name there
    /// is, if one is close.
    private static func unknownCommand(in arguments: [String]) -> (typed: String, closest: String?)? {
        guard let first = arguments.first, !first.hasPrefix("-"), first != "help" else { return nil }
        guard let command = configuration.subcommands.first(where: { $0._commandName == first }) else {
            return (first, closest(to: first, among: configuration.subcommands.map { $0._commandName }))
        }
        let subcommands = command.configuration.subcommands.map { $0._commandName }
        guard !subcommands.isEmpty, arguments.count > 1, !arguments[1].hasPrefix("-"), arguments[1] != "help",
            !subcommands.contains(arguments[1])
        else { return nil }
        return ("\(first) \(arguments[1])", closest(to: arguments[1], among: subcommands).map { "\(first) \($0)" })
    }

    /// The name within a third of `word`'s length of edits (at least one, at most two), the nearest first.
    private static func closest(to word: String, among names: [String]) -> String? {
        let allowed = min(2, max(1, word.count / 3))
        return names.map { ($0, editDistance(word, $0)) }.filter { $0.1 <= allowed }.min { $0.1 < $1.1 }?.0
    }

    /// Levenshtein's distance: insertions, deletions and substitutions of characters.
    private static func editDistance(_ a: String, _ b: String) -> Int {
        let a = Array(a)
        let b = Array(b)
        var previous = Array(0...b.count)
        for i in 1...max(1, a.count) where !a.isEmpty {
            var current = [i] + Array(repeating: 0, count: b.count)
            for j in 1...max(1, b.count) where !b.isEmpty {
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1))
            }
            previous = current
        }
        return a.isEmpty ? b.count : previous[b.count]
    }

    /// The words that name a command or a subcommand (`value set`).
    private static let commandNames: Set<String> = {
        var names: Set<String> = []
        for command in configuration.subcommands {
            names.insert(command._commandName)
            for subcommand in command.configuration.subcommands { names.insert(subcommand._commandName) }
        }
        return names
    }()

    /// A single dash and more, but for `-h` (the help): a store, an id or a value (a negative number) that begins
    /// with a dash. An option's negative value is joined to it above.
    private static func beginsWithADash(_ word: String) -> Bool {
        word.count >= 2 && word.hasPrefix("-") && !word.hasPrefix("--") && word != "-h"
    }
}

/// Options every command takes.
struct GlobalOptions: ParsableArguments {
    @Option(help: ArgumentHelp("The broker's socket.", valueName: "path"))
    var socket: String?

    @Option(help: ArgumentHelp(
        "Give up (exit 69) when the broker does not accept, greet or answer a request within this long; 0 waits forever.",
        valueName: "seconds"))
    var timeout: Double = 30

    var socketPath: String { socket ?? BrokerConnection.defaultSocketPath() }

    /// The `--timeout`, nil for none.
    var requestTimeout: Duration? { timeout > 0 ? .milliseconds(Int64(timeout * 1000)) : nil }

    func validate() throws {
        guard timeout >= 0, timeout.isFinite else { throw ValidationError("--timeout must be 0 (none) or a number of seconds") }
    }

    func connect(timeout: Duration? = nil) async throws -> BrokerConnection {
        do {
            return try await BrokerConnection.connect(
                socketPath: socketPath, clientName: "storectl", timeout: timeout ?? requestTimeout)
        } catch {
            throw Failure(error)
        }
    }
}

/// Output formats for listings.
enum OutputFormat: String, ExpressibleByArgument, CaseIterable {
    case ndjson, json, table

    /// `table` on a terminal, `ndjson` otherwise.
    static var automatic: OutputFormat { isatty(STDOUT_FILENO) == 1 ? .table : .ndjson }
}

/// A failure with its exit code (docs/CLI.md), the error it came from and where storectl decided it.
struct Failure: LayerError {
    var code: Int32
    var message: String
    var underlying: (any Error)?
    var location: SourceLocation

    static let usage: Int32 = 64
    static let badInput: Int32 = 65
    static let notFound: Int32 = 66
    static let unavailable: Int32 = 69
    static let software: Int32 = 70
    static let ioError: Int32 = 74
    static let conflict: Int32 = 75
    static let protocolError: Int32 = 76
    static let permission: Int32 = 77

    init(
        _ code: Int32, _ message: String, underlying: (any Error)? = nil, fileID: StaticString = #fileID,
        line: UInt = #line
    ) {
        self.code = code
        self.message = message
        self.underlying = underlying
        self.location = SourceLocation(fileID: fileID, line: line)
    }

    /// A library error's message under the exit code its kind and code map to.
    init(_ error: StoreBrokerError, fileID: StaticString = #fileID, line: UInt = #line) {
        let code: Int32
        switch error.kind {
        case .cannotConnect, .connectionClosed, .timedOut: code = Self.unavailable
        case .protocolViolation: code = Self.protocolError
        case .cannotDecode, .cannotEncode: code = Self.badInput
        case .cancelled, .closed: code = Self.software  // storectl neither cancels nor closes mirrors
        case .refused:
            switch error.code ?? .internalError {
            case .invalidName, .invalidID, .itemTooLarge, .batchTooLarge, .invalidRequest: code = Self.badInput
            case .conflict: code = Self.conflict
            case .cursorGone, .notFound: code = Self.notFound
            case .permissionDenied: code = Self.permission
            case .engineError, .engineUnavailable, .storageFull: code = Self.ioError
            case .shuttingDown, .tooManyConnections, .timedOut: code = Self.unavailable
            case .notSupported, .internalError: code = Self.software
            default: code = Self.protocolError
            }
        }
        self.init(code, error.description, underlying: error, fileID: fileID, line: line)
    }

    /// The exit code's name, as docs/CLI.md lists them: what an error line starts with when the broker gave
    /// no code of its own.
    var codeName: String {
        switch code {
        case Self.usage: "usage"
        case Self.badInput: "badInput"
        case Self.notFound: "notFound"
        case Self.unavailable: "unavailable"
        case Self.software: "internal"
        case Self.ioError: "storage"
        case Self.conflict: "conflict"
        case Self.protocolError: "protocol"
        case Self.permission: "permissionDenied"
        default: "exit\(code)"
        }
    }

    /// The line storectl prints: `<code name>: <message>`, the broker's code name when it refused (already in
    /// the message), else the exit code's.
    var line: String {
        if let error = underlying as? StoreBrokerError, error.code != nil { return message }
        return "\(codeName): \(message)"
    }

    var description: String { message }
}

extension ParsableCommand {
    /// Runs `body`, turning failures into their message on stderr and their exit code.
    func reporting(_ body: () async throws -> Void) async throws {
        do {
            try await body()
        } catch let failure as Failure {
            Output.error(failure.line)
            throw ExitCode(failure.code)
        } catch let error as StoreBrokerError {
            let failure = Failure(error)
            Output.error(failure.line)
            throw ExitCode(failure.code)
        }
    }
}

/// Unbuffered output: every line reaches the reader at once (`watch` is read line by line).
enum Output {
    static func line(_ text: String) {
        write(Array(text.utf8) + [0x0A], to: STDOUT_FILENO)
    }

    static func bytes(_ bytes: [UInt8]) {
        write(bytes, to: STDOUT_FILENO)
    }

    static func error(_ text: String) {
        write(Array("storectl: \(text)\n".utf8), to: STDERR_FILENO)
    }

    private static func write(_ bytes: [UInt8], to fd: Int32) {
        var rest = bytes[...]
        while !rest.isEmpty {
            let written = rest.withUnsafeBytes { Foundation.write(fd, $0.baseAddress, $0.count) }
            if written < 0 {
                if errno == EINTR { continue }
                // The reader went away (EPIPE): nothing more to say.
                Foundation.exit(errno == EPIPE ? 0 : Failure.ioError)
            }
            rest = rest.dropFirst(written)
        }
    }
}

/// Prints a write's new sequence (nothing when the write changed nothing).
func printWriteResult(_ result: CommitResult) {
    if result.committed { Output.line(String(result.sequence)) }
}

/// `--expect SEQ`: the condition of a write.
struct ConditionOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "Write only if the store is at this sequence (0: only if it does not exist); else exit 75.",
            valueName: "sequence"))
    var expect: UInt64?

    var condition: Condition {
        switch expect {
        case nil: .unconditional
        case 0?: .absent
        case let sequence?: .sequence(sequence)
        }
    }
}

extension CompletionKind {
    /// The names of the stores of the broker the command line names (`--socket`), else of the default socket's:
    /// what a shell offers after `storectl query <TAB>`. Nothing when no broker answers within 2 s.
    static var storeNames: CompletionKind {
        .custom { (words: [String], _: Int, prefix: String) async -> [String] in
            var socket = BrokerConnection.defaultSocketPath()
            if let index = words.firstIndex(of: "--socket"), index + 1 < words.count {
                socket = words[index + 1]
            } else if let word = words.first(where: { $0.hasPrefix("--socket=") }) {
                socket = String(word.dropFirst("--socket=".count))
            }
            guard
                let connection = try? await BrokerConnection.connect(
                    socketPath: socket, clientName: "storectl-completion", timeout: .seconds(2))
            else { return [] }
            let names = (try? await connection.stores().map(\.name)) ?? []
            await connection.close()
            return names.filter { $0.hasPrefix(prefix) }
        }
    }
}
