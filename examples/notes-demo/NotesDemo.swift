// notes-demo: two processes sharing one `notes` store through the broker, with the Swift client library.
//
//   notes-demo watcher [--socket PATH] [--count N]   prints every change to the notes, as it happens
//   notes-demo writer  [--socket PATH] [--count N]   adds N notes, edits one, removes one, then a chain
//   notes-demo toggle  [--socket PATH] [--count N]   toggles the shared "demo-flag" N times (compare-and-set)
//
// Run a daemon (`storebrokerd --no-dbus`), then the watcher in one terminal and the writer in another; or
// `./examples/notes-demo.sh`, which does all of it on a temporary socket.
import Foundation
import StoreBrokerClient

struct Note: Codable, Sendable, Identifiable {
    var id: String
    var text: String
    var done = false
}

@main
enum NotesDemo {
    static func main() async throws {
        var arguments = Array(CommandLine.arguments.dropFirst())
        let mode = arguments.isEmpty ? "" : arguments.removeFirst()
        var socket = BrokerConnection.defaultSocketPath()
        var count = 5
        while !arguments.isEmpty {
            let flag = arguments.removeFirst()
            let value = arguments.isEmpty ? "" : arguments.removeFirst()
            switch flag {
            case "--socket": socket = value
            case "--count": count = Int(value) ?? count
            default:
                FileHandle.standardError.write(Data("notes-demo: unknown option \(flag)\n".utf8))
                exit(64)
            }
        }

        let client = BrokerClient(socketPath: socket, clientName: "notes-demo-\(mode)")

        switch mode {
        case "watcher":
            // Prints "ready" once loaded, then one line per event; exits after `count` insert or remove events.
            let notes = try await RemoteStore<Note>(client: client, loading: "notes")
            say("ready: \(notes.items.count) notes")
            var seen = 0
            for await event in notes.events {
                switch event.operation {
                case .initialized, .loaded: continue
                case .insert: say("insert \(event.items.map { "\($0.id)=\($0.text)\($0.done ? " (done)" : "")" }.joined(separator: ", "))")
                case .remove: say("remove \(event.items.map(\.id).joined(separator: ", "))")
                }
                seen += 1
                if seen >= count { break }
            }
            say("now: \(notes.items.map(\.text).joined(separator: " | "))")

        case "writer":
            let notes = RemoteStore<Note>(client: client, name: "notes")
            try await notes.itemsHaveLoaded()
            for n in 1...count {
                try await notes.insert(Note(id: "\(n)", text: "note \(n)"))
            }
            try await notes.insert(Note(id: "1", text: "note 1", done: true))  // replaced in place
            try await notes.remove(id: "2")
            // One atomic commit: every watcher sees both steps of it, or neither.
            try await notes.chain().remove(id: "3").insert(Note(id: "\(count + 1)", text: "added with a chain")).run()
            say("wrote: \(notes.items.map(\.text).joined(separator: " | "))")

        case "toggle":
            let flag = RemoteValue(client: client, key: "demo-flag", default: false)
            try await flag.valueHasLoaded()
            for _ in 0..<count { try await flag.toggle() }
            say("toggled \(count) times; now \(flag.value)")

        default:
            FileHandle.standardError.write(Data("usage: notes-demo watcher|writer|toggle [--socket PATH] [--count N]\n".utf8))
            exit(64)
        }
        await client.close()
    }

    /// One line, straight to stdout (so a reader sees it at once).
    static func say(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }
}
