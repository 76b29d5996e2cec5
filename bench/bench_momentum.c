/* bench_momentum.c - what each momentum format (muon_hparams.momentum_format) costs and keeps.

   1. Memory: the momentum bytes per rank on GPT-2 small's Muon matrices (12 layers of attn.q, k,
      v, o 768x768, mlp.fc 3072x768, mlp.proj 768x3072, as bench_dist), for each format. One
      layer is registered on one device and its muon_stats.state_bytes read (the allocation
      itself); the 12 layers are 12 times that, and a rank of P under FSDP holds 1/P of every
      matrix (the momentum is per element of its piece; 768 divides by every P printed). 8-bit
      momentum lives whole on each matrix's owner instead: a rank holds 1/P of the matrices,
      the same bytes when owners balance, as these 72 do (24 of 3072x768, 48 of 768x768).
   2. Quality: a small network trained with each format on the same data, the CPU backend: the
      MLP of examples/single.c (32 -> 64 -> 64 -> 10, tanh, softmax cross-entropy, labels from a
      random teacher), N steps, then its loss on 4096 held-out samples. Not a transformer: a
      stand-in for "a tiny GPT-like training" (muon sees only its 2-D weights either way).
      bf16 must stay within 1 % of fp32's loss, 8-bit blockwise within 2 % (the program exits 1
      otherwise).

   usage: bench_momentum [--steps N] */
#define MUON_IMPLEMENTATION
#include "muon.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) { return (double)clock() / CLOCKS_PER_SEC; }   /* CPU seconds */

enum { IN = 32, H = 64, OUT = 10, BATCH = 64, EVAL = 4096 };

static unsigned rng;
static float frand(void) {
  rng = rng * 1664525u + 1013904223u;
  return (float)((rng >> 8) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

typedef struct { float w1[H * IN], b1[H], w2[H * H], b2[H], w3[OUT * H], b3[OUT]; } mlp;

static void init(mlp *m, float scale) {
  int i;
  for (i = 0; i < H * IN; i++) m->w1[i] = frand() * scale / sqrtf(IN);
  for (i = 0; i < H * H; i++) m->w2[i] = frand() * scale / sqrtf(H);
  for (i = 0; i < OUT * H; i++) m->w3[i] = frand() * scale / sqrtf(H);
  memset(m->b1, 0, sizeof m->b1); memset(m->b2, 0, sizeof m->b2); memset(m->b3, 0, sizeof m->b3);
}

static void linear(const float *w, const float *b, const float *x, float *y, int n_out, int n_in, int act) {
  int o, i;
  for (o = 0; o < n_out; o++) {
    float s = b[o];
    for (i = 0; i < n_in; i++) s += w[o * n_in + i] * x[i];
    y[o] = act ? tanhf(s) : s;
  }
}

static int argmax(const float *x, int n) {
  int i, k = 0;
  for (i = 1; i < n; i++) if (x[i] > x[k]) k = i;
  return k;
}

static int label(const mlp *t, const float *x) {
  float h1[H], h2[H], z[OUT];
  linear(t->w1, t->b1, x, h1, H, IN, 1);
  linear(t->w2, t->b2, h1, h2, H, H, 1);
  linear(t->w3, t->b3, h2, z, OUT, H, 0);
  return argmax(z, OUT);
}

/* Mean cross-entropy over n samples; with g, the mean gradients too (examples/single.c's). */
static double batch(const mlp *m, mlp *g, const float *x, const int *y, int n) {
  double loss = 0;
  int k, o, i;
  if (g) memset(g, 0, sizeof *g);
  for (k = 0; k < n; k++) {
    const float *xn = x + (size_t)k * IN;
    float h1[H], h2[H], z[OUT], dz[OUT], dh2[H], dh1[H], mx, sum = 0;
    linear(m->w1, m->b1, xn, h1, H, IN, 1);
    linear(m->w2, m->b2, h1, h2, H, H, 1);
    linear(m->w3, m->b3, h2, z, OUT, H, 0);
    mx = z[argmax(z, OUT)];
    for (o = 0; o < OUT; o++) { dz[o] = expf(z[o] - mx); sum += dz[o]; }
    for (o = 0; o < OUT; o++) dz[o] /= sum;
    loss += -log((double)dz[y[k]] + 1e-12);
    if (!g) continue;
    dz[y[k]] -= 1.0f;
    for (o = 0; o < OUT; o++) dz[o] /= (float)n;
    for (i = 0; i < H; i++) dh2[i] = 0;
    for (o = 0; o < OUT; o++) {
      g->b3[o] += dz[o];
      for (i = 0; i < H; i++) { g->w3[o * H + i] += dz[o] * h2[i]; dh2[i] += dz[o] * m->w3[o * H + i]; }
    }
    for (i = 0; i < H; i++) { dh2[i] *= 1 - h2[i] * h2[i]; dh1[i] = 0; }
    for (o = 0; o < H; o++) {
      g->b2[o] += dh2[o];
      for (i = 0; i < H; i++) { g->w2[o * H + i] += dh2[o] * h1[i]; dh1[i] += dh2[o] * m->w2[o * H + i]; }
    }
    for (o = 0; o < H; o++) {
      float d = dh1[o] * (1 - h1[o] * h1[o]);
      g->b1[o] += d;
      for (i = 0; i < IN; i++) g->w1[o * IN + i] += d * xn[i];
    }
  }
  return loss / n;
}

/* N steps with the given format from the same start and data; the held-out loss after them. */
static double train(muon_momentum_format fmt, int steps) {
  static mlp teacher, model, grad;
  static float x[BATCH * IN], ex[EVAL * IN];
  static int y[BATCH], ey[EVAL];
  muon_desc desc = muon_default_desc();
  muon_optimizer *opt;
  float *ws[3] = { model.w1, model.w2, model.w3 }, *gws[3] = { grad.w1, grad.w2, grad.w3 };
  float *bs[3] = { model.b1, model.b2, model.b3 }, *gbs[3] = { grad.b1, grad.b2, grad.b3 };
  int rows[3] = { H, H, OUT }, cols[3] = { IN, H, H }, i, n, step;
  const char *names[3] = { "w1", "w2", "w3" };
  double loss;
  rng = 1;
  init(&teacher, 3.0f);
  init(&model, 1.0f);
  for (n = 0; n < EVAL; n++) {
    for (i = 0; i < IN; i++) ex[n * IN + i] = frand();
    ey[n] = label(&teacher, ex + n * IN);
  }
  desc.hparams.lr = 0.02f;
  desc.hparams.weight_decay = 0.01f;
  desc.hparams.momentum_format = fmt;
  desc.adamw.lr = 3e-3f;
  if (muon_create(&opt, &desc) != MUON_OK) { fprintf(stderr, "muon_create: %s\n", muon_error(NULL)); exit(1); }
  for (i = 0; i < 3; i++) {
    muon_matrix w = muon_default_matrix();
    muon_adamw_param b = muon_default_adamw_param();
    w.name = names[i]; w.param = ws[i]; w.grad = gws[i]; w.rows = rows[i]; w.cols = cols[i];
    b.name = names[i]; b.param = bs[i]; b.grad = gbs[i]; b.size = (size_t)rows[i];
    if (muon_add_matrix(opt, &w, NULL) != MUON_OK || muon_add_adamw_param(opt, &b, NULL) != MUON_OK) {
      fprintf(stderr, "%s\n", muon_error(opt));
      exit(1);
    }
  }
  for (step = 0; step < steps; step++) {
    for (n = 0; n < BATCH; n++) {
      for (i = 0; i < IN; i++) x[n * IN + i] = frand();
      y[n] = label(&teacher, x + n * IN);
    }
    batch(&model, &grad, x, y, BATCH);
    muon_set_lr(opt, 0, 0.02f * (1.0f - (float)step / (float)steps));
    if (muon_step(opt) != MUON_OK) { fprintf(stderr, "%s\n", muon_error(opt)); exit(1); }
  }
  loss = batch(&model, NULL, ex, ey, EVAL);
  muon_destroy(opt);
  return loss;
}

/* Momentum bytes of one GPT-2-small layer's six matrices, registered with the format. */
static size_t layer_state(muon_momentum_format fmt, float *param) {
  static const int dims[6][2] = { { 768, 768 }, { 768, 768 }, { 768, 768 }, { 768, 768 }, { 3072, 768 }, { 768, 3072 } };
  muon_desc desc = muon_default_desc();
  muon_optimizer *opt;
  muon_stats st;
  size_t at = 0;
  int i;
  desc.hparams.momentum_format = fmt;
  if (muon_create(&opt, &desc) != MUON_OK) exit(1);
  for (i = 0; i < 6; i++) {
    muon_matrix m = muon_default_matrix();
    m.param = param + at; m.rows = dims[i][0]; m.cols = dims[i][1];
    at += (size_t)m.rows * (size_t)m.cols;
    if (muon_add_matrix(opt, &m, NULL) != MUON_OK) { fprintf(stderr, "%s\n", muon_error(opt)); exit(1); }
  }
  muon_get_stats(opt, &st);
  muon_destroy(opt);
  return st.state_bytes;
}

int main(int argc, char **argv) {
  static const char *fmt_name[3] = { "fp32", "bf16", "int8" };
  static const double bound[3] = { 0, 0.01, 0.02 };
  int steps = 1000, f, p, i, ok = 1;
  size_t layer[3];
  double loss[3], t0;
  float *param = (float *)calloc((size_t)7077888, sizeof(float));   /* one layer's elements */
  for (i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
  if (!param || steps < 1) return 2;
  printf("bench_momentum: momentum bytes per rank, GPT-2 small's 72 Muon matrices (12 layers, 84.9M elements)\n");
  printf("  %-6s %12s %12s %12s %12s\n", "format", "1 rank", "2 ranks", "4 ranks", "8 ranks");
  for (f = 0; f < 3; f++) {
    layer[f] = layer_state((muon_momentum_format)f, param);
    printf("  %-6s", fmt_name[f]);
    for (p = 1; p <= 8; p *= 2) printf(" %9.1f MiB", 12.0 * (double)layer[f] / p / 1048576.0);
    printf("\n");
  }
  printf("  bf16 / fp32 = %.3f; int8 (8-bit blockwise, 256 per block) / fp32 = %.3f\n",
         (double)layer[1] / (double)layer[0], (double)layer[2] / (double)layer[0]);
  free(param);
  for (f = 0; f < 3; f++) {
    t0 = now_s();
    loss[f] = train((muon_momentum_format)f, steps);
    printf("quality: %s momentum, N = %d steps: held-out loss %.5f (%.1f s)\n", fmt_name[f], steps, loss[f],
           now_s() - t0);
  }
  for (f = 1; f < 3; f++) {
    int in = fabs(loss[f] - loss[0]) <= bound[f] * loss[0];
    printf("quality: %s vs fp32 %+.3f %% (bound %.0f %%): %s\n", fmt_name[f], 100.0 * (loss[f] - loss[0]) / loss[0],
           100.0 * bound[f], in ? "within" : "OUTSIDE");
    ok &= in;
  }
  return ok ? 0 : 1;
}
