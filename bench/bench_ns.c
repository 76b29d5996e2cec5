/* bench_ns.c - Newton-Schulz against the GEMM ceiling of this machine, single-threaded.

   Everything is measured side by side in one run and printed as ratios:
     a. the CBLAS (OpenBLAS) sgemm rate at 1024^2 - "the ceiling" - and muon's built-in GEMM
        (muon__sgemm, the static function the library's NS uses) at the same size;
     b. muon_newton_schulz for 512x512, 1024x1024, 1024x4096, 4096x1024 with
        muon_cpu_desc.gemm in {BUILTIN, CBLAS} x hp.symmetric in {0, 1}: ms, effective GFLOP/s (flops of the
        plain algorithm, steps*(4 m^2 n + 2 m^3), m = min dim, n = max dim, for every variant, so
        the symmetric saving shows as a higher rate), ideal/measured time against the ceiling, and
        the symmetric / plain speedup per GEMM.
   Targets (printed "met" / "NOT met", never asserted): built-in GEMM >= 0.5 x OpenBLAS at 1024^2;
   CBLAS NS >= 0.8 of the ceiling; symmetric >= 1.2x faster than plain with the same GEMM.

   Times are medians of several repetitions (fewer for the big shapes). Each (shape, variant) gets
   at most --budget seconds: it runs in a child process, stops repeating when the next repetition
   would pass the budget, and is killed at the budget (+1 s) if one repetition is slower still; a
   variant whose predicted time (its flops at the rate it reached on the previous shape) exceeds
   the budget is skipped with a note. So a slow GEMM cannot blow up `make bench`.

   usage: OPENBLAS_NUM_THREADS=1 build/bench_ns [--quick] [--budget S] [--out FILE]
     --quick    512 and 1024 only (and 2 layers in e)
     --threads  section e alone (muon_cpu_desc.threads: 1 vs 2 threads)
     --budget   seconds per (shape, variant), all repetitions together (default 8)
     --out      where to write the CBLAS NS times for bench_numpy.py (default build/bench_ns.txt;
                "-" for none)

   Build: gcc -std=c99 -O3 -march=native -DMUON_USE_CBLAS $(pkg-config --cflags openblas) -I. \
            bench/bench_ns.c -o build/bench_ns $(pkg-config --libs openblas) -lm */
#define _POSIX_C_SOURCE 200809L
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "bench.h"
#include <cblas.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* The GEMM is the CPU backend's setting: one single-thread backend per muon_gemm, made once. */
static const muon_compute *cpu_backend(muon_gemm gemm, int threads) {
  static muon_compute made[3][2];
  muon_compute *c = &made[gemm][threads > 1];
  if (!c->vt) {
    muon_cpu_desc d = muon_cpu_default_desc();
    d.gemm = gemm;
    d.threads.count = threads;
    if (muon_cpu_create(c, &d) != MUON_OK) { fprintf(stderr, "bench_ns: %s\n", muon_error(NULL)); exit(1); }
  }
  return c;
}

/* muon_newton_schulz through a CPU backend with that GEMM (its pack and newton_schulz slots). */
static muon_status ns_with(muon_gemm gemm, const float *in, int rows, int cols, float *out, const muon_hparams *hp) {
  const muon_compute *c = cpu_backend(gemm, 1);
  int m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
  muon_piece_copy op = muon__whole(rows, cols, 0, 0);
  float *X = (float *)malloc((size_t)m * n * sizeof(float));
  void *ws = malloc(c->vt->ns_workspace(c->ctx, 1, m, n, hp) + 1);
  muon_status st = X && ws ? MUON_OK : MUON_ERR_NOMEM;
  if (st == MUON_OK && (st = c->vt->pack(c->ctx, &op, 1, (float *)in, X, 1)) == MUON_OK &&
      (st = c->vt->newton_schulz(c->ctx, X, 1, m, n, hp, ws)) == MUON_OK)
    st = c->vt->pack(c->ctx, &op, 1, out, X, 0);
  free(X);
  free(ws);
  return st;
}

#ifndef MUON__GEMM_PACK_FLOATS
#define MUON__GEMM_PACK_FLOATS 0
#endif

#define MAX_REPS 16


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

static double time_once(void (*fn)(const gemm_args *), const gemm_args *g) {
  double t0 = now_s();
  fn(g);
  return now_s() - t0;
}

static void loadavg(const char *when) {
  double a = load_average();
  if (a >= 0) printf("load average (1 min) %s: %.2f%s\n", when, a,
                     a > 0.5 ? "  (other processes share these cores: trust the side-by-side ratios more than "
                               "the absolute rates)" : "");
}

/* ---- b. Newton-Schulz -------------------------------------------------------------------- */
typedef struct variant {
  const char *name;
  muon_gemm gemm;
  int symmetric;
  double last_rate;  /* effective flop/s on the previous shape (predicts the next); -1: gave up */
} variant;

typedef struct result {
  double ms;          /* median; < 0: not measured */
  int reps;
  int state;          /* 0 measured, 1 skipped (predicted > budget), 2 skipped (a smaller shape
                         timed out), 3 stopped at the budget before one repetition */
  double predicted_s;
} result;

static double ns_flops(int rows, int cols, int steps) {
  double m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
  return (double)steps * (4.0 * m * m * n + 2.0 * m * m * m);
}

typedef struct sample { int kind; double dt; } sample;   /* kind: variant 0/1, or 2 = sgemm 1024^2 */

/* Times the plain (v[0]) and symmetric (v[1]) variants of one GEMM on one shape, repetitions
   interleaved (3 x sgemm 1024^2, plain, symmetric; then 3 x sgemm, symmetric, plain; ...) so that both and
   the ceiling see the same machine. Runs in a child process so a variant far slower than
   predicted is stopped at its budget (a running GEMM cannot be interrupted otherwise): the child
   reports each sample through a pipe and stops repeating when the next round would pass the
   budget; the parent kills it at the budget + 1 s. Ceiling samples go to ceil_t[*n_ceil]. */
static void time_pair(variant *v, int rows, int cols, int reps_wanted, double budget, const float *in, float *out,
                      const gemm_args *g, result *res, double *ceil_t, int *n_ceil) {
  double flops = ns_flops(rows, cols, 5), t[2][MAX_REPS], cap = 0, start;
  int on[2], k, fd[2], n[2] = { 0, 0 }, status, killed = 0;
  pid_t pid;
  for (k = 0; k < 2; k++) {
    res[k].ms = -1;
    res[k].reps = 0;
    res[k].predicted_s = v[k].last_rate > 0 ? flops / v[k].last_rate : 0;
    res[k].state = v[k].last_rate < 0 ? 2 : res[k].predicted_s > budget ? 1 : 0;
    on[k] = res[k].state == 0;
    if (on[k]) cap += budget;
  }
  if (!on[0] && !on[1]) return;
  fflush(stdout);
  if (pipe(fd) != 0 || (pid = fork()) < 0) { perror("bench_ns: pipe/fork"); exit(1); }
  if (pid == 0) {
    double spent = 0, round, t0;
    int i, j;
    close(fd[0]);
    for (i = 0; i < reps_wanted; i++) {
      sample x;
      round = 0;
      for (j = 0; j < 3; j++) {    /* 3 ceiling samples a round: cheap beside one NS */
        x.kind = 2;
        x.dt = time_once(run_cblas, g);
        if (write(fd[1], &x, sizeof x) != (ssize_t)sizeof x) _exit(1);
      }
      for (j = 0; j < 2; j++) {
        muon_hparams hp = muon_default_hparams();
        muon_status st;
        x.kind = i % 2 ? 1 - j : j;
        if (!on[x.kind]) continue;
        hp.symmetric = v[x.kind].symmetric;
        t0 = now_s();
        st = ns_with(v[x.kind].gemm, in, rows, cols, out, &hp);
        x.dt = now_s() - t0;
        if (st != MUON_OK) {
          fprintf(stderr, "muon_newton_schulz(%dx%d, %s): %s\n", rows, cols, v[x.kind].name, muon_status_string(st));
          _exit(1);
        }
        if (write(fd[1], &x, sizeof x) != (ssize_t)sizeof x) _exit(1);
        round += x.dt;
      }
      spent += round;
      if (spent + round > cap) break;
    }
    _exit(0);
  }
  close(fd[1]);
  start = now_s();
  for (;;) {
    struct pollfd p;
    double left = cap + 1.0 - (now_s() - start);
    sample x;
    p.fd = fd[0]; p.events = POLLIN; p.revents = 0;
    if (left <= 0 || poll(&p, 1, (int)(left * 1e3) + 1) == 0) {
      if (now_s() - start < cap + 1.0) continue;
      kill(pid, SIGKILL);
      killed = 1;
      break;
    }
    if (read(fd[0], &x, sizeof x) != (ssize_t)sizeof x) break;   /* EOF: the child is done */
    if (x.kind == 2) { if (*n_ceil < 8 * MAX_REPS) ceil_t[(*n_ceil)++] = x.dt; }
    else if (n[x.kind] < MAX_REPS) t[x.kind][n[x.kind]++] = x.dt;
  }
  close(fd[0]);
  waitpid(pid, &status, 0);
  if (!killed && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    fprintf(stderr, "bench_ns: NS child for %dx%d failed\n", rows, cols);
    exit(1);
  }
  for (k = 0; k < 2; k++) {
    if (!on[k]) continue;
    res[k].reps = n[k];
    if (!n[k]) { res[k].state = 3; res[k].predicted_s = now_s() - start; v[k].last_rate = -1; continue; }
    res[k].ms = 1e3 * median(t[k], n[k]);
    v[k].last_rate = flops / (res[k].ms * 1e-3);
  }
}

static const char *verdict(int met) { return met ? "met" : "NOT met"; }

/* ---- c. Gram Newton-Schulz against the standard iteration ---------------------------------
   Same shapes, same GEMM, repetitions interleaved (standard, Gram, Gram, standard, ...); medians.
   Square operands run the standard iteration under MUON_NS_GRAM (no flops to save), so their
   ratio shows the dispatch costs nothing. Returns the 1:4 speedups' minimum. */
static double gram_section(int quick) {
  static const int shapes[][2] = { { 768, 768 }, { 768, 3072 }, { 1024, 4096 } };
  static const muon_gemm gemms[2] = { MUON_GEMM_CBLAS, MUON_GEMM_BUILTIN };
  int s, gi, n_shapes = quick ? 2 : 3;
  double worst_rect = 1e30, worst_square = 1e30;
  printf("\n-- c. Gram Newton-Schulz vs standard: 5 quintic steps, fp32, symmetric products, Gram restarting at\n"
         "   iteration 2 (the default); median ms, repetitions interleaved --\n");
  printf("  %-10s %-8s %12s %10s %10s\n", "shape", "gemm", "standard ms", "Gram ms", "speedup");
  for (s = 0; s < n_shapes; s++) {
    int rows = shapes[s][0], cols = shapes[s][1], reps = rows * cols > 1000000 ? 3 : 5, r, a;
    size_t sz = (size_t)rows * cols;
    float *in = (float *)malloc(sz * sizeof(float)), *o = (float *)malloc(sz * sizeof(float));
    if (!in || !o) { fprintf(stderr, "out of memory\n"); exit(1); }
    fill(in, sz, 40u + (unsigned)s);
    for (gi = 0; gi < 2; gi++) {
      double t[2][8], sp;
      for (r = 0; r < reps; r++)
        for (a = 0; a < 2; a++) {
          int alg = r % 2 ? 1 - a : a;
          muon_hparams hp = muon_default_hparams();
          double t0;
          hp.ns_algorithm = alg ? MUON_NS_GRAM : MUON_NS_STANDARD;
          t0 = now_s();
          if (ns_with(gemms[gi], in, rows, cols, o, &hp) != MUON_OK) { fprintf(stderr, "bench_ns: Gram section failed\n"); exit(1); }
          t[alg][r] = now_s() - t0;
        }
      sp = median(t[0], reps) / median(t[1], reps);
      if (rows == cols) { if (sp < worst_square) worst_square = sp; }
      else if (sp < worst_rect) worst_rect = sp;
      char shape[24];
      snprintf(shape, sizeof shape, "%dx%d", rows, cols);
      printf("  %-10s %-8s %12.1f %10.1f %9.2fx%s\n", gi ? "" : shape, gemms[gi] == MUON_GEMM_CBLAS ? "cblas" : "builtin",
             1e3 * median(t[0], reps), 1e3 * median(t[1], reps), sp, rows == cols ? "  (square: the standard iteration)" : "");
    }
    free(in); free(o);
  }
  printf("  Gram >= 1.3x faster at 1:4 (768x3072%s), both GEMMs : %.2fx  %s\n", quick ? "" : ", 1024x4096", worst_rect, verdict(worst_rect >= 1.3));
  printf("  Gram >= 1.0x on square (the same iteration: within 5%% timing noise)    : %.2fx  %s\n", worst_square, verdict(worst_square >= 0.95));
  return worst_rect;
}

/* ---- d. NorMuon's overhead over plain Muon --------------------------------------------------
   A whole muon_step on one device (momentum, Newton-Schulz, NorMuon, update) of one matrix, with
   NorMuon off and on (LARGER: per row or column, as nanochat), CBLAS; repetitions interleaved,
   medians. The overhead is NorMuon's share of the step: two passes over O. */
static double normuon_section(int quick) {
  static const int shapes[][2] = { { 768, 768 }, { 768, 3072 }, { 3072, 768 } };
  int s, n_shapes = quick ? 2 : 3;
  double worst = 0;
  printf("\n-- d. NorMuon vs plain Muon: one muon_step on one device, CBLAS, fp32; median ms, interleaved --\n");
  printf("  %-10s %12s %12s %10s %16s\n", "shape", "Muon ms", "NorMuon ms", "overhead", "the slot alone");
  for (s = 0; s < n_shapes; s++) {
    int rows = shapes[s][0], cols = shapes[s][1], reps = 5, r, a;
    size_t sz = (size_t)rows * cols;
    float *w[2], *g = (float *)malloc(sz * sizeof(float));
    muon_optimizer *opt[2];
    double t[2][8], ov, slot;
    char shape[24];
    for (a = 0; a < 2; a++) {
      muon_desc d = muon_default_desc();
      muon_matrix m = muon_default_matrix();
      w[a] = (float *)malloc(sz * sizeof(float));
      if (!w[a] || !g) { fprintf(stderr, "out of memory\n"); exit(1); }
      fill(w[a], sz, 50u + (unsigned)s);
      d.compute = cpu_backend(MUON_GEMM_CBLAS, 1);
      d.hparams.normuon = a ? MUON_NORMUON_LARGER : MUON_NORMUON_OFF;
      m.name = "w"; m.param = w[a]; m.grad = g; m.rows = rows; m.cols = cols;
      if (muon_create(&opt[a], &d) != MUON_OK || muon_add_matrix(opt[a], &m, NULL) != MUON_OK) { fprintf(stderr, "bench_ns: NorMuon setup failed\n"); exit(1); }
    }
    fill(g, sz, 60u + (unsigned)s);
    for (a = 0; a < 2; a++) if (muon_step(opt[a]) != MUON_OK) exit(1);   /* plans, warms up */
    for (r = 0; r < reps; r++)
      for (a = 0; a < 2; a++) {
        int which = r % 2 ? 1 - a : a;
        double t0 = now_s();
        if (muon_step(opt[which]) != MUON_OK) { fprintf(stderr, "bench_ns: NorMuon step failed\n"); exit(1); }
        t[which][r] = now_s() - t0;
      }
    ov = median(t[1], reps) / median(t[0], reps) - 1.0;
    if (ov > worst) worst = ov;
    {   /* NorMuon's own time, without the step's noise: the CPU slot on an operand, 20 times */
      muon_compute cpu = muon_compute_cpu();
      muon_hparams hp = muon_default_hparams();
      int m = rows < cols ? rows : cols, n = rows < cols ? cols : rows, len = rows > cols ? rows : cols, k;
      float *v = (float *)calloc(2 * (size_t)len, sizeof(float));
      double t0;
      hp.normuon = MUON_NORMUON_LARGER;
      t0 = now_s();
      for (k = 0; k < 20; k++) cpu.vt->normuon(cpu.ctx, w[0], m, n, 1, v, v + len, &hp);
      slot = (now_s() - t0) / 20;
      free(v);
    }
    snprintf(shape, sizeof shape, "%dx%d", rows, cols);
    printf("  %-10s %12.1f %12.1f %9.1f%% %13.2f ms\n", shape, 1e3 * median(t[0], reps), 1e3 * median(t[1], reps), 100.0 * ov, 1e3 * slot);
    for (a = 0; a < 2; a++) { muon_destroy(opt[a]); free(w[a]); }
    free(g);
  }
  printf("  NorMuon <= 3%% of the step, every shape (step timings vary by ~2%%)  : %.1f%%  %s\n", 100.0 * worst, verdict(worst <= 0.03));
  return worst;
}

/* e. muon_cpu_desc.threads: one muon_step on one device over GPT-2 small's matrices (per layer 768x2304,
   768x768, 768x3072, 3072x768; --quick: 2 layers, else 12), 1 thread vs 2 of muon's pool, with
   the built-in GEMM and with CBLAS (OpenBLAS single-threaded: muon's threads call it side by
   side); steps interleaved, medians; the parameters must come out bitwise equal. */
static double threads_section(int quick) {
  static const int shapes[4][2] = { { 768, 2304 }, { 768, 768 }, { 768, 3072 }, { 3072, 768 } };
  int layers = quick ? 2 : 12, gi, worst_set = 0;
  double worst = 0;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("\n-- e. threads (muon_cpu_desc.threads.count): one muon_step, GPT-2 small's %d-layer matrix list, one device, fp32;\n"
         "      median s of 3 steps after a warm-up, interleaved; %ld cores online --\n", layers, cores);
  printf("  %-8s %12s %12s %9s %s\n", "gemm", "1 thread s", "2 threads s", "speedup", "bits");
  for (gi = 0; gi < 2; gi++) {
    muon_optimizer *opt[2];
    float *w[2][4], *g[4];
    double t[2][3], sp;
    int a, k, r, same = 1;
    for (k = 0; k < 4; k++) {
      size_t sz = (size_t)shapes[k][0] * shapes[k][1] * layers;
      g[k] = (float *)malloc(sz * sizeof(float));
      if (!g[k]) { fprintf(stderr, "out of memory\n"); exit(1); }
      fill(g[k], sz, 70u + (unsigned)k);
    }
    for (a = 0; a < 2; a++) {
      muon_desc d = muon_default_desc();
      d.compute = cpu_backend(gi ? MUON_GEMM_CBLAS : MUON_GEMM_BUILTIN, a + 1);
      if (muon_create(&opt[a], &d) != MUON_OK) { fprintf(stderr, "bench_ns: %s\n", muon_error(NULL)); exit(1); }
      for (k = 0; k < 4; k++) {
        muon_matrix m = muon_default_matrix();
        size_t sz = (size_t)shapes[k][0] * shapes[k][1] * layers;
        static const char *names[4] = { "attn.qkv", "attn.proj", "mlp.fc", "mlp.proj" };
        w[a][k] = (float *)malloc(sz * sizeof(float));
        if (!w[a][k]) { fprintf(stderr, "out of memory\n"); exit(1); }
        fill(w[a][k], sz, 80u + (unsigned)k);
        m.name = names[k]; m.param = w[a][k]; m.grad = g[k]; m.rows = shapes[k][0]; m.cols = shapes[k][1]; m.count = layers;
        if (muon_add_matrix(opt[a], &m, NULL) != MUON_OK) { fprintf(stderr, "bench_ns: %s\n", muon_error(opt[a])); exit(1); }
      }
      if (muon_step(opt[a]) != MUON_OK) exit(1);   /* plans, warms up */
    }
    for (r = 0; r < 3; r++)
      for (a = 0; a < 2; a++) {
        int which = r % 2 ? 1 - a : a;
        double t0 = now_s();
        if (muon_step(opt[which]) != MUON_OK) { fprintf(stderr, "bench_ns: %s\n", muon_error(opt[which])); exit(1); }
        t[which][r] = now_s() - t0;
      }
    for (k = 0; k < 4; k++) same &= !memcmp(w[0][k], w[1][k], (size_t)shapes[k][0] * shapes[k][1] * layers * sizeof(float));
    sp = median(t[0], 3) / median(t[1], 3);
    if (!worst_set || sp < worst) { worst = sp; worst_set = 1; }
    printf("  %-8s %12.2f %12.2f %8.2fx %s\n", gi ? "cblas" : "builtin", median(t[0], 3), median(t[1], 3), sp,
           same ? "bitwise equal" : "DIFFER");
    for (a = 0; a < 2; a++) { muon_destroy(opt[a]); for (k = 0; k < 4; k++) free(w[a][k]); }
    for (k = 0; k < 4; k++) free(g[k]);
  }
  printf("  2 threads >= 1.8x faster than 1, both GEMMs (needs 2 idle cores)   : %.2fx  %s\n", worst, verdict(worst >= 1.8));
  return worst;
}

int main(int argc, char **argv) {
  int quick = 0, threads_only = 0, i, s;
  double budget = 8.0, bench_start = now_s();
  const char *out_path = "build/bench_ns.txt";
  const char *threads = getenv("OPENBLAS_NUM_THREADS");
  FILE *out_file = NULL;
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--threads")) threads_only = 1;
    else if (!strcmp(argv[i], "--budget") && i + 1 < argc) budget = atof(argv[++i]);
    else if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--quick] [--threads] [--budget S] [--out FILE|-]\n", argv[0]);
      return 2;
    }
  }
  openblas_set_num_threads(1); /* single-threaded whatever the environment says */

  printf("== bench_ns: Newton-Schulz vs the GEMM ceiling (single-threaded: OPENBLAS_NUM_THREADS=%s, "
         "openblas_set_num_threads(1); muon's built-in GEMM is single-threaded) ==\n",
         threads ? threads : "unset");
  printf("OpenBLAS: %s\n", openblas_get_config());

  loadavg("at start");
  if (threads_only) {   /* section e alone */
    threads_section(quick);
    loadavg("at end");
    return 0;
  }

  /* a. GEMM ceiling and the built-in GEMM at 1024^2, repetitions interleaved (blas, builtin,
     blas, ...) so both see the same machine; the built-in one stops after 3 s or 5 reps. */
  {
    const int n = 1024;
    size_t nn = (size_t)n * n, pf = (size_t)MUON__GEMM_PACK_FLOATS;
    gemm_args g;
    double flops = 2.0 * n * n * (double)n, tb[MAX_REPS], tm[MAX_REPS], spent_builtin = 0, t_blas, t_builtin;
    double ceiling, builtin_rate, ratio;
    int reps_blas = 0, reps_builtin = 0;
    float *A = (float *)malloc(nn * sizeof(float)), *B = (float *)malloc(nn * sizeof(float));
    float *C = (float *)malloc(nn * sizeof(float));
    g.n = n; g.A = A; g.B = B; g.C = C;
    g.pack_floats = pf;
    g.pack = pf ? (float *)malloc(pf * sizeof(float)) : NULL;
    if (!A || !B || !C || (pf && !g.pack)) { fprintf(stderr, "out of memory\n"); return 1; }
    fill(A, nn, 1); fill(B, nn, 2);
    run_cblas(&g);    /* untimed warm-ups */
    run_builtin(&g);
    while (reps_blas < 9) {
      tb[reps_blas++] = time_once(run_cblas, &g);
      if (reps_builtin < 5 && (reps_builtin == 0 || spent_builtin < 3.0)) {
        tm[reps_builtin] = time_once(run_builtin, &g);
        spent_builtin += tm[reps_builtin++];
      }
    }
    t_blas = median(tb, reps_blas);
    t_builtin = median(tm, reps_builtin);
    ceiling = flops / t_blas;
    builtin_rate = flops / t_builtin;
    ratio = builtin_rate / ceiling;
    printf("\n-- a. GEMM 1024x1024x1024 (C = A*B, fp32), medians, repetitions interleaved --\n");
    printf("  CBLAS sgemm (the ceiling) : %8.2f ms  %7.1f GFLOP/s  (%d reps)\n", 1e3 * t_blas, ceiling * 1e-9, reps_blas);
    printf("  muon built-in muon__sgemm : %8.2f ms  %7.1f GFLOP/s  (%d reps, pack buffer MUON__GEMM_PACK_FLOATS = %zu floats)\n",
           1e3 * t_builtin, builtin_rate * 1e-9, reps_builtin, pf);
    printf("  built-in / OpenBLAS       : %.3f   target >= 0.50: %s\n", ratio, verdict(ratio >= 0.5));
    free(g.pack);

    /* b. Newton-Schulz */
    {
      static const int shapes[4][2] = { { 512, 512 }, { 1024, 1024 }, { 1024, 4096 }, { 4096, 1024 } };
      static const int reps_of[4] = { 5, 3, 2, 2 };
      variant v[4] = { { "builtin plain", MUON_GEMM_BUILTIN, 0, 0 }, { "builtin symm ", MUON_GEMM_BUILTIN, 1, 0 },
                       { "cblas   plain", MUON_GEMM_CBLAS, 0, 0 },   { "cblas   symm ", MUON_GEMM_CBLAS, 1, 0 } };
      int n_shapes = quick ? 2 : 4, k;
      int cblas_met[2] = { 1, 1 }, cblas_seen[2] = { 0, 0 }, sym_met[2] = { 1, 1 }, sym_seen[2] = { 0, 0 };
      if (strcmp(out_path, "-") != 0) {
        out_file = fopen(out_path, "w");
        if (!out_file) fprintf(stderr, "bench_ns: cannot write %s (numpy comparison will lack C figures)\n", out_path);
        else fprintf(out_file, "# rows cols cblas_plain_ms cblas_symm_ms ceiling_gflops (written by bench_ns)\n");
      }
      printf("\n-- b. muon_newton_schulz, 5 quintic steps, fp32, median ms --\n"
             "   GFLOP/s counts the plain algorithm's flops 5*(4m^2n+2m^3) for every variant (so symmetric shows a\n"
             "   higher effective rate); 'of ceiling' = ideal time (those flops at the sgemm 1024^2 rate measured\n"
             "   beside that shape) / measured time; it can exceed 1 for symmetric, which does fewer flops.\n");
      printf("  %-11s %-14s %10s %9s %11s %5s %16s\n", "shape", "variant", "ms", "GFLOP/s", "of ceiling", "reps", "symm/plain");
      for (s = 0; s < n_shapes; s++) {
        int rows = shapes[s][0], cols = shapes[s][1];
        size_t sz = (size_t)rows * cols;
        float *in = (float *)malloc(sz * sizeof(float)), *o = (float *)malloc(sz * sizeof(float));
        double flops_ns = ns_flops(rows, cols, 5);
        result res[4];
        double ceil_t[8 * MAX_REPS];
        int n_ceil;
        char shape[32];
        if (!in || !o) { fprintf(stderr, "out of memory\n"); return 1; }
        fill(in, sz, 3u + (unsigned)s);
        snprintf(shape, sizeof shape, "%dx%d", rows, cols);
        n_ceil = 0;
        time_pair(&v[0], rows, cols, reps_of[s], budget, in, o, &g, &res[0], ceil_t, &n_ceil);
        time_pair(&v[2], rows, cols, reps_of[s], budget, in, o, &g, &res[2], ceil_t, &n_ceil);
        ceiling = 2.0 * 1024.0 * 1024.0 * 1024.0 / median(ceil_t, n_ceil);
        printf("  %-11s (sgemm 1024^2 ceiling from %d samples interleaved with this shape's runs: %.1f GFLOP/s)\n",
               shape, n_ceil, ceiling * 1e-9);
        for (k = 0; k < 4; k++) {
          if (res[k].state == 3) {
            printf("  %-11s %-14s   stopped: no repetition finished within the budget (%.0f s; < %.2f GFLOP/s)\n",
                   shape, v[k].name, res[k].predicted_s, flops_ns / res[k].predicted_s * 1e-9);
          } else if (res[k].state == 2) {
            printf("  %-11s %-14s   skipped: a smaller shape did not finish within --budget\n", shape, v[k].name);
          } else if (res[k].state == 1) {
            printf("  %-11s %-14s   skipped: predicted %.1f s per repetition > --budget %.0f s\n", shape, v[k].name,
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
              cblas_seen[k - 2] = 1;
              if (frac < 0.8) cblas_met[k - 2] = 0;
            }
          }
        }
        if (out_file)
          fprintf(out_file, "%d %d %.4f %.4f %.3f\n", rows, cols, res[2].ms, res[3].ms, ceiling * 1e-9);
        free(in); free(o);
      }
      if (out_file) fclose(out_file);
      free(A); free(B); free(C);
      printf("\n-- targets --\n");
      printf("  built-in GEMM >= 0.50 x OpenBLAS at 1024^2                        : %.3f  %s\n", ratio, verdict(ratio >= 0.5));
      printf("  CBLAS NS >= 0.80 of the ceiling, symmetric (default), every shape : %s\n",
             cblas_seen[1] ? verdict(cblas_met[1]) : "not measured");
      printf("  CBLAS NS >= 0.80 of the ceiling, plain, every shape               : %s\n",
             cblas_seen[0] ? verdict(cblas_met[0]) : "not measured");
      printf("  symmetric >= 1.2x faster than plain, built-in GEMM, every shape   : %s\n",
             sym_seen[0] ? verdict(sym_met[0]) : "not measured (skipped)");
      printf("  symmetric >= 1.2x faster than plain, CBLAS, every shape           : %s\n",
             sym_seen[1] ? verdict(sym_met[1]) : "not measured");
    }
  }
  gram_section(quick);
  normuon_section(quick);
  loadavg("before threads");
  threads_section(quick);
  loadavg("at end");
  printf("bench_ns: %.0f s\n", now_s() - bench_start);
  return 0;
}
