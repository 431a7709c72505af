/*
 * c-example: a small, complete storebroker storage engine in plain C (C11, libc only).
 *
 * Each store is one file, `store.sbce`, in the directory the host gives it. The whole store is held in memory
 * (an array in insertion order plus a hash index) and every apply rewrites the file: write `store.sbce.tmp`,
 * fsync it, rename it over `store.sbce`, fsync the directory. The rename is the commit point, so an apply is
 * atomic and durable; if an apply fails midway, the store reloads its last committed file. This is simple
 * rather than fast (an apply costs time proportional to the whole store); it shows every part of the ABI.
 *
 * File format (integers little-endian):
 *   "SBCE0001"  magic
 *   u64 sequence, u64 count
 *   count x { u32 key_length, key, u32 payload_length, payload, u64 created_at, u64 updated_at }
 *
 * Build it by hand:  cc -std=c11 -O2 -shared -fPIC -I ../../Sources/CStorageEngine/include \
 *                       -o libstorebroker-engine-c-example.so engine.c
 * (`swift build` also builds it, as the product storebroker-engine-c-example.)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storebroker_engine.h"

#define FILE_NAME "store.sbce"
#define TEMP_NAME "store.sbce.tmp"
static const char MAGIC[8] = {'S', 'B', 'C', 'E', '0', '0', '0', '1'};

/* ---- Errors ---------------------------------------------------------------------------------------------- */

static int32_t fail(sb_error *error, int32_t code, const char *format, ...) {
    if (error) {
        error->code = code;
        va_list args;
        va_start(args, format);
        vsnprintf(error->message, SB_ERROR_MESSAGE_CAPACITY, format, args);
        va_end(args);
    }
    return code;
}

static int32_t fail_errno(sb_error *error, const char *what, const char *path) {
    int code = errno;
    return fail(error, code == ENOSPC || code == EDQUOT ? SB_ERR_FULL : SB_ERR_IO, "%s %s: %s", what, path,
                strerror(code));
}

/* ---- The in-memory store ------------------------------------------------------------------------------- */

typedef struct item {
    uint8_t *key;
    size_t key_length;
    uint8_t *payload;
    size_t payload_length;
    uint64_t created_at, updated_at;
    int removed;
} item;

struct sb_store {
    char *directory;
    long fail_after_steps; /* -1: never */
    uint64_t sequence;
    item *items;           /* insertion order; removed items stay as holes until the next save */
    size_t item_count, item_capacity, live;
    size_t *slots;         /* hash index: item index + 1, 0 = empty */
    size_t slot_count;
};

static uint64_t hash(const uint8_t *key, size_t length) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < length; i++) h = (h ^ key[i]) * 1099511628211ull;
    return h;
}

/* The slot for `key`: the one holding it (live or removed), or the empty one where it would go. */
static size_t *find_slot(struct sb_store *s, const uint8_t *key, size_t length) {
    size_t mask = s->slot_count - 1;
    for (size_t i = hash(key, length) & mask;; i = (i + 1) & mask) {
        size_t *slot = &s->slots[i];
        if (*slot == 0) return slot;
        item *it = &s->items[*slot - 1];
        if (it->key_length == length && (length == 0 || memcmp(it->key, key, length) == 0)) return slot;
    }
}

static item *lookup(struct sb_store *s, const uint8_t *key, size_t length) {
    size_t *slot = find_slot(s, key, length);
    if (*slot == 0) return NULL;
    item *it = &s->items[*slot - 1];
    return it->removed ? NULL : it;
}

static void free_items(struct sb_store *s) {
    for (size_t i = 0; i < s->item_count; i++) {
        free(s->items[i].key);
        free(s->items[i].payload);
    }
    free(s->items);
    free(s->slots);
    s->items = NULL;
    s->slots = NULL;
    s->item_count = s->item_capacity = s->live = s->slot_count = 0;
}

/* Rebuilds the hash index with room for `count` items (and drops holes from the array). */
static int rebuild_index(struct sb_store *s, size_t count) {
    size_t kept = 0;
    for (size_t i = 0; i < s->item_count; i++) {
        if (s->items[i].removed) {
            free(s->items[i].key);
            free(s->items[i].payload);
        } else {
            s->items[kept++] = s->items[i];
        }
    }
    s->item_count = kept;
    size_t slot_count = 16;
    while (slot_count < 2 * (count + 1)) slot_count *= 2;
    size_t *slots = calloc(slot_count, sizeof(size_t));
    if (!slots) return -1;
    free(s->slots);
    s->slots = slots;
    s->slot_count = slot_count;
    for (size_t i = 0; i < s->item_count; i++) *find_slot(s, s->items[i].key, s->items[i].key_length) = i + 1;
    return 0;
}

static uint8_t *copy_bytes(sb_bytes bytes) {
    uint8_t *copy = malloc(bytes.length ? bytes.length : 1);
    if (copy && bytes.length) memcpy(copy, bytes.data, bytes.length);
    return copy;
}

static int32_t put(struct sb_store *s, const sb_step *step, sb_error *error) {
    uint8_t *payload = copy_bytes(step->payload);
    if (!payload) return fail(error, SB_ERR_INTERNAL, "out of memory");
    item *existing = lookup(s, step->key.data, step->key.length);
    if (existing) { /* replace in place: the position is kept */
        free(existing->payload);
        existing->payload = payload;
        existing->payload_length = step->payload.length;
        existing->created_at = step->created_at;
        existing->updated_at = step->updated_at;
        return SB_OK;
    }
    if (s->item_count + 1 > s->slot_count / 2 && rebuild_index(s, 2 * (s->item_count + 1)) != 0) {
        free(payload);
        return fail(error, SB_ERR_INTERNAL, "out of memory");
    }
    if (s->item_count == s->item_capacity) {
        size_t capacity = s->item_capacity ? 2 * s->item_capacity : 64;
        item *items = realloc(s->items, capacity * sizeof(item));
        if (!items) {
            free(payload);
            return fail(error, SB_ERR_INTERNAL, "out of memory");
        }
        s->items = items;
        s->item_capacity = capacity;
    }
    item *it = &s->items[s->item_count];
    *it = (item){copy_bytes(step->key), step->key.length, payload, step->payload.length,
                 step->created_at, step->updated_at, 0};
    if (!it->key) {
        free(payload);
        return fail(error, SB_ERR_INTERNAL, "out of memory");
    }
    /* A removed key points its slot at the new, last item: it goes to the end. */
    *find_slot(s, it->key, it->key_length) = ++s->item_count;
    s->live++;
    return SB_OK;
}

static void remove_key(struct sb_store *s, sb_bytes key) {
    item *it = lookup(s, key.data, key.length);
    if (it) {
        it->removed = 1;
        s->live--;
    }
}

/* ---- The file ------------------------------------------------------------------------------------------- */

static char *path_in(const char *directory, const char *name) {
    char *path = NULL;
    return asprintf(&path, "%s/%s", directory, name) < 0 ? NULL : path;
}

static int write_all(int fd, const void *data, size_t length) {
    const uint8_t *p = data;
    while (length > 0) {
        ssize_t n = write(fd, p, length);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += n;
        length -= (size_t)n;
    }
    return 0;
}

/* A small write buffer, so that saving does not make one system call per field. */
typedef struct writer {
    int fd;
    uint8_t buffer[1 << 16];
    size_t used;
    int failed;
} writer;

static void emit(writer *w, const void *data, size_t length) {
    if (w->failed) return;
    if (w->used + length > sizeof w->buffer) {
        if (write_all(w->fd, w->buffer, w->used) != 0) w->failed = 1;
        w->used = 0;
        if (length > sizeof w->buffer) {
            if (write_all(w->fd, data, length) != 0) w->failed = 1;
            return;
        }
    }
    memcpy(w->buffer + w->used, data, length);
    w->used += length;
}

static void emit_u32(writer *w, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    emit(w, b, 4);
}

static void emit_u64(writer *w, uint64_t v) {
    emit_u32(w, (uint32_t)v);
    emit_u32(w, (uint32_t)(v >> 32));
}

static int32_t fsync_directory(const char *directory, sb_error *error) {
    int fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return fail_errno(error, "cannot open directory", directory);
    int status = fsync(fd);
    close(fd);
    return status == 0 ? SB_OK : fail_errno(error, "cannot fsync directory", directory);
}

/* Writes the whole store and commits it with a rename. */
static int32_t save(struct sb_store *s, sb_error *error) {
    char *temp = path_in(s->directory, TEMP_NAME), *final = path_in(s->directory, FILE_NAME);
    if (!temp || !final) {
        free(temp);
        free(final);
        return fail(error, SB_ERR_INTERNAL, "out of memory");
    }
    int32_t status = SB_OK;
    writer *w = malloc(sizeof *w); /* 64 KiB: not on the stack */
    if (!w) {
        free(temp);
        free(final);
        return fail(error, SB_ERR_INTERNAL, "out of memory");
    }
    w->fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    w->used = 0;
    w->failed = 0;
    if (w->fd < 0) {
        status = fail_errno(error, "cannot create", temp);
    } else {
        emit(w, MAGIC, sizeof MAGIC);
        emit_u64(w, s->sequence);
        emit_u64(w, s->live);
        for (size_t i = 0; i < s->item_count; i++) {
            item *it = &s->items[i];
            if (it->removed) continue;
            emit_u32(w, (uint32_t)it->key_length);
            emit(w, it->key, it->key_length);
            emit_u32(w, (uint32_t)it->payload_length);
            emit(w, it->payload, it->payload_length);
            emit_u64(w, it->created_at);
            emit_u64(w, it->updated_at);
        }
        if (!w->failed && w->used > 0 && write_all(w->fd, w->buffer, w->used) != 0) w->failed = 1;
        if (w->failed || fsync(w->fd) != 0) status = fail_errno(error, "cannot write", temp);
        close(w->fd);
        if (status == SB_OK && rename(temp, final) != 0) status = fail_errno(error, "cannot rename to", final);
        if (status == SB_OK) status = fsync_directory(s->directory, error);
        if (status != SB_OK) unlink(temp);
    }
    free(w);
    free(temp);
    free(final);
    return status;
}

typedef struct reader {
    const uint8_t *p, *end;
} reader;

static int take(reader *r, void *out, size_t length) {
    if ((size_t)(r->end - r->p) < length) return -1;
    memcpy(out, r->p, length);
    r->p += length;
    return 0;
}

static int take_u32(reader *r, uint32_t *v) {
    uint8_t b[4];
    if (take(r, b, 4)) return -1;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return 0;
}

static int take_u64(reader *r, uint64_t *v) {
    uint32_t lo, hi;
    if (take_u32(r, &lo) || take_u32(r, &hi)) return -1;
    *v = (uint64_t)hi << 32 | lo;
    return 0;
}

/* Loads the committed file into `s` (empty if there is none). */
static int32_t load(struct sb_store *s, sb_error *error) {
    free_items(s);
    s->sequence = 0;
    if (rebuild_index(s, 0) != 0) return fail(error, SB_ERR_INTERNAL, "out of memory");
    char *path = path_in(s->directory, FILE_NAME);
    if (!path) return fail(error, SB_ERR_INTERNAL, "out of memory");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int32_t status = errno == ENOENT ? SB_OK : fail_errno(error, "cannot open", path);
        free(path);
        return status;
    }
    struct stat info;
    uint8_t *data = NULL;
    int32_t status = SB_OK;
    if (fstat(fd, &info) != 0) {
        status = fail_errno(error, "cannot stat", path);
    } else if (!(data = malloc(info.st_size ? (size_t)info.st_size : 1))) {
        status = fail(error, SB_ERR_INTERNAL, "out of memory");
    } else {
        size_t done = 0;
        while (done < (size_t)info.st_size) {
            ssize_t n = read(fd, data + done, (size_t)info.st_size - done);
            if (n <= 0) {
                if (n < 0 && errno == EINTR) continue;
                status = n < 0 ? fail_errno(error, "cannot read", path) : fail(error, SB_ERR_CORRUPT, "%s shrank while reading", path);
                break;
            }
            done += (size_t)n;
        }
    }
    close(fd);
    if (status == SB_OK) {
        reader r = {data, data + info.st_size};
        char magic[8];
        uint64_t count = 0;
        if (take(&r, magic, 8) || memcmp(magic, MAGIC, 8) != 0 || take_u64(&r, &s->sequence) || take_u64(&r, &count))
            status = fail(error, SB_ERR_CORRUPT, "%s is not a c-example store file", path);
        for (uint64_t i = 0; status == SB_OK && i < count; i++) {
            uint32_t key_length, payload_length;
            sb_step step = {.kind = SB_STEP_PUT};
            if (take_u32(&r, &key_length) || (size_t)(r.end - r.p) < key_length) goto corrupt;
            step.key = (sb_bytes){r.p, key_length};
            r.p += key_length;
            if (take_u32(&r, &payload_length) || (size_t)(r.end - r.p) < payload_length) goto corrupt;
            step.payload = (sb_bytes){r.p, payload_length};
            r.p += payload_length;
            if (take_u64(&r, &step.created_at) || take_u64(&r, &step.updated_at)) goto corrupt;
            status = put(s, &step, error);
            continue;
        corrupt:
            status = fail(error, SB_ERR_CORRUPT, "%s is truncated at item %llu", path, (unsigned long long)i);
        }
        if (status == SB_OK && r.p != r.end) status = fail(error, SB_ERR_CORRUPT, "%s has trailing bytes", path);
    }
    free(data);
    free(path);
    return status;
}

/* ---- The ABI ------------------------------------------------------------------------------------------- */

/* Reads the options into `*fail_after` (-1: never); SB_ERR_INVALID names a bad one. */
static int32_t parse_options(const sb_option *options, size_t option_count, long *fail_after, sb_error *error) {
    *fail_after = -1;
    for (size_t i = 0; i < option_count; i++) {
        if (strcmp(options[i].key, "fail_after_steps") == 0) {
            char *end;
            errno = 0;
            long value = strtol(options[i].value, &end, 10);
            if (options[i].value[0] == '\0' || *end || value < 0 || errno == ERANGE)
                return fail(error, SB_ERR_INVALID, "fail_after_steps must be a whole number, got \"%s\"", options[i].value);
            *fail_after = value;
        } else {
            return fail(error, SB_ERR_INVALID, "unknown option %s", options[i].key);
        }
    }
    return SB_OK;
}

static int32_t engine_check_options(const storebroker_engine *engine, const sb_option *options, size_t option_count,
                                    sb_error *error) {
    (void)engine;
    long fail_after;
    return parse_options(options, option_count, &fail_after, error);
}

static int32_t engine_open(const storebroker_engine *engine, const char *directory, const char *store_name,
                           const sb_option *options, size_t option_count, sb_store **out_store,
                           uint64_t *out_sequence, sb_error *error) {
    (void)engine;
    (void)store_name;
    long fail_after;
    int32_t parsed = parse_options(options, option_count, &fail_after, error);
    if (parsed != SB_OK) return parsed;
    struct sb_store *s = calloc(1, sizeof *s);
    if (!s || !(s->directory = strdup(directory))) {
        free(s);
        return fail(error, SB_ERR_INTERNAL, "out of memory");
    }
    s->fail_after_steps = fail_after;
    int32_t status = load(s, error);
    if (status != SB_OK) {
        free_items(s);
        free(s->directory);
        free(s);
        return status;
    }
    *out_store = s;
    *out_sequence = s->sequence;
    return SB_OK;
}

static void engine_close(sb_store *s) {
    free_items(s);
    free(s->directory);
    free(s);
}

static int32_t engine_drop(const storebroker_engine *engine, const char *directory, const char *store_name,
                           const sb_option *options, size_t option_count, sb_error *error) {
    (void)engine, (void)store_name, (void)options, (void)option_count;
    const char *names[] = {FILE_NAME, TEMP_NAME};
    for (size_t i = 0; i < 2; i++) {
        char *path = path_in(directory, names[i]);
        if (!path) return fail(error, SB_ERR_INTERNAL, "out of memory");
        int gone = unlink(path) == 0 || errno == ENOENT;
        int32_t status = gone ? SB_OK : fail_errno(error, "cannot delete", path);
        free(path);
        if (status != SB_OK) return status;
    }
    return fsync_directory(directory, error);
}

/* Keys are 1 to SB_MAX_KEY_LENGTH bytes: the host never sends another, and an engine never cuts one. */
static int32_t check_key(const sb_step *step, sb_error *error) {
    if (step->kind == SB_STEP_REMOVE_ALL || (step->key.length >= 1 && step->key.length <= SB_MAX_KEY_LENGTH)) return SB_OK;
    return fail(error, SB_ERR_INVALID, "a key of %zu bytes (keys are 1 to %d bytes)", step->key.length, SB_MAX_KEY_LENGTH);
}

static int32_t engine_apply(sb_store *s, const sb_step *steps, size_t step_count, uint64_t sequence,
                            sb_error *error) {
    int32_t status = SB_OK;
    for (size_t i = 0; i < step_count && status == SB_OK; i++) {
        if (s->fail_after_steps >= 0 && (long)i == s->fail_after_steps) {
            status = fail(error, SB_ERR_INJECTED, "failure injected after %ld steps", s->fail_after_steps);
            break;
        }
        if ((status = check_key(&steps[i], error)) != SB_OK) break;
        switch (steps[i].kind) {
        case SB_STEP_PUT: status = put(s, &steps[i], error); break;
        case SB_STEP_REMOVE: remove_key(s, steps[i].key); break;
        case SB_STEP_REMOVE_ALL:
            for (size_t j = 0; j < s->item_count; j++) s->items[j].removed = 1;
            s->live = 0;
            break;
        default: status = fail(error, SB_ERR_INVALID, "unknown step kind %u", steps[i].kind);
        }
    }
    uint64_t previous = s->sequence;
    if (status == SB_OK) {
        s->sequence = sequence;
        status = save(s, error);
    }
    if (status != SB_OK) { /* roll back: the committed file is the truth */
        sb_error ignored = {0};
        s->sequence = previous;
        if (load(s, &ignored) != SB_OK) { /* the file became unreadable: serve nothing rather than guess */
            free_items(s);
            rebuild_index(s, 0);
        }
        return status;
    }
    if (s->item_count > 64 && s->item_count - s->live > s->live) rebuild_index(s, s->live);
    return SB_OK;
}

static sb_item view(const item *it) {
    return (sb_item){{it->key, it->key_length}, {it->payload, it->payload_length}, it->created_at, it->updated_at};
}

static int32_t engine_scan(sb_store *s, sb_item_sink sink, void *context, sb_error *error) {
    for (size_t i = 0; i < s->item_count; i++) {
        if (s->items[i].removed) continue;
        sb_item v = view(&s->items[i]);
        if (sink(context, &v) != 0) return fail(error, SB_ERR_STOPPED, "stopped by the host");
    }
    return SB_OK;
}

static int32_t engine_count(sb_store *s, uint64_t *out_count, sb_error *error) {
    (void)error;
    *out_count = s->live;
    return SB_OK;
}

static const char *const option_keys[] = {"fail_after_steps", NULL};

static const storebroker_engine table = {
    .abi_major = SB_ENGINE_ABI_MAJOR,
    .abi_minor = SB_ENGINE_ABI_MINOR,
    .struct_size = sizeof(storebroker_engine),
    .name = "c-example",
    .version = "2.0.0",
    .capabilities = SB_CAP_PERSISTENT | SB_CAP_ATOMIC,
    .option_keys = option_keys,
    .check_options = engine_check_options,
    .open = engine_open,
    .close = engine_close,
    .drop = engine_drop,
    .apply = engine_apply,
    .scan = engine_scan,
    .count = engine_count,
};

__attribute__((visibility("default"))) const storebroker_engine *storebroker_engine_entry(void) { return &table; }
