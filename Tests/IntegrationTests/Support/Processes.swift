import Foundation
import TestSupport

/// The repository's root (this file is Tests/IntegrationTests/Support/Processes.swift).
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent().path

/// A directory under /tmp with a short name (socket paths must stay under 108 bytes), removed afterwards.
func withTemporaryDirectory<T>(_ body: (String) async throws -> T) async throws -> T {
    try await TestSupport.withTemporaryDirectory(prefix: "sbi", body)
}

/// Polls `condition` every 20 ms, at most `seconds`: for waiting on something another process writes
/// (a line in a file), never for timing.
func eventually(within seconds: Double = 30, _ condition: () throws -> Bool) async rethrows -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return try condition()
}

/// Runs a command and returns its exit status.
func runCommand(_ arguments: [String], in directory: String) async throws -> Int32 {
    try await runProgram(arguments, in: directory).status
}
