"""Options are typed and range-checked once, whatever their source (command line or YAML
-config), with one line naming the option; and the small things of the command line."""
import os
import subprocess
import sys

import pytest
import yaml

from onmt_lite.cli import translate as translate_cli
from onmt_lite.cli.options import Bounded, integer, number

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_line_error(argv, capsys) -> str:
    """Runs translate.py's main on argv; asserts exit status 2 and a single error line."""
    with pytest.raises(SystemExit) as stop:
        translate_cli.main([str(a) for a in argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_bounded_parses_strings_and_checks_kinds():
    assert integer(1)("3") == 3 and number(0)("0.5") == 0.5 and number(0)(2) == 2.0
    for bad in (2.5, True, "2.5", "x", None, [1]):
        with pytest.raises(Exception, match="expected an integer"):
            integer()(bad)
    with pytest.raises(Exception, match="expected a number"):
        number()(False)
    with pytest.raises(Exception, match="must be at least 1, got 0"):
        integer(1)(0)
    with pytest.raises(Exception, match="must be at most 1, got 1.5"):
        number(0, 1)(1.5)
    with pytest.raises(Exception, match="must be more than 0, got 0.0"):
        Bounded(float, above=0)(0)


OUT_OF_RANGE = [
    ("batch_size", 0), ("batch_size", -1), ("beam_size", 0), ("n_best", 0),
    ("min_length", -1), ("max_length", 0), ("max_length_ratio", -0.5),
    ("block_ngram_repeat", -2), ("src_seq_length_trunc", -1), ("shard_size", -1),
    ("threads", -1), ("inter_threads", 0), ("repetition_penalty", 0), ("beta", -0.1), ("gpu", -2),
    ("random_sampling_topk", -2), ("random_sampling_topp", 1.5), ("random_sampling_temp", 0),
    ("seed", -5),
]


@pytest.mark.parametrize("name, value", OUT_OF_RANGE, ids=[f"{n}={v}" for n, v in OUT_OF_RANGE])
def test_out_of_range_on_the_command_line(name, value, capsys):
    err = one_line_error(["-model", "m.pt", "-src", "s", f"-{name}", value], capsys)
    assert f"argument -{name}/--{name}: must be" in err


@pytest.mark.parametrize("name, value", OUT_OF_RANGE, ids=[f"{n}={v}" for n, v in OUT_OF_RANGE])
def test_out_of_range_in_a_config(name, value, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({name: value}))
    err = one_line_error(["-config", config, "-model", "m.pt", "-src", "s"], capsys)
    assert f"c.yaml: {name}: must be" in err


WRONG_KIND = [
    ("beam_size", 2.5, "expected an integer, got 2.5"),
    ("beam_size", True, "expected an integer, got True"),
    ("alpha", "strong", "expected a number, got 'strong'"),
    ("with_score", "no", "expected true or false, got 'no'"),
    ("verbose", 1, "expected true or false, got 1"),
    ("length_penalty", "loud", "must be one of none, avg, wu, got 'loud'"),
    ("output", 12, "expected text, got 12"),
    ("ignore_when_blocking", [".", 3], "expected text, got 3"),
]


@pytest.mark.parametrize("name, value, message", WRONG_KIND,
                         ids=[f"{n}={v!r}" for n, v, _ in WRONG_KIND])
def test_yaml_values_of_the_wrong_kind(name, value, message, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({name: value}))
    err = one_line_error(["-config", config, "-model", "m.pt", "-src", "s"], capsys)
    assert f"c.yaml: {name}: {message}" in err


def test_yaml_values_of_the_right_kind_are_taken(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("beam_size: 3\nalpha: 1\nwith_score: yes\nignore_when_blocking: '.'\n"
                      "batch_size: '12'\n")
    args = translate_cli.parse_with_config(translate_cli.build_parser(),
                                           ["-config", str(config), "-src", "s"])
    assert (args.beam_size, args.alpha, args.with_score, args.batch_size) == (3, 1.0, True, 12)
    assert args.ignore_when_blocking == ["."] and isinstance(args.alpha, float)


def test_n_best_above_beam_size_is_one_line(tiny_model, capsys):
    assert translate_cli.main(["-model", tiny_model, "-src", "s", "-beam_size", "2",
                               "-n_best", "3", "-output", os.devnull]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-n_best must be between 1 and -beam_size (2)" in err


def test_gpu_without_cuda_is_one_line(tiny_model, tmp_path, capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    src = tmp_path / "in.txt"
    src.write_text("red cat\n")
    assert translate_cli.main(["-model", tiny_model, "-src", str(src), "-gpu", "0",
                               "-output", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-gpu 0: " in err and "-gpu -1 translates on the CPU" in err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert translate_cli.main(["-model", tiny_model, "-src", str(src), "-gpu", "1",
                               "-output", str(tmp_path / "o")]) == 1
    assert "-gpu 1: this machine has 1 GPU(s), ids 0 to 0" in capsys.readouterr().err


def test_help_shows_defaults_and_exits_0():
    for argv in (["-m", "onmt_lite", "-h"], ["-m", "onmt_lite", "translate", "-h"],
                 ["-m", "onmt_lite", "train", "-h"], ["-m", "onmt_lite", "evaluate", "-h"]):
        done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, (argv, done.stderr)
        assert "usage:" in done.stdout
        if argv[-1] == "-h" and len(argv) == 3:
            assert "translate" in done.stdout and "train" in done.stdout
    done = subprocess.run([sys.executable, "translate.py", "-h"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert "(default: 5)" in done.stdout and "(default: pred.txt)" in done.stdout


def test_a_bare_python_m_onmt_lite_lists_the_commands():
    done = subprocess.run([sys.executable, "-m", "onmt_lite"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "translate" in done.stderr and "train" in done.stderr
