"""Hunts for differences between ``-search fairseq`` and fairseq 0.12.2's own SequenceGenerator
(its BeamSearch and DiverseBeamSearch, run as they ship; make_fairseq.py's wrapper hands them
onmt_lite's model): the OpenNMT-py Transformer and RNN fixtures, each plain and made to
misbehave (hunt_variant.py: never ends, ends at once, weights redrawn, tied generator rows), on
the lines hunt_lines.py draws, under a sweep of beam sizes (1 to 12), n-best lists up to the beam,
length penalties (negative to 2), minimum and maximum lengths near the outputs' (``max_len_b``
with ``max_len_a`` 0), ``no_repeat_ngram_size`` 1 to 3, diverse beam search (2 to 4 groups,
strength 0.2 to 2) and batch sizes. Some settings leave fairseq's own defaults to it (``min_len``
1, ``max_len_b`` 200, ``len_penalty`` 1): onmt_lite's ``-search fairseq`` must take the same.

onmt_lite decodes fairseq's batches (its rule does not look across a batch, but the float sums
of a sentence's log-probabilities depend on its batch's padded length, and a near tie at the
beam's boundary may fall either way in another batch). An empty line is not decoded: onmt_lite
answers it with an empty hypothesis, and fairseq's command line would give the model ``</s>``
alone, a source an OpenNMT-py model never saw.

Run in the fairseq side environment (setup_fairseq.sh), from the repository root:

    ~/fs-peers/bin/python tests/reference/hunt_fairseq.py          # writes fairseq_hunt.json
    ~/fs-peers/bin/python tests/reference/hunt_fairseq.py --full   # ~100 lines per case

Both print a table (hunt_search.py names the ties); tests/test_search_hunts.py replays the stored
reference.
"""
import fairseq
import torch
from fairseq import search
from fairseq.models import FairseqEncoderDecoderModel
from fairseq.sequence_generator import SequenceGenerator
from hunt_search import padded, run_hunt
from make_fairseq import Decoder, Dictionary, Encoder, TokensSoFar

from onmt_lite.checkpoint import load_model

# (name, SequenceGenerator arguments, batch size): "diverse" is DiverseBeamSearch's (groups,
# strength); a setting without min_len, max_len_b or len_penalty leaves fairseq's default
SETTINGS = [
    ("fairseq's defaults, beam 5", dict(beam_size=5), 32),
    ("greedy", dict(beam_size=1, max_len_b=100), 32),
    ("beam 2, batch 1", dict(beam_size=2, max_len_b=100), 1),
    ("beam 5, 5 best", dict(beam_size=5, nbest=5, max_len_b=100), 32),
    ("beam 12, 12 best, batch 7", dict(beam_size=12, nbest=12, max_len_b=60), 7),
    ("beam 8, 3 best, lenpen 0", dict(beam_size=8, nbest=3, len_penalty=0.0, max_len_b=100), 32),
    ("beam 4, lenpen 0.6, batch 64", dict(beam_size=4, len_penalty=0.6, max_len_b=100), 64),
    ("beam 6, 2 best, lenpen 2", dict(beam_size=6, nbest=2, len_penalty=2.0, max_len_b=100), 32),
    ("beam 5, 3 best, lenpen -0.5", dict(beam_size=5, nbest=3, len_penalty=-0.5,
                                         max_len_b=100), 32),
    ("beam 5, 2 best, min 10", dict(beam_size=5, nbest=2, min_len=10, max_len_b=100), 32),
    ("beam 3, min 30", dict(beam_size=3, min_len=30, max_len_b=100), 32),
    ("beam 5, 5 best, max 8", dict(beam_size=5, nbest=5, max_len_b=8), 32),
    ("beam 4, 4 best, min 6, max 12, lenpen 0.6", dict(beam_size=4, nbest=4, min_len=6,
                                                       max_len_b=12, len_penalty=0.6), 32),
    ("beam 5, max 1", dict(beam_size=5, nbest=2, max_len_b=1), 32),
    ("beam 3, min 0, max 3, lenpen 0", dict(beam_size=3, min_len=0, max_len_b=3,
                                            len_penalty=0.0), 7),
    ("beam 5, no repeat 1", dict(beam_size=5, no_repeat_ngram_size=1, max_len_b=60), 32),
    ("beam 5, 3 best, no repeat 2, batch 1", dict(beam_size=5, nbest=3, no_repeat_ngram_size=2,
                                                  max_len_b=60), 1),
    ("beam 4, no repeat 3, lenpen 0.6", dict(beam_size=4, no_repeat_ngram_size=3,
                                             len_penalty=0.6, max_len_b=60), 32),
    ("diverse: beam 4, 2 groups, 0.5", dict(beam_size=4, max_len_b=60, diverse=(2, 0.5)), 32),
    ("diverse: beam 6, 3 groups, 1, 3 best, lenpen 0.6", dict(
        beam_size=6, nbest=3, len_penalty=0.6, max_len_b=60, diverse=(3, 1.0)), 32),
    ("diverse: beam 4, 4 groups, 0.2, 2 best, max 10", dict(beam_size=4, nbest=2, max_len_b=10,
                                                            diverse=(4, 0.2)), 7),
    ("diverse: beam 8, 2 groups, 2, 8 best, min 5", dict(beam_size=8, nbest=8, min_len=5,
                                                         max_len_b=40, diverse=(2, 2.0)), 32),
    ("diverse: beam 2, 2 groups, 0.5, batch 1", dict(beam_size=2, max_len_b=60,
                                                     diverse=(2, 0.5)), 1),
]
# SequenceGenerator argument -> onmt_lite option
OPTIONS = dict(beam_size="beam_size", nbest="n_best", len_penalty="alpha", min_len="min_length",
               max_len_b="max_length", no_repeat_ngram_size="block_ngram_repeat")


def onmt_lite_options(args: dict) -> dict:
    options = {"search": "fairseq", **{OPTIONS[k]: v for k, v in args.items() if k in OPTIONS}}
    if args.get("diverse"):
        options["diverse_groups"], options["diverse_strength"] = args["diverse"]
    return options


def fairseq_nbest(model_path: str, src_lines, args: dict, batch: int):
    """fairseq's [[text, score], ...] per non-empty line, in batches of ``batch``."""
    model, ckpt = load_model(model_path)
    src_vocab, tgt_vocab = ckpt.src_vocab, ckpt.tgt_vocab
    wrapped = FairseqEncoderDecoderModel(Encoder(model), Decoder(model)).eval()
    dictionary = Dictionary(tgt_vocab)
    options = {k: v for k, v in args.items() if k not in ("diverse", "nbest")}
    strategy = search.DiverseBeamSearch(dictionary, *args["diverse"]) if args.get("diverse") \
        else None
    generator = SequenceGenerator([wrapped], dictionary, search_strategy=strategy, **options)
    if generator.repeat_ngram_blocker is not None:
        generator.repeat_ngram_blocker = TokensSoFar(generator.repeat_ngram_blocker)
    lines = [line.split() for line in src_lines if line.split()]
    out = []
    for first in range(0, len(lines), batch):
        src, src_len = padded(src_vocab, lines[first:first + batch])
        sample = {"net_input": {"src_tokens": src, "src_lengths": src_len}}
        with torch.no_grad():
            results = generator.generate([wrapped], sample, bos_token=tgt_vocab.bos)
        for nbest in results:
            out.append([[" ".join(tgt_vocab.decode(h["tokens"].tolist()[:-1])),
                         round(float(h["score"]), 6)] for h in nbest[:args.get("nbest", 1)]])
    return out


def main() -> None:
    run_hunt(__doc__, "fairseq", "fairseq", {"fairseq": fairseq.__version__},
             [(name, batch, onmt_lite_options(args), args) for name, args, batch in SETTINGS],
             fairseq_nbest)


if __name__ == "__main__":
    main()
