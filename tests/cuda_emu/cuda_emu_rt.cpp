/* tests/cuda_emu/cuda_emu_rt.cpp: the launcher of cuda_emu.h, compiled into
 * every emulated module.  emu_launch_ex(fn, grid, block, shared, t, s) runs
 * the grid's blocks one at a time, in a random order drawn from the
 * module's generator (emu_seed); a block's threads are fibers (ucontext)
 * on the calling thread, thread i being threadIdx.x i, up to CUDA's 1024
 * per block.  A fiber runs until it reaches a barrier (__syncthreads:
 * emu_sync_block; the warp exchange of the shuffles: emu_sync_warp) or
 * returns; a barrier opens when every thread of the block (of the warp)
 * waits at it, and the threads that it releases resume in a random order
 * too, so that a missing __syncthreads shows whichever thread of the pair
 * has the lower index.  Threads that wait at different barriers, or a
 * block barrier that some threads of the block never reach (they
 * returned), are reported as a failed launch instead of hanging.
 *
 * Before each block runs, its shared memory is filled with the byte 0xff
 * (a NaN as f64, f32, f16 and bf16; -1 as an integer): the static
 * __shared__ variables (cuda_emu.h places them all in the section
 * emu_shared, whose bounds the linker provides) and the first `shared`
 * bytes of the dynamic buffer emu_smem, which is what the launch asked
 * for.  A block that reads shared memory it did not write, or expects what
 * another block left there, computes NaN or garbage, as it may on a GPU.
 *
 * The order is a function of the generator's state only (splitmix64,
 * Steele et al. 2014), so emu_seed(x) followed by the same launches
 * replays the same schedule.  emu_launch(fn, grid, block, t, s) is
 * emu_launch_ex with the 48 KiB a launch may take without opting in as
 * the dynamic shared memory to fill.
 *
 * Switching fibers costs far less than waking POSIX threads.  On x86-64 a
 * fiber switch is a few instructions (the callee-saved registers of the
 * System V AMD64 ABI; no system call, unlike swapcontext's signal mask);
 * elsewhere ucontext.  The floating-point environment (MXCSR and the x87
 * control word on x86-64) is the default one for the whole launch, set
 * once and the caller's restored after, instead of at each switch: no
 * kernel changes it.  emu_shutdown() releases the stacks. */
#include <fenv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#define EMU_POOL 1024 /* threads per block: CUDA's limit */
#define EMU_STACK (256u << 10)
#define EMU_POISON 0xff

EmuDim threadIdx, blockIdx, blockDim, gridDim;
unsigned char emu_slots[2][1024][8];
unsigned char emu_slot_bank[1024];
double emu_smem[1 << 17];
int emu_sync_or_word;

/* the static __shared__ variables (cuda_emu.h): the linker defines these
 * bounds of the section when some variable is in it, else they are null */
extern "C" char __start_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_emu_shared[] __attribute__((weak, visibility("hidden")));

typedef void (*EmuKernel)(void *const *t, const double *s);
enum { EMU_READY, EMU_AT_BLOCK, EMU_AT_WARP, EMU_DONE };
static char *emu_stacks;
static int emu_state[EMU_POOL];
static unsigned emu_cur;
static EmuKernel emu_fn;
static void *const *emu_t;
static const double *emu_s;
static unsigned long long emu_rng = 0x853c49e6748fea9bull; /* the schedule's generator */
static unsigned *emu_blocks, emu_blocks_cap;               /* this launch's block order */
static unsigned emu_threads[EMU_POOL];                     /* this pass's thread order */

extern "C" void emu_seed(unsigned long long seed) { emu_rng = seed; }

static unsigned long long emu_next(void) { /* splitmix64 */
  unsigned long long z = (emu_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* a[0..n) = a random permutation of 0..n-1: Fisher-Yates, j drawn below
 * i as the high half of a 32-bit random number times i (Lemire 2019; the
 * bias, below i / 2^32, does not matter here), two draws per splitmix64 */
static void emu_shuffle(unsigned *a, unsigned n) {
  for (unsigned i = 0; i < n; i++) a[i] = i;
  unsigned long long r = 0;
  for (unsigned i = n; i > 1; i--) {
    if ((i & 1) == (n & 1)) r = emu_next();
    else r >>= 32;
    unsigned j = (unsigned)(((r & 0xffffffffull) * i) >> 32), x = a[i - 1];
    a[i - 1] = a[j], a[j] = x;
  }
}

#if defined(__x86_64__)
/* emu_switch(save, to): pushes the callee-saved registers on the current
 * stack, stores the stack pointer in *save, continues from stack `to` */
extern "C" void emu_switch(void **save, void *to);
asm(".text\n.p2align 4\n.type emu_switch,@function\n.hidden emu_switch\n.globl emu_switch\nemu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
    ".size emu_switch, .-emu_switch\n");
static void *emu_main_sp, *emu_fiber_sp[EMU_POOL];

static void emu_fiber(void) {
  emu_fn(emu_t, emu_s);
  emu_state[emu_cur] = EMU_DONE;
  void *dead;
  emu_switch(&dead, emu_main_sp);
  __builtin_unreachable();
}

/* a new fiber's stack as emu_switch leaves a suspended one: six
 * registers and emu_fiber as the return address, 16-byte aligned so that
 * emu_fiber starts as if called.  The tops of the stacks are staggered by
 * i * 64 bytes: at a stride of EMU_STACK alone, the hot lines of every
 * fiber's stack would share a few cache sets. */
static int emu_fiber_init(unsigned i) {
  char *top = emu_stacks + (size_t)(i + 1) * EMU_STACK - 16 - (size_t)i * 64;
  void **ret = (void **)top;
  *ret = (void *)emu_fiber;
  char *sp = top - 6 * 8;
  memset(sp, 0, 6 * 8);
  emu_fiber_sp[i] = sp;
  return 0;
}
static int emu_resume(unsigned i) {
  emu_switch(&emu_main_sp, emu_fiber_sp[i]);
  return 0;
}
static void emu_wait(int at) {
  unsigned me = emu_cur;
  emu_state[me] = at;
  emu_switch(&emu_fiber_sp[me], emu_main_sp); /* back when the barrier opens */
}
#else
static ucontext_t emu_main, emu_fiber_ctx[EMU_POOL];

static void emu_fiber(void) {
  emu_fn(emu_t, emu_s);
  emu_state[emu_cur] = EMU_DONE; /* returns to emu_main through uc_link */
}
static int emu_fiber_init(unsigned i) {
  if (getcontext(&emu_fiber_ctx[i])) return -1;
  emu_fiber_ctx[i].uc_stack.ss_sp = emu_stacks + (size_t)i * EMU_STACK;
  emu_fiber_ctx[i].uc_stack.ss_size = EMU_STACK;
  emu_fiber_ctx[i].uc_link = &emu_main;
  makecontext(&emu_fiber_ctx[i], emu_fiber, 0);
  return 0;
}
static int emu_resume(unsigned i) { return swapcontext(&emu_main, &emu_fiber_ctx[i]); }
static void emu_wait(int at) {
  unsigned me = emu_cur;
  emu_state[me] = at;
  swapcontext(&emu_fiber_ctx[me], &emu_main); /* back when the barrier opens */
}
#endif

void emu_sync_block(void) { emu_wait(EMU_AT_BLOCK); }
void emu_sync_warp(unsigned w) {
  (void)w;
  emu_wait(EMU_AT_WARP);
}

static int emu_run_grid(unsigned grid, unsigned block, unsigned shared);

extern "C" int emu_launch_ex(EmuKernel fn, unsigned grid, unsigned block, unsigned shared, void *const *t,
                             const double *s) {
  if (block == 0 || block > EMU_POOL || block % 32 || shared > sizeof emu_smem) return -1;
  if (!emu_stacks) {
    void *m = mmap(NULL, (size_t)EMU_POOL * EMU_STACK, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return -1;
    emu_stacks = (char *)m;
  }
  if (grid > emu_blocks_cap) {
    unsigned *b = (unsigned *)realloc(emu_blocks, (size_t)grid * sizeof *b);
    if (!b) return -1;
    emu_blocks = b, emu_blocks_cap = grid;
  }
  emu_shuffle(emu_blocks, grid);
  emu_fn = fn;
  emu_t = t;
  emu_s = s;
  gridDim.x = grid;
  blockDim.x = block;
  gridDim.y = gridDim.z = blockDim.y = blockDim.z = blockIdx.y = blockIdx.z = 1;
  threadIdx.y = threadIdx.z = 0;
  fenv_t host;
  if (fegetenv(&host) || fesetenv(FE_DFL_ENV)) return -1;
  int rc = emu_run_grid(grid, block, shared);
  return fesetenv(&host) ? -1 : rc;
}

/* the blocks of the launch that emu_launch_ex set up */
static int emu_run_grid(unsigned grid, unsigned block, unsigned shared) {
  size_t static_shared = __start_emu_shared ? (size_t)(__stop_emu_shared - __start_emu_shared) : 0;
  for (unsigned g = 0; g < grid; g++) {
    unsigned b = emu_blocks[g];
    blockIdx.x = b;
    if (static_shared) memset(__start_emu_shared, EMU_POISON, static_shared);
    memset(emu_smem, EMU_POISON, shared);
    for (unsigned i = 0; i < block; i++) {
      if (emu_fiber_init(i)) return -1;
      emu_state[i] = EMU_READY;
      emu_slot_bank[i] = 0;
    }
    for (;;) {
      emu_shuffle(emu_threads, block);
      for (unsigned k = 0; k < block; k++) {
        unsigned i = emu_threads[k];
        if (emu_state[i] == EMU_READY) {
          emu_cur = i;
          threadIdx.x = i;
          if (emu_resume(i)) return -1;
        }
      }
      /* every thread has returned or waits at a barrier: open the ones
       * that every thread concerned has reached */
      unsigned done = 0, at_block = 0;
      int opened = 0;
      for (unsigned i = 0; i < block; i++) done += emu_state[i] == EMU_DONE, at_block += emu_state[i] == EMU_AT_BLOCK;
      if (done == block) break;
      if (at_block == block) {
        for (unsigned i = 0; i < block; i++) emu_state[i] = EMU_READY;
        continue;
      }
      for (unsigned w = 0; w < block / 32; w++) {
        unsigned n = 0;
        for (unsigned i = 32 * w; i < 32 * w + 32; i++) n += emu_state[i] == EMU_AT_WARP;
        if (n == 32) {
          for (unsigned i = 32 * w; i < 32 * w + 32; i++) emu_state[i] = EMU_READY;
          opened = 1;
        }
      }
      if (!opened) {
        fprintf(stderr, "cuda_emu: block %u: %u of %u threads returned, %u wait at __syncthreads, the rest at a warp "
                        "exchange: divergent barrier\n", b, done, block, at_block);
        return -1;
      }
    }
  }
  return 0;
}

extern "C" int emu_launch(EmuKernel fn, unsigned grid, unsigned block, void *const *t, const double *s) {
  return emu_launch_ex(fn, grid, block, 48u << 10, t, s);
}

extern "C" void emu_shutdown(void) {
  if (emu_stacks) munmap(emu_stacks, (size_t)EMU_POOL * EMU_STACK);
  emu_stacks = NULL;
  free(emu_blocks);
  emu_blocks = NULL;
  emu_blocks_cap = 0;
}
