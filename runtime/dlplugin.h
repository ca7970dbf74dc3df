/* runtime/dlplugin.h: finding and loading a duet plugin (libduet_cuda.so,
 * libduet_mpi.so) with dlopen, the search the CUDA and MPI loaders share.
 * Internal to the runtime. */
#ifndef DUET_DLPLUGIN_H
#define DUET_DLPLUGIN_H

#include <stdbool.h>
#include <stddef.h>

/* Opens the plugin `file`: $env_var (only it, when set and not empty: no
 * silent fallback to another copy), else `file` next to the executable,
 * else build_default (the build tree's copy), else `file` on the dynamic
 * loader's search path; a path that does not exist is skipped, and a
 * library for which compatible(h) is false is closed and passed over.
 * dlflags: RTLD_NOW | RTLD_LOCAL or RTLD_GLOBAL.  The handle stays open for
 * the life of the process.  NULL when none loads: with $env_var set, *named
 * is true and err holds the whole message ("DUET_X=PATH cannot be loaded:
 * DLERROR" or "DUET_X=PATH is not a compatible duet WHAT plugin"); else
 * *named is false and err holds the last candidate's reason (dlerror's, or
 * "PATH is not a compatible duet WHAT plugin"), "" when no candidate
 * existed. */
void *duet_dlplugin_open(const char *env_var, const char *file, const char *build_default, int dlflags,
                         bool (*compatible)(void *h), const char *what, bool *named, char *err, size_t errlen);

#endif
