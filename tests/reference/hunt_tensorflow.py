"""Hunts for differences between ``-search tf`` and the beam search of TensorFlow's official
models (tf-models-official 2.20, ``official/nlp/modeling/ops/beam_search.py``, run as it ships,
as make_tensorflow.py runs it): the OpenNMT-py Transformer and RNN fixtures, each plain and made
to misbehave (hunt_variant.py: never ends, ends at once, weights redrawn, tied generator rows),
on the lines hunt_lines.py draws, under a sweep of beam sizes (1 to 12), alphas (0 to 3),
``max_decode_length`` at and near the outputs' lengths (1 to 40) and batch sizes. TensorFlow
returns every one of the beam's hypotheses (finished slots that nothing filled, scored -1e7,
included; the alive ones where nothing finished) and stops a whole batch at once, so onmt_lite
decodes the same batches with ``-n_best`` the beam size.

An empty line is not decoded: onmt_lite answers it with an empty hypothesis, and TensorFlow's
search needs a source of at least one token.

Run in the TensorFlow side environment (make_tensorflow.py says how to make it), from the
repository root:

    ~/tf-peers/bin/python tests/reference/hunt_tensorflow.py          # tensorflow_hunt.json
    ~/tf-peers/bin/python tests/reference/hunt_tensorflow.py --full   # ~100 lines per case

Both print a table (hunt_search.py names the ties); tests/test_search_hunts.py replays the stored
reference.
"""
import tensorflow as tf
import torch
from hunt_search import padded, run_hunt
from make_tensorflow import beam_search

from onmt_lite.checkpoint import load_model

# (name, beam size, alpha, max_decode_length, batch size)
SETTINGS = [
    ("greedy, alpha 0", 1, 0.0, 30, 32),
    ("beam 2, alpha 0.6, batch 1", 2, 0.6, 30, 1),
    ("beam 4, alpha 0.6", 4, 0.6, 30, 32),
    ("beam 5, alpha 0, max 40", 5, 0.0, 40, 32),
    ("beam 3, alpha 1.5", 3, 1.5, 30, 32),
    ("beam 12, alpha 1, batch 7", 12, 1.0, 40, 7),
    ("beam 5, alpha 3, max 20", 5, 3.0, 20, 32),
    ("beam 5, alpha 0.6, max 8", 5, 0.6, 8, 32),
    ("beam 4, alpha 0.2, max 12, batch 7", 4, 0.2, 12, 7),
    ("beam 5, max 1", 5, 0.6, 1, 32),
    ("beam 3, alpha 0, max 3, batch 1", 3, 0.0, 3, 1),
    ("beam 8, alpha 0.6, batch 64", 8, 0.6, 30, 64),
]


def onmt_lite_options(beam: int, alpha: float, max_length: int) -> dict:
    return {"search": "tf", "beam_size": beam, "n_best": beam, "alpha": alpha,
            "max_length": max_length}


def tensorflow_nbest(model_path: str, src_lines, beam: int, alpha: float, max_length: int,
                     batch: int):
    """TensorFlow's [[text, score], ...] (all ``beam`` of them) per non-empty line."""
    model, ckpt = load_model(model_path)
    src_vocab, tgt_vocab = ckpt.src_vocab, ckpt.tgt_vocab
    lines = [line.split() for line in src_lines if line.split()]
    out = []
    for first in range(0, len(lines), batch):
        src, src_len = padded(src_vocab, lines[first:first + batch])
        rows_src, rows_len = src.repeat_interleave(beam, 0), src_len.repeat_interleave(beam, 0)
        with torch.no_grad():
            memory, final = model.encode(rows_src, rows_len)

        def symbols_to_logits(prefix, i, cache):
            with torch.no_grad():  # the whole prefix from the encoder's state at each step
                model.decoder.init_state(rows_len, memory, final)
                dec_out, _ = model.decoder(torch.from_numpy(prefix.numpy()).long())
                logits = model.generator(dec_out[:, -1]).float()
            return tf.constant(logits.numpy()), cache

        seqs, scores = beam_search.sequence_beam_search(
            symbols_to_logits, tf.fill([len(src_len)], tgt_vocab.bos), {}, len(tgt_vocab), beam,
            alpha, max_length, tgt_vocab.eos)
        for sentence, sentence_scores in zip(seqs.numpy().tolist(), scores.numpy().tolist()):
            out.append([])
            for seq, score in zip(sentence, sentence_scores):
                seq = seq[1:]  # the start token
                if score <= -1e6 and not any(seq):  # a finished slot nothing filled: the
                    seq = []  # zeros it starts with, scored -1e7; onmt_lite returns it empty
                seq = seq[:seq.index(tgt_vocab.eos)] if tgt_vocab.eos in seq else seq
                out[-1].append([" ".join(tgt_vocab.decode(seq)), round(score, 6)])
    return out


def main() -> None:
    run_hunt(__doc__, "TensorFlow", "tensorflow", {
        "tensorflow": tf.__version__,
        "beam_search": "tf-models-official 2.20 official/nlp/modeling/ops/beam_search.py"},
        [(name, batch, onmt_lite_options(beam, alpha, max_length), (beam, alpha, max_length))
         for name, beam, alpha, max_length, batch in SETTINGS],
        lambda path, src, args, batch: tensorflow_nbest(path, src, *args, batch))


if __name__ == "__main__":
    main()
