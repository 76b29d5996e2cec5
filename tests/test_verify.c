/* test_verify.c - the tools for verifying a setup, on 1-4 Gloo ranks (muonrun -n P):
   muon_plan_text against what a step measures, muon_check_layouts against the pieces a
   "framework" cuts (this file, by examples/common.h's own logic) - right, with a shifted flat
   range, and with the other TP dim -, muon_gather_matrix against a single device, muon_dump_file
   compared by tools/muoncmp, and the collective argument checks.

   usage: muonrun -n P build/test_verify build/muoncmp DIR */
#define MUON_IMPLEMENTATION
#include "common.h"
#include "test.h"

#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>

#define NM 3
static const char *names[NM] = { "a", "b", "c" };
static const int rows[NM] = { 10, 16, 6 }, cols[NM] = { 12, 8, 20 };

typedef struct setup {
  ex_world *w;
  muon_optimizer *opt, *ref;
  muon_layout lay[NM];
  long long *idx[NM];           /* the framework's positions of this rank's elements */
  size_t n[NM];
  float *w_full[NM], *g_full[NM], *w_mine[NM], *g_mine[NM];
} setup;

/* Declared layouts: a FLAT over the world, b SHARD(1), c replicated. */
static void layouts(const ex_world *w, muon_layout *lay) {
  memset(lay, 0, NM * sizeof *lay);
  lay[0].n_levels = 1; lay[0].levels[0] = muon_flat(&w->world);
  lay[1].n_levels = 1; lay[1].levels[0] = muon_shard(1, &w->world);
  lay[2].n_levels = 1; lay[2].levels[0] = muon_replicate(&w->world);
}

static long long fw_index(void *user, int matrix, size_t k) { return ((setup *)user)->idx[matrix][k]; }

static int info_lines;
static int fail_big;   /* the allocator refuses blocks of 256 bytes or more while set */
static void *test_alloc(size_t n, void *user) { (void)user; return fail_big && n >= 256 ? NULL : malloc(n); }
static void test_free(void *p, void *user) { (void)user; free(p); }
static void count_plan_logs(muon_log_level level, const char *msg, void *user) {
  (void)user;
  if (level == MUON_LOG_INFO && strstr(msg, "muon plan, as rank")) info_lines++;
}

static void open_setup(setup *s, ex_world *w) {
  muon_desc d = muon_default_desc();
  muon_dist_config cfg = muon_layout_config();
  int i;
  size_t e;
  memset(s, 0, sizeof *s);
  s->w = w;
  layouts(w, s->lay);
  d.hparams.lr = 0.02f;
  d.logger.func = count_plan_logs;
  d.allocator.alloc = test_alloc;
  d.allocator.free = test_free;
  if (muon_create(&s->ref, &d) != MUON_OK) exit(1);
  d.comm = &w->world;
  d.dist = &cfg;
  if (muon_create(&s->opt, &d) != MUON_OK) exit(1);
  for (i = 0; i < NM; i++) {
    size_t full = (size_t)rows[i] * cols[i];
    muon_matrix m = muon_default_matrix();
    s->idx[i] = (long long *)malloc(full * sizeof(long long));
    s->n[i] = ex_piece(&s->lay[i], rows[i], cols[i], s->idx[i]);
    s->w_full[i] = (float *)malloc(full * sizeof(float));
    s->g_full[i] = (float *)malloc(full * sizeof(float));
    s->w_mine[i] = (float *)malloc((s->n[i] + 1) * sizeof(float));
    s->g_mine[i] = (float *)malloc((s->n[i] + 1) * sizeof(float));
    for (e = 0; e < full; e++) s->w_full[i][e] = ex_value(ex_hash(names[i], 5u), (long long)e);
    for (e = 0; e < s->n[i]; e++) s->w_mine[i][e] = s->w_full[i][s->idx[i][e]];
    m.name = names[i]; m.rows = rows[i]; m.cols = cols[i];
    m.param = s->w_full[i]; m.grad = s->g_full[i];
    if (muon_add_matrix(s->ref, &m, NULL) != MUON_OK) exit(1);
    m.param = s->w_mine[i]; m.grad = s->g_mine[i]; m.layout = &s->lay[i];
    if (muon_add_matrix(s->opt, &m, NULL) != MUON_OK) { printf("add: %s\n", muon_error(s->opt)); exit(1); }
  }
}

static void close_setup(setup *s) {
  int i;
  for (i = 0; i < NM; i++) { free(s->idx[i]); free(s->w_full[i]); free(s->g_full[i]); free(s->w_mine[i]); free(s->g_mine[i]); }
  muon_destroy(s->opt);
  muon_destroy(s->ref);
}

static void step(setup *s, int t) {
  int i;
  size_t e;
  for (i = 0; i < NM; i++) {
    unsigned seed = ex_hash(names[i], 31u * (unsigned)(t + 1));
    for (e = 0; e < (size_t)rows[i] * cols[i]; e++) s->g_full[i][e] = s->w_full[i][e] + ex_value(seed, (long long)e);
    for (e = 0; e < s->n[i]; e++) s->g_mine[i][e] = s->w_mine[i][e] + ex_value(seed, s->idx[i][e]);
  }
  if (muon_step(s->opt) != MUON_OK) { printf("step: %s\n", muon_error(s->opt)); exit(1); }
  if (muon_step(s->ref) != MUON_OK) exit(1);
}

/* Every rank's status, gathered: all equal to `want`? */
static int all_are(const ex_world *w, muon_status st, muon_status want) {
  int mine = st, all[64], p, ok = 1;
  if (w->world.vt->allgather(w->world.ctx, &mine, all, sizeof mine) != MUON_OK) return 0;
  for (p = 0; p < w->size; p++) ok &= all[p] == (int)want;
  return ok;
}

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  const char *cmp = argc > 1 ? argv[1] : "build/muoncmp", *dir = argc > 2 ? argv[2] : "build/verify";
  setup s;
  muon_status st;
  int g;
  if (w.size > 64) return 2;
  open_setup(&s, &w);

  TEST_CASE("muon_check_layouts: the framework's positions agree with the declared layouts");
  st = muon_check_layouts(s.opt, fw_index, &s);
  CHECK(all_are(&w, st, MUON_OK), "rank %d: %s", w.rank, muon_error(s.opt));
  CHECK(info_lines >= 1, "no plan text reached the logger at MUON_LOG_INFO after planning");

  TEST_CASE("muon_check_layouts: a flat range shifted by one element is MUON_ERR_SHAPE on every rank, naming the matrix");
  {
    size_t e;
    for (e = 0; e < s.n[0]; e++) s.idx[0][e] += 1;   /* the framework starts every range one later */
    st = muon_check_layouts(s.opt, fw_index, &s);
    CHECK(all_are(&w, st, MUON_ERR_SHAPE), "rank %d: %s", w.rank, muon_status_string(st));
    CHECK(strstr(muon_error(s.opt), "matrix 'a'") != NULL, "message: %s", muon_error(s.opt));
    for (e = 0; e < s.n[0]; e++) s.idx[0][e] -= 1;
  }
  if (w.size > 1) {
    TEST_CASE("muon_check_layouts: the other TP dim (framework splits rows, layout says columns) is MUON_ERR_SHAPE, naming both positions");
    {
      muon_layout rowwise;
      long long *keep = s.idx[1], *other = (long long *)malloc((size_t)rows[1] * cols[1] * sizeof(long long));
      memset(&rowwise, 0, sizeof rowwise);
      rowwise.n_levels = 1;
      rowwise.levels[0] = muon_shard(0, &w.world);
      CHECK(ex_piece(&rowwise, rows[1], cols[1], other) == s.n[1], "the two splits should hold the same number of elements");
      s.idx[1] = other;
      st = muon_check_layouts(s.opt, fw_index, &s);
      CHECK(all_are(&w, st, MUON_ERR_SHAPE), "rank %d: %s", w.rank, muon_status_string(st));
      CHECK(strstr(muon_error(s.opt), "matrix 'b'") && strstr(muon_error(s.opt), "shard dim 1") && strstr(muon_error(s.opt), "the framework has it at"),
            "message: %s", muon_error(s.opt));
        s.idx[1] = keep;
      free(other);
    }
  }

  TEST_CASE("muon_plan_text: owners as muon_global_info says, and one step moves the bytes and collectives it announces");
  {
    muon_stats a, b;
    size_t len = muon_plan_text(s.opt, NULL, 0);
    char *text = (char *)malloc(len + 1), line[64], *at;
    long long out = -1, in = -1;
    int coll = -1;
    CHECK(muon_plan_text(s.opt, text, len + 1) == len && strlen(text) == len, "length");
    for (g = 0; g < muon_global_count(s.opt); g++) {
      muon_matrix_info info;
      int owner;
      char want[128];
      muon_global_info(s.opt, g, &info, &owner);
      snprintf(want, sizeof want, "matrix %d '%s' %d x %d, layout key 0: owner rank %d", g, info.name, info.rows, info.cols, owner);
      CHECK(strstr(text, want) != NULL, "'%s' not in the plan text", want);
    }
    snprintf(line, sizeof line, "\nrank %d: owns ", w.rank);
    at = strstr(text, line);
    CHECK(at && (at = strstr(at, "per step ")) && sscanf(at, "per step %lld B out, %lld B in", &out, &in) == 2, "no per-rank line for rank %d", w.rank);
    {   /* zero redundancy: an owner receives exactly its matrices less its own pieces */
      long long as_owner = -1, least = -2;
      char *u = at ? strstr(at, "to owners, ") : NULL;
      CHECK(u && sscanf(u, "to owners, %lld B as owner, the least possible being %lld B", &as_owner, &least) == 2 && as_owner == least,
            "rank %d receives %lld B of U as owner, the least possible is %lld B", w.rank, as_owner, least);
    }
    at = strstr(text, "collectives per step without skips: ");
    CHECK(at && sscanf(at, "collectives per step without skips: %d", &coll) == 1, "no collectives line");
    muon_get_stats(s.opt, &a);
    step(&s, 0);
    muon_get_stats(s.opt, &b);
    CHECK(b.bytes_sent - a.bytes_sent == out && b.bytes_received - a.bytes_received == in,
          "rank %d: announced %lld B out, %lld B in; the step moved %lld and %lld", w.rank, out, in, b.bytes_sent - a.bytes_sent, b.bytes_received - a.bytes_received);
    CHECK(b.collectives - a.collectives == coll, "announced %d collectives per step, the step made %lld", coll, b.collectives - a.collectives);
    free(text);
    muon_plan_text(s.opt, line, sizeof line);
    CHECK(strlen(line) == sizeof line - 1, "a short buffer gets a truncated, terminated text");
  }

  TEST_CASE("muon_gather_matrix: every matrix, assembled on the last rank, is the single device's parameter and momentum, bitwise");
  step(&s, 1);
  for (g = 0; g < muon_global_count(s.opt); g++) {
    int root = w.size - 1, i;
    muon_matrix_info info;
    muon_global_info(s.opt, g, &info, NULL);
    for (i = 0; i < NM && strcmp(names[i], info.name); i++) {}
    {
      size_t full = (size_t)rows[i] * cols[i], e, n;
      float *p = (float *)calloc(full, sizeof(float)), *m = (float *)calloc(full, sizeof(float));
      const float *rm = NULL;
      long long bad = 0;
      st = muon_gather_matrix(s.opt, g, root, w.rank == root ? p : NULL, w.rank == root ? m : NULL);
      CHECK(st == MUON_OK, "gather %d: %s", g, muon_error(s.opt));
      if (muon_get_momentum(s.ref, i, &rm, &n) != MUON_OK || n != full) { CHECK(0, "reference momentum"); break; }
      for (e = 0; w.rank == root && e < full; e++) bad += memcmp(&p[e], &s.w_full[i][e], 4) != 0 || memcmp(&m[e], &rm[e], 4) != 0;
      CHECK(bad == 0, "matrix '%s': %lld elements differ", names[i], bad);
      free(p);
      free(m);
    }
  }

  TEST_CASE("collective arguments: different matrices on different ranks are MUON_ERR_MISMATCH, a root outside the world MUON_ERR_ARG, on every rank");
  if (w.size > 1) {
    st = muon_gather_matrix(s.opt, w.rank == 0 ? 0 : 1, 0, NULL, NULL);
    CHECK(all_are(&w, st, MUON_ERR_MISMATCH), "rank %d: %s", w.rank, muon_error(s.opt));
  }
  st = muon_gather_matrix(s.opt, 0, w.size, NULL, NULL);
  CHECK(all_are(&w, st, MUON_ERR_ARG), "rank %d: %s", w.rank, muon_error(s.opt));
  st = muon_check_layouts(s.opt, NULL, NULL);
  CHECK(all_are(&w, st, MUON_ERR_ARG), "rank %d: %s", w.rank, muon_error(s.opt));

  TEST_CASE("out of memory on the last rank: muon_gather_matrix fails with MUON_ERR_NOMEM on every rank, no hang; then works again");
  {
    float *p = (float *)calloc((size_t)rows[0] * cols[0], sizeof(float));
    fail_big = w.rank == w.size - 1;
    st = muon_gather_matrix(s.opt, 0, 0, w.rank == 0 ? p : NULL, NULL);
    fail_big = 0;
    CHECK(all_are(&w, st, MUON_ERR_NOMEM), "gather, rank %d: %s", w.rank, muon_error(s.opt));
    CHECK(strstr(muon_error(s.opt), "could not allocate") != NULL, "message: %s", muon_error(s.opt));
    st = muon_gather_matrix(s.opt, 0, 0, w.rank == 0 ? p : NULL, NULL);
    CHECK(all_are(&w, st, MUON_OK), "gather again, rank %d: %s", w.rank, muon_error(s.opt));
    free(p);
  }
  if (w.size > 1) {
    muon_stats a, b;
    TEST_CASE("a verification tool on rank 0 while the others step: MUON_ERR_MISMATCH on every rank, nothing applied");
    muon_get_stats(s.opt, &a);
    st = w.rank == 0 ? muon_gather_matrix(s.opt, 0, 0, NULL, NULL) : muon_step(s.opt);
    CHECK(all_are(&w, st, MUON_ERR_MISMATCH), "rank %d: %s", w.rank, muon_error(s.opt));
    muon_get_stats(s.opt, &b);
    CHECK(b.steps == a.steps, "a step was counted");
  }

  TEST_CASE("muon_dump_file: the distributed dump equals the single device's (muoncmp exits 0); an unwritable path fails on every rank with the OS reason");
  {
    char path[512], ref_path[512], cmd[1200];
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) CHECK(0, "mkdir %s: %s", dir, strerror(errno));
    snprintf(path, sizeof path, "%s/dist.n%d.dump", dir, w.size);
    snprintf(ref_path, sizeof ref_path, "%s/ref.n%d.dump", dir, w.size);
    st = muon_dump_file(s.opt, path, 0, 1);
    CHECK(all_are(&w, st, MUON_OK), "rank %d: %s", w.rank, muon_error(s.opt));
    if (w.rank == 0) {
      int rc;
      CHECK(muon_dump_file(s.ref, ref_path, 0, 1) == MUON_OK, "reference dump: %s", muon_error(s.ref));
      snprintf(cmd, sizeof cmd, "%s %s %s --quiet > %s/cmp.out 2>&1", cmp, path, ref_path, dir);
      rc = system(cmd);
      CHECK(rc == 0, "'%s' exited %d", cmd, rc);
      s.w_full[0][7] += 1.0f;   /* one element of the reference changed: muoncmp finds it */
      CHECK(muon_dump_file(s.ref, ref_path, 0, 0) == MUON_OK, "reference dump: %s", muon_error(s.ref));
      snprintf(cmd, sizeof cmd, "%s %s %s > %s/cmp.out 2>&1; test $? -eq 1 && grep -q 'first at row 0, col 7' %s/cmp.out", cmp, path, ref_path, dir, dir);
      rc = system(cmd);
      CHECK(rc == 0, "'%s' did not report row 0, col 7 (%d)", cmd, rc);
      s.w_full[0][7] -= 1.0f;
    }
    st = muon_dump_file(s.opt, "no/such/dir/x.dump", 0, 0);
    CHECK(all_are(&w, st, MUON_ERR_STATE), "rank %d: %s", w.rank, muon_error(s.opt));
    CHECK(w.rank != 0 || strstr(muon_error(s.opt), strerror(ENOENT)), "message: %s", muon_error(s.opt));
  }

  TEST_CASE("muon_gather_matrix on one device: a bf16 parameter comes out widened to fp32, exactly");
  {
    muon_desc d = muon_default_desc();
    muon_optimizer *o;
    muon_matrix m = muon_default_matrix();
    uint16_t p16[4 * 6];
    float g[4 * 6], out[4 * 6], mom[4 * 6];
    int e, bad = 0;
    for (e = 0; e < 24; e++) { float v = ex_value(9u, e); uint32_t u; memcpy(&u, &v, 4); p16[e] = (uint16_t)(u >> 16); g[e] = 0; }
    muon_create(&o, &d);
    m.name = "bf"; m.param = p16; m.grad = g; m.rows = 4; m.cols = 6; m.param_dtype = MUON_DTYPE_BF16;
    CHECK(muon_add_matrix(o, &m, NULL) == MUON_OK, "add: %s", muon_error(o));
    CHECK(muon_gather_matrix(o, 0, 0, out, mom) == MUON_OK, "gather: %s", muon_error(o));
    for (e = 0; e < 24; e++) { uint32_t u; memcpy(&u, &out[e], 4); bad += u != (uint32_t)p16[e] << 16 || mom[e] != 0.0f; }
    CHECK(bad == 0, "%d elements wrong", bad);
    CHECK(muon_gather_matrix(o, 1, 0, out, mom) == MUON_ERR_ARG, "global 1 of 1");
    muon_destroy(o);
  }

  close_setup(&s);
  muon_comm_destroy(&w.world);
  return test_summary();
}
