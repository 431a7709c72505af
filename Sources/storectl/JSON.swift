import Foundation
import NIOCore
import StoreBrokerClient

/// The JSON storectl reads and writes. Payloads are kept byte for byte: what is parsed is only checked and
/// searched for the id; what is printed is the stored bytes.
enum JSON {
    /// A JSON string literal for `text`.
    static func string(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                out += "\\u" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count)
                    + String(scalar.value, radix: 16)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }

    static func array(_ elements: [String]) -> String { "[" + elements.joined(separator: ",") + "]" }

    /// `bytes` as a JSON value: the bytes themselves when they are JSON (as storectl and the Swift client
    /// write them), else a JSON string of their text, so every line stays valid JSON.
    static func embed(_ bytes: ByteBuffer) -> String {
        let data = Data(bytes.readableBytesView)
        if (try? JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed])) != nil {
            return String(decoding: data, as: UTF8.self)
        }
        return string(String(decoding: data, as: UTF8.self))
    }

    /// Parses one JSON text; `nil` if it is not JSON.
    static func parse(_ text: Substring) -> Any? {
        try? JSONSerialization.jsonObject(with: Data(text.utf8), options: [.fragmentsAllowed])
    }

    /// An item from one JSON object: its id from `idField` (a string, or a number as its decimal text) and its
    /// payload, the text exactly as given (surrounding white space trimmed).
    static func item(_ text: Substring, idField: String, where place: String) throws -> Item {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard let object = parse(Substring(trimmed)) as? [String: Any] else {
            throw Failure(Failure.badInput, "\(place): not a JSON object: \(String(trimmed.prefix(80)))")
        }
        return Item(id: try id(object[idField], field: idField, where: place), payload: Payload(trimmed))
    }

    /// An id: a string, or a number as its decimal text.
    static func id(_ value: Any?, field: String, where place: String) throws -> ItemID {
        switch value {
        case let string as String:
            return ItemID(string)
        case let number as NSNumber where !(number is Bool):
            return ItemID(number.stringValue)
        case nil:
            throw Failure(Failure.badInput, "\(place): no \(JSON.string(field)) field")
        default:
            throw Failure(Failure.badInput, "\(place): the \(JSON.string(field)) field must be a string or a number")
        }
    }

    /// The non-empty lines of standard input, numbered from 1.
    static func standardInputLines() -> [(number: Int, text: Substring)] {
        let data = FileHandle.standardInput.readDataToEndOfFile()
        let text = String(decoding: data, as: UTF8.self)
        var lines: [(Int, Substring)] = []
        for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated()
        where !line.allSatisfy(\.isWhitespace) {
            lines.append((index + 1, line))
        }
        return lines
    }
}
