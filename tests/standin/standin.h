/* standin.h - the CPU stand-in for the CUDA runtime and cuBLAS (tests/standin/cuda_standin.c).

   With no GPU, the CUDA backend is compiled a second time with the host compiler against the
   real toolkit headers and linked with cuda_standin.o instead of libcudart/libcublas. The
   stand-in is deliberately strict so that it fails where a GPU would:
     - device memory lives in one PROT_NONE arena that is readable/writable only while the
       stand-in itself executes queued work: a host dereference of a device pointer SEGFAULTs;
     - every asynchronous operation is queued on its stream and runs only when something
       synchronises with that stream: a missing sync reads stale data, deterministically;
     - errors found while executing queued work are sticky, as on a GPU.
   This header adds what the real headers lack: a kernel launch, and hooks for tests. The cudart
   and cuBLAS functions themselves are declared by <cuda_runtime_api.h> and <cublas_v2.h>. */
#ifndef MUON_STANDIN_H
#define MUON_STANDIN_H

#include <stddef.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Kernel launch --------------------------------------------------------------------------
   `kernel<<<grid, block, 0, stream>>>(args)` becomes
     muon_standin_launch(stream, grid, block, fn, &args, sizeof args)
   where fn(const void *args) is the kernel body for one thread: it reads the index globals
   below. The launch copies the args (at most MUON_STANDIN_MAX_ARGS bytes) and queues the kernel;
   when its stream is synchronised, fn runs once per (blockIdx, threadIdx), blocks in row order
   (x fastest) and threads in row order within each block, with the globals set before each call.
   Returns cudaErrorInvalidConfiguration for a bad shape (dims >= 1, block x*y*z <= 1024,
   grid.x <= 2^31-1, grid.y/z <= 65535), cudaErrorInvalidDeviceFunction for a NULL fn,
   cudaErrorInvalidValue for bad args, cudaErrorInvalidResourceHandle for an unknown stream;
   a failing launch is also what cudaGetLastError returns next. */
#define MUON_STANDIN_MAX_ARGS 32768
typedef void (*muon_standin_kernel)(const void *args);
cudaError_t muon_standin_launch(cudaStream_t stream, dim3 grid, dim3 block, muon_standin_kernel fn,
                                const void *args, size_t args_size);
extern dim3 muon_standin_threadIdx, muon_standin_blockIdx, muon_standin_blockDim, muon_standin_gridDim;

/* ---- Test hooks -----------------------------------------------------------------------------
   muon_standin_fail: the nth (1-based, counted from now) future call of `call` fails; nth 0
   clears. Names and failures:
     "cudaMalloc", "cudaMallocHost", "cudaHostAlloc"     -> cudaErrorMemoryAllocation
     "cudaStreamCreate", "cudaStreamCreateWithFlags",
     "cudaEventCreate", "cudaEventCreateWithFlags"       -> cudaErrorMemoryAllocation
     "cudaMemcpyAsync", "cudaMemsetAsync", "cudaMemcpy",
     "cudaMemset"                                        -> cudaErrorInvalidValue at the call
     "cublasCreate_v2"                                   -> CUBLAS_STATUS_ALLOC_FAILED
     "cublasGemmEx", "cublasGemmStridedBatchedEx",
     "cublasGemmBatchedEx", "cublasSgemm_v2",
     "cublasSnrm2_v2"                                    -> CUBLAS_STATUS_EXECUTION_FAILED at the call
     "kernel"  -> the nth valid launch returns cudaSuccess but its execution fails: the next
                  synchronising call returns cudaErrorLaunchFailure, and so does every later
                  one (sticky) until muon_standin_reset_errors.
   The environment variable MUON_STANDIN_FAIL="name:nth[,name:nth...]" is read at first use, so a
   test can inject into a child process. An unknown name is reported on stderr and ignored. */
void muon_standin_fail(const char *call, int nth);

/* Calls so far of a function, by the names above or any implemented function's name
   ("cudaFree", "cublasCreate_v2", ...); "kernel" counts launches, "flush" counts the times queued
   work was executed, "mprotect" counts protection changes of the arena. -1 for an unknown name. */
long long muon_standin_calls(const char *call);

/* Bytes currently allocated by cudaMalloc (requested sizes of live allocations). */
size_t muon_standin_device_bytes(void);

/* The schedule of synchronising calls: 0 (default) runs only what the call waits for; 1 first
   runs every stream on its own as far as its waits allow, so a consumer stream that lacks a wait
   for its producer runs ahead of it and reads stale data. Also MUON_STANDIN_AHEAD=1. */
void muon_standin_ahead(int on);

/* 1: pinned host memory (cudaMallocHost, cudaHostAlloc) is PROT_NONE while a kernel, GEMM or
   nrm2 runs, so one that reads or writes it SEGFAULTs; copies and the host use it as usual. A
   real GPU can reach pinned memory (UVA); this proves that code which promises explicit copies
   (muon_desc.state_on_host) makes them. Single-threaded tests only: another host thread using
   a pinned buffer while a kernel runs would fault too. Default 0. */
void muon_standin_pinned_private(int on);

/* Clears the sticky execution error and the last error (tests only). */
void muon_standin_reset_errors(void);

/* 1 if any fp32 GEMM ran with CUBLAS_COMPUTE_32F_FAST_TF32, or with CUBLAS_COMPUTE_32F under
   math mode CUBLAS_TF32_TENSOR_OP_MATH (the stand-in still computes in exact fp32). */
int muon_standin_tf32_used(void);

/* The stand-in's explanation of its most recent error, "" if none: which check failed and why.
   Set MUON_STANDIN_VERBOSE=1 to have every such message printed to stderr as it happens. */
const char *muon_standin_last_message(void);

/* ---- For other stand-ins (tests/standin/nccl_standin.c) -----------------------------------
   An external operation queued on a stream. When the stream reaches it, progress(arg) runs with
   the stand-in's lock held and the arena open (device memory readable and writable); it returns
   1 when the operation is complete, 0 when it cannot complete yet (it waits for another
   process). A stream stops at an incomplete operation, and so do streams that wait on an event
   behind it. Synchronising calls retry it until it completes, and abort the process with a
   message after MUON_STANDIN_HANG_S seconds (default 30), where a GPU would hang forever; a
   query retries it once (see cudaStreamQuery). release(arg), if set, runs once the operation is
   complete or discarded (after a sticky error). progress must not call the CUDA stand-in.
   Returns cudaErrorInvalidResourceHandle for an unknown stream. `what` names it in messages. */
typedef int (*muon_standin_progress)(void *arg);
cudaError_t muon_standin_enqueue(cudaStream_t stream, muon_standin_progress progress, void (*release)(void *arg),
                                 void *arg, const char *what);

/* 1 if [p, p + bytes) lies inside one live cudaMalloc block (bytes 0: p inside one), else 0. */
int muon_standin_is_device(const void *p, size_t bytes);

/* ---- NCCL stand-in (tests/standin/nccl_standin.c) ----------------------------------------
   Links instead of libnccl, next to the CUDA stand-in, with the real <nccl.h>: ncclGetVersion,
   ncclGetUniqueId, ncclCommInitRank(Config), ncclCommSplit, ncclCommFinalize/Destroy/Abort,
   ncclCommGetAsyncError, ncclGetErrorString, ncclGetLastError, ncclCommCount/UserRank/CuDevice,
   ncclGroupStart/End, ncclSend, ncclRecv, ncclAllGather; nothing else is defined. Ranks are local
   processes sharing POSIX shared memory; the model and its strictness are described at the top of
   nccl_standin.c.

   muon_standin_nccl_fail: the nth (1-based, counted from now) future occurrence fails; 0 clears.
     "ncclCommInitRankConfig" -> the nth init (ncclCommInitRank or ncclCommInitRankConfig) returns
                                 ncclSystemError before doing anything
     "ncclCommSplit"          -> the nth ncclCommSplit returns ncclSystemError before doing anything
                                 (a collective: inject on every rank, or the others wait)
     "ncclGroupEnd"           -> the nth group launch (an outermost ncclGroupEnd, or an operation
                                 issued outside a group) returns ncclSystemError; its operations
                                 are discarded
     "async"                  -> the nth group operation this process executes (when its stream
                                 first runs it) sets the async error ncclSystemError ("injected")
                                 on its communicator instead of completing
   The environment variable MUON_STANDIN_NCCL_FAIL="name:nth[,name:nth...]" is read at the first
   NCCL call of the process. An unknown name is reported on stderr and ignored. */
void muon_standin_nccl_fail(const char *call, int nth);

/* Calls so far of an implemented NCCL function, by name ("ncclSend", ...); "launch" counts group
   launches, "progress" the times queued group operations were driven. -1 for an unknown name. */
long long muon_standin_nccl_calls(const char *call);

/* The NCCL stand-in's explanation of its most recent error, "" if none. Mismatches and hang aborts
   are always printed to stderr; MUON_STANDIN_VERBOSE=1 prints every error as it happens. */
const char *muon_standin_nccl_last_message(void);

#ifdef __cplusplus
}
#endif

#endif /* MUON_STANDIN_H */
