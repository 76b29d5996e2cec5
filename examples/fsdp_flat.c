/* fsdp_flat.c - llm.c's ZeRO-1 / FSDP1 flat buffers: each layer stack [L, rows, cols] lives in
   one float array and rank r holds the range [r*S/P, (r+1)*S/P) of every layer slice (S =
   rows*cols), ranges that cut rows. muon sees L matrices per stack, each FLAT over the world.
   muonrun -n 4 build/fsdp_flat */
#define MUON_IMPLEMENTATION
#include "common.h"

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  muon_auto_desc ad;
  ex_spec specs[] = {
    { "h.attn.c_attn", 37, 24, 3, 0, 0, -1, {0} },   /* 3 layers of 37 x 24 */
    { "h.attn.c_proj", 24, 24, 3, 0, 0, -1, {0} },
    { "h.mlp.c_fc", 24, 41, 3, 0, 0, -1, {0} },
    { "h.mlp.c_proj", 41, 24, 3, 0, 0, -1, {0} },
  };
  memset(&ad, 0, sizeof ad);
  ad.fsdp = &w.world;
  ad.fsdp_flat = 1;
  return ex_finish(&w, NULL, 0, ex_run(&w, "fsdp_flat", specs, 4, &ad, NULL, 0));
}
