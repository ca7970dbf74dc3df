/* tests/test_jit.c: modules loaded by jit_load stay apart.  The JIT loads a
 * checked object through its descriptor (dlopen of /proc/self/fd/N), and
 * the dynamic loader returns an already loaded module for a name it has
 * seen: two different modules loaded one after the other under the same
 * /proc/self/fd/N would be one.  Loads two sources that differ only in
 * their kernel count, both compiled and both from the cache, while the
 * others stay loaded, and checks each module's count. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/jit.h"

static int failures;

static const char *source(int n, char *buf, size_t len) {
  snprintf(buf, len,
           "typedef void (*duet_fn)(void);\n"
           "const int duet_kernel_count = %d;\n"
           "const duet_fn duet_kernel_table[%d] = {0};\n",
           n, n);
  return buf;
}

static void load(int n, JitModule *m, bool want_hit) {
  char src[256], err[8192];
  if (jit_load(source(n, src, sizeof src), m, err, sizeof err)) {
    fprintf(stderr, "FAIL jit_load of the %d-kernel module: %s\n", n, err);
    failures++;
    return;
  }
  if (m->n != n || m->cache_hit != want_hit) {
    fprintf(stderr, "FAIL the %d-kernel module (%s): loaded one with %d kernels (%s)\n", n,
            want_hit ? "from the cache" : "compiled", m->n, m->cache_hit ? "from the cache" : "compiled");
    failures++;
  }
}

int main(void) {
  char dir[] = "/tmp/duet-test-jit.XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  char cache[256];
  snprintf(cache, sizeof cache, "%s/cache", dir);
  setenv("DUET_CACHE_DIR", cache, 1);
  JitModule a, b, a2, b2;
  load(1, &a, false);
  load(2, &b, false);  /* compiled while a is loaded */
  load(1, &a2, true);  /* from the cache while a and b are */
  jit_unload(&a);
  load(2, &b2, true);  /* after an unload */
  if (a2.n == 1 && b.n == 2 && b2.n == 2) printf("ok: 4 loads, each module its own\n");
  jit_unload(&b);
  jit_unload(&a2);
  jit_unload(&b2);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "warning: could not remove %s\n", dir);
  return failures != 0;
}
