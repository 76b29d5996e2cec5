/* cp.c - context parallel: the sequence is split over the cp group, the weights are not (each
   cp rank holds them whole), so for Muon cp is a replica dimension like DDP. Here a dp x cp
   mesh when the world is even (dp = world/2, cp = 2), else cp over the whole world.
   muonrun -n 4 build/cp */
#define MUON_IMPLEMENTATION
#include "common.h"

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  muon_auto_desc ad;
  muon_comm g[2];
  int dims[2];
  ex_spec specs[] = {
    { "attn.qkv", 96, 32, 0, 0, 0, -1, {0} },
    { "attn.out", 32, 32, 0, 0, 0, -1, {0} },
    { "mlp.up", 128, 32, 0, 0, 0, -1, {0} },
    { "mlp.down", 32, 128, 0, 0, 0, -1, {0} },
  };
  memset(&ad, 0, sizeof ad);
  dims[0] = w.size % 2 == 0 ? w.size / 2 : 1;
  dims[1] = w.size % 2 == 0 ? 2 : w.size;
  g[0] = ex_mesh(&w, dims, 2, 0);   /* dp */
  g[1] = ex_mesh(&w, dims, 2, 1);   /* cp */
  ad.ddp = &g[0];
  ad.cp = &g[1];
  return ex_finish(&w, g, 2, ex_run(&w, "cp", specs, 4, &ad, NULL, 0));
}
