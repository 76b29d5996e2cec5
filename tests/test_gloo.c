/* test_gloo.c - the Gloo communicator (muon_gloo.h) on N local processes.

   Build (the Gloo implementation is C++, compiled once from examples/muon_gloo.cpp):
     g++ -std=c++17 -Wall -Wextra -Werror -O2 -I. -c examples/muon_gloo.cpp -o build/muon_gloo.o
     gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -I. -Itests tests/test_gloo.c \
         build/muon_gloo.o -o build/test_gloo -lgloo -lstdc++ -pthread -lm
   Run:
     build/muonrun -n 4 build/test_gloo            collectives, subgroups, meshes, store traps
     build/muonrun -n 3 build/test_gloo --die      rank 1 exits mid-run; the others must get
                                                   MUON_ERR_COMM quickly, never hang or crash
     build/muonrun -n 3 build/test_gloo --die-started   the same with exchanges in flight
                                                   (queued alltoallv) when rank 1 is gone
     build/muonrun -n 3 build/test_gloo --stall    rank 1 sleeps past the 2 s timeout; the others
                                                   must return within the timeout + slack
   Optional: MUON_TEST_REDIS=host:port also rendezvous through Redis (a world, a dead Redis at
   MUON_TEST_REDIS_DEAD=host:port or 127.0.0.1:1, and at 44 or more ranks subgroups whose rank
   lists are long enough to get hashed key names); tests/run_redis.sh starts a private server:
     build/muonrun -n 44 build/test_gloo --redis  only the Redis cases
   Rank 0 prints the summary (failures of every rank included when the world still works);
   every rank exits non-zero when one of its checks failed. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MUON_IMPLEMENTATION /* muon_gloo.h reports failed creations through muon_error(NULL) */
#include "muon.h"
#include "muon_gloo.h"
#include "test.h"

static const char *test_comm_error(const muon_comm *c) {
  const char *e = c->vt && c->vt->error ? c->vt->error(c->ctx) : NULL;
  return e ? e : "";
}

/* Nobody leaves before everybody arrived: one byte each, gathered (muon needs no barrier slot). */
static muon_status comm_barrier(const muon_comm *c) {
  char one = 1, *all = (char *)malloc((size_t)c->size);
  muon_status st = all ? c->vt->allgather(c->ctx, &one, all, 1) : MUON_ERR_NOMEM;
  free(all);
  return st;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  nanosleep(&ts, NULL);
}

/* Which cases failed on this rank, to be OR-ed across ranks at the end. */
static int case_index = -1;
static uint64_t case_failed_mask;
static void begin(const char *name) {
  if (case_index >= 0 && test__in_case && test__case_failed) case_failed_mask |= (uint64_t)1 << case_index;
  case_index++;
  TEST_CASE(name);
}

static uint32_t mix(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t h = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u) * 0x85EBCA77u ^ (c + 0x165667B1u) * 0xC2B2AE3Du;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  return h;
}

/* Floats sent from src to dst in round `it` (< 0: a dense round): zeros often, a whole zero row (sender) and a whole
   zero column (receiver) every round, large messages in round 3. */
static size_t count_of(int src, int dst, int it, int size) {
  uint32_t h = mix((uint32_t)src, (uint32_t)dst, (uint32_t)it);
  if (it < 0) return 3 + (size_t)((src + dst) % 2); /* dense: every pair talks (fault modes) */
  if (src == it % size) return 0;
  if (size > 1 && dst == (it + 1) % size) return 0;
  if (it == 3) return 50000 + h % 1000;
  if (h % 3 == 0) return 0;
  return h % 9;
}

/* Exact in a float: below 2^24. */
static float value_of(int src, int dst, int it, size_t k) {
  return (float)(((uint32_t)src * 8191u + (uint32_t)dst * 127u + (uint32_t)it * 1031u +
                  (uint32_t)k * 3u) % 16000000u);
}

/* One alltoallv round over comm c whose members have world ranks members[]. Sender packs peers in
   reverse order, receiver in a rotated order, both with one-float gaps that must stay untouched. */
typedef struct round_io {
  muon_comm *c;
  const int *members;
  int it;
  size_t *sc, *sd, *rc, *rd, rtotal;
  float *send, *recv;
} round_io;

static void round_make(round_io *r, muon_comm *c, const int *members, int it) {
  const int n = c->size, me = c->rank;
  size_t stotal = 0, k;
  int p, j;
  r->c = c;
  r->members = members;
  r->it = it;
  r->sc = (size_t *)calloc((size_t)n, sizeof(size_t)); r->sd = (size_t *)calloc((size_t)n, sizeof(size_t));
  r->rc = (size_t *)calloc((size_t)n, sizeof(size_t)); r->rd = (size_t *)calloc((size_t)n, sizeof(size_t));
  r->rtotal = 0;
  /* counts are a function of world ranks so every group sees fresh patterns */
  for (j = 0; j < n; j++) {
    p = n - 1 - j;
    r->sc[p] = count_of(members[me], members[p], it, n);
    r->sd[p] = stotal + 1;
    stotal += r->sc[p] + 1;
  }
  for (j = 0; j < n; j++) {
    p = (me + j) % n;
    r->rc[p] = count_of(members[p], members[me], it, n);
    r->rd[p] = r->rtotal + 1;
    r->rtotal += r->rc[p] + 1;
  }
  r->send = (float *)malloc((stotal + 1) * sizeof(float));
  r->recv = (float *)malloc((r->rtotal + 1) * sizeof(float));
  for (k = 0; k <= stotal; k++) r->send[k] = -2.0f;
  for (k = 0; k <= r->rtotal; k++) r->recv[k] = -1.0f;
  for (p = 0; p < n; p++)
    for (k = 0; k < r->sc[p]; k++) r->send[r->sd[p] + k] = value_of(members[me], members[p], it, k);
}

/* The wrong floats r received (-1 when st, its call's status, is a failure); frees r. */
static long round_check(round_io *r, muon_status st) {
  const int n = r->c->size, me = r->c->rank;
  long bad = 0;
  size_t k;
  int p;
  if (st != MUON_OK) {
    bad = -1;
  } else {
    for (k = 0; k <= r->rtotal; k++) {
      int owner = -1;
      for (p = 0; p < n; p++)
        if (k >= r->rd[p] && k < r->rd[p] + r->rc[p]) owner = p;
      if (owner < 0) {
        if (r->recv[k] != -1.0f) bad++;
      } else if (r->recv[k] != value_of(r->members[owner], r->members[me], r->it, k - r->rd[owner])) {
        if (bad < 3)
          printf("  alltoallv: recv[%zu] from group rank %d = %g, want %g\n", k, owner, (double)r->recv[k],
                 (double)value_of(r->members[owner], r->members[me], r->it, k - r->rd[owner]));
        bad++;
      }
    }
  }
  free(r->sc); free(r->sd); free(r->rc); free(r->rd); free(r->send); free(r->recv);
  return bad;
}

/* Returns the number of wrong floats (or -1 when the call failed). */
static long alltoallv_round(muon_comm *c, const int *members, int it, muon_status *st_out) {
  round_io r;
  muon_status st;
  round_make(&r, c, members, it);
  st = muon_comm_alltoallv(c, r.send, r.sc, r.sd, r.recv, r.rc, r.rd);
  if (st_out) *st_out = st;
  return round_check(&r, st);
}

/* k rounds (it0, it0 + 1, ...) started on a queued comm, all in flight at once, then joined
   in reverse order; with `between`, an allgather and a blocking round run between the starts and
   the joins (their Gloo slots are apart). The wrong floats of all (-1 when a call failed). */
#define MAX_STARTED 70
static long started_rounds(muon_comm *c, const int *members, int it0, int k, int between, muon_status *st_out) {
  round_io r[MAX_STARTED];
  muon_status st[MAX_STARTED], first = MUON_OK;
  int ticket[MAX_STARTED], i, got[64];
  long bad = 0, b;
  if (!c->vt->queued || k > MAX_STARTED) {
    if (st_out) *st_out = MUON_ERR_ARG;
    return -1;
  }
  for (i = 0; i < k; i++) {
    round_make(&r[i], c, members, it0 + i);
    st[i] = c->vt->alltoallv(c->ctx, r[i].send, r[i].sc, r[i].sd, r[i].recv, r[i].rc, r[i].rd, &ticket[i]);
    if (st[i] != MUON_OK && first == MUON_OK) first = st[i];
  }
  if (between && first == MUON_OK && c->size <= 64) {
    if (c->vt->allgather(c->ctx, &c->rank, got, sizeof(int)) != MUON_OK) bad = -1;
    if (alltoallv_round(c, members, it0 + k, NULL) != 0) bad = -1;
  }
  for (i = k - 1; i >= 0; i--) {
    if (st[i] == MUON_OK) st[i] = c->vt->join(c->ctx, ticket[i]);
    if (st[i] != MUON_OK && first == MUON_OK) first = st[i];
    b = round_check(&r[i], st[i]);
    if (b < 0) bad = -1;
    else if (bad >= 0) bad += b;
  }
  if (st_out) *st_out = first;
  return bad;
}

/* World ranks of c's members, in group order, by an allgather of each one's world rank. */
static int members_of(muon_comm *c, int world_rank, int *out) {
  return c->vt->allgather(c->ctx, &world_rank, out, sizeof(int)) == MUON_OK;
}

static int fresh_dir(char *buf, size_t n) {
  const char *t = getenv("TMPDIR");
  snprintf(buf, n, "%s/muon-test-XXXXXX", t && *t ? t : "/tmp");
  return mkdtemp(buf) != NULL;
}

static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path) unlink(path);
    }
    closedir(d);
  }
  rmdir(dir);
}

/* ---- fault modes ---------------------------------------------------------------------------- */

/* --die: rank 1 leaves (exit status 0, so muonrun does not stop the others first) after a good
   round; the survivors' next alltoallv must fail with MUON_ERR_COMM quickly, later calls at once.
   --die-started: the survivors' next exchanges are three started ones (queued), in
   flight when they notice: every join fails, none hangs, and the buffers are released. */
static int run_die(muon_comm *w, int started) {
  const int me = w->rank;
  int *members = (int *)malloc((size_t)w->size * sizeof(int));
  muon_status st = MUON_OK;
  double t0, dt;
  long bad;
  int i;
  for (i = 0; i < w->size; i++) members[i] = i;
  begin("die: a good round first");
  CHECK(alltoallv_round(w, members, 0, NULL) == 0, "first round failed: %s", test_comm_error(w));
  CHECK(comm_barrier(w) == MUON_OK, "barrier: %s", test_comm_error(w));
  if (me == 1) {
    fflush(stdout);
    test_exit(0); /* no destroy: like a crash, the kernel closes the sockets */
  }
  begin(started ? "die: survivors' three started exchanges get MUON_ERR_COMM quickly" : "die: survivors get MUON_ERR_COMM quickly");
  t0 = now_s();
  bad = started ? started_rounds(w, members, -1, 3, 0, &st) : alltoallv_round(w, members, -1, &st);
  dt = now_s() - t0;
  CHECK(bad == -1 && st == MUON_ERR_COMM, "alltoallv after rank 1 died: %s (%s)",
        muon_status_string(st), test_comm_error(w));
  CHECK(dt < 2.0, "took %.3f s to notice a dead peer", dt);
  CHECK(strstr(test_comm_error(w), "alltoallv") != NULL, "message does not name the op: %s",
        test_comm_error(w));
  printf("rank %d: dead peer noticed after %.1f ms: %s: %s\n", me, dt * 1e3, muon_status_string(st),
         test_comm_error(w));
  begin("die: the broken comm answers at once, with the same status");
  t0 = now_s();
  st = w->vt->allgather(w->ctx, &me, members, sizeof(int));
  CHECK(st == MUON_ERR_COMM, "allgather on a broken comm: %s", muon_status_string(st));
  if (started) {
    size_t z[64] = {0};
    int ticket = 7;
    st = w->vt->alltoallv(w->ctx, NULL, z, z, NULL, z, z, &ticket);
    CHECK(st == MUON_ERR_COMM && ticket == -1, "alltoallv on a broken comm: %s, ticket %d", muon_status_string(st), ticket);
    st = w->vt->join(w->ctx, 0);
    CHECK(st == MUON_ERR_COMM, "join on a broken comm: %s", muon_status_string(st));
  }
  CHECK(now_s() - t0 < 0.05, "a broken comm took %.3f s to answer", now_s() - t0);
  free(members);
  return 0;
}

/* --stall: rank 1 sleeps 4 s before the round; the others, with a 2 s timeout, must return
   MUON_ERR_TIMEOUT (or MUON_ERR_COMM) within ~2 s + slack; rank 1 then fails at once. */
static int run_stall(muon_comm *w, double timeout) {
  const int me = w->rank;
  int *members = (int *)malloc((size_t)w->size * sizeof(int));
  muon_status st = MUON_OK;
  double t0, dt;
  long bad;
  int i;
  for (i = 0; i < w->size; i++) members[i] = i;
  begin("stall: a good round first");
  CHECK(alltoallv_round(w, members, 0, NULL) == 0, "first round failed: %s", test_comm_error(w));
  begin("stall: a peer late by half the timeout is waited for: the round succeeds");
  if (me == 1) sleep_s(0.5 * timeout);
  t0 = now_s();
  bad = alltoallv_round(w, members, 1, &st);
  dt = now_s() - t0;
  CHECK(bad == 0, "a round with a peer 0.5 x timeout late failed: %s (%s)", muon_status_string(st), test_comm_error(w));
  if (me != 1) CHECK(dt > 0.4 * timeout, "rank %d did not wait for the late peer (%.3f s)", me, dt);
  if (me == 1) sleep_s(2 * timeout);
  begin("stall: the others time out within the timeout + slack");
  t0 = now_s();
  bad = alltoallv_round(w, members, -1, &st);
  dt = now_s() - t0;
  if (me != 1) {
    CHECK(bad == -1 && (st == MUON_ERR_TIMEOUT || st == MUON_ERR_COMM),
          "alltoallv with a stalled peer: %s (%s)", muon_status_string(st), test_comm_error(w));
    CHECK(dt < timeout + 1.5, "took %.3f s with a %.1f s timeout", dt, timeout);
    CHECK(dt > 0.9 * timeout, "gave up after %.3f s, long before the %.1f s timeout", dt, timeout);
    printf("rank %d: stalled peer: returned after %.3f s (timeout %.1f s): %s: %s\n", me, dt,
           timeout, muon_status_string(st), test_comm_error(w));
  } else {
    CHECK(bad == -1 && (st == MUON_ERR_TIMEOUT || st == MUON_ERR_COMM),
          "the late rank's alltoallv: %s (%s)", muon_status_string(st), test_comm_error(w));
    CHECK(dt < timeout + 1.5, "the late rank took %.3f s", dt);
    printf("rank %d (the late one): returned after %.3f s: %s: %s\n", me, dt,
           muon_status_string(st), test_comm_error(w));
  }
  begin("stall: the communicator stays broken: the next call fails at once with the same status and message");
  {
    char first[600];
    muon_status st2 = MUON_OK;
    snprintf(first, sizeof first, "%s", test_comm_error(w));
    t0 = now_s();
    bad = alltoallv_round(w, members, 2, &st2);
    dt = now_s() - t0;
    CHECK(bad == -1 && st2 == st, "after the failure: %s, the failure was %s", muon_status_string(st2), muon_status_string(st));
    CHECK(dt < 0.5, "the call on a broken communicator took %.3f s", dt);
    CHECK(strcmp(first, test_comm_error(w)) == 0, "the message changed: '%s' then '%s'", first, test_comm_error(w));
  }
  free(members);
  return 0;
}

/* ---- RedisStore (MUON_TEST_REDIS=host:port; tests/run_redis.sh starts a private server) ------ */

/* The name muon_gloo_subgroup gives a group of `n` ranks in its store keys: the list spelled out
   ("0,1,2,3") up to 120 characters, hashed ("44:0..43#<FNV-1a>") when longer. */
#define REDIS_LIST_SPELLED_MAX 120
static size_t rank_list_len(const int *ranks, int n) {
  size_t len = 0;
  char buf[16];
  int i;
  for (i = 0; i < n; i++) len += (size_t)snprintf(buf, sizeof buf, "%s%d", i ? "," : "", ranks[i]);
  return len;
}

/* Rank 0 lists the Redis keys under `pattern` (redis-cli --scan) and returns the bracketed
   subgroup name of the first key that starts with `want` (e.g. "run/muon/0["), "" if none. */
static int redis_group_name(const char *pattern, const char *want, char *name, size_t name_size,
                            char *why, size_t why_size) {
  char hostport[256], cmd[1024], line[4096];
  const char *colon;
  FILE *f;
  int found = 0, keys = 0;
  name[0] = 0;
  snprintf(hostport, sizeof hostport, "%s", getenv("MUON_TEST_REDIS"));
  colon = strrchr(hostport, ':');
  if (!colon) {
    snprintf(why, why_size, "MUON_TEST_REDIS '%s' is not host:port", hostport);
    return 0;
  }
  hostport[colon - hostport] = 0;
  snprintf(cmd, sizeof cmd, "timeout 10 redis-cli -h '%s' -p '%s' --scan --pattern '%s' 2>&1",
           hostport, colon + 1, pattern);
  f = popen(cmd, "r");
  if (!f) {
    snprintf(why, why_size, "popen(%s) failed", cmd);
    return 0;
  }
  while (fgets(line, sizeof line, f)) {
    size_t len = strlen(line);
    keys++;
    if (len && line[len - 1] == '\n') line[--len] = 0;
    if (!found && !strncmp(line, want, strlen(want))) {
      const char *s = line + strlen(want), *e = strstr(s, "]/");
      if (e && (size_t)(e - s) < name_size) {
        memcpy(name, s, (size_t)(e - s));
        name[e - s] = 0;
        found = 1;
      }
    }
  }
  if (pclose(f) != 0 && !found) {
    snprintf(why, why_size, "'%.400s' failed (last line: %.200s)", cmd, keys ? line : "none");
    return 0;
  }
  if (!found)
    snprintf(why, why_size, "no key starts with '%.200s' among the %d keys of '%.200s'", want,
             keys, pattern);
  return found;
}

/* Rank 0 of a world of two rendezvousing through the Redis at `spec` with a 2 s timeout: the
   status, and the seconds it took in *dt. */
static muon_status redis_create_timed(const char *spec, muon_comm *x, double *dt) {
  muon_gloo_desc d = muon_gloo_default_desc();
  double t0 = now_s();
  muon_status st;
  d.rank = 0;
  d.size = 2;
  d.redis = spec;
  d.hostname = "127.0.0.1";
  d.timeout_s = 2;
  st = muon_gloo_create(x, &d);
  *dt = now_s() - t0;
  return st;
}

static void run_redis(muon_comm *w, int *members, int *got) {
  const int me = w->rank, n = w->size;
  /* the run's store directory name (muonrun makes a fresh one) is unique: the key prefix */
  const char *store = getenv("MUON_STORE"), *base = store ? strrchr(store, '/') : NULL;
  const char *dead = getenv("MUON_TEST_REDIS_DEAD");
  char spec[512];
  muon_gloo_desc d;
  muon_comm r;
  muon_status st;
  int i, have_r = 0;
  base = base ? base + 1 : store ? store : "muon-test";
  if (!dead || !*dead) dead = "127.0.0.1:1"; /* tcpmux: nothing listens there */

  begin("redis: a world through RedisStore");
  if (!muon_gloo_has_redis()) {
    CHECK(0, "MUON_TEST_REDIS is set but this build has no RedisStore");
    return;
  }
  d = muon_gloo_default_desc();
  snprintf(spec, sizeof spec, "%s/%s", getenv("MUON_TEST_REDIS"), base);
  d.redis = spec;
  d.hostname = "127.0.0.1";
  d.timeout_s = 10;
  st = muon_gloo_create(&r, &d);
  CHECK(st == MUON_OK, "redis create: %s", muon_error(NULL));
  if (st == MUON_OK) {
    have_r = 1;
    CHECK(members_of(&r, me, got), "allgather: %s", test_comm_error(&r));
    for (i = 0; i < n; i++) CHECK(got[i] == i, "member %d is %d", i, got[i]);
    CHECK(alltoallv_round(&r, members, 7, &st) == 0, "alltoallv: %s", test_comm_error(&r));
  }

  begin("redis: a dead Redis (nothing listens) is MUON_ERR_BACKEND naming it, within the timeout");
  {
    muon_comm x;
    double dt;
    st = redis_create_timed(dead, &x, &dt);
    CHECK(st == MUON_ERR_BACKEND, "dead Redis %s: %s: %s", dead, muon_status_string(st), muon_error(NULL));
    CHECK(strstr(muon_error(NULL), "Redis") && strstr(muon_error(NULL), dead), "the message names neither Redis nor %s: %s",
          dead, muon_error(NULL));
    CHECK(dt < 2.0 + 3.0, "took %.3f s with a 2 s timeout", dt);
    CHECK(x.vt == NULL && x.ctx == NULL, "out not cleared on failure");
    if (me == 0)
      printf("dead Redis %s: %s after %.3f s: %s\n", dead, muon_status_string(st), dt, muon_error(NULL));
    if (st == MUON_OK) muon_comm_destroy(&x);
  }

  begin("redis: a Redis that accepts and never answers is an error within the timeout, not a hang");
  {   /* a listening socket nobody reads: the connection succeeds, every command waits */
    muon_comm x;
    double dt;
    char spec[64];
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 && listen(s, 16) == 0 &&
          getsockname(s, (struct sockaddr *)&a, &len) == 0, "a listening socket");
    snprintf(spec, sizeof spec, "127.0.0.1:%d", ntohs(a.sin_port));
    st = redis_create_timed(spec, &x, &dt);
    CHECK(st == MUON_ERR_TIMEOUT || st == MUON_ERR_BACKEND || st == MUON_ERR_COMM, "silent Redis %s: %s: %s", spec, muon_status_string(st), muon_error(NULL));
    CHECK(strstr(muon_error(NULL), spec) != NULL, "the message does not name %s: %s", spec, muon_error(NULL));
    CHECK(dt < 2.0 + 3.0, "took %.3f s with a 2 s timeout", dt);
    if (me == 0) printf("silent Redis %s: %s after %.3f s\n", spec, muon_status_string(st), dt);
    if (st == MUON_OK) muon_comm_destroy(&x);
    if (s >= 0) close(s);
  }

  /* two lists of every rank with the same length, first and last rank: only the hash differs */
  if (rank_list_len(members, n) > REDIS_LIST_SPELLED_MAX) {
    int *swapped = (int *)malloc((size_t)n * sizeof(int));
    const int *lists[2];
    muon_comm g[2];
    char names[2][256], want[600], pattern[600], why[1200];
    int k;
    begin("redis: subgroups with long rank lists (hashed names): exchange, distinct short names");
    CHECK(have_r, "no world through Redis to split");
    for (i = 0; i < n; i++) swapped[i] = i;
    swapped[1] = 2;
    swapped[2] = 1;
    lists[0] = members;
    lists[1] = swapped;
    for (k = 0; k < 2 && have_r; k++) {
      int pos = -1;
      for (i = 0; i < n; i++)
        if (lists[k][i] == me) pos = i;
      st = muon_gloo_subgroup(&g[k], &r, lists[k], n);
      CHECK(st == MUON_OK, "subgroup %d: %s", k, muon_error(NULL));
      if (st != MUON_OK) continue;
      CHECK(g[k].rank == pos && g[k].size == n, "subgroup %d: rank %d size %d, want %d %d", k,
            g[k].rank, g[k].size, pos, n);
      CHECK(members_of(&g[k], me, got), "subgroup %d allgather: %s", k, test_comm_error(&g[k]));
      for (i = 0; i < n; i++)
        CHECK(got[i] == lists[k][i], "subgroup %d: member %d is %d, want %d", k, i, got[i],
              lists[k][i]);
      CHECK(alltoallv_round(&g[k], lists[k], 11 + k, &st) == 0, "subgroup %d alltoallv: %s", k,
            test_comm_error(&g[k]));
    }
    /* every rank has set its keys of both groups (rank 0 exchanged with all in each) */
    if (me == 0 && have_r) {
      char head[64];
      snprintf(head, sizeof head, "%d:%d..%d#", n, 0, n - 1);
      snprintf(pattern, sizeof pattern, "%s/muon/*", base);
      for (k = 0; k < 2; k++) {
        snprintf(want, sizeof want, "%s/muon/%d[", base, k); /* the k-th subgroup of r */
        CHECK(redis_group_name(pattern, want, names[k], sizeof names[k], why, sizeof why),
              "subgroup %d: %s", k, why);
        CHECK(!strncmp(names[k], head, strlen(head)) && strlen(names[k]) > strlen(head) &&
              strlen(names[k]) < 64, "subgroup %d: key name '[%s]' is not the hashed '%s<hash>'",
              k, names[k], head);
        printf("redis: subgroup %d of %d ranks (list of %zu characters) has keys '%s%s]/*'\n", k,
               n, rank_list_len(lists[k], n), want, names[k]);
      }
      CHECK(strcmp(names[0], names[1]) != 0, "two different lists got the same name '%s'",
            names[0]);
    }
    for (k = 0; k < 2 && have_r; k++) muon_comm_destroy(&g[k]);
    free(swapped);
  } else if (me == 0) {
    printf("redis: hashed subgroup names need a rank list over %d characters (44 ranks); "
           "tests/run_redis.sh runs test_gloo --redis on 44\n", REDIS_LIST_SPELLED_MAX);
  }
  if (have_r) muon_comm_destroy(&r);
}

/* ---- the normal run --------------------------------------------------------------------------- */

static void run_normal(muon_comm *w) {
  const int me = w->rank, n = w->size;
  int *members = (int *)malloc((size_t)n * sizeof(int)), *got = (int *)malloc((size_t)n * sizeof(int));
  int i, it;
  muon_status st;

  begin("world: vtable, rank and size");
  CHECK(w->vt && w->vt->version == MUON_COMM_VTABLE_VERSION, "vtable version");
  CHECK(w->vt->alltoallv && w->vt->allgather && w->vt->error && w->vt->destroy,
        "a slot is NULL");
  CHECK(n == atoi(getenv("MUON_WORLD_SIZE")) && me == atoi(getenv("MUON_RANK")), "rank %d size %d",
        me, n);
  for (i = 0; i < n; i++) members[i] = i;

  begin("world: alltoallv, random counts with zeros, an all-zero sender and receiver");
  for (it = 0; it < 12; it++) {
    long bad = alltoallv_round(w, members, it, &st);
    CHECK(bad == 0, "round %d: %ld wrong floats, status %s: %s", it, bad, muon_status_string(st),
          test_comm_error(w));
  }

  begin("world: alltoallv with every count zero");
  {
    size_t *z = (size_t *)calloc((size_t)n, sizeof(size_t));
    float dummy = 7.0f;
    st = muon_comm_alltoallv(w, &dummy, z, z, &dummy, z, z);
    CHECK(st == MUON_OK && dummy == 7.0f, "all-zero alltoallv: %s", muon_status_string(st));
    st = muon_comm_alltoallv(w, NULL, z, z, NULL, z, z);
    CHECK(st == MUON_OK, "all-zero alltoallv with NULL buffers: %s", muon_status_string(st));
    free(z);
  }

  begin("world: allgather");
  {
    unsigned char mine[13], *all = (unsigned char *)malloc((size_t)n * 13);
    int bad = 0, k;
    for (k = 0; k < 13; k++) mine[k] = (unsigned char)(me * 17 + k);
    st = w->vt->allgather(w->ctx, mine, all, 13);
    CHECK(st == MUON_OK, "allgather: %s", test_comm_error(w));
    for (i = 0; i < n; i++)
      for (k = 0; k < 13; k++) bad += all[i * 13 + k] != (unsigned char)(i * 17 + k);
    CHECK(bad == 0, "%d wrong bytes", bad);
    st = w->vt->allgather(w->ctx, NULL, NULL, 0);
    CHECK(st == MUON_OK, "allgather of 0 bytes: %s", muon_status_string(st));
    free(all);
  }

  begin("world: allgather waits for the slowest rank");
  {
    double t0 = now_s(), dt;
    if (me == n - 1) sleep_s(0.3);
    st = comm_barrier(w);
    dt = now_s() - t0;
    CHECK(st == MUON_OK, "barrier: %s", test_comm_error(w));
    CHECK(n == 1 || dt > 0.25, "left the barrier after %.3f s, before the last rank came", dt);
  }

  begin("world: queued by default: 4 exchanges in flight at once, joined in reverse order");
  CHECK(w->vt->queued && w->vt->join && w->vt->finish, "not queued, or join / finish missing");
  if (w->vt->queued) {
    long bad = started_rounds(w, members, 30, 4, 1, &st);
    CHECK(bad == 0, "%ld wrong floats, status %s: %s", bad, muon_status_string(st), test_comm_error(w));
    bad = started_rounds(w, members, 3, 1, 1, &st);   /* round 3: large messages */
    CHECK(bad == 0, "large round: %ld wrong floats, status %s: %s", bad, muon_status_string(st), test_comm_error(w));
  }

  begin("world: 64 exchanges in flight; a 65th is MUON_ERR_ARG; bad tickets are MUON_ERR_ARG; finish; the comm still works");
  if (w->vt->queued) {
    round_io r[MAX_STARTED];
    int ticket[MAX_STARTED], k, ok = 1, extra = 7;
    size_t z = 0;
    for (k = 0; k < 64; k++) {
      round_make(&r[k], w, members, 40 + k);
      if (w->vt->alltoallv(w->ctx, r[k].send, r[k].sc, r[k].sd, r[k].recv, r[k].rc, r[k].rd, &ticket[k]) != MUON_OK) ok = 0;
    }
    CHECK(ok, "starting 64: %s", test_comm_error(w));
    round_make(&r[64], w, members, 104);
    st = w->vt->alltoallv(w->ctx, r[64].send, r[64].sc, r[64].sd, r[64].recv, r[64].rc, r[64].rd, &extra);
    CHECK(st == MUON_ERR_ARG && extra == -1 && strstr(test_comm_error(w), "not joined"), "a 65th start: %s, ticket %d: %s",
          muon_status_string(st), extra, test_comm_error(w));
    round_check(&r[64], MUON_ERR_ARG);
    for (k = 0; k < 32; k++) {
      long bad = round_check(&r[k], ok ? w->vt->join(w->ctx, ticket[k]) : MUON_ERR_ARG);
      if (bad) ok = 0;
    }
    st = w->vt->finish(w->ctx);   /* the other 32 have arrived when it returns ... */
    CHECK(st == MUON_OK, "finish: %s", test_comm_error(w));
    for (k = 32; k < 64; k++)
      if (round_check(&r[k], ok ? st : MUON_ERR_ARG)) ok = 0;
    for (k = 32; k < 64; k++)     /* ... and are still joined once */
      if (w->vt->join(w->ctx, ticket[k]) != MUON_OK) ok = 0;
    CHECK(ok, "the 64 exchanges (32 joined, 32 finished then joined): %s", test_comm_error(w));
    st = w->vt->join(w->ctx, ticket[0]);
    CHECK(st == MUON_ERR_ARG && strstr(test_comm_error(w), "not a started exchange"), "joining twice: %s: %s",
          muon_status_string(st), test_comm_error(w));
    st = w->vt->join(w->ctx, -1);
    CHECK(st == MUON_ERR_ARG, "join(-1): %s", muon_status_string(st));
    st = w->vt->join(w->ctx, 64);
    CHECK(st == MUON_ERR_ARG, "join(64): %s", muon_status_string(st));
    st = w->vt->alltoallv(w->ctx, NULL, &z, &z, NULL, &z, &z, NULL);
    CHECK(st == MUON_ERR_ARG, "a NULL ticket: %s", muon_status_string(st));
    extra = 7;
    st = w->vt->alltoallv(w->ctx, NULL, NULL, NULL, NULL, NULL, NULL, &extra);
    CHECK(st == MUON_ERR_ARG && extra == -1 && strstr(test_comm_error(w), "NULL"), "NULL counts: %s, ticket %d: %s",
          muon_status_string(st), extra, test_comm_error(w));
    CHECK(alltoallv_round(w, members, 5, &st) == 0, "the comm after the misuse: %s", test_comm_error(w));
  }

  begin("subgroup: evens and odds made at the same call index");
  {
    int par[1024], np = 0;
    muon_comm g;
    for (i = me % 2; i < n; i += 2) par[np++] = i;
    st = muon_gloo_subgroup(&g, w, par, np);
    CHECK(st == MUON_OK, "subgroup: %s", muon_error(NULL));
    if (st == MUON_OK) {
      CHECK(g.size == np && g.rank == me / 2, "rank %d size %d", g.rank, g.size);
      CHECK(members_of(&g, me, got), "allgather: %s", test_comm_error(&g));
      for (i = 0; i < np; i++) CHECK(got[i] == par[i], "member %d is %d, want %d", i, got[i], par[i]);
      for (it = 0; it < 6; it++)
        CHECK(alltoallv_round(&g, par, it, &st) == 0, "round %d: %s", it, test_comm_error(&g));
      CHECK(g.vt->queued && started_rounds(&g, par, 60, 3, 1, &st) == 0, "3 started: %s", test_comm_error(&g));
      muon_comm_destroy(&g);
    }
  }

  begin("subgroup: reversed rank list renumbers the ranks");
  {
    int *rev = (int *)malloc((size_t)n * sizeof(int));
    muon_comm g;
    for (i = 0; i < n; i++) rev[i] = n - 1 - i;
    st = muon_gloo_subgroup(&g, w, rev, n);
    CHECK(st == MUON_OK, "subgroup: %s", muon_error(NULL));
    if (st == MUON_OK) {
      CHECK(g.rank == n - 1 - me && g.size == n, "rank %d size %d", g.rank, g.size);
      CHECK(members_of(&g, me, got), "allgather: %s", test_comm_error(&g));
      for (i = 0; i < n; i++) CHECK(got[i] == rev[i], "member %d is %d, want %d", i, got[i], rev[i]);
      CHECK(alltoallv_round(&g, rev, 5, &st) == 0, "alltoallv: %s", test_comm_error(&g));
      muon_comm_destroy(&g);
    }
    free(rev);
  }

  begin("subgroup: a group of one needs nobody");
  {
    muon_comm g;
    st = muon_gloo_subgroup(&g, w, &me, 1);
    CHECK(st == MUON_OK && g.size == 1 && g.rank == 0, "subgroup {me}: %s", muon_error(NULL));
    if (st == MUON_OK) {
      CHECK(alltoallv_round(&g, &me, 2, &st) == 0, "alltoallv: %s", test_comm_error(&g));
      CHECK(comm_barrier(&g) == MUON_OK, "barrier");
      muon_comm_destroy(&g);
    }
  }

  begin("subgroup: bad arguments are MUON_ERR_ARG, not a crash");
  {
    muon_comm g, self = {NULL, NULL, 0, 1};
    int other = (me + 1) % n, dup[2] = {me, me}, dims[2] = {n, 2};
    if (n > 1) {
      st = muon_gloo_subgroup(&g, w, &other, 1);
      CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "not in"), "group without this rank: %s %s",
            muon_status_string(st), muon_error(NULL));
    }
    st = muon_gloo_subgroup(&g, w, dup, 2);
    CHECK(st == MUON_ERR_ARG, "duplicate rank: %s %s", muon_status_string(st), muon_error(NULL));
    st = muon_gloo_subgroup(&g, w, members, 0);
    CHECK(st == MUON_ERR_ARG, "n = 0: %s", muon_status_string(st));
    st = muon_gloo_subgroup(&g, &self, members, 1);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "not a Gloo"), "non-Gloo parent: %s", muon_error(NULL));
    st = muon_gloo_mesh_subgroup(&g, w, dims, 2, 0);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "mesh"), "mesh of the wrong size: %s", muon_error(NULL));
    CHECK(g.vt == NULL && g.ctx == NULL, "out not cleared on failure");
  }

  if (n % 2 == 0 && n >= 4) {
    int dims[2], tpm[1024], dpm[1024];
    muon_comm tp, dp;
    muon_status s1, s2;
    dims[0] = 2;
    dims[1] = n / 2;
    begin("mesh: {2, n/2}: dim 1 = consecutive ranks (tp), dim 0 = strided ranks (dp)");
    s1 = muon_gloo_mesh_subgroup(&tp, w, dims, 2, 1);
    CHECK(s1 == MUON_OK, "tp: %s", muon_error(NULL));
    s2 = muon_gloo_mesh_subgroup(&dp, w, dims, 2, 0);
    CHECK(s2 == MUON_OK, "dp: %s", muon_error(NULL));
    if (s1 == MUON_OK && s2 == MUON_OK) {
      CHECK(tp.size == n / 2 && tp.rank == me % (n / 2), "tp rank %d size %d", tp.rank, tp.size);
      CHECK(dp.size == 2 && dp.rank == me / (n / 2), "dp rank %d size %d", dp.rank, dp.size);
      CHECK(members_of(&tp, me, tpm) && members_of(&dp, me, dpm), "allgather");
      for (i = 0; i < tp.size; i++)
        CHECK(tpm[i] == (me / (n / 2)) * (n / 2) + i, "tp member %d is %d", i, tpm[i]);
      for (i = 0; i < dp.size; i++)
        CHECK(dpm[i] == me % (n / 2) + i * (n / 2), "dp member %d is %d", i, dpm[i]);

      begin("mesh: tp, dp and world used interleaved");
      for (it = 0; it < 8; it++) {
        unsigned char b = (unsigned char)(it * 3 + me), all[2];
        CHECK(alltoallv_round(&tp, tpm, it, &st) == 0, "tp round %d: %s", it, test_comm_error(&tp));
        CHECK(dp.vt->allgather(dp.ctx, &b, all, 1) == MUON_OK, "dp allgather: %s",
              test_comm_error(&dp));
        CHECK(all[0] == (unsigned char)(it * 3 + dpm[0]) && all[1] == (unsigned char)(it * 3 + dpm[1]),
              "dp allgather round %d: %d %d", it, all[0], all[1]);
        CHECK(alltoallv_round(&dp, dpm, it + 1, &st) == 0, "dp round %d: %s", it,
              test_comm_error(&dp));
        CHECK(alltoallv_round(w, members, it + 2, &st) == 0, "world round %d: %s", it,
              test_comm_error(w));
        CHECK(comm_barrier(&tp) == MUON_OK, "tp barrier");
      }

      begin("mesh: a subgroup of a subgroup (tp split again)");
      if (tp.size % 2 == 0) {
        int half[2] = {tp.rank & ~1, tp.rank | 1}, hm[2];
        muon_comm h;
        st = muon_gloo_subgroup(&h, &tp, half, 2);
        CHECK(st == MUON_OK, "subgroup of tp: %s", muon_error(NULL));
        if (st == MUON_OK) {
          CHECK(members_of(&h, me, hm) && hm[0] == tpm[half[0]] && hm[1] == tpm[half[1]],
                "members %d %d", hm[0], hm[1]);
          CHECK(alltoallv_round(&h, hm, 4, &st) == 0, "alltoallv: %s", test_comm_error(&h));
          muon_comm_destroy(&h);
        }
      }
      muon_comm_destroy(&tp);
      muon_comm_destroy(&dp);
    }
  }

  if (n == 8) {
    int dims[3] = {2, 2, 2}, d, c3[3], m[2], want;
    muon_comm g;
    begin("mesh: 2x2x2, each dimension");
    c3[0] = me / 4; c3[1] = (me / 2) % 2; c3[2] = me % 2;
    for (d = 0; d < 3; d++) {
      st = muon_gloo_mesh_subgroup(&g, w, dims, 3, d);
      CHECK(st == MUON_OK, "dim %d: %s", d, muon_error(NULL));
      if (st != MUON_OK) continue;
      CHECK(g.rank == c3[d] && g.size == 2, "dim %d: rank %d", d, g.rank);
      CHECK(members_of(&g, me, m), "allgather");
      for (i = 0; i < 2; i++) {
        int cc[3];
        cc[0] = c3[0]; cc[1] = c3[1]; cc[2] = c3[2];
        cc[d] = i;
        want = cc[0] * 4 + cc[1] * 2 + cc[2];
        CHECK(m[i] == want, "dim %d member %d is %d, want %d", d, i, m[i], want);
      }
      muon_comm_destroy(&g);
    }
  }

  begin("MUON_GLOO_CHECK_COUNTS=1: disagreeing counts are MUON_ERR_MISMATCH on every rank");
  if (n > 1) {
    muon_comm g;
    setenv("MUON_GLOO_CHECK_COUNTS", "1", 1);
    st = muon_gloo_subgroup(&g, w, members, n);
    unsetenv("MUON_GLOO_CHECK_COUNTS");
    CHECK(st == MUON_OK, "subgroup: %s", muon_error(NULL));
    if (st == MUON_OK) {
      size_t *sc = (size_t *)calloc((size_t)n, sizeof(size_t)), *rc = (size_t *)calloc((size_t)n, sizeof(size_t));
      size_t *dz = (size_t *)calloc((size_t)n, sizeof(size_t));
      float buf[4] = {1, 2, 3, 4}, out[4];
      if (me == 0) sc[1] = 4; /* rank 1 expects 2: Gloo alone would abort rank 1 */
      if (me == 1) rc[0] = 2;
      st = muon_comm_alltoallv(&g, buf, sc, dz, out, rc, dz);
      CHECK(st == MUON_ERR_MISMATCH, "mismatched counts: %s (%s)", muon_status_string(st),
            test_comm_error(&g));
      if (me == 1) printf("rank 1: %s\n", test_comm_error(&g));
      CHECK(alltoallv_round(&g, members, 9, &st) == 0, "the comm still works after: %s",
            test_comm_error(&g));
      free(sc); free(rc); free(dz);
      muon_comm_destroy(&g);
    }
  }

  begin("one rank: explicit size 1 needs no store and copies locally; desc.blocking = 1 makes alltoallv blocking");
  {
    int blocking;
    for (blocking = 0; blocking < 2; blocking++) {
      muon_gloo_desc d = muon_gloo_default_desc();
      muon_comm one;
      int zero = 0;
      d.rank = 0;
      d.size = 1;
      d.store_dir = NULL;
      d.blocking = blocking;
      st = muon_gloo_create(&one, &d);
      CHECK(st == MUON_OK && one.size == 1, "create (blocking %d): %s", blocking, muon_error(NULL));
      if (st != MUON_OK) continue;
      CHECK(alltoallv_round(&one, &zero, 1, &st) == 0, "alltoallv: %s", test_comm_error(&one));
      if (blocking)   /* async then uses muon's communication thread */
        CHECK(!one.vt->queued && !one.vt->join && one.vt->version == MUON_COMM_VTABLE_VERSION, "blocking is queued");
      else
        CHECK(started_rounds(&one, &zero, 2, 2, 1, &st) == 0, "started: %s", test_comm_error(&one));
      muon_comm_destroy(&one);
    }
  }

  begin("store trap: keys of an earlier run are refused with a clear message");
  if (n > 1 && me == 0) {
    /* rank 0's world key is already in MUON_STORE: a second world there must fail at once */
    muon_gloo_desc d = muon_gloo_default_desc();
    muon_comm x;
    double t0 = now_s();
    d.rank = 0;
    d.size = 2;
    d.timeout_s = 5;
    st = muon_gloo_create(&x, &d);
    CHECK(st != MUON_OK && strstr(muon_error(NULL), "earlier run"), "reused store: %s: %s",
          muon_status_string(st), muon_error(NULL));
    CHECK(now_s() - t0 < 1.0, "took %.3f s", now_s() - t0);
    if (st == MUON_OK) muon_comm_destroy(&x);
  }

  begin("store trap: a missing peer at rendezvous times out after the configured 1 s, not 30 s");
  {
    char dir[4096];
    muon_gloo_desc d = muon_gloo_default_desc();
    muon_comm x;
    double t0, dt;
    CHECK(fresh_dir(dir, sizeof dir), "mkdtemp");
    d.rank = 0;
    d.size = 2;
    d.store_dir = dir;
    d.timeout_s = 1;
    t0 = now_s();
    st = muon_gloo_create(&x, &d);
    dt = now_s() - t0;
    CHECK(st == MUON_ERR_TIMEOUT, "alone at rendezvous: %s: %s", muon_status_string(st), muon_error(NULL));
    CHECK(dt < 3.5, "took %.3f s", dt);
    if (me == 0) printf("rendezvous timeout (1 s configured) after %.3f s: %s\n", dt, muon_error(NULL));
    if (st == MUON_OK) muon_comm_destroy(&x);
    remove_dir(dir);
  }

  begin("create: bad desc fields are MUON_ERR_ARG naming the field");
  {
    muon_gloo_desc d = muon_gloo_default_desc();
    muon_comm x;
    d.rank = 3;
    d.size = 2;
    st = muon_gloo_create(&x, &d);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "rank 3"), "rank >= size: %s", muon_error(NULL));
    d = muon_gloo_default_desc();
    d.timeout_s = -1;
    st = muon_gloo_create(&x, &d);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "timeout_s"), "negative timeout: %s", muon_error(NULL));
    d = muon_gloo_default_desc();
    d.store_dir = "/nonexistent/muon";
    d.rank = 0;
    d.size = 2;
    st = muon_gloo_create(&x, &d);
    CHECK(st == MUON_ERR_BACKEND && strstr(muon_error(NULL), "/nonexistent/muon"), "missing dir: %s", muon_error(NULL));
    st = muon_gloo_create(&x, NULL);
    CHECK(st == MUON_ERR_ARG, "NULL desc");
    d = muon_gloo_default_desc();
    d.rank = 0; d.size = 2; d.store_dir = "/tmp"; d.redis = "127.0.0.1:6379";
    st = muon_gloo_create(&x, &d);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "not both"), "store_dir and redis: %s", muon_error(NULL));
    if (muon_gloo_has_redis()) {
      d.store_dir = NULL; d.redis = "127.0.0.1:http";
      st = muon_gloo_create(&x, &d);
      CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "bad port"), "redis port: %s", muon_error(NULL));
      d.redis = ":6379";
      st = muon_gloo_create(&x, &d);
      CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "no host"), "redis host: %s", muon_error(NULL));
    }
    {
      /* The environment's turn: a bad MUON_RANK / MUON_GLOO_TIMEOUT, each named, then restored. */
      char *old_rank = getenv("MUON_RANK") ? strdup(getenv("MUON_RANK")) : NULL;
      char *old_timeout = getenv("MUON_GLOO_TIMEOUT") ? strdup(getenv("MUON_GLOO_TIMEOUT")) : NULL;
      d = muon_gloo_default_desc();
      setenv("MUON_RANK", "two", 1);
      st = muon_gloo_create(&x, &d);
      CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "MUON_RANK='two'"), "MUON_RANK=two: %s", muon_error(NULL));
      if (old_rank) setenv("MUON_RANK", old_rank, 1); else unsetenv("MUON_RANK");
      d.rank = 0; d.size = 2; d.store_dir = "/tmp";
      setenv("MUON_GLOO_TIMEOUT", "soon", 1);
      st = muon_gloo_create(&x, &d);
      CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "MUON_GLOO_TIMEOUT='soon'"), "MUON_GLOO_TIMEOUT=soon: %s", muon_error(NULL));
      if (old_timeout) setenv("MUON_GLOO_TIMEOUT", old_timeout, 1); else unsetenv("MUON_GLOO_TIMEOUT");
      free(old_rank);
      free(old_timeout);
    }
    {
      /* No launcher variables at all, then no rendezvous named anywhere, then MUON_REDIS from
         the environment: each a clear MUON_ERR_ARG. Every variable is restored after. */
      static const char *const names[] = {"MUON_RANK", "MUON_WORLD_SIZE", "RANK", "WORLD_SIZE",
                                          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                          "MUON_STORE", "MUON_REDIS"};
      char *old[8];
      int k;
      for (k = 0; k < 8; k++) {
        old[k] = getenv(names[k]) ? strdup(getenv(names[k])) : NULL;
        unsetenv(names[k]);
      }
      d = muon_gloo_default_desc();
      st = muon_gloo_create(&x, &d);
      CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "rank is -1") && strstr(muon_error(NULL), "none of MUON_RANK"), "no launcher: %s", muon_error(NULL));
      d.rank = 1;
      st = muon_gloo_create(&x, &d);
      CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "size is -1"), "rank set, size from nowhere: %s", muon_error(NULL));
      d.rank = 0; d.size = 2;
      setenv("MUON_STORE", "", 1);   /* empty counts as unset */
      st = muon_gloo_create(&x, &d);
      CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "need a rendezvous"), "no store: %s", muon_error(NULL));
      if (muon_gloo_has_redis()) {
        setenv("MUON_REDIS", "127.0.0.1:http", 1);
        st = muon_gloo_create(&x, &d);
        CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "bad port"), "MUON_REDIS with a bad port: %s", muon_error(NULL));
      }
      for (k = 0; k < 8; k++) {
        if (old[k]) setenv(names[k], old[k], 1); else unsetenv(names[k]);
        free(old[k]);
      }
    }
    /* NULL out is named; NULL everything is refused without a crash; a failed create clears
       the fields of a live comm it is given. */
    d = muon_gloo_default_desc();
    d.rank = 0; d.size = 1;
    st = muon_gloo_create(NULL, &d);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "out is NULL"), "NULL out: %s %s", muon_status_string(st), muon_error(NULL));
    st = muon_gloo_create(NULL, NULL);
    CHECK(st == MUON_ERR_ARG, "NULL desc and out: %s", muon_status_string(st));
    d.rank = 3; d.size = 2;
    x = *w;   /* a live comm's fields: a failed create must clear them */
    st = muon_gloo_create(&x, &d);
    CHECK(st == MUON_ERR_ARG, "rank 3 of 2: %s", muon_status_string(st));
    CHECK(x.vt == NULL && x.ctx == NULL && x.size == 0, "out not cleared on failure");
  }

  begin("create: muon_error(NULL) says why a create or subgroup failed (status and function first); a success clears it");
  {
    static const char want_create[] = "MUON_ERR_ARG: muon_gloo_create: ";
    static const char want_mesh[] = "MUON_ERR_ARG: muon_gloo_mesh_subgroup: ";
    muon_gloo_desc d = muon_gloo_default_desc();
    muon_comm x, g, self = {NULL, NULL, 0, 1};
    int one[1] = {1};
    d.rank = 5;
    d.size = 2;
    st = muon_gloo_create(&x, &d);
    CHECK(st == MUON_ERR_ARG && strncmp(muon_error(NULL), want_create, sizeof want_create - 1) == 0 &&
          strstr(muon_error(NULL), "rank 5 is not in [0, size 2)"), "rank 5 of 2: %s: %s", muon_status_string(st), muon_error(NULL));
    CHECK(x.vt == NULL && x.ctx == NULL, "out not cleared on failure");
    st = muon_gloo_subgroup(&g, w, &me, 1);
    CHECK(st == MUON_OK && strstr(muon_error(NULL), "rank 5") == NULL, "after a subgroup that worked: %s: '%s'",
          muon_status_string(st), muon_error(NULL));
    if (st == MUON_OK) muon_comm_destroy(&g);
    /* a mesh's refusal names muon_gloo_mesh_subgroup, even where its subgroup step refuses */
    st = muon_gloo_mesh_subgroup(&g, &self, one, 1, 0);
    CHECK(st == MUON_ERR_ARG && strncmp(muon_error(NULL), want_mesh, sizeof want_mesh - 1) == 0 &&
          strstr(muon_error(NULL), "not a Gloo communicator"), "mesh over a non-Gloo parent: %s", muon_error(NULL));
  }

  begin("create: the TCP device's host comes from desc.hostname, else MUON_GLOO_HOST, else 127.0.0.1");
  {
    /* 192.0.2.1 (TEST-NET-1, RFC 5737) is never a local address: binding to it fails before any
       rendezvous, so each refused create is local to this rank. */
    char dir[4096];
    char *old_host = getenv("MUON_GLOO_HOST") ? strdup(getenv("MUON_GLOO_HOST")) : NULL;
    muon_gloo_desc d = muon_gloo_default_desc();
    muon_comm x;
    double t0;
    CHECK(fresh_dir(dir, sizeof dir), "mkdtemp");
    d.rank = 0; d.size = 2; d.store_dir = dir; d.timeout_s = 5;
    d.hostname = "192.0.2.1";
    setenv("MUON_GLOO_HOST", "", 1);
    st = muon_gloo_create(&x, &d);
    CHECK(st == MUON_ERR_BACKEND && strstr(muon_error(NULL), "TCP device on '192.0.2.1'") && strstr(muon_error(NULL), "MUON_GLOO_HOST"),
          "desc.hostname 192.0.2.1: %s %s", muon_status_string(st), muon_error(NULL));
    if (st == MUON_OK) muon_comm_destroy(&x);
    d.hostname = "";   /* empty counts as unset: the environment's host is used */
    setenv("MUON_GLOO_HOST", "192.0.2.1", 1);
    st = muon_gloo_create(&x, &d);
    CHECK(st == MUON_ERR_BACKEND && strstr(muon_error(NULL), "TCP device on '192.0.2.1'"),
          "MUON_GLOO_HOST=192.0.2.1: %s %s", muon_status_string(st), muon_error(NULL));
    if (st == MUON_OK) muon_comm_destroy(&x);
    /* both empty: 127.0.0.1, whose device works; alone at the rendezvous it times out (0.1 s) */
    setenv("MUON_GLOO_HOST", "", 1);
    d.timeout_s = 0.1;
    t0 = now_s();
    st = muon_gloo_create(&x, &d);
    CHECK(st == MUON_ERR_TIMEOUT && strstr(muon_error(NULL), "rendezvous of rank 0 of 2") && strstr(muon_error(NULL), "timed out"),
          "MUON_GLOO_HOST empty: %s %s", muon_status_string(st), muon_error(NULL));
    CHECK(now_s() - t0 < 2.0, "took %.3f s", now_s() - t0);
    if (st == MUON_OK) muon_comm_destroy(&x);
    if (old_host) setenv("MUON_GLOO_HOST", old_host, 1); else unsetenv("MUON_GLOO_HOST");
    free(old_host);
    remove_dir(dir);
  }

  begin("collectives: bad arguments are MUON_ERR_ARG naming what is wrong; the comm still works");
  {
    size_t *cnt = (size_t *)calloc(4 * (size_t)n, sizeof(size_t)), *sc = cnt, *sd = cnt + n, *rc = cnt + 2 * n, *rd = cnt + 3 * n;
    float one = 1.0f, back = 0.0f;
    int dims0[2] = {n, 0}, ticket = -1;
    muon_comm g;
    st = muon_comm_alltoallv(w, &one, NULL, sd, &back, rc, rd);
    CHECK(st == MUON_ERR_ARG && strstr(test_comm_error(w), "NULL"), "NULL counts: %s", test_comm_error(w));
    sc[me] = 1;
    st = muon_comm_alltoallv(w, NULL, sc, sd, &back, rc, rd);
    CHECK(st == MUON_ERR_ARG && strstr(test_comm_error(w), "send is NULL"), "NULL send with a count: %s", test_comm_error(w));
    st = muon_comm_alltoallv(w, &one, sc, sd, &back, rc, rd);
    CHECK(st == MUON_ERR_ARG && strstr(test_comm_error(w), "to itself"), "self send 1, receive 0: %s", test_comm_error(w));
    sd[me] = (size_t)-1 / 2;
    rc[me] = 1;
    st = muon_comm_alltoallv(w, &one, sc, sd, &back, rc, rd);
    CHECK(st == MUON_ERR_ARG && strstr(test_comm_error(w), "too large"), "huge displacement: %s", test_comm_error(w));
    st = w->vt->allgather(w->ctx, &one, NULL, sizeof one);
    CHECK(st == MUON_ERR_ARG && strstr(test_comm_error(w), "recv is NULL"), "allgather NULL recv: %s", test_comm_error(w));
    if (n > 1) {
      st = w->vt->allgather(w->ctx, &one, &back, (size_t)-1 / (size_t)n + 1);   /* n times it overflows */
      CHECK(st == MUON_ERR_ARG && strstr(test_comm_error(w), "overflows"), "allgather overflow: %s", test_comm_error(w));
    }
    st = muon_gloo_subgroup(&g, NULL, members, 1);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "parent"), "NULL parent: %s", muon_error(NULL));
    dims0[0] = n + 7;
    st = muon_gloo_subgroup(&g, w, dims0, 1);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "not a rank"), "rank out of range: %s", muon_error(NULL));
    st = muon_gloo_mesh_subgroup(&g, w, NULL, 2, 0);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "dims"), "NULL dims: %s", muon_error(NULL));
    st = muon_gloo_mesh_subgroup(&g, w, dims0, 0, 0);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "ndims"), "ndims 0: %s", muon_error(NULL));
    dims0[0] = n; dims0[1] = 0;
    st = muon_gloo_mesh_subgroup(&g, w, dims0, 2, 0);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "must be >= 1"), "dims[1] = 0: %s", muon_error(NULL));
    /* each NULL pointer named, in the order checked; all of them NULL is only the status */
    st = muon_gloo_subgroup(NULL, w, members, 1);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "out is NULL"), "subgroup NULL out: %s %s", muon_status_string(st), muon_error(NULL));
    g = *w;   /* a live comm's fields: a failed call must clear them */
    st = muon_gloo_subgroup(&g, w, NULL, 1);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "ranks is NULL"), "subgroup NULL ranks: %s %s", muon_status_string(st), muon_error(NULL));
    CHECK(g.vt == NULL && g.ctx == NULL && g.size == 0, "out not cleared on failure");
    st = muon_gloo_subgroup(NULL, NULL, NULL, 1);
    CHECK(st == MUON_ERR_ARG, "subgroup NULL out, parent and ranks: %s", muon_status_string(st));
    st = muon_gloo_subgroup(&g, w, members, n + 1);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "n = ") && strstr(muon_error(NULL), "parent size"), "subgroup n = size + 1: %s %s",
          muon_status_string(st), muon_error(NULL));
    dims0[0] = n; dims0[1] = 1;
    st = muon_gloo_mesh_subgroup(&g, NULL, dims0, 2, 0);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "parent is NULL"), "mesh NULL parent: %s %s", muon_status_string(st), muon_error(NULL));
    st = muon_gloo_mesh_subgroup(NULL, w, dims0, 2, 0);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "out is NULL"), "mesh NULL out: %s %s", muon_status_string(st), muon_error(NULL));
    st = muon_gloo_mesh_subgroup(NULL, NULL, NULL, 2, 0);
    CHECK(st == MUON_ERR_ARG, "mesh NULL out, parent and dims: %s", muon_status_string(st));
    st = muon_gloo_mesh_subgroup(&g, w, dims0, 2, 2);
    CHECK(st == MUON_ERR_ARG && strstr(muon_error(NULL), "dim 2"), "mesh dim = ndims: %s %s", muon_status_string(st), muon_error(NULL));
    /* the vtable's slots with a NULL context: refused, and the error text of no comm is "" */
    CHECK(strcmp(w->vt->error(NULL), "") == 0, "error(NULL) = '%s'", w->vt->error(NULL));
    st = w->vt->alltoallv(NULL, &one, sc, sd, &back, rc, rd, &ticket);
    CHECK(st == MUON_ERR_ARG, "alltoallv NULL ctx: %s", muon_status_string(st));
    st = w->vt->allgather(NULL, &one, &back, sizeof one);
    CHECK(st == MUON_ERR_ARG, "allgather NULL ctx: %s", muon_status_string(st));
    free(cnt);
    CHECK(alltoallv_round(w, members, 7, &st) == 0, "a round after the refused calls: %s", test_comm_error(w));
  }

  if (getenv("MUON_TEST_REDIS") && *getenv("MUON_TEST_REDIS")) run_redis(w, members, got);
  free(members);
  free(got);
}

int main(int argc, char **argv) {
  muon_gloo_desc d = muon_gloo_default_desc();
  muon_comm world;
  muon_status st;
  int die = 0, die_started = 0, stall = 0, redis = 0, i, me, n, fail;
  double t0 = now_s(), stall_timeout = 2.0;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--die")) die = 1;
    else if (!strcmp(argv[i], "--die-started")) die = die_started = 1;
    else if (!strcmp(argv[i], "--stall")) stall = 1;
    else if (!strcmp(argv[i], "--redis")) redis = 1;
    else {
      fprintf(stderr, "usage: muonrun -n N %s [--die | --die-started | --stall | --redis]\n", argv[0]);
      return 2;
    }
  }
  if (redis && !(getenv("MUON_TEST_REDIS") && *getenv("MUON_TEST_REDIS"))) {
    fprintf(stderr, "%s: --redis needs MUON_TEST_REDIS=host:port (see tests/run_redis.sh)\n",
            argv[0]);
    return 2;
  }
  if (!getenv("MUON_RANK") || !getenv("MUON_WORLD_SIZE")) {
    fprintf(stderr, "%s: start me with muonrun -n N\n", argv[0]);
    return 2;
  }
  d.timeout_s = stall ? stall_timeout : die ? 10 : 30;

  begin("create the world");
  st = muon_gloo_create(&world, &d);
  CHECK(st == MUON_OK, "muon_gloo_create: %s: %s", muon_status_string(st), muon_error(NULL));
  if (st != MUON_OK) return test_summary();
  me = world.rank;

  if ((die || stall) && world.size < 2) {
    if (me == 0) printf("fault modes need 2 or more ranks; nothing to do\n");
  } else if (die) {
    run_die(&world, die_started);
  } else if (stall) {
    run_stall(&world, stall_timeout);
  } else if (redis) {
    int *members = (int *)malloc((size_t)world.size * sizeof(int));
    int *got = (int *)malloc((size_t)world.size * sizeof(int));
    for (i = 0; i < world.size; i++) members[i] = i;
    run_redis(&world, members, got);
    free(members);
    free(got);
  } else {
    run_normal(&world);
  }

  /* close the last case, then rank 0 counts every rank's failed cases (while the world works) */
  if (test__in_case && test__case_failed) case_failed_mask |= (uint64_t)1 << case_index;
  test__end_case();
  n = world.size;
  if (!die && !stall) {
    uint64_t *masks = (uint64_t *)malloc((size_t)n * sizeof(uint64_t));
    st = world.vt->allgather(world.ctx, &case_failed_mask, masks, sizeof(uint64_t));
    if (st != MUON_OK) {
      printf("FAIL final allgather of the results: %s\n", test_comm_error(&world));
      test__failed++;
    } else if (me == 0) {
      uint64_t all = 0;
      int k;
      for (i = 0; i < n; i++) all |= masks[i];
      for (k = 0; k <= case_index; k++)
        if ((all >> k & 1) && !(case_failed_mask >> k & 1)) {
          /* passed here, failed on another rank: a failure in the summary */
          test__passed--;
          test__failed++;
          printf("FAIL case %d failed on another rank (see its output)\n", k);
        }
    }
    free(masks);
  }
  if (me == 0) {
    printf("rank 0: %d ranks, %.2f s%s\n", n, now_s() - t0,
           die_started ? " (--die-started)" : die ? " (--die)" : stall ? " (--stall)" : redis ? " (--redis)" : "");
    fail = test_summary();
  } else {
    fail = test__failed ? 1 : 0;
  }
  fflush(stdout);
  /* nobody exits (and makes muonrun stop the others) before rank 0 has printed */
  if (!die && !stall) comm_barrier(&world);
  muon_comm_destroy(&world);
  return fail;
}
