"""Makes tests/reference/tensorflow.json: the beam search of TensorFlow's official models
(tf-models-official 2.20: official/nlp/modeling/ops/beam_search.py, run as it ships, with
tensorflow-cpu) on the first LINES lines of test_2016_flickr, for test_search_tensorflow.py.

TensorFlow's search drives onmt_lite's model of the OpenNMT-py Transformer fixture (the same
weights): its symbols_to_logits_fn returns the model's next-token logits for the whole prefix.
So the reference proves the search rule, not the model: the logits TensorFlow's search ranks are
onmt_lite's own model's, and an error in that model would be on both sides and go unseen here
(the prefix is decoded whole at each step, so onmt_lite's step-by-step decoder state is not
used). The model is checked against OpenNMT-py's own outputs (test_parity.py and the other
OpenNMT-py references).
TensorFlow is not a dependency: run this in a side virtualenv, from the repository root:

    python3 -m venv ~/tf-peers && ~/tf-peers/bin/pip install torch==2.13.0 tensorflow-cpu
    ~/tf-peers/bin/pip install --no-deps 'tf-models-official==2.20.*' 'tf-keras==2.21.*'
    ~/tf-peers/bin/pip install -e . && ~/tf-peers/bin/python tests/reference/make_tensorflow.py
"""
import importlib.util
import json
import os

import official
import tensorflow as tf
import torch

from onmt_lite.checkpoint import load_model

# The module file itself: it needs only tensorflow and numpy, while importing it through its
# package would import the package's Keras layers (tf_keras) too.
_PATH = os.path.join(os.path.dirname(official.__file__), "nlp", "modeling", "ops",
                     "beam_search.py")
_SPEC = importlib.util.spec_from_file_location("beam_search", _PATH)
beam_search = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(beam_search)

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "..", "shared")
MODEL = os.path.join(SHARED, "fixtures", "onmt-py", "transformer.pt")
SOURCE = os.path.join(SHARED, "data", "multi30k", "test_2016_flickr.lc.tok.en")
LINES = 100
# name -> sequence_beam_search arguments (beam_size, alpha, max_decode_length)
CASES = {
    "beam 4, alpha 0.6": dict(beam_size=4, alpha=0.6, max_decode_length=30),
    "beam 5, alpha 0": dict(beam_size=5, alpha=0.0, max_decode_length=30),
    "beam 3, alpha 1.5": dict(beam_size=3, alpha=1.5, max_decode_length=30),
    "beam 5, alpha 0.6, 8 tokens at most": dict(beam_size=5, alpha=0.6, max_decode_length=8),
}


def main() -> None:
    model, ckpt = load_model(MODEL)
    src_vocab, tgt_vocab = ckpt.src_vocab, ckpt.tgt_vocab
    with open(SOURCE, encoding="utf-8") as f:
        lines = [next(f).split() for _ in range(LINES)]
    ids = [src_vocab.encode(line) for line in lines]
    src_len = torch.tensor([len(x) for x in ids])
    src = torch.full((len(ids), int(src_len.max())), src_vocab.pad, dtype=torch.long)
    for row, x in enumerate(ids):
        src[row, :len(x)] = torch.tensor(x)
    out = {"made_by": "tests/reference/make_tensorflow.py", "tensorflow": tf.__version__,
           "beam_search": "tf-models-official 2.20 official/nlp/modeling/ops/beam_search.py",
           "torch": torch.__version__, "model": "../shared/fixtures/onmt-py/transformer.pt",
           "source": f"first {LINES} lines of test_2016_flickr.lc.tok.en", "cases": {}}
    for name, options in CASES.items():
        beam = options["beam_size"]
        rows_src, rows_len = src.repeat_interleave(beam, 0), src_len.repeat_interleave(beam, 0)

        def symbols_to_logits(prefix, i, cache):
            with torch.no_grad():
                memory, final = model.encode(rows_src, rows_len)
                model.decoder.init_state(rows_len, memory, final)
                dec_out, _ = model.decoder(torch.from_numpy(prefix.numpy()).long())
                logits = model.generator(dec_out[:, -1]).float()
            return tf.constant(logits.numpy()), cache

        seqs, scores = beam_search.sequence_beam_search(
            symbols_to_logits, tf.fill([len(ids)], tgt_vocab.bos), {}, len(tgt_vocab),
            beam, options["alpha"], options["max_decode_length"], tgt_vocab.eos)
        hyps = []
        for sentence, sentence_scores in zip(seqs.numpy().tolist(), scores.numpy().tolist()):
            hyps.append([])
            for seq, score in zip(sentence, sentence_scores):
                seq = seq[1:]  # the start token
                seq = seq[:seq.index(tgt_vocab.eos)] if tgt_vocab.eos in seq else seq
                hyps[-1].append([" ".join(tgt_vocab.decode(seq)), round(score, 6)])
        out["cases"][name] = {"options": options, "hypotheses": hyps}
    with open(os.path.join(HERE, "tensorflow.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
