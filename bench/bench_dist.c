/* bench_dist.c - distributed Muon on a GPT-2-small-like model, FSDP over every rank.

   Run under the launcher, e.g.:
       OPENBLAS_NUM_THREADS=1 build/muonrun -n 2 build/bench_dist
   Every configuration below runs in the SAME launch, one after another, on the same data, so the
   printed ratios compare like with like:

     single     the 1-rank reference: rank 0 alone runs a single-device optimizer (desc.comm NULL)
                on the full matrices while the other ranks wait in a barrier. This is what
                `muonrun -n 1` measures, taken beside the P-rank runs instead of in another launch.
     batched    muon's own exchange: muon_auto_config with fsdp = world (SHARD(0) over all
                ranks), owners balanced by NS flops, one alltoallv out and one back per round.
     unchecked  batched without the commit vote (muon_dist_config.unchecked_commit): what the
                "all ranks apply or none does" allgather costs per step.
     permatrix  the literal per-matrix algorithm: muon_layout_config with SHARD(0) layouts and a
                gather / redistribute pair that moves ONE matrix per call (one alltoallv each way
                per matrix), like examples/custom_vtable.c; same owners as batched.
     moonlight  gather everything, orthogonalise everywhere: every rank all-gathers every full
                gradient (one world allgather per matrix) and runs a single-device optimizer on
                all full matrices, then keeps its own rows. (Moonlight gathers the momentum-
                updated matrix rather than the gradient; the bytes and the P-fold NS are the same.)
     wire16     batched with bf16 on the wire (muon_dist_config.wire = MUON_WIRE_BF16) and fp32
                Newton-Schulz: half the bytes, other numerics; its distance from batched is
                printed (max |difference| of the parameters, against the largest total update).
     bf16ns     batched with bf16 Newton-Schulz (torch's precision), whose default wire is bf16,
     bf16ns32   and the same with an fp32 wire: the two must be bitwise equal, at half the bytes.

   Per configuration: step time = median over --steps timed steps (after --warmup untimed ones) of
   the slowest rank's muon_step; collectives, bytes sent and NS calls per rank per step (from
   muon_stats differences over one step, plus the callbacks' own calls for permatrix and the
   allgathers for moonlight); peak workspace beside the local shard. Bytes are checked against the
   design's formula 2*(P-1)/P^2 * S * 4 (S = total elements). At the end the parameters of every
   configuration are compared bitwise (each rank's rows), so a fast wrong answer cannot pass.

   Model (per layer): attn.q, attn.k, attn.v, attn.o 768x768; mlp.fc 3072x768; mlp.proj 768x3072
   (GPT-2 small has 12 layers, ~1.6 TFLOP of NS per step; --layers N, default 2, keeps `make bench`
   short on 2 cores).

   usage: bench_dist [--layers N] [--steps N] [--warmup N] [--configs a,b,...] [--gemm builtin|cblas] [--overlap] [--small N]
                     [--dim D] [--round-bytes B]
     --overlap  instead of the configurations: batched under prefetch 0/1/2 x async off/on
                (muon_dist_config.prefetch / .async), each against the debug setting (0, off),
                with its bytes sent per rank against the formula
     --settings P:A,...  with --overlap, only these (prefetch P, async A = 0|1) beside the debug
                setting, which always runs (e.g. 2:1 for the shaped-network run of make bench)
     --small N  the model is N matrices of D x D instead (--dim, default 128; the latency-bound case)
     --round-bytes B  muon_dist_config.round_bytes for batched in every setting (default: muon's
                own sizing, one round in the debug setting, about 2(prefetch + 1) overlapped)
     --configs  any of single,batched,unchecked,permatrix,moonlight,wire16,bf16ns,bf16ns32 (default all)
     --gemm     default: CBLAS when compiled with -DMUON_USE_CBLAS, else the built-in GEMM

   Build: gcc -std=c99 -O3 -march=native [-DMUON_USE_CBLAS $(pkg-config --cflags openblas)] -I. \
            -c bench/bench_dist.c;  g++ -std=c++17 -O2 -I. -c examples/muon_gloo.cpp;
          gcc bench_dist.o muon_gloo.o -o build/bench_dist -lgloo -lstdc++ -pthread -lm [openblas] */
#define _POSIX_C_SOURCE 200809L
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "bench.h"
#include "muon_gloo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STEPS 32
#define PER_LAYER 6

typedef struct mat {
  char name[48];
  int rows, cols;
  size_t lo, n_rows;      /* this rank's rows [lo, lo + n_rows) (torch.chunk over the world) */
  size_t chunk_rows;      /* ceil(rows / P) */
  float *w;               /* local rows: params */
  float *g;               /* local rows: gradient (fixed for every step) */
} mat;

typedef struct bench {
  muon_comm world;
  int rank, P, n, layers, steps, warmup;
  muon_gemm gemm;
  mat *m;
  double S;               /* total elements */
  size_t local_floats;
  unsigned long long *hash; /* per config: hash of this rank's rows after the run */
  int *done;              /* per config: ran */
  float *batched_rows;    /* this rank's rows after batched, and before any step (for wire16) */
  float *initial_rows;
  double wire16_diff, wire16_update;   /* max over ranks: |wire16 - batched|, |batched - initial| */
  int prefetch, async;    /* batched's muon_dist_config.prefetch / .async (the --overlap grid) */
  size_t round_bytes;     /* batched's muon_dist_config.round_bytes (0: muon's sizing) */
} bench;

enum { C_SINGLE, C_BATCHED, C_UNCHECKED, C_PERMATRIX, C_MOONLIGHT, C_WIRE16, C_BF16NS, C_BF16NS32, N_CONFIGS };
static const char *config_name[N_CONFIGS] = { "single", "batched", "unchecked", "permatrix", "moonlight", "wire16", "bf16ns", "bf16ns32" };
/* Configurations that compute the same thing must agree bitwise: the fp32 ones, the bf16 ones;
   wire16 rounds on the wire and is measured instead. */
static int math_of(int c) { return c <= C_MOONLIGHT ? 0 : c == C_WIRE16 ? 2 : 1; }

typedef struct result {
  double step_s;          /* median of the slowest rank's step */
  double coll, bytes_mean, bytes_min, bytes_max, ns_max, ns_sum;   /* per rank per step */
  double gathered, workspace, exchange, state;                      /* peak bytes, max over ranks */
  int rounds;
} result;

static void die(const bench *b, const char *what, const char *why) {
  fprintf(stderr, "rank %d: %s: %s\n", b ? b->rank : -1, what, why);
  exit(1);
}


static float value(unsigned seed, size_t i) {
  unsigned x = seed ^ (unsigned)(i * 2654435761u);
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return (float)(x & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

/* Element i (full-matrix index) of matrix k: initial param (which 0) or gradient (which 1). */
static float elem(const mat *m, int k, int which, size_t i) {
  return value(2166136261u * (unsigned)(k + 1) + (unsigned)which * 7919u, i) / (which ? 1.0f : sqrtf((float)m->cols));
}

static void reset_params(bench *b) {
  int k;
  for (k = 0; k < b->n; k++) {
    mat *m = &b->m[k];
    size_t e, off = m->lo * (size_t)m->cols, cnt = m->n_rows * (size_t)m->cols;
    for (e = 0; e < cnt; e++) m->w[e] = elem(m, k, 0, off + e);
  }
}

static unsigned long long fnv(unsigned long long h, const void *p, size_t n) {
  const unsigned char *c = (const unsigned char *)p;
  size_t i;
  for (i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

static unsigned long long hash_rows(const bench *b, float *const *full) {
  unsigned long long h = 14695981039346656037ull;
  int k;
  for (k = 0; k < b->n; k++) {
    const mat *m = &b->m[k];
    const float *src = full ? full[k] + m->lo * (size_t)m->cols : m->w;
    h = fnv(h, src, m->n_rows * (size_t)m->cols * sizeof(float));
  }
  return h;
}

/* Every rank's double, in rank order. */
static void gather_d(bench *b, double x, double *all) {
  if (b->world.vt->allgather(b->world.ctx, &x, all, sizeof x) != MUON_OK)
    die(b, "allgather", b->world.vt->error(b->world.ctx));
}

/* Nobody goes on before everybody arrived: an allgather of one double each. */
static void barrier(bench *b) {
  double *all = (double *)malloc((size_t)b->world.size * sizeof(double));
  if (!all) die(b, "barrier", "out of memory");
  gather_d(b, 0, all);
  free(all);
}

static double max_of(const double *a, int n) { double m = a[0]; int i; for (i = 1; i < n; i++) if (a[i] > m) m = a[i]; return m; }
static double min_of(const double *a, int n) { double m = a[0]; int i; for (i = 1; i < n; i++) if (a[i] < m) m = a[i]; return m; }
static double sum_of(const double *a, int n) { double s = 0; int i; for (i = 0; i < n; i++) s += a[i]; return s; }

static muon_desc make_desc(const bench *b, int cfg) {
  static muon_compute cpu;   /* --gemm is the CPU backend's setting; one for the whole run */
  muon_desc d = muon_default_desc();
  if (!cpu.vt) {
    muon_cpu_desc cd = muon_cpu_default_desc();
    cd.gemm = b->gemm;
    if (muon_cpu_create(&cpu, &cd) != MUON_OK) die(b, "muon_cpu_create", muon_error(NULL));
  }
  d.compute = &cpu;
  d.hparams.lr = 0.02f;
  if (cfg == C_BF16NS || cfg == C_BF16NS32) d.hparams.precision = MUON_PRECISION_BF16;
  return d;
}

/* This rank's rows of every matrix, one after another. */
static void copy_rows(const bench *b, float *out) {
  int k;
  for (k = 0; k < b->n; k++) {
    size_t cnt = b->m[k].n_rows * (size_t)b->m[k].cols;
    memcpy(out, b->m[k].w, cnt * sizeof(float));
    out += cnt;
  }
}

/* ---- per-matrix exchange: muon_dist_config.gather / redistribute, one alltoallv per call --------- */
typedef struct permatrix {
  bench *b;
  size_t *counts;         /* 4 x P */
  float zero;
  long long calls, bytes; /* this rank's own collectives and bytes sent to others */
} permatrix;

static void rows_of(const muon_matrix_info *m, int P, int r, size_t *lo, size_t *n) {
  size_t c = ((size_t)m->rows + P - 1) / P, a = r * c < (size_t)m->rows ? r * c : (size_t)m->rows;
  *lo = a;
  *n = (a + c < (size_t)m->rows ? a + c : (size_t)m->rows) - a;
}

static muon_status pm_gather(void *state, const muon_matrix_info *m, const float *local, float *full, int owner) {
  permatrix *f = (permatrix *)state;
  muon_comm *w = &f->b->world;
  int P = w->size, r;
  size_t *sc = f->counts, *sd = sc + P, *rc = sd + P, *rd = rc + P, lo, n;
  for (r = 0; r < P; r++) {
    rows_of(m, P, r, &lo, &n);
    sc[r] = r == owner ? m->local_size : 0;
    sd[r] = 0;
    rc[r] = w->rank == owner ? n * (size_t)m->cols : 0;
    rd[r] = lo * (size_t)m->cols;
  }
  f->calls++;
  if (w->rank != owner) f->bytes += (long long)(m->local_size * sizeof(float));
  return muon_comm_alltoallv(w, local ? local : &f->zero, sc, sd, full ? full : &f->zero, rc, rd);
}

static muon_status pm_redistribute(void *state, const muon_matrix_info *m, const float *full, float *local, int owner) {
  permatrix *f = (permatrix *)state;
  muon_comm *w = &f->b->world;
  int P = w->size, r;
  size_t *sc = f->counts, *sd = sc + P, *rc = sd + P, *rd = rc + P, lo, n;
  for (r = 0; r < P; r++) {
    rows_of(m, P, r, &lo, &n);
    sc[r] = w->rank == owner ? n * (size_t)m->cols : 0;
    sd[r] = lo * (size_t)m->cols;
    rc[r] = r == owner ? m->local_size : 0;
    rd[r] = 0;
    if (w->rank == owner && r != owner) f->bytes += (long long)(n * (size_t)m->cols * sizeof(float));
  }
  f->calls++;
  return muon_comm_alltoallv(w, full ? full : &f->zero, sc, sd, local ? local : &f->zero, rc, rd);
}

/* ---- one configuration ------------------------------------------------------------------- */
static void run_config(bench *b, int cfg, result *res) {
  muon_optimizer *opt = NULL;
  muon_desc desc = make_desc(b, cfg);
  muon_auto_desc ad;
  muon_dist_config dc;
  muon_layout lay;
  permatrix pm;
  muon_stats s0, s1;
  float **full_w = NULL, **full_g = NULL, *chunk = NULL;
  double t[MAX_STEPS], *per = (double *)malloc((size_t)b->P * sizeof(double)), coll = 0, bytes = 0;
  long long pm_calls0 = 0, pm_bytes0 = 0;
  int k, s, active = cfg != C_SINGLE || b->rank == 0, full = cfg == C_SINGLE || cfg == C_MOONLIGHT;
  size_t max_chunk = 0;

  memset(res, 0, sizeof *res);
  memset(&s0, 0, sizeof s0);
  memset(&s1, 0, sizeof s1);
  reset_params(b);
  if (cfg == C_BATCHED || cfg == C_UNCHECKED || cfg >= C_WIRE16) {
    memset(&ad, 0, sizeof ad);
    ad.fsdp = &b->world;
    ad.unchecked_commit = cfg == C_UNCHECKED;   /* no commit vote: one allgather less per step */
    ad.wire = cfg == C_WIRE16 ? MUON_WIRE_BF16 : cfg == C_BF16NS32 ? MUON_WIRE_FP32 : MUON_WIRE_AUTO;
    if (cfg == C_BATCHED) { ad.prefetch = b->prefetch; ad.async = b->async; ad.round_bytes = b->round_bytes; }
    dc = muon_auto_config(&ad);
    desc.comm = &b->world;
    desc.dist = &dc;
  } else if (cfg == C_PERMATRIX) {
    dc = muon_layout_config();
    pm.b = b;
    pm.counts = (size_t *)malloc(4 * (size_t)b->P * sizeof(size_t));
    pm.zero = 0;
    pm.calls = pm.bytes = 0;
    dc.gather = pm_gather;
    dc.redistribute = pm_redistribute;
    dc.state = &pm;
    desc.comm = &b->world;
    desc.dist = &dc;
    memset(&lay, 0, sizeof lay);
    lay.n_levels = 1;
    lay.levels[0] = muon_shard(0, &b->world);
  }
  if (active && muon_create(&opt, &desc) != MUON_OK) die(b, "muon_create", config_name[cfg]);
  if (full) {
    /* Full matrices on this rank: param copies and gradients (moonlight fills the gradients by
       allgather every step; single builds them here, as one device would hold them). */
    full_w = (float **)calloc((size_t)b->n, sizeof *full_w);
    full_g = (float **)calloc((size_t)b->n, sizeof *full_g);
    for (k = 0; k < b->n; k++) {
      mat *m = &b->m[k];
      size_t e, cnt = (size_t)m->rows * m->cols;
      if (!active) break;
      full_w[k] = (float *)malloc(cnt * sizeof(float));
      /* moonlight receives P padded chunks; their concatenation is the full matrix (+ padding) */
      full_g[k] = (float *)malloc((size_t)b->P * m->chunk_rows * m->cols * sizeof(float) + sizeof(float));
      for (e = 0; e < cnt; e++) full_w[k][e] = elem(m, k, 0, e);
      if (cfg == C_SINGLE)
        for (e = 0; e < cnt; e++) full_g[k][e] = elem(m, k, 1, e);
      if (m->chunk_rows * (size_t)m->cols > max_chunk) max_chunk = m->chunk_rows * (size_t)m->cols;
    }
    chunk = (float *)calloc(max_chunk + 1, sizeof(float));
  }
  for (k = 0; active && k < b->n; k++) {
    mat *m = &b->m[k];
    muon_matrix mm = muon_default_matrix();
    mm.name = m->name;
    mm.rows = m->rows;
    mm.cols = m->cols;
    if (full) { mm.param = full_w[k]; mm.grad = full_g[k]; }
    else { mm.param = m->w; mm.grad = m->g; }
    if (cfg == C_PERMATRIX) mm.layout = &lay;
    if (muon_add_matrix(opt, &mm, NULL) != MUON_OK) die(b, "muon_add_matrix", muon_error(opt));
  }
  if (active && muon_plan(opt) != MUON_OK) die(b, "muon_plan", muon_error(opt));

  for (s = 0; s < b->warmup + b->steps; s++) {
    double t0, dt;
    barrier(b);
    if (active) {
      muon_get_stats(opt, &s0);
      if (cfg == C_PERMATRIX) { pm_calls0 = pm.calls; pm_bytes0 = pm.bytes; }
      t0 = now_s();
      coll = bytes = 0;
      if (cfg == C_MOONLIGHT) {
        for (k = 0; k < b->n; k++) {
          mat *m = &b->m[k];
          size_t cs = m->chunk_rows * (size_t)m->cols;
          memset(chunk, 0, cs * sizeof(float));
          memcpy(chunk, m->g, m->n_rows * (size_t)m->cols * sizeof(float));
          if (b->world.vt->allgather(b->world.ctx, chunk, full_g[k], cs * sizeof(float)) != MUON_OK)
            die(b, "allgather (moonlight)", b->world.vt->error(b->world.ctx));
          coll += 1;
          bytes += (double)(b->P - 1) * (double)(m->n_rows * (size_t)m->cols) * sizeof(float);
        }
      }
      if (muon_step(opt) != MUON_OK) die(b, "muon_step", muon_error(opt));
      if (cfg == C_MOONLIGHT)
        for (k = 0; k < b->n; k++) {
          mat *m = &b->m[k];
          memcpy(m->w, full_w[k] + m->lo * (size_t)m->cols, m->n_rows * (size_t)m->cols * sizeof(float));
        }
      dt = now_s() - t0;
      muon_get_stats(opt, &s1);
    } else {
      dt = 0;
    }
    barrier(b);
    gather_d(b, dt, per);
    if (s >= b->warmup) t[s - b->warmup] = max_of(per, b->P);
  }
  res->step_s = median(t, b->steps);

  /* Counters over the last step, per rank. */
  if (active) {
    coll += (double)(s1.collectives - s0.collectives);
    bytes += (double)(s1.bytes_sent - s0.bytes_sent);
    if (cfg == C_PERMATRIX) { coll += (double)(pm.calls - pm_calls0); bytes += (double)(pm.bytes - pm_bytes0); }
  }
  gather_d(b, coll, per); res->coll = max_of(per, b->P);
  gather_d(b, bytes, per);
  res->bytes_mean = sum_of(per, b->P) / b->P; res->bytes_min = min_of(per, b->P); res->bytes_max = max_of(per, b->P);
  gather_d(b, active ? (double)(s1.ns_calls - s0.ns_calls) : 0, per);
  res->ns_max = max_of(per, b->P); res->ns_sum = sum_of(per, b->P);
  gather_d(b, active ? (double)s1.gathered_bytes + (full ? b->S * 4.0 : 0) : 0, per); res->gathered = max_of(per, b->P);
  gather_d(b, active ? (double)s1.workspace_bytes : 0, per); res->workspace = max_of(per, b->P);
  gather_d(b, active ? (double)s1.exchange_bytes : 0, per); res->exchange = max_of(per, b->P);
  gather_d(b, active ? (double)s1.state_bytes : 0, per); res->state = max_of(per, b->P);
  res->rounds = active ? s1.rounds : 0;

  /* This rank's rows of the result, for the cross-config check. */
  b->hash[cfg] = active ? hash_rows(b, full ? full_w : NULL) : 0;
  b->done[cfg] = 1;
  if (cfg == C_BATCHED) copy_rows(b, b->batched_rows);
  if (cfg == C_WIRE16 && b->done[C_BATCHED]) {   /* how far bf16 on the wire moves fp32 Muon */
    size_t e;
    double diff = 0, upd = 0;
    float *rows = (float *)malloc(b->local_floats * sizeof(float) + sizeof(float));
    copy_rows(b, rows);
    for (e = 0; e < b->local_floats; e++) {
      double d = fabs((double)rows[e] - b->batched_rows[e]), u = fabs((double)b->batched_rows[e] - b->initial_rows[e]);
      if (d > diff) diff = d;
      if (u > upd) upd = u;
    }
    free(rows);
    gather_d(b, diff, per); b->wire16_diff = max_of(per, b->P);
    gather_d(b, upd, per); b->wire16_update = max_of(per, b->P);
  }

  muon_destroy(opt);
  if (cfg == C_PERMATRIX) free(pm.counts);
  if (full) {
    for (k = 0; k < b->n; k++) { free(full_w[k]); free(full_g[k]); }
    free(full_w); free(full_g); free(chunk);
  }
  free(per);
}

static const char *mib(double bytes, char *buf, size_t n) {
  snprintf(buf, n, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

int main(int argc, char **argv) {
  bench b;
  muon_gloo_desc gd = muon_gloo_default_desc();
  char err[512], b1[32], b2[32], b3[32], b4[32], b5[32];
  const char *configs = "single,batched,unchecked,permatrix,moonlight,wire16,bf16ns,bf16ns32";
  static const char *names[PER_LAYER] = { "attn.q", "attn.k", "attn.v", "attn.o", "mlp.fc", "mlp.proj" };
  static const int dims[PER_LAYER][2] = { { 768, 768 }, { 768, 768 }, { 768, 768 }, { 768, 768 }, { 3072, 768 }, { 768, 3072 } };
  result res[N_CONFIGS];
  int i, k, c, run[N_CONFIGS] = { 0 }, overlap = 0, small = 0, dim = 128, want[6] = { 1, 1, 1, 1, 1, 1 };
  double start = now_s(), flops = 0, formula;

  memset(&b, 0, sizeof b);
  b.layers = 2;
  b.steps = 3;
  b.warmup = 1;
  b.gemm = MUON_GEMM_AUTO;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--layers") && i + 1 < argc) b.layers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) b.steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) b.warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--configs") && i + 1 < argc) configs = argv[++i];
    else if (!strcmp(argv[i], "--overlap")) overlap = 1;
    else if (!strcmp(argv[i], "--small") && i + 1 < argc) small = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--dim") && i + 1 < argc) dim = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--round-bytes") && i + 1 < argc) b.round_bytes = (size_t)atol(argv[++i]);
    else if (!strcmp(argv[i], "--settings") && i + 1 < argc) {
      const char *p = argv[++i];
      int pf, as, n;
      for (c = 1; c < 6; c++) want[c] = 0;
      while (sscanf(p, "%d:%d%n", &pf, &as, &n) == 2 && pf >= 0 && pf <= 2 && (as == 0 || as == 1)) {
        want[pf * 2 + as] = 1;
        p += n;
        if (*p != ',') break;
        p++;
      }
      if (*p) { fprintf(stderr, "--settings P:A,... (P 0..2, A 0|1)\n"); return 2; }
    } else if (!strcmp(argv[i], "--gemm") && i + 1 < argc) {
      i++;
      if (!strcmp(argv[i], "builtin")) b.gemm = MUON_GEMM_BUILTIN;
      else if (!strcmp(argv[i], "cblas")) b.gemm = MUON_GEMM_CBLAS;
      else { fprintf(stderr, "--gemm builtin|cblas\n"); return 2; }
    } else {
      fprintf(stderr, "usage: %s [--layers N] [--steps N] [--warmup N] [--configs single,batched,unchecked,permatrix,moonlight,wire16,bf16ns,bf16ns32] "
                      "[--gemm builtin|cblas] [--overlap [--settings P:A,...]] [--small N] [--dim D] [--round-bytes B]\n", argv[0]);
      return 2;
    }
  }
  if (b.layers < 1 || b.steps < 1 || b.steps > MAX_STEPS || b.warmup < 0 || dim < 1) { fprintf(stderr, "bad --layers/--steps/--warmup/--dim\n"); return 2; }
  for (c = 0; c < N_CONFIGS; c++) {
    const char *p = strstr(configs, config_name[c]);
    size_t l = strlen(config_name[c]);
    run[c] = p && (p == configs || p[-1] == ',') && (p[l] == 0 || p[l] == ',');
  }
#ifndef MUON_USE_CBLAS
  if (b.gemm == MUON_GEMM_CBLAS) { fprintf(stderr, "--gemm cblas: not compiled with -DMUON_USE_CBLAS\n"); return 2; }
#endif

  if (muon_gloo_create(&b.world, &gd) != MUON_OK) die(NULL, "muon_gloo_create", muon_error(NULL));
  b.rank = b.world.rank;
  b.P = b.world.size;
  b.n = small > 0 ? small : b.layers * PER_LAYER;
  b.m = (mat *)calloc((size_t)b.n, sizeof *b.m);
  b.hash = (unsigned long long *)calloc(N_CONFIGS, sizeof *b.hash);
  b.done = (int *)calloc(N_CONFIGS, sizeof *b.done);
  for (k = 0; k < b.n; k++) {
    mat *m = &b.m[k];
    size_t e, cnt;
    double mn, mx;
    if (small > 0) {   /* the latency-bound case: many small matrices */
      snprintf(m->name, sizeof m->name, "small%d", k);
      m->rows = m->cols = dim;
    } else {
      snprintf(m->name, sizeof m->name, "h%d.%s", k / PER_LAYER, names[k % PER_LAYER]);
      m->rows = dims[k % PER_LAYER][0];
      m->cols = dims[k % PER_LAYER][1];
    }
    m->chunk_rows = ((size_t)m->rows + b.P - 1) / b.P;
    m->lo = (size_t)b.rank * m->chunk_rows < (size_t)m->rows ? (size_t)b.rank * m->chunk_rows : (size_t)m->rows;
    m->n_rows = (m->lo + m->chunk_rows < (size_t)m->rows ? m->lo + m->chunk_rows : (size_t)m->rows) - m->lo;
    cnt = m->n_rows * (size_t)m->cols;
    m->w = (float *)malloc(cnt * sizeof(float) + sizeof(float));
    m->g = (float *)malloc(cnt * sizeof(float) + sizeof(float));
    for (e = 0; e < cnt; e++) m->g[e] = elem(m, k, 1, m->lo * (size_t)m->cols + e);
    b.S += (double)m->rows * m->cols;
    b.local_floats += cnt;
    mn = m->rows < m->cols ? m->rows : m->cols;
    mx = m->rows < m->cols ? m->cols : m->rows;
    flops += 5.0 * (4.0 * mn * mn * mx + 2.0 * mn * mn * mn);
  }

  b.batched_rows = (float *)malloc(b.local_floats * sizeof(float) + sizeof(float));
  b.initial_rows = (float *)malloc(b.local_floats * sizeof(float) + sizeof(float));
  reset_params(&b);
  copy_rows(&b, b.initial_rows);
  if (b.rank == 0) {
    printf("== bench_dist: %d rank%s (Gloo, one process per rank on this machine), FSDP over all ranks ==\n", b.P,
           b.P == 1 ? "" : "s");
    printf("model: %d layer%s x {attn.q,k,v,o 768x768; mlp.fc 3072x768; mlp.proj 768x3072} = %d matrices, "
           "S = %.2fM elements (%s fp32); GPT-2 small has 12 layers, %d here to keep `make bench` short\n",
           b.layers, b.layers == 1 ? "" : "s", b.n, b.S * 1e-6, mib(b.S * 4, b1, sizeof b1), b.layers);
    printf("NS: 5 quintic steps, fp32, symmetric, GEMM %s, %.0f GFLOP per full step (plain count); "
           "single-threaded BLAS per rank (OPENBLAS_NUM_THREADS=%s)\n",
           b.gemm == MUON_GEMM_BUILTIN ? "built-in"
#ifdef MUON_USE_CBLAS
           : "CBLAS (OpenBLAS)",
#else
           : "built-in",
#endif
           flops * 1e-9, getenv("OPENBLAS_NUM_THREADS") ? getenv("OPENBLAS_NUM_THREADS") : "unset");
    printf("timing: median of %d steps after %d warm-up, each the slowest rank's muon_step (moonlight: its "
           "allgathers + step); all configurations in this one launch, one after another; load average (1 min) %.2f\n",
           b.steps, b.warmup, load_average());
    fflush(stdout);
  }

  if (overlap) {   /* batched under prefetch 0/1/2 x async off/on, against the debug setting */
    double t[6];
    unsigned long long h0 = 0;
    int same = 1, best = 0;
    result r;
    formula = 2.0 * (b.P - 1) / ((double)b.P * b.P) * b.S * 4.0;
    for (c = 0; c < 6; c++) {
      if (!want[c]) continue;
      b.prefetch = c / 2;
      b.async = c % 2;
      run_config(&b, C_BATCHED, &r);
      t[c] = r.step_s;
      if (c == 0) h0 = b.hash[C_BATCHED];
      else if (b.hash[C_BATCHED] != h0) same = 0;
      if (t[c] < t[best]) best = c;
      if (b.rank == 0) {
        printf("  prefetch %d, async %-3s: %.4f s/step, %.0f collectives/step, %d rounds, %.2fx the debug setting's speed; "
               "bytes sent per rank per step %s, %.4f x the formula 2(P-1)/P^2*S*4\n",
               c / 2, c % 2 ? "on" : "off", t[c], r.coll, r.rounds, t[0] / t[c], mib(r.bytes_mean, b1, sizeof b1),
               b.P > 1 ? r.bytes_mean / formula : 0.0);
        fflush(stdout);
      }
    }
    {
      double *per = (double *)malloc((size_t)b.P * sizeof(double));
      gather_d(&b, same ? 0.0 : 1.0, per);
      same = sum_of(per, b.P) == 0;
      free(per);
    }
    if (b.rank == 0)
      printf("-- overlap: best prefetch %d, async %s: %.2fx the debug setting (prefetch 0, async off); parameters of all settings run %s; "
             "async %s; load average (1 min) %.2f --\n",
             best / 2, best % 2 ? "on" : "off", t[0] / t[best], same ? "bitwise identical (every rank's rows)" : "NOT identical",
             b.world.vt->queued ? "as Gloo's started exchanges (several in flight at once)" : "on muon's communication thread (MUON_GLOO_BLOCKING)",
             load_average());
    if (!same) { muon_comm_destroy(&b.world); return 1; }
    b.prefetch = b.async = 0;
    for (c = 0; c < N_CONFIGS; c++) run[c] = 0;
  }
  for (c = 0; c < N_CONFIGS; c++) {
    if (!run[c]) continue;
    if (c == C_SINGLE && b.P == 1 && run[C_BATCHED]) { run[c] = 0; continue; }  /* the same thing */
    run_config(&b, c, &res[c]);
    if (b.rank == 0) {
      printf("  ran %-9s: %.3f s/step\n", config_name[c], res[c].step_s);
      fflush(stdout);
    }
  }

  /* Bitwise agreement of every configuration on every rank's rows. */
  {
    double *per = (double *)malloc((size_t)b.P * sizeof(double)), bad = 0;
    int ref[3] = { -1, -1, -1 };
    for (c = 0; c < N_CONFIGS; c++) {
      if (!b.done[c] || (c == C_SINGLE && b.rank != 0)) continue;
      if (ref[math_of(c)] < 0) ref[math_of(c)] = c;
      else if (b.hash[c] != b.hash[ref[math_of(c)]]) bad += 1;
    }
    gather_d(&b, bad, per);
    bad = sum_of(per, b.P);
    free(per);

    if (b.rank == 0) {
      const result *base = run[C_SINGLE] ? &res[C_SINGLE] : run[C_BATCHED] && b.P == 1 ? &res[C_BATCHED] : NULL;
      formula = 2.0 * (b.P - 1) / ((double)b.P * b.P) * b.S * 4.0;
      printf("\n-- step time (s), ratios --\n");
      printf("  %-10s %9s %12s %11s %10s %16s %10s\n", "config", "step s", "vs 1 rank", "vs batched", "coll/step",
             "bytes sent/rank", "NS/rank");
      for (c = 0; c < N_CONFIGS; c++) {
        char vs1[32] = "-", vsb[32] = "-", by[48];
        if (!run[c]) continue;
        if (base) snprintf(vs1, sizeof vs1, "%.2fx", base->step_s / res[c].step_s);
        if (run[C_BATCHED]) snprintf(vsb, sizeof vsb, "%.2fx", res[c].step_s / res[C_BATCHED].step_s);
        snprintf(by, sizeof by, "%s", mib(res[c].bytes_mean, b1, sizeof b1));
        printf("  %-10s %9.3f %12s %11s %10.0f %16s %10.0f\n", config_name[c], res[c].step_s, vs1, vsb, res[c].coll,
               by, res[c].ns_max);
      }
      printf("  ('vs 1 rank' = 1-rank step time / this step time: the speed-up, ideally %d; 'vs batched' = this "
             "time / batched time: > 1 is slower than muon's batched exchange)\n", b.P);
      if (b.P > 2) printf("  (%d ranks on this 2-core machine are oversubscribed: compare bytes and collectives, "
                          "not the speed-up)\n", b.P);

      if (run[C_BATCHED]) {
        const result *r = &res[C_BATCHED];
        printf("\n-- batched exchange (muon_auto_config, fsdp = world) --\n");
        if (b.P > 1)
          printf("  bytes sent per rank per step: mean %s (min %s, max %s); formula 2(P-1)/P^2*S*4 = %s; "
                 "mean / formula = %.4f\n", mib(r->bytes_mean, b1, sizeof b1), mib(r->bytes_min, b2, sizeof b2),
                 mib(r->bytes_max, b3, sizeof b3), mib(formula, b4, sizeof b4), r->bytes_mean / formula);
        else
          printf("  bytes sent per rank per step: %.0f (formula: 0 for one rank)\n", r->bytes_mean);
        printf("  collectives per rank per step: %.0f (muon_stats.rounds = %d; a round is one alltoallv out and one "
               "back, the rest are control allgathers)\n", r->coll, r->rounds);
        printf("  NS calls per step: %.0f over all ranks for %d matrices (max %.0f on one rank)\n", r->ns_sum, b.n,
               r->ns_max);
        printf("  peak memory per rank: local shard (params) %s; gathered full matrices %s (%.2fx shard); "
               "workspace %s (%.2fx shard); exchange buffers %s; momentum %s\n",
               mib((double)b.local_floats * 4, b1, sizeof b1), mib(r->gathered, b2, sizeof b2),
               r->gathered / ((double)b.local_floats * 4), mib(r->workspace, b3, sizeof b3),
               r->workspace / ((double)b.local_floats * 4), mib(r->exchange, b4, sizeof b4),
               (snprintf(err, sizeof err, "%.1f MiB", r->state / 1048576.0), err));
      }
      if (run[C_BATCHED] && run[C_UNCHECKED] && b.P > 1)
        printf("\n-- the commit vote (all ranks apply or none does) --\n"
               "  step time with / without it = %.3fx (%+.1f ms per step); collectives per step: %.0f vs %.0f\n",
               res[C_BATCHED].step_s / res[C_UNCHECKED].step_s, 1e3 * (res[C_BATCHED].step_s - res[C_UNCHECKED].step_s),
               res[C_BATCHED].coll, res[C_UNCHECKED].coll);
      if (run[C_BATCHED] && run[C_PERMATRIX] && b.P > 1)
        printf("\n-- batched vs per-matrix gather/redistribute --\n"
               "  step time: per-matrix / batched = %.2fx; collectives per step: %.0f vs %.0f (%.1fx fewer batched); "
               "bytes per rank: %s vs %s\n",
               res[C_PERMATRIX].step_s / res[C_BATCHED].step_s, res[C_PERMATRIX].coll, res[C_BATCHED].coll,
               res[C_PERMATRIX].coll / res[C_BATCHED].coll, mib(res[C_PERMATRIX].bytes_mean, b1, sizeof b1),
               mib(res[C_BATCHED].bytes_mean, b2, sizeof b2));
      if (run[C_BATCHED] && run[C_MOONLIGHT] && b.P > 1)
        printf("\n-- zero-redundancy (batched) vs Moonlight-style gather-everything --\n"
               "  step time: moonlight / batched = %.2fx; bytes sent per rank: %s vs %s (%.2fx; formulas (P-1)/P*S*4 "
               "= %s vs 2(P-1)/P^2*S*4 = %s); NS calls per rank: %.0f vs %.0f; NS calls in the world: %.0f vs %.0f; "
               "full matrices held per rank: %s vs %s\n",
               res[C_MOONLIGHT].step_s / res[C_BATCHED].step_s, mib(res[C_MOONLIGHT].bytes_mean, b1, sizeof b1),
               mib(res[C_BATCHED].bytes_mean, b2, sizeof b2), res[C_MOONLIGHT].bytes_mean / res[C_BATCHED].bytes_mean,
               mib((b.P - 1.0) / b.P * b.S * 4, b3, sizeof b3), mib(formula, b4, sizeof b4), res[C_MOONLIGHT].ns_max,
               res[C_BATCHED].ns_max, res[C_MOONLIGHT].ns_sum, res[C_BATCHED].ns_sum,
               (snprintf(err, sizeof err, "%.1f MiB", b.S * 4 / 1048576.0), err), mib(res[C_BATCHED].gathered, b5, sizeof b5));
      if (run[C_BATCHED] && run[C_WIRE16] && b.P > 1)
        printf("\n-- bf16 on the wire, fp32 Newton-Schulz (wire16; MUON_WIRE_BF16 is opt-in there) --\n"
               "  bytes sent per rank: %s vs batched's %s (%.4fx); step time wire16 / batched = %.2fx\n"
               "  after %d steps the parameters differ from batched's by at most %.3g, %.3g of the largest total update "
               "(%.3g): U and O rounded to bf16 (8 bits of mantissa) on the way\n",
               mib(res[C_WIRE16].bytes_mean, b1, sizeof b1), mib(res[C_BATCHED].bytes_mean, b2, sizeof b2),
               res[C_WIRE16].bytes_mean / res[C_BATCHED].bytes_mean, res[C_WIRE16].step_s / res[C_BATCHED].step_s,
               b.warmup + b.steps, b.wire16_diff, b.wire16_diff / b.wire16_update, b.wire16_update);
      if (run[C_BF16NS] && run[C_BF16NS32] && b.P > 1)
        printf("\n-- bf16 Newton-Schulz: its default bf16 wire (bf16ns) vs an fp32 wire (bf16ns32) --\n"
               "  bytes sent per rank: %s vs %s (%.4fx); step time bf16ns / bf16ns32 = %.2fx; the parameters must be "
               "bitwise equal (below)\n",
               mib(res[C_BF16NS].bytes_mean, b1, sizeof b1), mib(res[C_BF16NS32].bytes_mean, b2, sizeof b2),
               res[C_BF16NS].bytes_mean / res[C_BF16NS32].bytes_mean, res[C_BF16NS].step_s / res[C_BF16NS32].step_s);
      for (c = 0, i = 0; c < N_CONFIGS; c++) i += run[c];
      if (i > 1)
        printf("\n-- check: parameters after %d steps of every configuration run here are %s --\n", b.warmup + b.steps,
               bad == 0 ? "bitwise identical (each rank's rows; the fp32 ones among themselves, bf16ns with bf16ns32)"
                        : "NOT identical: a configuration computes something else");
      printf("bench_dist (%d ranks): %.0f s\n", b.P, now_s() - start);
    }
    if (bad != 0) { muon_comm_destroy(&b.world); return 1; }
  }
  for (k = 0; k < b.n; k++) { free(b.m[k].w); free(b.m[k].g); }
  free(b.m); free(b.hash); free(b.done); free(b.batched_rows); free(b.initial_rows);
  muon_comm_destroy(&b.world);
  return 0;
}
