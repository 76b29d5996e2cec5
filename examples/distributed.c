/* distributed.c - Muon over Gloo in one file: three matrices sharded FSDP-style (SHARD(0): rows
   split torch.chunk-style over every rank), trained for a few steps, and every rank's piece
   checked bit for bit against a one-device optimizer run in the same process on the full
   matrices. Everything is deterministic, so every rank builds the same full matrices.
   Build and run: make test-examples, or
     g++ -std=c++17 -I. -c examples/muon_gloo.cpp -o muon_gloo.o
     cc -std=c99 -I. examples/distributed.c muon_gloo.o -o distributed -lgloo -lstdc++ -pthread -lm
     build/muonrun -n 4 ./distributed */
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "muon_gloo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 3, STEPS = 5 };
static const int ROWS[N] = { 64, 18, 96 }, COLS[N] = { 32, 48, 64 };   /* 18 rows: uneven pieces */

static float value(unsigned seed, long i) {   /* U(-1, 1) from (seed, i): the same on every rank */
  unsigned x = seed * 2654435761u ^ (unsigned)i * 2246822519u;
  x ^= x >> 15; x *= 0x2c1b3c6du; x ^= x >> 12; x *= 0x297a2d39u; x ^= x >> 15;
  return (float)(x & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

int main(void) {
  muon_gloo_desc gd = muon_gloo_default_desc();   /* rank, size and store from muonrun's environment */
  muon_comm world;
  muon_auto_desc ad;
  muon_dist_config cfg;
  muon_desc desc = muon_default_desc(), one = muon_default_desc();
  muon_optimizer *opt, *ref;
  float *full_w[N], *full_g[N], *w[N], *g[N];
  long lo[N], rows[N], e, bad = 0, *all;
  int i, t, r, failed = 0;

  if (muon_gloo_create(&world, &gd) != MUON_OK) { fprintf(stderr, "%s\n", muon_error(NULL)); return 1; }
  memset(&ad, 0, sizeof ad);
  ad.fsdp = &world;                             /* every matrix SHARD(0) over every rank */
  cfg = muon_auto_config(&ad);
  desc.hparams.lr = one.hparams.lr = 0.02f;
  desc.comm = &world;
  desc.dist = &cfg;
  if (muon_create(&opt, &desc) != MUON_OK || muon_create(&ref, &one) != MUON_OK) { fprintf(stderr, "muon_create failed\n"); return 1; }
  for (i = 0; i < N; i++) {
    long c = (ROWS[i] + world.size - 1) / world.size, n = (long)ROWS[i] * COLS[i];   /* torch.chunk */
    muon_matrix m = muon_default_matrix(), f = muon_default_matrix();
    lo[i] = world.rank * c < ROWS[i] ? world.rank * c : ROWS[i];
    rows[i] = lo[i] + c < ROWS[i] ? c : ROWS[i] - lo[i];
    full_w[i] = (float *)malloc((size_t)n * sizeof(float));
    full_g[i] = (float *)malloc((size_t)n * sizeof(float));
    w[i] = (float *)malloc((size_t)(rows[i] * COLS[i] + 1) * sizeof(float));
    g[i] = (float *)malloc((size_t)(rows[i] * COLS[i] + 1) * sizeof(float));
    for (e = 0; e < n; e++) full_w[i][e] = 0.1f * value(11u + (unsigned)i, e);
    memcpy(w[i], full_w[i] + lo[i] * COLS[i], (size_t)(rows[i] * COLS[i]) * sizeof(float));
    f.name = m.name = i == 0 ? "attn" : i == 1 ? "head" : "mlp";
    f.rows = m.rows = ROWS[i]; f.cols = m.cols = COLS[i];   /* the full shape; param/grad: the piece */
    m.param = w[i]; m.grad = g[i];
    f.param = full_w[i]; f.grad = full_g[i];
    if (muon_add_matrix(opt, &m, NULL) != MUON_OK) { fprintf(stderr, "%s\n", muon_error(opt)); return 1; }
    if (muon_add_matrix(ref, &f, NULL) != MUON_OK) { fprintf(stderr, "%s\n", muon_error(ref)); return 1; }
  }
  for (t = 0; t < STEPS; t++) {   /* loss 1/2 |W - T|^2 + noise: each rank computes its piece's gradient */
    for (i = 0; i < N; i++) {
      unsigned seed = 100u * (unsigned)(t + 1) + (unsigned)i;
      for (e = 0; e < (long)ROWS[i] * COLS[i]; e++) full_g[i][e] = full_w[i][e] - value(7u, e) + 0.1f * value(seed, e);
      for (e = 0; e < rows[i] * COLS[i]; e++) {
        long at = lo[i] * COLS[i] + e;
        g[i][e] = w[i][e] - value(7u, at) + 0.1f * value(seed, at);
      }
    }
    if (muon_step(opt) != MUON_OK) { fprintf(stderr, "rank %d: %s\n", world.rank, muon_error(opt)); return 1; }
    if (muon_step(ref) != MUON_OK) { fprintf(stderr, "reference: %s\n", muon_error(ref)); return 1; }
  }
  for (i = 0; i < N; i++)   /* this rank's piece against the same rows of the one-device run */
    bad += memcmp(w[i], full_w[i] + lo[i] * COLS[i], (size_t)(rows[i] * COLS[i]) * sizeof(float)) != 0;
  all = (long *)malloc((size_t)world.size * sizeof *all);
  if (world.vt->allgather(world.ctx, &bad, all, sizeof bad) != MUON_OK) { fprintf(stderr, "allgather failed\n"); return 1; }
  for (r = 0; r < world.size; r++) failed |= all[r] != 0;
  if (world.rank == 0) {
    printf("%d ranks, %d steps: every piece %s the one-device run\n", world.size, STEPS, failed ? "is NOT bitwise equal to" : "bitwise equal to");
    printf("distributed: %d passed, %d failed\n", !failed, failed);
  }
  muon_destroy(opt); muon_destroy(ref); muon_comm_destroy(&world);
  for (i = 0; i < N; i++) { free(full_w[i]); free(full_g[i]); free(w[i]); free(g[i]); }
  free(all);
  return failed;
}
