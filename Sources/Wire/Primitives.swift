import NIOCore
import StoreModel

// The protocol's primitive types (docs/PROTOCOL.md, "Primitive types"):
//   u8 u16 u32 u64   unsigned, big-endian
//   text             u16 byte length, then that many bytes of UTF-8 (validated)
//   bytes            u32 byte length, then the raw bytes
//   list<T>          u32 element count, then the elements
// Every read checks the bytes that remain first, so no count or length from the peer sizes an allocation
// before it has been checked against the bytes actually received.

extension ByteBuffer {

    mutating func readWire<T: FixedWidthInteger>(_: T.Type = T.self, _ field: StaticString) throws(WireError) -> T {
        guard let value = readInteger(as: T.self) else { throw WireError.truncated("\(field)") }
        return value
    }

    mutating func readWireBool(_ field: StaticString) throws(WireError) -> Bool {
        switch try readWire(UInt8.self, field) {
        case 0: return false
        case 1: return true
        case let other: throw WireError.malformed("\(field) must be 0 or 1, got \(other)")
        }
    }

    mutating func readWireText(_ field: StaticString) throws(WireError) -> String {
        let length = Int(try readWire(UInt16.self, field))
        guard readableBytes >= length else { throw WireError.truncated("\(field)") }
        let text = withUnsafeReadableBytes { bytes in UTF8Text.string(UnsafeRawBufferPointer(rebasing: bytes[..<length])) }
        guard let text else { throw WireError.malformed("\(field) is not valid UTF-8") }
        moveReaderIndex(forwardBy: length)
        return text
    }

    mutating func readWireBytes(_ field: StaticString) throws(WireError) -> ByteBuffer {
        let length = Int(try readWire(UInt32.self, field))
        guard let bytes = readSlice(length: length) else { throw WireError.truncated("\(field)") }
        return bytes
    }

    /// Reads a `list<T>`. `minElementLength` is the fewest bytes one element can take; a count that the
    /// remaining bytes cannot hold is refused before anything is allocated.
    mutating func readWireList<T>(
        _ field: StaticString,
        minElementLength: Int,
        _ readElement: (inout ByteBuffer) throws(WireError) -> T
    ) throws(WireError) -> [T] {
        let count = Int(try readWire(UInt32.self, field))
        guard count <= readableBytes / minElementLength else {
            throw WireError.malformed(
                "\(field) claims \(count) elements but only \(readableBytes) bytes remain")
        }
        var elements: [T] = []
        elements.reserveCapacity(count)
        for _ in 0..<count {
            elements.append(try readElement(&self))
        }
        return elements
    }

    /// Writes a `text`; one over 65535 bytes cannot be represented and is refused, never cut short.
    mutating func writeWireText(_ text: String, _ field: StaticString) throws(WireError) {
        writeInteger(try Self.wireTextLength(text.utf8.count, field))
        writeString(text)
    }

    /// Writes a `text` from UTF-8 bytes in hand (an id that is a view of bytes held elsewhere).
    mutating func writeWireText(utf8 text: UnsafeRawBufferPointer, _ field: StaticString) throws(WireError) {
        writeInteger(try Self.wireTextLength(text.count, field))
        writeBytes(text)
    }

    /// A `text`'s `u16` length.
    private static func wireTextLength(_ count: Int, _ field: StaticString) throws(WireError) -> UInt16 {
        guard count <= UInt16.max else {
            throw WireError.malformed("\(field) is \(count) bytes; a text field holds at most 65535")
        }
        return UInt16(count)
    }

    /// A payload as `bytes`, written from where it lies (a kept item's payload is no `ByteBuffer`).
    mutating func writeWirePayload(_ payload: Payload) {
        payload.withUnsafeReadableBytes { bytes in
            writeInteger(UInt32(bytes.count))
            writeBytes(bytes)
        }
    }

    mutating func writeWireBytes(_ bytes: ByteBuffer) {
        writeInteger(UInt32(bytes.readableBytes))
        writeImmutableBuffer(bytes)
    }

    mutating func writeWireBool(_ value: Bool) {
        writeInteger(value ? 1 : 0, as: UInt8.self)
    }

    mutating func writeWireList<T>(
        _ elements: [T],
        _ writeElement: (inout ByteBuffer, T) throws(WireError) -> Void
    ) throws(WireError) {
        writeInteger(UInt32(elements.count))
        for element in elements {
            try writeElement(&self, element)
        }
    }
}

/// Fails unless every byte of a message's payload was consumed.
func requireFullyConsumed(_ buffer: ByteBuffer, _ type: MessageType) throws(WireError) {
    guard buffer.readableBytes == 0 else {
        throw WireError.malformed("\(buffer.readableBytes) trailing bytes after a \(type.name) message")
    }
}
