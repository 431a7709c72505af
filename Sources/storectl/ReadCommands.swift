import ArgumentParser
import Foundation
import StoreBrokerClient

struct Ping: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check that the broker answers; prints pong.",
        discussion: """
            With --wait, keeps trying for up to SECONDS (for scripts that just started the daemon): a broker
            that is not listening yet, closes the connection, refuses it as full or does not answer is tried
            again until then; exits 69 if the broker never answered.

            Example:
              storebrokerd & storectl ping --wait 10
            """)

    @OptionGroup var global: GlobalOptions
    @Option(help: ArgumentHelp("Keep trying for this long.", valueName: "seconds")) var wait: Double = 0

    func run() async throws {
        try await reporting {
            let deadline = ContinuousClock.now + .milliseconds(Int64(max(0, wait) * 1000))
            while true {
                // With --wait, an attempt may take what is left of the wait (at least 100 ms), but no more than
                // --timeout; without it, the one attempt has --timeout.
                var attempt = global.requestTimeout
                if wait > 0 {
                    let left = max(deadline - ContinuousClock.now, .milliseconds(100))
                    attempt = min(left, attempt ?? left)
                }
                do {
                    let connection = try await global.connect(timeout: attempt)
                    do {
                        try await connection.ping()
                    } catch {
                        await connection.close()
                        throw error
                    }
                    await connection.close()
                    Output.line("pong")
                    return
                } catch {
                    // Tried again while the broker is unreachable (exit 69), until the wait is over.
                    let failure = (error as? Failure) ?? (error as? StoreBrokerError).map { Failure($0) }
                    guard failure?.code == Failure.unavailable, ContinuousClock.now < deadline else { throw error }
                    try await Task.sleep(for: .milliseconds(50))
                }
            }
        }
    }
}

struct Query: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print items, in store order.",
        discussion: """
            ndjson (the default when stdout is not a terminal): each payload exactly as stored, one per line.
            json: one array. table (the default on a terminal): id, updatedAt and the item, cut to fit.
            --meta wraps each item as {"id","createdAt","updatedAt","item"} (times in ms since the Unix epoch).
            --id prints those items only, in the order given; exits 66 if any is missing (after printing the rest).
            --after ID starts after that id (exit 66 if it is no longer in the store); --limit caps the count.

            Examples:
              storectl query notes
              storectl query notes --after 41 --limit 10 --meta
            """)

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The store.", completion: .storeNames) var store: String
    @Option(name: .customLong("id"), help: "Only this id (repeatable).") var ids: [String] = []
    @Option(help: "At most this many items (0: all).") var limit: Int = 0
    @Option(help: "Start after this id.") var after: String?
    @Option(help: "ndjson, json or table.") var format: OutputFormat?
    @Flag(help: "Wrap each item with its id and timestamps.") var meta = false

    func validate() throws {
        if !ids.isEmpty, after != nil || limit != 0 { throw ValidationError("--id cannot be combined with --after or --limit") }
        guard (0...Int(UInt32.max)).contains(limit) else {
            throw ValidationError("--limit takes a number of items from 0 (all of them) to \(UInt32.max), not \(limit)")
        }
    }

    func run() async throws {
        try await reporting {
            let connection = try await global.connect()
            var records: [ItemRecord] = []
            var missing: [ItemID] = []
            var position = Position(epoch: 0, sequence: 0)
            if ids.isEmpty {
                records = try await connection.records(store, after: after.map { ItemID($0) }, limit: UInt32(limit)).value
            } else {
                let answer = try await connection.items(store, ids: ids.map { ItemID($0) })
                position = answer.position
                for slot in answer.value {
                    switch slot {
                    case .present(let record): records.append(record)
                    case .missing(let id): missing.append(id)
                    }
                }
            }
            await connection.close()
            print(records)
            if !missing.isEmpty { throw Self.absent(missing, of: store, at: position) }
        }
    }

    /// Items asked for that the store does not hold (exit 66): the store itself, when it does not exist (a store
    /// that never committed is at sequence 0), or the ids.
    static func absent(_ ids: [ItemID], of store: String, at position: Position) -> Failure {
        guard position.sequence > 0 else { return Failure(Failure.notFound, "store \(store) does not exist") }
        return Failure(Failure.notFound, "not in store \(store): " + ids.map { JSON.string($0.string) }.joined(separator: ", "))
    }

    /// `{"id","createdAt","updatedAt","item"}` for one record.
    static func metaLine(_ record: ItemRecord) -> String {
        "{\"id\":\(JSON.string(record.id.string)),\"createdAt\":\(record.createdAt),"
            + "\"updatedAt\":\(record.updatedAt),\"item\":\(JSON.embed(record.payload.bytes))}"
    }

    private func print(_ records: [ItemRecord]) {
        func rendered(_ record: ItemRecord) -> String {
            meta ? Self.metaLine(record) : JSON.embed(record.payload.bytes)
        }
        // --meta asks for the wrapped lines: on a terminal too, unless a table is asked for by name.
        switch format ?? (meta ? .ndjson : .automatic) {
        case .ndjson:
            for record in records {
                if meta {
                    Output.line(rendered(record))
                } else {
                    // Exactly as stored.
                    Output.bytes(Array(record.payload.bytes.readableBytesView) + [0x0A])
                }
            }
        case .json:
            Output.line(JSON.array(records.map(rendered)))
        case .table:
            Table.print(
                headers: ["ID", "UPDATED", "ITEM"],
                rows: records.map { record in
                    [record.id.string, Table.time(record.updatedAt), String(decoding: record.payload.bytes.readableBytesView, as: UTF8.self)]
                })
        }
    }
}

struct Count: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the number of items (0 for a store that does not exist).",
        discussion: "Example:\n  storectl count notes")

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The store.", completion: .storeNames) var store: String

    func run() async throws {
        try await reporting {
            let connection = try await global.connect()
            Output.line(String(try await connection.count(store).value))
        }
    }
}

struct Stores: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the stores that exist, in name order.",
        discussion: """
            ndjson: {"name","engine","epoch","sequence","count"} per store; json: an array of those; table: columns.
            A store that exists but cannot be served (its engine is missing, its files are lost or damaged) is
            listed with "broken": the reason, and the reason goes to stderr too; the exit status stays 0.

            Example:
              storectl stores --format json
            """)

    @OptionGroup var global: GlobalOptions
    @Option(help: "ndjson, json or table.") var format: OutputFormat?

    func run() async throws {
        try await reporting {
            let connection = try await global.connect()
            let stores = try await connection.stores()
            // A broken store's reason is the answer to a request on it.
            var reasons: [String: String] = [:]
            for info in stores where info.isBroken {
                do {
                    _ = try await connection.storeInfo(info.name)
                    reasons[info.name] = "cannot be served"
                } catch let error as StoreBrokerError {
                    reasons[info.name] = error.message
                }
                Output.error("store \(info.name) cannot be served: \(reasons[info.name]!)")
            }
            let objects = stores.map { info in
                "{\"name\":\(JSON.string(info.name)),\"engine\":\(JSON.string(info.engine)),\"epoch\":\(info.epoch),"
                    + "\"sequence\":\(info.sequence),\"count\":\(info.count)"
                    + (reasons[info.name].map { ",\"broken\":\(JSON.string($0))" } ?? "") + "}"
            }
            switch format ?? .automatic {
            case .ndjson: objects.forEach(Output.line)
            case .json: Output.line(JSON.array(objects))
            case .table:
                Table.print(
                    headers: ["NAME", "COUNT", "SEQUENCE", "ENGINE", "STATUS"],
                    rows: stores.map { info in
                        let status = reasons[info.name].map { "broken: \($0)" } ?? "ok"
                        return [info.name, String(info.count), String(info.sequence), info.engine, status]
                    })
            }
        }
    }
}

struct Engines: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List every engine file on the daemon's search path, loaded or not.",
        discussion: """
            ndjson: {"name","status","abi","capabilities","detail","path"} per file. status "loaded": abi,
            capabilities and detail (the version) are the engine's; "found": not opened (listing never loads a
            file, which would run its code), abi null; "refused": detail says why, abi null.

            Example:
              storectl engines
            """)

    @OptionGroup var global: GlobalOptions
    @Option(help: "ndjson, json or table.") var format: OutputFormat?

    func run() async throws {
        try await reporting {
            let connection = try await global.connect()
            let engines = try await connection.engines()
            func status(_ info: EngineInfo) -> String {
                switch info.status {
                case .found: "found"
                case .loaded: "loaded"
                case .refused: "refused"
                }
            }
            func abi(_ info: EngineInfo) -> String? {
                info.status == .loaded ? "\(info.abiMajor).\(info.abiMinor)" : nil
            }
            func capabilities(_ info: EngineInfo) -> [String] {
                (info.capabilities.contains(.persistent) ? ["persistent"] : [])
                    + (info.capabilities.contains(.atomic) ? ["atomic"] : [])
                    + (info.capabilities.contains(.nonblocking) ? ["nonblocking"] : [])
                    + (info.capabilities.contains(.shared) ? ["shared"] : [])
            }
            let objects = engines.map { info in
                "{\"name\":\(JSON.string(info.name)),\"status\":\"\(status(info))\",\"abi\":\(abi(info).map(JSON.string) ?? "null"),"
                    + "\"capabilities\":\(JSON.array(capabilities(info).map(JSON.string))),"
                    + "\"detail\":\(JSON.string(info.detail)),\"path\":\(JSON.string(info.path))}"
            }
            switch format ?? .automatic {
            case .ndjson: objects.forEach(Output.line)
            case .json: Output.line(JSON.array(objects))
            case .table:
                Table.print(
                    headers: ["NAME", "STATUS", "ABI", "CAPABILITIES", "DETAIL", "PATH"],
                    rows: engines.map {
                        [$0.name, status($0), abi($0) ?? "-", capabilities($0).joined(separator: ","), $0.detail, $0.path]
                    })
            }
        }
    }
}

/// Aligned columns for a terminal; the last column is cut to the terminal's width.
enum Table {
    /// Columns padded to the width each cell takes on a terminal (a CJK character takes two columns, a
    /// combining mark none), the last column cut to the terminal's width.
    static func print(headers: [String], rows: [[String]]) {
        let clean = rows.map { $0.map { $0.replacingOccurrences(of: "\n", with: " ") } }
        var widths = headers.map(width)
        for row in clean {
            for (index, cell) in row.enumerated().dropLast() { widths[index] = max(widths[index], width(cell)) }
        }
        var size = winsize()
        let columns = ioctl(STDOUT_FILENO, UInt(TIOCGWINSZ), &size) == 0 && size.ws_col > 0 ? Int(size.ws_col) : 120
        func line(_ cells: [String]) -> String {
            var out = ""
            var used = 0
            for (index, cell) in cells.enumerated() {
                if index == cells.count - 1 {
                    out += cut(cell, to: max(10, columns - used))
                } else {
                    out += cell + String(repeating: " ", count: widths[index] + 2 - width(cell))
                    used += widths[index] + 2
                }
            }
            return out
        }
        Output.line(line(headers))
        for row in clean { Output.line(line(row)) }
    }

    /// Milliseconds since the Unix epoch as local ISO 8601 time (`TZ`, else the system's zone).
    static func time(_ milliseconds: UInt64) -> String {
        let date = Date(timeIntervalSince1970: Double(milliseconds) / 1000)
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime]
        formatter.timeZone = .current
        return formatter.string(from: date)
    }

    /// The columns `text` takes on a terminal: 2 for each East Asian wide or fullwidth character (and emoji),
    /// 0 for a combining mark or zero-width character, 1 otherwise.
    static func width(_ text: String) -> Int { text.reduce(0) { $0 + width($1) } }

    static func width(_ character: Character) -> Int {
        guard let scalar = character.unicodeScalars.first else { return 0 }
        switch scalar.value {
        case 0x0300...0x036F, 0x200B...0x200F, 0xFE00...0xFE0F: return 0
        case 0x1100...0x115F, 0x2E80...0x303E, 0x3041...0x33FF, 0x3400...0x4DBF, 0x4E00...0x9FFF, 0xA000...0xA4CF,
            0xAC00...0xD7A3, 0xF900...0xFAFF, 0xFE30...0xFE4F, 0xFF00...0xFF60, 0xFFE0...0xFFE6, 0x1F300...0x1F64F,
            0x1F900...0x1F9FF, 0x20000...0x3FFFD:
            return 2
        default: return 1
        }
    }

    /// `text` cut to at most `columns` columns, with "…" where it was cut.
    static func cut(_ text: String, to columns: Int) -> String {
        guard width(text) > columns else { return text }
        var out = ""
        var used = 0
        for character in text {
            let next = width(character)
            if used + next > columns - 1 { break }
            out.append(character)
            used += next
        }
        return out + "…"
    }
}

/// `get STORE ID`: one item, as redis-cli's `GET` and `dconf read` give one value.
struct Get: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print one item exactly as stored; exit 66 if the store does not hold it.",
        discussion: """
            --meta wraps it as {"id","createdAt","updatedAt","item"} (times in ms since the Unix epoch). For
            several ids: query STORE --id A --id B.

            Example:
              storectl get notes 42
            """)

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The store.", completion: .storeNames) var store: String
    @Argument(help: "The item's id.") var id: String
    @Flag(help: "Wrap it with its id and timestamps.") var meta = false

    func run() async throws {
        try await reporting {
            let connection = try await global.connect()
            let answer = try await connection.items(store, ids: [ItemID(id)])
            await connection.close()
            guard case .present(let record) = answer.value.first else {
                throw Query.absent([ItemID(id)], of: store, at: answer.position)
            }
            if meta {
                Output.line(Query.metaLine(record))
            } else {
                Output.bytes(Array(record.payload.bytes.readableBytesView) + [0x0A])
            }
        }
    }
}
