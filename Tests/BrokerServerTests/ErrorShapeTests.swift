#if canImport(Glibc)
import Glibc
#endif
import BrokerCore
@testable import BrokerServer
import EngineLoader
import ErrorShape
import Testing

// Every layer's error has the same shape: a stable code, a message, the error it came from and where it was
// decided. These follow real failures through the layers and read the chain back.

@Suite struct ErrorShapeTests {
    /// A missing engine: the daemon's error, the loader's under it, each with its code and its own location.
    @Test func aMissingEngineKeepsTheLoadersErrorAsItsCause() throws {
        let provider = LoaderEngineProvider(loader: EngineLoader(searchPath: EngineSearchPath(directories: ["/nonexistent"])))
        let error = try #require(throws: DaemonError.self) {
            try provider.validate(BrokerConfiguration(dataDirectory: "/tmp/unused", defaultEngine: "nothing"))
        }
        #expect(error.codeName == "engine")
        #expect(error.location.fileID.hasSuffix("LoaderEngineProvider.swift"))
        let cause = try #require(error.underlying as? EngineLoadError)
        #expect(cause.codeName == "notFound")
        #expect(cause.location.fileID.hasPrefix("EngineLoader/"))
        #expect(error.causes.count == 2)
        #expect(error.detailedDescription.contains("engine: ") && error.detailedDescription.contains(" <- notFound: "))
    }

    /// A system call's failure: the errno travels as a `SystemError`, not only as text.
    @Test func aSystemCallsFailureIsTheUnderlyingError() throws {
        let error = try #require(throws: DaemonError.self) { try DataDirectoryLock(directory: "/nonexistent/data") }
        #expect(error.codeName == "dataDirectory")
        #expect((error.underlying as? SystemError)?.code == ENOENT)
        #expect(error.message == "cannot open /nonexistent/data/.lock: No such file or directory")
        #expect(error.location.fileID == "BrokerServer/Paths.swift")
    }

    /// A broker error keeps an engine's failure under it, and `context` keeps both cause and location.
    @Test func contextKeepsCauseAndLocation() {
        let engine = EngineFailure(.full, "no space left on device", engine: "sqlite", underlying: SystemError(code: ENOSPC))
        let error = BrokerError(.storageFull, "the disk is full", underlying: engine).context("store notes: ")
        #expect(error.message == "store notes: the disk is full")
        #expect(error.location.fileID == "BrokerServerTests/ErrorShapeTests.swift")
        #expect(error.causes.count == 3)
        #expect(error.detailedDescription.hasPrefix("storageFull: store notes: the disk is full [BrokerServerTests/ErrorShapeTests.swift:"))
        #expect(error.detailedDescription.hasSuffix(" <- No space left on device"))
    }
}
