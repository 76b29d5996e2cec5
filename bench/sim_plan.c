/* sim_plan.c - muon's real planner on virtual ranks in one process, up to 16,384 of them.

   Each virtual rank is a real muon_optimizer (muon_create, muon_add_matrix through
   muon_auto_config, muon_plan, one muon_step) over two stand-ins of this file's:
   - a null device (a compute backend whose memory is never touched: alloc hands out addresses
     that nothing reads), so no data exists and nothing is computed;
   - a counting communicator for virtual rank r of W: alltoallv moves nothing and counts the
     bytes per peer; allgather hands back what the other W - 1 ranks would send. Planning's
     matrix lists are every virtual rank's own (each registers its matrices in a shadow optimizer
     and muon__put_list writes the list planning sends), its counts too; every other
     control record (agreement, verdicts, plan fingerprints, the vote) is this rank's own,
     repeated: what agreeing ranks send.
   Planning runs on a few ranks (rank 0, the busiest owner, a median one), timed, with host
   memory counted through muon_desc.allocator (peak bytes). Per-rank bytes and Newton-Schulz
   flops come from the plan (every rank computes the same one) and are checked against the
   communicator's count on the ranks simulated.

   Usage: sim_plan [--max-ranks W] [--min-ranks W] [--models a,b] [--meshes fsdp,hsdp,ep] [-v]
          sim_plan --text MODEL MESH W RANK   (that rank's muon_plan_text)
          muonrun -n W sim_plan --real MODEL MESH TP   (rank r over Gloo against virtual rank r)
   --check: small worlds (8 to 64 ranks), exits non-zero unless the counted bytes equal the
   plan's and the formula's (make test). --real (make test, tiny models at 4 and 8 ranks): a
   real run over Gloo plans the same bytes of plan text and moves the bytes counted here. */
#define _POSIX_C_SOURCE 200809L
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "muon_gloo.h"
#include "bench.h"

#include <stdint.h>
#include <string.h>

/* ---- host memory, counted through muon_desc.allocator ------------------------------------- */
typedef struct mem_count { size_t cur, peak; } mem_count;
static void *count_alloc(size_t n, void *u) {
  mem_count *m = (mem_count *)u;
  size_t *p = (size_t *)malloc(n + 16);
  if (!p) return NULL;
  p[0] = n;
  m->cur += n;
  if (m->cur > m->peak) m->peak = m->cur;
  return (char *)p + 16;
}
static void count_free(void *ptr, void *u) {
  mem_count *m = (mem_count *)u;
  size_t *p;
  if (!ptr) return;
  p = (size_t *)(void *)((char *)ptr - 16);
  m->cur -= p[0];
  free(p);
}

/* ---- the null device ---------------------------------------------------------------------- */
typedef struct null_dev { uintptr_t next; size_t bytes; } null_dev;
static void *nd_alloc(void *ctx, size_t bytes) {
  null_dev *d = (null_dev *)ctx;
  void *p = (void *)d->next;
  d->next += (bytes + 255) & ~(uintptr_t)255;
  d->bytes += bytes;
  return p;
}
static void nd_free(void *ctx, void *ptr) { (void)ctx; (void)ptr; }
/* A copy to the host gives zeros: no flag set, nothing non-finite. */
static muon_status nd_copy(void *ctx, void *dst, const void *src, size_t bytes, int to_host, int from_host) {
  (void)ctx; (void)src; (void)from_host;
  if (to_host) memset(dst, 0, bytes);
  return MUON_OK;
}
static muon_status nd_zero(void *ctx, void *dst, size_t bytes) { (void)ctx; (void)dst; (void)bytes; return MUON_OK; }
static muon_status nd_pack(void *ctx, const muon_piece_copy *ops, int n, float *pieces, float *operands, int to) {
  (void)ctx; (void)ops; (void)n; (void)pieces; (void)operands; (void)to;
  return MUON_OK;
}
static muon_status nd_momentum(void *ctx, size_t n, float *mom, const void *grad, const muon_momentum_args *a,
                               int update, float *u) {
  (void)ctx; (void)n; (void)mom; (void)grad; (void)a; (void)update; (void)u;
  return MUON_OK;
}
static size_t nd_ns_workspace(void *ctx, int batch, int m, int n, const muon_hparams *hp) {
  (void)ctx; (void)hp;
  return (size_t)batch * muon__ns_ws_floats(m, n, 0) * sizeof(float);
}
static muon_status nd_ns(void *ctx, float *X, int batch, int m, int n, const muon_hparams *hp, void *ws) {
  (void)ctx; (void)X; (void)batch; (void)m; (void)n; (void)hp; (void)ws;
  return MUON_OK;
}
static muon_status nd_apply(void *ctx, size_t n, void *param, const float *O, const muon_apply_args *a) {
  (void)ctx; (void)n; (void)param; (void)O; (void)a;
  return MUON_OK;
}
static muon_status nd_adamw(void *ctx, size_t n, void *param, const void *grad, float *m, float *v,
                            const muon_adamw_args *a) {
  (void)ctx; (void)n; (void)param; (void)grad; (void)m; (void)v; (void)a;
  return MUON_OK;
}
static muon_status nd_nonfinite(void *ctx, const void *x, muon_dtype t, size_t n, int *flag) {
  (void)ctx; (void)x; (void)t; (void)n; (void)flag;
  return MUON_OK;
}
static muon_status nd_cast(void *ctx, void *dst, muon_dtype dt, const void *src, muon_dtype st, size_t n) {
  (void)ctx; (void)dst; (void)dt; (void)src; (void)st; (void)n;
  return MUON_OK;
}
static muon_status nd_sync(void *ctx) { (void)ctx; return MUON_OK; }
static muon_status nd_normuon(void *ctx, float *X, int m, int n, int per_column, const float *v, float *v_new,
                              const muon_hparams *hp) {
  (void)ctx; (void)X; (void)m; (void)n; (void)per_column; (void)v; (void)v_new; (void)hp;
  return MUON_OK;
}
static const muon_compute_vtable null_device_vt = {
  /* .version            = */ MUON_COMPUTE_VTABLE_VERSION,
  /* .memory             = */ MUON_MEMORY_DEVICE,
  /* .alloc              = */ nd_alloc,
  /* .free               = */ nd_free,
  /* .alloc_host         = */ NULL,
  /* .free_host          = */ NULL,
  /* .copy               = */ nd_copy,
  /* .zero               = */ nd_zero,
  /* .pack               = */ nd_pack,
  /* .momentum           = */ nd_momentum,
  /* .ns_workspace       = */ nd_ns_workspace,
  /* .newton_schulz      = */ nd_ns,
  /* .apply              = */ nd_apply,
  /* .adamw              = */ nd_adamw,
  /* .nonfinite          = */ nd_nonfinite,
  /* .cast               = */ nd_cast,
  /* .sync               = */ nd_sync,
  /* .error              = */ NULL,
  /* .destroy            = */ NULL,
  /* .normuon            = */ nd_normuon,
  /* .newton_schulz_many = */ NULL,
  /* .scale              = */ NULL,
  /* .blockwise          = */ NULL
};

/* ---- the counting communicator ------------------------------------------------------------- */
typedef struct sim_comm {
  int rank, size;
  const unsigned char *lists;   /* every rank's matrix list as planning sends it: size x list_bytes */
  size_t list_bytes;
  const long long *counts;      /* per rank: planning's round 1 (MUON__COUNTS numbers) */
  int seq;                      /* allgathers since the last agreement record */
  long long a2a_calls, a2a_sent, a2a_recv, ag_calls, ag_recv;
  char error[200];
} sim_comm;

static muon_status sc_alltoallv(void *ctx, const float *send, const size_t *sc, const size_t *sd, float *recv,
                                const size_t *rc, const size_t *rd, int *ticket) {
  sim_comm *c = (sim_comm *)ctx;
  int p;
  (void)send; (void)sd; (void)recv; (void)rd; (void)ticket;
  c->a2a_calls++;
  for (p = 0; p < c->size; p++)
    if (p != c->rank) { c->a2a_sent += (long long)(sc[p] * 4); c->a2a_recv += (long long)(rc[p] * 4); }
  return MUON_OK;
}

/* Planning's collectives, in muon__plan_collective's order after the agreement record: the
   counts (1), the allocation verdicts (2), the matrix lists (3), the plan fingerprints. */
static muon_status sc_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  sim_comm *c = (sim_comm *)ctx;
  int p;
  c->ag_calls++;
  c->ag_recv += (long long)(bytes * (size_t)(c->size - 1));
  if (bytes == MUON__RECORD_BYTES) c->seq = 0;
  else c->seq++;
  if (c->seq == 1 && bytes == MUON__COUNTS * sizeof(long long) && c->counts) {
    if (memcmp(send, c->counts + MUON__COUNTS * c->rank, bytes)) {
      snprintf(c->error, sizeof c->error, "sim: rank %d's counts differ from its shadow's", c->rank);
      return MUON_ERR_COMM;
    }
    memcpy(recv, c->counts, bytes * (size_t)c->size);
    return MUON_OK;
  }
  if (c->seq == 3 && c->lists) {
    if (bytes != c->list_bytes || memcmp(send, c->lists + (size_t)c->rank * bytes, bytes)) {
      snprintf(c->error, sizeof c->error,
               "sim: rank %d's matrix list (%zu B) differs from its shadow's (%zu B): out of step with muon.h", c->rank,
               bytes, c->list_bytes);
      return MUON_ERR_COMM;
    }
    memcpy(recv, c->lists, bytes * (size_t)c->size);
    return MUON_OK;
  }
  for (p = 0; p < c->size; p++) memcpy((char *)recv + (size_t)p * bytes, send, bytes);
  return MUON_OK;
}
static const char *sc_error(void *ctx) { return ((sim_comm *)ctx)->error; }
static const muon_comm_vtable sim_comm_vt = {
    MUON_COMM_VTABLE_VERSION,
    /* .alltoallv = */ sc_alltoallv,
    /* .join      = */ NULL,
    /* .finish    = */ NULL,
    /* .allgather = */ sc_allgather,
    /* .error     = */ sc_error,
    /* .destroy   = */ NULL,
    /* .memory    = */ MUON_MEMORY_DEVICE,
    /* .queued    = */ 0};

/* ---- models: the hidden 2-D weights (torch's [out, in]); embeddings, head, norms and the
   MoE router are AdamW's and left out --------------------------------------------------------- */
typedef struct model {
  const char *name;
  int layers, d, q, kv, ffn, pp;   /* q, kv: attention projections' out features; pp: stages */
  int dense_layers, experts, expert_ffn, shared_ffn, mla;   /* MoE (DeepSeek-V3-like); mla: MLA's heads */
} model;

static const model MODELS[] = {
    {"gpt2-1.5b", 48, 1600, 1600, 1600, 6400, 1, 0, 0, 0, 0, 0},
    {"llama3-8b", 32, 4096, 4096, 1024, 14336, 1, 0, 0, 0, 0, 0},
    {"llama3-70b", 80, 8192, 8192, 1024, 28672, 4, 0, 0, 0, 0, 0},
    {"llama3-405b", 126, 16384, 16384, 1024, 53248, 16, 0, 0, 0, 0, 0},
    {"dsv3-moe", 61, 7168, 0, 0, 18432, 16, 3, 256, 2048, 2048, 128},
    /* --check only: small enough for every world size to divide it evenly */
    {"tiny", 4, 256, 256, 256, 1024, 2, 0, 0, 0, 0, 0},
    {"tiny-moe", 2, 128, 0, 0, 512, 1, 1, 16, 64, 64, 2},
};
#define N_MODELS ((int)(sizeof MODELS / sizeof MODELS[0]))

typedef struct mat { char name[48]; int rows, cols, tp_dim, expert; } mat;

/* The matrices of one layer that this EP index holds (ep_size 1: all); returns how many. */
static int layer_mats(const model *m, int l, int ep_index, int ep_size, mat *out) {
  int n = 0, e, j;
#define ADD(nm, r, c, t, x) do { snprintf(out[n].name, sizeof out[n].name, "l%d.%s", l, nm); out[n].rows = (r); \
    out[n].cols = (c); out[n].tp_dim = (t); out[n].expert = (x); n++; } while (0)
  if (m->mla) {   /* MLA as its five projections (q_a, q_b, kv_a with the rope key, kv_b, o) */
    ADD("q_a", 1536, m->d, -1, -1);
    ADD("q_b", m->mla * 192, 1536, 0, -1);
    ADD("kv_a", 512 + 64, m->d, -1, -1);
    ADD("kv_b", m->mla * 256, 512, 0, -1);
    ADD("o", m->d, m->mla * 128, 1, -1);
  } else if (m->q == m->kv) {   /* GPT-2: fused qkv */
    ADD("qkv", 3 * m->d, m->d, 0, -1);
    ADD("o", m->d, m->d, 1, -1);
  } else {
    ADD("q", m->q, m->d, 0, -1);
    ADD("k", m->kv, m->d, 0, -1);
    ADD("v", m->kv, m->d, 0, -1);
    ADD("o", m->d, m->q, 1, -1);
  }
  if (!m->experts || l < m->dense_layers) {
    if (m->q != m->kv || m->mla) ADD("gate", m->ffn, m->d, 0, -1);
    ADD("up", m->ffn, m->d, 0, -1);
    ADD("down", m->d, m->ffn, 1, -1);
  } else {
    int per = m->experts / ep_size;
    ADD("shared.gate", m->shared_ffn, m->d, 0, -1);
    ADD("shared.up", m->shared_ffn, m->d, 0, -1);
    ADD("shared.down", m->d, m->shared_ffn, 1, -1);
    for (j = 0; j < per; j++) {
      char nm[32];
      e = ep_index * per + j;
      snprintf(nm, sizeof nm, "e%d.gate", e); ADD(nm, m->expert_ffn, m->d, 0, e);
      snprintf(nm, sizeof nm, "e%d.up", e); ADD(nm, m->expert_ffn, m->d, 0, e);
      snprintf(nm, sizeof nm, "e%d.down", e); ADD(nm, m->d, m->expert_ffn, 1, e);
    }
  }
#undef ADD
  return n;
}

/* ---- meshes: TP 8 (a node) x FSDP / HSDP / EP x PP, rank = tp + 8 (dp + D pp) --------------- */
enum { MESH_FSDP, MESH_HSDP, MESH_EP };
static const char *MESH_NAMES[] = {"fsdp", "hsdp", "ep"};
#define NODE 8      /* GPUs per node: the table's TP, and where the slower links start */
#define HSDP_SHARD 16   /* HSDP: FSDP over 16 x 8 = 128 GPUs, replicated across those groups */

typedef struct config {
  const model *m;
  int mesh, W, tp, pp, D;   /* tp: NODE, but for --real's small worlds */
} config;

/* One virtual rank's groups, auto desc and matrices (registered into opt). */
typedef struct vrank {
  muon_comm tp, dp, shard, repl, pp;
  muon_auto_desc ad;
  int n, *tp_dim, *expert;
  mat *mats;
} vrank;

static int stage_layers(const config *c, int stage, int *first) {
  int L = c->m->layers, base = L / c->pp, extra = L % c->pp;
  *first = stage * base + (stage < extra ? stage : extra);
  return base + (stage < extra);
}

static void vrank_init(vrank *v, const config *c, int r, const muon_comm *world) {
  int tp = r % c->tp, dp = (r / c->tp) % c->D, st = r / (c->tp * c->D), first, nl, l, cap, ep_size, ep_index;
  mat tmp[2048];
  memset(v, 0, sizeof *v);
  v->tp = *world; v->tp.rank = tp; v->tp.size = c->tp;
  v->dp = *world; v->dp.rank = dp; v->dp.size = c->D;
  v->pp = *world; v->pp.rank = st; v->pp.size = c->pp;
  v->ad.tp = &v->tp;
  v->ad.pp = &v->pp;
  if (c->mesh == MESH_FSDP) v->ad.fsdp = &v->dp;
  else if (c->mesh == MESH_HSDP) {
    int s = c->D < HSDP_SHARD ? c->D : HSDP_SHARD;
    v->shard = *world; v->shard.rank = dp % s; v->shard.size = s;
    v->repl = *world; v->repl.rank = dp / s; v->repl.size = c->D / s;
    v->ad.shard = &v->shard;
    v->ad.replicate = &v->repl;
  } else v->ad.ep = &v->dp;
  ep_size = c->mesh == MESH_EP ? c->D : 1;
  ep_index = c->mesh == MESH_EP ? dp : 0;
  nl = stage_layers(c, st, &first);
  cap = 0;
  for (l = first; l < first + nl; l++) cap += layer_mats(c->m, l, ep_index, ep_size, tmp);
  v->mats = (mat *)malloc((size_t)cap * sizeof *v->mats + 1);
  v->tp_dim = (int *)malloc((size_t)cap * sizeof(int) + 1);
  v->expert = (int *)malloc((size_t)cap * sizeof(int) + 1);
  for (l = first; l < first + nl; l++) {
    int k, n = layer_mats(c->m, l, ep_index, ep_size, tmp);
    for (k = 0; k < n; k++) {
      v->mats[v->n] = tmp[k];
      v->tp_dim[v->n] = tmp[k].tp_dim;
      v->expert[v->n] = tmp[k].expert;
      v->n++;
    }
  }
  v->ad.tp_dim_per_matrix = v->tp_dim;
  v->ad.expert_of_matrix = c->mesh == MESH_EP ? v->expert : NULL;
}
static void vrank_free(vrank *v) { free(v->mats); free(v->tp_dim); free(v->expert); }

/* A virtual rank's optimizer with its matrices registered; NULL on failure (said on stderr). */
typedef struct sim_rank {
  sim_comm comm;
  muon_comm world;
  null_dev dev;
  muon_compute compute;
  mem_count mem;
  muon_dist_config dist;
  vrank v;
  muon_optimizer *opt;
} sim_rank;

/* Registers a rank's matrices; with data NULL at an address the null device never reads, else
   data[i] gets each one's parameter and gradient (2 x rows x cols floats, more than its piece). */
static int add_matrices(muon_optimizer *opt, const vrank *v, float **data, int r) {
  int i;
  for (i = 0; i < v->n; i++) {
    muon_matrix mm = muon_default_matrix();
    size_t n = (size_t)v->mats[i].rows * (size_t)v->mats[i].cols, k;
    mm.name = v->mats[i].name;
    mm.rows = v->mats[i].rows;
    mm.cols = v->mats[i].cols;
    mm.param = (void *)(uintptr_t)4096;
    mm.grad = mm.param;
    if (data) {
      if (!(data[i] = (float *)malloc(2 * n * sizeof(float)))) return -1;
      for (k = 0; k < 2 * n; k++) data[i][k] = (float)((k * 2654435761u + (unsigned)(r * 97 + i)) % 1000) / 1000.0f - 0.5f;
      mm.param = data[i];
      mm.grad = data[i] + n;
    }
    if (muon_add_matrix(opt, &mm, NULL) != MUON_OK) {
      fprintf(stderr, "sim: rank %d: %s\n", r, muon_error(opt));
      return -1;
    }
  }
  return 0;
}

static muon_optimizer *sim_open(sim_rank *s, const config *c, int r) {
  muon_desc desc = muon_default_desc();
  memset(s, 0, sizeof *s);
  s->comm.rank = r;
  s->comm.size = c->W;
  s->world.vt = &sim_comm_vt;
  s->world.ctx = &s->comm;
  s->world.rank = r;
  s->world.size = c->W;
  s->dev.next = (uintptr_t)1 << 44;
  s->compute.vt = &null_device_vt;
  s->compute.ctx = &s->dev;
  vrank_init(&s->v, c, r, &s->world);
  s->dist = muon_auto_config(&s->v.ad);
  desc.comm = &s->world;
  desc.dist = &s->dist;
  desc.compute = &s->compute;
  desc.allocator.alloc = count_alloc;
  desc.allocator.free = count_free;
  desc.allocator.user_data = &s->mem;
  if (muon_create(&s->opt, &desc) != MUON_OK) {
    fprintf(stderr, "sim: muon_create: %s\n", muon_error(NULL));
    return NULL;
  }
  if (add_matrices(s->opt, &s->v, NULL, r)) {
    muon_destroy(s->opt);
    s->opt = NULL;
  }
  return s->opt;
}
static void sim_close(sim_rank *s) {
  muon_destroy(s->opt);
  vrank_free(&s->v);
}

/* ---- every rank's matrix list, from shadow optimizers ------------------------------------- */
typedef struct world_lists { unsigned char *lists; long long *counts; size_t bytes; } world_lists;

/* Two passes over the shadows: their round-1 numbers (planning's own muon__layout_slots and
   muon__list_digest), then, in the geometry planning derives from them (muon__list_geometry, on
   rank 0's shadow), each rank's list as it sends it (muon__put_list). */
static int make_lists(const config *c, world_lists *w) {
  int r, ok = 1;
  sim_rank *s = (sim_rank *)malloc(2 * sizeof *s), *s0 = s + 1;
  muon__lists g;
  muon__lists_init(&g);
  w->counts = (long long *)calloc((size_t)c->W * MUON__COUNTS, sizeof(long long));
  if (!s || !w->counts) return -1;
  for (r = 0; ok && r < c->W; r++) {
    long long *n = w->counts + (size_t)r * MUON__COUNTS;
    if (!sim_open(s, c, r)) return -1;
    n[0] = s->opt->n_matrices;
    n[1] = muon__layout_slots(s->opt);
    n[4] = (long long)muon__list_digest(s->opt);
    n[5] = (long long)muon__table_bytes(s->opt);
    ok = n[1] >= 0;
    sim_close(s);
  }
  if (!ok || !sim_open(s0, c, 0) || muon__list_geometry(s0->opt, &g, w->counts)) return -1;
  w->bytes = g.stride;
  w->lists = (unsigned char *)malloc(w->bytes * (size_t)c->W + 1);
  for (r = 0; ok && w->lists && r < c->W; r++) {
    if (!sim_open(s, c, r)) return -1;
    ok = muon__layout_slots(s->opt) >= 0;
    muon__put_list(s->opt, w->lists + (size_t)r * w->bytes, &g, r);
    sim_close(s);
  }
  muon__lists_free(s0->opt, &g);
  sim_close(s0);
  free(s);
  return ok && w->lists ? 0 : -1;
}

/* ---- per-rank figures from a plan --------------------------------------------------------- */
typedef struct rank_figs {
  double *flops, *sent, *recv, *sent_x, *recv_x;   /* NS flops; bytes, and of them across nodes */
} rank_figs;

static void plan_figures(const muon_optimizer *opt, int W, rank_figs *f) {
  const muon__plan *pl = &opt->plan;
  double e = pl->wire_bf16 ? 2 : 4, steps = opt->groups[0].ns_steps;
  int g, j;
  for (g = 0; g < pl->n_globals; g++) {
    const muon__global *x = &pl->globals[g];
    int o = x->owner;
    const muon__piece *pieces;
    const muon__holder *H = muon__holders_of(opt, x, &pieces);
    f->flops[o] += steps * muon__ns_cost(x->rows, x->cols);
    for (j = 0; j < x->n_holders; j++) {
      const muon__holder *h = &H[j];
      double n = e * (double)muon__piece_size(&pieces[j]);
      int cross = h->rank / NODE != o / NODE;
      if (h->rank == h->source && h->source != o) {   /* U to the owner */
        f->sent[h->rank] += n; f->recv[o] += n;
        if (cross) { f->sent_x[h->rank] += n; f->recv_x[o] += n; }
      }
      if (h->rank != o) {                              /* O back to every holder */
        f->sent[o] += n; f->recv[h->rank] += n;
        if (cross) { f->sent_x[o] += n; f->recv_x[h->rank] += n; }
      }
    }
  }
  (void)W;
}

/* ---- H100 assumptions ---------------------------------------------------------------------- */
#define FP32_PEAK 67e12    /* H100 SXM fp32 (no tensor cores): muon_cuda.h runs fp32 NS with TF32 off */
#define BF16_PEAK 989e12   /* dense bf16 tensor cores (hparams.precision = BF16) */
#define EFFICIENCY 0.6
#define NVLINK 450e9       /* bytes/s per GPU, one direction, inside a node of 8 */
#define IB 50e9            /* 400 Gb/s per GPU across nodes */

typedef struct result {
  double plan_s, reg_s, peak_mib, kept_mib, lists_mib, flops_max, flops_mean, sent_mean, sent_max, formula, step_fp32,
      step_bf16, comm_s, agree_bytes;
  int n_globals, reps, busiest, median, bad;
} result;

static int cmp_by_flops_ctx_n;
static const double *cmp_by_flops_ctx;
static int cmp_by_flops(const void *a, const void *b) {
  double x = cmp_by_flops_ctx[*(const int *)a], y = cmp_by_flops_ctx[*(const int *)b];
  if (x != y) return x < y ? -1 : 1;
  return *(const int *)a - *(const int *)b;
}

/* Plans virtual rank r (registration and planning timed, memory counted), runs one step,
   checks the counted bytes against the plan's figures; f gets the figures when non-NULL. */
static int simulate_rank(const config *c, const world_lists *w, int r, rank_figs *f, result *res, int verbose) {
  sim_rank *s = (sim_rank *)malloc(sizeof *s);
  double t0 = now_s(), t1, t2, t3 = 0;
  size_t kept;
  muon_stats st;
  int ok = 1;
  if (!s || !sim_open(s, c, r)) return -1;
  s->comm.lists = w->lists;
  s->comm.list_bytes = w->bytes;
  s->comm.counts = w->counts;
  kept = s->mem.cur;
  t1 = now_s();
  if (muon_plan(s->opt) != MUON_OK) {
    fprintf(stderr, "sim: rank %d: muon_plan: %s\n", r, muon_error(s->opt));
    sim_close(s);
    free(s);
    return -1;
  }
  t2 = now_s();
  if (t2 - t1 > res->plan_s) res->plan_s = t2 - t1;
  if (t1 - t0 > res->reg_s) res->reg_s = t1 - t0;
  if ((double)s->mem.peak / 1048576.0 > res->peak_mib) res->peak_mib = (double)s->mem.peak / 1048576.0;
  kept = s->mem.cur - kept;   /* the plan, held until the next one */
  if ((double)kept / 1048576.0 > res->kept_mib) res->kept_mib = (double)kept / 1048576.0;
  res->n_globals = s->opt->plan.n_globals;
  if (f) plan_figures(s->opt, c->W, f);
  {   /* one step: its exchanges and control bytes, counted by the communicator */
    long long ag0 = s->comm.ag_recv;
    s->comm.a2a_sent = s->comm.a2a_recv = 0;
    if (muon_step(s->opt) != MUON_OK) {
      fprintf(stderr, "sim: rank %d: muon_step: %s\n", r, muon_error(s->opt));
      ok = 0;
    }
    res->agree_bytes = (double)(s->comm.ag_recv - ag0);
    muon_get_stats(s->opt, &st);
  }
  if (ok && f && ((double)s->comm.a2a_sent != f->sent[r] || (double)s->comm.a2a_recv != f->recv[r])) {
    fprintf(stderr, "sim: rank %d: counted %lld B sent / %lld B received, the plan says %.0f / %.0f\n", r,
            s->comm.a2a_sent, s->comm.a2a_recv, f->sent[r], f->recv[r]);
    ok = 0;
  }
  if (verbose) {   /* a second step, timed: the host's own work per step (nothing computed or moved) */
    t3 = now_s();
    if (ok && muon_step(s->opt) != MUON_OK) ok = 0;
    t3 = now_s() - t3;
  }
  if (verbose)
    printf("    rank %d: %d matrices, plan %.3f s, peak host %.1f MiB, step %lld B sent, %lld B received in %d "
           "rounds, host time of a step %.4f s\n",
           r, s->opt->n_matrices, t2 - t1, (double)s->mem.peak / 1048576.0, s->comm.a2a_sent, s->comm.a2a_recv,
           st.rounds, t3);
  sim_close(s);
  free(s);
  res->reps++;
  return ok ? 0 : -1;
}

/* Muon parameters of a stage (every rank of a stage holds a piece of each of its matrices). */
static double stage_params(const config *c, int stage) {
  int first, nl = stage_layers(c, stage, &first), l, k, n;
  double s = 0;
  mat tmp[2048];
  for (l = first; l < first + nl; l++) {
    n = layer_mats(c->m, l, 0, 1, tmp);
    for (k = 0; k < n; k++) s += (double)tmp[k].rows * tmp[k].cols;
  }
  return s;
}

static int run_config(const config *c, result *res, int verbose) {
  world_lists w;
  rank_figs f;
  int W = c->W, p, *idx, rc = 0;
  double sum_flops = 0, sum_sent = 0, ns_max = 0, comm_max = 0;
  memset(res, 0, sizeof *res);
  memset(&w, 0, sizeof w);
  if (make_lists(c, &w)) return -1;
  res->lists_mib = (double)w.bytes * W / 1048576.0;
  f.flops = (double *)calloc((size_t)W * 5, sizeof(double));
  if (!f.flops) return -1;
  f.sent = f.flops + W; f.recv = f.sent + W; f.sent_x = f.recv + W; f.recv_x = f.sent_x + W;
  if (simulate_rank(c, &w, 0, &f, res, verbose)) rc = -1;
  /* the busiest owner and a median one, by Newton-Schulz flops */
  idx = (int *)malloc((size_t)W * sizeof(int));
  for (p = 0; p < W; p++) idx[p] = p;
  cmp_by_flops_ctx = f.flops;
  cmp_by_flops_ctx_n = W;
  qsort(idx, (size_t)W, sizeof(int), cmp_by_flops);
  res->busiest = idx[W - 1];
  res->median = idx[W / 2];
  if (rc == 0 && res->busiest != 0 && simulate_rank(c, &w, res->busiest, NULL, res, verbose)) rc = -1;
  if (rc == 0 && res->median != 0 && res->median != res->busiest &&
      simulate_rank(c, &w, res->median, NULL, res, verbose))
    rc = -1;
  for (p = 0; p < W; p++) {
    double in = (f.recv[p] - f.recv_x[p]) / NVLINK + f.recv_x[p] / IB;
    double out = (f.sent[p] - f.sent_x[p]) / NVLINK + f.sent_x[p] / IB;
    double t = in > out ? in : out;
    sum_flops += f.flops[p];
    sum_sent += f.sent[p];
    if (f.sent[p] > res->sent_max) res->sent_max = f.sent[p];
    if (f.flops[p] > ns_max) ns_max = f.flops[p];
    if (t > comm_max) comm_max = t;
  }
  res->flops_max = ns_max;
  res->flops_mean = sum_flops / W;
  res->sent_mean = sum_sent / W;
  {   /* the formula per stage: 2 (P-1)/P^2 S 4 over its P = W / pp ranks, averaged over stages */
    double P = (double)W / c->pp, s = 0;
    int k;
    for (k = 0; k < c->pp; k++) s += 2 * (P - 1) / (P * P) * stage_params(c, k) * 4;
    res->formula = s / c->pp;
  }
  res->comm_s = comm_max;
  res->step_fp32 = ns_max / (FP32_PEAK * EFFICIENCY) + comm_max;
  res->step_bf16 = ns_max / (BF16_PEAK * EFFICIENCY) + comm_max / 2;   /* bf16 on the wire halves it */
  free(idx);
  free(f.flops);
  free(w.lists);
  free(w.counts);
  return rc;
}

static int config_make(config *c, const model *m, int mesh, int W, int tp) {
  c->m = m;
  c->mesh = mesh;
  c->W = W;
  c->tp = tp;
  c->pp = m->pp < W / tp ? m->pp : W / tp;
  if (c->pp < 1 || W % (tp * c->pp)) return -1;
  c->D = W / (tp * c->pp);
  if (mesh == MESH_EP && (!m->experts || m->experts % c->D)) return -1;
  if (mesh != MESH_EP && m->experts) return -1;
  return 0;
}

/* A model and a mesh by name; -1 when either is unknown. */
static int lookup(const char *model_name, const char *mesh_name, const model **m, int *mesh) {
  int mi;
  for (mi = 0; mi < N_MODELS && strcmp(MODELS[mi].name, model_name); mi++) {}
  for (*mesh = 0; *mesh < 3 && strcmp(MESH_NAMES[*mesh], mesh_name); (*mesh)++) {}
  *m = mi < N_MODELS ? &MODELS[mi] : NULL;
  return mi < N_MODELS && *mesh < 3 ? 0 : -1;
}

/* --text MODEL MESH W RANK: that rank's plan as muon_plan_text writes it (to compare builds). */
static int text_mode(const char *model_name, const char *mesh_name, int W, int r) {
  world_lists w;
  config c;
  sim_rank *s = (sim_rank *)malloc(sizeof *s);
  const model *m;
  int mesh, rc = 1;
  char *text;
  size_t n;
  memset(&w, 0, sizeof w);
  if (!s || lookup(model_name, mesh_name, &m, &mesh) || r < 0 || r >= W || config_make(&c, m, mesh, W, NODE) ||
      make_lists(&c, &w) || !sim_open(s, &c, r)) {
    fprintf(stderr, "sim --text: no such configuration\n");
    return 2;
  }
  s->comm.lists = w.lists;
  s->comm.list_bytes = w.bytes;
  s->comm.counts = w.counts;
  if (muon_plan(s->opt) == MUON_OK) {
    n = muon_plan_text(s->opt, NULL, 0);
    text = (char *)malloc(n + 1);
    if (text) {
      muon_plan_text(s->opt, text, n + 1);
      fputs(text, stdout);
      free(text);
      rc = 0;
    }
  } else fprintf(stderr, "sim --text: %s\n", muon_error(s->opt));
  sim_close(s);
  free(s);
  free(w.lists);
  free(w.counts);
  return rc;
}

static int check_mode(void) {
  /* Small worlds: the counted bytes equal the plan's (simulate_rank), and a pure FSDP world
     whose pieces divide evenly moves exactly the formula's bytes on average. */
  static const int worlds[] = {8, 16, 32, 64};
  int i, k, pass = 0, fail = 0;
  for (k = 0; k < 3; k++)
    for (i = 0; i < 4; i++) {
      config c;
      result r;
      int mesh = k == 2 ? MESH_EP : k, ok;
      const model *m = &MODELS[k == 2 ? N_MODELS - 1 : N_MODELS - 2];
      if (config_make(&c, m, mesh, worlds[i], NODE)) continue;
      ok = run_config(&c, &r, 0) == 0;
      if (ok && mesh == MESH_FSDP && (r.sent_mean < r.formula * (1 - 1e-12) || r.sent_mean > r.formula * (1 + 1e-12))) {
        fprintf(stderr, "sim --check: %s %s W=%d: mean %.0f B sent, formula %.0f B\n", m->name, MESH_NAMES[mesh],
                worlds[i], r.sent_mean, r.formula);
        ok = 0;
      }
      printf("sim --check %s %s W=%d: %d ranks planned, %.0f B/rank/step (formula %.0f): %s\n", m->name,
             MESH_NAMES[mesh], worlds[i], r.reps, r.sent_mean, r.formula, ok ? "ok" : "FAILED");
      if (ok) pass++; else fail++;
    }
  printf("%d passed, %d failed\n", pass, fail);
  return fail ? 1 : 0;
}

/* --real MODEL MESH TP, each process one rank of `muonrun -n W`: the simulator against a real run.
   The process registers what virtual rank r registers, over Gloo with the CPU backend and real
   buffers, plans and takes one step; it also simulates rank r as the table does. It fails unless
   the two plan texts are the same bytes and the real step sent and received what was counted. */
static char *plan_text(const muon_optimizer *opt) {
  size_t n = muon_plan_text(opt, NULL, 0);
  char *t = (char *)malloc(n + 1);
  if (t) muon_plan_text(opt, t, n + 1);
  return t;
}

static int real_mode(const char *model_name, const char *mesh_name, int tp) {
  muon_gloo_desc gd = muon_gloo_default_desc();
  muon_desc desc = muon_default_desc();
  muon_comm world;
  muon_dist_config dist;
  muon_optimizer *opt = NULL;
  muon_stats st;
  world_lists w;
  config c;
  vrank v;
  sim_rank *s = (sim_rank *)malloc(sizeof *s);
  float **data = NULL;
  char *sim_text = NULL, *real_text = NULL;
  long long sim_sent = -1, sim_recv = -1;
  const model *m;
  int mesh, r, i, ok = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);   /* a rank stopped by muonrun keeps its lines */
  if (!s || lookup(model_name, mesh_name, &m, &mesh) || tp < 1) { fprintf(stderr, "sim --real: no such model or mesh\n"); return 2; }
  if (muon_gloo_create(&world, &gd) != MUON_OK) { fprintf(stderr, "sim --real: %s\n", muon_error(NULL)); return 2; }
  r = world.rank;
  memset(&w, 0, sizeof w);
  if (config_make(&c, m, mesh, world.size, tp) || make_lists(&c, &w) || !sim_open(s, &c, r)) {
    fprintf(stderr, "sim --real: no such configuration at %d ranks, TP %d\n", world.size, tp);
    return 2;
  }
  /* the simulated rank */
  s->comm.lists = w.lists;
  s->comm.list_bytes = w.bytes;
  s->comm.counts = w.counts;
  if (muon_plan(s->opt) == MUON_OK && (sim_text = plan_text(s->opt)) && muon_step(s->opt) == MUON_OK) {
    sim_sent = s->comm.a2a_sent;
    sim_recv = s->comm.a2a_recv;
  } else fprintf(stderr, "sim --real: rank %d: simulating: %s\n", r, muon_error(s->opt));
  sim_close(s);
  /* the real one */
  vrank_init(&v, &c, r, &world);
  dist = muon_auto_config(&v.ad);
  desc.comm = &world;
  desc.dist = &dist;
  data = (float **)calloc((size_t)v.n + 1, sizeof *data);
  if (data && muon_create(&opt, &desc) == MUON_OK && add_matrices(opt, &v, data, r) == 0 && muon_plan(opt) == MUON_OK &&
      (real_text = plan_text(opt)) && muon_step(opt) == MUON_OK && muon_get_stats(opt, &st) == MUON_OK) {
    int same_text = sim_text && !strcmp(sim_text, real_text);
    ok = same_text && st.bytes_sent == sim_sent && st.bytes_received == sim_recv;
    printf("sim --real %s %s, %d ranks, TP %d: rank %d: plan text %s; step %lld B sent, %lld B received; "
           "simulated %lld / %lld: %s\n", model_name, mesh_name, world.size, tp, r,
           same_text ? "the same bytes" : "DIFFERS", st.bytes_sent, st.bytes_received, sim_sent, sim_recv,
           ok ? "ok" : "FAILED");
  } else fprintf(stderr, "sim --real: rank %d: %s\n", r, muon_error(opt));
  muon_destroy(opt);
  for (i = 0; data && i < v.n; i++) free(data[i]);
  free(data);
  vrank_free(&v);
  free(sim_text);
  free(real_text);
  free(s);
  free(w.lists);
  free(w.counts);
  muon_comm_destroy(&world);
  printf("%d passed, %d failed\n", ok, !ok);
  return ok ? 0 : 1;
}

/* Whether a comma-separated list names (a prefix of) name; NULL lists everything. */
static int listed(const char *list, const char *name) {
  while (list && *list) {
    size_t n = strcspn(list, ",");
    if (n && !strncmp(name, list, n)) return 1;
    list += n + (list[n] == ',');
  }
  return list == NULL;
}

int main(int argc, char **argv) {
  int maxW = 16384, minW = 8, i, W, mi, mesh, verbose = 0, fails = 0;
  const char *models = NULL, *meshes = NULL;
  (void)median;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--check")) return check_mode();
    else if (!strcmp(argv[i], "--real") && i + 3 < argc) return real_mode(argv[i + 1], argv[i + 2], atoi(argv[i + 3]));
    else if (!strcmp(argv[i], "--text") && i + 4 < argc)
      return text_mode(argv[i + 1], argv[i + 2], atoi(argv[i + 3]), atoi(argv[i + 4]));
    else if (!strcmp(argv[i], "--max-ranks") && i + 1 < argc) maxW = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--min-ranks") && i + 1 < argc) minW = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--models") && i + 1 < argc) models = argv[++i];
    else if (!strcmp(argv[i], "--meshes") && i + 1 < argc) meshes = argv[++i];
    else if (!strcmp(argv[i], "-v")) verbose = 1;
    else { fprintf(stderr, "usage: %s [--check] [--max-ranks W] [--min-ranks W] [--models a,b] [--meshes m,n] [-v]\n", argv[0]); return 2; }
  }
  printf("sim_plan: muon's planner on virtual ranks (load average %.2f). Per configuration: planning time and\n"
         "peak host memory (the most of the ranks planned: 0, the busiest owner, a median one), what the\n"
         "plan keeps after, the matrix lists every rank gathers, bytes sent per rank per step (mean, most)\n"
         "vs 2(P-1)/P^2*S*4 per stage, Newton-Schulz GFLOP per step (busiest, mean, ratio), and an H100 step\n"
         "estimate: busiest NS at %.0f%% of 67 TFLOP/s fp32 (TF32 off) or 989 TFLOP/s bf16, plus the heaviest\n"
         "rank's exchange at 450 GB/s NVLink inside a node of 8, 50 GB/s across (bf16: half the bytes); no\n"
         "overlap.\n",
         load_average(), EFFICIENCY * 100);
  printf("%-12s %-5s %6s %4s %5s %7s | %8s %8s %8s %8s | %9s %9s %9s | %9s %8s %7s | %8s %8s\n", "model", "mesh",
         "ranks", "pp", "dp", "globals", "plan s", "peak MiB", "kept MiB", "lists MiB", "B/rk mean", "B/rk max",
         "formula", "NS GF max", "NS mean", "max/mean", "fp32 ms", "bf16 ms");
  for (mi = 0; mi < N_MODELS - 2; mi++) {
    if (!listed(models, MODELS[mi].name)) continue;
    for (mesh = 0; mesh < 3; mesh++) {
      if (!listed(meshes, MESH_NAMES[mesh])) continue;
      for (W = minW; W <= maxW; W *= 2) {
        config c;
        result r;
        if (config_make(&c, &MODELS[mi], mesh, W, NODE)) continue;
        if (run_config(&c, &r, verbose)) { fails++; printf("%-12s %-5s %6d FAILED\n", c.m->name, MESH_NAMES[mesh], W); continue; }
        printf("%-12s %-5s %6d %4d %5d %7d | %8.3f %8.1f %8.1f %8.1f | %9.3g %9.3g %9.3g | %9.1f %8.2f %7.2f | %8.2f %8.2f\n",
               c.m->name, MESH_NAMES[mesh], W, c.pp, c.D, r.n_globals, r.plan_s, r.peak_mib, r.kept_mib, r.lists_mib,
               r.sent_mean,
               r.sent_max, r.formula, r.flops_max / 1e9, r.flops_mean / 1e9, r.flops_max / r.flops_mean,
               r.step_fp32 * 1e3, r.step_bf16 * 1e3);
        if (W == maxW)
          printf("  (at %d ranks: the agreement record and commit vote receive %.0f B per rank per step)\n", W,
                 r.agree_bytes);
        fflush(stdout);
      }
    }
  }
  return fails ? 1 : 0;
}
