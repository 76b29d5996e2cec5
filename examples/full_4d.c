/* full_4d.c - PP x replicate x shard x TP: a pp x replicate x shard x tp mesh of shape
   2 x world/8 x 2 x 2 (16 ranks: 2 x 2 x 2 x 2). Layout per stage [REPLICATE over replicate,
   SHARD(tp dim) over tp, SHARD(0) over shard]. muonrun -n 16 build/full_4d */
#define MUON_IMPLEMENTATION
#include "common.h"

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  muon_auto_desc ad;
  muon_comm g[4];
  int dims[4], n = 0, s, l;
  static char names[16][32];
  ex_spec specs[16];
  ex_need(&w, w.size % 8 == 0, "a multiple of 8 ranks");
  dims[0] = 2; dims[1] = w.size / 8; dims[2] = 2; dims[3] = 2;
  g[0] = ex_mesh(&w, dims, 4, 0);   /* pp */
  g[1] = ex_mesh(&w, dims, 4, 1);   /* replicate */
  g[2] = ex_mesh(&w, dims, 4, 2);   /* shard */
  g[3] = ex_mesh(&w, dims, 4, 3);   /* tp */
  memset(specs, 0, sizeof specs);
  for (s = 0; s < 2; s++)
    for (l = 2 * s; l < 2 * s + 2; l++) {
      snprintf(names[n], sizeof names[n], "h%d.qkv", l);
      specs[n].name = names[n]; specs[n].rows = 96; specs[n].cols = 32; specs[n].expert = -1; specs[n].tp_dim = 0;
      specs[n].absent = s != g[0].rank; n++;
      snprintf(names[n], sizeof names[n], "h%d.proj", l);
      specs[n].name = names[n]; specs[n].rows = 32; specs[n].cols = 96; specs[n].expert = -1; specs[n].tp_dim = 1;
      specs[n].absent = s != g[0].rank; n++;
    }
  memset(&ad, 0, sizeof ad);
  ad.pp = &g[0];
  ad.replicate = &g[1];
  ad.shard = &g[2];
  ad.tp = &g[3];
  return ex_finish(&w, g, 4, ex_run(&w, "full_4d", specs, n, &ad, NULL, 0));
}
