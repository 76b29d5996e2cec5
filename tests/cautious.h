/* cautious.h - cautious weight decay at the signs of zero, against the formula of muon_hparams'
   cautious_wd comment, written out here rather than taken from muon.h: w = (w*O >= 0 ?
   w*(1 - lr*wd) : w) - adjusted_lr*O, zero agreeing with both signs. w*O is taken in double,
   where the product of two floats is exact (in float, 1e-30 * -1e-30 would be -0 and "agree").
   A zero weight decays to itself, so the cases that tell are a nonzero weight with O = +0 or -0
   (must decay) and opposite signs (must not). cautious_case(i) is element i's (w, O). */
#ifndef MUON_TEST_CAUTIOUS_H
#define MUON_TEST_CAUTIOUS_H

#define CAUTIOUS_N 48
static void cautious_case(int i, float *w, float *o) {
  static const float ws[8] = { 0.0f, -0.0f, 1.5f, -1.5f, 1e-30f, -1e-30f, 3.0f, -3.0f };
  static const float os[6] = { 0.0f, -0.0f, 0.75f, -0.75f, 1e-30f, -1e-30f };
  *w = ws[i / 6];
  *o = os[i % 6];
}
/* The apply slot's arguments for one row of CAUTIOUS_N fp32 elements (a needs muon.h's
   muon_apply_args, included before this file). */
static void cautious_args(muon_apply_args *a) {
  memset(a, 0, sizeof *a);
  a->decay = 1.0f - 0.5f * 0.25f; a->step = 0.125f;
  a->param_dtype = MUON_DTYPE_FP32;
  a->cautious = 1;
  a->piece.h = 1; a->piece.w = CAUTIOUS_N; a->piece.f1 = CAUTIOUS_N; a->piece.rows = 1; a->piece.cols = CAUTIOUS_N;
}
static float cautious_ref(float w, float o, float decay, float step) {
  volatile float d = (double)w * (double)o >= 0 ? w * decay : w, s = step * o;
  return d - s;
}
#endif
