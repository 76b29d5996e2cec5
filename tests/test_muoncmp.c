/* test_muoncmp - runs tools/muoncmp on dumps this program writes itself.

   usage: test_muoncmp DIR MUONCMP
     DIR      scratch directory for the dumps and the captured output (created if absent)
     MUONCMP  the muoncmp binary to test

   Build: cc -std=c99 -Wall -Wextra -Wpedantic -D_POSIX_C_SOURCE=200809L -Itests \
            tests/test_muoncmp.c -o build/test_muoncmp
   The writer below implements the dump format described at the top of tools/muoncmp.c. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "test.h"

static const char *dir, *tool;

/* ---- a small dump writer ---- */

typedef struct {
  unsigned char *p;
  size_t n, cap;
} tbuf;

static void put_bytes(tbuf *b, const void *src, size_t n) {
  if (b->n + n > b->cap) {
    while (b->n + n > b->cap) b->cap = b->cap ? 2 * b->cap : 256;
    b->p = (unsigned char *)realloc(b->p, b->cap);
    if (!b->p) { fprintf(stderr, "out of memory\n"); exit(2); }
  }
  memcpy(b->p + b->n, src, n);
  b->n += n;
}

static void put_u32(tbuf *b, uint32_t v) {
  unsigned char x[4];
  int i;
  for (i = 0; i < 4; i++) x[i] = (unsigned char)(v >> (8 * i));
  put_bytes(b, x, 4);
}

static void put_u64(tbuf *b, uint64_t v) {
  put_u32(b, (uint32_t)v);
  put_u32(b, (uint32_t)(v >> 32));
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint64_t fnv1a(const unsigned char *p, size_t n) {
  uint64_t h = 14695981039346656037ULL;
  size_t i;
  for (i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ULL; }
  return h;
}

static void dump_begin(tbuf *b, uint32_t count) {
  b->n = 0;
  put_bytes(b, "MUONDUMP", 8);
  put_u32(b, 1);
  put_u32(b, count);
  put_u64(b, 100);
}

/* Appends one record; returns the offset of its first data byte. */
static size_t dump_record(tbuf *b, uint32_t kind, const char *name, uint32_t rows, uint32_t cols,
                          const float *data) {
  size_t start = b->n, data_at, i;
  put_u32(b, kind);
  put_u32(b, (uint32_t)strlen(name));
  put_bytes(b, name, strlen(name));
  put_u32(b, rows);
  put_u32(b, cols);
  data_at = b->n;
  for (i = 0; i < (size_t)rows * cols; i++) put_u32(b, f32_bits(data[i]));
  put_u64(b, fnv1a(b->p + start, b->n - start));
  return data_at;
}

static char *path_of(const char *file) {
  static char bufs[4][1024];
  static int k;
  k = (k + 1) % 4;
  if (snprintf(bufs[k], sizeof bufs[k], "%s/%s", dir, file) >= (int)sizeof bufs[k]) {
    fprintf(stderr, "path too long: %s/%s\n", dir, file);
    exit(2);
  }
  return bufs[k];
}

static void write_file(const char *file, const tbuf *b, size_t n) {
  FILE *f = fopen(path_of(file), "wb");
  if (!f || fwrite(b->p, 1, n, f) != n || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s: %s\n", path_of(file), strerror(errno));
    exit(2);
  }
}

/* ---- the standard three tensors ---- */

#define R 12
#define C 20
#define NA 30
static float param[R * C], mom[R * C], adam[NA];

static void make_data(void) {
  int i;
  for (i = 0; i < R * C; i++) param[i] = (float)i * 0.5f + 0.25f; /* distinct, exact */
  for (i = 0; i < R * C; i++) mom[i] = (float)(i % 7) - 3.0f;
  for (i = 0; i < NA; i++) adam[i] = (float)i / 8.0f;
}

/* Writes the three tensors, with p as the param's data (shape rows x cols). */
static void write_std(const char *file, const float *p, uint32_t rows, uint32_t cols) {
  tbuf b = {NULL, 0, 0};
  dump_begin(&b, 3);
  dump_record(&b, 0, "h.mlp.fc[3]", rows, cols, p);
  dump_record(&b, 1, "h.mlp.fc[3]", R, C, mom);
  dump_record(&b, 2, "wte.bias", 1, NA, adam);
  write_file(file, &b, b.n);
  free(b.p);
}

/* ---- running the tool ---- */

static char out[1 << 16], err[1 << 16], all[1 << 17];

static void slurp(const char *path, char *dst, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t n = 0;
  if (f) { n = fread(dst, 1, cap - 1, f); fclose(f); }
  dst[n] = 0;
}

/* Runs `tool PA PB [extra]` (paths as given, after the shell commands `first`); returns its exit
   code and fills out, err and all (out + err). */
static int run_paths(const char *pa, const char *pb, const char *extra, const char *first) {
  char cmd[4096], po[1024], pe[1024];
  int st;
  snprintf(po, sizeof po, "%s", path_of("out.txt"));
  snprintf(pe, sizeof pe, "%s", path_of("err.txt"));
  if (snprintf(cmd, sizeof cmd, "%s '%s' '%s' '%s' %s >'%s' 2>'%s'", first, tool, pa, pb,
               extra ? extra : "", po, pe) >= (int)sizeof cmd) {
    fprintf(stderr, "command too long\n");
    exit(2);
  }
  st = system(cmd);
  slurp(po, out, sizeof out);
  slurp(pe, err, sizeof err);
  snprintf(all, sizeof all, "%s%s", out, err);
  if (st == -1 || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

/* Runs `tool A B [extra]` on files in the scratch directory. */
static int run(const char *a, const char *b, const char *extra) {
  char pa[1024], pb[1024];
  snprintf(pa, sizeof pa, "%s", path_of(a));
  snprintf(pb, sizeof pb, "%s", path_of(b));
  return run_paths(pa, pb, extra, "");
}

/* A muoncmp that blocks on a FIFO would hang the suite: after 20 s, open the FIFO (so that the
   tool's open returns and it sees end of file when this program exits) and fail. */
static char hang_fifo[1024];
static void on_alarm(int sig) {
  static const char msg[] = "FAIL muoncmp hung on a FIFO (no answer in 20 s)\n";
  (void)sig;
  if (open(hang_fifo, O_RDWR | O_NONBLOCK) < 0 || write(1, msg, sizeof msg - 1) < 0) _exit(1);
  _exit(1);
}

#define HAS(s) CHECK(strstr(all, (s)) != NULL, "output lacks \"%s\":\n%s", (s), all)
#define LACKS(s) CHECK(strstr(all, (s)) == NULL, "output has \"%s\":\n%s", (s), all)
#define EXIT_IS(rc, want) CHECK((rc) == (want), "exit %d, want %d; output:\n%s", (rc), (want), all)

/* An unusable-file message goes to stderr and starts with "muoncmp: '<path>': ". */
static void check_error_prefix_path(const char *path) {
  char prefix[1200];
  snprintf(prefix, sizeof prefix, "muoncmp: '%s': ", path);
  CHECK(strncmp(err, prefix, strlen(prefix)) == 0, "stderr does not start with \"%s\":\n%s",
        prefix, err);
  CHECK(strstr(out, "tensors bitwise equal") == NULL, "closing line after an error:\n%s", out);
}
static void check_error_prefix(const char *file) { check_error_prefix_path(path_of(file)); }

int main(int argc, char **argv) {
  static float p2[R * C];
  char want[2400];
  tbuf b = {NULL, 0, 0};
  size_t at;
  int rc, i;

  if (argc != 3) {
    fprintf(stderr, "usage: test_muoncmp DIR MUONCMP\n");
    return 2;
  }
  dir = argv[1];
  tool = argv[2];
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "mkdir %s: %s\n", dir, strerror(errno));
    return 2;
  }
  make_data();
  write_std("a.dump", param, R, C);

  TEST_CASE("identical dumps");
  write_std("a2.dump", param, R, C);
  rc = run("a.dump", "a2.dump", NULL);
  EXIT_IS(rc, 0);
  HAS("muoncmp: 3 of 3 tensors bitwise equal");
  HAS("equal   param h.mlp.fc[3] (12 x 20)");
  HAS("equal   momentum h.mlp.fc[3] (12 x 20)");
  HAS("equal   adamw wte.bias (1 x 30)");
  LACKS("DIFFERS");
  rc = run("a.dump", "a2.dump", "--quiet");
  EXIT_IS(rc, 0);
  LACKS("equal   ");
  HAS("muoncmp: 3 of 3 tensors bitwise equal");

  TEST_CASE("one element changed at row 5, col 7");
  memcpy(p2, param, sizeof p2);
  p2[5 * C + 7] = -7.125f; /* was 53.75 */
  write_std("one.dump", p2, R, C);
  rc = run("a.dump", "one.dump", NULL);
  EXIT_IS(rc, 1);
  HAS("DIFFERS param h.mlp.fc[3] (12 x 20)");
  HAS("row 5, col 7");
  HAS("53.75 vs -7.125");
  HAS("1 differing element of 240");
  HAS("max abs diff 60.875");
  HAS("rows [5, 5], cols [7, 7]");
  HAS("equal   momentum h.mlp.fc[3]");
  HAS("muoncmp: 2 of 3 tensors bitwise equal");
  LACKS("whole matrix");

  TEST_CASE("a band of rows 4..6");
  memcpy(p2, param, sizeof p2);
  for (i = 4 * C; i < 7 * C; i++) p2[i] += 1.0f;
  p2[6 * C + 19] += 1.0f; /* the first difference stays at row 4, col 0 */
  write_std("band.dump", p2, R, C);
  rc = run("a.dump", "band.dump", NULL);
  EXIT_IS(rc, 1);
  HAS("60 differing elements of 240");
  HAS("first at row 4, col 0: 40.25 vs 41.25");
  HAS("rows [4, 6], cols [0, 19]");
  HAS("a band of rows");
  LACKS("a band of columns");
  LACKS("whole matrix");

  TEST_CASE("a band of columns 2..3");
  memcpy(p2, param, sizeof p2);
  for (i = 0; i < R; i++) { p2[i * C + 2] = 0.0f; p2[i * C + 3] = 0.0f; }
  write_std("cband.dump", p2, R, C);
  rc = run("a.dump", "cband.dump", NULL);
  EXIT_IS(rc, 1);
  HAS("24 differing elements");
  HAS("rows [0, 11], cols [2, 3]");
  HAS("a band of columns");
  LACKS("a band of rows");

  TEST_CASE("transposed data: whole matrix");
  { /* the 20 x 12 transpose, stored under the 12 x 20 shape */
    int r, c;
    for (r = 0; r < R; r++)
      for (c = 0; c < C; c++) p2[c * R + r] = param[r * C + c];
  }
  write_std("transposed.dump", p2, R, C);
  rc = run("a.dump", "transposed.dump", NULL);
  EXIT_IS(rc, 1);
  HAS("first at row 0, col 1: 0.75 vs 10.25");
  HAS("rows [0, 11], cols [0, 19]");
  HAS("whole matrix");
  LACKS("band of");

  TEST_CASE("shape mismatch");
  write_std("shape.dump", param, C, R);
  rc = run("a.dump", "shape.dump", NULL);
  EXIT_IS(rc, 1);
  HAS("DIFFERS param h.mlp.fc[3]: shape 12 x 20 vs 20 x 12");
  HAS("muoncmp: 2 of 3 tensors bitwise equal");

  TEST_CASE("a tensor only in one file");
  dump_begin(&b, 4);
  dump_record(&b, 2, "extra.bias", 1, 4, adam);
  dump_record(&b, 0, "h.mlp.fc[3]", R, C, param);
  dump_record(&b, 1, "h.mlp.fc[3]", R, C, mom);
  dump_record(&b, 2, "wte.bias", 1, NA, adam);
  write_file("extra.dump", &b, b.n);
  rc = run("a.dump", "extra.dump", NULL);
  EXIT_IS(rc, 1);
  HAS("only in B: adamw extra.bias (1 x 4)");
  HAS("muoncmp: 3 of 4 tensors bitwise equal");
  rc = run("extra.dump", "a.dump", "--quiet");
  EXIT_IS(rc, 1);
  HAS("only in A: adamw extra.bias (1 x 4)");
  HAS("muoncmp: 3 of 4 tensors bitwise equal");

  TEST_CASE("truncated inside record 2's data");
  dump_begin(&b, 3);
  dump_record(&b, 0, "h.mlp.fc[3]", R, C, param);
  dump_record(&b, 1, "h.mlp.fc[3]", R, C, mom);
  at = dump_record(&b, 2, "wte.bias", 1, NA, adam);
  write_file("trunc.dump", &b, at + 4 * NA / 2);
  rc = run("a.dump", "trunc.dump", NULL);
  EXIT_IS(rc, 2);
  HAS("truncated");
  HAS("record 2");
  HAS("wte.bias");
  HAS("1 x 30");
  check_error_prefix("trunc.dump");
  write_file("trunc_head.dump", &b, at - 12); /* inside record 2's name */
  rc = run("trunc_head.dump", "a.dump", NULL);
  EXIT_IS(rc, 2);
  HAS("truncated inside record 2");
  check_error_prefix("trunc_head.dump");

  TEST_CASE("checksum mismatch");
  dump_begin(&b, 3);
  dump_record(&b, 0, "h.mlp.fc[3]", R, C, param);
  at = dump_record(&b, 1, "h.mlp.fc[3]", R, C, mom);
  dump_record(&b, 2, "wte.bias", 1, NA, adam);
  b.p[at + 4 * 33 + 1] ^= 0x10;
  write_file("flip.dump", &b, b.n);
  rc = run("a.dump", "flip.dump", NULL);
  EXIT_IS(rc, 2);
  HAS("checksum");
  HAS("record 1");
  HAS("h.mlp.fc[3]");
  check_error_prefix("flip.dump");

  TEST_CASE("bad magic, missing file");
  dump_begin(&b, 3);
  dump_record(&b, 0, "h.mlp.fc[3]", R, C, param);
  dump_record(&b, 1, "h.mlp.fc[3]", R, C, mom);
  dump_record(&b, 2, "wte.bias", 1, NA, adam);
  b.p[7] = 'Q';
  write_file("magic.dump", &b, b.n);
  rc = run("a.dump", "magic.dump", NULL);
  EXIT_IS(rc, 2);
  HAS("not a muon dump");
  check_error_prefix("magic.dump");
  rc = run("no-such.dump", "a.dump", NULL);
  EXIT_IS(rc, 2);
  HAS(strerror(ENOENT));
  check_error_prefix("no-such.dump");

  TEST_CASE("trailing bytes, duplicate (kind, name)");
  dump_begin(&b, 3);
  dump_record(&b, 0, "h.mlp.fc[3]", R, C, param);
  dump_record(&b, 1, "h.mlp.fc[3]", R, C, mom);
  dump_record(&b, 2, "wte.bias", 1, NA, adam);
  put_bytes(&b, "x", 1);
  write_file("trail.dump", &b, b.n);
  rc = run("a.dump", "trail.dump", NULL);
  EXIT_IS(rc, 2);
  HAS("trailing");
  check_error_prefix("trail.dump");
  dump_begin(&b, 3);
  dump_record(&b, 0, "h.mlp.fc[3]", R, C, param);
  dump_record(&b, 1, "h.mlp.fc[3]", R, C, mom);
  dump_record(&b, 0, "h.mlp.fc[3]", R, C, param);
  write_file("dup.dump", &b, b.n);
  rc = run("dup.dump", "a.dump", NULL);
  EXIT_IS(rc, 2);
  HAS("twice");
  HAS("records 0 and 2");
  check_error_prefix("dup.dump");

  TEST_CASE("NaN: same bits equal, NaN vs number differs");
  memcpy(p2, param, sizeof p2);
  p2[3] = bits_f32(0x7fc00123u);
  write_std("nan1.dump", p2, R, C);
  write_std("nan2.dump", p2, R, C);
  rc = run("nan1.dump", "nan2.dump", NULL);
  EXIT_IS(rc, 0);
  HAS("muoncmp: 3 of 3 tensors bitwise equal");
  rc = run("nan1.dump", "a.dump", NULL);
  EXIT_IS(rc, 1);
  HAS("1 differing element of 240");
  HAS("max abs diff inf");
  HAS("first at row 0, col 3: nan vs 1.75");
  p2[3] = bits_f32(0x7fc00456u); /* another NaN: different bits differ */
  write_std("nan3.dump", p2, R, C);
  rc = run("nan1.dump", "nan3.dump", NULL);
  EXIT_IS(rc, 1);
  HAS("1 differing element of 240");
  HAS("bits 7fc00123 vs 7fc00456");

  TEST_CASE("bad headers: version, name length, zero rows, overflow");
  dump_begin(&b, 1);
  b.p[8] = 2;
  dump_record(&b, 2, "wte.bias", 1, NA, adam);
  write_file("version.dump", &b, b.n);
  rc = run("version.dump", "a.dump", NULL);
  EXIT_IS(rc, 2);
  HAS("unsupported version 2");
  check_error_prefix("version.dump");
  dump_begin(&b, 1);
  put_u32(&b, 2);
  put_u32(&b, 0); /* name_len 0 */
  put_bytes(&b, "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 24);
  write_file("noname.dump", &b, b.n);
  rc = run("a.dump", "noname.dump", NULL);
  EXIT_IS(rc, 2);
  HAS("name length 0");
  check_error_prefix("noname.dump");
  dump_begin(&b, 1);
  at = dump_record(&b, 2, "wte.bias", 1, NA, adam);
  b.p[at - 8] = 0; /* rows 0 */
  write_file("rows0.dump", &b, b.n);
  rc = run("a.dump", "rows0.dump", NULL);
  EXIT_IS(rc, 2);
  HAS("rows and cols must be >= 1");
  check_error_prefix("rows0.dump");
  dump_begin(&b, 1);
  put_u32(&b, 0);
  put_u32(&b, 1);
  put_bytes(&b, "w", 1);
  put_u32(&b, 0xffffffffu);
  put_u32(&b, 0xffffffffu);
  put_u64(&b, 0);
  write_file("huge.dump", &b, b.n);
  rc = run("a.dump", "huge.dump", NULL);
  EXIT_IS(rc, 2);
  HAS("overflow");
  check_error_prefix("huge.dump");
  TEST_CASE("not a regular file: /dev/zero, a FIFO, a directory: refused before any read");
  {
    /* a reader that grows without end fails at 1 GiB of address space instead of eating memory */
    const char *guard = "ulimit -v 1048576 2>/dev/null;";
    struct stat st;
    if (stat("/dev/zero", &st) == 0 && S_ISCHR(st.st_mode)) {
      rc = run_paths(path_of("a.dump"), "/dev/zero", NULL, guard);
      EXIT_IS(rc, 2);
      HAS("a character device, not a regular file");
      check_error_prefix_path("/dev/zero");
    } else {
      printf("  skipped: /dev/zero (no such character device here)\n");
    }
    snprintf(hang_fifo, sizeof hang_fifo, "%s", path_of("fifo"));
    remove(hang_fifo);
    CHECK(mkfifo(hang_fifo, 0600) == 0, "mkfifo %s: %s", hang_fifo, strerror(errno));
    fflush(stdout);
    signal(SIGALRM, on_alarm);
    alarm(20);
    rc = run("fifo", "a.dump", NULL);
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    EXIT_IS(rc, 2);
    HAS("a FIFO, not a regular file");
    check_error_prefix("fifo");
    remove(hang_fifo);
    rc = run_paths(path_of("a.dump"), dir, NULL, guard);
    EXIT_IS(rc, 2);
    HAS("a directory, not a regular file");
    check_error_prefix_path(dir);
  }

  TEST_CASE("a file longer than fstat says (procfs: 0 bytes, then text) is refused, not cut short");
  {
    struct stat st;
    if (stat("/proc/self/status", &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0) {
      rc = run_paths(path_of("a.dump"), "/proc/self/status", NULL, "");
      EXIT_IS(rc, 2);
      HAS("changed while it was read");
    } else {
      printf("  skipped: no /proc/self/status of size 0 here\n");
    }
  }

  snprintf(want, sizeof want, "'%s' >'%s' 2>&1", tool, path_of("out.txt"));
  rc = system(want);
  CHECK(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "no arguments: status %d", rc);

  free(b.p);
  return test_summary();
}
