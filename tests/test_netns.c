/* test_netns.c - a step cut by the network, and the resume from its checkpoint. Run by
   tests/run_netns.sh with each rank in its own network namespace (Gloo over Redis, MUON_GLOO_HOST
   the rank's own address; or built with -DEX_MPI, under mpirun with an orted per namespace); FSDP over the world, prefetch 2, async, a round per matrix, so several
   exchanges are in flight when the network goes.

     test_netns DIR fault V   K steps, then the checkpoint: DIR/rank<r>.muon (muon_state_save_file)
                              and DIR/params.<r> (the trainer's own piece). Step K+1: rank V stops
                              inside its first exchange, writes DIR/paused and waits (at most 60 s)
                              for DIR/cut, which the script writes once it has cut the network.
                              Every rank must return MUON_ERR_COMM or MUON_ERR_TIMEOUT within
                              MUON_GLOO_TIMEOUT (MPI: MUON_MPI_TIMEOUT) + 3 s of DIR/cut, its
                              parameters and momentum those of the checkpoint (nothing applied);
                              it writes its verdict to DIR/result.<r> and _exits.
     test_netns DIR resume    a new job: loads the checkpoint, steps K+1..N, and must equal one
                              device after N steps bit for bit (parameters and momentum).
   The single device runs in every rank's process on the full matrices, fed the same gradients. */
#define MUON_IMPLEMENTATION
#include "common.h"
#include "test.h"

#include <errno.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define K 2          /* steps before the checkpoint */
#define N 5          /* steps in all */
#define NM 4
static const int shapes[NM][2] = { { 96, 64 }, { 64, 96 }, { 128, 32 }, { 48, 48 } };

typedef struct net_comm { muon_comm inner; int victim, paused; const char *dir; } net_comm;
static net_comm NC;
static int pausing;   /* set for the step the network is cut in */

static int exists(const char *dir, const char *name) {
  char p[512];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return stat(p, &st) == 0;
}
static double now_real(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The victim's first exchange of the step: tell the script, wait for the cut. */
static muon_status net_alltoallv(void *ctx, const float *s, const size_t *sc, const size_t *sd, float *r,
                                 const size_t *rc, const size_t *rd, int *ticket) {
  net_comm *f = (net_comm *)ctx;
  if (pausing && f->inner.rank == f->victim && !f->paused) {
    char p[512];
    FILE *fp;
    int i;
    struct timespec tick = { 0, 10000000 };
    f->paused = 1;
    snprintf(p, sizeof p, "%s/paused", f->dir);
    if ((fp = fopen(p, "w"))) fclose(fp);
    for (i = 0; i < 6000 && !exists(f->dir, "cut"); i++) nanosleep(&tick, NULL);
  }
  return f->inner.vt->alltoallv(f->inner.ctx, s, sc, sd, r, rc, rd, ticket);
}
static muon_status net_join(void *ctx, int t) { net_comm *f = (net_comm *)ctx; return f->inner.vt->join ? f->inner.vt->join(f->inner.ctx, t) : MUON_OK; }
static muon_status net_finish(void *ctx) { net_comm *f = (net_comm *)ctx; return f->inner.vt->finish ? f->inner.vt->finish(f->inner.ctx) : MUON_OK; }
static muon_status net_allgather(void *ctx, const void *s, void *r, size_t n) { net_comm *f = (net_comm *)ctx; return f->inner.vt->allgather(f->inner.ctx, s, r, n); }
static const char *net_error(void *ctx) { net_comm *f = (net_comm *)ctx; return f->inner.vt->error ? f->inner.vt->error(f->inner.ctx) : ""; }
static const muon_comm_vtable net_vt = {
    MUON_COMM_VTABLE_VERSION,
    /* .alltoallv = */ net_alltoallv,
    /* .join      = */ net_join,
    /* .finish    = */ net_finish,
    /* .allgather = */ net_allgather,
    /* .error     = */ net_error,
    /* .destroy   = */ NULL,
    /* .memory    = */ MUON_MEMORY_HOST,
    /* .queued    = */ 1};

typedef struct model {
  muon_optimizer *ref, *opt;
  float *full_w[NM], *full_g[NM], *target[NM];
  float *w[NM], *g[NM];
  long long lo[NM], rows[NM];   /* this rank's rows [lo, lo + rows) */
} model;

static void grads(model *m, int t) {
  int i;
  long long e;
  for (i = 0; i < NM; i++) {
    long long cols = shapes[i][1], full = shapes[i][0] * cols, off = m->lo[i] * cols;
    unsigned seed = ex_hash("netns", 977u * (unsigned)(t + 1) + (unsigned)i);
    for (e = 0; e < full; e++) m->full_g[i][e] = (m->full_w[i][e] - m->target[i][e]) + 0.1f * ex_value(seed, e);
    for (e = 0; e < m->rows[i] * cols; e++) m->g[i][e] = (m->w[i][e] - m->target[i][off + e]) + 0.1f * ex_value(seed, off + e);
  }
}

static void build(model *m, ex_world *w, muon_comm *c, muon_dist_config *cfg, muon_layout *l) {
  muon_desc rd = muon_default_desc(), d = muon_default_desc();
  int i;
  long long e;
  muon_auto_desc ad;
  memset(&ad, 0, sizeof ad);
  ad.fsdp = c;
  ad.prefetch = 2;
  ad.async = 1;
  ad.round_bytes = 1;
  *cfg = muon_auto_config(&ad);
  memset(l, 0, sizeof *l);
  l->n_levels = 1;
  l->levels[0] = muon_shard(0, c);
  rd.hparams.lr = d.hparams.lr = 0.02f;
  d.comm = c;
  d.dist = cfg;
  if (muon_create(&m->ref, &rd) != MUON_OK || muon_create(&m->opt, &d) != MUON_OK) ex_die(w, "muon_create", muon_error(NULL));
  for (i = 0; i < NM; i++) {
    long long rows = shapes[i][0], cols = shapes[i][1];
    muon_matrix a = muon_default_matrix(), b = muon_default_matrix();
    char name[16];
    m->full_w[i] = (float *)malloc((size_t)(rows * cols) * sizeof(float));
    m->full_g[i] = (float *)malloc((size_t)(rows * cols) * sizeof(float));
    m->target[i] = (float *)malloc((size_t)(rows * cols) * sizeof(float));
    for (e = 0; e < rows * cols; e++) {
      m->full_w[i][e] = ex_value(11u + (unsigned)i, e) / 8.0f;
      m->target[i][e] = ex_value(101u + (unsigned)i, e) / 8.0f;
    }
    m->rows[i] = ex_chunk(rows, w->size, w->rank, &m->lo[i]);
    m->w[i] = (float *)malloc((size_t)(m->rows[i] * cols + 1) * sizeof(float));
    m->g[i] = (float *)malloc((size_t)(m->rows[i] * cols + 1) * sizeof(float));
    memcpy(m->w[i], m->full_w[i] + m->lo[i] * cols, (size_t)(m->rows[i] * cols) * sizeof(float));
    snprintf(name, sizeof name, "m%d", i);
    a.name = b.name = name;
    a.rows = b.rows = (int)rows;
    a.cols = b.cols = (int)cols;
    a.param = m->full_w[i]; a.grad = m->full_g[i];
    b.param = m->w[i]; b.grad = m->g[i]; b.layout = l;
    if (muon_add_matrix(m->ref, &a, NULL) != MUON_OK) ex_die(w, "muon_add_matrix (one device)", muon_error(m->ref));
    if (muon_add_matrix(m->opt, &b, NULL) != MUON_OK) ex_die(w, "muon_add_matrix", muon_error(m->opt));
  }
}

/* Elements of this rank's parameters and momentum that differ from one device's. */
static long long differ(model *m) {
  long long bad = 0, e;
  int i;
  for (i = 0; i < NM; i++) {
    const float *mine, *full;
    size_t n, nf;
    long long off = m->lo[i] * shapes[i][1];
    if (muon_get_momentum(m->opt, i, &mine, &n) != MUON_OK || muon_get_momentum(m->ref, i, &full, &nf) != MUON_OK) return -1;
    for (e = 0; e < (long long)n; e++) {
      bad += memcmp(&m->w[i][e], &m->full_w[i][off + e], sizeof(float)) != 0;
      bad += memcmp(&mine[e], &full[off + e], sizeof(float)) != 0;
    }
  }
  return bad;
}

static int params_file(model *m, const char *dir, int rank, int write) {
  char p[512];
  FILE *f;
  int i, ok = 1;
  snprintf(p, sizeof p, "%s/params.%d", dir, rank);
  if (!(f = fopen(p, write ? "wb" : "rb"))) return 0;
  for (i = 0; i < NM; i++) {
    size_t n = (size_t)(m->rows[i] * shapes[i][1]);
    ok = ok && (write ? fwrite(m->w[i], sizeof(float), n, f) : fread(m->w[i], sizeof(float), n, f)) == n;
  }
  return fclose(f) == 0 && ok;
}

static void ref_steps(ex_world *w, model *m, int from, int to, int dist_too) {
  int t;
  for (t = from; t < to; t++) {
    grads(m, t);
    if (muon_step(m->ref) != MUON_OK) ex_die(w, "one-device step", muon_error(m->ref));
    if (dist_too && muon_step(m->opt) != MUON_OK) ex_die(w, "muon_step", muon_error(m->opt));
  }
}

/* K steps, the checkpoint, and step K+1 cut by the network. */
static void fault(ex_world *w, model *m, const char *dir) {
  char p[512], title[160];
  float *w0[NM], *mom0[NM];
  muon_status st;
  struct stat cs;
  double t_end, after = -1, bound;
#ifdef EX_MPI
  const char *tmo = getenv("MUON_MPI_TIMEOUT");
#else
  const char *tmo = getenv("MUON_GLOO_TIMEOUT");
#endif
  int i, same = 1, rc;
  FILE *fp;
  bound = (tmo ? atof(tmo) : 300) + 3;
  snprintf(title, sizeof title, "netns: rank %d: the network cut in step %d (rank %d paused at the cut): an error within %.0f s, nothing applied",
           w->rank, K + 1, NC.victim, bound);
  TEST_CASE(title);
  ref_steps(w, m, 0, K, 1);
  CHECK(differ(m) == 0, "differs from one device after %d steps", K);
  snprintf(p, sizeof p, "%s/rank%d.muon", dir, w->rank);
  CHECK(muon_state_save_file(m->opt, p) == MUON_OK, "save: %s", muon_error(m->opt));
  CHECK(params_file(m, dir, w->rank, 1), "writing %s/params.%d", dir, w->rank);
  for (i = 0; i < NM; i++) {
    const float *mm;
    size_t n;
    muon_get_momentum(m->opt, i, &mm, &n);
    w0[i] = (float *)malloc((n + 1) * sizeof(float));
    mom0[i] = (float *)malloc((n + 1) * sizeof(float));
    memcpy(w0[i], m->w[i], n * sizeof(float));
    memcpy(mom0[i], mm, n * sizeof(float));
  }
  grads(m, K);
  pausing = 1;
  st = muon_step(m->opt);
  t_end = now_real();
  snprintf(p, sizeof p, "%s/cut", dir);
  if (stat(p, &cs) == 0) after = t_end - (cs.st_mtim.tv_sec + cs.st_mtim.tv_nsec * 1e-9);
  printf("rank %d: %s %.3f s after the cut: %s\n", w->rank, muon_status_string(st), after, muon_error(m->opt));
  CHECK(st == MUON_ERR_COMM || st == MUON_ERR_TIMEOUT, "step returned %s", muon_status_string(st));
  CHECK(after >= 0 && after <= bound, "returned %.3f s after the cut (no cut file: < 0), bound %.0f s", after, bound);
  for (i = 0; i < NM; i++) {
    const float *mm;
    size_t n;
    muon_get_momentum(m->opt, i, &mm, &n);
    same = same && !memcmp(w0[i], m->w[i], n * sizeof(float)) && !memcmp(mom0[i], mm, n * sizeof(float));
  }
  CHECK(same, "parameters or momentum changed by the failed step");
  rc = test_summary();
  fflush(stdout);
  /* The verdict also goes to DIR/result.<rank>: an MPI rank's stdout travels through its orted,
     which the cut may have left unreachable. Then wait (10 s at most) for every rank's verdict:
     mpirun stops the whole job when the first rank exits without MPI_Finalize. */
  snprintf(p, sizeof p, "%s/result.%d", dir, w->rank);
  if ((fp = fopen(p, "w"))) {
    fprintf(fp, "rank %d: %s %.3f s after the cut: %s\n%d passed, %d failed\n", w->rank, muon_status_string(st),
            after, muon_error(m->opt), rc ? 0 : 1, rc ? 1 : 0);
    fclose(fp);
  }
  for (i = 0; i < w->size; i++) {
    struct timespec tick = { 0, 10000000 };
    char name[32];
    int k;
    snprintf(name, sizeof name, "result.%d", i);
    for (k = 0; k < 1000 && !exists(dir, name); k++) nanosleep(&tick, NULL);
  }
  test_exit(rc);   /* no communicator teardown: the peers are unreachable */
}

static int resume(ex_world *w, model *m, const char *dir) {
  char p[512], title[160];
  muon_stats s;
  snprintf(title, sizeof title, "netns: a new job of %d ranks loads the checkpoint of step %d and runs to step %d bitwise equal to one device",
           w->size, K, N);
  TEST_CASE(title);
  ref_steps(w, m, 0, K, 0);
  snprintf(p, sizeof p, "%s/rank%d.muon", dir, w->rank);
  CHECK(muon_state_load_file(m->opt, p) == MUON_OK, "load: %s", muon_error(m->opt));
  CHECK(params_file(m, dir, w->rank, 0), "reading %s/params.%d", dir, w->rank);
  muon_get_stats(m->opt, &s);
  CHECK(s.steps == K && differ(m) == 0, "after loading: %lld steps, %lld elements differ from one device", s.steps, differ(m));
  ref_steps(w, m, K, N, 1);
  CHECK(differ(m) == 0, "%lld elements differ from one device after %d steps", differ(m), N);
  return test_summary();
}

int main(int argc, char **argv) {
  ex_world w;
  model m;
  muon_comm c;
  muon_dist_config cfg;
  muon_layout l;
  int rc;
  char *argv0[1] = { NULL };
  if (argc < 3 || (strcmp(argv[2], "resume") && (strcmp(argv[2], "fault") || argc < 4))) {
    fprintf(stderr, "usage: test_netns DIR fault VICTIM | test_netns DIR resume\n");
    return 2;
  }
  w = ex_init(0, argv0);
  memset(&m, 0, sizeof m);
  NC.inner = w.world;
  NC.victim = argc > 3 ? atoi(argv[3]) : -1;
  NC.dir = argv[1];
  c.vt = &net_vt; c.ctx = &NC; c.rank = w.rank; c.size = w.size;
  build(&m, &w, &c, &cfg, &l);
  if (!strcmp(argv[2], "fault")) fault(&w, &m, argv[1]);
  rc = resume(&w, &m, argv[1]);
  muon_destroy(m.opt);
  muon_destroy(m.ref);
  muon_comm_destroy(&w.world);
  return rc;
}
