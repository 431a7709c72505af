import StoreBrokerClient

struct Note: Codable, Sendable, Identifiable { var id: String; var text: String }

let client = BrokerClient()                                         // the default socket; reconnects by itself
let notes = try await RemoteStore<Note>(client: client, loading: "notes")  // returns once loaded; throws
                                                                    // cannotConnect after 5 s with no broker
try await notes.insert(Note(id: "1", text: "milk"))                 // replaces in place if "1" exists
try await notes.insert([Note(id: "2", text: "eggs"), Note(id: "3", text: "tea")])
try await notes.remove(id: "2")
try await notes.chain().remove(id: "3").insert(Note(id: "4", text: "bread")).run()  // one atomic commit
print(notes.items.map(\.text), notes.item(id: "4")?.text ?? "-")    // ["milk", "bread"] bread

do {
    try await notes.insert(Note(id: "5", text: "jam"), expecting: notes.sequence - 1)  // a stale sequence
} catch {
    print(error.isConflict ? "someone wrote in between: read again and retry" : "\(error)")  // StoreBrokerError
}

let darkMode = RemoteValue(client: client, key: "dark-mode", default: false)    // Boutique's @StoredValue
try await darkMode.valueHasLoaded()
try await darkMode.toggle()                                         // compare-and-set: no update lost
let token = RemoteSecureValue<String>(client: client, key: "api-token")         // @SecurelyStoredValue
try await token.set("s3cr3t")                                       // nil removes it
print(darkMode.value, token.value ?? "-")
