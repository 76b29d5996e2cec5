/* muon_gloo.h - a muon communicator over Gloo (CPU, TCP; many processes, many machines).

   USAGE
   -----
   C or C++ code that uses it:

       #include "muon.h"
       #include "muon_gloo.h"

       muon_gloo_desc gd = muon_gloo_default_desc();  // rank/size/store from the environment
       muon_comm world;
       if (muon_gloo_create(&world, &gd) != MUON_OK) { puts(muon_error(NULL)); ... }
       int dims[2] = {2, 2};                          // 4 ranks as a 2 x 2 row-major mesh
       muon_comm tp, dp;
       muon_gloo_mesh_subgroup(&tp, &world, dims, 2, 1);  // {0,1} {2,3}
       muon_gloo_mesh_subgroup(&dp, &world, dims, 2, 0);  // {0,2} {1,3}
       ... desc.comm = world; ...
       muon_comm_destroy(&tp); muon_comm_destroy(&dp); muon_comm_destroy(&world);

   The implementation is C++ (it talks to libgloo). In exactly ONE C++ file (g++ -std=c++17):

       #include "muon.h"
       #define MUON_GLOO_IMPLEMENTATION
       #include "muon_gloo.h"

   and link with -lgloo -pthread (and -lstdc++ when the final link is done by a C compiler),
   beside muon.h's implementation (MUON_IMPLEMENTATION in one file, as every muon program has),
   whose muon_error(NULL) carries the reason of a failed creation.
   Start the processes with tools/muonrun (`muonrun -n 4 ./prog args`), torchrun or mpirun.

   ENVIRONMENT (read only for the desc fields left at their defaults)
       MUON_RANK, MUON_WORLD_SIZE    rank and world size; else RANK / WORLD_SIZE (torchrun),
                                     else OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (mpirun)
       MUON_STORE                    FileStore rendezvous directory (must be fresh, see below)
       MUON_REDIS                    "host:port[/prefix]" RedisStore, when MUON_STORE is unset
       MUON_GLOO_HOST                address or host name to bind (default 127.0.0.1 with a
                                     FileStore, this machine's host name with Redis)
       MUON_GLOO_TIMEOUT             seconds for every blocking call (default 300)
       MUON_GLOO_CHECK_COUNTS=1      every alltoallv checks that the counts agree (debugging)
       MUON_GLOO_BLOCKING=1          a blocking alltoallv (muon_gloo_desc.blocking)

   RENDEZVOUS
       FileStore: a directory every rank can see (local disk for one machine, a shared file
       system across machines). Gloo's FileStore refuses a key that already exists, so the
       directory must be FRESH for every run (muonrun makes one per run and removes it). Keys of
       an earlier run give "store holds keys of an earlier run" at creation.
       RedisStore (this Debian build of Gloo has it: GLOO_USE_REDIS 1): keys are refused the same
       way (SETNX), so give every run its own prefix ("host:6379/job42") or flush the database.
       This Gloo has no TCPStore.

   SEMANTICS
       Every slot of the returned muon_comm is a collective: all ranks of the group call it, in
       the same order. alltoallv counts must agree pairwise (what r sends to p is what p expects
       from r). Each call uses its own Gloo slot, so a message can never be matched by a later
       call. Data to oneself is copied locally. A communicator is used by one thread at a time.
       The communicator is queued (muon.h's vtable): alltoallv posts the exchange's sends and
       receives and returns a ticket; join waits for it, within the timeout counted from the
       start; finish waits for every one in flight. Up to 64 are in flight at once, joined in
       any order, interleaved with the other slots; the caller leaves their buffers alone until
       join. With muon_dist_config.async several exchanges in flight hide each other's latency,
       which a thread running one collective at a time cannot (desc.blocking = 1 makes alltoallv
       wait for its exchange, and async then uses muon's communication thread). After a failure
       every started exchange is released with the connections closed: join returns the
       failure.
       The world and its subgroups share one TCP device (one Gloo event-loop thread); the tests
       use them from one thread, interleaved.

   GLOO TRAPS HANDLED HERE (measured on Debian's libgloo 0.0~git20220518)
       - send/recv to oneself crashes Gloo: the self part is always a local memmove, and a group
         of one rank never builds a Gloo context at all.
       - FileStore::get waits a fixed 30 s (Store::kDefaultTimeout) whatever the context timeout:
         every store access goes through a wrapper that first waits with the configured timeout.
       - FileStore refuses existing keys: the error says the directory is not fresh; subgroup keys
         get a unique prefix (parent prefix, per-comm counter, rank list).
       - A dead peer surfaces as an exception within milliseconds, a stalled one when the op
         timeout expires; after either the Gloo context is unusable. The comm is then marked
         broken: every later call returns the same status and message at once, and its
         connections are closed, so a late peer can never write into the caller's buffers.
       - No C++ exception crosses into C: gloo::IoException, gloo::EnforceNotMet, std::exception
         and anything else become MUON_ERR_TIMEOUT (a timeout in the text, or the deadline
         passed) or MUON_ERR_COMM, with a message naming the operation, this rank and the peer.
       - Gloo writes to sockets without MSG_NOSIGNAL, so a write to a dead peer raises SIGPIPE,
         which kills the survivor by default (seen with 8 ranks). muon_gloo_create sets SIGPIPE
         to SIG_IGN when its disposition is still the default (as Python, under which Gloo
         usually runs, does); a handler the program installed is left alone.
       - fork() after a Gloo device exists is unsafe (its event-loop thread does not survive the
         fork): fork before muon_gloo_create, as muonrun does.
       - A message longer than the receive posted for it makes Gloo throw EnforceNotMet on its
         own event-loop thread, which aborts the process (measured); a shorter one is silently
         accepted. muon.h's exchange plan guarantees the counts agree; set
         MUON_GLOO_CHECK_COUNTS=1 to have every alltoallv first agree on the counts (two extra
         small exchanges) and return MUON_ERR_MISMATCH on every rank instead.

   ERRORS
       muon_gloo_create, muon_gloo_subgroup and muon_gloo_mesh_subgroup return MUON_ERR_ARG for
       bad arguments (the message names the field), MUON_ERR_BACKEND when Gloo cannot be set up
       (device, store), MUON_ERR_COMM / MUON_ERR_TIMEOUT when the rendezvous fails,
       MUON_ERR_NOMEM. On failure *out is cleared and muon_error(NULL) says why on this thread
       ("MUON_ERR_ARG: muon_gloo_create: ...", Gloo's own text included), as for muon_create. A
       live comm's vt->error gives the text of its last failure. Nothing is printed.

   LICENSE: see the end of muon.h.
*/
#ifndef MUON_GLOO_H
#define MUON_GLOO_H

/* The communicator vtable and muon_status live in muon.h: include it here rather than fail,
   so this header also stands alone (the implementation, if wanted, is still one define away). */
#ifndef MUON_H
#include "muon.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct muon_gloo_desc {
  int rank, size;          /* -1: from the environment (see ENVIRONMENT)                         */
  const char *store_dir;   /* FileStore directory, fresh per run; NULL: env MUON_STORE           */
  const char *redis;       /* "host:port[/prefix]": RedisStore instead of a directory            */
  const char *hostname;    /* address to bind; NULL: env MUON_GLOO_HOST, else see ENVIRONMENT    */
  double timeout_s;        /* every blocking call; 0: env MUON_GLOO_TIMEOUT, else 300 s          */
  int blocking;            /* 1: alltoallv waits for its exchange, so muon_dist_config.async
                              runs the exchanges on muon's communication thread; 0: unless
                              env MUON_GLOO_BLOCKING=1 says so                                 */
} muon_gloo_desc;

/* rank = size = -1, everything else NULL / 0. */
MUON_API muon_gloo_desc muon_gloo_default_desc(void);

/* Creates the world communicator in *out. Collective over all `size` processes (they meet in
   the store). On failure *out is cleared and muon_error(NULL) gives the reason. */
MUON_API muon_status muon_gloo_create(muon_comm *out, const muon_gloo_desc *desc);

/* A new communicator in *out over the ranks ranks[0..n) OF THE PARENT (ascending or not; the new
   rank is the position in this list), which must contain this rank. Collective over those n
   ranks only; every member must make the same sequence of subgroup calls on the same parent (a
   per-parent counter and the rank list keep the store keys of different groups apart). n == 1
   needs no communication. `parent` must be a Gloo communicator; it may itself be a subgroup.
   On failure *out is cleared and muon_error(NULL) gives the reason. */
MUON_API muon_status muon_gloo_subgroup(muon_comm *out, muon_comm *parent, const int *ranks,
                                        int n);

/* For a row-major mesh of shape dims[0..ndims) over the parent's ranks (the product must equal
   the parent's size), the subgroup along mesh dimension `dim` that contains this rank: e.g.
   dims = {2, 2}: dim 1 = consecutive ranks {0,1} {2,3}, dim 0 = strided ranks {0,2} {1,3}.
   Collective over the whole parent (every rank gets its own group). Failures as for
   muon_gloo_subgroup. */
MUON_API muon_status muon_gloo_mesh_subgroup(muon_comm *out, muon_comm *parent, const int *dims,
                                             int ndims, int dim);

/* 1 if this build can use a RedisStore, else 0. */
MUON_API int muon_gloo_has_redis(void);

#ifdef __cplusplus
}
#endif

#endif /* MUON_GLOO_H */

/* =============================================================================================
   Implementation (C++17, libgloo) */
#if defined(MUON_GLOO_IMPLEMENTATION) && !defined(MUON_GLOO__IMPLEMENTED)
#define MUON_GLOO__IMPLEMENTED

#ifndef __cplusplus
#error "MUON_GLOO_IMPLEMENTATION must be compiled as C++ (g++ -std=c++17): it talks to libgloo"
#endif

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/config.h>
#include <gloo/context.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

/* RedisStore needs GLOO_USE_REDIS and hiredis' headers (Debian: libhiredis-dev). Define
   MUON_GLOO_NO_REDIS to leave it out. */
#if !defined(MUON_GLOO_NO_REDIS) && GLOO_USE_REDIS && defined(__has_include)
#if __has_include(<gloo/rendezvous/redis_store.h>) && __has_include(<hiredis/hiredis.h>)
#ifndef HIREDIS_NESTED_INCLUDE
#define HIREDIS_NESTED_INCLUDE
#endif
#include <gloo/rendezvous/redis_store.h>
#define MUON_GLOO__HAVE_REDIS 1
#endif
#endif
#ifndef MUON_GLOO__HAVE_REDIS
#define MUON_GLOO__HAVE_REDIS 0
#endif

typedef std::chrono::milliseconds muon_gloo__ms;
typedef std::chrono::steady_clock muon_gloo__clock;

#if MUON_GLOO__HAVE_REDIS
/* RedisStore with a read timeout: Gloo sets only a connect timeout, so a Redis that accepts and
   never answers (stopped, or another service on the port) would block every command forever. */
class muon_gloo__redis_store : public gloo::rendezvous::RedisStore {
 public:
  muon_gloo__redis_store(const std::string &host, int port, double timeout_s) : RedisStore(host, port) {
    struct timeval tv;
    tv.tv_sec = (long)timeout_s;
    tv.tv_usec = (long)((timeout_s - (double)tv.tv_sec) * 1e6);
    /* what hiredis' redisSetTimeout does, without linking hiredis ourselves */
    if (setsockopt(redis_->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        setsockopt(redis_->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
      throw gloo::IoException(std::string("setting the Redis socket timeout: ") + strerror(errno));
  }
};
#endif

/* FileStore with its (protected) non-blocking check made reachable. */
class muon_gloo__file_store : public gloo::rendezvous::FileStore {
 public:
  explicit muon_gloo__file_store(const std::string &path) : gloo::rendezvous::FileStore(path) {}
  bool ready(const std::vector<std::string> &keys) { return check(keys); }
};

/* Every store access waits with the configured timeout (FileStore::get alone would wait a fixed
   30 s) and carries the group's key prefix. */
class muon_gloo__store : public gloo::rendezvous::Store {
 public:
  muon_gloo__store(std::shared_ptr<gloo::rendezvous::Store> base, const std::string &prefix,
                   muon_gloo__ms timeout)
      : base_(base), prefix_(prefix), timeout_(timeout) {}
  void set(const std::string &key, const std::vector<char> &data) override {
    base_->set(prefix_ + key, data);
  }
  std::vector<char> get(const std::string &key) override {
    base_->wait({prefix_ + key}, timeout_);
    return base_->get(prefix_ + key);
  }
  void wait(const std::vector<std::string> &keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string> &keys, const muon_gloo__ms &) override {
    std::vector<std::string> full;
    for (const std::string &k : keys) full.push_back(prefix_ + k);
    /* FileStore and RedisStore count their timeout in whole seconds (1 s configured waits 2 s):
       poll their check() against our own deadline instead. */
    muon_gloo__file_store *fs = dynamic_cast<muon_gloo__file_store *>(base_.get());
#if MUON_GLOO__HAVE_REDIS
    gloo::rendezvous::RedisStore *rs = dynamic_cast<gloo::rendezvous::RedisStore *>(base_.get());
#endif
    /* the world's store is always one of the two (muon_gloo_create) */
    const muon_gloo__clock::time_point deadline = muon_gloo__clock::now() + timeout_;
    for (;;) {
#if MUON_GLOO__HAVE_REDIS
      if (fs ? fs->ready(full) : rs->check(full)) return;
#else
      if (fs->ready(full)) return;
#endif
      if (muon_gloo__clock::now() >= deadline)
        throw gloo::IoException("Wait timeout for key(s): " + gloo::MakeString(full) + " after " +
                                std::to_string(timeout_.count()) + " ms");
      std::this_thread::sleep_for(muon_gloo__ms(5));
    }
  }

 private:
  std::shared_ptr<gloo::rendezvous::Store> base_;
  std::string prefix_;
  muon_gloo__ms timeout_;
};

/* What the world and all its subgroups share. */
struct muon_gloo__shared {
  std::shared_ptr<gloo::rendezvous::Store> store;
  std::shared_ptr<gloo::transport::Device> device; /* NULL for a one-rank world */
  muon_gloo__ms timeout;
  std::string where; /* "FileStore /tmp/x" or "RedisStore host:port", for messages */
};

/* One exchange in flight: its buffers posted to Gloo, not yet waited for. */
struct muon_gloo__exchange {
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sb, rb;
  muon_gloo__clock::time_point start;
  const char *op = "";
  unsigned long long call = 0;
  bool live = false; /* started and not yet joined */
};

#define MUON_GLOO__TICKETS 64 /* exchanges started and not joined; muon.h keeps at most 16 */

struct muon_gloo__comm {
  std::shared_ptr<muon_gloo__shared> shared;
  std::shared_ptr<gloo::Context> context; /* NULL when size == 1 */
  std::unique_ptr<muon_gloo__store> store;
  int rank, size;
  std::string prefix;       /* store key prefix of this group, e.g. "muon/0[0,1]/" */
  unsigned long subgroups;  /* subgroup calls made on this comm */
  uint64_t seq;             /* collective calls made on this comm: the Gloo slot */
  muon_status broken;       /* MUON_OK while usable */
  bool check_counts;        /* MUON_GLOO_CHECK_COUNTS=1: agree on alltoallv counts first */
  bool blocking;            /* alltoallv waits for its exchange (muon_gloo_desc.blocking)   */
  std::string error;
  muon_gloo__exchange started[MUON_GLOO__TICKETS]; /* posted exchanges, by ticket */
};

static const uint64_t muon_gloo__slot_base = (uint64_t)0x4d << 56; /* 'M'; Gloo's own < 0x10 */

static std::string muon_gloo__fmt(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

/* The text of the exception being handled, for the catch-all. */
static std::string muon_gloo__what(std::exception_ptr ep) {
  try {
    if (ep) std::rethrow_exception(ep);
  } catch (const gloo::EnforceNotMet &e) {
    return std::string("gloo::EnforceNotMet: ") + e.what();
  } catch (const gloo::IoException &e) {
    return std::string("gloo::IoException: ") + e.what();
  } catch (const std::bad_alloc &) {
    return "out of memory (std::bad_alloc)";
  } catch (const std::exception &e) {
    return e.what();
  } catch (...) {
    return "unknown C++ exception";
  }
  return "no exception";
}

static bool muon_gloo__is_timeout(const std::string &text) {
  return text.find("imeout") != std::string::npos || text.find("imed out") != std::string::npos;
}

/* Marks c broken with this status and message; closes every connection so that no pending
   operation can complete later into the caller's memory. */
static muon_status muon_gloo__fail(muon_gloo__comm *c, muon_status st, const std::string &msg) {
  c->broken = st;
  c->error = msg;
  if (c->context) {
    try {
      c->context->closeConnections();
    } catch (...) {
    }
  }
  for (muon_gloo__exchange &x : c->started) {
    x.sb.clear();
    x.rb.clear();
    x.live = false;
  }
  return st;
}

/* The failure of exchange x while `doing` with `peer`, from inside its catch handler: the comm
   is broken with a message naming the operation, this rank and the peer. */
static muon_status muon_gloo__caught(muon_gloo__comm *c, const muon_gloo__exchange &x,
                                     const char *doing, int peer) {
  const std::string what = muon_gloo__what(std::current_exception());
  const double waited = std::chrono::duration<double>(muon_gloo__clock::now() - x.start).count();
  const double limit = std::chrono::duration<double>(c->shared->timeout).count();
  const bool timed_out = muon_gloo__is_timeout(what) || waited >= limit * 0.999;
  const muon_status st = timed_out ? MUON_ERR_TIMEOUT : MUON_ERR_COMM;
  const std::string msg = muon_gloo__fmt(
      "muon_gloo %s (rank %d of %d, call %llu) %s %s peer rank %d after %.3f s (timeout %.1f s): "
      "%s",
      x.op, c->rank, c->size, x.call, timed_out ? "timed out" : "failed", doing, peer, waited,
      limit, what.c_str());
  return muon_gloo__fail(c, st, msg);
}

/* The one exchange every slot is made of, posted: to each peer p != rank, send slen[p] bytes at
   send + soff[p] and receive rlen[p] bytes at recv + roff[p]; the self part is a memmove now.
   Zero lengths post nothing. Every send and receive is in flight at once, on a Gloo slot of its
   own, so exchanges posted one after another may be in flight together. */
static muon_status muon_gloo__post(muon_gloo__comm *c, muon_gloo__exchange &x, const char *op,
                                   const char *send, const size_t *soff, const size_t *slen,
                                   char *recv, const size_t *roff, const size_t *rlen) {
  const int me = c->rank, n = c->size;
  x.op = op;
  x.call = (unsigned long long)c->seq;
  x.start = muon_gloo__clock::now();
  x.sb.clear();
  x.rb.clear();
  if (c->broken) return c->broken;
  if (slen[me] != rlen[me]) {
    c->error = muon_gloo__fmt("muon_gloo %s (rank %d of %d): sends %zu bytes to itself but "
                              "expects %zu", op, me, n, slen[me], rlen[me]);
    return MUON_ERR_ARG;
  }
  if (slen[me]) memmove(recv + roff[me], send + soff[me], slen[me]);
  if (n == 1) return MUON_OK;

  const uint64_t slot = muon_gloo__slot_base | (c->seq++ & (((uint64_t)1 << 48) - 1));
  int peer = -1;
  const char *doing = "setting up";
  try {
    x.sb.resize((size_t)n);
    x.rb.resize((size_t)n);
    for (int i = 1; i < n; i++) {
      const int to = (me + i) % n, from = (me + n - i) % n;
      if (rlen[from]) {
        peer = from;
        doing = "posting the receive from";
        x.rb[(size_t)from] = c->context->createUnboundBuffer(recv + roff[from], rlen[from]);
        x.rb[(size_t)from]->recv(from, slot);
      }
      if (slen[to]) {
        peer = to;
        doing = "posting the send to";
        /* Gloo only reads a send buffer; the cast is the API's, not a write. */
        x.sb[(size_t)to] = c->context->createUnboundBuffer(const_cast<char *>(send) + soff[to],
                                                           slen[to]);
        x.sb[(size_t)to]->send(to, slot);
      }
    }
    return MUON_OK;
  } catch (...) {
    return muon_gloo__caught(c, x, doing, peer);
  }
}

/* Waits for posted exchange x to complete: peer by peer (nearest first) against one deadline
   from its posting, so a failure names its peer. Its buffers are released either way. */
static muon_status muon_gloo__wait(muon_gloo__comm *c, muon_gloo__exchange &x) {
  const int me = c->rank, n = c->size;
  const muon_gloo__clock::time_point deadline = x.start + c->shared->timeout;
  int peer = -1;
  const char *doing = "setting up";
  if (c->broken) return c->broken; /* muon_gloo__fail released x's buffers */
  try {
    for (int pass = 0; pass < 2 && !x.rb.empty(); pass++) {
      for (int i = 1; i < n; i++) {
        const int p = pass == 0 ? (me + n - i) % n : (me + i) % n;
        gloo::transport::UnboundBuffer *b = (pass == 0 ? x.rb : x.sb)[(size_t)p].get();
        if (!b) continue;
        peer = p;
        doing = pass == 0 ? "receiving from" : "sending to";
        muon_gloo__ms left = std::chrono::duration_cast<muon_gloo__ms>(
            deadline - muon_gloo__clock::now());
        if (left.count() < 1) left = muon_gloo__ms(1); /* 0 would mean "no timeout" */
        bool ok = pass == 0 ? b->waitRecv(nullptr, left) : b->waitSend(nullptr, left);
        if (!ok) throw std::runtime_error("the operation was aborted");
      }
    }
    x.sb.clear();
    x.rb.clear();
    return MUON_OK;
  } catch (...) {
    return muon_gloo__caught(c, x, doing, peer);
  }
}

/* Posted, then waited for: what every blocking slot does. */
static muon_status muon_gloo__exchange_now(muon_gloo__comm *c, const char *op, const char *send,
                                           const size_t *soff, const size_t *slen, char *recv,
                                           const size_t *roff, const size_t *rlen) {
  muon_gloo__exchange x;
  muon_status st = muon_gloo__post(c, x, op, send, soff, slen, recv, roff, rlen);
  return st != MUON_OK ? st : muon_gloo__wait(c, x);
}

/* ---- the vtable --------------------------------------------------------------------------- */

/* alltoallv's exchange, checked (and with MUON_GLOO_CHECK_COUNTS its counts agreed), posted
   into x. */
static muon_status muon_gloo__alltoallv_post(muon_gloo__comm *c, muon_gloo__exchange &x,
                                             const float *send, const size_t *send_counts,
                                             const size_t *send_displs, float *recv,
                                             const size_t *recv_counts, const size_t *recv_displs) {
  if (c->broken) return c->broken;
  if (!send_counts || !send_displs || !recv_counts || !recv_displs) {
    c->error = muon_gloo__fmt("muon_gloo alltoallv (rank %d): a count or displacement array is "
                              "NULL", c->rank);
    return MUON_ERR_ARG;
  }
  try {
    const size_t n = (size_t)c->size, f = sizeof(float);
    std::vector<size_t> so(n), sl(n), ro(n), rl(n);
    for (size_t p = 0; p < n; p++) {
      if (send_counts[p] > SIZE_MAX / f / 2 || recv_counts[p] > SIZE_MAX / f / 2 ||
          send_displs[p] > SIZE_MAX / f / 2 || recv_displs[p] > SIZE_MAX / f / 2) {
        c->error = muon_gloo__fmt("muon_gloo alltoallv (rank %d): count or displacement for "
                                  "peer %zu is too large", c->rank, p);
        return MUON_ERR_ARG;
      }
      if ((send_counts[p] && !send) || (recv_counts[p] && !recv)) {
        c->error = muon_gloo__fmt("muon_gloo alltoallv (rank %d): %s is NULL but its count for "
                                  "peer %zu is not zero", c->rank, send_counts[p] ? "send" : "recv",
                                  p);
        return MUON_ERR_ARG;
      }
      so[p] = send_displs[p] * f;
      sl[p] = send_counts[p] * f;
      ro[p] = recv_displs[p] * f;
      rl[p] = recv_counts[p] * f;
    }
    if (c->check_counts && n > 1) {
      /* Gloo aborts the process (EnforceNotMet on its loop thread) when a message is longer
         than the receive posted for it: agree on the counts first, then on the verdict. */
      std::vector<uint64_t> mine(n), theirs(n);
      std::vector<size_t> off(n), len(n, sizeof(uint64_t));
      for (size_t p = 0; p < n; p++) {
        mine[p] = send_counts[p];
        off[p] = p * sizeof(uint64_t);
      }
      muon_status st = muon_gloo__exchange_now(c, "alltoallv count check",
                                               (const char *)mine.data(), off.data(), len.data(),
                                               (char *)theirs.data(), off.data(), len.data());
      if (st != MUON_OK) return st;
      int bad = -1;
      for (size_t p = 0; p < n && bad < 0; p++)
        if (theirs[p] != recv_counts[p]) bad = (int)p;
      std::vector<char> ok(n, bad < 0 ? 1 : 0), oks(n, 0);
      std::vector<size_t> boff(n), blen(n, 1);
      for (size_t p = 0; p < n; p++) boff[p] = p;
      st = muon_gloo__exchange_now(c, "alltoallv count check", ok.data(), boff.data(),
                                   blen.data(), oks.data(), boff.data(), blen.data());
      if (st != MUON_OK) return st;
      int who = -1;
      for (size_t p = 0; p < n && who < 0; p++)
        if (!oks[p]) who = (int)p;
      if (bad >= 0) {
        c->error = muon_gloo__fmt("muon_gloo alltoallv (rank %d of %d): peer rank %d sends %llu "
                                  "floats but recv_counts[%d] = %zu", c->rank, c->size, bad,
                                  (unsigned long long)theirs[(size_t)bad], bad,
                                  recv_counts[bad]);
        return MUON_ERR_MISMATCH;
      }
      if (who >= 0) {
        c->error = muon_gloo__fmt("muon_gloo alltoallv (rank %d of %d): rank %d found counts "
                                  "that disagree (see its error)", c->rank, c->size, who);
        return MUON_ERR_MISMATCH;
      }
    }
    return muon_gloo__post(c, x, "alltoallv", (const char *)send, so.data(), sl.data(),
                           (char *)recv, ro.data(), rl.data());
  } catch (...) {
    return muon_gloo__fail(c, MUON_ERR_NOMEM, "muon_gloo alltoallv: " +
                                                  muon_gloo__what(std::current_exception()));
  }
}

/* muon_gloo_desc.blocking: the exchange done before returning; nothing to join or finish. */
static muon_status muon_gloo__alltoallv(void *ctx, const float *send, const size_t *send_counts,
                                        const size_t *send_displs, float *recv,
                                        const size_t *recv_counts, const size_t *recv_displs,
                                        int *ticket) {
  muon_gloo__comm *c = (muon_gloo__comm *)ctx;
  if (!c || !ticket) return MUON_ERR_ARG;
  *ticket = -1;
  muon_gloo__exchange x;
  muon_status st = muon_gloo__alltoallv_post(c, x, send, send_counts, send_displs, recv,
                                             recv_counts, recv_displs);
  return st != MUON_OK ? st : muon_gloo__wait(c, x);
}

/* Queued (the default): the exchange is posted and left in flight under a ticket; join waits
   for it. Host memory: the caller leaves both buffers alone until join. */
static muon_status muon_gloo__alltoallv_posted(void *ctx, const float *send,
                                               const size_t *send_counts,
                                               const size_t *send_displs, float *recv,
                                               const size_t *recv_counts,
                                               const size_t *recv_displs, int *ticket) {
  muon_gloo__comm *c = (muon_gloo__comm *)ctx;
  int t = 0;
  if (!c || !ticket) return MUON_ERR_ARG;
  *ticket = -1;
  if (c->broken) return c->broken;
  while (t < MUON_GLOO__TICKETS && c->started[t].live) t++;
  if (t == MUON_GLOO__TICKETS) {
    c->error = muon_gloo__fmt("muon_gloo alltoallv (rank %d): %d exchanges started and "
                              "not joined", c->rank, MUON_GLOO__TICKETS);
    return MUON_ERR_ARG;
  }
  muon_status st = muon_gloo__alltoallv_post(c, c->started[t], send, send_counts, send_displs,
                                             recv, recv_counts, recv_displs);
  if (st == MUON_OK) {
    c->started[t].live = true;
    *ticket = t;
  }
  return st;
}

static muon_status muon_gloo__join(void *ctx, int ticket) {
  muon_gloo__comm *c = (muon_gloo__comm *)ctx;
  if (!c) return MUON_ERR_ARG;
  if (ticket < 0 || ticket >= MUON_GLOO__TICKETS || !c->started[ticket].live) {
    if (c->broken) return c->broken; /* the failure released every started exchange */
    c->error = muon_gloo__fmt("muon_gloo join (rank %d): ticket %d is not a started exchange",
                              c->rank, ticket);
    return MUON_ERR_ARG;
  }
  c->started[ticket].live = false;
  return muon_gloo__wait(c, c->started[ticket]);
}

/* Every exchange in flight, waited for; each stays to be joined (waiting again is free). The
   first failure broke the communicator, which released the rest. */
static muon_status muon_gloo__finish(void *ctx) {
  muon_gloo__comm *c = (muon_gloo__comm *)ctx;
  if (!c) return MUON_ERR_ARG;
  for (int t = 0; t < MUON_GLOO__TICKETS; t++)
    if (c->started[t].live) {
      muon_status st = muon_gloo__wait(c, c->started[t]);
      if (st != MUON_OK) return st;
    }
  return c->broken;
}

static muon_status muon_gloo__allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  muon_gloo__comm *c = (muon_gloo__comm *)ctx;
  if (!c) return MUON_ERR_ARG;
  if (c->broken) return c->broken;
  if (bytes && (!send || !recv)) {
    c->error = muon_gloo__fmt("muon_gloo allgather (rank %d): %s is NULL", c->rank,
                              send ? "recv" : "send");
    return MUON_ERR_ARG;
  }
  if (bytes > SIZE_MAX / (size_t)c->size) {
    c->error = muon_gloo__fmt("muon_gloo allgather (rank %d): %zu bytes times %d ranks "
                              "overflows", c->rank, bytes, c->size);
    return MUON_ERR_ARG;
  }
  try {
    const size_t n = (size_t)c->size;
    std::vector<size_t> so(n, 0), sl(n, bytes), ro(n), rl(n, bytes);
    for (size_t p = 0; p < n; p++) ro[p] = p * bytes;
    /* The self part goes from send to recv + rank*bytes via so[rank] = 0. */
    return muon_gloo__exchange_now(c, "allgather", (const char *)send, so.data(), sl.data(),
                                   (char *)recv, ro.data(), rl.data());
  } catch (...) {
    return muon_gloo__fail(c, MUON_ERR_NOMEM, "muon_gloo allgather: " +
                                                  muon_gloo__what(std::current_exception()));
  }
}

static const char *muon_gloo__error(void *ctx) {
  muon_gloo__comm *c = (muon_gloo__comm *)ctx;
  return c ? c->error.c_str() : "";
}

static void muon_gloo__destroy(void *ctx) {
  muon_gloo__comm *c = (muon_gloo__comm *)ctx;
  try {
    delete c; /* the context closes its pairs; the shared device and store go with the last comm */
  } catch (...) {
  }
}

static const muon_comm_vtable muon_gloo__vtable = {
    MUON_COMM_VTABLE_VERSION,
    /* .alltoallv = */ muon_gloo__alltoallv_posted,
    /* .join      = */ muon_gloo__join,
    /* .finish    = */ muon_gloo__finish,
    /* .allgather = */ muon_gloo__allgather,
    /* .error     = */ muon_gloo__error,
    /* .destroy   = */ muon_gloo__destroy,
    /* .memory    = */ MUON_MEMORY_HOST,
    /* .queued    = */ 1};

/* muon_gloo_desc.blocking: each exchange done before alltoallv returns. */
static const muon_comm_vtable muon_gloo__vtable_blocking = {
    MUON_COMM_VTABLE_VERSION,
    /* .alltoallv = */ muon_gloo__alltoallv,
    /* .join      = */ NULL,
    /* .finish    = */ NULL,
    /* .allgather = */ muon_gloo__allgather,
    /* .error     = */ muon_gloo__error,
    /* .destroy   = */ muon_gloo__destroy,
    /* .memory    = */ MUON_MEMORY_HOST,
    /* .queued    = */ 0};

/* ---- creation ------------------------------------------------------------------------------
   muon_gloo_create: the desc and the environment are resolved (rank and size, timeout, which
   store), then the store, the SIGPIPE disposition and the TCP device are set up, and the world's
   comm is started like every subgroup's (muon_gloo__start). Each step that fails says why through
   muon_create_failed (muon.h), which is what muon_error(NULL) returns. */

/* The start of every creation: *out cleared, no reason left from an earlier failure. */
static void muon_gloo__begin(muon_comm *out) {
  if (out) {
    out->vt = NULL;
    out->ctx = NULL;
    out->rank = 0;
    out->size = 0;
  }
  muon_set_create_error("%s", "");
}

static int muon_gloo__env_int(const char *name, int *out) {
  const char *s = getenv(name);
  char *end;
  long v;
  if (!s || !*s) return 0;
  errno = 0;
  v = strtol(s, &end, 10);
  if (errno || *end || v < 0 || v > 1 << 30) return -1;
  *out = (int)v;
  return 1;
}

/* An environment switch such as MUON_GLOO_CHECK_COUNTS=1. */
static bool muon_gloo__env_flag(const char *name) {
  const char *s = getenv(name);
  return s && atoi(s) != 0;
}

/* What muon_gloo_create takes from the desc and the environment before it touches Gloo. */
struct muon_gloo__settings {
  int rank, size;
  double timeout_s;
  const char *store_dir, *redis; /* at most one; neither for a world of one rank */
  std::string host;              /* desc.hostname or MUON_GLOO_HOST; "": the store's default */
};

/* Rank and size: the desc's, else the first launcher convention present in the environment. */
static muon_status muon_gloo__rank_size(const muon_gloo_desc *desc, muon_gloo__settings &s) {
  static const char *const env_names[3][2] = {{"MUON_RANK", "MUON_WORLD_SIZE"},
                                              {"RANK", "WORLD_SIZE"},
                                              {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}};
  s.rank = desc->rank;
  s.size = desc->size;
  for (int k = 0; k < 3 && (s.rank < 0 || s.size < 0); k++) {
    int r = -1, n = -1;
    int hr = muon_gloo__env_int(env_names[k][0], &r), hn = muon_gloo__env_int(env_names[k][1], &n);
    if (hr < 0 || hn < 0)
      return muon_create_failed(MUON_ERR_ARG, "muon_gloo_create", "environment %s='%s' / %s='%s' is "
                               "not a valid rank / size", env_names[k][0], getenv(env_names[k][0]) ?
                               getenv(env_names[k][0]) : "", env_names[k][1],
                               getenv(env_names[k][1]) ? getenv(env_names[k][1]) : "");
    if (hr && hn) {
      if (s.rank < 0) s.rank = r;
      if (s.size < 0) s.size = n;
    }
  }
  if (s.rank < 0 || s.size < 0)
    return muon_create_failed(MUON_ERR_ARG, "muon_gloo_create", "muon_gloo_desc.%s is -1 and none "
                             "of MUON_RANK/MUON_WORLD_SIZE, RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK/"
                             "OMPI_COMM_WORLD_SIZE is set (start the program with muonrun, torchrun "
                             "or mpirun)", s.rank < 0 ? "rank" : "size");
  if (s.size < 1 || s.rank >= s.size)
    return muon_create_failed(MUON_ERR_ARG, "muon_gloo_create", "muon_gloo_desc: rank %d is not in "
                             "[0, size %d)", s.rank, s.size);
  return MUON_OK;
}

/* The timeout: the desc's, else MUON_GLOO_TIMEOUT, else 300 s. */
static muon_status muon_gloo__timeout(const muon_gloo_desc *desc, muon_gloo__settings &s) {
  s.timeout_s = desc->timeout_s;
  if (s.timeout_s == 0) {
    const char *t = getenv("MUON_GLOO_TIMEOUT");
    s.timeout_s = 300;
    if (t && *t) {
      char *end;
      s.timeout_s = strtod(t, &end);
      if (*end || !(s.timeout_s > 0))
        return muon_create_failed(MUON_ERR_ARG, "muon_gloo_create", "MUON_GLOO_TIMEOUT='%s' is not "
                                 "a positive number of seconds", t);
    }
  }
  if (!(s.timeout_s > 0) || s.timeout_s > 1e7)
    return muon_create_failed(MUON_ERR_ARG, "muon_gloo_create", "muon_gloo_desc.timeout_s must be > "
                             "0 and <= 1e7 (got %g)", s.timeout_s);
  return MUON_OK;
}

/* Where the ranks meet: the desc's FileStore or Redis, else MUON_STORE, else MUON_REDIS; and the
   address to bind, if the desc or MUON_GLOO_HOST names one. */
static muon_status muon_gloo__where(const muon_gloo_desc *desc, muon_gloo__settings &s) {
  s.store_dir = desc->store_dir;
  s.redis = desc->redis;
  if (s.store_dir && s.redis)
    return muon_create_failed(MUON_ERR_ARG, "muon_gloo_create", "muon_gloo_desc: set store_dir or "
                             "redis, not both");
  if (!s.store_dir && !s.redis) {
    s.store_dir = getenv("MUON_STORE");
    if (s.store_dir && !*s.store_dir) s.store_dir = NULL;
    if (!s.store_dir) {
      s.redis = getenv("MUON_REDIS");
      if (s.redis && !*s.redis) s.redis = NULL;
    }
  }
  if (s.size > 1 && !s.store_dir && !s.redis)
    return muon_create_failed(MUON_ERR_ARG, "muon_gloo_create", "muon_gloo_desc.store_dir and .redis "
                             "are NULL and neither MUON_STORE nor MUON_REDIS is set: %d ranks need a "
                             "rendezvous", s.size);
  if (desc->hostname && *desc->hostname) s.host = desc->hostname;
  else if (getenv("MUON_GLOO_HOST") && *getenv("MUON_GLOO_HOST")) s.host = getenv("MUON_GLOO_HOST");
  return MUON_OK;
}

/* The FileStore in directory `dir`; the TCP device binds to 127.0.0.1 unless told otherwise. */
static muon_status muon_gloo__open_file_store(const char *dir, muon_gloo__shared &sh,
                                              std::string &host) {
  sh.where = std::string("FileStore ") + dir;
  try {
    sh.store = std::make_shared<muon_gloo__file_store>(dir);
  } catch (...) {
    return muon_create_failed(MUON_ERR_BACKEND, "muon_gloo_create", "FileStore directory '%s' cannot "
                             "be used (it must exist and be fresh for this run): %s", dir,
                             muon_gloo__what(std::current_exception()).c_str());
  }
  if (host.empty()) host = "127.0.0.1";
  return MUON_OK;
}

/* The RedisStore of spec "host:port[/prefix]" (the prefix goes before every key); the TCP device
   binds to this machine's host name unless told otherwise. */
static muon_status muon_gloo__open_redis(const char *spec, double timeout_s, muon_gloo__shared &sh,
                                         std::string &prefix, std::string &host) {
#if MUON_GLOO__HAVE_REDIS
  std::string hostport = spec;
  size_t slash = hostport.find('/');
  if (slash != std::string::npos) {
    prefix = hostport.substr(slash + 1) + "/" + prefix;
    hostport.resize(slash);
  }
  size_t colon = hostport.rfind(':');
  std::string rhost = hostport.substr(0, colon);
  int port = 6379;
  if (colon != std::string::npos) {
    char *end;
    long p = strtol(hostport.c_str() + colon + 1, &end, 10);
    if (*end || p <= 0 || p > 65535)
      return muon_create_failed(MUON_ERR_ARG, "muon_gloo_create", "muon_gloo_desc.redis '%s': bad "
                               "port (want host:port[/prefix])", spec);
    port = (int)p;
  }
  if (rhost.empty())
    return muon_create_failed(MUON_ERR_ARG, "muon_gloo_create", "muon_gloo_desc.redis '%s': no host "
                             "(want host:port[/prefix])", spec);
  sh.where = "RedisStore " + hostport;
  try {
    sh.store = std::make_shared<muon_gloo__redis_store>(rhost, port, timeout_s);
  } catch (...) {
    return muon_create_failed(MUON_ERR_BACKEND, "muon_gloo_create", "cannot connect to Redis at %s: "
                             "%s", hostport.c_str(), muon_gloo__what(std::current_exception()).c_str());
  }
  if (host.empty()) {
    char name[256];
    if (gethostname(name, sizeof name) == 0) {
      name[sizeof name - 1] = 0;
      host = name;
    } else {
      host = "127.0.0.1";
    }
  }
  return MUON_OK;
#else
  (void)timeout_s;
  (void)sh;
  (void)prefix;
  (void)host;
  return muon_create_failed(MUON_ERR_BACKEND, "muon_gloo_create", "muon_gloo_desc.redis '%s': this "
                           "build has no RedisStore (Gloo without GLOO_USE_REDIS, hiredis headers "
                           "missing, or MUON_GLOO_NO_REDIS); use a FileStore directory", spec);
#endif
}

/* Gloo writes to its sockets without MSG_NOSIGNAL: a write to a dead peer raises SIGPIPE, whose
   default action kills the survivor (measured, 8 ranks, --die). Python ignores SIGPIPE, C does
   not: ignore it unless the program chose a disposition itself. */
static void muon_gloo__ignore_sigpipe(void) {
  struct sigaction old;
  if (sigaction(SIGPIPE, NULL, &old) == 0 && !(old.sa_flags & SA_SIGINFO) &&
      old.sa_handler == SIG_DFL) {
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, NULL);
  }
}

/* The one TCP device the world and its subgroups share, bound to `host`. */
static muon_status muon_gloo__open_device(muon_gloo__shared &sh, const std::string &host) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    sh.device = gloo::transport::tcp::CreateDevice(attr);
  } catch (...) {
    return muon_create_failed(MUON_ERR_BACKEND, "muon_gloo_create", "cannot create a TCP device on "
                             "'%s' (set muon_gloo_desc.hostname or MUON_GLOO_HOST to this machine's "
                             "address): %s", host.c_str(),
                             muon_gloo__what(std::current_exception()).c_str());
  }
  return MUON_OK;
}

/* Builds the group's Gloo context through the store: the keys are prefix + group rank. */
static muon_status muon_gloo__connect(muon_gloo__comm *c, const char *fn) {
  if (c->size == 1) return MUON_OK; /* nothing to talk to; Gloo would only talk to itself */
  const muon_gloo__clock::time_point start = muon_gloo__clock::now();
  try {
    c->store.reset(new muon_gloo__store(c->shared->store, c->prefix, c->shared->timeout));
    std::shared_ptr<gloo::rendezvous::Context> ctx =
        std::make_shared<gloo::rendezvous::Context>(c->rank, c->size);
    ctx->setTimeout(c->shared->timeout);
    ctx->connectFullMesh(*c->store, c->shared->device);
    c->context = ctx;
    return MUON_OK;
  } catch (...) {
    const std::string text = muon_gloo__what(std::current_exception());
    const double waited = std::chrono::duration<double>(muon_gloo__clock::now() - start).count();
    const double limit = std::chrono::duration<double>(c->shared->timeout).count();
    std::string hint;
    if (text.find("already exists") != std::string::npos ||
        text.find("already set") != std::string::npos)
      hint = " (the store holds keys of an earlier run: use a fresh directory or Redis prefix "
             "per run)";
    const bool timed_out = muon_gloo__is_timeout(text) || waited >= limit * 0.999;
    return muon_create_failed(timed_out ? MUON_ERR_TIMEOUT : MUON_ERR_COMM, fn,
                             "rendezvous of rank %d of %d (keys '%s*' in %s) %s after %.3f s "
                             "(timeout %.1f s): %s%s", c->rank, c->size, c->prefix.c_str(),
                             c->shared->where.c_str(), timed_out ? "timed out" : "failed", waited,
                             limit, text.c_str(), hint.c_str());
  }
}

/* The tail of every creation, the world's and each subgroup's: a comm that is rank `rank` of
   the `size` ranks whose store keys start with `prefix`, connected through the store (a
   collective over those ranks), published in *out. */
static muon_status muon_gloo__start(const char *fn, const std::shared_ptr<muon_gloo__shared> &sh,
                                    int rank, int size, const std::string &prefix,
                                    bool check_counts, bool blocking, muon_comm *out) {
  std::unique_ptr<muon_gloo__comm> c(new muon_gloo__comm());
  c->shared = sh;
  c->rank = rank;
  c->size = size;
  c->prefix = prefix;
  c->subgroups = 0;
  c->seq = 0;
  c->broken = MUON_OK;
  c->check_counts = check_counts;
  c->blocking = blocking;
  muon_status st = muon_gloo__connect(c.get(), fn);
  if (st != MUON_OK) return st;
  out->vt = blocking ? &muon_gloo__vtable_blocking : &muon_gloo__vtable;
  out->ctx = c.release();
  out->rank = rank;
  out->size = size;
  return MUON_OK;
}

/* muon_gloo_subgroup's work, for it and muon_gloo_mesh_subgroup (fn: the one called). */
static muon_status muon_gloo__subgroup(const char *fn, muon_comm *out, muon_comm *parent,
                                       const int *ranks, int n) {
  if ((parent->vt != &muon_gloo__vtable && parent->vt != &muon_gloo__vtable_blocking) ||
      !parent->ctx)
    return muon_create_failed(MUON_ERR_ARG, fn, "parent is not a Gloo communicator");
  muon_gloo__comm *pc = (muon_gloo__comm *)parent->ctx;
  if (n < 1 || n > pc->size)
    return muon_create_failed(MUON_ERR_ARG, fn, "n = %d must be in [1, parent size %d]", n, pc->size);
  int me = -1;
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= pc->size)
      return muon_create_failed(MUON_ERR_ARG, fn, "ranks[%d] = %d is not a rank of the parent "
                               "(size %d)", i, ranks[i], pc->size);
    for (int j = 0; j < i; j++)
      if (ranks[j] == ranks[i])
        return muon_create_failed(MUON_ERR_ARG, fn, "rank %d appears twice (ranks[%d] and "
                                 "ranks[%d])", ranks[i], j, i);
    if (ranks[i] == pc->rank) me = i;
  }
  if (me < 0)
    return muon_create_failed(MUON_ERR_ARG, fn, "this rank (%d of the parent) is not in "
                             "ranks[0..%d)", pc->rank, n);
  try {
    /* parent prefix + this call's number + the rank list (hashed when long) */
    std::string list;
    for (int i = 0; i < n; i++) list += (i ? "," : "") + std::to_string(ranks[i]);
    if (list.size() > 120) {
      unsigned long long h = 1469598103934665603ULL; /* FNV-1a */
      for (char ch : list) h = (h ^ (unsigned char)ch) * 1099511628211ULL;
      list = std::to_string(n) + ":" + std::to_string(ranks[0]) + ".." +
             std::to_string(ranks[n - 1]) + "#" + std::to_string(h);
    }
    const std::string prefix = pc->prefix + std::to_string(pc->subgroups++) + "[" + list + "]/";
    return muon_gloo__start(fn, pc->shared, me, n, prefix,
                            pc->check_counts || muon_gloo__env_flag("MUON_GLOO_CHECK_COUNTS"),
                            pc->blocking, out);
  } catch (...) {
    return muon_create_failed(MUON_ERR_NOMEM, fn, "%s",
                             muon_gloo__what(std::current_exception()).c_str());
  }
}

extern "C" {

MUON_API muon_gloo_desc muon_gloo_default_desc(void) {
  muon_gloo_desc d;
  d.rank = -1;
  d.size = -1;
  d.store_dir = NULL;
  d.redis = NULL;
  d.hostname = NULL;
  d.timeout_s = 0;
  d.blocking = 0;
  return d;
}

MUON_API int muon_gloo_has_redis(void) { return MUON_GLOO__HAVE_REDIS; }

MUON_API muon_status muon_gloo_create(muon_comm *out, const muon_gloo_desc *desc) {
  muon_gloo__begin(out);
  if (!out || !desc)
    return muon_create_failed(MUON_ERR_ARG, "muon_gloo_create", "%s is NULL", !out ? "out" : "desc");
  try {
    muon_gloo__settings s;
    muon_status st;
    if ((st = muon_gloo__rank_size(desc, s)) != MUON_OK || (st = muon_gloo__timeout(desc, s)) != MUON_OK ||
        (st = muon_gloo__where(desc, s)) != MUON_OK)
      return st;
    std::shared_ptr<muon_gloo__shared> sh = std::make_shared<muon_gloo__shared>();
    sh->timeout = muon_gloo__ms((long long)(s.timeout_s * 1000 + 0.5));
    if (sh->timeout.count() < 1) sh->timeout = muon_gloo__ms(1);
    sh->where = "none (one rank)";
    std::string prefix = "muon/";
    if (s.size > 1) {
      st = s.store_dir ? muon_gloo__open_file_store(s.store_dir, *sh, s.host)
                       : muon_gloo__open_redis(s.redis, s.timeout_s, *sh, prefix, s.host);
      if (st != MUON_OK) return st;
      muon_gloo__ignore_sigpipe();
      if ((st = muon_gloo__open_device(*sh, s.host)) != MUON_OK) return st;
    }
    return muon_gloo__start("muon_gloo_create", sh, s.rank, s.size, prefix,
                            muon_gloo__env_flag("MUON_GLOO_CHECK_COUNTS"),
                            desc->blocking || muon_gloo__env_flag("MUON_GLOO_BLOCKING"), out);
  } catch (...) {
    return muon_create_failed(MUON_ERR_NOMEM, "muon_gloo_create", "%s",
                             muon_gloo__what(std::current_exception()).c_str());
  }
}

MUON_API muon_status muon_gloo_subgroup(muon_comm *out, muon_comm *parent, const int *ranks,
                                        int n) {
  muon_gloo__begin(out);
  if (!out || !parent || !ranks)
    return muon_create_failed(MUON_ERR_ARG, "muon_gloo_subgroup", "%s is NULL",
                             !out ? "out" : !parent ? "parent" : "ranks");
  return muon_gloo__subgroup("muon_gloo_subgroup", out, parent, ranks, n);
}

MUON_API muon_status muon_gloo_mesh_subgroup(muon_comm *out, muon_comm *parent, const int *dims,
                                             int ndims, int dim) {
  static const char fn[] = "muon_gloo_mesh_subgroup";
  muon_gloo__begin(out);
  if (!out || !parent || !dims)
    return muon_create_failed(MUON_ERR_ARG, fn, "%s is NULL",
                             !out ? "out" : !parent ? "parent" : "dims");
  if (ndims < 1 || ndims > 16 || dim < 0 || dim >= ndims)
    return muon_create_failed(MUON_ERR_ARG, fn, "need 1 <= ndims <= 16 and 0 <= dim < ndims "
                             "(ndims %d, dim %d)", ndims, dim);
  long long total = 1;
  for (int i = 0; i < ndims; i++) {
    if (dims[i] < 1)
      return muon_create_failed(MUON_ERR_ARG, fn, "dims[%d] = %d must be >= 1", i, dims[i]);
    total *= dims[i];
    if (total > (1 << 30)) break;
  }
  if (total != parent->size)
    return muon_create_failed(MUON_ERR_ARG, fn, "the mesh has %lld ranks but the parent has %d",
                             total, parent->size);
  /* row-major: stride of dim = product of the dims after it */
  int stride = 1;
  for (int i = dim + 1; i < ndims; i++) stride *= dims[i];
  const int r = parent->rank, len = dims[dim];
  const int first = r - ((r / stride) % len) * stride;
  try {
    std::vector<int> ranks((size_t)len);
    for (int i = 0; i < len; i++) ranks[(size_t)i] = first + i * stride;
    return muon_gloo__subgroup(fn, out, parent, ranks.data(), len);
  } catch (...) {
    return muon_create_failed(MUON_ERR_NOMEM, fn, "out of memory");
  }
}

} /* extern "C" */

#endif /* MUON_GLOO_IMPLEMENTATION */
