"""The metrics ledger: JSONL, TensorBoard, W&B, console, timing, resume, non-finite values."""

import io
import json
import math
import struct
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from rlvr_jax.program.runtime import metrics as metrics_lib


def _step_metrics(i: int) -> dict:
    return {
        "reward/mean": jnp.float32(0.25 * i),
        "accuracy": np.float32(0.5),
        "length/mean": jnp.asarray(100.0 + i),
        "kl/mean": 1e-3,
        "rollout/tokens": jnp.int32(1000),
        "time/step": 2.0,
        "groups/success_hist": jnp.array([3, 0, 1, 4], jnp.int32),
        "adv": {"frac_all_correct": jnp.float32(0.125)},
    }


def _strict_lines(path) -> list[dict]:
    """Parses each line as strict JSON (NaN/Infinity tokens are an error)."""

    def reject(token):
        raise ValueError(f"non-standard JSON constant {token}")

    return [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]


def _events(logdir) -> list[event_pb2.Event]:
    """Every event of every TFRecord file in `logdir` (8-byte length, 4-byte crc, data, crc)."""
    events = []
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[pos + 12 : pos + 12 + n])
            events.append(event)
            pos += 12 + n + 4
    return events


def test_jsonl_holds_every_metric_of_every_step(tmp_path):
    stream = io.StringIO()
    with metrics_lib.MetricsWriter(tmp_path, use_tensorboard=False, stream=stream) as w:
        before = time.time()
        for i in range(1, 4):
            entry = w.write(i, _step_metrics(i))
        assert entry["step"] == 3
    lines = _strict_lines(tmp_path / "metrics.jsonl")
    assert [e["step"] for e in lines] == [1, 2, 3]
    last = lines[-1]
    assert last["record"] == "step"  # write's default kind
    assert before <= last["time"] <= time.time()
    assert last["reward/mean"] == 0.75 and isinstance(last["reward/mean"], float)
    assert last["length/mean"] == 103.0
    assert last["kl/mean"] == 1e-3
    assert last["rollout/tokens"] == 1000 and isinstance(last["rollout/tokens"], int)
    assert last["groups/success_hist"] == [3.0, 0.0, 1.0, 4.0]
    assert last["adv/frac_all_correct"] == 0.125  # nested dicts are joined with "/"
    assert last["throughput/tokens_per_s"] == 500.0  # derived: 1000 tokens in 2 s
    assert metrics_lib.read_metrics(tmp_path) == lines


def test_one_device_get_per_step(tmp_path, monkeypatch):
    calls = []
    real = jax.device_get
    monkeypatch.setattr(metrics_lib.jax, "device_get", lambda x: calls.append(1) or real(x))
    with metrics_lib.MetricsWriter(tmp_path, use_tensorboard=False, stream=io.StringIO()) as w:
        w.write(1, _step_metrics(1))
        w.write(2, _step_metrics(2))
    assert len(calls) == 2


def test_nonfinite_values_are_null_and_counted(tmp_path):
    stream = io.StringIO()
    w = metrics_lib.MetricsWriter(tmp_path, use_tensorboard=True, stream=stream)
    w.write(1, {"kl/mean": jnp.float32(jnp.nan), "loss": jnp.inf, "ok": 1.0})
    w.write(2, {"kl/mean": jnp.float32(jnp.nan), "hist": np.array([1.0, np.nan]), "ok": 2.0})
    assert w.nonfinite == {"kl/mean": 2, "loss": 1, "hist": 1}
    w.close()
    lines = _strict_lines(tmp_path / "metrics.jsonl")
    assert lines[0]["kl/mean"] is None and lines[0]["loss"] is None and lines[0]["ok"] == 1.0
    assert lines[1]["hist"] == [1.0, None]
    assert "kl/mean x2" in stream.getvalue() and "loss x1" in stream.getvalue()
    # TensorBoard gets only the finite scalars.
    tags = {(v.tag, e.step) for e in _events(tmp_path / "tensorboard") for v in e.summary.value}
    assert ("ok", 1) in tags and ("ok", 2) in tags
    assert not any(tag in ("kl/mean", "loss") for tag, _ in tags)


def test_tensorboard_scalars_and_histogram(tmp_path):
    with metrics_lib.MetricsWriter(tmp_path, stream=io.StringIO()) as w:
        for i in range(1, 3):
            w.write(i, {**_step_metrics(i), "groups/grad_norm": [0.5, 2.0, 4.0]})
    values = {}
    for e in _events(tmp_path / "tensorboard"):
        for v in e.summary.value:
            values[(v.tag, e.step)] = v
    assert values[("reward/mean", 2)].simple_value == pytest.approx(0.5)
    assert values[("throughput/tokens_per_s", 1)].simple_value == pytest.approx(500.0)
    hist = values[("groups/success_hist", 2)].histo
    assert list(hist.bucket) == [3.0, 0.0, 1.0, 4.0]
    assert hist.num == 8 and hist.min == 0 and hist.max == 3
    assert hist.sum == 0 * 3 + 2 * 1 + 3 * 4
    # A list of per-item values (not counts) is a histogram of those values.
    per_prompt = values[("groups/grad_norm", 2)].histo
    assert per_prompt.num == 3 and per_prompt.min == 0.5 and per_prompt.max == 4.0
    assert per_prompt.sum == pytest.approx(0.5 + 2.0 + 4.0)
    # A resumed writer marks the restart so TensorBoard hides the abandoned steps after it.
    metrics_lib.MetricsWriter(tmp_path, resume_step=1, stream=io.StringIO()).close()
    starts = [e.step for e in _events(tmp_path / "tensorboard") if e.HasField("session_log")]
    assert 2 in starts


def test_only_process_zero_writes(tmp_path):
    stream = io.StringIO()
    w = metrics_lib.MetricsWriter(tmp_path / "w", process_index=1, use_wandb=True, stream=stream)
    assert w.write(1, _step_metrics(1)) is None
    w.print("hello")
    w.close()
    assert not (tmp_path / "w").exists()
    assert stream.getvalue() == ""


def test_console_lines_per_interval_when_not_a_terminal(tmp_path):
    stream = io.StringIO()
    with metrics_lib.MetricsWriter(
        tmp_path, use_tensorboard=False, log_every=2, total_steps=5, stream=stream
    ) as w:
        for i in range(1, 6):
            w.write(i, {**_step_metrics(i), "useful/per_hour": 7200.4})
    lines = stream.getvalue().splitlines()
    assert [line.split("]")[1].split("|")[0].strip() for line in lines] == ["2/5", "4/5", "5/5"]
    assert "\r" not in stream.getvalue()
    first = lines[0]
    assert first.startswith("[########............] 2/5")
    for part in ("reward 0.500", "acc 0.500", "len 102", "kl 1.00e-03", "s/step 2.00"):
        assert part in first, (part, first)
    assert "tok/s 500" in first and "eta " in first
    # Verified useful trajectories per hour (`program.runtime.useful`), after the throughput.
    assert first.index("tok/s 500") < first.index("useful/h 7200") < first.index("eta ")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_overwrites_itself_on_a_terminal(tmp_path):
    stream = _Terminal()
    w = metrics_lib.MetricsWriter(tmp_path, use_tensorboard=False, total_steps=3, stream=stream)
    w.write(1, {"reward/mean": 0.1})
    w.write(2, {"reward/mean": 0.2})
    assert stream.getvalue().count("\r") == 2 and "\n" not in stream.getvalue()
    w.print("eval: 0.5")  # a message breaks the bar line instead of being overwritten
    w.write(3, {"reward/mean": 0.3})
    w.close()
    out = stream.getvalue()
    assert "\neval: 0.5\n" in out
    assert out.endswith("3/3 | reward 0.300\n")


def test_resume_drops_entries_after_the_restored_step(tmp_path):
    with metrics_lib.MetricsWriter(tmp_path, use_tensorboard=False, stream=io.StringIO()) as w:
        for i in range(1, 6):
            w.write(i, {"x": float(i)})
    stream = io.StringIO()
    with metrics_lib.MetricsWriter(
        tmp_path, use_tensorboard=False, resume_step=3, stream=stream
    ) as w:
        assert [e["step"] for e in metrics_lib.read_metrics(tmp_path)] == [1, 2, 3]
        w.write(4, {"x": 40.0})
    assert stream.getvalue().startswith(
        "metrics: resuming from checkpoint step 3; keeping 3 step rows; dropping 2 records of "
        "the steps after 3, which run again\n"
    )
    entries = metrics_lib.read_metrics(tmp_path)
    assert [(e["step"], e["x"]) for e in entries] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
    # A fresh run (resume_step=0) in the same workdir starts a new history.
    metrics_lib.MetricsWriter(tmp_path, use_tensorboard=False, stream=io.StringIO()).close()
    assert metrics_lib.read_metrics(tmp_path) == []


def _writer(tmp_path, resume_step=0, stream=None):
    return metrics_lib.MetricsWriter(
        tmp_path,
        use_tensorboard=False,
        resume_step=resume_step,
        stream=stream if stream is not None else io.StringIO(),
    )


def _kinds(records) -> list[tuple[int, str]]:
    return [(r["step"], r["record"]) for r in records]


def test_a_finished_run_extended_keeps_every_step_row(tmp_path):
    """Steps 1..5 and a final evaluation at 5; resumed at 5 and run to 8: every step row once,
    the old final evaluation gone, the new one present, the evaluation before training kept."""
    with _writer(tmp_path) as w:
        w.write(0, {"eval/accuracy": 0.1}, record=metrics_lib.EVAL)
        for i in range(1, 6):
            w.write(i, {"accuracy": 0.1 * i, "eval/accuracy": 0.3} if i == 3 else {"accuracy": i})
        w.write(5, {"eval/accuracy": 0.5}, record=metrics_lib.FINAL)
    first = metrics_lib.read_metrics(tmp_path)
    # The final evaluation shares step 5 with the training row; both are kept.
    assert _kinds(first) == [(0, "eval"), *[(i, "step") for i in range(1, 6)], (5, "final")]
    assert metrics_lib.final_eval(first)["eval/accuracy"] == 0.5
    stream = io.StringIO()
    with _writer(tmp_path, resume_step=5, stream=stream) as w:
        assert _kinds(metrics_lib.read_metrics(tmp_path))[-1] == (5, "step")
        for i in range(6, 9):
            w.write(i, {"accuracy": i})
        w.write(8, {"eval/accuracy": 0.8}, record="final")
    # Said as what is kept and what is written again, not as a loss.
    assert stream.getvalue().startswith(
        "metrics: resuming from checkpoint step 5; keeping 5 step rows and the evaluation before "
        "training; the final evaluation recorded earlier is dropped: it runs again when the run "
        "reaches its last step\n"
    )
    records = metrics_lib.read_metrics(tmp_path)
    assert _kinds(records) == [(0, "eval"), *[(i, "step") for i in range(1, 9)], (8, "final")]
    rows = metrics_lib.step_rows(records)
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert rows[2]["eval/accuracy"] == 0.3  # a periodic evaluation stays in its step's row
    assert metrics_lib.initial_eval(records)["eval/accuracy"] == 0.1
    assert metrics_lib.final_eval(records)["eval/accuracy"] == 0.8
    steps, acc = metrics_lib.series(records, "eval/accuracy")
    np.testing.assert_array_equal(steps, [0, 3, 8])
    np.testing.assert_allclose(acc, [0.1, 0.3, 0.8])


def test_a_stopped_run_resumed_drops_its_final_eval_and_later_rows(tmp_path):
    """SIGTERM at step 4 (final evaluation written there), last checkpoint at 3: the resumed run
    keeps steps 1..3 and the evaluation before training only."""
    with _writer(tmp_path) as w:
        w.write(0, {"eval/accuracy": 0.1}, record="eval")
        for i in range(1, 5):
            w.write(i, {"accuracy": float(i)})
        w.write(4, {"eval/accuracy": 0.4}, record="final")
    stream = io.StringIO()
    with _writer(tmp_path, resume_step=3, stream=stream):
        pass
    records = metrics_lib.read_metrics(tmp_path)
    assert _kinds(records) == [(0, "eval"), (1, "step"), (2, "step"), (3, "step")]
    assert metrics_lib.final_eval(records) is None
    said = stream.getvalue()
    assert "keeping 3 step rows and the evaluation before training" in said
    assert "dropping 2 records of the steps after 3, which run again" in said  # step 4, final
    assert "the final evaluation recorded earlier" not in said  # it was after step 3
    # A fresh run (resume_step=0) evaluates again: nothing of the old history stays.
    stream = io.StringIO()
    with _writer(tmp_path, stream=stream):
        pass
    assert metrics_lib.read_metrics(tmp_path) == []
    assert stream.getvalue() == (
        "metrics: no checkpoint to resume from, so the run starts over: the 4 records of an "
        "earlier attempt are dropped\n"
    )
    # Nothing to keep or drop: a fresh run in an empty workdir says nothing.
    stream = io.StringIO()
    with _writer(tmp_path / "new", stream=stream):
        pass
    assert stream.getvalue() == ""


def test_a_resume_that_drops_nothing_says_what_it_keeps(tmp_path):
    with _writer(tmp_path) as w:
        w.write(0, {"eval/accuracy": 0.1}, record="eval")
        for i in range(1, 4):
            w.write(i, {"accuracy": float(i)})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "reco')  # torn by a crash
    stream = io.StringIO()
    with _writer(tmp_path, resume_step=3, stream=stream):
        pass
    assert stream.getvalue() == (
        "metrics: resuming from checkpoint step 3; keeping 3 step rows and the evaluation before "
        "training; an incomplete last line is dropped\n"
    )
    stream = io.StringIO()
    with _writer(tmp_path, resume_step=3, stream=stream):
        pass
    assert stream.getvalue() == (
        "metrics: resuming from checkpoint step 3; keeping 3 step rows and the evaluation before "
        "training\n"
    )


def test_old_ledgers_without_kinds_read_as_step_rows(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 0, "time": 1.0, "eval/accuracy": 0.1},
        {"step": 1, "time": 2.0, "accuracy": 0.5, "kl/mean": None},
        {"step": 2, "time": 3.0, "accuracy": 0.75},
        {"step": 2, "time": 4.0, "eval/accuracy": 0.6},
    ]
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    records = metrics_lib.read_metrics(tmp_path)
    assert records == [{**e, "record": "step"} for e in lines]
    assert len(metrics_lib.step_rows(records)) == 4
    assert metrics_lib.final_eval(records) is None
    steps, acc = metrics_lib.series(records, "accuracy")
    np.testing.assert_array_equal(steps, [1, 2])
    steps, kl = metrics_lib.series(records, "kl/mean")
    assert steps.tolist() == [1] and np.isnan(kl).all()
    assert metrics_lib.series(records, "kl/mean", drop_missing=True)[0].size == 0
    # Resuming such a ledger keeps its lines up to the step and writes kinds from then on.
    with _writer(tmp_path, resume_step=1) as w:
        w.write(2, {"accuracy": 0.25})
    assert _kinds(metrics_lib.read_metrics(tmp_path)) == [(0, "step"), (1, "step"), (2, "step")]


def test_read_metrics_tolerates_a_torn_last_line_only(tmp_path):
    assert metrics_lib.read_metrics(tmp_path) == []
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n{"step": 1, "x": 9}\n{"step": 3, "x')
    # Every complete line is a record, in the order written; none replaces another.
    records = metrics_lib.read_metrics(tmp_path)
    assert [(e["step"], e["x"]) for e in records] == [(1, 1), (2, 2), (1, 9)]
    assert metrics_lib.truncate_metrics(tmp_path, after_step=10) == 1  # the tear
    assert path.read_text().count("\n") == 3
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a metrics entry"):
        metrics_lib.read_metrics(tmp_path)
    path.write_text('{"step": 1, "record": "bogus"}\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:1: .*unknown record kind 'bogus'"):
        metrics_lib.read_metrics(tmp_path)


def test_a_line_that_is_not_utf8_is_named_by_file_and_line(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    good = [b'{"step": 1, "record": "step", "x": 1}', b'{"step": 2, "record": "step", "x": 2}']
    path.write_bytes(good[0] + b"\n" + b'{"step": 2, "note": "\xff\xfe"}\n' + good[1] + b"\n")
    message = rf"{path}:2: not UTF-8 text \(invalid start byte at byte 22 of the line\)"
    with pytest.raises(ValueError, match=message):
        metrics_lib.read_metrics(tmp_path)
    with pytest.raises(ValueError, match=message):  # a resume refuses to rewrite it
        _writer(tmp_path, resume_step=1)
    assert path.read_bytes().count(b"\n") == 3
    # The last line torn inside a character ("é" is two bytes) is a torn line like any other.
    path.write_bytes(good[0] + b"\n" + b'{"step": 2, "note": "\xc3')
    with caplog.at_level("WARNING"):
        assert [r["step"] for r in metrics_lib.read_metrics(tmp_path)] == [1]
    assert "ignoring an incomplete last line" in caplog.text


def test_a_deleted_ledger_on_resume_is_a_warning_naming_it_and_the_steps(tmp_path, caplog):
    ledger = tmp_path / "metrics.jsonl"
    stream = io.StringIO()
    with caplog.at_level("WARNING"), _writer(tmp_path, resume_step=5, stream=stream) as w:
        assert w.missing_eval
        w.write(6, {"x": 6.0})
    warning = (
        f"metrics: {ledger} is missing: steps 1-5 have no rows (the run resumes from its "
        "checkpoint at step 5, which is intact; only those rows are lost)"
    )
    assert warning in stream.getvalue() and warning in caplog.text
    assert _kinds(metrics_lib.read_metrics(tmp_path)) == [(6, "step")]
    # Cut short by hand: the steps it lacks are named; a whole ledger warns of nothing.
    with _writer(tmp_path) as w:
        w.write(0, {"eval/accuracy": 0.1}, record=metrics_lib.EVAL)
        for i in (1, 2, 4):
            w.write(i, {"x": float(i)})
    stream = io.StringIO()
    with _writer(tmp_path, resume_step=6, stream=stream) as w:
        assert not w.missing_eval
    assert f"metrics: {ledger} has no rows for some steps: steps 3, 5-6 have no rows" in (
        stream.getvalue()
    )
    stream = io.StringIO()
    with _writer(tmp_path, resume_step=2, stream=stream):
        pass
    assert "no rows" not in stream.getvalue()


def test_bfloat16_metrics_are_written_as_floats(tmp_path):
    with metrics_lib.MetricsWriter(tmp_path, use_tensorboard=False, stream=io.StringIO()) as w:
        w.write(1, {"grad_norm": np.asarray(0.5, jnp.bfloat16), "h": jnp.ones(2, jnp.bfloat16)})
    (record,) = metrics_lib.read_metrics(tmp_path)
    assert record["grad_norm"] == 0.5 and record["h"] == [1.0, 1.0]


def test_bad_metrics_name_the_value(tmp_path):
    with metrics_lib.MetricsWriter(tmp_path, use_tensorboard=False, stream=io.StringIO()) as w:
        with pytest.raises(ValueError, match=r"'m' has shape \(2, 2\)"):
            w.write(1, {"m": np.zeros((2, 2))})
        with pytest.raises(TypeError, match="'name' has non-numeric value"):
            w.write(1, {"name": "abc"})
        with pytest.raises(ValueError, match="reserved"):
            w.write(1, {"time": 1.0})
        with pytest.raises(ValueError, match="reserved"):
            w.write(1, {"record": 1.0})
        with pytest.raises(ValueError, match="record='last'"):
            w.write(1, {"x": 1.0}, record="last")
        with pytest.raises(TypeError, match="step=1.5"):
            w.write(1.5, {"x": 1.0})
    with pytest.raises(RuntimeError, match="closed"):
        w.write(2, {"x": 1.0})
    with pytest.raises(ValueError, match="log_every=0"):
        metrics_lib.MetricsWriter(tmp_path, log_every=0)


def test_wandb_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(ImportError, match="use_wandb=True but the `wandb` package"):
        metrics_lib.MetricsWriter(tmp_path / "w", use_wandb=True, use_tensorboard=False)
    assert not (tmp_path / "w" / "metrics.jsonl").exists()


def test_wandb_gets_scalars_and_keeps_the_run_id(tmp_path, monkeypatch):
    calls = {"init": [], "log": [], "finish": 0}

    class Run:
        id = "run123"

        def log(self, data, step):
            calls["log"].append((step, data))

        def finish(self):
            calls["finish"] += 1

    def init(**kwargs):
        calls["init"].append(kwargs)
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    kwargs = dict(use_tensorboard=False, use_wandb=True, wandb_project="p", stream=io.StringIO())
    with metrics_lib.MetricsWriter(tmp_path, wandb_config={"lr": 1e-6}, **kwargs) as w:
        w.write(1, {"reward/mean": jnp.float32(0.5), "bad": math.nan, "hist": [1, 2]})
    assert calls["init"][0]["project"] == "p" and calls["init"][0]["config"] == {"lr": 1e-6}
    assert calls["init"][0]["id"] is None
    assert calls["log"] == [(1, {"reward/mean": 0.5})]
    assert calls["finish"] == 1
    with metrics_lib.MetricsWriter(tmp_path, resume_step=1, **kwargs):
        pass
    assert calls["init"][1]["id"] == "run123" and calls["init"][1]["resume"] == "allow"


def test_stage_timer_and_throughput():
    timer = metrics_lib.StageTimer()
    with timer.stage("step"):
        with timer.stage("rollout"):
            time.sleep(0.02)
        timer.record("verify", 0.5)
        timer.record("verify", 0.25)
    out = timer.metrics()
    assert set(out) == {"time/step", "time/rollout", "time/verify"}
    assert out["time/verify"] == 0.75
    assert 0.02 <= out["time/rollout"] <= out["time/step"]
    assert timer.metrics() == {}
    with pytest.raises(ValueError, match="'a/b'"), timer.stage("a/b"):
        pass
    with pytest.raises(ValueError, match="-1"):
        timer.record("x", -1)
    assert metrics_lib.tokens_per_second(1000, 4.0) == 250.0
    assert math.isnan(metrics_lib.tokens_per_second(1000, 0.0))
