"""clharness stream-plot: figures 2 and 4 of the STF paper to a PNG."""
import numpy as np

from clharness.cli import main
from clharness.benchmarks.stf.plots import draw_streams


def test_stream_plot_writes_a_png(tmp_path, capsys):
    out = tmp_path / "fig" / "stream.png"
    assert main(["stream-plot", "--classes", "6", "--per-class", "100", "--tasks", "3", "--chunks", "50",
                 "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "600 instances, 6 classes, 3 tasks vs mu_sigma = 0.09623" in capsys.readouterr().out


def test_panels_hold_figure_2_and_figure_4():
    labels = np.repeat(np.arange(6), 600)
    fig = draw_streams(labels, tasks=3, mu_sigma=0.05, seed=0, chunks=50)
    (dis_freq, stf_freq), (dis_top, stf_top) = fig.axes[:2], fig.axes[2:]
    assert len(fig.axes) == 4
    for ax in (dis_freq, stf_freq):                # figure 2: one stacked band per class over the chunks
        assert len(ax.collections) == 6
    for ax in (dis_top, stf_top):                  # figure 4: one point per chunk
        (line,) = ax.get_lines()
        assert len(line.get_xdata()) == 50
    dis, stf = dis_top.get_lines()[0].get_ydata(), stf_top.get_lines()[0].get_ydata()
    # disjoint tasks of 2 balanced classes: the top class holds about half of every chunk;
    # the STF stream's concentration varies much more over time
    assert 0.5 <= np.median(dis) < 0.6
    assert np.std(stf) > 2 * np.std(dis)


def test_bad_values_exit_2_naming_the_value(tmp_path, capsys):
    assert main(["stream-plot", "--mu-sigma", "0.7", "--out", str(tmp_path / "x.png")]) == 2
    assert "mu_sigma = 0.7 is outside (0, 0.5]" in capsys.readouterr().err
    assert main(["stream-plot", "--classes", "1", "--out", str(tmp_path / "x.png")]) == 2
    assert "needs at least 2 classes" in capsys.readouterr().err
    assert main(["stream-plot", "--dataset", "nope", "--out", str(tmp_path / "x.png")]) == 2
    assert "unknown dataset 'nope'; known: " in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_stream_plot_of_a_registered_dataset(tmp_path, capsys):
    assert main(["stream-plot", "--dataset", "digits", "--chunks", "100", "--out", str(tmp_path / "d.png")]) == 0
    assert "1257 instances, 10 classes, 5 tasks" in capsys.readouterr().out
