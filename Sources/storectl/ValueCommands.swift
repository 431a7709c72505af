import ArgumentParser
import Foundation
import NIOCore
import StoreBrokerClient

/// `value` and `secret` share their commands; a kind says how its values look on the command line.
protocol ValueKind {
    static var namespace: Namespace { get }
    /// `value` or `secret`.
    static var command: String { get }
    /// The bytes to store for a command-line argument.
    static func encode(_ argument: String) throws -> ByteBuffer
    /// What `get` prints for stored bytes.
    static func render(_ bytes: ByteBuffer) -> String
}

/// Values: JSON documents, stored and printed exactly as given.
enum PlainValue: ValueKind {
    static let namespace = Namespace.value
    static let command = "value"

    static func encode(_ argument: String) throws -> ByteBuffer {
        let trimmed = argument.trimmingCharacters(in: .whitespacesAndNewlines)
        if case .failure(let failure) = JSON.parsed(Substring(trimmed)) {
            // A bare word is the usual slip: the shell took the quotes a JSON string needs.
            let bare = !trimmed.isEmpty && !"\"{[".contains(trimmed.first!)
            let hint = bare ? "; a string is written in quotes: '\(JSON.string(trimmed))'" : ""
            throw Failure(Failure.badInput, "the value is not JSON: \(failure.message)\(hint)")
        }
        return ByteBuffer(string: trimmed)
    }

    static func render(_ bytes: ByteBuffer) -> String { String(buffer: bytes) }
}

/// Secrets: strings, stored as JSON strings, printed unquoted.
enum SecretValue: ValueKind {
    static let namespace = Namespace.secureValue
    static let command = "secret"

    static func encode(_ argument: String) throws -> ByteBuffer {
        // A secret is the plain string: quotes given with it are kept, and a Swift app reads them back too.
        if argument.count >= 2, argument.hasPrefix("\""), argument.hasSuffix("\""), JSON.parse(Substring(argument)) is String {
            FileHandle.standardError.write(
                Data(
                    "storectl: warning: the secret keeps its quotes (a secret is the plain string: secret set NAME \(argument.dropFirst().dropLast()))\n"
                        .utf8))
        }
        return ByteBuffer(string: JSON.string(argument))
    }

    static func render(_ bytes: ByteBuffer) -> String {
        (JSON.parse(Substring(String(buffer: bytes))) as? String) ?? String(buffer: bytes)
    }
}

struct ValueCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "value",
        abstract: "Get, set, reset and watch shared values (JSON documents, like Boutique's @StoredValue).",
        subcommands: [
            ValueGet<PlainValue>.self, ValueSet<PlainValue>.self, ValueReset<PlainValue>.self, ValueWatch<PlainValue>.self,
            ValueList<PlainValue>.self,
        ])
}

struct SecretCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "secret",
        abstract: "Get, set, reset and watch secure values: strings, encrypted at rest, for this user only.",
        subcommands: [
            ValueGet<SecretValue>.self, ValueSet<SecretValue>.self, ValueReset<SecretValue>.self,
            ValueWatch<SecretValue>.self, ValueList<SecretValue>.self,
        ])
}

/// `--expect SEQ` / `--expect-unset` for value writes.
struct ValueConditionOptions: ParsableArguments {
    @Option(help: ArgumentHelp("Write only if the value is at this sequence (0: never set); else exit 75.", valueName: "sequence"))
    var expect: UInt64?

    @Flag(name: .customLong("expect-unset"), help: "Write only if the value is not set; else exit 75.")
    var expectUnset = false

    func validate() throws {
        if expect != nil, expectUnset { throw ValidationError("--expect and --expect-unset exclude each other") }
    }

    var condition: Condition {
        if expectUnset { return .absent }
        return expect.map { .sequence($0) } ?? .unconditional
    }
}

struct ValueGet<Kind: ValueKind>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "get",
            abstract: Kind.namespace == .secureValue
                ? "Print a secret (unquoted); exit 66 if it is not set." : "Print a value as stored; exit 66 if it is not set.",
            discussion: """
                --meta prints one JSON line with the sequence to pass to --expect, and exits 0 even when it is
                not set: {"epoch":3,"sequence":12,"set":true,"value":...} or {"epoch":3,"sequence":13,"set":false}
                (0 and 0 for one never set). A secret's value is its JSON string.

                Example:
                  storectl \(Kind.command) get theme
                """)
    }

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The name.") var name: String
    @Flag(help: "Print its epoch and sequence with it, as one JSON line.") var meta = false

    func run() async throws {
        try await reporting {
            let answer = try await global.connect().value(name, in: Kind.namespace)
            if meta {
                var line = #"{"epoch":\#(answer.position.epoch),"sequence":\#(answer.position.sequence),"set":"#
                if case .set(let payload) = answer.value {
                    line += #"true,"value":"# + String(buffer: payload.bytes) + "}"
                } else {
                    line += "false}"
                }
                return Output.line(line)
            }
            guard case .set(let payload) = answer.value else {
                throw Failure(Failure.notFound, "\(Kind.command) \(name) is not set")
            }
            Output.line(Kind.render(payload.bytes))
        }
    }
}

struct ValueList<Kind: ValueKind>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "list",
            abstract: Kind.namespace == .secureValue
                ? "List the secrets' names (never the secrets), in name order." : "List the values' names, in name order.",
            discussion: """
                Every name ever set, reset ones too (--all; without it only those set now). The default prints one
                name per line (as dconf list does); ndjson: {"name","epoch","sequence","set"} per name, json: an
                array of those, table: columns.

                Example:
                  storectl \(Kind.command) list
                """)
    }

    @OptionGroup var global: GlobalOptions
    @Flag(help: "Include names that were reset (unset now).") var all = false
    @Option(help: "names (the default), ndjson, json or table.") var format: String = "names"

    func validate() throws {
        guard ["names", "ndjson", "json", "table"].contains(format) else {
            throw ValidationError("--format takes names, ndjson, json or table")
        }
    }

    func run() async throws {
        try await reporting {
            let listed = try await global.connect().values(in: Kind.namespace).filter { all || $0.isSet }
            let objects = listed.map {
                "{\"name\":\(JSON.string($0.name)),\"epoch\":\($0.epoch),\"sequence\":\($0.sequence),\"set\":\($0.isSet)}"
            }
            switch format {
            case "ndjson": objects.forEach(Output.line)
            case "json": Output.line(JSON.array(objects))
            case "table":
                Table.print(
                    headers: ["NAME", "SEQUENCE", "SET"],
                    rows: listed.map { [$0.name, String($0.sequence), $0.isSet ? "yes" : "no"] })
            default: listed.forEach { Output.line($0.name) }
            }
        }
    }
}

struct ValueSet<Kind: ValueKind>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "set",
            abstract: "Set it; prints its new sequence (nothing if it already held exactly this).",
            discussion: Kind.namespace == .secureValue
                ? """
                    Without VALUE the secret is read from standard input (all of it, less one final newline), or
                    asked for without echo when standard input is a terminal: an argument can be read by any user
                    from /proc while storectl runs.

                    Examples:
                      storectl secret set api-token              # asks for it
                      pass show api | storectl secret set api-token
                    """
                : """
                    Without VALUE the JSON is read from standard input.

                    Example:
                      storectl value set theme '{"dark":true}'
                    """)
    }

    @OptionGroup var global: GlobalOptions
    @OptionGroup var condition: ValueConditionOptions
    @Argument(help: "The name.") var name: String
    @Argument(
        help: Kind.namespace == .secureValue
            ? "The secret (a string); omit it to read it from standard input." : "The value (JSON); omit it to read it from standard input.")
    var value: String?

    func run() async throws {
        try await reporting {
            // Read (and checked) before connecting: a bad input needs no broker.
            let given = try value ?? StandardInput.value(prompt: "\(Kind.command) \(name): ", echo: Kind.namespace != .secureValue)
            let payload = Payload(try Kind.encode(given))
            printWriteResult(
                try await global.connect().setValue(name, in: Kind.namespace, to: payload, condition: condition.condition))
        }
    }
}

/// A value that was not given on the command line.
enum StandardInput {
    /// From a terminal: one line, after `prompt` on standard error, echoed or not. Otherwise all of standard
    /// input, less one final newline (`printf 'x\n' | ...` and `printf x | ...` give the same). Empty is an error.
    static func value(prompt: String, echo: Bool) throws -> String {
        var text: String
        if isatty(STDIN_FILENO) == 1 {
            FileHandle.standardError.write(Data(prompt.utf8))
            text = echo ? readLine() ?? "" : try readLineWithoutEcho()
        } else {
            let data = FileHandle.standardInput.readDataToEndOfFile()
            guard let decoded = String(validating: data, as: UTF8.self) else {
                throw Failure(Failure.badInput, "standard input is not UTF-8")
            }
            text = decoded
            if text.hasSuffix("\r\n") {
                text.removeLast()  // "\r\n" is one Character
            } else if text.hasSuffix("\n") {
                text.removeLast()
            }
        }
        guard !text.isEmpty else { throw Failure(Failure.badInput, "no value given (as an argument or on standard input)") }
        return text
    }

    /// Reads a line from the terminal with echo off, restoring the terminal's mode afterwards.
    private static func readLineWithoutEcho() throws -> String {
        var saved = termios()
        guard tcgetattr(STDIN_FILENO, &saved) == 0 else { throw Failure(Failure.ioError, "cannot read the terminal's mode") }
        var quiet = saved
        quiet.c_lflag &= ~tcflag_t(ECHO)
        guard tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet) == 0 else {
            throw Failure(Failure.ioError, "cannot turn the terminal's echo off")
        }
        defer {
            tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved)
            FileHandle.standardError.write(Data("\n".utf8))
        }
        return readLine() ?? ""
    }
}

struct ValueReset<Kind: ValueKind>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "reset",
            abstract: "Unset it; prints its new sequence (nothing if it was not set).",
            discussion: "Example:\n  storectl \(Kind.command) reset theme")
    }

    @OptionGroup var global: GlobalOptions
    @OptionGroup var condition: ValueConditionOptions
    @Argument(help: "The name.") var name: String

    func run() async throws {
        try await write(global) { try await $0.setValue(name, in: Kind.namespace, to: nil, condition: condition.condition) }
    }
}

struct ValueWatch<Kind: ValueKind>: AsyncParsableCommand {
    static var configuration: CommandConfiguration {
        CommandConfiguration(
            commandName: "watch",
            abstract: "Follow it as NDJSON, one line per change, flushed line by line.",
            discussion: """
                First {"op":"loaded","name","epoch","sequence",\(Kind.namespace == .secureValue ? "\"set\"" : "\"value\"")}, then
                {"op":"set",...} and {"op":"reset",...} lines\(Kind.namespace == .secureValue ? " (names and sequences only: a secret's watch never shows it)" : "").
                With --from SEQ: {"op":"resumed",...} first; if it changed since, "history-gone" and a fresh "loaded".

                Example:
                  storectl \(Kind.command) watch theme
                """)
    }

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The name.") var name: String
    @Option(help: ArgumentHelp("Resume after this sequence.", valueName: "sequence")) var from: UInt64?
    @Option(help: ArgumentHelp("The epoch --from belongs to (default: the current one).", valueName: "epoch")) var epoch: UInt64?

    func run() async throws {
        try await reporting {
            let connection = try await global.connect()
            let label = "\"name\":\(JSON.string(name))"
            var start = SubscriptionStart.snapshot
            if let from {
                var resumeEpoch = epoch
                if resumeEpoch == nil {
                    resumeEpoch = try await connection.value(name, in: Kind.namespace).position.epoch
                }
                start = .resume(epoch: resumeEpoch!, sequence: from)
                Output.line("{\"op\":\"resumed\",\(label),\"epoch\":\(resumeEpoch!),\"sequence\":\(from)}")
            }
            func shown(_ state: ValueState) -> String {
                switch state {
                case .unset: Kind.namespace == .secureValue ? "\"set\":false" : "\"value\":null"
                case .set(let payload): "\"value\":\(JSON.embed(payload.bytes))"
                case .setWithheld: "\"set\":true"
                }
            }
            for try await push in connection.follow(Kind.namespace, name: name, from: start) {
                switch push {
                case .valueLoaded(let at, let state):
                    Output.line(
                        "{\"op\":\"loaded\",\(label),\"epoch\":\(at.epoch),\"sequence\":\(at.sequence),\(shown(state))}")
                case .valueEvent(let at, let state):
                    switch state {
                    case .unset: Output.line("{\"op\":\"reset\",\(label),\"sequence\":\(at.sequence)}")
                    case .set: Output.line("{\"op\":\"set\",\(label),\"sequence\":\(at.sequence),\(shown(state))}")
                    case .setWithheld: Output.line("{\"op\":\"set\",\(label),\"sequence\":\(at.sequence)}")
                    }
                case .historyGone(let notice):
                    Output.line("{\"op\":\"history-gone\",\(label),\"epoch\":\(notice.epoch),\"sequence\":\(notice.sequence)}")
                case .lagged(let notice):
                    // The library resumes from the last state printed (a value's only history is its latest
                    // state: the broker answers "history gone" and the current state if it moved on).
                    Output.line("{\"op\":\"lagged\",\(label),\"epoch\":\(notice.epoch),\"sequence\":\(notice.sequence)}")
                default: break
                }
            }
            // It ends without an error only if the broker ended the subscription.
            throw Failure(Failure.unavailable, "the subscription ended")
        }
    }
}
