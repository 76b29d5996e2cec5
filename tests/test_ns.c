/* test_ns.c - muon_newton_schulz alone against the numpy float64 reference (tests/ref_muon.py).

   Usage:  /usr/bin/python3 tests/ref_muon.py build/golden && build/test_ns build/golden

   For every case of build/golden/ns.list (format: the doc string of tests/ref_muon.py), and for
   hp.symmetric = 0 and 1 and every GEMM path compiled in (MUON_GEMM_AUTO and MUON_GEMM_BUILTIN;
   plus MUON_GEMM_CBLAS when built with -DMUON_USE_CBLAS ... -lopenblas):
   - fp32: max |out - ref| / max |ref| <= 1e-5 (or the case's own "tol" line: an ill-conditioned
     input amplifies fp32 rounding, 2e-4 there);
     bf16: <= 4e-2 (observed worst 1.25e-2; numpy simulations of fp32-accumulating bf16 NS reach
     2.1e-2: a bf16 ulp is 2^-8 = 3.9e-3 and the C side accumulates in fp32 where the reference
     accumulates in float64, so now and then a rounding lands on the other side and NS spreads
     it), and every output is a bf16 value (low 16 bits zero): the error bound alone cannot tell
     bf16 from fp32 NS, which differ by ~1.5e-2;
   - two calls give identical bits (determinism), in-place (in == out) gives the same bits, and
     the input is not modified;
   - the output holds no NaN/Inf (an all-zero input must give zeros: the eps path).
   MUON_GEMM_AUTO runs muon_newton_schulz itself; the others a CPU backend made with that
   muon_cpu_desc.gemm (its pack and newton_schulz slots, as muon_newton_schulz uses them).
   Without MUON_USE_CBLAS, MUON_GEMM_CBLAS must be MUON_ERR_ARG. Gram's restart bits, bitwise
   against the iteration split where the restart goes. Builds as C99 and C++. */
#define MUON_IMPLEMENTATION
#include "../muon.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NS_FP32_TOL 1e-5
#define NS_BF16_TOL 4e-2
#define NS_GRAM_FP32_TOL 1e-5   /* as the standard iteration: 3.7e-6 measured (built-in GEMM and
                                   OpenBLAS); R <- P^2 R in place of the reference's P (R P) loses
                                   1.5e-4 to 3.5e-4 with Polar Express, P (R P) unmirrored 2.4e-5 */

static double worst_fp32, worst_bf16;

static int host_is_little_endian(void) {
  unsigned int one = 1;
  unsigned char c;
  memcpy(&c, &one, 1);
  return c == 1;
}

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

static size_t count_nonfinite(const float *a, size_t n) {
  size_t i, bad = 0;
  for (i = 0; i < n; i++) if (!(fabs((double)a[i]) <= 3.4e38)) bad++;
  return bad;
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

typedef struct ns_case {
  char name[256];
  int rows, cols, steps, preset, precision, algorithm;
  unsigned restarts;
  double eps;
  double tol;                /* 0, or the case's own fp32 bound ("tol" line) */
  float *in;
  double *out;
  double *polar;             /* Gram cases: the exact polar factor */
} ns_case;

/* |O - polar|_F / |polar|_F */
static double polar_distance(const float *o, const double *polar, size_t n) {
  double num = 0, den = 0;
  size_t i;
  for (i = 0; i < n; i++) { num += ((double)o[i] - polar[i]) * ((double)o[i] - polar[i]); den += polar[i] * polar[i]; }
  return sqrt(num / (den > 0 ? den : 1));
}

static const char *gemm_name(muon_gemm g) {
  return g == MUON_GEMM_AUTO ? "auto" : g == MUON_GEMM_BUILTIN ? "builtin" : "cblas";
}

static char title[512];

/* muon_newton_schulz on a CPU backend with the GEMM `gemm` (MUON_GEMM_AUTO: the function itself). */
static muon_status ns_with(muon_gemm gemm, const float *in, int rows, int cols, float *out, const muon_hparams *hp) {
  muon_cpu_desc cd = muon_cpu_default_desc();
  muon_compute c;
  muon_piece_copy op;
  int m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
  float *X;
  void *ws;
  muon_status st;
  if (gemm == MUON_GEMM_AUTO) return muon_newton_schulz(in, rows, cols, out, hp);
  cd.gemm = gemm;
  cd.threads.count = 1;
  if ((st = muon_cpu_create(&c, &cd)) != MUON_OK) return st;
  X = (float *)malloc((size_t)m * n * sizeof(float));
  ws = malloc(c.vt->ns_workspace(c.ctx, 1, m, n, hp) + 1);
  op = muon__whole(rows, cols, 0, 0);
  if (!X || !ws) st = MUON_ERR_NOMEM;
  else if ((st = c.vt->pack(c.ctx, &op, 1, (float *)in, X, 1)) == MUON_OK &&
           (st = c.vt->newton_schulz(c.ctx, X, 1, m, n, hp, ws)) == MUON_OK)
    st = c.vt->pack(c.ctx, &op, 1, out, X, 0);
  free(X);
  free(ws);
  muon_compute_destroy(&c);
  return st;
}

static void run_variant(const ns_case *c, muon_gemm gemm) {
  size_t n = (size_t)c->rows * (size_t)c->cols, bad;
  float *out = (float *)xcalloc(n, sizeof(float));
  float *out2 = (float *)xcalloc(n, sizeof(float));
  float *inplace = (float *)xcalloc(n, sizeof(float));
  float *in = (float *)xcalloc(n, sizeof(float));
  double tol = c->tol > 0 ? c->tol : c->precision ? NS_BF16_TOL : c->algorithm == 1 ? NS_GRAM_FP32_TOL : NS_FP32_TOL, worst = 0;
  int sym;
  snprintf(title, sizeof title, "ns: %s [gemm %s, symmetric 0 and 1; %s within %g of max |ref|]", c->name,
           gemm_name(gemm), c->precision ? "bf16" : "fp32", tol);
  TEST_CASE(title);
  for (sym = 0; sym <= 1; sym++) {
    muon_hparams hp = muon_default_hparams();
    muon_status st;
    double rel;
    hp.ns_steps = c->steps;
    muon_set_ns_preset(&hp, (muon_ns_preset)c->preset);
    hp.precision = (muon_precision)c->precision;
    hp.eps = (float)c->eps;
    hp.symmetric = sym;
    hp.ns_algorithm = (muon_ns_algorithm)c->algorithm;
    hp.ns_restarts = c->restarts;
    memcpy(in, c->in, n * sizeof(float));
    st = ns_with(gemm, in, c->rows, c->cols, out, &hp);
    CHECK(st == MUON_OK, "symmetric %d: muon_newton_schulz: %s", sym, muon_status_string(st));
    if (st != MUON_OK) continue;
    CHECK(memcmp(in, c->in, n * sizeof(float)) == 0, "symmetric %d: the input was modified", sym);
    bad = count_nonfinite(out, n);
    CHECK(bad == 0, "symmetric %d: %lu non-finite outputs", sym, (unsigned long)bad);
    if (c->precision) {
      size_t i, notbf16 = 0;
      for (i = 0; i < n; i++) {
        unsigned int u;
        memcpy(&u, &out[i], sizeof u);
        if (u & 0xFFFFu) notbf16++;
      }
      CHECK(notbf16 == 0, "symmetric %d: bf16 mode: %lu of %lu outputs are not bf16 values", sym,
            (unsigned long)notbf16, (unsigned long)n);
    }
    rel = test_rel_err(out, c->out, n, NULL);
    if (rel > worst) worst = rel;
    CHECK(rel <= tol, "symmetric %d: rel err %.3g > %.3g", sym, rel, tol);
    if (rel > tol) {
      double m = 1e-30;
      size_t i;
      for (i = 0; i < n; i++) if (fabs(c->out[i]) > m) m = fabs(c->out[i]);
      print_mismatches(out, c->out, n, c->cols, tol * m);
    }
#if defined(__SANITIZE_ADDRESS__)
    if (n >= 98304) continue;   /* under ASan the repeats of a real-size case take a minute; once is the memory check */
#endif
    /* determinism: the same call again gives the same bits */
    st = ns_with(gemm, in, c->rows, c->cols, out2, &hp);
    CHECK(st == MUON_OK && memcmp(out, out2, n * sizeof(float)) == 0,
          "symmetric %d: a second call gave different bits", sym);
    /* in place */
    memcpy(inplace, c->in, n * sizeof(float));
    st = ns_with(gemm, inplace, c->rows, c->cols, inplace, &hp);
    CHECK(st == MUON_OK && memcmp(out, inplace, n * sizeof(float)) == 0,
          "symmetric %d: in-place (in == out) gave different bits", sym);
    if (c->polar) {   /* Gram computes standard NS's polynomial: as far from the polar factor */
      double dg = polar_distance(out, c->polar, n), ds, lim = c->precision ? 2e-2 : NS_GRAM_FP32_TOL;
      hp.ns_algorithm = MUON_NS_STANDARD;
      st = ns_with(gemm, in, c->rows, c->cols, out2, &hp);
      ds = polar_distance(out2, c->polar, n);
      CHECK(st == MUON_OK && fabs(dg - ds) <= lim,
            "symmetric %d: distance to the polar factor: Gram %.6g, standard %.6g (limit %.0e apart)", sym, dg, ds,
            lim);
      if (sym) printf("  [ns] %-45s gemm %-7s distance to the polar factor: Gram %.6f, standard %.6f (%s)\n", c->name, gemm_name(gemm), dg, ds,
                      c->precision ? "bf16" : "fp32");
    }
  }
  if (c->precision) { if (worst > worst_bf16) worst_bf16 = worst; }
  else if (worst > worst_fp32) worst_fp32 = worst;
  printf("  [ns] %-45s gemm %-7s worst rel err %.2e\n", c->name, gemm_name(gemm), worst);
  free(out);
  free(out2);
  free(inplace);
  free(in);
}

static void run_case(const char *path) {
  ns_case c;
  FILE *f = fopen(path, "rb");
  char line[512];
  int ok = 0;
  size_t n = 0;
  memset(&c, 0, sizeof c);
  snprintf(title, sizeof title, "ns: %.300s", path);
  TEST_CASE(title);
  if (!f) { CHECK(0, "cannot open %s", path); return; }
  while (fgets(line, sizeof line, f)) {
    char kind[32];
    int e;
    unsigned long cnt;
    line[strcspn(line, "\n")] = 0;
    if (strncmp(line, "muon-ns 1", 9) == 0) continue;
    if (strncmp(line, "name ", 5) == 0) {
      copy_text(c.name, sizeof c.name, line + 5);
    } else if (strncmp(line, "ns ", 3) == 0 &&
               sscanf(line, "ns %d %d %d %d %d %lf %d %u", &c.rows, &c.cols, &c.steps, &c.preset, &c.precision, &c.eps,
                      &c.algorithm, &c.restarts) >= 6) {
      n = (size_t)c.rows * (size_t)c.cols;
      c.in = (float *)xcalloc(n, sizeof(float));
      c.out = (double *)xcalloc(n, sizeof(double));
    } else if (sscanf(line, "tol %lf", &c.tol) == 1) {   /* a case's own bound, with its reason in ref_muon.py */
    } else if (sscanf(line, "arr %31s %d %lu", kind, &e, &cnt) == 3 && c.in && cnt == n) {
      if (strcmp(kind, "ns_in") == 0) {
        double *tmp = (double *)xcalloc(n, sizeof(double));
        size_t i;
        if (!read_f64(f, tmp, n)) break;
        for (i = 0; i < n; i++) c.in[i] = (float)tmp[i];
        free(tmp);
      } else if (strcmp(kind, "ns_out") == 0) {
        if (!read_f64(f, c.out, n)) break;
      } else if (strcmp(kind, "ns_polar") == 0) {
        c.polar = (double *)xcalloc(n, sizeof(double));
        if (!read_f64(f, c.polar, n)) break;
      } else {
        break;
      }
    } else if (strcmp(line, "end") == 0) {
      ok = 1;
      break;
    } else {
      break;
    }
  }
  fclose(f);
  CHECK(ok, "%s: cannot parse line '%s'", path, line);
  if (ok) {
    size_t m = (size_t)(c.rows < c.cols ? c.rows : c.cols), nn = (size_t)(c.rows < c.cols ? c.cols : c.rows);
    size_t ws = muon_ns_workspace_floats(c.rows, c.cols), k = nn >= 2 * m ? 5 : 2;
    CHECK(ws <= 2 * m * nn + k * m * m, "muon_ns_workspace_floats(%d, %d) = %lu > 2mn + %lum^2 = %lu", c.rows,
          c.cols, (unsigned long)ws, (unsigned long)k, (unsigned long)(2 * m * nn + k * m * m));
    /* Real layer sizes (the packed GEMM path) cost seconds: without CBLAS, AUTO is BUILTIN there. */
#ifndef MUON_USE_CBLAS
    if ((size_t)c.rows * (size_t)c.cols < 98304)
#endif
      run_variant(&c, MUON_GEMM_AUTO);
    run_variant(&c, MUON_GEMM_BUILTIN);
#ifdef MUON_USE_CBLAS
    run_variant(&c, MUON_GEMM_CBLAS);
#endif
  }
  free(c.in);
  free(c.out);
  free(c.polar);
}

/* Gram NS's restart bit k restarts before iteration k: j iterations, then the rest as a fresh Gram
   iteration from the X they left, are bit for bit one call with ns_restarts = 1 << j (a restart
   only changes rounding, so no tolerance against numpy can tell where it happens). */
static void gram_restart_case(int j, int bf16) {
  enum { M = 6, N = 20 };
  float X[M * N], Y[M * N];
  float *ws = (float *)malloc(muon__ns_ws_floats(M, N, 1) * sizeof(float));
  muon_hparams hp = muon_default_hparams(), h1, h2;
  muon__gemm_ctx g;
  int k;
  size_t i;
  char title[96];
  snprintf(title, sizeof title, "ns: Gram restart bit %d is a restart before iteration %d (%s)", j, j,
           bf16 ? "bf16" : "fp32");
  TEST_CASE(title);
  if (!ws) { CHECK(0, "malloc"); return; }
  muon_set_ns_preset(&hp, MUON_NS_POLAR_EXPRESS);
  hp.ns_algorithm = MUON_NS_GRAM;
  hp.ns_steps = 5;
  hp.precision = bf16 ? MUON_PRECISION_BF16 : MUON_PRECISION_FP32;
  for (i = 0; i < (size_t)M * N; i++) X[i] = (float)(0.05 * (double)((i * 37u) % 23u) - 0.5) / 9.0f;
  memcpy(Y, X, sizeof X);
  memset(&g, 0, sizeof g);
  g.symmetric = hp.symmetric;
  g.pack = ws + (size_t)M * N + 5 * (size_t)M * M;
  g.pack_floats = muon__ns_pack_floats(M, N);
  g.packs = g.pack + g.pack_floats;
  hp.ns_restarts = 1u << j;
  muon__gram_iterations(X, M, N, &hp, ws, &g, bf16);
  h1 = hp; h1.ns_steps = j; h1.ns_restarts = 0;
  h2 = hp; h2.ns_steps = hp.ns_steps - j; h2.ns_restarts = 0;
  for (k = 0; k < h2.ns_steps; k++) memcpy(h2.ns_coefficients[k], hp.ns_coefficients[k + j], sizeof h2.ns_coefficients[k]);
  muon__gram_iterations(Y, M, N, &h1, ws, &g, bf16);
  muon__gram_iterations(Y, M, N, &h2, ws, &g, bf16);
  CHECK(memcmp(X, Y, sizeof X) == 0, "restart bit %d: not bitwise %d iterations then %d fresh ones", j, j, h2.ns_steps);
  free(ws);
}

int main(int argc, char **argv) {
  char path[1024], name[256];
  FILE *list;
  int ncases = 0;
  if (argc != 2) {
    fprintf(stderr, "usage: %s CASE_DIR   (make it with: /usr/bin/python3 tests/ref_muon.py CASE_DIR)\n", argv[0]);
    return 2;
  }
  snprintf(path, sizeof path, "%s/ns.list", argv[1]);
  list = fopen(path, "r");
  if (!list) {
    TEST_CASE("ns: case list");
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
  TEST_CASE("ns: case list is not empty");
  CHECK(ncases > 0, "no cases in %s/ns.list", argv[1]);

  gram_restart_case(1, 0);
  gram_restart_case(2, 0);
  gram_restart_case(3, 1);

#ifndef MUON_USE_CBLAS
  TEST_CASE("ns: MUON_GEMM_CBLAS without MUON_USE_CBLAS is MUON_ERR_ARG");
  {
    float x[6] = {1, 2, 3, 4, 5, 6}, y[6];
    muon_hparams hp = muon_default_hparams();
    muon_status st;
    st = ns_with(MUON_GEMM_CBLAS, x, 2, 3, y, &hp);
    CHECK(st == MUON_ERR_ARG, "got %s", muon_status_string(st));
  }
#endif
  printf("  [ns] worst over all cases: fp32 %.2e, bf16 %.2e\n", worst_fp32, worst_bf16);
  return test_summary();
}
