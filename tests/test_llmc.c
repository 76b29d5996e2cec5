/* test_llmc.c - llm.c's own parameter layout under muon, every rank a process:

     muonrun -n N build/test_llmc          (Gloo, CPU; 1 to 4 tested)
     muonrun -n N build/nccl/test_llmc     (the CUDA backend and NCCL, on the stand-ins)

   The model is a small GPT-2 (C = 8, L = 2, Vp = 16, maxT = 8) laid out as llm.c lays it out:
   the 16 tensors in ParameterTensors order in one flat buffer, block weights as [L, rows, cols]
   (fcprojw is C x 4C: rows C, cols 4C). The four block matrices go to Muon as count = L stacks,
   the other twelve to AdamW as count / stride stacks, one registration each. bf16 weights and
   gradients with fp32 master weights; ZeRO-1 as llm.c cuts it: each rank updates a contiguous
   chunk of every layer's piece of every tensor (Muon: FLAT ranges), its master weights hold only
   those chunks, packed, while the bf16 weights and gradients stay whole flat buffers. Outside its
   chunks a rank's gradient buffer holds NaN, so reading anything else fails.

   Every case runs a single-device optimizer in the same process, fed the whole tensors, with the
   AdamW pieces registered one by one as "name[l]", and compares bit for bit what each rank
   updates (its master chunks and bf16 chunks). The gradient is a function of (step, tensor,
   index in the full tensor). Cases: registered after the first backward (llm.c allocates its
   gradients there); registered before it, stepped unbound (MUON_ERR_ARG naming the piece), bound
   after; resume from checkpoints; reshard from one device and to one device; stochastic rounding
   into bf16 weights without master weights (and its resume); DDP without the all-reduce (every
   rank's gradient a part: Partial stacks). Every step is followed by muon_qk_clip over the fused
   qkvw stack, each rank passing only the max logits of the heads it saw. */
#define MUON_IMPLEMENTATION
#ifdef MUON_CUDA_STANDIN
#define EX_NCCL   /* build/nccl/: CUDA compute, NCCL communication */
#endif
#include "common.h"
#include "test.h"

#include <stdint.h>

static ex_world W;

enum { C = 8, L = 2, VP = 16, MAXT = 8, NT = 16 };
typedef struct tensor { const char *name; int layers, rows, cols, muon; } tensor;
static const tensor T[NT] = {
  { "wte", 1, VP, C, 0 },       { "wpe", 1, MAXT, C, 0 },       { "ln1w", L, 1, C, 0 },    { "ln1b", L, 1, C, 0 },
  { "qkvw", L, 3 * C, C, 1 },   { "qkvb", L, 1, 3 * C, 0 },     { "attprojw", L, C, C, 1 }, { "attprojb", L, 1, C, 0 },
  { "ln2w", L, 1, C, 0 },       { "ln2b", L, 1, C, 0 },         { "fcw", L, 4 * C, C, 1 },  { "fcb", L, 1, 4 * C, 0 },
  { "fcprojw", L, C, 4 * C, 1 }, { "fcprojb", L, 1, C, 0 },     { "lnfw", 1, 1, C, 0 },    { "lnfb", 1, 1, C, 0 } };

/* M_MASTER: fp32 master chunks, bf16 weights as their mirror, ZeRO-1. M_SR: the bf16 weights
   themselves, stochastic rounding, ZeRO-1. M_DDP: every rank whole, fp32 master, its gradient a
   part (muon_auto_desc.partial). */
enum { M_MASTER, M_SR, M_DDP };

/* ---- collectives over the world, host memory ------------------------------------------------- */
static long long min_all(long long v) {
  long long all[64], s = v;
  int r;
  W.world.vt->allgather(W.world.ctx, &v, all, sizeof v);
  for (r = 0; r < W.size; r++) if (all[r] < s) s = all[r];
  return s;
}
static long long max_all(long long v) { return -min_all(-v); }
static int same_all(long long v) { return min_all(v) == max_all(v); }

/* ---- backend memory: the GPU's in the nccl build, else the host's ----------------------------- */
static void *dev_alloc(size_t bytes) {
#ifdef EX_CUDA
  void *p = NULL;
  if (cudaMalloc(&p, bytes) != cudaSuccess) ex_die(&W, "cudaMalloc", "failed");
  return p;
#else
  void *p = malloc(bytes);
  if (!p) ex_die(&W, "malloc", "failed");
  return p;
#endif
}
static void dev_free(void *p) {
#ifdef EX_CUDA
  cudaFree(p);
#else
  free(p);
#endif
}
static void to_dev(void *dev, const void *host, size_t bytes) {
#ifdef EX_CUDA
  ex_wait(&W);
  if (cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) ex_die(&W, "cudaMemcpy", "to the GPU");
#else
  memcpy(dev, host, bytes);
#endif
}
static void from_dev(void *host, const void *dev, size_t bytes) {
#ifdef EX_CUDA
  ex_wait(&W);
  if (cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) ex_die(&W, "cudaMemcpy", "from the GPU");
#else
  memcpy(host, dev, bytes);
#endif
}

/* ---- bf16 (nearest even; the values are finite) ----------------------------------------------- */
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

/* ---- the trainer ------------------------------------------------------------------------------ */
typedef struct trainer {
  int mode, P, r, dist, separate;   /* separate: AdamW pieces one registration each ("name[l]") */
  size_t off[NT], n[NT], N;         /* tensor t at off[t] of the flat buffers; one layer's piece */
  size_t lo[NT], len[NT], moff[NT], NM;   /* this rank's chunk of each piece; its master chunks */
  float *master;                    /* backend memory; NULL in M_SR */
  uint16_t *params, *grads;         /* backend memory; grads NULL before the first backward */
  int first[NT];                    /* matrix or AdamW index of each tensor's piece 0 */
  muon_auto_desc ad;
  muon_dist_config cfg;
  muon_optimizer *opt;
} trainer;

static float init_w(int t, size_t e) { return 0.5f * ex_value(ex_hash(T[t].name, 12345u), (long long)e); }
static uint16_t grad_bf16(int t, int step, size_t e) {
  return to_bf16(ex_value(ex_hash(T[t].name, 7919u * (unsigned)(step + 1)), (long long)e));
}

/* The buffers at their initial values; zero: ZeRO-1 chunks, else whole. */
static void trainer_init(trainer *x, int mode, int dist, int separate) {
  int t, l;
  size_t k, at = 0, mat = 0;
  float *m;
  uint16_t *p;
  memset(x, 0, sizeof *x);
  x->mode = mode;
  x->dist = dist;
  x->separate = separate;
  x->P = dist && mode != M_DDP ? W.size : 1;
  x->r = dist && mode != M_DDP ? W.rank : 0;
  for (t = 0; t < NT; t++) {
    size_t n = (size_t)T[t].rows * T[t].cols, c = (n + (size_t)x->P - 1) / (size_t)x->P;
    x->off[t] = at;
    x->n[t] = n;
    x->lo[t] = (size_t)x->r * c < n ? (size_t)x->r * c : n;   /* muon's FLAT chunk split */
    x->len[t] = n - x->lo[t] < c ? n - x->lo[t] : c;
    x->moff[t] = mat;
    at += (size_t)T[t].layers * n;
    mat += (size_t)T[t].layers * x->len[t];
  }
  x->N = at;
  x->NM = mat;
  m = (float *)malloc(x->NM * sizeof *m);
  p = (uint16_t *)malloc(x->N * sizeof *p);
  if (!m || !p) ex_die(&W, "malloc", "trainer");
  for (t = 0; t < NT; t++)
    for (l = 0; l < T[t].layers; l++)
      for (k = 0; k < x->n[t]; k++) {
        size_t e = (size_t)l * x->n[t] + k;
        p[x->off[t] + e] = to_bf16(init_w(t, e));
        if (k >= x->lo[t] && k < x->lo[t] + x->len[t])
          m[x->moff[t] + (size_t)l * x->len[t] + k - x->lo[t]] = init_w(t, e);
      }
  x->params = (uint16_t *)dev_alloc(x->N * 2);
  to_dev(x->params, p, x->N * 2);
  if (mode != M_SR) {
    x->master = (float *)dev_alloc(x->NM * sizeof(float));
    to_dev(x->master, m, x->NM * sizeof(float));
  }
  free(m);
  free(p);
}

/* Creates the optimizer and registers the 16 tensors: 4 matrix stacks, 12 AdamW stacks (or
   their pieces one by one). Gradients are the buffer's if it exists, else unbound. */
static muon_status trainer_register(trainer *x) {
  muon_desc d = muon_default_desc();
  muon_status st;
  int t, l;
  d.hparams.lr = 0.02f;
  d.hparams.weight_decay = 0.01f;
  d.adamw.lr = 0.01f;
  d.adamw.weight_decay = 0.1f;
  d.adamw.eps = 0.1f;   /* near sqrt(v): the update depends on the gradient's low bits */
  d.compute = ex_compute(&W);
  d.rounding = x->mode == M_SR ? MUON_ROUND_STOCHASTIC : MUON_ROUND_NEAREST;
  d.seed = 2024;
  if (x->dist) {
    memset(&x->ad, 0, sizeof x->ad);
    if (x->mode == M_DDP) { x->ad.ddp = &W.world; x->ad.partial = 1; }
    else { x->ad.fsdp = &W.world; x->ad.fsdp_flat = 1; }   /* llm.c's ZeRO-1: FLAT chunks */
    x->cfg = muon_auto_config(&x->ad);
    d.comm = &W.world;
    d.dist = &x->cfg;
  }
  if ((st = muon_create(&x->opt, &d)) != MUON_OK) return st;
  for (t = 0; t < NT; t++) {
    const tensor *s = &T[t];
    size_t n = x->n[t], lo = x->lo[t];
    int bf16 = x->mode == M_SR;
    void *w = bf16 ? (void *)(x->params + x->off[t] + lo) : (void *)(x->master + x->moff[t]);
    void *mirror = bf16 ? NULL : x->params + x->off[t] + lo;
    const void *g = x->grads ? x->grads + x->off[t] + lo : NULL;
    if (s->muon) {
      muon_matrix m = muon_default_matrix();
      m.name = s->name;
      m.rows = s->rows;
      m.cols = s->cols;
      m.count = s->layers;
      m.param = w;
      m.param_dtype = bf16 ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
      m.stride = bf16 ? n : 0;   /* master chunks are packed */
      m.mirror = mirror;
      m.mirror_stride = n;
      m.grad = g;
      m.grad_dtype = MUON_DTYPE_BF16;
      m.grad_stride = bf16 ? 0 : n;   /* 0: the param stride, n here */
      st = muon_add_matrix(x->opt, &m, &x->first[t]);
    } else {
      muon_adamw_param a = muon_default_adamw_param();
      a.name = s->name;
      a.param = w;
      a.param_dtype = bf16 ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
      a.size = x->len[t];
      a.offset = lo;
      a.full_size = x->mode == M_DDP ? 0 : n;   /* DDP: whole, so muon_auto_config makes it Partial */
      a.mirror = mirror;
      a.grad = g;
      a.grad_dtype = MUON_DTYPE_BF16;
      if (!x->separate) {
        a.count = s->layers;
        a.stride = bf16 ? n : 0;
        a.mirror_stride = n;
        a.grad_stride = bf16 ? 0 : n;   /* 0: the param stride, n here */
        st = muon_add_adamw_param(x->opt, &a, &x->first[t]);
      } else {
        const char *base = (const char *)w;
        size_t pstride = bf16 ? n * 2 : x->len[t] * sizeof(float);   /* bytes between pieces */
        for (l = 0, st = MUON_OK; l < s->layers && st == MUON_OK; l++) {
          char name[32];
          muon_adamw_param q = a;
          snprintf(name, sizeof name, s->layers > 1 ? "%s[%d]" : "%s", s->name, l);
          q.name = name;
          q.param = (void *)(base + (size_t)l * pstride);
          q.mirror = mirror ? (uint16_t *)mirror + (size_t)l * n : NULL;
          q.grad = g ? (const uint16_t *)g + (size_t)l * n : NULL;
          st = muon_add_adamw_param(x->opt, &q, l ? NULL : &x->first[t]);
        }
      }
    }
    if (st != MUON_OK) return st;
  }
  return MUON_OK;
}

/* The first backward allocates the gradients; each fills them for `step`. ZeRO-1: only this
   rank's chunks are meaningful (after llm.c's reduce-scatter), NaN elsewhere. M_DDP: this rank's
   part, g / 2^(r+1) (the last rank g / 2^(P-1)): their sum is g exactly in any order. */
static void trainer_backward(trainer *x, int step) {
  uint16_t *h = (uint16_t *)malloc(x->N * 2);
  int t, l, P = x->mode == M_DDP && x->dist ? W.size : 1, r = x->mode == M_DDP && x->dist ? W.rank : 0;
  float part = ldexpf(1.0f, -(r < P - 1 ? r + 1 : P - 1));
  size_t k;
  if (!h) ex_die(&W, "malloc", "gradients");
  if (!x->grads) x->grads = (uint16_t *)dev_alloc(x->N * 2);
  for (t = 0; t < NT; t++)
    for (l = 0; l < T[t].layers; l++)
      for (k = 0; k < x->n[t]; k++) {
        size_t e = (size_t)l * x->n[t] + k;
        int mine = k >= x->lo[t] && k < x->lo[t] + x->len[t];
        h[x->off[t] + e] = !mine ? (uint16_t)0x7fc0u : to_bf16(from_bf16(grad_bf16(t, step, e)) * part);
      }
  to_dev(x->grads, h, x->N * 2);
  free(h);
}

static void trainer_free(trainer *x) {
  muon_destroy(x->opt);
  dev_free(x->master);
  dev_free(x->params);
  dev_free(x->grads);
  memset(x, 0, sizeof *x);
}

/* Whether x's chunks (master and bf16) equal the single device's; the first difference printed. */
static int same_as(const trainer *x, const trainer *ref, const char *what) {
  float *m = (float *)malloc(x->NM * sizeof *m + 1), *rm = (float *)malloc(ref->NM * sizeof *rm + 1);
  uint16_t *p = (uint16_t *)malloc(x->N * 2), *rp = (uint16_t *)malloc(ref->N * 2);
  int t, l, bad = 0;
  size_t k;
  if (!m || !rm || !p || !rp) ex_die(&W, "malloc", "compare");
  from_dev(p, x->params, x->N * 2);
  from_dev(rp, ref->params, ref->N * 2);
  if (x->master) from_dev(m, x->master, x->NM * sizeof *m);
  if (ref->master) from_dev(rm, ref->master, ref->NM * sizeof *rm);
  for (t = 0; t < NT && !bad; t++)
    for (l = 0; l < T[t].layers && !bad; l++)
      for (k = x->lo[t]; k < x->lo[t] + x->len[t] && !bad; k++) {
        size_t e = (size_t)l * x->n[t] + k, i = x->moff[t] + (size_t)l * x->len[t] + k - x->lo[t];
        if (p[x->off[t] + e] != rp[ref->off[t] + e]) {
          printf("  rank %d, %s: %s[%d] element %zu: bf16 %04x, one device %04x\n", W.rank, what, T[t].name, l, k,
                 p[x->off[t] + e], rp[ref->off[t] + e]);
          bad = 1;
        } else if (x->master && memcmp(&m[i], &rm[ref->moff[t] + e], sizeof(float))) {
          printf("  rank %d, %s: %s[%d] element %zu: master %.9g, one device %.9g\n", W.rank, what, T[t].name, l, k,
                 m[i], rm[ref->moff[t] + e]);
          bad = 1;
        }
      }
  free(m);
  free(rm);
  free(p);
  free(rp);
  return !bad;
}

/* Copies the single device's weights into x's chunks (a trainer loading its model checkpoint). */
static void load_weights(trainer *x, const trainer *ref) {
  float *m = (float *)malloc(x->NM * sizeof *m + 1), *rm = (float *)malloc(ref->NM * sizeof *rm + 1);
  uint16_t *p = (uint16_t *)malloc(x->N * 2);
  int t, l;
  size_t k;
  if (!m || !rm || !p) ex_die(&W, "malloc", "weights");
  from_dev(p, ref->params, x->N * 2);
  to_dev(x->params, p, x->N * 2);
  if (x->master) {
    from_dev(rm, ref->master, ref->NM * sizeof *rm);
    for (t = 0; t < NT; t++)
      for (l = 0; l < T[t].layers; l++)
        for (k = 0; k < x->len[t]; k++)
          m[x->moff[t] + (size_t)l * x->len[t] + k] = rm[ref->moff[t] + (size_t)l * x->n[t] + x->lo[t] + k];
    to_dev(x->master, m, x->NM * sizeof *m);
  }
  free(m);
  free(rm);
  free(p);
}

/* MuonClip after the step, as llm.c would call it: qkvw[l] fused (rows q | k | v), 2 heads of 4;
   each rank saw head h of layer l at this step only where (h + l + step) % P == rank (-INFINITY
   elsewhere), the one device saw them all. */
static muon_status clip_step(trainer *x, int step, int full) {
  enum { NH = 2 };
  muon_qk_clip_layer y[L];
  float S[L][NH];
  char names[L][16];
  muon_qk_clip_desc d = muon_default_qk_clip_desc();
  int l, h;
  for (l = 0; l < L; l++) {
    for (h = 0; h < NH; h++) {
      int seen = full || !x->dist || (h + l + step) % W.size == W.rank;
      S[l][h] = seen ? 2.0f + 1.5f * ex_value(4242u + (unsigned)step, l * NH + h) : -INFINITY;
    }
    snprintf(names[l], sizeof names[l], "qkvw[%d]", l);
    memset(&y[l], 0, sizeof y[l]);
    y[l].q = y[l].k = names[l];
    y[l].k_row = C;
    y[l].n_heads = NH;
    y[l].head_dim = C / NH;
    y[l].max_logits = S[l];
  }
  muon_status st;
  int clipped = 0;
  d.tau = 2.0f;
  d.layers = y;
  d.n_layers = L;
  st = muon_qk_clip(x->opt, &d, &clipped);
  CHECK(st != MUON_OK || clipped > 0, "step %d: no head over tau: the clip is not exercised", step);
  return st;
}

/* One step of both, from the same gradients, and the clip; then the check. */
static int step_both(trainer *x, trainer *ref, int step, const char *what) {
  muon_status st, sr;
  char label[96];
  trainer_backward(x, step);
  trainer_backward(ref, step);
  st = muon_step(x->opt);
  sr = muon_step(ref->opt);
  if (st == MUON_OK && sr == MUON_OK) {
    st = clip_step(x, step, 0);
    sr = clip_step(ref, step, 1);
  }
  CHECK(st == MUON_OK && sr == MUON_OK, "%s, step %d: %s / one device: %s", what, step, muon_error(x->opt),
        muon_error(ref->opt));
  snprintf(label, sizeof label, "%s, after step %d", what, step);
  return st == MUON_OK && sr == MUON_OK && same_as(x, ref, label);
}

static int ok_all(int ok) { return min_all(ok) == 1; }

/* ---- the cases -------------------------------------------------------------------------------- */
static void test_after_backward(int mode, const char *name) {
  trainer x, ref;
  int s, ok = 1;
  TEST_CASE(name);
  trainer_init(&x, mode, 1, 0);
  trainer_init(&ref, mode == M_DDP ? M_MASTER : mode, 0, 1);
  trainer_backward(&x, 0);   /* llm.c: the first backward allocates the gradients; register after it */
  trainer_backward(&ref, 0);
  CHECK(trainer_register(&x) == MUON_OK, "register: %s", muon_error(x.opt));
  CHECK(trainer_register(&ref) == MUON_OK, "register the one device: %s", muon_error(ref.opt));
  CHECK(muon_matrix_count(x.opt) == 4 * L && muon_adamw_param_count(x.opt) == 8 * L + 4,
        "%d matrices, %d AdamW params", muon_matrix_count(x.opt), muon_adamw_param_count(x.opt));
  for (s = 0; s < 3 && ok; s++) ok = step_both(&x, &ref, s, name);
  CHECK(ok_all(ok), "not bitwise one device's on every rank");
  trainer_free(&x);
  trainer_free(&ref);
}

static void test_bind_after(void) {
  trainer x, ref;
  muon_status st;
  int t, l, s, ok = 1;
  TEST_CASE("registered before the first backward, gradients bound after it");
  trainer_init(&x, M_MASTER, 1, 0);
  trainer_init(&ref, M_MASTER, 0, 1);
  CHECK(trainer_register(&x) == MUON_OK, "register: %s", muon_error(x.opt));
  st = muon_step(x.opt);
  CHECK(st == MUON_ERR_ARG && strstr(muon_error(x.opt), "'qkvw[0]'") && same_all(st),
        "unbound: %s, '%s'", muon_status_string(st), muon_error(x.opt));
  trainer_backward(&x, 0);
  for (t = 0; t < NT; t++)
    if (T[t].muon)
      for (l = 0; l < T[t].layers; l++)
        CHECK(muon_set_grad(x.opt, x.first[t] + l, x.grads + x.off[t] + (size_t)l * x.n[t] + x.lo[t]) == MUON_OK,
              "muon_set_grad");
  st = muon_step(x.opt);
  CHECK(st == MUON_ERR_ARG && strstr(muon_error(x.opt), "'wte'") && same_all(st), "matrices bound: %s, '%s'",
        muon_status_string(st), muon_error(x.opt));
  for (t = 0; t < NT; t++)
    if (!T[t].muon)
      for (l = 0; l < T[t].layers; l++)
        CHECK(muon_set_adamw_grad(x.opt, x.first[t] + l, x.grads + x.off[t] + (size_t)l * x.n[t] + x.lo[t]) ==
                  MUON_OK, "muon_set_adamw_grad");
  CHECK(ok_all(same_as(&x, &ref, "after the refused steps")), "a refused step changed something");
  trainer_backward(&ref, 0);
  CHECK(trainer_register(&ref) == MUON_OK, "register the one device: %s", muon_error(ref.opt));
  for (s = 0; s < 3 && ok; s++) ok = step_both(&x, &ref, s, "bound after");
  CHECK(ok_all(ok), "not bitwise one device's on every rank");
  trainer_free(&x);
  trainer_free(&ref);
}

/* Gathers every rank's blob to every rank: blobs[r], sizes[r]. */
static void gather_blobs(muon_optimizer *opt, unsigned char **blobs, size_t *sizes) {
  long long n = (long long)muon_state_size(opt), mx = max_all(n), all[64];
  unsigned char *mine = (unsigned char *)calloc((size_t)mx, 1), *every = (unsigned char *)malloc((size_t)mx * W.size);
  int r;
  if (!mine || !every) ex_die(&W, "malloc", "blobs");
  CHECK(muon_state_save(opt, mine, (size_t)n) == MUON_OK, "save: %s", muon_error(opt));
  W.world.vt->allgather(W.world.ctx, &n, all, sizeof n);
  W.world.vt->allgather(W.world.ctx, mine, every, (size_t)mx);
  for (r = 0; r < W.size; r++) {
    blobs[r] = (unsigned char *)malloc((size_t)all[r]);
    if (!blobs[r]) ex_die(&W, "malloc", "blob");
    memcpy(blobs[r], every + (size_t)r * (size_t)mx, (size_t)all[r]);
    sizes[r] = (size_t)all[r];
  }
  free(mine);
  free(every);
}

/* Two steps, then one of: resume (this rank's own blob into new optimizers), reshard from one
   device (the single device's blob on every rank), reshard to one device (every rank's blob
   into a single-device optimizer of stacks); then two more steps, against the single device
   that never stopped. */
enum { R_RESUME, R_FROM_ONE, R_TO_ONE };
static void test_restart(int mode, int how, const char *name) {
  trainer x, ref, y;
  unsigned char *blobs[64];
  size_t sizes[64];
  int s, r, ok = 1;
  muon_status st = MUON_OK;
  TEST_CASE(name);
  trainer_init(&x, mode, 1, 0);
  trainer_init(&ref, mode, 0, 1);
  trainer_backward(&x, 0);
  trainer_backward(&ref, 0);
  CHECK(trainer_register(&x) == MUON_OK && trainer_register(&ref) == MUON_OK, "register: %s", muon_error(x.opt));
  for (s = 0; s < 2 && ok; s++) ok = step_both(&x, &ref, s, name);
  if (how == R_FROM_ONE) {
    size_t n = muon_state_size(ref.opt);
    blobs[0] = (unsigned char *)malloc(n);
    if (!blobs[0]) ex_die(&W, "malloc", "blob");
    CHECK(muon_state_save(ref.opt, blobs[0], n) == MUON_OK, "save: %s", muon_error(ref.opt));
    sizes[0] = n;
  } else {
    gather_blobs(x.opt, blobs, sizes);
  }
  /* the new run: its trainer loads the weights of step 2, then the optimizer state */
  trainer_init(&y, mode, how != R_TO_ONE, 0);
  load_weights(&y, &ref);
  trainer_backward(&y, 0);
  CHECK(trainer_register(&y) == MUON_OK, "register again: %s", muon_error(y.opt));
  if (how == R_RESUME) st = muon_state_load(y.opt, blobs[W.rank], sizes[W.rank]);
  else if (how == R_FROM_ONE) st = muon_state_reshard(y.opt, (const void *const *)blobs, sizes, 1);
  else st = muon_state_reshard(y.opt, (const void *const *)blobs, sizes, W.size);
  CHECK(st == MUON_OK, "load: %s", muon_error(y.opt));
  for (s = 2; s < 4 && ok && st == MUON_OK; s++) ok = step_both(&y, &ref, s, name);
  CHECK(ok_all(ok && st == MUON_OK), "not bitwise the uninterrupted one device's on every rank");
  for (r = 0; r < (how == R_FROM_ONE ? 1 : W.size); r++) free(blobs[r]);
  trainer_free(&x);
  trainer_free(&y);
  trainer_free(&ref);
}

int main(int argc, char **argv) {
  int rc;
  W = ex_init(argc, argv);
  if (W.size > 64) ex_die(&W, "test_llmc", "at most 64 ranks");
  test_after_backward(M_MASTER, "ZeRO-1, fp32 master + bf16 weights and grads, registered after the first backward");
  test_bind_after();
  test_restart(M_MASTER, R_RESUME, "resume: own checkpoint at step 2, two more steps");
  test_restart(M_MASTER, R_FROM_ONE, "reshard from one device at step 2, two more steps");
  test_restart(M_MASTER, R_TO_ONE, "reshard every rank's checkpoint to one device of stacks, two more steps");
  test_after_backward(M_SR, "stochastic rounding into bf16 weights, ZeRO-1: one device's random bits");
  test_restart(M_SR, R_RESUME, "stochastic rounding: resume at step 2");
  test_after_backward(M_DDP, "DDP without the all-reduce: Partial matrix and AdamW stacks");
  if (W.rank == 0) rc = test_summary();
  else { test__end_case(); rc = test__failed ? 1 : 0; }
  ex_compute_done();
  muon_comm_destroy(&W.world);
  return rc;
}
