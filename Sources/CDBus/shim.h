// libdbus-1 for Swift. The header is included through this shim (a module map's own header paths are
// relative to it), and the parts Swift cannot import (type macros, variadic appends) get small wrappers.
#ifndef STOREBROKER_CDBUS_SHIM_H
#define STOREBROKER_CDBUS_SHIM_H
#include <dbus/dbus.h>

static const int sb_dbus_type_method_call = DBUS_MESSAGE_TYPE_METHOD_CALL;
static const int sb_dbus_type_signal = DBUS_MESSAGE_TYPE_SIGNAL;

static inline dbus_bool_t sb_dbus_append_string(DBusMessageIter *iter, const char *value) {
    return dbus_message_iter_append_basic(iter, DBUS_TYPE_STRING, &value);
}

static inline dbus_bool_t sb_dbus_append_uint64(DBusMessageIter *iter, dbus_uint64_t value) {
    return dbus_message_iter_append_basic(iter, DBUS_TYPE_UINT64, &value);
}

static inline dbus_bool_t sb_dbus_append_bool(DBusMessageIter *iter, int value) {
    dbus_bool_t flag = value ? TRUE : FALSE;
    return dbus_message_iter_append_basic(iter, DBUS_TYPE_BOOLEAN, &flag);
}

static inline dbus_bool_t sb_dbus_open_string_array(DBusMessageIter *iter, DBusMessageIter *array) {
    return dbus_message_iter_open_container(iter, DBUS_TYPE_ARRAY, DBUS_TYPE_STRING_AS_STRING, array);
}

#endif
