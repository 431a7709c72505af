import ArgumentParser
import Foundation
import StoreBrokerClient

struct Export: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print every item of a store as NDJSON, from one consistent snapshot.",
        discussion: """
            Each payload exactly as stored, one per line, in store order; all of them from the same commit, even
            while others write. `--meta` wraps each as {"id","createdAt","updatedAt","item"}. Standard error ends
            with the commit the snapshot is at, for `watch --from SEQ --epoch E` to go on from without a gap:
              storectl: exported 3 items of notes at sequence 42, epoch 7

            Example:
              storectl export notes > notes.ndjson
            """)

    @OptionGroup var global: GlobalOptions
    @Argument(help: "The store.") var store: String
    @Flag(help: "Wrap each item with its id and timestamps.") var meta = false

    func run() async throws {
        try await reporting {
            var out: [UInt8] = []
            let snapshot = try await global.connect().records(store)
            for record in snapshot.value {
                if meta {
                    out += Array(Query.metaLine(record).utf8)
                } else {
                    out += record.payload.bytes.readableBytesView
                }
                out.append(0x0A)
                if out.count > 1 << 20 {
                    Output.bytes(out)
                    out = []
                }
            }
            Output.bytes(out)
            FileHandle.standardError.write(Data(
                "storectl: exported \(snapshot.value.count) item\(snapshot.value.count == 1 ? "" : "s") of \(store) at sequence \(snapshot.position.sequence), epoch \(snapshot.position.epoch)\n".utf8))
        }
    }
}

struct Import: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Insert the items of an NDJSON file (or - for stdin); prints the last sequence.",
        discussion: """
            One JSON object per line, with the id in --id-field (default "id"); blank lines are skipped. Without
            --atomic the items go in batches within the broker's limits (several commits, in order; a failure
            stops the import and what was sent before it stays). With --atomic they go as one chain: all or
            nothing, which must fit in one request (--max-batch items, one frame). A progress bar is drawn on
            stderr when it is a terminal.

            Example:
              storectl import notes notes.ndjson --atomic
            """)

    @OptionGroup var global: GlobalOptions
    @OptionGroup var condition: ConditionOptions
    @Argument(help: "The store.") var store: String
    @Argument(help: "The NDJSON file, or - for stdin.") var file: String
    @Option(name: .customLong("id-field"), help: "The field that holds the id.") var idField = "id"
    @Flag(help: "All items in one atomic commit.") var atomic = false

    func run() async throws {
        try await reporting {
            let data: Data
            if file == "-" {
                data = FileHandle.standardInput.readDataToEndOfFile()
            } else {
                guard let contents = FileManager.default.contents(atPath: file) else {
                    throw Failure(Failure.notFound, "cannot read \(file)")
                }
                data = contents
            }
            var items: [Item] = []
            for line in try JSON.lines(of: data, source: "\(file) ") {
                items.append(try JSON.item(line.text, idField: idField, where: "\(file) line \(line.number)"))
            }
            let connection = try await global.connect()
            if atomic {
                guard !items.isEmpty else { return }
                do {
                    printWriteResult(
                        try await connection.write(store, .chain([.insert(items: items)]), condition: condition.condition))
                } catch let error as StoreBrokerError where error.kind == .protocolViolation {
                    throw Failure(Failure.badInput, "the import does not fit in one request; drop --atomic: \(error.message)")
                }
            } else {
                let progress = Progress(label: "importing into \(store)", total: items.count)
                defer { progress.finish() }
                if let last = try await connection.insertInBatches(
                    store, items, condition: condition.condition, progress: progress.show)
                {
                    printWriteResult(last)
                }
            }
        }
    }
}
