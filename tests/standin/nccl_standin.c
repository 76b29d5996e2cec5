/* nccl_standin.c - a strict CPU stand-in for the NCCL functions muon_nccl.h calls, so the NCCL
   backend can be tested with several local processes on a machine without a GPU. It is compiled
   against the real <nccl.h> and linked INSTEAD of libnccl, together with cuda_standin.o (whose
   streams and device memory it uses). Only the functions below exist: a program calling any other
   NCCL function fails to link rather than silently working. See standin.h for the test hooks.

   Model (what makes it strict):
   - Ranks are processes of one machine. ncclGetUniqueId names a new POSIX shared-memory segment;
     every rank of a communicator maps it: a header (join count, split boards, error slots) and one
     channel per ordered (src, dst) pair (a one-chunk slot of 256 KiB plus a descriptor, moved with
     a head/tail handshake). The first rank to arrive creates and sizes it (zero-filled); the last
     one to join unlinks it, so nothing is left in /dev/shm once a communicator is complete.
   - Blocking init/split wait on the host and, where a real NCCL would hang forever, abort with a
     message after MUON_STANDIN_HANG_S seconds (default 30). Non-blocking ones (config.blocking 0)
     return ncclInProgress and do nothing until ncclCommGetAsyncError, which makes progress. Every
     other call on a communicator still in progress fails with ncclInvalidUsage.
   - A group (or a single call outside one) becomes, per (communicator, stream), ONE operation
     queued on the stream with muon_standin_enqueue: nothing moves before the stream runs it, and
     all sends and receives of the group progress together. A non-blocking communicator's group is
     queued only at its next ncclCommGetAsyncError (ncclGroupEnd returns ncclInProgress), so a
     program that synchronises the stream before polling reads stale data, as on a GPU.
   - Every message carries its kind, count, datatype and (collectives) sequence number; a
     receiver whose posted operation differs gives BOTH ranks the async error ncclInvalidUsage with
     a message naming both sides, printed once to stderr. Stricter than NCCL: a zero-count send or
     receive is a message too and must be matched; a send completes only when the receiver has
     taken all of it (no eager completion a larger message could not have).
   - A communicator with an async error never completes its queued operations (the stream stays
     stuck, as a GPU kernel would) until ncclCommAbort, which lets them finish at once without
     moving data. Peers are not told about an abort.
   Locking: one process-wide mutex for NCCL state; API calls may call the CUDA stand-in while
   holding it. The progress callback runs under the CUDA stand-in's lock and never takes that
   mutex: what it shares with the API is atomic (aborted flag, async error, queued count), and
   messages are copied under a small leaf lock. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#include "standin.h"

#define NS_MAX_RANKS 64
#define NS_CHUNK (256u * 1024u)               /* bytes per channel slot                        */
#define NS_CHAN_CTRL 256                       /* channel control block before the slot         */
#define NS_CHAN_STRIDE ((size_t)NS_CHAN_CTRL + NS_CHUNK)
#define NS_BOARDS 2                            /* split boards, reused alternately (see split)  */
#define NS_TEXT 512                            /* error messages                                */
#define NS_NAME 200                            /* shared-memory names                           */
#define NS_ID_MAGIC "MUONNCCL"                 /* first 8 bytes of an ncclUniqueId              */
#define NS_CONFIG_MAGIC 0xcafebeefu            /* what NCCL_CONFIG_INITIALIZER writes            */

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

/* =============================================================================================
   Call counters and fault injection
   ============================================================================================= */
#define NS_CALLS(X)                                                                                \
  X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommInitRankConfig)               \
  X(ncclCommSplit) X(ncclCommFinalize) X(ncclCommDestroy) X(ncclCommAbort) X(ncclCommGetAsyncError) \
  X(ncclGetErrorString) X(ncclGetLastError) X(ncclCommCount) X(ncclCommUserRank)                   \
  X(ncclCommCuDevice) X(ncclGroupStart) X(ncclGroupEnd) X(ncclSend) X(ncclRecv) X(ncclAllGather)   \
  X(launch) X(progress)

#define NS_ENUM(name) K_##name,
enum { NS_CALLS(NS_ENUM) K_COUNT };
#define NS_NAME_OF(name) #name,
static const char *const g_call_names[K_COUNT] = { NS_CALLS(NS_NAME_OF) };

static long long g_calls[K_COUNT];        /* under g_lock, except K_progress (atomic)            */
static int g_fail_in[K_COUNT];            /* countdowns: the call that brings one to 0 fails     */
static int g_fail_async;                  /* atomic countdown over executed group operations     */

/* =============================================================================================
   Shared memory layout (one segment per communicator)
   ============================================================================================= */
typedef struct ns_slot { int32_t tag, color, key, pad; } ns_slot; /* tag: split seq + 1 */

typedef struct ns_shm {
  int32_t nranks;                         /* set by the first rank to map it                    */
  int32_t joined;                         /* ranks registered                                   */
  int32_t poison, poison_claim;           /* a join error every member must see                 */
  char poison_msg[NS_TEXT];
  int32_t rank_joined[NS_MAX_RANKS];
  int32_t err[NS_MAX_RANKS];              /* async error a peer found for rank r (mismatch)     */
  int32_t err_claim[NS_MAX_RANKS];
  char err_msg[NS_MAX_RANKS][NS_TEXT];
  ns_slot board[NS_BOARDS][NS_MAX_RANKS]; /* ncclCommSplit: (color, key) of every rank          */
} ns_shm;

enum { NS_KIND_SEND = 1, NS_KIND_ALLGATHER = 2 };

/* Describes the chunk in a channel's slot. */
typedef struct ns_msg {
  int32_t kind, dtype;
  uint64_t count, bytes;                  /* the whole message                                  */
  uint64_t offset, len;                   /* this chunk                                         */
  uint64_t index;                         /* sender's message number on this channel            */
  uint64_t seq;                           /* ncclAllGather: the communicator's collective number */
} ns_msg;

typedef struct ns_chan {
  uint64_t head;                          /* chunks published by the sender                     */
  unsigned char pad0[56];
  uint64_t tail;                          /* chunks consumed by the receiver                    */
  unsigned char pad1[56];
  ns_msg msg;
} ns_chan;
typedef char ns_chan_fits[sizeof(ns_chan) <= NS_CHAN_CTRL ? 1 : -1];

static size_t shm_header_bytes(void) { return (sizeof(ns_shm) + 4095) / 4096 * 4096; }
static size_t shm_bytes(int nranks) { return shm_header_bytes() + (size_t)nranks * (size_t)nranks * NS_CHAN_STRIDE; }

/* =============================================================================================
   Communicators, tasks, groups
   ============================================================================================= */
enum { NS_PH_BOARD, NS_PH_OPEN, NS_PH_WAIT, NS_PH_READY, NS_PH_FAILED };
enum { NS_OUT, NS_IN, NS_LOCAL };
enum { NS_OP_SEND, NS_OP_RECV, NS_OP_ALLGATHER };

struct ncclComm;

/* One ncclCommSplit as seen by one rank: the board of the parent to read. Shared by the new
   communicator (its membership) and the parent (which is in progress until the board is full). */
typedef struct ns_job {
  int refs;                               /* under g_lock                                        */
  struct ncclComm *parent;                /* holds a reference                                   */
  uint64_t seq;
  int done;
  int color[NS_MAX_RANKS], key[NS_MAX_RANKS];
} ns_job;

/* One directional piece of a group operation. */
typedef struct ns_xfer {
  int dir, peer, kind, dtype;
  uint64_t count, bytes, index, seq;
  const unsigned char *src;               /* OUT, LOCAL                                          */
  unsigned char *dst;                     /* IN, LOCAL                                           */
  uint64_t nchunks, chunks;               /* chunks in the message, chunks moved                 */
  uint64_t ack_at;                        /* OUT: complete once the channel's tail reaches it    */
  int written, done;
} ns_xfer;

/* The operations of one group on one (communicator, stream): one queued stream operation. */
typedef struct ns_task {
  struct ns_task *next;                   /* the communicator's deferred list                    */
  struct ncclComm *comm;                  /* holds a reference                                   */
  cudaStream_t stream;
  int nx, started, done;
  ns_xfer *x;
  char what[64];
} ns_task;

struct ncclComm {
  struct ncclComm *next;                  /* live communicators (g_comms)                        */
  int refs;                               /* atomic: user handle, queued tasks, split jobs       */
  int rank, nranks, blocking, device;
  char name[NS_NAME];                     /* in messages: config.commName or the segment name    */
  int user_named;                         /* name is config.commName                             */
  char shm_name[NS_NAME];
  int phase;
  /* joining */
  unsigned char *seg;
  size_t seg_bytes;
  ns_shm *hdr;
  int all_joined;
  /* splitting */
  ns_job *board;                          /* new comm: the board that decides its membership     */
  ns_job *split_wait;                     /* parent: a non-blocking split's board not yet full   */
  int split_color, split_key, parent_rank;
  char parent_shm[NS_NAME];
  uint64_t split_seq;
  /* operations, API side (g_lock) */
  uint64_t *out_next, *in_next;           /* message numbers handed out per channel              */
  uint64_t coll_seq;
  ns_task *deferred;                      /* non-blocking: queued at ncclCommGetAsyncError       */
  int finalized, fin_pending;
  int queued;                             /* atomic: tasks on streams, not yet released          */
  /* operations, progress side (CUDA stand-in's lock) */
  uint64_t *out_cur, *in_cur;             /* message being moved per channel                     */
  /* errors */
  int aborted;                            /* atomic                                              */
  int32_t async_err, err_claim;           /* atomic; the first error wins                        */
  char async_msg[NS_TEXT];
};

typedef struct ns_op {
  struct ns_op *next;
  int kind, dtype, peer;
  struct ncclComm *comm;
  cudaStream_t stream;
  const void *sbuf;
  void *rbuf;
  size_t count;
} ns_op;

/* Names (and ranks) this process joined, to refuse a second join of the same rank. */
typedef struct ns_joined { struct ns_joined *next; char name[NS_NAME]; int rank; } ns_joined;

/* =============================================================================================
   Global state
   ============================================================================================= */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_msg_lock = PTHREAD_MUTEX_INITIALIZER; /* leaf: held only to copy text */
static int g_inited, g_verbose;
static char g_msg[NS_TEXT];
static struct ncclComm *g_comms;
static ns_joined *g_joined;
static unsigned g_id_counter;

/* Group state is per thread, as in NCCL. */
static __thread int t_depth;
static __thread ns_op *t_head, *t_tail;
static __thread ncclResult_t t_err;

/* =============================================================================================
   Small helpers
   ============================================================================================= */
static void lock(void) { pthread_mutex_lock(&g_lock); }
static void unlock(void) { pthread_mutex_unlock(&g_lock); }

static int ns_claim(int32_t *p) {
  int32_t zero = 0;
  return __atomic_compare_exchange_n(p, &zero, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void pause_briefly(void) {
  struct timespec ts = { 0, 100000 };
  nanosleep(&ts, NULL);
}

/* Read at every wait, so a test can set it in a child. */
static double hang_seconds(void) {
  const char *s = getenv("MUON_STANDIN_HANG_S");
  return s && *s && atof(s) > 0 ? atof(s) : 30.0;
}

static void set_msg(const char *text) {
  pthread_mutex_lock(&g_msg_lock);
  snprintf(g_msg, sizeof g_msg, "%s", text);
  pthread_mutex_unlock(&g_msg_lock);
  if (g_verbose) fprintf(stderr, "nccl_standin: %s\n", text);
}

/* Records why the last thing failed (muon_standin_nccl_last_message, ncclGetLastError). */
static void note(const char *fmt, ...) {
  char text[NS_TEXT];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  set_msg(text);
}

static ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
  char text[NS_TEXT];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  set_msg(text);
  return r;
}

static size_t dtype_size(int t) {
  switch (t) {
  case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  default: return 0;
  }
}

static const char *dtype_name(int t) {
  switch (t) {
  case ncclInt8: return "int8";
  case ncclUint8: return "uint8";
  case ncclInt32: return "int32";
  case ncclUint32: return "uint32";
  case ncclInt64: return "int64";
  case ncclUint64: return "uint64";
  case ncclFloat16: return "float16";
  case ncclFloat32: return "float32";
  case ncclFloat64: return "float64";
  case ncclBfloat16: return "bfloat16";
  case ncclFloat8e4m3: return "float8e4m3";
  case ncclFloat8e5m2: return "float8e5m2";
  default: return "?";
  }
}

/* =============================================================================================
   Initialisation and fault injection
   ============================================================================================= */
static int call_id(const char *name) {
  int i;
  if (!name) return -1;
  for (i = 0; i < K_COUNT; i++)
    if (strcmp(name, g_call_names[i]) == 0) return i;
  return -1;
}

static void arm_failure(const char *name, int nth) {
  int id = call_id(name);
  if (nth < 0) nth = 0;
  if (name && strcmp(name, "async") == 0) { STORE(&g_fail_async, nth); return; }
  if (id == K_ncclCommInitRankConfig || id == K_ncclCommSplit || id == K_ncclGroupEnd) { g_fail_in[id] = nth; return; }
  fprintf(stderr, "nccl_standin: muon_standin_nccl_fail: no injectable call named \"%s\" (ncclCommInitRankConfig, "
          "ncclCommSplit, ncclGroupEnd, async)\n", name ? name : "(null)");
}

static int inject(int id) { return g_fail_in[id] > 0 && --g_fail_in[id] == 0; }

/* Executed group operations count down "async" (progress side: atomic). */
static int take_async_failure(void) {
  int v = LOAD(&g_fail_async);
  while (v > 0)
    if (__atomic_compare_exchange_n(&g_fail_async, &v, v - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return v == 1;
  return 0;
}

static void init_locked(void) {
  const char *s;
  if (g_inited) return;
  g_inited = 1;
  s = getenv("MUON_STANDIN_VERBOSE");
  g_verbose = s && *s && strcmp(s, "0") != 0;
  s = getenv("MUON_STANDIN_NCCL_FAIL");
  if (s && *s) {
    char buf[256];
    char *tok, *save = NULL;
    snprintf(buf, sizeof buf, "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
      char *colon = strchr(tok, ':');
      if (!colon) { fprintf(stderr, "nccl_standin: MUON_STANDIN_NCCL_FAIL entry \"%s\" is not name:nth\n", tok); continue; }
      *colon = '\0';
      arm_failure(tok, atoi(colon + 1));
    }
  }
}

/* Every entry point starts with this: lock, initialise on first use, count the call. */
static void enter(int id) {
  lock();
  init_locked();
  g_calls[id]++;
}

/* =============================================================================================
   Errors of a communicator (shared with the progress side)
   ============================================================================================= */
static void comm_set_error(struct ncclComm *c, ncclResult_t e, const char *fmt, ...) {
  va_list ap;
  if (!ns_claim(&c->err_claim)) return; /* the first error wins; its text never changes */
  va_start(ap, fmt);
  vsnprintf(c->async_msg, sizeof c->async_msg, fmt, ap);
  va_end(ap);
  STORE(&c->async_err, (int32_t)e);
  set_msg(c->async_msg);
}

/* A peer that found a mismatch in our message posted it in the segment: take it over. */
static void adopt_peer_error(struct ncclComm *c) {
  int e;
  if (!c->hdr || c->phase != NS_PH_READY || LOAD(&c->async_err)) return;
  e = LOAD(&c->hdr->err[c->rank]);
  if (e) comm_set_error(c, (ncclResult_t)e, "%s", c->hdr->err_msg[c->rank]);
}

static ncclResult_t comm_error(struct ncclComm *c) {
  adopt_peer_error(c);
  return (ncclResult_t)LOAD(&c->async_err);
}

static void post_peer_error(struct ncclComm *c, int peer, ncclResult_t e, const char *text) {
  if (!ns_claim(&c->hdr->err_claim[peer])) return;
  snprintf(c->hdr->err_msg[peer], NS_TEXT, "%s", text);
  STORE(&c->hdr->err[peer], (int32_t)e);
}

/* =============================================================================================
   Communicator lifetime
   ============================================================================================= */
static void job_unref(ns_job *j);

static void comm_free(struct ncclComm *c) {
  if (c->seg) munmap(c->seg, c->seg_bytes);
  free(c->out_next); free(c->in_next); free(c->out_cur); free(c->in_cur);
  free(c);
}

/* Either lock may be held: a communicator reaches 0 only after it left g_comms. */
static void comm_unref(struct ncclComm *c) {
  if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0) comm_free(c);
}

static void comm_ref(struct ncclComm *c) { __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL); }

static int comm_live(const struct ncclComm *c) {
  const struct ncclComm *p;
  for (p = g_comms; p; p = p->next)
    if (p == c) return 1;
  return 0;
}

static void comm_unlist(struct ncclComm *c) {
  struct ncclComm **pp;
  for (pp = &g_comms; *pp; pp = &(*pp)->next)
    if (*pp == c) { *pp = c->next; return; }
}

static void comm_list(struct ncclComm *c) {
  c->next = g_comms;
  g_comms = c;
}

static struct ncclComm *comm_new(int blocking, const char *comm_name) {
  struct ncclComm *c = (struct ncclComm *)calloc(1, sizeof *c);
  if (!c) return NULL;
  c->refs = 1;
  c->blocking = blocking;
  if (cudaGetDevice(&c->device) != cudaSuccess) c->device = 0;
  if (comm_name) snprintf(c->name, sizeof c->name, "%s", comm_name);
  c->user_named = comm_name != NULL;
  return c;
}

static int comm_inprogress(const struct ncclComm *c) {
  if (c->phase != NS_PH_READY && c->phase != NS_PH_FAILED) return 1;
  return c->deferred || (c->split_wait && !c->split_wait->done) || c->fin_pending;
}

static void registry_forget(const char *name, int rank) {
  ns_joined **pp;
  for (pp = &g_joined; *pp; pp = &(*pp)->next)
    if ((*pp)->rank == rank && strcmp((*pp)->name, name) == 0) {
      ns_joined *j = *pp;
      *pp = j->next;
      free(j);
      return;
    }
}

static void task_free(ns_task *t) {
  comm_unref(t->comm);
  free(t->x);
  free(t);
}

/* What abort and a failed blocking call share: the segment goes if the join never completed
   (the others cannot complete it either), pending work is dropped, the handle's reference too. */
static void comm_drop(struct ncclComm *c) {
  STORE(&c->aborted, 1);
  if (c->shm_name[0] && !c->all_joined) { /* a retry with the same id may join again */
    shm_unlink(c->shm_name);
    registry_forget(c->shm_name, c->rank);
  }
  if (c->board) { job_unref(c->board); c->board = NULL; }
  if (c->split_wait) { job_unref(c->split_wait); c->split_wait = NULL; }
  while (c->deferred) {
    ns_task *t = c->deferred;
    c->deferred = t->next;
    task_free(t);
  }
  comm_unref(c);
}

/* =============================================================================================
   Joining a segment (init and split)
   ============================================================================================= */
static ncclResult_t join_fail(struct ncclComm *c, ncclResult_t e, const char *fmt, ...) {
  char text[NS_TEXT];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  c->phase = NS_PH_FAILED;
  comm_set_error(c, e, "%s", text);
  return e;
}

/* Poisons a segment every member has mapped: they all fail instead of waiting forever. */
static void poison(ns_shm *h, const char *text) {
  if (!ns_claim(&h->poison_claim)) return;
  snprintf(h->poison_msg, sizeof h->poison_msg, "%s", text);
  STORE(&h->poison, (int32_t)ncclInvalidUsage);
}

static int alloc_channels(struct ncclComm *c) {
  size_t n = (size_t)c->nranks;
  c->out_next = (uint64_t *)calloc(n, sizeof(uint64_t));
  c->in_next = (uint64_t *)calloc(n, sizeof(uint64_t));
  c->out_cur = (uint64_t *)calloc(n, sizeof(uint64_t));
  c->in_cur = (uint64_t *)calloc(n, sizeof(uint64_t));
  return c->out_next && c->in_next && c->out_cur && c->in_cur;
}

/* One non-blocking step: open or create the segment, register, then wait for everyone. */
static void join_step(struct ncclComm *c) {
  if (c->phase == NS_PH_OPEN) {
    size_t want = shm_bytes(c->nranks);
    struct stat st;
    int fd = shm_open(c->shm_name, O_RDWR | O_CREAT | O_EXCL, 0600);
    void *p;
    int32_t zero = 0;
    if (fd >= 0) {
      if (ftruncate(fd, (off_t)want) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(c->shm_name);
        join_fail(c, ncclSystemError, "comm %s: cannot size shared memory %s to %zu bytes: %s", c->name, c->shm_name, want, strerror(e));
        return;
      }
    } else {
      if (errno != EEXIST) { join_fail(c, ncclSystemError, "comm %s: shm_open(%s): %s", c->name, c->shm_name, strerror(errno)); return; }
      fd = shm_open(c->shm_name, O_RDWR, 0600);
      if (fd < 0) {
        if (errno == ENOENT) return; /* unlinked in between: try again */
        join_fail(c, ncclSystemError, "comm %s: shm_open(%s): %s", c->name, c->shm_name, strerror(errno));
        return;
      }
      if (fstat(fd, &st) != 0 || st.st_size == 0) { close(fd); return; } /* its creator has not sized it yet */
      if ((size_t)st.st_size != want) {
        char text[NS_TEXT];
        p = mmap(NULL, shm_header_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        snprintf(text, sizeof text, "comm %s: rank %d joins with nranks %d, but another rank created it with a different "
                 "nranks (every rank must pass the same nranks)", c->name, c->rank, c->nranks);
        if (p != MAP_FAILED) { poison((ns_shm *)p, text); munmap(p, shm_header_bytes()); }
        join_fail(c, ncclInvalidUsage, "%s", text);
        return;
      }
    }
    p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) { join_fail(c, ncclSystemError, "comm %s: mmap of %zu bytes: %s", c->name, want, strerror(errno)); return; }
    c->seg = (unsigned char *)p;
    c->seg_bytes = want;
    c->hdr = (ns_shm *)p;
    if (!__atomic_compare_exchange_n(&c->hdr->nranks, &zero, c->nranks, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&
        zero != c->nranks) {
      char text[NS_TEXT];
      snprintf(text, sizeof text, "comm %s: rank %d joins with nranks %d, another rank with nranks %d", c->name, c->rank, c->nranks, zero);
      poison(c->hdr, text);
      join_fail(c, ncclInvalidUsage, "%s", text);
      return;
    }
    if (!ns_claim(&c->hdr->rank_joined[c->rank])) {
      char text[NS_TEXT];
      snprintf(text, sizeof text, "comm %s: rank %d joined twice (two processes passed the same rank)", c->name, c->rank);
      poison(c->hdr, text);
      join_fail(c, ncclInvalidUsage, "%s", text);
      return;
    }
    if (__atomic_add_fetch(&c->hdr->joined, 1, __ATOMIC_ACQ_REL) == c->nranks) {
      shm_unlink(c->shm_name); /* everyone has it mapped: nothing may outlive the processes */
      c->all_joined = 1;
    }
    c->phase = NS_PH_WAIT;
  }
  if (c->phase == NS_PH_WAIT) {
    if (LOAD(&c->hdr->poison)) { join_fail(c, ncclInvalidUsage, "%s", c->hdr->poison_msg); return; }
    if (LOAD(&c->hdr->joined) < c->nranks) return;
    c->all_joined = 1;
    if (!alloc_channels(c)) { join_fail(c, ncclSystemError, "comm %s: out of host memory", c->name); return; }
    c->phase = NS_PH_READY;
  }
}

/* =============================================================================================
   Split boards. Board seq % 2 holds every parent rank's (color, key) for split number seq. A rank
   posts split seq + 1 only after it saw board seq full (a blocking split waits in the call, a
   non-blocking one leaves the parent in progress), so no one overwrites a board still being read.
   ============================================================================================= */
static ns_job *job_new(struct ncclComm *parent, uint64_t seq) {
  ns_job *j = (ns_job *)calloc(1, sizeof *j);
  if (!j) return NULL;
  j->refs = 1;
  j->parent = parent;
  j->seq = seq;
  comm_ref(parent);
  return j;
}

static void job_unref(ns_job *j) {
  if (--j->refs > 0) return;
  comm_unref(j->parent);
  free(j);
}

static int job_step(ns_job *j) {
  const struct ncclComm *p = j->parent;
  ns_slot *b = p->hdr->board[j->seq % NS_BOARDS];
  int r;
  if (j->done) return 1;
  for (r = 0; r < p->nranks; r++)
    if (LOAD(&b[r].tag) != (int32_t)(j->seq + 1)) return 0;
  for (r = 0; r < p->nranks; r++) {
    j->color[r] = b[r].color;
    j->key[r] = b[r].key;
  }
  j->done = 1;
  return 1;
}

/* The board is full: this rank's new communicator, ordered by key, then parent rank. */
static void split_membership(struct ncclComm *c) {
  const ns_job *j = c->board;
  int r, n = 0, me = 0;
  for (r = 0; r < j->parent->nranks; r++) {
    if (j->color[r] != c->split_color) continue;
    if (j->key[r] < c->split_key || (j->key[r] == c->split_key && r < c->parent_rank)) me++;
    n++;
  }
  c->nranks = n;
  c->rank = me;
  char name[NS_NAME + 64];
  snprintf(name, sizeof name, "%s.s%llu.c%d", c->parent_shm, (unsigned long long)j->seq, c->split_color);
  if (strlen(name) < NS_NAME) {
    memcpy(c->shm_name, name, strlen(name) + 1);
  } else { /* deep splits: keep the root's prefix, hash the rest */
    uint64_t h = 1469598103934665603ull;
    const char *s;
    for (s = c->parent_shm; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    h = (h ^ j->seq) * 1099511628211ull;
    h = (h ^ (uint64_t)(unsigned)c->split_color) * 1099511628211ull;
    snprintf(c->shm_name, sizeof c->shm_name, "%.40s.h%016llx", c->parent_shm, (unsigned long long)h);
  }
  if (!c->user_named) snprintf(c->name, sizeof c->name, "%s", c->shm_name + 1);
  job_unref(c->board);
  c->board = NULL;
  c->phase = NS_PH_OPEN;
}

/* =============================================================================================
   Progress (runs under the CUDA stand-in's lock: no g_lock, shared state through atomics)
   ============================================================================================= */
static ns_chan *chan_of(const struct ncclComm *c, int src, int dst) {
  return (ns_chan *)(c->seg + shm_header_bytes() + ((size_t)src * (size_t)c->nranks + (size_t)dst) * NS_CHAN_STRIDE);
}

static unsigned char *chan_data(ns_chan *ch) { return (unsigned char *)ch + NS_CHAN_CTRL; }

static void describe_sent(char *buf, size_t n, const ns_msg *m) {
  if (m->kind == NS_KIND_ALLGATHER)
    snprintf(buf, n, "%llu x %s (ncclAllGather #%llu)", (unsigned long long)m->count, dtype_name(m->dtype), (unsigned long long)m->seq);
  else
    snprintf(buf, n, "%llu x %s (ncclSend)", (unsigned long long)m->count, dtype_name(m->dtype));
}

static void describe_posted(char *buf, size_t n, const ns_xfer *x) {
  if (x->kind == NS_KIND_ALLGATHER)
    snprintf(buf, n, "ncclAllGather #%llu of %llu x %s", (unsigned long long)x->seq, (unsigned long long)x->count, dtype_name(x->dtype));
  else
    snprintf(buf, n, "ncclRecv of %llu x %s", (unsigned long long)x->count, dtype_name(x->dtype));
}

static void report_mismatch(struct ncclComm *c, const ns_xfer *x, const ns_msg *m) {
  char text[NS_TEXT], sent[96], posted[96];
  describe_sent(sent, sizeof sent, m);
  describe_posted(posted, sizeof posted, x);
  snprintf(text, sizeof text, "mismatch on comm %s: rank %d sends %s to rank %d, which posted %s from rank %d",
           c->name, x->peer, sent, c->rank, posted, x->peer);
  if (LOAD(&c->async_err) == 0) fprintf(stderr, "nccl_standin: %s\n", text);
  comm_set_error(c, ncclInvalidUsage, "%s", text);
  post_peer_error(c, x->peer, ncclInvalidUsage, text);
}

/* Each step moves what it can without waiting; returns 1 if it moved anything. */
static int step_out(struct ncclComm *c, ns_xfer *x) {
  ns_chan *ch = chan_of(c, c->rank, x->peer);
  int moved = 0;
  if (!x->written) {
    if (c->out_cur[x->peer] != x->index) return 0; /* an earlier message of the channel first */
    while (x->chunks < x->nchunks) {
      uint64_t head = __atomic_load_n(&ch->head, __ATOMIC_RELAXED), off = x->chunks * NS_CHUNK;
      if (LOAD(&ch->tail) != head) break; /* the slot is still full */
      ch->msg.kind = x->kind;
      ch->msg.dtype = x->dtype;
      ch->msg.count = x->count;
      ch->msg.bytes = x->bytes;
      ch->msg.offset = off;
      ch->msg.len = x->bytes - off < NS_CHUNK ? x->bytes - off : NS_CHUNK;
      ch->msg.index = x->index;
      ch->msg.seq = x->seq;
      if (ch->msg.len) memcpy(chan_data(ch), x->src + off, (size_t)ch->msg.len);
      STORE(&ch->head, head + 1);
      x->chunks++;
      moved = 1;
      if (x->chunks == x->nchunks) {
        x->written = 1;
        x->ack_at = head + 1;
        c->out_cur[x->peer]++;
      }
    }
  }
  if (x->written && LOAD(&ch->tail) >= x->ack_at) { x->done = 1; moved = 1; }
  return moved;
}

static int step_in(struct ncclComm *c, ns_xfer *x) {
  ns_chan *ch = chan_of(c, x->peer, c->rank);
  int moved = 0;
  if (c->in_cur[x->peer] != x->index) return 0;
  while (x->chunks < x->nchunks) {
    uint64_t tail = __atomic_load_n(&ch->tail, __ATOMIC_RELAXED);
    ns_msg m;
    if (LOAD(&ch->head) == tail) break; /* nothing there yet */
    m = ch->msg;
    if (m.index != x->index || m.kind != x->kind || m.dtype != x->dtype || m.count != x->count ||
        (x->kind == NS_KIND_ALLGATHER && m.seq != x->seq) || m.offset != x->chunks * NS_CHUNK ||
        m.offset + m.len > x->bytes) {
      report_mismatch(c, x, &m);
      return 0;
    }
    if (m.len) memcpy(x->dst + m.offset, chan_data(ch), (size_t)m.len);
    STORE(&ch->tail, tail + 1);
    x->chunks++;
    moved = 1;
  }
  if (x->chunks == x->nchunks) {
    x->done = 1;
    c->in_cur[x->peer]++;
  }
  return moved;
}

static int task_progress(void *arg) {
  ns_task *t = (ns_task *)arg;
  struct ncclComm *c = t->comm;
  int i, moved, pending;
  __atomic_add_fetch(&g_calls[K_progress], 1, __ATOMIC_RELAXED);
  if (LOAD(&c->aborted)) return 1; /* complete at once, moving nothing: the stream drains */
  if (t->done) return 1;
  if (comm_error(c)) return 0;     /* a GPU kernel of a broken communicator stays stuck */
  if (!t->started) {
    t->started = 1;
    if (take_async_failure()) {
      comm_set_error(c, ncclSystemError, "injected async failure (\"async\") on comm %s, rank %d: the group's "
                     "operations never complete", c->name, c->rank);
      return 0;
    }
  }
  do {
    moved = 0;
    pending = 0;
    for (i = 0; i < t->nx; i++) {
      ns_xfer *x = &t->x[i];
      if (x->done) continue;
      if (x->dir == NS_OUT) moved |= step_out(c, x);
      else if (x->dir == NS_IN) moved |= step_in(c, x);
      else {
        if (x->bytes) memmove(x->dst, x->src, (size_t)x->bytes);
        x->done = moved = 1;
      }
      if (LOAD(&c->async_err)) return 0;
      if (!x->done) pending = 1;
    }
  } while (pending && moved);
  if (pending) return 0;
  t->done = 1;
  return 1;
}

static void task_release(void *arg) {
  ns_task *t = (ns_task *)arg;
  __atomic_sub_fetch(&t->comm->queued, 1, __ATOMIC_ACQ_REL);
  task_free(t);
}

/* =============================================================================================
   Host-side progress and blocking waits (g_lock held)
   ============================================================================================= */
static ncclResult_t enqueue_task(ns_task *t) {
  struct ncclComm *c = t->comm;
  cudaError_t e;
  __atomic_add_fetch(&c->queued, 1, __ATOMIC_ACQ_REL);
  e = muon_standin_enqueue(t->stream, task_progress, task_release, t, t->what);
  if (e != cudaSuccess) {
    __atomic_sub_fetch(&c->queued, 1, __ATOMIC_ACQ_REL);
    comm_set_error(c, ncclUnhandledCudaError, "comm %s: queueing the group on stream %p failed: %s (unknown or destroyed stream?)",
                   c->name, (void *)t->stream, muon_standin_last_message());
    task_free(t);
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

/* What ncclCommGetAsyncError and the blocking waits drive. */
static void comm_poll(struct ncclComm *c) {
  if (c->phase == NS_PH_BOARD && job_step(c->board)) split_membership(c);
  if (c->phase == NS_PH_OPEN || c->phase == NS_PH_WAIT) join_step(c);
  if (c->split_wait && job_step(c->split_wait)) { job_unref(c->split_wait); c->split_wait = NULL; }
  if (c->phase != NS_PH_READY) return;
  if (comm_error(c)) return; /* deferred groups stay unqueued: only ncclCommAbort remains */
  while (c->deferred) {
    ns_task *t = c->deferred;
    c->deferred = t->next;
    t->next = NULL;
    if (enqueue_task(t) != ncclSuccess) break;
  }
  if (c->fin_pending && LOAD(&c->queued) == 0) c->fin_pending = 0;
}

static void list_missing(char *buf, size_t n, const int32_t *flags, int count, int32_t want, int stride) {
  size_t len = 0;
  int r, k = 0;
  buf[0] = '\0';
  for (r = 0; r < count && len + 16 < n; r++)
    if (LOAD(&flags[(size_t)r * (size_t)stride]) != want) {
      len += (size_t)snprintf(buf + len, n - len, "%s%d", k ? ", " : "", r);
      k++;
    }
  if (r < count) snprintf(buf + len, n - len, ", ...");
}

static void describe_wait(const struct ncclComm *c, char *buf, size_t n) {
  char who[200];
  const ns_job *j = c->phase == NS_PH_BOARD ? c->board : c->split_wait;
  if (j && !j->done) {
    const ns_shm *h = j->parent->hdr;
    list_missing(who, sizeof who, &h->board[j->seq % NS_BOARDS][0].tag, j->parent->nranks, (int32_t)(j->seq + 1), 4);
    snprintf(buf, n, "parent ranks %s of %d of comm %s have not called ncclCommSplit #%llu", who, j->parent->nranks,
             j->parent->name, (unsigned long long)j->seq);
  } else if (c->phase == NS_PH_OPEN) {
    snprintf(buf, n, "the rank creating comm %s has not sized its shared memory %s", c->name, c->shm_name);
  } else if (c->phase == NS_PH_WAIT) {
    list_missing(who, sizeof who, c->hdr->rank_joined, c->nranks, 1, 1);
    snprintf(buf, n, "ranks %s of %d have not joined comm %s", who, c->nranks, c->name);
  } else {
    snprintf(buf, n, "comm %s", c->name);
  }
}

/* Blocking init/split: poll until ready. A real NCCL would wait forever; this aborts. */
static ncclResult_t wait_ready(struct ncclComm *c, const char *fn) {
  double t0 = now_s(), limit = hang_seconds();
  for (;;) {
    ncclResult_t e;
    comm_poll(c);
    if ((e = (ncclResult_t)LOAD(&c->async_err)) != ncclSuccess) return e;
    if (!comm_inprogress(c)) return ncclSuccess;
    if (now_s() - t0 > limit) {
      char what[NS_TEXT];
      describe_wait(c, what, sizeof what);
      fprintf(stderr, "nccl_standin: %s has waited %.0f s: %s; a real NCCL would hang here forever "
              "(MUON_STANDIN_HANG_S). Aborting.\n", fn, now_s() - t0, what);
      abort();
    }
    unlock();
    pause_briefly();
    lock();
  }
}

/* =============================================================================================
   Argument checks
   ============================================================================================= */
/* A communicator usable for a call: live, nothing in progress; `ops`: also no async error and
   not finalized. */
static ncclResult_t check_comm(const char *fn, struct ncclComm *c, int ops) {
  ncclResult_t e;
  if (!c) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
  if (!comm_live(c)) return fail(ncclInvalidArgument, "%s: comm %p is not a live communicator (destroyed or aborted?)", fn, (void *)c);
  if (c->split_wait && c->split_wait->done) { /* seen through the new comm: drop the board (and its parent reference) */
    job_unref(c->split_wait);
    c->split_wait = NULL;
  }
  if (comm_inprogress(c))
    return fail(ncclInvalidUsage, "%s: comm %s: a previous call is still in progress (poll ncclCommGetAsyncError until it "
                "returns ncclSuccess first)", fn, c->name);
  if (c->phase == NS_PH_FAILED) return fail((ncclResult_t)LOAD(&c->async_err), "%s: comm %s failed to initialise: %s", fn, c->name, c->async_msg);
  if (!ops) return ncclSuccess;
  if ((e = comm_error(c)) != ncclSuccess)
    return fail(e, "%s: comm %s has an async error (abort it with ncclCommAbort): %s", fn, c->name, c->async_msg);
  if (c->finalized) return fail(ncclInvalidUsage, "%s: comm %s was finalized", fn, c->name);
  return ncclSuccess;
}

/* blocking from a config: NULL or NCCL_CONFIG_UNDEF_INT -> dflt. -1: invalid (noted). */
static int config_blocking(const char *fn, const ncclConfig_t *config, int dflt) {
  if (!config) return dflt;
  if (config->magic != NS_CONFIG_MAGIC) {
    note("%s: config was not initialised with NCCL_CONFIG_INITIALIZER", fn);
    return -1;
  }
  if (config->blocking == NCCL_CONFIG_UNDEF_INT) return 1;
  if (config->blocking != 0 && config->blocking != 1) { note("%s: config.blocking is %d (0 or 1)", fn, config->blocking); return -1; }
  return config->blocking;
}

static const char *config_name(const ncclConfig_t *config) {
  return config && config->magic == NS_CONFIG_MAGIC && config->commName && *config->commName ? config->commName : NULL;
}

/* =============================================================================================
   Version, ids, init
   ============================================================================================= */
ncclResult_t ncclGetVersion(int *version) {
  enter(K_ncclGetVersion);
  unlock();
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
  struct timespec ts;
  unsigned counter;
  uint64_t r;
  enter(K_ncclGetUniqueId);
  counter = ++g_id_counter;
  unlock();
  if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  clock_gettime(CLOCK_REALTIME, &ts);
  r = ((uint64_t)ts.tv_sec * 1000000007ull) ^ ((uint64_t)ts.tv_nsec << 17) ^ ((uint64_t)getpid() << 40) ^ counter;
  r *= 0x9E3779B97F4A7C15ull;
  memset(uniqueId, 0, sizeof *uniqueId);
  memcpy(uniqueId->internal, NS_ID_MAGIC, 8);
  snprintf(uniqueId->internal + 8, NCCL_UNIQUE_ID_BYTES - 8, "/muon-nccl-%d-%u-%08x", (int)getpid(), counter, (unsigned)(r >> 32));
  return ncclSuccess;
}

static ncclResult_t init_common(int id, ncclComm_t *comm, int nranks, const ncclUniqueId *uid, int rank, ncclConfig_t *config) {
  const char *fn = g_call_names[id];
  struct ncclComm *c;
  ns_joined *j;
  const char *name;
  int blocking;
  ncclResult_t e;
  enter(id);
  if (!comm) { unlock(); return fail(ncclInvalidArgument, "%s: comm is NULL", fn); }
  *comm = NULL;
  if (t_depth > 0) { unlock(); return fail(ncclInvalidUsage, "%s inside ncclGroupStart/End is not modelled by the stand-in", fn); }
  if (inject(K_ncclCommInitRankConfig)) { unlock(); return fail(ncclSystemError, "%s: injected failure", fn); }
  blocking = config_blocking(fn, config, 1);
  if (blocking < 0) { unlock(); return ncclInvalidArgument; }
  if (nranks < 1 || nranks > NS_MAX_RANKS) { unlock(); return fail(ncclInvalidArgument, "%s: nranks %d is not in [1, %d]", fn, nranks, NS_MAX_RANKS); }
  if (rank < 0 || rank >= nranks) { unlock(); return fail(ncclInvalidArgument, "%s: rank %d is not in [0, nranks %d)", fn, rank, nranks); }
  name = uid->internal + 8;
  if (memcmp(uid->internal, NS_ID_MAGIC, 8) != 0 || name[0] != '/' || !memchr(name, '\0', NCCL_UNIQUE_ID_BYTES - 8) ||
      strlen(name) >= NS_NAME) {
    unlock();
    return fail(ncclInvalidArgument, "%s: the ncclUniqueId does not come from ncclGetUniqueId", fn);
  }
  for (j = g_joined; j; j = j->next)
    if (j->rank == rank && strcmp(j->name, name) == 0) {
      unlock();
      return fail(ncclInvalidUsage, "%s: this process already joined %s as rank %d (a rank joining twice)", fn, name + 1, rank);
    }
  c = comm_new(blocking, config_name(config));
  j = (ns_joined *)calloc(1, sizeof *j);
  if (!c || !j) { free(c); free(j); unlock(); return fail(ncclSystemError, "%s: out of host memory", fn); }
  snprintf(j->name, sizeof j->name, "%s", name);
  j->rank = rank;
  j->next = g_joined;
  g_joined = j;
  snprintf(c->shm_name, sizeof c->shm_name, "%s", name);
  if (!c->name[0]) snprintf(c->name, sizeof c->name, "%s", name + 1);
  c->nranks = nranks;
  c->rank = rank;
  c->phase = NS_PH_OPEN;
  if (!blocking) { /* nothing happens before ncclCommGetAsyncError */
    comm_list(c);
    *comm = c;
    unlock();
    return ncclInProgress;
  }
  e = wait_ready(c, fn);
  if (e != ncclSuccess) {
    comm_drop(c);
    unlock();
    return e;
  }
  comm_list(c);
  *comm = c;
  unlock();
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  return init_common(K_ncclCommInitRank, comm, nranks, &commId, rank, NULL);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config) {
  return init_common(K_ncclCommInitRankConfig, comm, nranks, &commId, rank, config);
}

/* =============================================================================================
   Split
   ============================================================================================= */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  const char *fn = "ncclCommSplit";
  struct ncclComm *nc;
  ns_slot *slot;
  ns_job *job;
  uint64_t seq;
  int blocking;
  ncclResult_t e;
  enter(K_ncclCommSplit);
  if (!newcomm) { unlock(); return fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL"); }
  *newcomm = NULL;
  if ((e = check_comm(fn, comm, 1)) != ncclSuccess) { unlock(); return e; }
  if (t_depth > 0) { unlock(); return fail(ncclInvalidUsage, "ncclCommSplit inside ncclGroupStart/End is not modelled by the stand-in"); }
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) { unlock(); return fail(ncclInvalidArgument, "ncclCommSplit: color %d is negative (and not NCCL_SPLIT_NOCOLOR)", color); }
  blocking = config_blocking(fn, config, comm->blocking); /* no config: inherit the parent's */
  if (blocking < 0) { unlock(); return ncclInvalidArgument; }
  if (inject(K_ncclCommSplit)) { unlock(); return fail(ncclSystemError, "ncclCommSplit: injected failure"); }
  seq = comm->split_seq++;
  job = job_new(comm, seq);
  if (!job) { unlock(); return fail(ncclSystemError, "ncclCommSplit: out of host memory"); }
  slot = &comm->hdr->board[seq % NS_BOARDS][comm->rank];
  slot->color = color;
  slot->key = key;
  STORE(&slot->tag, (int32_t)(seq + 1));
  if (color == NCCL_SPLIT_NOCOLOR) { /* no new comm; the parent waits for the board (collective) */
    comm->split_wait = job;
    if (!blocking) { unlock(); return ncclInProgress; }
    e = wait_ready(comm, fn);
    unlock();
    return e;
  }
  nc = comm_new(blocking, config_name(config));
  if (!nc) { job_unref(job); unlock(); return fail(ncclSystemError, "ncclCommSplit: out of host memory"); }
  nc->phase = NS_PH_BOARD;
  nc->board = job;
  nc->split_color = color;
  nc->split_key = key;
  nc->parent_rank = comm->rank;
  snprintf(nc->parent_shm, sizeof nc->parent_shm, "%s", comm->shm_name);
  if (!nc->user_named) /* until the board says which segment it is */
    snprintf(nc->name, sizeof nc->name, "(split #%llu of %.150s)", (unsigned long long)seq, comm->name);
  if (!blocking) {
    job->refs++;
    comm->split_wait = job;
    comm_list(nc);
    *newcomm = nc;
    unlock();
    return ncclInProgress;
  }
  e = wait_ready(nc, fn);
  if (e != ncclSuccess) { comm_drop(nc); unlock(); return e; }
  comm_list(nc);
  *newcomm = nc;
  unlock();
  return ncclSuccess;
}

/* =============================================================================================
   Finalize, destroy, abort, errors, queries
   ============================================================================================= */
/* Blocking: returns at once (queued work still completes when its stream runs). Non-blocking:
   in progress until every queued operation of the communicator has been released. */
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ncclResult_t e;
  enter(K_ncclCommFinalize);
  if ((e = check_comm("ncclCommFinalize", comm, 1)) != ncclSuccess) { unlock(); return e; }
  comm->finalized = 1;
  if (!comm->blocking) {
    comm->fin_pending = 1;
    unlock();
    return ncclInProgress;
  }
  unlock();
  return ncclSuccess;
}

/* Queued operations still complete (they hold references); the rest goes now. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ncclResult_t e;
  enter(K_ncclCommDestroy);
  if (!comm) { unlock(); return ncclSuccess; }
  if ((e = check_comm("ncclCommDestroy", comm, 0)) != ncclSuccess) { unlock(); return e; }
  if ((e = comm_error(comm)) != ncclSuccess) {
    unlock();
    return fail(ncclInvalidUsage, "ncclCommDestroy: comm %s has an async error (%s): its operations never complete; use "
                "ncclCommAbort", comm->name, comm->async_msg);
  }
  comm_unlist(comm);
  comm_unref(comm);
  unlock();
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  enter(K_ncclCommAbort);
  if (!comm) { unlock(); return ncclSuccess; }
  if (!comm_live(comm)) { unlock(); return fail(ncclInvalidArgument, "ncclCommAbort: comm %p is not a live communicator", (void *)comm); }
  comm_unlist(comm);
  comm_drop(comm);
  unlock();
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  ncclResult_t e;
  enter(K_ncclCommGetAsyncError);
  if (!asyncError) { unlock(); return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL"); }
  if (!comm || !comm_live(comm)) { unlock(); return fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm %p is not a live communicator", (void *)comm); }
  comm_poll(comm);
  e = comm_error(comm);
  *asyncError = e != ncclSuccess ? e : comm_inprogress(comm) ? ncclInProgress : ncclSuccess;
  unlock();
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
  enter(K_ncclGetErrorString);
  unlock();
  switch (result) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

/* The communicator's async error text if it has one, else the process's last message. The
   pointer stays valid until the communicator is destroyed (or the next error, for the latter). */
const char *ncclGetLastError(ncclComm_t comm) {
  const char *m = g_msg;
  enter(K_ncclGetLastError);
  if (comm && comm_live(comm) && comm_error(comm) != ncclSuccess) m = comm->async_msg;
  unlock();
  return m;
}

static ncclResult_t query(int id, const struct ncclComm *comm, int *out, int what) {
  ncclResult_t e;
  enter(id);
  if (!out) { unlock(); return fail(ncclInvalidArgument, "%s: output pointer is NULL", g_call_names[id]); }
  if ((e = check_comm(g_call_names[id], (struct ncclComm *)comm, 0)) != ncclSuccess) { unlock(); return e; }
  *out = what == 0 ? comm->nranks : what == 1 ? comm->rank : comm->device;
  unlock();
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) { return query(K_ncclCommCount, comm, count, 0); }
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) { return query(K_ncclCommUserRank, comm, rank, 1); }
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) { return query(K_ncclCommCuDevice, comm, device, 2); }

/* =============================================================================================
   Groups and operations
   ============================================================================================= */
static void ops_free(ns_op *o) {
  while (o) {
    ns_op *n = o->next;
    free(o);
    o = n;
  }
}

/* Builds one task from the ops of communicator c (in issue order). Message numbers are handed out
   collectives first, then point-to-point, so ranks agree whatever order a group was issued in. */
static ns_task *build_task(struct ncclComm *c, const ns_op *ops) {
  const ns_op *o;
  ns_task *t = (ns_task *)calloc(1, sizeof *t);
  int nx = 0, pass, nsend = 0, nrecv = 0, ngather = 0;
  if (!t) return NULL;
  for (o = ops; o; o = o->next) {
    if (o->comm != c) continue;
    if (o->kind == NS_OP_ALLGATHER) { nx += 2 * (c->nranks - 1) + 1; ngather++; }
    else { nx++; if (o->kind == NS_OP_SEND) nsend++; else nrecv++; }
  }
  t->x = (ns_xfer *)calloc((size_t)nx, sizeof *t->x);
  if (!t->x) { free(t); return NULL; }
  for (pass = 0; pass < 2; pass++)
    for (o = ops; o; o = o->next) {
      size_t es = dtype_size(o->dtype), bytes = o->count * es;
      if (o->comm != c || (pass == 0) != (o->kind == NS_OP_ALLGATHER)) continue;
      if (o->kind == NS_OP_ALLGATHER) {
        uint64_t seq = c->coll_seq++;
        unsigned char *mine = (unsigned char *)o->rbuf + (size_t)c->rank * bytes;
        int p;
        for (p = 0; p < c->nranks; p++) {
          if (p == c->rank) continue;
          ns_xfer *out = &t->x[t->nx++], *in = &t->x[t->nx++];
          out->dir = NS_OUT; out->peer = p; out->kind = NS_KIND_ALLGATHER; out->dtype = o->dtype;
          out->count = o->count; out->bytes = bytes; out->seq = seq; out->index = c->out_next[p]++;
          out->src = (const unsigned char *)o->sbuf;
          *in = *out;
          in->dir = NS_IN;
          in->index = c->in_next[p]++;
          in->src = NULL;
          in->dst = (unsigned char *)o->rbuf + (size_t)p * bytes;
        }
        if ((const unsigned char *)o->sbuf != mine) {
          ns_xfer *l = &t->x[t->nx++];
          l->dir = NS_LOCAL; l->peer = c->rank; l->bytes = bytes;
          l->src = (const unsigned char *)o->sbuf; l->dst = mine;
        }
      } else {
        ns_xfer *x = &t->x[t->nx++];
        x->peer = o->peer; x->kind = NS_KIND_SEND; x->dtype = o->dtype; x->count = o->count; x->bytes = bytes;
        if (o->kind == NS_OP_SEND) { x->dir = NS_OUT; x->index = c->out_next[o->peer]++; x->src = (const unsigned char *)o->sbuf; }
        else { x->dir = NS_IN; x->index = c->in_next[o->peer]++; x->dst = (unsigned char *)o->rbuf; }
      }
    }
  {
    int i;
    for (i = 0; i < t->nx; i++) {
      ns_xfer *x = &t->x[i];
      x->nchunks = x->bytes ? (x->bytes + NS_CHUNK - 1) / NS_CHUNK : 1; /* an empty message is one chunk */
    }
  }
  comm_ref(c);
  t->comm = c;
  {
    char what[NS_TEXT]; /* the CUDA stand-in keeps 63 characters of it */
    snprintf(what, sizeof what, "NCCL group (%d send, %d recv, %d allgather) on comm %s", nsend, nrecv, ngather, c->name);
    memcpy(t->what, what, sizeof t->what - 1);
  }
  return t;
}

/* Checks one communicator's part of a group. */
static ncclResult_t check_group_comm(struct ncclComm *c, const ns_op *ops, int blocking) {
  const ns_op *o, *first = NULL;
  int self_send = 0, self_recv = 0;
  ncclResult_t e;
  if (!comm_live(c)) return fail(ncclInvalidUsage, "ncclGroupEnd: comm %p was destroyed or aborted inside the group", (void *)c);
  if ((e = check_comm("ncclGroupEnd", c, 1)) != ncclSuccess) return e;
  if (c->blocking != blocking)
    return fail(ncclInvalidUsage, "ncclGroupEnd: a group mixes blocking and non-blocking communicators");
  for (o = ops; o; o = o->next) {
    if (o->comm != c) continue;
    if (!first) first = o;
    else if (o->stream != first->stream)
      return fail(ncclInvalidUsage, "ncclGroupEnd: comm %s has operations on two streams (%p and %p) in one group",
                  c->name, (void *)first->stream, (void *)o->stream);
    if (o->kind == NS_OP_SEND && o->peer == c->rank) self_send++;
    if (o->kind == NS_OP_RECV && o->peer == c->rank) self_recv++;
  }
  if (self_send != self_recv)
    return fail(ncclInvalidUsage, "ncclGroupEnd: comm %s, rank %d: %d send(s) to itself but %d receive(s) from itself; a send "
                "to oneself needs its receive in the same group", c->name, c->rank, self_send, self_recv);
  return ncclSuccess;
}

/* The outermost ncclGroupEnd, or a call outside a group: queue the group. */
static ncclResult_t launch(void) {
  ns_op *ops = t_head, *o;
  ncclResult_t e = t_err, r = ncclSuccess;
  struct ncclComm **comms = NULL;
  int ncomms = 0, i, blocking;
  t_head = t_tail = NULL;
  t_err = ncclSuccess;
  lock();
  init_locked();
  if (e != ncclSuccess || !ops) { ops_free(ops); unlock(); return e; }
  g_calls[K_launch]++;
  if (inject(K_ncclGroupEnd)) { ops_free(ops); unlock(); return fail(ncclSystemError, "ncclGroupEnd: injected failure (the group's operations were discarded)"); }
  for (o = ops; o; o = o->next) ncomms++;
  comms = (struct ncclComm **)calloc((size_t)ncomms, sizeof *comms);
  if (!comms) { ops_free(ops); unlock(); return fail(ncclSystemError, "ncclGroupEnd: out of host memory"); }
  ncomms = 0;
  for (o = ops; o; o = o->next) {
    for (i = 0; i < ncomms; i++)
      if (comms[i] == o->comm) break;
    if (i == ncomms) comms[ncomms++] = o->comm;
  }
  blocking = comm_live(comms[0]) ? comms[0]->blocking : 1;
  for (i = 0; i < ncomms && e == ncclSuccess; i++) e = check_group_comm(comms[i], ops, blocking);
  if (e != ncclSuccess) { free(comms); ops_free(ops); unlock(); return e; }
  for (i = 0; i < ncomms; i++) {
    struct ncclComm *c = comms[i];
    ns_task *t = build_task(c, ops);
    if (!t) {
      r = fail(ncclSystemError, "ncclGroupEnd: out of host memory");
      comm_set_error(c, r, "ncclGroupEnd: out of host memory building the group of comm %s", c->name);
      continue;
    }
    for (o = ops; o; o = o->next)
      if (o->comm == c) { t->stream = o->stream; break; }
    if (blocking) {
      e = enqueue_task(t);
      if (e != ncclSuccess) r = e;
    } else {
      ns_task **pp = &c->deferred;
      while (*pp) pp = &(*pp)->next;
      *pp = t;
    }
  }
  free(comms);
  ops_free(ops);
  unlock();
  if (r == ncclSuccess && !blocking) r = ncclInProgress;
  return r;
}

ncclResult_t ncclGroupStart(void) {
  enter(K_ncclGroupStart);
  unlock();
  t_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  enter(K_ncclGroupEnd);
  unlock();
  if (t_depth <= 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_depth > 0) return ncclSuccess;
  return launch();
}

/* Buffer of `bytes` for an operation: device memory unless empty. */
static ncclResult_t check_buf(const char *fn, const char *which, const void *p, size_t bytes) {
  if (bytes == 0) return ncclSuccess;
  if (!p || !muon_standin_is_device(p, bytes))
    return fail(ncclInvalidArgument, "%s: %s %p (%zu bytes) is not inside one device allocation (a host pointer?)", fn, which, p, bytes);
  return ncclSuccess;
}

static ncclResult_t add_op(int id, int kind, const void *sbuf, void *rbuf, size_t count, ncclDataType_t dt, int peer,
                           ncclComm_t comm, cudaStream_t stream) {
  const char *fn = g_call_names[id];
  size_t es = dtype_size((int)dt);
  ncclResult_t e;
  ns_op *o;
  enter(id);
  if ((e = check_comm(fn, comm, 1)) != ncclSuccess) goto done;
  if (!es) { e = fail(ncclInvalidArgument, "%s: datatype %d is not an NCCL datatype", fn, (int)dt); goto done; }
  if (count > SIZE_MAX / es / (size_t)comm->nranks) { e = fail(ncclInvalidArgument, "%s: count %zu overflows", fn, count); goto done; }
  if (kind != NS_OP_ALLGATHER && (peer < 0 || peer >= comm->nranks)) {
    e = fail(ncclInvalidArgument, "%s: peer %d is not in [0, nranks %d) of comm %s", fn, peer, comm->nranks, comm->name);
    goto done;
  }
  if (kind == NS_OP_SEND) e = check_buf(fn, "sendbuff", sbuf, count * es);
  else if (kind == NS_OP_RECV) e = check_buf(fn, "recvbuff", rbuf, count * es);
  else {
    size_t bytes = count * es, total = bytes * (size_t)comm->nranks;
    uintptr_t s = (uintptr_t)sbuf, r = (uintptr_t)rbuf;
    if ((e = check_buf(fn, "sendbuff", sbuf, bytes)) != ncclSuccess) goto done;
    if ((e = check_buf(fn, "recvbuff", rbuf, total)) != ncclSuccess) goto done;
    if (bytes && s != r + (size_t)comm->rank * bytes && s < r + total && r < s + bytes)
      e = fail(ncclInvalidArgument, "%s: sendbuff overlaps recvbuff but is not recvbuff + rank * sendcount (in place)", fn);
  }
  if (e != ncclSuccess) goto done;
  o = (ns_op *)calloc(1, sizeof *o);
  if (!o) { e = fail(ncclSystemError, "%s: out of host memory", fn); goto done; }
  o->kind = kind; o->dtype = (int)dt; o->peer = peer; o->comm = comm; o->stream = stream;
  o->sbuf = sbuf; o->rbuf = rbuf; o->count = count;
  if (t_tail) t_tail->next = o; else t_head = o;
  t_tail = o;
done:
  unlock();
  if (e != ncclSuccess) {
    if (t_depth > 0 && t_err == ncclSuccess) t_err = e; /* the group fails as a whole */
    return e;
  }
  return t_depth > 0 ? ncclSuccess : launch();
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
  return add_op(K_ncclSend, NS_OP_SEND, sendbuff, NULL, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
  return add_op(K_ncclRecv, NS_OP_RECV, NULL, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
                           cudaStream_t stream) {
  return add_op(K_ncclAllGather, NS_OP_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, 0, comm, stream);
}

/* =============================================================================================
   Test hooks
   ============================================================================================= */
void muon_standin_nccl_fail(const char *call, int nth) {
  lock();
  init_locked();
  arm_failure(call, nth);
  unlock();
}

long long muon_standin_nccl_calls(const char *call) {
  long long n;
  int id;
  lock();
  init_locked();
  id = call_id(call);
  n = id >= 0 ? __atomic_load_n(&g_calls[id], __ATOMIC_RELAXED) : -1;
  unlock();
  return n;
}

const char *muon_standin_nccl_last_message(void) { return g_msg; }
