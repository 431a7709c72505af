#!/usr/bin/python3
"""Prints storebrokerd's D-Bus signals as JSON lines: a listener that holds no socket connection.

    /usr/bin/python3 examples/dbus-listener.py [--address ADDR] [--store NAME] [--count N]

--address: a bus address (default: the session bus). --store: only that store's StoreEvent signals, filtered
by the bus itself (match rule arg0='NAME'). --count: exit after N signals. Needs python3-dbus and python3-gi
(`/usr/bin/python3`: the pyenv python on PATH may lack them).
"""
import argparse
import json
import sys

import dbus
import dbus.mainloop.glib
from gi.repository import GLib

INTERFACE = "org.storebroker.StoreBroker1"
PATH = "/org/storebroker/StoreBroker1"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="bus address (default: the session bus)")
    parser.add_argument("--store", help="only this store's StoreEvent signals")
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

    def store_event(store, sequence, operation, ids, complete):
        printed({"signal": "StoreEvent", "store": str(store), "sequence": int(sequence),
                 "operation": str(operation), "ids": [str(i) for i in ids], "complete": bool(complete)})

    def value_changed(name, sequence, secure):
        printed({"signal": "ValueChanged", "name": str(name), "sequence": int(sequence), "secure": bool(secure)})

    filters = {"arg0": options.store} if options.store else {}
    bus.add_signal_receiver(store_event, signal_name="StoreEvent", dbus_interface=INTERFACE, path=PATH, **filters)
    if not options.store:
        bus.add_signal_receiver(value_changed, signal_name="ValueChanged", dbus_interface=INTERFACE, path=PATH)
    # Say when the match rules are in place, so a script knows it can start writing.
    print(json.dumps({"listening": bus.get_unique_name()}), flush=True)
    loop.run()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(0)
