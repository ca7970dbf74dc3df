/* cli/jit.c: generated C -> shared object -> dlopen, with a disk cache. */
#define _GNU_SOURCE
#include "jit.h"
#include "../runtime/progress.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *jit_cc(void) {
  const char *cc = getenv("DUET_CC");
  return cc && *cc ? cc : "cc";
}

/* The watchdog between duet and the compiler (see jit_run): the compiler's
 * process group, and the signal that ends the watch.  Each watchdog is a
 * forked child with its own copy. */
static volatile sig_atomic_t watch_pgid, watch_sig;

static void watch_stop(int sig) {
  watch_sig = sig;
  if (watch_pgid > 0) kill(-(pid_t)watch_pgid, SIGKILL);
}

/* write(2) of a string (after fork, where stdio is not safe). */
static void put_fd(int fd, const char *s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w <= 0 && errno != EINTR) return;
    if (w > 0) s += w, n -= (size_t)w;
  }
}

/* In the forked watchdog: runs argv in a new process group and waits for
 * it; when duet dies (PR_SET_PDEATHSIG), or SIGINT, SIGTERM or SIGHUP reach
 * the watchdog, the whole group (the compiler driver and its cc1, as, ld)
 * is killed.  Ends as the compiler ended (its exit status, or its signal).
 * Only async-signal-safe calls: duet may have threads. */
static void watchdog(char *const argv[], pid_t parent) {
  static const int sigs[] = {SIGUSR1, SIGINT, SIGTERM, SIGHUP};
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = watch_stop; /* no SA_RESTART: waitpid returns EINTR */
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
    if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN && sigs[i] != SIGUSR1) continue; /* nohup */
    sigaction(sigs[i], &sa, NULL);
  }
  if (prctl(PR_SET_PDEATHSIG, SIGUSR1) || getppid() != parent) watch_sig = SIGUSR1; /* duet is gone already */
  pid_t cc = fork();
  if (cc == 0) {
    setpgid(0, 0);
    execvp(argv[0], argv); /* handled signals are reset to default by exec */
    put_fd(2, "cannot run ");
    put_fd(2, argv[0]);
    put_fd(2, ": ");
    put_fd(2, strerror(errno));
    put_fd(2, "\n");
    _exit(127);
  }
  if (cc < 0) {
    put_fd(2, "cannot fork the compiler\n");
    _exit(127);
  }
  setpgid(cc, cc); /* also here: the group exists before the kill below */
  watch_pgid = cc;
  if (watch_sig) kill(-cc, SIGKILL);
  int st = 0;
  while (waitpid(cc, &st, 0) < 0)
    if (errno != EINTR) _exit(127);
  watch_pgid = 0; /* reaped: its number may be reused */
  int sig = watch_sig ? watch_sig : WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  if (sig) {
    signal(sig, SIG_DFL);
    raise(sig);
    _exit(128 + sig);
  }
  _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 127);
}

int jit_run(char *const argv[], char *log, size_t loglen) { return jit_run_shown(argv, log, loglen, NULL); }

int jit_run_shown(char *const argv[], char *log, size_t loglen, const char *what) {
  int pfd[2];
  if (pipe(pfd)) return -1;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(pfd[0]);
    close(pfd[1]);
    return -1;
  }
  if (pid == 0) {
    dup2(pfd[1], 1);
    dup2(pfd[1], 2);
    close(pfd[0]);
    close(pfd[1]);
    watchdog(argv, parent);
  }
  close(pfd[1]);
  size_t n = 0;
  char tmp[4096];
  ssize_t got;
  DuetProgress pg;
  duet_progress_start(&pg, stdout, !what, 0, 0);
  for (;;) {
    if (what) { /* wake up to show that the compiler is still at work */
      struct pollfd pf = {.fd = pfd[0], .events = POLLIN};
      int r = poll(&pf, 1, 100);
      if (r < 0 && errno != EINTR) break;
      duet_progress_alive(&pg, what);
      if (r <= 0) continue;
    }
    if ((got = read(pfd[0], tmp, sizeof tmp)) == 0) break;
    if (got < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (ssize_t i = 0; i < got && n + 1 < loglen; i++) log[n++] = tmp[i];
  }
  duet_progress_clear(&pg);
  if (loglen) log[n] = 0;
  close(pfd[0]);
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int jit_self_dir(char *out, size_t n) {
  ssize_t k = readlink("/proc/self/exe", out, n - 1);
  if (k <= 0) return -1;
  out[k] = 0;
  char *slash = strrchr(out, '/');
  if (!slash) return -1;
  *slash = 0;
  return 0;
}

/* The first line `CC --version` prints, or -1 with the compiler's exit
 * status and what it printed (or why it did not run) in `why`. */
static int compiler_version(char *out, size_t n, char *why, size_t whylen) {
  char *argv[] = {(char *)jit_cc(), "--version", NULL};
  char log[1024];
  int st = jit_run(argv, log, sizeof log);
  if (st != 0) {
    char *e = log + strlen(log);
    while (e > log && (e[-1] == '\n' || e[-1] == ' ')) *--e = 0;
    snprintf(why, whylen, "exit status %d%s%.300s", st, *log ? ": " : "", log);
    return -1;
  }
  char *nl = strchr(log, '\n');
  if (nl) *nl = 0;
  size_t len = strlen(log);
  if (len >= n) len = n - 1;
  memcpy(out, log, len);
  out[len] = 0;
  return 0;
}


/* dlopens the file open as fd (its bytes, already checked: `bytes`, len)
 * and takes its kernel table; `name` for messages.  Through
 * /proc/self/fd/N, so the file loaded is the file checked even if its path
 * changes meanwhile; without /proc, through a copy of the checked bytes in
 * a private temporary directory.  0, or -1 with a message in err. */
static int open_module(int fd, const void *bytes, size_t len, const char *name, JitModule *m, char *err,
                       size_t errlen) {
  char path[1200], tmpdir[1024] = "";
  m->fd = -1;
  if (!access("/proc/self/fd", X_OK)) {
    /* the loader takes a name it has loaded before for that module: this
     * descriptor stays open with the module (jit_unload closes it), so no
     * other module loads under the same name meanwhile */
    if ((m->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0) {
      snprintf(err, errlen, "cannot load compiled kernels %s: %s", name, strerror(errno));
      return -1;
    }
    snprintf(path, sizeof path, "/proc/self/fd/%d", m->fd);
  } else {
    char e2[600];
    if (duet_private_tmpdir(tmpdir, sizeof tmpdir, "duet-load", e2, sizeof e2)) {
      snprintf(err, errlen, "cannot load compiled kernels %s: no /proc/self/fd and %s", name, e2);
      return -1;
    }
    snprintf(path, sizeof path, "%s/kernels.so", tmpdir);
    if (duet_write_file_sync(path, bytes, len)) {
      snprintf(err, errlen, "cannot load compiled kernels %s: writing %s: %s", name, path, strerror(errno));
      unlink(path);
      rmdir(tmpdir);
      return -1;
    }
  }
  m->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (tmpdir[0]) { /* a loaded module stays mapped after its file is removed */
    unlink(path);
    rmdir(tmpdir);
  }
  if (!m->handle) {
    snprintf(err, errlen, "cannot load compiled kernels %s: %s", name, dlerror());
    if (m->fd >= 0) close(m->fd);
    m->fd = -1;
    return -1;
  }
  const int *count = dlsym(m->handle, "duet_kernel_count");
  const DuetKernelFn *table = dlsym(m->handle, "duet_kernel_table");
  if (!count || !table) {
    snprintf(err, errlen, "compiled kernels %s lack duet_kernel_table", name);
    jit_unload(m);
    return -1;
  }
  const int *n_fns = dlsym(m->handle, "duet_function_count");
  m->n = *count;
  m->n_functions = n_fns ? *n_fns : *count;
  m->fns = table;
  return 0;
}

/* The CPU model and feature flags, part of the cache key (kernels are
 * compiled with -march=native). */
static void cpu_signature(char *out, size_t n) {
  out[0] = 0;
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[4096];
  size_t k = 0;
  int got = 0;
  while (got < 2 && fgets(line, sizeof line, f)) {
    if ((!strncmp(line, "model name", 10) || !strncmp(line, "flags", 5)) && k < n) {
      k += (size_t)snprintf(out + k, n - k, "%s", line);
      got++;
    }
  }
  fclose(f);
}

/* `p` with its last `cut` characters replaced by `add`, into out[n]. */
static int swap_suffix(char *out, size_t n, const char *p, size_t cut, const char *add) {
  return (size_t)snprintf(out, n, "%.*s%s", (int)(strlen(p) - cut), p, add) >= n ? -1 : 0;
}

/* The cache entry of key[0..k) (hash h) in dir, loaded into m when it is
 * there and intact: 0, else -1 (a miss; a damaged entry is a miss). */
static int load_cached(const char *dir, uint64_t h, const char *key, size_t k, JitModule *m) {
  char so[1200], keyf[1200];
  if ((size_t)snprintf(so, sizeof so, "%s/%016llx.so", dir, (unsigned long long)h) >= sizeof so ||
      (size_t)snprintf(keyf, sizeof keyf, "%s/%016llx.key", dir, (unsigned long long)h) >= sizeof keyf)
    return -1;
  size_t old_len = 0, len = 0;
  char *old = duet_read_file(keyf, &old_len);
  if (!old) return -1;
  void *bytes = NULL;
  int fd = duet_cache_open_verified(so, key, k, old, old_len, &bytes, &len), rc = -1;
  char e2[600];
  if (fd >= 0) rc = open_module(fd, bytes, len, so, m, e2, sizeof e2);
  if (fd >= 0) close(fd);
  free(bytes);
  free(old);
  return rc;
}

/* Compiles src in dir and loads the result into m.  `cache`: dir is the
 * kernel cache, and the object and its key (key[0..k) plus the object line)
 * are stored there as <h>.so and <h>.key (object first, key last, each
 * renamed into place); otherwise (a private temporary directory) nothing
 * stays.  The source is a temporary locked while the compiler runs
 * (duet_cache_tmp), with the compiler's output and the key beside it; all
 * are removed before returning, the source last.  0; -2 when the compiler
 * exited with an error; -3 when it was killed by a signal; -1 for any other
 * failure; a message in err. */
static int compile_in(const char *dir, bool cache, const char *src, const char *key, size_t k, uint64_t h,
                      JitModule *m, const char *what, char *err, size_t errlen) {
  const char *flags[] = {DUET_KERNEL_CFLAGS, "-fPIC", "-shared"};
  size_t n_flags = sizeof flags / sizeof *flags;
  char base[1100], c_path[1300], so_tmp[1300] = "", key_tmp[1300] = "", so[1200], keyf[1200];
  if ((size_t)snprintf(base, sizeof base, "%s/%016llx", dir, (unsigned long long)h) >= sizeof base ||
      (size_t)snprintf(so, sizeof so, "%s.so", base) >= sizeof so ||
      (size_t)snprintf(keyf, sizeof keyf, "%s.key", base) >= sizeof keyf) {
    snprintf(err, errlen, "kernel cache path too long (set DUET_CACHE_DIR to a shorter directory)");
    return -1;
  }
  int fc = duet_cache_tmp(c_path, sizeof c_path, base, ".c");
  if (fc < 0) {
    snprintf(err, errlen, "cannot create a file in %s: %s", dir, strerror(errno));
    return -1;
  }
  int rc = -1, fs = -1, fk = -1;
  void *bytes = NULL;
  size_t len = 0;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if (duet_write_fd_sync(fc, src, strlen(src))) {
    snprintf(err, errlen, "cannot write %s: %s", c_path, strerror(errno));
    goto out;
  }
  if (swap_suffix(so_tmp, sizeof so_tmp, c_path, 2, ".so.tmp") ||
      swap_suffix(key_tmp, sizeof key_tmp, c_path, 2, ".key.tmp")) {
    snprintf(err, errlen, "kernel cache path too long (set DUET_CACHE_DIR to a shorter directory)");
    so_tmp[0] = key_tmp[0] = 0;
    goto out;
  }
  char *argv[16];
  int a = 0;
  argv[a++] = (char *)jit_cc();
  for (size_t i = 0; i < n_flags; i++) argv[a++] = (char *)flags[i];
  argv[a++] = "-o";
  argv[a++] = so_tmp;
  argv[a++] = c_path;
  argv[a++] = "-lm";
  argv[a] = NULL;
  char log[8192];
  int st_cc = jit_run_shown(argv, log, sizeof log, what);
  if (st_cc != 0) {
    snprintf(err, errlen, "compiling generated kernels failed (%s exited with %d):\n%s", jit_cc(), st_cc, log);
    rc = st_cc > 0 ? -2 : -3; /* -1: killed by a signal (an interrupt), or it could not run */
    goto out;
  }
  /* hash the object through the descriptor that is then loaded */
  fs = open(so_tmp, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fs < 0 || !(bytes = duet_read_fd(fs, &len)) || fsync(fs)) {
    snprintf(err, errlen, "cannot read back the compiled kernels %s: %s", so_tmp, strerror(errno));
    goto out;
  }
  if (cache) {
    /* the key file: the full key, then the object's size and hash */
    char *full = malloc(k + 96);
    if (!full) {
      snprintf(err, errlen, "out of host memory");
      goto out;
    }
    memcpy(full, key, k);
    size_t fn = k + (size_t)snprintf(full + k, 96, "\nobject: %zu %016llx\n", len,
                                     (unsigned long long)duet_fnv1a(bytes, len, DUET_FNV_OFFSET));
    fk = open(key_tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int bad = fk < 0 || duet_write_fd_sync(fk, full, fn) || rename(so_tmp, so) || (so_tmp[0] = 0, rename(key_tmp, keyf));
    int e = errno;
    free(full);
    if (bad) {
      snprintf(err, errlen, "cannot write the kernel cache in %s: %s", dir, strerror(e));
      if (!so_tmp[0]) unlink(so); /* the object without its key is no entry */
      goto out;
    }
    key_tmp[0] = 0;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  m->compile_seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  rc = open_module(fs, bytes, len, cache ? so : so_tmp, m, err, errlen);
out:
  if (fs >= 0) close(fs);
  if (fk >= 0) close(fk);
  free(bytes);
  if (so_tmp[0]) unlink(so_tmp);
  if (key_tmp[0]) unlink(key_tmp);
  unlink(c_path); /* last: while it is there, it marks the others as this run's */
  close(fc);
  return rc;
}

int jit_load(const char *src, JitModule *m, char *err, size_t errlen) { return jit_load_shown(src, m, NULL, err, errlen); }

int jit_load_shown(const char *src, JitModule *m, const char *what, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  m->fd = -1;
  char ver[512], dir[1024], cpu[4096];
  char why[1400];
  if (compiler_version(ver, sizeof ver, why, sizeof why)) {
    snprintf(err, errlen, "cannot run the C compiler '%s' (%s; set DUET_CC, or install gcc: apt-get install gcc)",
             jit_cc(), why);
    return -1;
  }
  cpu_signature(cpu, sizeof cpu);
  /* the full key: everything that changes the object code */
  const char *flags[] = {DUET_KERNEL_CFLAGS, "-fPIC", "-shared"};
  size_t n_flags = sizeof flags / sizeof *flags;
  size_t klen = strlen(src) + strlen(cpu) + 2048;
  char *key = malloc(klen);
  if (!key) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  size_t k = (size_t)snprintf(key, klen, "duet kernel cache v2\ncc: %s\nversion: %s\n%sflags:", jit_cc(), ver, cpu);
  for (size_t i = 0; i < n_flags; i++) k += (size_t)snprintf(key + k, klen - k, " %s", flags[i]);
  k += (size_t)snprintf(key + k, klen - k, "\nsource:\n%s", src);
  uint64_t h = duet_fnv1a(key, k, DUET_FNV_OFFSET);
  /* a hit: the key file holds the full key, then the object's size and
   * hash, which must match the .so (a damaged object is recompiled) */
  int cached = -1;
  if (!duet_cache_dir(dir, sizeof dir, why, sizeof why)) {
    duet_cache_clean(dir); /* what runs killed while compiling left */
    if (!load_cached(dir, h, key, k, m)) {
      m->cache_hit = true;
      free(key);
      return 0;
    }
    if (!(cached = compile_in(dir, true, src, key, k, h, m, what, why, sizeof why)) || cached == -3) {
      if (cached) snprintf(err, errlen, "%s", why); /* interrupted: not tried again */
      free(key);
      return cached ? -1 : 0;
    }
  }
  /* no usable cache directory (HOME missing, read-only, a full disk, ...):
   * compile in a private temporary directory, removed once the kernels are
   * loaded.  When the compiler itself failed in the cache, the same is
   * tried once more there (a full disk also fails the compiler); the
   * warning then only follows success, and a failure is reported as the
   * compiler's. */
  char tmp[1024], e2[600];
  if (duet_private_tmpdir(tmp, sizeof tmp, "duet-kernels", e2, sizeof e2)) {
    snprintf(err, errlen, "%s; no temporary directory either (%s)", why, e2);
    free(key);
    return -1;
  }
  if (cached != -2) fprintf(stderr, "duet: warning: %s; compiling the kernels in %s without caching them\n", why, tmp);
  int rc = compile_in(tmp, false, src, key, k, h, m, what, err, errlen);
  if (!rc && cached == -2) { /* the first line the compiler printed says why */
    const char *log = strchr(why, '\n');
    log = log ? log + 1 : "";
    fprintf(stderr, "duet: warning: the compiler failed in the kernel cache %s (%.*s); compiled the kernels in %s "
            "without caching them\n", dir, (int)strcspn(log, "\n"), log, tmp);
  }
  rmdir(tmp);
  free(key);
  return rc ? -1 : 0;
}

void jit_unload(JitModule *m) {
  if (m->handle) {
    dlclose(m->handle);
    if (m->fd >= 0) close(m->fd);
  }
  memset(m, 0, sizeof *m);
  m->fd = -1;
}
