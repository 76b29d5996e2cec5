/* common.h - what every distributed example shares, so each example shows only its strategy.

   - ex_init: the Gloo world from the environment muonrun (or torchrun / mpirun) sets; built
     with -DEX_NCCL (which implies -DEX_CUDA), an NCCL world instead; with -DEX_MPI an MPI
     world (muon_mpi_create: run under mpirun).
   - ex_mesh: the group along one dimension of a row-major device mesh.
   - ex_run: a synthetic model trained for a few steps with the given config, next to a
     single-device run of the same data in the same program, and the bitwise check. Before
     training, muon_check_layouts checks muon's layouts against this file's own piece logic;
     after, muon_gather_matrix assembles every matrix on its owner, which compares it with the
     single-device parameter and momentum.
   Options: --steps N, --quiet, --cautious (cautious weight decay), --gram (Gram Newton-Schulz),
   --normuon rows|larger (NorMuon as the paper, or as nanochat keeps it), --late (after the first
   step every rank and the single device register one more matrix, whole on every rank: muon
   re-plans, owners move, and NorMuon's second moments must move with them; with --partial no
   owner moves, as a Partial matrix's momentum stays where it is), --plan (rank 0 prints muon_plan_text), --dump PATH (muon_dump_file
   of the distributed run to PATH and of rank 0's single-device run to PATH.ref, for
   tools/muoncmp), --wrong-dim (muon is told the other TP dim than the one the pieces are cut
   by: the mistake muon_check_layouts and muoncmp are there to find), --bf16 (Newton-Schulz in
   bf16, as torch runs it: the exchange then carries bf16 by default, changing no bit), --wire
   fp32|bf16 (muon_dist_config.wire; either prints the exchange's payload bytes too), --prefetch N
   and --async (muon_dist_config.prefetch / .async: exchanges overlapped with Newton-Schulz),
   --round-bytes N (muon_dist_config.round_bytes: small values give many rounds to overlap),
   --partial sum|mean (muon_auto_desc.partial: every rank's gradient over ddp, cp and HSDP's
   replicate group is only its part, as before a DDP all-reduce; the single device gets their
   sum, part 0 first, or its mean; rank 0 prints the exchange's bytes per rank against
   2(P-1)/P S, and they must match exactly where every rank holds every matrix whole), --sr
   (stochastic rounding, desc.rounding = MUON_ROUND_STOCHASTIC: every matrix and AdamW param gets
   a bf16 mirror, and the check compares the mirrors too: a ZeRO piece of "wte" must draw the
   full tensor's random bits; not with --partial, whose AdamW chunks refuse it), --momentum
   fp32|bf16|int8 (muon_hparams.momentum_format: the momentum stored as bf16 or 8-bit blocks, on
   every rank and on the single device, still bitwise equal).

   The task: every matrix W is pulled toward a random target T, loss = 1/2 sum (W - T)^2, with
   gradient (W - T) + noise. The gradient is element-wise, so each rank computes its own piece
   of it without talking; the Muon update is not, which is what muon distributes.

   Each rank's piece of a full matrix is computed here independently of muon's own piece logic
   (by slicing an index array level by level), so the check also tests the layouts. */
#ifndef MUON_EXAMPLES_COMMON_H
#define MUON_EXAMPLES_COMMON_H

#include "muon.h"
#include "muon_gloo.h"
#if defined(EX_NCCL) && !defined(EX_CUDA)
#define EX_CUDA
#endif
#ifdef EX_CUDA
#include <cuda_runtime_api.h>
#include "muon_cuda.h"
#endif
#ifdef EX_NCCL
#include "muon_nccl.h"
#endif
#ifdef EX_MPI
#define MUON_MPI_IMPLEMENTATION   /* one translation unit per example */
#include "muon_mpi.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ex_world {
  muon_comm world;
  int rank, size;
  int steps;          /* --steps N (default 5) */
  int quiet;          /* --quiet: only the check line */
  int plan;           /* --plan */
  int wrong_dim;      /* --wrong-dim */
  int cautious;       /* --cautious: cautious weight decay (muon_hparams.cautious_wd) */
  int gram;           /* --gram: Gram Newton-Schulz (muon_hparams.ns_algorithm) */
  muon_normuon normuon; /* --normuon rows|larger (muon_hparams.normuon) */
  int late;           /* --late */
  int bf16;           /* --bf16: muon_hparams.precision = MUON_PRECISION_BF16 */
  int wire;           /* --wire fp32|bf16: muon_dist_config.wire (0: AUTO) */
  int prefetch, async; /* --prefetch N, --async: muon_dist_config.prefetch / .async */
  long round_bytes;   /* --round-bytes N: muon_dist_config.round_bytes (small: many rounds) */
  int partial;        /* --partial sum|mean: muon_auto_desc.partial */
  muon_reduce reduce;
  const char *dump;   /* --dump PATH */
  int sr;             /* --sr: stochastic rounding into bf16 mirrors */
  muon_momentum_format mom_fmt; /* --momentum fp32|bf16|int8: muon_hparams.momentum_format */
} ex_world;

/* One matrix (or a stack of `count`) of the model, as every rank sees it. */
typedef struct ex_spec {
  const char *name;
  int rows, cols;
  int count;          /* 0/1: one matrix; L: L stacked slices in one buffer */
  int absent;         /* 1: this rank does not hold it (another expert or stage) */
  int tp_dim;         /* for muon_auto_config: 0, 1, or -1 replicated over tp */
  int expert;         /* for muon_auto_config: expert id, -1 dense */
  muon_layout layout; /* for muon_layout_config (ex_run's `layouts` = 1) */
} ex_spec;

static inline void ex_die(const ex_world *w, const char *what, const char *why) {
  fprintf(stderr, "rank %d: %s: %s\n", w ? w->rank : -1, what, why);
  exit(1);
}

static const muon_compute *ex_compute(const ex_world *w);
#ifdef EX_NCCL
static cudaStream_t ex__nccl_stream;   /* --async: the exchanges' own stream */
#endif

static inline ex_world ex_init(int argc, char **argv) {
  ex_world w;
  int i;
  memset(&w, 0, sizeof w);
  w.steps = 5;
  /* Line by line: when another rank fails, the launcher stops this one with SIGTERM, and a
     buffered line (the layout check's verdict, say) would die with it. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc) w.steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quiet")) w.quiet = 1;
    else if (!strcmp(argv[i], "--plan")) w.plan = 1;
    else if (!strcmp(argv[i], "--wrong-dim")) w.wrong_dim = 1;
    else if (!strcmp(argv[i], "--cautious")) w.cautious = 1;
    else if (!strcmp(argv[i], "--gram")) w.gram = 1;
    else if (!strcmp(argv[i], "--late")) w.late = 1;
    else if (!strcmp(argv[i], "--bf16")) w.bf16 = 1;
    else if (!strcmp(argv[i], "--prefetch") && i + 1 < argc) w.prefetch = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--async")) w.async = 1;
    else if (!strcmp(argv[i], "--round-bytes") && i + 1 < argc) w.round_bytes = atol(argv[++i]);
    else if (!strcmp(argv[i], "--wire") && i + 1 < argc) { i++; w.wire = !strcmp(argv[i], "bf16") ? MUON_WIRE_BF16 : MUON_WIRE_FP32; }
    else if (!strcmp(argv[i], "--normuon") && i + 1 < argc) { i++; w.normuon = !strcmp(argv[i], "rows") ? MUON_NORMUON_ROWS : MUON_NORMUON_LARGER; }
    else if (!strcmp(argv[i], "--dump") && i + 1 < argc) w.dump = argv[++i];
    else if (!strcmp(argv[i], "--sr")) w.sr = 1;
    else if (!strcmp(argv[i], "--momentum") && i + 1 < argc) {
      i++;
      w.mom_fmt = !strcmp(argv[i], "bf16") ? MUON_MOMENTUM_BF16 : !strcmp(argv[i], "int8") ? MUON_MOMENTUM_INT8 : MUON_MOMENTUM_FP32;
    }
    else if (!strcmp(argv[i], "--partial") && i + 1 < argc) { i++; w.partial = 1; w.reduce = !strcmp(argv[i], "mean") ? MUON_REDUCE_MEAN : MUON_REDUCE_SUM; }
  }
#ifdef EX_NCCL
  {   /* exchanges and compute on one stream, the CUDA backend's; with --async on a stream of
         their own, as llm.c keeps its nccl_stream, so that they overlap Newton-Schulz */
    muon_nccl_desc nd = muon_nccl_default_desc();
    nd.stream = muon_cuda_stream(ex_compute(NULL));
    if (w.async) {
      if (cudaStreamCreateWithFlags(&ex__nccl_stream, cudaStreamNonBlocking) != cudaSuccess) ex_die(NULL, "cudaStreamCreate", "failed");
      nd.compute_stream = nd.stream;
      nd.stream = ex__nccl_stream;
    }
    if (muon_nccl_create(&w.world, &nd) != MUON_OK) ex_die(NULL, "muon_nccl_create", muon_error(NULL));
  }
#elif defined(EX_MPI)
  if (muon_mpi_create(&w.world, NULL) != MUON_OK) ex_die(NULL, "muon_mpi_create", muon_error(NULL));
#else
  {
    muon_gloo_desc gd = muon_gloo_default_desc();
    if (muon_gloo_create(&w.world, &gd) != MUON_OK) ex_die(NULL, "muon_gloo_create", muon_error(NULL));
  }
#endif
  w.rank = w.world.rank;
  w.size = w.world.size;
  return w;
}

/* The group along mesh dimension `dim` of a row-major mesh dims[0..ndims) over the world. */
static inline muon_comm ex_mesh(ex_world *w, const int *dims, int ndims, int dim) {
  muon_comm c;
#ifdef EX_NCCL
  if (muon_nccl_mesh_subgroup(&c, &w->world, dims, ndims, dim) != MUON_OK) ex_die(w, "muon_nccl_mesh_subgroup", muon_error(NULL));
#elif defined(EX_MPI)
  if (muon_mpi_mesh_subgroup(&c, &w->world, dims, ndims, dim) != MUON_OK) ex_die(w, "muon_mpi_mesh_subgroup", muon_error(NULL));
#else
  if (muon_gloo_mesh_subgroup(&c, &w->world, dims, ndims, dim) != MUON_OK) ex_die(w, "muon_gloo_mesh_subgroup", muon_error(NULL));
#endif
  return c;
}

static inline void ex_need(const ex_world *w, int ok, const char *what) {
  if (!ok) {
    if (w->rank == 0) fprintf(stderr, "this example needs %s (got %d ranks)\n", what, w->size);
    exit(2);
  }
}

/* Where the optimizer's buffers live. Built with -DEX_CUDA the optimizers (distributed and the
   single-device reference alike) run on muon_cuda.h's backend with GPU buffers, and the host
   keeps copies to compute gradients and check bits; otherwise the CPU backend works on the host
   buffers themselves. */
#ifdef EX_CUDA
static muon_compute ex__compute;
static const muon_compute *ex_compute(const ex_world *w) {
  if (!ex__compute.vt) {
    muon_cuda_desc cd = muon_cuda_default_desc();
    if (muon_cuda_create(&ex__compute, &cd) != MUON_OK) ex_die(w, "muon_cuda_create", muon_error(NULL));
  }
  return &ex__compute;
}
static float *ex_device(const ex_world *w, size_t n) {
  void *p = NULL;
  if (cudaMalloc(&p, (n ? n : 1) * sizeof(float)) != cudaSuccess) ex_die(w, "cudaMalloc", "failed");
  return (float *)p;
}
/* muon_step returns with the update still queued on the backend's stream, a non-blocking one
   that cudaMemcpy does not wait for: the host waits for it before touching the buffers. */
static void ex_wait(const ex_world *w) {
  if (cudaStreamSynchronize((cudaStream_t)muon_cuda_stream(&ex__compute)) != cudaSuccess) ex_die(w, "cudaStreamSynchronize", "failed");
}
static void ex_put(const ex_world *w, float *dev, const float *host, size_t n) {
  ex_wait(w);
  if (cudaMemcpy(dev, host, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) ex_die(w, "cudaMemcpy", "to the GPU");
}
static void ex_get(const ex_world *w, float *host, const float *dev, size_t n) {
  ex_wait(w);
  if (cudaMemcpy(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) ex_die(w, "cudaMemcpy", "from the GPU");
}
static void ex_get_bytes(const ex_world *w, void *host, const void *dev, size_t bytes) {
  ex_wait(w);
  if (cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) ex_die(w, "cudaMemcpy", "from the GPU");
}
static void ex_get_bf16(const ex_world *w, uint16_t *host, const void *dev, size_t n) { ex_get_bytes(w, host, dev, n * 2); }
static void ex_device_free(float *p) { cudaFree(p); }
static void ex_compute_done(void) { muon_compute_destroy(&ex__compute); }
#else
static const muon_compute *ex_compute(const ex_world *w) { (void)w; return NULL; }
static float *ex_device(const ex_world *w, size_t n) { (void)w; (void)n; return NULL; }
static void ex_put(const ex_world *w, float *dev, const float *host, size_t n) { (void)w; (void)dev; (void)host; (void)n; }
static void ex_get(const ex_world *w, float *host, const float *dev, size_t n) { (void)w; (void)dev; (void)host; (void)n; }
static void ex_get_bf16(const ex_world *w, uint16_t *host, const void *dev, size_t n) { (void)w; (void)dev; (void)host; (void)n; }
static void ex_get_bytes(const ex_world *w, void *host, const void *dev, size_t bytes) { (void)w; (void)dev; (void)host; (void)bytes; }
static void ex_device_free(float *p) { (void)p; }
static void ex_compute_done(void) {}
#endif
#define EX_ON_DEVICE (ex_compute(NULL) != NULL)

/* Deterministic values from (name, slice, step, element): the same on every rank. */
static unsigned ex_hash(const char *s, unsigned h) {
  while (*s) h = (h ^ (unsigned char)*s++) * 16777619u;
  return h;
}
static float ex_value(unsigned seed, long long i) {
  unsigned x = seed ^ (unsigned)(i * 2654435761u);
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return (float)(x & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

/* This rank's elements of a rows x cols matrix, as full-matrix flat indices in local order:
   an index array sliced level by level (torch.chunk: chunks of ceil(d/size)). */
static long long ex_chunk(long long d, int size, int index, long long *lo) {
  long long c = (d + size - 1) / size, a = index * c < d ? index * c : d, b = a + c < d ? a + c : d;
  *lo = a;
  return b - a;
}
static size_t ex_piece(const muon_layout *l, int rows, int cols, long long *idx) {
  long long h = rows, wd = cols, n = (long long)rows * cols, lo, k, r, c;
  int flat = 0, i;
  for (k = 0; k < n; k++) idx[k] = k;
  for (i = 0; l && i < l->n_levels; i++) {
    const muon_level *v = &l->levels[i];
    if (v->placement == MUON_REPLICATE || v->placement == MUON_PARTIAL) continue;
    if (v->placement == MUON_FLAT || flat) {
      long long len = v->placement == MUON_FLAT && v->length >= 0 ? v->length : ex_chunk(n, v->size, v->index, &lo);
      if (v->placement == MUON_FLAT && v->length >= 0) lo = v->offset;
      memmove(idx, idx + lo, (size_t)len * sizeof *idx);
      n = len;
      flat = 1;
    } else if (v->dim == 0) {
      long long hh = ex_chunk(h, v->size, v->index, &lo);
      memmove(idx, idx + lo * wd, (size_t)(hh * wd) * sizeof *idx);
      h = hh;
      n = h * wd;
    } else {
      long long ww = ex_chunk(wd, v->size, v->index, &lo);
      for (r = 0; r < h; r++)
        for (c = 0; c < ww; c++) idx[r * ww + c] = idx[r * wd + lo + c];
      wd = ww;
      n = h * wd;
    }
  }
  return (size_t)n;
}

/* Replicas hold the same piece; the loss counts each element once. */
static int ex_replication(const muon_layout *l) {
  int i, n = 1;
  for (i = 0; l && i < l->n_levels; i++)
    if (l->levels[i].placement == MUON_REPLICATE || l->levels[i].placement == MUON_PARTIAL) n *= l->levels[i].size;
  return n;
}

/* PARTIAL levels: how many parts a gradient has, this rank's (the first level's index most
   significant) and MEAN's factor. */
static int ex_parts(const muon_layout *l, int *part, float *scale) {
  int i, n = 1, mean = 1;
  *part = 0;
  for (i = 0; l && i < l->n_levels; i++) {
    const muon_level *v = &l->levels[i];
    if (v->placement != MUON_PARTIAL) continue;
    n *= v->size;
    *part = *part * v->size + v->index;
    if (v->reduce == MUON_REDUCE_MEAN) mean *= v->size;
  }
  *scale = 1.0f / (float)mean;
  return n;
}

/* Part p > 0 of a Partial gradient (part 0 is the loss's gradient itself). */
static float ex_part_noise(unsigned seed, int p, long long e) { return 0.1f * ex_value(seed ^ (0x9e3779b9u * (unsigned)p), e); }

typedef struct ex_slice {     /* one matrix (one slice of a stack) on this rank */
  const ex_spec *spec;
  char name[48];
  float *full_w, *full_t, *full_g;   /* the single-device run */
  long long *idx;                    /* this rank's elements */
  size_t n;
  float *w, *g;                      /* this rank's piece (inside the stacked buffer) */
  float *dev_full_w, *dev_full_g, *dev_w, *dev_g;  /* their GPU copies (EX_CUDA) */
  uint16_t *full_mirror, *mirror;    /* --sr: bf16 mirrors of full_w and w */
  void *dev_full_mirror, *dev_mirror;
  int repl;
  int part, parts;                   /* --partial: this rank's part of the gradient, of how many */
  float scale;                       /* MEAN's factor */
} ex_slice;

/* The framework's position of local element k of local matrix `matrix`: what this file's own
   piece logic (ex_piece) says, independently of muon's. */
static long long ex_index(void *user, int matrix, size_t k) { return ((const ex_slice *)user)[matrix].idx[k]; }

/* The AdamW half, as trainers keep it: an embedding ("wte") sharded ZeRO-style over the world
   (muon_adamw_param.offset / full_size) and a norm ("ln") replicated on every rank; with
   --partial the norm's gradient is a part too (muon_dist_config.adamw_layout says over which
   groups), so muon sums it, keeps its moments ZeRO-1 style and all-gathers the update. */
#define EX_AW 2
static const char *const ex_aw_name[EX_AW] = { "wte", "ln" };
static const int ex_aw_size[EX_AW] = { 96, 24 };
typedef struct ex_adamw {
  float full[EX_AW][96], full_g[EX_AW][96], t[EX_AW][96];   /* the single-device run, targets */
  float mine[EX_AW][96], mine_g[EX_AW][96];                  /* this rank's piece */
  size_t lo[EX_AW], n[EX_AW];
  int part[EX_AW], parts[EX_AW];     /* --partial: this rank's part of the gradient, of how many */
  float scale[EX_AW];
  float *dev_full[EX_AW], *dev_full_g[EX_AW], *dev_mine[EX_AW], *dev_mine_g[EX_AW];
  uint16_t full_mirror[EX_AW][96], mine_mirror[EX_AW][96];   /* --sr: the bf16 mirrors */
  float *dev_full_mirror[EX_AW], *dev_mine_mirror[EX_AW];
} ex_adamw;

static void ex_adamw_add(const ex_world *w, ex_adamw *a, muon_optimizer *opt, muon_optimizer *ref, const muon_dist_config *cfg) {
  int k;
  size_t e;
  for (k = 0; k < EX_AW; k++) {
    muon_adamw_param p = muon_default_adamw_param(), r = muon_default_adamw_param();
    muon_layout lay;
    long long lo = 0, n = ex_aw_size[k];
    if (k == 0) n = ex_chunk(ex_aw_size[k], w->size, w->rank, &lo);
    a->lo[k] = (size_t)lo;
    a->n[k] = (size_t)n;
    for (e = 0; e < (size_t)ex_aw_size[k]; e++) {
      a->full[k][e] = ex_value(ex_hash(ex_aw_name[k], 17u), (long long)e);
      a->t[k][e] = ex_value(ex_hash(ex_aw_name[k], 18u), (long long)e);
    }
    memcpy(a->mine[k], a->full[k] + lo, (size_t)n * sizeof(float));
    r.name = p.name = ex_aw_name[k];
    r.param = a->full[k]; r.grad = a->full_g[k]; r.size = (size_t)ex_aw_size[k];
    p.param = a->mine[k]; p.grad = a->mine_g[k]; p.size = (size_t)n;
    if (k == 0) { p.offset = (size_t)lo; p.full_size = (size_t)ex_aw_size[k]; }
    memset(&lay, 0, sizeof lay);   /* the parts are cut the way muon is told */
    if (cfg && cfg->adamw_layout) cfg->adamw_layout(cfg->state, k, &p, &lay);
    a->parts[k] = ex_parts(&lay, &a->part[k], &a->scale[k]);
    if (EX_ON_DEVICE) {
      a->dev_full[k] = ex_device(w, (size_t)ex_aw_size[k]); a->dev_full_g[k] = ex_device(w, (size_t)ex_aw_size[k]);
      a->dev_mine[k] = ex_device(w, (size_t)n); a->dev_mine_g[k] = ex_device(w, (size_t)n);
      ex_put(w, a->dev_full[k], a->full[k], (size_t)ex_aw_size[k]);
      ex_put(w, a->dev_mine[k], a->mine[k], (size_t)n);
      r.param = a->dev_full[k]; r.grad = a->dev_full_g[k];
      p.param = a->dev_mine[k]; p.grad = a->dev_mine_g[k];
    }
    if (w->sr) {
      r.mirror = a->full_mirror[k];
      p.mirror = a->mine_mirror[k];
      if (EX_ON_DEVICE) {   /* floats enough for the bf16 elements */
        r.mirror = a->dev_full_mirror[k] = ex_device(w, (size_t)ex_aw_size[k]);
        p.mirror = a->dev_mine_mirror[k] = ex_device(w, (size_t)n);
      }
    }
    if (muon_add_adamw_param(opt, &p, NULL) != MUON_OK) ex_die(w, "muon_add_adamw_param", muon_error(opt));
    if (muon_add_adamw_param(ref, &r, NULL) != MUON_OK) ex_die(w, "muon_add_adamw_param (reference)", muon_error(ref));
  }
}

/* Gradients of step t from the current parameters: (p - t) + noise, the same on every rank. */
static void ex_adamw_grads(const ex_world *w, ex_adamw *a, int t) {
  int k;
  size_t e;
  for (k = 0; k < EX_AW; k++) {
    unsigned seed = ex_hash(ex_aw_name[k], 31u * (unsigned)(t + 1));
    if (EX_ON_DEVICE) {
      ex_get(w, a->full[k], a->dev_full[k], (size_t)ex_aw_size[k]);
      ex_get(w, a->mine[k], a->dev_mine[k], a->n[k]);
    }
    for (e = 0; e < (size_t)ex_aw_size[k]; e++) {   /* Partial: the parts summed in order, part 0 first */
      float g = (a->full[k][e] - a->t[k][e]) + 0.1f * ex_value(seed, (long long)e);
      int q;
      for (q = 1; q < a->parts[k]; q++) g = g + ex_part_noise(seed, q, (long long)e);
      a->full_g[k][e] = a->parts[k] > 1 ? a->scale[k] * g : g;
    }
    for (e = 0; e < a->n[k]; e++)
      a->mine_g[k][e] = a->part[k] ? ex_part_noise(seed, a->part[k], (long long)(a->lo[k] + e))
                                   : (a->mine[k][e] - a->t[k][a->lo[k] + e]) + 0.1f * ex_value(seed, (long long)(a->lo[k] + e));
    if (EX_ON_DEVICE) {
      ex_put(w, a->dev_full_g[k], a->full_g[k], (size_t)ex_aw_size[k]);
      ex_put(w, a->dev_mine_g[k], a->mine_g[k], a->n[k]);
    }
  }
}

/* Elements of this rank's pieces that differ from the single device's, bitwise. */
static long long ex_adamw_check(const ex_world *w, ex_adamw *a) {
  long long bad = 0;
  int k;
  size_t e;
  for (k = 0; k < EX_AW; k++) {
    if (EX_ON_DEVICE) {
      ex_get(w, a->full[k], a->dev_full[k], (size_t)ex_aw_size[k]);
      ex_get(w, a->mine[k], a->dev_mine[k], a->n[k]);
    }
    for (e = 0; e < a->n[k]; e++) bad += memcmp(&a->mine[k][e], &a->full[k][a->lo[k] + e], sizeof(float)) != 0;
    if (w->sr) {
      if (EX_ON_DEVICE) {
        ex_get_bf16(w, a->full_mirror[k], a->dev_full_mirror[k], (size_t)ex_aw_size[k]);
        ex_get_bf16(w, a->mine_mirror[k], a->dev_mine_mirror[k], a->n[k]);
      }
      for (e = 0; e < a->n[k]; e++) bad += a->mine_mirror[k][e] != a->full_mirror[k][a->lo[k] + e];
    }
    ex_device_free(a->dev_full[k]); ex_device_free(a->dev_full_g[k]); ex_device_free(a->dev_mine[k]); ex_device_free(a->dev_mine_g[k]);
    if (w->sr) { ex_device_free(a->dev_full_mirror[k]); ex_device_free(a->dev_mine_mirror[k]); }
  }
  return bad;
}

/* Trains both runs for w->steps steps; returns 0 when the distributed parameters equal the
   single-device ones bit for bit, and prints the check line on rank 0. `auto_desc` (may be
   NULL) gets tp_dim_per_matrix / expert_of_matrix filled from the specs and is turned into the
   config; otherwise `cfg` is used, with each spec's layout when `layouts` is set. */
/* --late: one more matrix, whole on every rank (a layout of no levels), registered between steps
   on the distributed optimizer and the single device alike; owner[] gets the owners before. Its
   values never change the check (the check compares the example's own matrices). */
#define EX_LATE_ROWS 40
#define EX_LATE_COLS 56
static float *ex__late_dev[4];   /* the late matrix's device buffers, freed by ex_run */
static void ex_late(const ex_world *w, muon_optimizer *opt, muon_optimizer *ref, int n_local, int *owner) {
  static float host_w[2][EX_LATE_ROWS * EX_LATE_COLS], host_g[EX_LATE_ROWS * EX_LATE_COLS];
  static muon_layout whole;
  size_t n = EX_LATE_ROWS * EX_LATE_COLS, e;
  int k, s;
  for (s = 0; s < n_local; s++) muon_get_owner(opt, s, &owner[s]);
  for (e = 0; e < n; e++) { host_g[e] = ex_value(4242u, (long long)e); host_w[0][e] = host_w[1][e] = ex_value(4243u, (long long)e); }
  for (k = 0; k < 2; k++) {
    muon_matrix m = muon_default_matrix();
    m.name = "late";
    m.rows = EX_LATE_ROWS;
    m.cols = EX_LATE_COLS;
    m.param = host_w[k];
    m.grad = host_g;
    if (EX_ON_DEVICE) {
      float *dw = ex__late_dev[2 * k] = ex_device(w, n), *dg = ex__late_dev[2 * k + 1] = ex_device(w, n);
      ex_put(w, dw, host_w[k], n);
      ex_put(w, dg, host_g, n);
      m.param = dw;
      m.grad = dg;
    }
    if (k == 0) m.layout = &whole;
    if (muon_add_matrix(k ? ref : opt, &m, NULL) != MUON_OK) ex_die(w, "muon_add_matrix (late)", muon_error(k ? ref : opt));
  }
}

static inline int ex_run(ex_world *w, const char *title, const ex_spec *specs, int n_specs, muon_auto_desc *auto_desc,
                  const muon_dist_config *cfg_in, int layouts) {
  muon_desc desc = muon_default_desc(), ref_desc;
  muon_cpu_desc one_thread = muon_cpu_default_desc();
  muon_compute ref_cpu = { NULL, NULL };
  muon_dist_config cfg = auto_desc ? muon_auto_config(auto_desc) : *cfg_in;
  long long step0_sent = 0, whole = 1, pure = 1, full_bytes = 0, aw_bytes = 0;
  muon_optimizer *opt, *ref;
  muon_stats st;
  ex_slice *sl;
  int n_local = 0, i, k, s, t, n_sl = 0, *tp_dims, *experts, local;
  double maxdiff = 0, loss;
  long long bad = 0, sums[3], *all_sums, moved = 0, announced[3] = { -1, -1, -1 }, late_moved = 0;
  int *late_owner;
  static ex_adamw aw;
  muon_stats before;
  memset(&before, 0, sizeof before);
  for (i = 0; i < n_specs; i++) n_sl += specs[i].count > 1 ? specs[i].count : 1;
  sl = (ex_slice *)calloc((size_t)n_sl, sizeof *sl);
  tp_dims = (int *)calloc((size_t)n_sl + 1, sizeof(int));
  experts = (int *)calloc((size_t)n_sl + 1, sizeof(int));
  all_sums = (long long *)calloc(3 * (size_t)w->size, sizeof(long long));
  late_owner = (int *)calloc((size_t)n_sl + 1, sizeof(int));
  desc.hparams.lr = 0.02f;
  desc.hparams.cautious_wd = w->cautious;
  desc.hparams.ns_algorithm = w->gram ? MUON_NS_GRAM : MUON_NS_STANDARD;
  desc.hparams.normuon = w->normuon;
  desc.hparams.momentum_format = w->mom_fmt;
  desc.hparams.precision = w->bf16 ? MUON_PRECISION_BF16 : MUON_PRECISION_FP32;
  if (w->sr) {
    desc.rounding = MUON_ROUND_STOCHASTIC;
    desc.seed = 20240917;
  }
  cfg.wire = (muon_wire)w->wire;
  cfg.prefetch = w->prefetch;
  cfg.async = w->async;
  if (w->round_bytes > 0) cfg.round_bytes = (size_t)w->round_bytes;
  desc.comm = &w->world;
  desc.dist = &cfg;
  desc.compute = ex_compute(w);
  ref_desc = desc;
  ref_desc.comm = NULL;
  ref_desc.dist = NULL;
  one_thread.threads.count = 1;   /* the reference: one device, one thread, whatever MUON_THREADS says */
  if (!desc.compute) {
    if (muon_cpu_create(&ref_cpu, &one_thread) != MUON_OK) ex_die(w, "muon_cpu_create", muon_error(NULL));
    ref_desc.compute = &ref_cpu;
  }
  if (muon_create(&opt, &desc) != MUON_OK || muon_create(&ref, &ref_desc) != MUON_OK) ex_die(w, "muon_create", "failed");
  /* Local indices, for the per-matrix arrays of muon_auto_config. */
  for (i = 0, local = 0; i < n_specs; i++) {
    int count = specs[i].count > 1 ? specs[i].count : 1;
    if (specs[i].absent) continue;
    for (k = 0; k < count; k++, local++) { tp_dims[local] = specs[i].tp_dim; experts[local] = specs[i].expert; }
  }
  if (auto_desc) {
    auto_desc->tp_dim_per_matrix = tp_dims;
    auto_desc->expert_of_matrix = experts;
    auto_desc->partial = w->partial;
    auto_desc->reduce = w->reduce;
  }
  /* Every rank builds the full matrices of what it holds: the single-device run. */
  for (i = 0, s = 0, local = 0; i < n_specs; i++) {
    const ex_spec *sp = &specs[i];
    int count = sp->count > 1 ? sp->count : 1;
    size_t full = (size_t)sp->rows * sp->cols, piece = 0, stride;
    muon_layout lay;
    muon_matrix m = muon_default_matrix();
    float *wbuf, *gbuf;
    if (sp->absent) continue;
    memset(&lay, 0, sizeof lay);
    if (layouts) lay = sp->layout;
    else if (cfg.layout) cfg.layout(cfg.state, local, &m, &lay);   /* the pieces are cut this way */
    if (w->wrong_dim && auto_desc)   /* ... but muon is told the other TP dim */
      for (k = 0; k < count; k++) tp_dims[local + k] = tp_dims[local + k] >= 0 ? 1 - tp_dims[local + k] : -1;
    for (k = 0; k < count; k++) {
      ex_slice *x = &sl[s + k];
      unsigned seed = ex_hash(sp->name, 2166136261u + (unsigned)k * 7919u + (unsigned)sp->expert * 104729u);
      muon_matrix r = muon_default_matrix();
      size_t e;
      x->spec = sp;
      snprintf(x->name, sizeof x->name, count > 1 ? "%s[%d]" : "%s", sp->name, k);
      x->full_w = (float *)malloc(full * sizeof(float));
      x->full_t = (float *)malloc(full * sizeof(float));
      x->full_g = (float *)malloc(full * sizeof(float));
      x->idx = (long long *)malloc(full * sizeof(long long));
      for (e = 0; e < full; e++) {
        x->full_w[e] = ex_value(seed, (long long)e) / sqrtf((float)sp->cols);
        x->full_t[e] = ex_value(seed ^ 0x5bd1e995u, (long long)e) / sqrtf((float)sp->cols);
      }
      x->n = ex_piece(&lay, sp->rows, sp->cols, x->idx);
      x->repl = ex_replication(&lay);
      x->parts = ex_parts(&lay, &x->part, &x->scale);
      whole &= x->n == full;
      pure &= x->repl == x->parts;   /* no REPLICATE level: every holder sends its own part */
      full_bytes += (long long)full * (long long)sizeof(float);
      piece = x->n;
      r.name = x->name; r.param = x->full_w; r.grad = x->full_g; r.rows = sp->rows; r.cols = sp->cols;
      if (EX_ON_DEVICE) {
        x->dev_full_w = ex_device(w, full);
        x->dev_full_g = ex_device(w, full);
        ex_put(w, x->dev_full_w, x->full_w, full);
        r.param = x->dev_full_w; r.grad = x->dev_full_g;
      }
      if (w->sr) {
        r.mirror = x->full_mirror = (uint16_t *)calloc(full, sizeof(uint16_t));
        if (EX_ON_DEVICE) r.mirror = x->dev_full_mirror = ex_device(w, full);
      }
      if (muon_add_matrix(ref, &r, NULL) != MUON_OK) ex_die(w, "muon_add_matrix (reference)", muon_error(ref));
    }
    /* The distributed run: this rank's pieces, stacked slices one after another. */
    stride = piece;
    wbuf = (float *)malloc((stride * count + 1) * sizeof(float));
    gbuf = (float *)malloc((stride * count + 1) * sizeof(float));
    for (k = 0; k < count; k++) {
      ex_slice *x = &sl[s + k];
      size_t e;
      x->w = wbuf + k * stride;
      x->g = gbuf + k * stride;
      for (e = 0; e < x->n; e++) x->w[e] = x->full_w[x->idx[e]];
    }
    m.name = sp->name; m.param = wbuf; m.grad = gbuf; m.rows = sp->rows; m.cols = sp->cols;
    if (w->sr) {   /* the mirrors of the stacked slices, one after another as the parameters */
      uint16_t *mbuf = (uint16_t *)calloc(stride * count + 1, sizeof(uint16_t));
      float *dm = EX_ON_DEVICE ? ex_device(w, stride * count + 1) : NULL;
      for (k = 0; k < count; k++) {
        sl[s + k].mirror = mbuf + k * stride;
        sl[s + k].dev_mirror = dm ? (void *)((uint16_t *)dm + k * stride) : NULL;
      }
      m.mirror = dm ? (void *)dm : (void *)mbuf;
    }
    if (EX_ON_DEVICE) {
      float *dw = ex_device(w, stride * count + 1), *dg = ex_device(w, stride * count + 1);
      for (k = 0; k < count; k++) {
        sl[s + k].dev_w = dw + k * stride;
        sl[s + k].dev_g = dg + k * stride;
        ex_put(w, sl[s + k].dev_w, sl[s + k].w, sl[s + k].n);
      }
      m.param = dw; m.grad = dg;
    }
    m.count = sp->count;
    m.layout = layouts ? &sp->layout : NULL;
    if (muon_add_matrix(opt, &m, NULL) != MUON_OK) ex_die(w, "muon_add_matrix", muon_error(opt));
    {
      const void *mom;
      size_t n;
      muon_momentum_format f;
      int whole = sl[s].parts > 1 || (w->mom_fmt == MUON_MOMENTUM_INT8 && piece != (size_t)sp->rows * (size_t)sp->cols);
      if (muon_get_momentum_stored(opt, muon_matrix_count(opt) - 1, &mom, &n, &f) != MUON_OK || n != (whole ? 0 : piece))
        ex_die(w, sp->name, "muon's piece has another size than the one cut here (--wrong-dim needs even splits)");
    }
    s += count;
    local += count;
  }
  n_local = s;
  ex_adamw_add(w, &aw, opt, ref, &cfg);
  for (k = 0; k < EX_AW; k++)   /* a Partial AdamW param's exchange moves 2 (size - chunk) B in all */
    if (aw.parts[k] > 1) {
      size_t c = ((size_t)ex_aw_size[k] + (size_t)aw.parts[k] - 1) / (size_t)aw.parts[k], lo = (size_t)aw.part[k] * c;
      c = lo >= (size_t)ex_aw_size[k] ? 0 : lo + c > (size_t)ex_aw_size[k] ? (size_t)ex_aw_size[k] - lo : c;
      aw_bytes += 4 * ((long long)ex_aw_size[k] - (long long)c + (long long)(aw.parts[k] - 1) * (long long)c);
      full_bytes += 4 * (long long)ex_aw_size[k];
    }
  if (muon_check_layouts(opt, ex_index, sl) != MUON_OK) {
    if (!w->wrong_dim) ex_die(w, "muon_check_layouts", muon_error(opt));
    if (w->rank == 0) printf("layout check FAILED: %s\n", muon_error(opt));
  } else if (!w->quiet && w->rank == 0) {
    printf("layout check: every rank's pieces are where its layout says\n");
  }
  if (muon_plan(opt) != MUON_OK) ex_die(w, "muon_plan", muon_error(opt));
  {   /* what the plan announces for this rank, checked against the first step below */
    size_t len = muon_plan_text(opt, NULL, 0);
    char *text = (char *)malloc(len + 1), line[48], *at;
    muon_plan_text(opt, text, len + 1);
    if (w->plan && w->rank == 0) fputs(text, stdout);
    snprintf(line, sizeof line, "\nrank %d: owns ", w->rank);
    if (!strstr(text, "the config's own gather") && (at = strstr(text, line)) && (at = strstr(at, "per step ")))
      sscanf(at, "per step %lld B out, %lld B in", &announced[0], &announced[1]);
    if ((at = strstr(text, "collectives per step without skips: "))) sscanf(at, "collectives per step without skips: %lld", &announced[2]);
    snprintf(line, sizeof line, "\nrank %d: Partial AdamW params ", w->rank);
    if (announced[0] >= 0 && (at = strstr(text, line)) && (at = strstr(at, "per step "))) {
      long long aw_out = 0, aw_in = 0;
      sscanf(at, "per step %lld B out, %lld B in", &aw_out, &aw_in);
      announced[0] += aw_out;
      announced[1] += aw_in;
    }
    free(text);
  }
  if (!w->quiet && w->rank == 0) printf("%s: %d ranks, %d global matrices, %d exchange rounds\n", title, w->size, muon_global_count(opt), (muon_get_stats(opt, &st), st.rounds));

  for (t = 0; t < w->steps; t++) {
    double mine = 0;
    for (s = 0; s < n_local; s++) {
      ex_slice *x = &sl[s];
      size_t e, full = (size_t)x->spec->rows * x->spec->cols;
      unsigned seed = ex_hash(x->name, 977u * (unsigned)(t + 1)) ^ (unsigned)x->spec->expert;
      if (EX_ON_DEVICE) {    /* the host computes the gradients from the current parameters */
        ex_get(w, x->full_w, x->dev_full_w, full);
        ex_get(w, x->w, x->dev_w, x->n);
      }
      for (e = 0; e < full; e++) {   /* Partial: the parts summed in order, part 0 first */
        float g = (x->full_w[e] - x->full_t[e]) + 0.1f * ex_value(seed, (long long)e);
        for (k = 1; k < x->parts; k++) g = g + ex_part_noise(seed, k, (long long)e);
        x->full_g[e] = x->parts > 1 ? x->scale * g : g;
      }
      for (e = 0; e < x->n; e++) {
        float d = x->w[e] - x->full_t[x->idx[e]];
        x->g[e] = x->part ? ex_part_noise(seed, x->part, x->idx[e]) : d + 0.1f * ex_value(seed, x->idx[e]);
        mine += 0.5 * d * d / x->repl;
      }
      if (EX_ON_DEVICE) {
        ex_put(w, x->dev_full_g, x->full_g, full);
        ex_put(w, x->dev_g, x->g, x->n);
      }
    }
    ex_adamw_grads(w, &aw, t);
    /* A decaying lr: schedules change it between steps without re-creating anything. */
    muon_set_lr(opt, 0, 0.02f * (1.0f - 0.5f * (float)t / (float)w->steps));
    muon_set_lr(ref, 0, 0.02f * (1.0f - 0.5f * (float)t / (float)w->steps));
    if (w->late && t == 1) ex_late(w, opt, ref, n_local, late_owner);
    muon_get_stats(opt, &before);
    if (muon_step(opt) != MUON_OK) ex_die(w, "muon_step", muon_error(opt));
    for (s = 0; w->late && t == 1 && s < n_local; s++) {
      int now;
      if (muon_get_owner(opt, s, &now) == MUON_OK && now != late_owner[s]) late_moved++;
    }
    if (t == 0) {   /* the first step moves what muon_plan_text announced */
      muon_get_stats(opt, &st);
      step0_sent = st.bytes_sent - before.bytes_sent;
      if ((announced[0] >= 0 && (st.bytes_sent - before.bytes_sent != announced[0] || st.bytes_received - before.bytes_received != announced[1])) ||
          st.collectives - before.collectives != announced[2]) {
        printf("rank %d: the plan text announced %lld B out, %lld B in, %lld collectives per step; the step made %lld, %lld, %lld\n", w->rank,
               announced[0], announced[1], announced[2], st.bytes_sent - before.bytes_sent, st.bytes_received - before.bytes_received, st.collectives - before.collectives);
        bad++;
      }
    }
    if (muon_step(ref) != MUON_OK) ex_die(w, "muon_step (reference)", muon_error(ref));
    /* The loss, summed over ranks (fixed point so the allgather stays integral). */
    sums[0] = (long long)(mine * 1e6);
    sums[1] = sums[2] = 0;
    if (w->world.vt->allgather(w->world.ctx, sums, all_sums, sizeof sums) != MUON_OK) ex_die(w, "allgather", "loss");
    for (k = 0, loss = 0; k < w->size; k++) loss += (double)all_sums[3 * k] / 1e6;
    if (!w->quiet && w->rank == 0) printf("step %d  loss %.4f\n", t, loss);
  }
  /* The check: every local piece against the same elements of the single-device result. */
  {
    long long aw_bad = ex_adamw_check(w, &aw);
    if (aw_bad) printf("rank %d: %lld AdamW elements differ from single device\n", w->rank, aw_bad);
    bad += aw_bad;
  }
  for (s = 0; EX_ON_DEVICE && s < n_local; s++) {
    ex_get(w, sl[s].full_w, sl[s].dev_full_w, (size_t)sl[s].spec->rows * sl[s].spec->cols);
    ex_get(w, sl[s].w, sl[s].dev_w, sl[s].n);
  }
  for (s = 0; s < n_local; s++) {
    size_t e;
    for (e = 0; e < sl[s].n; e++) {
      float a = sl[s].w[e], b = sl[s].full_w[sl[s].idx[e]];
      if (memcmp(&a, &b, sizeof a) != 0) bad++;
      if (fabs((double)a - b) > maxdiff) maxdiff = fabs((double)a - b);
    }
  }
  if (w->sr) {   /* the stochastically rounded mirrors: the full matrix's bits, whatever the layout */
    long long sr_bad = 0;
    for (s = 0; s < n_local; s++) {
      size_t e;
      if (EX_ON_DEVICE) {
        ex_get_bf16(w, sl[s].full_mirror, sl[s].dev_full_mirror, (size_t)sl[s].spec->rows * sl[s].spec->cols);
        ex_get_bf16(w, sl[s].mirror, sl[s].dev_mirror, sl[s].n);
      }
      for (e = 0; e < sl[s].n; e++) sr_bad += sl[s].mirror[e] != sl[s].full_mirror[sl[s].idx[e]];
    }
    if (sr_bad) printf("rank %d: %lld bf16 mirror elements of matrices differ from single device\n", w->rank, sr_bad);
    bad += sr_bad;
  }
  muon_get_stats(opt, &st);
  /* Whole matrices: each assembled on its owner, checked against the single-device run there. */
  {
    long long asm_bad = 0;
    int g;
    for (g = 0; g < muon_global_count(opt); g++) {
      muon_matrix_info info;
      int owner;
      float *p = NULL, *mo = NULL;
      if (muon_global_info(opt, g, &info, &owner) != MUON_OK) ex_die(w, "muon_global_info", muon_error(opt));
      if (w->rank == owner) {
        p = (float *)malloc((size_t)info.rows * info.cols * sizeof(float));
        mo = (float *)malloc((size_t)info.rows * info.cols * sizeof(float));
      }
      if (muon_gather_matrix(opt, g, owner, p, mo) != MUON_OK) ex_die(w, "muon_gather_matrix", muon_error(opt));
      for (s = 0; w->rank == owner && s < n_local; s++) {
        size_t full = (size_t)info.rows * info.cols, e;
        const void *rm;
        muon_momentum_format f;
        float *ref_m = (float *)malloc(full * sizeof(float));
        if (strcmp(sl[s].name, info.name) || info.local < 0 || s != info.local) { free(ref_m); continue; }
        if (muon_get_momentum_stored(ref, s, &rm, &e, &f) != MUON_OK || e != full || f != w->mom_fmt)
          ex_die(w, "muon_get_momentum_stored", "reference");
        if (w->mom_fmt == MUON_MOMENTUM_BF16) {   /* the reference's is bf16: muon_gather_matrix gives fp32 */
          uint16_t *h = (uint16_t *)malloc(full * sizeof(uint16_t) + 2);
          uint32_t u;
          if (EX_ON_DEVICE) ex_get_bf16(w, h, rm, full); else memcpy(h, rm, full * sizeof(uint16_t));
          for (e = 0; e < full; e++) { u = (uint32_t)h[e] << 16; memcpy(&ref_m[e], &u, 4); }
          free(h);
        } else if (w->mom_fmt == MUON_MOMENTUM_INT8) {   /* blocks: an exponent byte E, then q: q * 2^(E - 127) */
          size_t bytes = full + (full + MUON_Q8_BLOCK - 1) / MUON_Q8_BLOCK;
          unsigned char *b = (unsigned char *)malloc(bytes);
          if (EX_ON_DEVICE) ex_get_bytes(w, b, rm, bytes); else memcpy(b, rm, bytes);
          for (e = 0; e < full; e++) {
            const unsigned char *blk = b + e / MUON_Q8_BLOCK * (MUON_Q8_BLOCK + 1);
            unsigned char q = blk[1 + e % MUON_Q8_BLOCK];
            ref_m[e] = blk[0] ? ldexpf((float)(q < 128 ? (int)q : (int)q - 256), (int)blk[0] - 127) : 0.0f;
          }
          free(b);
        } else if (EX_ON_DEVICE) ex_get(w, ref_m, (const float *)rm, full); else memcpy(ref_m, rm, full * sizeof(float));
        for (e = 0; e < full; e++) asm_bad += memcmp(&p[e], &sl[s].full_w[e], 4) != 0 || memcmp(&mo[e], &ref_m[e], 4) != 0;
        free(ref_m);
      }
      free(p);
      free(mo);
    }
    if (asm_bad) printf("rank %d: %lld elements of the assembled matrices differ from single device\n", w->rank, asm_bad);
    bad += asm_bad;
  }
  if (w->dump) {
    char ref_path[512];
    if (muon_dump_file(opt, w->dump, 0, 1) != MUON_OK) ex_die(w, "muon_dump_file", muon_error(opt));
    snprintf(ref_path, sizeof ref_path, "%s.ref", w->dump);
    if (w->rank == 0 && muon_dump_file(ref, ref_path, 0, 1) != MUON_OK) ex_die(w, "muon_dump_file (reference)", muon_error(ref));
    if (!w->quiet && w->rank == 0) printf("dumped %s and %s: compare them with muoncmp\n", w->dump, ref_path);
  }
  if (!w->quiet)
    printf("rank %d: owns %d of %d matrices, NS calls %lld, sent %lld B, received %lld B, collectives %lld\n",
           w->rank, muon_owned(opt, NULL, 0), muon_global_count(opt), st.ns_calls, st.bytes_sent, st.bytes_received, st.collectives);
  if (w->late) {   /* how many matrices the late one moved to another owner, over all ranks */
    sums[0] = late_moved; sums[1] = sums[2] = 0;
    if (w->world.vt->allgather(w->world.ctx, sums, all_sums, sizeof sums) != MUON_OK) ex_die(w, "allgather", "late");
    for (k = 0, late_moved = 0; k < w->size; k++) late_moved += all_sums[3 * k];
    if (w->rank == 0) printf("late matrix: %lld local matrices changed owner\n", late_moved);
    if (w->partial && late_moved) {   /* a Partial matrix's momentum does not move: nor does its owner */
      if (w->rank == 0) printf("late matrix: a Partial matrix changed owner\n");
      bad++;
    } else if (w->size > 1 && !late_moved && !w->partial && w->mom_fmt != MUON_MOMENTUM_INT8) {
      /* --late is there to move owners: else it tested nothing (8-bit momentum in pieces stays
         on its owner, as a Partial matrix's does) */
      if (w->rank == 0) printf("late matrix: no owner moved, so no NorMuon second moment moved either\n");
      bad++;
    }
  }
  if (w->partial) {
    /* A Partial step's exchange: every piece but the owner's own goes to the owner, and O comes
       back to each of them: 2 (held - owned) bytes summed over ranks. Where every rank holds
       every matrix whole (ddp, cp) that is 2(P-1)/P S per rank, against 2(P-1)/P S for the
       trainer's all-reduce plus (P-1)/P S for muon's REPLICATE exchange. */
    long long total = 0, want = 0, ring = 2 * (long long)(w->size - 1) * full_bytes;
    sums[0] = step0_sent; sums[1] = whole | pure << 1; sums[2] = 0;
    for (s = 0; s < n_local; s++) {
      int owner = -1;
      muon_get_owner(opt, s, &owner);
      sums[2] += 2 * (long long)sl[s].n * (long long)sizeof(float) * (owner != w->rank);
    }
    sums[2] += aw_bytes;
    if (w->world.vt->allgather(w->world.ctx, sums, all_sums, sizeof sums) != MUON_OK) ex_die(w, "allgather", "partial");
    for (k = 0; k < w->size; k++) { total += all_sums[3 * k]; whole &= all_sums[3 * k + 1] & 1; pure &= all_sums[3 * k + 1] >> 1; want += all_sums[3 * k + 2]; }
    if (w->rank == 0 && whole)
      printf("partial: %.1f B per rank per step (mean over ranks) = 2(P-1)/P S = %.1f B (S = %lld B of Partial gradients); the all-reduce-then-muon path: 3(P-1)/P S = %.1f B\n",
             (double)total / w->size, (double)ring / w->size, full_bytes, 1.5 * ring / w->size);
    else if (w->rank == 0)
      printf("partial: %.1f B per rank per step (mean over ranks) = 2 x (held - owned) = %.1f B\n", (double)total / w->size, (double)want / w->size);
    if (pure && !w->late && w->wire != MUON_WIRE_BF16 && (total != want || (whole && total != ring))) {
      if (w->rank == 0) printf("partial: the exchange moved %lld B over all ranks in step 0, not 2 x (held - owned) = %lld B\n", total, want);
      bad++;
    }
  }
  sums[0] = bad;
  sums[1] = (long long)(maxdiff * 1e9);
  sums[2] = st.bytes_sent + st.bytes_received + st.control_bytes;
  if (w->world.vt->allgather(w->world.ctx, sums, all_sums, sizeof sums) != MUON_OK) ex_die(w, "allgather", "check");
  for (k = 0, bad = 0, maxdiff = 0; k < w->size; k++) {
    bad += all_sums[3 * k];
    if (all_sums[3 * k + 1] / 1e9 > maxdiff) maxdiff = all_sums[3 * k + 1] / 1e9;
    moved += all_sums[3 * k + 2];
  }
  if (w->rank == 0) {   /* the bytes let tests compare communicators: they must move the same */
    if (!bad) printf("check: bitwise equal to single device (max |diff| = 0); %lld bytes moved, %lld collectives on rank 0\n",
                     moved, st.collectives);
    else printf("check: %lld elements differ from single device (max |diff| = %g)\n", bad, maxdiff);
    if (w->bf16 || w->wire)
      printf("wire: rank 0 moved %lld payload bytes (U and O, sent + received) in %lld collectives; %d ranks\n",
             st.bytes_sent + st.bytes_received, st.collectives, w->size);
  }
  for (s = 0; s < n_local; s++) {
    free(sl[s].full_w); free(sl[s].full_t); free(sl[s].full_g); free(sl[s].idx); free(sl[s].full_mirror);
    ex_device_free(sl[s].dev_full_w); ex_device_free(sl[s].dev_full_g);
    if (w->sr) ex_device_free((float *)sl[s].dev_full_mirror);
  }
  for (i = 0, s = 0; i < n_specs; i++) {
    if (specs[i].absent) continue;
    free(sl[s].w);
    free(sl[s].g);
    ex_device_free(sl[s].dev_w);
    ex_device_free(sl[s].dev_g);
    free(sl[s].mirror);
    if (w->sr) ex_device_free((float *)sl[s].dev_mirror);
    s += specs[i].count > 1 ? specs[i].count : 1;
  }
  free(sl); free(tp_dims); free(experts); free(all_sums); free(late_owner);
  muon_destroy(opt);
  muon_destroy(ref);
  muon_compute_destroy(&ref_cpu);
  for (k = 0; k < 4; k++) { ex_device_free(ex__late_dev[k]); ex__late_dev[k] = NULL; }
  return bad ? 1 : 0;
}

/* Every example ends here: frees the groups and the world, exits with the check's verdict. */
static inline int ex_finish(ex_world *w, muon_comm *groups, int n, int rc) {
  int i;
  for (i = 0; i < n; i++) muon_comm_destroy(&groups[i]);
  muon_comm_destroy(&w->world);
#ifdef EX_NCCL
  if (ex__nccl_stream) cudaStreamDestroy(ex__nccl_stream);
#endif
  ex_compute_done();
  return rc;
}

#endif
