#include <sqlite3.h>

// Swift cannot import SQLITE_TRANSIENT / SQLITE_STATIC (casts to function pointers): name them here.
static inline sqlite3_destructor_type csqlite_transient(void) { return SQLITE_TRANSIENT; }
static inline sqlite3_destructor_type csqlite_static(void) { return SQLITE_STATIC; }
