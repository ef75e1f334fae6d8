"""The benchmarks end to end on CPU, on small shapes (their CPU timings are a smoke test only)."""

import importlib.util
import json
from pathlib import Path

import pytest

PACKAGE = "{{ cookiecutter.package_name }}"


def load_benchmark(name="bench_rms_norm"):
    path = Path(__file__).parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_rows(rows, shapes, impls, modes, runs):
    """A row per shape for the copy and per shape, implementation and mode, each measured."""
    cells = {("copy", "copy")} | {(impl, mode) for impl in impls for mode in modes}
    assert sorted((r["M"], r["N"], r["impl"], r["mode"]) for r in rows) == sorted(
        (*shape, *cell) for shape in shapes for cell in cells
    )
    for r in rows:
        assert r["status"] == "ok" and r["ms"] > 0 and r["gbps"] > 0, r
        assert len(r["times_ms"]) == runs, r
        copy = next(c for c in rows if (c["M"], c["N"], c["impl"]) == (r["M"], r["N"], "copy"))
        assert r["fraction_of_copy"] == pytest.approx(r["gbps"] / copy["gbps"]), r


# Per op: shapes, and the implementations and modes measured on CPU (Liger runs on CUDA only).
PEERS, MODES = [PACKAGE, "F.rms_norm", "compile(ref)"], ["fwd", "fwd+bwd"]
CASES = {
    "rms_norm": ([(64, 256), (3, 100)], PEERS, MODES),
    "fused_add_rms_norm": ([(3, 100)], PEERS, MODES),
    "fused_add_rms_norm_": ([(3, 100)], [PACKAGE, "out of place"], ["fwd"]),
}


@pytest.mark.parametrize("op", CASES)
def test_benchmark_runs_on_cpu(op, tmp_path, capsys):
    shapes, impls, modes = CASES[op]
    bench = load_benchmark()
    out = tmp_path / "rows.json"
    grid = ",".join(f"{m}x{n}" for m, n in shapes)
    plot = tmp_path / "bench.png"
    args = ["--device", "cpu", "--op", op, "--shapes", grid, "--runs", "2", "--json", str(out)]
    rows = bench.main([*args, "--plot", str(plot)])
    assert json.loads(out.read_text())["rows"] == rows
    assert plot.stat().st_size > 10_000
    check_rows(rows, shapes, impls, modes, runs=2)
    printed = capsys.readouterr().out
    assert printed.count("CPU timings are for smoke-testing") == 1
    assert all(f"{m}x{n} {modes[-1]}" in printed for m, n in shapes)


def test_benchmark_decode_table_on_cpu(monkeypatch, capsys):
    bench = load_benchmark()
    monkeypatch.setattr(bench, "DECODE", [(1, 128), (8, 128)])
    rows = bench.main(["--device", "cpu", "--decode", "--runs", "1", "--impls", PACKAGE])
    check_rows(rows, [(1, 128), (8, 128)], [PACKAGE], ["fwd", "fwd+bwd"], runs=1)
    assert "us  /copy" in capsys.readouterr().out


def test_benchmark_refuses_unknown_implementations(capsys):
    with pytest.raises(SystemExit) as excinfo:
        load_benchmark().main(["--device", "cpu", "--impls", "no_such_impl"])
    assert excinfo.value.code == 2 and "unknown ['no_such_impl']" in capsys.readouterr().err


def test_benchmark_reports_a_wrong_implementation_untimed(tmp_path, monkeypatch, capsys):
    (tmp_path / "wrong_ops.py").write_text("def rms_norm(x, w, eps):\n    return 2 * x * w\n")
    monkeypatch.syspath_prepend(tmp_path)
    args = ["--device", "cpu", "--shapes", "3x100", "--runs", "1", "--also", "wrong_ops"]
    rows = load_benchmark().main([*args, "--impls", "wrong_ops"])
    assert [(r["impl"], r["mode"], r["ms"]) for r in rows[1:]] == [
        ("wrong_ops", "fwd", None),
        ("wrong_ops", "fwd+bwd", None),
    ]
    assert rows[1]["status"] == "failed: output or gradient 0 differs from the reference"
    assert "wrong_ops fwd+bwd: failed: output or gradient 0" in capsys.readouterr().out


def test_model_benchmark_runs_on_cpu(tmp_path, capsys):
    bench = load_benchmark("bench_model")
    out, plot = tmp_path / "rows.json", tmp_path / "model.png"
    rows = bench.main(["--device", "cpu", "--quick", "--json", str(out), "--plot", str(plot)])
    assert json.loads(out.read_text())["rows"] == rows
    assert plot.stat().st_size > 10_000
    cells = sorted((r["norm"], r["mode"]) for r in rows)
    assert cells == sorted((n, m) for n in bench.NORMS for m in ("eager", "compile"))
    for r in rows:
        assert r["ms"] > 0 and r["tokens_per_s"] > 0 and len(r["times_ms"]) == 2, r
        # Each norm computes the same model: the first step's loss agrees.
        assert r["first_loss"] == pytest.approx(rows[0]["first_loss"], rel=1e-4), r
    assert "64 x 2 layers" in capsys.readouterr().out
