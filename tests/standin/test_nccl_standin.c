/* test_nccl_standin.c - the NCCL stand-in (tests/standin/nccl_standin.c) on N local processes.

   Build (after `make build/cuda/standin.o build/muonrun`):
     cc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -D_GNU_SOURCE -isystem /usr/local/cuda/include \
        -Itests/standin -c tests/standin/nccl_standin.c -o build/cuda/nccl_standin.o
     cc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -D_GNU_SOURCE -isystem /usr/local/cuda/include \
        -Itests -Itests/standin tests/standin/test_nccl_standin.c build/cuda/nccl_standin.o \
        build/cuda/standin.o -o build/cuda/test_nccl_standin -lm -pthread
   Run: build/muonrun -n N build/cuda/test_nccl_standin     (N = 1, 2, 3, 4, 8)

   Every rank runs every case (a rank with no part in one still opens it, so case numbers agree).
   Unique ids, barriers and the results travel through files in $MUON_STORE, not through NCCL, so
   a broken stand-in cannot hide its own failures. Rank 0 prints the summary, counting a case as
   failed when it failed on any rank; every rank exits non-zero when one of its checks failed. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#include "standin.h"
#include "test.h"

static int g_me, g_n;
static const char *g_store;
static pid_t *g_pids;

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

/* Which cases failed on this rank, OR-ed across ranks at the end. */
static int case_index = -1;
static uint64_t case_failed_mask;
static void begin(const char *name) {
  if (case_index >= 0 && test__in_case && test__case_failed) case_failed_mask |= (uint64_t)1 << case_index;
  case_index++;
  TEST_CASE(name);
}

/* ---- the file store ---------------------------------------------------------------------- */
static void store_put(const char *key, const void *data, size_t len) {
  char path[4096], tmp[4200];
  FILE *f;
  snprintf(path, sizeof path, "%s/%s", g_store, key);
  snprintf(tmp, sizeof tmp, "%s.tmp%d", path, g_me);
  f = fopen(tmp, "wb");
  if (!f) { printf("store_put %s: %s\n", tmp, strerror(errno)); return; }
  if (fwrite(data, 1, len, f) != len) printf("store_put %s: short write\n", tmp);
  fclose(f);
  if (rename(tmp, path) != 0) printf("store_put %s: rename: %s\n", path, strerror(errno));
}

static int store_get(const char *key, void *data, size_t len, double timeout_s) {
  char path[4096];
  double deadline = now_s() + timeout_s;
  snprintf(path, sizeof path, "%s/%s", g_store, key);
  for (;;) {
    FILE *f = fopen(path, "rb");
    if (f) {
      size_t got = fread(data, 1, len, f);
      fclose(f);
      if (got == len) return 1;
    }
    if (now_s() > deadline) { printf("store_get %s: nothing after %.0f s\n", path, timeout_s); return 0; }
    sleep_s(0.0005);
  }
}

static int barrier(void) {
  static int k;
  char key[128];
  int r, v;
  snprintf(key, sizeof key, "bar-%d-%d", k, g_me);
  store_put(key, &g_me, sizeof g_me);
  for (r = 0; r < g_n; r++) {
    snprintf(key, sizeof key, "bar-%d-%d", k, r);
    if (!store_get(key, &v, sizeof v, 60)) return 0;
  }
  k++;
  return 1;
}

/* Rank `root` makes the id, the others read it. */
static int share_id(const char *tag, int root, ncclUniqueId *id) {
  char key[128];
  snprintf(key, sizeof key, "id-%s", tag);
  if (g_me == root) {
    if (ncclGetUniqueId(id) != ncclSuccess) return 0;
    store_put(key, id, sizeof *id);
    return 1;
  }
  return store_get(key, id, sizeof *id, 60);
}

/* ---- device buffers and patterns --------------------------------------------------------- */
static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  if (cudaMalloc(&p, bytes) != cudaSuccess) return NULL;
  return p;
}
static int to_dev(void *d, const void *h, size_t n) { return n == 0 || cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) == cudaSuccess; }
static int to_host(void *h, const void *d, size_t n) { return n == 0 || cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess; }

static unsigned char pat(int src, int dst, size_t i, int salt) {
  return (unsigned char)(src * 37 + dst * 101 + salt * 53 + (int)(i * 13) + (int)(i >> 9));
}

static size_t tsize(ncclDataType_t t) {
  switch (t) {
  case ncclInt8: case ncclUint8: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclFloat32: return 4;
  default: return 0;
  }
}

static ncclResult_t poll_comm(ncclComm_t c, double timeout_s) {
  double deadline = now_s() + timeout_s;
  for (;;) {
    ncclResult_t st = ncclInProgress, q = ncclCommGetAsyncError(c, &st);
    if (q != ncclSuccess) return q;
    if (st != ncclInProgress) return st;
    if (now_s() > deadline) return ncclInProgress;
    sleep_s(0.0001);
  }
}

/* Drives the stream (queries make progress) until the comm reports something other than
   ncclSuccess / ncclInProgress, or the deadline. */
static ncclResult_t wait_async_error(ncclComm_t c, cudaStream_t s, double timeout_s) {
  double deadline = now_s() + timeout_s;
  for (;;) {
    ncclResult_t st = ncclSuccess;
    (void)cudaStreamQuery(s);
    if (ncclCommGetAsyncError(c, &st) != ncclSuccess) return ncclInternalError;
    if (st != ncclSuccess && st != ncclInProgress) return st;
    if (now_s() > deadline) return st;
    sleep_s(0.0005);
  }
}

/* A ring exchange over a comm (rank, size): `bytes` to the next rank, from the previous one. */
typedef struct ring {
  int rank, size, salt;
  size_t bytes;
  unsigned char *dsend, *drecv, *h;
} ring;

static int ring_init(ring *x, int rank, int size, size_t bytes, int salt) {
  size_t i;
  memset(x, 0, sizeof *x);
  x->rank = rank; x->size = size; x->bytes = bytes; x->salt = salt;
  x->dsend = (unsigned char *)dev_alloc(bytes);
  x->drecv = (unsigned char *)dev_alloc(bytes);
  x->h = (unsigned char *)malloc(bytes);
  if (!x->dsend || !x->drecv || !x->h) return 0;
  for (i = 0; i < bytes; i++) x->h[i] = pat(rank, (rank + 1) % size, i, salt);
  if (!to_dev(x->dsend, x->h, bytes)) return 0;
  memset(x->h, 0xEE, bytes);
  return to_dev(x->drecv, x->h, bytes);
}

static ncclResult_t ring_post(ring *x, ncclComm_t c, cudaStream_t s) {
  ncclResult_t a, b, e;
  ncclGroupStart();
  a = ncclSend(x->dsend, x->bytes, ncclUint8, (x->rank + 1) % x->size, c, s);
  b = ncclRecv(x->drecv, x->bytes, ncclUint8, (x->rank + x->size - 1) % x->size, c, s);
  e = ncclGroupEnd();
  return a != ncclSuccess ? a : b != ncclSuccess ? b : e;
}

/* Wrong bytes in the receive buffer: against the sender's pattern (fresh) or the 0xEE fill. */
static long ring_wrong(ring *x, int fresh) {
  int prev = (x->rank + x->size - 1) % x->size;
  long bad = 0;
  size_t i;
  if (!to_host(x->h, x->drecv, x->bytes)) return -1;
  for (i = 0; i < x->bytes; i++)
    if (x->h[i] != (fresh ? pat(prev, x->rank, i, x->salt) : 0xEE)) bad++;
  return bad;
}

static void ring_free(ring *x) {
  cudaFree(x->dsend);
  cudaFree(x->drecv);
  free(x->h);
}

/* /dev/shm entries of our stand-in made by one of the given processes (unlinked if asked). */
static int shm_leftovers(const pid_t *pids, int npids, int remove, char *first, size_t first_size) {
  DIR *d = opendir("/dev/shm");
  struct dirent *e;
  int found = 0, i;
  if (first_size) first[0] = '\0';
  if (!d) return 0;
  while ((e = readdir(d)) != NULL)
    for (i = 0; i < npids; i++) {
      char prefix[64];
      snprintf(prefix, sizeof prefix, "muon-nccl-%d-", (int)pids[i]);
      if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
      if (!found && first_size) snprintf(first, first_size, "%s", e->d_name);
      found++;
      if (remove) {
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        shm_unlink(name);
      }
    }
  closedir(d);
  return found;
}

/* ---- cases ------------------------------------------------------------------------------- */
static const ncclDataType_t k_types[6] = { ncclFloat32, ncclBfloat16, ncclInt8, ncclInt32, ncclFloat16, ncclUint8 };

static size_t pair_count(int src, int dst, int n, int msg) {
  if (msg == 1) return (size_t)((src * 5 + dst) % 4);    /* small, often zero */
  if ((src + 2 * dst) % 4 == 3) return 0;                /* zero-count pairs */
  if (src == 0 && dst == n - 1) return 70001;            /* several 256 KiB chunks in most types */
  return (size_t)(1 + src * 97 + dst * 13);              /* distinct per pair */
}
static ncclDataType_t pair_type(int src, int dst, int msg) { return msg == 1 ? ncclInt32 : k_types[(src + 3 * dst) % 6]; }

typedef struct pairbuf { unsigned char *d, *h; size_t count, bytes; ncclDataType_t type; } pairbuf;

static void case_all_pairs(ncclComm_t world, cudaStream_t s) {
  const int me = g_me, n = g_n;
  pairbuf *snd = (pairbuf *)calloc((size_t)(2 * n), sizeof *snd), *rcv = (pairbuf *)calloc((size_t)(2 * n), sizeof *rcv);
  int *ops = (int *)malloc((size_t)(8 * n) * sizeof(int)), *sent = (int *)calloc((size_t)n, sizeof(int)), *rcvd = (int *)calloc((size_t)n, sizeof(int));
  int p, m, k, nops = 0, calls_ok = 1;
  unsigned seed = 12345u + (unsigned)me * 7919u;
  ncclResult_t r;
  long bad = 0;
  size_t i;
  for (p = 0; p < n; p++)
    for (m = 0; m < 2; m++) {
      pairbuf *a = &snd[p * 2 + m], *b = &rcv[p * 2 + m];
      a->count = pair_count(me, p, n, m); a->type = pair_type(me, p, m); a->bytes = a->count * tsize(a->type);
      b->count = pair_count(p, me, n, m); b->type = pair_type(p, me, m); b->bytes = b->count * tsize(b->type);
      a->h = (unsigned char *)malloc(a->bytes + 1);
      b->h = (unsigned char *)malloc(b->bytes + 64);
      for (i = 0; i < a->bytes; i++) a->h[i] = pat(me, p, i, m);
      memset(b->h, 0xEE, b->bytes + 64);
      if (a->bytes) { a->d = (unsigned char *)dev_alloc(a->bytes); CHECK(a->d && to_dev(a->d, a->h, a->bytes), "send buffer"); }
      if (b->bytes) { b->d = (unsigned char *)dev_alloc(b->bytes + 64); CHECK(b->d && to_dev(b->d, b->h, b->bytes + 64), "recv buffer"); }
      ops[nops++] = p; ops[nops++] = p; ops[nops++] = -1 - p; ops[nops++] = -1 - p; /* each op appears once per message */
    }
  for (k = nops - 1; k > 0; k--) { /* a rank-dependent shuffle */
    int j, t;
    seed = seed * 1103515245u + 12345u;
    j = (int)((seed >> 8) % (unsigned)(k + 1));
    t = ops[k]; ops[k] = ops[j]; ops[j] = t;
  }
  r = ncclGroupStart();
  CHECK(r == ncclSuccess, "ncclGroupStart: %s", ncclGetErrorString(r));
  for (k = 0; k < nops; k++) {
    /* the two messages of a pair keep their order (A before B); zero-count ones pass NULL */
    if (ops[k] >= 0) {
      p = ops[k]; m = sent[p]++ / 2;
      r = ncclSend(snd[p * 2 + m].d, snd[p * 2 + m].count, snd[p * 2 + m].type, p, world, s);
    } else {
      p = -1 - ops[k]; m = rcvd[p]++ / 2;
      r = ncclRecv(rcv[p * 2 + m].d, rcv[p * 2 + m].count, rcv[p * 2 + m].type, p, world, s);
    }
    if (r != ncclSuccess) calls_ok = 0;
  }
  r = ncclGroupEnd();
  CHECK(calls_ok && r == ncclSuccess, "group: ops %s, ncclGroupEnd %s: %s", calls_ok ? "ok" : "failed", ncclGetErrorString(r), ncclGetLastError(world));
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize");
  for (p = 0; p < n; p++)
    for (m = 0; m < 2; m++) {
      pairbuf *b = &rcv[p * 2 + m];
      long wrong = 0;
      if (!b->bytes) continue;
      CHECK(to_host(b->h, b->d, b->bytes + 64), "cudaMemcpy back");
      for (i = 0; i < b->bytes + 64; i++)
        if (b->h[i] != (i < b->bytes ? pat(p, me, i, m) : 0xEE)) wrong++;
      if (wrong && bad == 0)
        printf("  message %d from rank %d (%zu x type %d): %ld wrong bytes\n", m, p, b->count, (int)b->type, wrong);
      bad += wrong;
    }
  CHECK(bad == 0, "%ld wrong bytes received (guards included)", bad);
  for (p = 0; p < 2 * n; p++) {
    cudaFree(snd[p].d); cudaFree(rcv[p].d); free(snd[p].h); free(rcv[p].h);
  }
  free(snd); free(rcv); free(ops); free(sent); free(rcvd);
}

static void case_zero_counts(ncclComm_t world) {
  ring x;
  int p;
  ncclResult_t r;
  long long launches = muon_standin_nccl_calls("launch");
  r = ncclGroupStart();
  for (p = 0; p < g_n; p++) {
    if (ncclSend(NULL, 0, ncclFloat32, p, world, NULL) != ncclSuccess) r = ncclInternalError;
    if (ncclRecv(NULL, 0, ncclFloat32, p, world, NULL) != ncclSuccess) r = ncclInternalError;
  }
  if (ncclGroupEnd() != ncclSuccess) r = ncclInternalError;
  CHECK(r == ncclSuccess, "a group of zero-count messages with NULL buffers failed: %s", ncclGetLastError(world));
  CHECK(muon_standin_nccl_calls("launch") == launches + 1, "the group was not launched as one");
  CHECK(cudaStreamSynchronize(NULL) == cudaSuccess, "cudaStreamSynchronize(NULL)");
  /* the channels are still in step: a normal exchange right after them matches */
  CHECK(ring_init(&x, g_me, g_n, 1000, 3), "ring buffers");
  r = ring_post(&x, world, NULL);
  CHECK(r == ncclSuccess, "ring: %s", ncclGetErrorString(r));
  CHECK(cudaStreamSynchronize(NULL) == cudaSuccess, "cudaStreamSynchronize(NULL)");
  CHECK(ring_wrong(&x, 1) == 0, "ring after zero-count messages: wrong data");
  ring_free(&x);
}

static void case_allgather(ncclComm_t world, cudaStream_t s) {
  const int me = g_me, n = g_n;
  size_t count = 70001, bytes = count * 4, count2 = 1000, bytes2 = count2 * 2, i;
  unsigned char *send = (unsigned char *)dev_alloc(bytes), *recv = (unsigned char *)dev_alloc((size_t)n * bytes);
  unsigned char *recv2 = (unsigned char *)dev_alloc((size_t)n * bytes2);
  unsigned char *h = (unsigned char *)malloc((size_t)n * bytes);
  long bad = 0, bad2 = 0;
  ncclResult_t r;
  int q;
  CHECK(send && recv && recv2 && h, "buffers");
  if (!send || !recv || !recv2 || !h) goto out;
  for (i = 0; i < bytes; i++) h[i] = pat(me, 0, i, 7);
  CHECK(to_dev(send, h, bytes), "fill send");
  memset(h, 0xEE, (size_t)n * bytes);
  CHECK(to_dev(recv, h, (size_t)n * bytes), "fill recv");
  r = ncclAllGather(send, recv, count, ncclFloat32, world, NULL);
  CHECK(r == ncclSuccess, "ncclAllGather (NULL stream): %s: %s", ncclGetErrorString(r), ncclGetLastError(world));
  CHECK(cudaStreamSynchronize(NULL) == cudaSuccess, "cudaStreamSynchronize(NULL)");
  CHECK(to_host(h, recv, (size_t)n * bytes), "read back");
  for (q = 0; q < n; q++)
    for (i = 0; i < bytes; i++) bad += h[(size_t)q * bytes + i] != pat(q, 0, i, 7);
  CHECK(bad == 0, "out of place: %ld wrong bytes", bad);

  /* in place: sendbuff == recvbuff + rank * sendcount */
  memset(h, 0xEE, (size_t)n * bytes2);
  for (i = 0; i < bytes2; i++) h[(size_t)me * bytes2 + i] = pat(me, 1, i, 8);
  CHECK(to_dev(recv2, h, (size_t)n * bytes2), "fill recv2");
  r = ncclAllGather(recv2 + (size_t)me * bytes2, recv2, count2, ncclBfloat16, world, s);
  CHECK(r == ncclSuccess, "ncclAllGather (in place, created stream): %s: %s", ncclGetErrorString(r), ncclGetLastError(world));
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize");
  CHECK(to_host(h, recv2, (size_t)n * bytes2), "read back");
  for (q = 0; q < n; q++)
    for (i = 0; i < bytes2; i++) bad2 += h[(size_t)q * bytes2 + i] != pat(q, 1, i, 8);
  CHECK(bad2 == 0, "in place: %ld wrong bytes", bad2);
out:
  cudaFree(send); cudaFree(recv); cudaFree(recv2); free(h);
}

/* Rank-dependent order: NCCL does not require the same order of different kinds within a group. */
static void case_mixed_group(ncclComm_t world, cudaStream_t s) {
  const int me = g_me, n = g_n, next = (me + 1) % n, prev = (me + n - 1) % n;
  int32_t hs[3], hr[3], hg[5], *hall = (int32_t *)malloc((size_t)n * 5 * sizeof(int32_t));
  int32_t *ds = (int32_t *)dev_alloc(sizeof hs), *dr = (int32_t *)dev_alloc(sizeof hr), *dg = (int32_t *)dev_alloc(sizeof hg);
  int32_t *dall = (int32_t *)dev_alloc((size_t)n * 5 * sizeof(int32_t));
  ncclResult_t r, a = ncclSuccess, b = ncclSuccess, c = ncclSuccess;
  int i, q, step, bad = 0;
  for (i = 0; i < 3; i++) { hs[i] = me * 1000 + i; hr[i] = -1; }
  for (i = 0; i < 5; i++) hg[i] = me * 100 + i;
  CHECK(to_dev(ds, hs, sizeof hs) && to_dev(dr, hr, sizeof hr) && to_dev(dg, hg, sizeof hg), "fill");
  ncclGroupStart();
  for (step = 0; step < 3; step++)
    switch ((step + me) % 3) {
    case 0: a = ncclSend(ds, 3, ncclInt32, next, world, s); break;
    case 1: b = ncclAllGather(dg, dall, 5, ncclInt32, world, s); break;
    default: c = ncclRecv(dr, 3, ncclInt32, prev, world, s); break;
    }
  r = ncclGroupEnd();
  CHECK(a == ncclSuccess && b == ncclSuccess && c == ncclSuccess && r == ncclSuccess, "group: %s", ncclGetLastError(world));
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize");
  CHECK(to_host(hr, dr, sizeof hr) && to_host(hall, dall, (size_t)n * 5 * sizeof(int32_t)), "read back");
  for (i = 0; i < 3; i++) bad += hr[i] != prev * 1000 + i;
  for (q = 0; q < n; q++)
    for (i = 0; i < 5; i++) bad += hall[q * 5 + i] != q * 100 + i;
  CHECK(bad == 0, "%d wrong values", bad);
  cudaFree(ds); cudaFree(dr); cudaFree(dg); cudaFree(dall); free(hall);
}

static void case_nonblocking_group(ncclComm_t nb, cudaStream_t s) {
  ring x;
  ncclResult_t r;
  long stale, fresh;
  CHECK(ring_init(&x, g_me, g_n, 300000, 5), "ring buffers");
  r = ring_post(&x, nb, s);
  CHECK(r == ncclInProgress, "ncclGroupEnd on a non-blocking comm returned %s, not ncclInProgress", ncclGetErrorString(r));
  r = ncclSend(x.dsend, 4, ncclUint8, 0, nb, s);
  CHECK(r == ncclInvalidUsage, "ncclSend on a comm still in progress: %s", ncclGetErrorString(r));
  CHECK(strstr(muon_standin_nccl_last_message(), "in progress") != NULL, "message: %s", muon_standin_nccl_last_message());
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize before polling");
  stale = ring_wrong(&x, 0);
  CHECK(stale == 0, "before the comm was polled, %ld bytes already changed (the group must not be queued yet)", stale);
  r = poll_comm(nb, 20);
  CHECK(r == ncclSuccess, "polling the comm: %s", ncclGetErrorString(r));
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize after polling");
  fresh = ring_wrong(&x, 1);
  CHECK(fresh == 0, "after polling and synchronising, %ld wrong bytes", fresh);
  ring_free(&x);
}

static void case_argument_errors(ncclComm_t world, cudaStream_t s) {
  float host[8] = {0};
  float *d = (float *)dev_alloc(8 * sizeof(float)), *dall = (float *)dev_alloc((size_t)g_n * 8 * sizeof(float));
  ncclResult_t r;
  ring x;
  r = ncclSend(host, 8, ncclFloat32, 0, world, s);
  CHECK(r == ncclInvalidArgument, "ncclSend of a host buffer: %s", ncclGetErrorString(r));
  CHECK(strstr(muon_standin_nccl_last_message(), "host") != NULL, "message does not say host: %s", muon_standin_nccl_last_message());
  r = ncclRecv(host, 8, ncclFloat32, 0, world, s);
  CHECK(r == ncclInvalidArgument, "ncclRecv into a host buffer: %s", ncclGetErrorString(r));
  r = ncclAllGather(d, host, 8, ncclFloat32, world, s);
  CHECK(r == ncclInvalidArgument, "ncclAllGather into a host buffer: %s", ncclGetErrorString(r));
  r = ncclSend(NULL, 1, ncclFloat32, 0, world, s);
  CHECK(r == ncclInvalidArgument, "ncclSend of NULL with count 1: %s", ncclGetErrorString(r));
  r = ncclSend(d, 9, ncclFloat32, 0, world, s);
  CHECK(r == ncclInvalidArgument, "ncclSend past the end of the allocation: %s", ncclGetErrorString(r));
  r = ncclAllGather(d, dall, 9, ncclFloat32, world, s);
  CHECK(r == ncclInvalidArgument, "ncclAllGather past the end: %s", ncclGetErrorString(r));
  if (g_n > 1) {
    r = ncclAllGather(dall + 1, dall, 8, ncclFloat32, world, s);
    CHECK(r == ncclInvalidArgument, "ncclAllGather with overlapping, not in-place buffers: %s", ncclGetErrorString(r));
  }
  r = ncclSend(d, 8, ncclFloat32, g_n, world, s);
  CHECK(r == ncclInvalidArgument, "peer == nranks: %s", ncclGetErrorString(r));
  r = ncclRecv(d, 8, ncclFloat32, -1, world, s);
  CHECK(r == ncclInvalidArgument, "peer -1: %s", ncclGetErrorString(r));
  r = ncclSend(d, 1, ncclNumTypes, 0, world, s);
  CHECK(r == ncclInvalidArgument, "datatype ncclNumTypes: %s", ncclGetErrorString(r));
  r = ncclSend(d, 1, ncclFloat32, 0, NULL, s);
  CHECK(r == ncclInvalidArgument, "NULL comm: %s", ncclGetErrorString(r));
  r = ncclGroupEnd();
  CHECK(r == ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart: %s", ncclGetErrorString(r));

  /* one comm, two streams in a group */
  ncclGroupStart();
  ncclSend(d, 2, ncclFloat32, g_me, world, s);
  ncclRecv(d + 4, 2, ncclFloat32, g_me, world, NULL);
  r = ncclGroupEnd();
  CHECK(r == ncclInvalidUsage, "two streams for one comm in a group: %s", ncclGetErrorString(r));
  /* a send to oneself without its receive in the group would hang */
  ncclGroupStart();
  ncclSend(d, 2, ncclFloat32, g_me, world, s);
  r = ncclGroupEnd();
  CHECK(r == ncclInvalidUsage, "a send to oneself alone in a group: %s", ncclGetErrorString(r));
  /* a failing call fails the whole group, which queues nothing */
  ncclGroupStart();
  ncclSend(d, 2, ncclFloat32, g_me, world, s);
  r = ncclRecv(host, 2, ncclFloat32, g_me, world, s);
  CHECK(r == ncclInvalidArgument, "host receive in a group: %s", ncclGetErrorString(r));
  r = ncclGroupEnd();
  CHECK(r == ncclInvalidArgument, "ncclGroupEnd after a failed call returned %s", ncclGetErrorString(r));
  CHECK(cudaStreamSynchronize(s) == cudaSuccess && cudaStreamSynchronize(NULL) == cudaSuccess, "sync");
  /* none of that advanced a channel: a real exchange still matches */
  CHECK(ring_init(&x, g_me, g_n, 100, 9), "ring buffers");
  r = ring_post(&x, world, s);
  CHECK(r == ncclSuccess, "ring: %s", ncclGetErrorString(r));
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize");
  CHECK(ring_wrong(&x, 1) == 0, "ring after the failed calls: wrong data");
  ring_free(&x);
  cudaFree(d);
  cudaFree(dall);
}

/* Split members of `color`, in new-rank order, for colors[]/keys[] of the parent. */
static int expected_members(const int *colors, const int *keys, int n, int color, int *out) {
  int k = 0, r, i;
  for (r = 0; r < n; r++) {
    if (colors[r] != color) continue;
    for (i = k; i > 0 && (keys[out[i - 1]] > keys[r] || (keys[out[i - 1]] == keys[r] && out[i - 1] > r)); i--) out[i] = out[i - 1];
    out[i] = r;
    k++;
  }
  return k;
}

/* An allgather of parent ranks over the child: the child's order must be the expected one. */
static void check_child(ncclComm_t child, const int *colors, const int *keys, int color, cudaStream_t s) {
  int *want = (int *)malloc((size_t)g_n * sizeof(int)), nw = expected_members(colors, keys, g_n, color, want);
  int count = -1, rank = -1, i, myidx = -1, bad = 0;
  int32_t *dall = (int32_t *)dev_alloc((size_t)g_n * sizeof(int32_t)), *dme = (int32_t *)dev_alloc(sizeof(int32_t));
  int32_t *hall = (int32_t *)malloc((size_t)g_n * sizeof(int32_t)), v = g_me;
  ncclResult_t r;
  for (i = 0; i < nw; i++)
    if (want[i] == g_me) myidx = i;
  CHECK(ncclCommCount(child, &count) == ncclSuccess && count == nw, "child count %d, want %d", count, nw);
  CHECK(ncclCommUserRank(child, &rank) == ncclSuccess && rank == myidx, "child rank %d, want %d", rank, myidx);
  CHECK(to_dev(dme, &v, sizeof v), "fill");
  if (count == nw && rank == myidx) {
    r = ncclAllGather(dme, dall, 1, ncclInt32, child, s);
    if (r == ncclInProgress) r = poll_comm(child, 20); /* a non-blocking child queues it when polled */
    CHECK(r == ncclSuccess, "allgather on the child: %s", ncclGetErrorString(r));
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize");
    CHECK(to_host(hall, dall, (size_t)nw * sizeof(int32_t)), "read back");
    for (i = 0; i < nw; i++) bad += hall[i] != want[i];
    CHECK(bad == 0, "child member order differs (first: %d, want %d)", (int)hall[0], want[0]);
  }
  cudaFree(dall); cudaFree(dme); free(hall); free(want);
}

static void case_split_blocking(ncclComm_t world, cudaStream_t s) {
  int *colors = (int *)malloc((size_t)g_n * sizeof(int)), *keys = (int *)malloc((size_t)g_n * sizeof(int)), r;
  ncclComm_t child = NULL, bad = NULL;
  ncclResult_t e;
  for (r = 0; r < g_n; r++) {
    colors[r] = g_n >= 3 && r == 1 ? NCCL_SPLIT_NOCOLOR : r % 2;
    keys[r] = g_n - r; /* reversed */
  }
  e = ncclCommSplit(world, -5, 0, &bad, NULL);
  CHECK(e == ncclInvalidArgument && bad == NULL, "color -5: %s", ncclGetErrorString(e));
  e = ncclCommSplit(world, colors[g_me], keys[g_me], &child, NULL);
  CHECK(e == ncclSuccess, "ncclCommSplit: %s: %s", ncclGetErrorString(e), ncclGetLastError(world));
  if (colors[g_me] == NCCL_SPLIT_NOCOLOR) {
    CHECK(child == NULL, "NCCL_SPLIT_NOCOLOR gave a comm");
  } else if (e == ncclSuccess) {
    CHECK(child != NULL, "no child comm");
    if (child) check_child(child, colors, keys, colors[g_me], s);
    CHECK(ncclCommDestroy(child) == ncclSuccess, "destroy child");
  }
  free(colors);
  free(keys);
}

static void case_split_nonblocking(ncclComm_t nb, cudaStream_t s) {
  int *colors = (int *)malloc((size_t)g_n * sizeof(int)), *keys = (int *)malloc((size_t)g_n * sizeof(int)), r, k;
  ncclComm_t child = NULL;
  ncclResult_t e;
  for (r = 0; r < g_n; r++) {
    colors[r] = g_n >= 3 && r == g_n - 1 ? NCCL_SPLIT_NOCOLOR : r / 2;
    keys[r] = 7; /* ties: parent rank order */
  }
  e = ncclCommSplit(nb, colors[g_me], keys[g_me], &child, NULL); /* no config: inherits non-blocking */
  CHECK(e == ncclInProgress, "non-blocking ncclCommSplit returned %s", ncclGetErrorString(e));
  e = ncclCommCount(nb, &k);
  CHECK(e == ncclInvalidUsage, "ncclCommCount on the parent while its split is in progress: %s", ncclGetErrorString(e));
  if (colors[g_me] == NCCL_SPLIT_NOCOLOR) {
    CHECK(child == NULL, "NCCL_SPLIT_NOCOLOR gave a comm");
    e = poll_comm(nb, 20);
    CHECK(e == ncclSuccess, "polling the parent: %s", ncclGetErrorString(e));
  } else {
    CHECK(child != NULL, "no child comm");
    if (child) {
      e = ncclCommCount(child, &k);
      CHECK(e == ncclInvalidUsage, "ncclCommCount on a child in progress: %s", ncclGetErrorString(e));
      e = poll_comm(child, 20);
      CHECK(e == ncclSuccess, "polling the child: %s: %s", ncclGetErrorString(e), ncclGetLastError(child));
      if (e == ncclSuccess) check_child(child, colors, keys, colors[g_me], s);
      CHECK(ncclCommDestroy(child) == ncclSuccess, "destroy child");
    }
  }
  e = ncclCommCount(nb, &k);
  CHECK(e == ncclSuccess && k == g_n, "the parent after the split: %s", ncclGetErrorString(e));
  free(colors);
  free(keys);
}

/* A comm of world ranks 0 and 1 (just rank 0 when alone); NULL on the others. */
static ncclComm_t pair_comm(ncclComm_t world) {
  ncclComm_t c = NULL;
  ncclResult_t e = ncclCommSplit(world, g_me < 2 ? 0 : NCCL_SPLIT_NOCOLOR, g_me, &c, NULL);
  CHECK(e == ncclSuccess, "pair split: %s", ncclGetErrorString(e));
  return c;
}

/* Rank 1 sends (count_sent, type) to rank 0, which posts (count_posted, type) (rank 0 to itself
   when alone): both must get ncclInvalidUsage naming both sides, abort, and their streams drain. */
static void case_mismatch(ncclComm_t world, cudaStream_t s, size_t count_sent, size_t count_posted, ncclDataType_t type) {
  ncclComm_t pair = pair_comm(world);
  const int sender = g_n > 1 ? 1 : 0;
  char want_sent[128], want_posted[128];
  const char *msg;
  unsigned char *d = (unsigned char *)dev_alloc(1024);
  ncclResult_t r = ncclSuccess, e;
  double t0;
  if (!pair) { cudaFree(d); return; }
  snprintf(want_sent, sizeof want_sent, "rank %d sends %zu x %s (ncclSend) to rank 0", sender, count_sent,
           type == ncclFloat32 ? "float32" : "int8");
  snprintf(want_posted, sizeof want_posted, "which posted ncclRecv of %zu x %s from rank %d", count_posted,
           type == ncclFloat32 ? "float32" : "int8", sender);
  if (g_n == 1) {
    ncclGroupStart();
    ncclSend(count_sent ? d : NULL, count_sent, type, 0, pair, s);
    ncclRecv(d + 512, count_posted, type, 0, pair, s);
    r = ncclGroupEnd();
  } else if (g_me == 1) {
    r = ncclSend(count_sent ? d : NULL, count_sent, type, 0, pair, s);
  } else {
    r = ncclRecv(d, count_posted, type, 1, pair, s);
  }
  CHECK(r == ncclSuccess, "posting: %s", ncclGetErrorString(r));
  e = wait_async_error(pair, s, 10);
  CHECK(e == ncclInvalidUsage, "async error %s, want ncclInvalidUsage", ncclGetErrorString(e));
  msg = ncclGetLastError(pair);
  CHECK(strstr(msg, "mismatch") && strstr(msg, want_sent) && strstr(msg, want_posted), "message \"%s\" lacks \"%s\" / \"%s\"",
        msg, want_sent, want_posted);
  CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "the stream completed despite the mismatch");
  CHECK(ncclCommAbort(pair) == ncclSuccess, "ncclCommAbort");
  t0 = now_s();
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize after the abort");
  CHECK(now_s() - t0 < 2.0, "the stream took %.2f s to drain after the abort", now_s() - t0);
  cudaFree(d);
}

static void case_async_injection(ncclComm_t world, cudaStream_t s) {
  ncclComm_t pair = pair_comm(world);
  float *ds = (float *)dev_alloc(10 * sizeof(float)), *dr = (float *)dev_alloc(10 * sizeof(float));
  ncclResult_t r, st = ncclSuccess;
  int other = g_n > 1 ? 1 - g_me : 0, completed = 0;
  double t0;
  if (!pair) { cudaFree(ds); cudaFree(dr); return; }
  if (g_me == 0) muon_standin_nccl_fail("async", 1);
  ncclGroupStart();
  ncclSend(ds, 10, ncclFloat32, other, pair, s);
  ncclRecv(dr, 10, ncclFloat32, other, pair, s);
  r = ncclGroupEnd();
  CHECK(r == ncclSuccess, "posting: %s", ncclGetErrorString(r));
  if (g_me == 0) {
    st = wait_async_error(pair, s, 10);
    CHECK(st == ncclSystemError, "injected rank: async error %s, want ncclSystemError", ncclGetErrorString(st));
    CHECK(strstr(ncclGetLastError(pair), "injected") != NULL, "message: %s", ncclGetLastError(pair));
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "the injected group completed");
    r = ncclSend(ds, 10, ncclFloat32, other, pair, s);
    CHECK(r == ncclSystemError, "a call on the broken comm returned %s", ncclGetErrorString(r));
    r = ncclCommDestroy(pair);
    CHECK(r == ncclInvalidUsage, "ncclCommDestroy of a broken comm returned %s (it must be aborted)", ncclGetErrorString(r));
  } else {
    /* the peer is not told: it sees nothing complete until its own deadline */
    t0 = now_s();
    while (now_s() - t0 < 1.0) {
      if (cudaStreamQuery(s) == cudaSuccess) completed = 1;
      if (ncclCommGetAsyncError(pair, &st) != ncclSuccess || st != ncclSuccess) break;
      sleep_s(0.002);
    }
    CHECK(!completed, "the peer's group completed although rank 0 never ran its part");
    CHECK(st == ncclSuccess, "the peer was told: %s", ncclGetErrorString(st));
  }
  CHECK(ncclCommAbort(pair) == ncclSuccess, "ncclCommAbort");
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize after the abort");
  muon_standin_nccl_fail("async", 0);
  cudaFree(ds);
  cudaFree(dr);
}

static void case_destroy_queued(cudaStream_t s) {
  ncclUniqueId id;
  ncclComm_t c = NULL;
  ncclResult_t r;
  ring x;
  int k;
  CHECK(share_id("destroy", 0, &id), "id");
  r = ncclCommInitRank(&c, g_n, id, g_me);
  CHECK(r == ncclSuccess, "init: %s", ncclGetErrorString(r));
  if (r != ncclSuccess) return;
  CHECK(ring_init(&x, g_me, g_n, 600000, 11), "ring buffers");
  r = ring_post(&x, c, s);
  CHECK(r == ncclSuccess, "ring: %s", ncclGetErrorString(r));
  r = ncclCommDestroy(c);
  CHECK(r == ncclSuccess, "ncclCommDestroy with work queued: %s", ncclGetErrorString(r));
  r = ncclCommCount(c, &k);
  CHECK(r == ncclInvalidArgument, "a destroyed handle: %s", ncclGetErrorString(r));
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize");
  CHECK(ring_wrong(&x, 1) == 0, "the queued exchange did not complete after ncclCommDestroy");
  ring_free(&x);
}

static void case_injected_calls(ncclComm_t world, cudaStream_t s) {
  ncclComm_t c = NULL;
  ncclResult_t r;
  ring x;
  muon_standin_nccl_fail("ncclCommSplit", 1);
  r = ncclCommSplit(world, 0, g_me, &c, NULL);
  CHECK(r == ncclSystemError && c == NULL, "injected ncclCommSplit: %s", ncclGetErrorString(r));
  r = ncclCommSplit(world, 0, g_me, &c, NULL);
  CHECK(r == ncclSuccess && c != NULL, "ncclCommSplit after the injected failure: %s", ncclGetErrorString(r));
  if (c) CHECK(ncclCommDestroy(c) == ncclSuccess, "destroy");
  CHECK(ring_init(&x, g_me, g_n, 5000, 13), "ring buffers");
  muon_standin_nccl_fail("ncclGroupEnd", 1);
  r = ring_post(&x, world, s);
  CHECK(r == ncclSystemError, "injected ncclGroupEnd: %s", ncclGetErrorString(r));
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize");
  CHECK(ring_wrong(&x, 0) == 0, "the discarded group moved data");
  r = ring_post(&x, world, s);
  CHECK(r == ncclSuccess, "the group after: %s", ncclGetErrorString(r));
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize");
  CHECK(ring_wrong(&x, 1) == 0, "the group after the discarded one: wrong data");
  ring_free(&x);
}

static void case_join_errors(void) {
  ncclUniqueId id, id2, junk;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER, bad = NCCL_CONFIG_INITIALIZER, raw;
  ncclComm_t a = NULL, b = NULL, c = NULL;
  ncclResult_t r, st;
  char left[300];
  r = ncclGetUniqueId(&id);
  st = ncclGetUniqueId(&id2);
  CHECK(r == ncclSuccess && st == ncclSuccess, "ids");
  CHECK(memcmp(&id, &id2, sizeof id) != 0, "two ncclGetUniqueId calls gave the same id");
  r = ncclCommInitRank(&c, 0, id, 0);
  CHECK(r == ncclInvalidArgument && c == NULL, "nranks 0: %s", ncclGetErrorString(r));
  r = ncclCommInitRank(&c, 65, id, 0);
  CHECK(r == ncclInvalidArgument, "nranks 65: %s", ncclGetErrorString(r));
  r = ncclCommInitRank(&c, 2, id, 2);
  CHECK(r == ncclInvalidArgument, "rank 2 of 2: %s", ncclGetErrorString(r));
  r = ncclCommInitRank(&c, 2, id, -1);
  CHECK(r == ncclInvalidArgument, "rank -1: %s", ncclGetErrorString(r));
  memset(&junk, 0, sizeof junk);
  r = ncclCommInitRank(&c, 1, junk, 0);
  CHECK(r == ncclInvalidArgument, "an id not from ncclGetUniqueId: %s", ncclGetErrorString(r));
  memset(&raw, 0, sizeof raw);
  r = ncclCommInitRankConfig(&c, 1, id, 0, &raw);
  CHECK(r == ncclInvalidArgument, "a config without NCCL_CONFIG_INITIALIZER: %s", ncclGetErrorString(r));
  bad.blocking = 5;
  r = ncclCommInitRankConfig(&c, 1, id, 0, &bad);
  CHECK(r == ncclInvalidArgument, "config.blocking 5: %s", ncclGetErrorString(r));

  cfg.blocking = 0;
  r = ncclCommInitRankConfig(&a, 2, id, 0, &cfg);
  CHECK(r == ncclInProgress && a, "non-blocking init: %s", ncclGetErrorString(r));
  r = ncclCommInitRankConfig(&b, 2, id, 0, &cfg);
  CHECK(r == ncclInvalidUsage && b == NULL, "rank 0 joining twice: %s", ncclGetErrorString(r));
  if (a) CHECK(ncclCommAbort(a) == ncclSuccess, "abort");
  a = b = NULL;

  /* nranks differ: the later one fails, and poisons the segment for the first */
  r = ncclCommInitRankConfig(&a, 2, id2, 0, &cfg);
  CHECK(r == ncclInProgress, "init a: %s", ncclGetErrorString(r));
  if (a) CHECK(ncclCommGetAsyncError(a, &st) == ncclSuccess && st == ncclInProgress, "a after one poll: %s", ncclGetErrorString(st));
  r = ncclCommInitRankConfig(&b, 3, id2, 1, &cfg);
  CHECK(r == ncclInProgress, "init b: %s", ncclGetErrorString(r));
  if (b) {
    r = poll_comm(b, 5);
    CHECK(r == ncclInvalidUsage, "b with nranks 3: %s", ncclGetErrorString(r));
    CHECK(strstr(ncclGetLastError(b), "nranks") != NULL, "message: %s", ncclGetLastError(b));
  }
  if (a) {
    r = poll_comm(a, 5);
    CHECK(r == ncclInvalidUsage, "a (nranks 2) after b joined with 3: %s", ncclGetErrorString(r));
  }
  if (a) CHECK(ncclCommAbort(a) == ncclSuccess, "abort a");
  if (b) CHECK(ncclCommAbort(b) == ncclSuccess, "abort b");
  if (g_me != 0 || g_n == 1) { /* rank 0's name prefix may belong to a split still being joined */
    pid_t me = getpid();
    CHECK(shm_leftovers(&me, 1, 0, left, sizeof left) == 0, "aborted joins left /dev/shm/%s", left);
  }
}

/* Rank 0: a child blocking in ncclCommInitRank for a peer that never comes must abort after
   MUON_STANDIN_HANG_S (1 s here) with a message saying what it waits for. */
static void case_hang_abort(void) {
  char path[4096], text[2048] = "", left[300];
  pid_t pid;
  int status = 0, fd;
  double t0, dt;
  FILE *f;
  if (g_me != 0) return;
  snprintf(path, sizeof path, "%s/hang-child.err", g_store);
  fflush(stdout);
  fflush(stderr);
  t0 = now_s();
  pid = fork();
  if (pid == 0) {
    ncclUniqueId id;
    ncclComm_t c;
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) dup2(fd, 2);
    setenv("MUON_STANDIN_HANG_S", "1", 1);
    alarm(10); /* a stand-in that never aborts must not leave an orphan spinning */
    ncclGetUniqueId(&id);
    ncclCommInitRank(&c, 2, id, 0);
    _exit(0); /* not reached */
  }
  CHECK(pid > 0, "fork: %s", strerror(errno));
  if (pid <= 0) return;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (now_s() - t0 > 15) { kill(pid, SIGKILL); waitpid(pid, &status, 0); break; }
    sleep_s(0.01);
  }
  dt = now_s() - t0;
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "the child ended with status 0x%x, not SIGABRT", status);
  CHECK(dt > 0.9 && dt < 10, "the child aborted after %.2f s (MUON_STANDIN_HANG_S=1)", dt);
  f = fopen(path, "r");
  if (f) { size_t got = fread(text, 1, sizeof text - 1, f); text[got] = '\0'; fclose(f); }
  CHECK(strstr(text, "ncclCommInitRank has waited") && strstr(text, "ranks 1 of 2 have not joined"), "stderr: %s", text);
  /* the killed child's half-joined segment is the one leak the stand-in cannot prevent */
  CHECK(shm_leftovers(&pid, 1, 1, left, sizeof left) == 1, "expected the child's one segment in /dev/shm");
}

int main(void) {
  const char *rank_s = getenv("MUON_RANK"), *size_s = getenv("MUON_WORLD_SIZE");
  ncclComm_t world = NULL, nb = NULL;
  ncclUniqueId id;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cudaStream_t s1 = NULL, s2 = NULL;
  ncclResult_t r;
  int k, v, fail, i;
  double t_start = now_s();
  char key[64], left[300];
  g_store = getenv("MUON_STORE");
  if (!rank_s || !size_s || !g_store) {
    fprintf(stderr, "start me with muonrun -n N\n");
    return 2;
  }
  g_me = atoi(rank_s);
  g_n = atoi(size_s);
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* before the first NCCL call of the process: the env injection is read then */
  if (g_me == g_n - 1) setenv("MUON_STANDIN_NCCL_FAIL", "ncclCommInitRankConfig:1", 1);
  g_pids = (pid_t *)malloc((size_t)g_n * sizeof(pid_t));
  {
    pid_t p = getpid();
    snprintf(key, sizeof key, "pid-%d", g_me);
    store_put(key, &p, sizeof p);
    for (i = 0; i < g_n; i++) {
      snprintf(key, sizeof key, "pid-%d", i);
      if (!store_get(key, &g_pids[i], sizeof(pid_t), 60)) g_pids[i] = 0;
    }
  }
  if (cudaStreamCreate(&s1) != cudaSuccess || cudaStreamCreate(&s2) != cudaSuccess) {
    printf("cudaStreamCreate failed\n");
    return 1;
  }

  begin("version and error strings");
  CHECK(ncclGetVersion(&v) == ncclSuccess && v == NCCL_VERSION_CODE, "version %d, want %d", v, NCCL_VERSION_CODE);
  CHECK(ncclGetVersion(NULL) == ncclInvalidArgument, "ncclGetVersion(NULL)");
  CHECK(strcmp(ncclGetErrorString(ncclInvalidUsage), ncclGetErrorString(ncclSuccess)) != 0 &&
        strcmp(ncclGetErrorString(ncclInProgress), ncclGetErrorString(ncclInvalidArgument)) != 0, "error strings");

  begin("env: MUON_STANDIN_NCCL_FAIL fails the first init on the last rank, before it joins");
  CHECK(share_id("world", 0, &id), "world id");
  r = ncclCommInitRank(&world, g_n, id, g_me);
  if (g_me == g_n - 1) {
    CHECK(r == ncclSystemError && world == NULL, "injected init: %s", ncclGetErrorString(r));
    r = ncclCommInitRank(&world, g_n, id, g_me);
  }
  CHECK(r == ncclSuccess && world, "init: %s: %s", ncclGetErrorString(r), ncclGetLastError(NULL));
  if (!world) return test_summary();

  begin("blocking init: count, rank, device");
  CHECK(ncclCommCount(world, &k) == ncclSuccess && k == g_n, "count %d", k);
  CHECK(ncclCommUserRank(world, &k) == ncclSuccess && k == g_me, "rank %d", k);
  CHECK(ncclCommCuDevice(world, &k) == ncclSuccess && k == 0, "device %d", k);
  CHECK(ncclCommCount(world, NULL) == ncclInvalidArgument, "NULL count");

  begin("non-blocking init: ncclInProgress, calls refused, then ncclSuccess through ncclCommGetAsyncError");
  CHECK(share_id("nb", 0, &id), "nb id");
  cfg.blocking = 0;
  cfg.commName = "nbcomm";
  r = ncclCommInitRankConfig(&nb, g_n, id, g_me, &cfg);
  CHECK(r == ncclInProgress && nb, "non-blocking init returned %s", ncclGetErrorString(r));
  if (!nb) return test_summary();
  r = ncclCommCount(nb, &k);
  CHECK(r == ncclInvalidUsage, "ncclCommCount on a comm in progress: %s", ncclGetErrorString(r));
  CHECK(strstr(ncclGetLastError(nb), "in progress") != NULL, "message: %s", ncclGetLastError(nb));
  r = poll_comm(nb, 20);
  CHECK(r == ncclSuccess, "polling: %s: %s", ncclGetErrorString(r), ncclGetLastError(nb));
  CHECK(ncclCommCount(nb, &k) == ncclSuccess && k == g_n, "count %d", k);
  CHECK(ncclCommUserRank(nb, &k) == ncclSuccess && k == g_me, "rank %d", k);

  begin("p2p: shuffled group of sends and receives with every rank (self too), distinct counts, mixed types, two messages a pair");
  case_all_pairs(world, s1);

  begin("p2p: zero-count messages (NULL buffers) on the NULL stream are matched, and the channels stay in step");
  case_zero_counts(world);

  begin("allgather: out of place on the NULL stream (several chunks), in place on a created stream");
  case_allgather(world, s1);

  begin("allgather and send/recv in one group, issued in a different order on each rank");
  case_mixed_group(world, s2);

  begin("non-blocking group: ncclInProgress; a sync before polling sees stale data, after polling fresh data");
  case_nonblocking_group(nb, s2);

  begin("argument errors: host pointers, ranges, types, streams, groups; nothing queued by failed calls");
  case_argument_errors(world, s1);

  begin("split (blocking): colors rank % 2, keys reversed, NCCL_SPLIT_NOCOLOR; an allgather on the child");
  case_split_blocking(world, s1);

  begin("split (non-blocking, inherited): parent and child in progress until polled; an allgather on the child");
  case_split_nonblocking(nb, s2);

  begin("mismatch: rank 1 sends 100 x float32, rank 0 posts 120: ncclInvalidUsage on both, abort drains the streams");
  case_mismatch(world, s1, 100, 120, ncclFloat32);

  begin("mismatch: a zero-count send against a receive of 5 is still a mismatch");
  case_mismatch(world, s2, 0, 5, ncclInt8);

  begin("async injection: rank 0's group fails, it aborts; its peer sees nothing complete for 1 s, then aborts");
  case_async_injection(world, s1);

  begin("ncclCommDestroy with work queued: the work still completes");
  case_destroy_queued(s2);

  begin("injected ncclCommSplit and ncclGroupEnd failures, then the same calls work");
  case_injected_calls(world, s1);

  begin("join errors: bad arguments, a rank joining twice, different nranks; aborts leave no segment");
  case_join_errors();

  begin("a blocking init whose peer never comes aborts after MUON_STANDIN_HANG_S with a message");
  case_hang_abort();

  begin("finalize: non-blocking in progress until its queued work ran; blocking; calls after it refused");
  {
    ring x;
    CHECK(ring_init(&x, g_me, g_n, 2000, 17), "ring buffers");
    r = ring_post(&x, nb, s2);
    CHECK(r == ncclInProgress, "group: %s", ncclGetErrorString(r));
    CHECK(poll_comm(nb, 20) == ncclSuccess, "poll");
    r = ncclCommFinalize(nb);
    CHECK(r == ncclInProgress, "non-blocking finalize: %s", ncclGetErrorString(r));
    r = poll_comm(nb, 0.05);
    CHECK(r == ncclInProgress, "finalize with work still queued: %s", ncclGetErrorString(r));
    CHECK(cudaStreamSynchronize(s2) == cudaSuccess, "cudaStreamSynchronize");
    CHECK(ring_wrong(&x, 1) == 0, "wrong data");
    CHECK(poll_comm(nb, 20) == ncclSuccess, "finalize after the work ran");
    CHECK(ncclCommDestroy(nb) == ncclSuccess, "destroy nb");
    r = ncclCommFinalize(world);
    CHECK(r == ncclSuccess, "blocking finalize: %s", ncclGetErrorString(r));
    r = ring_post(&x, world, s1);
    CHECK(r == ncclInvalidUsage, "a group on a finalized comm: %s", ncclGetErrorString(r));
    CHECK(ncclCommDestroy(world) == ncclSuccess, "destroy world");
    ring_free(&x);
  }

  begin("counters and messages");
  CHECK(muon_standin_nccl_calls("ncclSend") > 10 && muon_standin_nccl_calls("ncclGroupEnd") > 5, "call counts");
  CHECK(muon_standin_nccl_calls("launch") > 5 && muon_standin_nccl_calls("progress") > 5, "launch/progress counts");
  CHECK(muon_standin_nccl_calls("ncclNoSuchCall") == -1, "unknown name");
  CHECK(muon_standin_nccl_last_message()[0] != '\0' && ncclGetLastError(NULL)[0] != '\0', "no last message");

  begin("no segment of this run is left in /dev/shm");
  CHECK(barrier(), "barrier");
  k = shm_leftovers(g_pids, g_n, 0, left, sizeof left);
  CHECK(k == 0, "%d segment(s) left, e.g. /dev/shm/%s", k, left);

  /* rank 0 counts every rank's failed cases */
  if (test__in_case && test__case_failed) case_failed_mask |= (uint64_t)1 << case_index;
  test__end_case();
  snprintf(key, sizeof key, "result-%d", g_me);
  store_put(key, &case_failed_mask, sizeof case_failed_mask);
  if (g_me == 0) {
    uint64_t all = 0, m;
    for (i = 0; i < g_n; i++) {
      snprintf(key, sizeof key, "result-%d", i);
      if (!store_get(key, &m, sizeof m, 60)) { printf("FAIL rank %d reported no result\n", i); test__failed++; }
      else all |= m;
    }
    for (k = 0; k <= case_index; k++)
      if ((all >> k & 1) && !(case_failed_mask >> k & 1)) {
        test__passed--;
        test__failed++;
        printf("FAIL case %d failed on another rank (see its output)\n", k);
      }
    printf("rank 0: %d ranks, %.2f s\n", g_n, now_s() - t_start);
    fail = test_summary();
    store_put("done", &fail, sizeof fail);
  } else {
    fail = test__failed ? 1 : 0;
    store_get("done", &v, sizeof v, 120); /* nobody exits (and stops the others) before rank 0 printed */
  }
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  free(g_pids);
  return fail;
}
