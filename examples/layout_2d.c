/* layout_2d.c - the DTensor way (muon_layout_config): each matrix carries its own
   layout over a 2-D mesh (world/2 x 2, or world x 1 when odd): [Shard(0) over rows, Shard(1)
   over cols], the transposed placement, and a FLAT range of a TP-local piece (not a rectangle).
   muonrun -n 4 build/layout_2d */
#define MUON_IMPLEMENTATION
#include "common.h"

int main(int argc, char **argv) {
  ex_world w = ex_init(argc, argv);
  muon_dist_config cfg = muon_layout_config();
  muon_comm g[2];
  int dims[2];
  ex_spec specs[3];
  dims[1] = w.size % 2 == 0 ? 2 : 1;
  dims[0] = w.size / dims[1];
  g[0] = ex_mesh(&w, dims, 2, 0);
  g[1] = ex_mesh(&w, dims, 2, 1);
  memset(specs, 0, sizeof specs);
  specs[0].name = "w_shard0_shard1"; specs[0].rows = 50; specs[0].cols = 36; specs[0].expert = -1;
  specs[0].layout.n_levels = 2;
  specs[0].layout.levels[0] = muon_shard(0, &g[0]);
  specs[0].layout.levels[1] = muon_shard(1, &g[1]);
  specs[1].name = "w_shard1_shard0"; specs[1].rows = 40; specs[1].cols = 70; specs[1].expert = -1;
  specs[1].layout.n_levels = 2;
  specs[1].layout.levels[0] = muon_shard(1, &g[0]);
  specs[1].layout.levels[1] = muon_shard(0, &g[1]);
  specs[2].name = "w_tp_then_flat"; specs[2].rows = 30; specs[2].cols = 44; specs[2].expert = -1;
  specs[2].layout.n_levels = 2;
  specs[2].layout.levels[0] = muon_shard(1, &g[1]);
  specs[2].layout.levels[1] = muon_flat(&g[0]);
  return ex_finish(&w, g, 2, ex_run(&w, "layout_2d", specs, 3, NULL, &cfg, 1));
}
