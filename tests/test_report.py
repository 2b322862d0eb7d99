"""The report: PNGs from metrics.jsonl, skipped topics, the group-success plots, the CLI, and
the rows it reads being the ablation's."""

import io
import json
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.collections import QuadMesh
from PIL import Image

from rlvr_jax import report
from rlvr_jax.program.evals import plots
from rlvr_jax.program.runtime import metrics as metrics_lib
from rlvr_jax.program.studies import ablation_stats


def _write(workdir, entries):
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "metrics.jsonl", "w") as f:
        for e in entries:
            f.write(json.dumps(e) + "\n")


def _full_run(steps: int = 6, hist: bool = True) -> list[dict]:
    entries = []
    for s in range(1, steps + 1):
        e = {
            "step": s,
            "time": 1000.0 + s,
            "reward/mean": 0.1 * s,
            "accuracy": 0.1 * s,
            "length/mean": 50.0 + s,
            "length/p95": 90.0,
            "length/correct": 40.0,
            "length/incorrect": 60.0,
            "kl/mean": 1e-4 * s if s > 1 else 0.0,
            "clip/frac_low": 0.01,
            "clip/frac_high": None,  # a non-finite value written as null
            "entropy/mean": 1.5,
            "time/rollout": 2.0,
            "time/update": 1.0,
            "adv/frac_all_correct": 0.1,
            "adv/frac_all_wrong": 0.5,
            "useful/per_hour": 3600.0 * s,
        }
        if hist:
            e["groups/success_hist"] = [s, 1, 0, 6 - s, 0]
        entries.append(e)
    return entries


def test_every_plot_is_a_png(tmp_path):
    _write(tmp_path, _full_run())
    notes = []
    written = plots.make_report(tmp_path, window=3, log=notes.append)
    assert set(written) == {
        "reward",
        "length",
        "kl",
        "clip",
        "entropy",
        "timing",
        "useful",
        "groups",
    }
    for path in written.values():
        assert path.parent == tmp_path / "plots"
        with Image.open(path) as img:
            assert img.format == "PNG" and img.size == (700, 400)
    assert notes == [f"report: wrote 8 plots of 6 steps to {tmp_path / 'plots'}"]


def test_missing_metrics_skip_their_plot_with_a_note(tmp_path, capsys):
    _write(tmp_path, [{"step": s, "time": 0.0, "reward/mean": 0.5} for s in range(3)])
    written = plots.make_report(tmp_path, out_dir=tmp_path / "out")
    assert set(written) == {"reward"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["reward.png"]
    out = capsys.readouterr().out
    for name in ("length", "kl", "clip", "entropy", "timing", "useful", "groups"):
        assert f"skipping {name}.png" in out
    assert "no metric among ['kl/mean']" in out
    assert "no metric among ['time/*']" in out
    assert "no metric among ['useful/per_hour']" in out


def test_useful_trajectories_per_hour_is_plotted_over_steps():
    fig = plots.report_figures(_full_run(steps=4))["useful"]
    (line,) = fig.axes[0].get_lines()
    assert line.get_label() == "useful/per_hour"
    np.testing.assert_array_equal(line.get_xdata(), [1, 2, 3, 4])
    np.testing.assert_allclose(line.get_ydata(), [3600.0, 7200.0, 10800.0, 14400.0])


def test_success_histogram_heat_map_holds_fractions():
    fig = plots.group_figure(_full_run(steps=3))
    (mesh,) = [c for c in fig.axes[0].collections if isinstance(c, QuadMesh)]
    fractions = np.asarray(mesh.get_array()).reshape(5, 3)
    expected = np.array([[1, 1, 0, 5, 0], [2, 1, 0, 4, 0], [3, 1, 0, 3, 0]]).T / 7
    np.testing.assert_allclose(fractions, expected)


def test_without_histogram_the_outcome_fractions_are_stacked():
    fig = plots.group_figure(_full_run(steps=4, hist=False))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "all wrong",
        "mixed",
        "all correct",
    ]
    # The top of the stack is 1: wrong 0.5 + mixed 0.4 + correct 0.1.
    top = ax.collections[-1].get_paths()[0].vertices[:, 1]
    assert np.isclose(top.max(), 1.0)
    assert plots.group_figure([{"step": 1, "adv/frac_all_wrong": 0.5}]).startswith("no ")


def test_line_figure_draws_present_keys_and_smooths():
    entries = [{"step": s, "length/mean": float(s), "length/p95": None} for s in range(1, 5)]
    spec = plots.LINE_PLOTS[1]
    fig = plots.line_figure(entries, spec)
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["length/mean", "length/p95"]
    assert np.isnan(ax.get_lines()[1].get_ydata()).all()
    np.testing.assert_allclose(
        plots.smooth(np.array([1.0, np.nan, 3.0, 5.0]), 2), [1.0, 1.0, 3.0, 4.0]
    )


def test_empty_workdir_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plots.make_report(tmp_path)


def test_command_line(tmp_path):
    _write(tmp_path, _full_run(steps=2, hist=False))
    result = subprocess.run(
        [sys.executable, "-m", "rlvr_jax.report", "--workdir", str(tmp_path), "--smooth", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "wrote 8 plots of 2 steps" in result.stdout
    assert (tmp_path / "plots" / "groups.png").exists()
    with pytest.raises(SystemExit):
        report.main(["--workdir", str(tmp_path), "--smooth", "0"])


def test_report_and_ablation_read_the_same_rows(tmp_path):
    """A run stopped at step 3 (its final evaluation written there), resumed from its step-3
    checkpoint and run to 5: the report plots, and the ablation counts, each step row once."""
    accuracy = {1: 0.25, 2: 0.5, 3: 0.75, 4: 0.5, 5: 1.0}

    def step(i):
        return {
            "accuracy": accuracy[i],
            "time/step": 2.0,
            "adv/frac_zero_variance": 0.5,
            "useful/trajectories": 4.0 * i,
        }

    quiet = dict(use_tensorboard=False, stream=io.StringIO())
    with metrics_lib.MetricsWriter(tmp_path, **quiet) as w:
        w.write(0, {"eval/accuracy": 0.25, "eval/length": 3.0}, record="eval")
        for i in (1, 2, 3):
            w.write(i, step(i))
        w.write(3, {"eval/accuracy": 0.5, "eval/length": 3.0}, record="final")
    with metrics_lib.MetricsWriter(tmp_path, resume_step=3, **quiet) as w:
        for i in (4, 5):
            w.write(i, step(i))
        w.write(5, {"eval/accuracy": 0.75, "eval/length": 2.0}, record="final")

    records = metrics_lib.read_metrics(tmp_path)
    fig = plots.report_figures(records)["reward"]
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "accuracy"]
    np.testing.assert_array_equal(line.get_xdata(), [1, 2, 3, 4, 5])
    np.testing.assert_allclose(line.get_ydata(), [accuracy[i] for i in range(1, 6)])
    result = {
        "rows_per_step": 4,
        "eval_before": metrics_lib.initial_eval(records),
        "eval_after": metrics_lib.final_eval(records),
    }
    stats = ablation_stats.run_stats(records, result)
    assert stats["successes"] == pytest.approx(4 * sum(line.get_ydata()))
    assert stats["acc_after"] == 0.75
    # Steps 2..5 timed (step 1 carries the compilation): 4 * (0.5 + 0.75 + 0.5 + 1) in 8 s.
    assert stats["successes_per_minute"] == pytest.approx(60 * 11 / 8)
    # The same steps' useful trajectories, 4 * (2 + 3 + 4 + 5), in the same 8 s.
    assert stats["useful_per_hour"] == pytest.approx(3600 * 56 / 8)
    notes = []
    plots.make_report(tmp_path, log=notes.append)
    assert notes[-1].startswith("report: wrote 2 plots of 5 steps")
