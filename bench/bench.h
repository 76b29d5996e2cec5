/* bench.h - the helpers the benchmarks share: a monotonic clock, the median, the load average. */
#ifndef MUON_BENCH_H
#define MUON_BENCH_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Sorts t in place. */
static double median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* The 1-minute load average (-1 where /proc/loadavg cannot be read): printed beside the ratios. */
static double load_average(void) {
  FILE *f = fopen("/proc/loadavg", "r");
  double a = -1;
  if (f) {
    if (fscanf(f, "%lf", &a) != 1) a = -1;
    fclose(f);
  }
  return a;
}

#endif
