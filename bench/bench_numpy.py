"""bench_numpy.py - the same Newton-Schulz in numpy float32, beside muon's CBLAS NS.

The iteration is muon's (and torch.optim.Muon's): quintic (3.4445, -4.7750, 2.0315), 5 steps,
fp32, X / max(|X|_F, eps), tall matrices transposed, A = X X^T, B = b A + c A A, X = a X + B X.
Shapes: 512x512, 1024x1024, 1024x4096, 4096x1024 (--quick: the first two). Median of several
repetitions. The muon figures come from the file bench_ns writes (default build/bench_ns.txt),
so the printed ratio compares the same machine in the same `make bench`; without the file only
numpy's figures are printed.

usage: OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/bench_numpy.py [--quick] [--muon FILE]
"""
import os
import sys
import time

import numpy as np

STEPS = 5
A_, B_, C_ = 3.4445, -4.7750, 2.0315
EPS = 1e-7
SHAPES = [(512, 512), (1024, 1024), (1024, 4096), (4096, 1024)]
REPS = {512: 5, 1024: 3}


def newton_schulz(g):
    x = g.astype(np.float32, copy=True)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = np.ascontiguousarray(x.T)
    norm = np.float32(np.sqrt(np.sum(x.astype(np.float64) ** 2)))
    x /= max(norm, np.float32(EPS))
    a, b, c = np.float32(A_), np.float32(B_), np.float32(C_)
    for _ in range(STEPS):
        A = x @ x.T
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    if tall:
        x = np.ascontiguousarray(x.T)
    return x


def flops(rows, cols):
    m, n = min(rows, cols), max(rows, cols)
    return STEPS * (4.0 * m * m * n + 2.0 * m ** 3)


def blas_info():
    """numpy version and which BLAS this process actually loaded (np.show_config is too long)."""
    info = ["numpy %s" % np.__version__]
    try:
        import threadpoolctl  # noqa: F401
        for p in threadpoolctl.threadpool_info():
            if p.get("user_api") == "blas":
                info.append("%s %s (%s, %s threads)" % (p.get("internal_api"), p.get("version"),
                                                        p.get("filepath"), p.get("num_threads")))
    except ImportError:
        info.append("threadpoolctl not available")
        try:  # the shared objects mapped into this process name the BLAS
            with open("/proc/self/maps") as f:
                libs = sorted({line.split()[-1] for line in f
                               if "blas" in line.lower() or "lapack" in line.lower()})
            info.append("BLAS libraries mapped: " + (", ".join(libs) if libs else "none found"))
        except OSError:
            pass
    info.append("OPENBLAS_NUM_THREADS=%s" % os.environ.get("OPENBLAS_NUM_THREADS", "unset"))
    if "OPENBLAS_CORETYPE" in os.environ:
        info.append("OPENBLAS_CORETYPE=%s" % os.environ["OPENBLAS_CORETYPE"])
    return info


def read_muon(path):
    """rows cols cblas_plain_ms cblas_symm_ms ceiling_gflops, per shape, from bench_ns."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                r, c, plain, symm, _ceiling = line.split()
                out[(int(r), int(c))] = (float(plain), float(symm))
    except (OSError, ValueError):
        return None
    return out


def main():
    quick = "--quick" in sys.argv
    path = "build/bench_ns.txt"
    if "--muon" in sys.argv:
        path = sys.argv[sys.argv.index("--muon") + 1]
    muon = read_muon(path)
    np.dot(np.ones((64, 64), np.float32), np.ones((64, 64), np.float32))  # load the BLAS first
    print("== bench_numpy: Newton-Schulz in numpy float32 (single-threaded when "
          "OPENBLAS_NUM_THREADS=1, as `make bench` runs it) ==")
    print("; ".join(blas_info()))
    if muon is None:
        print("(no muon figures: %s not found or unreadable; run build/bench_ns first)" % path)
    print("%-11s %10s %9s %18s %18s" % ("shape", "numpy ms", "GFLOP/s", "muon CBLAS symm", "muon CBLAS plain"))
    rng = np.random.default_rng(0)
    for rows, cols in SHAPES[:2] if quick else SHAPES:
        g = rng.uniform(-1, 1, size=(rows, cols)).astype(np.float32)
        newton_schulz(g)  # warm-up
        times = []
        for _ in range(REPS.get(max(rows, cols), 2)):
            t0 = time.perf_counter()
            newton_schulz(g)
            times.append(time.perf_counter() - t0)
        ms = 1e3 * float(np.median(times))
        rate = flops(rows, cols) / (ms * 1e-3) * 1e-9
        cols_muon = ["%18s" % "-", "%18s" % "-"]
        if muon and (rows, cols) in muon:
            for i, m_ms in enumerate((muon[(rows, cols)][1], muon[(rows, cols)][0])):
                if m_ms > 0:
                    cols_muon[i] = "%18s" % ("%.2fx numpy" % (ms / m_ms))
        print("%-11s %10.1f %9.1f %s %s" % ("%dx%d" % (rows, cols), ms, rate, cols_muon[0], cols_muon[1]))
    print("('muon CBLAS symm' = numpy's time / muon_newton_schulz's time with hp.gemm = CBLAS, symmetric = 1 "
          "(the default), from bench_ns; > 1 means muon is faster. GFLOP/s counts 5*(4m^2n+2m^3).)")


if __name__ == "__main__":
    main()
