/* test_dist.c - distributed muon over Gloo, multi-process. Run under muonrun:

     muonrun -n N build/test_dist           layouts round trip, stats, owners, memory, validation
     build/test_dist --fault kill|stall N [overlap]   forks N ranks itself (muonrun would stop the
                                            survivors); one dies / stalls mid-step

   The bitwise comparison of every strategy against one device is done by the examples, which
   tests/run.sh runs at several world sizes. */
#define MUON_IMPLEMENTATION
#include "../examples/common.h"
#include "test.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static ex_world W;

/* ---- helpers ------------------------------------------------------------------------------ */
static muon_optimizer *make(const muon_dist_config *cfg, muon_hparams *hp) {
  muon_desc d = muon_default_desc();
  muon_optimizer *opt = NULL;
  if (hp) d.hparams = *hp;
  d.comm = &W.world;
  d.dist = cfg;
  if (muon_create(&opt, &d) != MUON_OK) return NULL;
  return opt;
}

/* Sum of a long long over all ranks. */
static long long sum_all(long long v) {
  long long all[64], s = 0;
  int r;
  W.world.vt->allgather(W.world.ctx, &v, all, sizeof v);
  for (r = 0; r < W.size; r++) s += all[r];
  return s;
}
static long long min_all(long long v) {
  long long all[64], s = v;
  int r;
  W.world.vt->allgather(W.world.ctx, &v, all, sizeof v);
  for (r = 0; r < W.size; r++) if (all[r] < s) s = all[r];
  return s;
}

#include "tmat.h"

static muon_status tmat_add(muon_optimizer *opt, tmat *t) {
  muon_matrix m = muon_default_matrix();
  m.name = t->name; m.param = t->w; m.grad = t->g; m.rows = t->rows; m.cols = t->cols; m.layout = &t->layout;
  return muon_add_matrix(opt, &m, NULL);
}

/* ---- gather then redistribute returns every piece unchanged, for every layout ---------------
   With momentum 0, lr 1, no decay, no lr adjustment, one NS iteration with (a, b, c) = (1, 0, 0)
   and eps 1 > |U|, Newton-Schulz is exactly the identity and W_new = W - G: any element that the
   exchange put in the wrong place shows up bit for bit. */
static muon_hparams identity_hparams(void) {
  muon_hparams hp = muon_default_hparams();
  hp.momentum = 0; hp.nesterov = 0; hp.lr = 1; hp.weight_decay = 0; hp.adjust_lr = MUON_ADJUST_LR_NONE;
  hp.ns_steps = 1; hp.ns_coefficients[0][0] = 1; hp.ns_coefficients[0][1] = 0; hp.ns_coefficients[0][2] = 0; hp.eps = 1;
  return hp;
}
static void test_roundtrip(void) {
  muon_hparams hp = identity_hparams();
  muon_dist_config cfg = muon_layout_config();
  int dims2[2], d, P = W.size, li, ok = 1;
  muon_comm a, b;
  muon_layout L[8];
  const char *what[8] = { "replicate", "shard0", "shard1", "flat", "shard0+shard1", "shard1+flat", "replicate+shard0", "flat ranges" };
  tmat t[8];
  muon_optimizer *opt;
  for (d = 2; d * d <= P && P % d; d++) {}
  dims2[0] = P % d == 0 ? d : 1;
  dims2[1] = P / dims2[0];
  a = ex_mesh(&W, dims2, 2, 0);
  b = ex_mesh(&W, dims2, 2, 1);
  memset(L, 0, sizeof L);
  L[0].n_levels = 1; L[0].levels[0] = muon_replicate(&W.world);
  L[1].n_levels = 1; L[1].levels[0] = muon_shard(0, &W.world);
  L[2].n_levels = 1; L[2].levels[0] = muon_shard(1, &W.world);
  L[3].n_levels = 1; L[3].levels[0] = muon_flat(&W.world);
  L[4].n_levels = 2; L[4].levels[0] = muon_shard(0, &a); L[4].levels[1] = muon_shard(1, &b);
  L[5].n_levels = 2; L[5].levels[0] = muon_shard(1, &a); L[5].levels[1] = muon_flat(&b);
  L[6].n_levels = 2; L[6].levels[0] = muon_replicate(&a); L[6].levels[1] = muon_shard(0, &b);
  /* Uneven explicit ranges: rank r holds (r+1) * k elements of a 23 x 19 matrix. */
  {
    long long total = 23 * 19, unit = 2 * total / ((long long)P * (P + 1)), off = 0;
    int r;
    for (r = 0; r < W.rank; r++) off += (r + 1) * unit;
    L[7].n_levels = 1;
    L[7].levels[0] = muon_flat_range(&W.world, off, W.rank == P - 1 ? total - off : (W.rank + 1) * unit);
  }
  TEST_CASE("gather then redistribute returns every rank's piece unchanged, for every layout");
  opt = make(&cfg, &hp);
  if (!opt) { CHECK(0, "create"); return; }
  for (li = 0; li < 8; li++) {
    char name[32];
    snprintf(name, sizeof name, "rt_%s", what[li]);
    /* Tall, wide and square shapes, with sizes that do not divide. */
    if (li == 7) tmat_init(&t[li], name, 23, 19, &L[li], 1e-3f);
    else tmat_init(&t[li], name, li % 3 == 0 ? 23 : li % 3 == 1 ? 17 : 29, li % 3 == 1 ? 41 : 29, &L[li], 1e-3f);
    CHECK(tmat_add(opt, &t[li]) == MUON_OK, "add %s: %s", what[li], muon_error(opt));
  }
  CHECK(muon_step(opt) == MUON_OK, "step: %s", muon_error(opt));
  for (li = 0; li < 8; li++) {
    size_t e;
    for (e = 0; e < t[li].n; e++) {
      float want = t[li].w0[e] - t[li].g[e];
      if (memcmp(&want, &t[li].w[e], sizeof want) != 0) {
        if (ok) printf("  rank %d layout %s element %zu: got %.9g want %.9g\n", W.rank, what[li], e, (double)t[li].w[e], (double)want);
        ok = 0;
      }
    }
    tmat_free(&t[li]);
  }
  CHECK(ok, "some piece came back changed");
  muon_destroy(opt);
  muon_comm_destroy(&a);
  muon_comm_destroy(&b);
}

/* Replicas may describe the same elements through different layouts: one row of a matrix as
   SHARD(1) on one rank and FLAT on its replica. Needs 4 ranks; the identity NS of
   test_roundtrip shows every element came back to both. */
static void test_replicas_by_other_layouts(void) {
  muon_hparams hp = identity_hparams();
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt;
  muon_layout l;
  tmat t;
  size_t e;
  int ok = 1;
  if (W.size < 4) return;
  TEST_CASE("replicas holding one row as SHARD(1) on one rank and FLAT on another");
  opt = make(&cfg, &hp);
  memset(&l, 0, sizeof l);
  l.n_levels = 1;
  l.levels[0].placement = W.rank % 2 ? MUON_FLAT : MUON_SHARD;
  l.levels[0].dim = 1;
  l.levels[0].size = 2;
  l.levels[0].index = W.rank / 2;
  l.levels[0].length = -1;
  tmat_init(&t, "row", 1, 14, &l, 1e-3f);
  if (W.rank < 4) CHECK(tmat_add(opt, &t) == MUON_OK, "add: %s", muon_error(opt));
  CHECK(muon_step(opt) == MUON_OK, "step: %s", muon_error(opt));
  for (e = 0; W.rank < 4 && e < t.n; e++) {
    float want = t.w0[e] - t.g[e];
    if (memcmp(&want, &t.w[e], sizeof want) != 0) ok = 0;
  }
  CHECK(ok, "rank %d: a piece came back changed", W.rank);
  tmat_free(&t);
  muon_destroy(opt);
}

/* Layout tables of different sizes: rank 0 describes its row shard in three levels (one layout,
   the longest table), the others in one, and rank 1 adds a matrix of its own (two layouts, a
   shorter table): every table must have room for rank 1's count of records. The identity NS
   shows every element came back. */
static void test_layout_tables(void) {
  muon_hparams hp = identity_hparams();
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt;
  muon_layout l, whole;
  tmat t, own;
  size_t e;
  int ok = 1;
  if (W.size < 2) return;
  TEST_CASE("layout tables of different sizes: the longest belongs to the rank with the fewest layouts");
  opt = make(&cfg, &hp);
  memset(&l, 0, sizeof l);
  memset(&whole, 0, sizeof whole);
  l.n_levels = W.rank == 0 ? 3 : 1;
  l.levels[0] = muon_shard(0, &W.world);
  l.levels[1] = muon_replicate(NULL);
  l.levels[2] = muon_replicate(NULL);
  tmat_init(&t, "rows", 2 * W.size, 6, &l, 1e-3f);
  tmat_init(&own, "own", 3, 5, &whole, 1e-3f);
  CHECK(tmat_add(opt, &t) == MUON_OK, "add: %s", muon_error(opt));
  if (W.rank == 1) CHECK(tmat_add(opt, &own) == MUON_OK, "add: %s", muon_error(opt));
  CHECK(muon_step(opt) == MUON_OK, "step: %s", muon_error(opt));
  for (e = 0; e < t.n; e++) {
    float want = t.w0[e] - t.g[e];
    if (memcmp(&want, &t.w[e], sizeof want) != 0) ok = 0;
  }
  for (e = 0; W.rank == 1 && e < own.n; e++) {
    float want = own.w0[e] - own.g[e];
    if (memcmp(&want, &own.w[e], sizeof want) != 0) ok = 0;
  }
  CHECK(ok, "rank %d: a piece came back changed", W.rank);
  tmat_free(&t);
  tmat_free(&own);
  muon_destroy(opt);
}

/* ---- stats: zero redundancy, bytes = the formula, collectives = 2 + 2 * rounds -------------- */
static void test_stats(void) {
  muon_auto_desc ad;
  muon_dist_config cfg;
  muon_stats s0, s1;
  muon_optimizer *opt;
  tmat t[16];
  int P = W.size, i, g, n;
  long long want_sent = 0;
  memset(&ad, 0, sizeof ad);
  ad.fsdp = &W.world;
  cfg = muon_auto_config(&ad);
  TEST_CASE("balanced FSDP: NS calls sum to the matrix count, bytes = 2(P-1)/P^2 * S * 4");
  opt = make(&cfg, NULL);
  n = P;  /* P equal matrices of 8P x 16, rows divisible: every rank owns exactly one */
  for (i = 0; i < n; i++) {
    char name[16];
    muon_layout l;
    memset(&l, 0, sizeof l);
    l.n_levels = 1;
    l.levels[0] = muon_shard(0, &W.world);
    snprintf(name, sizeof name, "bal%d", i);
    tmat_init(&t[i], name, 8 * P, 16, &l, 1.0f);
    tmat_add(opt, &t[i]);
  }
  CHECK(muon_step(opt) == MUON_OK, "step 1: %s", muon_error(opt));
  muon_get_stats(opt, &s0);
  CHECK(muon_step(opt) == MUON_OK, "step 2: %s", muon_error(opt));
  muon_get_stats(opt, &s1);
  {
    long long S = (long long)n * 8 * P * 16, formula = 2LL * (P - 1) * S * 4 / ((long long)P * P);
    long long sent = s1.bytes_sent - s0.bytes_sent, recv = s1.bytes_received - s0.bytes_received;
    long long ns = sum_all(s1.ns_calls - s0.ns_calls);
    CHECK(ns == n, "NS calls over all ranks %lld, want %d (one per matrix)", ns, n);
    CHECK(sent == formula && recv == formula, "rank %d sent %lld received %lld bytes, formula %lld", W.rank, sent, recv, formula);
    CHECK(muon_owned(opt, NULL, 0) == 1, "rank %d owns %d matrices, want 1", W.rank, muon_owned(opt, NULL, 0));
    /* the agreement record, the rounds' alltoallvs, the commit vote */
    CHECK(s1.collectives - s0.collectives == (P > 1 ? 2 + 2 * s1.rounds : 2), "collectives per step %lld with %d rounds", s1.collectives - s0.collectives, s1.rounds);
  }
  for (i = 0; i < n; i++) tmat_free(&t[i]);
  muon_destroy(opt);

  TEST_CASE("uneven FSDP and HSDP-like replicas: bytes per rank = the exact per-layout count");
  opt = make(&cfg, NULL);
  {
    int rows[5] = { 18, 7, 33, 64, 5 }, cols[5] = { 24, 40, 16, 8, 31 };
    for (i = 0; i < 5; i++) {
      char name[16];
      muon_layout l;
      memset(&l, 0, sizeof l);
      l.n_levels = 1;
      l.levels[0] = muon_shard(i % 2, &W.world);
      snprintf(name, sizeof name, "unev%d", i);
      tmat_init(&t[i], name, rows[i], cols[i], &l, 1.0f);
      t[i].layout = l;
      tmat_add(opt, &t[i]);
    }
    CHECK(muon_step(opt) == MUON_OK, "step 1: %s", muon_error(opt));
    muon_get_stats(opt, &s0);
    CHECK(muon_step(opt) == MUON_OK, "step 2: %s", muon_error(opt));
    muon_get_stats(opt, &s1);
    /* Independently: a rank sends its piece of each matrix it does not own, and for each matrix
       it owns, every other rank's piece (pieces from ex_piece, owners from muon). */
    for (g = 0; g < muon_global_count(opt); g++) {
      muon_matrix_info info;
      int owner, r, li;
      muon_global_info(opt, g, &info, &owner);
      for (li = 0; li < 5 && strcmp(t[li].name, info.name); li++) {}
      for (r = 0; r < P; r++) {
        muon_layout l = t[li].layout;
        long long *idx = (long long *)malloc((size_t)info.rows * info.cols * sizeof(long long));
        size_t pn;
        l.levels[0].index = r;
        pn = ex_piece(&l, info.rows, info.cols, idx);
        free(idx);
        if (r == W.rank && owner != W.rank) want_sent += (long long)pn * 4;
        if (owner == W.rank && r != W.rank) want_sent += (long long)pn * 4;
      }
    }
    CHECK(s1.bytes_sent - s0.bytes_sent == want_sent, "rank %d sent %lld bytes, the layouts say %lld", W.rank, s1.bytes_sent - s0.bytes_sent, want_sent);
    CHECK(sum_all(s1.ns_calls - s0.ns_calls) == 5, "NS calls over all ranks != 5");
  }
  for (i = 0; i < 5; i++) tmat_free(&t[i]);
  muon_destroy(opt);

  TEST_CASE("DDP replicas: no U is sent (the owner has it), O goes to every replica");
  {
    muon_auto_desc dd;
    muon_dist_config dcfg;
    memset(&dd, 0, sizeof dd);
    dd.ddp = &W.world;
    dcfg = muon_auto_config(&dd);
    opt = make(&dcfg, NULL);
    for (i = 0; i < 3; i++) {
      char name[16];
      muon_layout l;
      memset(&l, 0, sizeof l);
      l.n_levels = 1;
      l.levels[0] = muon_replicate(&W.world);
      snprintf(name, sizeof name, "rep%d", i);
      tmat_init(&t[i], name, 32, 16, &l, 1.0f);
      tmat_add(opt, &t[i]);
    }
    CHECK(muon_step(opt) == MUON_OK, "step: %s", muon_error(opt));
    muon_get_stats(opt, &s1);
    CHECK(s1.bytes_received == (long long)(3 - muon_owned(opt, NULL, 0)) * 32 * 16 * 4 * (P > 1),
          "rank %d received %lld bytes, owns %d", W.rank, s1.bytes_received, muon_owned(opt, NULL, 0));
    CHECK(s1.bytes_sent == (long long)muon_owned(opt, NULL, 0) * 32 * 16 * 4 * (P - 1), "rank %d sent %lld bytes", W.rank, s1.bytes_sent);
    CHECK(sum_all(s1.ns_calls) == 3, "NS calls over all ranks != 3");
    for (i = 0; i < 3; i++) tmat_free(&t[i]);
    muon_destroy(opt);
  }
}

/* ---- owners ---------------------------------------------------------------------------------- */
static void test_owners(void) {
  muon_auto_desc ad;
  muon_dist_config cfg;
  muon_optimizer *opt;
  tmat t[6];
  int sizes[6][2] = { { 16, 16 }, { 96, 64 }, { 8, 8 }, { 128, 64 }, { 12, 20 }, { 24, 24 } }, i, g, o1 = -1, o2 = -1, rr;
  memset(&ad, 0, sizeof ad);
  ad.fsdp = &W.world;
  cfg = muon_auto_config(&ad);
  TEST_CASE("owners: the two largest matrices land on different ranks; owners agree with muon_get_owner");
  opt = make(&cfg, NULL);
  for (i = 0; i < 6; i++) {
    char name[16];
    muon_layout l;
    memset(&l, 0, sizeof l);
    l.n_levels = 1;
    l.levels[0] = muon_shard(0, &W.world);
    snprintf(name, sizeof name, "own%d", i);
    tmat_init(&t[i], name, sizes[i][0], sizes[i][1], &l, 1.0f);
    tmat_add(opt, &t[i]);
  }
  CHECK(muon_plan(opt) == MUON_OK, "plan: %s", muon_error(opt));
  for (g = 0; g < muon_global_count(opt); g++) {
    muon_matrix_info info;
    int owner, o;
    muon_global_info(opt, g, &info, &owner);
    if (!strcmp(info.name, "own3")) o1 = owner;
    if (!strcmp(info.name, "own1")) o2 = owner;
    if (info.local >= 0) CHECK(muon_get_owner(opt, info.local, &o) == MUON_OK && o == owner, "muon_get_owner disagrees");
  }
  if (W.size > 1) CHECK(o1 != o2 && o1 >= 0 && o2 >= 0, "largest on %d, second on %d", o1, o2);
  CHECK(sum_all(muon_owned(opt, NULL, 0)) == 6, "owned counts do not sum to 6");
  CHECK(muon_step(opt) == MUON_OK, "step: %s", muon_error(opt));
  muon_destroy(opt);

  /* Exactly where owners land, from the policies' definitions (DESIGN 3.4), computed here: the
     holders of a row shard are the ranks with a non-empty torch.chunk of rows. Balanced: the
     matrices by NS cost 4 m^2 n + 2 m^3 (m <= n), largest first, each to its least-loaded holder
     (the lowest rank on a tie). Round-robin: global g to its holders[g % holders]. */
  for (rr = 0; rr < 2; rr++) {
    double load[64] = {0};
    int want[6], done[6] = {0}, k, bad = 0;
    ad.round_robin = rr;
    cfg = muon_auto_config(&ad);
    TEST_CASE(rr ? "owners, round-robin: global g on its holders[g % holders], exactly" : "owners, balanced: largest NS cost first, each on its least-loaded holder (lowest rank on ties), exactly");
    opt = make(&cfg, NULL);
    for (i = 0; i < 6; i++) tmat_add(opt, &t[i]);
    CHECK(muon_plan(opt) == MUON_OK, "plan: %s", muon_error(opt));
    for (k = 0; k < 6; k++) {   /* balanced: pick the costliest not yet placed */
      int best = -1, r, chunk, lo = -1;
      double cb = -1;
      for (i = 0; i < 6; i++) {
        double m = sizes[i][0] < sizes[i][1] ? sizes[i][0] : sizes[i][1], n = sizes[i][0] < sizes[i][1] ? sizes[i][1] : sizes[i][0];
        double c = 4 * m * m * n + 2 * m * m * m;
        if (!done[i] && c > cb) { cb = c; best = i; }
      }
      chunk = (sizes[best][0] + W.size - 1) / W.size;
      for (r = 0; r < W.size && r * chunk < sizes[best][0]; r++) if (lo < 0 || load[r] < load[lo]) lo = r;
      want[best] = lo;
      load[lo] += cb;
      done[best] = 1;
    }
    for (g = 0; g < muon_global_count(opt); g++) {
      muon_matrix_info info;
      int owner, chunk, holders;
      muon_global_info(opt, g, &info, &owner);
      i = info.name[3] - '0';
      chunk = (info.rows + W.size - 1) / W.size;
      holders = (info.rows + chunk - 1) / chunk;
      if (rr) want[i] = g % holders;
      if (owner != want[i]) { bad++; printf("  rank %d: '%s' (global %d) owned by rank %d, expected %d\n", W.rank, info.name, g, owner, want[i]); }
    }
    CHECK(bad == 0, "%d owners differ from the policy", bad);
    CHECK(muon_step(opt) == MUON_OK, "step: %s", muon_error(opt));
    muon_destroy(opt);
  }
  for (i = 0; i < 6; i++) tmat_free(&t[i]);
}

/* ---- memory: rounds bound what a rank gathers; the result does not depend on the rounds ------ */
static void test_memory(void) {
  muon_auto_desc ad;
  muon_dist_config cfg;
  muon_optimizer *small, *big;
  muon_stats s;
  tmat a[8], b[8];
  int i, same = 1;
  size_t e;
  memset(&ad, 0, sizeof ad);
  ad.fsdp = &W.world;
  ad.round_bytes = 2 * 64 * 64 * 4;   /* two matrices per owner per round */
  cfg = muon_auto_config(&ad);
  TEST_CASE("memory: a rank gathers at most round_bytes at once; rounds change no bit");
  small = make(&cfg, NULL);
  ad.round_bytes = 0;
  {
    muon_auto_desc ad2 = ad;
    muon_dist_config cfg2 = muon_auto_config(&ad2);
    big = make(&cfg2, NULL);
    for (i = 0; i < 8; i++) {
      char name[16];
      muon_layout l;
      memset(&l, 0, sizeof l);
      l.n_levels = 1;
      l.levels[0] = muon_shard(0, &W.world);
      snprintf(name, sizeof name, "mem%d", i);
      tmat_init(&a[i], name, 64, 64, &l, 1.0f);
      tmat_init(&b[i], name, 64, 64, &l, 1.0f);
      tmat_add(small, &a[i]);
      tmat_add(big, &b[i]);
    }
    CHECK(muon_step(small) == MUON_OK && muon_step(small) == MUON_OK, "small: %s", muon_error(small));
    CHECK(muon_step(big) == MUON_OK && muon_step(big) == MUON_OK, "big: %s", muon_error(big));
  }
  muon_get_stats(small, &s);
  CHECK(s.gathered_bytes <= 2 * 64 * 64 * 4, "rank %d gathered %zu bytes at once, budget %d", W.rank, s.gathered_bytes, 2 * 64 * 64 * 4);
  if (W.size < 4) CHECK(s.rounds > 1, "only %d rounds", s.rounds);
  CHECK(s.gathered_bytes < 8 * 64 * 64 * 4, "a rank materialised the whole model");
  CHECK(s.ns_workspace_bytes <= (2 * 64 * 64 + 2 * 64 * 64) * 4, "NS workspace %zu", s.ns_workspace_bytes);
  CHECK(s.workspace_bytes <= s.exchange_bytes + s.gathered_bytes + s.ns_workspace_bytes + 64 * 64 * 8 * 4,
        "workspace %zu not accounted for", s.workspace_bytes);
  if (W.rank == 0) printf("  memory: gathered %zu B, NS workspace %zu B, exchange %zu B, local shard %zu B, %d rounds\n",
                          s.gathered_bytes, s.ns_workspace_bytes, s.exchange_bytes, (size_t)(8 * a[0].n * 4), s.rounds);
  for (i = 0; i < 8; i++) {
    for (e = 0; e < a[i].n; e++) same &= memcmp(&a[i].w[e], &b[i].w[e], 4) == 0;
    tmat_free(&a[i]);
    tmat_free(&b[i]);
  }
  CHECK(same, "results differ between round budgets");
  muon_destroy(small);
  muon_destroy(big);
}

/* ---- validation: every violation is the same error on every rank, never a hang -------------- */
static int wrong_assign_out(void *s, const muon_matrix_info *m, int n, int P, int *owner) {
  int i;
  (void)s; (void)m;
  for (i = 0; i < n; i++) owner[i] = P;
  return MUON_OK;
}
static muon_status assign_out(void *s, const muon_matrix_info *m, int n, int P, int *owner) {
  return (muon_status)wrong_assign_out(s, m, n, P, owner);
}
static muon_status assign_not_holder(void *s, const muon_matrix_info *m, int n, int P, int *owner) {
  int i;
  (void)s; (void)P;
  for (i = 0; i < n; i++) owner[i] = m[i].n_holders < P ? (m[i].holders[0] + 1) % P : 0;  /* the expert: wrong */
  return MUON_OK;
}
static muon_status assign_by_rank(void *s, const muon_matrix_info *m, int n, int P, int *owner) {
  int i;
  (void)m; (void)P;
  for (i = 0; i < n; i++) owner[i] = (*(int *)s + i) % P;   /* differs on every rank */
  return MUON_OK;
}

static void expect_plan_error(const char *what, muon_optimizer *opt, muon_status want, const char *needle) {
  muon_status st = muon_plan(opt);
  long long agree = min_all(st == want);
  CHECK(st == want, "%s: rank %d got %s, want %s (%s)", what, W.rank, muon_status_string(st), muon_status_string(want), muon_error(opt));
  CHECK(agree == 1, "%s: not every rank got %s", what, muon_status_string(want));
  if (needle) CHECK(strstr(muon_error(opt), needle) != NULL, "%s: message '%s' lacks '%s'", what, muon_error(opt), needle);
  CHECK(muon_step(opt) == want || muon_step(opt) != MUON_OK, "%s: muon_step went ahead", what);
}

/* One matrix per rank, registered as given; planning must fail the same way everywhere. */
static void one_matrix_error(const char *what, int rows, int cols, const muon_layout *l, muon_hparams *hp,
                             muon_status want, const char *needle) {
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt = make(&cfg, hp);
  tmat t;
  tmat_init(&t, what, rows, cols, l, 1.0f);
  tmat_add(opt, &t);
  expect_plan_error(what, opt, want, needle);
  tmat_free(&t);
  muon_destroy(opt);
}

static void test_validation(void) {
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt;
  tmat t, u;
  muon_layout l;
  int P = W.size, r;
  memset(&l, 0, sizeof l);
  l.n_levels = 1;
  l.levels[0] = muon_shard(0, &W.world);
  if (P < 2) return;

  TEST_CASE("validation: shapes differ between ranks -> MUON_ERR_MISMATCH everywhere");
  one_matrix_error("shapes", W.rank == 1 ? 32 : 16, 16, &l, NULL, MUON_ERR_MISMATCH, "rank");
  {
    muon_layout f;
    memset(&f, 0, sizeof f);
    f.n_levels = 1;
    TEST_CASE("validation: FLAT ranges that overlap -> MUON_ERR_SHAPE everywhere");
    f.levels[0] = muon_flat_range(&W.world, W.rank * 100, 150 < 20 * 20 - W.rank * 100 ? 150 : 20 * 20 - W.rank * 100);
    one_matrix_error("overlap", 20, 20, &f, NULL, MUON_ERR_SHAPE, "overlap");
    TEST_CASE("validation: whole-row ranges that overlap and cover it all (the grid check's rectangles) -> MUON_ERR_SHAPE everywhere");
    f.levels[0] = muon_flat_range(&W.world, W.rank * 100, W.rank == P - 1 ? 400 - W.rank * 100 : 200);
    one_matrix_error("rows overlap", 20, 20, &f, NULL, MUON_ERR_SHAPE, "overlap at row 5, col 0");
    TEST_CASE("validation: FLAT ranges with a gap -> MUON_ERR_SHAPE everywhere");
    f.levels[0] = muon_flat_range(&W.world, W.rank * 100, 50);
    one_matrix_error("gap", 20, 20, &f, NULL, MUON_ERR_SHAPE, "gap");
    TEST_CASE("validation: FLAT ranges that stop short of the end (a tail no rank holds) -> MUON_ERR_SHAPE naming the range");
    f.levels[0] = muon_flat_range(&W.world, W.rank * 40, 40);   /* [0, 40 P) of 400, P <= 8 */
    {
      char want[200];
      snprintf(want, sizeof want, "no rank holds elements [%d, 400) of its row-major flattening (row %d, col %d to row 19, col 19), its tail",
               40 * P, 40 * P / 20, 40 * P % 20);
      one_matrix_error("tail", 20, 20, &f, NULL, MUON_ERR_SHAPE, want);
    }
  }
  TEST_CASE("validation: a matrix only one rank registered leaves the others' rows uncovered");
  opt = make(&cfg, NULL);
  tmat_init(&t, "common", 16, 16, &l, 1.0f);
  tmat_add(opt, &t);
  tmat_init(&u, "stray", 16, 16, &l, 1.0f);
  if (W.rank == 1) tmat_add(opt, &u);
  expect_plan_error("stray", opt, MUON_ERR_SHAPE, "stray");
  tmat_free(&t);
  tmat_free(&u);
  muon_destroy(opt);

  TEST_CASE("validation: different Newton-Schulz settings on different ranks -> MUON_ERR_MISMATCH");
  {
    muon_hparams hp = muon_default_hparams();
    if (W.rank == 1) hp.ns_steps = 6;
    one_matrix_error("hparams", 16, 16, &l, &hp, MUON_ERR_MISMATCH, "muon_hparams.ns_steps of group 0");
  }
  TEST_CASE("validation: the same name twice on one rank -> MUON_ERR_ARG everywhere");
  opt = make(&cfg, NULL);
  tmat_init(&t, "twice", 16, 16, &l, 1.0f);
  tmat_init(&u, "twice", 16, 16, &l, 1.0f);
  tmat_add(opt, &t);
  tmat_add(opt, &u);
  expect_plan_error("duplicate", opt, MUON_ERR_ARG, "twice");
  tmat_free(&t);
  tmat_free(&u);
  muon_destroy(opt);

  {
    struct { const char *what; muon_status (*fn)(void *, const muon_matrix_info *, int, int, int *); const char *needle; } cases[3] = {
      { "an owner outside [0, world) -> MUON_ERR_ASSIGN", assign_out, "outside" },
      { "an owner that holds none of the matrix -> MUON_ERR_ASSIGN", assign_not_holder, "holds none" },
      { "ranks that disagree on owners -> MUON_ERR_ASSIGN", assign_by_rank, "different owners" },
    };
    int rank = W.rank;
    for (r = 0; r < 3; r++) {
      muon_dist_config c = muon_layout_config();
      muon_layout only0;
      char name[200];
      snprintf(name, sizeof name, "validation: %s", cases[r].what);
      TEST_CASE(name);
      c.assign = cases[r].fn;
      c.state = &rank;
      memset(&only0, 0, sizeof only0);   /* held by rank 0 only: an expert */
      only0.key = 7;
      opt = make(&c, NULL);
      tmat_init(&t, "full", 16, 16, &l, 1.0f);
      tmat_add(opt, &t);
      tmat_init(&u, "expert", 8, 8, NULL, 1.0f);
      u.layout = only0;
      if (W.rank == 0) tmat_add(opt, &u);
      expect_plan_error(cases[r].what, opt, MUON_ERR_ASSIGN, r == 2 ? NULL : cases[r].needle);
      tmat_free(&t);
      tmat_free(&u);
      muon_destroy(opt);
    }
  }
}

/* One name under many layout keys is many matrices: the planner's table matches (name, key), and
   with 48 keys per rank of one name, some must meet in one probe chain of its hash table. */
static void test_one_name_many_keys(void) {
  enum { K = 48 };
  muon_dist_config c = muon_layout_config();
  muon_optimizer *opt;
  tmat t[K];
  muon_layout l;
  muon_status st;
  int k, ok = 1;
  TEST_CASE("one name under 48 layout keys per rank: 48 x world matrices, planned");
  opt = make(&c, NULL);
  memset(&l, 0, sizeof l);   /* held whole by this rank alone, as an expert */
  for (k = 0; k < K; k++) {
    l.key = 1000 + W.rank * K + k;
    tmat_init(&t[k], "expert.w", 4, 6, NULL, 1.0f);
    t[k].layout = l;
    ok &= tmat_add(opt, &t[k]) == MUON_OK;
  }
  CHECK(ok, "add: %s", muon_error(opt));
  st = muon_plan(opt);
  CHECK(st == MUON_OK, "muon_plan: %s", muon_error(opt));
  if (st == MUON_OK)
    CHECK(muon_global_count(opt) == K * W.size, "%d global matrices, expected %d", muon_global_count(opt), K * W.size);
  for (k = 0; k < K; k++) tmat_free(&t[k]);
  muon_destroy(opt);
}

/* ---- non-finite gradients: agreed by all ranks ----------------------------------------------- */
static void test_nonfinite(void) {
  muon_auto_desc ad;
  muon_dist_config cfg;
  muon_optimizer *opt;
  muon_desc d = muon_default_desc();
  tmat t[2];
  muon_layout l;
  int i, unchanged = 1;
  size_t e;
  memset(&ad, 0, sizeof ad);
  ad.fsdp = &W.world;
  cfg = muon_auto_config(&ad);
  memset(&l, 0, sizeof l);
  l.n_levels = 1;
  l.levels[0] = muon_shard(0, &W.world);
  TEST_CASE("a NaN gradient on one rank is MUON_ERR_NONFINITE on every rank, nothing applied");
  opt = make(&cfg, NULL);
  for (i = 0; i < 2; i++) { tmat_init(&t[i], i ? "nf1" : "nf0", 16, 24, &l, 1.0f); tmat_add(opt, &t[i]); }
  if (W.rank == W.size - 1) t[1].g[0] = NAN;
  CHECK(muon_step(opt) == MUON_ERR_NONFINITE, "rank %d: %s", W.rank, muon_error(opt));
  for (i = 0; i < 2; i++)
    for (e = 0; e < t[i].n; e++) unchanged &= t[i].w[e] == t[i].w0[e];
  CHECK(unchanged, "parameters changed");
  for (i = 0; i < 2; i++) tmat_free(&t[i]);
  muon_destroy(opt);

  TEST_CASE("MUON_NONFINITE_SKIP: the matrix is skipped on every rank, the others step");
  d.comm = &W.world;
  d.dist = &cfg;
  d.on_nonfinite = MUON_NONFINITE_SKIP;
  muon_create(&opt, &d);
  for (i = 0; i < 2; i++) { tmat_init(&t[i], i ? "sk1" : "sk0", 16, 24, &l, 1.0f); tmat_add(opt, &t[i]); }
  if (W.rank == W.size - 1) t[1].g[0] = INFINITY;
  CHECK(muon_step(opt) == MUON_OK, "step: %s", muon_error(opt));
  for (e = 0, unchanged = 1; e < t[1].n; e++) unchanged &= t[1].w[e] == t[1].w0[e];
  CHECK(unchanged, "the skipped matrix changed on rank %d", W.rank);
  for (e = 0, unchanged = 1; e < t[0].n; e++) unchanged &= t[0].w[e] == t[0].w0[e];
  CHECK(!unchanged || t[0].n == 0, "the healthy matrix did not change");
  for (i = 0; i < 2; i++) tmat_free(&t[i]);
  muon_destroy(opt);
}

/* ---- state: each rank saves its own pieces; resuming is bitwise the same as never stopping -- */
static void test_state(void) {
  muon_auto_desc ad;
  muon_dist_config cfg;
  muon_optimizer *a, *b;
  tmat ta[3], tb[3];
  muon_layout l;
  void *blob;
  size_t n, e;
  int i, s, same = 1;
  memset(&ad, 0, sizeof ad);
  ad.fsdp = &W.world;
  cfg = muon_auto_config(&ad);
  memset(&l, 0, sizeof l);
  l.n_levels = 1;
  l.levels[0] = muon_shard(0, &W.world);
  TEST_CASE("state: save after step 2 on every rank, load into a new optimizer, resume = never stopping");
  a = make(&cfg, NULL);
  b = make(&cfg, NULL);
  for (i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "st%d", i);
    tmat_init(&ta[i], name, 20 + 7 * i, 24, &l, 1.0f);
    tmat_init(&tb[i], name, 20 + 7 * i, 24, &l, 1.0f);
    tmat_add(a, &ta[i]);
    tmat_add(b, &tb[i]);
  }
  for (s = 0; s < 4; s++) {
    CHECK(muon_step(a) == MUON_OK, "a: %s", muon_error(a));
    if (s < 2) CHECK(muon_step(b) == MUON_OK, "b: %s", muon_error(b));
  }
  n = muon_state_size(b);
  blob = malloc(n);
  CHECK(muon_state_save(b, blob, n) == MUON_OK, "save: %s", muon_error(b));
  muon_destroy(b);
  b = make(&cfg, NULL);
  for (i = 0; i < 3; i++) tmat_add(b, &tb[i]);
  CHECK(muon_state_load(b, blob, n) == MUON_OK, "load: %s", muon_error(b));
  for (s = 2; s < 4; s++) CHECK(muon_step(b) == MUON_OK, "b resumed: %s", muon_error(b));
  for (i = 0; i < 3; i++) {
    for (e = 0; e < ta[i].n; e++) same &= memcmp(&ta[i].w[e], &tb[i].w[e], 4) == 0;
    tmat_free(&ta[i]);
    tmat_free(&tb[i]);
  }
  CHECK(same, "rank %d: the resumed run differs", W.rank);
  free(blob);
  muon_destroy(a);
  muon_destroy(b);
}

/* ---- no matrices at all, or only on some ranks ----------------------------------------------- */
static void test_empty(void) {
  muon_auto_desc ad;
  muon_dist_config cfg;
  muon_optimizer *opt;
  muon_stats s;
  tmat t;
  memset(&ad, 0, sizeof ad);
  ad.fsdp = &W.world;
  cfg = muon_auto_config(&ad);
  TEST_CASE("an optimizer with no matrices steps without error on every rank");
  opt = make(&cfg, NULL);
  CHECK(muon_step(opt) == MUON_OK && muon_step(opt) == MUON_OK, "step: %s", muon_error(opt));
  CHECK(muon_get_stats(opt, &s) == MUON_OK && s.steps == 2 && s.ns_calls == 0 && s.bytes_sent == 0, "stats");
  muon_destroy(opt);
  TEST_CASE("a matrix held by rank 0 alone (an expert) is orthogonalised there, others idle");
  opt = make(&cfg, NULL);
  tmat_init(&t, "solo", 12, 20, NULL, 1.0f);
  if (W.rank == 0) {
    muon_matrix m = muon_default_matrix();
    muon_layout whole;
    memset(&whole, 0, sizeof whole);
    m.name = t.name; m.param = t.w; m.grad = t.g; m.rows = 12; m.cols = 20; m.layout = &whole;
    CHECK(muon_add_matrix(opt, &m, NULL) == MUON_OK, "add: %s", muon_error(opt));
  }
  CHECK(muon_step(opt) == MUON_OK, "step: %s", muon_error(opt));
  CHECK(muon_owned(opt, NULL, 0) == (W.rank == 0), "rank %d owns %d", W.rank, muon_owned(opt, NULL, 0));
  CHECK(sum_all(muon_get_stats(opt, &s) == MUON_OK ? s.ns_calls : -1) == 1, "NS calls != 1");
  if (W.rank == 0) CHECK(t.w[0] != t.w0[0], "the matrix did not change");
  tmat_free(&t);
  muon_destroy(opt);
}

/* ---- overlap: a collective failing on every rank at once, then the same step again ----------
   Every rank's k-th alltoallv returns MUON_ERR_COMM without running, so the ranks stay in step.
   Under prefetch 2 and async (rounds of one matrix: several gathers queued on the communication
   thread when it fails), the step must fail alike everywhere with nothing applied, and the next
   one must work, ending bitwise where a run without the failure ends. Catches a communication
   thread that stays failed, or a queued exchange left over into the next step. */
typedef struct flaky { muon_comm inner; int calls, fail_at; } flaky;
/* The failing call starts an exchange: over a queued communicator (Gloo's posted exchanges)
   the ones started before it are in flight and must be joined. */
static muon_status flaky_alltoallv(void *ctx, const float *s, const size_t *sc, const size_t *sd, float *r,
                                   const size_t *rc, const size_t *rd, int *ticket) {
  flaky *f = (flaky *)ctx;
  *ticket = -1;
  if (f->calls++ == f->fail_at) return MUON_ERR_COMM;
  return f->inner.vt->alltoallv(f->inner.ctx, s, sc, sd, r, rc, rd, ticket);
}
static muon_status flaky_join(void *ctx, int ticket) {
  flaky *f = (flaky *)ctx;
  return f->inner.vt->join ? f->inner.vt->join(f->inner.ctx, ticket) : MUON_OK;
}
static muon_status flaky_finish(void *ctx) {
  flaky *f = (flaky *)ctx;
  return f->inner.vt->finish ? f->inner.vt->finish(f->inner.ctx) : MUON_OK;
}
static muon_status flaky_allgather(void *ctx, const void *s, void *r, size_t n) {
  flaky *f = (flaky *)ctx;
  return f->inner.vt->allgather(f->inner.ctx, s, r, n);
}
static const char *flaky_error(void *ctx) { (void)ctx; return "injected failure"; }
/* As queued as the communicator it wraps. */
static const muon_comm_vtable flaky_vt[2] = {
  { MUON_COMM_VTABLE_VERSION,
    /* .alltoallv = */ flaky_alltoallv,
    /* .join      = */ flaky_join,
    /* .finish    = */ flaky_finish,
    /* .allgather = */ flaky_allgather,
    /* .error     = */ flaky_error,
    /* .destroy   = */ NULL,
    /* .memory    = */ MUON_MEMORY_HOST,
    /* .queued    = */ 0 },
  { MUON_COMM_VTABLE_VERSION,
    /* .alltoallv = */ flaky_alltoallv,
    /* .join      = */ flaky_join,
    /* .finish    = */ flaky_finish,
    /* .allgather = */ flaky_allgather,
    /* .error     = */ flaky_error,
    /* .destroy   = */ NULL,
    /* .memory    = */ MUON_MEMORY_HOST,
    /* .queued    = */ 1 }
};

static void test_overlap_failure(void) {
  flaky fl;
  muon_comm c;
  muon_dist_config cfg = muon_layout_config();
  muon_desc d = muon_default_desc();
  muon_optimizer *opt[2] = { NULL, NULL };
  muon_layout l;
  tmat t[2][4];
  int k, i, ok = 1;
  muon_status st;
  TEST_CASE(W.world.vt->queued ? "overlap: a collective failing on every rank (prefetch 2, async, Gloo queued): the same error, nothing applied, the retry ends where a clean run does"
                                         : "overlap: a collective failing on every rank (prefetch 2, async, the communication thread): the same error, nothing applied, the retry ends where a clean run does");
  fl.inner = W.world; fl.calls = 0; fl.fail_at = -1;
  c.vt = &flaky_vt[W.world.vt->queued]; c.ctx = &fl; c.rank = W.rank; c.size = W.size;
  cfg.prefetch = 2;
  cfg.async = 1;
  cfg.round_bytes = 1;   /* a round per matrix */
  memset(&l, 0, sizeof l);
  l.n_levels = 1;
  l.levels[0] = muon_shard(0, &W.world);
  for (k = 0; k < 2; k++) {   /* opt[0] meets the failure, opt[1] never does */
    d.comm = k ? &W.world : &c;
    d.dist = &cfg;
    if (muon_create(&opt[k], &d) != MUON_OK) { CHECK(0, "create: %s", muon_error(NULL)); return; }
    for (i = 0; i < 4; i++) {
      char name[16];
      snprintf(name, sizeof name, "ov%d", i);
      tmat_init(&t[k][i], name, 20 + 3 * i, 16, &l, 1.0f);
      CHECK(tmat_add(opt[k], &t[k][i]) == MUON_OK, "add: %s", muon_error(opt[k]));
    }
  }
  CHECK(muon_step(opt[0]) == MUON_OK && muon_step(opt[1]) == MUON_OK, "step 1: %s", muon_error(opt[0]));
  if (W.size > 1) {
    for (i = 0; i < 4; i++) memcpy(t[0][i].w0, t[0][i].w, t[0][i].n * sizeof(float));
    fl.fail_at = fl.calls + 1;   /* the second alltoallv of step 2: gathers are queued behind it */
    st = muon_step(opt[0]);
    CHECK(st == MUON_ERR_COMM && strstr(muon_error(opt[0]), "injected failure"), "rank %d: failing step gave %s: %s",
          W.rank, muon_status_string(st), muon_error(opt[0]));
    for (i = 0; i < 4; i++) if (memcmp(t[0][i].w, t[0][i].w0, t[0][i].n * sizeof(float))) ok = 0;
    CHECK(ok, "rank %d: the failed step changed parameters", W.rank);
  }
  CHECK(muon_step(opt[0]) == MUON_OK && muon_step(opt[1]) == MUON_OK, "step 2 (again): %s", muon_error(opt[0]));
  CHECK(muon_step(opt[0]) == MUON_OK && muon_step(opt[1]) == MUON_OK, "step 3: %s", muon_error(opt[0]));
  for (i = 0, ok = 1; i < 4; i++) if (memcmp(t[0][i].w, t[1][i].w, t[0][i].n * sizeof(float))) ok = 0;
  CHECK(min_all(ok) == 1, "rank %d: after the retry the parameters differ from the run without the failure", W.rank);
  for (k = 0; k < 2; k++) {
    muon_destroy(opt[k]);
    for (i = 0; i < 4; i++) tmat_free(&t[k][i]);
  }
}

/* ---- faults: a wrapper communicator that kills or stalls one rank inside a step --------------- */
typedef struct fault_comm { muon_comm inner; int victim, mode, calls; } fault_comm;
/* The victim's second exchange (the redistribute of the first round): killed or stalled there. */
static void fault_strike(fault_comm *f) {
  if (f->inner.rank != f->victim || ++f->calls != 2) return;
  if (f->mode == 0) raise(SIGKILL);
  sleep(5);
}
static muon_status fault_alltoallv(void *ctx, const float *s, const size_t *sc, const size_t *sd, float *r,
                                   const size_t *rc, const size_t *rd, int *ticket) {
  fault_comm *f = (fault_comm *)ctx;
  fault_strike(f);
  return f->inner.vt->alltoallv(f->inner.ctx, s, sc, sd, r, rc, rd, ticket);
}
static muon_status fault_join(void *ctx, int ticket) {
  fault_comm *f = (fault_comm *)ctx;
  return f->inner.vt->join ? f->inner.vt->join(f->inner.ctx, ticket) : MUON_OK;
}
static muon_status fault_finish(void *ctx) {
  fault_comm *f = (fault_comm *)ctx;
  return f->inner.vt->finish ? f->inner.vt->finish(f->inner.ctx) : MUON_OK;
}
static muon_status fault_allgather(void *ctx, const void *s, void *r, size_t n) {
  fault_comm *f = (fault_comm *)ctx;
  return f->inner.vt->allgather(f->inner.ctx, s, r, n);
}
static const char *fault_error(void *ctx) {
  fault_comm *f = (fault_comm *)ctx;
  return f->inner.vt->error ? f->inner.vt->error(f->inner.ctx) : "";
}
/* As queued as the communicator it wraps: over Gloo's posted exchanges, with async, several are
   in flight when the victim goes. */
static const muon_comm_vtable fault_vt[2] = {
  { MUON_COMM_VTABLE_VERSION,
    /* .alltoallv = */ fault_alltoallv,
    /* .join      = */ fault_join,
    /* .finish    = */ fault_finish,
    /* .allgather = */ fault_allgather,
    /* .error     = */ fault_error,
    /* .destroy   = */ NULL,
    /* .memory    = */ MUON_MEMORY_HOST,
    /* .queued    = */ 0 },
  { MUON_COMM_VTABLE_VERSION,
    /* .alltoallv = */ fault_alltoallv,
    /* .join      = */ fault_join,
    /* .finish    = */ fault_finish,
    /* .allgather = */ fault_allgather,
    /* .error     = */ fault_error,
    /* .destroy   = */ NULL,
    /* .memory    = */ MUON_MEMORY_HOST,
    /* .queued    = */ 1 }
};

static int fault_overlap;   /* --fault MODE N overlap: prefetch 2, async, a round per matrix */

static int fault_rank(int mode) {
  ex_world w;
  fault_comm fc;
  muon_comm c;
  muon_auto_desc ad;
  muon_dist_config cfg;
  muon_desc d = muon_default_desc();
  muon_optimizer *opt;
  tmat t[3];
  muon_layout l;
  float *mom0[3];
  int i, ok = 1;
  size_t e;
  double t0, dt;
  struct timespec ts;
  char *argv0[1] = { NULL };
  w = ex_init(0, argv0);
  W = w;
  fc.inner = w.world;
  fc.victim = 1;
  fc.mode = mode;
  fc.calls = 0;
  c.vt = &fault_vt[w.world.vt->queued]; c.ctx = &fc; c.rank = w.rank; c.size = w.size;
  memset(&ad, 0, sizeof ad);
  ad.fsdp = &c;
  if (fault_overlap) { ad.prefetch = 2; ad.async = 1; ad.round_bytes = 1; }
  cfg = muon_auto_config(&ad);
  d.comm = &c;
  d.dist = &cfg;
  if (muon_create(&opt, &d) != MUON_OK) return 1;
  memset(&l, 0, sizeof l);
  l.n_levels = 1;
  l.levels[0] = muon_shard(0, &c);
  for (i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "f%d", i);
    tmat_init(&t[i], name, 24, 16, &l, 1.0f);
    tmat_add(opt, &t[i]);
  }
  if (muon_plan(opt) != MUON_OK) { printf("rank %d: plan: %s\n", w.rank, muon_error(opt)); return 1; }
  for (i = 0; i < 3; i++) {
    const float *m;
    size_t n;
    muon_get_momentum(opt, i, &m, &n);
    mom0[i] = (float *)malloc((n + 1) * sizeof(float));
    memcpy(mom0[i], m, n * sizeof(float));
  }
  clock_gettime(CLOCK_MONOTONIC, &ts);
  t0 = ts.tv_sec + ts.tv_nsec * 1e-9;
  {
    muon_status st = muon_step(opt);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    dt = ts.tv_sec + ts.tv_nsec * 1e-9 - t0;
    if (st != MUON_ERR_COMM && st != MUON_ERR_TIMEOUT) { printf("rank %d: step returned %s\n", w.rank, muon_status_string(st)); ok = 0; }
    printf("rank %d: %s after %.3f s: %s\n", w.rank, muon_status_string(st), dt, muon_error(opt));
    if (dt > 4.0 && w.rank != 1) { printf("rank %d: took %.2f s, timeout is 2 s\n", w.rank, dt); ok = 0; }
  }
  for (i = 0; i < 3; i++) {
    const float *m;
    size_t n;
    muon_get_momentum(opt, i, &m, &n);
    for (e = 0; e < t[i].n; e++) if (t[i].w[e] != t[i].w0[e]) ok = 0;
    if (memcmp(m, mom0[i], n * sizeof(float))) ok = 0;
  }
  printf("rank %d: parameters and momentum %s\n", w.rank, ok ? "unchanged" : "CHANGED");
  fflush(stdout);
  test_exit(ok ? 0 : 1);   /* skip Gloo teardown: its peers are gone */
}

static int run_fault(const char *mode, int n) {
  char dir[] = "/tmp/muon-fault-XXXXXX", buf[32];
  pid_t pids[16];
  int r, status, survivors_ok = 1, victim_ok = 0, m = !strcmp(mode, "kill") ? 0 : 1;
  char name[200];
  snprintf(name, sizeof name, "fault: rank 1 %s mid-step%s; the others return an error within the timeout, unchanged",
           m == 0 ? "is killed (SIGKILL)" : "stalls past the 2 s timeout",
           !fault_overlap ? "" : getenv("MUON_GLOO_BLOCKING") && atoi(getenv("MUON_GLOO_BLOCKING"))
                                    ? " (prefetch 2, async on the communication thread, three rounds)"
                                    : " (prefetch 2, async on Gloo's started exchanges, three rounds)");
  TEST_CASE(name);
  if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return test_summary(); }
  for (r = 0; r < n && r < 16; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      snprintf(buf, sizeof buf, "%d", r); setenv("MUON_RANK", buf, 1);
      snprintf(buf, sizeof buf, "%d", n); setenv("MUON_WORLD_SIZE", buf, 1);
      setenv("MUON_STORE", dir, 1);
      setenv("MUON_GLOO_TIMEOUT", "2", 1);
      test_exit(fault_rank(m));
    }
  }
  for (r = 0; r < n; r++) {
    waitpid(pids[r], &status, 0);
    if (r == 1 && m == 0) victim_ok = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    else if (r == 1) victim_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) survivors_ok = 0;
  }
  CHECK(victim_ok, "rank 1 did not %s as planned", m == 0 ? "die" : "stall and recover");
  CHECK(survivors_ok, "a survivor failed its checks");
  {
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("  could not remove %s\n", dir);
  }
  return test_summary();
}

int main(int argc, char **argv) {
  int rc;
  signal(SIGPIPE, SIG_IGN);
  if (argc >= 4 && !strcmp(argv[1], "--fault")) {
    fault_overlap = argc >= 5 && !strcmp(argv[4], "overlap");
    return run_fault(argv[2], atoi(argv[3]));
  }
  W = ex_init(argc, argv);
  test_roundtrip();
  test_replicas_by_other_layouts();
  test_layout_tables();
  test_stats();
  test_owners();
  test_memory();
  test_validation();
  test_one_name_many_keys();
  test_nonfinite();
  test_empty();
  test_state();
  test_overlap_failure();
  if (W.rank == 0) rc = test_summary();
  else { test__end_case(); rc = test__failed ? 1 : 0; }
  muon_comm_destroy(&W.world);
  return rc;
}
