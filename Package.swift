// swift-tools-version:6.0
import PackageDescription

// Layers (each target may import only those below it):
//   Wire          the binary protocol; NIOCore only, never a socket
//   BrokerCore    store semantics; no networking, no dlopen
//   EngineLoader  finds and dlopens storage engines
//   storebrokerd, storectl, wiredump   thin executables
let package = Package(
    name: "storebroker",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Wire", targets: ["Wire"]),
        .executable(name: "storebrokerd", targets: ["storebrokerd"]),
        .executable(name: "storectl", targets: ["storectl"]),
        .executable(name: "wiredump", targets: ["wiredump"]),
        // Storage engines: each a shared library libstorebroker-engine-NAME.so beside the daemon binary.
        .library(name: "storebroker-engine-memory", type: .dynamic, targets: ["MemoryEngine"]),
        .library(name: "storebroker-engine-sqlite", type: .dynamic, targets: ["SQLiteEngine"]),
        .library(name: "storebroker-engine-disk", type: .dynamic, targets: ["DiskEngine"]),
        .library(name: "storebroker-engine-c-example", type: .dynamic, targets: ["CExampleEngine"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2")
    ],
    targets: [
        .target(
            name: "Wire",
            dependencies: [.product(name: "NIOCore", package: "swift-nio")]
        ),
        .target(name: "BrokerCore", dependencies: ["Wire", .product(name: "NIOCore", package: "swift-nio")]),
        // The engine ABI: one C header, shared by the loader, the engines and engines written elsewhere.
        .target(name: "CStorageEngine"),
        .target(
            name: "EngineLoader",
            dependencies: ["BrokerCore", "CStorageEngine", "Wire", .product(name: "NIOCore", package: "swift-nio")]
        ),
        // Helpers for engines written in Swift; linked into each engine library, never into the host.
        .target(name: "StorageEngineKit", dependencies: ["CStorageEngine"]),
        .target(name: "MemoryEngine", dependencies: ["StorageEngineKit", "CStorageEngine"], path: "Sources/Engines/memory"),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .target(
            name: "SQLiteEngine", dependencies: ["StorageEngineKit", "CStorageEngine", "CSQLite"],
            path: "Sources/Engines/sqlite"),
        .target(name: "DiskEngine", dependencies: ["StorageEngineKit", "CStorageEngine"], path: "Sources/Engines/disk"),
        // The example engine in plain C (examples/c-engine), built like the others.
        .target(name: "CExampleEngine", dependencies: ["CStorageEngine"], path: "examples/c-engine", sources: ["engine.c"],
            publicHeadersPath: "."),
        .executableTarget(name: "storebrokerd", dependencies: ["Wire", "BrokerCore", "EngineLoader"]),
        .executableTarget(name: "storectl", dependencies: ["Wire"]),
        .executableTarget(
            name: "wiredump",
            dependencies: ["Wire", .product(name: "NIOCore", package: "swift-nio")]
        ),
        .testTarget(
            name: "WireTests",
            dependencies: [
                "Wire",
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
        // The engine conformance suite and the loader's tests: engines are loaded from the build directory
        // through EngineLoader, never linked.
        .testTarget(
            name: "EngineTests",
            dependencies: [
                "BrokerCore", "EngineLoader", "Wire", .product(name: "NIOCore", package: "swift-nio"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
