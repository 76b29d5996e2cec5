/* bench_ns.c - Newton-Schulz against the GEMM ceiling of this machine, single-threaded.

   Everything is measured side by side in one run and printed as ratios:
     a. the CBLAS (OpenBLAS) sgemm rate at 1024^2 - "the ceiling" - and muon's built-in GEMM
        (muon__sgemm, the static function the library's NS uses) at the same size;
     b. muon_newton_schulz for 512x512, 1024x1024, 1024x4096, 4096x1024 with
        hp.gemm in {BUILTIN, CBLAS} x hp.symmetric in {0, 1}: ms, effective GFLOP/s (flops of the
        plain algorithm, steps*(4 m^2 n + 2 m^3), m = min dim, n = max dim, for every variant, so
        the symmetric saving shows as a higher rate), ideal/measured time against the ceiling, and
        the symmetric / plain speedup per GEMM.
   Targets (printed "met" / "NOT met", never asserted): built-in GEMM >= 0.5 x OpenBLAS at 1024^2;
   CBLAS NS >= 0.8 of the ceiling; symmetric >= 1.2x faster than plain with the same GEMM.

   Times are medians of several repetitions (fewer for the big shapes). A variant whose predicted
   time (its flops at the rate it reached on the previous shape) exceeds --budget seconds per
   repetition is skipped with a note, so a slow GEMM cannot blow up `make bench`.

   usage: OPENBLAS_NUM_THREADS=1 build/bench_ns [--quick] [--budget S] [--out FILE]
     --quick    512 and 1024 only
     --budget   seconds one NS repetition may be predicted to take (default 20)
     --out      where to write the CBLAS NS times for bench_numpy.py (default build/bench_ns.txt;
                "-" for none)

   Build: gcc -std=c99 -O3 -march=native -DMUON_USE_CBLAS $(pkg-config --cflags openblas) -I. \
            bench/bench_ns.c -o build/bench_ns $(pkg-config --libs openblas) -lm */
#define _POSIX_C_SOURCE 200809L
#define MUON_IMPLEMENTATION
#include "muon.h"
#include <cblas.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef MUON__GEMM_PACK_FLOATS
#define MUON__GEMM_PACK_FLOATS 0
#endif

#define MAX_REPS 16

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void fill(float *x, size_t n, unsigned seed) {
  size_t i;
  unsigned s = seed * 2654435761u + 1u;
  for (i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
  }
}

/* ---- a. GEMM at 1024^2 ------------------------------------------------------------------- */
typedef struct gemm_args {
  int n;
  const float *A, *B;
  float *C, *pack;
  size_t pack_floats;
} gemm_args;

static void run_cblas(const gemm_args *g) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1.0f, g->A, g->n, g->B, g->n, 0.0f,
              g->C, g->n);
}

static void run_builtin(const gemm_args *g) {
  muon__sgemm(0, g->n, g->n, g->n, 1.0f, g->A, g->n, g->B, g->n, 0.0f, g->C, g->n, g->pack, g->pack_floats);
}

/* Median seconds of fn: one untimed warm-up, then at least min_reps, at most max_reps, and no
   more once max_s seconds have been spent. *reps gets the count. */
static double time_gemm(void (*fn)(const gemm_args *), const gemm_args *g, int min_reps, int max_reps, double max_s,
                        int *reps) {
  double t[MAX_REPS], start = now_s(), t0;
  int n = 0;
  fn(g);
  while (n < max_reps && (n < min_reps || now_s() - start < max_s)) {
    t0 = now_s();
    fn(g);
    t[n++] = now_s() - t0;
  }
  *reps = n;
  return median(t, n);
}

/* ---- b. Newton-Schulz -------------------------------------------------------------------- */
typedef struct variant {
  const char *name;
  muon_gemm gemm;
  int symmetric;
  double last_rate;  /* effective flop/s on the previous shape; predicts the next one */
} variant;

typedef struct result {
  double ms;          /* median; < 0: skipped */
  int reps;
  double predicted_s; /* why it was skipped */
} result;

static double ns_flops(int rows, int cols, int steps) {
  double m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
  return (double)steps * (4.0 * m * m * n + 2.0 * m * m * m);
}

static result time_ns(variant *v, int rows, int cols, int reps_wanted, double budget, const float *in, float *out) {
  muon_hparams hp = muon_default_hparams();
  double t[MAX_REPS], flops = ns_flops(rows, cols, hp.ns_steps), t0;
  result r;
  int i;
  muon_status st;
  hp.gemm = v->gemm;
  hp.symmetric = v->symmetric;
  r.ms = -1;
  r.reps = 0;
  r.predicted_s = v->last_rate > 0 ? flops / v->last_rate : 0;
  if (r.predicted_s > budget) return r;
  for (i = 0; i < reps_wanted; i++) {
    t0 = now_s();
    st = muon_newton_schulz(in, rows, cols, out, &hp);
    t[i] = now_s() - t0;
    if (st != MUON_OK) {
      fprintf(stderr, "muon_newton_schulz(%dx%d, %s): %s\n", rows, cols, v->name, muon_status_string(st));
      exit(1);
    }
    /* One repetition of a slow variant is enough; keep the total bounded. */
    if (t[i] * (reps_wanted - i - 1) > budget) { i++; break; }
  }
  r.reps = i;
  r.ms = 1e3 * median(t, i);
  v->last_rate = flops / (r.ms * 1e-3);
  return r;
}

static const char *verdict(int met) { return met ? "met" : "NOT met"; }

int main(int argc, char **argv) {
  int quick = 0, i, s;
  double budget = 20.0, bench_start = now_s();
  const char *out_path = "build/bench_ns.txt";
  const char *threads = getenv("OPENBLAS_NUM_THREADS");
  FILE *out_file = NULL;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--budget") && i + 1 < argc) budget = atof(argv[++i]);
    else if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--quick] [--budget S] [--out FILE|-]\n", argv[0]);
      return 2;
    }
  }
  openblas_set_num_threads(1); /* single-threaded whatever the environment says */

  printf("== bench_ns: Newton-Schulz vs the GEMM ceiling (single-threaded: OPENBLAS_NUM_THREADS=%s, "
         "openblas_set_num_threads(1); muon's built-in GEMM is single-threaded) ==\n",
         threads ? threads : "unset");
  printf("OpenBLAS: %s\n", openblas_get_config());

  /* a. GEMM ceiling and the built-in GEMM at 1024^2 */
  {
    const int n = 1024;
    size_t nn = (size_t)n * n, pf = (size_t)MUON__GEMM_PACK_FLOATS;
    gemm_args g;
    double flops = 2.0 * n * n * (double)n, t_blas, t_builtin, ceiling, builtin_rate, ratio;
    int reps_blas, reps_builtin;
    float *A = (float *)malloc(nn * sizeof(float)), *B = (float *)malloc(nn * sizeof(float));
    float *C = (float *)malloc(nn * sizeof(float));
    g.n = n; g.A = A; g.B = B; g.C = C;
    g.pack_floats = pf;
    g.pack = pf ? (float *)malloc(pf * sizeof(float)) : NULL;
    if (!A || !B || !C || (pf && !g.pack)) { fprintf(stderr, "out of memory\n"); return 1; }
    fill(A, nn, 1); fill(B, nn, 2);
    t_blas = time_gemm(run_cblas, &g, 5, 9, 2.0, &reps_blas);
    t_builtin = time_gemm(run_builtin, &g, 1, 5, 3.0, &reps_builtin);
    ceiling = flops / t_blas;
    builtin_rate = flops / t_builtin;
    ratio = builtin_rate / ceiling;
    printf("\n-- a. GEMM 1024x1024x1024 (C = A*B, fp32), median --\n");
    printf("  CBLAS sgemm (the ceiling) : %8.2f ms  %7.1f GFLOP/s  (%d reps)\n", 1e3 * t_blas, ceiling * 1e-9, reps_blas);
    printf("  muon built-in muon__sgemm : %8.2f ms  %7.1f GFLOP/s  (%d reps, pack buffer %zu floats)\n",
           1e3 * t_builtin, builtin_rate * 1e-9, reps_builtin, pf);
    printf("  built-in / OpenBLAS       : %.3f   target >= 0.50: %s\n", ratio, verdict(ratio >= 0.5));
    free(A); free(B); free(C); free(g.pack);

    /* b. Newton-Schulz */
    {
      static const int shapes[4][2] = { { 512, 512 }, { 1024, 1024 }, { 1024, 4096 }, { 4096, 1024 } };
      static const int reps_of[4] = { 5, 3, 2, 2 };
      variant v[4] = { { "builtin plain", MUON_GEMM_BUILTIN, 0, 0 }, { "builtin symm ", MUON_GEMM_BUILTIN, 1, 0 },
                       { "cblas   plain", MUON_GEMM_CBLAS, 0, 0 },   { "cblas   symm ", MUON_GEMM_CBLAS, 1, 0 } };
      int n_shapes = quick ? 2 : 4, k;
      int cblas_met = 1, cblas_seen = 0, sym_met[2] = { 1, 1 }, sym_seen[2] = { 0, 0 };
      if (strcmp(out_path, "-") != 0) {
        out_file = fopen(out_path, "w");
        if (!out_file) fprintf(stderr, "bench_ns: cannot write %s (numpy comparison will lack C figures)\n", out_path);
        else fprintf(out_file, "# rows cols cblas_plain_ms cblas_symm_ms ceiling_gflops (written by bench_ns)\n");
      }
      printf("\n-- b. muon_newton_schulz, 5 quintic steps, fp32; GFLOP/s counts the plain algorithm's flops "
             "5*(4m^2n+2m^3) for every variant; 'of ceiling' = (flops / %.1f GFLOP/s) / measured --\n",
             ceiling * 1e-9);
      printf("  %-11s %-14s %10s %9s %11s %5s %16s\n", "shape", "variant", "ms", "GFLOP/s", "of ceiling", "reps", "symm/plain");
      for (s = 0; s < n_shapes; s++) {
        int rows = shapes[s][0], cols = shapes[s][1];
        size_t sz = (size_t)rows * cols;
        float *in = (float *)malloc(sz * sizeof(float)), *o = (float *)malloc(sz * sizeof(float));
        double flops_ns = ns_flops(rows, cols, 5);
        result res[4];
        char shape[32];
        if (!in || !o) { fprintf(stderr, "out of memory\n"); return 1; }
        fill(in, sz, 3u + (unsigned)s);
        snprintf(shape, sizeof shape, "%dx%d", rows, cols);
        for (k = 0; k < 4; k++) {
          res[k] = time_ns(&v[k], rows, cols, reps_of[s], budget, in, o);
          if (res[k].ms < 0) {
            printf("  %-11s %-14s   skipped: predicted %.0f s per rep > --budget %.0f s\n", shape, v[k].name,
                   res[k].predicted_s, budget);
          } else {
            double sec = res[k].ms * 1e-3, frac = (flops_ns / ceiling) / sec;
            char sym[64] = "";
            if (k % 2 == 1 && res[k - 1].ms > 0) {
              double sp = res[k - 1].ms / res[k].ms;
              int g = k / 2;
              snprintf(sym, sizeof sym, "%.2fx (>=1.2: %s)", sp, verdict(sp >= 1.2));
              sym_seen[g] = 1;
              if (sp < 1.2) sym_met[g] = 0;
            }
            printf("  %-11s %-14s %10.1f %9.1f %11.3f %5d %16s\n", shape, v[k].name, res[k].ms, flops_ns / sec * 1e-9,
                   frac, res[k].reps, sym);
            if (k >= 2) {
              cblas_seen = 1;
              if (frac < 0.8) cblas_met = 0;
            }
          }
        }
        if (out_file)
          fprintf(out_file, "%d %d %.4f %.4f %.3f\n", rows, cols, res[2].ms, res[3].ms, ceiling * 1e-9);
        free(in); free(o);
      }
      if (out_file) fclose(out_file);
      printf("\n-- targets --\n");
      printf("  built-in GEMM >= 0.50 x OpenBLAS at 1024^2          : %.3f  %s\n", ratio, verdict(ratio >= 0.5));
      printf("  CBLAS NS >= 0.80 of the sgemm ceiling (every shape) : %s\n",
             cblas_seen ? verdict(cblas_met) : "not measured");
      printf("  symmetric >= 1.2x faster than plain, built-in GEMM  : %s\n",
             sym_seen[0] ? verdict(sym_met[0]) : "not measured (skipped)");
      printf("  symmetric >= 1.2x faster than plain, CBLAS          : %s\n",
             sym_seen[1] ? verdict(sym_met[1]) : "not measured");
    }
  }
  printf("bench_ns: %.0f s\n", now_s() - bench_start);
  return 0;
}
