/* libstorebroker-powercut.so: an LD_PRELOAD library that records what a power cut would keep (see powercut.c).
 * It has no API of its own: it replaces fsync, fdatasync, syncfs and sync in the process it is preloaded into. */
#ifndef STOREBROKER_POWERCUT_H
#define STOREBROKER_POWERCUT_H
#endif
