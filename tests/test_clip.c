/* test_clip.c - muon_qk_clip (MuonClip's QK-clip), every rank a process:

     muonrun -n N build/test_clip build/golden/qk_clip.bin     (Gloo, CPU; 1 to 4 tested)

   The golden file is tests/ref_qk_clip.py's (numpy, Kimi K2's rule): tiny attentions (MHA, GQA,
   MQA, a fused q|k|v matrix), their tokens, weights, per-head max logits and the clipped weights.
   Cases, each on every rank:
   - numpy: the clipped weights bit for bit; the largest logit of every head, recomputed here
     from the weights after the clip, at most tau (1 + 1e-5) where it exceeded tau before; the
     heads under tau (and their key heads) and the v rows unchanged;
   - what muon keeps in step: the bf16 mirror rewritten from the new value, a bf16 param scaled
     and rounded to nearest, the momentum untouched;
   - errors: each bad field named, the status, nothing scaled (weights, mirror);
   - distributed (every rank's view of the max logits different, -INFINITY where it saw none):
     Q cut by rows, K by columns, a stack of fused qkv matrices in FLAT ranges cut inside rows and heads, with bf16 params and
     stochastic rounding; three steps, each followed by a clip, bitwise equal to a single-device
     optimizer in this process given the full max logits; ranks that pass different tau get
     MUON_ERR_MISMATCH, a rank's NaN logit MUON_ERR_NONFINITE, on every rank, nothing scaled. */
#define MUON_IMPLEMENTATION
#include "common.h"
#include "test.h"

#include <stdint.h>

static ex_world W;

static long long min_all(long long v) {
  long long all[64], s = v;
  int r;
  W.world.vt->allgather(W.world.ctx, &v, all, sizeof v);
  for (r = 0; r < W.size; r++) if (all[r] < s) s = all[r];
  return s;
}
static int ok_all(int ok) { return min_all(ok) == 1; }
static int same_all(long long v) { return min_all(v) == -min_all(-v); }

static uint16_t to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* ---- the golden cases ------------------------------------------------------------------------ */
typedef struct gcase {
  unsigned T, C, H, KV, D, fused;
  float tau, alpha;
  float *X, *W, *S, *W2, *S2;   /* W, W2: Wq then Wk (or the fused 3C x C) */
  size_t qrows, krows, wrows;
} gcase;
static gcase G[8];
static int NG;

static void read_or_die(FILE *f, void *p, size_t bytes) {
  if (fread(p, 1, bytes, f) != bytes) ex_die(&W, "golden file", "truncated");
}
static float *read_floats(FILE *f, size_t n) {
  float *p = (float *)malloc(n * sizeof *p + 1);
  if (!p) ex_die(&W, "malloc", "golden");
  read_or_die(f, p, n * sizeof *p);   /* little-endian machines only, as the other golden tests */
  return p;
}
static void load_golden(const char *path) {
  FILE *f = fopen(path, "rb");
  char magic[4];
  uint32_t head[2];
  int i;
  if (!f) ex_die(&W, path, "cannot open (make build/golden/qk_clip.bin)");
  read_or_die(f, magic, 4);
  read_or_die(f, head, sizeof head);
  if (memcmp(magic, "QKCL", 4) || head[0] != 1 || head[1] > 8) ex_die(&W, path, "not a version-1 QK-clip golden file");
  NG = (int)head[1];
  for (i = 0; i < NG; i++) {
    gcase *g = &G[i];
    uint32_t u[6];
    float tf[2];
    read_or_die(f, u, sizeof u);
    read_or_die(f, tf, sizeof tf);
    g->T = u[0]; g->C = u[1]; g->H = u[2]; g->KV = u[3]; g->D = u[4]; g->fused = u[5];
    g->tau = tf[0]; g->alpha = tf[1];
    g->qrows = (size_t)g->H * g->D;
    g->krows = (size_t)g->KV * g->D;
    g->wrows = g->fused ? 3 * g->qrows : g->qrows + g->krows;
    g->X = read_floats(f, (size_t)g->T * g->C);
    g->W = read_floats(f, g->wrows * g->C);
    g->S = read_floats(f, g->H);
    g->W2 = read_floats(f, g->wrows * g->C);
    g->S2 = read_floats(f, g->H);
  }
  fclose(f);
}

/* The largest causal logit of every head of case g with weights Wq, Wk (double, as numpy). */
static void max_logits(const gcase *g, const float *Wq, const float *Wk, double *out) {
  unsigned h, i, j, e, c, grp = g->H / g->KV;
  for (h = 0; h < g->H; h++) {
    double best = -HUGE_VAL;
    for (i = 0; i < g->T; i++)
      for (j = 0; j <= i; j++) {
        double s = 0;
        for (e = 0; e < g->D; e++) {
          double q = 0, k = 0;
          for (c = 0; c < g->C; c++) {
            q += (double)g->X[i * g->C + c] * Wq[(h * g->D + e) * g->C + c];
            k += (double)g->X[j * g->C + c] * Wk[((h / grp) * g->D + e) * g->C + c];
          }
          s += q * k;
        }
        s /= sqrt((double)g->D);
        if (s > best) best = s;
      }
    out[h] = best;
  }
}

static muon_qk_clip_layer layer_of(const gcase *g, const char *q, const char *k, const float *S) {
  muon_qk_clip_layer y;
  memset(&y, 0, sizeof y);
  y.q = q;
  y.k = k;
  y.q_row = 0;
  y.k_row = g->fused ? (int)g->qrows : 0;
  y.n_heads = (int)g->H;
  y.n_kv_heads = g->KV == g->H ? 0 : (int)g->KV;   /* 0: MHA */
  y.head_dim = (int)g->D;
  y.max_logits = S;
  return y;
}

/* A one-device optimizer with case g's matrices (fused: "qkv", else "q" and "k"), the weights in
   w (wrows x C); mirror: a bf16 copy of each; bf16: the weights are bf16 (wb). */
static muon_optimizer *one_device(const gcase *g, float *w, uint16_t *mirror, uint16_t *wb) {
  muon_desc d = muon_default_desc();
  muon_optimizer *opt;
  muon_matrix m = muon_default_matrix();
  if (muon_create(&opt, &d) != MUON_OK) ex_die(&W, "muon_create", muon_error(NULL));
  m.cols = (int)g->C;
  m.param_dtype = wb ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
  m.grad = w;   /* never stepped */
  m.name = g->fused ? "qkv" : "q";
  m.rows = (int)(g->fused ? g->wrows : g->qrows);
  m.param = wb ? (void *)wb : (void *)w;
  m.mirror = mirror;
  if (muon_add_matrix(opt, &m, NULL) != MUON_OK) ex_die(&W, "muon_add_matrix", muon_error(opt));
  if (!g->fused) {
    m.name = "k";
    m.rows = (int)g->krows;
    m.param = wb ? (void *)(wb + g->qrows * g->C) : (void *)(w + g->qrows * g->C);
    m.mirror = mirror ? mirror + g->qrows * g->C : NULL;
    if (muon_add_matrix(opt, &m, NULL) != MUON_OK) ex_die(&W, "muon_add_matrix", muon_error(opt));
  }
  return opt;
}

static int first_diff(const void *a, const void *b, size_t n, size_t elem) {
  size_t i;
  for (i = 0; i < n; i++)
    if (memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem)) return (int)i;
  return -1;
}

static void test_golden(void) {
  int c;
  for (c = 0; c < NG; c++) {
    const gcase *g = &G[c];
    size_t n = g->wrows * g->C;
    float *w = (float *)malloc(n * sizeof *w);
    double *before = (double *)malloc(g->H * sizeof(double)), *after = (double *)malloc(g->H * sizeof(double));
    muon_qk_clip_desc d = muon_default_qk_clip_desc();
    muon_qk_clip_layer y = layer_of(g, g->fused ? "qkv" : "q", g->fused ? "qkv" : "k", g->S);
    muon_optimizer *opt;
    float got_max[16];
    char name[120];
    int clipped = -1, over = 0, i;
    unsigned h;
    if (!w || !before || !after) ex_die(&W, "malloc", "golden case");
    snprintf(name, sizeof name, "numpy: %s, %u heads, %u key heads, tau %g, alpha %g, bitwise; max logit <= tau after",
             g->fused ? "fused q|k|v" : "separate Q and K", g->H, g->KV, (double)g->tau, (double)g->alpha);
    TEST_CASE(name);
    memcpy(w, g->W, n * sizeof *w);
    opt = one_device(g, w, NULL, NULL);
    max_logits(g, w, w + g->qrows * g->C, before);
    for (h = 0; h < g->H; h++) {
      CHECK(fabs(before[h] - g->S[h]) <= 1e-5 * fabs(g->S[h]), "head %u: max logit %.9g here, numpy %.9g", h, before[h],
            (double)g->S[h]);
      over += g->S[h] > g->tau;
    }
    d.tau = g->tau;
    d.alpha = g->alpha;
    d.layers = &y;
    d.n_layers = 1;
    d.max_logits_out = got_max;
    CHECK(muon_qk_clip(opt, &d, &clipped) == MUON_OK, "muon_qk_clip: %s", muon_error(opt));
    CHECK(clipped == over && over > 0, "clipped %d heads, %d exceed tau", clipped, over);
    CHECK(first_diff(got_max, g->S, g->H, 4) < 0, "max_logits_out is not the max logits");
    i = first_diff(w, g->W2, n, 4);
    CHECK(i < 0, "element %d (row %d): %.9g, numpy %.9g (before %.9g)", i, i / (int)g->C, (double)w[i < 0 ? 0 : i],
          (double)g->W2[i < 0 ? 0 : i], (double)g->W[i < 0 ? 0 : i]);
    max_logits(g, w, w + g->qrows * g->C, after);
    for (h = 0; h < g->H; h++) {
      CHECK(after[h] <= (double)g->tau * (1 + 1e-5), "head %u: max logit %.9g after, tau %g (before %.9g)", h, after[h],
            (double)g->tau, before[h]);
      if (g->S[h] > g->tau)
        CHECK(after[h] >= (double)g->tau * (1 - 1e-5) || g->KV < g->H,
              "head %u: max logit %.9g after, tau %g: MHA lands on tau", h, after[h], (double)g->tau);
    }
    if (g->fused)
      CHECK(first_diff(w + 2 * g->qrows * g->C, g->W + 2 * g->qrows * g->C, g->qrows * g->C, 4) < 0, "v rows changed");
    muon_destroy(opt);
    free(w); free(before); free(after);
  }
}

/* The bf16 mirror, bf16 params, the momentum. */
static void test_kept_in_step(void) {
  const gcase *g = &G[0];
  size_t n = g->wrows * g->C, i;
  float *w = (float *)malloc(n * sizeof *w), *mom0 = (float *)malloc(n * sizeof *w);
  uint16_t *mirror = (uint16_t *)malloc(n * 2), *wb = (uint16_t *)malloc(n * 2), *wb0 = (uint16_t *)malloc(n * 2);
  muon_qk_clip_desc d = muon_default_qk_clip_desc();
  muon_qk_clip_layer y = layer_of(g, "q", "k", g->S);
  muon_optimizer *opt;
  const float *mom;
  size_t msize;
  int bad = -1;
  if (!w || !mom0 || !mirror || !wb || !wb0) ex_die(&W, "malloc", "kept");
  d.tau = g->tau; d.alpha = g->alpha; d.layers = &y; d.n_layers = 1;

  TEST_CASE("fp32 weights with a bf16 mirror: the mirror is the clipped weight rounded; the momentum untouched");
  memcpy(w, g->W, n * sizeof *w);
  for (i = 0; i < n; i++) mirror[i] = to_bf16(w[i]);
  opt = one_device(g, w, mirror, NULL);
  CHECK(muon_step(opt) == MUON_OK, "step: %s", muon_error(opt));   /* a momentum that is not zero */
  CHECK(muon_get_momentum(opt, 0, &mom, &msize) == MUON_OK && msize == g->qrows * g->C, "momentum");
  memcpy(mom0, mom, msize * sizeof *mom);
  CHECK(muon_qk_clip(opt, &d, NULL) == MUON_OK, "muon_qk_clip: %s", muon_error(opt));
  for (i = 0; i < n && bad < 0; i++) if (mirror[i] != to_bf16(w[i])) bad = (int)i;
  CHECK(bad < 0, "mirror element %d: %04x, the weight %.9g rounds to %04x", bad, mirror[bad < 0 ? 0 : bad],
        (double)w[bad < 0 ? 0 : bad], to_bf16(w[bad < 0 ? 0 : bad]));
  CHECK(memcmp(mom0, mom, msize * sizeof *mom) == 0, "the momentum changed");
  muon_destroy(opt);

  TEST_CASE("bf16 weights: scaled in fp32, rounded to nearest");
  for (i = 0; i < n; i++) wb[i] = wb0[i] = to_bf16(g->W[i]);
  opt = one_device(g, w, NULL, wb);
  CHECK(muon_qk_clip(opt, &d, NULL) == MUON_OK, "muon_qk_clip: %s", muon_error(opt));
  /* each row's factor as Kimi K2's rule gives it (the golden file's cases check the rule) */
  {
    unsigned h, j, grp = g->H / g->KV;
    float fq[16], fk[16];
    for (h = 0; h < g->H; h++) fq[h] = g->S[h] > g->tau ? (float)pow((double)g->tau / g->S[h], (double)g->alpha) : 1.0f;
    for (j = 0; j < g->KV; j++) {
      float s = g->S[j * grp];
      for (h = j * grp; h < (j + 1) * grp; h++) if (g->S[h] > s) s = g->S[h];
      fk[j] = s > g->tau ? (float)pow((double)g->tau / s, 1.0 - (double)g->alpha) : 1.0f;
    }
    for (i = 0, bad = -1; i < n && bad < 0; i++) {
      size_t row = i / g->C;
      float f = row < g->qrows ? fq[row / g->D] : fk[(row - g->qrows) / g->D];
      if (wb[i] != to_bf16(from_bf16(wb0[i]) * f)) bad = (int)i;
    }
  }
  CHECK(bad < 0, "bf16 element %d: %04x", bad, wb[bad < 0 ? 0 : bad]);
  muon_destroy(opt);
  free(w); free(mom0); free(mirror); free(wb); free(wb0);
}

/* Each bad field: its status, its name in the message, nothing scaled. */
static void test_errors(void) {
  const gcase *g = &G[2];   /* fused */
  size_t n = g->wrows * g->C, i;
  float *w = (float *)malloc(n * sizeof *w), S[16], nan_s[16];
  uint16_t *mirror = (uint16_t *)malloc(n * 2), *mirror0 = (uint16_t *)malloc(n * 2);
  muon_optimizer *opt;
  struct bad { const char *what; muon_status st; const char *says; } cases[] = {
    { "desc NULL", MUON_ERR_ARG, "desc is NULL" },
    { "tau 0", MUON_ERR_ARG, "muon_qk_clip_desc.tau" },
    { "tau NaN", MUON_ERR_ARG, "muon_qk_clip_desc.tau" },
    { "alpha 1.5", MUON_ERR_ARG, "muon_qk_clip_desc.alpha" },
    { "n_layers -1", MUON_ERR_ARG, "muon_qk_clip_desc.n_layers" },
    { "layers NULL", MUON_ERR_ARG, "muon_qk_clip_desc.n_layers is 1 and layers NULL" },
    { "q NULL", MUON_ERR_ARG, "layers[0].q is NULL" },
    { "n_heads 0", MUON_ERR_ARG, "layers[0].n_heads" },
    { "n_kv_heads 3 of 4", MUON_ERR_ARG, "layers[0].n_kv_heads" },
    { "head_dim 0", MUON_ERR_ARG, "layers[0].head_dim" },
    { "k_row -1", MUON_ERR_ARG, "layers[0].q_row and .k_row" },
    { "max_logits NULL", MUON_ERR_ARG, "layers[0].max_logits is NULL" },
    { "a NaN logit", MUON_ERR_NONFINITE, "layers[0].max_logits[1] is NaN" },
    { "a +Inf logit", MUON_ERR_NONFINITE, "layers[0].max_logits[1] is +Inf" },
    { "unknown matrix", MUON_ERR_ARG, "layers[0].k: no rank registered a matrix 'qkvw'" },
    { "key rows past the matrix", MUON_ERR_SHAPE, "key rows [40, 56) do not fit 'qkv' (48 rows)" },
    { "query and key rows overlap", MUON_ERR_ARG, "overlap" },
  };
  int c;
  if (!w || !mirror || !mirror0) ex_die(&W, "malloc", "errors");
  memcpy(w, g->W, n * sizeof *w);
  for (i = 0; i < n; i++) mirror[i] = mirror0[i] = to_bf16(w[i]);
  for (i = 0; i < g->H; i++) { S[i] = g->S[i]; nan_s[i] = g->S[i]; }
  nan_s[1] = NAN;
  opt = one_device(g, w, mirror, NULL);
  TEST_CASE("errors: every bad field named, nothing scaled");
  for (c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
    muon_qk_clip_desc d = muon_default_qk_clip_desc();
    muon_qk_clip_layer y = layer_of(g, "qkv", "qkv", S);
    const muon_qk_clip_desc *dp = &d;
    muon_status st;
    int clipped = 7;
    d.tau = 0.5f * g->tau;   /* every head over it: a valid call would scale */
    d.layers = &y;
    d.n_layers = 1;
    switch (c) {
    case 0: dp = NULL; break;
    case 1: d.tau = 0; break;
    case 2: d.tau = NAN; break;
    case 3: d.alpha = 1.5f; break;
    case 4: d.n_layers = -1; break;
    case 5: d.layers = NULL; break;
    case 6: y.q = NULL; break;
    case 7: y.n_heads = 0; break;
    case 8: y.n_kv_heads = 3; break;
    case 9: y.head_dim = 0; break;
    case 10: y.k_row = -1; break;
    case 11: y.max_logits = NULL; break;
    case 12: y.max_logits = nan_s; break;
    case 13: nan_s[1] = INFINITY; y.max_logits = nan_s; break;
    case 14: y.k = "qkvw"; break;
    case 15: y.k_row = 40; break;
    case 16: y.k_row = 8; break;
    }
    st = muon_qk_clip(opt, dp, &clipped);
    CHECK(st == cases[c].st && strstr(muon_error(opt), cases[c].says) && clipped == 0, "%s: %s, '%s' (clipped %d)",
          cases[c].what, muon_status_string(st), muon_error(opt), clipped);
  }
  CHECK(first_diff(w, g->W, n, 4) < 0 && first_diff(mirror, mirror0, n, 2) < 0, "a refused call scaled something");
  {
    muon_qk_clip_desc d = muon_default_qk_clip_desc();
    CHECK(muon_qk_clip(NULL, &d, NULL) == MUON_ERR_ARG, "opt NULL");
    CHECK(muon_qk_clip(opt, &d, NULL) == MUON_OK, "no layers: %s", muon_error(opt));
  }
  muon_destroy(opt);
  free(w); free(mirror); free(mirror0);
}

/* ---- distributed: pieces cut every way, each rank its own view of the max logits ----------------- */
enum { DC = 16, DH = 4, DD = 4, DKV = 2, DL = 2, DSTEPS = 3 };   /* q 16 x 16, k 8 x 16, qkvw 2 x 48 x 16 */
typedef struct dmat { const char *name; int rows, count, bf16; } dmat;
static const dmat DM[3] = { { "q", DH * DD, 1, 0 }, { "k", DKV * DD, 1, 0 }, { "qkvw", 3 * DH * DD, DL, 1 } };

static float dval(unsigned seed, long long i) { return ex_value(seed, i); }

typedef struct dside {
  muon_optimizer *opt;
  void *param[3];
  float *grad[3];
  long long *idx[3];      /* full index of each local element (per slice) */
  size_t n[3];            /* local elements per slice */
  muon_layout layout[3];
  muon_dist_config cfg;
} dside;

static void dside_init(dside *x, int dist) {
  muon_desc d = muon_default_desc();
  int t, l;
  size_t k;
  memset(x, 0, sizeof *x);
  d.hparams.lr = 0.05f;
  d.hparams.weight_decay = 0.01f;
  d.rounding = MUON_ROUND_STOCHASTIC;
  d.seed = 29;
  if (dist) {
    x->cfg = muon_layout_config();
    d.comm = &W.world;
    d.dist = &x->cfg;
  }
  if (muon_create(&x->opt, &d) != MUON_OK) ex_die(&W, "muon_create", muon_error(NULL));
  for (t = 0; t < 3; t++) {
    const dmat *s = &DM[t];
    muon_matrix m = muon_default_matrix();
    long long idx[3 * DH * DD * DC];
    muon_layout *L = &x->layout[t];
    memset(L, 0, sizeof *L);
    if (dist) {
      L->n_levels = 1;
      /* qkvw: FLAT ranges cut inside rows and inside heads (5 elements before an even split), so a
         head's rows start before a piece and end after it */
      long long total = (long long)s->rows * DC, P = W.size, r = W.rank;
      long long lo = r == 0 ? 0 : total * r / P - 5, hi = r + 1 == P ? total : total * (r + 1) / P - 5;
      L->levels[0] = t == 0 ? muon_shard(0, &W.world) : t == 1 ? muon_shard(1, &W.world) : muon_flat_range(&W.world, lo, hi - lo);
    }
    x->n[t] = ex_piece(L, s->rows, DC, idx);
    x->idx[t] = (long long *)malloc(x->n[t] * sizeof(long long) + 1);
    x->param[t] = malloc((size_t)s->count * x->n[t] * 4 + 4);
    x->grad[t] = (float *)malloc((size_t)s->count * x->n[t] * 4 + 4);
    if (!x->idx[t] || !x->param[t] || !x->grad[t]) ex_die(&W, "malloc", "dside");
    memcpy(x->idx[t], idx, x->n[t] * sizeof(long long));
    for (l = 0; l < s->count; l++)
      for (k = 0; k < x->n[t]; k++) {
        float v = 0.5f * dval(1000u + (unsigned)(t * 8 + l), idx[k]) * (t == 0 ? 3.0f : 1.0f);
        if (s->bf16) ((uint16_t *)x->param[t])[(size_t)l * x->n[t] + k] = to_bf16(v);
        else ((float *)x->param[t])[(size_t)l * x->n[t] + k] = v;
      }
    m.name = s->name;
    m.rows = s->rows;
    m.cols = DC;
    m.count = s->count;
    m.param = x->param[t];
    m.param_dtype = s->bf16 ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
    m.grad = x->grad[t];
    m.layout = dist ? L : NULL;
    if (muon_add_matrix(x->opt, &m, NULL) != MUON_OK) ex_die(&W, "muon_add_matrix", muon_error(x->opt));
  }
}

static void dside_grads(dside *x, int step) {
  int t, l;
  size_t k;
  for (t = 0; t < 3; t++)
    for (l = 0; l < DM[t].count; l++)
      for (k = 0; k < x->n[t]; k++)
        x->grad[t][(size_t)l * x->n[t] + k] = dval(7u * (unsigned)(step + 1) + (unsigned)(t * 8 + l), x->idx[t][k]);
}

static void dside_free(dside *x) {
  int t;
  muon_destroy(x->opt);
  for (t = 0; t < 3; t++) { free(x->idx[t]); free(x->param[t]); free(x->grad[t]); }
}

/* The layers: separate q / k (GQA) and the two fused slices; S the full max logits of step s, a
   rank's view keeps head h where (h + layer + step) % P == rank, else -INFINITY or a smaller value. */
static void dlayers(muon_qk_clip_layer *y, float S[3][DH], int step, int view) {
  static const char *names[3] = { "qkvw[0]", "qkvw[1]", "q" };
  int l, h;
  for (l = 0; l < 3; l++) {
    for (h = 0; h < DH; h++) {
      float full = 40.0f + 25.0f * dval(555u + (unsigned)step, l * DH + h);   /* 15 .. 65, tau 30 */
      int mine = (h + l + step) % W.size == W.rank;
      S[l][h] = !view || mine ? full : (h & 1) ? full - 20.0f : -INFINITY;
    }
    memset(&y[l], 0, sizeof y[l]);
    y[l].q = names[l];
    y[l].k = l < 2 ? names[l] : "k";
    y[l].k_row = l < 2 ? DH * DD : 0;
    y[l].n_heads = DH;
    y[l].n_kv_heads = l < 2 ? 0 : DKV;
    y[l].head_dim = DD;
    y[l].max_logits = S[l];
  }
}

/* Every matrix of x, gathered to rank 0, against the one device's; the verdict on every rank. */
static int dsame(dside *x, dside *ref, const char *what) {
  float full[3 * DH * DD * DC];
  int g, ok = 1;
  for (g = 0; g < muon_global_count(x->opt); g++) {
    muon_matrix_info info;
    int t, l = 0, owner;
    size_t k;
    if (muon_global_info(x->opt, g, &info, &owner) != MUON_OK) ex_die(&W, "muon_global_info", muon_error(x->opt));
    if (muon_gather_matrix(x->opt, g, 0, full, NULL) != MUON_OK) ex_die(&W, "muon_gather_matrix", muon_error(x->opt));
    if (W.rank) continue;
    t = !strcmp(info.name, "q") ? 0 : !strcmp(info.name, "k") ? 1 : 2;
    if (t == 2) l = info.name[5] - '0';
    for (k = 0; ok && k < (size_t)DM[t].rows * DC; k++) {
      float want = DM[t].bf16 ? from_bf16(((uint16_t *)ref->param[t])[(size_t)l * ref->n[t] + k])
                              : ((float *)ref->param[t])[k];
      if (memcmp(&want, &full[k], 4)) {
        printf("  %s: '%s' element %zu: %.9g, one device %.9g\n", what, info.name, k, (double)full[k], (double)want);
        ok = 0;
      }
    }
  }
  return ok_all(ok);
}

static void test_distributed(void) {
  dside x, ref;
  muon_qk_clip_layer y[3], yr[3];
  float S[3][DH], Sr[3][DH], agreed[3 * DH];
  int s, ok = 1, clipped = -1, clipped_ref = -2;
  muon_stats before, after;
  long long ctl[DSTEPS] = { 0 };
  char what[64];
  TEST_CASE("distributed: Q by rows, K by columns, fused bf16 stacks in FLAT ranges; clip after each step; bitwise one device");
  dside_init(&x, 1);
  dside_init(&ref, 0);
  for (s = 0; s < DSTEPS && ok; s++) {
    muon_qk_clip_desc d = muon_default_qk_clip_desc(), dr;
    muon_status st, sr;
    int l, h;
    dside_grads(&x, s);
    dside_grads(&ref, s);
    st = muon_step(x.opt);
    sr = muon_step(ref.opt);
    CHECK(st == MUON_OK && sr == MUON_OK, "step %d: %s / %s", s, muon_error(x.opt), muon_error(ref.opt));
    dlayers(y, S, s, 1);
    dlayers(yr, Sr, s, 0);
    d.tau = 30.0f;
    d.alpha = 0.5f;
    d.layers = y;
    d.n_layers = s % 3 + 1;   /* 4, 8, 12 heads: at 3 ranks shares of 2, 2, 0 and 3, 3, 2 heads too */
    d.max_logits_out = agreed;
    dr = d;
    dr.layers = yr;
    dr.max_logits_out = NULL;
    muon_get_stats(x.opt, &before);
    st = muon_qk_clip(x.opt, &d, &clipped);
    muon_get_stats(x.opt, &after);
    ctl[s] = after.control_bytes - before.control_bytes;
    sr = muon_qk_clip(ref.opt, &dr, &clipped_ref);
    CHECK(st == MUON_OK && sr == MUON_OK && clipped == clipped_ref && clipped > 0, "clip %d: %s / %s (%d vs %d heads)",
          s, muon_error(x.opt), muon_error(ref.opt), clipped, clipped_ref);
    for (l = 0; l < d.n_layers; l++)
      for (h = 0; h < DH; h++)
        CHECK(!memcmp(&agreed[l * DH + h], &Sr[l][h], 4), "layer %d head %d: agreed %g, full %g", l, h,
              (double)agreed[l * DH + h], (double)Sr[l][h]);
    snprintf(what, sizeof what, "after step %d and its clip", s);
    ok = st == MUON_OK && sr == MUON_OK && dsame(&x, &ref, what);
  }
  CHECK(ok_all(ok), "not bitwise one device's on every rank");
  {   /* the max logits' agreement receives about 2 H floats per rank, not an allgather's P x H:
         calls with 12 and 4 heads differ by exactly the shares' floats (the rest is the same) */
    long long f[2];
    int k;
    for (k = 0; k < 2; k++) {
      long long H = k ? 3 * DH : DH, c = (H + W.size - 1) / W.size, lo = W.rank * c < H ? W.rank * c : H;
      long long n = (lo + c < H ? lo + c : H) - lo;
      f[k] = 4 * ((W.size - 1) * n + H - n);
    }
    CHECK(ctl[2] - ctl[0] == f[1] - f[0], "a clip of 12 heads received %lld B more than one of 4, the shares %lld B",
          ctl[2] - ctl[0], f[1] - f[0]);
    if (W.rank == 0)
      printf("  clip of 12 heads at %d ranks: %lld B received for the max logits (an allgather of the views: %d B), "
             "%lld B for the agreement before it\n", W.size, ctl[2] - (ctl[0] - f[0]), 4 * 3 * DH * (W.size - 1),
             ctl[0] - f[0]);
  }

  if (W.size > 1) {
    muon_qk_clip_desc d = muon_default_qk_clip_desc();
    muon_status st;
    TEST_CASE("distributed: a rank's other tau is MUON_ERR_MISMATCH, a rank's NaN logit MUON_ERR_NONFINITE, on every rank; nothing scaled");
    dlayers(y, S, 0, 1);
    dlayers(yr, Sr, 0, 0);   /* what the one device is (not) given */
    d.layers = y;
    d.n_layers = 3;
    d.tau = W.rank == 1 ? 31.0f : 30.0f;
    st = muon_qk_clip(x.opt, &d, NULL);
    CHECK(st == MUON_ERR_MISMATCH && same_all(st) && strstr(muon_error(x.opt), "different layers, tau or alpha"),
          "tau differs: %s, '%s'", muon_status_string(st), muon_error(x.opt));
    d.tau = 30.0f;
    if (W.rank == W.size - 1) S[2][3] = NAN;
    st = muon_qk_clip(x.opt, &d, NULL);
    CHECK(st == MUON_ERR_NONFINITE && same_all(st), "NaN on the last rank: %s, '%s'", muon_status_string(st),
          muon_error(x.opt));
    CHECK(dsame(&x, &ref, "after the refused clips"), "a refused clip scaled something");
  }
  dside_free(&x);
  dside_free(&ref);
}

int main(int argc, char **argv) {
  int rc;
  W = ex_init(argc, argv);
  if (W.size > 64) ex_die(&W, "test_clip", "at most 64 ranks");
  load_golden(argc > 1 ? argv[argc - 1] : "build/golden/qk_clip.bin");
  test_golden();
  test_kept_in_step();
  test_errors();
  test_distributed();
  if (W.rank == 0) rc = test_summary();
  else { test__end_case(); rc = test__failed ? 1 : 0; }
  muon_comm_destroy(&W.world);
  return rc;
}
