/* test_nccl.c - muon_nccl.h: NCCL communicators with CUDA compute, every rank a process
   (muonrun -n N). On the stand-ins (no GPU) the NCCL and CUDA calls are ours (tests/standin);
   on a GPU machine the same file links the real libraries (world size 1: NCCL refuses two ranks
   on one GPU).

   What it proves: the distributed step over NCCL equals one device bit for bit (created and
   wrapped communicators, one stream or two ordered by events); the host waits for NCCL once per
   step; a rank that never joins gives MUON_ERR_TIMEOUT on the others within the timeout, and
   an NCCL error on one rank an error on every rank, with nothing applied anywhere; subgroups. */
#define MUON_IMPLEMENTATION
#define EX_NCCL
#include "common.h"
#include "test.h"
#include "tmat.h"
#ifdef MUON_CUDA_STANDIN
#include "standin.h"
#endif

#include <nccl.h>
#include <sys/select.h>
#include <sys/time.h>

#define NMAT 3
static int P, me;
static muon_compute *gpu;
/* Overlap on NCCL's own stream: models made with async (prefetch 1, small rounds), and worlds
   made with side_stream for NCCL beside the compute stream. */
static int g_async;
static cudaStream_t side_stream;

static double now_s(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}
static void sleep_s(double s) {
  struct timeval tv;
  tv.tv_sec = (long)s;
  tv.tv_usec = (long)((s - (double)tv.tv_sec) * 1e6);
  (void)select(0, NULL, NULL, NULL, &tv);
}

/* A small model: FSDP rows, FSDP columns, and a replicated matrix (DDP), on the GPU. */
typedef struct model {
  tmat m[NMAT];
  float *dw[NMAT], *dg[NMAT];
  muon_optimizer *opt;
  muon_dist_config cfg;
} model;

static muon_status model_make(model *md, muon_comm *c, const muon_compute *compute) {
  static const char *names[NMAT] = { "fsdp.rows", "fsdp.cols", "ddp" };
  static const int rows[NMAT] = { 48, 32, 24 }, cols[NMAT] = { 32, 64, 24 };
  muon_desc d = muon_default_desc();
  muon_status st;
  int i;
  memset(md, 0, sizeof *md);
  md->cfg = muon_layout_config();
  if (g_async) {
    md->cfg.async = 1;
    md->cfg.prefetch = 1;
    md->cfg.round_bytes = 4096;   /* a round per matrix: several exchanges in flight */
  }
  d.hparams.lr = 0.02f;
  d.comm = c;
  d.dist = &md->cfg;
  d.compute = compute;
  if ((st = muon_create(&md->opt, &d)) != MUON_OK) return st;
  for (i = 0; i < NMAT; i++) {
    muon_layout l;
    muon_matrix mm = muon_default_matrix();
    memset(&l, 0, sizeof l);
    l.n_levels = 1;
    l.levels[0] = i == 2 ? muon_replicate(c) : muon_shard(i, c);
    tmat_init(&md->m[i], names[i], rows[i], cols[i], &l, 1.0f);
    md->dw[i] = ex_device(NULL, md->m[i].n);
    md->dg[i] = ex_device(NULL, md->m[i].n);
    ex_put(NULL, md->dw[i], md->m[i].w, md->m[i].n);
    ex_put(NULL, md->dg[i], md->m[i].g, md->m[i].n);
    mm.name = names[i];
    mm.rows = rows[i];
    mm.cols = cols[i];
    mm.param = md->dw[i];
    mm.grad = md->dg[i];
    mm.layout = &md->m[i].layout;
    if ((st = muon_add_matrix(md->opt, &mm, NULL)) != MUON_OK) return st;
  }
  return MUON_OK;
}

static void model_free(model *md) {
  int i;
  muon_destroy(md->opt);
  for (i = 0; i < NMAT; i++) {
    ex_device_free(md->dw[i]);
    ex_device_free(md->dg[i]);
    tmat_free(&md->m[i]);
  }
}

/* Elements of this rank's pieces that differ from `full` (the single-device result), or from
   the values before the step when full is NULL. */
static long long model_diff(model *md, float *const *full) {
  long long bad = 0;
  int i;
  size_t e;
  for (i = 0; i < NMAT; i++) {
    float *got = (float *)malloc((md->m[i].n + 1) * sizeof(float));
    ex_get(NULL, got, md->dw[i], md->m[i].n);
    for (e = 0; e < md->m[i].n; e++) {
      float want = full ? full[i][md->m[i].idx[e]] : md->m[i].w[e];
      if (memcmp(&got[e], &want, sizeof want) != 0) bad++;
    }
    free(got);
  }
  return bad;
}

/* The same model on one device: full matrices, the same gradients. */
static void reference(int steps, float **full) {
  muon_desc d = muon_default_desc();
  muon_optimizer *ref;
  float *dw[NMAT], *dg[NMAT];
  model shape;
  int i;
  muon_comm self = muon_comm_self();
  d.hparams.lr = 0.02f;
  d.compute = gpu;
  if (muon_create(&ref, &d) != MUON_OK) ex_die(NULL, "muon_create", "reference");
  if (model_make(&shape, &self, gpu) != MUON_OK) ex_die(NULL, "model_make", "shape");
  for (i = 0; i < NMAT; i++) {
    muon_matrix mm = muon_default_matrix();
    size_t n = (size_t)shape.m[i].rows * shape.m[i].cols;
    full[i] = (float *)malloc(n * sizeof(float));
    memcpy(full[i], shape.m[i].w, n * sizeof(float));     /* world of one: the piece is whole */
    dw[i] = ex_device(NULL, n);
    dg[i] = ex_device(NULL, n);
    ex_put(NULL, dw[i], shape.m[i].w, n);
    ex_put(NULL, dg[i], shape.m[i].g, n);
    mm.name = shape.m[i].name; mm.rows = shape.m[i].rows; mm.cols = shape.m[i].cols;
    mm.param = dw[i]; mm.grad = dg[i];
    if (muon_add_matrix(ref, &mm, NULL) != MUON_OK) ex_die(NULL, "muon_add_matrix", muon_error(ref));
  }
  for (i = 0; i < steps; i++)
    if (muon_step(ref) != MUON_OK) ex_die(NULL, "muon_step", muon_error(ref));
  for (i = 0; i < NMAT; i++) {
    ex_get(NULL, full[i], dw[i], (size_t)shape.m[i].rows * shape.m[i].cols);
    ex_device_free(dw[i]);
    ex_device_free(dg[i]);
  }
  muon_destroy(ref);
  model_free(&shape);
}

static muon_comm make_world(double timeout_s) {
  muon_nccl_desc nd = muon_nccl_default_desc();
  muon_comm c;
  nd.stream = muon_cuda_stream(gpu);
  if (side_stream) {
    nd.compute_stream = nd.stream;
    nd.stream = side_stream;
  }
  nd.timeout_s = timeout_s;
  if (muon_nccl_create(&c, &nd) != MUON_OK) ex_die(NULL, "muon_nccl_create", muon_error(NULL));
  return c;
}

static void test_step(float **full) {
  muon_comm world = make_world(30);
  model md;
  muon_stats s0, s1;
  int t;
  TEST_CASE("muon_nccl_create: rank and size from the launcher's environment");
  CHECK(world.rank == me && world.size == P, "comm is rank %d of %d, expected %d of %d", world.rank, world.size, me, P);
  CHECK(muon_nccl_handle(&world) != NULL, "no NCCL handle");

  TEST_CASE("3 steps over NCCL (one stream) equal one device bit for bit");
  CHECK(model_make(&md, &world, gpu) == MUON_OK, "model: %s", muon_error(md.opt));
  for (t = 0; t < 3; t++) {
    muon_status st = muon_step(md.opt);
    CHECK(st == MUON_OK, "step %d: %s", t, muon_error(md.opt));
    if (t == 0) muon_get_stats(md.opt, &s0);
  }
  CHECK(model_diff(&md, full) == 0, "%lld elements differ from one device", model_diff(&md, full));

  TEST_CASE("the host waits for NCCL once per step and no more often than on one device");
  muon_get_stats(md.opt, &s1);
  CHECK(P > 1 ? s1.comm_waits - s0.comm_waits == 2 : s1.comm_waits - s0.comm_waits <= 2,
        "waits for NCCL in 2 steps: %lld", s1.comm_waits - s0.comm_waits);
  CHECK(s1.syncs - s0.syncs == 4, "host syncs in 2 steps: %lld (expected 2 per step: verdicts, before the update)", s1.syncs - s0.syncs);
  model_free(&md);
  muon_comm_destroy(&world);
}

/* The trainer's own blocking communicator on its own stream, compute on another (llm.c). */
static void test_wrap(float **full) {
  char path[1024];
  const char *dir = getenv("MUON_STORE");
  ncclUniqueId id;
  ncclComm_t mine = NULL;
  cudaStream_t nccl_stream = NULL, main_stream = NULL;
  muon_cuda_desc cd = muon_cuda_default_desc();
  muon_compute gpu2;
  muon_nccl_desc nd = muon_nccl_default_desc();
  muon_comm world;
  model md;
  int t, n = 0;
  TEST_CASE("wrap: the trainer's blocking ncclComm_t on its NCCL stream, compute on its main stream");
  snprintf(path, sizeof path, "%s/test_wrap.id", dir ? dir : ".");
  if (me == 0) {
    FILE *f;
    char tmp[1100];
    CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    f = fopen(tmp, "wb");
    if (f) { fwrite(&id, sizeof id, 1, f); fclose(f); rename(tmp, path); }
  } else {
    double t0 = now_s();
    FILE *f = NULL;
    while (!(f = fopen(path, "rb")) && now_s() - t0 < 30) sleep_s(0.001);
    if (f) { n = (int)fread(&id, sizeof id, 1, f); fclose(f); }
    CHECK(n == 1, "no id from rank 0");
  }
  CHECK(ncclCommInitRank(&mine, P, id, me) == ncclSuccess, "ncclCommInitRank");
  CHECK(cudaStreamCreate(&nccl_stream) == cudaSuccess && cudaStreamCreate(&main_stream) == cudaSuccess, "streams");
  cd.stream = main_stream;
  CHECK(muon_cuda_create(&gpu2, &cd) == MUON_OK, "muon_cuda_create: %s", muon_error(NULL));
  nd.stream = nccl_stream;
  nd.compute_stream = main_stream;
  CHECK(muon_nccl_wrap(&world, mine, &nd) == MUON_OK, "wrap: %s", muon_error(NULL));
  CHECK(model_make(&md, &world, &gpu2) == MUON_OK, "model: %s", muon_error(md.opt));
  for (t = 0; t < 3; t++) CHECK(muon_step(md.opt) == MUON_OK, "step %d: %s", t, muon_error(md.opt));
  CHECK(model_diff(&md, full) == 0, "%lld elements differ from one device", model_diff(&md, full));
  model_free(&md);
  TEST_CASE("wrap + async: the exchanges run on the NCCL stream beside compute (joined late), bitwise one device");
  g_async = 1;
  CHECK(model_make(&md, &world, &gpu2) == MUON_OK, "model: %s", muon_error(md.opt));
  g_async = 0;
  for (t = 0; t < 3; t++) CHECK(muon_step(md.opt) == MUON_OK, "step %d: %s", t, muon_error(md.opt));
  CHECK(model_diff(&md, full) == 0, "%lld elements differ from one device", model_diff(&md, full));
  model_free(&md);
  muon_comm_destroy(&world);
  TEST_CASE("wrap: muon_comm_destroy leaves the trainer's communicator alive");
  CHECK(ncclCommCount(mine, &n) == ncclSuccess && n == P, "ncclCommCount after destroy: %d", n);
  CHECK(ncclCommDestroy(mine) == ncclSuccess, "the trainer's ncclCommDestroy");
  muon_compute_destroy(&gpu2);
  cudaStreamDestroy(nccl_stream);
  cudaStreamDestroy(main_stream);
}

static void test_args(void) {
  muon_comm world = make_world(30), none;
  muon_desc d = muon_default_desc();
  muon_optimizer *opt = NULL;
  muon_dist_config cfg = muon_layout_config();
  TEST_CASE("an NCCL communicator with the CPU backend is refused at creation");
  d.comm = &world;
  d.dist = &cfg;
  CHECK(muon_create(&opt, &d) == MUON_ERR_ARG && opt == NULL, "accepted");
  CHECK(strstr(muon_error(NULL), "device memory") != NULL, "message: %s", muon_error(NULL));

  TEST_CASE("muon_nccl_split: NCCL_SPLIT_NOCOLOR gives no communicator; bad arguments");
  CHECK(muon_nccl_split(&none, &world, me == 0 ? -1 : 1, me) == MUON_OK, "split: %s", muon_error(NULL));
  CHECK(me == 0 ? none.vt == NULL : none.vt != NULL && none.size == P - 1 && none.rank == me - 1,
        "rank %d: group of %d, rank %d", me, none.size, none.rank);
  muon_comm_destroy(&none);
  CHECK(muon_nccl_split(&none, &world, -5, 0) == MUON_ERR_ARG, "negative color accepted");
  CHECK(muon_nccl_wrap(&none, NULL, NULL) == MUON_ERR_ARG && strstr(muon_error(NULL), "nccl_comm"), "NULL comm: %s", muon_error(NULL));

  TEST_CASE("muon_error(NULL) says why a create, wrap, split or mesh failed (status and function first); *out is cleared");
  {
    static const char want_create[] = "MUON_ERR_ARG: muon_nccl_create: ";
    static const char want_split[] = "MUON_ERR_ARG: muon_nccl_split: ";
    static const char want_mesh[] = "MUON_ERR_ARG: muon_nccl_mesh_subgroup: ";
    muon_nccl_desc nd = muon_nccl_default_desc();
    muon_comm self = muon_comm_self();
    int one[1] = {1};
    nd.rank = 3;
    nd.size = 2;
    none = world;                /* a live comm's fields: a failed create must clear them */
    CHECK(muon_nccl_create(&none, &nd) == MUON_ERR_ARG && strncmp(muon_error(NULL), want_create, sizeof want_create - 1) == 0 &&
          strstr(muon_error(NULL), "rank 3 is not in [0, size 2)"), "rank 3 of 2: %s", muon_error(NULL));
    CHECK(none.vt == NULL && none.ctx == NULL && none.size == 0, "out not cleared on failure");
    CHECK(muon_nccl_split(&none, &world, -5, 0) == MUON_ERR_ARG && strncmp(muon_error(NULL), want_split, sizeof want_split - 1) == 0 &&
          strstr(muon_error(NULL), "color -5"), "negative color: %s", muon_error(NULL));
    CHECK(muon_nccl_mesh_subgroup(&none, &self, one, 1, 0) == MUON_ERR_ARG &&
          strncmp(muon_error(NULL), want_mesh, sizeof want_mesh - 1) == 0 && strstr(muon_error(NULL), "not a muon_nccl communicator"),
          "mesh over a non-NCCL parent: %s", muon_error(NULL));
    CHECK(muon_nccl_create(NULL, &nd) == MUON_ERR_ARG && strstr(muon_error(NULL), "out is NULL"), "NULL out: %s", muon_error(NULL));
  }
  muon_comm_destroy(&world);
}

/* Mesh groups: dims {2, P/2}; each group's allgather returns its members' world ranks. */
static void test_mesh(void) {
  muon_comm world, g[2];
  int dims[2], d, r, got[64];
  if (P % 2) return;
  world = make_world(30);
  dims[0] = 2;
  dims[1] = P / 2;
  TEST_CASE("muon_nccl_mesh_subgroup: both dimensions of a 2 x P/2 mesh");
  for (d = 0; d < 2; d++) {
    CHECK(muon_nccl_mesh_subgroup(&g[d], &world, dims, 2, d) == MUON_OK, "dim %d: %s", d, muon_error(NULL));
    CHECK(g[d].size == dims[d], "dim %d: size %d", d, g[d].size);
    CHECK(g[d].vt->allgather(g[d].ctx, &me, got, sizeof me) == MUON_OK, "allgather on dim %d", d);
    for (r = 0; r < g[d].size; r++) {
      int want = d == 1 ? (me / dims[1]) * dims[1] + r : r * dims[1] + me % dims[1];
      CHECK(got[r] == want, "dim %d member %d is world rank %d, expected %d", d, r, got[r], want);
    }
  }
  muon_comm_destroy(&g[0]);
  muon_comm_destroy(&g[1]);
  muon_comm_destroy(&world);
}

/* A failing step: `victim` either skips it (never joins) or has an NCCL error injected. */
static void test_failure(int inject) {
  const double timeout = 1.5;
  muon_comm world = make_world(timeout);
  model md;
  int victim = P - 1;
  double t0, took;
  muon_status st = MUON_OK;
  TEST_CASE(inject && g_async ? "an NCCL error injected on one rank, exchanges overlapped on NCCL's stream: an error on every rank, nothing applied"
            : inject ? "an NCCL error injected on one rank: an error on every rank, nothing applied"
                     : "a rank that never joins the step: MUON_ERR_TIMEOUT on the others within the timeout, nothing applied");
  CHECK(model_make(&md, &world, gpu) == MUON_OK, "model: %s", muon_error(md.opt));
  CHECK(muon_step(md.opt) == MUON_OK, "first step: %s", muon_error(md.opt));
  {   /* what the pieces hold now: the failing step must leave exactly this */
    int i;
    for (i = 0; i < NMAT; i++) ex_get(NULL, md.m[i].w, md.dw[i], md.m[i].n);
  }
#ifdef MUON_CUDA_STANDIN
  if (inject && me == victim) muon_standin_nccl_fail("async", 2);   /* the agreement, then the exchange */
#endif
  t0 = now_s();
  if (inject || me != victim) st = muon_step(md.opt);
  took = now_s() - t0;
  if (!inject && me == victim) {
    sleep_s(timeout + 1.0);      /* the others give up meanwhile */
  } else if (me == victim) {
    CHECK(st == MUON_ERR_COMM, "injected rank: %s (%s)", muon_status_string(st), muon_error(md.opt));
    CHECK(strstr(muon_error(md.opt), "NCCL") != NULL, "no NCCL text: %s", muon_error(md.opt));
  } else {
    CHECK(st == MUON_ERR_TIMEOUT || st == MUON_ERR_COMM, "rank %d: %s (%s)", me, muon_status_string(st), muon_error(md.opt));
    CHECK(took < timeout + 2.0, "gave up after %.2f s (timeout %.1f s)", took, timeout);
    CHECK(strstr(muon_error(md.opt), "timed out") != NULL, "message: %s", muon_error(md.opt));
  }
  CHECK(model_diff(&md, NULL) == 0, "the failed step changed %lld elements", model_diff(&md, NULL));
  if (inject || me != victim) {
    t0 = now_s();
    CHECK(muon_step(md.opt) == st, "the broken communicator gave another status");
    CHECK(now_s() - t0 < 0.5, "the broken communicator took %.2f s to fail again", now_s() - t0);
  }
  model_free(&md);
  muon_comm_destroy(&world);
}

int main(int argc, char **argv) {
  ex_world w;
  float *full[NMAT];
  int i;
  (void)argc;
  (void)argv;
  gpu = (muon_compute *)ex_compute(NULL);
  {
    const char *r = getenv("MUON_RANK"), *s = getenv("MUON_WORLD_SIZE");
    me = r ? atoi(r) : 0;
    P = s ? atoi(s) : 1;
  }
  memset(&w, 0, sizeof w);
  reference(3, full);
  test_step(full);
  test_wrap(full);
  test_args();
  test_mesh();
  if (P > 1) {
    test_failure(0);
#ifdef MUON_CUDA_STANDIN
    test_failure(1);
    /* the same with the exchanges on NCCL's own stream, overlapped. The injected rank left the
       last test about a timeout before the others: a world made with a long timeout (its
       creation waits for every rank) lines them up again for the next one's short timeout. */
    {
      muon_comm line_up = make_world(60);
      muon_comm_destroy(&line_up);
    }
    CHECK(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking) == cudaSuccess, "side stream");
    g_async = 1;
    test_failure(1);
    g_async = 0;
    cudaStreamDestroy(side_stream);
    side_stream = NULL;
#endif
  }
  for (i = 0; i < NMAT; i++) free(full[i]);
  ex_compute_done();
  return test_summary();
}
