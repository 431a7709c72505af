#!/usr/bin/python3
"""Prints storebrokerd's D-Bus signals as JSON lines: a listener that holds no socket connection.

    /usr/bin/python3 examples/dbus-listener.py [--address ADDR] [--store NAME] [--sender NAME] [--count N]

--address: a bus address (default: the session bus). --store: only that store's StoreEvent signals, filtered
by the bus itself (match rule arg0='NAME'). --sender: whose signals: by default the broker that owns
org.storebroker.StoreBroker1 (followed across restarts); another broker on the same bus by the unique name
its log gives ("signalling anyway from :1.7"). --count: exit after N signals. Each line names its sender; an
{"owner": ...} line says the name changed hands (a broker restarted: what changed meanwhile was not signalled,
so resynchronize over the socket). Needs python3-dbus and python3-gi (`/usr/bin/python3`: the pyenv python on
PATH may lack them).
"""
import argparse
import json
import sys

import dbus
import dbus.mainloop.glib
from gi.repository import GLib

BUS_NAME = "org.storebroker.StoreBroker1"
INTERFACE = "org.storebroker.StoreBroker1"
PATH = "/org/storebroker/StoreBroker1"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="bus address (default: the session bus)")
    parser.add_argument("--store", help="only this store's StoreEvent signals")
    parser.add_argument("--sender", default=BUS_NAME, help="only this broker's signals (default: the owner of %(default)s)")
    parser.add_argument("--count", type=int, default=0, help="exit after this many signals")
    options = parser.parse_args()

    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    bus = dbus.bus.BusConnection(options.address) if options.address else dbus.SessionBus()
    loop = GLib.MainLoop()
    seen = [0]

    def printed(record):
        print(json.dumps(record), flush=True)
        seen[0] += 1
        if options.count and seen[0] >= options.count:
            loop.quit()

    def store_event(store, sequence, operation, ids, complete, sender=None):
        printed({"signal": "StoreEvent", "sender": str(sender), "store": str(store), "sequence": int(sequence),
                 "operation": str(operation), "ids": [str(i) for i in ids], "complete": bool(complete)})

    def value_changed(name, sequence, secure, sender=None):
        printed({"signal": "ValueChanged", "sender": str(sender), "name": str(name), "sequence": int(sequence),
                 "secure": bool(secure)})

    # The sender filter is in the match rule, so the bus delivers only this broker's signals; with a well-known
    # name, python-dbus follows its owner (NameOwnerChanged) and a restarted broker is picked up.
    common = {"dbus_interface": INTERFACE, "path": PATH, "bus_name": options.sender, "sender_keyword": "sender"}
    filters = {"arg0": options.store} if options.store else {}
    bus.add_signal_receiver(store_event, signal_name="StoreEvent", **common, **filters)
    if not options.store:
        bus.add_signal_receiver(value_changed, signal_name="ValueChanged", **common)
    if not options.sender.startswith(":"):
        owners = []

        def owner_changed(owner):
            # Called once at once with the current owner ("" when none), then on each change.
            if owners:
                print(json.dumps({"owner": str(owner)}), flush=True)
            owners.append(owner)

        bus.watch_name_owner(options.sender, owner_changed)
    # Say when the match rules are in place, so a script knows it can start writing.
    print(json.dumps({"listening": bus.get_unique_name()}), flush=True)
    loop.run()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(0)
