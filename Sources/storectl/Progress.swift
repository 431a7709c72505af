import Foundation

/// `label: 45,000/100,000 items (45%)` redrawn in place on stderr, only when stderr is a terminal; with no
/// total known (an import from standard input), `label: 45,000 items`.
final class Progress {
    let label: String
    /// 0 when not known.
    let total: Int
    let enabled = isatty(STDERR_FILENO) == 1
    private var shown = false

    init(label: String, total: Int) {
        self.label = label
        self.total = total
    }

    func show(_ done: Int) {
        guard enabled else { return }
        shown = true
        let line =
            total > 0
            ? "\r\(label): \(done.formatted())/\(total.formatted()) items (\(done * 100 / total)%)"
            : "\r\(label): \(done.formatted()) items"
        FileHandle.standardError.write(Data(line.utf8))
    }

    func finish() {
        if enabled, shown { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}
