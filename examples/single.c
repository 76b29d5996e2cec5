/* single.c - a small MLP trained with Muon (weight matrices) and AdamW (biases) on one device.

   The data: inputs x ~ U(-1, 1)^32, labels from a fixed random "teacher" MLP, 10 classes.
   The model: 32 -> 64 -> 64 -> 10 with tanh, softmax cross-entropy.
   Build and run: make demo   (or: cc -std=c99 -O2 -I. examples/single.c -lm && ./a.out) */
#define MUON_IMPLEMENTATION
#include "muon.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { IN = 32, H = 64, OUT = 10, BATCH = 64, STEPS = 300 };

static unsigned rng = 1;
static float frand(void) { /* U(-1, 1) */
  rng = rng * 1664525u + 1013904223u;
  return (float)((rng >> 8) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

typedef struct {
  float w1[H * IN], b1[H], w2[H * H], b2[H], w3[OUT * H], b3[OUT];
} mlp;

static void init(mlp *m, float scale) {
  int i;
  for (i = 0; i < H * IN; i++) m->w1[i] = frand() * scale / sqrtf(IN);
  for (i = 0; i < H * H; i++) m->w2[i] = frand() * scale / sqrtf(H);
  for (i = 0; i < OUT * H; i++) m->w3[i] = frand() * scale / sqrtf(H);
  memset(m->b1, 0, sizeof m->b1); memset(m->b2, 0, sizeof m->b2); memset(m->b3, 0, sizeof m->b3);
}

/* y (n_out) = tanh?(W (n_out x n_in) x + b) */
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

/* Forward + backward over a batch; accumulates mean gradients into g; returns mean loss. */
static float train_batch(const mlp *m, mlp *g, const float *x, const int *y) {
  float loss = 0;
  int n, o, i;
  memset(g, 0, sizeof *g);
  for (n = 0; n < BATCH; n++) {
    const float *xn = x + n * IN;
    float h1[H], h2[H], z[OUT], dz[OUT], dh2[H], dh1[H], mx, sum = 0;
    linear(m->w1, m->b1, xn, h1, H, IN, 1);
    linear(m->w2, m->b2, h1, h2, H, H, 1);
    linear(m->w3, m->b3, h2, z, OUT, H, 0);
    mx = z[argmax(z, OUT)];
    for (o = 0; o < OUT; o++) { dz[o] = expf(z[o] - mx); sum += dz[o]; }
    for (o = 0; o < OUT; o++) dz[o] /= sum;
    loss += -logf(dz[y[n]] + 1e-12f);
    dz[y[n]] -= 1.0f;
    for (o = 0; o < OUT; o++) dz[o] /= BATCH;
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
  return loss / BATCH;
}

int main(void) {
  static mlp teacher, model, grad;
  static float x[BATCH * IN];
  int y[BATCH], step, n, i;
  float first = 0, loss = 0;
  muon_desc desc = muon_default_desc();
  muon_optimizer *opt;
  muon_matrix w = muon_default_matrix();
  muon_adamw_param b = muon_default_adamw_param();
  float *ws[3] = { model.w1, model.w2, model.w3 }, *gws[3] = { grad.w1, grad.w2, grad.w3 };
  float *bs[3] = { model.b1, model.b2, model.b3 }, *gbs[3] = { grad.b1, grad.b2, grad.b3 };
  int rows[3] = { H, H, OUT }, cols[3] = { IN, H, H };
  const char *names[3] = { "w1", "w2", "w3" };

  init(&teacher, 3.0f);
  init(&model, 1.0f);
  desc.hparams.lr = 0.02f;          /* Muon's usual lr; torch's default 1e-3 is for tiny steps */
  desc.hparams.weight_decay = 0.01f;
  desc.adamw.lr = 3e-3f;
  if (muon_create(&opt, &desc) != MUON_OK) { fprintf(stderr, "muon_create failed\n"); return 1; }
  for (i = 0; i < 3; i++) {
    w.name = names[i]; w.param = ws[i]; w.grad = gws[i]; w.rows = rows[i]; w.cols = cols[i];
    b.name = names[i]; b.param = bs[i]; b.grad = gbs[i]; b.size = (size_t)rows[i];
    if (muon_add_matrix(opt, &w, NULL) != MUON_OK || muon_add_adamw_param(opt, &b, NULL) != MUON_OK) {
      fprintf(stderr, "%s\n", muon_error(opt));
      return 1;
    }
  }

  for (step = 0; step < STEPS; step++) {
    for (n = 0; n < BATCH; n++) {           /* a fresh batch labelled by the teacher */
      float h1[H], h2[H], z[OUT];
      for (i = 0; i < IN; i++) x[n * IN + i] = frand();
      linear(teacher.w1, teacher.b1, x + n * IN, h1, H, IN, 1);
      linear(teacher.w2, teacher.b2, h1, h2, H, H, 1);
      linear(teacher.w3, teacher.b3, h2, z, OUT, H, 0);
      y[n] = argmax(z, OUT);
    }
    loss = train_batch(&model, &grad, x, y);
    muon_set_lr(opt, 0, 0.02f * (1.0f - (float)step / STEPS));   /* linear decay: lr may change every step */
    if (step == 0) first = loss;
    if (muon_step(opt) != MUON_OK) { fprintf(stderr, "%s\n", muon_error(opt)); return 1; }
    if (step % 25 == 0 || step == STEPS - 1) printf("step %3d  loss %.4f\n", step, loss);
  }
  muon_destroy(opt);
  printf("loss %.4f -> %.4f: %s\n", first, loss, loss < 0.6f * first ? "falls" : "DOES NOT FALL");
  return loss < 0.6f * first ? 0 : 1;
}
