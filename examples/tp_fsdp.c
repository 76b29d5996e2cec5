/* tp_fsdp.c - TP x FSDP (2-D): a fsdp x tp mesh, tp = 2. Layout [SHARD(tp dim) over tp,
   SHARD(0) over fsdp]: gathering undoes FSDP first, then TP. muonrun -n 4 build/tp_fsdp */
#define MUON_IMPLEMENTATION
#include "common.h"

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  muon_auto_desc ad;
  muon_comm g[2];
  int dims[2];
  ex_spec specs[] = {
    { "attn.qkv", 96, 32, 0, 0, 0, -1, {0} },
    { "attn.proj", 32, 32, 0, 0, 1, -1, {0} },
    { "mlp.fc", 128, 32, 0, 0, 0, -1, {0} },
    { "mlp.proj", 32, 128, 0, 0, 1, -1, {0} },
  };
  ex_need(&w, w.size % 2 == 0, "an even number of ranks");
  memset(&ad, 0, sizeof ad);
  dims[0] = w.size / 2;
  dims[1] = 2;
  g[0] = ex_mesh(&w, dims, 2, 0);   /* fsdp */
  g[1] = ex_mesh(&w, dims, 2, 1);   /* tp */
  ad.fsdp = &g[0];
  ad.tp = &g[1];
  return ex_finish(&w, g, 2, ex_run(&w, "tp_fsdp", specs, 4, &ad, NULL, 0));
}
