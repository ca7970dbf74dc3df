/* runtime/dlplugin.c: the plugin search of dlplugin.h. */
#define _GNU_SOURCE
#include "dlplugin.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *duet_dlplugin_open(const char *env_var, const char *file, const char *build_default, int dlflags,
                         bool (*compatible)(void *h), const char *what, bool *named, char *err, size_t errlen) {
  const char *env = getenv(env_var);
  *named = env && *env;
  if (*named) {
    void *h = dlopen(env, dlflags);
    if (!h) {
      snprintf(err, errlen, "%s=%s cannot be loaded: %s", env_var, env, dlerror());
      return NULL;
    }
    if (compatible(h)) return h;
    dlclose(h);
    snprintf(err, errlen, "%s=%s is not a compatible duet %s plugin", env_var, env, what);
    return NULL;
  }
  char self[1024], cand[1200];
  const char *tries[3];
  int n = 0;
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  if (k > 0) {
    self[k] = 0;
    char *slash = strrchr(self, '/');
    if (slash) {
      *slash = 0;
      snprintf(cand, sizeof cand, "%s/%s", self, file);
      tries[n++] = cand;
    }
  }
  tries[n++] = build_default;
  tries[n++] = file;
  err[0] = 0;
  for (int i = 0; i < n; i++) {
    if (i > 0 && !strcmp(tries[i], tries[i - 1])) continue;
    if (strchr(tries[i], '/') && access(tries[i], F_OK)) continue;
    void *h = dlopen(tries[i], dlflags);
    if (h) {
      if (compatible(h)) return h;
      snprintf(err, errlen, "%s is not a compatible duet %s plugin", tries[i], what);
      dlclose(h);
      continue;
    }
    snprintf(err, errlen, "%s", dlerror());
  }
  return NULL;
}
