#!/usr/bin/python3
"""ref_qk_clip.py - a numpy reference of Kimi K2's QK-clip (MuonClip) for tests/test_clip.c.

Usage:  /usr/bin/python3 tests/ref_qk_clip.py OUTFILE      (Debian's python3-numpy)

Written from the rule (Kimi K2 report, arXiv 2507.20534, section 2.1), not from muon.h:
for each attention head h, S_h is the largest pre-softmax logit q_i . k_j / sqrt(d) over the
tokens (causal: j <= i); where S_h > tau, gamma_h = tau / S_h, the head's query rows are
multiplied by gamma_h^alpha and its key rows by gamma_h^(1 - alpha). Grouped-query attention
(muon's documented rule): query head h uses key head h // (H / KV); a key head scales by
(tau / G)^(1 - alpha), G the largest S of the query heads sharing it. The factor is computed in
float64 and rounded to float32; the weights are float32 and multiplied in float32 (one rounding),
so the C side must match bit for bit. After the clip every head's largest logit (float64, from
the float32 weights) is at most tau (1 + 1e-6): asserted here.

OUTFILE, little-endian: b"QKCL" | u32 version 1 | u32 cases, then per case:
    u32 T, C, H, KV, D, fused      (fused: one 3C x C matrix, rows q | k | v; else Wq (H*D x C)
                                    then Wk (KV*D x C))
    f32 tau, alpha
    f32 X (T x C), W (the matrices, row-major), S (H: the max logits, float64 rounded to float32),
        W' (the clipped matrices), S' (H: the max logits after, float64 rounded to float32)
"""
import struct
import sys

import numpy as np


def attention_max(X, Wq, Wk, H, KV, D):
    """Largest causal logit per query head, float64."""
    T = X.shape[0]
    q = X.astype(np.float64) @ Wq.astype(np.float64).T          # (T, H*D)
    k = X.astype(np.float64) @ Wk.astype(np.float64).T          # (T, KV*D)
    G = H // KV
    mask = np.tril(np.ones((T, T), dtype=bool))
    out = np.empty(H)
    for h in range(H):
        j = h // G
        s = q[:, h * D:(h + 1) * D] @ k[:, j * D:(j + 1) * D].T / np.sqrt(D)
        out[h] = s[mask].max()
    return out


def clip(Wq, Wk, S, tau, alpha, H, KV, D):
    Wq, Wk = Wq.copy(), Wk.copy()
    G = H // KV
    t = np.float64(tau)
    for j in range(KV):
        g = max(S[j * G:(j + 1) * G])
        if g > tau:
            f = np.float32(np.power(t / np.float64(g), 1.0 - np.float64(alpha)))
            Wk[j * D:(j + 1) * D] = Wk[j * D:(j + 1) * D] * f
    for h in range(H):
        if S[h] > tau:
            f = np.float32(np.power(t / np.float64(S[h]), np.float64(alpha)))
            Wq[h * D:(h + 1) * D] = Wq[h * D:(h + 1) * D] * f
    return Wq, Wk


def case(rng, T, C, H, KV, D, fused, alpha):
    X = rng.standard_normal((T, C)).astype(np.float32)
    # Heads of very different sizes: some far over tau, some under it.
    Wq = (rng.standard_normal((H * D, C)) * 0.6).astype(np.float32)
    Wk = (rng.standard_normal((KV * D, C)) * 0.6).astype(np.float32)
    for h in range(H):
        Wq[h * D:(h + 1) * D] *= np.float32(0.4 + 0.6 * h)
    Wv = rng.standard_normal((H * D, C)).astype(np.float32) if fused else None
    S = attention_max(X, Wq, Wk, H, KV, D).astype(np.float32)
    tau = np.float32(np.median(S.astype(np.float64)))   # about half the heads over it
    assert (S > tau).any() and (S <= tau).any()
    Wq2, Wk2 = clip(Wq, Wk, S, tau, alpha, H, KV, D)
    S2 = attention_max(X, Wq2, Wk2, H, KV, D)
    assert (S2 <= np.float64(tau) * (1 + 1e-6)).all(), (S2, tau)
    for h in range(H):   # a head under tau whose key head was not scaled keeps its logits
        if S[h] <= tau and max(S[(h // (H // KV)) * (H // KV):(h // (H // KV) + 1) * (H // KV)]) <= tau:
            assert S2[h].astype(np.float32) == S[h]
    W = np.concatenate([Wq, Wk, Wv]) if fused else np.concatenate([Wq, Wk])
    W2 = np.concatenate([Wq2, Wk2, Wv]) if fused else np.concatenate([Wq2, Wk2])
    out = struct.pack("<6I", T, C, H, KV, D, fused) + struct.pack("<2f", tau, alpha)
    for a in (X, W, S, W2, S2.astype(np.float32)):
        out += np.ascontiguousarray(a, dtype="<f4").tobytes()
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ref_qk_clip.py OUTFILE")
    rng = np.random.default_rng(29)
    cases = [
        case(rng, 6, 16, 4, 4, 4, 0, np.float32(0.5)),    # MHA, separate Q and K
        case(rng, 7, 16, 4, 2, 4, 0, np.float32(0.3)),    # GQA: 2 query heads per key head
        case(rng, 5, 16, 4, 4, 4, 1, np.float32(0.5)),    # fused q|k|v, llm.c's qkvw
        case(rng, 6, 24, 6, 1, 4, 0, np.float32(0.75)),   # MQA: one key head
    ]
    with open(sys.argv[1], "wb") as f:
        f.write(b"QKCL" + struct.pack("<2I", 1, len(cases)))
        for c in cases:
            f.write(c)


if __name__ == "__main__":
    main()
