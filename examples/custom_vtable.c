/* custom_vtable.c - a custom distributed setup: a framework muon knows nothing about
   brings its own assign / gather / redistribute. Here the "framework" row-shards every matrix
   over the world (torch.chunk) and moves rows with its own communicator calls; owners are
   round-robin (matrix i on rank i % world). muonrun -n 4 build/custom_vtable */
#define MUON_IMPLEMENTATION
#include "common.h"

typedef struct framework {
  muon_comm *world;
  size_t *counts;            /* 4 x world: send counts, displs, recv counts, displs */
  float *zeros;
  float *host_send, *host_recv;   /* staging when muon's buffers are on a GPU and the comm is Gloo */
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

/* One alltoallv of the framework's communicator over muon's buffers (GPU memory with EX_CUDA),
   finished before it returns (muon_comm_alltoallv): as they are when the communicator takes
   device memory (NCCL), else through host copies. */
static muon_status exchange(framework *f, const float *send, size_t send_n, float *recv, size_t recv_n) {
  const muon_comm *c = f->world;
  int P = c->size;
  size_t *sc = f->counts, *sd = sc + P, *rc = sd + P, *rd = rc + P;
  muon_status st;
  if (c->vt->memory == MUON_MEMORY_DEVICE || !EX_ON_DEVICE)
    return muon_comm_alltoallv(c, send ? send : f->zeros, sc, sd, recv ? recv : f->zeros, rc, rd);
  if (send) ex_get(NULL, f->host_send, send, send_n);
  st = muon_comm_alltoallv(c, send ? f->host_send : f->zeros, sc, sd, recv ? f->host_recv : f->zeros, rc, rd);
  if (st == MUON_OK && recv) ex_put(NULL, recv, f->host_recv, recv_n);
  return st;
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
  return exchange(f, local, m->local_size, full, (size_t)m->rows * m->cols);
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
  return exchange(f, full, (size_t)m->rows * m->cols, local, m->local_size);
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
  fw.host_send = (float *)malloc(128 * 32 * sizeof(float));   /* the largest matrix */
  fw.host_recv = (float *)malloc(128 * 32 * sizeof(float));
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
  free(fw.host_send);
  free(fw.host_recv);
  return ex_finish(&w, NULL, 0, rc);
}
