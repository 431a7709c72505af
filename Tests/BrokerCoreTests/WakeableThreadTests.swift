@testable import BrokerCore
import Glibc
import Synchronization
import Testing

/// The one helper for blocking threads: woken by `wake`, by its descriptor, or stopped; joined once its body ends.
@Suite(.timeLimit(.minutes(1))) struct WakeableThreadTests {
    /// Waits without a time limit end only through what the owner does: a wake, a readable descriptor, a stop.
    @Test func waitsEndOnWakeOnADescriptorAndOnStop() async throws {
        var ends: [Int32] = [0, 0]
        #expect(pipe(&ends) == 0)
        defer { ends.forEach { close($0) } }
        let descriptor = ends[0]
        let woken = Atomic<Int>(0)
        let readable = Atomic<Int>(0)
        let thread = try WakeableThread(name: "sb-test")
        try thread.start { thread in
            while !thread.isStopping {
                if thread.wait(milliseconds: -1, descriptor: descriptor) {
                    readable.add(1, ordering: .relaxed)
                    var byte: UInt8 = 0
                    _ = read(descriptor, &byte, 1)
                } else {
                    woken.add(1, ordering: .relaxed)
                }
            }
        }
        thread.wake()
        while woken.load(ordering: .relaxed) == 0 { await Task.yield() }
        var byte: UInt8 = 1
        #expect(write(ends[1], &byte, 1) == 1)
        while readable.load(ordering: .relaxed) == 0 { await Task.yield() }
        thread.stop()
        await thread.join()
        #expect(readable.load(ordering: .relaxed) == 1)
    }

    /// A thread never started has nothing to wait for.
    @Test func joiningAThreadNeverStartedReturns() async throws {
        let thread = try WakeableThread(name: "sb-test")
        await thread.join()
    }
}
