/* test.h - the few macros every muon test program shares.

   A test program calls TEST_CASE("name") before each case, CHECK(cond, fmt, ...) for each
   assertion, and returns test_summary() from main. test_summary prints the closing line
   "N passed, M failed" that tests/run.sh adds up; a case passes when none of its CHECKs failed. */
#ifndef MUON_TEST_H
#define MUON_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* test_exit: _exit for ranks that must skip teardown (a dead peer, a crash). Under `make coverage`
   (MUON_COVERAGE) it first writes gcov's counters, which _exit would drop. */
#ifdef MUON_COVERAGE
void __gcov_dump(void);
#define test_exit(code) (__gcov_dump(), _exit(code))
#else
#define test_exit(code) _exit(code)
#endif

/* An allocator (muon_allocator) that fails its n-th allocation, counting from 0, and counts the
   blocks live: the allocation-failure sweeps set fail_at and check live == 0 after. */
typedef struct { int calls, fail_at; long live; } fail_alloc;
static inline void *fa_alloc(size_t size, void *u) {
  fail_alloc *f = (fail_alloc *)u;
  void *p;
  if (f->calls++ == f->fail_at) return NULL;
  p = malloc(size);
  if (p) f->live++;
  return p;
}
static inline void fa_free(void *p, void *u) {
  fail_alloc *f = (fail_alloc *)u;
  if (p) { f->live--; free(p); }
}

static int test__passed, test__failed, test__case_failed, test__in_case;
static const char *test__case = "";

static void test__end_case(void) {
  if (!test__in_case) return;
  if (test__case_failed) test__failed++; else test__passed++;
  test__in_case = 0;
}

static inline void TEST_CASE(const char *name) {
  test__end_case();
  test__case = name;
  test__case_failed = 0;
  test__in_case = 1;
}

static void test__fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  if (!test__case_failed) printf("FAIL %s\n", test__case);
  test__case_failed = 1;
  printf("  %s:%d: ", file, line);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
}

#define CHECK(cond, ...) do { if (!(cond)) test__fail(__FILE__, __LINE__, __VA_ARGS__); } while (0)

/* Relative error of a against reference b: max |a-b| / max(max |b|, tiny). */
static inline double test_rel_err(const float *a, const double *b, size_t n, size_t *worst) {
  double num = 0, den = 1e-30;
  size_t i, w = 0;
  for (i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d != d) { if (worst) *worst = i; return HUGE_VAL; }   /* NaN: no tolerance admits it */
    if (d > num) { num = d; w = i; }
    if (fabs(b[i]) > den) den = fabs(b[i]);
  }
  if (worst) *worst = w;
  return num / den;
}

/* Two state blobs (muon_state_save) of n bytes holding the same state: equal but for the run's
   identity (header bytes 32..40) and so the checksum. Separate distributed optimizers are
   separate runs. */
static inline int test_same_state(const void *a, const void *b, size_t n) {
  const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
  return n >= 48 && memcmp(x, y, 32) == 0 && memcmp(x + 40, y + 40, n - 48) == 0;
}

static inline int test_summary(void) {
  test__end_case();
  printf("%d passed, %d failed\n", test__passed, test__failed);
  return test__failed ? 1 : 0;
}

#endif
