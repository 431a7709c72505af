#if canImport(Glibc)
import Glibc
#endif
import BrokerCore
import CDBus
import DequeModule
import Foundation
import Locking
import Logging
import ServiceLifecycle
import StoreModel

/// Broadcasts commits as D-Bus signals (dconf's model: the only writer signals names, listeners fetch values).
///
/// The writer only appends to a bounded queue (`CommitObserver` calls, after each commit, outside the store's
/// lock: the publisher is one listener of the broadcast, like the socket subscribers); a thread of
/// the publisher's own owns the libdbus connection, drains the queue, merges consecutive signals of one store
/// with the same operation that piled up (ids joined, the last sequence), sends them, answers
/// `Introspectable` and `Peer`, and reconnects with a capped backoff when the bus goes away (logging one
/// warning), so the writer never waits for D-Bus and socket subscribers never notice it.
public final class DBusPublisher: CommitObserver, Service, Sendable {
    /// Where the bus is.
    public enum Bus: Hashable, Sendable {
        /// `DBUS_SESSION_BUS_ADDRESS` as read by the caller; else `unix:path=$XDG_RUNTIME_DIR/bus`.
        case session(address: String?)
        case address(String)
    }

    /// The most ids one signal carries; a longer list is cut and the signal says `complete: false`.
    public static let maxIDsPerSignal = 1000
    /// The most signals waiting; past it a signal is merged into the last one of its store (or dropped).
    public static let queueCapacity = 16_384

    struct Signal: Sendable {
        enum Kind: Sendable, Equatable {
            case store(operation: String)
            case value(secure: Bool)
        }

        var kind: Kind
        var name: String
        var sequence: UInt64
        var ids: [String] = []
        var complete = true

        /// Joins `next` into this one if it may: the same store and operation.
        mutating func merge(_ next: Signal) -> Bool {
            guard case .store = kind, kind == next.kind, name == next.name else { return false }
            sequence = next.sequence
            let room = DBusPublisher.maxIDsPerSignal - ids.count
            ids += next.ids.prefix(room)
            complete = complete && next.complete && next.ids.count <= room
            return true
        }
    }

    /// How long the first of a burst of signals may wait for the others, so that they merge.
    public static let gatherDelay: Duration = .milliseconds(25)

    private struct Shared {
        var queue = Deque<Signal>()
        /// When the queue last went from empty to not empty.
        var firstQueuedAt: ContinuousClock.Instant?
        var dropped = 0
        var stopping = false
        var wakePending = false
    }

    private let address: String?
    private let logger: Logger
    private let shared = Locked(Shared())
    /// The publishing thread, woken when the queue goes from empty to not empty, or at stop; nil when not even its
    /// pipe could be made (then nothing is published).
    private let thread: WakeableThread?

    public init(bus: Bus, logger: Logger) {
        switch bus {
        case .address(let address): self.address = address
        case .session(let address):
            if let address, !address.isEmpty {
                self.address = address
            } else if let runtime = ProcessInfo.processInfo.environment["XDG_RUNTIME_DIR"], runtime.hasPrefix("/") {
                self.address = "unix:path=\(runtime)/bus"
            } else {
                self.address = nil
            }
        }
        self.logger = logger
        do {
            thread = try WakeableThread(name: "storebroker-dbus")
        } catch {
            logger.error("D-Bus: \(error.message); no signals will be sent")
            thread = nil
        }
    }

    /// The publisher as one of the daemon's services: its thread runs until the graceful shutdown, then sends what
    /// is still queued (if the bus is there) and ends.
    public func run() async throws {
        start()
        try? await gracefulShutdown()
        await stop()
    }

    /// Starts the publishing thread.
    public func start() {
        dbus_threads_init_default()
        do {
            try thread?.start { [self] thread in run(on: thread) }
        } catch {
            logger.error("D-Bus: \(error.message); no signals will be sent")
        }
    }

    /// Stops the thread (signals still queued are sent first if the bus is there).
    public func stop() async {
        shared.withLock { $0.stopping = true }
        thread?.wake()
        await thread?.join()
    }

    // MARK: CommitObserver (the writer's side: never blocks)

    public func storeCommitted(store: String, epoch: UInt64, sequence: UInt64, steps: [EventStep]) {
        for step in steps {
            let (operation, ids): (String, [String]) =
                switch step {
                case .insert(let records): ("insert", records.prefix(Self.maxIDsPerSignal).map(\.id.string))
                case .remove(let ids): ("remove", ids.prefix(Self.maxIDsPerSignal).map(\.string))
                }
            let count: Int =
                switch step {
                case .insert(let records): records.count
                case .remove(let removed): removed.count
                }
            enqueue(
                Signal(kind: .store(operation: operation), name: store, sequence: sequence, ids: ids, complete: count <= ids.count))
        }
    }

    public func valueChanged(name: String, sequence: UInt64, secure: Bool) {
        enqueue(Signal(kind: .value(secure: secure), name: name, sequence: sequence))
    }

    private func enqueue(_ signal: Signal) {
        let mustWake = shared.withLock { shared -> Bool in
            if shared.queue.count >= Self.queueCapacity {
                // Full: fold it into the last signal if that is of the same store and operation, else drop it.
                // In place: merging into a copy of the last signal would copy its ids (up to 1,000 strings) per
                // signal.
                let last = shared.queue.count - 1
                if last >= 0, shared.queue[last].merge(signal) {
                    shared.queue[last].complete = false
                } else {
                    shared.dropped += 1
                }
                return false
            }
            if shared.queue.isEmpty { shared.firstQueuedAt = .now }
            shared.queue.append(signal)
            defer { shared.wakePending = true }
            return !shared.wakePending
        }
        if mustWake { wake() }
    }

    /// What is queued (tests).
    var queuedForTesting: [Signal] { shared.withLock { Array($0.queue) } }

    private func wake() {
        thread?.wake()
    }

    // MARK: The publishing thread

    private func run(on thread: WakeableThread) {
        var connection: OpaquePointer?
        var backoff: Int32 = 100  // ms
        var warned = false
        while true {
            if connection == nil {
                if shared.withLock({ $0.stopping }) { return }
                switch connect() {
                case .success(let opened):
                    connection = opened
                    backoff = 100
                    warned = false
                    logger.info("D-Bus: publishing on \(address ?? "?")", metadata: ["dbus.name": "\(StoreBrokerDBus.busName)"])
                case .failure(let message):
                    if !warned {
                        logger.warning("D-Bus: no bus reachable (\(message)); the broker runs on and keeps trying")
                        warned = true
                    } else {
                        logger.debug("D-Bus: still no bus: \(message)")
                    }
                    // Signals for a bus that is not there have no listener: let them go.
                    shared.withLock { shared in
                        shared.queue.removeAll()
                        shared.firstQueuedAt = nil
                    }
                    waitForWake(on: thread, timeout: backoff)
                    backoff = min(backoff * 2, 2000)
                    continue
                }
            }
            guard let open = connection else { continue }
            gather()
            let stopping = send(on: open)
            if stopping {
                dbus_connection_flush(open)
                dbus_connection_close(open)
                dbus_connection_unref(open)
                return
            }
            if !serve(open) {
                logger.warning("D-Bus: the bus went away; reconnecting")
                dbus_connection_close(open)
                dbus_connection_unref(open)
                connection = nil
                continue
            }
            waitForWake(on: thread, timeout: 1000, dbusFD: fileDescriptor(of: open))
        }
    }

    private enum Connected {
        case success(OpaquePointer)
        case failure(String)
    }

    private func connect() -> Connected {
        guard let address else { return .failure("no session bus address (DBUS_SESSION_BUS_ADDRESS, XDG_RUNTIME_DIR)") }
        var error = DBusError()
        dbus_error_init(&error)
        defer { dbus_error_free(&error) }
        guard let connection = dbus_connection_open_private(address, &error) else {
            return .failure(Self.text(error, "cannot connect to \(address)"))
        }
        dbus_connection_set_exit_on_disconnect(connection, 0)
        guard dbus_bus_register(connection, &error) != 0 else {
            dbus_connection_close(connection)
            dbus_connection_unref(connection)
            return .failure(Self.text(error, "cannot register on \(address)"))
        }
        let reply = dbus_bus_request_name(connection, StoreBrokerDBus.busName, UInt32(DBUS_NAME_FLAG_DO_NOT_QUEUE), &error)
        if reply != DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER && reply != DBUS_REQUEST_NAME_REPLY_ALREADY_OWNER {
            logger.warning(
                "D-Bus: \(StoreBrokerDBus.busName) is owned by another process; signalling anyway from \(String(cString: dbus_bus_get_unique_name(connection)))")
        }
        return .success(connection)
    }

    private static func text(_ error: DBusError, _ fallback: String) -> String {
        guard let message = error.message else { return fallback }
        return String(cString: message)
    }

    /// Lets a burst gather: waits until the oldest queued signal is `gatherDelay` old (unless stopping), so
    /// that consecutive signals of one store merge into few. A lone signal is sent at most that late.
    private func gather() {
        let (first, stopping) = shared.withLock { ($0.firstQueuedAt, $0.stopping) }
        guard let first, !stopping else { return }
        let remaining = first + Self.gatherDelay - .now
        guard remaining > .zero else { return }
        let (seconds, attoseconds) = remaining.components
        var pause = timespec(tv_sec: Int(seconds), tv_nsec: Int(attoseconds / 1_000_000_000))
        nanosleep(&pause, nil)
    }

    /// Sends what is queued, merged; returns whether the publisher is stopping.
    private func send(on connection: OpaquePointer) -> Bool {
        let (batch, dropped, stopping) = shared.withLock { shared in
            defer {
                shared.queue.removeAll(keepingCapacity: true)
                shared.firstQueuedAt = nil
                shared.dropped = 0
                shared.wakePending = false
            }
            return (Array(shared.queue), shared.dropped, shared.stopping)
        }
        if dropped > 0 { logger.warning("D-Bus: \(dropped) signals dropped (the bus is slower than the writers)") }
        var merged: [Signal] = []
        for signal in batch {
            // Merged in place: merging into a copy of the last one (`if var last = merged.last`) would copy its ids,
            // up to 1,000 strings, for every signal of a burst.
            let last = merged.count - 1
            if last >= 0, merged[last].merge(signal) { continue }
            merged.append(signal)
        }
        for signal in merged { emit(signal, on: connection) }
        if !merged.isEmpty { dbus_connection_flush(connection) }
        return stopping
    }

    private func emit(_ signal: Signal, on connection: OpaquePointer) {
        let member: String
        switch signal.kind {
        case .store: member = "StoreEvent"
        case .value: member = "ValueChanged"
        }
        guard let message = dbus_message_new_signal(StoreBrokerDBus.objectPath, StoreBrokerDBus.interface, member) else { return }
        defer { dbus_message_unref(message) }
        var iterator = DBusMessageIter()
        dbus_message_iter_init_append(message, &iterator)
        sb_dbus_append_string(&iterator, signal.name)
        sb_dbus_append_uint64(&iterator, dbus_uint64_t(signal.sequence))
        switch signal.kind {
        case .store(let operation):
            sb_dbus_append_string(&iterator, operation)
            var array = DBusMessageIter()
            sb_dbus_open_string_array(&iterator, &array)
            for id in signal.ids { sb_dbus_append_string(&array, id) }
            dbus_message_iter_close_container(&iterator, &array)
            sb_dbus_append_bool(&iterator, signal.complete ? 1 : 0)
        case .value(let secure):
            sb_dbus_append_bool(&iterator, secure ? 1 : 0)
        }
        dbus_connection_send(connection, message, nil)
    }

    /// Reads and answers what came in; `false` when the connection is gone.
    private func serve(_ connection: OpaquePointer) -> Bool {
        guard dbus_connection_read_write(connection, 0) != 0 else { return false }
        while let message = dbus_connection_pop_message(connection) {
            defer { dbus_message_unref(message) }
            if dbus_message_is_signal(message, "org.freedesktop.DBus.Local", "Disconnected") != 0 { return false }
            guard dbus_message_get_type(message) == sb_dbus_type_method_call else { continue }
            answer(message, on: connection)
        }
        return dbus_connection_get_is_connected(connection) != 0
    }

    /// Answers a method call as a libdbus or GDBus object tree would: `Peer` on every path; on the object path
    /// the full introspection and `UnknownMethod` for the rest; on its parents (`/`, `/org`, `/org/storebroker`)
    /// an introspection naming the next child, so `gdbus introspect --recurse` finds the object; anywhere else
    /// `UnknownObject`.
    private func answer(_ call: OpaquePointer, on connection: OpaquePointer) {
        let path = dbus_message_get_path(call).map { String(cString: $0) } ?? ""
        let place = StoreBrokerDBus.Place(path)
        let reply: OpaquePointer?
        if dbus_message_is_method_call(call, "org.freedesktop.DBus.Peer", "Ping") != 0 {
            reply = dbus_message_new_method_return(call)
        } else if dbus_message_is_method_call(call, "org.freedesktop.DBus.Peer", "GetMachineId") != 0 {
            reply = dbus_message_new_method_return(call)
            if let reply, let machine = dbus_get_local_machine_id() {
                var iterator = DBusMessageIter()
                dbus_message_iter_init_append(reply, &iterator)
                sb_dbus_append_string(&iterator, String(cString: machine))
                dbus_free(machine)
            }
        } else if dbus_message_is_method_call(call, "org.freedesktop.DBus.Introspectable", "Introspect") != 0,
            let xml = place.introspectionXML
        {
            reply = dbus_message_new_method_return(call)
            if let reply {
                var iterator = DBusMessageIter()
                dbus_message_iter_init_append(reply, &iterator)
                sb_dbus_append_string(&iterator, xml)
            }
        } else if dbus_message_get_no_reply(call) == 0 {
            switch place {
            case .object, .parent:
                let member = dbus_message_get_member(call).map { String(cString: $0) } ?? ""
                reply = dbus_message_new_error(
                    call, DBUS_ERROR_UNKNOWN_METHOD, "no method \(member) on \(path): storebrokerd only emits signals on D-Bus")
            case .unknown:
                reply = dbus_message_new_error(
                    call, DBUS_ERROR_UNKNOWN_OBJECT, "no object at \(path): storebrokerd's object is \(StoreBrokerDBus.objectPath)")
            }
        } else {
            reply = nil
        }
        if let reply {
            dbus_connection_send(connection, reply, nil)
            dbus_message_unref(reply)
            dbus_connection_flush(connection)
        }
    }

    private func fileDescriptor(of connection: OpaquePointer) -> Int32 {
        var fd: Int32 = -1
        return dbus_connection_get_unix_fd(connection, &fd) != 0 ? fd : -1
    }

    /// Sleeps until a signal is queued, the bus has something for us, or `timeout` ms pass.
    private func waitForWake(on thread: WakeableThread, timeout: Int32, dbusFD: Int32 = -1) {
        if shared.withLock({ !$0.queue.isEmpty || $0.stopping }) { return }
        thread.wait(milliseconds: timeout, descriptor: dbusFD)
    }
}
