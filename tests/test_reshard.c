/* test_reshard.c - checkpoints that move between world sizes and layouts (muon_state_reshard).

   Two runs of this program make one test, each on its own world (muonrun -n P):
     test_reshard --layout A --save DIR             trains K1 steps under layout A, every rank
                                                    saves DIR/rank<r>.muon, then one more step
                                                    and DIR/later.rank<r>.muon
     test_reshard --layout B --load DIR --from N    a world of another size and layout reads the
                                                    N files with muon_state_reshard_files
   The load must give every rank the momentum (and AdamW moments) a single device holds after
   K1 steps, bit for bit, and K2 more steps must then equal the single device's run bit for bit.
   Every rank runs that single device in-process on the full tensors. Bad file sets (a missing
   rank, a rank twice, files of two checkpoints, a missing file, a model with a matrix the
   checkpoint lacks) must fail with MUON_ERR_STATE and change nothing. --momentum bf16 keeps
   every momentum (the reference's too) as bf16.

   Layouts: single (no dist config; 1 rank), fsdp, fsdp_flat, tp, ddp, tp_fsdp (P/2 x 2),
   hsdp (2 x P/2). The AdamW param "emb" is sharded ZeRO-style (offset / full_size) over the
   layout's FSDP group, "ln" is whole on every rank. */
#define MUON_IMPLEMENTATION
#include "common.h"
#include "test.h"

#include <errno.h>
#include <sys/stat.h>

#define K1 3
#define K2 3
#define N_SPECS 4
#define EMB 100
#define LN 24

static const ex_spec specs[N_SPECS] = {
  { "attn.qkv", 18, 48, 0, 0, 0, -1, {0} },
  { "mlp.fc", 40, 24, 0, 0, 0, -1, {0} },
  { "blocks.w", 12, 20, 3, 0, 1, -1, {0} },
  { "head", 7, 30, 0, 0, 1, -1, {0} },
};
#define N_SLICES 6   /* qkv, fc, blocks.w[0..2], head */
static muon_normuon normuon;   /* --normuon rows|larger: NorMuon, whose second moments follow their
                                  matrices to the new owners */
static muon_momentum_format mom_fmt;   /* --momentum bf16|int8: stored so, the reference's too */

typedef struct model {
  /* the single device */
  muon_optimizer *ref;
  float *full_w[N_SLICES], *full_g[N_SLICES], *full_t[N_SLICES];
  float emb[EMB], emb_g[EMB], emb_t[EMB], ln[LN], ln_g[LN], ln_t[LN];
  /* this rank */
  muon_optimizer *opt;
  long long *idx[N_SLICES];
  size_t n[N_SLICES];
  float *w[N_SPECS], *g[N_SPECS];    /* stacked buffers, one per spec */
  size_t stride[N_SPECS];
  size_t emb_lo, emb_n;
  float *my_emb, *my_emb_g, my_ln[LN], my_ln_g[LN];
} model;

static const char *slice_name(int s, char *buf, size_t n) {
  if (s >= 2 && s <= 4) snprintf(buf, n, "blocks.w[%d]", s - 2);
  else snprintf(buf, n, "%s", specs[s < 2 ? s : 3].name);
  return buf;
}
static const ex_spec *slice_spec(int s) { return &specs[s < 2 ? s : s <= 4 ? 2 : 3]; }

/* The layout's groups: auto config for every layout but "single". */
typedef struct setup {
  muon_comm g[2];
  int n_groups;
  muon_auto_desc ad;
  muon_dist_config cfg;
  const muon_comm *zero;      /* the group "emb" is sharded over, NULL: whole */
  int dist;
} setup;

static int make_setup(ex_world *w, const char *layout, setup *su) {
  static int tp_dims[N_SLICES + 1] = { 0, 0, 1, 1, 1, 1, 0 };   /* the last: "extra" */
  int dims[2];
  memset(su, 0, sizeof *su);
  su->dist = 1;
  su->ad.tp_dim_per_matrix = tp_dims;
  if (!strcmp(layout, "single")) { su->dist = 0; return w->size == 1; }
  if (!strcmp(layout, "fsdp") || !strcmp(layout, "fsdp_flat")) {
    su->ad.fsdp = &w->world;
    su->ad.fsdp_flat = !strcmp(layout, "fsdp_flat");
    su->zero = &w->world;
  } else if (!strcmp(layout, "tp")) {
    su->ad.tp = &w->world;
  } else if (!strcmp(layout, "ddp")) {
    su->ad.ddp = &w->world;
  } else if (!strcmp(layout, "tp_fsdp") || !strcmp(layout, "hsdp")) {
    if (w->size % 2) return 0;
    dims[0] = !strcmp(layout, "tp_fsdp") ? w->size / 2 : 2;
    dims[1] = w->size / dims[0];
    su->g[0] = ex_mesh(w, dims, 2, 0);
    su->g[1] = ex_mesh(w, dims, 2, 1);
    su->n_groups = 2;
    if (!strcmp(layout, "tp_fsdp")) { su->ad.fsdp = &su->g[0]; su->ad.tp = &su->g[1]; su->zero = &su->g[0]; }
    else { su->ad.replicate = &su->g[0]; su->ad.shard = &su->g[1]; su->zero = &su->g[1]; }
  } else {
    return 0;
  }
  su->cfg = muon_auto_config(&su->ad);
  return 1;
}

static void grads(model *m, int t) {
  int s;
  size_t e;
  char name[48];
  for (s = 0; s < N_SLICES; s++) {
    const ex_spec *sp = slice_spec(s);
    unsigned seed = ex_hash(slice_name(s, name, sizeof name), 977u * (unsigned)(t + 1));
    size_t full = (size_t)sp->rows * sp->cols;
    float *w = m->w[sp - specs] + (s >= 2 && s <= 4 ? (size_t)(s - 2) * m->stride[2] : 0);
    float *g = m->g[sp - specs] + (s >= 2 && s <= 4 ? (size_t)(s - 2) * m->stride[2] : 0);
    for (e = 0; e < full; e++) m->full_g[s][e] = (m->full_w[s][e] - m->full_t[s][e]) + 0.1f * ex_value(seed, (long long)e);
    if (!m->opt) continue;
    for (e = 0; e < m->n[s]; e++) g[e] = (w[e] - m->full_t[s][m->idx[s][e]]) + 0.1f * ex_value(seed, m->idx[s][e]);
  }
  for (e = 0; e < EMB; e++) m->emb_g[e] = (m->emb[e] - m->emb_t[e]) + 0.1f * ex_value(ex_hash("emb", 31u * (unsigned)(t + 1)), (long long)e);
  for (e = 0; e < LN; e++) m->ln_g[e] = (m->ln[e] - m->ln_t[e]) + 0.1f * ex_value(ex_hash("ln", 31u * (unsigned)(t + 1)), (long long)e);
  if (!m->opt) return;
  for (e = 0; e < m->emb_n; e++) m->my_emb_g[e] = (m->my_emb[e] - m->emb_t[m->emb_lo + e]) + 0.1f * ex_value(ex_hash("emb", 31u * (unsigned)(t + 1)), (long long)(m->emb_lo + e));
  for (e = 0; e < LN; e++) m->my_ln_g[e] = (m->my_ln[e] - m->ln_t[e]) + 0.1f * ex_value(ex_hash("ln", 31u * (unsigned)(t + 1)), (long long)e);
}

static void step(model *m, int t, int dist_too) {
  grads(m, t);
  if (muon_step(m->ref) != MUON_OK) { printf("reference step: %s\n", muon_error(m->ref)); exit(1); }
  if (dist_too && muon_step(m->opt) != MUON_OK) { printf("step: %s\n", muon_error(m->opt)); exit(1); }
}

/* The single device: full tensors, fresh values. */
static void make_reference(model *m) {
  muon_desc d = muon_default_desc();
  int s;
  size_t e;
  char name[48];
  d.hparams.lr = 0.02f;
  d.hparams.normuon = normuon;
  d.hparams.momentum_format = mom_fmt;
  if (muon_create(&m->ref, &d) != MUON_OK) exit(1);
  for (s = 0; s < N_SLICES; s++) {
    const ex_spec *sp = slice_spec(s);
    size_t full = (size_t)sp->rows * sp->cols;
    unsigned seed = ex_hash(slice_name(s, name, sizeof name), 2166136261u);
    muon_matrix r = muon_default_matrix();
    m->full_w[s] = (float *)malloc(full * sizeof(float));
    m->full_g[s] = (float *)malloc(full * sizeof(float));
    m->full_t[s] = (float *)malloc(full * sizeof(float));
    for (e = 0; e < full; e++) {
      m->full_w[s][e] = ex_value(seed, (long long)e) / sqrtf((float)sp->cols);
      m->full_t[s][e] = ex_value(seed ^ 0x5bd1e995u, (long long)e) / sqrtf((float)sp->cols);
    }
    r.name = name; r.param = m->full_w[s]; r.grad = m->full_g[s]; r.rows = sp->rows; r.cols = sp->cols;
    if (muon_add_matrix(m->ref, &r, NULL) != MUON_OK) exit(1);
  }
  for (e = 0; e < EMB; e++) { m->emb[e] = ex_value(7u, (long long)e); m->emb_t[e] = ex_value(8u, (long long)e); }
  for (e = 0; e < LN; e++) { m->ln[e] = ex_value(9u, (long long)e); m->ln_t[e] = ex_value(10u, (long long)e); }
  {
    muon_adamw_param p = muon_default_adamw_param();
    p.name = "emb"; p.param = m->emb; p.grad = m->emb_g; p.size = EMB;
    if (muon_add_adamw_param(m->ref, &p, NULL) != MUON_OK) exit(1);
    p.name = "ln"; p.param = m->ln; p.grad = m->ln_g; p.size = LN;
    if (muon_add_adamw_param(m->ref, &p, NULL) != MUON_OK) exit(1);
  }
}

/* This rank's optimizer under the setup, its pieces copied from the reference's current values;
   `extra`: one more matrix the checkpoints never had. */
static muon_optimizer *make_dist(ex_world *w, model *m, setup *su, int extra) {
  muon_desc d = muon_default_desc();
  muon_optimizer *opt;
  int i, k, local = 0;
  size_t e;
  static float xw[64], xg[64];
  d.hparams.lr = 0.02f;
  d.hparams.normuon = normuon;
  d.hparams.momentum_format = mom_fmt;
  if (su->dist) { d.comm = &w->world; d.dist = &su->cfg; }
  if (muon_create(&opt, &d) != MUON_OK) { printf("muon_create: %s\n", muon_error(NULL)); exit(1); }
  for (i = 0; i < N_SPECS; i++) {
    const ex_spec *sp = &specs[i];
    int count = sp->count > 1 ? sp->count : 1, first = i < 2 ? i : i == 2 ? 2 : 5;
    muon_matrix mm = muon_default_matrix();
    muon_layout lay;
    memset(&lay, 0, sizeof lay);
    if (su->dist) su->cfg.layout(su->cfg.state, local, &mm, &lay);
    for (k = 0; k < count; k++) {
      int s = first + k;
      if (!m->idx[s]) m->idx[s] = (long long *)malloc((size_t)sp->rows * sp->cols * sizeof(long long));
      m->n[s] = ex_piece(&lay, sp->rows, sp->cols, m->idx[s]);
    }
    m->stride[i] = m->n[first];
    if (!m->w[i]) {
      m->w[i] = (float *)malloc((m->stride[i] * count + 1) * sizeof(float));
      m->g[i] = (float *)malloc((m->stride[i] * count + 1) * sizeof(float));
    }
    for (k = 0; k < count; k++)
      for (e = 0; e < m->n[first + k]; e++) m->w[i][k * m->stride[i] + e] = m->full_w[first + k][m->idx[first + k][e]];
    mm.name = sp->name; mm.param = m->w[i]; mm.grad = m->g[i]; mm.rows = sp->rows; mm.cols = sp->cols; mm.count = sp->count;
    if (muon_add_matrix(opt, &mm, NULL) != MUON_OK) { printf("muon_add_matrix: %s\n", muon_error(opt)); exit(1); }
    local += count;
  }
  if (extra) {
    muon_matrix mm = muon_default_matrix();
    mm.name = "extra"; mm.param = xw; mm.grad = xg; mm.rows = 8; mm.cols = 8;
    if (muon_add_matrix(opt, &mm, NULL) != MUON_OK) { printf("muon_add_matrix: %s\n", muon_error(opt)); exit(1); }
  }
  {
    muon_adamw_param p = muon_default_adamw_param();
    long long lo = 0, n = EMB;
    if (su->zero) n = ex_chunk(EMB, su->zero->size, su->zero->rank, &lo);
    m->emb_lo = (size_t)lo;
    m->emb_n = (size_t)n;
    if (!m->my_emb) { m->my_emb = (float *)malloc(EMB * sizeof(float)); m->my_emb_g = (float *)malloc(EMB * sizeof(float)); }
    memcpy(m->my_emb, m->emb + lo, (size_t)n * sizeof(float));
    memcpy(m->my_ln, m->ln, sizeof m->ln);
    p.name = "emb"; p.param = m->my_emb; p.grad = m->my_emb_g; p.size = (size_t)n;
    if (su->zero) { p.offset = (size_t)lo; p.full_size = EMB; }
    if (muon_add_adamw_param(opt, &p, NULL) != MUON_OK) { printf("muon_add_adamw_param: %s\n", muon_error(opt)); exit(1); }
    memset(&p, 0, sizeof p);
    p.name = "ln"; p.param = m->my_ln; p.grad = m->my_ln_g; p.size = LN;
    if (muon_add_adamw_param(opt, &p, NULL) != MUON_OK) { printf("muon_add_adamw_param: %s\n", muon_error(opt)); exit(1); }
  }
  return opt;
}

/* Local parameters against the reference's, bit for bit: how many differ. */
static long long params_differ(const model *m) {
  long long bad = 0;
  int s;
  size_t e;
  for (s = 0; s < N_SLICES; s++) {
    const ex_spec *sp = slice_spec(s);
    const float *w = m->w[sp - specs] + (s >= 2 && s <= 4 ? (size_t)(s - 2) * m->stride[2] : 0);
    for (e = 0; e < m->n[s]; e++) bad += memcmp(&w[e], &m->full_w[s][m->idx[s][e]], sizeof(float)) != 0;
  }
  for (e = 0; e < m->emb_n; e++) bad += memcmp(&m->my_emb[e], &m->emb[m->emb_lo + e], sizeof(float)) != 0;
  bad += memcmp(m->my_ln, m->ln, sizeof m->ln) != 0;
  return bad;
}

/* An 8-bit momentum (blocks of the whole matrix: on its owner, or on every holder before the
   first plan, none elsewhere) against the reference's, value by value. */
static long long momentum_differs_int8(const model *m, int s, int zero) {
  const void *rm = NULL, *rf = NULL;
  size_t n, nf, e, full = (size_t)slice_spec(s)->rows * (size_t)slice_spec(s)->cols;
  muon_momentum_format fm, ff;
  long long bad = 0;
  float *a, *b;
  if (muon_get_momentum_stored(m->opt, s, &rm, &n, &fm) != MUON_OK || fm != mom_fmt) return -1;
  if (muon_get_momentum_stored(m->ref, s, &rf, &nf, &ff) != MUON_OK || ff != mom_fmt || nf != full) return -1;
  if (n != full) return n == 0 && m->n[s] != full ? 0 : -1;
  a = (float *)malloc(full * sizeof(float));
  b = (float *)calloc(full, sizeof(float));
  muon__cpu_blockwise(NULL, 0, full, a, (void *)(uintptr_t)rm);
  if (!zero) muon__cpu_blockwise(NULL, 0, full, b, (void *)(uintptr_t)rf);
  for (e = 0; e < full; e++) bad += memcmp(&a[e], &b[e], sizeof(float)) != 0;
  free(a);
  free(b);
  return bad;
}

/* Local momentum against the reference's: how many elements differ; `zero`: against 0. */
static long long momentum_differs(const model *m, int zero) {
  long long bad = 0;
  int s;
  size_t e;
  for (s = 0; s < N_SLICES; s++) {
    if (mom_fmt == MUON_MOMENTUM_INT8) {
      long long d = momentum_differs_int8(m, s, zero);
      if (d < 0) return -1;
      bad += d;
      continue;
    }
    const void *rm = NULL, *rf = NULL;
    const float *mine, *full;
    size_t n, nf;
    muon_momentum_format fm, ff;
    if (muon_get_momentum_stored(m->opt, s, &rm, &n, &fm) != MUON_OK || n != m->n[s] || fm != mom_fmt) return -1;
    if (muon_get_momentum_stored(m->ref, s, &rf, &nf, &ff) != MUON_OK || ff != mom_fmt) return -1;
    mine = (const float *)rm;
    full = (const float *)rf;
    for (e = 0; e < n; e++) {
      float want = zero ? 0.0f : full[m->idx[s][e]];
      if (mom_fmt == MUON_MOMENTUM_BF16)   /* both buffers hold bf16 */
        bad += ((const uint16_t *)(const void *)mine)[e] !=
               (zero ? 0 : ((const uint16_t *)(const void *)full)[m->idx[s][e]]);
      else bad += memcmp(&mine[e], &want, sizeof want) != 0;
    }
  }
  return bad;
}

static const char *path_of(char *buf, size_t n, const char *dir, const char *prefix, int r) {
  snprintf(buf, n, "%s/%srank%d.muon", dir, prefix, r);
  return buf;
}

/* A copy of the blob file `from` at `to` with another run identity, checksum rewritten. */
static int copy_as_other_run(const char *from, const char *to) {
  FILE *f = fopen(from, "rb");
  unsigned char *b = NULL;
  long n = -1;
  int i, ok = 0;
  if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 48 && fseek(f, 0, SEEK_SET) == 0 &&
      (b = (unsigned char *)malloc((size_t)n)) && fread(b, 1, (size_t)n, f) == (size_t)n) {
    uint64_t h;
    b[32] ^= 0x5a;
    h = muon__fnv1a(b, (size_t)n - 8);
    for (i = 0; i < 8; i++) b[n - 8 + i] = (unsigned char)(h >> (8 * i));
    ok = 1;
  }
  if (f) fclose(f);
  if (ok) {
    f = fopen(to, "wb");
    ok = f && fwrite(b, 1, (size_t)n, f) == (size_t)n;
    if (f && fclose(f) != 0) ok = 0;
  }
  free(b);
  return ok;
}

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  const char *layout = NULL, *save = NULL, *load = NULL;
  int from = 0, i, t;
  setup su;
  model m;
  char title[200];
  memset(&m, 0, sizeof m);
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--layout") && i + 1 < argc) layout = argv[++i];
    else if (!strcmp(argv[i], "--save") && i + 1 < argc) save = argv[++i];
    else if (!strcmp(argv[i], "--load") && i + 1 < argc) load = argv[++i];
    else if (!strcmp(argv[i], "--from") && i + 1 < argc) from = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--momentum") && i + 1 < argc) {
      i++;
      mom_fmt = !strcmp(argv[i], "bf16") ? MUON_MOMENTUM_BF16 : !strcmp(argv[i], "int8") ? MUON_MOMENTUM_INT8 : MUON_MOMENTUM_FP32;
    }
    else if (!strcmp(argv[i], "--normuon") && i + 1 < argc) { i++; normuon = !strcmp(argv[i], "rows") ? MUON_NORMUON_ROWS : MUON_NORMUON_LARGER; }
  }
  if (!layout || !!save == !!load || (load && from < 1)) {
    fprintf(stderr, "usage: test_reshard --layout L (--save DIR | --load DIR --from N)\n");
    return 2;
  }
  if (!make_setup(&w, layout, &su)) ex_die(&w, layout, "unknown layout, or not for this world size");
  make_reference(&m);

  if (save) {
    char path[512];
    snprintf(title, sizeof title, "reshard: %s at %d ranks trains %d steps bitwise equal to one device and saves its files", layout, w.size, K1);
    TEST_CASE(title);
    if (mkdir(save, 0755) != 0 && errno != EEXIST) ex_die(&w, save, strerror(errno));
    m.opt = make_dist(&w, &m, &su, 0);
    for (t = 0; t < K1; t++) step(&m, t, 1);
    CHECK(params_differ(&m) == 0, "%lld elements differ from one device after %d steps", params_differ(&m), K1);
    CHECK(muon_state_save_file(m.opt, path_of(path, sizeof path, save, "", w.rank)) == MUON_OK, "save: %s", muon_error(m.opt));
    step(&m, K1, 1);
    CHECK(muon_state_save_file(m.opt, path_of(path, sizeof path, save, "later.", w.rank)) == MUON_OK, "save: %s", muon_error(m.opt));
  } else {
    char **paths = (char **)calloc((size_t)from + 1, sizeof(char *)), *saved;
    muon_optimizer *other;
    muon_stats st;
    for (i = 0; i < from; i++) {
      paths[i] = (char *)malloc(512);
      path_of(paths[i], 512, load, "", i);
    }
    for (t = 0; t < K1; t++) step(&m, t, 0);   /* the single device up to the checkpoint */
    m.opt = make_dist(&w, &m, &su, 0);

    TEST_CASE("reshard: bad file sets (a rank missing or twice, two checkpoints, two runs, a missing file) are MUON_ERR_STATE, naming the problem, and change nothing");
    if (from > 1) {
      CHECK(muon_state_reshard_files(m.opt, (const char *const *)paths, from - 1) == MUON_ERR_STATE && strstr(muon_error(m.opt), "blobs were given"),
            "a rank missing: %s", muon_error(m.opt));
      saved = paths[1];
      paths[1] = paths[0];
      CHECK(muon_state_reshard_files(m.opt, (const char *const *)paths, from) == MUON_ERR_STATE && strstr(muon_error(m.opt), "a second blob of rank 0"),
            "a rank twice: %s", muon_error(m.opt));
      paths[1] = (char *)malloc(512);
      path_of(paths[1], 512, load, "later.", 1);
      CHECK(muon_state_reshard_files(m.opt, (const char *const *)paths, from) == MUON_ERR_STATE && strstr(muon_error(m.opt), "different checkpoints"),
            "two checkpoints: %s", muon_error(m.opt));
      free(paths[1]);
      paths[1] = saved;
      /* rank 1's blob as another job of the same model, step and settings would have saved it:
         only the run's identity (header bytes 32..40) differs */
      paths[1] = (char *)malloc(512);
      snprintf(title, sizeof title, "otherrun.by%d.", w.rank);
      CHECK(copy_as_other_run(saved, path_of(paths[1], 512, load, title, 1)), "writing %s", paths[1]);
      CHECK(muon_state_reshard_files(m.opt, (const char *const *)paths, from) == MUON_ERR_STATE &&
                strstr(muon_error(m.opt), "different jobs"),
            "two runs: %s", muon_error(m.opt));
      remove(paths[1]);
      free(paths[1]);
      paths[1] = saved;
    }
    saved = paths[from - 1];
    paths[from - 1] = (char *)"no/such/file.muon";
    CHECK(muon_state_reshard_files(m.opt, (const char *const *)paths, from) == MUON_ERR_STATE && strstr(muon_error(m.opt), strerror(ENOENT)),
          "a missing file: %s", muon_error(m.opt));
    paths[from - 1] = saved;
    CHECK(muon_state_reshard_files(m.opt, (const char *const *)paths, 0) == MUON_ERR_ARG, "n = 0");
    muon_get_stats(m.opt, &st);
    CHECK(momentum_differs(&m, 1) == 0 && st.steps == 0, "a failed reshard changed the state (%lld momentum elements, %lld steps)", momentum_differs(&m, 1), st.steps);
    if (su.dist && from == 1 && w.size > 1) {   /* every rank reading one file is fine; loading another rank's file is not */
      CHECK(muon_state_load_file(m.opt, paths[0]) == MUON_ERR_STATE && strstr(muon_error(m.opt), "muon_state_reshard_files"),
            "muon_state_load of another world's file points to resharding: %s", muon_error(m.opt));
    }

    TEST_CASE("reshard: a model with a matrix the checkpoint lacks is refused, naming it");
    {
      model m2 = m;
      m2.opt = other = make_dist(&w, &m2, &su, 1);
      CHECK(muon_state_reshard_files(other, (const char *const *)paths, from) == MUON_ERR_STATE &&
            strstr(muon_error(other), "'extra'") && strstr(muon_error(other), "no saved piece holds"), "extra matrix: %s", muon_error(other));
      muon_destroy(other);
    }

    snprintf(title, sizeof title, "reshard: %d files -> %s at %d ranks: the state one device holds after %d steps, bitwise; %d more steps bitwise equal",
             from, layout, w.size, K1, K2);
    TEST_CASE(title);
    CHECK(muon_state_reshard_files(m.opt, (const char *const *)paths, from) == MUON_OK, "reshard: %s", muon_error(m.opt));
    muon_get_stats(m.opt, &st);
    CHECK(st.steps == K1, "step count %lld after loading, want %d", st.steps, K1);
    CHECK(momentum_differs(&m, 0) == 0, "%lld momentum elements differ from one device's", momentum_differs(&m, 0));
    CHECK(params_differ(&m) == 0, "parameters differ before continuing");
    for (t = K1; t < K1 + K2; t++) step(&m, t, 1);
    CHECK(params_differ(&m) == 0, "%lld elements differ from one device after %d more steps", params_differ(&m), K2);
    CHECK(momentum_differs(&m, 0) == 0, "%lld momentum elements differ after %d more steps", momentum_differs(&m, 0), K2);
    for (i = 0; i < from; i++) free(paths[i]);
    free(paths);
  }
  muon_destroy(m.opt);
  muon_destroy(m.ref);
  for (i = 0; i < su.n_groups; i++) muon_comm_destroy(&su.g[i]);
  muon_comm_destroy(&w.world);
  return test_summary();
}
