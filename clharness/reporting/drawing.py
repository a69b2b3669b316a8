"""The report's ``clharness.kinds.Drawing``: what the families' HTML sections draw with, handed to them
by the report (``kinds.report_sections(..., drawing=DRAWING)``) so that no family imports this layer.
Each member is the page's own (plots.py, report_svg.py): a family's figure gets the page's colours
(``plots.page_palette``) and goes to its figure folder (``plots.export_figures``). matplotlib loads on
the first member that needs it, not when the report's text formats import this module."""
from __future__ import annotations

from . import report_svg


class ReportDrawing:
    """``clharness.kinds.Drawing`` over ``plots`` and ``report_svg`` (tests/test_layers.py checks that it
    has every member the contract lists, with the contract's parameters)."""

    Bar = report_svg.Bar

    @property
    def DPI(self) -> int:   # noqa: N802  (the contract's name, plots.DPI)
        from . import plots
        return plots.DPI

    def method_colors(self, methods) -> dict[str, tuple]:
        from . import plots
        return plots.method_colors(methods)

    def hex_color(self, rgba) -> str:
        return report_svg.hex_color(rgba)

    def to_img(self, fig, alt: str, tight: bool = True) -> str:
        from . import plots
        return plots.to_img(fig, alt, tight)

    def export_svg(self, svg: str, alt: str) -> None:
        from . import plots
        plots.export_svg(svg, alt)

    def radar_figure(self, labels, values, colors):
        from . import plots
        return plots.radar_figure(labels, values, colors)

    def bar_chart(self, groups, title: str, ylabel: str, legend=(), height: int = 230, bar_width: int = 16) -> str:
        return report_svg.bar_chart(groups, title, ylabel, legend=legend, height=height, bar_width=bar_width)

    def spread_labels(self, ys, gap: float, top: float) -> list[float]:
        return report_svg.spread_labels(ys, gap, top)

    def text_width(self, text: str, font_size: float = 11) -> float:
        return report_svg.text_width(text, font_size)

    def mean_band(self, values, confidence: float = 0.95) -> tuple:
        from . import plots
        return plots.mean_band(values, confidence)

    def mean_matrix(self, records):
        from . import plots
        return plots.mean_matrix(records)


DRAWING = ReportDrawing()
