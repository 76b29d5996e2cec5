#!/usr/bin/python3
"""ref_muon.py - an independent numpy float64 reference for muon's golden-vector tests.

Usage:  /usr/bin/python3 tests/ref_muon.py OUTDIR
        (Debian's python3-numpy; any numpy >= 1.17 works.)

It is a direct transcription of DESIGN.md section 1 (torch.optim.Muon semantics) and of
torch.optim.AdamW (single-tensor code path), written without looking at muon.h's implementation.
Everything is float64; the inputs (params, grads, hyperparameters, NS coefficients) are first
rounded to float32 so the reference starts from exactly the bits the C tests use, and only the
arithmetic differs. In bf16 mode the Newton-Schulz iteration rounds to bf16 (round-to-nearest-even
of the float32 value) where torch does: the initial X, its norm, the normalised X, and the outputs
A = X X^T, Bm = b A + c A A (one rounding) and X = a X + Bm X (one rounding); products are exact
float64 from the rounded inputs.

OUTPUT
------
OUTDIR/golden.list  one case file name per line: optimizer-step cases (tests/test_golden.c)
OUTDIR/ns.list      one case file name per line: Newton-Schulz cases   (tests/test_ns.c)
OUTDIR/normuon.list one case file name per line: NorMuon cases of one NS operand (tests/test_golden.c,
                    which calls muon__normuon directly)
OUTDIR/*.case       one file per case.

A case file is a sequence of '\\n'-terminated ASCII lines of space-separated tokens; a line that
starts with "arr" is immediately followed by raw little-endian float64 data:

    arr KIND ENTRY N     then N * 8 bytes: N little-endian IEEE float64 (all exactly float32 values
                         except the *_ref / ns_out arrays, which are the float64 reference results)

Numbers in text lines are printed with repr() of the float64 value of a float32, so strtod()
followed by a cast to float gives back exactly the float the reference used.

Step cases (golden.list), lines in this order:
    muon-golden 1
    name TEXT...                       the rest of the line is the case name
    defaults 0|1                       1: the C side must use muon_default_desc() untouched (and
                                       checks that it equals the group 0 / adamw_group 0 lines)
    group G LR WD MOMENTUM NESTEROV STYLE ADJUST NS_STEPS PRESET PRECISION EPS [CAUTIOUS [NORMUON BETA2]]
                                       Muon group G (0 = desc.hparams, then 1, 2, ... in order,
                                       each made with muon_add_group). STYLE 0 lerp / 1 sgd;
                                       ADJUST 0 original / 1 match_rms_adamw / 2 none; PRESET -1 =
                                       leave muon_default_hparams()'s coefficients, 0 quintic,
                                       1 Polar Express (muon_set_ns_preset); PRECISION 0 fp32 / 1 bf16.
                                       Optional trailing fields (absent: the defaults): CAUTIOUS
                                       0 / 1 (cautious_wd); NORMUON 0 off / 1 rows / 2 larger
                                       (muon_normuon) and BETA2 (normuon_beta2, 0.95), written only
                                       when NORMUON is not 0, so older cases keep their bytes
    adamw_group G LR BETA1 BETA2 EPS WD [CAUTIOUS]
                                       AdamW group G (0 = desc.adamw, then muon_add_adamw_group)
    matrix E ROWS COLS COUNT STRIDE GROUP
                                       entry E of muon_add_matrix. The flat buffer holds
                                       (max(COUNT,1)-1)*S + ROWS*COLS floats, S = STRIDE or
                                       ROWS*COLS when STRIDE is 0; padding between slices must stay
                                       untouched (params) and must not be read (grads hold junk).
    arr matrix_p0 E N                  initial flat param buffer of matrix entry E
    adamw E SIZE GROUP                 entry E of muon_add_adamw_param
    arr adamw_p0 E N                   its initial param
    steps T
    then for each step t = 1..T:
    step t
    set_lr G LR                        (optional, repeated) muon_set_lr(opt, G, LR) before this step
    absent_matrix E                    (optional) muon_set_grad(opt, idx(E), NULL) for this step only
    absent_adamw E                     (optional) muon_set_adamw_grad(opt, idx(E), NULL) likewise
    arr matrix_grad E N                gradient of every present matrix entry (flat, with junk padding)
    arr adamw_grad E N                 gradient of every present AdamW entry
    arr matrix_ref E N                 reference params of every matrix entry after this step
    arr adamw_ref E N                  reference params of every AdamW entry after this step
    arr matrix_mom E N                 reference momentum buffers of every matrix entry after this
                                       step, laid out like the params (padding: zeros)
    end

Newton-Schulz cases (ns.list):
    muon-ns 1
    name TEXT...
    ns ROWS COLS NS_STEPS PRESET PRECISION EPS ALGORITHM RESTARTS
                                       PRESET as above (0 quintic, 1 Polar Express); ALGORITHM 0
                                       standard, 1 Gram (with RESTARTS, a bit per iteration)
    arr ns_in 0 N
    arr ns_out 0 N
    arr ns_polar 0 N                   (Gram cases) the exact polar factor, from an SVD
    end

NorMuon operand cases (normuon.list): one orthogonalised operand X (M x N, row-major, M <= N as
Newton-Schulz leaves it) and its second moment, through NorMuon once:
    muon-normuon 1
    name TEXT...
    normuon M N PER_COLUMN KIND BETA2  PER_COLUMN 1: one statistic per column of X (LEN = N), 0:
                                       per row (LEN = M); KIND 1 rows / 2 larger (muon_normuon:
                                       the epsilons)
    arr nm_x 0 M*N                     X before (float32 values)
    arr nm_v 0 LEN                     the second moment before (float32 values, >= 0)
    arr nm_out 0 M*N                   the reference X after
    arr nm_v_new 0 LEN                 the reference second moment after
    end
"""
import os
import sys

import numpy as np

# ----------------------------------------------------------------------------------------------
# Rounding helpers


def f32(x):
    """Round to float32, return float64 (array or python float)."""
    if np.isscalar(x):
        return float(np.float32(x))
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def bf16(x):
    """Round to bfloat16: float32 first, then round-to-nearest-even on the upper 16 bits."""
    scalar = np.isscalar(x)
    f = np.atleast_1d(np.asarray(x, dtype=np.float64)).astype(np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    r = u.astype(np.uint32).view(np.float32).astype(np.float64)
    return float(r[0]) if scalar else r.reshape(np.shape(x))


# ----------------------------------------------------------------------------------------------
# Newton-Schulz coefficients (stored as float32 by the C library)

QUINTIC = [(3.4445, -4.7750, 2.0315)]

# Polar Express, Amsel et al. 2025 (arXiv 2505.16932), Algorithm 1: every triple but the last is
# divided by (1.01, 1.01**3, 1.01**5) for safety; iterations past the 8th reuse the last.
_PE_RAW = [
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
]
POLAR_EXPRESS = [(a / 1.01, b / 1.01 ** 3, c / 1.01 ** 5) for (a, b, c) in _PE_RAW[:-1]] + [_PE_RAW[-1]]


def coefficients(preset):
    table = POLAR_EXPRESS if preset == 1 else QUINTIC  # -1 (library default) = quintic
    return [tuple(f32(v) for v in abc) for abc in table]


def normalise(X, eps, bf16_mode):
    """X / max(|X|_F, eps); in bf16 mode the input, the norm and the result rounded (torch)."""
    if bf16_mode:
        X = bf16(X)
        norm = bf16(float(np.sqrt(np.sum(X * X))))
        return bf16(X / max(norm, eps))
    return X / max(float(np.sqrt(np.sum(X * X))), eps)


def newton_schulz(U, steps, preset, eps, bf16_mode):
    """DESIGN 1.3: O = NS(U) for U (rows x cols)."""
    coeffs = coefficients(preset)
    X = np.array(U, dtype=np.float64)
    transposed = X.shape[0] > X.shape[1]
    if transposed:
        X = X.T.copy()  # X is m x n, m <= n
    X = normalise(X, eps, bf16_mode)
    for k in range(steps):
        a, b, c = coeffs[min(k, len(coeffs) - 1)]
        A = X @ X.T
        if bf16_mode:
            A = bf16(A)
        Bm = b * A + c * (A @ A)
        if bf16_mode:
            Bm = bf16(Bm)
        X = a * X + Bm @ X
        if bf16_mode:
            X = bf16(X)
    if transposed:
        X = X.T.copy()
    return X


def gram_newton_schulz(U, steps, preset, eps, bf16_mode, restarts):
    """Gram Newton-Schulz (Zhang, Amsel, Chen, Dao 2026), transcribed from the authors' reference
    (Dao-AILab/gram-newton-schulz, GramNewtonSchulz._gram_newton_schulz): the iteration
    X_{k+1} = p_k(X_k X_k^T) X_k with p_k(R) = a I + b R + c R^2 is carried on the Gram matrix:
    X_k = Q_k X_0 and R_k = X_k X_k^T (polynomials in R_0 commute), so per iteration P = p_k(R),
    Q <- P Q (the reference writes Q P: they commute), R <- P (R P) (the reference's order, never
    P^2, whose entries outgrow R's; R kept exactly symmetric, as the reference's symmetric GEMM
    leaves it), and X = Q X_0 at the end. A restart before iteration k sets X_0 = Q X_0,
    R = X_0 X_0^T, Q = I. Only for m x n operands with n >= 2m; squarer ones run the standard
    iteration (the C library's choice: Gram saves flops only there). bf16 mode rounds every
    product's output, as the standard path does."""
    X = np.array(U, dtype=np.float64)
    transposed = X.shape[0] > X.shape[1]
    m, n = (X.shape[1], X.shape[0]) if transposed else X.shape
    if n < 2 * m:
        return newton_schulz(U, steps, preset, eps, bf16_mode)
    coeffs = coefficients(preset)
    rnd = bf16 if bf16_mode else (lambda v: v)
    if transposed:
        X = X.T.copy()
    X = normalise(X, eps, bf16_mode)
    I = np.eye(m)
    R = rnd(X @ X.T)
    Q = None  # the identity
    for k in range(steps):
        a, b, c = coeffs[min(k, len(coeffs) - 1)]
        P = rnd(b * R + c * (R @ R.T) + a * I)
        Q = P if Q is None else rnd(P @ Q)
        if k + 1 == steps:
            break
        if (restarts >> (k + 1)) & 1:
            X = rnd(Q @ X)
            R = rnd(X @ X.T)
            Q = None
            continue
        R = rnd(P @ rnd(R @ P))
        R = np.tril(R) + np.tril(R, -1).T  # the lower triangle mirrored, as the reference's symmetric GEMM
    X = X if Q is None else rnd(Q @ X)
    if transposed:
        X = X.T.copy()
    return X


def polar(U):
    """The exact orthogonal polar factor U V^T of U = U S V^T."""
    u, _, vt = np.linalg.svd(np.array(U, dtype=np.float64), full_matrices=False)
    return u @ vt


# ----------------------------------------------------------------------------------------------
# NorMuon (Li et al. 2025, arXiv 2510.05491), from its definition


def normuon_axis(kind, rows, cols):
    """The axis of O (rows x cols) whose entries one statistic averages over: 1 = one statistic
    per row, 0 = one per column. ROWS (the paper's reference implementation): per row, always.
    LARGER (nanochat, modded-nanogpt): per row when rows >= cols, else per column."""
    return 1 if kind == 1 or rows >= cols else 0


def normuon(O, v, kind, beta2, axis=None):
    """NorMuon of the Newton-Schulz output O (rows x cols, the matrix itself, never an NS operand)
    with second moment v (one per row or per column, see normuon_axis; None: zeros, the first
    step). axis (1: per row, 0: per column) overrides normuon_axis's choice: the operand cases
    take every (kind, axis) pair. Returns (O'', v'):
        q_i  = mean of O^2 over statistic i's row (or column)
        v'_i = v_i + (1 - beta2)(q_i - v_i)                            (torch: v.lerp_(q, 1 - beta2))
        O'   = O * s, s_i = 1 / (sqrt(v'_i) + 1e-10)  (ROWS, the paper)
                          1 / sqrt(max(v'_i, 1e-10))  (LARGER, nanochat)
        O''  = O' * |O|_F / (|O'|_F + 1e-10)          (ROWS)
                      |O|_F / max(|O'|_F, 1e-10)      (LARGER)
    with the norms those of the actual matrices O and O' (the paper's form)."""
    O = np.asarray(O, dtype=np.float64)
    if axis is None:
        axis = normuon_axis(kind, O.shape[0], O.shape[1])
    q = np.mean(O * O, axis=axis)
    if v is None:
        v = np.zeros_like(q)
    v = v + (1.0 - beta2) * (q - v)
    if kind == 1:
        s = 1.0 / (np.sqrt(v) + 1e-10)
    else:
        s = 1.0 / np.sqrt(np.maximum(v, 1e-10))
    O1 = O * (s[:, None] if axis == 1 else s[None, :])
    n0 = float(np.sqrt(np.sum(O * O)))
    n1 = float(np.sqrt(np.sum(O1 * O1)))
    O2 = O1 * (n0 / (n1 + 1e-10) if kind == 1 else n0 / max(n1, 1e-10))
    return O2, v


# ----------------------------------------------------------------------------------------------
# One Muon update (DESIGN 1) and one AdamW update (torch.optim.AdamW, single tensor)


class MuonGroup:
    def __init__(self, lr=1e-3, wd=0.1, momentum=0.95, nesterov=1, style=0, adjust=0,
                 ns_steps=5, preset=-1, precision=0, eps=1e-7, cautious=0, normuon=0, normuon_beta2=0.95):
        self.cautious = int(cautious)
        self.normuon, self.normuon_beta2 = int(normuon), f32(normuon_beta2)
        self.lr, self.wd, self.momentum = f32(lr), f32(wd), f32(momentum)
        self.nesterov, self.style, self.adjust = int(nesterov), int(style), int(adjust)
        self.ns_steps, self.preset, self.precision, self.eps = int(ns_steps), int(preset), int(precision), f32(eps)

    def line(self, g):
        s = "group %d %r %r %r %d %d %d %d %d %d %r %d" % (
            g, self.lr, self.wd, self.momentum, self.nesterov, self.style, self.adjust,
            self.ns_steps, self.preset, self.precision, self.eps, self.cautious)
        if self.normuon:
            s += " %d %r" % (self.normuon, self.normuon_beta2)
        return s


class AdamWGroup:
    def __init__(self, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.01, cautious=0):
        self.lr, self.beta1, self.beta2, self.eps, self.wd = f32(lr), f32(beta1), f32(beta2), f32(eps), f32(wd)
        self.cautious = int(cautious)

    def line(self, g):
        return "adamw_group %d %r %r %r %r %r %d" % (g, self.lr, self.beta1, self.beta2, self.eps, self.wd, self.cautious)


def muon_update(W, G, B, hp, V=None):
    """Returns (W', B', V') for one matrix W (rows x cols), gradient G, momentum B and NorMuon
    second moment V (None before the first step; stays None without NorMuon)."""
    mu = hp.momentum
    if hp.style == 0:  # torch: buf.lerp_(grad, 1 - mu); grad.lerp_(buf, mu)
        B = B + (1.0 - mu) * (G - B)
        U = G + mu * (B - G) if hp.nesterov else B
    else:  # SGD style (Moonlight, Dion)
        B = mu * B + G
        U = G + mu * B if hp.nesterov else B
    O = newton_schulz(U, hp.ns_steps, hp.preset, hp.eps, hp.precision == 1)
    if hp.normuon:
        O, V = normuon(O, V, hp.normuon, hp.normuon_beta2)
    rows, cols = W.shape
    if hp.adjust == 0:
        adj = hp.lr * np.sqrt(max(1.0, rows / cols))
    elif hp.adjust == 1:
        adj = hp.lr * 0.2 * np.sqrt(max(rows, cols))
    else:
        adj = hp.lr
    # Cautious weight decay (dion's cautious_wd): decay only where W and the step direction O
    # agree in sign, a zero agreeing with both. float32 values multiplied in float64 cannot
    # underflow, so the product's sign is the sign test.
    decay = W * (1.0 - hp.lr * hp.wd)
    W = np.where(W * O >= 0, decay, W) if hp.cautious else decay
    W = W - adj * O
    return W, B, V


def adamw_update(p, g, m, v, step, hp):
    m = m + (1.0 - hp.beta1) * (g - m)
    v = hp.beta2 * v + (1.0 - hp.beta2) * g * g
    step += 1
    bc1 = 1.0 - hp.beta1 ** step
    bc2 = 1.0 - hp.beta2 ** step
    u = m / (np.sqrt(v) / np.sqrt(bc2) + hp.eps)   # the update's direction; its sign is m's
    decay = p * (1.0 - hp.lr * hp.wd)
    p = np.where(p * u >= 0, decay, p) if hp.cautious else decay   # cautious: as for Muon
    p = p - (hp.lr / bc1) * u
    return p, m, v, step


# ----------------------------------------------------------------------------------------------
# Case writer


class Writer:
    def __init__(self, path):
        self.f = open(path, "wb")

    def line(self, s):
        self.f.write((s + "\n").encode("ascii"))

    def arr(self, kind, entry, a):
        a = np.ascontiguousarray(np.asarray(a, dtype=np.float64).ravel())
        self.line("arr %s %d %d" % (kind, entry, a.size))
        self.f.write(a.astype("<f8").tobytes())

    def close(self):
        self.f.close()


PARAM_PAD = 555.0    # params between stacked slices: must stay exactly this
GRAD_PAD = 12345.0   # grads between stacked slices: junk that must never be read


class StepCase:
    def __init__(self, name, seed, steps, groups=None, adamw_groups=None, defaults=0, param_scale=0.1):
        self.name, self.steps, self.defaults = name, steps, defaults
        self.rng = np.random.default_rng(seed)
        self.groups = groups or [MuonGroup()]
        self.adamw_groups = adamw_groups or [AdamWGroup()]
        self.param_scale = param_scale
        self.matrices, self.adamws = [], []
        self.set_lr = {}          # step -> [(group, lr)]
        self.absent_matrix = {}   # step -> [entry]
        self.absent_adamw = {}    # step -> [entry]

    def matrix(self, rows, cols, count=0, stride=0, group=0):
        n = max(count, 1)
        s = stride if stride else rows * cols
        flat = np.full((n - 1) * s + rows * cols, PARAM_PAD)
        for k in range(n):
            flat[k * s:k * s + rows * cols] = f32(self.rng.standard_normal(rows * cols) * self.param_scale)
        self.matrices.append(dict(rows=rows, cols=cols, count=count, stride=stride, s=s, n=n, group=group,
                                  p=flat, p0=flat.copy(), B=[np.zeros((rows, cols)) for _ in range(n)],
                                  V=[None] * n))

    def adamw(self, size, group=0, grad_scale=1.0):
        p = f32(self.rng.standard_normal(size) * self.param_scale)
        self.adamws.append(dict(size=size, group=group, p=p, p0=p.copy(), m=np.zeros(size), v=np.zeros(size), step=0,
                                grad_scale=grad_scale))

    def write(self, path):
        w = Writer(path)
        w.line("muon-golden 1")
        w.line("name " + self.name)
        w.line("defaults %d" % self.defaults)
        for g, hp in enumerate(self.groups):
            w.line(hp.line(g))
        for g, hp in enumerate(self.adamw_groups):
            w.line(hp.line(g))
        for e, m in enumerate(self.matrices):
            w.line("matrix %d %d %d %d %d %d" % (e, m["rows"], m["cols"], m["count"], m["stride"], m["group"]))
            w.arr("matrix_p0", e, m["p0"])
        for e, a in enumerate(self.adamws):
            w.line("adamw %d %d %d" % (e, a["size"], a["group"]))
            w.arr("adamw_p0", e, a["p0"])
        w.line("steps %d" % self.steps)
        for t in range(1, self.steps + 1):
            w.line("step %d" % t)
            for g, lr in self.set_lr.get(t, []):
                self.groups[g].lr = f32(lr)
                w.line("set_lr %d %r" % (g, self.groups[g].lr))
            absent_m = self.absent_matrix.get(t, [])
            absent_a = self.absent_adamw.get(t, [])
            for e in absent_m:
                w.line("absent_matrix %d" % e)
            for e in absent_a:
                w.line("absent_adamw %d" % e)
            # Fresh gradients; the scale varies per matrix and step so normalisation matters.
            for e, m in enumerate(self.matrices):
                if e in absent_m:
                    continue
                rows, cols, s = m["rows"], m["cols"], m["s"]
                scale = float(np.exp(self.rng.uniform(-2.0, 2.0)))
                g = np.full(m["p"].size, GRAD_PAD)
                for k in range(m["n"]):
                    g[k * s:k * s + rows * cols] = f32(self.rng.standard_normal(rows * cols) * scale)
                w.arr("matrix_grad", e, g)
                hp = self.groups[m["group"]]
                for k in range(m["n"]):
                    W = m["p"][k * s:k * s + rows * cols].reshape(rows, cols)
                    G = g[k * s:k * s + rows * cols].reshape(rows, cols)
                    W2, m["B"][k], m["V"][k] = muon_update(W, G, m["B"][k], hp, m["V"][k])
                    m["p"][k * s:k * s + rows * cols] = W2.ravel()
            for e, a in enumerate(self.adamws):
                if e in absent_a:
                    continue
                g = f32(self.rng.standard_normal(a["size"]) * a["grad_scale"] *
                        float(np.exp(self.rng.uniform(-2.0, 1.0))))
                w.arr("adamw_grad", e, g)
                a["p"], a["m"], a["v"], a["step"] = adamw_update(a["p"], g, a["m"], a["v"], a["step"],
                                                                 self.adamw_groups[a["group"]])
            for e, m in enumerate(self.matrices):
                w.arr("matrix_ref", e, m["p"])
            for e, a in enumerate(self.adamws):
                w.arr("adamw_ref", e, a["p"])
            for e, m in enumerate(self.matrices):
                mom = np.zeros(m["p"].size)
                for k in range(m["n"]):
                    mom[k * m["s"]:k * m["s"] + m["rows"] * m["cols"]] = m["B"][k].ravel()
                w.arr("matrix_mom", e, mom)
            w.line("end")
        w.close()


def write_ns_case(path, name, seed, rows, cols, steps=5, preset=0, precision=0, eps=1e-7, scale=1.0, zero=False,
                  algorithm=0, restarts=4, cond=None):
    rng = np.random.default_rng(seed)
    X = np.zeros((rows, cols)) if zero else f32(rng.standard_normal((rows, cols)) * scale)
    if cond:   # singular values spread log-evenly over [1/cond, 1]: U diag(s) V^T
        k = min(rows, cols)
        U, _ = np.linalg.qr(rng.standard_normal((rows, k)))
        V, _ = np.linalg.qr(rng.standard_normal((cols, k)))
        X = f32((U * np.logspace(0, -np.log10(cond), k)) @ V.T)
    if algorithm == 1:
        O = gram_newton_schulz(X, steps, preset, f32(eps), precision == 1, restarts)
    else:
        O = newton_schulz(X, steps, preset, f32(eps), precision == 1)
    w = Writer(path)
    w.line("muon-ns 1")
    w.line("name " + name)
    w.line("ns %d %d %d %d %d %r %d %d" % (rows, cols, steps, preset, precision, f32(eps), algorithm, restarts))
    if cond:   # NS lifts the small singular values ~1e4-fold, and fp32's rounding with them: 4.1e-5
        w.line("tol 2e-4")   # measured; Polar Express's safety factor misplaced on the last triple: 2.9e-3
    w.arr("ns_in", 0, X)
    w.arr("ns_out", 0, O)
    if algorithm == 1:
        w.arr("ns_polar", 0, polar(X))
    w.line("end")
    w.close()


def write_normuon_case(path, name, seed, m, n, per_column, kind, beta2=0.95, v0="zero", tiny=None, scale=1.0):
    """One NS operand X (m x n, m <= n) through NorMuon once. Rows and columns get different scales
    so the statistics differ; v0 "zero" (a first step) or "random" (positive, around the q's).
    tiny: "row" or "col" makes statistic 0's row (or column) 1e-9 times smaller, so the epsilons
    matter there; scale multiplies the whole operand (a tiny one: the norm's epsilon too)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((m, n)) * np.exp(rng.uniform(-1.0, 1.0, (m, 1))) * np.exp(rng.uniform(-1.0, 1.0, (1, n)))
    X = X / np.sqrt(np.mean(X * X)) / np.sqrt(n)   # about the size of an NS output
    if tiny == "row":
        X[0, :] *= 1e-9
    elif tiny == "col":
        X[:, 0] *= 1e-9
    X = f32(X * scale)
    axis = 0 if per_column else 1
    length = n if per_column else m
    if v0 == "zero":
        v = np.zeros(length)
    else:
        q = np.mean(X * X, axis=axis)
        v = f32(q * np.exp(rng.uniform(-1.5, 1.5, length)))
    beta2 = f32(beta2)
    out, v_new = normuon(X, v, kind, beta2, axis=axis)
    w = Writer(path)
    w.line("muon-normuon 1")
    w.line("name " + name)
    w.line("normuon %d %d %d %d %r" % (m, n, per_column, kind, beta2))
    w.arr("nm_x", 0, X)
    w.arr("nm_v", 0, v)
    w.arr("nm_out", 0, out)
    w.arr("nm_v_new", 0, v_new)
    w.line("end")
    w.close()


# ----------------------------------------------------------------------------------------------
# The cases


def step_cases():
    C = []

    c = StepCase("defaults (torch Muon + AdamW defaults, 32x48 + adamw 50)", 1, 4, defaults=1)
    c.matrix(32, 48)
    c.adamw(50)
    C.append(c)

    c = StepCase("nesterov off (40x40, lr 0.02)", 2, 4, [MuonGroup(lr=0.02, nesterov=0)])
    c.matrix(40, 40)
    C.append(c)

    c = StepCase("weight decay 0 (24x56, lr 0.02)", 3, 4, [MuonGroup(lr=0.02, wd=0.0)])
    c.matrix(24, 56)
    C.append(c)

    c = StepCase("weight decay 0.1 (24x56, lr 0.05)", 4, 4, [MuonGroup(lr=0.05, wd=0.1)])
    c.matrix(24, 56)
    C.append(c)

    c = StepCase("cautious weight decay 0.1 (24x56 and 56x24, lr 0.05)", 52, 4, [MuonGroup(lr=0.05, wd=0.1, cautious=1)])
    c.matrix(24, 56)
    c.matrix(56, 24)
    C.append(c)

    c = StepCase("cautious AdamW weight decay next to plain AdamW (wd 0.1 lr 0.01) + cautious Muon 20x30", 53, 4,
                 [MuonGroup(lr=0.02, wd=0.2, cautious=1)],
                 [AdamWGroup(lr=0.01, wd=0.1, cautious=1), AdamWGroup(lr=0.01, wd=0.1)])
    c.matrix(20, 30)
    c.adamw(64, group=0)
    c.adamw(64, group=1)
    C.append(c)

    c = StepCase("adjust_lr original (72x24 and 24x72, lr 0.02)", 5, 3, [MuonGroup(lr=0.02, adjust=0)])
    c.matrix(72, 24)
    c.matrix(24, 72)
    C.append(c)

    c = StepCase("adjust_lr match_rms_adamw (72x24 and 48x96, lr 0.02)", 6, 3, [MuonGroup(lr=0.02, adjust=1)])
    c.matrix(72, 24)
    c.matrix(48, 96)
    C.append(c)

    c = StepCase("adjust_lr none (72x24 and 24x72, lr 0.02)", 7, 3, [MuonGroup(lr=0.02, adjust=2)])
    c.matrix(72, 24)
    c.matrix(24, 72)
    C.append(c)

    c = StepCase("SGD-style momentum, nesterov on (36x60, lr 0.02, mu 0.9)", 8, 4,
                 [MuonGroup(lr=0.02, momentum=0.9, style=1, nesterov=1)])
    c.matrix(36, 60)
    C.append(c)

    c = StepCase("SGD-style momentum, nesterov off (60x36, lr 0.02, mu 0.9)", 9, 4,
                 [MuonGroup(lr=0.02, momentum=0.9, style=1, nesterov=0)])
    c.matrix(60, 36)
    C.append(c)

    c = StepCase("preset quintic explicitly (64x64, lr 0.02)", 10, 3, [MuonGroup(lr=0.02, preset=0)])
    c.matrix(64, 64)
    C.append(c)

    c = StepCase("preset Polar Express, 5 NS steps (64x96 and 80x40, lr 0.02)", 11, 3,
                 [MuonGroup(lr=0.02, preset=1, ns_steps=5)])
    c.matrix(64, 96)
    c.matrix(80, 40)
    C.append(c)

    c = StepCase("preset Polar Express, 10 NS steps (past the 8th: last triple) (40x72)", 12, 3,
                 [MuonGroup(lr=0.02, preset=1, ns_steps=10)])
    c.matrix(40, 72)
    C.append(c)

    for i, (r, cc, label) in enumerate([(50, 50, "square"), (30, 90, "wide"), (90, 30, "tall"),
                                        (1, 37, "1 x n"), (45, 1, "n x 1"), (1, 1, "1 x 1"),
                                        (96, 200, "largest wide"), (200, 96, "largest tall")]):
        c = StepCase("shape %s %dx%d (lr 0.02)" % (label, r, cc), 20 + i, 3, [MuonGroup(lr=0.02)])
        c.matrix(r, cc)
        C.append(c)

    c = StepCase("stacked count=3 (20x30, stride 650: padding between slices)", 30, 4, [MuonGroup(lr=0.02)])
    c.matrix(20, 30, count=3, stride=650)
    C.append(c)

    c = StepCase("stacked count=2 (16x40, stride 0) + stacked tall count=2 (40x16, stride 700)", 31, 4,
                 [MuonGroup(lr=0.02)])
    c.matrix(16, 40, count=2, stride=0)
    c.matrix(40, 16, count=2, stride=700)
    C.append(c)

    c = StepCase("two param groups (lr 0.02 mu 0.95 / lr 0.005 mu 0.8 nesterov off wd 0)", 32, 4,
                 [MuonGroup(lr=0.02, momentum=0.95), MuonGroup(lr=0.005, momentum=0.8, nesterov=0, wd=0.0)])
    c.matrix(32, 64, group=0)
    c.matrix(48, 24, group=1)
    c.matrix(32, 64, group=1)
    C.append(c)

    c = StepCase("10 steps, muon_set_lr 0.02 -> 0.004 after step 5 (two groups, 40x56 + 56x40)", 33, 10,
                 [MuonGroup(lr=0.02), MuonGroup(lr=0.01, momentum=0.9)])
    c.matrix(40, 56, group=0)
    c.matrix(56, 40, group=1)
    c.set_lr[6] = [(0, 0.004), (1, 0.03)]
    C.append(c)

    for i, (r, cc) in enumerate([(48, 48), (32, 96), (96, 32), (1, 40)]):
        c = StepCase("bf16 NS %dx%d (lr 0.02)" % (r, cc), 40 + i, 3, [MuonGroup(lr=0.02, precision=1)])
        c.matrix(r, cc)
        C.append(c)

    c = StepCase("bf16 NS Polar Express 40x72 + SGD momentum (lr 0.02)", 45, 3,
                 [MuonGroup(lr=0.02, precision=1, preset=1, style=1, momentum=0.9)])
    c.matrix(40, 72)
    C.append(c)

    c = StepCase("AdamW default + non-default group in the same step as Muon (30x50)", 50, 4,
                 [MuonGroup(lr=0.02)],
                 [AdamWGroup(), AdamWGroup(lr=0.003, beta1=0.8, beta2=0.99, eps=1e-6, wd=0.1)])
    c.matrix(30, 50)
    c.adamw(64, group=0)
    c.adamw(17, group=1)
    c.adamw(1, group=1)
    C.append(c)

    c = StepCase("AdamW non-default desc.adamw (lr 0.01 b 0.85/0.98 eps 1e-7 wd 0.05) + Muon 20x20", 51, 5,
                 [MuonGroup(lr=0.02)], [AdamWGroup(lr=0.01, beta1=0.85, beta2=0.98, eps=1e-7, wd=0.05)])
    c.matrix(20, 20)
    c.adamw(100)
    c.adamw(3)
    C.append(c)

    c = StepCase("AdamW tiny gradients (~1e-8: eps 1e-8 matters) + Muon 16x24", 52, 4, [MuonGroup(lr=0.02)],
                 [AdamWGroup(lr=0.01)])
    c.matrix(16, 24)
    c.adamw(40, grad_scale=1e-8)
    C.append(c)

    c = StepCase("absent grad: matrix 1 skipped at step 2 (no decay, no momentum change)", 60, 4,
                 [MuonGroup(lr=0.02, wd=0.1)])
    c.matrix(24, 40)
    c.matrix(40, 24)
    c.matrix(16, 16)
    c.absent_matrix[2] = [1]
    c.absent_matrix[3] = [2]
    C.append(c)

    c = StepCase("absent grad: AdamW param 0 skipped at step 2 (its step count does not advance)", 61, 4,
                 [MuonGroup(lr=0.02)], [AdamWGroup(lr=0.01, wd=0.1)])
    c.matrix(24, 40)
    c.adamw(30)
    c.adamw(12)
    c.absent_adamw[2] = [0]
    C.append(c)

    # NorMuon (normuon 1 rows: the paper's reference; 2 larger: nanochat), 5 steps each so the
    # second moment accumulates; the shapes put the statistics on the NS operand's rows and
    # columns (tall matrices are transposed there).
    kinds = [(1, "rows"), (2, "larger")]
    for ki, (kind, kname) in enumerate(kinds):
        for i, (r, cc, label) in enumerate([(32, 32, "square"), (48, 20, "tall"), (20, 48, "wide"),
                                            (1, 40, "1 x n"), (40, 1, "n x 1")]):
            c = StepCase("NorMuon %s, %s %dx%d (beta2 0.95, lr 0.02, 5 steps)" % (kname, label, r, cc),
                         200 + 10 * ki + i, 5, [MuonGroup(lr=0.02, normuon=kind)])
            c.matrix(r, cc)
            C.append(c)

    for ki, (kind, kname) in enumerate(kinds):
        c = StepCase("NorMuon %s beta2 0.5 + cautious weight decay 0.1 (24x40 and 40x24, lr 0.05, 5 steps)" % kname,
                     220 + ki, 5, [MuonGroup(lr=0.05, wd=0.1, cautious=1, normuon=kind, normuon_beta2=0.5)])
        c.matrix(24, 40)
        c.matrix(40, 24)
        C.append(c)

    c = StepCase("NorMuon absent grads: rows / larger / off groups, matrices skipped at steps 2 and 3 (6 steps)",
                 230, 6, [MuonGroup(lr=0.02, normuon=1), MuonGroup(lr=0.02, normuon=2, normuon_beta2=0.9),
                          MuonGroup(lr=0.02)])
    c.matrix(24, 40, group=0)
    c.matrix(40, 24, group=1)
    c.matrix(16, 16, group=2)
    c.matrix(40, 24, group=0)
    c.absent_matrix[2] = [0, 1]
    c.absent_matrix[3] = [1, 2]
    C.append(c)

    c = StepCase("NorMuon + Polar Express 5 NS steps (rows 80x48, larger 48x80 and 80x48, lr 0.02, 4 steps)", 231, 4,
                 [MuonGroup(lr=0.02, preset=1, normuon=1), MuonGroup(lr=0.02, preset=1, normuon=2)])
    c.matrix(80, 48, group=0)
    c.matrix(48, 80, group=1)
    c.matrix(80, 48, group=1)
    C.append(c)

    c = StepCase("NorMuon stacked (rows 16x40 count=3 stride 700; larger 40x16 count=2, SGD momentum), 4 steps", 232,
                 4, [MuonGroup(lr=0.02, normuon=1), MuonGroup(lr=0.02, momentum=0.9, style=1, normuon=2)])
    c.matrix(16, 40, count=3, stride=700, group=0)
    c.matrix(40, 16, count=2, stride=0, group=1)
    C.append(c)

    return C


def normuon_cases():
    C = []
    seed = 300
    for kind, kname in [(1, "rows"), (2, "larger")]:
        for per_column in (0, 1):
            where = "per column" if per_column else "per row"
            for (m, n, beta2, v0) in [(1, 40, 0.95, "zero"), (20, 48, 0.95, "random"), (32, 32, 0.5, "random"),
                                      (17, 300, 0.9, "random"), (24, 24, 0.0, "zero")]:
                C.append(dict(name="NorMuon operand %s %s %dx%d beta2 %g v0 %s" % (kname, where, m, n, beta2, v0),
                              seed=seed, m=m, n=n, per_column=per_column, kind=kind, beta2=beta2, v0=v0))
                seed += 1
            C.append(dict(name="NorMuon operand %s %s 20x48, one statistic 1e-9 smaller (epsilon)" % (kname, where),
                          seed=seed, m=20, n=48, per_column=per_column, kind=kind, v0="zero",
                          tiny="col" if per_column else "row"))
            seed += 1
        # q ~ 1e-36 (still a normal float): rows: s ~ 1/1e-10 for every row, and |O'| ~ 5e-7 is
        # within 2e-4 of its epsilon; larger: v clamps to 1e-10 and |O'| ~ 5e-12 to 1e-10.
        C.append(dict(name="NorMuon operand %s per row 20x48 scaled by 1e-17 (the epsilons decide)" % kname,
                      seed=seed, m=20, n=48, per_column=0, kind=kind, beta2=0.5, v0="zero", scale=1e-17))
        seed += 1
        C.append(dict(name="NorMuon operand %s per column 20x48 all zero" % kname, seed=seed, m=20, n=48,
                      per_column=1, kind=kind, v0="zero", scale=0.0))
        seed += 1
    return C


def ns_cases():
    C = []
    for i, (r, c) in enumerate([(1, 1), (1, 17), (17, 1), (33, 33), (64, 200), (200, 64), (257, 129)]):
        C.append(dict(name="NS quintic %dx%d" % (r, c), seed=100 + i, rows=r, cols=c))
    C.append(dict(name="NS quintic 33x33 scaled by 1e3", seed=110, rows=33, cols=33, scale=1e3))
    C.append(dict(name="NS quintic 20x12 scaled by 1e-3", seed=111, rows=20, cols=12, scale=1e-3))
    C.append(dict(name="NS zero 8x12 (norm below eps)", seed=112, rows=8, cols=12, zero=True))
    C.append(dict(name="NS quintic 3 steps 50x30", seed=113, rows=50, cols=30, steps=3))
    C.append(dict(name="NS Polar Express 5 steps 48x80", seed=114, rows=48, cols=80, preset=1))
    C.append(dict(name="NS Polar Express 10 steps 80x48", seed=115, rows=80, cols=48, preset=1, steps=10))
    # Ill-conditioned (singular values 1 .. 1e-4): the small ones climb through every iteration,
    # so a wrong triple at iteration 9 or later (e.g. the safety factor on the last one) shows.
    C.append(dict(name="NS Polar Express 10 steps 60x40, condition 1e4", seed=119, rows=60, cols=40, preset=1, steps=10,
                  cond=1e4))
    C.append(dict(name="NS bf16 quintic 64x96", seed=116, rows=64, cols=96, precision=1))
    C.append(dict(name="NS bf16 quintic 96x64", seed=117, rows=96, cols=64, precision=1))
    C.append(dict(name="NS bf16 Polar Express 33x33", seed=118, rows=33, cols=33, precision=1, preset=1))
    # Real layer sizes: m*n >= 98,304 floats, so the built-in GEMM takes its packed path (without
    # and with partial tail panels).
    C.append(dict(name="NS quintic 256x384 (packed GEMM)", seed=130, rows=256, cols=384))
    C.append(dict(name="NS quintic 384x256 (packed GEMM)", seed=131, rows=384, cols=256))
    C.append(dict(name="NS quintic 257x400 (packed, tail panels)", seed=132, rows=257, cols=400))
    C.append(dict(name="NS quintic 400x257 (packed, tail panels)", seed=133, rows=400, cols=257))
    # Gram Newton-Schulz: default restart (iteration 2), none, two; tall and wide; both schedules;
    # bf16; a squarer operand (runs the standard iteration)
    C.append(dict(name="NS Gram 64x200 (restart at 2)", seed=120, rows=64, cols=200, algorithm=1))
    C.append(dict(name="NS Gram 200x64 (restart at 2)", seed=121, rows=200, cols=64, algorithm=1))
    C.append(dict(name="NS Gram 48x128 no restart", seed=122, rows=48, cols=128, algorithm=1, restarts=0))
    C.append(dict(name="NS Gram Polar Express 10 steps 40x120 (restarts 2, 6)", seed=123, rows=40, cols=120,
                  algorithm=1, preset=1, steps=10, restarts=(1 << 2) | (1 << 6)))
    C.append(dict(name="NS Gram bf16 64x160 (restart at 2)", seed=124, rows=64, cols=160, algorithm=1, precision=1))
    C.append(dict(name="NS Gram bf16 64x160 no restart", seed=124, rows=64, cols=160, algorithm=1, precision=1,
                  restarts=0))
    # Without restarts, Polar Express: its first triple (8.3, -23.6, 17.3) makes P's entries large,
    # and P^2 R (the order before) lost 1.5e-4 to 3.5e-4 of fp32 where P (R P) loses 2.6e-6 (measured)
    for i, (r, c) in enumerate([(128, 32), (32, 128), (48, 128), (64, 256), (200, 40), (24, 384)]):
        C.append(dict(name="NS Gram Polar Express %dx%d no restart" % (r, c), seed=140 + i, rows=r, cols=c,
                      algorithm=1, preset=1, restarts=0))
    C.append(dict(name="NS Gram 1x40 (a row)", seed=125, rows=1, cols=40, algorithm=1))
    C.append(dict(name="NS Gram 50x60 (squarer: the standard iteration)", seed=126, rows=50, cols=60, algorithm=1))
    return C


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: %s OUTDIR\n" % sys.argv[0])
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    names = []
    for i, c in enumerate(step_cases()):
        fn = "step_%02d.case" % i
        c.write(os.path.join(out, fn))
        names.append(fn)
    with open(os.path.join(out, "golden.list"), "w") as f:
        f.write("".join(n + "\n" for n in names))
    names = []
    for i, c in enumerate(ns_cases()):
        fn = "ns_%02d.case" % i
        kw = dict(c)
        name, seed, rows, cols = kw.pop("name"), kw.pop("seed"), kw.pop("rows"), kw.pop("cols")
        write_ns_case(os.path.join(out, fn), name, seed, rows, cols, **kw)
        names.append(fn)
    with open(os.path.join(out, "ns.list"), "w") as f:
        f.write("".join(n + "\n" for n in names))
    names = []
    for i, c in enumerate(normuon_cases()):
        fn = "normuon_%02d.case" % i
        kw = dict(c)
        name, seed = kw.pop("name"), kw.pop("seed")
        write_normuon_case(os.path.join(out, fn), name, seed, **kw)
        names.append(fn)
    with open(os.path.join(out, "normuon.list"), "w") as f:
        f.write("".join(n + "\n" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
