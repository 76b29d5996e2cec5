/* custom_vtable.c - the seeds' "Custom Distributed Setup": a framework muon knows nothing about
   brings its own assign / gather / redistribute. Here the "framework" row-shards every matrix
   over the world (torch.chunk) and moves rows with its own communicator calls; owners are
   round-robin (matrix i on rank i % world). muonrun -n 4 build/custom_vtable */
#define MUON_IMPLEMENTATION
#include "common.h"

typedef struct framework {
  muon_comm *world;
  size_t *counts;            /* 4 x world: send counts, displs, recv counts, displs */
  float *zeros;
  float *host_local, *host_full;  /* staging when muon's buffers are on a GPU (EX_CUDA) */
} framework;

static muon_status round_robin(void *state, const muon_matrix_info *m, int n, int world_size, int *owner) {
  int i;
  (void)state;
  for (i = 0; i < n; i++) owner[i] = m[i].index % world_size;
  return MUON_OK;
}

/* Rows [lo, hi) of matrix m on rank r: ceil(rows / world) rows each, the last ones short. */
static void rows_of(const muon_matrix_info *m, int world, int r, size_t *lo, size_t *n) {
  size_t c = ((size_t)m->rows + world - 1) / world, a = r * c < (size_t)m->rows ? r * c : (size_t)m->rows;
  *lo = a;
  *n = (a + c < (size_t)m->rows ? a + c : (size_t)m->rows) - a;
}

/* Every rank sends its rows to the owner, which receives them in rank order: the full matrix. */
static muon_status gather(void *state, const muon_matrix_info *m, const float *local, float *full, int owner) {
  framework *f = (framework *)state;
  int P = f->world->size, r;
  size_t *sc = f->counts, *sd = sc + P, *rc = sd + P, *rd = rc + P, lo, n;
  for (r = 0; r < P; r++) {
    rows_of(m, P, r, &lo, &n);
    sc[r] = r == owner ? m->local_size : 0;
    sd[r] = 0;
    rc[r] = f->world->rank == owner ? n * (size_t)m->cols : 0;
    rd[r] = lo * (size_t)m->cols;
  }
  if (EX_ON_DEVICE) {   /* muon hands over GPU buffers; this framework's communicator takes host memory */
    muon_status st;
    if (local) ex_get(NULL, f->host_local, local, m->local_size);
    st = f->world->vt->alltoallv(f->world->ctx, local ? f->host_local : f->zeros, sc, sd, full ? f->host_full : f->zeros, rc, rd);
    if (st == MUON_OK && full) ex_put(NULL, full, f->host_full, (size_t)m->rows * m->cols);
    return st;
  }
  return f->world->vt->alltoallv(f->world->ctx, local ? local : f->zeros, sc, sd, full ? full : f->zeros, rc, rd);
}

/* The owner sends each rank its rows back. */
static muon_status redistribute(void *state, const muon_matrix_info *m, const float *full, float *local, int owner) {
  framework *f = (framework *)state;
  int P = f->world->size, r;
  size_t *sc = f->counts, *sd = sc + P, *rc = sd + P, *rd = rc + P, lo, n;
  for (r = 0; r < P; r++) {
    rows_of(m, P, r, &lo, &n);
    sc[r] = f->world->rank == owner ? n * (size_t)m->cols : 0;
    sd[r] = lo * (size_t)m->cols;
    rc[r] = r == owner ? m->local_size : 0;
    rd[r] = 0;
  }
  if (EX_ON_DEVICE) {
    muon_status st;
    if (full) ex_get(NULL, f->host_full, full, (size_t)m->rows * m->cols);
    st = f->world->vt->alltoallv(f->world->ctx, full ? f->host_full : f->zeros, sc, sd, local ? f->host_local : f->zeros, rc, rd);
    if (st == MUON_OK && local) ex_put(NULL, local, f->host_local, m->local_size);
    return st;
  }
  return f->world->vt->alltoallv(f->world->ctx, full ? full : f->zeros, sc, sd, local ? local : f->zeros, rc, rd);
}

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  framework fw;
  muon_dist_config cfg = muon_layout_config();
  ex_spec specs[5];
  const char *names[5] = { "embed.proj", "attn.qkv", "attn.out", "mlp.up", "mlp.down" };
  int rows[5] = { 40, 96, 32, 128, 32 }, cols[5] = { 32, 32, 32, 32, 128 }, i, rc;
  float zero = 0;
  fw.world = &w.world;
  fw.counts = (size_t *)malloc(4 * (size_t)w.size * sizeof(size_t));
  fw.zeros = &zero;
  fw.host_local = (float *)malloc(128 * 32 * sizeof(float));   /* the largest matrix */
  fw.host_full = (float *)malloc(128 * 32 * sizeof(float));
  memset(specs, 0, sizeof specs);
  for (i = 0; i < 5; i++) {
    specs[i].name = names[i]; specs[i].rows = rows[i]; specs[i].cols = cols[i]; specs[i].expert = -1;
    specs[i].layout.n_levels = 1;
    specs[i].layout.levels[0] = muon_shard(0, &w.world);   /* tells muon the local sizes */
  }
  cfg.assign = round_robin;
  cfg.gather = gather;
  cfg.redistribute = redistribute;
  cfg.state = &fw;
  rc = ex_run(&w, "custom_vtable", specs, 5, NULL, &cfg, 1);
  free(fw.counts);
  free(fw.host_local);
  free(fw.host_full);
  return ex_finish(&w, NULL, 0, rc);
}
