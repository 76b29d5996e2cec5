/* muon_nccl.h - a muon communicator over NCCL: the exchange stays on the GPU.

   USAGE
   -----
   1. Wrap the trainer's communicator (the common case, and the safe one: a second NCCL
      communicator running beside the trainer's can deadlock against it). llm.c keeps a
      `main_stream` for compute and an `nccl_stream` for NCCL; muon orders the two with events:

       #include "muon.h"
       #include "muon_cuda.h"
       #include "muon_nccl.h"

       muon_cuda_desc cd = muon_cuda_default_desc();
       cd.device = local_rank;
       cd.stream = main_stream;                    // muon's kernels run on the compute stream
       muon_compute gpu;
       muon_cuda_create(&gpu, &cd);

       muon_nccl_desc nd = muon_nccl_default_desc();
       nd.stream = nccl_stream;                    // where the exchanges are queued
       nd.compute_stream = main_stream;            // ordered against it (NULL: the same stream)
       muon_comm world;
       if (muon_nccl_wrap(&world, nccl_comm, &nd) != MUON_OK) { puts(muon_error(NULL)); ... }

       muon_desc desc = muon_default_desc();
       desc.compute = &gpu;  desc.comm = &world;  desc.dist = &cfg;  ...
       ... muon_step(opt) ...
       muon_destroy(opt);
       muon_comm_destroy(&world);                  // leaves nccl_comm to the trainer
       muon_compute_destroy(&gpu);

   2. Or create one: rank, size and the store from the launcher's environment, as muon_gloo.h
      (`muonrun -n 8 ./trainer` on one node; across nodes that share a file system, MUON_STORE
      on that file system). Make the rank's GPU current first (cudaSetDevice(local_rank)):

       muon_nccl_desc nd = muon_nccl_default_desc();
       nd.stream = muon_cuda_stream(&gpu);         // one stream for compute and exchange
       muon_nccl_create(&world, &nd);

   Groups (TP, FSDP, HSDP shard / replicate, EP, PP) are split from a parent, so
   muon_auto_config works unchanged:

       int dims[2] = {2, 4};                       // 8 ranks: 2 x 4 row-major mesh
       muon_comm tp, dp;
       muon_nccl_mesh_subgroup(&tp, &world, dims, 2, 1);  // {0..3} {4..7}
       muon_nccl_mesh_subgroup(&dp, &world, dims, 2, 0);  // {0,4} {1,5} ...

   The implementation uses only the CUDA runtime and NCCL host APIs: compile it in ONE C or C++
   file (no nvcc needed) and link with NCCL and the CUDA runtime:

       #define MUON_NCCL_IMPLEMENTATION
       #include "muon_nccl.h"

       cc -I/usr/local/cuda/include -c muon_nccl.c
       cc train.o muon_nccl.o ... -L/usr/local/cuda/lib64 -lnccl -lcudart

   beside muon.h's implementation (MUON_IMPLEMENTATION in one file, as every muon program has),
   whose muon_error(NULL) carries the reason of a failed creation.

   SEMANTICS
       - The communicator is queued (muon.h's vtable). alltoallv (the exchange of the step) is
         ONE NCCL group of ncclSend / ncclRecv, zero counts skipped, the part to oneself a
         cudaMemcpyAsync; it is QUEUED on `stream` and returns without waiting (no host
         synchronisation is added). With a separate compute_stream, an event makes the exchange
         wait for the compute queued before it, and join makes compute wait for the exchange
         (an event per exchange, on the device). muon.h joins each exchange at once, or with
         muon_dist_config.async = 1 only where it reads that exchange's buffers, so the next
         rounds' exchanges run on `stream` while Newton-Schulz runs on compute_stream. On one
         stream there is nothing to join and async changes nothing.
       - finish (muon.h calls it before the host waits for the compute backend) polls an event
         recorded after the last exchange, and ncclCommGetAsyncError, until done, failed, or
         the timeout (MUON_NCCL_TIMEOUT): the only place where the host waits for NCCL.
       - allgather carries small host data (the step's agreement and vote): copied to a device
         buffer, ncclAllGather, copied back, waited for under the same timeout.
       - Communicators made here (create, split) are NON-BLOCKING (ncclConfig_t.blocking = 0):
         creation, splits and group launches are polled under the timeout instead of blocking
         forever on a missing peer. A wrapped communicator keeps whatever mode it was made with.
       - Every slot is a collective: all ranks of the group call it in the same order (muon.h
         does). A communicator is used by one thread at a time, with the rank's GPU current.
       - Payloads are fp32 slots (muon.h's bf16 wire packs two values into each).

   FAILURES
       On a timeout, an NCCL error (ncclCommGetAsyncError) or a failing CUDA call the
       communicator ABORTS its NCCL communicator (ncclCommAbort: the queued kernels end, so no
       stream hangs) and is broken: that call and every later one return MUON_ERR_TIMEOUT or
       MUON_ERR_COMM with the same text (NCCL's own included), read through muon_error or the
       vtable's `error` slot. muon_step then returns that status with nothing applied (its
       all-or-nothing stash lives on the GPU too). Other ranks see their own timeout (NCCL does
       not tell peers). What to do next: destroy the optimizer's comm (muon_comm_destroy) and
       build a new NCCL communicator (all ranks), or restart the job from the last checkpoint
       (muon_state_save_file). A WRAPPED communicator is aborted too: ncclCommAbort frees it,
       so the trainer must not use or destroy its handle afterwards (muon_nccl_handle() then
       returns NULL). NCCL 2.27+ also offers ncclCommShrink to drop dead ranks; muon does not
       call it for you.

   ENVIRONMENT (read only for the desc fields left at their defaults)
       MUON_RANK, MUON_WORLD_SIZE    rank and world size of muon_nccl_create; else RANK /
                                     WORLD_SIZE (torchrun), else OMPI_COMM_WORLD_RANK / _SIZE
       MUON_STORE                    directory for the unique id (fresh per run: muonrun makes
                                     one); rank 0 writes muon_nccl_<n>.id, the others read it
       MUON_NCCL_TIMEOUT             seconds for every wait (default 300)

   ERRORS
       muon_nccl_create, muon_nccl_wrap, muon_nccl_split and muon_nccl_mesh_subgroup return
       MUON_ERR_ARG for bad arguments (the message names the field), MUON_ERR_BACKEND when CUDA
       refuses (events, device memory), MUON_ERR_COMM / MUON_ERR_TIMEOUT when NCCL or the
       rendezvous fails, MUON_ERR_NOMEM. On failure *out is cleared and muon_error(NULL) says
       why on this thread ("MUON_ERR_COMM: muon_nccl_create: ...", NCCL's and CUDA's own text
       included), as for muon_create. A live communicator's failures are its vtable's `error`
       text (see FAILURES). Nothing is printed.

   LICENSE: see the end of muon.h.
*/
#ifndef MUON_NCCL_H
#define MUON_NCCL_H

#ifndef MUON_H
#include "muon.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct muon_nccl_desc {
  int rank, size;            /* create: -1 = from the environment (see ENVIRONMENT)           */
  const char *store_dir;     /* create: unique-id directory; NULL = env MUON_STORE             */
  int device;                /* create: CUDA device to make current; -1 = the current one      */
  void *stream;              /* cudaStream_t the exchanges are queued on; NULL = legacy default */
  void *compute_stream;      /* the compute backend's cudaStream_t when it is another stream
                                (muon_cuda_stream); NULL = the same as `stream`               */
  double timeout_s;          /* every wait; 0 = env MUON_NCCL_TIMEOUT, else 300 s             */
} muon_nccl_desc;

/* rank = size = device = -1, everything else NULL / 0. */
MUON_API muon_nccl_desc muon_nccl_default_desc(void);

/* Each of these makes a communicator in *out. On failure *out is cleared and muon_error(NULL)
   gives the reason on this thread (see ERRORS). */

/* A muon communicator over the trainer's ncclComm_t (an `ncclComm_t` passed as void *), which
   stays the trainer's: muon_comm_destroy leaves it alone, unless a failure aborted it (see
   FAILURES). desc: stream, compute_stream and timeout_s are used; NULL = defaults. */
MUON_API muon_status muon_nccl_wrap(muon_comm *out, void *nccl_comm, const muon_nccl_desc *desc);

/* Creates a world communicator: rank 0 makes the unique id and leaves it in the store
   directory, every rank joins (collective over all `size` processes, under the timeout). */
MUON_API muon_status muon_nccl_create(muon_comm *out, const muon_nccl_desc *desc);

/* ncclCommSplit of a muon_nccl communicator: collective over ALL ranks of the parent; ranks
   with the same color form a group, ordered by key (ties by parent rank). color -1
   (NCCL_SPLIT_NOCOLOR) joins no group: *out is cleared and MUON_OK returned. The new
   communicator inherits the parent's streams and timeout. */
MUON_API muon_status muon_nccl_split(muon_comm *out, muon_comm *parent, int color, int key);

/* For a row-major mesh of shape dims[0..ndims) over the parent's ranks (the product must equal
   the parent's size), the group along mesh dimension `dim` holding this rank: e.g. dims = {2, 4}:
   dim 1 = consecutive ranks {0..3} {4..7}, dim 0 = strided ranks {0,4} {1,5} ... A split, so
   collective over the whole parent. */
MUON_API muon_status muon_nccl_mesh_subgroup(muon_comm *out, muon_comm *parent, const int *dims,
                                             int ndims, int dim);

/* The ncclComm_t behind a muon_nccl communicator (NULL if it is not one, or was aborted). */
MUON_API void *muon_nccl_handle(const muon_comm *c);

#ifdef __cplusplus
}
#endif

#endif /* MUON_NCCL_H */

/* =============================================================================================
   Implementation (C99 or C++; CUDA runtime and NCCL host API) */
#if defined(MUON_NCCL_IMPLEMENTATION) && !defined(MUON_NCCL__IMPLEMENTED)
#define MUON_NCCL__IMPLEMENTED

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#define MUON_NCCL__TICKETS 16  /* exchanges started and not yet joined, at most (muon.h: 16) */
typedef struct muon_nccl__comm {
  ncclComm_t comm;           /* NULL once aborted                                             */
  int owned;                 /* made here: destroyed with the muon_comm                       */
  int rank, size;
  cudaStream_t stream, compute;
  cudaEvent_t before;        /* compute -> exchange (only when compute != stream)             */
  cudaEvent_t done;          /* recorded after each queued exchange                           */
  cudaEvent_t ticket[MUON_NCCL__TICKETS]; /* alltoallv's, joined by the compute stream       */
  int issued;                /* tickets handed out so far; ticket t uses ticket[t % N]        */
  unsigned char unjoined[MUON_NCCL__TICKETS];
  int queued;                /* an exchange was queued and not waited for                     */
  double timeout_s;
  muon_status broken;        /* MUON_OK, or the failure every later call repeats              */
  void *bounce;              /* device buffer of allgather                                    */
  size_t bounce_bytes;
  char error[768];
} muon_nccl__comm;

/* gettimeofday and select: declared by strict -std=c99 builds too (clock_gettime is not). */
static double muon_nccl__now(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

static void muon_nccl__pause(void) {
  struct timeval tv;
  tv.tv_sec = 0;
  tv.tv_usec = 20;
  (void)select(0, NULL, NULL, NULL, &tv);
}

/* Breaks the communicator: the NCCL communicator is aborted (its queued kernels end, so no
   stream can hang on it) and every later call returns `st` with this text. */
static muon_status muon_nccl__fail(muon_nccl__comm *c, muon_status st, const char *fmt, ...) {
  va_list ap;
  size_t n;
  if (c->broken != MUON_OK) return c->broken;
  va_start(ap, fmt);
  vsnprintf(c->error, sizeof c->error, fmt, ap);
  va_end(ap);
  if (c->comm) {
    const char *last = ncclGetLastError(c->comm);
    n = strlen(c->error);
    if (last && *last && n + 8 < sizeof c->error)
      snprintf(c->error + n, sizeof c->error - n, " (NCCL: %s)", last);
    (void)ncclCommAbort(c->comm);
    c->comm = NULL;
  }
  n = strlen(c->error);
  snprintf(c->error + n, sizeof c->error - n, "; the NCCL communicator of rank %d of %d was aborted", c->rank, c->size);
  c->broken = st;
  c->queued = 0;
  return st;
}

static muon_status muon_nccl__cuda(muon_nccl__comm *c, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return MUON_OK;
  return muon_nccl__fail(c, MUON_ERR_COMM, "muon_nccl: %s failed: %s (%s)", what, cudaGetErrorName(e),
                         cudaGetErrorString(e));
}

/* Polls a non-blocking communicator until its call in progress (r) has finished: its final
   result, or ncclInProgress still when the timeout passed. */
static ncclResult_t muon_nccl__poll(ncclComm_t comm, ncclResult_t r, double timeout_s) {
  double deadline = muon_nccl__now() + timeout_s;
  while (r == ncclInProgress && muon_nccl__now() <= deadline) {
    ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) r = q;
    if (r == ncclInProgress) muon_nccl__pause();
  }
  return r;
}

/* Until the communicator has no call in progress (non-blocking communicators), under the timeout. */
static muon_status muon_nccl__settle(muon_nccl__comm *c, ncclResult_t r, const char *what) {
  r = muon_nccl__poll(c->comm, r, c->timeout_s);
  if (r == ncclInProgress)
    return muon_nccl__fail(c, MUON_ERR_TIMEOUT,
                           "muon_nccl: %s still in progress after %.1f s (MUON_NCCL_TIMEOUT): a peer is "
                           "missing, stalled or calling something else",
                           what, c->timeout_s);
  if (r != ncclSuccess)
    return muon_nccl__fail(c, MUON_ERR_COMM, "muon_nccl: %s failed: %s", what, ncclGetErrorString(r));
  return MUON_OK;
}

/* Until `ev` has completed: polls the event and the communicator's asynchronous error. */
static muon_status muon_nccl__wait_event(muon_nccl__comm *c, cudaEvent_t ev, const char *what) {
  double deadline = muon_nccl__now() + c->timeout_s;
  for (;;) {
    ncclResult_t async = ncclSuccess, q;
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return MUON_OK;
    if (e != cudaErrorNotReady) return muon_nccl__cuda(c, e, what);
    q = ncclCommGetAsyncError(c->comm, &async);
    if (q != ncclSuccess) async = q;
    if (async != ncclSuccess && async != ncclInProgress)
      return muon_nccl__fail(c, MUON_ERR_COMM, "muon_nccl: %s on rank %d of %d: NCCL reports %s", what, c->rank,
                             c->size, ncclGetErrorString(async));
    if (muon_nccl__now() > deadline)
      return muon_nccl__fail(c, MUON_ERR_TIMEOUT,
                             "muon_nccl: %s on rank %d of %d timed out after %.1f s (MUON_NCCL_TIMEOUT): "
                             "a peer is dead, stalled or calling other collectives",
                             what, c->rank, c->size, c->timeout_s);
    muon_nccl__pause();
  }
}

/* ---- the vtable ---------------------------------------------------------------------------- */
/* The exchange, queued on `stream` after the compute queued so far, `done` recorded after it. */
static muon_status muon_nccl__exchange(muon_nccl__comm *c, const float *send, const size_t *send_counts,
                                       const size_t *send_displs, float *recv, const size_t *recv_counts,
                                       const size_t *recv_displs) {
  ncclResult_t r = ncclSuccess, first = ncclSuccess;
  muon_status st;
  int p, me = c->rank;
  if (c->broken != MUON_OK) return c->broken;
  if (send_counts[me] != recv_counts[me])
    return muon_nccl__fail(c, MUON_ERR_ARG, "muon_nccl: alltoallv sends %zu floats to itself but receives %zu",
                           send_counts[me], recv_counts[me]);
  if (c->compute != c->stream) {
    if ((st = muon_nccl__cuda(c, cudaEventRecord(c->before, c->compute),
                              "cudaEventRecord (compute before the exchange)")) != MUON_OK)
      return st;
    if ((st = muon_nccl__cuda(c, cudaStreamWaitEvent(c->stream, c->before, 0),
                              "cudaStreamWaitEvent (exchange after compute)")) != MUON_OK)
      return st;
  }
  if (send_counts[me] &&
      (st = muon_nccl__cuda(c,
                            cudaMemcpyAsync(recv + recv_displs[me], send + send_displs[me],
                                            send_counts[me] * sizeof(float), cudaMemcpyDeviceToDevice, c->stream),
                            "cudaMemcpyAsync (the part to itself)")) != MUON_OK)
    return st;
  if (c->size > 1) {
    if ((r = ncclGroupStart()) != ncclSuccess) return muon_nccl__settle(c, r, "ncclGroupStart");
    for (p = 0; p < c->size; p++) {
      if (p == me) continue;
      if (send_counts[p]) r = ncclSend(send + send_displs[p], send_counts[p], ncclFloat32, p, c->comm, c->stream);
      if (r != ncclSuccess && first == ncclSuccess) first = r;
      if (recv_counts[p]) r = ncclRecv(recv + recv_displs[p], recv_counts[p], ncclFloat32, p, c->comm, c->stream);
      if (r != ncclSuccess && first == ncclSuccess) first = r;
    }
    r = ncclGroupEnd();           /* always: the group must be closed even after a failed op */
    if (first != ncclSuccess) r = first;
    if ((st = muon_nccl__settle(c, r, "the exchange (ncclGroupEnd of ncclSend/ncclRecv)")) != MUON_OK) return st;
  }
  if ((st = muon_nccl__cuda(c, cudaEventRecord(c->done, c->stream), "cudaEventRecord (after the exchange)")) != MUON_OK)
    return st;
  c->queued = 1;
  return MUON_OK;
}

/* The exchange, and compute goes on beside it until join(ticket). On one stream there is
   nothing to overlap: the ticket is -1 and join does nothing. */
static muon_status muon_nccl__alltoallv(void *ctx, const float *send, const size_t *send_counts,
                                              const size_t *send_displs, float *recv, const size_t *recv_counts,
                                              const size_t *recv_displs, int *ticket) {
  muon_nccl__comm *c = (muon_nccl__comm *)ctx;
  int t = c->issued % MUON_NCCL__TICKETS;
  muon_status st;
  *ticket = -1;
  if (c->broken != MUON_OK) return c->broken;
  if (c->compute != c->stream && c->unjoined[t])
    return muon_nccl__fail(c, MUON_ERR_ARG,
                           "muon_nccl: alltoallv: %d exchanges started and not joined (at most %d)",
                           MUON_NCCL__TICKETS, MUON_NCCL__TICKETS);
  if ((st = muon_nccl__exchange(c, send, send_counts, send_displs, recv, recv_counts, recv_displs)) != MUON_OK)
    return st;
  if (c->compute == c->stream) return MUON_OK;
  if ((st = muon_nccl__cuda(c, cudaEventRecord(c->ticket[t], c->stream), "cudaEventRecord (a started exchange)")) !=
      MUON_OK)
    return st;
  c->unjoined[t] = 1;
  *ticket = c->issued;
  c->issued = (c->issued + 1) % (MUON_NCCL__TICKETS * 1024);
  return MUON_OK;
}

static muon_status muon_nccl__join(void *ctx, int ticket) {
  muon_nccl__comm *c = (muon_nccl__comm *)ctx;
  int t = ticket % MUON_NCCL__TICKETS;
  if (c->broken != MUON_OK) return c->broken;
  if (ticket < 0) return MUON_OK;
  if (!c->unjoined[t] ||
      (c->issued - 1 - ticket + MUON_NCCL__TICKETS * 1024) % (MUON_NCCL__TICKETS * 1024) >= MUON_NCCL__TICKETS)
    return muon_nccl__fail(c, MUON_ERR_ARG, "muon_nccl: join: ticket %d is not an exchange started and not yet joined",
                           ticket);
  c->unjoined[t] = 0;
  return muon_nccl__cuda(c, cudaStreamWaitEvent(c->compute, c->ticket[t], 0),
                         "cudaStreamWaitEvent (compute after a started exchange)");
}

static muon_status muon_nccl__finish(void *ctx) {
  muon_nccl__comm *c = (muon_nccl__comm *)ctx;
  muon_status st;
  if (c->broken != MUON_OK) return c->broken;
  if (!c->queued) return MUON_OK;
  if ((st = muon_nccl__wait_event(c, c->done, "waiting for the exchange")) != MUON_OK) return st;
  c->queued = 0;
  return MUON_OK;
}

static muon_status muon_nccl__allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  muon_nccl__comm *c = (muon_nccl__comm *)ctx;
  size_t total = bytes * (size_t)c->size;
  unsigned char *mine;
  muon_status st;
  ncclResult_t r;
  if (c->broken != MUON_OK) return c->broken;
  if (c->size == 1 || !bytes) {
    if (bytes) memmove(recv, send, bytes);
    return MUON_OK;
  }
  if (total > c->bounce_bytes) {   /* grows at planning (the matrix lists); the step's records fit */
    void *p = NULL;
    if ((st = muon_nccl__finish(c)) != MUON_OK) return st;
    if ((st = muon_nccl__cuda(c, cudaStreamSynchronize(c->stream),
                              "cudaStreamSynchronize (before growing the allgather buffer)")) != MUON_OK)
      return st;
    if (cudaMalloc(&p, total) != cudaSuccess) {
      (void)cudaGetLastError();
      return muon_nccl__fail(c, MUON_ERR_NOMEM, "muon_nccl: allgather: cudaMalloc of %zu bytes failed", total);
    }
    (void)cudaFree(c->bounce);
    c->bounce = p;
    c->bounce_bytes = total;
  }
  mine = (unsigned char *)c->bounce + (size_t)c->rank * bytes;
  if ((st = muon_nccl__cuda(c, cudaMemcpyAsync(mine, send, bytes, cudaMemcpyHostToDevice, c->stream),
                            "cudaMemcpyAsync (allgather in)")) != MUON_OK)
    return st;
  r = ncclAllGather(mine, c->bounce, bytes, ncclUint8, c->comm, c->stream);
  if ((st = muon_nccl__settle(c, r, "ncclAllGather")) != MUON_OK) return st;
  if ((st = muon_nccl__cuda(c, cudaMemcpyAsync(recv, c->bounce, total, cudaMemcpyDeviceToHost, c->stream),
                            "cudaMemcpyAsync (allgather out)")) != MUON_OK)
    return st;
  if ((st = muon_nccl__cuda(c, cudaEventRecord(c->done, c->stream), "cudaEventRecord (after the allgather)")) !=
      MUON_OK)
    return st;
  if ((st = muon_nccl__wait_event(c, c->done, "ncclAllGather")) != MUON_OK) return st;
  c->queued = 0;                  /* everything queued before it has finished too */
  return MUON_OK;
}

static const char *muon_nccl__error(void *ctx) { return ((muon_nccl__comm *)ctx)->error; }

static void muon_nccl__destroy(void *ctx) {
  muon_nccl__comm *c = (muon_nccl__comm *)ctx;
  int i;
  if (!c) return;
  if (c->comm && c->queued) (void)muon_nccl__finish(c);   /* what is queued ends first (or aborts) */
  if (c->comm && c->owned) {
    /* Finalize flushes NCCL's own work; a peer that never comes makes it time out: abort. */
    if (muon_nccl__settle(c, ncclCommFinalize(c->comm), "ncclCommFinalize") == MUON_OK) (void)ncclCommDestroy(c->comm);
    c->comm = NULL;
  }
  if (c->bounce) (void)cudaFree(c->bounce);
  if (c->before) (void)cudaEventDestroy(c->before);
  if (c->done) (void)cudaEventDestroy(c->done);
  for (i = 0; i < MUON_NCCL__TICKETS; i++)
    if (c->ticket[i]) (void)cudaEventDestroy(c->ticket[i]);
  free(c);
}

static const muon_comm_vtable muon_nccl__vtable = {
  MUON_COMM_VTABLE_VERSION,
  /* .alltoallv = */ muon_nccl__alltoallv,
  /* .join      = */ muon_nccl__join,
  /* .finish    = */ muon_nccl__finish,
  /* .allgather = */ muon_nccl__allgather,
  /* .error     = */ muon_nccl__error,
  /* .destroy   = */ muon_nccl__destroy,
  /* .memory    = */ MUON_MEMORY_DEVICE,
  /* .queued    = */ 1
};

/* ---- creation ------------------------------------------------------------------------------
   Every failed creation (create, wrap, split, mesh_subgroup) clears *out and says why through
   muon_create_failed (muon.h): "MUON_ERR_X: function: reason", what muon_error(NULL) returns. */

/* The start of every creation: *out cleared, no reason left from an earlier failure. */
static void muon_nccl__begin(muon_comm *out) {
  if (out) { out->vt = NULL; out->ctx = NULL; out->rank = 0; out->size = 0; }
  muon_set_create_error("%s", "");
}

static muon_status muon_nccl__timeout(const char *fn, double t, double *out) {
  if (t == 0) {
    const char *s = getenv("MUON_NCCL_TIMEOUT");
    t = 300;
    if (s && *s) {
      char *end;
      t = strtod(s, &end);
      if (*end || !(t > 0))
        return muon_create_failed(MUON_ERR_ARG, fn, "MUON_NCCL_TIMEOUT='%s' is not a positive number of seconds", s);
    }
  }
  if (!(t > 0) || t > 1e7)
    return muon_create_failed(MUON_ERR_ARG, fn, "muon_nccl_desc.timeout_s must be > 0 and <= 1e7 (got %g)", t);
  *out = t;
  return MUON_OK;
}

/* The context around an NCCL communicator: its events (and nothing else on the GPU yet). */
static muon_status muon_nccl__make(const char *fn, ncclComm_t comm, int owned, cudaStream_t stream,
                                   cudaStream_t compute, double timeout_s, muon_comm *out) {
  muon_nccl__comm *c = (muon_nccl__comm *)calloc(1, sizeof *c);
  int rank = 0, size = 0, i;
  cudaError_t e;
  if (!c) return muon_create_failed(MUON_ERR_NOMEM, fn, "allocating the communicator failed");
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &size) != ncclSuccess || size < 1) {
    free(c);
    return muon_create_failed(MUON_ERR_ARG, fn, "ncclCommUserRank / ncclCommCount failed: not a live communicator (%s)",
                             ncclGetLastError(comm));
  }
  c->comm = comm;
  c->owned = owned;
  c->rank = rank;
  c->size = size;
  c->stream = stream;
  c->compute = compute;
  c->timeout_s = timeout_s;
  c->broken = MUON_OK;
  e = cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming);
  if (e == cudaSuccess && compute != stream) e = cudaEventCreateWithFlags(&c->before, cudaEventDisableTiming);
  for (i = 0; e == cudaSuccess && compute != stream && i < MUON_NCCL__TICKETS; i++)
    e = cudaEventCreateWithFlags(&c->ticket[i], cudaEventDisableTiming);
  if (e != cudaSuccess) {
    c->owned = 0;                 /* the caller still owns comm and decides its fate */
    c->comm = NULL;
    muon_nccl__destroy(c);
    return muon_create_failed(MUON_ERR_BACKEND, fn, "cudaEventCreateWithFlags failed: %s", cudaGetErrorString(e));
  }
  out->vt = &muon_nccl__vtable;
  out->ctx = c;
  out->rank = rank;
  out->size = size;
  return MUON_OK;
}

static muon_nccl__comm *muon_nccl__of(const muon_comm *c) {
  return c && c->vt == &muon_nccl__vtable ? (muon_nccl__comm *)c->ctx : NULL;
}

static int muon_nccl__env_int(const char *name, int *out) {
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

/* The unique id through the store directory: rank 0 writes a temporary file and links it to
   its final name (which must not exist: a stale id would make everyone wait for nobody), the
   others wait for the final name. */
static muon_status muon_nccl__share_id(const char *dir, int rank, int seq, double timeout_s, ncclUniqueId *id) {
  static const char fn[] = "muon_nccl_create";
  char path[1024], tmp[1100];
  double deadline = muon_nccl__now() + timeout_s;
  FILE *f;
  snprintf(path, sizeof path, "%s/muon_nccl_%d.id", dir, seq);
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(id);
    if (r != ncclSuccess)
      return muon_create_failed(MUON_ERR_COMM, fn, "ncclGetUniqueId failed: %s", ncclGetErrorString(r));
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0)
      return muon_create_failed(MUON_ERR_COMM, fn, "writing %s failed: %s", tmp, strerror(errno));
    if (link(tmp, path) != 0) {
      int e = errno;
      (void)unlink(tmp);
      return muon_create_failed(
          MUON_ERR_COMM, fn, "publishing %s failed: %s%s", path, strerror(e),
          e == EEXIST ? " (the store holds an id of an earlier run: use a fresh directory per run)" : "");
    }
    (void)unlink(tmp);
    return MUON_OK;
  }
  for (;;) {
    f = fopen(path, "rb");
    if (f) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return MUON_OK;
    }
    if (muon_nccl__now() > deadline)
      return muon_create_failed(MUON_ERR_TIMEOUT, fn, "rank %d waited %.1f s for rank 0's id in %s (MUON_NCCL_TIMEOUT)",
                               rank, timeout_s, path);
    muon_nccl__pause();
  }
}

/* Polls a non-blocking communicator being made until ready; aborts it on failure. */
static muon_status muon_nccl__ready(const char *fn, ncclComm_t comm, ncclResult_t r, double timeout_s,
                                    const char *what) {
  r = muon_nccl__poll(comm, r, timeout_s);
  if (r == ncclInProgress) {
    (void)ncclCommAbort(comm);
    return muon_create_failed(MUON_ERR_TIMEOUT, fn, "%s timed out after %.1f s (MUON_NCCL_TIMEOUT): a rank did not join",
                             what, timeout_s);
  }
  if (r != ncclSuccess) {
    muon_status st = muon_create_failed(MUON_ERR_COMM, fn, "%s failed: %s (NCCL: %s)", what, ncclGetErrorString(r),
                                       ncclGetLastError(comm));
    if (comm) (void)ncclCommAbort(comm);
    return st;
  }
  return MUON_OK;
}

/* muon_nccl_split's work, for it and muon_nccl_mesh_subgroup (fn: the one called). */
static muon_status muon_nccl__split(const char *fn, muon_comm *out, muon_comm *parent, int color, int key) {
  muon_nccl__comm *pc = muon_nccl__of(parent);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclComm_t comm = NULL;
  muon_status st;
  ncclResult_t r;
  if (!pc) return muon_create_failed(MUON_ERR_ARG, fn, "parent is not a muon_nccl communicator");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return muon_create_failed(MUON_ERR_ARG, fn, "color %d is negative (and not NCCL_SPLIT_NOCOLOR)", color);
  if (pc->broken != MUON_OK) return muon_create_failed(pc->broken, fn, "the parent is broken: %s", pc->error);
  config.blocking = 0;
  r = ncclCommSplit(pc->comm, color, key, &comm, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    st = muon_create_failed(MUON_ERR_COMM, fn, "ncclCommSplit failed: %s (NCCL: %s)", ncclGetErrorString(r),
                           ncclGetLastError(pc->comm));
    if (comm) (void)ncclCommAbort(comm);
    return st;
  }
  if (!comm) {                   /* NCCL_SPLIT_NOCOLOR: only the parent's part to finish */
    if ((st = muon_nccl__settle(pc, r, "ncclCommSplit")) != MUON_OK) return muon_create_failed(st, fn, "%s", pc->error);
    return MUON_OK;
  }
  if ((st = muon_nccl__ready(fn, comm, r, pc->timeout_s, "ncclCommSplit")) != MUON_OK) return st;
  if ((st = muon_nccl__make(fn, comm, 1, pc->stream, pc->compute, pc->timeout_s, out)) != MUON_OK)
    (void)ncclCommDestroy(comm);
  return st;
}

#ifdef __cplusplus
extern "C" {
#endif

MUON_API muon_nccl_desc muon_nccl_default_desc(void) {
  muon_nccl_desc d;
  memset(&d, 0, sizeof d);
  d.rank = -1;
  d.size = -1;
  d.device = -1;
  return d;
}

MUON_API muon_status muon_nccl_wrap(muon_comm *out, void *nccl_comm, const muon_nccl_desc *desc) {
  static const char fn[] = "muon_nccl_wrap";
  muon_nccl_desc d = desc ? *desc : muon_nccl_default_desc();
  double timeout_s;
  muon_status st;
  muon_nccl__begin(out);
  if (!out || !nccl_comm) return muon_create_failed(MUON_ERR_ARG, fn, "%s is NULL", !out ? "out" : "nccl_comm");
  if ((st = muon_nccl__timeout(fn, d.timeout_s, &timeout_s)) != MUON_OK) return st;
  return muon_nccl__make(fn, (ncclComm_t)nccl_comm, 0, (cudaStream_t)d.stream,
                         (cudaStream_t)(d.compute_stream ? d.compute_stream : d.stream), timeout_s, out);
}

MUON_API muon_status muon_nccl_create(muon_comm *out, const muon_nccl_desc *desc) {
  static const char fn[] = "muon_nccl_create";
  static const char *const env_names[3][2] = {{"MUON_RANK", "MUON_WORLD_SIZE"},
                                              {"RANK", "WORLD_SIZE"},
                                              {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}};
  static int created;           /* the n of muon_nccl_<n>.id: every rank creates in the same order */
  muon_nccl_desc d;
  const char *dir;
  ncclUniqueId id;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclComm_t comm = NULL;
  double timeout_s;
  muon_status st;
  ncclResult_t r;
  int k, rank, size;
  muon_nccl__begin(out);
  if (!out || !desc) return muon_create_failed(MUON_ERR_ARG, fn, "%s is NULL", !out ? "out" : "desc");
  d = *desc;
  rank = d.rank;
  size = d.size;
  for (k = 0; k < 3 && (rank < 0 || size < 0); k++) {
    int r0 = -1, s0 = -1, hr = muon_nccl__env_int(env_names[k][0], &r0), hs = muon_nccl__env_int(env_names[k][1], &s0);
    if (hr < 0 || hs < 0)
      return muon_create_failed(MUON_ERR_ARG, fn, "environment %s / %s is not a valid rank / size", env_names[k][0],
                               env_names[k][1]);
    if (hr && hs) {
      if (rank < 0) rank = r0;
      if (size < 0) size = s0;
    }
  }
  if (rank < 0 || size < 0)
    return muon_create_failed(
        MUON_ERR_ARG, fn,
        "muon_nccl_desc.rank/size are -1 and no launcher environment "
        "(MUON_RANK/MUON_WORLD_SIZE, RANK/WORLD_SIZE, OMPI_COMM_WORLD_*) is set: start with muonrun");
  if (size < 1 || rank >= size)
    return muon_create_failed(MUON_ERR_ARG, fn, "muon_nccl_desc: rank %d is not in [0, size %d)", rank, size);
  if ((st = muon_nccl__timeout(fn, d.timeout_s, &timeout_s)) != MUON_OK) return st;
  dir = d.store_dir ? d.store_dir : getenv("MUON_STORE");
  if (size > 1 && (!dir || !*dir))
    return muon_create_failed(MUON_ERR_ARG, fn,
                             "muon_nccl_desc.store_dir is NULL and MUON_STORE is not set: %d ranks need a "
                             "directory to share NCCL's unique id",
                             size);
  if (d.device >= 0 && cudaSetDevice(d.device) != cudaSuccess)
    return muon_create_failed(MUON_ERR_BACKEND, fn, "cudaSetDevice(%d) failed: %s", d.device,
                             cudaGetErrorString(cudaGetLastError()));
  if (size == 1) {
    if ((r = ncclGetUniqueId(&id)) != ncclSuccess)
      return muon_create_failed(MUON_ERR_COMM, fn, "ncclGetUniqueId failed: %s", ncclGetErrorString(r));
  } else if ((st = muon_nccl__share_id(dir, rank, created, timeout_s, &id)) != MUON_OK) {
    return st;
  }
  created++;
  config.blocking = 0;
  r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress && !comm)
    return muon_create_failed(MUON_ERR_COMM, fn, "ncclCommInitRankConfig (rank %d of %d) failed: %s", rank, size,
                             ncclGetErrorString(r));
  if ((st = muon_nccl__ready(fn, comm, r, timeout_s, "ncclCommInitRankConfig")) != MUON_OK) return st;
  if ((st = muon_nccl__make(fn, comm, 1, (cudaStream_t)d.stream,
                            (cudaStream_t)(d.compute_stream ? d.compute_stream : d.stream), timeout_s, out)) != MUON_OK)
    (void)ncclCommDestroy(comm);
  return st;
}

MUON_API muon_status muon_nccl_split(muon_comm *out, muon_comm *parent, int color, int key) {
  muon_nccl__begin(out);
  if (!out) return muon_create_failed(MUON_ERR_ARG, "muon_nccl_split", "out is NULL");
  return muon_nccl__split("muon_nccl_split", out, parent, color, key);
}

MUON_API muon_status muon_nccl_mesh_subgroup(muon_comm *out, muon_comm *parent, const int *dims, int ndims, int dim) {
  static const char fn[] = "muon_nccl_mesh_subgroup";
  int i, total = 1, rest, color = 0, stride = 1, coord[16];
  muon_nccl__begin(out);
  if (!out) return muon_create_failed(MUON_ERR_ARG, fn, "out is NULL");
  if (!parent || !dims || ndims < 1 || ndims > 16 || dim < 0 || dim >= ndims)
    return muon_create_failed(MUON_ERR_ARG, fn, "need a parent, 1..16 dims and 0 <= dim < ndims");
  for (i = 0; i < ndims; i++) {
    if (dims[i] < 1 || total > parent->size / dims[i])
      return muon_create_failed(MUON_ERR_ARG, fn, "dims[%d] = %d does not fit the parent's %d ranks", i, dims[i],
                               parent->size);
    total *= dims[i];
  }
  if (total != parent->size)
    return muon_create_failed(MUON_ERR_ARG, fn, "the mesh has %d ranks, the parent %d", total, parent->size);
  for (i = ndims - 1, rest = parent->rank; i >= 0; i--) { coord[i] = rest % dims[i]; rest /= dims[i]; }
  /* The group is every rank with this rank's coordinates except along dim: number it by them. */
  for (i = ndims - 1; i >= 0; i--) {
    if (i == dim) continue;
    color += coord[i] * stride;
    stride *= dims[i];
  }
  return muon_nccl__split(fn, out, parent, color, coord[dim]);
}

MUON_API void *muon_nccl_handle(const muon_comm *c) {
  muon_nccl__comm *nc = muon_nccl__of(c);
  return nc ? (void *)nc->comm : NULL;
}

#ifdef __cplusplus
}
#endif

#endif /* MUON_NCCL_IMPLEMENTATION */
