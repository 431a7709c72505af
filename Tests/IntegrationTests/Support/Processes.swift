import Foundation
import TestSupport

/// The repository's root (this file is Tests/IntegrationTests/Support/Processes.swift).
let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent().path

/// A directory under /tmp with a short name (socket paths must stay under 108 bytes), removed afterwards.
func withTemporaryDirectory<T>(_ body: (String) async throws -> T) async throws -> T {
    try await TestSupport.withTemporaryDirectory(prefix: "sbi", body)
}

/// Runs a command and returns its exit status.
func runCommand(_ arguments: [String], in directory: String) async throws -> Int32 {
    try await runProgram(arguments, in: directory).status
}
