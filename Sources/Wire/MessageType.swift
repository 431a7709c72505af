/// The message type byte of a frame header.
///
/// The range tells the direction and what the header's id means:
/// - `0x01`–`0x3F`: client to server (hello and requests); the id is the request id chosen by the client.
/// - `0x40`–`0x7F`: server answers; the id is the id of the request answered.
/// - `0x80`–`0xBF`: server pushes; the id is the subscription id (0 for `goodbye`).
/// - `0x00` and `0xC0`–`0xFF` are never used.
public enum MessageType: UInt8, CaseIterable, Hashable, Sendable, Codable {
    // Handshake.
    case hello = 0x01  // client: magic, versions, client name
    // Requests.
    case ping = 0x10  // -> pong
    case listStores = 0x11  // -> storeList
    case listEngines = 0x12  // -> engineList
    case getStoreInfo = 0x13  // -> storeInfoResult
    case insert = 0x14  // -> writeResult
    case remove = 0x15  // -> writeResult
    case removeAll = 0x16  // -> writeResult
    case drop = 0x17  // -> writeResult
    case chain = 0x18  // -> writeResult
    case getItems = 0x19  // -> itemsResult
    case queryRange = 0x1A  // -> rangeResult
    case count = 0x1B  // -> countResult
    case listIDs = 0x1C  // -> idList
    case subscribe = 0x1D  // -> subscribed, then pushes
    case unsubscribe = 0x1E  // -> unsubscribed
    case getValue = 0x20  // -> valueResult
    case setValue = 0x21  // -> writeResult
    case resetValue = 0x22  // -> writeResult
    case listValues = 0x23  // -> valueList
    case quietChain = 0x24  // -> writeResult; the named subscription is not pushed its event
    // Answers.
    case welcome = 0x40  // answers hello
    case pong = 0x41
    case storeList = 0x42  // may span frames
    case engineList = 0x43  // may span frames
    case storeInfoResult = 0x44
    case writeResult = 0x45
    case itemsResult = 0x46  // may span frames
    case rangeResult = 0x47  // may span frames
    case countResult = 0x48
    case idList = 0x49  // may span frames
    case subscribed = 0x4A
    case unsubscribed = 0x4B
    case valueResult = 0x4C
    case valueList = 0x4D  // may span frames
    case error = 0x7F  // answers any request that failed
    // Pushes.
    case storeLoaded = 0x80  // may span frames
    case storeEvent = 0x81  // may span frames
    case valueLoaded = 0x82
    case valueEvent = 0x83
    case lagged = 0x84
    case historyGone = 0x85
    case dropped = 0x86
    case goodbye = 0xBF  // id 0; the server closes after it

    /// Sent by clients (hello and requests).
    public var isFromClient: Bool { rawValue < 0x40 }
    /// A server push (its id is a subscription id).
    public var isPush: Bool { rawValue >= 0x80 }

    /// Whether a message of this type may span several frames (the `more` flag).
    public var allowsContinuation: Bool {
        switch self {
        case .storeList, .engineList, .itemsResult, .rangeResult, .idList, .valueList, .storeLoaded, .storeEvent: true
        default: false
        }
    }

    /// The name used in docs and test vectors: the case name.
    public var name: String { String(describing: self) }

    public init?(name: String) {
        guard let type = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = type
    }
}
