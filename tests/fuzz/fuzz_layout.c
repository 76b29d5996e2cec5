/* fuzz_layout.c - libFuzzer target: layouts decoded from bytes, registered on a world of 1 to 4
   ranks (threads of this process, tests/fuzz/fuzz_world.h), planned and stepped.

   Build and run: tests/run_fuzz.sh BUILD_DIR fuzz (or replay); by hand:
     clang -std=c99 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. \
       tests/fuzz/fuzz_layout.c -o build/fuzz/fuzz_layout -lm -pthread
     build/fuzz/fuzz_layout tests/fuzz/corpus/layout

   The input (every byte past its end reads as 0):
     byte 0   P = 1 + (b & 3) ranks; steps = 1 + (b >> 2 & 1); NorMuon (b >> 3 & 3: 1 ROWS,
              2 LARGER, else off); round-robin owners (b >> 5 & 1); 64-byte exchange rounds
              (b >> 6 & 1); a replicated AdamW param on every rank (b >> 7)
     byte 1   matrices = 1 + b % 3; mesh axes = 1 + b / 3 % 3; then bits of b / 9: cautious
              weight decay (1), Gram Newton-Schulz (2), unchecked commit (4), muon_check_layouts
              before the steps, muon_gather_matrix of every matrix after them, and with two steps a
              checkpoint of every rank resharded in place between them (8), bf16 parameters,
              gradients and mirrors with stochastic rounding (16)
     then     the size of each axis but the last, as a choice among the divisors of what is left
              of P (the last axis takes the rest: the axes multiply to P; ranks are numbered
              row-major over them)
     per matrix: rows = 1 + b % 10, cols = 1 + b % 10, a byte k (layout key k >> 1 when k is odd,
              else 0), and per axis a byte k: the level k % 6 over that axis - REPLICATE,
              SHARD(0), SHARD(1), FLAT in chunks, FLAT at explicit ranges (cut points hashed
              from k / 6 and the length of the piece split), or no level; then up to three
              perturbations, each announced by a byte >= 192: rank, what, value, level - a
              field of one rank's level set to or moved by a signed byte (placement, dim, size,
              index, offset, length), n_levels, the key, rows or cols, a rank not registering the
              matrix, registering it under another matrix's name, two ranks swapping layouts, or
              an extra level over a group of one.
   What must hold (a failure aborts, which libFuzzer reports with the input):
   - nothing crashes, leaks or hangs, whatever the layouts (a rank that stops after an error
     makes the others' collectives fail, never wait); every failed call returns a status whose
     text muon_error gives;
   - muon_add_matrix accepts a layout exactly when the rules of muon.h's layout docs (checked
     here independently, as test_threads' ref_piece cuts pieces) accept it, and then holds as
     many floats as those rules give the piece;
   - every collective is entered by every rank with the same kind and matching sizes;
   - resharding the world's own checkpoint between two steps succeeds and changes no momentum;
   - when every call on every rank succeeds: the matrices matched by (name, key) have one shape,
     their pieces tile each matrix (replicas hold identical pieces, others are disjoint, no
     element is missing), muon_check_layouts passed, and every rank's parameters (and bf16
     mirrors) and every gathered matrix equal bit for bit those of one muon on one device (a
     world of one, the same names and keys) stepping the full matrices with the same gradients -
     stochastic rounding included, whose bits depend on the element, never on the world. */
#define _POSIX_C_SOURCE 200809L   /* pthreads under -std=c99 */
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "fuzz_world.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_MATS 3
#define MAX_AXES 3
#define MAX_PERTURB 3
#define ADAMW_SIZE 7
#define LR 0.02f

typedef struct rank_matrix {       /* one rank's registration of one matrix                       */
  int registered, slot, rows, cols;
  muon_layout L;
} rank_matrix;

typedef struct spec {
  int P, steps, n_axes, axis[MAX_AXES], n_mats;
  muon_normuon normuon;
  int round_robin, small_rounds, adamw, cautious, gram, unchecked, verify, lowp;
  unsigned long long seed;         /* stochastic rounding (lowp)                                */
  rank_matrix rm[FZ_MAX_RANKS][MAX_MATS];
} spec;

typedef struct reader { const uint8_t *p; size_t n, at; } reader;
static unsigned rd(reader *r) { return r->at < r->n ? r->p[r->at++] : 0u; }

static unsigned mix(unsigned a, unsigned b, unsigned c) {
  unsigned h = a * 2654435761u ^ (b + 0x9e3779b9u) * 40503u ^ c * 97u;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  return h ^ (h >> 15);
}

static void fail(const char *what, const char *detail) {
  fprintf(stderr, "fuzz_layout: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  abort();
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) fail("out of memory", NULL);
  return p;
}

/* ---- the layout rules, from muon.h's docs -----------------------------------------------------
   The full-matrix indices (row * cols + col) a rank with layout L holds, in local order; returns
   0 if the docs reject L: n_levels in [0, MUON_MAX_LEVELS]; every level's group has size >= 1
   and index in [0, size); placement REPLICATE or PARTIAL (reduce SUM or MEAN; the same piece),
   SHARD (dim 0 or 1; after a FLAT level the piece
   is 1-D and only SHARD(0) applies, chunking the list) or FLAT (length < 0: chunk `index` of
   ceil(len / size); else the range [offset, offset + length) inside the piece). */
static void chunk_range(long long length, int parts, int index, long long *lo, long long *hi) {
  long long chunk = (length + parts - 1) / parts;
  *lo = index * chunk < length ? index * chunk : length;
  *hi = *lo + chunk < length ? *lo + chunk : length;
}

static int ref_piece(const muon_layout *L, int rows, int cols, long long *idx, size_t *count) {
  long long height = rows, width = cols, n, lo, hi, r, c, k;
  int is_flat = 0, j;
  if (rows < 1 || cols < 1 || L->n_levels < 0 || L->n_levels > MUON_MAX_LEVELS) return 0;
  n = (long long)rows * cols;
  for (k = 0; k < n; k++) idx[k] = k;
  for (j = 0; j < L->n_levels; j++) {
    const muon_level *v = &L->levels[j];
    if (v->size < 1 || v->index < 0 || v->index >= v->size) return 0;
    if (v->placement == MUON_REPLICATE) continue;
    if (v->placement == MUON_PARTIAL) {   /* the piece of REPLICATE; its gradient a part */
      if (v->reduce != MUON_REDUCE_SUM && v->reduce != MUON_REDUCE_MEAN) return 0;
      continue;
    }
    if (v->placement == MUON_SHARD) {
      if (v->dim != 0 && v->dim != 1) return 0;
      if (is_flat && v->dim != 0) return 0;
    } else if (v->placement != MUON_FLAT) {
      return 0;
    }
    if (v->placement == MUON_SHARD && !is_flat && v->dim == 0) {
      chunk_range(height, v->size, v->index, &lo, &hi);
      memmove(idx, idx + lo * width, (size_t)((hi - lo) * width) * sizeof *idx);
      height = hi - lo;
      n = height * width;
    } else if (v->placement == MUON_SHARD && !is_flat) {
      chunk_range(width, v->size, v->index, &lo, &hi);
      for (r = 0; r < height; r++)
        for (c = 0; c < hi - lo; c++) idx[r * (hi - lo) + c] = idx[r * width + lo + c];
      width = hi - lo;
      n = height * width;
    } else {
      if (v->placement == MUON_FLAT && v->length >= 0) {
        if (v->offset < 0 || v->offset > n || v->length > n - v->offset) return 0;
        lo = v->offset;
        hi = v->offset + v->length;
      } else {
        chunk_range(n, v->size, v->index, &lo, &hi);
      }
      memmove(idx, idx + lo, (size_t)(hi - lo) * sizeof *idx);
      n = hi - lo;
      is_flat = 1;
    }
  }
  *count = (size_t)n;
  return 1;
}

/* ---- decoding -------------------------------------------------------------------------------- */
static void decode(reader *in, spec *s, long long *scratch) {
  unsigned b0 = rd(in), b1 = rd(in), bits, rest;
  int a, i, r, np;
  memset(s, 0, sizeof *s);
  s->P = 1 + (int)(b0 & 3u);
  s->steps = 1 + (int)(b0 >> 2 & 1u);
  s->normuon = (b0 >> 3 & 3u) == 1 ? MUON_NORMUON_ROWS : (b0 >> 3 & 3u) == 2 ? MUON_NORMUON_LARGER : MUON_NORMUON_OFF;
  s->round_robin = (int)(b0 >> 5 & 1u);
  s->small_rounds = (int)(b0 >> 6 & 1u);
  s->adamw = (int)(b0 >> 7 & 1u);
  s->n_mats = 1 + (int)(b1 % 3u);
  s->n_axes = 1 + (int)(b1 / 3u % 3u);
  bits = b1 / 9u;
  s->cautious = (int)(bits & 1u);
  s->gram = (int)(bits >> 1 & 1u);
  s->unchecked = (int)(bits >> 2 & 1u);
  s->verify = (int)(bits >> 3 & 1u);
  s->lowp = (int)(bits >> 4 & 1u);
  s->seed = (unsigned long long)b0 * 1000003ull + b1;
  rest = (unsigned)s->P;
  for (a = 0; a < s->n_axes - 1; a++) {
    unsigned divs[4], nd = 0, d;
    for (d = 1; d <= rest; d++) if (rest % d == 0) divs[nd++] = d;
    s->axis[a] = (int)divs[rd(in) % nd];
    rest /= (unsigned)s->axis[a];
  }
  s->axis[s->n_axes - 1] = (int)rest;
  for (i = 0; i < s->n_mats; i++) {
    int rows = 1 + (int)(rd(in) % 10u), cols = 1 + (int)(rd(in) % 10u);
    unsigned kb = rd(in), kind[MAX_AXES];
    long long key = kb & 1u ? (long long)(kb >> 1) : 0;
    for (a = 0; a < s->n_axes; a++) kind[a] = rd(in);
    for (r = 0; r < s->P; r++) {
      rank_matrix *x = &s->rm[r][i];
      int coord[MAX_AXES], left = r;
      for (a = s->n_axes - 1; a >= 0; a--) { coord[a] = left % s->axis[a]; left /= s->axis[a]; }
      x->registered = 1;
      x->slot = i;
      x->rows = rows;
      x->cols = cols;
      x->L.key = key;
      for (a = 0; a < s->n_axes; a++) {
        muon_level v;
        unsigned k = kind[a] % 6u;
        if (k == 5) continue;
        memset(&v, 0, sizeof v);
        v.placement = k == 0 ? MUON_REPLICATE : k <= 2 ? MUON_SHARD : MUON_FLAT;
        v.dim = k == 2;
        v.size = s->axis[a];
        v.index = coord[a];
        v.length = -1;
        if (k == 4) {   /* cut points from the piece's length, which the level's group shares */
          long long cut[FZ_MAX_RANKS + 1], len, t;
          size_t got;
          int j, m;
          if (!ref_piece(&x->L, rows, cols, scratch, &got)) got = 0;
          len = (long long)got;
          cut[0] = 0;
          cut[v.size] = len;
          for (j = 1; j < v.size; j++) cut[j] = (long long)(mix(kind[a] / 6u, (unsigned)a, (unsigned)(len * 31 + j)) % (unsigned)(len + 1));
          for (j = 2; j < v.size; j++)
            for (m = j; m > 1 && cut[m - 1] > cut[m]; m--) { t = cut[m]; cut[m] = cut[m - 1]; cut[m - 1] = t; }
          v.offset = cut[v.index];
          v.length = cut[v.index + 1] - cut[v.index];
        }
        x->L.levels[x->L.n_levels++] = v;
      }
    }
    for (np = 0; np < MAX_PERTURB && rd(in) >= 192u; np++) {
      int rank = (int)(rd(in) % (unsigned)s->P), what = (int)(rd(in) % 14u), val = (int)(signed char)rd(in);
      rank_matrix *x = &s->rm[rank][i];
      unsigned span = x->L.n_levels >= 0 && x->L.n_levels < MUON_MAX_LEVELS ? (unsigned)x->L.n_levels + 1u : MUON_MAX_LEVELS;
      int lv = (int)(rd(in) % span);
      muon_level *v;
      if (lv >= MUON_MAX_LEVELS) lv = MUON_MAX_LEVELS - 1;
      v = &x->L.levels[lv];
      switch (what) {
      case 0: v->placement = (muon_placement)val; break;
      case 1: v->dim = val; break;
      case 2: v->size += val; break;
      case 3: v->index += val; break;
      case 4: v->offset = val; if (v->length < 0) v->length = val < 0 ? -val : val; break;
      case 5: v->length = val; break;
      case 6: x->L.n_levels = val; break;
      case 7: x->L.key = val; break;
      case 8: x->rows += val; break;
      case 9: x->cols += val; break;
      case 10: x->registered = 0; break;
      case 11: x->slot = (int)((unsigned)val % MAX_MATS); break;
      case 12: {   /* two ranks swap their layouts of this matrix */
        rank_matrix *y = &s->rm[(unsigned)val % (unsigned)s->P][i];
        muon_layout t = x->L;
        x->L = y->L;
        y->L = t;
        break;
      }
      default:     /* an extra level over a group of one: changes nothing */
        if (x->L.n_levels >= 0 && x->L.n_levels < MUON_MAX_LEVELS) {
          memmove(&x->L.levels[lv + 1], &x->L.levels[lv], (size_t)(x->L.n_levels - lv) * sizeof(muon_level));
          memset(v, 0, sizeof *v);
          v->placement = (muon_placement)((unsigned)val % 3u);
          v->size = 1;
          v->length = -1;
          x->L.n_levels++;
        }
        break;
      }
    }
  }
}

/* ---- buffers of fp32 or bf16 elements (bf16: the top half of the fp32 bits) ------------------ */
typedef struct tensor { unsigned char *p; unsigned short *mirror; int bf16; size_t n; } tensor;

static void tensor_alloc(tensor *t, size_t n, int bf16, int mirror) {
  t->bf16 = bf16;
  t->n = n;
  t->p = (unsigned char *)xmalloc(n * (bf16 ? 2 : 4));
  t->mirror = mirror ? (unsigned short *)xmalloc(n * 2) : NULL;
  if (t->mirror) memset(t->mirror, 0, n * 2);
}
static void tensor_free(tensor *t) { free(t->p); free(t->mirror); memset(t, 0, sizeof *t); }
static void tensor_set(tensor *t, size_t e, float x) {
  if (t->bf16) { uint32_t u; unsigned short h; memcpy(&u, &x, 4); h = (unsigned short)(u >> 16); memcpy(t->p + 2 * e, &h, 2); }
  else memcpy(t->p + 4 * e, &x, 4);
}
static float bf16_cut(float x) { uint32_t u; memcpy(&u, &x, 4); u &= 0xffff0000u; memcpy(&x, &u, 4); return x; }   /* as tensor_set stores it */
static float tensor_get(const tensor *t, size_t e) {
  float x;
  if (t->bf16) { unsigned short h; uint32_t u; memcpy(&h, t->p + 2 * e, 2); u = (uint32_t)h << 16; memcpy(&x, &u, 4); }
  else memcpy(&x, t->p + 4 * e, 4);
  return x;
}
/* Element e of a against element f of b, bit for bit (mirrors too). */
static int tensor_same(const tensor *a, size_t e, const tensor *b, size_t f) {
  size_t w = a->bf16 ? 2 : 4;
  if (memcmp(a->p + w * e, b->p + w * f, w) != 0) return 0;
  return !a->mirror || memcmp(&a->mirror[e], &b->mirror[f], 2) == 0;
}

/* ---- the model's numbers: a pure function of (matrix name, shape, element, step) ------------- */
static float value(unsigned seed, unsigned e) {
  unsigned h = mix(seed, e, 0x51u);
  return (float)(h & 0xffffu) / 65536.0f - 0.5f;
}
static unsigned matrix_seed(int slot, int rows, int cols) { return (unsigned)slot * 131u + (unsigned)rows * 17u + (unsigned)cols * 7u; }
static float weight0(int slot, int rows, int cols, long long e) { return value(matrix_seed(slot, rows, cols), (unsigned)e); }
static float gradient(int slot, int rows, int cols, long long e, int step) {
  float g = value(matrix_seed(slot, rows, cols) + 7919u * (unsigned)(step + 1), (unsigned)e);
  return g < 0 ? g - 0.05f : g + 0.05f;
}

static muon_desc make_desc(const spec *s) {
  muon_desc d = muon_default_desc();
  d.rounding = s->lowp ? MUON_ROUND_STOCHASTIC : MUON_ROUND_NEAREST;
  d.seed = s->seed;
  d.hparams.lr = LR;
  d.hparams.normuon = s->normuon;
  d.hparams.cautious_wd = s->cautious;
  d.hparams.ns_algorithm = s->gram ? MUON_NS_GRAM : MUON_NS_STANDARD;
  d.adamw.lr = LR;
  return d;
}

/* ---- one rank --------------------------------------------------------------------------------- */
typedef struct gathered {
  int slot, rows, cols;
  int key_known;                   /* the root holds the matrix, so its layout gives the key     */
  long long key;
  float *full;
} gathered;

typedef struct checkpoint {         /* every rank's state blob, for resharding in place          */
  void *blob[FZ_MAX_RANKS];
  size_t size[FZ_MAX_RANKS];
} checkpoint;

typedef struct rank_run {
  const spec *s;
  checkpoint *saved;
  fz_world *world;
  int rank;
  int ok;                          /* every call succeeded                                     */
  muon_status verify_status;       /* muon_check_layouts                                       */
  int n_local, local_of[MAX_MATS]; /* muon's local index -> matrix i                            */
  long long *idx[MAX_MATS];
  size_t n[MAX_MATS];
  int valid[MAX_MATS];
  tensor param[MAX_MATS], grad[MAX_MATS], adamw_param, adamw_grad;
  int n_gathered;
  gathered got[MAX_MATS * FZ_MAX_RANKS];
  char failure[200];               /* the first failed call's message (FUZZ_VERBOSE prints it)  */
} rank_run;

static void failed_call(rank_run *me, muon_optimizer *opt, muon_status st, const char *call) {
  const char *msg = muon_error(opt), *name = muon_status_string(st);
  if (!msg || strncmp(msg, name, strlen(name)) != 0) fail("an error without its message (muon_error names another status or none)", call);
  if (!me->failure[0]) snprintf(me->failure, sizeof me->failure, "%s", msg);
}

static long long index_of(void *user, int matrix, size_t k) {
  rank_run *me = (rank_run *)user;
  if (matrix < 0 || matrix >= me->n_local || k >= me->n[me->local_of[matrix]]) fail("muon_check_layouts asked for an element that does not exist", NULL);
  return me->idx[me->local_of[matrix]][k];
}

static int slot_of(const char *name) {
  return name && name[0] == 'm' && name[1] >= '0' && name[1] < '0' + MAX_MATS && !name[2] ? name[1] - '0' : -1;
}

/* PARTIAL levels, by muon.h's rule: the product of their sizes, and MEAN's factor. */
static int parts_of(const muon_layout *L, float *scale) {
  int j, n = 1, mean = 1;
  for (j = 0; j < L->n_levels && j < MUON_MAX_LEVELS; j++)
    if (L->levels[j].placement == MUON_PARTIAL) {
      n *= L->levels[j].size;
      if (L->levels[j].reduce == MUON_REDUCE_MEAN) mean *= L->levels[j].size;
    }
  *scale = 1.0f / (float)mean;
  return n;
}

/* Between the two steps: every rank saves, then reshards the whole world's checkpoint into its
   own optimizer. That must succeed and change no momentum bit (and, as the final comparison with
   one device shows, no bit of the step after it either). */
static void reshard_in_place(rank_run *me, muon_optimizer *opt) {
  checkpoint *c = me->saved;
  size_t n = muon_state_size(opt), k, local;
  const void *blobs[FZ_MAX_RANKS];
  float *before[MAX_MATS];
  const float *mom;
  muon_status st;
  int i, r;
  c->blob[me->rank] = xmalloc(n);
  c->size[me->rank] = n;
  if ((st = muon_state_save(opt, c->blob[me->rank], n)) != MUON_OK) fail("muon_state_save failed", muon_error(opt));
  for (i = 0; i < me->n_local; i++) {
    if (muon_get_momentum(opt, i, &mom, &local) != MUON_OK) fail("muon_get_momentum failed", muon_error(opt));
    before[i] = (float *)xmalloc(local * sizeof(float));
    memcpy(before[i], mom, local * sizeof(float));
  }
  if (!fz_barrier(me->world)) { me->ok = 0; snprintf(me->failure, sizeof me->failure, "a rank left before the checkpoint"); }
  for (r = 0; r < me->s->P; r++) blobs[r] = c->blob[r];
  if (me->ok && (st = muon_state_reshard(opt, blobs, c->size, me->s->P)) != MUON_OK) fail("resharding the world's own checkpoint failed", muon_error(opt));
  for (i = 0; me->ok && i < me->n_local; i++) {
    if (muon_get_momentum(opt, i, &mom, &local) != MUON_OK) fail("muon_get_momentum failed", muon_error(opt));
    for (k = 0; k < local; k++)
      if (memcmp(&mom[k], &before[i][k], sizeof(float)) != 0) fail("resharding the world's own checkpoint changed a momentum", NULL);
  }
  for (i = 0; i < me->n_local; i++) free(before[i]);
  if (me->ok && !fz_barrier(me->world)) { me->ok = 0; snprintf(me->failure, sizeof me->failure, "a rank left during the reshard"); }
}

static void *rank_main(void *arg) {
  rank_run *me = (rank_run *)arg;
  const spec *s = me->s;
  fz_link link;
  muon_comm comm = fz_comm(&link, me->world, me->rank);
  muon_dist_config dist = muon_layout_config();
  muon_desc desc = make_desc(s);
  muon_optimizer *opt = NULL;
  muon_status st;
  int i, step, g;
  size_t e;
  char name[8];
  dist.round_robin = s->round_robin;
  dist.round_bytes = s->small_rounds ? 64 : 0;
  dist.unchecked_commit = s->unchecked;
  desc.comm = &comm;
  desc.dist = &dist;
  if (muon_create(&opt, &desc) != MUON_OK) fail("muon_create failed", muon_error(NULL));
  me->ok = 1;
  for (i = 0; me->ok && i < s->n_mats; i++) {
    const rank_matrix *x = &s->rm[me->rank][i];
    muon_matrix m = muon_default_matrix();
    const float *mom;
    size_t mom_n;
    if (!x->registered) continue;
    snprintf(name, sizeof name, "m%d", x->slot);
    m.name = name;
    m.param = me->param[i].p;
    m.grad = me->grad[i].p;
    m.mirror = me->param[i].mirror;
    m.param_dtype = m.grad_dtype = s->lowp ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
    m.rows = x->rows;
    m.cols = x->cols;
    m.layout = &x->L;
    st = muon_add_matrix(opt, &m, NULL);
    if (st != MUON_OK) {
      failed_call(me, opt, st, "muon_add_matrix");
      if (st != MUON_ERR_SHAPE) fail("muon_add_matrix failed other than with MUON_ERR_SHAPE", muon_error(opt));
      if (me->valid[i]) fail("muon_add_matrix rejected a layout the docs allow", muon_error(opt));
      me->ok = 0;
      break;
    }
    if (!me->valid[i]) fail("muon_add_matrix accepted a layout the docs reject", name);
    {   /* a Partial matrix's momentum is its owner's, whole, from the first plan on: none yet */
      float unused;
      size_t want = parts_of(&x->L, &unused) > 1 ? 0 : me->n[i];
      if (muon_get_momentum(opt, me->n_local, &mom, &mom_n) != MUON_OK || mom_n != want)
        fail("the registered piece holds another number of floats than the layout docs give it", name);
    }
    me->local_of[me->n_local++] = i;
  }
  if (me->ok && s->adamw) {
    muon_adamw_param p = muon_default_adamw_param();
    p.name = "bias";
    p.param = me->adamw_param.p;
    p.grad = me->adamw_grad.p;
    p.mirror = me->adamw_param.mirror;
    p.param_dtype = p.grad_dtype = s->lowp ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
    p.size = ADAMW_SIZE;
    if ((st = muon_add_adamw_param(opt, &p, NULL)) != MUON_OK) fail("muon_add_adamw_param failed", muon_error(opt));
  }
  if (me->ok && s->verify) {
    me->verify_status = muon_check_layouts(opt, index_of, me);
    if (me->verify_status != MUON_OK) failed_call(me, opt, me->verify_status, "muon_check_layouts");
  }
  for (step = 0; me->ok && step < s->steps; step++) {
    for (i = 0; i < s->n_mats; i++) {
      const rank_matrix *x = &s->rm[me->rank][i];
      if (!x->registered || !me->valid[i]) continue;
      for (e = 0; e < me->n[i]; e++) tensor_set(&me->grad[i], e, gradient(x->slot, x->rows, x->cols, me->idx[i][e], step));
    }
    for (e = 0; e < ADAMW_SIZE; e++) tensor_set(&me->adamw_grad, e, gradient(MAX_MATS, 1, ADAMW_SIZE, (long long)e, step));
    if ((st = muon_step(opt)) != MUON_OK) {
      failed_call(me, opt, st, "muon_step");
      me->ok = 0;
    }
    if (me->ok && s->verify && step == 0 && s->steps == 2) reshard_in_place(me, opt);
  }
  if (me->ok) {   /* the plan as text, whole and cut short */
    size_t len = muon_plan_text(opt, NULL, 0), again;
    char *text = (char *)xmalloc(len + 1), small[8];
    again = muon_plan_text(opt, text, len + 1);
    if (again != len || strlen(text) != len) fail("muon_plan_text: the length it returns is not the text's", NULL);
    if (muon_plan_text(opt, small, sizeof small) != len || strlen(small) >= sizeof small) fail("muon_plan_text: a short buffer is not cut and terminated", NULL);
    free(text);
  }
  for (g = 0; me->ok && s->verify && g < muon_global_count(opt); g++) {
    muon_matrix_info info;
    int owner, root = g % s->P;
    float *full = NULL;
    if ((st = muon_global_info(opt, g, &info, &owner)) != MUON_OK) fail("muon_global_info failed", muon_error(opt));
    if (me->rank == root) full = (float *)xmalloc((size_t)info.rows * (size_t)info.cols * sizeof(float));
    if ((st = muon_gather_matrix(opt, g, root, full, NULL)) != MUON_OK) {
      failed_call(me, opt, st, "muon_gather_matrix");
      free(full);
      me->ok = 0;
      break;
    }
    if (full) {
      gathered *x = &me->got[me->n_gathered++];
      x->slot = slot_of(info.name);
      x->rows = info.rows;
      x->cols = info.cols;
      x->key_known = info.local >= 0;
      x->key = info.local >= 0 ? s->rm[me->rank][me->local_of[info.local]].L.key : 0;
      x->full = full;
      if (x->slot < 0) fail("muon_global_info gives a name no rank registered", info.name);
    }
  }
  muon_destroy(opt);
  fz_leave(me->world);
  return NULL;
}

/* ---- the oracle ------------------------------------------------------------------------------- */
typedef struct group {             /* one global matrix: (name, key) and its one-device result  */
  int slot, rows, cols;
  long long key;
  int parts;                       /* PARTIAL levels: every holder's gradient is one part */
  float scale;                     /* MEAN's 1 / size */
  tensor param, grad;
} group;

static group *find_group(group *gs, int n, int slot, long long key) {
  int k;
  for (k = 0; k < n; k++) if (gs[k].slot == slot && gs[k].key == key) return &gs[k];
  return NULL;
}

/* Every call succeeded on every rank: the pieces tile, and everything equals one device. */
static void check_world(const spec *s, rank_run *runs) {
  group gs[FZ_MAX_RANKS * MAX_MATS];
  int n_groups = 0, r, i, k, step;
  muon_desc desc = make_desc(s);
  muon_dist_config dist = muon_layout_config();
  muon_optimizer *one = NULL;
  tensor adamw_param, adamw_grad;
  size_t e;
  for (r = 0; r < s->P; r++) {
    if (runs[r].verify_status != MUON_OK) fail("muon_check_layouts failed, yet every step on every rank succeeded", NULL);
    for (i = 0; i < s->n_mats; i++) {
      const rank_matrix *x = &s->rm[r][i];
      group *g;
      if (!x->registered) continue;
      if (!(g = find_group(gs, n_groups, x->slot, x->L.key))) {
        g = &gs[n_groups++];
        g->slot = x->slot; g->key = x->L.key; g->rows = x->rows; g->cols = x->cols;
        g->parts = parts_of(&x->L, &g->scale);
      } else if (g->rows != x->rows || g->cols != x->cols) {
        fail("planning accepted ranks registering one matrix (name and key) with different shapes", NULL);
      }
    }
  }
  /* Tiling: per element, the first holder; any other holder of it holds the identical piece. */
  for (k = 0; k < n_groups; k++) {
    size_t total = (size_t)gs[k].rows * (size_t)gs[k].cols;
    int *first = (int *)xmalloc(total * sizeof(int));
    for (e = 0; e < total; e++) first[e] = -1;
    for (r = 0; r < s->P; r++)
      for (i = 0; i < s->n_mats; i++) {
        const rank_matrix *x = &s->rm[r][i];
        if (!x->registered || x->slot != gs[k].slot || x->L.key != gs[k].key) continue;
        for (e = 0; e < runs[r].n[i]; e++) {
          long long at = runs[r].idx[i][e];
          int h = first[at], hr = h / MAX_MATS, hi = h % MAX_MATS;
          if (h < 0) { first[at] = r * MAX_MATS + i; continue; }
          if (h == r * MAX_MATS + i) continue;
          if (runs[hr].n[hi] != runs[r].n[i] || memcmp(runs[hr].idx[hi], runs[r].idx[i], runs[r].n[i] * sizeof(long long)) != 0)
            fail("planning accepted pieces that overlap without being replicas", NULL);
        }
      }
    for (e = 0; e < total; e++)
      if (first[e] < 0) fail("planning accepted pieces that leave an element of a matrix unheld", NULL);
    free(first);
  }
  /* One device (a world of one, so the matrices keep their names and layout keys, which seed
     stochastic rounding), full matrices, same gradients. */
  desc.dist = &dist;
  if (muon_create(&one, &desc) != MUON_OK) fail("one device: muon_create failed", muon_error(NULL));
  for (k = 0; k < n_groups; k++) {
    muon_matrix m = muon_default_matrix();
    muon_layout whole;
    char name[8];
    size_t total = (size_t)gs[k].rows * (size_t)gs[k].cols;
    tensor_alloc(&gs[k].param, total, s->lowp, s->lowp);
    tensor_alloc(&gs[k].grad, total, s->lowp && gs[k].parts == 1, 0);   /* a sum of parts: fp32 */
    for (e = 0; e < total; e++) tensor_set(&gs[k].param, e, weight0(gs[k].slot, gs[k].rows, gs[k].cols, (long long)e));
    memset(&whole, 0, sizeof whole);
    whole.key = gs[k].key;
    snprintf(name, sizeof name, "m%d", gs[k].slot);
    m.name = name;
    m.param = gs[k].param.p;
    m.grad = gs[k].grad.p;
    m.mirror = gs[k].param.mirror;
    m.param_dtype = m.grad_dtype = s->lowp ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
    if (gs[k].parts > 1) m.grad_dtype = MUON_DTYPE_FP32;
    m.rows = gs[k].rows;
    m.cols = gs[k].cols;
    m.layout = &whole;
    if (muon_add_matrix(one, &m, NULL) != MUON_OK) fail("one device: muon_add_matrix failed", muon_error(one));
  }
  tensor_alloc(&adamw_param, ADAMW_SIZE, s->lowp, s->lowp);
  tensor_alloc(&adamw_grad, ADAMW_SIZE, s->lowp, 0);
  for (e = 0; e < ADAMW_SIZE; e++) tensor_set(&adamw_param, e, weight0(MAX_MATS, 1, ADAMW_SIZE, (long long)e));
  if (s->adamw) {
    muon_adamw_param p = muon_default_adamw_param();
    p.name = "bias";
    p.param = adamw_param.p;
    p.grad = adamw_grad.p;
    p.mirror = adamw_param.mirror;
    p.param_dtype = p.grad_dtype = s->lowp ? MUON_DTYPE_BF16 : MUON_DTYPE_FP32;
    p.size = ADAMW_SIZE;
    if (muon_add_adamw_param(one, &p, NULL) != MUON_OK) fail("one device: muon_add_adamw_param failed", muon_error(one));
  }
  for (step = 0; step < s->steps; step++) {
    for (k = 0; k < n_groups; k++)
      for (e = 0; e < (size_t)gs[k].rows * (size_t)gs[k].cols; e++) {
        float part = gradient(gs[k].slot, gs[k].rows, gs[k].cols, (long long)e, step), sum;
        int p;
        if (s->lowp) part = bf16_cut(part);   /* what each rank's bf16 part holds */
        for (p = 1, sum = part; p < gs[k].parts; p++) sum = sum + part;   /* every holder's part is the same */
        tensor_set(&gs[k].grad, e, gs[k].parts > 1 ? gs[k].scale * sum : sum);
      }
    for (e = 0; e < ADAMW_SIZE; e++) tensor_set(&adamw_grad, e, gradient(MAX_MATS, 1, ADAMW_SIZE, (long long)e, step));
    if (muon_step(one) != MUON_OK) fail("one device: muon_step failed", muon_error(one));
  }
  muon_destroy(one);
  for (r = 0; r < s->P; r++) {
    rank_run *run = &runs[r];
    for (i = 0; i < s->n_mats; i++) {
      const rank_matrix *x = &s->rm[r][i];
      const group *g;
      if (!x->registered) continue;
      g = find_group(gs, n_groups, x->slot, x->L.key);
      for (e = 0; e < run->n[i]; e++)
        if (!tensor_same(&run->param[i], e, &g->param, (size_t)run->idx[i][e]))
          fail("a rank's parameter (or its bf16 mirror) differs from one device's", NULL);
    }
    for (e = 0; s->adamw && e < ADAMW_SIZE; e++)
      if (!tensor_same(&run->adamw_param, e, &adamw_param, e)) fail("an AdamW parameter (or its bf16 mirror) differs from one device's", NULL);
    for (k = 0; k < run->n_gathered; k++) {
      const gathered *x = &run->got[k];
      int same = 0, j;
      /* the global of (name, key): two keys can share a name and a shape (a perturbed key) */
      for (i = n_groups, j = 0; j < n_groups; j++)
        if (gs[j].slot == x->slot && gs[j].rows == x->rows && gs[j].cols == x->cols) {
          same++;
          if (i == n_groups && (!x->key_known || gs[j].key == x->key)) i = j;
        }
      if (i == n_groups) fail("muon_gather_matrix gave a matrix of a shape no rank registered", NULL);
      if (same > 1 && !x->key_known) continue;   /* which of them: the root cannot say */
      for (e = 0; e < (size_t)x->rows * (size_t)x->cols; e++) {
        float want = tensor_get(&gs[i].param, e);
        if (memcmp(&x->full[e], &want, sizeof want) != 0) fail("a gathered matrix differs from one device's", NULL);
      }
    }
  }
  for (k = 0; k < n_groups; k++) { tensor_free(&gs[k].param); tensor_free(&gs[k].grad); }
  tensor_free(&adamw_param);
  tensor_free(&adamw_grad);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader in;
  spec s;
  rank_run runs[FZ_MAX_RANKS];
  fz_world w;
  checkpoint saved;
  long long scratch[(10 + 128) * (10 + 128)];
  int r, i, all_ok = 1, k;
  size_t e;
  in.p = data;
  in.n = size;
  in.at = 0;
  decode(&in, &s, scratch);
  memset(runs, 0, sizeof runs);
  for (r = 0; r < s.P; r++) {
    rank_run *run = &runs[r];
    run->s = &s;
    run->world = &w;
    run->rank = r;
    tensor_alloc(&run->adamw_param, ADAMW_SIZE, s.lowp, s.lowp);
    tensor_alloc(&run->adamw_grad, ADAMW_SIZE, s.lowp, 0);
    for (e = 0; e < ADAMW_SIZE; e++) tensor_set(&run->adamw_param, e, weight0(MAX_MATS, 1, ADAMW_SIZE, (long long)e));
    for (i = 0; i < s.n_mats; i++) {
      const rank_matrix *x = &s.rm[r][i];
      size_t total = x->rows > 0 && x->cols > 0 ? (size_t)x->rows * (size_t)x->cols : 0;
      run->idx[i] = (long long *)xmalloc(total * sizeof(long long));
      run->valid[i] = ref_piece(&x->L, x->rows, x->cols, run->idx[i], &run->n[i]);
      if (!run->valid[i]) run->n[i] = 0;
      tensor_alloc(&run->param[i], run->n[i], s.lowp, s.lowp);
      tensor_alloc(&run->grad[i], run->n[i], s.lowp, 0);
      for (e = 0; e < run->n[i]; e++) tensor_set(&run->param[i], e, weight0(x->slot, x->rows, x->cols, run->idx[i][e]));
    }
  }
  memset(&saved, 0, sizeof saved);
  for (r = 0; r < s.P; r++) runs[r].saved = &saved;
  fz_world_init(&w, s.P, 1);
  fz_run_ranks(&w, rank_main, runs, sizeof runs[0]);
  fz_world_free(&w);
  for (r = 0; r < s.P; r++) free(saved.blob[r]);
  for (r = 0; r < s.P; r++) all_ok &= runs[r].ok;
  if (all_ok) check_world(&s, runs);
  if (getenv("FUZZ_VERBOSE")) {
    fprintf(stderr, "fuzz_layout: P=%d, %d matrices, %d axes: %s", s.P, s.n_mats, s.n_axes, all_ok ? "every call succeeded, equal to one device\n" : "failed\n");
    for (r = 0; !all_ok && r < s.P; r++) fprintf(stderr, "  rank %d: %s\n", r, runs[r].failure[0] ? runs[r].failure : "ok");
  }
  for (r = 0; r < s.P; r++) {
    for (i = 0; i < s.n_mats; i++) { free(runs[r].idx[i]); tensor_free(&runs[r].param[i]); tensor_free(&runs[r].grad[i]); }
    tensor_free(&runs[r].adamw_param);
    tensor_free(&runs[r].adamw_grad);
    for (k = 0; k < runs[r].n_gathered; k++) free(runs[r].got[k].full);
  }
  return 0;
}
