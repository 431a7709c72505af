// What Swift's Glibc module leaves out of malloc.h, for the daemon.
#ifndef STOREBROKER_CMALLOC_H
#define STOREBROKER_CMALLOC_H

#include <malloc.h>

/// Returns the allocator's free memory to the system (all arenas, free pages in the middle of a heap too).
static inline int sb_release_free_memory(void) { return malloc_trim(0); }

#endif
