/* test_api.c - the public API on one device: bad input, allocation failure, non-finite
   gradients, state save/load, skipped matrices, determinism, the empty optimizer. */
#define MUON_TEST_SAVE_FAULT   /* muon__save_fault_at: fail the nth file operation of a save */
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "test.h"
#include "settings.h"
#include "cautious.h"

#include <stdlib.h>
#if defined(__unix__) || defined(__APPLE__)
#include <dirent.h>
#endif

/* ---- helpers ------------------------------------------------------------------------------ */
static unsigned test_rng = 12345u;
static float frand(void) {
  test_rng = test_rng * 1664525u + 1013904223u;
  return (float)((test_rng >> 8) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}
static void fill(float *x, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) x[i] = frand();
}

static char last_log[600];
static void capture_log(muon_log_level level, const char *msg, void *user) {
  (void)level; (void)user;
  strncpy(last_log, msg, sizeof last_log - 1);
}

static void capture_warn(muon_log_level level, const char *msg, void *user) {
  if (level <= MUON_LOG_WARN) capture_log(level, msg, user);
}


/* A small model: two matrices (one stacked pair), one tall, and two AdamW params. */
typedef struct {
  float w1[2 * 24 * 40], g1[2 * 24 * 40];
  float w2[50 * 16], g2[50 * 16];
  float b[24], gb[24];
  float e[10], ge[10];
} model;

static void model_init(model *m, unsigned seed) {
  test_rng = seed;
  fill(m->w1, sizeof m->w1 / 4); fill(m->w2, sizeof m->w2 / 4);
  fill(m->b, 24); fill(m->e, 10);
}
static void model_grads(model *m, unsigned seed) {
  test_rng = seed;
  fill(m->g1, sizeof m->g1 / 4); fill(m->g2, sizeof m->g2 / 4);
  fill(m->gb, 24); fill(m->ge, 10);
}

static muon_status model_register(muon_optimizer *opt, model *m) {
  muon_matrix a = muon_default_matrix(), b = muon_default_matrix();
  muon_adamw_param p = muon_default_adamw_param(), q = muon_default_adamw_param();
  muon_status st;
  a.name = "w1"; a.param = m->w1; a.grad = m->g1; a.rows = 24; a.cols = 40; a.count = 2;
  b.name = "w2"; b.param = m->w2; b.grad = m->g2; b.rows = 50; b.cols = 16;
  p.name = "b"; p.param = m->b; p.grad = m->gb; p.size = 24;
  q.name = "e"; q.param = m->e; q.grad = m->ge; q.size = 10;
  if ((st = muon_add_matrix(opt, &a, NULL)) != MUON_OK) return st;
  if ((st = muon_add_matrix(opt, &b, NULL)) != MUON_OK) return st;
  if ((st = muon_add_adamw_param(opt, &p, NULL)) != MUON_OK) return st;
  return muon_add_adamw_param(opt, &q, NULL);
}

static muon_optimizer *make_opt(model *m, muon_desc *d) {
  muon_optimizer *opt = NULL;
  muon_desc def = muon_default_desc();
  if (!d) d = &def;
  if (muon_create(&opt, d) != MUON_OK) return NULL;
  if (model_register(opt, m) != MUON_OK) { muon_destroy(opt); return NULL; }
  return opt;
}

static int same(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* ---- cases -------------------------------------------------------------------------------- */
static void test_defaults(void) {
  muon_hparams hp = muon_default_hparams();
  muon_adamw_hparams ah = muon_default_adamw_hparams();
  TEST_CASE("defaults are torch.optim.Muon's and torch.optim.AdamW's");
  CHECK(hp.lr == 1e-3f && hp.weight_decay == 0.1f && hp.momentum == 0.95f && hp.nesterov == 1, "muon lr/wd/momentum/nesterov");
  CHECK(hp.ns_steps == 5 && hp.ns_coefficients[0][0] == 3.4445f && hp.ns_coefficients[4][1] == -4.7750f &&
        hp.ns_coefficients[2][2] == 2.0315f && hp.eps == 1e-7f, "ns defaults");
  CHECK(hp.adjust_lr == MUON_ADJUST_LR_ORIGINAL && hp.momentum_style == MUON_MOMENTUM_LERP &&
        hp.precision == MUON_PRECISION_FP32, "enums");
  CHECK(ah.lr == 1e-3f && ah.beta1 == 0.9f && ah.beta2 == 0.999f && ah.eps == 1e-8f && ah.weight_decay == 0.01f, "adamw");
  CHECK(strcmp(muon_status_string(MUON_ERR_SHAPE), "MUON_ERR_SHAPE: invalid shape") == 0, "status string: %s", muon_status_string(MUON_ERR_SHAPE));
  CHECK(strcmp(muon_status_string((muon_status)99), "unknown muon_status") == 0, "unknown status");
}

static muon_status half_gather(void *state, const muon_matrix_info *m, const float *local, float *full, int owner) {
  (void)state; (void)m; (void)local; (void)full; (void)owner;
  return MUON_OK;
}

static void test_bad_desc(void) {
  struct { const char *what; int field; float value; const char *needle; } cases[] = {
    { "negative lr", 0, -1e-3f, "lr" },
    { "NaN lr", 0, NAN, "lr" },
    { "negative weight decay", 1, -0.1f, "weight_decay" },
    { "momentum 1", 2, 1.0f, "momentum" },
    { "momentum -0.1", 2, -0.1f, "momentum" },
    { "ns_steps 0", 3, 0, "ns_steps" },
    { "ns_steps too many", 3, MUON_NS_MAX_STEPS + 1, "ns_steps" },
    { "infinite coefficient", 4, INFINITY, "ns_coefficients" },
    { "eps 0", 5, 0, "eps" },
    { "adamw beta1 1", 6, 1.0f, "beta1" },
    { "adamw negative lr", 7, -1.0f, "lr" },
  };
  size_t i;
  for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    muon_desc d = muon_default_desc();
    muon_optimizer *opt = (muon_optimizer *)&d; /* must be overwritten with NULL */
    muon_status st;
    char name[100];
    snprintf(name, sizeof name, "bad hyperparameter: %s", cases[i].what);
    TEST_CASE(name);
    d.logger.func = capture_log;
    last_log[0] = 0;
    switch (cases[i].field) {
    case 0: d.hparams.lr = cases[i].value; break;
    case 1: d.hparams.weight_decay = cases[i].value; break;
    case 2: d.hparams.momentum = cases[i].value; break;
    case 3: d.hparams.ns_steps = (int)cases[i].value; break;
    case 4: d.hparams.ns_coefficients[1][2] = cases[i].value; break;
    case 5: d.hparams.eps = cases[i].value; break;
    case 6: d.adamw.beta1 = cases[i].value; break;
    default: d.adamw.lr = cases[i].value; break;
    }
    st = muon_create(&opt, &d);
    CHECK(st == MUON_ERR_ARG, "status %s", muon_status_string(st));
    CHECK(opt == NULL, "opt not NULL on failure");
    CHECK(strstr(last_log, cases[i].needle) != NULL, "message '%s' does not name '%s'", last_log, cases[i].needle);
  }
  {
    muon_desc d = muon_default_desc();
    muon_optimizer *opt;
    TEST_CASE("bad desc: NULL pointers, half an allocator, unknown enum");
    CHECK(muon_create(NULL, &d) == MUON_ERR_ARG, "NULL opt");
    CHECK(muon_create(&opt, NULL) == MUON_ERR_ARG && opt == NULL, "NULL desc");
    d.allocator.alloc = fa_alloc;
    CHECK(muon_create(&opt, &d) == MUON_ERR_ARG, "alloc without free");
    d = muon_default_desc();
    d.hparams.adjust_lr = (muon_adjust_lr)7;
    CHECK(muon_create(&opt, &d) == MUON_ERR_ARG, "adjust_lr 7");
    d = muon_default_desc();
    d.hparams.precision = (muon_precision)5;
    CHECK(muon_create(&opt, &d) == MUON_ERR_ARG, "precision 5");
    d = muon_default_desc();
    d.on_nonfinite = (muon_nonfinite)3;
    CHECK(muon_create(&opt, &d) == MUON_ERR_ARG, "on_nonfinite 3");
    d = muon_default_desc();
    d.rounding = (muon_rounding)9;
    d.logger.func = capture_log;
    CHECK(muon_create(&opt, &d) == MUON_ERR_ARG && strstr(last_log, "rounding"), "rounding 9: %s", last_log);
    d = muon_default_desc();
    d.state_on_host = 2;
    d.logger.func = capture_log;
    CHECK(muon_create(&opt, &d) == MUON_ERR_ARG && strstr(last_log, "muon_desc.state_on_host"), "state_on_host 2: %s",
          last_log);
    d.state_on_host = 1;   /* the CPU backend's state is host memory already: accepted, no effect */
    CHECK(muon_create(&opt, &d) == MUON_OK, "state_on_host 1 on the CPU backend: %s", muon_error(opt));
    muon_destroy(opt);
    opt = NULL;
    {
      muon_dist_config half = muon_layout_config();
      half.gather = half_gather;
      d = muon_default_desc();
      d.dist = &half;
      d.logger.func = capture_log;
      CHECK(muon_create(&opt, &d) == MUON_ERR_ARG && strstr(last_log, "redistribute"), "gather without redistribute: %s", last_log);
    }
  }
}

static void test_bad_matrix(void) {
  static float w[64 * 64], g[64 * 64];
  muon_optimizer *opt;
  muon_desc d = muon_default_desc();
  muon_matrix m;
  muon_adamw_param p;
  muon_hparams hp = muon_default_hparams();
  TEST_CASE("bad matrices and AdamW params get a clear error and change nothing");
  CHECK(muon_create(&opt, &d) == MUON_OK, "create");
  CHECK(muon_add_matrix(opt, NULL, NULL) == MUON_ERR_ARG, "NULL matrix");
  m = muon_default_matrix(); m.name = "fc1"; m.param = w; m.grad = g; m.rows = 0; m.cols = 8;
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_ERR_SHAPE && strstr(muon_error(opt), "rows") && strstr(muon_error(opt), "fc1"), "rows 0: %s", muon_error(opt));
  m.rows = 8; m.cols = -3;
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_ERR_SHAPE, "cols -3");
  m.cols = 8; m.ndim = 1;
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_ERR_SHAPE && strstr(muon_error(opt), "ndim") && strstr(muon_error(opt), "muon_add_adamw_param"), "ndim 1: %s", muon_error(opt));
  m.ndim = 3;
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_ERR_SHAPE, "ndim 3");
  m.ndim = 0; m.param = NULL;
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_ERR_ARG && strstr(muon_error(opt), "param"), "NULL param: %s", muon_error(opt));
  m.param = w; m.count = 3; m.stride = 63;
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_ERR_SHAPE && strstr(muon_error(opt), "overlap"), "overlapping stride: %s", muon_error(opt));
  m.count = -1; m.stride = 0;
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_ERR_SHAPE, "count -1");
  m.count = 2000000000; m.rows = m.cols = 65536;   /* 2e9 slices of 2^32 floats: past the address space */
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_ERR_SHAPE && strstr(muon_error(opt), "too large"), "count 2e9: %s", muon_error(opt));
  m.count = 3; m.rows = m.cols = 8; m.grad_stride = 10;
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_ERR_SHAPE && strstr(muon_error(opt), "grad 10"), "overlapping grad stride: %s", muon_error(opt));
  m.grad_stride = 0;
  m.count = 0; m.group = 1;
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_ERR_ARG && strstr(muon_error(opt), "group"), "group 1 missing: %s", muon_error(opt));
  CHECK(muon_matrix_count(opt) == 0, "no matrix was added");
  p = muon_default_adamw_param(); p.param = w; p.grad = g; p.size = 0;
  CHECK(muon_add_adamw_param(opt, &p, NULL) == MUON_ERR_SHAPE, "adamw size 0");
  p.size = 3; p.param = NULL;
  CHECK(muon_add_adamw_param(opt, &p, NULL) == MUON_ERR_ARG, "adamw NULL param");
  p.param = w; p.group = 2;
  CHECK(muon_add_adamw_param(opt, &p, NULL) == MUON_ERR_ARG, "adamw group 2");
  CHECK(muon_adamw_param_count(opt) == 0, "no AdamW param was added");
  hp.momentum = 1.5f;
  CHECK(muon_add_group(opt, &hp, NULL) == MUON_ERR_ARG && strstr(muon_error(opt), "momentum"), "add_group momentum 1.5");
  CHECK(muon_set_group(opt, 0, &hp) == MUON_ERR_ARG, "set_group momentum 1.5");
  CHECK(muon_set_lr(opt, 0, -1.0f) == MUON_ERR_ARG, "set_lr -1");
  CHECK(muon_set_lr(opt, 5, 1.0f) == MUON_ERR_ARG, "set_lr group 5");
  CHECK(muon_set_grad(opt, 0, g) == MUON_ERR_ARG, "set_grad of a missing matrix");
  CHECK(muon_step(NULL) == MUON_ERR_ARG, "step NULL");
  {
    const float *buf = w;
    size_t n = 5;
    muon_stats st;
    memset(&st, 0xff, sizeof st);
    CHECK(muon_get_momentum(opt, 7, &buf, &n) == MUON_ERR_ARG && !buf && !n, "get_momentum of a missing matrix zeroes its outputs");
    CHECK(muon_get_stats(NULL, &st) == MUON_ERR_ARG && st.steps == 0 && st.rounds == 0, "get_stats(NULL) zeroes its output");
  }
  CHECK(muon_newton_schulz(NULL, 2, 2, w, &hp) == MUON_ERR_ARG, "ns NULL in");
  hp = muon_default_hparams();
  CHECK(muon_newton_schulz(w, 0, 2, w, &hp) == MUON_ERR_SHAPE, "ns rows 0");
  muon_destroy(opt);
  muon_destroy(NULL);
}

/* muon_auto_config's layouts, level by level: TP along the dim asked for (per matrix), replicas
   first, FSDP last, experts and stages keyed apart. */
static void test_auto_layouts(void) {
  muon_comm g = muon_comm_self();
  int tp_dims[4] = { 0, 1, -1, 1 }, experts[4] = { -1, -1, -1, 2 }, i;
  muon_auto_desc ad;
  muon_dist_config c;
  muon_layout l;
  TEST_CASE("muon_auto_config: each matrix's levels follow tp_dim_per_matrix, experts and FSDP");
  memset(&ad, 0, sizeof ad);
  ad.ddp = &g; ad.tp = &g; ad.fsdp = &g; ad.ep = &g;
  ad.tp_dim_per_matrix = tp_dims; ad.expert_of_matrix = experts;
  c = muon_auto_config(&ad);
  for (i = 0; i < 4; i++) {
    int tp = experts[i] < 0 ? 2 : 1;   /* ddp, ep replica (dense only), tp, fsdp */
    CHECK(c.layout(c.state, i, NULL, &l) == MUON_OK, "layout %d", i);
    CHECK(l.n_levels == tp + 2, "matrix %d: %d levels", i, l.n_levels);
    CHECK(l.levels[0].placement == MUON_REPLICATE, "matrix %d: ddp first", i);
    if (tp_dims[i] < 0) CHECK(l.levels[tp].placement == MUON_REPLICATE, "matrix %d: tp replicated", i);
    else CHECK(l.levels[tp].placement == MUON_SHARD && l.levels[tp].dim == tp_dims[i], "matrix %d: tp level %d dim %d, want shard dim %d", i, (int)l.levels[tp].placement, l.levels[tp].dim, tp_dims[i]);
    CHECK(l.levels[tp + 1].placement == MUON_SHARD && l.levels[tp + 1].dim == 0, "matrix %d: fsdp shards rows", i);
    CHECK(l.key == (experts[i] < 0 ? 0 : experts[i] + 1), "matrix %d: key %lld", i, l.key);
  }
  ad.tp_dim_per_matrix = NULL; ad.tp_dim = 1; ad.fsdp_flat = 1;
  CHECK(c.layout(c.state, 0, NULL, &l) == MUON_OK && l.levels[2].placement == MUON_SHARD && l.levels[2].dim == 1 &&
        l.levels[3].placement == MUON_FLAT, "tp_dim 1 for all, flat fsdp");
}

static void test_empty(void) {
  muon_optimizer *opt;
  muon_desc d = muon_default_desc();
  muon_stats s;
  TEST_CASE("an optimizer with no parameters steps without error");
  CHECK(muon_create(&opt, &d) == MUON_OK, "create");
  CHECK(muon_step(opt) == MUON_OK && muon_step(opt) == MUON_OK, "step: %s", muon_error(opt));
  CHECK(muon_get_stats(opt, &s) == MUON_OK && s.steps == 2 && s.ns_calls == 0, "stats");
  muon_destroy(opt);
}

static void test_nonfinite(void) {
  static model m, before;
  muon_optimizer *opt;
  muon_desc d = muon_default_desc();
  const float *mom;
  size_t n;
  TEST_CASE("a NaN gradient is MUON_ERR_NONFINITE and nothing is applied");
  model_init(&m, 1);
  opt = make_opt(&m, NULL);
  CHECK(opt != NULL, "create");
  if (!opt) return;
  model_grads(&m, 2);
  CHECK(muon_step(opt) == MUON_OK, "first step");
  model_grads(&m, 3);
  m.g2[17] = NAN;
  before = m;
  CHECK(muon_step(opt) == MUON_ERR_NONFINITE, "status");
  CHECK(strstr(muon_error(opt), "w2") != NULL, "message names the matrix: %s", muon_error(opt));
  CHECK(same(&m, &before, sizeof m), "params changed");
  muon_destroy(opt);

  TEST_CASE("MUON_NONFINITE_SKIP skips only that matrix or param");
  d.on_nonfinite = MUON_NONFINITE_SKIP;
  model_init(&m, 1);
  opt = make_opt(&m, &d);
  if (!opt) { CHECK(0, "create"); return; }
  model_grads(&m, 3);
  m.g2[0] = INFINITY;
  m.ge[3] = NAN;
  before = m;
  CHECK(muon_step(opt) == MUON_OK, "status %s", muon_error(opt));
  CHECK(same(m.w2, before.w2, sizeof m.w2) && same(m.e, before.e, sizeof m.e), "skipped ones changed");
  CHECK(!same(m.w1, before.w1, sizeof m.w1) && !same(m.b, before.b, sizeof m.b), "others did not change");
  CHECK(muon_get_momentum(opt, 2, &mom, &n) == MUON_OK && n == 800 && mom[5] == 0.0f, "skipped momentum untouched");
  muon_destroy(opt);
}

/* The non-finite check reads every element: a NaN or Inf at each position in turn, first and last
   included, fp32 and bf16 gradients, stops the step with nothing applied. */
static void test_nonfinite_every_element(void) {
  enum { R = 3, C = 5 };
  float w[R * C], w0[R * C], g[R * C], b[7], b0[7], bg[7];
  uint16_t gb[R * C], bgb[7];
  int pos, bf16, missed = 0;
  TEST_CASE("a non-finite gradient element at any position (first, last, between) is found, fp32 and bf16");
  for (bf16 = 0; bf16 < 2; bf16++) {
    muon_optimizer *opt;
    muon_desc d = muon_default_desc();
    muon_matrix m = muon_default_matrix();
    muon_adamw_param p = muon_default_adamw_param();
    for (pos = 0; pos < R * C; pos++) { w[pos] = 0.01f * (float)pos; g[pos] = 1.0f - 0.1f * (float)pos; gb[pos] = 0x3f80u; }
    CHECK(muon_create(&opt, &d) == MUON_OK, "create");
    m.name = "w"; m.param = w; m.rows = R; m.cols = C;
    m.grad = bf16 ? (const void *)gb : (const void *)g;
    m.grad_dtype = bf16 ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
    CHECK(muon_add_matrix(opt, &m, NULL) == MUON_OK, "add");
    for (pos = 0; pos < 7; pos++) { b[pos] = 0.5f; bg[pos] = 1.0f; bgb[pos] = 0x3f80u; }
    p.name = "bias"; p.param = b; p.size = 7;
    p.grad = bf16 ? (const void *)bgb : (const void *)bg;
    p.grad_dtype = bf16 ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
    CHECK(muon_add_adamw_param(opt, &p, NULL) == MUON_OK, "add AdamW");
    for (pos = 0; pos < R * C; pos++) {
      memcpy(w0, w, sizeof w);
      if (bf16) gb[pos] = pos % 2 ? 0x7fc0u : 0xff80u; else g[pos] = pos % 2 ? NAN : -INFINITY;
      if (muon_step(opt) != MUON_ERR_NONFINITE || !strstr(muon_error(opt), "gradient of matrix") || memcmp(w, w0, sizeof w)) missed++;
      if (bf16) gb[pos] = 0x3f80u; else g[pos] = 1.0f;
    }
    for (pos = 0; pos < 7; pos++) {   /* an AdamW param: a missed element would reach the weights */
      memcpy(w0, w, sizeof w); memcpy(b0, b, sizeof b);
      if (bf16) bgb[pos] = 0x7fc0u; else bg[pos] = NAN;
      if (muon_step(opt) != MUON_ERR_NONFINITE || !strstr(muon_error(opt), "AdamW") || memcmp(w, w0, sizeof w) || memcmp(b, b0, sizeof b)) missed++;
      if (bf16) bgb[pos] = 0x3f80u; else bg[pos] = 1.0f;
    }
    CHECK(missed == 0, "%s: %d of %d positions not reported (or applied)", bf16 ? "bf16" : "fp32", missed, R * C + 7);
    CHECK(muon_step(opt) == MUON_OK, "a finite gradient steps again: %s", muon_error(opt));
    muon_destroy(opt);
  }
}

/* A communicator that fails its N-th collective, with MUON_ERR_COMM or MUON_ERR_TIMEOUT, and
   works again afterwards: every collective of a distributed step must be checked, its status
   kept (a timeout stays a timeout), and nothing applied. */
typedef struct { int calls, fail_at; muon_status fail_with; } flaky_comm;
static muon_status flaky_fail(flaky_comm *f) {
  return f->calls++ == f->fail_at ? f->fail_with : MUON_OK;
}
static muon_status flaky_alltoallv(void *ctx, const float *send, const size_t *sc, const size_t *sd, float *recv,
                                   const size_t *rc, const size_t *rd, int *ticket) {
  muon_comm self = muon_comm_self();
  muon_status st = flaky_fail((flaky_comm *)ctx);
  *ticket = -1;
  return st != MUON_OK ? st : self.vt->alltoallv(self.ctx, send, sc, sd, recv, rc, rd, ticket);
}
static muon_status flaky_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  muon_comm self = muon_comm_self();
  muon_status st = flaky_fail((flaky_comm *)ctx);
  return st != MUON_OK ? st : self.vt->allgather(self.ctx, send, recv, bytes);
}
static const char *flaky_error(void *ctx) { (void)ctx; return "injected failure"; }

/* Planning's matrix lists: a rank sends each of its distinct layouts once (keys apart: experts
   and stages share levels), and a layout slot out of range from a peer is an error, not a read
   past the list. */
typedef struct { size_t list_bytes, table; int lists, corrupt; } list_comm;
static muon_status list_alltoallv(void *ctx, const float *send, const size_t *sc, const size_t *sd, float *recv,
                                  const size_t *rc, const size_t *rd, int *ticket) {
  muon_comm self = muon_comm_self();
  (void)ctx;
  return self.vt->alltoallv(self.ctx, send, sc, sd, recv, rc, rd, ticket);
}
static muon_status list_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  list_comm *c = (list_comm *)ctx;
  memcpy(recv, send, bytes);
  if (bytes == c->list_bytes) {
    c->lists++;
    if (c->corrupt == 1) {   /* entry 1, after the layout table: one past the last slot */
      muon__entry e;
      unsigned char *at = (unsigned char *)recv + c->table + sizeof e;
      memcpy(&e, at, sizeof e);
      e.layout = 18;
      memcpy(at, &e, sizeof e);
    }
    if (c->corrupt == 2) {   /* slot 0's level 0 (after n_levels: placement, dim, size): index 5 of 1 */
      unsigned char *index = (unsigned char *)recv + 4 + 12;
      index[0] = 5; index[1] = index[2] = index[3] = 0;
    }
    if (c->corrupt == 3) {   /* slot 0 claims 9 levels: more than a layout has */
      unsigned char *n = (unsigned char *)recv;
      n[0] = 9; n[1] = n[2] = n[3] = 0;
    }
    if (c->corrupt == 4) {   /* the last record claims 8 levels: past the end of the table */
      unsigned char *n = (unsigned char *)recv + c->table - (4 + 3 * 32);
      n[0] = 8; n[1] = n[2] = n[3] = 0;
    }
  }
  return MUON_OK;
}

static void test_plan_lists(void) {
  static const muon_comm_vtable vt = {
    MUON_COMM_VTABLE_VERSION,
    /* .alltoallv = */ list_alltoallv,
    /* .join      = */ NULL,
    /* .finish    = */ NULL,
    /* .allgather = */ list_allgather,
    /* .error     = */ NULL,
    /* .destroy   = */ NULL,
    /* .memory    = */ MUON_MEMORY_HOST,
    /* .queued    = */ 0
  };
  static float w[20][48], g[20][48];
  list_comm c;
  muon_comm comm;
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = muon_default_desc();
  int k;
  TEST_CASE("planning sends each distinct layout of a rank once (keys apart), and rejects a slot out of range, a broken layout or a broken table");
  comm.vt = &vt; comm.ctx = &c; comm.rank = 0; comm.size = 1;
  d.comm = &comm; d.dist = &cfg;
  for (k = 0; k < 5; k++) {
    muon_optimizer *opt = NULL;
    int i, ok = 1;
    memset(&c, 0, sizeof c);
    /* 20 matrices, 18 layouts: two experts (keys 10, 11) and "up" split by rows, "down" by
       columns, and 16 of three levels each, all different (a table of 64 slots: they collide) */
    {
      muon__lists g;   /* one rank, so its slice is its whole list: 20 entries and names */
      memset(&g, 0, sizeof g);
      g.max_local = 20; g.max_layouts = 18; g.slice = 20 * MUON__LISTED;
      g.max_table = c.table = 2 * (4 + 32) + 16 * (4 + 3 * 32);   /* records of 1 and of 3 levels */
      c.list_bytes = muon__list_bytes(&g);
    }
    c.corrupt = k;
    if (muon_create(&opt, &d) != MUON_OK) { CHECK(0, "create"); return; }
    for (i = 0; i < 20; i++) {
      static const char *names[4] = { "expert", "expert", "up", "down" };
      muon_matrix m = muon_default_matrix();
      muon_layout l;
      char name[16];
      memset(&l, 0, sizeof l);
      if (i < 4) {
        l.n_levels = 1;
        l.levels[0] = muon_shard(i < 3 ? 0 : 1, &comm);
        l.key = i < 2 ? 10 + i : 0;
      } else {
        int v = i - 4, j;
        l.n_levels = 3;
        for (j = 0; j < 3; j++, v /= 3) l.levels[j] = v % 3 == 2 ? muon_replicate(&comm) : muon_shard(v % 3, &comm);
      }
      snprintf(name, sizeof name, "m%d", i);
      m.name = i < 4 ? names[i] : name; m.param = w[i]; m.grad = g[i]; m.rows = 6; m.cols = 8; m.layout = &l;
      ok &= muon_add_matrix(opt, &m, NULL) == MUON_OK;
    }
    CHECK(ok, "20 matrices registered");
    if (!k) {
      CHECK(muon_plan(opt) == MUON_OK && c.lists == 1, "planning gathered one list of %zu bytes (%d): %s",
            c.list_bytes, c.lists, muon_error(opt));
    } else if (k == 1) {
      CHECK(muon_plan(opt) == MUON_ERR_MISMATCH && strstr(muon_error(opt), "matrix 'expert' with layout slot 18 of 18"),
            "a slot out of range: %s", muon_error(opt));
    } else if (k == 2) {
      CHECK(muon_plan(opt) == MUON_ERR_MISMATCH &&
                strstr(muon_error(opt), "rank 0's layout of matrix 'expert' is invalid: levels[0]: index 5 outside a group of 1"),
            "a broken layout: %s", muon_error(opt));
    } else {
      const char *want = k == 3 ? "rank 0 sent a broken layout table (record 0)" : "rank 0 sent a broken layout table (record 17)";
      CHECK(muon_plan(opt) == MUON_ERR_MISMATCH && strstr(muon_error(opt), want), "a broken table: %s", muon_error(opt));
    }
    muon_destroy(opt);
  }
}

/* The plan's compact holders bound a rank's distinct layouts and a Partial matrix's parts: past
   either, planning says so on every rank instead of wrapping a bit-field. */
static void test_plan_limits(void) {
  static float w1[1], g1[1];
  float *w = NULL, *g = NULL;
  muon_comm self = muon_comm_self();
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = muon_default_desc();
  int k;
  TEST_CASE("planning refuses more than 32,768 Partial parts or 65,536 distinct layouts on a rank, by name");
  d.comm = &self; d.dist = &cfg;
  for (k = 0; k < 2; k++) {
    muon_optimizer *opt = NULL;
    int i, n = k ? 65537 : 1, ok = 1;
    if (muon_create(&opt, &d) != MUON_OK) { CHECK(0, "create"); return; }
    if (k) {
      w = (float *)calloc((size_t)n, sizeof *w);
      g = (float *)calloc((size_t)n, sizeof *g);
      if (!w || !g) { CHECK(0, "alloc"); muon_destroy(opt); free(w); free(g); return; }
    }
    for (i = 0; ok && i < n; i++) {
      muon_matrix m = muon_default_matrix();
      muon_layout l;
      char name[16];
      memset(&l, 0, sizeof l);
      l.n_levels = 1;
      if (k) { l.levels[0] = muon_replicate(NULL); l.levels[0].size = 1 + i; }   /* each its own layout */
      else { l.levels[0] = muon_partial(NULL, MUON_REDUCE_SUM); l.levels[0].size = 40000; }
      snprintf(name, sizeof name, "m%d", i);
      m.name = name; m.param = k ? &w[i] : w1; m.grad = k ? &g[i] : g1; m.rows = 1; m.cols = 1; m.layout = &l;
      ok = muon_add_matrix(opt, &m, NULL) == MUON_OK;
    }
    CHECK(ok, "%d matrices registered: %s", n, muon_error(opt));
    if (!k)
      CHECK(muon_plan(opt) == MUON_ERR_SHAPE && strstr(muon_error(opt), "rank 0's layout has 40000 Partial parts, more than 32768"),
            "40,000 parts: %s", muon_error(opt));
    else
      CHECK(muon_plan(opt) == MUON_ERR_ARG && strstr(muon_error(opt), "65537 distinct layouts, more than 65536"),
            "65,537 layouts: %s", muon_error(opt));
    muon_destroy(opt);
  }
  free(w);
  free(g);
}

static void test_comm_faults(void) {
  static const muon_comm_vtable vt = {
    MUON_COMM_VTABLE_VERSION,
    /* .alltoallv = */ flaky_alltoallv,
    /* .join      = */ NULL,
    /* .finish    = */ NULL,
    /* .allgather = */ flaky_allgather,
    /* .error     = */ flaky_error,
    /* .destroy   = */ NULL,
    /* .memory    = */ MUON_MEMORY_HOST,
    /* .queued    = */ 0
  };
  static model m, before;
  flaky_comm f = { 0, -1, MUON_OK };
  muon_comm comm;
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = muon_default_desc();
  muon_optimizer *opt;
  int k, per_step, bad = 0;
  TEST_CASE("a collective failing at any call of a step: its status (COMM or TIMEOUT), nothing applied (the vote's text: on this rank, restore every rank), the next step works");
  comm.vt = &vt; comm.ctx = &f; comm.rank = 0; comm.size = 1;
  d.comm = &comm; d.dist = &cfg;
  model_init(&m, 1);
  opt = make_opt(&m, &d);
  if (!opt) { CHECK(0, "create"); return; }
  model_grads(&m, 2);
  CHECK(muon_step(opt) == MUON_OK, "first step: %s", muon_error(opt));
  k = f.calls;
  CHECK(muon_step(opt) == MUON_OK, "second step: %s", muon_error(opt));
  per_step = f.calls - k;
  CHECK(per_step >= 1, "a distributed step makes %d collectives", per_step);
  for (k = 0; k < per_step; k++) {
    muon_status st;
    f.fail_at = f.calls + k;
    f.fail_with = k % 2 ? MUON_ERR_TIMEOUT : MUON_ERR_COMM;
    before = m;
    st = muon_step(opt);
    if (st != f.fail_with || !strstr(muon_error(opt), "injected failure") || !same(&m, &before, sizeof m) ||
        (k == per_step - 1 && (!strstr(muon_error(opt), "commit vote failed on rank 0 of 1") ||
                               !strstr(muon_error(opt), "nothing was applied on this rank") ||
                               !strstr(muon_error(opt), "may have applied the step") ||
                               !strstr(muon_error(opt), "restore every rank from the last checkpoint")))) {
      bad++;
      printf("  collective %d of %d failing with %s: %s (%s)%s\n", k + 1, per_step, muon_status_string(f.fail_with),
             muon_status_string(st), muon_error(opt), same(&m, &before, sizeof m) ? "" : "; parameters changed");
    }
    f.fail_at = -1;
    if (muon_step(opt) != MUON_OK) { bad++; printf("  after failure %d the next step failed: %s\n", k + 1, muon_error(opt)); }
  }
  CHECK(bad == 0, "%d of %d failing collectives mishandled", bad, per_step);
  muon_destroy(opt);
}

static void test_absent_grad(void) {
  static model m, before;
  muon_optimizer *opt;
  muon_stats s;
  TEST_CASE("an absent gradient skips the matrix entirely: no decay, no momentum change");
  model_init(&m, 4);
  opt = make_opt(&m, NULL);
  if (!opt) { CHECK(0, "create"); return; }
  model_grads(&m, 5);
  CHECK(muon_set_grad(opt, 1, NULL) == MUON_OK && muon_set_adamw_grad(opt, 0, NULL) == MUON_OK, "set_grad");
  before = m;
  CHECK(muon_step(opt) == MUON_OK, "step");
  CHECK(same(m.w1 + 960, before.w1 + 960, 960 * 4), "slice 1 changed");
  CHECK(!same(m.w1, before.w1, 960 * 4), "slice 0 did not change");
  CHECK(same(m.b, before.b, sizeof m.b), "AdamW param without grad changed");
  CHECK(muon_get_stats(opt, &s) == MUON_OK && s.ns_calls == 2, "ns_calls %lld, want 2", s.ns_calls);
  muon_destroy(opt);
}

static void test_alloc_failure(void) {
  int k, failures = 0, clean = 1;
  TEST_CASE("allocation failure at every site: clean error, no leak");
  for (k = 0; k < 64; k++) {
    static model m;
    fail_alloc fa = { 0, 0, 0 };
    muon_desc d = muon_default_desc();
    muon_optimizer *opt = NULL;
    muon_status st;
    fa.fail_at = k;
    d.allocator.alloc = fa_alloc;
    d.allocator.free = fa_free;
    d.allocator.user_data = &fa;
    model_init(&m, 7);
    model_grads(&m, 8);
    st = muon_create(&opt, &d);
    if (st == MUON_OK) st = model_register(opt, &m);
    if (st == MUON_OK) st = muon_step(opt);
    if (st == MUON_OK) {
      size_t n = muon_state_size(opt);
      (void)n;
      st = muon_state_save_file(opt, "build/alloc_state.bin");
      if (st == MUON_OK) st = muon_state_load_file(opt, "build/alloc_state.bin");
    }
    if (fa.calls <= k) { muon_destroy(opt); break; } /* every site has been failed once */
    failures++;
    if (st != MUON_ERR_NOMEM) { clean = 0; printf("  site %d: status %s\n", k, muon_status_string(st)); }
    muon_destroy(opt);
    if (fa.live != 0) { clean = 0; printf("  site %d: %ld blocks leaked\n", k, fa.live); }
  }
  printf("  allocation failure injected at %d sites in turn\n", failures);
  CHECK(failures >= 8, "only %d allocation sites were exercised", failures);
  CHECK(clean, "some failure was not a clean MUON_ERR_NOMEM without leaks");
  remove("build/alloc_state.bin");
}

static void run_steps(muon_optimizer *opt, model *m, int from, int to) {
  int s;
  for (s = from; s < to; s++) {
    model_grads(m, 100u + (unsigned)s);
    if (s == 3) muon_set_lr(opt, 0, 5e-4f);
    muon_step(opt);
  }
}

static void test_state(void) {
  static model a, b;
  muon_optimizer *oa, *ob, *oc;
  size_t n;
  unsigned char *buf, *bad;
  TEST_CASE("state: stop after step 4 and resume = never stopping, bit for bit");
  model_init(&a, 9);
  b = a;
  oa = make_opt(&a, NULL);
  ob = make_opt(&b, NULL);
  if (!oa || !ob) { CHECK(0, "create"); return; }
  run_steps(oa, &a, 0, 8);
  run_steps(ob, &b, 0, 4);
  CHECK(muon_state_save_file(ob, "build/state_test.bin") == MUON_OK, "save: %s", muon_error(ob));
  muon_destroy(ob);
  ob = make_opt(&b, NULL);   /* fresh optimizer, same params as at step 4 */
  CHECK(muon_state_load_file(ob, "build/state_test.bin") == MUON_OK, "load: %s", muon_error(ob));
  run_steps(ob, &b, 4, 8);
  CHECK(same(&a, &b, sizeof a), "resumed run differs");

  TEST_CASE("state: truncated, corrupted, mismatched blobs are MUON_ERR_STATE and change nothing");
  n = muon_state_size(ob);
  buf = (unsigned char *)malloc(n);
  bad = (unsigned char *)malloc(n);
  CHECK(muon_state_save(ob, buf, n - 1) == MUON_ERR_ARG, "save into a short buffer");
  CHECK(muon_state_save(ob, buf, n) == MUON_OK, "save");
  {
    const float *mom = NULL;
    size_t mn = 0;
    float keep[4];
    muon_get_momentum(ob, 0, &mom, &mn);
    memcpy(keep, mom, sizeof keep);
    CHECK(muon_state_load(ob, buf, n - 9) == MUON_ERR_STATE && strstr(muon_error(ob), "truncated"), "truncated: %s", muon_error(ob));
    CHECK(muon_state_load(ob, buf, 10) == MUON_ERR_STATE, "header only");
    memcpy(bad, buf, n); bad[n / 2] ^= 0x10;
    CHECK(muon_state_load(ob, bad, n) == MUON_ERR_STATE && strstr(muon_error(ob), "checksum"), "flipped bit: %s", muon_error(ob));
    memcpy(bad, buf, n); bad[0] = 'X';
    CHECK(muon_state_load(ob, bad, n) == MUON_ERR_STATE, "bad magic");
    memcpy(bad, buf, n); bad[8] = 9;
    CHECK(muon_state_load(ob, bad, n) == MUON_ERR_STATE && strstr(muon_error(ob), "version"), "version: %s", muon_error(ob));
    CHECK(muon_state_load_file(ob, "build/does-not-exist.bin") == MUON_ERR_STATE, "missing file");
    CHECK(same(mom, keep, sizeof keep), "momentum changed by a failed load");
  }
  {
    /* Same sizes, different shapes: w2 registered as 16 x 50. */
    static float w[800], g[800], w1[1920], g1[1920], bb[24], e[10];
    muon_desc d = muon_default_desc();
    muon_matrix m1 = muon_default_matrix(), m2 = muon_default_matrix();
    muon_adamw_param p = muon_default_adamw_param(), q = muon_default_adamw_param();
    muon_create(&oc, &d);
    m1.name = "w1"; m1.param = w1; m1.grad = g1; m1.rows = 24; m1.cols = 40; m1.count = 2;
    m2.name = "w2"; m2.param = w; m2.grad = g; m2.rows = 16; m2.cols = 50;
    p.name = "b"; p.param = bb; p.size = 24; q.name = "e"; q.param = e; q.size = 10;
    muon_add_matrix(oc, &m1, NULL); muon_add_matrix(oc, &m2, NULL);
    muon_add_adamw_param(oc, &p, NULL); muon_add_adamw_param(oc, &q, NULL);
    CHECK(muon_state_load(oc, buf, n) == MUON_ERR_STATE && strstr(muon_error(oc), "'w2') is 16 x 50"), "shape mismatch: %s", muon_error(oc));
    muon_destroy(oc);
    /* Same shapes, another name: a checkpoint of another model. */
    muon_create(&oc, &d);
    m2.name = "w2t"; m2.rows = 50; m2.cols = 16;
    muon_add_matrix(oc, &m1, NULL); muon_add_matrix(oc, &m2, NULL);
    muon_add_adamw_param(oc, &p, NULL); muon_add_adamw_param(oc, &q, NULL);
    CHECK(muon_state_load(oc, buf, n) == MUON_ERR_STATE && strstr(muon_error(oc), "'w2t' here") && strstr(muon_error(oc), "another name"), "name mismatch: %s", muon_error(oc));
    muon_destroy(oc);
    /* Same shapes and names, an AdamW param that is another range of its parameter. */
    muon_create(&oc, &d);
    m2.name = "w2";
    muon_add_matrix(oc, &m1, NULL); muon_add_matrix(oc, &m2, NULL);
    p.offset = 24; p.full_size = 48;
    muon_add_adamw_param(oc, &p, NULL); muon_add_adamw_param(oc, &q, NULL);
    CHECK(muon_state_load(oc, buf, n) == MUON_ERR_STATE && strstr(muon_error(oc), "elements [24, +24) of 48 here"), "range mismatch: %s", muon_error(oc));
    p.offset = 0; p.full_size = 0;
    muon_destroy(oc);
  }
  free(buf);
  free(bad);
  muon_destroy(oa);
  muon_destroy(ob);
  remove("build/state_test.bin");
}

static void test_state_matrices_only(void) {
  static float w[6 * 10], g[6 * 10];
  muon_desc d = muon_default_desc();
  muon_optimizer *a, *b;
  muon_matrix m = muon_default_matrix();
  size_t n;
  void *blob;
  TEST_CASE("state: an optimizer with matrices only (no AdamW) saves and loads");
  test_rng = 5;
  fill(w, 60); fill(g, 60);
  m.param = w; m.grad = g; m.rows = 6; m.cols = 10;
  muon_create(&a, &d);
  muon_create(&b, &d);
  muon_add_matrix(a, &m, NULL);
  muon_add_matrix(b, &m, NULL);
  CHECK(muon_step(a) == MUON_OK, "step");
  n = muon_state_size(a);
  blob = malloc(n);
  CHECK(muon_state_save(a, blob, n) == MUON_OK, "save: %s", muon_error(a));
  CHECK(muon_state_load(b, blob, n) == MUON_OK, "load: %s", muon_error(b));
  {
    const float *ma = NULL, *mb = NULL;
    size_t na = 0, nb = 0;
    muon_get_momentum(a, 0, &ma, &na);
    muon_get_momentum(b, 0, &mb, &nb);
    CHECK(na == nb && same(ma, mb, na * 4), "momentum differs after load");
  }
  TEST_CASE("state: group records are length-prefixed: a shorter one (an older muon.h) defaults the fields it lacks, a longer one (a newer muon.h) loads with its extra bytes skipped");
  {   /* The blob: header (48), group counts (8), the Muon group's record (u32 bytes = 4 * (16 + 3 * 5),
         normuon, normuon_beta2 and momentum_format its last three fields), the AdamW group's (u32
         bytes = 24, cautious_wd last), then the matrix. */
    const size_t grp = 56, g = 4 * (16 + 15), ag = 24, n0 = n;
    const size_t ns = n0 + 8 + 4, no = n0 - 12 - 4;   /* newer: 8 + 4 bytes more; older: 3 + 1 fields less */
    unsigned char *v = (unsigned char *)blob, *newer = (unsigned char *)malloc(ns), *older = (unsigned char *)malloc(no),
                  *again = (unsigned char *)malloc(n0);
    muon_desc d2 = d;
    muon_hparams hp = muon_default_hparams();
    uint64_t sum;
    size_t k, at;
    CHECK(v[grp] == (unsigned char)g && v[grp + 4 + g] == (unsigned char)ag, "the records' lengths are where this test expects them");
    /* newer: each record grows by unknown fields (0xEE bytes) at its end */
    memcpy(newer, v, grp + 4 + g);
    memset(newer + grp + 4 + g, 0xEE, 8);
    at = grp + 4 + g + 8;
    memcpy(newer + at, v + grp + 4 + g, 4 + ag);
    memset(newer + at + 4 + ag, 0xEE, 4);
    memcpy(newer + at + 4 + ag + 4, v + grp + 4 + g + 4 + ag, n0 - (grp + 4 + g + 4 + ag));
    newer[grp] = (unsigned char)(g + 8);
    newer[at] = (unsigned char)(ag + 4);
    sum = muon__fnv1a(newer, ns - 8);
    for (k = 0; k < 8; k++) newer[ns - 8 + k] = (unsigned char)(sum >> (8 * k));
    muon_destroy(b);
    muon_create(&b, &d);
    muon_add_matrix(b, &m, NULL);
    CHECK(muon_state_load(b, newer, ns) == MUON_OK, "a newer blob: %s", muon_error(b));
    CHECK(muon_state_save(b, again, n0) == MUON_OK && memcmp(again, v, n0) == 0, "saved again, it differs from the original blob");
    /* older: normuon, normuon_beta2, momentum_format and the AdamW group's cautious_wd are not
       there; an optimizer that had them set gets the defaults (off), not its own values (but the
       momentum format stays the optimizer's) */
    memcpy(older, v, grp + 4 + g - 12);
    at = grp + 4 + g - 12;
    memcpy(older + at, v + grp + 4 + g, 4 + ag - 4);
    memcpy(older + at + ag, v + grp + 4 + g + 4 + ag, n0 - (grp + 4 + g + 4 + ag));
    older[grp] = (unsigned char)(g - 12);
    older[at] = (unsigned char)(ag - 4);
    sum = muon__fnv1a(older, no - 8);
    for (k = 0; k < 8; k++) older[no - 8 + k] = (unsigned char)(sum >> (8 * k));
    d2.hparams.normuon = MUON_NORMUON_LARGER;
    d2.adamw.cautious_wd = 1;
    muon_destroy(b);
    muon_create(&b, &d2);
    muon_add_matrix(b, &m, NULL);
    CHECK(muon_state_load(b, older, no) == MUON_OK, "an older blob: %s", muon_error(b));
    CHECK(muon_get_group(b, 0, &hp) == MUON_OK && hp.normuon == MUON_NORMUON_OFF && hp.normuon_beta2 == 0.95f,
          "normuon %d, beta2 %g: not the defaults", (int)hp.normuon, (double)hp.normuon_beta2);
    CHECK(muon_state_save(b, again, n0) == MUON_OK && memcmp(again, v, n0) == 0, "saved again, it differs from the original blob");
    /* a group record too short for its own ns_steps triples is refused */
    older[grp] = 24;
    sum = muon__fnv1a(older, no - 8);
    for (k = 0; k < 8; k++) older[no - 8 + k] = (unsigned char)(sum >> (8 * k));
    CHECK(muon_state_load(b, older, no) == MUON_ERR_STATE && strstr(muon_error(b), "groups"), "a group record cut before its coefficients: %s", muon_error(b));
    newer[8] = 2;
    CHECK(muon_state_load(b, newer, ns) == MUON_ERR_STATE && strstr(muon_error(b), "version 2"), "version 2: %s", muon_error(b));
    free(newer);
    free(older);
    free(again);
  }
  free(blob);
  muon_destroy(a);
  muon_destroy(b);
}

/* Regressions from review: each of these once passed bad input through. */
static void test_review_regressions(void) {
  static float w[12], g[12];
  muon_desc d = muon_default_desc();
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt;
  muon_matrix m = muon_default_matrix();
  muon_adamw_param p = muon_default_adamw_param();
  muon_layout l;
  muon_hparams hp;

  TEST_CASE("a FLAT range whose offset + length overflows is MUON_ERR_SHAPE");
  d.dist = &cfg;
  muon_create(&opt, &d);
  memset(&l, 0, sizeof l);
  l.n_levels = 1;
  l.levels[0] = muon_flat_range(NULL, 9223372036854775807LL, 2);
  m.name = "w"; m.param = w; m.grad = g; m.rows = 3; m.cols = 4; m.layout = &l;
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_ERR_SHAPE, "status: %s", muon_error(opt));
  l.levels[0] = muon_flat_range(NULL, 10, 3);
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_ERR_SHAPE, "[10, 13) of 12: %s", muon_error(opt));
  l.levels[0] = muon_flat_range(NULL, 12, 0);
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_OK, "[12, 12) of 12 is an empty piece: %s", muon_error(opt));
  muon_destroy(opt);

  TEST_CASE("an AdamW size whose byte count overflows is MUON_ERR_SHAPE");
  d = muon_default_desc();
  muon_create(&opt, &d);
  p.param = w; p.grad = g; p.size = ((size_t)1 << (sizeof(size_t) * 8 - 2)) + 1;
  CHECK(muon_add_adamw_param(opt, &p, NULL) == MUON_ERR_SHAPE, "status: %s", muon_error(opt));
  muon_destroy(opt);

  TEST_CASE("state: an implausible AdamW step count with a valid checksum is MUON_ERR_STATE");
  {
    static float bw[5], bg[5];
    size_t n;
    unsigned char *blob;
    int k;
    uint64_t sum;
    muon_create(&opt, &d);
    p.param = bw; p.grad = bg; p.size = 5;
    muon_add_adamw_param(opt, &p, NULL);
    muon_step(opt);
    n = muon_state_size(opt);
    blob = (unsigned char *)malloc(n);
    muon_state_save(opt, blob, n);
    /* The AdamW entry is the last thing before the checksum: u64 size, u64 step, u64 name hash,
       u64 full size, u64 offset, moments. */
    {
      uint64_t minus_one = ~(uint64_t)0;   /* step = -1 as u64 */
      size_t at = n - 8 - 2 * 5 * sizeof(float) - 32;   /* then name hash, full size, offset */
      if (n > 56) memcpy(blob + at, &minus_one, sizeof minus_one);
    }
    sum = muon__fnv1a(blob, n - 8);
    for (k = 0; k < 8; k++) blob[n - 8 + k] = (unsigned char)(sum >> (8 * k));
    CHECK(muon_state_load(opt, blob, n) == MUON_ERR_STATE && strstr(muon_error(opt), "step count"), "status: %s", muon_error(opt));
    muon_step(opt);
    CHECK(muon__finite(bw[0]) && muon__finite(bw[4]), "parameters became non-finite");
    free(blob);
    muon_destroy(opt);
  }

  TEST_CASE("state: coefficients past ns_steps survive a save/load round trip");
  {
    size_t n;
    void *blob;
    muon_hparams got;
    memset(&got, 0, sizeof got);
    muon_create(&opt, &d);
    hp = muon_default_hparams();
    muon_set_ns_preset(&hp, MUON_NS_POLAR_EXPRESS);
    hp.ns_steps = 3;
    muon_set_group(opt, 0, &hp);
    n = muon_state_size(opt);
    blob = malloc(n);
    muon_state_save(opt, blob, n);
    CHECK(muon_state_load(opt, blob, n) == MUON_OK, "load: %s", muon_error(opt));
    muon_get_group(opt, 0, &got);
    CHECK(same(got.ns_coefficients, hp.ns_coefficients, sizeof hp.ns_coefficients), "coefficients changed");
    free(blob);
    muon_destroy(opt);
  }
}

static void test_determinism(void) {
  static model a, b;
  muon_optimizer *oa, *ob;
  muon_stats s;
  TEST_CASE("same inputs, same bits; stats report NS calls and a bounded workspace");
  model_init(&a, 11);
  b = a;
  oa = make_opt(&a, NULL);
  ob = make_opt(&b, NULL);
  if (!oa || !ob) { CHECK(0, "create"); return; }
  run_steps(oa, &a, 0, 3);
  run_steps(ob, &b, 0, 3);
  CHECK(same(&a, &b, sizeof a), "two runs differ");
  CHECK(muon_get_stats(oa, &s) == MUON_OK && s.ns_calls == 9 && s.steps == 3, "ns_calls %lld steps %lld", s.ns_calls, s.steps);
  /* Largest matrix: 24 x 40 -> m=24, n=40: NS workspace <= 2mn + 2m^2 floats. */
  CHECK(s.ns_workspace_bytes <= (2 * 24 * 40 + 2 * 24 * 24) * 4, "ns workspace %zu bytes", s.ns_workspace_bytes);
  CHECK(s.state_bytes == (2 * 960 + 800 + 2 * 24 + 2 * 10) * 4, "state bytes %zu", s.state_bytes);
  /* the public bound covers either algorithm: 2mn + 2m^2, or 2mn + 5m^2 where Gram can run (n >= 2m) */
  CHECK(muon_ns_workspace_floats(1000, 300) <= 2 * 300 * 1000 + 5 * 300 * 300, "ns workspace bound at 1000 x 300");
  CHECK(muon_ns_workspace_floats(4096, 1024) <= 2ul * 1024 * 4096 + 5ul * 1024 * 1024, "ns workspace bound at 4096 x 1024");
  CHECK(muon_ns_workspace_floats(700, 500) <= 2 * 500 * 700 + 2 * 500 * 500, "ns workspace bound at 700 x 500 (standard only)");
  muon_destroy(oa);
  muon_destroy(ob);
}

/* The bytes of a file (NULL if it cannot be read); *n gets the size. */
static void write_back(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (f) { fwrite(p, 1, n, f); fclose(f); }
}

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  unsigned char *b;
  long len;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) { fclose(f); return NULL; }
  b = (unsigned char *)malloc((size_t)len + 1);
  *n = fread(b, 1, (size_t)len, f);
  fclose(f);
  return b;
}

/* How many names in dir start with prefix (the temporaries a save or dump left: "<file>.muon-tmp"). */
static int temps_left(const char *dir, const char *prefix) {
  int n = 0;
#if defined(__unix__) || defined(__APPLE__)
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  if (d) closedir(d);
#else
  (void)dir; (void)prefix;
#endif
  return n;
}

/* Removes such names: an earlier run killed in the middle (make mutate reuses its build
   directory) may have left temporaries that this run's counts must not see. */
static void temps_remove(const char *dir, const char *prefix) {
#if defined(__unix__) || defined(__APPLE__)
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[512];
  while (d && (e = readdir(d)) != NULL)
    if (!strncmp(e->d_name, prefix, strlen(prefix))) {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      remove(p);
    }
  if (d) closedir(d);
#else
  (void)dir; (void)prefix;
#endif
}

static void test_checkpoint_files(void) {
  static model a;
  const char *path = "build/atomic_state.bin";
  muon_optimizer *o;
  unsigned char *old_file, *now, *blob;
  size_t n_old = 0, n_now = 0, n_blob;
  int k;
  TEST_CASE("muon_state_save_file: a failure at each file operation leaves the previous checkpoint whole and says why");
  temps_remove("build", "atomic_state.bin.muon-tmp");
  temps_remove("build", "atomic_dump.bin.muon-tmp");
  model_init(&a, 21);
  o = make_opt(&a, NULL);
  if (!o) { CHECK(0, "create"); return; }
  run_steps(o, &a, 0, 1);
  CHECK(muon_state_save_file(o, path) == MUON_OK, "first save: %s", muon_error(o));
  old_file = slurp(path, &n_old);
  run_steps(o, &a, 1, 3);   /* the state moves on: a new save would differ */
  n_blob = muon_state_size(o);
  blob = (unsigned char *)malloc(n_blob);
  CHECK(muon_state_save(o, blob, n_blob) == MUON_OK && (n_blob != n_old || memcmp(blob, old_file, n_blob) != 0), "state did not change");
  /* operations: 1 create the temporary, 2 write, 3 fsync, 4 close, 5 rename, 6 flush the directory */
  for (k = 1; k <= 6; k++) {
    muon_status st;
    muon__save_fault_at = k;
    st = muon_state_save_file(o, path);
    muon__save_fault_at = 0;
    CHECK(st == MUON_ERR_STATE && strstr(muon_error(o), strerror(EIO)), "fault at operation %d: %s (%s)", k, muon_status_string(st), muon_error(o));
    now = slurp(path, &n_now);
    if (k <= 5) CHECK(now && n_now == n_old && memcmp(now, old_file, n_old) == 0, "fault at operation %d: the previous checkpoint was damaged", k);
    else CHECK(now && n_now == n_blob && memcmp(now, blob, n_blob) == 0, "fault after the rename: the new checkpoint is not in place");
    free(now);
    CHECK(temps_left("build", "atomic_state.bin.muon-tmp") == 0, "fault at operation %d left a temporary file behind",
          k);
  }
  CHECK(muon_state_save_file(o, path) == MUON_OK, "save: %s", muon_error(o));
  now = slurp(path, &n_now);
  CHECK(now && n_now == n_blob && memcmp(now, blob, n_blob) == 0, "the saved file is not the state");
  free(now);

  TEST_CASE("muon_dump_file: a failure at each file operation leaves the previous dump whole and no temporary");
  {
    const char *dump = "build/atomic_dump.bin";
    unsigned char *old_dump, *new_dump;
    size_t n_old_dump = 0, n_new_dump = 0;
    int ops;
    CHECK(muon_dump_file(o, dump, 0, 1) == MUON_OK, "first dump: %s", muon_error(o));
    old_dump = slurp(dump, &n_old_dump);
    run_steps(o, &a, 3, 4);   /* parameters and momentum move on */
    for (k = 1; k <= 40; k++) {   /* until the fault lands past the last operation */
      muon_status st;
      muon__save_fault_at = k;
      st = muon_dump_file(o, dump, 0, 1);
      muon__save_fault_at = 0;
      CHECK(temps_left("build", "atomic_dump.bin.muon-tmp") == 0,
            "dump fault at operation %d left a temporary file behind", k);
      if (st == MUON_OK) break;
      CHECK(st == MUON_ERR_STATE && strstr(muon_error(o), strerror(EIO)), "dump fault at operation %d: %s", k,
            muon_error(o));
    }
    ops = k - 1;   /* create, header, 2 records per matrix, fsync, close, rename, flush the directory */
    CHECK(ops == 2 + 2 * muon_matrix_count(o) + 4, "the dump took %d file operations", ops);
    new_dump = slurp(dump, &n_new_dump);
    CHECK(new_dump && (n_new_dump != n_old_dump || memcmp(new_dump, old_dump, n_old_dump) != 0),
          "the dump did not change");
    write_back(dump, old_dump, n_old_dump);
    for (k = 1; k < ops; k++) {   /* each failure before the directory flush leaves the old dump */
      unsigned char *was;
      size_t n_was = 0;
      muon__save_fault_at = k;
      muon_dump_file(o, dump, 0, 1);
      muon__save_fault_at = 0;
      was = slurp(dump, &n_was);
      CHECK(was && n_was == n_old_dump && memcmp(was, old_dump, n_old_dump) == 0,
            "dump fault at operation %d damaged the previous dump", k);
      free(was);
    }
    free(old_dump);
    free(new_dump);
    remove(dump);
  }

  TEST_CASE("checkpoint files: a taken temporary is never reused (O_EXCL); temporaries are <path>.muon-tmp-XXXXXX");
  {
    char taken[300], msg[600];
    const char *precious = "another save's temporary";
    size_t n_taken = 0;
    unsigned char *left;
    muon__tmp_fixed = 1;   /* the first try's name is known: take it first */
    muon__tmp_name(taken, path, strlen(path), 0);
    write_back(taken, precious, strlen(precious));
    CHECK(muon_state_save_file(o, path) == MUON_OK, "save beside a taken name: %s", muon_error(o));
    left = slurp(taken, &n_taken);
    CHECK(left && n_taken == strlen(precious) && memcmp(left, precious, n_taken) == 0,
          "the save wrote into an existing temporary");
    free(left);
    remove(taken);
    muon__tmp_fixed = 0;
    CHECK(temps_left("build", "atomic_state.bin.muon-tmp") == 0, "a save left a temporary file behind");
    muon__save_fault_at = 2;   /* the write fails: the message names the temporary */
    muon_state_save_file(o, path);
    muon__save_fault_at = 0;
    snprintf(msg, sizeof msg, "%s", muon_error(o));
    {
      const char *t = strstr(msg, "build/atomic_state.bin.muon-tmp-");
      int i, ok = t != NULL;
      for (i = 0; ok && i < 6; i++) ok = strchr("0123456789abcdefghijklmnopqrstuvwxyz", t[32 + i]) && t[32 + i];
      CHECK(ok && t[38] == '\'', "the temporary is not named <path>.muon-tmp-XXXXXX: %s", msg);
    }
  }

  TEST_CASE("checkpoint files: a directory, a missing directory and a missing file fail with the OS's reason");
  CHECK(muon_state_load_file(o, "build") == MUON_ERR_STATE &&
        strstr(muon_error(o), "'build' is a directory, not a regular file"), "directory: %s", muon_error(o));
  CHECK(muon_state_save_file(o, "build/no-such-dir/x.bin") == MUON_ERR_STATE && strstr(muon_error(o), strerror(ENOENT)), "missing dir: %s", muon_error(o));
  CHECK(muon_state_load_file(o, "build/no-such-file.bin") == MUON_ERR_STATE && strstr(muon_error(o), strerror(ENOENT)), "missing file: %s", muon_error(o));
  free(old_file);
  free(blob);
  muon_destroy(o);
}

typedef struct { int warns, infos; char last[600]; } log_count;
static void count_log(muon_log_level level, const char *msg, void *user) {
  log_count *c = (log_count *)user;
  if (level == MUON_LOG_WARN) c->warns++;
  if (level == MUON_LOG_INFO) c->infos++;
  snprintf(c->last, sizeof c->last, "%s", msg);
}

static void test_dropin(void) {
  muon_desc d = muon_default_desc();
  muon_optimizer *o = NULL;
  muon_matrix m = muon_default_matrix();
  muon_adamw_param ap = muon_default_adamw_param();
  muon_stats st;
  log_count lc;
  static float w[6 * 10], g[6 * 10], w0[6 * 10], b[8], gb[8], b0[8];
  memset(&st, 0, sizeof st);
  unsigned char *blob;
  size_t n;
  TEST_CASE("a failing muon_create without a logger: muon_error(NULL) says why");
  d.hparams.lr = -1;
  CHECK(muon_create(&o, &d) == MUON_ERR_ARG && o == NULL, "bad lr accepted");
  CHECK(strstr(muon_error(NULL), "lr") != NULL, "muon_error(NULL) = '%s'", muon_error(NULL));
  d.hparams.lr = 0.02f;
  CHECK(muon_create(&o, &d) == MUON_OK, "create");
  CHECK(strstr(muon_error(NULL), "lr") == NULL, "a successful muon_create keeps the old failure: '%s'", muon_error(NULL));

  TEST_CASE("a gradient registered NULL and never bound: MUON_ERR_ARG naming it, nothing applied; NULL bound skips");
  memset(&lc, 0, sizeof lc);
  muon_destroy(o);
  d.logger.func = count_log;
  d.logger.user_data = &lc;
  CHECK(muon_create(&o, &d) == MUON_OK, "create");
  test_rng = 3;
  fill(w, 60);
  fill(g, 60);
  fill(b, 8);
  fill(gb, 8);
  memcpy(w0, w, sizeof w);
  memcpy(b0, b, sizeof b);
  m.name = "lazy"; m.param = w; m.grad = NULL; m.rows = 6; m.cols = 10;
  CHECK(muon_add_matrix(o, &m, NULL) == MUON_OK, "add");
  ap.name = "lazy_bias"; ap.param = b; ap.grad = NULL; ap.size = 8;
  CHECK(muon_add_adamw_param(o, &ap, NULL) == MUON_OK, "add AdamW");
  CHECK(muon_step(o) == MUON_ERR_ARG && strstr(muon_error(o), "matrix 0 ('lazy')") && strstr(muon_error(o), "muon_set_grad"),
        "an unbound matrix gradient: '%s'", muon_error(o));
  CHECK(muon_set_grad(o, 0, NULL) == MUON_OK, "set_grad NULL");   /* absent on purpose */
  CHECK(muon_step(o) == MUON_ERR_ARG && strstr(muon_error(o), "AdamW param 0 ('lazy_bias')") &&
            strstr(muon_error(o), "muon_set_adamw_grad"),
        "an unbound AdamW gradient: '%s'", muon_error(o));
  CHECK(muon_get_stats(o, &st) == MUON_OK && st.steps == 0 && !memcmp(w, w0, sizeof w) && !memcmp(b, b0, sizeof b),
        "a refused step changed something (steps %lld)", st.steps);
  CHECK(muon_set_adamw_grad(o, 0, gb) == MUON_OK && muon_step(o) == MUON_OK, "bound AdamW, absent matrix: %s", muon_error(o));
  CHECK(muon_get_stats(o, &st) == MUON_OK && st.skipped == 1 && !memcmp(w, w0, sizeof w) && memcmp(b, b0, sizeof b),
        "the absent matrix was not skipped alone (stats.skipped %lld)", st.skipped);
  CHECK(muon_set_grad(o, 0, g) == MUON_OK && muon_step(o) == MUON_OK && muon_get_stats(o, &st) == MUON_OK &&
            st.skipped == 1 && memcmp(w, w0, sizeof w),
        "not trained after its gradient was bound (stats.skipped %lld)", st.skipped);
  CHECK(lc.warns == 0, "warnings %d, last '%s'", lc.warns, lc.last);

  TEST_CASE("muon_state_load says through the logger which group's hyperparameters it replaced");
  n = muon_state_size(o);
  blob = (unsigned char *)malloc(n);
  CHECK(muon_state_save(o, blob, n) == MUON_OK, "save");
  CHECK(muon_set_lr(o, 0, 0.01f) == MUON_OK, "set lr");
  lc.infos = 0;
  CHECK(muon_state_load(o, blob, n) == MUON_OK, "load: %s", muon_error(o));
  CHECK(lc.infos == 1 && strstr(lc.last, "group 0") && strstr(lc.last, "0.01 -> 0.02"), "infos %d, last '%s'", lc.infos, lc.last);
  lc.infos = 0;
  CHECK(muon_state_load(o, blob, n) == MUON_OK && lc.infos == 0, "an identical load still logs (%d)", lc.infos);
  free(blob);
  muon_destroy(o);
}

static void test_spectral_unclamped(void) {
  /* lr*sqrt(rows/cols), not clamped at 1: with no decay and no momentum the update of a wide and
     a tall matrix equals adjust_lr NONE at that lr, computed the same way (in double), bit for bit. */
  enum { R = 12, C = 40 };
  static float w[2][2][R * C], g[R * C];
  int shape, run;
  TEST_CASE("adjust_lr SPECTRAL_UNCLAMPED = lr * sqrt(rows/cols), below 1 for wide matrices too");
  test_rng = 5;
  fill(g, R * C);
  for (shape = 0; shape < 2; shape++) {
    int rows = shape ? C : R, cols = shape ? R : C;
    for (run = 0; run < 2; run++) {
      muon_desc d = muon_default_desc();
      muon_optimizer *o;
      muon_matrix m = muon_default_matrix();
      d.hparams.weight_decay = 0;
      d.hparams.momentum = 0;
      d.hparams.nesterov = 0;
      d.hparams.lr = 0.02f;
      if (run) d.hparams.adjust_lr = MUON_ADJUST_LR_SPECTRAL_UNCLAMPED;
      else { d.hparams.adjust_lr = MUON_ADJUST_LR_NONE; d.hparams.lr = (float)(0.02f * sqrt((double)rows / cols)); }
      test_rng = 9;
      fill(w[shape][run], R * C);
      if (muon_create(&o, &d) != MUON_OK) { CHECK(0, "create"); return; }
      m.param = w[shape][run]; m.grad = g; m.rows = rows; m.cols = cols;
      CHECK(muon_add_matrix(o, &m, NULL) == MUON_OK && muon_step(o) == MUON_OK, "step: %s", muon_error(o));
      muon_destroy(o);
    }
    CHECK(memcmp(w[shape][0], w[shape][1], sizeof w[shape][0]) == 0, "%d x %d: SPECTRAL_UNCLAMPED differs from lr*sqrt(rows/cols)", rows, cols);
  }
}

static void test_orthogonality(void) {
  /* Sanity independent of any reference: NS output's singular values land near 1, so
     O O^T (wide) has a diagonal in roughly [0.5, 1.5] and small off-diagonal terms. */
  enum { R = 32, C = 96 };
  static float g[R * C], o[R * C];
  muon_hparams hp = muon_default_hparams();
  int i, j, k, ok = 1;
  TEST_CASE("NS output is nearly orthogonal (O O^T ~ I)");
  test_rng = 77;
  fill(g, R * C);
  CHECK(muon_newton_schulz(g, R, C, o, &hp) == MUON_OK, "ns");
  for (i = 0; i < R; i++)
    for (j = 0; j < R; j++) {
      double s = 0;
      for (k = 0; k < C; k++) s += (double)o[i * C + k] * o[j * C + k];
      if (i == j && (s < 0.5 || s > 1.5)) ok = 0;
      if (i != j && fabs(s) > 0.3) ok = 0;
    }
  CHECK(ok, "O O^T far from identity");
}

/* muon_state_reshard on one device: the blob API, its argument checks, and the AdamW range. */
static void test_reshard_blobs(void) {
  model a, b;
  muon_optimizer *oa, *ob;
  size_t n;
  void *blob;
  const void *blobs[2];
  size_t sizes[2];
  TEST_CASE("muon_state_reshard of one device's blob equals muon_state_load (an AdamW param one step behind); bad arguments are MUON_ERR_ARG");
  model_init(&a, 11u);
  oa = make_opt(&a, NULL);
  run_steps(oa, &a, 0, 2);
  CHECK(muon_set_adamw_grad(oa, 0, NULL) == MUON_OK, "absent AdamW gradient");   /* its own step count lags */
  run_steps(oa, &a, 2, 3);
  CHECK(muon_set_adamw_grad(oa, 0, a.gb) == MUON_OK, "AdamW gradient back");
  n = muon_state_size(oa);
  blob = malloc(n);
  CHECK(muon_state_save(oa, blob, n) == MUON_OK, "save: %s", muon_error(oa));
  memcpy(&b, &a, sizeof b);
  ob = make_opt(&b, NULL);
  blobs[0] = blob; sizes[0] = n;
  CHECK(muon_state_reshard(ob, blobs, sizes, 0) == MUON_ERR_ARG && strstr(muon_error(ob), "n must be"), "n = 0: %s", muon_error(ob));
  CHECK(muon_state_reshard(ob, NULL, sizes, 1) == MUON_ERR_ARG, "blobs NULL");
  blobs[1] = NULL; sizes[1] = 0;
  CHECK(muon_state_reshard(ob, blobs, sizes, 2) == MUON_ERR_ARG && strstr(muon_error(ob), "blobs[1] is NULL"), "blobs[1] NULL: %s", muon_error(ob));
  blobs[1] = blob; sizes[1] = n;
  CHECK(muon_state_reshard(ob, blobs, sizes, 2) == MUON_ERR_STATE && strstr(muon_error(ob), "2 blobs were given"), "two blobs of a world of one: %s", muon_error(ob));
  CHECK(muon_state_reshard_files(ob, NULL, 1) == MUON_ERR_ARG, "paths NULL");
  CHECK(muon_state_reshard(ob, blobs, sizes, 1) == MUON_OK, "reshard: %s", muon_error(ob));
  run_steps(oa, &a, 3, 6);
  run_steps(ob, &b, 3, 6);
  CHECK(same(&a, &b, sizeof a), "resumed run differs from the uninterrupted one");
  free(blob);
  muon_destroy(oa);
  muon_destroy(ob);

  TEST_CASE("muon_adamw_param.offset / full_size: a range outside the parameter is MUON_ERR_SHAPE");
  {
    static float x[8];
    muon_desc d = muon_default_desc();
    muon_adamw_param p = muon_default_adamw_param();
    muon_create(&oa, &d);
    p.name = "x"; p.param = x; p.size = 8; p.offset = 4; p.full_size = 10;
    CHECK(muon_add_adamw_param(oa, &p, NULL) == MUON_ERR_SHAPE && strstr(muon_error(oa), "full_size"), "past the end: %s", muon_error(oa));
    p.full_size = 0;
    CHECK(muon_add_adamw_param(oa, &p, NULL) == MUON_ERR_SHAPE, "an offset without full_size");
    p.offset = 2; p.full_size = 10;
    CHECK(muon_add_adamw_param(oa, &p, NULL) == MUON_OK && muon_adamw_param_count(oa) == 1, "a range that fits: %s", muon_error(oa));
    muon_destroy(oa);
  }
}

/* Cautious weight decay: settings checked, refused by a compute backend that predates it, kept
   in the state, and the decay applied only where the weight and the update agree in sign. */
static void test_cautious(void) {
  muon_desc d = muon_default_desc();
  muon_optimizer *o = NULL;
  muon_hparams hp = muon_default_hparams();
  muon_adamw_hparams ah = muon_default_adamw_hparams();
  muon_compute other = muon_compute_cpu();
  muon_compute_vtable later = *other.vt;
  TEST_CASE("cautious_wd: 0/1 only, naming the field; saved and loaded with the group. A compute vtable of version 0 or newer than this muon.h is refused with both numbers");
  d.hparams.cautious_wd = 2;
  CHECK(muon_create(&o, &d) == MUON_ERR_ARG && strstr(muon_error(NULL), "muon_hparams.cautious_wd"), "2: %s", muon_error(NULL));
  d.hparams.cautious_wd = 0;
  d.adamw.cautious_wd = -1;
  CHECK(muon_create(&o, &d) == MUON_ERR_ARG && strstr(muon_error(NULL), "muon_adamw_hparams.cautious_wd"), "-1: %s", muon_error(NULL));
  d.adamw.cautious_wd = 1;
  later.version = MUON_COMPUTE_VTABLE_VERSION + 1;
  other.vt = &later;
  d.compute = &other;
  CHECK(muon_create(&o, &d) == MUON_ERR_ARG && strstr(muon_error(NULL), "version is 2, this muon.h takes 1 to 1"), "a newer table: %s", muon_error(NULL));
  later.version = 0;
  CHECK(muon_create(&o, &d) == MUON_ERR_ARG && strstr(muon_error(NULL), "version is 0"), "version 0: %s", muon_error(NULL));
  hp.cautious_wd = 1;
  ah.cautious_wd = 1;
  d.compute = NULL;
  CHECK(muon_create(&o, &d) == MUON_OK && muon_set_group(o, 0, &hp) == MUON_OK && muon_add_adamw_group(o, &ah, NULL) == MUON_OK,
        "the CPU backend takes it: %s", muon_error(o));
  {
    static float w[6 * 8], g[6 * 8];
    muon_matrix m = muon_default_matrix();
    muon_optimizer *b = NULL;
    size_t n;
    void *blob;
    muon_hparams got;
    memset(&got, 0, sizeof got);
    m.name = "w"; m.param = w; m.grad = g; m.rows = 6; m.cols = 8;
    muon_add_matrix(o, &m, NULL);
    n = muon_state_size(o);
    blob = malloc(n);
    CHECK(muon_state_save(o, blob, n) == MUON_OK, "save");
    muon_create(&b, &d);
    muon_add_adamw_group(b, &d.adamw, NULL);
    muon_add_matrix(b, &m, NULL);
    CHECK(muon_state_load(b, blob, n) == MUON_OK && muon_get_group(b, 0, &got) == MUON_OK && got.cautious_wd == 1, "loaded cautious_wd %d: %s", got.cautious_wd, muon_error(b));
    free(blob);
    muon_destroy(b);
  }
  muon_destroy(o);

  TEST_CASE("ns_algorithm / ns_restarts: unknown algorithm, a restart at 0 or past ns_steps: MUON_ERR_ARG naming the field");
  {
    muon_hparams h = muon_default_hparams();
    static float in[4 * 12], out[4 * 12];
    int k;
    for (k = 0; k < 48; k++) in[k] = (float)((k * 7) % 11) - 5.0f;
    h.ns_algorithm = (muon_ns_algorithm)7;
    d = muon_default_desc();
    d.hparams = h;
    CHECK(muon_create(&o, &d) == MUON_ERR_ARG && strstr(muon_error(NULL), "muon_hparams.ns_algorithm"), "algorithm 7: %s", muon_error(NULL));
    h.ns_algorithm = MUON_NS_GRAM;
    h.ns_restarts = 1u;
    CHECK(muon_newton_schulz(in, 4, 12, out, &h) == MUON_ERR_ARG, "a restart at iteration 0");
    d.hparams = h;
    CHECK(muon_create(&o, &d) == MUON_ERR_ARG && strstr(muon_error(NULL), "muon_hparams.ns_restarts"), "restart 0: %s", muon_error(NULL));
    h.ns_restarts = 1u << 5;   /* ns_steps is 5: iterations 0..4 */
    d.hparams = h;
    CHECK(muon_create(&o, &d) == MUON_ERR_ARG && strstr(muon_error(NULL), "ns_restarts") && strstr(muon_error(NULL), "ns_steps = 5"), "restart 5: %s", muon_error(NULL));
    h.ns_restarts = 1u << 4;
    d.hparams = h;
    CHECK(muon_create(&o, &d) == MUON_OK, "the CPU backend takes it: %s", muon_error(NULL));
    muon_destroy(o);
    CHECK(muon_newton_schulz(in, 4, 12, out, &h) == MUON_OK, "muon_newton_schulz with Gram");
    h.ns_restarts = 1u << 9;   /* restarts are not checked for the standard iteration */
    h.ns_algorithm = MUON_NS_STANDARD;
    CHECK(muon_newton_schulz(in, 4, 12, out, &h) == MUON_OK, "standard ignores ns_restarts");
  }

  TEST_CASE("cautious_wd: a weight whose sign opposes O keeps its value before the step; one that agrees (or is zero) decays");
  {
    /* A 1 x 4 matrix: O of a rank-1 row is its direction (Newton-Schulz maps u to ~u/|u|), so the
       signs of O are the gradient's. */
    static float w[4], g[4], w0[4] = { 0.5f, -0.5f, 0.5f, 0.0f }, gr[4] = { 1.0f, 1.0f, -1.0f, 1.0f };
    muon_matrix m = muon_default_matrix();
    muon_hparams c = muon_default_hparams();
    float plain[4];
    int k, pass;
    for (pass = 0; pass < 2; pass++) {
      memcpy(w, w0, sizeof w);
      memcpy(g, gr, sizeof g);
      d = muon_default_desc();
      d.hparams.lr = 0.1f;
      d.hparams.weight_decay = 0.5f;
      d.hparams.cautious_wd = pass;
      muon_create(&o, &d);
      m.name = "row"; m.param = w; m.grad = g; m.rows = 1; m.cols = 4;
      muon_add_matrix(o, &m, NULL);
      CHECK(muon_step(o) == MUON_OK, "step: %s", muon_error(o));
      if (!pass) { memcpy(plain, w, sizeof w); muon_destroy(o); continue; }
      /* element 0: w > 0, O > 0 agree -> decayed like plain; 1: w < 0, O > 0 disagree -> not
         decayed, so it ends lr*wd*|w| higher than plain; 2: w > 0, O < 0 disagree; 3: w = 0 */
      CHECK(w[0] == plain[0] && w[3] == plain[3], "agreeing / zero elements: %g vs %g, %g vs %g", (double)w[0], (double)plain[0], (double)w[3], (double)plain[3]);
      CHECK(w[1] != plain[1] && w[2] != plain[2], "opposing elements were decayed");
      for (k = 1; k < 3; k++)
        CHECK(fabs((double)(w[k] - plain[k]) - (double)w0[k] * 0.05) < 1e-6, "element %d: %g - %g != w0 * lr * wd", k, (double)w[k], (double)plain[k]);
      (void)c;
      muon_destroy(o);
    }
  }
}

/* Two optimizers, one matrix each, `steps` steps of the same gradients; returns the params. */
static void normuon_run(muon_optimizer *o, float *w, float *g, int steps, unsigned seed) {
  int k;
  for (k = 0; k < steps; k++) {
    test_rng = seed + (unsigned)k;
    fill(g, 7 * 12);
    muon_set_grad(o, 0, g);
    CHECK(muon_step(o) == MUON_OK, "step: %s", muon_error(o));
  }
  (void)w;
}

static void test_normuon(void) {
  muon_desc d = muon_default_desc();
  muon_optimizer *a = NULL, *b = NULL, *c = NULL;
  muon_compute old = muon_compute_cpu();
  muon_compute_vtable v3 = *old.vt;
  muon_hparams hp;
  static float w0[7 * 12], wa[7 * 12], wb[7 * 12], wc[7 * 12], g[7 * 12];
  muon_matrix m = muon_default_matrix();
  size_t n;
  void *blob;
  TEST_CASE("normuon: a muon_normuon and beta2 in [0, 1), naming the field; a compute backend without the normuon slot is refused");
  d.hparams.normuon = (muon_normuon)3;
  CHECK(muon_create(&a, &d) == MUON_ERR_ARG && strstr(muon_error(NULL), "muon_hparams.normuon is not"), "3: %s", muon_error(NULL));
  d.hparams.normuon = MUON_NORMUON_ROWS;
  d.hparams.normuon_beta2 = 1.0f;
  CHECK(muon_create(&a, &d) == MUON_ERR_ARG && strstr(muon_error(NULL), "muon_hparams.normuon_beta2 must be in [0, 1) (got 1)"), "1: %s", muon_error(NULL));
  d.hparams.normuon_beta2 = -0.5f;
  CHECK(muon_create(&a, &d) == MUON_ERR_ARG && strstr(muon_error(NULL), "normuon_beta2"), "-0.5: %s", muon_error(NULL));
  d.hparams.normuon_beta2 = 0.0f / 0.0f;
  CHECK(muon_create(&a, &d) == MUON_ERR_ARG && strstr(muon_error(NULL), "normuon_beta2"), "NaN: %s", muon_error(NULL));
  d.hparams.normuon_beta2 = 0.95f;
  v3.normuon = NULL;
  old.vt = &v3;
  d.compute = &old;
  CHECK(muon_create(&a, &d) == MUON_ERR_ARG && strstr(muon_error(NULL), "lacks a required slot"), "without the slot: %s", muon_error(NULL));
  d.compute = NULL;
  CHECK(muon_create(&a, &d) == MUON_OK, "the CPU backend: %s", muon_error(NULL));
  hp = muon_default_hparams();
  hp.normuon = MUON_NORMUON_LARGER;
  hp.normuon_beta2 = 2.0f;
  CHECK(muon_set_group(a, 0, &hp) == MUON_ERR_ARG && strstr(muon_error(a), "normuon_beta2"), "set_group: %s", muon_error(a));
  muon_get_group(a, 0, &hp);
  CHECK(hp.normuon == MUON_NORMUON_ROWS && hp.normuon_beta2 == 0.95f, "a refused muon_set_group changed the group");
  muon_destroy(a);

  TEST_CASE("normuon: changes the update; saved and loaded, a resumed run is bitwise the uninterrupted one");
  test_rng = 31;
  fill(w0, 7 * 12);
  memcpy(wa, w0, sizeof w0); memcpy(wb, w0, sizeof w0); memcpy(wc, w0, sizeof w0);
  m.name = "w"; m.rows = 7; m.cols = 12; m.grad = g;
  d.hparams.lr = 0.05f;
  d.hparams.normuon = MUON_NORMUON_OFF;
  muon_create(&c, &d);
  m.param = wc; muon_add_matrix(c, &m, NULL);
  d.hparams.normuon = MUON_NORMUON_LARGER;
  muon_create(&a, &d);
  muon_create(&b, &d);
  m.param = wa; muon_add_matrix(a, &m, NULL);
  m.param = wb; muon_add_matrix(b, &m, NULL);
  normuon_run(a, wa, g, 3, 100);
  normuon_run(c, wc, g, 3, 100);
  CHECK(memcmp(wa, wc, sizeof wa) != 0, "NorMuon gave plain Muon's bits");
  n = muon_state_size(a);
  blob = malloc(n);
  CHECK(n == muon_state_size(c) + 4 * 12, "the state holds 12 floats of second moment (wide: per column): %zu vs %zu", n, muon_state_size(c));
  CHECK(muon_state_save(a, blob, n) == MUON_OK, "save: %s", muon_error(a));
  memcpy(wb, wa, sizeof wa);
  CHECK(muon_state_load(b, blob, n) == MUON_OK, "load: %s", muon_error(b));
  normuon_run(a, wa, g, 2, 200);
  normuon_run(b, wb, g, 2, 200);
  CHECK(memcmp(wa, wb, sizeof wa) == 0, "resumed run differs");
  {   /* the same resume with the second moment zeroed in the blob must differ: it is used */
    unsigned char *q = (unsigned char *)blob;
    size_t k, at = n - 8 - 4 * 12;
    uint64_t sum;
    muon_destroy(b);
    muon_create(&b, &d);
    memcpy(wb, wa, sizeof wa);
    m.param = wb; muon_add_matrix(b, &m, NULL);
    CHECK(q[at - 4] == 12 && q[at - 3] == 0, "the length 12 sits before the second moment");
    memset(q + at, 0, 4 * 12);
    sum = muon__fnv1a(q, n - 8);
    for (k = 0; k < 8; k++) q[n - 8 + k] = (unsigned char)(sum >> (8 * k));
    CHECK(muon_state_load(b, blob, n) == MUON_OK, "load: %s", muon_error(b));
    q[at + 3] = 0x80;   /* -0.0 is fine, -1e-38 is not */
    q[at] = 1;
    sum = muon__fnv1a(q, n - 8);
    for (k = 0; k < 8; k++) q[n - 8 + k] = (unsigned char)(sum >> (8 * k));
    CHECK(muon_state_load(b, blob, n) == MUON_ERR_STATE && strstr(muon_error(b), "NorMuon second moment of matrix 'w' holds NaN, Inf or a negative"),
          "negative second moment: %s", muon_error(b));
  }
  free(blob);

  TEST_CASE("normuon: an absent gradient leaves the second moment as it was");
  {
    const float *mom;
    size_t mn;
    static float wd[7 * 12], we[7 * 12];
    muon_optimizer *e = NULL, *f = NULL;
    memcpy(wd, w0, sizeof w0); memcpy(we, w0, sizeof w0);
    muon_create(&e, &d); muon_create(&f, &d);
    m.param = wd; muon_add_matrix(e, &m, NULL);
    m.param = we; muon_add_matrix(f, &m, NULL);
    normuon_run(e, wd, g, 2, 300);
    normuon_run(f, we, g, 2, 300);
    muon_set_grad(e, 0, NULL);
    CHECK(muon_step(e) == MUON_OK, "step without a gradient: %s", muon_error(e));
    normuon_run(e, wd, g, 1, 400);
    normuon_run(f, we, g, 1, 400);
    CHECK(memcmp(wd, we, sizeof wd) == 0, "the skipped step changed the second moment (or something else)");
    CHECK(muon_get_momentum(e, 0, &mom, &mn) == MUON_OK && mn == 84, "momentum");
    muon_destroy(e); muon_destroy(f);
  }

  TEST_CASE("normuon: turned on mid-run (a state saved without it) starts at zero and says so through the logger");
  {
    muon_desc dl = d;
    muon_optimizer *h = NULL;
    static float wh[7 * 12];
    memcpy(wh, w0, sizeof w0);
    dl.hparams.normuon = MUON_NORMUON_OFF;
    dl.logger.func = capture_warn;
    muon_create(&h, &dl);
    m.param = wh; muon_add_matrix(h, &m, NULL);
    normuon_run(h, wh, g, 2, 500);
    hp = muon_default_hparams();
    muon_get_group(h, 0, &hp);
    hp.normuon = MUON_NORMUON_ROWS;
    CHECK(muon_set_group(h, 0, &hp) == MUON_OK, "set_group: %s", muon_error(h));
    last_log[0] = '\0';
    normuon_run(h, wh, g, 1, 600);
    CHECK(strstr(last_log, "NorMuon second moment of matrix 'w' starts at zero at step 2") != NULL, "log: '%s'", last_log);
    hp.normuon = MUON_NORMUON_LARGER;   /* another axis: another length, again from zero */
    CHECK(muon_set_group(h, 0, &hp) == MUON_OK, "set_group: %s", muon_error(h));
    last_log[0] = '\0';
    normuon_run(h, wh, g, 1, 700);
    CHECK(strstr(last_log, "starts at zero at step 3") != NULL, "log after changing the axis: '%s'", last_log);
    hp.normuon = MUON_NORMUON_OFF;
    CHECK(muon_set_group(h, 0, &hp) == MUON_OK && muon_step(h) == MUON_OK, "off again: %s", muon_error(h));
    CHECK(muon_state_size(h) == muon_state_size(c), "turned off, the second moment is dropped");
    muon_destroy(h);
  }
  TEST_CASE("normuon: a state saved without NorMuon, loaded over a NorMuon run, leaves no second moment behind: saved again, it loads (found by fuzzing)");
  {
    size_t nc = muon_state_size(c), n2;
    unsigned char *bc = (unsigned char *)malloc(nc), *b2;
    CHECK(muon_state_save(c, bc, nc) == MUON_OK && muon_state_load(a, bc, nc) == MUON_OK, "load the plain state: %s", muon_error(a));
    n2 = muon_state_size(a);
    b2 = (unsigned char *)malloc(n2);
    CHECK(n2 == nc && muon_state_save(a, b2, n2) == MUON_OK && memcmp(b2, bc, nc) == 0, "saved again it differs (%zu vs %zu bytes)", n2, nc);
    CHECK(muon_state_load(a, b2, n2) == MUON_OK, "and it loads: %s", muon_error(a));
    CHECK(muon_step(a) == MUON_OK && muon_state_size(a) == nc, "a step after: %s", muon_error(a));
    free(bc); free(b2);
  }
  muon_destroy(a);
  muon_destroy(b);
  muon_destroy(c);
}

/* An optimizer of n_mat matrices (6x10, 12x8, 5x5) and n_aw AdamW params (24 floats each, the
   last one aw_last floats), with n_groups Muon groups; its buffers are static per slot. */
static muon_optimizer *guard_opt(int n_mat, int n_aw, int aw_last, int n_groups, float (*w)[120], float (*p)[40]) {
  static const int shape[3][2] = { { 6, 10 }, { 12, 8 }, { 5, 5 } };
  static const char *mname[3] = { "m0", "m1", "m2" }, *aname[3] = { "a0", "a1", "a2" };
  static float g[120], pg[40];
  muon_desc d = muon_default_desc();
  muon_optimizer *o = NULL;
  int i;
  if (muon_create(&o, &d) != MUON_OK) return NULL;
  for (i = 1; i < n_groups; i++) { muon_hparams hp = muon_default_hparams(); muon_add_group(o, &hp, NULL); }
  test_rng = 77;
  fill(g, 120); fill(pg, 40);
  for (i = 0; i < n_mat; i++) {
    muon_matrix m = muon_default_matrix();
    m.name = mname[i]; m.param = w[i]; m.grad = g; m.rows = shape[i][0]; m.cols = shape[i][1];
    if (muon_add_matrix(o, &m, NULL) != MUON_OK) return NULL;
  }
  for (i = 0; i < n_aw; i++) {
    muon_adamw_param a = muon_default_adamw_param();
    a.name = aname[i]; a.param = p[i]; a.grad = pg; a.size = i == n_aw - 1 ? (size_t)aw_last : 24;
    if (muon_add_adamw_param(o, &a, NULL) != MUON_OK) return NULL;
  }
  return o;
}

static void test_state_guards(void) {
  static float wa[3][120], pa[3][40], wb[3][120], pb[3][40], wb0[3][120], pb0[3][40];
  static const struct { int n_mat, n_aw, aw_last, n_groups; const char *want; } v[] = {
    { 3, 2, 24, 1, "state has 2 matrices and 2 AdamW params, the optimizer 3 and 2" },
    { 1, 2, 24, 1, "state has 2 matrices and 2 AdamW params, the optimizer 1 and 2" },
    { 2, 3, 24, 1, "state has 2 matrices and 2 AdamW params, the optimizer 2 and 3" },
    { 2, 1, 24, 1, "state has 2 matrices and 2 AdamW params, the optimizer 2 and 1" },
    { 2, 2, 30, 1, "AdamW param 1 ('a1') has 30 floats, the state 24" },
    { 2, 2, 24, 2, "state has 1 groups and 1 AdamW groups, the optimizer 2 and 1" },
  };
  muon_optimizer *a;
  unsigned char *blob, *before, *after;
  size_t n, nb, k;
  int i;
  TEST_CASE("state-load guards for a changed model: extra/missing matrix or AdamW param, a resized AdamW param, another group count; each names what differs and changes nothing");
  test_rng = 5;
  for (i = 0; i < 3; i++) { fill(wa[i], 120); fill(pa[i], 40); }
  a = guard_opt(2, 2, 24, 1, wa, pa);
  CHECK(a && muon_step(a) == MUON_OK && muon_step(a) == MUON_OK, "reference steps: %s", muon_error(a));
  n = muon_state_size(a);
  blob = (unsigned char *)malloc(n);
  CHECK(muon_state_save(a, blob, n) == MUON_OK, "save: %s", muon_error(a));
  for (k = 0; k < sizeof v / sizeof v[0]; k++) {
    muon_optimizer *b;
    test_rng = 9;
    for (i = 0; i < 3; i++) { fill(wb[i], 120); fill(pb[i], 40); }
    b = guard_opt(v[k].n_mat, v[k].n_aw, v[k].aw_last, v[k].n_groups, wb, pb);
    if (!b) { CHECK(0, "case %zu: building the model failed", k); continue; }
    CHECK(muon_step(b) == MUON_OK, "case %zu: step: %s", k, muon_error(b));
    memcpy(wb0, wb, sizeof wb); memcpy(pb0, pb, sizeof pb);
    nb = muon_state_size(b);
    before = (unsigned char *)malloc(nb);
    after = (unsigned char *)malloc(nb);
    muon_state_save(b, before, nb);
    CHECK(muon_state_load(b, blob, n) == MUON_ERR_STATE && strstr(muon_error(b), v[k].want),
          "case %zu: want '%s', got: %s", k, v[k].want, muon_error(b));
    CHECK(muon_state_size(b) == nb && muon_state_save(b, after, nb) == MUON_OK && memcmp(before, after, nb) == 0,
          "case %zu: the refused load changed the optimizer's state", k);
    CHECK(memcmp(wb, wb0, sizeof wb) == 0 && memcmp(pb, pb0, sizeof pb) == 0, "case %zu: the refused load changed parameters", k);
    CHECK(muon_step(b) == MUON_OK, "case %zu: the optimizer is still usable: %s", k, muon_error(b));
    free(before); free(after);
    muon_destroy(b);
  }
  free(blob);
  muon_destroy(a);
}

/* Two AdamW params, "b" without a gradient at step 1, so its step count trails the optimizer's:
   saved after 3 steps and resumed for 2 more, bitwise the run that never stopped. */
static void adamw_resume_run(muon_optimizer *o, float *g, int from, int to) {
  int k;
  for (k = from; k < to; k++) {
    test_rng = 900u + (unsigned)k;
    fill(g, 40);
    CHECK(muon_set_adamw_grad(o, 0, g) == MUON_OK && muon_set_adamw_grad(o, 1, k == 1 ? NULL : g + 20) == MUON_OK, "set_adamw_grad");
    CHECK(muon_step(o) == MUON_OK, "step %d: %s", k, muon_error(o));
  }
}

static void test_adamw_resume_absent(void) {
  static float pa[2][20], pb[2][20], pc[2][20], g[40];
  muon_desc d = muon_default_desc();
  muon_optimizer *a = NULL, *b = NULL, *c = NULL;
  muon_adamw_param p = muon_default_adamw_param();
  size_t n;
  void *blob;
  int i;
  TEST_CASE("AdamW: a resume after an absent gradient (per-param step counts) is bitwise the run that never stopped");
  test_rng = 17;
  fill(pa[0], 20); fill(pa[1], 20);
  memcpy(pb, pa, sizeof pa);
  d.adamw.lr = 0.05f;
  muon_create(&a, &d); muon_create(&b, &d); muon_create(&c, &d);
  for (i = 0; i < 2; i++) {
    p.name = i ? "b" : "a"; p.size = 20; p.grad = g;
    p.param = pa[i]; muon_add_adamw_param(a, &p, NULL);
    p.param = pb[i]; muon_add_adamw_param(b, &p, NULL);
    p.param = pc[i]; muon_add_adamw_param(c, &p, NULL);
  }
  adamw_resume_run(a, g, 0, 5);
  adamw_resume_run(b, g, 0, 3);
  n = muon_state_size(b);
  blob = malloc(n);
  CHECK(muon_state_save(b, blob, n) == MUON_OK, "save: %s", muon_error(b));
  memcpy(pc, pb, sizeof pb);
  CHECK(muon_state_load(c, blob, n) == MUON_OK, "load: %s", muon_error(c));
  adamw_resume_run(c, g, 3, 5);
  CHECK(memcmp(pa, pc, sizeof pa) == 0, "the resumed run differs from the uninterrupted one");
  free(blob);
  muon_destroy(a); muon_destroy(b); muon_destroy(c);
}

/* SQLite-style: the k-th allocation fails, for k = 0, 1, ... through create, registration, the
   planning step, a second step, state save and load (NorMuon on, so its second moments are
   allocated too). Every failure is MUON_ERR_NOMEM with a message; a failed step or load leaves
   parameters and state bitwise as they were; the same call retried succeeds (the allocator
   fails once), and the run then ends bitwise where a run without failures ends; nothing leaks. */
static int sweep_run(model *m, int fail_at, unsigned char *blob, size_t cap, size_t *blob_n, int *sites, int *bad) {
  fail_alloc fa = { 0, 0, 0 };
  muon_desc d = muon_default_desc();
  muon_optimizer *opt = NULL;
  static model snap;
  static unsigned char before[1 << 16], after[1 << 16];
  muon_status st;
  int call, failed = 0;
  size_t nb = 0, na = 0;
  fa.fail_at = fail_at;
  d.allocator.alloc = fa_alloc;
  d.allocator.free = fa_free;
  d.allocator.user_data = &fa;
  d.hparams.normuon = MUON_NORMUON_LARGER;
  model_init(m, 7);
  st = muon_create(&opt, &d);
  if (st == MUON_OK) st = model_register(opt, m);
  if (st != MUON_OK) {   /* create and registration: an error, then nothing to retry */
    failed = 1;
    if (st != MUON_ERR_NOMEM || !muon_error(opt)[0]) { (*bad)++; printf("  site %d: create/register gave %s\n", fail_at, muon_status_string(st)); }
    muon_destroy(opt);
    if (fa.live != 0) { (*bad)++; printf("  site %d: %ld blocks leaked\n", fail_at, fa.live); }
    (*sites)++;
    return failed;
  }
  for (call = 0; call < 3; call++) {
    int attempt;
    for (attempt = 0; attempt < 2; attempt++) {
      if (call < 2) model_grads(m, 8u + (unsigned)call);
      memcpy(&snap, m, sizeof snap);
      nb = muon_state_size(opt);
      if (nb > sizeof before || muon_state_save(opt, before, nb) != MUON_OK) { (*bad)++; printf("  site %d: snapshot failed\n", fail_at); }
      if (call < 2) st = muon_step(opt);
      else {
        *blob_n = muon_state_size(opt);
        st = *blob_n <= cap ? muon_state_save(opt, blob, *blob_n) : MUON_ERR_ARG;
        if (st == MUON_OK) st = muon_state_load(opt, blob, *blob_n);
      }
      if (st == MUON_OK) break;
      failed = 1;
      if (st != MUON_ERR_NOMEM || !strstr(muon_error(opt), "failed")) {
        (*bad)++; printf("  site %d, call %d: %s: %s\n", fail_at, call, muon_status_string(st), muon_error(opt));
      }
      na = muon_state_size(opt);
      if (memcmp(&snap, m, sizeof snap) != 0) { (*bad)++; printf("  site %d, call %d: a failed call changed parameters\n", fail_at, call); }
      if (na != nb || muon_state_save(opt, after, na) != MUON_OK || memcmp(before, after, nb) != 0) {
        (*bad)++; printf("  site %d, call %d: a failed call changed the state\n", fail_at, call);
      }
    }
    if (st != MUON_OK) { (*bad)++; printf("  site %d, call %d: the retry failed too: %s\n", fail_at, call, muon_error(opt)); break; }
  }
  muon_destroy(opt);
  if (fa.live != 0) { (*bad)++; printf("  site %d: %ld blocks leaked\n", fail_at, fa.live); }
  if (failed) (*sites)++;
  return failed || fa.calls > fail_at;
}

static void test_alloc_sweep(void) {
  static model ref, m;
  static unsigned char blob_ref[1 << 16], blob[1 << 16];
  size_t n_ref = 0, n = 0;
  int k, sites = 0, bad = 0, ends_differ = 0;
  TEST_CASE("allocation failure swept through create, registration, plan, steps, save and load (NorMuon on): NOMEM, nothing changed, the retry ends bitwise as a clean run, no leak");
  sweep_run(&ref, -1, blob_ref, sizeof blob_ref, &n_ref, &k, &bad);   /* the clean run */
  sites = 0;
  for (k = 0; k < 400; k++) {
    n = 0;
    if (!sweep_run(&m, k, blob, sizeof blob, &n, &sites, &bad)) break;   /* k is past the last allocation */
    /* a run that got past registration retried its failure and must end as the clean run */
    if (n && (n != n_ref || memcmp(&m, &ref, sizeof m) != 0 || memcmp(blob, blob_ref, n) != 0)) ends_differ++;
  }
  printf("  allocation failure injected at %d sites in turn\n", sites);
  CHECK(sites >= 12, "only %d allocation sites were exercised", sites);
  CHECK(bad == 0, "%d problems (listed above)", bad);
  CHECK(ends_differ == 0, "%d runs with a retried failure ended elsewhere than the clean run", ends_differ);
}

/* The CPU backend's apply slot at the signs of zero (tests/cautious.h): every (w, O) of +-0,
   +-1e-30 and larger values, bitwise the cautious_wd formula; fp32, one element per case. */
static void test_cautious_zeros(void) {
  muon_compute c;
  muon_cpu_desc cd = muon_cpu_default_desc();
  muon_apply_args a;
  float w[CAUTIOUS_N], o[CAUTIOUS_N];
  int i;
  TEST_CASE("cautious weight decay with weights and updates of +0 and -0: decays exactly where w*O >= 0");
  if (muon_cpu_create(&c, &cd) != MUON_OK) { CHECK(0, "muon_cpu_create: %s", muon_error(NULL)); return; }
  cautious_args(&a);
  for (i = 0; i < CAUTIOUS_N; i++) cautious_case(i, &w[i], &o[i]);
  CHECK(c.vt->apply(c.ctx, CAUTIOUS_N, w, o, &a) == MUON_OK && c.vt->sync(c.ctx) == MUON_OK, "apply");
  for (i = 0; i < CAUTIOUS_N; i++) {
    float w0, o0, want;
    cautious_case(i, &w0, &o0);
    want = cautious_ref(w0, o0, a.decay, a.step);
    CHECK(memcmp(&w[i], &want, 4) == 0, "w %g, O %g: got %a, want %a (w*O %s 0)", (double)w0, (double)o0,
          (double)w[i], (double)want, (double)w0 * o0 >= 0 ? ">=" : "<");
  }
  muon_compute_destroy(&c);
}

/* Every field of muon.h's settings lists (tests/settings.h) survives the state blob: saved with
   its non-default value, it comes back through muon_state_load and muon_state_reshard into a
   fresh optimizer with defaults. And every field of the two structs is in a list. */
static void test_settings_saved(void) {
  int list, i;
  TEST_CASE("every listed hyperparameter survives save, load and reshard; every field of the structs is listed");
  CHECK(tset_bytes(TSET_HPARAMS, TSET_N(TSET_HPARAMS)) == sizeof(muon_hparams),
        "muon_hparams has %zu bytes, its list %zu: a field is missing from MUON__HPARAMS_FIELDS", sizeof(muon_hparams),
        tset_bytes(TSET_HPARAMS, TSET_N(TSET_HPARAMS)));
  CHECK(tset_bytes(TSET_ADAMW, TSET_N(TSET_ADAMW)) == sizeof(muon_adamw_hparams),
        "muon_adamw_hparams has %zu bytes, its list %zu: a field is missing from MUON__ADAMW_FIELDS",
        sizeof(muon_adamw_hparams), tset_bytes(TSET_ADAMW, TSET_N(TSET_ADAMW)));
  for (list = 0; list < 2; list++)
    for (i = 0; i < (list ? TSET_N(TSET_ADAMW) : TSET_N(TSET_HPARAMS)); i++) {
      char name[64];
      muon_desc d = muon_default_desc(), def = d;
      model a, b;
      muon_optimizer *oa, *ob;
      void *blob;
      size_t n;
      int how;
      if (list) tset_field_text("muon_adamw_hparams", &TSET_ADAMW[i], name, sizeof name);
      else tset_field_text("muon_hparams", &TSET_HPARAMS[i], name, sizeof name);
      if (list) tset_adamw_alt(&d.adamw, i); else tset_hparams_alt(&d.hparams, i);
      CHECK(list ? memcmp(&d.adamw, &def.adamw, sizeof d.adamw) != 0
                 : memcmp(&d.hparams, &def.hparams, sizeof d.hparams) != 0,
            "%s: the list's value is the default", name);
      model_init(&a, 5u);
      if (!(oa = make_opt(&a, &d))) { CHECK(0, "%s: create with the list's value", name); continue; }
      n = muon_state_size(oa);
      blob = malloc(n);
      CHECK(muon_state_save(oa, blob, n) == MUON_OK, "%s: save: %s", name, muon_error(oa));
      for (how = 0; how < 2; how++) {
        const void *blobs[1];
        memcpy(&b, &a, sizeof b);
        ob = make_opt(&b, NULL);
        blobs[0] = blob;
        CHECK(ob && (how ? muon_state_reshard(ob, blobs, &n, 1) : muon_state_load(ob, blob, n)) == MUON_OK,
              "%s: %s: %s", name, how ? "reshard" : "load", ob ? muon_error(ob) : "create");
        if (ob && list)
          CHECK(memcmp(&ob->adamw_groups[0], &d.adamw, sizeof d.adamw) == 0,
                "%s did not survive %s", name, how ? "reshard" : "load");
        if (ob && !list) {   /* the momentum format stays the loader's: its buffers are in it */
          muon_hparams want = d.hparams;
          if (!strcmp(TSET_HPARAMS[i].name, "momentum_format")) want.momentum_format = def.hparams.momentum_format;
          CHECK(memcmp(&ob->groups[0], &want, sizeof want) == 0, "%s did not survive %s", name,
                how ? "reshard" : "load");
        }
        muon_destroy(ob);
      }
      free(blob);
      muon_destroy(oa);
    }
}


/* bf16 and 8-bit momentum (muon_hparams.momentum_format): the same bits as an fp32 run whose
   momentum (the trainer's buffer here) is narrowed after every step (bf16: nearest even; int8:
   blocks of 256 of each matrix, a power-of-two scale each), i.e. U from the fp32 value and only
   the stored copy narrowed; state round trips and conversions; bad values; the state's bytes.
   Each format's rule is written again here, apart from muon.h's. */
static uint16_t bf16_of(float x) {   /* nearest even, NaN kept: muon__bf16's rule, written again */
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float x; memcpy(&x, &u, 4); return x; }

/* MUON_MOMENTUM_INT8's rule written again with libm: per block of 256 the smallest e >= -126 with
   127 * 2^e >= absmax, q = |v| / 2^e to nearest even with v's sign; byte E = e + 127 first. */
static void q8_ref(const float *x, size_t n, unsigned char *out) {
  size_t lo, i;
  for (lo = 0; lo < n; lo += 256, out += 257) {
    size_t c = n - lo < 256 ? n - lo : 256;
    float amax = 0;
    int e = -126;
    for (i = 0; i < c; i++) if (fabsf(x[lo + i]) > amax) amax = fabsf(x[lo + i]);
    while (127.0f * ldexpf(1.0f, e) < amax) e++;
    out[0] = (unsigned char)(e + 127);
    for (i = 0; i < c; i++) {
      int q = (int)nearbyintf(ldexpf(fabsf(x[lo + i]), -e));
      out[1 + i] = (unsigned char)((signbit(x[lo + i]) ? -q : q) & 0xff);
    }
  }
}
static float q8_val(const unsigned char *b, size_t k) {
  const unsigned char *blk = b + k / 256 * 257;
  int q = blk[1 + k % 256];
  return blk[0] ? ldexpf((float)(q < 128 ? q : q - 256), blk[0] - 127) : 0.0f;
}

/* A matrix's n momentum values as the format stores them: their bytes in out; returns how many. */
static size_t narrow_ref(muon_momentum_format f, const float *x, size_t n, unsigned char *out) {
  size_t k;
  if (f == MUON_MOMENTUM_INT8) { q8_ref(x, n, out); return n + (n + 255) / 256; }
  for (k = 0; k < n; k++) { uint16_t h = bf16_of(x[k]); memcpy(out + 2 * k, &h, 2); }
  return 2 * n;
}
/* ... and the floats those bytes hold, in place. */
static void narrow_floats(muon_momentum_format f, float *x, size_t n, unsigned char *tmp) {
  size_t k;
  narrow_ref(f, x, n, tmp);
  for (k = 0; k < n; k++) {
    uint16_t h;
    memcpy(&h, tmp + 2 * k, 2);
    x[k] = f == MUON_MOMENTUM_INT8 ? q8_val(tmp, k) : from_bf16(h);
  }
}

static void test_momentum_narrow(muon_momentum_format f) {
  enum { N1 = 2 * 24 * 40, N2 = 50 * 16 };
  static float mom1[N1], mom2[N2];
  static unsigned char q[2 * N1 + 64], got[2 * N1 + 64];
  const char *fname = f == MUON_MOMENTUM_INT8 ? "int8" : "bf16";
  char title[160];
  model a, b, c;
  muon_desc d = muon_default_desc(), dn = muon_default_desc();
  muon_optimizer *oa = NULL, *ob = NULL, *oc = NULL;
  muon_matrix ma = muon_default_matrix(), mb = muon_default_matrix();
  muon_adamw_param p = muon_default_adamw_param(), pq = muon_default_adamw_param();
  muon_stats sa, sb;
  muon_hparams hp;
  const float *buf;
  const void *raw;
  muon_momentum_format fmt;
  size_t n, k, bad = 0, stored = 0;
  void *blob = NULL;
  int step, i;
  snprintf(title, sizeof title, "%s momentum: an fp32 run narrowed after every step, bit for bit; state; bad values", fname);
  TEST_CASE(title);
  dn.hparams.momentum_format = f;
  model_init(&a, f == MUON_MOMENTUM_INT8 ? 9u : 7u);
  memcpy(&b, &a, sizeof b);
  /* a: fp32 format with the trainer's momentum buffers, narrowed by hand after each step */
  if (muon_create(&oa, &d) != MUON_OK || muon_create(&ob, &dn) != MUON_OK) { CHECK(0, "create"); return; }
  ma.name = "w1"; ma.param = a.w1; ma.grad = a.g1; ma.rows = 24; ma.cols = 40; ma.count = 2; ma.momentum = mom1;
  mb.name = "w2"; mb.param = a.w2; mb.grad = a.g2; mb.rows = 50; mb.cols = 16; mb.momentum = mom2;
  p.name = "b"; p.param = a.b; p.grad = a.gb; p.size = 24;
  pq.name = "e"; pq.param = a.e; pq.grad = a.ge; pq.size = 10;
  CHECK(muon_add_matrix(oa, &ma, NULL) == MUON_OK && muon_add_matrix(oa, &mb, NULL) == MUON_OK &&
        muon_add_adamw_param(oa, &p, NULL) == MUON_OK && muon_add_adamw_param(oa, &pq, NULL) == MUON_OK,
        "register a: %s", muon_error(oa));
  CHECK(model_register(ob, &b) == MUON_OK, "register b: %s", muon_error(ob));
  for (step = 0; step < 6; step++) {
    model_grads(&a, (f == MUON_MOMENTUM_INT8 ? 200u : 100u) + (unsigned)step);
    model_grads(&b, (f == MUON_MOMENTUM_INT8 ? 200u : 100u) + (unsigned)step);
    CHECK(muon_step(oa) == MUON_OK && muon_step(ob) == MUON_OK, "step %d: %s %s", step, muon_error(oa), muon_error(ob));
    for (i = 0; i < 3; i++)   /* each matrix's blocks are its own */
      narrow_floats(f, i < 2 ? mom1 + (size_t)i * 24 * 40 : mom2, i < 2 ? 24u * 40 : (size_t)N2, q);
  }
  bad = !same(a.w1, b.w1, sizeof a.w1) + !same(a.w2, b.w2, sizeof a.w2) + !same(a.b, b.b, sizeof a.b);
  CHECK(bad == 0, "parameters differ from the narrowed fp32 run");
  for (i = 0; i < 3; i++) {
    const float *ref = i < 2 ? mom1 + (size_t)i * 24 * 40 : mom2;
    CHECK(muon_get_momentum_stored(ob, i, &raw, &n, &fmt) == MUON_OK && fmt == f &&
              n == (i < 2 ? 24u * 40 : (size_t)N2), "get_momentum_stored %d", i);
    k = narrow_ref(f, ref, n, q);
    stored += k;
    CHECK(same(raw, q, k), "matrix %d: the stored %s momentum differs from the rule's", i, fname);
  }
  CHECK(muon_get_momentum(ob, 0, &buf, &n) == MUON_ERR_ARG && !buf && !n, "muon_get_momentum of %s: not floats", fname);
  muon_get_stats(oa, &sa);
  muon_get_stats(ob, &sb);
  CHECK(sa.state_bytes - sb.state_bytes == 4 * (size_t)(N1 + N2) - stored, "state bytes %zu (fp32) vs %zu (%s)",
        sa.state_bytes, sb.state_bytes, fname);

  /* save narrow -> load into the same format (continues bit for bit) and into fp32 (the same values) */
  n = muon_state_size(ob);
  blob = malloc(n);
  CHECK(muon_state_save(ob, blob, n) == MUON_OK, "save: %s", muon_error(ob));
  memcpy(&c, &b, sizeof c);
  CHECK((oc = make_opt(&c, &dn)) != NULL && muon_state_load(oc, blob, n) == MUON_OK, "load %s", fname);
  model_grads(&b, 999u);
  model_grads(&c, 999u);
  CHECK(muon_step(ob) == MUON_OK && muon_step(oc) == MUON_OK, "step after load");
  CHECK(same(b.w1, c.w1, sizeof b.w1) && same(b.w2, c.w2, sizeof b.w2), "a loaded %s run continues bit for bit", fname);
  muon_destroy(oc);
  memcpy(&c, &a, sizeof c);
  CHECK((oc = make_opt(&c, NULL)) != NULL && muon_state_load(oc, blob, n) == MUON_OK, "load into fp32");
  CHECK(oc && muon_get_group(oc, 0, &hp) == MUON_OK && hp.momentum_format == MUON_MOMENTUM_FP32, "fp32 kept");
  CHECK(oc && muon_get_momentum(oc, 2, &buf, &k) == MUON_OK && k == N2, "fp32 momentum");
  for (k = 0, bad = 0; oc && k < N2; k++) bad += buf[k] != mom2[k];
  CHECK(bad == 0, "%s -> fp32 load: %zu values differ", fname, bad);
  /* and an fp32 blob into the narrow format narrows by the rule */
  free(blob);
  n = muon_state_size(oc);
  blob = malloc(n);
  if (oc && muon_get_momentum(oc, 2, &buf, &k) == MUON_OK)   /* values the format cannot hold (host memory) */
    for (k = 0; k < N2; k++) ((float *)(uintptr_t)buf)[k] = mom2[k] = mom2[k] * 1.0009765625f + 1e-9f * (float)k;
  CHECK(oc && muon_state_save(oc, blob, n) == MUON_OK, "save fp32");
  muon_destroy(oc);
  memcpy(&c, &a, sizeof c);
  CHECK((oc = make_opt(&c, &dn)) != NULL && muon_state_load(oc, blob, n) == MUON_OK, "fp32 -> %s load", fname);
  CHECK(oc && muon_get_momentum_stored(oc, 2, &raw, &k, &fmt) == MUON_OK && fmt == f && k == N2, "get");
  k = narrow_ref(f, mom2, N2, got);
  CHECK(oc && same(raw, got, k), "fp32 -> %s load: not the rule's bytes", fname);
  muon_destroy(oc);
  free(blob);

  /* bad values, each naming the field; nothing registered */
  CHECK(muon_get_group(ob, 0, &hp) == MUON_OK, "get_group");
  hp.momentum_format = MUON_MOMENTUM_FP32;
  CHECK(muon_set_group(ob, 0, &hp) == MUON_ERR_ARG && strstr(muon_error(ob), "muon_hparams.momentum_format"),
        "changing a used group's format: %s", muon_error(ob));
  hp.momentum_format = (muon_momentum_format)3;
  CHECK(muon_add_group(ob, &hp, NULL) == MUON_ERR_ARG && strstr(muon_error(ob), "muon_hparams.momentum_format"),
        "format 3: %s", muon_error(ob));
  hp.momentum_format = f;
  CHECK(muon_add_group(ob, &hp, &i) == MUON_OK, "group 1");
  hp.momentum_format = MUON_MOMENTUM_FP32;
  CHECK(muon_set_group(ob, i, &hp) == MUON_OK, "an empty group's format may change: %s", muon_error(ob));
  hp.momentum_format = f;
  CHECK(muon_set_group(ob, i, &hp) == MUON_OK, "and back");
  mb.momentum = mom2; mb.group = i; mb.name = "w3";
  CHECK(muon_add_matrix(ob, &mb, NULL) == MUON_ERR_ARG && strstr(muon_error(ob), "muon_matrix.momentum") &&
        muon_matrix_count(ob) == 3, "a trainer's float buffer with %s: %s", fname, muon_error(ob));
  muon_destroy(oa);
  muon_destroy(ob);
}

/* A finite fp32 momentum that bf16 would round to Inf is refused by a bf16 load (a step cannot
   reach one: U, close to it, overflows Newton-Schulz's norm first). */
static void test_momentum_bf16_overflow(void) {
  static float w[8 * 8], g[8 * 8], mom[8 * 8];
  muon_desc d = muon_default_desc(), d16 = muon_default_desc();
  muon_optimizer *o32 = NULL, *o16 = NULL;
  muon_matrix m = muon_default_matrix();
  muon_momentum_format fmt;
  const void *raw;
  void *blob;
  size_t k, n;
  TEST_CASE("bf16 momentum: a load of a finite fp32 value past bf16's range is refused");
  d16.hparams.momentum_format = MUON_MOMENTUM_BF16;
  for (k = 0; k < 64; k++) { w[k] = (float)k / 64; g[k] = 0.5f; }
  m.param = w; m.grad = g; m.rows = 8; m.cols = 8; m.momentum = mom;
  CHECK(muon_create(&o32, &d) == MUON_OK && muon_add_matrix(o32, &m, NULL) == MUON_OK, "create fp32");
  for (k = 0; k < 64; k++) mom[k] = k == 5 ? 3.4e38f : 0.25f;   /* after registration zeroed it */
  m.momentum = NULL;
  CHECK(muon_create(&o16, &d16) == MUON_OK && muon_add_matrix(o16, &m, NULL) == MUON_OK, "create bf16");
  n = muon_state_size(o32);
  blob = malloc(n);
  CHECK(muon_state_save(o32, blob, n) == MUON_OK, "save");
  CHECK(muon_state_load(o16, blob, n) == MUON_ERR_STATE && strstr(muon_error(o16), "bf16"),
        "a value past bf16's range: %s", muon_error(o16));
  CHECK(muon_get_momentum_stored(o16, 0, &raw, &k, &fmt) == MUON_OK && ((const uint16_t *)raw)[5] == 0,
        "nothing loaded");
  free(blob);
  muon_destroy(o32);
  muon_destroy(o16);
}

/* A device backend without the blockwise slot cannot hold 8-bit momentum. */
static void test_momentum_int8_slot(void) {
  static muon_compute_vtable vt;
  static float w[8 * 8], g[8 * 8];
  muon_compute cpu = muon_compute_cpu(), dev;
  muon_desc d8 = muon_default_desc();
  muon_optimizer *oc = NULL;
  muon_matrix m = muon_default_matrix();
  TEST_CASE("int8 momentum: a device backend without the blockwise slot refuses it");
  vt = *cpu.vt;
  vt.memory = MUON_MEMORY_DEVICE;
  vt.blockwise = NULL;
  dev.vt = &vt; dev.ctx = cpu.ctx;
  d8.hparams.momentum_format = MUON_MOMENTUM_INT8;
  d8.compute = &dev;
  m.param = w; m.grad = g; m.rows = 8; m.cols = 8;
  CHECK(muon_create(&oc, &d8) == MUON_OK, "create: %s", oc ? muon_error(oc) : "");
  CHECK(oc && muon_add_matrix(oc, &m, NULL) == MUON_ERR_BACKEND && strstr(muon_error(oc), "blockwise") &&
            strstr(muon_error(oc), "momentum_format") && muon_matrix_count(oc) == 0,
        "no blockwise slot: %s", oc ? muon_error(oc) : "");
  muon_destroy(oc);
}

int main(void) {
  test_defaults();
  test_bad_desc();
  test_bad_matrix();
  test_auto_layouts();
  test_empty();
  test_nonfinite();
  test_nonfinite_every_element();
  test_comm_faults();
  test_plan_lists();
  test_plan_limits();
  test_absent_grad();
  test_alloc_failure();
  test_state();
  test_state_matrices_only();
  test_review_regressions();
  test_determinism();
  test_spectral_unclamped();
  test_checkpoint_files();
  test_reshard_blobs();
  test_settings_saved();
  test_cautious();
  test_cautious_zeros();
  test_normuon();
  test_state_guards();
  test_adamw_resume_absent();
  test_alloc_sweep();
  test_dropin();
  test_orthogonality();
  test_momentum_narrow(MUON_MOMENTUM_BF16);
  test_momentum_narrow(MUON_MOMENTUM_INT8);
  test_momentum_bf16_overflow();
  test_momentum_int8_slot();
  return test_summary();
}
