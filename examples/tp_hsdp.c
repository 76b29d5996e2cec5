/* tp_hsdp.c - TP x HSDP (3-D): a replicate x shard x tp mesh (2 x world/4 x 2). Layout
   [REPLICATE over replicate, SHARD(tp dim) over tp, SHARD(0) over shard]. muonrun -n 8 build/tp_hsdp */
#define MUON_IMPLEMENTATION
#include "common.h"

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  muon_auto_desc ad;
  muon_comm g[3];
  int dims[3];
  ex_spec specs[] = {
    { "attn.qkv", 96, 32, 0, 0, 0, -1, {0} },
    { "attn.proj", 32, 32, 0, 0, 1, -1, {0} },
    { "mlp.fc", 128, 32, 0, 0, 0, -1, {0} },
    { "mlp.proj", 32, 128, 0, 0, 1, -1, {0} },
  };
  ex_need(&w, w.size % 4 == 0, "a multiple of 4 ranks");
  memset(&ad, 0, sizeof ad);
  dims[0] = 2;
  dims[1] = w.size / 4;
  dims[2] = 2;
  g[0] = ex_mesh(&w, dims, 3, 0);   /* replicate */
  g[1] = ex_mesh(&w, dims, 3, 1);   /* shard */
  g[2] = ex_mesh(&w, dims, 3, 2);   /* tp */
  ad.replicate = &g[0];
  ad.shard = &g[1];
  ad.tp = &g[2];
  return ex_finish(&w, g, 3, ex_run(&w, "tp_hsdp", specs, 4, &ad, NULL, 0));
}
