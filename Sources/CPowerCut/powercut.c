/* libstorebroker-powercut.so: preloaded (LD_PRELOAD) into a process whose files under one directory tree are to
 * survive a simulated power cut. It records, in a shadow directory, what the syncs of that process made durable:
 *
 *   content-<id>      a regular file's bytes as they were when fsync or fdatasync of it last returned 0
 *   names-<id>        a directory's entries when fsync of it last returned 0: one line per entry, "f" or "d",
 *                     the entry's id, its name
 *   id-<inode>        the id of the file or directory that has that inode now
 *
 * An id names one file for its whole life: "i<inode>" for what existed before the process started, and a new
 * "n<pid>-<count>" whenever the process creates a file (open with O_CREAT of a path that did not exist) or a
 * directory, so that an inode number the file system reuses after an unlink never lends a new file the old
 * one's synced bytes (the first version of this library keyed records by inode, and the checker's power-loss
 * property failed the wal engine on a segment that had inherited a deleted snapshot's content).
 *
 * and syncfs or sync records every file and directory of the tree. Each record is written to a temporary name and
 * renamed, so a SIGKILL never leaves half a record. The process's own view of its files is untouched: writes
 * go to the real files, the real syncs run first, and a failed sync records nothing.
 *
 * After killing the process, the conformance checker (Sources/EngineConformance/PowerCut.swift) builds the tree
 * a power cut would leave: the names the last directory syncs recorded, each file with its last synced bytes, or
 * with some 512-byte sectors of what was written after that, as a disk may tear unsynced writes.
 *
 * Environment: SB_POWERCUT_ROOT, the tree (an absolute path without a trailing slash); SB_POWERCUT_SHADOW, the
 * directory for the records. Without both the library does nothing. Entry names must not hold a newline. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdarg.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *root;
static size_t root_length;
static const char *shadow;
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_syncfs)(int);
static void (*real_sync)(void);
static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_mkdir)(const char *, mode_t);
static pthread_once_t once = PTHREAD_ONCE_INIT;
static unsigned long created;
/* One sync is recorded at a time: two threads recording one file would race on its temporary name. */
static pthread_mutex_t recording = PTHREAD_MUTEX_INITIALIZER;

static void setup(void) {
    real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    real_syncfs = (int (*)(int))dlsym(RTLD_NEXT, "syncfs");
    real_sync = (void (*)(void))dlsym(RTLD_NEXT, "sync");
    real_open = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    real_openat = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat");
    real_mkdir = (int (*)(const char *, mode_t))dlsym(RTLD_NEXT, "mkdir");
    root = getenv("SB_POWERCUT_ROOT");
    shadow = getenv("SB_POWERCUT_SHADOW");
    if (!root || !shadow || root[0] != '/') root = shadow = NULL;
    if (root) root_length = strlen(root);
}

static int under_root(const char *path) {
    return root && strncmp(path, root, root_length) == 0 && (path[root_length] == '\0' || path[root_length] == '/');
}

/* Writes `length` bytes to shadow/<name><suffix>. */
static void write_record(const char *name, const char *suffix, const char *bytes, size_t length) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s%s", shadow, name, suffix);
    int fd = real_open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) abort(); /* a record that cannot be kept would make the check pass wrongly */
    size_t done = 0;
    while (done < length) {
        ssize_t n = write(fd, bytes + done, length - done);
        if (n <= 0) abort();
        done += (size_t)n;
    }
    close(fd);
}

/* Writes `length` bytes to shadow/<name> through a temporary name. */
static void put_record(const char *name, const char *bytes, size_t length) {
    char final[PATH_MAX], temporary[PATH_MAX];
    snprintf(final, sizeof final, "%s/%s", shadow, name);
    snprintf(temporary, sizeof temporary, "%s/%s.tmp", shadow, name);
    write_record(name, ".tmp", bytes, length);
    if (rename(temporary, final) != 0) abort();
}

/* Records are staged (written under a temporary name) before the real sync, from what the file or directory
 * holds then, and renamed into place only when the sync succeeded: what a process writes while its sync runs
 * is not recorded as durable. One sync is recorded at a time (under `recording`), so syncs in the process are
 * serialized while the library is loaded. */
static char **staged;
static size_t staged_count, staged_capacity;

static void stage_record(const char *name, const char *bytes, size_t length) {
    write_record(name, ".staged", bytes, length);
    if (staged_count == staged_capacity) {
        staged_capacity = staged_capacity ? staged_capacity * 2 : 64;
        staged = realloc(staged, staged_capacity * sizeof *staged);
        if (!staged) abort();
    }
    staged[staged_count++] = strdup(name);
}

/* After the sync: the staged records become the records (`keep`), or go. */
static void finish_staged(int keep) {
    for (size_t i = 0; i < staged_count; i++) {
        char temporary[PATH_MAX], final[PATH_MAX];
        snprintf(temporary, sizeof temporary, "%s/%s.staged", shadow, staged[i]);
        snprintf(final, sizeof final, "%s/%s", shadow, staged[i]);
        if (keep) {
            if (rename(temporary, final) != 0) abort();
        } else {
            unlink(temporary);
        }
        free(staged[i]);
    }
    staged_count = 0;
}

/* The id of the file or directory with this inode, into `id` (64 bytes). */
static void id_of(ino_t inode, char *id) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/id-%llu", shadow, (unsigned long long)inode);
    int fd = real_open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, id, 63) : -1;
    if (fd >= 0) close(fd);
    if (n > 0) id[n] = '\0';
    else snprintf(id, 64, "i%llu", (unsigned long long)inode);
}

/* `path` (under the root) was just created: it gets a new id. Called under `recording`, held from before the
 * creation, so that no sync records the new name with the id of a file that had its inode before. */
static void created_now(const char *path) {
    struct stat info;
    if (stat(path, &info) != 0) return;
    char name[64], id[64];
    snprintf(id, sizeof id, "n%d-%lu", (int)getpid(), ++created);
    snprintf(name, sizeof name, "id-%llu", (unsigned long long)info.st_ino);
    put_record(name, id, strlen(id));
}

/* The absolute form of `path` opened relative to `directory_fd` (AT_FDCWD: the working directory). */
static int absolute(int directory_fd, const char *path, char *out) {
    if (path[0] == '/') return snprintf(out, PATH_MAX, "%s", path) < PATH_MAX;
    char base[PATH_MAX];
    if (directory_fd == AT_FDCWD) {
        if (!getcwd(base, sizeof base)) return 0;
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", directory_fd);
        ssize_t n = readlink(link, base, sizeof base - 1);
        if (n <= 0) return 0;
        base[n] = '\0';
    }
    return snprintf(out, PATH_MAX, "%s/%s", base, path) < PATH_MAX;
}

static int opened(int directory_fd, const char *path, int flags, mode_t mode) {
    char full[PATH_MAX];
    int watched = root && (flags & O_CREAT) && absolute(directory_fd, path, full) && under_root(full);
    if (!watched) return real_openat(directory_fd, path, flags, mode);
    pthread_mutex_lock(&recording);
    struct stat before;
    int existed = stat(full, &before) == 0;
    int fd = real_openat(directory_fd, path, flags, mode);
    if (fd >= 0 && !existed) created_now(full);
    pthread_mutex_unlock(&recording);
    return fd;
}

/* The mode argument of an open that creates: read in the variadic function itself, where va_start must be. */
#define MODE_OF(flags)                                          \
    mode_t mode = 0;                                            \
    if ((flags) & (O_CREAT | O_TMPFILE)) {                      \
        va_list arguments;                                      \
        va_start(arguments, flags);                             \
        mode = va_arg(arguments, mode_t);                       \
        va_end(arguments);                                      \
    }

int open(const char *path, int flags, ...) {
    pthread_once(&once, setup);
    MODE_OF(flags)
    return opened(AT_FDCWD, path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    pthread_once(&once, setup);
    MODE_OF(flags)
    return opened(AT_FDCWD, path, flags, mode);
}

int openat(int directory_fd, const char *path, int flags, ...) {
    pthread_once(&once, setup);
    MODE_OF(flags)
    return opened(directory_fd, path, flags, mode);
}

int mkdir(const char *path, mode_t mode) {
    pthread_once(&once, setup);
    char full[PATH_MAX];
    if (!root || !absolute(AT_FDCWD, path, full) || !under_root(full)) return real_mkdir(path, mode);
    pthread_mutex_lock(&recording);
    int status = real_mkdir(path, mode);
    if (status == 0) created_now(full);
    pthread_mutex_unlock(&recording);
    return status;
}

/* Records the bytes of the regular file open as `fd`. */
static void record_file(int fd, ino_t inode) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int readable = open(path, O_RDONLY | O_CLOEXEC); /* `fd` may be open for writing only */
    if (readable < 0) abort();
    struct stat info;
    if (fstat(readable, &info) != 0) abort();
    size_t size = (size_t)info.st_size, done = 0;
    char *bytes = malloc(size ? size : 1);
    if (!bytes) abort();
    while (done < size) {
        ssize_t n = pread(readable, bytes + done, size - done, (off_t)done);
        if (n < 0) abort();
        if (n == 0) break; /* cut meanwhile */
        done += (size_t)n;
    }
    close(readable);
    char name[96], id[64];
    id_of(inode, id);
    snprintf(name, sizeof name, "content-%s", id);
    stage_record(name, bytes, done);
    free(bytes);
}

/* Records the entries of the directory at `path`. */
static void record_directory(const char *path, ino_t inode) {
    DIR *directory = opendir(path);
    if (!directory) abort();
    size_t capacity = 4096, length = 0;
    char *lines = malloc(capacity);
    if (!lines) abort();
    struct dirent *entry;
    while ((entry = readdir(directory))) {
        if (!strcmp(entry->d_name, ".") || !strcmp(entry->d_name, "..")) continue;
        unsigned char kind = entry->d_type;
        if (kind == DT_UNKNOWN) { /* a file system that does not say: ask */
            struct stat info;
            if (fstatat(dirfd(directory), entry->d_name, &info, AT_SYMLINK_NOFOLLOW) != 0) continue;
            kind = S_ISDIR(info.st_mode) ? DT_DIR : S_ISREG(info.st_mode) ? DT_REG : DT_UNKNOWN;
        }
        char type;
        if (kind == DT_DIR) type = 'd';
        else if (kind == DT_REG) type = 'f';
        else continue;
        char id[64];
        id_of(entry->d_ino, id);
        size_t needed = strlen(entry->d_name) + strlen(id) + 8;
        if (length + needed > capacity) {
            capacity = (length + needed) * 2;
            lines = realloc(lines, capacity);
            if (!lines) abort();
        }
        length += (size_t)sprintf(lines + length, "%c %s %s\n", type, id, entry->d_name);
    }
    closedir(directory);
    char name[96], id[64];
    id_of(inode, id);
    snprintf(name, sizeof name, "names-%s", id);
    stage_record(name, lines, length);
    free(lines);
}

/* Records what a successful sync of `fd` made durable, if it is under the root. */
static void record(int fd) {
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = '\0';
    if (!under_root(path)) return;
    struct stat info;
    if (fstat(fd, &info) != 0) return;
    if (S_ISDIR(info.st_mode)) record_directory(path, info.st_ino);
    else if (S_ISREG(info.st_mode)) record_file(fd, info.st_ino);
}

/* Records every file and directory under `path` (syncfs, sync). */
static void record_tree(const char *path) {
    struct stat info;
    if (stat(path, &info) != 0) return;
    if (S_ISREG(info.st_mode)) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            record_file(fd, info.st_ino);
            close(fd);
        }
        return;
    }
    if (!S_ISDIR(info.st_mode)) return;
    record_directory(path, info.st_ino);
    DIR *directory = opendir(path);
    if (!directory) return;
    struct dirent *entry;
    while ((entry = readdir(directory))) {
        if (!strcmp(entry->d_name, ".") || !strcmp(entry->d_name, "..")) continue;
        char child[PATH_MAX];
        snprintf(child, sizeof child, "%s/%s", path, entry->d_name);
        record_tree(child);
    }
    closedir(directory);
}

/* A sync of `fd` (or, with `everything`, of the whole tree), recorded as described above. */
static int recorded_sync(int fd, int everything, int (*real)(int)) {
    if (!root) return real(fd);
    pthread_mutex_lock(&recording);
    if (everything) record_tree(root);
    else record(fd);
    int status = real(fd);
    finish_staged(status == 0);
    pthread_mutex_unlock(&recording);
    return status;
}

int fsync(int fd) {
    pthread_once(&once, setup);
    return recorded_sync(fd, 0, real_fsync);
}

int fdatasync(int fd) {
    pthread_once(&once, setup);
    return recorded_sync(fd, 0, real_fdatasync);
}

int syncfs(int fd) {
    pthread_once(&once, setup);
    return recorded_sync(fd, 1, real_syncfs);
}

static int sync_all(int fd) {
    (void)fd;
    real_sync();
    return 0;
}

void sync(void) {
    pthread_once(&once, setup);
    recorded_sync(-1, 1, sync_all);
}
