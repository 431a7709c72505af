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
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2")
    ],
    targets: [
        .target(
            name: "Wire",
            dependencies: [.product(name: "NIOCore", package: "swift-nio")]
        ),
        .target(name: "BrokerCore", dependencies: ["Wire"]),
        .target(name: "EngineLoader", dependencies: ["BrokerCore"]),
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
    ],
    swiftLanguageModes: [.v6]
)
