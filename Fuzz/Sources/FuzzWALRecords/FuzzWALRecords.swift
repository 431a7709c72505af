import FuzzSupport
import WALFormat

/// Bytes as a wal log segment's records: the record decoder, the steps, their encoding again, the merge.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzWALRecords(_ data: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    WALFuzzing.check(UnsafeRawBufferPointer(start: data, count: data == nil ? 0 : count))
    return 0
}

@_cdecl("FuzzWALRecords_main")
public func entry(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>) -> CInt {
    runFuzzer(argc, argv) { fuzzWALRecords($0, $1) }
}
