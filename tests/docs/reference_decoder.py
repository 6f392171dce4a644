#!/usr/bin/env python3
"""A second, independent .tqkv decoder, written from docs/format.md and docs/codec.md only.

    reference_decoder.py IN.tqkv OUT.safetensors [--dtype f16|bf16|f32]

writes the same bytes as `tqkv decompress IN.tqkv OUT.safetensors --dtype ...`. It exists to
prove that the two documents specify the format bit for bit (tests/docs/reference_decoder_test.py
compares the two on the golden containers and on freshly compressed ones). Pure Python, no
dependencies, slow (about 10 ms per Haar-rotated vector): meant for small files.

It parses and checks the structure (magic, versions, footer, canonical chunk order and offsets,
zero padding) but does not verify the XXH3 checksums, which need a library the standard Python
does not ship; `tqkv verify` does that.
"""

import argparse
import ctypes
import math
import struct
import sys

M64 = (1 << 64) - 1
ALIGN = 4096
MAGIC = b"\x89TQKV\r\n\x1a"

F32, F16, BF16 = 0, 1, 2
DTYPE_SIZE = {F32: 4, F16: 2, BF16: 2}
DTYPE_NAMES = {"f32": F32, "fp32": F32, "f16": F16, "fp16": F16, "bf16": BF16}
HADAMARD, HADAMARD2, HAAR, KRONECKER = 1, 2, 3, 4


class Corrupt(Exception):
    pass


# ---------------------------------------------------------------- float32 arithmetic


def f32(x):
    """Rounds a double to the nearest binary32 (ties to even), as a C cast does."""
    return ctypes.c_float(x).value


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bits_f32(u):
    return struct.unpack("<f", struct.pack("<I", u))[0]


def fma32(a, b, c):
    """Single-rounded a*b + c for binary32 a, b, c (std::fma on floats).

    a*b is exact in double (24 + 24 significand bits). The sum is made round-to-odd in double
    (the exact value lies between the double sum and its neighbour in the direction of the
    error; round-to-odd takes the one with an odd significand), then rounded once to binary32,
    which is then correctly rounded because double has more than 24 + 2 bits.
    """
    p = a * b
    s = p + c
    if math.isinf(s) or math.isnan(s):
        return f32(s)
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    if err != 0.0 and (struct.unpack("<Q", struct.pack("<d", s))[0] & 1) == 0:
        s = math.nextafter(s, math.inf if err > 0 else -math.inf)
    return f32(s)


def half_to_bits(h):
    """binary16 -> binary32 bit pattern (exact; a NaN gets the quiet bit)."""
    sign = (h & 0x8000) << 16
    exp = (h >> 10) & 0x1F
    mant = h & 0x3FF
    if exp == 0:
        if mant == 0:
            return sign
        e = -1
        while True:
            e += 1
            mant <<= 1
            if mant & 0x400:
                break
        return sign | (127 - 15 - e) << 23 | (mant & 0x3FF) << 13
    if exp == 0x1F:
        return sign | 0x7F800000 | mant << 13 | (0x400000 if mant else 0)
    return sign | (exp + 127 - 15) << 23 | mant << 13


def half_to_float(h):
    return bits_f32(half_to_bits(h))


def bits_to_half(u):
    """binary32 bit pattern -> binary16, round to nearest even."""
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a >= 0x7F800000:
        if a == 0x7F800000:
            return sign | 0x7C00
        return sign | 0x7E00 | ((a >> 13) & 0x3FF)
    if a >= 0x477FF000:
        return sign | 0x7C00
    if a < 0x38800000:
        if a < 0x33000000:
            return sign
        e = a >> 23
        m = (a & 0x7FFFFF) | 0x800000
        shift = 126 - e
        r = m >> shift
        rem = m & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and (r & 1)):
            r += 1
        return sign | r
    r = a - 0x38000000
    rem = r & 0x1FFF
    r >>= 13
    if rem > 0x1000 or (rem == 0x1000 and (r & 1)):
        r += 1
    return sign | r


def bits_to_bf16(u):
    """binary32 bit pattern -> bfloat16, round to nearest even; a NaN gets the quiet bit."""
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return ((u >> 16) | 0x40) & 0xFFFF
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def load_bits(buf, dtype, n, at=0):
    """n elements of dtype from buf[at:] as binary32 bit patterns (exact, NaN payloads kept)."""
    if dtype == F32:
        return list(struct.unpack_from("<%dI" % n, buf, at))
    raw = struct.unpack_from("<%dH" % n, buf, at)
    if dtype == F16:
        return [half_to_bits(h) for h in raw]
    return [b << 16 for b in raw]


def store_bits(bits, dtype):
    """Bytes of binary32 bit patterns converted to dtype."""
    if dtype == F32:
        return struct.pack("<%dI" % len(bits), *bits)
    conv = bits_to_half if dtype == F16 else bits_to_bf16
    return struct.pack("<%dH" % len(bits), *[conv(u) for u in bits])


# ---------------------------------------------------------------- PRNG (codec.md section 4)


def splitmix64(state):
    """Returns (new_state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def derive_seed(seed, a):
    s, h = splitmix64(seed)
    s = h ^ ((a * 0xD1B54A32D192ED03 + 0x8CB92BA72F3D8DD7) & M64)
    return splitmix64(s)[1]


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
INV_ODD = [1.0 / (2 * k + 1) for k in range(16)]


def det_log(x):
    m, e = math.frexp(x)
    if m < 0.70710678118654752440:
        m *= 2.0
        e -= 1
    t = (m - 1.0) / (m + 1.0)
    t2 = t * t
    acc = 0.0
    for k in range(15, -1, -1):
        acc = acc * t2 + INV_ODD[k]
    log_m = 2.0 * t * acc
    de = float(e)
    return (de * LN2_HI + log_m) + de * LN2_LO


class Prng:
    """xoshiro256** seeded with four SplitMix64 outputs."""

    def __init__(self, seed):
        self.s = []
        state = seed
        for _ in range(4):
            state, out = splitmix64(state)
            self.s.append(out)
        self.spare = None

    def next(self):
        s = self.s
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def uniform(self):
        return float(self.next() >> 11) * (2.0 ** -53)

    def gaussian(self):
        if self.spare is not None:
            g, self.spare = self.spare, None
            return g
        while True:
            u = 2.0 * self.uniform() - 1.0
            v = 2.0 * self.uniform() - 1.0
            s = u * u + v * v
            if not (s >= 1.0 or s == 0.0):
                break
        mul = math.sqrt(-2.0 * det_log(s) / s)
        self.spare = v * mul
        return u * mul


def hadamard_signs(seed, dim, rnd):
    prng = Prng(derive_seed(seed, rnd))
    signs = []
    word = 0
    for i in range(dim):
        if i % 64 == 0:
            word = prng.next()
        signs.append(-1.0 if (word >> (i % 64)) & 1 else 1.0)
    return signs


def haar_matrix(seed, m):
    """Q (rows of binary32) from modified Gram-Schmidt over a Gaussian matrix, in double."""
    prng = Prng(seed)
    g = [[prng.gaussian() for _ in range(m)] for _ in range(m)]  # g[i][j] = G[i][j]
    cols = []
    for j in range(m):
        v = [g[i][j] for i in range(m)]
        for _ in range(2):
            for qk in cols:
                dot = 0.0
                for i in range(m):
                    dot += qk[i] * v[i]
                for i in range(m):
                    v[i] -= dot * qk[i]
        ss = 0.0
        for i in range(m):
            ss += v[i] * v[i]
        inv = 1.0 / math.sqrt(ss)
        cols.append([x * inv for x in v])
    return [[f32(cols[j][i]) for j in range(m)] for i in range(m)]


def kron_block(m):
    """B of the Kronecker kind: the largest power of two dividing m."""
    return m & -m


def dec_scale(kind, m):
    if kind == HADAMARD:
        return f32(1.0 / m)
    if kind == HADAMARD2:
        return f32(1.0 / (m * math.sqrt(m)))
    if kind == KRONECKER:
        return f32(1.0 / math.sqrt(m * kron_block(m)))
    return f32(1.0 / math.sqrt(m))


# ---------------------------------------------------------------- decoding one vector


def fwht(y):
    m = len(y)
    h = 1
    while h < m:
        for i in range(m):
            if i & h:
                continue
            a, b = y[i], y[i + h]
            y[i] = f32(a + b)
            y[i + h] = f32(a - b)
        h <<= 1


class SubsetDecoder:
    def __init__(self, sub, norm_dtype):
        self.m = sub["channels"]
        self.bits = sub["bits"]
        self.kind = sub["rotation"]
        self.centroids = sub["centroids"]
        self.norm_dtype = norm_dtype
        self.scale = dec_scale(self.kind, self.m)
        if self.kind in (HADAMARD, HADAMARD2):
            self.signs1 = hadamard_signs(sub["seed"], self.m, 0)
            if self.kind == HADAMARD2:
                self.signs2 = hadamard_signs(sub["seed"], self.m, 1)
        elif self.kind == KRONECKER:
            self.block = kron_block(self.m)
            self.signs1 = hadamard_signs(sub["seed"], self.m, 0)
            self.q = haar_matrix(sub["seed"], self.m // self.block)
        else:
            self.q = haar_matrix(sub["seed"], self.m)

    def plane_bytes(self):
        return (self.m + 7) // 8

    def decode(self, code, norm_at, planes_at):
        m = self.m
        if self.norm_dtype == F16:
            norm = half_to_float(struct.unpack_from("<H", code, norm_at)[0])
        else:
            norm = struct.unpack_from("<f", code, norm_at)[0]
        a = f32(norm * self.scale)
        pb = self.plane_bytes()
        idx = [0] * m
        for p in range(self.bits):
            plane = code[planes_at + p * pb: planes_at + (p + 1) * pb]
            for j in range(m):
                idx[j] |= ((plane[j >> 3] >> (j & 7)) & 1) << p
        v = [f32(self.centroids[i] * a) for i in idx]
        if self.kind == HAAR:
            y = [0.0] * m
            for i in range(m):
                row, vi = self.q[i], v[i]
                for j in range(m):
                    y[j] = fma32(row[j], vi, y[j])
            return y
        if self.kind == KRONECKER:
            b, q = self.block, m // self.block
            u = [0.0] * m
            for a in range(q):
                for j in range(b):
                    acc = 0.0
                    for a2 in range(q):
                        acc = fma32(self.q[a2][a], v[a2 * b + j], acc)
                    u[a * b + j] = acc
            for a in range(q):
                blk = u[a * b:(a + 1) * b]
                fwht(blk)
                u[a * b:(a + 1) * b] = blk
            return [x * s for x, s in zip(u, self.signs1)]
        fwht(v)
        if self.kind == HADAMARD2:
            v = [x * s for x, s in zip(v, self.signs2)]
            fwht(v)
        return [x * s for x, s in zip(v, self.signs1)]


KL_CLASS_SEED = 0x74716B766B6C0001  # codec.md section 11: block rotations of m channels


class KlDecoder:
    """The transform codec kl (codec.md section 11)."""

    def __init__(self, c):
        self.c, self.d = c, c["head_dim"]
        self.nb = DTYPE_SIZE[c["norm_dtype"]]
        self.code_bytes = self.nb + c["code_bits"] // 8
        self.blocks = {}  # m -> a Hadamard SubsetDecoder per bits, built on first use

    def meta_bytes(self):
        return 5 * self.d + 4

    def block(self, m, bits):
        key = (m, bits)
        if key not in self.blocks:
            sub = {"channels": m, "bits": bits, "rotation": HADAMARD,
                   "seed": derive_seed(KL_CLASS_SEED, m),
                   "centroids": self.c["subsets"][bits - 1]["centroids"]}
            dec = SubsetDecoder(sub, self.c["norm_dtype"])
            dec.scale = f32(1.0 / math.sqrt(m))  # enc and dec scale 1/sqrt(m)
            self.blocks[key] = dec
        return self.blocks[key]

    def decode(self, code, meta):
        d = self.d
        bits = list(meta[:d])
        means = [half_to_float(struct.unpack_from("<H", meta, d + 2 * c)[0]) for c in range(d)]
        scales = [half_to_float(struct.unpack_from("<H", meta, 3 * d + 2 * c)[0]) for c in range(d)]
        g = struct.unpack_from("<f", meta, 5 * d)[0]
        if (any(b > 8 for b in bits) or sum(bits) != self.c["code_bits"]
                or any(not math.isfinite(v) for v in means + scales)
                or any(math.copysign(1.0, s) < 0 for s in scales)
                or any(bits.count(b) % 8 for b in range(1, 9))
                or not (math.isfinite(g) and g > 0 and math.frexp(g)[0] == 0.5
                        and -125 <= math.frexp(g)[1] <= 128)
                or not self.finite_decode(bits, means, scales, g)):
            raise Corrupt("kl group metadata")
        if self.c["norm_dtype"] == F16:
            norm = half_to_float(struct.unpack_from("<H", code, 0)[0])
        else:
            norm = struct.unpack_from("<f", code, 0)[0]
        x = [0.0] * d
        row0 = None  # row position 0: the first block's first value
        at = self.nb
        for b in range(1, 9):
            chans = [c for c in range(d) if bits[c] == b]
            taken = 0
            m = 1 << 15
            while m >= 8:  # blocks by the binary digits of the class size, largest first
                if len(chans) & m:
                    row = self.block(m, b).decode(code, 0, at)
                    if row0 is None:
                        row0 = row[0]
                    for j, c in enumerate(chans[taken:taken + m]):
                        x[c] = f32(f32(f32(means[c] * g) * norm) + f32(f32(scales[c] * g) * row[j]))
                    taken += m
                    at += b * m // 8
                m >>= 1
        for c in range(d):  # 0-bit channels: beta_c = +0 and p_c = 0 (the sign of a zero sum)
            if bits[c] == 0:
                x[c] = f32(f32(f32(means[c] * g) * norm) + f32(0.0 * row0))
        return x

    def finite_decode(self, bits, means, scales, g):
        """codec.md section 11: finite codes must decode to finite values."""
        if self.c["norm_dtype"] != F16:
            return g == 1.0
        root_d = math.sqrt(self.d)
        largest = [0.0] + [max(abs(s["centroids"][0]), abs(s["centroids"][-1]))
                           for s in self.c["subsets"]]
        return all(g * 65504.0 * (abs(means[c]) + (scales[c] * root_d * largest[bits[c]]
                                                  if bits[c] else 0.0)) <= 2.0 ** 127
                   for c in range(self.d))

    def decode_to(self, code, meta, out_dtype):
        return store_bits([f32_bits(v) for v in self.decode(code, meta)], out_dtype)


class CodecDecoder:
    def __init__(self, c):
        self.c = c
        self.d = c["head_dim"]
        if c["kind"] == 0:
            self.code_bytes = self.d * DTYPE_SIZE[c["raw_dtype"]]
            return
        nb = DTYPE_SIZE[c["norm_dtype"]]
        self.subs = [SubsetDecoder(s, c["norm_dtype"]) for s in c["subsets"]]
        self.offsets = []
        at = nb * len(self.subs)
        for i, s in enumerate(self.subs):
            self.offsets.append((i * nb, at))
            at += s.bits * s.plane_bytes()
        self.qjl_at = at
        self.code_bytes = at + (4 + (self.d + 7) // 8 if c["qjl"] else 0)
        if c["qjl"]:
            prng = Prng(c["qjl_seed"])
            d = self.d
            self.qjl_s = [[f32(prng.gaussian()) for _ in range(d)] for _ in range(d)]

    def split(self):
        return self.c["kind"] == 1 and len(self.c["subsets"]) == 2

    def meta_bytes(self):
        return (self.d + 7) // 8 if self.split() else 0

    def decode(self, code, mask):
        """One vector: binary32 values (floats) for a TurboQuant codec."""
        d = self.d
        if not self.split():
            x = self.subs[0].decode(code, *self.offsets[0])
        else:
            outl = [ch for ch in range(d) if (mask[ch >> 3] >> (ch & 7)) & 1]
            rest = [ch for ch in range(d) if not (mask[ch >> 3] >> (ch & 7)) & 1]
            stray = any((mask[ch >> 3] >> (ch & 7)) & 1 for ch in range(d, 8 * len(mask)))
            if len(outl) != self.subs[0].m or stray:
                raise Corrupt("group mask marks %d channels, need %d" % (len(outl), self.subs[0].m))
            x = [0.0] * d
            for s, chans in enumerate((outl, rest)):
                vals = self.subs[s].decode(code, *self.offsets[s])
                for ch, val in zip(chans, vals):
                    x[ch] = val
        if self.c["qjl"]:
            gamma = struct.unpack_from("<f", code, self.qjl_at)[0]
            signs = code[self.qjl_at + 4:]
            scale = math.sqrt(math.pi / 2.0) / d * gamma
            acc = [0.0] * d
            for i in range(d):
                z = 1.0 if (signs[i >> 3] >> (i & 7)) & 1 else -1.0
                row = self.qjl_s[i]
                for j in range(d):
                    acc[j] += z * row[j]
            x = [f32(x[j] + scale * acc[j]) for j in range(d)]
        return x

    def decode_to(self, code, mask, out_dtype):
        """Bytes of one vector in out_dtype."""
        c = self.c
        if c["kind"] == 0:
            if c["raw_dtype"] == out_dtype:
                return bytes(code)
            return store_bits(load_bits(code, c["raw_dtype"], self.d), out_dtype)
        return store_bits([f32_bits(v) for v in self.decode(code, mask)], out_dtype)


# ---------------------------------------------------------------- container (format.md)


class Body:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        if self.pos + struct.calcsize(fmt) > len(self.data):
            raise Corrupt("header body too short")
        v = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def boolean(self):
        v = self.take("B")
        if v > 1:
            raise Corrupt("bool field %d" % v)
        return v == 1


def parse_header(body, version):
    r = Body(body)
    h = {}
    model_len = r.take("H")
    if model_len > 256:
        raise Corrupt("model length")
    h["model"] = bytes(r.take("%ds" % model_len)) if model_len else b""
    h["layers"], h["kv_heads"], h["head_dim"] = r.take("III")
    h["source_dtype"] = r.take("B")
    h["tokens"] = r.take("Q")
    h["token_block"] = r.take("I")
    codecs = []
    for _ in range(r.take("H")):
        c = {"kind": r.take("B"), "raw_dtype": r.take("B"), "norm_dtype": r.take("B")}
        c["norm_correction"] = r.boolean()
        c["qjl"] = r.boolean()
        count = r.take("B")
        if r.take("H") != 0:
            raise Corrupt("codec reserved")
        c["head_dim"] = r.take("I")
        c["qjl_seed"] = r.take("Q")
        c["code_bits"] = r.take("I") if (c["kind"] == 2 and version >= 8) else 0  # kl (version 8)
        c["subsets"] = []
        for _ in range(count):
            s = {"channels": r.take("H"), "bits": r.take("B"), "rotation": r.take("B")}
            s["seed"] = r.take("Q")
            n = r.take("H")
            s["centroids"] = [bits_f32(u) for u in ([r.take("I") for _ in range(n)])]
            c["subsets"].append(s)
        codecs.append(c)
    h["codecs"] = codecs
    h["layer_codec"] = [r.take("H") for _ in range(h["layers"])]
    h["exact_head"], h["exact_tail"] = (r.take("II") if version >= 2 else (0, 0))
    h["engine_state"] = b""
    if version >= 3:  # format.md section 4: the engine state, opaque here (section 13)
        n = r.take("I")
        if n > 64 << 20 or n > len(body) - r.pos:
            raise Corrupt("engine state length")
        h["engine_state"] = bytes(r.take("%ds" % n)) if n else b""
    h["key_mean_block"], h["key_mean_dtype"] = (r.take("IB") if version >= 4 else (0, F32))
    # format.md section 3: version 5 adds V's codec index per layer (else V uses K's)
    h["layer_codec_v"] = ([r.take("H") for _ in range(h["layers"])] if version >= 5
                          else list(h["layer_codec"]))
    # format.md section 4: version 6 adds the guard's figures, which decoding does not need
    h["guard_stride"], h["allocated_bits"], h["codec_error"] = 0, 0.0, []
    if version >= 6:
        h["guard_stride"] = r.take("I")
        h["allocated_bits"] = bits_f32(r.take("I"))
        # version 7 may have no figures: stride 0 and no codec_error bytes
        entries = 0 if (version >= 7 and h["guard_stride"] == 0) else 2 * h["layers"]
        if r.pos + 24 * entries > len(body):
            raise Corrupt("codec errors")
        h["codec_error"] = [r.take("ddd") for _ in range(entries)]
        if (h["guard_stride"] == 0 and version == 6) or not all(
                math.isfinite(v) and v >= 0 for e in h["codec_error"] for v in e):
            raise Corrupt("codec errors")
        a = h["allocated_bits"]
        if a != 0 and not (math.isfinite(a) and 0 < a <= 64 and h["guard_stride"]):
            raise Corrupt("allocated bits")
    # format.md section 4: version 7 adds each layer's token count (ragged layers)
    h["layer_tokens"] = []
    if version >= 7:
        if r.pos + 8 * h["layers"] > len(body):
            raise Corrupt("layer tokens")
        h["layer_tokens"] = [r.take("Q") for _ in range(h["layers"])]
        full = all(n == h["tokens"] for n in h["layer_tokens"])
        # each entry is `tokens` (0 in a 0-token session) or in [1, tokens)
        if (any(n != h["tokens"] and not 1 <= n < h["tokens"] for n in h["layer_tokens"])
                or (full and version == 7) or max(h["layer_tokens"]) != h["tokens"]):
            raise Corrupt("layer tokens")
        if full:  # versions 8 and 9 always have the table; all entries `tokens`: not ragged
            h["layer_tokens"] = []
    # format.md section 4: version 9 adds log2 of the payload alignment, 6..11 (64..2048 bytes;
    # 12, i.e. 4096, is checked by the version rule)
    h["alignment"] = ALIGN
    if version >= 9:
        log2 = r.take("B")
        if not 6 <= log2 <= 12:
            raise Corrupt("payload alignment")
        h["alignment"] = 1 << log2
    if r.pos != len(body):
        raise Corrupt("trailing header bytes")
    return h


def validate_codec(c, head_dim):
    """The parameter rules of codec.md section 3 (ValidateCodecParams) plus head_dim equality."""
    def bad(why):
        raise Corrupt("codec params: " + why)

    if c["head_dim"] != head_dim or not 1 <= head_dim <= 65535:
        bad("head_dim")
    if c["kind"] == 0:
        if c["raw_dtype"] not in (F32, F16, BF16) or c["subsets"]:
            bad("raw codec")
        return
    if c["kind"] == 2:  # kl (codec.md section 11)
        d, cb = head_dim, c["code_bits"]
        if (d < 16 or d > 256 or d % 8 or c["norm_dtype"] not in (F32, F16) or c["qjl"]
                or c["norm_correction"] or c["qjl_seed"] or cb < 8 or cb > 8 * d or cb % 8):
            bad("kl shape")
        if len(c["subsets"]) != 8:
            bad("kl codebooks")
        for j, sub in enumerate(c["subsets"]):
            cs = sub["centroids"]
            if (sub["channels"] != d or sub["bits"] != j + 1 or sub["rotation"] != 0
                    or sub["seed"] != 0 or len(cs) != 1 << (j + 1)
                    or any(not math.isfinite(x) for x in cs)
                    or any(not cs[i] > cs[i - 1] for i in range(1, len(cs)))):
                bad("kl codebook")
        return
    if c["kind"] != 1:
        bad("kind")
    subs = c["subsets"]
    if head_dim < 16 or not 1 <= len(subs) <= 2 or c["norm_dtype"] not in (F32, F16):
        bad("turboquant shape")
    if c["qjl"] and len(subs) == 2:
        bad("qjl split")
    total = 0
    for s in subs:
        m = s["channels"]
        if m == 0 or not 1 <= s["bits"] <= 8:
            bad("subset")
        if s["rotation"] in (HADAMARD, HADAMARD2):
            if m & (m - 1):
                bad("hadamard size")
        elif s["rotation"] not in (HAAR, KRONECKER):
            bad("rotation")
        cs = s["centroids"]
        if len(cs) != 1 << s["bits"] or any(not math.isfinite(x) for x in cs):
            bad("centroids")
        if any(not cs[i] > cs[i - 1] for i in range(1, len(cs))):
            bad("centroid order")
        total += m
    if total != head_dim:
        bad("subsets cover")


def has_key_means(h, layer):
    return h["key_mean_block"] > 0 and h["codecs"][h["layer_codec"][layer]]["kind"] != 0


def layer_tokens(h, layer):
    """n_l: the tokens layer `layer` holds (format.md section 4, version 7)."""
    return h["layer_tokens"][layer] if h["layer_tokens"] else h["tokens"]


def mean_blocks(h, layer):
    n = layer_tokens(h, layer)
    return -(-n // h["key_mean_block"]) if h["key_mean_block"] else 0


def layer_decoder(h, decoders, layer, kv):
    return decoders[h["layer_codec_v" if kv else "layer_codec"][layer]]


def layer_meta_bytes(h, decoders, layer):
    """The group-meta chunk: [K heads][K meta] then [V heads][V meta] (format.md section 5)."""
    return h["kv_heads"] * sum(layer_decoder(h, decoders, layer, kv).meta_bytes() for kv in (0, 1))


def chunk_keys(h, decoders):
    """Container order: (type, layer, kv, token_begin, token_count)."""
    keys = []
    for layer in range(h["layers"]):
        if layer_meta_bytes(h, decoders, layer):
            keys.append((1, layer, 0, 0, 0))
        if has_key_means(h, layer):
            keys.append((4, layer, 0, 0, 0))
        for kv in (0, 1):
            t = 0
            while t < layer_tokens(h, layer):
                n = min(h["token_block"], layer_tokens(h, layer) - t)
                keys.append((2, layer, kv, t, n))
                t += n
        if h["exact_head"] + h["exact_tail"]:
            keys.append((3, layer, 0, 0, 0))
    return keys


def chunk_size(h, decoders, key):
    typ, layer, kv, _, count = key
    dec = layer_decoder(h, decoders, layer, kv)
    if typ == 1:
        return layer_meta_bytes(h, decoders, layer)
    if typ == 2:
        return count * h["kv_heads"] * dec.code_bytes
    if typ == 4:
        values = (mean_blocks(h, layer) * h["head_dim"] + layer_tokens(h, layer)) * h["kv_heads"]
        return values * DTYPE_SIZE[h["key_mean_dtype"]]
    rows = h["exact_head"] + h["exact_tail"]
    return 2 * rows * h["kv_heads"] * h["head_dim"] * DTYPE_SIZE[h["source_dtype"]]


def align(x, a=ALIGN):
    return (x + a - 1) // a * a


def read_container(data):
    """Header and list of (key, payload) in container order; raises Corrupt."""
    size = len(data)
    if size < 64 + 16 + 64 or data[:8] != MAGIC or data[-8:] != MAGIC:
        raise Corrupt("size or magic")
    version, flags, checksum_type = struct.unpack_from("<IIB", data, 8)
    if not 1 <= version <= 9:
        raise Corrupt("unsupported format version %d" % version)
    if flags != 0 or checksum_type != 1 or data[17:20] != b"\0\0\0":
        raise Corrupt("flags, checksum type or reserved")
    header_size = struct.unpack_from("<I", data, 20)[0]
    foot = size - 64
    index_offset, index_size, _, file_size, _, foot_version, reserved = struct.unpack_from(
        "<QQQQQII", data, foot)
    if file_size != size or foot_version != version or reserved != 0:
        raise Corrupt("footer")
    if index_offset + index_size != foot or (index_size - 16) % 48:
        raise Corrupt("index placement")
    if 32 + header_size > index_offset:
        raise Corrupt("header size")
    h = parse_header(data[32:32 + header_size], version)
    a = h["alignment"]  # format.md section 2: the header block ends at align_P(32 + header_size)
    header_end = align(32 + header_size, a)
    if header_end > index_offset or any(data[32 + header_size:header_end]):
        raise Corrupt("header block")
    want_version = (9 if a != ALIGN else
                    8 if any(c["kind"] == 2 for c in h["codecs"]) else
                    7 if h["layer_tokens"] else
                    6 if h["guard_stride"] or h["allocated_bits"] else
                    5 if h["layer_codec_v"] != h["layer_codec"] else
                    4 if h["key_mean_block"] else 3 if h["engine_state"] else
                    2 if h["exact_head"] + h["exact_tail"] else 1)
    shortest = min(layer_tokens(h, l) for l in range(h["layers"])) if h["layers"] else 0
    if version != want_version or h["exact_head"] + h["exact_tail"] > shortest:
        raise Corrupt("version / exact rows")
    if version == 4 and h["key_mean_block"] == 0:
        raise Corrupt("key means")
    if h["key_mean_block"] and (h["key_mean_dtype"] not in (F32, F16) or h["tokens"] == 0):
        raise Corrupt("key means")
    if version >= 5 and h["key_mean_block"] == 0 and h["key_mean_dtype"] != 0:
        raise Corrupt("key mean dtype without key means")
    if (not h["layers"] or not h["kv_heads"] or not h["head_dim"] or not h["token_block"]
            or h["source_dtype"] not in DTYPE_SIZE or not h["codecs"]):
        raise Corrupt("geometry")
    for c in h["codecs"]:
        validate_codec(c, h["head_dim"])
    if any(i >= len(h["codecs"]) for i in h["layer_codec"] + h["layer_codec_v"]):
        raise Corrupt("layer codec index")
    decoders = [KlDecoder(c) if c["kind"] == 2 else CodecDecoder(c) for c in h["codecs"]]
    keys = chunk_keys(h, decoders)
    count = struct.unpack_from("<Q", data, index_offset)[0]
    if count != len(keys) or count != (index_size - 16) // 48:
        raise Corrupt("chunk count")
    chunks = []
    pos = header_end
    for i, key in enumerate(keys):
        rec = struct.unpack_from("<BBHIQQQQQ", data, index_offset + 8 + 48 * i)
        typ, kv, res, layer, tb, tc, off, sz, _ = rec
        if (typ, layer, kv, tb, tc) != key or res != 0:
            raise Corrupt("chunk %d key" % i)
        if sz != chunk_size(h, decoders, key) or off != align(pos, a) or off + sz > index_offset:
            raise Corrupt("chunk %d placement" % i)
        if any(data[pos:off]):
            raise Corrupt("padding before chunk %d" % i)
        chunks.append((key, data[off:off + sz]))
        pos = off + sz
    if pos != index_offset:
        raise Corrupt("index offset")
    return h, decoders, chunks


def decode_container(data, out_dtype):
    """{(layer, kv): bytearray [n_l][kv_heads][head_dim] of out_dtype}."""
    h, decoders, chunks = read_container(data)
    heads, d = h["kv_heads"], h["head_dim"]
    es = DTYPE_SIZE[out_dtype]
    row = heads * d * es
    tensors = {(l, kv): bytearray(layer_tokens(h, l) * row)
               for l in range(h["layers"]) for kv in (0, 1)}
    exact = CodecDecoder({"kind": 0, "raw_dtype": h["source_dtype"], "head_dim": d})
    metas = b""
    means = []
    for (typ, layer, kv, tb, tc), payload in chunks:
        dec = layer_decoder(h, decoders, layer, kv)
        tokens, blocks = layer_tokens(h, layer), mean_blocks(h, layer)
        if typ == 1:
            metas = payload
            continue
        if typ == 4:  # means [head][block][d], then coefficients [head][token], as binary32
            md = h["key_mean_dtype"]
            means = [bits_f32(u) for u in load_bits(payload, md, len(payload) // DTYPE_SIZE[md])]
            continue
        if typ == 2:
            cb = dec.code_bytes
            out = tensors[(layer, kv)]
            centered = kv == 0 and has_key_means(h, layer)
            mb = dec.meta_bytes()
            base = heads * layer_decoder(h, decoders, layer, 0).meta_bytes() if kv else 0
            for hd in range(heads):
                mask = metas[base + hd * mb:base + (hd + 1) * mb] if mb else b""
                for t in range(tc):
                    at = (hd * tc + t) * cb
                    if centered:  # x + alpha * mu: the product rounded to binary32, then the sum
                        tok = tb + t
                        mu = (hd * blocks + tok // h["key_mean_block"]) * d
                        alpha = means[blocks * heads * d + hd * tokens + tok]
                        x = dec.decode(payload[at:at + cb], mask)
                        vals = [f32(x[j] + f32(alpha * means[mu + j])) for j in range(d)]
                        vec = store_bits([f32_bits(v) for v in vals], out_dtype)
                    else:
                        vec = dec.decode_to(payload[at:at + cb], mask, out_dtype)
                    o = (tb + t) * row + hd * d * es
                    out[o:o + d * es] = vec
            continue
        vb = exact.code_bytes
        at = 0
        ranges = [(0, h["exact_head"]), (tokens - h["exact_tail"], h["exact_tail"])]
        for kvi in (0, 1):
            out = tensors[(layer, kvi)]
            for begin, count in ranges:
                for hd in range(heads):
                    for t in range(begin, begin + count):
                        vec = exact.decode_to(payload[at:at + vb], b"", out_dtype)
                        at += vb
                        o = t * row + hd * d * es
                        out[o:o + d * es] = vec
    return h, tensors


# ---------------------------------------------------------------- safetensors output


def json_string(b):
    """JSON string of UTF-8 bytes: quote, backslash and control bytes escaped, the rest as is."""
    short = {0x22: b'\\"', 0x5C: b"\\\\", 0x08: b"\\b", 0x0C: b"\\f", 0x0A: b"\\n",
             0x0D: b"\\r", 0x09: b"\\t"}
    out = bytearray(b'"')
    for ch in b:
        if ch in short:
            out += short[ch]
        elif ch < 0x20:
            out += b"\\u%04x" % ch
        else:
            out.append(ch)
    out += b'"'
    return bytes(out)


def safetensors_bytes(h, tensors, out_dtype):
    name = {F32: b"F32", F16: b"F16", BF16: b"BF16"}[out_dtype]
    entries = {b"__metadata__": b'{"format":"tqkv-kv-cache","model":' + json_string(h["model"]) + b"}"}
    offset = 0
    for l in range(h["layers"]):
        n = layer_tokens(h, l)
        nbytes = n * h["kv_heads"] * h["head_dim"] * DTYPE_SIZE[out_dtype]
        for kv in (b"k", b"v"):
            entries[b"layers.%d.%s" % (l, kv)] = (
                b'{"data_offsets":[%d,%d],"dtype":"%s","shape":[%d,%d,%d]}'
                % (offset, offset + nbytes, name, n, h["kv_heads"], h["head_dim"]))
            offset += nbytes
    text = b"{" + b",".join(json_string(k) + b":" + entries[k] for k in sorted(entries)) + b"}"
    text += b" " * (-(8 + len(text)) % 8)
    data = b"".join(bytes(tensors[(l, kv)]) for l in range(h["layers"]) for kv in (0, 1))
    return struct.pack("<Q", len(text)) + text + data


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--dtype", default="f16", choices=sorted(DTYPE_NAMES))
    args = ap.parse_args()
    out_dtype = DTYPE_NAMES[args.dtype]
    with open(args.input, "rb") as f:
        data = f.read()
    try:
        h, tensors = decode_container(data, out_dtype)
    except (Corrupt, struct.error) as e:
        print("%s: not a valid container: %s" % (args.input, e), file=sys.stderr)
        return 1
    with open(args.output, "wb") as f:
        f.write(safetensors_bytes(h, tensors, out_dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
