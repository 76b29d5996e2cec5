/* pp.c - pipeline parallel: stage s holds layers 2s and 2s+1 and nothing else; a pp x fsdp
   mesh (world/2 stages of 2 fsdp ranks when the world is even, else one rank per stage). The
   matrices of a stage are owned and orthogonalised inside it. muonrun -n 4 build/pp */
#define MUON_IMPLEMENTATION
#include "common.h"

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  muon_auto_desc ad;
  muon_comm g[2];
  int dims[2], n = 0, s, l;
  static char names[64][32];
  ex_spec specs[64];
  dims[1] = w.size % 2 == 0 ? 2 : 1;
  dims[0] = w.size / dims[1];
  ex_need(&w, dims[0] <= 16, "at most 16 stages");
  g[0] = ex_mesh(&w, dims, 2, 0);   /* pp: this rank's stage is g[0].rank */
  g[1] = ex_mesh(&w, dims, 2, 1);   /* fsdp inside a stage */
  memset(specs, 0, sizeof specs);
  for (s = 0; s < dims[0]; s++)
    for (l = 2 * s; l < 2 * s + 2; l++) {
      snprintf(names[n], sizeof names[n], "h%d.attn", l);
      specs[n].name = names[n]; specs[n].rows = 48; specs[n].cols = 32; specs[n].expert = -1;
      specs[n].absent = s != g[0].rank; n++;
      snprintf(names[n], sizeof names[n], "h%d.mlp", l);
      specs[n].name = names[n]; specs[n].rows = 32; specs[n].cols = 80; specs[n].expert = -1;
      specs[n].absent = s != g[0].rank; n++;
    }
  memset(&ad, 0, sizeof ad);
  ad.pp = &g[0];
  ad.fsdp = &g[1];
  return ex_finish(&w, g, 2, ex_run(&w, "pp", specs, n, &ad, NULL, 0));
}
