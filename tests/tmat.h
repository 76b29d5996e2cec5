/* tmat.h - a matrix of a distributed test model: its full values (deterministic from its name)
   and this rank's piece under a layout, sliced independently of muon (examples/common.h's
   ex_piece). Shared by test_dist.c and test_agree.c; include after common.h. */
#ifndef MUON_TESTS_TMAT_H
#define MUON_TESTS_TMAT_H

typedef struct tmat {      /* a matrix of a test model: full values and this rank's piece */
  char name[32];
  int rows, cols;
  muon_layout layout;
  long long *idx;
  size_t n;
  float *w, *g, *w0;
} tmat;

static void tmat_init(tmat *t, const char *name, int rows, int cols, const muon_layout *l, float gscale) {
  size_t e;
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->rows = rows;
  t->cols = cols;
  if (l) t->layout = *l;
  t->idx = (long long *)malloc((size_t)rows * cols * sizeof(long long));
  t->n = ex_piece(l, rows, cols, t->idx);
  t->w = (float *)malloc((t->n + 1) * sizeof(float));
  t->g = (float *)malloc((t->n + 1) * sizeof(float));
  t->w0 = (float *)malloc((t->n + 1) * sizeof(float));
  for (e = 0; e < t->n; e++) {
    t->w[e] = t->w0[e] = ex_value(ex_hash(name, 1), t->idx[e]);
    t->g[e] = gscale * (0.25f + 0.5f * (ex_value(ex_hash(name, 2), t->idx[e]) + 1.0f) * 0.5f); /* never 0 */
  }
}
static void tmat_free(tmat *t) { free(t->idx); free(t->w); free(t->g); free(t->w0); }

#endif
