/* muon.h - the Muon optimizer in one C99 header, on one device or many.

   USAGE
   -----
   In exactly ONE C or C++ file:

       #define MUON_IMPLEMENTATION
       #include "muon.h"

   everywhere else just #include "muon.h". Then:

       muon_desc desc = muon_default_desc();          // torch.optim.Muon's defaults
       desc.hparams.lr = 0.02f;
       muon_optimizer *opt;
       if (muon_create(&opt, &desc) != MUON_OK) ...    // message goes to desc.logger
       muon_matrix m = muon_default_matrix();
       m.name = "fc1"; m.param = w; m.grad = dw; m.rows = 256; m.cols = 784;
       muon_add_matrix(opt, &m, NULL);                 // hidden 2-D weights: Muon
       muon_adamw_param b = muon_default_adamw_param();
       b.name = "fc1.bias"; b.param = bias; b.grad = dbias; b.size = 256;
       muon_add_adamw_param(opt, &b, NULL);            // biases, norms, embeddings: AdamW
       for (step...) { forward_backward(); if (muon_step(opt) != MUON_OK) puts(muon_error(opt)); }
       muon_destroy(opt);

   DISTRIBUTED (see muon_gloo.h for a communicator, examples/ for every parallelism strategy):
   each rank registers the matrices it holds with param/grad pointing at its LOCAL piece, and
   describes the piece by a layout (muon_shard / muon_flat / muon_replicate / muon_partial
   levels), directly (muon_layout_config) or from its groups (muon_auto_config):

       muon_auto_desc ad = {0};
       ad.fsdp = &fsdp_comm; ad.tp = &tp_comm; ad.tp_dim = 0;
       muon_dist_config cfg = muon_auto_config(&ad);
       desc.comm = &world_comm; desc.dist = &cfg;

   Every matrix is then orthogonalised once in the world, by one owner rank: per round one
   alltoallv sends the pieces of U to the owners and one sends the pieces of O back. With
   ad.partial = 1 (DDP/CP gradients not all-reduced) the pieces sent are each rank's part of the
   gradient, summed by the owner, which alone keeps the momentum.

   VERIFYING A SETUP: muon_plan_text (who holds and owns what, bytes per step),
   muon_check_layouts (your layouts against the framework's own element positions),
   muon_gather_matrix and muon_dump_file (whole matrices, to compare a distributed run with one
   device using tools/muoncmp).

   A step, per matrix W (rows x cols) with gradient G and momentum B (torch.optim.Muon):
       B = mu*B + (1-mu)*G                     (or B = mu*B + G with MUON_MOMENTUM_SGD)
       U = nesterov ? (1-mu)*G + mu*B : B
       O = NewtonSchulz(U)                     (quintic iteration on U / max(|U|_F, eps))
       W = W*(1 - lr*wd) - adjust(lr, rows, cols)*O

   CONFIGURATION MACROS (define before the implementation include)
       MUON_USE_CBLAS      NS GEMMs through CBLAS (e.g. OpenBLAS, link -lopenblas); default: the
                           built-in portable blocked GEMM, no dependencies
       MUON_API            linkage of public functions (default: extern)
       MUON_NS_MAX_STEPS   capacity of the per-iteration coefficient table (default 16)
       MUON_MAX_LEVELS     most levels in a layout (default 8)
       MUON_NO_THREADS     leave out the POSIX thread pool (muon_cpu_desc.threads then needs its
                           own parallel_for, or a count of 1); otherwise link with -pthread

   SPEED
       The built-in GEMM is plain C written for the auto-vectoriser: build with -O3 -march=native
       (single-thread OpenBLAS sgemm at 1024^2 = 1: measured 0.59x with AVX2 + FMA, 0.98x with
       AVX-512, 0.16x at plain -O2). CBLAS is faster where installed; its thread count
       (OPENBLAS_NUM_THREADS) changes the bits, so keep it the same on every rank. Results are
       deterministic for a given binary; builds for CPUs with and without FMA differ in the last
       bits, so keep one binary across the ranks of a job.

   BACKENDS
       Computation (muon_compute): the CPU, in this header (desc.compute = NULL); muon_cuda.h for
       NVIDIA GPUs (cuBLAS Newton-Schulz, element-wise kernels), or your own (see "Compute
       backend" below). Communication (muon_comm): this header ships the single-rank case;
       muon_gloo.h (CPU clusters, also GPUs through host staging) and muon_nccl.h (GPUs, the
       exchange on the device) add more. The core only talks to them through vtables. With a GPU backend, param, grad, mirror and momentum buffers are
       GPU memory and muon never touches them from the host.

   WHAT A GPU TRAINER HANDS OVER (llm.c's train_gpt2.cu), per matrix or AdamW parameter:
       gradients fp32 or bf16 (grad_dtype); parameters fp32 master weights, optionally mirrored
       to a bf16 copy after each update (mirror), or bf16 alone (param_dtype), updated in fp32
       and rounded to nearest or stochastically (desc.rounding, desc.seed: bits depend only on
       seed, step, full name and the element's place in the full tensor, never on world size or
       layout); separate strides for stacked
       [L, rows, cols] param / grad / mirror / momentum buffers (ZeRO-1); a gradient scale
       (muon_set_grad_scale, e.g. the clipping factor); optionally the momentum in a buffer of
       the trainer's (muon_matrix.momentum).

   MEMORY
       Every step keeps O for this rank's matrices until all of them are computed (the stash,
       1x the local matrix parameters) plus one round of gathered operands and the NS
       workspace, allocated at planning: nothing is allocated inside muon_step, and a step that
       fails changes nothing.

   THREADS
       The CPU backend (muon_cpu_create) uses muon_cpu_desc.threads.count threads in muon_step
       (default: the environment's MUON_THREADS, else 1): its own POSIX pool, or your parallel_for
       (OpenMP, a framework's pool). Any count gives the same bits. With CBLAS, run OpenBLAS
       single-threaded (OPENBLAS_NUM_THREADS=1): muon's threads then call it side by side.

   THREAD SAFETY
       An optimizer is used by one thread at a time. Different optimizers are independent.

   ERRORS
       Every fallible call returns muon_status (MUON_OK == 0). muon_error(opt) gives the last
       message of that optimizer, naming the field, the matrix and its index. The library never
       prints, exits or aborts; set desc.logger to receive messages as they happen.

   FILE MAP (each section's banner holds its marker: grep '>>name')
       Declarations                          Implementation: the core in the order a step runs,
       >>status     muon_status              then the CPU backend
       >>hparams    muon_hparams, AdamW's    >>impl-defaults, >>impl-self, >>impl-optimizer
       >>hooks      allocator, logger        >>impl-memory    allocator, messages, checks
       >>comm       communicator vtable      >>impl-pieces    layouts -> pieces
       >>compute    compute vtable           >>impl-configs   muon_auto_config, layout_config
       >>cpu        the CPU backend's desc   >>impl-create    create, groups, registration
       >>layouts    levels, muon_layout      >>impl-compute-wrappers, >>impl-state-memory
                                               (host or device state), >>impl-serial,
       >>dist       muon_dist_config         >>impl-settings (what ranks share), >>impl-comm-wrappers
       >>optimizer  desc, matrices, step     >>impl-plan (-owners, -rounds, -build, -run),
       >>state      save, load, reshard        >>impl-normuon, >>impl-partial, >>impl-plan-text
       >>verify     plan text, dumps         >>impl-step      momentum, U, the verdicts
       >>qkclip     MuonClip's QK-clip       >>impl-agree     the per-step agreement
       >>ns         Newton-Schulz alone
       >>elementwise  formulas shared with   >>impl-xfer, >>impl-rounds, >>impl-adamw,
                      muon_cuda.h's kernels  >>impl-commit, >>impl-api-step (muon_step)
                                             >>impl-state, >>impl-files, >>impl-reshard,
                                             >>impl-verify, >>impl-qkclip
                                             >>impl-cpu-backend: >>impl-threads, >>impl-gemm,
                                               >>impl-ns, >>impl-cpu (its slots, vtable)
*/
#ifndef MUON_H
#define MUON_H

/* This header's version: major for changes that break a caller, a backend or a saved state,
   minor for additions, patch for fixes. Kept in step with tools/muon.pc.in and CHANGES.md. */
#define MUON_VERSION_MAJOR 1
#define MUON_VERSION_MINOR 0
#define MUON_VERSION_PATCH 0
#define MUON_VERSION_STRING "1.0.0"

#include <stddef.h>

#ifndef MUON_API
#define MUON_API extern
#endif
#if defined(__GNUC__) || defined(__clang__)
#define MUON__PRINTF_DECL(f, a) __attribute__((format(printf, f, a)))
#else
#define MUON__PRINTF_DECL(f, a)
#endif
#ifndef MUON_NS_MAX_STEPS
#define MUON_NS_MAX_STEPS 16
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* >>status ------------------------------------------------------------------------------------
   Status: one X-macro makes the enum and its strings so the two cannot drift. */
#define MUON_STATUS_LIST(X)                                                       \
  X(MUON_OK,            "ok")                                                     \
  X(MUON_ERR_ARG,       "invalid argument")                                       \
  X(MUON_ERR_SHAPE,     "invalid shape")                                          \
  X(MUON_ERR_ASSIGN,    "invalid owner assignment")                               \
  X(MUON_ERR_NOMEM,     "out of memory")                                          \
  X(MUON_ERR_COMM,      "communication failed")                                   \
  X(MUON_ERR_TIMEOUT,   "communication timed out")                                \
  X(MUON_ERR_NONFINITE, "non-finite gradient")                                    \
  X(MUON_ERR_MISMATCH,  "ranks disagree")                                         \
  X(MUON_ERR_BACKEND,   "backend error")                                          \
  X(MUON_ERR_STATE,     "invalid optimizer state")

#define MUON__STATUS_ENUM(name, text) name,
typedef enum muon_status { MUON_STATUS_LIST(MUON__STATUS_ENUM) MUON_STATUS_COUNT } muon_status;
#undef MUON__STATUS_ENUM

/* "MUON_ERR_SHAPE: invalid shape"; never NULL. */
MUON_API const char *muon_status_string(muon_status status);

/* >>hparams -----------------------------------------------------------------------------------
   Hyperparameters */
typedef enum muon_adjust_lr {
  MUON_ADJUST_LR_ORIGINAL = 0,     /* lr * sqrt(max(1, rows/cols))        (torch default) */
  MUON_ADJUST_LR_MATCH_RMS_ADAMW,  /* lr * 0.2 * sqrt(max(rows, cols))                    */
  MUON_ADJUST_LR_NONE,             /* lr                                                   */
  MUON_ADJUST_LR_SPECTRAL_UNCLAMPED /* lr * sqrt(rows/cols)  (torch 2.15's "spectral_unclamped") */
} muon_adjust_lr;

typedef enum muon_momentum_style {
  MUON_MOMENTUM_LERP = 0,          /* B = mu*B + (1-mu)*G; nesterov U = (1-mu)*G + mu*B (torch) */
  MUON_MOMENTUM_SGD                /* B = mu*B + G;        nesterov U = G + mu*B (Moonlight)   */
} muon_momentum_style;

typedef enum muon_precision {
  MUON_PRECISION_FP32 = 0,         /* Newton-Schulz entirely in fp32 (CPU default)             */
  MUON_PRECISION_BF16              /* rounds to bf16 where torch does: product inputs and
                                      outputs, the normalised X and its norm; fp32 accumulation */
} muon_precision;

typedef enum muon_ns_preset {
  MUON_NS_QUINTIC = 0,             /* Keller Jordan's (3.4445, -4.7750, 2.0315) every step      */
  MUON_NS_POLAR_EXPRESS            /* Amsel et al. 2025, per-iteration schedule                 */
} muon_ns_preset;

typedef enum muon_ns_algorithm {
  MUON_NS_STANDARD = 0,            /* X = a X + (b A + c A^2) X with A = X X^T, every iteration  */
  MUON_NS_GRAM                     /* Gram Newton-Schulz (Zhang, Amsel, Chen, Dao 2026): the same
                                      polynomial, iterated on the m x m Gram matrix R = X X^T and
                                      an accumulated Q (X_k = Q X_0), X = Q X_0 once at the end;
                                      restarts (ns_restarts) recompute X and R. Fewer flops when
                                      n >= 2m; squarer operands run MUON_NS_STANDARD. Not bitwise
                                      equal to it: the same math, rounded differently          */
} muon_ns_algorithm;

typedef enum muon_normuon {
  MUON_NORMUON_OFF = 0,            /* plain Muon (torch.optim.Muon)                              */
  MUON_NORMUON_ROWS,               /* NorMuon as the paper's reference (Li et al. 2025): a second
                                      moment per row of the matrix; O / (sqrt(v) + 1e-10), then
                                      times |O|_F / (|O'|_F + 1e-10)                             */
  MUON_NORMUON_LARGER              /* NorMuon as nanochat and modded-nanogpt keep it: per row when
                                      rows >= cols, else per column; O / sqrt(max(v, 1e-10)), then
                                      times |O|_F / max(|O'|_F, 1e-10). The formulas: muon__normuon */
} muon_normuon;

#define MUON_Q8_BLOCK 256   /* MUON_MOMENTUM_INT8's block: elements of the full matrix per scale */
typedef enum muon_momentum_format {
  MUON_MOMENTUM_FP32 = 0,          /* the momentum buffer holds fp32 (torch)                    */
  MUON_MOMENTUM_BF16,              /* bf16 (uint16_t, the top half of the fp32 bits): half the
                                      bytes. Each step widens it to fp32, computes the new
                                      momentum and U from that fp32 value, then stores the new
                                      momentum rounded to nearest even (never rounded in place
                                      on a value still in use). Per element, so the bits are
                                      the same on every layout and world size (docs/state.md) */
  MUON_MOMENTUM_INT8               /* 8-bit blockwise: blocks of 256 consecutive elements of the
                                      FULL matrix (row-major; the last may be shorter), each
                                      stored as 1 exponent byte E then its int8 values q: value =
                                      q * 2^(E - 127), the block's scale the smallest power of two
                                      with 127 * scale >= its absmax (at least 2^-126), q its
                                      value / scale rounded to nearest even. n + ceil(n / 256)
                                      bytes. Stepped in fp32 as bf16 is; power-of-two scales make
                                      int8 -> fp32 -> int8 exact. The blocks being the full
                                      matrix's, a matrix held in pieces keeps its momentum whole
                                      on its owner, as a Partial matrix does (docs/options.md) */
} muon_momentum_format;

typedef struct muon_hparams {
  float lr;                        /* 1e-3; may change between steps (muon_set_group)           */
  float weight_decay;              /* 0.1, decoupled, uses the unadjusted lr                    */
  int cautious_wd;                 /* 0; 1: decay only the elements where the weight and O have
                                      the same sign, zero agreeing with both (dion's cautious_wd,
                                      nanochat, modded-nanogpt): w = (w*O >= 0 ? w*(1 - lr*wd) : w)
                                      - adjusted_lr*O, the sign test on the weight before the step */
  float momentum;                  /* 0.95, in [0, 1)                                           */
  int nesterov;                    /* 1                                                         */
  muon_momentum_style momentum_style;
  muon_adjust_lr adjust_lr;
  int ns_steps;                    /* 5, in [1, MUON_NS_MAX_STEPS]                              */
  float ns_coefficients[MUON_NS_MAX_STEPS][3]; /* (a, b, c) of iteration k; muon_set_ns_preset */
  float eps;                       /* 1e-7: X / max(|X|_F, eps)                                 */
  muon_ns_algorithm ns_algorithm;  /* MUON_NS_STANDARD                                          */
  unsigned ns_restarts;            /* MUON_NS_GRAM: bit k restarts before iteration k, 1 <= k <
                                      ns_steps (X = Q X_0, R = X X^T, Q = I); default 1 << 2, the
                                      restart at iteration 2 of the authors' reference and dion  */
  muon_precision precision;
  muon_normuon normuon;            /* MUON_NORMUON_OFF. After Newton-Schulz, on the owner: each
                                      row's (or column's) mean square q of O, v = lerp(v, q,
                                      1 - normuon_beta2), O scaled per row by 1/sqrt(v) and back to
                                      its Frobenius norm. v (one float per row or column) is owner
                                      state: saved, loaded, resharded, moved when owners change  */
  float normuon_beta2;             /* 0.95, in [0, 1)                                            */
  /* How, not what: changes speed (and, on CBLAS and cuBLAS, the last bits), never the math.
     Honoured by every backend, so it is a group's setting, agreed across ranks (the owner's
     choice must not decide the bits) and saved with the group. */
  int symmetric;                   /* 1: X*X^T and A*A compute one triangle (fewer flops)       */
  /* How the momentum is stored (MUON_MOMENTUM_FP32). Fixed once a matrix of the group is
     registered (its buffer is allocated in it): muon_set_group may not change it then, and a
     loaded state's momentum converts to it. Not with muon_matrix.momentum (the trainer's
     float buffer): muon allocates the stored form itself. */
  muon_momentum_format momentum_format;
} muon_hparams;

/* torch.optim.Muon's defaults (and MUON_NS_QUINTIC, symmetric products), except precision: fp32
   here, where torch runs Newton-Schulz in bf16 (MUON_PRECISION_BF16 rounds as torch does). */
MUON_API muon_hparams muon_default_hparams(void);
/* Fills hp->ns_coefficients with a preset for all MUON_NS_MAX_STEPS iterations; keeps ns_steps.
   MUON_ERR_ARG (hp unchanged) for an unknown preset. */
MUON_API muon_status muon_set_ns_preset(muon_hparams *hp, muon_ns_preset preset);

typedef struct muon_adamw_hparams {
  float lr;                        /* 1e-3  */
  float beta1, beta2;              /* 0.9, 0.999 */
  float eps;                       /* 1e-8, added outside the sqrt */
  float weight_decay;              /* 0.01, decoupled */
  int cautious_wd;                 /* 0; 1: decay only where the weight and the Adam update
                                      m_hat / (sqrt(v_hat) + eps) have the same sign (zero agrees) */
} muon_adamw_hparams;

/* torch.optim.AdamW's defaults. */
MUON_API muon_adamw_hparams muon_default_adamw_hparams(void);

/* >>hooks -------------------------------------------------------------------------------------
   Hooks: allocator and logger, each with user data; all fields or none. */
typedef struct muon_allocator {
  void *(*alloc)(size_t size, void *user_data);
  void (*free)(void *ptr, void *user_data);
  void *user_data;
} muon_allocator;

typedef enum muon_log_level { MUON_LOG_ERROR = 0, MUON_LOG_WARN, MUON_LOG_INFO } muon_log_level;

typedef struct muon_logger {
  void (*func)(muon_log_level level, const char *message, void *user_data);
  void *user_data;
} muon_logger;

/* What to do with a non-finite verdict: a gradient holding NaN or Inf, a non-finite Newton-Schulz
   output, or finite values whose update would overflow (a momentum, AdamW moment, NorMuon second
   moment, parameter or its bf16 copy that would become NaN or Inf). A step with MUON_OK never
   leaves a state muon_state_load refuses, nor a non-finite parameter. */
typedef enum muon_nonfinite {
  MUON_NONFINITE_ERROR = 0,        /* the step returns MUON_ERR_NONFINITE, nothing is applied   */
  MUON_NONFINITE_SKIP              /* that matrix (or AdamW param, matched by name) is skipped
                                      this step on every rank that holds a piece of it         */
} muon_nonfinite;

/* >>comm --------------------------------------------------------------------------------------
   Communicator: one process group, as a vtable + context (SQLite VFS / ggml style). A backend
   (muon_gloo.h, muon_nccl.h, or your framework) fills the vtable; the core never knows which one
   it talks to and calls it only through wrappers that check and count. Every slot takes ctx first
   and returns muon_status; a failing slot should leave its native message for `error`.

   Growing a vtable (this one and muon_compute_vtable). Both are at version 1 for muon 1.0. A new
   slot is appended at the end, never inserted, and the table's MUON_*_VTABLE_VERSION goes up by
   one; the slot's comment names that version and what the core does without it. A table says
   which version it was written for; muon_create accepts 1 up to this header's (both numbers in
   the message otherwise), and the core reads a slot appended later only through MUON__SLOT, which
   gives NULL for an older table. Instances name each slot in a comment beside it, as this file's
   do (designated initialisers are not C++17). */
#define MUON_COMM_VTABLE_VERSION 1

/* Where a buffer lives, from the core's point of view. */
#define MUON_MEMORY_HOST 0
#define MUON_MEMORY_DEVICE 1

typedef struct muon_comm_vtable {
  int version;                     /* MUON_COMM_VTABLE_VERSION the table was written for       */
  /* Required. Starts one exchange: each rank sends send_counts[p] floats at send +
     send_displs[p] to rank p and receives recv_counts[p] floats from p at recv +
     recv_displs[p]. Zero counts are allowed; the part sent to oneself is copied. The exchange
     comes after everything the compute queue holds so far. A blocking communicator (queued = 0)
     has finished it on return; a queued one (queued = 1: NCCL on a stream, Gloo's posted sends
     and receives) may only have queued it, and the compute queue does not wait for it until
     join. *ticket names the exchange for join (-1 is fine where join has nothing to do). */
  muon_status (*alltoallv)(void *ctx, const float *send, const size_t *send_counts,
                           const size_t *send_displs, float *recv, const size_t *recv_counts,
                           const size_t *recv_displs, int *ticket);
  /* The compute queue waits for exchange `ticket`: on the device for a device communicator
     (the host does not block), by blocking, within the backend's timeout, for a host one. The
     core joins every exchange once, in any order, before the compute backend touches its
     buffers, and keeps at most 16 unjoined. Required when queued; NULL: nothing to wait for. */
  muon_status (*join)(void *ctx, int ticket);
  /* Blocks until every exchange started so far has finished, within the backend's timeout (each
     is still joined once after); on a timeout or a peer's failure breaks the communicator (so
     nothing queued can hang) and returns MUON_ERR_TIMEOUT / MUON_ERR_COMM. The core calls it before a host wait on the
     compute backend that follows an exchange, so a dead peer is an error, not a hang. Required
     when queued; NULL: nothing is ever left running. */
  muon_status (*finish)(void *ctx);
  /* Required. Each rank contributes `bytes` bytes; recv gets size*bytes in rank order. Blocking. */
  muon_status (*allgather)(void *ctx, const void *send, void *recv, size_t bytes);
  /* Optional: the native text of the last failure (NULL or "" if none). */
  const char *(*error)(void *ctx);
  /* Optional: frees ctx; called by muon_comm_destroy. */
  void (*destroy)(void *ctx);
  /* Where alltoallv's buffers live: MUON_MEMORY_HOST (0) or MUON_MEMORY_DEVICE (the compute
     backend's memory, e.g. NCCL). With a host communicator and a device compute backend the core
     stages the exchange through host buffers. allgather always takes host memory: it carries
     only small control data. */
  int memory;
  /* 1: alltoallv may return before its exchange has finished (join and finish complete it). With
     muon_dist_config.async the core then keeps several exchanges in flight on the
     communicator's own queue; a blocking host communicator (0) gets a host thread instead. */
  int queued;
} muon_comm_vtable;

typedef struct muon_comm {
  const muon_comm_vtable *vt;
  void *ctx;
  int rank, size;
} muon_comm;

/* The one-rank communicator (rank 0 of 1): what a NULL desc.comm means. */
MUON_API muon_comm muon_comm_self(void);
/* One alltoallv on c (arguments as the slot's), finished when it returns: alltoallv, join and,
   for a queued communicator, finish. For a trainer's own exchanges over muon's communicator. */
MUON_API muon_status muon_comm_alltoallv(const muon_comm *c, const float *send, const size_t *send_counts,
                                         const size_t *send_displs, float *recv, const size_t *recv_counts,
                                         const size_t *recv_displs);
/* Calls vt->destroy if set and clears *comm. */
MUON_API void muon_comm_destroy(muon_comm *comm);

/* >>compute -----------------------------------------------------------------------------------
   Compute backend: where the step's arithmetic runs and where its buffers live, as a vtable +
   context like the communicator. NULL desc.compute is the CPU backend in this header
   (muon_compute_cpu()); muon_cuda.h fills one for NVIDIA GPUs. The slots are whole operations of
   a step, not a BLAS, so a third party (HIP, Metal, a framework's allocator) implements about a
   dozen functions. The core reaches them only through wrappers that check and count.

   Memory. "Backend memory" is what `alloc` returns; with `memory == MUON_MEMORY_DEVICE` the core
   never dereferences it, nor the user's param / grad / mirror / momentum buffers, which must then
   be backend memory too. "Host memory" is ordinary memory the core reads and writes.
   Ordering. Every slot that takes backend memory runs in call order on one queue (a CUDA stream):
   a slot may return before its work is done. Results are visible to the host only after `sync`
   returns MUON_OK. Host arguments (ops, args structs) are read before a slot returns; only the
   host buffer of a `copy` may be used until the next `sync`, and the core leaves it unchanged
   until then. Errors may surface late: a slot or
   `sync` that returns non-OK means the step is abandoned, and the core then changes nothing the
   user can see (every write before the commit goes to the backend's scratch buffers).
   Element types. float is fp32; bf16 is stored as uint16_t (the top half of the fp32 bits). */
#define MUON_COMPUTE_VTABLE_VERSION 1   /* see "Growing a vtable" above */

typedef enum muon_dtype {
  MUON_DTYPE_FP32 = 0,
  MUON_DTYPE_BF16                  /* bfloat16, uint16_t storage                               */
} muon_dtype;

/* Rounding of a bf16 result (a bf16 parameter, or the bf16 mirror of an fp32 one). */
typedef enum muon_rounding {
  MUON_ROUND_NEAREST = 0,          /* to nearest, ties to even                                 */
  MUON_ROUND_STOCHASTIC            /* up with probability proportional to the distance; the
                                      random bits depend only on (seed, step, full name, the
                                      element's index in the full matrix or AdamW tensor), for
                                      matrices and AdamW params alike: never on launch shape,
                                      world size, layout or layout key */
} muon_rounding;

/* A piece of a matrix and the Newton-Schulz operand of the whole matrix it belongs to. The piece
   is elements [f0, f1) of the row-major flattening of the h x w rectangle at (r0, c0) of the
   rows x cols matrix; its element k (0 <= k < f1 - f0), with f = f0 + k, is at
     row = r0 + f / w,  col = c0 + f % w,
   and is stored at pieces[piece + k]. The operand is the matrix itself (rows <= cols) or its
   transpose (rows > cols), row-major at operands[operand]: element (row, col) sits at
     operand + (rows <= cols ? row * cols + col : col * rows + row). */
typedef struct muon_piece_copy {
  long long r0, c0, h, w, f0, f1;
  int rows, cols;
  size_t piece, operand;           /* offsets in floats                                        */
} muon_piece_copy;

/* Momentum of n elements (one local piece). With g = grad_scale * grad[i] (grad in grad_dtype):
     lerp: B' = B + (1-mu)(g - B);  U = nesterov ? g + mu(B' - g) : B'
     sgd:  B' = mu B + g;           U = nesterov ? g + mu B' : B'
   exactly as muon__momentum_elem computes them, in fp32. */
typedef struct muon_momentum_args {
  float mu;
  int nesterov;
  int sgd;                         /* MUON_MOMENTUM_SGD                                        */
  float grad_scale;                /* 1: none (e.g. the trainer's clipping factor)             */
  muon_dtype grad_dtype;
} muon_momentum_args;

/* The update of n elements of one local piece: p = p*decay - step*O, in fp32 (exactly as
   muon__apply_elem), then stored as param_dtype; a bf16 mirror gets the rounded new value.
   Rounding to bf16 follows `rounding`; for MUON_ROUND_STOCHASTIC the bits of element i come
   from muon_random_bits(seed, index) where index is the element's row * cols + col in the full
   matrix: the piece (as in muon_piece_copy, offsets unused) says where element i sits. */
typedef struct muon_apply_args {
  float decay, step;
  muon_dtype param_dtype;
  void *mirror;                    /* optional bf16 copy of the new parameter, n elements      */
  muon_rounding rounding;
  unsigned long long seed;         /* already mixed with the step and the matrix by the core   */
  muon_piece_copy piece;           /* where element i sits in the full matrix                  */
  int cautious;                    /* decay only where p and O agree in sign (p*O >= 0, zero
                                      agreeing), as muon__apply_elem                            */
} muon_apply_args;

/* AdamW (torch semantics) of n elements; step_size = lr / (1 - beta1^t), bc2_sqrt =
   sqrt(1 - beta2^t), decay = 1 - lr * weight_decay; g = grad_scale * grad[i]. */
typedef struct muon_adamw_args {
  float beta1, beta2, eps, decay, step_size, bc2_sqrt, grad_scale;
  muon_dtype grad_dtype, param_dtype;
  void *mirror;                    /* optional bf16 copy of the new parameter                  */
  muon_rounding rounding;
  unsigned long long seed;         /* stochastic bits of element i: muon_random_bits(seed,
                                      offset + i)                                              */
  unsigned long long offset;       /* element 0's index in the full (flattened) parameter      */
  int cautious;                    /* decay only where p and the Adam update agree in sign, as
                                      muon__adamw_elem                                           */
} muon_adamw_args;

typedef struct muon_compute_vtable {
  int version;                     /* MUON_COMPUTE_VTABLE_VERSION the table was written for    */
  int memory;                      /* MUON_MEMORY_HOST or MUON_MEMORY_DEVICE (see above)       */
  /* Required. Backend memory of `bytes` bytes (> 0), aligned for any element type; NULL if
     there is none. Called only outside muon_step (creation, registration, planning). */
  void *(*alloc)(void *ctx, size_t bytes);
  void (*free)(void *ctx, void *ptr);
  /* Optional: host memory the backend copies to and from fastest (CUDA: pinned), for staging an
     exchange through a host communicator. NULL: the core uses its allocator. */
  void *(*alloc_host)(void *ctx, size_t bytes);
  void (*free_host)(void *ctx, void *ptr);
  /* Required. Copies `bytes` bytes; `to_host`: dst is host memory and src backend memory,
     `from_host`: the reverse, both 0: both backend memory. Ordered; dst is valid for the host
     after the next sync. The regions do not overlap. */
  muon_status (*copy)(void *ctx, void *dst, const void *src, size_t bytes, int to_host, int from_host);
  /* Required. Sets `bytes` bytes of backend memory to zero. */
  muon_status (*zero)(void *ctx, void *dst, size_t bytes);
  /* Required. For each of the n ops (host memory): to_operand ? operand element = piece element
     : piece element = operand element, for every element of the piece (see muon_piece_copy).
     pieces and operands are backend memory; no element is both read and written, and no two ops
     write one element. */
  muon_status (*pack)(void *ctx, const muon_piece_copy *ops, int n, float *pieces, float *operands, int to_operand);
  /* Required. Momentum of n elements (see muon_momentum_args). update != 0: the momentum
     buffer becomes B' and u (if not NULL) gets U. update == 0: u gets U, the buffer is left as
     it is. u does not overlap the others. */
  muon_status (*momentum)(void *ctx, size_t n, float *momentum, const void *grad,
                          const muon_momentum_args *a, int update, float *u);
  /* Required. Bytes of workspace newton_schulz needs for `batch` m x n operands (m <= n). */
  size_t (*ns_workspace)(void *ctx, int batch, int m, int n, const muon_hparams *hp);
  /* Required. Orthogonalises, in place, `batch` operands X + b*m*n (b < batch), each m x n
     row-major with m <= n, as section "Newton-Schulz" of this file defines it for hp (steps,
     coefficients, eps, precision; gemm and symmetric are hints). ws: ns_workspace bytes of
     backend memory. The result of one operand must not depend on batch or on the others. */
  muon_status (*newton_schulz)(void *ctx, float *X, int batch, int m, int n, const muon_hparams *hp, void *ws);
  /* Required. The update of one local piece (see muon_apply_args); param is in a->param_dtype. */
  muon_status (*apply)(void *ctx, size_t n, void *param, const float *O, const muon_apply_args *a);
  /* Required. AdamW of n elements; param in a->param_dtype, grad in a->grad_dtype. */
  muon_status (*adamw)(void *ctx, size_t n, void *param, const void *grad, float *m, float *v,
                       const muon_adamw_args *a);
  /* Required. *flag (backend memory) = 1 if any of the n elements of x is NaN or Inf, else 0.
     Must not be fooled by -ffast-math: test the exponent bits. */
  muon_status (*nonfinite)(void *ctx, const void *x, muon_dtype dtype, size_t n, int *flag);
  /* Required. dst[i] = src[i] converted (to bf16: nearest even); both backend memory. */
  muon_status (*cast)(void *ctx, void *dst, muon_dtype dst_dtype, const void *src, muon_dtype src_dtype, size_t n);
  /* Required. Waits for everything queued; returns the first failure since the last sync. */
  muon_status (*sync)(void *ctx);
  /* Optional: the native text of the last failure. */
  const char *(*error)(void *ctx);
  /* Optional: frees ctx; called by muon_compute_destroy. */
  void (*destroy)(void *ctx);
  /* Required. NorMuon of one orthogonalised operand X (m x n row-major, m <= n)
     in place, exactly as muon__normuon: the statistics are kept per column of X (per_column,
     len = n) or per row (len = m); v (len floats) is the second moment before this step and is
     only read, v_new (len floats) gets the new one. hp->normuon picks the epsilons,
     hp->normuon_beta2 the average. All backend memory. */
  muon_status (*normuon)(void *ctx, float *X, int m, int n, int per_column, const float *v, float *v_new,
                         const muon_hparams *hp);
  /* Optional. Newton-Schulz of `count` operands of any shapes, each exactly as
     newton_schulz gives it alone: operand i is X[i] (backend memory), m[i] x n[i] with
     m[i] <= n[i], settings hp[i] (the arrays are host memory). The backend may run them in any
     order or side by side (the CPU backend balances CBLAS operands over its threads). ws:
     at least ns_workspace(ctx, count, m[i], n[i], hp[i]) bytes for every i. NULL: the core
     calls newton_schulz once per run of same-shaped operands. */
  muon_status (*newton_schulz_many)(void *ctx, int count, float *const *X, const int *m, const int *n,
                                    const muon_hparams *const *hp, void *ws);
  /* Optional. QK-clip's scaling (muon_qk_clip) of n elements of one local piece: p = p * factor
     in fp32, stored as a->param_dtype, and a->mirror gets the new value, both rounded to bf16 as
     apply rounds (a->piece places element i; a->decay, a->step and a->cautious are unused), as
     muon__scale_store. NULL: on a host backend the core scales the buffers itself; a device
     backend without it cannot clip (muon_qk_clip returns MUON_ERR_BACKEND, nothing scaled). */
  muon_status (*scale)(void *ctx, size_t n, void *param, float factor, const muon_apply_args *a);
  /* Optional. MUON_MOMENTUM_INT8's blocks (see there) of n values from a block boundary:
     to_int8 ? blocks = values quantised (per block: absmax, E, then each q) : values = blocks
     dequantised, exactly as muon__q8_encode / muon__q8_decode. blocks holds n + ceil(n / 256)
     bytes; both backend memory, not overlapping. NULL: on a host backend the core runs those
     formulas itself; a device backend without it cannot hold 8-bit momentum (muon_add_matrix
     returns MUON_ERR_BACKEND for a matrix of such a group). */
  muon_status (*blockwise)(void *ctx, int to_int8, size_t n, float *values, void *blocks);
} muon_compute_vtable;

typedef struct muon_compute {
  const muon_compute_vtable *vt;
  void *ctx;
} muon_compute;

/* >>cpu ---------------------------------------------------------------------------------------
   The CPU backend of this header: its threads and its GEMM are its own settings, as a GPU
   backend's device and streams are its own. A NULL desc.compute is a CPU backend with the
   defaults (threads: the environment's MUON_THREADS, else 1), owned by the optimizer. */
typedef enum muon_gemm {
  MUON_GEMM_AUTO = 0,              /* CBLAS when compiled with MUON_USE_CBLAS, else built-in    */
  MUON_GEMM_BUILTIN,               /* the portable blocked GEMM of this header                  */
  MUON_GEMM_CBLAS                  /* CBLAS; MUON_ERR_ARG if not compiled with MUON_USE_CBLAS   */
} muon_gemm;

/* Same-shape Newton-Schulz operands run side by side, a lone large one has its built-in GEMMs
   split by rows; with CBLAS (never split) a round's operands of all shapes are spread over the
   threads, largest first, each to the least loaded one (on one device a round holds 64 MiB of
   operands per thread, up to 4); element-wise work (momentum, update, AdamW) is split in
   ranges: no sum ever depends on the split, so the bits are the same for any count. */
typedef void (*muon_task_fn)(void *arg, int task);
typedef struct muon_threads {
  int count;        /* most threads a step uses; 0: environment MUON_THREADS, else 1            */
  /* Optional: runs fn(arg, t) for every t in [0, n), n <= count, concurrently where it can, and
     returns when all have returned (an OpenMP "parallel for", a framework's pool). Tasks never
     share memory they write. NULL: muon's own POSIX thread pool, started by muon_cpu_create
     (compiled out by MUON_NO_THREADS, where count must then be 1). */
  void (*parallel_for)(void *user, int n, muon_task_fn fn, void *arg);
  void *user;
} muon_threads;

typedef struct muon_cpu_desc {
  muon_threads threads;            /* zeroed: MUON_THREADS or 1                                 */
  muon_gemm gemm;                  /* MUON_GEMM_AUTO. Which GEMM changes the last bits: keep one
                                      choice (and one build) on every rank of a job              */
  muon_allocator allocator;        /* the context, the pool and backend memory; zeroed: malloc  */
} muon_cpu_desc;

/* Zeroed threads (MUON_THREADS or 1), MUON_GEMM_AUTO. */
MUON_API muon_cpu_desc muon_cpu_default_desc(void);
/* Creates a CPU backend (desc NULL: the defaults) with its thread pool. Destroy it with
   muon_compute_destroy, after every optimizer that uses it. On failure *out is cleared and
   muon_error(NULL) says why. */
MUON_API muon_status muon_cpu_create(muon_compute *out, const muon_cpu_desc *desc);
/* The CPU backend's vtable with a NULL context: one thread, MUON_GEMM_AUTO, nothing to destroy
   (a base for wrapping backends in tests). */
MUON_API muon_compute muon_compute_cpu(void);
/* Calls vt->destroy if set and clears *compute. */
MUON_API void muon_compute_destroy(muon_compute *compute);
/* The 32 random bits stochastic rounding uses for one element: a pure function. */
MUON_API unsigned muon_random_bits(unsigned long long seed, unsigned long long index);

/* >>layouts -----------------------------------------------------------------------------------
   Layouts (the C analogue of a DTensor placement list). A matrix's layout is an ordered list of
   levels: the first splits the full matrix over its group, each next one splits the piece the
   previous level left on this rank. Gathering undoes the last level first. A level needs only
   the size of its group and this rank's index in it (muon_shard(dim, &tp_comm) fills both). */
#ifndef MUON_MAX_LEVELS
#define MUON_MAX_LEVELS 8
#endif

typedef enum muon_placement {
  MUON_REPLICATE = 0,              /* every rank of the group holds the whole piece (DDP, CP)   */
  MUON_SHARD,                      /* split `dim` (0 rows, 1 cols) in torch.chunk chunks:
                                      ceil(d/size) each, the last ones short or empty           */
  MUON_FLAT,                       /* a contiguous range of the row-major flattened piece
                                      (FSDP1 / ZeRO flat buffers); may cut rows                 */
  MUON_PARTIAL                     /* every rank of the group holds the whole piece, as with
                                      REPLICATE, but its gradient is only its own part (DDP or
                                      CP gradients before their all-reduce): see below          */
} muon_placement;

/* MUON_PARTIAL: the gradient is the sum (or mean) of the group's parts. muon adds them up on the
   way to the matrix's owner, in the order of the ranks' index in the group (with several PARTIAL
   levels: the first level's index most significant), so the result is bitwise that of one
   device given the parts summed in that order. MEAN multiplies the sum by 1/size (folded into
   grad_scale: g = (grad_scale * (1.0f / size)) * sum). The momentum then lives on the owner
   alone, whole (muon_get_momentum: rows x cols floats there, none elsewhere), and every rank
   gets O back. Needs muon's own exchange (not muon_dist_config.gather). */
typedef enum muon_reduce {
  MUON_REDUCE_SUM = 0,
  MUON_REDUCE_MEAN
} muon_reduce;

typedef struct muon_level {
  muon_placement placement;
  int dim;                         /* MUON_SHARD: 0 or 1                                        */
  muon_reduce reduce;              /* MUON_PARTIAL: sum or mean of the group's parts            */
  int size;                        /* ranks in this level's group                               */
  int index;                       /* this rank's index in that group                           */
  long long offset, length;        /* MUON_FLAT: this rank's range; length < 0 = chunk split
                                      [index*c, (index+1)*c) with c = ceil(piece/size)          */
} muon_level;

typedef struct muon_layout {
  int n_levels;                    /* 0: the whole matrix is on this rank                       */
  muon_level levels[MUON_MAX_LEVELS];
  long long key;                   /* matrices are matched across ranks by (name, key): give
                                      different experts / pipeline stages different keys        */
} muon_layout;

/* Level constructors; group NULL means a group of one. */
MUON_API muon_level muon_shard(int dim, const muon_comm *group);
MUON_API muon_level muon_flat(const muon_comm *group);
MUON_API muon_level muon_flat_range(const muon_comm *group, long long offset, long long length);
MUON_API muon_level muon_replicate(const muon_comm *group);
MUON_API muon_level muon_partial(const muon_comm *group, muon_reduce reduce);

/* >>dist --------------------------------------------------------------------------------------
   Distribution: which rank orthogonalises each matrix, and how U and O move.
   Every rank sees the same global list of matrices (the union of what ranks registered, matched
   by name and layout key, in order of first appearance by rank) and computes the same owners. */
typedef struct muon_matrix_info {
  int index;                       /* global index, the same on every rank                      */
  const char *name;
  int rows, cols;
  int local;                       /* this rank's matrix index (muon_add_matrix), -1 if none    */
  size_t local_size;               /* floats this rank holds                                    */
  int n_holders;                   /* ranks holding a non-empty piece                           */
  const int *holders;              /* ascending                                                 */
} muon_matrix_info;

struct muon_matrix;
struct muon_adamw_param;

/* The number format of the exchange (U to the owners, O back). */
typedef enum muon_wire {
  MUON_WIRE_AUTO = 0,              /* bf16 where it changes no bit: every group runs BF16
                                      Newton-Schulz (its input is rounded to bf16 first and its
                                      output is bf16) without NorMuon, and no matrix is Partial
                                      (its parts are summed first); else fp32                   */
  MUON_WIRE_FP32,
  MUON_WIRE_BF16                   /* always bf16: half the bytes; with fp32 Newton-Schulz U and O
                                      are rounded on the way, which changes the numerics        */
} muon_wire;

typedef struct muon_dist_config {
  /* Optional: owner[i] of each of the n global matrices, identical on every rank and among
     m[i].holders. NULL: balanced by Newton-Schulz flops, largest first. Either way a Partial
     matrix whose momentum a holder already keeps stays with that holder. */
  muon_status (*assign)(void *state, const muon_matrix_info *m, int n, int world_size, int *owner);
  /* Optional pair, the escape hatch for custom frameworks: move one matrix yourself. gather gets
     this rank's local U (local_size floats; NULL if none) and, on the owner only, `full` to fill
     (rows x cols); redistribute gets `full` O on the owner and fills this rank's local piece.
     Both are called on every rank for every matrix, in global order. NULL: muon's batched
     exchange over desc.comm, driven by the layouts. */
  muon_status (*gather)(void *state, const muon_matrix_info *m, const float *local, float *full, int owner);
  muon_status (*redistribute)(void *state, const muon_matrix_info *m, const float *full, float *local, int owner);
  /* Optional: the layout of this rank's matrix `index`, called by muon_add_matrix for a matrix
     without its own muon_matrix.layout. NULL: the whole matrix. */
  muon_status (*layout)(void *state, int index, const struct muon_matrix *m, muon_layout *out);
  /* Optional: the same for AdamW params without their own muon_adamw_param.layout (PARTIAL
     levels only; a stack's pieces one by one, each as its own param). NULL: none. */
  muon_status (*adamw_layout)(void *state, int index, const struct muon_adamw_param *p, muon_layout *out);
  void *state;
  int round_robin;                 /* default owners: round-robin over holders (debugging)      */
  size_t round_bytes;              /* gathered bytes per owner per exchange round; 0 = 64 MiB    */
  int unchecked_commit;            /* 1: no commit vote (one allgather less per step). A rank that
                                      fails late (its backend, a non-finite O it owns) then stops
                                      alone while the others apply, and what they apply for the
                                      matrices that rank owns is meaningless. Reload a checkpoint
                                      on every rank after such an error. 0 (default): all apply
                                      or none does */
  muon_wire wire;                  /* the exchange's number format (MUON_WIRE_AUTO)             */
  /* Overlap. prefetch: exchange rounds
     whose U is gathered ahead of the round being orthogonalised, 0 to 8. async: 1 overlaps the
     collectives with Newton-Schulz. A queued communicator (vt->queued: Gloo's posted
     exchanges, NCCL on its own stream) runs them on its own queue, several in flight at once,
     each joined only where its buffers are read; a blocking host communicator runs them on a
     thread of their own, one at a time; a blocking device communicator ignores it. With either, rounds default to a size that gives several per step. Both 0 (the
     default, the debug setting): every exchange and every Newton-Schulz in sequence. No
     setting changes a bit; ranks must agree on prefetch. */
  int prefetch;
  int async;
} muon_dist_config;

/* Layouts from the usual parallelism groups (as torch's DeviceMesh names them). Levels, first to
   last: REPLICATE (PARTIAL with `partial`) over ddp, cp and replicate (HSDP); REPLICATE over ep
   (dense matrices only); SHARD(tp dim) over tp; SHARD(0) (or FLAT with fsdp_flat) over fsdp and
   shard (HSDP). Expert matrices and pipeline
   stages get distinct layout keys, so they are owned inside their EP / PP group. The returned
   config points at *desc, which must stay valid while matrices are being added. */
typedef struct muon_auto_desc {
  const muon_comm *fsdp;           /* FSDP / ZeRO group                                         */
  int fsdp_flat;                   /* 1: FLAT ranges over fsdp (FSDP1, llm.c ZeRO-1)            */
  const muon_comm *tp;
  int tp_dim;                      /* 0: split rows (Megatron column-parallel [out, in] weights),
                                      1: split columns (row-parallel), -1: replicated over tp   */
  const int *tp_dim_per_matrix;    /* optional, per local matrix index; overrides tp_dim        */
  const muon_comm *ddp, *cp;       /* replicas                                                  */
  int partial;                     /* 1: the gradients over ddp, cp and replicate are not reduced
                                      (each rank has only its own): PARTIAL levels over them, so
                                      muon sums them on the way to the owners and the trainer
                                      drops its all-reduce; AdamW params registered whole
                                      (offset and full_size 0) get them too, a ZeRO piece not  */
  muon_reduce reduce;              /* with partial: the gradient is their sum or their mean     */
  const muon_comm *shard, *replicate; /* HSDP                                                   */
  const muon_comm *ep;
  const int *expert_of_matrix;     /* per local matrix index: expert id, -1 = dense             */
  const muon_comm *pp;             /* the matrices of a stage never leave it                    */
  int round_robin;
  size_t round_bytes;
  int unchecked_commit;
  muon_wire wire;
  int prefetch, async;
} muon_auto_desc;

MUON_API muon_dist_config muon_auto_config(const muon_auto_desc *desc);
/* Every matrix carries its own muon_matrix.layout (DTensor placements, given explicitly). */
MUON_API muon_dist_config muon_layout_config(void);

/* >>optimizer ---------------------------------------------------------------------------------
   The optimizer */
typedef struct muon_optimizer muon_optimizer;

typedef struct muon_desc {
  muon_hparams hparams;            /* group 0 of the Muon matrices                              */
  muon_adamw_hparams adamw;        /* group 0 of the AdamW parameters                           */
  muon_nonfinite on_nonfinite;
  muon_allocator allocator;        /* zeroed: malloc/free                                       */
  muon_logger logger;              /* zeroed: silent                                            */
  const muon_comm *comm;           /* NULL: one rank. Copied.                                   */
  const muon_dist_config *dist;    /* NULL: every rank orthogonalises what it holds. Copied.    */
  const muon_compute *compute;     /* NULL: a CPU backend of its own, with the defaults
                                      (muon_cpu_default_desc). Copied; not owned.               */
  muon_rounding rounding;          /* bf16 parameters and mirrors: nearest even or stochastic   */
  unsigned long long seed;         /* stochastic rounding's seed                                */
  /* 1: the optimizer state (momentum, AdamW's m and v) lives in host memory from the compute
     backend's alloc_host (CUDA: pinned), moved to the device around each slot that reads or
     writes it, on the compute queue, through the commit check's scratch (no allocation in a
     step; the host waits nowhere new). Same bits as device-resident state; costs PCIe traffic
     (docs/gpu.md). NorMuon's second moments (one float per row or column) stay on the device.
     A trainer's muon_matrix.momentum must then be host memory. With a host backend (CPU) the
     state is in host memory anyway: no effect. 0: backend memory. Not a setting ranks share. */
  int state_on_host;
} muon_desc;

MUON_API muon_desc muon_default_desc(void);

/* A 2-D weight, or `count` of them stacked in one buffer (llm.c's [L, rows, cols]).
   Each stacked slice becomes its own matrix with consecutive indices. */
typedef struct muon_matrix {
  const char *name;                /* copied; optional on one device (messages only); required
                                      with a dist config, where ranks pair matrices by name     */
  void *param;                     /* rows*cols elements of param_dtype, row-major (per slice)  */
  const void *grad;                /* same shape, grad_dtype; NULL: bind one (muon_set_grad)   */
  int rows, cols;
  int ndim;                        /* 0 or 2. Anything else is rejected: non-matrix parameters
                                      belong to muon_add_adamw_param                            */
  int count;                       /* 0 or 1: one matrix; L: L slices                           */
  size_t stride;                   /* elements between param slices; 0 = the local piece's size */
  int group;                       /* hyperparameter group, 0 = desc.hparams                     */
  const muon_layout *layout;       /* this rank's piece (copied); NULL: dist->layout, or whole  */
  /* What a GPU trainer hands over (llm.c): all optional. With a device compute backend every
     buffer here is backend (device) memory. */
  muon_dtype param_dtype;          /* FP32 (master weights) or BF16 (updated in fp32, rounded
                                      back as desc.rounding says)                               */
  muon_dtype grad_dtype;           /* FP32 or BF16                                              */
  size_t grad_stride;              /* elements between grad slices; 0 = stride                  */
  void *mirror;                    /* optional bf16 copy of param, written after each update    */
  size_t mirror_stride;            /* elements between mirror slices; 0 = stride                */
  float *momentum;                 /* optional: the trainer's buffer for the momentum (zeroed at
                                      registration, then owned by muon until muon_destroy)      */
  size_t momentum_stride;          /* floats between momentum slices; 0 = the local size        */
} muon_matrix;

MUON_API muon_matrix muon_default_matrix(void);

typedef struct muon_adamw_param {
  const char *name;
  void *param;                     /* size elements of param_dtype                               */
  const void *grad;                /* size elements of grad_dtype; NULL: muon_set_adamw_grad    */
  size_t size;                     /* number of elements, > 0                                    */
  int group;                       /* AdamW group, 0 = desc.adamw                                 */
  muon_dtype param_dtype, grad_dtype;
  void *mirror;                    /* optional bf16 copy of param, written after each update     */
  /* ZeRO / FSDP shards: this rank holds elements [offset, offset + size) of a parameter of
     full_size elements (flattened). 0: the whole parameter (full_size = size). Checkpoints
     record it, so muon_state_reshard can place each piece at another world size. */
  size_t offset, full_size;
  /* Optional, distributed only: PARTIAL and REPLICATE levels (NULL: none, or what
     muon_dist_config.adamw_layout says). Every rank of the PARTIAL groups registers the same
     piece, its gradient only its part: muon sums the parts in the groups' order (as for a
     Partial matrix), each rank keeps AdamW's moments of one chunk of the piece (torch.chunk by
     part: ZeRO-1), updates that chunk, and the chunks are all-gathered before anything is
     applied. REPLICATE levels say which ranks hold other, independent sets of the same parts.
     Not with MUON_ROUND_STOCHASTIC (its bits would depend on the chunking). */
  const struct muon_layout *layout;
  /* A stack of `count` pieces in one registration (llm.c's [L, C] tensors, or each layer's
     ZeRO-1 shard of them). Piece l is AdamW param *index_out + l, named "name[l]", its own
     tensor of full_size elements holding [offset, offset + size): exactly as if registered
     alone under that name (stochastic rounding's bits, checkpoints, resharding, ranks). */
  int count;                       /* 0 or 1: one piece, named `name`                           */
  size_t stride;                   /* elements between param pieces; 0 = size                   */
  size_t grad_stride;              /* elements between grad pieces; 0 = stride                  */
  size_t mirror_stride;            /* elements between mirror pieces; 0 = stride                */
} muon_adamw_param;

MUON_API muon_adamw_param muon_default_adamw_param(void);

/* Creates an optimizer. On failure *opt is NULL and the message goes to desc->logger. */
MUON_API muon_status muon_create(muon_optimizer **opt, const muon_desc *desc);
/* Frees everything the optimizer allocated; never the user's param/grad buffers. NULL is fine. */
MUON_API void muon_destroy(muon_optimizer *opt);
/* The last error message of this optimizer ("" if none). Valid until the next call on it.
   muon_error(NULL): why this thread's last failed creation failed: muon_create (opt is then
   NULL) or a backend's (muon_gloo_create, muon_nccl_create, muon_cuda_create, ...). */
MUON_API const char *muon_error(const muon_optimizer *opt);
/* For backends: a creation failed; the message (printf-style, starting with the status name, as
   "MUON_ERR_ARG: muon_gloo_desc.rank ...") is what muon_error(NULL) returns on this thread. */
MUON_API void muon_set_create_error(const char *fmt, ...) MUON__PRINTF_DECL(1, 2);
/* The same as "STATUS_NAME: fn: reason" (fmt printf-style), returning st: a backend's creator
   says `return muon_create_failed(MUON_ERR_ARG, "muon_gloo_create", "...", ...);`. */
MUON_API muon_status muon_create_failed(muon_status st, const char *fn, const char *fmt, ...) MUON__PRINTF_DECL(3, 4);

/* Param groups (torch's param_groups): a new group with its own hyperparameters. Distributed:
   changing a group's Newton-Schulz settings (not its lr) after planning re-plans at the next
   step, a collective, so do it on every rank alike. */
MUON_API muon_status muon_add_group(muon_optimizer *opt, const muon_hparams *hp, int *group_out);
MUON_API muon_status muon_set_group(muon_optimizer *opt, int group, const muon_hparams *hp);
MUON_API muon_status muon_get_group(const muon_optimizer *opt, int group, muon_hparams *hp);
MUON_API muon_status muon_set_lr(muon_optimizer *opt, int group, float lr);
MUON_API muon_status muon_add_adamw_group(muon_optimizer *opt, const muon_adamw_hparams *hp, int *group_out);
MUON_API muon_status muon_set_adamw_group(muon_optimizer *opt, int group, const muon_adamw_hparams *hp);
MUON_API muon_status muon_set_adamw_lr(muon_optimizer *opt, int group, float lr);

/* Registers matrices; *index_out (may be NULL) gets the index of the first (slice) matrix.
   Allocates the momentum (zeros) now, so muon_step never runs out of memory half-way. */
MUON_API muon_status muon_add_matrix(muon_optimizer *opt, const muon_matrix *m, int *index_out);
MUON_API muon_status muon_add_adamw_param(muon_optimizer *opt, const muon_adamw_param *p, int *index_out);
/* Points a matrix (or AdamW param) at a new gradient; NULL means absent this step (skipped). A
   gradient registered NULL and never given one here is MUON_ERR_ARG at muon_step, naming it. */
MUON_API muon_status muon_set_grad(muon_optimizer *opt, int index, const void *grad);
MUON_API muon_status muon_set_adamw_grad(muon_optimizer *opt, int index, const void *grad);
/* Multiplies every gradient by `scale` (>= 0) before the momentum and AdamW, from the next step
   on: the trainer's clipping factor, without rewriting its gradients. Default 1. 0, NaN and Inf
   (llm.c's clip factor for an infinite norm is 0) say the gradient norm is not finite: every
   step while the scale stays so is a non-finite verdict for every gradient, handled as
   on_nonfinite says (ERROR: muon_step returns MUON_ERR_NONFINITE, nothing applied; SKIP: every
   matrix and AdamW param is skipped). A negative scale is MUON_ERR_ARG. */
MUON_API muon_status muon_set_grad_scale(muon_optimizer *opt, float scale);
MUON_API int muon_matrix_count(const muon_optimizer *opt);
MUON_API int muon_adamw_param_count(const muon_optimizer *opt);

/* One optimizer step over every matrix and AdamW parameter whose gradient is present.
   All-or-nothing: on any error no parameter and no state has changed. On a device backend the
   update itself is queued after the step's last check and runs asynchronously; a device fault
   while it runs (which leaves a CUDA context unusable anyway) is reported by the next call.
   Distributed, every rank returns the same status, with one limit no protocol can close: a rank
   that dies inside the commit vote (the step's last collective) can leave one survivor that
   received every vote and applied (MUON_OK) and another whose vote failed (MUON_ERR_COMM /
   TIMEOUT, "nothing was applied on this rank"). After such an error restore every rank from the
   last checkpoint. */
MUON_API muon_status muon_step(muon_optimizer *opt);

/* Distributed planning, a collective: exchanges the matrix lists once, validates layouts
   (pieces tile each matrix), owners and agreement between ranks, and sizes the exchange rounds.
   Errors are the same on every rank. muon_step plans by itself (the first time, and whenever
   any rank's plan is stale: after muon_add_matrix or a change of Newton-Schulz settings, every
   rank re-plans together), so calling this is optional; if some ranks call muon_plan while
   others call muon_step, all plan together and every rank gets MUON_ERR_MISMATCH. */
MUON_API muon_status muon_plan(muon_optimizer *opt);
MUON_API int muon_rank(const muon_optimizer *opt);
MUON_API int muon_world_size(const muon_optimizer *opt);
/* After planning: the owner of this rank's matrix `index`. */
MUON_API muon_status muon_get_owner(const muon_optimizer *opt, int index, int *owner);
/* After planning: the global matrices (all ranks'), and which of them this rank owns. */
MUON_API int muon_global_count(const muon_optimizer *opt);
MUON_API muon_status muon_global_info(const muon_optimizer *opt, int global, muon_matrix_info *info, int *owner);
/* The global indices of the matrices this rank owns (at most cap written; out may be NULL);
   returns how many it owns. */
MUON_API int muon_owned(const muon_optimizer *opt, int *out, int cap);
/* The plan as text: per matrix its name,
   shape, layout key, owner and round, and every holder's piece as that rank described it and as
   rows and columns of the full matrix; per rank the Newton-Schulz work it owns, the bytes it
   sends and receives per step (U to owners, O back) and the full matrices it holds at once; the
   collectives per step; this rank's measured counters. Like snprintf: writes at most size bytes
   (NUL-terminated when size > 0) and returns the length of the whole text. With a logger, the
   same text goes to it at MUON_LOG_INFO after every planning. */
MUON_API size_t muon_plan_text(const muon_optimizer *opt, char *buf, size_t size);

/* Counters since creation (the exchange ones stay 0 without a dist config). */
typedef struct muon_stats {
  long long steps;                 /* successful muon_step calls                                 */
  long long ns_calls;              /* Newton-Schulz runs on this rank                            */
  long long collectives;           /* communication calls issued by this rank                    */
  long long bytes_sent, bytes_received;   /* U/O exchange payload, to and from other ranks        */
  long long control_bytes;         /* planning and skip agreement (allgathers)                    */
  size_t state_bytes;              /* momentum + AdamW moments held by this rank                 */
  size_t workspace_bytes;          /* step buffers beyond the state, allocated at planning: the
                                      O stash, exchange buffers, gathered operands, NS workspace,
                                      the commit check's chunk (up to 2^20 elements, 16 B each) */
  size_t ns_workspace_bytes;       /* peak NS workspace beyond its m x n operand                 */
  size_t gathered_bytes;           /* peak bytes of full matrices held at once (owner side)      */
  size_t exchange_bytes;           /* exchange buffers: send/recv + the O stash (local size)     */
  int rounds;                      /* exchange rounds per step (0 without matrices; a round with
                                      nothing to move, as on one rank, issues no alltoallv)      */
  long long backend_calls;         /* compute backend slots called (sync included)               */
  long long syncs;                 /* of which sync: where the host waits for the backend        */
  long long comm_waits;            /* waits for a queued communicator's exchanges (vt->finish)   */
  long long ns_batches;            /* newton_schulz calls (each orthogonalises a batch)           */
  long long skipped;               /* matrices skipped by successful steps (absent or non-finite) */
} muon_stats;

/* On MUON_ERR_ARG (a NULL or an index out of range) the outputs are zeroed, never left unset. */
MUON_API muon_status muon_get_stats(const muon_optimizer *opt, muon_stats *stats);

/* Read-only view of a matrix's momentum buffer (its local floats), in the compute backend's
   memory: a GPU pointer with muon_cuda.h; with muon_desc.state_on_host a host pointer, whose
   values are current once the compute queue has finished the step (muon_state_save waits for
   it; a trainer syncs its stream). A Partial matrix's: rows x cols on its owner (once planned),
   NULL and 0 elsewhere. Only for momentum_format FP32: another format is MUON_ERR_ARG (NULL and
   0), never a buffer read as floats it does not hold; use muon_get_momentum_stored.
   muon_gather_matrix and the state blob give fp32 values for every format. */
MUON_API muon_status muon_get_momentum(const muon_optimizer *opt, int index, const float **buf, size_t *size);
/* The momentum buffer as stored, whatever its group's format: *size values of *format
   (MUON_MOMENTUM_BF16: uint16_t, the top half of the fp32 bits; MUON_MOMENTUM_INT8: blocks, *size
   + ceil(*size / 256) bytes), where muon_get_momentum says, except that an 8-bit matrix held in
   pieces keeps it whole on its owner, as a Partial one does. */
MUON_API muon_status muon_get_momentum_stored(const muon_optimizer *opt, int index, const void **buf, size_t *size,
                                             muon_momentum_format *format);

/* >>state -------------------------------------------------------------------------------------
   State: momentum, NorMuon second moments, AdamW moments and step counts in a versioned,
   checksummed little blob. A rank saves the NorMuon second moments of the matrices it owns.
   Loading checks everything before it changes anything: a truncated, corrupted or mismatched
   blob is MUON_ERR_STATE and the optimizer is untouched. A blob also carries the step count and
   the run's identity; ranks that restored different steps or runs get MUON_ERR_MISMATCH at the
   next step, all of them, nothing applied. */
MUON_API size_t muon_state_size(const muon_optimizer *opt);
MUON_API muon_status muon_state_save(muon_optimizer *opt, void *buf, size_t size);
MUON_API muon_status muon_state_load(muon_optimizer *opt, const void *buf, size_t size);
MUON_API muon_status muon_state_save_file(muon_optimizer *opt, const char *path);
MUON_API muon_status muon_state_load_file(muon_optimizer *opt, const char *path);
/* Resharding: loads a checkpoint saved by every rank of another world (n blobs or files, one
   per old rank, in any order) into this optimizer, whatever its world size and layouts. Each
   matrix takes, element by element, the momentum of the saved pieces that hold that element
   (matched by name and layout key, as planning matches them; saved replicas must agree bit for
   bit), each AdamW param its moments by name and muon_adamw_param.offset / full_size, and every
   holder of a matrix its NorMuon second moment from the blob of its old owner (the next step
   then re-plans, and only the owner keeps it). The
   result is the state a single device would hold, cut to this rank's pieces. Not collective:
   every rank reads the blobs it is given, all of them. Group hyperparameters and the step
   count come from the blobs as in muon_state_load. All-or-nothing like muon_state_load: a
   missing rank, a file of another step, an element no saved piece holds, or blobs older than
   version 3 (saved before muon.h recorded names) are MUON_ERR_STATE and change nothing. */
MUON_API muon_status muon_state_reshard(muon_optimizer *opt, const void *const *blobs, const size_t *sizes, int n);
MUON_API muon_status muon_state_reshard_files(muon_optimizer *opt, const char *const *paths, int n);

/* >>verify ------------------------------------------------------------------------------------
   Verifying a setup: whole matrices out, a dump to compare, a check of the layouts. Collective:
   every rank calls them alike, after registration (they plan first); the same error on every
   rank. For checks, not for every step: each matrix's pieces reach every rank by allgather. */
/* The full parameter and momentum (fp32, rows x cols row-major) of global matrix `global`
   (muon_global_info) on rank `root`; param or momentum may be NULL. Other ranks pass anything. */
MUON_API muon_status muon_gather_matrix(muon_optimizer *opt, int global, int root, float *param, float *momentum);
/* Every matrix's parameter (and momentum, with_momentum != 0) into one file on rank `root`, in
   the format of muon.h's implementation section ("A dump file"); compare two with tools/muoncmp.
   Written atomically, as muon_state_save_file writes. AdamW parameters are not in it. */
MUON_API muon_status muon_dump_file(muon_optimizer *opt, const char *path, int root, int with_momentum);
/* The framework's position of this rank's local element k of its matrix `matrix` (the index
   muon_add_matrix gave): row * cols + col in the full matrix (e.g. from its shard metadata). */
typedef long long (*muon_index_fn)(void *user, int matrix, size_t k);
/* Checks every rank's layout against the framework: every piece's elements, as `index` places
   them, must sit where the declared layout puts them. MUON_ERR_SHAPE on every rank naming the
   first matrix, rank and element that do not, and where each side puts it. */
MUON_API muon_status muon_check_layouts(muon_optimizer *opt, muon_index_fn index, void *user);

/* >>qkclip ------------------------------------------------------------------------------------
   MuonClip's QK-clip (Kimi K2, arXiv 2507.20534, section 2.1; Megatron's qk_clip): after
   muon_step, every attention head whose largest pre-softmax logit S of the step (over the batch,
   the logit as softmax sees it: q.k / sqrt(head_dim)) exceeded tau has its query rows scaled by
   (tau / S)^alpha and its key rows by (tau / S)^(1 - alpha), so that its logits shrink by
   tau / S and the largest comes back to tau. Heads at or under tau are left as they are.
   Grouped-query attention (n_kv_heads < n_heads; query head h uses key head h / (n_heads /
   n_kv_heads), as repeat_kv): each query head scales by its own (tau / S_h)^alpha, a key head by
   (tau / G)^(1 - alpha) with G the largest S of the query heads sharing it. Every head of the
   group then ends at or under tau; the group's other heads shrink too (by (tau / G)^(1 - alpha)),
   which is what sharing a key costs: making up for it would scale their queries up, and the clip
   never enlarges a weight. MHA is the case n_kv_heads = n_heads (Kimi K2's rule exactly). Biases
   are not scaled: with q / k biases (GPT-2) the logits shrink by about, not exactly, tau / S.

   The rows are the matrices' rows (muon_matrix is [out, in], torch's Linear.weight): query head h
   is rows q_row + h * head_dim .. + head_dim of the matrix named q, key head j rows k_row + j *
   head_dim .. of the matrix named k. A fused QKV (llm.c's qkvw, a stack of L matrices 3C x C,
   rows q | k | v): q = k = "qkvw[l]", q_row 0, k_row C. Matrices are named as registered, a
   stack's slices "name[l]"; a name must be one matrix of the plan (one layout key).

   Distributed: every rank passes the same layers, tau and alpha (compared: MUON_ERR_MISMATCH),
   with max_logits its own view (what its tokens gave; -INFINITY for a head it did not compute,
   e.g. a tensor-parallel rank without that head). Two alltoallvs agree the max of every head
   (after the agreement muon_step also makes): each rank takes the maxima of a share of the heads
   and sends them to all, about 2 x heads floats per rank at any world size; each rank then
   scales the rows of its own pieces, whatever cuts them (rows, columns, FLAT ranges): the bits
   are those of one device. A bf16
   param is scaled in fp32 and rounded as muon_step rounds it (desc.rounding; stochastic bits
   from the seed, the step count and the full name, distinct from the step's); a bf16 mirror is
   rewritten from the new value. The momentum is not touched. */
typedef struct muon_qk_clip_layer {
  const char *q;                   /* the matrix holding the query rows ("attn.q[3]", "qkvw[3]")  */
  const char *k;                   /* the matrix holding the key rows: the same for a fused QKV   */
  int q_row, k_row;                /* first query row, first key row (fused q|k|v: 0 and C)       */
  int n_heads;                     /* query heads, > 0                                            */
  int n_kv_heads;                  /* key heads, dividing n_heads; 0: n_heads (MHA)               */
  int head_dim;                    /* rows per head, > 0                                          */
  const float *max_logits;         /* host memory, n_heads: this rank's largest logit per query
                                      head since the last call; -INFINITY: none seen. NaN and
                                      +Inf are MUON_ERR_NONFINITE (nothing is scaled)            */
} muon_qk_clip_layer;

typedef struct muon_qk_clip_desc {
  float tau;                       /* the threshold, finite and > 0 (Kimi K2: 100)                */
  float alpha;                     /* the query's share of the scaling, in [0, 1] (0.5)           */
  const muon_qk_clip_layer *layers;
  int n_layers;                    /* >= 0                                                        */
  float *max_logits_out;           /* optional: the agreed largest logit of every query head,
                                      layer after layer (sum of n_heads floats), for logging     */
} muon_qk_clip_desc;

/* tau 100, alpha 0.5 (Kimi K2), no layers. */
MUON_API muon_qk_clip_desc muon_default_qk_clip_desc(void);
/* The clip, after muon_step; *clipped (may be NULL) gets how many query heads exceeded tau.
   Collective with a dist config: every rank calls it alike (as it calls muon_step), and every
   rank returns the same status; a bad field is MUON_ERR_ARG naming it, nothing scaled anywhere.
   On a device backend the scaling is queued like muon_step's update: a device fault while it runs
   is reported by the next call, and that rank's rows may then be partly scaled. */
MUON_API muon_status muon_qk_clip(muon_optimizer *opt, const muon_qk_clip_desc *desc, int *clipped);

/* >>ns ----------------------------------------------------------------------------------------
   Newton-Schulz alone: out = NS(in) for a rows x cols matrix, as muon_step computes it
   (transposing tall matrices). in and out may alias. Allocates its workspace with malloc. */
MUON_API muon_status muon_newton_schulz(const float *in, int rows, int cols, float *out, const muon_hparams *hp);
/* Floats of NS workspace for an m x n operand (m <= n) beyond the operand, for either algorithm:
   <= 2mn + 2m^2 (standard; also Gram when n < 2m), <= 2mn + 5m^2 (Gram). 0 for an empty shape
   or one whose workspace in bytes no size_t can count (so floats * sizeof(float) never wraps). */
MUON_API size_t muon_ns_workspace_floats(int rows, int cols);

#ifdef __cplusplus
}
#endif
#endif /* MUON_H */

/* >>elementwise ===============================================================================
   ELEMENT-WISE FORMULAS, one element at a time, shared by the CPU loops of this header and the
   CUDA kernels of muon_cuda.h (which defines MUON_ELEMENTWISE and includes this header again),
   so every backend runs the very same formulas. Reference: torch.optim.Muon / torch.optim.AdamW
   (single-tensor paths). Every float operation goes through muon__add & co., so the device code
   gives the CPU's bits whatever nvcc's flags (-fmad, --use_fast_math).
   ============================================================================================= */
#if (defined(MUON_IMPLEMENTATION) || defined(MUON_ELEMENTWISE)) && !defined(MUON__ELEMENTWISE_DEFINED)
#define MUON__ELEMENTWISE_DEFINED
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__CUDACC__)
#define MUON__HD static inline __host__ __device__
#else
#define MUON__HD static inline
#endif

MUON__HD uint32_t muon__f2u(float x) { uint32_t u; memcpy(&u, &x, sizeof u); return u; }
MUON__HD float muon__u2f(uint32_t u) { float x; memcpy(&x, &u, sizeof x); return x; }

/* By the exponent bits, so -ffast-math cannot fold it away. */
MUON__HD int muon__finite(float x) { return (muon__f2u(x) & 0x7f800000u) != 0x7f800000u; }
/* What a state element may hold, the one rule of muon_state_load and of a step: finite, and a
   second moment not negative (-0 is fine). A step checks finiteness of all it writes with
   muon__finite (muon__check_commit); a second moment cannot turn negative, being a sum of
   non-negative products. */
MUON__HD int muon__state_ok(float x, int second_moment) {
  return muon__finite(x) && !(second_moment && (muon__f2u(x) >> 31) && (muon__f2u(x) & 0x7fffffffu));
}

/* IEEE arithmetic, each operation rounded to nearest on its own. On the GPU they are PTX
   instructions without .ftz, so a trainer's nvcc flags (--use_fast_math: flushed subnormals,
   approximate / and sqrt; -fmad=true: a*b + c fused) cannot change a bit of muon's kernels: the
   intrinsics __fadd_rn & co. stop the fusing but still flush under --use_fast_math. On the host,
   plain operators (an ISO C build does not contract); under -ffast-math (gcc, clang: x86, Arm)
   each operand and result passes an empty asm, so nothing is fused, reassociated or replaced by
   a reciprocal across operations (the element-wise loops then do not vectorise). */
#if !defined(__CUDA_ARCH__) && defined(__FAST_MATH__) && defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define MUON__FENCE(x) __asm__("" : "+x"(x))
#elif !defined(__CUDA_ARCH__) && defined(__FAST_MATH__) && defined(__GNUC__) && defined(__aarch64__)
#define MUON__FENCE(x) __asm__("" : "+w"(x))
#else
#define MUON__FENCE(x) (void)0
#endif
MUON__HD float muon__add(float a, float b) {
#ifdef __CUDA_ARCH__
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  float r;
  MUON__FENCE(a); MUON__FENCE(b);
  r = a + b;
  MUON__FENCE(r);
  return r;
#endif
}
MUON__HD float muon__sub(float a, float b) {
#ifdef __CUDA_ARCH__
  float r;
  asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  float r;
  MUON__FENCE(a); MUON__FENCE(b);
  r = a - b;
  MUON__FENCE(r);
  return r;
#endif
}
MUON__HD float muon__mul(float a, float b) {
#ifdef __CUDA_ARCH__
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  float r;
  MUON__FENCE(a); MUON__FENCE(b);
  r = a * b;
  MUON__FENCE(r);
  return r;
#endif
}
MUON__HD float muon__div(float a, float b) {
#ifdef __CUDA_ARCH__
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  float r;
  MUON__FENCE(a); MUON__FENCE(b);
  r = a / b;
  MUON__FENCE(r);
  return r;
#endif
}
MUON__HD float muon__sqrt(float a) {
#ifdef __CUDA_ARCH__
  float r;
  asm("sqrt.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
#else
  float r;
  MUON__FENCE(a);
  r = sqrtf(a);
  MUON__FENCE(r);
  return r;
#endif
}
/* double: never flushed, but fused by -fmad=true; and the conversions, flushed by -ftz=true. */
MUON__HD double muon__dadd(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
MUON__HD double muon__dmul(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
MUON__HD double muon__f2d(float a) {
#ifdef __CUDA_ARCH__
  double r;
  asm("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(a));
  return r;
#else
  return (double)a;
#endif
}
MUON__HD float muon__d2f(double a) {
#ifdef __CUDA_ARCH__
  float r;
  asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(a));
  return r;
#else
  return (float)a;
#endif
}

/* Momentum, returns U. lerp: torch's buf.lerp_(g, 1-mu) then g.lerp(buf, mu). */
MUON__HD float muon__momentum_elem(float *b, float g, float mu, int nesterov, int sgd) {
  if (sgd) {
    *b = muon__add(muon__mul(mu, *b), g);
    return nesterov ? muon__add(g, muon__mul(mu, *b)) : *b;
  }
  *b = muon__add(*b, muon__mul(muon__sub(1.0f, mu), muon__sub(g, *b)));
  return nesterov ? muon__add(g, muon__mul(mu, muon__sub(*b, g))) : *b;
}

/* Do w and u agree in sign (zero agrees with both)? By the bits, so -ffast-math keeps it. */
MUON__HD int muon__same_sign(float w, float u) {
  uint32_t a = muon__f2u(w), b = muon__f2u(u);
  return ((a ^ b) >> 31) == 0 || (a & 0x7fffffffu) == 0 || (b & 0x7fffffffu) == 0;
}

/* w*(1 - lr*wd) first, with the unadjusted lr (cautious: only where w and o agree in sign);
   then the orthogonalised step. */
MUON__HD float muon__apply_elem(float w, float o, float decay, float step, int cautious) {
  if (!cautious || muon__same_sign(w, o)) w = muon__mul(w, decay);
  return muon__sub(w, muon__mul(step, o));
}

/* torch.optim.AdamW for one element; step_size = lr/(1-beta1^t), bc2_sqrt = sqrt(1-beta2^t). */
MUON__HD float muon__adamw_elem(float w, float g, float *m, float *v, float beta1, float beta2, float eps,
                                float decay, float step_size, float bc2_sqrt, int cautious) {
  float decayed = muon__mul(w, decay), u;
  *m = muon__add(*m, muon__mul(muon__sub(1.0f, beta1), muon__sub(g, *m)));
  *v = muon__add(muon__mul(*v, beta2), muon__mul(muon__mul(muon__sub(1.0f, beta2), g), g));
  u = muon__div(*m, muon__add(muon__div(muon__sqrt(*v), bc2_sqrt), eps));   /* the update's sign is m_hat's */
  if (!cautious || muon__same_sign(w, u)) w = decayed;
  return muon__sub(w, muon__mul(step_size, u));
}

/* Round to the nearest bfloat16, ties to even, kept in a float. */
MUON__HD float muon__bf16(float x) {
  uint32_t u = muon__f2u(x);
  if ((u & 0x7f800000u) == 0x7f800000u) {
    if (u & 0x007fffffu) u |= 0x00400000u; /* keep NaN a NaN */
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
  }
  return muon__u2f(u & 0xffff0000u);
}

/* Stochastic rounding to bfloat16 with 16 random bits: rounds up with probability equal to the
   dropped fraction. NaN and Inf stay as they are; a finite value may round to Inf only where
   nearest rounding would too. */
MUON__HD float muon__bf16_stochastic(float x, uint32_t bits) {
  uint32_t u = muon__f2u(x), r;
  if ((u & 0x7f800000u) == 0x7f800000u) return muon__bf16(x);
  r = (u + (bits & 0xffffu)) & 0xffff0000u;
  if ((r & 0x7f800000u) == 0x7f800000u) return muon__bf16(x);
  return muon__u2f(r);
}

MUON__HD uint16_t muon__bf16_bits(float x) { return (uint16_t)(muon__f2u(x) >> 16); }
MUON__HD float muon__from_bf16(uint16_t h) { return muon__u2f((uint32_t)h << 16); }

/* MUON_MOMENTUM_INT8, one block (1 exponent byte E, then int8 values: value = q * 2^(E - 127)).
   Power-of-two scales: q * 2^e is exact, and so is v / 2^e wherever it is not rounded to 0
   anyway, so values read from blocks quantise back to themselves. 2^e for -127 <= e <= 127;
   2^-127 is given as 0: E = 0 is a zeroed buffer's, whose values are all 0. */
MUON__HD float muon__pow2(int e) { return muon__u2f((uint32_t)(e + 127) << 23); }
/* E of a block whose largest |value| is absmax: the smallest e >= -126 with 127 * 2^e >= absmax. */
MUON__HD unsigned char muon__q8_exponent(float absmax) {
  int e;
  if (!(absmax > muon__mul(127.0f, muon__pow2(-126)))) return 1;
  e = (int)((muon__f2u(absmax) >> 23) & 0xffu) - 127 - 6;   /* floor(log2(absmax)) - 6 */
  if (muon__mul(127.0f, muon__pow2(e)) < absmax) e++;
  return (unsigned char)(e + 127);
}
/* v / 2^(E - 127) to the nearest integer, ties to even (|v| <= 127 * 2^(E - 127) by E's choice). */
MUON__HD unsigned char muon__q8(float v, unsigned char E) {
  float t = muon__mul(muon__u2f(muon__f2u(v) & 0x7fffffffu), muon__pow2(127 - (int)E));
  int q;
  t = muon__sub(muon__add(t, 8388608.0f), 8388608.0f);   /* 2^23: rounds to an integer, to even */
  if (!(t <= 127.0f)) q = t > 127.0f ? 127 : 0;          /* NaN: 0 (a step never stores one) */
  else q = (int)(muon__f2u(muon__add(t, 8388608.0f)) - 0x4b000000u);   /* t's value from its bits: no
                                                           float-to-int conversion, which fast-math flushes */
  return (unsigned char)((muon__f2u(v) >> 31) ? 256 - q : q);
}
MUON__HD float muon__dq8(unsigned char q, unsigned char E) {
  return muon__mul((float)(q < 128 ? (int)q : (int)q - 256), muon__pow2((int)E - 127));
}
/* Block of c <= MUON_Q8_BLOCK values x into blk (1 + c bytes), and back. */
MUON__HD float muon__q8_absmax(const float *x, size_t c) {
  float m = 0.0f, a;
  size_t i;
  for (i = 0; i < c; i++) if ((a = muon__u2f(muon__f2u(x[i]) & 0x7fffffffu)) > m) m = a;
  return m;
}
MUON__HD void muon__q8_encode(const float *x, size_t c, unsigned char *blk) {
  size_t i;
  blk[0] = muon__q8_exponent(muon__q8_absmax(x, c));
  for (i = 0; i < c; i++) blk[1 + i] = muon__q8(x[i], blk[0]);
}
MUON__HD void muon__q8_decode(const unsigned char *blk, size_t c, float *x) {
  size_t i;
  for (i = 0; i < c; i++) x[i] = muon__dq8(blk[1 + i], blk[0]);
}

/* SplitMix64 finaliser of (seed, index): the random bits of one element. */
MUON__HD uint32_t muon__random_bits(unsigned long long seed, unsigned long long index) {
  unsigned long long z = seed + 0x9e3779b97f4a7c15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)((z ^ (z >> 31)) >> 32);
}

/* A float of an fp32 or bf16 buffer. */
MUON__HD float muon__load(const void *p, int bf16, size_t i) {
  return bf16 ? muon__from_bf16(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* Stores x to an fp32 or bf16 buffer, rounding as asked (bits used only when stochastic). */
MUON__HD void muon__store(void *p, int bf16, size_t i, float x, int stochastic, uint32_t bits) {
  if (!bf16) { ((float *)p)[i] = x; return; }
  ((uint16_t *)p)[i] = muon__bf16_bits(stochastic ? muon__bf16_stochastic(x, bits) : muon__bf16(x));
}

/* Element k of a piece: its index in the full rows x cols matrix (row * cols + col), and its
   index in the NS operand (the matrix, or its transpose when rows > cols). */
MUON__HD long long muon__piece_full_index(const muon_piece_copy *p, long long k) {
  long long f = p->f0 + k, row = p->r0 + f / p->w, col = p->c0 + f % p->w;
  return row * p->cols + col;
}
MUON__HD long long muon__piece_operand_index(const muon_piece_copy *p, long long k) {
  long long f = p->f0 + k, row = p->r0 + f / p->w, col = p->c0 + f % p->w;
  return p->rows <= p->cols ? row * p->cols + col : col * p->rows + row;
}

/* One element of the update: momentum -> U (momentum_elem), and p*decay - step*O stored as
   the parameter's dtype with its mirror. */
MUON__HD void muon__apply_store(void *param, size_t i, const float *O, const muon_apply_args *a) {
  int bf16 = a->param_dtype == MUON_DTYPE_BF16, sr = a->rounding == MUON_ROUND_STOCHASTIC;
  uint32_t bits =
      sr ? muon__random_bits(a->seed, (unsigned long long)muon__piece_full_index(&a->piece, (long long)i)) : 0;
  float w = muon__apply_elem(muon__load(param, bf16, i), O[i], a->decay, a->step, a->cautious);
  muon__store(param, bf16, i, w, sr, bits);
  if (a->mirror) muon__store(a->mirror, 1, i, w, sr, bits);
}

/* QK-clip's scaling of element i: p*factor in fp32, stored as the parameter's dtype with its
   mirror, rounded as muon__apply_store rounds. */
MUON__HD void muon__scale_store(void *param, size_t i, float factor, const muon_apply_args *a) {
  int bf16 = a->param_dtype == MUON_DTYPE_BF16, sr = a->rounding == MUON_ROUND_STOCHASTIC;
  uint32_t bits =
      sr ? muon__random_bits(a->seed, (unsigned long long)muon__piece_full_index(&a->piece, (long long)i)) : 0;
  float w = muon__mul(muon__load(param, bf16, i), factor);
  muon__store(param, bf16, i, w, sr, bits);
  if (a->mirror) muon__store(a->mirror, 1, i, w, sr, bits);
}

MUON__HD void muon__adamw_store(void *param, size_t i, const void *grad, float *m, float *v, const muon_adamw_args *a) {
  int bf16 = a->param_dtype == MUON_DTYPE_BF16, sr = a->rounding == MUON_ROUND_STOCHASTIC;
  uint32_t bits = sr ? muon__random_bits(a->seed, a->offset + (unsigned long long)i) : 0;
  float g = muon__mul(a->grad_scale, muon__load(grad, a->grad_dtype == MUON_DTYPE_BF16, i));
  float w = muon__adamw_elem(muon__load(param, bf16, i), g, &m[i], &v[i], a->beta1, a->beta2, a->eps,
                             a->decay, a->step_size, a->bc2_sqrt, a->cautious);
  muon__store(param, bf16, i, w, sr, bits);
  if (a->mirror) muon__store(a->mirror, 1, i, w, sr, bits);
}

/* Momentum of element i: update ? the buffer moves to B' : it stays; returns U. */
MUON__HD float muon__momentum_at(float *momentum, size_t i, const void *grad, const muon_momentum_args *a, int update) {
  float b = momentum[i];
  float g = muon__mul(a->grad_scale, muon__load(grad, a->grad_dtype == MUON_DTYPE_BF16, i));
  float u = muon__momentum_elem(&b, g, a->mu, a->nesterov, a->sgd);
  if (update) momentum[i] = b;
  return u;
}
#endif /* MUON__ELEMENTWISE_DEFINED */

/* >>implementation ============================================================================
   IMPLEMENTATION
   ============================================================================================= */
#ifdef MUON_IMPLEMENTATION
#ifndef MUON__IMPLEMENTED
#define MUON__IMPLEMENTED

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef MUON_USE_CBLAS
#include <cblas.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#if !defined(MUON_NO_THREADS)
#include <pthread.h>
#define MUON__POOL 1
#endif
#endif
#ifndef MUON__POOL
#define MUON__POOL 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define MUON__PRINTF(f, a) __attribute__((format(printf, f, a)))
#define MUON__UNUSED __attribute__((unused))
#else
#define MUON__PRINTF(f, a)
#define MUON__UNUSED
#endif

/* >>impl-defaults -----------------------------------------------------------------------------
   Status strings and defaults */
#define MUON__STATUS_TEXT(name, text) #name ": " text,
static const char *const muon__status_text[] = { MUON_STATUS_LIST(MUON__STATUS_TEXT) };
#undef MUON__STATUS_TEXT

MUON_API const char *muon_status_string(muon_status status) {
  if ((int)status < 0 || (int)status >= (int)MUON_STATUS_COUNT) return "unknown muon_status";
  return muon__status_text[status];
}

/* Keller Jordan's quintic, torch.optim.Muon's default ns_coefficients. */
static const float muon__quintic[3] = { 3.4445f, -4.7750f, 2.0315f };

/* Polar Express, degree 5: Amsel, Persson, Musco, Gower, "The Polar Express: Optimal Matrix Sign
   Methods and Their Application to the Muon Algorithm", arXiv:2505.16932, Algorithm 1. All but the
   last triple are divided by (1.01, 1.01^3, 1.01^5), the paper's safety factor; iterations past
   the eighth reuse the last triple, as in the paper. */
static const double muon__polar_express[8][3] = {
  { 8.28721201814563, -23.595886519098837, 17.300387312530933 },
  { 4.107059111542203, -2.9478499167379106, 0.5448431082926601 },
  { 3.9486908534822946, -2.908902115962949, 0.5518191394370137 },
  { 3.3184196573706015, -2.488488024314874, 0.51004894012372 },
  { 2.300652019954817, -1.6689039845747493, 0.4188073119525673 },
  { 1.891301407787398, -1.2679958271945868, 0.37680408948524835 },
  { 1.8750014808534479, -1.2500016453999487, 0.3750001645474248 },
  { 1.875, -1.25, 0.375 },
};

MUON_API muon_status muon_set_ns_preset(muon_hparams *hp, muon_ns_preset preset) {
  int k;
  if (!hp || (preset != MUON_NS_QUINTIC && preset != MUON_NS_POLAR_EXPRESS)) return MUON_ERR_ARG;
  for (k = 0; k < MUON_NS_MAX_STEPS; k++) {
    if (preset == MUON_NS_POLAR_EXPRESS) {
      int i = k < 7 ? k : 7;
      double s = i < 7 ? 1.01 : 1.0;
      hp->ns_coefficients[k][0] = (float)(muon__polar_express[i][0] / s);
      hp->ns_coefficients[k][1] = (float)(muon__polar_express[i][1] / (s * s * s));
      hp->ns_coefficients[k][2] = (float)(muon__polar_express[i][2] / (s * s * s * s * s));
    } else {
      hp->ns_coefficients[k][0] = muon__quintic[0];
      hp->ns_coefficients[k][1] = muon__quintic[1];
      hp->ns_coefficients[k][2] = muon__quintic[2];
    }
  }
  return MUON_OK;
}

MUON_API muon_hparams muon_default_hparams(void) {
  muon_hparams hp;
  memset(&hp, 0, sizeof hp);
  hp.lr = 1e-3f;
  hp.weight_decay = 0.1f;
  hp.momentum = 0.95f;
  hp.nesterov = 1;
  hp.momentum_style = MUON_MOMENTUM_LERP;
  hp.adjust_lr = MUON_ADJUST_LR_ORIGINAL;
  hp.ns_steps = 5;
  muon_set_ns_preset(&hp, MUON_NS_QUINTIC);
  hp.eps = 1e-7f;
  hp.ns_algorithm = MUON_NS_STANDARD;
  hp.ns_restarts = 1u << 2;
  hp.precision = MUON_PRECISION_FP32;
  hp.normuon = MUON_NORMUON_OFF;
  hp.normuon_beta2 = 0.95f;
  hp.symmetric = 1;
  hp.momentum_format = MUON_MOMENTUM_FP32;
  return hp;
}

MUON_API muon_adamw_hparams muon_default_adamw_hparams(void) {
  muon_adamw_hparams hp;
  memset(&hp, 0, sizeof hp);   /* every field not set here is 0 (cautious_wd, fields to come) */
  hp.lr = 1e-3f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.999f;
  hp.eps = 1e-8f;
  hp.weight_decay = 1e-2f;
  return hp;
}

MUON_API muon_desc muon_default_desc(void) {
  muon_desc d;
  memset(&d, 0, sizeof d);
  d.hparams = muon_default_hparams();
  d.adamw = muon_default_adamw_hparams();
  d.on_nonfinite = MUON_NONFINITE_ERROR;
  return d;
}

MUON_API muon_matrix muon_default_matrix(void) {
  muon_matrix m;
  memset(&m, 0, sizeof m);
  return m;
}

MUON_API muon_adamw_param muon_default_adamw_param(void) {
  muon_adamw_param p;
  memset(&p, 0, sizeof p);
  return p;
}

/* >>impl-self ---------------------------------------------------------------------------------
   The single-rank communicator: alltoallv and allgather are local copies. */
static muon_status muon__self_alltoallv(void *ctx, const float *send, const size_t *send_counts,
                                        const size_t *send_displs, float *recv, const size_t *recv_counts,
                                        const size_t *recv_displs, int *ticket) {
  (void)ctx;
  *ticket = -1;
  if (send_counts[0] != recv_counts[0]) return MUON_ERR_COMM;
  if (send_counts[0]) memmove(recv + recv_displs[0], send + send_displs[0], send_counts[0] * sizeof(float));
  return MUON_OK;
}

static muon_status muon__self_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  (void)ctx;
  if (bytes) memmove(recv, send, bytes);
  return MUON_OK;
}

static const muon_comm_vtable muon__self_vtable = {
  MUON_COMM_VTABLE_VERSION,
  /* .alltoallv = */ muon__self_alltoallv,
  /* .join      = */ NULL,
  /* .finish    = */ NULL,
  /* .allgather = */ muon__self_allgather,
  /* .error     = */ NULL,
  /* .destroy   = */ NULL,
  /* .memory    = */ MUON_MEMORY_HOST,
  /* .queued    = */ 0
};

MUON_API muon_comm muon_comm_self(void) {
  muon_comm c;
  c.vt = &muon__self_vtable;
  c.ctx = NULL;
  c.rank = 0;
  c.size = 1;
  return c;
}

MUON_API muon_status muon_comm_alltoallv(const muon_comm *c, const float *send, const size_t *send_counts,
                                         const size_t *send_displs, float *recv, const size_t *recv_counts,
                                         const size_t *recv_displs) {
  int ticket = -1;
  muon_status st;
  if (!c || !c->vt) return MUON_ERR_ARG;
  st = c->vt->alltoallv(c->ctx, send, send_counts, send_displs, recv, recv_counts, recv_displs, &ticket);
  if (st == MUON_OK && c->vt->join) st = c->vt->join(c->ctx, ticket);
  if (st == MUON_OK && c->vt->queued && c->vt->finish) st = c->vt->finish(c->ctx);
  return st;
}

MUON_API void muon_comm_destroy(muon_comm *comm) {
  if (!comm) return;
  if (comm->vt && comm->vt->destroy) comm->vt->destroy(comm->ctx);
  memset(comm, 0, sizeof *comm);
}

/* >>impl-optimizer ----------------------------------------------------------------------------
   The optimizer object */
/* A piece: the range [f0, f1) of the row-major flattening of the rectangle at (r0, c0) of size
   h x w, in full-matrix coordinates. Every nesting of SHARD / FLAT / REPLICATE gives one. */
typedef struct muon__piece {
  long long r0, c0, h, w, f0, f1;
} muon__piece;
static size_t muon__piece_size(const muon__piece *p) { return (size_t)(p->f1 - p->f0); }

typedef struct muon__matrix {
  char name[64];        /* for messages; cut at 63 characters */
  unsigned long long name_hash;   /* muon__name_hash of the full name */
  void *param;          /* param_dtype */
  const void *grad;     /* grad_dtype */
  void *mirror;         /* bf16, optional */
  muon_dtype param_dtype, grad_dtype;
  int rows, cols;
  int group;
  size_t size;          /* elements of param/grad/momentum held here */
  float *momentum;      /* backend memory */
  size_t momentum_size; /* its floats: size; for a Partial matrix rows x cols on its owner, else 0 */
  int own_momentum;     /* allocated by muon (else the trainer's buffer) */
  int parts;            /* MUON_PARTIAL: the parts of its gradient (1: none) */
  float part_scale;     /* MEAN's factor, folded into grad_scale */
  int momentum_fresh;   /* a Partial matrix's momentum is planning's zeros, never stepped: not state yet */
  int grad_bound;       /* registered with a gradient, or given one (NULL too) by muon_set_grad */
  int skip;             /* this step: absent or non-finite gradient */
  muon_layout layout;
  muon__piece piece;
  int slot;             /* planning: its layout's slot in this rank's table (muon__layout_slots) */
  int global;           /* index in the plan's global list */
  size_t stash;         /* offset of this matrix's O in the plan's stash */
  size_t check, checks; /* its flags in the plan's commit checks: first, count */
  float *normuon;       /* backend memory, owner only: NorMuon's second moment v (normuon_len
                           floats), then room for the step's new one, committed with the rest */
  int normuon_len;
  int normuon_fresh;    /* v is planning's zeros, never committed: not state yet (not saved) */
  float *normuon_next;  /* planning or a load: the buffer that replaces normuon once all is well */
  int normuon_next_len;
  muon_momentum_format mfmt;   /* how `momentum` stores its values: its group's, fixed at registration */
} muon__matrix;

/* Bytes of n momentum values in x's stored format (int8: an exponent byte per block). */
static size_t muon__mom_bytes(const muon__matrix *x, size_t n) {
  if (x->mfmt == MUON_MOMENTUM_INT8) return n + (n + MUON_Q8_BLOCK - 1) / MUON_Q8_BLOCK;
  return n * (x->mfmt == MUON_MOMENTUM_BF16 ? sizeof(uint16_t) : sizeof(float));
}
/* The momentum lives whole on the matrix's owner, not in pieces on its holders: a Partial
   matrix's (the owner sums the parts), and an 8-bit one held in pieces (its blocks are the full
   matrix's). Its holders send their gradient pieces to the owner instead of U. */
static int muon__owner_momentum(const muon__matrix *x) {
  return x->parts > 1 || (x->mfmt == MUON_MOMENTUM_INT8 && x->size != (size_t)x->rows * x->cols);
}
/* Momentum element `at` of x's buffer: the address, whatever the format (int8: `at` starts a
   block; chunks of the state are multiples of MUON_Q8_BLOCK, see muon__plan_checks). */
static void *muon__mom_at(const muon__matrix *x, size_t at) { return (char *)x->momentum + muon__mom_bytes(x, at); }

/* One rank's share of a global matrix. The plan keeps these only for the matrices its rank owns
   (with their pieces and where each lands in a step): a world of 16,384 ranks x 200 matrices has
   3.3 M of them. Any other matrix's are derived when asked (muon__holders_of): its holders' ranks
   are kept, and each one's listing of the matrix (below) gives the rest. */
typedef struct muon__holder {
  int rank;
  int local;            /* that rank's matrix index */
  int source;           /* the rank that sends this piece's U (or its part) to the owner */
  unsigned slot : 16;   /* its layout: a slot of that rank's table in the plan's pool */
  unsigned part : 15;   /* its part of a Partial gradient (0 without PARTIAL levels) */
  unsigned has_momentum : 1;   /* a Partial matrix's momentum is there (its owner stays) */
} muon__holder;
#define MUON__MAX_SLOTS 65536    /* the bit-fields' bounds: distinct layouts of one rank, */
#define MUON__MAX_PARTS 32768    /* and parts of a Partial matrix */

/* A class of ranks (ranks that registered the same entries: a pipeline stage's FSDP ranks) lists
   a global matrix once: the class, its members' matrix index, layout slot and entry flags. */
typedef struct muon__listing {
  int cls, local, slot, flags;
} muon__listing;

typedef struct muon__global {
  char name[64];        /* for messages; cut at 63 characters */
  unsigned long long name_hash;   /* of the full name: what matches */
  long long key;
  int rows, cols;
  int owner;
  int local;            /* this rank's matrix index, -1 if none */
  int round;
  size_t xoff;          /* owner: offset of its NS operand in the round's gathered buffer */
  unsigned long long ns; /* owner: hash of its NS settings, the batch key with the shape */
  int skip;             /* this step, agreed by all ranks */
  int n_holders;        /* ranks with a non-empty piece, ascending (holder_ranks) */
  int mine;             /* this rank's index among them, -1 if none */
  int my_source;        /* who sends this rank's piece's U: itself, or a replica */
  int listing, n_listings;   /* its listings in the plan's, by class */
  int replicas;         /* some piece is held twice: its sources are not all its holders */
  int parts;            /* MUON_PARTIAL: parts of the gradient, summed by the owner (1: none) */
  float part_scale;
  size_t roff;          /* owner of a Partial matrix: its reduced gradient in the plan's `reduced` */
  int on_owner;         /* its momentum lives whole on the owner (muon__owner_momentum, agreed) */
  int moves_out, moves_back;   /* some holder sends its piece to the owner; the owner some piece back */
  int *holder_ranks;
  muon__holder *holders;   /* owner: its holders in full, their pieces, and where each sits in */
  muon__piece *pieces;     /* the received buffer in a step (all three in the plan's `owned`); */
  size_t *at;              /* NULL elsewhere */
} muon__global;

/* One exchange of a step (a round's U to the owners, or its O back): its buffers, in backend
   memory (the wire's bf16 messages, and host copies when staged), its counts in floats (send
   counts, displacements, receive counts, displacements: 4 x size each, in fp32 values and in
   wire slots), and, once it ran, the collective's status and native message. With prefetch or
   async several are in flight; in the debug setting the two of a round share one buffer set. */
/* A slot appended in version v of its vtable (see "Growing a vtable"): NULL in an older table. */
#define MUON__SLOT(vt, v, slot) ((vt)->version >= (v) ? (vt)->slot : NULL)
#define MUON__MIN(a, b) ((a) < (b) ? (a) : (b))
#define MUON__MAX(a, b) ((a) > (b) ? (a) : (b))
#define MUON__MAX_PREFETCH 8
#define MUON__MAX_UNJOINED 16   /* exchanges started on a communicator's queue and not joined */
typedef struct muon__xfer {
  float *send, *recv, *wire_send, *wire_recv, *host_send, *host_recv;
  int owns;                       /* these buffers are this exchange's own (freed with it) */
  int bf16;                       /* its messages are bf16 (muon_dist_config.wire) */
  size_t *cnt, *wire;
  int any;                        /* something moves: the collective is issued */
  int queued, done;               /* handed to the communication thread; it finished */
  int ticket, unjoined;           /* started (alltoallv's ticket); the compute queue has yet to
                                     join it (async on a queued communicator) */
  muon_status st;
  char error[240];
  const char *op;
} muon__xfer;

typedef struct muon__plan {
  int ready;
  int P, me;            /* the plan's world: the communicator's, or 1 and 0 without a dist config */
  muon__global *globals;
  int n_globals;
  int *round_start;     /* round r is globals round_order[round_start[r] .. round_start[r + 1]) */
  int *round_order;     /* the globals by round, each round's in global order */
  int n_rounds;
  int *order;           /* per round, the globals this rank owns, sorted into NS batches */
  int *order_start;     /* round r's are order [order_start[r], order_start[r+1]) */
  int max_local;        /* most matrices any rank registered */
  int max_layouts;      /* most distinct layouts any rank registered them with */
  muon_level *layout_levels;   /* every rank's layout table, levels one after another: */
  size_t *layout_at;    /* slot s of rank r starts at layout_at[r * max_layouts + s] */
  muon__holder *owned;  /* the holders of every matrix this rank owns, their pieces and offsets */
  muon__piece *owned_pieces;
  size_t *owned_at;
  int *class_of;        /* per rank: its class (ranks that registered the same entries) */
  int *class_start;     /* class c's ranks, ascending: class_members[class_start[c] .. class_start[c + 1]) */
  int *class_members;
  muon__listing *listings;   /* by global, then class (muon__global.listing) */
  /* Room for one global's holders in full (muon__holders_of), their pieces, groups of equal
     pieces and their hash table: sized at planning, so deriving never fails. */
  muon__holder *one_holders;
  muon__piece *one_pieces;
  int *one_first, *one_table, *one_pairs;
  int max_adamw;        /* most AdamW params any rank registered */
  uint64_t *adamw_names; /* (size + 1) x max_adamw: the name hashes of skipped AdamW params, everyone's then mine */
  int any_adamw_skip;   /* this step: some rank skips an AdamW param */
  /* Backend memory: */
  float *stash;         /* O of every local matrix, committed only when all rounds succeeded */
  muon__xfer *xfers;    /* the exchanges in flight: see muon__out_xfer / muon__back_xfer */
  int n_xfers;
  int prefetch;         /* muon_dist_config.prefetch, and whether rounds overlap at all */
  int pipelined;
  int side;             /* async on a queued communicator's own queue: joins come later */
  int backs;            /* redistributions in flight at once when pipelined (muon__back_xfer) */
  float *gathered;      /* full operands X of the matrices this rank owns in a round */
  float *reduced;       /* the summed gradients of the Partial matrices this rank owns, row-major,
                           kept until the commit moves their momentum */
  float *scratch;       /* one operand: a further part while summing, then U */
  size_t reduced_floats, scratch_floats;
  void *ns_ws;
  float **many_X;       /* newton_schulz_many's arguments for one round (NULL without the slot) */
  int *many_m, *many_n;
  const muon_hparams **many_hp;
  int wire_bf16;        /* the exchange carries bf16 (muon_dist_config.wire) */
  int stage;            /* through host buffers: the compute is on a device and the comm is not */
  muon_piece_copy *ops; /* scratch for one pack call */
  int ops_cap;
  size_t stash_floats, send_floats, recv_floats, gathered_floats, ns_ws_bytes;
  size_t *counts;       /* 9 x size: a NorMuon move's counts (4 x size), cursors (at 8 x size) */
  unsigned char *flags; /* (size + 1) x (max_local + 1) step flags: everyone's, then mine */
  int any_skip;         /* this step: some rank skips a matrix */
  /* Partial AdamW params (ZeRO-1). adamw_members: per local one, at its `members`, the rank of
     each part; aw_order: them in (name, offset) order, the same on every rank; aw: their
     exchange (its own buffers, always fp32); per local one, at its roff (chunk floats): the
     summed chunk, the chunk's new values and moments, kept for the commit; at its foff: the
     whole new parameter. any_adamw_partial: some rank has one, so every rank joins. */
  int any_adamw_partial, n_aw;
  int *adamw_members, *aw_order;
  muon__xfer aw;
  float *aw_reduced, *aw_param, *aw_m, *aw_v, *aw_full;
  int *aw_flags, *aw_host_flags;
  size_t aw_floats, aw_chunks, aw_total;
  int *out_flags;       /* backend memory: per global matrix, its NS output is not finite */
  int *host_out;
  unsigned char *out_skips; /* (size + 1) x skip_bytes: which non-finite outputs each rank skips,
                               one bit per matrix it holds (in global order), everyone's then mine */
  size_t skip_bytes;
  int *skip_at;         /* size: a cursor per rank while reading out_skips */
  /* The commit, tried first on copies (muon__check_commit): per local item, MUON__CHECKS flags
     per chunk of check_chunk elements (backend memory), set where a state or parameter would
     become non-finite; check_ws: room for one chunk of each buffer the commit writes. */
  int *checks, *host_checks;
  size_t n_checks, check_chunk;
  void *check_ws;
} muon__plan;

typedef struct muon__adamw {
  char name[64];
  unsigned long long name_hash;   /* of the full name ("#index" if unnamed): what a reshard matches */
  size_t offset, full_size;       /* this piece in the flattened parameter */
  void *param;
  const void *grad;
  void *mirror;
  muon_dtype param_dtype, grad_dtype;
  size_t size;
  int group;
  float *exp_avg, *exp_avg_sq;  /* backend memory */
  long long step;
  int grad_bound;       /* registered with a gradient, or given one (NULL too) by muon_set_adamw_grad */
  int skip;
  /* Partial: its gradient is one of `parts` parts; its moments cover chunk `part` of the piece,
     [lo, hi); members: where each part's rank is in the plan's adamw_members (planning). */
  int parts, part;
  float part_scale;
  size_t lo, hi;
  int members;
  size_t check, checks; /* its flags in the plan's commit checks: first, count */
  long long replica;                 /* REPLICATE levels: which set of parts it belongs to */
  size_t state_offset, state_size;   /* the range of the flattened parameter its moments cover */
  size_t roff, foff;                 /* Partial: its chunk and its whole in the plan's buffers */
} muon__adamw;

typedef struct muon__comm_thread muon__comm_thread;

/* The CPU backend's ctx: its allocator and threads (a NULL ctx: malloc, one thread). */
typedef struct muon__pool muon__pool;
typedef struct muon__cpu {
  const muon_allocator *allocator;
  int threads;                     /* >= 1 */
  int cblas;                       /* muon_cpu_desc.gemm resolved: CBLAS, or the built-in GEMM */
  muon_allocator own;              /* muon_cpu_create's: what `allocator` points at            */
  void (*parallel_for)(void *user, int n, muon_task_fn fn, void *arg);
  void *user;
  muon__pool *pool;                /* muon's own, when the desc gave no parallel_for */
} muon__cpu;

struct muon_optimizer {
  muon_allocator allocator;
  muon__cpu cpu;
  muon_logger logger;
  muon_nonfinite on_nonfinite;
  muon_hparams *groups;
  int n_groups;
  muon_adamw_hparams *adamw_groups;
  int n_adamw_groups;
  muon__matrix *matrices;
  int n_matrices;
  int matrices_cap;     /* room in matrices: grown by doubling, so registering n is O(n) */
  muon__adamw *adamw;
  int n_adamw;
  muon_compute compute;
  int device;           /* the compute backend's memory is not the host's */
  int state_host;       /* device, and the state in host memory (muon_desc.state_on_host) */
  int comm_queued;      /* a queued communicator's exchange has not been finished (vt->finish) */
  uint64_t run;         /* this run's identity: rank 0's proposal, agreed by the first step and
                           saved in every blob (0: none yet, and always in a world of one, where
                           no other rank's state can be mixed in); a loaded blob brings its own */
  uint64_t run_agreed;  /* the identity the ranks agreed on, the optimizer's once a step succeeds */
  float grad_scale;
  muon_rounding rounding;
  unsigned long long seed;
  int *verdicts;        /* backend memory: non-finite flag per matrix, then per AdamW param */
  int *host_verdicts;
  int verdicts_cap;
  float *clip_dev;      /* backend memory for muon_qk_clip's exchange on a device communicator,
                           kept across calls (an allocation per call would synchronise the device) */
  size_t clip_cap;
  muon_stats stats;
  muon_status step_status; /* this step: the first failure of this rank's own work */
  void *agree;          /* the agreement and vote buffers for comm.size ranks, allocated at
                           creation so that no rank can fail to join them for want of memory */
  muon_comm comm;
  int distributed;      /* a dist config was given */
  muon_dist_config dist;
  muon__comm_thread *comm_thread; /* muon_dist_config.async, with a host communicator */
  muon__plan plan;
  char error[512];
};

/* >>impl-memory -------------------------------------------------------------------------------
   Memory and messages */
/* Most floats one buffer may hold, so that byte counts (and the state blob's 8 bytes per
   AdamW float) cannot overflow size_t. */
#define MUON__MAX_FLOATS (SIZE_MAX / 16)

static void *muon__default_alloc(size_t size, void *user_data) { (void)user_data; return malloc(size); }
static void muon__default_free(void *ptr, void *user_data) { (void)user_data; free(ptr); }

static void *muon__alloc(const muon_allocator *a, size_t size) {
  return a->alloc(size ? size : 1, a->user_data);
}

static void muon__free(const muon_allocator *a, void *ptr) {
  if (ptr) a->free(ptr, a->user_data);
}

/* Grows an array of `elem` bytes from n to n+1 entries; the old block is freed on success only. */
static void *muon__grow(const muon_allocator *a, void *old, int n, size_t elem) {
  void *p = muon__alloc(a, (size_t)(n + 1) * elem);
  if (!p) return NULL;
  if (n) memcpy(p, old, (size_t)n * elem);
  muon__free(a, old);
  return p;
}

static void muon__log(const muon_logger *logger, muon_log_level level, const char *msg) {
  if (logger && logger->func) logger->func(level, msg, logger->user_data);
}

static muon_status muon__fail(muon_optimizer *opt, muon_status status, const char *fmt, ...) MUON__PRINTF(3, 4);
static muon_status muon__fail(muon_optimizer *opt, muon_status status, const char *fmt, ...) {
  va_list ap;
  size_t len;
  snprintf(opt->error, sizeof opt->error, "%s: ", muon_status_string(status));
  len = strlen(opt->error);
  va_start(ap, fmt);
  vsnprintf(opt->error + len, sizeof opt->error - len, fmt, ap);
  va_end(ap);
  muon__log(&opt->logger, MUON_LOG_ERROR, opt->error);
  return status;
}

/* A failed muon_create has no optimizer to keep its message: it goes to the logger, if any, and
   to a per-thread buffer that muon_error(NULL) returns (stb_image's failure reason, per thread). */
#if defined(__cplusplus) && __cplusplus >= 201103L
#define MUON__THREAD_LOCAL thread_local
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__STDC_NO_THREADS__)
#define MUON__THREAD_LOCAL _Thread_local
#elif defined(__GNUC__) || defined(__clang__)
#define MUON__THREAD_LOCAL __thread
#elif defined(_MSC_VER)
#define MUON__THREAD_LOCAL __declspec(thread)
#else
#define MUON__THREAD_LOCAL   /* no thread-local storage known: one buffer for all threads */
#endif
static MUON__THREAD_LOCAL char muon__create_error[512]; /* as an optimizer's error: a backend's may quote its library */

static void muon__create_fail(const muon_desc *desc, const char *msg) {
  snprintf(muon__create_error, sizeof muon__create_error, "%s", msg);
  if (desc) muon__log(&desc->logger, MUON_LOG_ERROR, msg);
}

MUON_API void muon_set_create_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(muon__create_error, sizeof muon__create_error, fmt, ap);
  va_end(ap);
}

MUON_API muon_status muon_create_failed(muon_status st, const char *fn, const char *fmt, ...) {
  const char *name = muon_status_string(st);   /* "MUON_ERR_X: its text": the name is kept */
  char reason[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  muon_set_create_error("%.*s: %s: %s", (int)strcspn(name, ":"), name, fn, reason);
  return st;
}

MUON_API const char *muon_error(const muon_optimizer *opt) {
  if (opt) return opt->error;
  return muon__create_error[0] ? muon__create_error : "muon_error: opt is NULL";
}

/* Writes a message for the caller to report and returns its status (printf-style). */
static muon_status muon__why(char *msg, size_t size, muon_status st, const char *fmt, ...) MUON__PRINTF(4, 5);
static muon_status muon__why(char *msg, size_t size, muon_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, size, fmt, ap);
  va_end(ap);
  return st;
}

/* Checks one group's hyperparameters; writes the message into buf. */
static muon_status muon__check_hparams(const muon_hparams *hp, char *buf, size_t size) {
  int k;
  if (hp->cautious_wd != 0 && hp->cautious_wd != 1)
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.cautious_wd must be 0 or 1 (got %d)", hp->cautious_wd);
  if ((unsigned)hp->ns_algorithm > (unsigned)MUON_NS_GRAM)
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.ns_algorithm is not a muon_ns_algorithm (got %d)",
                     (int)hp->ns_algorithm);
  if (hp->ns_algorithm == MUON_NS_GRAM &&
      ((hp->ns_restarts & 1u) || (hp->ns_steps >= 0 && hp->ns_steps < 32 && (hp->ns_restarts >> hp->ns_steps))))
    return muon__why(buf, size, MUON_ERR_ARG,
                     "muon_hparams.ns_restarts 0x%x restarts at an iteration outside [1, ns_steps = %d)",
                     hp->ns_restarts, hp->ns_steps);
  if ((unsigned)hp->normuon > (unsigned)MUON_NORMUON_LARGER)
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.normuon is not a muon_normuon (got %d)", (int)hp->normuon);
  if ((unsigned)hp->momentum_format > (unsigned)MUON_MOMENTUM_INT8)
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.momentum_format is not a muon_momentum_format (got %d)",
                     (int)hp->momentum_format);
  if (hp->normuon && !(muon__finite(hp->normuon_beta2) && hp->normuon_beta2 >= 0 && hp->normuon_beta2 < 1))
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.normuon_beta2 must be in [0, 1) (got %g)",
                     (double)hp->normuon_beta2);
  if (!(muon__finite(hp->lr) && hp->lr >= 0))
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.lr must be finite and >= 0 (got %g)", (double)hp->lr);
  if (!(muon__finite(hp->weight_decay) && hp->weight_decay >= 0))
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.weight_decay must be finite and >= 0 (got %g)",
                     (double)hp->weight_decay);
  if (!(hp->momentum >= 0 && hp->momentum < 1))
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.momentum must be in [0, 1) (got %g)", (double)hp->momentum);
  if (hp->nesterov != 0 && hp->nesterov != 1)
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.nesterov must be 0 or 1 (got %d)", hp->nesterov);
  if (hp->symmetric != 0 && hp->symmetric != 1)
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.symmetric must be 0 or 1 (got %d)", hp->symmetric);
  if (hp->ns_steps < 1 || hp->ns_steps > MUON_NS_MAX_STEPS)
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.ns_steps must be in [1, %d] (got %d)", MUON_NS_MAX_STEPS,
                     hp->ns_steps);
  for (k = 0; k < hp->ns_steps; k++)
    if (!muon__finite(hp->ns_coefficients[k][0]) || !muon__finite(hp->ns_coefficients[k][1]) ||
        !muon__finite(hp->ns_coefficients[k][2])) {
      snprintf(buf, size, "muon_hparams.ns_coefficients[%d] must be finite (got %g, %g, %g)", k,
               (double)hp->ns_coefficients[k][0], (double)hp->ns_coefficients[k][1], (double)hp->ns_coefficients[k][2]);
      return MUON_ERR_ARG;
    }
  if (!(muon__finite(hp->eps) && hp->eps > 0))
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.eps must be finite and > 0 (got %g)", (double)hp->eps);
  if ((unsigned)hp->adjust_lr > (unsigned)MUON_ADJUST_LR_SPECTRAL_UNCLAMPED)
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.adjust_lr is not a muon_adjust_lr (got %d)",
                     (int)hp->adjust_lr);
  if ((unsigned)hp->momentum_style > (unsigned)MUON_MOMENTUM_SGD)
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.momentum_style is not a muon_momentum_style (got %d)",
                     (int)hp->momentum_style);
  if ((unsigned)hp->precision > (unsigned)MUON_PRECISION_BF16)
    return muon__why(buf, size, MUON_ERR_ARG, "muon_hparams.precision is not a muon_precision (got %d)",
                     (int)hp->precision);
  return MUON_OK;
}

static muon_status muon__check_adamw_hparams(const muon_adamw_hparams *hp, char *buf, size_t size) {
  if (hp->cautious_wd != 0 && hp->cautious_wd != 1)
    return muon__why(buf, size, MUON_ERR_ARG, "muon_adamw_hparams.cautious_wd must be 0 or 1 (got %d)",
                     hp->cautious_wd);
  if (!(muon__finite(hp->lr) && hp->lr >= 0))
    return muon__why(buf, size, MUON_ERR_ARG, "muon_adamw_hparams.lr must be finite and >= 0 (got %g)", (double)hp->lr);
  if (!(hp->beta1 >= 0 && hp->beta1 < 1))
    return muon__why(buf, size, MUON_ERR_ARG, "muon_adamw_hparams.beta1 must be in [0, 1) (got %g)", (double)hp->beta1);
  if (!(hp->beta2 >= 0 && hp->beta2 < 1))
    return muon__why(buf, size, MUON_ERR_ARG, "muon_adamw_hparams.beta2 must be in [0, 1) (got %g)", (double)hp->beta2);
  if (!(muon__finite(hp->eps) && hp->eps >= 0))
    return muon__why(buf, size, MUON_ERR_ARG, "muon_adamw_hparams.eps must be finite and >= 0 (got %g)",
                     (double)hp->eps);
  if (!(muon__finite(hp->weight_decay) && hp->weight_decay >= 0))
    return muon__why(buf, size, MUON_ERR_ARG, "muon_adamw_hparams.weight_decay must be finite and >= 0 (got %g)",
                     (double)hp->weight_decay);
  return MUON_OK;
}

/* >>impl-pieces -------------------------------------------------------------------------------
   Layouts -> pieces. torch.chunk semantics: chunks of ceil(d/size); trailing ranks may get a
   short or empty chunk (18 rows over 8 ranks: 3,3,3,3,3,3,0,0). */
static muon_level muon__level(muon_placement placement, int dim, const muon_comm *group) {
  muon_level l;
  memset(&l, 0, sizeof l);
  l.placement = placement;
  l.dim = dim;
  l.size = group ? group->size : 1;
  l.index = group ? group->rank : 0;
  l.length = -1;
  return l;
}
MUON_API muon_level muon_shard(int dim, const muon_comm *group) { return muon__level(MUON_SHARD, dim, group); }
MUON_API muon_level muon_flat(const muon_comm *group) { return muon__level(MUON_FLAT, 0, group); }
MUON_API muon_level muon_replicate(const muon_comm *group) { return muon__level(MUON_REPLICATE, 0, group); }
MUON_API muon_level muon_partial(const muon_comm *group, muon_reduce reduce) {
  muon_level l = muon__level(MUON_PARTIAL, 0, group);
  l.reduce = reduce;
  return l;
}
MUON_API muon_level muon_flat_range(const muon_comm *group, long long offset, long long length) {
  muon_level l = muon__level(MUON_FLAT, 0, group);
  l.offset = offset;
  l.length = length;
  return l;
}

static void muon__chunk(long long d, int size, int index, long long *lo, long long *hi) {
  long long c = (d + size - 1) / size;
  *lo = (long long)index * c < d ? (long long)index * c : d;
  *hi = *lo + c < d ? *lo + c : d;
}

static muon__piece muon__whole_piece(int rows, int cols) {
  muon__piece p;
  p.r0 = 0; p.c0 = 0; p.h = rows; p.w = cols; p.f0 = 0; p.f1 = (long long)rows * cols;
  return p;
}

/* Same elements, same representation (replicas are recognised by equality): whole rows become
   a rectangle, a range inside one row a 1 x len rectangle; empty is all zeros. */
static muon__piece muon__canonical(muon__piece p) {
  if (p.f1 <= p.f0 || p.w <= 0 || p.h <= 0) { memset(&p, 0, sizeof p); return p; }
  if (p.f0 % p.w == 0 && p.f1 % p.w == 0) {
    p.r0 += p.f0 / p.w;
    p.h = (p.f1 - p.f0) / p.w;
    p.f0 = 0;
    p.f1 = p.h * p.w;
  } else if (p.f0 / p.w == (p.f1 - 1) / p.w) {
    p.r0 += p.f0 / p.w;
    p.c0 += p.f0 % p.w;
    p.h = 1;
    p.w = p.f1 - p.f0;
    p.f0 = 0;
    p.f1 = p.w;
  }
  return p;
}

static muon_status muon__levels_piece(const muon_level *levels, int n_levels, int rows, int cols, muon__piece *out,
                                      char *why, size_t n) {
  muon__piece p;
  int k, flat = 0;
  p.r0 = 0; p.c0 = 0; p.h = rows; p.w = cols; p.f0 = 0; p.f1 = (long long)rows * cols;
  for (k = 0; k < n_levels; k++) {
    const muon_level *l = &levels[k];
    long long lo, hi, len = p.f1 - p.f0;
    if (l->size < 1 || l->index < 0 || l->index >= l->size) {
      snprintf(why, n, "levels[%d]: index %d outside a group of %d", k, l->index, l->size);
      return MUON_ERR_SHAPE;
    }
    switch (l->placement) {
    case MUON_REPLICATE: break;
    case MUON_PARTIAL:
      if (l->reduce != MUON_REDUCE_SUM && l->reduce != MUON_REDUCE_MEAN) {
        snprintf(why, n, "levels[%d]: PARTIAL reduce must be MUON_REDUCE_SUM or MUON_REDUCE_MEAN (got %d)", k,
                 (int)l->reduce);
        return MUON_ERR_SHAPE;
      }
      break;
    case MUON_SHARD:
      if (l->dim != 0 && l->dim != 1) {
        snprintf(why, n, "levels[%d]: SHARD dim must be 0 or 1 (got %d)", k, l->dim);
        return MUON_ERR_SHAPE;
      }
      if (flat) {
        if (l->dim != 0) {
          snprintf(why, n, "levels[%d]: after a FLAT level the piece is 1-D; only SHARD(0) applies", k);
          return MUON_ERR_SHAPE;
        }
        muon__chunk(len, l->size, l->index, &lo, &hi);
        p.f1 = p.f0 + hi;
        p.f0 = p.f0 + lo;
      } else if (l->dim == 0) {
        muon__chunk(p.h, l->size, l->index, &lo, &hi);
        p.r0 += lo; p.h = hi - lo; p.f0 = 0; p.f1 = p.h * p.w;
      } else {
        muon__chunk(p.w, l->size, l->index, &lo, &hi);
        p.c0 += lo; p.w = hi - lo; p.f0 = 0; p.f1 = p.h * p.w;
      }
      break;
    case MUON_FLAT:
      if (l->length < 0) {
        muon__chunk(len, l->size, l->index, &lo, &hi);
      } else {
        if (l->offset < 0 || l->offset > len || l->length > len - l->offset) {
          snprintf(why, n, "levels[%d]: FLAT range of %lld at offset %lld does not fit the piece of %lld", k, l->length,
                   l->offset, len);
          return MUON_ERR_SHAPE;
        }
        lo = l->offset;
        hi = lo + l->length;
      }
      p.f1 = p.f0 + hi;
      p.f0 = p.f0 + lo;
      flat = 1;
      break;
    default:
      snprintf(why, n, "levels[%d]: placement %d is not a muon_placement", k, (int)l->placement);
      return MUON_ERR_SHAPE;
    }
  }
  *out = muon__canonical(p);
  return MUON_OK;
}
static muon_status muon__layout_piece(const muon_layout *L, int rows, int cols, muon__piece *out, char *why, size_t n) {
  if (L->n_levels < 0 || L->n_levels > MUON_MAX_LEVELS) {
    snprintf(why, n, "n_levels must be in [0, %d] (got %d)", MUON_MAX_LEVELS, L->n_levels);
    return MUON_ERR_SHAPE;
  }
  return muon__levels_piece(L->levels, L->n_levels, rows, cols, out, why, n);
}

/* The parts of a gradient under a layout: their count (1 without PARTIAL levels), this rank's
   part (mixed radix, the first PARTIAL level most significant) and MEAN's factor. */
static int muon__levels_parts(const muon_level *levels, int n_levels, int *part, float *scale) {
  int k;
  long long n = 1, p = 0, mean = 1;
  if (part) *part = 0;
  if (scale) *scale = 1.0f;
  for (k = 0; k < n_levels && k < MUON_MAX_LEVELS; k++) {
    const muon_level *v = &levels[k];
    if (v->placement != MUON_PARTIAL) continue;
    if (v->size < 1 || n > INT_MAX / v->size) return -1;
    n *= v->size;
    p = p * v->size + v->index;
    if (v->reduce == MUON_REDUCE_MEAN) mean *= v->size;
  }
  if (part) *part = (int)p;
  if (scale) *scale = 1.0f / (float)mean;
  return (int)n;
}
static int muon__layout_parts(const muon_layout *l, int *part, float *scale) {
  return muon__levels_parts(l->levels, l->n_levels, part, scale);
}

/* Walks a piece row segment by row segment: element (row, col .. col+len) of the full matrix is
   local element off .. off+len. Returns 0 when done. */
typedef struct muon__seg {
  long long f, row, col, len, off;
} muon__seg;

static int muon__next_seg(const muon__piece *p, muon__seg *s) {
  long long rin, cin;
  if (s->f >= p->f1) return 0;
  rin = s->f / p->w;
  cin = s->f % p->w;
  s->row = p->r0 + rin;
  s->col = p->c0 + cin;
  s->len = p->w - cin < p->f1 - s->f ? p->w - cin : p->f1 - s->f;
  s->off = s->f - p->f0;
  s->f += s->len;
  return 1;
}

static muon__seg muon__segs(const muon__piece *p) {
  muon__seg s;
  memset(&s, 0, sizeof s);
  s.f = p->f0;
  return s;
}

static muon_status muon__cpu_init(muon__cpu *cpu, const muon_cpu_desc *d, const muon_allocator *a, char *msg,
                                  size_t size);
/* The CPU backend (at the end of this file) shares these with the core. */
static int muon__cpu_threads(const void *ctx);
static int muon__is_cpu(const muon_compute *c);
static double muon__ns_cost(int rows, int cols);
static int muon__use_gram(const muon_hparams *hp, int m, int n);
static size_t muon__ns_ws_floats(int m, int n, int gram);
static muon_status muon__pool_start(muon__cpu *cpu, char *msg, size_t size);
static muon_status muon__comm_thread_start(muon_optimizer *opt, char *msg, size_t size);
static void muon__comm_thread_stop(muon_optimizer *opt);
static int muon__async_comm(const muon_optimizer *opt);
static void muon__pool_stop(muon__cpu *cpu);
static void muon__plan_free(muon_optimizer *opt);
static int muon__wire_bf16(const muon_optimizer *opt);
static void muon__log_plan(muon_optimizer *opt);
static muon_status muon__comm_finish(muon_optimizer *opt, const char *op);
static muon_status muon__exchange(muon_optimizer *opt, const long long *mine, int n, const long long **all,
                                  const char *op);
static muon_status muon__exchange3(muon_optimizer *opt, long long a, long long b, long long c, const long long **all,
                                   const char *op);
static unsigned long long muon__ns_hash(const muon_hparams *hp);
static size_t muon__agree_bytes(int P);
static void *muon__compute_alloc(muon_optimizer *opt, size_t bytes);
static void muon__compute_free(muon_optimizer *opt, void *ptr);
static void *muon__state_alloc(muon_optimizer *opt, size_t bytes);
static void muon__state_free(muon_optimizer *opt, void *ptr);
static muon_status muon__state_zero(muon_optimizer *opt, void *ptr, size_t bytes, const char *op);
static muon_status muon__compute_zero(muon_optimizer *opt, void *ptr, size_t bytes, const char *op);

/* >>impl-configs ------------------------------------------------------------------------------
   Built-in configs: muon_auto_config derives each matrix's layout from the groups. */
static void muon__push(muon_layout *l, muon_level level) {
  if (l->n_levels < MUON_MAX_LEVELS) l->levels[l->n_levels++] = level;
}

/* The levels over ddp, cp and HSDP's replicate: REPLICATE, or PARTIAL when the gradients are
   not reduced over them. */
static void muon__push_replicas(muon_layout *out, const muon_auto_desc *d) {
  const muon_comm *g[3];
  int k;
  g[0] = d->ddp; g[1] = d->cp; g[2] = d->replicate;
  for (k = 0; k < 3; k++)
    if (g[k]) muon__push(out, d->partial ? muon_partial(g[k], d->reduce) : muon_replicate(g[k]));
}

static muon_status muon__auto_layout(void *state, int index, const struct muon_matrix *m, muon_layout *out) {
  const muon_auto_desc *d = (const muon_auto_desc *)state;
  int expert, tp_dim;
  if (!d) { memset(out, 0, sizeof *out); return MUON_OK; }   /* muon_auto_config(NULL): whole matrices */
  expert = d->expert_of_matrix ? d->expert_of_matrix[index] : -1;
  tp_dim = d->tp_dim_per_matrix ? d->tp_dim_per_matrix[index] : d->tp_dim;
  (void)m;
  memset(out, 0, sizeof *out);
  muon__push_replicas(out, d);
  if (d->ep && expert < 0) muon__push(out, muon_replicate(d->ep));
  if (d->tp) muon__push(out, tp_dim == 0 || tp_dim == 1 ? muon_shard(tp_dim, d->tp) : muon_replicate(d->tp));
  if (d->fsdp) muon__push(out, d->fsdp_flat ? muon_flat(d->fsdp) : muon_shard(0, d->fsdp));
  if (d->shard) muon__push(out, d->fsdp_flat ? muon_flat(d->shard) : muon_shard(0, d->shard));
  /* Experts and stages are different matrices on different ranks even when their names match. */
  out->key = (d->pp ? (long long)(d->pp->rank + 1) << 32 : 0) + (expert >= 0 ? expert + 1 : 0);
  return MUON_OK;
}

/* With `partial`, a whole AdamW param's gradient is a part over the same groups as a matrix's. */
static muon_status muon__auto_adamw_layout(void *state, int index, const struct muon_adamw_param *p, muon_layout *out) {
  const muon_auto_desc *d = (const muon_auto_desc *)state;
  (void)index;
  memset(out, 0, sizeof *out);
  if (!d || !d->partial || p->offset || p->full_size) return MUON_OK;
  muon__push_replicas(out, d);
  if (d->ep) muon__push(out, muon_replicate(d->ep));   /* whole on every rank of the others */
  if (d->tp) muon__push(out, muon_replicate(d->tp));
  if (d->fsdp) muon__push(out, muon_replicate(d->fsdp));
  if (d->shard) muon__push(out, muon_replicate(d->shard));
  if (d->pp) muon__push(out, muon_replicate(d->pp));
  return MUON_OK;
}

MUON_API muon_dist_config muon_auto_config(const muon_auto_desc *desc) {
  muon_dist_config c;
  memset(&c, 0, sizeof c);
  c.layout = muon__auto_layout;
  c.adamw_layout = muon__auto_adamw_layout;
  c.state = (void *)desc;
  if (desc) {
    c.round_robin = desc->round_robin;
    c.round_bytes = desc->round_bytes;
    c.unchecked_commit = desc->unchecked_commit;
    c.wire = desc->wire;
    c.prefetch = desc->prefetch;
    c.async = desc->async;
  }
  return c;
}

MUON_API muon_dist_config muon_layout_config(void) {
  muon_dist_config c;
  memset(&c, 0, sizeof c);
  return c;
}

/* >>impl-create -------------------------------------------------------------------------------
   Creation, groups, registration */
/* muon_create's checks, each writing the whole message ("MUON_ERR_ARG: muon_desc...") to msg. */
static muon_status muon__check_comm(const muon_comm *c, char *msg, size_t size) {
  const char *bad = NULL;
  if (!c->vt) bad = "muon_desc.comm->vt is NULL";
  else if (c->vt->version < 1 || c->vt->version > MUON_COMM_VTABLE_VERSION) {
    snprintf(msg, size,
             "MUON_ERR_ARG: muon_desc.comm->vt->version is %d, this muon.h takes 1 to %d (MUON_COMM_VTABLE_VERSION)",
             c->vt->version, MUON_COMM_VTABLE_VERSION);
    return MUON_ERR_ARG;
  } else if (!c->vt->alltoallv || !c->vt->allgather) bad = "muon_desc.comm->vt needs the alltoallv and allgather slots";
  else if (c->size < 1 || c->rank < 0 || c->rank >= c->size) bad = "muon_desc.comm has rank outside [0, size)";
  else if (c->vt->memory != MUON_MEMORY_HOST && c->vt->memory != MUON_MEMORY_DEVICE)
    bad = "muon_desc.comm->vt->memory is not MUON_MEMORY_HOST or MUON_MEMORY_DEVICE";
  else if (c->vt->queued != 0 && c->vt->queued != 1) bad = "muon_desc.comm->vt->queued is not 0 or 1";
  else if (c->vt->queued && (!c->vt->join || !c->vt->finish))
    bad = "muon_desc.comm->vt is queued: it needs the join and finish slots";
  if (!bad) return MUON_OK;
  snprintf(msg, size, "MUON_ERR_ARG: %s", bad);
  return MUON_ERR_ARG;
}

static muon_status muon__check_compute(const muon_compute *c, char *msg, size_t size) {
  const muon_compute_vtable *v = c->vt;
  const char *bad = NULL;
  if (!v) bad = "muon_desc.compute->vt is NULL";
  else if (v->version < 1 || v->version > MUON_COMPUTE_VTABLE_VERSION) {
    snprintf(
        msg, size,
        "MUON_ERR_ARG: muon_desc.compute->vt->version is %d, this muon.h takes 1 to %d (MUON_COMPUTE_VTABLE_VERSION)",
        v->version, MUON_COMPUTE_VTABLE_VERSION);
    return MUON_ERR_ARG;
  } else if (v->memory != MUON_MEMORY_HOST && v->memory != MUON_MEMORY_DEVICE)
    bad = "muon_desc.compute->vt->memory is not MUON_MEMORY_HOST or MUON_MEMORY_DEVICE";
  else if (!v->alloc || !v->free || !v->copy || !v->zero || !v->pack || !v->momentum || !v->ns_workspace ||
           !v->newton_schulz || !v->apply || !v->adamw || !v->nonfinite || !v->cast || !v->sync || !v->normuon)
    bad = "muon_desc.compute->vt lacks a required slot (all but alloc_host, free_host, error, destroy and "
          "newton_schulz_many are required)";
  else if (!v->alloc_host != !v->free_host)
    bad = "muon_desc.compute->vt: set both alloc_host and free_host, or neither";
  if (!bad) return MUON_OK;
  snprintf(msg, size, "MUON_ERR_ARG: %s", bad);
  return MUON_ERR_ARG;
}

static muon_status muon__check_desc(const muon_desc *desc, char *msg, size_t size) {
  const muon_dist_config *d = desc->dist;
  char why[400];
  muon_status st;
  if (!desc->allocator.alloc != !desc->allocator.free)
    return muon__why(msg, size, MUON_ERR_ARG, "MUON_ERR_ARG: muon_desc.allocator: set both alloc and free, or neither");
  if ((st = muon__check_hparams(&desc->hparams, why, sizeof why)) != MUON_OK ||
      (st = muon__check_adamw_hparams(&desc->adamw, why, sizeof why)) != MUON_OK)
    return muon__why(msg, size, st, "%s: muon_desc: %s", muon_status_string(st), why);
  if ((unsigned)desc->on_nonfinite > (unsigned)MUON_NONFINITE_SKIP)
    return muon__why(msg, size, MUON_ERR_ARG, "MUON_ERR_ARG: muon_desc.on_nonfinite is not a muon_nonfinite");
  if (d && (unsigned)d->wire > (unsigned)MUON_WIRE_BF16)
    return muon__why(msg, size, MUON_ERR_ARG, "MUON_ERR_ARG: muon_dist_config.wire is not a muon_wire");
  if (d && (d->prefetch < 0 || d->prefetch > MUON__MAX_PREFETCH))
    return muon__why(msg, size, MUON_ERR_ARG, "MUON_ERR_ARG: muon_dist_config.prefetch must be in [0, %d] (got %d)",
                     MUON__MAX_PREFETCH, d->prefetch);
  if (d && d->async && !MUON__POOL && !(desc->comm && desc->comm->vt && desc->comm->vt->queued))
    return muon__why(msg, size, MUON_ERR_ARG,
                     "MUON_ERR_ARG: muon_dist_config.async needs threads, and this build has none "
                     "(MUON_NO_THREADS, or not POSIX)");
  if (desc->comm && (st = muon__check_comm(desc->comm, msg, size)) != MUON_OK) return st;
  if (desc->compute && (st = muon__check_compute(desc->compute, msg, size)) != MUON_OK) return st;
  if (desc->comm && desc->comm->vt->memory == MUON_MEMORY_DEVICE &&
      (!desc->compute || desc->compute->vt->memory != MUON_MEMORY_DEVICE))
    return muon__why(msg, size, MUON_ERR_ARG,
                     "MUON_ERR_ARG: muon_desc.comm exchanges device memory (e.g. NCCL) but muon_desc.compute is a "
                     "host backend: set desc.compute to the device's backend (muon_cuda_create)");
  if ((unsigned)desc->rounding > (unsigned)MUON_ROUND_STOCHASTIC)
    return muon__why(msg, size, MUON_ERR_ARG, "MUON_ERR_ARG: muon_desc.rounding is not a muon_rounding");
  if ((unsigned)desc->state_on_host > 1u)
    return muon__why(msg, size, MUON_ERR_ARG, "MUON_ERR_ARG: muon_desc.state_on_host must be 0 or 1 (got %d)",
                     desc->state_on_host);
  if (d && !d->gather != !d->redistribute)
    return muon__why(msg, size, MUON_ERR_ARG,
                     "MUON_ERR_ARG: muon_dist_config: set both gather and redistribute, or neither");
  return MUON_OK;
}

/* The optimizer's fields from a checked desc, its groups, the agreement buffers, its own CPU
   backend (desc.compute NULL) and the communication thread (async on a host communicator). On
   failure msg says why and the caller destroys opt. */
static muon_status muon__init(muon_optimizer *opt, const muon_desc *desc, char *msg, size_t size) {
  const muon_allocator *a = &opt->allocator;
  muon_status st;
  opt->logger = desc->logger;
  opt->on_nonfinite = desc->on_nonfinite;
  opt->comm = desc->comm ? *desc->comm : muon_comm_self();
  opt->distributed = desc->dist != NULL;
  if (desc->dist) opt->dist = *desc->dist;
  opt->cpu.allocator = a;
  opt->cpu.threads = 1;
  if (desc->compute) opt->compute = *desc->compute;
  else {   /* its own CPU backend, started below once the groups exist */
    opt->compute = muon_compute_cpu();
    opt->compute.ctx = &opt->cpu;
  }
  opt->device = opt->compute.vt->memory == MUON_MEMORY_DEVICE;
  opt->state_host = opt->device && desc->state_on_host;
  opt->grad_scale = 1.0f;
  opt->rounding = desc->rounding;
  opt->seed = desc->seed;
  opt->groups = (muon_hparams *)muon__alloc(a, sizeof(muon_hparams));
  opt->adamw_groups = (muon_adamw_hparams *)muon__alloc(a, sizeof(muon_adamw_hparams));
  if (!opt->groups || !opt->adamw_groups)
    return muon__why(msg, size, MUON_ERR_NOMEM, "MUON_ERR_NOMEM: muon_create: allocating the parameter groups failed");
  opt->groups[0] = desc->hparams;
  opt->n_groups = 1;
  opt->adamw_groups[0] = desc->adamw;
  opt->n_adamw_groups = 1;
  if (opt->distributed && !(opt->agree = muon__alloc(a, muon__agree_bytes(opt->comm.size))))
    return muon__why(msg, size, MUON_ERR_NOMEM, "MUON_ERR_NOMEM: muon_create: allocating the agreement buffers failed");
  if (!desc->compute) {   /* a CPU backend of its own, with the defaults */
    muon_cpu_desc cd = muon_cpu_default_desc();
    if ((st = muon__cpu_init(&opt->cpu, &cd, a, msg, size)) != MUON_OK) return st;
  }
  if (opt->distributed && opt->dist.async && muon__async_comm(opt)) return muon__comm_thread_start(opt, msg, size);
  return MUON_OK;
}

MUON_API muon_status muon_create(muon_optimizer **out, const muon_desc *desc) {
  muon_allocator a;
  muon_optimizer *opt;
  char msg[480];
  muon_status st;
  if (!out) { muon__create_fail(desc, "MUON_ERR_ARG: muon_create: opt is NULL"); return MUON_ERR_ARG; }
  *out = NULL;
  muon__create_error[0] = '\0';
  if (!desc) { muon__create_fail(NULL, "MUON_ERR_ARG: muon_create: desc is NULL"); return MUON_ERR_ARG; }
  if ((st = muon__check_desc(desc, msg, sizeof msg)) != MUON_OK) { muon__create_fail(desc, msg); return st; }
  a = desc->allocator;
  if (!a.alloc) { a.alloc = muon__default_alloc; a.free = muon__default_free; a.user_data = NULL; }
  if (!(opt = (muon_optimizer *)muon__alloc(&a, sizeof *opt))) {
    muon__create_fail(desc, "MUON_ERR_NOMEM: muon_create: allocating the optimizer failed");
    return MUON_ERR_NOMEM;
  }
  memset(opt, 0, sizeof *opt);
  opt->allocator = a;
  if ((st = muon__init(opt, desc, msg, sizeof msg)) != MUON_OK) {
    muon__create_fail(desc, msg);
    muon_destroy(opt);
    return st;
  }
  *out = opt;
  return MUON_OK;
}

MUON_API void muon_destroy(muon_optimizer *opt) {
  muon_allocator a;
  int i;
  if (!opt) return;
  a = opt->allocator;
  muon__comm_thread_stop(opt);
  muon__plan_free(opt);
  for (i = 0; i < opt->n_matrices; i++) {
    if (opt->matrices[i].own_momentum) muon__state_free(opt, opt->matrices[i].momentum);
    muon__compute_free(opt, opt->matrices[i].normuon);
    muon__compute_free(opt, opt->matrices[i].normuon_next);
  }
  for (i = 0; i < opt->n_adamw; i++) {
    muon__state_free(opt, opt->adamw[i].exp_avg);
    muon__state_free(opt, opt->adamw[i].exp_avg_sq);
  }
  muon__compute_free(opt, opt->verdicts);
  muon__compute_free(opt, opt->clip_dev);
  muon__free(&a, opt->host_verdicts);
  muon__free(&a, opt->matrices);
  muon__free(&a, opt->adamw);
  muon__free(&a, opt->groups);
  muon__free(&a, opt->adamw_groups);
  muon__free(&a, opt->agree);
  muon__pool_stop(&opt->cpu);
  muon__free(&a, opt);
}

MUON_API muon_status muon_add_group(muon_optimizer *opt, const muon_hparams *hp, int *group_out) {
  char msg[400];
  muon_status st;
  muon_hparams *g;
  if (!opt) return MUON_ERR_ARG;
  if (!hp) return muon__fail(opt, MUON_ERR_ARG, "muon_add_group: hp is NULL");
  if ((st = muon__check_hparams(hp, msg, sizeof msg)) != MUON_OK) return muon__fail(opt, st, "muon_add_group: %s", msg);
  g = (muon_hparams *)muon__grow(&opt->allocator, opt->groups, opt->n_groups, sizeof *g);
  if (!g) return muon__fail(opt, MUON_ERR_NOMEM, "muon_add_group: allocating group %d failed", opt->n_groups);
  opt->groups = g;
  g[opt->n_groups] = *hp;
  if (group_out) *group_out = opt->n_groups;
  opt->n_groups++;
  return MUON_OK;
}

MUON_API muon_status muon_set_group(muon_optimizer *opt, int group, const muon_hparams *hp) {
  char msg[400];
  muon_status st;
  if (!opt) return MUON_ERR_ARG;
  if (!hp) return muon__fail(opt, MUON_ERR_ARG, "muon_set_group: hp is NULL");
  if (group < 0 || group >= opt->n_groups)
    return muon__fail(opt, MUON_ERR_ARG, "muon_set_group: group %d does not exist (have %d)", group, opt->n_groups);
  if ((st = muon__check_hparams(hp, msg, sizeof msg)) != MUON_OK)
    return muon__fail(opt, st, "muon_set_group(%d): %s", group, msg);
  if (hp->momentum_format != opt->groups[group].momentum_format) {
    int i;
    for (i = 0; i < opt->n_matrices; i++)
      if (opt->matrices[i].group == group)
        return muon__fail(opt, MUON_ERR_ARG,
                          "muon_set_group(%d): muon_hparams.momentum_format cannot change once a matrix is registered "
                          "in the group (matrix %d, '%s', keeps its momentum in format %d); to convert a run, load its "
                          "state into an optimizer created with the new format",
                          group, i, opt->matrices[i].name, (int)opt->groups[group].momentum_format);
  }
  if (muon__ns_hash(hp) != muon__ns_hash(&opt->groups[group])) opt->plan.ready = 0; /* re-check agreement */
  opt->groups[group] = *hp;
  return MUON_OK;
}

MUON_API muon_status muon_get_group(const muon_optimizer *opt, int group, muon_hparams *hp) {
  if (!opt || !hp || group < 0 || group >= opt->n_groups) return MUON_ERR_ARG;
  *hp = opt->groups[group];
  return MUON_OK;
}

MUON_API muon_status muon_set_lr(muon_optimizer *opt, int group, float lr) {
  muon_hparams hp;
  if (!opt) return MUON_ERR_ARG;
  if (group < 0 || group >= opt->n_groups)
    return muon__fail(opt, MUON_ERR_ARG, "muon_set_lr: group %d does not exist (have %d)", group, opt->n_groups);
  hp = opt->groups[group];
  hp.lr = lr;
  return muon_set_group(opt, group, &hp);
}

MUON_API muon_status muon_add_adamw_group(muon_optimizer *opt, const muon_adamw_hparams *hp, int *group_out) {
  char msg[400];
  muon_status st;
  muon_adamw_hparams *g;
  if (!opt) return MUON_ERR_ARG;
  if (!hp) return muon__fail(opt, MUON_ERR_ARG, "muon_add_adamw_group: hp is NULL");
  if ((st = muon__check_adamw_hparams(hp, msg, sizeof msg)) != MUON_OK)
    return muon__fail(opt, st, "muon_add_adamw_group: %s", msg);
  g = (muon_adamw_hparams *)muon__grow(&opt->allocator, opt->adamw_groups, opt->n_adamw_groups, sizeof *g);
  if (!g)
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_add_adamw_group: allocating group %d failed", opt->n_adamw_groups);
  opt->adamw_groups = g;
  g[opt->n_adamw_groups] = *hp;
  if (group_out) *group_out = opt->n_adamw_groups;
  opt->n_adamw_groups++;
  return MUON_OK;
}

MUON_API muon_status muon_set_adamw_group(muon_optimizer *opt, int group, const muon_adamw_hparams *hp) {
  char msg[400];
  muon_status st;
  if (!opt) return MUON_ERR_ARG;
  if (!hp) return muon__fail(opt, MUON_ERR_ARG, "muon_set_adamw_group: hp is NULL");
  if (group < 0 || group >= opt->n_adamw_groups)
    return muon__fail(opt, MUON_ERR_ARG, "muon_set_adamw_group: group %d does not exist (have %d)", group,
                      opt->n_adamw_groups);
  if ((st = muon__check_adamw_hparams(hp, msg, sizeof msg)) != MUON_OK)
    return muon__fail(opt, st, "muon_set_adamw_group(%d): %s", group, msg);
  opt->adamw_groups[group] = *hp;
  return MUON_OK;
}

MUON_API muon_status muon_set_adamw_lr(muon_optimizer *opt, int group, float lr) {
  muon_adamw_hparams hp;
  if (!opt) return MUON_ERR_ARG;
  if (group < 0 || group >= opt->n_adamw_groups)
    return muon__fail(opt, MUON_ERR_ARG, "muon_set_adamw_lr: group %d does not exist (have %d)", group,
                      opt->n_adamw_groups);
  hp = opt->adamw_groups[group];
  hp.lr = lr;
  return muon_set_adamw_group(opt, group, &hp);
}

/* FNV-1a, continued from h (start: MUON__FNV_START). */
#define MUON__FNV_START 14695981039346656037ull
static uint64_t muon__fnv1a_more(uint64_t h, const unsigned char *p, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
  return h;
}
static uint64_t muon__fnv1a(const unsigned char *p, size_t n) { return muon__fnv1a_more(MUON__FNV_START, p, n); }

/* The full name's hash (slice >= 0: with "[slice]", as a stack's slice is named): planning
   matches matrices on it, so two long names that share their first 63 characters stay apart. */
static uint64_t muon__name_hash(const char *name, int slice) {
  char suffix[24];
  uint64_t h = muon__fnv1a((const unsigned char *)(name ? name : ""), name ? strlen(name) : 0);
  if (slice >= 0) {
    snprintf(suffix, sizeof suffix, "[%d]", slice);
    h = muon__fnv1a_more(h, (const unsigned char *)suffix, strlen(suffix));
  }
  return h;
}

static void muon__copy_name(char *dst, size_t size, const char *name) {
  if (!name) name = "";
  strncpy(dst, name, size - 1);
  dst[size - 1] = '\0';
}

/* The non-finite verdicts hold one int per matrix and AdamW param: grown before registering. */
static muon_status muon__reserve_verdicts(muon_optimizer *opt, int n, const char *op) {
  int *dev, *host;
  if (n <= opt->verdicts_cap) return MUON_OK;
  if (opt->verdicts_cap <= INT_MAX / 2 && n < 2 * opt->verdicts_cap) n = 2 * opt->verdicts_cap;   /* doubling */
  dev = (int *)muon__compute_alloc(opt, (size_t)n * sizeof(int));
  host = dev ? (int *)muon__alloc(&opt->allocator, (size_t)n * sizeof(int)) : NULL;
  if (!host) {
    muon__compute_free(opt, dev);
    return muon__fail(opt, MUON_ERR_NOMEM, "%s: allocating %d non-finite flags failed", op, n);
  }
  muon__compute_free(opt, opt->verdicts);
  muon__free(&opt->allocator, opt->host_verdicts);
  opt->verdicts = dev;
  opt->host_verdicts = host;
  opt->verdicts_cap = n;
  return MUON_OK;
}

static size_t muon__dtype_size(muon_dtype t) { return t == MUON_DTYPE_BF16 ? 2 : 4; }

/* What muon_add_matrix resolved from a muon_matrix: its layout and piece, strides, parts. */
typedef struct muon__new_matrix {
  muon_layout layout;
  muon__piece piece;
  size_t size, stride, grad_stride, mirror_stride, mom_stride;
  int count, parts;
  float part_scale;
  int on_owner;         /* its momentum lives whole on its owner (muon__owner_momentum) */
} muon__new_matrix;

/* Validate: every field of m, its layout and strides, before anything is allocated. */
static muon_status muon__matrix_check(muon_optimizer *opt, const muon_matrix *m, const char *name, int first,
                                      muon__new_matrix *r) {
  int count;
  size_t size, stride, grad_stride, mirror_stride, mom_stride;
  muon_status st = MUON_OK;
#define MUON__BAD(st, ...) do { char what_[300]; snprintf(what_, sizeof what_, __VA_ARGS__); \
    return muon__fail(opt, st, "muon_add_matrix: %s (matrix %d, '%s')", what_, first, name); } while (0)
  if (m->ndim != 0 && m->ndim != 2)
    MUON__BAD(
        MUON_ERR_SHAPE,
        "muon_matrix.ndim must be 2, got %d: Muon only orthogonalises 2-D weights; register other parameters with muon_add_adamw_param",
        m->ndim);
  if (opt->distributed &&
      !name[0]) /* by position, two ranks registering in another order would pair wrongly, silently */
    MUON__BAD(MUON_ERR_ARG, "muon_matrix.name is required with a dist config: ranks pair matrices by name");
  if (m->rows <= 0 || m->cols <= 0)
    MUON__BAD(MUON_ERR_SHAPE, "muon_matrix.rows and .cols must be > 0 (got %d x %d)", m->rows, m->cols);
  if (!m->param) MUON__BAD(MUON_ERR_ARG, "muon_matrix.param is NULL");
  if (m->count < 0) MUON__BAD(MUON_ERR_SHAPE, "muon_matrix.count must be >= 0 (got %d)", m->count);
  if (m->group < 0 || m->group >= opt->n_groups)
    MUON__BAD(MUON_ERR_ARG, "muon_matrix.group %d does not exist (have %d)", m->group, opt->n_groups);
  if ((unsigned)m->param_dtype > (unsigned)MUON_DTYPE_BF16)
    MUON__BAD(MUON_ERR_ARG, "muon_matrix.param_dtype is not a muon_dtype (got %d)", (int)m->param_dtype);
  if ((unsigned)m->grad_dtype > (unsigned)MUON_DTYPE_BF16)
    MUON__BAD(MUON_ERR_ARG, "muon_matrix.grad_dtype is not a muon_dtype (got %d)", (int)m->grad_dtype);
  memset(&r->layout, 0, sizeof r->layout);
  if (m->layout) {            /* the matrix's own layout is the most specific: it wins */
    if (!opt->distributed)
      MUON__BAD(MUON_ERR_ARG, "muon_matrix.layout is set but muon_desc.dist is NULL (use muon_layout_config())");
    r->layout = *m->layout;
  } else if (opt->distributed && opt->dist.layout) {
    st = opt->dist.layout(opt->dist.state, first, m, &r->layout);
    if (st != MUON_OK) MUON__BAD(st, "muon_dist_config.layout returned %s", muon_status_string(st));
  }
  {
    char why[240];
    if (muon__layout_piece(&r->layout, m->rows, m->cols, &r->piece, why, sizeof why) != MUON_OK)
      MUON__BAD(MUON_ERR_SHAPE, "muon_matrix.layout: %s", why);
  }
  size = (size_t)(r->piece.f1 - r->piece.f0);
  r->size = size;
  r->parts = muon__layout_parts(&r->layout, NULL, &r->part_scale);
  if (r->parts < 1)
    MUON__BAD(MUON_ERR_SHAPE, "muon_matrix.layout: its PARTIAL groups hold more than %d parts together", INT_MAX);
  if (m->momentum && opt->groups[m->group].momentum_format != MUON_MOMENTUM_FP32)
    MUON__BAD(MUON_ERR_ARG,
              "muon_matrix.momentum must be NULL in group %d: its muon_hparams.momentum_format is not FP32, and muon "
              "allocates the stored form itself",
              m->group);
  r->on_owner = r->parts > 1 || (opt->groups[m->group].momentum_format == MUON_MOMENTUM_INT8 &&
                                  size != (size_t)m->rows * (size_t)m->cols);
  if (opt->groups[m->group].momentum_format == MUON_MOMENTUM_INT8 && opt->device &&
      !MUON__SLOT(opt->compute.vt, 1, blockwise))
    MUON__BAD(MUON_ERR_BACKEND,
              "group %d's muon_hparams.momentum_format is INT8, but the compute backend has no `blockwise` slot "
              "(a device backend must quantise its own memory)",
              m->group);
  if (r->parts > 1 && m->momentum)
    MUON__BAD(
        MUON_ERR_ARG,
        "muon_matrix.momentum must be NULL for a Partial matrix: its momentum lives on its owner, whole, allocated by muon");
  count = r->count = m->count ? m->count : 1;
  if (count > INT_MAX - first || (size_t)count > MUON__MAX_FLOATS / (size ? size : 1))
    MUON__BAD(MUON_ERR_SHAPE, "muon_matrix.count %d of %zu floats each is too large", count, size);
  stride = r->stride = m->stride ? m->stride : size;
  grad_stride = r->grad_stride = m->grad_stride ? m->grad_stride : stride;
  mirror_stride = r->mirror_stride = m->mirror_stride ? m->mirror_stride : stride;
  mom_stride = r->mom_stride = m->momentum_stride ? m->momentum_stride : size;
  if (count > 1 && (stride < size || grad_stride < size || mirror_stride < size || mom_stride < size))
    MUON__BAD(
        MUON_ERR_SHAPE,
        "muon_matrix strides (param %zu, grad %zu, mirror %zu, momentum %zu) make the %d stacked %d x %d matrices overlap (each needs >= %zu, the local piece)",
        stride, grad_stride, mirror_stride, mom_stride, count, m->rows, m->cols, size);
  if (count > 1 && size &&
      ((size_t)(count - 1) > MUON__MAX_FLOATS / stride || (size_t)(count - 1) > MUON__MAX_FLOATS / grad_stride ||
       (size_t)(count - 1) > MUON__MAX_FLOATS / mirror_stride || (size_t)(count - 1) > MUON__MAX_FLOATS / mom_stride))
    MUON__BAD(MUON_ERR_SHAPE, "muon_matrix: %d slices at these strides overflow the address space", count);
#undef MUON__BAD
  return MUON_OK;
}

/* The matrix array's room for `need` matrices: doubled, so that registering n one at a time (a
   MoE stage's thousands of experts) copies O(n) entries, not O(n^2). */
static int muon__matrices_cap(const muon_optimizer *opt, int need) {
  int cap = opt->matrices_cap > INT_MAX / 2 ? INT_MAX : 2 * opt->matrices_cap;
  return cap > need ? cap : need;
}

/* Reserve: the verdicts, the grown matrix array and each slice's momentum (zeroed), so that a
   failure leaves the optimizer as it was. */
static muon_status muon__matrix_reserve(muon_optimizer *opt, const muon_matrix *m, const char *name, int first,
                                        const muon__new_matrix *r, muon__matrix **grown_out, float ***moms_out) {
  int i, count = r->count;
  muon__matrix *grown;
  float **moms;
  muon_status st = MUON_OK;
  if ((st = muon__reserve_verdicts(opt, first + count + opt->n_adamw, "muon_add_matrix")) != MUON_OK) return st;
  moms = (float **)muon__alloc(&opt->allocator, (size_t)count * sizeof(float *));
  if (!moms) grown = NULL;
  else if (first + count <= opt->matrices_cap) grown = opt->matrices;
  else grown = (muon__matrix *)muon__alloc(&opt->allocator, (size_t)muon__matrices_cap(opt, first + count) *
                                                                 sizeof(muon__matrix));
  muon__matrix fmt;
  fmt.mfmt = opt->groups[m->group].momentum_format;
  for (i = 0; grown && i < count; i++) {
    if (r->on_owner) { moms[i] = NULL; continue; }   /* its owner's, allocated at planning */
    moms[i] = m->momentum ? m->momentum + (size_t)i * r->mom_stride
                          : (float *)muon__state_alloc(opt, muon__mom_bytes(&fmt, r->size));
    if (!moms[i]) break;
  }
  if (!grown || i < count) {
    while (grown && !m->momentum && i-- > 0) muon__state_free(opt, moms[i]);
    if (grown != opt->matrices) muon__free(&opt->allocator, grown);
    muon__free(&opt->allocator, moms);
    return muon__fail(opt, MUON_ERR_NOMEM,
                      "muon_add_matrix: allocating momentum for %d x %d x %d failed (matrix %d, '%s')", count, m->rows,
                      m->cols, first, name);
  }
  for (i = 0; i < count && !r->on_owner && st == MUON_OK; i++)
    st = muon__state_zero(opt, moms[i], muon__mom_bytes(&fmt, r->size), "muon_add_matrix: zeroing the momentum");
  if (st != MUON_OK) {
    for (i = 0; !m->momentum && i < count; i++) muon__state_free(opt, moms[i]);
    if (grown != opt->matrices) muon__free(&opt->allocator, grown);
    muon__free(&opt->allocator, moms);
    return st;
  }
  *grown_out = grown;
  *moms_out = moms;
  return MUON_OK;
}

/* Commit: the slices become matrices first .. first + count - 1; cannot fail. */
static void muon__matrix_commit(muon_optimizer *opt, const muon_matrix *m, const char *name, int first,
                                const muon__new_matrix *r, muon__matrix *grown, float **moms) {
  int i, count = r->count;
  if (grown != opt->matrices) {
    if (first) memcpy(grown, opt->matrices, (size_t)first * sizeof(muon__matrix));
    muon__free(&opt->allocator, opt->matrices);
    opt->matrices_cap = muon__matrices_cap(opt, first + count);
    opt->matrices = grown;
  }
  for (i = 0; i < count; i++) {
    muon__matrix *x = &grown[first + i];
    memset(x, 0, sizeof *x);
    if (count > 1) snprintf(x->name, sizeof x->name, "%.50s[%d]", name, i);
    else muon__copy_name(x->name, sizeof x->name, name);
    if (name[0] || count > 1) x->name_hash = muon__name_hash(name, count > 1 ? i : -1);
    else { char anon[24]; snprintf(anon, sizeof anon, "#%d", first + i); x->name_hash = muon__name_hash(anon, -1); }
    x->param = (char *)m->param + (size_t)i * r->stride * muon__dtype_size(m->param_dtype);
    x->grad = m->grad ? (const char *)m->grad + (size_t)i * r->grad_stride * muon__dtype_size(m->grad_dtype) : NULL;
    x->grad_bound = m->grad != NULL;
    x->mirror = m->mirror ? (char *)m->mirror + (size_t)i * r->mirror_stride * 2 : NULL;
    x->param_dtype = m->param_dtype;
    x->grad_dtype = m->grad_dtype;
    x->rows = m->rows;
    x->cols = m->cols;
    x->group = m->group;
    x->size = r->size;
    x->layout = r->layout;
    x->piece = r->piece;
    x->global = -1;
    x->momentum = moms[i];
    x->momentum_size = r->on_owner ? 0 : r->size;
    x->own_momentum = m->momentum == NULL;
    x->mfmt = opt->groups[m->group].momentum_format;
    x->parts = r->parts;
    x->part_scale = r->part_scale;
  }
  muon__free(&opt->allocator, moms);
  opt->n_matrices = first + count;
  opt->plan.ready = 0;
  if (!r->on_owner) opt->stats.state_bytes += (size_t)count * muon__mom_bytes(&grown[first], r->size);
}

MUON_API muon_status muon_add_matrix(muon_optimizer *opt, const muon_matrix *m, int *index_out) {
  muon__new_matrix r;
  muon__matrix *grown = NULL;
  float **moms = NULL;
  const char *name;
  muon_status st;
  if (!opt) return MUON_ERR_ARG;
  if (!m) return muon__fail(opt, MUON_ERR_ARG, "muon_add_matrix: m is NULL");
  name = m->name ? m->name : "";
  if ((st = muon__matrix_check(opt, m, name, opt->n_matrices, &r)) != MUON_OK ||
      (st = muon__matrix_reserve(opt, m, name, opt->n_matrices, &r, &grown, &moms)) != MUON_OK)
    return st;
  if (index_out) *index_out = opt->n_matrices;
  muon__matrix_commit(opt, m, name, opt->n_matrices, &r, grown, moms);
  return MUON_OK;
}

/* What muon_add_adamw_param resolved from a muon_adamw_param: its parts and this rank's chunk of
   the moments [lo, hi), and which replica set of parts this rank is in. */
typedef struct muon__new_adamw {
  int parts, part;
  float part_scale;
  size_t lo, hi;
  long long replica;
} muon__new_adamw;

/* Validate: every field of one piece p (named `name` in messages) and its layout, before anything
   is allocated. */
static muon_status muon__adamw_check(muon_optimizer *opt, const muon_adamw_param *p, int i, const char *name,
                                     muon__new_adamw *r) {
  const char *src = p->layout ? "muon_adamw_param.layout" : "the layout from muon_dist_config.adamw_layout";
  muon_layout layout;
  muon__piece unused;
  char why[240];
  long long a, b;
  int k;
  muon_status st;
#define MUON__BAD(st, ...) do { char what_[400]; snprintf(what_, sizeof what_, __VA_ARGS__); \
    return muon__fail(opt, st, "muon_add_adamw_param: %s (param %d, '%s')", what_, i, name); } while (0)
  if (!p->param) MUON__BAD(MUON_ERR_ARG, "muon_adamw_param.param is NULL");
  if (p->size == 0) MUON__BAD(MUON_ERR_SHAPE, "muon_adamw_param.size must be > 0");
  if (p->size > MUON__MAX_FLOATS) MUON__BAD(MUON_ERR_SHAPE, "muon_adamw_param.size %zu is too large", p->size);
  if (p->group < 0 || p->group >= opt->n_adamw_groups)
    MUON__BAD(MUON_ERR_ARG, "muon_adamw_param.group %d does not exist (have %d)", p->group, opt->n_adamw_groups);
  if ((unsigned)p->param_dtype > (unsigned)MUON_DTYPE_BF16 || (unsigned)p->grad_dtype > (unsigned)MUON_DTYPE_BF16)
    MUON__BAD(MUON_ERR_ARG, "muon_adamw_param.param_dtype and .grad_dtype must be muon_dtype values (got %d, %d)",
              (int)p->param_dtype, (int)p->grad_dtype);
  if (p->full_size ? (p->full_size > MUON__MAX_FLOATS || p->offset > p->full_size || p->size > p->full_size - p->offset)
                   : p->offset != 0)
    MUON__BAD(MUON_ERR_SHAPE,
              "muon_adamw_param.offset %zu + size %zu does not fit full_size %zu (0: the whole parameter, offset 0)",
              p->offset, p->size, p->full_size);
  memset(&layout, 0, sizeof layout);
  if (p->layout) {
    if (!opt->distributed) MUON__BAD(MUON_ERR_ARG, "muon_adamw_param.layout is set but muon_desc.dist is NULL");
    layout = *p->layout;
  } else if (opt->distributed && opt->dist.adamw_layout &&
             (st = opt->dist.adamw_layout(opt->dist.state, i, p, &layout)) != MUON_OK) {
    MUON__BAD(st, "muon_dist_config.adamw_layout returned %s", muon_status_string(st));
  }
  if (muon__layout_piece(&layout, 1, 1, &unused, why, sizeof why) != MUON_OK)
    MUON__BAD(MUON_ERR_SHAPE, "%s: %s", src, why);
  for (k = 0, r->replica = 0; k < layout.n_levels; k++) {
    const muon_level *v = &layout.levels[k];
    if (v->placement != MUON_PARTIAL && v->placement != MUON_REPLICATE)
      MUON__BAD(
          MUON_ERR_ARG,
          "muon_adamw_param.layout levels[%d] is neither PARTIAL nor REPLICATE: an AdamW param's layout says "
          "over which groups its gradient is a part and over which it is replicated (shards: offset and full_size)",
          k);
    if (v->placement == MUON_REPLICATE) r->replica = r->replica * v->size + v->index;
  }
  r->parts = muon__layout_parts(&layout, &r->part, &r->part_scale);
  if (r->parts < 1) MUON__BAD(MUON_ERR_SHAPE, "%s has more than %d parts", src, INT_MAX);
  if (r->parts > 1 && opt->rounding == MUON_ROUND_STOCHASTIC)
    MUON__BAD(MUON_ERR_ARG,
              "a Partial AdamW param cannot use MUON_ROUND_STOCHASTIC (its random bits would depend on the chunking)");
#undef MUON__BAD
  muon__chunk((long long)p->size, r->parts, r->part, &a, &b);   /* this rank's chunk: torch.chunk */
  r->lo = (size_t)a;
  r->hi = (size_t)b;
  return MUON_OK;
}

/* A stack's count and strides (muon_adamw_param.count, .stride, ...), resolved and checked. */
typedef struct muon__adamw_stack {
  int count;
  size_t stride, grad_stride, mirror_stride;
} muon__adamw_stack;

static muon_status muon__adamw_stack_check(muon_optimizer *opt, const muon_adamw_param *p, muon__adamw_stack *s) {
  const char *name = p->name ? p->name : "";
  size_t size = p->size ? p->size : 1, n;
#define MUON__BAD(...) do { char what_[400]; snprintf(what_, sizeof what_, __VA_ARGS__); \
    return muon__fail(opt, MUON_ERR_SHAPE, "muon_add_adamw_param: %s (param %d, '%s')", what_, opt->n_adamw, name); \
  } while (0)
  if (p->count < 0) MUON__BAD("muon_adamw_param.count must be >= 0 (got %d)", p->count);
  s->count = p->count ? p->count : 1;
  /* every piece is an AdamW param and has a verdict slot next to the matrices'; one piece's size
     is checked with its other fields (muon__adamw_check) */
  if (s->count > INT_MAX - opt->n_adamw - opt->n_matrices ||
      (s->count > 1 && (size_t)s->count > MUON__MAX_FLOATS / size))
    MUON__BAD("muon_adamw_param.count %d of %zu elements each is too large", s->count, p->size);
  s->stride = p->stride ? p->stride : p->size;
  s->grad_stride = p->grad_stride ? p->grad_stride : s->stride;
  s->mirror_stride = p->mirror_stride ? p->mirror_stride : s->stride;
  if (s->count == 1) return MUON_OK;
  if (s->stride < p->size || s->grad_stride < p->size || s->mirror_stride < p->size)
    MUON__BAD("muon_adamw_param strides (param %zu, grad %zu, mirror %zu) make the %d stacked pieces of %zu elements "
              "overlap (each needs >= size)", s->stride, s->grad_stride, s->mirror_stride, s->count, p->size);
  n = (size_t)(s->count - 1);
  if (n > MUON__MAX_FLOATS / s->stride || n > MUON__MAX_FLOATS / s->grad_stride ||
      n > MUON__MAX_FLOATS / s->mirror_stride)
    MUON__BAD("muon_adamw_param: %d pieces at these strides overflow the address space", s->count);
#undef MUON__BAD
  return MUON_OK;
}

/* Piece l of a stack as its own registration; its messages' name in name[64] ("name[l]"). */
static muon_adamw_param muon__adamw_piece(const muon_adamw_param *p, const muon__adamw_stack *s, int l, char *name) {
  muon_adamw_param q = *p;
  memset(name, 0, 64);
  if (s->count > 1) snprintf(name, 64, "%.50s[%d]", p->name ? p->name : "", l);
  else muon__copy_name(name, 64, p->name);
  q.name = name;
  q.param = p->param ? (char *)p->param + (size_t)l * s->stride * muon__dtype_size(p->param_dtype) : NULL;
  q.grad = p->grad ? (const char *)p->grad + (size_t)l * s->grad_stride * muon__dtype_size(p->grad_dtype) : NULL;
  q.mirror = p->mirror ? (char *)p->mirror + (size_t)l * s->mirror_stride * 2 : NULL;
  q.count = 1;
  q.stride = q.grad_stride = q.mirror_stride = 0;
  return q;
}

/* Reserve: the verdicts, the moments of each piece's chunk (zeroed) and the grown array, so that
   a failure leaves the optimizer as it was. m[2l], m[2l + 1]: piece l's moments. */
static muon_status muon__adamw_reserve(muon_optimizer *opt, const muon_adamw_param *p, int count,
                                       const muon__new_adamw *r, float **m) {
  int first = opt->n_adamw, l, k;
  muon__adamw *grown;
  muon_status st = MUON_OK;
  if ((st = muon__reserve_verdicts(opt, opt->n_matrices + first + count, "muon_add_adamw_param")) != MUON_OK)
    return st;
  for (k = 0; k < 2 * count; k++) {
    size_t n = r[k / 2].hi - r[k / 2].lo;
    if (!(m[k] = (float *)muon__state_alloc(opt, n * sizeof(float)))) break;
    st = muon__state_zero(opt, m[k], n * sizeof(float), "muon_add_adamw_param: zeroing the moments");
    if (st != MUON_OK) {
      k++;
      break;
    }
  }
  grown = k == 2 * count && st == MUON_OK
              ? (muon__adamw *)muon__alloc(&opt->allocator, (size_t)(first + count) * sizeof *grown)
              : NULL;
  if (!grown) {
    for (l = 0; l < k; l++) muon__state_free(opt, m[l]);
    if (st != MUON_OK) return st;
    return muon__fail(opt, MUON_ERR_NOMEM,
                      "muon_add_adamw_param: allocating moments of %d x %zu floats failed (param %d, '%s')", count,
                      p->size, first, p->name ? p->name : "");
  }
  if (first) memcpy(grown, opt->adamw, (size_t)first * sizeof *grown);
  muon__free(&opt->allocator, opt->adamw);
  opt->adamw = grown;   /* only room: n_adamw still counts the old ones */
  return MUON_OK;
}

/* Commit: piece p (of the stack named `stack`, its piece `slice`; -1: not a stack; p->name is
   muon__adamw_piece's 64 bytes) becomes AdamW param i; cannot fail. */
static void muon__adamw_commit(muon_optimizer *opt, const muon_adamw_param *p, const char *stack, int slice, int i,
                               const muon__new_adamw *r, float *m1, float *m2) {
  muon__adamw *x = &opt->adamw[i];
  memset(x, 0, sizeof *x);
  memcpy(x->name, p->name, sizeof x->name);
  /* a stack piece's full name is "name[slice]", as a matrix stack's slice's */
  if (stack && stack[0]) x->name_hash = muon__name_hash(stack, slice);
  else { char anon[24]; snprintf(anon, sizeof anon, "#%d", i); x->name_hash = muon__name_hash(anon, -1); }
  x->offset = p->offset;
  x->full_size = p->full_size ? p->full_size : p->size;
  x->param = p->param;
  x->grad = p->grad;
  x->grad_bound = p->grad != NULL;
  x->mirror = p->mirror;
  x->param_dtype = p->param_dtype;
  x->grad_dtype = p->grad_dtype;
  x->size = p->size;
  x->group = p->group;
  x->exp_avg = m1;
  x->exp_avg_sq = m2;
  x->parts = r->parts;
  x->part = r->part;
  x->part_scale = r->part_scale;
  x->lo = r->lo;
  x->hi = r->hi;
  x->members = -1;
  x->state_offset = x->offset + r->lo;
  x->state_size = r->hi - r->lo;
  x->replica = r->replica;
  opt->n_adamw = i + 1;
  opt->plan.ready = 0;   /* distributed: the skip list is sized by every rank's count at planning */
  opt->stats.state_bytes += 2 * (r->hi - r->lo) * sizeof(float);
}

MUON_API muon_status muon_add_adamw_param(muon_optimizer *opt, const muon_adamw_param *p, int *index_out) {
  muon__adamw_stack s;
  muon__new_adamw *r = NULL;
  float **m = NULL;
  char name[64];
  int l, first;
  muon_status st;
  if (!opt) return MUON_ERR_ARG;
  if (!p) return muon__fail(opt, MUON_ERR_ARG, "muon_add_adamw_param: p is NULL");
  memset(&s, 0, sizeof s);   /* gcc -Ofast cannot see that the check sets it */
  if ((st = muon__adamw_stack_check(opt, p, &s)) != MUON_OK) return st;
  first = opt->n_adamw;
  r = (muon__new_adamw *)muon__alloc(&opt->allocator, (size_t)s.count * sizeof *r);
  m = r ? (float **)muon__alloc(&opt->allocator, 2 * (size_t)s.count * sizeof *m) : NULL;
  if (!m) {
    muon__free(&opt->allocator, r);
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_add_adamw_param: allocating %d pieces failed (param %d, '%s')",
                      s.count, first, p->name ? p->name : "");
  }
  for (l = 0; l < s.count && st == MUON_OK; l++) {
    muon_adamw_param q = muon__adamw_piece(p, &s, l, name);
    st = muon__adamw_check(opt, &q, first + l, name, &r[l]);
  }
  if (st == MUON_OK && (st = muon__adamw_reserve(opt, p, s.count, r, m)) == MUON_OK) {
    if (index_out) *index_out = first;
    for (l = 0; l < s.count; l++) {
      muon_adamw_param q = muon__adamw_piece(p, &s, l, name);
      muon__adamw_commit(opt, &q, p->name, s.count > 1 ? l : -1, first + l, &r[l], m[2 * l], m[2 * l + 1]);
    }
  }
  muon__free(&opt->allocator, r);
  muon__free(&opt->allocator, m);
  return st;
}

MUON_API muon_status muon_set_grad(muon_optimizer *opt, int index, const void *grad) {
  if (!opt) return MUON_ERR_ARG;
  if (index < 0 || index >= opt->n_matrices)
    return muon__fail(opt, MUON_ERR_ARG, "muon_set_grad: matrix %d does not exist (have %d)", index, opt->n_matrices);
  opt->matrices[index].grad = grad;
  opt->matrices[index].grad_bound = 1;   /* NULL too: absent this step, on purpose */
  return MUON_OK;
}

MUON_API muon_status muon_set_adamw_grad(muon_optimizer *opt, int index, const void *grad) {
  if (!opt) return MUON_ERR_ARG;
  if (index < 0 || index >= opt->n_adamw)
    return muon__fail(opt, MUON_ERR_ARG, "muon_set_adamw_grad: AdamW param %d does not exist (have %d)", index,
                      opt->n_adamw);
  opt->adamw[index].grad = grad;
  opt->adamw[index].grad_bound = 1;
  return MUON_OK;
}

MUON_API muon_status muon_set_grad_scale(muon_optimizer *opt, float scale) {
  if (!opt) return MUON_ERR_ARG;
  /* the sign bit, not `scale < 0`: under -Ofast (denormals as zero) a negative subnormal compares as -0 */
  if (muon__finite(scale) && (muon__f2u(scale) >> 31) && (muon__f2u(scale) & 0x7fffffffu))
    return muon__fail(opt, MUON_ERR_ARG,
                      "muon_set_grad_scale: scale must be >= 0 (got %g; 0, NaN and Inf say the gradient norm was "
                      "not finite)",
                      (double)scale);
  /* 0, -0, NaN and Inf all become +0: one value for "not finite", the same bits on every rank */
  opt->grad_scale = muon__finite(scale) && (muon__f2u(scale) & 0x7fffffffu) ? scale : 0.0f;
  return MUON_OK;
}

MUON_API int muon_matrix_count(const muon_optimizer *opt) { return opt ? opt->n_matrices : 0; }
MUON_API int muon_adamw_param_count(const muon_optimizer *opt) { return opt ? opt->n_adamw : 0; }

static void muon__bf16_round(float *x, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) x[i] = muon__bf16(x[i]);
}

/* lr * adjust(rows, cols), computed in double as torch does in Python. */
static float muon__adjusted_lr(const muon_hparams *hp, int rows, int cols) {
  double lr = hp->lr, r = rows, c = cols;
  switch (hp->adjust_lr) {
  case MUON_ADJUST_LR_MATCH_RMS_ADAMW: return (float)(lr * 0.2 * sqrt(r > c ? r : c));
  case MUON_ADJUST_LR_NONE: return (float)lr;
  case MUON_ADJUST_LR_SPECTRAL_UNCLAMPED: return (float)(lr * sqrt(r / c));
  default: return (float)(lr * sqrt(r / c > 1.0 ? r / c : 1.0));
  }
}

/* >>impl-compute-wrappers ---------------------------------------------------------------------
   Compute wrappers: every backend call of the core goes through these, which count and turn a
   failure into a message that names the operation and the backend's own text. */
static muon_status muon__backend_fail(muon_optimizer *opt, muon_status st, const char *op) {
  const char *native = opt->compute.vt->error ? opt->compute.vt->error(opt->compute.ctx) : NULL;
  (void)muon__comm_finish(opt, op);   /* queued exchanges first: the drain below must not hang */
  if (st == MUON_OK) st = MUON_ERR_BACKEND;
  st = muon__fail(
      opt, st, "%s: the compute backend failed: %s%s", op, native && *native ? native : muon_status_string(st),
      strstr(op, "partly") ? "" : "; nothing was applied"); /* the commit and a load say what may be changed */
  /* The step is abandoned: drain what is queued so the failure is reported once, not again by
     the next call's sync. */
  opt->stats.syncs++;
  (void)opt->compute.vt->sync(opt->compute.ctx);
  return st;
}
#define MUON__TRY(call) do { muon_status st_ = (call); if (st_ != MUON_OK) return st_; } while (0)

/* One wrapper per slot that takes work; `op` names the operation for a failure's message. */
static muon_status muon__compute_done(muon_optimizer *opt, muon_status st, const char *op) {
  opt->stats.backend_calls++;
  return st == MUON_OK ? MUON_OK : muon__backend_fail(opt, st, op);
}
static muon_status muon__compute_copy(muon_optimizer *opt, void *dst, const void *src, size_t bytes, int to_host,
                                      int from_host, const char *op) {
  return muon__compute_done(opt, opt->compute.vt->copy(opt->compute.ctx, dst, src, bytes, to_host, from_host), op);
}
static muon_status muon__compute_zero(muon_optimizer *opt, void *dst, size_t bytes, const char *op) {
  return bytes ? muon__compute_done(opt, opt->compute.vt->zero(opt->compute.ctx, dst, bytes), op) : MUON_OK;
}
static muon_status muon__compute_pack(muon_optimizer *opt, const muon_piece_copy *ops, int n, float *pieces,
                                      float *operands, int to_operand, const char *op) {
  return muon__compute_done(opt, opt->compute.vt->pack(opt->compute.ctx, ops, n, pieces, operands, to_operand), op);
}
static muon_status muon__compute_momentum(muon_optimizer *opt, size_t n, float *momentum, const void *grad,
                                          const muon_momentum_args *a, int update, float *u, const char *op) {
  return muon__compute_done(opt, opt->compute.vt->momentum(opt->compute.ctx, n, momentum, grad, a, update, u), op);
}
static size_t muon__compute_ns_workspace(muon_optimizer *opt, int batch, int m, int n, const muon_hparams *hp) {
  return opt->compute.vt->ns_workspace(opt->compute.ctx, batch, m, n, hp);
}
static muon_status muon__compute_newton_schulz(muon_optimizer *opt, float *X, int batch, int m, int n,
                                               const muon_hparams *hp, void *ws, const char *op) {
  return muon__compute_done(opt, opt->compute.vt->newton_schulz(opt->compute.ctx, X, batch, m, n, hp, ws), op);
}
static muon_status muon__compute_newton_schulz_many(muon_optimizer *opt, int count, float *const *X, const int *m,
                                                    const int *n, const muon_hparams *const *hp, void *ws,
                                                    const char *op) {
  return muon__compute_done(
      opt, MUON__SLOT(opt->compute.vt, 1, newton_schulz_many)(opt->compute.ctx, count, X, m, n, hp, ws), op);
}
static muon_status muon__compute_apply(muon_optimizer *opt, size_t n, void *param, const float *O,
                                       const muon_apply_args *a, const char *op) {
  return muon__compute_done(opt, opt->compute.vt->apply(opt->compute.ctx, n, param, O, a), op);
}
static muon_status muon__compute_adamw(muon_optimizer *opt, size_t n, void *param, const void *grad, float *m, float *v,
                                       const muon_adamw_args *a, const char *op) {
  return muon__compute_done(opt, opt->compute.vt->adamw(opt->compute.ctx, n, param, grad, m, v, a), op);
}
static muon_status muon__compute_nonfinite(muon_optimizer *opt, const void *x, muon_dtype dtype, size_t n, int *flag,
                                           const char *op) {
  return muon__compute_done(opt, opt->compute.vt->nonfinite(opt->compute.ctx, x, dtype, n, flag), op);
}
static muon_status muon__compute_cast(muon_optimizer *opt, void *dst, muon_dtype dst_dtype, const void *src,
                                      muon_dtype src_dtype, size_t n, const char *op) {
  return muon__compute_done(opt, opt->compute.vt->cast(opt->compute.ctx, dst, dst_dtype, src, src_dtype, n), op);
}
static muon_status muon__compute_normuon(muon_optimizer *opt, float *X, int m, int n, int per_column, const float *v,
                                         float *v_new, const muon_hparams *hp, const char *op) {
  return muon__compute_done(opt, opt->compute.vt->normuon(opt->compute.ctx, X, m, n, per_column, v, v_new, hp), op);
}
/* MUON_MOMENTUM_INT8's blocks; a host backend without the slot: the core's own loop. */
static muon_status muon__cpu_blockwise(void *ctx, int to_int8, size_t n, float *values, void *blocks);
static muon_status muon__compute_blockwise(muon_optimizer *opt, int to_int8, size_t n, float *values, void *blocks,
                                           const char *op) {
  muon_status (*slot)(void *, int, size_t, float *, void *) = MUON__SLOT(opt->compute.vt, 1, blockwise);
  if (!slot) return muon__compute_done(opt, muon__cpu_blockwise(NULL, to_int8, n, values, blocks), op);
  return muon__compute_done(opt, slot(opt->compute.ctx, to_int8, n, values, blocks), op);
}
static muon_status muon__compute_sync(muon_optimizer *opt, const char *op) {
  opt->stats.syncs++;
  return muon__compute_done(opt, opt->compute.vt->sync(opt->compute.ctx), op);
}

static void *muon__compute_alloc(muon_optimizer *opt, size_t bytes) {
  opt->stats.backend_calls++;
  return opt->compute.vt->alloc(opt->compute.ctx, bytes ? bytes : 1);
}
static void muon__compute_free(muon_optimizer *opt, void *ptr) {
  if (ptr) opt->compute.vt->free(opt->compute.ctx, ptr);
}
/* Host staging memory: the backend's (pinned) if it has some, else the allocator's. */
static void *muon__compute_alloc_host(muon_optimizer *opt, size_t bytes) {
  if (opt->compute.vt->alloc_host) return opt->compute.vt->alloc_host(opt->compute.ctx, bytes ? bytes : 1);
  return muon__alloc(&opt->allocator, bytes);
}
static void muon__compute_free_host(muon_optimizer *opt, void *ptr) {
  if (!ptr) return;
  if (opt->compute.vt->free_host) opt->compute.vt->free_host(opt->compute.ctx, ptr);
  else muon__free(&opt->allocator, ptr);
}
/* The core's sync: queued exchanges first, so that a dead peer is an error, not a hang. */
static muon_status muon__sync(muon_optimizer *opt, const char *op) {
  muon_status st;
  if ((st = muon__comm_finish(opt, op)) != MUON_OK) return st;
  return muon__compute_sync(opt, op);
}

/* ---- >>impl-state-memory Where the state lives: every byte of it moves through here ---------
   The state (each matrix's momentum, each AdamW param's m and v) is backend memory, or with
   muon_desc.state_on_host on a device backend host memory from alloc_host (opt->state_host).
   Host state is never handed to a slot: each slot that reads or writes it gets a copy in the
   commit check's scratch (check_ws, planned: nothing is allocated in a step), chunk by chunk,
   queued on the compute queue like the slot, and what it wrote is copied back the same way, so
   the host waits nowhere new. The same slots see the same values: the same bits as device
   state. Before the commit only copies leave the state (a failed step changes none of it). */
static void *muon__state_alloc(muon_optimizer *opt, size_t bytes) {
  return opt->state_host ? muon__compute_alloc_host(opt, bytes) : muon__compute_alloc(opt, bytes);
}
static void muon__state_free(muon_optimizer *opt, void *ptr) {
  if (opt->state_host) muon__compute_free_host(opt, ptr);
  else muon__compute_free(opt, ptr);
}
/* Fresh state only: nothing queued can use it yet. */
static muon_status muon__state_zero(muon_optimizer *opt, void *ptr, size_t bytes, const char *op) {
  if (!opt->state_host) return muon__compute_zero(opt, ptr, bytes, op);
  if (bytes) memset(ptr, 0, bytes);
  return MUON_OK;
}
/* n floats between state and backend memory; into: dst is the state. */
static muon_status muon__state_copy(muon_optimizer *opt, float *dst, const float *src, size_t n, int into,
                                    const char *op) {
  if (!n) return MUON_OK;
  return muon__compute_copy(opt, dst, src, n * sizeof(float), opt->state_host && into, opt->state_host && !into, op);
}
/* Before the host reads or writes host state itself (save, load, reshard, dumps): the queue
   may still be copying it (the commit runs asynchronously). */
static muon_status muon__state_settle(muon_optimizer *opt, const char *op) {
  return opt->state_host ? muon__sync(opt, op) : MUON_OK;
}

/* Momentum values [at, at + c) of x as fp32 in backend memory F, whatever its format and place:
   bf16 widened by `cast` (through H, c bf16 of backend memory, when on the host), so every
   backend gives the same bits. */
static muon_status muon__state_widen(muon_optimizer *opt, const muon__matrix *x, size_t at, size_t c, float *F,
                                     uint16_t *H, const char *op) {
  const void *src = muon__mom_at(x, at);
  if (x->mfmt == MUON_MOMENTUM_FP32) return muon__state_copy(opt, F, (const float *)src, c, 0, op);
  if (opt->state_host) {   /* int8's c + ceil(c / 256) bytes fit H too */
    MUON__TRY(muon__compute_copy(opt, H, src, muon__mom_bytes(x, c), 0, 1, op));
    src = H;
  }
  if (x->mfmt == MUON_MOMENTUM_INT8) return muon__compute_blockwise(opt, 0, c, F, (void *)(uintptr_t)src, op);
  return muon__compute_cast(opt, F, MUON_DTYPE_FP32, src, MUON_DTYPE_BF16, c, op);
}
/* The reverse: F's c values become x's momentum [at, at + c), bf16 by nearest even. */
static muon_status muon__state_narrow(muon_optimizer *opt, const muon__matrix *x, size_t at, size_t c, const float *F,
                                      uint16_t *H, const char *op) {
  void *dst = muon__mom_at(x, at), *w = opt->state_host ? (void *)H : dst;
  if (x->mfmt == MUON_MOMENTUM_FP32) return muon__state_copy(opt, (float *)dst, F, c, 1, op);
  if (x->mfmt == MUON_MOMENTUM_INT8) MUON__TRY(muon__compute_blockwise(opt, 1, c, (float *)(uintptr_t)F, w, op));
  else MUON__TRY(muon__compute_cast(opt, w, MUON_DTYPE_BF16, F, MUON_DTYPE_FP32, c, op));
  return opt->state_host ? muon__compute_copy(opt, dst, H, muon__mom_bytes(x, c), 1, 0, op) : MUON_OK;
}

/* The momentum slot on x's momentum, n values from element `at` (a piece's, or a Partial
   matrix's whole one). FP32 in backend memory: the slot in place. Otherwise never on a value in
   use: each chunk widened into fp32 scratch (the commit check's, free until the check), stepped
   there, U taken from that fp32 value, and with `update` the new momentum narrowed back.
   Element-wise, so chunks give the same bits. */
static muon_status muon__state_momentum(muon_optimizer *opt, const muon__matrix *x, size_t at, size_t n,
                                        const void *grad, const muon_momentum_args *a, int update, float *u,
                                        const char *op) {
  const size_t C = opt->plan.check_chunk, gs = muon__dtype_size(a->grad_dtype);
  float *F = (float *)opt->plan.check_ws;
  uint16_t *H = (uint16_t *)(void *)(F + 3 * C);
  size_t lo, c;
  if (x->mfmt == MUON_MOMENTUM_FP32 && !opt->state_host)
    return muon__compute_momentum(opt, n, x->momentum + at, grad, a, update, u, op);
  for (lo = 0; lo < n; lo += C) {
    c = MUON__MIN(C, n - lo);
    MUON__TRY(muon__state_widen(opt, x, at + lo, c, F, H, op));
    MUON__TRY(muon__compute_momentum(opt, c, F, (const char *)grad + lo * gs, a, update, u ? u + lo : NULL, op));
    if (update) MUON__TRY(muon__state_narrow(opt, x, at + lo, c, F, H, op));
  }
  return MUON_OK;
}

/* The AdamW slot on a param's moments, likewise (a chunk's random bits: offset + lo). */
static muon_status muon__state_adamw(muon_optimizer *opt, size_t n, void *param, const void *grad, float *m,
                                     float *v, const muon_adamw_args *a, const char *op) {
  float *S = (float *)opt->plan.check_ws;
  size_t C = opt->plan.check_chunk, lo, c, ep = muon__dtype_size(a->param_dtype), eg = muon__dtype_size(a->grad_dtype);
  muon_adamw_args b = *a;
  if (!opt->state_host) return muon__compute_adamw(opt, n, param, grad, m, v, a, op);
  for (lo = 0; lo < n; lo += C) {
    c = MUON__MIN(C, n - lo);
    b.offset = a->offset + lo;
    b.mirror = a->mirror ? (void *)((uint16_t *)a->mirror + lo) : NULL;
    MUON__TRY(muon__state_copy(opt, S, m + lo, c, 0, op));
    MUON__TRY(muon__state_copy(opt, S + C, v + lo, c, 0, op));
    MUON__TRY(muon__compute_adamw(opt, c, (char *)param + lo * ep, (const char *)grad + lo * eg, S, S + C, &b, op));
    MUON__TRY(muon__state_copy(opt, m + lo, S, c, 1, op));
    MUON__TRY(muon__state_copy(opt, v + lo, S + C, c, 1, op));
  }
  return MUON_OK;
}

/* A whole matrix as a piece of itself: the op that moves it to and from its NS operand. */
static muon_piece_copy muon__whole(int rows, int cols, size_t piece, size_t operand) {
  muon_piece_copy op;
  op.r0 = 0; op.c0 = 0; op.h = rows; op.w = cols; op.f0 = 0; op.f1 = (long long)rows * cols;
  op.rows = rows; op.cols = cols; op.piece = piece; op.operand = operand;
  return op;
}

/* >>impl-serial -------------------------------------------------------------------------------
   Little-endian serialisation, shared by the plan fingerprints and the state blob. */
static void muon__put32(unsigned char **p, uint32_t v) {
  int i;
  for (i = 0; i < 4; i++) *(*p)++ = (unsigned char)(v >> (8 * i));
}
static void muon__put64(unsigned char **p, uint64_t v) {
  int i;
  for (i = 0; i < 8; i++) *(*p)++ = (unsigned char)(v >> (8 * i));
}
static void muon__put_floats(unsigned char **p, const float *x, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) { uint32_t u; memcpy(&u, &x[i], 4); muon__put32(p, u); }
}
static void muon__put_float(unsigned char **p, float x) { muon__put_floats(p, &x, 1); }
/* >>impl-settings: every setting that ranks must share, one line each. The state blob's group
   records (muon__put_hparams / muon__get_hparams), the agreement's digest and its MISMATCH text
   are all generated from these lists, and test_agree / test_api iterate them, so a field missing
   here is neither saved nor agreed nor tested. A group record is u32 bytes, then the fields in
   list order: a reader defaults the fields a record lacks (an older blob) and skips those it does
   not know (a newer one), so lines are only ever appended (tests/run_state_grow.sh appends one).
   A new field: its default in muon_default_hparams (or _adamw_), then one line at the end.
   X(field, C type, wire kind, a valid value other than the default, for the tests). Kinds: F
   float, U an int or enum as u32, U64, NS the ns_steps triples of ns_coefficients (so it comes
   after ns_steps). */
#define MUON__HPARAMS_FIELDS(X)                                      \
  X(lr, float, F, 0.01f)                                             \
  X(weight_decay, float, F, 0.05f)                                   \
  X(momentum, float, F, 0.9f)                                        \
  X(nesterov, int, U, 0)                                             \
  X(momentum_style, muon_momentum_style, U, MUON_MOMENTUM_SGD)       \
  X(adjust_lr, muon_adjust_lr, U, MUON_ADJUST_LR_MATCH_RMS_ADAMW)    \
  X(ns_steps, int, U, 4)                                             \
  X(ns_coefficients, float, NS, 3.0f)                                \
  X(eps, float, F, 1e-6f)                                            \
  X(precision, muon_precision, U, MUON_PRECISION_BF16)               \
  X(symmetric, int, U, 0)                                            \
  X(cautious_wd, int, U, 1)                                          \
  X(ns_algorithm, muon_ns_algorithm, U, MUON_NS_GRAM)                \
  X(ns_restarts, unsigned, U, 1u << 1)                               \
  X(normuon, muon_normuon, U, MUON_NORMUON_ROWS)                     \
  X(normuon_beta2, float, F, 0.9f)                                   \
  X(momentum_format, muon_momentum_format, U, MUON_MOMENTUM_BF16)
#define MUON__ADAMW_FIELDS(X)                                        \
  X(lr, float, F, 0.01f)                                             \
  X(beta1, float, F, 0.8f)                                           \
  X(beta2, float, F, 0.99f)                                          \
  X(eps, float, F, 1e-6f)                                            \
  X(weight_decay, float, F, 0.05f)                                   \
  X(cautious_wd, int, U, 1)
/* The optimizer's own settings (muon_desc, muon_dist_config, muon_set_grad_scale), agreed but
   not saved: X(field, name in messages, wire kind, its value in muon_optimizer *o). The custom
   callbacks count by presence; the tests perturb each by its field name. */
#define MUON__RUN_FIELDS(X)                                                                          \
  X(on_nonfinite, "muon_desc.on_nonfinite", U, o->on_nonfinite)                                      \
  X(rounding, "muon_desc.rounding", U, o->rounding)                                                  \
  X(seed, "muon_desc.seed", U64, o->seed)                                                            \
  X(grad_scale, "the gradient scale (muon_set_grad_scale)", F, o->grad_scale)                        \
  X(round_bytes, "muon_dist_config.round_bytes", U64, o->dist.round_bytes)                           \
  X(round_robin, "muon_dist_config.round_robin", U, o->dist.round_robin != 0)                        \
  X(assign, "muon_dist_config.assign (set or NULL)", U, o->dist.assign != NULL)                      \
  X(gather, "muon_dist_config.gather/redistribute (set or NULL)", U, o->dist.gather != NULL)         \
  X(wire, "muon_dist_config.wire", U, o->dist.wire)                                                  \
  X(prefetch, "muon_dist_config.prefetch (the order of the collectives)", U, o->dist.prefetch)       \
  X(unchecked_commit, "muon_dist_config.unchecked_commit", U, o->dist.unchecked_commit != 0)

#define MUON__GROUP_HEAD 28u                        /* lr .. ns_steps, before the triples */
#define MUON__GROUP_MAX (4u * (64u + 3u * MUON_NS_MAX_STEPS))   /* room for 64 fields and the triples */
static unsigned char *muon__record_begin(unsigned char **p) { unsigned char *at = *p; *p += 4; return at; }
static void muon__record_end(unsigned char **p, unsigned char *at) {
  unsigned char *q = at;
  muon__put32(&q, (uint32_t)(*p - at - 4));
}
static void muon__put_triples(unsigned char **p, const float (*x)[3], int n) {
  int k;
  for (k = 0; k < n; k++) muon__put_floats(p, x[k], 3);
}
#define MUON__PUT_F(p, v) muon__put_float(p, v)
#define MUON__PUT_U(p, v) muon__put32(p, (uint32_t)(v))
#define MUON__PUT_U64(p, v) muon__put64(p, (uint64_t)(v))
#define MUON__PUT_NS(p, v) muon__put_triples(p, (const float(*)[3])(v), s->ns_steps)
#define MUON__PUT_FIELD(f, type, kind, alt) MUON__PUT_##kind(p, s->f);
static void muon__put_hparams(unsigned char **p, const muon_hparams *s) {
  unsigned char *at = muon__record_begin(p);
  MUON__HPARAMS_FIELDS(MUON__PUT_FIELD)
  muon__record_end(p, at);
}
static uint32_t muon__get32(const unsigned char **p) {
  uint32_t v = 0;
  int i;
  for (i = 0; i < 4; i++) v |= (uint32_t)(*p)[i] << (8 * i);
  *p += 4;
  return v;
}
static uint64_t muon__get64(const unsigned char **p) {
  uint64_t v = 0;
  int i;
  for (i = 0; i < 8; i++) v |= (uint64_t)(*p)[i] << (8 * i);
  *p += 8;
  return v;
}
static void muon__get_floats(const unsigned char **p, float *x, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) { uint32_t u = muon__get32(p); memcpy(&x[i], &u, 4); }
}
/* An AdamW group on the wire: the state blob and the agreement digest. */
static void muon__put_adamw_hparams(unsigned char **p, const muon_adamw_hparams *s) {
  unsigned char *at = muon__record_begin(p);
  MUON__ADAMW_FIELDS(MUON__PUT_FIELD)
  muon__record_end(p, at);
}

/* Reading a record: a field past its end keeps the default given. */
typedef struct muon__record_in { const unsigned char *p, *end; } muon__record_in;
static muon__record_in muon__record_open(const unsigned char **p) {
  muon__record_in r;
  uint32_t bytes = muon__get32(p);
  r.p = *p;
  r.end = *p + bytes;
  *p = r.end;
  return r;
}
static uint32_t muon__record_u32(muon__record_in *r, uint32_t dflt) {
  return r->end - r->p >= 4 ? muon__get32(&r->p) : dflt;
}
static float muon__record_float(muon__record_in *r, float dflt) {
  uint32_t u;
  float x;
  memcpy(&u, &dflt, 4);
  u = muon__record_u32(r, u);
  memcpy(&x, &u, 4);
  return x;
}
static uint64_t muon__record_u64(muon__record_in *r, uint64_t dflt) {
  return r->end - r->p >= 8 ? muon__get64(&r->p) : dflt;
}
static void muon__record_triples(muon__record_in *r, float (*x)[3], const float (*dflt)[3], int n) {
  int k, j;
  for (k = 0; k < n && k < MUON_NS_MAX_STEPS; k++)
    for (j = 0; j < 3; j++) x[k][j] = muon__record_float(r, dflt[k][j]);
}
#define MUON__GET_F(v, d, type) (v) = muon__record_float(&r, d)
#define MUON__GET_U(v, d, type) (v) = (type)muon__record_u32(&r, (uint32_t)(d))
#define MUON__GET_U64(v, d, type) (v) = (type)muon__record_u64(&r, (uint64_t)(d))
#define MUON__GET_NS(v, d, type) muon__record_triples(&r, v, (const float(*)[3])(d), s->ns_steps)
#define MUON__GET_FIELD(f, type, kind, alt) MUON__GET_##kind(s->f, dflt.f, type);
static void muon__get_adamw_hparams(const unsigned char **p, muon_adamw_hparams *s) {
  muon__record_in r = muon__record_open(p);
  muon_adamw_hparams dflt = muon_default_adamw_hparams();
  MUON__ADAMW_FIELDS(MUON__GET_FIELD)
}
/* Reads a group written by muon__put_hparams. The blob's parser has checked that the record holds
   at least the fields up to the ns_steps triples (MUON__GROUP_HEAD), with ns_steps in range. */
static void muon__get_hparams(const unsigned char **p, muon_hparams *s) {
  muon__record_in r = muon__record_open(p);
  muon_hparams dflt = muon_default_hparams();
  MUON__HPARAMS_FIELDS(MUON__GET_FIELD)
}
/* >>impl-comm-wrappers ------------------------------------------------------------------------
   Communication wrappers: every collective goes through these, which count and explain. The
   first three touch the communicator only, never the optimizer's state: the communication thread
   calls them too. */
static const char *muon__comm_error(const muon_optimizer *opt) {
  return opt->comm.vt->error ? opt->comm.vt->error(opt->comm.ctx) : NULL;
}
/* One exchange started (counts, displacements: send, then receive; see the vtable); *ticket is
   for join. */
static muon_status muon__comm_exchange(const muon_optimizer *opt, const float *send, const size_t *wire, float *recv,
                                       int *ticket) {
  size_t P = (size_t)opt->comm.size;
  *ticket = -1;
  return opt->comm.vt->alltoallv(opt->comm.ctx, send, wire, wire + P, recv, wire + 2 * P, wire + 3 * P, ticket);
}
/* The compute queue waits for that exchange (a blocking communicator has nothing to join). */
static muon_status muon__comm_join(const muon_optimizer *opt, int ticket) {
  return opt->comm.vt->join ? opt->comm.vt->join(opt->comm.ctx, ticket) : MUON_OK;
}

static muon_status muon__comm_fail_text(muon_optimizer *opt, muon_status st, const char *op, const char *native) {
  opt->comm_queued = 0;   /* a failed communicator has dropped what it queued (vt->finish) */
  if (st != MUON_ERR_TIMEOUT) st = MUON_ERR_COMM;
  return muon__fail(opt, st, "%s failed on rank %d of %d: %s; nothing was applied", op, opt->comm.rank,
                    opt->comm.size, native && *native ? native : muon_status_string(st));
}

static muon_status muon__comm_fail(muon_optimizer *opt, muon_status st, const char *op) {
  return muon__comm_fail_text(opt, st, op, muon__comm_error(opt));
}

static muon_status muon__allgather(muon_optimizer *opt, const void *send, void *recv, size_t bytes, const char *op) {
  muon_status st = opt->comm.vt->allgather(opt->comm.ctx, send, recv, bytes);   /* the slot's one caller */
  opt->stats.collectives++;
  opt->stats.control_bytes += (long long)(bytes * (size_t)(opt->comm.size - 1));
  return st == MUON_OK ? MUON_OK : muon__comm_fail(opt, st, op);
}

/* async's two ways: a queued communicator keeps the exchanges on its own queue, joined later; a
   blocking host communicator's calls get the communication thread. A blocking device
   communicator overlaps nothing. */
static int muon__side_comm(const muon_optimizer *opt) { return opt->comm.size > 1 && opt->comm.vt->queued; }
static int muon__async_comm(const muon_optimizer *opt) {
  return opt->comm.size > 1 && opt->comm.vt->memory == MUON_MEMORY_HOST && !opt->comm.vt->queued;
}

/* An alltoallv's counters: one collective, the floats to and from the other ranks. */
/* control: an agreement's exchange, counted like an allgather's (the bytes it receives), so that
   a step's bytes sent and received stay the U/O exchange's. */
static void muon__count_alltoallv(muon_optimizer *opt, const size_t *counts, int control) {
  int P = opt->comm.size, me = opt->comm.rank, p;
  opt->stats.collectives++;
  if (opt->comm.vt->queued) opt->comm_queued = 1;
  for (p = 0; p < P; p++)
    if (p != me && control) opt->stats.control_bytes += (long long)(counts[2 * P + p] * sizeof(float));
    else if (p != me) {
      opt->stats.bytes_sent += (long long)(counts[p] * sizeof(float));
      opt->stats.bytes_received += (long long)(counts[2 * P + p] * sizeof(float));
    }
}

/* One exchange the compute queue waits for at once. */
static muon_status muon__alltoallv(muon_optimizer *opt, const float *send, float *recv, const size_t *counts,
                                   int control, const char *op) {
  int ticket;
  muon_status st = muon__comm_exchange(opt, send, counts, recv, &ticket);
  if (st == MUON_OK) st = muon__comm_join(opt, ticket);
  muon__count_alltoallv(opt, counts, control);
  return st == MUON_OK ? MUON_OK : muon__comm_fail(opt, st, op);
}

/* The host is about to wait for the compute backend: first for the exchanges a queued
   communicator has in flight, under its timeout (a compute sync would wait forever on a dead
   peer). */
static muon_status muon__comm_finish(muon_optimizer *opt, const char *op) {
  muon_status st;
  if (!opt->comm_queued) return MUON_OK;
  opt->comm_queued = 0;
  opt->stats.comm_waits++;
  st = opt->comm.vt->finish(opt->comm.ctx);
  return st == MUON_OK ? MUON_OK : muon__comm_fail(opt, st, op);
}

/* >>impl-plan ---------------------------------------------------------------------------------
   Plan: who holds which piece, who owns each matrix, which rank sends each piece, and the
   rounds. Built from one allgather of every rank's matrix list, so every rank computes the same
   plan without further talk; failures found here are therefore the same on every rank. */
/* A layout as a fixed record of bytes: on the wire at planning (so every rank can say how each
   holder described its piece) and in state blobs (so a blob's size depends on shapes only). */
#define MUON__LAYOUT_RECORD (12u + 32u * MUON_MAX_LEVELS)

#define MUON__LEVEL_BYTES 32u
static void muon__put_level(unsigned char **p, const muon_level *v) {
  muon__put32(p, (uint32_t)v->placement);
  muon__put32(p, (uint32_t)(v->placement == MUON_PARTIAL ? (int)v->reduce : v->dim));
  muon__put32(p, (uint32_t)v->size); muon__put32(p, (uint32_t)v->index);
  muon__put64(p, (uint64_t)v->offset); muon__put64(p, (uint64_t)v->length);
}
static void muon__get_level(const unsigned char **p, muon_level *v) {
  v->placement = (muon_placement)muon__get32(p); v->dim = (int)muon__get32(p);
  v->size = (int)muon__get32(p); v->index = (int)muon__get32(p);
  v->offset = (long long)muon__get64(p); v->length = (long long)muon__get64(p);
  v->reduce = MUON_REDUCE_SUM;
  if (v->placement == MUON_PARTIAL) { v->reduce = (muon_reduce)v->dim; v->dim = 0; }   /* one slot for both */
}

static void muon__put_layout(unsigned char **p, const muon_layout *l) {
  int k;
  muon__put32(p, (uint32_t)l->n_levels);
  muon__put64(p, (uint64_t)l->key);
  for (k = 0; k < MUON_MAX_LEVELS; k++) {
    muon_level v;
    if (k < l->n_levels) v = l->levels[k]; else memset(&v, 0, sizeof v);
    muon__put_level(p, &v);
  }
}

static void muon__get_layout(const unsigned char *rec, muon_layout *l) {
  const unsigned char *p = rec;
  int k;
  memset(l, 0, sizeof *l);
  l->n_levels = (int)muon__get32(&p);
  l->key = (long long)muon__get64(&p);
  for (k = 0; k < MUON_MAX_LEVELS; k++) muon__get_level(&p, &l->levels[k]);
}

/* A layout in a rank's table at planning: its levels alone (the key is the entry's), as many as
   it has (a table of fixed records was most of what a MoE's ranks send). */
static size_t muon__table_record_bytes(const muon_layout *l) { return 4 + MUON__LEVEL_BYTES * (size_t)l->n_levels; }
static void muon__put_table_record(unsigned char **p, const muon_layout *l) {
  int k;
  muon__put32(p, (uint32_t)l->n_levels);
  for (k = 0; k < l->n_levels; k++) muon__put_level(p, &l->levels[k]);
}
/* The record at *p of a table ending at end, into l; 0 if it is broken (more levels than
   MUON_MAX_LEVELS, or past the table). */
static int muon__get_table_record(const unsigned char **p, const unsigned char *end, muon_layout *l) {
  int k;
  uint32_t n;
  if (end - *p < 4) return 0;
  n = muon__get32(p);
  if (n > MUON_MAX_LEVELS || (size_t)(end - *p) < MUON__LEVEL_BYTES * n) return 0;
  l->key = 0;
  l->n_levels = (int)n;
  for (k = 0; k < l->n_levels; k++) muon__get_level(p, &l->levels[k]);
  return 1;
}

/* A layout as text, for the plan's text and the messages that say what differs. */
static void muon__layout_text(const muon_layout *l, char *out, size_t size) {
  size_t used = 0;
  int k;
  if (l->n_levels == 0) { snprintf(out, size, "the whole matrix"); return; }
  out[0] = 0;
  for (k = 0; k < l->n_levels && k < MUON_MAX_LEVELS && used + 1 < size; k++) {
    const muon_level *v = &l->levels[k];
    const char *sep = k ? " > " : "";
    int w;
    if (v->placement == MUON_SHARD)
      w = snprintf(out + used, size - used, "%sshard dim %d, %d of %d", sep, v->dim, v->index, v->size);
    else if (v->placement == MUON_FLAT && v->length < 0)
      w = snprintf(out + used, size - used, "%sflat chunk %d of %d", sep, v->index, v->size);
    else if (v->placement == MUON_FLAT)
      w = snprintf(out + used, size - used, "%sflat [%lld, +%lld), %d of %d", sep, v->offset, v->length, v->index,
                   v->size);
    else if (v->placement == MUON_PARTIAL)
      w = snprintf(out + used, size - used, "%spartial %s, %d of %d", sep,
                   v->reduce == MUON_REDUCE_MEAN ? "mean" : "sum", v->index, v->size);
    else w = snprintf(out + used, size - used, "%sreplicated, %d of %d", sep, v->index, v->size);
    used += w > 0 ? (size_t)w : 0;
  }
}

/* A holder's layout: its levels in the plan's pool. */
static const muon_level *muon__holder_levels(const muon__plan *pl, const muon__holder *h, int *n) {
  size_t s = (size_t)h->rank * (size_t)pl->max_layouts + h->slot;
  *n = (int)(pl->layout_at[s + 1] - pl->layout_at[s]);
  return pl->layout_levels + pl->layout_at[s];
}

/* A holder's layout as text (its levels; the key is the matrix's). */
static void muon__holder_text(const muon__plan *pl, const muon__holder *h, char *out, size_t size) {
  muon_layout l;
  const muon_level *levels;
  memset(&l, 0, sizeof l);
  levels = muon__holder_levels(pl, h, &l.n_levels);
  memcpy(l.levels, levels, (size_t)l.n_levels * sizeof(muon_level));
  muon__layout_text(&l, out, size);
}


/* One registered matrix on the wire. Its levels sit once in its rank's layout table: a rank's
   matrices share a few layouts (a TP x FSDP rank's: two or three). Its entry and name travel
   once per class of ranks that register the same entries (below): whole pipeline stages do, so
   a world of 16,384 ranks gathers little more than their layout tables. Its piece is not sent:
   every rank derives it from the levels, as the registrant did. */
typedef struct muon__entry {
  unsigned long long name_hash;  /* muon__name_hash of the full name: what matches */
  long long key;
  unsigned long long hparams;    /* hash of the group's Newton-Schulz hyperparameters */
  int rows, cols;
  int layout;                    /* its levels: a slot of the rank's layout table */
  int normuon_have, normuon_want;   /* NorMuon's second moment: held here, wanted */
  int flags;                     /* MUON__HAS_MOMENTUM | MUON__ON_OWNER */
} muon__entry;
#define MUON__HAS_MOMENTUM 1     /* a Partial matrix's momentum is held here */
#define MUON__ON_OWNER 2         /* muon__owner_momentum of this rank's piece */
#define MUON__NAME 64            /* a name on the wire: its first 63 characters, for messages */
#define MUON__COUNTS 6           /* planning's round 1 per rank: matrices, layouts, AdamW params,
                                    Partial ones, the digest of its entries and names, the bytes
                                    of its layout table (at most MUON__VOTE numbers: the buffer) */
#define MUON__LISTED (sizeof(muon__entry) + MUON__NAME)   /* a matrix's bytes in its class's list */

/* Every rank's list as planning gathers it: per rank `stride` bytes, its layout table (its
   records, zeros to max_table bytes) and its slice of its class's list. Ranks that register the same entries
   and names in the same order (a class: its lowest rank leads) share one list, its entries then
   their names, and each of the class's m members sends `slice` bytes of it (member k: bytes
   [k slice, (k + 1) slice)), so a class's list crosses the network once. */
typedef struct muon__lists {
  const unsigned char *bytes;
  size_t stride, slice, max_table;
  int max_local, max_layouts;
  int *lead, *member;            /* per rank: its class's lowest rank, its index among the members */
  unsigned char *classes;        /* after the exchange: every class's list, assembled */
  size_t *entry_at, *name_at;    /* rank r's entries and names in it */
} muon__lists;

static void muon__lists_init(muon__lists *w) { memset(w, 0, sizeof *w); }
static void muon__lists_free(muon_optimizer *opt, muon__lists *w) {
  muon__free(&opt->allocator, w->lead);
  muon__free(&opt->allocator, w->classes);
  muon__free(&opt->allocator, w->entry_at);
  muon__lists_init(w);
}
static size_t muon__list_bytes(const muon__lists *w) {
  size_t b = w->max_table + w->slice;
  return (b + 7) & ~(size_t)7;
}
static const unsigned char *muon__list_of(const muon__lists *w, int r) { return w->bytes + (size_t)r * w->stride; }
static const muon__entry *muon__entry_at(const muon__lists *w, int r, int i) {
  return (const muon__entry *)(const void *)(w->classes + w->entry_at[r] + (size_t)i * sizeof(muon__entry));
}
static const char *muon__entry_name(const muon__lists *w, int r, int i) {
  return (const char *)w->classes + w->name_at[r] + (size_t)i * MUON__NAME;
}

/* Holder j of x: its rank's listing of x gives its matrix index, layout and flags, the layout its
   part; its source is its own rank (muon__holders_of chooses among replicas). */
static muon__holder muon__holder_at(const muon__plan *pl, const muon__global *x, int j) {
  const muon__listing *l = pl->listings + x->listing;
  const muon_level *levels;
  muon__holder h;
  int r = x->holder_ranks[j], c = pl->class_of[r], lo = 0, hi = x->n_listings - 1, n, part;
  if (x->holders) return x->holders[j];
  while (lo < hi) {   /* by class, ascending */
    int mid = (lo + hi) / 2;
    if (l[mid].cls < c) lo = mid + 1; else hi = mid;
  }
  l += lo;
  h.rank = r;
  h.local = l->local;
  h.source = r;
  h.slot = (unsigned)l->slot;
  h.has_momentum = l->flags & MUON__HAS_MOMENTUM ? 1u : 0u;
  levels = muon__holder_levels(pl, &h, &n);
  (void)muon__levels_parts(levels, n, &part, NULL);
  h.part = (unsigned)part;
  return h;
}

/* A holder's piece, derived from its layout as its rank derived it (planning checked every
   layout). */
static muon__piece muon__piece_of(const muon__plan *pl, const muon__holder *h, int rows, int cols) {
  muon__piece p;
  char why[8];
  int n;
  const muon_level *levels = muon__holder_levels(pl, h, &n);
  (void)muon__levels_piece(levels, n, rows, cols, &p, why, sizeof why);
  return p;
}

/* Matrix i's name as planning sends it. */
static void muon__wire_name(const muon_optimizer *opt, int i, char *out /* [MUON__NAME] */) {
  memset(out, 0, MUON__NAME);
  if (opt->matrices[i].name[0]) memcpy(out, opt->matrices[i].name, MUON__NAME - 1);
  else snprintf(out, MUON__NAME, "#%d", i);
}
/* From round 1's numbers (P x MUON__COUNTS): the lists' sizes, the classes of equal lists and
   the slice of its class's list each member sends. -1: out of memory. */
static int muon__list_geometry(muon_optimizer *opt, muon__lists *w, const long long *counts) {
  int P = opt->comm.size, r, q, *tab, *members;
  size_t mask = 1, at;
  w->max_local = w->max_layouts = 0;
  w->slice = w->max_table = 0;
  w->lead = (int *)muon__alloc(&opt->allocator, 2 * (size_t)P * sizeof(int));
  while (mask < 2 * (size_t)P) mask <<= 1;
  tab = (int *)muon__alloc(&opt->allocator, (mask + (size_t)P) * sizeof(int));
  if (!w->lead || !tab) {
    muon__free(&opt->allocator, tab);
    return -1;
  }
  w->member = w->lead + P;
  members = tab + mask;
  memset(tab, 0xff, mask * sizeof(int));
  mask--;
  for (r = 0; r < P; r++) {
    const long long *c = counts + (size_t)r * MUON__COUNTS;
    if (c[0] > w->max_local) w->max_local = (int)c[0];
    if (c[1] > w->max_layouts) w->max_layouts = (int)c[1];
    for (at = (size_t)((unsigned long long)c[4] * 1099511628211ull >> 17) & mask; (q = tab[at]) >= 0;
         at = (at + 1) & mask)
      if (counts[(size_t)q * MUON__COUNTS + 4] == c[4] && counts[(size_t)q * MUON__COUNTS] == c[0]) break;
    if (q < 0) { tab[at] = q = r; members[r] = 0; }
    w->lead[r] = q;
    w->member[r] = members[q]++;
  }
  for (r = 0; r < P; r++) {
    const long long *c = counts + (size_t)r * MUON__COUNTS;
    /* its table, then a record of no levels for each slot it does not use */
    size_t table = (size_t)c[5] + 4 * (size_t)(w->max_layouts - c[1]);
    if (table > w->max_table) w->max_table = table;
    if (w->lead[r] == r) {
      size_t bytes = (size_t)c[0] * MUON__LISTED, m = (size_t)members[r];
      if ((bytes + m - 1) / m > w->slice) w->slice = (bytes + m - 1) / m;
    }
  }
  muon__free(&opt->allocator, tab);
  w->stride = muon__list_bytes(w);
  return 0;
}

/* After the exchange: every class's list, assembled from its members' slices. */
static muon_status muon__gather_classes(muon_optimizer *opt, muon__lists *w, const int *count) {
  int P = opt->comm.size, r;
  size_t total = 0, at, n;
  w->entry_at = (size_t *)muon__alloc(&opt->allocator, 2 * (size_t)P * sizeof(size_t));
  for (r = 0; w->entry_at && r < P; r++)   /* a list is a multiple of 16 bytes: entries stay aligned */
    if (w->lead[r] == r) { w->entry_at[r] = total; total += (size_t)count[r] * MUON__LISTED; }
  w->classes = w->entry_at ? (unsigned char *)muon__alloc(&opt->allocator, total + 1) : NULL;
  if (!w->classes) return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating %zu bytes of matrix lists failed", total);
  w->name_at = w->entry_at + P;
  for (r = 0; r < P; r++) {
    size_t size = (size_t)count[w->lead[r]] * MUON__LISTED;
    w->entry_at[r] = w->entry_at[w->lead[r]];
    w->name_at[r] = w->entry_at[r] + (size_t)count[w->lead[r]] * sizeof(muon__entry);
    at = (size_t)w->member[r] * w->slice;
    n = at < size ? MUON__MIN(w->slice, size - at) : 0;
    memcpy(w->classes + w->entry_at[r] + at, muon__list_of(w, r) + w->max_table, n);
  }
  return MUON_OK;
}

static void muon__plan_free(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  const muon_allocator *a = &opt->allocator;
  int g;
  (void)muon__comm_finish(opt, "freeing the exchange buffers");   /* nothing queued may still use them */
  for (g = 0; g < pl->n_globals; g++) muon__free(a, pl->globals[g].holder_ranks);
  muon__free(a, pl->globals);
  muon__free(a, pl->layout_levels);
  muon__free(a, pl->layout_at);
  muon__free(a, pl->owned);
  muon__free(a, pl->owned_pieces);
  muon__free(a, pl->owned_at);
  muon__free(a, pl->class_of);
  muon__free(a, pl->listings);
  muon__free(a, pl->one_holders);
  muon__free(a, pl->one_pieces);
  muon__free(a, pl->one_first);
  muon__free(a, pl->round_start);
  muon__free(a, pl->round_order);
  muon__free(a, pl->order);
  muon__free(a, pl->order_start);
  muon__free(a, pl->many_X);
  muon__compute_free(opt, pl->stash);
  for (g = 0; pl->xfers && g < pl->n_xfers; g++) {
    muon__xfer *x = &pl->xfers[g];
    if (!x->owns) continue;
    muon__compute_free(opt, x->send);
    muon__compute_free(opt, x->recv);
    muon__compute_free(opt, x->wire_send);
    muon__compute_free(opt, x->wire_recv);
    muon__compute_free_host(opt, x->host_send);
    muon__compute_free_host(opt, x->host_recv);
  }
  if (pl->xfers) muon__free(a, pl->xfers[0].cnt);
  muon__free(a, pl->xfers);
  muon__compute_free(opt, pl->gathered);
  muon__compute_free(opt, pl->reduced);
  muon__compute_free(opt, pl->scratch);
  muon__compute_free(opt, pl->ns_ws);
  muon__free(a, pl->ops);
  muon__free(a, pl->counts);
  muon__free(a, pl->flags);
  muon__compute_free(opt, pl->out_flags);
  muon__free(a, pl->host_out);
  muon__free(a, pl->out_skips);
  muon__free(a, pl->skip_at);
  muon__free(a, pl->adamw_names);
  muon__free(a, pl->adamw_members);
  muon__free(a, pl->aw_order);
  muon__free(a, pl->aw.cnt);
  muon__compute_free(opt, pl->aw.send);
  muon__compute_free(opt, pl->aw.recv);
  muon__compute_free_host(opt, pl->aw.host_send);
  muon__compute_free_host(opt, pl->aw.host_recv);
  muon__compute_free(opt, pl->aw_reduced);
  muon__compute_free(opt, pl->aw_param);
  muon__compute_free(opt, pl->aw_m);
  muon__compute_free(opt, pl->aw_v);
  muon__compute_free(opt, pl->aw_full);
  muon__compute_free(opt, pl->aw_flags);
  muon__free(a, pl->aw_host_flags);
  muon__compute_free(opt, pl->checks);
  muon__free(a, pl->host_checks);
  muon__compute_free(opt, pl->check_ws);
  memset(pl, 0, sizeof *pl);
}

/* ---- >>impl-plan-owners Plan: fingerprints, the tiling check and owners ---------------------- */
static unsigned long long muon__ns_hash(const muon_hparams *hp) {
  unsigned char buf[4 * (9 + 3 * MUON_NS_MAX_STEPS)], *p = buf;
  int k;
  muon__put32(&p, (uint32_t)hp->ns_steps);
  for (k = 0; k < hp->ns_steps; k++) muon__put_floats(&p, hp->ns_coefficients[k], 3);
  muon__put_floats(&p, &hp->eps, 1);
  muon__put32(&p, (uint32_t)hp->precision);
  muon__put32(&p, (uint32_t)hp->symmetric);
  muon__put32(&p, (uint32_t)hp->ns_algorithm);
  muon__put32(&p, hp->ns_algorithm == MUON_NS_GRAM ? (uint32_t)hp->ns_restarts : 0u);
  muon__put32(&p, (uint32_t)hp->normuon);   /* where the second moment lives is planned */
  return muon__fnv1a(buf, (size_t)(p - buf));
}

static int muon__same_piece(const muon__piece *a, const muon__piece *b) {
  return a->r0 == b->r0 && a->c0 == b->c0 && a->h == b->h && a->w == b->w && a->f0 == b->f0 && a->f1 == b->f1;
}

typedef struct muon__interval { long long start, len; int rank; } muon__interval;
static int muon__interval_cmp(const void *a, const void *b) {
  const muon__interval *x = (const muon__interval *)a, *y = (const muon__interval *)b;
  return x->start < y->start ? -1 : x->start > y->start ? 1 : x->rank - y->rank;
}

/* The distinct pieces of a matrix must cover it exactly once; replicas hold identical pieces. */
/* Elements [a, b) of the row-major matrix that no rank holds. */
static muon_status muon__gap(muon_optimizer *opt, const muon__global *g, int gi, long long a, long long b) {
  return muon__fail(
      opt, MUON_ERR_SHAPE,
      "muon_plan: the pieces of matrix '%s' (global %d, %d x %d) leave a gap: no rank holds elements [%lld, %lld) "
      "of its row-major flattening (row %lld, col %lld to row %lld, col %lld)%s",
      g->name, gi, g->rows, g->cols, a, b, a / g->cols, a % g->cols, (b - 1) / g->cols, (b - 1) % g->cols,
      b == (long long)g->rows * g->cols ? ", its tail" : "");
}

/* Per holder (H[j], its piece pieces[j]), the first (lowest index) holder of an equal piece (and
   part, with_part), into first: the groups of replicas, found through a hash table of the pieces
   in the plan's room (a world has tens of thousands of holders per matrix, a sort of them was
   most of planning's time). */
static void muon__group_holders(const muon__plan *pl, const muon__holder *H, const muon__piece *pieces, int n,
                                int with_part, int *first) {
  int *tab = pl->one_table, i, j;
  size_t mask = 1, at;
  while (mask < 2 * (size_t)n) mask <<= 1;
  memset(tab, 0xff, mask * sizeof(int));
  mask--;
  for (j = 0; j < n; j++) {
    int part = with_part ? (int)H[j].part : 0;
    uint64_t key = muon__fnv1a((const unsigned char *)&pieces[j], sizeof pieces[j]) ^ (uint64_t)part;
    for (at = (size_t)(key * 1099511628211ull) & mask; (i = tab[at]) >= 0; at = (at + 1) & mask)
      if (muon__same_piece(&pieces[i], &pieces[j]) && (with_part ? (int)H[i].part : 0) == part) break;
    if (i < 0) tab[at] = i = j;
    first[j] = i;
  }
}

/* Each distinct piece the owner lacks is sent once, by the holder nearest the owner's rank
   (in a row-major mesh: the same replica group); of a Partial matrix, each part of each piece.
   first: the groups of equal pieces and parts. */
static void muon__choose_sources(muon__holder *H, int n, const int *first, int owner) {
  int j;
  /* Per group, its lowest-index holder keeps the choice so far: the nearest rank, the first of
     equals; the owner's own group gets the owner (distance 0). */
  for (j = 0; j < n; j++) {
    muon__holder *lead = &H[first[j]];
    if (first[j] == j || abs(H[j].rank - owner) < abs(lead->source - owner)) lead->source = H[j].rank;
  }
  for (j = 0; j < n; j++) H[j].source = H[first[j]].source;
}

/* Every holder of x in full, sources chosen, and (pieces) their pieces: the owner's, kept; any
   other matrix's derived into the plan's room for one (valid until the next call). */
static const muon__holder *muon__holders_of(const muon_optimizer *opt, const muon__global *x,
                                            const muon__piece **pieces) {
  const muon__plan *pl = &opt->plan;
  muon__holder *H = pl->one_holders;
  muon__piece *P = pl->one_pieces;
  int j;
  if (x->holders) {
    if (pieces) *pieces = x->pieces;
    return x->holders;
  }
  for (j = 0; j < x->n_holders; j++) {
    H[j] = muon__holder_at(pl, x, j);
    P[j] = muon__piece_of(pl, &H[j], x->rows, x->cols);
  }
  if (x->replicas) {
    muon__group_holders(pl, H, P, x->n_holders, 1, pl->one_first);
    muon__choose_sources(H, x->n_holders, pl->one_first, x->owner);
  }
  if (pieces) *pieces = P;
  return H;
}

/* The fast path of the tiling check, for distinct pieces that are whole rectangles (every mesh
   of SHARD levels): they tile the matrix iff they paint each cell of the grid their edges draw
   exactly once. Edges are found through an index of every row and column boundary (no sort: a
   world has tens of thousands of pieces per matrix). 1: they do; 0: unknown (not rectangles, a
   grid too fine, sides far longer than the pieces are many) or not, and the exact check below,
   row segment by row segment, says which and where; -1: out of memory. */
static int muon__tiles_by_grid(muon_optimizer *opt, const muon__global *g, const muon__piece *pieces, const int *first) {
  size_t n = 0, nr = 0, nc = 0, i, k, a, b, c, d, ok = 1;
  int *ri, *ci;   /* per row (column) boundary 0..rows (cols): its index among the edges, or -1 */
  unsigned char *cell = NULL;
  int j;
  for (j = 0; j < g->n_holders; j++) {
    const muon__piece *p = &pieces[j];
    if (first[j] != j) continue;
    if (p->f0 != 0 || p->f1 != p->h * p->w) return 0;
    n++;
  }
  if ((size_t)g->rows + (size_t)g->cols > 64 * n + ((size_t)1 << 22)) return 0;
  ri = (int *)muon__alloc(&opt->allocator, ((size_t)g->rows + (size_t)g->cols + 2) * sizeof(int));
  if (!ri) return -1;
  ci = ri + g->rows + 1;
  memset(ri, 0xff, ((size_t)g->rows + (size_t)g->cols + 2) * sizeof(int));
  ri[0] = ri[g->rows] = ci[0] = ci[g->cols] = 0;
  for (j = 0; j < g->n_holders; j++) {
    const muon__piece *p = &pieces[j];
    if (first[j] != j) continue;
    ri[p->r0] = ri[p->r0 + p->h] = ci[p->c0] = ci[p->c0 + p->w] = 0;
  }
  for (i = 0; i <= (size_t)g->rows; i++) if (ri[i] >= 0) ri[i] = (int)nr++;
  for (i = 0; i <= (size_t)g->cols; i++) if (ci[i] >= 0) ci[i] = (int)nc++;
  if ((nr - 1) * (nc - 1) > 4 * n + 64) {
    muon__free(&opt->allocator, ri);
    return 0;
  }
  if (!(cell = (unsigned char *)muon__alloc(&opt->allocator, (nr - 1) * (nc - 1) + 1))) {
    muon__free(&opt->allocator, ri);
    return -1;
  }
  memset(cell, 0, (nr - 1) * (nc - 1));
  for (j = 0; ok && j < g->n_holders; j++) {
    const muon__piece *p = &pieces[j];
    if (first[j] != j) continue;
    a = (size_t)ri[p->r0]; b = (size_t)ri[p->r0 + p->h];
    c = (size_t)ci[p->c0]; d = (size_t)ci[p->c0 + p->w];
    for (i = a; ok && i < b; i++)
      for (k = c; k < d; k++) if (cell[i * (nc - 1) + k]++) { ok = 0; break; }
  }
  for (i = 0; ok && i < (nr - 1) * (nc - 1); i++) ok = cell[i] == 1;
  muon__free(&opt->allocator, cell);
  muon__free(&opt->allocator, ri);
  return (int)ok;
}

/* first: muon__group_holders without parts. */
static muon_status muon__check_tiling(muon_optimizer *opt, const muon__global *g, int gi, const muon__piece *pieces,
                                      const int *first) {
  size_t n = 0, k = 0;
  int j;
  long long next = 0;
  muon__interval *iv;
  muon_status st = MUON_OK;
  int fast = muon__tiles_by_grid(opt, g, pieces, first);
  if (fast) {
    return fast > 0 ? MUON_OK : muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating the tiling check of matrix %d failed", gi);
  }
  for (j = 0; j < g->n_holders; j++) {
    muon__seg s = muon__segs(&pieces[j]);
    if (first[j] != j) continue;
    while (muon__next_seg(&pieces[j], &s)) n++;
  }
  iv = (muon__interval *)muon__alloc(&opt->allocator, n * sizeof *iv + 1);
  if (!iv) {
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating the tiling check of matrix %d failed", gi);
  }
  for (j = 0; j < g->n_holders; j++) {
    muon__seg s = muon__segs(&pieces[j]);
    if (first[j] != j) continue;
    while (muon__next_seg(&pieces[j], &s)) {
      iv[k].start = s.row * g->cols + s.col;
      iv[k].len = s.len;
      iv[k].rank = g->holder_ranks[j];
      k++;
    }
  }
  qsort(iv, n, sizeof *iv, muon__interval_cmp);
  for (k = 0; k < n && st == MUON_OK; k++) {
    if (iv[k].start < next)
      st = muon__fail(
          opt, MUON_ERR_SHAPE,
          "muon_plan: the pieces of matrix '%s' (global %d, %d x %d) overlap at row %lld, col %lld (ranks %d and %d hold different pieces there)",
          g->name, gi, g->rows, g->cols, iv[k].start / g->cols, iv[k].start % g->cols, iv[k > 0 ? k - 1 : 0].rank,
          iv[k].rank);
    else if (iv[k].start > next)
      st = muon__gap(opt, g, gi, next, iv[k].start);
    next = iv[k].start + iv[k].len;
  }
  if (st == MUON_OK && next != (long long)g->rows * g->cols)
    st = muon__gap(opt, g, gi, next, (long long)g->rows * g->cols);
  muon__free(&opt->allocator, iv);
  return st;
}

/* A Partial matrix: every part's pieces tile it alike, so the owner can add them piece by piece. */
static muon_status muon__check_parts(muon_optimizer *opt, const muon__global *x, int g, const int *first,
                                     const int *first_part) {
  long long pieces = 0, pairs = 0;
  int j;
  if (opt->dist.gather)
    return muon__fail(
        opt, MUON_ERR_ARG,
        "muon_plan: matrix '%s' (global %d) keeps its momentum whole on its owner (a PARTIAL level, or "
        "muon_hparams.momentum_format INT8 held in pieces), which needs muon's own exchange: muon_dist_config.gather is set",
        x->name, g);
  for (j = 0; j < x->n_holders; j++) {
    pieces += first[j] == j;
    pairs += first_part[j] == j;
  }
  if (pairs != pieces * x->parts)
    return muon__fail(
        opt, MUON_ERR_SHAPE,
        "muon_plan: matrix '%s' (global %d): its %d Partial parts do not each hold all %lld of its pieces (%lld piece-part pairs held): every part needs the whole matrix",
        x->name, g, x->parts, pieces, pairs);
  return MUON_OK;
}

typedef struct muon__by_cost { double cost; int index; } muon__by_cost;
static int muon__by_cost_cmp(const void *a, const void *b) {
  const muon__by_cost *x = (const muon__by_cost *)a, *y = (const muon__by_cost *)b;
  if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
  return x->index - y->index;
}

/* Greedy, largest first: each matrix goes to the least loaded of its holders. */
static muon_status muon__assign_balanced(muon_optimizer *opt, int *owner) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, g, j;
  muon__by_cost *order = (muon__by_cost *)muon__alloc(&opt->allocator, (size_t)pl->n_globals * sizeof *order);
  double *load = (double *)muon__alloc(&opt->allocator, (size_t)P * sizeof *load);
  if (!order || !load) {
    muon__free(&opt->allocator, order);
    muon__free(&opt->allocator, load);
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating the owner assignment failed");
  }
  for (g = 0; g < pl->n_globals; g++) {
    order[g].cost = muon__ns_cost(pl->globals[g].rows, pl->globals[g].cols);
    order[g].index = g;
  }
  for (j = 0; j < P; j++) load[j] = 0;
  qsort(order, (size_t)pl->n_globals, sizeof *order, muon__by_cost_cmp);
  for (g = 0; g < pl->n_globals; g++) {
    const muon__global *x = &pl->globals[order[g].index];
    int best = x->holder_ranks[0];
    for (j = 1; j < x->n_holders; j++)
      if (load[x->holder_ranks[j]] < load[best]) best = x->holder_ranks[j];
    owner[order[g].index] = best;
    load[best] += order[g].cost;
  }
  muon__free(&opt->allocator, order);
  muon__free(&opt->allocator, load);
  return MUON_OK;
}

static void muon__info(const muon_optimizer *opt, int g, muon_matrix_info *info) {
  const muon__global *x = &opt->plan.globals[g];
  info->index = g;
  info->name = x->name;
  info->rows = x->rows;
  info->cols = x->cols;
  info->local = x->local;
  info->local_size = x->local >= 0 ? opt->matrices[x->local].size : 0;
  info->n_holders = x->n_holders;
  info->holders = x->holder_ranks;
}

static muon_status muon__assign(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  int g, j, *owner = (int *)muon__alloc(&opt->allocator, (size_t)pl->n_globals * sizeof(int));
  muon_status st = MUON_OK;
  if (!owner) return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating owners failed");
  for (g = 0; g < pl->n_globals; g++) owner[g] = -1;
  if (opt->dist.assign) {
    muon_matrix_info *info = (muon_matrix_info *)muon__alloc(&opt->allocator, (size_t)pl->n_globals * sizeof *info);
    if (!info) st = muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating matrix infos failed");
    for (g = 0; st == MUON_OK && g < pl->n_globals; g++) muon__info(opt, g, &info[g]);
    if (st == MUON_OK &&
        (st = opt->dist.assign(opt->dist.state, info, pl->n_globals, opt->comm.size, owner)) != MUON_OK)
      st = muon__fail(opt, MUON_ERR_ASSIGN, "muon_dist_config.assign returned %s", muon_status_string(st));
    muon__free(&opt->allocator, info);
  } else if (opt->dist.round_robin) {
    for (g = 0; g < pl->n_globals; g++) owner[g] = pl->globals[g].holder_ranks[g % pl->globals[g].n_holders];
  } else {
    st = muon__assign_balanced(opt, owner);
  }
  for (g = 0; st == MUON_OK && g < pl->n_globals; g++) {
    muon__global *x = &pl->globals[g];
    if (owner[g] < 0 || owner[g] >= pl->P) {
      st = muon__fail(opt, MUON_ERR_ASSIGN, "muon_plan: matrix '%s' (global %d) has owner %d, outside [0, %d)", x->name,
                      g, owner[g], pl->P);
      break;
    }
    for (j = 0; j < x->n_holders && x->holder_ranks[j] != owner[g]; j++) {}
    if (j == x->n_holders) {
      st = muon__fail(
          opt, MUON_ERR_ASSIGN,
          "muon_plan: matrix '%s' (global %d) has owner %d, which holds none of it (its holders are ranks %d..%d)",
          x->name, g, owner[g], x->holder_ranks[0], x->holder_ranks[x->n_holders - 1]);
      break;
    }
    x->owner = owner[g];
  }
  muon__free(&opt->allocator, owner);
  return st;
}

/* ---- >>impl-plan-rounds Plan: sources, rounds, batches and the exchange buffers -------------- */
/* Floats rank `me` moves in one round when no matrix is skipped: out (U to owners) and back
   (O to holders); sizes the buffers, and the plan's text gives it for every rank. */
typedef struct muon__traffic { size_t out_send, out_recv, back_send, back_recv, gathered; int ops; } muon__traffic;

/* Whether rank r holds a piece of x. */
static int muon__holds(const muon__global *x, int r) {
  int lo = 0, hi = x->n_holders;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (x->holder_ranks[mid] < r) lo = mid + 1; else hi = mid;
  }
  return lo < x->n_holders && x->holder_ranks[lo] == r;
}

static muon__traffic muon__round_traffic(const muon_optimizer *opt, int r, int me) {
  const muon__plan *pl = &opt->plan;
  int k, j;
  muon__traffic t;
  memset(&t, 0, sizeof t);
  for (k = pl->round_start[r]; k < pl->round_start[r + 1]; k++) {
    const muon__global *x = &pl->globals[pl->round_order[k]];
    const muon__holder *H;
    const muon__piece *pieces;
    if (x->owner == me) {
      t.gathered += (size_t)x->rows * x->cols;
      t.ops += x->n_holders + 1;
    }
    if (me == pl->me && x->owner != me) {   /* this rank's own piece, to its owner and back */
      size_t n = x->mine >= 0 ? muon__piece_size(&opt->matrices[x->local].piece) : 0;
      if (x->my_source == me) t.out_send += n;
      t.back_recv += n;
      continue;
    }
    if (x->owner != me && !muon__holds(x, me)) continue;
    H = muon__holders_of(opt, x, &pieces);
    for (j = 0; j < x->n_holders; j++) {
      const muon__holder *h = &H[j];
      size_t n;
      if (h->rank != me && x->owner != me) continue;
      n = muon__piece_size(&pieces[j]);
      if (h->rank == h->source && h->source != x->owner) {
        if (h->rank == me) t.out_send += n;
        if (x->owner == me) t.out_recv += n;
      }
      if (h->rank != x->owner) {
        if (x->owner == me) t.back_send += n;
        if (h->rank == me) t.back_recv += n;
      }
    }
  }
  return t;
}

/* Rounds: each owner's matrices, in order, fill its rounds 0, 1, ... with up to round_bytes each
   (a matrix larger than that alone), so there are as many rounds as the busiest owner needs.
   (Cutting the list of matrices wherever an owner came back made a round every few matrices
   where owners take turns, as a MoE's experts do: 3,936 rounds, 7,872 collectives a step, for
   one at 16,384 ranks.) round_order lists each round's globals in turn. cur: P ints. */
static void muon__make_rounds(muon_optimizer *opt, size_t *owned_bytes, int *cur) {
  muon__plan *pl = &opt->plan;
  size_t budget = opt->dist.round_bytes ? opt->dist.round_bytes : (size_t)64 << 20;
  int g, r, P = pl->P, p;
  /* One device on the CPU backend's threads: 64 MiB of operands per thread (up to 4), so that a
     round has enough of them to keep every thread busy to its end. */
  if (!opt->distributed && muon__is_cpu(&opt->compute)) {
    int t = muon__cpu_threads(opt->compute.ctx);
    budget *= (size_t)(t < 4 ? t : 4);
  }
  if (pl->pipelined && !opt->dist.round_bytes) {
    /* Overlap needs rounds: about 2 (prefetch + 1) of them, each at least 1 MiB per owner. */
    size_t most = 0;
    for (p = 0; p < P; p++) owned_bytes[p] = 0;
    for (g = 0; g < pl->n_globals; g++)
      owned_bytes[pl->globals[g].owner] += (size_t)pl->globals[g].rows * pl->globals[g].cols * sizeof(float);
    for (p = 0; p < P; p++) if (owned_bytes[p] > most) most = owned_bytes[p];
    budget = most / (2 * (size_t)(pl->prefetch + 1));
    if (budget < ((size_t)1 << 20)) budget = (size_t)1 << 20;
    if (budget > ((size_t)64 << 20)) budget = (size_t)64 << 20;
  }
  for (p = 0; p < P; p++) { owned_bytes[p] = 0; cur[p] = 0; }
  pl->n_rounds = 0;
  for (g = 0; g < pl->n_globals; g++) {
    muon__global *x = &pl->globals[g];
    size_t b = (size_t)x->rows * x->cols * sizeof(float);
    if (owned_bytes[x->owner] && owned_bytes[x->owner] + b > budget) { cur[x->owner]++; owned_bytes[x->owner] = 0; }
    owned_bytes[x->owner] += b;
    x->round = cur[x->owner];
    if (x->round >= pl->n_rounds) pl->n_rounds = x->round + 1;
  }
  for (r = 0; r <= pl->n_rounds; r++) pl->round_start[r] = 0;   /* a counting sort by round */
  for (g = 0; g < pl->n_globals; g++) pl->round_start[pl->globals[g].round + 1]++;
  for (r = 0; r < pl->n_rounds; r++) pl->round_start[r + 1] += pl->round_start[r];
  for (g = 0; g < pl->n_globals; g++) pl->round_order[pl->round_start[pl->globals[g].round]++] = g;
  for (r = pl->n_rounds; r > 0; r--) pl->round_start[r] = pl->round_start[r - 1];
  pl->round_start[0] = 0;
}

/* The group of the matrix this rank holds of global x: owners always hold one. */
static const muon_hparams *muon__global_hparams(const muon_optimizer *opt, const muon__global *x) {
  return &opt->groups[opt->matrices[x->local].group];
}

/* Same operand shape and NS settings (x->ns, set at planning for the matrices a rank owns). */
static int muon__same_batch(const muon__global *x, const muon__global *y) {
  int mx = x->rows < x->cols ? x->rows : x->cols, nx = x->rows < x->cols ? x->cols : x->rows;
  int my = y->rows < y->cols ? y->rows : y->cols, ny = y->rows < y->cols ? y->cols : y->rows;
  return mx == my && nx == ny && x->ns == y->ns;
}

/* The exchanges' buffers: one set shared by a round's two exchanges in the debug setting; with
   prefetch or async, one set for each of the prefetch + 1 gathers and the pl->backs
   redistributions that can be in flight at once (muon__exchange_rounds). */
static size_t muon__wire_floats(const muon__plan *pl, size_t n) { return MUON__MIN(n, n / 2 + (size_t)pl->P); }

static int muon__xfer_sets(const muon__plan *pl) { return pl->pipelined ? pl->n_xfers : 1; }

static size_t muon__xfer_bytes(const muon_optimizer *opt) {
  const muon__plan *pl = &opt->plan;
  size_t one = pl->send_floats + pl->recv_floats;
  if (pl->wire_bf16) one += muon__wire_floats(pl, pl->send_floats) + muon__wire_floats(pl, pl->recv_floats);
  if (pl->stage)
    one += pl->wire_bf16 ? muon__wire_floats(pl, pl->send_floats) + muon__wire_floats(pl, pl->recv_floats) : one;
  return (size_t)muon__xfer_sets(pl) * one * sizeof(float);
}

static muon_status muon__alloc_xfers(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  size_t P = (size_t)pl->P, *cnt, ws = muon__wire_floats(pl, pl->send_floats),
         wr = muon__wire_floats(pl, pl->recv_floats);
  int i;
  pl->n_xfers = pl->pipelined ? pl->prefetch + 1 + pl->backs : 2;
  pl->xfers = (muon__xfer *)muon__alloc(&opt->allocator, (size_t)pl->n_xfers * sizeof(muon__xfer));
  cnt = (size_t *)muon__alloc(&opt->allocator, (size_t)pl->n_xfers * 8 * P * sizeof(size_t));
  if (!pl->xfers || !cnt) {
    muon__free(&opt->allocator, pl->xfers);
    muon__free(&opt->allocator, cnt);
    pl->xfers = NULL;
    return MUON_ERR_NOMEM;
  }
  memset(pl->xfers, 0, (size_t)pl->n_xfers * sizeof(muon__xfer));
  for (i = 0; i < pl->n_xfers; i++) {
    muon__xfer *x = &pl->xfers[i];
    x->cnt = cnt + (size_t)i * 8 * P;
    x->wire = x->cnt + 4 * P;
    x->bf16 = pl->wire_bf16;
    if (i >= muon__xfer_sets(pl)) {   /* the debug setting: a round's two exchanges share a set */
      x->send = pl->xfers[0].send; x->recv = pl->xfers[0].recv;
      x->wire_send = pl->xfers[0].wire_send; x->wire_recv = pl->xfers[0].wire_recv;
      x->host_send = pl->xfers[0].host_send; x->host_recv = pl->xfers[0].host_recv;
      continue;
    }
    x->owns = 1;
    x->send = (float *)muon__compute_alloc(opt, pl->send_floats * sizeof(float));
    x->recv = (float *)muon__compute_alloc(opt, pl->recv_floats * sizeof(float));
    if (!x->send || !x->recv) return MUON_ERR_NOMEM;
    if (pl->wire_bf16) {   /* per peer ceil(n / 2) slots: at most n / 2 + P in all, and at most n */
      x->wire_send = (float *)muon__compute_alloc(opt, ws * sizeof(float));
      x->wire_recv = (float *)muon__compute_alloc(opt, wr * sizeof(float));
      if (!x->wire_send || !x->wire_recv) return MUON_ERR_NOMEM;
    }
    if (pl->stage) {
      x->host_send = (float *)muon__compute_alloc_host(opt, (pl->wire_bf16 ? ws : pl->send_floats) * sizeof(float));
      x->host_recv = (float *)muon__compute_alloc_host(opt, (pl->wire_bf16 ? wr : pl->recv_floats) * sizeof(float));
      if (!x->host_send || !x->host_recv) return MUON_ERR_NOMEM;
    }
  }
  return MUON_OK;
}

/* Whether the compute backend takes a round's operands of several shapes in one call. */
static int muon__ns_many(const muon_optimizer *opt) {
  return MUON__SLOT(opt->compute.vt, 1, newton_schulz_many) != NULL;
}

/* Per round: the owned matrices in batch order (a stable insertion sort by operand shape and NS
   settings: rounds are short), their operand offsets, and the NS workspace of the largest batch
   (with newton_schulz_many, of the largest round). Returns the most operands of a round. */
static int muon__plan_batches(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  int r, g, k, n = 0, i, j, most = 0;
  pl->ns_ws_bytes = 0;
  for (g = 0; g < pl->n_globals; g++)
    if (pl->globals[g].owner == pl->me) pl->globals[g].ns = muon__ns_hash(muon__global_hparams(opt, &pl->globals[g]));
  for (r = 0; r < pl->n_rounds; r++) {
    int first = n;
    size_t xoff = 0;
    pl->order_start[r] = n;
    for (k = pl->round_start[r]; k < pl->round_start[r + 1]; k++) {
      const muon__global *x = &pl->globals[pl->round_order[k]];
      if (x->owner != pl->me) continue;
      i = n;                                      /* after the last one of its batch, if any */
      for (j = n - 1; j >= first; j--)
        if (muon__same_batch(&pl->globals[pl->order[j]], x)) { i = j + 1; break; }
      memmove(pl->order + i + 1, pl->order + i, (size_t)(n - i) * sizeof(int));
      pl->order[i] = pl->round_order[k];
      n++;
    }
    for (i = first; i < n; ) {
      const muon__global *x = &pl->globals[pl->order[i]];
      int m = x->rows < x->cols ? x->rows : x->cols, nn = x->rows < x->cols ? x->cols : x->rows, b = 0;
      size_t ws;
      while (i + b < n && muon__same_batch(&pl->globals[pl->order[i + b]], x)) {
        pl->globals[pl->order[i + b]].xoff = xoff;
        xoff += (size_t)m * nn;
        b++;
      }
      ws = muon__compute_ns_workspace(opt, muon__ns_many(opt) ? n - first : b, m, nn, muon__global_hparams(opt, x));
      if (ws > pl->ns_ws_bytes) pl->ns_ws_bytes = ws;
      i += b;
    }
    if (n - first > most) most = n - first;
  }
  pl->order_start[pl->n_rounds] = n;
  return most;
}

/* ---- >>impl-plan-build Plan: building it from every rank's entries --------------------------- */
/* 1a. Classes: the ranks that sent one list (w's leads), numbered in the order of their lowest
   ranks, and each class's members, ascending. */
static muon_status muon__plan_classes(muon_optimizer *opt, const muon__lists *w, int *n_classes) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, r, c, n = 0;
  pl->class_of = (int *)muon__alloc(&opt->allocator, (3 * (size_t)P + 2) * sizeof(int));
  if (!pl->class_of) return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating the classes of %d ranks failed", P);
  pl->class_start = pl->class_of + P;
  for (r = 0; r < P; r++) pl->class_of[r] = w->lead[r] == r ? n++ : pl->class_of[w->lead[r]];
  pl->class_members = pl->class_start + n + 1;
  memset(pl->class_start, 0, ((size_t)n + 1) * sizeof(int));
  for (r = 0; r < P; r++) pl->class_start[pl->class_of[r] + 1]++;
  for (c = 0; c < n; c++) pl->class_start[c + 1] += pl->class_start[c];
  for (r = 0; r < P; r++) pl->class_members[pl->class_start[pl->class_of[r]]++] = r;
  for (c = n; c > 0; c--) pl->class_start[c] = pl->class_start[c - 1];
  pl->class_start[0] = 0;
  *n_classes = n;
  return MUON_OK;
}

/* 1b. The global list: matrices matched by (name, key), in order of first appearance by rank (a
   class's entries first appear at its lowest rank); gid[t] is the global index of class entry t
   (class c's are from base[c]). A hash table finds them: with experts, a world has tens of
   thousands of matrices. */
static muon_status muon__plan_globals(muon_optimizer *opt, const muon__lists *w, const int *count, int n_classes,
                                      const int *base, int *gid) {
  muon__plan *pl = &opt->plan;
  size_t mask = 1, at;
  int c, i, g, t, total = base[n_classes], n = 0, *tab, *first;   /* first: per global, its first entry's rank and index */
  muon_status st = MUON_OK;
  while (mask < 2 * (size_t)total) mask <<= 1;
  tab = (int *)muon__alloc(&opt->allocator, mask * sizeof(int));
  first = (int *)muon__alloc(&opt->allocator, 2 * (size_t)total * sizeof(int) + 1);
  if (!tab || !first) {
    muon__free(&opt->allocator, tab);
    muon__free(&opt->allocator, first);
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating the global matrix list failed");
  }
  memset(tab, 0xff, mask * sizeof(int));
  mask--;
  for (c = 0, t = 0; c < n_classes && st == MUON_OK; c++) {
    int r = pl->class_members[pl->class_start[c]];
    for (i = 0; i < count[r] && st == MUON_OK; i++, t++) {
      const muon__entry *e = muon__entry_at(w, r, i), *f = NULL;
      at = (size_t)((e->name_hash ^ ((unsigned long long)e->key * 0x9e3779b97f4a7c15ull)) * 1099511628211ull >> 17) & mask;
      for (; (g = tab[at]) >= 0; at = (at + 1) & mask) {
        f = muon__entry_at(w, first[2 * g], first[2 * g + 1]);
        if (f->key == e->key && f->name_hash == e->name_hash) break;
      }
      gid[t] = g >= 0 ? g : n;
      if (g < 0) { tab[at] = n; first[2 * n] = r; first[2 * n + 1] = i; n++; }
      else if (f->rows != e->rows || f->cols != e->cols)
        st = muon__fail(opt, MUON_ERR_MISMATCH, "muon_plan: matrix '%s' is %d x %d on rank %d but %d x %d on rank %d",
                        muon__entry_name(w, r, i), (int)f->rows, (int)f->cols, first[2 * g], e->rows, e->cols, r);
    }
  }
  muon__free(&opt->allocator, tab);
  if (st == MUON_OK &&
      !(pl->globals = (muon__global *)muon__alloc(&opt->allocator, (size_t)n * sizeof(muon__global) + 1)))
    st = muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating the global matrix list failed");
  if (st == MUON_OK) memset(pl->globals, 0, (size_t)n * sizeof(muon__global));
  for (g = 0; st == MUON_OK && g < n; g++) {
    const muon__entry *e = muon__entry_at(w, first[2 * g], first[2 * g + 1]);
    muon__global *x = &pl->globals[g];
    memcpy(x->name, muon__entry_name(w, first[2 * g], first[2 * g + 1]), sizeof x->name);
    x->name_hash = e->name_hash;
    x->key = e->key;
    x->rows = (int)e->rows;
    x->cols = (int)e->cols;
    x->local = -1;
    x->mine = -1;
    x->my_source = -1;
    x->owner = first[2 * g];   /* first registrant, for the messages below */
  }
  if (st == MUON_OK) pl->n_globals = n;
  muon__free(&opt->allocator, first);
  return st;
}

/* 1c. Listings: each class's entry t, sorted by global (a counting sort), by class within one. */
static muon_status muon__plan_listings(muon_optimizer *opt, const muon__lists *w, const int *count, int n_classes,
                                       const int *base, const int *gid) {
  muon__plan *pl = &opt->plan;
  int c, i, g, t, total = base[n_classes];
  pl->listings = (muon__listing *)muon__alloc(&opt->allocator, (size_t)total * sizeof(muon__listing) + 1);
  if (!pl->listings) return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating %d listings failed", total);
  for (t = 0; t < total; t++) pl->globals[gid[t]].n_listings++;
  for (g = 0, t = 0; g < pl->n_globals; g++) { pl->globals[g].listing = t; t += pl->globals[g].n_listings; }
  for (c = 0, t = 0; c < n_classes; c++) {
    int r = pl->class_members[pl->class_start[c]];
    for (i = 0; i < count[r]; i++, t++) {
      const muon__entry *e = muon__entry_at(w, r, i);
      muon__listing *l = &pl->listings[pl->globals[gid[t]].listing++];
      l->cls = c;
      l->local = i;
      l->slot = e->layout;
      l->flags = e->flags;
    }
  }
  for (g = 0; g < pl->n_globals; g++) pl->globals[g].listing -= pl->globals[g].n_listings;
  return MUON_OK;
}

/* 2a. Every rank's layout table, decoded once into one pool of levels: holders point into it
   (a holder's levels are its rank's description of its piece). A table is walked record by
   record, twice: to size the pool, then to fill it. */
static muon_status muon__plan_layouts(muon_optimizer *opt, const muon__lists *w) {
  muon__plan *pl = &opt->plan;
  size_t slots = (size_t)pl->P * (size_t)w->max_layouts, s, n = 0;
  int pass, r, k;
  muon_layout l;
  if (w->max_layouts > MUON__MAX_SLOTS)
    return muon__fail(opt, MUON_ERR_ARG, "muon_plan: a rank registered matrices with %d distinct layouts, more than %d",
                      w->max_layouts, MUON__MAX_SLOTS);
  pl->layout_at = (size_t *)muon__alloc(&opt->allocator, (slots + 1) * sizeof(size_t));
  if (!pl->layout_at) return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating %zu layouts failed", slots);
  pl->max_layouts = w->max_layouts;
  for (pass = 0; pass < 2; pass++) {
    for (r = 0, s = 0, n = 0; r < pl->P; r++) {
      const unsigned char *p = muon__list_of(w, r), *end = p + w->max_table;
      for (k = 0; k < w->max_layouts; k++, s++) {
        if (!muon__get_table_record(&p, end, &l))
          return muon__fail(opt, MUON_ERR_MISMATCH, "muon_plan: rank %d sent a broken layout table (record %d)", r, k);
        if (pass) memcpy(pl->layout_levels + n, l.levels, (size_t)l.n_levels * sizeof(muon_level));
        pl->layout_at[s] = n;
        n += (size_t)l.n_levels;
      }
    }
    pl->layout_at[slots] = n;
    if (!pass && !(pl->layout_levels = (muon_level *)muon__alloc(&opt->allocator, n * sizeof(muon_level) + 1)))
      return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating %zu layouts failed", slots);
  }
  return MUON_OK;
}

/* Entry e of rank r: its layout (from the pool) and the piece it describes. */
static muon_status muon__entry_piece(muon_optimizer *opt, const muon__entry *e, int r, const char *name,
                                     muon_layout *l, muon__piece *piece) {
  const muon__plan *pl = &opt->plan;
  size_t s = (size_t)r * (size_t)pl->max_layouts + (size_t)e->layout;
  char why[160];
  if (e->layout < 0 || e->layout >= pl->max_layouts)
    return muon__fail(opt, MUON_ERR_MISMATCH, "muon_plan: rank %d sent matrix '%s' with layout slot %d of %d", r,
                      name, e->layout, pl->max_layouts);
  l->key = 0;   /* the levels past n_levels are never read: no memset per entry of the world */
  l->n_levels = (int)(pl->layout_at[s + 1] - pl->layout_at[s]);
  memcpy(l->levels, pl->layout_levels + pl->layout_at[s], (size_t)l->n_levels * sizeof(muon_level));
  if (muon__layout_piece(l, e->rows, e->cols, piece, why, sizeof why) != MUON_OK)
    return muon__fail(opt, MUON_ERR_MISMATCH, "muon_plan: rank %d's layout of matrix '%s' is invalid: %s", r, name,
                      why);
  return MUON_OK;
}

static int muon__pair_cmp(const void *a, const void *b) {
  const int *x = (const int *)a, *y = (const int *)b;
  return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : x[1] - y[1];
}

/* 2b. Holders (non-empty pieces) of global g, ascending by rank: each member of each class that
   lists it; this rank's local index; the checks that the holders agree and their pieces tile
   the matrix. Holders and pieces are built in the plan's room for one global; the ranks are
   kept. */
static muon_status muon__plan_holders(muon_optimizer *opt, const muon__lists *w, int g) {
  muon__plan *pl = &opt->plan;
  muon__global *x = &pl->globals[g];
  muon__holder *H = pl->one_holders;
  muon__piece *pieces = pl->one_pieces;
  int me = pl->me, r, i, k, n = 0, prev = -1, *pairs = pl->one_pairs, *first = pl->one_first, *first_part;
  unsigned long long hp = 0;
  muon_status st;
  for (k = 0; k < x->n_listings; k++) {   /* (rank, listing): ascending by rank */
    const muon__listing *l = &pl->listings[x->listing + k];
    for (i = pl->class_start[l->cls]; i < pl->class_start[l->cls + 1]; i++, n++) {
      pairs[2 * n] = pl->class_members[i];
      pairs[2 * n + 1] = x->listing + k;
    }
  }
  if (x->n_listings > 1) qsort(pairs, (size_t)n, 2 * sizeof(int), muon__pair_cmp);
  /* room for every entry: only a piece cut empty by an uneven split is left out */
  x->holder_ranks = (int *)muon__alloc(&opt->allocator, (size_t)n * sizeof(int) + 1);
  if (!x->holder_ranks) return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating holders failed");
  for (k = 0; k < n; k++) {
    const muon__entry *e;
    const char *name;
    muon__holder *h = &H[x->n_holders];
    muon__piece *piece = &pieces[x->n_holders];
    muon_layout layout;
    float scale;
    int parts, part;
    r = pairs[2 * k];
    i = pl->listings[pairs[2 * k + 1]].local;
    e = muon__entry_at(w, r, i);
    name = muon__entry_name(w, r, i);
    if (r == prev)
      return muon__fail(opt, MUON_ERR_ARG,
                        "muon_plan: rank %d registered matrix '%s' twice (names must be unique per layout key)", r,
                        name);
    prev = r;
    if (r == me) x->local = i;
    if ((st = muon__entry_piece(opt, e, r, name, &layout, piece)) != MUON_OK) return st;
    if (piece->f1 <= piece->f0) continue;
    if (x->n_holders && e->hparams != hp)
      return muon__fail(opt, MUON_ERR_MISMATCH,
                        "muon_plan: matrix '%s': ranks %d and %d use different Newton-Schulz hyperparameters", name,
                        H[0].rank, r);
    hp = e->hparams;
    if (r == me) x->mine = x->n_holders;
    h->rank = r;
    h->local = i;
    h->source = r;
    h->slot = (unsigned)e->layout;
    parts = muon__layout_parts(&layout, &part, &scale);
    if (parts > MUON__MAX_PARTS)
      return muon__fail(opt, MUON_ERR_SHAPE, "muon_plan: matrix '%s': rank %d's layout has %d Partial parts, more than %d",
                        name, r, parts, MUON__MAX_PARTS);
    h->part = (unsigned)part;
    if (x->n_holders && (parts != x->parts || scale != x->part_scale))
      return muon__fail(
          opt, MUON_ERR_MISMATCH,
          "muon_plan: matrix '%s': rank %d's layout has %d Partial parts (%s), rank %d's %d (%s): every holder must describe the same PARTIAL levels",
          name, H[0].rank, x->parts, x->part_scale == 1.0f ? "sum" : "mean", r, parts,
          scale == 1.0f ? "sum" : "mean");
    if (x->n_holders && (e->flags & MUON__ON_OWNER ? 1 : 0) != x->on_owner)
      return muon__fail(opt, MUON_ERR_MISMATCH,
                        "muon_plan: matrix '%s': rank %d keeps its momentum whole on the owner, rank %d in pieces "
                        "(muon_hparams.momentum_format INT8 with a piece of the matrix on one and the whole on the "
                        "other): every holder must hold a piece, or every one the whole matrix",
                        name, x->on_owner ? H[0].rank : r, x->on_owner ? r : H[0].rank);
    x->on_owner = e->flags & MUON__ON_OWNER ? 1 : 0;
    x->parts = parts;
    x->part_scale = scale;
    h->has_momentum = e->flags & MUON__HAS_MOMENTUM ? 1u : 0u;
    x->holder_ranks[x->n_holders] = r;
    x->n_holders++;
  }
  if (x->n_holders == 0)
    return muon__fail(opt, MUON_ERR_SHAPE, "muon_plan: no rank holds any element of matrix '%s' (global %d)", x->name,
                      g);
  /* The groups of equal pieces: the tiling counts each once; where a piece (and part) is held
     twice, its holders' sources are chosen among them once the owner is known. */
  first_part = x->parts > 1 ? pairs : first;   /* the pairs are read */
  muon__group_holders(pl, H, pieces, x->n_holders, 0, first);
  if (x->parts > 1) muon__group_holders(pl, H, pieces, x->n_holders, 1, first_part);
  if ((st = muon__check_tiling(opt, x, g, pieces, first)) != MUON_OK) return st;
  if (x->on_owner && (st = muon__check_parts(opt, x, g, first, first_part)) != MUON_OK) return st;
  for (k = 0; k < x->n_holders; k++) x->replicas |= first_part[k] != k;
  return MUON_OK;
}

/* An owner reads its matrices' holders every step: it keeps them in full, with their pieces and
   where each lands. */
static muon_status muon__plan_owned(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  size_t n = 0;
  int g;
  for (g = 0; g < pl->n_globals; g++)
    if (pl->globals[g].owner == pl->me) n += (size_t)pl->globals[g].n_holders;
  pl->owned = (muon__holder *)muon__alloc(&opt->allocator, n * sizeof(muon__holder) + 1);
  pl->owned_pieces = (muon__piece *)muon__alloc(&opt->allocator, n * sizeof(muon__piece) + 1);
  pl->owned_at = (size_t *)muon__alloc(&opt->allocator, n * sizeof(size_t) + 1);
  if (!pl->owned || !pl->owned_pieces || !pl->owned_at)
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating %zu owned pieces failed", n);
  for (g = 0, n = 0; g < pl->n_globals; g++) {
    muon__global *x = &pl->globals[g];
    const muon__piece *pieces;
    const muon__holder *H;
    if (x->owner != pl->me) continue;
    H = muon__holders_of(opt, x, &pieces);
    memcpy(pl->owned + n, H, (size_t)x->n_holders * sizeof *H);
    memcpy(pl->owned_pieces + n, pieces, (size_t)x->n_holders * sizeof *pieces);
    x->holders = pl->owned + n;
    x->pieces = pl->owned_pieces + n;
    x->at = pl->owned_at + n;
    n += (size_t)x->n_holders;
  }
  return MUON_OK;
}

/* 3. Owners, sources, rounds. */
static muon_status muon__plan_owners(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, g;
  muon_status st;
  pl->prefetch = opt->dist.prefetch;
  pl->pipelined = opt->distributed && !opt->dist.gather && P > 1 &&
                  (pl->prefetch > 0 || (opt->dist.async && (muon__async_comm(opt) || muon__side_comm(opt))));
  pl->side = pl->pipelined && opt->dist.async && muon__side_comm(opt);
  /* Exchanges on the communicator's own queue are in flight together, so a redistribution is
     left running as long as the gathers are (at most MUON__MAX_UNJOINED unjoined in all). */
  pl->backs = pl->side ? MUON__MIN(pl->prefetch + 2, MUON__MAX_UNJOINED - 2 - pl->prefetch) : 2;
  if ((st = muon__assign(opt)) != MUON_OK) return st;
  for (g = 0; g < pl->n_globals; g++) {
    muon__global *x = &pl->globals[g];
    int j, pin = -1;   /* a Partial matrix's momentum does not move: its holder stays the owner */
    for (j = x->n_holders - 1; x->on_owner && j >= 0; j--)
      if (muon__holder_at(pl, x, j).has_momentum) { pin = x->holder_ranks[j]; if (pin == x->owner) break; }
    if (pin >= 0) x->owner = pin;
    x->moves_back = x->n_holders > 1 || x->holder_ranks[0] != x->owner;
    if (x->replicas) {   /* one source per piece: some holders send nothing */
      const muon__holder *H = muon__holders_of(opt, x, NULL);
      for (j = 0; j < x->n_holders; j++) x->moves_out |= H[j].rank == H[j].source && H[j].source != x->owner;
      if (x->mine >= 0) x->my_source = H[x->mine].source;
    } else {
      x->moves_out = x->moves_back;
      if (x->mine >= 0) x->my_source = pl->me;
    }
  }
  if ((st = muon__plan_owned(opt)) != MUON_OK) return st;
  pl->round_start = (int *)muon__alloc(&opt->allocator, (size_t)(pl->n_globals + 1) * sizeof(int));
  pl->round_order = (int *)muon__alloc(&opt->allocator, (size_t)pl->n_globals * sizeof(int) + 1);
  {
    size_t *owned = (size_t *)muon__alloc(&opt->allocator, (size_t)P * (sizeof(size_t) + sizeof(int)));
    if (pl->round_start && pl->round_order && owned) muon__make_rounds(opt, owned, (int *)(void *)(owned + P));
    muon__free(&opt->allocator, owned);
    if (!pl->round_start || !pl->round_order || !owned)
      return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating rounds failed");
  }
  return MUON_OK;
}

/* 4. NS batches: per round, the matrices this rank owns, sorted so that same-shaped ones with the
   same Newton-Schulz settings sit next to each other in the gathered buffer. */
static muon_status muon__plan_ns_batches(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  int i;
  pl->order = (int *)muon__alloc(&opt->allocator, (size_t)pl->n_globals * sizeof(int) + 1);
  pl->order_start = (int *)muon__alloc(&opt->allocator, (size_t)(pl->n_rounds + 1) * sizeof(int));
  if (!pl->order || !pl->order_start)
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating the NS batches failed");
  i = muon__plan_batches(opt);
  if (muon__ns_many(opt) && i > 0) {
    pl->many_X = (float **)muon__alloc(&opt->allocator,
                                       (size_t)i * (sizeof(float *) + sizeof(muon_hparams *) + 2 * sizeof(int)));
    if (!pl->many_X) return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating the NS batches failed");
    pl->many_hp = (const muon_hparams **)(pl->many_X + i);
    pl->many_m = (int *)(pl->many_hp + i);
    pl->many_n = pl->many_m + i;
  }
  return MUON_OK;
}

/* 5. Buffers, sized for the largest round; nothing is allocated inside a step. */
static muon_status muon__plan_buffers(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, me = pl->me, r, i, g;
  for (r = 0; r < pl->n_rounds; r++) {
    muon__traffic t = muon__round_traffic(opt, r, me);
    size_t s = t.out_send > t.back_send ? t.out_send : t.back_send;
    size_t v = t.out_recv > t.back_recv ? t.out_recv : t.back_recv;
    if (s > pl->send_floats) pl->send_floats = s;
    if (v > pl->recv_floats) pl->recv_floats = v;
    if (t.gathered > pl->gathered_floats) pl->gathered_floats = t.gathered;
    if (t.ops > pl->ops_cap) pl->ops_cap = t.ops;
  }
  for (g = 0; g < pl->n_globals; g++) {
    const muon__global *x = &pl->globals[g];
    size_t full = (size_t)x->rows * x->cols;
    if (x->owner != me) continue;
    if (opt->dist.gather && 2 * full > pl->gathered_floats) pl->gathered_floats = 2 * full; /* full + operand */
    if (x->on_owner) {
      pl->globals[g].roff = pl->reduced_floats;
      pl->reduced_floats += full;
      if (full > pl->scratch_floats) pl->scratch_floats = full;
    }
  }
  for (i = 0, pl->stash_floats = 0; i < opt->n_matrices; i++) {
    opt->matrices[i].stash = pl->stash_floats;
    pl->stash_floats += opt->matrices[i].size;
  }
  pl->stage = opt->device && opt->comm.vt->memory == MUON_MEMORY_HOST &&
              (pl->send_floats || pl->recv_floats);
  pl->wire_bf16 = muon__wire_bf16(opt) && (pl->send_floats || pl->recv_floats);
  pl->stash = (float *)muon__compute_alloc(opt, pl->stash_floats * sizeof(float));
  pl->gathered = (float *)muon__compute_alloc(opt, pl->gathered_floats * sizeof(float));
  pl->ns_ws = muon__compute_alloc(opt, pl->ns_ws_bytes);
  if (pl->reduced_floats) {   /* only owners of Partial matrices */
    pl->reduced = (float *)muon__compute_alloc(opt, pl->reduced_floats * sizeof(float));
    pl->scratch = (float *)muon__compute_alloc(opt, pl->scratch_floats * sizeof(float));
  }
  pl->ops = (muon_piece_copy *)muon__alloc(&opt->allocator, (size_t)pl->ops_cap * sizeof(muon_piece_copy));
  pl->counts = (size_t *)muon__alloc(&opt->allocator, 9 * (size_t)P * sizeof(size_t));
  pl->out_flags = (int *)muon__compute_alloc(opt, (size_t)pl->n_globals * sizeof(int));
  pl->host_out = (int *)muon__alloc(&opt->allocator, (size_t)pl->n_globals * sizeof(int));
  pl->skip_at = (int *)muon__alloc(&opt->allocator, (size_t)P * sizeof(int));
  if (pl->skip_at) {   /* the most matrices a rank holds, one bit each: a per-rank list of every matrix
                          would be ranks x matrices (16,384 x 45,000 experts) */
    int most = 0, j;
    memset(pl->skip_at, 0, (size_t)P * sizeof(int));
    for (g = 0; g < pl->n_globals; g++)
      for (j = 0; j < pl->globals[g].n_holders; j++) {
        int *c = &pl->skip_at[pl->globals[g].holder_ranks[j]];
        if (++*c > most) most = *c;
      }
    pl->skip_bytes = ((size_t)most + 7) / 8;
    pl->out_skips = (unsigned char *)muon__alloc(&opt->allocator, (size_t)(P + 1) * pl->skip_bytes + 1);
  }
  pl->flags = (unsigned char *)muon__alloc(&opt->allocator, (size_t)(P + 1) * (size_t)(pl->max_local + 1));
  if (!pl->stash || !pl->gathered || !pl->ns_ws || !pl->ops || !pl->counts || !pl->flags ||
      (pl->reduced_floats && (!pl->reduced || !pl->scratch)) ||
      !pl->out_flags || !pl->host_out || !pl->skip_at || !pl->out_skips || muon__alloc_xfers(opt) != MUON_OK)
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating %zu bytes of exchange buffers failed",
                      (pl->stash_floats + pl->send_floats + pl->recv_floats + pl->gathered_floats + pl->reduced_floats +
                       pl->scratch_floats) *
                              sizeof(float) +
                          pl->ns_ws_bytes);
  if (opt->distributed) {
    opt->stats.rounds = pl->n_rounds;
    opt->stats.exchange_bytes = pl->stash_floats * sizeof(float) + muon__xfer_bytes(opt);
  }
  opt->stats.workspace_bytes =
      (pl->stash_floats + pl->gathered_floats + pl->reduced_floats + pl->scratch_floats) * sizeof(float) +
      pl->ns_ws_bytes + muon__xfer_bytes(opt);
  return MUON_OK;
}

/* Room for one global's holders in full: n of them (muon__holders_of). */
static muon_status muon__plan_room(muon_optimizer *opt, int n) {
  muon__plan *pl = &opt->plan;
  size_t mask = 1;
  while (mask < 2 * (size_t)n) mask <<= 1;
  pl->one_holders = (muon__holder *)muon__alloc(&opt->allocator, (size_t)n * sizeof(muon__holder) + 1);
  pl->one_pieces = (muon__piece *)muon__alloc(&opt->allocator, (size_t)n * sizeof(muon__piece) + 1);
  pl->one_first = (int *)muon__alloc(&opt->allocator, (3 * (size_t)n + mask) * sizeof(int) + 1);
  if (!pl->one_holders || !pl->one_pieces || !pl->one_first)
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating room for %d holders failed", n);
  pl->one_pairs = pl->one_first + n;
  pl->one_table = pl->one_pairs + 2 * (size_t)n;
  return MUON_OK;
}

/* The plan from every rank's list (count[r] entries each; their layout tables already in the
   plan's pool, muon__plan_layouts). */
static muon_status muon__build_plan(muon_optimizer *opt, const muon__lists *w, const int *count) {
  muon__plan *pl = &opt->plan;
  int i, g, c, n_classes = 0, most = 1;
  int *gid = NULL, *base = NULL;   /* per class entry its global; class c's entries from base[c] */
  muon_status st;
  if ((st = muon__plan_classes(opt, w, &n_classes)) != MUON_OK) return st;
  base = (int *)muon__alloc(&opt->allocator, ((size_t)n_classes + 1) * sizeof(int));
  if (!base) return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating the global matrix list failed");
  for (c = 0, base[0] = 0; c < n_classes; c++) base[c + 1] = base[c] + count[pl->class_members[pl->class_start[c]]];
  gid = (int *)muon__alloc(&opt->allocator, (size_t)base[n_classes] * sizeof(int) + 1);
  if (!gid) st = muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating the global matrix list failed");
  if (st == MUON_OK) st = muon__plan_globals(opt, w, count, n_classes, base, gid);
  if (st == MUON_OK) st = muon__plan_listings(opt, w, count, n_classes, base, gid);
  muon__free(&opt->allocator, gid);
  muon__free(&opt->allocator, base);
  for (g = 0; st == MUON_OK && g < pl->n_globals; g++) {   /* the most ranks that list one global */
    const muon__global *x = &pl->globals[g];
    int k, n = 0;
    for (k = 0; k < x->n_listings; k++) {
      c = pl->listings[x->listing + k].cls;
      n += pl->class_start[c + 1] - pl->class_start[c];
    }
    most = MUON__MAX(most, n);
  }
  if (st == MUON_OK) st = muon__plan_room(opt, most);
  for (g = 0; st == MUON_OK && g < pl->n_globals; g++) st = muon__plan_holders(opt, w, g);
  if (st != MUON_OK) return st;
  for (i = 0; i < opt->n_matrices; i++) opt->matrices[i].global = -1;
  for (g = 0; g < pl->n_globals; g++)
    if (pl->globals[g].local >= 0) opt->matrices[pl->globals[g].local].global = g;
  if ((st = muon__plan_owners(opt)) != MUON_OK || (st = muon__plan_ns_batches(opt)) != MUON_OK) return st;
  return muon__plan_buffers(opt);
}

/* A plan fingerprint: owners and rounds, hashed; ranks compare them to prove agreement. */
static unsigned long long muon__plan_hash(const muon__plan *pl) {
  unsigned long long h = MUON__FNV_START;
  int g;
  for (g = 0; g < pl->n_globals; g++) {
    h = (h ^ (unsigned long long)pl->globals[g].owner) * 1099511628211ull;
    h = (h ^ (unsigned long long)pl->globals[g].round) * 1099511628211ull;
    h = (h ^ (unsigned long long)pl->globals[g].rows) * 1099511628211ull;
  }
  return (h ^ (unsigned long long)pl->n_globals) * 1099511628211ull;
}

/* alltoallv displacements from counts. */
static void muon__prefix(size_t *displs, const size_t *counts, int P) {
  int p;
  size_t at = 0;
  for (p = 0; p < P; p++) { displs[p] = at; at += counts[p]; }
}

/* NorMuon's second moment v: one float per row (or column) of a matrix, kept by its owner only
   (muon__matrix.normuon). Planning places it: the owner keeps its v, takes it from the holder
   that had it (the previous owner, or a loaded checkpoint), or starts it at zero. */
/* ---- >>impl-normuon NorMuon second moments: owner state that moves when owners change -------- */
/* The length of v (0: NorMuon off), and whether its statistics run along the columns of the NS
   operand (the transpose when rows > cols): one decision, so length and axis cannot disagree. */
static int muon__normuon_axis(const muon_hparams *hp, int rows, int cols, int *per_column) {
  int per_row = hp->normuon == MUON_NORMUON_ROWS || rows >= cols;   /* of the matrix itself */
  if (per_column) *per_column = per_row ? rows > cols : 1;
  if (hp->normuon == MUON_NORMUON_OFF) return 0;
  return per_row ? rows : cols;
}
static int muon__normuon_len(const muon_hparams *hp, int rows, int cols) {
  return muon__normuon_axis(hp, rows, cols, NULL);
}

static void muon__normuon_drop_next(muon_optimizer *opt) {
  int i;
  for (i = 0; i < opt->n_matrices; i++) {
    muon__compute_free(opt, opt->matrices[i].normuon_next);
    opt->matrices[i].normuon_next = NULL;
    opt->matrices[i].normuon_next_len = 0;
  }
}

/* Room for a v of len floats in normuon_next (planning's or a load's), uninitialised. */
static muon_status muon__normuon_room(muon_optimizer *opt, muon__matrix *x, int len, const char *op) {
  if (x->normuon_next && x->normuon_next_len == len) return MUON_OK;
  muon__compute_free(opt, x->normuon_next);
  x->normuon_next_len = 0;
  if (!(x->normuon_next = (float *)muon__compute_alloc(opt, 2 * (size_t)len * sizeof(float))))
    return muon__fail(opt, MUON_ERR_NOMEM, "%s: allocating the NorMuon second moment of '%s' (%d floats) failed", op,
                      x->name, len);
  x->normuon_next_len = len;
  return MUON_OK;
}

/* normuon_next becomes x's v. */
static void muon__normuon_take(muon_optimizer *opt, muon__matrix *x) {
  muon__compute_free(opt, x->normuon);
  x->normuon = x->normuon_next;
  x->normuon_len = x->normuon_next_len;
  x->normuon_next = NULL;
  x->normuon_next_len = 0;
}

static void muon__normuon_free(muon_optimizer *opt, muon__matrix *x) {
  muon__compute_free(opt, x->normuon);
  x->normuon = NULL;
  x->normuon_len = 0;
}

/* The state loaded has no v for x: x keeps none either (a zeroed one of the old length would be
   saved for a group that may now want another, or none), and the next step re-plans, which gives
   an owner whose group wants one a v from zero. */
static void muon__normuon_drop(muon_optimizer *opt, muon__matrix *x) {
  if (!x->normuon) return;
  muon__normuon_free(opt, x);
  opt->plan.ready = 0;
}

/* After a load: every v placed in normuon_next is taken; all that is left was loaded. */
static void muon__normuon_finish_load(muon_optimizer *opt) {
  int i;
  for (i = 0; i < opt->n_matrices; i++) {
    if (opt->matrices[i].normuon_next) muon__normuon_take(opt, &opt->matrices[i]);
    opt->matrices[i].normuon_fresh = 0;
  }
}

/* x's v is this step's: x is registered here, this rank owns it, and its v has the length its
   group wants (what muon__normuon_apply runs on and the commit keeps). */
static int muon__normuon_owned(const muon_optimizer *opt, const muon__matrix *x) {
  return x->normuon && x->global >= 0 && opt->plan.globals[x->global].owner == opt->plan.me &&
         x->normuon_len == muon__normuon_len(&opt->groups[x->group], x->rows, x->cols);
}

/* A zeroed v for every matrix this rank owns that lacks one of the right length. */
static muon_status muon__normuon_prepare(muon_optimizer *opt) {
  int i;
  muon_status st = MUON_OK;
  for (i = 0; i < opt->n_matrices && st == MUON_OK; i++) {
    muon__matrix *x = &opt->matrices[i];
    int want = muon__normuon_len(&opt->groups[x->group], x->rows, x->cols);
    if (!want || x->global < 0 || opt->plan.globals[x->global].owner != opt->plan.me ||
        (x->normuon && x->normuon_len == want))
      continue;
    if ((st = muon__normuon_room(opt, x, want, "muon_plan")) == MUON_OK)
      st = muon__compute_zero(opt, x->normuon_next, 2 * (size_t)want * sizeof(float),
                              "muon_plan: zeroing a NorMuon second moment");
  }
  if (st != MUON_OK) muon__normuon_drop_next(opt);
  return st;
}

/* The placed v become the matrices' own; holders that are not owners drop theirs. `moved`: per
   matrix, v came from another rank (else a fresh one starts at zero, said after a first step). */
static void muon__normuon_finish(muon_optimizer *opt, const unsigned char *moved) {
  int i;
  for (i = 0; i < opt->n_matrices; i++) {
    muon__matrix *x = &opt->matrices[i];
    int owner = x->global >= 0 && opt->plan.globals[x->global].owner == opt->plan.me;
    if (x->normuon_next) {
      if (opt->stats.steps > 0 && !(moved && moved[i])) {
        char msg[200];
        snprintf(
            msg, sizeof msg,
            "NorMuon second moment of matrix '%s' starts at zero at step %lld (NorMuon turned on, or a state saved without it)",
            x->name, opt->stats.steps);
        muon__log(&opt->logger, MUON_LOG_WARN, msg);
      }
      muon__normuon_take(opt, x);
      x->normuon_fresh = !(moved && moved[i]);
    } else if (x->normuon && (!owner || !muon__normuon_len(&opt->groups[x->group], x->rows, x->cols))) {
      muon__normuon_free(opt, x);
    }
  }
}

/* Where global g's v comes from when its owner lacks it: the first holder (ascending rank) that
   has one of the wanted length; -1 if the owner has it, none wants it, or nobody has it. */
static int muon__normuon_source(const muon__plan *pl, int g, const muon__lists *w, int *len) {
  const muon__global *x = &pl->globals[g];
  const muon__entry *o = NULL, *e;
  int j;
  for (j = 0; j < x->n_holders; j++)
    if (x->holder_ranks[j] == x->owner) o = muon__entry_at(w, x->owner, muon__holder_at(pl, x, j).local);
  if (!o || !o->normuon_want || o->normuon_have == o->normuon_want) return -1;
  *len = o->normuon_want;
  for (j = 0; j < x->n_holders; j++) {
    e = muon__entry_at(w, x->holder_ranks[j], muon__holder_at(pl, x, j).local);
    if (e->normuon_have == o->normuon_want) return x->holder_ranks[j];
  }
  return -1;
}

/* The counts of the exchange that moves v to new owners (pl->counts); 0 if nothing moves. */
static int muon__normuon_counts(muon_optimizer *opt, const muon__lists *w) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, me = pl->me, g, src, len = 0, any = 0;
  size_t *cnt = pl->counts;
  memset(cnt, 0, 4 * (size_t)P * sizeof(size_t));
  for (g = 0; g < pl->n_globals; g++) {
    if ((src = muon__normuon_source(pl, g, w, &len)) < 0) continue;
    any = 1;
    if (src == me) cnt[pl->globals[g].owner] += (size_t)len;
    if (pl->globals[g].owner == me) cnt[2 * (size_t)P + src] += (size_t)len;
  }
  muon__prefix(cnt + P, cnt, P);
  muon__prefix(cnt + 3 * (size_t)P, cnt + 2 * (size_t)P, P);
  return any;
}

/* The buffers of that exchange, in the communicator's memory: allocated before the plans are
   compared, so that a rank short of memory fails with all the others. */
static int muon__normuon_staged(const muon_optimizer *opt) {
  return opt->device && opt->comm.vt->memory == MUON_MEMORY_HOST;
}

static muon_status muon__normuon_buffers(muon_optimizer *opt, float **send, float **recv) {
  size_t *c = opt->plan.counts;
  int P = opt->plan.P, staged = muon__normuon_staged(opt);
  size_t ns = (c[2 * P - 1] + c[P - 1] + 1) * sizeof(float), nr = (c[4 * P - 1] + c[3 * P - 1] + 1) * sizeof(float);
  *send = (float *)(staged ? muon__compute_alloc_host(opt, ns) : muon__compute_alloc(opt, ns));
  *recv = (float *)(staged ? muon__compute_alloc_host(opt, nr) : muon__compute_alloc(opt, nr));
  if (*send && *recv) return MUON_OK;
  return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating %zu bytes to move NorMuon second moments failed",
                    ns + nr);
}

static void muon__normuon_free_buffers(muon_optimizer *opt, float *send, float *recv) {
  if (muon__normuon_staged(opt)) { muon__compute_free_host(opt, send); muon__compute_free_host(opt, recv); }
  else { muon__compute_free(opt, send); muon__compute_free(opt, recv); }
}

/* The move itself: sources pack in global order, the collective, owners unpack into their new
   v. A backend failure still joins the collective (peers must not wait alone). */
static muon_status muon__normuon_move(muon_optimizer *opt, const muon__lists *w, float *send, float *recv,
                                      unsigned char *moved) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, me = pl->me, g, src, len = 0, staged = muon__normuon_staged(opt);
  size_t *cnt = pl->counts, *cur = pl->counts + 8 * (size_t)P;
  muon_status st = MUON_OK, local = MUON_OK;
  memcpy(cur, cnt + P, (size_t)P * sizeof(size_t));
  for (g = 0; g < pl->n_globals && local == MUON_OK; g++) {
    const muon__global *x = &pl->globals[g];
    if ((src = muon__normuon_source(pl, g, w, &len)) != me) continue;
    local = muon__compute_copy(opt, send + cur[x->owner], opt->matrices[x->local].normuon, (size_t)len * sizeof(float),
                               staged, 0, "muon_plan: reading a NorMuon second moment");
    cur[x->owner] += (size_t)len;
  }
  if (local == MUON_OK && staged) local = muon__sync(opt, "muon_plan: reading NorMuon second moments");
  if ((st = muon__alltoallv(opt, send, recv, cnt, 0, "muon_plan: moving NorMuon second moments")) != MUON_OK) return st;
  memcpy(cur, cnt + 3 * (size_t)P, (size_t)P * sizeof(size_t));
  for (g = 0; g < pl->n_globals && local == MUON_OK; g++) {
    const muon__global *x = &pl->globals[g];
    if ((src = muon__normuon_source(pl, g, w, &len)) < 0 || x->owner != me) continue;
    local = muon__compute_copy(opt, opt->matrices[x->local].normuon_next, recv + cur[src], (size_t)len * sizeof(float),
                               0, staged, "muon_plan: writing a NorMuon second moment");
    cur[src] += (size_t)len;
    moved[x->local] = 1;
  }
  if ((st = muon__comm_finish(opt, "muon_plan: moving NorMuon second moments")) != MUON_OK) return st;
  if (local == MUON_OK) local = muon__sync(opt, "muon_plan: writing NorMuon second moments");
  return local;
}

/* ---- >>impl-partial Partial matrices: the whole momentum on the owner alone ------------------ */
static void muon__partial_drop(muon_optimizer *opt, muon__matrix *x) {
  muon__state_free(opt, x->momentum);
  opt->stats.state_bytes -= muon__mom_bytes(x, x->momentum_size);
  x->momentum = NULL;
  x->momentum_size = 0;
  x->momentum_fresh = 0;
}

/* A Partial matrix's momentum: zeros for an owner without one (fresh: not state until a step
   moves it), allocated before the plans are compared so that a rank short of memory fails with
   all the others; once the plan stands, holders that are not the owner drop theirs. */
static int muon__owns(const muon_optimizer *opt, const muon__matrix *x) {
  return x->global >= 0 && opt->plan.globals[x->global].owner == opt->plan.me;
}

/* A zeroed whole momentum for x, unless it has one. */
static muon_status muon__partial_room(muon_optimizer *opt, muon__matrix *x, const char *op) {
  size_t full = (size_t)x->rows * x->cols;
  muon_status st;
  char what[160];
  if (x->momentum) return MUON_OK;
  if (!(x->momentum = (float *)muon__state_alloc(opt, muon__mom_bytes(x, full))))
    return muon__fail(opt, MUON_ERR_NOMEM, "%s: allocating the momentum of Partial matrix '%s' (%d x %d) failed", op,
                      x->name, x->rows, x->cols);
  x->momentum_size = full;
  x->momentum_fresh = 1;
  opt->stats.state_bytes += muon__mom_bytes(x, full);
  snprintf(what, sizeof what, "%s: zeroing a momentum", op);
  if ((st = muon__state_zero(opt, x->momentum, muon__mom_bytes(x, full), what)) != MUON_OK)
    muon__partial_drop(opt, x);
  return st;
}

static muon_status muon__partial_prepare(muon_optimizer *opt) {
  int i;
  muon_status st;
  for (i = 0; i < opt->n_matrices; i++)
    if (muon__owner_momentum(&opt->matrices[i]) && muon__owns(opt, &opt->matrices[i]) &&
        (st = muon__partial_room(opt, &opt->matrices[i], "muon_plan")) != MUON_OK)
      return st;
  return MUON_OK;
}

static void muon__partial_finish(muon_optimizer *opt) {
  int i;
  for (i = 0; i < opt->n_matrices; i++)
    if (muon__owner_momentum(&opt->matrices[i]) && opt->matrices[i].momentum && !muon__owns(opt, &opt->matrices[i]))
      muon__partial_drop(opt, &opt->matrices[i]);
}

/* ---- Partial AdamW params (ZeRO-1) ---------------------------------------------------------
   Each rank of a Partial AdamW param's groups holds the same piece and its own part of the
   gradient. Per step: a reduce-scatter (chunk k of every part to part k's rank, summed there in
   part order), AdamW on each rank's chunk into scratch, an all-gather of the new chunks; the
   commit then writes parameters and moments. Every rank joins both collectives. */
typedef struct muon__adamw_entry {   /* a registered AdamW param on the wire: which part of what */
  uint64_t name_hash, offset, size, full_size;
  int64_t replica;
  int32_t parts, part;
  float part_scale;
  int32_t unused;
} muon__adamw_entry;

static int muon__adamw_partials(const muon_optimizer *opt) {
  int i, n = 0;
  for (i = 0; i < opt->n_adamw; i++) n += opt->adamw[i].parts > 1;
  return n;
}

static void muon__adamw_entries(const muon_optimizer *opt, muon__adamw_entry *e, int stride) {
  int i;
  memset(e, 0, (size_t)stride * sizeof *e);
  for (i = 0; i < opt->n_adamw; i++) {
    const muon__adamw *a = &opt->adamw[i];
    e[i].name_hash = a->name_hash; e[i].offset = a->offset; e[i].size = a->size; e[i].full_size = a->full_size;
    e[i].replica = a->replica; e[i].parts = a->parts; e[i].part = a->part; e[i].part_scale = a->part_scale;
  }
}

static int muon__aw_before(const muon__adamw *a, const muon__adamw *b) {
  return a->name_hash != b->name_hash ? a->name_hash < b->name_hash : a->offset < b->offset;
}

/* Who holds each part of every local Partial AdamW param (every part exactly once), and the
   step's buffers. */
static muon_status muon__plan_adamw(muon_optimizer *opt, const muon__adamw_entry *all, int stride) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, i, r, j, k, at = 0, n = 0;
  size_t need = 0;
  for (i = 0; i < opt->n_adamw; i++) at += opt->adamw[i].parts > 1 ? opt->adamw[i].parts : 0;
  pl->n_aw = muon__adamw_partials(opt);
  pl->adamw_members = (int *)muon__alloc(&opt->allocator, (size_t)at * sizeof(int) + 1);
  pl->aw_order = (int *)muon__alloc(&opt->allocator, (size_t)pl->n_aw * sizeof(int) + 1);
  pl->aw.cnt = (size_t *)muon__alloc(&opt->allocator, 8 * (size_t)P * sizeof(size_t));
  if (!pl->adamw_members || !pl->aw_order || !pl->aw.cnt)
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating the Partial AdamW lists failed");
  pl->aw.wire = pl->aw.cnt + 4 * (size_t)P;
  for (i = 0, at = 0; i < opt->n_adamw; i++) {
    muon__adamw *a = &opt->adamw[i];
    int *m = pl->adamw_members + at;
    size_t c = a->hi - a->lo;
    if (a->parts == 1) continue;
    pl->aw_order[n++] = i;
    a->members = at;
    at += a->parts;
    for (k = 0; k < a->parts; k++) m[k] = -1;
    for (r = 0; r < P; r++)
      for (j = 0; j < stride; j++) {
        const muon__adamw_entry *e = &all[(size_t)r * stride + j];
        if (e->name_hash != a->name_hash || e->offset != a->offset || e->size != a->size ||
            e->full_size != a->full_size || e->replica != a->replica)
          continue;
        if (e->parts != a->parts || e->part_scale != a->part_scale)
          return muon__fail(
              opt, MUON_ERR_MISMATCH,
              "muon_plan: AdamW param '%s': rank %d registers it with %d Partial parts (%s), rank %d with %d (%s): every holder must describe the same PARTIAL levels",
              a->name, pl->me, a->parts, a->part_scale == 1.0f ? "sum" : "mean", r, e->parts,
              e->part_scale == 1.0f ? "sum" : "mean");
        if (m[e->part] >= 0)
          return muon__fail(
              opt, MUON_ERR_SHAPE,
              "muon_plan: AdamW param '%s': ranks %d and %d both hold its part %d (one rank per part; replicas of the parts need REPLICATE levels that tell them apart)",
              a->name, m[e->part], r, e->part);
        m[e->part] = r;
      }
    for (k = 0; k < a->parts; k++)
      if (m[k] < 0)
        return muon__fail(opt, MUON_ERR_SHAPE, "muon_plan: AdamW param '%s': no rank holds its part %d of %d", a->name,
                          k, a->parts);
    a->roff = pl->aw_chunks;
    a->foff = pl->aw_total;
    pl->aw_chunks += c;
    pl->aw_total += a->size;
    need += a->size - c > (size_t)(a->parts - 1) * c ? a->size - c : (size_t)(a->parts - 1) * c;
  }
  for (i = 1; i < pl->n_aw; i++)   /* (name, offset) order: the same on every rank */
    for (k = i; k > 0 && muon__aw_before(&opt->adamw[pl->aw_order[k]], &opt->adamw[pl->aw_order[k - 1]]); k--) {
      int t = pl->aw_order[k]; pl->aw_order[k] = pl->aw_order[k - 1]; pl->aw_order[k - 1] = t;
    }
  pl->aw_floats = need;
  if (opt->device && opt->comm.vt->memory == MUON_MEMORY_HOST) pl->stage = 1;
  pl->aw.send = (float *)muon__compute_alloc(opt, need * sizeof(float));
  pl->aw.recv = (float *)muon__compute_alloc(opt, need * sizeof(float));
  pl->aw_reduced = (float *)muon__compute_alloc(opt, pl->aw_chunks * sizeof(float));
  pl->aw_param = (float *)muon__compute_alloc(opt, pl->aw_chunks * sizeof(float));
  pl->aw_m = (float *)muon__compute_alloc(opt, pl->aw_chunks * sizeof(float));
  pl->aw_v = (float *)muon__compute_alloc(opt, pl->aw_chunks * sizeof(float));
  pl->aw_full = (float *)muon__compute_alloc(opt, pl->aw_total * sizeof(float));
  pl->aw_flags = (int *)muon__compute_alloc(opt, (size_t)pl->n_aw * sizeof(int));
  pl->aw_host_flags = (int *)muon__alloc(&opt->allocator, (size_t)pl->n_aw * sizeof(int) + 1);
  if (pl->stage) {
    pl->aw.host_send = (float *)muon__compute_alloc_host(opt, need * sizeof(float));
    pl->aw.host_recv = (float *)muon__compute_alloc_host(opt, need * sizeof(float));
  }
  if (!pl->aw.send || !pl->aw.recv || !pl->aw_reduced || !pl->aw_param || !pl->aw_m || !pl->aw_v || !pl->aw_full ||
      !pl->aw_flags || !pl->aw_host_flags || (pl->stage && (!pl->aw.host_send || !pl->aw.host_recv)))
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating %zu bytes for the Partial AdamW params failed",
                      (2 * need + 4 * pl->aw_chunks + pl->aw_total) * sizeof(float));
  return MUON_OK;
}

/* Room for muon__check_commit: flags for every chunk of every local item (MUON__CHECKS each:
   momentum or m, v, parameter, bf16 mirror; a matrix's fourth is its NorMuon v), and one chunk of
   scratch per buffer the commit writes (3 fp32, 2 bf16). */
#define MUON__CHECKS 4
#ifndef MUON__CHECK_CHUNK
#define MUON__CHECK_CHUNK ((size_t)1 << 20)
#endif
static size_t muon__check_count(size_t n, size_t *chunk) {
  if (MUON__MIN(n, MUON__CHECK_CHUNK) > *chunk) *chunk = MUON__MIN(n, MUON__CHECK_CHUNK);
  return MUON__CHECKS * (n ? (n + MUON__CHECK_CHUNK - 1) / MUON__CHECK_CHUNK : 1);
}
static muon_status muon__plan_checks(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  size_t n = 0, chunk = 0;
  int i;
  for (i = 0; i < opt->n_matrices; i++) {
    muon__matrix *x = &opt->matrices[i];
    size_t full = (size_t)x->rows * x->cols;
    x->check = n;
    x->checks = muon__check_count(muon__owner_momentum(x) && muon__owns(opt, x) && full > x->size ? full : x->size, &chunk);
    n += x->checks;
  }
  for (i = 0; i < opt->n_adamw; i++) {
    muon__adamw *p = &opt->adamw[i];
    p->check = n;
    p->checks = muon__check_count(p->size, &chunk);
    n += p->checks;
  }
  for (i = 0; i < opt->n_matrices; i++)   /* an 8-bit momentum's chunks are whole blocks */
    if (opt->matrices[i].mfmt == MUON_MOMENTUM_INT8) chunk = (chunk + MUON_Q8_BLOCK - 1) / MUON_Q8_BLOCK * MUON_Q8_BLOCK;
  pl->n_checks = n;
  pl->check_chunk = chunk;
  pl->checks = (int *)muon__compute_alloc(opt, n * sizeof(int));
  pl->host_checks = (int *)muon__alloc(&opt->allocator, n * sizeof(int) + 1);
  pl->check_ws = muon__compute_alloc(opt, chunk * (3 * sizeof(float) + 2 * sizeof(uint16_t)));
  if (!pl->checks || !pl->host_checks || !pl->check_ws)
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating %zu bytes for the commit checks failed",
                      n * sizeof(int) + chunk * (3 * sizeof(float) + 2 * sizeof(uint16_t)));
  opt->stats.workspace_bytes += n * sizeof(int) + chunk * (3 * sizeof(float) + 2 * sizeof(uint16_t));
  return MUON_OK;
}

/* ---- >>impl-plan-run Planning: one device, and every rank together --------------------------- */
/* A fresh run identity: not a secret, only unlikely to repeat (the clock, where this optimizer
   and this thread's stack lie; no shared counter, so threads may call it at once). Never 0. */
static uint64_t muon__new_run(const muon_optimizer *opt) {
  unsigned char b[8 * 4], *p = b;
  time_t now = time(NULL);
  clock_t c = clock();
  uint64_t h;
  muon__put64(&p, (uint64_t)now);
  muon__put64(&p, (uint64_t)c);
  muon__put64(&p, (uint64_t)(size_t)opt);
  muon__put64(&p, (uint64_t)(size_t)&h);
  h = muon__fnv1a(b, sizeof b);
  return h ? h : 1;
}

/* Without a dist config each rank is a world of its own: every matrix it holds is a global
   one that it owns, and the step runs the same rounds with nothing to exchange. */
static muon_status muon__plan_local(muon_optimizer *opt) {
  int i, n = opt->n_matrices;
  unsigned char *bytes;
  muon__entry *e;
  muon__lists w;
  size_t at[2];
  int zero = 0;   /* one rank, its own class */
  muon_status st;
  muon__plan_free(opt);
  opt->plan.P = 1;
  opt->plan.me = 0;
  opt->plan.max_local = n;
  muon__lists_init(&w);
  w.max_local = n;
  w.max_layouts = 1;   /* one, of no levels (a record of zeros): every matrix whole */
  w.max_table = 4;
  w.slice = (size_t)n * MUON__LISTED;
  w.stride = muon__list_bytes(&w);
  bytes = (unsigned char *)muon__alloc(&opt->allocator, w.stride + 8);
  if (!bytes) return muon__fail(opt, MUON_ERR_NOMEM, "muon_step: allocating the matrix list failed");
  memset(bytes, 0, w.stride + 8);
  w.bytes = bytes;
  w.classes = bytes + 8;   /* the list, after the table, its entries aligned */
  at[0] = 0;
  at[1] = (size_t)n * sizeof(muon__entry);
  w.entry_at = &at[0];
  w.name_at = &at[1];
  w.lead = w.member = &zero;
  e = (muon__entry *)(void *)w.classes;
  for (i = 0; i < n; i++) {
    const muon__matrix *x = &opt->matrices[i];
    char id[24];
    snprintf(id, sizeof id, "#%d", i);   /* one device: names need not be unique, so match by index */
    muon__wire_name(opt, i, (char *)w.classes + at[1] + (size_t)i * MUON__NAME);
    e[i].name_hash = muon__name_hash(id, -1);
    e[i].rows = x->rows;
    e[i].cols = x->cols;
    e[i].hparams = muon__ns_hash(&opt->groups[x->group]);
  }
  st = muon__plan_layouts(opt, &w);
  if (st == MUON_OK) st = muon__build_plan(opt, &w, &n);
  muon__free(&opt->allocator, bytes);
  if (st == MUON_OK) st = muon__normuon_prepare(opt);
  if (st == MUON_OK) st = muon__plan_checks(opt);
  if (st != MUON_OK) muon__plan_free(opt);
  else { muon__normuon_finish(opt, NULL); opt->plan.ready = 1; muon__log_plan(opt); }
  return st;
}

/* A layout's levels as a fixed record (the key left out: it is the entry's), to tell a rank's
   distinct layouts apart. */
static void muon__put_levels(unsigned char *rec, const muon_layout *layout) {
  muon_layout l = *layout;
  l.key = 0;
  muon__put_layout(&rec, &l);
}

/* This rank's distinct layouts (their levels: the key is the entry's): each matrix's slot,
   numbered in order of first use; returns how many, or -1 short of memory. */
static int muon__layout_slots(muon_optimizer *opt) {
  int n = opt->n_matrices, i, j, slots = 0;
  size_t mask = 1, at, R = MUON__LAYOUT_RECORD;
  int *tab;
  unsigned char *rec;
  while (mask < 2 * (size_t)n) mask <<= 1;
  tab = (int *)muon__alloc(&opt->allocator, mask * sizeof(int));
  rec = (unsigned char *)muon__alloc(&opt->allocator, (size_t)n * R + 1);
  if (!tab || !rec) {
    muon__free(&opt->allocator, tab);
    muon__free(&opt->allocator, rec);
    return -1;
  }
  memset(tab, 0xff, mask * sizeof(int));
  mask--;
  for (i = 0; i < n; i++) {
    muon__matrix *x = &opt->matrices[i];
    muon__put_levels(rec + (size_t)i * R, &x->layout);
    for (at = (size_t)muon__fnv1a(rec + (size_t)i * R, R) & mask; (j = tab[at]) >= 0; at = (at + 1) & mask)
      if (!memcmp(rec + (size_t)j * R, rec + (size_t)i * R, R)) break;
    if (j < 0) { tab[at] = i; x->slot = slots++; }
    else x->slot = opt->matrices[j].slot;
  }
  muon__free(&opt->allocator, tab);
  muon__free(&opt->allocator, rec);
  return slots;
}

/* Matrix i's entry as planning sends it (after muon__layout_slots). */
static void muon__put_entry(const muon_optimizer *opt, int i, muon__entry *e) {
  const muon__matrix *x = &opt->matrices[i];
  memset(e, 0, sizeof *e);
  e->name_hash = x->name_hash;
  e->key = x->layout.key;
  e->rows = x->rows;
  e->cols = x->cols;
  e->layout = x->slot;
  e->hparams = muon__ns_hash(&opt->groups[x->group]);
  e->normuon_have = x->normuon ? x->normuon_len : 0;
  e->normuon_want = muon__normuon_len(&opt->groups[x->group], x->rows, x->cols);
  e->flags = (muon__owner_momentum(x) && x->momentum && !x->momentum_fresh ? MUON__HAS_MOMENTUM : 0) |
             (muon__owner_momentum(x) ? MUON__ON_OWNER : 0);
}
/* Byte `at` of this rank's list (its entries, then their names): what its class shares. */
static unsigned char muon__listed_byte(const muon_optimizer *opt, size_t at, muon__entry *e, char *name, int *cached) {
  size_t entries = (size_t)opt->n_matrices * sizeof(muon__entry);
  int i = at < entries ? (int)(at / sizeof(muon__entry)) : opt->n_matrices + (int)((at - entries) / MUON__NAME);
  if (i != *cached) {
    if (i < opt->n_matrices) muon__put_entry(opt, i, e);
    else muon__wire_name(opt, i - opt->n_matrices, name);
    *cached = i;
  }
  return at < entries ? ((const unsigned char *)e)[at % sizeof(muon__entry)] : (unsigned char)name[(at - entries) % MUON__NAME];
}
static uint64_t muon__list_digest(const muon_optimizer *opt) {
  uint64_t h = MUON__FNV_START;
  char name[MUON__NAME];
  muon__entry e;
  int i;
  for (i = 0; i < opt->n_matrices; i++) {
    muon__put_entry(opt, i, &e);
    h = muon__fnv1a_more(h, (const unsigned char *)&e, sizeof e);
  }
  for (i = 0; i < opt->n_matrices; i++) {
    muon__wire_name(opt, i, name);
    h = muon__fnv1a_more(h, (const unsigned char *)name, sizeof name);
  }
  return h;
}

/* The bytes of this rank's layout table (after muon__layout_slots). */
static size_t muon__table_bytes(const muon_optimizer *opt) {
  size_t b = 0;
  int i, written = 0;
  for (i = 0; i < opt->n_matrices; i++)
    if (opt->matrices[i].slot == written) { b += muon__table_record_bytes(&opt->matrices[i].layout); written++; }
  return b;
}

/* Rank me's list as planning sends it, in w's geometry (muon__list_geometry): its layout table
   (after muon__layout_slots) and its slice of its class's list. */
static void muon__put_list(const muon_optimizer *opt, unsigned char *out, const muon__lists *w, int me) {
  unsigned char *slice = out + w->max_table, *table = out;
  size_t from = (size_t)w->member[me] * w->slice, at;
  int i, written = 0, cached = -1;
  muon__entry e;
  char name[MUON__NAME];
  memset(out, 0, w->stride);
  for (i = 0; i < opt->n_matrices; i++)
    if (opt->matrices[i].slot == written) { muon__put_table_record(&table, &opt->matrices[i].layout); written++; }
  for (at = from; at < from + w->slice && at < (size_t)opt->n_matrices * MUON__LISTED; at++)
    slice[at - from] = muon__listed_byte(opt, at, &e, name, &cached);
}

/* What the gathered lists say: every class's list assembled and every layout table in the plan's
   pool; then the raw lists, planning's largest buffer, are freed. */
static muon_status muon__read_lists(muon_optimizer *opt, muon__lists *w, const int *count, unsigned char **all) {
  muon_status st = muon__gather_classes(opt, w, count);
  if (st == MUON_OK) st = muon__plan_layouts(opt, w);
  muon__free(&opt->allocator, *all);
  *all = NULL;
  w->bytes = NULL;
  return st;
}

/* Whether every rank could allocate what the list exchange and the plan's lists need. */
static muon_status muon__agree_allocations(muon_optimizer *opt, muon_status got) {
  const long long *all;
  muon_status st;
  int r, P = opt->comm.size;
  if ((st = muon__exchange3(opt, got, 0, 0, &all, "muon_plan: exchanging allocation verdicts")) != MUON_OK) return st;
  for (r = 0; r < P; r++)
    if (all[3 * r] != MUON_OK)
      return r == opt->comm.rank
                 ? muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating the matrix lists of %d ranks failed", P)
                 : muon__fail(opt, (muon_status)all[3 * r], "muon_plan: rank %d could not allocate its matrix lists", r);
  return MUON_OK;
}

/* Every rank's verdict on its plan, and the plan's fingerprint: one rank's failure is everyone's,
   and a plan some rank computed differently (an assign that is not deterministic) is refused. */
static muon_status muon__compare_plans(muon_optimizer *opt, muon_status got) {
  long long hash = got == MUON_OK ? (long long)muon__plan_hash(&opt->plan) : 0;
  const long long *all;
  muon_status st;
  int r;
  if ((st = muon__exchange3(opt, got, hash, 0, &all, "muon_plan: comparing plans")) != MUON_OK) return st;
  if (got != MUON_OK) return got;
  for (r = 0; r < opt->comm.size; r++) {
    if (all[3 * r] != MUON_OK)
      return muon__fail(opt, (muon_status)all[3 * r], "muon_plan: rank %d failed to plan (%s); see its message", r,
                        muon_status_string((muon_status)all[3 * r]));
    if (all[3 * r + 1] != hash)
      return muon__fail(
          opt, MUON_ERR_ASSIGN,
          "muon_plan: ranks %d and %d computed different owners or rounds (is muon_dist_config.assign deterministic?)",
          opt->comm.rank, r);
  }
  return MUON_OK;
}

/* Distributed planning proper: every rank enters it together (see muon__agree). */
static muon_status muon__plan_collective(muon_optimizer *opt) {
  int P, me, r, layouts, geometry = -1, *count = NULL, moving = 0;
  long long mine[MUON__COUNTS];
  muon__lists w;
  unsigned char *all = NULL;
  float *nm_send = NULL, *nm_recv = NULL;   /* moving NorMuon second moments to new owners */
  unsigned char *moved = NULL;
  const long long *counts;   /* every rank's round-1 numbers, MUON__COUNTS each */
  unsigned char *pad = NULL;
  muon__adamw_entry *aw_all = NULL, *aw_pad = NULL;   /* Partial AdamW params: who holds which part */
  int any_aw = 0;
  muon_status st = MUON_OK, got;
  muon__plan_free(opt);
  muon__lists_init(&w);
  P = opt->plan.P = opt->comm.size;
  me = opt->plan.me = opt->comm.rank;
  opt->error[0] = '\0';
  /* The small exchanges below go through the buffer allocated at creation, so that a rank short
     of memory still joins every one of them and its failure becomes everyone's. */
  /* Round 1: how many matrices (and distinct layouts among them), AdamW params and Partial ones
     each rank has, the digest of its entries and names and its layout table's bytes. A rank
     short of memory for its layout table says so in round 1b. */
  layouts = muon__layout_slots(opt);
  mine[0] = opt->n_matrices;
  mine[1] = layouts < 0 ? 0 : layouts;
  mine[2] = opt->n_adamw;
  mine[3] = muon__adamw_partials(opt);
  mine[4] = (long long)muon__list_digest(opt);
  mine[5] = layouts < 0 ? 0 : (long long)muon__table_bytes(opt);
  if ((st = muon__exchange(opt, mine, MUON__COUNTS, &counts, "muon_plan: exchanging matrix counts")) != MUON_OK)
    goto done;
  opt->plan.max_adamw = 0;
  count = (int *)muon__alloc(&opt->allocator, (size_t)P * sizeof(int));
  for (r = 0; r < P; r++) {
    const long long *c = counts + (size_t)r * MUON__COUNTS;
    if (count) count[r] = (int)c[0];
    if (c[2] > opt->plan.max_adamw) opt->plan.max_adamw = (int)c[2];
    any_aw |= c[3] > 0;
  }
  geometry = muon__list_geometry(opt, &w, counts);
  /* Round 1b: whether each rank could allocate what round 2 and the plan's lists need. */
  opt->plan.adamw_names =
      (uint64_t *)muon__alloc(&opt->allocator, (size_t)(P + 1) * (size_t)opt->plan.max_adamw * sizeof(uint64_t) + 1);
  all = geometry < 0 ? NULL : (unsigned char *)muon__alloc(&opt->allocator, (size_t)P * w.stride + 1);
  pad = geometry < 0 ? NULL : (unsigned char *)muon__alloc(&opt->allocator, w.stride + 1);
  if (any_aw) {
    aw_all =
        (muon__adamw_entry *)muon__alloc(&opt->allocator, (size_t)P * (size_t)opt->plan.max_adamw * sizeof *aw_all + 1);
    aw_pad = (muon__adamw_entry *)muon__alloc(&opt->allocator, (size_t)opt->plan.max_adamw * sizeof *aw_pad + 1);
  }
  got = layouts >= 0 && count && opt->plan.adamw_names && all && pad && (!any_aw || (aw_all && aw_pad))
            ? MUON_OK
            : MUON_ERR_NOMEM;
  if ((st = muon__agree_allocations(opt, got)) != MUON_OK) goto done;
  /* Round 2: every rank's list, padded to the longest. */
  muon__put_list(opt, pad, &w, me);
  if ((st = muon__allgather(opt, pad, all, w.stride, "muon_plan: exchanging matrix lists")) != MUON_OK) goto done;
  w.bytes = all;
  /* Round 2b, only where some rank has a Partial AdamW param: every rank's AdamW params. */
  if (any_aw) {
    muon__adamw_entries(opt, aw_pad, opt->plan.max_adamw);
    st = muon__allgather(opt, aw_pad, aw_all, (size_t)opt->plan.max_adamw * sizeof *aw_pad,
                         "muon_plan: exchanging AdamW param lists");
    if (st != MUON_OK) goto done;
  }
  opt->plan.max_local = w.max_local;
  /* Everything from here is computed from the same data on every rank; a custom assign may
     still differ, so ranks compare verdicts and plan fingerprints before trusting the plan. */
  got = muon__read_lists(opt, &w, count, &all);
  if (got == MUON_OK) got = muon__build_plan(opt, &w, count);
  if (got == MUON_OK && any_aw) {
    opt->plan.any_adamw_partial = 1;
    got = muon__plan_adamw(opt, aw_all, opt->plan.max_adamw);
  }
  if (got == MUON_OK) got = muon__partial_prepare(opt);
  if (got == MUON_OK) got = muon__normuon_prepare(opt);
  if (got == MUON_OK) got = muon__plan_checks(opt);
  if (got == MUON_OK && (moving = muon__normuon_counts(opt, &w)) != 0) {
    got = muon__normuon_buffers(opt, &nm_send, &nm_recv);
    if (got == MUON_OK && !(moved = (unsigned char *)muon__alloc(&opt->allocator, (size_t)opt->n_matrices + 1)))
      got = muon__fail(opt, MUON_ERR_NOMEM, "muon_plan: allocating %d flags failed", opt->n_matrices);
    if (moved) memset(moved, 0, (size_t)opt->n_matrices + 1);
  }
  if ((st = muon__compare_plans(opt, got)) != MUON_OK) goto done;
  if (moving && (st = muon__normuon_move(opt, &w, nm_send, nm_recv, moved)) != MUON_OK) goto done;
  muon__normuon_finish(opt, moved);
  muon__partial_finish(opt);
  opt->plan.ready = 1;
  muon__log_plan(opt);
done:
  if (st != MUON_OK) { muon__normuon_drop_next(opt); muon__plan_free(opt); }
  if (moving) muon__normuon_free_buffers(opt, nm_send, nm_recv);
  muon__free(&opt->allocator, moved);
  muon__free(&opt->allocator, pad);
  muon__free(&opt->allocator, all);
  muon__lists_free(opt, &w);
  muon__free(&opt->allocator, aw_pad);
  muon__free(&opt->allocator, aw_all);
  muon__free(&opt->allocator, count);
  return st;
}

MUON_API int muon_rank(const muon_optimizer *opt) { return opt ? opt->comm.rank : 0; }
MUON_API int muon_world_size(const muon_optimizer *opt) { return opt ? opt->comm.size : 1; }

MUON_API muon_status muon_get_owner(const muon_optimizer *opt, int index, int *owner) {
  if (!opt || !owner || index < 0 || index >= opt->n_matrices) return MUON_ERR_ARG;
  if (!opt->distributed) { *owner = opt->comm.rank; return MUON_OK; }
  if (!opt->plan.ready || opt->matrices[index].global < 0) return MUON_ERR_STATE;
  *owner = opt->plan.globals[opt->matrices[index].global].owner;
  return MUON_OK;
}

MUON_API int muon_global_count(const muon_optimizer *opt) {
  return opt && opt->distributed && opt->plan.ready ? opt->plan.n_globals : 0;
}

MUON_API muon_status muon_global_info(const muon_optimizer *opt, int global, muon_matrix_info *info, int *owner) {
  if (!opt || !opt->distributed || !opt->plan.ready || global < 0 || global >= opt->plan.n_globals) return MUON_ERR_ARG;
  if (info) muon__info(opt, global, info);
  if (owner) *owner = opt->plan.globals[global].owner;
  return MUON_OK;
}

MUON_API int muon_owned(const muon_optimizer *opt, int *out, int cap) {
  int g, n = 0;
  if (!opt || !opt->distributed || !opt->plan.ready) return 0;
  for (g = 0; g < opt->plan.n_globals; g++)
    if (opt->plan.globals[g].owner == opt->comm.rank) {
      if (out && n < cap) out[n] = g;
      n++;
    }
  return n;
}


/* >>impl-plan-text ----------------------------------------------------------------------------
   The plan as text: what each rank holds of each matrix (as it described it, and as elements of
   the full matrix), who orthogonalises it in which round, and per rank the work and the bytes of
   a step. Every rank knows the whole plan, so any rank can write it. */
typedef struct muon__text { char *buf; size_t size, len; } muon__text;

static void muon__say(muon__text *t, const char *fmt, ...) {
  va_list ap;
  int n;
  va_start(ap, fmt);
  n = vsnprintf(t->len < t->size ? t->buf + t->len : NULL, t->len < t->size ? t->size - t->len : 0, fmt, ap);
  va_end(ap);
  if (n > 0) t->len += (size_t)n;
}

/* A piece as elements of the full matrix: a block of rows and columns, or a flat range of one. */
static void muon__say_piece(muon__text *t, const muon__piece *p) {
  muon__say(t, "rows [%lld, %lld) x cols [%lld, %lld)", p->r0, p->r0 + p->h, p->c0, p->c0 + p->w);
  if (p->f0 != 0 || p->f1 != p->h * p->w) muon__say(t, ", its elements [%lld, %lld) in row-major order", p->f0, p->f1);
}

/* Does round r move anything (the same answer on every rank)? out: U to owners; else O back. */
static int muon__round_moves(const muon__plan *pl, int r, int out) {
  int k;
  for (k = pl->round_start[r]; k < pl->round_start[r + 1]; k++)
    if (out ? pl->globals[pl->round_order[k]].moves_out : pl->globals[pl->round_order[k]].moves_back) return 1;
  return 0;
}

MUON_API size_t muon_plan_text(const muon_optimizer *opt, char *buf, size_t size) {
  const muon__plan *pl;
  muon__text t;
  int g, j, r, p, exchanges = 0;
  size_t e;                        /* bytes per value on the wire */
  if (!opt) return 0;
  t.buf = buf;
  t.size = buf ? size : 0;
  t.len = 0;
  if (buf && size) buf[0] = '\0';
  pl = &opt->plan;
  if (!pl->ready) {
    muon__say(&t, "muon plan: not planned yet (muon_plan, or the first muon_step, plans)\n");
    return t.len;
  }
  e = pl->wire_bf16 ? 2 : 4;
  for (r = 0; opt->distributed && !opt->dist.gather && r < pl->n_rounds; r++)
    exchanges += muon__round_moves(pl, r, 1) + muon__round_moves(pl, r, 0);
  muon__say(&t, "muon plan, as rank %d of %d sees it: %d matrices, %d exchange rounds%s%s\n", pl->me, pl->P,
            pl->n_globals, pl->n_rounds,
            opt->distributed ? (opt->dist.gather ? "; the exchange is the config's own gather / redistribute" : "")
                             : "; one device, nothing moves",
            pl->wire_bf16 ? "; bf16 on the wire (2 B per value, each message padded to whole floats)" : "");
  for (g = 0; g < pl->n_globals; g++) {
    const muon__global *x = &pl->globals[g];
    const muon__piece *pieces;
    const muon__holder *H = muon__holders_of(opt, x, &pieces);
    muon__say(&t, "matrix %d '%s' %d x %d, layout key %lld: owner rank %d, round %d\n", g, x->name, x->rows, x->cols,
              x->key, x->owner, x->round);
    for (j = 0; opt->distributed && j < x->n_holders; j++) {
      const muon__holder *h = &H[j];
      char levels[240];
      muon__holder_text(pl, h, levels, sizeof levels);
      muon__say(&t, "  rank %d: [%s] = ", h->rank, levels);
      muon__say_piece(&t, &pieces[j]);
      if (h->rank == x->owner) muon__say(&t, "; the owner\n");
      else if (h->source == h->rank)
        muon__say(&t, x->on_owner ? "; sends its part of the gradient\n" : "; sends its U\n");
      else muon__say(&t, "; a replica: rank %d sends this U\n", h->source);
    }
  }
  for (p = 0; p < pl->P; p++) {
    size_t out_send = 0, out_recv = 0, back_send = 0, back_recv = 0, gathered = 0, least = 0;
    double flops = 0;
    int owns = 0;
    for (r = 0; r < pl->n_rounds; r++) {
      muon__traffic tr = muon__round_traffic(opt, r, p);
      out_send += tr.out_send; out_recv += tr.out_recv;
      back_send += tr.back_send; back_recv += tr.back_recv;
      if (tr.gathered > gathered) gathered = tr.gathered;
    }
    for (g = 0; g < pl->n_globals; g++) {   /* least: what an owner must receive, its matrices less its own pieces */
      const muon__global *x = &pl->globals[g];
      if (x->owner != p) continue;
      owns++;
      flops += muon__ns_cost(x->rows, x->cols);
      least += (size_t)x->rows * (size_t)x->cols;
      if (muon__holds(x, p)) {
        const muon__piece *pieces;
        const muon__holder *H = muon__holders_of(opt, x, &pieces);
        for (j = 0; j < x->n_holders; j++) if (H[j].rank == p) least -= muon__piece_size(&pieces[j]);
      }
    }
    muon__say(
        &t,
        "rank %d: owns %d matrices, %.4g GFLOP per Newton-Schulz iteration; per step %zu B out, %zu B in "
        "(U %zu B to owners, %zu B as owner, the least possible being %zu B; O %zu B as owner, %zu B back); at most %zu B of full matrices at once\n",
        p, owns, flops / 1e9, e * (out_send + back_send), e * (out_recv + back_recv), e * out_send, e * out_recv,
        opt->distributed ? e * least : 0, e * back_send, e * back_recv, 4 * gathered);
  }
  if (pl->any_adamw_partial) {   /* this rank's: the others' AdamW params are theirs to say */
    size_t aw = 0;
    for (j = 0; j < pl->n_aw; j++) {
      const muon__adamw *a = &opt->adamw[pl->aw_order[j]];
      aw += a->size - (a->hi - a->lo) + (size_t)(a->parts - 1) * (a->hi - a->lo);
    }
    muon__say(
        &t,
        "rank %d: Partial AdamW params %d; per step %zu B out, %zu B in (a reduce-scatter of their gradients, an all-gather of their new values)\n",
        pl->me, pl->n_aw, 4 * aw, 4 * aw);
  }
  if (opt->distributed)
    muon__say(&t, "collectives per step without skips: %d (the agreement 1, the commit vote %d, exchanges %d%s)%s\n",
              1 + !opt->dist.unchecked_commit + exchanges + 2 * pl->any_adamw_partial, !opt->dist.unchecked_commit,
              exchanges, pl->any_adamw_partial ? ", Partial AdamW 2" : "",
              opt->dist.gather ? ", plus the config's own gather / redistribute calls" : "");
  if (opt->distributed && opt->stats.steps)
    muon__say(
        &t, "measured on rank %d over %lld steps (planning included): %lld B sent, %lld B received, %lld collectives\n",
        pl->me, opt->stats.steps, opt->stats.bytes_sent, opt->stats.bytes_received, opt->stats.collectives);
  return t.len;
}

/* After planning, the text goes to the logger (MUON_LOG_INFO), if there is one. */
static void muon__log_plan(muon_optimizer *opt) {
  size_t n;
  char *text;
  if (!opt->logger.func) return;
  n = muon_plan_text(opt, NULL, 0);
  if (!(text = (char *)muon__alloc(&opt->allocator, n + 1))) return;
  muon_plan_text(opt, text, n + 1);
  muon__log(&opt->logger, MUON_LOG_INFO, text);
  muon__free(&opt->allocator, text);
}

/* >>impl-step ---------------------------------------------------------------------------------
   The step. Per round: U of each piece to its owner (gather) -> Newton-Schulz on the owner -> O
   back to every holder (redistribute). Without a dist config every rank owns what it holds and
   the rounds move nothing. Momentum and parameters change only after every round succeeded and
   the backend has confirmed it (apply), so a failed step leaves this rank exactly as it was.
   The host waits for the compute backend at named points only: the non-finite verdicts, each
   exchange staged through a host communicator, and once before the apply. */

static muon_momentum_args muon__momentum_args(const muon_optimizer *opt, const muon__matrix *x) {
  const muon_hparams *hp = &opt->groups[x->group];
  muon_momentum_args a;
  a.mu = hp->momentum;
  a.nesterov = hp->nesterov;
  a.sgd = hp->momentum_style == MUON_MOMENTUM_SGD;
  a.grad_scale = opt->grad_scale;
  a.grad_dtype = x->grad_dtype;
  return a;
}

/* U of a local piece, computed from a copy of the momentum: the buffer itself is untouched. */
static muon_status muon__u_piece(muon_optimizer *opt, const muon__matrix *x, float *u) {
  muon_momentum_args a = muon__momentum_args(opt, x);
  return muon__state_momentum(opt, x, 0, x->size, x->grad, &a, 0, u, "muon_step: momentum");
}

/* The op that moves holder piece p of global x between `pieces` + at and x's operand. */
static muon_piece_copy muon__piece_op(const muon__global *x, const muon__piece *p, size_t at) {
  muon_piece_copy op;
  op.r0 = p->r0; op.c0 = p->c0; op.h = p->h; op.w = p->w; op.f0 = p->f0; op.f1 = p->f1;
  op.rows = x->rows; op.cols = x->cols; op.piece = at; op.operand = x->xoff;
  return op;
}

static muon_status muon__pack(muon_optimizer *opt, int n, float *pieces, float *operands, int to_operand) {
  if (!n) return MUON_OK;
  MUON__TRY(muon__compute_pack(
      opt, opt->plan.ops, n, pieces, operands, to_operand,
      to_operand ? "muon_step: packing pieces into operands" : "muon_step: cutting operands into pieces"));
  return MUON_OK;
}

/* Non-finite verdicts of every present gradient, from the backend: flag 0 ok, 1 absent, 2 NaN/Inf. */
static muon_status muon__verdicts(muon_optimizer *opt) {
  int i, n = opt->n_matrices + opt->n_adamw, any = 0;
  muon_status st;
  /* A gradient never bound is a forgotten muon_set_grad, not an absent one: it would train
     nothing, silently. Distributed, the status goes into the agreement: every rank fails. */
  for (i = 0; i < opt->n_matrices; i++)
    if (opt->matrices[i].size && !opt->matrices[i].grad_bound)
      return muon__fail(opt, MUON_ERR_ARG,
                        "muon_step: matrix %d ('%s') has no gradient: registered with grad NULL and never given one "
                        "by muon_set_grad (muon_set_grad(NULL) says absent this step); nothing was applied",
                        i, opt->matrices[i].name);
  for (i = 0; i < opt->n_adamw; i++)
    if (!opt->adamw[i].grad_bound)
      return muon__fail(opt, MUON_ERR_ARG,
                        "muon_step: AdamW param %d ('%s') has no gradient: registered with grad NULL and never given "
                        "one by muon_set_adamw_grad (NULL there says absent this step); nothing was applied",
                        i, opt->adamw[i].name);
  if (muon__f2u(opt->grad_scale) == 0) {   /* muon_set_grad_scale(0 or non-finite): a non-finite norm */
    if (opt->on_nonfinite == MUON_NONFINITE_ERROR)
      return muon__fail(opt, MUON_ERR_NONFINITE,
                        "muon_step: the gradient scale is 0 (muon_set_grad_scale was given 0, NaN or Inf: the "
                        "gradient norm is not finite); nothing was applied");
    for (i = 0; i < n; i++)   /* SKIP: every gradient is non-finite this step */
      opt->host_verdicts[i] = i < opt->n_matrices && !opt->matrices[i].size ? 0 : 2;
    return MUON_OK;
  }
  for (i = 0; i < opt->n_matrices; i++) {
    const muon__matrix *x = &opt->matrices[i];
    if (!x->grad || !x->size) continue;
    MUON__TRY(muon__compute_nonfinite(opt, x->grad, x->grad_dtype, x->size, &opt->verdicts[i],
                                      "muon_step: checking gradients"));
    any = 1;
  }
  for (i = 0; i < opt->n_adamw; i++) {
    const muon__adamw *p = &opt->adamw[i];
    if (!p->grad) continue;
    MUON__TRY(muon__compute_nonfinite(opt, p->grad, p->grad_dtype, p->size, &opt->verdicts[opt->n_matrices + i],
                                      "muon_step: checking gradients"));
    any = 1;
  }
  if (any) {
    MUON__TRY(muon__compute_copy(opt, opt->host_verdicts, opt->verdicts, (size_t)n * sizeof(int), 1, 0,
                                 "muon_step: reading the non-finite verdicts"));
    if ((st = muon__sync(opt, "muon_step: reading the non-finite verdicts")) != MUON_OK) return st;
  }
  for (i = 0; i < opt->n_matrices; i++) {
    const muon__matrix *x = &opt->matrices[i];
    opt->host_verdicts[i] = !x->size ? 0 : !x->grad ? 1 : opt->host_verdicts[i] ? 2 : 0;
  }
  for (i = 0; i < opt->n_adamw; i++)
    opt->host_verdicts[opt->n_matrices + i] = !opt->adamw[i].grad ? 1 : opt->host_verdicts[opt->n_matrices + i] ? 2 : 0;
  return MUON_OK;
}

/* >>impl-agree --------------------------------------------------------------------------------
   Agreement. Every distributed step (and muon_plan) starts with one allgather of a fixed-size
   record per rank: whether the rank steps or plans, whether its plan is current, one digest of
   every setting of the lists (>>impl-settings), and its gradient verdicts. Every rank reads the
   same records and so takes the same branch: step; re-plan together (a rank added matrices or
   changed NS settings); or fail with the same error, naming the field, the group and the ranks. */
#define MUON__RECORD_BYTES (4 * 4 + 8 * 2 + 4 * 2 + 8 * 5)
/* Per rank, the larger of a record and a detail exchange's slot (muon__name_difference). */
#define MUON__AGREE_SLOT (MUON__GROUP_MAX > MUON__RECORD_BYTES ? MUON__GROUP_MAX : MUON__RECORD_BYTES)

typedef struct muon__record {
  uint32_t kind;                /* 1 muon_step, 2 muon_plan */
  uint32_t status;              /* MUON_OK, or why this rank cannot go on */
  uint32_t skips;               /* matrices here whose gradient is absent or non-finite */
  uint32_t bad;                 /* 1 + local index of the first non-finite gradient (ERROR mode) */
  uint64_t plan;                /* fingerprint of this rank's plan, 0 if it must be rebuilt */
  uint64_t settings;            /* digest of every setting of the lists (>>impl-settings) */
  uint32_t n_groups, n_adamw_groups;
  uint64_t bad_adamw;           /* 1 + index of the first non-finite AdamW gradient (ERROR mode) */
  uint64_t adamw_skips;         /* AdamW params here whose gradient is absent or non-finite */
  uint64_t steps;               /* steps taken (a checkpoint restores it) */
  uint64_t run, proposal;       /* the run this state belongs to (0: none yet); a fresh identity */
} muon__record;

static void muon__record_io(muon__record *r, unsigned char *buf, int write) {
  unsigned char *p = buf;
  const unsigned char *q = buf;
#define MUON__IO32(v) do { if (write) muon__put32(&p, (uint32_t)(v)); else (v) = muon__get32(&q); } while (0)
#define MUON__IO64(v) do { if (write) muon__put64(&p, (uint64_t)(v)); else (v) = muon__get64(&q); } while (0)
  MUON__IO32(r->kind); MUON__IO32(r->status); MUON__IO32(r->skips); MUON__IO32(r->bad);
  MUON__IO64(r->plan); MUON__IO64(r->settings);
  MUON__IO32(r->n_groups); MUON__IO32(r->n_adamw_groups);
  MUON__IO64(r->bad_adamw); MUON__IO64(r->adamw_skips);
  MUON__IO64(r->steps); MUON__IO64(r->run); MUON__IO64(r->proposal);
#undef MUON__IO32
#undef MUON__IO64
}

/* The records of P ranks, their wire form (or a detail exchange), and the commit vote. */
#define MUON__VOTE 7   /* the vote's numbers: status; matrices: count, first, why; AdamW: count, first, name hash */
static size_t muon__agree_bytes(int P) {
  return (size_t)P * (sizeof(muon__record) + MUON__AGREE_SLOT + MUON__VOTE * sizeof(long long));
}

/* The optimizer's own settings (MUON__RUN_FIELDS), as a struct to compare and a record to send. */
#define MUON__TYPE_F float
#define MUON__TYPE_U uint32_t
#define MUON__TYPE_U64 uint64_t
typedef struct muon__run_settings {
#define MUON__X(f, name, kind, value) MUON__TYPE_##kind f;
  MUON__RUN_FIELDS(MUON__X)
#undef MUON__X
} muon__run_settings;
static void muon__run_of(const muon_optimizer *o, muon__run_settings *s) {
#define MUON__X(f, name, kind, value) s->f = (MUON__TYPE_##kind)(value);
  MUON__RUN_FIELDS(MUON__X)
#undef MUON__X
}
static void muon__put_run(unsigned char **p, const muon__run_settings *s) {
  unsigned char *at = muon__record_begin(p);
#define MUON__X(f, name, kind, value) MUON__PUT_##kind(p, s->f);
  MUON__RUN_FIELDS(MUON__X)
#undef MUON__X
  muon__record_end(p, at);
}
static void muon__get_run(const unsigned char **p, muon__run_settings *s) {
  muon__record_in r = muon__record_open(p);
  muon__run_settings dflt;
  memset(&dflt, 0, sizeof dflt);
#define MUON__X(f, name, kind, value) MUON__GET_##kind(s->f, dflt.f, MUON__TYPE_##kind);
  MUON__RUN_FIELDS(MUON__X)
#undef MUON__X
}

/* The agreed items: 0 the optimizer's own settings, then each Muon group, then each AdamW group.
   Item i's record into *p (at most MUON__GROUP_MAX bytes). */
static void muon__put_item(const muon_optimizer *opt, int i, unsigned char **p) {
  if (i == 0) {
    muon__run_settings s;
    muon__run_of(opt, &s);
    muon__put_run(p, &s);
  } else if (i <= opt->n_groups) {
    muon__put_hparams(p, &opt->groups[i - 1]);
  } else {
    muon__put_adamw_hparams(p, &opt->adamw_groups[i - 1 - opt->n_groups]);
  }
}
static uint64_t muon__item_digest(const muon_optimizer *opt, int i) {
  unsigned char buf[MUON__GROUP_MAX], *p = buf;
  muon__put_item(opt, i, &p);
  return muon__fnv1a(buf, (size_t)(p - buf));
}

/* This rank's settings: everything two ranks must share for their updates to be one update. */
static void muon__settings(const muon_optimizer *opt, muon__record *r) {
  uint64_t all = MUON__FNV_START;
  int i;
  r->n_groups = (uint32_t)opt->n_groups;
  r->n_adamw_groups = (uint32_t)opt->n_adamw_groups;
  for (i = 0; i < 1 + opt->n_groups + opt->n_adamw_groups; i++)
    all = (all ^ muon__item_digest(opt, i)) * 1099511628211ull;
  r->settings = all;
}

/* "what (x vs y)" into out when x and y differ. */
static int muon__differ(uint64_t x, uint64_t y, const char *what, const char *where, char *out, size_t n) {
  if (x == y) return 0;
  snprintf(out, n, "%s%s (%llu vs %llu)", what, where, (unsigned long long)x, (unsigned long long)y);
  return 1;
}
static int muon__differ_f(float x, float y, const char *what, const char *where, char *out, size_t n) {
  char a[32], b[32];
  int digits = 6;
  if (muon__f2u(x) == muon__f2u(y)) return 0;
  do {   /* as short as tells them apart */
    snprintf(a, sizeof a, "%.*g", digits, (double)x);
    snprintf(b, sizeof b, "%.*g", digits, (double)y);
  } while (!strcmp(a, b) && ++digits < 10);
  snprintf(out, n, "%s%s (%s vs %s)", what, where, a, b);
  return 1;
}
static int muon__differ_triples(const float (*x)[3], const float (*y)[3], int steps, const char *what,
                                const char *where, char *out, size_t n) {
  char name[80];
  int k, j;
  for (k = 0; k < steps && k < MUON_NS_MAX_STEPS; k++)
    for (j = 0; j < 3; j++) {
      snprintf(name, sizeof name, "%s[%d][%d]", what, k, j);
      if (muon__differ_f(x[k][j], y[k][j], name, where, out, n)) return 1;
    }
  return 0;
}
#define MUON__DIFF_F(x, y, what) if (muon__differ_f(x, y, what, where, out, n)) return 1;
#define MUON__DIFF_U(x, y, what) if (muon__differ((uint32_t)(x), (uint32_t)(y), what, where, out, n)) return 1;
#define MUON__DIFF_U64(x, y, what) if (muon__differ((uint64_t)(x), (uint64_t)(y), what, where, out, n)) return 1;
#define MUON__DIFF_NS(x, y, what)                                                                                  \
  if (muon__differ_triples((const float(*)[3])(x), (const float(*)[3])(y), a->ns_steps, what, where, out, n)) return 1;
static int muon__hparams_differ(const muon_hparams *a, const muon_hparams *b, const char *where, char *out, size_t n) {
#define MUON__X(f, type, kind, alt) MUON__DIFF_##kind(a->f, b->f, "muon_hparams." #f)
  MUON__HPARAMS_FIELDS(MUON__X)
#undef MUON__X
  return 0;
}
static int muon__adamw_differ(const muon_adamw_hparams *a, const muon_adamw_hparams *b, const char *where, char *out,
                              size_t n) {
#define MUON__X(f, type, kind, alt) MUON__DIFF_##kind(a->f, b->f, "muon_adamw_hparams." #f)
  MUON__ADAMW_FIELDS(MUON__X)
#undef MUON__X
  return 0;
}
static int muon__run_differ(const muon__run_settings *a, const muon__run_settings *b, char *out, size_t n) {
  const char *where = "";
#define MUON__X(f, name, kind, value) MUON__DIFF_##kind(a->f, b->f, name)
  MUON__RUN_FIELDS(MUON__X)
#undef MUON__X
  return 0;
}

/* Item i's records of two ranks (slots as sent), decoded and compared field by field. */
static int muon__item_differs(int n_groups, int i, const unsigned char *x, const unsigned char *y, char *out,
                              size_t n) {
  char where[48];
  if (muon__get32(&x) > MUON__GROUP_MAX - 4 || muon__get32(&y) > MUON__GROUP_MAX - 4) return 0;
  x -= 4; y -= 4;
  if (i == 0) {
    muon__run_settings a, b;
    muon__get_run(&x, &a);
    muon__get_run(&y, &b);
    return muon__run_differ(&a, &b, out, n);
  }
  if (i <= n_groups) {
    muon_hparams a = muon_default_hparams(), b = a;
    muon__get_hparams(&x, &a);
    muon__get_hparams(&y, &b);
    snprintf(where, sizeof where, " of group %d", i - 1);
    return muon__hparams_differ(&a, &b, where, out, n);
  } else {
    muon_adamw_hparams a = muon_default_adamw_hparams(), b = a;
    muon__get_adamw_hparams(&x, &a);
    muon__get_adamw_hparams(&y, &b);
    snprintf(where, sizeof where, " of AdamW group %d", i - 1 - n_groups);
    return muon__adamw_differ(&a, &b, where, out, n);
  }
}

/* Ranks 0 and r disagree on settings (records' digests): which setting, on every rank alike.
   Only then, two small exchanges: the items' digests, in slots of MUON__AGREE_SLOT bytes, until
   one differs; then that item's whole record, decoded by every rank, which names the field. The
   same bytes reach every rank, so every rank takes the same path and writes the same words; a
   rank whose group counts are not rank 0's (it differs too, but later) sends zeros. */
static muon_status muon__name_difference(muon_optimizer *opt, const muon__record *recs, int r, char *out, size_t n) {
  unsigned char mine[MUON__AGREE_SLOT], *all = (unsigned char *)(recs + opt->comm.size), *p;
  int ng = (int)recs[0].n_groups, items = 1 + ng + (int)recs[0].n_adamw_groups, per = (int)(MUON__AGREE_SLOT / 8);
  int same = opt->n_groups == ng && opt->n_adamw_groups == (int)recs[0].n_adamw_groups, i0, i, found = -1;
  muon_status st;
  if (recs[0].n_groups != recs[r].n_groups) {
    snprintf(out, n, "the number of Muon groups (%u vs %u)", recs[0].n_groups, recs[r].n_groups);
    return MUON_OK;
  }
  if (recs[0].n_adamw_groups != recs[r].n_adamw_groups) {
    snprintf(out, n, "the number of AdamW groups (%u vs %u)", recs[0].n_adamw_groups, recs[r].n_adamw_groups);
    return MUON_OK;
  }
  for (i0 = 0; i0 < items && found < 0; i0 += per) {
    memset(mine, 0, sizeof mine);
    for (i = i0, p = mine; same && i < items && i < i0 + per; i++) muon__put64(&p, muon__item_digest(opt, i));
    st = muon__allgather(opt, mine, all, MUON__AGREE_SLOT, "agreeing: which setting differs");
    if (st != MUON_OK) return st;
    for (i = i0; i < items && i < i0 + per && found < 0; i++)
      if (memcmp(all + 8 * (i - i0), all + (size_t)r * MUON__AGREE_SLOT + 8 * (i - i0), 8)) found = i;
  }
  snprintf(out, n, "a setting (their digests differ, their records do not)");
  if (found < 0) return MUON_OK;
  memset(mine, 0, sizeof mine);
  p = mine;
  if (same) muon__put_item(opt, found, &p);
  st = muon__allgather(opt, mine, all, MUON__AGREE_SLOT, "agreeing: which setting differs");
  if (st != MUON_OK) return st;
  muon__item_differs(ng, found, all, all + (size_t)r * MUON__AGREE_SLOT, out, n);
  return MUON_OK;
}

static muon_status muon__plan_collective(muon_optimizer *opt);

/* Ranks that restored state from different steps or runs: a checkpoint of each rank's own, but
   not one checkpoint. Fresh optimizers everywhere adopt rank 0's identity. */
static muon_status muon__agree_run(muon_optimizer *opt, const muon__record *recs, const char *fn) {
  int P = opt->comm.size, r, fresh = 0;
  if (P == 1) return MUON_OK;
  for (r = 0; r < P; r++) fresh += recs[r].run == 0;
  for (r = 1; r < P; r++)
    if (recs[r].steps != recs[0].steps)
      return muon__fail(opt, MUON_ERR_MISMATCH,
                        "%s: ranks 0 and %d are at different steps (%llu vs %llu): restored from checkpoints of "
                        "different steps? every rank loads its file of the same step; nothing was applied",
                        fn, r, (unsigned long long)recs[0].steps, (unsigned long long)recs[r].steps);
  if (fresh == P) {   /* taken when a step succeeds: a failed one changes nothing */
    opt->run_agreed = recs[0].proposal;
    return MUON_OK;
  }
  for (r = 1; r < P; r++)
    if (recs[r].run != recs[0].run)
      return muon__fail(opt, MUON_ERR_MISMATCH,
                        "%s: ranks 0 and %d hold the state of different runs (%s%016llx vs %s%016llx): restored "
                        "from checkpoints of different jobs, or only some ranks restored; nothing was applied",
                        fn, r, recs[0].run ? "run " : "fresh ", (unsigned long long)recs[0].run,
                        recs[r].run ? "run " : "fresh ", (unsigned long long)recs[r].run);
  return MUON_OK;
}

/* The record exchange; *replanned says whether every rank just re-planned together. */
/* What a record's kind is called in messages, and which kinds may meet in one agreement: a
   step or a plan (1, 2: they re-plan together), a verification tool (3), muon_qk_clip (4). */
static const char *muon__agree_who(uint32_t kind) {
  return kind == 1   ? "muon_step"
         : kind == 2 ? "muon_plan"
         : kind == 3 ? "muon_gather_matrix / muon_dump_file / muon_check_layouts"
                     : "muon_qk_clip";
}
static const char *muon__agree_what(uint32_t kind) {
  return kind == 3 ? "a verification tool" : kind == 4 ? "muon_qk_clip" : "muon_step or muon_plan";
}
static uint32_t muon__agree_class(uint32_t kind) { return kind >= 3 ? kind : 0; }

static muon_status muon__agree(muon_optimizer *opt, uint32_t kind, uint32_t status, int *replanned) {
  int P = opt->comm.size, me = opt->comm.rank, r, i, nm = opt->n_matrices, stale = 0, planners = -1;
  unsigned char mine[MUON__RECORD_BYTES], *all;
  muon__record rec, *recs;
  muon_status st;
  *replanned = 0;
  memset(&rec, 0, sizeof rec);
  rec.kind = kind;
  rec.status = status;
  rec.plan = opt->plan.ready ? muon__plan_hash(&opt->plan) | 1 : 0;
  rec.steps = (uint64_t)opt->stats.steps;
  rec.run = opt->run;
  rec.proposal = opt->run ? 0 : muon__new_run(opt);
  muon__settings(opt, &rec);
  for (i = 0; kind == 1 && status == MUON_OK && i < nm; i++) {
    int v = opt->host_verdicts[i];
    if (v) rec.skips++;
    if (v == 2 && opt->on_nonfinite == MUON_NONFINITE_ERROR && !rec.bad) rec.bad = (uint32_t)i + 1;
  }
  for (i = 0; kind == 1 && status == MUON_OK && i < opt->n_adamw; i++) {
    if (opt->host_verdicts[nm + i]) rec.adamw_skips++;
    if (opt->host_verdicts[nm + i] == 2 && opt->on_nonfinite == MUON_NONFINITE_ERROR && !rec.bad_adamw)
      rec.bad_adamw = (uint64_t)i + 1;
  }
  muon__record_io(&rec, mine, 1);
  recs = (muon__record *)opt->agree;
  all = (unsigned char *)(recs + P);
  st = muon__allgather(opt, mine, all, MUON__RECORD_BYTES,
                       kind == 1   ? "muon_step: agreeing on the step"
                       : kind == 4 ? "muon_qk_clip: agreeing on the call"
                                   : "muon_plan: agreeing on the plan");
  for (r = 0; st == MUON_OK && r < P; r++) muon__record_io(&recs[r], all + (size_t)r * MUON__RECORD_BYTES, 0);
  if (st != MUON_OK) return st;
  for (r = 0; r < P; r++) {
    if (recs[r].kind == 2 && planners < 0) planners = r;
    if (!recs[r].plan || recs[r].plan != recs[0].plan) stale = 1;
  }
  /* Failures first, then disagreement: the same verdict on every rank. */
  if (status != MUON_OK) st = (muon_status)status;   /* this rank's own message stands */
  for (r = 0; r < P && st == MUON_OK; r++)
    if (recs[r].status != MUON_OK)
      st = muon__fail(opt, recs[r].status < MUON_STATUS_COUNT ? (muon_status)recs[r].status : MUON_ERR_BACKEND,
                      "%s: rank %d could not go on (%s); nothing was applied%s", muon__agree_who(kind),
                      r, muon_status_string((muon_status)recs[r].status), r == me ? "" : " (see that rank's message)");
  for (r = 0; r < P && st == MUON_OK; r++)   /* a tool's agreement (kind 3, 4) pairs only with its like */
    if (muon__agree_class(recs[r].kind) != muon__agree_class(recs[0].kind))
      st = muon__fail(
          opt, MUON_ERR_MISMATCH,
          "%s: rank %d called %s while rank 0 called %s: they are collective, call the same on every rank; nothing was applied",
          muon__agree_who(kind), r, muon__agree_what(recs[r].kind), muon__agree_what(recs[0].kind));
  for (r = 1; r < P && st == MUON_OK; r++)
    if (recs[r].settings != recs[0].settings) {
      char what[200];
      if ((st = muon__name_difference(opt, recs, r, what, sizeof what)) != MUON_OK) break;
      st = muon__fail(opt, MUON_ERR_MISMATCH, "%s: ranks 0 and %d disagree on %s; nothing was applied",
                      muon__agree_who(kind), r, what);
    }
  if (st == MUON_OK)
    st = muon__agree_run(opt, recs, muon__agree_who(kind));
  if (st == MUON_OK && (planners >= 0 || stale)) {
    /* Someone plans (muon_plan, or a stale plan): everyone plans, now, together. */
    st = muon__plan_collective(opt);
    *replanned = 1;
    if (st == MUON_OK && kind == 1 && planners >= 0)
      st = muon__fail(
          opt, MUON_ERR_MISMATCH,
          "muon_step: rank %d called muon_plan while this rank (%d) called muon_step: every rank re-planned; nothing was applied (muon_plan is collective: call it on every rank or on none)",
          planners, me);
    for (r = 0; st == MUON_OK && kind == 2 && r < P; r++)   /* the planners fail alike: one status */
      if (recs[r].kind == 1)
        st = muon__fail(
            opt, MUON_ERR_MISMATCH,
            "muon_plan: rank %d called muon_step while this rank (%d) called muon_plan: every rank re-planned; nothing was applied (muon_plan is collective: call it on every rank or on none)",
            r, me);
  }
  if (st == MUON_OK && kind == 1 && !*replanned) {
    for (r = 0; r < P && st == MUON_OK; r++) {
      if (recs[r].bad) {
        int g, j, found = -1;
        for (g = 0; g < opt->plan.n_globals && found < 0; g++)
          for (j = 0; j < opt->plan.globals[g].n_holders; j++)
            if (opt->plan.globals[g].holder_ranks[j] == r &&
                muon__holder_at(&opt->plan, &opt->plan.globals[g], j).local == (int)recs[r].bad - 1) {
              found = g;
              break;
            }
        st = muon__fail(
            opt, MUON_ERR_NONFINITE,
            "muon_step: the gradient of matrix '%s' (global %d) has NaN or Inf on rank %d; nothing was applied",
            found >= 0 ? opt->plan.globals[found].name : "?", found, r);
      } else if (recs[r].bad_adamw) {
        st = muon__fail(opt, MUON_ERR_NONFINITE,
                        "muon_step: the gradient of AdamW param %llu on rank %d has NaN or Inf; nothing was applied",
                        (unsigned long long)recs[r].bad_adamw - 1, r);
      }
    }
    for (r = 0, opt->plan.any_skip = 0; r < P; r++) if (recs[r].skips) opt->plan.any_skip = 1;
    for (r = 0, opt->plan.any_adamw_skip = 0; r < P; r++) if (recs[r].adamw_skips) opt->plan.any_adamw_skip = 1;
  }
  return st;
}

/* This rank's list of AdamW name hashes to skip (max_adamw, zeroed), for muon__adamw_skip_named. */
static uint64_t *muon__adamw_mine(muon_optimizer *opt) {
  uint64_t *mine = opt->plan.adamw_names + (size_t)opt->plan.P * opt->plan.max_adamw;
  memset(mine, 0, (size_t)opt->plan.max_adamw * sizeof(uint64_t));
  return mine;
}

/* Every rank's list: an AdamW param some rank skips is skipped on every rank that holds a piece
   of it (matched by name), so replicas and shards keep one state. */
static muon_status muon__adamw_skip_named(muon_optimizer *opt, const char *op) {
  muon__plan *pl = &opt->plan;
  int i, r, k;
  muon_status st;
  if (!pl->max_adamw) return MUON_OK;
  if ((st = muon__allgather(opt, pl->adamw_names + (size_t)pl->P * pl->max_adamw, pl->adamw_names,
                            (size_t)pl->max_adamw * sizeof(uint64_t), op)) != MUON_OK)
    return st;
  for (i = 0; i < opt->n_adamw; i++)
    for (r = 0; r < pl->P && !opt->adamw[i].skip; r++)
      for (k = 0; k < pl->max_adamw; k++)
        if (pl->adamw_names[(size_t)r * pl->max_adamw + k] == opt->adamw[i].name_hash) {
          opt->adamw[i].skip = 1;
          break;
        }
  return MUON_OK;
}

/* Which matrices this step skips (absent or non-finite gradients, with on_nonfinite SKIP), the
   same on every rank: the per-matrix flags are exchanged only when some rank has a skip. */
static muon_status muon__agree_skips(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, L = pl->max_local + 1, i, g, j, nm = opt->n_matrices;
  unsigned char *mine = pl->flags + (size_t)P * L;
  const int *v = opt->host_verdicts;
  muon_status st;
  for (i = 0; i < opt->n_adamw; i++) opt->adamw[i].skip = v[nm + i] != 0;
  for (g = 0; g < pl->n_globals; g++) pl->globals[g].skip = 0;
  if (!opt->distributed) {
    for (i = 0; i < nm; i++) {
      muon__matrix *x = &opt->matrices[i];
      if (v[i] == 2 && opt->on_nonfinite == MUON_NONFINITE_ERROR)
        return muon__fail(opt, MUON_ERR_NONFINITE,
                          "muon_step: the gradient of matrix %d ('%s') has NaN or Inf; nothing was applied", i,
                          x->name);
      x->skip = v[i] != 0;
      pl->globals[x->global].skip = x->skip;
    }
    for (i = 0; i < opt->n_adamw; i++)
      if (v[nm + i] == 2 && opt->on_nonfinite == MUON_NONFINITE_ERROR)
        return muon__fail(opt, MUON_ERR_NONFINITE,
                          "muon_step: the gradient of AdamW param %d ('%s') has NaN or Inf; nothing was applied", i,
                          opt->adamw[i].name);
    return MUON_OK;
  }
  if (pl->any_skip) {
    memset(mine, 0, (size_t)L);
    for (i = 0; i < nm; i++) mine[i] = (unsigned char)v[i];
    if ((st = muon__allgather(opt, mine, pl->flags, (size_t)L, "muon_step: agreeing on skipped matrices")) != MUON_OK)
      return st;
    for (g = 0; g < pl->n_globals; g++) {
      muon__global *x = &pl->globals[g];
      for (j = 0; j < x->n_holders; j++)
        if (pl->flags[(size_t)x->holder_ranks[j] * L + muon__holder_at(pl, x, j).local]) x->skip = 1;
    }
  }
  for (i = 0; i < nm; i++) {
    muon__matrix *x = &opt->matrices[i];
    x->skip = !x->size || x->global < 0 || pl->globals[x->global].skip;
  }
  /* An AdamW param one rank skips is skipped on every rank that holds a piece of it (matched by
     name), so replicas and shards keep one state. */
  if (pl->any_adamw_skip && pl->max_adamw) {
    uint64_t *mine_names = muon__adamw_mine(opt);
    int n = 0;
    for (i = 0; i < opt->n_adamw && n < pl->max_adamw; i++) if (v[nm + i]) mine_names[n++] = opt->adamw[i].name_hash;
    return muon__adamw_skip_named(opt, "muon_step: agreeing on skipped AdamW params");
  }
  return MUON_OK;
}


/* ---- >>impl-xfer Exchanges: one alltoallv each, its wire format, staging, the communication thread ---- */
/* A failure of this rank's own work (the compute backend) during the rounds does not stop the
   rank: it keeps taking part in every collective, with whatever its buffers hold, so that its
   peers are not left waiting, and reports the failure at the commit vote. Only a failed
   collective stops the rounds at once. */
static void muon__local(muon_optimizer *opt, muon_status st) {
  if (st != MUON_OK && opt->step_status == MUON_OK) opt->step_status = st;
}

/* The exchange's number format: bf16 when asked, or (AUTO) when no bit changes: every group's
   Newton-Schulz rounds its input to bf16 first and returns bf16 values, and no NorMuon rescales
   O after it. */
static int muon__wire_bf16(const muon_optimizer *opt) {
  int g;
  if (opt->dist.wire != MUON_WIRE_AUTO) return opt->dist.wire == MUON_WIRE_BF16;
  for (g = 0; g < opt->n_groups; g++)
    if (opt->groups[g].precision != MUON_PRECISION_BF16 || opt->groups[g].normuon != MUON_NORMUON_OFF) return 0;
  for (g = 0; g < opt->plan.n_globals; g++)   /* parts are summed in fp32 before any rounding */
    if (opt->plan.globals[g].on_owner) return 0;
  return 1;
}

/* One exchange's fp32 payload to or from its bf16 messages, by the compute backend's cast, one
   call per peer: to_wire: send -> wire_send, else wire_recv -> recv. */
static void muon__wire_cast(muon_optimizer *opt, muon__xfer *x, int to_wire) {
  int P = opt->plan.P, p;
  const size_t *cnt = x->cnt, *wire = x->wire;
  for (p = 0; p < P && opt->step_status == MUON_OK; p++) {
    if (to_wire && cnt[p])
      muon__local(opt, muon__compute_cast(opt, x->wire_send + wire[P + p], MUON_DTYPE_BF16, x->send + cnt[P + p],
                                          MUON_DTYPE_FP32, cnt[p], x->op));
    else if (!to_wire && cnt[2 * P + p])
      muon__local(opt, muon__compute_cast(opt, x->recv + cnt[3 * P + p], MUON_DTYPE_FP32,
                                          x->wire_recv + wire[3 * P + p], MUON_DTYPE_BF16, cnt[2 * P + p], x->op));
  }
}

/* What the collective sends from and receives into: host copies when staged, else the bf16
   messages or the fp32 payload. */
static float *muon__xfer_src(const muon__plan *pl, const muon__xfer *x) {
  return pl->stage ? x->host_send : x->bf16 ? x->wire_send : x->send;
}
static float *muon__xfer_dst(const muon__plan *pl, const muon__xfer *x) {
  return pl->stage ? x->host_recv : x->bf16 ? x->wire_recv : x->recv;
}

/* Before the collective, on the step's thread: the counts on the wire (per peer ceil(n / 2)
   float slots in bf16), the casts and the staging copy. A failure here goes to muon__local: the
   collective still runs, so that every rank joins every collective. */
static void muon__xfer_begin(muon_optimizer *opt, muon__xfer *x, const char *op) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, p;
  x->op = op;
  x->st = MUON_OK;
  x->error[0] = '\0';
  x->done = 0;
  if (x->bf16) {
    for (p = 0; p < P; p++) {
      x->wire[p] = (x->cnt[p] + 1) / 2;
      x->wire[2 * P + p] = (x->cnt[2 * P + p] + 1) / 2;
    }
    muon__prefix(x->wire + P, x->wire, P);
    muon__prefix(x->wire + 3 * P, x->wire + 2 * P, P);
    muon__wire_cast(opt, x, 1);
  } else {
    memcpy(x->wire, x->cnt, 4 * (size_t)P * sizeof(size_t));
  }
  if (pl->stage && opt->step_status == MUON_OK) {
    size_t sent = x->wire[2 * P - 1] + x->wire[P - 1];   /* last displacement + count */
    muon_status st =
        muon__compute_copy(opt, x->host_send, x->bf16 ? x->wire_send : x->send, sent * sizeof(float), 1, 0, op);
    muon__local(opt, st == MUON_OK ? muon__sync(opt, op) : st);
  }
}

/* x's failure st, with the communicator's message, read while no other call can overwrite it. */
static void muon__xfer_failed(muon_optimizer *opt, muon__xfer *x, muon_status st) {
  const char *native = muon__comm_error(opt);
  x->st = st;
  snprintf(x->error, sizeof x->error, "%s", native && *native ? native : muon_status_string(st));
}

/* The collective alone: all the communication thread runs; it touches x and the communicator
   only. Overlapped on a communicator's own queue, only started: muon__xfer_join ends it. */
static void muon__xfer_run(muon_optimizer *opt, muon__xfer *x) {
  const muon__plan *pl = &opt->plan;
  muon_status st;
  st = muon__comm_exchange(opt, muon__xfer_src(pl, x), x->wire, muon__xfer_dst(pl, x), &x->ticket);
  if (st == MUON_OK && !pl->side) st = muon__comm_join(opt, x->ticket);   /* joined later on the side */
  x->unjoined = pl->side && st == MUON_OK;
  if (st != MUON_OK) muon__xfer_failed(opt, x, st);
}

/* The compute queue waits for x's exchange on the communicator's own queue (on the device). */
static void muon__xfer_join(muon_optimizer *opt, muon__xfer *x) {
  muon_status st;
  if (!x->unjoined) return;
  x->unjoined = 0;
  if ((st = muon__comm_join(opt, x->ticket)) != MUON_OK && x->st == MUON_OK) muon__xfer_failed(opt, x, st);
}

/* After the collective, on the step's thread: its accounting, its failure, the staging copy
   back and the casts. */
static muon_status muon__xfer_end(muon_optimizer *opt, muon__xfer *x) {
  muon__plan *pl = &opt->plan;
  int P = pl->P;
  muon__count_alltoallv(opt, x->wire, 0);
  if (x->st != MUON_OK) return muon__comm_fail_text(opt, x->st, x->op, x->error);
  if (pl->stage && opt->step_status == MUON_OK) {
    size_t got = x->wire[4 * P - 1] + x->wire[3 * P - 1];
    muon__local(
        opt, muon__compute_copy(opt, x->bf16 ? x->wire_recv : x->recv, x->host_recv, got * sizeof(float), 0, 1, x->op));
  }
  if (x->bf16) muon__wire_cast(opt, x, 0);
  return MUON_OK;
}

/* The communication thread (muon_dist_config.async): collectives in the order they were handed
   over, one at a time, concurrently with the step's thread. After a failure it runs no more of
   this step's (each then fails with the first one's status): as without it, a rank stops at its
   first failed collective. */
#if MUON__POOL
struct muon__comm_thread {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  muon_optimizer *opt;
  muon__xfer *queue[2 * MUON__MAX_PREFETCH + 8];
  int head, tail, stop, failed;
};
#define MUON__QUEUE_CAP (2 * MUON__MAX_PREFETCH + 8)

static void *muon__comm_main(void *arg) {
  muon__comm_thread *t = (muon__comm_thread *)arg;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    muon__xfer *x;
    while (!t->stop && t->head == t->tail) pthread_cond_wait(&t->cv, &t->mu);
    if (t->head == t->tail) break;
    x = t->queue[t->head % MUON__QUEUE_CAP];
    if (t->failed) {
      x->st = (muon_status)t->failed;
      snprintf(x->error, sizeof x->error, "not run: an earlier exchange of this step failed");
    } else {
      pthread_mutex_unlock(&t->mu);
      muon__xfer_run(t->opt, x);
      pthread_mutex_lock(&t->mu);
      if (x->st != MUON_OK) t->failed = (int)x->st;
    }
    x->done = 1;
    t->head++;
    pthread_cond_broadcast(&t->cv);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

static muon_status muon__comm_thread_start(muon_optimizer *opt, char *msg, size_t size) {
  muon__comm_thread *t = (muon__comm_thread *)muon__alloc(&opt->allocator, sizeof *t);
  int err;
  if (!t) {
    snprintf(msg, size, "MUON_ERR_NOMEM: muon_create: allocating the communication thread failed");
    return MUON_ERR_NOMEM;
  }
  memset(t, 0, sizeof *t);
  t->opt = opt;
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  if ((err = pthread_create(&t->thread, NULL, muon__comm_main, t)) != 0) {
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    muon__free(&opt->allocator, t);
    snprintf(msg, size, "MUON_ERR_NOMEM: muon_create: starting the communication thread failed: %s", strerror(err));
    return MUON_ERR_NOMEM;
  }
  opt->comm_thread = t;
  return MUON_OK;
}

static void muon__comm_thread_stop(muon_optimizer *opt) {
  muon__comm_thread *t = opt->comm_thread;
  if (!t) return;
  pthread_mutex_lock(&t->mu);
  t->stop = 1;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  pthread_join(t->thread, NULL);
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->mu);
  muon__free(&opt->allocator, t);
  opt->comm_thread = NULL;
}

/* The collective of x: handed to the communication thread, or run here. */
static void muon__xfer_start(muon_optimizer *opt, muon__xfer *x) {
  muon__comm_thread *t = opt->plan.pipelined ? opt->comm_thread : NULL;
  if (!t) { muon__xfer_run(opt, x); x->done = 1; return; }
  pthread_mutex_lock(&t->mu);
  t->queue[t->tail % MUON__QUEUE_CAP] = x;
  t->tail++;
  x->queued = 1;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

static void muon__xfer_wait(muon_optimizer *opt, muon__xfer *x) {
  muon__comm_thread *t = opt->comm_thread;
  if (!x->queued) return;
  pthread_mutex_lock(&t->mu);
  while (!x->done) pthread_cond_wait(&t->cv, &t->mu);
  pthread_mutex_unlock(&t->mu);
  x->queued = 0;
}

/* Before the step returns: nothing of it may still be queued; the next step starts afresh. */
static void muon__comm_drain(muon_optimizer *opt) {
  muon__comm_thread *t = opt->comm_thread;
  int i;
  if (!t) return;
  for (i = 0; opt->plan.xfers && i < opt->plan.n_xfers; i++) muon__xfer_wait(opt, &opt->plan.xfers[i]);
  pthread_mutex_lock(&t->mu);
  t->failed = 0;
  pthread_mutex_unlock(&t->mu);
}
#else
static muon_status muon__comm_thread_start(muon_optimizer *opt, char *msg, size_t size) {
  (void)opt;
  snprintf(msg, size, "MUON_ERR_ARG: this build has no threads");
  return MUON_ERR_ARG;
}
static void muon__comm_thread_stop(muon_optimizer *opt) { (void)opt; }
static void muon__xfer_start(muon_optimizer *opt, muon__xfer *x) { muon__xfer_run(opt, x); x->done = 1; }
static void muon__xfer_wait(muon_optimizer *opt, muon__xfer *x) { (void)opt; (void)x; }
static void muon__comm_drain(muon_optimizer *opt) { (void)opt; }
#endif

/* Waits for x's collective, then finishes it (muon__xfer_end). */
static muon_status muon__xfer_finish(muon_optimizer *opt, muon__xfer *x) {
  muon__xfer_wait(opt, x);
  muon__xfer_join(opt, x);
  return muon__xfer_end(opt, x);
}

/* ---- >>impl-rounds Rounds: gather U to the owners, Newton-Schulz there, O back to every holder ---- */
/* NorMuon on the owner: O of global x (its NS operand) and its v, the new v staged for the
   commit (muon__normuon). */
static muon_status muon__normuon_apply(muon_optimizer *opt, const muon__global *x, float *operand) {
  const muon_hparams *hp = muon__global_hparams(opt, x);
  const muon__matrix *own = &opt->matrices[x->local];
  int m = x->rows < x->cols ? x->rows : x->cols, n = x->rows < x->cols ? x->cols : x->rows, per_column;
  if (!muon__normuon_owned(opt, own)) return MUON_OK;
  muon__normuon_axis(hp, x->rows, x->cols, &per_column);
  MUON__TRY(muon__compute_normuon(opt, operand, m, n, per_column,
                                              own->normuon, own->normuon + own->normuon_len, hp, "muon_step: NorMuon"));
  return MUON_OK;
}

/* Newton-Schulz of round r's owned operands: batch by batch (see muon__plan_batches), or the
   whole round in one call where the backend takes several shapes at once (newton_schulz_many).
   Then NorMuon and the non-finite check of each result, read at the commit. */
static muon_status muon__orthogonalize_round(muon_optimizer *opt, int r) {
  muon__plan *pl = &opt->plan;
  const int start = pl->order_start[r], end = pl->order_start[r + 1], many = muon__ns_many(opt);
  int i, k, count = 0;
  for (i = start; i < end; i++) count += !pl->globals[pl->order[i]].skip;
  for (i = start, k = 0; i < end; ) {
    const muon__global *x = &pl->globals[pl->order[i]];
    int m = x->rows < x->cols ? x->rows : x->cols, n = x->rows < x->cols ? x->cols : x->rows, b = 0, e;
    size_t ws;
    if (x->skip) { i++; continue; }
    while (i + b < end && !pl->globals[pl->order[i + b]].skip && muon__same_batch(&pl->globals[pl->order[i + b]], x))
      b++;
    if (!many) {
      MUON__TRY(muon__compute_newton_schulz(opt, pl->gathered + x->xoff, b, m, n, muon__global_hparams(opt, x),
                                            pl->ns_ws, "muon_step: Newton-Schulz"));
    }
    for (e = 0; many && e < b; e++, k++) {   /* the round's operands, for one call */
      pl->many_X[k] = pl->gathered + pl->globals[pl->order[i + e]].xoff;
      pl->many_m[k] = m;
      pl->many_n[k] = n;
      pl->many_hp[k] = muon__global_hparams(opt, x);
    }
    opt->stats.ns_calls += b;
    opt->stats.ns_batches++;
    ws = muon__compute_ns_workspace(opt, many ? count : b, m, n, muon__global_hparams(opt, x));
    if (ws > opt->stats.ns_workspace_bytes) opt->stats.ns_workspace_bytes = ws;
    i += b;
  }
  if (many && count) {
    MUON__TRY(muon__compute_newton_schulz_many(opt, count, pl->many_X, pl->many_m, pl->many_n,
                                                           pl->many_hp, pl->ns_ws, "muon_step: Newton-Schulz"));
  }
  for (i = start; i < end; i++) {
    const muon__global *x = &pl->globals[pl->order[i]];
    muon_status st;
    if (x->skip) continue;
    if ((st = muon__normuon_apply(opt, x, pl->gathered + x->xoff)) != MUON_OK) return st;
    MUON__TRY(muon__compute_nonfinite(opt, pl->gathered + x->xoff, MUON_DTYPE_FP32, (size_t)x->rows * x->cols,
                                      &pl->out_flags[pl->order[i]], "muon_step: checking Newton-Schulz outputs"));
  }
  return MUON_OK;
}

/* Counts of one direction of round r: out (U from sources to owners) or back (O to holders).
   Every step: it visits the holders of the matrices this rank owns and its own pieces only (a
   world of 16,384 ranks has millions of pieces); whether the round moves anything at all, which
   every rank must answer alike, comes from each matrix's moves_out and moves_back. */
static int muon__round_counts(muon_optimizer *opt, int r, int back, size_t *cnt) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, me = pl->me, k, j, any = 0;
  size_t *dsp = cnt + P, *rcnt = dsp + P, *rdsp = rcnt + P;
  memset(cnt, 0, 4 * (size_t)P * sizeof(size_t));
  for (k = pl->round_start[r]; k < pl->round_start[r + 1]; k++) {
    const muon__global *x = &pl->globals[pl->round_order[k]];
    if (x->skip) continue;
    any |= back ? x->moves_back : x->moves_out;   /* the same on every rank: skips are agreed */
    if (x->owner == me)   /* the owner receives, or sends back, every other holder's piece */
      for (j = 0; j < x->n_holders; j++) {
        const muon__holder *o = &x->holders[j];
        if (back ? o->rank == me : o->rank != o->source || o->source == me) continue;
        (back ? cnt : rcnt)[o->rank] += muon__piece_size(&x->pieces[j]);
      }
    else if (x->mine >= 0 && (back || x->my_source == me))   /* a holder sends its piece, or gets it back */
      (back ? rcnt : cnt)[x->owner] += muon__piece_size(&opt->matrices[x->local].piece);
  }
  muon__prefix(dsp, cnt, P);
  muon__prefix(rdsp, rcnt, P);
  return any;
}

/* n elements of src (dtype) as fp32 at dst, both backend memory. */
static muon_status muon__widen(muon_optimizer *opt, float *dst, const void *src, muon_dtype dtype, size_t n,
                               const char *op) {
  if (!n) return MUON_OK;
  if (dtype == MUON_DTYPE_FP32) MUON__TRY(muon__compute_copy(opt, dst, src, n * sizeof(float), 0, 0, op));
  else MUON__TRY(muon__compute_cast(opt, dst, MUON_DTYPE_FP32, src, dtype, n, op));
  return MUON_OK;
}

/* A Partial matrix's part of the gradient, as it is (in fp32): the owner adds the parts up. */
static muon_status muon__grad_part(muon_optimizer *opt, const muon__matrix *x, float *dst) {
  return muon__widen(opt, dst, x->grad, x->grad_dtype, x->size, "muon_step: a gradient part to fp32");
}

/* U of every piece this rank sends to an owner (of a Partial matrix: its part of the gradient),
   in round order per destination. */
static muon_status muon__fill_send(muon_optimizer *opt, int r, muon__xfer *out) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, me = pl->me, k;
  size_t *cur = pl->counts + 8 * (size_t)P;
  muon_status st;
  memcpy(cur, out->cnt + P, (size_t)P * sizeof(size_t));
  for (k = pl->round_start[r]; k < pl->round_start[r + 1]; k++) {
    const muon__global *x = &pl->globals[pl->round_order[k]];
    if (x->skip || x->mine < 0 || x->my_source != me || x->owner == me) continue;
    st = x->on_owner ? muon__grad_part(opt, &opt->matrices[x->local], out->send + cur[x->owner])
                      : muon__u_piece(opt, &opt->matrices[x->local], out->send + cur[x->owner]);
    if (st != MUON_OK) return st;
    cur[x->owner] += muon__piece_size(&opt->matrices[x->local].piece);
  }
  return MUON_OK;
}

/* The owner of a Partial matrix: the parts of its gradient added up, part 0 first (received
   pieces at x->at in `out`, its own in its stash slot), in the operand; that sum, row-major, is
   kept for the commit; then U from it and the whole momentum, into the operand. Adding is the
   momentum slot with mu = 1 (SGD: B' = 1 * B + g is exactly B + g on every backend). */
static muon_status muon__reduce_parts(muon_optimizer *opt, const muon__global *x, const muon__xfer *out) {
  muon__plan *pl = &opt->plan;
  const muon__matrix *own = &opt->matrices[x->local];
  size_t full = (size_t)x->rows * x->cols;
  float *X = pl->gathered + x->xoff, *G = pl->reduced + x->roff;
  muon_momentum_args add, a = muon__momentum_args(opt, own);
  int p, j, n;
  muon_status st;
  memset(&add, 0, sizeof add);
  add.mu = 1.0f; add.sgd = 1; add.grad_scale = 1.0f; add.grad_dtype = MUON_DTYPE_FP32;
  if ((st = muon__grad_part(opt, own, pl->stash + own->stash)) != MUON_OK) return st;
  for (p = 0; p < x->parts; p++) {
    float *dst = p ? pl->scratch : X;
    for (j = 0, n = 0; j < x->n_holders; j++) {
      const muon__holder *h = &x->holders[j];
      if (h->part != p || h->rank != h->source || h->rank == pl->me) continue;
      pl->ops[n] = muon__piece_op(x, &x->pieces[j], x->at[j]);
      pl->ops[n++].operand = 0;
    }
    if ((st = muon__pack(opt, n, out->recv, dst, 1)) != MUON_OK) return st;
    if (x->holders[x->mine].part == p) {
      pl->ops[0] = muon__piece_op(x, &own->piece, own->stash);
      pl->ops[0].operand = 0;
      if ((st = muon__pack(opt, 1, pl->stash, dst, 1)) != MUON_OK) return st;
    }
    if (p)
      MUON__TRY(muon__compute_momentum(opt, full, X, pl->scratch, &add, 1, NULL, "muon_step: adding gradient parts"));
  }
  pl->ops[0] = muon__whole(x->rows, x->cols, 0, 0);
  if ((st = muon__pack(opt, 1, G, X, 0)) != MUON_OK) return st;
  a.grad_scale *= x->part_scale;
  a.grad_dtype = MUON_DTYPE_FP32;
  MUON__TRY(muon__state_momentum(opt, own, 0, full, G, &a, 0, pl->scratch, "muon_step: momentum"));
  return muon__pack(opt, 1, pl->scratch, X, 1);
}

/* The owner's part: operands from its own piece and the received ones (out), Newton-Schulz,
   then O cut into its own stash and into back's send buffer for every other holder. */
static muon_status muon__owner_work(muon_optimizer *opt, int r, const muon__xfer *out, muon__xfer *back) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, me = pl->me, k, j, n;
  size_t *cur = pl->counts + 8 * (size_t)P, xend = 0;
  muon_status st;
  memcpy(cur, out->cnt + 3 * (size_t)P, (size_t)P * sizeof(size_t));
  for (k = pl->round_start[r]; k < pl->round_start[r + 1]; k++) {   /* where each received piece sits */
    const muon__global *x = &pl->globals[pl->round_order[k]];
    if (x->skip || x->owner != me) continue;
    for (j = 0; j < x->n_holders; j++) {
      const muon__holder *h = &x->holders[j];
      if (h->rank != h->source || h->source == me) continue;
      x->at[j] = cur[h->rank];
      cur[h->rank] += muon__piece_size(&x->pieces[j]);
    }
  }
  for (k = pl->round_start[r]; k < pl->round_start[r + 1]; k++) {
    const muon__global *x = &pl->globals[pl->round_order[k]];
    if (x->skip || x->owner != me) continue;
    if (x->xoff + (size_t)x->rows * x->cols > xend) xend = x->xoff + (size_t)x->rows * x->cols;
    if (x->on_owner && (st = muon__reduce_parts(opt, x, out)) != MUON_OK) return st;
  }
  for (k = pl->round_start[r], n = 0; k < pl->round_start[r + 1]; k++) {
    const muon__global *x = &pl->globals[pl->round_order[k]];
    const muon__matrix *own;
    if (x->skip || x->owner != me || x->on_owner) continue;
    own = &opt->matrices[x->local];
    if ((st = muon__u_piece(opt, own, pl->stash + own->stash)) != MUON_OK) return st;
    pl->ops[n++] = muon__piece_op(x, &own->piece, own->stash);
  }
  if ((st = muon__pack(opt, n, pl->stash, pl->gathered, 1)) != MUON_OK) return st;
  for (k = pl->round_start[r], n = 0; k < pl->round_start[r + 1]; k++) {
    const muon__global *x = &pl->globals[pl->round_order[k]];
    if (x->skip || x->owner != me || x->on_owner) continue;
    for (j = 0; j < x->n_holders; j++) {
      const muon__holder *h = &x->holders[j];
      if (h->rank != h->source || h->source == me) continue;
      pl->ops[n++] = muon__piece_op(x, &x->pieces[j], x->at[j]);
    }
  }
  if ((st = muon__pack(opt, n, out->recv, pl->gathered, 1)) != MUON_OK) return st;
  if ((st = muon__orthogonalize_round(opt, r)) != MUON_OK) return st;
  if (xend * sizeof(float) > opt->stats.gathered_bytes) opt->stats.gathered_bytes = xend * sizeof(float);
  for (k = pl->round_start[r], n = 0; k < pl->round_start[r + 1]; k++) {
    const muon__global *x = &pl->globals[pl->round_order[k]];
    const muon__matrix *own;
    if (x->skip || x->owner != me) continue;
    own = &opt->matrices[x->local];
    pl->ops[n++] = muon__piece_op(x, &own->piece, own->stash);
  }
  if ((st = muon__pack(opt, n, pl->stash, pl->gathered, 0)) != MUON_OK) return st;
  memcpy(cur, back->cnt + P, (size_t)P * sizeof(size_t));
  for (k = pl->round_start[r], n = 0; k < pl->round_start[r + 1]; k++) {
    const muon__global *x = &pl->globals[pl->round_order[k]];
    if (x->skip || x->owner != me) continue;
    for (j = 0; j < x->n_holders; j++) {
      const muon__holder *h = &x->holders[j];
      if (h->rank == me) continue;
      pl->ops[n++] = muon__piece_op(x, &x->pieces[j], cur[h->rank]);
      cur[h->rank] += muon__piece_size(&x->pieces[j]);
    }
  }
  return muon__pack(opt, n, back->send, pl->gathered, 0);
}

/* O of every piece received from an owner (back), into the stash. */
static muon_status muon__receive(muon_optimizer *opt, int r, const muon__xfer *back) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, me = pl->me, k;
  size_t *cur = pl->counts + 8 * (size_t)P;
  memcpy(cur, back->cnt + 3 * (size_t)P, (size_t)P * sizeof(size_t));
  for (k = pl->round_start[r]; k < pl->round_start[r + 1]; k++) {
    const muon__global *x = &pl->globals[pl->round_order[k]];
    const muon__matrix *mine;
    if (x->skip || x->owner == me || x->mine < 0) continue;
    mine = &opt->matrices[x->local];
    MUON__TRY(muon__compute_copy(opt, pl->stash + mine->stash, back->recv + cur[x->owner],
                                             mine->size * sizeof(float), 0, 0, "muon_step: receiving O"));
    cur[x->owner] += mine->size;
  }
  return MUON_OK;
}

/* Which exchange carries round r: in the debug setting the round's two share one buffer set;
   overlapped, gathers cycle through prefetch + 1 sets and redistributions through pl->backs more. */
static muon__xfer *muon__out_xfer(const muon__plan *pl, int r) {
  return &pl->xfers[pl->pipelined ? r % (pl->prefetch + 1) : 0];
}
static muon__xfer *muon__back_xfer(const muon__plan *pl, int r) {
  return &pl->xfers[pl->pipelined ? pl->prefetch + 1 + r % pl->backs : 1];
}

/* Round r's gather: the counts, U into the send buffer, the collective started. */
static void muon__gather_start(muon_optimizer *opt, int r) {
  muon__xfer *out = muon__out_xfer(&opt->plan, r);
  out->any = muon__round_counts(opt, r, 0, out->cnt);
  if (opt->step_status == MUON_OK) muon__local(opt, muon__fill_send(opt, r, out));
  if (!out->any) return;
  muon__xfer_begin(opt, out, "muon_step: gather (U to owners)");
  muon__xfer_start(opt, out);
}

/* Round r's owner work on its gathered U, then its redistribution started. */
static void muon__redistribute_start(muon_optimizer *opt, int r) {
  const muon__plan *pl = &opt->plan;
  muon__xfer *back = muon__back_xfer(pl, r);
  back->any = muon__round_counts(opt, r, 1, back->cnt);
  if (opt->step_status == MUON_OK) muon__local(opt, muon__owner_work(opt, r, muon__out_xfer(pl, r), back));
  if (!back->any) return;
  muon__xfer_begin(opt, back, "muon_step: redistribute (O to holders)");
  muon__xfer_start(opt, back);
}

/* Round r's O, once its redistribution finished, into the stash. */
static muon_status muon__redistribute_finish(muon_optimizer *opt, int r) {
  muon__xfer *back = muon__back_xfer(&opt->plan, r);
  muon_status st;
  if (back->any && (st = muon__xfer_finish(opt, back)) != MUON_OK) return st;
  if (opt->step_status == MUON_OK) muon__local(opt, muon__receive(opt, r, back));
  return MUON_OK;
}

/* Every round: U pieces to owners (gather) -> Newton-Schulz on the owners -> O back to every
   holder (redistribute). In the debug setting one round after the other, each step of it in
   sequence. Overlapped, the gathers of rounds r + 1 .. r + prefetch are already under way
   while round r is orthogonalised, and round r's redistribution while round r + 1 is (on a
   communicator's own queue, where exchanges are in flight together, while rounds up to
   r + backs - 1 are): the collectives still go in one order on every rank, G0 .. G(prefetch),
   then per round its redistribution and the next gather; async runs them on the communication
   thread or the communicator's queue. The first failed collective ends the loop, as it would
   one at a time; nothing is left queued. */
static muon_status muon__exchange_rounds(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  int R = pl->n_rounds, D = pl->prefetch, B = pl->backs, r;
  muon_status st = MUON_OK;
  if (!pl->pipelined) {
    for (r = 0; r < R && st == MUON_OK; r++) {
      muon__xfer *out = muon__out_xfer(pl, r);
      muon__gather_start(opt, r);
      if (out->any && (st = muon__xfer_finish(opt, out)) != MUON_OK) break;
      muon__redistribute_start(opt, r);
      st = muon__redistribute_finish(opt, r);
    }
    return st;
  }
  for (r = 0; r <= D && r < R; r++) muon__gather_start(opt, r);
  for (r = 0; r < R && st == MUON_OK; r++) {
    muon__xfer *out = muon__out_xfer(pl, r);
    if (out->any && (st = muon__xfer_finish(opt, out)) != MUON_OK) break;
    muon__redistribute_start(opt, r);
    if (r + D + 1 < R) muon__gather_start(opt, r + D + 1);
    if (r + 1 >= B) st = muon__redistribute_finish(opt, r + 1 - B);
  }
  for (r = R + 1 - B > 0 ? R + 1 - B : 0; st == MUON_OK && r < R; r++) st = muon__redistribute_finish(opt, r);
  muon__comm_drain(opt);
  for (r = 0; r < pl->n_xfers; r++) muon__xfer_join(opt, &pl->xfers[r]);   /* after a failure */
  return st;
}

/* The escape hatch: the user's gather / redistribute, one matrix at a time, in global order.
   Their buffers are the compute backend's memory, synchronised before each call. */
static muon_status muon__custom_exchange(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  int me = pl->me, g;
  muon_status st;
  for (g = 0; g < pl->n_globals; g++) {
    const muon__global *x = &pl->globals[g];
    muon_matrix_info info;
    float *local = NULL, *full = x->owner == me ? pl->gathered : NULL;
    size_t mn = (size_t)x->rows * x->cols;
    if (x->skip) continue;
    muon__info(opt, g, &info);
    if (x->local >= 0 && opt->matrices[x->local].size) {
      local = pl->stash + opt->matrices[x->local].stash;
      if ((st = muon__u_piece(opt, &opt->matrices[x->local], local)) != MUON_OK) return st;
    }
    if (opt->device && (st = muon__sync(opt, "muon_step: before muon_dist_config.gather")) != MUON_OK) return st;
    if ((st = opt->dist.gather(opt->dist.state, &info, local, full, x->owner)) != MUON_OK)
      return muon__fail(opt, st, "muon_dist_config.gather of matrix '%s' (global %d) returned %s; nothing was applied",
                        x->name, g, muon_status_string(st));
    if (full) {
      pl->ops[0] = muon__whole(x->rows, x->cols, 0, mn);
      if ((st = muon__pack(opt, 1, full, full, 1)) != MUON_OK) return st;
      MUON__TRY(muon__compute_newton_schulz(opt, full + mn, 1, x->rows < x->cols ? x->rows : x->cols,
                                            x->rows < x->cols ? x->cols : x->rows, muon__global_hparams(opt, x),
                                            pl->ns_ws, "muon_step: Newton-Schulz"));
      MUON__TRY(muon__compute_nonfinite(opt, full + mn, MUON_DTYPE_FP32, mn, &pl->out_flags[g],
                                        "muon_step: checking Newton-Schulz outputs"));
      if ((st = muon__normuon_apply(opt, x, full + mn)) != MUON_OK) return st;
      opt->stats.ns_calls++;
      opt->stats.ns_batches++;
      if ((st = muon__pack(opt, 1, full, full, 0)) != MUON_OK) return st;
      if (2 * mn * sizeof(float) > opt->stats.gathered_bytes) opt->stats.gathered_bytes = 2 * mn * sizeof(float);
    }
    if (opt->device && (st = muon__sync(opt, "muon_step: before muon_dist_config.redistribute")) != MUON_OK) return st;
    if ((st = opt->dist.redistribute(opt->dist.state, &info, full, local, x->owner)) != MUON_OK)
      return muon__fail(opt, st,
                        "muon_dist_config.redistribute of matrix '%s' (global %d) returned %s; nothing was applied",
                        x->name, g, muon_status_string(st));
  }
  return MUON_OK;
}

/* ---- >>impl-adamw AdamW params: stochastic-rounding seeds and the Partial (ZeRO-1) exchange ---- */
/* The stochastic-rounding seed of one matrix or AdamW param at this step, for matrices and AdamW
   params alike: the user's seed, the step and the full name's hash (a stack's slice with its
   "[i]"), nothing of the world or the layout (not the layout key either: a pipeline stage's key
   is its rank), so every layout draws one device's bits; element e of the full tensor then gets
   muon_random_bits(seed, e). */
static unsigned long long muon__sr_seed(const muon_optimizer *opt, unsigned long long name_hash) {
  unsigned char buf[24], *p = buf;
  muon__put64(&p, (uint64_t)opt->seed);
  muon__put64(&p, (uint64_t)opt->stats.steps);
  muon__put64(&p, (uint64_t)name_hash);
  return muon__fnv1a(buf, sizeof buf);
}

/* torch.optim.AdamW's bias corrections for this step. */
static muon_adamw_args muon__adamw_args(const muon_optimizer *opt, const muon__adamw *p) {
  const muon_adamw_hparams *hp = &opt->adamw_groups[p->group];
  double t = (double)(p->step + 1);
  muon_adamw_args a;
  a.beta1 = hp->beta1;
  a.beta2 = hp->beta2;
  a.eps = hp->eps;
  a.decay = (float)(1.0 - (double)hp->lr * hp->weight_decay);
  a.step_size = (float)((double)hp->lr / (1.0 - pow((double)hp->beta1, t)));
  a.bc2_sqrt = (float)sqrt(1.0 - pow((double)hp->beta2, t));
  a.grad_scale = opt->grad_scale;
  a.grad_dtype = p->grad_dtype;
  a.param_dtype = p->param_dtype;
  a.mirror = p->mirror;
  a.rounding = opt->rounding;
  a.seed = muon__sr_seed(opt, p->name_hash);
  a.offset = p->offset;   /* a ZeRO piece draws the full tensor's bits */
  a.cautious = hp->cautious_wd;
  return a;
}

/* Chunk k of a Partial AdamW param's piece: [lo, hi). */
static void muon__aw_chunk(const muon__adamw *a, int k, size_t *lo, size_t *hi) {
  long long x, y;
  muon__chunk((long long)a->size, a->parts, k, &x, &y);
  *lo = (size_t)x;
  *hi = (size_t)y;
}

/* Counts of the AdamW exchange: gather 0 (reduce-scatter: chunk k of this rank's part to part
   k's rank) or 1 (all-gather: this rank's new chunk to every other part's rank). */
static void muon__aw_counts(muon_optimizer *opt, int all_gather) {
  muon__plan *pl = &opt->plan;
  size_t P = (size_t)pl->P, *cnt = pl->aw.cnt, lo, hi, mlo, mhi;
  int o, k;
  memset(cnt, 0, 4 * P * sizeof(size_t));
  for (o = 0; o < pl->n_aw; o++) {
    const muon__adamw *a = &opt->adamw[pl->aw_order[o]];
    if (a->skip) continue;
    muon__aw_chunk(a, a->part, &mlo, &mhi);
    for (k = 0; k < a->parts; k++) {
      int r = pl->adamw_members[a->members + k];
      if (k == a->part) continue;
      muon__aw_chunk(a, k, &lo, &hi);
      cnt[r] += all_gather ? mhi - mlo : hi - lo;
      cnt[2 * P + r] += all_gather ? hi - lo : mhi - mlo;
    }
  }
  muon__prefix(cnt + P, cnt, pl->P);
  muon__prefix(cnt + 3 * P, cnt + 2 * P, pl->P);
}

static muon_status muon__aw_collective(muon_optimizer *opt, const char *op) {
  muon__xfer *x = &opt->plan.aw;
  muon__xfer_begin(opt, x, op);
  muon__xfer_run(opt, x);
  return muon__xfer_finish(opt, x);
}

/* This rank's work between the two collectives: its chunk of every part summed, part 0 first
   (adding is the momentum slot with mu = 1, as for matrices), its non-finite flag set (read with
   the step's other checks, muon__aw_verdict), and AdamW on it into scratch. */
static muon_status muon__aw_update(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  size_t P = (size_t)pl->P, *cur = pl->counts + 8 * P, c, es;
  muon_momentum_args add;
  int o, k;
  muon_status st;
  memset(&add, 0, sizeof add);
  add.mu = 1.0f; add.sgd = 1; add.grad_scale = 1.0f;
  memcpy(cur, pl->aw.cnt + 3 * P, P * sizeof(size_t));
  for (o = 0; o < pl->n_aw; o++) {
    const muon__adamw *a = &opt->adamw[pl->aw_order[o]];
    float *sum = pl->aw_reduced + a->roff;
    if (a->skip) continue;
    c = a->hi - a->lo;
    for (k = 0; k < a->parts; k++) {
      int r = pl->adamw_members[a->members + k];
      const void *part = k == a->part ? (const void *)((const char *)a->grad + a->lo * muon__dtype_size(a->grad_dtype))
                                      : (const void *)(pl->aw.recv + cur[r]);
      add.grad_dtype = k == a->part ? a->grad_dtype : MUON_DTYPE_FP32;
      if (k == 0 && (st = muon__widen(opt, sum, part, add.grad_dtype, c,
                                      "muon_step: summing Partial AdamW gradients")) != MUON_OK)
        return st;
      if (k > 0 && c)
        MUON__TRY(
            muon__compute_momentum(opt, c, sum, part, &add, 1, NULL, "muon_step: summing Partial AdamW gradients"));
      if (k != a->part) cur[r] += c;
    }
    if (c)
      MUON__TRY(muon__compute_nonfinite(opt, sum, MUON_DTYPE_FP32, c, &pl->aw_flags[o],
                                        "muon_step: checking Partial AdamW gradients"));
  }
  for (o = 0; o < pl->n_aw; o++) {   /* AdamW on the chunk, into scratch: nothing is applied before the vote */
    int i = pl->aw_order[o];
    const muon__adamw *a = &opt->adamw[i];
    muon_adamw_args args;
    if (a->skip || a->hi == a->lo) continue;
    c = a->hi - a->lo;
    es = muon__dtype_size(a->param_dtype);
    MUON__TRY(muon__compute_copy(opt, pl->aw_param + a->roff, (const char *)a->param + a->lo * es, c * es, 0, 0,
                                 "muon_step: AdamW of a Partial param"));
    MUON__TRY(muon__state_copy(opt, pl->aw_m + a->roff, a->exp_avg, c, 0, "muon_step: AdamW of a Partial param"));
    MUON__TRY(muon__state_copy(opt, pl->aw_v + a->roff, a->exp_avg_sq, c, 0, "muon_step: AdamW of a Partial param"));
    args = muon__adamw_args(opt, a);
    args.grad_scale *= a->part_scale;
    args.grad_dtype = MUON_DTYPE_FP32;
    args.mirror = NULL;
    MUON__TRY(muon__compute_adamw(opt, c, pl->aw_param + a->roff, pl->aw_reduced + a->roff, pl->aw_m + a->roff,
                                  pl->aw_v + a->roff, &args, "muon_step: AdamW of a Partial param"));
  }
  return MUON_OK;
}

/* Its new chunk, in fp32, to every other part's rank (the all-gather's send buffer). */
static muon_status muon__aw_fill_gather(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  size_t P = (size_t)pl->P, *cur = pl->counts + 8 * P, c;
  int o, k;
  muon_status st;
  memcpy(cur, pl->aw.cnt + P, P * sizeof(size_t));
  for (o = 0; o < pl->n_aw; o++) {
    const muon__adamw *a = &opt->adamw[pl->aw_order[o]];
    if (a->skip) continue;
    c = a->hi - a->lo;
    for (k = 0; k < a->parts; k++) {
      int r = pl->adamw_members[a->members + k];
      if (k == a->part) continue;
      if ((st = muon__widen(opt, pl->aw.send + cur[r], pl->aw_param + a->roff, a->param_dtype, c,
                            "muon_step: sending Partial AdamW updates")) != MUON_OK)
        return st;
      cur[r] += c;
    }
  }
  return MUON_OK;
}

/* After the step's sync: a summed chunk that is not finite although its parts are (they were
   checked with the gradients) stops the step on every rank through the vote. */
static muon_status muon__aw_verdict(muon_optimizer *opt) {
  const muon__plan *pl = &opt->plan;
  int o;
  for (o = 0; o < pl->n_aw; o++) {
    const muon__adamw *a = &opt->adamw[pl->aw_order[o]];
    if (!a->skip && a->hi > a->lo && pl->aw_host_flags[o])
      return muon__fail(
          opt, MUON_ERR_NONFINITE,
          "muon_step: the summed gradient of Partial AdamW param '%s' (elements [%zu, %zu) of its piece) is not finite although its parts are: its sum overflows; nothing was applied",
          a->name, a->lo, a->hi);
  }
  return MUON_OK;
}

/* Every local Partial AdamW param's new values, whole, at its foff: its own chunk and the
   received ones. */
static muon_status muon__aw_assemble(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  size_t P = (size_t)pl->P, *cur = pl->counts + 8 * P, lo, hi;
  int o, k;
  muon_status st;
  memcpy(cur, pl->aw.cnt + 3 * P, P * sizeof(size_t));
  for (o = 0; o < pl->n_aw; o++) {
    const muon__adamw *a = &opt->adamw[pl->aw_order[o]];
    if (a->skip) continue;
    for (k = 0; k < a->parts; k++) {
      int r = pl->adamw_members[a->members + k];
      float *dst;
      muon__aw_chunk(a, k, &lo, &hi);
      dst = pl->aw_full + a->foff + lo;
      if (k == a->part) {
        if ((st = muon__widen(opt, dst, pl->aw_param + a->roff, a->param_dtype, hi - lo,
                              "muon_step: receiving Partial AdamW updates")) != MUON_OK)
          return st;
        continue;
      }
      if (hi > lo)
        MUON__TRY(muon__compute_copy(opt, dst, pl->aw.recv + cur[r], (hi - lo) * sizeof(float), 0, 0,
                                     "muon_step: receiving Partial AdamW updates"));
      cur[r] += hi - lo;
    }
  }
  return MUON_OK;
}

/* The step's AdamW exchange: reduce-scatter, the chunks' update, all-gather. Every rank joins
   both collectives when some rank has a Partial AdamW param; a local failure still joins them. */
static muon_status muon__adamw_exchange(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  size_t P = (size_t)pl->P, *cur = pl->counts + 8 * P, lo, hi;
  int o, k;
  muon_status st;
  if (!pl->any_adamw_partial) return MUON_OK;
  muon__aw_counts(opt, 0);
  memcpy(cur, pl->aw.cnt + P, P * sizeof(size_t));
  for (o = 0; o < pl->n_aw && opt->step_status == MUON_OK; o++) {
    const muon__adamw *a = &opt->adamw[pl->aw_order[o]];
    size_t es = muon__dtype_size(a->grad_dtype);
    if (a->skip) continue;
    for (k = 0; k < a->parts && opt->step_status == MUON_OK; k++) {
      int r = pl->adamw_members[a->members + k];
      if (k == a->part) continue;
      muon__aw_chunk(a, k, &lo, &hi);
      muon__local(opt, muon__widen(opt, pl->aw.send + cur[r], (const char *)a->grad + lo * es, a->grad_dtype, hi - lo,
                                   "muon_step: sending Partial AdamW gradients"));
      cur[r] += hi - lo;
    }
  }
  if ((st = muon__aw_collective(opt, "muon_step: reduce-scatter of Partial AdamW gradients")) != MUON_OK) return st;
  if (opt->step_status == MUON_OK) muon__local(opt, muon__aw_update(opt));
  muon__aw_counts(opt, 1);   /* whatever happened here: the peers expect these sizes */
  if (opt->step_status == MUON_OK) muon__local(opt, muon__aw_fill_gather(opt));
  if ((st = muon__aw_collective(opt, "muon_step: all-gather of Partial AdamW updates")) != MUON_OK) return st;
  if (opt->step_status == MUON_OK) muon__local(opt, muon__aw_assemble(opt));
  return MUON_OK;
}

/* ---- >>impl-commit Commit and vote: every rank applies, or none does ------------------------- */
static muon_apply_args muon__apply_args(const muon_optimizer *opt, const muon__matrix *x) {
  const muon_hparams *hp = &opt->groups[x->group];
  muon_apply_args a;
  a.decay = (float)(1.0 - (double)hp->lr * hp->weight_decay);
  a.cautious = hp->cautious_wd;
  a.step = muon__adjusted_lr(hp, x->rows, x->cols);
  a.param_dtype = x->param_dtype;
  a.mirror = x->mirror;
  a.rounding = opt->rounding;
  a.seed = muon__sr_seed(opt, x->name_hash);
  a.piece = muon__whole(x->rows, x->cols, 0, 0);
  a.piece.r0 = x->piece.r0; a.piece.c0 = x->piece.c0; a.piece.h = x->piece.h;
  a.piece.w = x->piece.w; a.piece.f0 = x->piece.f0; a.piece.f1 = x->piece.f1;
  return a;
}

/* The commit, tried first: every momentum, second moment, parameter and bf16 copy it would
   write, computed chunk by chunk into scratch by the same slots (so the same bits) and checked.
   A non-finite one is a non-finite verdict at the vote, as a non-finite NS output is, so a state
   the loader refuses is never written. Why recompute at the commit rather than keep the results:
   keeping them would cost a second copy of every state the step writes (AdamW's m, v and the
   parameters); this costs one chunk of scratch and one more element-wise pass. */
static muon_status muon__check_commit(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  const size_t C = pl->check_chunk;
  float *f0 = (float *)pl->check_ws, *f1 = f0 + C, *f2 = f1 + C;
  uint16_t *h0 = (uint16_t *)(void *)(f2 + C), *h1 = h0 + C;
  const char *op = "muon_step: checking the update";
  size_t lo, c, k, es;
  int i;
  if (!pl->n_checks) return MUON_OK;
  MUON__TRY(muon__compute_zero(opt, pl->checks, pl->n_checks * sizeof(int), op));
  for (i = 0; i < opt->n_matrices; i++) {
    const muon__matrix *x = &opt->matrices[i];
    muon_momentum_args m = muon__momentum_args(opt, x);
    muon_apply_args a = muon__apply_args(opt, x), b;
    int *fl = pl->checks + x->check;
    const void *grad = x->grad;
    size_t n = !muon__owner_momentum(x) ? x->size : 0;
    void *w = x->param_dtype == MUON_DTYPE_BF16 ? (void *)h0 : (void *)f2;
    if (x->skip) continue;
    if (muon__owner_momentum(x) && muon__owns(opt, x)) {   /* as muon__commit moves it */
      m.grad_scale *= x->part_scale;
      m.grad_dtype = MUON_DTYPE_FP32;
      grad = pl->reduced + pl->globals[x->global].roff;
      n = x->momentum_size;
    }
    for (lo = 0, k = 0; lo < n; lo += C, k++) {
      c = MUON__MIN(C, n - lo);
      MUON__TRY(muon__state_widen(opt, x, lo, c, f0, h0, op));
      MUON__TRY(muon__compute_momentum(opt, c, f0, (const char *)grad + lo * muon__dtype_size(m.grad_dtype), &m, 1,
                                       NULL, op));
      if (x->mfmt == MUON_MOMENTUM_BF16) {   /* as stored: a finite value past bf16's range rounds to Inf */
        MUON__TRY(muon__compute_cast(opt, h0, MUON_DTYPE_BF16, f0, MUON_DTYPE_FP32, c, op));
        MUON__TRY(muon__compute_nonfinite(opt, h0, MUON_DTYPE_BF16, c, fl + MUON__CHECKS * k, op));
      } else MUON__TRY(muon__compute_nonfinite(opt, f0, MUON_DTYPE_FP32, c, fl + MUON__CHECKS * k, op));
    }
    es = muon__dtype_size(x->param_dtype);
    for (lo = 0, k = 0; lo < x->size; lo += C, k++) {
      c = MUON__MIN(C, x->size - lo);
      b = a;
      b.piece.f0 += (long long)lo;   /* where chunk element 0 sits: the same random bits */
      b.piece.f1 = b.piece.f0 + (long long)c;
      b.mirror = a.mirror ? h1 : NULL;
      MUON__TRY(muon__compute_copy(opt, w, (const char *)x->param + lo * es, c * es, 0, 0, op));
      MUON__TRY(muon__compute_apply(opt, c, w, pl->stash + x->stash + lo, &b, op));
      MUON__TRY(muon__compute_nonfinite(opt, w, x->param_dtype, c, fl + MUON__CHECKS * k + 1, op));
      if (b.mirror) MUON__TRY(muon__compute_nonfinite(opt, h1, MUON_DTYPE_BF16, c, fl + MUON__CHECKS * k + 2, op));
    }
    if (muon__normuon_owned(opt, x))   /* the v staged this step */
      MUON__TRY(muon__compute_nonfinite(opt, x->normuon + x->normuon_len, MUON_DTYPE_FP32, (size_t)x->normuon_len,
                                        fl + 3, op));
  }
  for (i = 0; i < opt->n_adamw; i++) {
    const muon__adamw *p = &opt->adamw[i];
    muon_adamw_args a = muon__adamw_args(opt, p), b;
    int *fl = pl->checks + p->check;
    void *w = p->param_dtype == MUON_DTYPE_BF16 ? (void *)h0 : (void *)f2;
    if (p->skip) continue;
    es = muon__dtype_size(p->param_dtype);
    for (lo = 0, k = 0; lo < p->size; lo += C, k++) {
      c = MUON__MIN(C, p->size - lo);
      if (p->parts > 1) {   /* already in scratch: the chunk's moments, the whole new parameter */
        if (lo < p->hi - p->lo) {
          size_t cm = MUON__MIN(c, p->hi - p->lo - lo);
          int *f = fl + MUON__CHECKS * k;
          MUON__TRY(muon__compute_nonfinite(opt, pl->aw_m + p->roff + lo, MUON_DTYPE_FP32, cm, f, op));
          MUON__TRY(muon__compute_nonfinite(opt, pl->aw_v + p->roff + lo, MUON_DTYPE_FP32, cm, f + 1, op));
        }
        MUON__TRY(muon__compute_nonfinite(opt, pl->aw_full + p->foff + lo, MUON_DTYPE_FP32, c,
                                          fl + MUON__CHECKS * k + 2, op));
        if (p->mirror) {
          MUON__TRY(muon__compute_cast(opt, h1, MUON_DTYPE_BF16, pl->aw_full + p->foff + lo, MUON_DTYPE_FP32, c, op));
          MUON__TRY(muon__compute_nonfinite(opt, h1, MUON_DTYPE_BF16, c, fl + MUON__CHECKS * k + 3, op));
        }
        continue;
      }
      b = a;
      b.offset += lo;
      b.mirror = a.mirror ? h1 : NULL;
      MUON__TRY(muon__compute_copy(opt, w, (const char *)p->param + lo * es, c * es, 0, 0, op));
      MUON__TRY(muon__state_copy(opt, f0, p->exp_avg + lo, c, 0, op));
      MUON__TRY(muon__state_copy(opt, f1, p->exp_avg_sq + lo, c, 0, op));
      MUON__TRY(muon__compute_adamw(opt, c, w, (const char *)p->grad + lo * muon__dtype_size(p->grad_dtype), f0, f1,
                                    &b, op));
      MUON__TRY(muon__compute_nonfinite(opt, f0, MUON_DTYPE_FP32, c, fl + MUON__CHECKS * k, op));
      MUON__TRY(muon__compute_nonfinite(opt, f1, MUON_DTYPE_FP32, c, fl + MUON__CHECKS * k + 1, op));
      MUON__TRY(muon__compute_nonfinite(opt, w, p->param_dtype, c, fl + MUON__CHECKS * k + 2, op));
      if (b.mirror) MUON__TRY(muon__compute_nonfinite(opt, h1, MUON_DTYPE_BF16, c, fl + MUON__CHECKS * k + 3, op));
    }
  }
  return muon__compute_copy(opt, pl->host_checks, pl->checks, pl->n_checks * sizeof(int), 1, 0,
                            "muon_step: reading the update checks");
}

/* Apply: momentum and parameters from the stashed O, then AdamW, once everything before has
   succeeded. On a device the work is queued; a failure surfaces at the next step's first sync. */
static muon_status muon__commit(muon_optimizer *opt) {
  int i;
  for (i = 0; i < opt->n_matrices; i++) {
    muon__matrix *x = &opt->matrices[i];
    muon_momentum_args m = muon__momentum_args(opt, x);
    muon_apply_args a = muon__apply_args(opt, x);
    if (x->skip) continue;
    if (muon__owner_momentum(x) && muon__owns(opt, x)) {   /* the whole momentum, from the summed gradient */
      m.grad_scale *= x->part_scale;
      m.grad_dtype = MUON_DTYPE_FP32;
      MUON__TRY(muon__state_momentum(opt, x, 0, x->momentum_size,
                                      opt->plan.reduced + opt->plan.globals[x->global].roff, &m, 1, NULL,
                                      "muon_step: momentum (the update may be partly applied)"));
      x->momentum_fresh = 0;
    } else if (!muon__owner_momentum(x)) {
      MUON__TRY(muon__state_momentum(opt, x, 0, x->size, x->grad, &m, 1, NULL,
                                      "muon_step: momentum (the update may be partly applied)"));
    }
    MUON__TRY(muon__compute_apply(opt, x->size, x->param, opt->plan.stash + x->stash, &a,
                                  "muon_step: update (the update may be partly applied)"));
    if (muon__normuon_owned(opt, x)) {   /* the v staged this step */
      MUON__TRY(muon__compute_copy(opt, x->normuon, x->normuon + x->normuon_len, (size_t)x->normuon_len * sizeof(float),
                                   0, 0, "muon_step: NorMuon second moment (the update may be partly applied)"));
      x->normuon_fresh = 0;
    }
  }
  for (i = 0; i < opt->n_adamw; i++) {
    muon__adamw *p = &opt->adamw[i];
    muon_adamw_args a;
    if (p->skip) continue;
    if (p->parts > 1) {   /* Partial: the chunk's moments and the all-gathered parameter */
      const float *full = opt->plan.aw_full + p->foff;
      size_t c = p->hi - p->lo;
      const char *op = "muon_step: AdamW of a Partial param (the update may be partly applied)";
      if (c) {
        MUON__TRY(muon__state_copy(opt, p->exp_avg, opt->plan.aw_m + p->roff, c, 1, op));
        MUON__TRY(muon__state_copy(opt, p->exp_avg_sq, opt->plan.aw_v + p->roff, c, 1, op));
      }
      if (p->param_dtype == MUON_DTYPE_FP32)
        MUON__TRY(muon__compute_copy(opt, p->param, full, p->size * sizeof(float), 0, 0, op));
      else MUON__TRY(muon__compute_cast(opt, p->param, p->param_dtype, full, MUON_DTYPE_FP32, p->size, op));
      if (p->mirror) MUON__TRY(muon__compute_cast(opt, p->mirror, MUON_DTYPE_BF16, full, MUON_DTYPE_FP32, p->size, op));
    } else {
      a = muon__adamw_args(opt, p);
      MUON__TRY(muon__state_adamw(opt, p->size, p->param, p->grad, p->exp_avg, p->exp_avg_sq, &a,
                                  "muon_step: AdamW (the update may be partly applied)"));
    }
    p->step++;
  }
  return MUON_OK;
}

/* Any flag of [first, first + n) of the commit checks set? */
static int muon__checked(const muon__plan *pl, size_t first, size_t n) {
  size_t k;
  for (k = 0; k < n; k++) if (pl->host_checks[first + k]) return 1;
  return 0;
}

/* The commit vote: every rank says whether all its work succeeded, which of the O it owns are
   not finite (momentum overflow, extreme NS coefficients) and which matrices and AdamW params its
   commit would make non-finite (muon__check_commit); all apply or none does. Without a dist
   config, or with unchecked_commit, each rank decides alone. */
static muon_status muon__vote(muon_optimizer *opt) {
  muon__plan *pl = &opt->plan;
  int P = pl->P, me = pl->me, r, g, i, n_bad = 0, first_bad = -1, why = 0, n_aw = 0, first_aw = -1, aw_rank = me;
  int skip = opt->on_nonfinite == MUON_NONFINITE_SKIP, agreed = opt->distributed && !opt->dist.unchecked_commit;
  unsigned long long aw_hash = 0;
  long long mine[MUON__VOTE], *all = NULL;
  muon_status st = MUON_OK;
  if (opt->step_status == MUON_OK) {
    /* host_out[g] becomes why global g fails here: 1 its NS output (owner), 2 a local commit */
    for (g = 0; g < pl->n_globals; g++)
      pl->host_out[g] = pl->globals[g].owner == me && !pl->globals[g].skip && pl->host_out[g];
    for (i = 0; i < opt->n_matrices; i++) {
      const muon__matrix *x = &opt->matrices[i];
      if (!x->skip && x->global >= 0 && muon__checked(pl, x->check, x->checks)) pl->host_out[x->global] |= 2;
    }
    for (g = 0; g < pl->n_globals; g++)
      if (pl->host_out[g]) {
        n_bad++;
        if (first_bad < 0) first_bad = g;
      }
    for (i = 0; i < opt->n_adamw; i++)
      if (!opt->adamw[i].skip && muon__checked(pl, opt->adamw[i].check, opt->adamw[i].checks)) {
        n_aw++;
        if (first_aw < 0) first_aw = i;
      }
    if (first_bad >= 0) why = pl->host_out[first_bad];
    if (first_aw >= 0) aw_hash = opt->adamw[first_aw].name_hash;
  }
  if (agreed) {
    mine[0] = opt->step_status;
    mine[1] = n_bad;
    mine[2] = first_bad;
    mine[3] = why;
    mine[4] = n_aw;
    mine[5] = first_aw;
    mine[6] = (long long)aw_hash;
    all = (long long *)((unsigned char *)opt->agree + (size_t)P * (sizeof(muon__record) + MUON__AGREE_SLOT));
    if ((st = muon__allgather(opt, mine, all, sizeof mine, "muon_step: commit vote")) != MUON_OK) {
      const char *native = muon__comm_error(opt);
      return muon__fail(opt, st,
                        "muon_step: the commit vote failed on rank %d of %d: %s; nothing was applied on this rank, "
                        "but a rank that received every vote before the failure may have applied the step: "
                        "restore every rank from the last checkpoint",
                        me, P, native && *native ? native : muon_status_string(st));
    }
    /* One message everywhere: the lowest failing global (every rank's reasons for it), the
       lowest rank's first AdamW param. */
    for (r = 0, n_bad = 0, n_aw = 0, first_bad = first_aw = -1, why = 0; r < P && st == MUON_OK; r++) {
      const long long *v = all + (size_t)MUON__VOTE * r;
      if (v[0] != MUON_OK)
        st = r == me ? (muon_status)v[0]
                     : muon__fail(opt, v[0] > 0 && v[0] < MUON_STATUS_COUNT ? (muon_status)v[0] : MUON_ERR_BACKEND,
                                  "muon_step: rank %d failed this step (%s); nothing was applied on any rank", r,
                                  muon_status_string((muon_status)v[0]));
      if (v[1] && (first_bad < 0 || v[2] <= first_bad)) {
        why = first_bad == (int)v[2] ? why | (int)v[3] : (int)v[3];
        first_bad = (int)v[2];
      }
      if (v[4] && first_aw < 0) {
        first_aw = (int)v[5];
        aw_hash = (unsigned long long)v[6];
        aw_rank = r;
      }
      n_bad += (int)v[1];
      n_aw += (int)v[4];
    }
    if (opt->step_status != MUON_OK) st = opt->step_status;   /* this rank's own message stands */
  } else {
    st = opt->step_status;
  }
  if (st != MUON_OK || (!n_bad && !n_aw)) return st;
  if (!skip && n_bad && (why & 1))
    return muon__fail(
        opt, MUON_ERR_NONFINITE,
        "muon_step: the Newton-Schulz output of matrix '%s' (global %d) is not finite (momentum overflow or extreme ns_coefficients?); nothing was applied",
        pl->globals[first_bad].name, first_bad);
  if (!skip && n_bad)
    return muon__fail(opt, MUON_ERR_NONFINITE,
                      "muon_step: the update of matrix '%s' (global %d) would make its momentum, parameter, bf16 copy "
                      "or NorMuon state non-finite (it overflows); nothing was applied",
                      pl->globals[first_bad].name, first_bad);
  if (!skip) {
    const char *name = "?";
    for (i = 0; i < opt->n_adamw; i++)
      if (opt->adamw[i].name_hash == aw_hash) { name = opt->adamw[i].name; break; }
    return muon__fail(opt, MUON_ERR_NONFINITE,
                      "muon_step: the update of AdamW param '%s' (rank %d, param %d there) would make its moments or "
                      "value non-finite (it overflows); nothing was applied",
                      name, aw_rank, first_aw);
  }
  /* Skip them: which ones is known to the ranks that found them, so say it once more, only now. */
  if (agreed && n_bad) {
    unsigned char *flags = pl->out_skips, *mine = flags + (size_t)P * pl->skip_bytes;
    size_t k = 0;
    int j;
    memset(mine, 0, pl->skip_bytes);   /* a bit per matrix held here: only holders find anything */
    for (g = 0; g < pl->n_globals; g++)
      if (pl->globals[g].mine >= 0) { if (pl->host_out[g]) mine[k >> 3] |= (unsigned char)(1u << (k & 7)); k++; }
    st = muon__allgather(opt, mine, flags, pl->skip_bytes, "muon_step: agreeing on non-finite outputs");
    memset(pl->skip_at, 0, (size_t)P * sizeof(int));
    for (g = 0; st == MUON_OK && g < pl->n_globals; g++)
      for (j = 0; j < pl->globals[g].n_holders; j++) {
        int h = pl->globals[g].holder_ranks[j];
        size_t b = (size_t)pl->skip_at[h]++;
        if ((flags[(size_t)h * pl->skip_bytes + (b >> 3)] >> (b & 7)) & 1) pl->globals[g].skip = 1;
      }
    if (st != MUON_OK) return st;
  } else {
    for (g = 0; g < pl->n_globals; g++) if (pl->host_out[g]) pl->globals[g].skip = 1;
  }
  for (g = 0; g < opt->n_matrices; g++)
    if (opt->matrices[g].global >= 0 && pl->globals[opt->matrices[g].global].skip) opt->matrices[g].skip = 1;
  if (agreed && n_aw) {   /* every rank that holds a piece of it skips it: replicas keep one state */
    uint64_t *names = muon__adamw_mine(opt);
    for (i = 0, r = 0; i < opt->n_adamw && r < pl->max_adamw; i++)
      if (!opt->adamw[i].skip && muon__checked(pl, opt->adamw[i].check, opt->adamw[i].checks))
        names[r++] = opt->adamw[i].name_hash;
    return muon__adamw_skip_named(opt, "muon_step: agreeing on AdamW params that overflow");
  }
  for (i = 0; i < opt->n_adamw; i++)
    if (muon__checked(pl, opt->adamw[i].check, opt->adamw[i].checks)) opt->adamw[i].skip = 1;
  return MUON_OK;
}

/* ---- >>impl-api-step muon_plan and muon_step ------------------------------------------------- */
MUON_API muon_status muon_plan(muon_optimizer *opt) {
  int replanned;
  if (!opt) return MUON_ERR_ARG;
  if (!opt->distributed) return muon__plan_local(opt);
  return muon__agree(opt, 2, MUON_OK, &replanned);
}

/* Distributed: agree (re-planning together when needed), then the skips. */
static muon_status muon__dist_begin(muon_optimizer *opt) {
  int tries, replanned;
  muon_status st;
  for (tries = 0; tries < 2; tries++) {
    muon_status v = muon__verdicts(opt);
    if ((st = muon__agree(opt, 1, (uint32_t)v, &replanned)) != MUON_OK) return st;
    if (!replanned) return muon__agree_skips(opt);
  }
  return muon__fail(opt, MUON_ERR_ASSIGN, "muon_step: the ranks' plans still differ after planning together");
}

MUON_API muon_status muon_step(muon_optimizer *opt) {
  muon_status st;
  int r;
  if (!opt) return MUON_ERR_ARG;
  opt->step_status = MUON_OK;
  if (opt->distributed) {
    st = muon__dist_begin(opt);
  } else if ((opt->plan.ready || (st = muon__plan_local(opt)) == MUON_OK) && (st = muon__verdicts(opt)) == MUON_OK) {
    st = muon__agree_skips(opt);
  }
  if (st != MUON_OK) return st;
  if (opt->dist.gather) {
    if ((st = muon__custom_exchange(opt)) != MUON_OK) return st;
  } else {
    if ((st = muon__exchange_rounds(opt)) != MUON_OK) return st;
  }
  if ((st = muon__adamw_exchange(opt)) != MUON_OK) return st;
  if (opt->step_status == MUON_OK) muon__local(opt, muon__check_commit(opt));
  if (opt->step_status == MUON_OK && opt->plan.n_globals) {
    muon__local(
        opt, muon__compute_copy(opt, opt->plan.host_out, opt->plan.out_flags, (size_t)opt->plan.n_globals * sizeof(int),
                                1, 0, "muon_step: reading the output checks"));
  }
  if (opt->step_status == MUON_OK && opt->plan.n_aw) {
    muon__local(
        opt, muon__compute_copy(opt, opt->plan.aw_host_flags, opt->plan.aw_flags, (size_t)opt->plan.n_aw * sizeof(int),
                                1, 0, "muon_step: reading the Partial AdamW checks"));
  }
  if ((st = muon__comm_finish(opt, "muon_step: the exchanges")) != MUON_OK) return st;
  if (opt->step_status == MUON_OK) muon__local(opt, muon__sync(opt, "muon_step: before the update"));
  if (opt->step_status == MUON_OK && opt->plan.n_aw) muon__local(opt, muon__aw_verdict(opt));
  if ((st = muon__vote(opt)) != MUON_OK) return st;
  if ((st = muon__commit(opt)) != MUON_OK) return st;
  for (r = 0; r < opt->n_matrices; r++) opt->stats.skipped += opt->matrices[r].skip;
  opt->stats.steps++;
  if (!opt->run) opt->run = opt->run_agreed;
  return MUON_OK;
}

MUON_API muon_status muon_get_stats(const muon_optimizer *opt, muon_stats *stats) {
  if (!stats) return MUON_ERR_ARG;
  if (!opt) { memset(stats, 0, sizeof *stats); return MUON_ERR_ARG; } /* no output left unset */
  *stats = opt->stats;
  return MUON_OK;
}

MUON_API muon_status muon_get_momentum_stored(const muon_optimizer *opt, int index, const void **buf, size_t *size,
                                             muon_momentum_format *format) {
  if (!buf || !size || !format) return MUON_ERR_ARG;
  *buf = NULL;
  *size = 0;
  *format = MUON_MOMENTUM_FP32;
  if (!opt || index < 0 || index >= opt->n_matrices) return MUON_ERR_ARG;
  *buf = opt->matrices[index].momentum;
  *size = opt->matrices[index].momentum_size;
  *format = opt->matrices[index].mfmt;
  return MUON_OK;
}

MUON_API muon_status muon_get_momentum(const muon_optimizer *opt, int index, const float **buf, size_t *size) {
  const void *b;
  muon_momentum_format f;
  muon_status st;
  if (!buf || !size) return MUON_ERR_ARG;
  st = muon_get_momentum_stored(opt, index, &b, size, &f);
  *buf = (const float *)b;
  if (st == MUON_OK && f != MUON_MOMENTUM_FP32) { *buf = NULL; *size = 0; return MUON_ERR_ARG; }   /* not floats */
  return st;
}

/* >>impl-state --------------------------------------------------------------------------------
   State blob, little-endian:
     "MUONSTAT" | u32 version 1 | u32 matrices | u32 adamw params | u32 0 | u64 steps
     | u64 run (the run's identity; 0 before its first step and in a world of one)
     | u32 rank | u32 world size                                     (0 and 1 on one device)
     u32 groups | u32 AdamW groups
     | per group: u32 bytes | its muon_hparams (MUON__HPARAMS_FIELDS; ns_steps triples inside)
     | per AdamW group: u32 bytes | its muon_adamw_hparams (MUON__ADAMW_FIELDS)
                                                                (torch keeps param_groups too)
     per matrix:      u32 rows | u32 cols | u64 size | u64 name hash | size x f32 momentum
                        (a Partial matrix: rows x cols on its owner, else size 0)
                      | the piece's layout: u32 levels | u64 key | MUON_MAX_LEVELS x
                        (u32 placement, dim, size, index | u64 offset, length), unused ones 0
                      | u32 len | len x f32 NorMuon second moment (its owner's; else 0)
     per AdamW param: u64 size | u64 step | u64 name hash | u64 full size | u64 offset
                      | size x f32 exp_avg | size x f32 exp_avg_sq
     u64 FNV-1a of everything before it
   Groups are length-prefixed records, so a new hyperparameter is appended to its record without
   a new version: an older reader skips it, a newer one defaults it. A change anywhere else bumps
   MUON__STATE_VERSION (after muon 1.0's release: until then version 1 changes in place). */
#define MUON__STATE_VERSION 1u
#define MUON__STATE_MAX_STEP ((uint64_t)1 << 62)   /* a step count beyond this is corruption */
#define MUON__STATE_HEADER 48u
#define MUON__MATRIX_RECORD (28u + MUON__LAYOUT_RECORD)   /* besides the momentum and v */
#define MUON__ADAMW_RECORD 40u                             /* besides the moments */

/* The momentum a blob records: the local piece's; a Partial matrix's whole one on its owner,
   none elsewhere or while it is planning's zeros. */
static size_t muon__saved_momentum(const muon__matrix *x) {
  return !muon__owner_momentum(x) ? x->size : x->momentum && !x->momentum_fresh ? x->momentum_size : 0;
}

/* The v a blob records: none while it is planning's zeros (a failed step leaves the state as it
   was, and a missing v starts at zero anyway). */
static int muon__saved_normuon_len(const muon__matrix *x) {
  return x->normuon && !x->normuon_fresh ? x->normuon_len : 0;
}

static size_t muon__state_bytes(const muon_optimizer *opt) {
  size_t n = MUON__STATE_HEADER + 8 + 8;
  unsigned char rec[MUON__GROUP_MAX], *p;
  int i;
  for (i = 0; i < opt->n_groups; i++) { p = rec; muon__put_hparams(&p, &opt->groups[i]); n += (size_t)(p - rec); }
  for (i = 0; i < opt->n_adamw_groups; i++) {
    p = rec;
    muon__put_adamw_hparams(&p, &opt->adamw_groups[i]);
    n += (size_t)(p - rec);
  }
  for (i = 0; i < opt->n_matrices; i++)
    n += MUON__MATRIX_RECORD +
         4 * (muon__saved_momentum(&opt->matrices[i]) + (size_t)muon__saved_normuon_len(&opt->matrices[i]));
  for (i = 0; i < opt->n_adamw; i++) n += MUON__ADAMW_RECORD + 8 * opt->adamw[i].state_size;
  return n;
}

MUON_API size_t muon_state_size(const muon_optimizer *opt) { return opt ? muon__state_bytes(opt) : 0; }

/* Moving backend floats into and out of the blob: directly on the host, else through `tmp` (the
   largest tensor's size) and a sync per tensor. */
static size_t muon__largest_state(const muon_optimizer *opt) {
  size_t n = 0;
  int i;
  for (i = 0; i < opt->n_matrices; i++) {
    if (opt->matrices[i].size > n) n = opt->matrices[i].size;
    if (muon__owner_momentum(&opt->matrices[i]) && (size_t)opt->matrices[i].rows * opt->matrices[i].cols > n)
      n = (size_t)opt->matrices[i].rows * opt->matrices[i].cols;
    if ((size_t)opt->matrices[i].normuon_len > n) n = (size_t)opt->matrices[i].normuon_len;
  }
  for (i = 0; i < opt->n_adamw; i++) if (opt->adamw[i].state_size > n) n = opt->adamw[i].state_size;
  return n;
}

/* state: x is optimizer state (host memory when opt->state_host), else NorMuon's v. */
static muon_status muon__put_state(muon_optimizer *opt, unsigned char **p, const float *x, size_t n, float *tmp,
                                   int state) {
  muon_status st;
  if (state && (st = muon__state_settle(opt, "muon_state_save: reading the state")) != MUON_OK) return st;
  if (!opt->device || (state && opt->state_host)) { muon__put_floats(p, x, n); return MUON_OK; }
  MUON__TRY(muon__compute_copy(opt, tmp, x, n * sizeof(float), 1, 0, "muon_state_save: reading the state"));
  if ((st = muon__sync(opt, "muon_state_save: reading the state")) != MUON_OK) return st;
  muon__put_floats(p, tmp, n);
  return MUON_OK;
}

/* Any matrix whose momentum is not stored as fp32: save and load then stage through the host. */
static int muon__stored_momentum(const muon_optimizer *opt) {
  int i;
  for (i = 0; i < opt->n_matrices; i++) if (opt->matrices[i].mfmt != MUON_MOMENTUM_FP32) return 1;
  return 0;
}

static muon_status muon__get_state(muon_optimizer *opt, const unsigned char *src, float *x, size_t n, float *tmp,
                                   int state) {
  muon_status st;
  if (state && (st = muon__state_settle(opt, "muon_state_load: writing the state (partly loaded)")) != MUON_OK)
    return st;
  if (!opt->device || (state && opt->state_host)) { muon__get_floats(&src, x, n); return MUON_OK; }
  muon__get_floats(&src, tmp, n);
  MUON__TRY(
      muon__compute_copy(opt, x, tmp, n * sizeof(float), 0, 1, "muon_state_load: writing the state (partly loaded)"));
  return muon__sync(opt, "muon_state_load: writing the state (partly loaded)");
}

/* This rank's piece of matrix x, its parameter or its momentum, as fp32 in host memory. */
static muon_status muon__read_piece(muon_optimizer *opt, const muon__matrix *x, int momentum, float *out,
                                    const char *op) {
  const void *src = momentum ? (const void *)x->momentum : x->param;
  int bf16 = momentum ? x->mfmt == MUON_MOMENTUM_BF16 : x->param_dtype == MUON_DTYPE_BF16;
  int q8 = momentum && x->mfmt == MUON_MOMENTUM_INT8;
  size_t n = momentum ? x->momentum_size : x->size, k;
  size_t bytes = q8 ? muon__mom_bytes(x, n) : n * (bf16 ? 2 : 4);
  muon_status st;
  if (!n) return MUON_OK;
  if (momentum && opt->state_host) {   /* host memory, once the queue has left it */
    if ((st = muon__state_settle(opt, op)) != MUON_OK) return st;
  } else if (opt->device) {   /* bf16 / int8 land at the end of out, then widen in place, front to back */
    void *dst = (char *)out + (n * sizeof(float) - bytes);
    MUON__TRY(muon__compute_copy(opt, dst, src, bytes, 1, 0, op));
    if ((st = muon__sync(opt, op)) != MUON_OK) return st;
    src = dst;
  }
  if (q8) {   /* each block copied out first: with src at the end of out, block b's floats end
                 before block b + 1's bytes start (4 * 256 (b + 1) <= 3n - ceil(n / 256) + 257 (b + 1)) */
    const unsigned char *b = (const unsigned char *)src;
    unsigned char blk[1 + MUON_Q8_BLOCK];
    for (k = 0; k < n; k += MUON_Q8_BLOCK, b += 1 + MUON_Q8_BLOCK) {
      size_t c = MUON__MIN((size_t)MUON_Q8_BLOCK, n - k);
      memcpy(blk, b, 1 + c);
      muon__q8_decode(blk, c, out + k);
    }
    return MUON_OK;
  }
  if (!bf16) { if (src != out) memcpy(out, src, n * sizeof(float)); return MUON_OK; }
  for (k = 0; k < n; k++) {
    uint16_t h;
    memcpy(&h, (const uint16_t *)src + k, sizeof h);
    out[k] = muon__u2f((uint32_t)h << 16);
  }
  return MUON_OK;
}

/* n fp32 momentum values (host memory, consumed: narrowed in place) into x's buffer, converted
   to its format: bf16 by nearest even, int8 by blocks; exact for values saved from that format. */
static muon_status muon__put_momentum(muon_optimizer *opt, muon__matrix *x, float *vals, size_t n, const char *op) {
  uint16_t *h = (uint16_t *)(void *)vals;
  size_t k, bytes = muon__mom_bytes(x, n);
  if (x->mfmt == MUON_MOMENTUM_BF16)
    for (k = 0; k < n; k++) {   /* front to back: bytes 2k..2k+1 are read before (as vals[k / 2]) */
      uint16_t b = muon__bf16_bits(muon__bf16(vals[k]));
      memcpy(h + k, &b, sizeof b);
    }
  if (x->mfmt == MUON_MOMENTUM_INT8)   /* block b's 257 bytes end before block b + 1's floats */
    for (k = 0; k < n; k += MUON_Q8_BLOCK) {
      float blk[MUON_Q8_BLOCK];
      size_t c = MUON__MIN((size_t)MUON_Q8_BLOCK, n - k);
      memcpy(blk, vals + k, c * sizeof(float));
      muon__q8_encode(blk, c, (unsigned char *)(void *)vals + k + k / MUON_Q8_BLOCK);
    }
  if (!n) return MUON_OK;
  if (!opt->device || opt->state_host) {
    MUON__TRY(muon__state_settle(opt, op));
    memcpy(x->momentum, vals, bytes);
    return MUON_OK;
  }
  return muon__compute_copy(opt, x->momentum, vals, bytes, 0, 1, op);
}

MUON_API muon_status muon_state_save(muon_optimizer *opt, void *buf, size_t size) {
  unsigned char *p = (unsigned char *)buf;
  size_t need;
  int i;
  float *tmp = NULL;
  muon_status st = MUON_OK;
  if (!opt) return MUON_ERR_ARG;
  need = muon__state_bytes(opt);
  if (!buf) return muon__fail(opt, MUON_ERR_ARG, "muon_state_save: buf is NULL");
  if (size < need)
    return muon__fail(opt, MUON_ERR_ARG,
                      "muon_state_save: buffer of %zu bytes is too small (need %zu, see muon_state_size)", size, need);
  memcpy(p, "MUONSTAT", 8); p += 8;
  muon__put32(&p, MUON__STATE_VERSION);
  muon__put32(&p, (uint32_t)opt->n_matrices);
  muon__put32(&p, (uint32_t)opt->n_adamw);
  muon__put32(&p, 0);
  muon__put64(&p, (uint64_t)opt->stats.steps);
  muon__put64(&p, opt->run);
  muon__put32(&p, (uint32_t)(opt->distributed ? opt->comm.rank : 0));
  muon__put32(&p, (uint32_t)(opt->distributed ? opt->comm.size : 1));
  muon__put32(&p, (uint32_t)opt->n_groups);
  muon__put32(&p, (uint32_t)opt->n_adamw_groups);
  for (i = 0; i < opt->n_groups; i++) muon__put_hparams(&p, &opt->groups[i]);
  for (i = 0; i < opt->n_adamw_groups; i++) muon__put_adamw_hparams(&p, &opt->adamw_groups[i]);
  if ((opt->device || muon__stored_momentum(opt)) &&
      !(tmp = (float *)muon__alloc(&opt->allocator, muon__largest_state(opt) * sizeof(float))))
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_state_save: allocating a staging buffer failed");
  for (i = 0; i < opt->n_matrices && st == MUON_OK; i++) {
    const muon__matrix *x = &opt->matrices[i];
    muon__put32(&p, (uint32_t)x->rows);
    muon__put32(&p, (uint32_t)x->cols);
    muon__put64(&p, (uint64_t)muon__saved_momentum(x));
    muon__put64(&p, (uint64_t)x->name_hash);
    if (x->mfmt != MUON_MOMENTUM_FP32) {   /* the blob holds fp32 values, whatever the format */
      if (muon__saved_momentum(x) &&
          (st = muon__read_piece(opt, x, 1, tmp, "muon_state_save: reading the state")) != MUON_OK)
        break;
      muon__put_floats(&p, tmp, muon__saved_momentum(x));
    } else if ((st = muon__put_state(opt, &p, x->momentum, muon__saved_momentum(x), tmp, 1)) != MUON_OK) break;
    muon__put_layout(&p, &x->layout);
    muon__put32(&p, (uint32_t)muon__saved_normuon_len(x));   /* NorMuon's v: its owner's, else none */
    if (muon__saved_normuon_len(x)) st = muon__put_state(opt, &p, x->normuon, (size_t)x->normuon_len, tmp, 0);
  }
  for (i = 0; i < opt->n_adamw && st == MUON_OK; i++) {
    const muon__adamw *a = &opt->adamw[i];
    muon__put64(&p, (uint64_t)a->state_size);
    muon__put64(&p, (uint64_t)a->step);
    muon__put64(&p, (uint64_t)a->name_hash);
    muon__put64(&p, (uint64_t)a->full_size);
    muon__put64(&p, (uint64_t)a->state_offset);
    if ((st = muon__put_state(opt, &p, a->exp_avg, a->state_size, tmp, 1)) == MUON_OK)
      st = muon__put_state(opt, &p, a->exp_avg_sq, a->state_size, tmp, 1);
  }
  muon__free(&opt->allocator, tmp);
  if (st != MUON_OK) return st;
  muon__put64(&p, muon__fnv1a((const unsigned char *)buf, need - 8));
  return MUON_OK;
}

/* n little-endian floats of a blob: each one a state a step could leave (muon__state_ok)? */
static int muon__blob_finite(const unsigned char *p, size_t n, int nonneg) {
  size_t i;
  for (i = 0; i < n; i++)
    if (!muon__state_ok(muon__u2f(muon__get32(&p)), nonneg)) return 0;
  return 1;
}

/* A saved momentum that x's format can hold: finite, and finite once rounded to bf16 (a value
   past bf16's largest rounds to Inf, which no step could leave); int8 holds every finite value. */
static int muon__blob_momentum_ok(const unsigned char *p, size_t n, const muon__matrix *x) {
  size_t i;
  if (x->mfmt != MUON_MOMENTUM_BF16) return muon__blob_finite(p, n, 0);
  for (i = 0; i < n; i++)
    if (!muon__state_ok(muon__bf16(muon__u2f(muon__get32(&p))), 0)) return 0;
  return 1;
}

/* A blob whose structure has been checked (checksum, every record inside it) before anything
   reads a record. */
typedef struct muon__blob {
  uint32_t version, n_matrices, n_adamw, n_groups, n_adamw_groups, rank, world;
  uint64_t steps, run;
  const unsigned char *groups, *matrices, *adamw;   /* where each section starts */
} muon__blob;

typedef struct muon__saved_matrix {
  uint32_t rows, cols;
  uint64_t size, name_hash;
  const unsigned char *momentum, *layout;
  uint32_t normuon_len;                      /* NorMuon's v: 0 if none */
  const unsigned char *normuon;
} muon__saved_matrix;

/* A loaded momentum into x's buffer in x's format: through tmp (host), then a sync, as
   muon__get_state. */
static muon_status muon__get_momentum(muon_optimizer *opt, const muon__saved_matrix *m, muon__matrix *x, size_t n,
                                      float *tmp) {
  const unsigned char *src = m->momentum;
  if (x->mfmt == MUON_MOMENTUM_FP32) return muon__get_state(opt, m->momentum, x->momentum, n, tmp, 1);
  muon__get_floats(&src, tmp, n);
  MUON__TRY(muon__put_momentum(opt, x, tmp, n, "muon_state_load: writing the state (partly loaded)"));
  return opt->device && !opt->state_host ? muon__sync(opt, "muon_state_load: writing the state (partly loaded)")
                                         : MUON_OK;
}

typedef struct muon__saved_adamw {
  uint64_t size, step, name_hash, full_size, offset;
  const unsigned char *exp_avg, *exp_avg_sq;
} muon__saved_adamw;

static void muon__next_saved_matrix(const unsigned char **p, muon__saved_matrix *m) {
  m->rows = muon__get32(p);
  m->cols = muon__get32(p);
  m->size = muon__get64(p);
  m->name_hash = muon__get64(p);
  m->momentum = *p;
  *p += 4 * (size_t)m->size;
  m->layout = *p;
  *p += MUON__LAYOUT_RECORD;
  m->normuon_len = muon__get32(p);
  m->normuon = *p;
  *p += 4 * (size_t)m->normuon_len;
}

static void muon__next_saved_adamw(const unsigned char **p, muon__saved_adamw *a) {
  a->size = muon__get64(p);
  a->step = muon__get64(p);
  a->name_hash = muon__get64(p);
  a->full_size = muon__get64(p);
  a->offset = muon__get64(p);
  a->exp_avg = *p;
  a->exp_avg_sq = *p + 4 * (size_t)a->size;
  *p += 8 * (size_t)a->size;
}

static muon_status muon__blob_parse(muon_optimizer *opt, const void *buf, size_t size, muon__blob *b, const char *op) {
  const unsigned char *base = (const unsigned char *)buf, *p = base, *end, *q;
  const size_t mrec = MUON__MATRIX_RECORD, arec = MUON__ADAMW_RECORD;
  uint32_t i, j = 0;
  memset(b, 0, sizeof *b);
  if (size < 12 || memcmp(p, "MUONSTAT", 8) != 0)
    return muon__fail(opt, MUON_ERR_STATE, "%s: not a muon state (%zu bytes, bad magic or truncated header)", op, size);
  p += 8;
  b->version = muon__get32(&p);
  if (b->version != MUON__STATE_VERSION)
    return muon__fail(opt, MUON_ERR_STATE, "%s: state version %u, this muon.h reads version %u", op, b->version,
                      MUON__STATE_VERSION);
  if (size < MUON__STATE_HEADER + 8 + 8)
    return muon__fail(opt, MUON_ERR_STATE, "%s: truncated header (%zu bytes)", op, size);
  b->n_matrices = muon__get32(&p);
  b->n_adamw = muon__get32(&p);
  if (muon__get32(&p) != 0) return muon__fail(opt, MUON_ERR_STATE, "%s: reserved header field is not 0", op);
  b->steps = muon__get64(&p);
  b->run = muon__get64(&p);
  b->rank = muon__get32(&p);
  b->world = muon__get32(&p);
  if (b->steps > MUON__STATE_MAX_STEP)
    return muon__fail(opt, MUON_ERR_STATE, "%s: step count %llu is not plausible", op, (unsigned long long)b->steps);
  end = base + size - 8;
  q = end;
  if (muon__get64(&q) != muon__fnv1a(base, size - 8))
    return muon__fail(opt, MUON_ERR_STATE, "%s: checksum mismatch: the state is truncated or corrupted", op);
  if (b->world < 1 || b->rank >= b->world)
    return muon__fail(opt, MUON_ERR_STATE, "%s: rank %u of a world of %u is not plausible", op, b->rank, b->world);
  /* A valid checksum can still frame impossible records (a hand-made blob): walk them all. A
     group record holds at least its head and the ns_steps triples; an AdamW group's may be any
     length (fields it lacks are defaulted). */
  b->n_groups = muon__get32(&p);
  b->n_adamw_groups = muon__get32(&p);
  b->groups = p;
  for (i = 0; i < b->n_groups; i++) {
    uint32_t bytes, k;
    if ((size_t)(end - p) < 4 + MUON__GROUP_HEAD) break;
    q = p;
    bytes = muon__get32(&q);
    q = p + 4 + 24;
    k = muon__get32(&q);
    if (bytes > (size_t)(end - p) - 4 || k < 1 || k > MUON_NS_MAX_STEPS || bytes < MUON__GROUP_HEAD + 12 * k) break;
    p += 4 + (size_t)bytes;
  }
  for (j = 0; i == b->n_groups && j < b->n_adamw_groups; j++) {
    uint32_t bytes;
    if ((size_t)(end - p) < 4) break;
    q = p;
    bytes = muon__get32(&q);
    if (bytes > (size_t)(end - p) - 4) break;
    p += 4 + (size_t)bytes;
  }
  if (i < b->n_groups || j < b->n_adamw_groups)
    return muon__fail(
        opt, MUON_ERR_STATE,
        "%s: state of %zu bytes ends inside its groups (truncated, or a group has more than MUON_NS_MAX_STEPS = %d steps)",
        op, size, MUON_NS_MAX_STEPS);
  b->matrices = p;
  for (i = 0; i < b->n_matrices; i++) {
    uint64_t n;
    uint32_t v;
    if ((size_t)(end - p) < mrec) break;
    q = p + 8;
    n = muon__get64(&q);
    if (n > ((size_t)(end - p) - mrec) / 4) break;
    p += mrec + 4 * (size_t)n;
    q = p - 4;   /* v's length is the record's last u32 before v */
    v = muon__get32(&q);
    if (v > (size_t)(end - p) / 4) break;
    p += 4 * (size_t)v;
  }
  if (i < b->n_matrices)
    return muon__fail(opt, MUON_ERR_STATE,
                      "%s: state of %zu bytes ends inside matrix %u's record (truncated, or shapes differ)", op, size,
                      i);
  b->adamw = p;
  for (i = 0; i < b->n_adamw; i++) {
    uint64_t n;
    if ((size_t)(end - p) < arec) break;
    q = p;
    n = muon__get64(&q);
    if (n > ((size_t)(end - p) - arec) / 8) break;
    p += arec + 8 * (size_t)n;
  }
  if (i < b->n_adamw)
    return muon__fail(opt, MUON_ERR_STATE,
                      "%s: state of %zu bytes ends inside AdamW param %u's record (truncated, or shapes differ)", op,
                      size, i);
  if (p != end)
    return muon__fail(opt, MUON_ERR_STATE, "%s: state is %zu bytes, its records end %zu bytes earlier (corrupted)", op,
                      size, (size_t)(end - p));
  return MUON_OK;
}

/* The blob's groups, checked, into groups[] and adamw_groups[] (the optimizer's counts). */
static muon_status muon__blob_groups(muon_optimizer *opt, const muon__blob *b, muon_hparams *groups,
                                     muon_adamw_hparams *adamw_groups, const char *op) {
  const unsigned char *p = b->groups;
  char msg[400];
  uint32_t i;
  if (b->n_groups != (uint32_t)opt->n_groups || b->n_adamw_groups != (uint32_t)opt->n_adamw_groups)
    return muon__fail(opt, MUON_ERR_STATE, "%s: state has %u groups and %u AdamW groups, the optimizer %d and %d", op,
                      b->n_groups, b->n_adamw_groups, opt->n_groups, opt->n_adamw_groups);
  for (i = 0; i < b->n_groups; i++) {
    groups[i] = opt->groups[i];   /* coefficients past ns_steps are not saved: keep ours */
    muon__get_hparams(&p, &groups[i]);
    /* The momentum format stays this optimizer's (its buffers are allocated in it): the blob
       holds fp32 values, which convert (docs/state.md). */
    if (groups[i].momentum_format != opt->groups[i].momentum_format) {
      snprintf(msg, sizeof msg, "%s: group %u keeps its momentum_format %d; the state's (%d) momentum converts to it",
               op, i, (int)opt->groups[i].momentum_format, (int)groups[i].momentum_format);
      muon__log(&opt->logger, MUON_LOG_INFO, msg);
      groups[i].momentum_format = opt->groups[i].momentum_format;
    }
    if (muon__check_hparams(&groups[i], msg, sizeof msg) != MUON_OK)
      return muon__fail(opt, MUON_ERR_STATE, "%s: group %u: %s", op, i, msg);
  }
  for (i = 0; i < b->n_adamw_groups; i++) {
    muon_adamw_hparams *a = &adamw_groups[i];
    muon__get_adamw_hparams(&p, a);
    if (muon__check_adamw_hparams(a, msg, sizeof msg) != MUON_OK)
      return muon__fail(opt, MUON_ERR_STATE, "%s: AdamW group %u: %s", op, i, msg);
  }
  return MUON_OK;
}

/* Room for the blob's groups: one allocation, the AdamW groups after the Muon ones. */
static muon_hparams *muon__alloc_groups(muon_optimizer *opt, muon_adamw_hparams **adamw_groups) {
  muon_hparams *g =
      (muon_hparams *)muon__alloc(&opt->allocator, (size_t)opt->n_groups * sizeof(muon_hparams) +
                                                       (size_t)opt->n_adamw_groups * sizeof(muon_adamw_hparams) + 1);
  *adamw_groups = g ? (muon_adamw_hparams *)(void *)(g + opt->n_groups) : NULL;
  return g;
}

/* The loaded groups, step count and run become the optimizer's, said through the logger where the
   hyperparameters change (torch's load_state_dict replaces them too). */
static void muon__adopt(muon_optimizer *opt, const muon_hparams *groups, const muon_adamw_hparams *adamw_groups,
                        uint64_t steps, uint64_t run, const char *op) {
  int i;
  for (i = 0; i < opt->n_groups; i++) {
    unsigned char x[MUON__GROUP_MAX], y[sizeof x], *px = x, *py = y;
    if (muon__ns_hash(&groups[i]) != muon__ns_hash(&opt->groups[i])) opt->plan.ready = 0;
    muon__put_hparams(&px, &opt->groups[i]);
    muon__put_hparams(&py, &groups[i]);
    if (px - x != py - y || memcmp(x, y, (size_t)(px - x)) != 0) {
      char msg[200];
      snprintf(msg, sizeof msg, "%s: group %d's hyperparameters replaced by the state's (lr %g -> %g)",
               op, i, (double)opt->groups[i].lr, (double)groups[i].lr);
      muon__log(&opt->logger, MUON_LOG_INFO, msg);
    }
  }
  memcpy(opt->groups, groups, (size_t)opt->n_groups * sizeof(muon_hparams));
  memcpy(opt->adamw_groups, adamw_groups, (size_t)opt->n_adamw_groups * sizeof(muon_adamw_hparams));
  opt->stats.steps = (long long)steps;
  opt->run = run;
}

/* A saved v must have the length its group (as saved) gives it, and be finite and >= 0. */
static muon_status muon__check_saved_normuon(muon_optimizer *opt, const muon__saved_matrix *m, const muon__matrix *x,
                                             const muon_hparams *hp, const char *op, const char *who) {
  int want = muon__normuon_len(hp, x->rows, x->cols);
  if (!m->normuon_len) return MUON_OK;
  if ((int)m->normuon_len != want)
    return muon__fail(opt, MUON_ERR_STATE,
                      "%s: %s has a NorMuon second moment of %u floats for matrix '%s' (%d x %d), its group wants %d",
                      op, who, m->normuon_len, x->name, x->rows, x->cols, want);
  if (!muon__blob_finite(m->normuon, m->normuon_len, 1))
    return muon__fail(opt, MUON_ERR_STATE,
                      "%s: %s's NorMuon second moment of matrix '%s' holds NaN, Inf or a negative value", op, who,
                      x->name);
  return MUON_OK;
}

MUON_API muon_status muon_state_load(muon_optimizer *opt, const void *buf, size_t size) {
  const char *op = "muon_state_load";
  muon__blob b;
  const unsigned char *p;
  muon_hparams *groups;
  muon_adamw_hparams *adamw_groups;
  uint32_t rank, world;
  int i, pass;
  float *tmp = NULL;
  muon_status st;
  if (!opt) return MUON_ERR_ARG;
  if (!buf) return muon__fail(opt, MUON_ERR_ARG, "muon_state_load: buf is NULL");
  if ((st = muon__blob_parse(opt, buf, size, &b, op)) != MUON_OK) return st;
  if (b.n_matrices != (uint32_t)opt->n_matrices || b.n_adamw != (uint32_t)opt->n_adamw)
    return muon__fail(opt, MUON_ERR_STATE,
                      "muon_state_load: state has %u matrices and %u AdamW params, the optimizer %d and %d",
                      b.n_matrices, b.n_adamw, opt->n_matrices, opt->n_adamw);
  rank = (uint32_t)(opt->distributed ? opt->comm.rank : 0);
  world = (uint32_t)(opt->distributed ? opt->comm.size : 1);
  if (b.rank != rank || b.world != world)
    return muon__fail(opt, MUON_ERR_STATE,
                      "muon_state_load: this state was saved by rank %u of %u, this optimizer is rank %u of %u: "
                      "every rank loads the file it saved, or muon_state_reshard_files reads all of them",
                      b.rank, b.world, rank, world);
  if (!(groups = muon__alloc_groups(opt, &adamw_groups)))
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_state_load: allocating %d groups failed", opt->n_groups);
  if ((st = muon__blob_groups(opt, &b, groups, adamw_groups, op)) != MUON_OK) goto done;
  if ((opt->device || muon__stored_momentum(opt)) &&
      !(tmp = (float *)muon__alloc(&opt->allocator, muon__largest_state(opt) * sizeof(float)))) {
    st = muon__fail(opt, MUON_ERR_NOMEM, "muon_state_load: allocating a staging buffer failed");
    goto done;
  }
  /* Pass 0 checks every record, pass 1 copies: nothing changes unless all of it fits. */
  for (pass = 0; pass < 2; pass++) {
    p = b.matrices;
    for (i = 0; i < opt->n_matrices; i++) {
      muon__matrix *x = &opt->matrices[i];
      muon__saved_matrix m;
      muon__next_saved_matrix(&p, &m);
      if (pass && muon__owner_momentum(x)) {   /* the owner that saved it stays the owner: the next step re-plans */
        if (m.size) { st = muon__get_momentum(opt, &m, x, (size_t)m.size, tmp); x->momentum_fresh = 0; }
        else if (x->momentum) muon__partial_drop(opt, x);
        opt->plan.ready = 0;
        if (st != MUON_OK) goto done;
      }
      if (pass) {
        if (!muon__owner_momentum(x) && (st = muon__get_momentum(opt, &m, x, x->size, tmp)) != MUON_OK) goto done;
        if (m.normuon_len)
          st = muon__get_state(opt, m.normuon, x->normuon_next ? x->normuon_next : x->normuon, m.normuon_len, tmp, 0);
        else muon__normuon_drop(opt, x);
        if (st != MUON_OK) goto done;
        continue;
      }
      if (m.rows != (uint32_t)x->rows || m.cols != (uint32_t)x->cols ||
          (!muon__owner_momentum(x) ? m.size != (uint64_t)x->size
                         : m.size != 0 && m.size != (uint64_t)x->rows * (uint64_t)x->cols)) {
        st = muon__fail(
            opt, MUON_ERR_STATE,
            "muon_state_load: matrix %d ('%s') is %d x %d (%zu floats here%s), the state has %u x %u (%llu floats)", i,
            x->name, x->rows, x->cols, !muon__owner_momentum(x) ? x->size : (size_t)x->rows * x->cols,
            !muon__owner_momentum(x) ? "" : " on its owner, none elsewhere", m.rows, m.cols, (unsigned long long)m.size);
        goto done;
      }
      if (m.name_hash != (uint64_t)x->name_hash) {
        st = muon__fail(
            opt, MUON_ERR_STATE,
            "muon_state_load: matrix %d is '%s' here, the state's matrix %d has another name (another model, or matrices registered in another order)",
            i, x->name, i);
        goto done;
      }
      if (!muon__blob_momentum_ok(m.momentum, (size_t)m.size, x)) {
        st = muon__fail(opt, MUON_ERR_STATE, "muon_state_load: the momentum of matrix %d ('%s') holds NaN or Inf%s", i,
                        x->name, x->mfmt == MUON_MOMENTUM_BF16 ? " (as bf16, its momentum_format)" : "");
        goto done;
      }
      if (m.layout) {   /* the same piece of the same matrix, or the momentum belongs to another one */
        unsigned char mine[MUON__LAYOUT_RECORD], *q = mine;
        muon__put_layout(&q, &x->layout);
        if (memcmp(mine, m.layout, MUON__LAYOUT_RECORD) != 0) {
          char saved[200], here[200];
          muon_layout was;
          muon__get_layout(m.layout, &was);
          muon__layout_text(&was, saved, sizeof saved);
          muon__layout_text(&x->layout, here, sizeof here);
          st = muon__fail(opt, MUON_ERR_STATE,
                          "muon_state_load: matrix %d ('%s') was saved as the piece [%s], here it is [%s]%s", i,
                          x->name, saved, here, strcmp(saved, here) == 0 ? " (their layout keys differ)" : "");
          goto done;
        }
      }
      if ((st = muon__check_saved_normuon(opt, &m, x, &groups[x->group], "muon_state_load", "the state")) != MUON_OK)
        goto done;
      if (muon__owner_momentum(x) && m.size && (st = muon__partial_room(opt, x, "muon_state_load")) != MUON_OK) goto done;
      if (m.normuon_len && !(x->normuon && x->normuon_len == (int)m.normuon_len) &&
          (st = muon__normuon_room(opt, x, (int)m.normuon_len, "muon_state_load")) != MUON_OK) goto done;
    }
    p = b.adamw;
    for (i = 0; i < opt->n_adamw; i++) {
      muon__adamw *a = &opt->adamw[i];
      muon__saved_adamw s;
      muon__next_saved_adamw(&p, &s);
      if (pass) {
        a->step = (long long)s.step;
        if ((st = muon__get_state(opt, s.exp_avg, a->exp_avg, a->state_size, tmp, 1)) != MUON_OK ||
            (st = muon__get_state(opt, s.exp_avg_sq, a->exp_avg_sq, a->state_size, tmp, 1)) != MUON_OK) goto done;
        continue;
      }
      if (s.step > MUON__STATE_MAX_STEP) {
        st =
            muon__fail(opt, MUON_ERR_STATE, "muon_state_load: AdamW param %d ('%s') has step count %llu, not plausible",
                       i, a->name, (unsigned long long)s.step);
        goto done;
      }
      if (s.size != (uint64_t)a->state_size) {
        st = muon__fail(opt, MUON_ERR_STATE, "muon_state_load: AdamW param %d ('%s') has %zu floats, the state %llu", i,
                        a->name, a->state_size, (unsigned long long)s.size);
        goto done;
      }
      if (s.name_hash != (uint64_t)a->name_hash) {
        st = muon__fail(
            opt, MUON_ERR_STATE,
            "muon_state_load: AdamW param %d is '%s' here, the state's param %d has another name (another model, or params registered in another order)",
            i, a->name, i);
        goto done;
      }
      if (s.full_size != (uint64_t)a->full_size || s.offset != (uint64_t)a->state_offset) {
        st = muon__fail(
            opt, MUON_ERR_STATE,
            "muon_state_load: AdamW param %d ('%s') is elements [%zu, +%zu) of %zu here (its moments' range), the state's are [%llu, +%llu) of %llu",
            i, a->name, a->state_offset, a->state_size, a->full_size, (unsigned long long)s.offset,
            (unsigned long long)s.size, (unsigned long long)s.full_size);
        goto done;
      }
      if (!muon__blob_finite(s.exp_avg, a->state_size, 0) || !muon__blob_finite(s.exp_avg_sq, a->state_size, 1)) {
        st = muon__fail(
            opt, MUON_ERR_STATE,
            "muon_state_load: the moments of AdamW param %d ('%s') hold NaN, Inf or a negative second moment", i,
            a->name);
        goto done;
      }
    }
  }
  muon__normuon_finish_load(opt);
  muon__adopt(opt, groups, adamw_groups, b.steps, b.run, op);
done:
  if (st != MUON_OK) muon__normuon_drop_next(opt);
  muon__free(&opt->allocator, tmp);
  muon__free(&opt->allocator, groups);
  return st;
}

/* >>impl-files --------------------------------------------------------------------------------
   Checkpoint and dump files: one writer (muon__afile) for muon_state_save_file and muon_dump_file,
   one reader (muon__read_file) for muon_state_load_file and muon_state_reshard_files.
   Writing goes to a temporary "<target>.muon-tmp-XXXXXX" beside the target, created with O_EXCL
   under a fresh name (two saves to one path never share one) and mode 0666 less the umask, as
   fopen gives; it is flushed to disk and renamed over the target, then the directory is flushed,
   so a failure or a kill at any point leaves the previous file whole. Every failure removes the
   temporary. A target that exists and is not a regular file (a FIFO, a device such as /dev/null,
   a directory) is refused before anything is created: the rename would replace it. Symbolic
   links are followed where the C library declares lstat and readlink (not glibc under a strict
   -std=c99 alone): the file a link names is replaced and the link stays, as fopen writes through.
   Reading takes regular files only, checked with fstat on the opened descriptor before any read
   (opened O_NONBLOCK, so a FIFO cannot block); the buffer is the size fstat gives, and the file
   must end there. Elsewhere (not POSIX): stdio, sized by ftell, and rename (not atomic where
   rename cannot replace a file), without the type checks. Failures carry the OS's reason. */
#if defined(__unix__) || defined(__APPLE__)
#define MUON__POSIX_FILES 1
#if defined(__APPLE__) || (defined(_POSIX_C_SOURCE) && _POSIX_C_SOURCE >= 200112L) || \
    (defined(_XOPEN_SOURCE) && _XOPEN_SOURCE >= 500)
#define MUON__FOLLOW_LINKS 1
#endif
#endif

#ifdef MUON_TEST_SAVE_FAULT
static int muon__save_fault_at;   /* tests: the nth file operation of a write fails (EIO) */
static int muon__save_op;
static int muon__tmp_fixed;       /* tests: a temporary's name depends on the try alone */
#define MUON__SAVE_FAULT() (++muon__save_op == muon__save_fault_at ? (errno = EIO, 1) : 0)
#else
#define MUON__SAVE_FAULT() 0
#endif

/* File failures beside errno's values: no memory for the names, or a target that is not a
   regular file (which kind it is). Negative, so that the dump can send them like an errno. */
enum { MUON__F_NOMEM = -1, MUON__F_DIR = -2, MUON__F_FIFO = -3, MUON__F_CHR = -4, MUON__F_BLK = -5,
       MUON__F_OTHER = -6 };

static const char *muon__file_reason(int err) {
  switch (err) {
  case MUON__F_NOMEM: return "out of memory";
  case MUON__F_DIR: return "a directory, not a regular file";
  case MUON__F_FIFO: return "a FIFO, not a regular file";
  case MUON__F_CHR: return "a character device, not a regular file";
  case MUON__F_BLK: return "a block device, not a regular file";
  case MUON__F_OTHER: return "a special file, not a regular file";
  default: return strerror(err);
  }
}

static muon_status muon__file_fail(muon_optimizer *opt, const char *op, const char *what, const char *path, int err) {
  if (err == MUON__F_NOMEM)
    return muon__fail(opt, MUON_ERR_NOMEM, "%s: allocating the names for '%s' failed", op, path);
  if (err < 0) return muon__fail(opt, MUON_ERR_STATE, "%s: '%s' is %s", op, path, muon__file_reason(err));
  return muon__fail(opt, MUON_ERR_STATE, "%s: %s '%s' failed: %s", op, what, path, strerror(err));
}

#ifdef MUON__POSIX_FILES
static int muon__file_kind(const struct stat *st) {
  if (S_ISREG(st->st_mode)) return 0;
  return S_ISDIR(st->st_mode) ? MUON__F_DIR : S_ISFIFO(st->st_mode) ? MUON__F_FIFO : S_ISCHR(st->st_mode) ? MUON__F_CHR
         : S_ISBLK(st->st_mode) ? MUON__F_BLK : MUON__F_OTHER;
}
#endif

/* The file a save replaces: path, or where its chain of symbolic links (40 at most) leads; a
   relative link counts from the link's directory. *out is allocator memory. Returns 0, an errno
   or MUON__F_NOMEM; a name that cannot be examined is left for the steps after to report. */
static int muon__save_target(const muon_allocator *al, const char *path, char **out) {
  size_t len = strlen(path);
  char *cur = (char *)muon__alloc(al, len + 1);
#ifdef MUON__FOLLOW_LINKS
  int hops;
#endif
  *out = NULL;
  if (!cur) return MUON__F_NOMEM;
  memcpy(cur, path, len + 1);
#ifdef MUON__FOLLOW_LINKS
  for (hops = 0;; hops++) {
    struct stat st;
    char *link = NULL, *next;
    const char *slash;
    size_t cap, dir;
    ssize_t n = -1;
    if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) break;
    if (hops == 40) { muon__free(al, cur); return ELOOP; }
    for (cap = st.st_size > 0 ? (size_t)st.st_size + 1 : 256; cap <= ((size_t)1 << 20); cap *= 2) {
      if (!(link = (char *)muon__alloc(al, cap))) { muon__free(al, cur); return MUON__F_NOMEM; }
      if ((n = readlink(cur, link, cap)) < 0 || (size_t)n < cap) break;
      muon__free(al, link);   /* the link grew since lstat: try a larger buffer */
      link = NULL;
    }
    if (!link || n < 0) {
      int err = link ? errno : ENAMETOOLONG;
      muon__free(al, link);
      muon__free(al, cur);
      return err;
    }
    slash = strrchr(cur, '/');
    dir = link[0] == '/' || !slash ? 0 : (size_t)(slash - cur) + 1;
    if (!(next = (char *)muon__alloc(al, dir + (size_t)n + 1))) {
      muon__free(al, link);
      muon__free(al, cur);
      return MUON__F_NOMEM;
    }
    memcpy(next, cur, dir);
    memcpy(next + dir, link, (size_t)n);
    next[dir + (size_t)n] = '\0';
    muon__free(al, link);
    muon__free(al, cur);
    cur = next;
  }
#endif
  *out = cur;
  return 0;
}

/* Writing a file atomically: muon__afile_open, muon__afile_write (any number), muon__afile_commit,
   and always muon__afile_close, which removes the temporary unless the commit renamed it. A
   failing call returns its errno (or a MUON__F_ code), leaves what failed in `what` and `at`
   for the message, and removes the temporary at once. */
typedef struct muon__afile {
  const muon_allocator *al;
  char *target;         /* what the rename replaces (muon__save_target) */
  char *tmp;            /* "<target>.muon-tmp-XXXXXX" */
  const char *what;     /* the step that failed, and its file */
  const char *at;
  int live;             /* the temporary exists */
#ifdef MUON__POSIX_FILES
  int fd;
#else
  FILE *f;
#endif
} muon__afile;

static void muon__afile_drop(muon__afile *a) {
#ifdef MUON__POSIX_FILES
  if (a->fd >= 0) close(a->fd);
  a->fd = -1;
#else
  if (a->f) fclose(a->f);
  a->f = NULL;
#endif
  if (a->live) remove(a->tmp);
  a->live = 0;
}

static int muon__afile_fail(muon__afile *a) {
  int err = errno ? errno : EIO;
  muon__afile_drop(a);
  return err;
}

/* A fresh temporary name: 6 characters from the process, the clock, this call's stack and the try. */
static void muon__tmp_name(char *tmp, const char *target, size_t len, int try_) {
  static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  struct { long pid; long t; long c; const void *stack; int try_; } seed;
  uint64_t h;
  int i;
  memset(&seed, 0, sizeof seed);
#ifdef MUON__POSIX_FILES
  seed.pid = (long)getpid();
#endif
  seed.t = (long)time(NULL);
  seed.c = (long)clock();
  seed.stack = (const void *)&seed;
  seed.try_ = try_;
#ifdef MUON_TEST_SAVE_FAULT
  if (muon__tmp_fixed) {
    memset(&seed, 0, sizeof seed);
    seed.try_ = try_;
  }
#endif
  h = muon__fnv1a((const unsigned char *)&seed, sizeof seed);
  memcpy(tmp, target, len);
  memcpy(tmp + len, ".muon-tmp-", 10);
  for (i = 0; i < 6; i++, h /= 36) tmp[len + 10 + i] = digits[h % 36];
  tmp[len + 16] = '\0';
}

static int muon__afile_open(muon__afile *a, const muon_allocator *al, const char *path) {
  size_t len;
  int err, try_;
#ifdef MUON__POSIX_FILES
  struct stat st;
  a->fd = -1;
#else
  a->f = NULL;
#endif
  a->al = al;
  a->target = a->tmp = NULL;
  a->live = 0;
  a->what = "following the links of";
  a->at = path;
#ifdef MUON_TEST_SAVE_FAULT
  muon__save_op = 0;
#endif
  if ((err = muon__save_target(al, path, &a->target)) != 0) return err;
  a->at = a->target;
#ifdef MUON__POSIX_FILES
  if (stat(a->target, &st) == 0 && (err = muon__file_kind(&st)) != 0) return err;   /* rename would replace it */
#endif
  len = strlen(a->target);
  if (!(a->tmp = (char *)muon__alloc(al, len + 17))) return MUON__F_NOMEM;
  a->what = "creating";
  muon__tmp_name(a->tmp, a->target, len, 0);
  a->at = a->tmp;
  errno = 0;
  if (MUON__SAVE_FAULT()) return errno;
  for (try_ = 1;; try_++) {
#ifdef MUON__POSIX_FILES
    a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
    if (a->fd >= 0) break;
    if (errno != EEXIST || try_ == 100) return errno;
#else
    FILE *look = fopen(a->tmp, "rb");   /* C99 has no exclusive create: look first */
    int taken = look != NULL;
    if (look) fclose(look);
    if (!taken && (a->f = fopen(a->tmp, "wb")) != NULL) break;
    if (!taken || try_ == 100) return taken ? EEXIST : errno ? errno : EIO;
#endif
    muon__tmp_name(a->tmp, a->target, len, try_);
  }
  a->live = 1;
  return 0;
}

static int muon__afile_write(muon__afile *a, const void *buf, size_t n) {
#ifdef MUON__POSIX_FILES
  const unsigned char *p = (const unsigned char *)buf;
  size_t done = 0;
  a->what = "writing";
  a->at = a->tmp;
  while (done < n) {
    ssize_t w;
    errno = 0;
    w = MUON__SAVE_FAULT() ? -1 : write(a->fd, p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return muon__afile_fail(a);
    done += (size_t)w;
  }
#else
  a->what = "writing";
  a->at = a->tmp;
  errno = 0;
  if (MUON__SAVE_FAULT() || fwrite(buf, 1, n, a->f) != n) return muon__afile_fail(a);
#endif
  return 0;
}

static int muon__afile_commit(muon__afile *a) {
#ifdef MUON__POSIX_FILES
  const char *slash = strrchr(a->target, '/');
  size_t d = !slash ? 0 : slash == a->target ? 1 : (size_t)(slash - a->target);
  int fd, err;
  a->what = "flushing";
  a->at = a->tmp;
  if (MUON__SAVE_FAULT() || fsync(a->fd) != 0) return muon__afile_fail(a);
  a->what = "closing";
  err = MUON__SAVE_FAULT() ? EIO : 0;
  if (close(a->fd) != 0 && !err) err = errno ? errno : EIO;
  a->fd = -1;
  if (err) {
    muon__afile_drop(a);
    return err;
  }
  a->what = "renaming the new file over";
  a->at = a->target;
  if (MUON__SAVE_FAULT() || rename(a->tmp, a->target) != 0) return muon__afile_fail(a);
  a->live = 0;
  /* The rename itself is durable once the directory is flushed (its name goes where tmp's was). */
  if (d) memcpy(a->tmp, a->target, d);
  else a->tmp[d++] = '.';
  a->tmp[d] = '\0';
  a->what = "flushing the directory of";
  fd = MUON__SAVE_FAULT() ? -1 : open(a->tmp, O_RDONLY);
  if (fd < 0 || fsync(fd) != 0) {
    err = errno ? errno : EIO;
    if (fd >= 0) close(fd);
    return err;
  }
  close(fd);
#else
  int err;
  a->what = "closing";
  a->at = a->tmp;
  errno = 0;
  err = MUON__SAVE_FAULT() || fflush(a->f) != 0;
  if (fclose(a->f) != 0) err = 1;
  a->f = NULL;
  if (err) return muon__afile_fail(a);
  a->what = "renaming the new file over";
  a->at = a->target;
  if (MUON__SAVE_FAULT() || (rename(a->tmp, a->target) != 0 && (remove(a->target), rename(a->tmp, a->target) != 0)))
    return muon__afile_fail(a);
  a->live = 0;
#endif
  return 0;
}

static void muon__afile_close(muon__afile *a) {
  muon__afile_drop(a);
  muon__free(a->al, a->tmp);
  muon__free(a->al, a->target);
  a->tmp = a->target = NULL;
}

MUON_API muon_status muon_state_save_file(muon_optimizer *opt, const char *path) {
  const char *op = "muon_state_save_file";
  muon__afile a;
  size_t n;
  void *buf;
  int err;
  muon_status st;
  if (!opt) return MUON_ERR_ARG;
  if (!path) return muon__fail(opt, MUON_ERR_ARG, "%s: path is NULL", op);
  n = muon__state_bytes(opt);
  if (!(buf = muon__alloc(&opt->allocator, n)))
    return muon__fail(opt, MUON_ERR_NOMEM, "%s: allocating %zu bytes failed", op, n);
  st = muon_state_save(opt, buf, n);
  if (st == MUON_OK) {
    err = muon__afile_open(&a, &opt->allocator, path);
    if (!err) err = muon__afile_write(&a, buf, n);
    if (!err) err = muon__afile_commit(&a);
    if (err) st = muon__file_fail(opt, op, a.what, a.at, err);
    muon__afile_close(&a);
  }
  muon__free(&opt->allocator, buf);
  return st;
}

/* Reads a whole regular file into allocator memory (see >>impl-files). */
static muon_status muon__read_file(muon_optimizer *opt, const char *path, const char *op, unsigned char **out,
                                   size_t *size) {
  unsigned char *buf;
  size_t n, got = 0;
  int err = 0;
#ifdef MUON__POSIX_FILES
  struct stat st;
  int fd;
#else
  FILE *f;
  long end;
#endif
  *out = NULL;
  *size = 0;
  errno = 0;
#ifdef MUON__POSIX_FILES
  if ((fd = open(path, O_RDONLY | O_NONBLOCK)) < 0) return muon__file_fail(opt, op, "opening", path, errno);
  if (fstat(fd, &st) != 0 || (err = muon__file_kind(&st)) != 0) {
    err = err ? err : errno;
    close(fd);
    return muon__file_fail(opt, op, "reading", path, err);
  }
  if (st.st_size < 0 || (uint64_t)st.st_size > (uint64_t)MUON__MAX_FLOATS) {
    close(fd);
    return muon__fail(opt, MUON_ERR_STATE, "%s: '%s' is too large", op, path);
  }
  n = (size_t)st.st_size;
  if (!(buf = (unsigned char *)muon__alloc(&opt->allocator, n + 1))) {   /* one byte more: the end */
    close(fd);
    return muon__fail(opt, MUON_ERR_NOMEM, "%s: allocating %zu bytes failed", op, n + 1);
  }
  while (got <= n) {
    ssize_t r = read(fd, buf + got, n + 1 - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) err = errno ? errno : EIO;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
#else
  if (!(f = fopen(path, "rb"))) return muon__file_fail(opt, op, "opening", path, errno ? errno : EIO);
  if (fseek(f, 0, SEEK_END) != 0 || (end = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    err = errno ? errno : EIO;
    fclose(f);
    return muon__file_fail(opt, op, "reading", path, err);
  }
  if ((unsigned long)end > MUON__MAX_FLOATS) {
    fclose(f);
    return muon__fail(opt, MUON_ERR_STATE, "%s: '%s' is too large", op, path);
  }
  n = (size_t)end;
  if (!(buf = (unsigned char *)muon__alloc(&opt->allocator, n + 1))) {
    fclose(f);
    return muon__fail(opt, MUON_ERR_NOMEM, "%s: allocating %zu bytes failed", op, n + 1);
  }
  got = fread(buf, 1, n + 1, f);
  if (ferror(f)) err = errno ? errno : EIO;
  fclose(f);
#endif
  if (err) {
    muon__free(&opt->allocator, buf);
    return muon__file_fail(opt, op, "reading", path, err);
  }
  if (got != n) {   /* it grew or shrank since fstat */
    muon__free(&opt->allocator, buf);
    return muon__fail(opt, MUON_ERR_STATE, "%s: '%s' changed while it was read (%s %zu bytes)", op, path,
                      got > n ? "it grew past" : "it shrank from", n);
  }
  *out = buf;
  *size = n;
  return MUON_OK;
}

MUON_API muon_status muon_state_load_file(muon_optimizer *opt, const char *path) {
  unsigned char *buf;
  size_t len;
  muon_status st;
  if (!opt) return MUON_ERR_ARG;
  if (!path) return muon__fail(opt, MUON_ERR_ARG, "muon_state_load_file: path is NULL");
  if ((st = muon__read_file(opt, path, "muon_state_load_file", &buf, &len)) != MUON_OK) return st;
  st = muon_state_load(opt, buf, len);
  muon__free(&opt->allocator, buf);
  if (st != MUON_OK) {   /* name the file: the load's message names only the state */
    char was[sizeof opt->error];
    const char *what = strstr(opt->error, "muon_state_load: ");
    snprintf(was, sizeof was, "%s", what ? what + strlen("muon_state_load: ") : opt->error);
    return muon__fail(opt, st, "muon_state_load_file: '%s': %s", path, was);
  }
  return st;
}

/* >>impl-reshard ------------------------------------------------------------------------------
   Resharding. Every saved piece is placed in its full tensor by its layout (a matrix) or its
   range (an AdamW param); whatever it shares with this rank's pieces is copied into host
   staging. The optimizer changes only after every element of every local piece has arrived. */
typedef struct muon__reshard {
  int n;                        /* blobs: the saving world's size */
  unsigned char *seen;          /* per saving rank: its blob was read */
  float *mom, *m1, *m2;         /* staging: each matrix's momentum, each AdamW param's moments */
  unsigned char *got;           /* per staged element (matrices, then AdamW): it arrived */
  size_t *at;                   /* where each matrix's, then each AdamW param's, floats start */
  long long *adamw_step;        /* per AdamW param, -1 until a piece arrives */
  float **normuon;              /* per matrix: NorMuon's v from the blob of its owner, or NULL */
  unsigned char *matched;       /* per matrix: some blob has a record of it */
  unsigned char *group_bytes;   /* the first blob's group section: the others must match it */
  size_t group_len;
  uint64_t steps, run;
  muon_hparams *groups;
  muon_adamw_hparams *adamw_groups;
} muon__staging;

/* Copies what the saved piece `from` (its floats little-endian at src) shares with the local
   piece `to` (floats at dst) of one rows x cols matrix; an element that already arrived must
   come again with the same bits (saved replicas agree). Returns the first local element where
   they do not, or -1. A piece has, in each row, one contiguous run of columns. */
static long long muon__reshard_copy(const muon__piece *to, float *dst, unsigned char *got, const muon__piece *from,
                                    const unsigned char *src) {
  muon__seg s = muon__segs(to);
  while (muon__next_seg(to, &s)) {
    long long rin = s.row - from->r0, lo, hi, c0, a, e, c;
    if (rin < 0 || rin >= from->h) continue;
    lo = from->f0 > rin * from->w ? from->f0 : rin * from->w;
    hi = from->f1 < (rin + 1) * from->w ? from->f1 : (rin + 1) * from->w;
    if (lo >= hi) continue;
    c0 = from->c0 + (lo - rin * from->w);
    a = c0 > s.col ? c0 : s.col;
    e = c0 + (hi - lo) < s.col + s.len ? c0 + (hi - lo) : s.col + s.len;
    for (c = a; c < e; c++) {
      size_t d = (size_t)(s.off + (c - s.col));
      const unsigned char *q = src + 4 * (size_t)(lo - from->f0 + (c - c0));
      uint32_t u = muon__get32(&q);
      if (got[d]) { if (u != muon__f2u(dst[d])) return (long long)d; continue; }
      dst[d] = muon__u2f(u);
      got[d] = 1;
    }
  }
  return -1;
}

/* The same for a flat range: saved elements [so, so + sn) into local [lo, lo + n). */
static long long muon__reshard_range(size_t lo, size_t n, float *dst, unsigned char *got, int mark, uint64_t so,
                                     uint64_t sn, const unsigned char *src) {
  uint64_t a = so > lo ? so : lo, e = so + sn < lo + n ? so + sn : lo + n, k;
  for (k = a; k < e; k++) {
    size_t d = (size_t)(k - lo);
    const unsigned char *q = src + 4 * (size_t)(k - so);
    uint32_t u = muon__get32(&q);
    if (got[d]) { if (u != muon__f2u(dst[d])) return (long long)d; continue; }
    dst[d] = muon__u2f(u);
    got[d] = (unsigned char)mark;
  }
  return -1;
}

static muon_status muon__reshard_blob(muon_optimizer *opt, muon__staging *R, const void *buf, size_t size,
                                      const char *op) {
  muon__blob b;
  const unsigned char *p, *q;
  uint32_t j;
  int i;
  muon_status st;
  if ((st = muon__blob_parse(opt, buf, size, &b, op)) != MUON_OK) return st;
  if (b.world != (uint32_t)R->n)
    return muon__fail(opt, MUON_ERR_STATE,
                      "%s: saved by rank %u of %u, but %d blobs were given: pass one per rank of the saving world", op,
                      b.rank, b.world, R->n);
  if (R->seen[b.rank]) return muon__fail(opt, MUON_ERR_STATE, "%s: a second blob of rank %u", op, b.rank);
  if (!R->group_bytes) {
    R->group_len = (size_t)(b.matrices - b.groups);
    if (!(R->group_bytes = (unsigned char *)muon__alloc(&opt->allocator, R->group_len + 1)))
      return muon__fail(opt, MUON_ERR_NOMEM, "%s: allocating %zu bytes failed", op, R->group_len);
    memcpy(R->group_bytes, b.groups, R->group_len);
    R->steps = b.steps;
    R->run = b.run;
    if ((st = muon__blob_groups(opt, &b, R->groups, R->adamw_groups, op)) != MUON_OK) return st;
  } else if (b.steps != R->steps) {
    return muon__fail(
        opt, MUON_ERR_STATE,
        "%s: rank %u saved after %llu steps, another blob after %llu: they belong to different checkpoints", op, b.rank,
        (unsigned long long)b.steps, (unsigned long long)R->steps);
  } else if (b.run != R->run) {
    return muon__fail(opt, MUON_ERR_STATE,
                      "%s: rank %u's blob belongs to run %016llx, another blob to run %016llx: they are checkpoints "
                      "of different jobs",
                      op, b.rank, (unsigned long long)b.run, (unsigned long long)R->run);
  } else if ((size_t)(b.matrices - b.groups) != R->group_len || memcmp(b.groups, R->group_bytes, R->group_len) != 0) {
    return muon__fail(
        opt, MUON_ERR_STATE,
        "%s: rank %u saved other group hyperparameters than another blob: they belong to different checkpoints", op,
        b.rank);
  }
  R->seen[b.rank] = 1;
  p = b.matrices;
  for (j = 0; j < b.n_matrices; j++) {
    muon__saved_matrix m;
    muon_layout lay;
    muon__next_saved_matrix(&p, &m);
    muon__get_layout(m.layout, &lay);
    for (i = 0; i < opt->n_matrices; i++) {
      muon__matrix *x = &opt->matrices[i];
      muon__piece from;
      char why[240];
      long long bad;
      if (m.name_hash != (uint64_t)x->name_hash || lay.key != x->layout.key) continue;
      if (m.rows != (uint32_t)x->rows || m.cols != (uint32_t)x->cols)
        return muon__fail(opt, MUON_ERR_STATE, "%s: matrix %d ('%s') is %d x %d here, rank %u saved it as %u x %u", op,
                          i, x->name, x->rows, x->cols, b.rank, m.rows, m.cols);
      if (muon__layout_piece(&lay, x->rows, x->cols, &from, why, sizeof why) != MUON_OK ||
          muon__layout_parts(&lay, NULL, NULL) < 1)
        return muon__fail(opt, MUON_ERR_STATE,
                          "%s: rank %u's piece of matrix '%s' has an impossible layout (corrupted)", op, b.rank,
                          x->name);
      /* Kept whole on the saver's owner, none on its other holders: a Partial matrix's, and an
         8-bit one's saved from pieces (whole where the piece is not, or nothing where it is). */
      if (muon__layout_parts(&lay, NULL, NULL) > 1 ||
          (m.size != (uint64_t)(from.f1 - from.f0) && (m.size == 0 || m.size == (uint64_t)x->rows * x->cols)))
        from = m.size ? muon__whole_piece(x->rows, x->cols) : muon__canonical(muon__whole_piece(0, 0));
      if ((uint64_t)(from.f1 - from.f0) != m.size)
        return muon__fail(opt, MUON_ERR_STATE,
                          "%s: rank %u's piece of matrix '%s' has an impossible layout (corrupted)", op, b.rank,
                          x->name);
      if (!muon__blob_momentum_ok(m.momentum, (size_t)m.size, x))
        return muon__fail(opt, MUON_ERR_STATE, "%s: rank %u's momentum of matrix '%s' holds NaN or Inf%s", op, b.rank,
                          x->name, x->mfmt == MUON_MOMENTUM_BF16 ? " (as bf16, its momentum_format)" : "");
      R->matched[i] = 1;
      {   /* a Partial matrix's momentum is whole (on its owner), both saved and here */
        muon__piece to = muon__owner_momentum(x) ? muon__whole_piece(x->rows, x->cols) : x->piece;
        bad = muon__reshard_copy(&to, R->mom + R->at[i], R->got + R->at[i], &from, m.momentum);
      }
      if (bad >= 0)
        return muon__fail(
            opt, MUON_ERR_STATE,
            "%s: rank %u's momentum of matrix '%s' differs from another saved replica's (local element %lld): they belong to different checkpoints",
            op, b.rank, x->name, bad);
      if ((st = muon__check_saved_normuon(opt, &m, x, &R->groups[x->group], op, "the blob")) != MUON_OK) return st;
      if (m.normuon_len && !R->normuon[i]) {
        if (!(R->normuon[i] = (float *)muon__alloc(&opt->allocator, 4 * (size_t)m.normuon_len)))
          return muon__fail(opt, MUON_ERR_NOMEM, "%s: allocating %u floats failed", op, m.normuon_len);
        q = m.normuon;
        muon__get_floats(&q, R->normuon[i], m.normuon_len);
      } else if (m.normuon_len) {
        uint32_t k;
        q = m.normuon;
        for (k = 0; k < m.normuon_len; k++)
          if (muon__get32(&q) != muon__f2u(R->normuon[i][k]))
            return muon__fail(
                opt, MUON_ERR_STATE,
                "%s: rank %u's NorMuon second moment of matrix '%s' differs from another blob's: they belong to different checkpoints",
                op, b.rank, x->name);
      }
    }
  }
  p = b.adamw;
  for (j = 0; j < b.n_adamw; j++) {
    muon__saved_adamw s;
    muon__next_saved_adamw(&p, &s);
    for (i = 0; i < opt->n_adamw; i++) {
      muon__adamw *a = &opt->adamw[i];
      size_t at = R->at[opt->n_matrices + i] - R->at[opt->n_matrices];
      unsigned char *got = R->got + R->at[opt->n_matrices + i];
      long long bad;
      if (s.name_hash != (uint64_t)a->name_hash) continue;
      if (s.full_size != (uint64_t)a->full_size || s.offset > s.full_size || s.size > s.full_size - s.offset)
        return muon__fail(opt, MUON_ERR_STATE,
                          "%s: AdamW param %d ('%s') has %zu elements in all here, rank %u saved [%llu, +%llu) of %llu",
                          op, i, a->name, a->full_size, b.rank, (unsigned long long)s.offset,
                          (unsigned long long)s.size, (unsigned long long)s.full_size);
      if (s.offset >= a->state_offset + a->state_size || a->state_offset >= s.offset + s.size) continue;
      if (s.step > MUON__STATE_MAX_STEP || (R->adamw_step[i] >= 0 && (uint64_t)R->adamw_step[i] != s.step))
        return muon__fail(opt, MUON_ERR_STATE,
                          "%s: rank %u's AdamW param '%s' has step count %llu, another piece of it %lld", op, b.rank,
                          a->name, (unsigned long long)s.step, R->adamw_step[i]);
      if (!muon__blob_finite(s.exp_avg, (size_t)s.size, 0) || !muon__blob_finite(s.exp_avg_sq, (size_t)s.size, 1))
        return muon__fail(opt, MUON_ERR_STATE,
                          "%s: rank %u's moments of AdamW param '%s' hold NaN, Inf or a negative second moment", op,
                          b.rank, a->name);
      R->adamw_step[i] = (long long)s.step;
      /* Both moments land on the same elements: the second copy marks them arrived. */
      bad = muon__reshard_range(a->state_offset, a->state_size, R->m1 + at, got, 0, s.offset, s.size, s.exp_avg);
      if (bad < 0)
        bad = muon__reshard_range(a->state_offset, a->state_size, R->m2 + at, got, 1, s.offset, s.size, s.exp_avg_sq);
      if (bad >= 0)
        return muon__fail(
            opt, MUON_ERR_STATE,
            "%s: rank %u's moments of AdamW param '%s' differ from another saved replica's (element %llu): they belong to different checkpoints",
            op, b.rank, a->name, (unsigned long long)(a->state_offset + (size_t)bad));
    }
  }
  return MUON_OK;
}

/* Host floats into state (state) or NorMuon's v: directly on the host, else a queued copy (sync
   follows). */
static muon_status muon__put_tensor(muon_optimizer *opt, float *dst, const float *src, size_t n, int state,
                                    const char *op) {
  if (!n) return MUON_OK;
  if (state) MUON__TRY(muon__state_settle(opt, op));
  if (!opt->device || (state && opt->state_host)) { memcpy(dst, src, n * sizeof(float)); return MUON_OK; }
  MUON__TRY(muon__compute_copy(opt, dst, src, n * sizeof(float), 0, 1, op));
  return MUON_OK;
}

static muon_status muon__reshard(muon_optimizer *opt, const void *const *blobs, const size_t *sizes,
                                 const char *const *paths, int n) {
  const char *fn = paths ? "muon_state_reshard_files" : "muon_state_reshard";
  const int nm = opt->n_matrices, na = opt->n_adamw;
  muon__staging R;
  size_t total = 0, d;
  int i, k;
  muon_status st = MUON_OK;
  memset(&R, 0, sizeof R);
  if (n < 1)
    return muon__fail(opt, MUON_ERR_ARG, "%s: n must be >= 1, one per rank of the saving world (got %d)", fn, n);
  if (paths ? 0 : !blobs || !sizes) return muon__fail(opt, MUON_ERR_ARG, "%s: blobs or sizes is NULL", fn);
  for (k = 0; k < n; k++)
    if (paths ? !paths[k] : !blobs[k])
      return muon__fail(opt, MUON_ERR_ARG, "%s: %s[%d] is NULL", fn, paths ? "paths" : "blobs", k);
  R.n = n;
  R.at = (size_t *)muon__alloc(&opt->allocator, (size_t)(nm + na + 1) * sizeof(size_t));
  if (R.at) {
    for (i = 0; i < nm; i++) {
      R.at[i] = total;
      total +=
          muon__owner_momentum(&opt->matrices[i]) ? (size_t)opt->matrices[i].rows * opt->matrices[i].cols : opt->matrices[i].size;
    }
    for (i = 0; i < na; i++) { R.at[nm + i] = total; total += opt->adamw[i].state_size; }
    R.at[nm + na] = total;
    R.mom = (float *)muon__alloc(&opt->allocator, R.at[nm] * sizeof(float) + 1);
    R.m1 = (float *)muon__alloc(&opt->allocator, (total - R.at[nm]) * sizeof(float) + 1);
    R.m2 = (float *)muon__alloc(&opt->allocator, (total - R.at[nm]) * sizeof(float) + 1);
    R.got = (unsigned char *)muon__alloc(&opt->allocator, total + 1);
    R.adamw_step = (long long *)muon__alloc(&opt->allocator, (size_t)(na + 1) * sizeof(long long));
    R.seen = (unsigned char *)muon__alloc(&opt->allocator, (size_t)n);
    R.groups = muon__alloc_groups(opt, &R.adamw_groups);
    R.normuon = (float **)muon__alloc(&opt->allocator, (size_t)(nm + 1) * sizeof(float *));
    R.matched = (unsigned char *)muon__alloc(&opt->allocator, (size_t)nm + 1);
    if (R.normuon) for (i = 0; i < nm; i++) R.normuon[i] = NULL;
  }
  if (!R.at || !R.mom || !R.m1 || !R.m2 || !R.got || !R.adamw_step || !R.seen || !R.groups || !R.normuon ||
      !R.matched) {
    st = muon__fail(opt, MUON_ERR_NOMEM, "%s: allocating the staging of %zu floats failed", fn, total);
    goto done;
  }
  memset(R.got, 0, total);
  memset(R.seen, 0, (size_t)n);
  memset(R.matched, 0, (size_t)nm + 1);
  for (i = 0; i < na; i++) R.adamw_step[i] = -1;
  for (k = 0; k < n && st == MUON_OK; k++) {
    char op[300];
    if (paths) {
      unsigned char *buf = NULL;
      size_t len = 0;
      snprintf(op, sizeof op, "%s: '%s'", fn, paths[k]);
      if ((st = muon__read_file(opt, paths[k], fn, &buf, &len)) == MUON_OK)
        st = muon__reshard_blob(opt, &R, buf, len, op);
      muon__free(&opt->allocator, buf);
    } else {
      snprintf(op, sizeof op, "%s: blob %d", fn, k);
      st = muon__reshard_blob(opt, &R, blobs[k], sizes[k], op);
    }
  }
  if (st != MUON_OK) goto done;
  /* Every local element must have arrived (of a Partial matrix's momentum: all or, where it was
     saved Partial before a step moved it, none). */
  for (i = 0; i < nm; i++) {
    const muon__matrix *x = &opt->matrices[i];
    muon__piece to = muon__owner_momentum(x) ? muon__whole_piece(x->rows, x->cols) : x->piece;
    size_t want = R.at[i + 1] - R.at[i], arrived = 0;
    for (d = 0; d < want; d++) arrived += R.got[R.at[i] + d];
    if (muon__owner_momentum(x) && R.matched[i] && !arrived) continue;
    for (d = 0; d < want && R.got[R.at[i] + d]; d++) {}
    if (d < want) {
      muon__seg s = muon__segs(&to);
      while (muon__next_seg(&to, &s) && (size_t)(s.off + s.len) <= d) {}
      st = muon__fail(
          opt, MUON_ERR_STATE,
          "%s: matrix %d ('%s'): no saved piece holds its element (row %lld, col %lld): the checkpoint has no matrix of this name and layout key %lld, or not all of it",
          fn, i, x->name, s.row, s.col + ((long long)d - s.off), x->layout.key);
      goto done;
    }
  }
  for (i = 0; i < na; i++) {
    const muon__adamw *a = &opt->adamw[i];
    for (d = 0; d < a->state_size && R.got[R.at[nm + i] + d]; d++) {}
    if (d < a->state_size) {
      st = muon__fail(
          opt, MUON_ERR_STATE,
          "%s: AdamW param %d ('%s'): no saved piece holds its element %zu (of %zu): the checkpoint has no AdamW param of this name, or not all of it",
          fn, i, a->name, a->state_offset + d, a->full_size);
      goto done;
    }
  }
  /* NorMuon's v goes to every holder (its owner here may be any of them), and so does a Partial
     matrix's momentum unless a current plan names its owner: room first. */
  for (i = 0; i < nm && st == MUON_OK; i++) {
    muon__matrix *x = &opt->matrices[i];
    int len = R.normuon[i] ? muon__normuon_len(&R.groups[x->group], x->rows, x->cols) : 0;
    if (len && !(x->normuon && x->normuon_len == len)) st = muon__normuon_room(opt, x, len, fn);
    if (st == MUON_OK && muon__owner_momentum(x) && R.got[R.at[i]] && (!opt->plan.ready || muon__owns(opt, x)))
      st = muon__partial_room(opt, x, fn);
  }
  if (st != MUON_OK) goto done;
  /* All arrived: now the optimizer changes. */
  for (i = 0; i < nm && st == MUON_OK; i++) {
    muon__matrix *x = &opt->matrices[i];
    if (muon__owner_momentum(x) && R.got[R.at[i]] && (!opt->plan.ready || muon__owns(opt, x))) {
      st = muon__put_momentum(opt, x, R.mom + R.at[i], x->momentum_size,
                              "muon_state_reshard: writing the state (partly loaded)");
      x->momentum_fresh = 0;
    } else if (muon__owner_momentum(x)) {   /* none saved (planning's zeros then), or not the owner's */
      if (x->momentum) muon__partial_drop(opt, x);
      if (opt->plan.ready && muon__owns(opt, x)) opt->plan.ready = 0;
    } else {
      st = muon__put_momentum(opt, x, R.mom + R.at[i], x->size,
                              "muon_state_reshard: writing the state (partly loaded)");
    }
    if (st == MUON_OK && R.normuon[i])
      st = muon__put_tensor(opt, x->normuon_next ? x->normuon_next : x->normuon, R.normuon[i],
                            (size_t)(x->normuon_next ? x->normuon_next_len : x->normuon_len), 0,
                            "muon_state_reshard: writing the state (partly loaded)");
    else if (st == MUON_OK)
      muon__normuon_drop(opt, x);
  }
  for (i = 0; i < na && st == MUON_OK; i++) {
    muon__adamw *a = &opt->adamw[i];
    size_t at = R.at[nm + i] - R.at[nm];
    if ((st = muon__put_tensor(opt, a->exp_avg, R.m1 + at, a->state_size, 1,
                               "muon_state_reshard: writing the state (partly loaded)")) == MUON_OK)
      st = muon__put_tensor(opt, a->exp_avg_sq, R.m2 + at, a->state_size, 1,
                            "muon_state_reshard: writing the state (partly loaded)");
    a->step = R.adamw_step[i];
  }
  if (st == MUON_OK && opt->device) st = muon__sync(opt, "muon_state_reshard: writing the state (partly loaded)");
  if (st == MUON_OK) {
    muon__normuon_finish_load(opt);
    /* Every holder now has v; planning keeps the owner's and drops the copies, which would go
       stale (only the owner's v moves on) and then disagree in the next checkpoint. */
    for (i = 0; i < nm; i++) if (R.normuon[i]) opt->plan.ready = 0;
    muon__adopt(opt, R.groups, R.adamw_groups, R.steps, R.run, fn);
  }
done:
  if (st != MUON_OK) muon__normuon_drop_next(opt);
  for (i = 0; R.normuon && i < nm; i++) muon__free(&opt->allocator, R.normuon[i]);
  muon__free(&opt->allocator, R.normuon);
  muon__free(&opt->allocator, R.matched);
  muon__free(&opt->allocator, R.at); muon__free(&opt->allocator, R.mom);
  muon__free(&opt->allocator, R.m1); muon__free(&opt->allocator, R.m2);
  muon__free(&opt->allocator, R.got); muon__free(&opt->allocator, R.adamw_step);
  muon__free(&opt->allocator, R.seen); muon__free(&opt->allocator, R.groups);
  muon__free(&opt->allocator, R.group_bytes);
  return st;
}

MUON_API muon_status muon_state_reshard(muon_optimizer *opt, const void *const *blobs, const size_t *sizes, int n) {
  if (!opt) return MUON_ERR_ARG;
  return muon__reshard(opt, blobs, sizes, NULL, n);
}

MUON_API muon_status muon_state_reshard_files(muon_optimizer *opt, const char *const *paths, int n) {
  if (!opt) return MUON_ERR_ARG;
  if (!paths) return muon__fail(opt, MUON_ERR_ARG, "muon_state_reshard_files: paths is NULL");
  return muon__reshard(opt, NULL, NULL, paths, n);
}


/* >>impl-verify -------------------------------------------------------------------------------
   Verifying a setup: whole matrices assembled from the pieces by
   their layouts, a dump of all of them, and a check of every layout against the framework's own
   element positions. Collective, for checks rather than every step: each matrix's pieces go to
   every rank by one allgather, which is simple and shares no code with the step's exchange. */

/* n <= MUON__VOTE numbers from every rank, into the commit vote's buffer (allocated at creation,
   so no rank drops out of these small exchanges for want of memory). Distributed only. */
static muon_status muon__exchange(muon_optimizer *opt, const long long *mine, int n, const long long **all,
                                  const char *op) {
  long long *buf = (long long *)(void *)((unsigned char *)opt->agree +
                                         (size_t)opt->comm.size * (sizeof(muon__record) + MUON__AGREE_SLOT));
  *all = buf;
  return muon__allgather(opt, mine, buf, (size_t)n * sizeof *mine, op);
}
static muon_status muon__exchange3(muon_optimizer *opt, long long a, long long b, long long c, const long long **all,
                                   const char *op) {
  long long mine[3];
  mine[0] = a; mine[1] = b; mine[2] = c;
  return muon__exchange(opt, mine, 3, all, op);
}

/* Every rank plans (together, if anything changed) and agrees on the call's arguments. */
static muon_status muon__tool_begin(muon_optimizer *opt, const char *op, long long a, long long b, long long c) {
  const long long *all;
  muon_status st;
  int p;
  int replanned;
  if (!opt->distributed) return opt->plan.ready ? MUON_OK : muon__plan_local(opt);
  if ((st = muon__agree(opt, 3, MUON_OK, &replanned)) != MUON_OK) return st;   /* re-plans only a stale plan */
  if ((st = muon__exchange3(opt, a, b, c, &all, op)) != MUON_OK) return st;
  for (p = 0; p < opt->comm.size; p++)
    if (all[3 * p] != a || all[3 * p + 1] != b || all[3 * p + 2] != c)
      return muon__fail(
          opt, MUON_ERR_MISMATCH,
          "%s: ranks %d and %d called it with different arguments (%lld, %lld, %lld vs %lld, %lld, %lld): it is collective",
          op, opt->comm.rank, p, a, b, c, all[3 * p], all[3 * p + 1], all[3 * p + 2]);
  return MUON_OK;
}

/* The largest piece any rank holds of global g: the allgather's block. */
static size_t muon__largest_piece(const muon_optimizer *opt, const muon__global *x) {
  const muon__piece *pieces;
  size_t b = 0;
  int j;
  (void)muon__holders_of(opt, x, &pieces);
  for (j = 0; j < x->n_holders; j++) b = MUON__MAX(b, muon__piece_size(&pieces[j]));
  return b;
}

/* Every holder's block (a status float, then `block` floats filled by `fill` on the holders)
   lands on every rank: *blocks is P blocks of *stride floats. */
typedef muon_status (*muon__fill_fn)(muon_optimizer *opt, const muon__matrix *x, float *block, void *arg);

static muon_status muon__share_pieces(muon_optimizer *opt, int g, size_t block, muon__fill_fn fill, void *arg,
                                      float **blocks, size_t *stride, const char *op) {
  const muon__global *x = &opt->plan.globals[g];
  int P = opt->distributed ? opt->comm.size : 1, p;
  size_t W = 1 + block;
  float *mine = (float *)muon__alloc(&opt->allocator, W * sizeof(float));
  float *all = (float *)muon__alloc(&opt->allocator, (size_t)P * W * sizeof(float));
  muon_status st = MUON_OK, local = MUON_OK;
  *blocks = NULL;
  *stride = W;
  if (opt->distributed) {   /* every rank has its buffers, or all stop here together */
    const long long *oks;
    st = muon__exchange3(opt, mine && all, 0, 0, &oks, op);
    for (p = 0; st == MUON_OK && p < P; p++)
      if (!oks[3 * p])
        st = muon__fail(opt, MUON_ERR_NOMEM, "%s: matrix '%s': rank %d could not allocate %zu floats", op, x->name, p,
                        (size_t)P * W);
  } else if (!mine || !all) {
    st = muon__fail(opt, MUON_ERR_NOMEM, "%s: matrix '%s': allocating %zu floats failed", op, x->name, (size_t)P * W);
  }
  if (st != MUON_OK) { muon__free(&opt->allocator, mine); muon__free(&opt->allocator, all); return st; }
  memset(mine, 0, W * sizeof(float));
  if (x->mine >= 0) local = fill(opt, &opt->matrices[x->local], mine + 1, arg);
  mine[0] = (float)local;   /* a rank that could not read its piece still takes part */
  if (opt->distributed) st = muon__allgather(opt, mine, all, W * sizeof(float), op);
  else memcpy(all, mine, W * sizeof(float));
  muon__free(&opt->allocator, mine);
  for (p = 0; st == MUON_OK && p < P; p++)
    if (all[(size_t)p * W] != 0.0f)
      st = p == (opt->distributed ? opt->comm.rank : 0)
               ? local /* this rank's own message stands */
               : muon__fail(opt, (muon_status)(int)all[(size_t)p * W],
                            "%s: matrix '%s': rank %d could not read its piece", op, x->name, p);
  if (st != MUON_OK) { muon__free(&opt->allocator, all); return st; }
  *blocks = all;
  return MUON_OK;
}

/* Both the parameter and the momentum (of a Partial matrix: whole, on its owner only): the root
   keeps what it asked for. */
static muon_status muon__fill_values(muon_optimizer *opt, const muon__matrix *x, float *block, void *arg) {
  muon_status st = muon__read_piece(opt, x, 0, block, (const char *)arg);
  return st == MUON_OK ? muon__read_piece(opt, x, 1, block + x->size, (const char *)arg) : st;
}

/* Global g's parameter and momentum (either may be NULL), whole, on `root`. */
static muon_status muon__assemble(muon_optimizer *opt, int g, int root, float *param, float *momentum, const char *op) {
  const muon__global *x = &opt->plan.globals[g];
  int me = opt->distributed ? opt->comm.rank : 0, j;
  float *blocks;
  size_t W;
  size_t piece = muon__largest_piece(opt, x), full = (size_t)x->rows * x->cols;
  muon_status st =
      muon__share_pieces(opt, g, piece + (x->on_owner ? full : piece), muon__fill_values, (void *)op, &blocks, &W, op);
  const muon__holder *H;
  const muon__piece *pieces;
  if (st != MUON_OK || me != root) { muon__free(&opt->allocator, blocks); return st; }
  H = muon__holders_of(opt, x, &pieces);
  for (j = 0; momentum && x->on_owner && j < x->n_holders; j++)
    if (H[j].rank == x->owner)
      memcpy(momentum, blocks + (size_t)x->owner * W + 1 + muon__piece_size(&pieces[j]), full * sizeof(float));
  for (j = 0; j < x->n_holders; j++) {   /* one copy of each piece: its U source's */
    const muon__holder *h = &H[j];
    const float *b = blocks + (size_t)(opt->distributed ? h->rank : 0) * W + 1;
    const muon__piece *p = &pieces[j];
    size_t n = muon__piece_size(p);
    muon__seg s = muon__segs(p);
    if (h->source != h->rank) continue;
    while (muon__next_seg(p, &s)) {
      size_t at = (size_t)s.row * (size_t)x->cols + (size_t)s.col;
      if (param) memcpy(param + at, b + s.off, (size_t)s.len * sizeof(float));
      if (momentum && !x->on_owner) memcpy(momentum + at, b + n + s.off, (size_t)s.len * sizeof(float));
    }
  }
  muon__free(&opt->allocator, blocks);
  return MUON_OK;
}

MUON_API muon_status muon_gather_matrix(muon_optimizer *opt, int global, int root, float *param, float *momentum) {
  const char *op = "muon_gather_matrix";
  int P;
  muon_status st;
  if (!opt) return MUON_ERR_ARG;
  if ((st = muon__tool_begin(opt, op, global, root, 0)) != MUON_OK) return st;
  P = opt->distributed ? opt->comm.size : 1;
  if (global < 0 || global >= opt->plan.n_globals || root < 0 || root >= P)
    return muon__fail(opt, MUON_ERR_ARG, "%s: global matrix %d (have %d), root %d (of %d ranks)", op, global,
                      opt->plan.n_globals, root, P);
  return muon__assemble(opt, global, root, param, momentum, op);
}

/* A dump file, little-endian: "MUONDUMP" | u32 version 1 | u32 records | u64 steps, then per
   record: u32 kind (0 a matrix's parameter, 1 its momentum; 2 reserved for AdamW parameters)
   | u32 name length | the name | u32 rows | u32 cols | rows x cols f32, row-major | u64 FNV-1a of
   the record's bytes from kind on. tools/muoncmp.c compares two of them. */
#define MUON__DUMP_VERSION 1u

static int muon__dump_record(muon__afile *f, unsigned char *buf, uint32_t kind, const char *name, int rows, int cols,
                             const float *x) {
  unsigned char *p = buf;
  size_t len = strlen(name), n = (size_t)rows * (size_t)cols;
  muon__put32(&p, kind);
  muon__put32(&p, (uint32_t)len);
  memcpy(p, name, len);
  p += len;
  muon__put32(&p, (uint32_t)rows);
  muon__put32(&p, (uint32_t)cols);
  muon__put_floats(&p, x, n);
  muon__put64(&p, muon__fnv1a(buf, (size_t)(p - buf)));
  return muon__afile_write(f, buf, (size_t)(p - buf));
}

MUON_API muon_status muon_dump_file(muon_optimizer *opt, const char *path, int root, int with_momentum) {
  const char *op = "muon_dump_file";
  const muon__plan *pl;
  int P, me, g, err = 0, opened = 0;
  muon__afile f;
  float *param = NULL, *mom = NULL;
  unsigned char *buf = NULL;
  size_t biggest = 0;
  muon_status st;
  if (!opt) return MUON_ERR_ARG;
  with_momentum = with_momentum != 0;
  if ((st = muon__tool_begin(opt, op, root, with_momentum, 0)) != MUON_OK) return st;
  pl = &opt->plan;
  P = opt->distributed ? opt->comm.size : 1;
  me = opt->distributed ? opt->comm.rank : 0;
  if (root < 0 || root >= P) return muon__fail(opt, MUON_ERR_ARG, "%s: root %d (of %d ranks)", op, root, P);
  if (me == root) {   /* a failure here is remembered, and this rank still takes part to the end */
    for (g = 0; g < pl->n_globals; g++)
      if ((size_t)pl->globals[g].rows * (size_t)pl->globals[g].cols > biggest)
        biggest = (size_t)pl->globals[g].rows * (size_t)pl->globals[g].cols;
    param = (float *)muon__alloc(&opt->allocator, biggest * sizeof(float) + 1);
    mom = with_momentum ? (float *)muon__alloc(&opt->allocator, biggest * sizeof(float) + 1) : NULL;
    buf = (unsigned char *)muon__alloc(&opt->allocator, 4 * biggest + 96);
    if (!path) err = EINVAL;
    else if (!param || (with_momentum && !mom) || !buf) err = ENOMEM;
    else {
      unsigned char *p = buf;
      opened = 1;
      if ((err = muon__afile_open(&f, &opt->allocator, path)) == MUON__F_NOMEM) err = ENOMEM;
      memcpy(p, "MUONDUMP", 8); p += 8;
      muon__put32(&p, MUON__DUMP_VERSION);
      muon__put32(&p, (uint32_t)(pl->n_globals * (1 + with_momentum)));
      muon__put64(&p, (uint64_t)opt->stats.steps);
      if (!err) err = muon__afile_write(&f, buf, 24);
    }
  }
  for (g = 0; g < pl->n_globals; g++) {
    const muon__global *x = &pl->globals[g];
    int write = me == root && !err;
    if ((st = muon__assemble(opt, g, root, write ? param : NULL, write && with_momentum ? mom : NULL, op)) != MUON_OK)
      break;
    if (write) err = muon__dump_record(&f, buf, 0, x->name, x->rows, x->cols, param);
    if (write && !err && with_momentum) err = muon__dump_record(&f, buf, 1, x->name, x->rows, x->cols, mom);
  }
  if (opened && st == MUON_OK && !err) err = muon__afile_commit(&f);
  if (opened) muon__afile_close(&f);   /* the temporary goes unless the commit renamed it */
  muon__free(&opt->allocator, param); muon__free(&opt->allocator, mom);
  muon__free(&opt->allocator, buf);
  if (st != MUON_OK) return st;
  if (opt->distributed) {   /* the root's verdict, on every rank */
    const long long *all;
    if ((st = muon__exchange3(opt, err, 0, 0, &all, op)) != MUON_OK) return st;
    err = (int)all[3 * root];
  }
  if (err == EINVAL) return muon__fail(opt, MUON_ERR_ARG, "%s: path is NULL on the root, rank %d", op, root);
  if (err)
    return muon__fail(opt, MUON_ERR_STATE, "%s: rank %d could not write '%s': %s", op, root,
                      me == root && path ? path : "the dump", muon__file_reason(err));
  return MUON_OK;
}

/* The framework's view of where this rank's elements are: local element k of this rank's matrix
   `index` (muon_add_matrix order) is element row * cols + col of the full matrix. */
typedef struct muon__index_arg { muon_index_fn fn; void *user; } muon__index_arg;

static muon_status muon__fill_indices(muon_optimizer *opt, const muon__matrix *x, float *block, void *arg) {
  const muon__index_arg *a = (const muon__index_arg *)arg;
  long long full = (long long)x->rows * x->cols, i;
  size_t k;
  for (k = 0; k < x->size; k++) {
    i = a->fn(a->user, (int)(x - opt->matrices), k);
    if (i < 0 || i >= full) { block[2 * k] = -1.0f; block[2 * k + 1] = -1.0f; continue; }
    block[2 * k] = (float)(i & 0xffffff);   /* exact: 24 bits each */
    block[2 * k + 1] = (float)(i >> 24);
  }
  return MUON_OK;
}

/* The first element of a holder's block (two floats per element: the framework's full index, 24
   bits each) that is not where the declared piece puts it: local k, declared and framework's
   full indices (-1: outside the matrix). 0 if every element is in place. */
static int muon__misplaced(const muon__global *x, const muon__piece *p, const float *b, size_t *k, long long *want,
                           long long *got) {
  muon__seg s = muon__segs(p);
  while (muon__next_seg(p, &s)) {
    long long i;
    for (i = 0; i < s.len; i++) {
      *k = (size_t)(s.off + i);
      *want = s.row * x->cols + s.col + i;
      *got = b[2 * *k] < 0 ? -1 : (long long)b[2 * *k] + ((long long)b[2 * *k + 1] << 24);
      if (*got != *want) return 1;
    }
  }
  return 0;
}

MUON_API muon_status muon_check_layouts(muon_optimizer *opt, muon_index_fn index, void *user) {
  const char *op = "muon_check_layouts";
  muon__index_arg arg;
  int g, j;
  muon_status st;
  if (!opt) return MUON_ERR_ARG;
  if ((st = muon__tool_begin(opt, op, index != NULL, 0, 0)) != MUON_OK) return st;
  if (!index)
    return muon__fail(opt, MUON_ERR_ARG, "%s: index is NULL (give the framework's position of each local element)", op);
  arg.fn = index;
  arg.user = user;
  for (g = 0; g < opt->plan.n_globals; g++) {
    const muon__global *x = &opt->plan.globals[g];
    const muon__holder *H;
    const muon__piece *pieces;
    float *blocks;
    size_t W;
    st = muon__share_pieces(opt, g, 2 * muon__largest_piece(opt, x), muon__fill_indices, &arg, &blocks, &W, op);
    if (st != MUON_OK) return st;
    H = muon__holders_of(opt, x, &pieces);
    /* Every rank checks every holder's piece: all reach the same verdict without another exchange. */
    for (j = 0; j < x->n_holders; j++) {
      const muon__holder *h = &H[j];
      size_t k;
      long long want, got;
      char levels[240];
      if (!muon__misplaced(x, &pieces[j], blocks + (size_t)(opt->distributed ? h->rank : 0) * W + 1, &k, &want, &got)) continue;
      muon__holder_text(&opt->plan, h, levels, sizeof levels);
      if (got < 0)
        st = muon__fail(
            opt, MUON_ERR_SHAPE,
            "%s: matrix '%s' (%d x %d): rank %d's local element %zu is outside the matrix by the framework's index", op,
            x->name, x->rows, x->cols, h->rank, k);
      else
        st = muon__fail(
            opt, MUON_ERR_SHAPE,
            "%s: matrix '%s' (%d x %d): rank %d described its piece as [%s], which puts its local element %zu at (row %lld, col %lld); "
            "the framework has it at (row %lld, col %lld)",
            op, x->name, x->rows, x->cols, h->rank, levels, k, want / x->cols, want % x->cols, got / x->cols,
            got % x->cols);
      muon__free(&opt->allocator, blocks);
      return st;
    }
    muon__free(&opt->allocator, blocks);
  }
  return MUON_OK;
}

/* >>impl-qkclip -------------------------------------------------------------------------------
   MuonClip's QK-clip (see >>qkclip): the arguments checked on every rank, the call agreed with
   the step's agreement (kind 4) and one exchange of three numbers, the max logits agreed by a
   reduce-scatter and an allgather (two alltoallvs, O(heads) floats per rank at any world size),
   then each rank's own rows scaled through the compute backend. */
#define MUON__CLIP_TAG 0x716b636cll   /* "qkcl": muon_qk_clip's first number in its exchange */

static muon_status muon__cpu_scale(void *ctx, size_t n, void *param, float factor, const muon_apply_args *a);

MUON_API muon_qk_clip_desc muon_default_qk_clip_desc(void) {
  muon_qk_clip_desc d;
  memset(&d, 0, sizeof d);
  d.tau = 100.0f;
  d.alpha = 0.5f;
  return d;
}

static int muon__clip_kv(const muon_qk_clip_layer *y) { return y->n_kv_heads ? y->n_kv_heads : y->n_heads; }

/* This rank's arguments, before any exchange: every field, and every max logit. *heads gets the
   query heads of all layers, *digest what every rank must pass alike. */
static muon_status muon__clip_args(muon_optimizer *opt, const muon_qk_clip_desc *d, size_t *heads, uint64_t *digest) {
  const char *op = "muon_qk_clip";
  uint64_t h = MUON__FNV_START;
  unsigned char buf[48], *p;
  int l, i;
  *heads = 0;
  *digest = 0;
  if (!d) return muon__fail(opt, MUON_ERR_ARG, "%s: desc is NULL", op);
  if (!(muon__finite(d->tau) && d->tau > 0))
    return muon__fail(opt, MUON_ERR_ARG, "%s: muon_qk_clip_desc.tau must be finite and > 0 (got %g)", op, (double)d->tau);
  if (!(d->alpha >= 0 && d->alpha <= 1))
    return muon__fail(opt, MUON_ERR_ARG, "%s: muon_qk_clip_desc.alpha must be in [0, 1] (got %g)", op,
                      (double)d->alpha);
  if (d->n_layers < 0 || (d->n_layers > 0 && !d->layers))
    return muon__fail(opt, MUON_ERR_ARG, "%s: muon_qk_clip_desc.n_layers is %d and layers %s", op, d->n_layers,
                      d->layers ? "set" : "NULL");
  p = buf;
  muon__put32(&p, muon__f2u(d->tau)); muon__put32(&p, muon__f2u(d->alpha)); muon__put32(&p, (uint32_t)d->n_layers);
  h = muon__fnv1a_more(h, buf, (size_t)(p - buf));
  for (l = 0; l < d->n_layers; l++) {
    const muon_qk_clip_layer *y = &d->layers[l];
    int kv = muon__clip_kv(y);
#define MUON__BAD(st, ...) do { char what_[300]; snprintf(what_, sizeof what_, __VA_ARGS__); \
    return muon__fail(opt, st, "%s: muon_qk_clip_desc.layers[%d]%s; nothing was scaled", op, l, what_); } while (0)
    if (!y->q || !y->k) MUON__BAD(MUON_ERR_ARG, ".%s is NULL (the name of a registered matrix)", y->q ? "k" : "q");
    if (y->n_heads <= 0) MUON__BAD(MUON_ERR_ARG, ".n_heads must be > 0 (got %d)", y->n_heads);
    if (kv <= 0 || y->n_heads % kv)
      MUON__BAD(MUON_ERR_ARG, ".n_kv_heads must divide n_heads = %d (got %d; 0: n_heads)", y->n_heads, y->n_kv_heads);
    if (y->head_dim <= 0) MUON__BAD(MUON_ERR_ARG, ".head_dim must be > 0 (got %d)", y->head_dim);
    if (y->q_row < 0 || y->k_row < 0) MUON__BAD(MUON_ERR_ARG, ".q_row and .k_row must be >= 0 (got %d, %d)", y->q_row, y->k_row);
    if (!y->max_logits) MUON__BAD(MUON_ERR_ARG, ".max_logits is NULL (give -INFINITY for heads this rank did not see)");
    for (i = 0; i < y->n_heads; i++)   /* NaN, or +Inf: the forward overflowed; -Inf: nothing seen */
      if (!muon__finite(y->max_logits[i]) && !(y->max_logits[i] < 0))
        MUON__BAD(MUON_ERR_NONFINITE, ".max_logits[%d] is %s on rank %d", i, y->max_logits[i] > 0 ? "+Inf" : "NaN",
                  opt->distributed ? opt->comm.rank : 0);
#undef MUON__BAD
    if ((size_t)y->n_heads > MUON__MAX_FLOATS / 64 - *heads)
      return muon__fail(opt, MUON_ERR_ARG, "%s: muon_qk_clip_desc.layers hold too many heads", op);
    *heads += (size_t)y->n_heads;
    p = buf;
    muon__put64(&p, muon__name_hash(y->q, -1)); muon__put64(&p, muon__name_hash(y->k, -1));
    muon__put32(&p, (uint32_t)y->q_row); muon__put32(&p, (uint32_t)y->k_row);
    muon__put32(&p, (uint32_t)y->n_heads); muon__put32(&p, (uint32_t)kv); muon__put32(&p, (uint32_t)y->head_dim);
    h = muon__fnv1a_more(h, buf, (size_t)(p - buf));
  }
  if (opt->device && !MUON__SLOT(opt->compute.vt, 1, scale))
    return muon__fail(opt, MUON_ERR_BACKEND,
                      "%s: the compute backend keeps the weights in device memory and has no scale slot; nothing was scaled", op);
  *digest = h;
  return MUON_OK;
}

/* Every rank takes the same branch: this rank's verdict joins the agreement (with muon_step's
   checks: the same step, run and settings; a stale plan re-planned together), then the ranks
   compare what they passed. */
static muon_status muon__clip_begin(muon_optimizer *opt, muon_status mine, size_t heads, uint64_t digest) {
  const char *op = "muon_qk_clip";
  const long long *all;
  int p, replanned;
  muon_status st;
  if (!opt->distributed) {
    if (mine != MUON_OK) return mine;
    return opt->plan.ready ? MUON_OK : muon__plan_local(opt);
  }
  if ((st = muon__agree(opt, 4, (uint32_t)mine, &replanned)) != MUON_OK) return st;
  if ((st = muon__exchange3(opt, MUON__CLIP_TAG, (long long)heads, (long long)digest, &all, op)) != MUON_OK) return st;
  for (p = 0; p < opt->comm.size; p++)
    if (all[3 * p] != MUON__CLIP_TAG || all[3 * p + 1] != (long long)heads || all[3 * p + 2] != (long long)digest)
      return muon__fail(opt, MUON_ERR_MISMATCH,
                        "%s: ranks %d and %d passed different layers, tau or alpha (%lld vs %lld heads): every rank "
                        "passes the same, only max_logits differ; nothing was scaled",
                        op, opt->comm.rank, p, (long long)heads, all[3 * p + 1]);
  return MUON_OK;
}

/* The one global matrix named `name` (any rank's), or -1 with the message; the same on every rank. */
static int muon__clip_find(muon_optimizer *opt, const char *name, int l, const char *field, muon_status *st) {
  uint64_t h = muon__name_hash(name, -1);
  int g, found = -1;
  for (g = 0; g < opt->plan.n_globals; g++)   /* one device's plan matches by index: its names */
    if ((opt->distributed ? opt->plan.globals[g].name_hash : opt->matrices[opt->plan.globals[g].local].name_hash) == h) {
      if (found >= 0) {
        *st = muon__fail(opt, MUON_ERR_ARG,
                         "muon_qk_clip: muon_qk_clip_desc.layers[%d].%s: '%s' names two matrices (layout keys %lld and "
                         "%lld); nothing was scaled", l, field, name, opt->plan.globals[found].key, opt->plan.globals[g].key);
        return -1;
      }
      found = g;
    }
  if (found < 0)
    *st = muon__fail(opt, MUON_ERR_ARG,
                     "muon_qk_clip: muon_qk_clip_desc.layers[%d].%s: no rank registered a matrix '%s'; nothing was scaled",
                     l, field, name);
  return found;
}

/* Every layer's matrices, and its heads' rows inside them (the plan is the same on every rank). */
static muon_status muon__clip_resolve(muon_optimizer *opt, const muon_qk_clip_desc *d, int *gq, int *gk) {
  muon_status st = MUON_OK;
  int l;
  for (l = 0; l < d->n_layers; l++) {
    const muon_qk_clip_layer *y = &d->layers[l];
    const muon__global *q, *k;
    long long qe = (long long)y->q_row + (long long)y->n_heads * y->head_dim;
    long long ke = (long long)y->k_row + (long long)muon__clip_kv(y) * y->head_dim;
    if ((gq[l] = muon__clip_find(opt, y->q, l, "q", &st)) < 0 || (gk[l] = muon__clip_find(opt, y->k, l, "k", &st)) < 0)
      return st;
    q = &opt->plan.globals[gq[l]];
    k = &opt->plan.globals[gk[l]];
    if (qe > q->rows || ke > k->rows)
      return muon__fail(opt, MUON_ERR_SHAPE,
                        "muon_qk_clip: muon_qk_clip_desc.layers[%d]: %s rows [%d, %lld) do not fit '%s' (%d rows); "
                        "nothing was scaled", l, qe > q->rows ? "query" : "key", qe > q->rows ? y->q_row : y->k_row,
                        qe > q->rows ? qe : ke, qe > q->rows ? q->name : k->name, qe > q->rows ? q->rows : k->rows);
    if (gq[l] == gk[l] && y->q_row < ke && y->k_row < qe)
      return muon__fail(opt, MUON_ERR_ARG,
                        "muon_qk_clip: muon_qk_clip_desc.layers[%d]: query rows [%d, %lld) and key rows [%d, %lld) of "
                        "'%s' overlap; nothing was scaled", l, y->q_row, qe, y->k_row, ke, q->name);
  }
  return MUON_OK;
}

/* Rows [lo, hi) of global g times factor, where this rank's piece holds them: a piece is a
   range of the row-major flattening of its rectangle, so those rows are one contiguous run of it. */
static muon_status muon__clip_rows(muon_optimizer *opt, int g, long long lo, long long hi, float factor) {
  const muon__global *x = &opt->plan.globals[g];
  const char *op = "muon_qk_clip: scaling rows (this rank's may be partly scaled)";
  muon_status (*slot)(void *, size_t, void *, float, const muon_apply_args *);
  const muon__matrix *m;
  muon__piece p;
  muon_apply_args a;
  long long k0, k1;
  size_t es;
  if (x->local < 0 || factor == 1.0f) return MUON_OK;
  m = &opt->matrices[x->local];
  p = m->piece;
  if (p.w <= 0 || hi <= p.r0 || lo >= p.r0 + p.h) return MUON_OK;
  k0 = ((lo > p.r0 ? lo : p.r0) - p.r0) * p.w;
  k1 = ((hi < p.r0 + p.h ? hi : p.r0 + p.h) - p.r0) * p.w;
  if (k0 < p.f0) k0 = p.f0;
  if (k1 > p.f1) k1 = p.f1;
  if (k1 <= k0) return MUON_OK;
  memset(&a, 0, sizeof a);
  a.param_dtype = m->param_dtype;
  es = muon__dtype_size(m->param_dtype);
  a.mirror = m->mirror ? (char *)m->mirror + (size_t)(k0 - p.f0) * 2 : NULL;
  a.rounding = opt->rounding;
  a.seed = muon__sr_seed(opt, m->name_hash ^ 0x716b2d636c6970ull);   /* "qk-clip": not the step's bits */
  a.piece = muon__whole(m->rows, m->cols, 0, 0);
  a.piece.r0 = p.r0; a.piece.c0 = p.c0; a.piece.h = p.h; a.piece.w = p.w;
  a.piece.f0 = k0; a.piece.f1 = k1;   /* element 0 of the call is the run's first */
  slot = MUON__SLOT(opt->compute.vt, 1, scale);
  if (!slot) return muon__cpu_scale(NULL, (size_t)(k1 - k0), (char *)m->param + (size_t)(k0 - p.f0) * es, factor, &a);
  return muon__compute_done(opt, slot(opt->compute.ctx, (size_t)(k1 - k0), (char *)m->param + (size_t)(k0 - p.f0) * es,
                                      factor, &a), op);
}

/* Kimi K2's factors from the agreed maxes S of one layer, and the rows they scale. */
static muon_status muon__clip_layer(muon_optimizer *opt, const muon_qk_clip_layer *y, const float *S, double tau,
                                    double alpha, int gq, int gk, int *clipped) {
  int kv = muon__clip_kv(y), G = y->n_heads / kv, h, j;
  long long d = y->head_dim;
  for (j = 0; j < kv; j++) {   /* a key head: the largest logit of the query heads sharing it */
    float s = S[j * G];
    for (h = j * G + 1; h < (j + 1) * G; h++) if (S[h] > s) s = S[h];
    if (s > tau)
      MUON__TRY(muon__clip_rows(opt, gk, y->k_row + j * d, y->k_row + (j + 1) * d, (float)pow(tau / s, 1.0 - alpha)));
  }
  for (h = 0; h < y->n_heads; h++) {
    if (!(S[h] > tau)) continue;
    ++*clipped;
    MUON__TRY(muon__clip_rows(opt, gq, y->q_row + h * d, y->q_row + (h + 1) * d, (float)pow(tau / S[h], alpha)));
  }
  return MUON_OK;
}

/* Rank j's share of H heads: [lo, lo + n). */
static void muon__clip_share(size_t H, int P, int j, size_t *lo, size_t *n) {
  size_t c = (H + (size_t)P - 1) / (size_t)P, a = MUON__MIN(H, (size_t)j * c);
  *lo = a;
  *n = MUON__MIN(H, a + c) - a;
}

/* Floats the agreement on the max logits works in: this rank's view of the H heads, then the P
   views of its share (whose first floats become the share's max). */
static size_t muon__clip_floats(size_t H, int P, int me) {
  size_t lo, n;
  muon__clip_share(H, P, me, &lo, &n);
  return H + (size_t)P * n;
}

/* The max of every head over the ranks, the same bits on every rank, into host[0, H) (this
   rank's view on entry; muon__clip_floats floats in all): rank j takes the maxima of its share
   of the heads (muon__clip_share) in rank order and sends them to every rank. An allgather of
   the views would bring P x H floats to each rank (256 MB per call for 3,904 heads on 16,384
   ranks); this about 2 H. buf is host itself, or on a device communicator device memory of the
   same size; wire: 4 P counts. */
static muon_status muon__clip_max(muon_optimizer *opt, float *host, float *buf, size_t H, size_t *wire,
                                  const char *op) {
  int P = opt->comm.size, me = opt->comm.rank, p, dev = buf != host;
  size_t lo, n, k;
  float *views = host + H;
  muon__clip_share(H, P, me, &lo, &n);
  for (p = 0; p < P; p++) {   /* reduce-scatter: each rank's share of this view to that rank */
    muon__clip_share(H, P, p, &wire[P + p], &wire[p]);
    wire[2 * P + p] = n;
    wire[3 * P + p] = (size_t)p * n;
  }
  if (dev) MUON__TRY(muon__compute_copy(opt, buf, host, H * sizeof(float), 0, 1, op));
  MUON__TRY(muon__alltoallv(opt, buf, buf + H, wire, 1, op));
  if (dev) {
    MUON__TRY(muon__compute_copy(opt, views, buf + H, (size_t)P * n * sizeof(float), 1, 0, op));
    MUON__TRY(muon__sync(opt, op));
  }
  for (k = 0; k < n; k++)   /* views[k] becomes the max: rank 0's value first, then any greater */
    for (p = 1; p < P; p++)
      if (views[(size_t)p * n + k] > views[k]) views[k] = views[(size_t)p * n + k];
  for (p = 0; p < P; p++) {   /* allgather: this rank's maxima to every rank */
    wire[p] = n;
    wire[P + p] = 0;
    muon__clip_share(H, P, p, &wire[3 * P + p], &wire[2 * P + p]);
  }
  if (dev) MUON__TRY(muon__compute_copy(opt, buf + H, views, n * sizeof(float), 0, 1, op));
  MUON__TRY(muon__alltoallv(opt, buf + H, buf, wire, 1, op));
  if (dev) {
    MUON__TRY(muon__compute_copy(opt, host, buf, H * sizeof(float), 1, 0, op));
    MUON__TRY(muon__sync(opt, op));
  }
  return MUON_OK;
}

MUON_API muon_status muon_qk_clip(muon_optimizer *opt, const muon_qk_clip_desc *desc, int *clipped) {
  const char *op = "muon_qk_clip";
  int P, me, l, n = 0, *gq = NULL;
  size_t H = 0, at, floats = 0;
  uint64_t digest = 0;
  float *mine = NULL, *buf = NULL;
  size_t *wire = NULL;
  muon_status st;
  if (clipped) *clipped = 0;
  if (!opt) return MUON_ERR_ARG;
  P = opt->distributed ? opt->comm.size : 1;
  me = opt->distributed ? opt->comm.rank : 0;
  st = muon__clip_args(opt, desc, &H, &digest);
  if (st == MUON_OK) {   /* the max logits' agreement (host; device too for a device communicator), the matrices */
    floats = muon__clip_floats(H, P, me);
    mine = (float *)muon__alloc(&opt->allocator, floats * sizeof(float) + 1);
    wire = (size_t *)muon__alloc(&opt->allocator, 4 * (size_t)P * sizeof(size_t));
    gq = (int *)muon__alloc(&opt->allocator, 2 * (size_t)desc->n_layers * sizeof(int) + 1);
    buf = mine;
    if (opt->distributed && opt->comm.vt->memory == MUON_MEMORY_DEVICE) {
      if (opt->clip_cap < floats || !opt->clip_dev) {
        muon__compute_free(opt, opt->clip_dev);
        opt->clip_dev = (float *)muon__compute_alloc(opt, floats * sizeof(float) + 1);
        opt->clip_cap = opt->clip_dev ? floats : 0;
      }
      buf = opt->clip_dev;
    }
    if (!mine || !wire || !gq || !buf)
      st = muon__fail(opt, MUON_ERR_NOMEM, "%s: allocating %zu floats failed; nothing was scaled", op, floats);
  }
  if ((st = muon__clip_begin(opt, st, H, digest)) != MUON_OK ||
      (st = muon__clip_resolve(opt, desc, gq, gq + desc->n_layers)) != MUON_OK)
    goto done;
  for (l = 0, at = 0; l < desc->n_layers; at += (size_t)desc->layers[l].n_heads, l++)
    memcpy(mine + at, desc->layers[l].max_logits, (size_t)desc->layers[l].n_heads * sizeof(float));
  if (opt->distributed && (st = muon__clip_max(opt, mine, buf, H, wire, op)) != MUON_OK) goto done;
  if (desc->max_logits_out) memcpy(desc->max_logits_out, mine, H * sizeof(float));
  for (l = 0, at = 0; l < desc->n_layers && st == MUON_OK; at += (size_t)desc->layers[l].n_heads, l++)
    st = muon__clip_layer(opt, &desc->layers[l], mine + at, (double)desc->tau, (double)desc->alpha, gq[l],
                          gq[desc->n_layers + l], &n);
  if (clipped && st == MUON_OK) *clipped = n;
done:
  muon__free(&opt->allocator, mine);
  muon__free(&opt->allocator, wire);
  muon__free(&opt->allocator, gq);
  return st;
}

/* =============================================================================================
   >>impl-cpu-backend  THE CPU BACKEND (desc.compute NULL, muon_cpu_create): its threads, its
   GEMM, Newton-Schulz and its slots. The core above reaches it through the compute vtable, and
   through the few functions declared before the core: muon__cpu_init (the optimizer's own CPU
   backend), muon__cpu_threads and muon__is_cpu (round sizes on one device), muon__ns_cost
   (owners are balanced by it) and the workspace formulas.
   ============================================================================================= */
/* >>impl-threads ------------------------------------------------------------------------------
   Threads of the CPU backend: muon_cpu_desc.threads.count resolved once, at creation, and
   muon's own pool. The pool's workers wait for a generation number to move; task 0 runs on the
   caller. */
#define MUON__MAX_THREADS 1024

static muon_status muon__thread_count(const muon_threads *t, int *count, char *msg, size_t size) {
  const char *env = getenv("MUON_THREADS");
  *count = 1;
  if (t->count < 0 || t->count > MUON__MAX_THREADS) {
    snprintf(msg, size, "MUON_ERR_ARG: muon_cpu_desc.threads.count must be in [0, %d] (got %d)", MUON__MAX_THREADS,
             t->count);
    return MUON_ERR_ARG;
  }
  if (t->count) *count = t->count;
  else if (env && *env) {
    char *end;
    long v = strtol(env, &end, 10);
    if (*end || v < 1 || v > MUON__MAX_THREADS) {
      snprintf(msg, size, "MUON_ERR_ARG: environment MUON_THREADS='%.40s' is not a thread count in [1, %d]", env,
               MUON__MAX_THREADS);
      return MUON_ERR_ARG;
    }
    *count = (int)v;
  }
  if (*count > 1 && !t->parallel_for && !MUON__POOL) {
    snprintf(
        msg, size,
        "MUON_ERR_ARG: %d threads asked for, but this build has no thread pool (MUON_NO_THREADS, or not POSIX): set muon_cpu_desc.threads.parallel_for",
        *count);
    return MUON_ERR_ARG;
  }
  return MUON_OK;
}

#if MUON__POOL
struct muon__pool {
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  pthread_t *workers;
  int n_workers, busy, stop;
  unsigned long generation;
  muon_task_fn fn;
  void *arg;
  int n_tasks;
};

typedef struct muon__worker_arg { muon__pool *pool; int task; } muon__worker_arg;

static void muon__noop_task(void *arg, int task) { (void)arg; (void)task; }

static void *muon__pool_worker(void *p) {
  muon__worker_arg w = *(const muon__worker_arg *)p;
  muon__pool *pool = w.pool;
  unsigned long seen = 0;
  pthread_mutex_lock(&pool->mu);
  for (;;) {
    while (!pool->stop && pool->generation == seen) pthread_cond_wait(&pool->go, &pool->mu);
    if (pool->stop) break;
    seen = pool->generation;
    if (w.task < pool->n_tasks) {
      muon_task_fn fn = pool->fn;
      void *arg = pool->arg;
      pthread_mutex_unlock(&pool->mu);
      fn(arg, w.task);
      pthread_mutex_lock(&pool->mu);
    }
    if (--pool->busy == 0) pthread_cond_signal(&pool->done);
  }
  pthread_mutex_unlock(&pool->mu);
  return NULL;
}

static void muon__pool_run(void *user, int n, muon_task_fn fn, void *arg) {
  muon__pool *pool = (muon__pool *)user;
  pthread_mutex_lock(&pool->mu);
  pool->fn = fn;
  pool->arg = arg;
  pool->n_tasks = n;
  pool->busy = pool->n_workers;
  pool->generation++;
  pthread_cond_broadcast(&pool->go);
  pthread_mutex_unlock(&pool->mu);
  fn(arg, 0);
  pthread_mutex_lock(&pool->mu);
  while (pool->busy) pthread_cond_wait(&pool->done, &pool->mu);
  pthread_mutex_unlock(&pool->mu);
}

static void muon__pool_stop(muon__cpu *cpu) {
  muon__pool *pool = cpu->pool;
  int w;
  if (!pool) return;
  pthread_mutex_lock(&pool->mu);
  pool->stop = 1;
  pthread_cond_broadcast(&pool->go);
  pthread_mutex_unlock(&pool->mu);
  for (w = 0; w < pool->n_workers; w++) pthread_join(pool->workers[w], NULL);
  pthread_cond_destroy(&pool->go);
  pthread_cond_destroy(&pool->done);
  pthread_mutex_destroy(&pool->mu);
  muon__free(cpu->allocator, pool->workers);
  muon__free(cpu->allocator, pool);
  cpu->pool = NULL;
  cpu->parallel_for = NULL;
}

/* threads - 1 workers; the caller is the last one. */
static muon_status muon__pool_start(muon__cpu *cpu, char *msg, size_t size) {
  int n = cpu->threads - 1, w, err = 0;
  muon__worker_arg *args;
  muon__pool *pool = (muon__pool *)muon__alloc(cpu->allocator, sizeof *pool);
  args = (muon__worker_arg *)muon__alloc(cpu->allocator, (size_t)n * sizeof *args);
  if (pool) pool->workers = (pthread_t *)muon__alloc(cpu->allocator, (size_t)n * sizeof(pthread_t));
  if (!pool || !args || !pool->workers) {
    if (pool) muon__free(cpu->allocator, pool->workers);
    muon__free(cpu->allocator, pool);
    muon__free(cpu->allocator, args);
    snprintf(msg, size, "MUON_ERR_NOMEM: allocating the CPU backend's thread pool (%d threads) failed", cpu->threads);
    return MUON_ERR_NOMEM;
  }
  pool->n_workers = 0;
  pool->busy = 0;
  pool->stop = 0;
  pool->generation = 0;
  pool->fn = NULL;
  pool->arg = NULL;
  pool->n_tasks = 0;
  pthread_mutex_init(&pool->mu, NULL);
  pthread_cond_init(&pool->go, NULL);
  pthread_cond_init(&pool->done, NULL);
  cpu->pool = pool;
  for (w = 0; w < n && !err; w++) {
    args[w].pool = pool;
    args[w].task = w + 1;
    if ((err = pthread_create(&pool->workers[w], NULL, muon__pool_worker, &args[w])) == 0) pool->n_workers++;
  }
  /* every worker has copied its argument once it has taken the lock: a run flushes them */
  cpu->parallel_for = muon__pool_run;
  cpu->user = pool;
  muon__pool_run(pool, 1, muon__noop_task, NULL);
  muon__free(cpu->allocator, args);
  if (err) {
    muon__pool_stop(cpu);
    snprintf(msg, size, "MUON_ERR_NOMEM: muon_create: starting thread %d of %d failed: %s", w + 1, n + 1,
             strerror(err));
    return MUON_ERR_NOMEM;
  }
  return MUON_OK;
}
#else
static muon_status muon__pool_start(muon__cpu *cpu, char *msg, size_t size) {
  (void)cpu;
  snprintf(msg, size, "MUON_ERR_ARG: this build has no thread pool");
  return MUON_ERR_ARG;
}
static void muon__pool_stop(muon__cpu *cpu) { (void)cpu; }
#endif

/* A CPU backend's context from its desc: the GEMM chosen, the thread count resolved, and muon's
   own pool started when there are threads and no parallel_for. */
static muon_status muon__cpu_init(muon__cpu *cpu, const muon_cpu_desc *d, const muon_allocator *a, char *msg,
                                  size_t size) {
  muon_status st;
  memset(cpu, 0, sizeof *cpu);
  cpu->allocator = a;
  cpu->threads = 1;
  if ((unsigned)d->gemm > (unsigned)MUON_GEMM_CBLAS) {
    snprintf(msg, size, "MUON_ERR_ARG: muon_cpu_desc.gemm is not a muon_gemm (got %d)", (int)d->gemm);
    return MUON_ERR_ARG;
  }
#ifdef MUON_USE_CBLAS
  cpu->cblas = d->gemm != MUON_GEMM_BUILTIN;
#else
  if (d->gemm == MUON_GEMM_CBLAS) {
    snprintf(msg, size,
             "MUON_ERR_ARG: muon_cpu_desc.gemm is MUON_GEMM_CBLAS but muon.h was compiled without MUON_USE_CBLAS");
    return MUON_ERR_ARG;
  }
#endif
  if ((st = muon__thread_count(&d->threads, &cpu->threads, msg, size)) != MUON_OK) return st;
  if (cpu->threads > 1 && d->threads.parallel_for) {
    cpu->parallel_for = d->threads.parallel_for;
    cpu->user = d->threads.user;
  } else if (cpu->threads > 1 && (st = muon__pool_start(cpu, msg, size)) != MUON_OK) {
    cpu->threads = 1;
    return st;
  }
  return MUON_OK;
}

/* fn(arg, t) for t in [0, n): on the CPU backend's threads, or in order on this one. */
static void muon__parallel(const muon__cpu *cpu, int n, muon_task_fn fn, void *arg) {
  int t;
  if (n > 1 && cpu && cpu->parallel_for) cpu->parallel_for(cpu->user, n, fn, arg);
  else for (t = 0; t < n; t++) fn(arg, t);
}

/* >>impl-gemm ---------------------------------------------------------------------------------
   CPU GEMM: plain C99 loops the compiler vectorises (GotoBLAS/BLIS loop nest: pack A into MR-row
   and op(B) into NR-column micro-panels, a register-blocked MR x NR micro-kernel). No intrinsics
   and no alignment-dependent paths: each C element is summed in order over k inside each KC
   chunk, so the bits depend only on (M, N, K), whether the packed path runs, and whether the
   target has FMA. muon__sgemm_naive is the oracle the fast kernels are tested against.
   Unpacked:  acc = sum_k a_k b_k;  C = alpha acc + beta C.
   Packed:    K in KC chunks; chunk 0 does C = alpha acc + beta C, later ones C = alpha acc + C. */
#if defined(__GNUC__) || defined(__clang__)
#define MUON__RESTRICT __restrict
#else
#define MUON__RESTRICT
#endif


/* Fused multiply-add where the hardware has it (deterministic: always fused
   for a given build), otherwise a plain multiply + add. */
#if defined(__FP_FAST_FMAF) || defined(__FMA__)
#define MUON__FMA(a, b, c) fmaf((a), (b), (c))
#else
#define MUON__FMA(a, b, c) ((a) * (b) + (c))
#endif

/* gcc's default tuning for most AVX-512 CPUs prefers 256-bit vectors; the micro-kernel is
   register-blocked for 32 512-bit registers, so ask for 512-bit vectors on that one function.
   This is only an optimisation hint (no intrinsics); other compilers/targets ignore it. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__) && !defined(MUON__NO_WIDE_KERNEL)
#define MUON__WIDE_KERNEL 1
#define MUON__KERNEL_ATTR __attribute__((target("prefer-vector-width=512")))
#else
#define MUON__KERNEL_ATTR
#endif

/* Register tile (micro-kernel) and cache blocking.
   MR/NR only change speed, never results: every C element is always summed sequentially over k
   inside each KC chunk.  KC is the only blocking parameter that affects the rounding. */
#ifndef MUON__MR
#if defined(MUON__WIDE_KERNEL)
#define MUON__MR 12 /* 12 x 32 tile = 24 zmm accumulators */
#define MUON__NR 32
#elif defined(__AVX__)
#define MUON__MR 2 /* 2 x 48 tile = 12 ymm accumulators (16 ymm registers): measured on AVX2 + FMA,
                      1024^2 sgemm 0.54-0.58x one-thread OpenBLAS vs 0.47-0.51x for 4 x 24 */
#define MUON__NR 48
#else
#define MUON__MR 8 /* SSE2 / generic: 8 x 8 tile */
#define MUON__NR 8
#endif
#endif
#define MUON__KC 256 /* k-chunk: fixed for all targets (it defines the summation order) */
#define MUON__MC 96  /* rows of A packed per block (multiple of MR) */
#define MUON__NC 288 /* minimum columns of op(B) packed per block (multiple of NR); grows with the buffer */

/* Minimum pack floats for the packed (fast) path; a smaller pack buffer selects the unpacked path.
   = MC*KC + KC*NC = 96 K floats (384 KiB).  A bigger buffer is used for wider B blocks (faster, same bits). */
#define MUON__GEMM_PACK_FLOATS ((size_t)MUON__MC * MUON__KC + (size_t)MUON__KC * MUON__NC)

/* Unpacked-path register tile. */
#define MUON__UMR 4
#define MUON__UNR 32


/* ----------------------------- oracle ----------------------------------- */

MUON__UNUSED static void muon__sgemm_naive(int transb, int M, int N, int K, float alpha, const float *A, int lda,
                              const float *B, int ldb, float beta, float *C, int ldc)
{
    int i, j, p;
    for (i = 0; i < M; i++) {
        for (j = 0; j < N; j++) {
            double s = 0.0;
            for (p = 0; p < K; p++) {
                double b = transb ? (double)B[(size_t)j * ldb + p] : (double)B[(size_t)p * ldb + j];
                s += (double)A[(size_t)i * lda + p] * b;
            }
            s *= (double)alpha;
            if (beta != 0.0f) s += (double)beta * (double)C[(size_t)i * ldc + j];
            C[(size_t)i * ldc + j] = (float)s;
        }
    }
}

/* ------------------------------ helpers --------------------------------- */

/* C[m x n] = beta * C  (beta == 0: write zeros, C never read). */
static void muon__scale_c(int m, int n, float beta, float *C, int ldc)
{
    int i, j;
    for (i = 0; i < m; i++) {
        float *c = C + (size_t)i * ldc;
        if (beta == 0.0f) {
            for (j = 0; j < n; j++) c[j] = 0.0f;
        } else {
            for (j = 0; j < n; j++) c[j] = beta * c[j];
        }
    }
}

/* Copy the strictly-lower triangle of C[N x N] onto the upper triangle. */
static void muon__mirror_lower(int N, float *C, int ldc)
{
    int ib, jb, i, j;
    const int BS = 64;
    for (ib = 0; ib < N; ib += BS) {
        int ie = MUON__MIN(ib + BS, N);
        for (jb = ib; jb < N; jb += BS) {
            int je = MUON__MIN(jb + BS, N);
            for (i = ib; i < ie; i++) {
                float *dst = C + (size_t)i * ldc;
                for (j = (jb > i + 1 ? jb : i + 1); j < je; j++) dst[j] = C[(size_t)j * ldc + i];
            }
        }
    }
}

/* Store an m x n accumulator tile (row stride ld_acc) into C.
   first && beta == 0  -> C = alpha*acc            (C not read)
   first               -> C = alpha*acc + beta*C
   !first              -> C = alpha*acc + C                                       */
static void muon__store_tile(const float *MUON__RESTRICT acc, int ld_acc, int m, int n, float *MUON__RESTRICT C,
                             int ldc, float alpha, float beta, int first)
{
    int i, j;
    if (first && beta == 0.0f) {
        for (i = 0; i < m; i++) {
            float *c = C + (size_t)i * ldc;
            const float *a = acc + (size_t)i * ld_acc;
            for (j = 0; j < n; j++) c[j] = alpha * a[j];
        }
    } else {
        float bt = first ? beta : 1.0f;
        for (i = 0; i < m; i++) {
            float *c = C + (size_t)i * ldc;
            const float *a = acc + (size_t)i * ld_acc;
            for (j = 0; j < n; j++) c[j] = MUON__FMA(bt, c[j], alpha * a[j]);
        }
    }
}

/* ---------------------------- packed path ------------------------------- */

/* Pack rows [0,mc) x cols [0,kc) of A into MR-row micro-panels: ap[p*MR + i], zero padded. */
static void muon__pack_a(int mc, int kc, const float *MUON__RESTRICT A, int lda, float *MUON__RESTRICT ap)
{
    int ir, i, p;
    for (ir = 0; ir < mc; ir += MUON__MR) {
        int mr = MUON__MIN(MUON__MR, mc - ir);
        const float *a = A + (size_t)ir * lda;
        if (mr == MUON__MR) {
            for (p = 0; p < kc; p++)
                for (i = 0; i < MUON__MR; i++) ap[(size_t)p * MUON__MR + i] = a[(size_t)i * lda + p];
        } else {
            for (p = 0; p < kc; p++) {
                for (i = 0; i < mr; i++) ap[(size_t)p * MUON__MR + i] = a[(size_t)i * lda + p];
                for (; i < MUON__MR; i++) ap[(size_t)p * MUON__MR + i] = 0.0f;
            }
        }
        ap += (size_t)MUON__MR * kc;
    }
}

/* Pack op(B)[0,kc) x [0,nc) into NR-column micro-panels: bp[p*NR + j], zero padded.
   transb == 0: op(B)[p][j] = B[p*ldb + j];  transb == 1: op(B)[p][j] = B[j*ldb + p]. */
static void muon__pack_b(int transb, int kc, int nc, const float *MUON__RESTRICT B, int ldb,
                         float *MUON__RESTRICT bp)
{
    int jr, j, p;
    for (jr = 0; jr < nc; jr += MUON__NR) {
        int nr = MUON__MIN(MUON__NR, nc - jr);
        if (!transb && nr == MUON__NR) {
            for (p = 0; p < kc; p++) {
                const float *b = B + (size_t)p * ldb + jr;
                float *d = bp + (size_t)p * MUON__NR;
                for (j = 0; j < MUON__NR; j++) d[j] = b[j];
            }
        } else if (!transb) {
            for (p = 0; p < kc; p++) {
                const float *b = B + (size_t)p * ldb + jr;
                float *d = bp + (size_t)p * MUON__NR;
                for (j = 0; j < nr; j++) d[j] = b[j];
                for (; j < MUON__NR; j++) d[j] = 0.0f;
            }
        } else {
            for (j = 0; j < nr; j++) {
                const float *b = B + (size_t)(jr + j) * ldb;
                for (p = 0; p < kc; p++) bp[(size_t)p * MUON__NR + j] = b[p];
            }
            for (; j < MUON__NR; j++)
                for (p = 0; p < kc; p++) bp[(size_t)p * MUON__NR + j] = 0.0f;
        }
        bp += (size_t)MUON__NR * kc;
    }
}

/* Micro-kernel: acc[MR][NR] = sum_p ap[p*MR+i] * bp[p*NR+j], then store m x n of it into C. */
MUON__KERNEL_ATTR static void muon__kernel(int kc, const float *MUON__RESTRICT ap, const float *MUON__RESTRICT bp,
                         float *MUON__RESTRICT C, int ldc, int m, int n, float alpha, float beta, int first)
{
    float acc[MUON__MR][MUON__NR];
    int i, j, p;
    for (i = 0; i < MUON__MR; i++)
        for (j = 0; j < MUON__NR; j++) acc[i][j] = 0.0f;
    for (p = 0; p < kc; p++) {
        const float *b = bp + (size_t)p * MUON__NR;
        const float *a = ap + (size_t)p * MUON__MR;
        for (i = 0; i < MUON__MR; i++) {
            const float ai = a[i];
            for (j = 0; j < MUON__NR; j++) acc[i][j] = MUON__FMA(ai, b[j], acc[i][j]);
        }
    }
    muon__store_tile(&acc[0][0], MUON__NR, m, n, C, ldc, alpha, beta, first);
}

/* lower != 0: only micro-tiles touching the diagonal or below are computed (syrk), where row i
   of A and C is row diag + i of the whole. */
static void muon__gemm_packed(int transb, int M, int N, int K, float alpha, const float *A, int lda,
                              const float *B, int ldb, float beta, float *C, int ldc, float *pack,
                              size_t pack_floats, int lower, int diag)
{
    float *apack = pack;
    float *bpack = pack + (size_t)MUON__MC * MUON__KC;
    /* widest B block the buffer holds (multiple of NR, >= MUON__NC); never changes the results */
    size_t ncmax_z = (pack_floats - (size_t)MUON__MC * MUON__KC) / MUON__KC / MUON__NR * MUON__NR;
    int ncmax = ncmax_z >= (size_t)N ? N : (int)ncmax_z;
    int jc, pc, ic, jr, ir;
    for (jc = 0; jc < N; jc += ncmax) {
        int nc = MUON__MIN(ncmax, N - jc);
        for (pc = 0; pc < K; pc += MUON__KC) {
            int kc = MUON__MIN(MUON__KC, K - pc);
            int first = (pc == 0);
            const float *bsrc = transb ? B + (size_t)jc * ldb + pc : B + (size_t)pc * ldb + jc;
            muon__pack_b(transb, kc, nc, bsrc, ldb, bpack);
            for (ic = 0; ic < M; ic += MUON__MC) {
                int mc = MUON__MIN(MUON__MC, M - ic);
                if (lower && diag + ic + mc <= jc) continue; /* whole block strictly above the diagonal */
                muon__pack_a(mc, kc, A + (size_t)ic * lda + pc, lda, apack);
                for (jr = 0; jr < nc; jr += MUON__NR) {
                    int nr = MUON__MIN(MUON__NR, nc - jr);
                    const float *bp = bpack + (size_t)jr * kc;
                    for (ir = 0; ir < mc; ir += MUON__MR) {
                        int mr = MUON__MIN(MUON__MR, mc - ir);
                        if (lower && diag + ic + ir + mr - 1 < jc + jr) continue; /* tile strictly above diagonal */
                        muon__kernel(kc, apack + (size_t)ir * kc, bp, C + (size_t)(ic + ir) * ldc + jc + jr, ldc,
                                     mr, nr, alpha, beta, first);
                    }
                }
            }
        }
    }
}

/* --------------------------- unpacked path ------------------------------ */

/* transb == 0, no scratch: UMR x UNR register tile read straight from A and B. */
static void muon__gemm_nopack_nn(int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                                 int ldb, float beta, float *C, int ldc)
{
    int i0, j0, i, j, p;
    float acc[MUON__UMR][MUON__UNR];
    for (j0 = 0; j0 < N; j0 += MUON__UNR) {
        int nr = MUON__MIN(MUON__UNR, N - j0);
        for (i0 = 0; i0 < M; i0 += MUON__UMR) {
            int mr = MUON__MIN(MUON__UMR, M - i0);
            const float *a = A + (size_t)i0 * lda;
            const float *b = B + j0;
            for (i = 0; i < MUON__UMR; i++)
                for (j = 0; j < MUON__UNR; j++) acc[i][j] = 0.0f;
            if (mr == MUON__UMR && nr == MUON__UNR) {
                for (p = 0; p < K; p++) {
                    const float *bb = b + (size_t)p * ldb;
                    for (i = 0; i < MUON__UMR; i++) {
                        const float ai = a[(size_t)i * lda + p];
                        for (j = 0; j < MUON__UNR; j++) acc[i][j] = MUON__FMA(ai, bb[j], acc[i][j]);
                    }
                }
            } else {
                for (p = 0; p < K; p++) {
                    const float *bb = b + (size_t)p * ldb;
                    for (i = 0; i < mr; i++) {
                        const float ai = a[(size_t)i * lda + p];
                        for (j = 0; j < nr; j++) acc[i][j] = MUON__FMA(ai, bb[j], acc[i][j]);
                    }
                }
            }
            muon__store_tile(&acc[0][0], MUON__UNR, mr, nr, C + (size_t)i0 * ldc + j0, ldc, alpha, beta, 1);
        }
    }
}

/* transb == 1, no scratch: 4x4 tile of dot products (sequential over p).
   lower != 0: skip tiles strictly above the diagonal (syrk; row i is row diag + i of the whole). */
static void muon__gemm_nopack_nt(int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                                 int ldb, float beta, float *C, int ldc, int lower, int diag)
{
    int i0, j0, i, j, p;
    float acc[4][4];
    for (i0 = 0; i0 < M; i0 += 4) {
        int mr = MUON__MIN(4, M - i0);
        for (j0 = 0; j0 < N; j0 += 4) {
            int nr = MUON__MIN(4, N - j0);
            if (lower && diag + i0 + mr - 1 < j0) break;
            for (i = 0; i < 4; i++)
                for (j = 0; j < 4; j++) acc[i][j] = 0.0f;
            if (mr == 4 && nr == 4) {
                const float *a0 = A + (size_t)i0 * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
                const float *b0 = B + (size_t)j0 * ldb, *b1 = b0 + ldb, *b2 = b1 + ldb, *b3 = b2 + ldb;
                float c00 = 0, c01 = 0, c02 = 0, c03 = 0, c10 = 0, c11 = 0, c12 = 0, c13 = 0;
                float c20 = 0, c21 = 0, c22 = 0, c23 = 0, c30 = 0, c31 = 0, c32 = 0, c33 = 0;
                for (p = 0; p < K; p++) {
                    float x0 = a0[p], x1 = a1[p], x2 = a2[p], x3 = a3[p];
                    float y0 = b0[p], y1 = b1[p], y2 = b2[p], y3 = b3[p];
                    c00 = MUON__FMA(x0, y0, c00); c01 = MUON__FMA(x0, y1, c01);
                    c02 = MUON__FMA(x0, y2, c02); c03 = MUON__FMA(x0, y3, c03);
                    c10 = MUON__FMA(x1, y0, c10); c11 = MUON__FMA(x1, y1, c11);
                    c12 = MUON__FMA(x1, y2, c12); c13 = MUON__FMA(x1, y3, c13);
                    c20 = MUON__FMA(x2, y0, c20); c21 = MUON__FMA(x2, y1, c21);
                    c22 = MUON__FMA(x2, y2, c22); c23 = MUON__FMA(x2, y3, c23);
                    c30 = MUON__FMA(x3, y0, c30); c31 = MUON__FMA(x3, y1, c31);
                    c32 = MUON__FMA(x3, y2, c32); c33 = MUON__FMA(x3, y3, c33);
                }
                acc[0][0] = c00; acc[0][1] = c01; acc[0][2] = c02; acc[0][3] = c03;
                acc[1][0] = c10; acc[1][1] = c11; acc[1][2] = c12; acc[1][3] = c13;
                acc[2][0] = c20; acc[2][1] = c21; acc[2][2] = c22; acc[2][3] = c23;
                acc[3][0] = c30; acc[3][1] = c31; acc[3][2] = c32; acc[3][3] = c33;
            } else {
                for (i = 0; i < mr; i++)
                    for (j = 0; j < nr; j++) {
                        const float *a = A + (size_t)(i0 + i) * lda, *b = B + (size_t)(j0 + j) * ldb;
                        float s = 0.0f;
                        for (p = 0; p < K; p++) s = MUON__FMA(a[p], b[p], s);
                        acc[i][j] = s;
                    }
            }
            muon__store_tile(&acc[0][0], 4, mr, nr, C + (size_t)i0 * ldc + j0, ldc, alpha, beta, 1);
        }
    }
}

/* ------------------------------ public ---------------------------------- */

/* Rows [r0, r1) of C[M x N] = alpha * A[M x K] * op(B) + beta * C, row-major (see the header
   comment); lower: of the lower triangle of C = alpha A A^T + beta C (N = M), columns [0, r1).
   Every element is summed the same way whatever rows a call covers. */
static void muon__gemm_rows(int transb, int lower, int r0, int r1, int N, int K, float alpha, const float *A,
                            int lda, const float *B, int ldb, float beta, float *C, int ldc, float *pack,
                            size_t pack_floats)
{
    int i, M = r1 - r0;
    A += (size_t)r0 * lda;
    C += (size_t)r0 * ldc;
    if (lower) N = r1;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!lower) muon__scale_c(M, N, beta, C, ldc);
        else for (i = 0; i < M; i++) muon__scale_c(1, r0 + i + 1, beta, C + (size_t)i * ldc, ldc);
    } else if (pack != NULL && pack_floats >= MUON__GEMM_PACK_FLOATS) {
        muon__gemm_packed(transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack, pack_floats, lower, r0);
    } else if (!transb) {
        muon__gemm_nopack_nn(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    } else {
        muon__gemm_nopack_nt(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, lower, r0);
    }
}

/* C[M x N] = alpha * A[M x K] * op(B) + beta * C, row-major.  See header comment. */
MUON__UNUSED static void muon__sgemm(int transb, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc, float *pack, size_t pack_floats)
{
    muon__gemm_rows(transb, 0, 0, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack, pack_floats);
}

/* C[N x N] = alpha * A[N x K] * A^T + beta * C.  Only the lower triangle of C is read (beta != 0);
   the lower triangle is computed and mirrored, so the full C is symmetric on return.
   The lower-triangle results are bit-identical to muon__sgemm(1, N, N, K, alpha, A, lda, A, lda, ...)
   with the same pack_floats. */
MUON__UNUSED static void muon__ssyrk(int N, int K, float alpha, const float *A, int lda, float beta, float *C, int ldc,
                        float *pack, size_t pack_floats)
{
    if (N <= 0) return;
    muon__gemm_rows(1, 1, 0, N, N, K, alpha, A, lda, A, lda, beta, C, ldc, pack, pack_floats);
    muon__mirror_lower(N, C, ldc);
}


/* >>impl-ns -----------------------------------------------------------------------------------
   Newton-Schulz. X is (m, n), m <= n, row-major, orthogonalised in place:
     X = X / max(|X|_F, eps)
     for k: A = X X^T;  B = b_k A + c_k A A;  X = a_k X + B X
   The symmetric products X X^T and A A (= A A^T) compute one triangle. torch fuses the last two
   into addmm; so do we (B starts as a copy of A, X's successor as a copy of X), which also puts
   the bf16 roundings exactly where torch has them. */
typedef struct muon__gemm_ctx {
  int cblas;
  int symmetric;
  float *pack;
  size_t pack_floats;
  const muon__cpu *cpu;            /* threads for the built-in GEMM; NULL: this one only   */
  float *packs;                    /* threads - 1 more packs of pack_floats (pack != NULL) */
} muon__gemm_ctx;

/* One built-in GEMM split by rows over the CPU backend's threads, each slice with its own pack;
   a lower (syrk) one in slices of equal area. No element's sum depends on the split. */
typedef struct muon__gemm_job {
  const muon__gemm_ctx *g;
  int transb, lower, M, N, K, lda, ldb, ldc, tasks;
  float alpha, beta;
  const float *A, *B;
  float *C;
} muon__gemm_job;

static int muon__gemm_job_row(const muon__gemm_job *j, int t) {
  double f = (double)t / j->tasks;
  if (t >= j->tasks) return j->M;
  if (j->lower) f = sqrt(f);
  return (int)(f * j->M) / MUON__MR * MUON__MR;
}

static void muon__gemm_task(void *arg, int t) {
  const muon__gemm_job *j = (const muon__gemm_job *)arg;
  float *pack = t == 0 || !j->g->pack ? j->g->pack : j->g->packs + (size_t)(t - 1) * j->g->pack_floats;
  muon__gemm_rows(j->transb, j->lower, muon__gemm_job_row(j, t), muon__gemm_job_row(j, t + 1), j->N, j->K, j->alpha,
                  j->A, j->lda, j->B, j->ldb, j->beta, j->C, j->ldc, pack, j->g->pack_floats);
}

/* Threads worth using on an M x N x K product: none below MUON__SPLIT_MACS multiply-adds, and
   at least 4 micro-tile rows each. (Tests lower the thresholds; no result depends on them.) */
#ifndef MUON__SPLIT_MACS
#define MUON__SPLIT_MACS 4194304.0
#endif
#ifndef MUON__SPLIT_ELEMENTS
#define MUON__SPLIT_ELEMENTS 65536
#endif
static int muon__gemm_tasks(const muon__gemm_ctx *g, int M, int N, int K) {
  int t = g->cpu ? g->cpu->threads : 1;
  if ((double)M * N * K < MUON__SPLIT_MACS) return 1;
  if (t > M / (4 * MUON__MR)) t = M / (4 * MUON__MR);
  return t > 1 ? t : 1;
}

static void muon__gemm_split(const muon__gemm_ctx *g, int transb, int lower, int M, int N, int K, float alpha,
                             const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  muon__gemm_job j;
  j.g = g; j.transb = transb; j.lower = lower; j.M = M; j.N = N; j.K = K;
  j.lda = lda; j.ldb = ldb; j.ldc = ldc; j.alpha = alpha; j.beta = beta; j.A = A; j.B = B; j.C = C;
  j.tasks = muon__gemm_tasks(g, M, N, K);
  muon__parallel(g->cpu, j.tasks, muon__gemm_task, &j);
}

/* C[N x N] = alpha * A[N x K] * A^T + beta * C, all of C written. */
static void muon__gram(const muon__gemm_ctx *g, int N, int K, float alpha, const float *A, int lda, float beta,
                       float *C, int ldc) {
#ifdef MUON_USE_CBLAS
  if (g->cblas) {
    if (g->symmetric) {
      cblas_ssyrk(CblasRowMajor, CblasLower, CblasNoTrans, N, K, alpha, A, lda, beta, C, ldc);
      muon__mirror_lower(N, C, ldc);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, N, K, alpha, A, lda, A, lda, beta, C, ldc);
    }
    return;
  }
#endif
  if (N <= 0) return;
  muon__gemm_split(g, 1, g->symmetric, N, N, K, alpha, A, lda, A, lda, beta, C, ldc);
  if (g->symmetric) muon__mirror_lower(N, C, ldc);
}

/* C[M x N] = alpha * A[M x K] * B[K x N] + beta * C. */
static void muon__matmul(const muon__gemm_ctx *g, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc) {
#ifdef MUON_USE_CBLAS
  if (g->cblas) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#endif
  muon__gemm_split(g, 0, 0, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* GEMM pack floats for an m x n operand: used only when it fits in m*n, so the NS workspace stays
   within 2mn + 2m^2 (Y, A, B, pack). */
static size_t muon__ns_pack_floats(int m, int n) {
  size_t mn = (size_t)m * (size_t)n, pack = (size_t)MUON__GEMM_PACK_FLOATS;
  return pack && mn >= pack ? pack : 0;
}

/* Does this operand run the Gram iteration? Only where it saves flops: n >= 2m. */
static int muon__use_gram(const muon_hparams *hp, int m, int n) {
  return hp->ns_algorithm == MUON_NS_GRAM && (long long)n >= 2 * (long long)m;
}

/* Y (m x n), then m x m matrices: A and B (standard), R, B, Q, T, S (Gram); then the pack. */
static size_t muon__ns_ws_floats(int m, int n, int gram) {
  return (size_t)m * n + (gram ? 5 : 2) * (size_t)m * m + muon__ns_pack_floats(m, n);
}

MUON_API size_t muon_ns_workspace_floats(int rows, int cols) {
  int m = rows < cols ? rows : cols, n = rows < cols ? cols : rows, gram = (long long)n >= 2 * (long long)m;
  const size_t most = SIZE_MAX / sizeof(float), pack = (size_t)MUON__GEMM_PACK_FLOATS;   /* bytes must fit too */
  size_t mn, mm;
  if (rows <= 0 || cols <= 0 || (size_t)m > most / (size_t)n) return 0;
  mn = (size_t)m * (size_t)n;
  mm = (size_t)m * (size_t)m;
  if (mn > most - pack || mm > (most - mn - pack) / (gram ? 5 : 2)) return 0;
  return muon__ns_ws_floats(m, n, gram);
}

/* Whether a CPU backend's GEMMs are CBLAS's (a NULL ctx: MUON_GEMM_AUTO). */
static int muon__use_cblas(const muon__cpu *cpu) {
#ifdef MUON_USE_CBLAS
  return cpu ? cpu->cblas : 1;
#else
  (void)cpu;
  return 0;
#endif
}

/* Gram Newton-Schulz on the normalised m x n X (n >= 2m): with X_k = Q_k X_0 and R_k = X_k X_k^T,
   iteration k forms P = a I + b R + c R^2 and moves Q <- P Q, R <- P (R P) (all polynomials in
   R_0, so they commute); X = Q X_0 once at the end. R P first, as the authors' reference: P^2 R
   rounds P^2, whose entries outgrow R's (Polar Express: up to 3.5e-4 of fp32 lost); and R's lower
   triangle mirrored, as their symmetric GEMM leaves it (unmirrored, R R^T is not R^2: 2.4e-5 lost,
   not 3e-6). A restart before iteration k makes X_0 = Q X_0, R = X_0 X_0^T and Q = I again, which
   bounds the error the m x m products accumulate. */
static void muon__gram_iterations(float *X, int m, int n, const muon_hparams *hp, float *ws, const muon__gemm_ctx *g,
                                  int bf16) {
  size_t mn = (size_t)m * n, mm = (size_t)m * m, i;
  float *Y = ws, *R = ws + mn, *B = R + mm, *Q = B + mm, *T = Q + mm, *S = T + mm, *x0 = X, *t;
  int k, fresh = 1;   /* fresh: Q is the identity, not stored */
  muon__gram(g, m, n, 1.0f, x0, n, 0.0f, R, m);                 /* R = X_0 X_0^T   (m, m) */
  if (bf16) muon__bf16_round(R, mm);
  for (k = 0; k < hp->ns_steps; k++) {
    float a = hp->ns_coefficients[k][0], b = hp->ns_coefficients[k][1], c = hp->ns_coefficients[k][2];
    int last = k + 1 == hp->ns_steps, restart_next = !last && ((hp->ns_restarts >> (k + 1)) & 1u);
    memcpy(B, R, mm * sizeof(float));
    muon__gram(g, m, m, c, R, m, b, B, m);                       /* B = b R + c R R^T */
    for (i = 0; i < (size_t)m; i++) B[i * m + i] += a;           /* P = a I + B, rounded once */
    if (bf16) muon__bf16_round(B, mm);
    if (fresh) { memcpy(Q, B, mm * sizeof(float)); fresh = 0; }  /* Q = P */
    else {
      muon__matmul(g, m, m, m, 1.0f, B, m, Q, m, 0.0f, T, m);    /* Q = P Q */
      if (bf16) muon__bf16_round(T, mm);
      t = Q; Q = T; T = t;
    }
    if (last) break;
    if (restart_next) {                                          /* X_0 = Q X_0, R = X_0 X_0^T, Q = I */
      float *y = x0 == X ? Y : X;
      muon__matmul(g, m, n, m, 1.0f, Q, m, x0, n, 0.0f, y, n);
      if (bf16) muon__bf16_round(y, mn);
      x0 = y;
      muon__gram(g, m, n, 1.0f, x0, n, 0.0f, R, m);
      if (bf16) muon__bf16_round(R, mm);
      fresh = 1;
      continue;
    }
    muon__matmul(g, m, m, m, 1.0f, R, m, B, m, 0.0f, S, m);      /* S = R P */
    if (bf16) muon__bf16_round(S, mm);
    muon__matmul(g, m, m, m, 1.0f, B, m, S, m, 0.0f, T, m);      /* R = P (R P) */
    if (bf16) muon__bf16_round(T, mm);
    muon__mirror_lower(m, T, m);                                 /* exactly symmetric, as R R^T assumes */
    t = R; R = T; T = t;
  }
  {
    float *y = x0 == X ? Y : X;                                  /* X = Q X_0 */
    if (fresh) memcpy(y, x0, mn * sizeof(float));
    else muon__matmul(g, m, n, m, 1.0f, Q, m, x0, n, 0.0f, y, n);
    if (bf16) muon__bf16_round(y, mn);
    if (y != X) memcpy(X, y, mn * sizeof(float));
  }
}

/* ws holds muon__ns_ws_floats(m, n, muon__use_gram(hp, m, n)) floats, and with cpu's threads
   threads - 1 more GEMM packs (muon__ns_pack_floats each). */
static void muon__newton_schulz(float *X, int m, int n, const muon_hparams *hp, float *ws, int cblas,
                                const muon__cpu *cpu) {
  size_t mn = (size_t)m * n, mm = (size_t)m * m, i;
  int gram = muon__use_gram(hp, m, n);
  float *Y = ws, *A = ws + mn, *B = A + mm, *x = X, *t;
  int bf16 = hp->precision == MUON_PRECISION_BF16, k;
  double ss = 0;
  float norm, d;
  muon__gemm_ctx g;
  g.cblas = cblas;
  g.symmetric = hp->symmetric;
  g.pack = ws + mn + (gram ? 5 : 2) * mm;
  g.pack_floats = muon__ns_pack_floats(m, n);
  g.cpu = cpu;
  g.packs = g.pack + g.pack_floats;

  if (bf16) muon__bf16_round(x, mn);
  for (i = 0; i < mn; i++) ss += (double)x[i] * x[i];
  norm = (float)sqrt(ss);
  if (bf16) norm = muon__bf16(norm);
  d = norm > hp->eps ? norm : hp->eps;
  if (bf16) d = muon__bf16(d);
  for (i = 0; i < mn; i++) x[i] = x[i] / d;
  if (bf16) muon__bf16_round(x, mn);
  if (gram) { muon__gram_iterations(X, m, n, hp, ws, &g, bf16); return; }

  for (k = 0; k < hp->ns_steps; k++) {
    float a = hp->ns_coefficients[k][0], b = hp->ns_coefficients[k][1], c = hp->ns_coefficients[k][2];
    muon__gram(&g, m, n, 1.0f, x, n, 0.0f, A, m);                 /* A = X X^T        (m, m) */
    if (bf16) muon__bf16_round(A, mm);
    memcpy(B, A, mm * sizeof(float));
    muon__gram(&g, m, m, c, A, m, b, B, m);                       /* B = b A + c A A  (m, m) */
    if (bf16) muon__bf16_round(B, mm);
    memcpy(Y, x, mn * sizeof(float));
    muon__matmul(&g, m, n, m, 1.0f, B, m, x, n, a, Y, n);         /* Y = a X + B X    (m, n) */
    if (bf16) muon__bf16_round(Y, mn);
    t = x; x = Y; Y = t;
  }
  if (x != X) memcpy(X, x, mn * sizeof(float));
}

/* NorMuon (Li et al. 2025) of one orthogonalised operand X, m x n, in place; len = per_column ?
   n : m statistics, each over cnt = per_column ? m : n elements (sums in double, in the order below):
     q_i   = (1/cnt) sum x^2 over statistic i's elements
     v'_i  = v_i + (1 - beta2)(q_i - v_i)                                 (torch's lerp_)
     s_i   = ROWS:   1 / (sqrt(v'_i) + 1e-10)                  (the paper's reference)
             LARGER: 1 / sqrt(max(v'_i, 1e-10))                (nanochat, modded-nanogpt)
     |O|   = sqrt(sum_i cnt q_i),  |O'| = sqrt(sum_i cnt q_i s_i^2)
     x    *= s_i * |O| / (ROWS: |O'| + 1e-10;  LARGER: max(|O'|, 1e-10))
   A row's sum runs in 8 lanes (element j in lane j % 8) added in lane order; a column's runs
   down the rows. The norms come from the q_i, as nanochat computes them; the paper takes them from the scaled
   matrix, the same value up to rounding. v'_i goes to v_new; v is only read. */
static float muon__normuon_scale(float v, int kind) {
  return kind == MUON_NORMUON_ROWS ? 1.0f / (sqrtf(v) + 1e-10f) : 1.0f / sqrtf(v > 1e-10f ? v : 1e-10f);
}

static void muon__normuon(float *X, int m, int n, int per_column, const float *v, float *v_new, int kind, float beta2) {
  int len = per_column ? n : m, cnt = per_column ? m : n, i, j, b;
  float w = 1.0f - beta2;
  double before = 0, after = 0, scale;
  for (i = 0; i < len; i++) v_new[i] = 0;
  if (per_column) {
    for (j = 0; j < n; j += 16) {                   /* 16 columns at a time, rows in order */
      double acc[16] = {0};
      int nb = n - j < 16 ? n - j : 16;
      if (nb == 16)                                 /* a constant bound: vectorised at -O2 too */
        for (i = 0; i < m; i++) {
          const float *x = X + (size_t)i * n + j;
          for (b = 0; b < 16; b++) acc[b] += (double)x[b] * x[b];
        }
      else
        for (i = 0; i < m; i++)
          for (b = 0; b < nb; b++) { double x = X[(size_t)i * n + j + b]; acc[b] += x * x; }
      for (b = 0; b < nb; b++) v_new[j + b] = (float)(acc[b] / cnt);
    }
  } else {
    for (i = 0; i < m; i++) {                       /* 8 lanes (column j in lane j % 8), summed in order */
      double acc[8] = {0}, sum = 0;
      const float *x = X + (size_t)i * n;
      for (j = 0; j + 8 <= n; j += 8)
        for (b = 0; b < 8; b++) acc[b] += (double)x[j + b] * x[j + b];
      for (b = 0; j + b < n; b++) acc[b] += (double)x[j + b] * x[j + b];
      for (b = 0; b < 8; b++) sum += acc[b];
      v_new[i] = (float)(sum / cnt);
    }
  }
  for (i = 0; i < len; i++) {
    float q = v_new[i], s;
    v_new[i] = w < 0.5f ? v[i] + w * (q - v[i]) : q - (q - v[i]) * (1.0f - w);
    s = muon__normuon_scale(v_new[i], kind);
    before += (double)cnt * q;
    after += (double)cnt * q * s * s;
  }
  after = sqrt(after);
  scale = sqrt(before) / (kind == MUON_NORMUON_ROWS ? after + 1e-10 : (after > 1e-10 ? after : 1e-10));
  for (j = 0; j < n; j += 256) {                    /* the factors of 256 columns, then rows */
    float f[256];
    int nb = n - j < 256 ? n - j : 256;
    for (b = 0; per_column && b < nb; b++) f[b] = (float)(muon__normuon_scale(v_new[j + b], kind) * scale);
    for (i = 0; i < m; i++) {
      float *x = X + (size_t)i * n + j, r = per_column ? 0 : (float)(muon__normuon_scale(v_new[i], kind) * scale);
      if (per_column) for (b = 0; b < nb; b++) x[b] *= f[b];
      else for (b = 0; b < nb; b++) x[b] *= r;
    }
  }
}

/* >>impl-cpu ----------------------------------------------------------------------------------
   The CPU compute backend: host memory, the element-wise formulas and the Newton-Schulz above.
   ctx is a muon__cpu (NULL: malloc/free, one thread). */
static void *muon__cpu_alloc(void *ctx, size_t bytes) {
  return ctx ? muon__alloc(((const muon__cpu *)ctx)->allocator, bytes) : malloc(bytes ? bytes : 1);
}
static void muon__cpu_free(void *ctx, void *ptr) {
  if (ctx) muon__free(((const muon__cpu *)ctx)->allocator, ptr); else free(ptr);
}
static muon_status muon__cpu_copy(void *ctx, void *dst, const void *src, size_t bytes, int to_host, int from_host) {
  (void)ctx; (void)to_host; (void)from_host;
  if (bytes) memcpy(dst, src, bytes);
  return MUON_OK;
}
static muon_status muon__cpu_zero(void *ctx, void *dst, size_t bytes) {
  (void)ctx;
  if (bytes) memset(dst, 0, bytes);
  return MUON_OK;
}

static int muon__cpu_threads(const void *ctx) { return ctx ? ((const muon__cpu *)ctx)->threads : 1; }

/* Row segment by row segment (see muon__next_seg): contiguous copies for wide matrices, strided
   for tall ones whose operand is the transpose. */
static muon_status muon__cpu_pack(void *ctx, const muon_piece_copy *ops, int n, float *pieces, float *operands,
                                  int to_operand) {
  int i;
  (void)ctx;
  for (i = 0; i < n; i++) {
    const muon_piece_copy *op = &ops[i];
    muon__piece p;
    muon__seg sg;
    float *piece = pieces + op->piece, *X = operands + op->operand;
    long long k;
    int rows = op->rows, cols = op->cols;
    p.r0 = op->r0; p.c0 = op->c0; p.h = op->h; p.w = op->w; p.f0 = op->f0; p.f1 = op->f1;
    sg = muon__segs(&p);
    while (muon__next_seg(&p, &sg)) {
      if (rows <= cols) {
        float *x = X + sg.row * cols + sg.col;
        if (to_operand) memcpy(x, piece + sg.off, (size_t)sg.len * sizeof(float));
        else memcpy(piece + sg.off, x, (size_t)sg.len * sizeof(float));
      } else if (to_operand) {
        for (k = 0; k < sg.len; k++) X[(sg.col + k) * rows + sg.row] = piece[sg.off + k];
      } else {
        for (k = 0; k < sg.len; k++) piece[sg.off + k] = X[(sg.col + k) * rows + sg.row];
      }
    }
  }
  return MUON_OK;
}

/* Element-wise slots over the CPU backend's threads: n elements in one contiguous range per
   task (from MUON__SPLIT_ELEMENTS on; each element is computed alone, so no split changes a bit). */
typedef struct muon__ew_job {
  int kind;                        /* 0 momentum, 1 apply, 2 AdamW */
  size_t n, per_task;
  void *param;
  const void *grad;
  float *momentum, *u, *m, *v;
  const float *O;
  int update;
  const muon_momentum_args *ma;
  const muon_apply_args *aa;
  const muon_adamw_args *wa;
} muon__ew_job;

static void muon__ew_task(void *arg, int t) {
  const muon__ew_job *j = (const muon__ew_job *)arg;
  size_t i = (size_t)t * j->per_task, end = i + j->per_task < j->n ? i + j->per_task : j->n;
  if (j->kind == 0 && j->u) for (; i < end; i++) j->u[i] = muon__momentum_at(j->momentum, i, j->grad, j->ma, j->update);
  else if (j->kind == 0) for (; i < end; i++) (void)muon__momentum_at(j->momentum, i, j->grad, j->ma, j->update);
  else if (j->kind == 1) for (; i < end; i++) muon__apply_store(j->param, i, j->O, j->aa);
  else for (; i < end; i++) muon__adamw_store(j->param, i, j->grad, j->m, j->v, j->wa);
}

static void muon__ew_run(void *ctx, muon__ew_job *j) {
  size_t T = (size_t)muon__cpu_threads(ctx);
  if (j->n < MUON__SPLIT_ELEMENTS) T = 1;
  j->per_task = ((j->n + T - 1) / T + 63) / 64 * 64;
  if (j->n) muon__parallel((const muon__cpu *)ctx, (int)((j->n + j->per_task - 1) / j->per_task), muon__ew_task, j);
}

static muon_status muon__cpu_momentum(void *ctx, size_t n, float *momentum, const void *grad,
                                      const muon_momentum_args *a, int update, float *u) {
  muon__ew_job j;
  memset(&j, 0, sizeof j);
  j.kind = 0; j.n = n; j.momentum = momentum; j.grad = grad; j.ma = a; j.update = update; j.u = u;
  muon__ew_run(ctx, &j);
  return MUON_OK;
}

/* A batch on T threads: whole rounds of T operands side by side (task t: operands t, t + T, ...,
   each in its own workspace), then the rest one at a time with their GEMMs split. */
typedef struct muon__ns_job {
  float *X, *ws;
  int m, n, tasks, whole, cblas;   /* whole: the operands run side by side */
  size_t ws_floats;                /* one operand's workspace, unthreaded */
  const muon_hparams *hp;
} muon__ns_job;

static void muon__ns_task(void *arg, int t) {
  const muon__ns_job *j = (const muon__ns_job *)arg;
  int b;
  for (b = t; b < j->whole; b += j->tasks)
    muon__newton_schulz(j->X + (size_t)b * j->m * j->n, j->m, j->n, j->hp, j->ws + (size_t)t * j->ws_floats, j->cblas,
                        NULL);
}

static size_t muon__cpu_ns_workspace(void *ctx, int batch, int m, int n, const muon_hparams *hp) {
  size_t one = muon__ns_ws_floats(m, n, muon__use_gram(hp, m, n));
  size_t split = one + (size_t)(muon__cpu_threads(ctx) - 1) * muon__ns_pack_floats(m, n);
  int T = muon__cpu_threads(ctx);
  /* the CBLAS balancer (newton_schulz_many) runs up to min(batch, T) operands side by side */
  int side = batch >= T ? T : muon__use_cblas((const muon__cpu *)ctx) && batch > 1 ? batch : 0;
  return (side && side * one > split ? side * one : split) * sizeof(float);
}

static muon_status muon__cpu_newton_schulz(void *ctx, float *X, int batch, int m, int n, const muon_hparams *hp,
                                           void *ws) {
  muon__ns_job j;
  int b, T = muon__cpu_threads(ctx);
  j.X = X; j.ws = (float *)ws; j.m = m; j.n = n; j.hp = hp; j.cblas = muon__use_cblas((const muon__cpu *)ctx);
  j.ws_floats = muon__ns_ws_floats(m, n, muon__use_gram(hp, m, n));
  j.tasks = T;
  j.whole = T > 1 ? batch / T * T : 0;
  if (j.whole) muon__parallel((const muon__cpu *)ctx, T, muon__ns_task, &j);
  for (b = j.whole; b < batch; b++)
    muon__newton_schulz(X + (size_t)b * m * n, m, n, hp, (float *)ws, j.cblas, (const muon__cpu *)ctx);
  return MUON_OK;
}

/* Flops of one Newton-Schulz iteration: 4 m^2 n + 2 m^3, m <= n (owners and threads are
   balanced by it). */
static double muon__ns_cost(int rows, int cols) {
  double m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
  return 4 * m * m * n + 2 * m * m * m;
}

/* A round's operands on T threads. Those on CBLAS, whose GEMMs are never split, are balanced
   across the threads whatever their shapes: in decreasing cost (muon__ns_cost, ties by index), each
   to the thread with the least work so far (ties: the lowest), run whole in its own workspace;
   every task works the assignment out alike. Those on the built-in GEMM go batch by batch
   (muon__cpu_newton_schulz: side by side, a remainder with its GEMMs split). No result depends
   on any of it. */
typedef struct muon__ns_many_job {
  float *const *X;
  const int *m, *n;
  const muon_hparams *const *hp;
  int count, tasks, cblas;
  float *ws;
  size_t ws_floats;                /* the largest balanced operand's workspace, unthreaded */
} muon__ns_many_job;

static int muon__ns_before(const muon__ns_many_job *j, int i, int k) {
  double a = muon__ns_cost(j->m[i], j->n[i]), b = muon__ns_cost(j->m[k], j->n[k]);
  return a > b || (a == b && i < k);
}

static void muon__ns_many_task(void *arg, int t) {
  const muon__ns_many_job *j = (const muon__ns_many_job *)arg;
  double load[MUON__MAX_THREADS];
  int i, q, prev = -1;
  for (q = 0; q < j->tasks; q++) load[q] = 0;
  for (;;) {
    int next = -1, best = 0;
    for (i = 0; i < j->count; i++)   /* the first balanced operand after prev in the order */
      if (j->cblas && (prev < 0 || muon__ns_before(j, prev, i)) && (next < 0 || muon__ns_before(j, i, next))) next = i;
    if (next < 0) return;
    for (q = 1; q < j->tasks; q++)
      if (load[q] < load[best]) best = q;
    load[best] += muon__ns_cost(j->m[next], j->n[next]);
    if (best == t)
      muon__newton_schulz(j->X[next], j->m[next], j->n[next], j->hp[next], j->ws + (size_t)t * j->ws_floats, 1, NULL);
    prev = next;
  }
}

static muon_status muon__cpu_newton_schulz_many(void *ctx, int count, float *const *X, const int *m, const int *n,
                                                const muon_hparams *const *hp, void *ws) {
  muon__ns_many_job j;
  int i, k, T = muon__cpu_threads(ctx), balanced = 0;
  j.X = X; j.m = m; j.n = n; j.hp = hp; j.count = count; j.tasks = T; j.ws = (float *)ws; j.ws_floats = 0;
  j.cblas = muon__use_cblas((const muon__cpu *)ctx);
  for (i = 0; i < count; i++) {
    size_t one;
    if (!j.cblas) continue;
    balanced++;
    one = muon__ns_ws_floats(m[i], n[i], muon__use_gram(hp[i], m[i], n[i]));
    if (one > j.ws_floats) j.ws_floats = one;
  }
  if (T > 1 && balanced > 1) muon__parallel((const muon__cpu *)ctx, T, muon__ns_many_task, &j);
  for (i = 0; i < count; i = k) {
    k = i + 1;
    if (j.cblas) {
      if (T < 2 || balanced < 2) muon__newton_schulz(X[i], m[i], n[i], hp[i], (float *)ws, 1, (const muon__cpu *)ctx);
      continue;
    }
    while (k < count && hp[k] == hp[i] && m[k] == m[i] && n[k] == n[i] && X[k] == X[i] + (size_t)(k - i) * m[i] * n[i])
      k++;
    muon__cpu_newton_schulz(ctx, X[i], k - i, m[i], n[i], hp[i], ws);
  }
  return MUON_OK;
}

static muon_status muon__cpu_apply(void *ctx, size_t n, void *param, const float *O, const muon_apply_args *a) {
  muon__ew_job j;
  memset(&j, 0, sizeof j);
  j.kind = 1; j.n = n; j.param = param; j.O = O; j.aa = a;
  muon__ew_run(ctx, &j);
  return MUON_OK;
}

/* Also the core's own scaling where a host backend has no scale slot (ctx unused). */
static muon_status muon__cpu_scale(void *ctx, size_t n, void *param, float factor, const muon_apply_args *a) {
  size_t i;
  (void)ctx;
  for (i = 0; i < n; i++) muon__scale_store(param, i, factor, a);
  return MUON_OK;
}

static muon_status muon__cpu_adamw(void *ctx, size_t n, void *param, const void *grad, float *m, float *v,
                                   const muon_adamw_args *a) {
  muon__ew_job j;
  memset(&j, 0, sizeof j);
  j.kind = 2; j.n = n; j.param = param; j.grad = grad; j.m = m; j.v = v; j.wa = a;
  muon__ew_run(ctx, &j);
  return MUON_OK;
}

static muon_status muon__cpu_nonfinite(void *ctx, const void *x, muon_dtype dtype, size_t n, int *flag) {
  size_t i;
  int bad = 0;
  (void)ctx;
  for (i = 0; i < n && !bad; i++)
    bad = !muon__finite(muon__load(x, dtype == MUON_DTYPE_BF16, i));   /* as muon_cuda.h's kernel */
  *flag = bad;
  return MUON_OK;
}

static muon_status muon__cpu_cast(void *ctx, void *dst, muon_dtype dst_dtype, const void *src, muon_dtype src_dtype,
                                  size_t n) {
  size_t i;
  (void)ctx;
  for (i = 0; i < n; i++)
    muon__store(dst, dst_dtype == MUON_DTYPE_BF16, i, muon__load(src, src_dtype == MUON_DTYPE_BF16, i), 0, 0);
  return MUON_OK;
}

static muon_status muon__cpu_blockwise(void *ctx, int to_int8, size_t n, float *values, void *blocks) {
  unsigned char *b = (unsigned char *)blocks;
  size_t lo;
  (void)ctx;
  for (lo = 0; lo < n; lo += MUON_Q8_BLOCK, b += 1 + MUON_Q8_BLOCK) {
    size_t c = MUON__MIN((size_t)MUON_Q8_BLOCK, n - lo);
    if (to_int8) muon__q8_encode(values + lo, c, b);
    else muon__q8_decode(b, c, values + lo);
  }
  return MUON_OK;
}

static muon_status muon__cpu_sync(void *ctx) { (void)ctx; return MUON_OK; }
/* A context of muon_cpu_create's (the optimizer's own CPU context is never handed out). */
static void muon__cpu_destroy(void *ctx) {
  muon__cpu *cpu = (muon__cpu *)ctx;
  muon_allocator a;
  if (!cpu) return;
  a = cpu->own;
  muon__pool_stop(cpu);
  muon__free(&a, cpu);
}
static muon_status muon__cpu_normuon(void *ctx, float *X, int m, int n, int per_column, const float *v, float *v_new,
                                     const muon_hparams *hp) {
  (void)ctx;
  muon__normuon(X, m, n, per_column, v, v_new, (int)hp->normuon, hp->normuon_beta2);
  return MUON_OK;
}

static const muon_compute_vtable muon__cpu_vtable = {
  MUON_COMPUTE_VTABLE_VERSION,
  /* .memory             = */ MUON_MEMORY_HOST,
  /* .alloc              = */ muon__cpu_alloc,
  /* .free               = */ muon__cpu_free,
  /* .alloc_host         = */ NULL,
  /* .free_host          = */ NULL,
  /* .copy               = */ muon__cpu_copy,
  /* .zero               = */ muon__cpu_zero,
  /* .pack               = */ muon__cpu_pack,
  /* .momentum           = */ muon__cpu_momentum,
  /* .ns_workspace       = */ muon__cpu_ns_workspace,
  /* .newton_schulz      = */ muon__cpu_newton_schulz,
  /* .apply              = */ muon__cpu_apply,
  /* .adamw              = */ muon__cpu_adamw,
  /* .nonfinite          = */ muon__cpu_nonfinite,
  /* .cast               = */ muon__cpu_cast,
  /* .sync               = */ muon__cpu_sync,
  /* .error              = */ NULL,
  /* .destroy            = */ muon__cpu_destroy,
  /* .normuon            = */ muon__cpu_normuon,
  /* .newton_schulz_many = */ muon__cpu_newton_schulz_many,
  /* .scale              = */ muon__cpu_scale,
  /* .blockwise          = */ muon__cpu_blockwise
};

MUON_API muon_cpu_desc muon_cpu_default_desc(void) {
  muon_cpu_desc d;
  memset(&d, 0, sizeof d);
  d.gemm = MUON_GEMM_AUTO;
  return d;
}

MUON_API muon_status muon_cpu_create(muon_compute *out, const muon_cpu_desc *desc) {
  muon_cpu_desc d = desc ? *desc : muon_cpu_default_desc();
  muon_allocator a = d.allocator;
  muon__cpu *cpu;
  char msg[300];
  muon_status st;
  if (!out) { muon_set_create_error("MUON_ERR_ARG: muon_cpu_create: out is NULL"); return MUON_ERR_ARG; }
  memset(out, 0, sizeof *out);
  if (!a.alloc != !a.free) {
    muon_set_create_error("MUON_ERR_ARG: muon_cpu_desc.allocator: set both alloc and free, or neither");
    return MUON_ERR_ARG;
  }
  if (!a.alloc) { a.alloc = muon__default_alloc; a.free = muon__default_free; a.user_data = NULL; }
  if (!(cpu = (muon__cpu *)muon__alloc(&a, sizeof *cpu))) {
    muon_set_create_error("MUON_ERR_NOMEM: muon_cpu_create: allocating the context failed");
    return MUON_ERR_NOMEM;
  }
  if ((st = muon__cpu_init(cpu, &d, &a, msg, sizeof msg)) != MUON_OK) {
    muon__free(&a, cpu);
    muon_set_create_error("%s", msg);
    return st;
  }
  cpu->own = a;
  cpu->allocator = &cpu->own;
  out->vt = &muon__cpu_vtable;
  out->ctx = cpu;
  return MUON_OK;
}

static int muon__is_cpu(const muon_compute *c) { return c->vt == &muon__cpu_vtable; }

MUON_API muon_compute muon_compute_cpu(void) {
  muon_compute c;
  c.vt = &muon__cpu_vtable;
  c.ctx = NULL;
  return c;
}

MUON_API void muon_compute_destroy(muon_compute *compute) {
  if (!compute) return;
  if (compute->vt && compute->vt->destroy) compute->vt->destroy(compute->ctx);
  memset(compute, 0, sizeof *compute);
}

MUON_API unsigned muon_random_bits(unsigned long long seed, unsigned long long index) {
  return muon__random_bits(seed, index);
}

/* The operand of a whole matrix (transposed when tall) goes through the CPU backend's pack. */
MUON_API muon_status muon_newton_schulz(const float *in, int rows, int cols, float *out, const muon_hparams *hp) {
  char msg[400];
  int m, n;
  float *X;
  muon_piece_copy op;
  if (!in || !out || !hp || rows <= 0 || cols <= 0) return !hp || !in || !out ? MUON_ERR_ARG : MUON_ERR_SHAPE;
  if (muon__check_hparams(hp, msg, sizeof msg) != MUON_OK) return MUON_ERR_ARG;
  m = rows < cols ? rows : cols;
  n = rows < cols ? cols : rows;
  if ((size_t)m * n > MUON__MAX_FLOATS / 4) return MUON_ERR_SHAPE;   /* its workspace would overflow size_t */
  X = (float *)malloc(((size_t)m * n + muon__ns_ws_floats(m, n, muon__use_gram(hp, m, n))) * sizeof(float));
  if (!X) return MUON_ERR_NOMEM;
  op = muon__whole(rows, cols, 0, 0);
  (void)muon__cpu_pack(NULL, &op, 1, (float *)in, X, 1);   /* only reads `in` */
  muon__newton_schulz(X, m, n, hp, X + (size_t)m * n, muon__use_cblas(NULL), NULL);
  (void)muon__cpu_pack(NULL, &op, 1, out, X, 0);
  free(X);
  return MUON_OK;
}

#endif /* MUON__IMPLEMENTED */
#endif /* MUON_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the muon authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute,
sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
