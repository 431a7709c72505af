import CStorageEngine
import OrderedStorage
import StorageEngineKit

#if canImport(Glibc)
import Glibc
#endif

// The disk engine: one file per item, made atomic by a journal.
//
// Layout of a store's directory:
//   items/<position>     one file per item; <position> is 16 hex digits, the item's place in the store's
//                        order (a new key takes the next number; an overwrite keeps its number). Any key byte
//                        string is safe: keys live inside the files, never in their names.
//   journal-<sequence>   the redo log of one apply, kept until the next checkpoint
//   state                the checkpoint: sequence, next position and item count
//
// apply: resolve the steps to positions in memory; write the journal (fdatasync), rename it into place and
// fsync the directory: that single directory fsync is the commit point. Then install: write each item file in
// place and unlink removed ones, without fsyncs. Every 16 applies, and on close, a
// checkpoint flushes the installed files with one syncfs, records the state, and deletes the journals. On
// open, journals newer than the state are replayed in order (replay is idempotent: it rewrites exactly what
// the journal names), so an apply is either wholly there after a crash or not at all.
//
// A full disk: an apply whose journal cannot be written fails and changes nothing. An apply whose journal is
// durable is committed even if its item files cannot be written: those items are kept in memory (`unwritten`),
// served from there, and written at the next call once there is room; no checkpoint runs until they are, so
// the journals stay. Opening with the disk still full works the same way: the store is always readable.

@_cdecl("storebroker_engine_entry")
public func storebrokerEngineEntry() -> UnsafePointer<storebroker_engine> { diskEngineTable }

nonisolated(unsafe) private let diskEngineTable = EngineExport.table(for: DiskEngine())

final class DiskEngine: EngineDefinition {
    let name = "disk"
    let version = "1.0.0"
    let capabilities = UInt64(SB_CAP_PERSISTENT | SB_CAP_ATOMIC)
    let optionKeys = ["checkpoint_every", FailureInjection.optionKey]

    /// `checkpoint_every`, checked.
    private func checkpointEvery(_ options: [String: String]) throws(EngineError) -> Int {
        try EngineOptions.wholeNumber(options, "checkpoint_every", of: "applies", atLeast: 1) ?? 16
    }

    func checkOptions(_ options: [String: String]) throws(EngineError) {
        _ = try checkpointEvery(options)
        _ = try FailureInjection(options: options)
    }

    func open(directory: String, store: String, options: [String: String]) throws(EngineError)
        -> (store: any EngineStoreImplementation, sequence: UInt64)
    {
        let store = try DiskStore(
            directory: directory, checkpointEvery: try checkpointEvery(options), failure: try FailureInjection(options: options))
        return (store, store.sequence)
    }

    func drop(directory: String, store: String, options: [String: String]) throws(EngineError) {
        let items = directory + "/items"
        for name in try Files.list(items) { try Files.remove(items + "/" + name) }
        if rmdir(items) != 0, errno != ENOENT { throw EngineError.errno("cannot delete \(items)") }
        for name in try Files.list(directory) where name.hasPrefix("journal-") || name.hasPrefix("state") {
            try Files.remove(directory + "/" + name)
        }
        try Files.syncDirectory(directory)
    }
}

/// Where an item lives and its times; the payload stays on disk.
struct Slot {
    var position: UInt64
    var createdAt: UInt64
    var updatedAt: UInt64
}

/// A step resolved to positions, as the journal records it.
enum Resolved {
    case put(position: UInt64, key: [UInt8], createdAt: UInt64, updatedAt: UInt64, payload: [UInt8])
    case remove(position: UInt64)
    case removeAll(positions: [UInt64])
}

final class DiskStore: EngineStoreImplementation {
    let directory: String
    let itemsDirectory: String
    private(set) var sequence: UInt64 = 0
    private var nextPosition: UInt64 = 1
    /// How many items the last checkpoint or journal says the store holds: a missing item file is caught.
    private var expectedCount: UInt64 = 0
    private var table = OrderedTable<[UInt8], Slot>()
    private var journals: [String] = []
    private let checkpointEvery: Int
    private let failure: FailureInjection
    /// Item files a committed apply changed that could not be written yet (the disk was full): the item, or
    /// nil where the file must go. Reads look here first; every call tries to write them out.
    private var unwritten: [UInt64: ItemFile?] = [:]

    init(directory: String, checkpointEvery: Int, failure: FailureInjection) throws(EngineError) {
        self.directory = directory
        self.itemsDirectory = directory + "/items"
        self.checkpointEvery = checkpointEvery
        self.failure = failure
        try Files.makeDirectory(itemsDirectory)
        try recover()
        try loadIndex()
    }

    // MARK: Recovery and loading

    private func recover() throws(EngineError) {
        if let bytes = try Files.read(directory + "/state") {
            var decoder = Decoder(bytes, path: directory + "/state")
            try decoder.verifySeal()
            guard Array(try decoder.take(4)) == Array("SBDS".utf8) else {
                throw EngineError.corrupt("\(directory)/state is not a disk engine state file")
            }
            sequence = try decoder.u64()
            nextPosition = try decoder.u64()
            expectedCount = try decoder.u64()
        }
        var pending: [(sequence: UInt64, path: String)] = []
        for name in try Files.list(directory) {
            let path = directory + "/" + name
            if name.hasSuffix(".tmp") {
                try Files.remove(path)  // never committed
            } else if name.hasPrefix("journal-"), let journalSequence = UInt64(name.dropFirst(8), radix: 16) {
                if journalSequence > sequence {
                    pending.append((journalSequence, path))
                } else {
                    try Files.remove(path)  // already in the checkpoint
                }
            }
        }
        for name in try Files.list(itemsDirectory) where name.hasSuffix(".tmp") {
            try Files.remove(itemsDirectory + "/" + name)
        }
        guard !pending.isEmpty else { return }
        for (_, path) in pending.sorted(by: { $0.sequence < $1.sequence }) {
            guard let bytes = try Files.read(path) else { continue }
            let (journalSequence, next, count, steps) = try Self.decodeJournal(bytes, path: path)
            install(steps)
            sequence = journalSequence
            nextPosition = max(nextPosition, next)
            expectedCount = count
            journals.append(path)
        }
        // What could not be written (a full disk) is served from memory and written later.
        try? checkpoint()
    }

    private func loadIndex() throws(EngineError) {
        var found: [(Slot, [UInt8])] = []
        for name in try Files.list(itemsDirectory) {
            guard name.count == 16, let position = UInt64(name, radix: 16) else {
                throw EngineError.corrupt("unexpected file \(itemsDirectory)/\(name)")
            }
            guard unwritten[position] == nil else { continue }  // its file is stale or half written: memory has it
            let item = try readItem(position)
            found.append((Slot(position: position, createdAt: item.createdAt, updatedAt: item.updatedAt), item.key))
        }
        for case let (position, item?) in unwritten {
            found.append((Slot(position: position, createdAt: item.createdAt, updatedAt: item.updatedAt), item.key))
        }
        guard UInt64(found.count) == expectedCount else {
            throw EngineError.corrupt(
                "\(itemsDirectory) holds \(found.count) item files but the store has \(expectedCount) items; its files are damaged")
        }
        found.sort { $0.0.position < $1.0.position }
        for (slot, key) in found {
            table.put(key, slot)
            nextPosition = max(nextPosition, slot.position + 1)
        }
    }

    // MARK: Item files

    private func itemPath(_ position: UInt64) -> String {
        let hex = String(position, radix: 16)
        return itemsDirectory + "/" + String(repeating: "0", count: max(0, 16 - hex.count)) + hex
    }

    struct ItemFile {
        var key: [UInt8]
        var createdAt: UInt64
        var updatedAt: UInt64
        var payload: ArraySlice<UInt8>
    }

    private func readItem(_ position: UInt64) throws(EngineError) -> ItemFile {
        if let pending = unwritten[position] {
            guard let pending else { throw EngineError.corrupt("\(itemPath(position)) was removed") }
            return pending
        }
        let path = itemPath(position)
        guard let bytes = try Files.read(path) else {
            throw EngineError.corrupt("\(path) is missing; the store's files are damaged")
        }
        var decoder = Decoder(bytes, path: path)
        guard Array(try decoder.take(4)) == Array("SBDI".utf8) else {
            throw EngineError.corrupt("\(path) is not a disk engine item")
        }
        let createdAt = try decoder.u64()
        let updatedAt = try decoder.u64()
        let key = try decoder.blob()
        return ItemFile(key: key, createdAt: createdAt, updatedAt: updatedAt, payload: try decoder.take(decoder.remaining))
    }

    private func writeItem(
        position: UInt64, key: [UInt8], createdAt: UInt64, updatedAt: UInt64, payload: ArraySlice<UInt8>
    )
        throws(EngineError)
    {
        var encoder = Encoder()
        encoder.raw(Array("SBDI".utf8))
        encoder.u64(createdAt)
        encoder.u64(updatedAt)
        encoder.blob(key)
        encoder.raw(payload)
        // In place, with no temporary name: until the next checkpoint the journal can rewrite this file, so a
        // crash in the middle of this write is repaired by the replay.
        try Files.overwrite(itemPath(position), with: encoder.bytes)
    }

    // MARK: Journal

    private static func encodeJournal(sequence: UInt64, nextPosition: UInt64, count: Int, steps: [Resolved]) -> [UInt8] {
        var encoder = Encoder()
        encoder.raw(Array("SBDJ".utf8))
        encoder.u64(sequence)
        encoder.u64(nextPosition)
        encoder.u64(UInt64(count))
        encoder.u32(UInt32(steps.count))
        for step in steps {
            switch step {
            case .put(let position, let key, let createdAt, let updatedAt, let payload):
                encoder.u8(1)
                encoder.u64(position)
                encoder.u64(createdAt)
                encoder.u64(updatedAt)
                encoder.blob(key)
                encoder.blob(payload)
            case .remove(let position):
                encoder.u8(2)
                encoder.u64(position)
            case .removeAll(let positions):
                encoder.u8(3)
                encoder.u32(UInt32(positions.count))
                for position in positions { encoder.u64(position) }
            }
        }
        encoder.seal()
        return encoder.bytes
    }

    private static func decodeJournal(_ bytes: [UInt8], path: String) throws(EngineError)
        -> (UInt64, UInt64, UInt64, [Resolved])
    {
        var decoder = Decoder(bytes, path: path)
        try decoder.verifySeal()
        guard Array(try decoder.take(4)) == Array("SBDJ".utf8) else {
            throw EngineError.corrupt("\(path) is not a disk engine journal")
        }
        let sequence = try decoder.u64()
        let nextPosition = try decoder.u64()
        let count = try decoder.u64()
        var steps: [Resolved] = []
        for _ in 0..<(try decoder.u32()) {
            switch try decoder.u8() {
            case 1:
                let position = try decoder.u64()
                let createdAt = try decoder.u64()
                let updatedAt = try decoder.u64()
                let key = try decoder.blob()
                steps.append(.put(position: position, key: key, createdAt: createdAt, updatedAt: updatedAt, payload: try decoder.blob()))
            case 2: steps.append(.remove(position: try decoder.u64()))
            case 3:
                var positions: [UInt64] = []
                for _ in 0..<(try decoder.u32()) { positions.append(try decoder.u64()) }
                steps.append(.removeAll(positions: positions))
            case let kind: throw EngineError.corrupt("\(path) has an unknown step \(kind)")
            }
        }
        guard decoder.remaining == 8 else { throw EngineError.corrupt("\(path) has trailing bytes") }
        return (sequence, nextPosition, count, steps)
    }

    /// Makes the item files match the resolved steps (idempotent, so a replay may repeat it). While nothing waits
    /// in `unwritten` each file is written at once; a step that cannot be (a full disk) and every step after it
    /// are staged there instead, and while anything is staged so is every new step, so that a position's last
    /// state always wins.
    private func install(_ steps: [Resolved]) {
        guard unwritten.isEmpty else {
            stage(steps[...])
            try? writeUnwritten()
            return
        }
        for index in steps.indices {
            do throws(EngineError) {
                try write(steps[index])
            } catch {
                stage(steps[index...])
                return
            }
        }
    }

    private func write(_ step: Resolved) throws(EngineError) {
        switch step {
        case .put(let position, let key, let createdAt, let updatedAt, let payload):
            try writeItem(position: position, key: key, createdAt: createdAt, updatedAt: updatedAt, payload: payload[...])
        case .remove(let position):
            try Files.remove(itemPath(position))
        case .removeAll(let positions):
            for position in positions { try Files.remove(itemPath(position)) }
        }
    }

    /// Keeps what the steps do to the item files in `unwritten`, to be written by `writeUnwritten`; a later step
    /// on a position replaces an earlier one.
    private func stage(_ steps: ArraySlice<Resolved>) {
        for step in steps {
            switch step {
            case .put(let position, let key, let createdAt, let updatedAt, let payload):
                unwritten[position] = ItemFile(key: key, createdAt: createdAt, updatedAt: updatedAt, payload: payload[...])
            case .remove(let position):
                unwritten[position] = .some(nil)
            case .removeAll(let positions):
                for position in positions { unwritten[position] = .some(nil) }
            }
        }
    }

    /// Writes the staged item files, forgetting each once it is on disk; stops at the first failure (a full
    /// disk), keeping the rest for the next call.
    private func writeUnwritten() throws(EngineError) {
        for (position, item) in unwritten {
            if let item {
                try writeItem(
                    position: position, key: item.key, createdAt: item.createdAt, updatedAt: item.updatedAt,
                    payload: item.payload)
            } else {
                try Files.remove(itemPath(position))
            }
            unwritten[position] = nil
        }
    }

    /// Makes every installed file durable, records the state, and drops the journals it covers.
    private func checkpoint() throws(EngineError) {
        // The journals are the only durable copy of unwritten items: they stay until those are on disk.
        guard !journals.isEmpty, unwritten.isEmpty else { return }
        try Files.syncFilesystem(itemsDirectory)
        try Files.syncDirectory(itemsDirectory)
        var encoder = Encoder()
        encoder.raw(Array("SBDS".utf8))
        encoder.u64(sequence)
        encoder.u64(nextPosition)
        encoder.u64(expectedCount)
        encoder.seal()
        try Files.replace(directory + "/state", with: encoder.bytes, sync: true)
        try Files.syncDirectory(directory)
        // Journals up to `sequence` are skipped on open even if an unlink is lost in a crash.
        for path in journals { try Files.remove(path) }
        journals = []
    }

    // MARK: The ABI

    func apply(_ steps: UnsafeBufferPointer<sb_step>, sequence newSequence: UInt64) throws(EngineError) {
        try? writeUnwritten()  // room again after a full disk: catch up first
        // 1. Resolve to positions, in memory (rolled back on any failure before the commit point).
        table.begin()
        let savedNext = nextPosition
        var resolved: [Resolved] = []
        resolved.reserveCapacity(steps.count)
        do throws(EngineError) {
            for (index, step) in steps.enumerated() {
                try failure.check(stepIndex: index)
                try step.checkKey()
                switch Int(step.kind) {
                case SB_STEP_PUT:
                    let key = step.key.bytes
                    let position = table.value(for: key)?.position ?? nextPosition
                    if position == nextPosition { nextPosition += 1 }
                    table.put(key, Slot(position: position, createdAt: step.created_at, updatedAt: step.updated_at))
                    resolved.append(
                        .put(position: position, key: key, createdAt: step.created_at, updatedAt: step.updated_at,
                             payload: step.payload.bytes))
                case SB_STEP_REMOVE:
                    if let slot = table.remove(step.key.bytes) { resolved.append(.remove(position: slot.position)) }
                case SB_STEP_REMOVE_ALL:
                    var positions: [UInt64] = []
                    table.forEach { _, slot in
                        positions.append(slot.position)
                        return true
                    }
                    table.removeAll()
                    resolved.append(.removeAll(positions: positions))
                default:
                    throw EngineError.invalid("unknown step kind \(step.kind)")
                }
            }
            // 2. The journal, then the one directory fsync: the commit point.
            let name = String(newSequence, radix: 16)
            let path = directory + "/journal-" + String(repeating: "0", count: max(0, 16 - name.count)) + name
            try Files.replace(
                path,
                with: Self.encodeJournal(
                    sequence: newSequence, nextPosition: nextPosition, count: table.count, steps: resolved),
                sync: true)
            journals.append(path)
            do throws(EngineError) {
                try Files.syncDirectory(directory)
            } catch {
                journals.removeLast()
                try? Files.remove(path)
                throw error
            }
        } catch {
            table.rollback()
            nextPosition = savedNext
            throw error
        }
        table.commit()
        sequence = newSequence
        expectedCount = UInt64(table.count)
        // 3. Install. The apply is committed (its journal is durable), so it reports success whatever happens
        // now: files that cannot be written yet (a full disk) are served from memory and written at a later
        // call; their journals stay until then. A failed checkpoint only keeps the journals for longer.
        install(resolved)
        if journals.count >= checkpointEvery { try? checkpoint() }
    }

    func scan(emit: (UnsafePointer<sb_item>) -> Bool) throws(EngineError) {
        try table.visit { (key, slot) throws(EngineError) in try emitItem(slot, key: key, emit) }
    }

    private func emitItem(_ slot: Slot, key: [UInt8], _ emit: (UnsafePointer<sb_item>) -> Bool) throws(EngineError)
        -> Bool
    {
        let file = try readItem(slot.position)
        guard file.key == key else {
            throw EngineError.corrupt("\(itemPath(slot.position)) holds another key; the store's files are damaged")
        }
        return withItem(key: key, payload: Array(file.payload), createdAt: slot.createdAt, updatedAt: slot.updatedAt, emit)
    }

    func count() throws(EngineError) -> UInt64 { UInt64(table.count) }

    func close() {
        // A failed checkpoint loses nothing: the journals stay and are replayed on the next open.
        try? writeUnwritten()
        try? checkpoint()
    }
}
