/*
 * slowfs: a read-only FUSE 3 passthrough filesystem with the metadata latency of a shared parallel
 * filesystem, for benchmarks of job start-up (`invoke benchmark --name startup`).
 *
 * What it stands for. On Lustre (and NFS) every lookup, getattr, open and readdir of a file a rank
 * has not yet cached is a round trip to the metadata server (MDS); file DATA then comes from the
 * object servers and stays in the client's page cache. Python start-up is dominated by those
 * metadata round trips: `import torch` touches thousands of files, every rank does it, and all ranks
 * of a job start at once, so the MDS, shared by the whole machine, is the bottleneck.
 * A single client thread gets about 2,000 stat operations per second from a Lustre MDT when it is
 * otherwise idle, i.e. ~0.5 ms an operation (Dell, "Dell Storage for HPC with Intel Enterprise
 * Edition for Lustre", mdtest figures); under a machine's load 1 ms or more is usual: one job's
 * Python start-up alone was measured at up to 30,000 metadata operations per second on a Lustre MDS
 * (https://github.com/symfluence-org/SYMFLUENCE/issues/21), and OLCF reports start-up of a conda
 * env dropping from 51 s to 2 s when staged to node-local NVMe
 * (https://docs.olcf.ornl.gov/software/python/sbcast_conda.html).
 *
 * The model: a metadata server with K slots (`slots`, default 1). Each metadata operation waits for
 * a free slot and holds it for `latency_us` microseconds, then is answered from the backing
 * directory. With K=1 and 1 ms the filesystem serves ~1000 metadata operations per second, shared
 * by every process that uses it, as one MDS's capacity is shared by a machine's job. Data reads
 * (read) add no latency. A process's second lookup of a path is answered from "its client's cache"
 * (see seen_before; option client_cache=0 charges every lookup).
 *
 * Mounted with entry, attribute and negative caching off (entry_timeout=0, attr_timeout=0,
 * negative_timeout=0) so every rank's lookups reach the "server", as they would from separate
 * client nodes; file data is kept in the page cache (kernel_cache) as a real client does.
 *
 * Counters: operations per kind and bytes read, written as JSON to the `stats=FILE` option's file
 * on SIGUSR1 and at unmount (atomically: FILE.tmp, then rename).
 *
 * Usage: slowfs BACKING MOUNTPOINT [-f] [-o latency_us=N,slots=K,client_cache=0|1,stats=/abs/file.json]
 * Build: cc -O2 -Wall -o slowfs slowfs.c $(pkg-config --cflags --libs fuse3)
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

enum kind { K_GETATTR, K_GETATTR_CACHED, K_OPEN, K_OPENDIR, K_READDIR, K_READLINK, K_ACCESS, K_STATFS, K_READ, K_COUNT };
static const char *kind_names[K_COUNT] = {"getattr", "getattr_cached", "open", "opendir", "readdir",
                                          "readlink", "access", "statfs", "read"};

static struct options {
    char *stats;
    int latency_us;
    int slots;
    int client_cache;
} opts;

#define OPTION(t, p) {t, offsetof(struct options, p), 1}
static const struct fuse_opt option_spec[] = {
    OPTION("stats=%s", stats), OPTION("latency_us=%d", latency_us), OPTION("slots=%d", slots),
    OPTION("client_cache=%d", client_cache), FUSE_OPT_END};

static char backing[PATH_MAX];
static unsigned long long counts[K_COUNT];
static unsigned long long bytes_read;
static sem_t server;  /* the metadata server's slots */

/* One metadata round trip: wait for a slot, hold it for the latency. */
static void metadata_op(enum kind k) {
    __atomic_fetch_add(&counts[k], 1, __ATOMIC_RELAXED);
    if (opts.latency_us <= 0)
        return;
    while (sem_wait(&server) != 0 && errno == EINTR)
        ;
    struct timespec ts = {opts.latency_us / 1000000, (long)(opts.latency_us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    sem_post(&server);
}

/*
 * Each process's own client cache. The kernel caches nothing (timeouts 0), so every lookup of every
 * process reaches this daemon; a lookup of a path the same process already looked up is answered
 * without the latency, as a client node answers it from its dentry and attribute cache (Lustre: under
 * the lock the MDS granted). So each process stands for a client node of its own: every rank looks up
 * every file it needs once from the server, and walking a path's parents again costs nothing.
 * Keys: hash(path) mixed with the caller's pid, in an open-addressing table emptied when 3/4 full.
 */
#define SEEN_SIZE (1u << 21)
static uint64_t *seen;
static unsigned seen_used;
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;

static int seen_before(const char *path) {
    uint64_t h = 1469598103934665603ull;  /* FNV-1a */
    for (const char *c = path; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h ^= (uint64_t)fuse_get_context()->pid * 0x9E3779B97F4A7C15ull;
    h |= 1;  /* 0 marks a free slot */
    pthread_mutex_lock(&seen_lock);
    if (seen_used > SEEN_SIZE / 4 * 3) {
        memset(seen, 0, SEEN_SIZE * sizeof *seen);
        seen_used = 0;
    }
    unsigned i = (unsigned)(h >> 11) & (SEEN_SIZE - 1);
    while (seen[i] && seen[i] != h)
        i = (i + 1) & (SEEN_SIZE - 1);
    int found = seen[i] == h;
    if (!found) {
        seen[i] = h;
        seen_used++;
    }
    pthread_mutex_unlock(&seen_lock);
    return found;
}

static int full(char *out, const char *path) {
    int n = snprintf(out, PATH_MAX, "%s%s", backing, path);
    return (n < 0 || n >= PATH_MAX) ? -ENAMETOOLONG : 0;
}

static void dump_stats(void) {
    if (!opts.stats)
        return;
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", opts.stats);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    unsigned long long total = 0;
    fprintf(f, "{\"latency_us\": %d, \"slots\": %d, \"ops\": {", opts.latency_us, opts.slots);
    for (int k = 0; k < K_COUNT; k++) {
        unsigned long long v = __atomic_load_n(&counts[k], __ATOMIC_RELAXED);
        if (k != K_READ && k != K_GETATTR_CACHED)
            total += v;
        fprintf(f, "%s\"%s\": %llu", k ? ", " : "", kind_names[k], v);
    }
    fprintf(f, "}, \"metadata_ops\": %llu, \"bytes_read\": %llu}\n", total,
            __atomic_load_n(&bytes_read, __ATOMIC_RELAXED));
    if (fclose(f) == 0)
        rename(tmp, opts.stats);
}

/* SIGUSR1 is blocked in every thread (set before fuse_main); this thread takes it synchronously. */
static void *stats_thread(void *arg) {
    sigset_t *set = arg;
    int sig;
    for (;;)
        if (sigwait(set, &sig) == 0 && sig == SIGUSR1)
            dump_stats();
    return NULL;
}

static sigset_t usr1;

static void *sf_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    /* A Lustre client holds a lock on what it cached and does not ask the server again on each read:
     * without this, attr_timeout=0 makes the kernel send a getattr before every read to check its cache. */
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
    cfg->entry_timeout = 0;
    cfg->attr_timeout = 0;
    cfg->negative_timeout = 0;
    cfg->kernel_cache = 1;  /* keep file data cached across opens, as a real client does */
    cfg->use_ino = 1;
    pthread_t t;
    /* started here, not in main: fuse_main daemonizes (forks) after parsing, and threads do not survive it */
    pthread_create(&t, NULL, stats_thread, &usr1);
    pthread_detach(t);
    return NULL;
}

static void sf_destroy(void *data) {
    (void)data;
    dump_stats();
}

static int sf_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    if (opts.client_cache && seen_before(path))
        __atomic_fetch_add(&counts[K_GETATTR_CACHED], 1, __ATOMIC_RELAXED);
    else
        metadata_op(K_GETATTR);
    if (fi)
        return fstat((int)fi->fh, st) == -1 ? -errno : 0;
    char p[PATH_MAX];
    int r = full(p, path);
    if (r)
        return r;
    return lstat(p, st) == -1 ? -errno : 0;
}

static int sf_access(const char *path, int mask) {
    metadata_op(K_ACCESS);
    char p[PATH_MAX];
    int r = full(p, path);
    if (r)
        return r;
    return access(p, mask) == -1 ? -errno : 0;
}

static int sf_readlink(const char *path, char *buf, size_t size) {
    metadata_op(K_READLINK);
    char p[PATH_MAX];
    int r = full(p, path);
    if (r)
        return r;
    ssize_t n = readlink(p, buf, size - 1);
    if (n == -1)
        return -errno;
    buf[n] = '\0';
    return 0;
}

static int sf_opendir(const char *path, struct fuse_file_info *fi) {
    metadata_op(K_OPENDIR);
    char p[PATH_MAX];
    int r = full(p, path);
    if (r)
        return r;
    DIR *d = opendir(p);
    if (!d)
        return -errno;
    fi->fh = (uint64_t)(uintptr_t)d;
    return 0;
}

static int sf_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off, struct fuse_file_info *fi,
                      enum fuse_readdir_flags flags) {
    (void)path; (void)off; (void)flags;
    metadata_op(K_READDIR);
    DIR *d = (DIR *)(uintptr_t)fi->fh;
    rewinddir(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        struct stat st = {.st_ino = e->d_ino, .st_mode = (mode_t)(DTTOIF(e->d_type))};
        if (filler(buf, e->d_name, &st, 0, 0))
            break;
    }
    return 0;
}

static int sf_releasedir(const char *path, struct fuse_file_info *fi) {
    (void)path;
    closedir((DIR *)(uintptr_t)fi->fh);
    return 0;
}

static int sf_open(const char *path, struct fuse_file_info *fi) {
    metadata_op(K_OPEN);
    if ((fi->flags & O_ACCMODE) != O_RDONLY)
        return -EROFS;
    char p[PATH_MAX];
    int r = full(p, path);
    if (r)
        return r;
    int fd = open(p, fi->flags);
    if (fd == -1)
        return -errno;
    fi->fh = (uint64_t)fd;
    fi->keep_cache = 1;
    return 0;
}

static int sf_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)path;
    __atomic_fetch_add(&counts[K_READ], 1, __ATOMIC_RELAXED);
    ssize_t n = pread((int)fi->fh, buf, size, off);
    if (n == -1)
        return -errno;
    __atomic_fetch_add(&bytes_read, (unsigned long long)n, __ATOMIC_RELAXED);
    return (int)n;
}

static int sf_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close((int)fi->fh);
    return 0;
}

static int sf_statfs(const char *path, struct statvfs *st) {
    metadata_op(K_STATFS);
    char p[PATH_MAX];
    int r = full(p, path);
    if (r)
        return r;
    return statvfs(p, st) == -1 ? -errno : 0;
}

static const struct fuse_operations ops = {
    .init = sf_init, .destroy = sf_destroy, .getattr = sf_getattr, .access = sf_access,
    .readlink = sf_readlink, .opendir = sf_opendir, .readdir = sf_readdir, .releasedir = sf_releasedir,
    .open = sf_open, .read = sf_read, .release = sf_release, .statfs = sf_statfs,
};

int main(int argc, char *argv[]) {
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    opts.slots = 1;
    opts.client_cache = 1;
    if (fuse_opt_parse(&args, &opts, option_spec, NULL) == -1)
        return 1;
    /* the first non-option argument is the backing directory; fuse_main gets the rest */
    int at = -1;
    for (int i = 1; i < args.argc; i++)
        if (args.argv[i][0] != '-' && (i == 1 || strcmp(args.argv[i - 1], "-o") != 0)) {
            at = i;
            break;
        }
    if (at < 0 || !realpath(args.argv[at], backing)) {
        fprintf(stderr, "slowfs: usage: slowfs BACKING MOUNTPOINT [-o latency_us=N,slots=K,stats=FILE]\n");
        return 1;
    }
    if (opts.latency_us < 0 || opts.latency_us > 10000000 || opts.slots < 1 || opts.slots > 1024) {
        fprintf(stderr, "slowfs: latency_us must be 0..10000000 and slots 1..1024\n");
        return 1;
    }
    if (opts.stats && opts.stats[0] != '/') {
        fprintf(stderr, "slowfs: stats=%s: give an absolute path (the daemon runs from /)\n", opts.stats);
        return 1;
    }
    for (int i = at; i < args.argc - 1; i++)
        args.argv[i] = args.argv[i + 1];
    args.argc--;
    seen = calloc(SEEN_SIZE, sizeof *seen);
    if (!seen) {
        fprintf(stderr, "slowfs: out of memory\n");
        return 1;
    }
    sem_init(&server, 0, (unsigned)opts.slots);
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, NULL);
    return fuse_main(args.argc, args.argv, &ops, NULL);
}
