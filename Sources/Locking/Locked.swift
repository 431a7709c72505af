import CThreadSanitizer
import Synchronization

/// Swift's `Mutex`, told to ThreadSanitizer.
///
/// On Linux a contended `Mutex` is acquired and released by the kernel (`FUTEX_LOCK_PI`, `FUTEX_UNLOCK_PI`),
/// where ThreadSanitizer cannot see it: every access made under such a lock after a contended hand-over was
/// reported as a race. `withLock` announces the acquisition and the release to ThreadSanitizer; in a build without
/// it the announcement is a test of a null weak symbol.
public struct Locked<Value: ~Copyable>: ~Copyable {
    @usableFromInline let mutex: Mutex<Value>

    @inlinable
    public init(_ initialValue: consuming sending Value) {
        mutex = Mutex(initialValue)
    }

    /// Runs `body` with the value, the lock held.
    @inlinable
    public borrowing func withLock<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        try mutex.withLock { (value: inout sending Value) throws(E) -> sending Result in
            // The value's address names the lock: it is fixed for the Mutex's lifetime and unique to it.
            let address = withUnsafeMutablePointer(to: &value) { UnsafeMutableRawPointer($0) }
            sb_tsan_acquire(address)
            defer { sb_tsan_release(address) }
            return try body(&value)
        }
    }
}

extension Locked: Sendable where Value: ~Copyable {}
