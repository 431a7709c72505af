/// The D-Bus names of the broker (PRODUCT.md "D-Bus"); docs/org.storebroker.StoreBroker1.xml is this XML.
public enum StoreBrokerDBus {
    public static let busName = "org.storebroker.StoreBroker1"
    public static let objectPath = "/org/storebroker/StoreBroker1"
    public static let interface = "org.storebroker.StoreBroker1"

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
          <interface name="org.freedesktop.DBus.Introspectable">
            <method name="Introspect">
              <arg name="xml_data" type="s" direction="out"/>
            </method>
          </interface>
          <interface name="org.freedesktop.DBus.Peer">
            <method name="Ping"/>
            <method name="GetMachineId">
              <arg name="machine_uuid" type="s" direction="out"/>
            </method>
          </interface>
        </node>

        """
}
