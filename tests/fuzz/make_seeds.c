/* make_seeds.c - writes the seed corpora of the fuzz targets (tests/fuzz/corpus/).

   Usage:  make_seeds DIR [--with-pending]    writes the files of DIR/state and DIR/layout
   Build:  cc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 -I. tests/fuzz/make_seeds.c \
             -o build/make_seeds -lm -pthread
           build/make_seeds tests/fuzz/corpus

   State seeds: valid blobs saved by the models of fuzz_models.h (the optimizers fuzz_state
   loads into) after a few steps - several shapes, with and without NorMuon and AdamW, one
   device and a world of one with layouts - and the two blobs of a 2-rank checkpoint back to
   back (fuzz_state reshards them into model "c"). Layout seeds: encodings (the format is in
   fuzz_layout.c's header comment) of the usual meshes - one device, FSDP, TP x FSDP, flat
   ranges, HSDP, FLAT then SHARD(0), three axes - and of a few perturbed ones. Deterministic:
   the same files on every run and machine with IEEE floats. */
#define _POSIX_C_SOURCE 200809L   /* pthreads under -std=c99 */
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "fuzz_models.h"
#include "fuzz_world.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *out_dir;
static int n_written, with_pending;
static size_t bytes_written;

/* Seeds that make a target abort until an open bug of muon.h is fixed: they live in
   tests/fuzz/crashes/ (see its README.md) and are written here only with --with-pending. Once the
   bug is fixed, drop them from this list and regenerate the corpus. */
static const char *const pending[] = { "" };   /* none open */

static void write_file(const char *sub, const char *name, const unsigned char *p, size_t n) {
  char path[1024];
  FILE *f;
  size_t k;
  for (k = 0; !with_pending && k < sizeof pending / sizeof pending[0]; k++)
    if (strcmp(name, pending[k]) == 0) return;
  snprintf(path, sizeof path, "%s/%s", out_dir, sub);
  if (mkdir(path, 0755) != 0 && errno != EEXIST) { perror(path); exit(1); }
  snprintf(path, sizeof path, "%s/%s/%s", out_dir, sub, name);
  f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) { perror(path); exit(1); }
  n_written++;
  bytes_written += n;
}

static unsigned char *save(fz_model *m, size_t *n) {
  unsigned char *buf;
  *n = muon_state_size(m->opt);
  buf = (unsigned char *)malloc(*n);
  if (m->opt->run) m->opt->run = 0x5eed5eed5eed5eedull;   /* the run's identity is random: pin it */
  if (!buf || muon_state_save(m->opt, buf, *n) != MUON_OK) { fprintf(stderr, "make_seeds: save failed: %s\n", muon_error(m->opt)); exit(1); }
  return buf;
}

/* Model `id` after `steps` steps. */
static void state_seed(const char *name, int id, int steps) {
  fz_model m;
  size_t n;
  unsigned char *blob;
  char file[64];
  fz_model_build(&m, id, NULL, steps);
  blob = save(&m, &n);
  snprintf(file, sizeof file, "%s.blob", name);
  write_file("state", file, blob, n);
  free(blob);
  fz_model_free(&m);
}

/* Model "c" on two ranks: both blobs, rank 0's first. */
typedef struct pair_rank { fz_world *w; int rank; unsigned char *blob; size_t n; } pair_rank;

static void *pair_main(void *arg) {
  pair_rank *me = (pair_rank *)arg;
  fz_link link;
  muon_comm comm = fz_comm(&link, me->w, me->rank);
  fz_model m;
  fz_model_build(&m, 2, &comm, 2);
  me->blob = save(&m, &me->n);
  fz_model_free(&m);
  fz_leave(me->w);
  return NULL;
}

static void pair_seed(const char *name) {
  fz_world w;
  pair_rank ranks[2];
  unsigned char *both;
  int r;
  memset(ranks, 0, sizeof ranks);
  fz_world_init(&w, 2, 1);
  for (r = 0; r < 2; r++) { ranks[r].w = &w; ranks[r].rank = r; }
  fz_run_ranks(&w, pair_main, ranks, sizeof ranks[0]);
  fz_world_free(&w);
  both = (unsigned char *)malloc(ranks[0].n + ranks[1].n);
  if (!both) exit(1);
  memcpy(both, ranks[0].blob, ranks[0].n);
  memcpy(both + ranks[0].n, ranks[1].blob, ranks[1].n);
  write_file("state", name, both, ranks[0].n + ranks[1].n);
  free(both);
  free(ranks[0].blob);
  free(ranks[1].blob);
}

/* ---- layout encodings ------------------------------------------------------------------------- */
typedef struct enc { unsigned char b[256]; size_t n; } enc;
static void put(enc *e, unsigned v) { if (e->n < sizeof e->b) e->b[e->n++] = (unsigned char)v; }

enum { REPL = 0, SHARD0 = 1, SHARD1 = 2, FLAT = 3, RANGE = 4, NONE = 5 };
enum { F_CAUTIOUS = 1, F_GRAM = 2, F_UNCHECKED = 4, F_VERIFY = 8, F_BF16 = 16 };

/* byte 0 and byte 1; then the axis choices (indices among the divisors of what is left of P). */
static void header(enc *e, int P, int steps, int normuon, int round_robin, int small_rounds, int adamw,
                   int n_mats, int n_axes, int flags, const int *axis_choice) {
  int a;
  e->n = 0;
  put(e, (unsigned)((P - 1) | (steps - 1) << 2 | normuon << 3 | round_robin << 5 | small_rounds << 6 | adamw << 7));
  put(e, (unsigned)((n_mats - 1) + 3 * (n_axes - 1) + 9 * flags));
  for (a = 0; a < n_axes - 1; a++) put(e, (unsigned)axis_choice[a]);
}

/* One matrix: shape, key, a level kind per axis (range seed for RANGE), no perturbation. */
static void matrix(enc *e, int rows, int cols, int key, int n_axes, const int *kind, int range_seed) {
  int a;
  put(e, (unsigned)(rows - 1));
  put(e, (unsigned)(cols - 1));
  put(e, key ? (unsigned)(key << 1 | 1) : 0u);
  for (a = 0; a < n_axes; a++) put(e, (unsigned)(kind[a] + 6 * (kind[a] == RANGE ? range_seed : 0)));
}

static void perturb(enc *e, int rank, int what, int value, int level) {
  put(e, 200);
  put(e, (unsigned)rank);
  put(e, (unsigned)what);
  put(e, (unsigned)(unsigned char)(signed char)value);
  put(e, (unsigned)level);
}

static void end_matrix(enc *e) { put(e, 0); }

static void layout_seed(const char *name, const enc *e) { write_file("layout", name, e->b, e->n); }

static void layout_seeds(void) {
  enc e;
  static const int one_two[1] = { 1 };        /* 4 ranks: first axis 2 (divisors 1, 2, 4) */
  static const int three_axes[2] = { 0, 1 };  /* 4 ranks: axes 1 x 2 x 2 */
  int k1[1], k2[2], k3[3];

  header(&e, 1, 1, 0, 0, 0, 0, 1, 1, F_VERIFY, NULL);                                   /* one device */
  k1[0] = REPL; matrix(&e, 4, 6, 0, 1, k1, 0);
  layout_seed("single.bin", &e);

  header(&e, 2, 1, 0, 0, 0, 1, 2, 1, F_VERIFY, NULL);                                   /* FSDP */
  k1[0] = SHARD0; matrix(&e, 6, 4, 0, 1, k1, 0); end_matrix(&e); matrix(&e, 5, 3, 0, 1, k1, 0);
  layout_seed("fsdp.bin", &e);

  header(&e, 4, 2, 2, 0, 0, 0, 3, 2, F_VERIFY, one_two);                                /* TP x FSDP, NorMuon LARGER */
  k2[0] = SHARD1; k2[1] = SHARD0;
  matrix(&e, 8, 6, 0, 2, k2, 0); end_matrix(&e); matrix(&e, 3, 9, 0, 2, k2, 0); end_matrix(&e); matrix(&e, 10, 10, 0, 2, k2, 0);
  layout_seed("tp_fsdp.bin", &e);

  header(&e, 3, 1, 0, 1, 1, 0, 2, 1, F_VERIFY, NULL);                                   /* flat ranges, round-robin, small rounds */
  k1[0] = RANGE; matrix(&e, 7, 5, 0, 1, k1, 3); end_matrix(&e); matrix(&e, 2, 9, 0, 1, k1, 11);
  layout_seed("flat_ranges.bin", &e);

  header(&e, 3, 2, 2, 0, 0, 1, 2, 1, F_VERIFY, NULL);                                   /* flat ranges, NorMuon LARGER, resharded between steps */
  k1[0] = RANGE; matrix(&e, 9, 4, 0, 1, k1, 7); end_matrix(&e); matrix(&e, 3, 10, 0, 1, k1, 2);
  layout_seed("flat_ranges_normuon.bin", &e);

  header(&e, 4, 2, 1, 0, 0, 1, 2, 2, F_VERIFY | F_GRAM | F_CAUTIOUS, one_two);         /* HSDP, NorMuon ROWS, Gram, cautious */
  k2[0] = REPL; k2[1] = FLAT;
  matrix(&e, 3, 8, 0, 2, k2, 0); end_matrix(&e); matrix(&e, 9, 4, 0, 2, k2, 0);
  layout_seed("hsdp.bin", &e);

  header(&e, 4, 2, 2, 0, 0, 1, 2, 2, F_VERIFY | F_BF16, one_two);                       /* TP x FSDP, bf16 + mirrors, stochastic rounding */
  k2[0] = SHARD0; k2[1] = SHARD1;
  matrix(&e, 7, 6, 0, 2, k2, 0); end_matrix(&e); matrix(&e, 4, 9, 1, 2, k2, 0);
  layout_seed("tp_fsdp_bf16.bin", &e);

  header(&e, 3, 1, 0, 1, 1, 1, 1, 1, F_VERIFY | F_BF16, NULL);                          /* flat ranges, bf16, small rounds */
  k1[0] = RANGE; matrix(&e, 5, 8, 0, 1, k1, 9);
  layout_seed("flat_ranges_bf16.bin", &e);

  header(&e, 4, 1, 0, 0, 0, 0, 1, 2, F_UNCHECKED, one_two);                             /* FLAT then SHARD(0), unchecked commit */
  k2[0] = FLAT; k2[1] = SHARD0; matrix(&e, 7, 7, 0, 2, k2, 0);
  layout_seed("flat_shard.bin", &e);

  header(&e, 4, 1, 0, 0, 0, 0, 2, 3, F_VERIFY, three_axes);                             /* 1 x 2 x 2 axes, keys */
  k3[0] = NONE; k3[1] = SHARD0; k3[2] = SHARD1;
  matrix(&e, 5, 6, 3, 3, k3, 0); end_matrix(&e);
  k3[0] = REPL; k3[1] = RANGE; k3[2] = REPL; matrix(&e, 4, 4, 0, 3, k3, 5);
  layout_seed("three_axes.bin", &e);

  header(&e, 2, 1, 0, 0, 0, 0, 1, 1, 0, NULL);                                          /* rank 1's index moved: a gap */
  k1[0] = SHARD0; matrix(&e, 6, 4, 0, 1, k1, 0); perturb(&e, 1, 3, 1, 0);
  layout_seed("bad_index.bin", &e);

  header(&e, 2, 1, 0, 0, 0, 0, 2, 1, F_VERIFY, NULL);                                   /* rank 0 registers m1 as m0 */
  k1[0] = REPL; matrix(&e, 3, 3, 0, 1, k1, 0); end_matrix(&e); matrix(&e, 3, 3, 0, 1, k1, 0); perturb(&e, 0, 11, 0, 0);
  layout_seed("rename.bin", &e);

  header(&e, 2, 1, 0, 0, 0, 1, 1, 1, F_VERIFY, NULL);                                   /* a replica that does not register */
  k1[0] = REPL; matrix(&e, 4, 5, 0, 1, k1, 0); perturb(&e, 1, 10, 0, 0);
  layout_seed("missing_replica.bin", &e);

  header(&e, 2, 1, 0, 0, 0, 0, 1, 1, F_VERIFY, NULL);                                   /* two ranks swap pieces */
  k1[0] = SHARD1; matrix(&e, 3, 7, 0, 1, k1, 0); perturb(&e, 0, 12, 1, 0);
  layout_seed("swap.bin", &e);

  header(&e, 2, 1, 0, 0, 0, 0, 1, 1, F_VERIFY, NULL);                                   /* an extra level of one rank */
  k1[0] = SHARD1; matrix(&e, 5, 2, 0, 1, k1, 0); perturb(&e, 1, 13, 2, 0);
  layout_seed("extra_level.bin", &e);

  header(&e, 3, 1, 0, 0, 0, 0, 1, 1, 0, NULL);                                          /* rank 2's rows differ */
  k1[0] = SHARD0; matrix(&e, 6, 3, 0, 1, k1, 0); perturb(&e, 2, 8, 1, 0);
  layout_seed("shape_mismatch.bin", &e);
}

int main(int argc, char **argv) {
  with_pending = argc == 3 && strcmp(argv[2], "--with-pending") == 0;
  if (argc != 2 && !with_pending) { fprintf(stderr, "usage: %s DIR [--with-pending]   (writes DIR/state and DIR/layout)\n", argv[0]); return 2; }
  out_dir = argv[1];
  if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) { perror(out_dir); return 1; }
  state_seed("a0", 0, 0);
  state_seed("a3", 0, 3);
  state_seed("b2", 1, 2);
  state_seed("c1_2", 2, 2);
  state_seed("d1", 3, 1);
  pair_seed("c2_2_pair.blob");
  layout_seeds();
  printf("make_seeds: %d files, %zu bytes in %s\n", n_written, bytes_written, out_dir);
  return 0;
}
