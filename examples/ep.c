/* ep.c - expert parallel: 2 experts per rank, expert e on rank e % world; dense layers are
   replicated over ep (ep acts as data parallel for them). Expert matrices never leave their
   rank: each is orthogonalised where it lives; dense ones once, by one owner.
   muonrun -n 4 build/ep */
#define MUON_IMPLEMENTATION
#include "common.h"

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  muon_auto_desc ad;
  ex_spec specs[2 + 2 * 2 * 16];
  int n = 0, e;
  memset(specs, 0, sizeof specs);
  ex_need(&w, w.size <= 16, "at most 16 ranks");
  specs[n].name = "attn.qkv"; specs[n].rows = 96; specs[n].cols = 32; specs[n].expert = -1; n++;
  specs[n].name = "attn.out"; specs[n].rows = 32; specs[n].cols = 32; specs[n].expert = -1; n++;
  for (e = 0; e < 2 * w.size; e++) {   /* the same names on every expert: the key tells them apart */
    specs[n].name = "expert.up"; specs[n].rows = 64; specs[n].cols = 32; specs[n].expert = e;
    specs[n].absent = e % w.size != w.rank; n++;
    specs[n].name = "expert.down"; specs[n].rows = 32; specs[n].cols = 64; specs[n].expert = e;
    specs[n].absent = e % w.size != w.rank; n++;
  }
  memset(&ad, 0, sizeof ad);
  ad.ep = &w.world;
  return ex_finish(&w, NULL, 0, ex_run(&w, "ep", specs, n, &ad, NULL, 0));
}
