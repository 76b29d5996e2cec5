/* test_threads.c - the distributed step with P ranks as threads of one process.

   Usage:  build/test_threads [MESHES]      MESHES random meshes (default 300; more for a soak)

   Each rank is a thread and talks to the others through an in-memory muon_comm (alltoallv and
   allgather over a shared barrier), so the whole exchange runs without Gloo, sockets or forks.
   Every random mesh has 1 to 8 ranks on 1 to 3 axes; each axis gets a level of a random kind -
   REPLICATE, SHARD(0), SHARD(1), FLAT in chunks, or FLAT at explicit uneven ranges (empty ones
   included) - and the levels nest in axis order. Six matrices (tall, wide, square, tiny) take
   three steps on every rank. Then:
   - every element of every rank's pieces equals, bit for bit, that element after three steps of
     one muon on one device with the full matrices;
   - ranks holding the same element (replicas) hold the same bits;
   - the same meshes again, with 64-byte rounds (one matrix per round) and/or round-robin owners,
     change no bit.
   The pieces each rank feeds in are cut by ref_piece below, which slices index lists level by
   level from the layout docs and shares no code with muon's piece logic, so a bug there cannot
   cancel itself out. Everything is seeded: a run is the same on every machine. */
#define _POSIX_C_SOURCE 200809L   /* pthreads under -std=c99 */
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "test.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANKS 8
#define MAX_AXES 3
#define N_MATRICES 6
#define N_STEPS 3
#define LR 0.03f
#define DEFAULT_MESHES 300
#define SMALL_ROUND_BYTES 64       /* smaller than any matrix here: one matrix per round */
#define MAX_NOTES 4                /* mismatches printed per check */

static const char *matrix_name[N_MATRICES] = { "tall", "wide", "square", "tiny", "big_tall", "one_row" };
static const int matrix_shape[N_MATRICES][2] = { {17, 9}, {6, 40}, {10, 10}, {3, 5}, {64, 33}, {1, 12} };

/* The model: initial weights and one gradient per step, full size; and the one-device result. */
static float *full_w0[N_MATRICES], *full_grad[N_STEPS][N_MATRICES], *one_device[N_MATRICES];
/* The Muon variants every rank and the one device run with (after the plain meshes: cautious
   weight decay and Gram Newton-Schulz, whose wide and tall matrices take the Gram iteration). */
static int variant_cautious, variant_gram;
static int variant_bf16;   /* bf16 Newton-Schulz, whose exchange is bf16 by default (odd counts too) */
/* NorMuon (muon_hparams.normuon), with a late matrix: after the first step every rank (and the
   one device) registers LATE_ROWS x LATE_COLS "late", replicated, which re-plans and moves owners,
   so NorMuon's second moments must move with them for the bits to stay the same. */
static muon_normuon variant_normuon;
#define LATE_ROWS 48
#define LATE_COLS 70
static float late_w0[LATE_ROWS * LATE_COLS], late_grad[LATE_ROWS * LATE_COLS];
static long long owners_moved;     /* over a pass: matrices whose owner the late matrix moved   */
/* While comparing: the first rank seen holding each element, and its bits there. */
static int *held_by[N_MATRICES];
static float *held_value[N_MATRICES];

static size_t matrix_size(int i) { return (size_t)matrix_shape[i][0] * matrix_shape[i][1]; }

/* A small integer hash: every "random" choice below is a pure function of its arguments. */
static unsigned mix(unsigned a, unsigned b, unsigned c) {
  unsigned h = a * 2654435761u ^ (b + 0x9e3779b9u) * 40503u ^ c * 97u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  return h ^ (h >> 15);
}

static void fill_random(float *x, size_t n, unsigned seed) {
  unsigned state = seed;
  size_t i;
  for (i = 0; i < n; i++) {
    state = state * 1664525u + 1013904223u;
    x[i] = (float)((state >> 8) & 0xffff) / 65536.0f - 0.5f;
  }
}

/* ---- an in-memory communicator: P threads, one shared mailbox ------------------------------
   A collective posts this rank's pointers, waits for everyone, copies what it receives straight
   from the senders' buffers, and waits again so no sender reuses a buffer still being read. */
typedef struct thread_world {
  int size;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  int arrived, generation;         /* the barrier                                               */
  int n_left;                      /* ranks whose thread has ended (normally or after an error) */
  const float *send[MAX_RANKS];
  const size_t *send_counts[MAX_RANKS], *send_displs[MAX_RANKS], *recv_counts[MAX_RANKS];
  const void *gather_send[MAX_RANKS];
  size_t gather_bytes[MAX_RANKS];
  void *blob[MAX_RANKS];           /* NorMuon variant: every rank's state, for muon_state_reshard */
  size_t blob_size[MAX_RANKS];
} thread_world;

typedef struct rank_run {          /* one rank: its communicator context and its pieces         */
  thread_world *world;
  int rank;
  size_t round_bytes;
  int round_robin;
  int prefetch, async;             /* muon_dist_config.prefetch / .async                        */
  muon_layout layout[N_MATRICES];
  long long *idx[N_MATRICES];      /* full-matrix index (row * cols + col) of each local element */
  size_t n[N_MATRICES];
  float *param[N_MATRICES], *grad[N_MATRICES];
  char failure[600];               /* the first call that failed on this rank; "" if none       */
  const char *comm_error;
  float late[LATE_ROWS * LATE_COLS];
  int owners_moved;                /* matrices whose owner the late matrix changed              */
} rank_run;

/* Unlike pthread_barrier_wait, this one gives up (returns 0) once some rank's thread has ended:
   a rank that stops after an error, or a muon that calls collectives a different number of times
   on different ranks, makes the others fail their next collective instead of hanging the test. */
static int world_barrier(thread_world *w) {
  int generation, passed;
  pthread_mutex_lock(&w->lock);
  generation = w->generation;
  if (++w->arrived == w->size) {
    w->arrived = 0;
    w->generation++;
    pthread_cond_broadcast(&w->wake);
  }
  while (generation == w->generation && w->n_left == 0) pthread_cond_wait(&w->wake, &w->lock);
  passed = generation != w->generation;
  pthread_mutex_unlock(&w->lock);
  return passed;
}

static void world_leave(thread_world *w) {
  pthread_mutex_lock(&w->lock);
  w->n_left++;
  pthread_cond_broadcast(&w->wake);
  pthread_mutex_unlock(&w->lock);
}

static muon_status thread_alltoallv(void *ctx, const float *send, const size_t *send_counts,
                                    const size_t *send_displs, float *recv, const size_t *recv_counts,
                                    const size_t *recv_displs, int *ticket) {
  rank_run *me = (rank_run *)ctx;
  thread_world *w = me->world;
  *ticket = -1;
  int p, q, counts_agree = 1;
  w->send[me->rank] = send;
  w->send_counts[me->rank] = send_counts;
  w->send_displs[me->rank] = send_displs;
  w->recv_counts[me->rank] = recv_counts;
  if (!world_barrier(w)) { me->comm_error = "a rank left during alltoallv"; return MUON_ERR_COMM; }
  /* Every rank checks every pair, so all of them return the same status and stay in step. */
  for (p = 0; p < w->size; p++)
    for (q = 0; q < w->size; q++)
      if (w->send_counts[p][q] != w->recv_counts[q][p]) counts_agree = 0;
  for (p = 0; counts_agree && p < w->size; p++)
    if (recv_counts[p])
      memcpy(recv + recv_displs[p], w->send[p] + w->send_displs[p][me->rank], recv_counts[p] * sizeof(float));
  if (!world_barrier(w)) { me->comm_error = "a rank left during alltoallv"; return MUON_ERR_COMM; }
  if (!counts_agree) { me->comm_error = "alltoallv send and receive counts disagree"; return MUON_ERR_COMM; }
  return MUON_OK;
}

static muon_status thread_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  rank_run *me = (rank_run *)ctx;
  thread_world *w = me->world;
  int p, sizes_agree = 1;
  w->gather_send[me->rank] = send;
  w->gather_bytes[me->rank] = bytes;
  if (!world_barrier(w)) { me->comm_error = "a rank left during allgather"; return MUON_ERR_COMM; }
  for (p = 0; p < w->size; p++) sizes_agree &= w->gather_bytes[p] == w->gather_bytes[0];
  for (p = 0; sizes_agree && p < w->size; p++) memcpy((char *)recv + p * bytes, w->gather_send[p], bytes);
  if (!world_barrier(w)) { me->comm_error = "a rank left during allgather"; return MUON_ERR_COMM; }
  if (!sizes_agree) { me->comm_error = "allgather sizes disagree"; return MUON_ERR_COMM; }
  return MUON_OK;
}

static const char *thread_error(void *ctx) { return ((rank_run *)ctx)->comm_error; }

static const muon_comm_vtable thread_vtable = {
  MUON_COMM_VTABLE_VERSION,
  /* .alltoallv = */ thread_alltoallv,
  /* .join      = */ NULL,
  /* .finish    = */ NULL,
  /* .allgather = */ thread_allgather,
  /* .error     = */ thread_error,
  /* .destroy   = */ NULL,
  /* .memory    = */ MUON_MEMORY_HOST,
  /* .queued    = */ 0
};

/* ---- reference pieces: index lists cut level by level ---------------------------------------
   Fills idx with the full-matrix indices a rank with layout L holds, in its local (row-major)
   order, and returns how many. idx needs room for rows * cols. Written from the layout docs in
   muon.h: SHARD splits rows or columns in torch.chunk chunks, FLAT takes a range of the
   flattened piece, and after a FLAT level the piece is a 1-D list that SHARD(0) chunks. */
static void chunk_range(long long length, int parts, int index, long long *lo, long long *hi) {
  long long chunk = (length + parts - 1) / parts;
  *lo = index * chunk < length ? index * chunk : length;
  *hi = *lo + chunk < length ? *lo + chunk : length;
}

static size_t ref_piece(const muon_layout *L, int rows, int cols, long long *idx) {
  long long height = rows, width = cols, n = (long long)rows * cols, lo, hi, r, c;
  int is_flat = 0, k;
  for (k = 0; k < n; k++) idx[k] = k;
  for (k = 0; k < L->n_levels; k++) {
    const muon_level *v = &L->levels[k];
    if (v->placement == MUON_REPLICATE) continue;
    if (v->placement == MUON_SHARD && !is_flat && v->dim == 0) {
      chunk_range(height, v->size, v->index, &lo, &hi);    /* rows lo..hi: one block of the list */
      memmove(idx, idx + lo * width, (size_t)((hi - lo) * width) * sizeof *idx);
      height = hi - lo;
      n = height * width;
    } else if (v->placement == MUON_SHARD && !is_flat) {
      chunk_range(width, v->size, v->index, &lo, &hi);     /* columns lo..hi of every row */
      for (r = 0; r < height; r++)
        for (c = 0; c < hi - lo; c++) idx[r * (hi - lo) + c] = idx[r * width + lo + c];
      width = hi - lo;
      n = height * width;
    } else {                                                /* a range of the flattened list */
      if (v->placement == MUON_FLAT && v->length >= 0) {
        lo = v->offset;
        hi = v->offset + v->length;
      } else {
        chunk_range(n, v->size, v->index, &lo, &hi);
      }
      memmove(idx, idx + lo, (size_t)(hi - lo) * sizeof *idx);
      n = hi - lo;
      is_flat = 1;
    }
  }
  return (size_t)n;
}

/* ---- random meshes -------------------------------------------------------------------------- */
typedef struct mesh {
  int id;                          /* the seed everything else follows from                     */
  int n_axes, size[MAX_AXES], ranks;
  muon_placement placement[MAX_AXES];
  int shard_dim[MAX_AXES];
  int explicit_ranges[MAX_AXES];   /* FLAT at uneven ranges from a hash, instead of chunks      */
  size_t round_bytes;
  int round_robin;
  int prefetch, async;
} mesh;

static mesh random_mesh(int id) {
  mesh m;
  unsigned seed = (unsigned)id * 7919u + 1;
  int a, after_flat = 0;
  memset(&m, 0, sizeof m);
  m.id = id;
  m.n_axes = 1 + (int)(mix(seed, 1, 0) % MAX_AXES);
  m.ranks = 1;
  for (a = 0; a < m.n_axes; a++) {
    /* One axis: any P in 1..8. Nested axes: 1..4 ranks each, as many as fit in MAX_RANKS. */
    int most = m.n_axes == 1 ? MAX_RANKS : 4;
    if (most > MAX_RANKS / m.ranks) most = MAX_RANKS / m.ranks;
    m.size[a] = 1 + (int)(mix(seed, 2, (unsigned)a) % (unsigned)most);
    m.ranks *= m.size[a];
    m.placement[a] = (muon_placement)(mix(seed, 3, (unsigned)a) % 3);
    /* After a FLAT level the piece is 1-D: only SHARD(0) is valid there. */
    m.shard_dim[a] = after_flat ? 0 : (int)(mix(seed, 4, (unsigned)a) % 2);
    m.explicit_ranges[a] = m.placement[a] == MUON_FLAT && (mix(seed, 5, (unsigned)a) & 1);
    if (m.placement[a] == MUON_FLAT) after_flat = 1;
  }
  return m;
}

/* The layout of rank `rank` for matrix i. Ranks are numbered row-major over the axes, and the
   group of axis a is the ranks that differ only in coordinate a. */
static void mesh_layout(const mesh *m, int rank, int i, muon_layout *L, long long *scratch) {
  int a, coord[MAX_AXES], rest = rank;
  for (a = m->n_axes - 1; a >= 0; a--) {
    coord[a] = rest % m->size[a];
    rest /= m->size[a];
  }
  memset(L, 0, sizeof *L);
  for (a = 0; a < m->n_axes; a++) {
    muon_level v;
    memset(&v, 0, sizeof v);
    v.placement = m->placement[a];
    v.dim = v.placement == MUON_SHARD ? m->shard_dim[a] : 0;
    v.size = m->size[a];
    v.index = coord[a];
    v.length = -1;
    if (m->explicit_ranges[a]) {
      /* Cut points hashed from the length of the piece this level splits, which every rank of
         the group shares; sorted, they may repeat, so some ranges are empty. */
      long long len = (long long)ref_piece(L, matrix_shape[i][0], matrix_shape[i][1], scratch);
      long long cut[MAX_RANKS + 1];
      int k, j;
      cut[0] = 0;
      cut[v.size] = len;
      for (k = 1; k < v.size; k++) {
        unsigned h = mix((unsigned)m->id, 10u + (unsigned)a, (unsigned)(len * 31 + k));
        cut[k] = (long long)(h % (unsigned)(len + 1));
      }
      for (k = 2; k < v.size; k++)
        for (j = k; j > 1 && cut[j - 1] > cut[j]; j--) {
          long long t = cut[j];
          cut[j] = cut[j - 1];
          cut[j - 1] = t;
        }
      v.offset = cut[v.index];
      v.length = cut[v.index + 1] - cut[v.index];
    }
    L->levels[L->n_levels++] = v;
  }
}

static const char *placement_name(const muon_level *v) {
  if (v->placement == MUON_REPLICATE) return "REPLICATE";
  if (v->placement == MUON_FLAT) return v->length >= 0 ? "FLAT range" : "FLAT";
  return v->dim ? "SHARD(1)" : "SHARD(0)";
}

/* "mesh 17 (P=6: 3 SHARD(1) x 2 FLAT range; 64-byte rounds, round-robin owners)" */
static void describe_mesh(const mesh *m, char *out, size_t n) {
  size_t used;
  int a;
  used = (size_t)snprintf(out, n, "mesh %d (P=%d:", m->id, m->ranks);
  for (a = 0; a < m->n_axes && used < n; a++) {
    muon_level v;
    memset(&v, 0, sizeof v);
    v.placement = m->placement[a];
    v.dim = m->shard_dim[a];
    v.length = m->explicit_ranges[a] ? 0 : -1;
    used += (size_t)snprintf(out + used, n - used, "%s %d %s", a ? " x" : "", m->size[a], placement_name(&v));
  }
  if (used < n && m->round_bytes)
    used += (size_t)snprintf(out + used, n - used, "; %d-byte rounds", (int)m->round_bytes);
  if (used < n && m->round_robin) used += (size_t)snprintf(out + used, n - used, "; round-robin owners");
  if (used < n && (m->prefetch || m->async))
    used += (size_t)snprintf(out + used, n - used, "; prefetch %d, async %s", m->prefetch, m->async ? "on" : "off");
  if (used < n) snprintf(out + used, n - used, ")");
}

/* "SHARD(1) 2/3 > FLAT range [4, +7) 1/2" */
static void describe_layout(const muon_layout *L, char *out, size_t n) {
  size_t used = 0;
  int k;
  out[0] = 0;
  for (k = 0; k < L->n_levels && used < n; k++) {
    const muon_level *v = &L->levels[k];
    used += (size_t)snprintf(out + used, n - used, "%s%s", k ? " > " : "", placement_name(v));
    if (used < n && v->length >= 0)
      used += (size_t)snprintf(out + used, n - used, " [%lld, +%lld)", v->offset, v->length);
    if (used < n) used += (size_t)snprintf(out + used, n - used, " %d/%d", v->index, v->size);
  }
  if (!L->n_levels) snprintf(out, n, "whole matrix");
}

/* ---- one rank ------------------------------------------------------------------------------- */
static void note_failure(rank_run *me, const char *what, muon_status st, muon_optimizer *opt) {
  const char *why = muon_error(opt);
  if (me->failure[0]) return;
  /* muon_error names the status too; a bare status is all there is when it was never set. */
  snprintf(me->failure, sizeof me->failure, "%s: %s", what, why && why[0] ? why : muon_status_string(st));
}

static void *rank_main(void *arg) {
  rank_run *me = (rank_run *)arg;
  muon_comm comm;
  muon_desc desc = muon_default_desc();
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt = NULL;
  muon_status st;
  int i, step, ok = 1;
  size_t e;
  comm.vt = &thread_vtable;
  comm.ctx = me;
  comm.rank = me->rank;
  comm.size = me->world->size;
  cfg.round_bytes = me->round_bytes;
  cfg.round_robin = me->round_robin;
  cfg.prefetch = me->prefetch;
  cfg.async = me->async;
  desc.hparams.lr = LR;
  desc.hparams.cautious_wd = variant_cautious;
  desc.hparams.ns_algorithm = variant_gram ? MUON_NS_GRAM : MUON_NS_STANDARD;
  desc.hparams.precision = variant_bf16 ? MUON_PRECISION_BF16 : MUON_PRECISION_FP32;
  desc.hparams.normuon = variant_normuon;
  desc.comm = &comm;
  desc.dist = &cfg;
  if ((st = muon_create(&opt, &desc)) != MUON_OK) {
    snprintf(me->failure, sizeof me->failure, "muon_create: %s", muon_status_string(st));
    ok = 0;
  }
  for (i = 0; ok && i < N_MATRICES; i++) {
    muon_matrix m = muon_default_matrix();
    m.name = matrix_name[i];
    m.param = me->param[i];
    m.grad = me->grad[i];
    m.rows = matrix_shape[i][0];
    m.cols = matrix_shape[i][1];
    m.layout = &me->layout[i];
    if ((st = muon_add_matrix(opt, &m, NULL)) != MUON_OK) {
      note_failure(me, matrix_name[i], st, opt);
      ok = 0;
    }
  }
  for (step = 0; ok && step < N_STEPS; step++) {
    int before[N_MATRICES], after;
    for (i = 0; i < N_MATRICES; i++) {
      for (e = 0; e < me->n[i]; e++) me->grad[i][e] = full_grad[step][i][me->idx[i][e]];
      muon_set_grad(opt, i, me->grad[i]);
    }
    if (variant_normuon && step == 1) {
      muon_matrix m = muon_default_matrix();
      for (i = 0; i < N_MATRICES; i++) muon_get_owner(opt, i, &before[i]);
      memcpy(me->late, late_w0, sizeof late_w0);
      m.name = "late";
      m.param = me->late;
      m.grad = late_grad;
      m.rows = LATE_ROWS;
      m.cols = LATE_COLS;
      if ((st = muon_add_matrix(opt, &m, NULL)) != MUON_OK) { note_failure(me, "late", st, opt); ok = 0; }
    }
    if (ok && (st = muon_step(opt)) != MUON_OK) { note_failure(me, "muon_step", st, opt); ok = 0; }
    for (i = 0; ok && variant_normuon && step == 1 && i < N_MATRICES; i++)
      if (muon_get_owner(opt, i, &after) == MUON_OK && after != before[i]) me->owners_moved++;
    /* After the second and the last step, every rank reshards the checkpoint all ranks just
       saved into its own optimizer (a planned one, no re-plan due in between): the state stays
       the same, so no bit may change, and the second checkpoint must still reshard (holders'
       copies of NorMuon's v must not go stale in between). */
    if (ok && variant_normuon && (step == 1 || step == N_STEPS - 1)) {
      thread_world *w = me->world;
      const void *blobs[MAX_RANKS];
      size_t n = muon_state_size(opt);
      free(w->blob[me->rank]);
      w->blob[me->rank] = malloc(n);
      w->blob_size[me->rank] = n;
      if (!w->blob[me->rank] || (st = muon_state_save(opt, w->blob[me->rank], n)) != MUON_OK) { note_failure(me, "muon_state_save", st, opt); ok = 0; }
      if (!world_barrier(w)) ok = 0;
      for (i = 0; i < w->size; i++) blobs[i] = w->blob[i];
      if (ok && (st = muon_state_reshard(opt, blobs, w->blob_size, w->size)) != MUON_OK) { note_failure(me, "muon_state_reshard", st, opt); ok = 0; }
      if (!world_barrier(w)) ok = 0;   /* nobody frees a blob another rank still reads */
    }
  }
  muon_destroy(opt);
  world_leave(me->world);
  return NULL;
}

/* ---- checks --------------------------------------------------------------------------------- */
typedef struct tally {
  long long checked, bad;
  int n_notes;
  char notes[MAX_NOTES][1024];     /* the first failures, printed by report()                   */
} tally;

static void tally_fail(tally *t, const char *fmt, ...) {
  va_list ap;
  t->bad++;
  if (t->n_notes == MAX_NOTES) return;
  va_start(ap, fmt);
  vsnprintf(t->notes[t->n_notes++], sizeof t->notes[0], fmt, ap);
  va_end(ap);
}

static void report(const char *name, const tally *t, const char *what) {
  int k;
  TEST_CASE(name);
  for (k = 0; k < t->n_notes; k++) CHECK(0, "%s", t->notes[k]);
  CHECK(t->bad == 0, "%lld of %lld %s failed", t->bad, t->checked, what);
}

typedef struct coverage {          /* what the random meshes reached; levels over > 1 rank only  */
  int meshes_of[MAX_RANKS + 1];
  int replicate, shard0, shard1, flat_chunks, flat_ranges, shard_after_flat, nested, empty_pieces;
} coverage;

static void count_coverage(coverage *cov, const mesh *m, const rank_run *runs) {
  int a, r, i, split_axes = 0, after_flat = 0;
  cov->meshes_of[m->ranks]++;
  for (a = 0; a < m->n_axes; a++) {
    int wide = m->size[a] > 1;
    split_axes += wide;
    if (!wide) continue;
    if (m->placement[a] == MUON_REPLICATE) cov->replicate++;
    if (m->placement[a] == MUON_SHARD && m->shard_dim[a] == 0) cov->shard0++;
    if (m->placement[a] == MUON_SHARD && m->shard_dim[a] == 1) cov->shard1++;
    if (m->placement[a] == MUON_SHARD && after_flat) cov->shard_after_flat++;
    if (m->placement[a] == MUON_FLAT && !m->explicit_ranges[a]) cov->flat_chunks++;
    if (m->placement[a] == MUON_FLAT && m->explicit_ranges[a]) cov->flat_ranges++;
    if (m->placement[a] == MUON_FLAT) after_flat = 1;
  }
  cov->nested += split_axes > 1;
  for (r = 0; r < m->ranks; r++)
    for (i = 0; i < N_MATRICES; i++) cov->empty_pieces += runs[r].n[i] == 0;
}

/* Every call succeeded; every rank's pieces equal one device's bits; every element is held by
   some rank, and every rank holding it holds the same bits. */
static void compare_ranks(const mesh *m, const rank_run *runs, tally *calls, tally *equal, tally *replicas) {
  char where[160], layout[256];
  int r, i;
  size_t e, k;
  describe_mesh(m, where, sizeof where);
  for (r = 0; r < m->ranks; r++) {
    calls->checked++;
    if (runs[r].failure[0]) tally_fail(calls, "%s, rank %d: %s", where, r, runs[r].failure);
  }
  for (i = 0; i < N_MATRICES; i++) {
    int cols = matrix_shape[i][1];
    for (k = 0; k < matrix_size(i); k++) held_by[i][k] = -1;
    for (r = 0; r < m->ranks; r++) {
      const rank_run *run = &runs[r];
      for (e = 0; e < run->n[i]; e++) {
        long long at = run->idx[i][e];
        float got = run->param[i][e], want = one_device[i][at];
        int first = held_by[i][at];
        equal->checked++;
        if (memcmp(&got, &want, sizeof got) != 0) {
          describe_layout(&run->layout[i], layout, sizeof layout);
          tally_fail(equal, "%s, %s %dx%d layout %s, rank %d, element %zu = (%lld, %lld): got %.9g want %.9g",
                     where, matrix_name[i], matrix_shape[i][0], cols, layout, r, e, at / cols, at % cols,
                     (double)got, (double)want);
        }
        if (first < 0) {
          held_by[i][at] = r;
          held_value[i][at] = got;
          continue;
        }
        replicas->checked++;
        if (memcmp(&got, &held_value[i][at], sizeof got) != 0)
          tally_fail(replicas, "%s, %s (%lld, %lld): rank %d has %.9g, rank %d has %.9g", where,
                     matrix_name[i], at / cols, at % cols, r, (double)got, first, (double)held_value[i][at]);
      }
    }
    for (k = 0; k < matrix_size(i); k++) {
      equal->checked++;
      if (held_by[i][k] < 0)
        tally_fail(equal, "%s, %s (%lld, %lld): no rank holds it (the test's layouts do not tile the matrix)",
                   where, matrix_name[i], (long long)k / cols, (long long)k % cols);
    }
  }
}

/* Runs mesh m: builds every rank's pieces, runs the ranks as threads, compares, frees. */
static void run_mesh(const mesh *m, tally *calls, tally *equal, tally *replicas, coverage *cov) {
  rank_run runs[MAX_RANKS];
  pthread_t thread[MAX_RANKS];
  thread_world w;
  int r, i, started = 0;
  size_t e;
  memset(&w, 0, sizeof w);
  memset(runs, 0, sizeof runs);
  w.size = m->ranks;
  pthread_mutex_init(&w.lock, NULL);
  pthread_cond_init(&w.wake, NULL);
  for (r = 0; r < m->ranks; r++) {
    rank_run *run = &runs[r];
    run->world = &w;
    run->rank = r;
    run->round_bytes = m->round_bytes;
    run->round_robin = m->round_robin;
    run->prefetch = m->prefetch;
    run->async = m->async;
    for (i = 0; i < N_MATRICES; i++) {
      run->idx[i] = (long long *)malloc(matrix_size(i) * sizeof(long long));
      mesh_layout(m, r, i, &run->layout[i], run->idx[i]);
      run->n[i] = ref_piece(&run->layout[i], matrix_shape[i][0], matrix_shape[i][1], run->idx[i]);
      run->param[i] = (float *)malloc((run->n[i] + 1) * sizeof(float));   /* + 1: never malloc(0) */
      run->grad[i] = (float *)malloc((run->n[i] + 1) * sizeof(float));
      for (e = 0; e < run->n[i]; e++) run->param[i][e] = full_w0[i][run->idx[i][e]];
    }
  }
  for (r = 0; r < m->ranks; r++) {
    if (pthread_create(&thread[r], NULL, rank_main, &runs[r]) != 0) {
      snprintf(runs[r].failure, sizeof runs[r].failure, "pthread_create failed");
      world_leave(&w);
      continue;
    }
    started |= 1 << r;
  }
  for (r = 0; r < m->ranks; r++)
    if (started & (1 << r)) pthread_join(thread[r], NULL);
  owners_moved += runs[0].owners_moved;
  for (r = 0; r < m->ranks; r++) free(w.blob[r]);
  compare_ranks(m, runs, calls, equal, replicas);
  if (cov) count_coverage(cov, m, runs);
  for (r = 0; r < m->ranks; r++)
    for (i = 0; i < N_MATRICES; i++) {
      free(runs[r].idx[i]);
      free(runs[r].param[i]);
      free(runs[r].grad[i]);
    }
  pthread_cond_destroy(&w.wake);
  pthread_mutex_destroy(&w.lock);
}

/* One muon on one device with the full matrices: the result every mesh must reproduce. */
static void run_one_device(void) {
  muon_desc desc = muon_default_desc();
  muon_optimizer *opt = NULL;
  int i, step;
  TEST_CASE(variant_normuon ? "one device, NorMuon and a matrix added after the first step: three steps (the reference)"
            : variant_gram ? "one device, cautious weight decay and Gram NS: three steps of the full matrices (the reference)"
            : variant_bf16 ? "one device, bf16 Newton-Schulz: three steps of the full matrices (the reference)"
                           : "one device: three steps of the full matrices (the reference)");
  desc.hparams.lr = LR;
  desc.hparams.cautious_wd = variant_cautious;
  desc.hparams.ns_algorithm = variant_gram ? MUON_NS_GRAM : MUON_NS_STANDARD;
  desc.hparams.precision = variant_bf16 ? MUON_PRECISION_BF16 : MUON_PRECISION_FP32;
  desc.hparams.normuon = variant_normuon;
  if (muon_create(&opt, &desc) != MUON_OK) { CHECK(0, "muon_create failed"); return; }
  for (i = 0; i < N_MATRICES; i++) {
    muon_matrix m = muon_default_matrix();
    memcpy(one_device[i], full_w0[i], matrix_size(i) * sizeof(float));
    m.name = matrix_name[i];
    m.param = one_device[i];
    m.grad = full_grad[0][i];
    m.rows = matrix_shape[i][0];
    m.cols = matrix_shape[i][1];
    CHECK(muon_add_matrix(opt, &m, NULL) == MUON_OK, "add %s: %s", matrix_name[i], muon_error(opt));
  }
  for (step = 0; step < N_STEPS; step++) {
    for (i = 0; i < N_MATRICES; i++) muon_set_grad(opt, i, full_grad[step][i]);
    if (variant_normuon && step == 1) {
      static float late[LATE_ROWS * LATE_COLS];
      muon_matrix m = muon_default_matrix();
      memcpy(late, late_w0, sizeof late_w0);
      m.name = "late";
      m.param = late;
      m.grad = late_grad;
      m.rows = LATE_ROWS;
      m.cols = LATE_COLS;
      CHECK(muon_add_matrix(opt, &m, NULL) == MUON_OK, "add late: %s", muon_error(opt));
    }
    CHECK(muon_step(opt) == MUON_OK, "step %d: %s", step, muon_error(opt));
  }
  muon_destroy(opt);
}

int main(int argc, char **argv) {
  int n_meshes = argc > 1 ? atoi(argv[1]) : DEFAULT_MESHES, id, i, step, p;
  tally calls, equal, replicas, variants;
  coverage cov;
  memset(&calls, 0, sizeof calls);
  memset(&equal, 0, sizeof equal);
  memset(&replicas, 0, sizeof replicas);
  memset(&variants, 0, sizeof variants);
  memset(&cov, 0, sizeof cov);
  if (n_meshes < 1) {
    fprintf(stderr, "usage: %s [MESHES]   (MESHES >= 1, default %d)\n", argv[0], DEFAULT_MESHES);
    return 2;
  }
  for (i = 0; i < N_MATRICES; i++) {
    full_w0[i] = (float *)malloc(matrix_size(i) * sizeof(float));
    one_device[i] = (float *)malloc(matrix_size(i) * sizeof(float));
    held_by[i] = (int *)malloc(matrix_size(i) * sizeof(int));
    held_value[i] = (float *)malloc(matrix_size(i) * sizeof(float));
    fill_random(full_w0[i], matrix_size(i), 100u + (unsigned)i);
    for (step = 0; step < N_STEPS; step++) {
      full_grad[step][i] = (float *)malloc(matrix_size(i) * sizeof(float));
      fill_random(full_grad[step][i], matrix_size(i), 1000u * (unsigned)(step + 1) + (unsigned)i);
    }
  }
  run_one_device();

  /* Balanced owners and one round (the default config), then the same meshes with small
     rounds and/or round-robin owners. */
  for (id = 0; id < n_meshes; id++) {
    mesh m = random_mesh(id);
    unsigned variant = 1 + mix((unsigned)id, 6, 0) % 3;     /* 1: small rounds, 2: round robin, 3: both */
    run_mesh(&m, &calls, &equal, &replicas, &cov);
    m.round_bytes = variant & 1 ? SMALL_ROUND_BYTES : 0;
    m.round_robin = (variant & 2) != 0;
    m.prefetch = (int)(mix((unsigned)id, 7, 0) % 3u);        /* overlap: 0/1/2 x off/on */
    m.async = (int)(mix((unsigned)id, 8, 0) % 2u);
    run_mesh(&m, &variants, &variants, &variants, NULL);
  }
  report("random meshes of 1 to 8 ranks: create, add and three steps succeed on every rank", &calls,
         "rank runs");
  report("random meshes: every rank's pieces are bitwise equal to one device's", &equal, "element checks");
  report("random meshes: replicas agree bit for bit", &replicas, "replica checks");
  report("the same meshes with 64-byte rounds and/or round-robin owners, prefetch 0-2 and async off/on: no call fails, no bit changes",
         &variants, "checks");

  /* The variants: a third of the meshes again, with cautious weight decay and Gram NS. */
  {
    tally v_calls, v_equal;
    memset(&v_calls, 0, sizeof v_calls);
    memset(&v_equal, 0, sizeof v_equal);
    variant_cautious = variant_gram = 1;
    run_one_device();
    for (id = 0; id < n_meshes; id += 3) {
      mesh m = random_mesh(id);
      run_mesh(&m, &v_calls, &v_equal, &v_equal, NULL);
    }
    report("random meshes with cautious weight decay and Gram Newton-Schulz: bitwise equal to one device, replicas agree",
           &v_equal, "element checks");
    report("random meshes with cautious weight decay and Gram Newton-Schulz: every call succeeds", &v_calls, "rank runs");
    CHECK(v_equal.checked > 0, "no element was checked");
    variant_cautious = variant_gram = 0;
  }

  /* bf16 Newton-Schulz on another third: the exchange then carries bf16 (two values to a float
     slot, messages of odd counts padded), which must change no bit. */
  {
    tally v_calls, v_equal;
    memset(&v_calls, 0, sizeof v_calls);
    memset(&v_equal, 0, sizeof v_equal);
    variant_bf16 = 1;
    run_one_device();
    for (id = 1; id < n_meshes; id += 3) {
      mesh m = random_mesh(id);
      m.round_bytes = id % 2 ? SMALL_ROUND_BYTES : 0;
      run_mesh(&m, &v_calls, &v_equal, &v_equal, NULL);
    }
    report("random meshes with bf16 Newton-Schulz (a bf16 wire): bitwise equal to one device, replicas agree",
           &v_equal, "element checks");
    report("random meshes with bf16 Newton-Schulz (a bf16 wire): every call succeeds", &v_calls, "rank runs");
    CHECK(v_equal.checked > 0, "no element was checked");
    variant_bf16 = 0;
  }

  /* NorMuon, both settings, on a sixth of the meshes each; a matrix added after the first step
     re-plans, and where that moves an owner its second moments must move too. */
  {
    static const muon_normuon kinds[2] = { MUON_NORMUON_ROWS, MUON_NORMUON_LARGER };
    int k;
    fill_random(late_w0, LATE_ROWS * LATE_COLS, 77u);
    fill_random(late_grad, LATE_ROWS * LATE_COLS, 78u);
    for (k = 0; k < 2; k++) {
      tally v_calls, v_equal;
      char name[200];
      memset(&v_calls, 0, sizeof v_calls);
      memset(&v_equal, 0, sizeof v_equal);
      variant_normuon = kinds[k];
      variant_cautious = k;
      owners_moved = 0;
      run_one_device();
      for (id = 1 + 3 * k; id < n_meshes; id += 6) {
        mesh m = random_mesh(id);
        run_mesh(&m, &v_calls, &v_equal, &v_equal, NULL);
      }
      snprintf(name, sizeof name, "random meshes with NorMuon %s%s and a late matrix: bitwise equal to one device, replicas agree",
               k ? "LARGER" : "ROWS", k ? " and cautious weight decay" : "");
      report(name, &v_equal, "element checks");
      report("  ... every call succeeds", &v_calls, "rank runs");
      TEST_CASE(k ? "NorMuon LARGER: the late matrix moved some owners (so second moments moved)" : "NorMuon ROWS: the late matrix moved some owners (so second moments moved)");
      CHECK(owners_moved > 0, "no owner moved in any mesh: the move of second moments went untested");
      printf("  NorMuon %s: %lld owners moved by the late matrix\n", k ? "LARGER" : "ROWS", owners_moved);
    }
    variant_normuon = MUON_NORMUON_OFF;
    variant_cautious = 0;
  }

  printf("  %d meshes, P = 1..8:", n_meshes);
  for (p = 1; p <= MAX_RANKS; p++) printf(" %d", cov.meshes_of[p]);
  printf("; levels over > 1 rank: REPLICATE %d, SHARD(0) %d, SHARD(1) %d, FLAT %d, FLAT range %d,"
         " SHARD after FLAT %d; nested %d; empty pieces %d\n", cov.replicate, cov.shard0, cov.shard1,
         cov.flat_chunks, cov.flat_ranges, cov.shard_after_flat, cov.nested, cov.empty_pieces);
  if (n_meshes >= DEFAULT_MESHES) {
    /* Guards the generator: a change to it must not quietly stop testing some kind of level. */
    TEST_CASE("the random meshes reach every P, every kind of level, nesting and empty pieces");
    for (p = 1; p <= MAX_RANKS; p++) CHECK(cov.meshes_of[p] > 0, "no mesh of %d ranks", p);
    CHECK(cov.replicate > 0 && cov.shard0 > 0 && cov.shard1 > 0,
          "a REPLICATE or SHARD level never split ranks");
    CHECK(cov.flat_chunks > 0 && cov.flat_ranges > 0, "a FLAT level never split ranks");
    CHECK(cov.shard_after_flat > 0, "no SHARD(0) of a flat piece");
    CHECK(cov.nested > 0 && cov.empty_pieces > 0, "no nested mesh or no empty piece");
  }

  for (i = 0; i < N_MATRICES; i++) {
    free(full_w0[i]);
    free(one_device[i]);
    free(held_by[i]);
    free(held_value[i]);
    for (step = 0; step < N_STEPS; step++) free(full_grad[step][i]);
  }
  return test_summary();
}
