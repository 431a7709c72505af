/// The D-Bus names of the broker (PRODUCT.md "D-Bus"); docs/org.storebroker.StoreBroker1.xml is this XML.
public enum StoreBrokerDBus {
    public static let busName = "org.storebroker.StoreBroker1"
    public static let objectPath = "/org/storebroker/StoreBroker1"
    public static let interface = "org.storebroker.StoreBroker1"

    /// The `Introspectable` interface, as every introspection lists it.
    static let introspectable = """
          <interface name="org.freedesktop.DBus.Introspectable">
            <method name="Introspect">
              <arg name="xml_data" type="s" direction="out"/>
            </method>
          </interface>
        """

    /// What `org.freedesktop.DBus.Introspectable.Introspect` answers on `objectPath`.
    public static let introspectionXML = """
        <!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">
        <node name="/org/storebroker/StoreBroker1">
          <!-- Signals of storebrokerd, the only writer of its stores and values. Names and ids only: item
               payloads and values never travel on D-Bus; fetch them over the broker's socket. -->
          <interface name="org.storebroker.StoreBroker1">
            <!-- One per step of a commit, all with the commit's sequence. operation: "insert" or "remove" (a
                 removeAll, or a drop at sequence 0, is a remove of every id). complete is false when the ids
                 were cut short. In a burst, consecutive signals of one store with the same operation may be
                 merged (ids joined, the last sequence). -->
            <signal name="StoreEvent">
              <arg name="store" type="s"/>
              <arg name="sequence" type="t"/>
              <arg name="operation" type="s"/>
              <arg name="ids" type="as"/>
              <arg name="complete" type="b"/>
            </signal>
            <!-- A value (secure false) or secure value (secure true) was set or reset. -->
            <signal name="ValueChanged">
              <arg name="name" type="s"/>
              <arg name="sequence" type="t"/>
              <arg name="secure" type="b"/>
            </signal>
          </interface>
        \(introspectable)
          <interface name="org.freedesktop.DBus.Peer">
            <method name="Ping"/>
            <method name="GetMachineId">
              <arg name="machine_uuid" type="s" direction="out"/>
            </method>
          </interface>
        </node>

        """

    /// Where a method call is addressed, relative to the broker's one object.
    enum Place: Equatable {
        /// `objectPath` itself.
        case object
        /// A parent of `objectPath`; `child` is the next path element towards it.
        case parent(child: String)
        /// Anything else: no object there.
        case unknown

        init(_ path: String) {
            if path == StoreBrokerDBus.objectPath {
                self = .object
                return
            }
            let prefix = path == "/" ? "/" : path + "/"
            guard StoreBrokerDBus.objectPath.hasPrefix(prefix) else {
                self = .unknown
                return
            }
            let rest = StoreBrokerDBus.objectPath.dropFirst(prefix.count)
            self = .parent(child: String(rest.prefix { $0 != "/" }))
        }

        /// What `Introspect` answers here; nil where there is no object.
        var introspectionXML: String? {
            switch self {
            case .object: return StoreBrokerDBus.introspectionXML
            case .parent(let child):
                return """
                    <!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
                     "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">
                    <node>
                    \(StoreBrokerDBus.introspectable)
                      <node name="\(child)"/>
                    </node>

                    """
            case .unknown: return nil
            }
        }
    }
}
