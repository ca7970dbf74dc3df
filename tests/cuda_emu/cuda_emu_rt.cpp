/* tests/cuda_emu/cuda_emu_rt.cpp: the launcher of cuda_emu.h, compiled into
 * every emulated module.  emu_launch(fn, grid, block, t, s) runs the grid's
 * blocks in order; a block's threads are fibers (ucontext) on the calling
 * thread, thread i being threadIdx.x i.  A fiber runs until it reaches a
 * barrier (__syncthreads: emu_sync_block; the warp exchange of the
 * shuffles: emu_sync_warp) or returns; a barrier opens when every thread
 * of the block (of the warp) waits at it.  Threads that wait at different
 * barriers, or a block barrier that some threads of the block never reach
 * (they returned), are reported as a failed launch instead of hanging.
 * Switching fibers costs far less than waking POSIX threads, and the
 * schedule is deterministic.  On x86-64 a fiber switch is a few
 * instructions (callee-saved registers, MXCSR and the x87 control word,
 * per the System V AMD64 ABI; no system call, unlike swapcontext's signal
 * mask); elsewhere ucontext.  emu_shutdown() releases the stacks. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#define EMU_POOL 64
#define EMU_STACK (256u << 10)

thread_local EmuDim threadIdx;
EmuDim blockIdx, blockDim, gridDim;
unsigned char emu_slots[1024][8];
double emu_smem[1 << 17];
int emu_sync_or_word;

typedef void (*EmuKernel)(void *const *t, const double *s);
enum { EMU_READY, EMU_AT_BLOCK, EMU_AT_WARP, EMU_DONE };
static char *emu_stacks;
static int emu_state[EMU_POOL];
static unsigned emu_cur;
static EmuKernel emu_fn;
static void *const *emu_t;
static const double *emu_s;

#if defined(__x86_64__)
/* emu_switch(save, to): pushes the callee-saved state on the current
 * stack, stores the stack pointer in *save, continues from stack `to` */
extern "C" void emu_switch(void **save, void *to);
asm(".text\n.p2align 4\n.type emu_switch,@function\n.hidden emu_switch\n.globl emu_switch\nemu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
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

/* a new fiber's stack as emu_switch leaves a suspended one: the default
 * MXCSR (0x1f80) and x87 control word (0x37f), six registers, and
 * emu_fiber as the return address, 16-byte aligned so that emu_fiber
 * starts as if called */
static int emu_fiber_init(unsigned i) {
  char *top = emu_stacks + (size_t)(i + 1) * EMU_STACK - 16;
  void **ret = (void **)top;
  *ret = (void *)emu_fiber;
  char *sp = top - 7 * 8;
  memset(sp, 0, 7 * 8);
  unsigned mxcsr = 0x1f80;
  unsigned short fpcw = 0x37f;
  memcpy(sp, &mxcsr, 4);
  memcpy(sp + 4, &fpcw, 2);
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

extern "C" int emu_launch(EmuKernel fn, unsigned grid, unsigned block, void *const *t, const double *s) {
  if (block == 0 || block > EMU_POOL || block % 32) return -1;
  if (!emu_stacks) {
    void *m = mmap(NULL, (size_t)EMU_POOL * EMU_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return -1;
    emu_stacks = (char *)m;
  }
  emu_fn = fn;
  emu_t = t;
  emu_s = s;
  gridDim.x = grid;
  blockDim.x = block;
  gridDim.y = gridDim.z = blockDim.y = blockDim.z = blockIdx.y = blockIdx.z = 1;
  threadIdx.y = threadIdx.z = 0;
  for (unsigned b = 0; b < grid; b++) {
    blockIdx.x = b;
    for (unsigned i = 0; i < block; i++) {
      if (emu_fiber_init(i)) return -1;
      emu_state[i] = EMU_READY;
    }
    for (;;) {
      for (unsigned i = 0; i < block; i++)
        if (emu_state[i] == EMU_READY) {
          emu_cur = i;
          threadIdx.x = i;
          if (emu_resume(i)) return -1;
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

extern "C" void emu_shutdown(void) {
  if (emu_stacks) munmap(emu_stacks, (size_t)EMU_POOL * EMU_STACK);
  emu_stacks = NULL;
}
