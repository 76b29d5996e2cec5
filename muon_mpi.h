/* muon_mpi.h - a muon communicator over MPI (CPU buffers; Open MPI, MPICH, any MPI-3 library).

   USAGE
   -----
   1. Wrap the trainer's communicator (the common case: the trainer already called MPI_Init):

       #include "muon.h"
       #include "muon_mpi.h"

       muon_comm world;
       if (muon_mpi_wrap(&world, MPI_COMM_WORLD, NULL) != MUON_OK) { puts(muon_error(NULL)); ... }
       ... desc.comm = &world; ... muon_step ...
       muon_comm_destroy(&world);        // frees muon's duplicate; MPI_COMM_WORLD stays yours
       MPI_Finalize();                   // the trainer's, as always

   2. Or create one from MPI_COMM_WORLD (muon calls MPI_Init_thread if MPI is not initialised
      yet, and then MPI_Finalize when the last muon_mpi communicator is destroyed):

       muon_mpi_desc md = muon_mpi_default_desc();
       muon_mpi_create(&world, &md);

   Groups (TP, FSDP, HSDP shard / replicate, EP, PP) are split from a parent, so
   muon_auto_config works unchanged:

       int dims[2] = {2, 2};                             // 4 ranks as a 2 x 2 row-major mesh
       muon_comm tp, dp;
       muon_mpi_mesh_subgroup(&tp, &world, dims, 2, 1);  // {0,1} {2,3}
       muon_mpi_mesh_subgroup(&dp, &world, dims, 2, 0);  // {0,2} {1,3}

   The implementation is C (C99 or C++): in exactly ONE file,

       #include "muon.h"
       #define MUON_MPI_IMPLEMENTATION
       #include "muon_mpi.h"

   compiled with mpicc (or `pkg-config --cflags --libs ompi-c` for Open MPI), beside muon.h's
   implementation (MUON_IMPLEMENTATION in one file), whose muon_error(NULL) carries the reason
   of a failed creation. Start the processes with the MPI launcher: `mpirun -n 4 ./prog`, or
   `srun` under Slurm. As root Open MPI needs `--allow-run-as-root`, and more ranks than cores
   `--oversubscribe`. This header includes <mpi.h>; in C++ it first defines OMPI_SKIP_MPICXX and
   MPICH_SKIP_MPICXX (MPI's deprecated C++ bindings do not compile cleanly under -Werror).

   SEMANTICS
       - muon never talks on the trainer's communicator: wrap and create take an MPI_Comm_dup
         of it (collective over it), so muon's messages never match the trainer's and muon's
         error handler (MPI_ERRORS_RETURN, set on the duplicate only) leaves the trainer's
         handler alone. muon_comm_destroy frees the duplicate (MPI_Comm_free).
       - alltoallv is MPI_Ialltoallv with MPI_FLOAT (counts and displacements in floats, zeros
         allowed, the part to oneself handled by MPI), allgather MPI_Iallgather of bytes.
       - The communicator is queued (muon.h's vtable): alltoallv starts the exchange and returns
         a ticket; join waits for it, finish for every one in flight, each polling MPI_Test
         against a deadline counted from the exchange's start (see FAILURES). Up to 16 are in
         flight at once, joined in any order; the caller leaves their buffers alone until join.
         With muon_dist_config.async the exchanges in flight overlap Newton-Schulz (how much
         depends on the MPI library's progress: Open MPI progresses a nonblocking collective
         inside MPI_Test, so the overlap is the exchanges' among themselves).
       - desc.blocking = 1 (or MUON_MPI_BLOCKING=1) gives a blocking table instead: MPI_Alltoallv
         and MPI_Allgather themselves, no deadline (see FAILURES); muon_dist_config.async then
         runs the exchanges on muon's communication thread, which needs MPI_THREAD_SERIALIZED
         (muon_mpi_create asks for it; a trainer that initialises MPI itself should too).
       - MPI takes int counts: a count or displacement above INT_MAX floats (8 GiB) is
         MUON_ERR_ARG with a message, never truncated (muon's rounds are 64 MiB by default).
       - Every slot is a collective: all ranks of the group call it in the same order (muon.h
         does). A communicator is used by one thread at a time.

   FAILURES (what MPI can and cannot tell)
       - Every MPI call on muon's communicators returns its error (MPI_ERRORS_RETURN): it becomes
         MUON_ERR_COMM with MPI_Error_string's text in the vtable's `error`, never an abort by
         muon. The communicator is then broken: that call and every later one return the same
         status and text.
       - A STALLED peer (alive, not calling): the queued table's join, finish and allgather poll
         MPI_Test and return MUON_ERR_TIMEOUT after timeout_s (MUON_MPI_TIMEOUT, default 300 s)
         from the exchange's start; muon_step then returns it with nothing applied. MPI cannot
         cancel a started collective, so the communicator is broken and its pending requests
         are left to MPI (muon_comm_destroy does not free the duplicate then, and the buffers
         of the timed-out exchange belong to MPI until the job ends): end the job (MPI_Abort or
         exit) and restart from the last checkpoint. The blocking table has no deadline: it
         waits as long as MPI does. A peer cut off by the NETWORK is a stalled one to MPI
         (tested across network namespaces, a link taken down and a host's link deleted in the
         middle of a step: every rank MUON_ERR_TIMEOUT about 2 s after the cut with
         MUON_MPI_TIMEOUT=2, nothing applied, and a new job resumes from the checkpoint).
       - A DEAD peer: MPI without fault tolerance (ULFM) has no error for it. Open MPI's mpirun
         notices that a process exited and kills the whole job (every rank, within about a
         second, exit status non-zero); other launchers may leave the survivors waiting, and
         then the bound is the queued table's timeout above, or the launcher's own (`mpirun
         --timeout S`, Slurm's time limit). Nothing in muon can hang longer than the first of
         these, and nothing is applied on a rank whose step failed.
       - Creation: MPI_Init_thread, and the MPI_Comm_dup of a wrapped communicator, run under
         the error handler MPI already has (MPI_ERRORS_ARE_FATAL unless the trainer changed it).
       - Open MPI 4.1 reports a failed nonblocking collective to MPI_COMM_WORLD's error handler,
         not to the communicator's: around the one MPI_Test that completes an exchange, the
         queued table sets MPI_ERRORS_RETURN on MPI_COMM_WORLD and then puts the trainer's
         handler back. A trainer thread that calls MPI on MPI_COMM_WORLD at that moment would
         see MPI_ERRORS_RETURN: keep such calls out of muon_step's time (MPI_THREAD_SERIALIZED
         asks that of the trainer anyway), or use the blocking table.

   ENVIRONMENT (read only for the desc fields left at their defaults)
       MUON_MPI_TIMEOUT              seconds for every wait of the queued table (default 300)
       MUON_MPI_BLOCKING=1           the blocking table (muon_mpi_desc.blocking)

   ERRORS
       muon_mpi_create, muon_mpi_wrap, muon_mpi_split and muon_mpi_mesh_subgroup return
       MUON_ERR_ARG for bad arguments (the message names the field), MUON_ERR_COMM when MPI
       refuses (its own text included), MUON_ERR_NOMEM. On failure *out is cleared and
       muon_error(NULL) says why on this thread ("MUON_ERR_ARG: muon_mpi_wrap: ..."), as for
       muon_create. A live communicator's failures are its vtable's `error` text (see
       FAILURES). Nothing is printed.

   LICENSE: see the end of muon.h.
*/
#ifndef MUON_MPI_H
#define MUON_MPI_H

#ifndef MUON_H
#include "muon.h"
#endif

#if defined(__cplusplus) && !defined(MPI_VERSION)
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#endif
#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct muon_mpi_desc {
  double timeout_s;  /* every wait of the queued table; 0: env MUON_MPI_TIMEOUT, else 300 s     */
  int blocking;      /* 1: MPI_Alltoallv / MPI_Allgather, no deadline, so muon_dist_config.async
                        runs the exchanges on muon's communication thread; 0: unless env
                        MUON_MPI_BLOCKING=1 says so                                            */
} muon_mpi_desc;

/* timeout_s = 0, blocking = 0. */
MUON_API muon_mpi_desc muon_mpi_default_desc(void);

/* Each of these makes a communicator in *out. On failure *out is cleared and muon_error(NULL)
   gives the reason on this thread (see ERRORS). desc NULL: the defaults. */

/* A muon communicator over a duplicate of the trainer's `comm` (MPI_Comm_dup: collective over
   comm). MPI must be initialised. `comm` and its error handler stay the trainer's. */
MUON_API muon_status muon_mpi_wrap(muon_comm *out, MPI_Comm comm, const muon_mpi_desc *desc);

/* The world: MPI_Init_thread(MPI_THREAD_SERIALIZED) first if MPI is not initialised (then the
   last muon_mpi communicator destroyed calls MPI_Finalize), then muon_mpi_wrap(MPI_COMM_WORLD). */
MUON_API muon_status muon_mpi_create(muon_comm *out, const muon_mpi_desc *desc);

/* MPI_Comm_split of a muon_mpi communicator: collective over ALL ranks of the parent; ranks with
   the same color form a group, ordered by key (ties by parent rank). color MPI_UNDEFINED joins
   no group: *out is cleared and MUON_OK returned. Inherits the parent's timeout and table. */
MUON_API muon_status muon_mpi_split(muon_comm *out, muon_comm *parent, int color, int key);

/* For a row-major mesh of shape dims[0..ndims) over the parent's ranks (the product must equal
   the parent's size), the group along mesh dimension `dim` holding this rank: e.g. dims = {2, 2}:
   dim 1 = consecutive ranks {0,1} {2,3}, dim 0 = strided ranks {0,2} {1,3}. A split, so
   collective over the whole parent. */
MUON_API muon_status muon_mpi_mesh_subgroup(muon_comm *out, muon_comm *parent, const int *dims,
                                            int ndims, int dim);

/* The MPI_Comm muon talks on (its duplicate), MPI_COMM_NULL if c is not a muon_mpi one. */
MUON_API MPI_Comm muon_mpi_handle(const muon_comm *c);

#ifdef __cplusplus
}
#endif

#endif /* MUON_MPI_H */

/* =============================================================================================
   Implementation (C99 or C++; MPI-3) */
#if defined(MUON_MPI_IMPLEMENTATION) && !defined(MUON_MPI__IMPLEMENTED)
#define MUON_MPI__IMPLEMENTED

#include <limits.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/time.h>

#define MUON_MPI__TICKETS 16  /* exchanges started and not yet joined, at most (muon.h: 16)    */

/* One started exchange: MPI reads its count arrays until it completes, so they live here. */
typedef struct muon_mpi__exchange {
  MPI_Request req;
  int *counts;               /* 4 * size ints: send counts, send displs, recv counts, recv displs */
  double start;
  unsigned long long call;
  int live;                  /* started and not yet joined                                    */
  int done;                  /* completed (finish waited for it), still to be joined          */
} muon_mpi__exchange;

typedef struct muon_mpi__comm {
  MPI_Comm comm;             /* muon's duplicate                                              */
  int rank, size;
  int blocking;
  double timeout_s;
  muon_status broken;        /* MUON_OK while usable                                          */
  unsigned long long calls;  /* collectives started on this communicator                      */
  char error[1024];
  muon_mpi__exchange started[MUON_MPI__TICKETS];
  int *scratch;              /* 4 * size ints: the blocking table's counts                    */
} muon_mpi__comm;

static int muon_mpi__live;        /* muon_mpi communicators alive                              */
static int muon_mpi__initialised; /* muon called MPI_Init_thread: it finalises too             */

/* gettimeofday and select: declared by strict -std=c99 builds too (clock_gettime is not). */
static double muon_mpi__now(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

static void muon_mpi__nap(long usec) {
  struct timeval tv;
  tv.tv_sec = 0;
  tv.tv_usec = usec;
  (void)select(0, NULL, NULL, NULL, &tv);
}

static void muon_mpi__say(muon_mpi__comm *c, const char *fmt, ...) MUON__PRINTF_DECL(2, 3);
static void muon_mpi__say(muon_mpi__comm *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->error, sizeof c->error, fmt, ap);
  va_end(ap);
}

/* MPI's own text for an error code. */
static void muon_mpi__text(int rc, char *buf, size_t n) {
  char s[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS || len <= 0) len = snprintf(s, sizeof s, "MPI error %d", rc);
  s[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING] = 0;
  snprintf(buf, n, "%s", s);
}

/* An MPI call failed: the communicator is broken with MUON_ERR_COMM and MPI's text. */
static muon_status muon_mpi__mpi_failed(muon_mpi__comm *c, int rc, const char *op, const char *call) {
  char why[MPI_MAX_ERROR_STRING + 1];
  muon_mpi__text(rc, why, sizeof why);
  muon_mpi__say(c, "muon_mpi %s (rank %d of %d, call %llu): %s failed: %s", op, c->rank, c->size, c->calls,
                call, why);
  c->broken = MUON_ERR_COMM;
  return MUON_ERR_COMM;
}

/* Polls one started request until it completes, fails, or `start + timeout` passes (then the
   communicator is broken with MUON_ERR_TIMEOUT: MPI cannot cancel a collective). Spins on
   MPI_Request_get_status (which progresses MPI like MPI_Test) briefly, then naps 50 us between
   tests so that oversubscribed ranks leave the core. */
static muon_status muon_mpi__await(muon_mpi__comm *c, MPI_Request *req, double start, unsigned long long call,
                                   const char *op) {
  long spins = 0;
  for (;;) {
    int done = 0, rc = MPI_Request_get_status(*req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return muon_mpi__mpi_failed(c, rc, op, "MPI_Request_get_status");
    if (done) {
      /* Complete it. Open MPI 4 reports a failed nonblocking collective through
         MPI_COMM_WORLD's error handler (not the communicator's), which would abort the job, and
         MPI_Request_get_status leaves the error out of the status: MPI_ERRORS_RETURN stands in
         for the trainer's handler during this one MPI_Test, and is then put back. */
      MPI_Errhandler keep;
      int swapped = MPI_Comm_get_errhandler(MPI_COMM_WORLD, &keep) == MPI_SUCCESS;
      if (swapped) MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
      rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
      if (swapped) {
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, keep);
        MPI_Errhandler_free(&keep);
      }
      if (rc != MPI_SUCCESS) return muon_mpi__mpi_failed(c, rc, op, "the collective");
      return MUON_OK;
    }
    if (muon_mpi__now() - start >= c->timeout_s) {
      muon_mpi__say(c,
                    "muon_mpi %s (rank %d of %d, call %llu) timed out after %.1f s: a peer has not taken "
                    "part (stalled, or dead under a launcher that did not end the job); MPI cannot cancel "
                    "a started collective, so this communicator is broken: end the job and restart from "
                    "the last checkpoint",
                    op, c->rank, c->size, call, c->timeout_s);
      c->broken = MUON_ERR_TIMEOUT;
      return MUON_ERR_TIMEOUT;
    }
    if (++spins > 200) muon_mpi__nap(50);
  }
}

/* size_t counts and displacements to MPI's int, refused (not truncated) past INT_MAX. */
static muon_status muon_mpi__ints(muon_mpi__comm *c, int *out, const size_t *sc, const size_t *sd, const size_t *rc,
                                  const size_t *rd, const float *send, float *recv) {
  const int n = c->size;
  int p, k;
  if (!sc || !sd || !rc || !rd) {
    muon_mpi__say(c, "muon_mpi alltoallv (rank %d): a count or displacement array is NULL", c->rank);
    return MUON_ERR_ARG;
  }
  for (p = 0; p < n; p++) {
    const size_t v[4] = {sc[p], sd[p], rc[p], rd[p]};
    static const char *const what[4] = {"send_counts", "send_displs", "recv_counts", "recv_displs"};
    for (k = 0; k < 4; k++) {
      if (v[k] > (size_t)INT_MAX) {
        muon_mpi__say(c, "muon_mpi alltoallv (rank %d): %s[%d] = %zu floats exceeds MPI's int counts (INT_MAX); "
                      "use smaller rounds (muon_dist_config.round_bytes)", c->rank, what[k], p, v[k]);
        return MUON_ERR_ARG;
      }
      out[k * n + p] = (int)v[k];
    }
    if ((sc[p] && !send) || (rc[p] && !recv)) {
      muon_mpi__say(c, "muon_mpi alltoallv (rank %d): %s is NULL but its count for peer %d is not zero", c->rank,
                    sc[p] && !send ? "send" : "recv", p);
      return MUON_ERR_ARG;
    }
  }
  return MUON_OK;
}

/* ---- the vtable --------------------------------------------------------------------------- */

/* Queued (the default): MPI_Ialltoallv, left in flight under a ticket; join waits for it. */
static muon_status muon_mpi__alltoallv_started(void *ctx, const float *send, const size_t *send_counts,
                                               const size_t *send_displs, float *recv, const size_t *recv_counts,
                                               const size_t *recv_displs, int *ticket) {
  muon_mpi__comm *c = (muon_mpi__comm *)ctx;
  muon_mpi__exchange *x;
  muon_status st;
  int t = 0, rc, n;
  if (!c || !ticket) return MUON_ERR_ARG;
  *ticket = -1;
  if (c->broken) return c->broken;
  n = c->size;
  while (t < MUON_MPI__TICKETS && c->started[t].live) t++;
  if (t == MUON_MPI__TICKETS) {
    muon_mpi__say(c, "muon_mpi alltoallv (rank %d): %d exchanges started and not joined", c->rank,
                  MUON_MPI__TICKETS);
    return MUON_ERR_ARG;
  }
  x = &c->started[t];
  st = muon_mpi__ints(c, x->counts, send_counts, send_displs, recv_counts, recv_displs, send, recv);
  if (st != MUON_OK) return st;
  x->start = muon_mpi__now();
  x->call = ++c->calls;
  rc = MPI_Ialltoallv(send, x->counts, x->counts + n, MPI_FLOAT, recv, x->counts + 2 * n, x->counts + 3 * n,
                      MPI_FLOAT, c->comm, &x->req);
  if (rc != MPI_SUCCESS) return muon_mpi__mpi_failed(c, rc, "alltoallv", "MPI_Ialltoallv");
  x->live = 1;
  x->done = 0;
  *ticket = t;
  return MUON_OK;
}

static muon_status muon_mpi__join(void *ctx, int ticket) {
  muon_mpi__comm *c = (muon_mpi__comm *)ctx;
  muon_mpi__exchange *x;
  if (!c) return MUON_ERR_ARG;
  if (ticket < 0 || ticket >= MUON_MPI__TICKETS || !c->started[ticket].live) {
    if (c->broken) return c->broken;
    muon_mpi__say(c, "muon_mpi join (rank %d): ticket %d is not a started exchange", c->rank, ticket);
    return MUON_ERR_ARG;
  }
  x = &c->started[ticket];
  if (c->broken) return c->broken;  /* its request stays MPI's: see FAILURES */
  x->live = 0;
  if (x->done) return MUON_OK;
  return muon_mpi__await(c, &x->req, x->start, x->call, "alltoallv");
}

/* Every exchange in flight, waited for; each stays to be joined (then at once). */
static muon_status muon_mpi__finish(void *ctx) {
  muon_mpi__comm *c = (muon_mpi__comm *)ctx;
  int t;
  if (!c) return MUON_ERR_ARG;
  for (t = 0; t < MUON_MPI__TICKETS && !c->broken; t++) {
    muon_mpi__exchange *x = &c->started[t];
    if (x->live && !x->done) {
      muon_status st = muon_mpi__await(c, &x->req, x->start, x->call, "alltoallv");
      if (st != MUON_OK) return st;
      x->done = 1;
    }
  }
  return c->broken;
}

static muon_status muon_mpi__allgather_check(muon_mpi__comm *c, const void *send, void *recv, size_t bytes) {
  if (c->broken) return c->broken;
  if (bytes && (!send || !recv)) {
    muon_mpi__say(c, "muon_mpi allgather (rank %d): %s is NULL", c->rank, send ? "recv" : "send");
    return MUON_ERR_ARG;
  }
  if (bytes > (size_t)INT_MAX || bytes > SIZE_MAX / (size_t)c->size) {
    muon_mpi__say(c, "muon_mpi allgather (rank %d): %zu bytes exceeds MPI's int counts (INT_MAX)", c->rank, bytes);
    return MUON_ERR_ARG;
  }
  return MUON_OK;
}

/* Queued table: MPI_Iallgather polled under the timeout. */
static muon_status muon_mpi__allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  muon_mpi__comm *c = (muon_mpi__comm *)ctx;
  MPI_Request req;
  muon_status st;
  double start;
  int rc;
  if (!c) return MUON_ERR_ARG;
  st = muon_mpi__allgather_check(c, send, recv, bytes);
  if (st != MUON_OK) return st;
  start = muon_mpi__now();
  c->calls++;
  rc = MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->comm, &req);
  if (rc != MPI_SUCCESS) return muon_mpi__mpi_failed(c, rc, "allgather", "MPI_Iallgather");
  return muon_mpi__await(c, &req, start, c->calls, "allgather");
}

/* Blocking table: MPI_Alltoallv itself, done on return; nothing to join. */
static muon_status muon_mpi__alltoallv_blocking(void *ctx, const float *send, const size_t *send_counts,
                                                const size_t *send_displs, float *recv, const size_t *recv_counts,
                                                const size_t *recv_displs, int *ticket) {
  muon_mpi__comm *c = (muon_mpi__comm *)ctx;
  muon_status st;
  int rc, n;
  if (!c || !ticket) return MUON_ERR_ARG;
  *ticket = -1;
  if (c->broken) return c->broken;
  n = c->size;
  st = muon_mpi__ints(c, c->scratch, send_counts, send_displs, recv_counts, recv_displs, send, recv);
  if (st != MUON_OK) return st;
  c->calls++;
  rc = MPI_Alltoallv(send, c->scratch, c->scratch + n, MPI_FLOAT, recv, c->scratch + 2 * n, c->scratch + 3 * n,
                     MPI_FLOAT, c->comm);
  return rc == MPI_SUCCESS ? MUON_OK : muon_mpi__mpi_failed(c, rc, "alltoallv", "MPI_Alltoallv");
}

static muon_status muon_mpi__allgather_blocking(void *ctx, const void *send, void *recv, size_t bytes) {
  muon_mpi__comm *c = (muon_mpi__comm *)ctx;
  muon_status st;
  int rc;
  if (!c) return MUON_ERR_ARG;
  st = muon_mpi__allgather_check(c, send, recv, bytes);
  if (st != MUON_OK) return st;
  c->calls++;
  rc = MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->comm);
  return rc == MPI_SUCCESS ? MUON_OK : muon_mpi__mpi_failed(c, rc, "allgather", "MPI_Allgather");
}

static const char *muon_mpi__error(void *ctx) {
  muon_mpi__comm *c = (muon_mpi__comm *)ctx;
  return c ? c->error : "";
}

static void muon_mpi__free(muon_mpi__comm *c) {
  int t;
  for (t = 0; t < MUON_MPI__TICKETS; t++) free(c->started[t].counts);
  free(c->scratch);
  free(c);
}

static void muon_mpi__destroy(void *ctx) {
  muon_mpi__comm *c = (muon_mpi__comm *)ctx;
  int t, pending = 0, fin = 0;
  if (!c) return;
  for (t = 0; t < MUON_MPI__TICKETS; t++) pending |= c->started[t].live && !c->started[t].done;
  if (!MPI_Finalized(&fin) && !fin) {
    /* a request MPI still holds keeps its communicator and its count arrays (see FAILURES) */
    if (c->broken || pending) return;
    MPI_Comm_free(&c->comm);
  }
  muon_mpi__free(c);
  if (--muon_mpi__live == 0 && muon_mpi__initialised && !MPI_Finalized(&fin) && !fin) {
    muon_mpi__initialised = 0;
    MPI_Finalize();
  }
}

static const muon_comm_vtable muon_mpi__vtable = {
  MUON_COMM_VTABLE_VERSION,
  /* .alltoallv = */ muon_mpi__alltoallv_started,
  /* .join      = */ muon_mpi__join,
  /* .finish    = */ muon_mpi__finish,
  /* .allgather = */ muon_mpi__allgather,
  /* .error     = */ muon_mpi__error,
  /* .destroy   = */ muon_mpi__destroy,
  /* .memory    = */ MUON_MEMORY_HOST,
  /* .queued    = */ 1
};

/* muon_mpi_desc.blocking: MPI's blocking collectives; nothing to join or finish. */
static const muon_comm_vtable muon_mpi__vtable_blocking = {
  MUON_COMM_VTABLE_VERSION,
  /* .alltoallv = */ muon_mpi__alltoallv_blocking,
  /* .join      = */ NULL,
  /* .finish    = */ NULL,
  /* .allgather = */ muon_mpi__allgather_blocking,
  /* .error     = */ muon_mpi__error,
  /* .destroy   = */ muon_mpi__destroy,
  /* .memory    = */ MUON_MEMORY_HOST,
  /* .queued    = */ 0
};

/* ---- creation ----------------------------------------------------------------------------
   A failed creation says why through muon_create_failed (muon.h), what muon_error(NULL) returns. */

static muon_status muon_mpi__refuse_rc(const char *fn, const char *call, int rc) {
  char why[MPI_MAX_ERROR_STRING + 1];
  muon_mpi__text(rc, why, sizeof why);
  return muon_create_failed(MUON_ERR_COMM, fn, "%s failed: %s", call, why);
}

static void muon_mpi__begin(muon_comm *out) {
  if (out) {
    out->vt = NULL;
    out->ctx = NULL;
    out->rank = 0;
    out->size = 0;
  }
  muon_set_create_error("%s", "");
}

MUON_API muon_mpi_desc muon_mpi_default_desc(void) {
  muon_mpi_desc d;
  memset(&d, 0, sizeof d);
  return d;
}

/* The desc and the environment: timeout and table. */
static muon_status muon_mpi__settings(const char *fn, const muon_mpi_desc *desc, double *timeout_s, int *blocking) {
  muon_mpi_desc d = desc ? *desc : muon_mpi_default_desc();
  const char *e;
  if (!(d.timeout_s >= 0) || d.timeout_s > 1e9)
    return muon_create_failed(MUON_ERR_ARG, fn, "desc.timeout_s = %g must be >= 0 (0: the default)", d.timeout_s);
  if (d.blocking != 0 && d.blocking != 1)
    return muon_create_failed(MUON_ERR_ARG, fn, "desc.blocking = %d must be 0 or 1", d.blocking);
  *timeout_s = d.timeout_s;
  if (*timeout_s == 0) {
    e = getenv("MUON_MPI_TIMEOUT");
    *timeout_s = 300;
    if (e && *e) {
      char *end;
      double v = strtod(e, &end);
      if (*end || !(v > 0) || v > 1e9)
        return muon_create_failed(MUON_ERR_ARG, fn, "environment MUON_MPI_TIMEOUT='%s' is not a number of seconds > 0", e);
      *timeout_s = v;
    }
  }
  e = getenv("MUON_MPI_BLOCKING");
  *blocking = d.blocking || (e && atoi(e) != 0);
  return MUON_OK;
}

/* A muon communicator over `comm`, which becomes its own (freed with it). */
static muon_status muon_mpi__adopt(const char *fn, muon_comm *out, MPI_Comm comm, double timeout_s, int blocking) {
  muon_mpi__comm *c;
  int rc, t, n = 0, r = 0;
  if ((rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS ||
      (rc = MPI_Comm_size(comm, &n)) != MPI_SUCCESS || (rc = MPI_Comm_rank(comm, &r)) != MPI_SUCCESS) {
    MPI_Comm_free(&comm);
    return muon_mpi__refuse_rc(fn, "setting up the communicator", rc);
  }
  c = (muon_mpi__comm *)calloc(1, sizeof *c);
  if (c) c->scratch = (int *)malloc(4 * (size_t)n * sizeof(int));
  for (t = 0; c && c->scratch && t < MUON_MPI__TICKETS; t++) {
    c->started[t].counts = (int *)malloc(4 * (size_t)n * sizeof(int));
    if (!c->started[t].counts) break;
  }
  if (!c || !c->scratch || t < MUON_MPI__TICKETS) {
    if (c) muon_mpi__free(c);
    MPI_Comm_free(&comm);
    return muon_create_failed(MUON_ERR_NOMEM, fn, "out of memory");
  }
  c->comm = comm;
  c->rank = r;
  c->size = n;
  c->blocking = blocking;
  c->timeout_s = timeout_s;
  muon_mpi__live++;
  out->vt = blocking ? &muon_mpi__vtable_blocking : &muon_mpi__vtable;
  out->ctx = c;
  out->rank = r;
  out->size = n;
  return MUON_OK;
}

MUON_API muon_status muon_mpi_wrap(muon_comm *out, MPI_Comm comm, const muon_mpi_desc *desc) {
  static const char fn[] = "muon_mpi_wrap";
  int init = 0, fin = 0, blocking = 0, rc;
  double timeout_s = 0;
  MPI_Comm dup;
  muon_status st;
  muon_mpi__begin(out);
  if (!out) return muon_create_failed(MUON_ERR_ARG, fn, "out is NULL");
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin)
    return muon_create_failed(MUON_ERR_ARG, fn, "MPI is %s (call MPI_Init first, or muon_mpi_create)",
                            fin ? "already finalised" : "not initialised");
  if (comm == MPI_COMM_NULL) return muon_create_failed(MUON_ERR_ARG, fn, "comm is MPI_COMM_NULL");
  st = muon_mpi__settings(fn, desc, &timeout_s, &blocking);
  if (st != MUON_OK) return st;
  rc = MPI_Comm_dup(comm, &dup);
  if (rc != MPI_SUCCESS) return muon_mpi__refuse_rc(fn, "MPI_Comm_dup", rc);
  return muon_mpi__adopt(fn, out, dup, timeout_s, blocking);
}

MUON_API muon_status muon_mpi_create(muon_comm *out, const muon_mpi_desc *desc) {
  static const char fn[] = "muon_mpi_create";
  int init = 0, fin = 0, provided = 0, blocking = 0, rc;
  double timeout_s = 0;
  muon_status st;
  muon_mpi__begin(out);
  if (!out) return muon_create_failed(MUON_ERR_ARG, fn, "out is NULL");
  st = muon_mpi__settings(fn, desc, &timeout_s, &blocking);
  if (st != MUON_OK) return st;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (fin) return muon_create_failed(MUON_ERR_ARG, fn, "MPI is already finalised (it cannot start again)");
  if (!init) {
    rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return muon_mpi__refuse_rc(fn, "MPI_Init_thread", rc);
    muon_mpi__initialised = 1;
  }
  st = muon_mpi_wrap(out, MPI_COMM_WORLD, desc);
  if (st != MUON_OK) {
    char why[1024];
    snprintf(why, sizeof why, "%s", muon_error(NULL));
    if (muon_mpi__live == 0 && muon_mpi__initialised) {
      muon_mpi__initialised = 0;
      MPI_Finalize();
    }
    muon_set_create_error("%s", why);
  }
  return st;
}

MUON_API MPI_Comm muon_mpi_handle(const muon_comm *c) {
  if (!c || (c->vt != &muon_mpi__vtable && c->vt != &muon_mpi__vtable_blocking) || !c->ctx) return MPI_COMM_NULL;
  return ((const muon_mpi__comm *)c->ctx)->comm;
}

static muon_status muon_mpi__split(const char *fn, muon_comm *out, muon_comm *parent, int color, int key) {
  muon_mpi__comm *p;
  MPI_Comm sub = MPI_COMM_NULL;
  int rc;
  if (!out) return muon_create_failed(MUON_ERR_ARG, fn, "out is NULL");
  if (muon_mpi_handle(parent) == MPI_COMM_NULL)
    return muon_create_failed(MUON_ERR_ARG, fn, "parent is not a muon_mpi communicator");
  p = (muon_mpi__comm *)parent->ctx;
  if (p->broken) return muon_create_failed(p->broken, fn, "the parent is broken: %s", p->error);
  if (color < 0 && color != MPI_UNDEFINED)
    return muon_create_failed(MUON_ERR_ARG, fn, "color = %d must be >= 0 or MPI_UNDEFINED", color);
  rc = MPI_Comm_split(p->comm, color, key, &sub);
  if (rc != MPI_SUCCESS) {
    muon_mpi__mpi_failed(p, rc, "split", "MPI_Comm_split");
    return muon_create_failed(MUON_ERR_COMM, fn, "%s", p->error);
  }
  if (sub == MPI_COMM_NULL) return MUON_OK;
  return muon_mpi__adopt(fn, out, sub, p->timeout_s, p->blocking);
}

MUON_API muon_status muon_mpi_split(muon_comm *out, muon_comm *parent, int color, int key) {
  muon_mpi__begin(out);
  return muon_mpi__split("muon_mpi_split", out, parent, color, key);
}

MUON_API muon_status muon_mpi_mesh_subgroup(muon_comm *out, muon_comm *parent, const int *dims, int ndims, int dim) {
  static const char fn[] = "muon_mpi_mesh_subgroup";
  int i, total = 1, rest, color = 0, stride = 1, coord[16];
  muon_mpi__begin(out);
  if (!out || !parent || !dims)
    return muon_create_failed(MUON_ERR_ARG, fn, "%s is NULL", !out ? "out" : !parent ? "parent" : "dims");
  if (ndims < 1 || ndims > 16 || dim < 0 || dim >= ndims)
    return muon_create_failed(MUON_ERR_ARG, fn, "need 1 <= ndims <= 16 and 0 <= dim < ndims (ndims %d, dim %d)", ndims,
                            dim);
  for (i = 0; i < ndims; i++) {
    if (dims[i] < 1 || total > parent->size / dims[i])
      return muon_create_failed(MUON_ERR_ARG, fn, "dims[%d] = %d does not fit the parent's %d ranks", i, dims[i],
                              parent->size);
    total *= dims[i];
  }
  if (total != parent->size)
    return muon_create_failed(MUON_ERR_ARG, fn, "the mesh has %d ranks but the parent has %d", total, parent->size);
  for (i = ndims - 1, rest = parent->rank; i >= 0; i--) {
    coord[i] = rest % dims[i];
    rest /= dims[i];
  }
  /* The group is every rank with this rank's coordinates except along dim: number it by them. */
  for (i = ndims - 1; i >= 0; i--) {
    if (i == dim) continue;
    color += coord[i] * stride;
    stride *= dims[i];
  }
  return muon_mpi__split(fn, out, parent, color, coord[dim]);
}

#endif /* MUON_MPI_IMPLEMENTATION */
