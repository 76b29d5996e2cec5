/* test_partial.c - Partial gradients (MUON_PARTIAL levels, muon_partial()), multi-process over
   Gloo. Run under muonrun at any world size (1 to 4 tested):

     muonrun -n N build/test_partial [SCRATCH_DIR]     (default build/partial, for the reshard files)

   Every rank holds each Partial matrix whole but its gradient is only its part; muon sums the
   parts, part 0 first, on the way to the owner. Each case runs a single-device optimizer in the
   same process, fed the parts summed left to right in float, and compares bit for bit: the
   parameters everywhere, the momentum on the owner (whole there, absent elsewhere), gathered
   matrices, the state saved and loaded, and resharded to and from one device. Then the errors:
   each must be the same status on every rank, with nothing applied.

   MEAN: muon.h folds 1/size into grad_scale, g = (grad_scale * (1.0f / size)) * sum, so the
   single-device reference of a MEAN matrix is an optimizer of its own whose grad_scale is
   grad_scale * (1.0f / size), fed the plain sum.

   Then Partial AdamW params (ZeRO-1, section 6): the same parts summed in part order, each rank
   the moments of one torch.chunk, the chunks all-gathered; the whole param (and its bf16 mirror)
   bitwise the single device's on every rank, also next to Partial matrices, over replica sets,
   from muon_auto_config, through skips and non-finite parts, save / load and resharding. */
#define MUON_IMPLEMENTATION
#include "../examples/common.h"
#include "test.h"

#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static ex_world W;
static const char *scratch = "build/partial";

/* ---- collectives over the world, for agreeing on results ------------------------------------ */
static long long sum_all(long long v) {
  long long all[64], s = 0;
  int r;
  W.world.vt->allgather(W.world.ctx, &v, all, sizeof v);
  for (r = 0; r < W.size; r++) s += all[r];
  return s;
}
static long long min_all(long long v) {
  long long all[64], s = v;
  int r;
  W.world.vt->allgather(W.world.ctx, &v, all, sizeof v);
  for (r = 0; r < W.size; r++) if (all[r] < s) s = all[r];
  return s;
}
static long long max_all(long long v) {
  long long all[64], s = v;
  int r;
  W.world.vt->allgather(W.world.ctx, &v, all, sizeof v);
  for (r = 0; r < W.size; r++) if (all[r] > s) s = all[r];
  return s;
}
/* Every rank got the same status: the collective and its value. */
static int same_all(long long v) { long long lo = min_all(v), hi = max_all(v); return lo == hi; }
static void barrier(void) { (void)sum_all(0); }

/* ---- bf16 (round to nearest even; the test's values are finite) ----------------------------- */
static uint16_t to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)((u >> 16) | ((u & 0x007fffffu) ? 0x0040u : 0u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* ---- the test model ---------------------------------------------------------------------------
   A matrix is Partial SUM, Partial MEAN, Partial SUM with a bf16 gradient, or FSDP (SHARD(0)
   over the world, not Partial). Rank r's part of a Partial gradient at step t is part_val(name,
   r, t, e); an FSDP gradient is part_val(name, 0, t, e) cut to the rank's rows. Every rank can
   compute every rank's part, so every rank builds the single-device gradient itself. */
enum { K_SUM, K_MEAN, K_BF16, K_FSDP };
typedef struct spec { const char *name; int rows, cols, kind; } spec;

/* A product of two values, so that the parts have full mantissas and assorted exponents: their
   float sum then depends on the order of the additions (the sum of single ex_values, multiples of
   2^-23, is mostly exact in any order). */
static float part_val(const char *name, int r, int t, long long e) {
  unsigned h = ex_hash(name, 7919u * (unsigned)(t + 1) + 104729u * (unsigned)(r + 1));
  return ex_value(h, e) * (0.1f + ex_value(h ^ 0x5bd1e995u, e));
}
/* Rank r's part as muon reads it: a bf16 part widened to float. */
static float part_as_read(const spec *s, int r, int t, long long e) {
  float v = part_val(s->name, r, t, e);
  return s->kind == K_BF16 ? from_bf16(to_bf16(v)) : v;
}
static int is_partial(const spec *s) { return s->kind != K_FSDP; }

typedef struct pm {
  spec s;
  muon_layout layout;
  size_t n, full;          /* local elements, rows x cols */
  long long *idx;          /* local element k is full element idx[k] */
  float *w, *g;            /* this rank's piece and its part of the gradient (fp32 kinds) */
  uint16_t *gb;            /* K_BF16: its part in bf16 */
  float *rw, *rg;          /* the single device's parameter and gradient, whole */
  int li, ri;              /* index in the distributed optimizer, in its reference */
  muon_optimizer *ref;     /* the reference holding it */
} pm;

typedef struct model {
  int n;
  pm m[8];
  muon_optimizer *opt, *ref, *refm;   /* distributed; single device; single device of MEAN matrices */
} model;

static muon_layout layout_of(int kind) {
  muon_layout l;
  memset(&l, 0, sizeof l);
  l.n_levels = 1;
  if (kind == K_FSDP) l.levels[0] = muon_shard(0, &W.world);
  else l.levels[0] = muon_partial(&W.world, kind == K_MEAN ? MUON_REDUCE_MEAN : MUON_REDUCE_SUM);
  return l;
}

static muon_desc base_desc(void) {
  muon_desc d = muon_default_desc();
  d.hparams.lr = 0.02f;
  /* AdamW (the Partial AdamW tests): an eps near sqrt(v) makes the update depend on the
     gradient's scale and low bits (with 1e-8 AdamW is all but scale-invariant) */
  d.adamw.eps = 0.1f;
  return d;
}

static muon_optimizer *make_dist(muon_nonfinite nf, const muon_dist_config *cfg) {
  muon_desc d = base_desc();
  muon_optimizer *opt = NULL;
  d.comm = &W.world;
  d.dist = cfg;
  d.on_nonfinite = nf;
  if (muon_create(&opt, &d) != MUON_OK) return NULL;
  return opt;
}
static muon_optimizer *make_single(void) {
  muon_desc d = base_desc();
  muon_optimizer *opt = NULL;
  if (muon_create(&opt, &d) != MUON_OK) return NULL;
  return opt;
}

/* Opens the model: the distributed optimizer (grad scale `scale`), and with `with_ref` the
   single-device references. Returns 0 if something could not be set up (already CHECKed). */
static int model_open(model *M, const spec *specs, int n, float scale, muon_nonfinite nf, int with_ref) {
  muon_dist_config cfg = muon_layout_config();
  int i, ok = 1;
  size_t e;
  memset(M, 0, sizeof *M);
  M->opt = make_dist(nf, &cfg);
  CHECK(M->opt != NULL, "muon_create (distributed): %s", muon_error(NULL));
  if (!M->opt) return 0;
  CHECK(muon_set_grad_scale(M->opt, scale) == MUON_OK, "grad scale: %s", muon_error(M->opt));
  if (with_ref) {
    M->ref = make_single();
    M->refm = make_single();
    CHECK(M->ref && M->refm, "muon_create (single device): %s", muon_error(NULL));
    if (!M->ref || !M->refm) return 0;
    CHECK(muon_set_grad_scale(M->ref, scale) == MUON_OK, "ref grad scale");
    CHECK(muon_set_grad_scale(M->refm, scale * (1.0f / (float)W.size)) == MUON_OK, "refm grad scale");
  }
  for (i = 0; i < n; i++) {
    pm *x = &M->m[i];
    muon_matrix m = muon_default_matrix();
    x->s = specs[i];
    x->layout = layout_of(x->s.kind);
    x->full = (size_t)x->s.rows * x->s.cols;
    x->idx = (long long *)malloc(x->full * sizeof(long long));
    x->n = ex_piece(&x->layout, x->s.rows, x->s.cols, x->idx);
    x->w = (float *)malloc((x->n + 1) * sizeof(float));
    x->g = (float *)malloc((x->n + 1) * sizeof(float));
    x->gb = (uint16_t *)malloc((x->n + 1) * sizeof(uint16_t));
    x->rw = (float *)malloc(x->full * sizeof(float));
    x->rg = (float *)malloc(x->full * sizeof(float));
    for (e = 0; e < x->full; e++) { x->rw[e] = 0.2f * ex_value(ex_hash(x->s.name, 1u), (long long)e); x->rg[e] = 0; }
    for (e = 0; e < x->n; e++) { x->w[e] = x->rw[x->idx[e]]; x->g[e] = 0; x->gb[e] = 0; }
    M->n = i + 1;
    m.name = x->s.name;
    m.param = x->w;
    m.grad = x->s.kind == K_BF16 ? (const void *)x->gb : (const void *)x->g;
    m.grad_dtype = x->s.kind == K_BF16 ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
    m.rows = x->s.rows;
    m.cols = x->s.cols;
    m.layout = &x->layout;
    if (muon_add_matrix(M->opt, &m, &x->li) != MUON_OK) { CHECK(0, "add %s: %s", x->s.name, muon_error(M->opt)); ok = 0; }
    if (with_ref) {
      muon_matrix r = muon_default_matrix();
      x->ref = x->s.kind == K_MEAN ? M->refm : M->ref;
      r.name = x->s.name;
      r.param = x->rw;
      r.grad = x->rg;
      r.rows = x->s.rows;
      r.cols = x->s.cols;
      if (muon_add_matrix(x->ref, &r, &x->ri) != MUON_OK) { CHECK(0, "ref add %s: %s", x->s.name, muon_error(x->ref)); ok = 0; }
    }
  }
  return ok;
}

static void model_close(model *M) {
  int i;
  for (i = 0; i < M->n; i++) {
    pm *x = &M->m[i];
    free(x->idx); free(x->w); free(x->g); free(x->gb); free(x->rw); free(x->rg);
  }
  muon_destroy(M->opt);
  muon_destroy(M->ref);
  muon_destroy(M->refm);
  memset(M, 0, sizeof *M);
}

/* Step t's gradients: this rank's part, and the single device's sum of all parts, part 0 first,
   added left to right in float. */
static void model_grads(model *M, int t) {
  int i, r;
  size_t e;
  for (i = 0; i < M->n; i++) {
    pm *x = &M->m[i];
    if (!is_partial(&x->s)) {
      for (e = 0; e < x->n; e++) x->g[e] = part_val(x->s.name, 0, t, x->idx[e]);
      for (e = 0; e < x->full; e++) x->rg[e] = part_val(x->s.name, 0, t, (long long)e);
      continue;
    }
    for (e = 0; e < x->n; e++) {
      float v = part_val(x->s.name, W.rank, t, x->idx[e]);
      if (x->s.kind == K_BF16) x->gb[e] = to_bf16(v);
      else x->g[e] = v;
    }
    for (e = 0; e < x->full; e++) {
      float acc = part_as_read(&x->s, 0, t, (long long)e);
      for (r = 1; r < W.size; r++) acc = acc + part_as_read(&x->s, r, t, (long long)e);
      x->rg[e] = acc;
    }
  }
}

/* One step of the distributed optimizer and the references; the distributed status. */
static muon_status model_step(model *M) {
  muon_status st = muon_step(M->opt);
  if (M->ref) CHECK(muon_step(M->ref) == MUON_OK, "ref step: %s", muon_error(M->ref));
  if (M->refm) CHECK(muon_step(M->refm) == MUON_OK, "refm step: %s", muon_error(M->refm));
  return st;
}

/* Parameters bitwise equal to the references' everywhere; the momentum of a Partial matrix whole
   on its owner and equal to the reference's, absent elsewhere; an FSDP matrix's momentum its
   piece of the reference's. Returns the number of mismatches (each printed once per matrix). */
static int model_check(model *M, const char *when) {
  int i, bad = 0;
  size_t e;
  for (i = 0; i < M->n; i++) {
    pm *x = &M->m[i];
    const float *mom = NULL, *rmom = NULL;
    size_t size = 0, rsize = 0;
    int owner = -1, pbad = 0, mbad = 0;
    for (e = 0; e < x->n; e++)
      if (memcmp(&x->w[e], &x->rw[x->idx[e]], sizeof(float)) != 0) {
        if (!pbad) printf("  rank %d %s: %s parameter element %lld: got %.9g, one device %.9g\n", W.rank, when, x->s.name,
                          x->idx[e], (double)x->w[e], (double)x->rw[x->idx[e]]);
        pbad++;
      }
    if (muon_get_owner(M->opt, x->li, &owner) != MUON_OK) { printf("  rank %d %s: %s: no owner: %s\n", W.rank, when, x->s.name, muon_error(M->opt)); mbad++; }
    if (muon_get_momentum(M->opt, x->li, &mom, &size) != MUON_OK) mbad++;
    if (muon_get_momentum(x->ref, x->ri, &rmom, &rsize) != MUON_OK || rsize != x->full) mbad++;
    if (!mbad && is_partial(&x->s)) {
      if (owner == W.rank) {
        if (size != x->full || !mom) { printf("  rank %d %s: %s: owner's momentum has %zu floats, want %zu\n", W.rank, when, x->s.name, size, x->full); mbad++; }
        else if (memcmp(mom, rmom, x->full * sizeof(float)) != 0) { printf("  rank %d %s: %s: owner's momentum differs from one device's\n", W.rank, when, x->s.name); mbad++; }
      } else if (size != 0 || mom != NULL) {
        printf("  rank %d %s: %s: not the owner (rank %d is) but holds %zu floats of momentum\n", W.rank, when, x->s.name, owner, size);
        mbad++;
      }
    } else if (!mbad) {
      if (size != x->n) { printf("  rank %d %s: %s: momentum of %zu floats, piece %zu\n", W.rank, when, x->s.name, size, x->n); mbad++; }
      for (e = 0; !mbad && e < x->n; e++)
        if (memcmp(&mom[e], &rmom[x->idx[e]], sizeof(float)) != 0) { printf("  rank %d %s: %s: momentum element %lld differs\n", W.rank, when, x->s.name, x->idx[e]); mbad++; }
    }
    bad += pbad + mbad;
  }
  return bad;
}

/* The owner's momentum of Partial matrix x (a copy, rows x cols), or NULL on other ranks. */
static float *owner_momentum(muon_optimizer *opt, const pm *x) {
  const float *m;
  size_t n;
  float *c;
  if (muon_get_momentum(opt, x->li, &m, &n) != MUON_OK || !m || !n) return NULL;
  c = (float *)malloc(n * sizeof(float));
  memcpy(c, m, n * sizeof(float));
  return c;
}

/* ---- 1. bitwise equal to one device ----------------------------------------------------------- */
static const spec model_specs[] = {
  { "sum_a", 48, 32, K_SUM },      /* tall: Newton-Schulz on the transpose */
  { "sum_b", 32, 80, K_SUM },
  { "sum_odd", 7, 33, K_SUM },
  { "mean", 33, 18, K_MEAN },
  { "bf16", 24, 56, K_BF16 },
  { "fsdp", 36, 20, K_FSDP },
};
#define N_MODEL ((int)(sizeof model_specs / sizeof model_specs[0]))

static void test_bitwise(void) {
  model M;
  int t, i, g, bad = 0, zero_bad = 0, n_glob;
  char when[32];
  TEST_CASE("Partial SUM / MEAN / bf16 parts and an FSDP matrix: 5 steps bitwise equal to one device given the summed parts");
  if (!model_open(&M, model_specs, N_MODEL, 0.75f, MUON_NONFINITE_ERROR, 1)) { model_close(&M); return; }
  CHECK(muon_plan(M.opt) == MUON_OK, "plan: %s", muon_error(M.opt));
  /* After planning: the owner holds a whole zero momentum, the others none. */
  for (i = 0; i < M.n; i++) {
    pm *x = &M.m[i];
    const float *m;
    size_t n, e;
    int owner = -1;
    if (!is_partial(&x->s)) continue;
    CHECK(muon_get_owner(M.opt, x->li, &owner) == MUON_OK && owner >= 0 && owner < W.size, "%s: owner: %s", x->s.name, muon_error(M.opt));
    CHECK(muon_get_momentum(M.opt, x->li, &m, &n) == MUON_OK, "get_momentum");
    if (owner == W.rank) {
      CHECK(n == x->full && m != NULL, "rank %d: %s: the planned owner's momentum has %zu floats, want %zu", W.rank, x->s.name, n, x->full);
      for (e = 0; m && e < n; e++) zero_bad += m[e] != 0.0f;
    } else {
      CHECK(n == 0 && m == NULL, "rank %d: %s: a non-owner holds %zu floats of momentum after planning", W.rank, x->s.name, n);
    }
  }
  CHECK(zero_bad == 0, "rank %d: a planned momentum is not zeros", W.rank);
  for (t = 0; t < 5; t++) {
    muon_status st;
    model_grads(&M, t);
    st = model_step(&M);
    CHECK(st == MUON_OK, "rank %d step %d: %s", W.rank, t, muon_error(M.opt));
    snprintf(when, sizeof when, "step %d", t);
    bad += model_check(&M, when);
  }
  CHECK(bad == 0, "rank %d: %d mismatches against one device", W.rank, bad);
  CHECK(sum_all(bad) == 0, "some rank differs from one device");

  TEST_CASE("muon_gather_matrix: the Partial matrix's parameter and whole momentum on any root equal one device's");
  n_glob = muon_global_count(M.opt);
  CHECK(n_glob == N_MODEL, "global count %d, want %d", n_glob, N_MODEL);
  for (g = 0; g < n_glob; g++) {
    muon_matrix_info info;
    int owner = -1, root = g % W.size;
    pm *x = NULL;
    float *param, *mom;
    muon_status st;
    if (muon_global_info(M.opt, g, &info, &owner) != MUON_OK) { CHECK(0, "global_info %d", g); continue; }
    for (i = 0; i < M.n; i++) if (M.m[i].li == info.local) x = &M.m[i];
    if (!x) { CHECK(0, "global %d ('%s') has no local matrix", g, info.name); continue; }
    CHECK(info.rows == x->s.rows && info.cols == x->s.cols, "global %d: %d x %d", g, info.rows, info.cols);
    if (is_partial(&x->s)) CHECK(info.n_holders == W.size, "%s: %d holders, want %d", x->s.name, info.n_holders, W.size);
    param = (float *)malloc(x->full * sizeof(float));
    mom = (float *)malloc(x->full * sizeof(float));
    memset(param, 0xff, x->full * sizeof(float));
    memset(mom, 0xff, x->full * sizeof(float));
    st = muon_gather_matrix(M.opt, g, root, param, mom);
    CHECK(st == MUON_OK, "gather %s: %s", x->s.name, muon_error(M.opt));
    if (st == MUON_OK && W.rank == root) {
      const float *rm;
      size_t rn;
      muon_get_momentum(x->ref, x->ri, &rm, &rn);
      CHECK(memcmp(param, x->rw, x->full * sizeof(float)) == 0, "root %d: gathered parameter of %s differs from one device's", root, x->s.name);
      CHECK(rn == x->full && memcmp(mom, rm, x->full * sizeof(float)) == 0, "root %d: gathered momentum of %s differs from one device's", root, x->s.name);
    }
    free(param);
    free(mom);
  }
  model_close(&M);
}

/* ---- 2. memory: a Partial matrix's momentum is held once, by its owner ------------------------ */
static void test_memory(void) {
  model M;
  muon_stats st;
  size_t want_mine = 0, want_total = 0;
  int i, k;
  TEST_CASE("memory: state_bytes over all ranks = the Partial matrices once each + the FSDP pieces (no replicated momentum)");
  if (!model_open(&M, model_specs, N_MODEL, 1.0f, MUON_NONFINITE_ERROR, 0)) { model_close(&M); return; }
  for (k = 0; k < 2; k++) {   /* after planning, then after a step */
    if (k == 0) CHECK(muon_plan(M.opt) == MUON_OK, "plan: %s", muon_error(M.opt));
    else { model_grads(&M, 0); CHECK(muon_step(M.opt) == MUON_OK, "step: %s", muon_error(M.opt)); }
    want_mine = want_total = 0;
    for (i = 0; i < M.n; i++) {
      pm *x = &M.m[i];
      int owner = -1;
      want_total += x->full * sizeof(float);
      muon_get_owner(M.opt, x->li, &owner);
      if (!is_partial(&x->s)) want_mine += x->n * sizeof(float);
      else if (owner == W.rank) want_mine += x->full * sizeof(float);
    }
    muon_get_stats(M.opt, &st);
    CHECK(st.state_bytes == want_mine, "rank %d (%s): state_bytes %zu, want %zu (owned Partial matrices whole + FSDP piece)",
          W.rank, k ? "after a step" : "after planning", st.state_bytes, want_mine);
    CHECK(sum_all((long long)st.state_bytes) == (long long)want_total, "%s: state_bytes over all ranks %lld, want %zu (every matrix once)",
          k ? "after a step" : "after planning", sum_all((long long)st.state_bytes), want_total);
  }
  model_close(&M);
}

/* ---- 3. state save / load -------------------------------------------------------------------- */
static const spec sl_specs[] = {
  { "sl_sum", 40, 24, K_SUM },
  { "sl_mean", 17, 45, K_MEAN },
  { "sl_bf16", 24, 32, K_BF16 },
  { "sl_fsdp", 30, 22, K_FSDP },
};
#define N_SL ((int)(sizeof sl_specs / sizeof sl_specs[0]))

static void test_state(void) {
  model A, B;
  void *blob = NULL;
  size_t size, e;
  float *w2[N_SL], *w4[N_SL], *m2[N_SL], *m4[N_SL];
  int owner2[N_SL];
  int i, t, pbad = 0, mbad = 0;
  TEST_CASE("state: save at step 2, load into the same optimizer with the step-2 parameters, 2 steps = the original bits");
  memset(w2, 0, sizeof w2); memset(w4, 0, sizeof w4); memset(m2, 0, sizeof m2); memset(m4, 0, sizeof m4);
  if (!model_open(&A, sl_specs, N_SL, 0.75f, MUON_NONFINITE_ERROR, 0)) { model_close(&A); return; }
  for (t = 0; t < 2; t++) { model_grads(&A, t); CHECK(muon_step(A.opt) == MUON_OK, "step %d: %s", t, muon_error(A.opt)); }
  size = muon_state_size(A.opt);
  blob = malloc(size);
  CHECK(muon_state_save(A.opt, blob, size) == MUON_OK, "save: %s", muon_error(A.opt));
  for (i = 0; i < N_SL; i++) {
    pm *x = &A.m[i];
    w2[i] = (float *)malloc((x->n + 1) * sizeof(float));
    memcpy(w2[i], x->w, x->n * sizeof(float));
    muon_get_owner(A.opt, x->li, &owner2[i]);
    if (is_partial(&x->s)) {
      m2[i] = owner_momentum(A.opt, x);
      CHECK((m2[i] != NULL) == (owner2[i] == W.rank), "rank %d: %s: momentum held %s the owner (rank %d)", W.rank, x->s.name, m2[i] ? "by a non-owner, not only" : "not by", owner2[i]);
    }
  }
  for (t = 2; t < 4; t++) { model_grads(&A, t); CHECK(muon_step(A.opt) == MUON_OK, "step %d: %s", t, muon_error(A.opt)); }
  for (i = 0; i < N_SL; i++) {
    pm *x = &A.m[i];
    w4[i] = (float *)malloc((x->n + 1) * sizeof(float));
    memcpy(w4[i], x->w, x->n * sizeof(float));
    if (is_partial(&x->s)) m4[i] = owner_momentum(A.opt, x);
    CHECK(memcmp(w2[i], w4[i], x->n * sizeof(float)) != 0 || x->n == 0, "%s did not move in steps 2-3", x->s.name);
  }
  /* Back to step 2: parameters restored by the trainer, the state by muon_state_load. */
  for (i = 0; i < N_SL; i++) memcpy(A.m[i].w, w2[i], A.m[i].n * sizeof(float));
  CHECK(muon_state_load(A.opt, blob, size) == MUON_OK, "load: %s", muon_error(A.opt));
  for (t = 2; t < 4; t++) { model_grads(&A, t); CHECK(muon_step(A.opt) == MUON_OK, "resumed step %d: %s", t, muon_error(A.opt)); }
  for (i = 0; i < N_SL; i++) {
    pm *x = &A.m[i];
    float *m = NULL;
    int owner = -1;
    for (e = 0; e < x->n; e++) pbad += memcmp(&x->w[e], &w4[i][e], sizeof(float)) != 0;
    muon_get_owner(A.opt, x->li, &owner);
    if (!is_partial(&x->s)) continue;
    mbad += owner != owner2[i];
    m = owner_momentum(A.opt, x);
    mbad += (m != NULL) != (m4[i] != NULL) || (m && memcmp(m, m4[i], x->full * sizeof(float)) != 0);
    free(m);
  }
  CHECK(pbad == 0, "rank %d: %d parameter elements differ from the run that never stopped", W.rank, pbad);
  CHECK(mbad == 0, "rank %d: %d Partial matrices' momentum or owner differ from the run that never stopped", W.rank, mbad);

  TEST_CASE("state: the same blobs loaded into a fresh optimizer: same owners, the whole momentum back, 2 steps = the original bits");
  pbad = mbad = 0;
  if (model_open(&B, sl_specs, N_SL, 0.75f, MUON_NONFINITE_ERROR, 0)) {
    for (i = 0; i < N_SL; i++) memcpy(B.m[i].w, w2[i], B.m[i].n * sizeof(float));
    CHECK(muon_state_load(B.opt, blob, size) == MUON_OK, "load: %s", muon_error(B.opt));
    CHECK(muon_plan(B.opt) == MUON_OK, "plan: %s", muon_error(B.opt));
    for (i = 0; i < N_SL; i++) {
      pm *x = &B.m[i];
      float *m;
      int owner = -1;
      if (!is_partial(&x->s)) continue;
      muon_get_owner(B.opt, x->li, &owner);
      CHECK(owner == owner2[i], "%s: owner %d after loading, saved by rank %d", x->s.name, owner, owner2[i]);
      m = owner_momentum(B.opt, x);
      CHECK((m != NULL) == (m2[i] != NULL) && (!m || memcmp(m, m2[i], x->full * sizeof(float)) == 0),
            "rank %d: %s: the loaded momentum is not the saved one (%s)", W.rank, x->s.name, m ? "held" : "absent");
      free(m);
    }
    for (t = 2; t < 4; t++) { model_grads(&B, t); CHECK(muon_step(B.opt) == MUON_OK, "fresh step %d: %s", t, muon_error(B.opt)); }
    for (i = 0; i < N_SL; i++) {
      pm *x = &B.m[i];
      float *m;
      for (e = 0; e < x->n; e++) pbad += memcmp(&x->w[e], &w4[i][e], sizeof(float)) != 0;
      if (!is_partial(&x->s)) continue;
      m = owner_momentum(B.opt, x);
      mbad += (m != NULL) != (m4[i] != NULL) || (m && memcmp(m, m4[i], x->full * sizeof(float)) != 0);
      free(m);
    }
    CHECK(pbad == 0, "rank %d: %d parameter elements differ from the run that never stopped", W.rank, pbad);
    CHECK(mbad == 0, "rank %d: %d Partial matrices' momentum differs from the run that never stopped", W.rank, mbad);
  }
  model_close(&B);
  for (i = 0; i < N_SL; i++) { free(w2[i]); free(w4[i]); free(m2[i]); free(m4[i]); }
  free(blob);
  model_close(&A);
}

/* ---- 4. resharding ---------------------------------------------------------------------------- */
static int mkdir_p(const char *path) {
  char buf[512];
  size_t i, n = strlen(path);
  if (n + 1 > sizeof buf) return -1;
  memcpy(buf, path, n + 1);
  for (i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    buf[i] = '\0';
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
    buf[i] = i < n ? '/' : '\0';
  }
  return 0;
}

/* A distributed optimizer holding list[0..count) under the layouts of kinds[] (params: copies of
   the references' current ones), its state resharded from `paths`, then planned: every rank's
   momentum (a Partial matrix's whole on its owner, none elsewhere; a piece's its piece) must be
   the reference's, bit for bit. */
static void reshard_into_dist(pm *const *list, const int *kinds, int count, const char *const *paths, int npaths, const char *what) {
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt = make_dist(MUON_NONFINITE_ERROR, &cfg);
  muon_layout lay[8];
  long long *idx[8];
  float *w[8];
  size_t n[8], e;
  int i, bad = 0;
  muon_status st;
  CHECK(opt != NULL, "create");
  if (!opt) return;
  for (i = 0; i < count; i++) {
    muon_matrix m = muon_default_matrix();
    const pm *x = list[i];
    lay[i] = layout_of(kinds[i]);
    idx[i] = (long long *)malloc(x->full * sizeof(long long));
    n[i] = ex_piece(&lay[i], x->s.rows, x->s.cols, idx[i]);
    w[i] = (float *)malloc((n[i] + 1) * sizeof(float));
    for (e = 0; e < n[i]; e++) w[i][e] = x->rw[idx[i][e]];
    m.name = x->s.name; m.param = w[i]; m.rows = x->s.rows; m.cols = x->s.cols; m.layout = &lay[i];
    CHECK(muon_add_matrix(opt, &m, NULL) == MUON_OK, "%s: add %s: %s", what, x->s.name, muon_error(opt));
  }
  st = muon_state_reshard_files(opt, paths, npaths);
  CHECK(st == MUON_OK, "%s: reshard: %s", what, muon_error(opt));
  CHECK(same_all(st), "%s: reshard statuses differ between ranks", what);
  st = muon_plan(opt);
  CHECK(st == MUON_OK, "%s: plan: %s", what, muon_error(opt));
  for (i = 0; i < count; i++) {
    const pm *x = list[i];
    const float *m, *rm;
    size_t sz, rsz;
    int owner = -1, partial = kinds[i] != K_FSDP && W.size > 1;
    muon_get_owner(opt, i, &owner);
    muon_get_momentum(opt, i, &m, &sz);
    muon_get_momentum(x->ref, x->ri, &rm, &rsz);
    if (partial && owner == W.rank) {
      if (sz != x->full || memcmp(m, rm, x->full * sizeof(float)) != 0) { printf("  rank %d %s: %s: the owner's momentum (%zu floats) is not one device's\n", W.rank, what, x->s.name, sz); bad++; }
    } else if (partial) {
      if (sz != 0 || m != NULL) { printf("  rank %d %s: %s: a non-owner holds %zu floats of momentum\n", W.rank, what, x->s.name, sz); bad++; }
    } else {
      int b = sz != n[i];
      for (e = 0; !b && e < n[i]; e++) b = memcmp(&m[e], &rm[idx[i][e]], sizeof(float)) != 0;
      if (b) { printf("  rank %d %s: %s: the momentum piece is not one device's\n", W.rank, what, x->s.name); bad++; }
    }
  }
  CHECK(bad == 0, "rank %d: %s: %d matrices' momentum differ from one device's", W.rank, what, bad);
  CHECK(sum_all(bad) == 0, "%s: some rank's momentum differs", what);
  for (i = 0; i < count; i++) { free(idx[i]); free(w[i]); }
  muon_destroy(opt);
}

static const spec rs_specs[] = {
  { "rs_sum", 40, 24, K_SUM },
  { "rs_mean", 21, 30, K_MEAN },
  { "rs_bf16", 16, 40, K_BF16 },
  { "rs_fsdp", 26, 18, K_FSDP },
};
#define N_RS ((int)(sizeof rs_specs / sizeof rs_specs[0]))

static void test_reshard(void) {
  model M;
  char (*paths)[600] = NULL, refpath[2][600];
  const char *pp[64];
  muon_optimizer *S = NULL;
  float *sw[N_RS];
  int i, r, t, bad = 0, k;
  muon_status st;
  TEST_CASE("reshard: every rank's blob of a Partial run into one device: its momentum is the reference's, bitwise");
  if (!model_open(&M, rs_specs, N_RS, 0.75f, MUON_NONFINITE_ERROR, 1)) { model_close(&M); return; }
  for (t = 0; t < 3; t++) {
    model_grads(&M, t);
    CHECK(model_step(&M) == MUON_OK, "step %d: %s", t, muon_error(M.opt));
  }
  CHECK(model_check(&M, "before saving") == 0, "rank %d: the run already differs from one device", W.rank);
  if (W.rank == 0) CHECK(mkdir_p(scratch) == 0, "mkdir -p %s: %s", scratch, strerror(errno));
  barrier();
  paths = (char (*)[600])malloc((size_t)W.size * sizeof *paths);
  for (r = 0; r < W.size; r++) { snprintf(paths[r], sizeof paths[r], "%s/partial_n%d_rank%d.muon", scratch, W.size, r); pp[r] = paths[r]; }
  for (k = 0; k < 2; k++) snprintf(refpath[k], sizeof refpath[k], "%s/partial_n%d_ref%d.muon", scratch, W.size, k);
  st = muon_state_save_file(M.opt, paths[W.rank]);
  CHECK(st == MUON_OK, "save_file %s: %s", paths[W.rank], muon_error(M.opt));
  if (W.rank == 0) {   /* the single-device saves, for the reverse direction */
    CHECK(muon_state_save_file(M.ref, refpath[0]) == MUON_OK, "ref save: %s", muon_error(M.ref));
    CHECK(muon_state_save_file(M.refm, refpath[1]) == MUON_OK, "refm save: %s", muon_error(M.refm));
  }
  barrier();   /* every file written before anyone reads */

  S = make_single();
  CHECK(S != NULL, "create single");
  for (i = 0; S && i < N_RS; i++) {
    muon_matrix m = muon_default_matrix();
    pm *x = &M.m[i];
    sw[i] = (float *)malloc(x->full * sizeof(float));
    memcpy(sw[i], x->rw, x->full * sizeof(float));
    m.name = x->s.name; m.param = sw[i]; m.rows = x->s.rows; m.cols = x->s.cols;
    CHECK(muon_add_matrix(S, &m, NULL) == MUON_OK, "single add %s: %s", x->s.name, muon_error(S));
  }
  if (S) {
    st = muon_state_reshard_files(S, pp, W.size);
    CHECK(st == MUON_OK, "rank %d: reshard %d files into one device: %s", W.rank, W.size, muon_error(S));
    for (i = 0; st == MUON_OK && i < N_RS; i++) {
      pm *x = &M.m[i];
      const float *m, *rm;
      size_t sz, rsz;
      muon_get_momentum(S, i, &m, &sz);
      muon_get_momentum(x->ref, x->ri, &rm, &rsz);
      if (sz != x->full || rsz != x->full || memcmp(m, rm, x->full * sizeof(float)) != 0) {
        printf("  rank %d: resharded momentum of %s (%zu floats) differs from one device's\n", W.rank, x->s.name, sz);
        bad++;
      }
    }
    CHECK(bad == 0, "rank %d: %d matrices' resharded momentum differ", W.rank, bad);
    for (i = 0; i < N_RS; i++) free(sw[i]);
    muon_destroy(S);
  }

  TEST_CASE("reshard: the Partial run's blobs into the other layouts at the same world size (Partial <-> FSDP swapped)");
  {
    pm *list[N_RS];
    int kinds[N_RS];
    for (i = 0; i < N_RS; i++) { list[i] = &M.m[i]; kinds[i] = M.m[i].s.kind == K_FSDP ? K_SUM : K_FSDP; }
    reshard_into_dist(list, kinds, N_RS, pp, W.size, "swapped layouts");
  }

  TEST_CASE("reshard: a single-device save into a distributed Partial optimizer: after planning the owner's momentum is one device's");
  for (k = 0; k < 2; k++) {   /* the reference of the SUM / bf16 / FSDP matrices, then of the MEAN one */
    pm *list[N_RS];
    int kinds[N_RS], n = 0;
    const char *one = refpath[k];
    for (i = 0; i < N_RS; i++)
      if ((M.m[i].s.kind == K_MEAN) == (k == 1)) { list[n] = &M.m[i]; kinds[n] = M.m[i].s.kind; n++; }
    reshard_into_dist(list, kinds, n, &one, 1, k ? "from the MEAN reference" : "from the reference");
  }

  barrier();   /* everyone has read every file */
  remove(paths[W.rank]);
  if (W.rank == 0) { remove(refpath[0]); remove(refpath[1]); }
  free(paths);
  model_close(&M);
}

/* ---- 5. errors: the same status on every rank, nothing applied --------------------------------- */
typedef struct single_mat { float *w, *w0, *g; size_t n; } single_mat;

static void smat_init(single_mat *s, size_t n, unsigned seed) {
  size_t e;
  s->n = n;
  s->w = (float *)malloc(n * sizeof(float));
  s->w0 = (float *)malloc(n * sizeof(float));
  s->g = (float *)malloc(n * sizeof(float));
  for (e = 0; e < n; e++) { s->w[e] = s->w0[e] = ex_value(seed, (long long)e); s->g[e] = 0.5f + 0.25f * ex_value(seed + 1, (long long)e); }
}
static int smat_unchanged(const single_mat *s) { return memcmp(s->w, s->w0, s->n * sizeof(float)) == 0; }
static void smat_free(single_mat *s) { free(s->w); free(s->w0); free(s->g); }

static muon_status add_with(muon_optimizer *opt, const char *name, single_mat *s, int rows, int cols, const muon_layout *l, float *momentum) {
  muon_matrix m = muon_default_matrix();
  m.name = name; m.param = s->w; m.grad = s->g; m.rows = rows; m.cols = cols; m.layout = l; m.momentum = momentum;
  return muon_add_matrix(opt, &m, NULL);
}

/* A custom exchange that copies the local piece (whole under these layouts): planning refuses a
   custom exchange for Partial matrices, so it is never called. */
static muon_status copy_gather(void *state, const muon_matrix_info *m, const float *local, float *full, int owner) {
  (void)state; (void)owner;
  if (full && local) memcpy(full, local, m->local_size * sizeof(float));
  return MUON_OK;
}
static muon_status copy_redistribute(void *state, const muon_matrix_info *m, const float *full, float *local, int owner) {
  (void)state; (void)owner;
  if (full && local) memcpy(local, full, m->local_size * sizeof(float));
  return MUON_OK;
}

/* muon_plan refuses with `want` on every rank (its message naming `needle` where given), the
   step after it fails alike everywhere, and no rank's parameter changed. */
static void plan_refused(muon_optimizer *opt, muon_status want, const char *needle, const single_mat *a) {
  muon_status st = muon_plan(opt), st2;
  CHECK(st == want, "rank %d: plan returned %s: %s", W.rank, muon_status_string(st), muon_error(opt));
  CHECK(same_all(st), "plan statuses differ between ranks");
  if (needle) CHECK(strstr(muon_error(opt), needle) != NULL, "rank %d: the message does not say '%s': %s", W.rank, needle, muon_error(opt));
  st2 = muon_step(opt);
  CHECK(st2 != MUON_OK && same_all(st2), "rank %d: step after a failed plan returned %s (must fail alike everywhere)", W.rank, muon_status_string(st2));
  CHECK(sum_all(!smat_unchanged(a)) == 0, "a parameter changed somewhere");
}

static void test_errors(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt;
  muon_layout lp, lr;
  single_mat a;
  muon_status st, st2;
  int P = W.size;
  memset(&lp, 0, sizeof lp);
  lp.n_levels = 1;
  lp.levels[0] = muon_partial(&W.world, MUON_REDUCE_SUM);
  memset(&lr, 0, sizeof lr);
  lr.n_levels = 1;
  lr.levels[0] = muon_replicate(&W.world);

  if (P >= 2) {
    TEST_CASE("error: rank 0 describes a matrix as PARTIAL, the others as REPLICATE: MUON_ERR_MISMATCH naming Partial on every rank, nothing applied");
    opt = make_dist(MUON_NONFINITE_ERROR, &cfg);
    smat_init(&a, 12 * 20, 11u);
    CHECK(add_with(opt, "mm", &a, 12, 20, W.rank == 0 ? &lp : &lr, NULL) == MUON_OK, "add: %s", muon_error(opt));
    st = muon_plan(opt);
    CHECK(st == MUON_ERR_MISMATCH, "rank %d: plan returned %s: %s", W.rank, muon_status_string(st), muon_error(opt));
    CHECK(same_all(st), "plan statuses differ between ranks");
    CHECK(strstr(muon_error(opt), "Partial") != NULL, "rank %d: the message does not mention Partial: %s", W.rank, muon_error(opt));
    st2 = muon_step(opt);
    CHECK(st2 != MUON_OK && same_all(st2), "rank %d: step after a failed plan returned %s (must fail alike everywhere)", W.rank, muon_status_string(st2));
    CHECK(smat_unchanged(&a), "rank %d: the parameter changed", W.rank);
    CHECK(sum_all(!smat_unchanged(&a)) == 0, "a parameter changed somewhere");
    smat_free(&a);
    muon_destroy(opt);

    if (P >= 3) {
      /* Pieces that tile the matrix, but part 1 holds only the first half: ranks 0, 1 the top
         rows as parts 0, 1; rank 2 (and any further rank) the bottom rows as part 0. */
      muon_layout lh;
      int part = W.rank == 1, half = W.rank >= 2;
      TEST_CASE("error: Partial parts that do not each hold the whole matrix: MUON_ERR_SHAPE on every rank, nothing applied");
      memset(&lh, 0, sizeof lh);
      lh.n_levels = 2;
      lh.levels[0] = muon_partial(NULL, MUON_REDUCE_SUM);
      lh.levels[0].size = 2; lh.levels[0].index = part;
      lh.levels[1] = muon_shard(0, NULL);
      lh.levels[1].size = 2; lh.levels[1].index = half;
      opt = make_dist(MUON_NONFINITE_ERROR, &cfg);
      smat_init(&a, 6 * 20, 12u);
      CHECK(add_with(opt, "halves", &a, 12, 20, &lh, NULL) == MUON_OK, "add: %s", muon_error(opt));
      plan_refused(opt, MUON_ERR_SHAPE, "do not each hold", &a);
      smat_free(&a);
      muon_destroy(opt);
    }

    TEST_CASE("error: a trainer-supplied muon_matrix.momentum for a Partial matrix is MUON_ERR_ARG at muon_add_matrix");
    opt = make_dist(MUON_NONFINITE_ERROR, &cfg);
    smat_init(&a, 12 * 20, 13u);
    {
      float *mom = (float *)malloc(12 * 20 * sizeof(float));
      st = add_with(opt, "mom", &a, 12, 20, &lp, mom);
      CHECK(st == MUON_ERR_ARG, "rank %d: add returned %s: %s", W.rank, muon_status_string(st), muon_error(opt));
      CHECK(same_all(st), "statuses differ between ranks");
      CHECK(muon_matrix_count(opt) == 0, "the rejected matrix was registered");
      /* the optimizer is still usable: the same matrix without the buffer */
      CHECK(add_with(opt, "mom", &a, 12, 20, &lp, NULL) == MUON_OK, "add without momentum: %s", muon_error(opt));
      CHECK(muon_plan(opt) == MUON_OK, "plan: %s", muon_error(opt));
      free(mom);
    }
    smat_free(&a);
    muon_destroy(opt);
  }

  TEST_CASE("error: a PARTIAL level with reduce 7 is MUON_ERR_SHAPE at muon_add_matrix");
  opt = make_dist(MUON_NONFINITE_ERROR, &cfg);
  smat_init(&a, 12 * 20, 17u);
  {
    muon_layout bad = lp;
    bad.levels[0].reduce = (muon_reduce)7;
    st = add_with(opt, "badreduce", &a, 12, 20, &bad, NULL);
    CHECK(st == MUON_ERR_SHAPE, "rank %d: add returned %s: %s", W.rank, muon_status_string(st), muon_error(opt));
    CHECK(same_all(st), "statuses differ between ranks");
    CHECK(muon_matrix_count(opt) == 0, "the rejected matrix was registered");
  }
  smat_free(&a);
  muon_destroy(opt);

  if (P >= 2) {
    muon_dist_config custom = muon_layout_config();
    TEST_CASE("error: muon_dist_config.gather/.redistribute with a Partial matrix: muon_plan is MUON_ERR_ARG on every rank, nothing applied");
    custom.gather = copy_gather;
    custom.redistribute = copy_redistribute;
    opt = make_dist(MUON_NONFINITE_ERROR, &custom);
    smat_init(&a, 12 * 20, 19u);
    CHECK(add_with(opt, "custom", &a, 12, 20, &lp, NULL) == MUON_OK, "add: %s", muon_error(opt));
    plan_refused(opt, MUON_ERR_ARG, NULL, &a);
    smat_free(&a);
    muon_destroy(opt);
  }

  {   /* a NaN in rank P-1's part */
    static const spec nf_specs[] = { { "nf_sum", 20, 28, K_SUM }, { "nf_mean", 18, 12, K_MEAN }, { "nf_bf16", 16, 24, K_BF16 }, { "nf_fsdp", 22, 16, K_FSDP } };
    model M;
    float *w0[4];
    int i, k, changed, target;
    for (k = 0; k < 2; k++) {   /* ERROR, then SKIP */
      muon_stats s;
      TEST_CASE(k == 0 ? "error: a NaN in rank P-1's part: MUON_ERR_NONFINITE on every rank, no parameter changed anywhere"
                       : "MUON_NONFINITE_SKIP: a NaN in rank P-1's part skips that matrix on every rank, the others step");
      if (!model_open(&M, nf_specs, 4, 1.0f, k ? MUON_NONFINITE_SKIP : MUON_NONFINITE_ERROR, 0)) { model_close(&M); continue; }
      model_grads(&M, 0);
      target = k ? 2 : 1;   /* ERROR: the MEAN matrix's fp32 part; SKIP: the bf16 part */
      if (W.rank == P - 1) {
        if (M.m[target].s.kind == K_BF16) M.m[target].gb[5] = 0x7fc0u;
        else M.m[target].g[5] = NAN;
      }
      for (i = 0; i < 4; i++) { w0[i] = (float *)malloc((M.m[i].n + 1) * sizeof(float)); memcpy(w0[i], M.m[i].w, M.m[i].n * sizeof(float)); }
      st = muon_step(M.opt);
      CHECK(same_all(st), "step statuses differ between ranks");
      if (k == 0) CHECK(st == MUON_ERR_NONFINITE, "rank %d: step returned %s: %s", W.rank, muon_status_string(st), muon_error(M.opt));
      else CHECK(st == MUON_OK, "rank %d: step returned %s: %s", W.rank, muon_status_string(st), muon_error(M.opt));
      for (i = 0, changed = 0; i < 4; i++) {
        int same = memcmp(w0[i], M.m[i].w, M.m[i].n * sizeof(float)) == 0;
        if (k == 0 || i == target) changed += !same;
        else CHECK(!same || M.m[i].n == 0, "rank %d: %s did not step", W.rank, M.m[i].s.name);
        free(w0[i]);
      }
      CHECK(changed == 0, "rank %d: %d matrices changed", W.rank, changed);
      CHECK(sum_all(changed) == 0, "a matrix changed on some rank");
      {   /* the state too: the owner's momentum of the bad matrix is still zeros */
        const float *m;
        size_t n, e;
        int nz = 0;
        muon_get_momentum(M.opt, M.m[target].li, &m, &n);
        for (e = 0; m && e < n; e++) nz += m[e] != 0.0f;
        CHECK(nz == 0, "rank %d: the momentum of %s moved", W.rank, M.m[target].s.name);
      }
      muon_get_stats(M.opt, &s);
      if (k == 1) CHECK(s.skipped == 1, "rank %d: stats.skipped %lld, want 1", W.rank, s.skipped);
      else CHECK(s.steps == 0, "rank %d: stats.steps %lld after a failed step", W.rank, s.steps);
      model_close(&M);
    }

    if (P >= 2) {   /* finite parts whose sum overflows */
      static const spec ov_specs[] = { { "ov_sum", 20, 28, K_SUM }, { "ov_other", 18, 12, K_SUM } };
      for (k = 0; k < 2; k++) {
        TEST_CASE(k == 0 ? "error: finite parts (3e38 each) summing to Inf: the same non-OK status on every rank, nothing applied"
                         : "MUON_NONFINITE_SKIP: finite parts summing to Inf skip that matrix on every rank");
        if (!model_open(&M, ov_specs, 2, 1.0f, k ? MUON_NONFINITE_SKIP : MUON_NONFINITE_ERROR, 0)) { model_close(&M); continue; }
        model_grads(&M, 0);
        M.m[0].g[7] = 3e38f;
        for (i = 0; i < 2; i++) { w0[i] = (float *)malloc((M.m[i].n + 1) * sizeof(float)); memcpy(w0[i], M.m[i].w, M.m[i].n * sizeof(float)); }
        st = muon_step(M.opt);
        CHECK(same_all(st), "step statuses differ between ranks");
        if (k == 0) CHECK(st != MUON_OK, "rank %d: the step succeeded", W.rank);
        else CHECK(st == MUON_OK, "rank %d: step returned %s: %s", W.rank, muon_status_string(st), muon_error(M.opt));
        if (k == 0 && W.rank == 0) printf("  (overflowing parts: %s)\n", muon_error(M.opt));
        for (i = 0, changed = 0; i < 2; i++) {
          int same = memcmp(w0[i], M.m[i].w, M.m[i].n * sizeof(float)) == 0;
          if (k == 0 || i == 0) changed += !same;
          else CHECK(!same, "rank %d: %s did not step", W.rank, M.m[i].s.name);
          free(w0[i]);
        }
        CHECK(changed == 0, "rank %d: %d matrices changed", W.rank, changed);
        CHECK(sum_all(changed) == 0, "a matrix changed on some rank");
        model_close(&M);
      }
    }
  }
}

/* ---- 6. Partial AdamW params (ZeRO-1) ----------------------------------------------------------
   An AdamW param whose layout has PARTIAL levels is registered whole on every rank of the group,
   its gradient only the rank's part. muon sums the parts in part order in fp32 (bf16 parts
   widened first), each rank keeps the moments of one torch.chunk of the param and the new chunks
   are all-gathered: every rank must end with exactly the single device's parameter (and bf16
   mirror), the single device being fed the left-to-right float sum of the parts. MEAN: as for
   matrices, a reference of its own with grad_scale * (1.0f / parts). */
enum { AW_PARTIAL = 1, AW_MEAN = 2, AW_BF16 = 4, AW_GBF16 = 8, AW_MIRROR = 16 };

typedef struct awx {
  char name[32];
  size_t n;
  int flags, nparts, part, set;   /* the parts summed, this rank's part, its replica set */
  size_t offset, full_size;       /* a ZeRO piece (0, 0: the whole param) */
  muon_layout layout;             /* given to muon when it has levels */
  void *w, *rw;                   /* the distributed param and the single device's (fp32 or bf16) */
  float *g, *rg;                  /* this rank's part (fp32 gradient); the single device's sum */
  uint16_t *gb, *mir, *rmir;      /* this rank's part (bf16 gradient); the bf16 mirrors */
  int li, ri;
  muon_optimizer *ref;
} awx;

static size_t aw_es(const awx *a) { return (a->flags & AW_BF16) ? sizeof(uint16_t) : sizeof(float); }
static size_t aw_bytes(const awx *a) { return a->n * aw_es(a); }

/* torch.chunk of n elements into `parts`: chunk k is [lo, hi). */
static void aw_chunk(size_t n, int parts, int k, size_t *lo, size_t *hi) {
  size_t c = (n + (size_t)parts - 1) / (size_t)parts;
  *lo = (size_t)k * c < n ? (size_t)k * c : n;
  *hi = *lo + c < n ? *lo + c : n;
}

/* A param of n elements: layout `lay` (NULL: none), summing `nparts` parts of which this rank's
   is `part`, in replica set `set` (each set has parts of its own). */
static void aw_init(awx *a, const char *name, size_t n, int flags, const muon_layout *lay, int nparts, int part, int set) {
  size_t e;
  memset(a, 0, sizeof *a);
  snprintf(a->name, sizeof a->name, "%s", name);
  a->n = n; a->flags = flags; a->nparts = nparts; a->part = part; a->set = set; a->li = a->ri = -1;
  if (lay) a->layout = *lay;
  a->w = malloc(n * sizeof(float));
  a->rw = malloc(n * sizeof(float));
  a->g = (float *)calloc(n, sizeof(float));
  a->rg = (float *)calloc(n, sizeof(float));
  a->gb = (uint16_t *)calloc(n, sizeof(uint16_t));
  a->mir = (uint16_t *)calloc(n, sizeof(uint16_t));
  a->rmir = (uint16_t *)calloc(n, sizeof(uint16_t));
  for (e = 0; e < n; e++) {
    float v = 1e-3f * ex_value(ex_hash(name, 3u), (long long)e);   /* the size of an update: its low bits show */
    if (flags & AW_BF16) ((uint16_t *)a->w)[e] = ((uint16_t *)a->rw)[e] = to_bf16(v);
    else ((float *)a->w)[e] = ((float *)a->rw)[e] = v;
  }
}
/* Partial over the world (part = rank), or with flags lacking AW_PARTIAL no layout at all. */
static void aw_world(awx *a, const char *name, size_t n, int flags) {
  muon_layout l;
  memset(&l, 0, sizeof l);
  if (flags & AW_PARTIAL) {
    l.n_levels = 1;
    l.levels[0] = muon_partial(&W.world, (flags & AW_MEAN) ? MUON_REDUCE_MEAN : MUON_REDUCE_SUM);
    aw_init(a, name, n, flags, &l, W.size, W.rank, 0);
  } else {
    aw_init(a, name, n, flags, NULL, 1, 0, 0);
  }
}
static void aw_free(awx *a) {
  free(a->w); free(a->rw); free(a->g); free(a->rg); free(a->gb); free(a->mir); free(a->rmir);
  memset(a, 0, sizeof *a);
}

/* Registers the param in opt and (ref not NULL) its whole-gradient twin in ref. */
static muon_status aw_add(awx *a, muon_optimizer *opt, muon_optimizer *ref) {
  muon_adamw_param p = muon_default_adamw_param();
  muon_status st;
  p.name = a->name;
  p.param = a->w;
  p.size = a->n;
  p.param_dtype = (a->flags & AW_BF16) ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
  p.grad_dtype = (a->flags & AW_GBF16) ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
  p.grad = (a->flags & AW_GBF16) ? (const void *)a->gb : (const void *)a->g;
  p.mirror = (a->flags & AW_MIRROR) ? a->mir : NULL;
  p.layout = a->layout.n_levels ? &a->layout : NULL;
  p.offset = a->offset;
  p.full_size = a->full_size;
  st = muon_add_adamw_param(opt, &p, &a->li);
  if (st == MUON_OK && ref) {
    muon_adamw_param r = muon_default_adamw_param();
    r.name = a->name;
    r.param = a->rw;
    r.size = a->n;
    r.param_dtype = p.param_dtype;
    r.grad_dtype = MUON_DTYPE_FP32;
    r.grad = a->rg;
    r.mirror = (a->flags & AW_MIRROR) ? a->rmir : NULL;
    a->ref = ref;
    if (muon_add_adamw_param(ref, &r, &a->ri) != MUON_OK) CHECK(0, "ref add %s: %s", a->name, muon_error(ref));
  }
  return st;
}

/* Part k of set a->set at step t, element e, as muon reads it (a bf16 part widened). */
static float aw_val(const awx *a, int k, int t, long long e) {
  float v = part_val(a->name, k + 16 * a->set, t, e);
  return (a->flags & AW_GBF16) ? from_bf16(to_bf16(v)) : v;
}
/* Step t: this rank's part, and the single device's gradient: the parts summed, part 0 first,
   left to right in float (a non-Partial param: the same whole gradient everywhere). */
static void aw_grads(awx *a, int t) {
  size_t e;
  int k;
  int mine = (a->flags & AW_PARTIAL) ? a->part : 0;
  for (e = 0; e < a->n; e++) {
    float v = part_val(a->name, mine + 16 * a->set, t, (long long)e);
    if (a->flags & AW_GBF16) a->gb[e] = to_bf16(v);
    else a->g[e] = v;
  }
  for (e = 0; e < a->n; e++) {
    float acc = aw_val(a, 0, t, (long long)e);
    if (a->flags & AW_PARTIAL)
      for (k = 1; k < a->nparts; k++) acc = acc + aw_val(a, k, t, (long long)e);
    a->rg[e] = acc;
  }
}
static float aw_get(const awx *a, const void *buf, size_t e) {
  return (a->flags & AW_BF16) ? from_bf16(((const uint16_t *)buf)[e]) : ((const float *)buf)[e];
}
/* The param (and mirror) bitwise the single device's: the number of differing elements. */
static int aw_check(const awx *a, const char *when) {
  size_t e, es = aw_es(a);
  int bad = 0, mbad = 0;
  for (e = 0; e < a->n; e++)
    if (memcmp((const char *)a->w + e * es, (const char *)a->rw + e * es, es) != 0) {
      if (!bad) printf("  rank %d %s: AdamW %s element %zu: got %.9g, one device %.9g\n", W.rank, when, a->name, e,
                       (double)aw_get(a, a->w, e), (double)aw_get(a, a->rw, e));
      bad++;
    }
  if (a->flags & AW_MIRROR)
    for (e = 0; e < a->n; e++)
      if (a->mir[e] != a->rmir[e]) {
        if (!mbad) printf("  rank %d %s: AdamW %s mirror element %zu: got 0x%04x, one device 0x%04x\n", W.rank, when, a->name, e, a->mir[e], a->rmir[e]);
        mbad++;
      }
  return bad + mbad;
}
/* Snapshots of the param and mirror bytes, to see that nothing moved. */
typedef struct aw_snap { void *w; uint16_t *mir; size_t bytes, n; } aw_snap;
static aw_snap aw_take(const awx *a) {
  aw_snap s;
  s.bytes = aw_bytes(a);
  s.n = a->n;
  s.w = malloc(s.bytes);
  s.mir = (uint16_t *)malloc(a->n * sizeof(uint16_t));
  memcpy(s.w, a->w, s.bytes);
  memcpy(s.mir, a->mir, a->n * sizeof(uint16_t));
  return s;
}
static int aw_same(const awx *a, const aw_snap *s) {
  return memcmp(a->w, s->w, s->bytes) == 0 && memcmp(a->mir, s->mir, s->n * sizeof(uint16_t)) == 0;
}
static void aw_put(awx *a, const aw_snap *s) { memcpy(a->w, s->w, s->bytes); memcpy(a->mir, s->mir, s->n * sizeof(uint16_t)); }
static void aw_drop(aw_snap *s) { free(s->w); free(s->mir); }

/* This rank's AdamW state bytes: a Partial param's chunk's two moments, a whole one's. */
static size_t aw_state_bytes(const awx *a) {
  size_t lo = 0, hi = a->n;
  if ((a->flags & AW_PARTIAL) && a->nparts > 1) aw_chunk(a->n, a->nparts, a->part, &lo, &hi);
  return 2 * (hi - lo) * sizeof(float);
}

static muon_optimizer *make_single_scaled(float scale) {
  muon_optimizer *o = make_single();
  if (o && muon_set_grad_scale(o, scale) != MUON_OK) { muon_destroy(o); return NULL; }
  return o;
}

/* Steps opt (its status) and every distinct reference of the params. */
static muon_status aw_step(muon_optimizer *opt, muon_optimizer *const *refs, int nrefs) {
  muon_status st = muon_step(opt);
  int i;
  for (i = 0; i < nrefs; i++)
    if (refs[i]) CHECK(muon_step(refs[i]) == MUON_OK, "reference step: %s", muon_error(refs[i]));
  return st;
}

/* 6a. SUM over the world, fp32, 29 elements. */
/* A Partial *matrix* with replicas of its parts: [PARTIAL(2), REPLICATE(2)] at P = 4, so in rank
   order the holders of the one piece have parts 0, 1, 0, 1 (interleaved): the planner must pair
   each part once, however the parts interleave. Bitwise a single device given g0 + g1. */
static void test_matrix_replica(void) {
  enum { R = 12, C = 10, STEPS_ = 3 };
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt, *ref;
  muon_layout l;
  muon_matrix m = muon_default_matrix(), r = muon_default_matrix();
  float w[R * C], g[R * C], rw[R * C], rg[R * C];
  int t, e, part = W.rank % 2, bad = 0;
  if (W.size != 4) return;
  TEST_CASE("Partial matrix [PARTIAL(2), REPLICATE(2)] at P=4 (parts interleaved in rank order): bitwise one device");
  memset(&l, 0, sizeof l);
  l.n_levels = 2;
  l.levels[0] = muon_partial(NULL, MUON_REDUCE_SUM);
  l.levels[0].size = 2; l.levels[0].index = part;
  l.levels[1] = muon_replicate(NULL);
  l.levels[1].size = 2; l.levels[1].index = W.rank / 2;
  opt = make_dist(MUON_NONFINITE_ERROR, &cfg);
  ref = make_single();
  CHECK(opt && ref, "create: %s", muon_error(NULL));
  if (!opt || !ref) { muon_destroy(opt); muon_destroy(ref); return; }
  for (e = 0; e < R * C; e++) w[e] = rw[e] = 0.2f * ex_value(ex_hash("replica_w", 1u), e);
  m.name = r.name = "replica_w";
  m.rows = r.rows = R;
  m.cols = r.cols = C;
  m.param = w; m.grad = g; m.layout = &l;
  r.param = rw; r.grad = rg;
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_OK, "add: %s", muon_error(opt));
  CHECK(muon_add_matrix(ref, &r, NULL) == MUON_OK, "ref add: %s", muon_error(ref));
  for (t = 0; t < STEPS_; t++) {
    muon_status st;
    for (e = 0; e < R * C; e++) {
      float g0 = ex_value(ex_hash("replica_g0", (unsigned)t), e), g1 = ex_value(ex_hash("replica_g1", (unsigned)t), e);
      g[e] = part ? g1 : g0;
      rg[e] = g0 + g1;
    }
    st = muon_step(opt);
    CHECK(st == MUON_OK, "rank %d step %d: %s", W.rank, t, muon_error(opt));
    CHECK(muon_step(ref) == MUON_OK, "ref step: %s", muon_error(ref));
    if (st != MUON_OK) break;
  }
  for (e = 0; e < R * C; e++) bad += memcmp(&w[e], &rw[e], sizeof w[e]) != 0;
  CHECK(bad == 0, "rank %d: %d elements differ from one device", W.rank, bad);
  muon_destroy(opt);
  muon_destroy(ref);
}

static void test_aw_sum(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt = make_dist(MUON_NONFINITE_ERROR, &cfg), *ref = make_single_scaled(0.75f);
  awx a;
  aw_snap s0;
  muon_stats s;
  int t, k, bad = 0, moved = 1;
  char when[32];
  TEST_CASE("Partial AdamW SUM over the world, fp32, 29 elements (uneven chunks), grad scale 0.75: 5 steps bitwise one device's on every rank");
  CHECK(opt && ref, "create: %s", muon_error(NULL));
  if (!opt || !ref) { muon_destroy(opt); muon_destroy(ref); return; }
  CHECK(muon_set_grad_scale(opt, 0.75f) == MUON_OK, "grad scale");
  aw_world(&a, "aw_sum29", 29, AW_PARTIAL);
  CHECK(aw_add(&a, opt, ref) == MUON_OK, "add: %s", muon_error(opt));
  CHECK(muon_plan(opt) == MUON_OK, "plan: %s", muon_error(opt));
  s0 = aw_take(&a);
  for (t = 0; t < 5; t++) {
    muon_status st;
    aw_grads(&a, t);
    st = aw_step(opt, &ref, 1);
    CHECK(st == MUON_OK, "rank %d step %d: %s", W.rank, t, muon_error(opt));
    snprintf(when, sizeof when, "step %d", t);
    bad += aw_check(&a, when);
    if (t == 0) moved = !aw_same(&a, &s0);
  }
  CHECK(moved, "rank %d: the param did not move in step 0", W.rank);
  CHECK(bad == 0, "rank %d: %d mismatches against one device", W.rank, bad);
  CHECK(sum_all(bad) == 0, "some rank differs from one device");
  muon_get_stats(opt, &s);
  CHECK(s.steps == 5, "rank %d: stats.steps %lld", W.rank, s.steps);

  TEST_CASE("Partial AdamW memory: state_bytes = 2 moments of this rank's torch.chunk (ceil(29/P)), 29 x 2 floats over all ranks");
  for (k = 0; k < 2; k++) {   /* now, and in a fresh optimizer before planning */
    muon_optimizer *o2 = k ? make_dist(MUON_NONFINITE_ERROR, &cfg) : opt;
    awx b;
    size_t lo, hi;
    if (k) { aw_world(&b, "aw_sum29", 29, AW_PARTIAL); CHECK(o2 && aw_add(&b, o2, NULL) == MUON_OK, "add: %s", muon_error(o2)); }
    aw_chunk(29, W.size, W.rank, &lo, &hi);
    muon_get_stats(o2, &s);
    CHECK(s.state_bytes == 2 * (hi - lo) * sizeof(float), "rank %d (%s): state_bytes %zu, want %zu (chunk [%zu, %zu))", W.rank,
          k ? "before planning" : "after 5 steps", s.state_bytes, 2 * (hi - lo) * sizeof(float), lo, hi);
    CHECK(sum_all((long long)s.state_bytes) == (long long)(2 * 29 * sizeof(float)), "state_bytes over all ranks %lld, want %zu",
          sum_all((long long)s.state_bytes), 2 * 29 * sizeof(float));
    if (k) { muon_destroy(o2); aw_free(&b); }
  }
  aw_drop(&s0);
  aw_free(&a);
  muon_destroy(opt);
  muon_destroy(ref);
}

/* 6b. MEAN, bf16 param + bf16 gradient + bf16 mirror; sizes 7 and 3 (at P = 4: chunks 2,2,2,1
   and 1,1,1,0: one rank's chunk empty), and an fp32 param with a bf16 gradient and mirror. */
static void test_aw_mean_bf16(void) {
  muon_dist_config cfg = muon_layout_config();
  /* grad scale 0.9: at P = 3, 0.9f * (1.0f / 3) and 0.9f / 3 differ in the last bit */
  muon_optimizer *opt = make_dist(MUON_NONFINITE_ERROR, &cfg), *ref = make_single_scaled(0.9f * (1.0f / (float)W.size));
  awx a[3];
  int t, i, bad = 0;
  size_t want = 0;
  muon_stats s;
  char when[32];
  TEST_CASE("Partial AdamW MEAN (grad scale 0.9), bf16 param + bf16 parts + bf16 mirror, 7 and 3 elements (P=4: one empty chunk), and fp32 + bf16 parts: 5 steps bitwise");
  CHECK(opt && ref, "create: %s", muon_error(NULL));
  if (!opt || !ref) { muon_destroy(opt); muon_destroy(ref); return; }
  CHECK(muon_set_grad_scale(opt, 0.9f) == MUON_OK, "grad scale");
  aw_world(&a[0], "aw_mean7", 7, AW_PARTIAL | AW_MEAN | AW_BF16 | AW_GBF16 | AW_MIRROR);
  aw_world(&a[1], "aw_mean3", 3, AW_PARTIAL | AW_MEAN | AW_BF16 | AW_GBF16 | AW_MIRROR);
  aw_world(&a[2], "aw_mean11f", 11, AW_PARTIAL | AW_MEAN | AW_GBF16 | AW_MIRROR);
  for (i = 0; i < 3; i++) { CHECK(aw_add(&a[i], opt, ref) == MUON_OK, "add %s: %s", a[i].name, muon_error(opt)); want += aw_state_bytes(&a[i]); }
  for (t = 0; t < 5; t++) {
    muon_status st;
    for (i = 0; i < 3; i++) aw_grads(&a[i], t);
    st = aw_step(opt, &ref, 1);
    CHECK(st == MUON_OK, "rank %d step %d: %s", W.rank, t, muon_error(opt));
    snprintf(when, sizeof when, "step %d", t);
    for (i = 0; i < 3; i++) bad += aw_check(&a[i], when);
  }
  CHECK(bad == 0, "rank %d: %d mismatches against one device", W.rank, bad);
  CHECK(sum_all(bad) == 0, "some rank differs from one device");
  muon_get_stats(opt, &s);
  CHECK(s.state_bytes == want, "rank %d: state_bytes %zu, want %zu", W.rank, s.state_bytes, want);
  if (W.size == 4) {   /* chunks 2,2,2,1 + 1,1,1,0 + 3,3,3,2 floats, two moments each */
    static const size_t p4[4] = { 48, 48, 48, 24 };
    CHECK(s.state_bytes == p4[W.rank], "rank %d of 4: state_bytes %zu, want %zu", W.rank, s.state_bytes, p4[W.rank]);
  }
  CHECK(sum_all((long long)s.state_bytes) == (long long)(2 * (7 + 3 + 11) * sizeof(float)), "state_bytes over all ranks %lld", sum_all((long long)s.state_bytes));
  for (i = 0; i < 3; i++) aw_free(&a[i]);
  muon_destroy(opt);
  muon_destroy(ref);
}

/* 6c. In one optimizer with Partial / FSDP matrices: Partial SUM and MEAN AdamW params, a plain
   one (no layout) and one REPLICATE over the world (not Partial either). */
static const spec mix_specs[] = {
  { "mix_sum", 24, 40, K_SUM },
  { "mix_mean", 18, 30, K_MEAN },
  { "mix_bf16", 16, 24, K_BF16 },
  { "mix_fsdp", 20, 16, K_FSDP },
};
#define N_MIX ((int)(sizeof mix_specs / sizeof mix_specs[0]))

static void test_aw_mixed(void) {
  model M;
  awx a[4];
  muon_layout rep;
  int t, i, bad = 0;
  size_t want = 0;
  muon_stats s;
  char when[32];
  TEST_CASE("Partial AdamW params in one optimizer with Partial / FSDP matrices and non-Partial AdamW params: 5 steps, everything bitwise one device's");
  if (!model_open(&M, mix_specs, N_MIX, 0.75f, MUON_NONFINITE_ERROR, 1)) { model_close(&M); return; }
  memset(&rep, 0, sizeof rep);
  rep.n_levels = 1;
  rep.levels[0] = muon_replicate(&W.world);
  aw_world(&a[0], "mix_aw_sum", 37, AW_PARTIAL);
  aw_world(&a[1], "mix_aw_mean", 13, AW_PARTIAL | AW_MEAN | AW_BF16 | AW_MIRROR);
  aw_world(&a[2], "mix_aw_plain", 17, 0);
  aw_init(&a[3], "mix_aw_rep", 9, AW_MIRROR, &rep, 1, 0, 0);
  for (i = 0; i < 4; i++) CHECK(aw_add(&a[i], M.opt, i == 1 ? M.refm : M.ref) == MUON_OK, "add %s: %s", a[i].name, muon_error(M.opt));
  for (t = 0; t < 5; t++) {
    muon_status st;
    model_grads(&M, t);
    for (i = 0; i < 4; i++) aw_grads(&a[i], t);
    st = model_step(&M);
    CHECK(st == MUON_OK, "rank %d step %d: %s", W.rank, t, muon_error(M.opt));
    snprintf(when, sizeof when, "step %d", t);
    bad += model_check(&M, when);
    for (i = 0; i < 4; i++) bad += aw_check(&a[i], when);
  }
  CHECK(bad == 0, "rank %d: %d mismatches against one device", W.rank, bad);
  CHECK(sum_all(bad) == 0, "some rank differs from one device");
  for (i = 0; i < M.n; i++) {   /* the matrices' momentum, as test_memory counts it */
    int owner = -1;
    muon_get_owner(M.opt, M.m[i].li, &owner);
    if (!is_partial(&M.m[i].s)) want += M.m[i].n * sizeof(float);
    else if (owner == W.rank) want += M.m[i].full * sizeof(float);
  }
  for (i = 0; i < 4; i++) want += aw_state_bytes(&a[i]);
  muon_get_stats(M.opt, &s);
  CHECK(s.state_bytes == want, "rank %d: state_bytes %zu, want %zu (Partial AdamW: its chunk only)", W.rank, s.state_bytes, want);
  for (i = 0; i < 4; i++) aw_free(&a[i]);
  model_close(&M);
}

/* 6d. P = 4: [PARTIAL over {0,1} / {2,3} (index rank % 2), REPLICATE (index rank / 2)]: two
   independent sets with parts of their own; and two PARTIAL levels, the first most significant. */
static void test_aw_replica(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt, *refs, *refm;
  muon_layout l2, lp2;
  awx a[3];
  long long hs[64], h = 1469598103934665603LL;
  int t, i, bad = 0, set = W.rank / 2;
  size_t want = 0, e;
  muon_stats s;
  char when[32];
  if (W.size != 4) {
    if (W.rank == 0) printf("  (Partial AdamW replica sets and two PARTIAL levels: P = 4 only, skipped at P = %d)\n", W.size);
    return;
  }
  TEST_CASE("Partial AdamW [PARTIAL(2), REPLICATE(2)] at P=4: each replica set sums its own parts (different per set), bitwise its own reference");
  memset(&l2, 0, sizeof l2);
  l2.n_levels = 2;
  l2.levels[0] = muon_partial(NULL, MUON_REDUCE_SUM);
  l2.levels[0].size = 2; l2.levels[0].index = W.rank % 2;
  l2.levels[1] = muon_replicate(NULL);
  l2.levels[1].size = 2; l2.levels[1].index = W.rank / 2;
  /* part = (rank % 2) * 2 + rank / 2: ranks 0, 2, 1, 3 hold parts 0, 1, 2, 3 (summing in rank
     order would round differently) */
  memset(&lp2, 0, sizeof lp2);
  lp2.n_levels = 2;
  lp2.levels[0] = muon_partial(NULL, MUON_REDUCE_SUM);
  lp2.levels[0].size = 2; lp2.levels[0].index = W.rank % 2;
  lp2.levels[1] = muon_partial(NULL, MUON_REDUCE_MEAN);
  lp2.levels[1].size = 2; lp2.levels[1].index = W.rank / 2;
  opt = make_dist(MUON_NONFINITE_ERROR, &cfg);
  refs = make_single_scaled(0.75f);
  refm = make_single_scaled(0.75f * (1.0f / 2.0f));
  CHECK(opt && refs && refm, "create: %s", muon_error(NULL));
  if (!opt || !refs || !refm) { muon_destroy(opt); muon_destroy(refs); muon_destroy(refm); return; }
  CHECK(muon_set_grad_scale(opt, 0.75f) == MUON_OK, "grad scale");
  l2.levels[0].reduce = MUON_REDUCE_SUM;
  aw_init(&a[0], "rep_sum29", 29, AW_PARTIAL, &l2, 2, W.rank % 2, set);
  l2.levels[0].reduce = MUON_REDUCE_MEAN;
  aw_init(&a[1], "rep_mean7", 7, AW_PARTIAL | AW_MEAN | AW_BF16 | AW_GBF16 | AW_MIRROR, &l2, 2, W.rank % 2, set);
  aw_init(&a[2], "two_levels", 23, AW_PARTIAL | AW_MEAN, &lp2, 4, (W.rank % 2) * 2 + W.rank / 2, 0);
  CHECK(aw_add(&a[0], opt, refs) == MUON_OK, "add: %s", muon_error(opt));
  CHECK(aw_add(&a[1], opt, refm) == MUON_OK, "add: %s", muon_error(opt));
  CHECK(aw_add(&a[2], opt, refm) == MUON_OK, "add: %s", muon_error(opt));
  for (t = 0; t < 5; t++) {
    muon_optimizer *both[2];
    muon_status st;
    both[0] = refs; both[1] = refm;
    for (i = 0; i < 3; i++) aw_grads(&a[i], t);
    st = aw_step(opt, both, 2);
    CHECK(st == MUON_OK, "rank %d step %d: %s", W.rank, t, muon_error(opt));
    snprintf(when, sizeof when, "step %d", t);
    for (i = 0; i < 3; i++) bad += aw_check(&a[i], when);
  }
  CHECK(bad == 0, "rank %d: %d mismatches against its set's one device", W.rank, bad);
  CHECK(sum_all(bad) == 0, "some rank differs from its set's one device");
  for (e = 0; e < aw_bytes(&a[0]); e++) h = (h ^ ((const unsigned char *)a[0].w)[e]) * 1099511628211LL;
  W.world.vt->allgather(W.world.ctx, &h, hs, sizeof h);
  CHECK(hs[0] == hs[1] && hs[2] == hs[3], "the ranks of a replica set hold different params");
  CHECK(hs[0] != hs[2], "the two replica sets hold the same params although their parts differ");
  for (i = 0; i < 3; i++) want += aw_state_bytes(&a[i]);   /* 15/14 + 4/3 + 6,6,6,5 floats x 2 */
  muon_get_stats(opt, &s);
  CHECK(s.state_bytes == want, "rank %d: state_bytes %zu, want %zu", W.rank, s.state_bytes, want);
  for (i = 0; i < 3; i++) aw_free(&a[i]);
  muon_destroy(opt); muon_destroy(refs); muon_destroy(refm);
}

/* 6e. muon_auto_config with `partial`: a whole AdamW param (offset and full_size 0) gets PARTIAL
   over ddp plus REPLICATE over fsdp, a ZeRO piece gets no layout. */
static void test_aw_auto(void) {
  muon_auto_desc ad;
  muon_dist_config cfg;
  muon_optimizer *opt, *ref;
  muon_comm ddp, fsdp;
  awx a[2];
  int mesh = W.size == 4, t, i, bad = 0;
  size_t want;
  muon_stats s;
  char when[32];
  TEST_CASE(mesh ? "muon_auto_config, partial = 1, 2 x 2 mesh ddp x fsdp: a whole AdamW param is Partial over ddp, its fsdp replicas independent; a ZeRO piece is not Partial"
                 : "muon_auto_config, partial = 1, ddp = the world: a whole AdamW param is Partial over ddp; a ZeRO piece (offset / full_size) is not");
  memset(&ad, 0, sizeof ad);
  ad.partial = 1;
  ad.reduce = MUON_REDUCE_SUM;
  ad.tp_dim = -1;
  if (mesh) {
    static const int dims[2] = { 2, 2 };
    ddp = ex_mesh(&W, dims, 2, 0);
    fsdp = ex_mesh(&W, dims, 2, 1);
    ad.ddp = &ddp;
    ad.fsdp = &fsdp;
  } else {
    ad.ddp = &W.world;
  }
  cfg = muon_auto_config(&ad);
  opt = make_dist(MUON_NONFINITE_ERROR, &cfg);
  ref = make_single_scaled(0.75f);
  if (!opt || !ref) { CHECK(0, "create: %s", muon_error(NULL)); muon_destroy(opt); muon_destroy(ref); goto out; }
  CHECK(muon_set_grad_scale(opt, 0.75f) == MUON_OK, "scale");
  /* whole: summed over ddp (part = the ddp index), each fsdp replica with parts of its own */
  aw_init(&a[0], "auto_whole", 29, AW_PARTIAL, NULL, ad.ddp->size, ad.ddp->rank, mesh ? fsdp.rank : 0);
  /* a ZeRO piece of 5 of a 5 x P param: a whole gradient of its own, AdamW on the piece */
  aw_init(&a[1], "auto_piece", 5, 0, NULL, 1, 0, W.rank);
  a[1].offset = 5 * (size_t)W.rank;
  a[1].full_size = 5 * (size_t)W.size;
  for (i = 0; i < 2; i++) CHECK(aw_add(&a[i], opt, ref) == MUON_OK, "add %s: %s", a[i].name, muon_error(opt));
  for (t = 0; t < 5; t++) {
    muon_status st;
    for (i = 0; i < 2; i++) aw_grads(&a[i], t);
    st = aw_step(opt, &ref, 1);
    CHECK(st == MUON_OK, "rank %d step %d: %s", W.rank, t, muon_error(opt));
    snprintf(when, sizeof when, "step %d", t);
    for (i = 0; i < 2; i++) bad += aw_check(&a[i], when);
  }
  CHECK(bad == 0, "rank %d: %d mismatches against one device", W.rank, bad);
  CHECK(sum_all(bad) == 0, "some rank differs from one device");
  want = aw_state_bytes(&a[0]) + 2 * 5 * sizeof(float);
  muon_get_stats(opt, &s);
  CHECK(s.state_bytes == want, "rank %d: state_bytes %zu, want %zu (the whole param's chunk + the piece)", W.rank, s.state_bytes, want);
  for (i = 0; i < 2; i++) aw_free(&a[i]);
  muon_destroy(opt);
  muon_destroy(ref);
out:
  if (mesh) { muon_comm_destroy(&ddp); muon_comm_destroy(&fsdp); }
}

/* 6f. Skips and non-finite gradients: one rank's gradient absent skips the param everywhere; a
   NaN in one rank's part is MUON_ERR_NONFINITE everywhere (ERROR) or skips it everywhere (SKIP);
   finite parts overflowing to Inf are MUON_ERR_NONFINITE everywhere in either mode. After each,
   the next step must still be the single device's: the state did not move either. */
static void test_aw_skip_nonfinite(void) {
  muon_dist_config cfg = muon_layout_config();
  int mode, P = W.size, t, i;
  for (mode = 0; mode < 2; mode++) {
    muon_nonfinite nf = mode ? MUON_NONFINITE_SKIP : MUON_NONFINITE_ERROR;
    muon_optimizer *opt = make_dist(nf, &cfg), *ref = make_single_scaled(1.0f), *refm = make_single_scaled(1.0f / (float)P), *both[2];
    awx a[3];
    aw_snap snap[3];
    muon_stats s;
    muon_status st;
    int bad = 0, same, changed;
    long long steps0;
    char when[48];
    both[0] = ref; both[1] = refm;
    if (!opt || !ref || !refm) { CHECK(0, "create: %s", muon_error(NULL)); muon_destroy(opt); muon_destroy(ref); muon_destroy(refm); return; }
    aw_world(&a[0], "nf_aw_a", 29, AW_PARTIAL);
    aw_world(&a[1], "nf_aw_b", 7, AW_PARTIAL | AW_MEAN | AW_BF16 | AW_GBF16 | AW_MIRROR);
    aw_world(&a[2], "nf_aw_c", 10, 0);
    for (i = 0; i < 3; i++) CHECK(aw_add(&a[i], opt, i == 1 ? refm : ref) == MUON_OK, "add %s: %s", a[i].name, muon_error(opt));

    TEST_CASE(mode ? "Partial AdamW (SKIP mode): rank P-1's gradient NULL skips the param on every rank, the others step; the next steps stay bitwise"
                   : "Partial AdamW: rank P-1's gradient NULL skips the param on every rank, the others step; the next steps stay bitwise");
    for (t = 0; t < 3; t++) {
      aw_grads(&a[0], t); aw_grads(&a[1], t); aw_grads(&a[2], t);
      if (t == 1) {   /* rank P-1 has no gradient for a; the reference skips it too */
        if (W.rank == P - 1) CHECK(muon_set_adamw_grad(opt, a[0].li, NULL) == MUON_OK, "set grad NULL");
        CHECK(muon_set_adamw_grad(ref, a[0].ri, NULL) == MUON_OK, "ref set grad NULL");
        for (i = 0; i < 3; i++) snap[i] = aw_take(&a[i]);
      }
      st = aw_step(opt, both, 2);
      CHECK(st == MUON_OK, "rank %d step %d: %s", W.rank, t, muon_error(opt));
      CHECK(same_all(st), "step %d: statuses differ between ranks", t);
      if (t == 1) {
        CHECK(aw_same(&a[0], &snap[0]), "rank %d: the skipped param changed", W.rank);
        CHECK(sum_all(!aw_same(&a[0], &snap[0])) == 0, "the skipped param changed on some rank");
        CHECK(!aw_same(&a[1], &snap[1]) && !aw_same(&a[2], &snap[2]), "rank %d: the other params did not step", W.rank);
        for (i = 0; i < 3; i++) aw_drop(&snap[i]);
        if (W.rank == P - 1) muon_set_adamw_grad(opt, a[0].li, a[0].g);
        muon_set_adamw_grad(ref, a[0].ri, a[0].rg);
      }
      snprintf(when, sizeof when, "skip test step %d", t);
      for (i = 0; i < 3; i++) bad += aw_check(&a[i], when);
    }
    CHECK(bad == 0, "rank %d: %d mismatches against one device", W.rank, bad);
    CHECK(sum_all(bad) == 0, "some rank differs from one device");

    TEST_CASE(mode ? "Partial AdamW, MUON_NONFINITE_SKIP: a NaN in rank P-1's part skips that param on every rank, the others step; then bitwise on"
                   : "Partial AdamW: a NaN in rank P-1's part (fp32, then bf16) is MUON_ERR_NONFINITE on every rank, nothing applied; then bitwise on");
    bad = 0;
    for (i = 0; i < 2; i++) {   /* the fp32 param's part, then the bf16 one's */
      int k;
      muon_get_stats(opt, &s);
      steps0 = s.steps;
      for (k = 0; k < 3; k++) { aw_grads(&a[k], t); snap[k] = aw_take(&a[k]); }
      if (W.rank == P - 1) {
        if (i == 0) a[0].g[3] = NAN;
        else a[1].gb[6] = 0x7fc0u;
      }
      st = muon_step(opt);
      CHECK(same_all(st), "step statuses differ between ranks");
      if (mode == 0) {
        CHECK(st == MUON_ERR_NONFINITE, "rank %d: step returned %s: %s", W.rank, muon_status_string(st), muon_error(opt));
        for (k = 0, changed = 0; k < 3; k++) changed += !aw_same(&a[k], &snap[k]);
        CHECK(changed == 0, "rank %d: %d params changed", W.rank, changed);
        CHECK(sum_all(changed) == 0, "a param changed on some rank");
        muon_get_stats(opt, &s);
        CHECK(s.steps == steps0, "rank %d: stats.steps %lld after a failed step, was %lld", W.rank, s.steps, steps0);
        /* the same step again without the NaN: the single device's step */
        if (W.rank == P - 1) aw_grads(&a[i], t);
        st = aw_step(opt, both, 2);
        CHECK(st == MUON_OK, "rank %d: the step after the NaN: %s", W.rank, muon_error(opt));
      } else {
        muon_optimizer *r = i ? refm : ref;
        CHECK(st == MUON_OK, "rank %d: step returned %s: %s", W.rank, muon_status_string(st), muon_error(opt));
        same = aw_same(&a[i], &snap[i]);
        CHECK(same, "rank %d: the param with the NaN part changed", W.rank);
        CHECK(sum_all(!same) == 0, "the param with the NaN part changed on some rank");
        CHECK(!aw_same(&a[1 - i], &snap[1 - i]) && !aw_same(&a[2], &snap[2]), "rank %d: the other params did not step", W.rank);
        muon_set_adamw_grad(r, a[i].ri, NULL);   /* the reference: that param skipped, the others stepped */
        CHECK(muon_step(ref) == MUON_OK && muon_step(refm) == MUON_OK, "reference step");
        muon_set_adamw_grad(r, a[i].ri, a[i].rg);
      }
      for (k = 0; k < 3; k++) aw_drop(&snap[k]);
      snprintf(when, sizeof when, "after the NaN (%s part)", i ? "bf16" : "fp32");
      for (k = 0; k < 3; k++) bad += aw_check(&a[k], when);
      t++;
    }
    CHECK(bad == 0, "rank %d: %d mismatches against one device", W.rank, bad);
    CHECK(sum_all(bad) == 0, "some rank differs from one device");

    if (P >= 2) {
      int k;
      TEST_CASE(mode ? "Partial AdamW, MUON_NONFINITE_SKIP: finite parts (3e38 each) summing to Inf: MUON_ERR_NONFINITE on every rank all the same, nothing applied"
                     : "Partial AdamW: finite parts (3e38 each) summing to Inf: MUON_ERR_NONFINITE on every rank, nothing applied; then bitwise on");
      bad = 0;
      muon_get_stats(opt, &s);
      steps0 = s.steps;
      for (k = 0; k < 3; k++) { aw_grads(&a[k], t); snap[k] = aw_take(&a[k]); }
      a[0].g[7] = 3e38f;
      st = muon_step(opt);
      CHECK(same_all(st), "step statuses differ between ranks");
      CHECK(st == MUON_ERR_NONFINITE, "rank %d: step returned %s: %s", W.rank, muon_status_string(st), muon_error(opt));
      if (W.rank == 0 && mode == 0) printf("  (overflowing AdamW parts: %s)\n", muon_error(opt));
      for (k = 0, changed = 0; k < 3; k++) changed += !aw_same(&a[k], &snap[k]);
      CHECK(changed == 0, "rank %d: %d params changed", W.rank, changed);
      CHECK(sum_all(changed) == 0, "a param changed on some rank");
      muon_get_stats(opt, &s);
      CHECK(s.steps == steps0, "rank %d: stats.steps %lld after a failed step, was %lld", W.rank, s.steps, steps0);
      aw_grads(&a[0], t);
      st = aw_step(opt, both, 2);
      CHECK(st == MUON_OK, "rank %d: the step after the overflow: %s", W.rank, muon_error(opt));
      for (k = 0; k < 3; k++) { bad += aw_check(&a[k], "after the overflow"); aw_drop(&snap[k]); }
      CHECK(bad == 0, "rank %d: %d mismatches against one device", W.rank, bad);
      CHECK(sum_all(bad) == 0, "some rank differs from one device");
    } else if (W.rank == 0 && mode == 0) {
      printf("  (Partial AdamW overflowing parts: needs P >= 2, skipped at P = 1)\n");
    }

    {   /* a finite sum of 1e30 whose square overflows v in one rank's chunk only */
      int k;
      TEST_CASE(mode ? "Partial AdamW, SKIP: a summed gradient of 1e30 (v would be +Inf in one chunk) skips that param "
                       "on every rank, the others step; then bitwise on"
                     : "Partial AdamW: a summed gradient of 1e30 (v would be +Inf in one chunk) is MUON_ERR_NONFINITE "
                       "on every rank, nothing applied; then bitwise on");
      bad = 0;
      muon_get_stats(opt, &s);
      steps0 = s.steps;
      for (k = 0; k < 3; k++) { aw_grads(&a[k], t); snap[k] = aw_take(&a[k]); }
      if (W.rank == 0) a[0].g[7] = 1e30f;
      st = muon_step(opt);
      CHECK(same_all(st), "step statuses differ between ranks");
      if (mode == 0) {
        CHECK(st == MUON_ERR_NONFINITE && strstr(muon_error(opt), "nf_aw_a"), "rank %d: step returned %s: %s",
              W.rank, muon_status_string(st), muon_error(opt));
        for (k = 0, changed = 0; k < 3; k++) changed += !aw_same(&a[k], &snap[k]);
        CHECK(sum_all(changed) == 0, "a param changed on some rank");
        muon_get_stats(opt, &s);
        CHECK(s.steps == steps0, "rank %d: stats.steps %lld after a failed step, was %lld", W.rank, s.steps, steps0);
        aw_grads(&a[0], t);
        st = aw_step(opt, both, 2);
        CHECK(st == MUON_OK, "rank %d: the step after the overflow: %s", W.rank, muon_error(opt));
      } else {
        CHECK(st == MUON_OK, "rank %d: step returned %s: %s", W.rank, muon_status_string(st), muon_error(opt));
        CHECK(sum_all(!aw_same(&a[0], &snap[0])) == 0, "the overflowing param changed on some rank");
        CHECK(!aw_same(&a[1], &snap[1]) && !aw_same(&a[2], &snap[2]), "rank %d: the other params did not step",
              W.rank);
        muon_set_adamw_grad(ref, a[0].ri, NULL);
        CHECK(muon_step(ref) == MUON_OK && muon_step(refm) == MUON_OK, "reference step");
        muon_set_adamw_grad(ref, a[0].ri, a[0].rg);
      }
      for (k = 0; k < 3; k++) { bad += aw_check(&a[k], "after the overflowing sum"); aw_drop(&snap[k]); }
      CHECK(sum_all(bad) == 0, "some rank differs from one device");
      t++;
    }
    for (i = 0; i < 3; i++) aw_free(&a[i]);
    muon_destroy(opt); muon_destroy(ref); muon_destroy(refm);
  }
}

/* 6g. Errors. */
static muon_status aw_add_layout(muon_optimizer *opt, awx *a, const muon_layout *l) {
  a->layout = *l;
  return aw_add(a, opt, NULL);
}

/* Ranks describe one param differently: muon_plan, then muon_step, fail alike on every rank with
   nothing applied. Returns the plan status. */
static muon_status aw_disagree(const char *name, const muon_layout *mine, int flags) {
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt = make_dist(MUON_NONFINITE_ERROR, &cfg);
  awx a;
  aw_snap s0;
  muon_status st, st2;
  if (!opt) { CHECK(0, "create"); return MUON_ERR_ARG; }
  aw_init(&a, name, 29, flags, mine, W.size, W.rank, 0);
  CHECK(aw_add(&a, opt, NULL) == MUON_OK, "rank %d: add: %s", W.rank, muon_error(opt));
  s0 = aw_take(&a);
  st = muon_plan(opt);
  CHECK(st != MUON_OK, "rank %d: plan succeeded", W.rank);
  CHECK(same_all(st), "rank %d: plan returned %s; the ranks' statuses differ", W.rank, muon_status_string(st));
  aw_grads(&a, 0);
  st2 = muon_step(opt);
  CHECK(st2 != MUON_OK && same_all(st2), "rank %d: step after a failed plan returned %s (must fail alike everywhere)", W.rank, muon_status_string(st2));
  CHECK(sum_all(!aw_same(&a, &s0)) == 0, "a param changed somewhere");
  if (st != MUON_OK && W.rank <= 1) printf("  (rank %d: %s)\n", W.rank, muon_error(opt));
  aw_drop(&s0);
  aw_free(&a);
  muon_destroy(opt);
  return st;
}

static void test_aw_errors(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt;
  muon_layout l, none;
  awx a;
  muon_status st;
  int P = W.size, k;
  memset(&none, 0, sizeof none);

  TEST_CASE("Partial AdamW error: a SHARD or FLAT level (alone or after a PARTIAL one) is MUON_ERR_ARG at muon_add_adamw_param");
  for (k = 0; k < 4; k++) {
    opt = make_dist(MUON_NONFINITE_ERROR, &cfg);
    memset(&l, 0, sizeof l);
    if (k < 2) { l.n_levels = 1; l.levels[0] = k ? muon_flat(&W.world) : muon_shard(0, &W.world); }
    else { l.n_levels = 2; l.levels[0] = muon_partial(&W.world, MUON_REDUCE_SUM); l.levels[1] = k == 3 ? muon_flat(NULL) : muon_shard(0, NULL); }
    aw_init(&a, "err_shard", 12, AW_PARTIAL, NULL, W.size, W.rank, 0);
    st = aw_add_layout(opt, &a, &l);
    CHECK(st == MUON_ERR_ARG, "rank %d: layout %d: add returned %s: %s", W.rank, k, muon_status_string(st), muon_error(opt));
    CHECK(same_all(st), "statuses differ between ranks");
    CHECK(muon_adamw_param_count(opt) == 0, "the rejected param was registered");
    aw_free(&a);
    muon_destroy(opt);
  }

  TEST_CASE("Partial AdamW error: a layout on a single-device optimizer (desc.dist NULL) is MUON_ERR_ARG");
  opt = make_single();
  memset(&l, 0, sizeof l);
  l.n_levels = 1;
  l.levels[0] = muon_partial(NULL, MUON_REDUCE_SUM);
  aw_init(&a, "err_single", 12, AW_PARTIAL, NULL, 1, 0, 0);
  st = aw_add_layout(opt, &a, &l);
  CHECK(st == MUON_ERR_ARG, "add returned %s: %s", muon_status_string(st), muon_error(opt));
  aw_free(&a);
  muon_destroy(opt);

  if (P < 2) {
    if (W.rank == 0) printf("  (Partial AdamW: stochastic rounding, disagreeing ranks and duplicate parts need P >= 2, skipped at P = 1)\n");
    return;
  }
  TEST_CASE("Partial AdamW error: desc.rounding MUON_ROUND_STOCHASTIC is MUON_ERR_ARG at muon_add_adamw_param (a non-Partial param is fine)");
  {
    muon_desc d = base_desc();
    d.comm = &W.world;
    d.dist = &cfg;
    d.rounding = MUON_ROUND_STOCHASTIC;
    opt = NULL;
    CHECK(muon_create(&opt, &d) == MUON_OK, "create: %s", muon_error(NULL));
    if (opt) {
      aw_world(&a, "err_stoch", 12, AW_PARTIAL | AW_BF16);
      st = aw_add(&a, opt, NULL);
      CHECK(st == MUON_ERR_ARG, "rank %d: add returned %s: %s", W.rank, muon_status_string(st), muon_error(opt));
      CHECK(same_all(st), "statuses differ between ranks");
      CHECK(muon_adamw_param_count(opt) == 0, "the rejected param was registered");
      a.layout = none;
      CHECK(aw_add(&a, opt, NULL) == MUON_OK, "rank %d: the same param without a layout: %s", W.rank, muon_error(opt));
      CHECK(muon_plan(opt) == MUON_OK, "plan: %s", muon_error(opt));
      aw_free(&a);
      muon_destroy(opt);
    }
  }

  TEST_CASE("Partial AdamW error: rank 0 PARTIAL, the others no layout: plan MUON_ERR_MISMATCH on every rank, step fails alike, nothing applied");
  memset(&l, 0, sizeof l);
  l.n_levels = 1;
  l.levels[0] = muon_partial(&W.world, MUON_REDUCE_SUM);
  st = aw_disagree("dis_none", W.rank == 0 ? &l : NULL, W.rank == 0 ? AW_PARTIAL : 0);
  CHECK(st == MUON_ERR_MISMATCH, "rank %d: plan returned %s", W.rank, muon_status_string(st));

  TEST_CASE("Partial AdamW error: rank 0 PARTIAL, the others REPLICATE over the world: the same non-OK status on every rank, nothing applied");
  {
    muon_layout r;
    memset(&r, 0, sizeof r);
    r.n_levels = 1;
    r.levels[0] = muon_replicate(&W.world);
    (void)aw_disagree("dis_rep", W.rank == 0 ? &l : &r, W.rank == 0 ? AW_PARTIAL : 0);
  }

  TEST_CASE("Partial AdamW error: rank 0 MEAN, the others SUM: plan MUON_ERR_MISMATCH on every rank, nothing applied");
  {
    muon_layout m = l;
    m.levels[0].reduce = MUON_REDUCE_MEAN;
    st = aw_disagree("dis_mean", W.rank == 0 ? &m : &l, AW_PARTIAL);
    CHECK(st == MUON_ERR_MISMATCH, "rank %d: plan returned %s", W.rank, muon_status_string(st));
  }

  TEST_CASE("Partial AdamW error: ranks 0 and 1 both claim part 0 (a fake group): MUON_ERR_SHAPE on every rank, step fails alike, nothing applied");
  {
    muon_layout dup;
    memset(&dup, 0, sizeof dup);
    dup.n_levels = 1;
    dup.levels[0] = muon_partial(NULL, MUON_REDUCE_SUM);
    dup.levels[0].size = P;
    dup.levels[0].index = W.rank == 1 ? 0 : W.rank;
    st = aw_disagree("dup_part", &dup, AW_PARTIAL);
    CHECK(st == MUON_ERR_SHAPE, "rank %d: plan returned %s", W.rank, muon_status_string(st));
  }
}

/* muon_dist_config.adamw_layout that fails or hands back a broken layout: muon_add_adamw_param
   names it and registers nothing. Local (no collective), the same on every rank. */
typedef struct cb_state { int mode, calls, last_index; char last_name[32]; } cb_state;
enum { CB_FAIL, CB_ZERO_GROUP, CB_TOO_MANY_PARTS, CB_NONE };
static muon_status cb_adamw_layout(void *state, int index, const struct muon_adamw_param *p, muon_layout *out) {
  cb_state *c = (cb_state *)state;
  c->calls++;
  c->last_index = index;
  snprintf(c->last_name, sizeof c->last_name, "%s", p && p->name ? p->name : "");
  switch (c->mode) {
  case CB_FAIL: return MUON_ERR_ARG;
  case CB_ZERO_GROUP:            /* a PARTIAL level over a group of 0 ranks */
    out->n_levels = 1;
    out->levels[0] = muon_partial(NULL, MUON_REDUCE_SUM);
    out->levels[0].size = 0;
    out->levels[0].index = 0;
    return MUON_OK;
  case CB_TOO_MANY_PARTS:        /* each level fine, 65536 x 65536 parts do not fit an int */
    out->n_levels = 2;
    out->levels[0] = muon_partial(NULL, MUON_REDUCE_SUM);
    out->levels[0].size = 65536;
    out->levels[0].index = 0;
    out->levels[1] = out->levels[0];
    return MUON_OK;
  default: return MUON_OK;       /* no levels: a plain param */
  }
}

static void test_aw_layout_callback(void) {
  muon_dist_config cfg = muon_layout_config();
  cb_state cb;
  muon_optimizer *opt;
  awx a;
  muon_status st;
  int idx = -7;
  memset(&cb, 0, sizeof cb);
  cfg.adamw_layout = cb_adamw_layout;
  cfg.state = &cb;
  opt = make_dist(MUON_NONFINITE_ERROR, &cfg);
  TEST_CASE("Partial AdamW error: muon_dist_config.adamw_layout returning MUON_ERR_ARG is that status at muon_add_adamw_param, naming the callback; nothing registered");
  if (!opt) { CHECK(0, "create: %s", muon_error(NULL)); return; }
  aw_init(&a, "cb_param", 12, 0, NULL, 1, 0, 0);
  cb.mode = CB_FAIL;
  st = aw_add(&a, opt, NULL);
  CHECK(st == MUON_ERR_ARG && strstr(muon_error(opt), "muon_dist_config.adamw_layout returned MUON_ERR_ARG") && strstr(muon_error(opt), "'cb_param'"),
        "rank %d: add returned %s: %s", W.rank, muon_status_string(st), muon_error(opt));
  CHECK(cb.calls == 1 && cb.last_index == 0 && strcmp(cb.last_name, "cb_param") == 0, "callback: %d calls, index %d, name '%s'", cb.calls, cb.last_index, cb.last_name);
  CHECK(muon_adamw_param_count(opt) == 0, "the rejected param was registered (count %d)", muon_adamw_param_count(opt));
  CHECK(same_all(st), "statuses differ between ranks");

  TEST_CASE("Partial AdamW error: an adamw_layout callback's level over a group of 0 ranks is MUON_ERR_SHAPE naming the layout the callback returned; nothing registered");
  cb.mode = CB_ZERO_GROUP;
  st = aw_add(&a, opt, NULL);
  CHECK(st == MUON_ERR_SHAPE && strstr(muon_error(opt), "the layout from muon_dist_config.adamw_layout") && strstr(muon_error(opt), "levels[0]") && strstr(muon_error(opt), "group of 0"),
        "rank %d: add returned %s: %s", W.rank, muon_status_string(st), muon_error(opt));
  CHECK(muon_adamw_param_count(opt) == 0, "the rejected param was registered (count %d)", muon_adamw_param_count(opt));
  CHECK(same_all(st), "statuses differ between ranks");

  TEST_CASE("Partial AdamW error: an adamw_layout callback's 65536 x 65536 PARTIAL parts (more than INT_MAX) are MUON_ERR_SHAPE; nothing registered");
  cb.mode = CB_TOO_MANY_PARTS;
  st = aw_add(&a, opt, NULL);
  CHECK(st == MUON_ERR_SHAPE && strstr(muon_error(opt), "the layout from muon_dist_config.adamw_layout has more than 2147483647 parts") && strstr(muon_error(opt), "'cb_param'"),
        "rank %d: add returned %s: %s", W.rank, muon_status_string(st), muon_error(opt));
  CHECK(muon_adamw_param_count(opt) == 0, "the rejected param was registered (count %d)", muon_adamw_param_count(opt));
  CHECK(same_all(st), "statuses differ between ranks");
  /* the refusals left no trace: the next param, the callback giving no levels, is param 0 */
  cb.mode = CB_NONE;
  {
    muon_adamw_param p = muon_default_adamw_param();
    p.name = "cb_param";
    p.param = a.w;
    p.grad = a.g;
    p.size = a.n;
    st = muon_add_adamw_param(opt, &p, &idx);
  }
  CHECK(st == MUON_OK && idx == 0 && muon_adamw_param_count(opt) == 1 && cb.calls == 4 && cb.last_index == 0,
        "a valid param after the refusals: %s, index %d, count %d, %d calls (last index %d): %s",
        muon_status_string(st), idx, muon_adamw_param_count(opt), cb.calls, cb.last_index, muon_error(opt));
  aw_free(&a);
  muon_destroy(opt);
}

/* muon_state_load: a state whose AdamW param 0 had another name (same size) is refused, and
   nothing changes. Single device, every rank alike. */
static void test_aw_load_name(void) {
  muon_optimizer *A = make_single(), *B = make_single();
  awx a, b;
  void *blob = NULL, *b0 = NULL, *b1 = NULL;
  size_t size = 0, sb = 0;
  int t;
  muon_status st;
  TEST_CASE("AdamW state: a state whose param 0 had another name (same size) is MUON_ERR_STATE naming 'another name'; the loader's params and state unchanged");
  if (!A || !B) { CHECK(0, "create: %s", muon_error(NULL)); muon_destroy(A); muon_destroy(B); return; }
  aw_init(&a, "aw_name_saved", 12, 0, NULL, 1, 0, 0);
  aw_init(&b, "aw_name_here", 12, 0, NULL, 1, 0, 0);
  CHECK(aw_add(&a, A, NULL) == MUON_OK && aw_add(&b, B, NULL) == MUON_OK, "add: %s / %s", muon_error(A), muon_error(B));
  for (t = 0; t < 2; t++) {   /* both step (different gradients: a's and b's names differ) */
    aw_grads(&a, t);
    aw_grads(&b, t + 5);
    CHECK(muon_step(A) == MUON_OK && muon_step(B) == MUON_OK, "step %d: %s / %s", t, muon_error(A), muon_error(B));
  }
  CHECK(muon_step(B) == MUON_OK, "a third step of B: %s", muon_error(B));   /* another step count too */
  size = muon_state_size(A);
  sb = muon_state_size(B);
  blob = malloc(size);
  b0 = malloc(sb);
  b1 = malloc(sb);
  CHECK(size == sb, "same shapes, state sizes %zu and %zu", size, sb);
  CHECK(muon_state_save(A, blob, size) == MUON_OK && muon_state_save(B, b0, sb) == MUON_OK, "save: %s / %s", muon_error(A), muon_error(B));
  {
    aw_snap w = aw_take(&b);
    st = muon_state_load(B, blob, size);
    CHECK(st == MUON_ERR_STATE && strstr(muon_error(B), "AdamW param 0 is 'aw_name_here' here") && strstr(muon_error(B), "another name"),
          "load returned %s: %s", muon_status_string(st), muon_error(B));
    CHECK(aw_same(&b, &w), "the param changed");
    CHECK(muon_state_save(B, b1, sb) == MUON_OK && memcmp(b0, b1, sb) == 0, "the optimizer's state changed (moments, step count or groups)");
    aw_drop(&w);
  }
  /* the same blob into an optimizer whose param has the saved name loads */
  st = muon_state_load(A, blob, size);
  CHECK(st == MUON_OK, "load into the saver: %s: %s", muon_status_string(st), muon_error(A));
  free(blob); free(b0); free(b1);
  aw_free(&a);
  aw_free(&b);
  muon_destroy(A);
  muon_destroy(B);
}

/* 6h. State: save / load, and resharding both ways. */
static void test_aw_state(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *A = make_dist(MUON_NONFINITE_ERROR, &cfg), *B = NULL;
  awx a[3], b[3];
  aw_snap w2[3], w4[3];
  void *blob = NULL;
  size_t size;
  int t, i, bad = 0;
  static const char *const names[3] = { "st_aw_sum", "st_aw_mean", "st_aw_plain" };
  static const size_t sizes[3] = { 29, 7, 10 };
  static const int flags[3] = { AW_PARTIAL, AW_PARTIAL | AW_MEAN | AW_BF16 | AW_GBF16 | AW_MIRROR, 0 };
  TEST_CASE("Partial AdamW state: save at step 2, 2 more steps, params back to step 2 + load: the same 2 steps bitwise (same optimizer, then a fresh one)");
  if (!A) { CHECK(0, "create"); return; }
  CHECK(muon_set_grad_scale(A, 0.75f) == MUON_OK, "scale");
  for (i = 0; i < 3; i++) { aw_world(&a[i], names[i], sizes[i], flags[i]); CHECK(aw_add(&a[i], A, NULL) == MUON_OK, "add: %s", muon_error(A)); }
  for (t = 0; t < 2; t++) { for (i = 0; i < 3; i++) aw_grads(&a[i], t); CHECK(muon_step(A) == MUON_OK, "step %d: %s", t, muon_error(A)); }
  size = muon_state_size(A);
  blob = malloc(size);
  CHECK(muon_state_save(A, blob, size) == MUON_OK, "save: %s", muon_error(A));
  for (i = 0; i < 3; i++) w2[i] = aw_take(&a[i]);
  for (t = 2; t < 4; t++) { for (i = 0; i < 3; i++) aw_grads(&a[i], t); CHECK(muon_step(A) == MUON_OK, "step %d: %s", t, muon_error(A)); }
  for (i = 0; i < 3; i++) { w4[i] = aw_take(&a[i]); CHECK(!aw_same(&a[i], &w2[i]), "%s did not move in steps 2-3", a[i].name); }
  for (i = 0; i < 3; i++) aw_put(&a[i], &w2[i]);
  CHECK(muon_state_load(A, blob, size) == MUON_OK, "load: %s", muon_error(A));
  for (t = 2; t < 4; t++) { for (i = 0; i < 3; i++) aw_grads(&a[i], t); CHECK(muon_step(A) == MUON_OK, "resumed step %d: %s", t, muon_error(A)); }
  for (i = 0; i < 3; i++) bad += !aw_same(&a[i], &w4[i]);
  CHECK(bad == 0, "rank %d: %d params differ from the run that never stopped", W.rank, bad);
  CHECK(sum_all(bad) == 0, "some rank differs from the run that never stopped");
  bad = 0;
  B = make_dist(MUON_NONFINITE_ERROR, &cfg);
  if (B) {
    CHECK(muon_set_grad_scale(B, 0.75f) == MUON_OK, "scale");
    for (i = 0; i < 3; i++) { aw_world(&b[i], names[i], sizes[i], flags[i]); aw_put(&b[i], &w2[i]); CHECK(aw_add(&b[i], B, NULL) == MUON_OK, "add: %s", muon_error(B)); }
    CHECK(muon_state_load(B, blob, size) == MUON_OK, "fresh load: %s", muon_error(B));
    for (t = 2; t < 4; t++) { for (i = 0; i < 3; i++) aw_grads(&b[i], t); CHECK(muon_step(B) == MUON_OK, "fresh step %d: %s", t, muon_error(B)); }
    for (i = 0; i < 3; i++) bad += !aw_same(&b[i], &w4[i]);
    CHECK(bad == 0, "rank %d: %d params of the fresh optimizer differ from the run that never stopped", W.rank, bad);
    CHECK(sum_all(bad) == 0, "some rank's fresh optimizer differs");
    for (i = 0; i < 3; i++) aw_free(&b[i]);
    muon_destroy(B);
  }
  for (i = 0; i < 3; i++) { aw_drop(&w2[i]); aw_drop(&w4[i]); aw_free(&a[i]); }
  free(blob);
  muon_destroy(A);
}

/* A single-device optimizer (scale) holding a copy of a's reference param (whole), its gradient
   a's reference gradient. */
static muon_optimizer *aw_single_copy(const awx *a, float scale, void **w, uint16_t **mir) {
  muon_optimizer *S = make_single_scaled(scale);
  muon_adamw_param p = muon_default_adamw_param();
  *w = malloc(aw_bytes(a));
  *mir = (uint16_t *)calloc(a->n, sizeof(uint16_t));
  memcpy(*w, a->rw, aw_bytes(a));
  if (!S) return NULL;
  p.name = a->name; p.param = *w; p.size = a->n; p.grad = a->rg; p.grad_dtype = MUON_DTYPE_FP32;
  p.param_dtype = (a->flags & AW_BF16) ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
  p.mirror = (a->flags & AW_MIRROR) ? *mir : NULL;
  CHECK(muon_add_adamw_param(S, &p, NULL) == MUON_OK, "single add %s: %s", a->name, muon_error(S));
  return S;
}
/* A distributed optimizer holding a copy (at its reference's values) of Partial param a, with a's
   layout and a's part of the gradient. */
static muon_optimizer *aw_dist_copy(const awx *a, void **w, uint16_t **mir) {
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *D = make_dist(MUON_NONFINITE_ERROR, &cfg);
  muon_adamw_param p = muon_default_adamw_param();
  *w = malloc(aw_bytes(a));
  *mir = (uint16_t *)calloc(a->n, sizeof(uint16_t));
  memcpy(*w, a->rw, aw_bytes(a));
  if (!D) return NULL;
  CHECK(muon_set_grad_scale(D, 0.75f) == MUON_OK, "scale");
  p.name = a->name; p.param = *w; p.size = a->n; p.layout = &a->layout;
  p.param_dtype = (a->flags & AW_BF16) ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
  p.grad_dtype = (a->flags & AW_GBF16) ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
  p.grad = (a->flags & AW_GBF16) ? (const void *)a->gb : (const void *)a->g;
  p.mirror = (a->flags & AW_MIRROR) ? *mir : NULL;
  CHECK(muon_add_adamw_param(D, &p, NULL) == MUON_OK, "dist add %s: %s", a->name, muon_error(D));
  return D;
}
static int aw_cmp_copy(const awx *a, const void *w, const uint16_t *mir, const char *what) {
  int bad = memcmp(w, a->rw, aw_bytes(a)) != 0 || ((a->flags & AW_MIRROR) && memcmp(mir, a->rmir, a->n * sizeof(uint16_t)) != 0);
  if (bad) printf("  rank %d: %s: %s differs from the reference's continuation\n", W.rank, what, a->name);
  return bad;
}

static void test_aw_reshard(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *D = make_dist(MUON_NONFINITE_ERROR, &cfg), *R[2], *S[2] = { NULL, NULL }, *D1[2] = { NULL, NULL };
  awx a[2];
  void *sw[2] = { NULL, NULL }, *dw[2] = { NULL, NULL };
  uint16_t *smir[2] = { NULL, NULL }, *dmir[2] = { NULL, NULL };
  char (*paths)[600] = NULL, refpath[2][600];
  const char *pp[64];
  int t, i, r, bad = 0;
  muon_status st;
  R[0] = make_single_scaled(0.75f);
  R[1] = make_single_scaled(0.75f * (1.0f / (float)W.size));
  TEST_CASE("Partial AdamW reshard: the P ranks' blobs into one device holding the whole param: its next steps are the reference's, bitwise");
  if (!D || !R[0] || !R[1]) { CHECK(0, "create"); muon_destroy(D); muon_destroy(R[0]); muon_destroy(R[1]); return; }
  CHECK(muon_set_grad_scale(D, 0.75f) == MUON_OK, "scale");
  aw_world(&a[0], "rs_aw_sum", 29, AW_PARTIAL);
  aw_world(&a[1], "rs_aw_mean", 7, AW_PARTIAL | AW_MEAN | AW_BF16 | AW_GBF16 | AW_MIRROR);
  for (i = 0; i < 2; i++) CHECK(aw_add(&a[i], D, R[i]) == MUON_OK, "add: %s", muon_error(D));
  for (t = 0; t < 3; t++) {
    for (i = 0; i < 2; i++) aw_grads(&a[i], t);
    CHECK(aw_step(D, R, 2) == MUON_OK, "step %d: %s", t, muon_error(D));
    for (i = 0; i < 2; i++) bad += aw_check(&a[i], "before saving");
  }
  CHECK(bad == 0, "rank %d: the run already differs from one device", W.rank);
  if (W.rank == 0) CHECK(mkdir_p(scratch) == 0, "mkdir -p %s: %s", scratch, strerror(errno));
  barrier();
  paths = (char (*)[600])malloc((size_t)W.size * sizeof *paths);
  for (r = 0; r < W.size; r++) { snprintf(paths[r], sizeof paths[r], "%s/partial_aw_n%d_rank%d.muon", scratch, W.size, r); pp[r] = paths[r]; }
  for (i = 0; i < 2; i++) snprintf(refpath[i], sizeof refpath[i], "%s/partial_aw_n%d_ref%d.muon", scratch, W.size, i);
  CHECK(muon_state_save_file(D, paths[W.rank]) == MUON_OK, "save: %s", muon_error(D));
  if (W.rank == 0)
    for (i = 0; i < 2; i++) CHECK(muon_state_save_file(R[i], refpath[i]) == MUON_OK, "ref save: %s", muon_error(R[i]));
  barrier();   /* every file written before anyone reads */

  for (i = 0; i < 2; i++) {
    S[i] = aw_single_copy(&a[i], i ? 0.75f * (1.0f / (float)W.size) : 0.75f, &sw[i], &smir[i]);
    CHECK(S[i] != NULL, "single create");
    st = S[i] ? muon_state_reshard_files(S[i], pp, W.size) : MUON_ERR_ARG;
    CHECK(st == MUON_OK, "rank %d: reshard %d files into one device (%s): %s", W.rank, W.size, a[i].name, S[i] ? muon_error(S[i]) : "");
    D1[i] = aw_dist_copy(&a[i], &dw[i], &dmir[i]);
    CHECK(D1[i] != NULL, "dist create");
    {
      const char *one = refpath[i];
      st = D1[i] ? muon_state_reshard_files(D1[i], &one, 1) : MUON_ERR_ARG;
    }
    CHECK(st == MUON_OK, "rank %d: reshard the single device's file into the distributed Partial optimizer (%s): %s", W.rank, a[i].name, D1[i] ? muon_error(D1[i]) : "");
    CHECK(same_all(st), "reshard statuses differ between ranks");
  }
  barrier();   /* everyone has read every file */
  remove(paths[W.rank]);
  if (W.rank == 0) { remove(refpath[0]); remove(refpath[1]); }

  bad = 0;
  {
    int dbad = 0, obad = 0;
    for (t = 3; t < 5; t++) {
      char when[32];
      for (i = 0; i < 2; i++) aw_grads(&a[i], t);
      CHECK(aw_step(D, R, 2) == MUON_OK, "step %d: %s", t, muon_error(D));
      for (i = 0; i < 2; i++) {
        if (S[i]) { CHECK(muon_step(S[i]) == MUON_OK, "resharded single step: %s", muon_error(S[i])); bad += aw_cmp_copy(&a[i], sw[i], smir[i], "one device resharded from P blobs"); }
        if (D1[i]) { st = muon_step(D1[i]); CHECK(st == MUON_OK, "rank %d: resharded distributed step: %s", W.rank, muon_error(D1[i])); dbad += aw_cmp_copy(&a[i], dw[i], dmir[i], "distributed resharded from one device"); }
      }
      snprintf(when, sizeof when, "step %d", t);
      for (i = 0; i < 2; i++) obad += aw_check(&a[i], when);
    }
    CHECK(bad == 0, "rank %d: %d mismatches of the resharded single device against the reference", W.rank, bad);
    CHECK(obad == 0, "rank %d: the original distributed run differs from one device", W.rank);
    TEST_CASE("Partial AdamW reshard: a single device's blob into the distributed Partial optimizer (n = 1): its next steps are the reference's, bitwise");
    CHECK(dbad == 0, "rank %d: %d mismatches of the resharded distributed optimizer against the reference", W.rank, dbad);
    CHECK(sum_all(dbad) == 0, "some rank differs");
  }
  for (i = 0; i < 2; i++) {
    muon_destroy(S[i]); muon_destroy(D1[i]);
    free(sw[i]); free(smir[i]); free(dw[i]); free(dmir[i]);
    aw_free(&a[i]);
    muon_destroy(R[i]);
  }
  free(paths);
  muon_destroy(D);
}

int main(int argc, char **argv) {
  int rc;
  W = ex_init(argc, argv);
  if (argc > 1 && argv[1][0] != '-') scratch = argv[1];
  test_bitwise();
  test_memory();
  test_state();
  test_reshard();
  test_errors();
  test_matrix_replica();
  test_aw_sum();
  test_aw_mean_bf16();
  test_aw_mixed();
  test_aw_replica();
  test_aw_auto();
  test_aw_skip_nonfinite();
  test_aw_errors();
  test_aw_layout_callback();
  test_aw_load_name();
  test_aw_state();
  test_aw_reshard();
  if (W.rank == 0) rc = test_summary();
  else { test__end_case(); rc = test__failed ? 1 : 0; }
  muon_comm_destroy(&W.world);
  return rc;
}
