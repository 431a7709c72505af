// swift-tools-version:6.0
// libFuzzer targets for the wire codec and the wal engine's log records (docs/RELIABILITY.md). A fuzz target has no `main` (libFuzzer brings
// one), so it cannot live in the main package, whose plain `swift build` would fail to link it. Build them
// with scripts/reliability.sh, or by hand:
//
//   swift build --package-path Fuzz --scratch-path .build-fuzz \
//       -Xswiftc -sanitize=fuzzer,address -Xswiftc -parse-as-library
import PackageDescription

let package = Package(
    name: "StoreBrokerFuzz",
    dependencies: [
        .package(name: "storebroker", path: ".."),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
    ],
    targets: [
        .target(name: "CFuzzerDriver"),
        .target(
            name: "FuzzSupport",
            dependencies: [
                "CFuzzerDriver", .product(name: "Wire", package: "storebroker"),
                .product(name: "NIOCore", package: "swift-nio"),
            ]
        ),
        .executableTarget(name: "FuzzFrames", dependencies: ["FuzzSupport"]),
        .executableTarget(name: "FuzzMessages", dependencies: ["FuzzSupport"]),
        .executableTarget(name: "FuzzServerSession", dependencies: ["FuzzSupport"]),
        .executableTarget(
            name: "FuzzWALRecords", dependencies: ["FuzzSupport", .product(name: "WALFormat", package: "storebroker")]),
    ]
)
