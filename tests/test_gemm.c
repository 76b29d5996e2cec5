/* test_gemm.c - the built-in GEMM (muon__sgemm, muon__ssyrk) against the float64 oracle
   muon__sgemm_naive.

   Why: in builds without CBLAS every Newton-Schulz product runs through these kernels, and the
   packed GotoBLAS-style path (MC x KC panels of A, KC x NC panels of op(B), MR x NR micro-tiles)
   runs for every NS operand of >= MUON__GEMM_PACK_FLOATS (98,304) floats. Its bugs hide in the
   edges: a tail panel of A (M not a multiple of MR), a tail of op(B) (N not a multiple of NR),
   the second and later K chunks (K > KC), a second B block (N > NC), and the triangle that
   ssyrk mirrors. The unpacked path (pack == NULL) has its own UMR x UNR and 4 x 4 tiles.

   What, for both paths (packed: a pack buffer of exactly MUON__GEMM_PACK_FLOATS floats, filled
   with NaN before each call; unpacked: pack == NULL) and both transb = 0 (X = a X + B X) and
   transb = 1 (A = X X^T):
     - sizes straddling MR, NR, MC, KC, NC and the unpacked UMR, UNR (each -1, 0, +1 and 2t+1),
       odd and prime sizes, tall / wide / K-heavy shapes, K = 0, and two large shapes that have a
       tail panel in every dimension;
     - leading dimensions equal to and larger than the width: padding and a guard after each
       buffer hold a NaN sentinel; C's must come back bit-identical, A's and B's would poison
       the result if read;
     - alpha in {1, -0.5}, beta in {0, 1, 0.3}; for beta = 0, C is prefilled with NaN, which
       must not come out (BLAS semantics: C is not read);
     - ssyrk: the full C (both triangles) is written and symmetric bit-for-bit, the strict upper
       triangle of C is never read (it holds garbage), and the lower triangle has the same bits
       as muon__sgemm(1, ..., A, A, ...) with the same pack buffer, as muon.h promises.

   Tolerance (derived from K): summing K products in fp32 in any order errs by at most about
   K * u * sum_p |a_ip||b_pj| (u = 2^-24); storing C adds a rounding for alpha * acc and one for
   the beta update, so each element must satisfy
       |C - C_ref| <= 2 * (K + 2) * 2^-24 * (|alpha| * sum_p |A_ip||op(B)_pj| + |beta * C0_ij|)
   (constant c = 2; the rounding of C_ref itself to float and the extra beta-free update per
   later KC chunk are inside the factor 2). The bound is computed per element with the same
   naive loop over |A||B|. A bug in the kernels misplaces whole products, which is O(1) relative
   to this bound, not O(K u). The worst error / bound ratio is printed for each group. */
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "test.h"

#include <stdint.h>
#include <stdlib.h>

#define TOL_C 2.0                          /* the constant c of the bound above */
#define U32 (1.0 / 16777216.0)             /* 2^-24, unit roundoff of fp32 */
#define GUARD 64                           /* sentinel floats after every buffer */
#define SENTINEL 0x7fa5a5a5u               /* a NaN: padding and guards */
#define C_NAN 0x7fc0beefu                  /* a NaN: C before a beta = 0 call */
#define UPPER_GARBAGE (-777.0f)            /* ssyrk: strict upper triangle of C before the call */
#define UMR MUON__UMR                      /* unpacked nn tile is UMR x UNR, nt tile 4 x 4 */
#define UNR MUON__UNR

static float *pack_buf;                    /* exactly MUON__GEMM_PACK_FLOATS floats */

/* ---- helpers ------------------------------------------------------------------------------ */
static unsigned test_rng = 2024u;
static float frand(void) {                 /* uniform in [-1, 1), full 24-bit mantissas */
  test_rng = test_rng * 1664525u + 1013904223u;
  return (float)((test_rng >> 8) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

/* Bit-level tests: they survive -Ofast (-ffinite-math-only), where x != x folds to 0. */
static uint32_t fbits(float x) { uint32_t u; memcpy(&u, &x, sizeof u); return u; }
static float bits_float(uint32_t u) { float x; memcpy(&x, &u, sizeof x); return x; }
static int is_finite(float x) { return (fbits(x) & 0x7f800000u) != 0x7f800000u; }

/* A rows x ld buffer plus GUARD floats, all SENTINEL. */
static float *alloc_buf(int rows, int ld) {
  size_t n = (size_t)rows * ld + GUARD, i;
  float *x = (float *)malloc(n * sizeof(float));
  for (i = 0; i < n; i++) x[i] = bits_float(SENTINEL);
  return x;
}
static float *copy_buf(const float *x, int rows, int ld) {
  size_t n = (size_t)rows * ld + GUARD;
  float *y = (float *)malloc(n * sizeof(float));
  memcpy(y, x, n * sizeof(float));
  return y;
}
static void fill_random(float *x, int rows, int cols, int ld) {
  int i, j;
  for (i = 0; i < rows; i++)
    for (j = 0; j < cols; j++) x[(size_t)i * ld + j] = frand();
}
static void fill_bits(float *x, int rows, int cols, int ld, uint32_t u) {
  int i, j;
  for (i = 0; i < rows; i++)
    for (j = 0; j < cols; j++) x[(size_t)i * ld + j] = bits_float(u);
}
/* Padding columns [cols, ld) and the guard that no longer hold SENTINEL. */
static int count_touched(const float *x, int rows, int cols, int ld) {
  int i, j, bad = 0;
  for (i = 0; i < rows; i++)
    for (j = cols; j < ld; j++) bad += fbits(x[(size_t)i * ld + j]) != SENTINEL;
  for (i = 0; i < GUARD; i++) bad += fbits(x[(size_t)rows * ld + i]) != SENTINEL;
  return bad;
}
static void refill_pack(void) {
  size_t i;
  for (i = 0; i < MUON__GEMM_PACK_FLOATS; i++) pack_buf[i] = bits_float(C_NAN);
}

/* ---- per-group worst error / bound ------------------------------------------------------ */
typedef struct { const char *name; double worst; long cases; } group;
static group g_gemm[2][2] = {   /* [packed][transb] */
  {{"[gemm] unpacked transb=0", 0, 0}, {"[gemm] unpacked transb=1", 0, 0}},
  {{"[gemm] packed transb=0", 0, 0}, {"[gemm] packed transb=1", 0, 0}}};
static group g_syrk[2] = {{"[syrk] unpacked", 0, 0}, {"[syrk] packed", 0, 0}};

/* bound[i*N + j] = TOL_C * (K + 2) * u * (|alpha| sum_p |A_ip||op(B)_pj| + |beta C0_ij|). */
static double *make_bound(int transb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                          int ldb, float beta, const float *C0, int ldc) {
  double *bound = (double *)malloc(((size_t)M * N + 1) * sizeof(double));
  int i, j, p;
  for (i = 0; i < M; i++) {
    for (j = 0; j < N; j++) {
      double s = 0.0;
      for (p = 0; p < K; p++) {
        double b = transb ? (double)B[(size_t)j * ldb + p] : (double)B[(size_t)p * ldb + j];
        s += fabs((double)A[(size_t)i * lda + p]) * fabs(b);
      }
      s *= fabs((double)alpha);
      if (beta != 0.0f) s += fabs((double)beta * (double)C0[(size_t)i * ldc + j]);
      bound[(size_t)i * N + j] = TOL_C * (K + 2) * U32 * s;
    }
  }
  return bound;
}

/* Compare C with C_ref elementwise against the bound; record the worst ratio in g.
   Returns 1 if all M x N elements are finite and within the bound. */
static int within_bound(group *g, const char *what, const float *C, const float *Cref, const double *bound, int M,
                        int N, int ldc) {
  int i, j, bad = 0, bi = -1, bj = -1;
  double worst = 0.0;
  for (i = 0; i < M; i++) {
    for (j = 0; j < N; j++) {
      float c = C[(size_t)i * ldc + j], r = Cref[(size_t)i * ldc + j];
      double b = bound[(size_t)i * N + j], err, ratio;
      if (!is_finite(c)) { if (!bad++) { bi = i; bj = j; } continue; }
      err = fabs((double)c - (double)r);
      ratio = b > 0 ? err / b : (err == 0 ? 0.0 : HUGE_VAL);
      if (ratio > 1.0) { if (!bad++) { bi = i; bj = j; } }
      if (ratio > worst) worst = ratio;
    }
  }
  if (worst > g->worst) g->worst = worst;
  g->cases++;
  CHECK(bad == 0, "%s: %d of %d elements wrong, first (%d,%d): got %.9g want %.9g bound %.3g", what, bad, M * N, bi,
        bj, bad ? (double)C[(size_t)bi * ldc + bj] : 0.0, bad ? (double)Cref[(size_t)bi * ldc + bj] : 0.0,
        bad ? bound[(size_t)bi * N + bj] : 0.0);
  return bad == 0;
}

/* ---- one sgemm call on both paths --------------------------------------------------------- */
/* C = alpha A op(B) + beta C with lda = K + pad, ldb = width + 2 pad, ldc = N + 3 pad. */
static void gemm_case(int transb, int M, int N, int K, int pad, float alpha, float beta) {
  int brows = transb ? N : K, bcols = transb ? K : N;
  int lda = K + pad, ldb = bcols + 2 * pad, ldc = N + 3 * pad, path;
  float *A = alloc_buf(M, lda), *B = alloc_buf(brows, ldb), *C0 = alloc_buf(M, ldc), *A0, *B0, *Cref;
  double *bound;
  char what[160];
  fill_random(A, M, K, lda);
  fill_random(B, brows, bcols, ldb);
  if (beta == 0.0f) fill_bits(C0, M, N, ldc, C_NAN);   /* must be ignored */
  else fill_random(C0, M, N, ldc);
  A0 = copy_buf(A, M, lda);
  B0 = copy_buf(B, brows, ldb);
  Cref = copy_buf(C0, M, ldc);
  muon__sgemm_naive(transb, M, N, K, alpha, A, lda, B, ldb, beta, Cref, ldc);
  bound = make_bound(transb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc);
  for (path = 0; path < 2; path++) {
    float *C = copy_buf(C0, M, ldc);
    int touched;
    snprintf(what, sizeof what, "%s M=%d N=%d K=%d lda=%d ldb=%d ldc=%d alpha=%g beta=%g",
             path ? "packed" : "unpacked", M, N, K, lda, ldb, ldc, (double)alpha, (double)beta);
    if (path) refill_pack();
    muon__sgemm(transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, path ? pack_buf : NULL,
                path ? MUON__GEMM_PACK_FLOATS : 0);
    within_bound(&g_gemm[path][transb], what, C, Cref, bound, M, N, ldc);
    touched = count_touched(C, M, N, ldc);
    CHECK(touched == 0, "%s: %d padding/guard floats of C overwritten", what, touched);
    CHECK(memcmp(A, A0, ((size_t)M * lda + GUARD) * sizeof(float)) == 0 &&
          memcmp(B, B0, ((size_t)brows * ldb + GUARD) * sizeof(float)) == 0, "%s: A or B modified", what);
    free(C);
  }
  free(A); free(B); free(C0); free(A0); free(B0); free(Cref); free(bound);
}

static const float alphas[2] = {1.0f, -0.5f};
static const float betas[3] = {0.0f, 1.0f, 0.3f};

/* full: every alpha, beta, transb, with tight and padded leading dimensions (24 calls per path).
   Otherwise (large shapes): alpha = 1, beta = 0, tight and alpha = -0.5, beta = 0.3, padded. */
static void gemm_shape(int M, int N, int K, int full) {
  int t, a, b, pad;
  for (t = 0; t < 2; t++) {
    if (!full) {
      gemm_case(t, M, N, K, 0, 1.0f, 0.0f);
      gemm_case(t, M, N, K, 5, -0.5f, 0.3f);
      continue;
    }
    for (pad = 0; pad <= 5; pad += 5)
      for (a = 0; a < 2; a++)
        for (b = 0; b < 3; b++) gemm_case(t, M, N, K, pad, alphas[a], betas[b]);
  }
}

/* ---- one ssyrk call on both paths --------------------------------------------------------- */
/* C = alpha A A^T + beta C with lda = K + pad, ldc = N + 2 pad. */
static void syrk_case(int N, int K, int pad, float alpha, float beta) {
  int lda = K + pad, ldc = N + 2 * pad, path, i, j;
  float *A = alloc_buf(N, lda), *C0 = alloc_buf(N, ldc), *C0sym, *Cref;
  double *bound;
  char what[160];
  fill_random(A, N, K, lda);
  if (beta == 0.0f) {
    fill_bits(C0, N, N, ldc, C_NAN);
  } else {
    fill_random(C0, N, N, ldc);
    for (i = 0; i < N; i++)   /* ssyrk reads only the lower triangle */
      for (j = i + 1; j < N; j++) C0[(size_t)i * ldc + j] = UPPER_GARBAGE;
  }
  C0sym = copy_buf(C0, N, ldc);   /* what the oracle sees: the lower triangle mirrored */
  if (beta != 0.0f)
    for (i = 0; i < N; i++)
      for (j = i + 1; j < N; j++) C0sym[(size_t)i * ldc + j] = C0sym[(size_t)j * ldc + i];
  Cref = copy_buf(C0sym, N, ldc);
  muon__sgemm_naive(1, N, N, K, alpha, A, lda, A, lda, beta, Cref, ldc);
  bound = make_bound(1, N, N, K, alpha, A, lda, A, lda, beta, C0sym, ldc);
  for (path = 0; path < 2; path++) {
    float *C = copy_buf(C0, N, ldc), *Cg = copy_buf(C0, N, ldc);
    float *pk = path ? pack_buf : NULL;
    size_t pkn = path ? MUON__GEMM_PACK_FLOATS : 0;
    int touched, asym = 0, differ = 0;
    snprintf(what, sizeof what, "ssyrk %s N=%d K=%d lda=%d ldc=%d alpha=%g beta=%g", path ? "packed" : "unpacked", N,
             K, lda, ldc, (double)alpha, (double)beta);
    if (path) refill_pack();
    muon__ssyrk(N, K, alpha, A, lda, beta, C, ldc, pk, pkn);
    within_bound(&g_syrk[path], what, C, Cref, bound, N, N, ldc);
    for (i = 0; i < N; i++)
      for (j = 0; j < i; j++) asym += fbits(C[(size_t)i * ldc + j]) != fbits(C[(size_t)j * ldc + i]);
    CHECK(asym == 0, "%s: %d pairs C[i][j] != C[j][i] (bits)", what, asym);
    touched = count_touched(C, N, N, ldc);
    CHECK(touched == 0, "%s: %d padding/guard floats of C overwritten", what, touched);
    if (path) refill_pack();
    muon__sgemm(1, N, N, K, alpha, A, lda, A, lda, beta, Cg, ldc, pk, pkn);
    for (i = 0; i < N; i++)
      for (j = 0; j <= i; j++) differ += fbits(C[(size_t)i * ldc + j]) != fbits(Cg[(size_t)i * ldc + j]);
    CHECK(differ == 0, "%s: %d lower-triangle elements differ in bits from muon__sgemm(1, A, A)", what, differ);
    free(C); free(Cg);
  }
  free(A); free(C0); free(C0sym); free(Cref); free(bound);
}

static void syrk_shape(int N, int K, int full) {
  int a, b, pad;
  if (!full) {
    syrk_case(N, K, 0, 1.0f, 0.0f);
    syrk_case(N, K, 5, -0.5f, 0.3f);
    return;
  }
  for (pad = 0; pad <= 5; pad += 5)
    for (a = 0; a < 2; a++)
      for (b = 0; b < 3; b++) syrk_case(N, K, pad, alphas[a], betas[b]);
}

/* ---- the cases ---------------------------------------------------------------------------- */
#define TOL_TITLE "|C - naive| <= 2(K+2)2^-24(|alpha||A||op B| + |beta C0|)"

int main(void) {
  static const int primes[][3] = {{1, 1, 1}, {1, 13, 7}, {7, 1, 31}, {13, 31, 1}, {31, 97, 13},
                                  {97, 7, 31}, {97, 97, 97}, {257, 13, 7}, {7, 257, 13}, {401, 31, 5}};
  static const int shapes[][3] = {{401, 7, 13}, {1031, 5, 3},  /* tall */
                                  {7, 401, 13}, {3, 1031, 5},  /* wide */
                                  {5, 3, 1031}, {13, 7, 4 * MUON__KC + 3}}; /* K-heavy */
  int i;
  pack_buf = (float *)malloc(MUON__GEMM_PACK_FLOATS * sizeof(float));
  printf("test_gemm: MR=%d NR=%d MC=%d KC=%d NC=%d UMR=%d UNR=%d pack=%lu floats\n", MUON__MR, MUON__NR, MUON__MC,
         MUON__KC, MUON__NC, UMR, UNR, (unsigned long)MUON__GEMM_PACK_FLOATS);

  TEST_CASE("sgemm, M across MR and UMR: " TOL_TITLE);
  for (i = -1; i <= 1; i++) {
    gemm_shape(MUON__MR + i, 13, 7, 1);
    gemm_shape(2 * MUON__MR + i, MUON__NR + 1, 9, 1);
    gemm_shape(UMR + i, 5, 11, 1);
  }

  TEST_CASE("sgemm, N across NR and UNR: " TOL_TITLE);
  for (i = -1; i <= 1; i++) {
    gemm_shape(MUON__MR + 1, MUON__NR + i, 9, 1);
    gemm_shape(3, 2 * MUON__NR + i, 5, 1);
    gemm_shape(UMR + 1, UNR + i, 7, 1);
    gemm_shape(5, 2 * UNR + i, 3, 1);
  }

  TEST_CASE("sgemm, M across MC: " TOL_TITLE);
  for (i = -1; i <= 1; i++) gemm_shape(MUON__MC + i, 31, 17, 1);
  gemm_shape(2 * MUON__MC + 1, 13, 9, 1);

  TEST_CASE("sgemm, K across KC (later chunks accumulate): " TOL_TITLE);
  for (i = -1; i <= 1; i++) gemm_shape(MUON__MR + 3, MUON__NR + 5, MUON__KC + i, 1);
  gemm_shape(5, 9, 2 * MUON__KC + 1, 1);

  TEST_CASE("sgemm, N across NC (second B block): " TOL_TITLE);
  for (i = -1; i <= 1; i++) gemm_shape(MUON__MR + 1, MUON__NC + i, 11, 1);
  gemm_shape(3, 2 * MUON__NC + 1, 7, 1);

  TEST_CASE("sgemm, odd and prime sizes: " TOL_TITLE);
  for (i = 0; i < (int)(sizeof primes / sizeof primes[0]); i++) gemm_shape(primes[i][0], primes[i][1], primes[i][2], 1);

  TEST_CASE("sgemm, tall / wide / K-heavy: " TOL_TITLE);
  for (i = 0; i < (int)(sizeof shapes / sizeof shapes[0]); i++) gemm_shape(shapes[i][0], shapes[i][1], shapes[i][2], 1);

  TEST_CASE("sgemm, K = 0 gives beta C (0 for beta = 0, NaN in C ignored): " TOL_TITLE);
  gemm_shape(5, 7, 0, 1);

  TEST_CASE("sgemm, large shapes with a tail panel in every dimension: " TOL_TITLE);
  gemm_shape(257, 400, 300, 0);
  gemm_shape(2 * MUON__MC + 1, 2 * MUON__NC + 1, MUON__KC + 1, 0);

  TEST_CASE("ssyrk, small and tile-edge N, symmetric, upper of C unread: " TOL_TITLE);
  {
    static const int ns[] = {1, 2, 3, 4, 5, 7, 13, 31, 97};
    for (i = 0; i < (int)(sizeof ns / sizeof ns[0]); i++) syrk_shape(ns[i], 7, 1);
    for (i = -1; i <= 1; i++) {
      syrk_shape(MUON__MR + i, 9, 1);
      syrk_shape(MUON__NR + i, 5, 1);
      syrk_shape(2 * MUON__NR + i, 3, 1);
      syrk_shape(MUON__MC + i, 3, 1);
    }
  }

  TEST_CASE("ssyrk, K across KC: " TOL_TITLE);
  for (i = -1; i <= 1; i++) syrk_shape(MUON__MR + 3, MUON__KC + i, 1);
  syrk_shape(13, 2 * MUON__KC + 1, 1);

  TEST_CASE("ssyrk, N across NC and large: " TOL_TITLE);
  for (i = -1; i <= 1; i++) syrk_shape(MUON__NC + i, 3, 0);
  syrk_shape(300, MUON__KC + 1, 0);
  syrk_shape(2 * MUON__NC + 1, 31, 0);

  TEST_CASE("ssyrk, K = 0: " TOL_TITLE);
  syrk_shape(9, 0, 1);

  for (i = 0; i < 4; i++) {
    group *g = &g_gemm[i / 2][i % 2];
    printf("  %s: worst error / bound %.3f over %ld cases\n", g->name, g->worst, g->cases);
  }
  for (i = 0; i < 2; i++) printf("  %s: worst error / bound %.3f over %ld cases\n", g_syrk[i].name, g_syrk[i].worst,
                                 g_syrk[i].cases);
  free(pack_buf);
  return test_summary();
}
