/* tp.c - tensor parallel over every rank, with a different TP dim per matrix (Megatron:
   column-parallel qkv/fc split dim 0 of the [out, in] weight, row-parallel proj split dim 1),
   and one matrix replicated over tp. muonrun -n 4 build/tp */
#define MUON_IMPLEMENTATION
#include "common.h"

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  muon_auto_desc ad;
  ex_spec specs[] = {
    { "attn.qkv", 96, 32, 0, 0, 0, -1, {0} },    /* column-parallel: SHARD(0) */
    { "attn.proj", 32, 32, 0, 0, 1, -1, {0} },   /* row-parallel: SHARD(1) */
    { "mlp.fc", 128, 32, 0, 0, 0, -1, {0} },
    { "mlp.proj", 32, 128, 0, 0, 1, -1, {0} },
    { "router", 8, 32, 0, 0, -1, -1, {0} },      /* replicated over tp */
  };
  memset(&ad, 0, sizeof ad);
  ad.tp = &w.world;
  return ex_finish(&w, NULL, 0, ex_run(&w, "tp", specs, 5, &ad, NULL, 0));
}
