import CStorageEngine
import OrderedStorage

extension OrderedTable where Key == [UInt8] {
    /// Visits every pair in order. `body` returns `false` when the host asked to stop, which throws
    /// `EngineError.stopped`; an error `body` throws ends the visit and is rethrown.
    public func visit(_ body: (_ key: [UInt8], _ value: Value) throws(EngineError) -> Bool) throws(EngineError) {
        var failure: EngineError?
        forEach { key, value in
            do throws(EngineError) {
                if try body(key, value) { return true }
                failure = .stopped
            } catch {
                failure = error
            }
            return false
        }
        if let failure { throw failure }
    }
}
