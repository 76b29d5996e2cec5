/* hsdp.c - HSDP: shard inside a replica group, replicate across groups. A replicate x shard
   mesh (2 x world/2 when the world is even). Layout [REPLICATE over replicate, SHARD(0) over
   shard]; owners are spread over all ranks, not repeated per replica. muonrun -n 4 build/hsdp */
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
    { "head", 7, 32, 0, 0, 0, -1, {0} },
  };
  memset(&ad, 0, sizeof ad);
  dims[0] = w.size % 2 == 0 ? 2 : 1;
  dims[1] = w.size / dims[0];
  g[0] = ex_mesh(&w, dims, 2, 0);   /* replicate */
  g[1] = ex_mesh(&w, dims, 2, 1);   /* shard */
  ad.replicate = &g[0];
  ad.shard = &g[1];
  return ex_finish(&w, g, 2, ex_run(&w, "hsdp", specs, 5, &ad, NULL, 0));
}
