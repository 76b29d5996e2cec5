/* bench_partial.c - DDP with unreduced gradients: muon's Partial placement against the usual
   all-reduce, then muon. Every rank holds every parameter whole (GPT-2-small layers' matrices,
   and for AdamW an embedding of 4096 x 768 and two norms per layer) and computes its own part
   of each gradient. Both configurations run in the same launch on the same data:

     allreduce  what a DDP trainer does today: it all-reduces the gradients itself (here a
                reduce-scatter by alltoallv, the parts summed in rank order, then an allgather of
                the sums: the 2(P-1)/P S bytes of a ring all-reduce), then muon with REPLICATE
                over the world (muon_auto_desc.ddp) orthogonalises each matrix once and sends O
                to the others: (P-1)/P S more.
     partial    muon_auto_desc.partial = 1: the trainer drops its all-reduce; each part goes to
                the matrix's owner, which sums them in rank order, and O comes back; AdamW
                params are reduce-scattered, updated ZeRO-1 style and all-gathered: 2(P-1)/P S
                in all. Momentum and AdamW moments are held once (1/P of them per rank).

   Per configuration: step time (median over --steps of the slowest rank, the all-reduce
   included where there is one), bytes sent per rank per step (the all-reduce's counted here as
   the data each rank must deliver, muon's from muon_stats), optimizer state held per rank
   (muon_stats.state_bytes: momentum and AdamW moments). Bytes are checked against the formulas and
   the two runs' parameters must be bitwise equal (the same sums in the same order).

   usage: bench_partial [--layers N] [--steps N] [--warmup N]   (under muonrun -n P) */
#define _POSIX_C_SOURCE 200809L
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "bench.h"
#include "muon_gloo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STEPS 32

typedef struct bench {
  muon_comm world;
  int rank, P, n, steps, warmup;
  int *rows, *cols;
  size_t total;                 /* elements of all matrices, then of the AdamW params */
  size_t matrices;              /* of which matrices */
  int n_aw;
  size_t *aw_size;
  float *w, *g, *sum;           /* params, this rank's gradient part, the all-reduced sum */
  float *send, *recv;           /* the all-reduce's buffers */
  size_t *counts;
} bench;

static void die(const bench *b, const char *what, const char *why) {
  fprintf(stderr, "rank %d: %s: %s\n", b->rank, what, why);
  exit(1);
}

static float value(unsigned seed, size_t i) {
  unsigned x = seed ^ (unsigned)(i * 2654435761u);
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return (float)(x >> 8) / 16777216.0f - 0.5f;
}

static double slowest(bench *b, double t) {
  double *all = (double *)malloc((size_t)b->P * sizeof(double)), m = 0;
  int r;
  if (b->world.vt->allgather(b->world.ctx, &t, all, sizeof t) != MUON_OK) die(b, "allgather", "time");
  for (r = 0; r < b->P; r++) if (all[r] > m) m = all[r];
  free(all);
  return m;
}

/* The trainer's all-reduce: chunk j of the flat gradient goes to rank j (alltoallv), which sums
   the P parts in rank order, and the sums are allgathered. Returns the bytes this rank sent. */
static long long allreduce(bench *b) {
  size_t c = (b->total + (size_t)b->P - 1) / (size_t)b->P, *cnt = b->counts, *dsp = cnt + b->P, *rc = dsp + b->P, *rd = rc + b->P, e;
  int r;
  long long sent = 0;
  for (r = 0; r < b->P; r++) {
    size_t lo = (size_t)r * c < b->total ? (size_t)r * c : b->total, hi = lo + c < b->total ? lo + c : b->total;
    cnt[r] = hi - lo; dsp[r] = lo;
    rc[r] = b->rank * c < b->total ? (b->rank * c + c < b->total ? c : b->total - (size_t)b->rank * c) : 0;
    rd[r] = (size_t)r * c;
    if (r != b->rank) sent += (long long)cnt[r] * 4;
  }
  if (muon_comm_alltoallv(&b->world, b->g, cnt, dsp, b->recv, rc, rd) != MUON_OK) die(b, "alltoallv", "reduce-scatter");
  for (e = 0; e < rc[0]; e++) {
    float s = b->recv[e];
    for (r = 1; r < b->P; r++) s = s + b->recv[(size_t)r * c + e];
    b->send[e] = s;
  }
  if (b->world.vt->allgather(b->world.ctx, b->send, b->sum, c * sizeof(float)) != MUON_OK) die(b, "allgather", "all-reduce");
  return sent + (long long)(b->P - 1) * (long long)rc[0] * 4;
}

/* One configuration; returns the median step time, fills bytes/momentum and a hash of the
   parameters after the run. */
static double run(bench *b, int partial, double *bytes, double *momentum, unsigned long long *hash) {
  muon_desc desc = muon_default_desc();
  muon_auto_desc ad;
  muon_dist_config dc;
  muon_optimizer *opt;
  muon_stats s0, s1;
  double t[MAX_STEPS];
  size_t off = 0, e;
  long long ar = 0;
  int k, s;
  for (e = 0; e < b->total; e++) b->w[e] = 0.02f * value(7u, e);
  memset(&ad, 0, sizeof ad);
  ad.ddp = &b->world;
  ad.partial = partial;
  dc = muon_auto_config(&ad);
  desc.comm = &b->world;
  desc.dist = &dc;
  desc.hparams.lr = 0.02f;
  if (muon_create(&opt, &desc) != MUON_OK) die(b, "muon_create", "failed");
  for (k = 0; k < b->n; k++) {
    muon_matrix m = muon_default_matrix();
    char name[32];
    snprintf(name, sizeof name, "m%d", k);
    m.name = name; m.rows = b->rows[k]; m.cols = b->cols[k];
    m.param = b->w + off;
    m.grad = (partial ? b->g : b->sum) + off;
    if (muon_add_matrix(opt, &m, NULL) != MUON_OK) die(b, "muon_add_matrix", muon_error(opt));
    off += (size_t)b->rows[k] * b->cols[k];
  }
  for (k = 0; k < b->n_aw; k++) {
    muon_adamw_param p = muon_default_adamw_param();
    char name[32];
    snprintf(name, sizeof name, "a%d", k);
    p.name = name; p.size = b->aw_size[k];
    p.param = b->w + off;
    p.grad = (partial ? b->g : b->sum) + off;
    if (muon_add_adamw_param(opt, &p, NULL) != MUON_OK) die(b, "muon_add_adamw_param", muon_error(opt));
    off += b->aw_size[k];
  }
  if (muon_plan(opt) != MUON_OK) die(b, "muon_plan", muon_error(opt));
  for (s = 0; s < b->warmup + b->steps; s++) {
    double t0;
    for (e = 0; e < b->total; e++) b->g[e] = value(1000u * (unsigned)s + (unsigned)b->rank, e);
    muon_get_stats(opt, &s0);
    t0 = now_s();
    if (!partial) ar = allreduce(b);
    if (muon_step(opt) != MUON_OK) die(b, "muon_step", muon_error(opt));
    t0 = slowest(b, now_s() - t0);
    muon_get_stats(opt, &s1);
    if (s >= b->warmup) t[s - b->warmup] = t0;
  }
  *bytes = (double)(s1.bytes_sent - s0.bytes_sent + ar);
  *momentum = (double)s1.state_bytes;
  for (e = 0, *hash = 1469598103934665603ull; e < b->total; e++) {
    unsigned u;
    memcpy(&u, &b->w[e], 4);
    *hash = (*hash ^ u) * 1099511628211ull;
  }
  muon_destroy(opt);
  return median(t, b->steps);
}

int main(int argc, char **argv) {
  bench b;
  muon_gloo_desc gd = muon_gloo_default_desc();
  int layers = 2, i, k;
  double t_ar, t_p, by_ar, by_p, mo_ar, mo_p, S, want_p, want_ar, *all;
  unsigned long long h_ar, h_p, hs[2];
  memset(&b, 0, sizeof b);
  b.steps = 5; b.warmup = 1;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) b.steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) b.warmup = atoi(argv[++i]);
    else { fprintf(stderr, "usage: %s [--layers N] [--steps N] [--warmup N]\n", argv[0]); return 2; }
  }
  if (b.steps < 1 || b.steps > MAX_STEPS || layers < 1) { fprintf(stderr, "--steps 1..%d, --layers >= 1\n", MAX_STEPS); return 2; }
  if (muon_gloo_create(&b.world, &gd) != MUON_OK) { fprintf(stderr, "%s\n", muon_error(NULL)); return 1; }
  b.rank = b.world.rank; b.P = b.world.size;
  b.n = 6 * layers;
  b.rows = (int *)malloc((size_t)b.n * sizeof(int));
  b.cols = (int *)malloc((size_t)b.n * sizeof(int));
  for (k = 0; k < b.n; k++) {   /* q, k, v, o 768x768; fc 3072x768; proj 768x3072 */
    b.rows[k] = k % 6 == 4 ? 3072 : 768;
    b.cols[k] = k % 6 == 5 ? 3072 : 768;
    b.total += (size_t)b.rows[k] * b.cols[k];
  }
  b.matrices = b.total;
  b.n_aw = 1 + 2 * layers;      /* an embedding, then ln_1 and ln_2 of each layer */
  b.aw_size = (size_t *)malloc((size_t)b.n_aw * sizeof(size_t));
  for (k = 0; k < b.n_aw; k++) { b.aw_size[k] = k ? 768 : 4096 * 768; b.total += b.aw_size[k]; }
  b.w = (float *)malloc(b.total * sizeof(float));
  b.g = (float *)malloc(b.total * sizeof(float));
  b.sum = (float *)malloc((b.total + (size_t)b.P) * sizeof(float));
  b.recv = (float *)malloc((b.total + (size_t)b.P) * sizeof(float));
  b.send = (float *)calloc(b.total / (size_t)b.P + 2, sizeof(float));
  b.counts = (size_t *)malloc(4 * (size_t)b.P * sizeof(size_t));
  t_ar = run(&b, 0, &by_ar, &mo_ar, &h_ar);
  t_p = run(&b, 1, &by_p, &mo_p, &h_p);
  all = (double *)malloc(2 * (size_t)b.P * sizeof(double));
  { double mine[2]; mine[0] = by_ar; mine[1] = by_p;
    if (b.world.vt->allgather(b.world.ctx, mine, all, sizeof mine) != MUON_OK) die(&b, "allgather", "bytes"); }
  for (i = 1, by_ar = all[0], by_p = all[1]; i < b.P; i++) { by_ar += all[2 * i]; by_p += all[2 * i + 1]; }
  by_ar /= b.P; by_p /= b.P;   /* mean over ranks */
  hs[0] = h_ar; hs[1] = h_p;
  if (b.rank == 0) {
    S = 4.0 * (double)b.total;
    want_p = 2.0 * (b.P - 1) / b.P * S;
    printf("bench_partial: DDP, %d ranks, %d matrices (%d GPT-2-small layers) and %d AdamW params, S = %.1f MiB (%.1f MiB of matrices); load average (1 min) %.2f\n",
           b.P, b.n, layers, b.n_aw, S / 1048576.0, 4.0 * (double)b.matrices / 1048576.0, load_average());
    want_ar = 2.0 * (b.P - 1) / b.P * S + (b.P - 1.0) / b.P * 4.0 * (double)b.matrices;
    printf("  allreduce  step %8.1f ms  sent %7.2f MiB/rank/step (2(P-1)/P S + (P-1)/P S_matrices = %7.2f)  state %7.2f MiB/rank\n",
           1e3 * t_ar, by_ar / 1048576.0, want_ar / 1048576.0, mo_ar / 1048576.0);
    printf("  partial    step %8.1f ms  sent %7.2f MiB/rank/step (2(P-1)/P S = %7.2f)  state %7.2f MiB/rank\n",
           1e3 * t_p, by_p / 1048576.0, want_p / 1048576.0, mo_p / 1048576.0);
    printf("  partial / allreduce: time %.2fx, bytes %.4fx, optimizer state %.4fx\n", t_p / t_ar, by_p / by_ar, mo_p / mo_ar);
  }
  {
    unsigned long long allh[2 * 64];
    int ok = 1;
    if (b.P <= 64 && b.world.vt->allgather(b.world.ctx, hs, allh, sizeof hs) == MUON_OK)
      for (i = 0; i < b.P; i++) ok &= allh[2 * i] == allh[2 * i + 1] && allh[2 * i] == allh[0];
    else ok = 0;
    if (b.rank == 0) {
      int bytes_ok = b.P == 1 || (by_p == 2.0 * (b.P - 1) / b.P * 4.0 * (double)b.total);
      printf("  check: partial %s allreduce-then-muon bitwise on every rank; partial's bytes %s 2(P-1)/P S\n",
             ok ? "equals" : "DIFFERS FROM", bytes_ok ? "equal" : "DIFFER FROM");
      if (!ok || !bytes_ok) return 1;
    }
  }
  free(all); free(b.rows); free(b.cols); free(b.aw_size); free(b.w); free(b.g); free(b.sum); free(b.recv); free(b.send); free(b.counts);
  muon_comm_destroy(&b.world);
  return 0;
}
