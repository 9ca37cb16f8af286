"""Checkpoints: native round trip, fp16 storage, refusals (CheckpointError naming the file),
weights with nan or inf, safe loading of hostile pickles, and OpenNMT-py 3.x checkpoints."""
import argparse
import os
import pickle
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, SHARED_FIXTURES, TINY_RNNS, TINY_TRANSFORMER, make_model, tiny_checkpoint

from onmt_lite.checkpoint import (
    CheckpointError,
    build_from_checkpoint,
    load_checkpoint,
    load_model,
    save_checkpoint,
)
from onmt_lite.cli import convert
from onmt_lite.models.transformer import sinusoidal_table


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


def log_probs(model, padded_batch):
    src, src_len, tgt = padded_batch
    return model(src, src_len, tgt)[0]


def raw(path) -> dict:
    return torch.load(path, weights_only=True)


def saved(model_type_case, src_vocab, tgt_vocab, path) -> dict:
    """Saves the case's model to ``path``; returns the payload as stored."""
    _, opt, model = model_type_case
    save_checkpoint(path, model, src_vocab, tgt_vocab, opt)
    return raw(path)


def refused(path, *fragments):
    """Asserts that loading ``path`` raises CheckpointError naming the file and the fragments."""
    with pytest.raises(CheckpointError) as err:
        load_model(str(path))
    message = str(err.value)
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, message
    return message


# -- native round trip ---------------------------------------------------------------------
def test_round_trip_gives_identical_log_probs(model_type_case, src_vocab, tgt_vocab,
                                              checkpoint_path, padded_batch):
    _, opt, model = model_type_case
    save_checkpoint(checkpoint_path, model, src_vocab, tgt_vocab, opt)
    loaded, ckpt = load_model(checkpoint_path)
    assert not loaded.training
    assert ckpt.origin == "onmt_lite"
    assert ckpt.src_vocab.itos == src_vocab.itos and ckpt.tgt_vocab.itos == tgt_vocab.itos
    assert ckpt.opt["model_type"] == opt["model_type"]
    assert torch.equal(log_probs(loaded, padded_batch), log_probs(model, padded_batch))


def test_payload_is_plain_data(model_type_case, src_vocab, tgt_vocab, checkpoint_path):
    payload = saved(model_type_case, src_vocab, tgt_vocab, checkpoint_path)
    assert payload["format"] == "onmt_lite" and payload["version"] == 1
    assert payload["vocab"] == {"src": src_vocab.itos, "tgt": tgt_vocab.itos}
    assert set(payload["generator"]) == {"weight", "bias"}
    assert not any(k.startswith("generator.") for k in payload["model"])
    assert "train" not in payload
    # the folder holds the checkpoint only: the temporary file was renamed
    assert os.listdir(os.path.dirname(checkpoint_path)) == ["model.pt"]


def test_half_stores_fp16_and_loads_fp32(model_type_case, src_vocab, tgt_vocab,
                                         checkpoint_path, padded_batch):
    _, opt, model = model_type_case
    save_checkpoint(checkpoint_path, model, src_vocab, tgt_vocab, opt, half=True)
    payload = raw(checkpoint_path)
    stored = list(payload["model"].values()) + list(payload["generator"].values())
    assert all(t.dtype == torch.float16 for t in stored if t.is_floating_point())
    loaded, _ = load_model(checkpoint_path)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    torch.testing.assert_close(log_probs(loaded, padded_batch), log_probs(model, padded_batch),
                               atol=2e-2, rtol=0)


def test_train_state_round_trip(transformer_model, src_vocab, tgt_vocab, checkpoint_path):
    state = {"step": 7, "optim": {"state": {}, "param_groups": [{"lr": 0.5, "params": [0]}]}}
    save_checkpoint(checkpoint_path, transformer_model, src_vocab, tgt_vocab, TINY_TRANSFORMER,
                    train_state=state)
    assert load_checkpoint(checkpoint_path).train_state == state


@pytest.mark.parametrize("shared", ["share_decoder_embeddings", "share_embeddings"])
def test_tied_embeddings_round_trip(tgt_vocab, checkpoint_path, padded_batch, shared):
    opt = {**TINY_TRANSFORMER, "share_decoder_embeddings": True, shared: True}
    model = make_model(opt, tgt_vocab, tgt_vocab)  # share_embeddings needs one vocabulary
    save_checkpoint(checkpoint_path, model, tgt_vocab, tgt_vocab, opt)
    payload = raw(checkpoint_path)  # a tied matrix is stored once
    assert payload["generator"]["weight"].untyped_storage().data_ptr() == payload["model"][
        "decoder.embeddings.embeddings.weight"].untyped_storage().data_ptr()
    loaded, _ = load_model(checkpoint_path)
    embeddings = loaded.decoder.embeddings.embeddings.weight
    assert loaded.generator.weight is embeddings
    if shared == "share_embeddings":
        assert loaded.encoder.embeddings.embeddings.weight is embeddings
    assert torch.equal(log_probs(loaded, padded_batch), log_probs(model, padded_batch))


def test_saving_over_an_existing_checkpoint(transformer_model, rnn_model, src_vocab, tgt_vocab,
                                            checkpoint_path):
    save_checkpoint(checkpoint_path, transformer_model, src_vocab, tgt_vocab, TINY_TRANSFORMER)
    save_checkpoint(checkpoint_path, rnn_model, src_vocab, tgt_vocab,
                    TINY_RNNS["brnn-LSTM-general"])
    assert load_checkpoint(checkpoint_path).opt["model_type"] == "rnn"


# -- refusals ------------------------------------------------------------------------------
def test_missing_file(tmp_path):
    refused(tmp_path / "absent.pt", "no such checkpoint file")


def test_a_folder_is_not_a_checkpoint(tmp_path):
    refused(tmp_path, "is a directory; expected a checkpoint file")


def test_truncated_file(transformer_model, src_vocab, tgt_vocab, checkpoint_path):
    save_checkpoint(checkpoint_path, transformer_model, src_vocab, tgt_vocab, TINY_TRANSFORMER)
    with open(checkpoint_path, "rb") as f:
        data = f.read()
    with open(checkpoint_path, "wb") as f:
        f.write(data[:len(data) // 2])
    refused(checkpoint_path, "not a checkpoint: a truncated or corrupt torch file")


# Files that are not checkpoints: torch raises many kinds of errors on them (EOFError with an
# empty message, IndexError from the unpickler...); each must become a CheckpointError.
GARBAGE = {  # name: (bytes, what the message says the file is)
    "empty": (b"", "an empty file"),
    "text": (b"this is not a checkpoint\n", "a text file"),
    "yaml": (b"model: x\n", "a text file"),
    "newline": (b"\n", "a text file"),
    "zip-magic": (b"PK\x03\x04" + bytes(50), "a truncated or corrupt torch file"),
    "random": (bytes(range(256)) * 4, "a binary file of unknown format"),
    "safetensors": (b"\x10\x00\x00\x00\x00\x00\x00\x00" + b'{"a": 1}        ',
                    "a safetensors file"),
    "legacy-pickle-int": (b"\x80\x02K\x05.", "a truncated or corrupt torch file"),
}


@pytest.mark.parametrize("data, what", list(GARBAGE.values()), ids=list(GARBAGE))
def test_garbage_file(tmp_path, data, what):
    path = tmp_path / "garbage.pt"
    path.write_bytes(data)
    refused(path, what)


def test_non_dict_payload(tmp_path):
    path = tmp_path / "list.pt"
    torch.save([1, 2, 3], path)
    refused(path, "not a dict")


@pytest.mark.parametrize("change, fragments", [
    ({"format": "fairseq"}, ["unknown checkpoint format", "'fairseq'"]),
    ({"format": None}, ["unknown checkpoint format"]),
    ({"version": 2}, ["unsupported onmt_lite checkpoint version 2", "version 1"]),
    ({"version": None}, ["checkpoint version None"]),
    ({"vocab": None}, ["missing or malformed 'vocab'"]),
    ({"model": None}, ["missing or malformed 'model'"]),
    ({"generator": [1]}, ["missing or malformed 'generator'"]),
    ({"opt": "rnn"}, ["missing or malformed 'opt'"]),
    ({"vocab": {"src": ["<unk>", "<blank>", "<s>", "</s>"]}}, ["bad vocabulary"]),
    ({"vocab": {"src": ["a", "b"], "tgt": ["a"]}}, ["bad vocabulary", "special tokens"]),
    ({"subword_models": {"src_subword_model": "spm"}}, ["malformed 'subword_models'"]),
    ({"subword_models": [torch.zeros(3, dtype=torch.uint8)]}, ["malformed 'subword_models'"]),
])
def test_malformed_payload(model_type_case, src_vocab, tgt_vocab, checkpoint_path, change,
                           fragments):
    payload = saved(model_type_case, src_vocab, tgt_vocab, checkpoint_path)
    payload.update(change)
    torch.save(payload, checkpoint_path)
    refused(checkpoint_path, *fragments)


@pytest.mark.parametrize("key", ["format", "version", "opt", "vocab", "model", "generator"])
def test_missing_key(model_type_case, src_vocab, tgt_vocab, checkpoint_path, key):
    payload = saved(model_type_case, src_vocab, tgt_vocab, checkpoint_path)
    del payload[key]
    torch.save(payload, checkpoint_path)
    if key == "format":
        # Not taken for an OpenNMT-py checkpoint: those keep their options in a Namespace.
        refused(checkpoint_path, "unknown checkpoint format")
    else:
        refused(checkpoint_path, {"version": "version"}.get(key, repr(key)))


def test_vocabulary_that_does_not_fit_the_weights(model_type_case, src_vocab, tgt_vocab,
                                                  checkpoint_path):
    payload = saved(model_type_case, src_vocab, tgt_vocab, checkpoint_path)
    payload["vocab"]["tgt"] = payload["vocab"]["tgt"][:-2]  # 11 -> 9 tokens
    torch.save(payload, checkpoint_path)
    message = refused(checkpoint_path, "has shape (11, ", "need (9, ")
    assert "decoder." in message or "generator." in message


def test_weights_missing_a_key(model_type_case, src_vocab, tgt_vocab, checkpoint_path):
    payload = saved(model_type_case, src_vocab, tgt_vocab, checkpoint_path)
    del payload["model"]["decoder.embeddings.weight" if "rnn" in payload["opt"]["model_type"]
                         else "decoder.embeddings.embeddings.weight"]
    torch.save(payload, checkpoint_path)
    refused(checkpoint_path, "weights do not fit", "missing ['decoder.embeddings")


def test_weights_with_an_extra_key(model_type_case, src_vocab, tgt_vocab, checkpoint_path):
    payload = saved(model_type_case, src_vocab, tgt_vocab, checkpoint_path)
    payload["generator"]["scale"] = torch.ones(1)
    torch.save(payload, checkpoint_path)
    refused(checkpoint_path, "weights do not fit", "unexpected ['generator.scale']")


def test_weights_that_are_not_tensors(transformer_model, src_vocab, tgt_vocab, checkpoint_path):
    save_checkpoint(checkpoint_path, transformer_model, src_vocab, tgt_vocab, TINY_TRANSFORMER)
    payload = raw(checkpoint_path)
    payload["model"]["encoder.layer_norm.weight"] = [1.0] * 16
    torch.save(payload, checkpoint_path)
    refused(checkpoint_path, "encoder.layer_norm.weight")


def test_weights_of_other_options(transformer_model, src_vocab, tgt_vocab, checkpoint_path):
    save_checkpoint(checkpoint_path, transformer_model, src_vocab, tgt_vocab, TINY_TRANSFORMER)
    payload = raw(checkpoint_path)
    payload["opt"]["enc_layers"] = 3
    torch.save(payload, checkpoint_path)
    refused(checkpoint_path, "weights do not fit", "encoder.layers.2.")


NON_FINITE = "holds {} (nan or inf): the model cannot translate"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_weights_with_nan_or_inf_are_refused(model_type_case, src_vocab, tgt_vocab,
                                            checkpoint_path, bad):
    payload = saved(model_type_case, src_vocab, tgt_vocab, checkpoint_path)
    name = sorted(payload["model"])[-1]
    payload["model"][name].view(-1)[:3] = bad
    torch.save(payload, checkpoint_path)
    expected = f"weight {name} " + NON_FINITE.format("3 non-finite values")
    assert refused(checkpoint_path, expected) == f"{checkpoint_path}: {expected}"
    # the same in fp16 storage, and in the generator
    payload = saved(model_type_case, src_vocab, tgt_vocab, checkpoint_path)
    payload["generator"]["bias"] = payload["generator"]["bias"].half()
    payload["generator"]["bias"][0] = bad
    torch.save(payload, checkpoint_path)
    refused(checkpoint_path, "weight generator.bias " + NON_FINITE.format("1 non-finite value"))


def test_large_finite_weights_load(transformer_model, src_vocab, tgt_vocab, checkpoint_path):
    """Weights whose sum overflows fp32 are finite: the model loads (and a nan is still found)."""
    payload = saved(("transformer", TINY_TRANSFORMER, transformer_model), src_vocab, tgt_vocab,
                    checkpoint_path)
    payload["generator"]["weight"].fill_(3e38)
    torch.save(payload, checkpoint_path)
    assert load_model(checkpoint_path)[0].generator.weight.max() == 3e38
    payload["generator"]["weight"][1, 1] = float("nan")
    torch.save(payload, checkpoint_path)
    refused(checkpoint_path, "weight generator.weight " + NON_FINITE.format("1 non-finite value"))


def test_command_line_refuses_a_checkpoint_with_nan_in_one_line(tmp_path):
    path = tiny_checkpoint(tmp_path / "bad.pt")
    payload = raw(path)
    payload["model"]["decoder.layers.0.feed_forward.w_1.weight"][0, :3] = float("nan")
    torch.save(payload, path)
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("a b c\n")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), "-model", "bad.pt",
                          "-src", "in.txt", "-output", "out.txt"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 1 and not out.exists()
    assert run.stderr == ("translate.py: error: bad.pt: weight decoder.layers.0.feed_forward.w_1"
                          ".weight " + NON_FINITE.format("3 non-finite values") + "\n")


@pytest.mark.parametrize("change, fragment", [
    ({"model_type": "cnn"}, "unsupported model_type 'cnn'"),
    ({"rnn_type": "SRU"}, "unsupported rnn_type 'SRU'"),
    ({"encoder_type": "mean"}, "unsupported encoder_type 'mean'"),
    ({"heads": 3}, "not a multiple of heads 3"),
])
def test_unsupported_model_option(transformer_model, src_vocab, tgt_vocab, checkpoint_path,
                                  change, fragment):
    save_checkpoint(checkpoint_path, transformer_model, src_vocab, tgt_vocab, TINY_TRANSFORMER)
    payload = raw(checkpoint_path)
    payload["opt"].update(change)
    torch.save(payload, checkpoint_path)
    refused(checkpoint_path, "bad model options", fragment)


def test_unsupported_global_attention(rnn_model, src_vocab, tgt_vocab, checkpoint_path):
    save_checkpoint(checkpoint_path, rnn_model, src_vocab, tgt_vocab,
                    TINY_RNNS["brnn-LSTM-general"])
    payload = raw(checkpoint_path)
    payload["opt"]["global_attention"] = "sparsemax"
    torch.save(payload, checkpoint_path)
    refused(checkpoint_path, "bad model options", "global_attention 'sparsemax'")


# -- hostile files -------------------------------------------------------------------------
class Exploit:
    """Unpickling this runs ``touch marker``."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_the_exploit_works_when_loaded_unsafely(tmp_path):
    """Control: the payload of the next tests really runs code under weights_only=False."""
    marker = tmp_path / "control-marker"
    path = tmp_path / "evil.pt"
    torch.save(Exploit(str(marker)), path)
    torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("layout", ["bare", "inside-a-checkpoint", "raw-pickle"])
def test_malicious_pickle_is_refused_without_running(tmp_path, layout):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    exploit = Exploit(str(marker))
    if layout == "bare":
        torch.save(exploit, path)
    elif layout == "inside-a-checkpoint":
        torch.save({"format": "onmt_lite", "version": 1, "opt": exploit, "vocab": {},
                    "model": {}, "generator": {}}, path)
    else:  # legacy (non-zip) layout: the pickle bytes alone
        path.write_bytes(pickle.dumps(exploit, protocol=2))
    refused(path, "refused")
    assert not marker.exists()


# -- OpenNMT-py 3.x checkpoints ------------------------------------------------------------
def onmt_py_names(state: dict, model_type: str, dim: int) -> dict:
    """Native weight names -> OpenNMT-py 3.x names, written out by hand."""
    out = {}
    for name, tensor in state.items():
        if name.startswith("generator."):
            continue
        side = name.split(".")[0]
        if name in (f"{side}.embeddings.weight", f"{side}.embeddings.embeddings.weight"):
            name = f"{side}.embeddings.make_embedding.emb_luts.0.weight"
        elif name.startswith("encoder.layers."):
            name = "encoder.transformer." + name[len("encoder.layers."):]
        elif name.startswith("decoder.layers."):
            name = "decoder.transformer_layers." + name[len("decoder.layers."):]
        out[name] = tensor.clone()
    if model_type == "transformer":
        for side in ("encoder", "decoder"):
            out[f"{side}.embeddings.make_embedding.pe.pe"] = sinusoidal_table(5000, dim)[:, None]
    return out


def onmt_py_options(opt: dict, **changes) -> argparse.Namespace:
    common = dict(model_type="text", enc_layers=opt["enc_layers"], dec_layers=opt["dec_layers"],
                  hidden_size=opt["hidden_size"], word_vec_size=opt["word_vec_size"],
                  dropout=[0.1], attention_dropout=[0.1], copy_attn=False, layer_norm="standard",
                  share_embeddings=False, share_decoder_embeddings=False, input_feed=1,
                  global_attention_function="softmax", coverage_attn=False)
    if opt["model_type"] == "transformer":
        common.update(encoder_type="transformer", decoder_type="transformer",
                      position_encoding=True, heads=opt["heads"],
                      transformer_ff=opt["transformer_ff"], add_qkvbias=False, add_ffnbias=False,
                      norm_eps=1e-6, max_relative_positions=0,
                      position_encoding_type="SinusoidalInterleaved")
    else:
        common.update(encoder_type=opt["encoder_type"], decoder_type="rnn",
                      position_encoding=False, rnn_type=opt["rnn_type"],
                      global_attention=opt["global_attention"], bridge=False, context_gate=None)
    common.update(changes)
    return argparse.Namespace(**common)


def write_onmt_py(path, model, opt, src_vocab, tgt_vocab, **changes):
    torch.save({
        "model": onmt_py_names(model.state_dict(), opt["model_type"], opt["hidden_size"]),
        "generator": {k: v.clone() for k, v in model.generator.state_dict().items()},
        "vocab": {"src": list(src_vocab.itos), "tgt": list(tgt_vocab.itos),
                  "data_task": "seq2seq", "decoder_start_token": "<s>"},
        "opt": onmt_py_options(opt, **changes),
        "optim": None,
    }, path)


def test_onmt_py_checkpoint_loads_with_the_same_outputs(model_type_case, src_vocab, tgt_vocab,
                                                        checkpoint_path, padded_batch):
    _, opt, model = model_type_case
    write_onmt_py(checkpoint_path, model, opt, src_vocab, tgt_vocab)
    loaded, ckpt = load_model(checkpoint_path)
    assert ckpt.origin == "opennmt-py"
    assert ckpt.opt["model_type"] == opt["model_type"]
    assert ckpt.opt["dropout"] == 0.1  # OpenNMT-py stores dropout as a list
    assert ckpt.src_vocab.itos == src_vocab.itos and ckpt.tgt_vocab.itos == tgt_vocab.itos
    assert torch.equal(log_probs(loaded, padded_batch), log_probs(model, padded_batch))


@pytest.mark.parametrize("rnn", ["rnn-GRU-mlp", "brnn-LSTM-dot"])
def test_onmt_py_rnn_variants_load(rnn, src_vocab, tgt_vocab, checkpoint_path, padded_batch):
    opt = TINY_RNNS[rnn]
    model = make_model(opt, src_vocab, tgt_vocab)
    write_onmt_py(checkpoint_path, model, opt, src_vocab, tgt_vocab)
    loaded, _ = load_model(checkpoint_path)
    assert torch.equal(log_probs(loaded, padded_batch), log_probs(model, padded_batch))


def test_convert_writes_an_equivalent_native_checkpoint(model_type_case, src_vocab, tgt_vocab,
                                                        tmp_path, padded_batch, capsys):
    _, opt, model = model_type_case
    source, target = str(tmp_path / "onmt.pt"), str(tmp_path / "native.pt")
    write_onmt_py(source, model, opt, src_vocab, tgt_vocab)
    assert convert.main(["-model", source, "-output", target]) == 0
    assert "(opennmt-py)" in capsys.readouterr().err
    payload = raw(target)
    assert payload["format"] == "onmt_lite"
    assert not any(".pe." in k or "make_embedding" in k for k in payload["model"])
    loaded, ckpt = load_model(target)
    assert ckpt.origin == "onmt_lite"
    assert torch.equal(log_probs(loaded, padded_batch), log_probs(model, padded_batch))


def test_convert_reports_a_bad_file(tmp_path, capsys):
    assert convert.main(["-model", str(tmp_path / "x.pt"), "-output",
                         str(tmp_path / "y.pt")]) == 1
    assert "no such checkpoint file" in capsys.readouterr().err
    assert not (tmp_path / "y.pt").exists()


@pytest.mark.parametrize("change, name", [
    ({"copy_attn": True}, "copy_attn=True"),
    ({"layer_norm": "rms"}, "layer_norm='rms'"),
    ({"max_relative_positions": 20}, "max_relative_positions=20"),
    ({"position_encoding_type": "Rotary"}, "position_encoding_type='Rotary'"),
    ({"position_encoding": False}, "position_encoding=False"),
    ({"decoder_type": "rnn"}, "encoder_type='transformer' with decoder_type='rnn'"),
    ({"pos_ffn_activation_fn": "gelu"}, "pos_ffn_activation_fn='gelu'"),
    ({"self_attn_type": "average"}, "self_attn_type='average'"),
])
def test_onmt_py_unsupported_option_is_refused_by_name(transformer_model, src_vocab, tgt_vocab,
                                                       checkpoint_path, change, name):
    write_onmt_py(checkpoint_path, transformer_model, TINY_TRANSFORMER, src_vocab, tgt_vocab,
                  **change)
    refused(checkpoint_path, f"OpenNMT-py option {name}", "not supported")


@pytest.mark.parametrize("change, name", [
    ({"bridge": True}, "bridge=True"),
    ({"context_gate": "both"}, "context_gate='both'"),
    ({"input_feed": 0}, "input_feed=0"),
    ({"coverage_attn": True}, "coverage_attn=True"),
    ({"global_attention_function": "sparsemax"}, "global_attention_function='sparsemax'"),
    ({"position_encoding": True}, "position_encoding=True"),
])
def test_onmt_py_unsupported_rnn_option_is_refused_by_name(rnn_model, src_vocab, tgt_vocab,
                                                           checkpoint_path, change, name):
    write_onmt_py(checkpoint_path, rnn_model, TINY_RNNS["brnn-LSTM-general"], src_vocab,
                  tgt_vocab, **change)
    refused(checkpoint_path, f"OpenNMT-py option {name}", "not supported")


def test_onmt_py_vocabulary_not_in_3x_format(transformer_model, src_vocab, tgt_vocab,
                                             checkpoint_path):
    write_onmt_py(checkpoint_path, transformer_model, TINY_TRANSFORMER, src_vocab, tgt_vocab)
    payload = torch.load(checkpoint_path, weights_only=False)
    payload["vocab"] = {"src": None, "tgt": None}
    torch.save(payload, checkpoint_path)
    refused(checkpoint_path, "3.x format")


def test_onmt_py_target_vocabulary_missing(transformer_model, src_vocab, tgt_vocab,
                                           checkpoint_path):
    write_onmt_py(checkpoint_path, transformer_model, TINY_TRANSFORMER, src_vocab, tgt_vocab)
    payload = torch.load(checkpoint_path, weights_only=False)
    payload["vocab"]["tgt"] = None
    torch.save(payload, checkpoint_path)
    refused(checkpoint_path, "vocabulary")


def test_onmt_py_options_missing_a_required_key(transformer_model, src_vocab, tgt_vocab,
                                                checkpoint_path):
    write_onmt_py(checkpoint_path, transformer_model, TINY_TRANSFORMER, src_vocab, tgt_vocab)
    payload = torch.load(checkpoint_path, weights_only=False)
    del payload["opt"].heads
    torch.save(payload, checkpoint_path)
    refused(checkpoint_path, "heads")


def test_onmt_py_weights_with_nan_are_refused(rnn_model, src_vocab, tgt_vocab, checkpoint_path):
    write_onmt_py(checkpoint_path, rnn_model, TINY_RNNS["brnn-LSTM-general"], src_vocab,
                  tgt_vocab)
    payload = torch.load(checkpoint_path, weights_only=False)
    payload["model"]["encoder.embeddings.make_embedding.emb_luts.0.weight"][4] = float("inf")
    torch.save(payload, checkpoint_path)
    # named as onmt_lite names the weight
    refused(checkpoint_path,
            "weight encoder.embeddings.weight " + NON_FINITE.format("12 non-finite values"))


def test_marian_weights_with_nan_are_refused(tmp_path):
    pytest.importorskip("transformers")
    from marian_dirs import write_marian
    folder = write_marian(tmp_path / "marian", bin_weights=True)
    weights = os.path.join(folder, "pytorch_model.bin")
    state = torch.load(weights, weights_only=True)
    state["model.decoder.layers.1.fc1.weight"][0, :2] = float("nan")
    torch.save(state, weights)
    refused(folder, "weight decoder.layers.1.feed_forward.w_1.weight "
            + NON_FINITE.format("2 non-finite values"))


def test_onmt_py_weights_of_another_vocabulary(transformer_model, src_vocab, tgt_vocab,
                                               checkpoint_path):
    write_onmt_py(checkpoint_path, transformer_model, TINY_TRANSFORMER, src_vocab, tgt_vocab)
    payload = torch.load(checkpoint_path, weights_only=False)
    payload["vocab"]["src"] = payload["vocab"]["src"][:-1]
    torch.save(payload, checkpoint_path)
    refused(checkpoint_path, "encoder.embeddings.embeddings.weight has shape (10, 16)",
            "need (9, 16)")


# -- the OpenNMT-py 3.5.1 fixtures (../shared) ---------------------------------------------
def fixture(name: str) -> str:
    path = os.path.join(SHARED_FIXTURES, name)
    if not os.path.isfile(path):
        pytest.skip(f"{path} is absent (the shared OpenNMT-py fixtures are not checked out)")
    return path


def test_onmt_py_position_table_equals_sinusoidal_table():
    with torch.serialization.safe_globals([argparse.Namespace]):
        data = torch.load(fixture("transformer.pt"), map_location="cpu", weights_only=True)
    for side in ("encoder", "decoder"):
        table = data["model"][f"{side}.embeddings.make_embedding.pe.pe"]
        assert table.shape == (5000, 1, 256)
        # float32 rounds position * frequency to 2^-23 of the position: CPUs whose sin/cos or
        # products round differently agree to a few units of that, growing with the position
        ours = sinusoidal_table(5000, 256)
        tolerance = 1e-6 + 2.5e-7 * torch.arange(5000.0).unsqueeze(1)
        assert bool(((table[:, 0] - ours).abs() <= tolerance).all())


@pytest.mark.parametrize("name, model_type", [("transformer.pt", "transformer"),
                                              ("rnn.pt", "rnn")])
def test_onmt_py_fixture_loads(name, model_type):
    path = fixture(name)
    ckpt = load_checkpoint(path)
    assert ckpt.origin == "opennmt-py" and ckpt.opt["model_type"] == model_type
    assert ckpt.src_vocab.itos[:4] == ["<unk>", "<blank>", "<s>", "</s>"]
    model = build_from_checkpoint(ckpt, path)
    assert model.generator.out_features == len(ckpt.tgt_vocab)
