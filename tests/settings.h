/* settings.h - muon.h's lists of the settings ranks must share (>>impl-settings) as tables for
   the tests, so that a line added to a list is a case that runs. Include after muon.h with
   MUON_IMPLEMENTATION. tset_*_alt(hp, i) sets field i to the list's non-default value; the
   kinds say how the message names it (NS: "[0][0]" after the name, the first coefficient). */
#ifndef MUON_TEST_SETTINGS_H
#define MUON_TEST_SETTINGS_H

typedef struct tset { const char *name, *kind; size_t bytes; } tset;

#define TSET_ROW_H(f, type, kind, alt) { #f, #kind, sizeof(((muon_hparams *)0)->f) },
#define TSET_ROW_A(f, type, kind, alt) { #f, #kind, sizeof(((muon_adamw_hparams *)0)->f) },
static const tset TSET_HPARAMS[] = { MUON__HPARAMS_FIELDS(TSET_ROW_H) };
static const tset TSET_ADAMW[] = { MUON__ADAMW_FIELDS(TSET_ROW_A) };
#undef TSET_ROW_H
#undef TSET_ROW_A
#define TSET_RUN_ROW(f, label, kind, value) { #f, label, 0 },
/* Here `kind` holds the name the MISMATCH message gives. */
static const tset TSET_RUN[] = { MUON__RUN_FIELDS(TSET_RUN_ROW) };
#undef TSET_RUN_ROW
#define TSET_N(t) ((int)(sizeof(t) / sizeof(t[0])))

#define TSET_ALT_F(s, f, type, alt) (s)->f = (alt)
#define TSET_ALT_U(s, f, type, alt) (s)->f = (type)(alt)
#define TSET_ALT_NS(s, f, type, alt) (s)->f[0][0] = (alt)
#define TSET_ALT(f, type, kind, alt) if (k++ == i) TSET_ALT_##kind(s, f, type, alt);
static void tset_hparams_alt(muon_hparams *s, int i) {
  int k = 0;
  MUON__HPARAMS_FIELDS(TSET_ALT)
}
static void tset_adamw_alt(muon_adamw_hparams *s, int i) {
  int k = 0;
  MUON__ADAMW_FIELDS(TSET_ALT)
}
#undef TSET_ALT

/* Bytes of a struct's fields that the list holds: the struct's size when every field is listed
   (these structs have no padding). */
static size_t tset_bytes(const tset *t, int n) {
  size_t b = 0;
  int i;
  for (i = 0; i < n; i++) b += t[i].bytes;
  return b;
}

/* The text a MISMATCH about field i names: "muon_hparams.f" (+ "[0][0]" for NS). */
static void tset_field_text(const char *strct, const tset *t, char *out, size_t n) {
  snprintf(out, n, "%s.%s%s", strct, t->name, strcmp(t->kind, "NS") ? "" : "[0][0]");
}

#endif
