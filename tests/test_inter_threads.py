"""-inter_threads: batches decoded side by side, each thread with its own decoder state."""
import pytest
import torch
from conftest import SRC_WORDS, TINY_MODELS, make_model

import onmt_lite.translate.translator as translator_module
from onmt_lite.models.inference import for_inference
from onmt_lite.models.model import pin_submodules, replica
from onmt_lite.translate import DecodingOptions, Translator
from onmt_lite.translate.workers import WorkerPool


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("model_name", ["transformer", "brnn-LSTM-general"])
def test_inter_threads_give_the_same_translations(model_name, precision, src_vocab, tgt_vocab):
    model = for_inference(make_model(TINY_MODELS[model_name], src_vocab, tgt_vocab, seed=5),
                          "cpu", precision=precision)
    gen = torch.Generator().manual_seed(11)
    lines = [" ".join(SRC_WORDS[int(i)] for i in torch.randint(0, 6, (int(n),), generator=gen))
             for n in torch.randint(0, 9, (40,), generator=gen)]
    results = {}
    for threads in (1, 3):
        translator = Translator(model, src_vocab, tgt_vocab, DecodingOptions(beam_size=3, n_best=2),
                                inter_threads=threads)
        results[threads] = translator.translate(lines, tgt=lines, batch_size=4)
    for one, three in zip(results[1], results[3]):
        assert (one.index, one.preds, one.scores, one.gold_score) == \
            (three.index, three.preds, three.scores, three.gold_score)


@pytest.mark.parametrize("pinned", [False, True], ids=["plain", "pinned"])
def test_replica_shares_weights_not_decoder_state(src_vocab, tgt_vocab, pinned):
    model = make_model(TINY_MODELS["transformer"], src_vocab, tgt_vocab)
    if pinned:  # as for_inference leaves it
        pin_submodules(model)
    twin = replica(model)
    assert vars(twin).get("decoder", twin.decoder) is twin.decoder
    assert twin.decoder is not model.decoder and twin.encoder is model.encoder
    assert twin.decoder.layers[0].self_attn.linear_query.weight is \
        model.decoder.layers[0].self_attn.linear_query.weight
    src, src_len = torch.tensor([[4, 5, 6], [6, 5, 1]]), torch.tensor([3, 2])
    with torch.no_grad():
        model.decoder.init_state(src_len[:1], *model.encode(src[:1], src_len[:1]))
        twin.decoder.init_state(src_len, *model.encode(src, src_len))
        model.decoder.step(torch.tensor([2]))
    assert model.decoder.state["src_mask"].size(0) == 1 and model.decoder.position == 1
    assert twin.decoder.state["src_mask"].size(0) == 2 and twin.decoder.position == 0


def test_sampling_refuses_inter_threads(src_vocab, tgt_vocab):
    model = make_model(TINY_MODELS["transformer"], src_vocab, tgt_vocab)
    with pytest.raises(ValueError, match="inter_threads 1"):
        Translator(model, src_vocab, tgt_vocab,
                   DecodingOptions(beam_size=1, random_sampling_topk=3, seed=1), inter_threads=2)
    with pytest.raises(ValueError, match="at least 0"):
        Translator(model, src_vocab, tgt_vocab, inter_threads=-1)


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_default_layout_puts_batches_side_by_side(src_vocab, tgt_vocab, torch_threads,
                                                      monkeypatch):
    """-inter_threads 0: several batches go to forked processes, one per core, each on one
    torch thread (threads where processes cannot serve); a lone batch on as many threads as it
    has sentences, up to the cores; the same output."""
    model = make_model(TINY_MODELS["transformer"], src_vocab, tgt_vocab, seed=2)
    lines = ["a b c", "d e", "f a b d", "c c", "e f a", "b"] * 4
    one = Translator(model, src_vocab, tgt_vocab, inter_threads=1)
    auto = Translator(model, src_vocab, tgt_vocab, inter_threads=0)
    auto.cores = 2  # as on a machine of two cores, whatever this one has
    batch = ([0, 1, 2], None, None, 0)
    assert auto._forks([batch] * 5) and not auto._forks([batch])
    assert auto._side_by_side([batch] * 5) == 2 and torch.get_num_threads() == 1
    assert auto._side_by_side([batch]) == 1 and torch.get_num_threads() == 2
    assert auto._side_by_side([([0], None, None, 0)]) == 1 and torch.get_num_threads() == 1
    pools = []
    monkeypatch.setattr(translator_module, "WorkerPool",
                        lambda *args: pools.append(args[1]) or WorkerPool(*args))
    expected = [t.preds for t in one.translate(lines, batch_size=4)]
    assert [t.preds for t in auto.translate(lines, batch_size=4)] == expected
    assert pools == [2]  # two processes, forked once for the run
    alone = [t.preds for t in one.translate(lines[:4], batch_size=4)]
    assert [t.preds for t in auto.translate(lines[:4], batch_size=4)] == alone
    assert pools == [2]  # a lone batch: no processes
    threads = Translator(model, src_vocab, tgt_vocab, inter_threads=2)  # batches on threads
    assert not threads._forks([batch] * 5)
    assert [t.preds for t in threads.translate(lines, batch_size=4)] == expected
    assert pools == [2]
    sampling = Translator(model, src_vocab, tgt_vocab, DecodingOptions(
        beam_size=1, random_sampling_topk=3, seed=1), inter_threads=0)
    assert not sampling._forks([batch] * 5)
    assert sampling._side_by_side([batch] * 5) == 1  # one generator: draws in a fixed order
    assert not Translator(model, src_vocab, tgt_vocab, inter_threads=1)._forks([batch] * 5)


def test_a_second_call_while_the_first_is_open(src_vocab, tgt_vocab):
    # the first call's threads are still decoding queued batches when the second one runs
    model = make_model(TINY_MODELS["transformer"], src_vocab, tgt_vocab, seed=2)
    lines = ["a b c", "d e", "f a b d", "c c", "e f a", "b"] * 4
    translator = Translator(model, src_vocab, tgt_vocab, DecodingOptions(beam_size=3),
                            inter_threads=2)
    alone = [t.preds for t in translator.translate(lines, batch_size=2)]
    nested = []
    for t in translator.translate_iter(lines, batch_size=2):
        nested.append(t.preds)
        assert [u.preds for u in translator.translate(lines[:3], batch_size=1)] == alone[:3]
    assert nested == alone


def test_a_model_loads_on_one_thread_and_decodes_on_the_threads_it_had(tmp_path, torch_threads,
                                                                       monkeypatch):
    """build_translator loads on one torch thread (an OpenMP team on a busy CPU waits for its
    descheduled threads) and gives the process back its threads before decoding."""
    from conftest import tiny_checkpoint

    from onmt_lite.translate import build as module
    path = tiny_checkpoint(tmp_path / "tiny.pt")
    seen = []
    load_model = module.load_model
    monkeypatch.setattr(module, "load_model",
                        lambda *args: seen.append(torch.get_num_threads()) or load_model(*args))
    torch.set_num_threads(2)
    translator = module.build_translator({"model": path})
    assert seen == [1] and torch.get_num_threads() == 2 and translator.cores == 2


def test_pinned_submodules_are_the_modules_and_a_swap_unpins():
    """pin_submodules puts each submodule in its parent's instance dictionary (found there
    without nn.Module's __getattr__); one replaced through setattr is the new one."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU()))
    pin_submodules(model)
    assert vars(model)["0"] is model._modules["0"] and vars(model[1])["0"] is model[1][0]
    swapped = torch.nn.Linear(2, 2)
    setattr(model, "0", swapped)
    assert getattr(model, "0") is swapped and model[0] is swapped
