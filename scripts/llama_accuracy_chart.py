#!/usr/bin/env python3
"""Mean KL (log scale) against bits per value, one panel per llama_migrate.py JSON (a model, prompt
and N), one marker per configuration: tqkv presets (key means by default, off, exact tokens) and
llama.cpp's own KV cache types. Written by hand as SVG (no plotting library needed).

    scripts/llama_accuracy_chart.py OUT.svg 'TITLE=run.json' ['TITLE=run2.json' ...]
    scripts/llama_accuracy_chart.py --markdown run.json     # the tables of docs/lab/accuracy-log.md
    scripts/llama_accuracy_chart.py --summary run.json      # tq3/tq4 floors, tqkv vs q4_0/q5_0
    scripts/llama_accuracy_chart.py --seeds run.json ...    # one row per codec over its rotation seeds

A panel may join runs of the same model, prompt and N: 'TITLE=a.json+b.json'.

Rows with KL 0 (the exact fp16 session) cannot sit on a log axis and are left out; the
"f16 + flash attention" control of --llama-kv is drawn as a dashed line: llama.cpp's own
difference between two exact attention kernels, below which a codec's error is noise.
"""

import json
import math
import statistics
import sys
from collections import Counter
from xml.sax.saxutils import escape

W, H = 470, 350            # one panel
ML, MR, MT, MB = 62, 14, 58, 46
X_MIN, X_MAX = 1.5, 9.0    # bits per value
STYLES = {                 # kind -> (shape, fill, stroke, legend)
    "tqkv": ("circle", "#1f77b4", "#1f77b4", "tqkv, key means, no exact tokens"),
    "tqkv-km-off": ("triangle", "white", "#1f77b4", "tqkv, key means off"),
    "tqkv-exact": ("square", "#2ca02c", "#2ca02c", "tqkv, exact tokens 4,128"),
    "tqkv-sinks": ("square", "white", "#2ca02c", "tqkv, first tokens exact (4,0 or 1,0)"),
    "tqkv-recent": ("circle", "#17becf", "#17becf", "tqkv, last tokens exact (0,4: the default)"),
    "tqkv-km-session": ("triangle", "#9467bd", "#9467bd", "tqkv, one key mean per session"),
    "tqkv-kv": ("square", "#ff7f0e", "#ff7f0e", "tqkv, separate K/V codecs (k4v2 ...)"),
    "tqkv-auto": ("circle", "white", "#ff7f0e", "tqkv, bit allocator (auto:B)"),
    "tqkv-kl": ("diamond", "#e377c2", "#e377c2", "tqkv, transform codec kl:B (last tokens exact)"),
    "llama.cpp": ("diamond", "#d62728", "#d62728", "llama.cpp KV type (flash attention)"),
}


TQ_PRESETS = {"tq2", "tq2.5", "tq3", "tq3.5", "tq4", "tq5"}


def style_of(row):
    if row.get("kind") == "llama.cpp":
        return "llama.cpp"
    spec = row.get("spec", row["codec"])
    if spec.startswith("auto"):
        return "tqkv-auto"
    if "kl:" in spec:
        return "tqkv-kl"
    if row.get("exact_tokens"):  # "F,L": only the first tokens (attention sinks) when L is 0
        if row["exact_tokens"].endswith(",0"):
            return "tqkv-sinks"
        return "tqkv-recent" if row["exact_tokens"].startswith("0,") else "tqkv-exact"
    if spec.startswith("k") and "v" in spec:
        return "tqkv-kv"
    km = row.get("key_means", "default")
    if km == "off":
        return "tqkv-km-off"
    if km == "session":
        return "tqkv-km-session"
    return "tqkv"


def label_of(row):
    if row.get("kind") == "llama.cpp":
        return row["llama_kv_type"]
    spec = row.get("spec", row["codec"])
    if row.get("exact_tokens"):
        exact = row["exact_tokens"]
        return spec + "+exact" + ("" if exact == "4,128" else " " + exact)
    if row.get("key_means") in ("off", "session"):
        return f'{spec} km {row["key_means"]}'
    return spec


def place(x, y, width, taken, x_lo, x_hi):
    """A label position near the marker at (x, y) that overlaps no earlier label or marker."""
    for dx, dy, anchor in ((7, -5, "start"), (7, 13, "start"), (-7, -5, "end"), (-7, 13, "end"),
                           (7, -17, "start"), (7, 25, "start")):
        x0 = x + dx if anchor == "start" else x + dx - width
        box = (x0, y + dy - 9, x0 + width, y + dy + 2)
        if box[0] >= x_lo and box[2] <= x_hi and all(box[2] < b[0] or box[0] > b[2] or box[3] < b[1] or box[1] > b[3] for b in taken):
            taken.append(box)
            return x + dx, y + dy, anchor
    return x + 7, y - 5, "start"


def marker(shape, x, y, fill, stroke, r=4.5):
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>'
    if shape == "square":
        return (f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r}" height="{2 * r}" '
                f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>')
    if shape == "triangle":
        pts = f"{x:.1f},{y - r - 1:.1f} {x - r - 0.5:.1f},{y + r:.1f} {x + r + 0.5:.1f},{y + r:.1f}"
    else:  # diamond
        pts = f"{x:.1f},{y - r - 1.5:.1f} {x + r + 1:.1f},{y:.1f} {x:.1f},{y + r + 1.5:.1f} {x - r - 1:.1f},{y:.1f}"
    return f'<polygon points="{pts}" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>'


def panel(title, report, ox, oy, y_lo, y_hi):
    out = [f'<g transform="translate({ox},{oy})">',
           f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="13" font-weight="bold">'
           f'{escape(title)}</text>']
    pw, ph = W - ML - MR, H - MT - MB

    def px(b):
        return ML + (b - X_MIN) / (X_MAX - X_MIN) * pw

    def py(kl):
        return MT + (y_hi - math.log10(kl)) / (y_hi - y_lo) * ph

    out.append(f'<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    for b in range(2, int(X_MAX) + 1):
        x = px(b)
        out.append(f'<line x1="{x:.1f}" y1="{MT}" x2="{x:.1f}" y2="{MT + ph}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{MT + ph + 15}" text-anchor="middle" font-size="11">{b}</text>')
    for e in range(y_lo, y_hi + 1):
        y = py(10.0 ** e)
        out.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{ML + pw}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{ML - 5}" y="{y + 4:.1f}" text-anchor="end" font-size="11">1e{e}</text>')
    out.append(f'<text x="{ML + pw / 2}" y="{H - 10}" text-anchor="middle" font-size="11">'
               'bits per value (all bytes counted)</text>')
    out.append(f'<text x="14" y="{MT + ph / 2}" text-anchor="middle" font-size="11" '
               f'transform="rotate(-90 14 {MT + ph / 2})">mean KL vs f16 (log)</text>')
    for row in report["results"]:
        if row.get("llama_kv_type") == "f16":  # the control: a line
            y = py(max(row["kl_mean"], 10.0 ** y_lo))
            out.append(f'<line x1="{ML}" y1="{y:.1f}" x2="{ML + pw}" y2="{y:.1f}" stroke="#d62728" '
                       'stroke-dasharray="5,4"/>')
            out.append(f'<text x="{ML + pw - 4}" y="{y - 4:.1f}" text-anchor="end" font-size="10" '
                       f'fill="#d62728">f16 + flash attention: {row["kl_mean"]:.2g}</text>')
    points = []
    for row in report["results"]:
        if row["kl_mean"] <= 0 or row.get("llama_kv_type") == "f16":
            continue
        b = row["bits_per_value"]
        if X_MIN <= b <= X_MAX:
            points.append((px(b), py(max(row["kl_mean"], 10.0 ** y_lo)), row))
    taken = [(x - 6, y - 6, x + 6, y + 6) for x, y, _ in points]
    # Two curves, joined by bits: kl:B and TurboQuant's tqN with the default settings.
    for kind, colour in (("tqkv-kl", "#e377c2"), ("tqkv-recent", "#17becf")):
        curve = sorted((x, y) for x, y, row in points if style_of(row) == kind
                       and (kind == "tqkv-kl" or row.get("spec", row["codec"]) in TQ_PRESETS))
        if len(curve) > 1:
            out.append('<polyline fill="none" stroke="%s" stroke-width="1.2" points="%s"/>' % (
                colour, " ".join(f"{x:.1f},{y:.1f}" for x, y in curve)))
    for x, y, row in points:
        shape, fill, stroke, _ = STYLES[style_of(row)]
        out.append(marker(shape, x, y, fill, stroke))
    for x, y, row in points:
        text = f'{label_of(row)} ({row["top1"]}/{report["steps"]})'
        tx, ty, anchor = place(x, y, 5.2 * len(text), taken, ML, ML + pw)
        out.append(f'<text x="{tx:.1f}" y="{ty:.1f}" font-size="9.5" fill="#333" '
                   f'text-anchor="{anchor}">{escape(text)}</text>')
    # The answer the chart is for: the best tqkv row at or under each llama.cpp type's bits.
    notes = []
    for kv in ("q4_0", "q5_0"):
        anchor = [r for r in report["results"] if r.get("llama_kv_type") == kv]
        if not anchor:
            continue
        a = anchor[0]
        ours = [r for r in report["results"] if r.get("kind") == "tqkv" and r["kl_mean"] > 0
                and r["bits_per_value"] <= a["bits_per_value"]]
        if ours:
            best = min(ours, key=lambda r: r["kl_mean"])
            notes.append(f'≤ {a["bits_per_value"]:g} bits: {best["codec"]} KL {best["kl_mean"]:.2g} '
                         f'vs {kv} {a["kl_mean"]:.2g}')
    for i, note in enumerate(notes):
        out.append(f'<text x="{ML}" y="{33 + 12 * i}" font-size="10" fill="#333">'
                   f'{escape(note)}</text>')
    out.append("</g>")
    return out


def fmt(x, digits=3):
    if x == 0:
        return "0"
    return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"


def markdown(report):
    steps = report["steps"]
    out = [f"| configuration | bits/value | top-1 /{steps} | mean KL | max KL | max \\|Δlogit\\| "
           "| K cos | .tqkv bytes | save s | load s |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["results"]:
        name = r["codec"]
        if r.get("kind") == "llama.cpp":  # its prefill, not a save: in the text
            cos = size = save = load_s = ""
        else:
            cos, size = f'{r["k_cosine_mean"]:.4f}', f'{r["tqkv_bytes"]:,}'
            save, load_s = f'{r["save_s"]:.2f}', f'{r["load_s"]:.2f}'
        out.append(f'| {name} | {r["bits_per_value"]:.2f} | {r["top1"]} | {fmt(r["kl_mean"])} | '
                   f'{fmt(r["kl_max"])} | {fmt(r["max_logit_diff"])} | {cos} | {size} | {save} '
                   f'| {load_s} |')
    return "\n".join(out)


def summary(report):
    """The floors of the key-mean issue and the anchor question, one line each."""
    steps = report["steps"]
    rows = {r["codec"]: r for r in report["results"]}
    out = [f'{report["model"]}, {report["prompt_file"]}, N = {report["prompt_tokens"]:,}, '
           f'{steps} steps, reference logits {report.get("reference_logits_sha256", "?")[:12]}']
    for codec, floor in (("tq3", steps - 1), ("tq4", steps)):
        if codec in rows:
            r = rows[codec]
            met = "met" if r["top1"] >= floor else "NOT met"
            out.append(f'- {codec} (default): {r["top1"]}/{steps} at {r["bits_per_value"]:.2f} '
                       f'bits/value, KL {fmt(r["kl_mean"])}: >= {floor}/{steps} {met}')
    for kv, budget in (("q4_0", 4.5), ("q5_0", 5.5)):
        anchor = rows.get(f"llama.cpp {kv}")
        if anchor is None:
            out.append(f"- {kv}: not measured")
            continue
        ours = [r for r in report["results"] if r.get("kind") == "tqkv" and r["kl_mean"] > 0
                and r["bits_per_value"] <= budget]
        best = min(ours, key=lambda r: r["kl_mean"]) if ours else None
        verdict = (f'best tqkv at <= {budget} bits: {best["codec"]} ({best["bits_per_value"]:.2f} '
                   f'bits) KL {fmt(best["kl_mean"])}, {best["top1"]}/{steps}: '
                   + ("lower" if best["kl_mean"] < anchor["kl_mean"] else "NOT lower")
                   if best else f"no tqkv row at <= {budget} bits")
        out.append(f'- llama.cpp {kv}: {anchor["top1"]}/{steps}, KL {fmt(anchor["kl_mean"])}; '
                   + verdict)
    return "\n".join(out)


def unseeded(row):
    """A tqkv row's configuration without its rotation seed: 'tq4' and 'tq:b=4,seed=3' are one."""
    spec = row.get("spec", row["codec"])
    head, _, mods = spec.partition(",")
    keys = {}
    if head.startswith("tq:"):
        mods = head[3:] + ("," + mods if mods else "")
    elif head.startswith("tq") and head[2:].replace(".", "", 1).isdigit():
        keys["b"] = head[2:]
    else:
        return None  # fp16, K/V or auto specs: not grouped
    for kv in filter(None, mods.split(",")):
        k, _, v = kv.partition("=")
        keys[k] = v
    keys.pop("seed", None)
    rest = ",".join(f"{k}={v}" for k, v in sorted(keys.items()) if k != "b")
    name = "tq" + keys.get("b", "3") + ("," + rest if rest else "")
    return name, row.get("key_means", "default"), row.get("exact_tokens", "")


def seeds(paths):
    """Per run and configuration, what its rotation seeds give: top-1 counts, mean KL spread and
    the steps that flip under how many seeds (a near-tie that most seeds flip is the codec's
    error, not one seed's bad luck)."""
    out = ["| run | configuration | seeds | top-1 (seeds) | mean KL min / median / max "
           "| flipped steps (ref. margin) × seeds |", "|---|---|---:|---|---|---|"]
    for path in paths:
        rep = load(path)
        groups = {}
        for row in rep["results"]:
            key = unseeded(row) if row.get("kind") == "tqkv" else None
            if key is not None:
                groups.setdefault(key, []).append(row)
        run = f'{rep["prompt_file"].rsplit("/", 1)[-1]}, N = {rep["prompt_tokens"]:,}'
        for (name, km, exact), rows in groups.items():
            if len(rows) < 2:
                continue
            top1 = Counter(r["top1"] for r in rows)
            kls = [r["kl_mean"] for r in rows]
            flips = Counter((f["step"], f["ref_margin"]) for r in rows
                            for f in r.get("flipped_steps", []))
            flips_s = ", ".join(f"{st} ({m:.2f}) × {n}" for (st, m), n in
                                sorted(flips.items(), key=lambda kv: (-kv[1], kv[0][0])))
            conf = name + ("" if km == "default" else f" km {km}") + (f" +exact {exact}" if exact else "")
            out.append(f"| {run} | {conf} | {len(rows)} | "
                       + ", ".join(f"{t}/{rep['steps']}: {n}" for t, n in sorted(top1.items(), reverse=True))
                       + f" | {fmt(min(kls))} / {fmt(statistics.median(kls))} / {fmt(max(kls))} "
                       f"| {flips_s or 'none'} |")
    return "\n".join(out)


def load(paths):
    """One report from 'a.json+b.json': runs of the same model, prompt and N (the same reference
    logits: where both runs record their hash, it must match); a configuration measured in both
    is taken from the first (by name, or by its settings and size where two runs named it
    differently)."""
    reports = []
    for path in paths.split("+"):
        with open(path) as f:
            reports.append(json.load(f))
    merged, seen = dict(reports[0]), set()
    merged["results"] = []
    for rep in reports:
        for key in ("model", "prompt_sha256", "prompt_tokens", "steps", "n_batch",
                    "reference_logits_sha256"):
            if rep.get(key) != reports[0].get(key) and not (
                    key == "reference_logits_sha256" and None in (rep.get(key), reports[0].get(key))):
                sys.exit(f"{paths}: the runs differ in {key}")
        for row in rep["results"]:
            # The same configuration under two names (tq3 and tq3@exact=0:0) is one marker.
            same = (row.get("kind"), row.get("spec", row["codec"]), row.get("key_means"),
                    row.get("exact_tokens", ""), round(row.get("bits_per_value", 0), 3))
            if row["codec"] not in seen and same not in seen:
                seen.update((row["codec"], same))
                merged["results"].append(row)
    return merged


def main(argv):
    if len(argv) == 3 and argv[1] == "--markdown":
        print(markdown(load(argv[2])))
        return
    if len(argv) == 3 and argv[1] == "--summary":
        print(summary(load(argv[2])))
        return
    if len(argv) >= 3 and argv[1] == "--seeds":
        print(seeds(argv[2:]))
        return
    if len(argv) < 3:
        sys.exit(__doc__)
    panels = []
    for arg in argv[2:]:
        title, _, paths = arg.rpartition("=")
        panels.append((title or paths, load(paths)))
    kls = [r["kl_mean"] for _, rep in panels for r in rep["results"] if r["kl_mean"] > 0]
    y_lo = math.floor(math.log10(min(kls)))
    y_hi = math.ceil(math.log10(max(kls)))
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    # The legend wraps: lay it out first, then size the picture to it (footer below its last row).
    legend, y, x = [], rows * H + 14, 20
    used = {style_of(r) for _, rep in panels for r in rep["results"]}
    for shape, fill, stroke, text in (v for k, v in STYLES.items() if k in used):
        legend.append(marker(shape, x, y, fill, stroke))
        legend.append(f'<text x="{x + 9}" y="{y + 4}" font-size="11">{escape(text)}</text>')
        x += 14 + 6.2 * len(text) + 18
        if x > cols * W - 200:
            x, y = 20, y + 18
    footer_y = (y if x == 20 else y + 18) + 6
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * W}" height="{footer_y + 8}" '
           'font-family="sans-serif">', f'<rect width="100%" height="100%" fill="white"/>']
    for i, (title, rep) in enumerate(panels):
        svg += panel(title, rep, (i % cols) * W, (i // cols) * H, y_lo, y_hi)
    svg += legend
    svg.append(f'<text x="20" y="{footer_y}" font-size="10" fill="#555">Lower is '
               'better; left is smaller. Labels: configuration (top-1 agreement over the steps).</text>')
    svg.append("</svg>")
    with open(argv[1], "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main(sys.argv)
