#ifndef STOREBROKER_THREAD_SANITIZER_HOOKS_H
#define STOREBROKER_THREAD_SANITIZER_HOOKS_H

// ThreadSanitizer's annotations, for locks it cannot see (Swift's Mutex on Linux hands a contended lock over in
// the kernel, FUTEX_LOCK_PI and FUTEX_UNLOCK_PI, which ThreadSanitizer does not intercept). The runtime defines
// these functions only in a build with `--sanitize=thread`; elsewhere the weak references are null and the
// hooks do nothing but test them.
void __tsan_acquire(void *address) __attribute__((weak));
void __tsan_release(void *address) __attribute__((weak));

/// Whether this process runs under ThreadSanitizer.
static inline int sb_tsan_active(void) {
    return __tsan_acquire != 0;
}

/// The lock at `address` was acquired: what its last holder wrote before releasing it happened before now.
static inline void sb_tsan_acquire(void *address) {
    if (__tsan_acquire) __tsan_acquire(address);
}

/// The lock at `address` is about to be released.
static inline void sb_tsan_release(void *address) {
    if (__tsan_release) __tsan_release(address);
}

#endif
