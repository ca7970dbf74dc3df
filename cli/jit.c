/* cli/jit.c: generated C -> shared object -> dlopen, with a disk cache. */
#define _GNU_SOURCE
#include "jit.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *jit_cc(void) {
  const char *cc = getenv("DUET_CC");
  return cc && *cc ? cc : "cc";
}

int jit_run(char *const argv[], char *log, size_t loglen) {
  int pfd[2];
  if (pipe(pfd)) return -1;
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
    execvp(argv[0], argv);
    fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(pfd[1]);
  size_t n = 0;
  char tmp[4096];
  ssize_t got;
  while ((got = read(pfd[0], tmp, sizeof tmp)) != 0) {
    if (got < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (ssize_t i = 0; i < got && n + 1 < loglen; i++) log[n++] = tmp[i];
  }
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


static int open_module(const char *so, JitModule *m, char *err, size_t errlen) {
  m->handle = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!m->handle) {
    snprintf(err, errlen, "cannot load compiled kernels %s: %s", so, dlerror());
    return -1;
  }
  const int *count = dlsym(m->handle, "duet_kernel_count");
  const DuetKernelFn *table = dlsym(m->handle, "duet_kernel_table");
  if (!count || !table) {
    snprintf(err, errlen, "compiled kernels %s lack duet_kernel_table", so);
    dlclose(m->handle);
    m->handle = NULL;
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

/* Size and FNV-1a of a file's bytes; -1 when unreadable. */
static int file_digest(const char *path, size_t *size, uint64_t *h) {
  size_t n = 0;
  char *b = duet_read_file(path, &n);
  if (!b) return -1;
  *size = n;
  *h = duet_fnv1a(b, n, DUET_FNV_OFFSET);
  free(b);
  return 0;
}

#define PATH_CHECK(buf, ...)                                                                \
  do {                                                                                      \
    if ((size_t)snprintf(buf, sizeof buf, __VA_ARGS__) >= sizeof buf) {                    \
      snprintf(err, errlen, "kernel cache path too long (set DUET_CACHE_DIR to a shorter directory)"); \
      goto out;                                                                             \
    }                                                                                       \
  } while (0)

int jit_load(const char *src, JitModule *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  char ver[512], dir[1024], cpu[4096];
  char why[400];
  if (compiler_version(ver, sizeof ver, why, sizeof why)) {
    snprintf(err, errlen, "cannot run the C compiler '%s' (%s; set DUET_CC, or install gcc: apt-get install gcc)",
             jit_cc(), why);
    return -1;
  }
  /* no usable cache directory (HOME unset or read-only, ...): compile in a
   * private temporary directory, removed once the kernels are loaded */
  bool temp = false;
  if (duet_cache_dir(dir, sizeof dir, err, errlen)) {
    char why[600];
    snprintf(why, sizeof why, "%s", err);
    const char *td = getenv("TMPDIR");
    if ((size_t)snprintf(dir, sizeof dir, "%s/duet-kernels-XXXXXX", td && *td ? td : "/tmp") >= sizeof dir ||
        !mkdtemp(dir)) {
      snprintf(err, errlen, "%s; no temporary directory either (%s)", why, strerror(errno));
      return -1;
    }
    fprintf(stderr, "duet: warning: %s; compiling the kernels in %s without caching them\n", why, dir);
    temp = true;
  }
  cpu_signature(cpu, sizeof cpu);
  /* the full key: everything that changes the object code */
  const char *flags[] = {DUET_KERNEL_CFLAGS, "-fPIC", "-shared"};
  size_t n_flags = sizeof flags / sizeof *flags;
  size_t klen = strlen(src) + strlen(cpu) + 2048;
  char *key = malloc(klen), *old = NULL;
  char so[1200], keyf[1200], base[1200], c_path[1300], so_tmp[1300], key_tmp[1300];
  int rc = -1;
  c_path[0] = so_tmp[0] = key_tmp[0] = so[0] = keyf[0] = 0;
  if (!key) {
    snprintf(err, errlen, "out of host memory");
    return -1;
  }
  size_t k = (size_t)snprintf(key, klen, "duet kernel cache v2\ncc: %s\nversion: %s\n%sflags:", jit_cc(), ver, cpu);
  for (size_t i = 0; i < n_flags; i++) k += (size_t)snprintf(key + k, klen - k, " %s", flags[i]);
  k += (size_t)snprintf(key + k, klen - k, "\nsource:\n%s", src);
  uint64_t h = duet_fnv1a(key, k, DUET_FNV_OFFSET);
  PATH_CHECK(so, "%s/%016llx.so", dir, (unsigned long long)h);
  PATH_CHECK(keyf, "%s/%016llx.key", dir, (unsigned long long)h);

  /* a hit: the key file holds the full key, then the object's size and
   * hash, which must match the .so (a damaged object is recompiled) */
  size_t old_len = 0, so_size;
  uint64_t so_hash;
  old = duet_read_file(keyf, &old_len);
  struct stat st;
  if (old && old_len > k && !memcmp(old, key, k) && !stat(so, &st) && st.st_uid == getuid() &&
      !file_digest(so, &so_size, &so_hash)) {
    char want[96];
    snprintf(want, sizeof want, "\nobject: %zu %016llx\n", so_size, (unsigned long long)so_hash);
    if (old_len - k == strlen(want) && !memcmp(old + k, want, old_len - k)) {
      char e2[600];
      if (!open_module(so, m, e2, sizeof e2)) {
        m->cache_hit = true;
        rc = 0;
        goto out;
      }
    }
  }

  /* compile into temporary names, then rename: .so first, key last */
  PATH_CHECK(base, "%s/%016llx.%ld", dir, (unsigned long long)h, (long)getpid());
  PATH_CHECK(c_path, "%s.c", base);
  PATH_CHECK(so_tmp, "%s.so.tmp", base);
  PATH_CHECK(key_tmp, "%s.key.tmp", base);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if (duet_write_file_sync(c_path, src, strlen(src))) {
    snprintf(err, errlen, "cannot write %s: %s", c_path, strerror(errno));
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
  int st_cc = jit_run(argv, log, sizeof log);
  if (st_cc != 0) {
    snprintf(err, errlen, "compiling generated kernels failed (%s exited with %d):\n%s", jit_cc(), st_cc, log);
    goto out;
  }
  if (file_digest(so_tmp, &so_size, &so_hash) || duet_fsync_path(so_tmp)) {
    snprintf(err, errlen, "cannot read back the compiled kernels %s: %s", so_tmp, strerror(errno));
    goto out;
  }
  k += (size_t)snprintf(key + k, klen - k, "\nobject: %zu %016llx\n", so_size, (unsigned long long)so_hash);
  if (duet_write_file_sync(key_tmp, key, k) || rename(so_tmp, so) || rename(key_tmp, keyf)) {
    snprintf(err, errlen, "cannot write the kernel cache in %s: %s", dir, strerror(errno));
    goto out;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  m->compile_seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  rc = open_module(so, m, err, errlen);
out:
  if (c_path[0]) unlink(c_path);
  if (so_tmp[0]) unlink(so_tmp);
  if (key_tmp[0]) unlink(key_tmp);
  if (temp) { /* a loaded module stays mapped after its file is removed */
    if (so[0]) unlink(so);
    if (keyf[0]) unlink(keyf);
    rmdir(dir);
  }
  free(old);
  free(key);
  return rc;
}

void jit_unload(JitModule *m) {
  if (m->handle) dlclose(m->handle);
  memset(m, 0, sizeof *m);
}
