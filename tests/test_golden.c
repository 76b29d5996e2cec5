/* test_golden.c - muon_step against the independent numpy float64 reference (tests/ref_muon.py).

   Usage:  /usr/bin/python3 tests/ref_muon.py build/golden && build/test_golden build/golden

   Every case of build/golden/golden.list (format: the doc string of tests/ref_muon.py) builds an
   optimizer through the public API only (muon_default_desc, muon_create, muon_add_group,
   muon_add_adamw_group, muon_add_matrix, muon_add_adamw_param, muon_set_ns_preset, muon_set_lr,
   muon_set_grad, muon_set_adamw_grad, muon_step), runs the case's steps with the case's gradients
   and compares every parameter after every step with the reference:

   - fp32 NS (and AdamW): max |param - ref| / max |ref| <= 1e-5 per matrix (DESIGN 8), and, as a
     stricter check on the update itself, max |param - ref| / max |ref - param0| <= 3e-4 (observed
     worst 7.5e-5, in the lr 1e-3 defaults case where fp32 rounding of the params dominates; ~1e-5
     at lr 0.02).
   - bf16 NS: max |param - ref| / max |ref - param0| <= 4e-2, i.e. the accumulated update agrees
     with the reference's bf16 emulation within 4% of its largest entry. Observed worst 1.4e-2
     (numpy simulations of fp32-accumulating bf16 NS reach 2.1e-2). A bf16 ulp is 2^-8 = 3.9e-3;
     the C side accumulates in fp32 and the reference in float64, so now and then a rounding lands
     on the other side and NS spreads it. Cases without such a flip agree to ~3e-6. Note that bf16
     vs fp32 NS differ by only ~1.5e-2 too, so this bound alone cannot tell them apart: test_ns.c
     checks that bf16-mode NS outputs are bf16 values.
   - the momentum buffers (muon_get_momentum, every slice) within 1e-5 of max |ref B|: lerp and
     SGD-style momentum give the same params (NS does not see the scale of U), only B differs;
   - padding between stacked slices: bitwise untouched; a matrix or AdamW parameter whose gradient
     is absent for a step: bitwise untouched that step (no decay either), momentum too.
   - NorMuon step cases (group lines with NORMUON BETA2) use the fp32 bounds above unchanged
     (observed worst param rel 3.7e-7, update rel 7.8e-6); the second moment v has no getter, so
     it is checked through the params of the later steps (a v that does not accumulate, or that
     an absent gradient resets, fails them).

   Then every case of build/golden/normuon.list runs muon__normuon (static: this file includes
   muon.h) on one NS operand against the reference's normuon(), for each (kind, per_column):
   every element of X and of v_new within NORMUON_TOL (2e-6) of its reference element (observed
   worst 2.2e-7, under -Ofast); v only read. Statistics 1e-9 smaller than the rest and an
   operand scaled by 1e-17 make the epsilons (1e-10 in s, in the clamp and in the norm) matter.

   On failure it prints the first mismatching elements. Builds as C99 and as C++. */
#define MUON_IMPLEMENTATION
#include "../muon.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP32_PARAM_TOL 1e-5  /* relative to max |ref| of the matrix (DESIGN 8)                 */
#define FP32_UPDATE_TOL 3e-4 /* relative to max |ref - param0|: the accumulated update; observed 7.5e-5 */
#define BF16_UPDATE_TOL 4e-2 /* relative to max |ref - param0|, bf16 NS; observed worst 1.4e-2      */
#define BF16_TOL_TEXT "bf16 NS: accumulated update within 4e-2 of its max"

#define MAX_GROUPS 8
#define MAX_ENTRIES 16
#define MAX_EVENTS 16

/* Worst errors over all cases, for the closing report. */
static double worst_fp32_param, worst_fp32_update, worst_bf16_update, worst_adamw_param, worst_adamw_update,
    worst_momentum;

typedef struct mat_entry {
  int rows, cols, count, stride, group; /* as in the case file                              */
  int slices, s;                        /* max(count, 1), effective stride                  */
  size_t len;                           /* floats in the flat buffer                        */
  float *p, *g, *before;                /* param, grad (owned), param before the step       */
  double *p0, *ref, *mom;               /* initial param, reference param and momentum      */
  float *mom_before;                    /* the library's momentum before the step           */
  int index;                            /* muon_add_matrix's index_out (first slice)        */
} mat_entry;

typedef struct adamw_entry {
  size_t size;
  int group;
  float *p, *g, *before;
  double *p0, *ref;
  int index;
} adamw_entry;

typedef struct golden_case {
  char name[256];
  int defaults;
  int ngroups, nadamw_groups, nmat, nadamw;
  muon_hparams groups[MAX_GROUPS];
  int group_preset[MAX_GROUPS];
  int group_id[MAX_GROUPS];
  muon_adamw_hparams adamw_groups[MAX_GROUPS];
  int adamw_group_id[MAX_GROUPS];
  mat_entry mat[MAX_ENTRIES];
  adamw_entry adamw[MAX_ENTRIES];
  /* events of the current step */
  int nset_lr, nabsent_mat, nabsent_adamw;
  int set_lr_group[MAX_EVENTS];
  float set_lr_value[MAX_EVENTS];
  int absent_mat[MAX_EVENTS], absent_adamw[MAX_EVENTS];
} golden_case;

/* ---------------------------------------------------------------------------------------------
   Reading the case files */

static int host_is_little_endian(void) {
  unsigned int one = 1;
  unsigned char c;
  memcpy(&c, &one, 1);
  return c == 1;
}

/* Reads n little-endian float64 into out. */
static int read_f64(FILE *f, double *out, size_t n) {
  size_t i;
  if (fread(out, sizeof(double), n, f) != n) return 0;
  if (!host_is_little_endian()) {
    for (i = 0; i < n; i++) {
      unsigned char b[8], t;
      int k;
      memcpy(b, &out[i], 8);
      for (k = 0; k < 4; k++) { t = b[k]; b[k] = b[7 - k]; b[7 - k] = t; }
      memcpy(&out[i], b, 8);
    }
  }
  return 1;
}

/* Copies src into dst[cap], truncating. */
static void copy_text(char *dst, size_t cap, const char *src) {
  size_t len = strlen(src);
  if (len >= cap) len = cap - 1;
  memcpy(dst, src, len);
  dst[len] = 0;
}

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
  return p;
}

static void free_case(golden_case *c) {
  int i;
  for (i = 0; i < c->nmat; i++) {
    free(c->mat[i].p); free(c->mat[i].g); free(c->mat[i].before);
    free(c->mat[i].p0); free(c->mat[i].ref); free(c->mat[i].mom); free(c->mat[i].mom_before);
  }
  for (i = 0; i < c->nadamw; i++) {
    free(c->adamw[i].p); free(c->adamw[i].g); free(c->adamw[i].before);
    free(c->adamw[i].p0); free(c->adamw[i].ref);
  }
}

/* Reads an "arr KIND ENTRY N" payload into a double buffer of exactly `expect` values. */
static int read_arr(FILE *f, size_t n, size_t expect, double *dst, const char *what) {
  if (n != expect) {
    CHECK(0, "%s: case file has %lu values, expected %lu", what, (unsigned long)n, (unsigned long)expect);
    return 0;
  }
  if (!read_f64(f, dst, n)) { CHECK(0, "%s: truncated case file", what); return 0; }
  return 1;
}

static int read_arr_float(FILE *f, size_t n, size_t expect, float *dst, const char *what) {
  double *tmp;
  size_t i;
  int ok;
  tmp = (double *)xcalloc(expect, sizeof(double));
  ok = read_arr(f, n, expect, tmp, what);
  if (ok) for (i = 0; i < expect; i++) dst[i] = (float)tmp[i];
  free(tmp);
  return ok;
}

/* ---------------------------------------------------------------------------------------------
   Comparing */

/* max |a - ref| / max |ref - base| over n values. */
static double update_rel_err(const float *a, const double *ref, const double *base, size_t n) {
  double num = 0, den = 1e-30;
  size_t i;
  for (i = 0; i < n; i++) {
    double d = fabs((double)a[i] - ref[i]), u = fabs(ref[i] - base[i]);
    if (d > num) num = d;
    if (u > den) den = u;
  }
  return num / den;
}

static void print_mismatches(const float *a, const double *ref, size_t n, int cols, double abs_tol) {
  size_t i;
  int shown = 0;
  for (i = 0; i < n && shown < 5; i++) {
    double d = fabs((double)a[i] - ref[i]);
    if (d > abs_tol) {
      printf("    [%lu,%lu] got %.9g expected %.9g (diff %.3g)\n", (unsigned long)(i / (size_t)cols),
             (unsigned long)(i % (size_t)cols), (double)a[i], ref[i], d);
      shown++;
    }
  }
}

/* Max |x| over n values: the absolute tolerance behind a relative one, for printing. */
static double max_abs_d(const double *x, size_t n) {
  double m = 1e-30;
  size_t i;
  for (i = 0; i < n; i++) if (fabs(x[i]) > m) m = fabs(x[i]);
  return m;
}

static double max_abs_diff_d(const double *x, const double *y, size_t n) {
  double m = 1e-30;
  size_t i;
  for (i = 0; i < n; i++) if (fabs(x[i] - y[i]) > m) m = fabs(x[i] - y[i]);
  return m;
}

/* test_rel_err skips NaN (fabs(NaN) > x is false): count them separately. */
static size_t count_nonfinite(const float *a, size_t n) {
  size_t i, bad = 0;
  for (i = 0; i < n; i++) if (!(fabs((double)a[i]) <= 3.4e38)) bad++;
  return bad;
}

static int is_absent(const int *list, int n, int e) {
  int i;
  for (i = 0; i < n; i++) if (list[i] == e) return 1;
  return 0;
}

/* Case-wide worst errors, for one info line per case. */
static double case_param, case_update;

static void compare_matrix(golden_case *c, int e, int step) {
  mat_entry *m = &c->mat[e];
  int bf16 = c->groups[m->group].precision == MUON_PRECISION_BF16;
  size_t n = (size_t)m->rows * (size_t)m->cols, i;
  int k;
  if (is_absent(c->absent_mat, c->nabsent_mat, e)) {
    CHECK(memcmp(m->p, m->before, m->len * sizeof(float)) == 0,
          "step %d: matrix %d had no gradient but its param changed", step, e);
    return;
  }
  for (k = 0; k < m->slices; k++) {
    const float *p = m->p + (size_t)k * (size_t)m->s;
    const double *ref = m->ref + (size_t)k * (size_t)m->s, *p0 = m->p0 + (size_t)k * (size_t)m->s;
    double prel = test_rel_err(p, ref, n, NULL);
    double urel = update_rel_err(p, ref, p0, n);
    size_t bad = count_nonfinite(p, n);
    CHECK(bad == 0, "step %d: matrix %d slice %d: %lu non-finite params", step, e, k, (unsigned long)bad);
    if (prel > case_param) case_param = prel;
    if (urel > case_update) case_update = urel;
    if (bf16) {
      if (urel > worst_bf16_update) worst_bf16_update = urel;
      CHECK(urel <= BF16_UPDATE_TOL, "step %d: matrix %d slice %d (%dx%d, bf16): update rel err %.3g > %.3g",
            step, e, k, m->rows, m->cols, urel, BF16_UPDATE_TOL);
      if (urel > BF16_UPDATE_TOL)
        print_mismatches(p, ref, n, m->cols, BF16_UPDATE_TOL * max_abs_diff_d(ref, p0, n));
    } else {
      if (prel > worst_fp32_param) worst_fp32_param = prel;
      if (urel > worst_fp32_update) worst_fp32_update = urel;
      CHECK(prel <= FP32_PARAM_TOL, "step %d: matrix %d slice %d (%dx%d): param rel err %.3g > %.3g",
            step, e, k, m->rows, m->cols, prel, FP32_PARAM_TOL);
      CHECK(urel <= FP32_UPDATE_TOL, "step %d: matrix %d slice %d (%dx%d): update rel err %.3g > %.3g",
            step, e, k, m->rows, m->cols, urel, FP32_UPDATE_TOL);
      if (prel > FP32_PARAM_TOL || urel > FP32_UPDATE_TOL)
        print_mismatches(p, ref, n, m->cols, FP32_PARAM_TOL * max_abs_d(ref, n));
    }
  }
  /* padding between slices: bitwise untouched */
  for (k = 0; k + 1 < m->slices; k++) {
    size_t from = (size_t)k * (size_t)m->s + n, to = (size_t)(k + 1) * (size_t)m->s;
    for (i = from; i < to; i++) {
      if (m->p[i] != (float)m->p0[i]) {
        CHECK(0, "step %d: matrix %d: padding float %lu changed to %.9g", step, e, (unsigned long)i,
              (double)m->p[i]);
        break;
      }
    }
  }
}

static void compare_adamw(golden_case *c, int e, int step) {
  adamw_entry *a = &c->adamw[e];
  double prel, urel;
  if (is_absent(c->absent_adamw, c->nabsent_adamw, e)) {
    CHECK(memcmp(a->p, a->before, a->size * sizeof(float)) == 0,
          "step %d: AdamW param %d had no gradient but changed", step, e);
    return;
  }
  prel = test_rel_err(a->p, a->ref, a->size, NULL);
  urel = update_rel_err(a->p, a->ref, a->p0, a->size);
  CHECK(count_nonfinite(a->p, a->size) == 0, "step %d: AdamW param %d: non-finite values", step, e);
  if (prel > case_param) case_param = prel;
  if (urel > case_update) case_update = urel;
  if (prel > worst_adamw_param) worst_adamw_param = prel;
  if (urel > worst_adamw_update) worst_adamw_update = urel;
  CHECK(prel <= FP32_PARAM_TOL, "step %d: AdamW param %d (size %lu): param rel err %.3g > %.3g", step, e,
        (unsigned long)a->size, prel, FP32_PARAM_TOL);
  CHECK(urel <= FP32_UPDATE_TOL, "step %d: AdamW param %d (size %lu): update rel err %.3g > %.3g", step, e,
        (unsigned long)a->size, urel, FP32_UPDATE_TOL);
  if (prel > FP32_PARAM_TOL || urel > FP32_UPDATE_TOL)
    print_mismatches(a->p, a->ref, a->size, (int)a->size, FP32_PARAM_TOL * max_abs_d(a->ref, a->size));
}

/* Copies the library's momentum of every slice of m into dst (laid out like the params). */
static int snapshot_momentum(const muon_optimizer *opt, const mat_entry *m, float *dst, int step) {
  size_t n = (size_t)m->rows * (size_t)m->cols, size = 0;
  int k;
  for (k = 0; k < m->slices; k++) {
    const float *buf = NULL;
    muon_status st = muon_get_momentum(opt, m->index + k, &buf, &size);
    CHECK(st == MUON_OK && buf && size == n, "step %d: muon_get_momentum(%d): %s, size %lu (expected %lu)", step,
          m->index + k, muon_status_string(st), (unsigned long)size, (unsigned long)n);
    if (st != MUON_OK || !buf || size != n) return 0;
    memcpy(dst + (size_t)k * (size_t)m->s, buf, n * sizeof(float));
  }
  return 1;
}

/* The momentum buffer against the reference's B (SGD-style and lerp momentum give the same
   params, since NS does not see the scale of U: only the buffer tells them apart). */
static void compare_momentum(golden_case *c, const muon_optimizer *opt, int e, int step) {
  mat_entry *m = &c->mat[e];
  size_t n = (size_t)m->rows * (size_t)m->cols;
  float *now = (float *)xcalloc(m->len, sizeof(float));
  int k;
  if (snapshot_momentum(opt, m, now, step)) {
    if (is_absent(c->absent_mat, c->nabsent_mat, e)) {
      CHECK(memcmp(now, m->mom_before, m->len * sizeof(float)) == 0,
            "step %d: matrix %d had no gradient but its momentum changed", step, e);
    } else {
      for (k = 0; k < m->slices; k++) {
        const float *b = now + (size_t)k * (size_t)m->s;
        const double *ref = m->mom + (size_t)k * (size_t)m->s;
        double rel = test_rel_err(b, ref, n, NULL);
        if (rel > worst_momentum) worst_momentum = rel;
        CHECK(count_nonfinite(b, n) == 0 && rel <= FP32_PARAM_TOL,
              "step %d: matrix %d slice %d: momentum rel err %.3g > %.3g", step, e, k, rel, FP32_PARAM_TOL);
        if (rel > FP32_PARAM_TOL) print_mismatches(b, ref, n, m->cols, FP32_PARAM_TOL * max_abs_d(ref, n));
      }
    }
  }
  free(now);
}

/* ---------------------------------------------------------------------------------------------
   Building the optimizer */

static void check_defaults(const golden_case *c, const muon_desc *d) {
  const muon_hparams *h = &d->hparams, *e = &c->groups[0];
  const muon_adamw_hparams *ah = &d->adamw, *ae = &c->adamw_groups[0];
  int k;
  CHECK(h->lr == e->lr, "default lr %.9g, expected %.9g", (double)h->lr, (double)e->lr);
  CHECK(h->weight_decay == e->weight_decay, "default weight_decay %.9g, expected %.9g",
        (double)h->weight_decay, (double)e->weight_decay);
  CHECK(h->momentum == e->momentum, "default momentum %.9g, expected %.9g", (double)h->momentum,
        (double)e->momentum);
  CHECK(h->nesterov == e->nesterov, "default nesterov %d", h->nesterov);
  CHECK(h->momentum_style == e->momentum_style, "default momentum_style %d", (int)h->momentum_style);
  CHECK(h->adjust_lr == e->adjust_lr, "default adjust_lr %d", (int)h->adjust_lr);
  CHECK(h->ns_steps == e->ns_steps, "default ns_steps %d", h->ns_steps);
  CHECK(h->eps == e->eps, "default eps %.9g, expected %.9g", (double)h->eps, (double)e->eps);
  CHECK(h->precision == MUON_PRECISION_FP32, "default precision %d", (int)h->precision);
  CHECK(h->normuon == e->normuon && h->normuon == MUON_NORMUON_OFF, "default normuon %d", (int)h->normuon);
  CHECK(h->normuon_beta2 == e->normuon_beta2 && h->normuon_beta2 == 0.95f, "default normuon_beta2 %.9g",
        (double)h->normuon_beta2);
  for (k = 0; k < MUON_NS_MAX_STEPS; k++) {
    CHECK(h->ns_coefficients[k][0] == 3.4445f && h->ns_coefficients[k][1] == -4.7750f &&
              h->ns_coefficients[k][2] == 2.0315f,
          "default ns_coefficients[%d] = (%.9g, %.9g, %.9g), expected (3.4445, -4.7750, 2.0315)", k,
          (double)h->ns_coefficients[k][0], (double)h->ns_coefficients[k][1], (double)h->ns_coefficients[k][2]);
  }
  CHECK(ah->lr == ae->lr && ah->beta1 == ae->beta1 && ah->beta2 == ae->beta2 && ah->eps == ae->eps &&
            ah->weight_decay == ae->weight_decay,
        "default AdamW (%.9g, %.9g, %.9g, %.9g, %.9g), expected (%.9g, %.9g, %.9g, %.9g, %.9g)",
        (double)ah->lr, (double)ah->beta1, (double)ah->beta2, (double)ah->eps, (double)ah->weight_decay,
        (double)ae->lr, (double)ae->beta1, (double)ae->beta2, (double)ae->eps, (double)ae->weight_decay);
}

static muon_optimizer *build(golden_case *c) {
  muon_desc desc = muon_default_desc();
  muon_optimizer *opt = NULL;
  muon_status st;
  int i;
  if (c->defaults) {
    check_defaults(c, &desc);
  } else {
    desc.hparams = c->groups[0];
    desc.adamw = c->adamw_groups[0];
  }
  st = muon_create(&opt, &desc);
  CHECK(st == MUON_OK && opt, "muon_create: %s", muon_status_string(st));
  if (st != MUON_OK || !opt) return NULL;
  c->group_id[0] = 0;
  for (i = 1; i < c->ngroups; i++) {
    st = muon_add_group(opt, &c->groups[i], &c->group_id[i]);
    CHECK(st == MUON_OK, "muon_add_group %d: %s", i, muon_error(opt));
  }
  c->adamw_group_id[0] = 0;
  for (i = 1; i < c->nadamw_groups; i++) {
    st = muon_add_adamw_group(opt, &c->adamw_groups[i], &c->adamw_group_id[i]);
    CHECK(st == MUON_OK, "muon_add_adamw_group %d: %s", i, muon_error(opt));
  }
  for (i = 0; i < c->nmat; i++) {
    mat_entry *e = &c->mat[i];
    muon_matrix m = muon_default_matrix();
    m.name = "golden";
    m.param = e->p;
    m.grad = e->g;
    m.rows = e->rows;
    m.cols = e->cols;
    m.ndim = 2;
    m.count = e->count;
    m.stride = (size_t)e->stride;
    m.group = c->group_id[e->group];
    st = muon_add_matrix(opt, &m, &e->index);
    CHECK(st == MUON_OK, "muon_add_matrix %d: %s", i, muon_error(opt));
  }
  for (i = 0; i < c->nadamw; i++) {
    adamw_entry *e = &c->adamw[i];
    muon_adamw_param p = muon_default_adamw_param();
    p.name = "golden.adamw";
    p.param = e->p;
    p.grad = e->g;
    p.size = e->size;
    p.group = c->adamw_group_id[e->group];
    st = muon_add_adamw_param(opt, &p, &e->index);
    CHECK(st == MUON_OK, "muon_add_adamw_param %d: %s", i, muon_error(opt));
  }
  return opt;
}

static void run_step(golden_case *c, muon_optimizer *opt, int step) {
  int i;
  muon_status st;
  for (i = 0; i < c->nset_lr; i++) {
    st = muon_set_lr(opt, c->group_id[c->set_lr_group[i]], c->set_lr_value[i]);
    CHECK(st == MUON_OK, "step %d: muon_set_lr: %s", step, muon_error(opt));
  }
  for (i = 0; i < c->nabsent_mat; i++) {
    st = muon_set_grad(opt, c->mat[c->absent_mat[i]].index, NULL);
    CHECK(st == MUON_OK, "step %d: muon_set_grad(NULL): %s", step, muon_error(opt));
  }
  for (i = 0; i < c->nabsent_adamw; i++) {
    st = muon_set_adamw_grad(opt, c->adamw[c->absent_adamw[i]].index, NULL);
    CHECK(st == MUON_OK, "step %d: muon_set_adamw_grad(NULL): %s", step, muon_error(opt));
  }
  for (i = 0; i < c->nmat; i++) {
    memcpy(c->mat[i].before, c->mat[i].p, c->mat[i].len * sizeof(float));
    snapshot_momentum(opt, &c->mat[i], c->mat[i].mom_before, step);
  }
  for (i = 0; i < c->nadamw; i++) memcpy(c->adamw[i].before, c->adamw[i].p, c->adamw[i].size * sizeof(float));
  st = muon_step(opt);
  CHECK(st == MUON_OK, "step %d: muon_step: %s (%s)", step, muon_status_string(st), muon_error(opt));
  for (i = 0; i < c->nmat; i++) {
    compare_matrix(c, i, step);
    compare_momentum(c, opt, i, step);
  }
  for (i = 0; i < c->nadamw; i++) compare_adamw(c, i, step);
  /* the gradient comes back for the next step */
  for (i = 0; i < c->nabsent_mat; i++) {
    st = muon_set_grad(opt, c->mat[c->absent_mat[i]].index, c->mat[c->absent_mat[i]].g);
    CHECK(st == MUON_OK, "step %d: muon_set_grad: %s", step, muon_error(opt));
  }
  for (i = 0; i < c->nabsent_adamw; i++) {
    st = muon_set_adamw_grad(opt, c->adamw[c->absent_adamw[i]].index, c->adamw[c->absent_adamw[i]].g);
    CHECK(st == MUON_OK, "step %d: muon_set_adamw_grad: %s", step, muon_error(opt));
  }
}

/* ---------------------------------------------------------------------------------------------
   One case file, parsed as it runs */

static char case_title[400];

static void run_case(const char *path) {
  static golden_case c; /* large: keep it off the stack */
  FILE *f = fopen(path, "rb");
  char line[1024];
  muon_optimizer *opt = NULL;
  int step = 0, steps_done = 0, nsteps = -1, ok = 1, bf16_case = 0;

  memset(&c, 0, sizeof c);
  case_param = case_update = 0;
  snprintf(case_title, sizeof case_title, "golden: %.300s", path);
  TEST_CASE(case_title);
  if (!f) { CHECK(0, "cannot open %s", path); return; }
  if (!fgets(line, sizeof line, f) || strncmp(line, "muon-golden 1", 13) != 0) {
    CHECK(0, "%s: not a muon-golden 1 file", path);
    fclose(f);
    return;
  }
  while (ok && fgets(line, sizeof line, f)) {
    char kind[64];
    int e = 0, gi = 0;
    unsigned long n = 0;
    line[strcspn(line, "\n")] = 0;
    if (strncmp(line, "name ", 5) == 0) {
      copy_text(c.name, sizeof c.name, line + 5);
    } else if (sscanf(line, "defaults %d", &c.defaults) == 1) {
    } else if (strncmp(line, "group ", 6) == 0) {
      double lr, wd, mu, eps;
      double nm_beta2 = 0.95;
      int nest, style, adj, steps, preset, prec, cautious = 0, nm = 0, got;
      got = sscanf(line, "group %d %lf %lf %lf %d %d %d %d %d %d %lf %d %d %lf", &gi, &lr, &wd, &mu, &nest, &style,
                   &adj, &steps, &preset, &prec, &eps, &cautious, &nm, &nm_beta2);
      ok = got >= 11 && got <= 14 && gi == c.ngroups && gi < MAX_GROUPS;
      if (ok) {
        muon_hparams *h = &c.groups[gi];
        *h = muon_default_hparams();
        h->lr = (float)lr;
        h->weight_decay = (float)wd;
        h->momentum = (float)mu;
        h->nesterov = nest;
        h->momentum_style = (muon_momentum_style)style;
        h->adjust_lr = (muon_adjust_lr)adj;
        h->ns_steps = steps;
        if (preset >= 0) muon_set_ns_preset(h, (muon_ns_preset)preset);
        h->precision = (muon_precision)prec;
        h->eps = (float)eps;
        h->cautious_wd = cautious;
        h->normuon = (muon_normuon)nm;          /* absent: MUON_NORMUON_OFF */
        h->normuon_beta2 = (float)nm_beta2;     /* absent: 0.95 */
        c.group_preset[gi] = preset;
        if (prec == 1) bf16_case = 1;
        c.ngroups++;
      }
    } else if (strncmp(line, "adamw_group ", 12) == 0) {
      double lr, b1, b2, eps, wd;
      int cautious = 0, got = sscanf(line, "adamw_group %d %lf %lf %lf %lf %lf %d", &gi, &lr, &b1, &b2, &eps, &wd, &cautious);
      ok = (got == 6 || got == 7) && gi == c.nadamw_groups && gi < MAX_GROUPS;
      if (ok) {
        muon_adamw_hparams *h = &c.adamw_groups[gi];
        *h = muon_default_adamw_hparams();
        h->lr = (float)lr;
        h->beta1 = (float)b1;
        h->beta2 = (float)b2;
        h->eps = (float)eps;
        h->weight_decay = (float)wd;
        h->cautious_wd = cautious;
        c.nadamw_groups++;
      }
    } else if (strncmp(line, "matrix ", 7) == 0) {
      mat_entry *m;
      ok = c.nmat < MAX_ENTRIES;
      if (ok) {
        m = &c.mat[c.nmat];
        ok = sscanf(line, "matrix %d %d %d %d %d %d", &e, &m->rows, &m->cols, &m->count, &m->stride, &m->group) ==
                 6 && e == c.nmat && m->group < c.ngroups;
        if (ok) {
          m->slices = m->count > 1 ? m->count : 1;
          m->s = m->stride ? m->stride : m->rows * m->cols;
          m->len = (size_t)(m->slices - 1) * (size_t)m->s + (size_t)m->rows * (size_t)m->cols;
          /* exact sizes, so the sanitizers catch any read or write past a buffer */
          m->p = (float *)xcalloc(m->len, sizeof(float));
          m->g = (float *)xcalloc(m->len, sizeof(float));
          m->before = (float *)xcalloc(m->len, sizeof(float));
          m->p0 = (double *)xcalloc(m->len, sizeof(double));
          m->ref = (double *)xcalloc(m->len, sizeof(double));
          m->mom = (double *)xcalloc(m->len, sizeof(double));
          m->mom_before = (float *)xcalloc(m->len, sizeof(float));
          c.nmat++;
        }
      }
    } else if (strncmp(line, "adamw ", 6) == 0) {
      adamw_entry *a;
      unsigned long size = 0;
      ok = c.nadamw < MAX_ENTRIES;
      if (ok) {
        a = &c.adamw[c.nadamw];
        ok = sscanf(line, "adamw %d %lu %d", &e, &size, &a->group) == 3 && e == c.nadamw &&
             a->group < c.nadamw_groups;
        if (ok) {
          a->size = (size_t)size;
          a->p = (float *)xcalloc(a->size, sizeof(float));
          a->g = (float *)xcalloc(a->size, sizeof(float));
          a->before = (float *)xcalloc(a->size, sizeof(float));
          a->p0 = (double *)xcalloc(a->size, sizeof(double));
          a->ref = (double *)xcalloc(a->size, sizeof(double));
          c.nadamw++;
        }
      }
    } else if (sscanf(line, "arr %63s %d %lu", kind, &e, &n) == 3) {
      int is_mat = strncmp(kind, "matrix_", 7) == 0;
      ok = e >= 0 && e < (is_mat ? c.nmat : c.nadamw);
      if (!ok) break;
      if (is_mat) {
        mat_entry *m = &c.mat[e];
        if (strcmp(kind, "matrix_p0") == 0) {
          size_t i;
          ok = read_arr(f, n, m->len, m->p0, kind);
          if (ok) for (i = 0; i < m->len; i++) m->p[i] = (float)m->p0[i];
        } else if (strcmp(kind, "matrix_grad") == 0) {
          ok = read_arr_float(f, n, m->len, m->g, kind);
        } else if (strcmp(kind, "matrix_ref") == 0) {
          ok = read_arr(f, n, m->len, m->ref, kind);
        } else if (strcmp(kind, "matrix_mom") == 0) {
          ok = read_arr(f, n, m->len, m->mom, kind);
        } else {
          ok = 0;
        }
      } else {
        adamw_entry *a = &c.adamw[e];
        if (strcmp(kind, "adamw_p0") == 0) {
          size_t i;
          ok = read_arr(f, n, a->size, a->p0, kind);
          if (ok) for (i = 0; i < a->size; i++) a->p[i] = (float)a->p0[i];
        } else if (strcmp(kind, "adamw_grad") == 0) {
          ok = read_arr_float(f, n, a->size, a->g, kind);
        } else if (strcmp(kind, "adamw_ref") == 0) {
          ok = read_arr(f, n, a->size, a->ref, kind);
        } else {
          ok = 0;
        }
      }
    } else if (sscanf(line, "steps %d", &nsteps) == 1) {
      snprintf(case_title, sizeof case_title, "golden: %s [%s]", c.name,
               bf16_case ? BF16_TOL_TEXT : "fp32: within 1e-5 of max |param|, 3e-4 of max |update|");
      opt = build(&c);
      ok = opt != NULL;
    } else if (sscanf(line, "step %d", &step) == 1) {
      c.nset_lr = c.nabsent_mat = c.nabsent_adamw = 0;
      ok = opt != NULL;
    } else if (strncmp(line, "set_lr ", 7) == 0) {
      double lr;
      ok = c.nset_lr < MAX_EVENTS && sscanf(line, "set_lr %d %lf", &gi, &lr) == 2 && gi < c.ngroups;
      if (ok) {
        c.set_lr_group[c.nset_lr] = gi;
        c.set_lr_value[c.nset_lr++] = (float)lr;
      }
    } else if (sscanf(line, "absent_matrix %d", &e) == 1) {
      ok = c.nabsent_mat < MAX_EVENTS && e >= 0 && e < c.nmat;
      if (ok) c.absent_mat[c.nabsent_mat++] = e;
    } else if (sscanf(line, "absent_adamw %d", &e) == 1) {
      ok = c.nabsent_adamw < MAX_EVENTS && e >= 0 && e < c.nadamw;
      if (ok) c.absent_adamw[c.nabsent_adamw++] = e;
    } else if (strcmp(line, "end") == 0) {
      ok = opt != NULL;
      if (ok) {
        run_step(&c, opt, step);
        steps_done++;
        if (test__case_failed) break; /* the first failing step is enough */
      }
    } else {
      ok = 0;
    }
    if (!ok) CHECK(0, "%s: cannot use line '%s'", path, line);
  }
  if (!test__case_failed) CHECK(steps_done == nsteps, "%s: ran %d of %d steps", path, steps_done, nsteps);
  printf("  [golden] %-75s worst param rel %.2e, update rel %.2e\n", c.name, case_param, case_update);
  fclose(f);
  muon_destroy(opt);
  free_case(&c);
}

/* ---------------------------------------------------------------------------------------------
   NorMuon of one NS operand: muon__normuon (static, reachable since this file includes muon.h)
   against the reference's normuon() (tests/ref_muon.py, normuon.list): every element of X and of
   the new second moment within NORMUON_TOL of the reference, relative to that element itself
   (not to the largest: a statistic 1e-9 smaller than the rest must be right too), and v only
   read. The C takes the norms from the q_i in double and rounds v, s and the factor to float:
   a few float ulps. */
#define NORMUON_TOL 2e-6
static double worst_normuon_x, worst_normuon_v;

/* max over i of |a - ref| / |ref| (0/0 = 0; a nonzero difference from a zero reference: inf). */
static double elem_rel_err(const float *a, const double *ref, size_t n, size_t *at) {
  double worst = 0;
  size_t i;
  *at = 0;
  for (i = 0; i < n; i++) {
    double d = fabs((double)a[i] - ref[i]), r;
    if (d != d) { *at = i; return HUGE_VAL; }
    r = d == 0 ? 0 : (ref[i] == 0 ? HUGE_VAL : d / fabs(ref[i]));
    if (r > worst) { worst = r; *at = i; }
  }
  return worst;
}

static void run_normuon_case(const char *path) {
  FILE *f = fopen(path, "rb");
  char line[1024], name[256] = "";
  int m = 0, n = 0, per_column = 0, kind = 0, ok = 1, done = 0, len = 0;
  double beta2 = 0;
  float *x = NULL, *v = NULL, *v_keep = NULL, *v_new = NULL;
  double *out = NULL, *vref = NULL;
  snprintf(case_title, sizeof case_title, "normuon: %.300s", path);
  TEST_CASE(case_title);
  if (!f) { CHECK(0, "cannot open %s", path); return; }
  if (!fgets(line, sizeof line, f) || strncmp(line, "muon-normuon 1", 14) != 0) {
    CHECK(0, "%s: not a muon-normuon 1 file", path);
    fclose(f);
    return;
  }
  while (ok && !done && fgets(line, sizeof line, f)) {
    char kindname[64];
    int e = 0;
    unsigned long cnt = 0;
    line[strcspn(line, "\n")] = 0;
    if (strncmp(line, "name ", 5) == 0) {
      copy_text(name, sizeof name, line + 5);
    } else if (sscanf(line, "normuon %d %d %d %d %lf", &m, &n, &per_column, &kind, &beta2) == 5) {
      ok = !x && m >= 1 && n >= m && (per_column == 0 || per_column == 1) &&
           (kind == MUON_NORMUON_ROWS || kind == MUON_NORMUON_LARGER);
      if (ok) {
        len = per_column ? n : m;
        x = (float *)xcalloc((size_t)m * (size_t)n, sizeof(float));
        out = (double *)xcalloc((size_t)m * (size_t)n, sizeof(double));
        v = (float *)xcalloc((size_t)len, sizeof(float));
        v_keep = (float *)xcalloc((size_t)len, sizeof(float));
        v_new = (float *)xcalloc((size_t)len, sizeof(float));
        vref = (double *)xcalloc((size_t)len, sizeof(double));
        snprintf(case_title, sizeof case_title, "normuon: %s [each element within %g of the reference's]", name,
                 NORMUON_TOL);
      }
    } else if (sscanf(line, "arr %63s %d %lu", kindname, &e, &cnt) == 3) {
      size_t mn = (size_t)m * (size_t)n;
      ok = x != NULL && e == 0;
      if (!ok) break;
      if (strcmp(kindname, "nm_x") == 0) ok = read_arr_float(f, cnt, mn, x, kindname);
      else if (strcmp(kindname, "nm_v") == 0) ok = read_arr_float(f, cnt, (size_t)len, v, kindname);
      else if (strcmp(kindname, "nm_out") == 0) ok = read_arr(f, cnt, mn, out, kindname);
      else if (strcmp(kindname, "nm_v_new") == 0) ok = read_arr(f, cnt, (size_t)len, vref, kindname);
      else ok = 0;
    } else if (strcmp(line, "end") == 0) {
      ok = x != NULL;
      done = 1;
    } else {
      ok = 0;
    }
    if (!ok) CHECK(0, "%s: cannot use line '%s'", path, line);
  }
  if (ok && done) {
    size_t mn = (size_t)m * (size_t)n, at = 0;
    double ex, ev;
    memcpy(v_keep, v, (size_t)len * sizeof(float));
    muon__normuon(x, m, n, per_column, v, v_new, kind, (float)beta2);
    CHECK(memcmp(v, v_keep, (size_t)len * sizeof(float)) == 0, "v changed: it is only read");
    ex = elem_rel_err(x, out, mn, &at);
    CHECK(ex <= NORMUON_TOL, "X: element rel err %.3g > %g at [%lu,%lu]: got %.9g expected %.9g", ex, NORMUON_TOL,
          (unsigned long)(at / (size_t)n), (unsigned long)(at % (size_t)n), (double)x[at], out[at]);
    ev = elem_rel_err(v_new, vref, (size_t)len, &at);
    CHECK(ev <= NORMUON_TOL, "v_new: element rel err %.3g > %g at [%lu]: got %.9g expected %.9g", ev, NORMUON_TOL,
          (unsigned long)at, (double)v_new[at], vref[at]);
    if (ex > worst_normuon_x) worst_normuon_x = ex;
    if (ev > worst_normuon_v) worst_normuon_v = ev;
    printf("  [normuon] %-75s X rel %.2e, v rel %.2e\n", name, ex, ev);
  } else if (ok) {
    CHECK(0, "%s: no 'end' line", path);
  }
  fclose(f);
  free(x); free(out); free(v); free(v_keep); free(v_new); free(vref);
}

int main(int argc, char **argv) {
  char path[1024], name[256];
  FILE *list;
  int ncases = 0;
  if (argc != 2) {
    fprintf(stderr, "usage: %s CASE_DIR   (make it with: /usr/bin/python3 tests/ref_muon.py CASE_DIR)\n", argv[0]);
    return 2;
  }
  snprintf(path, sizeof path, "%s/golden.list", argv[1]);
  list = fopen(path, "r");
  if (!list) {
    TEST_CASE("golden: case list");
    CHECK(0, "cannot open %s (make it with: /usr/bin/python3 tests/ref_muon.py %s)", path, argv[1]);
    return test_summary();
  }
  while (fgets(name, sizeof name, list)) {
    name[strcspn(name, "\r\n")] = 0;
    if (!name[0]) continue;
    snprintf(path, sizeof path, "%s/%s", argv[1], name);
    run_case(path);
    ncases++;
  }
  fclose(list);
  TEST_CASE("golden: case list is not empty");
  CHECK(ncases > 0, "no cases in %s/golden.list", argv[1]);

  snprintf(path, sizeof path, "%s/normuon.list", argv[1]);
  list = fopen(path, "r");
  TEST_CASE("normuon: case list");
  CHECK(list != NULL, "cannot open %s (make it with: /usr/bin/python3 tests/ref_muon.py %s)", path, argv[1]);
  ncases = 0;
  while (list && fgets(name, sizeof name, list)) {
    name[strcspn(name, "\r\n")] = 0;
    if (!name[0]) continue;
    snprintf(path, sizeof path, "%s/%s", argv[1], name);
    run_normuon_case(path);
    ncases++;
  }
  if (list) fclose(list);
  TEST_CASE("normuon: case list is not empty");
  CHECK(ncases > 0, "no cases in %s/normuon.list", argv[1]);
  printf("  [normuon] worst over all operand cases: X element rel %.2e, v element rel %.2e\n", worst_normuon_x,
         worst_normuon_v);
  printf("  [golden] worst over all cases: fp32 Muon param rel %.2e, update rel %.2e; bf16 update rel %.2e; "
         "AdamW param rel %.2e, update rel %.2e; momentum rel %.2e\n",
         worst_fp32_param, worst_fp32_update, worst_bf16_update, worst_adamw_param, worst_adamw_update,
         worst_momentum);
  return test_summary();
}
