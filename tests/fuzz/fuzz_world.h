/* fuzz_world.h - P ranks of one process as threads, talking through an in-memory muon_comm.

   Shared by the layout fuzz target (tests/fuzz/fuzz_layout.c) and the seed generator
   (tests/fuzz/make_seeds.c). The idea is tests/test_threads.c's, hardened for arbitrary input:
   - every collective posts its kind (alltoallv / allgather) and sizes before the first barrier;
     after it every rank checks that all ranks called the same collective with matching sizes
     (alltoallv: send counts = the peers' receive counts; allgather: equal bytes) and only then
     copies, so a rank never reads another's stale pointers. A disagreement is a protocol bug of
     muon (ranks out of step inside one call): with `strict`, it aborts, naming the call;
   - the barrier gives up (the collective returns MUON_ERR_COMM) once any rank's thread has
     ended, so a rank that stops after an error cannot hang the others.
   The includer defines _POSIX_C_SOURCE 200809L (pthreads under -std=c99) and MUON_IMPLEMENTATION
   before including muon.h, then includes this. */
#ifndef FUZZ_WORLD_H
#define FUZZ_WORLD_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define FZ_UNUSED __attribute__((unused))
#else
#define FZ_UNUSED
#endif

#define FZ_MAX_RANKS 4

enum { FZ_ALLTOALLV = 1, FZ_ALLGATHER = 2 };

typedef struct fz_world {
  int size;
  int strict;                      /* abort on a collective the ranks disagree about            */
  pthread_mutex_t lock;
  pthread_cond_t wake;
  int arrived, generation, n_left;
  int kind[FZ_MAX_RANKS];          /* what each rank called in the current collective           */
  size_t bytes[FZ_MAX_RANKS];
  const float *send[FZ_MAX_RANKS];
  const size_t *send_counts[FZ_MAX_RANKS], *send_displs[FZ_MAX_RANKS], *recv_counts[FZ_MAX_RANKS];
  const void *gather_send[FZ_MAX_RANKS];
} fz_world;

typedef struct fz_link {           /* one rank's communicator context                           */
  fz_world *world;
  int rank;
  const char *error;
} fz_link;

static FZ_UNUSED void fz_world_init(fz_world *w, int size, int strict) {
  memset(w, 0, sizeof *w);
  w->size = size;
  w->strict = strict;
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->wake, NULL);
}

static FZ_UNUSED void fz_world_free(fz_world *w) {
  pthread_cond_destroy(&w->wake);
  pthread_mutex_destroy(&w->lock);
}

/* Returns 0 (gives up) once some rank's thread has ended. A rank that gave up stays counted as
   arrived, so from then on every barrier fails at once: it must never complete with a rank that
   is in another collective (or none). */
static int fz_barrier(fz_world *w) {
  int generation, passed;
  pthread_mutex_lock(&w->lock);
  if (w->n_left) { pthread_mutex_unlock(&w->lock); return 0; }
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

/* A rank's thread is done (after success or an error): later collectives of the others fail. */
static FZ_UNUSED void fz_leave(fz_world *w) {
  pthread_mutex_lock(&w->lock);
  w->n_left++;
  pthread_cond_broadcast(&w->wake);
  pthread_mutex_unlock(&w->lock);
}

static void fz_desync(fz_world *w, const char *what) {
  if (!w->strict) return;
  fprintf(stderr, "fuzz_world: ranks out of step inside one muon call: %s\n", what);
  abort();
}

/* After the first barrier: did every rank call the same collective, with matching sizes? */
static int fz_agree(fz_world *w, int kind) {
  int p, q;
  for (p = 0; p < w->size; p++)
    if (w->kind[p] != kind) { fz_desync(w, "one rank in alltoallv while another is in allgather"); return 0; }
  if (kind == FZ_ALLGATHER) {
    for (p = 0; p < w->size; p++)
      if (w->bytes[p] != w->bytes[0]) { fz_desync(w, "allgather with different byte counts on different ranks"); return 0; }
    return 1;
  }
  for (p = 0; p < w->size; p++)
    for (q = 0; q < w->size; q++)
      if (w->send_counts[p][q] != w->recv_counts[q][p]) { fz_desync(w, "alltoallv send counts differ from the peers' receive counts"); return 0; }
  return 1;
}

static muon_status fz_alltoallv(void *ctx, const float *send, const size_t *send_counts, const size_t *send_displs,
                                float *recv, const size_t *recv_counts, const size_t *recv_displs, int *ticket) {
  fz_link *me = (fz_link *)ctx;
  fz_world *w = me->world;
  *ticket = -1;
  int p, ok;
  w->kind[me->rank] = FZ_ALLTOALLV;
  w->send[me->rank] = send;
  w->send_counts[me->rank] = send_counts;
  w->send_displs[me->rank] = send_displs;
  w->recv_counts[me->rank] = recv_counts;
  if (!fz_barrier(w)) { me->error = "a rank left during alltoallv"; return MUON_ERR_COMM; }
  ok = fz_agree(w, FZ_ALLTOALLV);
  for (p = 0; ok && p < w->size; p++)
    if (recv_counts[p]) memcpy(recv + recv_displs[p], w->send[p] + w->send_displs[p][me->rank], recv_counts[p] * sizeof(float));
  if (!fz_barrier(w)) { me->error = "a rank left during alltoallv"; return MUON_ERR_COMM; }
  w->kind[me->rank] = 0;
  if (!ok) { me->error = "the ranks disagree about this alltoallv"; return MUON_ERR_COMM; }
  return MUON_OK;
}

static muon_status fz_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  fz_link *me = (fz_link *)ctx;
  fz_world *w = me->world;
  int p, ok;
  w->kind[me->rank] = FZ_ALLGATHER;
  w->gather_send[me->rank] = send;
  w->bytes[me->rank] = bytes;
  if (!fz_barrier(w)) { me->error = "a rank left during allgather"; return MUON_ERR_COMM; }
  ok = fz_agree(w, FZ_ALLGATHER);
  for (p = 0; ok && p < w->size; p++) memcpy((char *)recv + (size_t)p * bytes, w->gather_send[p], bytes);
  if (!fz_barrier(w)) { me->error = "a rank left during allgather"; return MUON_ERR_COMM; }
  w->kind[me->rank] = 0;
  if (!ok) { me->error = "the ranks disagree about this allgather"; return MUON_ERR_COMM; }
  return MUON_OK;
}

static const char *fz_comm_error(void *ctx) { return ((fz_link *)ctx)->error; }

static const muon_comm_vtable fz_comm_vtable = {
  MUON_COMM_VTABLE_VERSION,
  /* .alltoallv = */ fz_alltoallv,
  /* .join      = */ NULL,
  /* .finish    = */ NULL,
  /* .allgather = */ fz_allgather,
  /* .error     = */ fz_comm_error,
  /* .destroy   = */ NULL,
  /* .memory    = */ MUON_MEMORY_HOST,
  /* .queued    = */ 0
};

static FZ_UNUSED muon_comm fz_comm(fz_link *link, fz_world *w, int rank) {
  muon_comm c;
  link->world = w;
  link->rank = rank;
  link->error = NULL;
  c.vt = &fz_comm_vtable;
  c.ctx = link;
  c.rank = rank;
  c.size = w->size;
  return c;
}

/* Runs fn(arg_r) for every rank r: rank 0 on the calling thread, the others on threads of
   their own, and joins them. */
static FZ_UNUSED void fz_run_ranks(fz_world *w, void *(*fn)(void *), void *args, size_t arg_size) {
  pthread_t thread[FZ_MAX_RANKS];
  int r;
  for (r = 1; r < w->size; r++)
    if (pthread_create(&thread[r], NULL, fn, (char *)args + (size_t)r * arg_size) != 0) {
      fprintf(stderr, "fuzz_world: pthread_create failed\n");
      abort();
    }
  fn(args);
  for (r = 1; r < w->size; r++) pthread_join(thread[r], NULL);
}

#endif /* FUZZ_WORLD_H */
