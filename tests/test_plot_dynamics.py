"""ebpo_verl.recipes.plot_dynamics: every run in a legend is drawn (one logged step as a marker); integer step ticks."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ebpo_verl.recipes import plot_dynamics  # noqa: E402


def test_one_step_run_is_drawn_as_a_marker_and_ticks_are_integers():
    runs = {
        "long": {1: {"actor/grad_norm": 0.5}, 2: {"actor/grad_norm": 0.7}, 3: {"actor/grad_norm": 0.6}},
        "one step": {2: {"actor/grad_norm": 1.4}},
        "other metric only": {1: {"actor/entropy": 0.3}},
    }
    fig, ax = plt.subplots()
    try:
        plot_dynamics._draw(ax, runs, "actor/grad_norm", window=1)
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == {"long", "one step"}  # a run without the metric is neither drawn nor listed
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == ["long", "one step"]
        one = lines["one step"]
        assert list(one.get_xdata()) == [2] and list(one.get_ydata()) == [1.4]
        assert one.get_marker() == "o"  # a single point is visible only as a marker
        assert lines["long"].get_marker() in ("None", None, "")
        ax.set_xlim(1, 3)
        fig.canvas.draw()
        ticks = [t for t in ax.get_xticks() if 1 <= t <= 3]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks  # no 1.5, 2.5
    finally:
        plt.close(fig)


def test_panels_name_their_metric_and_legends_are_readable(tmp_path):
    """Every panel has a y-axis label and a legend of at least 9 pt; the figure names each run's provenance."""
    from ebpo_verl.ops.metrics_log import MetricsLog
    from ebpo_verl.ops.provenance import describe_hardware, provenance, short_commit

    runs = {"a": {1: {"actor/grad_norm": 0.5, "ebpo/shrinkage_mean": 0.2}}, "b": {1: {"actor/grad_norm": 0.7}}}
    for key, want in (("actor/grad_norm", "gradient norm"), ("ebpo/shrinkage_mean", "shrinkage_mean")):
        fig, ax = plt.subplots()
        try:
            plot_dynamics._draw(ax, runs, key, window=1)
            assert ax.get_ylabel() == want
            assert all(t.get_fontsize() >= 9 for t in ax.get_legend().get_texts())
        finally:
            plt.close(fig)
    record = provenance(seed=1)
    log = MetricsLog(tmp_path / "m.jsonl", 0, record)
    log.log({"actor/grad_norm": 0.5}, step=1)
    (tmp_path / "old.jsonl").write_text('{"step": 1, "data": {"actor/grad_norm": 0.4}}\n')
    note = plot_dynamics.provenance_note({"new": str(tmp_path / "m.jsonl"), "old": str(tmp_path / "old.jsonl")})
    assert note.splitlines() == [
        f"new: ebpo-verl commit {short_commit(record)}; {describe_hardware(record)}",
        "old: provenance not recorded",
    ]


def test_a_400_digit_value_is_dropped_a_400_digit_step_refused_and_a_malformed_sidecar_read_as_unknown(
    tmp_path, capsys
):
    """Before: OverflowError from make_tables.finite_number (and matplotlib) on a 400-digit value or step, and
    AttributeError from short_commit on a sidecar whose ebpo_verl is a string."""
    from ebpo_verl.ops.errors import MESSAGE_LIMIT

    huge = "9" * 400
    log = tmp_path / "m.jsonl"
    log.write_text(
        '{"step": 1, "data": {"actor/grad_norm": 0.5}}\n{"step": 2, "data": {"actor/grad_norm": ' + huge + "}}\n"
        '{"step": 3, "data": {"actor/grad_norm": 0.25}}\n'
    )
    (tmp_path / "m.jsonl.provenance.json").write_text('{"attempts": [{"resumed_step": 0, "provenance": '
                                                      '{"ebpo_verl": "abc", "hardware": [1]}}]}')  # fmt: skip
    assert plot_dynamics.series({1: {"x": 0.5}, 2: {"x": int(huge)}, 3: {"x": 0.25}}, "x") == ([1, 3], [0.5, 0.25])
    assert plot_dynamics.main([str(log), "--out", str(tmp_path / "out")]) == 0
    assert plot_dynamics.provenance_note({"m": str(log)}) == "m: ebpo-verl commit unknown; unknown"
    log.write_text('{"step": ' + huge + ', "data": {"actor/grad_norm": 0.5}}\n{"step": 1, "data": {}}\n')
    assert plot_dynamics.main([str(log), "--out", str(tmp_path / "out2")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "step must be an integer in [0, 2**63)" in err and len(err) <= 400, err
    assert len(err.removeprefix("plot_dynamics: error: ")) <= MESSAGE_LIMIT
