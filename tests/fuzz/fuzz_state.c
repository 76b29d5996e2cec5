/* fuzz_state.c - libFuzzer target: muon_state_load and muon_state_reshard over arbitrary bytes.

   Build and run: tests/run_fuzz.sh BUILD_DIR fuzz (or replay); by hand:
     clang -std=c99 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. \
       tests/fuzz/fuzz_state.c -o build/fuzz/fuzz_state -lm
     build/fuzz/fuzz_state tests/fuzz/corpus/state

   Each input goes to each model of fuzz_models.h (a fresh optimizer that has taken one step, so
   its state is not all zeros):
     1. muon_state_load(input as it is): checksums catch almost every mutation here;
     2. muon_state_load(input with its last 8 bytes rewritten as the checksum of the rest), so
        mutations reach the record checks behind the checksum;
     3. muon_state_reshard(n = 1, that fixed input);
     4. muon_state_reshard(n = 2): the input cut at its second "MUONSTAT" (the seeds hold the two
        blobs of a 2-rank checkpoint back to back) or, without one, at the position its first two
        bytes give; each half's checksum fixed.
   What must hold (a failure aborts, which libFuzzer reports with the input):
   - a failed load or reshard returns MUON_ERR_STATE with a message naming it, and the optimizer
     is unchanged: muon_state_save gives the same bytes and the parameters are untouched;
   - after a successful one the state is usable: it saves, loads back, and saves the same bytes
     again; a version-1 input loads exactly (momentum, NorMuon second moments, AdamW moments and
     steps, layouts and groups come back bit for bit); and a muon_step with finite gradients
     either succeeds or changes nothing (all-or-nothing). Where the loaded hyperparameters are the
     model's own and every loaded float is at most 1e6 in magnitude, the step must succeed and
     leave every parameter finite. (Wilder loaded hyperparameters or moments may legitimately
     overflow a parameter, so finiteness is not asserted for them.) */
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "fuzz_models.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SANE_MAGNITUDE 1e6

static int verbose;                /* FUZZ_VERBOSE set: one line per call and model */
static unsigned char *own_groups;  /* the model's own group section, as built (for "plausible") */
static size_t own_groups_len;

static void say(const fz_model *m, const char *call, muon_status st) {
  if (verbose) fprintf(stderr, "fuzz_state: model %d: %s: %s\n", m->id, call, st == MUON_OK ? "ok" : muon_error(m->opt));
}

static void fail(const fz_model *m, const char *what, const char *detail) {
  fprintf(stderr, "fuzz_state: model %d: %s%s%s\n", m->id, what, detail ? ": " : "", detail ? detail : "");
  abort();
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) { fprintf(stderr, "fuzz_state: out of memory\n"); abort(); }
  return p;
}

/* The optimizer's whole observable state: its saved blob and the parameters. */
typedef struct snapshot {
  unsigned char *state;
  size_t n;
  float *param[FZ_MAX_TENSORS];
} snapshot;

static unsigned char *save(fz_model *m, size_t *n) {
  unsigned char *buf;
  *n = muon_state_size(m->opt);
  buf = (unsigned char *)xmalloc(*n);
  if (muon_state_save(m->opt, buf, *n) != MUON_OK) fail(m, "muon_state_save failed", muon_error(m->opt));
  return buf;
}

static void take(fz_model *m, snapshot *s) {
  int k;
  s->state = save(m, &s->n);
  for (k = 0; k < m->n_param; k++) {
    s->param[k] = (float *)xmalloc(m->size[k] * sizeof(float));
    memcpy(s->param[k], m->param[k], m->size[k] * sizeof(float));
  }
}

static void drop(fz_model *m, snapshot *s) {
  int k;
  free(s->state);
  for (k = 0; k < m->n_param; k++) free(s->param[k]);
}


static void unchanged(fz_model *m, const snapshot *s, const char *after) {
  size_t n;
  unsigned char *now = save(m, &n);
  int k;
  if (n != s->n || memcmp(now, s->state, n) != 0) fail(m, "the optimizer's state changed after a failed call", after);
  for (k = 0; k < m->n_param; k++)
    if (memcmp(m->param[k], s->param[k], m->size[k] * sizeof(float)) != 0) fail(m, "a parameter changed after a failed call", after);
  free(now);
}

/* A failed call: the status and the message muon_error gives must agree. */
static void failed_with(fz_model *m, muon_status st, muon_status want, const char *call) {
  const char *msg = muon_error(m->opt), *name = muon_status_string(st);
  if (want != MUON_OK && st != want) fail(m, call, muon_status_string(st));
  if (!msg || strncmp(msg, name, strlen(name)) != 0) fail(m, "an error without its message (muon_error names another status or none)", call);
}

static double blob_max_abs(const fz_blob *b) {
  double most = 0, x;
  uint32_t i;
  for (i = 0; i < b->n_matrices; i++) {
    if ((x = fz_max_abs(b->matrix[i].momentum, (size_t)b->matrix[i].size)) > most) most = x;
    if ((x = fz_max_abs(b->matrix[i].v, b->matrix[i].v_len)) > most) most = x;
  }
  for (i = 0; i < b->n_adamw; i++) {
    if ((x = fz_max_abs(b->adamw[i].exp_avg, (size_t)b->adamw[i].size)) > most) most = x;
    if ((x = fz_max_abs(b->adamw[i].exp_avg_sq, (size_t)b->adamw[i].size)) > most) most = x;
  }
  return most;
}

static int all_zero(const unsigned char *p, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) if (p[i]) return 0;
  return 1;
}

/* A blob that loaded must come back exactly from the optimizer's own save; its group records
   too when they have this muon.h's lengths (a shorter one gets defaults, a longer one loses the
   fields this muon.h does not know). */
static void loaded_exactly(fz_model *m, const fz_blob *in, const fz_blob *out) {
  uint32_t i;
  if (in->steps != out->steps) fail(m, "load then save: the step count changed", NULL);
  if (in->groups_canonical && (in->groups_len != out->groups_len || memcmp(in->groups, out->groups, in->groups_len) != 0))
    fail(m, "load then save: the group hyperparameters changed", NULL);
  if (in->n_matrices != out->n_matrices || in->n_adamw != out->n_adamw) fail(m, "load then save: the record counts changed", NULL);
  for (i = 0; i < in->n_matrices; i++) {
    const fz_matrix_rec *a = &in->matrix[i], *b = &out->matrix[i];
    if (a->rows != b->rows || a->cols != b->cols || a->size != b->size || a->name_hash != b->name_hash)
      fail(m, "load then save: a matrix record's shape or name changed", NULL);
    if (memcmp(a->momentum, b->momentum, 4 * (size_t)a->size) != 0) fail(m, "load then save: a momentum changed", NULL);
    if (memcmp(a->layout, b->layout, FZ_LAYOUT_RECORD) != 0) fail(m, "load then save: a layout record changed", NULL);
    if (a->v_len ? a->v_len != b->v_len || memcmp(a->v, b->v, 4 * (size_t)a->v_len) != 0 : !all_zero(b->v, 4 * (size_t)b->v_len))
      fail(m, "load then save: a NorMuon second moment changed (or one absent from the state is not zero)", NULL);
  }
  for (i = 0; i < in->n_adamw; i++) {
    const fz_adamw_rec *a = &in->adamw[i], *b = &out->adamw[i];
    if (a->size != b->size || a->step != b->step || a->name_hash != b->name_hash || a->full_size != b->full_size || a->offset != b->offset)
      fail(m, "load then save: an AdamW record's header changed", NULL);
    if (memcmp(a->exp_avg, b->exp_avg, 8 * (size_t)a->size) != 0) fail(m, "load then save: AdamW moments changed", NULL);
  }
}

/* After a successful load or reshard (input: the blob for an exact comparison, or NULL). */
static void usable(fz_model *m, const unsigned char *input, size_t input_n, const char *call) {
  size_t n, n2;
  unsigned char *out = save(m, &n), *again;
  fz_blob got, in;
  muon_status st;
  snapshot pre;
  int k, sane;
  size_t i;
  if (!fz_blob_read(out, n, &got)) fail(m, "the state saved after a successful call does not parse", call);
  if ((st = muon_state_load(m->opt, out, n)) != MUON_OK) {
    fail(m, "the state saved after a successful call does not load back", muon_error(m->opt));
  }
  again = save(m, &n2);
  if (n2 != n || memcmp(again, out, n) != 0) fail(m, "save, load, save gives other bytes", call);
  free(again);
  if (input && fz_blob_read(input, input_n, &in)) loaded_exactly(m, &in, &got);
  sane = own_groups_len == got.groups_len && memcmp(own_groups, got.groups, got.groups_len) == 0 && blob_max_abs(&got) <= SANE_MAGNITUDE;
  take(m, &pre);
  st = muon_step(m->opt);
  if (verbose) fprintf(stderr, "fuzz_state: model %d:   then muon_step: %s%s\n", m->id, st == MUON_OK ? "ok" : muon_error(m->opt), sane ? " (plausible state)" : "");
  if (st == MUON_OK) {
    for (k = 0; sane && k < m->n_param; k++)
      for (i = 0; i < m->size[k]; i++)
        if (!muon__finite(m->param[k][i])) fail(m, "a parameter is not finite after a step from a loaded state", call);
  } else {
    if (sane) fail(m, "muon_step failed after a plausible state was loaded", muon_error(m->opt));
    failed_with(m, st, MUON_OK, "muon_step after a load");
    unchanged(m, &pre, "muon_step after a load");
  }
  drop(m, &pre);
  free(out);
}

static void try_load(fz_model *m, const unsigned char *buf, size_t n) {
  snapshot before;
  muon_status st;
  take(m, &before);
  st = muon_state_load(m->opt, buf, n);
  say(m, "muon_state_load", st);
  if (st == MUON_OK) usable(m, buf, n, "muon_state_load");
  else {
    failed_with(m, st, MUON_ERR_STATE, "muon_state_load");
    unchanged(m, &before, "muon_state_load");
  }
  drop(m, &before);
}

static void try_reshard(fz_model *m, const void *const *blobs, const size_t *sizes, int count) {
  snapshot before;
  muon_status st;
  take(m, &before);
  st = muon_state_reshard(m->opt, blobs, sizes, count);
  say(m, count == 1 ? "muon_state_reshard of 1" : "muon_state_reshard of 2", st);
  if (st == MUON_OK) usable(m, NULL, 0, "muon_state_reshard");
  else {
    failed_with(m, st, MUON_ERR_STATE, "muon_state_reshard");
    unchanged(m, &before, "muon_state_reshard");
  }
  drop(m, &before);
}

/* A copy of exactly n bytes (so ASan sees any read past it) with its checksum fixed. */
static unsigned char *fixed_copy(const unsigned char *p, size_t n) {
  unsigned char *c = (unsigned char *)xmalloc(n);
  if (n) memcpy(c, p, n);
  fz_fix_checksum(c, n);
  return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  unsigned char *fixed = fixed_copy(data, size), *half[2];
  size_t cut = size / 2, i, part[2];
  const void *blobs[2];
  int id;
  verbose = getenv("FUZZ_VERBOSE") != NULL;
  /* Where to cut for two blobs: the second magic, else the first two bytes. */
  for (i = 1; i + 8 <= size; i++)
    if (memcmp(data + i, "MUONSTAT", 8) == 0) break;
  if (i + 8 <= size) cut = i;
  else if (size >= 2) cut = ((size_t)data[0] | (size_t)data[1] << 8) % (size + 1);
  part[0] = cut;
  part[1] = size - cut;
  half[0] = fixed_copy(data, part[0]);
  half[1] = fixed_copy(data + cut, part[1]);
  for (id = 0; id < FZ_MODELS; id++) {
    fz_model m;
    fz_blob own;
    size_t n;
    unsigned char *blob;
    fz_model_build(&m, id, NULL, 1);
    blob = save(&m, &n);
    if (!fz_blob_read(blob, n, &own)) fail(&m, "the model's own state does not parse", NULL);
    own_groups = (unsigned char *)xmalloc(own.groups_len);
    memcpy(own_groups, own.groups, own.groups_len);
    own_groups_len = own.groups_len;
    free(blob);
    try_load(&m, data, size);
    if (size && memcmp(fixed, data, size) != 0) try_load(&m, fixed, size);
    blobs[0] = fixed;
    try_reshard(&m, blobs, &size, 1);
    blobs[0] = half[0];
    blobs[1] = half[1];
    try_reshard(&m, blobs, part, 2);
    fz_model_free(&m);
    free(own_groups);
  }
  free(fixed);
  free(half[0]);
  free(half[1]);
  return 0;
}
