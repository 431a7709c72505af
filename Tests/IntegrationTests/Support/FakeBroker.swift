import Foundation

/// A listener on a Unix socket that plays a broken broker, for the client's side of liveness: it accepts
/// every connection and then either closes it at once or holds it without ever answering. Its accept loop runs
/// on its own thread (blocking calls never on the cooperative pool) until `stop()`.
final class FakeBroker: @unchecked Sendable {
    enum Behaviour { case closeAtOnce, neverAnswer }

    let socketPath: String
    private let listener: Int32
    private let behaviour: Behaviour
    private let lock = NSLock()
    private var held: [Int32] = []
    private var stopped = false
    private let finished = DispatchSemaphore(value: 0)

    init(socketPath: String, behaviour: Behaviour) throws {
        self.socketPath = socketPath
        self.behaviour = behaviour
        listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard listener >= 0 else { throw POSIXError(.EIO) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(socketPath.utf8)) }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard bound == 0, listen(listener, 128) == 0 else {
            close(listener)
            throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
        }
        Thread.detachNewThread { self.acceptLoop() }
    }

    private func acceptLoop() {
        while true {
            let connection = accept(listener, nil, nil)
            if connection < 0 {
                if errno == EINTR { continue }
                break  // the listener was shut down
            }
            switch behaviour {
            case .closeAtOnce: close(connection)
            case .neverAnswer: lock.withLock { held.append(connection) }
            }
        }
        finished.signal()
    }

    /// Stops accepting, closes every held connection and removes the socket.
    func stop() {
        guard lock.withLock({ () -> Bool in
            defer { stopped = true }
            return !stopped
        }) else { return }
        shutdown(listener, Int32(SHUT_RDWR))
        finished.wait()
        close(listener)
        lock.withLock {
            held.forEach { close($0) }
            held = []
        }
        unlink(socketPath)
    }

    deinit { stop() }
}
