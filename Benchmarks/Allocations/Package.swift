// swift-tools-version:6.2
import PackageDescription

// The request path's allocations, counted with package-benchmark and checked against the committed thresholds in
// `Thresholds/` (docs/BENCHMARKS.md, "Allocations on the request path"). A package of its own, so that
// applications depending on storebroker never resolve the benchmark package.
//
// ordo-one/benchmark's default traits need swift-runtime-interposer, which is not among this machine's package
// copies; `MallocInterposer` alone gives the malloc counts these benchmarks check.
let package = Package(
    name: "storebroker-allocations",
    platforms: [.macOS(.v15)],
    dependencies: [
        // Named: a path dependency is otherwise known by its directory, which a clone may name anything.
        .package(name: "storebroker", path: "../.."),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/ordo-one/benchmark.git", from: "1.38.1", traits: ["MallocInterposer"]),
    ],
    targets: [
        .executableTarget(
            name: "RequestPath",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "StoreBrokerTesting", package: "storebroker"),
                .product(name: "Wire", package: "storebroker"),
                .product(name: "NIOCore", package: "swift-nio"),
                // Built beside the benchmark, where the in-process daemon's engine search finds it.
                .product(name: "storebroker-engine-memory", package: "storebroker"),
            ],
            path: "Benchmarks/RequestPath",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        )
    ],
    swiftLanguageModes: [.v6]
)
