/* muoncmp - compare two muon optimizer dumps tensor by tensor.

   usage: muoncmp A.dump B.dump [--quiet]

   Records are matched by (kind, name). For each tensor present in both files it prints
     equal   <kind> <name> (<rows> x <cols>)             (left out with --quiet)
   or one DIFFERS line with the number of differing elements (bitwise: two NaNs with the same
   bits are equal), the max absolute and max relative difference (|a-b| / max(|a|,|b|); a NaN or
   an Inf on one side is an infinite difference), the first differing element in row-major order
   (row, col, both values with %.9g), the bounding box of the differing elements
   "rows [r0, r1], cols [c0, c1]" and a hint: "whole matrix" when every row and every column has
   a difference, "a band of rows" when the differing rows are a contiguous proper sub-range of
   the rows, "a band of columns" likewise. A shape mismatch prints "DIFFERS ... shape R x C vs
   R' x C'". A record in one file only prints "only in A: ..." or "only in B: ...". The last line
   is always "muoncmp: N of M tensors bitwise equal", M counting the union of both files.

   Exit status: 0 when every tensor is bitwise equal and none is missing, 1 when anything
   differs or is missing, 2 for bad usage or an unusable file (message on stderr, starting
   "muoncmp: '<path>': "). A file is unusable when it cannot be read, is not a regular file (a
   FIFO, a device such as /dev/zero, a directory: refused before any read), changes size while
   it is read, has a bad magic or an unsupported version, is truncated, has a checksum mismatch,
   a name length outside 1..4096, zero rows or cols, an unknown kind, a size that would
   overflow, bytes after the last record, or the same (kind, name) twice. Records are numbered
   from 0 in these messages.

   The dump format (little-endian, version 1), as muon.h writes it:
     "MUONDUMP"            8 bytes
     u32 version           1
     u32 count             number of records
     u64 steps             optimizer step count when dumped
     count records, each:
       u32 kind            0 = a Muon matrix's parameter, 1 = that matrix's momentum,
                           2 = an AdamW parameter
       u32 name_len        1..4096
       name_len bytes      the name, no NUL (e.g. "h.mlp.fc[3]")
       u32 rows, u32 cols  the full tensor's shape (AdamW: rows 1, cols = its element count)
       rows*cols f32       the data, row-major, IEEE-754 little-endian
       u64 checksum        FNV-1a 64 over the record's bytes from `kind` through the last data byte
   Nothing follows the last record.

   Build: cc -std=c99 -Wall -Wextra -Wpedantic -O2 tools/muoncmp.c -o muoncmp
*/
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#define CMP_POSIX 1
#endif

#define CMP_VERSION 1
#define CMP_HEADER_BYTES 24   /* magic, version, count, steps */
#define CMP_MIN_RECORD_BYTES 29 /* kind, name_len, 1 name byte, rows, cols, 1 element, checksum */
#define CMP_MAX_NAME 4096

typedef struct cmp_record {
  uint32_t kind;
  uint32_t name_len;
  const char *name;           /* points into the file's bytes, not NUL-terminated */
  uint32_t rows, cols;
  const unsigned char *data;  /* rows*cols little-endian f32, inside the file's bytes */
  uint32_t index;             /* position in its file, from 0 */
  int matched;                /* B only: a record of A has the same (kind, name) */
} cmp_record;

typedef struct cmp_dump {
  const char *path;
  unsigned char *bytes;
  size_t size;
  uint64_t steps;
  uint32_t count;
  cmp_record *rec;      /* count records, in file order */
  cmp_record **sorted;  /* the same, sorted by (kind, name) */
} cmp_dump;

static const char *cmp_kind_names[3] = {"param", "momentum", "adamw"};

static void cmp_error(const char *path, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "muoncmp: '%s': ", path);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
}

static uint32_t cmp_u32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t cmp_u64(const unsigned char *p) {
  return (uint64_t)cmp_u32(p) | (uint64_t)cmp_u32(p + 4) << 32;
}

static float cmp_f32(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static uint64_t cmp_fnv1a(const unsigned char *p, size_t n) {
  uint64_t h = 14695981039346656037ULL;
  size_t i;
  for (i = 0; i < n; i++) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

/* Reads the whole file into d->bytes: a regular file only, checked with fstat on the opened
   descriptor before any read (opened O_NONBLOCK, so that a FIFO cannot block), into a buffer of
   the size fstat gives, where the file must end. Elsewhere: stdio, sized by ftell. Returns 0
   (after a message) on failure; cmp_free releases d->bytes either way. */
static int cmp_read_file(cmp_dump *d) {
  size_t got = 0;
  int err = 0;
#ifdef CMP_POSIX
  struct stat st;
  int fd = open(d->path, O_RDONLY | O_NONBLOCK);
  if (fd < 0) {
    cmp_error(d->path, "cannot open: %s", strerror(errno));
    return 0;
  }
  if (fstat(fd, &st) != 0) {
    cmp_error(d->path, "cannot stat: %s", strerror(errno));
    close(fd);
    return 0;
  }
  if (!S_ISREG(st.st_mode)) {
    cmp_error(d->path, "%s, not a regular file",
              S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO"
              : S_ISCHR(st.st_mode) ? "a character device" : S_ISBLK(st.st_mode) ? "a block device"
              : "a special file");
    close(fd);
    return 0;
  }
  if (st.st_size < 0 || (uint64_t)st.st_size >= (uint64_t)(SIZE_MAX / 2)) {
    cmp_error(d->path, "file too large");
    close(fd);
    return 0;
  }
  d->size = (size_t)st.st_size;
  d->bytes = (unsigned char *)malloc(d->size + 1); /* one byte more: the end of the file */
  while (d->bytes && got <= d->size) {
    ssize_t r = read(fd, d->bytes + got, d->size + 1 - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) err = errno ? errno : EIO;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
#else
  FILE *f = fopen(d->path, "rb");
  long end;
  if (!f) {
    cmp_error(d->path, "cannot open: %s", strerror(errno));
    return 0;
  }
  if (fseek(f, 0, SEEK_END) != 0 || (end = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    cmp_error(d->path, "read error: %s", strerror(errno ? errno : EIO));
    fclose(f);
    return 0;
  }
  d->size = (size_t)end;
  d->bytes = (unsigned char *)malloc(d->size + 1);
  if (d->bytes) got = fread(d->bytes, 1, d->size + 1, f);
  if (d->bytes && ferror(f)) err = errno ? errno : EIO;
  fclose(f);
#endif
  if (!d->bytes) {
    cmp_error(d->path, "out of memory");
    return 0;
  }
  if (err) {
    cmp_error(d->path, "read error: %s", strerror(err));
    return 0;
  }
  if (got != d->size) {
    cmp_error(d->path, "changed while it was read (%s %zu bytes)",
              got > d->size ? "it grew past" : "it shrank from", d->size);
    return 0;
  }
  return 1;
}

/* Orders records by kind, then name bytes, then name length. */
static int cmp_order(const cmp_record *a, const cmp_record *b) {
  uint32_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
  int c;
  if (a->kind != b->kind) return a->kind < b->kind ? -1 : 1;
  c = memcmp(a->name, b->name, n);
  if (c != 0) return c;
  if (a->name_len != b->name_len) return a->name_len < b->name_len ? -1 : 1;
  return 0;
}

static int cmp_order_qsort(const void *a, const void *b) {
  return cmp_order(*(cmp_record *const *)a, *(cmp_record *const *)b);
}

/* Says what is known of record i when the file ends inside it. */
static void cmp_truncated(const char *path, uint32_t i, const char *name, uint32_t name_len,
                          int have_shape, uint32_t rows, uint32_t cols) {
  if (!name)
    cmp_error(path, "truncated inside record %u (before its name)", (unsigned)i);
  else if (!have_shape)
    cmp_error(path, "truncated inside record %u (\"%.*s\", before its shape)", (unsigned)i,
              (int)name_len, name);
  else
    cmp_error(path, "truncated inside record %u (\"%.*s\", %u x %u)", (unsigned)i,
              (int)name_len, name, (unsigned)rows, (unsigned)cols);
}

/* Reads and checks the file d->path. Returns 0 (after a message) when it is unusable. */
static int cmp_load(cmp_dump *d) {
  const unsigned char *b;
  size_t pos, fit, cap;
  uint32_t version, i;
  if (!cmp_read_file(d)) return 0;
  b = d->bytes;
  if (d->size == 0) {
    cmp_error(d->path, "not a muon dump (empty file)");
    return 0;
  }
  if (memcmp(b, "MUONDUMP", d->size < 8 ? d->size : 8) != 0) {
    cmp_error(d->path, "not a muon dump (bad magic)");
    return 0;
  }
  if (d->size < CMP_HEADER_BYTES) {
    cmp_error(d->path, "truncated inside the file header (%zu of %d bytes)", d->size,
              CMP_HEADER_BYTES);
    return 0;
  }
  version = cmp_u32(b + 8);
  if (version != CMP_VERSION) {
    cmp_error(d->path, "unsupported version %u (this muoncmp reads version %d)",
              (unsigned)version, CMP_VERSION);
    return 0;
  }
  d->count = cmp_u32(b + 12);
  d->steps = cmp_u64(b + 16);

  /* Only complete records are stored, and each takes at least CMP_MIN_RECORD_BYTES, so a huge
     count in a short file cannot make us allocate much. */
  fit = (d->size - CMP_HEADER_BYTES) / CMP_MIN_RECORD_BYTES;
  cap = d->count < fit ? d->count : fit;
  d->rec = (cmp_record *)malloc((cap + 1) * sizeof(cmp_record));
  d->sorted = (cmp_record **)malloc((cap + 1) * sizeof(cmp_record *));
  if (!d->rec || !d->sorted) {
    cmp_error(d->path, "out of memory");
    return 0;
  }

  pos = CMP_HEADER_BYTES;
  for (i = 0; i < d->count; i++) {
    size_t start = pos, left;
    uint32_t kind, name_len, rows, cols;
    const char *name;
    uint64_t n, data_bytes, stored, computed;
    cmp_record *r;

    if (d->size - pos < 8) {
      cmp_truncated(d->path, i, NULL, 0, 0, 0, 0);
      return 0;
    }
    kind = cmp_u32(b + pos);
    name_len = cmp_u32(b + pos + 4);
    pos += 8;
    if (name_len == 0 || name_len > CMP_MAX_NAME) {
      cmp_error(d->path, "record %u: name length %u (must be 1..%d)", (unsigned)i,
                (unsigned)name_len, CMP_MAX_NAME);
      return 0;
    }
    if (d->size - pos < name_len) {
      cmp_truncated(d->path, i, NULL, 0, 0, 0, 0);
      return 0;
    }
    name = (const char *)(b + pos);
    pos += name_len;
    if (d->size - pos < 8) {
      cmp_truncated(d->path, i, name, name_len, 0, 0, 0);
      return 0;
    }
    rows = cmp_u32(b + pos);
    cols = cmp_u32(b + pos + 4);
    pos += 8;
    if (kind > 2) {
      cmp_error(d->path, "record %u (\"%.*s\"): unknown kind %u", (unsigned)i, (int)name_len,
                name, (unsigned)kind);
      return 0;
    }
    if (rows == 0 || cols == 0) {
      cmp_error(d->path, "record %u (\"%.*s\"): shape %u x %u (rows and cols must be >= 1)",
                (unsigned)i, (int)name_len, name, (unsigned)rows, (unsigned)cols);
      return 0;
    }
    n = (uint64_t)rows * cols; /* fits: both are below 2^32 */
    if (n > UINT64_MAX / 4 || n * 4 > (uint64_t)(SIZE_MAX - 8)) {
      cmp_error(d->path, "record %u (\"%.*s\"): shape %u x %u: size would overflow",
                (unsigned)i, (int)name_len, name, (unsigned)rows, (unsigned)cols);
      return 0;
    }
    data_bytes = n * 4;
    left = d->size - pos;
    if (left < data_bytes + 8) {
      cmp_truncated(d->path, i, name, name_len, 1, rows, cols);
      return 0;
    }
    stored = cmp_u64(b + pos + (size_t)data_bytes);
    computed = cmp_fnv1a(b + start, pos + (size_t)data_bytes - start);
    if (stored != computed) {
      cmp_error(d->path, "checksum mismatch in record %u (\"%.*s\"): stored %016llx, computed "
                "%016llx", (unsigned)i, (int)name_len, name, (unsigned long long)stored,
                (unsigned long long)computed);
      return 0;
    }
    r = &d->rec[i];
    r->kind = kind;
    r->name_len = name_len;
    r->name = name;
    r->rows = rows;
    r->cols = cols;
    r->data = b + pos;
    r->index = i;
    r->matched = 0;
    d->sorted[i] = r;
    pos += (size_t)data_bytes + 8;
  }
  if (pos != d->size) {
    cmp_error(d->path, "%zu trailing byte%s after the last record (record %u)", d->size - pos,
              d->size - pos == 1 ? "" : "s", (unsigned)(d->count ? d->count - 1 : 0));
    return 0;
  }

  qsort(d->sorted, d->count, sizeof(cmp_record *), cmp_order_qsort);
  for (i = 1; i < d->count; i++) {
    const cmp_record *p = d->sorted[i - 1], *q = d->sorted[i];
    if (cmp_order(p, q) == 0) {
      cmp_error(d->path, "%s \"%.*s\" appears twice (records %u and %u)",
                cmp_kind_names[q->kind], (int)q->name_len, q->name, (unsigned)p->index,
                (unsigned)q->index);
      return 0;
    }
  }
  return 1;
}

static void cmp_free(cmp_dump *d) {
  free(d->bytes);
  free(d->rec);
  free(d->sorted);
}

/* The record of d with the same (kind, name) as r, or NULL. */
static cmp_record *cmp_find(const cmp_dump *d, const cmp_record *r) {
  size_t lo = 0, hi = d->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = cmp_order(d->sorted[mid], r);
    if (c == 0) return d->sorted[mid];
    if (c < 0) lo = mid + 1; else hi = mid;
  }
  return NULL;
}

static void cmp_print_tensor(const cmp_record *r) {
  printf("%s %.*s (%u x %u)", cmp_kind_names[r->kind], (int)r->name_len, r->name,
         (unsigned)r->rows, (unsigned)r->cols);
}

/* Compares two records of the same (kind, name). Returns 1 when bitwise equal. */
static int cmp_tensors(const cmp_record *a, const cmp_record *b, int quiet) {
  uint64_t n, i, ndiff = 0, first = 0;
  uint32_t r0 = 0, r1 = 0, c0 = 0, c1 = 0, nrows = 0, ncols = 0, r, c;
  double max_abs = 0, max_rel = 0;
  unsigned char *row_hit, *col_hit;
  int row_band, col_band;

  if (a->rows != b->rows || a->cols != b->cols) {
    printf("DIFFERS %s %.*s: shape %u x %u vs %u x %u\n", cmp_kind_names[a->kind],
           (int)a->name_len, a->name, (unsigned)a->rows, (unsigned)a->cols, (unsigned)b->rows,
           (unsigned)b->cols);
    return 0;
  }

  n = (uint64_t)a->rows * a->cols;
  row_hit = (unsigned char *)calloc(a->rows, 1);
  col_hit = (unsigned char *)calloc(a->cols, 1);
  if (!row_hit || !col_hit) {
    fprintf(stderr, "muoncmp: out of memory\n");
    exit(2);
  }
  for (i = 0; i < n; i++) {
    uint32_t ua = cmp_u32(a->data + 4 * i), ub = cmp_u32(b->data + 4 * i);
    double x, y, absdiff, reldiff;
    if (ua == ub) continue;
    r = (uint32_t)(i / a->cols);
    c = (uint32_t)(i % a->cols);
    if (ndiff == 0) {
      first = i;
      r0 = r1 = r;
      c0 = c1 = c;
    }
    ndiff++;
    if (r < r0) r0 = r;
    if (r > r1) r1 = r;
    if (c < c0) c0 = c;
    if (c > c1) c1 = c;
    if (!row_hit[r]) { row_hit[r] = 1; nrows++; }
    if (!col_hit[c]) { col_hit[c] = 1; ncols++; }

    x = cmp_f32(ua);
    y = cmp_f32(ub);
    if (isnan(x) || isnan(y) || isinf(x) || isinf(y)) {
      absdiff = HUGE_VAL; /* the bits differ, so this is an infinite difference */
      reldiff = HUGE_VAL;
    } else {
      double big = fabs(x) > fabs(y) ? fabs(x) : fabs(y);
      absdiff = fabs(x - y);
      reldiff = big > 0 ? absdiff / big : 0; /* +0 vs -0 */
    }
    if (absdiff > max_abs) max_abs = absdiff;
    if (reldiff > max_rel) max_rel = reldiff;
  }
  free(row_hit);
  free(col_hit);

  if (ndiff == 0) {
    if (!quiet) {
      printf("equal   ");
      cmp_print_tensor(a);
      printf("\n");
    }
    return 1;
  }

  {
    uint32_t fa = cmp_u32(a->data + 4 * first), fb = cmp_u32(b->data + 4 * first);
    char sa[64], sb[64];
    snprintf(sa, sizeof sa, "%.9g", cmp_f32(fa));
    snprintf(sb, sizeof sb, "%.9g", cmp_f32(fb));
    printf("DIFFERS ");
    cmp_print_tensor(a);
    printf(": %llu differing element%s of %llu, max abs diff %.9g, max rel diff %.9g",
           (unsigned long long)ndiff, ndiff == 1 ? "" : "s", (unsigned long long)n, max_abs,
           max_rel);
    printf(", first at row %u, col %u: %s vs %s", (unsigned)(first / a->cols),
           (unsigned)(first % a->cols), sa, sb);
    if (strcmp(sa, sb) == 0) /* e.g. two different NaNs */
      printf(" (bits %08lx vs %08lx)", (unsigned long)fa, (unsigned long)fb);
  }
  printf(", rows [%u, %u], cols [%u, %u]", (unsigned)r0, (unsigned)r1, (unsigned)c0,
         (unsigned)c1);
  row_band = nrows < a->rows && nrows == r1 - r0 + 1;
  col_band = ncols < a->cols && ncols == c1 - c0 + 1;
  if (nrows == a->rows && ncols == a->cols)
    printf(": whole matrix");
  else if (row_band && col_band)
    printf(": a band of rows and a band of columns");
  else if (row_band)
    printf(": a band of rows");
  else if (col_band)
    printf(": a band of columns");
  printf("\n");
  return 0;
}

int main(int argc, char **argv) {
  cmp_dump a, b;
  const char *paths[2] = {NULL, NULL};
  int quiet = 0, npaths = 0, i;
  uint32_t k;
  uint64_t total, equal = 0;

  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quiet") == 0) {
      quiet = 1;
    } else if (argv[i][0] == '-' && argv[i][1] == '-') {
      fprintf(stderr, "muoncmp: unknown option '%s'\n", argv[i]);
      npaths = -1;
      break;
    } else if (npaths < 2) {
      paths[npaths++] = argv[i];
    } else {
      npaths = -1;
      break;
    }
  }
  if (npaths != 2) {
    fprintf(stderr, "usage: muoncmp A.dump B.dump [--quiet]\n");
    return 2;
  }

  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  a.path = paths[0];
  b.path = paths[1];
  if (!cmp_load(&a) || !cmp_load(&b)) {
    cmp_free(&a);
    cmp_free(&b);
    return 2;
  }

  if (a.steps != b.steps && !quiet)
    printf("note: A was dumped at step %llu, B at step %llu\n", (unsigned long long)a.steps,
           (unsigned long long)b.steps);

  total = a.count;
  for (k = 0; k < a.count; k++) {
    const cmp_record *ra = &a.rec[k];
    cmp_record *rb = cmp_find(&b, ra);
    if (!rb) {
      printf("only in A: ");
      cmp_print_tensor(ra);
      printf("\n");
      continue;
    }
    rb->matched = 1;
    equal += (uint64_t)cmp_tensors(ra, rb, quiet);
  }
  for (k = 0; k < b.count; k++) {
    if (b.rec[k].matched) continue;
    total++;
    printf("only in B: ");
    cmp_print_tensor(&b.rec[k]);
    printf("\n");
  }
  printf("muoncmp: %llu of %llu tensors bitwise equal\n", (unsigned long long)equal,
         (unsigned long long)total);

  cmp_free(&a);
  cmp_free(&b);
  return equal == total ? 0 : 1;
}
