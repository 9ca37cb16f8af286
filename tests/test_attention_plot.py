"""Attention pictures: -attn_plot and ``python -m onmt_lite plot`` write one valid PNG per
sentence, sized to its matrix; a missing matplotlib and a bad dump are one clear line."""
import builtins
import json
import os
import struct
import subprocess
import sys

import pytest

from onmt_lite.cli import plot as plot_cli
from onmt_lite.cli import translate as translate_cli
from onmt_lite.translate.attention_plot import PlotError, image_size, require_matplotlib

pytest.importorskip("matplotlib", reason="matplotlib (the plot extra) is not installed")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD = {"index": 0, "src": ["a", "b"], "pred": ["A", "</s>"], "attention": [[0.9, 0.1], [0.2, 0.8]]}


def png_size(path) -> tuple:
    """(width, height) from a PNG's signature and IHDR chunk; fails on anything else."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_attn_plot_writes_one_picture_per_sentence(tiny_model, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("red cat runs\n\nsmall dog sits red\n")
    folder, dump = tmp_path / "plots" / "new", tmp_path / "attn.jsonl"
    assert translate_cli.main(["-model", tiny_model, "-src", str(src), "-output",
                               str(tmp_path / "o"), "-attn_plot", str(folder),
                               "-attn_dump", str(dump)]) == 0
    pictures = sorted(folder.iterdir())
    assert [p.name for p in pictures] == [f"sentence_00000{i}.png" for i in (1, 2, 3)]
    records = [json.loads(line) for line in dump.read_text().splitlines()]
    for picture, record in zip(pictures, records):
        assert png_size(picture) == image_size(len(record["src"]), len(record["pred"]))
    # the dump, empty translation and </s> rows included, draws the same pictures
    assert records[1]["pred"] == records[1]["attention"] == []
    assert plot_cli.main(["-attn_dump", str(dump), "-output", str(tmp_path / "again")]) == 0
    assert [png_size(p) for p in sorted((tmp_path / "again").iterdir())] == \
        [png_size(p) for p in pictures]


def test_plot_command_draws_a_dump_readably_at_60_tokens(tmp_path, capsys):
    src, pred = [f"w{i}" for i in range(60)], [f"t{i}" for i in range(58)]
    rows = [[1.0 if j == i else 0.0 for j in range(60)] for i in range(58)]
    dump = tmp_path / "attn.jsonl"
    dump.write_text(json.dumps({"index": 4, "src": src, "pred": pred, "attention": rows}) + "\n"
                    + json.dumps({"index": 5, "src": ["a"], "pred": ["A"],
                                  "attention": [[1.0]]}) + "\n")
    assert plot_cli.main(["-attn_dump", str(dump), "-output", str(tmp_path / "out")]) == 0
    assert "2 pictures in" in capsys.readouterr().err
    big = png_size(tmp_path / "out" / "sentence_000005.png")
    assert big == image_size(60, 58) and big[0] >= 60 * 20  # at least 20 pixels a token
    assert png_size(tmp_path / "out" / "sentence_000006.png") == image_size(1, 1)


def test_a_bad_dump_line_is_named(tmp_path, capsys):
    dump = tmp_path / "attn.jsonl"
    dump.write_text('{"index": 0, "src": [], "pred": [], "attention": []}\n{"src": 1}\n')
    assert plot_cli.main(["-attn_dump", str(dump), "-output", str(tmp_path / "out")]) == 1
    assert f"{dump}:2: not an -attn_dump record" in capsys.readouterr().err


def run_plot(dump, output) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "onmt_lite", "plot", "-attn_dump", str(dump),
                           "-output", str(output)], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("bad, message", [
    ({"attention": [["a", "b"], [0.2, 0.8]]}, 'attention[0][0] must be a finite number, got "a"'),
    ({"attention": [[0.9, 0.1], [0.2, float("nan")]]},
     "attention[1][1] must be a finite number, got NaN"),
    ({"index": "3"}, 'index must be a non-negative integer, got "3"'),
    ({"index": True}, "index must be a non-negative integer, got true"),
    ({"index": -4}, "index must be a non-negative integer, got -4"),
    ({"src": ["a", 2]}, "src[1] must be a string, got 2"),
    ({"pred": ["A"]}, "attention has 2 rows but pred has 1 token"),
    ({"src": ["a", "b", "c"]}, "attention[0] has 2 columns but src has 3 tokens"),
    ({"index": 0}, "index 0 again (first on line 1): both would draw sentence_000001.png"),
])
def test_a_bad_record_is_refused_before_any_picture(tmp_path, bad, message):
    dump, out = tmp_path / "attn.jsonl", tmp_path / "out"
    dump.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "index": 1, **bad}) + "\n")
    result = run_plot(dump, out)
    assert result.returncode == 1
    assert result.stderr == f"onmt_lite plot: error: {dump}:2: {message}\n"
    assert not out.exists()


def test_broken_json_after_a_good_line_writes_nothing(tmp_path):
    dump, out = tmp_path / "attn.jsonl", tmp_path / "out"
    dump.write_text(json.dumps(GOOD) + "\n" + '{"index": 1, "src": ["a"\n')
    result = run_plot(dump, out)
    assert result.returncode == 1
    assert result.stderr == (f"onmt_lite plot: error: {dump}:2: not an -attn_dump record "
                             "(JSON with index, src, pred and attention)\n")
    assert not out.exists()


def test_a_picture_that_cannot_be_written_says_how_many_were(tmp_path):
    dump, out = tmp_path / "attn.jsonl", tmp_path / "out"
    dump.write_text("".join(json.dumps(dict(GOOD, index=i)) + "\n" for i in range(3)))
    (out / "sentence_000002.png").mkdir(parents=True)  # where the second picture goes
    result = run_plot(dump, out)
    assert result.returncode == 1
    assert result.stderr == (f"onmt_lite plot: error: {out / 'sentence_000002.png'}: cannot "
                             "write the picture: Is a directory (1 of 3 pictures written)\n")
    assert sorted(p.name for p in out.iterdir()) == ["sentence_000001.png", "sentence_000002.png"]
    assert png_size(out / "sentence_000001.png") == image_size(2, 2)


def test_tokens_are_drawn_as_text_not_tex(tmp_path, capsys):
    dump = tmp_path / "attn.jsonl"
    dump.write_text(json.dumps(dict(GOOD, src=["$x_$", "$"], pred=["^{", "\\frac"])) + "\n")
    assert plot_cli.main(["-attn_dump", str(dump), "-output", str(tmp_path / "out")]) == 0
    assert png_size(tmp_path / "out" / "sentence_000001.png") == image_size(2, 2)


def test_missing_matplotlib_is_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch):
    real_import = builtins.__import__

    def without_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_matplotlib)
    with pytest.raises(PlotError, match=r"pip install 'onmt_lite\[plot\]'"):
        require_matplotlib()
    src = tmp_path / "in.txt"
    src.write_text("red cat\n")
    assert translate_cli.main(["-model", str(tmp_path / "never-loaded.pt"), "-src", str(src),
                               "-output", str(tmp_path / "o"), "-attn_plot",
                               str(tmp_path / "p")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "attention plots need matplotlib" in err
