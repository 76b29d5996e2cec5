/* bench_nccl.c - the distributed Muon step over NCCL, one process per GPU (muonrun -n N).

   Every matrix of GPT-2 124M (12 layers x {768x2304, 768x768, 768x3072, 3072x768}) or GPT-2
   1.5B (48 layers x {1600x4800, 1600x1600, 1600x6400, 6400x1600}) is sharded FSDP-style along
   dim 0 over all ranks; muon gathers each to its owner, orthogonalises it there (CUDA backend)
   and sends the
   pieces back over NCCL. Newton-Schulz in fp32 (muon's default), bf16 with --bf16. Prints the step time (mean of timed steps after warm-up, the slowest
   rank's), bytes each rank sent per step against DESIGN.md's formula 2(P-1)/P^2 * S * 4, and,
   given the one-GPU time (--base FILE, written by the -n 1 run with --save FILE), the scaling.

   usage: muonrun -n N build/gpu/bench_nccl [--model 124m|1.5b] [--steps K] [--bf16]
                                             [--save FILE] [--base FILE] [--smoke]
     --smoke  two tiny layers and one timed step: runs anywhere (the stand-ins in make test);
              its times mean nothing. */
#define MUON_IMPLEMENTATION
#include "muon.h"
#include "muon_cuda.h"
#include "muon_nccl.h"
#include <cuda_runtime_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static double now_s(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

static void die(const char *what, const char *why) {
  fprintf(stderr, "bench_nccl: %s: %s\n", what, why);
  exit(1);
}

int main(int argc, char **argv) {
  static const int s124[4][2] = { { 768, 2304 }, { 768, 768 }, { 768, 3072 }, { 3072, 768 } };
  static const int s15b[4][2] = { { 1600, 4800 }, { 1600, 1600 }, { 1600, 6400 }, { 6400, 1600 } };
  static const int tiny[4][2] = { { 32, 48 }, { 32, 32 }, { 32, 64 }, { 64, 32 } };
  const int (*shapes)[2] = s124;
  const char *model = "GPT-2 124M", *save = NULL, *base = NULL;
  int layers = 12, steps = 20, smoke = 0, bf16 = 0, i, l, k, dev = 0, ndev = 1;
  muon_compute gpu;
  muon_cuda_desc cd = muon_cuda_default_desc();
  muon_nccl_desc nd = muon_nccl_default_desc();
  muon_comm world;
  muon_desc desc = muon_default_desc();
  muon_dist_config cfg = muon_layout_config();
  muon_optimizer *opt;
  muon_layout lay;
  muon_stats s0, s1;
  double t0, ms, *all, slowest = 0, S = 0, formula, sent;
  float *host;
  void **bufs;
  memset(&lay, 0, sizeof lay);
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--model") && i + 1 < argc) {
      i++;
      if (!strcmp(argv[i], "1.5b")) { shapes = s15b; layers = 48; model = "GPT-2 1.5B"; }
      else if (strcmp(argv[i], "124m")) die("--model", "124m or 1.5b");
    } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--save") && i + 1 < argc) save = argv[++i];
    else if (!strcmp(argv[i], "--base") && i + 1 < argc) base = argv[++i];
    else if (!strcmp(argv[i], "--bf16")) bf16 = 1;
    else if (!strcmp(argv[i], "--smoke")) smoke = 1;
    else die("usage", "[--model 124m|1.5b] [--steps K] [--bf16] [--save FILE] [--base FILE] [--smoke]");
  }
  if (smoke) { shapes = tiny; layers = 2; steps = 1; model = "tiny (smoke)"; }
  /* One GPU per rank: the launcher's local rank picks it. */
  if (getenv("LOCAL_RANK")) dev = atoi(getenv("LOCAL_RANK"));
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) die("cudaGetDeviceCount", "no GPU");
  cd.device = dev % ndev;
  if (muon_cuda_create(&gpu, &cd) != MUON_OK) die("muon_cuda_create", muon_error(NULL));
  nd.stream = muon_cuda_stream(&gpu);
  if (muon_nccl_create(&world, &nd) != MUON_OK) die("muon_nccl_create", muon_error(NULL));

  desc.comm = &world;
  desc.dist = &cfg;
  desc.compute = &gpu;
  desc.hparams.precision = bf16 ? MUON_PRECISION_BF16 : MUON_PRECISION_FP32;
  if (muon_create(&opt, &desc) != MUON_OK) die("muon_create", muon_error(NULL));
  bufs = (void **)calloc(2 * 4 * (size_t)layers, sizeof(void *));
  host = (float *)malloc((size_t)6400 * 1600 * sizeof(float));
  for (l = 0; l < layers; l++)
    for (k = 0; k < 4; k++) {
      muon_matrix m = muon_default_matrix();
      char name[32];
      int rows = shapes[k][0], cols = shapes[k][1], r0 = (rows + world.size - 1) / world.size * world.rank;
      int h = r0 >= rows ? 0 : (rows - r0 < (rows + world.size - 1) / world.size ? rows - r0 : (rows + world.size - 1) / world.size);
      size_t n = (size_t)h * cols, e;
      void **p = &bufs[2 * (4 * l + k)];
      S += (double)rows * cols;
      for (e = 0; e < n; e++) host[e] = (float)((e * 2654435761u + (size_t)(4 * l + k)) % 1000) * 1e-3f - 0.5f;
      if (cudaMalloc(&p[0], n ? n * sizeof(float) : 4) != cudaSuccess || cudaMalloc(&p[1], n ? n * sizeof(float) : 4) != cudaSuccess)
        die("cudaMalloc", "parameters");
      if (n && (cudaMemcpy(p[0], host, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess ||
                cudaMemcpy(p[1], host, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess))
        die("cudaMemcpy", "parameters");
      snprintf(name, sizeof name, "h%d.%d", l, k);
      m.name = name;
      m.rows = rows;
      m.cols = cols;
      m.param = p[0];
      m.grad = p[1];
      lay.n_levels = 1;
      lay.levels[0] = muon_shard(0, &world);
      m.layout = &lay;     /* read during muon_add_matrix */
      if (muon_add_matrix(opt, &m, NULL) != MUON_OK) die("muon_add_matrix", muon_error(opt));
    }
  for (i = 0; i < (smoke ? 1 : 3); i++)
    if (muon_step(opt) != MUON_OK) die("muon_step (warm-up)", muon_error(opt));
  muon_get_stats(opt, &s0);
  t0 = now_s();
  for (i = 0; i < steps; i++)
    if (muon_step(opt) != MUON_OK) die("muon_step", muon_error(opt));
  ms = (now_s() - t0) * 1e3 / steps;   /* muon_step returns after its last host wait */
  muon_get_stats(opt, &s1);
  all = (double *)calloc((size_t)world.size, sizeof(double));
  if (world.vt->allgather(world.ctx, &ms, all, sizeof ms) != MUON_OK) die("allgather", world.vt->error(world.ctx));
  for (i = 0; i < world.size; i++) if (all[i] > slowest) slowest = all[i];
  sent = (double)(s1.bytes_sent - s0.bytes_sent) / steps;
  formula = 2.0 * (world.size - 1) / ((double)world.size * world.size) * S * 4.0;
  if (world.rank == 0) {
    printf("%s, %d matrices (%.1fM elements), FSDP dim 0 over %d GPU(s), NCCL, %s Newton-Schulz%s\n", model, 4 * layers,
           S / 1e6, world.size, bf16 ? "bf16" : "fp32", smoke ? " -- SMOKE: times mean nothing" : "");
    printf("  step: %.3f ms (slowest rank, mean of %d after warm-up); %d exchange round(s); host waits for NCCL per step: %.0f\n",
           slowest, steps, s1.rounds, (double)(s1.comm_waits - s0.comm_waits) / steps);
    printf("  bytes sent by rank 0 per step: %.0f; formula 2(P-1)/P^2*S*4 = %.0f; ratio %.4f\n", sent, formula,
           formula > 0 ? sent / formula : (sent == 0 ? 1.0 : 0.0));
    if (save) {
      FILE *f = fopen(save, "w");
      if (f) { fprintf(f, "%.6f\n", slowest); fclose(f); }
    }
    if (base) {
      FILE *f = fopen(base, "r");
      double one = 0;
      if (f && fscanf(f, "%lf", &one) == 1 && one > 0)
        printf("  scaling: %d GPUs = %.2fx one GPU's step (%.3f ms -> %.3f ms)%s\n", world.size, one / slowest, one, slowest,
               world.size == 8 && !smoke ? (one / slowest >= 6.0 ? "; goal >= 6x: met" : "; goal >= 6x: NOT met") : "");
      if (f) fclose(f);
    }
  }
  muon_destroy(opt);
  for (i = 0; i < 8 * layers; i++) cudaFree(bufs[i]);
  free(bufs);
  free(host);
  free(all);
  muon_comm_destroy(&world);
  muon_compute_destroy(&gpu);
  return 0;
}
