/* runtime/cuda/cuda_plugin.h: what the CUDA plugin's files share (private
 * to runtime/cuda/; not exported from libduet_cuda.so). */
#ifndef DUET_CUDA_PLUGIN_H
#define DUET_CUDA_PLUGIN_H

#include <cuda.h>

#include "../duet_rt.h"

/* The CUDA handles of a device of this plugin: its GPU ordinal (the
 * CUdevice of cuDeviceGet, the number NCCL and the CUDA runtime use), the
 * GPU's primary context, the stream its kernels, GEMMs and copies run on.
 * 0, or -1 when d is not a device of this plugin. */
int duet_cuda_handles(DuetDevice *d, int *ordinal, CUcontext *ctx, CUstream *stream);

#endif
