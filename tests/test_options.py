"""Options are typed and range-checked once, whatever their source (command line or YAML
-config), with one line naming the option; and the small things of the command line."""
import os
import subprocess
import sys

import pytest
import yaml
from conftest import tiny_checkpoint

from onmt_lite.cli import train as train_cli
from onmt_lite.cli import translate as translate_cli
from onmt_lite.errors import OptionError
from onmt_lite.options import Bounded, integer, number
from onmt_lite.search.global_scorer import GNMTGlobalScorer
from onmt_lite.train.trainer import train
from onmt_lite.translate import build_translator
from onmt_lite.translate.options import DecodingOptions

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


def test_bounded_refuses_nan_and_infinities():
    for bad in ("nan", "inf", "-inf", "1e400", float("nan"), float("-inf"), 10 ** 400):
        with pytest.raises(Exception, match="must be a finite number"):
            number()(bad)


# every number option of translate.py, with the values that compare False with every bound
FLOATS = sorted(a.dest for a in translate_cli.build_parser()._actions
                if isinstance(a.type, Bounded) and a.type.kind is float)
NON_FINITE = [(name, value) for name in FLOATS for value in ("nan", "inf", "-inf")]


@pytest.mark.parametrize("name, value", NON_FINITE, ids=[f"{n}={v}" for n, v in NON_FINITE])
def test_non_finite_numbers_are_refused_on_the_command_line_and_in_a_config(name, value,
                                                                            tmp_path, capsys):
    err = one_line_error(["-model", "m.pt", "-src", "s", f"-{name}={value}"], capsys)
    assert f"argument -{name}/--{name}: must be a finite number, got {value}" in err
    config = tmp_path / "c.yaml"
    config.write_text(f"{name}: {value.replace('nan', '.nan').replace('inf', '.inf')}\n")
    err = one_line_error(["-config", config, "-model", "m.pt", "-src", "s"], capsys)
    assert f"c.yaml: {name}: must be a finite number, got {value}" in err


@pytest.mark.parametrize("name", [f for f in FLOATS if f in DecodingOptions.__dataclass_fields__])
def test_the_python_api_refuses_non_finite_numbers_by_option_name(name):
    for value in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(OptionError, match=f"^-{name}: must be a finite number, got "):
            DecodingOptions(**{name: value}).validate()
    # build_translator checks them before it loads a model
    with pytest.raises(OptionError, match=f"^-{name}: must be a finite number, got nan$"):
        build_translator({"model": "no_such_model.pt", name: float("nan")})


def test_refused_combinations_are_option_errors(tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    for options, message in (
            ({"search": "tf", "alpha": -0.5}, "-search tf needs -alpha 0 or more"),
            ({"model": [model, model], "search": "hf"}, "an ensemble decodes with -search onmt"),
            ({"workers": 2, "threads": 2}, "one torch thread per process"),
            ({"workers": 2, "inter_threads": 2}, "-workers decodes on CPU"),
            ({"beam_size": 2, "n_best": 3}, "-n_best must be between 1 and -beam_size"),
            ({"beam_size": 2.5}, "-beam_size: expected an integer, got 2.5")):
        with pytest.raises(OptionError, match=message):
            build_translator({"model": model, **options})
    with pytest.raises(OptionError, match="^-beta: must be a finite number, got nan$"):
        GNMTGlobalScorer(beta=float("nan"), coverage_penalty="wu")


def translate_process(*args, cwd):
    return subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"),
                           *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", ["alpha nan", "config .nan", "config latin-1", "n_best",
                                  "ensemble hf"])
def test_refused_options_exit_2_in_one_line_without_output(case, tmp_path):
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    (tmp_path / "in.txt").write_text("a b c\n")
    (tmp_path / "nan.yaml").write_text("beam_size: 2\nalpha: .nan\n")
    (tmp_path / "latin1.yaml").write_bytes("beam_size: 2\n# café\n".encode("latin-1"))
    extra, message = {
        "alpha nan": (["-alpha", "nan"], "argument -alpha/--alpha: must be a finite number, "
                                         "got nan"),
        "config .nan": (["-config", "nan.yaml"], "nan.yaml: alpha: must be a finite number, "
                                                 "got nan"),
        "config latin-1": (["-config", "latin1.yaml"], "latin1.yaml: line 2: not UTF-8"),
        "n_best": (["-beam_size", "2", "-n_best", "3"], "-n_best must be between 1 and "
                                                        "-beam_size (2)"),
        "ensemble hf": (["-model", model, model, "-search", "hf"], "-model: an ensemble "
                                                                   "decodes with -search onmt"),
    }[case]
    done = translate_process("-model", model, "-src", "in.txt", "-output", "out.txt", *extra,
                             cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("translate.py: error: ") and message in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize("key, value, message", [
    ("learning_rate", float("nan"), "learning_rate: must be a finite number, got nan"),
    ("dropout", float("inf"), "dropout: must be a finite number, got inf"),
    ("adam_beta2", 1.0, "adam_beta2: must be less than 1, got 1.0"),
    ("label_smoothing", 1.5, "label_smoothing: must be at most 1, got 1.5"),
    ("decay_method", "cosine", "decay_method: must be one of noam, rsqrt, none, got 'cosine'"),
    ("heads", 3, "hidden size 32 is not a multiple of heads 3"),
])
def test_training_configs_refuse_non_finite_and_out_of_range_values(toy_task, key, value,
                                                                     message):
    config, _ = toy_task(train_steps=1, **{key: value})
    with pytest.raises(OptionError, match=f"^{message}$"):
        train(config, progress=False)


def test_training_option_errors_exit_2_and_missing_files_1(toy_task, tmp_path, capsys,
                                                           monkeypatch):
    config, path = toy_task(train_steps=1)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(open(path, "rb").read() + "# café\n".encode("latin-1"))
    lines = open(path, "rb").read().count(b"\n")
    assert train_cli.main(["-config", str(latin1), "-no_progress"]) == 2
    assert capsys.readouterr().err == (f"onmt_lite_train: error: {latin1}: line {lines + 1}: "
                                       "not UTF-8 (byte 0xe9); save the file as UTF-8\n")
    nan = tmp_path / "nan.yaml"
    nan.write_text(yaml.safe_dump({**config, "learning_rate": float("nan")}))
    assert train_cli.main(["-config", str(nan), "-no_progress"]) == 2
    assert "learning_rate: must be a finite number, got nan" in capsys.readouterr().err
    missing = tmp_path / "missing.yaml"
    config["data"]["corpus_1"]["path_src"] = str(tmp_path / "nope.src")
    missing.write_text(yaml.safe_dump(config))
    assert train_cli.main(["-config", str(missing), "-no_progress"]) == 1
    assert "nope.src: cannot read" in capsys.readouterr().err
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert train_cli.main(["-config", path, "-no_progress", "-gpu", "0"]) == 1
    assert capsys.readouterr().err.count("\n") == 1


OUT_OF_RANGE = [
    ("batch_size", 0), ("batch_size", -1), ("beam_size", 0), ("n_best", 0),
    ("min_length", -1), ("max_length", 0), ("max_length_ratio", -0.5),
    ("block_ngram_repeat", -2), ("src_seq_length_trunc", -1), ("shard_size", -1),
    ("threads", -1), ("inter_threads", -1), ("repetition_penalty", 0), ("beta", -0.1), ("gpu", -2),
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
