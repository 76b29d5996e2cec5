/* ddp.c - DDP: every rank holds every matrix (gradients already all-reduced). Without a config
   each rank would orthogonalise everything; with REPLICATE over the world each matrix is
   orthogonalised once, by its owner, and the result is broadcast to the replicas.
   muonrun -n 4 build/ddp */
#define MUON_IMPLEMENTATION
#include "common.h"

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  muon_auto_desc ad;
  ex_spec specs[] = {
    { "embed.proj", 64, 32, 0, 0, 0, -1, {0} },
    { "block.qkv", 96, 32, 0, 0, 0, -1, {0} },
    { "block.out", 32, 32, 0, 0, 0, -1, {0} },
    { "block.mlp", 32, 128, 0, 0, 0, -1, {0} },
  };
  memset(&ad, 0, sizeof ad);
  ad.ddp = &w.world;
  return ex_finish(&w, NULL, 0, ex_run(&w, "ddp", specs, 4, &ad, NULL, 0));
}
