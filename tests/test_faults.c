/* test_faults.c - the compute backend failing at its N-th call, SQLite-style.

   A wrapper around the CPU backend (muon_compute_cpu(), NULL ctx) counts every status-returning
   slot call and every alloc, and fails call number fail_at (MUON_ERR_BACKEND; alloc: NULL) with
   the native text "injected failure in <slot> (call N)". Each scenario is swept with fail_at =
   0, 1, 2, ... until a run completes without an injected failure, with host memory and with
   device memory (host memory underneath, which the core must not touch: the user's buffers come
   from the wrapper's alloc, the state is staged, the custom exchange's callbacks follow a sync):
     a. one device: fp32, bf16 (with a bf16 mirror) and stacked matrices, AdamW params, NorMuon
        in one group; registration and two steps;
     b. the same on a 1-rank dist config (muon_layout_config, muon_comm_self);
     c. b with the config's own gather / redistribute;
     d. on b's optimizer after two steps: muon_state_save, muon_state_load (of an older state),
        muon_state_reshard (n = 1), muon_gather_matrix, muon_dump_file, muon_check_layouts; then
        a new optimizer resumes from the saved state (muon_state_load makes room for NorMuon's v).
   Per injected failure: the call returns MUON_ERR_BACKEND (MUON_ERR_NOMEM for a failed alloc),
   muon_error names the status and the call (or the planning it ran), the logger heard the
   backend's text; a failure before the commit leaves parameters, mirrors and the whole state
   (muon_state_save's bytes) bitwise as they were, and a failed dump leaves no file; the same
   call retried succeeds, and the run ends bitwise where the run without failures ends. Where
   muon.h says work may be left half done ("the update may be partly applied" in the commit,
   "partly loaded" in a load or reshard) only status, message and retry are checked (a load's
   retry must still end where the clean run ends). A second run per site destroys the optimizer
   right after the failure: no backend or host block may be left (counted here; ASan sees the
   rest). Without failures every scenario and both memories end at the same bits. Not reached
   on one rank: the exchange (its staging through host buffers, the bf16 wire's cast). */
#define _POSIX_C_SOURCE 200809L   /* mkdir */
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "test.h"

#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

static char FS_DUMP[600];   /* in the scratch directory (argv[1]) */
static const char *fs_dir;

/* ---- the flaky compute backend ------------------------------------------------------------- */
enum { FB_ALLOC, FB_COPY, FB_ZERO, FB_PACK, FB_MOMENTUM, FB_NS, FB_APPLY, FB_ADAMW, FB_NONFINITE,
       FB_CAST, FB_SYNC, FB_NORMUON, FB_BLOCKWISE, FB_SLOTS };
static const char *const fb_names[FB_SLOTS] = { "alloc", "copy", "zero", "pack", "momentum", "newton_schulz",
                                                "apply", "adamw", "nonfinite", "cast", "sync", "normuon",
                                                "blockwise" };

typedef struct fb_ctx {
  muon_compute cpu;
  muon_compute_vtable vt;
  long calls, fail_at;       /* counted calls; fail_at -1: none fails */
  int paused;                /* the test's own calls (snapshots): neither counted nor failed */
  int injected, slot;        /* failures injected so far, the slot of the last one */
  int last;                  /* the last slot called, paused or not */
  char text[96];             /* the native text of the last failure */
  long live;                 /* blocks from alloc not yet freed */
} fb_ctx;

static int fb_fail(void *c, int slot) {
  fb_ctx *f = (fb_ctx *)c;
  f->last = slot;
  if (f->paused || f->calls++ != f->fail_at) return 0;
  f->injected++;
  f->slot = slot;
  snprintf(f->text, sizeof f->text, "injected failure in %s (call %ld)", fb_names[slot], f->fail_at);
  return 1;
}
#define FB_CPU(c) (((fb_ctx *)(c))->cpu)
#define FB_CALL(c, slot, call) (fb_fail((c), (slot)) ? MUON_ERR_BACKEND : FB_CPU(c).vt->call)

static void *fb_alloc(void *c, size_t bytes) {
  void *p;
  if (fb_fail(c, FB_ALLOC)) return NULL;
  p = FB_CPU(c).vt->alloc(FB_CPU(c).ctx, bytes);
  if (p) ((fb_ctx *)c)->live++;
  return p;
}
static void fb_free(void *c, void *p) {
  if (!p) return;
  ((fb_ctx *)c)->live--;
  FB_CPU(c).vt->free(FB_CPU(c).ctx, p);
}
static muon_status fb_copy(void *c, void *d, const void *s, size_t b, int th, int fh) { return FB_CALL(c, FB_COPY, copy(FB_CPU(c).ctx, d, s, b, th, fh)); }
static muon_status fb_zero(void *c, void *d, size_t b) { return FB_CALL(c, FB_ZERO, zero(FB_CPU(c).ctx, d, b)); }
static muon_status fb_pack(void *c, const muon_piece_copy *o, int n, float *p, float *x, int t) { return FB_CALL(c, FB_PACK, pack(FB_CPU(c).ctx, o, n, p, x, t)); }
static muon_status fb_momentum(void *c, size_t n, float *m, const void *g, const muon_momentum_args *a, int up, float *u) {
  return FB_CALL(c, FB_MOMENTUM, momentum(FB_CPU(c).ctx, n, m, g, a, up, u));
}
static size_t fb_ns_workspace(void *c, int b, int m, int n, const muon_hparams *hp) { return FB_CPU(c).vt->ns_workspace(FB_CPU(c).ctx, b, m, n, hp); }
static muon_status fb_ns(void *c, float *X, int b, int m, int n, const muon_hparams *hp, void *ws) {
  return FB_CALL(c, FB_NS, newton_schulz(FB_CPU(c).ctx, X, b, m, n, hp, ws));
}
static muon_status fb_ns_many(void *c, int k, float *const *X, const int *m, const int *n, const muon_hparams *const *hp, void *ws) {
  return FB_CALL(c, FB_NS, newton_schulz_many(FB_CPU(c).ctx, k, X, m, n, hp, ws));
}
static muon_status fb_apply(void *c, size_t n, void *p, const float *O, const muon_apply_args *a) { return FB_CALL(c, FB_APPLY, apply(FB_CPU(c).ctx, n, p, O, a)); }
static muon_status fb_adamw(void *c, size_t n, void *p, const void *g, float *m, float *v, const muon_adamw_args *a) {
  return FB_CALL(c, FB_ADAMW, adamw(FB_CPU(c).ctx, n, p, g, m, v, a));
}
static muon_status fb_nonfinite(void *c, const void *x, muon_dtype t, size_t n, int *flag) { return FB_CALL(c, FB_NONFINITE, nonfinite(FB_CPU(c).ctx, x, t, n, flag)); }
static muon_status fb_cast(void *c, void *d, muon_dtype dt, const void *s, muon_dtype st, size_t n) { return FB_CALL(c, FB_CAST, cast(FB_CPU(c).ctx, d, dt, s, st, n)); }
static muon_status fb_sync(void *c) { return FB_CALL(c, FB_SYNC, sync(FB_CPU(c).ctx)); }
static muon_status fb_normuon(void *c, float *X, int m, int n, int pc, const float *v, float *vn, const muon_hparams *hp) {
  return FB_CALL(c, FB_NORMUON, normuon(FB_CPU(c).ctx, X, m, n, pc, v, vn, hp));
}
static muon_status fb_blockwise(void *c, int to_int8, size_t n, float *x, void *q) {
  return FB_CALL(c, FB_BLOCKWISE, blockwise(FB_CPU(c).ctx, to_int8, n, x, q));
}
static const char *fb_error(void *c) { return ((fb_ctx *)c)->text; }

/* Every slot of vtable version 1 is wrapped below (newton_schulz_many counted as newton_schulz);
   a new slot must be wrapped (and counted) too, or the CPU's would be handed this wrapper's ctx. */
typedef char fb_wraps_every_slot[MUON_COMPUTE_VTABLE_VERSION == 1 ? 1 : -1];

static muon_compute fb_init(fb_ctx *f, int device) {
  muon_compute c;
  memset(f, 0, sizeof *f);
  f->cpu = muon_compute_cpu();
  f->fail_at = -1;
  f->vt = *f->cpu.vt;
  f->vt.memory = device ? MUON_MEMORY_DEVICE : MUON_MEMORY_HOST;
  f->vt.alloc = fb_alloc; f->vt.free = fb_free; f->vt.alloc_host = NULL; f->vt.free_host = NULL;
  f->vt.copy = fb_copy; f->vt.zero = fb_zero; f->vt.pack = fb_pack; f->vt.momentum = fb_momentum;
  f->vt.ns_workspace = fb_ns_workspace; f->vt.newton_schulz = fb_ns; f->vt.apply = fb_apply;
  f->vt.adamw = fb_adamw; f->vt.nonfinite = fb_nonfinite; f->vt.cast = fb_cast; f->vt.sync = fb_sync;
  f->vt.error = fb_error; f->vt.destroy = NULL; f->vt.normuon = fb_normuon; f->vt.newton_schulz_many = fb_ns_many;
  f->vt.blockwise = fb_blockwise;
  c.vt = &f->vt;
  c.ctx = f;
  return c;
}

/* ---- the model: one block of backend memory, parameters first ------------------------------ */
#define WR 12
#define WC 20
#define HR 20      /* tall: its operand is the transpose */
#define HC 12
#define SN 3
#define SR 8
#define SC 12
#define BN 16
#define EN 10
#define NMAT 5     /* w, h, s[0..2] */
#define BIG (WR * WC)

typedef struct fm_params {
  float w[WR * WC];
  uint16_t h[HR * HC], hm[HR * HC];    /* bf16 param and its bf16 mirror */
  float s[SN * SR * SC];
  float b[BN];
  uint16_t e[EN], em[EN];              /* bf16 AdamW param and mirror */
} fm_params;
typedef struct fm_grads {
  float w[WR * WC];
  uint16_t h[HR * HC];
  float s[SN * SR * SC];
  float b[BN];
  uint16_t e[EN];
} fm_grads;
typedef struct fm_model { fm_params p; fm_grads g; } fm_model;

static unsigned fm_rng;
static float fm_rand(void) {
  fm_rng = fm_rng * 1664525u + 1013904223u;
  return (float)((fm_rng >> 8) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}
static uint16_t fm_bf16(float x) { uint32_t u; memcpy(&u, &x, 4); return (uint16_t)(u >> 16); }
static void fm_fill(float *x, size_t n) { size_t i; for (i = 0; i < n; i++) x[i] = fm_rand(); }
static void fm_fill16(uint16_t *x, size_t n) { size_t i; for (i = 0; i < n; i++) x[i] = fm_bf16(fm_rand()); }

static void fm_init(fm_model *m) {
  fm_rng = 7;
  fm_fill(m->p.w, WR * WC); fm_fill16(m->p.h, HR * HC); fm_fill(m->p.s, SN * SR * SC);
  fm_fill(m->p.b, BN); fm_fill16(m->p.e, EN);
  memcpy(m->p.hm, m->p.h, sizeof m->p.hm);
  memcpy(m->p.em, m->p.e, sizeof m->p.em);
}
static void fm_grads_for(fm_model *m, int step) {
  fm_rng = 100u + (unsigned)step;
  fm_fill(m->g.w, WR * WC); fm_fill16(m->g.h, HR * HC); fm_fill(m->g.s, SN * SR * SC);
  fm_fill(m->g.b, BN); fm_fill16(m->g.e, EN);
}

/* ---- a run: one scenario, one memory, one fail_at ------------------------------------------ */
typedef enum { FS_ONE, FS_DIST, FS_CUSTOM, FS_STATE } fs_kind;
static const char *const fs_kind_names[] = { "step, one device", "step, 1-rank dist config", "step, custom gather/redistribute",
                                             "state save/load/reshard and tools" };

#define BLOB (1 << 16)
#define DUMPMAX (1 << 17)
typedef struct fs_result {
  fm_params p;                         /* parameters and mirrors at the end */
  unsigned char state[BLOB];           /* the state at the end */
  size_t state_n;
  unsigned char saved[BLOB];           /* FS_STATE: what muon_state_save wrote */
  size_t saved_n;
  float gp[NMAT][BIG], gm[NMAT][BIG];  /* FS_STATE: muon_gather_matrix's parameters, momenta */
  unsigned char dump[DUMPMAX];         /* FS_STATE: the dump file */
  size_t dump_n;
} fs_result;

typedef enum { OP_ADD_W, OP_ADD_H, OP_ADD_S, OP_ADD_B, OP_ADD_E, OP_STEP, OP_SAVE, OP_LOAD, OP_RESHARD,
               OP_GATHER, OP_DUMP, OP_CHECK, OP_RESUME } fs_op;
/* the API call each op is, and whether it may plan first (its message may then be muon_plan's) */
static const int fs_op_plans[] = { 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 0 };
static const char *const fs_op_api[] = { "muon_add_matrix", "muon_add_matrix", "muon_add_matrix", "muon_add_adamw_param",
                                         "muon_add_adamw_param", "muon_step", "muon_state_save", "muon_state_load",
                                         "muon_state_reshard", "muon_gather_matrix", "muon_dump_file", "muon_check_layouts",
                                         "muon_state_load" };

typedef struct fs_run {
  fs_kind kind;
  int device, abandon;     /* abandon: destroy right after the first failure */
  fb_ctx f;
  muon_compute comp;
  muon_dist_config cfg;
  muon_desc desc;
  long host_live;          /* the host allocator's blocks not yet freed */
  fm_model *m;
  muon_optimizer *opt;
  fs_result *res;
  unsigned char blob_a[BLOB];   /* FS_STATE: the state after one step, loaded back */
  size_t blob_a_n;
  int log_native;          /* an error message to the logger carried the injected text */
  int cb_calls, cb_unsynced;    /* custom exchange: callbacks, and those not after a sync */
  int stop;                /* abandon mode: the failure happened */
  int partial;             /* a failure inside the commit: the end is not compared */
  int loaded;              /* a failure in a load's or reshard's writes: the retry must repair it */
  int bad;
  int sites_by_slot[FB_SLOTS];
} fs_run;

static fs_run R;             /* one run at a time: static, it is large */
static fs_result RES, REF[4][2];
static unsigned char SNAP_STATE[BLOB], NOW_STATE[BLOB];
static fm_params SNAP_P;

static void *hc_alloc(size_t n, void *u) { void *p = malloc(n); if (p) ((fs_run *)u)->host_live++; return p; }
static void hc_free(void *p, void *u) { ((fs_run *)u)->host_live--; free(p); }

static void fs_log(muon_log_level level, const char *msg, void *u) {
  fs_run *r = (fs_run *)u;
  if (level == MUON_LOG_ERROR && r->f.text[0] && strstr(msg, r->f.text)) r->log_native = 1;
}

/* The config's own exchange on one rank: the local piece is the whole matrix. Its buffers are
   backend memory, which the core must have synchronised before each call. */
static muon_status fs_gather(void *state, const muon_matrix_info *m, const float *local, float *full, int owner) {
  fs_run *r = (fs_run *)state;
  (void)owner;
  r->cb_calls++;
  if (r->device && r->f.last != FB_SYNC) r->cb_unsynced++;
  if (full && local) memcpy(full, local, m->local_size * sizeof(float));
  return MUON_OK;
}
static muon_status fs_redistribute(void *state, const muon_matrix_info *m, const float *full, float *local, int owner) {
  fs_run *r = (fs_run *)state;
  (void)owner;
  r->cb_calls++;
  if (r->device && r->f.last != FB_SYNC) r->cb_unsynced++;
  if (full && local) memcpy(local, full, m->local_size * sizeof(float));
  return MUON_OK;
}

/* Every local element sits where a whole-matrix layout puts it. */
static long long fs_index(void *user, int matrix, size_t k) { (void)user; (void)matrix; return (long long)k; }

static int fs_file_exists(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f) fclose(f);
  return f != NULL;
}

/* A temporary of the dump ("test_faults.dump.muon-tmp-XXXXXX") in the scratch directory. */
static int fs_dump_tmp_exists(void) {
  DIR *d = opendir(fs_dir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d)) != NULL) n += strncmp(e->d_name, "test_faults.dump.muon-tmp", 25) == 0;
  if (d) closedir(d);
  return n > 0;
}

static size_t fs_read_file(const char *path, unsigned char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t n;
  if (!f) return 0;
  n = fread(buf, 1, cap, f);
  fclose(f);
  return n;
}

static muon_status fs_do(fs_run *r, fs_op op, int arg) {
  fm_model *m = r->m;
  muon_matrix x = muon_default_matrix();
  muon_adamw_param p = muon_default_adamw_param();
  muon_status st;
  switch (op) {
  case OP_ADD_W:
    x.name = "w"; x.param = m->p.w; x.grad = m->g.w; x.rows = WR; x.cols = WC;
    return muon_add_matrix(r->opt, &x, NULL);
  case OP_ADD_H:
    x.name = "h"; x.param = m->p.h; x.grad = m->g.h; x.mirror = m->p.hm; x.rows = HR; x.cols = HC; x.group = 1;
    x.param_dtype = MUON_DTYPE_BF16; x.grad_dtype = MUON_DTYPE_BF16;
    return muon_add_matrix(r->opt, &x, NULL);
  case OP_ADD_S:
    x.name = "s"; x.param = m->p.s; x.grad = m->g.s; x.rows = SR; x.cols = SC; x.count = SN; x.group = 1;
    return muon_add_matrix(r->opt, &x, NULL);
  case OP_ADD_B:
    p.name = "b"; p.param = m->p.b; p.grad = m->g.b; p.size = BN;
    return muon_add_adamw_param(r->opt, &p, NULL);
  case OP_ADD_E:
    p.name = "e"; p.param = m->p.e; p.grad = m->g.e; p.mirror = m->p.em; p.size = EN;
    p.param_dtype = MUON_DTYPE_BF16; p.grad_dtype = MUON_DTYPE_BF16;
    return muon_add_adamw_param(r->opt, &p, NULL);
  case OP_STEP:
    return muon_step(r->opt);
  case OP_SAVE:
    r->res->saved_n = muon_state_size(r->opt);
    if (r->res->saved_n > BLOB) return MUON_ERR_ARG;
    return muon_state_save(r->opt, r->res->saved, r->res->saved_n);
  case OP_LOAD:
    return muon_state_load(r->opt, r->blob_a, r->blob_a_n);
  case OP_RESUME:
    return muon_state_load(r->opt, r->res->saved, r->res->saved_n);
  case OP_RESHARD: {
    const void *blobs[1];
    size_t sizes[1];
    blobs[0] = r->res->saved;
    sizes[0] = r->res->saved_n;
    return muon_state_reshard(r->opt, blobs, sizes, 1);
  }
  case OP_GATHER:
    return muon_gather_matrix(r->opt, arg, 0, r->res->gp[arg], r->res->gm[arg]);
  case OP_DUMP:
    st = muon_dump_file(r->opt, FS_DUMP, 0, 1);
    if (st == MUON_OK) r->res->dump_n = fs_read_file(FS_DUMP, r->res->dump, DUMPMAX);
    return st;
  case OP_CHECK:
    return muon_check_layouts(r->opt, fs_index, NULL);
  }
  return MUON_ERR_ARG;
}

#if defined(__GNUC__) || defined(__clang__)
static void fs_bad(fs_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
static int fs_printed;        /* problems printed in this sweep: the first ten say enough */
static void fs_bad(fs_run *r, const char *fmt, ...) {
  va_list ap;
  r->bad++;
  if (fs_printed++ >= 10) return;
  printf("  %s, %s memory, fail_at %ld (%s): ", fs_kind_names[r->kind], r->device ? "device" : "host", r->f.fail_at,
         r->f.injected ? fb_names[r->f.slot] : "no injection");
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
}

/* The state as muon_state_save writes it, taken without counting. */
static size_t fs_state(fs_run *r, unsigned char *buf) {
  size_t n;
  r->f.paused++;
  n = muon_state_size(r->opt);
  if (n > BLOB || muon_state_save(r->opt, buf, n) != MUON_OK) { fs_bad(r, "muon_state_save for a snapshot: %s", muon_error(r->opt)); n = 0; }
  r->f.paused--;
  return n;
}

/* What muon_error says after the failures, over all sweeps (the abandoning runs repeat them):
   the wrappers promise "a message that names the operation and the backend's own text", and a
   failure that may have left work half done must not also say that nothing was applied. */
static struct { int backend, lost, partly, contradict; char lost_eg[600], contradict_eg[600]; } fs_msgs;

static void fs_message(fs_run *r, fs_op op, const char *msg, muon_status want) {
  if (r->abandon) return;
  if (want == MUON_ERR_BACKEND) {
    fs_msgs.backend++;
    if (!strstr(msg, r->f.text) && fs_msgs.lost++ == 0)
      snprintf(fs_msgs.lost_eg, sizeof fs_msgs.lost_eg, "%s, %s memory, fail_at %ld, %s: '%s'", fs_kind_names[r->kind],
               r->device ? "device" : "host", r->f.fail_at, fs_op_api[op], msg);
  }
  if (strstr(msg, "partly")) {
    fs_msgs.partly++;
    if (strstr(msg, "nothing was applied") && fs_msgs.contradict++ == 0)
      snprintf(fs_msgs.contradict_eg, sizeof fs_msgs.contradict_eg, "%s, %s memory, fail_at %ld, %s: '%s'", fs_kind_names[r->kind],
               r->device ? "device" : "host", r->f.fail_at, fs_op_api[op], msg);
  }
}

/* One call of the script. Without an injected failure it must succeed. With one: the injected
   status, a message naming the status and the call (or the planning it ran), the native text
   at the logger; nothing changed unless muon.h says so; then the retry succeeds. */
static void fs_call(fs_run *r, fs_op op, int arg) {
  int before = r->f.injected, nm = muon_matrix_count(r->opt), na = muon_adamw_param_count(r->opt);
  size_t sn = 0;
  muon_status st, want;
  const char *msg;
  if (r->stop) return;
  if (!r->abandon && !r->f.injected && !r->f.paused) {   /* this call may be the one that fails */
    sn = fs_state(r, SNAP_STATE);
    memcpy(&SNAP_P, &r->m->p, sizeof SNAP_P);
  }
  if (op == OP_DUMP) remove(FS_DUMP);
  r->log_native = 0;
  st = fs_do(r, op, arg);
  if (r->f.injected == before) {
    if (st != MUON_OK) fs_bad(r, "%s failed without an injected failure: %s", fs_op_api[op], muon_error(r->opt));
    return;
  }
  r->sites_by_slot[r->f.slot]++;
  want = r->f.slot == FB_ALLOC ? MUON_ERR_NOMEM : MUON_ERR_BACKEND;
  msg = muon_error(r->opt);
  if (st != want) fs_bad(r, "%s returned %s, want %s (%s)", fs_op_api[op], muon_status_string(st), muon_status_string(want), msg);
  if (strncmp(msg, muon_status_string(want), strlen(muon_status_string(want))) != 0 ||
      (!strstr(msg, fs_op_api[op]) && !(fs_op_plans[op] && strstr(msg, "muon_plan"))))
    fs_bad(r, "%s: the message does not name %s and the call: '%s'", fs_op_api[op], muon_status_string(want), msg);
  if (want == MUON_ERR_BACKEND && !r->log_native) fs_bad(r, "%s: the logger never heard '%s'", fs_op_api[op], r->f.text);
  fs_message(r, op, msg, want);
  if (r->abandon) { r->stop = 1; return; }
  if (strstr(msg, "partly applied")) {
    r->partial = 1;
  } else if (memcmp(&SNAP_P, &r->m->p, sizeof SNAP_P) != 0) {   /* a load never touches them */
    fs_bad(r, "a failed %s changed parameters or mirrors (%s)", fs_op_api[op], msg);
  } else if (strstr(msg, "partly loaded")) {
    r->loaded = 1;
  } else {
    size_t n = fs_state(r, NOW_STATE);
    if (n != sn || memcmp(SNAP_STATE, NOW_STATE, n) != 0) fs_bad(r, "a failed %s changed the state (%s)", fs_op_api[op], msg);
    if (muon_matrix_count(r->opt) != nm || muon_adamw_param_count(r->opt) != na) fs_bad(r, "a failed %s registered something", fs_op_api[op]);
    if (op == OP_DUMP && (fs_file_exists(FS_DUMP) || fs_dump_tmp_exists()))
      fs_bad(r, "a failed muon_dump_file left a file");
  }
  if ((st = fs_do(r, op, arg)) != MUON_OK) fs_bad(r, "%s retried after the failure: %s", fs_op_api[op], muon_error(r->opt));
}

static void fs_register(fs_run *r) {
  fs_call(r, OP_ADD_W, 0); fs_call(r, OP_ADD_H, 0); fs_call(r, OP_ADD_S, 0);
  fs_call(r, OP_ADD_B, 0); fs_call(r, OP_ADD_E, 0);
}
static void fs_step(fs_run *r, int step) {
  if (r->stop) return;
  fm_grads_for(r->m, step);   /* the trainer's backward pass, on its device */
  fs_call(r, OP_STEP, 0);
}

/* A new optimizer on the run's model, registration included (counted unless paused). */
static int fs_create(fs_run *r) {
  muon_hparams hp = muon_default_hparams();
  hp.normuon = MUON_NORMUON_LARGER;   /* group 1: h and s, their momentum 8-bit (the blockwise slot) */
  hp.momentum_format = MUON_MOMENTUM_INT8;
  if (muon_create(&r->opt, &r->desc) != MUON_OK || muon_add_group(r->opt, &hp, NULL) != MUON_OK) {
    fs_bad(r, "create: %s", muon_error(r->opt));
    return 0;
  }
  fs_register(r);
  return 1;
}

/* Returns whether a failure was injected. */
static int fs_run_one(fs_kind kind, int device, long fail_at, int abandon, fs_result *res) {
  fs_run *r = &R;
  int i;
  memset(r, 0, sizeof *r);
  r->kind = kind; r->device = device; r->abandon = abandon; r->res = res;
  r->comp = fb_init(&r->f, device);
  r->f.paused = 1;
  r->m = (fm_model *)fb_alloc(&r->f, sizeof *r->m);   /* the trainer's buffers: backend memory */
  if (!r->m) { fs_bad(r, "no memory for the model"); return 0; }
  fm_init(r->m);
  r->desc = muon_default_desc();
  r->desc.compute = &r->comp;
  r->desc.allocator.alloc = hc_alloc; r->desc.allocator.free = hc_free; r->desc.allocator.user_data = r;
  r->desc.logger.func = fs_log; r->desc.logger.user_data = r;
  r->cfg = muon_layout_config();
  if (kind == FS_CUSTOM) { r->cfg.gather = fs_gather; r->cfg.redistribute = fs_redistribute; r->cfg.state = r; }
  if (kind != FS_ONE) r->desc.dist = &r->cfg;   /* desc.comm NULL: muon_comm_self */
  if (kind != FS_STATE) {
    r->f.paused = 0;
    r->f.fail_at = fail_at;
    if (fs_create(r)) { fs_step(r, 0); fs_step(r, 1); }
  } else if (fs_create(r)) {   /* paused: b's optimizer after two steps, the state after one kept */
    fs_step(r, 0);
    r->blob_a_n = fs_state(r, r->blob_a);
    fs_step(r, 1);
    if (r->bad) printf("  (the state scenario's setup failed)\n");
    r->f.paused = 0;
    r->f.fail_at = fail_at;
    fs_call(r, OP_SAVE, 0);
    fs_call(r, OP_LOAD, 0);
    fs_call(r, OP_RESHARD, 0);
    for (i = 0; i < NMAT; i++) fs_call(r, OP_GATHER, i);
    fs_call(r, OP_DUMP, 0);
    fs_call(r, OP_CHECK, 0);
    r->f.paused = 1;
    fs_step(r, 2);   /* the optimizer still steps */
    if (!r->stop) {  /* a new optimizer resumes from the state saved above: v needs room there */
      muon_destroy(r->opt);
      r->opt = NULL;
      if (fs_create(r)) {
        r->f.paused = 0;
        fs_call(r, OP_RESUME, 0);
        r->f.paused = 1;
        fs_step(r, 3);
      }
    }
  }
  if (r->opt && !r->stop) {
    r->f.paused++;
    memcpy(&res->p, &r->m->p, sizeof res->p);
    res->state_n = fs_state(r, res->state);
    r->f.paused--;
  }
  if (kind == FS_CUSTOM && !abandon && r->cb_calls == 0) fs_bad(r, "the custom exchange was never called");
  if (r->cb_unsynced) fs_bad(r, "%d custom exchange calls came without a sync before them (device memory)", r->cb_unsynced);
  muon_destroy(r->opt);
  if (r->f.live != 1) fs_bad(r, "after muon_destroy %ld backend blocks are left (want 1, the model)", r->f.live - 1);
  if (r->host_live != 0) fs_bad(r, "after muon_destroy %ld host blocks are left", r->host_live);
  fb_free(&r->f, r->m);
  return r->f.injected > 0;
}

typedef struct fs_tally { int sites, partial, loaded, bad, ends_differ, by_slot[FB_SLOTS]; } fs_tally;

static void fs_sweep(fs_kind kind, int device, fs_tally *all) {
  fs_tally t;
  fs_result *ref = &REF[kind][device];
  long k;
  int s;
  char slots[300];
  size_t used = 0;
  memset(&t, 0, sizeof t);
  fs_printed = 0;
  fs_run_one(kind, device, -1, 0, ref);   /* the run without failures */
  t.bad += R.bad;
  for (k = 0; k < 2000; k++) {
    memset(&RES, 0, sizeof RES);
    if (!fs_run_one(kind, device, k, 0, &RES)) { t.bad += R.bad; break; }   /* past the last call */
    t.sites++;
    t.bad += R.bad;
    for (s = 0; s < FB_SLOTS; s++) t.by_slot[s] += R.sites_by_slot[s];
    t.loaded += R.loaded;
    if (R.partial) t.partial++;
    else {
      int differ = memcmp(&RES.p, &ref->p, sizeof RES.p) != 0 || RES.state_n != ref->state_n ||
                   !test_same_state(RES.state, ref->state, RES.state_n);
      if (kind == FS_STATE)
        differ |= RES.saved_n != ref->saved_n || !test_same_state(RES.saved, ref->saved, RES.saved_n) ||
                  memcmp(RES.gp, ref->gp, sizeof RES.gp) != 0 || memcmp(RES.gm, ref->gm, sizeof RES.gm) != 0 ||
                  RES.dump_n != ref->dump_n || memcmp(RES.dump, ref->dump, RES.dump_n) != 0;
      if (differ && t.ends_differ++ < 4)
        printf("  %s, %s memory, fail_at %ld (%s): the run ended elsewhere than the clean run\n", fs_kind_names[kind],
               device ? "device" : "host", k, fb_names[R.f.slot]);
    }
    fs_run_one(kind, device, k, 1, &RES);   /* the same failure, then muon_destroy at once */
    t.bad += R.bad;
  }
  slots[0] = '\0';
  for (s = 0; s < FB_SLOTS; s++)
    if (t.by_slot[s] && used < sizeof slots) used += (size_t)snprintf(slots + used, sizeof slots - used, "%s%s %d", used ? ", " : "", fb_names[s], t.by_slot[s]);
  printf("  %s, %s memory: %d sites (%s)", fs_kind_names[kind], device ? "device" : "host", t.sites, slots);
  if (t.partial) printf("; %d inside the commit", t.partial);
  if (t.loaded) printf("; %d partly loaded", t.loaded);
  printf("\n");
  all->sites += t.sites; all->partial += t.partial; all->loaded += t.loaded;
  all->bad += t.bad; all->ends_differ += t.ends_differ;
  for (s = 0; s < FB_SLOTS; s++) all->by_slot[s] += t.by_slot[s];
  CHECK(t.bad == 0, "%s, %s memory: %d problems (the first listed above)", fs_kind_names[kind], device ? "device" : "host", t.bad);
  CHECK(t.ends_differ == 0, "%s, %s memory: %d runs with a retried failure ended elsewhere than the clean run", fs_kind_names[kind],
        device ? "device" : "host", t.ends_differ);
  CHECK(t.sites >= (kind == FS_STATE ? (device ? 20 : 5) : 40), "%s, %s memory: only %d failure sites", fs_kind_names[kind],
        device ? "device" : "host", t.sites);
}

static void test_step_faults(fs_kind kind) {
  static char name[160];
  fs_tally all;
  memset(&all, 0, sizeof all);
  snprintf(name, sizeof name, "compute backend failing at every call: %s, host and device memory", fs_kind_names[kind]);
  TEST_CASE(name);
  fs_sweep(kind, 0, &all);
  fs_sweep(kind, 1, &all);
  if (kind != FS_STATE) {
    /* every slot a step calls on one rank, and alloc, was failed somewhere (cast moves bf16
       exchanges, which one rank never has) */
    int s;
    for (s = 0; s < FB_SLOTS; s++)
      if (s != FB_CAST) CHECK(all.by_slot[s] > 0, "%s: no failure was injected into %s", fs_kind_names[kind], fb_names[s]);
  }
}

/* The clean runs: one model, whichever path, ends at the same bits. */
static void test_same_ends(void) {
  int k, dev;
  TEST_CASE("without failures every scenario and both memories end at the same parameters and state");
  for (k = 0; k < 3; k++)
    for (dev = 0; dev < 2; dev++) {
      const fs_result *a = &REF[FS_ONE][0], *b = &REF[k][dev];
      CHECK(memcmp(&a->p, &b->p, sizeof a->p) == 0, "%s, %s memory: parameters differ from one device's", fs_kind_names[k], dev ? "device" : "host");
      CHECK(a->state_n == b->state_n && test_same_state(a->state, b->state, a->state_n), "%s, %s memory: state differs from one device's",
            fs_kind_names[k], dev ? "device" : "host");
    }
  for (dev = 0; dev < 2; dev++) {
    const fs_result *a = &REF[FS_STATE][0], *b = &REF[FS_STATE][dev];
    CHECK(b->dump_n > 24 && b->saved_n > 0, "state scenario, %s memory: no dump or no saved state", dev ? "device" : "host");
    CHECK(memcmp(&a->p, &b->p, sizeof a->p) == 0 && a->state_n == b->state_n && test_same_state(a->state, b->state, a->state_n) &&
          a->dump_n == b->dump_n && memcmp(a->dump, b->dump, a->dump_n) == 0 && memcmp(a->gp, b->gp, sizeof a->gp) == 0 &&
          memcmp(a->gm, b->gm, sizeof a->gm) == 0 && a->saved_n == b->saved_n && test_same_state(a->saved, b->saved, a->saved_n),
          "state scenario: device memory ends elsewhere than host memory");
  }
}

static void test_messages(void) {
  TEST_CASE("muon_error after a backend failure carries the backend's own text");
  CHECK(fs_msgs.backend > 0, "no backend failure was injected");
  CHECK(fs_msgs.lost == 0, "%d of %d messages lost it, e.g. %s", fs_msgs.lost, fs_msgs.backend, fs_msgs.lost_eg);
  TEST_CASE("a failure that may have left work half done does not also say that nothing was applied");
  CHECK(fs_msgs.partly > 0, "no failure inside a commit or a load was injected");
  CHECK(fs_msgs.contradict == 0, "%d of %d such messages say both, e.g. %s", fs_msgs.contradict, fs_msgs.partly, fs_msgs.contradict_eg);
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : "build/faults";   /* scratch directory, created if missing */
  (void)mkdir(dir, 0777);
  snprintf(FS_DUMP, sizeof FS_DUMP, "%s/test_faults.dump", dir);
  fs_dir = dir;
  test_step_faults(FS_ONE);
  test_step_faults(FS_DIST);
  test_step_faults(FS_CUSTOM);
  test_step_faults(FS_STATE);
  test_same_ends();
  test_messages();
  remove(FS_DUMP);
  return test_summary();
}
