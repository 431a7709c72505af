import StorageEngineKit

// The disk engine's own record encoding: little-endian fields and a trailing FNV-1a checksum.

/// Little-endian encoding with a running FNV-1a checksum, for the engine's own files.
struct Encoder {
    var bytes: [UInt8] = []

    mutating func u8(_ v: UInt8) { bytes.append(v) }
    mutating func u32(_ v: UInt32) { withUnsafeBytes(of: v.littleEndian) { bytes.append(contentsOf: $0) } }
    mutating func u64(_ v: UInt64) { withUnsafeBytes(of: v.littleEndian) { bytes.append(contentsOf: $0) } }
    mutating func raw(_ b: some Collection<UInt8>) { bytes.append(contentsOf: b) }
    mutating func raw(_ b: UnsafeBufferPointer<UInt8>) { bytes.append(contentsOf: b) }
    mutating func blob(_ b: [UInt8]) {
        u32(UInt32(b.count))
        raw(b)
    }

    /// Appends the checksum of everything so far.
    mutating func seal() { u64(checksum(bytes[...])) }
}

struct Decoder {
    let bytes: [UInt8]
    var offset = 0
    let path: String

    init(_ bytes: [UInt8], path: String) {
        self.bytes = bytes
        self.path = path
    }

    var remaining: Int { bytes.count - offset }

    mutating func take(_ count: Int) throws(EngineError) -> ArraySlice<UInt8> {
        guard count >= 0, remaining >= count else { throw EngineError.corrupt("\(path) is truncated") }
        defer { offset += count }
        return bytes[offset..<(offset + count)]
    }

    mutating func u8() throws(EngineError) -> UInt8 { try take(1).first! }
    mutating func u32() throws(EngineError) -> UInt32 {
        try take(4).reversed().reduce(0) { $0 << 8 | UInt32($1) }
    }
    mutating func u64() throws(EngineError) -> UInt64 {
        try take(8).reversed().reduce(0) { $0 << 8 | UInt64($1) }
    }
    mutating func blob() throws(EngineError) -> [UInt8] { Array(try take(Int(try u32()))) }

    /// Checks the trailing checksum over everything before it.
    func verifySeal() throws(EngineError) {
        guard bytes.count >= 8 else { throw EngineError.corrupt("\(path) is truncated") }
        var tail = Decoder(bytes, path: path)
        tail.offset = bytes.count - 8
        guard try tail.u64() == checksum(bytes[..<(bytes.count - 8)]) else {
            throw EngineError.corrupt("\(path) fails its checksum")
        }
    }
}

func checksum(_ bytes: ArraySlice<UInt8>) -> UInt64 {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for byte in bytes { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
    return hash
}
