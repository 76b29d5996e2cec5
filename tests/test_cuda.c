/* test_cuda.c - muon_step on muon_cuda.h's backend (device buffers) against the CPU backend
   (host buffers), through the public API only: the same training on both, then what the GPU
   path promises on its own (determinism, host waits, batching, non-finite handling,
   all-or-nothing under faults, allocation failures, state, trainer formats, no host access).

   Build on the stand-in (no GPU: muon_cuda.h compiled by the host compiler, cudart / cuBLAS
   replaced by tests/standin/cuda_standin.c):
     make build/cuda/standin.o
     gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -isystem /usr/local/cuda/include \
         -DMUON_CUDA_STANDIN -DMUON_CUDA_IMPLEMENTATION -D_GNU_SOURCE -Itests/standin -I. -Itests \
         tests/test_cuda.c build/cuda/standin.o -o build/cuda/test_cuda -lm
   and with -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all against
   build/cuda/standin_san.o. On a GPU: the same source without the two defines, linked with
   build/cuda/muon_cuda.o (nvcc) and -lcudart -lcublas -lstdc++ -lm; the cases that need the
   stand-in's hooks (fault injection, allocation failures, host access) print SKIP there.

   Data moves between host and device only with cudaMemcpy (after cudaDeviceSynchronize: the
   backend works on a non-blocking stream of its own, which the legacy default stream of
   cudaMemcpy does not wait for). No device pointer is ever dereferenced by this file, except
   in case 10's child process, whose death is the point.

   Bounds (those of tests/test_golden.c): fp32 NS params within 1e-5 of the CPU's, relative to
   max |CPU param| of the matrix; bf16 NS: max |cuda - cpu| / max |cpu - param0| <= 4e-2 (the
   accumulated update, since bf16 NS itself is only good to a few bf16 ulps); momentum within
   1e-5 relative (and, being element-wise, expected bitwise); AdamW within 1e-6 relative. */
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "muon_cuda.h"

#include <cuda_runtime_api.h>
#ifdef MUON_CUDA_STANDIN
#include "standin/standin.h"
#endif
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MUON_CUDA_STANDIN
#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

#define FP32_PARAM_TOL 1e-5  /* test_golden.c: fp32 NS param, relative to max |ref|              */
#define BF16_UPDATE_TOL 4e-2 /* test_golden.c: bf16 NS, relative to max |ref - param0|          */
#define MOMENTUM_TOL 1e-5    /* test_golden.c: momentum, relative to max |ref B|                 */
#define ADAMW_TOL 1e-6       /* AdamW params, relative                                          */
#define STEPS 5
#define MAXM 8

static muon_compute G; /* the CUDA backend, shared by every CUDA optimizer of this program */

/* ---- host helpers ----------------------------------------------------------------------------- */
static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) { printf("out of host memory\n"); exit(2); }
  return p;
}

static uint32_t f_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float bits_f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* Nearest-even bf16 of a float (this file's own, independent of muon.h's). */
static uint16_t bf16_rne(float x) {
  uint32_t u = f_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)((u >> 16) | ((u & 0x007fffffu) ? 0x40u : 0u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float bf16_f(uint16_t h) { return bits_f((uint32_t)h << 16); }
/* Ordered integer of a bf16 (sign-magnitude -> two's complement), for ulp distances. */
static long bf16_ord(uint16_t h) { return (h & 0x8000u) ? -(long)(h & 0x7fffu) : (long)h; }
static long bf16_ulps(uint16_t a, uint16_t b) { long d = bf16_ord(a) - bf16_ord(b); return d < 0 ? -d : d; }

/* SplitMix64: the test data is a pure function of (kind, id, step, element). */
static uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* Uniform in [-1, 1). */
static float rnd(unsigned kind, unsigned id, unsigned step, size_t i) {
  uint64_t h = splitmix(((uint64_t)kind << 56) ^ ((uint64_t)id << 44) ^ ((uint64_t)step << 32) ^ (uint64_t)i);
  return (float)((double)(h >> 40) / 8388608.0 - 1.0);
}

static size_t dsize(muon_dtype t) { return t == MUON_DTYPE_BF16 ? 2 : 4; }

static void encode(void *dst, muon_dtype t, const float *src, size_t n) {
  size_t i;
  if (t == MUON_DTYPE_FP32) { memcpy(dst, src, n * 4); return; }
  for (i = 0; i < n; i++) ((uint16_t *)dst)[i] = bf16_rne(src[i]);
}

/* max |a - b| / max |b|; a non-finite element of a is an infinite error. */
static double rel_err(const float *a, const float *b, size_t n) {
  double num = 0, den = 1e-30;
  size_t i;
  for (i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (!(d <= 3.4e38)) return HUGE_VAL;
    if (d > num) num = d;
    if (fabs((double)b[i]) > den) den = fabs((double)b[i]);
  }
  return num / den;
}
/* max |a - b| / max |b - b0|: the accumulated update (test_golden.c's bf16 metric). */
static double update_err(const float *a, const float *b, const float *b0, size_t n) {
  double num = 0, den = 1e-30;
  size_t i;
  for (i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]), u = fabs((double)b[i] - (double)b0[i]);
    if (!(d <= 3.4e38)) return HUGE_VAL;
    if (d > num) num = d;
    if (u > den) den = u;
  }
  return num / den;
}

/* ---- device helpers: cudaMemcpy only, after a device-wide sync ------------------------------ */
static int dev_ok(cudaError_t e, const char *what) {
  CHECK(e == cudaSuccess, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return e == cudaSuccess;
}
static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 4);
  if (e != cudaSuccess) { printf("cudaMalloc(%zu): %s\n", bytes, cudaGetErrorName(e)); exit(2); }
  return p;
}
static void to_dev(void *d, const void *h, size_t bytes) {
  if (!dev_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize before an upload")) return;
  if (!dev_ok(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device")) return;
  (void)dev_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after an upload");
}
static void to_host(void *h, const void *d, size_t bytes) {
  if (!dev_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize before a download")) { memset(h, 0, bytes); return; }
  if (!dev_ok(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host")) memset(h, 0, bytes);
}

/* ---- models, setups, trainers -------------------------------------------------------------------
   A model: matrices (count > 1: a stack in one buffer) and an optional AdamW param. `id` seeds a
   matrix's data and names it, so the same matrix in two models gets the same values. */
typedef struct mspec { int rows, cols, count, id; } mspec;
typedef struct model { int nm; mspec m[MAXM]; size_t adamw; } model;

static const model M_BIG = {7, {{7, 13, 1, 0}, {13, 7, 1, 1}, {24, 40, 1, 2}, {64, 96, 1, 3}, {96, 64, 1, 4},
                                {300, 384, 1, 5}, {16, 24, 3, 6}}, 333};
static const model M_MID = {5, {{7, 13, 1, 0}, {13, 7, 1, 1}, {24, 40, 1, 2}, {96, 64, 1, 4}, {16, 24, 3, 6}}, 333};
static const model M_SMALL = {3, {{7, 13, 1, 0}, {13, 7, 1, 1}, {16, 24, 3, 6}}, 50};
/* Three matrices with one operand shape (24 x 40; the tall one is transposed into it). */
static const model M_BATCH = {3, {{24, 40, 1, 10}, {40, 24, 1, 11}, {24, 40, 1, 12}}, 0};

static size_t slices(const mspec *m) { return m->count > 1 ? (size_t)m->count : 1; }
static size_t mat_n(const mspec *m) { return (size_t)m->rows * (size_t)m->cols; }
static size_t mat_total(const mspec *m) { return mat_n(m) * slices(m); }

typedef struct setup {
  const char *title;
  muon_hparams hp;
  muon_dtype param_dtype, grad_dtype;
  int mirror;                 /* bf16 mirrors for every matrix and the AdamW param */
  muon_rounding rounding;
  unsigned long long seed;
  float grad_scale;           /* 0: leave the default (1) */
  muon_nonfinite on_nonfinite;
  int state_on_host;          /* muon_desc.state_on_host */
} setup;

static setup base_setup(const char *title) {
  setup s;
  memset(&s, 0, sizeof s);
  s.title = title;
  s.hp = muon_default_hparams();
  s.hp.lr = 0.02f;
  s.param_dtype = MUON_DTYPE_FP32;
  s.grad_dtype = MUON_DTYPE_FP32;
  s.rounding = MUON_ROUND_NEAREST;
  s.on_nonfinite = MUON_NONFINITE_ERROR;
  return s;
}

typedef struct trainer {
  int cuda;
  model md;
  setup s;
  float gmul;                 /* multiplies every generated gradient (before the dtype rounding) */
  muon_optimizer *opt;
  void *param[MAXM], *grad[MAXM], *mirror[MAXM];
  int index[MAXM];
  void *aparam, *agrad, *amirror;
  int aindex;
  float poison;               /* what tr_grads plants (0: a NaN) */
} trainer;

static void *tr_mem(const trainer *t, size_t bytes) { return t->cuda ? dev_alloc(bytes) : xmalloc(bytes); }
static void tr_release(const trainer *t, void *p) {
  if (!p) return;
  if (t->cuda) (void)dev_ok(cudaFree(p), "cudaFree");
  else free(p);
}
static void tr_put(const trainer *t, void *dst, const void *src, size_t bytes) {
  if (t->cuda) to_dev(dst, src, bytes);
  else memcpy(dst, src, bytes);
}
static void tr_get(const trainer *t, void *dst, const void *src, size_t bytes) {
  if (t->cuda) to_host(dst, src, bytes);
  else memcpy(dst, src, bytes);
}

static void init_param_values(float *f, unsigned kind, unsigned id, size_t n) {
  size_t e;
  for (e = 0; e < n; e++) f[e] = 0.5f * rnd(kind, id, 0, e);
}

/* Allocates and fills the trainer's buffers (params from the ids, zero grads, mirrors = the
   nearest bf16 of the initial params). No optimizer yet. */
static void tr_buffers(trainer *t, const model *md, const setup *s, int cuda) {
  int i;
  memset(t, 0, sizeof *t);
  t->cuda = cuda;
  t->md = *md;
  t->s = *s;
  t->gmul = 1.0f;
  for (i = 0; i < md->nm; i++) {
    size_t n = mat_total(&md->m[i]);
    float *f = (float *)xmalloc(n * 4);
    void *h = xmalloc(n * 4);
    init_param_values(f, 1, (unsigned)md->m[i].id, n);
    t->param[i] = tr_mem(t, n * dsize(s->param_dtype));
    encode(h, s->param_dtype, f, n);
    tr_put(t, t->param[i], h, n * dsize(s->param_dtype));
    if (s->mirror) {
      t->mirror[i] = tr_mem(t, n * 2);
      encode(h, MUON_DTYPE_BF16, f, n);
      tr_put(t, t->mirror[i], h, n * 2);
    }
    t->grad[i] = tr_mem(t, n * dsize(s->grad_dtype));
    memset(h, 0, n * 4);
    tr_put(t, t->grad[i], h, n * dsize(s->grad_dtype));
    free(f);
    free(h);
  }
  if (md->adamw) {
    size_t n = md->adamw;
    float *f = (float *)xmalloc(n * 4);
    void *h = xmalloc(n * 4);
    init_param_values(f, 3, 99, n);
    t->aparam = tr_mem(t, n * dsize(s->param_dtype));
    encode(h, s->param_dtype, f, n);
    tr_put(t, t->aparam, h, n * dsize(s->param_dtype));
    if (s->mirror) {
      t->amirror = tr_mem(t, n * 2);
      encode(h, MUON_DTYPE_BF16, f, n);
      tr_put(t, t->amirror, h, n * 2);
    }
    t->agrad = tr_mem(t, n * dsize(s->grad_dtype));
    memset(h, 0, n * 4);
    tr_put(t, t->agrad, h, n * dsize(s->grad_dtype));
    free(f);
    free(h);
  }
}

static int tr_create(trainer *t) {
  muon_desc d = muon_default_desc();
  muon_status st;
  d.hparams = t->s.hp;
  d.adamw.lr = t->s.hp.lr;
  d.on_nonfinite = t->s.on_nonfinite;
  d.compute = t->cuda ? &G : NULL;
  d.rounding = t->s.rounding;
  d.seed = t->s.seed;
  d.state_on_host = t->s.state_on_host;
  st = muon_create(&t->opt, &d);
  CHECK(st == MUON_OK, "muon_create (%s): %s", t->cuda ? "cuda" : "cpu", muon_status_string(st));
  if (st != MUON_OK) return 0;
  if (t->s.grad_scale != 0.0f) {
    st = muon_set_grad_scale(t->opt, t->s.grad_scale);
    CHECK(st == MUON_OK, "muon_set_grad_scale: %s", muon_error(t->opt));
  }
  return 1;
}

static muon_status tr_add_matrix(trainer *t, int i) {
  muon_matrix m = muon_default_matrix();
  char name[32];
  snprintf(name, sizeof name, "m%d", t->md.m[i].id);
  m.name = name;
  m.param = t->param[i];
  m.grad = t->grad[i];
  m.rows = t->md.m[i].rows;
  m.cols = t->md.m[i].cols;
  m.count = t->md.m[i].count;
  m.param_dtype = t->s.param_dtype;
  m.grad_dtype = t->s.grad_dtype;
  m.mirror = t->mirror[i];
  return muon_add_matrix(t->opt, &m, &t->index[i]);
}

static muon_status tr_add_adamw(trainer *t) {
  muon_adamw_param p = muon_default_adamw_param();
  p.name = "bias";
  p.param = t->aparam;
  p.grad = t->agrad;
  p.size = t->md.adamw;
  p.param_dtype = t->s.param_dtype;
  p.grad_dtype = t->s.grad_dtype;
  p.mirror = t->amirror;
  return muon_add_adamw_param(t->opt, &p, &t->aindex);
}

static int tr_init(trainer *t, const model *md, const setup *s, int cuda) {
  int i;
  muon_status st;
  tr_buffers(t, md, s, cuda);
  if (!tr_create(t)) return 0;
  for (i = 0; i < md->nm; i++) {
    st = tr_add_matrix(t, i);
    CHECK(st == MUON_OK, "muon_add_matrix %d: %s", i, muon_error(t->opt));
    if (st != MUON_OK) return 0;
  }
  if (md->adamw) {
    st = tr_add_adamw(t);
    CHECK(st == MUON_OK, "muon_add_adamw_param: %s", muon_error(t->opt));
    if (st != MUON_OK) return 0;
  }
  return 1;
}

static void tr_free(trainer *t) {
  int i;
  muon_destroy(t->opt);
  t->opt = NULL;
  for (i = 0; i < t->md.nm; i++) {
    tr_release(t, t->param[i]);
    tr_release(t, t->grad[i]);
    tr_release(t, t->mirror[i]);
  }
  tr_release(t, t->aparam);
  tr_release(t, t->agrad);
  tr_release(t, t->amirror);
  memset(t->param, 0, sizeof t->param);
  memset(t->grad, 0, sizeof t->grad);
  memset(t->mirror, 0, sizeof t->mirror);
  t->aparam = t->agrad = t->amirror = NULL;
}

/* Gradients of `step` into the trainer's grad buffers; a NaN at one element of matrix nan_mat
   and/or of the AdamW param (-1: none). */
static void tr_grads(trainer *t, int step, int nan_mat, int nan_adamw) {
  int i;
  size_t e;
  for (i = 0; i < t->md.nm; i++) {
    const mspec *m = &t->md.m[i];
    size_t n = mat_total(m);
    float *f = (float *)xmalloc(n * 4), mag = 0.5f * (float)(1 + m->id % 3);
    void *h = xmalloc(n * 4);
    for (e = 0; e < n; e++) {
      f[e] = mag * rnd(2, (unsigned)m->id, (unsigned)step, e);
      f[e] *= t->gmul;
    }
    if (i == nan_mat) f[7 % n] = bits_f(0x7fc00000u);
    encode(h, t->s.grad_dtype, f, n);
    tr_put(t, t->grad[i], h, n * dsize(t->s.grad_dtype));
    free(f);
    free(h);
  }
  if (t->md.adamw) {
    size_t n = t->md.adamw;
    float *f = (float *)xmalloc(n * 4);
    void *h = xmalloc(n * 4);
    for (e = 0; e < n; e++) {
      f[e] = 0.1f * rnd(4, 99, (unsigned)step, e);
      f[e] *= t->gmul;
    }
    if (nan_adamw >= 0) f[(size_t)nan_adamw % n] = t->poison != 0.0f ? t->poison : bits_f(0x7fc00000u);
    encode(h, t->s.grad_dtype, f, n);
    tr_put(t, t->agrad, h, n * dsize(t->s.grad_dtype));
    free(f);
    free(h);
  }
}

static muon_status tr_step(trainer *t, int step) {
  muon_status st;
  tr_grads(t, step, -1, -1);
  st = muon_step(t->opt);
  CHECK(st == MUON_OK, "muon_step %d (%s): %s", step, t->cuda ? "cuda" : "cpu", muon_error(t->opt));
  return st;
}

/* ---- snapshots: everything the user can see, copied to the host ------------------------------ */
typedef struct snap {
  int nm;
  size_t n[MAXM], esize;      /* elements of each matrix (all slices), bytes per param element */
  void *param[MAXM];
  uint16_t *mirror[MAXM];
  float *mom[MAXM];           /* every slice's momentum, concatenated like the params */
  size_t an;                  /* AdamW elements, 0 if none */
  void *aparam;
  uint16_t *amirror;
  unsigned char *state;       /* muon_state_save (momentum, AdamW moments, step counts) */
  size_t state_n;
  muon_status state_status;   /* what muon_state_save returned */
  char state_error[600];      /* and muon_error after it, if it failed */
} snap;

static void snap_take(snap *sn, const trainer *t, int with_state) {
  int i;
  size_t k;
  memset(sn, 0, sizeof *sn);
  sn->nm = t->md.nm;
  sn->esize = dsize(t->s.param_dtype);
  for (i = 0; i < t->md.nm; i++) {
    const mspec *m = &t->md.m[i];
    size_t n = mat_total(m);
    sn->n[i] = n;
    sn->param[i] = xmalloc(n * sn->esize);
    tr_get(t, sn->param[i], t->param[i], n * sn->esize);
    if (t->mirror[i]) {
      sn->mirror[i] = (uint16_t *)xmalloc(n * 2);
      tr_get(t, sn->mirror[i], t->mirror[i], n * 2);
    }
    sn->mom[i] = (float *)xmalloc(n * 4);
    for (k = 0; k < slices(m); k++) {
      const void *buf = NULL;
      size_t size = 0;
      muon_momentum_format f = MUON_MOMENTUM_FP32;
      muon_status st = muon_get_momentum_stored(t->opt, t->index[i] + (int)k, &buf, &size, &f);
      int ok = st == MUON_OK && buf && size == mat_n(m);
      CHECK(ok, "muon_get_momentum_stored(%d): %s, size %zu", t->index[i] + (int)k, muon_status_string(st), size);
      if (ok && t->cuda && t->s.state_on_host)   /* pinned host memory, once the queue is done */
        CHECK(G.vt->sync(G.ctx) == MUON_OK, "sync before reading host-resident momentum");
      if (ok && f == MUON_MOMENTUM_BF16) {   /* bf16 values: widened here */
        float *dst = sn->mom[i] + k * mat_n(m);
        uint16_t *h = (uint16_t *)xmalloc(size * 2 + 2);
        size_t e;
        if (t->cuda && t->s.state_on_host) memcpy(h, buf, size * 2);
        else tr_get(t, h, buf, size * 2);
        for (e = 0; e < size; e++) { uint32_t u = (uint32_t)h[e] << 16; memcpy(&dst[e], &u, 4); }
        free(h);
      } else if (ok && f == MUON_MOMENTUM_INT8) {   /* blocks: decoded here by muon.h's formula */
        size_t bytes = size + (size + MUON_Q8_BLOCK - 1) / MUON_Q8_BLOCK, e;
        unsigned char *q = (unsigned char *)xmalloc(bytes + 1);
        if (t->cuda && t->s.state_on_host) memcpy(q, buf, bytes);
        else tr_get(t, q, buf, bytes);
        for (e = 0; e < size; e += MUON_Q8_BLOCK)
          muon__q8_decode(q + e + e / MUON_Q8_BLOCK, size - e < MUON_Q8_BLOCK ? size - e : MUON_Q8_BLOCK,
                          sn->mom[i] + k * mat_n(m) + e);
        free(q);
      } else if (ok && t->cuda && t->s.state_on_host) {
        memcpy(sn->mom[i] + k * mat_n(m), buf, size * 4);
      } else if (ok) tr_get(t, sn->mom[i] + k * mat_n(m), buf, size * 4);
      else memset(sn->mom[i] + k * mat_n(m), 0, mat_n(m) * 4);
    }
  }
  if (t->md.adamw) {
    sn->an = t->md.adamw;
    sn->aparam = xmalloc(sn->an * sn->esize);
    tr_get(t, sn->aparam, t->aparam, sn->an * sn->esize);
    if (t->amirror) {
      sn->amirror = (uint16_t *)xmalloc(sn->an * 2);
      tr_get(t, sn->amirror, t->amirror, sn->an * 2);
    }
  }
  if (with_state) {
    muon_status st;
    sn->state_n = muon_state_size(t->opt);
    sn->state = (unsigned char *)xmalloc(sn->state_n);
    st = muon_state_save(t->opt, sn->state, sn->state_n);
    sn->state_status = st;
    /* with_state 2: the caller checks state_status */
    CHECK(st == MUON_OK || with_state == 2, "muon_state_save (%s): %s", t->cuda ? "cuda" : "cpu", muon_error(t->opt));
    if (st != MUON_OK) {
      snprintf(sn->state_error, sizeof sn->state_error, "%s", muon_error(t->opt));
      free(sn->state);
      sn->state = NULL;
    }
  }
}

static void snap_free(snap *sn) {
  int i;
  for (i = 0; i < MAXM; i++) { free(sn->param[i]); free(sn->mirror[i]); free(sn->mom[i]); }
  free(sn->aparam);
  free(sn->amirror);
  free(sn->state);
  memset(sn, 0, sizeof *sn);
}

/* Param element e of matrix i as a float. */
static float snap_param(const snap *sn, int i, size_t e) {
  return sn->esize == 2 ? bf16_f(((const uint16_t *)sn->param[i])[e]) : ((const float *)sn->param[i])[e];
}
static float snap_aparam(const snap *sn, size_t e) {
  return sn->esize == 2 ? bf16_f(((const uint16_t *)sn->aparam)[e]) : ((const float *)sn->aparam)[e];
}

/* 1 if the buffers are equal; else reports the first differing element (of esize bytes). */
static int same_bytes(const void *a, const void *b, size_t n, size_t esize, const char *what, const char *part, int i) {
  size_t e;
  if (memcmp(a, b, n * esize) == 0) return 1;
  for (e = 0; e < n; e++)
    if (memcmp((const char *)a + e * esize, (const char *)b + e * esize, esize) != 0) break;
  CHECK(0, "%s: %s %d differs, first at element %zu", what, part, i, e);
  return 0;
}

/* Bitwise equality of everything both snapshots hold: params, mirrors, momentum, AdamW param and
   mirror, and the state blob (AdamW moments, step counts) when both have one. */
static int snap_same(const snap *a, const snap *b, const char *what) {
  int i, ok = 1;
  for (i = 0; i < a->nm && i < b->nm; i++) {
    ok &= same_bytes(a->param[i], b->param[i], a->n[i], a->esize, what, "params of matrix", i);
    if (a->mirror[i] && b->mirror[i]) ok &= same_bytes(a->mirror[i], b->mirror[i], a->n[i], 2, what, "mirror of matrix", i);
    ok &= same_bytes(a->mom[i], b->mom[i], a->n[i], 4, what, "momentum of matrix", i);
  }
  if (a->an && b->an) {
    ok &= same_bytes(a->aparam, b->aparam, a->an, a->esize, what, "AdamW param", 0);
    if (a->amirror && b->amirror) ok &= same_bytes(a->amirror, b->amirror, a->an, 2, what, "AdamW mirror", 0);
  }
  if (a->state && b->state) {
    CHECK(a->state_n == b->state_n, "%s: state sizes %zu vs %zu", what, a->state_n, b->state_n);
    if (a->state_n == b->state_n) ok &= same_bytes(a->state, b->state, a->state_n, 1, what, "state blob (AdamW moments, steps)", 0);
    else ok = 0;
  }
  return ok;
}

static muon_stats stats_of(const muon_optimizer *opt) {
  muon_stats st;
  memset(&st, 0, sizeof st);
  CHECK(muon_get_stats(opt, &st) == MUON_OK, "muon_get_stats failed");
  return st;
}

/* Between cases: the shared backend must not hold a failure the case left behind (checked
   against the case just run), and is cleared so that one failing case cannot cascade. */
static void drain(void) {
  muon_status st = G.vt->sync(G.ctx);
  CHECK(st == MUON_OK, "the shared CUDA backend still held a failure after this case: %s", G.vt->error(G.ctx));
#ifdef MUON_CUDA_STANDIN
  if (st != MUON_OK) {
    muon_standin_reset_errors();
    (void)G.vt->sync(G.ctx);
  }
#endif
}

static void skip(const char *name) { printf("SKIP %s (needs the stand-in's test hooks)\n", name); }

/* =============================================================================================
   1. CPU vs CUDA: the same training (7 shapes wide and tall, odd sizes, a stack of 3, an AdamW
   param; 5 steps at lr 0.02) on host buffers with the CPU backend and on device buffers with the
   CUDA backend, for each configuration. Proves the CUDA path computes what the CPU path computes:
   NS (cuBLAS in fp32 / bf16, both coefficient presets), the momentum styles, the lr adjustment
   and the transposition of tall matrices; momentum and AdamW are element-wise and are expected
   to agree bitwise (reported; the bounds are test_golden.c's).
   ============================================================================================= */
static snap g_final[2];       /* the CUDA runs of fp32 and bf16, for case 2 */
static setup g_final_setup[2];
static int g_have_final[2];

static void case_vs_cpu(const setup *s, int keep) {
  trainer cpu, gpu;
  snap sc, sg;
  float *p0[MAXM], *a0 = NULL, *fa = NULL, *fb = NULL;
  int bf16 = s->hp.precision == MUON_PRECISION_BF16, step, i, mom_bitwise = 1, adamw_bitwise = 1;
  double worst_param = 0, worst_update = 0, worst_mom = 0, worst_adamw = 0;
  char worst_at[32] = "-";
  size_t k, e;
  TEST_CASE(s->title);
  memset(p0, 0, sizeof p0);
  if (!tr_init(&cpu, &M_BIG, s, 0) || !tr_init(&gpu, &M_BIG, s, 1)) return;
  for (i = 0; i < M_BIG.nm; i++) {
    p0[i] = (float *)xmalloc(mat_total(&M_BIG.m[i]) * 4);
    init_param_values(p0[i], 1, (unsigned)M_BIG.m[i].id, mat_total(&M_BIG.m[i]));
  }
  a0 = (float *)xmalloc(M_BIG.adamw * 4);
  init_param_values(a0, 3, 99, M_BIG.adamw);
  fa = (float *)xmalloc(300 * 384 * 4);
  fb = (float *)xmalloc(300 * 384 * 4);
  for (step = 0; step < STEPS; step++) {
    if (tr_step(&cpu, step) != MUON_OK || tr_step(&gpu, step) != MUON_OK) break;
    snap_take(&sc, &cpu, 0);
    snap_take(&sg, &gpu, step == STEPS - 1);
    for (i = 0; i < M_BIG.nm; i++) {
      const mspec *m = &M_BIG.m[i];
      size_t n = mat_n(m);
      for (k = 0; k < slices(m); k++) {
        double pr, ur, mr;
        for (e = 0; e < n; e++) { fa[e] = snap_param(&sg, i, k * n + e); fb[e] = snap_param(&sc, i, k * n + e); }
        pr = rel_err(fa, fb, n);
        ur = update_err(fa, fb, p0[i] + k * n, n);
        mr = rel_err(sg.mom[i] + k * n, sc.mom[i] + k * n, n);
        if (memcmp(sg.mom[i] + k * n, sc.mom[i] + k * n, n * 4) != 0) mom_bitwise = 0;
        if (pr > worst_param) {
          worst_param = pr;
          if (!bf16) snprintf(worst_at, sizeof worst_at, "%dx%d%s", m->rows, m->cols, m->count > 1 ? " stack" : "");
        }
        if (ur > worst_update) {
          worst_update = ur;
          if (bf16) snprintf(worst_at, sizeof worst_at, "%dx%d%s", m->rows, m->cols, m->count > 1 ? " stack" : "");
        }
        if (mr > worst_mom) worst_mom = mr;
        if (bf16)
          CHECK(ur <= BF16_UPDATE_TOL, "step %d: %dx%d[%zu] (bf16 NS): update rel err %.3g > %.3g", step, m->rows, m->cols, k, ur, BF16_UPDATE_TOL);
        else
          CHECK(pr <= FP32_PARAM_TOL, "step %d: %dx%d[%zu]: param rel err %.3g > %.3g", step, m->rows, m->cols, k, pr, FP32_PARAM_TOL);
        CHECK(mr <= MOMENTUM_TOL, "step %d: %dx%d[%zu]: momentum rel err %.3g > %.3g", step, m->rows, m->cols, k, mr, MOMENTUM_TOL);
      }
    }
    {
      double ar;
      for (e = 0; e < M_BIG.adamw; e++) { fa[e] = snap_aparam(&sg, e); fb[e] = snap_aparam(&sc, e); }
      ar = rel_err(fa, fb, M_BIG.adamw);
      if (ar > worst_adamw) worst_adamw = ar;
      if (memcmp(sg.aparam, sc.aparam, M_BIG.adamw * 4) != 0) adamw_bitwise = 0;
      CHECK(ar <= ADAMW_TOL, "step %d: AdamW param rel err %.3g > %.3g", step, ar, ADAMW_TOL);
    }
    snap_free(&sc);
    if (step == STEPS - 1 && keep >= 0) {
      g_final[keep] = sg;
      g_final_setup[keep] = *s;
      g_have_final[keep] = 1;
    } else {
      snap_free(&sg);
    }
  }
  if (s->hp.momentum_format != MUON_MOMENTUM_FP32)   /* cast / blockwise on the shared formulas: the CPU's bits */
    CHECK(mom_bitwise, "bf16 or int8 momentum: CUDA's differs from the CPU's");
  printf("  %-40s worst %s %.2e (bound %.0e, at %s); momentum rel %.2e (%s); AdamW rel %.2e (%s)\n", s->title + 3,
         bf16 ? "update rel err" : "param rel err", bf16 ? worst_update : worst_param, bf16 ? BF16_UPDATE_TOL : FP32_PARAM_TOL,
         worst_at, worst_mom, mom_bitwise ? "bitwise" : "NOT bitwise", worst_adamw, adamw_bitwise ? "bitwise" : "NOT bitwise");
  if (bf16) printf("  %-40s (param rel err %.2e)\n", "", worst_param);
  for (i = 0; i < M_BIG.nm; i++) free(p0[i]);
  free(a0);
  free(fa);
  free(fb);
  tr_free(&cpu);
  tr_free(&gpu);
}

static void cases_vs_cpu(void) {
  setup s;
  s = base_setup("1. CPU vs CUDA: fp32 (defaults)");
  case_vs_cpu(&s, 0);
  drain();
  s = base_setup("1. CPU vs CUDA: bf16 NS precision");
  s.hp.precision = MUON_PRECISION_BF16;
  case_vs_cpu(&s, 1);
  drain();
  s = base_setup("1. CPU vs CUDA: bf16 momentum");
  s.hp.momentum_format = MUON_MOMENTUM_BF16;
  case_vs_cpu(&s, -1);
  drain();
  s = base_setup("1. CPU vs CUDA: int8 momentum");
  s.hp.momentum_format = MUON_MOMENTUM_INT8;
  case_vs_cpu(&s, -1);
  drain();
  s = base_setup("1. CPU vs CUDA: Polar Express coefficients");
  muon_set_ns_preset(&s.hp, MUON_NS_POLAR_EXPRESS);
  case_vs_cpu(&s, -1);
  drain();
  s = base_setup("1. CPU vs CUDA: SGD momentum, no nesterov");
  s.hp.momentum_style = MUON_MOMENTUM_SGD;
  s.hp.nesterov = 0;
  case_vs_cpu(&s, -1);
  drain();
  s = base_setup("1. CPU vs CUDA: adjust_lr match_rms_adamw");
  s.hp.adjust_lr = MUON_ADJUST_LR_MATCH_RMS_ADAMW;
  case_vs_cpu(&s, -1);
  drain();
  s = base_setup("1. CPU vs CUDA: symmetric = 0");
  s.hp.symmetric = 0;
  case_vs_cpu(&s, -1);
  drain();
}

/* 1b. The bf16 bound above cannot tell bf16 NS from fp32 NS (they differ by ~1.5e-2, see
   test_golden.c), so: with zero params, no weight decay, lr 2^-6 and adjust_lr NONE, one step
   leaves param = -2^-6 * O exactly. In bf16 precision every O element on CUDA must then be a
   bf16 value (low 16 bits zero); in fp32 precision most are not. Fails if the backend ignores
   hp->precision. */
static void case_bf16_engaged(void) {
  int k, i;
  TEST_CASE("1b. CUDA bf16 NS outputs are bf16 values (fp32 NS outputs are not)");
  for (k = 0; k < 2; k++) {
    trainer t;
    setup s = base_setup("");
    snap sn;
    size_t e, total = 0, not_bf16 = 0;
    s.hp.lr = 1.0f / 64;
    s.hp.weight_decay = 0;
    s.hp.adjust_lr = MUON_ADJUST_LR_NONE;
    s.hp.precision = k ? MUON_PRECISION_BF16 : MUON_PRECISION_FP32;
    if (!tr_init(&t, &M_MID, &s, 1)) return;
    for (i = 0; i < M_MID.nm; i++) {
      float *z = (float *)calloc(mat_total(&M_MID.m[i]), 4);
      if (!z) exit(2);
      tr_put(&t, t.param[i], z, mat_total(&M_MID.m[i]) * 4);
      free(z);
    }
    tr_step(&t, 0);
    snap_take(&sn, &t, 0);
    for (i = 0; i < M_MID.nm; i++)
      for (e = 0; e < sn.n[i]; e++) {
        float o = -64.0f * ((const float *)sn.param[i])[e];
        if (f_bits(o) & 0xffffu) not_bf16++;
        total++;
      }
    if (k) CHECK(not_bf16 == 0, "bf16 NS: %zu of %zu O elements are not bf16 values", not_bf16, total);
    else CHECK(not_bf16 > total / 2, "fp32 NS: only %zu of %zu O elements are not bf16 values", not_bf16, total);
    printf("  %s NS: %zu of %zu O elements not bf16-valued\n", k ? "bf16" : "fp32", not_bf16, total);
    snap_free(&sn);
    tr_free(&t);
  }
}

/* =============================================================================================
   2. Determinism: the fp32 and bf16 CUDA runs of case 1, repeated with fresh optimizers and
   buffers, give the same bits (params, momentum, AdamW param, state blob). Fails if anything in
   the path depends on uninitialised device memory, allocation addresses or run order.
   ============================================================================================= */
static void case_determinism(void) {
  int k, step;
  TEST_CASE("2. determinism: CUDA runs repeated are bitwise equal");
  for (k = 0; k < 2; k++) {
    trainer t;
    snap again;
    if (!g_have_final[k]) { CHECK(0, "case 1 did not keep its %s run", k ? "bf16" : "fp32"); continue; }
    if (!tr_init(&t, &M_BIG, &g_final_setup[k], 1)) return;
    for (step = 0; step < STEPS; step++)
      if (tr_step(&t, step) != MUON_OK) break;
    snap_take(&again, &t, 1);
    if (snap_same(&g_final[k], &again, k ? "bf16 rerun" : "fp32 rerun"))
      printf("  %s: %d steps rerun, every bit the same\n", k ? "bf16" : "fp32", STEPS);
    snap_free(&again);
    snap_free(&g_final[k]);
    g_have_final[k] = 0;
    tr_free(&t);
  }
}

/* =============================================================================================
   3. Host waits: with every gradient present on one device, a step waits for the backend exactly
   twice (the non-finite verdicts, and once before the apply): muon_get_stats' syncs delta is 2
   for every step, the first (planning) included. On the stand-in also the backend's real waits:
   exactly 2 cudaStreamSynchronize and 2 executions of queued work, no blocking cudaMemcpy or
   cudaDeviceSynchronize, and no cudaMalloc / cudaFree inside muon_step.
   ============================================================================================= */
static void case_syncs(void) {
  trainer t;
  setup s = base_setup("");
  int step;
  long long calls = -1;
  TEST_CASE("3. host waits: exactly 2 syncs per step");
  if (!tr_init(&t, &M_MID, &s, 1)) return;
  for (step = 0; step < STEPS; step++) {
    muon_stats a, b;
    muon_status st;
#ifdef MUON_CUDA_STANDIN
    static const char *const names[] = {"cudaStreamSynchronize", "flush", "cudaMemcpy", "cudaDeviceSynchronize",
                                        "cudaMalloc", "cudaFree", "cudaMallocHost", "cudaEventSynchronize"};
    static const long long want[] = {2, 2, 0, 0, 0, 0, 0, 0};
    long long before[8];
    int j;
#endif
    tr_grads(&t, step, -1, -1);
    a = stats_of(t.opt);
#ifdef MUON_CUDA_STANDIN
    for (j = 0; j < 8; j++) before[j] = muon_standin_calls(names[j]);
#endif
    st = muon_step(t.opt);
#ifdef MUON_CUDA_STANDIN
    for (j = 0; j < 8; j++) {
      long long d = muon_standin_calls(names[j]) - before[j];
      if (step == 0 && strcmp(names[j], "cudaMalloc") == 0) continue; /* the first step plans: it allocates */
      CHECK(d == want[j], "step %d: %lld calls of %s inside muon_step, expected %lld", step, d, names[j], want[j]);
    }
#endif
    CHECK(st == MUON_OK, "muon_step %d: %s", step, muon_error(t.opt));
    b = stats_of(t.opt);
    CHECK(b.syncs - a.syncs == 2, "step %d: %lld syncs, expected 2", step, b.syncs - a.syncs);
    CHECK(b.steps - a.steps == 1, "step %d: steps counter moved by %lld", step, b.steps - a.steps);
    if (step == 1) calls = b.backend_calls - a.backend_calls;
    if (step > 1)
      CHECK(b.backend_calls - a.backend_calls == calls, "step %d: %lld backend calls, step 1 made %lld", step,
            b.backend_calls - a.backend_calls, calls);
  }
  printf("  every step: 2 syncs, %lld backend calls%s\n", calls,
#ifdef MUON_CUDA_STANDIN
         "; stand-in: 2 cudaStreamSynchronize, 2 flushes, 0 cudaMemcpy, 0 cudaMalloc / cudaFree after planning"
#else
         ""
#endif
  );
  tr_free(&t);
}

/* =============================================================================================
   4. Batching: three matrices with one operand shape (24x40, 40x24 transposed, 24x40) in one
   round are orthogonalised by ONE newton_schulz call per step (stats.ns_batches +1, ns_calls +3;
   on the stand-in: one strided-batched GEMM per NS product, 3 * ns_steps per step), and the
   results are bitwise those of three optimizers holding one matrix each (batch 1): a batched
   operand must not see its neighbours.
   ============================================================================================= */
static void case_batching(void) {
  trainer all, one[3];
  setup s = base_setup("");
  int i, step;
  TEST_CASE("4. batching: 3 same-shaped matrices, 1 NS batch, = batch-1 results bitwise");
  if (!tr_init(&all, &M_BATCH, &s, 1)) return;
  for (i = 0; i < 3; i++) {
    model single;
    memset(&single, 0, sizeof single);
    single.nm = 1;
    single.m[0] = M_BATCH.m[i];
    if (!tr_init(&one[i], &single, &s, 1)) return;
  }
  for (step = 0; step < STEPS; step++) {
    muon_stats a, b;
#ifdef MUON_CUDA_STANDIN
    long long g0 = muon_standin_calls("cublasGemmEx"), g1;
#endif
    snap sa;
    a = stats_of(all.opt);
    if (tr_step(&all, step) != MUON_OK) break;
    b = stats_of(all.opt);
#ifdef MUON_CUDA_STANDIN
    g1 = muon_standin_calls("cublasGemmEx");
    CHECK(g1 - g0 == 3 * 3 * s.hp.ns_steps, "step %d: %lld GEMM calls, expected %d (3 per NS iteration and operand)",
          step, g1 - g0, 3 * 3 * s.hp.ns_steps);
#endif
    CHECK(b.ns_batches - a.ns_batches == 1, "step %d: %lld NS batches, expected 1", step, b.ns_batches - a.ns_batches);
    CHECK(b.ns_calls - a.ns_calls == 3, "step %d: %lld NS calls, expected 3", step, b.ns_calls - a.ns_calls);
    snap_take(&sa, &all, 0);
    for (i = 0; i < 3; i++) {
      snap s1;
      char what[64];
      a = stats_of(one[i].opt);
      if (tr_step(&one[i], step) != MUON_OK) break;
      b = stats_of(one[i].opt);
      CHECK(b.ns_batches - a.ns_batches == 1 && b.ns_calls - a.ns_calls == 1, "single %d: %lld batches, %lld calls", i,
            b.ns_batches - a.ns_batches, b.ns_calls - a.ns_calls);
      snap_take(&s1, &one[i], 0);
      snprintf(what, sizeof what, "step %d, batched matrix %d vs alone", step, i);
      same_bytes(sa.param[i], s1.param[0], sa.n[i], 4, what, "params of matrix", i);
      same_bytes(sa.mom[i], s1.mom[0], sa.n[i], 4, what, "momentum of matrix", i);
      snap_free(&s1);
    }
    snap_free(&sa);
  }
  printf("  per step: 1 NS batch of 3 operands; params and momentum = batch-1 runs, bitwise\n");
  tr_free(&all);
  for (i = 0; i < 3; i++) tr_free(&one[i]);
}

/* =============================================================================================
   5. Non-finite gradients: a NaN in one matrix's fp32 gradient (then in the AdamW gradient)
   fails the step with MUON_ERR_NONFINITE and changes nothing (params, momentum, AdamW param and
   moments, step count: bitwise); the optimizer then steps normally. With on_nonfinite SKIP, the
   step succeeds, skips exactly that matrix (or the AdamW param) and updates everything else: the
   result is bitwise that of an optimizer whose gradient for it is absent (NULL) that step.
   ============================================================================================= */
static void case_nonfinite(void) {
  trainer e, sk, ref;
  setup s = base_setup("");
  snap before, after, a, b;
  muon_status st;
  int step, i;
  TEST_CASE("5. non-finite gradients: ERROR leaves all unchanged, SKIP skips only that one");
  if (!tr_init(&e, &M_SMALL, &s, 1)) return;
  for (step = 0; step < 2; step++) tr_step(&e, step);
  snap_take(&before, &e, 1);
  tr_grads(&e, 2, 1, -1);
  st = muon_step(e.opt);
  CHECK(st == MUON_ERR_NONFINITE, "NaN in matrix 1's gradient: %s, expected MUON_ERR_NONFINITE", muon_status_string(st));
  CHECK(strstr(muon_error(e.opt), "NaN") != NULL, "message does not say NaN: %s", muon_error(e.opt));
  snap_take(&after, &e, 1);
  snap_same(&before, &after, "after a NaN matrix gradient (ERROR)");
  snap_free(&after);
  tr_grads(&e, 2, -1, 3);
  st = muon_step(e.opt);
  CHECK(st == MUON_ERR_NONFINITE, "NaN in the AdamW gradient: %s, expected MUON_ERR_NONFINITE", muon_status_string(st));
  snap_take(&after, &e, 1);
  snap_same(&before, &after, "after a NaN AdamW gradient (ERROR)");
  snap_free(&after);
  snap_free(&before);
  tr_step(&e, 2);
  tr_free(&e);

  s.on_nonfinite = MUON_NONFINITE_SKIP;
  if (!tr_init(&sk, &M_SMALL, &s, 1)) return;
  s.on_nonfinite = MUON_NONFINITE_ERROR;
  if (!tr_init(&ref, &M_SMALL, &s, 1)) return;
  for (step = 0; step < 2; step++) { tr_step(&sk, step); tr_step(&ref, step); }
  for (step = 2; step < 5; step++) {
    char what[96];
    snap_take(&before, &sk, 0);
    /* step 2: NaN in matrix 1; step 3: NaN in the AdamW param; step 4: all finite */
    tr_grads(&sk, step, step == 2 ? 1 : -1, step == 3 ? 3 : -1);
    tr_grads(&ref, step, -1, -1);
    muon_set_grad(ref.opt, ref.index[1], step == 2 ? NULL : ref.grad[1]);
    muon_set_adamw_grad(ref.opt, ref.aindex, step == 3 ? NULL : ref.agrad);
    st = muon_step(sk.opt);
    CHECK(st == MUON_OK, "SKIP step %d: %s", step, muon_error(sk.opt));
    st = muon_step(ref.opt);
    CHECK(st == MUON_OK, "reference step %d: %s", step, muon_error(ref.opt));
    snap_take(&a, &sk, 1);
    snap_take(&b, &ref, 1);
    snprintf(what, sizeof what, "SKIP step %d vs absent gradient", step);
    snap_same(&a, &b, what);
    for (i = 0; i < M_SMALL.nm; i++) {
      int same_p = memcmp(a.param[i], before.param[i], a.n[i] * 4) == 0;
      int same_m = memcmp(a.mom[i], before.mom[i], a.n[i] * 4) == 0;
      if (step == 2 && i == 1) CHECK(same_p && same_m, "step 2: the NaN matrix changed (param %d, momentum %d)", !same_p, !same_m);
      else CHECK(!same_p && !same_m, "step %d: matrix %d was not updated", step, i);
    }
    if (step == 3) CHECK(memcmp(a.aparam, before.aparam, a.an * 4) == 0, "step 3: the NaN AdamW param changed");
    else CHECK(memcmp(a.aparam, before.aparam, a.an * 4) != 0, "step %d: the AdamW param was not updated", step);
    snap_free(&a);
    snap_free(&b);
    snap_free(&before);
  }
  tr_free(&sk);
  tr_free(&ref);
}

/* =============================================================================================
   5b. Finite values that overflow: an AdamW gradient of 1e30 (v would be +Inf), then a matrix at
   3.4e38 whose bf16 mirror would round to Inf. The CUDA backend gives the CPU's verdict: ERROR
   fails naming the item with nothing changed; SKIP skips that item alone, bitwise a run where
   its gradient is absent.
   ============================================================================================= */
static void case_overflow(void) {
  trainer t[2], sk, ref;
  setup s = base_setup("");
  snap before, after, a, b;
  muon_status st[2];
  int c, k;
  TEST_CASE("5b. overflow: CUDA and CPU give one verdict (AdamW v, a bf16 mirror), nothing applied; SKIP skips it");
  s.mirror = 1;
  s.hp.weight_decay = 0.0f;   /* so that the update keeps 3.4e38 above the largest bf16 */
  for (k = 0; k < 2; k++) {
    for (c = 0; c < 2; c++) {
      if (!tr_init(&t[c], &M_SMALL, &s, c)) return;
      t[c].poison = 1e30f;
      tr_step(&t[c], 0);
      if (k == 1) {   /* matrix 0 at 3.4e38: finite, but past the largest bf16 */
        size_t e, n = mat_total(&t[c].md.m[0]);
        float *f = (float *)xmalloc(n * 4);
        for (e = 0; e < n; e++) f[e] = 3.4e38f;
        tr_put(&t[c], t[c].param[0], f, n * 4);
        free(f);
      }
      snap_take(&before, &t[c], 1);
      tr_grads(&t[c], 1, -1, k == 0 ? 3 : -1);
      st[c] = muon_step(t[c].opt);
      CHECK(st[c] == MUON_ERR_NONFINITE, "%s, %s: %s, expected MUON_ERR_NONFINITE (%s)", k ? "mirror" : "AdamW",
            c ? "cuda" : "cpu", muon_status_string(st[c]), muon_error(t[c].opt));
      CHECK(strstr(muon_error(t[c].opt), k ? "'m0'" : "'bias'") != NULL, "message does not name it: %s",
            muon_error(t[c].opt));
      snap_take(&after, &t[c], 1);
      snap_same(&before, &after, k ? "after an overflowing mirror (ERROR)" : "after an overflowing AdamW v (ERROR)");
      snap_free(&after);
      snap_free(&before);
      tr_free(&t[c]);
    }
  }
  s.on_nonfinite = MUON_NONFINITE_SKIP;
  if (!tr_init(&sk, &M_SMALL, &s, 1) || !tr_init(&ref, &M_SMALL, &s, 1)) return;
  sk.poison = 1e30f;
  tr_step(&sk, 0);
  tr_step(&ref, 0);
  tr_grads(&sk, 1, -1, 3);
  tr_grads(&ref, 1, -1, -1);
  muon_set_adamw_grad(ref.opt, ref.aindex, NULL);
  CHECK(muon_step(sk.opt) == MUON_OK && muon_step(ref.opt) == MUON_OK, "SKIP: %s", muon_error(sk.opt));
  snap_take(&a, &sk, 1);
  snap_take(&b, &ref, 1);
  snap_same(&a, &b, "SKIP of an overflowing AdamW param vs its gradient absent");
  snap_free(&a);
  snap_free(&b);
  tr_free(&sk);
  tr_free(&ref);
}

#ifdef MUON_CUDA_STANDIN
/* =============================================================================================
   6. All-or-nothing under backend faults (stand-in): for each cuBLAS function a step calls, and
   for N = 1, 2, ... until a step no longer reaches call N, the N-th call of that function in a
   step fails (CUBLAS_STATUS_EXECUTION_FAILED). Every such step must return MUON_ERR_BACKEND
   with the cuBLAS status in muon_error, change nothing (params, momentum, AdamW param, and the
   state blob with the AdamW moments and step counts: bitwise), and the next step must equal the
   same step of an optimizer that never saw a fault. The same for a kernel whose execution fails
   (the error surfaces at a sync), at each launch index of a step: a launch queued before the
   step's last sync must fail that step and change nothing. Launches queued after it (the
   commit: momentum + apply per matrix, AdamW) cannot be reported by the step that queued them:
   muon.h documents that such a failure surfaces at the next step's first sync; this case
   checks exactly that, and that only the commit's launches behave so.
   Each N gets fresh optimizers, one warm-up step, then the faulted step. Two plain retries
   come first: right after a step failed at a GEMM, the very next muon_step of the same
   optimizer, and the first muon_step of another optimizer sharing the backend, must succeed;
   and muon_state_save right after a failed step must not fail with that step's error.
   ============================================================================================= */
typedef struct fault_tally {
  int failing, deferred, passes;
  int stale;                  /* muon_state_save after the failed step failed */
  char stale_error[600];      /* its first message */
} fault_tally;

/* Returns 1 when the step did not reach the N-th call (the loop is over). */
static int fault_once(const char *name, int nth, int commit_first, fault_tally *tally) {
  trainer a, r;
  setup s = base_setup("");
  snap before, after, sa, sr;
  muon_status st;
  long long c0, used;
  int kernel = strcmp(name, "kernel") == 0, done = 0;
  char what[128], fn[64];
  if (!tr_init(&a, &M_SMALL, &s, 1) || !tr_init(&r, &M_SMALL, &s, 1)) return 1;
  tr_step(&a, 0);
  tr_step(&r, 0);
  tr_grads(&a, 1, -1, -1);
  snap_take(&before, &a, 1);
  c0 = muon_standin_calls(name);
  muon_standin_fail(name, nth);
  st = muon_step(a.opt);
  used = muon_standin_calls(name) - c0;
  muon_standin_fail(name, 0);
  snprintf(what, sizeof what, "%s #%d failing", name, nth);
  if (used < nth) {
    /* not reached: a normal step, equal to the reference's */
    done = 1;
    tally->passes++;
    CHECK(st == MUON_OK, "%s: a step without the fault failed: %s", what, muon_error(a.opt));
    tr_step(&r, 1);
    snap_take(&sa, &a, 1);
    snap_take(&sr, &r, 1);
    snap_same(&sa, &sr, what);
    snap_free(&sa);
    snap_free(&sr);
  } else if (kernel && st == MUON_OK) {
    /* deferred: must be one of the commit's launches, reported by the next step (the sticky
       error also fails any upload, so that step reuses the gradients in place) */
    tally->deferred++;
    CHECK(nth >= commit_first, "%s: launch %d is before the commit (first commit launch %d) but the step returned MUON_OK",
          what, nth, commit_first);
    st = muon_step(a.opt);
    CHECK(st == MUON_ERR_BACKEND, "%s: the step after a failed commit launch returned %s", what, muon_status_string(st));
    CHECK(strstr(muon_error(a.opt), "cudaErrorLaunchFailure") != NULL, "%s: message: %s", what, muon_error(a.opt));
    muon_standin_reset_errors();
  } else {
    tally->failing++;
    CHECK(st == MUON_ERR_BACKEND, "%s: muon_step returned %s, expected MUON_ERR_BACKEND", what, muon_status_string(st));
    if (kernel) {
      CHECK(nth < commit_first, "%s: a commit launch failed its own step (unexpected, but harmless)", what);
      CHECK(strstr(muon_error(a.opt), "cudaErrorLaunchFailure") != NULL, "%s: muon_error lacks cudaErrorLaunchFailure: %s",
            what, muon_error(a.opt));
      muon_standin_reset_errors(); /* the execution error is sticky, as on a GPU */
    } else {
      size_t len = strlen(name);
      snprintf(fn, sizeof fn, "%.*s", (int)(len > 3 && strcmp(name + len - 3, "_v2") == 0 ? len - 3 : len), name);
      CHECK(strstr(muon_error(a.opt), "CUBLAS_STATUS_EXECUTION_FAILED") != NULL && strstr(muon_error(a.opt), fn) != NULL,
            "%s: muon_error lacks the cuBLAS function and status: %s", what, muon_error(a.opt));
    }
    /* params, mirrors, momentum (copied back), then the state blob for the AdamW moments; a
       muon_state_save that fails with the step's stale error is tallied and retried once */
    snap_take(&after, &a, 2);
    if (after.state_status != MUON_OK) {
      if (!tally->stale++) snprintf(tally->stale_error, sizeof tally->stale_error, "%s", after.state_error);
      after.state_n = muon_state_size(a.opt);
      after.state = (unsigned char *)xmalloc(after.state_n);
      st = muon_state_save(a.opt, after.state, after.state_n);
      CHECK(st == MUON_OK, "%s: muon_state_save failed twice: %s", what, muon_error(a.opt));
    }
    snap_same(&before, &after, what);
    snap_free(&after);
    /* the next step (same gradients) equals the unfaulted optimizer's */
    st = muon_step(a.opt);
    CHECK(st == MUON_OK, "%s: the step after the failed one failed: %s", what, muon_error(a.opt));
    tr_step(&r, 1);
    snap_take(&sa, &a, 1);
    snap_take(&sr, &r, 1);
    snprintf(what, sizeof what, "%s #%d: the next step vs unfaulted", name, nth);
    snap_same(&sa, &sr, what);
    snap_free(&sa);
    snap_free(&sr);
  }
  snap_free(&before);
  tr_free(&a);
  tr_free(&r);
  /* hygiene between iterations: a stale backend failure must not leak into the next one */
  muon_standin_reset_errors();
  (void)G.vt->sync(G.ctx);
  return done;
}

/* The plain retry: a step fails at its first GEMM; the very next muon_step (same gradients,
   nothing in between) must succeed and equal the unfaulted optimizer's step. `other`: instead,
   the next muon_step is the first of a second optimizer sharing the backend (another model in
   the same trainer), which must not inherit the failure either. */
static void fault_retry_at_once(const char *name, int other) {
  trainer a, r, b;
  setup s = base_setup("");
  snap sa, sr;
  muon_status st;
  if (!tr_init(&a, &M_SMALL, &s, 1) || !tr_init(&r, &M_SMALL, &s, 1)) return;
  if (other && !tr_init(&b, &M_MID, &s, 1)) return;
  tr_step(&a, 0);
  tr_step(&r, 0);
  tr_grads(&a, 1, -1, -1);
  muon_standin_fail(name, 1);
  st = muon_step(a.opt);
  muon_standin_fail(name, 0);
  CHECK(st == MUON_ERR_BACKEND, "%s #1 failing: muon_step returned %s", name, muon_status_string(st));
  if (other) {
    tr_grads(&b, 0, -1, -1);
    st = muon_step(b.opt);
    CHECK(st == MUON_OK, "the first step of ANOTHER optimizer on the same backend, after one failed at %s: %s (%s)", name,
          muon_status_string(st), muon_error(b.opt));
    tr_free(&b);
  }
  st = muon_step(a.opt);
  CHECK(st == MUON_OK || other, "retry right after a step that failed at %s: %s (%s)", name, muon_status_string(st), muon_error(a.opt));
  if (st != MUON_OK) {
    st = muon_step(a.opt);
    CHECK(st == MUON_OK, "second retry: %s", muon_error(a.opt));
  }
  tr_step(&r, 1);
  snap_take(&sa, &a, 1);
  snap_take(&sr, &r, 1);
  snap_same(&sa, &sr, "retried step vs unfaulted");
  snap_free(&sa);
  snap_free(&sr);
  tr_free(&a);
  tr_free(&r);
  muon_standin_reset_errors();
  (void)G.vt->sync(G.ctx);
}

static void case_faults(void) {
  static const char *const gemms[] = {"cublasGemmEx", "cublasGemmBatchedEx", "cublasSgemm_v2", "cublasSnrm2_v2",
                                      "kernel"};
  enum { NCALLS = sizeof gemms / sizeof gemms[0], KERNEL = NCALLS - 1 };
  long long per_step[NCALLS];
  trainer p;
  setup s = base_setup("");
  int j, nth, commit, commit_first;
  TEST_CASE("6. all-or-nothing under injected cuBLAS and kernel faults");
  if (!tr_init(&p, &M_SMALL, &s, 1)) return;
  tr_step(&p, 0);
  tr_grads(&p, 1, -1, -1);
  for (j = 0; j < NCALLS; j++) per_step[j] = muon_standin_calls(gemms[j]);
  CHECK(muon_step(p.opt) == MUON_OK, "probe step: %s", muon_error(p.opt));
  for (j = 0; j < NCALLS; j++) per_step[j] = muon_standin_calls(gemms[j]) - per_step[j];
  /* the commit launches: momentum + apply per matrix, one per AdamW param, all at the end */
  commit = 2 * muon_matrix_count(p.opt) + muon_adamw_param_count(p.opt);
  commit_first = (int)per_step[KERNEL] - commit + 1;
  tr_free(&p);
  CHECK(per_step[0] > 0, "no cublasGemmEx call in a step");
  fault_retry_at_once("cublasGemmEx", 0);
  fault_retry_at_once("cublasGemmEx", 1);
  for (j = 0; j < NCALLS; j++) {
    fault_tally tally;
    memset(&tally, 0, sizeof tally);
    if (per_step[j] == 0) continue;
    for (nth = 1; nth < 1000; nth++)
      if (fault_once(gemms[j], nth, commit_first, &tally)) break;
    CHECK(tally.passes == 1 && tally.failing + tally.deferred == per_step[j], "%s: %d failing + %d deferred steps for %lld calls",
          gemms[j], tally.failing, tally.deferred, per_step[j]);
    CHECK(tally.stale == 0, "%s: after %d of %d failed steps, muon_state_save (nothing queued in between) failed with the step's stale error: %s",
          gemms[j], tally.stale, tally.failing, tally.stale_error);
    if (j == KERNEL)
      CHECK(tally.deferred == commit, "kernel: %d deferred failures, expected the %d commit launches", tally.deferred, commit);
    printf("  %-27s %3lld per step: %d faulted steps failed with nothing changed%s", gemms[j], per_step[j], tally.failing,
           j == KERNEL ? "" : "\n");
    if (j == KERNEL) printf(", %d (the commit's launches) reported by the next step\n", tally.deferred);
  }
}

/* =============================================================================================
   7. Allocation failure at every cudaMalloc site (stand-in): while registering each matrix (a
   stack of 3 included), the AdamW param, and during the first muon_step (planning), the N-th
   cudaMalloc fails, for N = 1, 2, ... until none does. The call must return MUON_ERR_NOMEM and
   leave the optimizer as it was (matrix count unchanged; a failed step changes no param); a
   retry then succeeds and training is bitwise that of an optimizer that never failed; after
   muon_destroy no device memory is left (muon_standin_device_bytes back to the baseline).
   ============================================================================================= */
enum { PH_MATRIX = 0, PH_ADAMW = 1, PH_STEP = 2 };

static int alloc_once(int phase, int which, int nth, const snap *want, size_t base, int *sites) {
  trainer t;
  setup s = base_setup("");
  muon_status st = MUON_OK;
  long long c0, used = 0;
  int i, done = 0, registered = 0;
  char what[96];
  snprintf(what, sizeof what, "%s%s, cudaMalloc #%d failing", phase == PH_MATRIX ? "muon_add_matrix " : phase == PH_ADAMW ? "muon_add_adamw_param" : "first muon_step",
           phase == PH_MATRIX ? (which == 0 ? "0" : which == 1 ? "1" : "2 (stack of 3)") : "", nth);
  tr_buffers(&t, &M_SMALL, &s, 1);
  if (!tr_create(&t)) return 1;
  for (i = 0; i < M_SMALL.nm; i++) {
    if (phase == PH_MATRIX && i == which) {
      c0 = muon_standin_calls("cudaMalloc");
      muon_standin_fail("cudaMalloc", nth);
      st = tr_add_matrix(&t, i);
      used = muon_standin_calls("cudaMalloc") - c0;
      muon_standin_fail("cudaMalloc", 0);
      if (used >= nth) {
        CHECK(st == MUON_ERR_NOMEM, "%s: %s, expected MUON_ERR_NOMEM", what, muon_status_string(st));
        CHECK(muon_matrix_count(t.opt) == registered, "%s: the matrix count changed from %d to %d", what, registered,
              muon_matrix_count(t.opt));
        st = tr_add_matrix(&t, i);
      }
    } else {
      st = tr_add_matrix(&t, i);
    }
    CHECK(st == MUON_OK, "%s: muon_add_matrix %d: %s", what, i, muon_error(t.opt));
    registered += (int)slices(&M_SMALL.m[i]);
  }
  if (phase == PH_ADAMW) {
    c0 = muon_standin_calls("cudaMalloc");
    muon_standin_fail("cudaMalloc", nth);
    st = tr_add_adamw(&t);
    used = muon_standin_calls("cudaMalloc") - c0;
    muon_standin_fail("cudaMalloc", 0);
    if (used >= nth) {
      CHECK(st == MUON_ERR_NOMEM, "%s: %s, expected MUON_ERR_NOMEM", what, muon_status_string(st));
      CHECK(muon_adamw_param_count(t.opt) == 0, "%s: the AdamW param count changed", what);
      st = tr_add_adamw(&t);
    }
  } else {
    st = tr_add_adamw(&t);
  }
  CHECK(st == MUON_OK, "%s: muon_add_adamw_param: %s", what, muon_error(t.opt));
  tr_grads(&t, 0, -1, -1);
  if (phase == PH_STEP) {
    snap before, after;
    snap_take(&before, &t, 0);
    c0 = muon_standin_calls("cudaMalloc");
    muon_standin_fail("cudaMalloc", nth);
    st = muon_step(t.opt);
    used = muon_standin_calls("cudaMalloc") - c0;
    muon_standin_fail("cudaMalloc", 0);
    if (used >= nth) {
      CHECK(st == MUON_ERR_NOMEM, "%s: %s, expected MUON_ERR_NOMEM (%s)", what, muon_status_string(st), muon_error(t.opt));
      snap_take(&after, &t, 0);
      snap_same(&before, &after, what);
      snap_free(&after);
      st = muon_step(t.opt);
    }
    snap_free(&before);
  } else {
    st = muon_step(t.opt);
  }
  CHECK(st == MUON_OK, "%s: the step after the retry: %s", what, muon_error(t.opt));
  if (used < nth) done = 1;
  else (*sites)++;
  {
    snap got;
    snap_take(&got, &t, 1);
    snap_same(&got, want, what);
    snap_free(&got);
  }
  tr_free(&t);
  CHECK(muon_standin_device_bytes() == base, "%s: %zu device bytes after muon_destroy, baseline %zu", what,
        muon_standin_device_bytes(), base);
  return done;
}

static void case_alloc(void) {
  trainer r;
  setup s = base_setup("");
  snap want;
  size_t base;
  int which, nth, sites[3] = {0, 0, 0};
  TEST_CASE("7. cudaMalloc failing at each site: MUON_ERR_NOMEM, usable, no leak");
  if (!tr_init(&r, &M_SMALL, &s, 1)) return;
  tr_step(&r, 0);
  snap_take(&want, &r, 1);
  base = muon_standin_device_bytes();
  for (which = 0; which < M_SMALL.nm; which++)
    for (nth = 1; nth < 100; nth++)
      if (alloc_once(PH_MATRIX, which, nth, &want, base, &sites[0])) break;
  for (nth = 1; nth < 100; nth++)
    if (alloc_once(PH_ADAMW, 0, nth, &want, base, &sites[1])) break;
  for (nth = 1; nth < 100; nth++)
    if (alloc_once(PH_STEP, 0, nth, &want, base, &sites[2])) break;
  CHECK(sites[0] >= 3 + 2 && sites[1] >= 2 && sites[2] >= 1, "too few allocation sites exercised: %d, %d, %d", sites[0],
        sites[1], sites[2]);
  printf("  failed cudaMalloc sites: %d in muon_add_matrix, %d in muon_add_adamw_param, %d in the first muon_step\n",
         sites[0], sites[1], sites[2]);
  snap_free(&want);
  tr_free(&r);
}
#endif /* MUON_CUDA_STANDIN */

/* =============================================================================================
   8. State: muon_state_save on a CUDA optimizer after 3 steps, loaded into a fresh CUDA optimizer
   (params copied over by the trainer), 2 more steps: bitwise the 5 uninterrupted steps (params,
   bf16 mirrors rounded stochastically, which depend on the restored step count, momentum,
   state). The same blob loads into a CPU optimizer of the same shapes: its momentum (host
   memory) has the CUDA momentum's bits, and it saves back the identical blob; so does a CUDA
   optimizer that takes it through muon_state_reshard. Run again with bf16 and int8 momentum
   (muon_hparams.momentum_format): the device's buffers widen into the blob and narrow back.
   ============================================================================================= */
static void case_state(muon_momentum_format fmt) {
  trainer a, b, c;
  setup s = base_setup("");
  int bf = fmt == MUON_MOMENTUM_BF16;
  snap at3, sa, sb;
  unsigned char *blob, *blob2;
  size_t n;
  int step, i, k;
  muon_status st;
  TEST_CASE(bf ? "8b. state with bf16 momentum: the same on CUDA, the CPU and a reshard"
     : fmt == MUON_MOMENTUM_INT8 ? "8c. state with int8 momentum: the same on CUDA, the CPU and a reshard"
                                 : "8. state: save after 3 CUDA steps, load, 2 more = 5 uninterrupted; loads on the CPU");
  s.hp.momentum_format = fmt;
  s.mirror = 1;
  s.rounding = MUON_ROUND_STOCHASTIC;
  s.seed = 77;
  if (!tr_init(&a, &M_MID, &s, 1) || !tr_init(&b, &M_MID, &s, 1)) return;
  for (step = 0; step < 3; step++) tr_step(&a, step);
  n = muon_state_size(a.opt);
  blob = (unsigned char *)xmalloc(n);
  st = muon_state_save(a.opt, blob, n);
  CHECK(st == MUON_OK, "muon_state_save: %s", muon_error(a.opt));
  snap_take(&at3, &a, 0);
  /* the trainer restores its own params and mirrors; muon restores momentum, moments, steps */
  for (i = 0; i < M_MID.nm; i++) {
    tr_put(&b, b.param[i], at3.param[i], at3.n[i] * 4);
    tr_put(&b, b.mirror[i], at3.mirror[i], at3.n[i] * 2);
  }
  tr_put(&b, b.aparam, at3.aparam, at3.an * 4);
  tr_put(&b, b.amirror, at3.amirror, at3.an * 2);
  st = muon_state_load(b.opt, blob, n);
  CHECK(st == MUON_OK, "muon_state_load (cuda): %s", muon_error(b.opt));
  for (step = 3; step < STEPS; step++) { tr_step(&a, step); tr_step(&b, step); }
  snap_take(&sa, &a, 1);
  snap_take(&sb, &b, 1);
  if (snap_same(&sa, &sb, "resumed vs uninterrupted")) printf("  resumed at step 3: steps 4-5 bitwise equal to the uninterrupted run\n");
  snap_free(&sa);
  snap_free(&sb);
  /* into a CPU optimizer */
  if (tr_init(&c, &M_MID, &s, 0)) {
    st = muon_state_load(c.opt, blob, n);
    CHECK(st == MUON_OK, "muon_state_load (cpu): %s", muon_error(c.opt));
    for (i = 0; i < M_MID.nm; i++)
      for (k = 0; k < (int)slices(&M_MID.m[i]); k++) {
        const void *buf = NULL;
        size_t size = 0, rc = mat_n(&M_MID.m[i]);
        muon_momentum_format f;
        if (muon_get_momentum_stored(c.opt, c.index[i] + k, &buf, &size, &f) != MUON_OK || size != rc || f != fmt) {
          CHECK(0, "cpu muon_get_momentum(%d)", c.index[i] + k);
          continue;
        }
        if (bf) {   /* the CPU's bf16 buffer against the CUDA momentum widened by snap_take */
          size_t e, bad = 0;
          for (e = 0; e < rc; e++) {
            uint32_t u = (uint32_t)((const uint16_t *)buf)[e] << 16;
            bad += memcmp(&u, at3.mom[i] + (size_t)k * rc + e, 4) != 0;
          }
          CHECK(bad == 0, "matrix %d slice %d: CPU bf16 momentum after load differs (%zu)", i, k, bad);
        } else if (fmt == MUON_MOMENTUM_INT8) {   /* the CPU's blocks, decoded, against CUDA's decoded */
          size_t e, bad = 0;
          float d[MUON_Q8_BLOCK];
          for (e = 0; e < rc; e += MUON_Q8_BLOCK) {
            size_t c8 = rc - e < MUON_Q8_BLOCK ? rc - e : MUON_Q8_BLOCK;
            muon__q8_decode((const unsigned char *)buf + e + e / MUON_Q8_BLOCK, c8, d);
            bad += memcmp(d, at3.mom[i] + (size_t)k * rc + e, c8 * 4) != 0;
          }
          CHECK(bad == 0, "matrix %d slice %d: CPU int8 momentum after load differs (%zu blocks)", i, k, bad);
        } else
          CHECK(memcmp(buf, at3.mom[i] + (size_t)k * rc, rc * 4) == 0, "matrix %d slice %d: CPU momentum after load differs", i, k);
      }
    blob2 = (unsigned char *)xmalloc(n);
    CHECK(muon_state_size(c.opt) == n, "CPU state size %zu, CUDA %zu", muon_state_size(c.opt), n);
    st = muon_state_save(c.opt, blob2, n);
    CHECK(st == MUON_OK && memcmp(blob, blob2, n) == 0, "the CPU optimizer saves a different blob (%s)", muon_status_string(st));
    free(blob2);
    tr_free(&c);
  }
  /* resharding into a CUDA optimizer: host staging, then copies to the device */
  if (tr_init(&c, &M_MID, &s, 1)) {
    const void *blobs[1];
    size_t sizes[1];
    blobs[0] = blob; sizes[0] = n;
    blob2 = (unsigned char *)xmalloc(n);
    st = muon_state_reshard(c.opt, blobs, sizes, 1);
    CHECK(st == MUON_OK, "muon_state_reshard (cuda): %s", muon_error(c.opt));
    st = muon_state_save(c.opt, blob2, n);
    CHECK(st == MUON_OK && memcmp(blob, blob2, n) == 0, "the resharded CUDA optimizer saves a different blob (%s)", muon_status_string(st));
    free(blob2);
    tr_free(&c);
  }
  free(blob);
  snap_free(&at3);
  tr_free(&a);
  tr_free(&b);
}

/* =============================================================================================
   9. Trainer formats on CUDA, against the CPU and against itself:
   a) bf16 gradients, fp32 params with bf16 mirrors, muon_set_grad_scale(0.5), nearest rounding,
      CUDA vs CPU: params within the fp32 bound, momentum and AdamW bitwise (element-wise math);
      every CUDA mirror (matrices and AdamW) is exactly the nearest bf16 of the CUDA param; and
      the scale really applies: a CUDA run with scale 1 and gradients halved (exact in bf16)
      gives the same bits.
   b) the same with stochastic rounding (seed 1234): every CUDA mirror element is one of the two
      bf16 neighbours of its fp32 param, rounding differs from nearest for a plausible share of
      elements, and the CPU's mirrors use the same random bits (>= 99% equal, <= 2 ulps).
   c) bf16 params (no fp32 copy), bf16 gradients, scale 0.5: stochastic vs nearest rounding on
      CUDA, both starting each step from the same params (so both see the same O): every element
      differs by at most one bf16 ulp, and some do.
   ============================================================================================= */
static void case_formats_nearest(void) {
  trainer cpu, gpu, half;
  setup s = base_setup("");
  snap sc, sg, sh;
  int step, i;
  size_t e;
  double worst = 0;
  TEST_CASE("9a. formats: bf16 grads, bf16 mirror, grad scale 0.5: CUDA vs CPU");
  s.grad_dtype = MUON_DTYPE_BF16;
  s.mirror = 1;
  s.grad_scale = 0.5f;
  if (!tr_init(&cpu, &M_MID, &s, 0) || !tr_init(&gpu, &M_MID, &s, 1)) return;
  s.grad_scale = 0;
  if (!tr_init(&half, &M_MID, &s, 1)) return;
  half.gmul = 0.5f;
  for (step = 0; step < STEPS; step++) {
    if (tr_step(&cpu, step) != MUON_OK || tr_step(&gpu, step) != MUON_OK || tr_step(&half, step) != MUON_OK) break;
    snap_take(&sc, &cpu, 0);
    snap_take(&sg, &gpu, 1);
    snap_take(&sh, &half, 1);
    for (i = 0; i < M_MID.nm; i++) {
      const mspec *m = &M_MID.m[i];
      size_t n = mat_n(m), k;
      for (k = 0; k < slices(m); k++) {
        double r = rel_err((const float *)sg.param[i] + k * n, (const float *)sc.param[i] + k * n, n);
        if (r > worst) worst = r;
        CHECK(r <= FP32_PARAM_TOL, "step %d: matrix %d[%zu]: param rel err %.3g", step, i, k, r);
      }
      CHECK(memcmp(sg.mom[i], sc.mom[i], sg.n[i] * 4) == 0, "step %d: matrix %d: momentum not bitwise the CPU's", step, i);
      for (e = 0; e < sg.n[i]; e++)
        if (sg.mirror[i][e] != bf16_rne(((const float *)sg.param[i])[e])) break;
      CHECK(e == sg.n[i], "step %d: matrix %d: mirror[%zu] = 0x%04x, nearest bf16 of the param is 0x%04x", step, i, e,
            e < sg.n[i] ? sg.mirror[i][e] : 0, e < sg.n[i] ? bf16_rne(((const float *)sg.param[i])[e]) : 0);
    }
    CHECK(memcmp(sg.aparam, sc.aparam, sg.an * 4) == 0, "step %d: AdamW param not bitwise the CPU's", step);
    for (e = 0; e < sg.an; e++)
      if (sg.amirror[e] != bf16_rne(((const float *)sg.aparam)[e])) break;
    CHECK(e == sg.an, "step %d: AdamW mirror[%zu] is not the nearest bf16 of the param", step, e);
    snap_same(&sg, &sh, "grad scale 0.5 vs gradients halved");
    snap_free(&sc);
    snap_free(&sg);
    snap_free(&sh);
  }
  printf("  param rel err %.2e; momentum, AdamW bitwise; mirrors = nearest bf16 of the params; scale 0.5 = halved grads\n", worst);
  tr_free(&cpu);
  tr_free(&gpu);
  tr_free(&half);
}

static void case_formats_stochastic_mirror(void) {
  trainer cpu, gpu;
  setup s = base_setup("");
  snap sc, sg;
  int step, i;
  size_t e, total = 0, up = 0, cpu_diff = 0, bad = 0;
  long max_ulps = 0;
  TEST_CASE("9b. formats: stochastic bf16 mirrors: neighbours of the fp32 param, CPU's random bits");
  s.grad_dtype = MUON_DTYPE_BF16;
  s.mirror = 1;
  s.grad_scale = 0.5f;
  s.rounding = MUON_ROUND_STOCHASTIC;
  s.seed = 1234;
  if (!tr_init(&cpu, &M_MID, &s, 0) || !tr_init(&gpu, &M_MID, &s, 1)) return;
  for (step = 0; step < STEPS; step++) {
    if (tr_step(&cpu, step) != MUON_OK || tr_step(&gpu, step) != MUON_OK) break;
    snap_take(&sc, &cpu, 0);
    snap_take(&sg, &gpu, 0);
    for (i = 0; i <= M_MID.nm; i++) {
      size_t n = i < M_MID.nm ? sg.n[i] : sg.an;
      const float *p = i < M_MID.nm ? (const float *)sg.param[i] : (const float *)sg.aparam;
      const uint16_t *mg = i < M_MID.nm ? sg.mirror[i] : sg.amirror, *mc = i < M_MID.nm ? sc.mirror[i] : sc.amirror;
      for (e = 0; e < n; e++) {
        uint32_t u = f_bits(p[e]);
        uint16_t lo = (uint16_t)(u >> 16);
        int exact = (u & 0xffffu) == 0;
        long d = bf16_ulps(mg[e], mc[e]);
        if (!(mg[e] == lo || (!exact && mg[e] == (uint16_t)(lo + 1)))) bad++;
        if (mg[e] != bf16_rne(p[e])) up++;
        if (d) cpu_diff++;
        if (d > max_ulps) max_ulps = d;
        total++;
      }
    }
    snap_free(&sc);
    snap_free(&sg);
  }
  CHECK(bad == 0, "%zu of %zu mirror elements are not a bf16 neighbour of their fp32 param", bad, total);
  CHECK(up > total / 20 && up < total * 3 / 5, "%zu of %zu mirror elements differ from nearest rounding: not stochastic?", up, total);
  CHECK(cpu_diff <= total / 100 && max_ulps <= 2, "CUDA vs CPU mirrors: %zu of %zu differ, up to %ld ulps", cpu_diff, total, max_ulps);
  printf("  %zu mirror elements: all neighbours of the fp32 param; %.1f%% not nearest; CPU vs CUDA: %zu differ (max %ld ulp)\n",
         total, 100.0 * (double)up / (double)(total ? total : 1), cpu_diff, max_ulps);
  tr_free(&cpu);
  tr_free(&gpu);
}

static void case_formats_bf16_params(void) {
  trainer sr, nr;
  setup s = base_setup("");
  snap a, b;
  int step, i;
  size_t e, total = 0, differ = 0;
  long worst = 0;
  TEST_CASE("9c. formats: bf16 params, stochastic vs nearest on CUDA: <= 1 ulp apart");
  s.param_dtype = MUON_DTYPE_BF16;
  s.grad_dtype = MUON_DTYPE_BF16;
  s.grad_scale = 0.5f;
  s.rounding = MUON_ROUND_STOCHASTIC;
  s.seed = 1234;
  if (!tr_init(&sr, &M_MID, &s, 1)) return;
  s.rounding = MUON_ROUND_NEAREST;
  if (!tr_init(&nr, &M_MID, &s, 1)) return;
  for (step = 0; step < STEPS; step++) {
    /* both start the step from the stochastic run's params */
    snap_take(&a, &sr, 0);
    for (i = 0; i < M_MID.nm; i++) tr_put(&nr, nr.param[i], a.param[i], a.n[i] * 2);
    tr_put(&nr, nr.aparam, a.aparam, a.an * 2);
    snap_free(&a);
    if (tr_step(&sr, step) != MUON_OK || tr_step(&nr, step) != MUON_OK) break;
    snap_take(&a, &sr, 1);
    snap_take(&b, &nr, 1);
    for (i = 0; i <= M_MID.nm; i++) {
      size_t n = i < M_MID.nm ? a.n[i] : a.an;
      const uint16_t *pa = (const uint16_t *)(i < M_MID.nm ? a.param[i] : a.aparam);
      const uint16_t *pb = (const uint16_t *)(i < M_MID.nm ? b.param[i] : b.aparam);
      for (e = 0; e < n; e++) {
        long d = bf16_ulps(pa[e], pb[e]);
        if (d > worst) worst = d;
        if (d) differ++;
        total++;
      }
      if (i < M_MID.nm) CHECK(memcmp(a.mom[i], b.mom[i], a.n[i] * 4) == 0, "step %d: matrix %d: momentum differs", step, i);
    }
    /* momentum, AdamW moments and steps do not depend on the params: same inputs, same blob */
    CHECK(a.state_n == b.state_n && memcmp(a.state, b.state, a.state_n) == 0, "step %d: the state blobs differ", step);
    snap_free(&a);
    snap_free(&b);
  }
  CHECK(worst <= 1, "stochastic vs nearest bf16 params differ by up to %ld ulps", worst);
  CHECK(differ > total / 20 && differ < total * 3 / 5, "%zu of %zu elements differ from nearest rounding", differ, total);
  printf("  %zu bf16 param updates: %.1f%% rounded the other way, max %ld ulp\n", total,
         100.0 * (double)differ / (double)(total ? total : 1), worst);
  tr_free(&sr);
  tr_free(&nr);
}

#ifdef MUON_CUDA_STANDIN
/* =============================================================================================
   10. Host access is impossible (stand-in): a forked child that reads a device pointer muon_cuda
   allocated (the momentum of muon_get_momentum) dies of SIGSEGV, while the same child reading a
   host pointer exits normally and the parent reads the same memory with cudaMemcpy. So any host
   code in muon.h / muon_cuda.h that touched device memory would crash these tests.
   ============================================================================================= */
static int child_reads(const volatile float *ptr) {
  pid_t pid;
  int status = 0;
  fflush(stdout);
  fflush(stderr);
  pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    struct rlimit no_core = {0, 0};
    struct sigaction dfl;
    volatile float x;
    setrlimit(RLIMIT_CORE, &no_core);
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL; /* a sanitizer's SEGV handler would turn the signal into exit(1) */
    sigaction(SIGSEGV, &dfl, NULL);
    sigaction(SIGBUS, &dfl, NULL);
    x = ptr[0];
    (void)x;
    test_exit(0);
  }
  if (waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

static void case_host_access(void) {
  trainer t;
  setup s = base_setup("");
  const float *mom = NULL;
  size_t size = 0;
  float host = 1.0f, first = 0;
  int status;
  TEST_CASE("10. host access to device memory dies with SIGSEGV");
  if (!tr_init(&t, &M_SMALL, &s, 1)) return;
  tr_step(&t, 0);
  CHECK(muon_get_momentum(t.opt, 0, &mom, &size) == MUON_OK && mom, "muon_get_momentum");
  to_host(&first, mom, sizeof first);
  status = child_reads(&host);
  CHECK(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "control child reading host memory: status 0x%x", status);
  status = child_reads(mom);
  CHECK(status >= 0 && WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
        "child reading the device momentum: status 0x%x, expected death by SIGSEGV", status);
  printf("  child reading the momentum %p: %s; cudaMemcpy read %g\n", (const void *)mom,
         status >= 0 && WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "did not die", (double)first);
  tr_free(&t);
}
#endif

/* =============================================================================================
   11. State on the host (muon_desc.state_on_host): momentum and AdamW's moments in pinned host
   memory, staged through device scratch around each slot that reads or writes them. On the
   stand-in, pinned memory is closed to kernels (muon_standin_pinned_private), so no kernel
   reads it through UVA: every move is an explicit copy.
   a) against device-resident state, 5 steps (fp32 with NorMuon, AdamW; bf16 params and grads,
      stochastic bf16 mirrors; bf16 momentum): params, mirrors, momentum and state blobs bitwise equal; the
      device holds exactly the state's bytes less; syncs per step unchanged (2).
   b) checkpoints: a device-resident blob after 3 steps loads into a host-resident optimizer and
      2 more steps equal 5 uninterrupted device-resident ones; and back (host blob, device
      optimizer); muon_state_reshard into a host-resident optimizer saves the same blob.
   c) every cudaMemcpyAsync and every kernel launch of a step failing in turn: a step that
      fails changes nothing (params, momentum, moments); the commit's own failures say "partly"
      (or, for launches, surface at the next step) as with device state; the next step then
      equals an unfaulted optimizer's.
   ============================================================================================= */
static void host_vs_device(const setup *s0, const char *title) {
  trainer d, h;
  setup s = *s0;
  snap sd, sh;
  size_t b0, b1, b2;
  muon_stats a0, a1, c0, c1;
  int step;
  long long pinned0 = muon_standin_calls("cudaMallocHost");
  b0 = muon_standin_device_bytes();
  s.state_on_host = 0;
  if (!tr_init(&d, &M_MID, &s, 1)) return;
  b1 = muon_standin_device_bytes();
  s.state_on_host = 1;
  if (!tr_init(&h, &M_MID, &s, 1)) return;
  b2 = muon_standin_device_bytes();
  CHECK(muon_standin_calls("cudaMallocHost") > pinned0, "%s: no pinned allocation for the state", title);
  for (step = 0; step < STEPS; step++) {
    a0 = stats_of(d.opt); c0 = stats_of(h.opt);
    tr_step(&d, step);
    tr_step(&h, step);
    a1 = stats_of(d.opt); c1 = stats_of(h.opt);
    CHECK(a1.syncs - a0.syncs == c1.syncs - c0.syncs, "%s step %d: %lld syncs device-resident, %lld host-resident", title,
          step, a1.syncs - a0.syncs, c1.syncs - c0.syncs);
  }
  CHECK((b1 - b0) - (b2 - b1) == c1.state_bytes, "%s: device bytes %zu (device state) vs %zu (host state), state %zu",
        title, b1 - b0, b2 - b1, c1.state_bytes);
  snap_take(&sd, &d, 1);
  snap_take(&sh, &h, 1);
  if (snap_same(&sd, &sh, title))
    printf("  %s: %d steps bitwise equal; %zu state bytes off the device\n", title, STEPS, c1.state_bytes);
  snap_free(&sd);
  snap_free(&sh);
  tr_free(&d);
  tr_free(&h);
}

/* Saves a's blob, loads it into a fresh optimizer of `to_host` (the trainer restores params and
   mirrors), 2 more steps on both: bitwise. */
static void host_resume(int from_host, int to_host, muon_momentum_format fmt) {
  trainer a, b;
  setup s = base_setup("");
  snap at3, sa, sb;
  unsigned char *blob;
  size_t n;
  int step, i;
  char what[96];
  s.mirror = 1;
  s.rounding = MUON_ROUND_STOCHASTIC;
  s.seed = 5;
  s.hp.normuon = MUON_NORMUON_LARGER;
  s.hp.momentum_format = fmt;
  s.state_on_host = from_host;
  if (!tr_init(&a, &M_MID, &s, 1)) return;
  s.state_on_host = to_host;
  if (!tr_init(&b, &M_MID, &s, 1)) return;
  for (step = 0; step < 3; step++) tr_step(&a, step);
  n = muon_state_size(a.opt);
  blob = (unsigned char *)xmalloc(n);
  CHECK(muon_state_save(a.opt, blob, n) == MUON_OK, "muon_state_save: %s", muon_error(a.opt));
  snap_take(&at3, &a, 0);
  for (i = 0; i < M_MID.nm; i++) {
    tr_put(&b, b.param[i], at3.param[i], at3.n[i] * 4);
    tr_put(&b, b.mirror[i], at3.mirror[i], at3.n[i] * 2);
  }
  tr_put(&b, b.aparam, at3.aparam, at3.an * 4);
  tr_put(&b, b.amirror, at3.amirror, at3.an * 2);
  CHECK(muon_state_load(b.opt, blob, n) == MUON_OK, "muon_state_load: %s", muon_error(b.opt));
  for (step = 3; step < STEPS; step++) { tr_step(&a, step); tr_step(&b, step); }
  snap_take(&sa, &a, 1);
  snap_take(&sb, &b, 1);
  snprintf(what, sizeof what, "%s%s blob resumed %s",
           fmt == MUON_MOMENTUM_BF16 ? "bf16 momentum, " : fmt == MUON_MOMENTUM_INT8 ? "int8 momentum, " : "",
           from_host ? "host-resident" : "device-resident", to_host ? "host-resident" : "device-resident");
  if (snap_same(&sa, &sb, what)) printf("  %s: steps 4-5 bitwise equal\n", what);
  if (to_host) {   /* resharding the step-3 blob into a host-resident optimizer saves it back unchanged */
    trainer c;
    const void *blobs[1];
    size_t sizes[1];
    unsigned char *blob2 = (unsigned char *)xmalloc(n);
    blobs[0] = blob; sizes[0] = n;
    if (tr_init(&c, &M_MID, &s, 1)) {
      CHECK(muon_state_reshard(c.opt, blobs, sizes, 1) == MUON_OK, "muon_state_reshard: %s", muon_error(c.opt));
      CHECK(muon_state_save(c.opt, blob2, n) == MUON_OK && memcmp(blob, blob2, n) == 0,
            "a host-resident optimizer resharded from a blob saves a different one");
      tr_free(&c);
    }
    free(blob2);
  }
  free(blob);
  snap_free(&at3);
  snap_free(&sa);
  snap_free(&sb);
  tr_free(&a);
  tr_free(&b);
}

#ifdef MUON_CUDA_STANDIN
typedef struct host_tally { int failing, late, passes; } host_tally;

/* Returns 1 when the step did not reach the N-th call. */
static int host_fault_once(const char *name, int nth, host_tally *t) {
  trainer a, r;
  setup s = base_setup("");
  snap before, after, sa, sr;
  muon_status st;
  long long c0, used;
  int done = 0;
  char what[96];
  s.state_on_host = 1;
  if (!tr_init(&a, &M_SMALL, &s, 1) || !tr_init(&r, &M_SMALL, &s, 1)) return 1;
  tr_step(&a, 0);
  tr_step(&r, 0);
  tr_grads(&a, 1, -1, -1);
  snap_take(&before, &a, 1);
  c0 = muon_standin_calls(name);
  muon_standin_fail(name, nth);
  st = muon_step(a.opt);
  used = muon_standin_calls(name) - c0;
  muon_standin_fail(name, 0);
  snprintf(what, sizeof what, "host state, %s #%d failing", name, nth);
  if (used < nth) {
    done = 1;
    t->passes++;
    CHECK(st == MUON_OK, "%s: a step without the fault failed: %s", what, muon_error(a.opt));
  } else if (st == MUON_OK || strstr(muon_error(a.opt), "partly")) {
    t->late++;   /* the commit's own: as with device state, reported now or by the next step */
    if (st == MUON_OK) CHECK(muon_step(a.opt) == MUON_ERR_BACKEND, "%s: the next step did not report it", what);
  } else {
    t->failing++;
    CHECK(st == MUON_ERR_BACKEND, "%s: muon_step returned %s", what, muon_status_string(st));
    muon_standin_reset_errors();
    snap_take(&after, &a, 1);
    snap_same(&before, &after, what);
    snap_free(&after);
    st = muon_step(a.opt);
    CHECK(st == MUON_OK, "%s: the step after: %s", what, muon_error(a.opt));
    tr_step(&r, 1);
    snap_take(&sa, &a, 1);
    snap_take(&sr, &r, 1);
    snap_same(&sa, &sr, what);
    snap_free(&sa);
    snap_free(&sr);
  }
  snap_free(&before);
  tr_free(&a);
  tr_free(&r);
  muon_standin_reset_errors();
  (void)G.vt->sync(G.ctx);
  return done;
}
#endif

static void case_state_on_host(void) {
  setup s = base_setup("fp32, NorMuon, AdamW");
  TEST_CASE("11. state on the host: bitwise device-resident, checkpoints both ways, faults change nothing");
#ifdef MUON_CUDA_STANDIN
  muon_standin_pinned_private(1);
#endif
  s.hp.normuon = MUON_NORMUON_LARGER;
  host_vs_device(&s, "fp32, NorMuon, AdamW");
  s = base_setup("");
  s.param_dtype = MUON_DTYPE_BF16;
  s.grad_dtype = MUON_DTYPE_BF16;
  s.mirror = 1;
  s.rounding = MUON_ROUND_STOCHASTIC;
  s.seed = 9;
  s.hp.precision = MUON_PRECISION_BF16;
  host_vs_device(&s, "bf16 params, grads, NS; stochastic mirrors");
  s = base_setup("");
  s.hp.momentum_format = MUON_MOMENTUM_BF16;   /* bf16 bytes staged through the scratch's bf16 half */
  s.hp.normuon = MUON_NORMUON_ROWS;
  host_vs_device(&s, "bf16 momentum, NorMuon");
  s.hp.momentum_format = MUON_MOMENTUM_INT8;   /* int8 blocks through the same bytes */
  host_vs_device(&s, "int8 momentum, NorMuon");
  host_resume(0, 1, MUON_MOMENTUM_FP32);
  host_resume(1, 0, MUON_MOMENTUM_FP32);
  host_resume(0, 1, MUON_MOMENTUM_BF16);
  host_resume(1, 0, MUON_MOMENTUM_BF16);
  host_resume(0, 1, MUON_MOMENTUM_INT8);
#ifdef MUON_CUDA_STANDIN
  muon_standin_pinned_private(0);   /* proven above; the fault walk below needs speed, not this */
  {
    static const char *const names[] = {"cudaMemcpyAsync", "kernel"};
    int j, nth;
    for (j = 0; j < 2; j++) {
      host_tally t;
      memset(&t, 0, sizeof t);
      for (nth = 1; nth < 1000; nth++)
        if (host_fault_once(names[j], nth, &t)) break;
      CHECK(t.passes == 1 && t.failing > 0, "%s: %d failing, %d passes", names[j], t.failing, t.passes);
      printf("  host state, %-15s: %d faulted steps failed with nothing changed, %d in the commit\n", names[j], t.failing,
             t.late);
    }
  }
#endif
}

int main(void) {
  muon_cuda_desc cd = muon_cuda_default_desc();
  muon_status st;
#ifdef MUON_CUDA_STANDIN
  size_t bytes0;
#endif
  setvbuf(stdout, NULL, _IONBF, 0);
  st = muon_cuda_create(&G, &cd);
  if (st != MUON_OK) {
    printf("%s\n", muon_error(NULL));
    printf("0 passed, 1 failed\n");
    return 1;
  }
#ifdef MUON_CUDA_STANDIN
  bytes0 = muon_standin_device_bytes();
#endif
  cases_vs_cpu();
  case_bf16_engaged();
  drain();
  case_determinism();
  drain();
  case_syncs();
  drain();
  case_batching();
  drain();
  case_nonfinite();
  case_overflow();
  drain();
#ifdef MUON_CUDA_STANDIN
  case_faults();
  drain();
  case_alloc();
  drain();
#else
  skip("6. all-or-nothing under injected cuBLAS and kernel faults");
  skip("7. cudaMalloc failing at each site");
#endif
  case_state(MUON_MOMENTUM_FP32);
  case_state(MUON_MOMENTUM_BF16);
  case_state(MUON_MOMENTUM_INT8);
  drain();
  case_formats_nearest();
  drain();
  case_formats_stochastic_mirror();
  drain();
  case_formats_bf16_params();
  drain();
  case_state_on_host();
  drain();
#ifdef MUON_CUDA_STANDIN
  case_host_access();
  drain();
  TEST_CASE("no device memory left behind");
  CHECK(muon_standin_device_bytes() == bytes0, "%zu device bytes live at the end, %zu at the start", muon_standin_device_bytes(), bytes0);
#else
  skip("10. host access to device memory dies with SIGSEGV");
#endif
  muon_compute_destroy(&G);
  return test_summary();
}
