/* tests/cuda_emu/cuda_emu.h: just enough of CUDA to run duet's generated
 * CUDA C on the host, for tests/test_cuda_emu.c and the fake GPU
 * (tests/fakegpu).  Compiled as C++ in front of the generated source.
 * Blocks run one after another in a seeded random order; the threads of a
 * block (up to 1024) are fibers (cuda_emu_rt.cpp), so __syncthreads is a
 * barrier over the block and __shfl_xor_sync an exchange through a
 * barrier over the warp's 32 threads.  __shared__ variables become function-level
 * statics in the section emu_shared: one copy, which is what a block
 * shares, as only one block runs at a time, filled with a NaN pattern
 * before each block.  Dynamic shared memory is the buffer emu_smem. */
#include <math.h>
#include <string.h>

struct EmuDim {
  unsigned x, y, z;
};
extern EmuDim threadIdx, blockIdx, blockDim, gridDim; /* threadIdx: set before each fiber resumes */
void emu_sync_block(void);      /* every thread of the block */
void emu_sync_warp(unsigned w); /* every thread of warp w */
extern unsigned char emu_slots[2][1024][8]; /* the shuffles' exchange: two banks, used in turn */
extern unsigned char emu_slot_bank[1024];   /* per thread: the bank of its next shuffle */
extern double emu_smem[1 << 17];

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static __attribute__((section("emu_shared")))
#define __syncthreads() emu_sync_block()

static inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, sizeof f);
  return f;
}
static inline double __longlong_as_double(long long i) {
  double d;
  memcpy(&d, &i, sizeof d);
  return d;
}
static inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
/* round-to-nearest f32 add, subtract, multiply, divide and square root (the host's default rounding) */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }

/* The PTX f16x2 instructions add/sub/mul.rn.f16x2 that the half2 helpers
 * of the generated prelude use on sm_53 and later (they call
 * duet_emu_f16x2 on a host compiler).  Written apart from the C kernels'
 * f32-then-round path: each lane's exact result is formed from integer
 * significands (a sum of two binary16 values is an integer multiple of
 * 2^-24 below 2^17; a product, of two 11-bit significands) and rounded
 * to binary16 once, to nearest even, with subnormals and overflow to inf.
 * A NaN operand or an invalid operation (inf - inf, 0 * inf) gives the
 * NaN 0x7fff: PTX leaves it unspecified, and duet claims no NaN payload. */
static inline unsigned short emu_f16_round(unsigned sign, unsigned long long m, int e) {
  /* sign, m * 2^e */
  if (m == 0) return (unsigned short)(sign << 15);
  int q = 64 - __builtin_clzll(m) - 11 + e; /* exponent of the 11th significant bit */
  if (q < -24) q = -24;                     /* the subnormals' fixed quantum */
  unsigned long long r;
  if (q <= e) {
    r = m << (e - q);
  } else {
    int sh = q - e;
    unsigned long long rem = m & ((1ull << sh) - 1), half = 1ull << (sh - 1);
    r = (m >> sh) + (rem > half || (rem == half && ((m >> sh) & 1)));
  }
  if (r == 0x800) r = 0x400, q++; /* rounding carried into the next binade */
  if (r < 0x400) return (unsigned short)(sign << 15 | r); /* subnormal (q == -24) or zero */
  if (q + 25 >= 31) return (unsigned short)(sign << 15 | 0x7c00u);
  return (unsigned short)(sign << 15 | (unsigned)(q + 25) << 10 | (r & 0x3ffu));
}
static inline unsigned short emu_f16_op(unsigned short a, unsigned short b, char op) {
  if (op == '-') b ^= 0x8000u;
  unsigned sa = a >> 15, sb = b >> 15, ea = a >> 10 & 31u, eb = b >> 10 & 31u;
  unsigned long long ma = a & 0x3ffu, mb = b & 0x3ffu;
  if ((ea == 31 && ma) || (eb == 31 && mb)) return 0x7fffu;
  bool za = (a & 0x7fffu) == 0, zb = (b & 0x7fffu) == 0;
  if (op == '*') {
    if (ea == 31 || eb == 31) return (unsigned short)((ea == 31 && zb) || (eb == 31 && za) ? 0x7fffu : (sa ^ sb) << 15 | 0x7c00u);
    /* value = (ma | implicit 1) * 2^(max(ea, 1) - 25) */
    return emu_f16_round(sa ^ sb, (ea ? ma | 0x400u : ma) * (eb ? mb | 0x400u : mb),
                         (int)(ea ? ea : 1) - 25 + (int)(eb ? eb : 1) - 25);
  }
  if (ea == 31 || eb == 31) return ea == 31 && eb == 31 && sa != sb ? 0x7fffu : ea == 31 ? a : b;
  /* in units of 2^-24 */
  long long x = (long long)((ea ? ma | 0x400u : ma) << ((ea ? ea : 1) - 1));
  long long y = (long long)((eb ? mb | 0x400u : mb) << ((eb ? eb : 1) - 1));
  long long sum = (sa ? -x : x) + (sb ? -y : y);
  if (sum == 0) return (unsigned short)(za && zb && sa && sb ? 0x8000u : 0); /* exact zero: +0 unless -0 + -0 */
  return emu_f16_round(sum < 0, (unsigned long long)(sum < 0 ? -sum : sum), -24);
}
static inline unsigned duet_emu_f16x2(unsigned a, unsigned b, char op) {
  return emu_f16_op((unsigned short)a, (unsigned short)b, op) |
         (unsigned)emu_f16_op((unsigned short)(a >> 16), (unsigned short)(b >> 16), op) << 16;
}
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicMax(unsigned *p, unsigned v) {
  unsigned o = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (o < v && !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return o;
}
/* DP4A (sm_61 and later): c + the four products of the signed bytes of a
 * and b, written from PTX's definition of dp4a.s32.s32 (each byte
 * sign-extended to 32 bits, the sum wrapping modulo 2^32) */
static inline int __dp4a(int a, int b, int c) {
  unsigned ua = (unsigned)a, ub = (unsigned)b, sum = (unsigned)c;
  for (int j = 0; j < 4; j++) {
    int xa = (int)((ua >> (8 * j)) & 255u), xb = (int)((ub >> (8 * j)) & 255u);
    if (xa > 127) xa -= 256;
    if (xb > 127) xb -= 256;
    sum += (unsigned)(xa * xb);
  }
  return (int)sum;
}
static inline int atomicOr(int *p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
/* __syncthreads_or: a barrier that also ORs a predicate over the block.
 * The word is reset by thread 0 after the third barrier, before any thread
 * can reach the next call's first. */
extern int emu_sync_or_word;
static inline int __syncthreads_or(int pred) {
  emu_sync_block();
  if (pred) __atomic_store_n(&emu_sync_or_word, 1, __ATOMIC_SEQ_CST);
  emu_sync_block();
  int r = __atomic_load_n(&emu_sync_or_word, __ATOMIC_SEQ_CST);
  emu_sync_block();
  if (threadIdx.x == 0) __atomic_store_n(&emu_sync_or_word, 0, __ATOMIC_SEQ_CST);
  return r;
}
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
/* Every lane writes its value, the warp meets, every lane reads its
 * partner's.  One barrier suffices because consecutive shuffles use the
 * two banks in turn: a lane can write a bank again only two shuffles
 * later, after the whole warp has met at the shuffle in between, so after
 * every lane has read it. */
template <typename T> static T __shfl_xor_sync(unsigned mask, T v, int o) {
  (void)mask;
  static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
  unsigned tid = threadIdx.x, w = tid >> 5, k = emu_slot_bank[tid];
  emu_slot_bank[tid] = (unsigned char)(k ^ 1);
  memcpy(emu_slots[k][tid], &v, sizeof v);
  emu_sync_warp(w);
  T r;
  memcpy(&r, emu_slots[k][(w << 5) | ((tid & 31) ^ (unsigned)o)], sizeof r);
  return r;
}
