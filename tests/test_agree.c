/* test_agree.c - "ranks agree or nobody moves", over Gloo, multi-process. Run under muonrun:

     muonrun -n N build/test_agree          (N = 1 runs the cases that need no second rank)

   Every case runs on every rank. Where ranks must agree, each rank's status is allgathered on
   the world communicator and compared; "nothing applied" means that every local parameter
   piece and every momentum buffer (muon_get_momentum) is bitwise what it was before the step,
   on every rank; "equals a run" means bitwise equality with a second optimizer, stepped in
   lockstep on the same ranks with the same data, to which the incident never happened.

   The world is created with a Gloo timeout of 10 s (MUON_GLOO_TIMEOUT overrides it): no case
   expects a timeout, so one that happens is a hang that the library should have avoided, and
   it costs seconds, not the default 300. Each case says in a comment what it would catch.

   The test's own collectives (gather_int, all_true, expect_all, expect_unchanged, ...) share
   the world communicator with muon's: they are called on every rank in the same order, never
   in a rank-dependent branch (Gloo aborts the process on a message longer than the receive).
   AGREE_TRACE=1 prints every expected status as it is checked. */
#define MUON_IMPLEMENTATION
#include "../examples/common.h"
#include "test.h"
#include "settings.h"

#include <float.h>
#include <signal.h>
#include <time.h>

#define MAXM 10      /* matrices per test model */
#define MAXP 64      /* ranks */

static ex_world W;

/* ---- helpers: world-wide exchanges ------------------------------------------------------------ */
static void gather_int(int v, int *all) {
  if (W.world.vt->allgather(W.world.ctx, &v, all, sizeof v) != MUON_OK) {
    int r;
    for (r = 0; r < W.size; r++) all[r] = -1;
  }
}
static long long gather_ll_max(long long v) {
  long long all[MAXP], m = v;
  int r;
  if (W.world.vt->allgather(W.world.ctx, &v, all, sizeof v) != MUON_OK) return -1;
  for (r = 0; r < W.size; r++) if (all[r] > m) m = all[r];
  return m;
}
static int all_true(int v) {
  int all[MAXP], r, ok = 1;
  gather_int(v, all);
  for (r = 0; r < W.size; r++) ok &= all[r] == 1;
  return ok;
}
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static int has(const char *msg, const char *needle) { return strstr(msg, needle) != NULL; }

/* This rank got `want`, and so did every other rank (the statuses are allgathered). */
static void expect_all(const char *what, muon_status st, muon_status want, const muon_optimizer *opt) {
  int all[MAXP], r;
  if (getenv("AGREE_TRACE")) { printf("TRACE %s: %s %s\n", what, muon_status_string(st), opt ? muon_error(opt) : ""); fflush(stdout); }
  gather_int((int)st, all);
  CHECK(st == want, "%s: rank %d returned %s, want %s (%s)", what, W.rank, muon_status_string(st),
        muon_status_string(want), opt ? muon_error(opt) : "");
  for (r = 0; r < W.size; r++)
    if (r != W.rank)
      CHECK(all[r] == (int)want, "%s: rank %d saw rank %d return %s, want %s on every rank", what, W.rank, r,
            all[r] >= 0 && all[r] < MUON_STATUS_COUNT ? muon_status_string((muon_status)all[r]) : "?", muon_status_string(want));
}

/* ---- helpers: test matrices (as test_dist.c) ------------------------------------------------- */
#include "tmat.h"

/* How a matrix of a model is laid out over the world. */
enum { K_SHARD0, K_SHARD1, K_REPL, K_WHOLE };
typedef struct mspec { const char *name; int rows, cols, kind, group; } mspec;

/* Every rank holds a piece of each (at P <= 4 no piece is empty): FSDP rows, TP columns, DDP. */
static const mspec STD[3] = { { "a", 16, 24, K_SHARD0, 0 }, { "b", 24, 16, K_SHARD1, 0 }, { "c", 12, 20, K_REPL, 0 } };
/* More matrices than ranks, so that some owner has two and a small round_bytes splits rounds. */
static const mspec MANY[8] = { { "m0", 16, 24, K_SHARD0, 0 }, { "m1", 16, 20, K_SHARD0, 0 }, { "m2", 16, 16, K_SHARD0, 0 },
                               { "m3", 16, 28, K_SHARD0, 0 }, { "m4", 16, 12, K_SHARD0, 0 }, { "m5", 16, 32, K_SHARD0, 0 },
                               { "m6", 16, 8, K_SHARD0, 0 }, { "m7", 16, 18, K_SHARD0, 0 } };

static muon_layout layout_for(int kind) {
  muon_layout l;
  memset(&l, 0, sizeof l);
  if (kind == K_SHARD0) { l.n_levels = 1; l.levels[0] = muon_shard(0, &W.world); }
  if (kind == K_SHARD1) { l.n_levels = 1; l.levels[0] = muon_shard(1, &W.world); }
  if (kind == K_REPL) { l.n_levels = 1; l.levels[0] = muon_replicate(&W.world); }
  return l;
}

typedef struct model {
  muon_optimizer *opt;
  int n;
  tmat t[MAXM];
  int idx[MAXM];           /* local matrix index, -1 if this rank does not hold it */
} model;

/* group1, if not NULL, becomes group 1 (muon_add_group) before the matrices are registered. */
static int model_open_g(model *m, const muon_desc *d, const mspec *s, int n, const muon_hparams *group1) {
  int i, ok = 1;
  memset(m, 0, sizeof *m);
  for (i = 0; i < n; i++) {
    muon_layout l = layout_for(s[i].kind);
    tmat_init(&m->t[i], s[i].name, s[i].rows, s[i].cols, &l, 1.0f);
    m->idx[i] = -1;
  }
  m->n = n;
  if (muon_create(&m->opt, d) != MUON_OK) { m->opt = NULL; return 0; }
  if (group1 && muon_add_group(m->opt, group1, NULL) != MUON_OK) { printf("rank %d: add_group: %s\n", W.rank, muon_error(m->opt)); ok = 0; }
  for (i = 0; i < n; i++) {
    muon_matrix mm = muon_default_matrix();
    mm.name = m->t[i].name; mm.param = m->t[i].w; mm.grad = m->t[i].g;
    mm.rows = m->t[i].rows; mm.cols = m->t[i].cols; mm.layout = &m->t[i].layout; mm.group = s[i].group;
    if (muon_add_matrix(m->opt, &mm, &m->idx[i]) != MUON_OK) { printf("rank %d: add %s: %s\n", W.rank, s[i].name, muon_error(m->opt)); ok = 0; }
  }
  return ok;
}
static int model_open(model *m, const muon_desc *d, const mspec *s, int n) { return model_open_g(m, d, s, n, NULL); }
static void model_close(model *m) {
  int i;
  muon_destroy(m->opt);
  for (i = 0; i < m->n; i++) tmat_free(&m->t[i]);
  memset(m, 0, sizeof *m);
}
static int find(const model *m, const char *name) {
  int i;
  for (i = 0; i < m->n && strcmp(m->t[i].name, name); i++) {}
  return i;
}

/* Copies of every local parameter piece and momentum buffer. */
typedef struct snap { int n; float *p[MAXM + 1], *m[MAXM + 1]; size_t pn[MAXM + 1], mn[MAXM + 1]; } snap;
static void snap_take(const model *md, snap *s) {
  int i;
  memset(s, 0, sizeof *s);
  s->n = md->n;
  for (i = 0; i < md->n; i++) {
    const void *mom = NULL;
    size_t mn = 0;
    muon_momentum_format f = MUON_MOMENTUM_FP32;
    if (md->idx[i] < 0) continue;
    s->pn[i] = md->t[i].n;
    s->p[i] = (float *)malloc((s->pn[i] + 1) * sizeof(float));
    memcpy(s->p[i], md->t[i].w, s->pn[i] * sizeof(float));
    muon_get_momentum_stored(md->opt, md->idx[i], &mom, &mn, &f);
    s->mn[i] = mn * (f == MUON_MOMENTUM_BF16 ? 2 : 4);   /* bytes, whatever the format */
    s->m[i] = (float *)malloc(s->mn[i] + 4);
    if (mn) memcpy(s->m[i], mom, s->mn[i]);
  }
}
static int snap_same_one(const model *md, const snap *s, int i) {
  const void *mom = NULL;
  size_t mn = 0;
  muon_momentum_format f = MUON_MOMENTUM_FP32;
  if (md->idx[i] < 0) return 1;
  if (memcmp(s->p[i], md->t[i].w, s->pn[i] * sizeof(float)) != 0) return 0;
  if (muon_get_momentum_stored(md->opt, md->idx[i], &mom, &mn, &f) != MUON_OK) return 0;
  mn *= f == MUON_MOMENTUM_BF16 ? 2 : 4;
  return mn == s->mn[i] && (mn == 0 || memcmp(s->m[i], mom, mn) == 0);
}
static int snap_same(const model *md, const snap *s) {
  int i, ok = 1;
  for (i = 0; i < s->n; i++) ok &= snap_same_one(md, s, i);
  return ok;
}
static void snap_free(snap *s) {
  int i;
  for (i = 0; i <= MAXM; i++) { free(s->p[i]); free(s->m[i]); }
  memset(s, 0, sizeof *s);
}
/* Nothing applied: this rank's parameters and momentum are bitwise as in the snapshot, and
   every other rank says the same of its own. */
static void expect_unchanged(const char *what, const model *md, const snap *s) {
  int mine = snap_same(md, s), all = all_true(mine);
  CHECK(mine, "%s: rank %d's parameters or momentum changed (something was applied)", what, W.rank);
  CHECK(all, "%s: some rank's parameters or momentum changed (rank %d's view)", what, W.rank);
}

/* Matrix i of a and of b: parameters and momentum bitwise equal. */
static int same_matrix(const model *a, const model *b, int i) {
  const float *ma = NULL, *mb = NULL;
  size_t na = 0, nb = 0;
  if (a->idx[i] < 0 || b->idx[i] < 0) return a->idx[i] < 0 && b->idx[i] < 0;
  if (a->t[i].n != b->t[i].n || memcmp(a->t[i].w, b->t[i].w, a->t[i].n * sizeof(float)) != 0) return 0;
  muon_get_momentum(a->opt, a->idx[i], &ma, &na);
  muon_get_momentum(b->opt, b->idx[i], &mb, &nb);
  return na == nb && (na == 0 || memcmp(ma, mb, na * sizeof(float)) == 0);
}
/* The first n matrices of a and b equal on every rank. */
static void expect_equal(const char *what, const model *a, const model *b, int n) {
  int i, mine = 1;
  for (i = 0; i < n; i++)
    if (!same_matrix(a, b, i)) {
      if (mine) printf("  rank %d: %s: matrix '%s' differs from the reference run\n", W.rank, what, a->t[i].name);
      mine = 0;
    }
  CHECK(mine, "%s: rank %d differs from the run where nothing happened", what, W.rank);
  CHECK(all_true(mine), "%s: some rank differs from the reference run", what);
}
static int changed(const tmat *t) { return t->n == 0 || memcmp(t->w, t->w0, t->n * sizeof(float)) != 0; }

static muon_desc desc_for(const muon_dist_config *cfg) {
  muon_desc d = muon_default_desc();
  d.hparams.lr = 0.02f;
  d.comm = &W.world;
  d.dist = cfg;
  return d;
}

/* Steps both models (the one under test and the reference) and expects MUON_OK everywhere. */
static void step_both(const char *what, model *a, model *b) {
  char buf[160];
  muon_status st = muon_step(a->opt);
  snprintf(buf, sizeof buf, "%s (run under test)", what);
  expect_all(buf, st, MUON_OK, a->opt);
  if (!b) return;
  st = muon_step(b->opt);
  snprintf(buf, sizeof buf, "%s (reference run)", what);
  expect_all(buf, st, MUON_OK, b->opt);
}

/* ==== 1. a rank adds a matrix after the first step ============================================
   Catches: only the adding rank re-planning (the others would exchange with a stale plan:
   counts that disagree, a hang, or a rank-local failure); a status that differs between ranks;
   a global list or owner that misses the new matrix; a re-plan that perturbs the other
   matrices (compared bitwise with a run that never added it); the new matrix not updated, or
   updated differently from the same matrix on one device. */
static void case_add_matrix(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A, B;
  tmat x;
  muon_layout whole;
  char xname[32];
  int gc[MAXP], r, g, last = W.size - 1, found = 0, owner_ok = 0;
  TEST_CASE("1. one rank adds a matrix after step 1: all re-plan, the step succeeds everywhere, others bitwise unaffected");
  if (!model_open(&A, &d, STD, 3) || !model_open(&B, &d, STD, 3)) { CHECK(0, "setup: %s", A.opt ? muon_error(A.opt) : "create"); return; }
  step_both("step 1", &A, &B);
  gather_int(muon_global_count(A.opt), gc);
  for (r = 0; r < W.size; r++) CHECK(gc[r] == 3, "before the add rank %d sees %d global matrices, want 3", r, gc[r]);
  memset(&whole, 0, sizeof whole);
  snprintf(xname, sizeof xname, "only_on_rank%d", last);
  tmat_init(&x, xname, 8, 12, &whole, 1.0f);
  if (W.rank == last) {
    muon_matrix m = muon_default_matrix();
    m.name = x.name; m.param = x.w; m.grad = x.g; m.rows = x.rows; m.cols = x.cols; m.layout = &whole;
    CHECK(muon_add_matrix(A.opt, &m, NULL) == MUON_OK, "add: %s", muon_error(A.opt));
  }
  step_both("step 2, after the add", &A, &B);
  gather_int(muon_global_count(A.opt), gc);
  for (r = 0; r < W.size; r++) CHECK(gc[r] == 4, "after the add rank %d sees %d global matrices, want 4 (3 + 1)", r, gc[r]);
  for (g = 0; g < muon_global_count(A.opt); g++) {
    muon_matrix_info info;
    int owner = -1;
    if (muon_global_info(A.opt, g, &info, &owner) == MUON_OK && !strcmp(info.name, xname)) {
      found = 1;
      owner_ok = owner == last && info.n_holders == 1 && info.holders[0] == last;
    }
  }
  CHECK(found && owner_ok, "rank %d: the new matrix is %s in the global list (owner must be its only holder, rank %d)",
        W.rank, found ? "misplaced" : "missing", last);
  expect_equal("the other matrices after the re-planned step", &A, &B, 3);
  step_both("step 3", &A, &B);
  expect_equal("the other matrices after step 3", &A, &B, 3);
  if (W.rank == last) {
    /* The same matrix on one device, two steps from the same start: bitwise the same. */
    muon_desc rd = muon_default_desc();
    muon_optimizer *ref = NULL;
    muon_matrix m = muon_default_matrix();
    float *w = (float *)malloc(x.n * sizeof(float));
    memcpy(w, x.w0, x.n * sizeof(float));
    rd.hparams = d.hparams;
    m.name = x.name; m.param = w; m.grad = x.g; m.rows = x.rows; m.cols = x.cols;
    if (muon_create(&ref, &rd) == MUON_OK && muon_add_matrix(ref, &m, NULL) == MUON_OK) {
      CHECK(muon_step(ref) == MUON_OK && muon_step(ref) == MUON_OK, "single-device reference: %s", muon_error(ref));
      CHECK(changed(&x), "the new matrix was not updated");
      CHECK(memcmp(w, x.w, x.n * sizeof(float)) == 0, "the new matrix differs from the same matrix stepped on one device");
    } else {
      CHECK(0, "single-device reference setup");
    }
    muon_destroy(ref);
    free(w);
  }
  tmat_free(&x);
  model_close(&A);
  model_close(&B);
}

/* ==== 2. one rank changes a group's Newton-Schulz settings ====================================
   Catches: the other ranks stepping with their old plan (they would succeed while the changed
   rank fails, or the exchange would hang); a re-plan that silently accepts different NS
   settings per rank; a message that does not say what differs or where; anything applied by
   a failed step; a rank that stays stuck after the setting is restored (the re-plan must then
   happen together), or whose result afterwards differs from a run without the incident. */
static void case_ns_change(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A, B;
  muon_hparams orig, hp;
  snap s;
  char ranks[32];
  int last = W.size - 1;
  muon_status st;
  if (W.size < 2) return;
  TEST_CASE("2. one rank changes ns_steps after step 1: MUON_ERR_MISMATCH everywhere, nothing applied; restoring heals");
  if (!model_open(&A, &d, STD, 3) || !model_open(&B, &d, STD, 3)) { CHECK(0, "setup"); return; }
  step_both("step 1", &A, &B);
  muon_get_group(A.opt, 0, &orig);
  hp = orig;
  hp.ns_steps = orig.ns_steps + 1;
  if (W.rank == last) CHECK(muon_set_group(A.opt, 0, &hp) == MUON_OK, "set_group: %s", muon_error(A.opt));
  snap_take(&A, &s);
  st = muon_step(A.opt);
  expect_all("step with different ns_steps on one rank", st, MUON_ERR_MISMATCH, A.opt);
  snprintf(ranks, sizeof ranks, "ranks 0 and %d", last);
  CHECK(has(muon_error(A.opt), "muon_hparams.ns_steps of group 0"), "rank %d: message '%s' does not name ns_steps",
        W.rank, muon_error(A.opt));
  CHECK(has(muon_error(A.opt), ranks), "rank %d: message '%s' does not name %s", W.rank, muon_error(A.opt), ranks);
  expect_unchanged("the mismatched step", &A, &s);
  snap_free(&s);
  if (W.rank == last) CHECK(muon_set_group(A.opt, 0, &orig) == MUON_OK, "restore: %s", muon_error(A.opt));
  step_both("step 2, setting restored", &A, &B);
  expect_equal("after the restored step", &A, &B, 3);
  model_close(&A);
  model_close(&B);
}

/* ==== 3. other settings that must match ========================================================
   Catches, per setting: a rank applying its own lr / weight decay / gradient scale (different
   parameters on different replicas of the same matrix, silently); on_nonfinite differing (one
   rank would skip a matrix that another applies); round_bytes differing (different rounds: a
   hang or mismatched exchange, or the plan check blaming a custom assign that does not exist);
   a status that differs between ranks, a message that does not name the setting, group and
   ranks, and anything applied by the failed step. */
enum { MM_LR, MM_WD, MM_NONFINITE, MM_SCALE, MM_ROUND_BYTES, MM_WIRE, MM_PREFETCH };
static void mismatch_case(int kind) {
  static const char *const titles[7] = {
    "3a. lr differs on one rank (muon_set_lr): MUON_ERR_MISMATCH everywhere naming lr of group 0, nothing applied",
    "3b. weight_decay differs on one rank: MUON_ERR_MISMATCH everywhere naming it, nothing applied",
    "3c. desc.on_nonfinite differs at creation: MUON_ERR_MISMATCH everywhere naming it, nothing applied",
    "3d. muon_set_grad_scale differs on one rank: MUON_ERR_MISMATCH everywhere naming it, nothing applied",
    "3e. round_bytes differs at creation: MUON_ERR_MISMATCH naming round_bytes (not a custom assign), nothing applied",
    "3f. the wire format differs at creation (bf16 on one rank): MUON_ERR_MISMATCH naming wire, nothing applied",
    "3g. prefetch differs at creation (another order of collectives): MUON_ERR_MISMATCH naming prefetch, nothing applied" };
  static const char *const needles[7] = { "muon_hparams.lr of group 0", "muon_hparams.weight_decay of group 0",
                                          "on_nonfinite", "gradient scale", "round_bytes",
                                          "muon_dist_config.wire", "muon_dist_config.prefetch" };
  muon_dist_config cfg = muon_layout_config();
  muon_desc d;
  model A;
  snap s;
  char ranks[32];
  int last = W.size - 1, mine = W.rank == last;
  muon_status st;
  if (W.size < 2) return;
  TEST_CASE(titles[kind]);
  if (kind == MM_ROUND_BYTES && mine) cfg.round_bytes = 1;   /* every owner one matrix per round: other rounds */
  if (kind == MM_WIRE && mine) cfg.wire = MUON_WIRE_BF16;     /* half-size messages: garbage, or a hang, unchecked */
  if (kind == MM_PREFETCH) {   /* many rounds, so that the gathers and redistributions would interleave differently */
    cfg.round_bytes = 1;
    if (mine) { cfg.prefetch = 2; cfg.async = 1; }
  }
  d = desc_for(&cfg);
  if (kind == MM_NONFINITE && mine) d.on_nonfinite = MUON_NONFINITE_SKIP;
  if (!model_open(&A, &d, MANY, 8)) { CHECK(0, "setup"); return; }
  if (kind != MM_NONFINITE && kind != MM_ROUND_BYTES && kind != MM_WIRE && kind != MM_PREFETCH) {
    step_both("step 1 (settings still equal)", &A, NULL);
    if (mine) {
      muon_hparams hp;
      muon_get_group(A.opt, 0, &hp);
      if (kind == MM_LR) CHECK(muon_set_lr(A.opt, 0, hp.lr * 0.5f) == MUON_OK, "set_lr");
      if (kind == MM_WD) { hp.weight_decay *= 2; CHECK(muon_set_group(A.opt, 0, &hp) == MUON_OK, "set_group"); }
      if (kind == MM_SCALE) CHECK(muon_set_grad_scale(A.opt, 0.5f) == MUON_OK, "set_grad_scale");
    }
  }
  snap_take(&A, &s);
  st = muon_step(A.opt);
  expect_all(needles[kind], st, MUON_ERR_MISMATCH, A.opt);
  snprintf(ranks, sizeof ranks, "ranks 0 and %d", last);
  CHECK(has(muon_error(A.opt), needles[kind]), "rank %d: message '%s' does not name '%s'", W.rank, muon_error(A.opt), needles[kind]);
  CHECK(has(muon_error(A.opt), ranks), "rank %d: message '%s' does not name %s", W.rank, muon_error(A.opt), ranks);
  if (kind == MM_ROUND_BYTES)
    CHECK(!has(muon_error(A.opt), "assign"), "rank %d: message '%s' blames an assign", W.rank, muon_error(A.opt));
  expect_unchanged(needles[kind], &A, &s);
  snap_free(&s);
  model_close(&A);
}

/* ==== 3z. every setting of muon.h's lists, one at a time (tests/settings.h) =====================
   Generated from the lists the agreement digest is built from, so a field added there runs
   here. Each group field is set to its list value on the last rank, in group (field % 2), Muon
   group 1 and AdamW group 1 existing beside group 0: MUON_ERR_MISMATCH on every rank, the same
   message naming that field and group, nothing applied; restored, the step equals a run that
   never disagreed. Catches: a field left out of the digest (the step would succeed), a message
   that names another field or group, a rank that words it differently. */
static void expect_named(const char *what, const model *A, const char *field, const char *where) {
  char want[160], all_same[MAXP];
  const char *msg = muon_error(A->opt);
  unsigned long h = 5381;
  int hs[MAXP], r, mine;
  snprintf(want, sizeof want, "ranks 0 and %d disagree on %s%s (", W.size - 1, field, where);
  CHECK(has(msg, want), "%s: rank %d: message '%s' does not say '%s'", what, W.rank, msg, want);
  for (; *msg; msg++) h = h * 33u + (unsigned char)*msg;   /* the same words on every rank */
  mine = (int)(h & 0x7fffffff);
  gather_int(mine, hs);
  for (r = 0; r < W.size; r++) all_same[r] = hs[r] == hs[0];
  for (r = 0; r < W.size; r++) CHECK(all_same[r], "%s: rank %d's message differs from rank 0's", what, r);
}

/* A setting muon_set_group may not change once the group has matrices (momentum_format): it
   differs from registration on the last rank instead. */
static void registered_setting_differs(const muon_desc *d, int i) {
  muon_desc e = *d;
  char field[64], what[160];
  model C;
  snap s;
  tset_field_text("muon_hparams", &TSET_HPARAMS[i], field, sizeof field);
  snprintf(what, sizeof what, "%s of group 0 differs on rank %d from registration", field, W.size - 1);
  if (W.rank == W.size - 1) tset_hparams_alt(&e.hparams, i);
  if (!model_open(&C, &e, STD, 3)) { CHECK(0, "%s: setup", what); model_close(&C); return; }
  snap_take(&C, &s);
  expect_all(what, muon_step(C.opt), MUON_ERR_MISMATCH, C.opt);
  expect_named(what, &C, field, " of group 0");
  expect_unchanged(what, &C, &s);
  snap_free(&s);
  model_close(&C);
}

static void case_every_group_setting(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  muon_hparams g1 = d.hparams;
  model A, B;
  int list, i, last = W.size - 1;
  TEST_CASE("3z. the settings lists cover every byte of muon_hparams and muon_adamw_hparams");
  CHECK(tset_bytes(TSET_HPARAMS, TSET_N(TSET_HPARAMS)) == sizeof(muon_hparams) &&
            tset_bytes(TSET_ADAMW, TSET_N(TSET_ADAMW)) == sizeof(muon_adamw_hparams),
        "a field of muon_hparams or muon_adamw_hparams is missing from its list in muon.h: it has no case here");
  if (W.size < 2) return;
  TEST_CASE("3z. each field of MUON__HPARAMS_FIELDS / MUON__ADAMW_FIELDS differs on one rank: MISMATCH everywhere "
            "naming it and its group, nothing applied; restored, it heals");
  g1.lr = 0.03f;
  if (!model_open_g(&A, &d, STD, 3, &g1) || !model_open_g(&B, &d, STD, 3, &g1)) { CHECK(0, "setup"); return; }
  CHECK(muon_add_adamw_group(A.opt, &d.adamw, NULL) == MUON_OK &&
            muon_add_adamw_group(B.opt, &d.adamw, NULL) == MUON_OK, "adamw group 1");
  step_both("step 1", &A, &B);
  for (list = 0; list < 2; list++)
    for (i = 0; i < (list ? TSET_N(TSET_ADAMW) : TSET_N(TSET_HPARAMS)); i++) {
      int g = i % 2;
      char field[64], where[40], what[160];
      muon_hparams orig, hp;
      muon_adamw_hparams aorig = d.adamw, ahp = d.adamw;
      snap s;
      if (!list && !strcmp(TSET_HPARAMS[i].name, "momentum_format")) {   /* fixed once matrices are registered */
        registered_setting_differs(&d, i);
        continue;
      }
      muon_get_group(A.opt, g, &orig);
      hp = orig;
      if (list) {
        tset_field_text("muon_adamw_hparams", &TSET_ADAMW[i], field, sizeof field);
        snprintf(where, sizeof where, " of AdamW group %d", g);
        tset_adamw_alt(&ahp, i);
        CHECK(memcmp(&ahp, &aorig, sizeof ahp) != 0, "%s: the list's value is the one in use", field);
      } else {
        tset_field_text("muon_hparams", &TSET_HPARAMS[i], field, sizeof field);
        snprintf(where, sizeof where, " of group %d", g);
        tset_hparams_alt(&hp, i);
        CHECK(memcmp(&hp, &orig, sizeof hp) != 0, "%s: the list's value is the one in use", field);
      }
      snprintf(what, sizeof what, "%s%s differs on rank %d", field, where, last);
      if (W.rank == last)
        CHECK((list ? muon_set_adamw_group(A.opt, g, &ahp) : muon_set_group(A.opt, g, &hp)) == MUON_OK, "%s: set: %s",
              what, muon_error(A.opt));
      snap_take(&A, &s);
      expect_all(what, muon_step(A.opt), MUON_ERR_MISMATCH, A.opt);
      expect_named(what, &A, field, where);
      expect_unchanged(what, &A, &s);
      snap_free(&s);
      if (W.rank == last)
        CHECK((list ? muon_set_adamw_group(A.opt, g, &aorig) : muon_set_group(A.opt, g, &orig)) == MUON_OK,
              "%s: restore: %s", what, muon_error(A.opt));
      step_both(what, &A, &B);
      expect_equal(what, &A, &B, 3);
    }
  model_close(&A);
  model_close(&B);
}

/* ==== 3y. each setting of MUON__RUN_FIELDS differs on one rank =================================
   The optimizer's own settings (muon_desc, muon_dist_config, muon_set_grad_scale): a list line
   without a way to set it here fails. Each: MISMATCH everywhere, the list's name in the same
   message on every rank, nothing applied. */
static muon_status run_gather(void *state, const muon_matrix_info *m, const float *local, float *full, int owner) {
  (void)state; (void)m; (void)local; (void)full; (void)owner;
  return MUON_ERR_BACKEND;   /* never reached: the agreement fails first */
}
static muon_status run_redistribute(void *state, const muon_matrix_info *m, const float *full, float *local,
                                    int owner) {
  (void)state; (void)m; (void)full; (void)local; (void)owner;
  return MUON_ERR_BACKEND;
}
static muon_status run_assign(void *state, const muon_matrix_info *m, int n, int world_size, int *owner) {
  int i;
  (void)state; (void)world_size;
  for (i = 0; i < n; i++) owner[i] = m[i].holders[0];
  return MUON_OK;
}
/* Sets the run setting `name` to another value than the defaults: 1 if it knows it. `opt`
   NULL: before creation (desc, cfg); else after. */
static int run_perturb(const char *name, muon_desc *d, muon_dist_config *cfg, muon_optimizer *opt) {
  if (!strcmp(name, "grad_scale")) return !opt || muon_set_grad_scale(opt, 0.5f) == MUON_OK;
  if (opt) return 1;
  if (!strcmp(name, "on_nonfinite")) d->on_nonfinite = MUON_NONFINITE_SKIP;
  else if (!strcmp(name, "rounding")) d->rounding = MUON_ROUND_STOCHASTIC;
  else if (!strcmp(name, "seed")) d->seed = 12345;
  else if (!strcmp(name, "round_bytes")) cfg->round_bytes = 1;
  else if (!strcmp(name, "round_robin")) cfg->round_robin = 1;
  else if (!strcmp(name, "assign")) cfg->assign = run_assign;
  else if (!strcmp(name, "gather")) { cfg->gather = run_gather; cfg->redistribute = run_redistribute; }
  else if (!strcmp(name, "wire")) cfg->wire = MUON_WIRE_BF16;
  else if (!strcmp(name, "prefetch")) { cfg->prefetch = 2; cfg->async = 1; }
  else if (!strcmp(name, "unchecked_commit")) cfg->unchecked_commit = 1;
  else return 0;
  return 1;
}
static void case_every_run_setting(void) {
  int i, last = W.size - 1;
  if (W.size < 2) return;
  TEST_CASE("3y. each setting of MUON__RUN_FIELDS differs on one rank: MISMATCH everywhere naming it, nothing applied");
  for (i = 0; i < TSET_N(TSET_RUN); i++) {
    muon_dist_config cfg = muon_layout_config();
    muon_desc d;
    model A;
    snap s;
    char what[160];
    int known = 1;
    snprintf(what, sizeof what, "%s differs on rank %d", TSET_RUN[i].kind, last);
    cfg.round_bytes = 4096;   /* several rounds: prefetch and round_bytes change their order */
    d = desc_for(&cfg);
    if (W.rank == last) known = run_perturb(TSET_RUN[i].name, &d, &cfg, NULL);
    CHECK(known, "no case for the run setting '%s' of MUON__RUN_FIELDS in tests/test_agree.c's run_perturb",
          TSET_RUN[i].name);
    if (!model_open(&A, &d, MANY, 8)) { CHECK(0, "%s: setup", what); continue; }
    if (W.rank == last) CHECK(run_perturb(TSET_RUN[i].name, &d, &cfg, A.opt), "%s: set", what);
    snap_take(&A, &s);
    expect_all(what, muon_step(A.opt), MUON_ERR_MISMATCH, A.opt);
    expect_named(what, &A, TSET_RUN[i].kind, "");
    expect_unchanged(what, &A, &s);
    snap_free(&s);
    model_close(&A);
  }
}

/* ==== 3x. two ranks differ, in different ways ====================================================
   Rank 1 has another normuon in group 0, the last rank (at 3 ranks or more) one group more: every
   rank names rank 1's field (the first rank that differs) in the same words, and the rank with
   more groups joins the naming exchanges without reading past its groups. */
static void case_two_differ(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  muon_hparams extra = d.hparams;
  model A;
  snap s;
  char want[120];
  if (W.size < 3) return;
  TEST_CASE("3x. rank 1 differs in normuon, the last rank in its group count: every rank names rank 1's normuon");
  if (W.rank == 1) d.hparams.normuon = MUON_NORMUON_LARGER;
  if (!model_open_g(&A, &d, STD, 3, W.rank == W.size - 1 ? &extra : NULL)) { CHECK(0, "setup"); return; }
  snap_take(&A, &s);
  expect_all("two ranks differ", muon_step(A.opt), MUON_ERR_MISMATCH, A.opt);
  snprintf(want, sizeof want, "ranks 0 and 1 disagree on muon_hparams.normuon of group 0 (0 vs 2)");
  CHECK(has(muon_error(A.opt), want), "rank %d: message '%s' does not say '%s'", W.rank, muon_error(A.opt), want);
  expect_unchanged("two ranks differ", &A, &s);
  snap_free(&s);
  model_close(&A);
}

/* ==== 4. a state blob with other NS settings, loaded on one rank ===============================
   Catches: muon_state_load changing a group's NS settings without making the plan stale, or
   the agreement missing it (the loading rank would orthogonalise with other coefficients than
   its peers, or the ranks would fail differently); anything applied by the failed step. */
static void case_state_ns(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A;
  snap s;
  int last = W.size - 1, i;
  muon_status st;
  if (W.size < 2) return;
  TEST_CASE("4. one rank loads a state saved with other NS settings: MUON_ERR_MISMATCH everywhere, nothing applied");
  if (!model_open(&A, &d, STD, 3)) { CHECK(0, "setup"); return; }
  step_both("step 1", &A, NULL);
  if (W.rank == last) {
    /* A twin of A with 3 NS steps instead of 5; it never steps, so it talks to no one. */
    muon_desc hd = d;
    muon_optimizer *h = NULL;
    void *blob = NULL;
    size_t n = 0;
    hd.hparams.ns_steps = d.hparams.ns_steps - 2;
    if (muon_create(&h, &hd) == MUON_OK) {
      for (i = 0; i < 3; i++) {
        muon_matrix m = muon_default_matrix();
        m.name = A.t[i].name; m.param = A.t[i].w; m.grad = A.t[i].g; m.rows = A.t[i].rows; m.cols = A.t[i].cols;
        m.layout = &A.t[i].layout;
        CHECK(muon_add_matrix(h, &m, NULL) == MUON_OK, "twin add: %s", muon_error(h));
      }
      n = muon_state_size(h);
      blob = malloc(n);
      CHECK(muon_state_save(h, blob, n) == MUON_OK, "twin save: %s", muon_error(h));
      CHECK(muon_state_load(A.opt, blob, n) == MUON_OK, "load: %s", muon_error(A.opt));
      {
        muon_hparams hp;
        muon_get_group(A.opt, 0, &hp);
        CHECK(hp.ns_steps == hd.hparams.ns_steps, "the load did not take the blob's ns_steps");
      }
    } else {
      CHECK(0, "twin create");
    }
    free(blob);
    muon_destroy(h);
  }
  snap_take(&A, &s);
  st = muon_step(A.opt);
  expect_all("step after the load", st, MUON_ERR_MISMATCH, A.opt);
  CHECK(has(muon_error(A.opt), "muon_hparams.ns_steps of group 0"), "rank %d: message '%s'", W.rank, muon_error(A.opt));
  expect_unchanged("the step after the load", &A, &s);
  snap_free(&s);
  model_close(&A);
}

/* ==== 5. muon_plan on one rank while the others call muon_step =================================
   Catches: a hang (the planner's collectives not matching the steppers'); the steppers going
   ahead with the step (they must fail, having spent their collectives on planning); the planner
   returning OK while the others fail (one status for everyone: its next step would wait for a
   step nobody else takes); anything applied; and the next regular step not matching a run where
   it never happened (a plan left half-built, a step counter advanced). */
static void case_plan_vs_step(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A, B;
  snap s;
  int all[MAXP], r, last = W.size - 1;
  double t0, dt;
  muon_status st;
  if (W.size < 2) return;
  TEST_CASE("5. muon_plan on one rank, muon_step on the others: all return MISMATCH at once, each naming the other call");
  if (!model_open(&A, &d, STD, 3) || !model_open(&B, &d, STD, 3)) { CHECK(0, "setup"); return; }
  step_both("step 1", &A, &B);
  snap_take(&A, &s);
  t0 = now_s();
  st = W.rank == last ? muon_plan(A.opt) : muon_step(A.opt);
  dt = now_s() - t0;
  gather_int((int)st, all);
  for (r = 0; r < W.size; r++)
    CHECK(all[r] == MUON_ERR_MISMATCH, "rank %d returned %s, want MUON_ERR_MISMATCH", r,
          all[r] >= 0 && all[r] < MUON_STATUS_COUNT ? muon_status_string((muon_status)all[r]) : "?");
  CHECK(has(muon_error(A.opt), W.rank == last ? "called muon_step" : "called muon_plan"),
        "rank %d: message '%s' does not name the other call", W.rank, muon_error(A.opt));
  CHECK(dt < 2.0, "rank %d took %.3f s to return", W.rank, dt);
  expect_unchanged("the step that met a muon_plan", &A, &s);
  snap_free(&s);
  step_both("step 2 on every rank", &A, &B);
  expect_equal("after the next step", &A, &B, 3);
  model_close(&A);
  model_close(&B);
}

/* ==== 5b. ranks restored from checkpoints of different steps, or of different runs ===========
   Each rank loads its own blob, the documented restart path. Catches: a rank restored from
   another step, or from another job's checkpoint of the same model, step and settings, going
   on (replicated AdamW params would differ across ranks, momentum would be stitched from two
   runs); statuses that differ; anything applied; fresh ranks not sharing rank 0's identity; a
   consistent restore refused. */
static uint64_t get64le(const unsigned char *p);
static unsigned char *saved(const model *m, size_t *n) {
  unsigned char *b;
  *n = muon_state_size(m->opt);
  b = (unsigned char *)malloc(*n);
  CHECK(muon_state_save(m->opt, b, *n) == MUON_OK, "save: %s", muon_error(m->opt));
  return b;
}
static void restore_expect(model *A, const unsigned char *b, size_t n, const char *what, const char *needle) {
  snap s;
  muon_status st;
  CHECK(muon_state_load(A->opt, b, n) == MUON_OK, "%s: load: %s", what, muon_error(A->opt));
  snap_take(A, &s);
  st = muon_step(A->opt);
  expect_all(what, st, MUON_ERR_MISMATCH, A->opt);
  CHECK(has(muon_error(A->opt), needle), "%s: rank %d's message '%s' does not say '%s'", what, W.rank,
        muon_error(A->opt), needle);
  expect_unchanged(what, A, &s);
  snap_free(&s);
}
static void case_mixed_checkpoints(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A, B;
  unsigned char *a1, *a2, *b2;
  size_t n1, n2, nb;
  uint64_t run_a[MAXP], run_b[MAXP], mine;
  int last = W.size - 1, r, same = 1;
  if (W.size < 2) return;
  TEST_CASE("5b. per-rank restores from different steps or runs: MISMATCH on every rank, nothing applied; one identity per run");
  if (!model_open(&A, &d, STD, 3) || !model_open(&B, &d, STD, 3)) { CHECK(0, "setup"); return; }
  step_both("step 1", &A, &B);
  a1 = saved(&A, &n1);
  step_both("step 2", &A, &B);
  a2 = saved(&A, &n2);
  b2 = saved(&B, &nb);
  /* the blob's run field (header bytes 32..40): one per run, agreed by its ranks at the first step */
  mine = get64le(a2 + 32);
  W.world.vt->allgather(W.world.ctx, &mine, run_a, sizeof mine);
  mine = get64le(b2 + 32);
  W.world.vt->allgather(W.world.ctx, &mine, run_b, sizeof mine);
  for (r = 0; r < W.size; r++) same &= run_a[r] == run_a[0] && run_b[r] == run_b[0];
  CHECK(same && run_a[0] && run_b[0] && run_a[0] != run_b[0],
        "run identities: every rank of a run must save its rank 0's, two runs two (A %016llx, B %016llx)",
        (unsigned long long)run_a[0], (unsigned long long)run_b[0]);
  restore_expect(&A, W.rank == last ? a1 : a2, W.rank == last ? n1 : n2, "the last rank restored step 1, the others step 2",
                 "different steps");
  restore_expect(&A, W.rank == last ? b2 : a2, W.rank == last ? nb : n2, "the last rank restored another run's step 2",
                 "different runs");
  CHECK(muon_state_load(A.opt, a2, n2) == MUON_OK, "load: %s", muon_error(A.opt));
  step_both("every rank restored its own step-2 blob", &A, &B);
  expect_equal("restored, then one step", &A, &B, 3);
  free(a1); free(a2); free(b2);
  model_close(&A);
  model_close(&B);
}

/* ==== 6. a NaN gradient on one rank ============================================================
   ERROR catches: a rank that does not see the NaN (it is on another rank) stepping on, ranks
   failing with different statuses, a message without the matrix or the rank, anything applied.
   SKIP catches: the matrix skipped only on the rank holding the NaN (its replicas/shards would
   diverge), other matrices not updated, or updated differently from a run where that gradient
   was absent on all ranks; momentum of the skipped matrix touched; a skip that leaks into the
   next step. */
static void case_nan_grad(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A, B;
  snap s;
  char rk[32];
  int last = W.size - 1, bi;
  float keep;
  muon_status st;
  TEST_CASE("6a. NaN gradient on one rank, on_nonfinite ERROR: MUON_ERR_NONFINITE everywhere naming matrix and rank, nothing applied");
  if (!model_open(&A, &d, STD, 3)) { CHECK(0, "setup"); return; }
  step_both("step 1", &A, NULL);
  bi = find(&A, "b");
  keep = A.t[bi].g[0];
  if (W.rank == last) A.t[bi].g[0] = NAN;
  snap_take(&A, &s);
  st = muon_step(A.opt);
  expect_all("NaN step", st, MUON_ERR_NONFINITE, A.opt);
  snprintf(rk, sizeof rk, "rank %d", last);
  CHECK(has(muon_error(A.opt), "'b'") && has(muon_error(A.opt), rk), "rank %d: message '%s' does not name matrix 'b' and %s",
        W.rank, muon_error(A.opt), rk);
  expect_unchanged("the NaN step", &A, &s);
  snap_free(&s);
  A.t[bi].g[0] = keep;
  step_both("the step after the NaN is gone", &A, NULL);
  model_close(&A);

  TEST_CASE("6b. NaN gradient on one rank, SKIP: skipped on every rank, others updated = run with that gradient absent");
  d.on_nonfinite = MUON_NONFINITE_SKIP;
  if (!model_open(&A, &d, STD, 3) || !model_open(&B, &d, STD, 3)) { CHECK(0, "setup"); return; }
  step_both("step 1", &A, &B);
  snap_take(&A, &s);
  if (W.rank == last) A.t[bi].g[0] = NAN;
  muon_set_grad(B.opt, B.idx[bi], NULL);
  step_both("step 2 (NaN vs absent)", &A, &B);
  {
    int mine = snap_same_one(&A, &s, bi);
    CHECK(mine, "rank %d: the skipped matrix 'b' changed", W.rank);
    CHECK(all_true(mine), "matrix 'b' changed on some rank");
    CHECK(!snap_same_one(&A, &s, find(&A, "a")) && !snap_same_one(&A, &s, find(&A, "c")), "rank %d: a healthy matrix was not updated", W.rank);
  }
  expect_equal("NaN-skipped vs absent", &A, &B, 3);
  A.t[bi].g[0] = keep;
  muon_set_grad(B.opt, B.idx[bi], B.t[bi].g);
  step_both("step 3 (gradients back)", &A, &B);
  expect_equal("the step after the skip", &A, &B, 3);
  snap_free(&s);
  model_close(&A);
  model_close(&B);
}

/* ==== 7. non-finite Newton-Schulz outputs ======================================================
   The gradients are finite, so only the output check can catch these. Catches: an overflowed
   momentum (SGD style, nesterov: U = G + mu (mu B + G) > FLT_MAX) or absurd coefficients
   writing Inf/NaN into parameters; the non-owners (who never see the output) applying while
   the owner refuses; with SKIP, the matrix skipped only on its owner, or the others not
   updated as in a run without that matrix's gradient. */
static void set_huge(tmat *t) {
  size_t e;
  for (e = 0; e < t->n; e++) t->g[e] = 3e38f;
}
static int all_finite(const model *m) {
  int i;
  size_t e;
  for (i = 0; i < m->n; i++)
    for (e = 0; m->idx[i] >= 0 && e < m->t[i].n; e++) if (!isfinite(m->t[i].w[e])) return 0;
  return 1;
}
static void nonfinite_output_case(int coefficients, int skip) {
  static const char *const titles[4] = {
    "7a. SGD momentum overflow (grads 3e38), ERROR: MUON_ERR_NONFINITE 'Newton-Schulz output' everywhere, nothing applied",
    "7b. SGD momentum overflow (grads 3e38), SKIP: that matrix skipped everywhere, others = run without its gradient",
    "7c. ns_coefficients (1e30, 1e30, 1e30) on every rank, ERROR: MUON_ERR_NONFINITE everywhere, nothing applied",
    "7d. ns_coefficients (1e30, 1e30, 1e30) on every rank, SKIP: that matrix skipped everywhere, others updated" };
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  mspec sp[3];
  muon_hparams g1;
  model A, B;
  snap s;
  int bi, k;
  muon_status st;
  TEST_CASE(titles[2 * coefficients + skip]);
  memcpy(sp, STD, sizeof sp);
  if (!coefficients) d.hparams.momentum_style = MUON_MOMENTUM_SGD;
  else sp[1].group = 1;                        /* "b" in a group of its own with absurd coefficients */
  if (skip) d.on_nonfinite = MUON_NONFINITE_SKIP;
  if (coefficients) {
    g1 = d.hparams;
    for (k = 0; k < MUON_NS_MAX_STEPS; k++) g1.ns_coefficients[k][0] = g1.ns_coefficients[k][1] = g1.ns_coefficients[k][2] = 1e30f;
  }
  if (!model_open_g(&A, &d, sp, 3, coefficients ? &g1 : NULL) || !model_open_g(&B, &d, sp, 3, coefficients ? &g1 : NULL)) {
    CHECK(0, "setup");
    return;
  }
  bi = find(&A, "b");
  if (!coefficients) set_huge(&A.t[bi]);
  muon_set_grad(B.opt, B.idx[bi], NULL);       /* the reference: that matrix's gradient absent */
  snap_take(&A, &s);
  st = muon_step(A.opt);
  if (!skip) {
    expect_all("non-finite output step", st, MUON_ERR_NONFINITE, A.opt);
    CHECK(has(muon_error(A.opt), "Newton-Schulz output") && has(muon_error(A.opt), "'b'"),
          "rank %d: message '%s' does not name the Newton-Schulz output of 'b'", W.rank, muon_error(A.opt));
    expect_unchanged("the non-finite output step", &A, &s);
    CHECK(all_true(all_finite(&A)), "some rank holds a non-finite parameter");
  } else {
    int mine;
    expect_all("non-finite output step, SKIP", st, MUON_OK, A.opt);
    st = muon_step(B.opt);
    expect_all("reference step", st, MUON_OK, B.opt);
    mine = snap_same_one(&A, &s, bi);
    CHECK(mine, "rank %d: matrix 'b' (non-finite output) was applied", W.rank);
    CHECK(all_true(mine), "matrix 'b' was applied on some rank");
    CHECK(!snap_same_one(&A, &s, find(&A, "a")) && !snap_same_one(&A, &s, find(&A, "c")), "rank %d: a healthy matrix was not updated", W.rank);
    expect_equal("skipped output vs absent gradient", &A, &B, 3);
    CHECK(all_true(all_finite(&A)), "some rank holds a non-finite parameter");
  }
  snap_free(&s);
  model_close(&A);
  model_close(&B);
}

/* ==== 8. the commit vote: a late local failure =================================================
   A compute backend = the CPU backend with every slot forwarded, whose newton_schulz fails while
   `armed`. Catches: the failing rank leaving its peers waiting in the exchange (they would hang
   until the Gloo timeout); the peers applying while the failing rank does not (replicas and
   shards diverge); a status or message that does not say who failed; the failed step leaving
   a trace in the next one. With unchecked_commit the documented trade-off must hold exactly:
   the failing rank fails alone and the others apply. */
typedef struct faulty { muon_compute inner; int armed; } faulty;
#define FB_TEXT "injected newton_schulz fault (test_agree)"
#define IN(ctx) (((faulty *)(ctx))->inner)
static void *fb_alloc(void *c, size_t b) { return IN(c).vt->alloc(IN(c).ctx, b); }
static void fb_free(void *c, void *p) { IN(c).vt->free(IN(c).ctx, p); }
static muon_status fb_copy(void *c, void *d, const void *s, size_t b, int th, int fh) { return IN(c).vt->copy(IN(c).ctx, d, s, b, th, fh); }
static muon_status fb_zero(void *c, void *d, size_t b) { return IN(c).vt->zero(IN(c).ctx, d, b); }
static muon_status fb_pack(void *c, const muon_piece_copy *o, int n, float *p, float *x, int t) { return IN(c).vt->pack(IN(c).ctx, o, n, p, x, t); }
static muon_status fb_momentum(void *c, size_t n, float *m, const void *g, const muon_momentum_args *a, int up, float *u) {
  return IN(c).vt->momentum(IN(c).ctx, n, m, g, a, up, u);
}
static size_t fb_ns_workspace(void *c, int b, int m, int n, const muon_hparams *hp) { return IN(c).vt->ns_workspace(IN(c).ctx, b, m, n, hp); }
static muon_status fb_newton_schulz(void *c, float *X, int b, int m, int n, const muon_hparams *hp, void *ws) {
  if (((faulty *)c)->armed) return MUON_ERR_BACKEND;
  return IN(c).vt->newton_schulz(IN(c).ctx, X, b, m, n, hp, ws);
}
static muon_status fb_newton_schulz_many(void *c, int k, float *const *X, const int *m, const int *n, const muon_hparams *const *hp, void *ws) {
  if (((faulty *)c)->armed) return MUON_ERR_BACKEND;
  return IN(c).vt->newton_schulz_many(IN(c).ctx, k, X, m, n, hp, ws);
}
static muon_status fb_apply(void *c, size_t n, void *p, const float *O, const muon_apply_args *a) { return IN(c).vt->apply(IN(c).ctx, n, p, O, a); }
static muon_status fb_adamw(void *c, size_t n, void *p, const void *g, float *m, float *v, const muon_adamw_args *a) {
  return IN(c).vt->adamw(IN(c).ctx, n, p, g, m, v, a);
}
static muon_status fb_nonfinite(void *c, const void *x, muon_dtype t, size_t n, int *f) { return IN(c).vt->nonfinite(IN(c).ctx, x, t, n, f); }
static muon_status fb_cast(void *c, void *d, muon_dtype dt, const void *s, muon_dtype st, size_t n) { return IN(c).vt->cast(IN(c).ctx, d, dt, s, st, n); }
static muon_status fb_sync(void *c) { return IN(c).vt->sync(IN(c).ctx); }
static const char *fb_error(void *c) { return ((faulty *)c)->armed ? FB_TEXT : ""; }
#undef IN
static muon_compute_vtable fb_vt;
static muon_compute faulty_backend(faulty *f) {
  muon_compute c;
  f->inner = muon_compute_cpu();
  f->armed = 0;
  fb_vt = *f->inner.vt;                        /* version, memory, and any slot added later */
  fb_vt.alloc = fb_alloc; fb_vt.free = fb_free; fb_vt.copy = fb_copy; fb_vt.zero = fb_zero; fb_vt.pack = fb_pack;
  fb_vt.momentum = fb_momentum; fb_vt.ns_workspace = fb_ns_workspace; fb_vt.newton_schulz = fb_newton_schulz;
  fb_vt.apply = fb_apply; fb_vt.adamw = fb_adamw; fb_vt.nonfinite = fb_nonfinite; fb_vt.cast = fb_cast; fb_vt.sync = fb_sync;
  fb_vt.error = fb_error; fb_vt.newton_schulz_many = fb_newton_schulz_many;
  fb_vt.alloc_host = NULL; fb_vt.free_host = NULL; fb_vt.destroy = NULL;
  c.vt = &fb_vt;
  c.ctx = f;
  return c;
}

static double case8_worst_ms = -1, case8_unchecked_worst_ms = -1;

static void case_commit_vote(int unchecked) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d;
  faulty fa, fbr;
  muon_compute ca, cb;
  model A, B;
  snap s;
  int owned[MAXP], all[MAXP], r, victim = -1;
  double t0, dt;
  muon_status st;
  char who[32];
  TEST_CASE(unchecked ? "8b. unchecked_commit: the rank whose NS fails returns MUON_ERR_BACKEND alone, the others MUON_OK"
                      : "8a. commit vote: NS fails on one owner; every rank errs promptly, nothing applied; the next step = no-fault run");
  cfg.unchecked_commit = unchecked;
  ca = faulty_backend(&fa);
  cb = faulty_backend(&fbr);
  d = desc_for(&cfg);
  d.compute = &ca;
  if (!model_open(&A, &d, STD, 3)) { CHECK(0, "setup: %s", A.opt ? muon_error(A.opt) : "create"); return; }
  d.compute = &cb;
  if (!model_open(&B, &d, STD, 3)) { CHECK(0, "setup"); return; }
  step_both("step 1", &A, &B);
  /* The victim: the highest rank that owns a matrix (so its newton_schulz slot is called). */
  gather_int(muon_owned(A.opt, NULL, 0), owned);
  for (r = 0; r < W.size; r++) if (owned[r] > 0) victim = r;
  CHECK(victim >= 0, "no rank owns a matrix");
  fa.armed = W.rank == victim;
  snap_take(&A, &s);
  t0 = now_s();
  st = muon_step(A.opt);
  dt = now_s() - t0;
  fa.armed = 0;
  {
    long long worst = gather_ll_max((long long)(dt * 1e6));
    if (unchecked) case8_unchecked_worst_ms = worst / 1e3; else case8_worst_ms = worst / 1e3;
  }
  CHECK(dt < 2.0, "rank %d took %.3f s to return (the Gloo timeout is 10 s)", W.rank, dt);
  gather_int((int)st, all);
  snprintf(who, sizeof who, "rank %d", victim);
  if (W.rank == victim) {
    CHECK(st == MUON_ERR_BACKEND, "victim rank %d returned %s, want MUON_ERR_BACKEND", W.rank, muon_status_string(st));
    CHECK(has(muon_error(A.opt), FB_TEXT), "victim's message '%s' lacks the backend's text", muon_error(A.opt));
    CHECK(snap_same(&A, &s), "victim rank %d: its parameters or momentum changed", W.rank);   /* local: no collective here */
  } else if (!unchecked) {
    CHECK(st != MUON_OK, "rank %d returned MUON_OK although rank %d failed", W.rank, victim);
    CHECK(has(muon_error(A.opt), who), "rank %d: message '%s' does not name %s", W.rank, muon_error(A.opt), who);
  }
  if (!unchecked) {
    for (r = 0; r < W.size; r++)
      CHECK(all[r] == MUON_ERR_BACKEND, "rank %d returned %s, want MUON_ERR_BACKEND on every rank", r,
            all[r] >= 0 && all[r] < MUON_STATUS_COUNT ? muon_status_string((muon_status)all[r]) : "?");
    expect_unchanged("the failed step", &A, &s);
    step_both("step 2 without the fault", &A, &B);
    expect_equal("after the failed step", &A, &B, 3);
  } else {
    for (r = 0; r < W.size; r++)
      CHECK(all[r] == (r == victim ? MUON_ERR_BACKEND : MUON_OK), "rank %d returned %s, want %s", r,
            all[r] >= 0 && all[r] < MUON_STATUS_COUNT ? muon_status_string((muon_status)all[r]) : "?",
            r == victim ? "MUON_ERR_BACKEND" : "MUON_OK (no vote: it applies)");
  }
  snap_free(&s);
  model_close(&A);
  model_close(&B);
}

/* ==== 9. collectives per step =================================================================
   Catches: a collective more or less than the design (an extra round trip per step costs ~4 ms
   here, far more across machines), e.g. the skip flags exchanged when nobody skips, the vote
   issued with unchecked_commit, or a round issuing no alltoallv. */
static void collectives_case(int unchecked, int with_skip) {
  char title[200];
  muon_dist_config cfg = muon_layout_config();
  muon_desc d;
  model A;
  muon_stats s0, s1;
  snap sn;
  long long got, want;
  int P = W.size;
  snprintf(title, sizeof title, "9. collectives per step: %s, %s = %s", unchecked ? "unchecked_commit" : "commit vote",
           with_skip ? "a skipped matrix" : "no skips", with_skip ? (unchecked ? "2 + 2*rounds" : "3 + 2*rounds") : (unchecked ? "1 + 2*rounds" : "2 + 2*rounds"));
  TEST_CASE(title);
  cfg.unchecked_commit = unchecked;
  if (!with_skip) cfg.round_bytes = 1;        /* several rounds: the per-round term is exercised */
  d = desc_for(&cfg);
  if (!(with_skip ? model_open(&A, &d, STD, 3) : model_open(&A, &d, MANY, 8))) { CHECK(0, "setup"); return; }
  step_both("step 1 (plans)", &A, NULL);
  if (with_skip && W.rank == P - 1) muon_set_grad(A.opt, A.idx[0], NULL);   /* 'a' absent on one rank */
  snap_take(&A, &sn);
  muon_get_stats(A.opt, &s0);
  step_both("step 2", &A, NULL);
  muon_get_stats(A.opt, &s1);
  got = s1.collectives - s0.collectives;
  want = (P > 1 ? 2LL * s1.rounds : 0) + (unchecked ? 1 : 2) + (with_skip ? 1 : 0);
  CHECK(got == want, "rank %d: %lld collectives in a step with %d rounds, want %lld", W.rank, got, s1.rounds, want);
  if (!with_skip && P > 1) CHECK(s1.rounds >= 2, "only %d rounds: the test wants several", s1.rounds);
  if (with_skip) CHECK(snap_same_one(&A, &sn, 0), "rank %d: the skipped matrix changed", W.rank);
  snap_free(&sn);
  model_close(&A);
}

/* ==== 10. muon_state_load rejects non-finite and negative moments ==============================
   The blobs are patched and re-checksummed, so only the value checks can reject them (a finite
   patch with the same recomputed checksum must load, proving the checksum is right). Catches: a
   NaN momentum or a negative AdamW second moment (sqrt of it is NaN at the next step) accepted,
   or a rejected load that changed anything. */
static void put32le(unsigned char *p, uint32_t v) { int i; for (i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t get32le(const unsigned char *p) { uint32_t v = 0; int i; for (i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i); return v; }
static uint64_t get64le(const unsigned char *p) { uint64_t v = 0; int i; for (i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i); return v; }
static void put_float_le(unsigned char *p, float x) { uint32_t u; memcpy(&u, &x, 4); put32le(p, u); }
static void rechecksum(unsigned char *b, size_t n) {
  uint64_t h = 14695981039346656037ull;
  size_t i;
  for (i = 0; i + 8 < n; i++) { h ^= b[i]; h *= 1099511628211ull; }
  for (i = 0; i < 8; i++) b[n - 8 + i] = (unsigned char)(h >> (8 * i));
}

static void case_state_values(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A;
  snap s;
  muon_adamw_param ap = muon_default_adamw_param();
  float bias[10], dbias[10];
  unsigned char *orig, *blob, *again;
  size_t n, off, mom0, adam;
  muon_hparams hp;
  const float *mom;
  size_t mn;
  int k, ai = -1;
  muon_status st;
  TEST_CASE("10. muon_state_load rejects a NaN momentum and a negative AdamW second moment (valid checksums); optimizer unchanged");
  if (!model_open(&A, &d, STD, 3)) { CHECK(0, "setup"); return; }
  for (k = 0; k < 10; k++) { bias[k] = 0.1f * (float)k; dbias[k] = 0.01f * (float)(k + 1); }
  ap.name = "bias"; ap.param = bias; ap.grad = dbias; ap.size = 10;
  CHECK(muon_add_adamw_param(A.opt, &ap, &ai) == MUON_OK, "add_adamw_param: %s", muon_error(A.opt));
  step_both("step 1", &A, NULL);
  n = muon_state_size(A.opt);
  orig = (unsigned char *)malloc(n);
  blob = (unsigned char *)malloc(n);
  again = (unsigned char *)malloc(n);
  CHECK(muon_state_save(A.opt, orig, n) == MUON_OK, "save: %s", muon_error(A.opt));
  /* Offsets, from the layout documented above muon_state_save: header 48, group counts 8, one
     group's record (u32 length, 4 * (16 + 3 ns_steps) bytes), one AdamW group's (u32 length, 24
     bytes), then the matrices (rows, cols,
     size, name hash: 24 bytes), each with its layout record of 12 + 32 * MUON_MAX_LEVELS bytes
     and a NorMuon length (0 here: no NorMuon, no floats follow) after the momentum. */
  muon_get_group(A.opt, 0, &hp);
  off = 48 + 8 + 4 + 4 * (16 + 3 * (size_t)hp.ns_steps) + 4 + 24;
  mom0 = off + 24;                                              /* matrix 0's first momentum float */
  for (k = 0; k < 3; k++) { muon_get_momentum(A.opt, A.idx[k], &mom, &mn); off += 24 + 4 * mn + 12 + 32 * MUON_MAX_LEVELS + 4; }
  adam = off;                                                   /* AdamW param 0: size, step, name hash, full size, offset (40 bytes), m, v */
  muon_get_momentum(A.opt, A.idx[0], &mom, &mn);
  CHECK(mn > 0 && get32le(orig + mom0 - 24) == 16 && get64le(orig + mom0 - 16) == mn && get32le(orig + mom0) == (memcpy(&k, mom, 4), (uint32_t)k),
        "rank %d: matrix 0's record is not where the layout says", W.rank);
  CHECK(get64le(orig + adam) == 10 && get64le(orig + adam + 8) == 1 && get64le(orig + adam + 24) == 10 && adam + 40 + 80 + 8 == n,
        "rank %d: the AdamW record is not where the layout says (size %llu, step %llu)", W.rank,
        (unsigned long long)get64le(orig + adam), (unsigned long long)get64le(orig + adam + 8));
  snap_take(&A, &s);

  memcpy(blob, orig, n);                                        /* a NaN momentum */
  put32le(blob + mom0, 0x7fc00000u);
  rechecksum(blob, n);
  st = muon_state_load(A.opt, blob, n);
  expect_all("NaN momentum", st, MUON_ERR_STATE, A.opt);
  CHECK(has(muon_error(A.opt), "NaN"), "message '%s'", muon_error(A.opt));
  CHECK(muon_state_save(A.opt, again, n) == MUON_OK && memcmp(again, orig, n) == 0, "rank %d: the rejected load changed the state", W.rank);
  expect_unchanged("the rejected NaN load", &A, &s);

  memcpy(blob, orig, n);                                        /* a negative second moment */
  put_float_le(blob + adam + 40 + 40, -1e-3f);
  rechecksum(blob, n);
  st = muon_state_load(A.opt, blob, n);
  expect_all("negative second moment", st, MUON_ERR_STATE, A.opt);
  CHECK(has(muon_error(A.opt), "negative"), "message '%s'", muon_error(A.opt));
  CHECK(muon_state_save(A.opt, again, n) == MUON_OK && memcmp(again, orig, n) == 0, "rank %d: the rejected load changed the state", W.rank);
  expect_unchanged("the rejected negative-moment load", &A, &s);

  /* The controls: the same patches with finite, positive values and the same checksum load,
     and land where the offsets say. */
  memcpy(blob, orig, n);
  put_float_le(blob + mom0, 0.5f);
  put_float_le(blob + adam + 40 + 40, 2e-3f);
  rechecksum(blob, n);
  st = muon_state_load(A.opt, blob, n);
  expect_all("finite control patch", st, MUON_OK, A.opt);
  muon_get_momentum(A.opt, A.idx[0], &mom, &mn);
  CHECK(mn > 0 && mom[0] == 0.5f, "rank %d: the control patch did not land in matrix 0's momentum", W.rank);
  CHECK(muon_state_load(A.opt, orig, n) == MUON_OK, "reloading the original: %s", muon_error(A.opt));
  snap_free(&s);
  free(orig); free(blob); free(again);
  model_close(&A);
}

/* ==== 11. a blob records where it was saved: rank, world size, and each piece's layout ==========
   Catches: rank r loading rank r+1's file with MUON_OK (its momentum belongs to other rows);
   a piece loaded under another layout of the same size; anything changed by the refused load. */
static void case_state_where(void) {
  static const mspec ROWS[1] = { { "sq", 12, 12, K_SHARD0, 0 } }, COLS[1] = { { "sq", 12, 12, K_SHARD1, 0 } };
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A, B;
  snap s;
  char path[600], want[120];
  const char *dir = getenv("MUON_STORE");
  int next = (W.rank + 1) % W.size, all[MAXP];
  muon_status st;
  if (W.size < 2 || !dir) return;
  TEST_CASE("11. a blob saved by another rank, or for another piece, is MUON_ERR_STATE naming both; nothing changes");
  if (!model_open(&A, &d, STD, 3)) { CHECK(0, "setup"); return; }
  step_both("step 1", &A, NULL);
  snprintf(path, sizeof path, "%s/agree11.%d", dir, W.rank);
  CHECK(muon_state_save_file(A.opt, path) == MUON_OK, "save: %s", muon_error(A.opt));
  gather_int(1, all);                                      /* every file is written */
  snap_take(&A, &s);
  snprintf(path, sizeof path, "%s/agree11.%d", dir, next);
  st = muon_state_load_file(A.opt, path);
  expect_all("rank r loads rank r+1's blob", st, MUON_ERR_STATE, A.opt);
  snprintf(want, sizeof want, "saved by rank %d of %d, this optimizer is rank %d of %d", next, W.size, W.rank, W.size);
  CHECK(has(muon_error(A.opt), want), "rank %d: message '%s'", W.rank, muon_error(A.opt));
  expect_unchanged("the refused load", &A, &s);
  snap_free(&s);
  model_close(&A);

  /* The same matrix as rows and as columns: pieces of the same size, different elements. */
  if (!model_open(&A, &d, ROWS, 1) || !model_open(&B, &d, COLS, 1)) { CHECK(0, "setup"); return; }
  step_both("step 1 (rows)", &A, NULL);
  {
    size_t n = muon_state_size(A.opt);
    void *blob = malloc(n);
    CHECK(n == muon_state_size(B.opt), "sizes differ: the case needs pieces of one size");
    CHECK(muon_state_save(A.opt, blob, n) == MUON_OK, "save: %s", muon_error(A.opt));
    snap_take(&B, &s);
    st = muon_state_load(B.opt, blob, n);
    expect_all("a row piece loaded as a column piece", st, MUON_ERR_STATE, B.opt);
    CHECK(has(muon_error(B.opt), "shard dim 0") && has(muon_error(B.opt), "shard dim 1") && has(muon_error(B.opt), "'sq'"),
          "rank %d: message '%s'", W.rank, muon_error(B.opt));
    expect_unchanged("the refused layout load", &B, &s);
    snap_free(&s);
    free(blob);
  }
  model_close(&A);
  model_close(&B);
}

/* ==== 12. names longer than the 63 characters kept for messages ===============================
   Catches: two matrices whose names differ only after character 63 (or 50, in a stack) being
   taken for one ("registered twice", or paired across ranks). */
static void case_long_names(void) {
  static float w[2][2][8 * 8], g[2][2][8 * 8];
  char names[2][120];
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  muon_optimizer *opt = NULL;
  muon_layout l = layout_for(K_SHARD0);
  muon_status st = MUON_OK;
  int i, k;
  TEST_CASE("12. matrices whose names differ only after character 63 (and stacks after 50) are distinct");
  for (i = 0; i < 2; i++) {
    memset(names[i], 'x', 100);
    snprintf(names[i] + 100, 20, ".%c", 'a' + i);
    for (k = 0; k < 2 * 64; k++) {
      w[i][k / 64][k % 64] = 0.01f * (float)((k * 7 + i) % 13);
      g[i][k / 64][k % 64] = 0.02f * (float)((k * 5 + i) % 11) + 0.01f;
    }
  }
  if (muon_create(&opt, &d) != MUON_OK) { CHECK(0, "create"); return; }
  for (i = 0; i < 2 && st == MUON_OK; i++) {
    muon_matrix m = muon_default_matrix();
    m.name = names[i];
    m.rows = 8; m.cols = 8; m.count = 2; m.stride = 64;   /* a stack: its slices are "<name>[k]" */
    m.param = w[i][0]; m.grad = g[i][0];
    m.layout = &l;
    st = muon_add_matrix(opt, &m, NULL);
  }
  CHECK(st == MUON_OK, "add: %s", muon_error(opt));
  st = muon_step(opt);
  expect_all("a step with long names", st, MUON_OK, opt);
  CHECK(muon_global_count(opt) == 4, "rank %d: %d global matrices, expected 4", W.rank, muon_global_count(opt));
  muon_destroy(opt);
}

/* ==== 13. registration order, and unnamed matrices ==============================================
   Ranks pair matrices by name: odd ranks register two same-shaped matrices in the other order,
   and both must come out bitwise as when every rank registers them alike. An unnamed matrix is
   refused with a dist config (by position, that reversed order would pair p with q silently). */
static void case_order(void) {
  static const mspec PQ[2] = { { "p", 16, 24, K_SHARD0, 0 }, { "q", 16, 24, K_SHARD0, 0 } };
  static const mspec QP[2] = { { "q", 16, 24, K_SHARD0, 0 }, { "p", 16, 24, K_SHARD0, 0 } };
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model a, b;
  int k, i, mine = 1;
  TEST_CASE("13. odd ranks register two same-shaped matrices in the other order: bitwise the same; an unnamed matrix is refused, naming the field");
  if (!model_open(&a, &d, PQ, 2) || !model_open(&b, &d, W.rank % 2 ? QP : PQ, 2)) { CHECK(0, "rank %d: open", W.rank); return; }
  for (k = 0; k < 2; k++) step_both("a step", &a, &b);
  for (i = 0; i < 2; i++) {
    int j = find(&b, a.t[i].name);
    const float *ma = NULL, *mb = NULL;
    size_t na = 0, nb = 0;
    muon_get_momentum(a.opt, a.idx[i], &ma, &na);
    muon_get_momentum(b.opt, b.idx[j], &mb, &nb);
    if (j >= 2 || a.t[i].n != b.t[j].n || memcmp(a.t[i].w, b.t[j].w, a.t[i].n * sizeof(float)) != 0 || na != nb ||
        (na && memcmp(ma, mb, na * sizeof(float)) != 0)) {
      printf("  rank %d: matrix '%s' differs between the two registration orders\n", W.rank, a.t[i].name);
      mine = 0;
    }
  }
  CHECK(mine && all_true(mine), "rank %d: the registration order changed the result", W.rank);
  {
    muon_matrix m = muon_default_matrix();
    muon_layout l = layout_for(K_SHARD0);
    m.param = a.t[0].w; m.grad = a.t[0].g; m.rows = 16; m.cols = 24; m.layout = &l;
    CHECK(muon_add_matrix(a.opt, &m, NULL) == MUON_ERR_ARG && strstr(muon_error(a.opt), "muon_matrix.name is required with a dist config"),
          "unnamed: %s", muon_error(a.opt));
    m.name = "";
    CHECK(muon_add_matrix(a.opt, &m, NULL) == MUON_ERR_ARG, "empty name: %s", muon_error(a.opt));
    step_both("a step after the refused registrations", &a, &b);
  }
  model_close(&a);
  model_close(&b);
}

/* ==== 15. a custom assign that is not deterministic across ranks ================================
   The last rank's assign puts every owner one rank further: the plans disagree on owners only.
   Every rank must return MUON_ERR_ASSIGN naming assign, nothing applied, for as long as it
   disagrees; a deterministic assign again steps. */
static int skew_of_rank;
static muon_status skewed_assign(void *state, const muon_matrix_info *m, int n, int world_size, int *owner) {
  int i;
  (void)state; (void)m;
  for (i = 0; i < n; i++) owner[i] = (i + skew_of_rank) % world_size;
  return MUON_OK;
}
static void case_skewed_assign(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d;
  model a;
  snap s;
  int k;
  if (W.size < 2) return;
  TEST_CASE("15. a custom assign that gives other owners on one rank: MUON_ERR_ASSIGN everywhere, nothing applied; deterministic again, it steps");
  cfg.assign = skewed_assign;
  d = desc_for(&cfg);
  skew_of_rank = W.rank == W.size - 1 ? 1 : 0;
  if (!model_open(&a, &d, STD, 3)) { CHECK(0, "rank %d: open", W.rank); return; }
  for (k = 0; k < 2; k++) {
    snap_take(&a, &s);
    expect_all("a step with a skewed assign", muon_step(a.opt), MUON_ERR_ASSIGN, a.opt);
    CHECK(has(muon_error(a.opt), "assign"), "rank %d: message '%s' does not name assign", W.rank, muon_error(a.opt));
    expect_unchanged("the skewed step", &a, &s);
    snap_free(&s);
  }
  skew_of_rank = 0;
  step_both("a step with the assign deterministic again", &a, NULL);
  model_close(&a);
}

/* ==== 14. one rank out of memory while planning ==================================================
   Rank 1's allocator fails its k-th allocation after registration, for every k that planning
   reaches: every rank returns the same error, nothing is applied anywhere, and the step retried
   succeeds everywhere, bitwise as a run that never failed. */
typedef struct agree_fail { int calls, fail_at; } agree_fail;
static void *agree_fail_alloc(size_t size, void *u) {
  agree_fail *f = (agree_fail *)u;
  if (f->fail_at >= 0 && f->calls++ == f->fail_at) return NULL;
  return malloc(size);
}
static void agree_fail_free(void *p, void *u) { (void)u; free(p); }

static void case_nomem(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg), dr = desc_for(&cfg);
  agree_fail fa;
  int k, sites = 0, more = 1;
  if (W.size != 2) return;   /* 34 sites, each a fresh plan: one world of two is enough */
  TEST_CASE("14. rank 1 runs out of memory at each allocation of planning in turn: the same error on every rank, nothing applied, the retry equals a clean run");
  d.hparams.normuon = dr.hparams.normuon = MUON_NORMUON_ROWS;
  for (k = 0; more && k < 200; k++) {
    model a, b;
    snap s;
    muon_status st;
    int all[MAXP], r, same = 1, failed;
    fa.calls = 0;
    fa.fail_at = -1;
    if (W.rank == 1) { d.allocator.alloc = agree_fail_alloc; d.allocator.free = agree_fail_free; d.allocator.user_data = &fa; }
    if (!model_open(&a, &d, STD, 3) || !model_open(&b, &dr, STD, 3)) { CHECK(0, "rank %d: open", W.rank); return; }
    fa.calls = 0;
    fa.fail_at = k;                               /* from here on: planning's allocations */
    snap_take(&a, &s);
    st = muon_step(a.opt);
    fa.fail_at = -1;
    failed = W.rank == 1 ? fa.calls > k : 0;
    more = !all_true(!failed);                    /* some rank failed an allocation: another k */
    gather_int((int)st, all);
    for (r = 0; r < W.size; r++) same &= all[r] == all[0];
    if (more) {
      sites++;
      CHECK(st != MUON_OK && same, "site %d: rank %d returned %s (%s); ranks disagree or succeeded", k, W.rank, muon_status_string(st), muon_error(a.opt));
      CHECK(W.rank != 1 || st == MUON_ERR_NOMEM, "site %d: the failing rank returned %s", k, muon_status_string(st));
      expect_unchanged("a step where rank 1 ran out of memory", &a, &s);
      st = muon_step(a.opt);
      expect_all("the retried step", st, MUON_OK, a.opt);
    } else {
      expect_all("the step past the last site", st, MUON_OK, a.opt);
    }
    st = muon_step(b.opt);
    expect_all("the clean run's step", st, MUON_OK, b.opt);
    expect_equal("after the retry", &a, &b, 3);
    snap_free(&s);
    model_close(&a);
    model_close(&b);
  }
  if (W.rank == 0) printf("  out of memory on rank 1 at %d planning sites in turn\n", sites);
  CHECK(sites >= 3 || W.size < 2, "only %d sites", sites);
}

/* ==== 6c/6d. a NaN AdamW gradient on one rank ===================================================
   Every rank registers the replicated AdamW param "bias" and a ZeRO shard of "emb" (offset /
   full_size). Catches: under ERROR, a step that returns MUON_OK or applies anything; under SKIP,
   the skip taken only on the rank with the NaN, so the replicas of "bias" (and the shards' step
   counts of "emb") drift apart. */
static void case_nan_adamw(int skip) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A;
  muon_adamw_param bp = muon_default_adamw_param(), ep = muon_default_adamw_param();
  float bias[10], dbias[10], before[10], emb[4], demb[4], emb_before[4], *all = (float *)malloc(10 * sizeof(float) * (size_t)W.size);
  int k, last = W.size - 1, same = 1;
  muon_status st;
  TEST_CASE(skip ? "6d. NaN AdamW gradient on one rank, SKIP: the replicated param is skipped on every rank (replicas stay equal), the rest updates"
                 : "6c. NaN AdamW gradient on one rank, ERROR: MUON_ERR_NONFINITE on every rank naming the param and the rank, nothing applied");
  d.on_nonfinite = skip ? MUON_NONFINITE_SKIP : MUON_NONFINITE_ERROR;
  if (!all || !model_open(&A, &d, STD, 3)) { CHECK(0, "setup"); free(all); return; }
  for (k = 0; k < 10; k++) { bias[k] = 0.1f * (float)k; dbias[k] = 0.01f * (float)(k + 1); }
  for (k = 0; k < 4; k++) { emb[k] = 0.2f * (float)(W.rank * 4 + k); demb[k] = 0.03f; }
  bp.name = "bias"; bp.param = bias; bp.grad = dbias; bp.size = 10;
  ep.name = "emb"; ep.param = emb; ep.grad = demb; ep.size = 4; ep.offset = 4 * (size_t)W.rank; ep.full_size = 4 * (size_t)W.size;
  CHECK(muon_add_adamw_param(A.opt, &bp, NULL) == MUON_OK && muon_add_adamw_param(A.opt, &ep, NULL) == MUON_OK, "add: %s", muon_error(A.opt));
  step_both("step 1", &A, NULL);
  memcpy(before, bias, sizeof bias);
  memcpy(emb_before, emb, sizeof emb);
  if (W.rank == last) dbias[3] = NAN;
  st = muon_step(A.opt);
  if (!skip) {
    char rk[32];
    expect_all("NaN AdamW step", st, MUON_ERR_NONFINITE, A.opt);
    snprintf(rk, sizeof rk, "rank %d", last);
    CHECK(has(muon_error(A.opt), "AdamW param") && has(muon_error(A.opt), rk), "rank %d: message '%s'", W.rank, muon_error(A.opt));
    CHECK(all_true(memcmp(bias, before, sizeof bias) == 0 && memcmp(emb, emb_before, sizeof emb) == 0), "an AdamW param changed on some rank");
  } else {
    expect_all("NaN AdamW step (SKIP)", st, MUON_OK, A.opt);
    CHECK(all_true(memcmp(bias, before, sizeof bias) == 0), "the skipped replicated param 'bias' changed on some rank");
    CHECK(all_true(memcmp(emb, emb_before, sizeof emb) != 0), "the healthy sharded param 'emb' was not updated on some rank");
  }
  dbias[3] = 0.04f;
  CHECK(muon_step(A.opt) == MUON_OK, "the step after: %s", muon_error(A.opt));
  /* the replicas of "bias" hold the same bits everywhere */
  if (W.world.vt->allgather(W.world.ctx, bias, all, sizeof bias) != MUON_OK) CHECK(0, "allgather");
  for (k = 1; k < W.size; k++) same &= memcmp(all, all + 10 * k, sizeof bias) == 0;
  CHECK(same, "the replicas of 'bias' differ between ranks");
  free(all);
  model_close(&A);
}

/* ==== 6g-6j. finite values that overflow, on one rank only ======================================
   The last rank's AdamW gradient is 1e30 (v would be +Inf), or its piece of matrix 'a' sits at
   FLT_MAX under an lr whose step then overflows. Catches: the overflowing rank failing (or
   skipping) alone while the others apply, so replicas and shards diverge; +Inf written with
   MUON_OK; a message that does not name the param; a SKIP whose state then does not load. */
static void case_overflow_adamw(int skip) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A;
  muon_adamw_param bp = muon_default_adamw_param();
  float bias[10], dbias[10], before[10], *all = (float *)malloc(10 * sizeof(float) * (size_t)W.size);
  unsigned char *b0 = NULL, *b1 = NULL;
  size_t n0 = 0, n1 = 0;
  int k, last = W.size - 1, same = 1;
  muon_status st;
  TEST_CASE(skip ? "6h. AdamW gradient 1e30 on one rank, SKIP: the replicated param skipped on every rank, the rest "
                   "updates, the state loads"
                 : "6g. AdamW gradient 1e30 on one rank, ERROR: MUON_ERR_NONFINITE on every rank naming the param, "
                   "nothing applied");
  d.on_nonfinite = skip ? MUON_NONFINITE_SKIP : MUON_NONFINITE_ERROR;
  if (!all || !model_open(&A, &d, STD, 3)) { CHECK(0, "setup"); free(all); return; }
  for (k = 0; k < 10; k++) { bias[k] = 0.1f * (float)k; dbias[k] = 0.01f * (float)(k + 1); }
  bp.name = "bias"; bp.param = bias; bp.grad = dbias; bp.size = 10;
  CHECK(muon_add_adamw_param(A.opt, &bp, NULL) == MUON_OK, "add: %s", muon_error(A.opt));
  step_both("step 1", &A, NULL);
  memcpy(before, bias, sizeof bias);
  if (W.rank == last) dbias[3] = 1e30f;
  b0 = saved(&A, &n0);
  st = muon_step(A.opt);
  b1 = saved(&A, &n1);
  if (!skip) {
    expect_all("overflowing AdamW step", st, MUON_ERR_NONFINITE, A.opt);
    CHECK(has(muon_error(A.opt), "'bias'"), "rank %d: message '%s'", W.rank, muon_error(A.opt));
    CHECK(all_true(memcmp(bias, before, sizeof bias) == 0 && n0 == n1 && memcmp(b0, b1, n0) == 0),
          "an AdamW param or the state changed on some rank");
  } else {
    expect_all("overflowing AdamW step (SKIP)", st, MUON_OK, A.opt);
    CHECK(all_true(memcmp(bias, before, sizeof bias) == 0), "the skipped replicated param 'bias' changed on some rank");
    CHECK(all_true(changed(&A.t[0])), "matrix 'a' was not updated on some rank");
    CHECK(all_true(muon_state_load(A.opt, b1, n1) == MUON_OK), "the state after the SKIP does not load on some rank");
  }
  dbias[3] = 0.04f;
  CHECK(all_true(muon_step(A.opt) == MUON_OK), "the step after: %s", muon_error(A.opt));
  if (W.world.vt->allgather(W.world.ctx, bias, all, sizeof bias) != MUON_OK) CHECK(0, "allgather");
  for (k = 1; k < W.size; k++) same &= memcmp(all, all + 10 * k, sizeof bias) == 0;
  CHECK(same, "the replicas of 'bias' differ between ranks");
  free(all); free(b0); free(b1);
  model_close(&A);
}

static void case_overflow_matrix(int skip) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A, B;
  snap s;
  size_t e;
  int ai, last = W.size - 1;
  muon_status st;
  TEST_CASE(skip ? "6j. matrix 'a' at FLT_MAX on one rank, its update overflows, SKIP: 'a' skipped everywhere, "
                   "others = run without its gradient"
                 : "6i. matrix 'a' at FLT_MAX on one rank, its update overflows, ERROR: MUON_ERR_NONFINITE everywhere "
                   "naming 'a', nothing applied");
  d.hparams.lr = 1e33f;
  d.hparams.weight_decay = 0.0f;
  d.on_nonfinite = skip ? MUON_NONFINITE_SKIP : MUON_NONFINITE_ERROR;
  if (!model_open(&A, &d, STD, 3) || !model_open(&B, &d, STD, 3)) { CHECK(0, "setup"); return; }
  ai = find(&A, "a");
  if (W.rank == last)
    for (e = 0; e < A.t[ai].n; e++) A.t[ai].w[e] = B.t[ai].w[e] = FLT_MAX;
  muon_set_grad(B.opt, B.idx[ai], NULL);   /* the reference: that matrix's gradient absent */
  snap_take(&A, &s);
  st = muon_step(A.opt);
  if (!skip) {
    expect_all("overflowing update", st, MUON_ERR_NONFINITE, A.opt);
    CHECK(has(muon_error(A.opt), "'a'"), "rank %d: message '%s' does not name 'a'", W.rank, muon_error(A.opt));
    expect_unchanged("the overflowing update", &A, &s);
  } else {
    int mine;
    expect_all("overflowing update, SKIP", st, MUON_OK, A.opt);
    st = muon_step(B.opt);
    expect_all("reference step", st, MUON_OK, B.opt);
    mine = snap_same_one(&A, &s, ai);
    CHECK(all_true(mine), "matrix 'a' was applied on some rank");
    expect_equal("skipped overflow vs absent gradient", &A, &B, 3);
  }
  CHECK(all_true(all_finite(&A)), "some rank holds a non-finite parameter");
  snap_free(&s);
  model_close(&A);
  model_close(&B);
}

/* 6k: a replica that is not its matrix's source (the owner sends U) overflows its own momentum:
   SGD without nesterov, gradient 3e38 twice on that rank only. Only the commit check sees it
   (the owner's U and O are finite); catches that replica writing +Inf momentum with MUON_OK. */
static void case_overflow_replica(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A;
  snap s;
  size_t e;
  int ci, owner = -1, q;
  muon_status st;
  if (W.size < 2) return;
  TEST_CASE("6k. momentum overflow on a replica that sends no U: MUON_ERR_NONFINITE everywhere naming 'c', nothing "
            "applied");
  d.hparams.momentum_style = MUON_MOMENTUM_SGD;
  d.hparams.nesterov = 0;
  if (!model_open(&A, &d, STD, 3)) { CHECK(0, "setup"); return; }
  ci = find(&A, "c");
  CHECK(muon_plan(A.opt) == MUON_OK && muon_get_owner(A.opt, A.idx[ci], &owner) == MUON_OK, "owner: %s",
        muon_error(A.opt));
  q = (owner + 1) % W.size;
  if (W.rank == q)
    for (e = 0; e < A.t[ci].n; e++) A.t[ci].g[e] = 3e38f;
  step_both("step 1 (B = 3e38 on the replica)", &A, NULL);
  snap_take(&A, &s);
  st = muon_step(A.opt);
  expect_all("the replica's momentum overflows", st, MUON_ERR_NONFINITE, A.opt);
  CHECK(has(muon_error(A.opt), "'c'"), "rank %d: message '%s' does not name 'c'", W.rank, muon_error(A.opt));
  expect_unchanged("the replica's momentum overflow", &A, &s);
  snap_free(&s);
  model_close(&A);
}

/* ==== 6e. a gradient never bound, on one rank only =============================================
   The last rank registers matrix 'a' (then, in a second optimizer, AdamW param 'bias') with grad
   NULL and never calls muon_set_grad. Catches: a step that trains nothing silently (MUON_OK); the
   forgetful rank failing alone while the others apply; a message that does not name the
   gradient; a muon_set_grad(NULL) (absent on purpose) refused like a forgotten one. */
static void case_unbound_grad(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A;
  snap s;
  int i, last = W.size - 1;
  muon_status st;
  muon_adamw_param bp = muon_default_adamw_param();
  float bias[10], dbias[10], before[10];
  muon_optimizer *B = NULL;
  TEST_CASE("6e. a gradient never bound on one rank (matrix, then AdamW param): MUON_ERR_ARG on every rank, named there, nothing applied");
  memset(&A, 0, sizeof A);
  A.n = 3;
  for (i = 0; i < 3; i++) {
    muon_layout l = layout_for(STD[i].kind);
    tmat_init(&A.t[i], STD[i].name, STD[i].rows, STD[i].cols, &l, 1.0f);
  }
  if (muon_create(&A.opt, &d) != MUON_OK) { CHECK(0, "create"); return; }
  for (i = 0; i < 3; i++) {
    muon_matrix mm = muon_default_matrix();
    mm.name = A.t[i].name; mm.param = A.t[i].w; mm.grad = i == 0 && W.rank == last ? NULL : A.t[i].g;
    mm.rows = A.t[i].rows; mm.cols = A.t[i].cols; mm.layout = &A.t[i].layout;
    CHECK(muon_add_matrix(A.opt, &mm, &A.idx[i]) == MUON_OK, "add: %s", muon_error(A.opt));
  }
  snap_take(&A, &s);
  st = muon_step(A.opt);
  expect_all("a step with a matrix gradient never bound on the last rank", st, MUON_ERR_ARG, A.opt);
  if (W.rank == last) CHECK(has(muon_error(A.opt), "('a')") && has(muon_error(A.opt), "muon_set_grad"), "message '%s'", muon_error(A.opt));
  else CHECK(has(muon_error(A.opt), "could not go on"), "rank %d: message '%s'", W.rank, muon_error(A.opt));
  expect_unchanged("the step with an unbound gradient", &A, &s);
  snap_free(&s);
  if (W.rank == last) CHECK(muon_set_grad(A.opt, A.idx[0], NULL) == MUON_OK, "set_grad NULL");   /* absent, on purpose */
  step_both("absent on purpose on the last rank", &A, NULL);
  CHECK(all_true(W.rank == last ? !changed(&A.t[0]) : 1), "matrix 'a' absent on one rank was applied");
  if (W.rank == last) CHECK(muon_set_grad(A.opt, A.idx[0], A.t[0].g) == MUON_OK, "set_grad");
  step_both("bound", &A, NULL);
  CHECK(all_true(changed(&A.t[0])), "matrix 'a' was not trained once bound");
  model_close(&A);

  if (muon_create(&B, &d) != MUON_OK) { CHECK(0, "create"); return; }
  for (i = 0; i < 10; i++) { bias[i] = 0.1f * (float)i; dbias[i] = 0.01f * (float)(i + 1); }
  memcpy(before, bias, sizeof bias);
  bp.name = "bias"; bp.param = bias; bp.grad = W.rank == last ? NULL : dbias; bp.size = 10;
  CHECK(muon_add_adamw_param(B, &bp, NULL) == MUON_OK, "add AdamW: %s", muon_error(B));
  st = muon_step(B);
  expect_all("a step with an AdamW gradient never bound on the last rank", st, MUON_ERR_ARG, B);
  if (W.rank == last) CHECK(has(muon_error(B), "('bias')") && has(muon_error(B), "muon_set_adamw_grad"), "message '%s'", muon_error(B));
  CHECK(all_true(memcmp(bias, before, sizeof bias) == 0), "an AdamW param changed on some rank");
  if (W.rank == last) CHECK(muon_set_adamw_grad(B, 0, dbias) == MUON_OK, "set_adamw_grad");
  st = muon_step(B);
  expect_all("bound", st, MUON_OK, B);
  CHECK(all_true(memcmp(bias, before, sizeof bias) != 0), "the AdamW param was not trained once bound");
  muon_destroy(B);
}

/* ==== 6f. gradient scale 0 (llm.c's clip factor for an infinite norm) ===========================
   Every rank sets it, as a trainer that all-reduced its norm does; then only the last rank (its
   own inf norm). Catches: the scale refused at the setter; a step that applies a zero update
   (AdamW would still decay and count a step); under ERROR, a rank that returns MUON_OK; under
   SKIP, a rank that applies anything, or a step that differs afterwards from a run that never
   saw the incident. */
static void case_scale_zero(int skip) {
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = desc_for(&cfg);
  model A, B;
  snap s;
  int last = W.size - 1;
  muon_status st;
  TEST_CASE(skip ? "6f. grad scale 0 on every rank, SKIP: MUON_OK everywhere, nothing applied, then bitwise a run without it"
                 : "6f. grad scale 0 on every rank (then on one), ERROR: MUON_ERR_NONFINITE everywhere, nothing applied");
  d.on_nonfinite = skip ? MUON_NONFINITE_SKIP : MUON_NONFINITE_ERROR;
  if (!model_open(&A, &d, STD, 3) || !model_open(&B, &d, STD, 3)) { CHECK(0, "setup"); return; }
  step_both("step 1", &A, &B);
  CHECK(muon_set_grad_scale(A.opt, 0.0f) == MUON_OK, "scale 0 refused: %s", muon_error(A.opt));
  snap_take(&A, &s);
  st = muon_step(A.opt);
  expect_all("scale 0 on every rank", st, skip ? MUON_OK : MUON_ERR_NONFINITE, A.opt);
  if (!skip) CHECK(has(muon_error(A.opt), "gradient scale is 0"), "rank %d: message '%s'", W.rank, muon_error(A.opt));
  expect_unchanged("the step at scale 0", &A, &s);
  snap_free(&s);
  if (!skip && W.size > 1) {   /* one rank's own verdict: the others fail with it */
    if (W.rank != last) CHECK(muon_set_grad_scale(A.opt, 1.0f) == MUON_OK, "scale 1");
    snap_take(&A, &s);
    st = muon_step(A.opt);
    expect_all("scale 0 on the last rank only", st, MUON_ERR_NONFINITE, A.opt);
    expect_unchanged("the step at scale 0 on one rank", &A, &s);
    snap_free(&s);
  }
  CHECK(muon_set_grad_scale(A.opt, 1.0f) == MUON_OK, "scale 1");
  step_both("step 2, scale 1", &A, &B);
  expect_equal("after the scale-0 step", &A, &B, 3);
  model_close(&A);
  model_close(&B);
}

int main(int argc, char **argv) {
  muon_gloo_desc gd = muon_gloo_default_desc();
  int rc;
  (void)argc; (void)argv;
  signal(SIGPIPE, SIG_IGN);
  if (!getenv("MUON_GLOO_TIMEOUT")) gd.timeout_s = 10;
  memset(&W, 0, sizeof W);
  if (muon_gloo_create(&W.world, &gd) != MUON_OK) { fprintf(stderr, "%s\n", muon_error(NULL)); return 1; }
  W.rank = W.world.rank;
  W.size = W.world.size;
  if (W.size > MAXP) { fprintf(stderr, "at most %d ranks\n", MAXP); return 1; }
  case_add_matrix();
  case_ns_change();
  mismatch_case(MM_LR);
  mismatch_case(MM_WD);
  mismatch_case(MM_NONFINITE);
  mismatch_case(MM_SCALE);
  mismatch_case(MM_ROUND_BYTES);
  mismatch_case(MM_WIRE);
  mismatch_case(MM_PREFETCH);
  case_every_group_setting();
  case_every_run_setting();
  case_two_differ();
  case_state_ns();
  case_plan_vs_step();
  case_mixed_checkpoints();
  case_nan_grad();
  case_nan_adamw(0);
  case_nan_adamw(1);
  case_overflow_adamw(0);
  case_overflow_adamw(1);
  case_overflow_matrix(0);
  case_overflow_matrix(1);
  case_overflow_replica();
  case_unbound_grad();
  case_scale_zero(0);
  case_scale_zero(1);
  nonfinite_output_case(0, 0);
  nonfinite_output_case(0, 1);
  nonfinite_output_case(1, 0);
  nonfinite_output_case(1, 1);
  case_commit_vote(0);
  case_commit_vote(1);
  collectives_case(0, 0);
  collectives_case(1, 0);
  collectives_case(0, 1);
  collectives_case(1, 1);
  case_state_values();
  case_state_where();
  case_long_names();
  case_order();
  case_nomem();
  case_skewed_assign();
  if (W.rank == 0)
    printf("case 8: slowest rank returned after %.1f ms (commit vote), %.1f ms (unchecked_commit)\n", case8_worst_ms, case8_unchecked_worst_ms);
  rc = test_summary();
  fflush(stdout);
  muon_comm_destroy(&W.world);
  return rc;
}
