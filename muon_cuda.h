/* muon_cuda.h - the CUDA compute backend of muon: the step's arithmetic on one NVIDIA GPU.

   USAGE
   -----
   The implementation is CUDA and is compiled ONCE, by nvcc, in a .cu file of its own
   (examples/muon_cuda.cu is exactly this):

       #define MUON_CUDA_IMPLEMENTATION
       #include "muon.h"
       #include "muon_cuda.h"

       nvcc -O2 -fmad=false -c muon_cuda.cu

   Everything else (the trainer, muon.h's implementation) stays plain C or C++: it includes the
   two headers for the declarations only (no CUDA header is needed for them) and links with the
   CUDA runtime and cuBLAS:

       c++ train.o muon_cuda.o -L/usr/local/cuda/lib64 -lcudart -lcublas
       cc  train.o muon_cuda.o -L/usr/local/cuda/lib64 -lcudart -lcublas -lstdc++ -lm

   (nvcc's host code is C++, so linking with a C compiler needs -lstdc++ as well.)

   Flags: the element-wise formulas (momentum, the update, AdamW, NorMuon, the roundings) are
   muon.h's own MUON__HD functions, compiled for host and device, and every float operation in
   them and in the kernels below goes through muon__add, muon__mul, muon__div, muon__sqrt & co.,
   which on the device are PTX instructions rounded to nearest, without .ftz and never fused. So
   the GPU gives the CPU backend's bits for every element-wise step whatever the trainer's flags:
   -fmad=true and --use_fast_math (fused multiply-adds, approximate / and sqrt, flushed
   subnormals) change nothing here. `make test` builds this file with --use_fast_math
   -fmad=true and checks its PTX for fused, approximate or flushing arithmetic
   (tests/run_fast_math.sh). The -fmad=false above is belt and braces.

   In the trainer:

       muon_compute gpu;
       muon_cuda_desc cd = muon_cuda_default_desc();
       cd.stream = my_stream;                      // optional: the trainer's cudaStream_t
       if (muon_cuda_create(&gpu, &cd) != MUON_OK) { puts(muon_error(NULL)); ... }
       muon_desc desc = muon_default_desc();
       desc.compute = &gpu;                        // param, grad, mirror, momentum: device memory
       ... muon_create(&opt, &desc) ... muon_step(opt) ...
       muon_destroy(opt);
       muon_compute_destroy(&gpu);

   SEMANTICS
       - Every slot queues its work on ONE stream (the trainer's, or one of our own) and returns;
         the host waits only in the `sync` slot (and in create, destroy, alloc and free, which
         call cudaMalloc / cudaFree). Nothing is allocated after creation except by alloc.
       - Newton-Schulz runs on cuBLAS (cublasGemmEx per operand of a batch of same-shaped
         operands, cublasSnrm2 for the norms): fp32 mode is fp32 with TF32 off; bf16 mode has
         bf16 operands and products with fp32 accumulation, rounded where torch.optim.Muon
         rounds. With hp.symmetric and m > (MUON_CUDA_SYM_MIN_TILES[_BF16]-1) * MUON_CUDA_SYM_TILE
         rows, X X^T and A A^T compute only their lower tiles (cublasGemmBatchedEx) and mirror.
         Same inputs give the same bits run to run on one GPU (cuBLAS's guarantee for one
         stream, one toolkit, one GPU model); GPU and CPU agree within fp32 rounding (fp32) or
         bf16 noise (bf16), not bitwise.
       - Batch independence (muon.h: one operand's result must not depend on the batch): cuBLAS
         picks its kernel (split-K included) from the batch count and the operands' alignment as
         well as the shape; on an H200 a strided batch of 3 summed differently from 3 single
         GEMMs. So each operand gets its own cublasGemmEx (the symmetric tiles: one
         cublasGemmBatchedEx of that operand's tiles), every pointer 16-byte aligned (operands
         that are not go one at a time through an aligned copy). tests/test_cuda_slots.c checks
         it; run it on each GPU model (`make test-gpu`).
       - NorMuon (the normuon slot) is three kernels, each sum a thread's own
         loop in muon.h's order (sums in double): the CPU backend's bits, and the same bits run to
         run and batch to batch. Between kernels it keeps one double of its own device memory
         (allocated at create), so the slot needs no workspace and never allocates.
       - The calling thread's current device must be desc.device whenever muon calls the backend
         (muon_cuda_create makes it current for the creating thread).
       - A shared cuBLAS handle (desc.cublas) gets its stream, pointer mode, math mode and (with
         workspace_limit) workspace set on every use; nothing is restored.
       - One thread at a time per backend, as for the optimizer that uses it.

   ERRORS
       A failing CUDA or cuBLAS call makes the slot return MUON_ERR_BACKEND and records the FIRST
       failure since the last sync, e.g.
           "cublasGemmEx at muon_cuda.h:612: CUBLAS_STATUS_INVALID_VALUE (...)"
       readable with the vtable's `error` slot (gpu.vt->error(gpu.ctx)). Errors of queued work
       surface at `sync`, which returns the first failure since the previous sync. alloc and
       alloc_host return NULL on failure and record the text. If muon_cuda_create fails, it frees
       whatever it had made, clears *out and leaves the reason (the same text, naming the call
       that failed) in muon_error(NULL), as muon_create does. Nothing is printed; nothing exits.

   CONFIGURATION MACROS (define before the implementation include)
       MUON_CUDA_SYM_TILE       rows of a tile of the symmetric products (default 256)
       MUON_CUDA_SYM_MIN_TILES  tiles per side below which X X^T and A A^T are one plain GEMM
                                each in fp32 (default 16, i.e. from 4096 rows)
       MUON_CUDA_SYM_MIN_TILES_BF16  the same in bf16 (default 32, from 8192 rows)
                                On an H200 the tiles lost below those sizes (bench/README.md).

   STAND-IN (tests without a GPU)
       Defining MUON_CUDA_STANDIN with MUON_CUDA_IMPLEMENTATION compiles this implementation
       with a host C99 or C++ compiler against the toolkit's headers (-isystem .../cuda/include)
       and links it with tests/standin/cuda_standin.c, which implements the few cudart and
       cuBLAS functions used here and runs each kernel launch as a serial loop over the grid.
       That is why the kernels are written through the MUON_CUDA__KERNEL / MUON_CUDA__LAUNCH /
       MUON_CUDA__INDEX macros, are element-wise (no shared memory, no __syncthreads) and take
       one struct by value.

   LICENSE: see the end of this file.
*/
#ifndef MUON_CUDA_H
#define MUON_CUDA_H

#include "muon.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct muon_cuda_desc {
  int device;                /* CUDA device ordinal, default 0 (cudaSetDevice at create)      */
  void *stream;              /* cudaStream_t of the trainer; NULL: muon_cuda creates its own
                                (non-blocking) stream                                         */
  void *cublas;              /* cublasHandle_t of the trainer; NULL: its own. muon sets its
                                stream, pointer mode and math mode on every use and restores
                                nothing, so prefer NULL unless you must share                 */
  size_t workspace_limit;    /* bytes of cuBLAS workspace, 0 = cuBLAS's default. Non-zero:
                                allocated at create and set on the handle on every use        */
} muon_cuda_desc;

/* device 0, everything else NULL / 0. */
MUON_API muon_cuda_desc muon_cuda_default_desc(void);

/* Creates the backend in *out (desc NULL: the defaults). Destroy it with muon_compute_destroy,
   after every optimizer that uses it. On failure *out is cleared (nothing is left to destroy)
   and muon_error(NULL) gives the reason on this thread: MUON_ERR_ARG (out NULL, a negative
   device), MUON_ERR_NOMEM (no host memory for the context), MUON_ERR_BACKEND (a CUDA or cuBLAS
   call failed: "MUON_ERR_BACKEND: muon_cuda_create: cudaSetDevice at muon_cuda.h:...: ..."). */
MUON_API muon_status muon_cuda_create(muon_compute *out, const muon_cuda_desc *desc);

/* The cudaStream_t every slot queues its work on (desc.stream, or the backend's own), for
   ordering other work against it, e.g. muon_nccl_desc.compute_stream. NULL if c is not a live
   muon_cuda backend (or it runs on the legacy default stream). */
MUON_API void *muon_cuda_stream(const muon_compute *c);

#ifdef __cplusplus
}
#endif
#endif /* MUON_CUDA_H */

/* =============================================================================================
   IMPLEMENTATION
   ============================================================================================= */
#ifdef MUON_CUDA_IMPLEMENTATION
#ifndef MUON_CUDA__IMPLEMENTED
#define MUON_CUDA__IMPLEMENTED

#if !defined(__CUDACC__) && !defined(MUON_CUDA_STANDIN)
#error "MUON_CUDA_IMPLEMENTATION must be compiled by nvcc (or with MUON_CUDA_STANDIN, for the tests)"
#endif

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* muon.h's ELEMENT-WISE FORMULAS block, compiled here for host and device (it is guarded, so
   this is a no-op where this translation unit already has muon.h's implementation). */
#define MUON_ELEMENTWISE
#include "muon.h"

/* ---------------------------------------------------------------------------------------------
   Kernel macros: one kernel source, two compilers.
   nvcc: a __global__ function taking its argument struct by value (__grid_constant__: it is read
   in place, never copied to local memory, even where a kernel takes its address).
   Stand-in: a host function; tests/standin/cuda_standin.c queues each launch (with a copy of
   the argument struct) and runs it as a serial loop over blocks and threads when the stream is
   synchronised, setting the muon_standin_* coordinates for every thread. */
#ifdef MUON_CUDA_STANDIN
#ifdef __cplusplus
extern "C" {
#endif
/* As tests/standin/standin.h declares them (spelled without its muon_standin_kernel typedef,
   which C99 forbids repeating, so the two can be included in either order). */
cudaError_t muon_standin_launch(cudaStream_t stream, dim3 grid, dim3 block, void (*fn)(const void *args),
                                const void *args, size_t args_size);
extern dim3 muon_standin_threadIdx, muon_standin_blockIdx, muon_standin_blockDim, muon_standin_gridDim;
#ifdef __cplusplus
}
#endif
#define MUON_CUDA__KERNEL(name, T)                                                  \
  static void name##_body(const T a);                                               \
  static void name(const void *p) { name##_body(*(const T *)p); }                   \
  static void name##_body(const T a)
#define MUON_CUDA__LAUNCH(name, grid, block, stream, args) \
  muon_standin_launch(stream, grid, block, name, &(args), sizeof(args))
#define MUON_CUDA__INDEX  ((size_t)muon_standin_blockIdx.x * muon_standin_blockDim.x + muon_standin_threadIdx.x)
#define MUON_CUDA__STRIDE ((size_t)muon_standin_gridDim.x * muon_standin_blockDim.x)
#define MUON_CUDA__DEVICE static /* a helper called only by kernels */
#else
#define MUON_CUDA__KERNEL(name, T) static __global__ void name(const __grid_constant__ T a)
#define MUON_CUDA__LAUNCH(name, grid, block, stream, args) \
  (name<<<grid, block, 0, stream>>>(args), cudaGetLastError())
#define MUON_CUDA__INDEX  ((size_t)blockIdx.x * blockDim.x + threadIdx.x)
#define MUON_CUDA__STRIDE ((size_t)gridDim.x * blockDim.x)
#define MUON_CUDA__DEVICE static __device__
#endif

#define MUON_CUDA__BLOCK 256
#define MUON_CUDA__MAX_BLOCKS 4096 /* grid-stride loops cover the rest */

static dim3 muon_cuda__dim3(unsigned x) {
  dim3 d;
  d.x = x;
  d.y = 1;
  d.z = 1;
  return d;
}

/* Blocks for n elements (n > 0). */
static dim3 muon_cuda__grid(size_t n) {
  size_t blocks = (n + MUON_CUDA__BLOCK - 1) / MUON_CUDA__BLOCK;
  return muon_cuda__dim3((unsigned)(blocks < MUON_CUDA__MAX_BLOCKS ? blocks : MUON_CUDA__MAX_BLOCKS));
}

/* ---------------------------------------------------------------------------------------------
   Context and errors */
typedef struct muon_cuda__ctx {
  int device;
  cudaStream_t stream;
  int own_stream;
  cublasHandle_t blas;
  int own_blas;
  void *blas_ws;             /* desc.workspace_limit bytes, or NULL */
  size_t blas_ws_bytes;
  double *normuon_scale;     /* 1 double of device memory (allocated at create, so that no slot
                                allocates): NorMuon's |O| / |O'|, from its second kernel to its
                                third */
  int failed;                /* a failure was recorded since the last sync */
  char err[512];
} muon_cuda__ctx;

static const char *muon_cuda__basename(const char *path) {
  const char *s = strrchr(path, '/'), *w = strrchr(path, '\\');
  if (w && (!s || w > s)) s = w;
  return s ? s + 1 : path;
}

/* The text of a failure of `call` (its source text: only the function name is kept), written
   unless a failure is already pending (the first one since the last sync is the one kept).
   cudaSuccess and CUBLAS_STATUS_SUCCESS are both 0; which library's text to use is told by the
   name. */
static void muon_cuda__describe(muon_cuda__ctx *c, int code, const char *call, const char *file, int line) {
  const char *name, *text;
  int len = 0;
  if (c->failed) return;
  while (call[len] && call[len] != '(' && call[len] != ' ') len++;
  if (strncmp(call, "cublas", 6) == 0) {
    name = cublasGetStatusName((cublasStatus_t)code);
    text = cublasGetStatusString((cublasStatus_t)code);
  } else {
    name = cudaGetErrorName((cudaError_t)code);
    text = cudaGetErrorString((cudaError_t)code);
  }
  snprintf(c->err, sizeof c->err, "%.*s at %s:%d: %s (%s)", len, call, muon_cuda__basename(file), line,
           name ? name : "?", text ? text : "?");
}

/* Records a failure for `sync` to report and returns MUON_ERR_BACKEND. */
static muon_status muon_cuda__fail(muon_cuda__ctx *c, int code, const char *call, const char *file, int line) {
  muon_cuda__describe(c, code, call, file, line);
  c->failed = 1;
  return MUON_ERR_BACKEND;
}

static muon_status muon_cuda__check(muon_cuda__ctx *c, int code, const char *call, const char *file, int line) {
  return code == 0 ? MUON_OK : muon_cuda__fail(c, code, call, file, line);
}

/* THE error macro: checks a cudaError_t or cublasStatus_t, records the first failure and makes
   the enclosing function return MUON_ERR_BACKEND. */
#define MUON_CUDA__CHECK(c, call)                                                        \
  do {                                                                                   \
    if (muon_cuda__check((c), (int)(call), #call, __FILE__, __LINE__) != MUON_OK)        \
      return MUON_ERR_BACKEND;                                                           \
  } while (0)

/* A slot's own argument check (the core checks first; this is the backstop). Nothing was
   queued, so it is not a failure for `sync` to report; the text is kept unless a pending
   failure's text is already there. */
static muon_status muon_cuda__invalid(muon_cuda__ctx *c, const char *what) {
  if (!c->failed) snprintf(c->err, sizeof c->err, "muon_cuda: %s", what);
  return MUON_ERR_ARG;
}

/* ---------------------------------------------------------------------------------------------
   Kernels, each beside its launcher (stream last). Per-element formulas: muon.h's MUON__HD
   functions. Every kernel is a grid-stride loop over its elements. */

/* nonfinite: *flag = 1 if x[i] is NaN or Inf (flag zeroed by the slot first). Every writer stores
   the same value, so the races are benign and the verdict does not depend on the launch. */
typedef struct muon_cuda__nonfinite_k {
  const void *x;
  int bf16;
  size_t n;
  int *flag;
} muon_cuda__nonfinite_k;

MUON_CUDA__KERNEL(muon_cuda__nonfinite_kernel, muon_cuda__nonfinite_k) {
  size_t i;
  for (i = MUON_CUDA__INDEX; i < a.n; i += MUON_CUDA__STRIDE)
    if (!muon__finite(muon__load(a.x, a.bf16, i))) *a.flag = 1;
}

static cudaError_t muon_cuda__nonfinite_launch(const muon_cuda__nonfinite_k *k, cudaStream_t stream) {
  if (k->n == 0) return cudaSuccess;
  return MUON_CUDA__LAUNCH(muon_cuda__nonfinite_kernel, muon_cuda__grid(k->n), muon_cuda__dim3(MUON_CUDA__BLOCK),
                           stream, *k);
}

/* cast: dst[i] = src[i] converted (to bf16: nearest even), fp32 <-> bf16. */
typedef struct muon_cuda__cast_k {
  void *dst;
  const void *src;
  int dst_bf16, src_bf16;
  size_t n;
} muon_cuda__cast_k;

MUON_CUDA__KERNEL(muon_cuda__cast_kernel, muon_cuda__cast_k) {
  size_t i;
  for (i = MUON_CUDA__INDEX; i < a.n; i += MUON_CUDA__STRIDE)
    muon__store(a.dst, a.dst_bf16, i, muon__load(a.src, a.src_bf16, i), 0, 0);
}

static cudaError_t muon_cuda__cast_launch(const muon_cuda__cast_k *k, cudaStream_t stream) {
  if (k->n == 0) return cudaSuccess;
  return MUON_CUDA__LAUNCH(muon_cuda__cast_kernel, muon_cuda__grid(k->n), muon_cuda__dim3(MUON_CUDA__BLOCK), stream,
                           *k);
}

/* Gram NS: B[i][i] += a on `batch` fp32 m x m matrices. */
typedef struct muon_cuda__add_diag_k {
  float *B;
  float a;
  int m;
  size_t n;                  /* batch * m */
} muon_cuda__add_diag_k;

MUON_CUDA__KERNEL(muon_cuda__add_diag_kernel, muon_cuda__add_diag_k) {
  size_t i;
  for (i = MUON_CUDA__INDEX; i < a.n; i += MUON_CUDA__STRIDE) {
    size_t b = i / (size_t)a.m, r = i % (size_t)a.m;
    size_t at = b * (size_t)a.m * a.m + r * (size_t)a.m + r;
    a.B[at] = muon__add(a.B[at], a.a);
  }
}

static cudaError_t muon_cuda__add_diag_launch(const muon_cuda__add_diag_k *k, cudaStream_t stream) {
  if (k->n == 0) return cudaSuccess;
  return MUON_CUDA__LAUNCH(muon_cuda__add_diag_kernel, muon_cuda__grid(k->n), muon_cuda__dim3(MUON_CUDA__BLOCK), stream,
                           *k);
}

/* pack: up to MUON_CUDA__PACK_OPS piece copies per launch, passed by value (no device table, no
   upload). Flat element t of the launch belongs to the first op j with t < end[j] (end: the
   cumulative element counts); its element k = t - end[j-1] moves between pieces[op.piece + k]
   and operands[op.operand + muon__piece_operand_index(op, k)]. */
#define MUON_CUDA__PACK_OPS 16
typedef struct muon_cuda__pack_k {
  muon_piece_copy op[MUON_CUDA__PACK_OPS];
  long long end[MUON_CUDA__PACK_OPS];
  int n;                     /* ops used, 1..MUON_CUDA__PACK_OPS, none empty */
  int to_operand;
  float *pieces, *operands;
} muon_cuda__pack_k;

MUON_CUDA__KERNEL(muon_cuda__pack_kernel, muon_cuda__pack_k) {
  long long t, total = a.end[a.n - 1];
  for (t = (long long)MUON_CUDA__INDEX; t < total; t += (long long)MUON_CUDA__STRIDE) {
    int j = 0;
    long long k;
    const muon_piece_copy *op;
    while (t >= a.end[j]) j++;
    op = &a.op[j];
    k = t - (j ? a.end[j - 1] : 0);
    if (a.to_operand)
      a.operands[op->operand + (size_t)muon__piece_operand_index(op, k)] = a.pieces[op->piece + (size_t)k];
    else
      a.pieces[op->piece + (size_t)k] = a.operands[op->operand + (size_t)muon__piece_operand_index(op, k)];
  }
}

static cudaError_t muon_cuda__pack_launch(const muon_cuda__pack_k *k, cudaStream_t stream) {
  size_t total = (size_t)k->end[k->n - 1];
  return MUON_CUDA__LAUNCH(muon_cuda__pack_kernel, muon_cuda__grid(total), muon_cuda__dim3(MUON_CUDA__BLOCK), stream,
                           *k);
}

/* momentum: U[i] (and B'[i] when update) from momentum[i] and grad[i]. */
typedef struct muon_cuda__momentum_k {
  size_t n;
  float *momentum;
  const void *grad;
  float *u;                  /* NULL: not wanted */
  int update;
  muon_momentum_args args;
} muon_cuda__momentum_k;

MUON_CUDA__KERNEL(muon_cuda__momentum_kernel, muon_cuda__momentum_k) {
  size_t i;
  for (i = MUON_CUDA__INDEX; i < a.n; i += MUON_CUDA__STRIDE) {
    float u = muon__momentum_at(a.momentum, i, a.grad, &a.args, a.update);
    if (a.u) a.u[i] = u;
  }
}

static cudaError_t muon_cuda__momentum_launch(const muon_cuda__momentum_k *k, cudaStream_t stream) {
  if (k->n == 0) return cudaSuccess;
  return MUON_CUDA__LAUNCH(muon_cuda__momentum_kernel, muon_cuda__grid(k->n), muon_cuda__dim3(MUON_CUDA__BLOCK), stream,
                           *k);
}

/* apply: param[i] = param[i]*decay - step*O[i], stored as param_dtype (+ bf16 mirror). */
typedef struct muon_cuda__apply_k {
  size_t n;
  void *param;
  const float *O;
  muon_apply_args args;
} muon_cuda__apply_k;

MUON_CUDA__KERNEL(muon_cuda__apply_kernel, muon_cuda__apply_k) {
  size_t i;
  for (i = MUON_CUDA__INDEX; i < a.n; i += MUON_CUDA__STRIDE) muon__apply_store(a.param, i, a.O, &a.args);
}

static cudaError_t muon_cuda__apply_launch(const muon_cuda__apply_k *k, cudaStream_t stream) {
  if (k->n == 0) return cudaSuccess;
  return MUON_CUDA__LAUNCH(muon_cuda__apply_kernel, muon_cuda__grid(k->n), muon_cuda__dim3(MUON_CUDA__BLOCK), stream,
                           *k);
}

/* scale: param[i] = param[i]*factor, stored as param_dtype (+ bf16 mirror): muon_qk_clip's rows. */
typedef struct muon_cuda__scale_k {
  size_t n;
  void *param;
  float factor;
  muon_apply_args args;
} muon_cuda__scale_k;

MUON_CUDA__KERNEL(muon_cuda__scale_kernel, muon_cuda__scale_k) {
  size_t i;
  for (i = MUON_CUDA__INDEX; i < a.n; i += MUON_CUDA__STRIDE) muon__scale_store(a.param, i, a.factor, &a.args);
}

static cudaError_t muon_cuda__scale_launch(const muon_cuda__scale_k *k, cudaStream_t stream) {
  if (k->n == 0) return cudaSuccess;
  return MUON_CUDA__LAUNCH(muon_cuda__scale_kernel, muon_cuda__grid(k->n), muon_cuda__dim3(MUON_CUDA__BLOCK), stream,
                           *k);
}

/* blockwise: MUON_MOMENTUM_INT8's blocks, one thread per block of 256 walking it in muon.h's
   order (its absmax, then each value): the kernels are element-wise (see the top), and a max is
   the same in any order anyway. */
typedef struct muon_cuda__blockwise_k {
  size_t n, blocks;
  float *values;
  unsigned char *q;
  int to_int8;
} muon_cuda__blockwise_k;

MUON_CUDA__KERNEL(muon_cuda__blockwise_kernel, muon_cuda__blockwise_k) {
  size_t b;
  for (b = MUON_CUDA__INDEX; b < a.blocks; b += MUON_CUDA__STRIDE) {
    size_t lo = b * MUON_Q8_BLOCK, c = a.n - lo < (size_t)MUON_Q8_BLOCK ? a.n - lo : (size_t)MUON_Q8_BLOCK;
    unsigned char *blk = a.q + b * (1 + MUON_Q8_BLOCK);
    if (a.to_int8) muon__q8_encode(a.values + lo, c, blk);
    else muon__q8_decode(blk, c, a.values + lo);
  }
}

static cudaError_t muon_cuda__blockwise_launch(const muon_cuda__blockwise_k *k, cudaStream_t stream) {
  if (k->blocks == 0) return cudaSuccess;
  return MUON_CUDA__LAUNCH(muon_cuda__blockwise_kernel, muon_cuda__grid(k->blocks), muon_cuda__dim3(MUON_CUDA__BLOCK),
                           stream, *k);
}

/* adamw: one torch.optim.AdamW element per i (param, m, v updated; + bf16 mirror). */
typedef struct muon_cuda__adamw_k {
  size_t n;
  void *param;
  const void *grad;
  float *m, *v;
  muon_adamw_args args;
} muon_cuda__adamw_k;

MUON_CUDA__KERNEL(muon_cuda__adamw_kernel, muon_cuda__adamw_k) {
  size_t i;
  for (i = MUON_CUDA__INDEX; i < a.n; i += MUON_CUDA__STRIDE)
    muon__adamw_store(a.param, i, a.grad, a.m, a.v, &a.args);
}

static cudaError_t muon_cuda__adamw_launch(const muon_cuda__adamw_k *k, cudaStream_t stream) {
  if (k->n == 0) return cudaSuccess;
  return MUON_CUDA__LAUNCH(muon_cuda__adamw_kernel, muon_cuda__grid(k->n), muon_cuda__dim3(MUON_CUDA__BLOCK), stream,
                           *k);
}

/* NS normalisation, fp32: X[i] /= max(norms[i / mn], eps), over `batch` operands of mn floats.
   (The CPU: d = norm > eps ? norm : eps; x / d.) */
typedef struct muon_cuda__ns_scale_k {
  float *X;
  const float *norms;
  size_t mn, total;
  float eps;
} muon_cuda__ns_scale_k;

MUON_CUDA__KERNEL(muon_cuda__ns_scale_kernel, muon_cuda__ns_scale_k) {
  size_t i;
  for (i = MUON_CUDA__INDEX; i < a.total; i += MUON_CUDA__STRIDE) {
    float norm = a.norms[i / a.mn], d = norm > a.eps ? norm : a.eps;
    a.X[i] = muon__div(a.X[i], d);
  }
}

static cudaError_t muon_cuda__ns_scale_launch(const muon_cuda__ns_scale_k *k, cudaStream_t stream) {
  if (k->total == 0) return cudaSuccess;
  return MUON_CUDA__LAUNCH(muon_cuda__ns_scale_kernel, muon_cuda__grid(k->total), muon_cuda__dim3(MUON_CUDA__BLOCK),
                           stream, *k);
}

/* NS, bf16: X[i] = bf16(X[i]) in place (the norm is then taken over the rounded values). */
typedef struct muon_cuda__bf16_round_k {
  float *X;
  size_t n;
} muon_cuda__bf16_round_k;

MUON_CUDA__KERNEL(muon_cuda__bf16_round_kernel, muon_cuda__bf16_round_k) {
  size_t i;
  for (i = MUON_CUDA__INDEX; i < a.n; i += MUON_CUDA__STRIDE) a.X[i] = muon__bf16(a.X[i]);
}

static cudaError_t muon_cuda__bf16_round_launch(const muon_cuda__bf16_round_k *k, cudaStream_t stream) {
  if (k->n == 0) return cudaSuccess;
  return MUON_CUDA__LAUNCH(muon_cuda__bf16_round_kernel, muon_cuda__grid(k->n), muon_cuda__dim3(MUON_CUDA__BLOCK),
                           stream, *k);
}

/* NS normalisation, bf16: norm rounded to bf16, d = bf16(max(norm, eps)), Xb[i] = bf16(X[i]/d)
   as bf16 storage for the GEMMs. */
typedef struct muon_cuda__ns_scale_bf16_k {
  const float *X;
  uint16_t *Xb;
  const float *norms;
  size_t mn, total;
  float eps;
} muon_cuda__ns_scale_bf16_k;

MUON_CUDA__KERNEL(muon_cuda__ns_scale_bf16_kernel, muon_cuda__ns_scale_bf16_k) {
  size_t i;
  for (i = MUON_CUDA__INDEX; i < a.total; i += MUON_CUDA__STRIDE) {
    float norm = muon__bf16(a.norms[i / a.mn]), d = muon__bf16(norm > a.eps ? norm : a.eps);
    a.Xb[i] = muon__bf16_bits(muon__bf16(muon__div(a.X[i], d)));
  }
}

static cudaError_t muon_cuda__ns_scale_bf16_launch(const muon_cuda__ns_scale_bf16_k *k, cudaStream_t stream) {
  if (k->total == 0) return cudaSuccess;
  return MUON_CUDA__LAUNCH(muon_cuda__ns_scale_bf16_kernel, muon_cuda__grid(k->total),
                           muon_cuda__dim3(MUON_CUDA__BLOCK), stream, *k);
}

/* ---------------------------------------------------------------------------------------------
   Memory slots */
static void *muon_cuda__alloc(void *ctx, size_t bytes) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  void *p = NULL;
  cudaError_t e;
  if (bytes == 0) return NULL;
  e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    /* reported by the NULL, not a failure of queued work: text only */
    muon_cuda__describe(c, (int)e, "cudaMalloc", __FILE__, __LINE__);
    (void)cudaGetLastError(); /* cudaMalloc's failure is also the thread's last error: clear it */
    return NULL;
  }
  return p;
}

static void muon_cuda__free(void *ctx, void *ptr) {
  (void)ctx;
  if (ptr) (void)cudaFree(ptr);
}

static void *muon_cuda__alloc_host(void *ctx, size_t bytes) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  void *p = NULL;
  cudaError_t e;
  if (bytes == 0) return NULL;
  e = cudaMallocHost(&p, bytes);
  if (e != cudaSuccess) {
    muon_cuda__describe(c, (int)e, "cudaMallocHost", __FILE__, __LINE__);
    (void)cudaGetLastError();
    return NULL;
  }
  return p;
}

static void muon_cuda__free_host(void *ctx, void *ptr) {
  (void)ctx;
  if (ptr) (void)cudaFreeHost(ptr);
}

static muon_status muon_cuda__copy(void *ctx, void *dst, const void *src, size_t bytes, int to_host, int from_host) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  enum cudaMemcpyKind kind = to_host ? (from_host ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
                                     : (from_host ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
  if (bytes == 0) return MUON_OK;
  MUON_CUDA__CHECK(c, cudaMemcpyAsync(dst, src, bytes, kind, c->stream));
  return MUON_OK;
}

static muon_status muon_cuda__zero(void *ctx, void *dst, size_t bytes) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  if (bytes == 0) return MUON_OK;
  MUON_CUDA__CHECK(c, cudaMemsetAsync(dst, 0, bytes, c->stream));
  return MUON_OK;
}

/* The ops are host memory: they travel in the launches' argument structs, 16 at a time. */
static muon_status muon_cuda__pack(void *ctx, const muon_piece_copy *ops, int n, float *pieces, float *operands,
                                   int to_operand) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  muon_cuda__pack_k k;
  int i = 0;
  if (n < 0 || (n > 0 && !ops)) return muon_cuda__invalid(c, "pack: bad op list");
  while (i < n) {
    long long total = 0;
    memset(&k, 0, sizeof k);
    k.to_operand = to_operand;
    k.pieces = pieces;
    k.operands = operands;
    for (; i < n && k.n < MUON_CUDA__PACK_OPS; i++) {
      long long len = ops[i].f1 - ops[i].f0;
      if (len <= 0) continue;
      k.op[k.n] = ops[i];
      total += len;
      k.end[k.n++] = total;
    }
    if (k.n) MUON_CUDA__CHECK(c, muon_cuda__pack_launch(&k, c->stream));
  }
  return MUON_OK;
}

/* ---------------------------------------------------------------------------------------------
   Element-wise step slots */
static muon_status muon_cuda__momentum(void *ctx, size_t n, float *momentum, const void *grad,
                                       const muon_momentum_args *a, int update, float *u) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  muon_cuda__momentum_k k;
  if (!a) return muon_cuda__invalid(c, "momentum: args NULL");
  memset(&k, 0, sizeof k);
  k.n = n;
  k.momentum = momentum;
  k.grad = grad;
  k.u = u;
  k.update = update;
  k.args = *a;
  MUON_CUDA__CHECK(c, muon_cuda__momentum_launch(&k, c->stream));
  return MUON_OK;
}

static muon_status muon_cuda__apply(void *ctx, size_t n, void *param, const float *O, const muon_apply_args *a) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  muon_cuda__apply_k k;
  if (!a) return muon_cuda__invalid(c, "apply: args NULL");
  memset(&k, 0, sizeof k);
  k.n = n;
  k.param = param;
  k.O = O;
  k.args = *a;
  MUON_CUDA__CHECK(c, muon_cuda__apply_launch(&k, c->stream));
  return MUON_OK;
}

static muon_status muon_cuda__scale(void *ctx, size_t n, void *param, float factor, const muon_apply_args *a) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  muon_cuda__scale_k k;
  if (!a) return muon_cuda__invalid(c, "scale: args NULL");
  memset(&k, 0, sizeof k);
  k.n = n;
  k.param = param;
  k.factor = factor;
  k.args = *a;
  MUON_CUDA__CHECK(c, muon_cuda__scale_launch(&k, c->stream));
  return MUON_OK;
}

static muon_status muon_cuda__blockwise(void *ctx, int to_int8, size_t n, float *values, void *blocks) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  muon_cuda__blockwise_k k;
  memset(&k, 0, sizeof k);
  k.n = n;
  k.blocks = (n + MUON_Q8_BLOCK - 1) / MUON_Q8_BLOCK;
  k.values = values;
  k.q = (unsigned char *)blocks;
  k.to_int8 = to_int8;
  MUON_CUDA__CHECK(c, muon_cuda__blockwise_launch(&k, c->stream));
  return MUON_OK;
}

static muon_status muon_cuda__adamw(void *ctx, size_t n, void *param, const void *grad, float *m, float *v,
                                    const muon_adamw_args *a) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  muon_cuda__adamw_k k;
  if (!a) return muon_cuda__invalid(c, "adamw: args NULL");
  memset(&k, 0, sizeof k);
  k.n = n;
  k.param = param;
  k.grad = grad;
  k.m = m;
  k.v = v;
  k.args = *a;
  MUON_CUDA__CHECK(c, muon_cuda__adamw_launch(&k, c->stream));
  return MUON_OK;
}

static muon_status muon_cuda__nonfinite(void *ctx, const void *x, muon_dtype dtype, size_t n, int *flag) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  muon_cuda__nonfinite_k k;
  MUON_CUDA__CHECK(c, cudaMemsetAsync(flag, 0, sizeof(int), c->stream));
  memset(&k, 0, sizeof k);
  k.x = x;
  k.bf16 = dtype == MUON_DTYPE_BF16;
  k.n = n;
  k.flag = flag;
  MUON_CUDA__CHECK(c, muon_cuda__nonfinite_launch(&k, c->stream));
  return MUON_OK;
}

/* Same dtype: a byte copy (keeps every bit, NaN payloads included). */
static muon_status muon_cuda__cast(void *ctx, void *dst, muon_dtype dst_dtype, const void *src, muon_dtype src_dtype,
                                   size_t n) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  muon_cuda__cast_k k;
  if (n == 0) return MUON_OK;
  if (dst_dtype == src_dtype) {
    if (dst != src)
      MUON_CUDA__CHECK(c, cudaMemcpyAsync(dst, src, n * (dst_dtype == MUON_DTYPE_BF16 ? 2 : 4),
                                          cudaMemcpyDeviceToDevice, c->stream));
    return MUON_OK;
  }
  memset(&k, 0, sizeof k);
  k.dst = dst;
  k.src = src;
  k.dst_bf16 = dst_dtype == MUON_DTYPE_BF16;
  k.src_bf16 = src_dtype == MUON_DTYPE_BF16;
  k.n = n;
  MUON_CUDA__CHECK(c, muon_cuda__cast_launch(&k, c->stream));
  return MUON_OK;
}

/* ---------------------------------------------------------------------------------------------
   Newton-Schulz on cuBLAS, the operation sequence of muon.h's muon__newton_schulz:
     X = X / max(|X|_F, eps)
     for k: A = X X^T;  B = copy of A;  B = c_k A A^T + b_k B;  Y = copy of X;  Y = B X + a_k Y;
            X <-> Y
   (A is symmetric, so A A^T = A A, which is what torch writes; the CPU uses the same Gram form.)
   fp32: everything fp32, TF32 off. bf16 (torch.optim.Muon's rounding points): X rounded to bf16,
   its norm taken over the rounded values and rounded, d = bf16(max(norm, eps)), X = bf16(X / d);
   then bf16 GEMM inputs and outputs with fp32 accumulation (CUBLAS_COMPUTE_32F; alpha/beta
   applied in fp32 before the one rounding of C, exactly addmm's). The bf16 operands live in the
   workspace; X gets the result back as fp32 (exactly bf16 values).
   Symmetric products (hp->symmetric, and m spans at least MUON_CUDA_SYM_MIN_TILES tiles of
   MUON_CUDA_SYM_TILE rows, MUON_CUDA_SYM_MIN_TILES_BF16 in bf16): X X^T and A A^T compute only the tiles on and below the diagonal
   (every element is still one full-length dot product, as in the plain GEMM), then a kernel
   mirrors the lower triangle into the upper one. The tiles run as up to three
   cublasGemmBatchedEx calls (interior tiles, the short bottom row, the corner), over pointer
   arrays that a kernel writes into the workspace at the start of each call.
   Workspace, each region 256-byte aligned, for `batch` operands:
     fp32: Y (batch m*n floats), A, B (batch m*m floats each), norms (batch floats)
     bf16: Xb, Yb (batch m*n bf16 each), Ab, Bb (batch m*m bf16 each), norms (batch floats)
     symmetric: + 3 sets (X X^T from either X buffer, A A^T) x 3 (A, B, C) x batch x tiles
                pointers, tiles = t(t+1)/2 for t = ceil(m / MUON_CUDA_SYM_TILE)
   or, where it is larger, one operand's regions and an aligned copy of it (m*n floats). */
#ifndef MUON_CUDA_SYM_TILE
#define MUON_CUDA_SYM_TILE 256       /* rows (and columns) of a tile of the symmetric products */
#endif
/* Fewer tiles per side: one plain GEMM is faster. Measured on an H200 (bench_gpu, sym=1 vs 0):
   fp32 0.33x at 1024 rows, 0.92x at 1600, 1.10x at 4096, 1.35x at 8192; bf16 0.48x, 0.49x,
   0.74x, 1.09x. */
#ifndef MUON_CUDA_SYM_MIN_TILES
#define MUON_CUDA_SYM_MIN_TILES 16
#endif
#ifndef MUON_CUDA_SYM_MIN_TILES_BF16
#define MUON_CUDA_SYM_MIN_TILES_BF16 32
#endif

typedef struct muon_cuda__ns_layout {
  size_t x, y, a, b, norms, ptrs, bytes; /* byte offsets in the workspace, and its size */
  size_t q, t2, s, bf;       /* Gram NS: Q, two scratch m x m, and B in fp32 (bf16 mode) */
  int gram;                  /* Gram Newton-Schulz (hp->ns_algorithm, n >= 2m) */
  int sym;                   /* symmetric path */
  int t, r;                  /* tiles per side; rows of the last tile row (<= tile) */
  size_t cnt[3];             /* tiles per operand: interior, bottom row, corner */
  size_t tiles;              /* their sum, t(t+1)/2 */
} muon_cuda__ns_layout;

static size_t muon_cuda__align(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

static muon_cuda__ns_layout muon_cuda__ns_plan(int batch, int m, int n, int bf16, int symmetric, int gram) {
  muon_cuda__ns_layout L;
  size_t mn = (size_t)batch * m * n, mm = (size_t)batch * m * m, e = bf16 ? 2 : 4, off = 0;
  memset(&L, 0, sizeof L);
  L.t = (m + MUON_CUDA_SYM_TILE - 1) / MUON_CUDA_SYM_TILE;
  L.r = m - (L.t - 1) * MUON_CUDA_SYM_TILE;
  L.sym = !gram && symmetric && L.t >= (bf16 ? MUON_CUDA_SYM_MIN_TILES_BF16 : MUON_CUDA_SYM_MIN_TILES) && L.t >= 2;
  L.gram = gram;
  L.cnt[0] = (size_t)(L.t - 1) * L.t / 2;
  L.cnt[1] = (size_t)(L.t - 1);
  L.cnt[2] = 1;
  L.tiles = L.cnt[0] + L.cnt[1] + L.cnt[2];
  L.x = off;
  if (bf16) off += muon_cuda__align(mn * e);
  L.y = off; off += muon_cuda__align(mn * e);
  L.a = off; off += muon_cuda__align(mm * e);
  L.b = off; off += muon_cuda__align(mm * e);
  if (gram) {
    L.q = off; off += muon_cuda__align(mm * e);
    L.t2 = off; off += muon_cuda__align(mm * e);
    L.s = off; off += muon_cuda__align(mm * e);
    if (bf16) { L.bf = off; off += muon_cuda__align(mm * sizeof(float)); }
  }
  L.norms = off; off += muon_cuda__align((size_t)batch * sizeof(float));
  L.ptrs = off;
  if (L.sym) off += muon_cuda__align(9 * (size_t)batch * L.tiles * sizeof(void *));
  L.bytes = off;
  return L;
}

/* As muon.h's CPU backend: the Gram iteration only where it saves flops, n >= 2m. */
static int muon_cuda__use_gram(const muon_hparams *hp, int m, int n) {
  return hp->ns_algorithm == MUON_NS_GRAM && (long long)n >= 2 * (long long)m;
}

static int muon_cuda__ns_shape_ok(int batch, int m, int n) {
  return batch > 0 && m > 0 && n >= m && (size_t)m * n <= (size_t)INT_MAX; /* cublasSnrm2 takes int */
}

/* The batch's own regions, or one operand's and its aligned copy (muon_cuda__newton_schulz),
   whichever is larger: where X lies is known only at the call. */
static size_t muon_cuda__ns_workspace(void *ctx, int batch, int m, int n, const muon_hparams *hp) {
  int bf16, gram;
  size_t all, one;
  (void)ctx;
  if (!hp || !muon_cuda__ns_shape_ok(batch, m, n)) return 0;
  bf16 = hp->precision == MUON_PRECISION_BF16;
  gram = muon_cuda__use_gram(hp, m, n);
  all = muon_cuda__ns_plan(batch, m, n, bf16, hp->symmetric, gram).bytes;
  one = muon_cuda__align(muon_cuda__ns_plan(1, m, n, bf16, hp->symmetric, gram).bytes) +
        muon_cuda__align((size_t)m * n * sizeof(float));
  return all > one ? all : one;
}

/* Symmetric path: the tile pointer arrays. Set s (0: X X^T with X in buffer 0, 1: with X in
   buffer 1, 2: A A^T into B), group g (0: interior tiles i < t-1, j <= i; 1: bottom row
   i = t-1, j < t-1; 2: the corner i = j = t-1), operand b, tile q of the group: its A, B and C
   pointers go to ptrs[P + b*cnt_g + q], ptrs[P + (batch + b)*cnt_g + q] and
   ptrs[P + (2*batch + b)*cnt_g + q], with P = (s*tiles + c_g) * 3*batch, c_g the tiles of the
   groups before g. Tile (i, j) of C = P P^T (rows K long) is rows i*T.. of P times rows j*T..
   of P, into C at (i*T, j*T). One thread per entry. */
typedef struct muon_cuda__sym_ptrs_k {
  void **ptrs;
  char *src[3];              /* P of each set: X buffer 0, X buffer 1, A */
  char *dst[3];              /* C of each set: A, A, B */
  size_t esize;
  int m, n, t, batch;
  size_t cnt[3], tiles;
} muon_cuda__sym_ptrs_k;

MUON_CUDA__KERNEL(muon_cuda__sym_ptrs_kernel, muon_cuda__sym_ptrs_k) {
  size_t e, per_set = (size_t)a.batch * a.tiles, total = 3 * per_set;
  for (e = MUON_CUDA__INDEX; e < total; e += MUON_CUDA__STRIDE) {
    size_t s = e / per_set, rest = e % per_set, before = 0, cnt, b, q, base, K, stride, at;
    int g = 0;
    long long i, j;
    while (rest >= (size_t)a.batch * a.cnt[g]) { rest -= (size_t)a.batch * a.cnt[g]; before += a.cnt[g]; g++; }
    cnt = a.cnt[g];
    b = rest / cnt;          /* rest = b*cnt + q: the entry's index in each of the group's arrays */
    q = rest % cnt;
    if (g == 0) { /* q-th (i, j) with j <= i, row by row */
      i = 0;
      while (q >= (size_t)i + 1) { q -= (size_t)i + 1; i++; }
      j = (long long)q;
    } else if (g == 1) {
      i = a.t - 1; j = (long long)q;
    } else {
      i = a.t - 1; j = a.t - 1;
    }
    K = s < 2 ? (size_t)a.n : (size_t)a.m; /* row length of P */
    stride = (size_t)a.m * K;
    base = (s * a.tiles + before) * 3 * (size_t)a.batch;
    at = base + rest;
    a.ptrs[at] = a.src[s] + (b * stride + (size_t)i * MUON_CUDA_SYM_TILE * K) * a.esize;
    at += (size_t)a.batch * cnt;
    a.ptrs[at] = a.src[s] + (b * stride + (size_t)j * MUON_CUDA_SYM_TILE * K) * a.esize;
    at += (size_t)a.batch * cnt;
    a.ptrs[at] =
        a.dst[s] +
        (b * (size_t)a.m * a.m + (size_t)i * MUON_CUDA_SYM_TILE * a.m + (size_t)j * MUON_CUDA_SYM_TILE) * a.esize;
  }
}

static cudaError_t muon_cuda__sym_ptrs_launch(const muon_cuda__sym_ptrs_k *k, cudaStream_t stream) {
  size_t total = 3 * (size_t)k->batch * k->tiles;
  return MUON_CUDA__LAUNCH(muon_cuda__sym_ptrs_kernel, muon_cuda__grid(total), muon_cuda__dim3(MUON_CUDA__BLOCK),
                           stream, *k);
}

/* Symmetric path: C[row][col] = C[col][row] for col > row, `batch` m x m row-major matrices of
   esize-byte elements (bits copied). */
typedef struct muon_cuda__mirror_k {
  void *C;
  size_t esize;
  int m;
  size_t total;              /* batch * m * m */
} muon_cuda__mirror_k;

MUON_CUDA__KERNEL(muon_cuda__mirror_kernel, muon_cuda__mirror_k) {
  size_t idx, mm = (size_t)a.m * a.m;
  for (idx = MUON_CUDA__INDEX; idx < a.total; idx += MUON_CUDA__STRIDE) {
    size_t b = idx / mm, rc = idx % mm, row = rc / (size_t)a.m, col = rc % (size_t)a.m, from;
    if (col <= row) continue;
    from = b * mm + col * (size_t)a.m + row;
    if (a.esize == 2) ((uint16_t *)a.C)[idx] = ((const uint16_t *)a.C)[from];
    else ((uint32_t *)a.C)[idx] = ((const uint32_t *)a.C)[from];
  }
}

static cudaError_t muon_cuda__mirror_launch(const muon_cuda__mirror_k *k, cudaStream_t stream) {
  if (k->total == 0) return cudaSuccess;
  return MUON_CUDA__LAUNCH(muon_cuda__mirror_kernel, muon_cuda__grid(k->total), muon_cuda__dim3(MUON_CUDA__BLOCK),
                           stream, *k);
}

/* Points the cuBLAS handle at our stream, workspace, math mode (no TF32, fp32 reductions) and
   host pointer mode; on a shared handle, every time, since the trainer may have changed them. */
static muon_status muon_cuda__blas_begin(muon_cuda__ctx *c) {
  MUON_CUDA__CHECK(c, cublasSetStream(c->blas, c->stream));
  if (c->blas_ws) /* after SetStream, which resets the workspace to cuBLAS's pool */
    MUON_CUDA__CHECK(c, cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes));
  MUON_CUDA__CHECK(c, cublasSetMathMode(c->blas, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                                CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  MUON_CUDA__CHECK(c, cublasSetPointerMode(c->blas, CUBLAS_POINTER_MODE_HOST));
  return MUON_OK;
}

/* Row-major GEMM over column-major cuBLAS, for `batch` operands at strides:
     C_b[M x N] = alpha * opA(A_b) * opB(B_b) + beta * C_b   (row-major, leading dims lda/ldb/ldc)
   A row-major R x C matrix with leading dimension ld is, read column-major with the same ld,
   the C x R matrix: its transpose. So the row-major product C = opA(A) opB(B) is, to cuBLAS,
   C^T = opB(B)^T opA(A)^T: pass B first and A second, each with its OWN transpose flag, and the
   dimensions as (N, M, K). This is the only place that knows.
   One cublasGemmEx per operand, never one strided batch: cuBLAS picks its kernel (split-K
   included) from the batch count too, and on an H200 an operand summed differently in a batch
   of 3 than alone, which would make its bits depend on the operands sharing its batch, so on
   world size and layout. The same call for every operand of a shape gives the same bits. */
static muon_status muon_cuda__gemm_ex(muon_cuda__ctx *c, int transa, int transb, int M, int N, int K, float alpha,
                                      const void *A, int lda, long long stride_a, const void *B, int ldb,
                                      long long stride_b, float beta, void *C, int ldc, long long stride_c, int batch,
                                      cudaDataType_t type, cudaDataType_t ctype) {
  size_t e = type == CUDA_R_16BF ? 2 : 4, ce = ctype == CUDA_R_16BF ? 2 : 4;
  int b;
  for (b = 0; b < batch; b++)
    MUON_CUDA__CHECK(c, cublasGemmEx(c->blas, transb ? CUBLAS_OP_T : CUBLAS_OP_N, transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     N, M, K, &alpha, (const char *)B + (size_t)b * (size_t)stride_b * e, type, ldb,
                                     (const char *)A + (size_t)b * (size_t)stride_a * e, type, lda, &beta,
                                     (char *)C + (size_t)b * (size_t)stride_c * ce, ctype, ldc, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
  return MUON_OK;
}

/* C in the operands' type (the usual case). */
static muon_status muon_cuda__gemm(muon_cuda__ctx *c, int transa, int transb, int M, int N, int K, float alpha,
                                   const void *A, int lda, long long stride_a, const void *B, int ldb,
                                   long long stride_b, float beta, void *C, int ldc, long long stride_c, int batch,
                                   cudaDataType_t type) {
  return muon_cuda__gemm_ex(c, transa, transb, M, N, K, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
                            stride_c, batch, type, type);
}

/* The same row-major product over arrays of `count` pointers (device memory), op(B) = B^T: the
   tiles of the symmetric path, `per` of them for each operand. One cublasGemmBatchedEx per
   operand, of `per` tiles whatever the batch: the batch count must not pick the kernel. */
static muon_status muon_cuda__gemm_tiles(muon_cuda__ctx *c, int M, int N, int K, float alpha, void *const *arrays,
                                         size_t count, size_t per, int lda, int ldb, float beta, int ldc,
                                         cudaDataType_t type) {
  const void *const *A = (const void *const *)arrays, *const *B = (const void *const *)(arrays + count);
  void *const *C = arrays + 2 * count;
  size_t at;
  if (count == 0 || M == 0) return MUON_OK;
  for (at = 0; at < count; at += per)
    MUON_CUDA__CHECK(c, cublasGemmBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &alpha, B + at, type, ldb,
                                            A + at, type, lda, &beta, C + at, type, ldc, (int)per, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
  return MUON_OK;
}

/* C = alpha * P P^T + beta * C for `batch` row-major (m x K) operands P (stride m*K) into m x m
   C (stride m*m), all of C written. Symmetric path: `set` picks the pointer arrays. */
static muon_status muon_cuda__gram(muon_cuda__ctx *c, const muon_cuda__ns_layout *L, void **ptrs, int set, int m, int K,
                                   float alpha, const void *P, float beta, void *C, int batch, cudaDataType_t type) {
  muon_cuda__mirror_k mk;
  size_t before = 0;
  int g, T = MUON_CUDA_SYM_TILE;
  if (!L->sym)
    return muon_cuda__gemm(c, 0, 1, m, m, K, alpha, P, K, (long long)m * K, P, K, (long long)m * K, beta, C, m,
                           (long long)m * m, batch, type);
  for (g = 0; g < 3; g++) {
    void **arr = ptrs + ((size_t)set * L->tiles + before) * 3 * (size_t)batch;
    int rows = g == 0 ? T : L->r, cols = g == 2 ? L->r : T;
    if (muon_cuda__gemm_tiles(c, rows, cols, K, alpha, arr, (size_t)batch * L->cnt[g], L->cnt[g], K, K, beta, m,
                              type) != MUON_OK)
      return MUON_ERR_BACKEND;
    before += L->cnt[g];
  }
  mk.C = C;
  mk.esize = type == CUDA_R_16BF ? 2 : 4;
  mk.m = m;
  mk.total = (size_t)batch * m * m;
  MUON_CUDA__CHECK(c, muon_cuda__mirror_launch(&mk, c->stream));
  return MUON_OK;
}

/* Gram Newton-Schulz on the normalised operands x, as muon.h's muon__gram_iterations: per
   iteration P = a I + b R + c R^2 (formed in fp32, rounded once in bf16 mode, like the CPU),
   Q <- P Q, R <- P (R P) (its lower triangle mirrored), restarts X_0 = Q X_0, R = X_0 X_0^T;
   X = Q X_0 at the end, into *out (x's buffer or y's). Plain GEMMs: the symmetric tiles are the standard path's. */
static muon_status muon_cuda__gram_ns(muon_cuda__ctx *c, const muon_cuda__ns_layout *L, char *w, void *x, int batch,
                                      int m, int n, const muon_hparams *hp, int bf16, void **out) {
  size_t mm = (size_t)m * m;
  long long smn = (long long)m * n, smm = (long long)mm;
  cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  void *x0 = x, *other = w + L->y, *R = w + L->a, *P = w + L->b, *Q = w + L->q, *T = w + L->t2, *S = w + L->s, *t;
  float *Bf = bf16 ? (float *)(void *)(w + L->bf) : (float *)P;
  int k, fresh = 1;   /* fresh: Q is the identity, not stored */
  if (muon_cuda__gemm(c, 0, 1, m, m, n, 1.0f, x0, n, smn, x0, n, smn, 0.0f, R, m, smm, batch, type) != MUON_OK)
    return MUON_ERR_BACKEND;
  for (k = 0; k < hp->ns_steps; k++) {
    float a = hp->ns_coefficients[k][0], b = hp->ns_coefficients[k][1], cc = hp->ns_coefficients[k][2];
    int last = k + 1 == hp->ns_steps, restart_next = !last && ((hp->ns_restarts >> (k + 1)) & 1u);
    muon_cuda__add_diag_k d;
    muon_cuda__mirror_k mk;
    if (bf16) {   /* Bf = R in fp32, the GEMM's beta term */
      muon_cuda__cast_k up;
      up.dst = Bf; up.src = R; up.dst_bf16 = 0; up.src_bf16 = 1; up.n = (size_t)batch * mm;
      MUON_CUDA__CHECK(c, muon_cuda__cast_launch(&up, c->stream));
    } else {
      MUON_CUDA__CHECK(c, cudaMemcpyAsync(Bf, R, (size_t)batch * mm * 4, cudaMemcpyDeviceToDevice, c->stream));
    }
    if (muon_cuda__gemm_ex(c, 0, 1, m, m, m, cc, R, m, smm, R, m, smm, b, Bf, m, smm, batch, type, CUDA_R_32F) !=
        MUON_OK)
      return MUON_ERR_BACKEND;   /* Bf = b R + c R R^T */
    d.B = Bf; d.a = a; d.m = m; d.n = (size_t)batch * m;
    MUON_CUDA__CHECK(c, muon_cuda__add_diag_launch(&d, c->stream));   /* P = a I + B */
    if (bf16) {
      muon_cuda__cast_k down;
      down.dst = P; down.src = Bf; down.dst_bf16 = 1; down.src_bf16 = 0; down.n = (size_t)batch * mm;
      MUON_CUDA__CHECK(c, muon_cuda__cast_launch(&down, c->stream));
    }
    if (fresh) {
      MUON_CUDA__CHECK(c,
                       cudaMemcpyAsync(Q, P, (size_t)batch * mm * (bf16 ? 2 : 4), cudaMemcpyDeviceToDevice, c->stream));
      fresh = 0;
    } else {
      if (muon_cuda__gemm(c, 0, 0, m, m, m, 1.0f, P, m, smm, Q, m, smm, 0.0f, T, m, smm, batch, type) != MUON_OK)
        return MUON_ERR_BACKEND;
      t = Q; Q = T; T = t;
    }
    if (last) break;
    if (restart_next) {   /* X_0 = Q X_0, R = X_0 X_0^T, Q = I */
      if (muon_cuda__gemm(c, 0, 0, m, n, m, 1.0f, Q, m, smm, x0, n, smn, 0.0f, other, n, smn, batch, type) != MUON_OK)
        return MUON_ERR_BACKEND;
      t = x0; x0 = other; other = t;
      if (muon_cuda__gemm(c, 0, 1, m, m, n, 1.0f, x0, n, smn, x0, n, smn, 0.0f, R, m, smm, batch, type) != MUON_OK)
        return MUON_ERR_BACKEND;
      fresh = 1;
      continue;
    }
    if (muon_cuda__gemm(c, 0, 0, m, m, m, 1.0f, R, m, smm, P, m, smm, 0.0f, S, m, smm, batch, type) != MUON_OK)
      return MUON_ERR_BACKEND;   /* S = R P */
    if (muon_cuda__gemm(c, 0, 0, m, m, m, 1.0f, P, m, smm, S, m, smm, 0.0f, T, m, smm, batch, type) != MUON_OK)
      return MUON_ERR_BACKEND;
    mk.C = T; mk.esize = bf16 ? 2 : 4; mk.m = m; mk.total = (size_t)batch * mm;
    MUON_CUDA__CHECK(c, muon_cuda__mirror_launch(&mk, c->stream));   /* exactly symmetric, as R R^T assumes */
    t = R; R = T; T = t;   /* R = P (R P) */
  }
  if (muon_cuda__gemm(c, 0, 0, m, n, m, 1.0f, Q, m, smm, x0, n, smn, 0.0f, other, n, smn, batch, type) != MUON_OK)
    return MUON_ERR_BACKEND;
  *out = other;
  return MUON_OK;
}

/* `batch` row-major m x n operands X + b*m*n (m <= n), orthogonalised in place, every pointer
   handed to cuBLAS 16-byte aligned (see muon_cuda__newton_schulz). */
static muon_status muon_cuda__ns_run(muon_cuda__ctx *c, float *X, int batch, int m, int n, const muon_hparams *hp,
                                     char *w) {
  int bf16, k, b;
  size_t mn, mm, e, total;
  long long smn, smm;
  muon_cuda__ns_layout L;
  cudaDataType_t type;
  void *x, *y, *A, *B, *t, *x0, **ptrs;
  float *norms;
  bf16 = hp->precision == MUON_PRECISION_BF16;
  mn = (size_t)m * n;
  mm = (size_t)m * m;
  smn = (long long)mn;
  smm = (long long)mm;
  total = (size_t)batch * mn;
  e = bf16 ? 2 : 4;
  type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  L = muon_cuda__ns_plan(batch, m, n, bf16, hp->symmetric, muon_cuda__use_gram(hp, m, n));
  norms = (float *)(void *)(w + L.norms);
  if (muon_cuda__blas_begin(c) != MUON_OK) return MUON_ERR_BACKEND;

  /* X = X / max(|X|_F, eps): the norms stay on the device (device pointer mode), no host wait. */
  if (bf16) {
    muon_cuda__bf16_round_k r;
    r.X = X;
    r.n = total;
    MUON_CUDA__CHECK(c, muon_cuda__bf16_round_launch(&r, c->stream));
  }
  MUON_CUDA__CHECK(c, cublasSetPointerMode(c->blas, CUBLAS_POINTER_MODE_DEVICE));
  for (b = 0; b < batch; b++) MUON_CUDA__CHECK(c, cublasSnrm2(c->blas, (int)mn, X + (size_t)b * mn, 1, norms + b));
  MUON_CUDA__CHECK(c, cublasSetPointerMode(c->blas, CUBLAS_POINTER_MODE_HOST));
  if (bf16) {
    muon_cuda__ns_scale_bf16_k s;
    s.X = X;
    s.Xb = (uint16_t *)(void *)(w + L.x);
    s.norms = norms;
    s.mn = mn;
    s.total = total;
    s.eps = hp->eps;
    MUON_CUDA__CHECK(c, muon_cuda__ns_scale_bf16_launch(&s, c->stream));
    x = w + L.x;
  } else {
    muon_cuda__ns_scale_k s;
    s.X = X;
    s.norms = norms;
    s.mn = mn;
    s.total = total;
    s.eps = hp->eps;
    MUON_CUDA__CHECK(c, muon_cuda__ns_scale_launch(&s, c->stream));
    x = X;
  }
  y = w + L.y;
  A = w + L.a;
  B = w + L.b;
  ptrs = (void **)(void *)(w + L.ptrs);
  if (L.sym) {
    muon_cuda__sym_ptrs_k pk;
    memset(&pk, 0, sizeof pk);
    pk.ptrs = ptrs;
    pk.src[0] = (char *)x; pk.src[1] = (char *)y; pk.src[2] = (char *)A;
    pk.dst[0] = (char *)A; pk.dst[1] = (char *)A; pk.dst[2] = (char *)B;
    pk.esize = e;
    pk.m = m; pk.n = n; pk.t = L.t; pk.batch = batch;
    memcpy(pk.cnt, L.cnt, sizeof pk.cnt);
    pk.tiles = L.tiles;
    MUON_CUDA__CHECK(c, muon_cuda__sym_ptrs_launch(&pk, c->stream));
  }
  x0 = x;
  if (L.gram) {
    void *result;
    if (muon_cuda__gram_ns(c, &L, w, x, batch, m, n, hp, bf16, &result) != MUON_OK) return MUON_ERR_BACKEND;
    x = result;
  }

  for (k = L.gram ? hp->ns_steps : 0; k < hp->ns_steps; k++) {
    float ca = hp->ns_coefficients[k][0], cb = hp->ns_coefficients[k][1], cc = hp->ns_coefficients[k][2];
    /* A = X X^T (m, m) */
    if (muon_cuda__gram(c, &L, ptrs, x == x0 ? 0 : 1, m, n, 1.0f, x, 0.0f, A, batch, type) != MUON_OK)
      return MUON_ERR_BACKEND;
    /* B = b A + c A A^T (m, m): B starts as a copy of A (torch's addmm) */
    MUON_CUDA__CHECK(c, cudaMemcpyAsync(B, A, (size_t)batch * mm * e, cudaMemcpyDeviceToDevice, c->stream));
    if (muon_cuda__gram(c, &L, ptrs, 2, m, m, cc, A, cb, B, batch, type) != MUON_OK)
      return MUON_ERR_BACKEND;
    /* Y = a X + B X (m, n): Y starts as a copy of X */
    MUON_CUDA__CHECK(c, cudaMemcpyAsync(y, x, total * e, cudaMemcpyDeviceToDevice, c->stream));
    if (muon_cuda__gemm(c, 0, 0, m, n, m, 1.0f, B, m, smm, x, n, smn, ca, y, n, smn, batch, type) != MUON_OK)
      return MUON_ERR_BACKEND;
    t = x; x = y; y = t;
  }

  if (bf16) {
    muon_cuda__cast_k back;
    back.dst = X;
    back.src = x;
    back.dst_bf16 = 0;
    back.src_bf16 = 1;
    back.n = total;
    MUON_CUDA__CHECK(c, muon_cuda__cast_launch(&back, c->stream));
  } else if (x != (void *)X) {
    MUON_CUDA__CHECK(c, cudaMemcpyAsync(X, x, total * e, cudaMemcpyDeviceToDevice, c->stream));
  }
  return MUON_OK;
}

/* cuBLAS also picks its kernel from the operands' alignment (vector loads need 16 bytes), and
   the core packs a batch's operands back to back wherever its buffer puts them. So operands run
   in place only where every one starts 16-byte aligned (X aligned, m*n and m*m multiples of 8);
   otherwise one at a time through an aligned copy: an operand's bits never depend on where it
   sits. Real shapes (multiples of 64) take the first way. */
static int muon_cuda__ns_in_place(const float *X, int batch, int m, int n) {
  size_t mn = (size_t)m * n, mm = (size_t)m * m;
  return (uintptr_t)X % 16 == 0 && (batch == 1 || (mn % 8 == 0 && mm % 8 == 0));
}

static muon_status muon_cuda__newton_schulz(void *ctx, float *X, int batch, int m, int n, const muon_hparams *hp,
                                            void *ws) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  size_t mn = (size_t)m * n, at;
  float *stage;
  int b;
  if (batch == 0) return MUON_OK;
  if (!X || !ws || !hp) return muon_cuda__invalid(c, "newton_schulz: X, ws and hp must not be NULL");
  if (!muon_cuda__ns_shape_ok(batch, m, n))
    return muon_cuda__invalid(c, "newton_schulz: needs batch >= 0, 0 < m <= n, m*n <= INT_MAX");
  if (hp->ns_steps < 0 || hp->ns_steps > MUON_NS_MAX_STEPS)
    return muon_cuda__invalid(c, "newton_schulz: ns_steps out of range");
  if (muon_cuda__ns_in_place(X, batch, m, n)) return muon_cuda__ns_run(c, X, batch, m, n, hp, (char *)ws);
  at = muon_cuda__align(muon_cuda__ns_plan(1, m, n, hp->precision == MUON_PRECISION_BF16, hp->symmetric,
                                           muon_cuda__use_gram(hp, m, n))
                            .bytes);
  stage = (float *)(void *)((char *)ws + at);
  for (b = 0; b < batch; b++) {
    MUON_CUDA__CHECK(c, cudaMemcpyAsync(stage, X + b * mn, mn * 4, cudaMemcpyDeviceToDevice, c->stream));
    if (muon_cuda__ns_run(c, stage, 1, m, n, hp, (char *)ws) != MUON_OK) return MUON_ERR_BACKEND;
    MUON_CUDA__CHECK(c, cudaMemcpyAsync(X + b * mn, stage, mn * 4, cudaMemcpyDeviceToDevice, c->stream));
  }
  return MUON_OK;
}

/* ---------------------------------------------------------------------------------------------
   NorMuon, muon.h's muon__normuon in three kernels on the stream (no host wait, no workspace):
     1. sums:    one thread per statistic (row or column) sums x^2 in double in muon.h's order, and
                 writes q = sum / cnt into v_new. Per column, neighbouring threads read
                 neighbouring columns (coalesced); per row, each thread walks its own row.
     2. moments: ONE thread: v' = lerp(v, q, 1 - beta2) into v_new, and the two norms summed in
                 double in index order, into c->normuon_scale = |O| / |O'|.
     3. scale:   one thread per element: x *= (float)(s(v'_i) * scale), s recomputed from v_new.
   Why serial sums: the kernels are element-wise (the stand-in has no shared memory or
   __syncthreads) and no float atomics may sum in a varying order; a thread's own loop in the
   CPU's order is deterministic and gives the CPU's q, v', norms and factors bit for bit (double
   arithmetic is IEEE on the GPU; muon__dadd & co. keep the separate roundings under any flags). Kernel 2 is O(len),
   len <= the larger side: microseconds against the Newton-Schulz before it. */
typedef struct muon_cuda__normuon_k {
  float *X;
  const float *v;
  float *v_new;
  double *scale;             /* device scalar: |O| / |O'| (kernel 2 writes, kernel 3 reads) */
  int m, n, per_column, len, cnt;
  int rows;                  /* hp->normuon == MUON_NORMUON_ROWS: the paper's epsilons */
  float beta2;
  size_t total;              /* m * n */
} muon_cuda__normuon_k;

/* s_i of muon__normuon_scale: ROWS 1 / (sqrt(v) + 1e-10), LARGER 1 / sqrt(max(v, 1e-10)). */
MUON_CUDA__DEVICE float muon_cuda__normuon_s(float v, int rows) {
  return rows ? muon__div(1.0f, muon__add(muon__sqrt(v), 1e-10f))
              : muon__div(1.0f, muon__sqrt(v > 1e-10f ? v : 1e-10f));
}

MUON_CUDA__KERNEL(muon_cuda__normuon_sums_kernel, muon_cuda__normuon_k) {
  size_t k, j, n = (size_t)a.n;
  for (k = MUON_CUDA__INDEX; k < (size_t)a.len; k += MUON_CUDA__STRIDE) {
    double acc = 0;
    if (a.per_column) {
      for (j = 0; j < (size_t)a.m; j++) {
        double x = muon__f2d(a.X[j * n + k]);
        acc = muon__dadd(acc, muon__dmul(x, x));
      }
    } else {                       /* muon__normuon's 8 lanes (element j in lane j % 8), in order */
      const float *row = a.X + k * n;
      double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      size_t b;
      for (j = 0; j + 8 <= n; j += 8)
        for (b = 0; b < 8; b++) lane[b] = muon__dadd(lane[b], muon__dmul(muon__f2d(row[j + b]), muon__f2d(row[j + b])));
      for (b = 0; j + b < n; b++)
        lane[b] = muon__dadd(lane[b], muon__dmul(muon__f2d(row[j + b]), muon__f2d(row[j + b])));
      for (b = 0; b < 8; b++) acc = muon__dadd(acc, lane[b]);
    }
    a.v_new[k] = muon__d2f(acc / a.cnt);
  }
}

MUON_CUDA__KERNEL(muon_cuda__normuon_moments_kernel, muon_cuda__normuon_k) {
  float w = muon__sub(1.0f, a.beta2);
  double before = 0, after = 0;
  int i;
  if (MUON_CUDA__INDEX != 0) return;   /* launched as one thread */
  for (i = 0; i < a.len; i++) {
    float q = a.v_new[i], v = a.v[i], vn, s;
    vn = w < 0.5f ? muon__add(v, muon__mul(w, muon__sub(q, v)))   /* torch's lerp */
                  : muon__sub(q, muon__mul(muon__sub(q, v), muon__sub(1.0f, w)));
    s = muon_cuda__normuon_s(vn, a.rows);
    a.v_new[i] = vn;
    before = muon__dadd(before, muon__dmul((double)a.cnt, muon__f2d(q)));
    after = muon__dadd(after,
                       muon__dmul(muon__dmul(muon__dmul((double)a.cnt, muon__f2d(q)), muon__f2d(s)), muon__f2d(s)));
  }
  after = sqrt(after);
  *a.scale = sqrt(before) / (a.rows ? after + 1e-10 : (after > 1e-10 ? after : 1e-10));
}

MUON_CUDA__KERNEL(muon_cuda__normuon_scale_kernel, muon_cuda__normuon_k) {
  size_t i, n = (size_t)a.n;
  double scale = *a.scale;
  for (i = MUON_CUDA__INDEX; i < a.total; i += MUON_CUDA__STRIDE) {
    size_t k = a.per_column ? i % n : i / n;
    a.X[i] = muon__mul(a.X[i], muon__d2f(muon__dmul(muon__f2d(muon_cuda__normuon_s(a.v_new[k], a.rows)), scale)));
  }
}

static cudaError_t muon_cuda__normuon_launch(const muon_cuda__normuon_k *k, cudaStream_t stream) {
  cudaError_t e = MUON_CUDA__LAUNCH(muon_cuda__normuon_sums_kernel, muon_cuda__grid((size_t)k->len),
                                    muon_cuda__dim3(MUON_CUDA__BLOCK), stream, *k);
  if (e == cudaSuccess)
    e = MUON_CUDA__LAUNCH(muon_cuda__normuon_moments_kernel, muon_cuda__dim3(1), muon_cuda__dim3(1), stream, *k);
  if (e == cudaSuccess)
    e = MUON_CUDA__LAUNCH(muon_cuda__normuon_scale_kernel, muon_cuda__grid(k->total), muon_cuda__dim3(MUON_CUDA__BLOCK),
                          stream, *k);
  return e;
}

/* X (m x n, device), v and v_new (len floats, device; v_new must not overlap v or X); hp is host
   memory, read here (its two fields travel by value in the launches). */
static muon_status muon_cuda__normuon(void *ctx, float *X, int m, int n, int per_column, const float *v, float *v_new,
                                      const muon_hparams *hp) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  muon_cuda__normuon_k k;
  if (!X || !v || !v_new || !hp) return muon_cuda__invalid(c, "normuon: X, v, v_new and hp must not be NULL");
  if (m <= 0 || n <= 0) return muon_cuda__invalid(c, "normuon: needs m > 0 and n > 0");
  if (hp->normuon != MUON_NORMUON_ROWS && hp->normuon != MUON_NORMUON_LARGER)
    return muon_cuda__invalid(c, "normuon: hp->normuon must be MUON_NORMUON_ROWS or MUON_NORMUON_LARGER");
  if (!(hp->normuon_beta2 >= 0 && hp->normuon_beta2 < 1))
    return muon_cuda__invalid(c, "normuon: hp->normuon_beta2 must be in [0, 1)");
  memset(&k, 0, sizeof k);
  k.X = X;
  k.v = v;
  k.v_new = v_new;
  k.scale = c->normuon_scale;
  k.m = m;
  k.n = n;
  k.per_column = per_column != 0;
  k.len = per_column ? n : m;
  k.cnt = per_column ? m : n;
  k.rows = hp->normuon == MUON_NORMUON_ROWS;
  k.beta2 = hp->normuon_beta2;
  k.total = (size_t)m * n;
  MUON_CUDA__CHECK(c, muon_cuda__normuon_launch(&k, c->stream));
  return MUON_OK;
}

/* ---------------------------------------------------------------------------------------------
   sync, error, destroy, create */
static muon_status muon_cuda__sync(void *ctx) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  muon_status st;
  (void)muon_cuda__check(c, (int)cudaStreamSynchronize(c->stream), "cudaStreamSynchronize", __FILE__, __LINE__);
  (void)muon_cuda__check(c, (int)cudaGetLastError(), "cudaGetLastError", __FILE__, __LINE__);
  st = c->failed ? MUON_ERR_BACKEND : MUON_OK;
  c->failed = 0;             /* the text stays for `error` until the next failure */
  return st;
}

static const char *muon_cuda__error(void *ctx) {
  return ctx ? ((muon_cuda__ctx *)ctx)->err : "";
}

static void muon_cuda__destroy(void *ctx) {
  muon_cuda__ctx *c = (muon_cuda__ctx *)ctx;
  if (!c) return;
  if (c->blas && c->own_blas) (void)cublasDestroy(c->blas);
  if (c->blas && !c->own_blas && c->blas_ws) {
    /* The trainer's handle must not keep pointing at our workspace: SetStream resets it to
       cuBLAS's own pool. */
    cudaStream_t s = NULL;
    if (cublasGetStream(c->blas, &s) == CUBLAS_STATUS_SUCCESS) (void)cublasSetStream(c->blas, s);
  }
  if (c->blas_ws) (void)cudaFree(c->blas_ws);
  if (c->normuon_scale) (void)cudaFree(c->normuon_scale);
  if (c->stream && c->own_stream) (void)cudaStreamDestroy(c->stream);
  free(c);
}

static const muon_compute_vtable muon_cuda__vtable = {
  MUON_COMPUTE_VTABLE_VERSION,
  /* .memory             = */ MUON_MEMORY_DEVICE,
  /* .alloc              = */ muon_cuda__alloc,
  /* .free               = */ muon_cuda__free,
  /* .alloc_host         = */ muon_cuda__alloc_host,
  /* .free_host          = */ muon_cuda__free_host,
  /* .copy               = */ muon_cuda__copy,
  /* .zero               = */ muon_cuda__zero,
  /* .pack               = */ muon_cuda__pack,
  /* .momentum           = */ muon_cuda__momentum,
  /* .ns_workspace       = */ muon_cuda__ns_workspace,
  /* .newton_schulz      = */ muon_cuda__newton_schulz,
  /* .apply              = */ muon_cuda__apply,
  /* .adamw              = */ muon_cuda__adamw,
  /* .nonfinite          = */ muon_cuda__nonfinite,
  /* .cast               = */ muon_cuda__cast,
  /* .sync               = */ muon_cuda__sync,
  /* .error              = */ muon_cuda__error,
  /* .destroy            = */ muon_cuda__destroy,
  /* .normuon            = */ muon_cuda__normuon,
  /* .newton_schulz_many = */ NULL, /* one batched call per shape is what cuBLAS wants */
  /* .scale              = */ muon_cuda__scale,
  /* .blockwise          = */ muon_cuda__blockwise
};

MUON_API muon_cuda_desc muon_cuda_default_desc(void) {
  muon_cuda_desc d;
  memset(&d, 0, sizeof d);
  return d;
}

/* Creation steps; the first failure is the context's error text. */
static muon_status muon_cuda__setup(muon_cuda__ctx *c, const muon_cuda_desc *d) {
  MUON_CUDA__CHECK(c, cudaSetDevice(d->device));
  if (d->stream) {
    c->stream = (cudaStream_t)d->stream;
  } else {
    MUON_CUDA__CHECK(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    c->own_stream = 1;
  }
  if (d->cublas) {
    c->blas = (cublasHandle_t)d->cublas;
  } else {
    MUON_CUDA__CHECK(c, cublasCreate(&c->blas));
    c->own_blas = 1;
  }
  if (d->workspace_limit) {
    MUON_CUDA__CHECK(c, cudaMalloc(&c->blas_ws, d->workspace_limit));
    c->blas_ws_bytes = d->workspace_limit;
  }
  MUON_CUDA__CHECK(c, cudaMalloc((void **)&c->normuon_scale, sizeof(double)));
  return MUON_OK;
}

MUON_API muon_status muon_cuda_create(muon_compute *out, const muon_cuda_desc *desc) {
  muon_cuda_desc d = desc ? *desc : muon_cuda_default_desc();
  muon_cuda__ctx *c;
  muon_set_create_error("%s", "");
  if (!out) return muon_create_failed(MUON_ERR_ARG, "muon_cuda_create", "out is NULL");
  out->vt = NULL;
  out->ctx = NULL;
  if (d.device < 0)
    return muon_create_failed(MUON_ERR_ARG, "muon_cuda_create", "muon_cuda_desc.device must be >= 0 (got %d)", d.device);
  c = (muon_cuda__ctx *)calloc(1, sizeof *c);
  if (!c)
    return muon_create_failed(MUON_ERR_NOMEM, "muon_cuda_create", "no host memory for the context (%zu bytes)", sizeof *c);
  c->device = d.device;
  if (muon_cuda__setup(c, &d) != MUON_OK) {
    (void)cudaGetLastError();
    (void)muon_create_failed(MUON_ERR_BACKEND, "muon_cuda_create", "%s", c->err);
    muon_cuda__destroy(c);   /* what the steps made so far */
    return MUON_ERR_BACKEND;
  }
  out->vt = &muon_cuda__vtable;
  out->ctx = c;
  return MUON_OK;
}

MUON_API void *muon_cuda_stream(const muon_compute *c) {
  if (!c || c->vt != &muon_cuda__vtable || !c->ctx) return NULL;
  return (void *)((muon_cuda__ctx *)c->ctx)->stream;
}

#endif /* MUON_CUDA__IMPLEMENTED */
#endif /* MUON_CUDA_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the muon authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
