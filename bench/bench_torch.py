"""bench_torch.py - torch.optim.Muon on the GPU, on the matrices bench_gpu times muon_step on.

The 12-layer GPT-2 124M matrix list of bench_gpu.c section 2: per layer qkv 768x2304, attn proj
768x768, fc 768x3072, fc proj 3072x768 (48 matrices), fp32 parameters on cuda, gradients with
bf16 values, torch.optim.Muon's defaults (lr 1e-3, weight decay 0.1, momentum 0.95, nesterov,
5 quintic Newton-Schulz steps, which torch always runs in bf16). torch requires a gradient of the
parameter's dtype, so the gradients are fp32 tensors holding bf16-rounded values (muon_step reads
them as bf16: half the bytes, a negligible part of a step).

Prints one line in the fixed format bench_gpu understands (give the number to it as
`--torch-ms X`, which prints the ratio to muon_step):
    torch.optim.Muon step: 12.345 ms
plus the device memory torch holds: the momentum buffers, and the peak of the transient
allocations of a step (bf16 copies, Gram matrices), as fractions of the fp32 parameters.
Time: host wall time of optimizer.step() between torch.cuda.synchronize() calls, median of
--runs steps after --warmup steps. Exits 0 with a "skipped" line where torch, a CUDA device or
torch.optim.Muon (torch >= 2.9) is missing.

usage: python3 bench/bench_torch.py [--smoke] [--runs N] [--warmup N]
  --smoke   bench_gpu --smoke's tiny matrices (2 layers of 64x96, 64x64, 64x128, 128x64)
"""
import argparse
import datetime
import statistics
import sys
import time

SHAPES = [("qkv", 768, 2304), ("attn_proj", 768, 768), ("fc", 768, 3072), ("fc_proj", 3072, 768)]
LAYERS = 12
TINY_SHAPES = [("qkv", 64, 96), ("attn_proj", 64, 64), ("fc", 64, 128), ("fc_proj", 128, 64)]
TINY_LAYERS = 2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny matrices; times meaningless")
    ap.add_argument("--runs", type=int, default=None, help="timed steps (default 20; smoke 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; smoke 1)")
    args = ap.parse_args()
    runs = args.runs if args.runs is not None else (2 if args.smoke else 20)
    warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 3)
    if runs < 1 or warmup < 0:
        ap.error("--runs must be >= 1 and --warmup >= 0")

    try:
        import torch
    except ImportError:
        print("torch not installed: skipped")
        return 0
    if not torch.cuda.is_available():
        print("torch %s: no CUDA device: skipped" % torch.__version__)
        return 0
    if not hasattr(torch.optim, "Muon"):
        print("torch %s has no torch.optim.Muon (it needs torch >= 2.9): skipped" % torch.__version__)
        return 0

    shapes, layers = (TINY_SHAPES, TINY_LAYERS) if args.smoke else (SHAPES, LAYERS)
    dev = torch.device("cuda")
    print("== bench_torch: torch.optim.Muon on %s%s ==" % (
        torch.cuda.get_device_name(dev),
        " -- SMOKE RUN: tiny shapes, the TIME IS MEANINGLESS" if args.smoke else ""))
    print("torch %s, CUDA %s; date %s" % (torch.__version__, torch.version.cuda,
                                         datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")))
    print("settings: %d layers x {%s}, fp32 params, fp32 grads holding bf16 values, torch.optim.Muon defaults "
          "(lr 1e-3, weight decay 0.1, momentum 0.95, nesterov, 5 NS steps in bf16); host wall time of "
          "step() between torch.cuda.synchronize(), median of %d after %d warm-up"
          % (layers, ", ".join("%s %dx%d" % s for s in shapes), runs, warmup))

    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    params = []
    for _ in range(layers):
        for _, rows, cols in shapes:
            p = torch.nn.Parameter((torch.rand(rows, cols, device=dev, generator=gen) * 2 - 1) * 0.02)
            g = (torch.rand(rows, cols, device=dev, generator=gen) * 2 - 1) * 0.01
            p.grad = g.to(torch.bfloat16).to(torch.float32)
            params.append(p)
    n_params = sum(p.numel() for p in params)
    param_bytes = 4 * n_params

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(dev)
    opt = torch.optim.Muon(params)  # the defaults, as muon_default_hparams()
    for _ in range(warmup):
        opt.step()
    torch.cuda.synchronize()
    state = torch.cuda.memory_allocated(dev) - before

    times = []
    torch.cuda.reset_peak_memory_stats(dev)
    resident = torch.cuda.memory_allocated(dev)
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.step()
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t0))
    transient = torch.cuda.max_memory_allocated(dev) - resident

    ms = statistics.median(times)
    print("torch.optim.Muon step: %.3f ms" % ms)
    print("  (min %.3f, max %.3f over %d steps; %d matrices, %d parameters)"
          % (min(times), max(times), runs, len(params), n_params))
    print("  memory: state (momentum) %.1f MiB = %.3f x the fp32 params; transient peak within a step %.1f MiB = "
          "%.3f x params (caching allocator; freed, not returned)"
          % (state / 2**20, state / param_bytes, transient / 2**20, transient / param_bytes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
