#if canImport(Glibc)
import Glibc
#endif

/// glibc's per-thread cache of freed small blocks (`tcache`), enlarged before the daemon does anything else.
///
/// The daemon frees many blocks of one size at once (a commit's replaced items, its events' arrays, a read cycle's
/// decoded requests). glibc's thread cache keeps 7 blocks per size; the rest go to the arena's fast bins, which the
/// next allocation of a kilobyte or more must first consolidate (`malloc_consolidate`). With 1,024 per size, 50
/// clients `-P 16` inserting (memory engine) cost the owner loop 2.33 µs per insert instead of 2.68 µs
/// (docs/BENCHMARKS.md, "Figures behind choices in the code"); resident memory after the benchmark rows is
/// unchanged.
///
/// The cache's size is a glibc tunable, read only when a process starts, so the daemon executes itself again,
/// once, with `glibc.malloc.tcache_count` added to `GLIBC_TUNABLES`. A `GLIBC_TUNABLES` that already names
/// `tcache_count` is left as it is (the way to choose another size, or glibc's default of 7).
enum AllocatorTuning {
    static let tunable = "glibc.malloc.tcache_count"
    static let tuned = "\(tunable)=1024"
    /// Set for the second execution only, so that an environment glibc rewrites cannot make it loop.
    static let marker = "STOREBROKERD_ALLOCATOR_TUNED"

    /// The `GLIBC_TUNABLES` to run with, or `nil` when the current one already chooses the cache's size.
    static func tunables(adding current: String?) -> String? {
        guard let current, !current.isEmpty else { return tuned }
        if current.split(separator: ":").contains(where: { $0.hasPrefix(tunable + "=") }) { return nil }
        return current + ":" + tuned
    }

    /// Executes this program again with the tuned environment; returns when that is not needed or not possible
    /// (the daemon then runs with glibc's default).
    static func reexecuteIfNeeded() {
        #if os(Linux)
        if getenv(marker) != nil {
            unsetenv(marker)  // not inherited by anything the daemon starts
            return
        }
        let current = getenv("GLIBC_TUNABLES").map { String(cString: $0) }
        guard let wanted = tunables(adding: current) else { return }
        setenv("GLIBC_TUNABLES", wanted, 1)
        setenv(marker, "1", 1)
        execv("/proc/self/exe", CommandLine.unsafeArgv)
        // Not executed (no /proc, the binary replaced on disk): go on with glibc's default, the environment as it was.
        unsetenv(marker)
        if let current { setenv("GLIBC_TUNABLES", current, 1) } else { unsetenv("GLIBC_TUNABLES") }
        #endif
    }
}
