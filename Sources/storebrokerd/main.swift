import Foundation
import Wire

// The daemon is built in the daemon issue; until then this binary only reports what it is, and says plainly
// that it cannot serve yet rather than pretending to.
let arguments = CommandLine.arguments.dropFirst()
if arguments.contains("--version") {
    print("storebrokerd \(StoreBrokerVersion.string) (protocol \(WireProtocol.supportedVersions.map(String.init).joined(separator: ", ")))")
} else if arguments.contains("--help") || arguments.contains("-h") {
    print("""
        USAGE: storebrokerd [--version] [--help]

        The store broker daemon. This build implements the wire protocol library only;
        the daemon itself (stores, engines, the socket server) is not built yet.
        """)
} else {
    FileHandle.standardError.write(Data("storebrokerd: the daemon is not implemented in this build yet (see README.md)\n".utf8))
    exit(70)
}
