import Foundation
import TestSupport
import Testing


private let hasDBus = FileManager.default.isExecutableFile(atPath: "/usr/bin/dbus-daemon")
    && FileManager.default.isExecutableFile(atPath: "/usr/bin/dbus-monitor")

extension Integration {
    /// StoreEvent and ValueChanged signals on a private bus, read by dbus-monitor and python3-dbus.
    @Suite(.enabled(if: hasDBus, "needs dbus-daemon and dbus-monitor")) struct DBus {
        private func withBusAndDaemon(_ body: (PrivateBus, Daemon) async throws -> Void) async throws {
            try await withTemporaryDirectory { directory in
                let bus = PrivateBus(in: directory)
                try await bus.start()
                let daemon = Daemon(in: directory, arguments: ["--dbus-address", bus.stableAddress], dbus: true)
                do {
                    try await daemon.start()
                    #expect(try await bus.waitForOwner("org.storebroker.StoreBroker1"))
                    try await body(bus, daemon)
                } catch {
                    await daemon.stop()
                    await bus.stop()
                    throw error
                }
                await daemon.stop()
                await bus.stop()
            }
        }

        @Test func writesBecomeSignalsInSequenceOrder() async throws {
            try await withBusAndDaemon { bus, daemon in
                let monitor = try await Monitor(bus: bus)
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"a"}"#, #"{"id":"b"}"#])
                _ = try await daemon.storectl(["remove", "notes", "a", "absent"])
                _ = try await daemon.storectl(["apply", "notes"], stdin: "{\"op\":\"removeAll\"}\n{\"op\":\"insert\",\"item\":{\"id\":\"c\"}}\n")
                _ = try await daemon.storectl(["value", "set", "theme", "1"])
                _ = try await daemon.storectl(["secret", "set", "token", "planted-secret-value"])
                _ = try await daemon.storectl(["drop", "notes"])
                #expect(await monitor.waitFor { $0.member == "StoreEvent" && $0.sequence == 0 })
                await monitor.stop()
                let signals = monitor.signals
                // Expected, one per step: insert a,b @1; remove a @2; remove b @3 (the chain's removeAll); insert c @3;
                // remove c @0 (the drop). Compared merged, as the broker may merge a burst.
                #expect(merged(signals) == ["notes insert a,b @1", "notes remove a,b @3", "notes insert c @3", "notes remove c @0"])
                let sequences: [UInt64] = signals.filter { $0.member == "StoreEvent" }.map { $0.sequence }
                let committed: [UInt64] = sequences.filter { $0 != 0 }
                #expect(committed == committed.sorted())  // in sequence order (the drop's 0 comes last)
                #expect(sequences.last == 0)
                #expect(signals.filter { $0.member == "StoreEvent" }.allSatisfy { $0.flag })  // complete
                let values = signals.filter { $0.member == "ValueChanged" }
                #expect(values == [
                    MonitoredSignal(member: "ValueChanged", name: "theme", sequence: 1, flag: false),
                    MonitoredSignal(member: "ValueChanged", name: "token", sequence: 1, flag: true),
                ])
                #expect(!monitor.process.stdout.contains("planted-secret-value"))
            }
        }

        @Test func aMatchRuleOnArg0FiltersByStore() async throws {
            try await withBusAndDaemon { bus, daemon in
                // The rule docs/DBUS.md gives, sender included.
                let monitor = try await Monitor(
                    bus: bus, rule: "type='signal',sender='org.storebroker.StoreBroker1',interface='org.storebroker.StoreBroker1',member='StoreEvent',arg0='notes'")
                _ = try await daemon.storectl(["insert", "other", #"{"id":"x"}"#])
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"n"}"#])
                _ = try await daemon.storectl(["insert", "other", #"{"id":"y"}"#])
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"m"}"#])
                #expect(await monitor.waitFor { $0.ids == ["m"] })
                await monitor.stop()
                #expect(monitor.signals.map(\.name) == ["notes", "notes"])
            }
        }

        @Test func theDaemonSurvivesTheBusGoingAwayAndSignalsAgainWhenItIsBack() async throws {
            try await withBusAndDaemon { bus, daemon in
                let watcher = try await daemon.watch("notes")
                await bus.stop()
                // Socket clients carry on while there is no bus.
                #expect(try await daemon.storectl(["insert", "notes", #"{"id":"while-down"}"#]).stdout == "1\n")
                #expect(await watcher.waitFor(sequence: 1))
                try await bus.start()
                #expect(try await bus.waitForOwner("org.storebroker.StoreBroker1"))
                let monitor = try await Monitor(bus: bus)
                #expect(try await daemon.storectl(["insert", "notes", #"{"id":"back"}"#]).stdout == "2\n")
                #expect(await monitor.waitFor { $0.ids == ["back"] && $0.sequence == 2 })
                await monitor.stop()
                await watcher.stop()
                #expect(daemon.log.contains("the bus went away"))
            }
        }

        @Test func withNoBusAtStartTheDaemonRunsAndPicksTheBusUpLater() async throws {
            try await withTemporaryDirectory { directory in
                let bus = PrivateBus(in: directory)
                let daemon = Daemon(in: directory, arguments: ["--dbus-address", bus.stableAddress], dbus: true)
                try await daemon.start()
                #expect(try await daemon.storectl(["insert", "s", #"{"id":"1"}"#]).stdout == "1\n")
                try await bus.start()
                #expect(try await bus.waitForOwner("org.storebroker.StoreBroker1"))
                let monitor = try await Monitor(bus: bus)
                _ = try await daemon.storectl(["insert", "s", #"{"id":"2"}"#])
                #expect(await monitor.waitFor { $0.ids == ["2"] })
                await monitor.stop()
                await daemon.stop()
                await bus.stop()
                #expect(daemon.log.components(separatedBy: "no bus reachable").count == 2)  // one warning
            }
        }

        @Test func introspectionAndPeerAreAnswered() async throws {
            try await withBusAndDaemon { bus, daemon in
                func call(_ arguments: [String]) async throws -> String {
                    let child = try ChildProcess(
                        ["/usr/bin/dbus-send", "--bus=\(bus.stableAddress)", "--print-reply", "--dest=org.storebroker.StoreBroker1",
                         "/org/storebroker/StoreBroker1"] + arguments,
                        stdoutPath: daemon.directory + "/call.out", stderrPath: daemon.directory + "/call.err", in: daemon.directory)
                    #expect(await child.wait(atMost: 30) == 0, "\(child.stderr)")
                    return child.stdout
                }
                let xml = try await call(["org.freedesktop.DBus.Introspectable.Introspect"])
                #expect(xml.contains("<signal name=\"StoreEvent\">") && xml.contains("<arg name=\"ids\" type=\"as\"/>"))
                let committed = try String(contentsOfFile: repositoryRoot + "/docs/org.storebroker.StoreBroker1.xml", encoding: .utf8)
                #expect(xml.contains(committed.components(separatedBy: "\n")[2]))
                #expect(try await call(["org.freedesktop.DBus.Peer.Ping"]).contains("method return"))
                #expect(try await call(["org.freedesktop.DBus.Peer.GetMachineId"]).contains("string \""))
            }
        }

        /// Introspect elsewhere than the object: the parents of the object path list their child (as libdbus and
        /// GDBus objects do, so `gdbus introspect --recurse` from `/` finds the interface); any other path is
        /// `UnknownObject`, never the broker's interface.
        @Test func introspectionOfOtherPathsAnswersAsDBusExpects() async throws {
            try await withBusAndDaemon { bus, daemon in
                func call(_ path: String, _ method: String) async throws -> (status: Int32, out: String, err: String) {
                    let child = try ChildProcess(
                        ["/usr/bin/dbus-send", "--bus=\(bus.stableAddress)", "--print-reply", "--dest=org.storebroker.StoreBroker1", path, method],
                        stdoutPath: daemon.directory + "/call.out", stderrPath: daemon.directory + "/call.err", in: daemon.directory)
                    let status = await child.wait(atMost: 30)
                    return (status, child.stdout, child.stderr)
                }
                let introspect = "org.freedesktop.DBus.Introspectable.Introspect"
                let root = try await call("/", introspect)
                #expect(root.status == 0, "\(root.err)")
                #expect(root.out.contains(#"<node name="org"/>"#) && !root.out.contains("StoreEvent"), "\(root.out)")
                let parent = try await call("/org/storebroker", introspect)
                #expect(parent.status == 0, "\(parent.err)")
                #expect(parent.out.contains(#"<node name="StoreBroker1"/>"#) && !parent.out.contains("StoreEvent"), "\(parent.out)")
                for path in ["/nope", "/org/storebroker/StoreBroker1/child", "/org/store"] {
                    let unknown = try await call(path, introspect)
                    #expect(unknown.status != 0 && unknown.err.contains("org.freedesktop.DBus.Error.UnknownObject"), "\(path): \(unknown)")
                    let method = try await call(path, "org.storebroker.StoreBroker1.Anything")
                    #expect(method.err.contains("org.freedesktop.DBus.Error.UnknownObject"), "\(path): \(method)")
                }
                let method = try await call("/org/storebroker/StoreBroker1", "org.storebroker.StoreBroker1.Anything")
                #expect(method.err.contains("org.freedesktop.DBus.Error.UnknownMethod"), "\(method)")
                // Peer is answered on every path, as the specification says.
                #expect(try await call("/nope", "org.freedesktop.DBus.Peer.Ping").status == 0)
                if FileManager.default.isExecutableFile(atPath: "/usr/bin/gdbus") {
                    let child = try ChildProcess(
                        ["/usr/bin/gdbus", "introspect", "--address", bus.stableAddress, "--dest", "org.storebroker.StoreBroker1",
                         "--object-path", "/", "--recurse"],
                        stdoutPath: daemon.directory + "/gdbus.out", stderrPath: daemon.directory + "/gdbus.err", in: daemon.directory)
                    #expect(await child.wait(atMost: 30) == 0, "\(child.stderr)")
                    #expect(child.stdout.contains("/org/storebroker/StoreBroker1") && child.stdout.contains("StoreEvent"), "\(child.stdout)")
                }
            }
        }

        /// Two brokers on one bus: the listener follows the owner of the well-known name by default and another
        /// broker's unique name with `--sender`, so their events never mix.
        @Test func thePythonListenerFollowsOneBroker() async throws {
            guard FileManager.default.fileExists(atPath: "/usr/bin/python3") else { return }
            try await withBusAndDaemon { bus, first in
                let second = Daemon(
                    in: first.directory, socketPath: first.directory + "/second.sock",
                    dataDirectory: first.directory + "/second-data", arguments: ["--dbus-address", bus.stableAddress], dbus: true)
                try await second.start()
                #expect(await eventually { second.log.contains("signalling anyway from :") })
                let secondName = second.log.components(separatedBy: "signalling anyway from ").last?
                    .prefix { !$0.isWhitespace && $0 != "\"" }.description ?? ""
                func listener(_ name: String, _ extra: [String]) throws -> ChildProcess {
                    try ChildProcess(
                        ["/usr/bin/python3", repositoryRoot + "/examples/dbus-listener.py", "--address", bus.stableAddress, "--store", "notes"]
                            + extra,
                        stdoutPath: first.directory + "/\(name).out", stderrPath: first.directory + "/\(name).err", in: first.directory)
                }
                let ofFirst = try listener("first", [])
                let ofSecond = try listener("second", ["--sender", secondName])
                #expect(await eventually { ofFirst.stdout.contains("listening") && ofSecond.stdout.contains("listening") })
                _ = try await second.storectl(["insert", "notes", #"{"id":"from-second"}"#, #"{"id":"2"}"#])
                _ = try await first.storectl(["insert", "notes", #"{"id":"from-first"}"#])
                _ = try await second.storectl(["insert", "notes", #"{"id":"again-second"}"#])
                _ = try await first.storectl(["insert", "notes", #"{"id":"again-first"}"#])
                // Signals of a burst may merge, so the ids are compared flattened.
                func ids(_ child: ChildProcess) -> [String] {
                    child.stdout.split(separator: "\n").flatMap { line -> [String] in
                        guard let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else { return [] }
                        return object["ids"] as? [String] ?? []
                    }
                }
                #expect(await eventually { ids(ofFirst).count >= 2 && ids(ofSecond).count >= 3 })
                try await Task.sleep(for: .milliseconds(300))  // room for a stray signal of the other broker to arrive
                _ = await ofFirst.terminate(within: 10)
                _ = await ofSecond.terminate(within: 10)
                #expect(ids(ofFirst) == ["from-first", "again-first"], "\(ofFirst.stdout)")
                #expect(ids(ofSecond) == ["from-second", "2", "again-second"], "\(ofSecond.stdout)")
                #expect(ofSecond.stdout.contains(#""sender": "\#(secondName)""#), "\(ofSecond.stdout)")
                await second.stop()
            }
        }

        @Test func aSecondBrokerOnTheBusWarnsAndStillSignals() async throws {
            try await withBusAndDaemon { bus, first in
                let second = Daemon(
                    in: first.directory, socketPath: first.directory + "/second.sock",
                    dataDirectory: first.directory + "/second-data", arguments: ["--dbus-address", bus.stableAddress], dbus: true)
                try await second.start()
                let monitor = try await Monitor(bus: bus)
                #expect(await eventually { second.log.contains("owned by another process") })
                _ = try await second.storectl(["insert", "from-second", #"{"id":"1"}"#])
                #expect(await monitor.waitFor { $0.name == "from-second" })
                await monitor.stop()
                await second.stop()
            }
        }

        /// The example prints each signal with its sender, and an `owner` line when the broker restarts (what
        /// changed meanwhile was not signalled), then follows the new broker.
        @Test func thePythonListenerExample() async throws {
            guard FileManager.default.fileExists(atPath: "/usr/bin/python3") else { return }
            try await withBusAndDaemon { bus, daemon in
                let listener = try ChildProcess(
                    ["/usr/bin/python3", repositoryRoot + "/examples/dbus-listener.py", "--address", bus.stableAddress, "--store", "notes",
                     "--count", "3"],
                    stdoutPath: daemon.directory + "/listener.out", stderrPath: daemon.directory + "/listener.err", in: daemon.directory)
                #expect(await eventually { listener.stdout.contains("listening") }, "\(listener.stderr)")
                _ = try await daemon.storectl(["insert", "other", #"{"id":"x"}"#])
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"a"}"#])
                _ = try await daemon.storectl(["remove", "notes", "a"])
                #expect(await eventually { listener.stdout.contains(#""remove""#) })
                await daemon.stop()
                try await daemon.start()
                #expect(try await bus.waitForOwner("org.storebroker.StoreBroker1"))
                #expect(await eventually { listener.stdout.components(separatedBy: #"{"owner": ":"#).count == 2 }, "\(listener.stdout)")
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"b"}"#])
                #expect(await listener.wait(atMost: 30) == 0, "\(listener.stderr)")
                // Unique names are the bus's to give: the lines are compared with the sender taken out.
                let lines = listener.stdout.split(separator: "\n").dropFirst().map {
                    $0.replacingOccurrences(of: #""(sender|owner)": ":[0-9.]+""#, with: #""$1": ":N""#, options: .regularExpression)
                }
                #expect(lines == [
                    #"{"signal": "StoreEvent", "sender": ":N", "store": "notes", "sequence": 1, "operation": "insert", "ids": ["a"], "complete": true}"#,
                    #"{"signal": "StoreEvent", "sender": ":N", "store": "notes", "sequence": 2, "operation": "remove", "ids": ["a"], "complete": true}"#,
                    #"{"owner": ""}"#,
                    #"{"owner": ":N"}"#,
                    #"{"signal": "StoreEvent", "sender": ":N", "store": "notes", "sequence": 3, "operation": "insert", "ids": ["b"], "complete": true}"#,
                ])
            }
        }
    }
}
