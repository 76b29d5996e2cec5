/* bench_gpu.c - muon's CUDA backend (muon_cuda.h) on one GPU, everything measured side by side in
   ONE run and printed as ratios beside the times:

     1. Newton-Schulz throughput: the backend's newton_schulz slot (through the muon_compute
        vtable from muon_cuda_create) on square shapes and the GPT-2 124M / 1.5B matrix shapes,
        one operand and a whole stack (batch = layers), bf16 and fp32. GFLOP/s counts the full
        GEMMs of the plain algorithm, steps * (4 m^2 n + 2 m^3) with m <= n, for every variant
        (so the symmetric path, which computes fewer flops, shows a higher rate); "of ceil" is
        that rate over the rate of one plain cuBLAS GEMM of the same size measured beside it:
        C (m x m) = A (m x n) * B (n x m), cublasGemmEx (cublasGemmStridedBatchedEx for a batch),
        bf16 in and out with fp32 accumulation (CUBLAS_COMPUTE_32F) for bf16, fp32 without TF32
        for fp32, on a handle with the backend's math mode. Symmetric products on (the default,
        hp.symmetric = 1) against off (0) as a ratio, where the backend takes the tile path.
     2. A whole Muon step on the 12-layer GPT-2 124M matrices (per layer qkv 768x2304, attn proj
        768x768, fc 768x3072, fc proj 3072x768; 4 stacks of count 12 as llm.c stores them), bf16
        gradients, fp32 params, bf16 Newton-Schulz: muon_step against a C baseline that does what
        torch.optim.Muon does, one matrix at a time: momentum (the backend's momentum slot),
        X = bf16(U) / max(|X|_F, eps) (the newton_schulz slot with ns_steps = 0: the same
        normalisation), then per iteration three cublasGemmEx on bf16 operands with the two
        copies torch's addmm makes (A = X X^T; B = copy of A, B = b B + c A A; Y = copy of X,
        Y = a Y + B X; tall matrices through transposed GEMM operands, as torch's .mT views), no
        batching, no symmetric products, then the cast back and the apply slot. The element-wise
        slots cost the same in both, so the ratio isolates the batched NS and the fused step.
        The first step of both from the same parameters is compared (a check, not a timing).
     3. torch.optim.Muon: bench/bench_torch.py times it on the same GPU and prints
        "torch.optim.Muon step: X ms"; give that X as --torch-ms X and the ratio is printed here
        (this program prints "muon step: X ms" in the same format).
     2b. The same step with the momentum in pinned host memory (muon_desc.state_on_host) beside
        device-resident momentum, interleaved; device memory each holds (cudaMemGetInfo).
     4. Memory: device bytes the optimizer holds beyond the momentum, as a fraction of the fp32
        parameters, from muon_get_stats and from cudaMemGetInfo around creation and planning.

   Times: NS and the ceiling are GPU times from cudaEvents on the backend's stream (created here
   and handed over in muon_cuda_desc.stream), each sample the mean of `inner` back-to-back calls
   (inner chosen so a sample lasts ~2 ms), median of --runs samples after warm-up, the variants
   interleaved. A step is host wall time from a synchronised stream to a synchronised stream
   (muon_step itself waits once on the host for the non-finite check), median of --step-runs.
   Goals are printed "met" / "NOT met", never asserted: a slow GPU does not fail anything.

   usage: build/gpu/bench_gpu [--smoke] [--quick] [--runs N] [--step-runs N] [--torch-ms X]
     --smoke      tiny shapes (2 layers) so the whole program runs in seconds, e.g. on the
                  stand-in; the times are then meaningless and no goal is judged
     --quick      skip 8192^2, the GPT-2 1.5B shapes and the stacked batches
     --runs       timed samples per NS variant (default 10; smoke 2)
     --step-runs  timed steps of each optimizer (default 20; smoke 2)
     --torch-ms   torch.optim.Muon's step time from bench/bench_torch.py on this GPU

   Build on a GPU machine (muon_cuda.o from nvcc, see muon_cuda.h):
     nvcc -O2 -fmad=false -Xcompiler -Wall,-Wextra,-Werror -I. -c examples/muon_cuda.cu \
          -o build/cuda/muon_cuda.o
     gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -isystem /usr/local/cuda/include -I. \
         bench/bench_gpu.c build/cuda/muon_cuda.o -o build/cuda/bench_gpu \
         -L/usr/local/cuda/lib64 -lcudart -lcublas -lstdc++ -lm
   On the stand-in (no GPU; --smoke only):
     gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -isystem /usr/local/cuda/include \
         -DMUON_CUDA_STANDIN -DMUON_CUDA_IMPLEMENTATION -D_GNU_SOURCE -Itests/standin -I. \
         bench/bench_gpu.c build/cuda/standin.o -o build/cuda/bench_gpu_standin -lm */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#ifdef MUON_CUDA_STANDIN
/* The stand-in build compiles the backend here: smaller symmetric tiles so that the smoke's tiny
   operands (64 rows = 4 tiles) take the symmetric path too. A GPU build uses muon_cuda.o as it
   was compiled. */
#ifndef MUON_CUDA_SYM_TILE
#define MUON_CUDA_SYM_TILE 16
#endif
#ifndef MUON_CUDA_SYM_MIN_TILES
#define MUON_CUDA_SYM_MIN_TILES 4
#endif
#ifndef MUON_CUDA_SYM_MIN_TILES_BF16
#define MUON_CUDA_SYM_MIN_TILES_BF16 4
#endif
#endif
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "muon_cuda.h"
#include "bench.h"

#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#ifdef MUON_CUDA_STANDIN
#include "standin.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RUNS 256
#define SAMPLE_MS 2.0     /* a GPU timing sample lasts at least this long (inner repetitions) */
#define MAX_INNER 64
#define CHECK_TOL 0.1     /* first step: max |muon - baseline| / max |muon - param0| (bf16 NS noise
                             is a few 1e-2; a wrong operand or coefficient gives more) */

static muon_compute G;    /* the backend under test */
static cudaStream_t S;    /* its stream: ours, so events can be recorded on it */
static cublasHandle_t H;  /* our handle (ceiling GEMMs, the baseline's GEMMs), on S */
static cudaEvent_t E0, E1;
static int smoke;
static long long base_calls, base_gemms; /* library calls the baseline makes (for the report) */

/* ---- errors: any failure ends the program (exit 1) ------------------------------------------ */
static void fail(const char *call, const char *why, int line) {
  fprintf(stderr, "bench_gpu: line %d: %s failed: %s\n", line, call, why ? why : "?");
#ifdef MUON_CUDA_STANDIN
  if (muon_standin_last_message()[0]) fprintf(stderr, "  stand-in: %s\n", muon_standin_last_message());
#endif
  exit(1);
}
#define CK_CUDA(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) fail(#call, cudaGetErrorString(e_), __LINE__); } while (0)
#define CK_BLAS(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) fail(#call, cublasGetStatusString(s_), __LINE__); } while (0)
#define CK_SLOT(call) do { if ((call) != MUON_OK) fail(#call, G.vt->error(G.ctx), __LINE__); } while (0)
#define CK_OPT(opt, call) do { if ((call) != MUON_OK) fail(#call, muon_error(opt), __LINE__); } while (0)

/* ---- host data ------------------------------------------------------------------------------ */
static unsigned rng;
static float urand(void) { /* uniform in [-1, 1) */
  rng = rng * 1664525u + 1013904223u;
  return (float)((rng >> 8) & 0xffffffu) / 8388608.0f - 1.0f;
}
static uint16_t to_bf16(float x) { /* nearest even; finite x only */
  uint32_t u;
  memcpy(&u, &x, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) { fprintf(stderr, "bench_gpu: out of host memory (%zu bytes)\n", bytes); exit(1); }
  return p;
}

/* ---- device memory -------------------------------------------------------------------------- */
static void *dev_try(size_t bytes) { /* NULL if the GPU has no room (the case is then skipped) */
  void *p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return p;
}
static void *dev(size_t bytes) {
  void *p = dev_try(bytes);
  if (!p) fail("cudaMalloc", "out of device memory", __LINE__);
  return p;
}
static void dev_free(void *p) { if (p) CK_CUDA(cudaFree(p)); }

/* n random elements (uniform in [-scale, scale), fp32 or bf16) into device memory, in chunks. */
static void upload_random(void *dst, size_t n, int bf16, float scale, unsigned seed) {
  const size_t chunk = (size_t)1 << 22;
  size_t at = 0, i, e = bf16 ? 2 : 4;
  unsigned char *h = (unsigned char *)xmalloc((n < chunk ? n : chunk) * e);
  rng = seed * 2654435761u + 12345u;
  while (at < n) {
    size_t k = n - at < chunk ? n - at : chunk;
    for (i = 0; i < k; i++) {
      float v = scale * urand();
      if (bf16) { uint16_t b = to_bf16(v); memcpy(h + 2 * i, &b, 2); }
      else memcpy(h + 4 * i, &v, 4);
    }
    CK_CUDA(cudaMemcpy((unsigned char *)dst + at * e, h, k * e, cudaMemcpyHostToDevice));
    at += k;
  }
  free(h);
}

/* Everything queued anywhere is done (the stand-in, like the legacy default stream of a GPU,
   does not order cudaMemcpy after our non-blocking stream). */
static void sync_all(void) {
  CK_CUDA(cudaStreamSynchronize(S));
  CK_CUDA(cudaDeviceSynchronize());
}

/* ---- timing --------------------------------------------------------------------------------- */
typedef void (*work_fn)(void *arg);

/* GPU ms per call: cudaEvents on S around `inner` back-to-back calls. */
static double gpu_ms(work_fn fn, void *arg, int inner) {
  float ms = 0.0f;
  int i;
  CK_CUDA(cudaEventRecord(E0, S));
  for (i = 0; i < inner; i++) fn(arg);
  CK_CUDA(cudaEventRecord(E1, S));
  CK_CUDA(cudaEventSynchronize(E1));
  CK_CUDA(cudaEventElapsedTime(&ms, E0, E1));
  return (double)ms / inner;
}

/* Host wall ms of one call, from a synchronised stream to a synchronised stream. */
static double host_ms(work_fn fn, void *arg) {
  double t0;
  CK_CUDA(cudaStreamSynchronize(S));
  t0 = now_s();
  fn(arg);
  CK_CUDA(cudaStreamSynchronize(S));
  return 1e3 * (now_s() - t0);
}

/* One warm-up call, then the repetitions per sample that make a sample last SAMPLE_MS. */
static int calibrate(work_fn fn, void *arg) {
  double t;
  fn(arg);
  t = gpu_ms(fn, arg, 1);
  if (smoke || t <= 0) return 1;
  t = ceil(SAMPLE_MS / t);
  return t < 1 ? 1 : t > MAX_INNER ? MAX_INNER : (int)t;
}

static const char *verdict(int met) { return met ? "met" : "NOT met"; }

/* ---- 1. Newton-Schulz against the GEMM ceiling ----------------------------------------------- */
static double ns_flops(int m, int n, int steps) { /* m <= n: X X^T, A A, B X */
  return (double)steps * (4.0 * m * (double)m * n + 2.0 * m * (double)m * m);
}

typedef struct ceiling_case { int m, n, batch; cudaDataType_t type; void *A, *B, *C; } ceiling_case;

/* Row-major C (m x m) = A (m x n) * B (n x m): column-major, C^T = B^T A^T, i.e. the stored B
   (m x n column-major, ld m) times the stored A (n x m column-major, ld n). */
static void run_ceiling(void *arg) {
  const ceiling_case *g = (const ceiling_case *)arg;
  float one = 1.0f, zero = 0.0f;
  if (g->batch == 1)
    CK_BLAS(cublasGemmEx(H, CUBLAS_OP_N, CUBLAS_OP_N, g->m, g->m, g->n, &one, g->B, g->type, g->m, g->A, g->type, g->n,
                         &zero, g->C, g->type, g->m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  else
    CK_BLAS(cublasGemmStridedBatchedEx(H, CUBLAS_OP_N, CUBLAS_OP_N, g->m, g->m, g->n, &one, g->B, g->type, g->m,
                                       (long long)g->m * g->n, g->A, g->type, g->n, (long long)g->m * g->n, &zero, g->C,
                                       g->type, g->m, (long long)g->m * g->m, g->batch, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
}

typedef struct ns_case { float *X; int batch, m, n; muon_hparams hp; void *ws; } ns_case;

static void run_ns(void *arg) {
  ns_case *c = (ns_case *)arg;
  CK_SLOT(G.vt->newton_schulz(G.ctx, c->X, c->batch, c->m, c->n, &c->hp, c->ws));
}

typedef struct shape { const char *label; int rows, cols, batch; } shape;

/* Fraction of the ceiling of the default (symmetric) bf16 / fp32 NS at 4096^2 (goal), -1 unseen. */
static double goal_frac[2] = { -1.0, -1.0 };

static void bench_ns_row(const shape *s, muon_precision prec, int runs) {
  int bf16 = prec == MUON_PRECISION_BF16, m = s->rows < s->cols ? s->rows : s->cols;
  int n = s->rows < s->cols ? s->cols : s->rows, b = s->batch, sym_path, r, k, inner[3];
  size_t e = bf16 ? 2 : 4, mn = (size_t)b * m * n, mm = (size_t)b * m * m, ws_sym, ws_plain;
  double t[3][MAX_RUNS], med[3], flops = ns_flops(m, n, 5) * b, ceil_rate;
  ns_case ns[2];
  ceiling_case cg;
  work_fn fn[3];
  void *arg[3];

  for (k = 0; k < 2; k++) {
    ns[k].batch = b; ns[k].m = m; ns[k].n = n;
    ns[k].hp = muon_default_hparams();
    ns[k].hp.precision = prec;
    ns[k].hp.symmetric = k == 0;   /* 0: the default (symmetric = 1), 1: symmetric = 0 */
  }
  ws_sym = G.vt->ns_workspace(G.ctx, b, m, n, &ns[0].hp);
  ws_plain = G.vt->ns_workspace(G.ctx, b, m, n, &ns[1].hp);
  /* The tile path adds pointer arrays to the workspace: equal sizes mean the backend computes
     this shape with plain GEMMs whatever hp.symmetric says (m below its tile threshold). */
  sym_path = ws_sym != ws_plain;

  cg.m = m; cg.n = n; cg.batch = b; cg.type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  ns[0].X = (float *)dev_try(mn * sizeof(float));
  ns[0].ws = dev_try(ws_sym > ws_plain ? ws_sym : ws_plain);
  cg.A = dev_try(mn * e);
  cg.B = dev_try(mn * e);
  cg.C = dev_try(mm * e);
  if (!ns[0].X || !ns[0].ws || !cg.A || !cg.B || !cg.C) {
    printf("  %-10s %5d %4s   skipped: not enough device memory\n", s->label, b, bf16 ? "bf16" : "fp32");
    dev_free(ns[0].X); dev_free(ns[0].ws); dev_free(cg.A); dev_free(cg.B); dev_free(cg.C);
    return;
  }
  ns[1].X = ns[0].X;
  ns[1].ws = ns[0].ws;
  upload_random(ns[0].X, mn, 0, 1.0f, 11u + (unsigned)m);
  upload_random(cg.A, mn, bf16, 1.0f, 12u + (unsigned)n);
  upload_random(cg.B, mn, bf16, 1.0f, 13u + (unsigned)b);
  sync_all();

  fn[0] = run_ceiling; arg[0] = &cg;
  fn[1] = run_ns; arg[1] = &ns[0];
  fn[2] = run_ns; arg[2] = &ns[1];
  for (k = 0; k < 3; k++) inner[k] = (k == 2 && !sym_path) ? 0 : calibrate(fn[k], arg[k]);
  for (r = 0; r < runs; r++) /* interleaved, the order reversed every other sample */
    for (k = 0; k < 3; k++) {
      int v = r % 2 ? 2 - k : k;
      if (inner[v]) t[v][r] = gpu_ms(fn[v], arg[v], inner[v]);
    }
  CK_SLOT(G.vt->sync(G.ctx)); /* any failure of queued NS work */
  for (k = 0; k < 3; k++) med[k] = inner[k] ? median(t[k], runs) : -1.0;

  ceil_rate = 2.0 * m * (double)m * n * b / (med[0] * 1e-3);
  printf("  %-10s %5d %4s %9.0f | %9.3f %9.0f %7.3f |", s->label, b, bf16 ? "bf16" : "fp32", ceil_rate * 1e-9,
         med[1], flops / (med[1] * 1e-3) * 1e-9, flops / (med[1] * 1e-3) / ceil_rate);
  if (sym_path)
    printf(" %9.3f %9.0f %7.3f | %6.2fx\n", med[2], flops / (med[2] * 1e-3) * 1e-9,
           flops / (med[2] * 1e-3) / ceil_rate, med[2] / med[1]);
  else
    printf(" %9s %9s %7s | n/a (plain path at m = %d)\n", "=", "", "", m);
  if (s->rows == 4096 && s->cols == 4096 && b == 1) goal_frac[bf16] = flops / (med[1] * 1e-3) / ceil_rate;
  dev_free(ns[0].X); dev_free(ns[0].ws); dev_free(cg.A); dev_free(cg.B); dev_free(cg.C);
}

static void bench_ns(int quick, int runs) {
  static const shape full[] = {
    { "1024x1024", 1024, 1024, 1 }, { "4096x4096", 4096, 4096, 1 }, { "8192x8192", 8192, 8192, 1 },
    { "768x2304", 768, 2304, 1 },   { "768x768", 768, 768, 1 },     { "768x3072", 768, 3072, 1 },
    { "3072x768", 3072, 768, 1 },   { "768x2304", 768, 2304, 12 },  { "768x768", 768, 768, 12 },
    { "768x3072", 768, 3072, 12 },  { "3072x768", 3072, 768, 12 },  { "1600x4800", 1600, 4800, 1 },
    { "1600x1600", 1600, 1600, 1 }, { "1600x6400", 1600, 6400, 1 }, { "6400x1600", 6400, 1600, 1 },
    { "1600x4800", 1600, 4800, 48 }, { "1600x1600", 1600, 1600, 48 }, { "1600x6400", 1600, 6400, 48 },
    { "6400x1600", 6400, 1600, 48 }
  };
  static const shape tiny[] = { { "64x96", 64, 96, 1 }, { "96x64", 96, 64, 1 }, { "48x48", 48, 48, 1 },
                                { "64x96", 64, 96, 2 } };
  const shape *list = smoke ? tiny : full;
  int count = smoke ? (int)(sizeof tiny / sizeof *tiny) : (int)(sizeof full / sizeof *full), i, p;
  printf("\n-- 1. Newton-Schulz: the newton_schulz slot vs one cuBLAS GEMM of the same size, median of %d "
         "samples (GPU time, cudaEvents) --\n", runs);
  printf("   GFLOP/s: full-GEMM flops 5*(4m^2n + 2m^3) per operand (m <= n; tall shapes run transposed) for\n"
         "   both variants; 'of ceil' = that rate / the rate of C(m x m) = A(m x n) B(n x m) in the same\n"
         "   precision (cublasGemmEx; strided-batched for batch > 1). sym speedup = symmetric=0 ms / "
         "symmetric=1 ms;\n"
         "   '=' / n/a: the backend takes its plain path for this m whatever hp.symmetric says.\n");
  printf("  %-10s %5s %4s %9s | %9s %9s %7s | %9s %9s %7s | %s\n", "shape", "batch", "prec", "ceil GF/s",
         "sym=1 ms", "GFLOP/s", "of ceil", "sym=0 ms", "GFLOP/s", "of ceil", "sym speedup");
  for (p = 0; p < 2; p++)
    for (i = 0; i < count; i++) {
      const shape *s = &list[i];
      if (quick && (s->rows == 8192 || s->rows == 1600 || s->cols == 1600 || s->batch > 1)) continue;
      bench_ns_row(s, p == 0 ? MUON_PRECISION_BF16 : MUON_PRECISION_FP32, runs);
    }
}

/* ---- 2. a whole step: muon_step vs the per-matrix baseline ----------------------------------- */
typedef struct stack {
  const char *name;
  int rows, cols;
  float *p_muon, *p_base, *mom_base; /* device: params of each optimizer, the baseline's momentum */
  uint16_t *grad;                    /* device, bf16, shared (read only) */
  float *p0;                         /* host: the initial params */
} stack;

#define N_STACKS 4

typedef struct model {
  int layers;
  stack st[N_STACKS];
  muon_hparams hp;         /* both optimizers: torch.optim.Muon's defaults, bf16 NS */
  /* the baseline's scratch, sized for the largest matrix (torch's caching allocator reuses too) */
  float *U, *O;
  uint16_t *X, *Y, *A, *B;
  void *ns0;               /* workspace of the normalisation (newton_schulz slot, ns_steps = 0) */
  size_t scratch_bytes;
} model;

/* Row-major bf16 GEMM over column-major cuBLAS (as muon_cuda.h's muon_cuda__gemm, one matrix):
   C[M x N] = alpha opA(A) opB(B) + beta C; to cuBLAS C^T = opB(B)^T opA(A)^T. */
static void rm_gemm(int ta, int tb, int M, int N, int K, float alpha, const void *A, int lda, const void *B, int ldb,
                    float beta, void *C, int ldc) {
  CK_BLAS(cublasGemmEx(H, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B,
                       CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta, C, CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT));
  base_calls++;
  base_gemms++;
}

static void d2d(void *dst, const void *src, size_t bytes) {
  CK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, S));
  base_calls++;
}

/* torch.optim.Muon on one matrix (its _single_tensor_muon + _zeropower_via_newtonschulz). */
static void base_matrix(model *md, const stack *s, int l) {
  const muon_hparams *hp = &md->hp;
  int R = s->rows, C = s->cols, tall = R > C, m = tall ? C : R, n = tall ? R : C, k;
  size_t rc = (size_t)R * C, off = (size_t)l * rc;
  muon_momentum_args ma;
  muon_apply_args aa;
  muon_hparams h0 = *hp;
  uint16_t *x = md->X, *y = md->Y, *t;
  memset(&ma, 0, sizeof ma);
  ma.mu = hp->momentum;
  ma.nesterov = hp->nesterov;
  ma.sgd = 0;
  ma.grad_scale = 1.0f;
  ma.grad_dtype = MUON_DTYPE_BF16;
  memset(&aa, 0, sizeof aa);
  aa.decay = (float)(1.0 - (double)hp->lr * hp->weight_decay);
  aa.step = (float)((double)hp->lr * sqrt((double)R / C > 1.0 ? (double)R / C : 1.0));
  aa.param_dtype = MUON_DTYPE_FP32;
  aa.mirror = NULL;
  aa.rounding = MUON_ROUND_NEAREST;
  aa.piece.h = R; aa.piece.w = C; aa.piece.f1 = (long long)rc; aa.piece.rows = R; aa.piece.cols = C;
  h0.ns_steps = 0;   /* the normalisation alone */
  h0.symmetric = 0;

  /* buf.lerp_(grad, 1 - mu); update = grad.lerp(buf, mu) */
  CK_SLOT(G.vt->momentum(G.ctx, rc, s->mom_base + off, s->grad + off, &ma, 1, md->U));
  /* X = update.bfloat16(); X /= X.norm().clamp(min=eps) (rounded as torch rounds) */
  CK_SLOT(G.vt->newton_schulz(G.ctx, md->U, 1, m, n, &h0, md->ns0));
  CK_SLOT(G.vt->cast(G.ctx, x, MUON_DTYPE_BF16, md->U, MUON_DTYPE_FP32, rc));
  base_calls += 3;
  for (k = 0; k < hp->ns_steps; k++) {
    float a = hp->ns_coefficients[k][0], b = hp->ns_coefficients[k][1], c = hp->ns_coefficients[k][2];
    if (!tall) { /* x: the m x n operand */
      rm_gemm(0, 1, m, m, n, 1.0f, x, n, x, n, 0.0f, md->A, m);            /* A = X X^T          */
      d2d(md->B, md->A, (size_t)m * m * 2);                                /* addmm copies self  */
      rm_gemm(0, 0, m, m, m, c, md->A, m, md->A, m, b, md->B, m);          /* B = b A + c A A    */
      d2d(y, x, rc * 2);
      rm_gemm(0, 0, m, n, m, 1.0f, md->B, m, x, n, a, y, n);               /* Y = a X + B X      */
    } else {     /* x: R x C, the transpose of the m x n operand (torch's .mT view) */
      rm_gemm(1, 0, m, m, R, 1.0f, x, C, x, C, 0.0f, md->A, m);            /* A = x^T x          */
      d2d(md->B, md->A, (size_t)m * m * 2);
      rm_gemm(0, 0, m, m, m, c, md->A, m, md->A, m, b, md->B, m);          /* B = b A + c A A    */
      d2d(y, x, rc * 2);
      rm_gemm(0, 1, R, C, C, 1.0f, x, C, md->B, m, a, y, C);               /* y = a y + x B^T    */
    }
    t = x; x = y; y = t;
  }
  /* param.mul_(1 - lr*wd); param.add_(update, alpha=-adjusted_lr) */
  CK_SLOT(G.vt->cast(G.ctx, md->O, MUON_DTYPE_FP32, x, MUON_DTYPE_BF16, rc));
  CK_SLOT(G.vt->apply(G.ctx, rc, s->p_base + off, md->O, &aa));
  base_calls += 2;
}

static void run_base(void *arg) {
  model *md = (model *)arg;
  int s, l;
  for (s = 0; s < N_STACKS; s++)
    for (l = 0; l < md->layers; l++) base_matrix(md, &md->st[s], l);
}

static void run_muon(void *arg) {
  muon_optimizer *opt = (muon_optimizer *)arg;
  CK_OPT(opt, muon_step(opt));
}

static size_t free_bytes(void) {
  size_t f = 0, t = 0;
  sync_all();
  CK_CUDA(cudaMemGetInfo(&f, &t));
  return f;
}

static double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* An optimizer over md's matrices (params p, gradients shared), state on the host or not. */
static muon_optimizer *make_opt(const model *md, float *const *p, int state_on_host) {
  muon_optimizer *opt = NULL;
  muon_desc desc = muon_default_desc();
  int s;
  desc.hparams = md->hp;
  desc.compute = &G;
  desc.state_on_host = state_on_host;
  if (muon_create(&opt, &desc) != MUON_OK) fail("muon_create", "see the logger (none set)", __LINE__);
  for (s = 0; s < N_STACKS; s++) {
    const stack *x = &md->st[s];
    muon_matrix mt = muon_default_matrix();
    mt.name = x->name;
    mt.param = p[s];
    mt.grad = x->grad;
    mt.rows = x->rows;
    mt.cols = x->cols;
    mt.count = md->layers;
    mt.param_dtype = MUON_DTYPE_FP32;
    mt.grad_dtype = MUON_DTYPE_BF16;
    CK_OPT(opt, muon_add_matrix(opt, &mt, NULL));
  }
  return opt;
}

/* 2b. The same step with the momentum in pinned host memory (muon_desc.state_on_host) beside
   device-resident momentum, interleaved: the cost of moving the state over the bus each step. */
static void bench_state_host(const model *md, int step_runs) {
  float *pd[N_STACKS], *ph[N_STACKS];
  muon_optimizer *od, *oh;
  double td[MAX_RUNS], th[MAX_RUNS], d_ms, h_ms;
  muon_stats st;
  size_t f0, f1, f2;
  int s, r;
  for (s = 0; s < N_STACKS; s++) {
    size_t all = (size_t)md->st[s].rows * md->st[s].cols * md->layers;
    pd[s] = (float *)dev(all * 4);
    ph[s] = (float *)dev(all * 4);
    CK_CUDA(cudaMemcpy(pd[s], md->st[s].p0, all * 4, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(ph[s], md->st[s].p0, all * 4, cudaMemcpyHostToDevice));
  }
  f0 = free_bytes();
  od = make_opt(md, pd, 0);
  run_muon(od);
  f1 = free_bytes();
  oh = make_opt(md, ph, 1);
  run_muon(oh);
  f2 = free_bytes();
  for (r = 0; r < (smoke ? 1 : 3); r++) { run_muon(od); run_muon(oh); }
  for (r = 0; r < step_runs; r++) {
    if (r % 2 == 0) { td[r] = host_ms(run_muon, od); th[r] = host_ms(run_muon, oh); }
    else { th[r] = host_ms(run_muon, oh); td[r] = host_ms(run_muon, od); }
  }
  CK_OPT(oh, muon_get_stats(oh, &st));
  d_ms = median(td, step_runs);
  h_ms = median(th, step_runs);
  printf("\n-- 2b. state on the host (muon_desc.state_on_host): the same step, momentum in pinned host memory, "
         "median of %d interleaved steps --\n", step_runs);
  printf("  %-44s %9.3f  device memory held %.1f MiB\n", "device-resident momentum", d_ms, mib(f0 - f1));
  printf("  %-44s %9.3f  device memory held %.1f MiB (%.1f MiB of state on the host)\n", "host-resident momentum",
         h_ms, mib(f1 - f2), mib(st.state_bytes));
  printf("  host-resident / device-resident = %.2fx (the momentum crosses the bus 3 times in, once out per step)\n",
         h_ms / d_ms);
  printf("state on host step: %.3f ms\n", h_ms);
  muon_destroy(od);
  muon_destroy(oh);
  for (s = 0; s < N_STACKS; s++) { dev_free(pd[s]); dev_free(ph[s]); }
}

/* Results of 2 and 4 for the summary. */
static double step_muon_ms = -1, step_base_ms = -1;

static void bench_step(int step_runs, double torch_ms) {
  static const int full_shapes[N_STACKS][2] = { { 768, 2304 }, { 768, 768 }, { 768, 3072 }, { 3072, 768 } };
  static const int tiny_shapes[N_STACKS][2] = { { 64, 96 }, { 64, 64 }, { 64, 128 }, { 128, 64 } };
  static const char *const names[N_STACKS] = { "qkv", "attn_proj", "fc", "fc_proj" };
  const int (*shapes)[2] = smoke ? tiny_shapes : full_shapes;
  model md;
  muon_optimizer *opt = NULL;
  muon_desc desc;
  muon_stats st0, st1, st2;
  size_t params = 0, max_rc = 0, max_mm = 0, max_ns0 = 0, f_before, f_added, f_planned;
  double tm[MAX_RUNS], tb[MAX_RUNS], diff = 0, upd = 0, check;
  long long calls0, gemms0;
  int s, r, warm = smoke ? 1 : 3;

  memset(&md, 0, sizeof md);
  md.layers = smoke ? 2 : 12;
  md.hp = muon_default_hparams();
  md.hp.precision = MUON_PRECISION_BF16;

  printf("\n-- 2. one Muon step, %s: %d layers x {", smoke ? "tiny stand-ins for the GPT-2 124M matrices" :
         "GPT-2 124M matrices", md.layers);
  for (s = 0; s < N_STACKS; s++) printf("%s %dx%d%s", names[s], shapes[s][0], shapes[s][1], s < N_STACKS - 1 ? ", " : "");
  printf("} as %d stacks of count %d; bf16 grads, fp32 params, bf16 NS; host wall ms, median of %d steps "
         "after %d warm-up --\n", N_STACKS, md.layers, step_runs, warm);

  /* params (the same initial values for both optimizers), gradients */
  for (s = 0; s < N_STACKS; s++) {
    stack *x = &md.st[s];
    int m, n;
    size_t rc, all;
    x->name = names[s];
    x->rows = shapes[s][0];
    x->cols = shapes[s][1];
    m = x->rows < x->cols ? x->rows : x->cols;
    n = x->rows < x->cols ? x->cols : x->rows;
    rc = (size_t)x->rows * x->cols;
    all = rc * (size_t)md.layers;
    params += all;
    if (rc > max_rc) max_rc = rc;
    if ((size_t)m * m > max_mm) max_mm = (size_t)m * m;
    {
      muon_hparams h0 = md.hp;
      size_t w;
      h0.ns_steps = 0;
      h0.symmetric = 0;
      w = G.vt->ns_workspace(G.ctx, 1, m, n, &h0);
      if (w > max_ns0) max_ns0 = w;
    }
    x->p_muon = (float *)dev(all * 4);
    x->p_base = (float *)dev(all * 4);
    x->mom_base = (float *)dev(all * 4);
    x->grad = (uint16_t *)dev(all * 2);
    upload_random(x->p_muon, all, 0, 0.02f, 100u + (unsigned)s);
    upload_random(x->grad, all, 1, 0.01f, 200u + (unsigned)s);
    CK_CUDA(cudaMemset(x->mom_base, 0, all * 4));
    x->p0 = (float *)xmalloc(all * 4);
    sync_all();
    CK_CUDA(cudaMemcpy(x->p0, x->p_muon, all * 4, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(x->p_base, x->p0, all * 4, cudaMemcpyHostToDevice));
  }

  /* muon: created, matrices added, planned by its first step; device memory read around each */
  f_before = free_bytes();
  desc = muon_default_desc();
  desc.hparams = md.hp;
  desc.compute = &G;
  if (muon_create(&opt, &desc) != MUON_OK) fail("muon_create", "see the logger (none set)", __LINE__);
  for (s = 0; s < N_STACKS; s++) {
    stack *x = &md.st[s];
    muon_matrix mt = muon_default_matrix();
    mt.name = x->name;
    mt.param = x->p_muon;
    mt.grad = x->grad;
    mt.rows = x->rows;
    mt.cols = x->cols;
    mt.count = md.layers;
    mt.param_dtype = MUON_DTYPE_FP32;
    mt.grad_dtype = MUON_DTYPE_BF16;
    CK_OPT(opt, muon_add_matrix(opt, &mt, NULL));
  }
  f_added = free_bytes();
  run_muon(opt);
  f_planned = free_bytes();
  CK_OPT(opt, muon_get_stats(opt, &st0));

  /* the baseline's scratch (after the measurement above), then its first step */
  md.U = (float *)dev(max_rc * 4);
  md.O = (float *)dev(max_rc * 4);
  md.X = (uint16_t *)dev(max_rc * 2);
  md.Y = (uint16_t *)dev(max_rc * 2);
  md.A = (uint16_t *)dev(max_mm * 2);
  md.B = (uint16_t *)dev(max_mm * 2);
  md.ns0 = dev(max_ns0);
  md.scratch_bytes = max_rc * 4 * 2 + max_rc * 2 * 2 + max_mm * 2 * 2 + max_ns0;
  calls0 = base_calls;
  gemms0 = base_gemms;
  run_base(&md);
  calls0 = base_calls - calls0;
  gemms0 = base_gemms - gemms0;
  CK_SLOT(G.vt->sync(G.ctx));

  /* check: the two first steps agree within bf16 NS noise */
  for (s = 0; s < N_STACKS; s++) {
    stack *x = &md.st[s];
    size_t all = (size_t)x->rows * x->cols * md.layers, i;
    float *pm = (float *)xmalloc(all * 4), *pb = (float *)xmalloc(all * 4);
    sync_all();
    CK_CUDA(cudaMemcpy(pm, x->p_muon, all * 4, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(pb, x->p_base, all * 4, cudaMemcpyDeviceToHost));
    for (i = 0; i < all; i++) {
      double d = fabs((double)pm[i] - pb[i]), u = fabs((double)pm[i] - x->p0[i]);
      if (!(d <= diff)) diff = d;   /* NaN propagates */
      if (u > upd) upd = u;
    }
    free(pm);
    free(pb);
  }
  check = upd > 0 ? diff / upd : HUGE_VAL;
  printf("  check, first step from the same params: max |muon - baseline| / max |update| = %.3g (<= %.2f: %s)\n",
         check, CHECK_TOL, check <= CHECK_TOL ? "ok" : "MISMATCH: the baseline's times below are suspect");
  /* On the stand-in (exact, deterministic) a mismatch is a bug of this file: fail. On a GPU the
     run goes on, so that one run still gives its figures. */
#ifdef MUON_CUDA_STANDIN
  if (!(check <= CHECK_TOL)) {
    fprintf(stderr, "bench_gpu: the baseline does not compute what muon_step computes (%.3g)\n", check);
    exit(1);
  }
#endif

  /* warm-up, then interleaved timed steps */
  for (r = 0; r < warm; r++) {
    run_muon(opt);
    run_base(&md);
  }
  CK_SLOT(G.vt->sync(G.ctx));
  CK_OPT(opt, muon_get_stats(opt, &st1));
  for (r = 0; r < step_runs; r++) {
    if (r % 2 == 0) {
      tm[r] = host_ms(run_muon, opt);
      tb[r] = host_ms(run_base, &md);
    } else {
      tb[r] = host_ms(run_base, &md);
      tm[r] = host_ms(run_muon, opt);
    }
  }
  CK_SLOT(G.vt->sync(G.ctx));
  CK_OPT(opt, muon_get_stats(opt, &st2));
  step_muon_ms = median(tm, step_runs);
  step_base_ms = median(tb, step_runs);

  printf("  %-44s %9s  %s\n", "", "ms", "per step");
  printf("  %-44s %9.3f  %lld backend calls, %lld host syncs, %lld NS batches\n", "muon_step (muon_cuda)",
         step_muon_ms, (st2.backend_calls - st1.backend_calls) / step_runs, (st2.syncs - st1.syncs) / step_runs,
         (st2.ns_batches - st1.ns_batches) / step_runs);
  printf("  %-44s %9.3f  %lld library calls (%lld cublasGemmEx), no host sync\n",
         "baseline (per matrix, torch.optim.Muon's ops)", step_base_ms, calls0, gemms0);
  printf("  baseline / muon_step = %.2fx   (goal >= 2x: %s)\n", step_base_ms / step_muon_ms,
         smoke ? "not judged (smoke)" : verdict(step_base_ms / step_muon_ms >= 2.0));
  printf("muon step: %.3f ms\n", step_muon_ms);
  printf("C baseline step: %.3f ms\n", step_base_ms);
  bench_state_host(&md, step_runs);

  /* 3. torch.optim.Muon */
  printf("\n-- 3. torch.optim.Muon (bench/bench_torch.py, same matrices, same GPU) --\n");
  if (torch_ms > 0) {
    printf("torch.optim.Muon step: %.3f ms   (given with --torch-ms)\n", torch_ms);
    printf("  torch.optim.Muon / muon_step = %.2fx   (goal >= 2x: %s)\n", torch_ms / step_muon_ms,
           smoke ? "not judged (smoke)" : verdict(torch_ms / step_muon_ms >= 2.0));
  } else {
    printf("  not given: run `python3 bench/bench_torch.py` and pass its 'torch.optim.Muon step: X ms' as "
           "--torch-ms X\n");
  }

  /* 4. memory */
  {
    size_t pbytes = params * 4, held = f_before - f_planned, added = f_before - f_added;
    double beyond = (double)held - (double)st0.state_bytes;
    printf("\n-- 4. device memory held by the optimizer (%zu fp32 parameters = %.1f MiB) --\n", params, mib(pbytes));
    printf("  muon_get_stats: momentum (state_bytes) %.1f MiB = %.3f x params\n", mib(st0.state_bytes),
           (double)st0.state_bytes / pbytes);
    printf("  muon_get_stats: beyond it, planned step buffers (workspace_bytes: O stash, NS operands, NS "
           "workspace) %.1f MiB = %.3f x params\n", mib(st0.workspace_bytes), (double)st0.workspace_bytes / pbytes);
    printf("                  of which NS operands held at once (gathered_bytes) %.1f MiB, NS workspace "
           "(ns_workspace_bytes) %.1f MiB\n",
           mib(st0.gathered_bytes), mib(st0.ns_workspace_bytes));
    printf("  cudaMemGetInfo: after muon_create + muon_add_matrix %.1f MiB, after planning (first step) %.1f MiB "
           "in all\n", mib(added), mib(held));
    printf("  held beyond the momentum (cudaMemGetInfo - state_bytes): %.1f MiB = %.3f x the fp32 params%s\n",
           beyond / (1024.0 * 1024.0), beyond / (double)pbytes,
           smoke ? "" : " (the driver hands out whole granules: small buffers round up)");
    printf("  (the baseline's scratch, sized for its largest matrix: %.1f MiB = %.3f x params; torch's is "
           "transient, see bench_torch.py's peak)\n",
           mib(md.scratch_bytes), (double)md.scratch_bytes / pbytes);
  }

  muon_destroy(opt);
  for (s = 0; s < N_STACKS; s++) {
    stack *x = &md.st[s];
    dev_free(x->p_muon); dev_free(x->p_base); dev_free(x->mom_base); dev_free(x->grad);
    free(x->p0);
  }
  dev_free(md.U); dev_free(md.O); dev_free(md.X); dev_free(md.Y); dev_free(md.A); dev_free(md.B); dev_free(md.ns0);
}

/* ---- main ----------------------------------------------------------------------------------- */
static void print_header(int runs, int step_runs) {
  time_t now = time(NULL);
  char date[64];
  muon_hparams hp = muon_default_hparams();
  strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", localtime(&now));
  printf("== bench_gpu: muon_cuda.h on one GPU, measured side by side in one run%s ==\n",
         smoke ? " -- SMOKE RUN: tiny shapes, the TIMES ARE MEANINGLESS, no goal is judged" : "");
  printf("load average (1 min) at start: %.2f (the host's)\n", load_average());
#ifdef MUON_CUDA_STANDIN
  printf("GPU: stand-in (tests/standin: a CPU emulation of cudart/cuBLAS; event times are host times)\n");
#else
  {
    struct cudaDeviceProp prop;
    int rt = 0, drv = 0, blas = 0;
    CK_CUDA(cudaGetDeviceProperties(&prop, 0));
    (void)cudaRuntimeGetVersion(&rt);
    (void)cudaDriverGetVersion(&drv);
    (void)cublasGetVersion(H, &blas);
    printf("GPU: %s (sm_%d%d, %d SMs, %.1f GiB); CUDA runtime %d.%d, driver %d.%d, cuBLAS %d\n", prop.name,
           prop.major, prop.minor, prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
           rt / 1000, (rt % 1000) / 10, drv / 1000, (drv % 1000) / 10, blas);
  }
#endif
  printf("date: %s\n", date);
  printf("settings: NS %d quintic steps (a, b, c) = (%.4f, %.4f, %.4f), eps %g; bf16 = MUON_PRECISION_BF16 "
         "(bf16 GEMM operands, fp32 accumulation), fp32 without TF32; cuBLAS math mode DEFAULT | "
         "DISALLOW_REDUCED_PRECISION_REDUCTION for the backend and the ceiling; %d samples per NS variant "
         "(%s, after warm-up), %d timed steps; step: lr %g, weight decay %g, momentum %g, nesterov %d\n",
         hp.ns_steps, hp.ns_coefficients[0][0], hp.ns_coefficients[0][1], hp.ns_coefficients[0][2], hp.eps,
         runs, smoke ? "one call each" : "each the mean of back-to-back calls lasting >= 2 ms", step_runs, hp.lr, hp.weight_decay, hp.momentum, hp.nesterov);
#ifdef MUON_CUDA_STANDIN
  printf("stand-in build: the backend is compiled in with MUON_CUDA_SYM_TILE %d, so 64-row operands take the "
         "symmetric tile path\n", MUON_CUDA_SYM_TILE);
#endif
}

int main(int argc, char **argv) {
  int i, quick = 0, runs = -1, step_runs = -1;
  double torch_ms = -1, t_start = now_s();
  muon_cuda_desc cd;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--smoke")) smoke = 1;
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--step-runs") && i + 1 < argc) step_runs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--torch-ms") && i + 1 < argc) torch_ms = atof(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--smoke] [--quick] [--runs N] [--step-runs N] [--torch-ms X]\n", argv[0]);
      return 2;
    }
  }
  if (runs < 0) runs = smoke ? 2 : 10;
  if (step_runs < 0) step_runs = smoke ? 2 : 20;
  if (runs < 1 || runs > MAX_RUNS || step_runs < 1 || step_runs > MAX_RUNS) {
    fprintf(stderr, "bench_gpu: --runs and --step-runs must be in 1..%d\n", MAX_RUNS);
    return 2;
  }

  CK_CUDA(cudaSetDevice(0));
  CK_CUDA(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking));
  cd = muon_cuda_default_desc();
  cd.stream = (void *)S;
  if (muon_cuda_create(&G, &cd) != MUON_OK) fail("muon_cuda_create", muon_error(NULL), __LINE__);
  CK_BLAS(cublasCreate(&H));
  CK_BLAS(cublasSetStream(H, S));
  CK_BLAS(cublasSetMathMode(H, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  CK_BLAS(cublasSetPointerMode(H, CUBLAS_POINTER_MODE_HOST));
  CK_CUDA(cudaEventCreate(&E0));
  CK_CUDA(cudaEventCreate(&E1));

  print_header(runs, step_runs);
  bench_ns(quick, runs);
  bench_step(step_runs, torch_ms);

  printf("\n-- goals%s --\n", smoke ? " (smoke: not judged)" : "");
  if (smoke) {
    printf("  none judged on a smoke run\n");
  } else {
    printf("  NS bf16 (symmetric=1) >= 0.80 of the cuBLAS ceiling at 4096^2 : %s\n",
           goal_frac[1] >= 0 ? verdict(goal_frac[1] >= 0.8) : "not measured");
    if (goal_frac[1] >= 0) printf("    (%.3f; fp32: %.3f)\n", goal_frac[1], goal_frac[0]);
    printf("  whole step >= 2x the C baseline                               : %s (%.2fx)\n",
           verdict(step_base_ms / step_muon_ms >= 2.0), step_base_ms / step_muon_ms);
    if (torch_ms > 0)
      printf("  whole step >= 2x torch.optim.Muon                             : %s (%.2fx)\n",
             verdict(torch_ms / step_muon_ms >= 2.0), torch_ms / step_muon_ms);
    else
      printf("  whole step >= 2x torch.optim.Muon                             : not measured (no --torch-ms)\n");
  }

  CK_CUDA(cudaEventDestroy(E0));
  CK_CUDA(cudaEventDestroy(E1));
  CK_BLAS(cublasDestroy(H));
  muon_compute_destroy(&G);
  CK_CUDA(cudaStreamDestroy(S));
  printf("bench_gpu: %.1f s\n", now_s() - t_start);
  return 0;
}
