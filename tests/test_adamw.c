/* test_adamw.c - the AdamW half of the optimizer on one device: non-finite gradients (error
   and skip), lr schedules and group changes checked against torch.optim.AdamW written out in
   plain C, bad group arguments, state-load guards for a changed model, ZeRO shards, and stacks
   (muon_adamw_param.count / strides). */
#define MUON_IMPLEMENTATION
/* The commit check in chunks of 7 elements, so that its loop over chunks runs (2^20 elsewhere). */
#define MUON__CHECK_CHUNK ((size_t)7)
#include "muon.h"
#include "test.h"

#include <stdint.h>
#include <float.h>
#include <stdlib.h>

/* ---- helpers ------------------------------------------------------------------------------ */
static unsigned adw_rng = 777u;
static float adw_rand(void) {
  adw_rng = adw_rng * 1664525u + 1013904223u;
  return (float)((adw_rng >> 8) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}
static void adw_fill(float *x, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) x[i] = adw_rand();
}
static int adw_same(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* A small model: a stacked pair of matrices, a wide one, two AdamW params, and spare buffers
   for the variants of test_state_guards (an extra matrix, an extra AdamW param). */
typedef struct {
  float w1[2 * 12 * 20], g1[2 * 12 * 20];
  float w2[30 * 10], g2[30 * 10];
  float b[24], gb[24];
  float e[10], ge[10];
  float x[8 * 8], gx[8 * 8];
  float f[6], gf[6];
} adw_model;

static void adw_model_init(adw_model *m, unsigned seed) {
  adw_rng = seed;
  adw_fill(m->w1, sizeof m->w1 / 4); adw_fill(m->w2, sizeof m->w2 / 4);
  adw_fill(m->b, 24); adw_fill(m->e, 10); adw_fill(m->x, 64); adw_fill(m->f, 6);
}
static void adw_model_grads(adw_model *m, unsigned seed) {
  adw_rng = seed;
  adw_fill(m->g1, sizeof m->g1 / 4); adw_fill(m->g2, sizeof m->g2 / 4);
  adw_fill(m->gb, 24); adw_fill(m->ge, 10); adw_fill(m->gx, 64); adw_fill(m->gf, 6);
}

/* How a registration differs from the base model (test_state_guards). */
enum {
  ADW_BASE = 0,
  ADW_NO_B,             /* the AdamW param 'b' left out */
  ADW_EXTRA_MATRIX,     /* one matrix more ('x', 8 x 8) */
  ADW_EXTRA_ADAMW,      /* one AdamW param more ('f') */
  ADW_B_RESIZED,        /* 'b' has 20 elements instead of 24 */
  ADW_EXTRA_GROUP,      /* one Muon group more (unused) */
  ADW_EXTRA_ADAMW_GROUP,/* one AdamW group more (unused) */
  ADW_W2_RESHAPED       /* 'w2' is 10 x 30 instead of 30 x 10: the same 300 floats */
};

static muon_status adw_register(muon_optimizer *opt, adw_model *m, int variant) {
  muon_matrix a = muon_default_matrix(), b = muon_default_matrix(), x = muon_default_matrix();
  muon_adamw_param p = muon_default_adamw_param(), q = muon_default_adamw_param(), r = muon_default_adamw_param();
  muon_status st;
  a.name = "w1"; a.param = m->w1; a.grad = m->g1; a.rows = 12; a.cols = 20; a.count = 2;
  b.name = "w2"; b.param = m->w2; b.grad = m->g2; b.rows = 30; b.cols = 10;
  if (variant == ADW_W2_RESHAPED) { b.rows = 10; b.cols = 30; }
  x.name = "x"; x.param = m->x; x.grad = m->gx; x.rows = 8; x.cols = 8;
  p.name = "b"; p.param = m->b; p.grad = m->gb; p.size = variant == ADW_B_RESIZED ? 20 : 24;
  q.name = "e"; q.param = m->e; q.grad = m->ge; q.size = 10;
  r.name = "f"; r.param = m->f; r.grad = m->gf; r.size = 6;
  if (variant == ADW_EXTRA_GROUP) {
    muon_hparams hp = muon_default_hparams();
    hp.lr = 0.05f;
    if ((st = muon_add_group(opt, &hp, NULL)) != MUON_OK) return st;
  }
  if (variant == ADW_EXTRA_ADAMW_GROUP) {
    muon_adamw_hparams hp = muon_default_adamw_hparams();
    hp.lr = 0.05f;
    if ((st = muon_add_adamw_group(opt, &hp, NULL)) != MUON_OK) return st;
  }
  if ((st = muon_add_matrix(opt, &a, NULL)) != MUON_OK) return st;
  if ((st = muon_add_matrix(opt, &b, NULL)) != MUON_OK) return st;
  if (variant == ADW_EXTRA_MATRIX && (st = muon_add_matrix(opt, &x, NULL)) != MUON_OK) return st;
  if (variant != ADW_NO_B && (st = muon_add_adamw_param(opt, &p, NULL)) != MUON_OK) return st;
  if ((st = muon_add_adamw_param(opt, &q, NULL)) != MUON_OK) return st;
  if (variant == ADW_EXTRA_ADAMW && (st = muon_add_adamw_param(opt, &r, NULL)) != MUON_OK) return st;
  return MUON_OK;
}

/* An optimizer over model m (a larger AdamW lr so that every step visibly moves the params). */
static muon_optimizer *adw_make(adw_model *m, int variant, muon_nonfinite on_nonfinite) {
  muon_optimizer *opt = NULL;
  muon_desc d = muon_default_desc();
  d.adamw.lr = 1e-2f;
  d.hparams.lr = 2e-2f;
  d.on_nonfinite = on_nonfinite;
  if (muon_create(&opt, &d) != MUON_OK) return NULL;
  if (adw_register(opt, m, variant) != MUON_OK) { muon_destroy(opt); return NULL; }
  return opt;
}

/* The optimizer's saved state in a fresh malloc'd buffer (NULL on failure). */
static unsigned char *adw_save(muon_optimizer *opt, size_t *n) {
  unsigned char *buf;
  *n = muon_state_size(opt);
  buf = (unsigned char *)malloc(*n ? *n : 1);
  if (buf && muon_state_save(opt, buf, *n) != MUON_OK) { free(buf); return NULL; }
  return buf;
}

/* ---- 1. non-finite AdamW gradient, MUON_NONFINITE_ERROR ----------------------------------
   Catches: an AdamW gradient that escapes the non-finite check (NaN written into the param or
   the moments), a step that applies the Muon matrices (or some AdamW params) before it notices
   the bad gradient, a failing step that still bumps a step count, and an error message that
   does not say which param was bad. */
static void test_nonfinite_error(void) {
  float bad_values[2];
  const char *bad_names[2] = { "NaN", "Inf" };
  int k;
  bad_values[0] = NAN;
  bad_values[1] = INFINITY;
  for (k = 0; k < 2; k++) {
    adw_model *a = (adw_model *)calloc(1, sizeof *a), *ref = (adw_model *)calloc(1, sizeof *ref), *before = (adw_model *)calloc(1, sizeof *before);
    muon_optimizer *oa, *oref;
    unsigned char *blob0 = NULL, *blob1 = NULL;
    size_t n0 = 0, n1 = 0;
    muon_status st;
    char name[120];
    snprintf(name, sizeof name, "AdamW: a %s gradient fails the step, names the param, changes nothing; the fixed step matches a clean run", bad_names[k]);
    TEST_CASE(name);
    adw_model_init(a, 11u); adw_model_init(ref, 11u);
    oa = adw_make(a, ADW_BASE, MUON_NONFINITE_ERROR);
    oref = adw_make(ref, ADW_BASE, MUON_NONFINITE_ERROR);
    CHECK(oa && oref, "create");
    if (!oa || !oref) { muon_destroy(oa); muon_destroy(oref); free(a); free(ref); free(before); continue; }
    /* step 1: both clean */
    adw_model_grads(a, 101u); adw_model_grads(ref, 101u);
    CHECK(muon_step(oa) == MUON_OK && muon_step(oref) == MUON_OK, "step 1: %s", muon_error(oa));
    /* step 2: a's 'e' gradient has one bad element */
    adw_model_grads(a, 202u);
    a->ge[3] = bad_values[k];
    *before = *a;
    blob0 = adw_save(oa, &n0);
    CHECK(blob0 != NULL, "save before");
    st = muon_step(oa);
    CHECK(st == MUON_ERR_NONFINITE, "status %s, want MUON_ERR_NONFINITE", muon_status_string(st));
    CHECK(strstr(muon_error(oa), "'e'") != NULL && strstr(muon_error(oa), "AdamW param 1") != NULL,
          "message does not name AdamW param 1 ('e'): %s", muon_error(oa));
    CHECK(adw_same(a->w1, before->w1, sizeof a->w1), "stacked matrices w1 changed by a failed step");
    CHECK(adw_same(a->w2, before->w2, sizeof a->w2), "matrix w2 changed by a failed step");
    CHECK(adw_same(a->b, before->b, sizeof a->b), "AdamW param b changed by a failed step");
    CHECK(adw_same(a->e, before->e, sizeof a->e), "AdamW param e changed by a failed step");
    blob1 = adw_save(oa, &n1);
    CHECK(blob1 && blob0 && n1 == n0 && adw_same(blob0, blob1, n0), "the saved state changed after the failed step");
    /* fix the gradient: the retried step 2 equals the clean run's step 2, bit for bit */
    a->ge[3] = 0.25f;
    adw_model_grads(ref, 202u);
    ref->ge[3] = 0.25f;
    st = muon_step(oa);
    CHECK(st == MUON_OK, "fixed step: %s", muon_error(oa));
    CHECK(muon_step(oref) == MUON_OK, "reference step 2: %s", muon_error(oref));
    CHECK(!adw_same(a->e, before->e, sizeof a->e), "the fixed step did not move e");
    CHECK(adw_same(a->w1, ref->w1, sizeof a->w1) && adw_same(a->w2, ref->w2, sizeof a->w2), "matrices differ from the clean run");
    CHECK(adw_same(a->b, ref->b, sizeof a->b) && adw_same(a->e, ref->e, sizeof a->e), "AdamW params differ from the clean run");
    free(blob0); free(blob1);
    blob0 = adw_save(oa, &n0);
    blob1 = adw_save(oref, &n1);
    CHECK(blob0 && blob1 && n0 == n1 && adw_same(blob0, blob1, n0), "state differs from the clean run's");
    free(blob0); free(blob1);
    muon_destroy(oa); muon_destroy(oref);
    free(a); free(ref); free(before);
  }
}

/* ---- 2. non-finite AdamW gradient, MUON_NONFINITE_SKIP -----------------------------------
   Catches: a skipped param that is still updated (NaN in its value or moments), a skip that
   still advances its step count (its bias correction would then be off at the next step), and
   a skip that leaks into the other params (they must update exactly as if it did not exist). */
static void test_nonfinite_skip(void) {
  adw_model *a = (adw_model *)calloc(1, sizeof *a), *nob = (adw_model *)calloc(1, sizeof *nob);
  float b_ref[24], gb1[24], gb3[24], b_after1[24];
  muon_optimizer *oa, *onob, *ob = NULL;
  muon_desc d = muon_default_desc();
  muon_adamw_param p = muon_default_adamw_param();
  TEST_CASE("AdamW SKIP: the NaN param keeps value and state, the others update as without it");
  adw_model_init(a, 21u); adw_model_init(nob, 21u);
  oa = adw_make(a, ADW_BASE, MUON_NONFINITE_SKIP);
  onob = adw_make(nob, ADW_NO_B, MUON_NONFINITE_SKIP);
  /* b alone, in its own optimizer, for steps 1 and 3 only */
  memcpy(b_ref, a->b, sizeof b_ref);
  d.adamw.lr = 1e-2f;
  d.on_nonfinite = MUON_NONFINITE_SKIP;
  p.name = "b"; p.param = b_ref; p.grad = gb1; p.size = 24;
  CHECK(muon_create(&ob, &d) == MUON_OK && muon_add_adamw_param(ob, &p, NULL) == MUON_OK, "create b alone");
  CHECK(oa && onob && ob, "create");
  if (oa && onob && ob) {
    adw_model_grads(a, 301u); adw_model_grads(nob, 301u);
    memcpy(gb1, a->gb, sizeof gb1);
    CHECK(muon_step(oa) == MUON_OK && muon_step(onob) == MUON_OK && muon_step(ob) == MUON_OK, "step 1");
    memcpy(b_after1, a->b, sizeof b_after1);
    /* step 2: b's gradient is NaN */
    adw_model_grads(a, 302u); adw_model_grads(nob, 302u);
    a->gb[7] = NAN;
    CHECK(muon_step(oa) == MUON_OK, "SKIP step: %s", muon_error(oa));
    CHECK(muon_step(onob) == MUON_OK, "reference step 2");
    CHECK(adw_same(a->b, b_after1, sizeof b_after1), "the skipped param b changed");
    CHECK(adw_same(a->w1, nob->w1, sizeof a->w1) && adw_same(a->w2, nob->w2, sizeof a->w2), "matrices differ from a run without b");
    CHECK(adw_same(a->e, nob->e, sizeof a->e), "AdamW param e differs from a run without b");
    /* step 3: b is finite again and continues from its step-1 state (step count 1, not 2) */
    adw_model_grads(a, 303u); adw_model_grads(nob, 303u);
    memcpy(gb3, a->gb, sizeof gb3);
    CHECK(muon_set_adamw_grad(ob, 0, gb3) == MUON_OK, "set grad");
    CHECK(muon_step(oa) == MUON_OK && muon_step(onob) == MUON_OK && muon_step(ob) == MUON_OK, "step 3");
    CHECK(!adw_same(a->b, b_after1, sizeof b_after1), "b did not move at step 3");
    CHECK(adw_same(a->b, b_ref, sizeof b_ref), "b after the skip differs from b stepped twice alone: its state changed");
    CHECK(adw_same(a->w1, nob->w1, sizeof a->w1) && adw_same(a->e, nob->e, sizeof a->e), "step 3 differs from a run without b");
  }
  muon_destroy(oa); muon_destroy(onob); muon_destroy(ob);
  free(a); free(nob);
}

/* ---- 3. lr schedules, group changes and their bad arguments ------------------------------
   torch.optim.AdamW for one element, in float exactly as muon.h computes it: the bias
   corrections in double from the group's float hyperparameters, then rounded to float. */
typedef struct { float beta1, beta2, eps, decay, step_size, bc2_sqrt; } adw_ref_args;

static adw_ref_args adw_ref_args_for(const muon_adamw_hparams *hp, long long t) {
  adw_ref_args r;
  r.beta1 = hp->beta1; r.beta2 = hp->beta2; r.eps = hp->eps;
  r.decay = (float)(1.0 - (double)hp->lr * (double)hp->weight_decay);
  r.step_size = (float)((double)hp->lr / (1.0 - pow((double)hp->beta1, (double)t)));
  r.bc2_sqrt = (float)sqrt(1.0 - pow((double)hp->beta2, (double)t));
  return r;
}

static void adw_ref_step(float *w, const float *g, float *m, float *v, size_t n, const adw_ref_args *r) {
  size_t i;
  for (i = 0; i < n; i++) {
    float wi = w[i] * r->decay;
    float denom;
    m[i] = m[i] + (1.0f - r->beta1) * (g[i] - m[i]);
    v[i] = v[i] * r->beta2 + (1.0f - r->beta2) * g[i] * g[i];
    denom = sqrtf(v[i]) / r->bc2_sqrt + r->eps;
    w[i] = wi - r->step_size * (m[i] / denom);
  }
}

/* Bitwise, except under -ffast-math (-Ofast), where the compiler may contract or reassociate the
   library's loop and this one differently: there an error of 1e-6 of the largest value is allowed. */
static int adw_match(const float *a, const float *b, size_t n) {
#ifdef __FAST_MATH__
  size_t i;
  double s = 1e-30;
  for (i = 0; i < n; i++) if (fabs((double)b[i]) > s) s = fabs((double)b[i]);
  for (i = 0; i < n; i++)   /* relative to the largest value: elements near 0 carry others' rounding */
    if (!(fabs((double)a[i] - (double)b[i]) <= 1e-6 * s)) return 0;
  return 1;
#else
  return adw_same(a, b, n * sizeof(float));
#endif
}

/* Catches: muon_set_adamw_lr / muon_set_adamw_group that do not reach the next step (a cached
   copy of the hyperparameters, the wrong group, lr taken from group 0 for every param), a
   wrong bias correction or decoupled decay, and eps inside the sqrt. */
static void test_lr_schedule(void) {
  enum { N0 = 17, N1 = 9, STEPS = 7 };
  float w0[N0], g0[N0], w1[N1], g1[N1];
  float rw0[N0], rm0[N0], rv0[N0], rw1[N1], rm1[N1], rv1[N1];
  muon_optimizer *opt = NULL;
  muon_desc d = muon_default_desc();
  muon_adamw_param p = muon_default_adamw_param(), q = muon_default_adamw_param();
  muon_adamw_hparams h0 = muon_default_adamw_hparams(), h1 = muon_default_adamw_hparams();
  int group1 = -1, t, all_ok = 1, moved = 1;
  TEST_CASE("AdamW lr schedule (set_adamw_lr, set_adamw_group) equals torch.optim.AdamW written in C");
  adw_rng = 4242u;
  adw_fill(w0, N0); adw_fill(w1, N1);
  memcpy(rw0, w0, sizeof w0); memcpy(rw1, w1, sizeof w1);
  memset(rm0, 0, sizeof rm0); memset(rv0, 0, sizeof rv0); memset(rm1, 0, sizeof rm1); memset(rv1, 0, sizeof rv1);
  d.adamw = h0;
  h1.lr = 3e-3f; h1.beta1 = 0.8f; h1.beta2 = 0.99f; h1.eps = 1e-6f; h1.weight_decay = 0.1f;
  CHECK(muon_create(&opt, &d) == MUON_OK, "create");
  if (!opt) return;
  CHECK(muon_add_adamw_group(opt, &h1, &group1) == MUON_OK && group1 == 1, "add group: %s", muon_error(opt));
  p.name = "p0"; p.param = w0; p.grad = g0; p.size = N0; p.group = 0;
  q.name = "p1"; q.param = w1; q.grad = g1; q.size = N1; q.group = group1;
  CHECK(muon_add_adamw_param(opt, &p, NULL) == MUON_OK && muon_add_adamw_param(opt, &q, NULL) == MUON_OK, "add params");
  for (t = 1; t <= STEPS; t++) {
    adw_ref_args r0, r1;
    float prev = w0[0];
    /* group 0: warm-up then decay, through muon_set_adamw_lr */
    h0.lr = t <= 3 ? 2e-2f * (float)t / 3.0f : 2e-2f / (float)(t - 2);
    if (muon_set_adamw_lr(opt, 0, h0.lr) != MUON_OK) all_ok = 0;
    /* group 1: lr, weight decay, and from step 4 on beta1 change, through muon_set_adamw_group */
    h1.lr = 5e-3f * (float)(STEPS + 1 - t);
    h1.weight_decay = 0.05f * (float)t;
    if (t >= 4) h1.beta1 = 0.7f;
    if (muon_set_adamw_group(opt, group1, &h1) != MUON_OK) all_ok = 0;
    adw_fill(g0, N0); adw_fill(g1, N1);
    if (muon_step(opt) != MUON_OK) all_ok = 0;
    r0 = adw_ref_args_for(&h0, t);
    r1 = adw_ref_args_for(&h1, t);
    adw_ref_step(rw0, g0, rm0, rv0, N0, &r0);
    adw_ref_step(rw1, g1, rm1, rv1, N1, &r1);
    if (w0[0] == prev) moved = 0;
    CHECK(adw_match(w0, rw0, N0), "step %d: group 0 param differs from the reference (w[0] %.9g vs %.9g)", t, (double)w0[0], (double)rw0[0]);
    CHECK(adw_match(w1, rw1, N1), "step %d: group 1 param differs from the reference (w[0] %.9g vs %.9g)", t, (double)w1[0], (double)rw1[0]);
  }
  CHECK(all_ok, "a set or step call failed: %s", muon_error(opt));
  CHECK(moved, "the params did not move every step");
  muon_destroy(opt);
}

/* Catches: setters that validate after writing (a rejected lr or beta1 left in the group), a
   group index that is not range-checked, and messages that do not name the bad field. The
   group's hyperparameters live in the saved state, so an unchanged blob proves them unchanged;
   a step equal to a twin optimizer's proves the step used them. */
static void test_bad_group_args(void) {
  adw_model *a = (adw_model *)calloc(1, sizeof *a), *twin = (adw_model *)calloc(1, sizeof *twin);
  muon_optimizer *oa = NULL, *ot = NULL;
  muon_adamw_hparams hp = muon_default_adamw_hparams(), bad;
  unsigned char *blob0 = NULL, *blob1 = NULL;
  size_t n0 = 0, n1 = 0;
  muon_status st;
  int g = -1, gt = -1;
  TEST_CASE("AdamW bad group arguments are MUON_ERR_ARG, name the field, and change nothing");
  adw_model_init(a, 31u); adw_model_init(twin, 31u);
  oa = adw_make(a, ADW_BASE, MUON_NONFINITE_ERROR);
  ot = adw_make(twin, ADW_BASE, MUON_NONFINITE_ERROR);
  CHECK(oa && ot, "create");
  if (!oa || !ot) { muon_destroy(oa); muon_destroy(ot); free(a); free(twin); return; }
  hp.lr = 4e-3f; hp.beta1 = 0.85f;
  CHECK(muon_add_adamw_group(oa, &hp, &g) == MUON_OK && muon_add_adamw_group(ot, &hp, &gt) == MUON_OK && g == 1 && gt == 1, "add group");
  CHECK(muon_set_adamw_lr(oa, 0, 7e-3f) == MUON_OK && muon_set_adamw_lr(ot, 0, 7e-3f) == MUON_OK, "set lr");
  adw_model_grads(a, 401u); adw_model_grads(twin, 401u);
  CHECK(muon_step(oa) == MUON_OK && muon_step(ot) == MUON_OK, "step 1");
  blob0 = adw_save(oa, &n0);
  CHECK(blob0 != NULL, "save");

  st = muon_set_adamw_lr(oa, 2, 1e-3f);
  CHECK(st == MUON_ERR_ARG && strstr(muon_error(oa), "group 2"), "lr, group 2 of 2: %s / %s", muon_status_string(st), muon_error(oa));
  st = muon_set_adamw_lr(oa, -1, 1e-3f);
  CHECK(st == MUON_ERR_ARG && strstr(muon_error(oa), "group -1"), "lr, group -1: %s / %s", muon_status_string(st), muon_error(oa));
  st = muon_set_adamw_lr(oa, 0, -1e-3f);
  CHECK(st == MUON_ERR_ARG && strstr(muon_error(oa), ".lr"), "negative lr: %s / %s", muon_status_string(st), muon_error(oa));
  st = muon_set_adamw_lr(oa, 1, NAN);
  CHECK(st == MUON_ERR_ARG && strstr(muon_error(oa), ".lr"), "NaN lr: %s / %s", muon_status_string(st), muon_error(oa));
  st = muon_set_adamw_lr(oa, 0, INFINITY);
  CHECK(st == MUON_ERR_ARG && strstr(muon_error(oa), ".lr"), "Inf lr: %s / %s", muon_status_string(st), muon_error(oa));
  bad = hp; bad.beta1 = 1.0f;
  st = muon_set_adamw_group(oa, 1, &bad);
  CHECK(st == MUON_ERR_ARG && strstr(muon_error(oa), "beta1"), "beta1 1: %s / %s", muon_status_string(st), muon_error(oa));
  bad = hp; bad.beta1 = 1.5f; bad.lr = 0.5f;   /* a valid lr next to a bad beta1: neither is taken */
  st = muon_set_adamw_group(oa, 0, &bad);
  CHECK(st == MUON_ERR_ARG && strstr(muon_error(oa), "beta1"), "beta1 1.5: %s / %s", muon_status_string(st), muon_error(oa));
  bad = hp; bad.lr = -2.0f;
  st = muon_set_adamw_group(oa, 1, &bad);
  CHECK(st == MUON_ERR_ARG && strstr(muon_error(oa), ".lr"), "group, negative lr: %s / %s", muon_status_string(st), muon_error(oa));
  st = muon_set_adamw_group(oa, 5, &hp);
  CHECK(st == MUON_ERR_ARG && strstr(muon_error(oa), "group 5"), "group 5: %s / %s", muon_status_string(st), muon_error(oa));

  blob1 = adw_save(oa, &n1);
  CHECK(blob0 && blob1 && n0 == n1 && adw_same(blob0, blob1, n0), "a rejected call changed the optimizer's state (group hyperparameters)");
  adw_model_grads(a, 402u); adw_model_grads(twin, 402u);
  CHECK(muon_step(oa) == MUON_OK && muon_step(ot) == MUON_OK, "step 2");
  CHECK(adw_same(a->b, twin->b, sizeof a->b) && adw_same(a->e, twin->e, sizeof a->e), "the step after rejected calls differs from a twin that never made them");
  free(blob0); free(blob1);
  muon_destroy(oa); muon_destroy(ot);
  free(a); free(twin);
}

/* ---- 4. state-load guards for a changed model --------------------------------------------
   Catches: a load that accepts a blob of another model (moments put on the wrong params, read
   out of bounds, or groups silently dropped), a guard whose message does not say what differs,
   and a failed load that changed the target before noticing. */
static void test_state_guards(void) {
  struct { int variant; const char *what; const char *needle; } cases[] = {
    { ADW_EXTRA_MATRIX, "one matrix more", "state has 3 matrices and 2 AdamW params, the optimizer 4 and 2" },
    { ADW_EXTRA_ADAMW, "one AdamW param more", "state has 3 matrices and 2 AdamW params, the optimizer 3 and 3" },
    { ADW_B_RESIZED, "an AdamW param resized", "AdamW param 0 ('b') has 20 floats, the state 24" },
    { ADW_EXTRA_GROUP, "an extra Muon group", "state has 1 groups and 1 AdamW groups, the optimizer 2 and 1" },
    { ADW_EXTRA_ADAMW_GROUP, "an extra AdamW group", "state has 1 groups and 1 AdamW groups, the optimizer 1 and 2" },
    { ADW_W2_RESHAPED, "a matrix of the same size, other shape", "matrix 2 ('w2') is 10 x 30 (300 floats here), the state has 30 x 10" },
  };
  adw_model *src = (adw_model *)calloc(1, sizeof *src), *dst = (adw_model *)calloc(1, sizeof *dst);
  muon_optimizer *osrc = adw_make(src, ADW_BASE, MUON_NONFINITE_ERROR);
  unsigned char *blob = NULL;
  size_t nblob = 0, i;
  int ok = osrc != NULL;
  adw_model_init(src, 51u);
  if (ok) {
    adw_model_grads(src, 501u);
    ok = muon_step(osrc) == MUON_OK;
    adw_model_grads(src, 502u);
    ok = ok && muon_step(osrc) == MUON_OK;
    blob = adw_save(osrc, &nblob);
    ok = ok && blob != NULL;
  }
  for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    muon_optimizer *o;
    unsigned char *before = NULL, *after = NULL;
    size_t nb = 0, na = 0;
    muon_status st;
    char name[140];
    snprintf(name, sizeof name, "muon_state_load refuses a blob of a changed model: %s", cases[i].what);
    TEST_CASE(name);
    CHECK(ok, "source optimizer: %s", osrc ? muon_error(osrc) : "create failed");
    adw_model_init(dst, 61u);
    o = adw_make(dst, cases[i].variant, MUON_NONFINITE_ERROR);
    CHECK(o != NULL, "create the changed optimizer");
    if (!o || !ok) { muon_destroy(o); continue; }
    /* give the target a state of its own (one step, other gradients) */
    adw_model_grads(dst, 601u);
    CHECK(muon_step(o) == MUON_OK, "target step: %s", muon_error(o));
    before = adw_save(o, &nb);
    st = muon_state_load(o, blob, nblob);
    CHECK(st == MUON_ERR_STATE, "status %s, want MUON_ERR_STATE", muon_status_string(st));
    CHECK(strstr(muon_error(o), cases[i].needle) != NULL, "message '%s' lacks '%s'", muon_error(o), cases[i].needle);
    after = adw_save(o, &na);
    CHECK(before && after && nb == na && adw_same(before, after, nb), "the failed load changed the target's state");
    free(before); free(after);
    muon_destroy(o);
  }
  {
    /* and the unchanged model does load it: the guards above are not just "always refuse" */
    muon_optimizer *o;
    unsigned char *back = NULL;
    size_t nback = 0;
    TEST_CASE("muon_state_load accepts the blob of the same model and round-trips it");
    adw_model_init(dst, 61u);
    o = adw_make(dst, ADW_BASE, MUON_NONFINITE_ERROR);
    CHECK(ok && o, "create");
    if (ok && o) {
      CHECK(muon_state_load(o, blob, nblob) == MUON_OK, "load: %s", muon_error(o));
      back = adw_save(o, &nback);
      CHECK(back && nback == nblob && adw_same(back, blob, nblob), "saved again, the blob differs");
      free(back);
    }
    muon_destroy(o);
  }
  free(blob);
  muon_destroy(osrc);
  free(src); free(dst);
}

/* ---- 5. ZeRO shards: muon_adamw_param.offset / full_size ----------------------------------
   Catches: a shard that does not fit its parameter accepted (a later reshard would write out of
   bounds), and a shard whose update depends on where it sits in the parameter (AdamW is
   element-wise, so a shard must update exactly as those elements of the whole parameter). */
static void test_shards(void) {
  enum { FULL = 30, OFF = 10, SIZE = 12, STEPS = 4 };
  float whole[FULL], gwhole[FULL], shard[SIZE], gshard[SIZE], start[FULL];
  muon_optimizer *ow = NULL, *os = NULL;
  muon_desc d = muon_default_desc();
  muon_adamw_param p = muon_default_adamw_param();
  muon_status st;
  int t, ok = 1;
  TEST_CASE("AdamW shard: offset + size beyond full_size is MUON_ERR_SHAPE");
  d.adamw.lr = 1e-2f;
  CHECK(muon_create(&os, &d) == MUON_OK, "create");
  if (!os) return;
  p.name = "emb"; p.param = shard; p.grad = gshard; p.size = SIZE; p.offset = 20; p.full_size = FULL;
  st = muon_add_adamw_param(os, &p, NULL);
  CHECK(st == MUON_ERR_SHAPE && strstr(muon_error(os), "full_size") && strstr(muon_error(os), "emb"), "20 + 12 > 30: %s / %s", muon_status_string(st), muon_error(os));
  p.offset = 0; p.size = FULL + 1;
  st = muon_add_adamw_param(os, &p, NULL);
  CHECK(st == MUON_ERR_SHAPE, "0 + 31 > 30: %s", muon_status_string(st));
  p.offset = FULL + 1; p.size = 1;
  st = muon_add_adamw_param(os, &p, NULL);
  CHECK(st == MUON_ERR_SHAPE, "offset 31 > full_size 30: %s", muon_status_string(st));
  p.offset = 3; p.size = SIZE; p.full_size = 0;
  st = muon_add_adamw_param(os, &p, NULL);
  CHECK(st == MUON_ERR_SHAPE, "offset 3 with full_size 0 (the whole parameter): %s", muon_status_string(st));
  CHECK(muon_adamw_param_count(os) == 0, "a rejected shard was registered");
  p.offset = 18; p.size = SIZE; p.full_size = FULL;   /* ends exactly at full_size: fits */
  CHECK(muon_add_adamw_param(os, &p, NULL) == MUON_OK && muon_adamw_param_count(os) == 1, "18 + 12 = 30 fits: %s", muon_error(os));
  muon_destroy(os); os = NULL;

  TEST_CASE("AdamW shard [10, +12) of 30 updates exactly as those elements of the whole parameter");
  adw_rng = 9001u;
  adw_fill(whole, FULL);
  memcpy(start, whole, sizeof start);
  memcpy(shard, whole + OFF, sizeof shard);
  CHECK(muon_create(&ow, &d) == MUON_OK && muon_create(&os, &d) == MUON_OK, "create");
  if (!ow || !os) { muon_destroy(ow); muon_destroy(os); return; }
  p = muon_default_adamw_param();
  p.name = "emb"; p.param = whole; p.grad = gwhole; p.size = FULL;
  CHECK(muon_add_adamw_param(ow, &p, NULL) == MUON_OK, "whole: %s", muon_error(ow));
  p.param = shard; p.grad = gshard; p.size = SIZE; p.offset = OFF; p.full_size = FULL;
  CHECK(muon_add_adamw_param(os, &p, NULL) == MUON_OK, "shard: %s", muon_error(os));
  for (t = 0; t < STEPS; t++) {
    adw_fill(gwhole, FULL);
    memcpy(gshard, gwhole + OFF, sizeof gshard);
    if (muon_step(ow) != MUON_OK || muon_step(os) != MUON_OK) ok = 0;
    CHECK(adw_same(shard, whole + OFF, sizeof shard), "step %d: the shard differs from the whole parameter's elements", t + 1);
  }
  CHECK(ok, "a step failed");
  CHECK(!adw_same(whole + OFF, start + OFF, sizeof shard), "the params did not move");
  muon_destroy(ow); muon_destroy(os);
}

/* ---- 6. Stacks: muon_adamw_param.count and strides ----------------------------------------
   Catches: a bad count or stride accepted (pieces overlapping, or an address overflowing), a
   stack registered in part, and a piece that differs in any way from the same elements
   registered alone as "name[l]" (its buffers, its shard, its stochastic-rounding bits, its
   state in a checkpoint). */
enum { SK_N = 3, SK_FULL = 10, SK_OFF = 4, SK_SIZE = 5, SK_PS = 7, SK_GS = 9, SK_MS = 11, SK_STEPS = 3 };

static void stack_bad(muon_optimizer *opt, const muon_adamw_param *p, muon_status want, const char *text,
                      const char *what) {
  muon_status st = muon_add_adamw_param(opt, p, NULL);
  CHECK(st == want && strstr(muon_error(opt), text), "%s: %s, '%s'", what, muon_status_string(st), muon_error(opt));
  CHECK(muon_adamw_param_count(opt) == 0, "%s: something was registered", what);
}

static void test_stacks(void) {
  float w[SK_N * SK_PS], g[SK_N * SK_GS], ws[SK_N * SK_SIZE], gs[SK_N * SK_SIZE], start[SK_N * SK_PS];
  uint16_t mir[SK_N * SK_MS], mirs[SK_N * SK_SIZE];
  muon_optimizer *o1 = NULL, *o2 = NULL;
  muon_desc d = muon_default_desc();
  muon_adamw_param p = muon_default_adamw_param(), q;
  fail_alloc fa;
  int l, t, k, first = -1, ok = 1;
  size_t n1, n2;
  unsigned char *b1, *b2;

  TEST_CASE("AdamW stack: bad count, strides and pieces are refused, naming the stack; nothing registered");
  CHECK(muon_create(&o1, &d) == MUON_OK, "create");
  if (!o1) return;
  p.name = "ln"; p.param = w; p.grad = g; p.mirror = mir; p.size = SK_SIZE; p.count = SK_N;
  p.stride = SK_PS; p.grad_stride = SK_GS; p.mirror_stride = SK_MS; p.offset = SK_OFF; p.full_size = SK_FULL;
  q = p; q.count = -1;
  stack_bad(o1, &q, MUON_ERR_SHAPE, "count must be >= 0", "count -1");
  q = p; q.stride = SK_SIZE - 1;
  stack_bad(o1, &q, MUON_ERR_SHAPE, "overlap", "param stride < size");
  q = p; q.grad_stride = SK_SIZE - 1;
  stack_bad(o1, &q, MUON_ERR_SHAPE, "overlap", "grad stride < size");
  q = p; q.mirror_stride = SK_SIZE - 1;
  stack_bad(o1, &q, MUON_ERR_SHAPE, "overlap", "mirror stride < size");
  q = p; q.grad_stride = 0; q.stride = SK_SIZE - 1;
  stack_bad(o1, &q, MUON_ERR_SHAPE, "overlap", "grad stride 0 (= a param stride < size)");
  q = p; q.stride = (size_t)-1 / 8;
  stack_bad(o1, &q, MUON_ERR_SHAPE, "overflow", "count x stride overflows");
  q = p; q.count = 2; q.mirror_stride = (size_t)-1 / 8;
  stack_bad(o1, &q, MUON_ERR_SHAPE, "overflow", "count x mirror stride overflows");
  q = p; q.count = 1 << 20; q.size = ((size_t)-1 / 16) >> 19; q.stride = q.grad_stride = q.mirror_stride = 0;
  stack_bad(o1, &q, MUON_ERR_SHAPE, "too large", "count x size beyond any buffer");
  q = p; q.offset = SK_FULL - SK_SIZE + 1;
  stack_bad(o1, &q, MUON_ERR_SHAPE, "'ln[0]'", "a piece beyond full_size");
  q = p; q.param = NULL;
  stack_bad(o1, &q, MUON_ERR_ARG, "'ln[0]'", "param NULL");
  q = p; q.group = 1;
  stack_bad(o1, &q, MUON_ERR_ARG, "group", "no such group");
  q = p; q.count = 1; q.stride = 1; q.grad_stride = 1; q.mirror_stride = 1;   /* one piece: strides unused */
  CHECK(muon_add_adamw_param(o1, &q, &first) == MUON_OK && first == 0 && muon_adamw_param_count(o1) == 1,
        "count 1 with small strides: %s", muon_error(o1));
  q = p; q.count = 0x7fffffff;   /* one more AdamW param than an int counts */
  CHECK(muon_add_adamw_param(o1, &q, NULL) == MUON_ERR_SHAPE && strstr(muon_error(o1), "too large") &&
            muon_adamw_param_count(o1) == 1, "count INT_MAX after one param: %s", muon_error(o1));
  CHECK(muon_add_adamw_param(o1, &p, &first) == MUON_OK && first == 1 && muon_adamw_param_count(o1) == 1 + SK_N,
        "the stack: %s (first %d, count %d)", muon_error(o1), first, muon_adamw_param_count(o1));
  muon_destroy(o1); o1 = NULL;

  TEST_CASE("AdamW stack: every allocation failing in turn registers nothing and leaks nothing");
  for (k = 0; ok; k++) {
    muon_status st;
    fa.calls = 0; fa.fail_at = k; fa.live = 0;
    d.allocator.alloc = fa_alloc; d.allocator.free = fa_free; d.allocator.user_data = &fa;
    if (muon_create(&o1, &d) != MUON_OK) continue;
    st = muon_add_adamw_param(o1, &p, NULL);
    CHECK(st == MUON_OK || (st == MUON_ERR_NOMEM && muon_adamw_param_count(o1) == 0), "fail_at %d: %s, %d params", k,
          muon_status_string(st), muon_adamw_param_count(o1));
    if (st == MUON_OK) ok = 0;
    muon_destroy(o1); o1 = NULL;
    CHECK(fa.live == 0, "fail_at %d: %ld blocks leaked", k, fa.live);
  }
  d = muon_default_desc();

  TEST_CASE("AdamW stack of 3 strided shards with bf16 mirrors, stochastic rounding: bitwise 3 params named ln[l]");
  d.adamw.lr = 1e-2f;
  d.rounding = MUON_ROUND_STOCHASTIC;
  d.seed = 99;
  adw_rng = 4242u;
  adw_fill(w, SK_N * SK_PS);
  memcpy(start, w, sizeof w);
  memset(mir, 0, sizeof mir);
  for (l = 0; l < SK_N; l++) memcpy(ws + l * SK_SIZE, w + l * SK_PS, SK_SIZE * sizeof(float));
  CHECK(muon_create(&o1, &d) == MUON_OK && muon_create(&o2, &d) == MUON_OK, "create");
  if (!o1 || !o2) { muon_destroy(o1); muon_destroy(o2); return; }
  CHECK(muon_add_adamw_param(o1, &p, NULL) == MUON_OK, "the stack: %s", muon_error(o1));
  for (l = 0; l < SK_N; l++) {
    char name[16];
    snprintf(name, sizeof name, "ln[%d]", l);
    q = muon_default_adamw_param();
    q.name = name; q.param = ws + l * SK_SIZE; q.grad = gs + l * SK_SIZE; q.mirror = mirs + l * SK_SIZE;
    q.size = SK_SIZE; q.offset = SK_OFF; q.full_size = SK_FULL;
    CHECK(muon_add_adamw_param(o2, &q, NULL) == MUON_OK, "piece %d alone: %s", l, muon_error(o2));
  }
  for (t = 0, ok = 1; t < SK_STEPS; t++) {
    adw_fill(g, SK_N * SK_GS);
    for (l = 0; l < SK_N; l++) memcpy(gs + l * SK_SIZE, g + l * SK_GS, SK_SIZE * sizeof(float));
    if (muon_step(o1) != MUON_OK || muon_step(o2) != MUON_OK) ok = 0;
    for (l = 0; l < SK_N; l++) {
      CHECK(adw_same(w + l * SK_PS, ws + l * SK_SIZE, SK_SIZE * sizeof(float)), "step %d, piece %d: params differ", t,
            l);
      CHECK(adw_same(mir + l * SK_MS, mirs + l * SK_SIZE, SK_SIZE * 2), "step %d, piece %d: mirrors differ", t, l);
      CHECK(adw_same(w + l * SK_PS + SK_SIZE, start + l * SK_PS + SK_SIZE, (SK_PS - SK_SIZE) * sizeof(float)) &&
                mir[l * SK_MS + SK_SIZE] == 0, "step %d, piece %d: written between the pieces", t, l);
    }
  }
  CHECK(ok, "a step failed: %s / %s", muon_error(o1), muon_error(o2));
  CHECK(!adw_same(w, start, SK_SIZE * sizeof(float)), "the params did not move");
  n1 = muon_state_size(o1);
  n2 = muon_state_size(o2);
  b1 = (unsigned char *)malloc(n1);
  b2 = (unsigned char *)malloc(n2);
  CHECK(b1 && b2 && n1 == n2 && muon_state_save(o1, b1, n1) == MUON_OK && muon_state_save(o2, b2, n2) == MUON_OK &&
            test_same_state(b1, b2, n1), "the checkpoints differ (%zu, %zu bytes)", n1, n2);
  free(b1);
  free(b2);
  muon_destroy(o1);
  muon_destroy(o2);
}

/* ---- 7. finite values that overflow: the commit's own check -------------------------------
   Catches: a finite gradient whose square overflows the second moment (+Inf written with
   MUON_OK: the element never moves again and the next checkpoint does not load), a loaded first
   moment that drives the param to -Inf, a matrix whose update or bf16 mirror overflows, a step
   that writes anything before noticing, and a SKIP that leaks into the other params or leaves a
   state muon_state_load refuses. */
static int adw_all_finite(const float *x, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) if (!muon__finite(x[i])) return 0;
  return 1;
}

static void test_overflow_adamw(void) {
  /* 6e20 squared overflows however the product is grouped; 2e19 only where g*g comes first */
  const float big[2] = { 1e30f, 2e19f };
  int k;
  for (k = 0; k < 2; k++) {
    adw_model *a = (adw_model *)calloc(1, sizeof *a), *ref = (adw_model *)calloc(1, sizeof *ref),
              *before = (adw_model *)calloc(1, sizeof *before);
    muon_optimizer *oa = NULL, *oref = NULL, *ol = NULL;
    unsigned char *blob0 = NULL, *blob1 = NULL;
    size_t n0 = 0, n1 = 0;
    muon_status st;
    char name[160];
    snprintf(name, sizeof name,
             "AdamW: a finite gradient of %g never leaves +Inf in v: ERROR changes nothing, SKIP skips that param "
             "alone and the saved state loads", (double)big[k]);
    TEST_CASE(name);
    adw_model_init(a, 61u);
    oa = adw_make(a, ADW_BASE, MUON_NONFINITE_ERROR);
    CHECK(oa != NULL, "create");
    if (!oa) { free(a); free(ref); free(before); continue; }
    adw_model_grads(a, 601u);
    CHECK(muon_step(oa) == MUON_OK, "step 1: %s", muon_error(oa));
    adw_model_grads(a, 602u);
    a->ge[8] = big[k];   /* in the second chunk */
    *before = *a;
    blob0 = adw_save(oa, &n0);
    st = muon_step(oa);
    if (k == 0 || st != MUON_OK) {   /* 2e19 may fit: then the state is finite and loads */
      CHECK(st == MUON_ERR_NONFINITE, "status %s, want MUON_ERR_NONFINITE", muon_status_string(st));
      CHECK(strstr(muon_error(oa), "'e'") != NULL, "the message does not name 'e': %s", muon_error(oa));
      CHECK(adw_same(a, before, sizeof *a), "a failed step changed a parameter");
      blob1 = adw_save(oa, &n1);
      CHECK(blob0 && blob1 && n0 == n1 && adw_same(blob0, blob1, n0), "a failed step changed the state");
      free(blob1); blob1 = NULL;
    }
    blob1 = adw_save(oa, &n1);
    CHECK(blob1 && muon_state_load(oa, blob1, n1) == MUON_OK, "the state after the step does not load: %s",
          muon_error(oa));
    CHECK(adw_all_finite(a->e, 10), "a non-finite param after MUON_OK");
    muon_destroy(oa);
    free(blob0); free(blob1); blob0 = blob1 = NULL;

    /* SKIP: 'e' keeps its value and state; the others move as in a run where e's gradient is tame */
    adw_model_init(a, 61u); adw_model_init(ref, 61u);
    oa = adw_make(a, ADW_BASE, MUON_NONFINITE_SKIP);
    oref = adw_make(ref, ADW_BASE, MUON_NONFINITE_SKIP);
    CHECK(oa && oref, "create");
    if (oa && oref) {
      adw_model_grads(a, 601u); adw_model_grads(ref, 601u);
      CHECK(muon_step(oa) == MUON_OK && muon_step(oref) == MUON_OK, "step 1");
      adw_model_grads(a, 602u); adw_model_grads(ref, 602u);
      a->ge[8] = big[k];   /* in the second chunk */
      *before = *a;
      CHECK(muon_step(oa) == MUON_OK && muon_step(oref) == MUON_OK, "SKIP step: %s", muon_error(oa));
      if (k == 0) CHECK(adw_same(a->e, before->e, sizeof a->e), "the overflowing param e moved under SKIP");
      CHECK(adw_same(a->w1, ref->w1, sizeof a->w1) && adw_same(a->w2, ref->w2, sizeof a->w2) &&
                adw_same(a->b, ref->b, sizeof a->b), "the other params differ from a run without the overflow");
      CHECK(adw_all_finite(a->e, 10), "a non-finite param after MUON_OK");
      blob0 = adw_save(oa, &n0);
      ol = adw_make(before, ADW_BASE, MUON_NONFINITE_SKIP);
      CHECK(ol != NULL, "create loader");
      CHECK(blob0 && ol && muon_state_load(ol, blob0, n0) == MUON_OK, "the state saved after SKIP does not load: %s",
            ol ? muon_error(ol) : "");
    }
    muon_destroy(oa); muon_destroy(oref); muon_destroy(ol);
    free(blob0);
    free(a); free(ref); free(before);
  }
}

/* A blob whose first moment is finite but extreme: the next step would make the param -Inf. */
static void test_overflow_loaded(void) {
  adw_model *a = (adw_model *)calloc(1, sizeof *a), *before = (adw_model *)calloc(1, sizeof *before);
  muon_optimizer *oa;
  unsigned char *blob, *blob1 = NULL;
  size_t n = 0, n1 = 0;
  muon_status st;
  TEST_CASE("AdamW: a loaded first moment of 3e38 makes the next step MUON_ERR_NONFINITE, not a -Inf param");
  adw_model_init(a, 71u);
  oa = adw_make(a, ADW_BASE, MUON_NONFINITE_ERROR);
  CHECK(oa != NULL, "create");
  if (!oa) { free(a); free(before); return; }
  adw_model_grads(a, 701u);
  CHECK(muon_step(oa) == MUON_OK, "step 1: %s", muon_error(oa));
  blob = adw_save(oa, &n);
  CHECK(blob && n > 8 + 80, "save");
  if (blob) {
    /* 'e' (10 floats) is the last AdamW entry: its m, its v, then the checksum */
    const float huge = 3e38f, zero = 0.0f;
    uint64_t sum;
    int i;
    memcpy(blob + n - 8 - 80 + 9 * 4, &huge, 4);   /* m[9]: the second chunk */
    memcpy(blob + n - 8 - 40 + 9 * 4, &zero, 4);   /* v[9] = 0: m / (sqrt(v) / bc2 + eps) then overflows */
    sum = muon__fnv1a(blob, n - 8);
    for (i = 0; i < 8; i++) blob[n - 8 + i] = (unsigned char)(sum >> (8 * i));
    CHECK(muon_state_load(oa, blob, n) == MUON_OK, "a finite moment must load: %s", muon_error(oa));
    adw_model_grads(a, 702u);
    a->ge[9] = 0.5f;
    *before = *a;
    st = muon_step(oa);
    CHECK(st == MUON_ERR_NONFINITE && strstr(muon_error(oa), "'e'"), "status %s: %s", muon_status_string(st),
          muon_error(oa));
    CHECK(adw_same(a, before, sizeof *a), "a failed step changed a parameter");
    blob1 = adw_save(oa, &n1);
    CHECK(blob1 && n1 == n && adw_same(blob, blob1, n), "a failed step changed the state");
  }
  free(blob); free(blob1);
  muon_destroy(oa);
  free(a); free(before);
}

/* The Muon side: p*decay - step*O overflowing, and a bf16 mirror that rounds to Inf. */
static void test_overflow_matrix(void) {
  int k;
  for (k = 0; k < 2; k++) {
    adw_model *a = (adw_model *)calloc(1, sizeof *a), *before = (adw_model *)calloc(1, sizeof *before);
    uint16_t mirror[30 * 10], mirror0[30 * 10];
    muon_optimizer *oa = NULL;
    muon_desc d = muon_default_desc();
    muon_matrix w = muon_default_matrix();
    unsigned char *blob0 = NULL, *blob1 = NULL;
    size_t n0 = 0, n1 = 0, i;
    muon_status st;
    int mode;
    TEST_CASE(k == 0 ? "Muon: a parameter at FLT_MAX whose update overflows: MUON_ERR_NONFINITE naming it, nothing "
                       "applied; SKIP skips it alone"
                     : "Muon: a bf16 mirror that would round to Inf: MUON_ERR_NONFINITE naming it, nothing applied");
    for (mode = 0; mode < 2; mode++) {
      adw_model_init(a, 81u);
      for (i = 0; i < 30 * 10; i++) a->w2[i] = k == 0 ? FLT_MAX : 3.4e38f;
      memset(mirror, 0, sizeof mirror);
      d.hparams.lr = k == 0 ? 1e33f : 2e-2f;
      d.hparams.weight_decay = 0.0f;
      d.on_nonfinite = mode ? MUON_NONFINITE_SKIP : MUON_NONFINITE_ERROR;
      CHECK(muon_create(&oa, &d) == MUON_OK, "create");
      if (!oa) break;
      w.name = "w2"; w.param = a->w2; w.grad = a->g2; w.rows = 30; w.cols = 10;
      w.mirror = k == 1 ? mirror : NULL;
      CHECK(muon_add_matrix(oa, &w, NULL) == MUON_OK, "add: %s", muon_error(oa));
      w.name = "w1"; w.param = a->w1; w.grad = a->g1; w.rows = 24; w.cols = 20; w.mirror = NULL;
      CHECK(muon_add_matrix(oa, &w, NULL) == MUON_OK, "add: %s", muon_error(oa));
      adw_model_grads(a, 801u);
      *before = *a;
      memcpy(mirror0, mirror, sizeof mirror);
      blob0 = adw_save(oa, &n0);
      st = muon_step(oa);
      if (!mode) {
        CHECK(st == MUON_ERR_NONFINITE && strstr(muon_error(oa), "'w2'"), "status %s: %s", muon_status_string(st),
              muon_error(oa));
        CHECK(adw_same(a, before, sizeof *a) && adw_same(mirror, mirror0, sizeof mirror),
              "a failed step changed a parameter or the mirror");
      } else {
        CHECK(st == MUON_OK, "SKIP: %s", muon_error(oa));
        CHECK(adw_same(a->w2, before->w2, sizeof a->w2) && adw_same(mirror, mirror0, sizeof mirror),
              "the overflowing matrix moved under SKIP");
        CHECK(!adw_same(a->w1, before->w1, sizeof a->w1), "the other matrix did not move under SKIP");
      }
      blob1 = adw_save(oa, &n1);
      if (!mode) CHECK(blob0 && blob1 && n0 == n1 && adw_same(blob0, blob1, n0), "a failed step changed the state");
      {
        const float *mom = NULL;
        size_t nm = 0;
        CHECK(muon_get_momentum(oa, 0, &mom, &nm) == MUON_OK && nm == 300 && adw_all_finite(mom, nm), "momentum");
        for (i = 0; mom && i < nm; i++) if (mom[i] != 0.0f) break;
        CHECK(mom && i == nm, "the momentum of w2 moved");
      }
      CHECK(blob1 && muon_state_load(oa, blob1, n1) == MUON_OK, "the state does not load: %s", muon_error(oa));
      free(blob0); free(blob1); blob0 = blob1 = NULL;
      muon_destroy(oa); oa = NULL;
    }
    free(a); free(before);
  }
}

int main(void) {
  test_nonfinite_error();
  test_nonfinite_skip();
  test_lr_schedule();
  test_bad_group_args();
  test_state_guards();
  test_shards();
  test_stacks();
  test_overflow_adamw();
  test_overflow_loaded();
  test_overflow_matrix();
  return test_summary();
}
