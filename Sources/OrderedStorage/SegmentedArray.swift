/// An array kept in segments of at most 4,096 elements: appending never moves what is already stored.
///
/// A Swift `Array` grows by doubling, copying every element into the new buffer: the millionth slot of a table
/// copies a million slots (tens to hundreds of milliseconds in this project's VM, every write of the store waiting;
/// docs/BENCHMARKS.md, the 2^20 row). Here only a segment grows by doubling, so the most one append copies is one
/// segment; the list of segments is one reference each. A copy shares the segments until one of them is written
/// (copy-on-write per segment, not for the whole array). An element costs one more indirection to reach.
@usableFromInline
struct SegmentedArray<Element> {
    @inlinable static var shift: Int { 12 }
    @inlinable static var segmentCapacity: Int { 1 << shift }
    @inlinable static var offsetMask: Int { segmentCapacity - 1 }

    /// Every segment but the last holds exactly `segmentCapacity` elements; the last holds at least one.
    @usableFromInline var segments: [[Element]] = []
    @usableFromInline var storedCount = 0

    @inlinable
    init() {}

    @inlinable
    subscript(position: Int) -> Element {
        _read { yield segments[position >> Self.shift][position & Self.offsetMask] }
        _modify { yield &segments[position >> Self.shift][position & Self.offsetMask] }
    }

    /// Reads a byte of the element's memory and nothing of its value (which a read would retain): brings the
    /// element into the cache.
    @inlinable @inline(__always)
    func touch(_ position: Int) -> UInt8 {
        segments[position >> Self.shift].withUnsafeBufferPointer { elements in
            UnsafeRawPointer(elements.baseAddress! + (position & Self.offsetMask)).load(as: UInt8.self)
        }
    }

    @inlinable
    mutating func append(_ element: consuming Element) {
        if storedCount & Self.offsetMask == 0 { segments.append([]) }
        segments[segments.count - 1].append(element)
        storedCount += 1
    }

    @discardableResult
    @inlinable
    mutating func removeLast() -> Element {
        let element = segments[segments.count - 1].removeLast()
        storedCount -= 1
        if storedCount & Self.offsetMask == 0 { segments.removeLast() }
        return element
    }

    /// Calls `body` with each element from `start` on, in order, until it returns `false`: segment by segment,
    /// without working out the segment of every element.
    @inlinable
    func forEach(from start: Int, _ body: (Element) throws -> Bool) rethrows {
        var segmentIndex = start >> Self.shift
        var offset = start & Self.offsetMask
        while segmentIndex < segments.count {
            let segment = segments[segmentIndex]
            while offset < segment.count {
                if try !body(segment[offset]) { return }
                offset += 1
            }
            segmentIndex += 1
            offset = 0
        }
    }

    /// Room in the list of segments for `capacity` elements (the segments themselves are made as they fill).
    @inlinable
    mutating func reserveCapacity(_ capacity: Int) {
        segments.reserveCapacity((capacity + Self.offsetMask) >> Self.shift)
    }
}

extension SegmentedArray: RandomAccessCollection, MutableCollection {
    @inlinable
    var startIndex: Int { 0 }

    @inlinable
    var endIndex: Int { storedCount }

    @inlinable
    var count: Int { storedCount }
}

extension SegmentedArray: Sendable where Element: Sendable {}
