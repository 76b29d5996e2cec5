/* fsdp.c - FSDP (ZeRO-3 style): every matrix sharded by rows over all ranks, uneven on purpose
   (rows that do not divide by the world size; with 8 ranks a matrix of 18 rows leaves the last
   two ranks an empty piece), and one of a real layer's size.   muonrun -n 4 build/fsdp */
#define MUON_IMPLEMENTATION
#include "common.h"

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  muon_auto_desc ad;
  ex_spec specs[] = {
    { "attn.qkv", 18, 48, 0, 0, 0, -1, {0} },
    { "attn.proj", 48, 48, 0, 0, 0, -1, {0} },
    { "mlp.fc", 96, 48, 0, 0, 0, -1, {0} },
    { "mlp.proj", 48, 96, 0, 0, 0, -1, {0} },
    { "head", 13, 48, 0, 0, 0, -1, {0} },
    { "mlp.wide", 256, 384, 0, 0, 0, -1, {0} },   /* 98,304 floats: the built-in GEMM's packed path */
  };
  memset(&ad, 0, sizeof ad);
  ad.fsdp = &w.world;   /* SHARD(0) over every rank */
  return ex_finish(&w, NULL, 0, ex_run(&w, "fsdp", specs, 6, &ad, NULL, 0));
}
