/* test_trainer.c - what a GPU trainer (llm.c) hands over, on the CPU backend: bf16 gradients and
   parameters, fp32 master weights with bf16 mirrors, stochastic rounding, stacked [L, rows, cols]
   matrices with separate strides, trainer-owned momentum, the clipping scale, bad dtypes, and
   all-or-nothing steps through a compute backend that fails on purpose.

   Most claims here are bitwise: two runs that must agree are compared with memcmp. The bf16
   reference rounding is this file's own (distances compared in double), independent of
   muon__bf16. Everything is deterministic; nothing here reads NaN through float comparisons, so
   the program also holds under -Ofast. */
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "test.h"

#include <stdint.h>
#include <stdlib.h>

/* ---- bits and bf16 ------------------------------------------------------------------------ */
static uint32_t f2u(float x) { uint32_t u; memcpy(&u, &x, sizeof u); return u; }
static float u2f(uint32_t u) { float x; memcpy(&x, &u, sizeof x); return x; }
static float bf2f(uint16_t h) { return u2f((uint32_t)h << 16); }

/* Round to nearest bf16, ties to even, by comparing the distances to the two bf16 values around
   x in long double (exact: both differences are of floats in neighbouring binades; x87 long
   double keeps subnormal floats where -Ofast's flush-to-zero would zero them in double).
   Returns the bits. */
static uint16_t ref_bf16(float x) {
  uint32_t u = f2u(x), lo = u & 0xffff0000u, hi;
  long double ax, dlo, dhi;
  if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)((u >> 16) | ((u & 0x007fffffu) ? 0x40u : 0u));
  if (lo == u) return (uint16_t)(u >> 16);
  hi = lo + 0x10000u;                       /* the next bf16 away from zero (maybe Inf) */
  ax = fabsl((long double)x);
  dlo = fabsl((long double)u2f(lo));
  dhi = (hi & 0x7f800000u) == 0x7f800000u ? ldexpl(1.0L, 128) : fabsl((long double)u2f(hi));
  if (ax - dlo < dhi - ax) return (uint16_t)(lo >> 16);
  if (ax - dlo > dhi - ax) return (uint16_t)(hi >> 16);
  return (uint16_t)(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}
static float ref_round(float x) { return bf2f(ref_bf16(x)); }

/* 1 if h is x itself (x a bf16 value) or one of the two bf16 values around it. */
static int is_neighbour(uint16_t h, float x) {
  uint32_t u = f2u(x), lo = u & 0xffff0000u;
  if (lo == u) return h == (uint16_t)(u >> 16);
  return h == (uint16_t)(lo >> 16) || h == (uint16_t)((lo + 0x10000u) >> 16);
}

/* Deterministic values in [-1, 1): a hash of (stream, index). */
static float hval(unsigned long long stream, unsigned long long i) {
  unsigned long long z = stream * 0x9e3779b97f4a7c15ull + (i + 1) * 0xd1b54a32d192ed03ull;
  z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 29)) * 0x94d049bb133111ebull;
  z ^= z >> 32;
  return (float)((z >> 40) & 0xffffffu) / 8388608.0f - 1.0f;
}

static void *xalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) { printf("out of memory\n"); exit(2); }
  return p;
}

static size_t dsize(muon_dtype t) { return t == MUON_DTYPE_BF16 ? 2 : 4; }
static float get_f(const void *buf, muon_dtype t, size_t i) {
  return t == MUON_DTYPE_BF16 ? bf2f(((const uint16_t *)buf)[i]) : ((const float *)buf)[i];
}
static void set_f(void *buf, muon_dtype t, size_t i, float x) {
  if (t == MUON_DTYPE_BF16) ((uint16_t *)buf)[i] = ref_bf16(x);
  else ((float *)buf)[i] = x;
}

static char last_log[600];
static void capture_log(muon_log_level level, const char *msg, void *user) {
  (void)level; (void)user;
  strncpy(last_log, msg, sizeof last_log - 1);
  last_log[sizeof last_log - 1] = '\0';
}

/* ---- a small model: matrices of odd shapes and one AdamW param ------------------------------ */
#define LR 0.02f
#define MAXM 8
#define ADAMW_SIZE 37
static const int SHAPES[][2] = { { 7, 13 }, { 13, 7 }, { 24, 40 }, { 33, 5 } };
static const int FAULT_SHAPES[][2] = { { 7, 13 }, { 13, 7 }, { 24, 40 }, { 40, 24 }, { 33, 5 }, { 16, 16 } };
static const int BIG_SHAPE[][2] = { { 256, 256 } };

typedef struct {
  muon_dtype param_dtype, grad_dtype;
  int mirror;                   /* a bf16 mirror on every matrix and on the AdamW param */
  int own_momentum;             /* trainer-owned momentum buffers (filled with garbage first) */
  int reverse;                  /* register the matrices in reverse order, same names */
  int adamw;                    /* with the AdamW param */
  int skip;                     /* MUON_NONFINITE_SKIP */
  muon_rounding rounding;
  unsigned long long seed;
  const muon_compute *compute;
  const muon_dist_config *dist;
  const int (*shapes)[2];
  int nshapes;
} cfg;

typedef struct {
  cfg c;
  muon_optimizer *opt;
  int n;                        /* matrices; item n is the AdamW param */
  size_t size[MAXM + 1];
  void *p[MAXM + 1];            /* params, param_dtype */
  void *g[MAXM + 1];            /* grads, grad_dtype */
  uint16_t *mir[MAXM + 1];
  float *mom[MAXM];
  int index[MAXM + 1];          /* the optimizer's index of item k */
  char name[MAXM + 1][16];
} run;

static cfg base_cfg(void) {
  cfg c;
  memset(&c, 0, sizeof c);
  c.param_dtype = MUON_DTYPE_FP32;
  c.grad_dtype = MUON_DTYPE_FP32;
  c.adamw = 1;
  c.rounding = MUON_ROUND_NEAREST;
  c.seed = 42;
  c.shapes = SHAPES;
  c.nshapes = (int)(sizeof SHAPES / sizeof SHAPES[0]);
  return c;
}

static int items(const run *r) { return r->n + (r->c.adamw ? 1 : 0); }

static void run_close(run *r) {
  int k;
  muon_destroy(r->opt);
  for (k = 0; k <= MAXM; k++) {
    free(r->p[k]); free(r->g[k]); free(r->mir[k]);
    if (k < MAXM) free(r->mom[k]);
  }
  memset(r, 0, sizeof *r);
}

/* Creates the optimizer and registers everything; params start at bf16 values, so fp32 and bf16
   runs start equal. 0 (with a failed CHECK) if anything fails. */
static int run_open(run *r, const cfg *c) {
  muon_desc d = muon_default_desc();
  muon_status st;
  int k, j;
  memset(r, 0, sizeof *r);
  r->c = *c;
  r->n = c->nshapes;
  d.hparams.lr = LR;
  d.adamw.lr = LR;
  d.rounding = c->rounding;
  d.seed = c->seed;
  d.compute = c->compute;
  d.dist = c->dist;
  d.on_nonfinite = c->skip ? MUON_NONFINITE_SKIP : MUON_NONFINITE_ERROR;
  if ((st = muon_create(&r->opt, &d)) != MUON_OK) { CHECK(0, "muon_create: %s", muon_status_string(st)); return 0; }
  for (k = 0; k < items(r); k++) {
    size_t i;
    r->size[k] = k < r->n ? (size_t)c->shapes[k][0] * (size_t)c->shapes[k][1] : ADAMW_SIZE;
    r->p[k] = xalloc(r->size[k] * dsize(c->param_dtype));
    r->g[k] = xalloc(r->size[k] * dsize(c->grad_dtype));
    memset(r->g[k], 0, r->size[k] * dsize(c->grad_dtype));
    if (c->mirror) {
      r->mir[k] = (uint16_t *)xalloc(r->size[k] * 2);
      memset(r->mir[k], 0xff, r->size[k] * 2);
    }
    if (k < r->n && c->own_momentum) {
      r->mom[k] = (float *)xalloc(r->size[k] * sizeof(float));
      for (i = 0; i < r->size[k]; i++) r->mom[k][i] = 1234.5f;
    }
    for (i = 0; i < r->size[k]; i++) set_f(r->p[k], c->param_dtype, i, ref_round(0.5f * hval(1000 + (unsigned)k, i)));
    if (k < r->n) snprintf(r->name[k], sizeof r->name[k], "w%d", k);
    else snprintf(r->name[k], sizeof r->name[k], "bias");
  }
  for (j = 0; j < r->n; j++) {
    int kk = c->reverse ? r->n - 1 - j : j;
    muon_matrix m = muon_default_matrix();
    m.name = r->name[kk];
    m.param = r->p[kk];
    m.grad = r->g[kk];
    m.rows = c->shapes[kk][0];
    m.cols = c->shapes[kk][1];
    m.param_dtype = c->param_dtype;
    m.grad_dtype = c->grad_dtype;
    m.mirror = r->mir[kk];
    m.momentum = r->mom[kk];
    if ((st = muon_add_matrix(r->opt, &m, &r->index[kk])) != MUON_OK) { CHECK(0, "muon_add_matrix: %s", muon_error(r->opt)); return 0; }
  }
  if (c->adamw) {
    muon_adamw_param p = muon_default_adamw_param();
    p.name = r->name[r->n];
    p.param = r->p[r->n];
    p.grad = r->g[r->n];
    p.size = ADAMW_SIZE;
    p.param_dtype = c->param_dtype;
    p.grad_dtype = c->grad_dtype;
    p.mirror = r->mir[r->n];
    if ((st = muon_add_adamw_param(r->opt, &p, &r->index[r->n])) != MUON_OK) { CHECK(0, "muon_add_adamw_param: %s", muon_error(r->opt)); return 0; }
  }
  return 1;
}

/* The gradients of `step`: mul * raw, optionally rounded to bf16 values (in an fp32 buffer);
   a bf16 buffer gets the nearest-even bf16 of mul * raw. */
static void run_grads(run *r, int step, float mul, int round_bf16) {
  int k;
  size_t i;
  for (k = 0; k < items(r); k++)
    for (i = 0; i < r->size[k]; i++) {
      float v = mul * hval(7919ull * (unsigned long long)step + (unsigned long long)k + 1, i);
      if (round_bf16) v = ref_round(v);
      set_f(r->g[k], r->c.grad_dtype, i, v);
    }
}

static muon_status run_step(run *r) {
  muon_status st = muon_step(r->opt);
  if (st != MUON_OK) printf("  (step: %s)\n", muon_error(r->opt));
  return st;
}

/* The item whose params (or mirrors) differ, -1 if none. Same dtypes only. */
static int diff_params(const run *a, const run *b) {
  int k;
  for (k = 0; k < items(a); k++)
    if (memcmp(a->p[k], b->p[k], a->size[k] * dsize(a->c.param_dtype)) != 0) return k;
  return -1;
}
static int diff_mirrors(const run *a, const run *b) {
  int k;
  for (k = 0; k < items(a); k++)
    if (memcmp(a->mir[k], b->mir[k], a->size[k] * 2) != 0) return k;
  return -1;
}
static int diff_momentum(const run *a, const run *b) {
  int k;
  for (k = 0; k < a->n; k++) {
    const float *ma, *mb;
    size_t na, nb;
    if (muon_get_momentum(a->opt, a->index[k], &ma, &na) != MUON_OK ||
        muon_get_momentum(b->opt, b->index[k], &mb, &nb) != MUON_OK || na != nb || na != a->size[k] ||
        memcmp(ma, mb, na * sizeof(float)) != 0) return k;
  }
  return -1;
}

/* The state blob (momentum, AdamW moments, step counts); caller frees. */
static unsigned char *state_of(const run *r, size_t *n) {
  unsigned char *buf;
  *n = muon_state_size(r->opt);
  buf = (unsigned char *)xalloc(*n);
  if (muon_state_save(r->opt, buf, *n) != MUON_OK) { free(buf); *n = 0; return NULL; }
  return buf;
}
static int same_state(const run *a, const run *b) {
  size_t na, nb;
  unsigned char *sa = state_of(a, &na), *sb = state_of(b, &nb);
  int same = sa && sb && na == nb && memcmp(sa, sb, na) == 0;
  free(sa); free(sb);
  return same;
}

/* A copy of every param and mirror buffer plus the state blob, to prove nothing changed. */
typedef struct { unsigned char *bytes; size_t n; } snap;
static snap snap_take(const run *r) {
  snap s;
  size_t n = 0, ns, at = 0;
  unsigned char *st = state_of(r, &ns);
  int k;
  for (k = 0; k < items(r); k++) n += r->size[k] * (dsize(r->c.param_dtype) + (r->mir[k] ? 2 : 0));
  s.n = n + ns;
  s.bytes = (unsigned char *)xalloc(s.n);
  for (k = 0; k < items(r); k++) {
    memcpy(s.bytes + at, r->p[k], r->size[k] * dsize(r->c.param_dtype)); at += r->size[k] * dsize(r->c.param_dtype);
    if (r->mir[k]) { memcpy(s.bytes + at, r->mir[k], r->size[k] * 2); at += r->size[k] * 2; }
  }
  if (st) memcpy(s.bytes + at, st, ns);
  free(st);
  return s;
}
static int snap_same(const snap *a, const snap *b) { return a->n == b->n && memcmp(a->bytes, b->bytes, a->n) == 0; }

/* Rounds every fp32 param to bf16 (the reference for bf16 params); returns how many changed. */
static size_t round_params(run *r) {
  int k;
  size_t i, changed = 0;
  for (k = 0; k < items(r); k++)
    for (i = 0; i < r->size[k]; i++) {
      float *x = (float *)r->p[k] + i, y = ref_round(*x);
      if (f2u(y) != f2u(*x)) changed++;
      *x = y;
    }
  return changed;
}

/* ---- 1. bf16 gradients ------------------------------------------------------------------------ */
static void test_bf16_grads(void) {
  cfg ca = base_cfg(), cb = base_cfg();
  run a, b, c;
  int s, ok;
  TEST_CASE("bf16 gradients: bitwise the fp32 run whose gradients hold the same bf16 values");
  ca.grad_dtype = MUON_DTYPE_BF16;
  ok = run_open(&a, &ca) & run_open(&b, &cb) & run_open(&c, &cb);
  for (s = 1; ok && s <= 4; s++) {
    int d;
    run_grads(&a, s, 1.0f, 0);   /* bf16 buffers: bf16(g) */
    run_grads(&b, s, 1.0f, 1);   /* fp32 buffers holding bf16(g) */
    run_grads(&c, s, 1.0f, 0);   /* fp32 g itself */
    CHECK(run_step(&a) == MUON_OK && run_step(&b) == MUON_OK && run_step(&c) == MUON_OK, "step %d", s);
    CHECK((d = diff_params(&a, &b)) < 0, "step %d: params of item %d differ", s, d);
    CHECK((d = diff_momentum(&a, &b)) < 0, "step %d: momentum of matrix %d differs", s, d);
    CHECK(same_state(&a, &b), "step %d: state (momentum, AdamW moments) differs", s);
  }
  CHECK(!ok || diff_params(&a, &c) >= 0, "rounding the gradients to bf16 changed nothing: the case proves nothing");
  run_close(&a); run_close(&b); run_close(&c);
}

/* ---- 2. gradient scale ------------------------------------------------------------------------ */
static void test_grad_scale(void) {
  /* negative: refused (0, NaN and Inf are a non-finite verdict instead: test_grad_scale_nonfinite) */
  static const uint32_t bad[] = { 0xbf800000u /* -1 */, 0x80000001u /* the negative subnormal */,
                                  0xff7fffffu /* -FLT_MAX */ };
  int gd;
  for (gd = 0; gd < 2; gd++) {
    cfg c = base_cfg();
    run a, b, u;
    int s, ok;
    TEST_CASE(gd ? "grad scale (bf16 gradients): scale s with g equals scale 1 with s*g, bitwise"
                 : "grad scale: scale s with g equals scale 1 with s*g, bitwise (Muon and AdamW)");
    c.grad_dtype = gd ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
    ok = run_open(&a, &c) & run_open(&b, &c) & run_open(&u, &c);
    if (ok) CHECK(muon_set_grad_scale(a.opt, 0.5f) == MUON_OK, "set scale 0.5");
    for (s = 1; ok && s <= 4; s++) {
      float mul = s <= 2 ? 0.5f : 0.25f;
      int d;
      size_t i;
      if (s == 3) CHECK(muon_set_grad_scale(a.opt, 0.25f) == MUON_OK, "set scale 0.25");
      for (i = 0; i < sizeof bad / sizeof bad[0]; i++)   /* rejected, and the scale stays */
        CHECK(muon_set_grad_scale(a.opt, u2f(bad[i])) == MUON_ERR_ARG, "scale with bits 0x%08x accepted", (unsigned)bad[i]);
      run_grads(&a, s, 1.0f, 0);
      run_grads(&b, s, mul, 0);    /* exact: a power of two (bf16: rounding commutes with it) */
      run_grads(&u, s, 1.0f, 0);
      CHECK(run_step(&a) == MUON_OK && run_step(&b) == MUON_OK && run_step(&u) == MUON_OK, "step %d", s);
      CHECK((d = diff_params(&a, &b)) < 0, "step %d: params of item %d differ", s, d);
      CHECK((d = diff_momentum(&a, &b)) < 0, "step %d: momentum of matrix %d differs", s, d);
      CHECK(same_state(&a, &b), "step %d: state (momentum, AdamW moments) differs", s);
      if (s == 1) {
        /* The scale did something: the unscaled run's momentum is twice a's, exactly. */
        const float *ma = NULL, *mu = NULL;
        size_t na = 0, nu = 0, j, wrong = 0;
        CHECK(muon_get_momentum(a.opt, 0, &ma, &na) == MUON_OK && muon_get_momentum(u.opt, 0, &mu, &nu) == MUON_OK && na == nu, "momentum");
        for (j = 0; j < na; j++) wrong += f2u(2.0f * ma[j]) != f2u(mu[j]);
        CHECK(wrong == 0 && diff_momentum(&a, &u) >= 0, "momentum with scale 0.5 is not half the unscaled one (%zu elements)", wrong);
      }
    }
    run_close(&a); run_close(&b); run_close(&u);
  }
}

/* ---- 2b. gradient scale 0, NaN or Inf: llm.c's clip factor for a non-finite norm --------------- */
static void test_grad_scale_nonfinite(void) {
  static const uint32_t nonfinite[] = { 0x00000000u, 0x80000000u /* -0 */, 0x7fc00000u /* NaN */,
                                        0xffc00001u, 0x7f800000u /* Inf */, 0xff800000u };
  int skip;
  size_t i;
  for (skip = 0; skip < 2; skip++) {
    TEST_CASE(skip ? "grad scale 0 / NaN / Inf, SKIP: every matrix and AdamW param skipped, nothing changes; scale 1 resumes bitwise"
                   : "grad scale 0 / NaN / Inf, ERROR: MUON_ERR_NONFINITE naming the scale, nothing applied, until the scale is reset");
    for (i = 0; i < sizeof nonfinite / sizeof nonfinite[0]; i++) {
      cfg c = base_cfg();
      run a, b;
      muon_stats st;
      int d, ok;
      muon_status got;
      c.skip = skip;
      ok = run_open(&a, &c) & run_open(&b, &c);
      if (!ok) { run_close(&a); run_close(&b); continue; }
      run_grads(&a, 1, 1.0f, 0);
      run_grads(&b, 1, 1.0f, 0);
      CHECK(run_step(&a) == MUON_OK && run_step(&b) == MUON_OK, "step 1");
      CHECK(muon_set_grad_scale(a.opt, u2f(nonfinite[i])) == MUON_OK, "scale 0x%08x refused: %s", (unsigned)nonfinite[i],
            muon_error(a.opt));
      run_grads(&a, 2, 1.0f, 0);   /* finite gradients: only the scale says "not finite" */
      got = muon_step(a.opt);
      if (skip) {
        CHECK(got == MUON_OK, "scale 0x%08x, SKIP: %s", (unsigned)nonfinite[i], muon_error(a.opt));
        CHECK(muon_get_stats(a.opt, &st) == MUON_OK && st.skipped == a.n, "scale 0x%08x: %lld matrices skipped, want %d",
              (unsigned)nonfinite[i], st.skipped, a.n);
      } else {
        CHECK(got == MUON_ERR_NONFINITE && strstr(muon_error(a.opt), "gradient scale is 0"), "scale 0x%08x, ERROR: %s: %s",
              (unsigned)nonfinite[i], muon_status_string(got), muon_error(a.opt));
        CHECK(muon_step(a.opt) == MUON_ERR_NONFINITE, "scale 0x%08x: the scale stays until reset", (unsigned)nonfinite[i]);
        CHECK(muon_get_stats(a.opt, &st) == MUON_OK && st.steps == 1, "scale 0x%08x: %lld steps counted, want 1",
              (unsigned)nonfinite[i], st.steps);
      }
      CHECK((d = diff_params(&a, &b)) < 0, "scale 0x%08x: params of item %d changed", (unsigned)nonfinite[i], d);
      CHECK((d = diff_momentum(&a, &b)) < 0, "scale 0x%08x: momentum of matrix %d changed", (unsigned)nonfinite[i], d);
      CHECK(muon_set_grad_scale(a.opt, 1.0f) == MUON_OK, "scale 1");
      run_grads(&a, 3, 1.0f, 0);
      run_grads(&b, 3, 1.0f, 0);
      CHECK(run_step(&a) == MUON_OK && run_step(&b) == MUON_OK, "step 3");
      CHECK((d = diff_params(&a, &b)) < 0, "scale 0x%08x, after: params of item %d differ from the run without the incident",
            (unsigned)nonfinite[i], d);
      CHECK((d = diff_momentum(&a, &b)) < 0, "scale 0x%08x, after: momentum of matrix %d differs", (unsigned)nonfinite[i], d);
      run_close(&a); run_close(&b);
    }
  }
}

/* ---- 3. bf16 mirror, nearest ------------------------------------------------------------------ */
static void test_mirror_nearest(void) {
  cfg ca = base_cfg(), cb = base_cfg();
  run a, b;
  int s, ok;
  size_t rounded_up = 0;
  TEST_CASE("bf16 mirror (nearest): each element is RNE(param) after every step; params as without");
  ca.mirror = 1;
  ok = run_open(&a, &ca) & run_open(&b, &cb);
  for (s = 1; ok && s <= 4; s++) {
    int k, d;
    size_t i, wrong = 0;
    run_grads(&a, s, 1.0f, 0);
    run_grads(&b, s, 1.0f, 0);
    CHECK(run_step(&a) == MUON_OK && run_step(&b) == MUON_OK, "step %d", s);
    for (k = 0; k < items(&a); k++)
      for (i = 0; i < a.size[k]; i++) {
        float x = ((const float *)a.p[k])[i];
        uint16_t want = ref_bf16(x);
        if (a.mir[k][i] != want) {
          if (!wrong) printf("  step %d item %d [%zu]: param 0x%08x mirror 0x%04x, want 0x%04x\n", s, k, i, (unsigned)f2u(x), a.mir[k][i], want);
          wrong++;
        }
        rounded_up += want != (uint16_t)(f2u(x) >> 16);
      }
    CHECK(wrong == 0, "step %d: %zu mirror elements are not the nearest bf16 of the param", s, wrong);
    CHECK((d = diff_params(&a, &b)) < 0, "step %d: params of item %d differ from the run without mirror", s, d);
    CHECK(same_state(&a, &b), "step %d: state differs from the run without mirror", s);
  }
  CHECK(!ok || rounded_up > 0, "no element rounds away from zero: truncation would pass too");
  run_close(&a); run_close(&b);
}

/* ---- 4. bf16 params --------------------------------------------------------------------------- */
static void test_bf16_params(void) {
  cfg ca = base_cfg(), cr = base_cfg();
  run a, r;
  int s, ok;
  size_t changed = 0;
  TEST_CASE("bf16 params: the fp32 update rounded back, bitwise an fp32 run rounded after each step");
  ca.param_dtype = MUON_DTYPE_BF16;
  ca.mirror = 1;
  ok = run_open(&a, &ca) & run_open(&r, &cr);
  for (s = 1; ok && s <= 4; s++) {
    int k, d;
    size_t i, wrong = 0, mwrong = 0;
    run_grads(&a, s, 1.0f, 0);
    run_grads(&r, s, 1.0f, 0);
    CHECK(run_step(&a) == MUON_OK && run_step(&r) == MUON_OK, "step %d", s);
    changed += round_params(&r);
    for (k = 0; k < items(&a); k++)
      for (i = 0; i < a.size[k]; i++) {
        uint16_t h = ((const uint16_t *)a.p[k])[i];
        uint32_t want = f2u(((const float *)r.p[k])[i]);
        if (((uint32_t)h << 16) != want) {
          if (!wrong) printf("  step %d item %d [%zu]: bf16 param 0x%04x, reference 0x%08x\n", s, k, i, h, (unsigned)want);
          wrong++;
        }
        mwrong += a.mir[k][i] != h;
      }
    CHECK(wrong == 0, "step %d: %zu bf16 params differ from the rounded fp32 reference", s, wrong);
    CHECK(mwrong == 0, "step %d: %zu mirror elements differ from the bf16 param", s, mwrong);
    CHECK((d = diff_momentum(&a, &r)) < 0, "step %d: momentum of matrix %d differs", s, d);
    CHECK(same_state(&a, &r), "step %d: state (momentum, AdamW moments) differs", s);
  }
  CHECK(!ok || changed > 0, "the reference never had to round: the case proves nothing");
  run_close(&a); run_close(&r);
}

/* ---- 5. stochastic rounding ------------------------------------------------------------------- */
/* Copies a's (bf16) params into r's fp32 params, as floats. */
static void feed(run *r, const run *a) {
  int k;
  size_t i;
  for (k = 0; k < items(a); k++)
    for (i = 0; i < a->size[k]; i++) ((float *)r->p[k])[i] = get_f(a->p[k], a->c.param_dtype, i);
}

static void test_stochastic(void) {
  cfg cs = base_cfg(), cr = base_cfg(), cy = base_cfg();
  run s1, s2, s3, r, y1, y3;
  int s, ok, d;
  size_t ups = 0, downs = 0, not_nearest = 0, bad = 0, ybad = 0;
  cs.param_dtype = MUON_DTYPE_BF16;
  cs.mirror = 1;
  cs.rounding = MUON_ROUND_STOCHASTIC;
  cs.seed = 1234;
  cy.mirror = 1;                       /* fp32 master weights with a stochastic bf16 mirror */
  cy.rounding = MUON_ROUND_STOCHASTIC;
  cy.seed = 1234;

  TEST_CASE("stochastic rounding: same seed same bits, other seed other bits, always a bf16 neighbour");
  ok = run_open(&s1, &cs);
  ok &= run_open(&s2, &cs);
  cs.seed = 1235;
  ok &= run_open(&s3, &cs);
  ok &= run_open(&r, &cr);
  ok &= run_open(&y1, &cy);
  cy.seed = 1235;
  ok &= run_open(&y3, &cy);
  for (s = 1; ok && s <= 4; s++) {
    int k;
    size_t i;
    run *all[6];
    all[0] = &s1; all[1] = &s2; all[2] = &s3; all[3] = &r; all[4] = &y1; all[5] = &y3;
    feed(&r, &s1);                     /* the fp32 value s1 rounds this step */
    for (k = 0; k < 6; k++) run_grads(all[k], s, 1.0f, 0);
    for (k = 0; k < 6; k++) CHECK(run_step(all[k]) == MUON_OK, "step %d run %d", s, k);
    CHECK((d = diff_params(&s1, &s2)) < 0 && diff_mirrors(&s1, &s2) < 0, "step %d: same seed, item %d differs", s, d);
    CHECK(diff_mirrors(&y1, &y3) >= 0, "step %d: another seed gives the same mirror bits", s);
    CHECK((d = diff_params(&y1, &y3)) < 0, "step %d: fp32 params depend on the rounding seed (item %d)", s, d);
    for (k = 0; k < items(&s1); k++)
      for (i = 0; i < s1.size[k]; i++) {
        uint16_t h = ((const uint16_t *)s1.p[k])[i];
        float x = ((const float *)r.p[k])[i], yx = ((const float *)y1.p[k])[i];
        if (!is_neighbour(h, x)) {
          if (!bad) printf("  step %d item %d [%zu]: fp32 0x%08x rounded to 0x%04x\n", s, k, i, (unsigned)f2u(x), h);
          bad++;
        }
        if (s1.mir[k][i] != h) bad++;
        if (!is_neighbour(y1.mir[k][i], yx)) ybad++;
        if ((f2u(x) & 0xffffu) != 0) {
          if (h == (uint16_t)(f2u(x) >> 16)) downs++; else ups++;
          not_nearest += h != ref_bf16(x);
        }
      }
  }
  CHECK(!ok || diff_params(&s1, &s3) >= 0, "another seed gives the same bf16 params");
  CHECK(bad == 0, "%zu bf16 params (or their mirrors) are not a bf16 neighbour of the fp32 value", bad);
  CHECK(ybad == 0, "%zu stochastic mirrors of fp32 params are not a bf16 neighbour", ybad);
  CHECK(!ok || (ups > 0 && downs > 0 && not_nearest > 0), "rounding looks deterministic: %zu up, %zu down, %zu not nearest", ups, downs, not_nearest);
  run_close(&s1); run_close(&s2); run_close(&s3); run_close(&r); run_close(&y1); run_close(&y3);

  /* (d) Unbiasedness. For an element with fp32 value x between bf16 neighbours lo < hi (in
     magnitude), spacing h = hi - lo and f = (x - lo) / h, the rounded value is hi with
     probability f: the error e = rounded - x has mean 0 and variance f(1-f)h^2, independently per
     element and step (the bits hash seed, step, matrix and index). We check |sum e| < 5 sqrt(sum
     f(1-f)h^2), i.e. |mean error| < 5 standard errors, over all elements of a 256 x 256 matrix and
     4 steps (~260k samples), and the same per quarter of f (sum (up - f) against sum f(1-f)), which
     also catches a fair coin (up with probability 1/2, unbiased on average but not per quarter).
     For a correct implementation each check fails with probability ~6e-7 (normal tail beyond 5
     sigma), while a biased rounding is off by thousands of standard errors (truncation: mean error
     -h/2; nearest or a coin: |mean(up - f)| = 1/8 or 3/8 per quarter, ~100 sigma). */
  TEST_CASE("stochastic rounding: unbiased over a 256 x 256 matrix (|mean error| < 5 standard errors)");
  cs = base_cfg();
  cs.param_dtype = MUON_DTYPE_BF16;
  cs.rounding = MUON_ROUND_STOCHASTIC;
  cs.seed = 777;
  cs.adamw = 0;
  cs.shapes = BIG_SHAPE;
  cs.nshapes = 1;
  cr = cs;
  cr.param_dtype = MUON_DTYPE_FP32;
  cr.rounding = MUON_ROUND_NEAREST;
  ok = run_open(&s1, &cs) & run_open(&r, &cr);
  {
    double sum_e = 0, var_e = 0, sum_h = 0, bin_dev[4] = { 0, 0, 0, 0 }, bin_var[4] = { 0, 0, 0, 0 };
    long long n = 0, bin_n[4] = { 0, 0, 0, 0 }, notn = 0;
    int q;
    for (s = 1; ok && s <= 4; s++) {
      size_t i;
      feed(&r, &s1);
      run_grads(&s1, s, 1.0f, 0);
      run_grads(&r, s, 1.0f, 0);
      CHECK(run_step(&s1) == MUON_OK && run_step(&r) == MUON_OK, "step %d", s);
      for (i = 0; i < s1.size[0]; i++) {
        uint16_t hb = ((const uint16_t *)s1.p[0])[i];
        float x = ((const float *)r.p[0])[i];
        uint32_t u = f2u(x), lo = u & 0xffff0000u, hi = lo + 0x10000u;
        double h, f, up;
        if (lo == u) continue;                       /* exact: nothing to round */
        if (!is_neighbour(hb, x)) { notn++; continue; }
        h = fabs((double)u2f(hi)) - fabs((double)u2f(lo));
        f = (fabs((double)x) - fabs((double)u2f(lo))) / h;
        up = hb == (uint16_t)(hi >> 16) ? 1.0 : 0.0;
        sum_e += (double)bf2f(hb) - (double)x;
        var_e += f * (1 - f) * h * h;
        sum_h += h;
        n++;
        q = (int)(f * 4);
        if (q > 3) q = 3;
        bin_n[q]++;
        bin_dev[q] += up - f;
        bin_var[q] += f * (1 - f);
      }
    }
    CHECK(notn == 0, "%lld values are not a bf16 neighbour", notn);
    CHECK(n > 200000, "only %lld samples", n);
    if (n > 0) {
      double mean = sum_e / (double)n / (sum_h / (double)n), se = sqrt(var_e) / (double)n / (sum_h / (double)n);
      printf("  unbiasedness: %lld samples, mean error / mean spacing = %.2e, standard error %.2e (bound 5 SE)\n", n, mean, se);
      CHECK(fabs(sum_e) < 5 * sqrt(var_e), "mean error / mean spacing %.3e exceeds 5 standard errors (%.3e)", mean, 5 * se);
    }
    for (q = 0; q < 4; q++)
      CHECK(bin_n[q] > 1000 && fabs(bin_dev[q]) < 5 * sqrt(bin_var[q]),
            "f in [%.2f, %.2f): %lld samples, sum(up - f) = %.1f, 5 SE = %.1f", q / 4.0, (q + 1) / 4.0, bin_n[q], bin_dev[q], 5 * sqrt(bin_var[q]));
  }
  run_close(&s1); run_close(&r);

  /* The public bits: a pure function whose low 16 bits (the ones stochastic rounding adds) are
     uniform: over 65536 indices each of 16 buckets holds 4096 +- 5 sigma (sigma = sqrt(4096 *
     15/16) = 62), each bit is set 32768 +- 5 sigma (sigma = 128) times, and the mean is 1/2 +- 5
     standard errors (sqrt(1/12/65536) = 0.0011). */
  TEST_CASE("muon_random_bits: pure, seed- and index-dependent, uniform low 16 bits");
  {
    long long bucket[16], bit[16];
    double sum = 0;
    unsigned long long i;
    int q, same_seed = 1, seed_differs = 0, index_differs = 0;
    memset(bucket, 0, sizeof bucket);
    memset(bit, 0, sizeof bit);
    for (i = 0; i < 65536; i++) {
      unsigned b = muon_random_bits(1234, i);
      same_seed &= b == muon_random_bits(1234, i);
      seed_differs += b != muon_random_bits(1235, i);
      index_differs += b != muon_random_bits(1234, i + 1);
      bucket[(b & 0xffffu) >> 12]++;
      for (q = 0; q < 16; q++) bit[q] += (b >> q) & 1u;
      sum += (double)(b & 0xffffu) / 65536.0;
    }
    CHECK(same_seed, "not a pure function");
    CHECK(seed_differs > 65000 && index_differs > 65000, "bits barely depend on seed (%d) or index (%d)", seed_differs, index_differs);
    CHECK(fabs(sum / 65536.0 - 0.5 + 0.5 / 65536.0) < 5 * sqrt(1.0 / 12 / 65536), "mean of the low 16 bits %.5f", sum / 65536.0);
    for (q = 0; q < 16; q++) {
      CHECK(bucket[q] > 4096 - 310 && bucket[q] < 4096 + 310, "bucket %d holds %lld of 65536", q, bucket[q]);
      CHECK(bit[q] > 32768 - 640 && bit[q] < 32768 + 640, "bit %d is set %lld times of 65536", q, bit[q]);
    }
  }

  /* (e) The bits depend on the matrix (its name) and the element's index in it, not on the
     order of registration. */
  TEST_CASE("stochastic rounding: the same bits per matrix whatever the registration order");
  cs = base_cfg();
  cs.param_dtype = MUON_DTYPE_BF16;
  cs.mirror = 1;
  cs.rounding = MUON_ROUND_STOCHASTIC;
  cs.seed = 99;
  cs.shapes = FAULT_SHAPES;
  cs.nshapes = (int)(sizeof FAULT_SHAPES / sizeof FAULT_SHAPES[0]);
  cr = cs;
  cr.reverse = 1;
  ok = run_open(&s1, &cs) & run_open(&s2, &cr);
  CHECK(!ok || s1.index[0] != s2.index[0], "the orders do not differ");
  for (s = 1; ok && s <= 3; s++) {
    run_grads(&s1, s, 1.0f, 0);
    run_grads(&s2, s, 1.0f, 0);
    CHECK(run_step(&s1) == MUON_OK && run_step(&s2) == MUON_OK, "step %d", s);
    CHECK((d = diff_params(&s1, &s2)) < 0 && (d = diff_mirrors(&s1, &s2)) < 0, "step %d: matrix %d ('%s') differs", s, d, d >= 0 ? s1.name[d] : "");
  }
  run_close(&s1); run_close(&s2);
}

/* ---- 6. strides for stacked matrices ---------------------------------------------------------- */
#define ST_R 13
#define ST_C 7
#define ST_N (ST_R * ST_C)   /* 91 */
#define ST_L 3
#define ST_PS ((size_t)100)   /* param, grad, mirror and momentum strides: all different, > ST_N */
#define ST_GS ((size_t)97)
#define ST_MS ((size_t)103)
#define ST_BS ((size_t)111)

static int in_slice(size_t j, size_t stride) { return j % stride < ST_N && j / stride < ST_L; }

static void test_strides(void) {
  int v;
  for (v = 0; v < 2; v++) {
    /* v 0: fp32 params, bf16 grads, nearest; v 1: bf16 params, fp32 grads, stochastic. */
    muon_dtype pd = v ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32, gd = v ? MUON_DTYPE_FP32 : MUON_DTYPE_BF16;
    size_t psz = dsize(pd), gsz = dsize(gd), j;
    unsigned char *P = (unsigned char *)xalloc(ST_L * ST_PS * psz), *G = (unsigned char *)xalloc(ST_L * ST_GS * gsz);
    uint16_t *M = (uint16_t *)xalloc(ST_L * ST_MS * 2);
    float *B = (float *)xalloc(ST_L * ST_BS * sizeof(float));
    unsigned char *P0, *G0, *M0, *B0;
    unsigned char *rp[ST_L], *rg[ST_L];
    uint16_t *rm[ST_L];
    muon_optimizer *opt = NULL, *ref = NULL;
    muon_desc d = muon_default_desc();
    muon_matrix m = muon_default_matrix();
    int first = -1, i, s, ok = 1;
    char nm[16];
    TEST_CASE(v ? "stacked matrices, bf16 params / fp32 grads / stochastic: separate strides equal separate matrices"
                : "stacked matrices, fp32 params / bf16 grads / mirror: separate strides equal separate matrices");
    d.hparams.lr = LR;
    d.rounding = v ? MUON_ROUND_STOCHASTIC : MUON_ROUND_NEAREST;
    d.seed = 5;
    /* Sentinels everywhere; NaN in the gradient gaps, so reading one fails the step. */
    for (j = 0; j < ST_L * ST_PS; j++) set_f(P, pd, j, 777.0f);
    for (j = 0; j < ST_L * ST_GS; j++) {
      if (gd == MUON_DTYPE_BF16) ((uint16_t *)G)[j] = 0x7fc1u; else ((float *)G)[j] = u2f(0x7fc00001u);
    }
    for (j = 0; j < ST_L * ST_MS; j++) M[j] = 0x5555u;
    for (j = 0; j < ST_L * ST_BS; j++) B[j] = 1234.5f;
    for (i = 0; i < ST_L; i++) {
      rp[i] = (unsigned char *)xalloc(ST_N * psz);
      rg[i] = (unsigned char *)xalloc(ST_N * gsz);
      rm[i] = (uint16_t *)xalloc(ST_N * 2);
      memset(rm[i], 0xff, ST_N * 2);
      for (j = 0; j < ST_N; j++) {
        float x = ref_round(0.5f * hval(500 + (unsigned)i, j));
        set_f(rp[i], pd, j, x);
        set_f(P + (i * ST_PS) * psz, pd, j, x);
      }
      memset(M + i * ST_MS, 0xff, ST_N * 2);
    }
    P0 = (unsigned char *)xalloc(ST_L * ST_PS * psz); memcpy(P0, P, ST_L * ST_PS * psz);
    M0 = (unsigned char *)xalloc(ST_L * ST_MS * 2); memcpy(M0, M, ST_L * ST_MS * 2);
    B0 = (unsigned char *)xalloc(ST_L * ST_BS * 4); memcpy(B0, B, ST_L * ST_BS * 4);
    G0 = NULL;

    ok = muon_create(&opt, &d) == MUON_OK && muon_create(&ref, &d) == MUON_OK;
    m.name = "w"; m.rows = ST_R; m.cols = ST_C; m.count = ST_L;
    m.param = P; m.grad = G; m.mirror = M; m.momentum = B;
    m.param_dtype = pd; m.grad_dtype = gd;
    m.stride = ST_PS; m.grad_stride = ST_GS; m.mirror_stride = ST_MS; m.momentum_stride = ST_BS;
    ok = ok && muon_add_matrix(opt, &m, &first) == MUON_OK && first == 0 && muon_matrix_count(opt) == ST_L;
    CHECK(ok, "register the stack: %s", opt ? muon_error(opt) : "");
    for (i = 0; ok && i < ST_L; i++) {
      muon_matrix x = muon_default_matrix();
      snprintf(nm, sizeof nm, "w[%d]", i);   /* the names muon gives the slices */
      x.name = nm; x.rows = ST_R; x.cols = ST_C; x.param = rp[i]; x.grad = rg[i]; x.mirror = rm[i];
      x.param_dtype = pd; x.grad_dtype = gd;
      ok = muon_add_matrix(ref, &x, NULL) == MUON_OK;
      CHECK(ok, "register slice %d: %s", i, muon_error(ref));
    }
    /* Momentum: zeroed per slice (gaps kept), and what muon_get_momentum reports. */
    for (i = 0; ok && i < ST_L; i++) {
      const float *mb = NULL;
      size_t n, nz = 0;
      CHECK(muon_get_momentum(opt, first + i, &mb, &n) == MUON_OK && mb == B + i * ST_BS && n == ST_N, "slice %d momentum pointer", i);
      for (j = 0; j < ST_N; j++) nz += f2u(B[i * ST_BS + j]) != 0;
      CHECK(nz == 0, "slice %d: %zu momentum elements not zeroed at registration", i, nz);
    }
    for (s = 1; ok && s <= 3; s++) {
      size_t bad = 0;
      for (i = 0; i < ST_L; i++)
        for (j = 0; j < ST_N; j++) {
          float g = hval(9000ull + 10ull * (unsigned long long)s + (unsigned long long)i, j);
          set_f(rg[i], gd, j, g);
          set_f(G + (i * ST_GS) * gsz, gd, j, g);
        }
      if (s == 1) { G0 = (unsigned char *)xalloc(ST_L * ST_GS * gsz); memcpy(G0, G, ST_L * ST_GS * gsz); }
      CHECK(muon_step(opt) == MUON_OK, "step %d: %s", s, muon_error(opt));
      CHECK(muon_step(ref) == MUON_OK, "ref step %d: %s", s, muon_error(ref));
      for (i = 0; i < ST_L; i++) {
        const float *mb = NULL;
        size_t n;
        CHECK(memcmp(P + i * ST_PS * psz, rp[i], ST_N * psz) == 0, "step %d: params of slice %d differ", s, i);
        CHECK(memcmp(M + i * ST_MS, rm[i], ST_N * 2) == 0, "step %d: mirror of slice %d differs", s, i);
        CHECK(muon_get_momentum(ref, i, &mb, &n) == MUON_OK && memcmp(B + i * ST_BS, mb, ST_N * 4) == 0, "step %d: momentum of slice %d differs", s, i);
      }
      for (j = 0; j < ST_L * ST_PS; j++) if (!in_slice(j, ST_PS)) bad += memcmp(P + j * psz, P0 + j * psz, psz) != 0;
      for (j = 0; j < ST_L * ST_MS; j++) if (!in_slice(j, ST_MS)) bad += memcmp(M + j, M0 + 2 * j, 2) != 0;
      for (j = 0; j < ST_L * ST_BS; j++) if (!in_slice(j, ST_BS)) bad += memcmp(B + j, B0 + 4 * j, 4) != 0;
      if (s == 1) for (j = 0; j < ST_L * ST_GS; j++) bad += memcmp(G + j * gsz, G0 + j * gsz, gsz) != 0;
      CHECK(bad == 0, "step %d: %zu gap elements (or gradients) were written", s, bad);
    }
    muon_destroy(opt);
    muon_destroy(ref);
    for (i = 0; i < ST_L; i++) { free(rp[i]); free(rg[i]); free(rm[i]); }
    free(P); free(G); free(M); free(B); free(P0); free(G0); free(M0); free(B0);
  }

  {
    static float w[ST_L * ST_PS], g[ST_L * ST_PS], mom[ST_L * ST_BS];
    static uint16_t mir[ST_L * ST_MS];
    muon_optimizer *opt = NULL;
    muon_desc d = muon_default_desc();
    int k, idx = -1;
    TEST_CASE("stacked matrices: a stride below rows*cols is MUON_ERR_SHAPE and adds nothing");
    if (muon_create(&opt, &d) != MUON_OK) { CHECK(0, "create"); return; }
    for (k = 0; k < 4; k++) {
      muon_matrix m = muon_default_matrix();
      muon_status st;
      m.name = "w"; m.rows = ST_R; m.cols = ST_C; m.count = ST_L;
      m.param = w; m.grad = g; m.mirror = mir; m.momentum = mom;
      m.stride = ST_PS; m.grad_stride = ST_GS; m.mirror_stride = ST_MS; m.momentum_stride = ST_BS;
      if (k == 0) m.stride = ST_N - 1;
      if (k == 1) m.grad_stride = ST_N - 1;
      if (k == 2) m.mirror_stride = ST_N - 1;
      if (k == 3) m.momentum_stride = ST_N - 1;
      st = muon_add_matrix(opt, &m, NULL);
      CHECK(st == MUON_ERR_SHAPE, "stride %d of %d: %s", k, ST_N - 1, muon_status_string(st));
      CHECK(muon_matrix_count(opt) == 0, "a matrix was added");
    }
    {
      muon_matrix m = muon_default_matrix();
      m.name = "w"; m.rows = ST_R; m.cols = ST_C; m.count = ST_L; m.param = w; m.grad = g; m.mirror = mir; m.momentum = mom;
      m.stride = ST_N; m.grad_stride = ST_N; m.mirror_stride = ST_N; m.momentum_stride = ST_N;
      CHECK(muon_add_matrix(opt, &m, &idx) == MUON_OK && idx == 0 && muon_matrix_count(opt) == ST_L, "strides of exactly rows*cols: %s", muon_error(opt));
    }
    muon_destroy(opt);
  }
}

/* ---- 7. trainer-owned momentum ---------------------------------------------------------------- */
static void test_trainer_momentum(void) {
  cfg ca = base_cfg(), cb = base_cfg();
  run a, b, c;
  int s, k, ok, d;
  float *saved[MAXM];
  unsigned char *blob = NULL, *blob_b = NULL, *psaved[MAXM + 1];
  size_t nblob = 0, nblob_b = 0;
  TEST_CASE("trainer-owned momentum: zeroed at registration, is muon's momentum, saved and loaded");
  ca.own_momentum = 1;
  ok = run_open(&a, &ca) & run_open(&b, &cb);
  memset(saved, 0, sizeof saved);
  memset(psaved, 0, sizeof psaved);
  for (k = 0; ok && k < a.n; k++) {
    const float *mb = NULL;
    size_t n, i, nz = 0;
    for (i = 0; i < a.size[k]; i++) nz += f2u(a.mom[k][i]) != 0;
    CHECK(nz == 0, "matrix %d: %zu momentum elements not zeroed at registration", k, nz);
    CHECK(muon_get_momentum(a.opt, a.index[k], &mb, &n) == MUON_OK && mb == a.mom[k] && n == a.size[k], "matrix %d: muon_get_momentum is not the trainer's buffer", k);
  }
  for (s = 1; ok && s <= 3; s++) {
    run_grads(&a, s, 1.0f, 0);
    run_grads(&b, s, 1.0f, 0);
    CHECK(run_step(&a) == MUON_OK && run_step(&b) == MUON_OK, "step %d", s);
    CHECK((d = diff_params(&a, &b)) < 0, "step %d: params of item %d differ from internal momentum", s, d);
    CHECK((d = diff_momentum(&a, &b)) < 0, "step %d: momentum of matrix %d differs", s, d);
    for (k = 0; k < a.n; k++) {
      const float *mb = NULL;
      size_t n;
      CHECK(muon_get_momentum(a.opt, a.index[k], &mb, &n) == MUON_OK && mb == a.mom[k], "step %d: pointer", s);
    }
  }
  if (ok) {
    blob = state_of(&a, &nblob);
    blob_b = state_of(&b, &nblob_b);
    CHECK(blob && blob_b && nblob == nblob_b && memcmp(blob, blob_b, nblob) == 0, "state blobs of trainer-owned and internal momentum differ");
    for (k = 0; k < items(&a); k++) {
      psaved[k] = (unsigned char *)xalloc(a.size[k] * 4);
      memcpy(psaved[k], a.p[k], a.size[k] * 4);
      if (k < a.n) { saved[k] = (float *)xalloc(a.size[k] * 4); memcpy(saved[k], a.mom[k], a.size[k] * 4); }
    }
    for (s = 4; s <= 5; s++) { run_grads(&a, s, 1.0f, 0); CHECK(run_step(&a) == MUON_OK, "step %d", s); }
    CHECK(memcmp(saved[0], a.mom[0], a.size[0] * 4) != 0, "momentum did not move after the save");
    CHECK(blob && muon_state_load(a.opt, blob, nblob) == MUON_OK, "load: %s", muon_error(a.opt));
    for (k = 0; k < a.n; k++) CHECK(memcmp(saved[k], a.mom[k], a.size[k] * 4) == 0, "matrix %d: load did not restore the trainer's buffer", k);
    /* Continue from the restored state: equals the run that never left it. */
    for (k = 0; k < items(&a); k++) memcpy(a.p[k], psaved[k], a.size[k] * 4);
    for (s = 4; s <= 5; s++) {
      run_grads(&a, s, 1.0f, 0);
      run_grads(&b, s, 1.0f, 0);
      CHECK(run_step(&a) == MUON_OK && run_step(&b) == MUON_OK, "step %d after load", s);
      CHECK((d = diff_params(&a, &b)) < 0 && diff_momentum(&a, &b) < 0 && same_state(&a, &b), "step %d after load: item %d differs", s, d);
    }
    /* Into a fresh optimizer with other trainer buffers. */
    if (run_open(&c, &ca)) {
      CHECK(blob && muon_state_load(c.opt, blob, nblob) == MUON_OK, "load into a fresh optimizer: %s", muon_error(c.opt));
      for (k = 0; k < c.n; k++) CHECK(memcmp(saved[k], c.mom[k], c.size[k] * 4) == 0, "matrix %d: fresh load differs", k);
      run_close(&c);
    }
  }
  for (k = 0; k <= MAXM; k++) { free(psaved[k]); if (k < MAXM) free(saved[k]); }
  free(blob); free(blob_b);
  run_close(&a); run_close(&b);
}

/* ---- 8. NaN / Inf in bf16 gradients ----------------------------------------------------------- */
static void test_nonfinite_bf16(void) {
  static const uint16_t bad[] = { 0x7fc0u /* NaN */, 0x7f80u /* Inf */, 0xff80u /* -Inf */, 0x7f81u /* sNaN */, 0xffffu };
  cfg c = base_cfg();
  run a, r;
  int ok, d;
  size_t b;
  TEST_CASE("bf16 NaN / Inf gradients: MUON_ERR_NONFINITE, nothing changed, then as if never seen");
  c.grad_dtype = MUON_DTYPE_BF16;
  c.mirror = 1;
  ok = run_open(&a, &c) & run_open(&r, &c);
  if (ok) {
    run_grads(&a, 1, 1.0f, 0); run_grads(&r, 1, 1.0f, 0);
    CHECK(run_step(&a) == MUON_OK && run_step(&r) == MUON_OK, "step 1");
    for (b = 0; b < sizeof bad / sizeof bad[0]; b++) {
      int t;
      for (t = 0; t < 2; t++) {
        int item = t ? a.n : 2;          /* matrix w2, or the AdamW param */
        snap before, after;
        muon_status st;
        run_grads(&a, 2, 1.0f, 0);
        ((uint16_t *)a.g[item])[5] = bad[b];
        before = snap_take(&a);
        st = muon_step(a.opt);
        after = snap_take(&a);
        CHECK(st == MUON_ERR_NONFINITE, "bf16 0x%04x in %s: %s", bad[b], a.name[item], muon_status_string(st));
        CHECK(strstr(muon_error(a.opt), a.name[item]) != NULL, "message does not name '%s': %s", a.name[item], muon_error(a.opt));
        CHECK(snap_same(&before, &after), "bf16 0x%04x in %s: params, mirrors or state changed", bad[b], a.name[item]);
        free(before.bytes); free(after.bytes);
      }
    }
    run_grads(&a, 2, 1.0f, 0); run_grads(&r, 2, 1.0f, 0);
    CHECK(run_step(&a) == MUON_OK && run_step(&r) == MUON_OK, "step 2");
    CHECK((d = diff_params(&a, &r)) < 0 && diff_mirrors(&a, &r) < 0 && same_state(&a, &r), "after the failed steps: item %d differs from a clean run", d);
    /* The largest finite bf16 is not a non-finite gradient; in AdamW its square overflows v. */
    run_grads(&a, 3, 1.0f, 0);
    ((uint16_t *)a.g[a.n])[3] = 0xff7fu;
    {
      snap before = snap_take(&a), after;
      muon_status st = muon_step(a.opt);
      after = snap_take(&a);
      CHECK(st == MUON_ERR_NONFINITE && strstr(muon_error(a.opt), "overflows") &&
                strstr(muon_error(a.opt), a.name[a.n]), "largest finite bf16 in AdamW: %s", muon_error(a.opt));
      CHECK(snap_same(&before, &after), "an overflowing AdamW step changed params, mirrors or state");
      free(before.bytes); free(after.bytes);
    }
    run_grads(&a, 3, 1.0f, 0);
    ((uint16_t *)a.g[1])[3] = 0x7f7fu;
    CHECK(muon_step(a.opt) == MUON_OK, "largest finite bf16 flagged: %s", muon_error(a.opt));
  }
  run_close(&a); run_close(&r);

  TEST_CASE("bf16 NaN / Inf gradients with MUON_NONFINITE_SKIP: that matrix and param are skipped");
  c.skip = 1;
  ok = run_open(&a, &c) & run_open(&r, &c);
  if (ok) {
    unsigned char *w0 = (unsigned char *)xalloc(a.size[0] * 4), *w1 = (unsigned char *)xalloc(a.size[1] * 4), *bias = (unsigned char *)xalloc(ADAMW_SIZE * 4);
    float *m1 = (float *)xalloc(a.size[1] * 4);
    const float *mb = NULL;
    size_t n = 0;
    run_grads(&a, 1, 1.0f, 0); run_grads(&r, 1, 1.0f, 0);
    CHECK(run_step(&a) == MUON_OK && run_step(&r) == MUON_OK, "step 1");
    run_grads(&a, 2, 1.0f, 0); run_grads(&r, 2, 1.0f, 0);
    ((uint16_t *)a.g[1])[7] = 0x7fc0u;        /* NaN in w1 */
    ((uint16_t *)a.g[a.n])[0] = 0xff80u;      /* -Inf in bias */
    CHECK(muon_set_grad(r.opt, r.index[1], NULL) == MUON_OK && muon_set_adamw_grad(r.opt, r.index[r.n], NULL) == MUON_OK, "absent grads");
    memcpy(w0, a.p[0], a.size[0] * 4);
    memcpy(w1, a.p[1], a.size[1] * 4);
    memcpy(bias, a.p[a.n], ADAMW_SIZE * 4);
    CHECK(muon_get_momentum(a.opt, a.index[1], &mb, &n) == MUON_OK, "momentum");
    memcpy(m1, mb, n * 4);
    CHECK(run_step(&a) == MUON_OK && run_step(&r) == MUON_OK, "step 2");
    CHECK(memcmp(w1, a.p[1], a.size[1] * 4) == 0 && memcmp(m1, mb, n * 4) == 0, "the skipped matrix changed");
    CHECK(memcmp(bias, a.p[a.n], ADAMW_SIZE * 4) == 0, "the skipped AdamW param changed");
    CHECK((d = diff_params(&a, &r)) < 0 && diff_mirrors(&a, &r) < 0 && same_state(&a, &r), "item %d differs from the run where those gradients are absent", d);
    CHECK(memcmp(w0, a.p[0], a.size[0] * 4) != 0, "the other matrices did not move");
    muon_set_grad(r.opt, r.index[1], r.g[1]);
    muon_set_adamw_grad(r.opt, r.index[r.n], r.g[r.n]);
    run_grads(&a, 3, 1.0f, 0); run_grads(&r, 3, 1.0f, 0);
    CHECK(run_step(&a) == MUON_OK && run_step(&r) == MUON_OK, "step 3");
    CHECK((d = diff_params(&a, &r)) < 0 && same_state(&a, &r), "step 3: item %d differs", d);
    free(w0); free(w1); free(bias); free(m1);
  }
  run_close(&a); run_close(&r);
}

/* ---- 9. bad input ----------------------------------------------------------------------------- */
static void test_bad_dtypes(void) {
  static float w[7 * 13], g[7 * 13];
  static const int bad[] = { 2, 3, 255, -1 };
  muon_optimizer *opt = NULL;
  muon_desc d = muon_default_desc();
  size_t i;
  TEST_CASE("bad dtypes and rounding: MUON_ERR_ARG, nothing added, no optimizer");
  d.logger.func = capture_log;
  if (muon_create(&opt, &d) != MUON_OK) { CHECK(0, "create"); return; }
  for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    muon_matrix m = muon_default_matrix();
    muon_adamw_param p = muon_default_adamw_param();
    muon_optimizer *o2 = (muon_optimizer *)&d;   /* must become NULL */
    muon_desc d2 = d;
    muon_status st;
    m.name = "w"; m.param = w; m.grad = g; m.rows = 7; m.cols = 13;
    m.param_dtype = (muon_dtype)bad[i];
    st = muon_add_matrix(opt, &m, NULL);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(opt), "param_dtype"), "matrix param_dtype %d: %s: %s", bad[i], muon_status_string(st), muon_error(opt));
    m.param_dtype = MUON_DTYPE_FP32;
    m.grad_dtype = (muon_dtype)bad[i];
    st = muon_add_matrix(opt, &m, NULL);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(opt), "grad_dtype"), "matrix grad_dtype %d: %s: %s", bad[i], muon_status_string(st), muon_error(opt));
    p.name = "b"; p.param = w; p.grad = g; p.size = 13;
    p.param_dtype = (muon_dtype)bad[i];
    CHECK(muon_add_adamw_param(opt, &p, NULL) == MUON_ERR_ARG, "AdamW param_dtype %d", bad[i]);
    p.param_dtype = MUON_DTYPE_FP32;
    p.grad_dtype = (muon_dtype)bad[i];
    CHECK(muon_add_adamw_param(opt, &p, NULL) == MUON_ERR_ARG, "AdamW grad_dtype %d", bad[i]);
    CHECK(muon_matrix_count(opt) == 0 && muon_adamw_param_count(opt) == 0, "something was added");
    d2.rounding = (muon_rounding)bad[i];
    last_log[0] = '\0';
    st = muon_create(&o2, &d2);
    CHECK(st == MUON_ERR_ARG && o2 == NULL, "desc.rounding %d: %s", bad[i], muon_status_string(st));
    CHECK(strstr(last_log, "rounding") != NULL, "message does not name rounding: %s", last_log);
    if (st == MUON_OK) muon_destroy(o2);
  }
  muon_destroy(opt);
}

/* ---- 10. all-or-nothing through a failing compute backend ------------------------------------- */
static struct { int calls, fail_at; char text[80]; } fault;

static muon_status fault_newton_schulz(void *ctx, float *X, int batch, int m, int n, const muon_hparams *hp, void *ws) {
  fault.calls++;
  if (fault.calls == fault.fail_at) {
    snprintf(fault.text, sizeof fault.text, "injected fault in Newton-Schulz call %d", fault.calls);
    return MUON_ERR_BACKEND;
  }
  return muon_compute_cpu().vt->newton_schulz(ctx, X, batch, m, n, hp, ws);
}
static const char *fault_error(void *ctx) { (void)ctx; return fault.text; }

static void test_fault_backend(void) {
  static muon_compute_vtable vt;
  muon_compute comp;
  int variant;
  vt = *muon_compute_cpu().vt;
  vt.newton_schulz = fault_newton_schulz;
  vt.newton_schulz_many = NULL;   /* one call per batch, so a fault can hit each (test_faults covers the round's one call) */
  vt.error = fault_error;
  comp.vt = &vt;
  comp.ctx = muon_compute_cpu().ctx;
  for (variant = 0; variant < 2; variant++) {
    /* 0: one round of several NS batches; 1: the distributed path on one rank, small rounds. */
    muon_dist_config dist = muon_layout_config();
    cfg cc = base_cfg(), cf;
    run clean, a;
    int s, ok, d;
    muon_stats st0, st1;
    TEST_CASE(variant ? "failing backend, several rounds: every failure point changes nothing; the retry equals a clean run"
                      : "failing backend, several NS batches: every failure point changes nothing; the retry equals a clean run");
    dist.round_bytes = 4096;
    cc.shapes = FAULT_SHAPES;
    cc.nshapes = (int)(sizeof FAULT_SHAPES / sizeof FAULT_SHAPES[0]);
    cc.param_dtype = variant ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
    cc.mirror = 1;
    cc.rounding = MUON_ROUND_STOCHASTIC;
    cc.seed = 31;
    cc.dist = variant ? &dist : NULL;
    cf = cc;
    cf.compute = &comp;
    fault.calls = 0; fault.fail_at = 0; fault.text[0] = '\0';
    ok = run_open(&clean, &cc) & run_open(&a, &cf);
    for (s = 1; ok && s <= 3; s++) {
      int nb, N;
      run_grads(&clean, s, 1.0f, 0);
      run_grads(&a, s, 1.0f, 0);
      memset(&st0, 0, sizeof st0);
      memset(&st1, 0, sizeof st1);
      CHECK(muon_get_stats(clean.opt, &st0) == MUON_OK, "stats");
      CHECK(run_step(&clean) == MUON_OK, "clean step %d", s);
      CHECK(muon_get_stats(clean.opt, &st1) == MUON_OK, "stats");
      nb = (int)(st1.ns_batches - st0.ns_batches);
      CHECK(nb >= 2, "only %d Newton-Schulz calls per step", nb);
      if (variant) CHECK(st1.rounds >= 2, "only %d rounds", st1.rounds);
      for (N = 1; N <= nb; N++) {
        snap before = snap_take(&a), after;
        muon_status st;
        fault.calls = 0; fault.fail_at = N; fault.text[0] = '\0';
        st = muon_step(a.opt);
        after = snap_take(&a);
        CHECK(st == MUON_ERR_BACKEND, "step %d, fault at call %d: %s", s, N, muon_status_string(st));
        CHECK(fault.calls == N, "step %d: the step went on after the fault (%d calls)", s, fault.calls);
        CHECK(fault.text[0] && strstr(muon_error(a.opt), fault.text) != NULL, "step %d, call %d: message lacks the backend's text: %s", s, N, muon_error(a.opt));
        CHECK(snap_same(&before, &after), "step %d, fault at call %d: params, mirrors or state changed", s, N);
        free(before.bytes); free(after.bytes);
      }
      fault.calls = 0; fault.fail_at = 0;
      CHECK(run_step(&a) == MUON_OK, "step %d without the fault", s);
      CHECK(fault.calls == nb, "step %d: %d Newton-Schulz calls, the clean run made %d", s, fault.calls, nb);
      CHECK((d = diff_params(&a, &clean)) < 0 && (d = diff_mirrors(&a, &clean)) < 0, "step %d: item %d differs from the run that never failed", s, d);
      CHECK(same_state(&a, &clean), "step %d: state differs from the run that never failed", s);
    }
    run_close(&clean); run_close(&a);
  }

  {
    muon_desc d = muon_default_desc();
    muon_optimizer *opt;
    muon_status st;
    int k;
    TEST_CASE("compute vtable: a missing required slot, version 0 or a bad memory kind is MUON_ERR_ARG");
    d.logger.func = capture_log;
    d.compute = &comp;
    for (k = 0; k < 16; k++) {
      muon_compute_vtable v = *muon_compute_cpu().vt;
      const char *what = "";
      switch (k) {
      case 0: v.alloc = NULL; what = "alloc"; break;
      case 1: v.free = NULL; what = "free"; break;
      case 2: v.copy = NULL; what = "copy"; break;
      case 3: v.zero = NULL; what = "zero"; break;
      case 4: v.pack = NULL; what = "pack"; break;
      case 5: v.momentum = NULL; what = "momentum"; break;
      case 6: v.ns_workspace = NULL; what = "ns_workspace"; break;
      case 7: v.newton_schulz = NULL; what = "newton_schulz"; break;
      case 8: v.apply = NULL; what = "apply"; break;
      case 9: v.adamw = NULL; what = "adamw"; break;
      case 10: v.nonfinite = NULL; what = "nonfinite"; break;
      case 11: v.cast = NULL; what = "cast"; break;
      case 12: v.sync = NULL; what = "sync"; break;
      case 13: v.version = 0; what = "version 0"; break;
      case 14: v.memory = 2; what = "memory 2"; break;
      default: v.alloc_host = v.alloc; what = "alloc_host without free_host"; break;
      }
      comp.vt = &v;
      opt = (muon_optimizer *)&d;
      last_log[0] = '\0';
      st = muon_create(&opt, &d);
      CHECK(st == MUON_ERR_ARG && opt == NULL && strstr(last_log, "compute"), "%s: %s (%s)", what, muon_status_string(st), last_log);
      if (st == MUON_OK) muon_destroy(opt);
    }
    {
      muon_compute_vtable v = *muon_compute_cpu().vt;
      comp.vt = &v;
      st = muon_create(&opt, &d);
      CHECK(st == MUON_OK, "the untouched copy is rejected: %s", last_log);
      if (st == MUON_OK) muon_destroy(opt);
    }
    comp.vt = &vt;
  }
}

/* Rounding to bf16 against its definition (ref_bf16: the nearer of the two bf16 values around x
   by exact distance, ties to the even one, Inf past the largest, NaN stays NaN), bit for bit:
   every one of the 65536 upper halves with the lower halves that decide - 0, 1, just below, at
   and just above the tie, all ones - so every binade, both signs, subnormals, the largest
   finite values, Inf and every NaN payload class. muon__bf16 (the kernels' function) and the CPU
   backend's cast slot alike. */
static void test_bf16_definition(void) {
  static const uint32_t low[] = { 0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x4000u, 0xc000u };
  muon_compute cpu = muon_compute_cpu();
  static float in[65536 * 8];
  static uint16_t out[65536 * 8];
  size_t k, n = 0, bad_fn = 0, bad_cast = 0, ties = 0, nans = 0;
  TEST_CASE("bf16 rounding, bit for bit against its definition: 524288 values (every upper half x deciding lower halves)");
  for (k = 0; k < 65536; k++) {
    size_t j;
    for (j = 0; j < sizeof low / sizeof low[0]; j++) in[n++] = u2f((uint32_t)k << 16 | low[j]);
  }
  CHECK(cpu.vt->cast(cpu.ctx, out, MUON_DTYPE_BF16, in, MUON_DTYPE_FP32, n) == MUON_OK, "cast");
  for (k = 0; k < n; k++) {
    uint16_t want = ref_bf16(in[k]), got = (uint16_t)(f2u(muon__bf16(in[k])) >> 16);
    int nan = (want & 0x7f80u) == 0x7f80u && (want & 0x7fu);
    nans += nan;
    ties += (f2u(in[k]) & 0xffffu) == 0x8000u;
    /* a NaN must stay a NaN of the same sign; its payload is free */
    if (nan ? !((got & 0x7f80u) == 0x7f80u && (got & 0x7fu) && (got >> 15) == (want >> 15)) : got != want) {
      if (bad_fn++ < 4) printf("  muon__bf16(0x%08x) = 0x%04x, the definition 0x%04x\n", (unsigned)f2u(in[k]), got, want);
    }
    got = out[k];
    if (nan ? !((got & 0x7f80u) == 0x7f80u && (got & 0x7fu) && (got >> 15) == (want >> 15)) : got != want) {
      if (bad_cast++ < 4) printf("  cast(0x%08x) = 0x%04x, the definition 0x%04x\n", (unsigned)f2u(in[k]), got, want);
    }
  }
  printf("  %zu values, %zu exact ties, %zu NaNs\n", n, ties, nans);
  CHECK(bad_fn == 0, "muon__bf16 differs from round-to-nearest-even on %zu values", bad_fn);
  CHECK(bad_cast == 0, "the CPU cast slot differs from round-to-nearest-even on %zu values", bad_cast);
}

int main(void) {
  test_bf16_definition();
  test_bf16_grads();
  test_grad_scale();
  test_grad_scale_nonfinite();
  test_mirror_nearest();
  test_bf16_params();
  test_stochastic();
  test_strides();
  test_trainer_momentum();
  test_nonfinite_bf16();
  test_bad_dtypes();
  test_fault_backend();
  return test_summary();
}
