import ArgumentParser
import Foundation
import StoreBrokerClient

struct Insert: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Insert or replace items (JSON objects); prints the new sequence.",
        discussion: """
            Items come from the arguments, or as NDJSON on stdin when none is given. An existing id is replaced in
            place. More items than the broker takes in one request go in several commits, in order; the last
            sequence is printed.

            Examples:
              storectl insert notes '{"id":"1","text":"milk"}' '{"id":"2","text":"eggs"}'
              cat notes.ndjson | storectl insert notes --id-field key
            """)

    @OptionGroup var global: GlobalOptions
    @OptionGroup var condition: ConditionOptions
    @Argument(help: "The store.", completion: .storeNames) var store: String
    @Argument(help: "Items as JSON objects; none: NDJSON on stdin.") var items: [String] = []
    @Option(name: .customLong("id-field"), help: "The field that holds the id.") var idField = "id"

    func run() async throws {
        try await reporting {
            var parsed: [Item] = []
            if items.isEmpty {
                for line in try JSON.standardInputLines() {
                    parsed.append(try JSON.item(line.text, idField: idField, where: "line \(line.number)"))
                }
            } else {
                for (index, text) in items.enumerated() {
                    parsed.append(try JSON.item(Substring(text), idField: idField, where: "argument \(index + 1)"))
                }
            }
            let connection = try await global.connect()
            let progress = Progress(label: "inserting into \(store)", total: parsed.count)
            defer { progress.finish() }
            if let last = try await connection.insertInBatches(
                store, parsed, condition: condition.condition, progress: progress.show)
            {
                printWriteResult(last)
            }
        }
    }
}

extension ParsableCommand {
    /// Makes one write on a new connection and prints its result.
    func write(_ global: GlobalOptions, _ write: (BrokerConnection) async throws -> CommitResult) async throws {
        try await reporting {
            printWriteResult(try await write(try await global.connect()))
        }
    }
}

struct Remove: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Remove items by id; prints the new sequence (nothing if none was there).",
        discussion: "Example:\n  storectl remove notes 1 2")

    @OptionGroup var global: GlobalOptions
    @OptionGroup var condition: ConditionOptions
    @Argument(help: "The store.", completion: .storeNames) var store: String
    @Argument(help: "The ids.") var ids: [String]

    func validate() throws {
        if ids.isEmpty { throw ValidationError("give at least one id") }
    }

    func run() async throws {
        try await write(global) { try await $0.write(store, .remove(ids.map { ItemID($0) }), condition: condition.condition) }
    }
}

struct Clear: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Remove every item (the store keeps existing); prints the new sequence.",
        discussion: "Example:\n  storectl clear notes")

    @OptionGroup var global: GlobalOptions
    @OptionGroup var condition: ConditionOptions
    @Argument(help: "The store.", completion: .storeNames) var store: String

    func run() async throws {
        try await write(global) { try await $0.write(store, .removeAll, condition: condition.condition) }
    }
}

struct Drop: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Delete a store and its data; prints 0 (nothing if it did not exist).",
        discussion: "Example:\n  storectl drop notes")

    @OptionGroup var global: GlobalOptions
    @OptionGroup var condition: ConditionOptions
    @Argument(help: "The store.", completion: .storeNames) var store: String

    func run() async throws {
        try await write(global) { try await $0.drop(store, condition: condition.condition) }
    }
}

struct Apply: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Apply NDJSON operations from stdin as one atomic chain; prints the new sequence.",
        discussion: """
            One operation per line:
              {"op":"insert","item":{...}}   {"op":"remove","id":"..."}   {"op":"removeAll"}
            Either every operation is committed or none is. The chain must fit in one frame.

            Example:
              printf '%s\\n' '{"op":"removeAll"}' '{"op":"insert","item":{"id":"1"}}' | storectl apply notes
            """)

    @OptionGroup var global: GlobalOptions
    @OptionGroup var condition: ConditionOptions
    @Argument(help: "The store.", completion: .storeNames) var store: String
    @Option(name: .customLong("id-field"), help: "The field of an inserted item that holds its id.")
    var idField = "id"

    func run() async throws {
        try await reporting {
            var steps: [ChainStep] = []
            for line in try JSON.standardInputLines() {
                let place = "line \(line.number)"
                guard let object = JSON.parse(line.text) as? [String: Any], let op = object["op"] as? String else {
                    throw Failure(Failure.badInput, "\(place): expected {\"op\": ...}")
                }
                switch op {
                case "insert":
                    guard let item = object["item"] as? [String: Any] else {
                        throw Failure(Failure.badInput, "\(place): an insert needs an \"item\" object")
                    }
                    let data = try JSONSerialization.data(withJSONObject: item, options: [.sortedKeys])
                    // Keep the item's bytes as written when they can be cut out of the line exactly.
                    let cut = Self.itemText(line.text).flatMap { text in
                        (JSON.parse(Substring(text)) as? NSDictionary)?.isEqual(to: item) == true ? text : nil
                    }
                    let text = cut ?? String(decoding: data, as: UTF8.self)
                    let parsed = Item(
                        id: try JSON.id(item[idField], field: idField, where: place), payload: Payload(text))
                    if case .insert(let items) = steps.last {
                        steps[steps.count - 1] = .insert(items: items + [parsed])
                    } else {
                        steps.append(.insert(items: [parsed]))
                    }
                case "remove":
                    let id = try JSON.id(object["id"], field: "id", where: place)
                    if case .remove(let ids) = steps.last {
                        steps[steps.count - 1] = .remove(ids: ids + [id])
                    } else {
                        steps.append(.remove(ids: [id]))
                    }
                case "removeAll":
                    steps.append(.removeAll)
                default:
                    throw Failure(Failure.badInput, "\(place): unknown op \(JSON.string(op)) (insert, remove, removeAll)")
                }
            }
            let connection = try await global.connect()
            do {
                printWriteResult(try await connection.write(store, .chain(steps), condition: condition.condition))
            } catch let error as StoreBrokerError where error.kind == .protocolViolation && error.code == .frameTooLarge {
                throw Failure(Failure.badInput, "the chain does not fit in one frame: \(error.message)")
            }
        }
    }

    /// The `item` object's text exactly as written in the line, when it can be cut out unambiguously.
    static func itemText(_ line: Substring) -> String? {
        guard let key = line.range(of: "\"item\"") else { return nil }
        var rest = line[key.upperBound...].drop { $0 == " " || $0 == "\t" }
        guard rest.first == ":" else { return nil }
        rest = rest.dropFirst().drop { $0 == " " || $0 == "\t" }
        guard rest.first == "{" else { return nil }
        // Find the matching brace, skipping strings.
        var depth = 0
        var inString = false
        var escaped = false
        for index in rest.indices {
            let char = rest[index]
            if inString {
                if escaped { escaped = false } else if char == "\\" { escaped = true } else if char == "\"" { inString = false }
                continue
            }
            switch char {
            case "\"": inString = true
            case "{": depth += 1
            case "}":
                depth -= 1
                if depth == 0 {
                    let text = String(rest[rest.startIndex...index])
                    return JSON.parse(Substring(text)) is [String: Any] ? text : nil
                }
            default: break
            }
        }
        return nil
    }
}
