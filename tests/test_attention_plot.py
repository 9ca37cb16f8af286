"""Attention pictures: -attn_plot and ``python -m onmt_lite plot`` write one valid PNG per
sentence, sized to its matrix; a missing matplotlib and a bad dump are one clear line."""
import builtins
import json
import struct

import pytest

from onmt_lite.cli import plot as plot_cli
from onmt_lite.cli import translate as translate_cli
from onmt_lite.translate.attention_plot import PlotError, image_size, require_matplotlib

pytest.importorskip("matplotlib", reason="matplotlib (the plot extra) is not installed")


def png_size(path) -> tuple:
    """(width, height) from a PNG's signature and IHDR chunk; fails on anything else."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_attn_plot_writes_one_picture_per_sentence(tiny_model, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("red cat runs\nbig bird\nsmall dog sits red\n")
    folder, dump = tmp_path / "plots" / "new", tmp_path / "attn.jsonl"
    assert translate_cli.main(["-model", tiny_model, "-src", str(src), "-output",
                               str(tmp_path / "o"), "-attn_plot", str(folder),
                               "-attn_dump", str(dump)]) == 0
    pictures = sorted(folder.iterdir())
    assert [p.name for p in pictures] == [f"sentence_00000{i}.png" for i in (1, 2, 3)]
    records = [json.loads(line) for line in dump.read_text().splitlines()]
    for picture, record in zip(pictures, records):
        assert png_size(picture) == image_size(len(record["src"]), len(record["pred"]))


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
