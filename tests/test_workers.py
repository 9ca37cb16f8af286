"""-workers: batches decoded by forked processes give the one-process output, byte for byte."""
import gc
import os

import pytest
import torch
from conftest import SRC_WORDS, TINY_MODELS, make_model, tiny_checkpoint

from onmt_lite.cli import translate as translate_cli
from onmt_lite.models.inference import for_inference
from onmt_lite.translate import DecodingOptions, Translator, build_translator
from onmt_lite.translate import workers as workers_module


def _lines(count: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [" ".join(SRC_WORDS[int(i)] for i in torch.randint(0, 6, (int(n),), generator=gen))
            for n in torch.randint(0, 9, (count,), generator=gen)]  # some lines empty


@pytest.mark.parametrize("model_name", ["transformer", "brnn-LSTM-general"])
def test_workers_give_the_one_process_translations(model_name, src_vocab, tgt_vocab):
    model = for_inference(make_model(TINY_MODELS[model_name], src_vocab, tgt_vocab, seed=5), "cpu")
    lines = _lines(37, 11)  # 10 batches of 4: not a multiple of the workers
    assert "" in lines
    results, threads = {}, torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' one thread each, here too
    try:
        for workers in (1, 2, 3):
            translator = Translator(model, src_vocab, tgt_vocab,
                                    DecodingOptions(beam_size=3, n_best=2), workers=workers)
            results[workers] = translator.translate(lines, tgt=lines, batch_size=4)
    finally:
        torch.set_num_threads(threads)
    for one, *others in zip(results[1], results[2], results[3]):
        for other in others:
            assert (one.index, one.preds, one.scores, one.gold_score) == \
                (other.index, other.preds, other.scores, other.gold_score)
            assert all(torch.equal(a, b) for a, b in zip(one.attns, other.attns))


def test_more_workers_than_batches(src_vocab, tgt_vocab):
    model = for_inference(make_model(TINY_MODELS["transformer"], src_vocab, tgt_vocab), "cpu")
    lines = _lines(5, 3)
    one = Translator(model, src_vocab, tgt_vocab, DecodingOptions(beam_size=2))
    four = Translator(model, src_vocab, tgt_vocab, DecodingOptions(beam_size=2), workers=4)
    assert [t.preds for t in one.translate(lines, batch_size=2)] == \
        [t.preds for t in four.translate(lines, batch_size=2)]


def test_workers_refuse_threads_gpus_and_sampling(src_vocab, tgt_vocab, tmp_path):
    model = make_model(TINY_MODELS["transformer"], src_vocab, tgt_vocab)
    with pytest.raises(ValueError, match="without -inter_threads"):
        Translator(model, src_vocab, tgt_vocab, workers=2, inter_threads=2)
    with pytest.raises(ValueError, match="-inter_threads 1 and -workers 1"):
        Translator(model, src_vocab, tgt_vocab, DecodingOptions(beam_size=1,
                   random_sampling_topk=5), workers=2)
    path = tiny_checkpoint(tmp_path / "model.pt")
    with pytest.raises(ValueError, match="one torch thread per process: give -threads 1"):
        build_translator({"model": path, "workers": 2, "threads": 2})


def test_the_command_line_output_is_the_same_file(tmp_path):
    checkpoint_path = tiny_checkpoint(tmp_path / "model.pt")
    src = tmp_path / "src.txt"
    src.write_text("".join(line + "\n" for line in _lines(23, 7)), encoding="utf-8")
    outputs = []
    for workers in ("1", "2"):
        out = tmp_path / f"out.{workers}.txt"
        assert translate_cli.main(["-model", checkpoint_path, "-src", str(src), "-output",
                                   str(out), "-batch_size", "3", "-workers", workers,
                                   "-threads", "1"]) == 0
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1] and outputs[0].count(b"\n") == 23


def test_a_worker_that_dies_is_one_clear_error(tmp_path, monkeypatch, capsys):
    """The children inherit the patched method through fork: each ends its process."""
    model, src = tiny_checkpoint(tmp_path / "model.pt"), tmp_path / "src.txt"
    src.write_text("".join(line + "\n" for line in _lines(12, 5)), encoding="utf-8")
    monkeypatch.setattr(Translator, "_translate_batch", lambda *args: os._exit(9))
    out = tmp_path / "out.txt"
    out.write_text("the previous output\n", encoding="utf-8")
    assert translate_cli.main(["-model", model, "-src", str(src), "-output", str(out),
                               "-batch_size", "3", "-workers", "2"]) == 1
    assert "-workers: a worker process ended without finishing its batch" in \
        capsys.readouterr().err
    assert out.read_text(encoding="utf-8") == "the previous output\n"


def test_one_pool_of_frozen_parents_serves_every_shard(src_vocab, tgt_vocab, monkeypatch):
    """The workers fork once per run, not once per shard, after the parent's objects are frozen
    out of the garbage collector (so the children's collections copy none of its pages)."""
    pools, frozen = [], []

    class CountedPool(workers_module.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs):
            pools.append(self)
            frozen.append(gc.get_freeze_count())
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(workers_module, "ProcessPoolExecutor", CountedPool)
    model = for_inference(make_model(TINY_MODELS["transformer"], src_vocab, tgt_vocab), "cpu")
    lines = _lines(30, 4)
    one = Translator(model, src_vocab, tgt_vocab, DecodingOptions(beam_size=2))
    two = Translator(model, src_vocab, tgt_vocab, DecodingOptions(beam_size=2), workers=2)
    assert [t.preds for t in one.translate(lines, batch_size=2, shard_size=7)] == \
        [t.preds for t in two.translate(lines, batch_size=2, shard_size=7)]
    assert len(pools) == 1 and frozen[0] > 0
    assert gc.get_freeze_count() == 0  # the parent collects as before once the run ends
    with workers_module.WorkerPool(two, 2) as processes:  # forked on entry, before any input
        assert len(processes.pool._processes) == 2
