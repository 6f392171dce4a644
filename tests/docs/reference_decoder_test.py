#!/usr/bin/env python3
"""tests/docs/reference_decoder.py (written from docs/format.md and docs/codec.md alone) against
`tqkv decompress`: byte-identical safetensors on the golden containers and on containers that
`tqkv compress` writes now, over the presets and modifiers of docs/codec.md section 3.

    reference_decoder_test.py TQKV_BINARY [WORK_DIR]
"""

import os
import random
import re
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DECODER = os.path.join(HERE, "reference_decoder.py")
GOLDEN = os.path.join(ROOT, "fuzz", "corpus", "container")

# (name, head_dim, source dtype, tqkv compress arguments, output dtypes)
CASES = [
    ("fp16", 128, "F32", ["--codec", "fp16"], ["f16", "f32"]),
    ("bf16", 128, "F32", ["--codec", "bf16"], ["f16", "bf16"]),
    ("fp32", 128, "F16", ["--codec", "fp32"], ["f16", "bf16"]),
    ("fp16 (f16 source: NaN payloads kept)", 64, "F16", ["--codec", "fp16"], ["f32", "bf16"]),
    ("bf16 (bf16 source: NaN payloads kept)", 64, "BF16", ["--codec", "bf16"], ["f32", "f16"]),
    ("tq1", 128, "F32", ["--codec", "tq1"], ["f16"]),
    ("tq2", 128, "F16", ["--codec", "tq2"], ["f16"]),
    ("tq3", 128, "F32", ["--codec", "tq3"], ["f16", "bf16", "f32"]),
    ("tq4", 128, "BF16", ["--codec", "tq4"], ["f16"]),
    ("tq8", 64, "F32", ["--codec", "tq8"], ["f32"]),
    ("tq2.5", 128, "F32", ["--codec", "tq2.5"], ["f16", "f32"]),
    ("tq3.5", 128, "F16", ["--codec", "tq3.5"], ["f16"]),
    ("tq3,rot=hd2", 128, "F32", ["--codec", "tq3,rot=hd2"], ["f32"]),
    ("tq3,rot=haar", 64, "F32", ["--codec", "tq3,rot=haar"], ["f32"]),
    ("tq2.5,rot=haar", 128, "F32", ["--codec", "tq2.5,rot=haar"], ["f32"]),
    ("tq3,rot=kron (head_dim 80: 5 x 16)", 80, "F32", ["--codec", "tq3,rot=kron"], ["f32"]),
    ("tq3,norm=f16", 128, "F32", ["--codec", "tq3,norm=f16"], ["f16"]),
    ("tq3,nc=1", 128, "F32", ["--codec", "tq3,nc=1"], ["f32"]),
    ("tq3,qjl=1", 64, "F32", ["--codec", "tq3,qjl=1"], ["f16", "f32"]),
    ("tq:b=2,split=32@4,rot=hd2", 64, "F32", ["--codec", "tq:b=2,split=32@4,rot=hd2"], ["f32"]),
    ("tq4,seed=7", 128, "F32", ["--codec", "tq4,seed=7"], ["f16"]),
    ("tq3 (head_dim 96: Kronecker 3 x 32)", 96, "F32", ["--codec", "tq3"], ["f32"]),
    ("tq2.5 (head_dim 16)", 16, "BF16", ["--codec", "tq2.5"], ["bf16"]),
    ("tq3 + layer 1 tq2.5", 128, "F32", ["--codec", "tq3", "--layer-codec", "1:tq2.5"], ["f16"]),
    ("tq3 + exact tokens 2,3", 128, "F16", ["--codec", "tq3", "--exact-tokens", "2,3"], ["f16", "f32"]),
    ("bf16 + exact tokens 1,1", 32, "F32", ["--codec", "bf16", "--exact-tokens", "1,1"], ["f16"]),
    # Key means (format version 4; the rows above use the default, one 20-token block here, and
    # the guard's figures: format version 6).
    ("tq3, key means off, no guard (version 1)", 64, "F32",
     ["--codec", "tq3", "--key-means", "off", "--no-guard"], ["f16"]),
    ("tq3, key means per 20 tokens, no guard (version 4)", 64, "F32",
     ["--codec", "tq3", "--no-guard"], ["f16"]),
    ("tq3, key means per 8 tokens, f32", 64, "F16",
     ["--codec", "tq3", "--key-means", "8,f32"], ["f16", "f32"]),
    ("tq2.5, key means per 6 tokens + exact tokens 1,2", 64, "BF16",
     ["--codec", "tq2.5", "--key-means", "6", "--exact-tokens", "1,2"], ["bf16", "f32"]),
    ("fp16 + layer 1 tq3, key means per session", 32, "F32",
     ["--codec", "fp16", "--layer-codec", "1:tq3", "--key-means", "session"], ["f16"]),
    # Separate K and V codecs (format version 5), with and without key means.
    ("k4v2", 128, "F32", ["--codec", "k4v2"], ["f16", "f32"]),
    ("k3.5v2.5, key means off", 64, "F16", ["--codec", "k3.5v2.5", "--key-means", "off"], ["f16"]),
    ("k3v2, no guard (version 5)", 64, "F16", ["--codec", "k3v2", "--no-guard"], ["f16"]),
    # The bit allocator (format version 6 with a budget).
    # (a tiny session: 4 KiB pages dominate its bits per value)
    ("auto:40", 64, "F32", ["--codec", "auto:40"], ["f32"]),
    # The transform codec (format version 8), with key means, a raw layer and an f32 norm.
    ("kl:2.5", 64, "F32", ["--codec", "kl:2.5"], ["f16", "f32"]),
    ("kl:3,norm=f32 + layer 1 fp16, key means off", 32, "F16",
     ["--codec", "kl:3,norm=f32", "--layer-codec", "1:fp16", "--key-means", "off"], ["f32"]),
    ("k:kl:2/v:tq3", 128, "BF16", ["--codec", "k:kl:2/v:tq3"], ["bf16"]),
    ("k:tq2.5/v:tq3,qjl=1 + exact tokens 1,1", 64, "F32",
     ["--codec", "k:tq2.5/v:tq3,qjl=1", "--exact-tokens", "1,1"], ["f32"]),
    ("tq3 + layer 0 k:fp16/v:tq2.5 + layer 1 k4v3", 64, "BF16",
     ["--codec", "tq3", "--layer-codec", "0:k:fp16/v:tq2.5", "--layer-codec", "1:k4v3"], ["bf16"]),
    # Payload alignment below 4096 (format version 9), with every kind of chunk.
    ("tq2.5 + exact tokens 1,2, align 64", 64, "F32",
     ["--codec", "tq2.5", "--exact-tokens", "1,2", "--align", "64"], ["f16", "f32"]),
    ("kl:2.5 + layer 1 k4v2, align 512", 64, "BF16",
     ["--codec", "kl:2.5", "--layer-codec", "1:k4v2", "--align", "512"], ["bf16"]),
    ("fp16, no guard, align 2048", 32, "F16", ["--codec", "fp16", "--no-guard", "--align", "2048"],
     ["f16"]),
    # Version 8 without the guard's figures: guard_stride 0 (docs/format.md section 4).
    ("kl:2.5, no guard (version 8, guard_stride 0)", 64, "F32", ["--codec", "kl:2.5", "--no-guard"],
     ["f16"]),
]

# Ragged caches (layers of different lengths): what `tqkv compress` writes as version 7 (8 with kl).
RAGGED = [
    ("tq3, ragged layers 20 and 12 (version 7)", 64, "F32", [20, 12], ["--codec", "tq3"], ["f32"]),
    ("kl:2.5 + exact tokens 1,2, ragged layers 9 and 20", 64, "BF16", [9, 20],
     ["--codec", "kl:2.5", "--exact-tokens", "1,2"], ["bf16"]),
]

LAYERS, HEADS, TOKENS = 2, 2, 20


def encode_values(values, dtype):
    if dtype == "F32":
        return struct.pack("<%df" % len(values), *values)
    if dtype == "F16":
        return struct.pack("<%de" % len(values), *values)
    return struct.pack("<%dH" % len(values),
                       *[struct.unpack("<I", struct.pack("<f", v))[0] >> 16 for v in values])


def make_input(path, head_dim, dtype, seed, layer_tokens=None):
    """A small KV cache with outlier channels, a zero vector, a NaN, an inf and tiny values;
    layer_tokens: each layer's own token count (a ragged cache: format version 7)."""
    rnd = random.Random(seed)
    layer_tokens = layer_tokens or [TOKENS] * LAYERS
    tensors = []
    for layer in range(LAYERS):
        for kv in range(2):
            outliers = rnd.sample(range(head_dim), max(1, head_dim // 32))
            vals = []
            for t in range(layer_tokens[layer]):
                for h in range(HEADS):
                    vec = [rnd.gauss(0.0, 1.0) for _ in range(head_dim)]
                    for c in outliers:
                        vec[c] = vec[c] * 12.0 + 30.0
                    if t == 0 and h == 0:
                        vec = [0.0] * head_dim
                    if t == 3 and h == 1 and layer == 0:
                        vec[5] = float("nan")
                    if t == 4 and h == 0 and layer == 1:
                        vec[2] = float("-inf")
                    if t == 5 and h == 1:
                        vec = [v * 1e-3 for v in vec]
                    vals.extend(vec)
            tensors.append(("layers.%d.%s" % (layer, "kv"[kv]), encode_values(vals, dtype)))
    esize = 4 if dtype == "F32" else 2
    # Layer 0 K, token 6, head 0: a signalling NaN with a payload, a negative NaN and the smallest
    # subnormal, as bit patterns (raw codecs keep or convert them; docs/codec.md section 2).
    special = {"F32": (0x7FA00001, 0xFFC00001, 0x00000001), "F16": (0x7D01, 0xFE01, 0x0001),
               "BF16": (0x7F81, 0xFFC1, 0x0001)}[dtype]
    k0 = bytearray(tensors[0][1])
    at = 6 * HEADS * head_dim * esize
    for i, bits in enumerate(special):
        k0[at + i * esize:at + (i + 1) * esize] = bits.to_bytes(esize, "little")
    tensors[0] = (tensors[0][0], bytes(k0))
    entries = ['"__metadata__":{"format":"tqkv-kv-cache","model":"ref-test"}']
    offset = 0
    for i, (name, data) in enumerate(tensors):
        entries.append('"%s":{"dtype":"%s","shape":[%d,%d,%d],"data_offsets":[%d,%d]}'
                       % (name, dtype, layer_tokens[i // 2], HEADS, head_dim, offset,
                          offset + len(data)))
        offset += len(data)
    text = ("{" + ",".join(entries) + "}").encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t for _, t in tensors))


def make_flat_channel_input(path, head_dim, seed):
    """make_input's F32 cache with channels 0..7 a constant tiny negative: kl gives them 0 bits
    and a mean of -0 (f16), so a 0-bit channel's zero takes the sign of row position 0
    (docs/codec.md section 11, step 2)."""
    make_input(path, head_dim, "F32", seed)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    start = 8 + struct.unpack_from("<Q", data, 0)[0]
    for at in range(start, len(data), 4 * head_dim):
        for c in range(8):
            struct.pack_into("<f", data, at + 4 * c, -1e-30)
    with open(path, "wb") as f:
        f.write(bytes(data))


def run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def compare(tqkv, container, dtype, work, label):
    """Returns an error string, or None when both agree (same bytes, or both refuse)."""
    ref = os.path.join(work, "ref.safetensors")
    ours = os.path.join(work, "ours.safetensors")
    for p in (ref, ours):
        if os.path.exists(p):
            os.unlink(p)
    a = run([tqkv, "decompress", container, ref, "--dtype", dtype, "--threads", "1"])
    b = run([sys.executable, DECODER, container, ours, "--dtype", dtype])
    if a.returncode != 0 or b.returncode != 0:
        if a.returncode != 0 and b.returncode != 0:
            return None
        return "%s --dtype %s: tqkv rc %d (%s), reference rc %d (%s)" % (
            label, dtype, a.returncode, a.stderr.strip(), b.returncode, b.stderr.strip())
    with open(ref, "rb") as f:
        x = f.read()
    with open(ours, "rb") as f:
        y = f.read()
    if x != y:
        first = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
        return "%s --dtype %s: %d vs %d bytes, first difference at byte %d" % (
            label, dtype, len(x), len(y), first)
    return None


def main():
    tqkv = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="tqkv-refdec-")
    os.makedirs(work, exist_ok=True)
    failures, checked = [], 0
    # The golden files of docs/format.md section 10 (v<version>_*.tqkv), not the fuzzer's other seeds.
    for name in sorted(n for n in os.listdir(GOLDEN) if re.match(r"v[0-9]+_.*\.tqkv$", n)):
        for dtype in ("f16", "bf16", "f32"):
            err = compare(tqkv, os.path.join(GOLDEN, name), dtype, work, "golden " + name)
            checked += 1
            if err:
                failures.append(err)
    cases = [(c, 1000 + i, None) for i, c in enumerate(CASES)]
    cases += [((label, d, src, args, dtypes), 2000 + i, layer_tokens)
              for i, (label, d, src, layer_tokens, args, dtypes) in enumerate(RAGGED)]
    for (label, head_dim, src, args, dtypes), seed, layer_tokens in cases:
        st = os.path.join(work, "in.safetensors")
        container = os.path.join(work, "case.tqkv")
        make_input(st, head_dim, src, seed, layer_tokens)
        r = run([tqkv, "compress", st, container, "--threads", "1"] + args)
        if r.returncode != 0:
            failures.append("%s: tqkv compress failed: %s" % (label, r.stderr.strip()))
            continue
        for dtype in dtypes:
            err = compare(tqkv, container, dtype, work, label)
            checked += 1
            if err:
                failures.append(err)
    # A kl session of 0 tokens: version 8, every layer_tokens entry 0.
    zero = os.path.join(work, "zero")
    label = "kl:2.5, 0 tokens"
    r = run([tqkv, "checkpoint", "--layers", "2", "--kv-heads", "2", "--head-dim", "64",
             "--tokens", "0", "--codec", "kl:2.5", "--store", zero, "--session", "z"])
    if r.returncode != 0:
        failures.append("%s: tqkv checkpoint failed: %s" % (label, r.stderr.strip()))
    else:
        err = compare(tqkv, os.path.join(zero, "z.tqkv"), "f16", work, label)
        checked += 1
        if err:
            failures.append(err)
    # 0-bit kl channels with -0 means, key means off so the zeros reach the output.
    st = os.path.join(work, "in.safetensors")
    container = os.path.join(work, "case.tqkv")
    make_flat_channel_input(st, 64, 77)
    label = "kl:1.5, 0-bit channels with -0 means"
    r = run([tqkv, "compress", st, container, "--threads", "1", "--codec", "kl:1.5",
             "--key-means", "off", "--exact-tokens", "0,0"])
    if r.returncode != 0:
        failures.append("%s: tqkv compress failed: %s" % (label, r.stderr.strip()))
    else:
        err = compare(tqkv, container, "f32", work, label)
        checked += 1
        if err:
            failures.append(err)
    for f in failures:
        print("FAIL", f)
    print("%d comparisons, %d failed" % (checked, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
