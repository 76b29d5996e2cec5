/* ep_tp.c - EP x TP: an ep x tp mesh (world/2 x 2). Each expert lives on one ep index and is
   tensor-parallel inside it; dense layers are replicated over ep and tensor-parallel.
   muonrun -n 4 build/ep_tp */
#define MUON_IMPLEMENTATION
#include "common.h"

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  muon_auto_desc ad;
  muon_comm g[2];
  int dims[2], n = 0, e;
  ex_spec specs[2 + 2 * 2 * 8];
  ex_need(&w, w.size % 2 == 0 && w.size <= 16, "an even number of ranks, at most 16");
  dims[0] = w.size / 2;
  dims[1] = 2;
  g[0] = ex_mesh(&w, dims, 2, 0);   /* ep */
  g[1] = ex_mesh(&w, dims, 2, 1);   /* tp */
  memset(specs, 0, sizeof specs);
  specs[n].name = "attn.qkv"; specs[n].rows = 96; specs[n].cols = 32; specs[n].expert = -1; n++;
  specs[n].name = "attn.out"; specs[n].rows = 32; specs[n].cols = 32; specs[n].expert = -1; specs[n].tp_dim = 1; n++;
  for (e = 0; e < 2 * dims[0]; e++) {
    specs[n].name = "expert.up"; specs[n].rows = 64; specs[n].cols = 32; specs[n].expert = e;
    specs[n].absent = e % dims[0] != g[0].rank; n++;
    specs[n].name = "expert.down"; specs[n].rows = 32; specs[n].cols = 64; specs[n].expert = e; specs[n].tp_dim = 1;
    specs[n].absent = e % dims[0] != g[0].rank; n++;
  }
  memset(&ad, 0, sizeof ad);
  ad.ep = &g[0];
  ad.tp = &g[1];
  return ex_finish(&w, g, 2, ex_run(&w, "ep_tp", specs, n, &ad, NULL, 0));
}
