import Foundation
import Wire

// storectl's commands need the daemon; until it exists this binary only reports what it is.
let arguments = CommandLine.arguments.dropFirst()
if arguments.contains("--version") {
    print("storectl \(StoreBrokerVersion.string)")
} else if arguments.contains("--help") || arguments.contains("-h") {
    print("""
        USAGE: storectl [--version] [--help]

        The store broker command-line client. Its commands arrive with the daemon;
        this build implements the wire protocol library only.
        """)
} else {
    FileHandle.standardError.write(Data("storectl: no commands are implemented in this build yet (see README.md)\n".utf8))
    exit(70)
}
