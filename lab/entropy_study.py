#!/usr/bin/env python3
"""What entropy coding of the Lloyd-Max indices would pay on real containers (docs/lab/kl.md).

    python3 lab/entropy_study.py S/a.tqkv [S/b.tqkv ...] [--zstd] [--json out.json]

For each container (parsed with tests/docs/reference_decoder.py, i.e. from docs/format.md alone):
every code chunk's indices are unpacked per TurboQuant subset, or per `kl:B` block class (the
channels of one bit width), and counted. Printed per container, in bits per value of the whole
file (every byte counted, as `tqkv inspect`):
  file        the container as it is
  entropy     the indices replaced by their empirical entropy per (chunk, head, subset or kl
              block), plus a 12-bit frequency per symbol for each such table: what a static rANS
              coder with per-chunk tables approaches (within ~0.1 %)
  position    the same with one table per rotated coordinate (tables counted)
  gaussian    the same with one fixed table per bit width, the symbol probabilities of N(0, 1)
              between the codebook's thresholds (no table stored): what a coder with no
              per-file model would get
With --zstd (needs the `zstandard` package): the indices of each (chunk, head, subset or block) as one
byte per symbol (coordinate-major within a vector) compressed by zstd at levels 1 and 19, the real size, and the single-thread
decompression speed in million symbols per second (best of 5): a well-kept entropy coder's
figures, for the decode time it would add.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "docs"))
import reference_decoder as rd  # noqa: E402

TABLE_BITS = 12  # one frequency per symbol in a stored table


def unpack(codes, at, bits, m):
    """Indices [n, m] of the bit planes at byte `at` of each code row (codec.md section 2)."""
    pb = (m + 7) // 8
    planes = codes[:, at:at + bits * pb].reshape(len(codes), bits, pb)
    b = np.unpackbits(planes, axis=2, bitorder="little")[:, :, :m].astype(np.uint16)
    return (b << np.arange(bits, dtype=np.uint16)[None, :, None]).sum(axis=1)


def groups_of_chunk(h, dec, codes, meta):
    """(bits, indices) of each subset (TurboQuant) or bit class (kl) of one head's codes."""
    if isinstance(dec, rd.KlDecoder):
        d = dec.d
        chan_bits = list(meta[:d])
        at = dec.nb
        for b in range(1, 9):
            size = chan_bits.count(b)
            m = 1 << 15
            while m >= 8:
                if size & m:
                    yield b, unpack(codes, at, b, m)
                    at += b * m // 8
                m >>= 1
        return
    for sub, (_, planes_at) in zip(dec.subs, dec.offsets):
        yield sub.bits, unpack(codes, planes_at, sub.bits, sub.m)


def gaussian_probs(centroids):
    t = [(a + b) / 2 for a, b in zip(centroids, centroids[1:])]
    cdf = [0.0] + [0.5 * (1 + math.erf(x / math.sqrt(2))) for x in t] + [1.0]
    return np.maximum(np.diff(cdf), 1e-12)


def study(path, use_zstd):
    data = open(path, "rb").read()
    h, decoders, chunks = rd.read_container(data)
    heads = h["kv_heads"]
    index_bits = 0.0
    entropy_bits = 0.0
    position_bits = 0.0
    gauss_bits = 0.0
    symbols = 0
    zstd_bytes = {1: 0, 19: 0}
    zstd_s = 0.0
    metas = b""
    zstd = None
    if use_zstd:
        import zstandard
        zstd = zstandard
    for (typ, layer, kv, _, tc), payload in chunks:
        if typ == 1:
            metas = payload
            continue
        if typ != 2:
            continue
        dec = rd.layer_decoder(h, decoders, layer, kv)
        if isinstance(dec, rd.CodecDecoder) and dec.c["kind"] == 0:
            continue
        cb = dec.code_bytes
        mb = dec.meta_bytes()
        base = heads * rd.layer_decoder(h, decoders, layer, 0).meta_bytes() if kv else 0
        codes_all = np.frombuffer(payload, dtype=np.uint8).reshape(heads, tc, cb)
        for hd in range(heads):
            meta = metas[base + hd * mb:base + (hd + 1) * mb] if mb else b""
            for bits, idx2 in groups_of_chunk(h, dec, codes_all[hd], meta):
                idx = idx2.ravel()
                n = idx.size
                counts = np.bincount(idx, minlength=1 << bits).astype(np.float64)
                index_bits += n * bits
                entropy_bits += _entropy(counts) + TABLE_BITS * (1 << bits)
                # One table per rotated coordinate: after a fixed rotation of non-isotropic
                # vectors, coordinates need not be alike.
                rows, m = idx2.shape
                per_pos = np.zeros((m, 1 << bits))
                np.add.at(per_pos, (np.broadcast_to(np.arange(m), idx2.shape), idx2), 1)
                position_bits += sum(_entropy(c) for c in per_pos) + TABLE_BITS * (1 << bits) * m
                centroids = (dec.c["subsets"][bits - 1]["centroids"] if isinstance(dec, rd.KlDecoder)
                             else next(s.centroids for s in dec.subs if s.bits == bits))
                q = gaussian_probs(centroids)
                gauss_bits += -float((counts * np.log2(q)).sum())
                symbols += n
                if zstd:
                    raw = idx.astype(np.uint8).tobytes()
                    for level in zstd_bytes:
                        zstd_bytes[level] += len(zstd.ZstdCompressor(level=level).compress(raw))
                    comp = zstd.ZstdCompressor(level=19).compress(raw)
                    dctx = zstd.ZstdDecompressor()
                    best = min(_timed(dctx.decompress, comp) for _ in range(5))
                    zstd_s += best
    values = 2 * heads * h["head_dim"] * sum(rd.layer_tokens(h, l) for l in range(h["layers"]))
    file_bits = 8 * len(data)
    rest = file_bits - index_bits  # norms, metadata, means, exact rows, headers, padding
    out = {"path": path, "values": values, "symbols": symbols,
           "file_bpv": file_bits / values,
           "index_bits_per_symbol": index_bits / symbols if symbols else 0,
           "entropy_bits_per_symbol": entropy_bits / symbols if symbols else 0,
           "entropy_bpv": (rest + entropy_bits) / values,
           "position_bpv": (rest + position_bits) / values,
           "gaussian_bpv": (rest + gauss_bits) / values}
    if zstd:
        for level, b in zstd_bytes.items():
            out["zstd%d_bpv" % level] = (rest + 8 * b) / values
        out["zstd_decode_msym_s"] = symbols / zstd_s / 1e6
    return out


def _entropy(counts):
    """Bits of an ideal coder for these symbol counts (zero-order)."""
    n = counts.sum()
    p = counts[counts > 0] / n
    return -n * float((p * np.log2(p)).sum())


def _timed(fn, arg):
    t = time.perf_counter()
    fn(arg)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("containers", nargs="+")
    ap.add_argument("--zstd", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for i, path in enumerate(args.containers):
        print("[%d/%d] %s" % (i + 1, len(args.containers), path), file=sys.stderr)
        r = study(path, args.zstd)
        rows.append(r)
        line = ("%s: file %.3f b/v; indices %.3f -> %.3f bits/symbol; entropy %.3f b/v (%.1f %%),"
                " per position %.3f b/v, gaussian %.3f b/v" % (
                    os.path.basename(path), r["file_bpv"], r["index_bits_per_symbol"],
                    r["entropy_bits_per_symbol"], r["entropy_bpv"],
                    100 * (1 - r["entropy_bpv"] / r["file_bpv"]), r["position_bpv"],
                    r["gaussian_bpv"]))
        if "zstd1_bpv" in r:
            line += "; zstd -1 %.3f, -19 %.3f b/v, decode %.0f Msym/s" % (
                r["zstd1_bpv"], r["zstd19_bpv"], r["zstd_decode_msym_s"])
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
