// Boutique's property wrappers, for the broker's shared stores and values. Their names carry `Remote` so that
// they do not clash with Boutique's (`@Stored`, `@StoredValue`, `@SecurelyStoredValue`) when a target imports
// both. Reading one tracks it for Observation (a SwiftUI body re-renders when another process writes); writes
// go through the projected value (`$notes.insert(...)`, `$darkMode.toggle()`), which is the mirror itself.

/// A store's items as a property (Boutique's `@Stored`); `$notes` is the `RemoteStore`.
///
/// ```swift
/// @RemoteStored(in: notesStore) var notes: [Note]
/// try await $notes.insert(Note(id: "1", text: "milk"))
/// ```
@propertyWrapper
public struct RemoteStored<Item: Codable & Sendable>: Sendable {
    public let projectedValue: RemoteStore<Item>

    public init(in store: RemoteStore<Item>) { projectedValue = store }

    public var wrappedValue: [Item] { projectedValue.items }
}

/// A shared value as a property (Boutique's `@StoredValue`); `$darkMode` is the `RemoteValue`.
///
/// ```swift
/// @RemoteStoredValue(key: "dark-mode") var darkMode = false
/// try await $darkMode.toggle()
/// ```
@propertyWrapper
public struct RemoteStoredValue<Value: Codable & Sendable>: Sendable {
    public let projectedValue: RemoteValue<Value>

    /// The initial value is the default, what `wrappedValue` is while the value is not set.
    public init(wrappedValue: Value, key: String, client: BrokerClient = .shared) {
        projectedValue = RemoteValue(client: client, key: key, default: wrappedValue)
    }

    public var wrappedValue: Value { projectedValue.value }
}

/// A secure value as a property (Boutique's `@SecurelyStoredValue`); `nil` when not set; `$token` is the
/// `RemoteSecureValue`.
///
/// ```swift
/// @RemoteSecurelyStoredValue<String>(key: "api-token") var token
/// try await $token.set("s3cr3t")
/// ```
@propertyWrapper
public struct RemoteSecurelyStoredValue<Value: Codable & Sendable>: Sendable {
    public let projectedValue: RemoteSecureValue<Value>

    public init(key: String, client: BrokerClient = .shared) {
        projectedValue = RemoteSecureValue(client: client, key: key)
    }

    public var wrappedValue: Value? { projectedValue.value }
}
