/* test_cuda_slots.c - every slot of muon_cuda.h's compute backend against a plain host
   computation. Two builds of this one file (the Makefile's):

   Stand-in (no GPU; tests/standin runs the cudart / cuBLAS calls, strict like a GPU):
     gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -isystem /usr/local/cuda/include \
         -DMUON_CUDA_STANDIN -DMUON_CUDA_IMPLEMENTATION -D_GNU_SOURCE -I. -Itests \
         tests/test_cuda_slots.c tests/standin/cuda_standin.c -o build/test_cuda_slots -lm
   Real GPU (the implementation comes from nvcc's object; nvcc's host code needs -lstdc++):
     nvcc -O2 -fmad=false -I. -c examples/muon_cuda.cu -o muon_cuda.o
     gcc -std=c99 ... -isystem /usr/local/cuda/include -I. -Itests tests/test_cuda_slots.c \
         muon_cuda.o -L/usr/local/cuda/lib64 -lcudart -lcublas -lstdc++ -lm
   Fault injection, leak accounting and the forced small symmetric tiles need the stand-in; on
   a GPU those cases are skipped (the symmetric path is then checked at m = 800, where the
   default tiles take it) and the NS tolerances are the ones cuBLAS must meet.

   Checked:
   - copy (host <-> device <-> device), zero, cast (fp32 <-> bf16, same-dtype copies keep NaN
     payloads), nonfinite (fp32 and bf16, NaN / Inf first, last, none, n = 0): bit-exact;
   - pack / unpack: pieces of wide and tall (transposed operand) matrices, SHARD rectangles and
     FLAT ranges that cut rows, empty ops, more ops than one launch carries: bit-exact against
     muon__piece_operand_index, and the packed operand equals the matrix (or its transpose);
   - momentum (lerp / sgd, nesterov, update or not, u NULL, fp32 / bf16 grad, grad_scale), apply
     (fp32 / bf16 param, bf16 mirror, nearest / stochastic rounding of a FLAT piece; cautious
     decay at weights and updates of +-0 against the formula, tests/cautious.h), scale
     (muon_qk_clip's rows: the same dtypes, mirror and roundings), AdamW
     (fp32 / bf16 param and grad, mirror, stochastic): bit-exact against the MUON__HD functions
     on the host (nvcc -fmad=false), on sizes that need several grid-stride passes;
   - Newton-Schulz against muon_newton_schulz (the CPU) at several shapes, batch 1 and 3, both
     presets, symmetric hint on and off: fp32 within 1e-5 relative, bf16 within 4e-2 with every
     output a bf16 value; zero input gives zeros; batch 3 equals three batch-1 runs bitwise; two
     runs give the same bits; the symmetric path (8-row tiles on the stand-in, see below)
     within fp32 rounding of the plain GEMMs, and really taken;
   - normuon against the CPU backend's slot (muon_compute_cpu): ROWS and LARGER, per row and per
     column, 1x1 to 128x512, v zero or not, beta2 0.95 and 0, tiny X (the epsilons): X and v_new within 1e-5 relative
     (the kernels sum in the CPU's order: bitwise in practice), v untouched, every v_new element
     written, hp read before the slot returns; zero X gives zeros and v_new = beta2 v; two runs
     give the same bits; the stand-in: device inputs, three launches and no wait in the slot;
   - errors (stand-in): injected cuBLAS, memcpy, kernel, allocation and creation failures give
     MUON_ERR_BACKEND (or NULL) with the native text, sync reports the first failure once;
     nothing leaks. Both: bad arguments are MUON_ERR_ARG; a trainer's own stream and cuBLAS
     handle can be shared. */
#define MUON_IMPLEMENTATION
#ifdef MUON_CUDA_STANDIN
/* Small tiles so the symmetric path (hp.symmetric, the default) runs at test sizes: m >= 16. */
#define MUON_CUDA_SYM_TILE 8
#define MUON_CUDA_SYM_MIN_TILES 2
#define MUON_CUDA_SYM_MIN_TILES_BF16 2
#endif
#include "muon.h"
#include "muon_cuda.h"
#include "test.h"
#include "cautious.h"
#ifdef MUON_CUDA_STANDIN
#include "standin/standin.h"
#else
#include <cuda_runtime_api.h>
#endif
#include <cublas_v2.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NS_FP32_TOL 1e-5
#define NS_BF16_TOL 4e-2
#define NS_GRAM_BF16_TOL 1e-1   /* bf16 Gram NS amplifies accumulation-order differences (m x m
                                   products of P, whose Polar Express entries reach ~20): 6.5e-2
                                   measured at 10x24 with Polar Express, <= 4e-2 with quintic */

static muon_compute G;
static double worst_fp32, worst_bf16, worst_gram_bf16; /* observed NS errors, printed at the end */

/* ---- helpers --------------------------------------------------------------------------------- */
static uint32_t rng_state = 12345u;
static uint32_t rng_u32(void) {
  rng_state = rng_state * 1664525u + 1013904223u;
  return rng_state;
}
/* Uniform in [-1, 1). */
static float frand(void) { return (float)((double)(rng_u32() >> 8) / 8388608.0 - 1.0); }

static float bits_f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static uint32_t f_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) { printf("out of host memory\n"); exit(2); }
  return p;
}

static void *dalloc(size_t bytes) {
  void *p = G.vt->alloc(G.ctx, bytes ? bytes : 4);
  CHECK(p != NULL, "alloc(%zu) failed: %s", bytes, G.vt->error(G.ctx));
  return p;
}
static void dfree(void *p) { G.vt->free(G.ctx, p); }

static void up(void *d, const void *h, size_t bytes) {
  muon_status st = G.vt->copy(G.ctx, d, h, bytes, 0, 1);
  CHECK(st == MUON_OK, "copy to device: %s", G.vt->error(G.ctx));
}
static void down(void *h, const void *d, size_t bytes) {
  muon_status st = G.vt->copy(G.ctx, h, d, bytes, 1, 0);
  CHECK(st == MUON_OK, "copy to host: %s", G.vt->error(G.ctx));
}
static int sync_ok(void) {
  muon_status st = G.vt->sync(G.ctx);
  CHECK(st == MUON_OK, "sync: %s: %s", muon_status_string(st), G.vt->error(G.ctx));
  return st == MUON_OK;
}

/* 1 if equal bytes; else prints the first few differing 16/32-bit words. */
static int same_bits(const void *got, const void *want, size_t n, size_t elem, const char *what) {
  const unsigned char *a = (const unsigned char *)got, *b = (const unsigned char *)want;
  size_t i, shown = 0;
  if (memcmp(a, b, n * elem) == 0) return 1;
  for (i = 0; i < n && shown < 4; i++) {
    if (memcmp(a + i * elem, b + i * elem, elem) == 0) continue;
    if (elem == 4) {
      uint32_t x, y;
      memcpy(&x, a + i * 4, 4);
      memcpy(&y, b + i * 4, 4);
      CHECK(0, "%s: element %zu: got 0x%08x (%g), want 0x%08x (%g)", what, i, (unsigned)x, (double)bits_f(x),
            (unsigned)y, (double)bits_f(y));
    } else {
      uint16_t x, y;
      memcpy(&x, a + i * 2, 2);
      memcpy(&y, b + i * 2, 2);
      CHECK(0, "%s: element %zu: got 0x%04x, want 0x%04x", what, i, (unsigned)x, (unsigned)y);
    }
    shown++;
  }
  return 0;
}

/* Stand-in hooks, or what a real GPU allows in their place. */
#ifdef MUON_CUDA_STANDIN
#define STANDIN 1
static long long tile_gemms(void) { return muon_standin_calls("cublasGemmBatchedEx"); }
static size_t device_bytes(void) { return muon_standin_device_bytes(); }
#else
#define STANDIN 0
static long long tile_gemms(void) { return -1; } /* unknown */
static size_t device_bytes(void) { return 0; }
#endif

/* test_rel_err, but a NaN or Inf in `got` is an infinite error (test_rel_err skips NaNs). */
static double rel_err(const float *got, const double *want, size_t n, size_t *worst) {
  size_t i;
  for (i = 0; i < n; i++)
    if (!muon__finite(got[i])) { if (worst) *worst = i; return 1e300; }
  return test_rel_err(got, want, n, worst);
}

/* Random floats with awkward values sprinkled in (finite unless allow_nonfinite). */
static void fill(float *x, size_t n, float scale, int allow_nonfinite) {
  static const uint32_t special[] = {
    0x00000000u, 0x80000000u, 0x3f800000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x3f808000u, 0x3f818000u,
    0xbf808000u, 0x3f80ffffu, 0x7f7f8000u, 0x00008000u, 0x7fc00000u, 0xff800000u, 0x7f800000u, 0x7f800001u};
  size_t i, n_special = allow_nonfinite ? 16 : 12;
  for (i = 0; i < n; i++) x[i] = scale * frand();
  for (i = 0; i < n && i < 64; i += 5) x[(i * 7919) % n] = bits_f(special[(i / 5) % n_special]);
}

static void fill_bf16(uint16_t *h, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) h[i] = muon__bf16_bits(muon__bf16(frand()));
}

/* ---- copy, zero ------------------------------------------------------------------------------ */
static void test_copy_zero(void) {
  size_t n = 1000 + 37, i;
  float *h = (float *)xmalloc(n * 4), *back = (float *)xmalloc(n * 4), *zeros = (float *)xmalloc(n * 4);
  float *d1, *d2;
  TEST_CASE("copy host->device->device->host, zero, size 0");
  fill(h, n, 3.0f, 1);
  memset(zeros, 0, n * 4);
  d1 = (float *)dalloc(n * 4);
  d2 = (float *)dalloc(n * 4);
  up(d1, h, n * 4);
  CHECK(G.vt->copy(G.ctx, d2, d1, n * 4, 0, 0) == MUON_OK, "device copy");
  CHECK(G.vt->copy(G.ctx, d2, d1, 0, 0, 0) == MUON_OK, "copy of 0 bytes");
  memset(back, 0xab, n * 4);
  down(back, d2, n * 4);
  if (sync_ok()) same_bits(back, h, n, 4, "copy");
  CHECK(G.vt->zero(G.ctx, d2 + 3, (n - 10) * 4) == MUON_OK, "zero");
  CHECK(G.vt->zero(G.ctx, d2, 0) == MUON_OK, "zero of 0 bytes");
  down(back, d2, n * 4);
  if (sync_ok()) {
    for (i = 0; i < n; i++) if (i >= 3 && i < n - 7) h[i] = 0.0f;
    same_bits(back, h, n, 4, "zero");
  }
  dfree(d1);
  dfree(d2);
  free(h); free(back); free(zeros);
}

/* ---- cast -------------------------------------------------------------------------------------- */
static void test_cast(void) {
  size_t sizes[] = {0, 1, 255, 256, 1000 + 37}, s, i;
  TEST_CASE("cast fp32 <-> bf16 (nearest even), same-dtype copies keep every bit");
  for (s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t n = sizes[s];
    float *f = (float *)xmalloc(n * 4), *fback = (float *)xmalloc(n * 4), *fwant = (float *)xmalloc(n * 4);
    uint16_t *b = (uint16_t *)xmalloc(n * 2), *bback = (uint16_t *)xmalloc(n * 2), *bwant = (uint16_t *)xmalloc(n * 2);
    float *df = (float *)dalloc(n * 4), *df2 = (float *)dalloc(n * 4);
    uint16_t *db = (uint16_t *)dalloc(n * 2), *db2 = (uint16_t *)dalloc(n * 2);
    fill(f, n, 100.0f, 1);
    for (i = 0; i < n; i++) b[i] = (uint16_t)(rng_u32() >> 16); /* every bf16 pattern, NaNs too */
    if (n > 2) { b[0] = 0x7f81; b[1] = 0xff80; } /* a signalling NaN, -Inf */
    for (i = 0; i < n; i++) {
      bwant[i] = muon__bf16_bits(muon__bf16(f[i]));
      fwant[i] = muon__from_bf16(b[i]);
    }
    up(df, f, n * 4);
    up(db, b, n * 2);
    CHECK(G.vt->cast(G.ctx, db2, MUON_DTYPE_BF16, df, MUON_DTYPE_FP32, n) == MUON_OK, "cast fp32->bf16");
    CHECK(G.vt->cast(G.ctx, df2, MUON_DTYPE_FP32, db, MUON_DTYPE_BF16, n) == MUON_OK, "cast bf16->fp32");
    down(bback, db2, n * 2);
    down(fback, df2, n * 4);
    if (sync_ok()) {
      same_bits(bback, bwant, n, 2, "fp32->bf16");
      same_bits(fback, fwant, n, 4, "bf16->fp32");
    }
    CHECK(G.vt->cast(G.ctx, df2, MUON_DTYPE_FP32, df, MUON_DTYPE_FP32, n) == MUON_OK, "cast fp32->fp32");
    CHECK(G.vt->cast(G.ctx, db2, MUON_DTYPE_BF16, db, MUON_DTYPE_BF16, n) == MUON_OK, "cast bf16->bf16");
    down(fback, df2, n * 4);
    down(bback, db2, n * 2);
    if (sync_ok()) {
      same_bits(fback, f, n, 4, "fp32->fp32");
      same_bits(bback, b, n, 2, "bf16->bf16");
    }
    dfree(df); dfree(df2); dfree(db); dfree(db2);
    free(f); free(fback); free(fwant); free(b); free(bback); free(bwant);
  }
}

/* ---- nonfinite --------------------------------------------------------------------------------- */
static int nonfinite_of(const void *host, muon_dtype dt, size_t n) {
  size_t elem = dt == MUON_DTYPE_BF16 ? 2 : 4;
  void *d = dalloc(n * elem);
  int *flag = (int *)dalloc(sizeof(int)), seven = 7, got = -1;
  up(d, host, n * elem);
  up(flag, &seven, sizeof seven); /* the slot must clear it */
  CHECK(G.vt->nonfinite(G.ctx, d, dt, n, flag) == MUON_OK, "nonfinite: %s", G.vt->error(G.ctx));
  down(&got, flag, sizeof got);
  sync_ok();
  dfree(d);
  dfree(flag);
  return got;
}

static void test_nonfinite(void) {
  size_t n = 2000 + 3, i;
  float *f = (float *)xmalloc(n * 4);
  uint16_t *b = (uint16_t *)xmalloc(n * 2);
  static const uint32_t bad[] = {0x7fc00000u, 0xffc00000u, 0x7f800000u, 0xff800000u, 0x7f800001u};
  size_t k;
  TEST_CASE("nonfinite: NaN / Inf anywhere, fp32 and bf16, n = 0");
  fill(f, n, 1e30f, 0);
  fill_bf16(b, n);
  CHECK(nonfinite_of(f, MUON_DTYPE_FP32, n) == 0, "finite fp32 flagged");
  CHECK(nonfinite_of(b, MUON_DTYPE_BF16, n) == 0, "finite bf16 flagged");
  CHECK(nonfinite_of(f, MUON_DTYPE_FP32, 0) == 0, "n = 0 must give 0");
  for (k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    size_t where[3];
    where[0] = 0; where[1] = n / 2; where[2] = n - 1;
    for (i = 0; i < 3; i++) {
      float keep = f[where[i]];
      uint16_t keepb = b[where[i]];
      f[where[i]] = bits_f(bad[k]);
      b[where[i]] = (uint16_t)(bad[k] >> 16);
      CHECK(nonfinite_of(f, MUON_DTYPE_FP32, n) == 1, "fp32 0x%08x at %zu not flagged", (unsigned)bad[k], where[i]);
      CHECK(nonfinite_of(b, MUON_DTYPE_BF16, n) == 1, "bf16 0x%04x at %zu not flagged", (unsigned)(bad[k] >> 16), where[i]);
      /* the bad element just past n must not count */
      CHECK(nonfinite_of(f, MUON_DTYPE_FP32, where[i]) == 0, "fp32 element %zu counted with n = %zu", where[i], where[i]);
      f[where[i]] = keep;
      b[where[i]] = keepb;
    }
  }
  free(f);
  free(b);
}

/* ---- pack / unpack ------------------------------------------------------------------------------ */
/* Ops for one matrix: its rows x cols split into a 2 x 3 grid of rectangles (uneven), every
   rectangle split into `flat` FLAT ranges (cutting rows), plus an empty op. */
static int make_ops(muon_piece_copy *ops, int rows, int cols, int flat, size_t *piece_off, size_t operand) {
  long long rcut[3], ccut[4];
  int i, j, f, n = 0;
  rcut[0] = 0; rcut[1] = (rows + 1) / 2; rcut[2] = rows;
  ccut[0] = 0; ccut[1] = cols / 3; ccut[2] = cols / 3 + (cols + 2) / 3; ccut[3] = cols;
  for (i = 0; i < 2; i++)
    for (j = 0; j < 3; j++) {
      long long h = rcut[i + 1] - rcut[i], w = ccut[j + 1] - ccut[j], len = h * w;
      for (f = 0; f < flat; f++) {
        muon_piece_copy *p = &ops[n++];
        memset(p, 0, sizeof *p);
        p->r0 = rcut[i]; p->c0 = ccut[j]; p->h = h; p->w = w;
        p->f0 = len * f / flat; p->f1 = len * (f + 1) / flat;
        p->rows = rows; p->cols = cols;
        p->piece = *piece_off;
        p->operand = operand;
        *piece_off += (size_t)(p->f1 - p->f0);
      }
    }
  memset(&ops[n], 0, sizeof ops[n]); /* an empty op */
  ops[n].h = 1; ops[n].w = 1; ops[n].rows = rows; ops[n].cols = cols; ops[n].piece = *piece_off; ops[n].operand = operand;
  return n + 1;
}

static void test_pack(void) {
  int shapes[3][2] = {{7, 11}, {13, 5}, {6, 6}}; /* wide, tall (transposed), square */
  muon_piece_copy ops[3 * 6 * 5 + 3];
  size_t operand_off[4], piece_total = 0, operand_total, i;
  int n_ops = 0, s, k;
  float *full[3], *pieces, *operands, *want_ops, *got, *dp, *dop;
  TEST_CASE("pack / unpack: SHARD and FLAT pieces, transposed operands, > 16 ops per call");
  operand_off[0] = 3; /* operands do not start at 0 */
  for (s = 0; s < 3; s++) operand_off[s + 1] = operand_off[s] + (size_t)shapes[s][0] * shapes[s][1];
  operand_total = operand_off[3] + 2;
  for (s = 0; s < 3; s++) n_ops += make_ops(ops + n_ops, shapes[s][0], shapes[s][1], s == 2 ? 1 : 4 + s, &piece_total, operand_off[s]);
  CHECK(n_ops > 2 * 16, "want several launches of 16 ops (%d ops)", n_ops);
  for (s = 0; s < 3; s++) {
    size_t mn = (size_t)shapes[s][0] * shapes[s][1];
    full[s] = (float *)xmalloc(mn * 4);
    fill(full[s], mn, 1.0f, 1);
  }
  pieces = (float *)xmalloc(piece_total * 4);
  operands = (float *)xmalloc(operand_total * 4);
  want_ops = (float *)xmalloc(operand_total * 4);
  got = (float *)xmalloc((piece_total > operand_total ? piece_total : operand_total) * 4);
  /* each piece element from its matrix (host indexing of the layout's definition) */
  for (k = 0; k < n_ops; k++) {
    const muon_piece_copy *p = &ops[k];
    for (s = 0; s < 3; s++) if (p->operand == operand_off[s]) break;
    for (i = 0; i < (size_t)(p->f1 - p->f0); i++) {
      long long f = p->f0 + (long long)i, row = p->r0 + f / p->w, col = p->c0 + f % p->w;
      pieces[p->piece + i] = full[s][row * p->cols + col];
    }
  }
  /* the operand must be the matrix (rows <= cols) or its transpose */
  for (i = 0; i < operand_total; i++) want_ops[i] = bits_f(0x7fc0beefu); /* untouched guard value */
  for (s = 0; s < 3; s++) {
    int r, c, rows = shapes[s][0], cols = shapes[s][1];
    for (r = 0; r < rows; r++)
      for (c = 0; c < cols; c++)
        want_ops[operand_off[s] + (rows <= cols ? (size_t)r * cols + c : (size_t)c * rows + r)] = full[s][(size_t)r * cols + c];
  }
  for (i = 0; i < operand_total; i++) operands[i] = bits_f(0x7fc0beefu);
  dp = (float *)dalloc(piece_total * 4);
  dop = (float *)dalloc(operand_total * 4);
  up(dp, pieces, piece_total * 4);
  up(dop, operands, operand_total * 4);
  CHECK(G.vt->pack(G.ctx, ops, n_ops, dp, dop, 1) == MUON_OK, "pack: %s", G.vt->error(G.ctx));
  down(got, dop, operand_total * 4);
  if (sync_ok()) same_bits(got, want_ops, operand_total, 4, "pieces -> operands");
  /* muon__piece_operand_index (what the kernel uses) agrees with the layout's definition */
  memcpy(got, operands, operand_total * 4);
  for (k = 0; k < n_ops; k++)
    for (i = 0; i < (size_t)(ops[k].f1 - ops[k].f0); i++)
      got[ops[k].operand + (size_t)muon__piece_operand_index(&ops[k], (long long)i)] = pieces[ops[k].piece + i];
  same_bits(got, want_ops, operand_total, 4, "host muon__piece_operand_index");
  /* unpack into a poisoned piece buffer */
  CHECK(G.vt->zero(G.ctx, dp, piece_total * 4) == MUON_OK, "zero");
  CHECK(G.vt->pack(G.ctx, ops, n_ops, dp, dop, 0) == MUON_OK, "unpack: %s", G.vt->error(G.ctx));
  down(got, dp, piece_total * 4);
  if (sync_ok()) same_bits(got, pieces, piece_total, 4, "operands -> pieces");
  CHECK(G.vt->pack(G.ctx, ops, 0, dp, dop, 1) == MUON_OK, "pack of 0 ops");
  sync_ok();
  dfree(dp);
  dfree(dop);
  for (s = 0; s < 3; s++) free(full[s]);
  free(pieces); free(operands); free(want_ops); free(got);
}

/* ---- momentum ------------------------------------------------------------------------------------ */
static void test_momentum(void) {
  size_t n = (size_t)4096 * 256 + 77, i; /* > muon_cuda.h's largest grid (4096 x 256): stride loop */
  float *b0 = (float *)xmalloc(n * 4), *g = (float *)xmalloc(n * 4), *bw = (float *)xmalloc(n * 4);
  float *uw = (float *)xmalloc(n * 4), *got = (float *)xmalloc(n * 4);
  uint16_t *gb = (uint16_t *)xmalloc(n * 2);
  float *dm = (float *)dalloc(n * 4), *du = (float *)dalloc(n * 4), *dg = (float *)dalloc(n * 4);
  uint16_t *dgb = (uint16_t *)dalloc(n * 2);
  int sgd, nest, upd, bf, with_u;
  TEST_CASE("momentum: lerp / sgd, nesterov, update, u NULL, fp32 / bf16 grad, grad_scale");
  fill(b0, n, 1.0f, 0);
  fill(g, n, 2.0f, 0);
  fill_bf16(gb, n);
  up(dg, g, n * 4);
  up(dgb, gb, n * 2);
  for (sgd = 0; sgd < 2; sgd++)
    for (nest = 0; nest < 2; nest++)
      for (upd = 0; upd < 2; upd++)
        for (bf = 0; bf < 2; bf++)
          for (with_u = 0; with_u < 2; with_u++) {
            muon_momentum_args a;
            const void *hg = bf ? (const void *)gb : (const void *)g;
            memset(&a, 0, sizeof a);
            a.mu = 0.95f; a.nesterov = nest; a.sgd = sgd; a.grad_scale = bf ? 0.37f : 1.0f;
            a.grad_dtype = bf ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
            if (!upd && !with_u) continue;
            memcpy(bw, b0, n * 4);
            for (i = 0; i < n; i++) uw[i] = muon__momentum_at(bw, i, hg, &a, upd);
            up(dm, b0, n * 4);
            CHECK(G.vt->zero(G.ctx, du, n * 4) == MUON_OK, "zero");
            CHECK(G.vt->momentum(G.ctx, n, dm, bf ? (const void *)dgb : (const void *)dg, &a, upd, with_u ? du : NULL) == MUON_OK,
                  "momentum: %s", G.vt->error(G.ctx));
            down(got, dm, n * 4);
            if (!sync_ok()) continue;
            if (!same_bits(got, bw, n, 4, "momentum buffer"))
              printf("    (sgd %d nesterov %d update %d bf16 %d u %d)\n", sgd, nest, upd, bf, with_u);
            if (with_u) {
              down(got, du, n * 4);
              if (sync_ok() && !same_bits(got, uw, n, 4, "U"))
                printf("    (sgd %d nesterov %d update %d bf16 %d)\n", sgd, nest, upd, bf);
            }
          }
  {
    muon_momentum_args a;
    memset(&a, 0, sizeof a);
    a.mu = 0.9f; a.grad_scale = 1.0f;
    CHECK(G.vt->momentum(G.ctx, 0, dm, dg, &a, 1, du) == MUON_OK, "momentum of 0 elements");
    sync_ok();
  }
  dfree(dm); dfree(du); dfree(dg); dfree(dgb);
  free(b0); free(g); free(bw); free(uw); free(got); free(gb);
}

/* ---- apply ----------------------------------------------------------------------------------------- */
static void test_apply(void) {
  /* a FLAT piece cutting rows of a 37 x 53 matrix: rows 3.. of the 30 x 41 rectangle at (4, 9) */
  muon_piece_copy piece;
  size_t n, i;
  int bf, mirror, sr;
  float *p0, *O, *pw, *gotf;
  uint16_t *p0b, *pwb, *mw, *gotb;
  void *dp, *dmirror;
  float *dO;
  memset(&piece, 0, sizeof piece);
  piece.r0 = 4; piece.c0 = 9; piece.h = 30; piece.w = 41; piece.f0 = 100; piece.f1 = 30 * 41 - 17;
  piece.rows = 37; piece.cols = 53;
  n = (size_t)(piece.f1 - piece.f0);
  p0 = (float *)xmalloc(n * 4); O = (float *)xmalloc(n * 4); pw = (float *)xmalloc(n * 4); gotf = (float *)xmalloc(n * 4);
  p0b = (uint16_t *)xmalloc(n * 2); pwb = (uint16_t *)xmalloc(n * 2); mw = (uint16_t *)xmalloc(n * 2);
  gotb = (uint16_t *)xmalloc(n * 2);
  dp = dalloc(n * 4); dmirror = dalloc(n * 2); dO = (float *)dalloc(n * 4);
  TEST_CASE("apply: fp32 / bf16 param, bf16 mirror, nearest / stochastic rounding of a FLAT piece");
  fill(p0, n, 1.0f, 0);
  fill(O, n, 1.0f, 0);
  fill_bf16(p0b, n);
  up(dO, O, n * 4);
  for (bf = 0; bf < 2; bf++)
    for (mirror = 0; mirror < 2; mirror++)
      for (sr = 0; sr < 2; sr++) {
        muon_apply_args a, ah;
        memset(&a, 0, sizeof a);
        a.decay = 1.0f - 0.02f * 0.1f; a.step = 0.02f * 1.3f;
        a.param_dtype = bf ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
        a.rounding = sr ? MUON_ROUND_STOCHASTIC : MUON_ROUND_NEAREST;
        a.seed = 0x1234567890abcdefull;
        a.cautious = mirror ^ sr;   /* cautious decay on half the combinations, fp32 and bf16 alike */
        a.piece = piece;
        a.mirror = mirror ? dmirror : NULL;
        ah = a;
        ah.mirror = mirror ? (void *)mw : NULL;
        if (bf) memcpy(pwb, p0b, n * 2); else memcpy(pw, p0, n * 4);
        for (i = 0; i < n; i++) muon__apply_store(bf ? (void *)pwb : (void *)pw, i, O, &ah);
        if (bf) up(dp, p0b, n * 2); else up(dp, p0, n * 4);
        CHECK(G.vt->zero(G.ctx, dmirror, n * 2) == MUON_OK, "zero");
        CHECK(G.vt->apply(G.ctx, n, dp, dO, &a) == MUON_OK, "apply: %s", G.vt->error(G.ctx));
        if (bf) down(gotb, dp, n * 2); else down(gotf, dp, n * 4);
        if (!sync_ok()) continue;
        if (!(bf ? same_bits(gotb, pwb, n, 2, "bf16 param") : same_bits(gotf, pw, n, 4, "fp32 param")))
          printf("    (bf16 %d mirror %d stochastic %d)\n", bf, mirror, sr);
        if (mirror) {
          down(gotb, dmirror, n * 2);
          if (sync_ok() && !same_bits(gotb, mw, n, 2, "mirror")) printf("    (bf16 %d stochastic %d)\n", bf, sr);
        }
      }
  dfree(dp); dfree(dmirror); dfree(dO);
  free(p0); free(O); free(pw); free(gotf); free(p0b); free(pwb); free(mw); free(gotb);
}

/* scale (muon_qk_clip's rows): bitwise the host's muon__scale_store, every dtype and rounding. */
static void test_scale(void) {
  muon_piece_copy piece;
  size_t n, i;
  int bf, mirror, sr;
  float *p0, *pw, *gotf;
  uint16_t *p0b, *pwb, *mw, *gotb;
  void *dp, *dmirror;
  memset(&piece, 0, sizeof piece);
  piece.r0 = 4; piece.c0 = 9; piece.h = 30; piece.w = 41; piece.f0 = 100; piece.f1 = 30 * 41 - 17;
  piece.rows = 37; piece.cols = 53;
  n = (size_t)(piece.f1 - piece.f0);
  p0 = (float *)xmalloc(n * 4); pw = (float *)xmalloc(n * 4); gotf = (float *)xmalloc(n * 4);
  p0b = (uint16_t *)xmalloc(n * 2); pwb = (uint16_t *)xmalloc(n * 2); mw = (uint16_t *)xmalloc(n * 2);
  gotb = (uint16_t *)xmalloc(n * 2);
  dp = dalloc(n * 4); dmirror = dalloc(n * 2);
  TEST_CASE("scale: fp32 / bf16 param, bf16 mirror, nearest / stochastic rounding of a FLAT piece");
  CHECK(G.vt->scale != NULL, "the scale slot is NULL");
  fill(p0, n, 1.0f, 0);
  fill_bf16(p0b, n);
  for (bf = 0; bf < 2 && G.vt->scale; bf++)
    for (mirror = 0; mirror < 2; mirror++)
      for (sr = 0; sr < 2; sr++) {
        muon_apply_args a, ah;
        float factor = 0.7315f;
        memset(&a, 0, sizeof a);
        a.param_dtype = bf ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
        a.rounding = sr ? MUON_ROUND_STOCHASTIC : MUON_ROUND_NEAREST;
        a.seed = 0x1234567890abcdefull;
        a.piece = piece;
        a.mirror = mirror ? dmirror : NULL;
        ah = a;
        ah.mirror = mirror ? (void *)mw : NULL;
        if (bf) memcpy(pwb, p0b, n * 2); else memcpy(pw, p0, n * 4);
        for (i = 0; i < n; i++) muon__scale_store(bf ? (void *)pwb : (void *)pw, i, factor, &ah);
        if (bf) up(dp, p0b, n * 2); else up(dp, p0, n * 4);
        CHECK(G.vt->zero(G.ctx, dmirror, n * 2) == MUON_OK, "zero");
        CHECK(G.vt->scale(G.ctx, n, dp, factor, &a) == MUON_OK, "scale: %s", G.vt->error(G.ctx));
        CHECK(G.vt->scale(G.ctx, 0, dp, factor, &a) == MUON_OK, "scale of nothing: %s", G.vt->error(G.ctx));
        if (bf) down(gotb, dp, n * 2); else down(gotf, dp, n * 4);
        if (!sync_ok()) continue;
        if (!(bf ? same_bits(gotb, pwb, n, 2, "bf16 param") : same_bits(gotf, pw, n, 4, "fp32 param")))
          printf("    (bf16 %d mirror %d stochastic %d)\n", bf, mirror, sr);
        if (mirror) {
          down(gotb, dmirror, n * 2);
          if (sync_ok() && !same_bits(gotb, mw, n, 2, "mirror")) printf("    (bf16 %d stochastic %d)\n", bf, sr);
        }
      }
  dfree(dp); dfree(dmirror);
  free(p0); free(pw); free(gotf); free(p0b); free(pwb); free(mw); free(gotb);
}

/* blockwise (MUON_MOMENTUM_INT8): bitwise the host's muon__q8_encode / muon__q8_decode, a short
   last block, tiny, huge, zero and negative-zero blocks. */
static void test_blockwise(void) {
  const size_t n = 5 * 256 + 37, nb = (n + 255) / 256, bytes = n + nb;
  float *x = (float *)xmalloc(n * 4), *back = (float *)xmalloc(n * 4), *got = (float *)xmalloc(n * 4);
  unsigned char *q = (unsigned char *)xmalloc(bytes), *gotq = (unsigned char *)xmalloc(bytes);
  void *dx = dalloc(n * 4), *dq = dalloc(bytes);
  size_t b, i;
  TEST_CASE("blockwise: int8 blocks to and from fp32, bitwise the host's formulas");
  CHECK(G.vt->blockwise != NULL, "the blockwise slot is NULL");
  fill(x, n, 3.0f, 0);
  for (i = 256; i < 512; i++) x[i] *= 1e-37f;           /* block 1: near the smallest scale */
  for (i = 512; i < 768; i++) x[i] *= 1e37f;            /* block 2: near the largest */
  for (i = 768; i < 1024; i++) x[i] = i & 1 ? -0.0f : 0.0f;   /* block 3: zeros */
  for (b = 0; b < nb; b++) {
    size_t lo = b * 256, c = n - lo < 256 ? n - lo : 256;
    muon__q8_encode(x + lo, c, q + b * 257);
    muon__q8_decode(q + b * 257, c, back + lo);
  }
  if (G.vt->blockwise) {
    up(dx, x, n * 4);
    CHECK(G.vt->blockwise(G.ctx, 1, n, (float *)dx, dq) == MUON_OK, "to int8: %s", G.vt->error(G.ctx));
    CHECK(G.vt->blockwise(G.ctx, 1, 0, (float *)dx, dq) == MUON_OK, "nothing: %s", G.vt->error(G.ctx));
    down(gotq, dq, bytes);
    if (sync_ok()) CHECK(memcmp(gotq, q, bytes) == 0, "int8 blocks differ from muon__q8_encode's");
    CHECK(G.vt->zero(G.ctx, dx, n * 4) == MUON_OK, "zero");
    CHECK(G.vt->blockwise(G.ctx, 0, n, (float *)dx, dq) == MUON_OK, "to fp32: %s", G.vt->error(G.ctx));
    down(got, dx, n * 4);
    if (sync_ok()) same_bits(got, back, n, 4, "fp32 values");
  }
  dfree(dx); dfree(dq);
  free(x); free(back); free(got); free(q); free(gotq);
}

/* apply's cautious decay at the signs of zero (tests/cautious.h): bitwise the cautious_wd formula. */
static void test_cautious_zeros(void) {
  muon_apply_args a;
  float w[CAUTIOUS_N], o[CAUTIOUS_N], got[CAUTIOUS_N];
  float *dw = (float *)dalloc(sizeof w), *dO = (float *)dalloc(sizeof o);
  int i;
  TEST_CASE("apply: cautious decay with weights and updates of +0 and -0, decays exactly where w*O >= 0");
  cautious_args(&a);
  for (i = 0; i < CAUTIOUS_N; i++) cautious_case(i, &w[i], &o[i]);
  up(dw, w, sizeof w);
  up(dO, o, sizeof o);
  CHECK(G.vt->apply(G.ctx, CAUTIOUS_N, dw, dO, &a) == MUON_OK, "apply: %s", G.vt->error(G.ctx));
  down(got, dw, sizeof got);
  if (sync_ok())
    for (i = 0; i < CAUTIOUS_N; i++) {
      float want = cautious_ref(w[i], o[i], a.decay, a.step);
      CHECK(memcmp(&got[i], &want, 4) == 0, "w %g, O %g: got %a, want %a", (double)w[i], (double)o[i],
            (double)got[i], (double)want);
    }
  dfree(dw); dfree(dO);
}

/* ---- AdamW --------------------------------------------------------------------------------------- */
static void test_adamw(void) {
  size_t n = 3000 + 11, i;
  int pbf, gbf, mirror, sr;
  float *p0 = (float *)xmalloc(n * 4), *g = (float *)xmalloc(n * 4), *m0 = (float *)xmalloc(n * 4);
  float *v0 = (float *)xmalloc(n * 4), *pw = (float *)xmalloc(n * 4), *mw = (float *)xmalloc(n * 4);
  float *vw = (float *)xmalloc(n * 4), *got = (float *)xmalloc(n * 4);
  uint16_t *p0b = (uint16_t *)xmalloc(n * 2), *gb = (uint16_t *)xmalloc(n * 2), *pwb = (uint16_t *)xmalloc(n * 2);
  uint16_t *mirw = (uint16_t *)xmalloc(n * 2), *gotb = (uint16_t *)xmalloc(n * 2);
  void *dp = dalloc(n * 4), *dg = dalloc(n * 4), *dmirror = dalloc(n * 2);
  float *dm = (float *)dalloc(n * 4), *dv = (float *)dalloc(n * 4);
  TEST_CASE("adamw: fp32 / bf16 param and grad, mirror, nearest / stochastic");
  fill(p0, n, 1.0f, 0);
  fill(g, n, 0.1f, 0);
  fill(m0, n, 0.01f, 0);
  for (i = 0; i < n; i++) v0[i] = 1e-4f * (frand() + 1.0f);
  fill_bf16(p0b, n);
  fill_bf16(gb, n);
  for (pbf = 0; pbf < 2; pbf++)
    for (gbf = 0; gbf < 2; gbf++)
      for (mirror = 0; mirror < 2; mirror++)
        for (sr = 0; sr < 2; sr++) {
          muon_adamw_args a, ah;
          memset(&a, 0, sizeof a);
          a.beta1 = 0.9f; a.beta2 = 0.999f; a.eps = 1e-8f; a.decay = 1.0f - 1e-3f * 0.01f;
          a.step_size = 1e-3f / (1.0f - 0.9f * 0.9f * 0.9f);
          a.bc2_sqrt = (float)sqrt(1.0 - 0.999 * 0.999 * 0.999);
          a.grad_scale = gbf ? 0.5f : 1.0f;
          a.grad_dtype = gbf ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
          a.param_dtype = pbf ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
          a.rounding = sr ? MUON_ROUND_STOCHASTIC : MUON_ROUND_NEAREST;
          a.seed = 99 + (unsigned long long)sr;
          a.offset = sr ? 1000003 : 0;   /* a ZeRO piece's bits: element i draws at offset + i */
          a.cautious = mirror ^ sr ^ gbf;
          a.mirror = mirror ? dmirror : NULL;
          ah = a;
          ah.mirror = mirror ? (void *)mirw : NULL;
          if (pbf) memcpy(pwb, p0b, n * 2); else memcpy(pw, p0, n * 4);
          memcpy(mw, m0, n * 4);
          memcpy(vw, v0, n * 4);
          for (i = 0; i < n; i++)
            muon__adamw_store(pbf ? (void *)pwb : (void *)pw, i, gbf ? (const void *)gb : (const void *)g, mw, vw, &ah);
          if (pbf) up(dp, p0b, n * 2); else up(dp, p0, n * 4);
          if (gbf) up(dg, gb, n * 2); else up(dg, g, n * 4);
          up(dm, m0, n * 4);
          up(dv, v0, n * 4);
          CHECK(G.vt->adamw(G.ctx, n, dp, dg, dm, dv, &a) == MUON_OK, "adamw: %s", G.vt->error(G.ctx));
          if (pbf) down(gotb, dp, n * 2); else down(got, dp, n * 4);
          if (!sync_ok()) continue;
          if (!(pbf ? same_bits(gotb, pwb, n, 2, "bf16 param") : same_bits(got, pw, n, 4, "fp32 param")))
            printf("    (param bf16 %d grad bf16 %d mirror %d stochastic %d)\n", pbf, gbf, mirror, sr);
          down(got, dm, n * 4);
          if (sync_ok()) same_bits(got, mw, n, 4, "m");
          down(got, dv, n * 4);
          if (sync_ok()) same_bits(got, vw, n, 4, "v");
          if (mirror) {
            down(gotb, dmirror, n * 2);
            if (sync_ok()) same_bits(gotb, mirw, n, 2, "mirror");
          }
        }
  dfree(dp); dfree(dg); dfree(dmirror); dfree(dm); dfree(dv);
  free(p0); free(g); free(m0); free(v0); free(pw); free(mw); free(vw); free(got);
  free(p0b); free(gb); free(pwb); free(mirw); free(gotb);
}

/* ---- Newton-Schulz ------------------------------------------------------------------------------ */
/* Runs the backend's NS on `batch` m x n operands (host in -> host out). */
/* newton_schulz on a copy of `in` placed `skew` floats into its device allocation. */
static int gpu_ns_at(const float *in, float *out, int batch, int m, int n, const muon_hparams *hp, size_t skew) {
  size_t total = (size_t)batch * m * n, wsb = G.vt->ns_workspace(G.ctx, batch, m, n, hp);
  float *dbase = (float *)dalloc((total + skew) * 4), *dX = dbase + skew;
  void *ws = dalloc(wsb);
  muon_status st;
  int ok;
  CHECK(wsb > 0, "ns_workspace(%d, %d, %d) = 0", batch, m, n);
  up(dX, in, total * 4);
  st = G.vt->newton_schulz(G.ctx, dX, batch, m, n, hp, ws);
  CHECK(st == MUON_OK, "newton_schulz(%d x %d x %d): %s", batch, m, n, G.vt->error(G.ctx));
  down(out, dX, total * 4);
  ok = sync_ok() && st == MUON_OK;
  dfree(dbase);
  dfree(ws);
  return ok;
}

static int gpu_ns(const float *in, float *out, int batch, int m, int n, const muon_hparams *hp) {
  return gpu_ns_at(in, out, batch, m, n, hp, 0);
}

static void ns_case_alg(int batch, int m, int n, muon_precision prec, int symmetric, int polar, int zero, muon_ns_algorithm alg, unsigned restarts) {
  muon_hparams hp = muon_default_hparams();
  size_t mn = (size_t)m * n, total = (size_t)batch * mn, i;
  float *in = (float *)xmalloc(total * 4), *got = (float *)xmalloc(total * 4), *ref = (float *)xmalloc(total * 4);
  double *refd = (double *)xmalloc(total * 8);
  double tol = prec == MUON_PRECISION_BF16 ? (alg == MUON_NS_GRAM && n >= 2 * m ? NS_GRAM_BF16_TOL : NS_BF16_TOL) : NS_FP32_TOL;
  int b;
  hp.precision = prec;
  hp.symmetric = symmetric;
  hp.ns_algorithm = alg;
  hp.ns_restarts = restarts;
  if (polar) muon_set_ns_preset(&hp, MUON_NS_POLAR_EXPRESS);
  for (i = 0; i < total; i++) in[i] = zero ? 0.0f : 0.3f * frand() + (i % 7 == 0 ? 0.5f : 0.0f);
  for (b = 0; b < batch; b++)
    CHECK(muon_newton_schulz(in + (size_t)b * mn, m, n, ref + (size_t)b * mn, &hp) == MUON_OK, "CPU NS");
  for (i = 0; i < total; i++) refd[i] = ref[i];
  if (gpu_ns(in, got, batch, m, n, &hp)) {
    for (b = 0; b < batch; b++) {
      size_t worst;
      double err = rel_err(got + (size_t)b * mn, refd + (size_t)b * mn, mn, &worst);
      if (prec == MUON_PRECISION_BF16 && alg == MUON_NS_GRAM && n >= 2 * m) { if (err > worst_gram_bf16) worst_gram_bf16 = err; }
      else if (prec == MUON_PRECISION_BF16) { if (err > worst_bf16) worst_bf16 = err; }
      else if (err > worst_fp32) worst_fp32 = err;
      CHECK(err <= tol, "%s %s NS %dx%d (batch %d, operand %d, symmetric %d, polar %d): rel err %.3g > %.1g at %zu (got %g, cpu %g)",
            prec == MUON_PRECISION_BF16 ? "bf16" : "fp32", alg == MUON_NS_GRAM ? "Gram" : "standard", m, n, batch, b, symmetric, polar, err, tol, worst,
            (double)got[(size_t)b * mn + worst], refd[(size_t)b * mn + worst]);
    }
    for (i = 0; i < total; i++) {
      CHECK(muon__finite(got[i]), "non-finite output at %zu", i);
      if (zero) CHECK(got[i] == 0.0f, "zero input must give zeros (element %zu: %g)", i, (double)got[i]);
      if (prec == MUON_PRECISION_BF16) CHECK((f_bits(got[i]) & 0xffffu) == 0, "bf16 output %zu is not a bf16 value", i);
      if (!muon__finite(got[i]) || (prec == MUON_PRECISION_BF16 && (f_bits(got[i]) & 0xffffu))) break;
    }
  }
  free(in); free(got); free(ref); free(refd);
}

static void ns_case(int batch, int m, int n, muon_precision prec, int symmetric, int polar, int zero) {
  ns_case_alg(batch, m, n, prec, symmetric, polar, zero, MUON_NS_STANDARD, 0);
}

static void test_ns(void) {
  static const int shapes[][2] = {{1, 1}, {1, 17}, {4, 4}, {5, 13}, {8, 8}, {16, 40}, {33, 47}, {64, 96}};
  size_t s;
  int prec;
  for (prec = 0; prec < 2; prec++) {
    TEST_CASE(prec ? "newton_schulz bf16 vs muon_newton_schulz (4e-2), bf16 outputs"
                   : "newton_schulz fp32 vs muon_newton_schulz (1e-5 relative)");
    for (s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      ns_case(s % 3 == 1 ? 3 : 1, shapes[s][0], shapes[s][1], (muon_precision)prec, (int)(s & 1), 0, 0);
    ns_case(3, 12, 30, (muon_precision)prec, 1, 0, 0); /* symmetric tiles: 2 per side, last one 4 rows */
    ns_case(2, 33, 47, (muon_precision)prec, 1, 0, 0); /* 5 per side, last one 1 row */
    ns_case(1, 24, 24, (muon_precision)prec, 1, 1, 0); /* 3 per side, all full */
    ns_case(2, 10, 24, (muon_precision)prec, 0, 1, 0); /* per-iteration coefficients */
    ns_case(2, 6, 9, (muon_precision)prec, 1, 0, 1);   /* zeros: the eps path */
  }
  for (prec = 0; prec < 2; prec++) {
    TEST_CASE(prec ? "newton_schulz Gram (ns_algorithm), bf16, vs muon_newton_schulz's Gram (1e-1), bf16 outputs"
                   : "newton_schulz Gram (ns_algorithm), fp32, vs muon_newton_schulz's Gram (1e-5 relative)");
    ns_case_alg(1, 16, 40, (muon_precision)prec, 1, 0, 0, MUON_NS_GRAM, 1u << 2);   /* the default restart */
    ns_case_alg(3, 5, 13, (muon_precision)prec, 0, 0, 0, MUON_NS_GRAM, 0);         /* batched, no restart */
    ns_case_alg(2, 10, 24, (muon_precision)prec, 1, 1, 0, MUON_NS_GRAM, (1u << 1) | (1u << 3)); /* Polar Express, two restarts */
    ns_case_alg(1, 48, 128, (muon_precision)prec, 1, 1, 0, MUON_NS_GRAM, 0);        /* Polar Express, no restart */
    ns_case_alg(1, 1, 17, (muon_precision)prec, 1, 0, 0, MUON_NS_GRAM, 1u << 2);    /* a row */
    ns_case_alg(2, 6, 9, (muon_precision)prec, 1, 0, 1, MUON_NS_GRAM, 1u << 2);     /* squarer: the standard path */
    ns_case_alg(2, 4, 12, (muon_precision)prec, 1, 0, 1, MUON_NS_GRAM, 1u << 2);    /* zeros */
  }
}

static void test_ns_symmetric(void) {
#if STANDIN
  static const int shapes[][3] = {{1, 16, 40}, {3, 12, 30}, {2, 33, 47}, {1, 64, 96}};
  /* the tiles are batched and the plain GEMMs not: the stand-in sums them in different orders */
  const double tol[2] = {NS_FP32_TOL, NS_BF16_TOL};
#else
  /* muon_cuda.o's defaults: fp32 takes the tiles from 16 tiles of 256 rows, bf16 from 32 */
  static const int shapes[][3] = {{1, 8000, 8064}, {2, 4100, 4100}};
  /* cuBLAS's tile and full-matrix kernels may sum in different orders: NS then spreads fp32
     roundings (and the odd flipped bf16 rounding) */
  const double tol[2] = {NS_FP32_TOL, NS_BF16_TOL};
#endif
  size_t k;
  int prec;
  TEST_CASE("newton_schulz: symmetric tiles (cublasGemmBatchedEx + mirror) within fp32 rounding of plain GEMMs");
  for (prec = 0; prec < 2; prec++)
    for (k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
      muon_hparams hp = muon_default_hparams();
      int batch = shapes[k][0], m = shapes[k][1], n = shapes[k][2];
      size_t total = (size_t)batch * m * n, i, worst;
      float *in = (float *)xmalloc(total * 4), *sym = (float *)xmalloc(total * 4), *plain = (float *)xmalloc(total * 4);
      double *plaind = (double *)xmalloc(total * 8), err;
      long long tiles_before, tiles_after;
      hp.precision = (muon_precision)prec;
      for (i = 0; i < total; i++) in[i] = frand();
      hp.symmetric = 0;
      tiles_before = tile_gemms();
      gpu_ns(in, plain, batch, m, n, &hp);
      CHECK(tile_gemms() == tiles_before, "plain path used tiles");
      hp.symmetric = 1;
      gpu_ns(in, sym, batch, m, n, &hp);
      tiles_after = tile_gemms();
      CHECK(!STANDIN || tiles_after > tiles_before, "symmetric path not taken for %dx%d", m, n);
      for (i = 0; i < total; i++) plaind[i] = plain[i];
      err = rel_err(sym, plaind, total, &worst);
      CHECK(err <= tol[prec], "%s %dx%d (batch %d): symmetric vs plain rel err %.3g > %.0e at %zu",
            prec ? "bf16" : "fp32", m, n, batch, err, tol[prec], worst);
      free(in); free(sym); free(plain); free(plaind);
    }
}

/* An operand's bits must not depend on the others in its batch nor on where it lies: cuBLAS
   picks kernels by batch count and alignment (the stand-in too). Shapes: 19x31 (operands not
   16-byte aligned: one at a time through an aligned copy), 16x40 and 32x40 (in place; 32 rows
   take the symmetric tiles here); each batch also 4 bytes into its allocation. */
static void test_ns_batch_bits(void) {
  static const int shapes[][2] = {{19, 31}, {16, 40}, {32, 40}};
  size_t k;
  int prec;
  TEST_CASE("newton_schulz: batch 3, aligned or not, == three batch-1 runs bitwise; two runs, same bits");
  for (k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
    for (prec = 0; prec < 2; prec++) {
      muon_hparams hp = muon_default_hparams();
      int batch = 3, m = shapes[k][0], n = shapes[k][1], b;
      size_t mn = (size_t)m * n, total = (size_t)batch * mn, i;
      float *in = (float *)xmalloc(total * 4), *all = (float *)xmalloc(total * 4), *one = (float *)xmalloc(total * 4);
      float *again = (float *)xmalloc(total * 4);
      char what[64];
      hp.precision = (muon_precision)prec;
      for (i = 0; i < total; i++) in[i] = frand();
      snprintf(what, sizeof what, "%s %dx%d batch 3 vs 3 x batch 1", prec ? "bf16" : "fp32", m, n);
      if (gpu_ns(in, all, batch, m, n, &hp)) {
        for (b = 0; b < batch; b++) gpu_ns(in + (size_t)b * mn, one + (size_t)b * mn, 1, m, n, &hp);
        same_bits(all, one, total, 4, what);
        gpu_ns(in, again, batch, m, n, &hp);
        same_bits(again, all, total, 4, "second run");
        gpu_ns_at(in, again, batch, m, n, &hp, 1);
        same_bits(again, all, total, 4, "batch 3, 4 bytes off alignment");
        gpu_ns_at(in, again, 1, m, n, &hp, 1);
        same_bits(again, all, mn, 4, "batch 1, 4 bytes off alignment");
      }
      free(in); free(all); free(one); free(again);
    }
}

static void test_ns_workspace(void) {
  muon_hparams hp = muon_default_hparams();
  size_t f1, f3, b1;
  TEST_CASE("ns_workspace: grows with batch, bf16 needs its copies, bad shapes give 0");
  f1 = G.vt->ns_workspace(G.ctx, 1, 16, 40, &hp);
  f3 = G.vt->ns_workspace(G.ctx, 3, 16, 40, &hp);
  hp.precision = MUON_PRECISION_BF16;
  b1 = G.vt->ns_workspace(G.ctx, 1, 16, 40, &hp);
  CHECK(f1 >= (16 * 40 + 2 * 16 * 16 + 1) * 4, "fp32 workspace %zu too small", f1);
  CHECK(f3 >= 3 * (16 * 40 + 2 * 16 * 16) * 4 && f3 > f1, "batch 3 workspace %zu", f3);
  CHECK(b1 >= (2 * 16 * 40 + 2 * 16 * 16) * 2 + 4, "bf16 workspace %zu too small", b1);
  CHECK(G.vt->ns_workspace(G.ctx, 1, 40, 16, &hp) == 0, "m > n must give 0");
  CHECK(G.vt->ns_workspace(G.ctx, 0, 4, 4, &hp) == 0, "batch 0 must give 0");
}

/* ---- NorMuon ------------------------------------------------------------------------------------ */
#define NORMUON_TOL 1e-5
static int contains_normuon(const char *s) { return s && strstr(s, "normuon") != NULL; }
static double worst_normuon_x, worst_normuon_v;
static int normuon_cases, normuon_bitwise;

/* One NorMuon call on the backend and on muon_compute_cpu()'s slot, same inputs: X within
   NORMUON_TOL relative, v_new too, v unchanged; v_new starts poisoned (every element must be
   written); hp is scribbled on after the call (the slot must have read it already). x_scale:
   X's magnitude, 0 for all zero (output zeros, v_new = beta2 v), tiny to reach the epsilons
   (mean squares near 1e-10: LARGER's clamp; near 1e-20: ROWS's sqrt(v) + 1e-10); v_zero: the
   first step's v. */
static void normuon_case(muon_normuon kind, int per_column, int m, int n, float beta2, int v_zero, float x_scale) {
  muon_compute cpu = muon_compute_cpu();
  muon_hparams hp = muon_default_hparams();
  int len = per_column ? n : m, i, j, ok;
  size_t mn = (size_t)m * n, k, worst;
  float *X = (float *)xmalloc(mn * 4), *Xc = (float *)xmalloc(mn * 4), *Xg = (float *)xmalloc(mn * 4);
  float *v = (float *)xmalloc((size_t)len * 4), *vc = (float *)xmalloc((size_t)len * 4);
  float *vg = (float *)xmalloc((size_t)len * 4), *vback = (float *)xmalloc((size_t)len * 4);
  float *poison = (float *)xmalloc((size_t)len * 4);
  double *want = (double *)xmalloc((mn > (size_t)len ? mn : (size_t)len) * 8), ex, ev;
  float *dX = (float *)dalloc(mn * 4), *dv = (float *)dalloc((size_t)len * 4), *dvn = (float *)dalloc((size_t)len * 4);
  long long flushes = 0, launches = 0;
  int x_zero = x_scale == 0.0f;
  muon_status st;
  char what[160];
  snprintf(what, sizeof what, "%s per_column %d %dx%d beta2 %g%s X scale %g", kind == MUON_NORMUON_ROWS ? "ROWS" : "LARGER",
           per_column, m, n, (double)beta2, v_zero ? " v = 0" : "", (double)x_scale);
  hp.normuon = kind;
  hp.normuon_beta2 = beta2;
  /* rows and columns of different sizes, so the per-statistic factors differ */
  for (i = 0; i < m; i++)
    for (j = 0; j < n; j++)
      X[(size_t)i * n + j] = x_scale * frand() * (0.25f + (float)(i % 5)) * (1.0f + 0.1f * (float)(j % 3));
  for (i = 0; i < len; i++) {
    v[i] = v_zero ? 0.0f : (0.05f + 2.0f * (frand() + 1.0f)) * (per_column ? 3.0f : 1.0f);
    poison[i] = bits_f(0x7fc0beefu);
  }
  memcpy(Xc, X, mn * 4);
  CHECK(cpu.vt->normuon(cpu.ctx, Xc, m, n, per_column, v, vc, &hp) == MUON_OK, "CPU normuon");

  up(dX, X, mn * 4);
  up(dv, v, (size_t)len * 4);
  up(dvn, poison, (size_t)len * 4);
  if (!sync_ok()) goto done;
#if STANDIN
  /* device memory is PROT_NONE outside the stand-in's own execution: a host read of X, v or
     v_new in the slot would fault. The slot must queue and return: no flush, three launches. */
  CHECK(muon_standin_is_device(dX, mn * 4) && muon_standin_is_device(dv, (size_t)len * 4) &&
        muon_standin_is_device(dvn, (size_t)len * 4), "%s: inputs are not stand-in device memory", what);
  flushes = muon_standin_calls("flush");
  launches = muon_standin_calls("kernel");
#endif
  st = G.vt->normuon(G.ctx, dX, m, n, per_column, dv, dvn, &hp);
  CHECK(st == MUON_OK, "%s: %s", what, G.vt->error(G.ctx));
#if STANDIN
  CHECK(muon_standin_calls("flush") == flushes, "%s: the slot waited for the stream", what);
  CHECK(muon_standin_calls("kernel") - launches == 3, "%s: %lld launches, want 3", what, muon_standin_calls("kernel") - launches);
#endif
  (void)flushes; (void)launches;
  hp.normuon = kind == MUON_NORMUON_ROWS ? MUON_NORMUON_LARGER : MUON_NORMUON_ROWS; /* read before returning? */
  hp.normuon_beta2 = 0.5f;
  down(Xg, dX, mn * 4);
  down(vg, dvn, (size_t)len * 4);
  down(vback, dv, (size_t)len * 4);
  ok = sync_ok() && st == MUON_OK;
  if (!ok) goto done;
  normuon_cases++;
  for (k = 0; k < mn; k++) want[k] = Xc[k];
  ex = rel_err(Xg, want, mn, &worst);
  CHECK(ex <= NORMUON_TOL, "%s: X rel err %.3g > %.0e at %zu (got %g, cpu %g)", what, ex, NORMUON_TOL, worst,
        (double)Xg[worst], want[worst]);
  for (k = 0; k < (size_t)len; k++) want[k] = vc[k];
  ev = rel_err(vg, want, (size_t)len, &worst);
  CHECK(ev <= NORMUON_TOL, "%s: v_new rel err %.3g > %.0e at %zu (got %g, cpu %g)", what, ev, NORMUON_TOL, worst,
        (double)vg[worst], want[worst]);
  if (ex > worst_normuon_x) worst_normuon_x = ex;
  if (ev > worst_normuon_v) worst_normuon_v = ev;
  if (memcmp(Xg, Xc, mn * 4) == 0 && memcmp(vg, vc, (size_t)len * 4) == 0) normuon_bitwise++;
  if (!same_bits(vback, v, (size_t)len, 4, "v (read only)")) printf("    (%s)\n", what);
  for (k = 0; k < mn; k++) {
    CHECK(muon__finite(Xg[k]), "%s: non-finite X at %zu", what, k);
    if (x_zero) CHECK(Xg[k] == 0.0f, "%s: zero X must stay zero (element %zu: %g)", what, k, (double)Xg[k]);
    if (!muon__finite(Xg[k]) || (x_zero && Xg[k] != 0.0f)) break;
  }
  if (x_zero)
    for (i = 0; i < len; i++) {
      double bv = (double)beta2 * v[i];
      CHECK(fabs(vg[i] - bv) <= 1e-6 * fabs(bv), "%s: v_new[%d] = %g, want beta2 v = %g", what, i, (double)vg[i], bv);
      if (!(fabs(vg[i] - bv) <= 1e-6 * fabs(bv))) break;
    }
done:
  dfree(dX); dfree(dv); dfree(dvn);
  free(X); free(Xc); free(Xg); free(v); free(vc); free(vg); free(vback); free(poison); free(want);
}

static void test_normuon(void) {
  static const int shapes[][2] = {{1, 1}, {1, 7}, {7, 7}, {5, 64}, {33, 300}, {128, 512}};
  static const float betas[] = {0.95f, 0.0f};
  int kind, pc, vz, b;
  size_t s;
  for (kind = MUON_NORMUON_ROWS; kind <= MUON_NORMUON_LARGER; kind++) {
    TEST_CASE(kind == MUON_NORMUON_ROWS ? "normuon ROWS vs the CPU backend's slot (1e-5 relative), per row / column, v read only"
                                        : "normuon LARGER vs the CPU backend's slot (1e-5 relative), per row / column, v read only");
    for (pc = 0; pc < 2; pc++)
      for (s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (vz = 0; vz < 2; vz++)
          for (b = 0; b < 2; b++) normuon_case((muon_normuon)kind, pc, shapes[s][0], shapes[s][1], betas[b], vz, 1.0f);
  }
  TEST_CASE("normuon: tiny X, where the epsilons matter (mean squares near 1e-10 and 1e-20)");
  for (kind = MUON_NORMUON_ROWS; kind <= MUON_NORMUON_LARGER; kind++)
    for (pc = 0; pc < 2; pc++)
      for (b = 0; b < 2; b++) {
        normuon_case((muon_normuon)kind, pc, 7, 7, betas[b], 1, 1e-5f);
        normuon_case((muon_normuon)kind, pc, 33, 300, betas[b], 1, 1e-5f);
        normuon_case((muon_normuon)kind, pc, 33, 300, betas[b], 1, 1e-10f);
      }
  TEST_CASE("normuon: X all zero gives zeros (finite) and v_new = beta2 v");
  for (kind = MUON_NORMUON_ROWS; kind <= MUON_NORMUON_LARGER; kind++)
    for (pc = 0; pc < 2; pc++)
      for (vz = 0; vz < 2; vz++) {
        normuon_case((muon_normuon)kind, pc, 5, 64, 0.95f, vz, 0.0f);
        normuon_case((muon_normuon)kind, pc, 1, 1, 0.95f, vz, 0.0f);
      }

  TEST_CASE("normuon: two runs give the same bits");
  {
    muon_hparams hp = muon_default_hparams();
    int m = 33, n = 300;
    size_t mn = (size_t)m * n, k;
    float *X = (float *)xmalloc(mn * 4), *v = (float *)xmalloc((size_t)n * 4);
    float *x1 = (float *)xmalloc(mn * 4), *x2 = (float *)xmalloc(mn * 4);
    float *v1 = (float *)xmalloc((size_t)n * 4), *v2 = (float *)xmalloc((size_t)n * 4);
    float *dX = (float *)dalloc(mn * 4), *dv = (float *)dalloc((size_t)n * 4), *dvn = (float *)dalloc((size_t)n * 4);
    int run;
    hp.normuon = MUON_NORMUON_LARGER;
    for (k = 0; k < mn; k++) X[k] = frand();
    for (k = 0; k < (size_t)n; k++) v[k] = 0.5f * (frand() + 1.0f);
    up(dv, v, (size_t)n * 4);
    for (run = 0; run < 2; run++) {
      up(dX, X, mn * 4);
      CHECK(G.vt->normuon(G.ctx, dX, m, n, 1, dv, dvn, &hp) == MUON_OK, "normuon: %s", G.vt->error(G.ctx));
      down(run ? x2 : x1, dX, mn * 4);
      down(run ? v2 : v1, dvn, (size_t)n * 4);
    }
    if (sync_ok()) {
      same_bits(x2, x1, mn, 4, "normuon X, second run");
      same_bits(v2, v1, (size_t)n, 4, "normuon v_new, second run");
    }
    dfree(dX); dfree(dv); dfree(dvn);
    free(X); free(v); free(x1); free(x2); free(v1); free(v2);
  }

  TEST_CASE("normuon: bad arguments are MUON_ERR_ARG, nothing queued");
  {
    muon_hparams hp = muon_default_hparams();
    float *dX = (float *)dalloc(16 * 4), *dv = (float *)dalloc(4 * 4), *dvn = (float *)dalloc(4 * 4);
    hp.normuon = MUON_NORMUON_ROWS;
    CHECK(G.vt->normuon(G.ctx, NULL, 4, 4, 0, dv, dvn, &hp) == MUON_ERR_ARG, "X NULL");
    CHECK(G.vt->normuon(G.ctx, dX, 4, 4, 0, dv, dvn, NULL) == MUON_ERR_ARG, "hp NULL");
    CHECK(G.vt->normuon(G.ctx, dX, 0, 4, 0, dv, dvn, &hp) == MUON_ERR_ARG, "m = 0");
    CHECK(contains_normuon(G.vt->error(G.ctx)), "text: '%s'", G.vt->error(G.ctx));
    hp.normuon = MUON_NORMUON_OFF;
    CHECK(G.vt->normuon(G.ctx, dX, 4, 4, 0, dv, dvn, &hp) == MUON_ERR_ARG, "normuon OFF");
    hp.normuon = MUON_NORMUON_LARGER;
    hp.normuon_beta2 = 1.0f;
    CHECK(G.vt->normuon(G.ctx, dX, 4, 4, 0, dv, dvn, &hp) == MUON_ERR_ARG, "beta2 1");
    CHECK(G.vt->sync(G.ctx) == MUON_OK, "nothing was queued: not a failure for sync");
#if STANDIN
    TEST_CASE("normuon: a failing kernel surfaces at sync");
    hp.normuon_beta2 = 0.95f;
    CHECK(G.vt->zero(G.ctx, dX, 16 * 4) == MUON_OK && G.vt->zero(G.ctx, dv, 4 * 4) == MUON_OK, "zero");
    sync_ok();
    muon_standin_fail("kernel", 2);
    CHECK(G.vt->normuon(G.ctx, dX, 4, 4, 1, dv, dvn, &hp) == MUON_OK, "the launches succeed: %s", G.vt->error(G.ctx));
    CHECK(G.vt->sync(G.ctx) == MUON_ERR_BACKEND, "sync must fail");
    muon_standin_reset_errors();
    muon_standin_fail("kernel", 0);
    CHECK(G.vt->sync(G.ctx) == MUON_OK, "after reset: %s", G.vt->error(G.ctx));
#endif
    dfree(dX); dfree(dv); dfree(dvn);
  }
}

/* ---- errors -------------------------------------------------------------------------------------- */
static int contains(const char *s, const char *part) { return s && strstr(s, part) != NULL; }

static void test_errors(void) {
  muon_hparams hp = muon_default_hparams();
  int batch = 3, m = 4, n = 6;
  size_t total = (size_t)batch * m * n, i;
  float in[72];
  float *dX = (float *)dalloc(total * 4);
  void *ws = dalloc(G.vt->ns_workspace(G.ctx, batch, m, n, &hp));
  muon_status st;
  const char *e;
  for (i = 0; i < total; i++) in[i] = frand();

#if STANDIN
  TEST_CASE("errors: injected cuBLAS GEMM failure -> MUON_ERR_BACKEND with cuBLAS's text, sync reports it once");
  up(dX, in, total * 4);
  sync_ok();
  muon_standin_fail("cublasGemmEx", 2);
  st = G.vt->newton_schulz(G.ctx, dX, batch, m, n, &hp, ws);
  e = G.vt->error(G.ctx);
  CHECK(st == MUON_ERR_BACKEND, "got %s", muon_status_string(st));
  CHECK(contains(e, "cublasGemmEx at muon_cuda.h:") && contains(e, "CUBLAS_STATUS_EXECUTION_FAILED"),
        "error text: '%s'", e);
  CHECK(G.vt->sync(G.ctx) == MUON_ERR_BACKEND, "sync must report the slot's failure");
  CHECK(G.vt->sync(G.ctx) == MUON_OK, "the failure is reported once: %s", G.vt->error(G.ctx));
  muon_standin_fail("cublasGemmEx", 0);

  TEST_CASE("errors: injected cublasSnrm2 failure");
  muon_standin_fail("cublasSnrm2_v2", 3);
  st = G.vt->newton_schulz(G.ctx, dX, batch, m, n, &hp, ws);
  e = G.vt->error(G.ctx);
  CHECK(st == MUON_ERR_BACKEND && contains(e, "cublasSnrm2"), "got %s, '%s'", muon_status_string(st), e);
  G.vt->sync(G.ctx);
  CHECK(G.vt->sync(G.ctx) == MUON_OK, "sync after the failure was reported");
  muon_standin_fail("cublasSnrm2_v2", 0);

  TEST_CASE("errors: the first failure is kept until sync");
  muon_standin_fail("cudaMemcpyAsync", 1);
  st = G.vt->copy(G.ctx, in, dX, 16, 1, 0);
  CHECK(st == MUON_ERR_BACKEND, "copy: got %s", muon_status_string(st));
  muon_standin_fail("cudaMemsetAsync", 1);
  st = G.vt->zero(G.ctx, dX, 16);
  CHECK(st == MUON_ERR_BACKEND, "zero: got %s", muon_status_string(st));
  e = G.vt->error(G.ctx);
  CHECK(contains(e, "cudaMemcpyAsync at muon_cuda.h:") && contains(e, "cudaErrorInvalidValue"), "text: '%s'", e);
  CHECK(G.vt->sync(G.ctx) == MUON_ERR_BACKEND, "sync must report it");
  CHECK(G.vt->sync(G.ctx) == MUON_OK, "then OK: %s", G.vt->error(G.ctx));
  muon_standin_fail("cudaMemcpyAsync", 0);
  muon_standin_fail("cudaMemsetAsync", 0);

  TEST_CASE("errors: a failing kernel surfaces at sync (sticky, as on a GPU)");
  {
    muon_momentum_args a;
    memset(&a, 0, sizeof a);
    a.mu = 0.9f; a.grad_scale = 1.0f;
    muon_standin_fail("kernel", 1);
    st = G.vt->momentum(G.ctx, total - 1, dX, dX + 1, &a, 0, NULL); /* harmless if it ran */
    CHECK(st == MUON_OK, "the launch itself succeeds: %s", G.vt->error(G.ctx));
    CHECK(G.vt->sync(G.ctx) == MUON_ERR_BACKEND, "sync must fail");
    e = G.vt->error(G.ctx);
    CHECK(contains(e, "cudaStreamSynchronize at muon_cuda.h:") && contains(e, "cudaErrorLaunchFailure"), "text: '%s'", e);
    CHECK(G.vt->sync(G.ctx) == MUON_ERR_BACKEND, "sticky");
    muon_standin_reset_errors();
    CHECK(G.vt->sync(G.ctx) == MUON_OK, "after reset: %s", G.vt->error(G.ctx));
  }

  TEST_CASE("errors: allocation failure -> NULL with the native text, not a pending failure");
  {
    void *p;
    muon_standin_fail("cudaMalloc", 1);
    p = G.vt->alloc(G.ctx, 1024);
    e = G.vt->error(G.ctx);
    CHECK(p == NULL, "alloc must fail");
    CHECK(contains(e, "cudaMalloc") && contains(e, "cudaErrorMemoryAllocation"), "text: '%s'", e);
    CHECK(G.vt->sync(G.ctx) == MUON_OK, "sync after a failed alloc: %s", G.vt->error(G.ctx));
    muon_standin_fail("cudaMallocHost", 1);
    p = G.vt->alloc_host(G.ctx, 1024);
    CHECK(p == NULL && contains(G.vt->error(G.ctx), "cudaMallocHost"), "alloc_host: '%s'", G.vt->error(G.ctx));
    CHECK(G.vt->sync(G.ctx) == MUON_OK, "sync after a failed alloc_host");
    p = G.vt->alloc_host(G.ctx, 1024);
    CHECK(p != NULL, "alloc_host");
    if (p) { memset(p, 1, 1024); G.vt->free_host(G.ctx, p); }
    /* a failed alloc neither hides nor replaces a pending failure */
    muon_standin_fail("cudaMemsetAsync", 1);
    CHECK(G.vt->zero(G.ctx, dX, 16) == MUON_ERR_BACKEND, "zero must fail");
    muon_standin_fail("cudaMalloc", 1);
    CHECK(G.vt->alloc(G.ctx, 1024) == NULL, "alloc must fail");
    CHECK(contains(G.vt->error(G.ctx), "cudaMemsetAsync"), "first failure kept: '%s'", G.vt->error(G.ctx));
    CHECK(G.vt->sync(G.ctx) == MUON_ERR_BACKEND, "the pending failure survives a failed alloc");
    CHECK(G.vt->sync(G.ctx) == MUON_OK, "then OK");
    muon_standin_fail("cudaMemsetAsync", 0);
    muon_standin_fail("cudaMalloc", 0);
  }

#else
  (void)st; (void)e;
  up(dX, in, total * 4);
#endif

  TEST_CASE("errors: bad arguments are MUON_ERR_ARG, not a crash");
  CHECK(G.vt->newton_schulz(G.ctx, dX, 1, 6, 4, &hp, ws) == MUON_ERR_ARG, "m > n");
  CHECK(contains(G.vt->error(G.ctx), "newton_schulz"), "text: '%s'", G.vt->error(G.ctx));
  CHECK(G.vt->newton_schulz(G.ctx, dX, 0, 4, 6, &hp, ws) == MUON_OK, "batch 0 is nothing to do");
  CHECK(G.vt->sync(G.ctx) == MUON_OK, "nothing was queued: not a failure for sync");

  dfree(dX);
  dfree(ws);
}

#if STANDIN
static void test_create_failures(void) {
  static const char *calls[] = {"cudaStreamCreateWithFlags", "cublasCreate_v2", "cudaMalloc"};
  static const char *names[] = {"cudaStreamCreateWithFlags at", "cublasCreate at", "cudaMalloc at"};
  static const char *texts[] = {"cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC_FAILED", "cudaErrorMemoryAllocation"};
  size_t before = muon_standin_device_bytes();
  int k;
  TEST_CASE("create: a failing step frees what was made, clears *out and says why in muon_error(NULL); nothing leaks");
  for (k = 0; k < 3; k++) {
    muon_compute c = G;          /* a live backend's fields: a failed create must clear them */
    muon_cuda_desc d = muon_cuda_default_desc();
    muon_status st;
    d.workspace_limit = 1 << 20;
    muon_standin_fail(calls[k], 1);
    st = muon_cuda_create(&c, &d);
    CHECK(st == MUON_ERR_BACKEND, "%s: got %s", calls[k], muon_status_string(st));
    CHECK(contains(muon_error(NULL), "MUON_ERR_BACKEND: muon_cuda_create: ") && contains(muon_error(NULL), names[k]) &&
          contains(muon_error(NULL), texts[k]), "%s: text '%s'", calls[k], muon_error(NULL));
    CHECK(c.vt == NULL && c.ctx == NULL, "%s: *out not cleared", calls[k]);
    muon_standin_fail(calls[k], 0);
  }
  CHECK(muon_standin_device_bytes() == before, "device bytes %zu, were %zu", muon_standin_device_bytes(), before);

  TEST_CASE("create: bad arguments are MUON_ERR_ARG with the reason in muon_error(NULL); a device the stand-in lacks is CUDA's text");
  {
    muon_compute c = G;
    muon_cuda_desc d = muon_cuda_default_desc();
    CHECK(muon_cuda_create(NULL, NULL) == MUON_ERR_ARG && contains(muon_error(NULL), "MUON_ERR_ARG: muon_cuda_create: out is NULL"),
          "out NULL: '%s'", muon_error(NULL));
    d.device = -1;
    CHECK(muon_cuda_create(&c, &d) == MUON_ERR_ARG && contains(muon_error(NULL), "MUON_ERR_ARG: muon_cuda_create: ") &&
          contains(muon_error(NULL), "muon_cuda_desc.device must be >= 0 (got -1)"), "device -1: '%s'", muon_error(NULL));
    CHECK(c.vt == NULL && c.ctx == NULL, "device -1: *out not cleared");
    d.device = 1;
    CHECK(muon_cuda_create(&c, &d) == MUON_ERR_BACKEND && contains(muon_error(NULL), "MUON_ERR_BACKEND: muon_cuda_create: ") &&
          contains(muon_error(NULL), "cudaSetDevice at") && contains(muon_error(NULL), "cudaErrorInvalidDevice"),
          "device 1: '%s'", muon_error(NULL));
    CHECK(c.vt == NULL && c.ctx == NULL, "device 1: *out not cleared");
    CHECK(muon_standin_device_bytes() == before, "device bytes %zu, were %zu", muon_standin_device_bytes(), before);
  }
}
#endif

/* A trainer's stream and cuBLAS handle, and a workspace limit: same bits as our own. */
static void test_shared(void) {
  muon_hparams hp = muon_default_hparams();
  int batch = 2, m = 9, n = 14;
  size_t total = (size_t)batch * m * n, i;
  float *in = (float *)xmalloc(total * 4), *own = (float *)xmalloc(total * 4), *shared = (float *)xmalloc(total * 4);
  cudaStream_t s = NULL;
  cublasHandle_t h = NULL;
  muon_compute keep = G, c;
  muon_cuda_desc d = muon_cuda_default_desc();
  TEST_CASE("shared stream and cuBLAS handle, workspace limit: same bits");
  for (i = 0; i < total; i++) in[i] = frand();
  gpu_ns(in, own, batch, m, n, &hp);
  CHECK(cudaStreamCreate(&s) == cudaSuccess, "cudaStreamCreate");
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
  d.stream = (void *)s;
  d.cublas = (void *)h;
  d.workspace_limit = 4 << 20;
  CHECK(muon_cuda_create(&c, &d) == MUON_OK, "create: %s", muon_error(NULL));
  G = c;
  if (gpu_ns(in, shared, batch, m, n, &hp)) same_bits(shared, own, total, 4, "shared vs own");
  muon_compute_destroy(&c);
  G = keep;
  CHECK(c.vt == NULL && c.ctx == NULL, "muon_compute_destroy clears");
  CHECK(cublasSetStream(h, s) == CUBLAS_STATUS_SUCCESS, "the trainer's handle still works");
  CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS, "cublasDestroy");
  CHECK(cudaStreamDestroy(s) == cudaSuccess, "cudaStreamDestroy");
  free(in); free(own); free(shared);
}

int main(void) {
  muon_status st;
  size_t before = device_bytes();
  TEST_CASE("create: vtable version, memory, every slot");
  st = muon_cuda_create(&G, NULL);
  CHECK(st == MUON_OK, "muon_cuda_create: %s", muon_error(NULL));
  if (st != MUON_OK) return test_summary();
  CHECK(G.vt->version == MUON_COMPUTE_VTABLE_VERSION && G.vt->memory == MUON_MEMORY_DEVICE, "version / memory");
  CHECK(G.vt->alloc && G.vt->free && G.vt->alloc_host && G.vt->free_host && G.vt->copy && G.vt->zero && G.vt->pack &&
        G.vt->momentum && G.vt->ns_workspace && G.vt->newton_schulz && G.vt->apply && G.vt->adamw &&
        G.vt->nonfinite && G.vt->cast && G.vt->sync && G.vt->error && G.vt->destroy && G.vt->normuon && G.vt->scale,
        "a slot is NULL");
  CHECK(strcmp(G.vt->error(G.ctx), "") == 0, "fresh error text '%s'", G.vt->error(G.ctx));

  test_copy_zero();
  test_cast();
  test_nonfinite();
  test_pack();
  test_momentum();
  test_apply();
  test_scale();
  test_blockwise();
  test_cautious_zeros();
  test_adamw();
  test_ns_workspace();
  test_ns();
  test_ns_symmetric();
  test_ns_batch_bits();
  test_normuon();
  test_errors();
#if STANDIN
  test_create_failures();
#endif
  test_shared();

  printf("NS vs CPU, worst relative error: fp32 %.3g (limit %.0e), bf16 %.3g (limit %.0e), bf16 Gram %.3g (limit %.0e)\n", worst_fp32, NS_FP32_TOL,
         worst_bf16, NS_BF16_TOL, worst_gram_bf16, NS_GRAM_BF16_TOL);
  printf("NorMuon vs CPU, worst relative error: X %.3g, v_new %.3g (limit %.0e); %d of %d cases bitwise equal\n",
         worst_normuon_x, worst_normuon_v, NORMUON_TOL, normuon_bitwise, normuon_cases);
  TEST_CASE("destroy: every byte returned");
  muon_compute_destroy(&G);
  CHECK(device_bytes() == before, "device bytes %zu, were %zu", device_bytes(), before);
  return test_summary();
}
