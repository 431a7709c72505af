#include <libpq-fe.h>

// Swift does not import character-literal macros reliably: name the ones the engine reads.
static inline int clibpq_diag_sqlstate(void) { return PG_DIAG_SQLSTATE; }
static inline int clibpq_diag_message_primary(void) { return PG_DIAG_MESSAGE_PRIMARY; }
