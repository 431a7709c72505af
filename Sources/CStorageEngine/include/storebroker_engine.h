/*
 * storebroker storage engine ABI, version 2.1 (docs/ENGINE-ABI.md "Versions" lists what each version changed).
 *
 * A storage engine is a shared library named libstorebroker-engine-NAME.so that exports one symbol,
 * `storebroker_engine_entry`, returning a table of function pointers. The daemon (the "host") opens the file,
 * checks it (owner, permissions, ELF header) through its descriptor N, loads that very descriptor with
 * dlopen("/proc/self/fd/N", RTLD_NOW | RTLD_LOCAL) (docs/ENGINE-ABI.md "Naming and finding engines"), checks
 * the table's ABI version, size and name (NAME), and from then on calls only through the table. docs/ENGINE-ABI.md explains how to write an engine; examples/c-engine is one in C.
 *
 * Rules that hold for the whole ABI:
 *
 * - Versioning. Cutting or changing an entry point (or a struct, a code, a rule) is a major bump: the host
 *   refuses any major other than the one it speaks. Adding a member at the END of a struct is a minor bump:
 *   the host never calls a member that lies beyond the engine's reported `struct_size`, so an engine built for
 *   2.0 loads into any 2.x host, and a 2.x engine into a 2.0 host.
 * - Ownership. Every pointer the host passes in (directories, names, options, keys, payloads, steps, error
 *   structs) is owned by the host and valid only for the duration of the call; an engine that needs the bytes
 *   later copies them. Every pointer the engine passes out to a callback (items, keys, payloads) is owned by
 *   the engine and valid only until that callback returns; the host copies what it keeps. No allocator crosses
 *   the boundary: nothing is freed by the side that did not allocate it.
 * - Errors. Every call that can fail returns an `int32_t` status: SB_OK (0) or one of the SB_ERR_* codes. On
 *   failure the engine also fills the host-owned `sb_error` (code and a NUL-terminated message, cut to fit).
 *   An engine must never report success for work it did not do, and never turn an I/O error into "no data".
 *   SB_ERR_STOPPED needs no message (the host asked for it); filling one is allowed.
 * - Concurrency. The table and its strings are immutable and may be read from any thread. `open` and `drop`
 *   may be called concurrently from different threads, for different stores. Calls on one `sb_store` are
 *   serialized by the host (never two at once), but successive calls may come from different threads. Calls
 *   on different `sb_store`s may run concurrently. The host never opens the same store twice at once.
 * - Keys are raw byte strings of 1 to SB_MAX_KEY_LENGTH (1024) bytes; they may contain NUL and need not be
 *   UTF-8. The host never passes a longer or empty key (it validates ids first); an engine that is handed one
 *   anyway fails with SB_ERR_INVALID and never cuts it. Every engine stores and returns 1,024-byte keys whole.
 *   Payloads are raw bytes of any length (including 0) up to the protocol's item limit (under 16 MiB). Engines
 *   compare keys as bytes.
 * - Size of an apply. One apply carries every step of one commit group: up to 512 requests merged, each up to
 *   the protocol's maxBatch (10,000 steps by default), so an apply may hold several million steps and
 *   hundreds of MiB of payload. An engine that has its own limits (SQLite's 32,766 bound variables per
 *   statement) splits the work inside one transaction; it never refuses a large apply for its size alone.
 * - Order. A store keeps its items in the order they were first inserted: a put of an existing key keeps the
 *   item's position; a put of a new key (including a key removed earlier) goes last. Reads that return many
 *   items return them in that order. Order survives close and reopen.
 */
#ifndef STOREBROKER_ENGINE_H
#define STOREBROKER_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SB_ENGINE_ABI_MAJOR 2
#define SB_ENGINE_ABI_MINOR 2

/* The longest key, in bytes. */
#define SB_MAX_KEY_LENGTH 1024

/* ABI 2.2: the `power_loss_window` of an engine that may lose any number of acknowledged commits in a power cut
 * (but opens undamaged, at a commit it acknowledged). */
#define SB_POWER_LOSS_UNBOUNDED 0xFFFFFFFFFFFFFFFFULL

/* The name of the symbol every engine exports. */
#define SB_ENGINE_ENTRY_SYMBOL "storebroker_engine_entry"

/* Status codes. */
enum {
    SB_OK = 0,
    SB_ERR_IO = 1,          /* the storage failed (read, write, fsync) */
    SB_ERR_CORRUPT = 2,     /* the stored data is not readable as this engine's format */
    SB_ERR_FULL = 3,        /* no space left */
    SB_ERR_INVALID = 4,     /* a bad argument (unknown option value, a key that is too long, ...) */
    SB_ERR_UNSUPPORTED = 5, /* the engine cannot do this */
    SB_ERR_STOPPED = 6,     /* a callback asked to stop; not a failure of the engine */
    SB_ERR_INTERNAL = 7,    /* a bug in the engine */
    SB_ERR_INJECTED = 8,    /* a failure injected on purpose by the `fail_after_steps` test option */
    /* ABI 2.1, shared engines: */
    SB_ERR_CONFLICT = 9,    /* `apply_at`: the stored position is not the expected one (another host committed) */
    SB_ERR_GONE = 10        /* `commits_since`: the commit log no longer reaches back that far */
};

/* Durability. SB_OK from `apply` means the apply survives the engine's process being killed at any moment
 * after the call returns (kill -9, a crash, an out-of-memory kill): the host acknowledges a write only then.
 * Whether it also survives power loss or a kernel crash is the engine's to say in its documentation and
 * options (docs/ENGINE-ABI.md lists the shipped engines': sqlite's default synchronous=NORMAL may lose the
 * last commits on power loss, synchronous=FULL does not; disk and c-example fsync every apply). */

/* Capability bits (`capabilities`). */
enum {
    SB_CAP_PERSISTENT = 1u << 0, /* data survives close and reopen (a memory engine does not set it) */
    /* `apply` is all-or-nothing across a crash too. (An apply that returns an error leaves nothing, for every
       engine.) Without it, a process killed during an apply may leave part of it, shown after the store's next
       open: the host gives such an engine one request per apply (no group commit) and refuses chains of more
       than one operation (`notSupported`). */
    SB_CAP_ATOMIC = 1u << 1,
    /* ABI 1.1: `apply` never waits (no I/O, no lock another process holds) and takes time proportional to its
       steps; the host may then call it from its event loop, sparing a thread hand-off per commit. */
    SB_CAP_NONBLOCKING = 1u << 2,
    /* ABI 2.1: the store's data lives outside its directory, in a database that other processes and hosts may
       share: a store is named by `store_name` (and the engine's options), not by `directory`, and opening the
       same name in another directory, or on another host, opens the same store. The engine writes nothing to
       `directory`. */
    SB_CAP_SHARED = 1u << 3
};

/* Step kinds (`sb_step.kind`). */
enum {
    SB_STEP_PUT = 1,       /* insert or replace `key` with `payload`, `created_at`, `updated_at` */
    SB_STEP_REMOVE = 2,    /* remove `key`; absent keys are not an error */
    SB_STEP_REMOVE_ALL = 3 /* remove every item */
};

#define SB_ERROR_MESSAGE_CAPACITY 1024

/* A failure report. Owned by the host, passed zeroed to every call that can fail; the engine sets `code` and
 * writes a NUL-terminated `message` of at most SB_ERROR_MESSAGE_CAPACITY bytes, NUL included. */
typedef struct sb_error {
    int32_t code;
    char message[SB_ERROR_MESSAGE_CAPACITY];
} sb_error;

/* A byte string. `data` may be NULL when `length` is 0. */
typedef struct sb_bytes {
    const uint8_t *data;
    size_t length;
} sb_bytes;

/* An engine option, `key=value`, both NUL-terminated UTF-8. */
typedef struct sb_option {
    const char *key;
    const char *value;
} sb_option;

/* One step of an `apply`. Fields a kind does not use are zero. Times are milliseconds since the Unix epoch,
 * stamped by the host: the engine stores them as given (for a put of an existing key the host passes the
 * item's original `created_at`). */
typedef struct sb_step {
    uint32_t kind;
    uint32_t reserved; /* 0 */
    sb_bytes key;
    sb_bytes payload;
    uint64_t created_at;
    uint64_t updated_at;
} sb_step;

/* An item as an engine hands it out, valid until the callback returns. */
typedef struct sb_item {
    sb_bytes key;
    sb_bytes payload;
    uint64_t created_at;
    uint64_t updated_at;
} sb_item;

/* The callback of `scan`, provided by the host. It returns 0 to go on; any other value asks the engine to stop
 * at once (no further call of the sink) and return SB_ERR_STOPPED. It is called on the thread that made the
 * engine call, never after that call returns. */
typedef int32_t (*sb_item_sink)(void *context, const sb_item *item);

/* ABI 2.1. A store's position: the epoch of its incarnation (0: the store does not exist) and the sequence of
 * its last commit. The epoch is the host's (a random non-zero number it picks when a store is created); a shared
 * engine keeps it so that every host sees the same. */
typedef struct sb_position {
    uint64_t epoch;
    uint64_t sequence;
} sb_position;

/* ABI 2.1. One commit of a shared store, as the commit log keeps it: its sequence and the host's record of it
 * (bytes the engine keeps and hands back unread). */
typedef struct sb_commit {
    uint64_t sequence;
    sb_bytes record;
} sb_commit;

/* The callback of `commits_since`: as `sb_item_sink`, once per commit, in sequence order. */
typedef int32_t (*sb_commit_sink)(void *context, const sb_commit *commit);

/* The callback of `list_stores`: a store's name. */
typedef int32_t (*sb_name_sink)(void *context, const char *store_name);

/* The callback of `watch_changes`: the name of a store that may have new commits and, when the notice says it,
 * the store's position after the change (NULL: not known), so that a host already there (its own commit) does
 * nothing; or a NULL name for "any store may have changed" (after the engine lost and remade its watch, when
 * notices may have been missed). */
typedef int32_t (*sb_change_sink)(void *context, const char *store_name, const sb_position *position);

/* A watch on every store of a shared engine: opaque, owned by the engine from `watch_open` until `watch_close`. */
typedef struct sb_watch sb_watch;

/* An open store: opaque, owned by the engine from `open` until `close`. */
typedef struct sb_store sb_store;

typedef struct storebroker_engine storebroker_engine;

struct storebroker_engine {
    /* --- ABI 2.0 --- */

    /* The ABI the engine was built for (SB_ENGINE_ABI_MAJOR / _MINOR) and sizeof(storebroker_engine) as the
     * engine saw it. The host reads these three first and checks them before touching anything else. */
    uint16_t abi_major;
    uint16_t abi_minor;
    uint32_t struct_size;

    /* The engine's name (as in its file name) and version text. Static: valid while the library is loaded. */
    const char *name;
    const char *version;

    /* SB_CAP_* bits. */
    uint64_t capabilities;

    /* The option keys `open` and `drop` accept, as a NULL-terminated array of static strings. The host refuses
     * to start with an option the engine does not list. Every engine must accept "fail_after_steps" (for the
     * conformance suite: an apply whose steps number more than N fails with SB_ERR_INJECTED where step N+1
     * (counted from 1 within that apply, reset for each apply) would run, leaving nothing behind; applies of N
     * steps or fewer succeed; N = 0 fails every apply that has a step). */
    const char *const *option_keys;

    /* Checks option values without touching any store or file (the host calls it at start-up for every engine
     * given options, and stops with the message when it fails): SB_OK, or SB_ERR_INVALID naming the bad key
     * and value. `open` and `drop` check them again. */
    int32_t (*check_options)(const storebroker_engine *engine, const sb_option *options, size_t option_count,
                             sb_error *error);

    /* Opens (creating if needed) the store `store_name` whose data lives in `directory`, a directory the host
     * created for this store alone. On success sets `*out_store` and `*out_sequence` (the sequence of the last
     * `apply`, 0 for a new store) and returns SB_OK. A store whose data cannot be read fails: it never opens
     * as empty. */
    int32_t (*open)(const storebroker_engine *engine, const char *directory, const char *store_name,
                    const sb_option *options, size_t option_count, sb_store **out_store, uint64_t *out_sequence,
                    sb_error *error);

    /* Releases everything `open` acquired; `store` is not used again. Cannot fail. */
    void (*close)(sb_store *store);

    /* Deletes every file and table the store has in `directory`. The store is not open. Dropping a store that
     * has no data is not an error. */
    int32_t (*drop)(const storebroker_engine *engine, const char *directory, const char *store_name,
                    const sb_option *options, size_t option_count, sb_error *error);

    /* Applies `steps` in order and records `sequence` as the store's sequence, all in one transaction: when it
     * returns SB_OK all of it is durable (see "Durability" above), and when it fails none of it is visible,
     * now or after a restart. `step_count` may be 0 (only the sequence is recorded). After a failed apply the
     * host keeps the store open and goes on: its next apply carries the same sequence the failed one did (the
     * failed one never happened), and the host's memory is unchanged. */
    int32_t (*apply)(sb_store *store, const sb_step *steps, size_t step_count, uint64_t sequence, sb_error *error);

    /* Calls `sink` once per item, in the store's order. The host loads a store with one scan when it opens it
     * and serves every read from memory afterwards. */
    int32_t (*scan)(sb_store *store, sb_item_sink sink, void *context, sb_error *error);

    /* Sets `*out_count` to the number of items, which the next `scan` must yield (the host sizes its memory
     * from it before the scan). */
    int32_t (*count)(sb_store *store, uint64_t *out_count, sb_error *error);

    /* --- ABI 2.1: shared stores. An engine that sets SB_CAP_SHARED fills all seven; any other sets them NULL
     * (or reports a struct_size that ends before them). The host then commits only through `apply_at`, loads
     * through `load`, and learns of other hosts' commits through the watch and `commits_since`. --- */

    /* Reads, in one snapshot, the store's position and every item (as `scan`, in order). The host loads a shared
     * store with it (another host may commit between an `open` and a `scan`: their results could disagree). */
    int32_t (*load)(sb_store *store, sb_item_sink sink, void *context, sb_position *out_position, sb_error *error);

    /* Applies `steps` as `apply` does, only if the store's stored position is `expected` ({0, 0}: the store does
     * not exist, and this creates it), all in one transaction: records the position {epoch, the last commit's
     * sequence} and keeps each of `commits` (ascending sequences, each one more than the one before, the first
     * one more than expected.sequence, or 1 with a new epoch) in the store's commit log. Fails with
     * SB_ERR_CONFLICT, writing nothing, when the stored position is another: the host then catches up
     * (`commits_since`) and plans again. `epoch` equals expected.epoch unless expected is {0, 0}. */
    int32_t (*apply_at)(sb_store *store, const sb_step *steps, size_t step_count, sb_position expected, uint64_t epoch,
                        const sb_commit *commits, size_t commit_count, sb_error *error);

    /* Calls `sink` with every logged commit of epoch `epoch` after sequence `after`, in order, up to the stored
     * position at the time of the call, and sets `*out_position` to that position. If the store's epoch is no
     * longer `epoch` (it was dropped, and perhaps created again) it calls nothing, sets the position and returns
     * SB_OK: the host compares. SB_ERR_GONE when the log no longer holds commit after + 1 (the host reloads). */
    int32_t (*commits_since)(sb_store *store, uint64_t epoch, uint64_t after, sb_commit_sink sink, void *context,
                             sb_position *out_position, sb_error *error);

    /* Starts watching every store of the engine with these options (its own connection, for a database). Sets
     * `*out_watch`, and `*out_fd` to a descriptor that becomes readable when stores may have changed. */
    int32_t (*watch_open)(const storebroker_engine *engine, const sb_option *options, size_t option_count,
                          sb_watch **out_watch, int *out_fd, sb_error *error);

    /* Never blocks: calls `sink` with each store named by the notices that arrived since the last call (and its
     * position after the change, when known), then
     * sets `*out_fd` (the descriptor can change when the engine remakes its watch; -1: call again after a
     * short wait). On a lost connection it tries once to remake it: on success it calls `sink` with NULL
     * (notices may have been missed) and returns SB_OK; on failure it returns the error and `*out_fd` is -1. */
    int32_t (*watch_changes)(sb_watch *watch, sb_change_sink sink, void *context, int *out_fd, sb_error *error);

    /* Ends the watch; `watch` is not used again. */
    void (*watch_close)(sb_watch *watch);

    /* Calls `sink` with the name of every store that exists (a non-zero epoch) under these options, in any
     * order: the host lists stores other hosts created that it has not seen yet. */
    int32_t (*list_stores)(const storebroker_engine *engine, const sb_option *options, size_t option_count,
                           sb_name_sink sink, void *context, sb_error *error);

    /* --- ABI 2.2 --- */

    /* What a power cut (or a kernel crash) may take of what `apply` acknowledged, under these options: sets
     * `*out_window_ms` to the milliseconds before the cut whose acknowledged applies may be gone (0: none, every
     * acknowledged apply survives; SB_POWER_LOSS_UNBOUNDED: any number may be gone). Whatever it says, the
     * store opens undamaged after a power cut, at an apply it made. NULL, or a table that ends before it (an
     * engine built for 2.1 or 2.0): 0. The conformance checker's `power-loss` property holds engines to it. */
    int32_t (*power_loss_window)(const storebroker_engine *engine, const sb_option *options, size_t option_count,
                                 uint64_t *out_window_ms, sb_error *error);

    /* The capabilities under these options (which `check_options` accepted), for an engine whose applies block
     * under some options and not others: the host takes SB_CAP_NONBLOCKING from here, every other bit from
     * `capabilities`, which must agree with it. NULL, or a table that ends before it: `capabilities`. */
    uint64_t (*capabilities_under)(const storebroker_engine *engine, const sb_option *options, size_t option_count);

    /* --- Members added by later minor versions go here, and only here. --- */
};

/* The entry point: returns the engine's table, which lives as long as the library is loaded. Must be
 * callable more than once and from any thread; it must not fail (report problems from `open`). */
const storebroker_engine *storebroker_engine_entry(void);

typedef const storebroker_engine *(*storebroker_engine_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* STOREBROKER_ENGINE_H */
