/* fuzz_models.h - the optimizers the state fuzz target loads blobs into, and a reader of the
   state blob format (version 4, the comment above MUON__STATE_VERSION in muon.h).

   Shared by tests/fuzz/fuzz_state.c and tests/fuzz/make_seeds.c, so the seed blobs are saved
   by exactly the optimizers the target builds (same names, shapes, groups and layouts) and load
   into them. The includer defines MUON_IMPLEMENTATION and includes muon.h first.

   The models (FZ_MODELS of them):
     0 "a": one device; group 0 plain Muon, group 1 NorMuon LARGER; a.w0 4x6 (group 0),
            a.w1 6x3 and a.w2 2x5 (group 1: v per row, per column); AdamW a.b0 (5), a.b1 (3).
     1 "b": one device; NorMuon ROWS, SGD momentum without Nesterov, MATCH_RMS_ADAMW, cautious
            weight decay; b.s two stacked 2x4 slices (b.s[0], b.s[1]) and b.w 3x3; AdamW b.e,
            elements [2, 6) of 10 (a ZeRO shard).
     2 "c": distributed (muon_layout_config) over a world of 1 or 2 ranks, NorMuon LARGER:
            c.w0 6x4 and c.w1 5x3 (layout key 7) with layouts, AdamW c.bias of 6 (halves on 2
            ranks). A world of one uses levels of one rank, so its blobs carry non-trivial
            layout records; the 2-rank blobs reshard into it.
     3 "d": one device, plain Muon and nothing else: d.w 3x7. */
#ifndef FUZZ_MODELS_H
#define FUZZ_MODELS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define FZ_MODELS_UNUSED __attribute__((unused))
#else
#define FZ_MODELS_UNUSED
#endif

#define FZ_MODELS 4
#define FZ_MAX_TENSORS 8
#define FZ_LAYOUT_RECORD (12u + 32u * MUON_MAX_LEVELS)

typedef struct fz_model {
  int id, rank, world;
  muon_optimizer *opt;
  int n_param;                     /* buffers: Muon params (one per muon_add_matrix call), then AdamW */
  float *param[FZ_MAX_TENSORS], *grad[FZ_MAX_TENSORS];
  size_t size[FZ_MAX_TENSORS];
} fz_model;

static float fz_value(unsigned a, unsigned b) {      /* a small deterministic value in [-0.5, 0.5) */
  unsigned h = a * 2654435761u ^ (b + 0x9e3779b9u) * 40503u;
  h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
  return (float)(h & 0xffffu) / 65536.0f - 0.5f;
}

static float fz_grad_value(unsigned a, unsigned b) { /* never zero: |g| in [0.05, 0.55) */
  float v = fz_value(a ^ 0x5555u, b);
  return v < 0 ? v - 0.05f : v + 0.05f;
}

static float *fz_buffer(fz_model *m, size_t n, unsigned seed, int grad) {
  float *x = (float *)malloc((n ? n : 1) * sizeof(float));
  size_t i;
  if (!x) { fprintf(stderr, "fuzz_models: out of memory\n"); abort(); }
  for (i = 0; i < n; i++) x[i] = grad ? fz_grad_value(seed, (unsigned)i) : fz_value(seed, (unsigned)i);
  (void)m;
  return x;
}

static muon_status fz_check(muon_status st, fz_model *m, const char *what) {
  if (st != MUON_OK) {
    fprintf(stderr, "fuzz_models: model %d: %s failed: %s\n", m->id, what, muon_error(m->opt));
    abort();
  }
  return st;
}

/* Registers a matrix (count slices) with its own param and grad buffers. */
static void fz_matrix(fz_model *m, const char *name, int rows, int cols, int count, int group, const muon_layout *layout, size_t local) {
  muon_matrix x = muon_default_matrix();
  int k = m->n_param++;
  size_t n = (local ? local : (size_t)rows * cols) * (size_t)(count ? count : 1);
  m->size[k] = n;
  m->param[k] = fz_buffer(m, n, 100u * (unsigned)m->id + (unsigned)k + 1000u * (unsigned)m->rank, 0);
  m->grad[k] = fz_buffer(m, n, 100u * (unsigned)m->id + (unsigned)k + 1000u * (unsigned)m->rank, 1);
  x.name = name;
  x.param = m->param[k];
  x.grad = m->grad[k];
  x.rows = rows;
  x.cols = cols;
  x.count = count;
  x.group = group;
  x.layout = layout;
  fz_check(muon_add_matrix(m->opt, &x, NULL), m, name);
}

static void fz_adamw(fz_model *m, const char *name, size_t size, size_t offset, size_t full_size) {
  muon_adamw_param p = muon_default_adamw_param();
  int k = m->n_param++;
  m->size[k] = size;
  m->param[k] = fz_buffer(m, size, 77u * (unsigned)m->id + (unsigned)k + 1000u * (unsigned)m->rank, 0);
  m->grad[k] = fz_buffer(m, size, 77u * (unsigned)m->id + (unsigned)k + 1000u * (unsigned)m->rank, 1);
  p.name = name;
  p.param = m->param[k];
  p.grad = m->grad[k];
  p.size = size;
  p.offset = offset;
  p.full_size = full_size;
  fz_check(muon_add_adamw_param(m->opt, &p, NULL), m, name);
}

static muon_level fz_level(muon_placement placement, int dim, int size, int index) {
  muon_level l;
  memset(&l, 0, sizeof l);
  l.placement = placement;
  l.dim = dim;
  l.size = size;
  l.index = index;
  l.length = -1;
  return l;
}

/* Builds model `id` as rank `rank` of `comm` (NULL: a world of one) and takes `warm` steps.
   Aborts on any failure: the models are fixed, so a failure here is a bug. */
static FZ_MODELS_UNUSED void fz_model_build(fz_model *m, int id, const muon_comm *comm, int warm) {
  muon_desc desc = muon_default_desc();
  muon_dist_config dist = muon_layout_config();
  muon_hparams hp;
  int s;
  memset(m, 0, sizeof *m);
  m->id = id;
  m->rank = comm ? comm->rank : 0;
  m->world = comm ? comm->size : 1;
  desc.hparams.lr = 0.02f;
  if (id == 1) {
    desc.hparams.normuon = MUON_NORMUON_ROWS;
    desc.hparams.momentum_style = MUON_MOMENTUM_SGD;
    desc.hparams.nesterov = 0;
    desc.hparams.adjust_lr = MUON_ADJUST_LR_MATCH_RMS_ADAMW;
    desc.hparams.cautious_wd = 1;
    desc.adamw.lr = 0.01f;
  }
  if (id == 2) {
    desc.hparams.normuon = MUON_NORMUON_LARGER;
    desc.comm = comm;
    desc.dist = &dist;
  }
  if (id == 3) desc.hparams.ns_steps = 4;
  if (muon_create(&m->opt, &desc) != MUON_OK) {
    fprintf(stderr, "fuzz_models: model %d: muon_create failed: %s\n", id, muon_error(NULL));
    abort();
  }
  if (id == 0) {
    hp = muon_default_hparams();
    hp.lr = 0.01f;
    hp.normuon = MUON_NORMUON_LARGER;
    fz_check(muon_add_group(m->opt, &hp, NULL), m, "muon_add_group");
    fz_matrix(m, "a.w0", 4, 6, 0, 0, NULL, 0);
    fz_matrix(m, "a.w1", 6, 3, 0, 1, NULL, 0);
    fz_matrix(m, "a.w2", 2, 5, 0, 1, NULL, 0);
    fz_adamw(m, "a.b0", 5, 0, 0);
    fz_adamw(m, "a.b1", 3, 0, 0);
  } else if (id == 1) {
    fz_matrix(m, "b.s", 2, 4, 2, 0, NULL, 0);
    fz_matrix(m, "b.w", 3, 3, 0, 0, NULL, 0);
    fz_adamw(m, "b.e", 4, 2, 10);
  } else if (id == 2) {
    muon_layout l0, l1;
    memset(&l0, 0, sizeof l0);
    memset(&l1, 0, sizeof l1);
    l1.key = 7;
    if (m->world == 1) {   /* levels of one rank: the whole matrices, non-trivial records */
      l0.levels[l0.n_levels++] = fz_level(MUON_SHARD, 1, 1, 0);
      l0.levels[l0.n_levels++] = fz_level(MUON_FLAT, 0, 1, 0);
      l1.levels[l1.n_levels++] = fz_level(MUON_REPLICATE, 0, 1, 0);
      l1.levels[l1.n_levels++] = fz_level(MUON_SHARD, 0, 1, 0);
      fz_matrix(m, "c.w0", 6, 4, 0, 0, &l0, 0);
      fz_matrix(m, "c.w1", 5, 3, 0, 0, &l1, 0);
      fz_adamw(m, "c.bias", 6, 0, 6);
    } else {               /* 2 ranks: FSDP rows of c.w0, flat chunks of c.w1, halves of c.bias */
      l0.levels[l0.n_levels++] = fz_level(MUON_SHARD, 0, 2, m->rank);
      l1.levels[l1.n_levels++] = fz_level(MUON_FLAT, 0, 2, m->rank);
      fz_matrix(m, "c.w0", 6, 4, 0, 0, &l0, 12);
      fz_matrix(m, "c.w1", 5, 3, 0, 0, &l1, m->rank ? 7 : 8);
      fz_adamw(m, "c.bias", 3, 3 * (size_t)m->rank, 6);
    }
  } else {
    fz_matrix(m, "d.w", 3, 7, 0, 0, NULL, 0);
  }
  for (s = 0; s < warm; s++) fz_check(muon_step(m->opt), m, "warm-up muon_step");
}

static FZ_MODELS_UNUSED void fz_model_free(fz_model *m) {
  int k;
  muon_destroy(m->opt);
  for (k = 0; k < m->n_param; k++) { free(m->param[k]); free(m->grad[k]); }
  memset(m, 0, sizeof *m);
}

/* ---- the blob format ------------------------------------------------------------------------ */
static uint64_t fz_fnv1a(const unsigned char *p, size_t n) {
  uint64_t h = 14695981039346656037ull;
  size_t i;
  for (i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
  return h;
}

static uint32_t fz_get32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t fz_get64(const unsigned char *p) { return (uint64_t)fz_get32(p) | (uint64_t)fz_get32(p + 4) << 32; }

/* Rewrites the last 8 bytes as the FNV-1a checksum of the rest (what muon_state_save writes),
   so mutated blobs get past the checksum to the record checks. */
static FZ_MODELS_UNUSED void fz_fix_checksum(unsigned char *b, size_t n) {
  uint64_t h;
  int k;
  if (n < 8) return;
  h = fz_fnv1a(b, n - 8);
  for (k = 0; k < 8; k++) b[n - 8 + k] = (unsigned char)(h >> (8 * k));
}

typedef struct fz_matrix_rec {
  uint32_t rows, cols, v_len;
  uint64_t size, name_hash;
  const unsigned char *momentum, *layout, *v;
} fz_matrix_rec;

typedef struct fz_adamw_rec {
  uint64_t size, step, name_hash, full_size, offset;
  const unsigned char *exp_avg, *exp_avg_sq;
} fz_adamw_rec;

typedef struct fz_blob {
  uint32_t version, n_matrices, n_adamw, rank, world, n_groups, n_adamw_groups;
  uint64_t steps, run;
  const unsigned char *groups;     /* the group section (Muon groups, then AdamW groups)        */
  size_t groups_len;
  int groups_canonical;            /* every group record has the length this muon.h writes       */
  fz_matrix_rec matrix[FZ_MAX_TENSORS];
  fz_adamw_rec adamw[FZ_MAX_TENSORS];
} fz_blob;

/* Reads a version-1 blob, independently of muon.h's reader. Returns 0 if it is not one (or has
   more records than FZ_MAX_TENSORS); checks framing only, not the checksum. Group records are
   length-prefixed: a Muon group's holds at least 7 u32 and its ns_steps triples. */
static FZ_MODELS_UNUSED int fz_blob_read(const unsigned char *b, size_t n, fz_blob *out) {
  size_t at = 56, end;
  uint32_t i;
  memset(out, 0, sizeof *out);
  if (n < 64 || memcmp(b, "MUONSTAT", 8) != 0) return 0;
  end = n - 8;
  out->version = fz_get32(b + 8);
  out->n_matrices = fz_get32(b + 12);
  out->n_adamw = fz_get32(b + 16);
  out->steps = fz_get64(b + 24);
  out->run = fz_get64(b + 32);
  out->rank = fz_get32(b + 40);
  out->world = fz_get32(b + 44);
  out->n_groups = fz_get32(b + 48);
  out->n_adamw_groups = fz_get32(b + 52);
  if (out->version != 1 || out->n_matrices > FZ_MAX_TENSORS || out->n_adamw > FZ_MAX_TENSORS || out->n_groups > 64 || out->n_adamw_groups > 64) return 0;
  out->groups = b + at;
  out->groups_canonical = 1;
  for (i = 0; i < out->n_groups; i++) {   /* u32 length, 16 u32 fields + ns_steps triples; ns_steps is the 7th */
    uint32_t len, k;
    if (end - at < 32) return 0;
    len = fz_get32(b + at);
    k = fz_get32(b + at + 4 + 24);
    if (k < 1 || k > 16 || len > end - at - 4 || len < 4 * (7 + 3 * (size_t)k)) return 0;
    /* the last field, momentum_format, stays the loader's (FP32 in these models): another value
       in the blob is converted, not kept */
    if (len != 4 * (16 + 3 * (size_t)k) || fz_get32(b + at + len) != 0) out->groups_canonical = 0;
    at += 4 + (size_t)len;
  }
  for (i = 0; i < out->n_adamw_groups; i++) {
    uint32_t len;
    if (end - at < 4) return 0;
    len = fz_get32(b + at);
    if (len > end - at - 4) return 0;
    if (len != 24) out->groups_canonical = 0;
    at += 4 + (size_t)len;
  }
  out->groups_len = (size_t)(b + at - out->groups);
  for (i = 0; i < out->n_matrices; i++) {
    fz_matrix_rec *m = &out->matrix[i];
    if (end - at < 24) return 0;
    m->rows = fz_get32(b + at);
    m->cols = fz_get32(b + at + 4);
    m->size = fz_get64(b + at + 8);
    m->name_hash = fz_get64(b + at + 16);
    at += 24;
    if (m->size > (end - at) / 4) return 0;
    m->momentum = b + at;
    at += 4 * (size_t)m->size;
    if (end - at < FZ_LAYOUT_RECORD + 4) return 0;
    m->layout = b + at;
    at += FZ_LAYOUT_RECORD;
    m->v_len = fz_get32(b + at);
    at += 4;
    if (m->v_len > (end - at) / 4) return 0;
    m->v = b + at;
    at += 4 * (size_t)m->v_len;
  }
  for (i = 0; i < out->n_adamw; i++) {
    fz_adamw_rec *a = &out->adamw[i];
    if (end - at < 40) return 0;
    a->size = fz_get64(b + at);
    a->step = fz_get64(b + at + 8);
    a->name_hash = fz_get64(b + at + 16);
    a->full_size = fz_get64(b + at + 24);
    a->offset = fz_get64(b + at + 32);
    at += 40;
    if (a->size > (end - at) / 8) return 0;
    a->exp_avg = b + at;
    a->exp_avg_sq = b + at + 4 * (size_t)a->size;
    at += 8 * (size_t)a->size;
  }
  return at == end;
}

/* Largest |x| of n little-endian floats (NaN or Inf: HUGE_VAL). */
static FZ_MODELS_UNUSED double fz_max_abs(const unsigned char *p, size_t n) {
  double most = 0;
  size_t i;
  for (i = 0; i < n; i++) {
    uint32_t u = fz_get32(p + 4 * i);
    float x;
    memcpy(&x, &u, sizeof x);
    if ((u & 0x7f800000u) == 0x7f800000u) return HUGE_VAL;
    if (fabs((double)x) > most) most = fabs((double)x);
  }
  return most;
}

#endif /* FUZZ_MODELS_H */
