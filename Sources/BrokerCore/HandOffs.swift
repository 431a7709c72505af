#if canImport(Glibc)
import Glibc
#endif

/// The hand-offs to other threads that one commit makes, held until it has made them all.
///
/// A commit gives a connection up to two things: the event in the connection's subscription (offered first)
/// and the answer to its write. Each tells the connection's event loop that something is waiting; handed off
/// one by one, the loop can take the event, write it and flush before the answer has been posted, and the
/// client is woken twice (and sees its answer before its event only a little later). During `gathering`,
/// whoever would hand off on this thread (`handOff`) is held until the commit has offered and answered
/// everything; then each connection, which gathers what is waiting for it in one inbox, is handed off once.
///
/// The core knows nothing of event loops: it only marks where a commit's deliveries begin and end.
public enum HandOffs {
    /// Runs `body`; the hand-offs asked for on this thread meanwhile run when it returns, in the order asked.
    static func gathering<R>(_ body: () -> R) -> R {
        let held = Held.current
        held.depth += 1
        defer {
            held.depth -= 1
            if held.depth == 0, !held.handOffs.isEmpty {
                // Taken out whole and the spare put in its place (a copy emptied with `keepingCapacity` would
                // allocate a new buffer, the old one being still shared); run, emptied, kept as the next spare.
                var handOffs: [() -> Void] = []
                swap(&handOffs, &held.handOffs)
                swap(&held.handOffs, &held.spare)
                for handOff in handOffs { handOff() }
                handOffs.removeAll(keepingCapacity: true)
                held.spare = handOffs
            }
        }
        return body()
    }

    /// Runs `handOff` now, or, during a `gathering` on this thread, when the gathering ends.
    public static func handOff(_ handOff: @escaping () -> Void) {
        guard let held = Held.existing, held.depth > 0 else { return handOff() }
        held.handOffs.append(handOff)
    }

    /// One thread's held hand-offs (a thread-specific value: only that thread touches it).
    private final class Held {
        var depth = 0
        var handOffs: [() -> Void] = []
        var spare: [() -> Void] = []

        static let key: pthread_key_t = {
            var key = pthread_key_t()
            let status = pthread_key_create(&key) { pointer in
                if let pointer { Unmanaged<Held>.fromOpaque(pointer).release() }
            }
            precondition(status == 0, "pthread_key_create failed: \(status)")
            return key
        }()

        static var existing: Held? {
            pthread_getspecific(key).map { Unmanaged<Held>.fromOpaque($0).takeUnretainedValue() }
        }

        static var current: Held {
            if let existing { return existing }
            let made = Held()
            pthread_setspecific(key, Unmanaged.passRetained(made).toOpaque())
            return made
        }
    }
}
