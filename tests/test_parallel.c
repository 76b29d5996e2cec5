/* test_parallel.c - the CPU backend's threads (muon_cpu_desc.threads) change no bit.

   One model - batches of same-shape matrices (packed and unpacked GEMM paths), a lone large
   square, a tall one, a Gram-NS batch of three, bf16 precision, a bf16 parameter with stochastic
   rounding, a large and a small AdamW parameter - takes three steps with 1 thread, then with
   2, 3 and 4 threads through muon's pool, a user parallel_for that runs the tasks backwards on
   the calling thread, and one that starts a POSIX thread per task. Parameters, momenta and AdamW
   moments must be bitwise those of the single-thread run. The built-in GEMM's row split is also
   checked alone against the unsplit GEMM, the Newton-Schulz balancer alone at 0, 1, 2, 3 and 5
   operands (CBLAS too), and bad thread counts are clear errors.
   Built also with ThreadSanitizer (test_parallel_tsan) and with MUON_NO_THREADS. */
#define _POSIX_C_SOURCE 200809L
#if defined(MUON_COVERAGE) && !defined(TEST_SMALL)   /* at -O0 the full model takes minutes: the small one, split alike */
#define TEST_SMALL
#endif
#ifdef TEST_SMALL      /* thresholds low enough to split the small shapes (no result depends on them) */
#ifndef MUON__SPLIT_MACS
#define MUON__SPLIT_MACS 1000.0
#endif
#ifndef MUON__SPLIT_ELEMENTS
#define MUON__SPLIT_ELEMENTS 256
#endif
#endif
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "test.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 3

typedef struct spec { const char *name; int rows, cols, count, group; muon_dtype dtype; } spec;
#ifdef TEST_SMALL   /* under ThreadSanitizer: small shapes, and thresholds low enough to split them */
static const spec specs[] = {
  {"qkv", 64, 96, 4, 0, MUON_DTYPE_FP32},
  {"proj", 96, 96, 1, 0, MUON_DTYPE_FP32},
  {"fc_down", 120, 48, 1, 1, MUON_DTYPE_FP32},
  {"gram", 24, 120, 3, 2, MUON_DTYPE_FP32},
  {"small", 8, 12, 5, 0, MUON_DTYPE_FP32},
  {"bf16", 50, 60, 1, 3, MUON_DTYPE_BF16},
};
static const size_t adamw_sizes[2] = {5003, 64};
#else
static const spec specs[] = {
  {"qkv", 256, 768, 4, 0, MUON_DTYPE_FP32},     /* a batch of 4 on the packed path           */
  {"proj", 384, 384, 1, 0, MUON_DTYPE_FP32},    /* alone: its GEMMs are split                */
  {"fc_down", 640, 200, 1, 1, MUON_DTYPE_FP32}, /* tall (transposed operand), bf16 NS, no syrk */
  {"gram", 120, 900, 3, 2, MUON_DTYPE_FP32},    /* Gram NS, a batch of 3: 2 side by side + 1  */
  {"small", 40, 72, 5, 0, MUON_DTYPE_FP32},     /* unpacked path                             */
  {"bf16", 300, 340, 1, 3, MUON_DTYPE_BF16},    /* bf16 weights, stochastic rounding, cautious */
};
static const size_t adamw_sizes[2] = {200003, 768};
#endif
#define N_SPECS 6

typedef struct state {
  float *param[N_SPECS], *grad[N_SPECS][STEPS], *momentum[N_SPECS];
  uint16_t *param16[N_SPECS];
  float *aparam[2], *agrad[2][STEPS];
  unsigned char *blob;             /* the state after the steps: AdamW moments, momenta */
  size_t blob_size;
} state;

static uint32_t rng(uint32_t *s) { *s = *s * 1664525u + 1013904223u; return *s >> 8; }
static float uniform(uint32_t *s) { return (float)rng(s) / 16777216.0f * 2.0f - 1.0f; }

static size_t spec_size(int i) { return (size_t)specs[i].rows * specs[i].cols * (size_t)specs[i].count; }

/* -------- the hooks: muon's pool is the default; these are the user's ----------------------- */
static int max_n_seen;

static void backwards(void *user, int n, muon_task_fn fn, void *arg) {
  int t;
  (void)user;
  if (n > max_n_seen) max_n_seen = n;
  for (t = n - 1; t >= 0; t--) fn(arg, t);
}

typedef struct one_task { muon_task_fn fn; void *arg; int t; } one_task;
static void *run_one(void *p) { one_task *o = (one_task *)p; o->fn(o->arg, o->t); return NULL; }

static void thread_per_task(void *user, int n, muon_task_fn fn, void *arg) {
  pthread_t th[64];
  one_task tasks[64];
  int t;
  (void)user;
  if (n > max_n_seen) max_n_seen = n;
  for (t = 1; t < n; t++) {
    tasks[t].fn = fn; tasks[t].arg = arg; tasks[t].t = t;
    if (pthread_create(&th[t], NULL, run_one, &tasks[t]) != 0) { run_one(&tasks[t]); th[t] = pthread_self(); }
  }
  fn(arg, 0);
  for (t = 1; t < n; t++) if (!pthread_equal(th[t], pthread_self())) pthread_join(th[t], NULL);
}

/* -------- one run ----------------------------------------------------------------------------- */
static void make_state(state *st) {
  st->blob = NULL;
  st->blob_size = 0;
  uint32_t s = 12345;
  int i, k;
  size_t e;
  for (i = 0; i < N_SPECS; i++) {
    size_t n = spec_size(i);
    st->param[i] = (float *)malloc(n * sizeof(float));
    st->param16[i] = (uint16_t *)malloc(n * sizeof(uint16_t));
    st->momentum[i] = (float *)malloc(n * sizeof(float));
    for (e = 0; e < n; e++) {
      float v = uniform(&s) * 0.05f;
      uint32_t bits;
      st->param[i][e] = v;
      memcpy(&bits, &v, 4);
      st->param16[i][e] = (uint16_t)(bits >> 16);
    }
    for (k = 0; k < STEPS; k++) {
      st->grad[i][k] = (float *)malloc(n * sizeof(float));
      for (e = 0; e < n; e++) st->grad[i][k][e] = uniform(&s) * (i == 1 ? 1e3f : 1.0f);
    }
  }
  for (i = 0; i < 2; i++) {
    st->aparam[i] = (float *)malloc(adamw_sizes[i] * sizeof(float));
    for (e = 0; e < adamw_sizes[i]; e++) st->aparam[i][e] = uniform(&s);
    for (k = 0; k < STEPS; k++) {
      st->agrad[i][k] = (float *)malloc(adamw_sizes[i] * sizeof(float));
      for (e = 0; e < adamw_sizes[i]; e++) st->agrad[i][k][e] = uniform(&s) * 0.1f;
    }
  }
}

static void free_state(state *st) {
  int i, k;
  for (i = 0; i < N_SPECS; i++) {
    free(st->param[i]); free(st->param16[i]); free(st->momentum[i]);
    for (k = 0; k < STEPS; k++) free(st->grad[i][k]);
  }
  free(st->blob);
  for (i = 0; i < 2; i++) {
    free(st->aparam[i]);
    for (k = 0; k < STEPS; k++) free(st->agrad[i][k]);
  }
}

/* Three steps of the model in st with the given threads; st's buffers get the results. */
static int run(state *st, muon_threads threads, const char *what) {
  muon_desc d = muon_default_desc();
  muon_cpu_desc cd = muon_cpu_default_desc();
  muon_compute cpu;
  muon_optimizer *opt = NULL;
  muon_hparams hp[4];
  int i, k, idx[N_SPECS], aidx[2], ok = 1;
  muon_status s;
  d.hparams.lr = 0.02f;
  d.rounding = MUON_ROUND_STOCHASTIC;
  d.seed = 7;
  cd.threads = threads;
  if ((s = muon_cpu_create(&cpu, &cd)) != MUON_OK) {
    CHECK(0, "%s: muon_cpu_create: %s", what, muon_error(NULL));
    return 0;
  }
  d.compute = &cpu;
  if ((s = muon_create(&opt, &d)) != MUON_OK) {
    CHECK(0, "%s: muon_create: %s", what, muon_error(NULL));
    muon_compute_destroy(&cpu);
    return 0;
  }
  for (i = 0; i < 4; i++) hp[i] = d.hparams;
  hp[1].precision = MUON_PRECISION_BF16;
  hp[1].symmetric = 0;
  hp[2].ns_algorithm = MUON_NS_GRAM;
  hp[3].cautious_wd = 1;
  for (i = 1; i < 4; i++) CHECK(muon_add_group(opt, &hp[i], NULL) == MUON_OK, "%s: group %d: %s", what, i, muon_error(opt));
  for (i = 0; i < N_SPECS; i++) {
    muon_matrix m = muon_default_matrix();
    m.name = specs[i].name;
    m.param = specs[i].dtype == MUON_DTYPE_BF16 ? (void *)st->param16[i] : (void *)st->param[i];
    m.param_dtype = specs[i].dtype;
    m.grad = st->grad[i][0];
    m.rows = specs[i].rows;
    m.cols = specs[i].cols;
    m.count = specs[i].count;
    m.group = specs[i].group;
    CHECK(muon_add_matrix(opt, &m, &idx[i]) == MUON_OK, "%s: matrix %s: %s", what, m.name, muon_error(opt));
  }
  for (i = 0; i < 2; i++) {
    muon_adamw_param p = muon_default_adamw_param();
    p.name = i ? "ln" : "emb";
    p.param = st->aparam[i];
    p.grad = st->agrad[i][0];
    p.size = adamw_sizes[i];
    CHECK(muon_add_adamw_param(opt, &p, &aidx[i]) == MUON_OK, "%s: AdamW %s: %s", what, p.name, muon_error(opt));
  }
  for (k = 0; k < STEPS && ok; k++) {
    for (i = 0; i < N_SPECS; i++) muon_set_grad(opt, idx[i], st->grad[i][k]);
    for (i = 0; i < 2; i++) muon_set_adamw_grad(opt, aidx[i], st->agrad[i][k]);
    s = muon_step(opt);
    CHECK(s == MUON_OK, "%s: step %d: %s", what, k, muon_error(opt));
    ok = s == MUON_OK;
  }
  for (i = 0; i < N_SPECS && ok; i++) {   /* a stack of `count` is that many matrices */
    size_t one = (size_t)specs[i].rows * specs[i].cols, n = 0;
    const float *b = NULL;
    for (k = 0; k < specs[i].count; k++) {
      CHECK(muon_get_momentum(opt, idx[i] + k, &b, &n) == MUON_OK && n == one, "%s: momentum of %s[%d]", what, specs[i].name, k);
      if (n == one) memcpy(st->momentum[i] + k * one, b, one * sizeof(float));
    }
  }
  st->blob = NULL;
  if (ok) {   /* the AdamW moments, from the state blob (their only way out) */
    st->blob_size = muon_state_size(opt);
    st->blob = (unsigned char *)malloc(st->blob_size);
    CHECK(muon_state_save(opt, st->blob, st->blob_size) == MUON_OK, "%s: save", what);
  }
  muon_destroy(opt);
  muon_compute_destroy(&cpu);
  return ok;
}

static int same(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

static void compare(const state *ref, const state *got, const char *what) {
  int i;
  for (i = 0; i < N_SPECS; i++) {
    size_t n = spec_size(i);
    if (specs[i].dtype == MUON_DTYPE_BF16) CHECK(same(ref->param16[i], got->param16[i], n * 2), "%s: %s params differ", what, specs[i].name);
    else CHECK(same(ref->param[i], got->param[i], n * 4), "%s: %s params differ", what, specs[i].name);
    CHECK(same(ref->momentum[i], got->momentum[i], n * 4), "%s: %s momentum differs", what, specs[i].name);
  }
  for (i = 0; i < 2; i++) CHECK(same(ref->aparam[i], got->aparam[i], adamw_sizes[i] * 4), "%s: AdamW param %d differs", what, i);
  CHECK(ref->blob_size == got->blob_size && same(ref->blob, got->blob, ref->blob_size),
        "%s: the state blobs (AdamW moments, momenta) differ", what);
}

/* -------- the GEMM row split alone ---------------------------------------------------------- */
static void gemm_split_case(int transb, int lower, int M, int N, int K, int packed, int threads) {
  muon__cpu cpu;
  muon__gemm_ctx g;
  size_t pf = packed ? (size_t)MUON__GEMM_PACK_FLOATS : 0;
  float *A = (float *)malloc((size_t)M * (K > 0 ? K : 1) * sizeof(float));
  float *B = (float *)malloc((size_t)(transb ? N : (K > 0 ? K : 1)) * (transb ? (K > 0 ? K : 1) : N) * sizeof(float));
  float *C0 = (float *)malloc((size_t)M * N * sizeof(float)), *C1 = (float *)malloc((size_t)M * N * sizeof(float));
  float *packs = (float *)malloc((pf ? pf : 1) * (size_t)threads * sizeof(float));
  uint32_t s = 99;
  size_t e;
  int tasks;
  for (e = 0; e < (size_t)M * (K > 0 ? K : 1); e++) A[e] = uniform(&s);
  for (e = 0; e < (size_t)N * (K > 0 ? K : 1); e++) B[e] = uniform(&s);
  for (e = 0; e < (size_t)M * N; e++) C0[e] = C1[e] = uniform(&s);
  memset(&cpu, 0, sizeof cpu);
  cpu.threads = threads;
  cpu.parallel_for = threads == 3 ? backwards : thread_per_task;   /* real threads: a shared pack would race */
  g.cblas = 0;
  g.symmetric = lower;
  g.pack = packed ? packs : NULL;
  g.pack_floats = pf;
  g.cpu = &cpu;
  g.packs = packs + pf;
  tasks = muon__gemm_tasks(&g, M, N, K);
  if (lower) {
    muon__ssyrk(M, K, 0.5f, A, K, 0.25f, C0, N, g.pack, pf);
    muon__gram(&g, M, K, 0.5f, A, K, 0.25f, C1, N);
  } else if (transb) {
    muon__sgemm(1, M, N, K, 0.5f, A, K, B, K, 0.25f, C0, N, g.pack, pf);
    g.symmetric = 0;
    muon__gemm_split(&g, 1, 0, M, N, K, 0.5f, A, K, B, K, 0.25f, C1, N);
  } else {
    muon__sgemm(0, M, N, K, 0.5f, A, K, B, N, 0.25f, C0, N, g.pack, pf);
    muon__matmul(&g, M, N, K, 0.5f, A, K, B, N, 0.25f, C1, N);
  }
  CHECK(tasks == ((double)M * N * K < MUON__SPLIT_MACS ? 1 : M / (4 * MUON__MR) < threads ? (M / (4 * MUON__MR) > 1 ? M / (4 * MUON__MR) : 1) : threads),
        "%dx%dx%d on %d threads: split in %d", M, N, K, threads, tasks);
  CHECK(same(C0, C1, (size_t)M * N * 4), "GEMM %s%s %dx%dx%d %s, %d threads (%d tasks): the split differs from the whole",
        transb ? "NT" : "NN", lower ? " lower" : "", M, N, K, packed ? "packed" : "unpacked", threads, tasks);
  free(A); free(B); free(C0); free(C1); free(packs);
}

/* The Newton-Schulz balancer on T threads (muon__cpu_newton_schulz: whole rounds of T side by side,
   then the rest with split GEMMs; muon__cpu_newton_schulz_many: CBLAS operands balanced by cost,
   built-in ones batch by batch): 0, 1, 2, 3 and 5 operands, bitwise as on one thread. A lone
   CBLAS operand on several threads, a batch one short of or one past a round, are edges an off
   by one in either split would get wrong (an operand run twice, skipped, or in a shared
   workspace). */
static const int bal_shape[5][2] = {{24, 40}, {24, 40}, {16, 16}, {8, 60}, {32, 48}};
static void bal_fill(float *X, size_t n, uint32_t seed) {
  size_t e;
  for (e = 0; e < n; e++) X[e] = uniform(&seed);
}
/* out[i] after newton_schulz_many (many: shapes bal_shape) or newton_schulz of a batch of
   `count` 24 x 40, on T threads. */
static int bal_run(int many, int count, int T, void (*hook)(void *, int, muon_task_fn, void *), float **out) {
  muon_cpu_desc cd = muon_cpu_default_desc();
  muon_compute c;
  muon_hparams hp[5];
  const muon_hparams *hpp[5];
  float *X[5], *batch;
  int m[5], n[5], i, ok;
  size_t ws = 1;
  void *w;
  cd.threads.count = T;
  cd.threads.parallel_for = hook;
  if (muon_cpu_create(&c, &cd) != MUON_OK) return 0;
  batch = (float *)malloc((size_t)5 * 24 * 40 * sizeof(float));
  for (i = 0; i < 5; i++) {
    hp[i] = muon_default_hparams();
    if (i == 3) hp[i].ns_algorithm = MUON_NS_GRAM;
    m[i] = many ? bal_shape[i][0] : 24;
    n[i] = many ? bal_shape[i][1] : 40;
    X[i] = many && i > 1 ? out[i] : batch + (size_t)i * 24 * 40;   /* many: 0 and 1 one batch */
    bal_fill(X[i], (size_t)m[i] * n[i], 100u + (unsigned)i);
    hpp[i] = i == 1 ? &hp[0] : &hp[i];
    if (c.vt->ns_workspace(c.ctx, count, m[i], n[i], &hp[i]) > ws)
      ws = c.vt->ns_workspace(c.ctx, count, m[i], n[i], &hp[i]);
  }
  w = malloc(ws);
  ok = (many ? c.vt->newton_schulz_many(c.ctx, count, X, m, n, hpp, w)
             : c.vt->newton_schulz(c.ctx, batch, count, 24, 40, &hp[0], w)) == MUON_OK;
  for (i = 0; i < 5; i++) if (X[i] != out[i]) memcpy(out[i], X[i], (size_t)m[i] * n[i] * sizeof(float));
  free(w);
  free(batch);
  muon_compute_destroy(&c);
  return ok;
}
static void balancer_case(void) {
  static const int counts[] = {0, 1, 2, 3, 5};
  float *ref[5], *got[5];
  int many, ci, T, hook, i;
  for (i = 0; i < 5; i++) {
    ref[i] = (float *)malloc((size_t)32 * 60 * sizeof(float));
    got[i] = (float *)malloc((size_t)32 * 60 * sizeof(float));
  }
  for (many = 0; many < 2; many++)
    for (ci = 0; ci < 5; ci++) {
      int count = counts[ci];
      CHECK(bal_run(many, count, 1, NULL, ref), "%s of %d on one thread",
            many ? "newton_schulz_many" : "newton_schulz", count);
      for (T = 2; T <= 5; T++)
        for (hook = 0; hook < 2; hook++) {
#ifdef MUON_NO_THREADS
          if (!hook) continue;   /* no pool: only a user's parallel_for gives threads */
#endif
          CHECK(bal_run(many, count, T, hook ? thread_per_task : NULL, got), "%d threads", T);
          for (i = 0; i < 5; i++) {
            size_t e = many ? (size_t)bal_shape[i][0] * bal_shape[i][1] : (size_t)24 * 40;
            CHECK(same(ref[i], got[i], e * sizeof(float)),
                  "%s of %d operands on %d threads (%s): operand %d differs from one thread",
                  many ? "newton_schulz_many" : "newton_schulz", count, T,
                  hook ? "a thread per task" : "muon's pool", i);
          }
        }
    }
  for (i = 0; i < 5; i++) { free(ref[i]); free(got[i]); }
}

int main(void) {
  state ref, got;
  muon_threads one;
  char what[96];
  int T, hook;
  memset(&one, 0, sizeof one);
  one.count = 1;
  unsetenv("MUON_THREADS");

  TEST_CASE("the GEMM row split: every element as in the unsplit GEMM");
  {
#ifdef TEST_SMALL
    static const int shapes[][3] = {{64, 30, 10}, {97, 25, 13}, {72, 100, 9}, {150, 40, 30}, {100, 6, 12}};
#else
    static const int shapes[][3] = {{200, 300, 100}, {385, 257, 130}, {96, 1000, 97}, {257, 400, 300}, {500, 64, 129}};
#endif
    int i, th;
    for (i = 0; i < 5; i++)
      for (th = 2; th <= 4; th++) {
        gemm_split_case(0, 0, shapes[i][0], shapes[i][1], shapes[i][2], i != 2, th);
        gemm_split_case(1, 0, shapes[i][0], shapes[i][1], shapes[i][2], i != 4, th);
        gemm_split_case(1, 1, shapes[i][0], shapes[i][0], shapes[i][2], i % 2, th);
      }
  }

  TEST_CASE("the Newton-Schulz balancer: 0, 1, 2, 3 and 5 operands, one shape or several, on 2-5 threads: "
            "bitwise one thread");
  balancer_case();

  make_state(&ref);
  run(&ref, one, "1 thread");
#ifndef MUON_NO_THREADS
  for (T = 2; T <= 4; T++) {
    muon_threads t;
    memset(&t, 0, sizeof t);
    t.count = T;
    snprintf(what, sizeof what, "muon's pool, %d threads", T);
    TEST_CASE(what);
    make_state(&got);
    if (run(&got, t, what)) compare(&ref, &got, what);
    free_state(&got);
  }
#endif
  for (hook = 0; hook < 2; hook++)
    for (T = 2; T <= 4; T += 2) {
      muon_threads t;
      memset(&t, 0, sizeof t);
      t.count = T;
      t.parallel_for = hook ? thread_per_task : backwards;
      snprintf(what, sizeof what, "a user parallel_for (%s), %d threads", hook ? "a POSIX thread per task" : "backwards, one thread", T);
      TEST_CASE(what);
      max_n_seen = 0;
      make_state(&got);
      if (run(&got, t, what)) compare(&ref, &got, what);
      CHECK(max_n_seen == T, "the hook saw at most %d tasks at once, not the %d allowed (or more)", max_n_seen, T);
      free_state(&got);
    }

  TEST_CASE("thread counts: bad ones are MUON_ERR_ARG naming the field or the variable; MUON_THREADS is read by muon_cpu_create and by muon_create's own CPU backend");
  {
    muon_desc d = muon_default_desc();
    muon_cpu_desc cd = muon_cpu_default_desc();
    muon_compute c;
    muon_optimizer *opt = NULL;
    muon_status s;
    cd.threads.count = -1;
    s = muon_cpu_create(&c, &cd);
    CHECK(s == MUON_ERR_ARG && !c.vt && strstr(muon_error(NULL), "muon_cpu_desc.threads.count"), "count -1: %s", muon_error(NULL));
    cd.threads.count = 5000;
    s = muon_cpu_create(&c, &cd);
    CHECK(s == MUON_ERR_ARG && strstr(muon_error(NULL), "5000"), "count 5000: %s", muon_error(NULL));
    cd.threads.count = 0;
    setenv("MUON_THREADS", "two", 1);
    s = muon_cpu_create(&c, &cd);
    CHECK(s == MUON_ERR_ARG && strstr(muon_error(NULL), "MUON_THREADS='two'"), "MUON_THREADS=two: %s", muon_error(NULL));
    s = muon_create(&opt, &d);
    CHECK(s == MUON_ERR_ARG && !opt && strstr(muon_error(NULL), "MUON_THREADS='two'"), "muon_create, MUON_THREADS=two: %s", muon_error(NULL));
    setenv("MUON_THREADS", "3", 1);
    cd.threads.parallel_for = backwards;
    s = muon_cpu_create(&c, &cd);
    CHECK(s == MUON_OK && muon__cpu_threads(c.ctx) == 3, "MUON_THREADS=3: %s", muon_error(NULL));
    muon_compute_destroy(&c);
    s = muon_create(&opt, &d);
#ifdef MUON_NO_THREADS
    CHECK(s == MUON_ERR_ARG && strstr(muon_error(NULL), "no thread pool"), "muon_create, MUON_THREADS=3, no pool in this build: %s", muon_error(NULL));
#else
    CHECK(s == MUON_OK && opt && opt->cpu.threads == 3 && opt->cpu.pool, "muon_create, MUON_THREADS=3: %s", muon_error(NULL));
#endif
    muon_destroy(opt);
    opt = NULL;
    unsetenv("MUON_THREADS");
    cd.threads.parallel_for = NULL;
    cd.threads.count = 2;
    s = muon_cpu_create(&c, &cd);
#ifdef MUON_NO_THREADS
    CHECK(s == MUON_ERR_ARG && strstr(muon_error(NULL), "no thread pool"), "no pool in this build: %s", muon_error(NULL));
#else
    CHECK(s == MUON_OK && ((const muon__cpu *)c.ctx)->pool, "2 threads: %s", muon_error(NULL));
#endif
    muon_compute_destroy(&c);
  }
#ifndef MUON_NO_THREADS
  TEST_CASE("muon_cpu_create with a pool of 3 threads, and muon_create with MUON_THREADS=3, each allocation failing in turn: MUON_ERR_NOMEM naming it, nothing leaked");
  {
    int k, sites = 0, way;
    for (way = 0; way < 2; way++) {
      if (way) setenv("MUON_THREADS", "3", 1);
      for (k = 0, sites = 0; k < 64; k++) {
        fail_alloc fa = { 0, 0, 0 };
        muon_desc d = muon_default_desc();
        muon_cpu_desc cd = muon_cpu_default_desc();
        muon_allocator a;
        muon_compute c;
        muon_optimizer *opt = NULL;
        muon_status s;
        fa.fail_at = k;
        a.alloc = fa_alloc;
        a.free = fa_free;
        a.user_data = &fa;
        cd.allocator = a;
        cd.threads.count = 3;
        d.allocator = a;
        s = way ? muon_create(&opt, &d) : muon_cpu_create(&c, &cd);
        if (s == MUON_OK) {
          if (way) muon_destroy(opt); else muon_compute_destroy(&c);
          CHECK(fa.live == 0, "%ld blocks leaked by destroy", fa.live);
          break;
        }
        sites++;
        CHECK(s == MUON_ERR_NOMEM && !opt && strstr(muon_error(NULL), "allocating"), "site %d: %s: %s", k, muon_status_string(s), muon_error(NULL));
        CHECK(fa.live == 0, "site %d: %ld blocks leaked", k, fa.live);
      }
      CHECK(sites >= (way ? 4 : 3), "only %d allocation sites", sites);
    }
    unsetenv("MUON_THREADS");
  }
#endif
  free_state(&ref);
  return test_summary();
}
