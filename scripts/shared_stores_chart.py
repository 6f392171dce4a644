#!/usr/bin/env python3
"""Grouped bar chart (SVG) of restore FP16-equivalent GB/s per store, from `tqkv-bench restore` JSONs.

usage: shared_stores_chart.py OUT.svg LABEL=FILE.json [LABEL=FILE.json ...]
"""
import json
import sys

COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    out, pairs = argv[1], [a.split("=", 1) for a in argv[2:]]
    stores = [label for label, _ in pairs]
    cells, value = [], {}
    for label, path in pairs:
        with open(path) as f:
            for r in json.load(f)["results"]:
                cell = f'{r["codec"]} {r["tokens"]}'
                if cell not in cells:
                    cells.append(cell)
                value[(cell, label)] = r["fp16_gbps_aggregate"]
    top = max(value.values()) * 1.15
    w, h, left, bottom, plot_h = 900, 380, 70, 60, 260
    group_w = (w - left - 20) / len(cells)
    bar_w = group_w * 0.8 / len(stores)
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
         f'<rect width="{w}" height="{h}" fill="white"/>',
         f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="15" font-weight="bold">'
         'Restore speed per store (FP16-equivalent GB/s, all workers)</text>']
    y0 = h - bottom
    for i in range(6):
        v = top * i / 5
        y = y0 - plot_h * i / 5
        s.append(f'<line x1="{left}" x2="{w - 20}" y1="{y}" y2="{y}" stroke="#ddd"/>')
        s.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{v:.1f}</text>')
    for g, cell in enumerate(cells):
        x0 = left + g * group_w + group_w * 0.1
        for k, store in enumerate(stores):
            v = value.get((cell, store))
            if v is None:
                continue
            bh = plot_h * v / top
            s.append(f'<rect x="{x0 + k * bar_w:.1f}" y="{y0 - bh:.1f}" width="{bar_w - 2:.1f}" '
                     f'height="{bh:.1f}" fill="{COLORS[k % len(COLORS)]}"><title>{store} {cell}: '
                     f'{v:.2f} GB/s</title></rect>')
        s.append(f'<text x="{left + (g + 0.5) * group_w}" y="{y0 + 18}" text-anchor="middle">'
                 f'{cell} tokens</text>')
    s.append(f'<line x1="{left}" x2="{w - 20}" y1="{y0}" y2="{y0}" stroke="black"/>')
    for k, store in enumerate(stores):
        x = left + 10 + k * 200
        s.append(f'<rect x="{x}" y="{h - 24}" width="12" height="12" fill="{COLORS[k % len(COLORS)]}"/>')
        s.append(f'<text x="{x + 18}" y="{h - 14}">{store}</text>')
    s.append('</svg>')
    with open(out, "w") as f:
        f.write("\n".join(s) + "\n")


if __name__ == "__main__":
    main(sys.argv)
