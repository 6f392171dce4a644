"""How much of a per-group eigenbasis (Karhunen-Loeve) a cheaper structure keeps: the error at a
given rate of each transform on a real session's K/V (docs/lab/kl.md).

    tqkv llama import STATE --store S --session s --codec fp16 --head-dim D
    tqkv decompress S/s.tqkv kv.safetensors --dtype f32
    python3 lab/kl_basis_study.py kv.safetensors --rates 2,2.5

Per group (layer, K or V, KV head; every 4th... layer as --layer-step says), keys with their mean
removed per 128 tokens as the checkpoint does, each vector split into its norm and the unit vector
u, then u coded at R index bits per value (norms not counted) by:
  tq        a random rotation, R bits on every coordinate (TurboQuant; integer R only)
  diag      each channel scaled by its own mean and deviation, bits by reverse water-filling
  diag+rot  diag's bits, channels of equal bits rotated together (what kl:B does)
  klt       the group's eigenbasis, bits by reverse water-filling on its eigenvalues
  blk32     eigenbases of 32 consecutive channels; rope32 of 16 + their RoPE partners
  hhK       the top K eigenvectors (K Householder reflections) then diag on the rest
Each with Gaussian Lloyd-Max quantizers; the error is sum |x - x^|^2 / sum |x - mean|^2 (the
guard's relative error). Needs numpy only. A dense eigenbasis costs 16 * head_dim / N bits per
value to store in f16 (not counted here).
"""
import argparse
import json
import struct

import numpy as np


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        dt = {"F16": np.float16, "F32": np.float32}[v["dtype"]]
        out[k] = np.frombuffer(data[b:e], dtype=dt).reshape(v["shape"]).astype(np.float64)
    return out


def lloyd_max(bits, iters=200):
    g = np.linspace(-8, 8, 200001)
    w = np.exp(-g * g / 2)
    w /= w.sum()
    c = np.quantile(np.random.default_rng(0).standard_normal(200000),
                    (np.arange(2 ** bits) + 0.5) / 2 ** bits)
    for _ in range(iters):
        idx = np.searchsorted((c[1:] + c[:-1]) / 2, g)
        c = np.bincount(idx, w * g, 2 ** bits) / np.maximum(np.bincount(idx, w, 2 ** bits), 1e-300)
    idx = np.searchsorted((c[1:] + c[:-1]) / 2, g)
    return c, float((w * (g - c[idx]) ** 2).sum())


CB = {b: lloyd_max(b) for b in range(1, 9)}
D = [1.0] + [CB[b][1] for b in range(1, 9)]


def quant(z, bits):
    if bits == 0:
        return np.zeros_like(z)
    c = CB[bits][0]
    return c[np.searchsorted((c[1:] + c[:-1]) / 2, z)]


def water_fill(var, total):
    bits = np.zeros(len(var), int)
    gain = var * (D[0] - D[1])
    for _ in range(int(total)):
        j = int(np.argmax(gain))
        bits[j] += 1
        gain[j] = var[j] * (D[bits[j]] - D[bits[j] + 1]) if bits[j] < 8 else -1
    return bits


def haar(m, rng):
    q, r = np.linalg.qr(rng.standard_normal((m, m)))
    return q * np.sign(np.diag(r))


def key_means(x, block=128):
    r = x.copy()
    for s in range(0, len(x), block):
        mu = x[s:s + block].mean(0)
        mm = mu @ mu
        if mm > 0:
            r[s:s + block] -= np.outer(x[s:s + block] @ mu / mm, mu)
    return r


def code_in_basis(u, basis, rate):
    """u coded in an orthonormal basis (columns), bits by water-filling on the variances."""
    y = u @ basis
    mu = y.mean(0)
    sd = np.sqrt(np.maximum(((y - mu) ** 2).mean(0), 1e-30))
    bits = water_fill(sd ** 2, rate * u.shape[1])
    yq = np.stack([mu[c] + quant((y[:, c] - mu[c]) / sd[c], bits[c]) * sd[c]
                   for c in range(u.shape[1])], 1)
    return yq @ basis.T, bits


def transforms(u, rate, rng):
    n, d = u.shape
    out = {}
    if float(rate).is_integer():
        r = haar(d, rng)
        out["tq"] = (quant(u @ r.T * np.sqrt(d), int(rate)) / np.sqrt(d)) @ r
    out["diag"], bits = code_in_basis(u, np.eye(d), rate)
    mu = u.mean(0)
    sd = np.sqrt(np.maximum(((u - mu) ** 2).mean(0), 1e-30))
    w = (u - mu) / sd
    wq = np.zeros_like(w)
    for b in range(1, 9):
        ch = np.where(bits == b)[0]
        if len(ch):
            r = haar(len(ch), rng)
            wq[:, ch] = quant(w[:, ch] @ r.T, b) @ r
    out["diag+rot"] = mu + wq * sd
    ev, vec = np.linalg.eigh(np.cov(u.T, bias=True))
    vec = vec[:, ::-1]
    out["klt"], _ = code_in_basis(u, vec, rate)
    h = d // 2
    for name, blocks in (("blk32", [np.arange(s, s + 32) for s in range(0, d, 32)]),
                         ("rope32", [np.r_[s:s + 16, s + h:s + h + 16] for s in range(0, h, 16)])):
        basis = np.zeros((d, d))
        for ch in blocks:
            _, v = np.linalg.eigh(np.cov(u[:, ch].T, bias=True))
            basis[np.ix_(ch, ch)] = v
        out[name], _ = code_in_basis(u, basis, rate)
    for k in (16, 32, 64):
        q, _ = np.linalg.qr(vec[:, :k], mode="complete")
        out[f"hh{k}"], _ = code_in_basis(u, q, rate)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("safetensors")
    p.add_argument("--rates", default="2,2.5")
    p.add_argument("--layer-step", type=int, default=4)
    a = p.parse_args()
    kv = load(a.safetensors)
    layers = sorted({int(k.split(".")[1]) for k in kv})
    rng = np.random.default_rng(1)
    totals = {}
    for layer in layers[::a.layer_step]:
        for t in "kv":
            x_all = kv[f"layers.{layer}.{t}"]
            for head in range(x_all.shape[1]):
                x = x_all[:, head, :]
                if t == "k":
                    x = key_means(x)
                norm = np.linalg.norm(x, axis=1, keepdims=True)
                norm[norm == 0] = 1
                var = ((x - x.mean(0)) ** 2).sum()
                for rate in (float(r) for r in a.rates.split(",")):
                    for name, uq in transforms(x / norm, rate, rng).items():
                        totals.setdefault((t, rate, name), []).append(((x - uq * norm) ** 2).sum() / var)
                print(f"layer {layer} {t} head {head} done", flush=True)
    print("tensor rate transform mean_relative_error groups")
    for (t, rate, name), v in sorted(totals.items()):
        print(f"{t.upper()} {rate:g} {name} {np.mean(v):.4f} {len(v)}")


if __name__ == "__main__":
    main()
