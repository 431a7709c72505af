import BrokerCore
@testable import EngineLoader
import Foundation
import Synchronization
import Testing
import TestSupport
import Wire

final class StopFlag: Sendable {
    let value = Mutex(false)
    /// How many times the other thread has done its work (the link race: flips).
    let rounds = Atomic<Int>(0)
}

/// Runs a command (no shell) and waits for it; returns its exit status.
func run(_ arguments: [String]) -> Int32 {
    var pid: pid_t = 0
    let argv = arguments.map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    guard posix_spawnp(&pid, arguments[0], nil, nil, argv, environ) == 0 else { return -1 }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0, errno == EINTR {}
    return (status >> 8) & 0xFF
}

/// A C engine source whose table can be broken in chosen ways, compiled by the test.
let brokenEngineSource = #"""
    #include "storebroker_engine.h"
    #ifndef ABI_MAJOR
    #define ABI_MAJOR SB_ENGINE_ABI_MAJOR
    #endif
    #ifndef STRUCT_SIZE
    #define STRUCT_SIZE sizeof(storebroker_engine)
    #endif
    #ifndef ENGINE_NAME
    #define ENGINE_NAME "broken"
    #endif
    #ifndef CAPABILITIES
    #define CAPABILITIES 0
    #endif
    static int32_t chk(const storebroker_engine *e, const sb_option *p, size_t n, sb_error *error) { return 0; }
    static int32_t o(const storebroker_engine *e, const char *d, const char *s, const sb_option *p, size_t n,
                     sb_store **out, uint64_t *seq, sb_error *error) { error->code = SB_ERR_UNSUPPORTED; return 5; }
    static void c(sb_store *s) {}
    static int32_t dr(const storebroker_engine *e, const char *d, const char *s, const sb_option *p, size_t n,
                      sb_error *error) { return 5; }
    static int32_t ap(sb_store *s, const sb_step *st, size_t n, uint64_t q, sb_error *e) { return 5; }
    static int32_t sc(sb_store *s, sb_item_sink f, void *x, sb_error *e) { return 5; }
    static int32_t co(sb_store *s, uint64_t *n, sb_error *e) { return 5; }
    static const char *const keys[] = {NULL};
    static const storebroker_engine table = {
        ABI_MAJOR, 3, STRUCT_SIZE, ENGINE_NAME, "0.0.1", CAPABILITIES, keys, chk,
    #ifdef NULL_MEMBER
        o, c, dr, 0, sc, co,
    #else
        o, c, dr, ap, sc, co,
    #endif
    };
    #ifdef CONSTRUCTOR_MARKER
    #include <stdio.h>
    __attribute__((constructor)) static void marked(void) {
        FILE *f = fopen(CONSTRUCTOR_MARKER, "a");
        if (f) { fputs("ran\n", f); fclose(f); }
    }
    #endif
    #ifndef NO_ENTRY
    const storebroker_engine *storebroker_engine_entry(void) { return &table; }
    #else
    const storebroker_engine *some_other_symbol(void) { return &table; }
    #endif
    """#

/// Compiles the broken engine with `defines` into `directory` as engine `name`; returns its path.
func buildBrokenEngine(_ name: String, in directory: String, defines: [String]) throws -> String {
    let source = directory + "/broken.c"
    try brokenEngineSource.write(toFile: source, atomically: true, encoding: .utf8)
    let output = directory + "/libstorebroker-engine-\(name).so"
    let status = run(
        ["cc", "-shared", "-fPIC", "-I", repositoryRoot + "/Sources/CStorageEngine/include", "-o", output, source]
            + defines.map { "-D" + $0 })
    #expect(status == 0, "cc failed building \(name)")
    try FileManager.default.removeItem(atPath: source)
    return output
}

@Suite struct EngineLoaderTests {
    /// Builds the broken engine `name` with `defines` in a temporary directory and returns why it fails to load.
    func brokenLoadError(_ name: String, _ defines: [String]) async throws -> EngineLoadError {
        try await withTemporaryDirectory { directory in
            _ = try buildBrokenEngine(name, in: directory, defines: defines + ["ENGINE_NAME=\"\(name)\""])
            let error = try #require(loadError(EngineLoader(searchPath: .init(directories: [directory])), name))
            #expect(error.path == directory + "/libstorebroker-engine-\(name).so")
            return error
        }
    }

    func loadError(_ loader: EngineLoader, _ name: String) -> EngineLoadError? {
        do {
            _ = try loader.load(name)
            return nil
        } catch {
            return error
        }
    }

    @Test func theEnginesWeShipAreFoundBesideTheBinary() throws {
        for name in allEngines {
            let engine = try sharedLoader.load(name)
            #expect(engine.path.hasSuffix("/libstorebroker-engine-\(name).so"))
            #expect(engine.path.hasPrefix("/"))
        }
    }

    @Test func aWrongABIMajorIsRefusedBeforeAnythingIsCalled() async throws {
        let error = try await brokenLoadError("future", ["ABI_MAJOR=3"])
        #expect(error.reason == .abiMismatch)
        #expect(error.message.contains("built for engine ABI 3.3"))
        #expect(error.message.contains("this host speaks \(LoadedEngine.hostABI.major).\(LoadedEngine.hostABI.minor)"))
    }

    /// An engine built for ABI 1 is told what 2.0 changed.
    @Test func anABI1EngineIsToldWhatChanged() async throws {
        let error = try await brokenLoadError("old", ["ABI_MAJOR=1"])
        #expect(error.reason == .abiMismatch)
        #expect(error.message.contains("built for engine ABI 1.3"))
        #expect(error.message.contains("cut get, keys and contains and added check_options"))
    }

    @Test func aTableShorterThanABI1IsRefused() async throws {
        let error = try await brokenLoadError("short", ["STRUCT_SIZE=8"])
        #expect(error.reason == .abiMismatch)
        #expect(error.message.contains("table is 8 bytes"))
    }

    /// A minor version's members are never read past an engine's table: one that ends where ABI 2.0 ended loads,
    /// and shares no stores.
    @Test func aTableOfABI20LoadsIntoA21Host() async throws {
        try await withTemporaryDirectory { directory in
            _ = try buildBrokenEngine(
                "older", in: directory, defines: ["STRUCT_SIZE=offsetof(storebroker_engine,load)", "ENGINE_NAME=\"older\""])
            let engine = try EngineLoader(searchPath: .init(directories: [directory])).load("older")
            #expect(!engine.sharesStores)
            #expect(throws: EngineFailure.self) { _ = try engine.watch(options: [:]) }
        }
    }

    /// SB_CAP_SHARED without ABI 2.1's members (a table of 2.0's size, or NULL members) is refused by name.
    @Test func aSharedEngineWithoutTheSharedMembersIsRefused() async throws {
        let error = try await brokenLoadError("halfshared", ["CAPABILITIES=8"])
        #expect(error.reason == .invalidEngine)
        #expect(error.message.contains("SB_CAP_SHARED"))
    }

    @Test func aMissingEntrySymbolIsNamed() async throws {
        let error = try await brokenLoadError("nosym", ["NO_ENTRY"])
        #expect(error.reason == .missingSymbol)
        #expect(error.message.contains("storebroker_engine_entry"))
    }

    @Test func aNullMemberOrAWrongNameIsRefused() async throws {
        try await withTemporaryDirectory { directory in
            _ = try buildBrokenEngine("holes", in: directory, defines: ["NULL_MEMBER", "ENGINE_NAME=\"holes\""])
            let loader = EngineLoader(searchPath: .init(directories: [directory]))
            #expect(loadError(loader, "holes")?.reason == .invalidEngine)
            _ = try buildBrokenEngine("liar", in: directory, defines: ["ENGINE_NAME=\"someone-else\""])
            let error = try #require(loadError(loader, "liar"))
            #expect(error.reason == .invalidEngine)
            #expect(error.message.contains("someone-else"))
        }
    }

    @Test func aFileThatIsNotASharedObjectIsRefused() async throws {
        try await withTemporaryDirectory { directory in
            try "not an ELF file".write(
                toFile: directory + "/libstorebroker-engine-text.so", atomically: true, encoding: .utf8)
            let error = try #require(loadError(EngineLoader(searchPath: .init(directories: [directory])), "text"))
            #expect(error.reason == .notSharedObject)
        }
    }

    @Test func aWorldWritableFileIsRefused() async throws {
        try await withTemporaryDirectory { directory in
            let path = try buildBrokenEngine("open", in: directory, defines: ["ENGINE_NAME=\"open\""])
            chmod(path, 0o666)
            let error = try #require(loadError(EngineLoader(searchPath: .init(directories: [directory])), "open"))
            #expect(error.reason == .unsafePermissions)
            #expect(error.message.contains("world-writable"))
        }
    }

    @Test func aFileOwnedByAnotherUserIsRefused() async throws {
        guard getuid() == 0 else {
            print("EngineLoaderTests: skipped the other-owner case (needs root to chown)")
            return
        }
        try await withTemporaryDirectory { directory in
            let path = try buildBrokenEngine("theirs", in: directory, defines: ["ENGINE_NAME=\"theirs\""])
            #expect(chown(path, 65534, 65534) == 0)
            let error = try #require(loadError(EngineLoader(searchPath: .init(directories: [directory])), "theirs"))
            #expect(error.reason == .unsafePermissions)
            #expect(error.message.contains("owned by uid 65534"))
        }
    }

    @Test func notFoundListsEveryPathSearched() throws {
        let loader = EngineLoader(searchPath: .init(directories: ["/nonexistent/a", "/nonexistent/b"]))
        let error = try #require(loadError(loader, "nothing"))
        #expect(error.reason == .notFound)
        #expect(error.message.contains("/nonexistent/a/libstorebroker-engine-nothing.so"))
        #expect(error.message.contains("/nonexistent/b/libstorebroker-engine-nothing.so"))
        #expect(loadError(loader, "../etc/x")?.reason == .invalidName)
        // Engine names: A-Z a-z 0-9 _ -, from a letter or digit; no "." (it ends NAME in --engine-option NAME.KEY=VALUE).
        for bad in ["my.engine", "-x", "_x", "", String(repeating: "e", count: 65), "é"] {
            #expect(loadError(loader, bad)?.reason == .invalidName, "\(bad.debugDescription)")
        }
        for good in ["c-example", "x_2", "9lives", String(repeating: "e", count: 64)] {
            #expect(loadError(loader, good)?.reason == .notFound, "\(good)")
        }
    }

    @Test func theSearchPathFollowsTheDocumentedOrder() {
        let path = EngineSearchPath.standard(
            engineDirectories: ["/flag/one", "relative"], environmentPath: "/env/a::/env/b",
            executablePath: "/opt/sb/bin/storebrokerd")
        let cwd = FileManager.default.currentDirectoryPath
        #expect(
            path.directories == [
                "/flag/one", EngineSearchPath.normalized(cwd + "/relative"), "/env/a", "/env/b", "/opt/sb/bin",
                "/opt/sb/lib/storebroker/engines",
            ])
    }

    @Test func listingShowsEveryFileWithItsVersionOrWhyItCannotLoad() async throws {
        try await withTemporaryDirectory { directory in
            _ = try buildBrokenEngine("future", in: directory, defines: ["ABI_MAJOR=3", "ENGINE_NAME=\"future\""])
            try "junk".write(toFile: directory + "/libstorebroker-engine-junk.so", atomically: true, encoding: .utf8)
            try "ignored".write(toFile: directory + "/README", atomically: true, encoding: .utf8)
            // The directory first, then the build directory: a file there named like ours shadows nothing, and one
            // here named "memory" would shadow the real one.
            let memory = try sharedLoader.load("memory")
            let copy = directory + "/libstorebroker-engine-memory.so"
            try FileManager.default.copyItem(atPath: memory.path, toPath: copy)
            let buildDirectory = (memory.path as NSString).deletingLastPathComponent
            let loader = EngineLoader(searchPath: .init(directories: [directory, buildDirectory]))
            _ = try loader.load("sqlite")
            #expect(throws: EngineLoadError.self) { try loader.load("future") }
            let listing = loader.list()
            let byPath = Dictionary(uniqueKeysWithValues: listing.map { ($0.path, $0.info) })
            #expect(byPath[directory + "/libstorebroker-engine-future.so"]?.status == .refused)
            #expect(byPath[directory + "/libstorebroker-engine-future.so"]?.detail.contains("ABI 3.3") == true)
            #expect(byPath[directory + "/libstorebroker-engine-junk.so"]?.status == .refused)
            #expect(byPath[directory + "/libstorebroker-engine-junk.so"]?.detail.contains("not a shared object") == true)
            #expect(byPath[copy]?.status == .found)
            #expect(byPath[buildDirectory + "/libstorebroker-engine-memory.so"]?.status == .refused)
            #expect(byPath[buildDirectory + "/libstorebroker-engine-memory.so"]?.detail.contains("shadowed by") == true)
            #expect(byPath[buildDirectory + "/libstorebroker-engine-sqlite.so"]?.status == .loaded)
            #expect(byPath[buildDirectory + "/libstorebroker-engine-sqlite.so"]?.abiMajor == 2)
            #expect(byPath[buildDirectory + "/libstorebroker-engine-disk.so"]?.status == .found)
            #expect(!loader.isLoaded(path: buildDirectory + "/libstorebroker-engine-disk.so"))
            #expect(!listing.contains { $0.path.hasSuffix("README") })
        }
    }

    /// Listing runs no engine code: a file's constructor runs only when it is loaded (before: listing loaded
    /// every file on the search path).
    @Test func listingRunsNoEngineCode() async throws {
        try await withTemporaryDirectory { directory in
            let marker = directory + "/constructor-ran"
            _ = try buildBrokenEngine("marked", in: directory, defines: ["ENGINE_NAME=\"marked\"", "CONSTRUCTOR_MARKER=\"\(marker)\""])
            let loader = EngineLoader(searchPath: .init(directories: [directory]))
            #expect(loader.list().first?.info.status == .found)
            #expect(!FileManager.default.fileExists(atPath: marker), "listing ran the engine's constructor")
            _ = try loader.load("marked")
            #expect(FileManager.default.fileExists(atPath: marker))
            #expect(loader.list().first?.info.status == .loaded)
        }
    }

    /// Every directory above an engine must be owned by this user or root and not writable by others, unless it
    /// is sticky like /tmp (before: a .so in a world-writable directory or one owned by another user loaded).
    @Test func directoriesAboveAnEngineAreChecked() async throws {
        try await withTemporaryDirectory { directory in
            let engines = directory + "/engines"
            try FileManager.default.createDirectory(atPath: engines, withIntermediateDirectories: false)
            _ = try buildBrokenEngine("placed", in: engines, defines: ["ENGINE_NAME=\"placed\""])
            func attempt() -> EngineLoadError? { loadError(EngineLoader(searchPath: .init(directories: [engines])), "placed") }

            chmod(engines, 0o777)
            #expect(attempt()?.message.contains("the directory \(engines) is world-writable") == true)
            #expect(EngineLoader(searchPath: .init(directories: [engines])).list().first?.info.status == .refused)
            chmod(engines, 0o1777)  // sticky, like /tmp: others cannot replace our file
            #expect(attempt() == nil)
            chmod(engines, 0o755)
            if getuid() == 0 {
                chown(engines, 65534, 65534)
                #expect(attempt()?.message.contains("the directory \(engines) is owned by uid 65534") == true)
                // A link from a safe directory into it is checked where it really leads.
                chown(engines, 0, 0)
                let other = directory + "/theirs"
                try FileManager.default.createDirectory(atPath: other, withIntermediateDirectories: false)
                _ = try buildBrokenEngine("linked", in: other, defines: ["ENGINE_NAME=\"linked\""])
                chown(other, 65534, 65534)
                try FileManager.default.createSymbolicLink(
                    atPath: engines + "/libstorebroker-engine-linked.so", withDestinationPath: other + "/libstorebroker-engine-linked.so")
                let error = loadError(EngineLoader(searchPath: .init(directories: [engines])), "linked")
                #expect(error?.message.contains("the directory \(other) is owned by uid 65534") == true, "\(String(describing: error))")
            }
        }
    }

    /// A link swapped between the check and the load cannot make the loader run another file: 300 loads (each
    /// through a path of its own, so the dynamic linker cannot answer from its cache) while another thread flips a
    /// link between a safe engine and another user's, whose constructor leaves a mark; the mark never appears,
    /// and the other user's file is refused. (Before: the check followed the path, then dlopen followed it
    /// again; the other user's constructor ran within 40 daemon starts.)
    @Test func aLinkSwappedDuringTheLoadNeverRunsTheOtherFile() async throws {
        guard getuid() == 0 else {
            print("EngineLoaderTests: skipped the swap race (needs root to chown)")
            return
        }
        // Thousands of loads in a synchronous loop: off the cooperative pool.
        try await offThePool { try await withTemporaryDirectory { directory in
            let safe = directory + "/safe"
            let theirs = directory + "/theirs"
            for path in [safe, theirs] { try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false) }
            let good = try buildBrokenEngine("swap", in: safe, defines: ["ENGINE_NAME=\"swap\""])
            let marker = directory + "/evil-ran"
            let evil = try buildBrokenEngine("swap", in: theirs, defines: ["ENGINE_NAME=\"swap\"", "CONSTRUCTOR_MARKER=\"\(marker)\""])
            chown(evil, 65534, 65534)
            let flip = directory + "/current"
            try FileManager.default.createSymbolicLink(atPath: flip, withDestinationPath: good)

            let stop = StopFlag()
            let flipper = Thread {
                var toEvil = true
                while !stop.value.withLock({ $0 }) {
                    let staged = directory + "/staged"
                    unlink(staged)
                    symlink(toEvil ? evil : good, staged)
                    rename(staged, flip)
                    toEvil.toggle()
                    stop.rounds.add(1, ordering: .relaxed)
                }
            }
            flipper.start()
            // On a loaded machine the flipper may not run at first: the loads wait for it (bounded), and go on
            // past 300 until both outcomes have been seen (at most 3,000), so that the race is really run.
            for _ in 0..<2000 where stop.rounds.load(ordering: .relaxed) == 0 { usleep(5000) }
            var loads = 0
            var refusals = 0
            for attempt in 0..<3000 where attempt < 300 || loads == 0 || refusals == 0 {
                let search = directory + "/search-\(attempt)"
                mkdir(search, 0o755)
                symlink(flip, search + "/libstorebroker-engine-swap.so")
                do {
                    _ = try EngineLoader(searchPath: .init(directories: [search])).load("swap")
                    loads += 1
                } catch {
                    refusals += 1
                }
            }
            stop.value.withLock { $0 = true }
            #expect(!FileManager.default.fileExists(atPath: marker), "the other user's engine ran")
            #expect(loads > 0 && refusals > 0, "\(loads) loads, \(refusals) refusals: the link did not flip")
        } }
    }

    @Test func unknownOptionsAreRefusedAtStartUp() throws {
        let sqlite = try sharedLoader.load("sqlite")
        try sqlite.validate(options: ["synchronous": "FULL"])
        let error = try #require(throws: EngineLoadError.self) { try sqlite.validate(options: ["synchronus": "FULL"]) }
        #expect(error.reason == .unknownOption)
        #expect(error.message.contains("synchronus"))
        #expect(error.message.contains("synchronous"))
    }

    /// Values too: check_options refuses them at start-up, before any store is opened.
    @Test func badOptionValuesAreRefusedAtStartUp() throws {
        for (engine, key, value) in [
            ("sqlite", "synchronous", "SOMETIMES"), ("sqlite", "busy_timeout_ms", "soon"), ("disk", "checkpoint_every", "0"),
            ("c-example", "fail_after_steps", "abc"), ("memory", "fail_after_steps", "-1"),
        ] {
            let loaded = try sharedLoader.load(engine)
            let error = try #require(throws: EngineLoadError.self) { try loaded.validate(options: [key: value]) }
            #expect(error.reason == .invalidOption, "\(engine)")
            #expect(error.message.contains(key) && error.message.contains(value), "\(engine): \(error.message)")
        }
    }

    @Test func aBadOptionValueFailsOpenWithTheEnginesMessage() async throws {
        let sqlite = try sharedLoader.load("sqlite")
        try await withTemporaryDirectory { directory in
            let error = try await #require(throws: EngineFailure.self) {
                _ = try await sqlite.open(directory: directory, store: "s", options: ["synchronous": "SOMETIMES"])
            }
            #expect(error.code == .invalid)
            #expect(error.description.contains("engine sqlite"))
            #expect(error.message.contains("SOMETIMES"))
        }
    }
}

@Suite struct CExampleBuildTests {
    /// The documented plain-cc build of the C example gives a library the loader accepts.
    @Test func theCExampleBuildsWithPlainCCAndLoads() async throws {
        try await withTemporaryDirectory { directory in
            #expect(run(["/bin/sh", repositoryRoot + "/examples/c-engine/build.sh", directory]) == 0)
            let engine = try EngineLoader(searchPath: .init(directories: [directory])).load("c-example")
            #expect(engine.path == directory + "/libstorebroker-engine-c-example.so")
            #expect(engine.capabilities == [.persistent, .atomic])
            let store = try await engine.open(directory: directory, store: "s", options: [:])
            try await store.apply([.put(record("a", "1"))], sequence: 1)
            #expect(try await store.count() == 1)
            await store.close()
        }
    }
}
