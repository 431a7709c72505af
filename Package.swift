// swift-tools-version:6.2
import PackageDescription

// Layers (each target may import only those below it):
//   ErrorShape        the one shape of every layer's error (code, message, cause, location); no dependencies
//   Locking           Locked: Swift's Mutex with ThreadSanitizer told of its hand-overs; no dependencies
//   StoreModel        the data stores are made of (ids, payloads, records, conditions, commits, pushes,
//                     error codes); no codec, no I/O
//   Wire              the binary protocol over StoreModel; NIOCore only, never a socket
//   BrokerCore        store semantics, sequences, events, subscriptions, in its own commands, answers and
//                     errors; no Wire, no networking, no dlopen
//   EngineLoader      finds and dlopens storage engines
//   EngineConformance the engine contract as checks (storebroker-engine-check and the tests run it)
//   BrokerServer      the daemon: the Unix socket (NIOPosix), connections, paths, start-up and shutdown
//   StoreBrokerClient the client connection (its own poll thread, NIOCore buffers and futures): typed calls
//                     over StoreModel, what storectl and applications use; Wire stays behind it
//   storebrokerd, storectl, wiredump   thin executables
// Release builds of the modules on the request path skip the runtime exclusivity checks (`swift_beginAccess` on
// every access to a class's stored property, and in NIO's `ByteBuffer` code inlined into ours): 7.6% of the
// daemon's samples under pipelined gets (docs/BENCHMARKS.md, "Figures behind choices in the code"). Debug builds, which the tests run,
// keep them. (Tools version 6.2: from then on a package depending on this one accepts such a flag.)
let requestPath: [SwiftSetting] = [.unsafeFlags(["-enforce-exclusivity=unchecked"], .when(configuration: .release))]

let package = Package(
    name: "storebroker",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Wire", targets: ["Wire"]),
        .library(name: "StoreBrokerClient", targets: ["StoreBrokerClient"]),
        // For users' tests: a temporary broker in the test process (`withTemporaryBroker`).
        .library(name: "StoreBrokerTesting", targets: ["StoreBrokerTesting"]),
        .executable(name: "storebrokerd", targets: ["storebrokerd"]),
        .executable(name: "storectl", targets: ["storectl"]),
        .executable(name: "wiredump", targets: ["wiredump"]),
        // The engine conformance checker: any engine file against the ABI's contract (docs/ENGINE-ABI.md).
        .executable(name: "storebroker-engine-check", targets: ["storebroker-engine-check"]),
        // The load generator: our protocol measured the way redis-benchmark measures Redis.
        .executable(name: "storebroker-benchmark", targets: ["storebroker-benchmark"]),
        // Storage engines: each a shared library libstorebroker-engine-NAME.so beside the daemon binary.
        .library(name: "storebroker-engine-memory", type: .dynamic, targets: ["MemoryEngine"]),
        .library(name: "storebroker-engine-sqlite", type: .dynamic, targets: ["SQLiteEngine"]),
        .library(name: "storebroker-engine-disk", type: .dynamic, targets: ["DiskEngine"]),
        .library(name: "storebroker-engine-wal", type: .dynamic, targets: ["WALEngine"]),
        // Preloaded by the conformance checker into a child whose power cut it simulates (power-loss property).
        .library(name: "storebroker-powercut", type: .dynamic, targets: ["CPowerCut"]),
        // The wal engine's file format, for its fuzz target (Fuzz/); its one public symbol is `WALFuzzing`.
        .library(name: "WALFormat", targets: ["WALFormat"]),
        // PostgreSQL (libpq): stores shared by brokers on several hosts (docs/DISTRIBUTED.md).
        .library(name: "storebroker-engine-postgres", type: .dynamic, targets: ["PostgresEngine"]),
        .library(name: "storebroker-engine-c-example", type: .dynamic, targets: ["CExampleEngine"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "3.12.3"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
    ],
    targets: [
        .target(name: "ErrorShape"),
        // Swift's Mutex told to ThreadSanitizer (its contended hand-over happens in the kernel, out of its sight).
        .target(name: "CThreadSanitizer"),
        .target(name: "Locking", dependencies: ["CThreadSanitizer"], swiftSettings: requestPath),
        .target(
            name: "StoreModel", dependencies: ["OrderedStorage", .product(name: "NIOCore", package: "swift-nio")],
            swiftSettings: requestPath),
        .target(
            name: "Wire",
            dependencies: ["StoreModel", .product(name: "NIOCore", package: "swift-nio")],
            swiftSettings: requestPath
        ),
        // An insertion-ordered table with stable positions: the broker's in-memory stores and the Swift engines.
        .target(name: "OrderedStorage", swiftSettings: requestPath),
        .target(
            name: "BrokerCore",
            dependencies: [
                "Locking", "StoreModel", "ErrorShape", "OrderedStorage",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "DequeModule", package: "swift-collections"),
            ],
            swiftSettings: requestPath
        ),
        // The engine ABI: one C header, shared by the loader, the engines and engines written elsewhere.
        .target(name: "CStorageEngine"),
        .target(name: "CPowerCut", linkerSettings: [.linkedLibrary("dl")]),
        .target(
            name: "EngineLoader",
            dependencies: [
                "Locking", "BrokerCore", "CStorageEngine", "StoreModel", "ErrorShape",
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: requestPath
        ),
        // The engine conformance suite, shared by the checker and the tests (no copy).
        .target(
            name: "EngineConformance",
            dependencies: [
                "BrokerCore", "EngineLoader", "StoreModel", "TestSupport", .product(name: "NIOCore", package: "swift-nio"),
            ]
        ),
        .executableTarget(name: "storebroker-engine-check", dependencies: ["EngineConformance", "EngineLoader", "TestSupport"]),
        // Helpers for engines written in Swift; linked into each engine library, never into the host.
        .target(
            name: "StorageEngineKit", dependencies: ["CStorageEngine", "OrderedStorage", "ErrorShape"],
            swiftSettings: requestPath),
        .target(
            name: "MemoryEngine", dependencies: ["StorageEngineKit", "CStorageEngine"],
            path: "Sources/Engines/memory", swiftSettings: requestPath),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .target(
            name: "SQLiteEngine", dependencies: ["StorageEngineKit", "CStorageEngine", "CSQLite"],
            path: "Sources/Engines/sqlite", swiftSettings: requestPath),
        .target(
            name: "DiskEngine", dependencies: ["StorageEngineKit", "CStorageEngine", "OrderedStorage"],
            path: "Sources/Engines/disk", swiftSettings: requestPath),
        .target(
            name: "WALFormat", dependencies: ["StorageEngineKit", "CStorageEngine"], swiftSettings: requestPath),
        .target(
            name: "WALEngine", dependencies: ["WALFormat", "StorageEngineKit", "CStorageEngine"],
            path: "Sources/Engines/wal", swiftSettings: requestPath),
        .systemLibrary(name: "CLibPQ", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),
        .target(
            name: "PostgresEngine", dependencies: ["StorageEngineKit", "CStorageEngine", "CLibPQ"],
            path: "Sources/Engines/postgres", swiftSettings: requestPath),
        // The example engine in plain C (examples/c-engine), built like the others.
        .target(name: "CExampleEngine", dependencies: ["CStorageEngine"], path: "examples/c-engine", sources: ["engine.c"],
            publicHeadersPath: "."),
        // libdbus-1 (D-Bus signals), and the publisher that runs it on a thread of its own.
        .systemLibrary(name: "CDBus", pkgConfig: "dbus-1", providers: [.apt(["libdbus-1-dev"])]),
        .target(
            name: "BrokerDBus",
            dependencies: [
                "Locking", "CDBus", "BrokerCore", "StoreModel", .product(name: "Logging", package: "swift-log"),
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .target(
            name: "BrokerServer",
            dependencies: [
                "Locking", "Wire", "BrokerCore", "EngineLoader", "BrokerDBus",
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ],
            swiftSettings: requestPath
        ),
        .target(
            name: "StoreBrokerClient",
            dependencies: [
                "Locking", "StoreModel", "ErrorShape", "Wire", "OrderedStorage",
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: requestPath
        ),
        .target(
            name: "StoreBrokerTesting",
            dependencies: [
                "BrokerServer", "BrokerCore", "StoreBrokerClient", .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "storebrokerd",
            dependencies: [
                "BrokerServer", .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .executableTarget(
            name: "storectl",
            dependencies: [
                // The client library's typed calls only: the protocol stays behind it.
                "Locking", "StoreBrokerClient", .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .executableTarget(
            name: "wiredump",
            dependencies: ["Wire", .product(name: "NIOCore", package: "swift-nio")]
        ),
        // Helpers shared by the test targets.
        .target(name: "TestSupport", path: "Tests/TestSupport"),
        .testTarget(
            name: "WireTests",
            dependencies: [
                "Wire", "TestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOTestUtils", package: "swift-nio"),
            ]
        ),
        // Benchmarks (release builds; see docs/BENCHMARKS.md).
        .executableTarget(
            name: "engine-bench",
            dependencies: ["BrokerCore", "EngineLoader", "CSQLite", .product(name: "NIOCore", package: "swift-nio")],
            path: "Benchmarks/engine-bench"
        ),
        // Store semantics, group commit and subscriptions, with an in-memory engine (no dlopen).
        .testTarget(
            name: "BrokerCoreTests",
            dependencies: [
                "BrokerCore", "StoreModel", "OrderedStorage", "TestSupport",
                .product(name: "NIOCore", package: "swift-nio"), .product(name: "Logging", package: "swift-log"),
                // NIOThreadPool: the threads for blocking work a test broker gets, as the daemon's does.
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        .testTarget(name: "BrokerDBusTests", dependencies: ["BrokerDBus", "Wire"]),
        // RemoteStore, RemoteValue and the testing product against a temporary broker in the test process.
        .testTarget(
            name: "ClientTests",
            dependencies: [
                "StoreBrokerClient", "StoreBrokerTesting", "Wire", "TestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
            ]
        ),
        // The connection handler on an EmbeddedChannel (no socket, virtual time).
        .testTarget(
            name: "BrokerServerTests",
            dependencies: [
                "BrokerServer", "BrokerCore", "Wire", "TestSupport", .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"), .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The real storebrokerd and storectl binaries on temporary sockets and data directories.
        .testTarget(
            name: "IntegrationTests",
            dependencies: ["Wire", "StoreBrokerClient", "TestSupport", .product(name: "NIOCore", package: "swift-nio")]
        ),
        // The two-process demo (examples/notes-demo.sh).
        .executableTarget(name: "notes-demo", dependencies: ["StoreBrokerClient"], path: "examples/notes-demo"),
        // The README's client snippet, verbatim (top-level code): Tests/IntegrationTests compares the two and runs it.
        .executableTarget(name: "readme-client", dependencies: ["StoreBrokerClient"], path: "examples/readme-client"),
        // docs/FROM-BOUTIQUE.md's snippets, compiled (ExampleTests checks that the document shows them as they are).
        .target(name: "FromBoutique", dependencies: ["StoreBrokerClient", "StoreBrokerTesting"], path: "examples/from-boutique"),
        .executableTarget(
            name: "storebroker-benchmark",
            dependencies: [
                "Wire", .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Benchmarks/storebroker-benchmark"
        ),
        // The SQLite side of the side-by-side run: the same work straight on one SQLite file.
        // The reliability suite's driver (scripts/reliability.sh, docs/RELIABILITY.md): crash rounds, live
        // fuzzing and load against the daemon built beside it.
        .executableTarget(
            name: "storebroker-reliability",
            dependencies: [
                "StoreBrokerClient", "TestSupport", .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Reliability/storebroker-reliability"
        ),
        .executableTarget(name: "sqlite-direct", dependencies: ["CSQLite"], path: "Benchmarks/sqlite-direct"),
        .executableTarget(
            name: "broker-bench",
            dependencies: ["StoreBrokerClient", "Wire", .product(name: "NIOCore", package: "swift-nio")],
            path: "Benchmarks/broker-bench"
        ),
        // The engine conformance suite and the loader's tests: engines are loaded from the build directory
        // through EngineLoader, never linked.
        .testTarget(
            name: "EngineTests",
            dependencies: [
                "BrokerCore", "EngineLoader", "EngineConformance", "Wire", "TestSupport", "WALFormat",
                .product(name: "NIOCore", package: "swift-nio"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
