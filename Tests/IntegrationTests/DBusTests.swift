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
                let monitor = try await Monitor(bus: bus, rule: "type='signal',interface='org.storebroker.StoreBroker1',arg0='notes'")
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

        @Test func thePythonListenerExample() async throws {
            guard FileManager.default.fileExists(atPath: "/usr/bin/python3") else { return }
            try await withBusAndDaemon { bus, daemon in
                let listener = try ChildProcess(
                    ["/usr/bin/python3", repositoryRoot + "/examples/dbus-listener.py", "--address", bus.stableAddress, "--store", "notes",
                     "--count", "2"],
                    stdoutPath: daemon.directory + "/listener.out", stderrPath: daemon.directory + "/listener.err", in: daemon.directory)
                #expect(await eventually { listener.stdout.contains("listening") }, "\(listener.stderr)")
                _ = try await daemon.storectl(["insert", "other", #"{"id":"x"}"#])
                _ = try await daemon.storectl(["insert", "notes", #"{"id":"a"}"#])
                _ = try await daemon.storectl(["remove", "notes", "a"])
                #expect(await listener.wait(atMost: 30) == 0, "\(listener.stderr)")
                let lines = listener.stdout.split(separator: "\n").dropFirst().map(String.init)
                #expect(lines == [
                    #"{"signal": "StoreEvent", "store": "notes", "sequence": 1, "operation": "insert", "ids": ["a"], "complete": true}"#,
                    #"{"signal": "StoreEvent", "store": "notes", "sequence": 2, "operation": "remove", "ids": ["a"], "complete": true}"#,
                ])
            }
        }
    }
}
