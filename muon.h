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

   BACKENDS
       Computation: the CPU, in this header. Communication: this header ships the single-rank
       case; muon_gloo.h (CPU clusters) adds more. The core only talks to them through vtables.

   THREAD SAFETY
       An optimizer is used by one thread at a time. Different optimizers are independent.

   ERRORS
       Every fallible call returns muon_status (MUON_OK == 0). muon_error(opt) gives the last
       message of that optimizer, naming the field, the matrix and its index. The library never
       prints, exits or aborts; set desc.logger to receive messages as they happen.
*/
#ifndef MUON_H
#define MUON_H

#include <stddef.h>

#ifndef MUON_API
#define MUON_API extern
#endif
#ifndef MUON_NS_MAX_STEPS
#define MUON_NS_MAX_STEPS 16
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
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

/* ---------------------------------------------------------------------------------------------
   Hyperparameters */
typedef enum muon_adjust_lr {
  MUON_ADJUST_LR_ORIGINAL = 0,     /* lr * sqrt(max(1, rows/cols))        (torch default) */
  MUON_ADJUST_LR_MATCH_RMS_ADAMW,  /* lr * 0.2 * sqrt(max(rows, cols))                    */
  MUON_ADJUST_LR_NONE              /* lr                                                   */
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

typedef enum muon_gemm {
  MUON_GEMM_AUTO = 0,              /* CBLAS when compiled with MUON_USE_CBLAS, else built-in    */
  MUON_GEMM_BUILTIN,               /* the portable blocked GEMM of this header                  */
  MUON_GEMM_CBLAS                  /* CBLAS; MUON_ERR_ARG if not compiled with MUON_USE_CBLAS   */
} muon_gemm;

typedef struct muon_hparams {
  float lr;                        /* 1e-3; may change between steps (muon_set_group)           */
  float weight_decay;              /* 0.1, decoupled, uses the unadjusted lr                    */
  float momentum;                  /* 0.95, in [0, 1)                                           */
  int nesterov;                    /* 1                                                         */
  muon_momentum_style momentum_style;
  muon_adjust_lr adjust_lr;
  int ns_steps;                    /* 5, in [1, MUON_NS_MAX_STEPS]                              */
  float ns_coefficients[MUON_NS_MAX_STEPS][3]; /* (a, b, c) of iteration k; muon_set_ns_preset */
  float eps;                       /* 1e-7: X / max(|X|_F, eps)                                 */
  muon_precision precision;
  /* How, not what: these change speed (and the last bits), never the math. */
  muon_gemm gemm;
  int symmetric;                   /* 1: X*X^T and A*A compute one triangle (fewer flops)       */
} muon_hparams;

/* torch.optim.Muon's defaults (and MUON_NS_QUINTIC, fp32, symmetric products). */
MUON_API muon_hparams muon_default_hparams(void);
/* Fills hp->ns_coefficients with a preset for all MUON_NS_MAX_STEPS iterations; keeps ns_steps. */
MUON_API void muon_set_ns_preset(muon_hparams *hp, muon_ns_preset preset);

typedef struct muon_adamw_hparams {
  float lr;                        /* 1e-3  */
  float beta1, beta2;              /* 0.9, 0.999 */
  float eps;                       /* 1e-8, added outside the sqrt */
  float weight_decay;              /* 0.01, decoupled */
} muon_adamw_hparams;

/* torch.optim.AdamW's defaults. */
MUON_API muon_adamw_hparams muon_default_adamw_hparams(void);

/* ---------------------------------------------------------------------------------------------
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

/* What to do with a gradient holding NaN or Inf. */
typedef enum muon_nonfinite {
  MUON_NONFINITE_ERROR = 0,        /* the step returns MUON_ERR_NONFINITE, nothing is applied   */
  MUON_NONFINITE_SKIP              /* that matrix (or AdamW param) is skipped this step         */
} muon_nonfinite;

/* ---------------------------------------------------------------------------------------------
   Communicator: one process group, as a vtable + context (SQLite VFS / ggml style). A backend
   (muon_gloo.h, muon_nccl.h, or your framework) fills the vtable; the core never knows which one
   it talks to and calls it only through wrappers that check and count. Every slot takes ctx first
   and returns muon_status; a failing slot should leave its native message for `error`. */
#define MUON_COMM_VTABLE_VERSION 1

typedef struct muon_comm_vtable {
  int version;                     /* MUON_COMM_VTABLE_VERSION; slots are only appended        */
  /* Required. Each rank sends send_counts[p] floats at send + send_displs[p] to rank p and
     receives recv_counts[p] floats from p at recv + recv_displs[p]. Zero counts are allowed;
     the part sent to oneself is copied. Blocking, with the backend's timeout. */
  muon_status (*alltoallv)(void *ctx, const float *send, const size_t *send_counts,
                           const size_t *send_displs, float *recv, const size_t *recv_counts,
                           const size_t *recv_displs);
  /* Required. Each rank contributes `bytes` bytes; recv gets size*bytes in rank order. */
  muon_status (*allgather)(void *ctx, const void *send, void *recv, size_t bytes);
  /* Optional (NULL: an allgather of one byte). */
  muon_status (*barrier)(void *ctx);
  /* Optional: the native text of the last failure (NULL or "" if none). */
  const char *(*error)(void *ctx);
  /* Optional: frees ctx; called by muon_comm_destroy. */
  void (*destroy)(void *ctx);
} muon_comm_vtable;

typedef struct muon_comm {
  const muon_comm_vtable *vt;
  void *ctx;
  int rank, size;
} muon_comm;

/* The one-rank communicator (rank 0 of 1): what a NULL desc.comm means. */
MUON_API muon_comm muon_comm_self(void);
/* Calls vt->destroy if set and clears *comm. */
MUON_API void muon_comm_destroy(muon_comm *comm);

/* ---------------------------------------------------------------------------------------------
   The optimizer */
typedef struct muon_optimizer muon_optimizer;

typedef struct muon_desc {
  muon_hparams hparams;            /* group 0 of the Muon matrices                              */
  muon_adamw_hparams adamw;        /* group 0 of the AdamW parameters                           */
  muon_nonfinite on_nonfinite;
  muon_allocator allocator;        /* zeroed: malloc/free                                       */
  muon_logger logger;              /* zeroed: silent                                            */
} muon_desc;

MUON_API muon_desc muon_default_desc(void);

/* A 2-D weight, or `count` of them stacked in one buffer (llm.c's [L, rows, cols]).
   Each stacked slice becomes its own matrix with consecutive indices. */
typedef struct muon_matrix {
  const char *name;                /* optional, used in messages (copied)                       */
  float *param;                    /* rows*cols floats, row-major (per slice)                    */
  const float *grad;               /* same shape; NULL = absent (matrix skipped) until set      */
  int rows, cols;
  int ndim;                        /* 0 or 2. Anything else is rejected: non-matrix parameters
                                      belong to muon_add_adamw_param                            */
  int count;                       /* 0 or 1: one matrix; L: L slices                           */
  size_t stride;                   /* floats between slices; 0 = rows*cols; >= rows*cols        */
  int group;                       /* hyperparameter group, 0 = desc.hparams                     */
} muon_matrix;

MUON_API muon_matrix muon_default_matrix(void);

typedef struct muon_adamw_param {
  const char *name;
  float *param;
  const float *grad;               /* NULL = absent (skipped) until set                          */
  size_t size;                     /* number of floats, > 0                                       */
  int group;                       /* AdamW group, 0 = desc.adamw                                 */
} muon_adamw_param;

MUON_API muon_adamw_param muon_default_adamw_param(void);

/* Creates an optimizer. On failure *opt is NULL and the message goes to desc->logger. */
MUON_API muon_status muon_create(muon_optimizer **opt, const muon_desc *desc);
/* Frees everything the optimizer allocated; never the user's param/grad buffers. NULL is fine. */
MUON_API void muon_destroy(muon_optimizer *opt);
/* The last error message of this optimizer ("" if none). Valid until the next call on it. */
MUON_API const char *muon_error(const muon_optimizer *opt);

/* Param groups (torch's param_groups): a new group with its own hyperparameters. */
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
/* Points a matrix (or AdamW param) at a new gradient; NULL means absent this step. */
MUON_API muon_status muon_set_grad(muon_optimizer *opt, int index, const float *grad);
MUON_API muon_status muon_set_adamw_grad(muon_optimizer *opt, int index, const float *grad);
MUON_API int muon_matrix_count(const muon_optimizer *opt);
MUON_API int muon_adamw_param_count(const muon_optimizer *opt);

/* One optimizer step over every matrix and AdamW parameter whose gradient is present.
   All-or-nothing: on any error no parameter and no state has changed. */
MUON_API muon_status muon_step(muon_optimizer *opt);

/* Counters since creation (the distributed ones stay 0 on one device). */
typedef struct muon_stats {
  long long steps;                 /* successful muon_step calls                                 */
  long long ns_calls;              /* Newton-Schulz runs on this rank                            */
  long long collectives;           /* communication calls issued by this rank                    */
  long long bytes_sent, bytes_received;
  size_t state_bytes;              /* momentum + AdamW moments held by this rank                 */
  size_t workspace_bytes;          /* peak step workspace (NS operand + NS workspace)            */
  size_t ns_workspace_bytes;       /* peak NS workspace beyond its m x n operand                 */
} muon_stats;

MUON_API muon_status muon_get_stats(const muon_optimizer *opt, muon_stats *stats);

/* Read-only view of a matrix's momentum buffer (its local floats). */
MUON_API muon_status muon_get_momentum(const muon_optimizer *opt, int index, const float **buf, size_t *size);

/* ---------------------------------------------------------------------------------------------
   State: momentum, AdamW moments and step counts in a versioned, checksummed little blob.
   Loading checks everything before it changes anything: a truncated, corrupted or mismatched
   blob is MUON_ERR_STATE and the optimizer is untouched. */
MUON_API size_t muon_state_size(const muon_optimizer *opt);
MUON_API muon_status muon_state_save(muon_optimizer *opt, void *buf, size_t size);
MUON_API muon_status muon_state_load(muon_optimizer *opt, const void *buf, size_t size);
MUON_API muon_status muon_state_save_file(muon_optimizer *opt, const char *path);
MUON_API muon_status muon_state_load_file(muon_optimizer *opt, const char *path);

/* ---------------------------------------------------------------------------------------------
   Newton-Schulz alone: out = NS(in) for a rows x cols matrix, as muon_step computes it
   (transposing tall matrices). in and out may alias. Allocates its workspace with malloc. */
MUON_API muon_status muon_newton_schulz(const float *in, int rows, int cols, float *out, const muon_hparams *hp);
/* Floats of NS workspace for an m x n operand (m <= n) beyond the operand: <= 2mn + 2m^2. */
MUON_API size_t muon_ns_workspace_floats(int rows, int cols);

#ifdef __cplusplus
}
#endif
#endif /* MUON_H */

/* =============================================================================================
   IMPLEMENTATION
   ============================================================================================= */
#ifdef MUON_IMPLEMENTATION
#ifndef MUON__IMPLEMENTED
#define MUON__IMPLEMENTED

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef MUON_USE_CBLAS
#include <cblas.h>
#endif

#if defined(__GNUC__) || defined(__clang__)
#define MUON__PRINTF(f, a) __attribute__((format(printf, f, a)))
#define MUON__UNUSED __attribute__((unused))
#else
#define MUON__PRINTF(f, a)
#define MUON__UNUSED
#endif

/* ---------------------------------------------------------------------------------------------
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

MUON_API void muon_set_ns_preset(muon_hparams *hp, muon_ns_preset preset) {
  int k;
  if (!hp) return;
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
  hp.precision = MUON_PRECISION_FP32;
  hp.gemm = MUON_GEMM_AUTO;
  hp.symmetric = 1;
  return hp;
}

MUON_API muon_adamw_hparams muon_default_adamw_hparams(void) {
  muon_adamw_hparams hp;
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

/* ---------------------------------------------------------------------------------------------
   The single-rank communicator: alltoallv and allgather are local copies. */
static muon_status muon__self_alltoallv(void *ctx, const float *send, const size_t *send_counts,
                                        const size_t *send_displs, float *recv,
                                        const size_t *recv_counts, const size_t *recv_displs) {
  (void)ctx;
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
  MUON_COMM_VTABLE_VERSION, muon__self_alltoallv, muon__self_allgather, NULL, NULL, NULL
};

MUON_API muon_comm muon_comm_self(void) {
  muon_comm c;
  c.vt = &muon__self_vtable;
  c.ctx = NULL;
  c.rank = 0;
  c.size = 1;
  return c;
}

MUON_API void muon_comm_destroy(muon_comm *comm) {
  if (!comm) return;
  if (comm->vt && comm->vt->destroy) comm->vt->destroy(comm->ctx);
  memset(comm, 0, sizeof *comm);
}

/* ---------------------------------------------------------------------------------------------
   The optimizer object */
typedef struct muon__matrix {
  char name[64];
  float *param;
  const float *grad;
  int rows, cols;
  int group;
  size_t size;          /* floats of param/grad/momentum held here */
  float *momentum;
  int skip;             /* this step: absent or non-finite gradient */
} muon__matrix;

typedef struct muon__adamw {
  char name[64];
  float *param;
  const float *grad;
  size_t size;
  int group;
  float *exp_avg, *exp_avg_sq;
  long long step;
  int skip;
} muon__adamw;

struct muon_optimizer {
  muon_allocator allocator;
  muon_logger logger;
  muon_nonfinite on_nonfinite;
  muon_hparams *groups;
  int n_groups;
  muon_adamw_hparams *adamw_groups;
  int n_adamw_groups;
  muon__matrix *matrices;
  int n_matrices;
  muon__adamw *adamw;
  int n_adamw;
  float *work;          /* step workspace, grown before a step changes anything */
  size_t work_floats;
  muon_stats stats;
  char error[512];
};

/* ---------------------------------------------------------------------------------------------
   Memory and messages */
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

MUON_API const char *muon_error(const muon_optimizer *opt) {
  return opt ? opt->error : "muon_error: opt is NULL";
}

static int muon__finite(float x) { return isfinite(x) != 0; }

/* Checks one group's hyperparameters; writes the message into buf. */
static muon_status muon__check_hparams(const muon_hparams *hp, char *buf, size_t size) {
  int k;
  if (!(muon__finite(hp->lr) && hp->lr >= 0)) { snprintf(buf, size, "muon_hparams.lr must be finite and >= 0 (got %g)", (double)hp->lr); return MUON_ERR_ARG; }
  if (!(muon__finite(hp->weight_decay) && hp->weight_decay >= 0)) { snprintf(buf, size, "muon_hparams.weight_decay must be finite and >= 0 (got %g)", (double)hp->weight_decay); return MUON_ERR_ARG; }
  if (!(hp->momentum >= 0 && hp->momentum < 1)) { snprintf(buf, size, "muon_hparams.momentum must be in [0, 1) (got %g)", (double)hp->momentum); return MUON_ERR_ARG; }
  if (hp->ns_steps < 1 || hp->ns_steps > MUON_NS_MAX_STEPS) { snprintf(buf, size, "muon_hparams.ns_steps must be in [1, %d] (got %d)", MUON_NS_MAX_STEPS, hp->ns_steps); return MUON_ERR_ARG; }
  for (k = 0; k < hp->ns_steps; k++)
    if (!muon__finite(hp->ns_coefficients[k][0]) || !muon__finite(hp->ns_coefficients[k][1]) || !muon__finite(hp->ns_coefficients[k][2])) {
      snprintf(buf, size, "muon_hparams.ns_coefficients[%d] must be finite (got %g, %g, %g)", k,
               (double)hp->ns_coefficients[k][0], (double)hp->ns_coefficients[k][1], (double)hp->ns_coefficients[k][2]);
      return MUON_ERR_ARG;
    }
  if (!(muon__finite(hp->eps) && hp->eps > 0)) { snprintf(buf, size, "muon_hparams.eps must be finite and > 0 (got %g)", (double)hp->eps); return MUON_ERR_ARG; }
  if ((unsigned)hp->adjust_lr > (unsigned)MUON_ADJUST_LR_NONE) { snprintf(buf, size, "muon_hparams.adjust_lr is not a muon_adjust_lr (got %d)", (int)hp->adjust_lr); return MUON_ERR_ARG; }
  if ((unsigned)hp->momentum_style > (unsigned)MUON_MOMENTUM_SGD) { snprintf(buf, size, "muon_hparams.momentum_style is not a muon_momentum_style (got %d)", (int)hp->momentum_style); return MUON_ERR_ARG; }
  if ((unsigned)hp->precision > (unsigned)MUON_PRECISION_BF16) { snprintf(buf, size, "muon_hparams.precision is not a muon_precision (got %d)", (int)hp->precision); return MUON_ERR_ARG; }
  if ((unsigned)hp->gemm > (unsigned)MUON_GEMM_CBLAS) { snprintf(buf, size, "muon_hparams.gemm is not a muon_gemm (got %d)", (int)hp->gemm); return MUON_ERR_ARG; }
#ifndef MUON_USE_CBLAS
  if (hp->gemm == MUON_GEMM_CBLAS) { snprintf(buf, size, "muon_hparams.gemm is MUON_GEMM_CBLAS but muon.h was compiled without MUON_USE_CBLAS"); return MUON_ERR_ARG; }
#endif
  return MUON_OK;
}

static muon_status muon__check_adamw_hparams(const muon_adamw_hparams *hp, char *buf, size_t size) {
  if (!(muon__finite(hp->lr) && hp->lr >= 0)) { snprintf(buf, size, "muon_adamw_hparams.lr must be finite and >= 0 (got %g)", (double)hp->lr); return MUON_ERR_ARG; }
  if (!(hp->beta1 >= 0 && hp->beta1 < 1)) { snprintf(buf, size, "muon_adamw_hparams.beta1 must be in [0, 1) (got %g)", (double)hp->beta1); return MUON_ERR_ARG; }
  if (!(hp->beta2 >= 0 && hp->beta2 < 1)) { snprintf(buf, size, "muon_adamw_hparams.beta2 must be in [0, 1) (got %g)", (double)hp->beta2); return MUON_ERR_ARG; }
  if (!(muon__finite(hp->eps) && hp->eps >= 0)) { snprintf(buf, size, "muon_adamw_hparams.eps must be finite and >= 0 (got %g)", (double)hp->eps); return MUON_ERR_ARG; }
  if (!(muon__finite(hp->weight_decay) && hp->weight_decay >= 0)) { snprintf(buf, size, "muon_adamw_hparams.weight_decay must be finite and >= 0 (got %g)", (double)hp->weight_decay); return MUON_ERR_ARG; }
  return MUON_OK;
}

/* ---------------------------------------------------------------------------------------------
   Creation, groups, registration */
MUON_API muon_status muon_create(muon_optimizer **out, const muon_desc *desc) {
  muon_allocator a;
  muon_optimizer *opt;
  char msg[400];
  muon_status st;
  if (!out) { if (desc) muon__log(&desc->logger, MUON_LOG_ERROR, "MUON_ERR_ARG: muon_create: opt is NULL"); return MUON_ERR_ARG; }
  *out = NULL;
  if (!desc) return MUON_ERR_ARG;
  a = desc->allocator;
  if (!a.alloc != !a.free) {
    muon__log(&desc->logger, MUON_LOG_ERROR, "MUON_ERR_ARG: muon_desc.allocator: set both alloc and free, or neither");
    return MUON_ERR_ARG;
  }
  if (!a.alloc) { a.alloc = muon__default_alloc; a.free = muon__default_free; a.user_data = NULL; }
  if ((st = muon__check_hparams(&desc->hparams, msg, sizeof msg)) != MUON_OK ||
      (st = muon__check_adamw_hparams(&desc->adamw, msg, sizeof msg)) != MUON_OK) {
    char full[480];
    snprintf(full, sizeof full, "%s: muon_desc: %s", muon_status_string(st), msg);
    muon__log(&desc->logger, MUON_LOG_ERROR, full);
    return st;
  }
  if ((unsigned)desc->on_nonfinite > (unsigned)MUON_NONFINITE_SKIP) {
    muon__log(&desc->logger, MUON_LOG_ERROR, "MUON_ERR_ARG: muon_desc.on_nonfinite is not a muon_nonfinite");
    return MUON_ERR_ARG;
  }
  opt = (muon_optimizer *)muon__alloc(&a, sizeof *opt);
  if (!opt) {
    muon__log(&desc->logger, MUON_LOG_ERROR, "MUON_ERR_NOMEM: muon_create: allocating the optimizer failed");
    return MUON_ERR_NOMEM;
  }
  memset(opt, 0, sizeof *opt);
  opt->allocator = a;
  opt->logger = desc->logger;
  opt->on_nonfinite = desc->on_nonfinite;
  opt->groups = (muon_hparams *)muon__alloc(&a, sizeof(muon_hparams));
  opt->adamw_groups = (muon_adamw_hparams *)muon__alloc(&a, sizeof(muon_adamw_hparams));
  if (!opt->groups || !opt->adamw_groups) {
    muon__log(&desc->logger, MUON_LOG_ERROR, "MUON_ERR_NOMEM: muon_create: allocating the parameter groups failed");
    muon_destroy(opt);
    return MUON_ERR_NOMEM;
  }
  opt->groups[0] = desc->hparams;
  opt->n_groups = 1;
  opt->adamw_groups[0] = desc->adamw;
  opt->n_adamw_groups = 1;
  *out = opt;
  return MUON_OK;
}

MUON_API void muon_destroy(muon_optimizer *opt) {
  muon_allocator a;
  int i;
  if (!opt) return;
  a = opt->allocator;
  for (i = 0; i < opt->n_matrices; i++) muon__free(&a, opt->matrices[i].momentum);
  for (i = 0; i < opt->n_adamw; i++) {
    muon__free(&a, opt->adamw[i].exp_avg);
    muon__free(&a, opt->adamw[i].exp_avg_sq);
  }
  muon__free(&a, opt->matrices);
  muon__free(&a, opt->adamw);
  muon__free(&a, opt->groups);
  muon__free(&a, opt->adamw_groups);
  muon__free(&a, opt->work);
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
  if (group < 0 || group >= opt->n_groups) return muon__fail(opt, MUON_ERR_ARG, "muon_set_group: group %d does not exist (have %d)", group, opt->n_groups);
  if ((st = muon__check_hparams(hp, msg, sizeof msg)) != MUON_OK) return muon__fail(opt, st, "muon_set_group(%d): %s", group, msg);
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
  if (group < 0 || group >= opt->n_groups) return muon__fail(opt, MUON_ERR_ARG, "muon_set_lr: group %d does not exist (have %d)", group, opt->n_groups);
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
  if ((st = muon__check_adamw_hparams(hp, msg, sizeof msg)) != MUON_OK) return muon__fail(opt, st, "muon_add_adamw_group: %s", msg);
  g = (muon_adamw_hparams *)muon__grow(&opt->allocator, opt->adamw_groups, opt->n_adamw_groups, sizeof *g);
  if (!g) return muon__fail(opt, MUON_ERR_NOMEM, "muon_add_adamw_group: allocating group %d failed", opt->n_adamw_groups);
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
  if (group < 0 || group >= opt->n_adamw_groups) return muon__fail(opt, MUON_ERR_ARG, "muon_set_adamw_group: group %d does not exist (have %d)", group, opt->n_adamw_groups);
  if ((st = muon__check_adamw_hparams(hp, msg, sizeof msg)) != MUON_OK) return muon__fail(opt, st, "muon_set_adamw_group(%d): %s", group, msg);
  opt->adamw_groups[group] = *hp;
  return MUON_OK;
}

MUON_API muon_status muon_set_adamw_lr(muon_optimizer *opt, int group, float lr) {
  muon_adamw_hparams hp;
  if (!opt) return MUON_ERR_ARG;
  if (group < 0 || group >= opt->n_adamw_groups) return muon__fail(opt, MUON_ERR_ARG, "muon_set_adamw_lr: group %d does not exist (have %d)", group, opt->n_adamw_groups);
  hp = opt->adamw_groups[group];
  hp.lr = lr;
  return muon_set_adamw_group(opt, group, &hp);
}

static void muon__copy_name(char *dst, size_t size, const char *name) {
  if (!name) name = "";
  strncpy(dst, name, size - 1);
  dst[size - 1] = '\0';
}

MUON_API muon_status muon_add_matrix(muon_optimizer *opt, const muon_matrix *m, int *index_out) {
  const char *name;
  int count, i, first;
  size_t size, stride;
  muon__matrix *grown;
  float **moms;
  if (!opt) return MUON_ERR_ARG;
  if (!m) return muon__fail(opt, MUON_ERR_ARG, "muon_add_matrix: m is NULL");
  name = m->name ? m->name : "";
  first = opt->n_matrices;
#define MUON__BAD(st, ...) do { char what_[300]; snprintf(what_, sizeof what_, __VA_ARGS__); \
    return muon__fail(opt, st, "muon_add_matrix: %s (matrix %d, '%s')", what_, first, name); } while (0)
  if (m->ndim != 0 && m->ndim != 2)
    MUON__BAD(MUON_ERR_SHAPE, "muon_matrix.ndim must be 2, got %d: Muon only orthogonalises 2-D weights; register other parameters with muon_add_adamw_param", m->ndim);
  if (m->rows <= 0 || m->cols <= 0) MUON__BAD(MUON_ERR_SHAPE, "muon_matrix.rows and .cols must be > 0 (got %d x %d)", m->rows, m->cols);
  if (!m->param) MUON__BAD(MUON_ERR_ARG, "muon_matrix.param is NULL");
  if (m->count < 0) MUON__BAD(MUON_ERR_SHAPE, "muon_matrix.count must be >= 0 (got %d)", m->count);
  if (m->group < 0 || m->group >= opt->n_groups) MUON__BAD(MUON_ERR_ARG, "muon_matrix.group %d does not exist (have %d)", m->group, opt->n_groups);
  size = (size_t)m->rows * (size_t)m->cols;
  count = m->count ? m->count : 1;
  stride = m->stride ? m->stride : size;
  if (count > 1 && stride < size)
    MUON__BAD(MUON_ERR_SHAPE, "muon_matrix.stride %zu makes the %d stacked %d x %d matrices overlap (needs >= %zu)", stride, count, m->rows, m->cols, size);
#undef MUON__BAD
  /* Allocate everything first so a failure leaves the optimizer as it was. */
  moms = (float **)muon__alloc(&opt->allocator, (size_t)count * sizeof(float *));
  grown = moms ? (muon__matrix *)muon__alloc(&opt->allocator, (size_t)(first + count) * sizeof(muon__matrix)) : NULL;
  for (i = 0; grown && i < count; i++) {
    moms[i] = (float *)muon__alloc(&opt->allocator, size * sizeof(float));
    if (!moms[i]) break;
  }
  if (!grown || i < count) {
    while (grown && i-- > 0) muon__free(&opt->allocator, moms[i]);
    muon__free(&opt->allocator, grown);
    muon__free(&opt->allocator, moms);
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_add_matrix: allocating momentum for %d x %d x %d failed (matrix %d, '%s')", count, m->rows, m->cols, first, name);
  }
  if (first) memcpy(grown, opt->matrices, (size_t)first * sizeof(muon__matrix));
  for (i = 0; i < count; i++) {
    muon__matrix *x = &grown[first + i];
    memset(x, 0, sizeof *x);
    if (count > 1) snprintf(x->name, sizeof x->name, "%.50s[%d]", name, i);
    else muon__copy_name(x->name, sizeof x->name, name);
    x->param = m->param + (size_t)i * stride;
    x->grad = m->grad ? m->grad + (size_t)i * stride : NULL;
    x->rows = m->rows;
    x->cols = m->cols;
    x->group = m->group;
    x->size = size;
    x->momentum = moms[i];
    memset(x->momentum, 0, size * sizeof(float));
  }
  muon__free(&opt->allocator, moms);
  muon__free(&opt->allocator, opt->matrices);
  opt->matrices = grown;
  opt->n_matrices = first + count;
  opt->stats.state_bytes += (size_t)count * size * sizeof(float);
  if (index_out) *index_out = first;
  return MUON_OK;
}

MUON_API muon_status muon_add_adamw_param(muon_optimizer *opt, const muon_adamw_param *p, int *index_out) {
  muon__adamw *grown, *x;
  float *m1, *m2;
  int i;
  if (!opt) return MUON_ERR_ARG;
  if (!p) return muon__fail(opt, MUON_ERR_ARG, "muon_add_adamw_param: p is NULL");
  i = opt->n_adamw;
  if (!p->param) return muon__fail(opt, MUON_ERR_ARG, "muon_add_adamw_param: muon_adamw_param.param is NULL (param %d, '%s')", i, p->name ? p->name : "");
  if (p->size == 0) return muon__fail(opt, MUON_ERR_SHAPE, "muon_add_adamw_param: muon_adamw_param.size must be > 0 (param %d, '%s')", i, p->name ? p->name : "");
  if (p->group < 0 || p->group >= opt->n_adamw_groups)
    return muon__fail(opt, MUON_ERR_ARG, "muon_add_adamw_param: muon_adamw_param.group %d does not exist (have %d) (param %d, '%s')", p->group, opt->n_adamw_groups, i, p->name ? p->name : "");
  m1 = (float *)muon__alloc(&opt->allocator, p->size * sizeof(float));
  m2 = m1 ? (float *)muon__alloc(&opt->allocator, p->size * sizeof(float)) : NULL;
  grown = m2 ? (muon__adamw *)muon__grow(&opt->allocator, opt->adamw, i, sizeof *grown) : NULL;
  if (!grown) {
    muon__free(&opt->allocator, m1);
    muon__free(&opt->allocator, m2);
    return muon__fail(opt, MUON_ERR_NOMEM, "muon_add_adamw_param: allocating moments of %zu floats failed (param %d, '%s')", p->size, i, p->name ? p->name : "");
  }
  opt->adamw = grown;
  x = &grown[i];
  memset(x, 0, sizeof *x);
  muon__copy_name(x->name, sizeof x->name, p->name);
  x->param = p->param;
  x->grad = p->grad;
  x->size = p->size;
  x->group = p->group;
  x->exp_avg = m1;
  x->exp_avg_sq = m2;
  memset(m1, 0, p->size * sizeof(float));
  memset(m2, 0, p->size * sizeof(float));
  opt->n_adamw = i + 1;
  opt->stats.state_bytes += 2 * p->size * sizeof(float);
  if (index_out) *index_out = i;
  return MUON_OK;
}

MUON_API muon_status muon_set_grad(muon_optimizer *opt, int index, const float *grad) {
  if (!opt) return MUON_ERR_ARG;
  if (index < 0 || index >= opt->n_matrices) return muon__fail(opt, MUON_ERR_ARG, "muon_set_grad: matrix %d does not exist (have %d)", index, opt->n_matrices);
  opt->matrices[index].grad = grad;
  return MUON_OK;
}

MUON_API muon_status muon_set_adamw_grad(muon_optimizer *opt, int index, const float *grad) {
  if (!opt) return MUON_ERR_ARG;
  if (index < 0 || index >= opt->n_adamw) return muon__fail(opt, MUON_ERR_ARG, "muon_set_adamw_grad: AdamW param %d does not exist (have %d)", index, opt->n_adamw);
  opt->adamw[index].grad = grad;
  return MUON_OK;
}

MUON_API int muon_matrix_count(const muon_optimizer *opt) { return opt ? opt->n_matrices : 0; }
MUON_API int muon_adamw_param_count(const muon_optimizer *opt) { return opt ? opt->n_adamw : 0; }

/* ---------------------------------------------------------------------------------------------
   Element-wise math, one element at a time, so the CPU loops and (later) CUDA kernels share the
   exact formulas. Reference: torch.optim.Muon / torch.optim.AdamW (single-tensor paths). */
#if defined(__CUDACC__)
#define MUON__HD static inline __host__ __device__
#else
#define MUON__HD static inline
#endif

/* Momentum, returns U. lerp: torch's buf.lerp_(g, 1-mu) then g.lerp(buf, mu). */
MUON__HD float muon__momentum_elem(float *b, float g, float mu, int nesterov, int sgd) {
  if (sgd) {
    *b = mu * *b + g;
    return nesterov ? g + mu * *b : *b;
  }
  *b = *b + (1.0f - mu) * (g - *b);
  return nesterov ? g + mu * (*b - g) : *b;
}

/* w*(1 - lr*wd) first, with the unadjusted lr; then the orthogonalised step. */
MUON__HD float muon__apply_elem(float w, float o, float decay, float step) {
  w = w * decay;
  return w - step * o;
}

/* torch.optim.AdamW for one element; step_size = lr/(1-beta1^t), bc2_sqrt = sqrt(1-beta2^t). */
MUON__HD float muon__adamw_elem(float w, float g, float *m, float *v, float beta1, float beta2, float eps,
                                float decay, float step_size, float bc2_sqrt) {
  w = w * decay;
  *m = *m + (1.0f - beta1) * (g - *m);
  *v = *v * beta2 + (1.0f - beta2) * g * g;
  return w - step_size * (*m / (sqrtf(*v) / bc2_sqrt + eps));
}

/* Round to the nearest bfloat16, ties to even, kept in a float. */
MUON__HD float muon__bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u) {
    if (u & 0x007fffffu) u |= 0x00400000u; /* keep NaN a NaN */
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
  }
  u &= 0xffff0000u;
  memcpy(&x, &u, sizeof x);
  return x;
}

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
  default: return (float)(lr * sqrt(r / c > 1.0 ? r / c : 1.0));
  }
}

/* ---------------------------------------------------------------------------------------------
   CPU GEMM. Row-major. muon__sgemm_naive is the oracle the fast kernels are tested against. */
/* MUON__GEMM_BEGIN */
#define MUON__GEMM_PACK_FLOATS 0

/* C[M x N] = alpha * A[M x K] * op(B) + beta * C; op(B) = B (K x N) or, transb, B^T (B is N x K). */
MUON__UNUSED static void muon__sgemm_naive(int transb, int M, int N, int K, float alpha, const float *A, int lda,
                              const float *B, int ldb, float beta, float *C, int ldc) {
  int i, j, k;
  for (i = 0; i < M; i++)
    for (j = 0; j < N; j++) {
      double s = 0;
      for (k = 0; k < K; k++) s += (double)A[i * lda + k] * (transb ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = (float)(alpha * s + (beta == 0 ? 0.0 : (double)beta * C[i * ldc + j]));
    }
}

static void muon__sgemm(int transb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                        int ldb, float beta, float *C, int ldc, float *pack, size_t pack_floats) {
  int i, j, k;
  (void)pack; (void)pack_floats;
  for (i = 0; i < M; i++) {
    float *c = C + (size_t)i * ldc;
    for (j = 0; j < N; j++) c[j] = beta == 0 ? 0.0f : beta * c[j];
    for (k = 0; k < K; k++) {
      float a = alpha * A[(size_t)i * lda + k];
      if (transb) for (j = 0; j < N; j++) c[j] += a * B[(size_t)j * ldb + k];
      else { const float *b = B + (size_t)k * ldb; for (j = 0; j < N; j++) c[j] += a * b[j]; }
    }
  }
}

/* C[N x N] = alpha * A[N x K] * A^T + beta * C; the lower triangle is computed, then mirrored. */
static void muon__ssyrk(int N, int K, float alpha, const float *A, int lda, float beta, float *C, int ldc,
                        float *pack, size_t pack_floats) {
  int i, j, k;
  (void)pack; (void)pack_floats;
  for (i = 0; i < N; i++)
    for (j = 0; j <= i; j++) {
      float s = 0;
      for (k = 0; k < K; k++) s += A[(size_t)i * lda + k] * A[(size_t)j * lda + k];
      C[(size_t)i * ldc + j] = alpha * s + (beta == 0 ? 0.0f : beta * C[(size_t)i * ldc + j]);
    }
  for (i = 0; i < N; i++)
    for (j = i + 1; j < N; j++) C[(size_t)i * ldc + j] = C[(size_t)j * ldc + i];
}
/* MUON__GEMM_END */

/* ---------------------------------------------------------------------------------------------
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
} muon__gemm_ctx;

/* C[N x N] = alpha * A[N x K] * A^T + beta * C, all of C written. */
static void muon__gram(const muon__gemm_ctx *g, int N, int K, float alpha, const float *A, int lda, float beta,
                       float *C, int ldc) {
#ifdef MUON_USE_CBLAS
  if (g->cblas) {
    int i, j;
    if (g->symmetric) {
      cblas_ssyrk(CblasRowMajor, CblasLower, CblasNoTrans, N, K, alpha, A, lda, beta, C, ldc);
      for (i = 0; i < N; i++)
        for (j = i + 1; j < N; j++) C[(size_t)i * ldc + j] = C[(size_t)j * ldc + i];
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, N, K, alpha, A, lda, A, lda, beta, C, ldc);
    }
    return;
  }
#endif
  if (g->symmetric) muon__ssyrk(N, K, alpha, A, lda, beta, C, ldc, g->pack, g->pack_floats);
  else muon__sgemm(1, N, N, K, alpha, A, lda, A, lda, beta, C, ldc, g->pack, g->pack_floats);
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
  muon__sgemm(0, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, g->pack, g->pack_floats);
}

/* GEMM pack floats for an m x n operand: used only when it fits in m*n, so the NS workspace stays
   within 2mn + 2m^2 (Y, A, B, pack). */
static size_t muon__ns_pack_floats(int m, int n) {
  size_t mn = (size_t)m * (size_t)n, pack = (size_t)MUON__GEMM_PACK_FLOATS;
  return pack && mn >= pack ? pack : 0;
}

static size_t muon__ns_ws_floats(int m, int n) {
  return (size_t)m * n + 2 * (size_t)m * m + muon__ns_pack_floats(m, n);
}

MUON_API size_t muon_ns_workspace_floats(int rows, int cols) {
  int m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
  return rows > 0 && cols > 0 ? muon__ns_ws_floats(m, n) : 0;
}

static int muon__use_cblas(const muon_hparams *hp) {
#ifdef MUON_USE_CBLAS
  return hp->gemm != MUON_GEMM_BUILTIN;
#else
  (void)hp;
  return 0;
#endif
}

/* ws holds muon__ns_ws_floats(m, n) floats. */
static void muon__newton_schulz(float *X, int m, int n, const muon_hparams *hp, float *ws) {
  size_t mn = (size_t)m * n, mm = (size_t)m * m, i;
  float *Y = ws, *A = ws + mn, *B = A + mm, *x = X, *t;
  int bf16 = hp->precision == MUON_PRECISION_BF16, k;
  double ss = 0;
  float norm, d;
  muon__gemm_ctx g;
  g.cblas = muon__use_cblas(hp);
  g.symmetric = hp->symmetric;
  g.pack = B + mm;
  g.pack_floats = muon__ns_pack_floats(m, n);

  if (bf16) muon__bf16_round(x, mn);
  for (i = 0; i < mn; i++) ss += (double)x[i] * x[i];
  norm = (float)sqrt(ss);
  if (bf16) norm = muon__bf16(norm);
  d = norm > hp->eps ? norm : hp->eps;
  if (bf16) d = muon__bf16(d);
  for (i = 0; i < mn; i++) x[i] = x[i] / d;
  if (bf16) muon__bf16_round(x, mn);

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

/* Full rows x cols matrix <-> NS operand X (m x n, m <= n): tall matrices are transposed. */
static void muon__to_operand(float *X, const float *U, int rows, int cols) {
  int i, j;
  if (rows <= cols) { memcpy(X, U, (size_t)rows * cols * sizeof(float)); return; }
  for (i = 0; i < rows; i++)
    for (j = 0; j < cols; j++) X[(size_t)j * rows + i] = U[(size_t)i * cols + j];
}

static void muon__from_operand(float *U, const float *X, int rows, int cols) {
  int i, j;
  if (rows <= cols) { memcpy(U, X, (size_t)rows * cols * sizeof(float)); return; }
  for (i = 0; i < rows; i++)
    for (j = 0; j < cols; j++) U[(size_t)i * cols + j] = X[(size_t)j * rows + i];
}

MUON_API muon_status muon_newton_schulz(const float *in, int rows, int cols, float *out, const muon_hparams *hp) {
  char msg[400];
  int m, n;
  float *X;
  if (!in || !out || !hp || rows <= 0 || cols <= 0) return !hp || !in || !out ? MUON_ERR_ARG : MUON_ERR_SHAPE;
  if (muon__check_hparams(hp, msg, sizeof msg) != MUON_OK) return MUON_ERR_ARG;
  m = rows < cols ? rows : cols;
  n = rows < cols ? cols : rows;
  X = (float *)malloc(((size_t)m * n + muon__ns_ws_floats(m, n)) * sizeof(float));
  if (!X) return MUON_ERR_NOMEM;
  muon__to_operand(X, in, rows, cols);
  muon__newton_schulz(X, m, n, hp, X + (size_t)m * n);
  muon__from_operand(out, X, rows, cols);
  free(X);
  return MUON_OK;
}

/* ---------------------------------------------------------------------------------------------
   The step: check -> workspace -> per matrix (momentum -> NS -> apply) -> AdamW.
   Everything that can fail happens before the first parameter or state changes. */
static int muon__all_finite(const float *x, size_t n) {
  size_t i;
  for (i = 0; i < n; i++)
    if (!muon__finite(x[i])) return 0;
  return 1;
}

/* Marks skipped matrices and AdamW params; fails on a non-finite gradient unless told to skip. */
static muon_status muon__check_grads(muon_optimizer *opt) {
  int i;
  for (i = 0; i < opt->n_matrices; i++) {
    muon__matrix *x = &opt->matrices[i];
    x->skip = x->grad == NULL;
    if (!x->skip && !muon__all_finite(x->grad, x->size)) {
      if (opt->on_nonfinite == MUON_NONFINITE_ERROR)
        return muon__fail(opt, MUON_ERR_NONFINITE, "muon_step: the gradient of matrix %d ('%s') has NaN or Inf; nothing was applied", i, x->name);
      x->skip = 1;
    }
  }
  for (i = 0; i < opt->n_adamw; i++) {
    muon__adamw *p = &opt->adamw[i];
    p->skip = p->grad == NULL;
    if (!p->skip && !muon__all_finite(p->grad, p->size)) {
      if (opt->on_nonfinite == MUON_NONFINITE_ERROR)
        return muon__fail(opt, MUON_ERR_NONFINITE, "muon_step: the gradient of AdamW param %d ('%s') has NaN or Inf; nothing was applied", i, p->name);
      p->skip = 1;
    }
  }
  return MUON_OK;
}

/* Step workspace for one matrix: U/O (rows x cols), the NS operand X (m x n), NS workspace. */
static size_t muon__step_ws_floats(int rows, int cols) {
  int m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
  return 2 * (size_t)m * n + muon__ns_ws_floats(m, n);
}

static muon_status muon__reserve(muon_optimizer *opt, size_t floats) {
  float *w;
  if (floats <= opt->work_floats) return MUON_OK;
  w = (float *)muon__alloc(&opt->allocator, floats * sizeof(float));
  if (!w) return muon__fail(opt, MUON_ERR_NOMEM, "muon_step: allocating %zu bytes of workspace failed; nothing was applied", floats * sizeof(float));
  muon__free(&opt->allocator, opt->work);
  opt->work = w;
  opt->work_floats = floats;
  return MUON_OK;
}

static void muon__step_matrix(muon_optimizer *opt, muon__matrix *x) {
  const muon_hparams *hp = &opt->groups[x->group];
  int m = x->rows < x->cols ? x->rows : x->cols, n = x->rows < x->cols ? x->cols : x->rows;
  float *U = opt->work, *X = U + x->size, *ws = X + (size_t)m * n;
  float decay = (float)(1.0 - (double)hp->lr * hp->weight_decay);
  float step = muon__adjusted_lr(hp, x->rows, x->cols);
  int sgd = hp->momentum_style == MUON_MOMENTUM_SGD;
  size_t i, ns_ws = muon__ns_ws_floats(m, n);

  for (i = 0; i < x->size; i++)                                   /* momentum -> U */
    U[i] = muon__momentum_elem(&x->momentum[i], x->grad[i], hp->momentum, hp->nesterov, sgd);
  muon__to_operand(X, U, x->rows, x->cols);                       /* NS: U -> O */
  muon__newton_schulz(X, m, n, hp, ws);
  muon__from_operand(U, X, x->rows, x->cols);
  for (i = 0; i < x->size; i++)                                   /* apply */
    x->param[i] = muon__apply_elem(x->param[i], U[i], decay, step);

  opt->stats.ns_calls++;
  if (ns_ws * sizeof(float) > opt->stats.ns_workspace_bytes) opt->stats.ns_workspace_bytes = ns_ws * sizeof(float);
}

static void muon__step_adamw(muon_optimizer *opt, muon__adamw *p) {
  const muon_adamw_hparams *hp = &opt->adamw_groups[p->group];
  double t, bc1, bc2;
  float decay, step_size, bc2_sqrt;
  size_t i;
  p->step++;
  t = (double)p->step;
  bc1 = 1.0 - pow((double)hp->beta1, t);
  bc2 = 1.0 - pow((double)hp->beta2, t);
  decay = (float)(1.0 - (double)hp->lr * hp->weight_decay);
  step_size = (float)((double)hp->lr / bc1);
  bc2_sqrt = (float)sqrt(bc2);
  for (i = 0; i < p->size; i++)
    p->param[i] = muon__adamw_elem(p->param[i], p->grad[i], &p->exp_avg[i], &p->exp_avg_sq[i], hp->beta1,
                                   hp->beta2, hp->eps, decay, step_size, bc2_sqrt);
}

MUON_API muon_status muon_step(muon_optimizer *opt) {
  muon_status st;
  size_t need = 0;
  int i;
  if (!opt) return MUON_ERR_ARG;
  if ((st = muon__check_grads(opt)) != MUON_OK) return st;
  for (i = 0; i < opt->n_matrices; i++) {
    size_t w = muon__step_ws_floats(opt->matrices[i].rows, opt->matrices[i].cols);
    if (!opt->matrices[i].skip && w > need) need = w;
  }
  if ((st = muon__reserve(opt, need)) != MUON_OK) return st;
  if (need * sizeof(float) > opt->stats.workspace_bytes) opt->stats.workspace_bytes = need * sizeof(float);

  for (i = 0; i < opt->n_matrices; i++)
    if (!opt->matrices[i].skip) muon__step_matrix(opt, &opt->matrices[i]);
  for (i = 0; i < opt->n_adamw; i++)
    if (!opt->adamw[i].skip) muon__step_adamw(opt, &opt->adamw[i]);
  opt->stats.steps++;
  return MUON_OK;
}

MUON_API muon_status muon_get_stats(const muon_optimizer *opt, muon_stats *stats) {
  if (!opt || !stats) return MUON_ERR_ARG;
  *stats = opt->stats;
  return MUON_OK;
}

MUON_API muon_status muon_get_momentum(const muon_optimizer *opt, int index, const float **buf, size_t *size) {
  if (!opt || !buf || !size || index < 0 || index >= opt->n_matrices) return MUON_ERR_ARG;
  *buf = opt->matrices[index].momentum;
  *size = opt->matrices[index].size;
  return MUON_OK;
}

/* ---------------------------------------------------------------------------------------------
   State blob, little-endian:
     "MUONSTAT" | u32 version | u32 matrices | u32 adamw params | u32 0 | u64 steps
     u32 groups | u32 AdamW groups | per group: its muon_hparams field by field (ns_steps triples)
     | per AdamW group: lr, beta1, beta2, eps, weight_decay      (torch keeps param_groups too)
     per matrix:      u32 rows | u32 cols | u64 size | size x f32 momentum
     per AdamW param: u64 size | u64 step | size x f32 exp_avg | size x f32 exp_avg_sq
     u64 FNV-1a of everything before it */
#define MUON__STATE_VERSION 1u
#define MUON__STATE_HEADER 32u

static size_t muon__state_bytes(const muon_optimizer *opt) {
  size_t n = MUON__STATE_HEADER + 8 + 8 + 20 * (size_t)opt->n_adamw_groups;
  int i;
  for (i = 0; i < opt->n_groups; i++) n += 4 * (11 + 3 * (size_t)opt->groups[i].ns_steps);
  for (i = 0; i < opt->n_matrices; i++) n += 16 + 4 * opt->matrices[i].size;
  for (i = 0; i < opt->n_adamw; i++) n += 16 + 8 * opt->adamw[i].size;
  return n;
}

MUON_API size_t muon_state_size(const muon_optimizer *opt) { return opt ? muon__state_bytes(opt) : 0; }

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
static void muon__put_hparams(unsigned char **p, const muon_hparams *hp) {
  int k;
  muon__put_float(p, hp->lr); muon__put_float(p, hp->weight_decay); muon__put_float(p, hp->momentum);
  muon__put32(p, (uint32_t)hp->nesterov); muon__put32(p, (uint32_t)hp->momentum_style);
  muon__put32(p, (uint32_t)hp->adjust_lr); muon__put32(p, (uint32_t)hp->ns_steps);
  for (k = 0; k < hp->ns_steps; k++) muon__put_floats(p, hp->ns_coefficients[k], 3);
  muon__put_float(p, hp->eps); muon__put32(p, (uint32_t)hp->precision);
  muon__put32(p, (uint32_t)hp->gemm); muon__put32(p, (uint32_t)hp->symmetric);
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
static float muon__get_float(const unsigned char **p) { float x; muon__get_floats(p, &x, 1); return x; }
/* Reads a group written by muon__put_hparams; the ns_steps field decides how much follows, so a
   wrong value is caught by the caller's length check before this runs. */
static void muon__get_hparams(const unsigned char **p, muon_hparams *hp) {
  int k;
  hp->lr = muon__get_float(p); hp->weight_decay = muon__get_float(p); hp->momentum = muon__get_float(p);
  hp->nesterov = (int)muon__get32(p); hp->momentum_style = (muon_momentum_style)muon__get32(p);
  hp->adjust_lr = (muon_adjust_lr)muon__get32(p); hp->ns_steps = (int)muon__get32(p);
  for (k = 0; k < hp->ns_steps && k < MUON_NS_MAX_STEPS; k++) muon__get_floats(p, hp->ns_coefficients[k], 3);
  hp->eps = muon__get_float(p); hp->precision = (muon_precision)muon__get32(p);
  hp->gemm = (muon_gemm)muon__get32(p); hp->symmetric = (int)muon__get32(p);
}
static uint64_t muon__fnv1a(const unsigned char *p, size_t n) {
  uint64_t h = 14695981039346656037ull;
  size_t i;
  for (i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ull; }
  return h;
}

MUON_API muon_status muon_state_save(muon_optimizer *opt, void *buf, size_t size) {
  unsigned char *p = (unsigned char *)buf;
  size_t need;
  int i;
  if (!opt) return MUON_ERR_ARG;
  need = muon__state_bytes(opt);
  if (!buf) return muon__fail(opt, MUON_ERR_ARG, "muon_state_save: buf is NULL");
  if (size < need) return muon__fail(opt, MUON_ERR_ARG, "muon_state_save: buffer of %zu bytes is too small (need %zu, see muon_state_size)", size, need);
  memcpy(p, "MUONSTAT", 8); p += 8;
  muon__put32(&p, MUON__STATE_VERSION);
  muon__put32(&p, (uint32_t)opt->n_matrices);
  muon__put32(&p, (uint32_t)opt->n_adamw);
  muon__put32(&p, 0);
  muon__put64(&p, (uint64_t)opt->stats.steps);
  muon__put32(&p, (uint32_t)opt->n_groups);
  muon__put32(&p, (uint32_t)opt->n_adamw_groups);
  for (i = 0; i < opt->n_groups; i++) muon__put_hparams(&p, &opt->groups[i]);
  for (i = 0; i < opt->n_adamw_groups; i++) {
    const muon_adamw_hparams *a = &opt->adamw_groups[i];
    muon__put_float(&p, a->lr); muon__put_float(&p, a->beta1); muon__put_float(&p, a->beta2);
    muon__put_float(&p, a->eps); muon__put_float(&p, a->weight_decay);
  }
  for (i = 0; i < opt->n_matrices; i++) {
    const muon__matrix *x = &opt->matrices[i];
    muon__put32(&p, (uint32_t)x->rows);
    muon__put32(&p, (uint32_t)x->cols);
    muon__put64(&p, (uint64_t)x->size);
    muon__put_floats(&p, x->momentum, x->size);
  }
  for (i = 0; i < opt->n_adamw; i++) {
    const muon__adamw *a = &opt->adamw[i];
    muon__put64(&p, (uint64_t)a->size);
    muon__put64(&p, (uint64_t)a->step);
    muon__put_floats(&p, a->exp_avg, a->size);
    muon__put_floats(&p, a->exp_avg_sq, a->size);
  }
  muon__put64(&p, muon__fnv1a((const unsigned char *)buf, need - 8));
  return MUON_OK;
}

MUON_API muon_status muon_state_load(muon_optimizer *opt, const void *buf, size_t size) {
  const unsigned char *p = (const unsigned char *)buf, *end;
  const unsigned char *body, *adamw_groups;
  uint32_t version, nm, na, ng, nag;
  uint64_t steps, sum;
  muon_hparams *groups;
  size_t need;
  int i, pass;
  if (!opt) return MUON_ERR_ARG;
  if (!buf) return muon__fail(opt, MUON_ERR_ARG, "muon_state_load: buf is NULL");
  if (size < MUON__STATE_HEADER + 8 || memcmp(p, "MUONSTAT", 8) != 0)
    return muon__fail(opt, MUON_ERR_STATE, "muon_state_load: not a muon state (%zu bytes, bad magic or truncated header)", size);
  p += 8;
  version = muon__get32(&p);
  if (version != MUON__STATE_VERSION)
    return muon__fail(opt, MUON_ERR_STATE, "muon_state_load: state version %u, this muon.h reads version %u", version, MUON__STATE_VERSION);
  nm = muon__get32(&p);
  na = muon__get32(&p);
  (void)muon__get32(&p);
  steps = muon__get64(&p);
  if (nm != (uint32_t)opt->n_matrices || na != (uint32_t)opt->n_adamw)
    return muon__fail(opt, MUON_ERR_STATE, "muon_state_load: state has %u matrices and %u AdamW params, the optimizer %d and %d", nm, na, opt->n_matrices, opt->n_adamw);
  end = (const unsigned char *)buf + size - 8;
  sum = muon__get64(&end);
  if (sum != muon__fnv1a((const unsigned char *)buf, size - 8))
    return muon__fail(opt, MUON_ERR_STATE, "muon_state_load: checksum mismatch: the state is truncated or corrupted");
  ng = muon__get32(&p);
  nag = muon__get32(&p);
  if (ng != (uint32_t)opt->n_groups || nag != (uint32_t)opt->n_adamw_groups)
    return muon__fail(opt, MUON_ERR_STATE, "muon_state_load: state has %u groups and %u AdamW groups, the optimizer %d and %d", ng, nag, opt->n_groups, opt->n_adamw_groups);
  /* Groups: sized by their own ns_steps, checked as they are read into a copy. */
  groups = (muon_hparams *)muon__alloc(&opt->allocator, ng * sizeof(muon_hparams));
  if (!groups) return muon__fail(opt, MUON_ERR_NOMEM, "muon_state_load: allocating %u groups failed", ng);
  need = MUON__STATE_HEADER + 8 + 8 + 20 * (size_t)nag;
  for (i = 0; i < (int)ng; i++) {
    char msg[400];
    uint32_t steps_i;
    const unsigned char *q = p + 24;
    if ((size_t)(p - (const unsigned char *)buf) + 28 > size - 8) break;
    steps_i = muon__get32(&q);
    if (steps_i < 1 || steps_i > MUON_NS_MAX_STEPS || (size_t)(p - (const unsigned char *)buf) + 44 + 12 * (size_t)steps_i > size - 8) break;
    groups[i] = muon_default_hparams();
    muon__get_hparams(&p, &groups[i]);
    need += 4 * (11 + 3 * (size_t)steps_i);
    if (muon__check_hparams(&groups[i], msg, sizeof msg) != MUON_OK) {
      muon__free(&opt->allocator, groups);
      return muon__fail(opt, MUON_ERR_STATE, "muon_state_load: group %d: %s", i, msg);
    }
  }
  for (i = 0; i < opt->n_matrices; i++) need += 16 + 4 * opt->matrices[i].size;
  for (i = 0; i < opt->n_adamw; i++) need += 16 + 8 * opt->adamw[i].size;
  if (i < (int)ng || size != need) {
    muon__free(&opt->allocator, groups);
    return muon__fail(opt, MUON_ERR_STATE, "muon_state_load: state is %zu bytes, this optimizer's is %zu (truncated, or shapes differ)", size, need);
  }
  adamw_groups = p;
  for (i = 0; i < (int)nag; i++) {
    muon_adamw_hparams a;
    char msg[400];
    a.lr = muon__get_float(&p); a.beta1 = muon__get_float(&p); a.beta2 = muon__get_float(&p);
    a.eps = muon__get_float(&p); a.weight_decay = muon__get_float(&p);
    if (muon__check_adamw_hparams(&a, msg, sizeof msg) != MUON_OK) {
      muon__free(&opt->allocator, groups);
      return muon__fail(opt, MUON_ERR_STATE, "muon_state_load: AdamW group %d: %s", i, msg);
    }
  }
  body = p;
  /* Pass 0 checks every shape, pass 1 copies: nothing changes unless all of it fits. */
  for (pass = 0; pass < 2; pass++) {
    p = body;
    for (i = 0; i < opt->n_matrices; i++) {
      muon__matrix *x = &opt->matrices[i];
      uint32_t r = muon__get32(&p), c = muon__get32(&p);
      uint64_t n = muon__get64(&p);
      if (r != (uint32_t)x->rows || c != (uint32_t)x->cols || n != (uint64_t)x->size)
        return muon__free(&opt->allocator, groups), muon__fail(opt, MUON_ERR_STATE, "muon_state_load: matrix %d ('%s') is %d x %d (%zu floats here), the state has %u x %u (%llu floats)",
                          i, x->name, x->rows, x->cols, x->size, r, c, (unsigned long long)n);
      if (pass) muon__get_floats(&p, x->momentum, x->size); else p += 4 * x->size;
    }
    for (i = 0; i < opt->n_adamw; i++) {
      muon__adamw *a = &opt->adamw[i];
      uint64_t n = muon__get64(&p), t = muon__get64(&p);
      if (n != (uint64_t)a->size)
        return muon__free(&opt->allocator, groups), muon__fail(opt, MUON_ERR_STATE, "muon_state_load: AdamW param %d ('%s') has %zu floats, the state %llu", i, a->name, a->size, (unsigned long long)n);
      if (pass) {
        a->step = (long long)t;
        muon__get_floats(&p, a->exp_avg, a->size);
        muon__get_floats(&p, a->exp_avg_sq, a->size);
      } else {
        p += 8 * a->size;
      }
    }
  }
  for (i = 0; i < (int)nag; i++) {
    muon_adamw_hparams a;
    a.lr = muon__get_float(&adamw_groups); a.beta1 = muon__get_float(&adamw_groups);
    a.beta2 = muon__get_float(&adamw_groups); a.eps = muon__get_float(&adamw_groups);
    a.weight_decay = muon__get_float(&adamw_groups);
    opt->adamw_groups[i] = a;
  }
  memcpy(opt->groups, groups, ng * sizeof(muon_hparams));
  muon__free(&opt->allocator, groups);
  opt->stats.steps = (long long)steps;
  return MUON_OK;
}

MUON_API muon_status muon_state_save_file(muon_optimizer *opt, const char *path) {
  size_t n;
  void *buf;
  FILE *f;
  muon_status st;
  int ok;
  if (!opt) return MUON_ERR_ARG;
  if (!path) return muon__fail(opt, MUON_ERR_ARG, "muon_state_save_file: path is NULL");
  n = muon__state_bytes(opt);
  buf = muon__alloc(&opt->allocator, n);
  if (!buf) return muon__fail(opt, MUON_ERR_NOMEM, "muon_state_save_file: allocating %zu bytes failed", n);
  st = muon_state_save(opt, buf, n);
  if (st == MUON_OK) {
    f = fopen(path, "wb");
    ok = f && fwrite(buf, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) st = muon__fail(opt, MUON_ERR_STATE, "muon_state_save_file: writing '%s' failed", path);
  }
  muon__free(&opt->allocator, buf);
  return st;
}

MUON_API muon_status muon_state_load_file(muon_optimizer *opt, const char *path) {
  FILE *f;
  long len;
  void *buf;
  muon_status st;
  if (!opt) return MUON_ERR_ARG;
  if (!path) return muon__fail(opt, MUON_ERR_ARG, "muon_state_load_file: path is NULL");
  f = fopen(path, "rb");
  if (!f) return muon__fail(opt, MUON_ERR_STATE, "muon_state_load_file: cannot open '%s'", path);
  if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return muon__fail(opt, MUON_ERR_STATE, "muon_state_load_file: cannot read the size of '%s'", path);
  }
  buf = muon__alloc(&opt->allocator, (size_t)len);
  if (!buf) { fclose(f); return muon__fail(opt, MUON_ERR_NOMEM, "muon_state_load_file: allocating %ld bytes failed", len); }
  if (fread(buf, 1, (size_t)len, f) != (size_t)len) st = muon__fail(opt, MUON_ERR_STATE, "muon_state_load_file: reading '%s' failed", path);
  else st = muon_state_load(opt, buf, (size_t)len);
  fclose(f);
  muon__free(&opt->allocator, buf);
  return st;
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
