import Foundation
@testable import StoreBrokerClient
import StoreBrokerTesting
import StoreModel
import Testing
import Wire

/// `PayloadJSON` writes the bytes `JSONEncoder` with `.sortedKeys` writes, or leaves the value to it.
@Suite struct PayloadJSONBytes {
    private static func foundation<T: Encodable>(_ value: T) -> [UInt8]? {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return (try? encoder.encode(value)).map { Array($0) }
    }

    /// One encoder for a test's values, its writer kept from each to the next (as a mirror's is).
    private let kept = PayloadJSON()

    /// The bytes a fresh encoder writes for `value`.
    private static func fresh<T: Encodable>(_ value: T) -> [UInt8]? {
        PayloadJSON().encode(value).map { Array($0.readableBytesView) }
    }

    /// The fast writer took `value` and wrote what JSONEncoder writes, fresh and kept from the values before.
    private func written<T: Encodable>(_ value: T, sourceLocation: Testing.SourceLocation = #_sourceLocation) {
        let mine = Self.fresh(value)
        #expect(mine != nil, "left to JSONEncoder", sourceLocation: sourceLocation)
        #expect(
            mine.map { String(decoding: $0, as: UTF8.self) } == Self.foundation(value).map { String(decoding: $0, as: UTF8.self) },
            sourceLocation: sourceLocation)
        #expect(kept.encode(value).map { Array($0.readableBytesView) } == mine, "a kept writer", sourceLocation: sourceLocation)
    }

    /// The fast writer left `value` to JSONEncoder, and the mirror's coding writes JSONEncoder's bytes (or throws
    /// as it does).
    private func leftToFoundation<T: Encodable>(_ value: T, sourceLocation: Testing.SourceLocation = #_sourceLocation) {
        #expect(Self.fresh(value) == nil, sourceLocation: sourceLocation)
        #expect(kept.encode(value) == nil, sourceLocation: sourceLocation)
        let coded = try? MirrorCoding().encode(value)
        #expect(coded.map { Array($0.bytes.readableBytesView) } == Self.foundation(value), sourceLocation: sourceLocation)
    }

    struct Inner: Codable, Equatable {
        var zeta: Int
        var alpha: [String]
    }

    enum Mood: String, Codable { case calm, loud }

    enum Shape: Codable {
        case circle(radius: Double)
        case box(Double, Double)
        case none
    }

    struct Everything: Codable {
        var text = "hello"
        var number = -42
        var ratio = 0.1
        var flag = true
        var missing: String? = nil
        var present: String? = "here"
        var list = ["b", "a"]
        var numbers = [3, 1, 2]
        var inner = Inner(zeta: 1, alpha: ["x"])
        var inners = [Inner(zeta: 2, alpha: []), Inner(zeta: 3, alpha: ["y", "z"])]
        var byName = ["b": 2, "a": 1, "é": 3, "B": 4]
        var byNumber = [10: "ten", 2: "two"]
        var mood = Mood.loud
        var shapes: [Shape] = [.circle(radius: 2), .box(1, 1.5), .none]
        var date = Date(timeIntervalSinceReferenceDate: 12345.678)
        var data = Data([0, 1, 2, 250, 251, 252, 253])
        var url = URL(string: "https://example.com/a/b?c=d")!
        var id = UUID(uuidString: "E621E1F8-C36C-495A-93FC-0C247A3E6E5F")!
        var small: Float = 1.25
        var bytes: [UInt8] = [0, 255]
        var extremes: [Int64] = [.min, .max, 0]
        var unsigned: UInt64 = .max
        var int8: Int8 = -128
        var optionals: [Int?] = [1, nil]
        var nested: [[String: [Int]]] = [["k": [1]], [:]]
        var empty = Empty()
    }

    struct Empty: Codable {}

    @Test func commonShapesAreWrittenAsJSONEncoderWritesThem() {
        written(Everything())
        written(Inner(zeta: 0, alpha: []))
        written("top-level string")
        written(42)
        written([1, 2, 3])
        written(Optional<Int>.none)
        written(Date(timeIntervalSinceReferenceDate: 0))
        written(Data())
        written(["only": Empty()])
    }

    @Test func numbersAreWrittenAsJSONEncoderWritesThem() {
        let doubles: [Double] = [
            0, -0.0, 1, -1, 100, 0.1, 1.5, 1e-7, 1e16, 1e21, 123456789.123, .pi, .leastNonzeroMagnitude,
            .leastNormalMagnitude, .greatestFiniteMagnitude, -.greatestFiniteMagnitude, 5e-324, 9007199254740993,
        ]
        for value in doubles { written(["d": value]) }
        let floats: [Float] = [0, 1, 0.1, 3.4028235e38, 1e-45, 16_777_217]
        for value in floats { written(["f": value]) }
        var random = SystemRandomNumberGenerator()
        for _ in 0..<500 {
            written(Double(bitPattern: random.next() & ~(0x7FF << 52) | (UInt64.random(in: 0..<0x7FF) << 52)))
            written(Int.random(in: .min ... .max))
        }
    }

    @Test func stringsAreEscapedAsJSONEncoderEscapesThem() {
        let controls = String((0..<0x20).map { Character(Unicode.Scalar(UInt8($0))) })
        written(controls)
        written(#"quote " backslash \ slash / del \#u{7F}"#)
        written("é 😀 \u{2028} \u{FEFF} ﷺ")
        written(["a/b": 1, "\"": 2, "\n": 3])
        var random = SystemRandomNumberGenerator()
        for _ in 0..<500 {
            let scalars = (0..<Int.random(in: 0..<12)).compactMap { _ in
                Unicode.Scalar(UInt32.random(in: 0..<0x300, using: &random)).map(Character.init)
            }
            written(String(scalars))
        }
    }

    /// Keys whose declaration order is not their UTF-8 order, some sorting differently by bytes than by
    /// Unicode or case (JSONEncoder on Linux sorts by UTF-8 bytes).
    struct Keys: Encodable {
        enum CodingKeys: String, CodingKey { case zed = "z", upper = "Z", accent = "é", empty = "", long = "aa", short = "a" }
        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            for key in [CodingKeys.zed, .upper, .accent, .empty, .long, .short] { try container.encode(key.rawValue, forKey: key) }
        }
    }

    @Test func keysAreSortedAsJSONEncoderSortsThem() {
        written(Keys())
        written(Dictionary(uniqueKeysWithValues: (0..<40).map { ("key\($0)", $0) }))
    }

    /// A nested container written to after its parent was: JSONEncoder's tree allows it, a stream does not.
    struct Interleaved: Encodable {
        enum CodingKeys: String, CodingKey { case a, b, c }
        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            var nested = container.nestedUnkeyedContainer(forKey: .a)
            try nested.encode(1)
            try container.encode(2, forKey: .b)
            try nested.encode(3)
        }
    }

    /// A nested container done before its parent goes on: written in the stream.
    struct Nested: Encodable {
        enum CodingKeys: String, CodingKey { case a, b, c }
        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            var list = container.nestedUnkeyedContainer(forKey: .c)
            try list.encode(1)
            var object = list.nestedContainer(keyedBy: CodingKeys.self)
            try object.encode("x", forKey: .b)
            try object.encode("y", forKey: .a)
            try container.encode(2, forKey: .b)
            var again = encoder.container(keyedBy: CodingKeys.self)  // the same container, asked twice
            try again.encode(0, forKey: .a)
        }
    }

    struct Twice: Encodable {
        enum CodingKeys: String, CodingKey { case a }
        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(1, forKey: .a)
            try container.encode(2, forKey: .a)
        }
    }

    class Base: Encodable {
        var base = 1
    }

    final class Derived: Base {
        var own = 2
        enum CodingKeys: String, CodingKey { case own }
        override func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(own, forKey: .own)
            try super.encode(to: container.superEncoder())
        }
    }

    struct Throws: Encodable {
        struct Refused: Error {}
        func encode(to encoder: any Encoder) throws { throw Refused() }
    }

    /// Catches what its fields throw (JSONEncoder then leaves the key out; a stream has written it already).
    struct Forgiving: Encodable {
        enum CodingKeys: String, CodingKey { case a, b, c }
        func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(1, forKey: .a)
            try? container.encode(Double.nan, forKey: .b)
            try? container.encode(Throws(), forKey: .c)
        }
    }

    struct Silent: Encodable {
        func encode(to encoder: any Encoder) throws {}
    }

    /// A subclass that encodes its base into the same container (`super.encode(to: encoder)`, no `superEncoder`).
    class Animal: Encodable {
        var legs = 4
    }

    final class Dog: Animal {
        var name = "Rex"
        enum CodingKeys: String, CodingKey { case name }
        override func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(name, forKey: .name)
            try super.encode(to: encoder)
        }
    }

    /// A value that encodes as the single value of another (a wrapper of a struct).
    struct Wrapper: Encodable {
        var inner = Inner(zeta: 7, alpha: ["w"])
        func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            try container.encode(inner)
        }
    }

    @Test func nestedContainersDoneInOrderAreWritten() {
        written(Nested())
        written(Dog())
        written(Wrapper())
        written([Wrapper(), Wrapper()])
        written(Empty())
    }

    @Test func whatAStreamCannotWriteIsLeftToJSONEncoder() {
        leftToFoundation(Interleaved())
        leftToFoundation(Twice())
        leftToFoundation(Derived())
        leftToFoundation(["price": Decimal(string: "12.50")!])
        leftToFoundation(["nan": Double.nan])
        leftToFoundation(["infinity": Float.infinity])
        leftToFoundation(Throws())
        leftToFoundation(Silent())
        leftToFoundation(Forgiving())
        leftToFoundation([Interleaved()])
    }

    /// Keeps its container after `encode(to:)` returned and writes to it later: the writer behind it is not
    /// kept for the next value, whose bytes stay its own.
    final class Keeper: Encodable, @unchecked Sendable {
        enum CodingKeys: String, CodingKey { case a }
        var container: KeyedEncodingContainer<CodingKeys>?
        func encode(to encoder: any Encoder) throws {
            container = encoder.container(keyedBy: CodingKeys.self)
            try container?.encode(1, forKey: .a)
        }
    }

    @Test func oneWriterServesEncodingsOneAfterAnother() {
        for index in 0..<100 { written(Inner(zeta: index, alpha: ["\(index)"])) }
        written(Everything())
        #expect(kept.writersMade == 1)
    }

    @Test func aWriterAValueStillHoldsIsNotKept() {
        let keeper = Keeper()
        written(keeper)
        written(Inner(zeta: 7, alpha: ["after"]))  // encoded while the keeper holds its container
        #expect(kept.writersMade == 2)
        try? keeper.container?.encode(2, forKey: .a)  // a frame no later value has: written nowhere
        written(Inner(zeta: 8, alpha: []))
        keeper.container = nil
        written(Everything())
        written(Inner(zeta: 9, alpha: ["x", "y"]))
        #expect(kept.writersMade == 2)  // the second one, kept from the value after the keeper's on
    }

    /// Through a broker: the payload a RemoteStore writes is JSONEncoder's, as any other process reads it.
    @Test func aRemoteStoresPayloadIsJSONEncodersBytes() async throws {
        try await withTemporaryBroker { client in
            let store = try await RemoteStore<Note>(client: client, loading: "notes")
            let note = Note(id: "a/1", text: "line\nquote \" tab\t é")
            try await store.insert(note)
            guard case .itemsResult(let result) = try await client.send(.getItems(.init(store: "notes", ids: [ItemID("a/1")]))),
                case .present(let record) = result.elements.first
            else {
                Issue.record("the note is not stored")
                return
            }
            #expect(Array(record.payload.bytes.readableBytesView) == Self.foundation(note))
            store.close()
        }
    }
}
