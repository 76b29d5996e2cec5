/* cuda_standin.c - a strict CPU stand-in for the CUDA runtime and cuBLAS functions that
   muon_cuda.h calls, so the CUDA backend can be compiled with the host compiler and tested on a
   machine without a GPU. Link this object INSTEAD of libcudart / libcublas. See standin.h for the
   extra API; the rest has the real signatures from the CUDA toolkit headers.

   Model (what makes it strict):
   - Device memory: one arena reserved with mmap(PROT_NONE). cudaMalloc hands out 256-byte
     aligned blocks (first fit; metadata outside the arena). The arena is readable/writable only
     while the stand-in executes queued work or a synchronous copy/memset: one mprotect to open the
     used part, one to close it, per flush. A host dereference of a device pointer at any other
     time SEGFAULTs. New blocks are filled with 0xFF bytes (NaN as fp32 and bf16) because GPU
     memory is not cleared; the bytes after each block are a guard checked after every kernel
     (with AddressSanitizer they are poisoned instead, so a kernel overrun is reported at once).
   - Streams: every asynchronous operation is queued on its stream and runs only when something
     synchronises with that stream (see the functions). The NULL stream is the legacy default
     stream: cudaMemcpy and cudaMemset wait for it and for every blocking stream, never for a
     cudaStreamNonBlocking one; its asynchronous work does not wait for other streams (not
     modelled).
   - Errors found at a call are returned and kept for cudaGetLastError (which resets them). Errors
     found while executing queued work are sticky: returned by every later synchronising call
     (and by cudaGetLastError / cudaPeekAtLastError) until muon_standin_reset_errors; once one is
     set, queued work is discarded instead of executed, as in a dead CUDA context.
   All entry points take one global mutex, so several host threads may call them. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <cublas_v2.h>

#include "standin.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STANDIN_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(STANDIN_ASAN)
#define STANDIN_ASAN 1
#endif
#ifdef STANDIN_ASAN
#include <sanitizer/asan_interface.h>
#endif

#define STANDIN_ALIGN 256        /* cudaMalloc alignment (CUDA guarantees at least 256)        */
#define STANDIN_GUARD 256        /* guard bytes after every block, plus its rounding slack     */
#define STANDIN_FILL 0xFF        /* new device memory: NaN as fp32 and as bf16                 */
#define STANDIN_CANARY 0xA5      /* guard bytes                                               */

/* =============================================================================================
   Call counters and fault injection
   ============================================================================================= */
#define STANDIN_CALLS(X)                                                                           \
  X(cudaGetLastError) X(cudaPeekAtLastError) X(cudaGetErrorString) X(cudaGetErrorName)             \
  X(cudaSetDevice) X(cudaGetDevice) X(cudaGetDeviceCount) X(cudaMalloc) X(cudaFree)                \
  X(cudaMallocHost) X(cudaFreeHost) X(cudaHostAlloc) X(cudaMemcpy) X(cudaMemcpyAsync)              \
  X(cudaMemset) X(cudaMemsetAsync) X(cudaMemGetInfo) X(cudaStreamCreate)                           \
  X(cudaStreamCreateWithFlags) X(cudaStreamDestroy) X(cudaStreamSynchronize) X(cudaStreamQuery)    \
  X(cudaDeviceSynchronize) X(cudaEventCreate) X(cudaEventCreateWithFlags) X(cudaEventRecord)       \
  X(cudaEventSynchronize) X(cudaEventQuery) X(cudaEventDestroy) X(cudaEventElapsedTime)            \
  X(cudaStreamWaitEvent) X(cudaPointerGetAttributes)                                               \
  X(cublasCreate_v2) X(cublasDestroy_v2) X(cublasSetStream_v2) X(cublasGetStream_v2)               \
  X(cublasSetMathMode) X(cublasGetMathMode) X(cublasSetPointerMode_v2) X(cublasGetPointerMode_v2)  \
  X(cublasSetWorkspace_v2) X(cublasGemmEx) X(cublasGemmStridedBatchedEx) X(cublasGemmBatchedEx)    \
  X(cublasSgemm_v2) X(cublasSnrm2_v2) X(cublasGetStatusString) X(cublasGetStatusName)              \
  X(kernel) X(flush) X(mprotect)

#define STANDIN_ENUM(name) K_##name,
enum { STANDIN_CALLS(STANDIN_ENUM) K_COUNT };
#define STANDIN_NAME(name) #name,
static const char *const g_call_names[K_COUNT] = { STANDIN_CALLS(STANDIN_NAME) };

/* Functions whose failure can be injected (what each failure is: see standin.h). */
static const int g_injectable[] = {
  K_cudaMalloc, K_cudaMallocHost, K_cudaHostAlloc, K_cudaStreamCreate, K_cudaStreamCreateWithFlags,
  K_cudaEventCreate, K_cudaEventCreateWithFlags, K_cudaMemcpyAsync, K_cudaMemsetAsync, K_cudaMemcpy,
  K_cudaMemset, K_cublasCreate_v2, K_cublasGemmEx, K_cublasGemmStridedBatchedEx, K_cublasGemmBatchedEx,
  K_cublasSgemm_v2, K_cublasSnrm2_v2, K_kernel
};

static long long g_calls[K_COUNT];
static int g_fail_in[K_COUNT]; /* countdown: the call that brings it to 0 fails */

/* =============================================================================================
   Global state (all guarded by g_lock)
   ============================================================================================= */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_inited;
static int g_verbose;
static char g_msg[512];

static cudaError_t g_last_error;   /* call-time error: cudaGetLastError returns and resets it  */
static cudaError_t g_sticky;       /* execution-time error: stays until reset                  */
static int g_tf32_used;
static double g_hang_s = 30;       /* MUON_STANDIN_HANG_S                                      */
static int g_ahead;                /* MUON_STANDIN_AHEAD: see run_ahead                        */
static int g_nopull;               /* a wait blocks instead of running the other stream        */

/* Arena. */
static unsigned char *g_base;      /* NULL if the reservation failed                          */
static size_t g_arena_size;
static size_t g_page;
static int g_open;                 /* arena currently read+write                              */
static size_t g_open_len;

/* Segments tile [0, g_arena_size) in address order. */
enum { SEG_FREE, SEG_LIVE, SEG_ZOMBIE };
typedef struct seg {
  size_t off, size;                /* size includes the rounding slack and the guard          */
  size_t req;                      /* bytes the caller asked for                              */
  int state;
  int fresh;                       /* fill + guard not yet written (done at the next open)    */
  unsigned long long ticket;       /* ZOMBIE: last op seq queued before cudaFree               */
} seg;
static seg *g_segs;
static size_t g_nsegs, g_capsegs;
static size_t g_live_bytes;        /* sum of req over LIVE segments                           */
static int g_nfresh;

/* Pinned host blocks (cudaMallocHost / cudaHostAlloc). */
typedef struct pinned {
  struct pinned *next;
  unsigned char *ptr;
  size_t size;
  int zombie;
  unsigned long long ticket;
} pinned;
static pinned *g_pinned;
static int g_pin_private;          /* muon_standin_pinned_private: kernels find pinned blocks PROT_NONE */

/* Queued work. */
enum { OP_COPY, OP_SET, OP_KERNEL, OP_GEMM, OP_NRM2, OP_RECORD, OP_WAIT, OP_EXTERN };

typedef struct gemm_params {
  int ta, tb, m, n, k;
  cudaDataType at, ct;             /* Btype == Atype                                          */
  int lda, ldb, ldc;
  long long sa, sb, sc;            /* strides in elements (strided batched)                   */
  int batch;
  int ptr_arrays;                  /* BatchedEx: A, B, C are device arrays of pointers        */
  const void *A, *B;
  void *C;
  int dev_scalars;                 /* alpha/beta are device pointers read at execution        */
  float alpha, beta;
  const float *dalpha, *dbeta;
  int tf32;
} gemm_params;

typedef struct op {
  struct op *next;
  unsigned long long seq;
  int kind;
  union {
    struct { void *dst; const void *src; size_t bytes; } copy;
    struct { void *dst; int value; size_t bytes; } set;
    struct { muon_standin_kernel fn; void *args; dim3 grid, block; int fail; } kernel;
    gemm_params gemm;
    struct { const float *x; int n, incx; float *result; } nrm2;
    struct { struct CUevent_st *ev; unsigned long long gen; } record;
    struct { int stream_id; unsigned long long seq; } wait;
    struct { muon_standin_progress progress; void (*release)(void *); void *arg; char what[64]; } ext;
  } u;
} op;

struct CUstream_st {
  struct CUstream_st *next;        /* all streams, newest first (destroyed ones until drained) */
  int id;                          /* 0: the NULL stream                                      */
  unsigned flags;
  int destroyed;
  op *head, *tail;
  unsigned long long queried;      /* tail seq at the last cudaStreamQuery                     */
};
static struct CUstream_st g_null_stream;
static struct CUstream_st *g_streams;
static int g_next_stream_id = 1;
static unsigned long long g_seq;   /* last op sequence number handed out                      */

struct CUevent_st {
  struct CUevent_st *next;
  unsigned flags;
  int destroyed;
  int pending;                     /* queued record ops still referring to this event          */
  unsigned long long rec_gen;      /* records so far; the latest is the one that counts        */
  unsigned long long done_gen;     /* highest record executed                                 */
  int rec_stream_id;
  unsigned long long rec_seq;      /* op seq of the latest record                             */
  double t_ms;                     /* host time when the latest record executed               */
  unsigned long long queried;      /* rec_gen at the last cudaEventQuery                       */
};
static struct CUevent_st *g_events;

#define STANDIN_HANDLE_MAGIC 0x6d756f6eu
struct cublasContext {
  struct cublasContext *next;
  unsigned magic;
  cudaStream_t stream;
  cublasPointerMode_t pmode;
  cublasMath_t math;
  void *workspace;
  size_t workspace_bytes;
};
static struct cublasContext *g_handles;

/* Index globals the kernels read. */
dim3 muon_standin_threadIdx, muon_standin_blockIdx, muon_standin_blockDim, muon_standin_gridDim;

/* =============================================================================================
   Small helpers
   ============================================================================================= */
static void lock(void) { pthread_mutex_lock(&g_lock); }
static void unlock(void) { pthread_mutex_unlock(&g_lock); }

/* Records why the last thing failed; printed with MUON_STANDIN_VERBOSE=1. */
static void note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_msg, sizeof g_msg, fmt, ap);
  va_end(ap);
  if (g_verbose) fprintf(stderr, "cuda_standin: %s\n", g_msg);
}

/* A call-time cudart error: returned and remembered for cudaGetLastError. */
static cudaError_t rt_err(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) g_last_error = e;
  return e;
}

/* An error found while executing queued work: sticky. The first one wins. */
static void fault(cudaError_t e, const char *fmt, ...) {
  va_list ap;
  if (g_sticky == cudaSuccess) g_sticky = e;
  va_start(ap, fmt);
  vsnprintf(g_msg, sizeof g_msg, fmt, ap);
  va_end(ap);
  if (g_verbose) fprintf(stderr, "cuda_standin: execution error %d: %s\n", (int)e, g_msg);
}

static int inject(int id) {
  if (g_fail_in[id] > 0 && --g_fail_in[id] == 0) {
    note("%s: injected failure", g_call_names[id]);
    return 1;
  }
  return 0;
}

static int call_id(const char *name) {
  int i;
  if (!name) return -1;
  for (i = 0; i < K_COUNT; i++)
    if (strcmp(name, g_call_names[i]) == 0) return i;
  return -1;
}

static void arm_failure(const char *name, int nth) {
  int id = call_id(name);
  size_t i;
  if (id >= 0)
    for (i = 0; i < sizeof g_injectable / sizeof g_injectable[0]; i++)
      if (g_injectable[i] == id) { g_fail_in[id] = nth > 0 ? nth : 0; return; }
  fprintf(stderr, "cuda_standin: muon_standin_fail: no injectable function named \"%s\"\n", name ? name : "(null)");
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* =============================================================================================
   Initialisation (first use)
   ============================================================================================= */
static void init_locked(void) {
  const char *s;
  size_t mb = 2048;
  long pg;
  if (g_inited) return;
  g_inited = 1;
  s = getenv("MUON_STANDIN_VERBOSE");
  g_verbose = s && *s && strcmp(s, "0") != 0;
  s = getenv("MUON_STANDIN_HANG_S");
  if (s && *s && atof(s) > 0) g_hang_s = atof(s);
  s = getenv("MUON_STANDIN_AHEAD");
  g_ahead = s && *s && strcmp(s, "0") != 0;
  s = getenv("MUON_STANDIN_ARENA_MB");
  if (s && *s) {
    char *end;
    unsigned long long v;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || *end || v > ((unsigned long long)SIZE_MAX >> 20))
      fprintf(stderr, "cuda_standin: ignoring MUON_STANDIN_ARENA_MB=\"%s\" (not a size in MiB)\n", s);
    else
      mb = (size_t)v;
  }
  pg = sysconf(_SC_PAGESIZE);
  g_page = pg > 0 ? (size_t)pg : 4096;
  g_arena_size = mb << 20;
  if (g_arena_size) {
    void *p = mmap(NULL, g_arena_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      fprintf(stderr, "cuda_standin: cannot reserve a %zu MiB arena: %s\n", mb, strerror(errno));
      g_arena_size = 0;
    } else {
      g_base = (unsigned char *)p;
#ifdef MADV_HUGEPAGE
      madvise(p, g_arena_size, MADV_HUGEPAGE); /* fewer TLB misses in big GEMMs; advisory */
#endif
    }
  }
  if (g_arena_size) {
    g_capsegs = 64;
    g_segs = (seg *)malloc(g_capsegs * sizeof *g_segs);
    if (!g_segs) { munmap(g_base, g_arena_size); g_base = NULL; g_arena_size = 0; }
    else {
      g_nsegs = 1;
      memset(&g_segs[0], 0, sizeof g_segs[0]);
      g_segs[0].size = g_arena_size;
      g_segs[0].state = SEG_FREE;
    }
  }
  s = getenv("MUON_STANDIN_FAIL");
  if (s && *s) {
    char buf[256];
    char *tok, *save = NULL;
    snprintf(buf, sizeof buf, "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
      char *colon = strchr(tok, ':');
      if (!colon) { fprintf(stderr, "cuda_standin: MUON_STANDIN_FAIL entry \"%s\" is not name:nth\n", tok); continue; }
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
   Arena: segments, lookups, open/close
   ============================================================================================= */
static int in_arena(const void *p) {
  return g_base && (uintptr_t)p >= (uintptr_t)g_base && (uintptr_t)p - (uintptr_t)g_base < g_arena_size;
}

/* Does [p, p+bytes) touch the arena at all? (a host range must not) */
static int touches_arena(const void *p, size_t bytes) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)g_base;
  if (!g_base) return 0;
  if (bytes == 0) return in_arena(p);
  if (a + bytes < a) return 1; /* wraps: nonsense either way */
  return a < b + g_arena_size && b < a + bytes;
}

/* Index of the segment containing arena offset o (binary search). */
static size_t seg_index(size_t o) {
  size_t lo = 0, hi = g_nsegs;
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (g_segs[mid].off <= o) lo = mid; else hi = mid;
  }
  return lo;
}

/* The allocation holding all of [p, p+bytes) (bytes >= 1), or NULL. `any`: zombies count too
   (work queued before a cudaFree may still use the block). */
static seg *dev_range(const void *p, size_t bytes, int any) {
  size_t o;
  seg *s;
  if (!in_arena(p) || bytes == 0) return NULL;
  o = (size_t)((const unsigned char *)p - g_base);
  s = &g_segs[seg_index(o)];
  if (s->state == SEG_FREE || (s->state == SEG_ZOMBIE && !any)) return NULL;
  if (o - s->off > s->req || bytes > s->req - (o - s->off)) return NULL;
  return s;
}

/* The live allocation containing byte p, or NULL. */
static seg *dev_block(const void *p) { return dev_range(p, 1, 0); }

static int seg_insert(size_t at, seg s) {
  if (g_nsegs == g_capsegs) {
    seg *n = (seg *)realloc(g_segs, 2 * g_capsegs * sizeof *g_segs);
    if (!n) return 0;
    g_segs = n;
    g_capsegs *= 2;
  }
  memmove(&g_segs[at + 1], &g_segs[at], (g_nsegs - at) * sizeof *g_segs);
  g_segs[at] = s;
  g_nsegs++;
  return 1;
}

static void seg_erase(size_t at) {
  memmove(&g_segs[at], &g_segs[at + 1], (g_nsegs - at - 1) * sizeof *g_segs);
  g_nsegs--;
}

/* Returns segment i to the free list, merging with free neighbours. */
static void seg_release(size_t i) {
  if (g_segs[i].fresh) { g_segs[i].fresh = 0; g_nfresh--; }
  g_segs[i].state = SEG_FREE;
  g_segs[i].req = 0;
#ifdef STANDIN_ASAN
  ASAN_POISON_MEMORY_REGION(g_base + g_segs[i].off, g_segs[i].size);
#endif
  if (i + 1 < g_nsegs && g_segs[i + 1].state == SEG_FREE) {
    g_segs[i].size += g_segs[i + 1].size;
    seg_erase(i + 1);
  }
  if (i > 0 && g_segs[i - 1].state == SEG_FREE) {
    g_segs[i - 1].size += g_segs[i].size;
    seg_erase(i);
  }
}

/* Bytes [0, used) hold every non-free segment: the part of the arena a flush opens. */
static size_t arena_used(void) {
  size_t end;
  if (!g_nsegs) return 0;
  if (g_segs[g_nsegs - 1].state != SEG_FREE) end = g_arena_size;
  else end = g_segs[g_nsegs - 1].off;
  return (end + g_page - 1) / g_page * g_page;
}

/* Makes the arena readable and writable (once per flush) and writes the fill and guard bytes
   of blocks allocated since the last open. */
static void arena_open(void) {
  size_t i, len;
  if (g_open) return;
  len = arena_used();
  if (len) {
    if (mprotect(g_base, len, PROT_READ | PROT_WRITE) != 0) {
      fault(cudaErrorUnknown, "mprotect(open) failed: %s", strerror(errno));
      return;
    }
    g_calls[K_mprotect]++;
  }
  g_open = 1;
  g_open_len = len;
  if (g_nfresh) {
    for (i = 0; i < g_nsegs; i++) {
      seg *s = &g_segs[i];
      if (!s->fresh) continue;
      memset(g_base + s->off, STANDIN_FILL, s->req);
#ifndef STANDIN_ASAN
      memset(g_base + s->off + s->req, STANDIN_CANARY, s->size - s->req);
#endif
      s->fresh = 0;
    }
    g_nfresh = 0;
  }
}

static void arena_close(void) {
  if (!g_open) return;
  if (g_open_len) {
    if (mprotect(g_base, g_open_len, PROT_NONE) != 0)
      fault(cudaErrorUnknown, "mprotect(close) failed: %s", strerror(errno));
    g_calls[K_mprotect]++;
  }
  g_open = 0;
  g_open_len = 0;
}

#ifndef STANDIN_ASAN
/* After a kernel: every block's guard bytes must be intact, else the kernel wrote past the end
   of an allocation (on a GPU: corruption or cudaErrorIllegalAddress). */
static void check_guards(muon_standin_kernel fn) {
  size_t i, j;
  for (i = 0; i < g_nsegs; i++) {
    const seg *s = &g_segs[i];
    const unsigned char *g;
    if (s->state == SEG_FREE || s->fresh) continue;
    g = g_base + s->off + s->req;
    for (j = 0; j < s->size - s->req; j++)
      if (g[j] != STANDIN_CANARY) {
        unsigned long long f = 0;
        memcpy(&f, &fn, sizeof fn < sizeof f ? sizeof fn : sizeof f);
        fault(cudaErrorIllegalAddress,
              "kernel 0x%llx wrote %zu byte(s) past the end of a %zu-byte allocation at %p",
              f, j + 1, s->req, (void *)(g_base + s->off));
        memset((unsigned char *)g, STANDIN_CANARY, s->size - s->req); /* report once */
        break;
      }
  }
}
#endif

/* =============================================================================================
   Queues
   ============================================================================================= */
static int any_pending(void) {
  const struct CUstream_st *s;
  if (g_null_stream.head) return 1;
  for (s = g_streams; s; s = s->next)
    if (s->head) return 1;
  return 0;
}

/* Lowest seq still queued anywhere (ULLONG_MAX if nothing is). */
static unsigned long long min_pending_seq(void) {
  unsigned long long m = ULLONG_MAX;
  const struct CUstream_st *s;
  if (g_null_stream.head) m = g_null_stream.head->seq;
  for (s = g_streams; s; s = s->next)
    if (s->head && s->head->seq < m) m = s->head->seq;
  return m;
}

/* The stream a handle names for a new operation: NULL for an unknown or destroyed one. The
   special handles cudaStreamLegacy / cudaStreamPerThread are the NULL stream here. */
static struct CUstream_st *stream_of(cudaStream_t h) {
  struct CUstream_st *s;
  if (h == NULL || h == cudaStreamLegacy || h == cudaStreamPerThread) return &g_null_stream;
  for (s = g_streams; s; s = s->next)
    if (s == h && !s->destroyed) return s;
  return NULL;
}

/* A stream by id, destroyed-but-draining ones included; NULL once it is gone (then all its work
   has run). */
static struct CUstream_st *stream_by_id(int id) {
  struct CUstream_st *s;
  if (id == 0) return &g_null_stream;
  for (s = g_streams; s; s = s->next)
    if (s->id == id) return s;
  return NULL;
}

static struct CUevent_st *event_of(cudaEvent_t e) {
  struct CUevent_st *v;
  for (v = g_events; v; v = v->next)
    if (v == e && !v->destroyed) return v;
  return NULL;
}

static struct cublasContext *handle_of(cublasHandle_t h) {
  struct cublasContext *c;
  if (!h) return NULL;
  for (c = g_handles; c; c = c->next)
    if (c == h && c->magic == STANDIN_HANDLE_MAGIC) return c;
  return NULL;
}

static op *op_new(int kind) {
  op *o = (op *)calloc(1, sizeof *o);
  if (o) o->kind = kind;
  return o;
}

static void op_push(struct CUstream_st *s, op *o) {
  o->seq = ++g_seq;
  o->next = NULL;
  if (s->tail) s->tail->next = o; else s->head = o;
  s->tail = o;
}

static void op_free(op *o) {
  if (o->kind == OP_KERNEL) free(o->u.kernel.args);
  if (o->kind == OP_EXTERN && o->u.ext.release) o->u.ext.release(o->u.ext.arg);
  if (o->kind == OP_RECORD) o->u.record.ev->pending--;
  free(o);
}

static int exec_op(op *o);

/* Runs the ops of s with seq <= upto, in order; returns 1 if it stopped at an operation that
   cannot complete yet (an external one waiting for another process, or a wait for a stream that
   is stopped so). That op stays at the head. A wait op only points at earlier ops, so running
   another stream from it never re-enters this one. */
static unsigned long long g_ran;
static char g_blocked_what[64];    /* the last operation that could not complete              */
static int run_stream(struct CUstream_st *s, unsigned long long upto) {
  while (s->head && s->head->seq <= upto) {
    op *o = s->head;
    if (g_sticky == cudaSuccess) {
      if (!exec_op(o)) return 1;
    } else if (o->kind == OP_RECORD && o->u.record.gen > o->u.record.ev->done_gen) {
      o->u.record.ev->done_gen = o->u.record.gen; /* dead context: discard the work, but let
                                                     events complete (with the error) */
    }
    if (s->head == o) {
      s->head = o->next;
      if (!s->head) s->tail = NULL;
    }
    g_ran++;
    op_free(o);
  }
  return 0;
}

/* Frees blocks and pinned buffers whose cudaFree came while work was queued, once that work has
   run; streams and events destroyed while busy, once idle. */
static void reclaim(void) {
  unsigned long long m = min_pending_seq();
  size_t i;
  pinned **pp;
  struct CUstream_st **sp;
  struct CUevent_st **ep;
  for (i = g_nsegs; i-- > 0;)
    if (i < g_nsegs && g_segs[i].state == SEG_ZOMBIE && g_segs[i].ticket < m) seg_release(i);
  for (pp = &g_pinned; *pp;) {
    pinned *p = *pp;
    if (p->zombie && p->ticket < m) { *pp = p->next; free(p->ptr); free(p); }
    else pp = &p->next;
  }
  for (sp = &g_streams; *sp;) {
    struct CUstream_st *s = *sp;
    if (s->destroyed && !s->head) { *sp = s->next; free(s); }
    else sp = &s->next;
  }
  for (ep = &g_events; *ep;) {
    struct CUevent_st *e = *ep;
    if (e->destroyed && e->pending == 0) { *ep = e->next; free(e); }
    else ep = &e->next;
  }
}

static void wait_blocked(double *t0, const char *call);

/* MUON_STANDIN_AHEAD=1: before a synchronising call runs what it waits for, every stream runs
   on its own as far as it can (a wait blocks until the other stream got there, instead of
   running it), round after round until none moves. Each stream is then as far ahead of the
   others as its waits allow, as independent GPU queues may be: a consumer stream that lacks a
   wait for its producer (a stream) reads what the producer has not written yet. Off by default:
   it also runs streams nobody synchronised, which would hide a missing host sync. */
static void run_ahead(void) {
  struct CUstream_st *s;
  unsigned long long ran;
  if (!g_ahead) return;
  g_nopull = 1;
  do {
    ran = g_ran;
    for (s = g_streams; s && g_sticky == cudaSuccess; s = s->next) run_stream(s, ULLONG_MAX);
    if (g_sticky == cudaSuccess) run_stream(&g_null_stream, ULLONG_MAX);
  } while (g_ran != ran && g_sticky == cudaSuccess);
  g_nopull = 0;
}

/* A flush: run the given work with the arena open, then close it. */
static void flush_begin(void) { g_ran = 0; run_ahead(); }
static void flush_end(void) {
  arena_close();
  if (g_ran) g_calls[K_flush]++;
  reclaim();
}

static int flush_stream(struct CUstream_st *s) {
  int blocked;
  flush_begin();
  blocked = run_stream(s, ULLONG_MAX);
  flush_end();
  return blocked;
}

/* Runs every queue. Order, which a correct program cannot observe: newest stream first, the NULL
   stream last (program order would hide a missing cross-stream dependency more often). Returns 1
   if some stream stopped at an operation that cannot complete yet. */
static int run_all(void) {
  struct CUstream_st *s;
  int blocked = 0;
  for (s = g_streams; s; s = s->next) blocked |= run_stream(s, ULLONG_MAX);
  blocked |= run_stream(&g_null_stream, ULLONG_MAX);
  return blocked;
}

static int flush_all(void) {
  int blocked;
  flush_begin();
  blocked = run_all();
  flush_end();
  return blocked;
}

/* Before a synchronous copy or memset, which run on the legacy default stream: that stream (the
   NULL one) and every blocking stream run to their ends, as the GPU waits for them. Streams made
   with cudaStreamNonBlocking (muon_cuda.h's own) are NOT waited for: a host copy right after
   muon_step, without a sync, reads what was there before, as it would on a GPU. Leaves a flush
   open. */
static void run_legacy(const char *call) {
  double t0 = 0;
  for (;;) {
    struct CUstream_st *s;
    int busy;
    flush_begin();
    for (s = g_streams; s; s = s->next)
      if (!(s->flags & cudaStreamNonBlocking)) run_stream(s, ULLONG_MAX);
    run_stream(&g_null_stream, ULLONG_MAX);
    busy = g_null_stream.head != NULL;
    for (s = g_streams; s; s = s->next) busy |= !(s->flags & cudaStreamNonBlocking) && s->head;
    if (!busy || g_sticky != cudaSuccess) return;
    flush_end();
    wait_blocked(&t0, call);
  }
}

/* A synchronising call found an operation that cannot complete yet: let other threads and
   processes run, then try again. A GPU would wait forever; after MUON_STANDIN_HANG_S seconds
   (default 30) the stand-in says what it waits for and aborts, so a test fails instead of hanging. */
static void wait_blocked(double *t0, const char *call) {
  struct timespec ts = { 0, 50000 };
  double t = now_ms();
  if (*t0 == 0) *t0 = t;
  else if (t - *t0 > g_hang_s * 1e3) {
    fprintf(stderr, "cuda_standin: %s has waited %.0f s for \"%s\", which never completes; a GPU would "
            "hang here forever (MUON_STANDIN_HANG_S). Aborting.\n", call, (t - *t0) / 1e3, g_blocked_what);
    abort();
  }
  unlock();
  nanosleep(&ts, NULL);
  lock();
}

/* =============================================================================================
   Execution of queued work
   ============================================================================================= */
static float bf16_to_f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t f_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN stays NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

static float load_elem(const void *p, cudaDataType t, size_t i) {
  if (t == CUDA_R_32F) return ((const float *)p)[i];
  return bf16_to_f(((const uint16_t *)p)[i]);
}

static size_t elem_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

/* One GEMM: C = alpha op(A) op(B) + beta C, column-major. op(A) and op(B) are first converted to
   fp32 rows (wa: m x k, wb: n x k), then every C element is summed in fp32 over p = 0..k-1 in
   order (four rows at a time only for instruction-level parallelism: same bits), in `chunks`
   consecutive parts added at the end: cuBLAS picks its kernel (split-K among them) from the
   batch count and the operands' alignment as well as the shape, so the stand-in does too
   (gemm_chunks) and code whose bits depend on either fails here as it would on a GPU. */
static void gemm_one(const gemm_params *g, const void *A, const void *B, void *C, float alpha, float beta,
                     int chunks, float *wa, float *wb) {
  const int m = g->m, n = g->n, k = g->k;
  const size_t lda = (size_t)g->lda, ldb = (size_t)g->ldb, ldc = (size_t)g->ldc;
  int i, j, p, q;
  for (i = 0; i < m; i++)
    for (p = 0; p < k; p++)
      wa[(size_t)i * k + p] = load_elem(A, g->at, g->ta == CUBLAS_OP_N ? (size_t)i + (size_t)p * lda : (size_t)p + (size_t)i * lda);
  for (j = 0; j < n; j++)
    for (p = 0; p < k; p++)
      wb[(size_t)j * k + p] = load_elem(B, g->at, g->tb == CUBLAS_OP_N ? (size_t)p + (size_t)j * ldb : (size_t)j + (size_t)p * ldb);
  for (j = 0; j < n; j++) {
    const float *b = wb + (size_t)j * k;
    for (i = 0; i < m;) {
      float acc[4] = {0, 0, 0, 0};
      int r, rows = m - i < 4 ? m - i : 4;
      for (q = 0; q < chunks; q++) {
        const int p0 = (int)((long long)k * q / chunks), p1 = (int)((long long)k * (q + 1) / chunks);
        float part[4] = {0, 0, 0, 0};
        if (rows == 4) {
          const float *a0 = wa + (size_t)i * k, *a1 = a0 + k, *a2 = a1 + k, *a3 = a2 + k;
          float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
          for (p = p0; p < p1; p++) {
            const float bp = b[p];
            s0 += a0[p] * bp; s1 += a1[p] * bp; s2 += a2[p] * bp; s3 += a3[p] * bp;
          }
          part[0] = s0; part[1] = s1; part[2] = s2; part[3] = s3;
        } else {
          for (r = 0; r < rows; r++) {
            const float *a = wa + (size_t)(i + r) * k;
            float s = 0;
            for (p = p0; p < p1; p++) s += a[p] * b[p];
            part[r] = s;
          }
        }
        for (r = 0; r < rows; r++) acc[r] = q == 0 ? part[r] : acc[r] + part[r];
      }
      for (r = 0; r < rows; r++) {
        const size_t ci = (size_t)(i + r) + (size_t)j * ldc;
        float v = alpha * acc[r];
        if (beta != 0.0f) v = alpha * acc[r] + beta * load_elem(C, g->ct, ci); /* beta 0: C not read */
        if (g->ct == CUDA_R_32F) ((float *)C)[ci] = v;
        else ((uint16_t *)C)[ci] = f_to_bf16(v);
      }
      i += rows;
    }
  }
}

/* The stand-in's kernel choice: in order for one aligned operand; split in two for a batch of
   several, in three where an operand is not 16-byte aligned. */
static int gemm_chunks(const gemm_params *g, const void *A, const void *B, const void *C) {
  int aligned = (uintptr_t)A % 16 == 0 && (uintptr_t)B % 16 == 0 && (uintptr_t)C % 16 == 0;
  return (g->batch > 1 ? 2 : 1) * (aligned ? 1 : 3);
}

/* Address of batch entry b (integer arithmetic: the entry may be nonsense until checked). */
static void *batch_entry(const void *base, int b, long long stride, size_t es) {
  return (void *)((uintptr_t)base + (uintptr_t)((long long)b * stride * (long long)es));
}

/* Extent in elements of a stored rows x cols column-major matrix with leading dimension ld. */
static size_t mat_extent(int rows, int cols, int ld) {
  if (rows <= 0 || cols <= 0) return 0;
  return (size_t)(cols - 1) * (size_t)ld + (size_t)rows;
}

/* Do two column-major matrices share a byte? (Exact: walks the columns of the first.) */
static int mats_overlap(const unsigned char *x, int xr, int xc, int xld, size_t xes,
                        const unsigned char *y, int yr, int yc, int yld, size_t yes) {
  long long bx = (long long)(intptr_t)x, by = (long long)(intptr_t)y;
  long long xlen = (long long)xr * (long long)xes, ylen = (long long)yr * (long long)yes;
  long long xL = (long long)xld * (long long)xes, yL = (long long)yld * (long long)yes;
  long long xend, yend;
  int j;
  if (xr <= 0 || xc <= 0 || yr <= 0 || yc <= 0) return 0;
  xend = bx + (long long)(xc - 1) * xL + xlen;
  yend = by + (long long)(yc - 1) * yL + ylen;
  if (xend <= by || yend <= bx) return 0;
  for (j = 0; j < xc; j++) {
    long long s = bx + (long long)j * xL, e = s + xlen, i;
    /* first column of y that ends after s */
    i = s < by + ylen ? 0 : (s - by - ylen) / yL + 1;
    if (i < yc && by + i * yL < e) return 1;
  }
  return 0;
}

/* Rows/cols of the stored A and B of a GEMM. */
static void gemm_shapes(const gemm_params *g, int *ar, int *ac, int *br, int *bc) {
  *ar = g->ta == CUBLAS_OP_N ? g->m : g->k;
  *ac = g->ta == CUBLAS_OP_N ? g->k : g->m;
  *br = g->tb == CUBLAS_OP_N ? g->k : g->n;
  *bc = g->tb == CUBLAS_OP_N ? g->n : g->k;
}

/* Checks one batch entry's operands: inside allocations, aligned, C not aliasing A or B.
   Returns NULL if fine, else what is wrong. `any`: zombie blocks count (execution time). */
static const char *gemm_check_entry(const gemm_params *g, const void *A, const void *B, const void *C, int any) {
  int ar, ac, br, bc;
  size_t ies = elem_size(g->at), oes = elem_size(g->ct);
  gemm_shapes(g, &ar, &ac, &br, &bc);
  if (mat_extent(ar, ac, g->lda) > SIZE_MAX / 8 || mat_extent(br, bc, g->ldb) > SIZE_MAX / 8 ||
      mat_extent(g->m, g->n, g->ldc) > SIZE_MAX / 8)
    return "a matrix extent overflows";
  if (g->k > 0) {
    if ((uintptr_t)A % ies || !dev_range(A, mat_extent(ar, ac, g->lda) * ies, any)) return "A is not inside one live device allocation (or misaligned)";
    if ((uintptr_t)B % ies || !dev_range(B, mat_extent(br, bc, g->ldb) * ies, any)) return "B is not inside one live device allocation (or misaligned)";
  }
  if ((uintptr_t)C % oes || !dev_range(C, mat_extent(g->m, g->n, g->ldc) * oes, any)) return "C is not inside one live device allocation (or misaligned)";
  if (g->k > 0) {
    if (mats_overlap((const unsigned char *)C, g->m, g->n, g->ldc, oes, (const unsigned char *)A, ar, ac, g->lda, ies)) return "C overlaps A (undefined on a GPU)";
    if (mats_overlap((const unsigned char *)C, g->m, g->n, g->ldc, oes, (const unsigned char *)B, br, bc, g->ldb, ies)) return "C overlaps B (undefined on a GPU)";
  }
  return NULL;
}

static void exec_gemm(const gemm_params *g) {
  float alpha = g->alpha, beta = g->beta;
  float *wa, *wb;
  int b;
  if (g->dev_scalars) { alpha = *g->dalpha; beta = *g->dbeta; }
  if (g->tf32) g_tf32_used = 1;
  wa = (float *)malloc(((size_t)g->m * (size_t)g->k + 1) * sizeof *wa);
  wb = (float *)malloc(((size_t)g->n * (size_t)g->k + 1) * sizeof *wb);
  if (!wa || !wb) {
    fault(cudaErrorMemoryAllocation, "GEMM: no host memory for a %d x %d x %d product", g->m, g->n, g->k);
    free(wa); free(wb);
    return;
  }
  for (b = 0; b < g->batch; b++) {
    const void *A, *B;
    void *C;
    if (g->ptr_arrays) {
      const char *why;
      A = g->k > 0 ? ((const void *const *)g->A)[b] : NULL; /* k == 0: A and B are not read */
      B = g->k > 0 ? ((const void *const *)g->B)[b] : NULL;
      C = ((void *const *)g->C)[b];
      why = gemm_check_entry(g, A, B, C, 1);
      if (why) {
        fault(cudaErrorIllegalAddress, "cublasGemmBatchedEx entry %d at execution: %s", b, why);
        break;
      }
    } else {
      A = batch_entry(g->A, b, g->sa, elem_size(g->at));
      B = batch_entry(g->B, b, g->sb, elem_size(g->at));
      C = batch_entry(g->C, b, g->sc, elem_size(g->ct));
    }
    gemm_one(g, A, B, C, alpha, beta, gemm_chunks(g, A, B, C), wa, wb);
  }
  free(wa);
  free(wb);
}

/* Euclidean norm in a fixed order (double accumulation). */
static float nrm2(const float *x, int n, int incx) {
  double s = 0;
  int i;
  if (n <= 0 || incx <= 0) return 0.0f;
  for (i = 0; i < n; i++) {
    double v = x[(size_t)i * (size_t)incx];
    s += v * v;
  }
  return (float)sqrt(s);
}

static void exec_kernel(op *o) {
  unsigned bx, by, bz, tx, ty, tz;
  const dim3 grid = o->u.kernel.grid, block = o->u.kernel.block;
  if (o->u.kernel.fail) {
    fault(cudaErrorLaunchFailure, "injected kernel fault");
    return;
  }
  muon_standin_gridDim = grid;
  muon_standin_blockDim = block;
  for (bz = 0; bz < grid.z; bz++)
    for (by = 0; by < grid.y; by++)
      for (bx = 0; bx < grid.x; bx++) {
        muon_standin_blockIdx.x = bx; muon_standin_blockIdx.y = by; muon_standin_blockIdx.z = bz;
        for (tz = 0; tz < block.z; tz++)
          for (ty = 0; ty < block.y; ty++)
            for (tx = 0; tx < block.x; tx++) {
              muon_standin_threadIdx.x = tx; muon_standin_threadIdx.y = ty; muon_standin_threadIdx.z = tz;
              o->u.kernel.fn(o->u.kernel.args);
            }
      }
#ifndef STANDIN_ASAN
  check_guards(o->u.kernel.fn);
#endif
}

/* muon_standin_pinned_private: every pinned block inaccessible (prot PROT_NONE) while a kernel,
   GEMM or nrm2 runs, open again after it. */
static void pinned_protect(int prot) {
  pinned *b;
  for (b = g_pinned; b; b = b->next)
    if (mprotect(b->ptr, (b->size + 4095) & ~(size_t)4095, prot) != 0)
      fault(cudaErrorUnknown, "mprotect(pinned) failed: %s", strerror(errno));
}

/* Returns 0 if the op cannot complete yet (it stays queued), else 1. */
static int exec_op(op *o) {
  switch (o->kind) {
  case OP_RECORD: {
    struct CUevent_st *e = o->u.record.ev;
    if (o->u.record.gen > e->done_gen) {
      e->done_gen = o->u.record.gen;
      e->t_ms = now_ms();
    }
    return 1;
  }
  case OP_WAIT: {
    struct CUstream_st *t = stream_by_id(o->u.wait.stream_id);
    if (g_nopull) return !(t && t->head && t->head->seq <= o->u.wait.seq);
    return !(t && run_stream(t, o->u.wait.seq));
  }
  default: break;
  }
  arena_open();
  if (!g_open) return 1; /* mprotect failed: fault() was called */
  switch (o->kind) {
  case OP_EXTERN:
    if (o->u.ext.progress(o->u.ext.arg)) return 1;
    snprintf(g_blocked_what, sizeof g_blocked_what, "%s", o->u.ext.what);
    return 0;
  case OP_COPY: memmove(o->u.copy.dst, o->u.copy.src, o->u.copy.bytes); return 1;
  case OP_SET: memset(o->u.set.dst, o->u.set.value, o->u.set.bytes); return 1;
  default: break;
  }
  if (g_pin_private) pinned_protect(PROT_NONE);
  switch (o->kind) {
  case OP_KERNEL: exec_kernel(o); break;
  case OP_GEMM: exec_gemm(&o->u.gemm); break;
  case OP_NRM2: *o->u.nrm2.result = nrm2(o->u.nrm2.x, o->u.nrm2.n, o->u.nrm2.incx); break;
  default: break;
  }
  if (g_pin_private) pinned_protect(PROT_READ | PROT_WRITE);
  return 1;
}

/* =============================================================================================
   cudart: errors and devices
   ============================================================================================= */
cudaError_t cudaGetLastError(void) {
  cudaError_t e;
  enter(K_cudaGetLastError);
  if (g_sticky != cudaSuccess) e = g_sticky;
  else { e = g_last_error; g_last_error = cudaSuccess; }
  unlock();
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  cudaError_t e;
  enter(K_cudaPeekAtLastError);
  e = g_sticky != cudaSuccess ? g_sticky : g_last_error;
  unlock();
  return e;
}

typedef struct err_text { cudaError_t e; const char *name, *text; } err_text;
#define E(code, text) { code, #code, text }
static const err_text g_err_texts[] = {
  E(cudaSuccess, "no error"),
  E(cudaErrorInvalidValue, "invalid argument"),
  E(cudaErrorMemoryAllocation, "out of memory"),
  E(cudaErrorInitializationError, "initialization error"),
  E(cudaErrorCudartUnloading, "driver shutting down"),
  E(cudaErrorInvalidConfiguration, "invalid configuration argument"),
  E(cudaErrorInvalidPitchValue, "invalid pitch argument"),
  E(cudaErrorInvalidSymbol, "invalid device symbol"),
  E(cudaErrorInvalidDevicePointer, "invalid device pointer"),
  E(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
  E(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version"),
  E(cudaErrorMissingConfiguration, "__global__ function call is not configured"),
  E(cudaErrorInvalidDeviceFunction, "invalid device function"),
  E(cudaErrorNoDevice, "no CUDA-capable device is detected"),
  E(cudaErrorInvalidDevice, "invalid device ordinal"),
  E(cudaErrorDeviceUninitialized, "invalid device context"),
  E(cudaErrorInvalidKernelImage, "device kernel image is invalid"),
  E(cudaErrorNoKernelImageForDevice, "no kernel image is available for execution on the device"),
  E(cudaErrorInvalidResourceHandle, "invalid resource handle"),
  E(cudaErrorIllegalState, "the operation cannot be performed in the present state"),
  E(cudaErrorNotReady, "device not ready"),
  E(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
  E(cudaErrorLaunchOutOfResources, "too many resources requested for launch"),
  E(cudaErrorLaunchTimeout, "the launch timed out and was terminated"),
  E(cudaErrorAssert, "device-side assert triggered"),
  E(cudaErrorHardwareStackError, "an illegal memory access was encountered"),
  E(cudaErrorIllegalInstruction, "an illegal instruction was encountered"),
  E(cudaErrorMisalignedAddress, "misaligned address"),
  E(cudaErrorInvalidAddressSpace, "operation not supported on global/shared address space"),
  E(cudaErrorInvalidPc, "invalid program counter"),
  E(cudaErrorLaunchFailure, "unspecified launch failure"),
  E(cudaErrorNotPermitted, "operation not permitted"),
  E(cudaErrorNotSupported, "operation not supported"),
  E(cudaErrorTimeout, "timeout reached"),
  E(cudaErrorUnknown, "unknown error")
};
#undef E

static const err_text *err_lookup(cudaError_t e) {
  size_t i;
  for (i = 0; i < sizeof g_err_texts / sizeof g_err_texts[0]; i++)
    if (g_err_texts[i].e == e) return &g_err_texts[i];
  return NULL;
}

const char *cudaGetErrorName(cudaError_t error) {
  const err_text *t;
  enter(K_cudaGetErrorName);
  unlock();
  t = err_lookup(error);
  return t ? t->name : "unrecognized error code";
}

const char *cudaGetErrorString(cudaError_t error) {
  const err_text *t;
  enter(K_cudaGetErrorString);
  unlock();
  t = err_lookup(error);
  return t ? t->text : "unrecognized error code";
}

cudaError_t cudaGetDeviceCount(int *count) {
  cudaError_t e = cudaSuccess;
  enter(K_cudaGetDeviceCount);
  if (!count) e = rt_err(cudaErrorInvalidValue);
  else *count = 1;
  unlock();
  return e;
}

cudaError_t cudaSetDevice(int device) {
  cudaError_t e = cudaSuccess;
  enter(K_cudaSetDevice);
  if (device != 0) { note("cudaSetDevice(%d): the stand-in has one device, 0", device); e = rt_err(cudaErrorInvalidDevice); }
  unlock();
  return e;
}

cudaError_t cudaGetDevice(int *device) {
  cudaError_t e = cudaSuccess;
  enter(K_cudaGetDevice);
  if (!device) e = rt_err(cudaErrorInvalidValue);
  else *device = 0;
  unlock();
  return e;
}

/* =============================================================================================
   cudart: memory
   ============================================================================================= */
/* First fit; NULL if nothing fits. */
static void *arena_alloc(size_t req) {
  size_t need, i;
  if (!g_base || req > g_arena_size) return NULL;
  need = (req + STANDIN_ALIGN - 1) / STANDIN_ALIGN * STANDIN_ALIGN + STANDIN_GUARD;
  if (need > g_arena_size) return NULL;
  for (i = 0; i < g_nsegs; i++) {
    seg *s = &g_segs[i];
    if (s->state != SEG_FREE || s->size < need) continue;
    if (s->size > need) {
      seg rest;
      memset(&rest, 0, sizeof rest);
      rest.off = s->off + need;
      rest.size = s->size - need;
      rest.state = SEG_FREE;
      if (!seg_insert(i + 1, rest)) return NULL;
      s = &g_segs[i]; /* realloc may have moved it */
      s->size = need;
    }
    s->state = SEG_LIVE;
    s->req = req;
    s->fresh = 1;
    g_nfresh++;
    g_live_bytes += req;
#ifdef STANDIN_ASAN
    ASAN_UNPOISON_MEMORY_REGION(g_base + s->off, req);
    ASAN_POISON_MEMORY_REGION(g_base + s->off + req, s->size - req);
#endif
    return g_base + s->off;
  }
  return NULL;
}

static int any_zombie(void) {
  size_t i;
  for (i = 0; i < g_nsegs; i++)
    if (g_segs[i].state == SEG_ZOMBIE) return 1;
  return 0;
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
  void *p;
  enter(K_cudaMalloc);
  if (!devPtr) { note("cudaMalloc: devPtr is NULL"); unlock(); return rt_err(cudaErrorInvalidValue); }
  if (inject(K_cudaMalloc)) { unlock(); return rt_err(cudaErrorMemoryAllocation); }
  if (size == 0) { *devPtr = NULL; unlock(); return cudaSuccess; } /* CUDA: success, NULL */
  reclaim();
  p = arena_alloc(size);
  if (!p && any_zombie()) {
    /* Blocks freed while work was queued come back once that work has run. */
    flush_all();
    p = arena_alloc(size);
  }
  if (!p) {
    note("cudaMalloc(%zu): the %zu-byte arena has no room (MUON_STANDIN_ARENA_MB)", size, g_arena_size);
    unlock();
    return rt_err(cudaErrorMemoryAllocation);
  }
  *devPtr = p;
  unlock();
  return cudaSuccess;
}

/* cudaFree: does NOT synchronise. A block freed while work is queued is kept (unusable by new
   calls) until that work has run, then reused. */
cudaError_t cudaFree(void *devPtr) {
  size_t i;
  enter(K_cudaFree);
  if (!devPtr) { unlock(); return cudaSuccess; }
  if (!in_arena(devPtr)) { note("cudaFree(%p): not a device pointer", devPtr); unlock(); return rt_err(cudaErrorInvalidValue); }
  i = seg_index((size_t)((unsigned char *)devPtr - g_base));
  if (g_segs[i].state != SEG_LIVE || g_base + g_segs[i].off != (unsigned char *)devPtr) {
    note("cudaFree(%p): not the start of a live allocation (double free or interior pointer)", devPtr);
    unlock();
    return rt_err(cudaErrorInvalidValue);
  }
  g_live_bytes -= g_segs[i].req;
  if (any_pending()) {
    g_segs[i].state = SEG_ZOMBIE;
    g_segs[i].ticket = g_seq;
  } else {
    seg_release(i);
  }
  unlock();
  return cudaSuccess;
}

static cudaError_t host_alloc(int id, void **ptr, size_t size, unsigned flags) {
  pinned *p;
  void *mem = NULL;
  if (!ptr) { note("%s: ptr is NULL", g_call_names[id]); return rt_err(cudaErrorInvalidValue); }
  if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined)) {
    note("%s: unknown flags 0x%x", g_call_names[id], flags);
    return rt_err(cudaErrorInvalidValue);
  }
  if (inject(id)) return rt_err(cudaErrorMemoryAllocation);
  if (size == 0) { *ptr = NULL; return cudaSuccess; }
  p = (pinned *)malloc(sizeof *p);
  /* whole pages, so that muon_standin_pinned_private can protect a block and nothing else */
  if (!p || posix_memalign(&mem, 4096, (size + 4095) & ~(size_t)4095) != 0) { free(p); return rt_err(cudaErrorMemoryAllocation); }
  memset(mem, STANDIN_FILL, size); /* not cleared on a GPU either */
  p->ptr = (unsigned char *)mem;
  p->size = size;
  p->zombie = 0;
  p->ticket = 0;
  p->next = g_pinned;
  g_pinned = p;
  *ptr = mem;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
  cudaError_t e;
  enter(K_cudaMallocHost);
  e = host_alloc(K_cudaMallocHost, ptr, size, 0);
  unlock();
  return e;
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  cudaError_t e;
  enter(K_cudaHostAlloc);
  e = host_alloc(K_cudaHostAlloc, pHost, size, flags);
  unlock();
  return e;
}

static pinned *pinned_of(const void *p) {
  pinned *b;
  for (b = g_pinned; b; b = b->next)
    if (!b->zombie && (uintptr_t)p >= (uintptr_t)b->ptr && (uintptr_t)p - (uintptr_t)b->ptr < b->size) return b;
  return NULL;
}

/* Like cudaFree: no synchronisation; a buffer that queued copies may still use is freed after
   they have run. */
cudaError_t cudaFreeHost(void *ptr) {
  pinned *b;
  enter(K_cudaFreeHost);
  if (!ptr) { unlock(); return cudaSuccess; }
  b = pinned_of(ptr);
  if (!b || b->ptr != (unsigned char *)ptr) {
    note("cudaFreeHost(%p): not a pinned block from cudaMallocHost/cudaHostAlloc", ptr);
    unlock();
    return rt_err(cudaErrorInvalidValue);
  }
  b->zombie = 1;
  b->ticket = g_seq;
  reclaim();
  unlock();
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  size_t i, used = 0;
  enter(K_cudaMemGetInfo);
  if (!free_bytes || !total) { unlock(); return rt_err(cudaErrorInvalidValue); }
  for (i = 0; i < g_nsegs; i++)
    if (g_segs[i].state != SEG_FREE) used += g_segs[i].size;
  *free_bytes = g_arena_size - used;
  *total = g_arena_size;
  unlock();
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
  enter(K_cudaPointerGetAttributes);
  if (!attributes) { unlock(); return rt_err(cudaErrorInvalidValue); }
  memset(attributes, 0, sizeof *attributes);
  if (ptr && dev_block(ptr)) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = 0;
    attributes->devicePointer = (void *)(uintptr_t)ptr;
    attributes->hostPointer = NULL;
  } else if (ptr && pinned_of(ptr)) {
    attributes->type = cudaMemoryTypeHost;
    attributes->device = 0;
    attributes->devicePointer = (void *)(uintptr_t)ptr;
    attributes->hostPointer = (void *)(uintptr_t)ptr;
  } else {
    attributes->type = cudaMemoryTypeUnregistered; /* CUDA 11+: success, not an error */
    attributes->device = -2;
  }
  unlock();
  return cudaSuccess;
}

/* Validates one side of a copy. dev: the kind says device memory. */
static cudaError_t check_side(const char *fn, const char *which, const void *p, size_t bytes, int dev) {
  if (!p) { note("%s: %s is NULL", fn, which); return cudaErrorInvalidValue; }
  if (dev) {
    if (!dev_range(p, bytes, 0)) {
      if (in_arena(p) && dev_block(p))
        note("%s: %s range [%p, +%zu) runs past the end of its device allocation", fn, which, p, bytes);
      else
        note("%s: %s %p is not inside a live device allocation", fn, which, p);
      return cudaErrorInvalidValue;
    }
  } else if (touches_arena(p, bytes)) {
    note("%s: %s %p is device memory but the copy kind says host", fn, which, p);
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

/* Validates a copy; on success *d_dev / *s_dev say which sides are device memory. */
static cudaError_t check_copy(const char *fn, void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  int dd, sd;
  cudaError_t e;
  switch (kind) {
  case cudaMemcpyHostToHost: dd = 0; sd = 0; break;
  case cudaMemcpyHostToDevice: dd = 1; sd = 0; break;
  case cudaMemcpyDeviceToHost: dd = 0; sd = 1; break;
  case cudaMemcpyDeviceToDevice: dd = 1; sd = 1; break;
  case cudaMemcpyDefault: dd = in_arena(dst); sd = in_arena(src); break; /* unified addressing */
  default:
    note("%s: %d is not a cudaMemcpyKind", fn, (int)kind);
    return cudaErrorInvalidMemcpyDirection;
  }
  if (count == 0) return cudaSuccess;
  if ((e = check_side(fn, "dst", dst, count, dd)) != cudaSuccess) return e;
  if ((e = check_side(fn, "src", src, count, sd)) != cudaSuccess) return e;
  if ((uintptr_t)dst < (uintptr_t)src + count && (uintptr_t)src < (uintptr_t)dst + count) {
    note("%s: dst and src overlap", fn);
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

/* cudaMemcpy: runs the legacy stream's queues first (run_legacy), then copies at once (one arena open for both). Returns a
   sticky error instead of copying once one is set. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  cudaError_t e;
  enter(K_cudaMemcpy);
  if (inject(K_cudaMemcpy)) { unlock(); return rt_err(cudaErrorInvalidValue); }
  e = check_copy("cudaMemcpy", dst, src, count, kind);
  if (e != cudaSuccess) { unlock(); return rt_err(e); }
  run_legacy("cudaMemcpy");
  if (g_sticky == cudaSuccess && count) {
    if (in_arena(dst) || in_arena(src)) arena_open(); /* host-to-host needs no arena */
    if (g_open || !(in_arena(dst) || in_arena(src))) memmove(dst, src, count);
  }
  flush_end();
  e = g_sticky;
  unlock();
  return rt_err(e);
}

/* cudaMemcpyAsync: validated now; both sides are read/written when the stream runs, so the host
   buffer must stay alive and unchanged until the stream is synchronised. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  cudaError_t e;
  struct CUstream_st *s;
  op *o;
  enter(K_cudaMemcpyAsync);
  if (inject(K_cudaMemcpyAsync)) { unlock(); return rt_err(cudaErrorInvalidValue); }
  e = check_copy("cudaMemcpyAsync", dst, src, count, kind);
  if (e != cudaSuccess) { unlock(); return rt_err(e); }
  s = stream_of(stream);
  if (!s) { note("cudaMemcpyAsync: unknown or destroyed stream %p", (void *)stream); unlock(); return rt_err(cudaErrorInvalidResourceHandle); }
  if (count == 0) { unlock(); return cudaSuccess; }
  o = op_new(OP_COPY);
  if (!o) { unlock(); return rt_err(cudaErrorMemoryAllocation); }
  o->u.copy.dst = dst;
  o->u.copy.src = src;
  o->u.copy.bytes = count;
  op_push(s, o);
  unlock();
  return cudaSuccess;
}

static cudaError_t check_set(const char *fn, void *devPtr, size_t count) {
  if (count == 0) return cudaSuccess;
  return check_side(fn, "devPtr", devPtr, count, 1);
}

/* cudaMemset: runs the legacy stream's queues first (run_legacy), then sets at once. */
cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  cudaError_t e;
  enter(K_cudaMemset);
  if (inject(K_cudaMemset)) { unlock(); return rt_err(cudaErrorInvalidValue); }
  e = check_set("cudaMemset", devPtr, count);
  if (e != cudaSuccess) { unlock(); return rt_err(e); }
  run_legacy("cudaMemset");
  if (g_sticky == cudaSuccess && count) {
    arena_open();
    if (g_open) memset(devPtr, value, count);
  }
  flush_end();
  e = g_sticky;
  unlock();
  return rt_err(e);
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
  cudaError_t e;
  struct CUstream_st *s;
  op *o;
  enter(K_cudaMemsetAsync);
  if (inject(K_cudaMemsetAsync)) { unlock(); return rt_err(cudaErrorInvalidValue); }
  e = check_set("cudaMemsetAsync", devPtr, count);
  if (e != cudaSuccess) { unlock(); return rt_err(e); }
  s = stream_of(stream);
  if (!s) { note("cudaMemsetAsync: unknown or destroyed stream %p", (void *)stream); unlock(); return rt_err(cudaErrorInvalidResourceHandle); }
  if (count == 0) { unlock(); return cudaSuccess; }
  o = op_new(OP_SET);
  if (!o) { unlock(); return rt_err(cudaErrorMemoryAllocation); }
  o->u.set.dst = devPtr;
  o->u.set.value = value;
  o->u.set.bytes = count;
  op_push(s, o);
  unlock();
  return cudaSuccess;
}

/* =============================================================================================
   cudart: streams and events
   ============================================================================================= */
static cudaError_t stream_create(int id, cudaStream_t *pStream, unsigned flags) {
  struct CUstream_st *s;
  if (!pStream) return rt_err(cudaErrorInvalidValue);
  if (flags & ~(unsigned)cudaStreamNonBlocking) { note("%s: unknown flags 0x%x", g_call_names[id], flags); return rt_err(cudaErrorInvalidValue); }
  if (inject(id)) return rt_err(cudaErrorMemoryAllocation);
  s = (struct CUstream_st *)calloc(1, sizeof *s);
  if (!s) return rt_err(cudaErrorMemoryAllocation);
  s->id = g_next_stream_id++;
  s->flags = flags;
  s->next = g_streams;
  g_streams = s;
  *pStream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
  cudaError_t e;
  enter(K_cudaStreamCreate);
  e = stream_create(K_cudaStreamCreate, pStream, 0);
  unlock();
  return e;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  cudaError_t e;
  enter(K_cudaStreamCreateWithFlags);
  e = stream_create(K_cudaStreamCreateWithFlags, pStream, flags);
  unlock();
  return e;
}

/* Like CUDA: returns at once; work already queued still runs (at the next cudaDeviceSynchronize
   or when an event recorded in it is waited for). */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  struct CUstream_st *s;
  enter(K_cudaStreamDestroy);
  s = stream_of(stream);
  if (!s || s == &g_null_stream) { note("cudaStreamDestroy(%p): not a live created stream", (void *)stream); unlock(); return rt_err(cudaErrorInvalidResourceHandle); }
  s->destroyed = 1;
  reclaim();
  unlock();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  struct CUstream_st *s;
  cudaError_t e;
  enter(K_cudaStreamSynchronize);
  s = stream_of(stream);
  if (!s) { note("cudaStreamSynchronize(%p): unknown or destroyed stream", (void *)stream); unlock(); return rt_err(cudaErrorInvalidResourceHandle); }
  {
    double t0 = 0;
    while (flush_stream(s) && g_sticky == cudaSuccess) wait_blocked(&t0, "cudaStreamSynchronize");
  }
  e = g_sticky;
  unlock();
  return rt_err(e);
}

/* The GPU is busy, then makes progress: the first query after new work was queued reports
   cudaErrorNotReady without running anything (so one query is never a sync), a later one runs
   the queue as far as it can (so a polling loop finishes, as on a GPU). */
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  struct CUstream_st *s;
  cudaError_t e;
  enter(K_cudaStreamQuery);
  s = stream_of(stream);
  if (!s) e = cudaErrorInvalidResourceHandle;
  else if (g_sticky != cudaSuccess) e = g_sticky;
  else if (s->tail && s->tail->seq > s->queried) { s->queried = s->tail->seq; e = cudaErrorNotReady; }
  else {
    if (s->head) flush_stream(s);
    e = g_sticky != cudaSuccess ? g_sticky : s->head ? cudaErrorNotReady : cudaSuccess;
  }
  unlock();
  return rt_err(e);
}

cudaError_t cudaDeviceSynchronize(void) {
  cudaError_t e;
  double t0 = 0;
  enter(K_cudaDeviceSynchronize);
  while (flush_all() && g_sticky == cudaSuccess) wait_blocked(&t0, "cudaDeviceSynchronize");
  e = g_sticky;
  unlock();
  return rt_err(e);
}

static cudaError_t event_create(int id, cudaEvent_t *event, unsigned flags) {
  struct CUevent_st *v;
  if (!event) return rt_err(cudaErrorInvalidValue);
  if ((flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess)) ||
      ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))) {
    note("%s: invalid flags 0x%x", g_call_names[id], flags);
    return rt_err(cudaErrorInvalidValue);
  }
  if (inject(id)) return rt_err(cudaErrorMemoryAllocation);
  v = (struct CUevent_st *)calloc(1, sizeof *v);
  if (!v) return rt_err(cudaErrorMemoryAllocation);
  v->flags = flags;
  v->next = g_events;
  g_events = v;
  *event = v;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
  cudaError_t e;
  enter(K_cudaEventCreate);
  e = event_create(K_cudaEventCreate, event, 0);
  unlock();
  return e;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  cudaError_t e;
  enter(K_cudaEventCreateWithFlags);
  e = event_create(K_cudaEventCreateWithFlags, event, flags);
  unlock();
  return e;
}

/* Queues a record: the event completes when its stream reaches it. */
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  struct CUevent_st *v;
  struct CUstream_st *s;
  op *o;
  enter(K_cudaEventRecord);
  v = event_of(event);
  s = stream_of(stream);
  if (!v || !s) { note("cudaEventRecord: unknown event %p or stream %p", (void *)event, (void *)stream); unlock(); return rt_err(cudaErrorInvalidResourceHandle); }
  o = op_new(OP_RECORD);
  if (!o) { unlock(); return rt_err(cudaErrorMemoryAllocation); }
  o->u.record.ev = v;
  o->u.record.gen = ++v->rec_gen;
  op_push(s, o);
  v->pending++;
  v->rec_stream_id = s->id;
  v->rec_seq = o->seq;
  unlock();
  return cudaSuccess;
}

static int event_done(const struct CUevent_st *v) { return v->done_gen >= v->rec_gen; }

/* Runs the event's stream up to the latest record (and nothing after it). */
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  struct CUevent_st *v;
  cudaError_t e;
  enter(K_cudaEventSynchronize);
  v = event_of(event);
  if (!v) { unlock(); return rt_err(cudaErrorInvalidResourceHandle); }
  {
    double t0 = 0;
    while (!event_done(v) && g_sticky == cudaSuccess) {
      struct CUstream_st *s = stream_by_id(v->rec_stream_id);
      int blocked;
      flush_begin();
      blocked = s && run_stream(s, v->rec_seq);
      flush_end();
      if (blocked) wait_blocked(&t0, "cudaEventSynchronize");
    }
  }
  e = g_sticky;
  unlock();
  return rt_err(e);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  struct CUevent_st *v;
  cudaError_t e;
  enter(K_cudaEventQuery);
  v = event_of(event);
  if (!v) e = cudaErrorInvalidResourceHandle;
  else if (g_sticky != cudaSuccess) e = g_sticky;
  else if (event_done(v)) e = cudaSuccess;
  else if (v->rec_gen > v->queried) { v->queried = v->rec_gen; e = cudaErrorNotReady; }  /* as cudaStreamQuery */
  else {
    struct CUstream_st *s = stream_by_id(v->rec_stream_id);
    flush_begin();
    if (s) run_stream(s, v->rec_seq);
    flush_end();
    e = g_sticky != cudaSuccess ? g_sticky : event_done(v) ? cudaSuccess : cudaErrorNotReady;
  }
  unlock();
  return rt_err(e);
}

/* Like CUDA: a pending record still completes; the memory goes when it has. */
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  struct CUevent_st *v;
  enter(K_cudaEventDestroy);
  v = event_of(event);
  if (!v) { unlock(); return rt_err(cudaErrorInvalidResourceHandle); }
  v->destroyed = 1;
  reclaim();
  unlock();
  return cudaSuccess;
}

/* Host time between the executions of the two records (not GPU time). */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  struct CUevent_st *a, *b;
  cudaError_t e = cudaSuccess;
  enter(K_cudaEventElapsedTime);
  a = event_of(start);
  b = event_of(end);
  if (!ms) e = cudaErrorInvalidValue;
  else if (!a || !b || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming) || !a->rec_gen || !b->rec_gen)
    e = cudaErrorInvalidResourceHandle;
  else if (g_sticky != cudaSuccess) e = g_sticky;
  else if (!event_done(a) || !event_done(b)) e = cudaErrorNotReady;
  else *ms = (float)(b->t_ms - a->t_ms);
  unlock();
  return rt_err(e);
}

/* When the stream reaches this point it first runs the event's stream up to the record that was
   the latest at this call (a never-recorded event: nothing to wait for). */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  struct CUevent_st *v;
  struct CUstream_st *s;
  op *o;
  enter(K_cudaStreamWaitEvent);
  v = event_of(event);
  s = stream_of(stream);
  if (!v || !s) { note("cudaStreamWaitEvent: unknown event %p or stream %p", (void *)event, (void *)stream); unlock(); return rt_err(cudaErrorInvalidResourceHandle); }
  if (flags & ~(unsigned)cudaEventWaitExternal) { unlock(); return rt_err(cudaErrorInvalidValue); }
  if (!v->rec_gen || event_done(v)) { unlock(); return cudaSuccess; }
  o = op_new(OP_WAIT);
  if (!o) { unlock(); return rt_err(cudaErrorMemoryAllocation); }
  o->u.wait.stream_id = v->rec_stream_id;
  o->u.wait.seq = v->rec_seq;
  op_push(s, o);
  unlock();
  return cudaSuccess;
}

/* =============================================================================================
   Kernel launch
   ============================================================================================= */
cudaError_t muon_standin_launch(cudaStream_t stream, dim3 grid, dim3 block, muon_standin_kernel fn,
                                const void *args, size_t args_size) {
  struct CUstream_st *s;
  op *o;
  enter(K_kernel);
  if (!fn) { note("launch: NULL kernel"); unlock(); return rt_err(cudaErrorInvalidDeviceFunction); }
  if (grid.x < 1 || grid.y < 1 || grid.z < 1 || block.x < 1 || block.y < 1 || block.z < 1 ||
      block.x > 1024 || block.y > 1024 || block.z > 64 ||
      (unsigned long long)block.x * block.y * block.z > 1024 ||
      grid.x > 2147483647u || grid.y > 65535u || grid.z > 65535u) {
    note("launch: bad shape grid (%u,%u,%u) block (%u,%u,%u)", grid.x, grid.y, grid.z, block.x, block.y, block.z);
    unlock();
    return rt_err(cudaErrorInvalidConfiguration);
  }
  if (args_size > MUON_STANDIN_MAX_ARGS || (args_size && !args)) {
    note("launch: %zu bytes of arguments at %p (at most %d)", args_size, args, MUON_STANDIN_MAX_ARGS);
    unlock();
    return rt_err(cudaErrorInvalidValue);
  }
  s = stream_of(stream);
  if (!s) { note("launch: unknown or destroyed stream %p", (void *)stream); unlock(); return rt_err(cudaErrorInvalidResourceHandle); }
  o = op_new(OP_KERNEL);
  if (!o || !(o->u.kernel.args = malloc(args_size ? args_size : 1))) { free(o); unlock(); return rt_err(cudaErrorMemoryAllocation); }
  if (args_size) memcpy(o->u.kernel.args, args, args_size);
  o->u.kernel.fn = fn;
  o->u.kernel.grid = grid;
  o->u.kernel.block = block;
  o->u.kernel.fail = inject(K_kernel); /* counted over valid launches */
  op_push(s, o);
  unlock();
  return cudaSuccess;
}

/* =============================================================================================
   cuBLAS: handle
   ============================================================================================= */
cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
  struct cublasContext *c;
  enter(K_cublasCreate_v2);
  if (!handle) { unlock(); return CUBLAS_STATUS_INVALID_VALUE; }
  if (inject(K_cublasCreate_v2)) { unlock(); return CUBLAS_STATUS_ALLOC_FAILED; }
  c = (struct cublasContext *)calloc(1, sizeof *c);
  if (!c) { unlock(); return CUBLAS_STATUS_ALLOC_FAILED; }
  c->magic = STANDIN_HANDLE_MAGIC;
  c->stream = NULL;
  c->pmode = CUBLAS_POINTER_MODE_HOST;
  c->math = CUBLAS_DEFAULT_MATH;
  c->next = g_handles;
  g_handles = c;
  *handle = c;
  unlock();
  return CUBLAS_STATUS_SUCCESS;
}

/* cuBLAS documents that cublasDestroy synchronises the device; so does this. */
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  struct cublasContext **pc;
  enter(K_cublasDestroy_v2);
  for (pc = &g_handles; *pc; pc = &(*pc)->next)
    if (*pc == handle) break;
  if (!handle || !*pc) { unlock(); return CUBLAS_STATUS_NOT_INITIALIZED; }
  *pc = handle->next;
  handle->magic = 0;
  free(handle);
  flush_all();
  unlock();
  return CUBLAS_STATUS_SUCCESS;
}

/* As in cuBLAS, setting the stream also resets the workspace to the default one. */
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  struct cublasContext *c;
  enter(K_cublasSetStream_v2);
  c = handle_of(handle);
  if (!c) { unlock(); return CUBLAS_STATUS_NOT_INITIALIZED; }
  if (!stream_of(streamId)) { note("cublasSetStream: unknown or destroyed stream %p", (void *)streamId); unlock(); return CUBLAS_STATUS_INVALID_VALUE; }
  c->stream = streamId;
  c->workspace = NULL;
  c->workspace_bytes = 0;
  unlock();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId) {
  struct cublasContext *c;
  enter(K_cublasGetStream_v2);
  c = handle_of(handle);
  if (!c) { unlock(); return CUBLAS_STATUS_NOT_INITIALIZED; }
  if (!streamId) { unlock(); return CUBLAS_STATUS_INVALID_VALUE; }
  *streamId = c->stream;
  unlock();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  struct cublasContext *c;
  unsigned base = (unsigned)mode & ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  enter(K_cublasSetMathMode);
  c = handle_of(handle);
  if (!c) { unlock(); return CUBLAS_STATUS_NOT_INITIALIZED; }
  if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_TENSOR_OP_MATH && base != CUBLAS_PEDANTIC_MATH &&
      base != CUBLAS_TF32_TENSOR_OP_MATH && base != CUBLAS_FP32_EMULATED_BF16X9_MATH &&
      base != CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH) {
    note("cublasSetMathMode: unknown mode %d", (int)mode);
    unlock();
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  c->math = mode;
  unlock();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode) {
  struct cublasContext *c;
  enter(K_cublasGetMathMode);
  c = handle_of(handle);
  if (!c) { unlock(); return CUBLAS_STATUS_NOT_INITIALIZED; }
  if (!mode) { unlock(); return CUBLAS_STATUS_INVALID_VALUE; }
  *mode = c->math;
  unlock();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  struct cublasContext *c;
  enter(K_cublasSetPointerMode_v2);
  c = handle_of(handle);
  if (!c) { unlock(); return CUBLAS_STATUS_NOT_INITIALIZED; }
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) { unlock(); return CUBLAS_STATUS_INVALID_VALUE; }
  c->pmode = mode;
  unlock();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode) {
  struct cublasContext *c;
  enter(K_cublasGetPointerMode_v2);
  c = handle_of(handle);
  if (!c) { unlock(); return CUBLAS_STATUS_NOT_INITIALIZED; }
  if (!mode) { unlock(); return CUBLAS_STATUS_INVALID_VALUE; }
  *mode = c->pmode;
  unlock();
  return CUBLAS_STATUS_SUCCESS;
}

/* The workspace must be device memory, 256-byte aligned, as cuBLAS requires; it is recorded
   but not used. */
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes) {
  struct cublasContext *c;
  enter(K_cublasSetWorkspace_v2);
  c = handle_of(handle);
  if (!c) { unlock(); return CUBLAS_STATUS_NOT_INITIALIZED; }
  if (workspaceSizeInBytes && (!workspace || (uintptr_t)workspace % 256 || !dev_range(workspace, workspaceSizeInBytes, 0))) {
    note("cublasSetWorkspace: %zu bytes at %p are not a 256-byte aligned range of one device allocation", workspaceSizeInBytes, workspace);
    unlock();
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  c->workspace = workspace;
  c->workspace_bytes = workspaceSizeInBytes;
  unlock();
  return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t status) {
  enter(K_cublasGetStatusName);
  unlock();
  switch (status) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
  case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t status) {
  enter(K_cublasGetStatusString);
  unlock();
  switch (status) {
  case CUBLAS_STATUS_SUCCESS: return "success";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
  case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
  case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
  case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
  case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
  case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
  }
  return "unknown error";
}

/* =============================================================================================
   cuBLAS: GEMM
   ============================================================================================= */
static int valid_op(cublasOperation_t t) { return t == CUBLAS_OP_N || t == CUBLAS_OP_T || t == CUBLAS_OP_C; }

static int valid_algo(cublasGemmAlgo_t a) {
  return a == CUBLAS_GEMM_DEFAULT || (a >= CUBLAS_GEMM_ALGO0 && a <= CUBLAS_GEMM_ALGO23) ||
         a == CUBLAS_GEMM_DEFAULT_TENSOR_OP || (a >= CUBLAS_GEMM_ALGO0_TENSOR_OP && a <= CUBLAS_GEMM_ALGO15_TENSOR_OP);
}

static int valid_compute(cublasComputeType_t c) {
  return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_PEDANTIC || c == CUBLAS_COMPUTE_32F_FAST_TF32 ||
         c == CUBLAS_COMPUTE_32F_FAST_16BF;
}

static int valid_types(cudaDataType a, cudaDataType b, cudaDataType c) {
  if (a != b) return 0;
  if (a == CUDA_R_32F) return c == CUDA_R_32F;
  if (a == CUDA_R_16BF) return c == CUDA_R_16BF || c == CUDA_R_32F;
  return 0;
}

/* Reads a host-mode scalar, or checks a device-mode one. 0: invalid. */
static int gemm_scalar(const char *fn, const char *which, const struct cublasContext *c, const void *p, float *v) {
  if (!p) { note("%s: %s is NULL", fn, which); return 0; }
  if (c->pmode == CUBLAS_POINTER_MODE_DEVICE) {
    if ((uintptr_t)p % 4 || !dev_range(p, sizeof(float), 0)) { note("%s: pointer mode DEVICE but %s %p is not device memory", fn, which, p); return 0; }
    return 1;
  }
  if (touches_arena(p, sizeof(float))) { note("%s: pointer mode HOST but %s %p is device memory", fn, which, p); return 0; }
  *v = *(const float *)p;
  return 1;
}

/* Everything the three GEMM entry points share. `id` names the caller (counting, injection). */
static cublasStatus_t gemm_common(int id, cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                  int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype, int lda,
                                  long long strideA, const void *B, cudaDataType Btype, int ldb, long long strideB,
                                  const void *beta, void *C, cudaDataType Ctype, int ldc, long long strideC,
                                  int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo, int ptr_arrays) {
  const char *fn = g_call_names[id];
  struct cublasContext *c;
  struct CUstream_st *s;
  gemm_params g;
  op *o;
  int b;
  enter(id);
  c = handle_of(handle);
  if (!c) { note("%s: NULL or destroyed handle", fn); unlock(); return CUBLAS_STATUS_NOT_INITIALIZED; }
  if (inject(id)) { unlock(); return CUBLAS_STATUS_EXECUTION_FAILED; }
  if (!valid_op(transa) || !valid_op(transb)) { note("%s: bad transa/transb %d/%d", fn, (int)transa, (int)transb); unlock(); return CUBLAS_STATUS_INVALID_VALUE; }
  if (m < 0 || n < 0 || k < 0 || batchCount < 0) { note("%s: negative m/n/k/batchCount", fn); unlock(); return CUBLAS_STATUS_INVALID_VALUE; }
  {
    int ra = transa == CUBLAS_OP_N ? m : k, rb = transb == CUBLAS_OP_N ? k : n;
    if (lda < (ra > 1 ? ra : 1) || ldb < (rb > 1 ? rb : 1) || ldc < (m > 1 ? m : 1)) {
      note("%s: leading dimension too small (lda %d ldb %d ldc %d for m %d n %d k %d)", fn, lda, ldb, ldc, m, n, k);
      unlock();
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  if (!valid_types(Atype, Btype, Ctype) || !valid_compute(computeType) || !valid_algo(algo)) {
    note("%s: unsupported types (A %d, B %d, C %d, compute %d) or algo %d", fn, (int)Atype, (int)Btype, (int)Ctype, (int)computeType, (int)algo);
    unlock();
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (m == 0 || n == 0 || batchCount == 0) { unlock(); return CUBLAS_STATUS_SUCCESS; }
  if (!ptr_arrays && batchCount > 1 &&
      (llabs(strideA) > (1LL << 40) || llabs(strideB) > (1LL << 40) || llabs(strideC) > (1LL << 40))) {
    note("%s: absurd batch stride", fn);
    unlock();
    return CUBLAS_STATUS_INVALID_VALUE;
  }

  memset(&g, 0, sizeof g);
  g.ta = transa; g.tb = transb; g.m = m; g.n = n; g.k = k;
  g.at = Atype; g.ct = Ctype;
  g.lda = lda; g.ldb = ldb; g.ldc = ldc;
  g.sa = strideA; g.sb = strideB; g.sc = strideC;
  g.batch = batchCount;
  g.ptr_arrays = ptr_arrays;
  g.A = A; g.B = B; g.C = C;
  g.dev_scalars = c->pmode == CUBLAS_POINTER_MODE_DEVICE;
  if (!gemm_scalar(fn, "alpha", c, alpha, &g.alpha) || !gemm_scalar(fn, "beta", c, beta, &g.beta)) { unlock(); return CUBLAS_STATUS_INVALID_VALUE; }
  g.dalpha = (const float *)alpha;
  g.dbeta = (const float *)beta;
  g.tf32 = Atype == CUDA_R_32F &&
           (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 ||
            (computeType == CUBLAS_COMPUTE_32F && ((unsigned)c->math & 0xfu) == CUBLAS_TF32_TENSOR_OP_MATH));

  if (ptr_arrays) {
    /* The arrays are device memory; their contents are read (and checked) at execution. */
    size_t bytes = (size_t)batchCount * sizeof(void *);
    if ((k > 0 && ((uintptr_t)A % sizeof(void *) || !dev_range(A, bytes, 0))) ||
        (k > 0 && ((uintptr_t)B % sizeof(void *) || !dev_range(B, bytes, 0))) ||
        (uintptr_t)C % sizeof(void *) || !dev_range(C, bytes, 0)) {
      note("%s: Aarray/Barray/Carray must each be %d pointers in device memory", fn, batchCount);
      unlock();
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  } else {
    for (b = 0; b < batchCount; b++) {
      const char *why;
      const void *pa = batch_entry(A, b, strideA, elem_size(Atype));
      const void *pb = batch_entry(B, b, strideB, elem_size(Atype));
      const void *pc = batch_entry(C, b, strideC, elem_size(Ctype));
      why = gemm_check_entry(&g, pa, pb, pc, 0);
      if (why) {
        note("%s: batch entry %d: %s", fn, b, why);
        unlock();
        return CUBLAS_STATUS_INVALID_VALUE;
      }
    }
  }
  s = stream_of(c->stream);
  if (!s) { note("%s: the handle's stream was destroyed", fn); unlock(); return CUBLAS_STATUS_EXECUTION_FAILED; }
  o = op_new(OP_GEMM);
  if (!o) { unlock(); return CUBLAS_STATUS_ALLOC_FAILED; }
  o->u.gemm = g;
  op_push(s, o);
  unlock();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return gemm_common(K_cublasGemmEx, handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0,
                     beta, C, Ctype, ldc, 0, 1, computeType, algo, 0);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void *beta, void *C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return gemm_common(K_cublasGemmStridedBatchedEx, handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B,
                     Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo, 0);
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                   int n, int k, const void *alpha, const void *const Aarray[], cudaDataType Atype,
                                   int lda, const void *const Barray[], cudaDataType Btype, int ldb, const void *beta,
                                   void *const Carray[], cudaDataType Ctype, int ldc, int batchCount,
                                   cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return gemm_common(K_cublasGemmBatchedEx, handle, transa, transb, m, n, k, alpha, (const void *)Aarray, Atype, lda,
                     0, (const void *)Barray, Btype, ldb, 0, beta, (void *)Carray, Ctype, ldc, 0, batchCount,
                     computeType, algo, 1);
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                              const float *beta, float *C, int ldc) {
  return gemm_common(K_cublasSgemm_v2, handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, 0, B, CUDA_R_32F,
                     ldb, 0, beta, C, CUDA_R_32F, ldc, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT, 0);
}

/* =============================================================================================
   cuBLAS: nrm2
   ============================================================================================= */
/* Pointer mode HOST: runs the handle's stream, then computes; *result is written before the
   return. Pointer mode DEVICE: queued; result is a device pointer written at execution. */
cublasStatus_t cublasSnrm2_v2(cublasHandle_t handle, int n, const float *x, int incx, float *result) {
  struct cublasContext *c;
  struct CUstream_st *s;
  int empty = n <= 0 || incx <= 0;
  enter(K_cublasSnrm2_v2);
  c = handle_of(handle);
  if (!c) { unlock(); return CUBLAS_STATUS_NOT_INITIALIZED; }
  if (inject(K_cublasSnrm2_v2)) { unlock(); return CUBLAS_STATUS_EXECUTION_FAILED; }
  if (!result) { note("cublasSnrm2: result is NULL"); unlock(); return CUBLAS_STATUS_INVALID_VALUE; }
  if (!empty) {
    size_t bytes = ((size_t)(n - 1) * (size_t)incx + 1) * sizeof(float); /* < 2^64: n, incx < 2^31 */
    if (!x || (uintptr_t)x % 4 || !dev_range(x, bytes, 0)) {
      note("cublasSnrm2: x (%d floats at stride %d from %p) is not inside one live device allocation", n, incx, (const void *)x);
      unlock();
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  s = stream_of(c->stream);
  if (!s) { note("cublasSnrm2: the handle's stream was destroyed"); unlock(); return CUBLAS_STATUS_EXECUTION_FAILED; }
  if (c->pmode == CUBLAS_POINTER_MODE_DEVICE) {
    op *o;
    if ((uintptr_t)result % 4 || !dev_range(result, sizeof(float), 0)) { note("cublasSnrm2: pointer mode DEVICE but result %p is not device memory", (void *)result); unlock(); return CUBLAS_STATUS_INVALID_VALUE; }
    o = op_new(OP_NRM2);
    if (!o) { unlock(); return CUBLAS_STATUS_ALLOC_FAILED; }
    o->u.nrm2.x = x;
    o->u.nrm2.n = empty ? 0 : n;
    o->u.nrm2.incx = incx;
    o->u.nrm2.result = result;
    op_push(s, o);
    unlock();
    return CUBLAS_STATUS_SUCCESS;
  }
  if (touches_arena(result, sizeof(float))) { note("cublasSnrm2: pointer mode HOST but result %p is device memory", (void *)result); unlock(); return CUBLAS_STATUS_INVALID_VALUE; }
  {
    double t0 = 0;
    for (;;) {
      flush_begin();
      if (!run_stream(s, ULLONG_MAX) || g_sticky != cudaSuccess) break;
      flush_end();
      wait_blocked(&t0, "cublasSnrm2");
    }
  }
  if (g_sticky == cudaSuccess) {
    float r = 0.0f;
    if (!empty) {
      arena_open();
      if (g_open) r = nrm2(x, n, incx);
    }
    if (g_sticky == cudaSuccess) *result = r;
  }
  flush_end();
  {
    cublasStatus_t st = g_sticky == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
    unlock();
    return st;
  }
}

/* =============================================================================================
   Test hooks
   ============================================================================================= */
void muon_standin_fail(const char *call, int nth) {
  lock();
  init_locked();
  arm_failure(call, nth);
  unlock();
}

long long muon_standin_calls(const char *call) {
  long long n;
  int id;
  lock();
  init_locked();
  id = call_id(call);
  n = id >= 0 ? g_calls[id] : -1;
  unlock();
  return n;
}

size_t muon_standin_device_bytes(void) {
  size_t n;
  lock();
  init_locked();
  n = g_live_bytes;
  unlock();
  return n;
}

void muon_standin_ahead(int on) {
  lock();
  init_locked();
  g_ahead = on != 0;
  unlock();
}

void muon_standin_pinned_private(int on) {
  lock();
  init_locked();
  g_pin_private = on != 0;
  unlock();
}

void muon_standin_reset_errors(void) {
  lock();
  init_locked();
  g_sticky = cudaSuccess;
  g_last_error = cudaSuccess;
  g_msg[0] = '\0';
  unlock();
}

int muon_standin_tf32_used(void) {
  int v;
  lock();
  v = g_tf32_used;
  unlock();
  return v;
}

const char *muon_standin_last_message(void) {
  const char *m;
  lock();
  m = g_msg;
  unlock();
  return m;
}

/* =============================================================================================
   Hooks for other stand-ins
   ============================================================================================= */
cudaError_t muon_standin_enqueue(cudaStream_t stream, muon_standin_progress progress, void (*release)(void *),
                                 void *arg, const char *what) {
  struct CUstream_st *s;
  op *o;
  lock();
  init_locked();
  s = stream_of(stream);
  if (!s || !progress) {
    note("muon_standin_enqueue(%s): unknown or destroyed stream %p", what ? what : "?", (void *)stream);
    unlock();
    return rt_err(s ? cudaErrorInvalidValue : cudaErrorInvalidResourceHandle);
  }
  o = op_new(OP_EXTERN);
  if (!o) { unlock(); return rt_err(cudaErrorMemoryAllocation); }
  o->u.ext.progress = progress;
  o->u.ext.release = release;
  o->u.ext.arg = arg;
  snprintf(o->u.ext.what, sizeof o->u.ext.what, "%s", what ? what : "external operation");
  op_push(s, o);
  unlock();
  return cudaSuccess;
}

int muon_standin_is_device(const void *p, size_t bytes) {
  int r;
  lock();
  init_locked();
  r = bytes ? dev_range(p, bytes, 0) != NULL : dev_block(p) != NULL;
  unlock();
  return r;
}
