"""benchmarks/translate_bench.py runs end to end and reports every figure, as text and JSON."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT, TINY_RNNS, tiny_checkpoint

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from profile_decode import group_times  # noqa: E402
from translate_bench import markdown, paired_ratio, tree_memory_mib  # noqa: E402


def run_script(name: str, *args) -> subprocess.CompletedProcess:
    """benchmarks/<name> with ``args`` in a process of its own."""
    return subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", name),
                           *map(str, args)], capture_output=True, text=True, timeout=300)


def test_benchmark_smoke(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "m.pt")
    # enough lines that the worker processes live through several of the 50 ms memory samples
    (tmp_path / "src").write_text("a b c\nd e\nf a b c\n" * 100)
    (tmp_path / "ref").write_text("A B C\nD E\nF A B C\n" * 100)
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "translate_bench.py"), "-model", ckpt,
         "-src", str(tmp_path / "src"), "-ref", str(tmp_path / "ref"), "-runs", "1",
         "-warmup", "0", "-threads", "1", "-extra=-max_length 5", "-json", str(out),
         "-engines", "batch", "sentence", "int8", "workers", "fast-workers"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "onmt_lite batch" in proc.stdout and "onmt_lite sentence" in proc.stdout
    results = json.loads(out.read_text())
    assert [r["name"] for r in results] == ["onmt_lite batch", "onmt_lite sentence",
                                            "onmt_lite int8", "onmt_lite workers",
                                            "onmt_lite fast-workers"]
    for r in results:
        assert r["translate_s"]["median"] > 0 and r["peak_rss_mib"]["median"] > 0
        assert r["peak_pss_sum_mib"]["median"] > 0
        assert r["peak_rss_sum_mib"]["median"] >= r["peak_rss_mib"]["median"] * 0.9
        assert r["sents_per_s"] > 0 and 0 <= r["bleu"] <= 100
    # the exact engines agree line for line; workers are processes sharing the weights
    assert [r["identical_to_first"] for r in results if "int8" not in r["name"]][:3] == [1.0] * 3
    workers = results[3]
    assert workers["peak_rss_sum_mib"]["median"] > workers["peak_rss_mib"]["median"]
    table = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "translate_bench.py"),
                            "-table", str(out)], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    rows = table.stdout.splitlines()
    assert rows[0].startswith("| model |") and len(rows) == 2 + len(results)
    assert rows[2].startswith("| bench | onmt_lite batch |") and rows[2].endswith("| 100.0% |")


def test_benchmark_growth_and_memory_modes(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "m.pt")
    (tmp_path / "src").write_text("a b c\nd e\nf a b c\n")
    (tmp_path / "ref").write_text("A B C\nD E\nF A B C\n")
    script = os.path.join(ROOT, "benchmarks", "translate_bench.py")
    common = [sys.executable, script, "-model", ckpt, "-src", str(tmp_path / "src"), "-ref",
              str(tmp_path / "ref"), "-runs", "1", "-warmup", "0", "-threads", "1",
              "-beam_size", "2"]
    out = tmp_path / "growth.json"
    proc = subprocess.run(common + ["-growth", "-json", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert [(r["tool"], r["output_tokens"]) for r in rows] == [  # forced lengths
        (tool, n) for tool in ("onmt_lite", "onmt_lite -fast") for n in (10.0, 50.0, 200.0)]
    assert all(r["tokens_per_s"] > 0 for r in rows)
    assert rows[0]["vs_shortest"] == rows[3]["vs_shortest"] == 1.0
    out = tmp_path / "memory.json"
    proc = subprocess.run(common + ["-memory_base", "3", "-memory_lines", "30", "-json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert [r["lines"] for r in rows] == [3, 30] and all(r["peak_rss_mib"] > 0 for r in rows)


def test_profile_decode_groups_the_time(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "m.pt")
    (tmp_path / "src").write_text("a b c\nd e\nf a b c\n")
    out = tmp_path / "profile.json"
    proc = run_script("profile_decode.py", "-model", ckpt, "-src", tmp_path / "src",
                      "-extra=-max_length 5", "-json", out)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    groups = result["groups"]
    assert result["lines"] == 3 and result["wall_s"] > 0
    assert groups["matrix products"]["seconds"] > 0 and groups["softmax, log_softmax"]["seconds"] > 0
    assert abs(sum(g["share"] for g in groups.values()) - 1) < 1e-9
    assert "matrix products" in proc.stdout


def test_the_profile_counts_each_kind_of_product_as_a_product():
    """Time in a product's own operations and in the operations it calls is the product's,
    the int8 product with its relu (-fast -int8's first feed-forward product) included."""

    def event(name, us, parent=None):
        return SimpleNamespace(name=name, self_cpu_time_total=us, cpu_parent=parent)
    relu_product = event("quantized::linear_relu_dynamic", 300)
    events = [event("quantized::linear_dynamic", 200), relu_product,
              event("aten::empty", 50, relu_product), event("aten::add", 100)]
    times = group_times(events)
    assert times["matrix products"] == pytest.approx(550e-6)
    assert times["other operations"] == pytest.approx(100e-6)


def test_threads_benchmark_smoke(tmp_path):
    ckpt = tiny_checkpoint(tmp_path / "m.pt")
    (tmp_path / "src").write_text("a b c\nd e\nf a b c\nb b\n")
    out = tmp_path / "threads.json"
    # the idle CPU only: the busy runs' spinners would take every core from the other tests
    proc = run_script("threads_bench.py", "-model", ckpt, "-src", tmp_path / "src",
                      "-lines", "3", "-runs", "1", "-loads", "idle", "-json", out)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert results["lines"] == 3 and set(results["results"]) == {"idle"}
    for table in results["results"].values():
        assert table["default"]["vs_default"] == 1.0
        assert any("spin-wait" in name for name in table) and "-threads 1" in table
        assert all(r["median_s"] > 0 for r in table.values())


def test_benchmark_startup_mode(tmp_path):
    """A fresh process's time to its first translation: exact, -fast, -compile with an empty
    and a warm cache (where a compiler is found; else the uncompiled step), without a compiler.
    The model is an RNN, for which -compile builds nothing: five launches take seconds, not the
    minutes a Transformer's programs take to build (test_fast.py builds and runs them)."""
    ckpt = tiny_checkpoint(tmp_path / "m.pt", opt=TINY_RNNS["brnn-LSTM-general"])
    (tmp_path / "src").write_text("a b c\nd e\n")
    out = tmp_path / "startup.json"
    proc = run_script("translate_bench.py", "-model", ckpt, "-src", tmp_path / "src", "-ref",
                      tmp_path / "src", "-runs", "1", "-threads", "1", "-startup", "-json", out)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert [r["case"] for r in rows] == [
        "exact", "-fast", "-compile, empty compile cache", "-compile, warm compile cache",
        "-compile, no C++ compiler"]
    assert all(r["process_s"] > 0 for r in rows)


def test_paired_ratios_are_taken_round_by_round():
    """A slow round slows both of its runs: the per-round ratios stay 0.5 where the medians of
    the times alone would give 0.4."""
    ours = {"translate_runs": [1.0, 4.0, 1.2]}
    peer = {"translate_runs": [2.0, 8.0, 3.0]}
    assert paired_ratio(ours, peer) == pytest.approx(
        {"median": 0.5, "min": 0.4, "max": 0.5, "faster": 3, "rounds": 3, "sign_p": 0.25})


def test_a_sign_test_tells_ahead_from_level():
    """Ten rounds won of ten: p = 2 / 1024; six of ten: p = 2 x 386 / 1024 (the five sums of
    choosing 0-4 of 10), too likely a split between two equally fast configurations."""
    peer = {"translate_runs": [1.0] * 10}
    ahead = paired_ratio({"translate_runs": [0.9] * 10}, peer)
    level = paired_ratio({"translate_runs": [0.9] * 6 + [1.1] * 4}, peer)
    assert (ahead["faster"], ahead["sign_p"]) == (10, pytest.approx(2 / 1024))
    assert (level["faster"], level["sign_p"]) == (6, pytest.approx(2 * 386 / 1024))


def test_the_table_gives_each_peer_comparison_round_by_round(tmp_path):
    times = {"median": 1.0, "min": 1.0, "max": 1.0}
    ours = {"name": "onmt_lite fast", "translate_runs": [0.9] * 10}
    peer = {"name": "CT2 int8 2x1", "translate_runs": [1.0] * 6 + [0.8] * 4}
    ours["paired_vs"] = {peer["name"]: paired_ratio(ours, peer)}
    for r in (ours, peer):
        r.update(translate_s=times, process_s=times, peak_rss_mib=times, tokens_per_s=1000,
                 bleu=30.0, identical_to_first=1.0)
    path = tmp_path / "transformer.json"
    path.write_text(json.dumps([ours, peer]))
    rows = markdown([str(path)]).splitlines()
    assert rows[-3:] == ["| transformer | vs CT2 int8 2x1 |", "|---|---|",
                         "| fast | 0.90 (0.90–1.12), 6/10, p 0.75 |"]


def test_the_memory_sampler_reads_pss_only_when_asked():
    """PSS walks every page table (40 ms over a process and two workers): the 50 ms samples
    read RSS alone, PSS only at the sparse times child() asks for it."""
    rss, pss = tree_memory_mib(os.getpid())
    assert rss > 0 and pss == 0
    rss, pss = tree_memory_mib(os.getpid(), pss=True)
    assert 0 < pss <= rss * 1.1


def test_defaults_benchmark_smoke(tmp_path):
    """Without peers: the default against the explicit settings, the CPU named in the JSON."""
    ckpt = tiny_checkpoint(tmp_path / "m.pt")
    (tmp_path / "src").write_text("a b c\nd e\nf a b c\nb b\n" * 20)
    out = tmp_path / "defaults.json"
    proc = run_script("defaults_bench.py", "-models", ckpt, "-src", tmp_path / "src",
                      "-lines", "80", "-runs", "1", "-loads", "idle", "-json", out)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert results["cpu"]["model"] and results["cpu"]["flags"] and results["cpu"]["cores"] >= 1
    assert [(t["lines"], t["seconds"]) for t in results["tables"]] == [
        (80, "translate_s"), (1, "process_s")]
    for table in results["tables"]:
        assert table["results"]["onmt_lite default"]["vs_default"] == 1.0
        assert len(table["results"]) == 4 and "vs_best_explicit" in table["targets"]
