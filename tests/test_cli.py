"""translate.py end to end: a tiny model trained here, and the shipped model on the demo lines."""
import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from onmt_lite.cli import translate as translate_cli
from onmt_lite.translate import build as translator_build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "data", "multi30k_en_de.pt")
SHIPPED_RAW = os.path.join(ROOT, "data", "multi30k_en_de_raw.pt")


def _run(args, capsys=None):
    code = translate_cli.main([str(a) for a in args])
    return code


def test_tiny_model_translates(tiny_model, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("red cat runs\nsmall bird sits\n\nbig dog\n")
    out = tmp_path / "out.txt"
    assert _run(["-model", tiny_model, "-src", src, "-output", out, "-beam_size", 3]) == 0
    lines = out.read_text().split("\n")[:-1]
    assert lines == ["RED CAT RUNS", "SMALL BIRD SITS", "", "BIG DOG"]


def argmax_decoding(model_path: str, lines):
    """Greedy decoding written out: the best next token of the model at each step, the whole
    prefix decoded again each time, up to OpenNMT-py's limit for the batch of all the lines.
    -> [(text, score)], the score as OpenNMT-py's greedy search gives it: the summed
    log-probabilities divided by the length with <s> and </s>."""
    from onmt_lite.checkpoint import load_model
    model, ckpt = load_model(model_path)
    words = [line.split() for line in lines]
    limit = int(min(250, max(len(w) for w in words) * 1.25 + 5))
    results = []
    with torch.no_grad():
        for line in words:
            src = torch.tensor([ckpt.src_vocab.encode(line)])
            src_len = torch.tensor([len(line)])
            prefix, total, steps = [ckpt.tgt_vocab.bos], 0.0, 0
            for steps in range(1, limit + 1):
                log_probs, _ = model(src, src_len, torch.tensor([prefix]))
                token = int(log_probs[0, -1].argmax())
                total += float(log_probs[0, -1, token])
                if token == ckpt.tgt_vocab.eos:
                    break
                prefix.append(token)
            results.append((" ".join(ckpt.tgt_vocab.decode(prefix[1:])), total / (steps + 1)))
    return results


def test_greedy_equals_beam_one_and_double_dash(tmp_path):
    """-beam_size 1, all else default, is greedy decoding (the model's best token at each
    step), with its score; the options spelled with two dashes are the same options. A seeded
    untrained model, whose greedy and beam-5 translations differ."""
    from conftest import tiny_checkpoint
    model = tiny_checkpoint(tmp_path / "tiny.pt")
    lines = ["a b c", "d e f a b", "f f", "c a e d b f a"]
    src = tmp_path / "in.txt"
    src.write_text("".join(line + "\n" for line in lines))
    a, b, beam = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "beam.txt"
    assert _run(["-model", model, "-src", src, "-output", a, "-beam_size", "1",
                 "-with_score"]) == 0
    written = [line.split("\t") for line in a.read_text().split("\n")[:-1]]
    expected = argmax_decoding(model, lines)
    assert [text for text, _ in written] == [text for text, _ in expected]
    assert [float(score) for _, score in written] == pytest.approx(
        [score for _, score in expected], abs=1e-5)
    assert _run(["--model", model, "--src", src, "--output", b, "--beam_size", 1,
                 "--with_score"]) == 0
    assert b.read_text() == a.read_text()
    assert _run(["-model", model, "-src", src, "-output", beam]) == 0
    assert beam.read_text().split("\n")[:-1] != [text for text, _ in written]


def test_n_best_and_with_score(tiny_model, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("red cat\nblue bird runs\n")
    out = tmp_path / "out.txt"
    assert _run(["-model", tiny_model, "-src", src, "-output", out, "-beam_size", 4,
                 "-n_best", 3, "-with_score"]) == 0
    lines = out.read_text().split("\n")[:-1]
    assert len(lines) == 6
    for group in (lines[:3], lines[3:]):
        scores = [float(line.split("\t")[1]) for line in group]
        assert scores == sorted(scores, reverse=True)
    assert lines[0].split("\t")[0] == "RED CAT"


def test_stdin_stdout_and_summary(tiny_model):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "translate.py"), "-model", tiny_model, "-src", "-",
         "-output", "-", "-verbose", "-report_time"],
        input="dog sits\nred bird\n", capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "DOG SITS\nRED BIRD\n"
    assert "SENT 1: ['dog', 'sits']" in proc.stderr and "PRED 1: DOG SITS" in proc.stderr
    assert "PRED SCORE: " in proc.stderr and "PRED PPL: " in proc.stderr
    assert "Tokens per second" in proc.stderr


def test_gold_scores(tiny_model, tmp_path, caplog):
    src, tgt = tmp_path / "in.txt", tmp_path / "ref.txt"
    src.write_text("red cat\nbig dog runs\n")
    tgt.write_text("RED CAT\nBIG DOG RUNS\n")
    with caplog.at_level("INFO", logger="onmt_lite"):
        assert _run(["-model", tiny_model, "-src", src, "-tgt", tgt, "-output", tmp_path / "o",
                     "-verbose"]) == 0
    text = caplog.text
    assert "GOLD SCORE: " in text and "GOLD PPL: " in text and "GOLD 2: BIG DOG RUNS" in text


def test_config_file_and_command_line_precedence(tiny_model, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("red cat\n")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"model": tiny_model, "beam_size": 4, "n_best": 2}))
    out = tmp_path / "out.txt"
    assert _run(["-config", config, "-src", src, "-output", out]) == 0
    assert len(out.read_text().split("\n")[:-1]) == 2
    assert _run(["-config", config, "-src", src, "-output", out, "-n_best", 1]) == 0
    assert len(out.read_text().split("\n")[:-1]) == 1


def test_unknown_option_and_unknown_config_key(tiny_model, tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        translate_cli.main(["-model", tiny_model, "-src", "x", "-no_such_option", "1"])
    assert err.value.code == 2
    config = tmp_path / "c.yaml"
    config.write_text("beam_sise: 3\n")
    with pytest.raises(SystemExit):
        translate_cli.main(["-config", str(config), "-model", tiny_model, "-src", "x"])
    assert "unknown options: beam_sise" in capsys.readouterr().err


def test_bad_inputs_are_clear_errors(tiny_model, tmp_path, capsys):
    out = tmp_path / "out.txt"
    assert _run(["-model", tmp_path / "missing.pt", "-src", "x", "-output", out]) == 1
    assert "missing.pt: no such checkpoint file" in capsys.readouterr().err
    assert _run(["-model", tiny_model, "-src", tmp_path / "nope.txt", "-output", out]) == 1
    assert "nope.txt: cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"red cat\nblue \xff dog\n")
    assert _run(["-model", tiny_model, "-src", bad, "-output", out]) == 1
    assert "bad.txt:2: invalid UTF-8" in capsys.readouterr().err
    assert not out.exists()


def test_failed_run_keeps_previous_output(tiny_model, tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("previous good output\n")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xfe\n")
    assert _run(["-model", tiny_model, "-src", bad, "-output", out]) == 1
    assert out.read_text() == "previous good output\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_long_source_is_truncated_with_warning(tiny_model, tmp_path, caplog):
    src = tmp_path / "in.txt"
    src.write_text(" ".join(["red"] * 30) + "\nblue cat\n")
    out = tmp_path / "out.txt"
    with caplog.at_level("WARNING", logger="onmt_lite"):
        assert _run(["-model", tiny_model, "-src", src, "-output", out,
                     "-src_seq_length_trunc", 5]) == 0
    assert "line 1 has 30 tokens: truncated to 5" in caplog.text
    assert len(out.read_text().split("\n")[:-1]) == 2


def test_attn_debug_and_attn_dump(tiny_model, tmp_path, caplog):
    src = tmp_path / "in.txt"
    src.write_text("red cat runs\nbig bird\n")
    dump = tmp_path / "attn.jsonl"
    with caplog.at_level("INFO", logger="onmt_lite"):
        assert _run(["-model", tiny_model, "-src", src, "-output", tmp_path / "o",
                     "-attn_debug", "-attn_dump", dump]) == 0
    header = [line for line in caplog.text.split("\n") if line.strip().startswith("red")]
    assert header and header[0].split() == ["red", "cat", "runs"]
    rows = [line for line in caplog.text.split("\n") if line.strip().startswith("RED ")]
    assert rows and rows[0].count("*") == 1
    records = [json.loads(line) for line in dump.read_text().splitlines()]
    assert [r["src"] for r in records] == [["red", "cat", "runs"], ["big", "bird"]]
    assert records[0]["pred"] == ["RED", "CAT", "RUNS", "</s>"]
    assert len(records[0]["attention"]) == 4 and len(records[0]["attention"][0]) == 3
    for row in records[0]["attention"]:
        assert abs(sum(row) - 1.0) < 1e-4


@pytest.mark.parametrize("reader", [[], ["-replace_unk"], ["-attn_debug"], ["-attn_dump", "a.jsonl"]])
def test_the_attention_is_kept_only_where_an_option_reads_it(reader, tiny_model, tmp_path,
                                                            monkeypatch):
    built = []
    build = translator_build.build_translator  # run imports it from there when it runs
    monkeypatch.setattr(translator_build, "build_translator",
                        lambda opt: built.append(opt["keep_attention"]) or build(opt))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("red cat runs\n")
    assert _run(["-model", tiny_model, "-src", "in.txt", "-output", "o.txt", *reader]) == 0
    assert built == [bool(reader)]


def test_sampling_is_reproducible_with_seed(tiny_model, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("red cat runs\nbig bird sits\n")
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert _run(["-model", tiny_model, "-src", src, "-output", out, "-beam_size", 1,
                     "-random_sampling_topk", 3, "-random_sampling_temp", 2.0,
                     "-seed", 5]) == 0
        outs.append(out.read_text())
    assert outs[0] == outs[1]


def test_sampling_never_draws_a_blocked_token(tiny_model):
    """As OpenNMT-py: -block_ngram_repeat edits the distribution a sample is drawn from."""
    from onmt_lite.translate import build_translator
    translator = build_translator({"model": tiny_model, "beam_size": 1, "seed": 1,
                                   "random_sampling_topk": -1, "random_sampling_temp": 50.0,
                                   "block_ngram_repeat": 1, "max_length": 8,
                                   "max_length_ratio": 0})
    results = translator.translate(["red cat runs big bird sits"] * 40)
    for result in results:
        assert len(set(result.preds[0])) == len(result.preds[0]), result.preds[0]
        assert result.scores[0] > -1e4


@pytest.mark.skipif(not os.path.exists(SHIPPED), reason="the shipped model is not in data/")
def test_shipped_model_on_demo_sentences(tmp_path):
    out = tmp_path / "demo.de"
    assert _run(["-model", SHIPPED_RAW, "-src", os.path.join(ROOT, "data", "demo.en"),
                 "-output", out, "-beam_size", 5]) == 0
    lines = out.read_text().split("\n")[:-1]
    assert len(lines) == 8 and all(lines)
    assert lines[3].startswith("Ein schwarzer Hund") and lines[3].endswith(".")


def test_lowercased_model_on_its_demo_sentences(tmp_path):
    out = tmp_path / "demo.de"
    assert _run(["-model", SHIPPED, "-src", os.path.join(ROOT, "data", "demo.lc.en"),
                 "-output", out, "-beam_size", 5]) == 0
    lines = out.read_text().split("\n")[:-1]
    assert len(lines) == 8 and all(lines)
    assert lines[3].startswith("ein schwarzer hund")


def test_batch_type_tokens_threads_and_inter_threads(tiny_model, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("red cat runs\nsmall bird\nbig dog sits red\nblue cat\n")
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    assert _run(["-model", tiny_model, "-src", src, "-output", a, "-max_length_ratio", 0]) == 0
    assert _run(["-model", tiny_model, "-src", src, "-output", b, "-max_length_ratio", 0,
                 "-batch_type", "tokens", "-batch_size", 6, "-threads", 1]) == 0
    assert a.read_text() == b.read_text()
    assert _run(["-model", tiny_model, "-src", src, "-output", b, "-max_length_ratio", 0,
                 "-batch_size", 1, "-inter_threads", 2, "-with_score"]) == 0
    assert _run(["-model", tiny_model, "-src", src, "-output", a, "-max_length_ratio", 0,
                 "-batch_size", 1, "-with_score"]) == 0
    assert a.read_text() == b.read_text()


def test_int8_and_bf16_translate_and_fp16_needs_a_gpu(tiny_model, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("red cat runs\nsmall bird\nbig dog sits red\n\nblue cat\n")
    fp32, int8, bf16 = tmp_path / "fp32.txt", tmp_path / "int8.txt", tmp_path / "bf16.txt"
    assert _run(["-model", tiny_model, "-src", src, "-output", fp32]) == 0
    assert _run(["-model", tiny_model, "-src", src, "-output", int8, "-int8"]) == 0
    assert _run(["-model", tiny_model, "-src", src, "-output", bf16, "-precision", "bf16"]) == 0
    # both move scores a little; on this easy task the words stay the same
    assert int8.read_text() == fp32.read_text()
    assert bf16.read_text() == fp32.read_text()
    from onmt_lite.translate import build_translator
    quantised = build_translator({"model": tiny_model, "int8": True}).model
    assert any("quantized" in type(m).__module__ for m in quantised.modules())
    capsys.readouterr()
    assert _run(["-model", tiny_model, "-src", src, "-output", fp32, "-precision", "fp16"]) == 2
    assert "-precision fp16 needs a GPU" in capsys.readouterr().err
    assert _run(["-model", tiny_model, "-src", src, "-output", fp32, "-precision", "bf16",
                 "-int8"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_input_is_streamed_in_shards(tiny_model, tmp_path, capsys):
    from onmt_lite.translate import build_translator
    words = ["red cat runs", "small bird", "big dog sits red", "", "blue cat", "red dog"]
    lines = [words[i % len(words)] for i in range(20)]
    translator = build_translator({"model": tiny_model, "max_length_ratio": 0})
    whole = [t.preds for t in translator.translate(lines, shard_size=0)]
    consumed = []

    def source():
        for line in lines:
            consumed.append(line)
            yield line

    stream = translator.translate_iter(source(), batch_size=2, shard_size=4)
    first = next(stream)
    assert first.index == 0 and len(consumed) == 4  # one shard read, not the whole input
    assert [first.preds] + [t.preds for t in stream] == whole
    # target line counts are checked across shards, whichever file is longer
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("".join(line + "\n" for line in lines))
    for n_tgt in (19, 21, 8):
        tgt.write_text("x\n" * n_tgt)
        assert _run(["-model", tiny_model, "-src", src, "-tgt", tgt, "-output", tmp_path / "o",
                     "-shard_size", 4]) == 1
        assert f"tgt.txt: has {n_tgt} lines but the source has 20" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


# -- progress bar, byte-order mark, unknown words ------------------------------------------
def _translate_process(tiny_model, src, *extra):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "translate.py"), "-model", tiny_model, "-src", src,
         "-output", "-", *map(str, extra)], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_progress_bar_only_where_asked_or_on_a_terminal(tiny_model, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("red cat\nbig dog runs\n" * 20)
    piped = _translate_process(tiny_model, src, "-batch_size", 4)  # stderr is not a terminal
    assert piped.returncode == 0 and "translate:" not in piped.stderr
    asked = _translate_process(tiny_model, src, "-batch_size", 4, "-progress", "-verbose")
    assert asked.returncode == 0 and "translate:" in asked.stderr
    # every log record starts its own line, none is glued to the bar
    starts = [i for i in range(len(asked.stderr)) if asked.stderr.startswith("[20", i)]
    assert len(starts) > 40 and all(i == 0 or asked.stderr[i - 1] in "\r\n" for i in starts)
    assert "red cat" not in asked.stdout and asked.stdout.count("\n") == 40
    both = _translate_process(tiny_model, src, "-progress", "-no_progress")
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_no_progress_turns_the_bar_off(tiny_model, tmp_path, monkeypatch):
    from onmt_lite.translate.translator import Translator
    shown = []
    original = Translator.translate_batches

    def recording(self, src, tgt=None, batch_size=30, progress=False, **kwargs):
        shown.append(progress)
        return original(self, src, tgt, batch_size, progress, **kwargs)

    monkeypatch.setattr(Translator, "translate_batches", recording)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # as on a terminal
    src = tmp_path / "in.txt"
    src.write_text("red cat\n")
    for flags, expected in (([], True), (["-no_progress"], False)):
        assert _run(["-model", tiny_model, "-src", src, "-output", tmp_path / "o", *flags]) == 0
        assert shown.pop() is expected


def test_byte_order_mark_is_not_glued_to_the_first_word(tiny_model, tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes("\ufeffred cat runs\n\ufeffbig dog\n".encode("utf-8"))
    out = tmp_path / "out.txt"
    assert _run(["-model", tiny_model, "-src", src, "-output", out]) == 0
    first, second = out.read_text().split("\n")[:2]
    assert first == "RED CAT RUNS"  # only the file's first line can carry a byte-order mark
    assert second != "BIG DOG"


def test_many_unknown_words_warn_once_with_the_likely_cause(tiny_model, tmp_path, caplog):
    src = tmp_path / "in.txt"
    src.write_text("Red cat runs.\nBig dog sits.\n" * 3)
    with caplog.at_level("WARNING", logger="onmt_lite"):
        assert _run(["-model", tiny_model, "-src", src, "-output", tmp_path / "o",
                     "-shard_size", 2]) == 0
    warnings = [r.getMessage() for r in caplog.records if "vocabulary" in r.getMessage()]
    assert len(warnings) == 1, warnings
    # measured on the first shard (2 lines): "Red", "Big" and "runs.", "sits." are unknown
    assert warnings[0].startswith("4 of 6 source tokens (67%) are not in the model's vocabulary")
    assert "vocabulary is lowercased but 2 of them are known in lower case" in warnings[0]
    assert "2 of them are known words with punctuation attached: the input looks untokenized" \
        in warnings[0]
    caplog.clear()
    src.write_text("red cat runs\nbig dog sits\n")
    with caplog.at_level("WARNING", logger="onmt_lite"):
        assert _run(["-model", tiny_model, "-src", src, "-output", tmp_path / "o"]) == 0
    assert "vocabulary" not in caplog.text


@pytest.mark.parametrize("options, inter_threads", [
    ([], 0), (["-threads", "2"], 1), (["-workers", "2"], 1), (["-inter_threads", "3"], 3)])
def test_no_thread_options_leave_the_layout_to_the_machine(options, inter_threads, tmp_path,
                                                          monkeypatch):
    """With no -threads or -workers, -inter_threads 0 chooses the layout batch by batch;
    a layout asked for decodes one batch at a time in each process."""
    given = {}

    def stop(opt):
        given.update(opt)
        raise KeyboardInterrupt

    monkeypatch.setattr(translator_build, "build_translator", stop)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this process keeps its own
    src = tmp_path / "in.txt"
    src.write_text("a\n")
    with pytest.raises(KeyboardInterrupt):
        translate_cli.run(translate_cli.parse_with_config(translate_cli.build_parser(), [
            "-model", "m.pt", "-src", str(src), "-output", str(tmp_path / "o"), *options]))
    assert given["inter_threads"] == inter_threads


def test_token_batches_count_the_target_with_tgt(tiny_model):
    """-batch_type tokens with -tgt: a line's length is its source's or its target's with <s>
    and </s>, whichever is longer, and the batch's longest line sets its cost, as OpenNMT-py's
    batch_iter (max_src_tgt) counts."""
    from onmt_lite.translate import build_translator
    translator = build_translator({"model": tiny_model})
    src = [["a", "b"], ["a", "c"], ["b", "c"]]
    tgt = [["x"] * 8, ["x"], ["y"]]
    # sorted by (source, target + 2): lines 1, 2 (3 tokens), then 0 (10): 3 x 10 > 12
    assert list(translator._batches(src, tgt, 12, "tokens")) == [[1, 2], [0]]
    assert list(translator._batches(src, None, 12, "tokens")) == [[0, 1, 2]]
    assert list(translator._batches(src, tgt, 2, "sents")) == [[1, 2], [0]]
