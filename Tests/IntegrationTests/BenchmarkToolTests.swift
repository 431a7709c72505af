import Foundation
import TestSupport
import Testing

extension Integration {
    /// storebroker-benchmark against a temporary daemon: every test, redis-benchmark's CSV shape (issue "Measure
    /// like redis-benchmark"). Figures are not checked here: speed lives in scripts/bench-side-by-side.sh.
    @Suite struct BenchmarkTool {
        @Test func everyTestRunsAndPrintsRedisBenchmarksCSV() async throws {
            try await Daemon.with(arguments: ["--engine", "memory"]) { daemon in
                let tests = ["ping", "insert", "get", "batch", "chain", "range"]
                for test in tests {
                    let result = try await runProgram(
                        [binDirectory + "/storebroker-benchmark", "-s", daemon.socketPath, "-n", "200", "-c", "4", "-P", "3",
                         "-r", "50", "-b", "10", "-t", test, "--csv"],
                        in: daemon.directory)
                    #expect(result.status == 0, "\(test): \(result.stderr)")
                    let lines = result.stdout.split(separator: "\n").map(String.init)
                    #expect(lines.first == #""test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms""#)
                    #expect(lines.count == 2, "\(test): \(result.stdout)")
                    let fields = lines.last?.split(separator: ",").map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "\"")) } ?? []
                    #expect(fields.count == 8 && fields.first == test, "\(lines)")
                    let numbers = fields.dropFirst().compactMap(Double.init)
                    #expect(numbers.count == 7 && numbers[0] > 0, "\(fields)")
                    // min <= p50 <= p95 <= p99 <= max
                    #expect(numbers.count == 7 && numbers[2] <= numbers[3] && numbers[3] <= numbers[4] && numbers[4] <= numbers[5] && numbers[5] <= numbers[6], "\(fields)")
                    #expect(result.stderr.contains("# \(test): client CPU") && result.stderr.contains(" 0 errors"), "\(result.stderr)")
                }
                // The store really got the writes.
                #expect(try await daemon.storectl(["count", "bench"]).status == 0)
            }
        }
    }
}
