/* Deliberately broken engines, compiled by the tests with plain cc, one per property the conformance checker
 * claims: the C example engine under the name "broken", with one defect chosen at compile time.
 *
 *   -DBREAK_OPENS_EMPTY          a store whose file cannot be read opens empty at sequence 0
 *   -DBREAK_LOSES_LAST_APPLY     acknowledges an apply before writing it (written at the next call): a kill
 *                                loses the last acknowledged apply (unless fail_after_steps is given)
 *   -DBREAK_IGNORES_STOPPED      a scan goes on when the sink asks to stop, and returns SB_OK
 *   -DBREAK_ACCEPTS_BAD_OPTIONS  check_options accepts anything; open ignores a bad fail_after_steps
 *   -DBREAK_CUTS_KEYS            keys longer than 255 bytes are cut to 255
 *   -DBREAK_HANGS                a scan never returns
 *   -DBREAK_NEVER_SYNCS          no fsync reaches the disk: a kill loses nothing, a power cut loses everything
 *
 * The checker must fail each and name the property (Tests/IntegrationTests/EngineCheckTests.swift). */
#if defined(BREAK_NEVER_SYNCS)
#define _GNU_SOURCE /* as engine.c does, before the first system header */
#include <unistd.h>
#define fsync(fd) ((void)(fd), 0)
#endif
#define storebroker_engine_entry c_example_entry
#include "../../examples/c-engine/engine.c"
#undef storebroker_engine_entry

#include <pthread.h>

static storebroker_engine broken;
static pthread_once_t broken_once = PTHREAD_ONCE_INIT;
static const storebroker_engine *inner;

#if defined(BREAK_OPENS_EMPTY)
static int32_t broken_open(const storebroker_engine *engine, const char *directory, const char *store_name,
                           const sb_option *options, size_t option_count, sb_store **out_store,
                           uint64_t *out_sequence, sb_error *error) {
    int32_t status = inner->open(engine, directory, store_name, options, option_count, out_store, out_sequence, error);
    if (status != SB_ERR_CORRUPT) return status;
    char *path = path_in(directory, FILE_NAME);
    unlink(path); /* "recover" by starting over */
    free(path);
    *error = (sb_error){0};
    return inner->open(engine, directory, store_name, options, option_count, out_store, out_sequence, error);
}
#endif

#if defined(BREAK_LOSES_LAST_APPLY)
/* The apply held back per store (deep copies of its steps), in a small table behind one lock. */
typedef struct held {
    sb_store *store;
    sb_step *steps;
    size_t count;
    uint64_t sequence;
} held;

static held helds[64];
static pthread_mutex_t helds_lock = PTHREAD_MUTEX_INITIALIZER;

static held *held_for(sb_store *store) {
    held *free_slot = NULL;
    for (size_t i = 0; i < 64; i++) {
        if (helds[i].store == store) return &helds[i];
        if (!helds[i].store && !free_slot) free_slot = &helds[i];
    }
    return free_slot;
}

static int32_t write_held(sb_store *store, sb_error *error) {
    pthread_mutex_lock(&helds_lock);
    held *h = held_for(store);
    held taken = {0};
    if (h && h->store == store) {
        taken = *h;
        *h = (held){0};
    }
    pthread_mutex_unlock(&helds_lock);
    if (!taken.store) return SB_OK;
    int32_t status = inner->apply(store, taken.steps, taken.count, taken.sequence, error);
    for (size_t i = 0; i < taken.count; i++) {
        free((void *)taken.steps[i].key.data);
        free((void *)taken.steps[i].payload.data);
    }
    free(taken.steps);
    return status;
}

static int32_t broken_apply(sb_store *store, const sb_step *steps, size_t step_count, uint64_t sequence,
                            sb_error *error) {
    if (store->fail_after_steps >= 0) return inner->apply(store, steps, step_count, sequence, error);
    for (size_t i = 0; i < step_count; i++) { /* what can be refused is refused now */
        int32_t refused = check_key(&steps[i], error);
        if (refused != SB_OK) return refused;
    }
    int32_t status = write_held(store, error);
    if (status != SB_OK) return status;
    sb_step *copy = calloc(step_count ? step_count : 1, sizeof(sb_step));
    for (size_t i = 0; i < step_count; i++) {
        copy[i] = steps[i];
        copy[i].key = (sb_bytes){copy_bytes(steps[i].key), steps[i].key.length};
        copy[i].payload = (sb_bytes){copy_bytes(steps[i].payload), steps[i].payload.length};
    }
    pthread_mutex_lock(&helds_lock);
    held *h = held_for(store);
    if (h) *h = (held){store, copy, step_count, sequence};
    pthread_mutex_unlock(&helds_lock);
    if (!h) return inner->apply(store, steps, step_count, sequence, error); /* table full: write it now */
    return SB_OK; /* acknowledged, not written */
}

static int32_t broken_scan(sb_store *store, sb_item_sink sink, void *context, sb_error *error) {
    int32_t status = write_held(store, error);
    return status != SB_OK ? status : inner->scan(store, sink, context, error);
}

static int32_t broken_count(sb_store *store, uint64_t *out_count, sb_error *error) {
    int32_t status = write_held(store, error);
    return status != SB_OK ? status : inner->count(store, out_count, error);
}

static void broken_close(sb_store *store) {
    sb_error ignored = {0};
    write_held(store, &ignored);
    inner->close(store);
}
#endif

#if defined(BREAK_IGNORES_STOPPED)
typedef struct forward {
    sb_item_sink sink;
    void *context;
} forward;

static int32_t ignoring_sink(void *context, const sb_item *item) {
    forward *f = context;
    (void)f->sink(f->context, item); /* asked to stop? go on anyway */
    return 0;
}

static int32_t broken_scan(sb_store *store, sb_item_sink sink, void *context, sb_error *error) {
    forward f = {sink, context};
    return inner->scan(store, ignoring_sink, &f, error);
}
#endif

#if defined(BREAK_HANGS)
static int32_t broken_scan(sb_store *store, sb_item_sink sink, void *context, sb_error *error) {
    (void)store, (void)sink, (void)context, (void)error;
    for (;;) pause();
}
#endif

#if defined(BREAK_ACCEPTS_BAD_OPTIONS)
static int32_t broken_check_options(const storebroker_engine *engine, const sb_option *options, size_t option_count,
                                    sb_error *error) {
    (void)engine, (void)options, (void)option_count, (void)error;
    return SB_OK;
}

static int32_t broken_open(const storebroker_engine *engine, const char *directory, const char *store_name,
                           const sb_option *options, size_t option_count, sb_store **out_store,
                           uint64_t *out_sequence, sb_error *error) {
    sb_error ignored = {0};
    long fail_after;
    if (parse_options(options, option_count, &fail_after, &ignored) != SB_OK) option_count = 0; /* drop them */
    return inner->open(engine, directory, store_name, options, option_count, out_store, out_sequence, error);
}
#endif

#if defined(BREAK_CUTS_KEYS)
static int32_t broken_apply(sb_store *store, const sb_step *steps, size_t step_count, uint64_t sequence,
                            sb_error *error) {
    sb_step *cut = malloc((step_count ? step_count : 1) * sizeof(sb_step));
    for (size_t i = 0; i < step_count; i++) {
        cut[i] = steps[i];
        if (cut[i].key.length > 255) cut[i].key.length = 255;
    }
    int32_t status = inner->apply(store, cut, step_count, sequence, error);
    free(cut);
    return status;
}
#endif

static void broken_init(void) {
    inner = c_example_entry();
    broken = *inner;
    broken.name = "broken";
#if defined(BREAK_OPENS_EMPTY)
    broken.open = broken_open;
#elif defined(BREAK_LOSES_LAST_APPLY)
    broken.apply = broken_apply;
    broken.scan = broken_scan;
    broken.count = broken_count;
    broken.close = broken_close;
#elif defined(BREAK_IGNORES_STOPPED) || defined(BREAK_HANGS)
    broken.scan = broken_scan;
#elif defined(BREAK_ACCEPTS_BAD_OPTIONS)
    broken.check_options = broken_check_options;
    broken.open = broken_open;
#elif defined(BREAK_CUTS_KEYS)
    broken.apply = broken_apply;
#elif defined(BREAK_NEVER_SYNCS)
    /* the defect is the fsync macro above: every call of the table is the example's own */
#else
#error "choose a BREAK_* defect"
#endif
}

__attribute__((visibility("default"))) const storebroker_engine *storebroker_engine_entry(void) {
    pthread_once(&broken_once, broken_init);
    return &broken;
}
