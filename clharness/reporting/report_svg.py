"""Grouped bar charts as inline SVG for the families' HTML report sections (issue 19 part 1).

A bar chart is a few hundred bytes of plain SVG: it needs no JavaScript, scales without blur, and
keeps its numbers readable by a script (each bar carries them as ``data-*`` attributes) and by a
person (each bar's ``<title>`` is its tooltip). Bars may be negative (an effect, a difference):
the value axis always includes zero. Used by the M2I effect bars and CLDyB's CC/random/held-out bars.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Sequence


@dataclass(frozen=True)
class Bar:
    value: float                 # NaN = no value: a grey "n/a" at zero instead of a bar
    ci: float = 0.0              # half-width of the confidence interval; 0 or NaN = none drawn
    color: str = "#4c72b0"
    series: str = ""             # the bar's name inside its group (a legend entry)
    data: dict = field(default_factory=dict)   # extra data-* attributes


def nice_ticks(lo: float, hi: float, target: int = 4) -> list[float]:
    """Round tick values spanning [lo, hi]: steps of 1, 2, 2.5 or 5 times a power of ten."""
    raw = (hi - lo) / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9)
    return [round(k * step, 10) for k in range(first, math.floor(hi / step + 1e-9) + 1)]


def bar_chart(groups: Sequence[tuple[str, Sequence[Bar]]], title: str, ylabel: str,
              legend: Sequence[tuple[str, str]] = (), height: int = 230, bar_width: int = 16) -> str:
    """One ``<svg>``: a group of bars per entry of ``groups`` ((label, bars)), error bars for the
    CIs, a zero line, a y axis with round ticks, and an optional legend ((name, colour))."""
    bars = [b for _, group in groups for b in group]
    ends = [v for b in bars if not math.isnan(b.value)
            for v in (b.value - _ci(b), b.value + _ci(b))]
    lo, hi = min([0.0, *ends]), max([0.0, *ends])
    if hi - lo < 1e-12:
        hi = lo + 1.0
    ticks = nice_ticks(lo, hi)
    lo, hi = min(lo, ticks[0]), max(hi, ticks[-1])
    gap, left, top, bottom = 18, 48, 24, 40
    widest = max((len(g) for g, _ in groups), default=0)
    group_w = max(len(gb) for _, gb in groups) * bar_width if groups else 0
    step_w = max(group_w + gap, 6.5 * widest + 6)   # group labels (font 11) must not overlap
    legend_w = 16 + 7 * max((len(n) for n, _ in legend), default=0) if legend else 0
    width = int(left + len(groups) * step_w + 10 + legend_w)
    y = lambda v: top + (hi - v) / (hi - lo) * (height - top - bottom)  # noqa: E731
    e = _e
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
           f"font-size='11' font-family='sans-serif' role='img'><title>{e(title)}</title>",
           f"<text x='{left}' y='14' font-weight='bold'>{e(title)}</text>",
           f"<text transform='translate(11 {(top + height - bottom) / 2:.0f}) rotate(-90)' text-anchor='middle' "
           f"fill='#444'>{e(ylabel)}</text>"]
    for t in ticks:
        out.append(f"<line x1='{left - 3}' x2='{left + len(groups) * step_w:.0f}' y1='{y(t):.1f}' y2='{y(t):.1f}' "
                   f"stroke='{'#666' if t == 0 else '#e4e4ea'}'/>"
                   f"<text x='{left - 5}' y='{y(t) + 4:.1f}' text-anchor='end' fill='#555' font-size='10'>{t:g}</text>")
    for g, (label, group) in enumerate(groups):
        x0 = left + g * step_w + (step_w - len(group) * bar_width) / 2
        for k, b in enumerate(group):
            x = x0 + k * bar_width
            attrs = "".join(f" data-{e(key)}='{e(val)}'" for key, val in
                            {"group": label, "series": b.series, **b.data}.items())
            if math.isnan(b.value):
                out.append(f"<text class='bar-missing'{attrs} x='{x + bar_width / 2:.1f}' y='{y(0) - 3:.1f}' "
                           f"text-anchor='middle' fill='#999' font-size='8'>n/a</text>")
                continue
            y0, y1 = sorted((y(0), y(b.value)))
            tip = f"{label} {b.series}: {b.value:.3f}" + (f" ± {b.ci:.3f}" if _ci(b) else "")
            out.append(f"<rect class='bar'{attrs} data-value='{b.value:.4f}' data-ci='{_ci(b):.4f}' "
                       f"x='{x + 1:.1f}' y='{y0:.1f}' width='{bar_width - 2}' height='{max(y1 - y0, 0.5):.1f}' "
                       f"fill='{b.color}'><title>{e(tip)}</title></rect>")
            if _ci(b):
                cx, ya, yb = x + bar_width / 2, y(b.value - b.ci), y(b.value + b.ci)
                out.append(f"<path d='M{cx:.1f} {ya:.1f}V{yb:.1f}M{cx - 3:.1f} {ya:.1f}h6M{cx - 3:.1f} {yb:.1f}h6' "
                           f"stroke='#222' fill='none'/>")
        out.append(f"<text x='{left + (g + 0.5) * step_w:.1f}' y='{height - bottom + 15}' text-anchor='middle'>"
                   f"{e(label)}</text>")
    lx = left + len(groups) * step_w + 14
    for k, (name, color) in enumerate(legend):
        out.append(f"<rect x='{lx:.0f}' y='{top + 16 * k}' width='10' height='10' fill='{color}'/>"
                   f"<text x='{lx + 14:.0f}' y='{top + 16 * k + 9}'>{e(name)}</text>")
    out.append("</svg>")
    svg = "".join(out)
    from .plots import export_svg   # a report exporting its figures (--clh-figures) gets this one as SVG
    export_svg(svg, title)
    return svg


def spread_labels(ys: Sequence[float], gap: float, top: float) -> list[float]:
    """Label baselines (SVG y, growing downwards) moved apart so that any two are at least ``gap``
    apart, in the points' order, none above ``top``: labels of close scores (GTEP's slope plot)
    otherwise print over each other. Labels that would overlap form a block centred on its points,
    and blocks merge until none overlap (a label as near its point as the others allow)."""
    blocks: list[list[int]] = []   # runs of label indices, in order
    start = lambda block: max(top, sum(ys[i] for i in block) / len(block) - (len(block) - 1) * gap / 2)  # noqa: E731
    for i in sorted(range(len(ys)), key=lambda i: ys[i]):
        blocks.append([i])
        while len(blocks) > 1 and start(blocks[-2]) + len(blocks[-2]) * gap > start(blocks[-1]):
            last = blocks.pop()
            blocks[-1] += last
    out = [0.0] * len(ys)
    for block in blocks:
        for k, i in enumerate(block):
            out[i] = start(block) + k * gap
    return out


def text_width(text: str, font_size: float = 11) -> float:
    """A generous width estimate of sans-serif text (0.62 em a character): room to reserve for a label."""
    return 0.62 * font_size * len(text)


def hex_color(rgba) -> str:
    """A matplotlib RGBA tuple (plots.method_colors) as #rrggbb."""
    return "#" + "".join(f"{int(round(255 * c)):02x}" for c in rgba[:3])


def _ci(bar: Bar) -> float:
    return 0.0 if bar.ci is None or math.isnan(bar.ci) else float(bar.ci)


def _e(text) -> str:
    return html.escape(str(text), quote=True)
