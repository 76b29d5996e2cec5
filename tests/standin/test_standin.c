/* test_standin.c - proves the CPU stand-in for cudart/cuBLAS (cuda_standin.c) behaves as
   documented, and above all that its strictness bites: host access to device memory crashes,
   missing synchronisation reads stale data, bad arguments return the documented codes, and
   injected faults surface where a GPU's would.

   Build (from the repository root; add -O1 -g -fsanitize=address,undefined for the sanitizer run):
     gcc -std=c99 -Wall -Wextra -Wpedantic -Werror -D_GNU_SOURCE -isystem /usr/local/cuda/include \
         -Itests tests/standin/test_standin.c tests/standin/cuda_standin.c -o build/test_standin -lm */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <cublas_v2.h>

#include "standin.h"
#include "test.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(TEST_ASAN)
#define TEST_ASAN 1
#endif

#define CU(call) do { cudaError_t e_ = (call); CHECK(e_ == cudaSuccess, "%s -> %s (%s)", #call, cudaGetErrorName(e_), muon_standin_last_message()); } while (0)
#define CB(call) do { cublasStatus_t s_ = (call); CHECK(s_ == CUBLAS_STATUS_SUCCESS, "%s -> %s (%s)", #call, cublasGetStatusName(s_), muon_standin_last_message()); } while (0)

/* ---- small helpers ------------------------------------------------------------------------- */
static unsigned long long rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
  rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bf2f(uint16_t h) { return u2f((uint32_t)h << 16); }
static uint16_t f2bf(float f) { /* round to nearest even, test's own copy */
  uint32_t u = f2u(f);
  if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  CU(cudaMalloc(&p, bytes));
  return p;
}

static void *dev_upload(const void *h, size_t bytes) {
  void *p = dev_alloc(bytes);
  CU(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
  return p;
}

static void fill_f(float *p, size_t n, float v) { size_t i; for (i = 0; i < n; i++) p[i] = v; }
static int all_f(const float *p, size_t n, float v) { size_t i; for (i = 0; i < n; i++) if (p[i] != v) return 0; return 1; }

/* Runs fn in a child; returns its wait status. */
static int in_child(void (*fn)(void)) {
  int st = 0;
  pid_t pid;
  fflush(stdout);
  pid = fork();
  if (pid == 0) { fn(); _exit(0); }
  if (pid < 0) return -1;
  waitpid(pid, &st, 0);
  return st;
}

/* A child that must die of SIGSEGV; under ASan its SEGV handler must not turn that into exit(1). */
static void default_segv(void) { signal(SIGSEGV, SIG_DFL); }

/* ---- kernels (host functions in stand-in mode) --------------------------------------------- */
typedef struct fill_args { float *dst; float base; int n; } fill_args;
static void k_fill(const void *a) {
  const fill_args *p = (const fill_args *)a;
  int i = (int)(muon_standin_blockIdx.x * muon_standin_blockDim.x + muon_standin_threadIdx.x);
  if (i < p->n) p->dst[i] = p->base + (float)i;
}

typedef struct order_args { int *log; } order_args;
static void k_order(const void *a) {
  const order_args *p = (const order_args *)a;
  /* log[0] is the count; each call appends its (block, thread) coordinates. */
  int c = p->log[0]++;
  int *e = p->log + 1 + 6 * c;
  e[0] = (int)muon_standin_blockIdx.x; e[1] = (int)muon_standin_blockIdx.y; e[2] = (int)muon_standin_blockIdx.z;
  e[3] = (int)muon_standin_threadIdx.x; e[4] = (int)muon_standin_threadIdx.y; e[5] = (int)muon_standin_threadIdx.z;
}

typedef struct over_args { float *dst; int n; } over_args;
static void k_overrun(const void *a) { /* writes one element past n: a bug */
  const over_args *p = (const over_args *)a;
  if (muon_standin_threadIdx.x == 0) p->dst[p->n] = 1.0f;
}

static cudaError_t launch_fill(cudaStream_t s, float *dst, float base, int n) {
  fill_args a;
  dim3 g, b;
  a.dst = dst; a.base = base; a.n = n;
  g.x = (unsigned)((n + 63) / 64); g.y = 1; g.z = 1;
  b.x = 64; b.y = 1; b.z = 1;
  return muon_standin_launch(s, g, b, k_fill, &a, sizeof a);
}

/* =============================================================================================
   Tests that need a fresh (not yet initialised) stand-in: they fork before the parent uses it.
   ============================================================================================= */
static void child_small_arena(void) {
  void *a = NULL, *b = NULL, *c = NULL;
  size_t fr = 0, tot = 0;
  int bad = 0;
  setenv("MUON_STANDIN_ARENA_MB", "1", 1);
  if (cudaMalloc(&a, 2u << 20) != cudaErrorMemoryAllocation) bad |= 1;        /* beyond the arena */
  if (cudaGetLastError() != cudaErrorMemoryAllocation) bad |= 2;
  if (cudaMalloc(&a, 600 << 10) != cudaSuccess) bad |= 4;
  if (cudaMalloc(&b, 600 << 10) != cudaErrorMemoryAllocation) bad |= 8;       /* 1.2 MB > 1 MB */
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess || tot != (1u << 20) || fr >= tot - (600u << 10)) bad |= 16;
  if (cudaFree(a) != cudaSuccess) bad |= 32;
  if (cudaMalloc(&b, 600 << 10) != cudaSuccess || b != a) bad |= 64;          /* freed space reused */
  if (cudaMalloc(&c, 300 << 10) != cudaSuccess) bad |= 128;
  _exit(bad);
}

static void child_env_fail(void) {
  void *a = NULL, *b = NULL;
  int bad = 0;
  setenv("MUON_STANDIN_FAIL", "cudaMalloc:2,kernel:1", 1);
  if (cudaMalloc(&a, 64) != cudaSuccess) bad |= 1;
  if (cudaMalloc(&b, 64) != cudaErrorMemoryAllocation) bad |= 2;
  if (cudaMalloc(&b, 64) != cudaSuccess) bad |= 4;
  if (launch_fill(0, (float *)a, 0, 16) != cudaSuccess) bad |= 8;
  if (cudaDeviceSynchronize() != cudaErrorLaunchFailure) bad |= 16;
  _exit(bad);
}

static void test_fresh_process(void) {
  int st;
  TEST_CASE("cudaMalloc beyond a small MUON_STANDIN_ARENA_MB arena fails; freed space is reused");
  st = in_child(child_small_arena);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status 0x%x (exit %d)", st, WIFEXITED(st) ? WEXITSTATUS(st) : -1);

  TEST_CASE("MUON_STANDIN_FAIL=name:nth injects in a new process");
  st = in_child(child_env_fail);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status 0x%x (exit %d)", st, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* =============================================================================================
   1. Host access to device memory crashes
   ============================================================================================= */
static float *g_dev;
static void child_read(void) { volatile float *p = g_dev; float v; default_segv(); v = p[3]; (void)v; _exit(0); }
static void child_write(void) { volatile float *p = g_dev; default_segv(); p[3] = 1.0f; _exit(0); }
static void child_read_after_sync(void) {
  volatile float *p = g_dev;
  default_segv();
  cudaMemset(g_dev, 0, 64);            /* opens and closes the arena */
  cudaDeviceSynchronize();
  (void)p[0];
  _exit(0);
}

static void test_segv(void) {
  int st;
  TEST_CASE("host read / write of a cudaMalloc pointer outside a stand-in call is SIGSEGV");
  g_dev = (float *)dev_alloc(1024);
  st = in_child(child_read);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "read: child status 0x%x", st);
  st = in_child(child_write);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "write: child status 0x%x", st);
  st = in_child(child_read_after_sync);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "read after a sync: child status 0x%x", st);
  CU(cudaFree(g_dev));
}

/* =============================================================================================
   Memory
   ============================================================================================= */
static void test_memory(void) {
  void *a = NULL, *b = NULL, *z = (void *)1;
  float h[8];
  char *pin = NULL, *pin2 = NULL;
  int on_stack = 0;
  struct cudaPointerAttributes at;
  size_t base = muon_standin_device_bytes();

  TEST_CASE("cudaMalloc: 256-byte aligned, counted, not cleared (NaN fill), 0 bytes gives NULL");
  CU(cudaMalloc(&a, 100));
  CU(cudaMalloc(&b, 1000));
  CHECK(a && b && (uintptr_t)a % 256 == 0 && (uintptr_t)b % 256 == 0, "alignment %p %p", a, b);
  CHECK(muon_standin_device_bytes() == base + 1100, "device bytes %zu", muon_standin_device_bytes());
  CU(cudaMemcpy(h, b, sizeof h, cudaMemcpyDeviceToHost));
  CHECK(isnan(h[0]) && isnan(h[7]), "fresh device memory reads %g %g, expected NaN", h[0], h[7]);
  CU(cudaMalloc(&z, 0));
  CHECK(z == NULL, "cudaMalloc(0) gave %p", z);
  CHECK(cudaMalloc(NULL, 16) == cudaErrorInvalidValue, "cudaMalloc(NULL, 16)");
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidValue, "cudaPeekAtLastError");
  CHECK(cudaGetLastError() == cudaErrorInvalidValue, "last error after cudaMalloc(NULL)");
  CHECK(cudaGetLastError() == cudaSuccess, "last error is reset once read");
  CHECK(cudaMalloc(&z, (size_t)-1) == cudaErrorMemoryAllocation, "cudaMalloc(SIZE_MAX)");
  cudaGetLastError();

  TEST_CASE("cudaFree: NULL ok; interior pointer, double free, host pointer -> cudaErrorInvalidValue");
  CU(cudaFree(NULL));
  CHECK(cudaFree((char *)b + 4) == cudaErrorInvalidValue, "interior free");
  CU(cudaFree(b));
  CHECK(cudaFree(b) == cudaErrorInvalidValue, "double free");
  CHECK(cudaFree(h) == cudaErrorInvalidValue, "host pointer");
  cudaGetLastError();
  CHECK(muon_standin_device_bytes() == base + 100, "device bytes %zu", muon_standin_device_bytes());

  TEST_CASE("cudaPointerGetAttributes: device (interior too), pinned host, unregistered");
  CU(cudaMallocHost((void **)&pin, 100));
  CU(cudaHostAlloc((void **)&pin2, 64, cudaHostAllocMapped));
  CU(cudaPointerGetAttributes(&at, (char *)a + 50));
  CHECK(at.type == cudaMemoryTypeDevice && at.device == 0, "device interior type %d", (int)at.type);
  CU(cudaPointerGetAttributes(&at, pin + 99));
  CHECK(at.type == cudaMemoryTypeHost && at.hostPointer == pin + 99, "pinned type %d", (int)at.type);
  CU(cudaPointerGetAttributes(&at, pin2));
  CHECK(at.type == cudaMemoryTypeHost, "cudaHostAlloc type %d", (int)at.type);
  CU(cudaPointerGetAttributes(&at, &on_stack));
  CHECK(at.type == cudaMemoryTypeUnregistered, "stack type %d", (int)at.type);
  CU(cudaPointerGetAttributes(&at, (char *)a + 100));
  CHECK(at.type == cudaMemoryTypeUnregistered, "one past the end of an allocation: type %d", (int)at.type);
  CU(cudaPointerGetAttributes(&at, b));
  CHECK(at.type == cudaMemoryTypeUnregistered, "freed device block: type %d", (int)at.type);
  CHECK(cudaPointerGetAttributes(NULL, a) == cudaErrorInvalidValue, "NULL attributes");
  CHECK(cudaHostAlloc((void **)&z, 64, 0x80) == cudaErrorInvalidValue, "bad cudaHostAlloc flags");
  CHECK(cudaFreeHost(pin + 1) == cudaErrorInvalidValue, "cudaFreeHost of an interior pointer");
  CHECK(cudaFreeHost(h) == cudaErrorInvalidValue, "cudaFreeHost of a non-pinned pointer");
  cudaGetLastError();
  CU(cudaFreeHost(pin));
  CU(cudaFreeHost(pin2));
  CU(cudaPointerGetAttributes(&at, pin2));
  CHECK(at.type == cudaMemoryTypeUnregistered, "freed pinned block: type %d", (int)at.type);
  CU(cudaFree(a));
  CHECK(muon_standin_device_bytes() == base, "device bytes %zu", muon_standin_device_bytes());

  TEST_CASE("devices");
  {
    int n = -1, d = -1;
    CU(cudaGetDeviceCount(&n));
    CU(cudaGetDevice(&d));
    CHECK(n == 1 && d == 0, "count %d device %d", n, d);
    CU(cudaSetDevice(0));
    CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice, "cudaSetDevice(1)");
    cudaGetLastError();
  }
}

/* =============================================================================================
   Copies: validation and 2. stale data without a sync
   ============================================================================================= */
static void test_copies(void) {
  float src[16], out[16], out2[16];
  float *d = (float *)dev_alloc(16 * sizeof(float));
  float *d2 = (float *)dev_alloc(16 * sizeof(float));
  cudaStream_t s;
  long long fl, mp;
  int i;
  CU(cudaStreamCreate(&s));

  TEST_CASE("cudaMemcpyAsync H2D + D2H without a sync leaves the host buffer stale");
  fill_f(src, 16, 2.0f);
  fill_f(out, 16, 7.0f);
  CU(cudaMemcpyAsync(d, src, sizeof src, cudaMemcpyHostToDevice, s));
  CU(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, s));
  CHECK(all_f(out, 16, 7.0f), "host buffer changed before any sync: %g", out[0]);
  CHECK(cudaStreamQuery(s) == cudaErrorNotReady, "cudaStreamQuery with queued work");
  CHECK(all_f(out, 16, 7.0f), "cudaStreamQuery ran the queue");
  CHECK(cudaGetLastError() == cudaSuccess, "cudaErrorNotReady is not an error for cudaGetLastError");
  CU(cudaStreamSynchronize(s));
  CHECK(all_f(out, 16, 2.0f), "after sync: %g", out[0]);
  CHECK(cudaStreamQuery(s) == cudaSuccess, "cudaStreamQuery once drained");

  TEST_CASE("cudaMemcpyAsync reads the host source when the stream runs, not at the call");
  fill_f(src, 16, 3.0f);
  CU(cudaMemcpyAsync(d, src, sizeof src, cudaMemcpyHostToDevice, s));
  fill_f(src, 16, 4.0f);                       /* the caller broke the rule: it is what gets copied */
  CU(cudaStreamSynchronize(s));
  CU(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
  CHECK(all_f(out, 16, 4.0f), "device holds %g", out[0]);

  TEST_CASE("another stream's sync does not run this stream; cudaDeviceSynchronize does");
  {
    cudaStream_t t;
    CU(cudaStreamCreate(&t));
    fill_f(out, 16, 0.0f);
    CU(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, s));
    CU(cudaStreamSynchronize(t));
    CU(cudaStreamSynchronize(0));
    CHECK(all_f(out, 16, 0.0f), "stream s ran on another stream's sync");
    CU(cudaDeviceSynchronize());
    CHECK(all_f(out, 16, 4.0f), "after cudaDeviceSynchronize: %g", out[0]);
    CU(cudaStreamDestroy(t));
  }

  TEST_CASE("the NULL stream is a queue of its own");
  fill_f(out, 16, 0.0f);
  CU(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, 0));
  CU(cudaStreamSynchronize(s));
  CHECK(all_f(out, 16, 0.0f), "NULL stream ran on stream s's sync");
  CU(cudaStreamSynchronize(0));
  CHECK(all_f(out, 16, 4.0f), "NULL stream after its sync: %g", out[0]);

  TEST_CASE("synchronous cudaMemcpy runs every queue first");
  fill_f(src, 16, 5.0f);
  CU(cudaMemcpyAsync(d, src, sizeof src, cudaMemcpyHostToDevice, s));
  CU(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
  CHECK(all_f(out, 16, 5.0f), "cudaMemcpy saw %g", out[0]);

  TEST_CASE("memset: async queued, sync immediate; cudaMemcpyDefault infers directions");
  CU(cudaMemsetAsync(d, 0, sizeof src, s));
  CU(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDefault, s));
  fill_f(out2, 16, 9.0f);
  CU(cudaMemcpyAsync(d2, out2, sizeof out2, cudaMemcpyDefault, s));
  CU(cudaStreamSynchronize(s));
  CHECK(all_f(out, 16, 0.0f), "memset async: %g", out[0]);
  CU(cudaMemset(d2, 0, 8 * sizeof(float)));
  CU(cudaMemcpy(out, d2, sizeof out, cudaMemcpyDefault));
  CHECK(all_f(out, 8, 0.0f) && all_f(out + 8, 8, 9.0f), "memset sync: %g %g", out[0], out[8]);

  TEST_CASE("host-to-host copies: async ones are queued too");
  fill_f(out, 16, 1.0f);
  fill_f(out2, 16, 0.0f);
  CU(cudaMemcpyAsync(out2, out, sizeof out, cudaMemcpyHostToHost, s));
  CHECK(all_f(out2, 16, 0.0f), "async H2H ran at the call");
  CU(cudaStreamSynchronize(s));
  CHECK(all_f(out2, 16, 1.0f), "async H2H after sync");
  fill_f(out, 16, 2.0f);
  CU(cudaMemcpy(out2, out, sizeof out, cudaMemcpyHostToHost));
  CHECK(all_f(out2, 16, 2.0f), "sync H2H");
  CHECK(cudaMemcpy(out2, d, 16, cudaMemcpyHostToHost) == cudaErrorInvalidValue, "H2H from device memory");
  cudaGetLastError();

  TEST_CASE("one mprotect pair per flush, however many ops");
  fl = muon_standin_calls("flush");
  mp = muon_standin_calls("mprotect");
  for (i = 0; i < 20; i++) CU(cudaMemcpyAsync(d2, d, 16, cudaMemcpyDeviceToDevice, s));
  CU(launch_fill(s, d, 0, 16));
  CU(cudaStreamSynchronize(s));
  CHECK(muon_standin_calls("flush") == fl + 1, "flushes %lld", muon_standin_calls("flush") - fl);
  CHECK(muon_standin_calls("mprotect") == mp + 2, "mprotects %lld", muon_standin_calls("mprotect") - mp);
  CU(cudaStreamSynchronize(s));               /* nothing queued: no flush, no mprotect */
  CHECK(muon_standin_calls("mprotect") == mp + 2, "an empty sync changed protections");
  CHECK(muon_standin_calls("nonsense") == -1, "unknown counter name");

  TEST_CASE("copy validation: direction, ranges past allocations, host pointers in the arena");
  CHECK(cudaMemcpyAsync(d, src, 17 * sizeof(float), cudaMemcpyHostToDevice, s) == cudaErrorInvalidValue, "H2D past the end");
  CHECK(cudaMemcpyAsync(out, d + 1, 16 * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaErrorInvalidValue, "D2H interior past the end");
  CHECK(cudaMemcpyAsync(out, src, 16, cudaMemcpyHostToDevice, s) == cudaErrorInvalidValue, "H2D into host memory");
  CHECK(cudaMemcpyAsync(d, d2, 16, cudaMemcpyHostToDevice, s) == cudaErrorInvalidValue, "H2D from device memory");
  CHECK(cudaMemcpyAsync(d, out, 16, cudaMemcpyDeviceToHost, s) == cudaErrorInvalidValue, "D2H into device memory");
  CHECK(cudaMemcpyAsync(d, d + 2, 16, cudaMemcpyDeviceToDevice, s) == cudaErrorInvalidValue, "overlapping D2D");
  CHECK(cudaMemcpyAsync(d, src, 16, (enum cudaMemcpyKind)9, s) == cudaErrorInvalidMemcpyDirection, "bad kind");
  CHECK(cudaMemcpy(NULL, d, 16, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue, "NULL host");
  CHECK(cudaMemsetAsync(d + 15, 0, 8, s) == cudaErrorInvalidValue, "memset past the end");
  CHECK(cudaMemset(src, 0, 8) == cudaErrorInvalidValue, "memset of host memory");
  CHECK(cudaMemcpyAsync(d, src, 16, cudaMemcpyHostToDevice, (cudaStream_t)out) == cudaErrorInvalidResourceHandle, "bogus stream");
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle, "last error is the latest one");
  CHECK(cudaStreamQuery(s) == cudaSuccess, "rejected copies were not queued");
  CU(cudaMemcpyAsync(d, src, 0, cudaMemcpyHostToDevice, s));

  TEST_CASE("cudaFree while work is queued: no sync, the block is not reused before the work ran");
  {
    float *t = (float *)dev_alloc(16 * sizeof(float)), *u;
    CU(cudaMemcpy(t, src, sizeof src, cudaMemcpyHostToDevice));
    fill_f(out, 16, 0.0f);
    CU(cudaMemcpyAsync(out, t, sizeof out, cudaMemcpyDeviceToHost, s));
    CU(cudaFree(t));
    CHECK(all_f(out, 16, 0.0f), "cudaFree synchronised");
    CHECK(cudaMemcpyAsync(out, t, 4, cudaMemcpyDeviceToHost, s) == cudaErrorInvalidValue, "a freed block is not usable");
    cudaGetLastError();
    u = (float *)dev_alloc(16 * sizeof(float));
    CHECK(u != t, "the freed block was handed out while work still used it");
    CU(cudaMemset(u, 0, sizeof src));
    CU(cudaStreamSynchronize(s));
    CHECK(all_f(out, 16, 5.0f), "queued copy from the freed block read %g", out[0]);
    CU(cudaFree(u));
  }

  TEST_CASE("cudaFreeHost while a copy from it is queued: the copy still reads it");
  {
    float *pin = NULL;
    CU(cudaMallocHost((void **)&pin, sizeof src));
    fill_f(pin, 16, 6.0f);
    CU(cudaMemcpyAsync(d, pin, sizeof src, cudaMemcpyHostToDevice, s));
    CU(cudaFreeHost(pin));
    CU(cudaStreamSynchronize(s));
    CU(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
    CHECK(all_f(out, 16, 6.0f), "copy from freed pinned buffer: %g", out[0]);
  }

  TEST_CASE("cudaStreamDestroy with queued work: it still runs at cudaDeviceSynchronize");
  {
    cudaStream_t t;
    CU(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
    fill_f(out, 16, 0.0f);
    CU(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, t));
    CU(cudaStreamDestroy(t));
    CHECK(cudaStreamSynchronize(t) == cudaErrorInvalidResourceHandle, "destroyed stream is not usable");
    CHECK(cudaStreamDestroy(0) == cudaErrorInvalidResourceHandle, "the NULL stream cannot be destroyed");
    CHECK(cudaStreamCreateWithFlags(&t, 0x10) == cudaErrorInvalidValue, "bad stream flags");
    cudaGetLastError();
    CHECK(all_f(out, 16, 0.0f), "ran early");
    CU(cudaDeviceSynchronize());
    CHECK(all_f(out, 16, 6.0f), "destroyed stream's work: %g", out[0]);
  }

  CU(cudaStreamDestroy(s));
  CU(cudaFree(d));
  CU(cudaFree(d2));
}

/* =============================================================================================
   3. Kernels
   ============================================================================================= */
static void child_overrun(void) {
  float *d = NULL;
  over_args a;
  dim3 g = {1, 1, 1}, b = {1, 1, 1};
#ifdef TEST_ASAN
  if (!freopen("/dev/null", "w", stderr)) _exit(4); /* the expected ASan report */
#endif
  cudaMalloc((void **)&d, 10 * sizeof(float));
  a.dst = d; a.n = 10;
  muon_standin_launch(0, g, b, k_overrun, &a, sizeof a);
  _exit(cudaDeviceSynchronize() == cudaErrorIllegalAddress ? 0 : 3);
}

static void test_kernels(void) {
  float *d = (float *)dev_alloc(100 * sizeof(float));
  float out[100];
  cudaStream_t s;
  dim3 g = {1, 1, 1}, b = {1, 1, 1};
  fill_args fa;
  int i, ok;
  CU(cudaStreamCreate(&s));

  TEST_CASE("a kernel's writes are not visible before the sync, visible after");
  CU(cudaMemset(d, 0, sizeof out));
  CU(launch_fill(s, d, 10.0f, 100));
  fill_f(out, 100, -1.0f);
  CU(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, s));
  CHECK(all_f(out, 100, -1.0f), "D2H before sync changed the host buffer");
  CU(cudaStreamSynchronize(s));
  for (ok = 1, i = 0; i < 100; i++) ok &= out[i] == 10.0f + (float)i;
  CHECK(ok, "kernel result wrong: out[0] %g out[99] %g", out[0], out[99]);
  CU(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
  CHECK(out[99] == 109.0f, "sync copy %g", out[99]);

  TEST_CASE("launch copies its args at the call");
  fa.dst = d; fa.base = 1.0f; fa.n = 100;
  g.x = 2; b.x = 64;
  CU(muon_standin_launch(s, g, b, k_fill, &fa, sizeof fa));
  fa.base = 500.0f;
  CU(cudaStreamSynchronize(s));
  CU(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
  CHECK(out[0] == 1.0f && out[99] == 100.0f, "args not copied at launch: %g", out[0]);

  TEST_CASE("index order: blocks then threads, x fastest; gridDim/blockDim set");
  {
    int *log = (int *)dev_alloc((1 + 6 * 24) * sizeof(int));
    int h[1 + 6 * 24];
    order_args oa;
    int c = 0, bz, by, bx, tz, ty, tx, good = 1;
    dim3 og = {2, 2, 1}, ob = {3, 1, 2};
    CU(cudaMemset(log, 0, sizeof h));
    oa.log = log;
    CU(muon_standin_launch(s, og, ob, k_order, &oa, sizeof oa));
    CU(cudaStreamSynchronize(s));
    CU(cudaMemcpy(h, log, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(h[0] == 24, "%d calls, expected 24", h[0]);
    for (bz = 0; bz < 1; bz++) for (by = 0; by < 2; by++) for (bx = 0; bx < 2; bx++)
      for (tz = 0; tz < 2; tz++) for (ty = 0; ty < 1; ty++) for (tx = 0; tx < 3; tx++, c++) {
        const int *e = h + 1 + 6 * c;
        good &= e[0] == bx && e[1] == by && e[2] == bz && e[3] == tx && e[4] == ty && e[5] == tz;
      }
    CHECK(good, "calls out of order");
    CHECK(muon_standin_gridDim.x == 2 && muon_standin_gridDim.y == 2 && muon_standin_blockDim.x == 3 && muon_standin_blockDim.z == 2,
          "gridDim/blockDim not set");
    CU(cudaFree(log));
  }

  TEST_CASE("launch validation: shape, function, args, stream");
  {
    dim3 one = {1, 1, 1}, big = {1025, 1, 1}, prod = {32, 32, 2}, zero = {0, 1, 1}, gy = {1, 65536, 1}, gz = {1, 1, 65536};
    dim3 gx = {2147483647u, 1, 1}, bz = {1, 1, 65};
    long long k0 = muon_standin_calls("kernel");
    CHECK(muon_standin_launch(s, one, big, k_fill, &fa, sizeof fa) == cudaErrorInvalidConfiguration, "block.x 1025");
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "last error after a bad launch");
    CHECK(cudaGetLastError() == cudaSuccess, "reset");
    CHECK(muon_standin_launch(s, one, prod, k_fill, &fa, sizeof fa) == cudaErrorInvalidConfiguration, "block 2048 threads");
    CHECK(muon_standin_launch(s, zero, one, k_fill, &fa, sizeof fa) == cudaErrorInvalidConfiguration, "grid.x 0");
    CHECK(muon_standin_launch(s, one, zero, k_fill, &fa, sizeof fa) == cudaErrorInvalidConfiguration, "block.x 0");
    CHECK(muon_standin_launch(s, gy, one, k_fill, &fa, sizeof fa) == cudaErrorInvalidConfiguration, "grid.y 65536");
    CHECK(muon_standin_launch(s, gz, one, k_fill, &fa, sizeof fa) == cudaErrorInvalidConfiguration, "grid.z 65536");
    CHECK(muon_standin_launch(s, one, bz, k_fill, &fa, sizeof fa) == cudaErrorInvalidConfiguration, "block.z 65");
    CHECK(muon_standin_launch(s, one, one, NULL, &fa, sizeof fa) == cudaErrorInvalidDeviceFunction, "NULL kernel");
    CHECK(muon_standin_launch(s, one, one, k_fill, &fa, MUON_STANDIN_MAX_ARGS + 1) == cudaErrorInvalidValue, "args too big");
    CHECK(muon_standin_launch(s, one, one, k_fill, NULL, 8) == cudaErrorInvalidValue, "NULL args");
    CHECK(muon_standin_launch((cudaStream_t)out, one, one, k_fill, &fa, sizeof fa) == cudaErrorInvalidResourceHandle, "bogus stream");
    CHECK(muon_standin_calls("kernel") == k0 + 11, "kernel counter %lld", muon_standin_calls("kernel") - k0);
    CHECK(cudaStreamQuery(s) == cudaSuccess, "a rejected launch was queued");
    (void)gx; /* grid.x 2^31-1 is legal but far too long to run here */
    cudaGetLastError();
  }

  TEST_CASE("a kernel writing past its allocation is caught at the sync");
  {
    int st = in_child(child_overrun);
#ifdef TEST_ASAN
    /* AddressSanitizer reports the write itself and ends the child. */
    CHECK(!(WIFEXITED(st) && WEXITSTATUS(st) == 0), "overrun went unnoticed (status 0x%x)", st);
#else
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "overrun not reported as cudaErrorIllegalAddress (status 0x%x)", st);
#endif
  }

  CU(cudaStreamDestroy(s));
  CU(cudaFree(d));
}

/* =============================================================================================
   6. Events
   ============================================================================================= */
/* An external operation that completes once *gate is set (another process's part, in NCCL). */
static int gate_open;
static int gate_progress(void *arg) { return *(int *)arg != 0; }

static void test_events(void) {
  float src[32], out[32];
  float *d = (float *)dev_alloc(sizeof src);
  cudaStream_t a, b;
  cudaEvent_t e, e2;
  float ms = -1;
  CU(cudaStreamCreate(&a));
  CU(cudaStreamCreate(&b));
  CU(cudaEventCreate(&e));
  CU(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
  CU(cudaMemset(d, 0, sizeof src));

  TEST_CASE("without cudaStreamWaitEvent, syncing stream B alone reads stale data");
  fill_f(src, 32, 1.0f);
  fill_f(out, 32, -1.0f);
  CU(cudaMemcpyAsync(d, src, sizeof src, cudaMemcpyHostToDevice, a));
  CU(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, b));
  CU(cudaStreamSynchronize(b));
  CHECK(all_f(out, 32, 0.0f), "B saw A's unsynchronised write: %g", out[0]);
  CU(cudaDeviceSynchronize());

  TEST_CASE("record on A after a copy; B waits on the event: syncing B alone sees A's data");
  fill_f(src, 32, 2.0f);
  fill_f(out, 32, -1.0f);
  CU(cudaMemcpyAsync(d, src, sizeof src, cudaMemcpyHostToDevice, a));
  CU(cudaEventRecord(e, a));
  CU(launch_fill(a, d, 100.0f, 32));            /* after the record: must NOT be seen by B */
  CHECK(cudaEventQuery(e) == cudaErrorNotReady, "event complete before anything ran");
  CU(cudaStreamWaitEvent(b, e, 0));
  CU(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, b));
  CU(cudaStreamSynchronize(b));
  CHECK(all_f(out, 32, 2.0f), "B read %g, expected A's 2", out[0]);
  CHECK(cudaEventQuery(e) == cudaSuccess, "event done after B's sync");
  CHECK(cudaStreamQuery(a) == cudaErrorNotReady, "A's work after the record ran too");
  CU(cudaStreamSynchronize(a));
  CU(cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost));
  CHECK(out[0] == 100.0f && out[31] == 131.0f, "A's kernel: %g", out[0]);

  TEST_CASE("a consumer without a wait: the default schedule hides it when the producer is synced first; MUON_STANDIN_AHEAD shows it");
  {
    int k;
    for (k = 0; k < 2; k++) {
      gate_open = 0;
      fill_f(src, 32, 4.0f + (float)k);
      fill_f(out, 32, -1.0f);
      CU(cudaMemset(d, 0, sizeof src));
      muon_standin_ahead(k);
      CU(muon_standin_enqueue(a, gate_progress, NULL, &gate_open, "a gate"));   /* the producer waits for a peer */
      CU(cudaMemcpyAsync(d, src, sizeof src, cudaMemcpyHostToDevice, a));
      CU(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, b));      /* no wait for a */
      CHECK(cudaStreamQuery(a) == cudaErrorNotReady, "first query ran something");
      CHECK(cudaStreamQuery(a) == cudaErrorNotReady, "the gated producer finished");
      gate_open = 1;
      CU(cudaStreamSynchronize(a));
      CU(cudaStreamSynchronize(b));
      if (k == 0) CHECK(all_f(out, 32, 4.0f), "default schedule: B read %g, expected the producer's 4 (B ran last)", out[0]);
      else CHECK(all_f(out, 32, 0.0f), "ahead: B read %g, expected the stale 0 (B ran ahead of the gated producer)", out[0]);
    }
    muon_standin_ahead(0);
  }

  TEST_CASE("MUON_STANDIN_AHEAD: a consumer that waits still reads the producer's data");
  gate_open = 0;
  fill_f(src, 32, 6.0f);
  fill_f(out, 32, -1.0f);
  muon_standin_ahead(1);
  CU(muon_standin_enqueue(a, gate_progress, NULL, &gate_open, "a gate"));
  CU(cudaMemcpyAsync(d, src, sizeof src, cudaMemcpyHostToDevice, a));
  CU(cudaEventRecord(e2, a));
  CU(cudaStreamWaitEvent(b, e2, 0));
  CU(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, b));
  CHECK(cudaStreamQuery(b) == cudaErrorNotReady && cudaStreamQuery(b) == cudaErrorNotReady, "B finished before its producer");
  CHECK(all_f(out, 32, -1.0f), "B's copy ran before its wait was satisfied: %g", out[0]);
  gate_open = 1;
  CU(cudaStreamSynchronize(b));
  CHECK(all_f(out, 32, 6.0f), "B read %g, expected 6", out[0]);
  muon_standin_ahead(0);
  CU(launch_fill(a, d, 100.0f, 32));            /* d as the cases below expect it */
  CU(cudaStreamSynchronize(a));

  TEST_CASE("cudaEventSynchronize runs the stream only up to the event");
  fill_f(out, 32, -1.0f);
  CU(cudaEventRecord(e, a));
  CU(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, a));
  CU(cudaEventRecord(e2, a));
  CU(cudaEventSynchronize(e));
  CHECK(all_f(out, 32, -1.0f), "work after the event ran");
  CHECK(cudaEventQuery(e2) == cudaErrorNotReady, "later event completed");
  CU(cudaEventSynchronize(e2));
  CHECK(out[0] == 100.0f, "work before e2: %g", out[0]);

  TEST_CASE("cudaEventElapsedTime; event argument checks");
  CU(cudaEventRecord(e2, a));
  CU(cudaEventRecord(e, a));
  CHECK(cudaEventElapsedTime(&ms, e, e) == cudaErrorNotReady, "elapsed on a pending event");
  CU(cudaStreamSynchronize(a));
  CU(cudaEventElapsedTime(&ms, e, e));
  CHECK(ms == 0.0f, "elapsed %g", ms);
  CHECK(cudaEventElapsedTime(&ms, e, e2) == cudaErrorInvalidResourceHandle, "timing-disabled event");
  CHECK(cudaEventElapsedTime(NULL, e, e) == cudaErrorInvalidValue, "NULL ms");
  CHECK(cudaEventCreateWithFlags(&e2, cudaEventInterprocess) == cudaErrorInvalidValue, "interprocess without disable-timing");
  CHECK(cudaStreamWaitEvent(b, e, 7) == cudaErrorInvalidValue, "bad wait flags");
  cudaGetLastError();
  {
    cudaEvent_t never;
    CU(cudaEventCreate(&never));
    CU(cudaEventSynchronize(never));            /* never recorded: complete */
    CHECK(cudaEventQuery(never) == cudaSuccess, "never-recorded event query");
    CU(cudaStreamWaitEvent(b, never, 0));
    CU(cudaEventDestroy(never));
    CHECK(cudaEventQuery(never) == cudaErrorInvalidResourceHandle, "destroyed event");
    cudaGetLastError();
  }

  TEST_CASE("event destroyed and stream destroyed while pending still complete");
  fill_f(out, 32, -1.0f);
  {
    cudaStream_t t;
    cudaEvent_t x;
    CU(cudaStreamCreate(&t));
    CU(cudaEventCreate(&x));
    CU(cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, t));
    CU(cudaEventRecord(x, t));
    CU(cudaStreamWaitEvent(b, x, 0));
    CU(cudaEventDestroy(x));
    CU(cudaStreamDestroy(t));
    CU(cudaStreamSynchronize(b));              /* runs t up to x through the wait */
    CHECK(out[0] == 100.0f, "destroyed stream's copy through a wait: %g", out[0]);
  }

  CU(cudaEventDestroy(e));
  CU(cudaEventDestroy(e2));
  CU(cudaStreamDestroy(a));
  CU(cudaStreamDestroy(b));
  CU(cudaFree(d));
}

/* =============================================================================================
   4. GEMM
   ============================================================================================= */
typedef struct gemm_case {
  cudaDataType at, ct;
  int ta, tb, m, n, k, lda, ldb, ldc;
} gemm_case;

static size_t esz(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }
static double hget(const void *p, cudaDataType t, size_t i) { return t == CUDA_R_32F ? (double)((const float *)p)[i] : (double)bf2f(((const uint16_t *)p)[i]); }
static void hset(void *p, cudaDataType t, size_t i, float v) { if (t == CUDA_R_32F) ((float *)p)[i] = v; else ((uint16_t *)p)[i] = f2bf(v); }

/* Host matrices for a case: stored A (ar x ac), B, C, padding set to NaN (must never be read). */
static void make_case(const gemm_case *c, void **hA, void **hB, void **hC, size_t *na, size_t *nb, size_t *nc) {
  int ar = c->ta == CUBLAS_OP_N ? c->m : c->k, ac = c->ta == CUBLAS_OP_N ? c->k : c->m;
  int br = c->tb == CUBLAS_OP_N ? c->k : c->n, bc = c->tb == CUBLAS_OP_N ? c->n : c->k;
  size_t i;
  int r, q;
  *na = (size_t)c->lda * ac; *nb = (size_t)c->ldb * bc; *nc = (size_t)c->ldc * c->n;
  *hA = malloc(*na * esz(c->at)); *hB = malloc(*nb * esz(c->at)); *hC = malloc(*nc * esz(c->ct));
  for (i = 0; i < *na; i++) hset(*hA, c->at, i, NAN);
  for (i = 0; i < *nb; i++) hset(*hB, c->at, i, NAN);
  for (i = 0; i < *nc; i++) hset(*hC, c->ct, i, NAN);
  for (q = 0; q < ac; q++) for (r = 0; r < ar; r++) hset(*hA, c->at, (size_t)r + (size_t)q * c->lda, frand());
  for (q = 0; q < bc; q++) for (r = 0; r < br; r++) hset(*hB, c->at, (size_t)r + (size_t)q * c->ldb, frand());
  for (q = 0; q < c->n; q++) for (r = 0; r < c->m; r++) hset(*hC, c->ct, (size_t)r + (size_t)q * c->ldc, frand());
}

/* Double-precision reference of one element. */
static double ref_elem(const gemm_case *c, const void *A, const void *B, const void *C, float alpha, float beta, int i, int j) {
  double s = 0;
  int p;
  for (p = 0; p < c->k; p++) {
    double a = hget(A, c->at, c->ta == CUBLAS_OP_N ? (size_t)i + (size_t)p * c->lda : (size_t)p + (size_t)i * c->lda);
    double b = hget(B, c->at, c->tb == CUBLAS_OP_N ? (size_t)p + (size_t)j * c->ldb : (size_t)j + (size_t)p * c->ldb);
    s += a * b;
  }
  s *= alpha;
  if (beta != 0.0f) s += (double)beta * hget(C, c->ct, (size_t)i + (size_t)j * c->ldc);
  return s;
}

static cublasHandle_t g_h;

static void test_gemm_reference(void) {
  static const cudaDataType types[3][2] = { {CUDA_R_32F, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF}, {CUDA_R_16BF, CUDA_R_32F} };
  static const int ops[3] = { CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_OP_C };
  int t, x, y, bi, fails = 0, padding_ok = 1;
  double worst[3] = {0, 0, 0};
  TEST_CASE("GemmEx: every transa/transb x type combo vs a double reference (m5 n7 k3, padded ld)");
  for (t = 0; t < 3; t++)
    for (x = 0; x < 3; x++)
      for (y = 0; y < 3; y++)
        for (bi = 0; bi < 2; bi++) {
          gemm_case c;
          void *hA, *hB, *hC, *dA, *dB, *dC, *out;
          size_t na, nb, nc, q;
          float alpha = 1.5f, beta = bi ? 0.5f : 0.0f;
          int i, j;
          double tol = types[t][1] == CUDA_R_32F ? 1e-5 : 8e-3;
          c.at = types[t][0]; c.ct = types[t][1]; c.ta = ops[x]; c.tb = ops[y];
          c.m = 5; c.n = 7; c.k = 3;
          c.lda = (c.ta == CUBLAS_OP_N ? c.m : c.k) + 2;
          c.ldb = (c.tb == CUBLAS_OP_N ? c.k : c.n) + 1;
          c.ldc = c.m + 3;
          make_case(&c, &hA, &hB, &hC, &na, &nb, &nc);
          dA = dev_upload(hA, na * esz(c.at)); dB = dev_upload(hB, nb * esz(c.at)); dC = dev_upload(hC, nc * esz(c.ct));
          CB(cublasGemmEx(g_h, (cublasOperation_t)c.ta, (cublasOperation_t)c.tb, c.m, c.n, c.k, &alpha, dA, c.at, c.lda, dB, c.at, c.ldb,
                          &beta, dC, c.ct, c.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          out = malloc(nc * esz(c.ct));
          CU(cudaMemcpy(out, dC, nc * esz(c.ct), cudaMemcpyDeviceToHost));
          for (j = 0; j < c.n; j++)
            for (i = 0; i < c.m; i++) {
              double r = ref_elem(&c, hA, hB, hC, alpha, beta, i, j);
              double g = hget(out, c.ct, (size_t)i + (size_t)j * c.ldc);
              double err = fabs(g - r) / (fabs(r) > 1 ? fabs(r) : 1);
              if (!(err <= tol)) fails++;
              if (err > worst[t]) worst[t] = err;
            }
          for (q = 0; q < nc; q++) /* padding rows of C untouched (still NaN) */
            if ((int)(q % (size_t)c.ldc) >= c.m && !isnan(hget(out, c.ct, q))) padding_ok = 0;
          free(hA); free(hB); free(hC); free(out);
          CU(cudaFree(dA)); CU(cudaFree(dB)); CU(cudaFree(dC));
        }
  CHECK(fails == 0, "%d elements off (worst rel err fp32 %g bf16 %g bf16->fp32 %g)", fails, worst[0], worst[1], worst[2]);
  CHECK(padding_ok, "GEMM wrote C's padding rows");
  CHECK(!muon_standin_tf32_used(), "tf32 flagged without TF32");
}

/* Runs one GEMM of case c on device buffers and returns the host C (caller frees). */
static void *run_gemm(const gemm_case *c, const void *dA, const void *dB, void *dC, float alpha, float beta, cublasComputeType_t ct) {
  size_t bytes = (size_t)c->ldc * c->n * esz(c->ct);
  void *out = malloc(bytes);
  CB(cublasGemmEx(g_h, (cublasOperation_t)c->ta, (cublasOperation_t)c->tb, c->m, c->n, c->k, &alpha, dA, c->at, c->lda, dB, c->at,
                  c->ldb, &beta, dC, c->ct, c->ldc, ct, CUBLAS_GEMM_DEFAULT));
  CU(cudaMemcpy(out, dC, bytes, cudaMemcpyDeviceToHost));
  return out;
}

static void test_gemm_bitwise(void) {
  gemm_case c;
  void *hA, *hB, *hC, *dA, *dB, *dC, *o1, *o2, *o3;
  size_t na, nb, nc;
  float alpha = 0.75f, beta = 0.0f;

  TEST_CASE("bf16 output is the round-to-nearest-even of the fp32 result; OP_C equals OP_T");
  c.at = CUDA_R_16BF; c.ct = CUDA_R_32F; c.ta = CUBLAS_OP_T; c.tb = CUBLAS_OP_N;
  c.m = 9; c.n = 6; c.k = 40; c.lda = 41; c.ldb = 40; c.ldc = 9;
  make_case(&c, &hA, &hB, &hC, &na, &nb, &nc);
  dA = dev_upload(hA, na * 2); dB = dev_upload(hB, nb * 2);
  dC = dev_alloc(nc * 4);
  o1 = run_gemm(&c, dA, dB, dC, alpha, beta, CUBLAS_COMPUTE_32F);
  c.ct = CUDA_R_16BF;
  o2 = run_gemm(&c, dA, dB, dC, alpha, beta, CUBLAS_COMPUTE_32F_PEDANTIC);
  {
    size_t i, bad = 0;
    for (i = 0; i < nc; i++) bad += ((uint16_t *)o2)[i] != f2bf(((float *)o1)[i]);
    CHECK(bad == 0, "%zu bf16 outputs are not RNE of the fp32 result", bad);
  }
  c.ta = CUBLAS_OP_C;
  o3 = run_gemm(&c, dA, dB, dC, alpha, beta, CUBLAS_COMPUTE_32F_FAST_16BF);
  CHECK(memcmp(o2, o3, nc * 2) == 0, "OP_C differs from OP_T");
  free(o1); free(o2); free(o3); free(hA); free(hB); free(hC);
  CU(cudaFree(dA)); CU(cudaFree(dB)); CU(cudaFree(dC));

  TEST_CASE("bf16 rounding edge cases: ties to even, NaN stays NaN, overflow to inf");
  {
    /* 1x1x1 bf16 GEMM with A = B = 1 and beta 0: the output is the bf16 rounding of alpha. */
    static const uint32_t alphas[6] = { 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x7f800001u, 0x7f7fffffu, 0xff7fffffu };
    static const uint16_t want[6] = { 0x3f80, 0x3f82, 0x3f81, 0x7fc0, 0x7f80, 0xff80 };
    uint16_t one_bf = 0x3f80, got[6];
    float zero = 0.0f, one = 1.0f;
    uint16_t *d1 = (uint16_t *)dev_upload(&one_bf, 2), *dout = (uint16_t *)dev_alloc(sizeof got);
    int i, bad = 0;
    for (i = 0; i < 6; i++) {
      float al = u2f(alphas[i]);
      CB(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &al, d1, CUDA_R_16BF, 1, d1, CUDA_R_16BF, 1, &zero,
                      dout + i, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    CU(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    for (i = 0; i < 6; i++) {
      int ok = i == 3 ? isnan(bf2f(got[i])) : got[i] == want[i];
      if (!ok) { bad++; printf("  alpha 0x%08x -> bf16 0x%04x, want 0x%04x\n", alphas[i], got[i], want[i]); }
    }
    CHECK(bad == 0, "%d bf16 roundings wrong", bad);
    CHECK(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, d1, CUDA_R_32F, 1, d1, CUDA_R_32F, 1, &zero,
                       dout, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED,
          "(32F, 32F, 16BF) must be unsupported");
    CU(cudaFree(d1)); CU(cudaFree(dout));
  }

  /* cuBLAS picks its kernel by batch count and alignment too, so a product's bits may change with
     either; the stand-in's do (muon_cuda.h must not depend on them). */
  TEST_CASE("strided batch 3 sums unlike 3 single GEMMs, a misaligned GEMM unlike an aligned one; BatchedEx = strided");
  {
    static const cudaDataType types[3][2] = { {CUDA_R_32F, CUDA_R_32F}, {CUDA_R_16BF, CUDA_R_16BF}, {CUDA_R_16BF, CUDA_R_32F} };
    int t, bt;
    for (t = 0; t < 3; t++) {
      size_t sa, sb, sc, ea, ec, bytesC;
      void *hA3, *hB3, *hC3, *dA3, *dB3, *dC3, *dC1, *sing, *strided, *batched;
      void *ptrs[9];
      void **dptrs;
      float al = 1.25f, be = -0.5f;
      gemm_case g;
      size_t i;
      g.at = types[t][0]; g.ct = types[t][1]; g.ta = CUBLAS_OP_N; g.tb = CUBLAS_OP_T;
      g.m = 5; g.n = 7; g.k = 24; g.lda = 6; g.ldb = 8; g.ldc = 5;
      ea = esz(g.at); ec = esz(g.ct);
      sa = (size_t)g.lda * g.k + 8; sb = (size_t)g.ldb * g.k + 16; sc = (size_t)g.ldc * g.n + 5; /* 16-byte multiples */
      hA3 = malloc(3 * sa * ea); hB3 = malloc(3 * sb * ea); hC3 = malloc(3 * sc * ec);
      for (i = 0; i < 3 * sa; i++) hset(hA3, g.at, i, frand());
      for (i = 0; i < 3 * sb; i++) hset(hB3, g.at, i, frand());
      for (i = 0; i < 3 * sc; i++) hset(hC3, g.ct, i, frand());
      bytesC = 3 * sc * ec;
      dA3 = dev_upload(hA3, 3 * sa * ea); dB3 = dev_upload(hB3, 3 * sb * ea);
      dC3 = dev_upload(hC3, bytesC); dC1 = dev_upload(hC3, bytesC);
      for (bt = 0; bt < 3; bt++)
        CB(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_T, g.m, g.n, g.k, &al, (char *)dA3 + bt * sa * ea, g.at, g.lda,
                        (char *)dB3 + bt * sb * ea, g.at, g.ldb, &be, (char *)dC1 + bt * sc * ec, g.ct, g.ldc,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      CB(cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_T, g.m, g.n, g.k, &al, dA3, g.at, g.lda, (long long)sa, dB3,
                                    g.at, g.ldb, (long long)sb, &be, dC3, g.ct, g.ldc, (long long)sc, 3, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
      sing = malloc(bytesC); strided = malloc(bytesC); batched = malloc(bytesC);
      CU(cudaMemcpy(sing, dC1, bytesC, cudaMemcpyDeviceToHost));
      CU(cudaMemcpy(strided, dC3, bytesC, cudaMemcpyDeviceToHost));
      if (g.ct == CUDA_R_32F)
        CHECK(memcmp(sing, strided, bytesC) != 0, "type combo %d: strided batch 3 summed as 3 single GEMMs", t);
      {
        /* entry 0 again, A and C one element off 16 bytes */
        char *dA = (char *)dev_alloc(sa * ea + 16), *dC = (char *)dev_alloc(sc * ec + 16);
        void *off = malloc(sc * ec);
        CU(cudaMemcpy(dA + ea, hA3, sa * ea, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dC + ec, hC3, sc * ec, cudaMemcpyHostToDevice));
        CB(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_T, g.m, g.n, g.k, &al, dA + ea, g.at, g.lda, dB3, g.at, g.ldb, &be,
                        dC + ec, g.ct, g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        CU(cudaMemcpy(off, dC + ec, sc * ec, cudaMemcpyDeviceToHost));
        if (g.at == CUDA_R_32F) /* bf16 products sum exactly here: any order gives the same bits */
          CHECK(memcmp(off, sing, sc * ec) != 0, "type combo %d: a misaligned GEMM summed as an aligned one", t);
        CU(cudaFree(dA)); CU(cudaFree(dC));
        free(off);
      }
      /* BatchedEx: pointer arrays in device memory, batch entries in reverse order for good measure */
      CU(cudaMemcpy(dC3, hC3, bytesC, cudaMemcpyHostToDevice));
      for (bt = 0; bt < 3; bt++) {
        ptrs[bt] = (char *)dA3 + bt * sa * ea;
        ptrs[3 + bt] = (char *)dB3 + bt * sb * ea;
        ptrs[6 + bt] = (char *)dC3 + bt * sc * ec;
      }
      dptrs = (void **)dev_upload(ptrs, sizeof ptrs);
      CB(cublasGemmBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_T, g.m, g.n, g.k, &al, (const void *const *)dptrs, g.at, g.lda,
                             (const void *const *)(dptrs + 3), g.at, g.ldb, &be, dptrs + 6, g.ct, g.ldc, 3,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      CU(cudaMemcpy(batched, dC3, bytesC, cudaMemcpyDeviceToHost));
      CHECK(memcmp(batched, strided, bytesC) == 0, "type combo %d: BatchedEx differs from strided", t);
      CU(cudaFree(dptrs));
      free(sing); free(strided); free(batched); free(hA3); free(hB3); free(hC3);
      CU(cudaFree(dA3)); CU(cudaFree(dB3)); CU(cudaFree(dC3)); CU(cudaFree(dC1));
    }
  }

  TEST_CASE("cublasSgemm equals GemmEx fp32 bitwise");
  {
    float hA[12], hB[12], r1[9], r2[9], al = 2.0f, be = 0.0f;
    float *a, *b, *c1, *c2;
    int i;
    for (i = 0; i < 12; i++) { hA[i] = frand(); hB[i] = frand(); }
    a = (float *)dev_upload(hA, sizeof hA); b = (float *)dev_upload(hB, sizeof hB);
    c1 = (float *)dev_alloc(sizeof r1); c2 = (float *)dev_alloc(sizeof r2);
    CB(cublasSgemm(g_h, CUBLAS_OP_T, CUBLAS_OP_N, 3, 3, 4, &al, a, 4, b, 4, &be, c1, 3));
    CB(cublasGemmEx(g_h, CUBLAS_OP_T, CUBLAS_OP_N, 3, 3, 4, &al, a, CUDA_R_32F, 4, b, CUDA_R_32F, 4, &be, c2, CUDA_R_32F, 3,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CU(cudaMemcpy(r1, c1, sizeof r1, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(r2, c2, sizeof r2, cudaMemcpyDeviceToHost));
    CHECK(memcmp(r1, r2, sizeof r1) == 0, "Sgemm differs");
    CU(cudaFree(a)); CU(cudaFree(b)); CU(cudaFree(c1)); CU(cudaFree(c2));
  }
}

static void test_gemm_semantics(void) {
  float hA[64], hB[64], hC[64], out[64], al = 1.0f, be = 0.0f, two = 2.0f;
  float *a, *b, *c;
  int i;
  cudaStream_t s;
  for (i = 0; i < 64; i++) { hA[i] = (float)(i % 7) - 3.0f; hB[i] = (float)(i % 5) - 2.0f; hC[i] = NAN; }
  a = (float *)dev_upload(hA, sizeof hA); b = (float *)dev_upload(hB, sizeof hB); c = (float *)dev_upload(hC, sizeof hC);
  CU(cudaStreamCreate(&s));

  TEST_CASE("beta = 0 with NaN in C gives finite results (C not read)");
  CB(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &al, a, CUDA_R_32F, 8, b, CUDA_R_32F, 8, &be, c, CUDA_R_32F, 8,
                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  CU(cudaMemcpy(out, c, sizeof out, cudaMemcpyDeviceToHost));
  {
    int finite = 1;
    for (i = 0; i < 64; i++) finite &= isfinite(out[i]) != 0;
    CHECK(finite, "NaN leaked from C with beta 0");
  }

  TEST_CASE("k = 0 scales C by beta; m, n or batch 0 do nothing");
  CU(cudaMemcpy(c, hA, sizeof hA, cudaMemcpyHostToDevice));
  CB(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 0, &al, a, CUDA_R_32F, 8, b, CUDA_R_32F, 1, &two, c, CUDA_R_32F, 8,
                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  CB(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 0, 8, 8, &al, NULL, CUDA_R_32F, 8, NULL, CUDA_R_32F, 8, &be, NULL, CUDA_R_32F, 8,
                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  CB(cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &al, NULL, CUDA_R_32F, 8, 0, NULL, CUDA_R_32F, 8, 0, &be,
                                NULL, CUDA_R_32F, 8, 0, 0, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  CU(cudaMemcpy(out, c, sizeof out, cudaMemcpyDeviceToHost));
  {
    int ok = 1;
    for (i = 0; i < 64; i++) ok &= out[i] == 2.0f * hA[i];
    CHECK(ok, "k=0: C[0] %g expected %g", out[0], 2.0f * hA[0]);
  }

  TEST_CASE("GEMM reads a buffer written by a prior queued memcpy on the same stream");
  CB(cublasSetStream(g_h, s));
  {
    float ident[64], res[64];
    for (i = 0; i < 64; i++) ident[i] = (i % 9 == 0) ? 1.0f : 0.0f; /* 8x8 identity */
    CU(cudaMemsetAsync(b, 0, sizeof hB, s));
    CU(cudaMemcpyAsync(b, ident, sizeof ident, cudaMemcpyHostToDevice, s));
    CB(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &al, a, CUDA_R_32F, 8, b, CUDA_R_32F, 8, &be, c, CUDA_R_32F, 8,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    fill_f(res, 64, -7.0f);
    CU(cudaMemcpyAsync(res, c, sizeof res, cudaMemcpyDeviceToHost, s));
    CHECK(all_f(res, 64, -7.0f), "result visible before the sync");
    CU(cudaStreamSynchronize(s));
    CHECK(memcmp(res, hA, sizeof res) == 0, "A * I != A: res[1] %g hA[1] %g", res[1], hA[1]);
  }

  TEST_CASE("pointer mode DEVICE: alpha/beta read at execution");
  {
    float sc[2] = {3.0f, 0.0f}, res[64];
    float *dsc = (float *)dev_upload(sc, sizeof sc);
    cublasPointerMode_t pm;
    CB(cublasSetPointerMode(g_h, CUBLAS_POINTER_MODE_DEVICE));
    CB(cublasGetPointerMode(g_h, &pm));
    CHECK(pm == CUBLAS_POINTER_MODE_DEVICE, "pointer mode %d", (int)pm);
    CHECK(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &al, a, CUDA_R_32F, 8, b, CUDA_R_32F, 8, &be, c, CUDA_R_32F, 8,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE, "host scalars in DEVICE mode");
    CB(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, dsc, a, CUDA_R_32F, 8, b, CUDA_R_32F, 8, dsc + 1, c, CUDA_R_32F, 8,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    sc[0] = 5.0f;
    CU(cudaMemcpyAsync(dsc, sc, sizeof sc, cudaMemcpyHostToDevice, 0)); /* other stream, synced first */
    CU(cudaStreamSynchronize(0));
    CU(cudaStreamSynchronize(s));
    CU(cudaMemcpy(res, c, sizeof res, cudaMemcpyDeviceToHost));
    CHECK(res[1] == 5.0f * hA[1] && res[2] == 5.0f * hA[2], "alpha read at call time? res[1] %g", res[1]);
    CB(cublasSetPointerMode(g_h, CUBLAS_POINTER_MODE_HOST));
    CHECK(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, dsc, a, CUDA_R_32F, 8, b, CUDA_R_32F, 8, dsc + 1, c, CUDA_R_32F, 8,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE, "device scalars in HOST mode");
    CU(cudaFree(dsc));
  }
  CB(cublasSetStream(g_h, 0));

  TEST_CASE("GEMM argument errors return the documented codes");
  {
#define G(h, ta, tb, m, n, k, A, at, lda, B, bt, ldb, C, ct, ldc, comp, algo) \
  cublasGemmEx(h, (cublasOperation_t)(ta), (cublasOperation_t)(tb), m, n, k, &al, A, at, lda, B, bt, ldb, &be, C, ct, ldc, comp, algo)
    const cublasComputeType_t C32 = CUBLAS_COMPUTE_32F;
    const cublasGemmAlgo_t D = CUBLAS_GEMM_DEFAULT;
    const cudaDataType F = CUDA_R_32F, H = CUDA_R_16BF;
    CHECK(G(NULL, 0, 0, 8, 8, 8, a, F, 8, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_NOT_INITIALIZED, "NULL handle");
    CHECK(G(g_h, 3, 0, 8, 8, 8, a, F, 8, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "transa CONJG");
    CHECK(G(g_h, 0, 9, 8, 8, 8, a, F, 8, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "transb 9");
    CHECK(G(g_h, 0, 0, -1, 8, 8, a, F, 8, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "m < 0");
    CHECK(G(g_h, 0, 0, 8, -1, 8, a, F, 8, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "n < 0");
    CHECK(G(g_h, 0, 0, 8, 8, -1, a, F, 8, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "k < 0");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 7, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "lda < m (N)");
    CHECK(G(g_h, 1, 0, 8, 8, 4, a, F, 3, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "lda < k (T)");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 8, b, F, 7, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "ldb < k (N)");
    CHECK(G(g_h, 0, 1, 8, 8, 4, a, F, 8, b, F, 7, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "ldb < n (T)");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 8, b, F, 8, c, F, 7, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "ldc < m");
    CHECK(G(g_h, 0, 0, 0, 8, 8, a, F, 0, b, F, 8, c, F, 0, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "ld 0 with m 0");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, CUDA_R_16F, 8, b, CUDA_R_16F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_NOT_SUPPORTED, "fp16");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 8, b, H, 8, c, F, 8, C32, D) == CUBLAS_STATUS_NOT_SUPPORTED, "A/B types differ");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 8, b, F, 8, c, H, 8, C32, D) == CUBLAS_STATUS_NOT_SUPPORTED, "fp32 in, bf16 out");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 8, b, F, 8, c, CUDA_R_64F, 8, C32, D) == CUBLAS_STATUS_NOT_SUPPORTED, "fp64 out");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 8, b, F, 8, c, F, 8, CUBLAS_COMPUTE_16F, D) == CUBLAS_STATUS_NOT_SUPPORTED, "compute 16F");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 8, b, F, 8, c, F, 8, CUBLAS_COMPUTE_64F, D) == CUBLAS_STATUS_NOT_SUPPORTED, "compute 64F");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 8, b, F, 8, c, F, 8, C32, (cublasGemmAlgo_t)57) == CUBLAS_STATUS_NOT_SUPPORTED, "algo 57");
    CHECK(cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &al, a, F, 8, 0, b, F, 8, 0, &be, c, F, 8, 0, -1, C32, D)
          == CUBLAS_STATUS_INVALID_VALUE, "batchCount < 0");
    CHECK(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, NULL, a, F, 8, b, F, 8, &be, c, F, 8, C32, D)
          == CUBLAS_STATUS_INVALID_VALUE, "NULL alpha");
    CHECK(cublasSgemm(NULL, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &al, a, 1, b, 1, &be, c, 1) == CUBLAS_STATUS_NOT_INITIALIZED, "Sgemm NULL handle");

    TEST_CASE("GEMM operands outside their allocations are rejected at the call");
    CHECK(G(g_h, 0, 0, 8, 9, 8, a, F, 8, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "B (8x9) runs past 64 floats");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a + 1, F, 8, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "A shifted by one");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 8, b, F, 8, c, F, 9, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "C with ldc 9 runs past");
    CHECK(G(g_h, 1, 0, 8, 8, 8, a, F, 9, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "A^T with lda 9 runs past");
    CHECK(G(g_h, 0, 0, 8, 8, 8, hA, F, 8, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "A is host memory");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 8, b, F, 8, out, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "C is host memory");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 8, b, F, 8, (char *)c + 2, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "C misaligned");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 8, b, F, 8, a, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "C aliases A");
    CHECK(G(g_h, 0, 0, 4, 4, 4, c + 2, F, 8, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "C rows 0-3 and A rows 2-5 of one buffer");
    CHECK(G(g_h, 0, 0, 4, 4, 4, a, F, 8, c + 16, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "C aliases B (columns 2-3)");
    /* interleaved but disjoint (rows 0-3 vs rows 4-7 of the same 8x8 buffer) is legal */
    CB(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &al, c + 4, F, 8, b, F, 8, &be, c, F, 8, C32, D));
    CHECK(cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &al, a, F, 4, 16, b, F, 4, 16, &be, c, F, 4, 16, 5,
                                     C32, D) == CUBLAS_STATUS_INVALID_VALUE, "5th batch entry runs past");
    CB(cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &al, a, F, 4, 16, b, F, 4, 16, &be, c, F, 4, 16, 4, C32, D));
    CB(cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &al, a + 48, F, 4, -16, b, F, 4, 0, &be, c, F, 4, 16, 4, C32, D));
    CHECK(cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &al, a, F, 4, -16, b, F, 4, 0, &be, c, F, 4, 16, 2,
                                     C32, D) == CUBLAS_STATUS_INVALID_VALUE, "negative stride before the allocation");
    CHECK(cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &al, a, F, 4, 1LL << 50, b, F, 4, 0, &be, c, F, 4, 16, 2,
                                     C32, D) == CUBLAS_STATUS_INVALID_VALUE, "absurd stride");
    CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 2147483647, b, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "huge lda");
    {
      float *freed = (float *)dev_alloc(256);
      CU(cudaFree(freed));
      CHECK(G(g_h, 0, 0, 8, 8, 8, a, F, 8, freed, F, 8, c, F, 8, C32, D) == CUBLAS_STATUS_INVALID_VALUE, "B freed");
    }
    CHECK(cublasGemmBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &al, (const void *const *)hA, F, 2,
                              (const void *const *)hB, F, 2, &be, (void *const *)hC, F, 2, 2, C32, D) == CUBLAS_STATUS_INVALID_VALUE,
          "BatchedEx pointer arrays in host memory");
    CU(cudaDeviceSynchronize());
#undef G
  }

  TEST_CASE("BatchedEx pointer contents are checked at execution: sticky error at the sync");
  {
    void *ptrs[3];
    void **dp;
    ptrs[0] = a; ptrs[1] = b; ptrs[2] = hC; /* C entry is a host pointer: only visible on the device */
    dp = (void **)dev_upload(ptrs, sizeof ptrs);
    CB(cublasGemmBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &al, (const void *const *)dp, CUDA_R_32F, 2,
                           (const void *const *)(dp + 1), CUDA_R_32F, 2, &be, dp + 2, CUDA_R_32F, 2, 1,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress, "bad pointer in the device array not reported");
    CHECK(cudaStreamSynchronize(0) == cudaErrorIllegalAddress, "not sticky");
    CHECK(cudaMemcpy(out, a, 4, cudaMemcpyDeviceToHost) == cudaErrorIllegalAddress, "cudaMemcpy after the fault");
    muon_standin_reset_errors();
    CU(cudaDeviceSynchronize());
    CU(cudaFree(dp));
  }

  TEST_CASE("TF32 use is recorded (compute type FAST_TF32 or TF32 math mode)");
  CHECK(!muon_standin_tf32_used(), "already set");
  {
    cublasMath_t mm;
    CB(cublasSetMathMode(g_h, CUBLAS_TF32_TENSOR_OP_MATH));
    CB(cublasGetMathMode(g_h, &mm));
    CHECK(mm == CUBLAS_TF32_TENSOR_OP_MATH, "math mode %d", (int)mm);
    CB(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &al, a, CUDA_R_32F, 8, b, CUDA_R_32F, 8, &be, c, CUDA_R_32F, 8,
                    CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
    CU(cudaDeviceSynchronize());
    CHECK(!muon_standin_tf32_used(), "PEDANTIC compute must not count as TF32");
    CB(cublasSgemm(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &al, a, 8, b, 8, &be, c, 8));
    CHECK(!muon_standin_tf32_used(), "counted before it ran");
    CU(cudaDeviceSynchronize());
    CHECK(muon_standin_tf32_used(), "Sgemm under TF32 math mode not recorded");
    CB(cublasSetMathMode(g_h, CUBLAS_DEFAULT_MATH));
    CHECK(cublasSetMathMode(g_h, (cublasMath_t)5) == CUBLAS_STATUS_INVALID_VALUE, "math mode 5");
  }

  CU(cudaStreamDestroy(s));
  CU(cudaFree(a)); CU(cudaFree(b)); CU(cudaFree(c));
}

/* =============================================================================================
   5. nrm2
   ============================================================================================= */
static void test_nrm2(void) {
  float x[20], r = -1, hres = -1;
  float *dx, *dr;
  double ref = 0;
  cudaStream_t s;
  int i;
  for (i = 0; i < 20; i++) x[i] = frand() * 3.0f;
  for (i = 0; i < 20; i += 2) ref += (double)x[i] * x[i];
  ref = sqrt(ref);
  dx = (float *)dev_alloc(sizeof x);
  dr = (float *)dev_alloc(sizeof(float));
  CU(cudaStreamCreate(&s));
  CB(cublasSetStream(g_h, s));

  TEST_CASE("Snrm2 pointer mode HOST: runs the handle's stream first, result on return");
  CU(cudaMemcpyAsync(dx, x, sizeof x, cudaMemcpyHostToDevice, s)); /* queued: nrm2 must see it */
  CB(cublasSnrm2(g_h, 10, dx, 2, &r));
  CHECK(fabs(r - ref) <= 1e-6 * ref, "nrm2 %g, expected %g", r, ref);
  CB(cublasSnrm2(g_h, 0, dx, 1, &r));
  CHECK(r == 0.0f, "n = 0: %g", r);
  r = -1;
  CB(cublasSnrm2(g_h, 5, dx, 0, &r));
  CHECK(r == 0.0f, "incx = 0: %g", r);
  CHECK(cublasSnrm2(g_h, 11, dx, 2, &r) == CUBLAS_STATUS_INVALID_VALUE, "x runs past its allocation");
  CHECK(cublasSnrm2(g_h, 4, x, 1, &r) == CUBLAS_STATUS_INVALID_VALUE, "x is host memory");
  CHECK(cublasSnrm2(g_h, 4, dx, 1, dr) == CUBLAS_STATUS_INVALID_VALUE, "HOST mode with a device result");
  CHECK(cublasSnrm2(NULL, 4, dx, 1, &r) == CUBLAS_STATUS_NOT_INITIALIZED, "NULL handle");

  TEST_CASE("Snrm2 pointer mode DEVICE: queued, result only visible after the sync");
  CB(cublasSetPointerMode(g_h, CUBLAS_POINTER_MODE_DEVICE));
  CU(cudaMemset(dr, 0, sizeof(float)));
  CB(cublasSnrm2(g_h, 10, dx, 2, dr));
  hres = -1;
  CU(cudaMemcpyAsync(&hres, dr, sizeof(float), cudaMemcpyDeviceToHost, 0)); /* NULL stream: not ordered after it */
  CU(cudaStreamSynchronize(0));
  CHECK(hres == 0.0f, "device result visible without syncing the handle's stream: %g", hres);
  CU(cudaMemcpyAsync(&hres, dr, sizeof(float), cudaMemcpyDeviceToHost, s));
  CHECK(hres == 0.0f, "visible before the sync");
  CU(cudaStreamSynchronize(s));
  CHECK(fabs(hres - ref) <= 1e-6 * ref, "device-mode nrm2 %g, expected %g", hres, ref);
  CHECK(cublasSnrm2(g_h, 4, dx, 1, &r) == CUBLAS_STATUS_INVALID_VALUE, "DEVICE mode with a host result");
  CB(cublasSetPointerMode(g_h, CUBLAS_POINTER_MODE_HOST));
  CB(cublasSetStream(g_h, 0));
  CU(cudaStreamDestroy(s));
  CU(cudaFree(dx));
  CU(cudaFree(dr));
}

/* =============================================================================================
   cuBLAS handle
   ============================================================================================= */
static void test_handle(void) {
  cudaStream_t s, got = (cudaStream_t)1;
  void *ws = dev_alloc(4096);
  cublasHandle_t h2;
  TEST_CASE("handle: create/destroy, stream, workspace rules, status names");
  CU(cudaStreamCreate(&s));
  CB(cublasCreate(&h2));
  CB(cublasGetStream(h2, &got));
  CHECK(got == NULL, "default stream %p", (void *)got);
  CB(cublasSetStream(h2, s));
  CB(cublasGetStream(h2, &got));
  CHECK(got == s, "stream not stored");
  CB(cublasSetWorkspace(h2, ws, 4096));
  CHECK(cublasSetWorkspace(h2, (char *)ws + 16, 1024) == CUBLAS_STATUS_INVALID_VALUE, "misaligned workspace");
  CHECK(cublasSetWorkspace(h2, ws, 8192) == CUBLAS_STATUS_INVALID_VALUE, "workspace larger than its allocation");
  CHECK(cublasSetWorkspace(h2, &got, 64) == CUBLAS_STATUS_INVALID_VALUE, "host workspace");
  CB(cublasSetWorkspace(h2, NULL, 0));
  CHECK(cublasSetStream(h2, (cudaStream_t)&got) == CUBLAS_STATUS_INVALID_VALUE, "bogus stream");
  CHECK(cublasSetPointerMode(h2, (cublasPointerMode_t)2) == CUBLAS_STATUS_INVALID_VALUE, "pointer mode 2");
  CB(cublasDestroy(h2));
  CHECK(cublasDestroy(h2) == CUBLAS_STATUS_NOT_INITIALIZED, "double destroy");
  CHECK(cublasSetStream(h2, s) == CUBLAS_STATUS_NOT_INITIALIZED, "destroyed handle");
  CHECK(cublasCreate(NULL) == CUBLAS_STATUS_INVALID_VALUE, "cublasCreate(NULL)");
  CHECK(strcmp(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED") == 0, "status name");
  CHECK(strlen(cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE)) > 0, "status string");
  CHECK(strcmp(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue") == 0, "error name");
  CHECK(strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0, "error string");
  CHECK(strcmp(cudaGetErrorName((cudaError_t)12345), "unrecognized error code") == 0, "unknown error name");
  CU(cudaStreamDestroy(s));
  CU(cudaFree(ws));
}

/* =============================================================================================
   7. Fault injection
   ============================================================================================= */
static void test_injection(void) {
  void *p = NULL, *q = NULL;
  float *d = (float *)dev_alloc(64 * sizeof(float));
  float h[64], one = 1.0f, zero = 0.0f;
  void **dp;
  void *ptrs[3];
  cudaStream_t s;

  TEST_CASE("inject cudaMalloc / cudaMallocHost / cudaHostAlloc -> cudaErrorMemoryAllocation on the nth call");
  muon_standin_fail("cudaMalloc", 2);
  CU(cudaMalloc(&p, 16));
  CHECK(cudaMalloc(&q, 16) == cudaErrorMemoryAllocation, "2nd cudaMalloc did not fail");
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "last error");
  CU(cudaMalloc(&q, 16));
  CU(cudaFree(p)); CU(cudaFree(q));
  muon_standin_fail("cudaMallocHost", 1);
  CHECK(cudaMallocHost(&p, 16) == cudaErrorMemoryAllocation, "cudaMallocHost");
  muon_standin_fail("cudaHostAlloc", 1);
  CHECK(cudaHostAlloc(&p, 16, 0) == cudaErrorMemoryAllocation, "cudaHostAlloc");
  muon_standin_fail("cudaMalloc", 1);
  muon_standin_fail("cudaMalloc", 0); /* cleared */
  CU(cudaMalloc(&p, 16));
  CU(cudaFree(p));

  TEST_CASE("inject cudaMemcpyAsync / cudaMemsetAsync / cudaMemcpy / cudaMemset -> cudaErrorInvalidValue at the call");
  muon_standin_fail("cudaMemcpyAsync", 1);
  CHECK(cudaMemcpyAsync(d, h, 16, cudaMemcpyHostToDevice, 0) == cudaErrorInvalidValue, "cudaMemcpyAsync");
  CHECK(cudaGetLastError() == cudaErrorInvalidValue, "last error");
  CHECK(cudaStreamQuery(0) == cudaSuccess, "failed copy was queued");
  muon_standin_fail("cudaMemsetAsync", 1);
  CHECK(cudaMemsetAsync(d, 0, 16, 0) == cudaErrorInvalidValue, "cudaMemsetAsync");
  muon_standin_fail("cudaMemcpy", 1);
  CHECK(cudaMemcpy(d, h, 16, cudaMemcpyHostToDevice) == cudaErrorInvalidValue, "cudaMemcpy");
  muon_standin_fail("cudaMemset", 1);
  CHECK(cudaMemset(d, 0, 16) == cudaErrorInvalidValue, "cudaMemset");
  cudaGetLastError();

  TEST_CASE("inject stream/event creation -> cudaErrorMemoryAllocation; cublasCreate -> ALLOC_FAILED");
  muon_standin_fail("cudaStreamCreate", 1);
  CHECK(cudaStreamCreate(&s) == cudaErrorMemoryAllocation, "cudaStreamCreate");
  muon_standin_fail("cudaStreamCreateWithFlags", 1);
  CHECK(cudaStreamCreateWithFlags(&s, 0) == cudaErrorMemoryAllocation, "cudaStreamCreateWithFlags");
  {
    cudaEvent_t e;
    cublasHandle_t h2;
    muon_standin_fail("cudaEventCreate", 1);
    CHECK(cudaEventCreate(&e) == cudaErrorMemoryAllocation, "cudaEventCreate");
    muon_standin_fail("cudaEventCreateWithFlags", 1);
    CHECK(cudaEventCreateWithFlags(&e, 0) == cudaErrorMemoryAllocation, "cudaEventCreateWithFlags");
    muon_standin_fail("cublasCreate_v2", 1);
    CHECK(cublasCreate(&h2) == CUBLAS_STATUS_ALLOC_FAILED, "cublasCreate");
  }
  cudaGetLastError();

  TEST_CASE("inject cuBLAS GEMMs and Snrm2 -> CUBLAS_STATUS_EXECUTION_FAILED at the call");
  CU(cudaMemset(d, 0, 64 * sizeof(float)));
  ptrs[0] = d; ptrs[1] = d + 16; ptrs[2] = d + 32;
  dp = (void **)dev_upload(ptrs, sizeof ptrs);
  muon_standin_fail("cublasGemmEx", 1);
  CHECK(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, CUDA_R_32F, 4, d + 16, CUDA_R_32F, 4, &zero, d + 32,
                     CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_EXECUTION_FAILED, "GemmEx");
  muon_standin_fail("cublasGemmStridedBatchedEx", 1);
  CHECK(cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, CUDA_R_32F, 4, 0, d + 16, CUDA_R_32F, 4, 0,
                                   &zero, d + 32, CUDA_R_32F, 4, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
        == CUBLAS_STATUS_EXECUTION_FAILED, "StridedBatchedEx");
  muon_standin_fail("cublasGemmBatchedEx", 1);
  CHECK(cublasGemmBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, (const void *const *)dp, CUDA_R_32F, 4,
                            (const void *const *)(dp + 1), CUDA_R_32F, 4, &zero, dp + 2, CUDA_R_32F, 4, 1, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_EXECUTION_FAILED, "BatchedEx");
  muon_standin_fail("cublasSgemm_v2", 1);
  CHECK(cublasSgemm(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, 4, d + 16, 4, &zero, d + 32, 4) == CUBLAS_STATUS_EXECUTION_FAILED, "Sgemm");
  muon_standin_fail("cublasSnrm2_v2", 1);
  CHECK(cublasSnrm2(g_h, 4, d, 1, h) == CUBLAS_STATUS_EXECUTION_FAILED, "Snrm2");
  CHECK(cudaStreamQuery(0) == cudaSuccess, "a failed cuBLAS call queued work");
  CB(cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, CUDA_R_32F, 4, d + 16, CUDA_R_32F, 4, &zero, d + 32,
                  CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)); /* one-shot */
  CU(cudaDeviceSynchronize());
  CU(cudaFree(dp));

  TEST_CASE("inject kernel: launch succeeds, execution fails, sticky cudaErrorLaunchFailure");
  CU(cudaStreamCreate(&s));
  CU(cudaMemset(d, 0, 64 * sizeof(float)));
  muon_standin_fail("kernel", 2);
  CU(launch_fill(s, d, 1.0f, 8));                  /* 1st: runs */
  CU(launch_fill(s, d + 8, 1.0f, 8));              /* 2nd: faults */
  CHECK(cudaGetLastError() == cudaSuccess, "the faulting launch itself reported an error");
  CU(launch_fill(s, d + 16, 1.0f, 8));             /* after the fault: discarded */
  CHECK(cudaStreamSynchronize(s) == cudaErrorLaunchFailure, "stream sync after the injected fault");
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure, "cudaDeviceSynchronize is not sticky");
  CHECK(cudaStreamSynchronize(0) == cudaErrorLaunchFailure, "other stream's sync is not sticky");
  CHECK(cudaGetLastError() == cudaErrorLaunchFailure && cudaGetLastError() == cudaErrorLaunchFailure, "cudaGetLastError resets a sticky error");
  CHECK(cudaStreamQuery(s) == cudaErrorLaunchFailure, "cudaStreamQuery");
  CHECK(cublasSnrm2(g_h, 4, d, 1, h) == CUBLAS_STATUS_EXECUTION_FAILED, "host-mode Snrm2 after the fault");
  muon_standin_reset_errors();
  CU(cudaDeviceSynchronize());
  CU(cudaMemcpy(h, d, 64 * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(h[0] == 1.0f && h[7] == 8.0f, "first kernel did not run: %g", h[0]);
  CHECK(h[8] == 0.0f && h[16] == 0.0f, "faulted / later kernels ran: %g %g", h[8], h[16]);
  CU(cudaStreamDestroy(s));
  CU(cudaFree(d));
}

/* =============================================================================================
   Several host threads at once (one global lock inside)
   ============================================================================================= */
static void *thread_body(void *arg) {
  int id = (int)(intptr_t)arg, it, bad = 0;
  float h[256], out[256];
  float *d = NULL;
  cudaStream_t s;
  if (cudaStreamCreate(&s) != cudaSuccess || cudaMalloc((void **)&d, sizeof h) != cudaSuccess) return (void *)1;
  for (it = 0; it < 200; it++) {
    fill_f(h, 256, (float)(id * 1000 + it));
    cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, s);
    launch_fill(s, d + 128, (float)it, 128);
    cudaMemcpyAsync(out, d, sizeof out, cudaMemcpyDeviceToHost, s);
    if (cudaStreamSynchronize(s) != cudaSuccess) bad = 1;
    if (out[0] != (float)(id * 1000 + it) || out[128] != (float)it || out[255] != (float)(it + 127)) bad = 1;
  }
  cudaFree(d);
  cudaStreamDestroy(s);
  return (void *)(intptr_t)bad;
}

static void test_threads(void) {
  pthread_t t[4];
  int i, bad = 0;
  TEST_CASE("four host threads, each on its own stream");
  for (i = 0; i < 4; i++) pthread_create(&t[i], NULL, thread_body, (void *)(intptr_t)i);
  for (i = 0; i < 4; i++) { void *r; pthread_join(t[i], &r); bad |= (int)(intptr_t)r; }
  CHECK(!bad, "a thread saw wrong data or an error");
}

/* ============================================================================================= */
int main(void) {
  test_fresh_process(); /* must come first: the children need a stand-in not yet initialised */
  test_segv();
  test_memory();
  test_copies();
  test_kernels();
  test_events();
  CB(cublasCreate(&g_h));
  test_handle();
  test_gemm_reference();
  test_gemm_bitwise();
  test_gemm_semantics();
  test_nrm2();
  test_injection();
  test_threads();
  TEST_CASE("everything freed");
  CB(cublasDestroy(g_h));
  CU(cudaDeviceSynchronize());
  CHECK(muon_standin_device_bytes() == 0, "%zu device bytes still allocated", muon_standin_device_bytes());
  return test_summary();
}
