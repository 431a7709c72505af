import Foundation
import Observation
import StoreBrokerClient
import StoreBrokerTesting

// The Swift snippets of docs/FROM-BOUTIQUE.md, compiled with the package: the lines between `// snippet: NAME`
// and `// end: NAME` are the document's block NAME, letter for letter once indented alike (ExampleTests checks).

struct Note: Codable, Sendable, Identifiable, Equatable {
    let id: String
    var text: String
}

struct Bookmark: Codable, Sendable {
    let url: URL
    let title: String
}

func creating() async throws {
    // snippet: create
    // Identifiable items with String ids: the id is the cache identifier, as in Boutique.
    let notes = RemoteStore<Note>(name: "notes")
    // Anything else names its identifier.
    let bookmarks = RemoteStore<Bookmark>(name: "bookmarks", cacheIdentifier: \.url.absoluteString)
    // Returns once the items are loaded (Boutique's `try await Store(...)`).
    let loaded = try await RemoteStore<Note>(loading: "notes")
    // Another broker than the user's: a client of its socket.
    let elsewhere = RemoteStore<Note>(client: BrokerClient(socketPath: "/run/team/storebroker.sock"), name: "notes")
    // Or later, on a store made without waiting:
    try await notes.itemsHaveLoaded()
    // end: create
    _ = (bookmarks, loaded, elsewhere)
}

func writing(notes: RemoteStore<Note>, note: Note, first: Note, second: Note, freshNotes: [Note]) async throws {
    // snippet: crud
    try await notes.insert(note)                 // a new id is added, an existing one replaced in place
    try await notes.insert([first, second])      // one commit for both
    try await notes.remove(note)
    try await notes.remove([first, second])
    try await notes.removeAll()
    let all: [Note] = notes.items
    // end: crud
    // snippet: chain
    // One atomic commit (Boutique's `store.removeAll().insert(freshNotes).run()`):
    try await notes.chain().removeAll().insert(freshNotes).run()
    // end: chain
    _ = all
}

// snippet: controller
@Observable
final class NotesController {
    @ObservationIgnored
    @RemoteStored var notes: [Note]

    init(store: RemoteStore<Note>) {
        self._notes = RemoteStored(in: store)
    }

    func addNote(_ note: Note) async throws {
        try await self.$notes.insert(note)
    }

    func refresh(with freshNotes: [Note]) async throws {
        try await self.$notes.chain().removeAll().insert(freshNotes).run()
    }
}
// end: controller

func monitoring(controller: NotesController) async {
    // snippet: events
    for await event in controller.$notes.events {
        switch event.operation {
        case .initialized: print("store initialized")
        case .loaded: print("loaded \(event.items.count) notes\(event.afterLag ? " after falling behind" : "")")
        case .insert: print("inserted", event.items)
        case .remove: print("removed", event.items)
        }
    }
    // end: events
}

// snippet: values
@Observable
final class Preferences {
    @ObservationIgnored
    @RemoteStoredValue(key: "theme") var theme = "light"

    @ObservationIgnored
    @RemoteSecurelyStoredValue<String>(key: "authToken") var token

    func useDarkMode() async throws {
        try await $theme.set("dark")         // Boutique: $theme.set("dark"), not awaited
    }

    func signOut() async throws {
        try await $token.reset()
    }
}
// end: values

func testing() async throws {
    // snippet: testing
    try await withTemporaryBroker(engine: "memory") { client in
        // Inside the body, `BrokerClient.shared` is this broker's client: wrappers made here use it.
        let notes = RemoteStore<Note>(client: client, name: "notes")
        try await notes.insert(Note(id: "1", text: "milk"))
        let preferences = Preferences()
        try await preferences.useDarkMode()
    }
    // end: testing
}
