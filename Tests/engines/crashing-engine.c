/* A test engine, compiled by the tests with plain cc: the C example engine under the name "crashing", whose
 * apply segfaults once this process has made STOREBROKER_TEST_CRASH_AFTER applies (every other time after the
 * example has written the apply, before it returns; otherwise before anything is written). Without the variable
 * it is the C example. It checks that an engine crashing inside an apply loses no acknowledged write. */
#define storebroker_engine_entry c_example_entry
#include "../../examples/c-engine/engine.c"
#undef storebroker_engine_entry

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

static storebroker_engine crashing;
static pthread_once_t crashing_once = PTHREAD_ONCE_INIT;
static long crash_after = -1;
static atomic_long applies;

static void crash(void) {
    volatile int *nowhere = NULL;
    *nowhere = 1;
}

static int32_t crashing_apply(sb_store *store, const sb_step *steps, size_t step_count, uint64_t sequence,
                              sb_error *error) {
    long made = atomic_fetch_add(&applies, 1) + 1;
    if (crash_after >= 0 && made > crash_after) {
        if (made % 2 == 0) crash();
        c_example_entry()->apply(store, steps, step_count, sequence, error);
        crash();
    }
    return c_example_entry()->apply(store, steps, step_count, sequence, error);
}

static void crashing_init(void) {
    crashing = *c_example_entry();
    crashing.name = "crashing";
    crashing.apply = crashing_apply;
    const char *after = getenv("STOREBROKER_TEST_CRASH_AFTER");
    if (after != NULL) crash_after = atol(after);
}

__attribute__((visibility("default"))) const storebroker_engine *storebroker_engine_entry(void) {
    pthread_once(&crashing_once, crashing_init);
    return &crashing;
}
