import Foundation

/// `label: 45,000/100,000 items (45%)` redrawn in place on stderr, only when stderr is a terminal.
struct Progress {
    let label: String
    let total: Int
    let enabled = isatty(STDERR_FILENO) == 1

    func show(_ done: Int) {
        guard enabled, total > 0 else { return }
        let line = "\r\(label): \(done.formatted())/\(total.formatted()) items (\(done * 100 / total)%)"
        FileHandle.standardError.write(Data(line.utf8))
    }

    func finish() {
        if enabled, total > 0 { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}
