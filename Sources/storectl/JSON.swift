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

    /// Parses one JSON text, or says where and why it is not JSON, in Foundation's words with the place as a line
    /// and column ("invalid value at line 3, column 6"; "unexpected end of the text at line 1, column 11").
    static func parsed(_ text: Substring) -> Result<Any, Failure> {
        do {
            return .success(try JSONSerialization.jsonObject(with: Data(text.utf8), options: [.fragmentsAllowed]))
        } catch {
            var why = ((error as NSError).userInfo[NSDebugDescriptionErrorKey] as? String) ?? "not JSON"
            var offset: Int?
            if let range = why.range(of: #" around character \d+"#, options: .regularExpression) {
                offset = Int(why[range].split(separator: " ").last ?? "")
                why.removeSubrange(range)
            } else if why.hasPrefix("Unexpected end of file") {
                offset = text.utf8.count
                why = "unexpected end of the text" + why.dropFirst("Unexpected end of file".count)
            }
            if why.hasSuffix(".") { why.removeLast() }
            why = why.prefix(1).lowercased() + why.dropFirst()
            if let offset { why += " at " + place(ofByte: offset, in: text) }
            return .failure(Failure(Failure.badInput, why))
        }
    }

    /// "line L, column C" of the UTF-8 byte `offset` of `text` (columns count characters, from 1).
    private static func place(ofByte offset: Int, in text: Substring) -> String {
        let before = String(decoding: text.utf8.prefix(offset), as: UTF8.self)
        let lines = before.split(separator: "\n", omittingEmptySubsequences: false)
        return "line \(lines.count), column \((lines.last?.count ?? 0) + 1)"
    }

    /// An item from one JSON object: its id from `idField` (a string, or a number as its decimal text) and its
    /// payload, the text exactly as given (surrounding white space trimmed).
    static func item(_ text: Substring, idField: String, where place: String) throws -> Item {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        let parsed = parsed(Substring(trimmed))
        if case .failure(let failure) = parsed {
            throw Failure(Failure.badInput, "\(place): not JSON: \(failure.message)")
        }
        guard case .success(let value) = parsed, let object = value as? [String: Any] else {
            throw Failure(Failure.badInput, "\(place): not a JSON object: \(String(trimmed.prefix(80)))")
        }
        return Item(id: try id(object[idField], field: idField, where: place), payload: Payload(trimmed))
    }

    /// An id: a string, or an integral number below 2^53 in magnitude as its shortest decimal text (`1.0` and
    /// `1e0` are "1", `1e3` is "1000", `-0` is "0"): the numbers every JSON reader holds exactly. Any other
    /// number is refused rather than turned into text that another reader would spell differently.
    static func id(_ value: Any?, field: String, where place: String) throws -> ItemID {
        switch value {
        case let string as String:
            return ItemID(string)
        // JSONSerialization hands over `true` and `false` as NSNumbers too, of type "c" (a `Bool` cast would
        // also match the numbers 0 and 1).
        case let number as NSNumber where String(cString: number.objCType) != "c":
            return try integralID(number.doubleValue, field: field, where: place)
        case nil:
            throw Failure(Failure.badInput, "\(place): no \(JSON.string(field)) field")
        default:
            throw Failure(Failure.badInput, "\(place): the \(JSON.string(field)) field must be a string or a number")
        }
    }

    private static func integralID(_ number: Double, field: String, where place: String) throws -> ItemID {
        guard number.isFinite, number == number.rounded(.towardZero), abs(number) < 0x1p53 else {
            throw Failure(
                Failure.badInput,
                "\(place): the \(JSON.string(field)) field is \(number): a numeric id must be an integer below 2^53 in magnitude (else give it as a string)")
        }
        return ItemID(String(Int64(number)))
    }

    /// The non-empty lines of standard input, numbered from 1.
    static func standardInputLines() throws -> [(number: Int, text: Substring)] {
        try lines(of: FileHandle.standardInput.readDataToEndOfFile(), source: "")
    }

    /// The non-empty lines of `data`, numbered from 1. A line that is not UTF-8 is an error naming it (never
    /// text with U+FFFD in place of its bytes: that would store something else than what was given).
    static func lines(of data: Data, source: String) throws -> [(number: Int, text: Substring)] {
        var lines: [(Int, Substring)] = []
        for (index, bytes) in data.split(separator: 0x0A, omittingEmptySubsequences: false).enumerated() {
            guard let line = String(validating: bytes, as: UTF8.self) else {
                throw Failure(Failure.badInput, "\(source)line \(index + 1): not valid UTF-8")
            }
            if !line.allSatisfy(\.isWhitespace) { lines.append((index + 1, Substring(line))) }
        }
        return lines
    }
}
