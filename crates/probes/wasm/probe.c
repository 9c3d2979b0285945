/*
 * cordon's probe module for `runtime: wasm` tools (docs/wasm.md).
 *
 * `cordon probe` runs it in place of a wasm tool's module, with that tool's
 * preopens, environment and limits, through the same runtime, and judges
 * what it reports. It tries what a taken-over module would:
 *
 *   cordon-probe PROBE[=ARG]...
 *
 *   control       it runs: prints, lists its preopens
 *   host_fs       read the host's files outside its preopens, out of them by
 *                 `..`, or through them (a preopen of the host's /etc or /)
 *   write         create, append to, remove files in its (read-only) preopens
 *   env           list its environment (cordon compares it with the manifest's)
 *   network       sock_accept on every descriptor (WASI preview 1 cannot
 *                 create a socket), sock_send on stdio
 *   fds           descriptors beyond stdio and the preopens
 *   tty           a terminal on descriptors 0-2
 *   memory=BYTES  grow linear memory past BYTES, touching every page
 *   time=MS       busy loop for MS milliseconds
 *   output=BYTES  write BYTES to stdout (the result line goes to stderr)
 *
 * Each probe prints one line, `cordon-probe: NAME OUTCOME DETAIL`, with
 * OUTCOME `refused` (every attempt failed), `allowed` (one got through),
 * `list` (facts for cordon to judge) or `error`. A probe the runtime stops
 * (a memory or time trap, the output cap) prints no outcome: the runtime's
 * own outcome says what stopped it.
 *
 * Built for wasm32-wasi with clang-14 and Debian's wasi-libc
 * (scripts/build-wasm-example.sh, into target/wasm/cordon-probe.wasm).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <wasi/api.h>

extern char **environ;

#define MAX_FD 64
#define PAGE 65536u

/* What one probe saw, as one line. */
static char detail[8192];
static size_t detail_len;

static void note(const char *fmt, ...) {
    if (detail_len >= sizeof detail - 1)
        return;
    if (detail_len > 0 && detail_len < sizeof detail - 2) {
        detail[detail_len++] = ';';
        detail[detail_len++] = ' ';
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(detail + detail_len, sizeof detail - detail_len, fmt, ap);
    va_end(ap);
    if (n > 0)
        detail_len += (size_t)n < sizeof detail - detail_len ? (size_t)n : sizeof detail - detail_len - 1;
}

static void report(FILE *to, const char *name, const char *outcome) {
    /* One line: no newline inside the detail. */
    for (size_t i = 0; i < detail_len; i++)
        if (detail[i] == '\n' || detail[i] == '\r')
            detail[i] = ' ';
    fprintf(to, "cordon-probe: %s %s %.*s\n", name, outcome, (int)detail_len, detail);
    fflush(to);
    detail_len = 0;
    detail[0] = 0;
}

/* The preopened directories: descriptor and name. */
static int preopen_fd[MAX_FD];
static char preopen_name[MAX_FD][256];
static int preopens;

static void find_preopens(void) {
    preopens = 0;
    for (int fd = 3; fd < MAX_FD; fd++) {
        __wasi_prestat_t ps;
        if (__wasi_fd_prestat_get((__wasi_fd_t)fd, &ps) != 0)
            continue;
        if (ps.tag != __WASI_PREOPENTYPE_DIR)
            continue;
        size_t len = ps.u.dir.pr_name_len;
        if (len >= sizeof preopen_name[0])
            len = sizeof preopen_name[0] - 1;
        if (__wasi_fd_prestat_dir_name((__wasi_fd_t)fd, (uint8_t *)preopen_name[preopens], len) != 0)
            continue;
        preopen_name[preopens][len] = 0;
        preopen_fd[preopens] = fd;
        preopens++;
    }
}

static int is_preopen(int fd) {
    for (int i = 0; i < preopens; i++)
        if (preopen_fd[i] == fd)
            return 1;
    return 0;
}

/* The preopen a path is under, if any (for the evidence). */
static const char *preopen_of(const char *path) {
    const char *best = NULL;
    size_t best_len = 0;
    for (int i = 0; i < preopens; i++) {
        size_t n = strlen(preopen_name[i]);
        if (strncmp(path, preopen_name[i], n) == 0 && (path[n] == '/' || path[n] == 0 || n == 1) && n >= best_len) {
            best = preopen_name[i];
            best_len = n;
        }
    }
    return best;
}

static int control(void) {
    note("the module runs");
    if (preopens == 0)
        note("no preopened directory");
    for (int i = 0; i < preopens; i++)
        note("preopen fd %d %s", preopen_fd[i], preopen_name[i]);
    report(stdout, "control", "ran");
    return 0;
}

/* What a run leaves in its instance: a global and a mark in linear
 * memory. A later run that sees either ran in an instance an earlier call
 * used (a worker that kept it): allowed. */
static int fresh_task_runs;
static char fresh_task_mark[32];

static int fresh_task(void) {
    if (fresh_task_runs || fresh_task_mark[0]) {
        note("FOUND the state of an earlier call: a global at %d, memory holding \"%s\"",
             fresh_task_runs, fresh_task_mark);
        report(stdout, "fresh_task", "allowed");
    } else {
        note("no global or memory of an earlier call: a fresh instance");
        report(stdout, "fresh_task", "refused");
    }
    fresh_task_runs++;
    strcpy(fresh_task_mark, "cordon-probe was here");
    return 0;
}

/* Try to open each path for reading: allowed if one opens. */
static int host_fs(void) {
    static const char *targets[] = {
        "/etc/passwd", "/etc/shadow", "/etc/hostname", "/root", "/home", "/proc/self/status",
        "/proc/1/root", "/sys/kernel", "/", ".", "..", "/tmp",
    };
    int opened = 0;
    char path[600];
    /* Through each preopen: out of it by `..`, and the host's files in
     * it, should it be (or hold) the host's /etc or root. */
    static const char *via[] = {"%s/..", "%s/../etc/passwd", "%s/passwd", "%s/etc/passwd"};
    const size_t nt = sizeof targets / sizeof targets[0], nv = sizeof via / sizeof via[0];
    for (size_t i = 0; i < nt + (size_t)preopens * nv; i++) {
        if (i < nt) {
            snprintf(path, sizeof path, "%s", targets[i]);
        } else {
            size_t k = i - nt;
            const char *p = preopen_name[k / nv];
            snprintf(path, sizeof path, via[k % nv], strcmp(p, "/") ? p : "");
        }
        int fd = open(path, O_RDONLY);
        if (fd < 0) {
            note("%s: %s", path, strerror(errno));
            continue;
        }
        char buf[64];
        ssize_t n = read(fd, buf, sizeof buf);
        const char *via = preopen_of(path);
        if (n >= 0)
            note("OPENED %s and read %zd bytes%s%s", path, n, via ? " through the preopen " : "", via ? via : "");
        else
            note("OPENED %s (a directory or unreadable: %s)%s%s", path, strerror(errno), via ? " through the preopen " : "",
                 via ? via : "");
        close(fd);
        opened++;
    }
    report(stdout, "host_fs", opened ? "allowed" : "refused");
    return 0;
}

/* Create, append, remove, rename in each preopen, and outside them. */
static int write_probe(void) {
    int done = 0;
    char path[600], other[600];
    static const char *outside[] = {"/tmp/cordon-probe-write", "/cordon-probe-write", "cordon-probe-write"};
    for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
        int fd = open(outside[i], O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd >= 0) {
            note("CREATED %s", outside[i]);
            close(fd);
            unlink(outside[i]);
            done++;
        } else {
            note("create %s: %s", outside[i], strerror(errno));
        }
    }
    for (int i = 0; i < preopens; i++) {
        const char *p = strcmp(preopen_name[i], "/") ? preopen_name[i] : "";
        snprintf(path, sizeof path, "%s/.cordon-probe-write", p);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd >= 0) {
            note("CREATED %s", path);
            close(fd);
            unlink(path);
            done++;
        } else {
            note("create %s: %s", path, strerror(errno));
        }
        snprintf(path, sizeof path, "%s/.cordon-probe-dir", p);
        if (mkdir(path, 0755) == 0) {
            note("MADE directory %s", path);
            rmdir(path);
            done++;
        } else {
            note("mkdir %s: %s", path, strerror(errno));
        }
        /* An existing file: append to it, rename it, remove it. */
        DIR *d = opendir(preopen_name[i]);
        struct dirent *e = NULL;
        while (d && (e = readdir(d)) != NULL) {
            snprintf(path, sizeof path, "%s/%s", p, e->d_name);
            struct stat st;
            if (e->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode))
                break;
        }
        if (e == NULL) {
            note("%s: no file in it to alter", preopen_name[i]);
        } else {
            fd = open(path, O_WRONLY | O_APPEND);
            if (fd >= 0) {
                ssize_t n = write(fd, "", 0);
                note("OPENED %s for appending (a write of 0 bytes: %zd)", path, n);
                close(fd);
                done++;
            } else {
                note("append %s: %s", path, strerror(errno));
            }
            snprintf(other, sizeof other, "%s.cordon-probe", path);
            if (rename(path, other) == 0) {
                note("RENAMED %s", path);
                rename(other, path);
                done++;
            } else {
                note("rename %s: %s", path, strerror(errno));
            }
            if (unlink(path) == 0) {
                note("REMOVED %s", path);
                done++;
            } else {
                note("unlink %s: %s", path, strerror(errno));
            }
        }
        if (d)
            closedir(d);
    }
    if (preopens == 0)
        note("no preopened directory to write into");
    report(stdout, "write", done ? "allowed" : "refused");
    return 0;
}

static int env(void) {
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
        note("%.*s", (int)n, *e);
    }
    report(stdout, "env", "list");
    return 0;
}

static const char *wasi_err(__wasi_errno_t e) {
    return strerror((int)e);
}

static int network(void) {
    int got = 0;
    int refused = 0;
    __wasi_errno_t last = 0;
    for (int fd = 0; fd < MAX_FD; fd++) {
        __wasi_fd_t conn;
        __wasi_errno_t r = __wasi_sock_accept((__wasi_fd_t)fd, 0, &conn);
        if (r == 0) {
            note("ACCEPTED a connection on fd %d (new fd %u)", fd, (unsigned)conn);
            close((int)conn);
            got++;
        } else {
            if (fd < 3 || is_preopen(fd) || r != last)
                note("sock_accept(%d): %s", fd, wasi_err(r));
            last = r;
            refused++;
        }
    }
    for (int fd = 0; fd < 3; fd++) {
        __wasi_ciovec_t iov = {(const uint8_t *)"", 0};
        __wasi_size_t sent;
        __wasi_errno_t r = __wasi_sock_send((__wasi_fd_t)fd, &iov, 1, 0, &sent);
        if (r == 0) {
            note("SENT on fd %d as a socket", fd);
            got++;
        } else {
            note("sock_send(%d): %s", fd, wasi_err(r));
        }
    }
    note("WASI preview 1 has no call that creates, binds or connects a socket, nor resolves a name: only "
         "sock_accept, sock_recv, sock_send and sock_shutdown on a socket the host preopened (tried on fds 0-%d)",
         MAX_FD - 1);
    report(stdout, "network", got ? "allowed" : "refused");
    return 0;
}

static int fds(void) {
    int extra = 0;
    for (int fd = 3; fd < MAX_FD; fd++) {
        __wasi_fdstat_t st;
        if (__wasi_fd_fdstat_get((__wasi_fd_t)fd, &st) != 0)
            continue;
        if (is_preopen(fd))
            continue;
        note("OPEN fd %d (file type %u)", fd, (unsigned)st.fs_filetype);
        extra++;
    }
    if (!extra)
        note("nothing open beyond fds 0-2 and %d preopen(s)", preopens);
    report(stdout, "fds", extra ? "allowed" : "refused");
    return 0;
}

static int tty(void) {
    int ttys = 0;
    for (int fd = 0; fd < 3; fd++) {
        __wasi_fdstat_t st;
        __wasi_errno_t r = __wasi_fd_fdstat_get((__wasi_fd_t)fd, &st);
        if (r != 0) {
            note("fd %d: %s", fd, wasi_err(r));
        } else if (st.fs_filetype == __WASI_FILETYPE_CHARACTER_DEVICE && isatty(fd)) {
            note("fd %d IS a terminal", fd);
            ttys++;
        } else {
            note("fd %d: file type %u, not a terminal", fd, (unsigned)st.fs_filetype);
        }
    }
    report(stdout, "tty", ttys ? "allowed" : "refused");
    return 0;
}

static int memory(const char *arg) {
    unsigned long long bytes = arg ? strtoull(arg, NULL, 10) : 0;
    if (bytes == 0) {
        note("memory=BYTES needs the limit");
        report(stdout, "memory", "error");
        return 2;
    }
    unsigned long long target_pages = bytes / PAGE + 1;
    if (target_pages > 65536ull) {
        note("the limit of %llu bytes is at or past wasm32's 4 GiB address space: linear memory cannot grow past it",
             bytes);
        report(stdout, "memory", "refused");
        return 0;
    }
    /* Said before growing: a trap ends the module without another line. */
    fprintf(stdout, "cordon-probe: memory growing linear memory from %zu to %llu bytes\n",
            __builtin_wasm_memory_size(0) * (size_t)PAGE, target_pages * PAGE);
    fflush(stdout);
    while (__builtin_wasm_memory_size(0) < target_pages) {
        size_t have = __builtin_wasm_memory_size(0);
        size_t step = target_pages - have < 256 ? target_pages - have : 256;
        if (__builtin_wasm_memory_grow(0, step) == (size_t)-1) {
            note("memory.grow refused at %zu bytes (wanted %llu)", have * (size_t)PAGE, target_pages * PAGE);
            report(stdout, "memory", "refused");
            return 0;
        }
        /* Touch every new page: it is real memory. */
        for (size_t pg = have; pg < have + step; pg++)
            ((volatile uint8_t *)(uintptr_t)(pg * PAGE))[0] = 1;
    }
    note("linear memory GREW to %zu bytes, past %llu, every page touched", __builtin_wasm_memory_size(0) * (size_t)PAGE,
         bytes);
    report(stdout, "memory", "allowed");
    return 0;
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int time_probe(const char *arg) {
    long long ms = arg ? atoll(arg) : 0;
    if (ms <= 0) {
        note("time=MS needs the duration");
        report(stdout, "time", "error");
        return 2;
    }
    fprintf(stdout, "cordon-probe: time looping for %lld ms\n", ms);
    fflush(stdout);
    long long start = now_ms();
    volatile unsigned long spins = 0;
    while (now_ms() - start < ms)
        spins++;
    note("RAN %lld ms in a busy loop (%lu turns), to the end", now_ms() - start, (unsigned long)spins);
    report(stdout, "time", "allowed");
    return 0;
}

static int output(const char *arg) {
    unsigned long long bytes = arg ? strtoull(arg, NULL, 10) : 0;
    if (bytes == 0) {
        note("output=BYTES needs the amount");
        report(stderr, "output", "error");
        return 2;
    }
    static char chunk[65536];
    memset(chunk, 'x', sizeof chunk);
    unsigned long long written = 0;
    while (written < bytes) {
        size_t n = bytes - written < sizeof chunk ? (size_t)(bytes - written) : sizeof chunk;
        ssize_t w = write(1, chunk, n);
        if (w <= 0) {
            note("write failed after %llu bytes: %s", written, w < 0 ? strerror(errno) : "wrote nothing");
            report(stderr, "output", "refused");
            return 0;
        }
        written += (unsigned long long)w;
    }
    note("WROTE %llu bytes to stdout", written);
    report(stderr, "output", "allowed");
    return 0;
}

/* The canonical ABI's allocator, for the probe built as a component: with
 * it, wasmtime's preview 1 adapter takes the memory it keeps from malloc
 * instead of growing linear memory under malloc's feet (Debian's wasi-libc
 * does not export one). */
__attribute__((export_name("cabi_realloc")))
void *cabi_realloc(void *old, size_t old_size, size_t align, size_t new_size) {
    (void)old_size;
    (void)align;
    void *p = realloc(old, new_size ? new_size : 1);
    if (!p)
        abort();
    return p;
}

int main(int argc, char **argv) {
    find_preopens();
    int status = 0;
    for (int i = 1; i < argc; i++) {
        char name[64];
        const char *arg = strchr(argv[i], '=');
        size_t n = arg ? (size_t)(arg - argv[i]) : strlen(argv[i]);
        if (n >= sizeof name)
            n = sizeof name - 1;
        memcpy(name, argv[i], n);
        name[n] = 0;
        if (arg)
            arg++;
        int r;
        if (!strcmp(name, "control"))
            r = control();
        else if (!strcmp(name, "host_fs"))
            r = host_fs();
        else if (!strcmp(name, "write"))
            r = write_probe();
        else if (!strcmp(name, "env"))
            r = env();
        else if (!strcmp(name, "network"))
            r = network();
        else if (!strcmp(name, "fds"))
            r = fds();
        else if (!strcmp(name, "tty"))
            r = tty();
        else if (!strcmp(name, "fresh_task"))
            r = fresh_task();
        else if (!strcmp(name, "memory"))
            r = memory(arg);
        else if (!strcmp(name, "time"))
            r = time_probe(arg);
        else if (!strcmp(name, "output"))
            r = output(arg);
        else {
            note("unknown probe");
            report(stdout, name, "error");
            r = 2;
        }
        if (r > status)
            status = r;
    }
    return status;
}
