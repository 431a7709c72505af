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
    /// The address that names this lock to ThreadSanitizer: a byte of its own under ThreadSanitizer, 0 elsewhere.
    /// Not the value's address: taking it (`withUnsafeMutablePointer(to: &value)`) is itself an access that
    /// ThreadSanitizer checks, before the acquisition could be announced, and was reported as a race with the
    /// previous holder's writes.
    @usableFromInline let tag: Int

    @inlinable
    public init(_ initialValue: consuming sending Value) {
        mutex = Mutex(initialValue)
        tag = sb_tsan_active() != 0 ? Int(bitPattern: UnsafeMutableRawPointer.allocate(byteCount: 1, alignment: 1)) : 0
    }

    deinit {
        UnsafeMutableRawPointer(bitPattern: tag)?.deallocate()
    }

    /// Runs `body` with the value, the lock held.
    @inlinable
    public borrowing func withLock<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        try mutex.withLock { (value: inout sending Value) throws(E) -> sending Result in
            let address = UnsafeMutableRawPointer(bitPattern: tag)
            sb_tsan_acquire(address)
            defer { sb_tsan_release(address) }
            return try body(&value)
        }
    }
}

extension Locked: Sendable where Value: ~Copyable {}
