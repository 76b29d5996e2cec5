/* test_state_grow.c - a hyperparameter appended to the state's group records, both ways.

   tests/run_state_grow.sh builds this program twice: against muon.h as it is, and against a
   scratch copy of muon.h with one more field (`grow_test`, default 0.25) appended to muon_hparams
   and to its record in the state blob, as a future muon.h would add one. Each build saves a state
   and loads the other's:
     test_state_grow save DIR   3 steps, save the state and the parameters, 3 more steps, save
                                the parameters again (the reference)
     test_state_grow load DIR   load DIR's parameters and state into a fresh optimizer, check the
                                groups (and grow_test: DIR's value, or the default when DIR was
                                saved without it), run the same 3 steps: bitwise the reference
   The scratch build (GROW_TEST) sets grow_test = 0.75 in group 1 and 0.5 in AdamW group 0 before
   it saves; the AdamW value, which no getter returns, is read back from the state it saves. */
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "test.h"

enum { R0 = 12, C0 = 20, R1 = 16, C1 = 8, NB = 12 };
typedef struct model { float w0[R0 * C0], g0[R0 * C0], w1[R1 * C1], g1[R1 * C1], b[NB], gb[NB]; } model;

static float val(unsigned *s) { *s = *s * 1664525u + 1013904223u; return (float)((int)(*s >> 9) % 2001 - 1000) / 1000.0f; }
static void fill(float *x, int n, unsigned seed) { int i; for (i = 0; i < n; i++) x[i] = val(&seed); }
static void grads(model *m, int step) {
  fill(m->g0, R0 * C0, 100u + (unsigned)step);
  fill(m->g1, R1 * C1, 200u + (unsigned)step);
  fill(m->gb, NB, 300u + (unsigned)step);
}

static muon_optimizer *make(model *m) {
  muon_desc d = muon_default_desc();
  muon_optimizer *o = NULL;
  muon_hparams h1 = muon_default_hparams();
  muon_matrix x = muon_default_matrix();
  muon_adamw_param b = muon_default_adamw_param();
  int g1 = -1;
  d.hparams.lr = 0.02f;
  if (muon_create(&o, &d) != MUON_OK) return NULL;
  h1.lr = 0.01f; h1.ns_steps = 3; h1.weight_decay = 0.05f; h1.normuon = MUON_NORMUON_ROWS;
  muon_add_group(o, &h1, &g1);
  x.name = "w0"; x.param = m->w0; x.grad = m->g0; x.rows = R0; x.cols = C0;
  muon_add_matrix(o, &x, NULL);
  x.name = "w1"; x.param = m->w1; x.grad = m->g1; x.rows = R1; x.cols = C1; x.group = g1;
  muon_add_matrix(o, &x, NULL);
  b.name = "b"; b.param = m->b; b.grad = m->gb; b.size = NB;
  muon_add_adamw_param(o, &b, NULL);
  return o;
}

static int write_file(const char *dir, const char *name, const void *p, size_t n) {
  char path[512];
  FILE *f;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  f = fopen(path, "wb");
  if (!f) return 0;
  if (fwrite(p, 1, n, f) != n) { fclose(f); return 0; }
  return fclose(f) == 0;
}
static int read_file(const char *dir, const char *name, void *p, size_t n) {
  char path[512];
  FILE *f;
  int ok;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  f = fopen(path, "rb");
  if (!f) return 0;
  ok = fread(p, 1, n, f) == n;
  fclose(f);
  return ok;
}

#ifdef GROW_TEST
/* AdamW group 0's grow_test as this optimizer saves it: the last field of that group's record
   (header 40, group counts 8, each Muon group's u32-length record, then the AdamW ones). */
static float saved_adamw_grow(muon_optimizer *o) {
  size_t n = muon_state_size(o), at = 56;   /* the header (48), the two group counts */
  unsigned char *b = (unsigned char *)malloc(n);
  uint32_t groups, len, k;
  float x = -1;
  if (b && muon_state_save(o, b, n) == MUON_OK) {
    memcpy(&groups, b + 48, 4);
    for (k = 0; k < groups; k++) { memcpy(&len, b + at, 4); at += 4 + len; }
    memcpy(&len, b + at, 4);
    if (len == 28) memcpy(&x, b + at + 4 + 24, 4);
  }
  free(b);
  return x;
}
#endif

static void steps(muon_optimizer *o, model *m, int from, int to) {
  int s;
  for (s = from; s < to; s++) { grads(m, s); CHECK(muon_step(o) == MUON_OK, "step %d: %s", s, muon_error(o)); }
}

int main(int argc, char **argv) {
  static model m, ref;
  muon_optimizer *o;
  char path[512];
  if (argc != 3 || (strcmp(argv[1], "save") != 0 && strcmp(argv[1], "load") != 0)) {
    fprintf(stderr, "usage: %s save|load DIR\n", argv[0]);
    return 2;
  }
  fill(m.w0, R0 * C0, 1); fill(m.w1, R1 * C1, 2); fill(m.b, NB, 3);
  o = make(&m);
  if (!o) { printf("create failed: %s\n0 passed, 1 failed\n", muon_error(NULL)); return 1; }
  snprintf(path, sizeof path, "%s/state", argv[2]);
  if (strcmp(argv[1], "save") == 0) {
    TEST_CASE("save: 3 steps, the state and the parameters, 3 more steps, the reference");
#ifdef GROW_TEST
    {
      muon_hparams h;
      CHECK(muon_get_group(o, 1, &h) == MUON_OK && h.grow_test == 0.25f, "the new field's default");
      muon_adamw_hparams a = muon_default_adamw_hparams();
      h.grow_test = 0.75f;
      CHECK(muon_set_group(o, 1, &h) == MUON_OK, "set_group: %s", muon_error(o));
      CHECK(a.grow_test == 0.125f && saved_adamw_grow(o) == 0.125f, "the AdamW field's default");
      a.grow_test = 0.5f;
      CHECK(muon_set_adamw_group(o, 0, &a) == MUON_OK && saved_adamw_grow(o) == 0.5f, "set_adamw_group: %s", muon_error(o));
    }
#endif
    steps(o, &m, 0, 3);
    CHECK(muon_state_save_file(o, path) == MUON_OK, "save: %s", muon_error(o));
    CHECK(write_file(argv[2], "params", &m, sizeof m), "writing the parameters");
    steps(o, &m, 3, 6);
    CHECK(write_file(argv[2], "reference", &m, sizeof m), "writing the reference");
  } else {
    muon_hparams h0, h1;
    TEST_CASE("load: the other build's state loads, its groups as saved, and 3 more steps are bitwise the reference");
    CHECK(read_file(argv[2], "params", &m, sizeof m) && read_file(argv[2], "reference", &ref, sizeof ref), "reading %s", argv[2]);
    CHECK(muon_state_load_file(o, path) == MUON_OK, "load: %s", muon_error(o));
    CHECK(muon_get_group(o, 0, &h0) == MUON_OK && h0.lr == 0.02f && h0.ns_steps == 5, "group 0: lr %g, ns_steps %d", (double)h0.lr, h0.ns_steps);
    CHECK(muon_get_group(o, 1, &h1) == MUON_OK && h1.lr == 0.01f && h1.ns_steps == 3 && h1.weight_decay == 0.05f && h1.normuon == MUON_NORMUON_ROWS,
          "group 1: lr %g, ns_steps %d, weight_decay %g, normuon %d", (double)h1.lr, h1.ns_steps, (double)h1.weight_decay, (int)h1.normuon);
#ifdef GROW_TEST
    {   /* GROW_SAVED: the state came from the scratch build (0.75 in group 1), else the default */
      const char *e = getenv("GROW_SAVED");
      float want = e && *e == '1' ? 0.75f : 0.25f;
      float aw = saved_adamw_grow(o), want_aw = e && *e == '1' ? 0.5f : 0.125f;
      CHECK(h0.grow_test == 0.25f && h1.grow_test == want, "grow_test %g and %g, want 0.25 and %g", (double)h0.grow_test, (double)h1.grow_test, (double)want);
      CHECK(aw == want_aw, "AdamW grow_test %g, want %g", (double)aw, (double)want_aw);
    }
#endif
    steps(o, &m, 3, 6);
    CHECK(memcmp(&m, &ref, sizeof m) == 0, "the parameters differ from the reference");
  }
  muon_destroy(o);
  return test_summary();
}
