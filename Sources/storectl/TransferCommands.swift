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
    @Argument(help: "The store.", completion: .storeNames) var store: String
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
            One JSON object per line, with the id in --id-field (default "id"); blank lines are skipped. The
            input is streamed (a file is checked whole first: a bad line writes nothing). Without --atomic the
            items go in batches within the broker's limits (several commits, in order; a failure stops the import
            and what was sent before it stays). With --atomic they go as one chain: all or nothing, which must
            fit in one request (--max-batch items, one frame). A progress bar is drawn on stderr when it is a
            terminal.

            Example:
              storectl import notes notes.ndjson --atomic
            """)

    @OptionGroup var global: GlobalOptions
    @OptionGroup var condition: ConditionOptions
    @Argument(help: "The store.", completion: .storeNames) var store: String
    @Argument(help: "The NDJSON file, or - for stdin.", completion: .file()) var file: String
    @Option(name: .customLong("id-field"), help: "The field that holds the id.") var idField = "id"
    @Flag(help: "All items in one atomic commit.") var atomic = false

    func run() async throws {
        try await reporting {
            if atomic { return try await importAtomically() }
            // A file is read twice: once to check every line (so that a bad line writes nothing, and the
            // progress bar knows the total), once to send. Standard input is read once, as it comes: a bad line
            // stops the import there, and the commits before it stay. Either way memory holds one chunk of the
            // input and the batches in flight, not the file.
            var total = 0
            if file != "-" {
                let reader = try LineReader(path: file)
                while try nextItem(reader) != nil { total += 1 }
            }
            let reader = try LineReader(path: file)
            let connection = try await global.connect()
            let progress = Progress(label: "importing into \(store)", total: total)
            defer { progress.finish() }
            do {
                if let last = try await connection.insertInBatches(
                    store, condition: condition.condition, progress: progress.show,
                    from: { () throws(StoreBrokerError) -> Item? in
                        do {
                            return try nextItem(reader)
                        } catch {
                            throw StoreBrokerError(.cannotEncode, "\(error)", underlying: error)
                        }
                    })
                {
                    printWriteResult(last)
                }
            } catch let error as StoreBrokerError where error.underlying is Failure {
                throw error.underlying!
            }
        }
    }

    /// The next item of the input, nil at its end; a line that is not UTF-8 or not an item is an error naming it.
    private func nextItem(_ reader: LineReader) throws -> Item? {
        while let bytes = try reader.next() {
            if bytes.allSatisfy({ $0 == 0x20 || $0 == 0x09 || $0 == 0x0D }) { continue }  // a blank line
            let place = "\(file) line \(reader.number)"
            guard let line = String(validating: bytes, as: UTF8.self) else {
                throw Failure(Failure.badInput, "\(place): not valid UTF-8")
            }
            return try JSON.item(Substring(line), idField: idField, where: place)
        }
        return nil
    }

    /// One chain, all or nothing: it must fit in one request, which is said before anything is sent.
    private func importAtomically() async throws {
        let reader = try LineReader(path: file)
        let connection = try await global.connect()
        let limits = connection.limits
        var items: [Item] = []
        var bytes = 0
        while let item = try nextItem(reader) {
            items.append(item)
            bytes += item.id.string.utf8.count + item.payload.count + 8
            // The chain's one step counts towards --max-batch too.
            if items.count + 1 > Int(limits.maxBatch) || bytes > Int(limits.maxFrameLength) - 1024 {
                throw Failure(
                    Failure.badInput,
                    "--atomic: the import does not fit in one request (the broker takes at most \(limits.maxBatch) items and ids, storebrokerd --max-batch, in one frame of \(limits.maxFrameLength) bytes, --max-frame); import it without --atomic (several commits, in order), or raise those limits; nothing was written")
            }
        }
        guard !items.isEmpty else { return }
        printWriteResult(try await connection.write(store, .chain([.insert(items: items)]), condition: condition.condition))
    }
}

/// An input read line by line, a chunk at a time: memory holds one chunk and one line, never the whole input.
final class LineReader {
    private let descriptor: Int32
    private let path: String
    private var buffer: [UInt8] = []
    private var chunk = [UInt8](repeating: 0, count: 1 << 20)
    private var start = 0
    private var scanned = 0
    private var atEnd = false
    /// The number of the line `next()` returned last, from 1.
    private(set) var number = 0

    /// `-` is standard input.
    init(path: String) throws {
        self.path = path
        if path == "-" {
            descriptor = STDIN_FILENO
        } else {
            descriptor = open(path, O_RDONLY | O_CLOEXEC)
            guard descriptor >= 0 else {
                throw Failure(Failure.notFound, "cannot read \(path): \(String(cString: strerror(errno)))")
            }
        }
    }

    deinit { if descriptor != STDIN_FILENO { close(descriptor) } }

    /// The next line's bytes, without its newline; nil at the end.
    func next() throws -> [UInt8]? {
        while true {
            let found = buffer.withUnsafeBytes { raw -> Int? in
                guard scanned < raw.count, let hit = memchr(raw.baseAddress! + scanned, 0x0A, raw.count - scanned) else {
                    return nil
                }
                return raw.baseAddress!.distance(to: UnsafeRawPointer(hit))
            }
            if let newline = found {
                let line = Array(buffer[start..<newline])
                start = newline + 1
                scanned = start
                number += 1
                return line
            }
            scanned = buffer.count
            if atEnd {
                guard start < buffer.count else { return nil }
                let line = Array(buffer[start...])
                start = buffer.count
                number += 1
                return line
            }
            buffer.removeFirst(start)
            scanned -= start
            start = 0
            let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress!, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw Failure(Failure.ioError, "cannot read \(path): \(String(cString: strerror(errno)))")
            }
            buffer.append(contentsOf: chunk[..<count])
            if count == 0 { atEnd = true }
        }
    }
}