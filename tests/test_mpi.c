/* test_mpi.c - the MPI communicator (muon_mpi.h) on N processes under mpirun.

   Build (tests/run_mpi.sh is what make test runs):
     gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -I. -Itests $(pkg-config --cflags ompi-c) \
         tests/test_mpi.c -o build/mpi/test_mpi $(pkg-config --libs ompi-c) -lm
   Run (as root Open MPI also needs --allow-run-as-root, more ranks than cores --oversubscribe):
     mpirun -n 4 build/mpi/test_mpi          both tables: uneven and zero counts, tickets joined
                                            in any order, finish, allgather, wrap and create,
                                            meshes and splits, int-count overflow and other bad
                                            arguments returned (not aborted), the trainer's
                                            communicator and error handler left alone, a
                                            mismatched exchange as MUON_ERR_COMM with MPI's text,
                                            and one fsdp step bitwise equal to one device
     mpirun -n 3 build/mpi/test_mpi --stall  rank 1 sleeps past the 1 s timeout: the others'
                                            join and allgather return MUON_ERR_TIMEOUT within
                                            the timeout + slack, and stay broken
     mpirun -n 3 build/mpi/test_mpi --die    rank 1 is killed (SIGKILL) mid-exchange: mpirun must end the job
                                            (run_mpi.sh checks it ends, non-zero, quickly)
   Rank 0 prints the summary, counting every rank's failures; a rank whose check failed exits
   non-zero. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MUON_IMPLEMENTATION
#include "muon.h"
#define MUON_MPI_IMPLEMENTATION
#include "muon_mpi.h"
#include "test.h"

static int me, n;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *err_of(const muon_comm *c) {
  const char *e = c->vt && c->vt->error ? c->vt->error(c->ctx) : NULL;
  return e ? e : "";
}

/* Floats src sends dst in exchange `it`: zero for some pairs, uneven otherwise. */
static size_t count_of(int src, int dst, int it) {
  unsigned h = (unsigned)(src * 7 + dst * 13 + it * 5);
  return h % 4 == 0 ? 0 : (size_t)(h % 37) + (size_t)(src == dst);
}
static float value_of(int src, int dst, int it, size_t i) {
  return (float)(src * 1000000 + dst * 10000 + it * 100) + (float)i * 0.5f;
}

typedef struct xchg {
  size_t sc[64], sd[64], rc[64], rd[64];
  float *send, *recv;
  int ticket;
} xchg;

/* Buffers for exchange `it` on c (group ranks mapped to world ranks by `world_of`). */
static void xchg_make(xchg *x, const muon_comm *c, int it) {
  size_t s = 0, r = 0, i;
  int p;
  for (p = 0; p < c->size; p++) {
    x->sc[p] = count_of(c->rank, p, it); x->sd[p] = s; s += x->sc[p] + 1;   /* a gap between parts */
    x->rc[p] = count_of(p, c->rank, it); x->rd[p] = r; r += x->rc[p] + 2;
  }
  x->send = (float *)malloc((s + 1) * sizeof(float));
  x->recv = (float *)malloc((r + 1) * sizeof(float));
  for (i = 0; i < r + 1; i++) x->recv[i] = -1;
  for (p = 0; p < c->size; p++)
    for (i = 0; i < x->sc[p]; i++) x->send[x->sd[p] + i] = value_of(c->rank, p, it, i);
  x->ticket = -2;
}

static int xchg_bad(const xchg *x, const muon_comm *c, int it) {
  int p, bad = 0;
  size_t i;
  for (p = 0; p < c->size; p++) {
    for (i = 0; i < x->rc[p]; i++) bad += x->recv[x->rd[p] + i] != value_of(p, c->rank, it, i);
    bad += x->recv[x->rd[p] + x->rc[p]] != -1;   /* nothing written past a part */
  }
  return bad;
}

static void xchg_free(xchg *x) { free(x->send); free(x->recv); }

/* Exchanges on c: several started at once, joined in reverse order (queued table), or one by
   one (blocking). */
static void check_exchanges(const muon_comm *c, const char *what) {
  enum { K = 5 };
  xchg x[K];
  int k;
  muon_status st;
  for (k = 0; k < K; k++) {
    xchg_make(&x[k], c, k);
    st = c->vt->alltoallv(c->ctx, x[k].send, x[k].sc, x[k].sd, x[k].recv, x[k].rc, x[k].rd, &x[k].ticket);
    CHECK(st == MUON_OK, "%s: alltoallv %d: %s", what, k, err_of(c));
    CHECK(c->vt->queued ? x[k].ticket >= 0 : x[k].ticket == -1, "%s: ticket %d", what, x[k].ticket);
  }
  if (c->vt->queued) {
    CHECK(c->vt->finish(c->ctx) == MUON_OK, "%s: finish: %s", what, err_of(c));
    for (k = 0; k < K; k++)   /* finished: readable before the joins */
      CHECK(xchg_bad(&x[k], c, k) == 0, "%s: exchange %d not complete after finish", what, k);
    for (k = K - 1; k >= 0; k--)
      CHECK(c->vt->join(c->ctx, x[k].ticket) == MUON_OK, "%s: join %d: %s", what, k, err_of(c));
    CHECK(c->vt->join(c->ctx, x[0].ticket) == MUON_ERR_ARG, "%s: a second join of a ticket is refused", what);
  }
  for (k = 0; k < K; k++) {
    CHECK(xchg_bad(&x[k], c, k) == 0, "%s: exchange %d received wrong data", what, k);
    xchg_free(&x[k]);
  }
}

static void check_allgather(const muon_comm *c, const char *what) {
  int mine[3] = {c->rank, c->size, me}, all[3 * 64];
  int p;
  CHECK(c->vt->allgather(c->ctx, mine, all, sizeof mine) == MUON_OK, "%s: allgather: %s", what, err_of(c));
  for (p = 0; p < c->size; p++) CHECK(all[3 * p] == p && all[3 * p + 1] == c->size, "%s: allgather slot %d", what, p);
  CHECK(c->vt->allgather(c->ctx, NULL, NULL, 0) == MUON_OK, "%s: allgather of 0 bytes", what);
}

/* One FSDP step over c, against one device: bitwise. */
static void check_step(muon_comm *c) {
  enum { R = 13, C = 6 };
  float w[R * C], g[R * C], full[R * C], fg[R * C];
  int i, lo, hi, per = (R + c->size - 1) / c->size;   /* torch.chunk of the rows */
  muon_auto_desc ad;
  muon_dist_config cfg;
  muon_desc d = muon_default_desc(), d1 = muon_default_desc();
  muon_optimizer *opt = NULL, *ref = NULL;
  muon_matrix m, m1;
  for (i = 0; i < R * C; i++) {
    full[i] = (float)((i * 37) % 11) * 0.1f - 0.5f;
    fg[i] = (float)((i * 53) % 17) * 0.05f - 0.4f;
  }
  memset(&ad, 0, sizeof ad);
  ad.fsdp = c;
  cfg = muon_auto_config(&ad);   /* SHARD(0): rows in torch.chunk pieces */
  d.comm = c;
  d.dist = &cfg;
  CHECK(muon_create(&opt, &d) == MUON_OK, "step: muon_create: %s", muon_error(NULL));
  CHECK(muon_create(&ref, &d1) == MUON_OK, "step: muon_create (one device)");
  if (!opt || !ref) return;
  lo = c->rank * per < R ? c->rank * per : R;
  hi = lo + per < R ? lo + per : R;
  memcpy(w, full + lo * C, sizeof(float) * (size_t)((hi - lo) * C));
  memcpy(g, fg + lo * C, sizeof(float) * (size_t)((hi - lo) * C));
  memset(&m, 0, sizeof m);
  m.name = "w"; m.param = w; m.grad = g; m.rows = R; m.cols = C;
  m1 = m; m1.param = full; m1.grad = fg;
  CHECK(muon_add_matrix(opt, &m, NULL) == MUON_OK, "step: add: %s", muon_error(opt));
  CHECK(muon_add_matrix(ref, &m1, NULL) == MUON_OK, "step: add (one device)");
  for (i = 0; i < 2; i++) {
    CHECK(muon_step(opt) == MUON_OK, "step %d: %s", i, muon_error(opt));
    CHECK(muon_step(ref) == MUON_OK, "step %d (one device)", i);
  }
  CHECK(memcmp(w, full + lo * C, sizeof(float) * (size_t)((hi - lo) * C)) == 0, "step: not bitwise equal to one device");
  muon_destroy(opt);
  muon_destroy(ref);
}

static int expect_refused(muon_status st, muon_status want, const char *needle) {
  return st == want && strstr(muon_error(NULL), needle) != NULL;
}

static void run_main(void) {
  muon_mpi_desc bd = muon_mpi_default_desc();
  muon_comm world, blocking, again, sub, bad;
  MPI_Errhandler eh;
  int dims[2], flags = 0;
  muon_status st;

  TEST_CASE("create: the world over a duplicate of MPI_COMM_WORLD, queued by default");
  st = muon_mpi_create(&world, NULL);
  CHECK(st == MUON_OK, "muon_mpi_create: %s", muon_error(NULL));
  if (st != MUON_OK) return;
  CHECK(world.rank == me && world.size == n && world.vt->queued == 1 && world.vt->version == MUON_COMM_VTABLE_VERSION,
        "rank %d size %d queued %d", world.rank, world.size, world.vt->queued);
  CHECK(muon_mpi_handle(&world) != MPI_COMM_NULL, "handle");
  MPI_Comm_compare(muon_mpi_handle(&world), MPI_COMM_WORLD, &flags);
  CHECK(flags == MPI_CONGRUENT, "muon talks on a duplicate (compare %d)", flags);
  CHECK(*err_of(&world) == 0, "no error yet: %s", err_of(&world));

  TEST_CASE("errors: the trainer's handler stays, muon's duplicate returns errors");
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh);
  CHECK(eh == MPI_ERRORS_ARE_FATAL, "MPI_COMM_WORLD's handler changed");
  MPI_Errhandler_free(&eh);
  MPI_Comm_get_errhandler(muon_mpi_handle(&world), &eh);
  CHECK(eh == MPI_ERRORS_RETURN, "muon's communicator does not return errors");
  MPI_Errhandler_free(&eh);

  TEST_CASE("queued: uneven and zero counts, tickets in flight joined in reverse order");
  check_exchanges(&world, "world");
  TEST_CASE("allgather");
  check_allgather(&world, "world");

  TEST_CASE("blocking: wrap with desc.blocking = 1: MPI_Alltoallv / MPI_Allgather");
  bd.blocking = 1;
  st = muon_mpi_wrap(&blocking, MPI_COMM_WORLD, &bd);
  CHECK(st == MUON_OK && blocking.vt->queued == 0 && !blocking.vt->join && !blocking.vt->finish,
        "wrap blocking: %s", muon_error(NULL));
  if (st == MUON_OK) {
    check_exchanges(&blocking, "blocking");
    check_allgather(&blocking, "blocking");
  }

  TEST_CASE("bad arguments are returned, nothing aborts, the communicator stays usable");
  {
    size_t big[64], z[64];
    float f = 0;
    int t = 0, p;
    for (p = 0; p < n; p++) { big[p] = 0; z[p] = 0; }
    big[(me + 1) % n] = (size_t)INT_MAX + 1;
    st = world.vt->alltoallv(world.ctx, &f, big, z, &f, z, z, &t);
    CHECK(st == MUON_ERR_ARG && strstr(err_of(&world), "INT_MAX"), "count > INT_MAX: %d %s", st, err_of(&world));
    st = blocking.vt->alltoallv(blocking.ctx, &f, z, big, &f, z, z, &t);
    CHECK(st == MUON_ERR_ARG && strstr(err_of(&blocking), "send_displs"), "displacement > INT_MAX: %s", err_of(&blocking));
    st = world.vt->alltoallv(world.ctx, &f, NULL, z, &f, z, z, &t);
    CHECK(st == MUON_ERR_ARG, "NULL counts");
    CHECK(world.vt->allgather(world.ctx, NULL, &f, 4) == MUON_ERR_ARG, "NULL send");
    CHECK(world.vt->allgather(world.ctx, &f, &f, (size_t)INT_MAX + 1) == MUON_ERR_ARG, "allgather > INT_MAX");
    CHECK(world.vt->join(world.ctx, 3) == MUON_ERR_ARG && strstr(err_of(&world), "ticket"), "join of no exchange");
    CHECK(expect_refused(muon_mpi_wrap(&bad, MPI_COMM_NULL, NULL), MUON_ERR_ARG, "MPI_COMM_NULL") && !bad.vt,
          "wrap of MPI_COMM_NULL: %s", muon_error(NULL));
    bd.blocking = 2;
    CHECK(expect_refused(muon_mpi_wrap(&bad, MPI_COMM_WORLD, &bd), MUON_ERR_ARG, "desc.blocking"), "desc.blocking 2");
    bd.blocking = 0;
    bd.timeout_s = -1;
    CHECK(expect_refused(muon_mpi_create(&bad, &bd), MUON_ERR_ARG, "timeout_s"), "desc.timeout_s -1");
    dims[0] = n + 1;
    CHECK(expect_refused(muon_mpi_mesh_subgroup(&bad, &world, dims, 1, 0), MUON_ERR_ARG, "dims[0]"), "mesh too big");
    again = muon_comm_self();
    CHECK(expect_refused(muon_mpi_split(&bad, &again, 0, 0), MUON_ERR_ARG, "not a muon_mpi"), "split of a non-MPI parent");
    CHECK(muon_mpi_handle(&again) == MPI_COMM_NULL, "handle of a non-MPI comm");
    check_exchanges(&world, "world after refusals");
  }

  TEST_CASE("meshes and splits: groups of the parent's ranks, collectives inside them");
  {
    int rows = n % 2 == 0 ? 2 : 1, cols = n / rows, k;
    dims[0] = rows;
    dims[1] = cols;
    for (k = 0; k < 2; k++) {
      int all[3 * 64], mine[3], p;
      st = muon_mpi_mesh_subgroup(&sub, &world, dims, 2, k);
      CHECK(st == MUON_OK, "mesh dim %d: %s", k, muon_error(NULL));
      if (st != MUON_OK) continue;
      CHECK(sub.size == dims[k] && sub.rank == (k == 1 ? me % cols : me / cols), "mesh dim %d: rank %d of %d", k,
            sub.rank, sub.size);
      mine[0] = me; mine[1] = 0; mine[2] = 0;
      CHECK(sub.vt->allgather(sub.ctx, mine, all, sizeof mine) == MUON_OK, "mesh allgather");
      for (p = 0; p < sub.size; p++) {
        int want = k == 1 ? (me / cols) * cols + p : p * cols + me % cols;
        CHECK(all[3 * p] == want, "mesh dim %d: member %d is world rank %d, want %d", k, p, all[3 * p], want);
      }
      check_exchanges(&sub, "mesh");
      muon_comm_destroy(&sub);
    }
    st = muon_mpi_split(&sub, &world, me == 0 ? MPI_UNDEFINED : 1, n - me);   /* reversed, rank 0 out */
    CHECK(st == MUON_OK, "split: %s", muon_error(NULL));
    if (me == 0) CHECK(sub.vt == NULL && sub.ctx == NULL, "MPI_UNDEFINED gives no group");
    else {
      CHECK(sub.size == n - 1 && sub.rank == n - 1 - me, "split: rank %d of %d", sub.rank, sub.size);
      check_exchanges(&sub, "split");
      muon_comm_destroy(&sub);
    }
  }

  TEST_CASE("a mismatched exchange is MUON_ERR_COMM with MPI's text, not an abort");
  if (n >= 2) {
    int b;
    /* the blocking table only at 2 ranks: a third one would wait in MPI_Alltoallv for the
       receiver, which left it, without a deadline (see muon_mpi.h, FAILURES) */
    for (b = 0; b < (n == 2 ? 2 : 1); b++) {
      muon_mpi_desc md = muon_mpi_default_desc();
      muon_comm m;
      size_t sc[64], sd[64], rc[64], rd[64];
      float s[8] = {0}, r[8] = {0};
      int t = -1, p;
      md.blocking = b;
      md.timeout_s = 2;   /* rank 1's aborted schedule may leave a third rank waiting */
      st = muon_mpi_wrap(&m, MPI_COMM_WORLD, &md);   /* its own: it stays broken after */
      CHECK(st == MUON_OK, "wrap: %s", muon_error(NULL));
      if (st != MUON_OK) continue;
      for (p = 0; p < n; p++) { sc[p] = 0; sd[p] = 0; rc[p] = 0; rd[p] = 0; }
      if (me == 0) sc[1] = 4;   /* rank 0 sends rank 1 four floats, rank 1 expects one */
      if (me == 1) rc[0] = 1;
      st = m.vt->alltoallv(m.ctx, s, sc, sd, r, rc, rd, &t);
      if (st == MUON_OK && m.vt->join) st = m.vt->join(m.ctx, t);
      if (me == 1) {
        CHECK(st == MUON_ERR_COMM && strstr(err_of(&m), "MPI_ERR"), "%s, the receiver: %d '%s'",
              b ? "blocking" : "queued", st, err_of(&m));
        CHECK(m.vt->allgather(m.ctx, s, r, 1) == MUON_ERR_COMM, "broken after");
      } else if (me >= 2)
        CHECK(st == MUON_OK || st == MUON_ERR_TIMEOUT || st == MUON_ERR_COMM, "a bystander: %d '%s'", st, err_of(&m));
      MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh);
      CHECK(eh == MPI_ERRORS_ARE_FATAL, "MPI_COMM_WORLD's handler is the trainer's again");
      MPI_Errhandler_free(&eh);
      muon_comm_destroy(&m);   /* broken on rank 1: its duplicate is left to MPI */
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }

  TEST_CASE("one FSDP step over MPI is bitwise equal to one device (both tables)");
  check_step(&world);
  if (blocking.vt) check_step(&blocking);

  muon_comm_destroy(&blocking);
  muon_comm_destroy(&world);
}

/* Rank 1 stalls past the timeout while the others wait in join and allgather. */
static void run_stall(void) {
  muon_mpi_desc d = muon_mpi_default_desc();
  muon_comm c;
  muon_status st;
  double t0;
  xchg x;
  d.timeout_s = 1.0;
  TEST_CASE("stall: join and allgather return MUON_ERR_TIMEOUT within the timeout");
  st = muon_mpi_create(&c, &d);
  CHECK(st == MUON_OK, "create: %s", muon_error(NULL));
  if (st != MUON_OK) return;
  if (me == 1) sleep(2);
  xchg_make(&x, &c, 0);
  t0 = now_s();
  st = c.vt->alltoallv(c.ctx, x.send, x.sc, x.sd, x.recv, x.rc, x.rd, &x.ticket);
  if (st == MUON_OK) st = c.vt->join(c.ctx, x.ticket);
  if (me != 1) {
    double took = now_s() - t0;
    CHECK(st == MUON_ERR_TIMEOUT && strstr(err_of(&c), "timed out"), "join: %d '%s'", st, err_of(&c));
    CHECK(took >= 0.9 && took < 2.5, "join returned after %.2f s (timeout 1 s)", took);
    t0 = now_s();
    CHECK(c.vt->allgather(c.ctx, &me, x.recv, sizeof me) == MUON_ERR_TIMEOUT && now_s() - t0 < 0.1,
          "broken: every later call at once");
    CHECK(c.vt->finish(c.ctx) == MUON_ERR_TIMEOUT, "finish: broken");
  }
  TEST_CASE("stall: a fresh allgather times out too");
  {
    muon_comm c2;
    int all[64];
    st = muon_mpi_create(&c2, &d);
    CHECK(st == MUON_OK, "create: %s", muon_error(NULL));
    if (st == MUON_OK) {
      if (me == 1) sleep(2);
      t0 = now_s();
      st = c2.vt->allgather(c2.ctx, &me, all, sizeof me);
      if (me != 1) {
        double took = now_s() - t0;
        CHECK(st == MUON_ERR_TIMEOUT, "allgather: %d '%s'", st, err_of(&c2));
        CHECK(took >= 0.9 && took < 2.5, "allgather returned after %.2f s (timeout 1 s)", took);
      }
      muon_comm_destroy(&c2);
    }
  }
  /* The job ends cleanly: everybody meets once more on a communicator of its own. */
  MPI_Barrier(MPI_COMM_WORLD);
  muon_comm_destroy(&c);
  xchg_free(&x);
}

/* Rank 1 exits while the others wait in join: mpirun must end the job. */
static void run_die(void) {
  muon_comm c;
  xchg x;
  muon_status st = muon_mpi_create(&c, NULL);
  if (st != MUON_OK) return;
  if (me == 1) raise(SIGKILL);   /* a crash */
  xchg_make(&x, &c, 0);
  st = c.vt->alltoallv(c.ctx, x.send, x.sc, x.sd, x.recv, x.rc, x.rd, &x.ticket);
  if (st == MUON_OK) st = c.vt->join(c.ctx, x.ticket);
  printf("rank %d: join returned %s: %s\n", me, muon_status_string(st), err_of(&c));
  fflush(stdout);
  _exit(st == MUON_OK ? 4 : 5);   /* never a clean exit: a survivor cannot complete */
}

int main(int argc, char **argv) {
  int provided = 0, stall = 0, die = 0, i, fails[64], total = 0;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--stall")) stall = 1;
    else if (!strcmp(argv[i], "--die")) die = 1;
    else { fprintf(stderr, "usage: mpirun -n N %s [--stall | --die]\n", argv[0]); return 2; }
  }
  /* The trainer's MPI_Init: muon_mpi_create then only duplicates MPI_COMM_WORLD. */
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n > 64 || ((stall || die) && n < 2)) {
    if (me == 0) fprintf(stderr, "test_mpi: 1..64 ranks (--stall, --die: 2 or more)\n");
    MPI_Finalize();
    return 2;
  }
  if (die) run_die();
  else if (stall) run_stall();
  else run_main();
  test__end_case();
  MPI_Allgather(&test__failed, 1, MPI_INT, fails, 1, MPI_INT, MPI_COMM_WORLD);
  for (i = 0; i < n; i++) total += fails[i];
  if (me == 0) {
    int cases = test__passed + test__failed;
    printf("%d passed, %d failed\n", cases - (total < cases ? total : cases), total);
  }
  MPI_Finalize();
  return test__failed ? 1 : 0;
}
