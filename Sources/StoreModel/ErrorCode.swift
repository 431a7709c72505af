/// A stable numeric error code, as carried by the `error` and `goodbye` messages.
///
/// Values never change meaning once published; new codes are only ever added. A peer must accept codes it
/// does not know (they keep their raw value), so this is a struct rather than a closed enum.
///
/// - `0x0001`–`0x00FF`: protocol errors: the bytes broke the protocol.
/// - `0x0100`–`0x01FF`: request errors: a well-formed request that cannot be done.
/// - `0x0200`–`0x02FF`: server-side errors (engine, shutdown, internal).
///
/// Whether the connection survives depends on where the error is found, not on the code: see
/// `ServerSession` and docs/PROTOCOL.md ("Errors").
public struct ErrorCode: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible {
    public var rawValue: UInt16

    public init(rawValue: UInt16) {
        self.rawValue = rawValue
    }

    // Protocol errors.

    /// The bytes do not match the message layout: a truncated payload, trailing bytes, invalid UTF-8 where text
    /// is required, an unknown enumeration value, or an element count larger than the bytes that remain.
    public static let malformed = ErrorCode(rawValue: 0x0001)
    /// The frame's length is over the connection's current maximum.
    public static let frameTooLarge = ErrorCode(rawValue: 0x0002)
    /// The frame's message type is not one this protocol version defines.
    public static let unknownMessageType = ErrorCode(rawValue: 0x0003)
    /// Client and server share no protocol version.
    public static let unsupportedVersion = ErrorCode(rawValue: 0x0004)
    /// The first frame was not a valid `hello` (wrong type or wrong magic).
    public static let badHandshake = ErrorCode(rawValue: 0x0005)
    /// The frame sets a flag that is reserved, or sets `more` on a message that cannot span frames.
    public static let invalidFlags = ErrorCode(rawValue: 0x0006)
    /// A well-formed message that the receiver does not accept in this direction or state (for example a
    /// response type sent by a client, or a second `hello`).
    public static let unexpectedMessage = ErrorCode(rawValue: 0x0007)
    /// The peer did not complete its `hello` within the handshake timeout, or left a frame incomplete for the
    /// frame timeout; the connection is closed.
    public static let timedOut = ErrorCode(rawValue: 0x0008)

    // Request errors.

    /// A store or value name breaks the naming rules.
    public static let invalidName = ErrorCode(rawValue: 0x0100)
    /// An item id breaks the id rules (empty, over 1024 bytes, or containing U+0000).
    public static let invalidID = ErrorCode(rawValue: 0x0101)
    /// An item payload or a value is larger than the server's `maxItem`.
    public static let itemTooLarge = ErrorCode(rawValue: 0x0102)
    /// A request has more items, ids or steps than the server's `maxBatch`.
    public static let batchTooLarge = ErrorCode(rawValue: 0x0103)
    /// A conditional write found the store or value at another sequence; nothing was changed.
    public static let conflict = ErrorCode(rawValue: 0x0104)
    /// A range cursor names an id that is not (or no longer) in the store.
    public static let cursorGone = ErrorCode(rawValue: 0x0105)
    /// The named thing does not exist (a subscription id, for example).
    public static let notFound = ErrorCode(rawValue: 0x0106)
    /// The peer's uid may not do this.
    public static let permissionDenied = ErrorCode(rawValue: 0x0107)
    /// The request is well formed but not valid (for example a condition that the target cannot have).
    public static let invalidRequest = ErrorCode(rawValue: 0x0108)
    /// The store's engine cannot do this (for example a chain on an engine without atomic commits).
    public static let notSupported = ErrorCode(rawValue: 0x0109)

    // Server-side errors.

    /// The storage engine failed; nothing was committed.
    public static let engineError = ErrorCode(rawValue: 0x0200)
    /// The store's engine cannot be loaded; the store is not served (it is never served empty).
    public static let engineUnavailable = ErrorCode(rawValue: 0x0201)
    /// The disk is full; nothing was committed.
    public static let storageFull = ErrorCode(rawValue: 0x0202)
    /// The server is shutting down.
    public static let shuttingDown = ErrorCode(rawValue: 0x0203)
    /// A bug in the server.
    public static let internalError = ErrorCode(rawValue: 0x0204)
    /// The server is at its connection limit (`--max-connections`); the connection is closed. Try again later.
    public static let tooManyConnections = ErrorCode(rawValue: 0x0205)
    /// The connection holds as many subscriptions as it may (`--max-subscriptions`); unsubscribe first, or open
    /// another connection. The connection goes on.
    public static let tooManySubscriptions = ErrorCode(rawValue: 0x0206)

    /// Every code this version defines, with its name.
    public static let known: [(ErrorCode, String)] = [
        (.malformed, "malformed"), (.frameTooLarge, "frameTooLarge"),
        (.unknownMessageType, "unknownMessageType"), (.unsupportedVersion, "unsupportedVersion"),
        (.badHandshake, "badHandshake"), (.invalidFlags, "invalidFlags"),
        (.unexpectedMessage, "unexpectedMessage"), (.timedOut, "timedOut"), (.invalidName, "invalidName"), (.invalidID, "invalidID"),
        (.itemTooLarge, "itemTooLarge"), (.batchTooLarge, "batchTooLarge"), (.conflict, "conflict"),
        (.cursorGone, "cursorGone"), (.notFound, "notFound"), (.permissionDenied, "permissionDenied"),
        (.invalidRequest, "invalidRequest"), (.notSupported, "notSupported"), (.engineError, "engineError"),
        (.engineUnavailable, "engineUnavailable"), (.storageFull, "storageFull"),
        (.shuttingDown, "shuttingDown"), (.internalError, "internalError"),
        (.tooManyConnections, "tooManyConnections"), (.tooManySubscriptions, "tooManySubscriptions"),
    ]

    /// The code's name, or its hex value when this version does not know it.
    public var name: String {
        Self.known.first { $0.0 == self }?.1 ?? "0x" + String(rawValue, radix: 16)
    }

    public var description: String { name }

    public init(from decoder: any Decoder) throws {
        rawValue = try decoder.singleValueContainer().decode(UInt16.self)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }
}
