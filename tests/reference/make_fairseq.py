"""Makes tests/reference/fairseq.json: fairseq 0.12.2's SequenceGenerator, run as it ships (with
its BeamSearch, and with DiverseBeamSearch), on the first LINES lines of test_2016_flickr, for
test_search_fairseq.py.

fairseq's generator drives onmt_lite's model of the OpenNMT-py Transformer fixture (the same
weights) through fairseq's own model classes: a FairseqEncoder returns the encoder's memory, a
FairseqIncrementalDecoder returns the next token's logits (fairseq takes their log-softmax) and
reorders the decoder's state when fairseq reorders its hypotheses. Its target dictionary is the
fixture's vocabulary (pad, unk and </s> at their ids); decoding starts from <s>.

So the reference proves the search rule, not the model: the log-probabilities fairseq's search
ranks are those of onmt_lite's own model, with onmt_lite's decoder state reordered at fairseq's
request, so an error in onmt_lite's model or its state handling would be on both sides and go
unseen here. The model is checked against OpenNMT-py's own outputs (test_parity.py and the
other OpenNMT-py references).

One thing is not as it ships: fairseq's no_repeat_ngram_size on CPU (its Python fallback of the
CUDA kernel) reads the last n-1 entries of the whole token buffer, which are padding until the
end, so it blocks nothing; the case that uses it hands the fallback the tokens so far, which is
what the CUDA kernel reads (it indexes the buffer by step). With a size of 1 the fallback bans
nothing even so (its last n - 1 tokens, ``tokens[-0:]``, are the whole list), where the kernel
bans every token so far: the case bans them as the kernel does.

fairseq is not a dependency, and 0.12.2 needs small fixes to build on Python 3.11 (its config
dataclasses' defaults, numpy's removed aliases; none in its search code): setup_fairseq.sh,
beside this file, builds the side virtualenv. From the repository root:

    bash tests/reference/setup_fairseq.sh ~/fs-peers
    ~/fs-peers/bin/python tests/reference/make_fairseq.py
"""
import json
import os

import fairseq
import torch
from fairseq import search
from fairseq.models import FairseqEncoder, FairseqEncoderDecoderModel, FairseqIncrementalDecoder
from fairseq.sequence_generator import SequenceGenerator

from onmt_lite.checkpoint import load_model

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "..", "shared")
MODEL = os.path.join(SHARED, "fixtures", "onmt-py", "transformer.pt")
SOURCE = os.path.join(SHARED, "data", "multi30k", "test_2016_flickr.lc.tok.en")
LINES = 150
BATCH = 32
# name -> SequenceGenerator arguments, and diverse beam search's (groups, strength)
CASES = {
    "beam 5": dict(beam_size=5, max_len_b=100),
    "beam 4, lenpen 0.6, nbest 4": dict(beam_size=4, len_penalty=0.6, max_len_b=100),
    "beam 5, lenpen 0, min_len 8, max_len_b 12": dict(beam_size=5, len_penalty=0.0,
                                                      min_len=8, max_len_b=12),
    "beam 3, lenpen 2, no_repeat_ngram_size 2": dict(beam_size=3, len_penalty=2.0,
                                                     no_repeat_ngram_size=2, max_len_b=100),
    "beam 1": dict(beam_size=1, max_len_b=100),
    "diverse: beam 4, 2 groups, strength 0.5": dict(beam_size=4, max_len_b=100,
                                                    diverse=(2, 0.5)),
    "diverse: beam 6, 3 groups, strength 1, lenpen 0.6": dict(beam_size=6, len_penalty=0.6,
                                                              max_len_b=100, diverse=(3, 1.0)),
    "diverse: beam 4, 4 groups, strength 0.2, max_len_b 10": dict(beam_size=4, max_len_b=10,
                                                                  diverse=(4, 0.2)),
}
NBEST = {"beam 4, lenpen 0.6, nbest 4": 4, "diverse: beam 6, 3 groups, strength 1, lenpen 0.6": 3,
         "diverse: beam 4, 4 groups, strength 0.2, max_len_b 10": 2}


class TokensSoFar(torch.nn.Module):
    """fairseq's n-gram blocker given the tokens generated so far, as its CUDA kernel sees them."""

    def __init__(self, blocker):
        super().__init__()
        self.blocker = blocker

    def forward(self, tokens, lprobs, bsz: int, beam_size: int, step: int):
        if self.blocker.no_repeat_ngram_size == 1:
            # the fallback's last n - 1 tokens, tokens[-0:], are the whole list: it bans nothing;
            # the kernel (one thread per position so far, nothing to compare) bans every token
            return lprobs.scatter_(1, tokens[:, :step + 1], float("-inf"))
        return self.blocker(tokens[:, :step + 1], lprobs, bsz, beam_size, step)


class Dictionary:
    """What SequenceGenerator and its searches read of a fairseq Dictionary."""

    def __init__(self, vocab):
        self.vocab = vocab

    def pad(self):
        return self.vocab.pad

    def eos(self):
        return self.vocab.eos

    def unk(self):
        return self.vocab.unk

    def bos(self):
        return self.vocab.bos

    def __len__(self):
        return len(self.vocab)


class Encoder(FairseqEncoder):
    def __init__(self, model):
        super().__init__(None)
        self.model = model

    def forward(self, src_tokens, src_lengths):
        memory, final = self.model.encode(src_tokens, src_lengths)
        out = {"memory": memory, "lengths": src_lengths}
        for i, state in enumerate(final or ()):  # an RNN's final states, each (layers, B, H)
            out[f"final {i}"] = state
        return out

    def reorder_encoder_out(self, encoder_out, new_order):
        return {k: v.index_select(1 if k.startswith("final") else 0, new_order)
                for k, v in encoder_out.items()}


class Decoder(FairseqIncrementalDecoder):
    def __init__(self, model):
        super().__init__(None)
        self.model = model

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        dec = self.model.decoder
        if prev_output_tokens.size(1) == 1:  # a new batch: its state starts from the memory
            final = tuple(v for k, v in sorted(encoder_out.items()) if k.startswith("final"))
            dec.init_state(encoder_out["lengths"], encoder_out["memory"], final or None)
        out, attn = dec.step(prev_output_tokens[:, -1])
        logits = self.model.generator(out).float()
        return logits.unsqueeze(1), {"attn": [attn.float().unsqueeze(1)]}

    def reorder_incremental_state(self, incremental_state, new_order):
        self.model.decoder.map_state(lambda state, dim: state.index_select(dim, new_order))

    def max_positions(self):
        return 1024


def main() -> None:
    model, ckpt = load_model(MODEL)
    src_vocab, tgt_vocab = ckpt.src_vocab, ckpt.tgt_vocab
    wrapped = FairseqEncoderDecoderModel(Encoder(model), Decoder(model)).eval()
    with open(SOURCE, encoding="utf-8") as f:
        lines = [next(f).split() for _ in range(LINES)]
    out = {"made_by": "tests/reference/make_fairseq.py", "fairseq": fairseq.__version__,
           "torch": torch.__version__, "model": "../shared/fixtures/onmt-py/transformer.pt",
           "source": f"first {LINES} lines of test_2016_flickr.lc.tok.en, in batches of "
                     f"{BATCH}", "cases": {}}
    dictionary = Dictionary(tgt_vocab)
    for name, options in CASES.items():
        options = dict(options)
        diverse = options.pop("diverse", None)
        strategy = search.DiverseBeamSearch(dictionary, *diverse) if diverse else None
        generator = SequenceGenerator([wrapped], dictionary, search_strategy=strategy, **options)
        if generator.repeat_ngram_blocker is not None:
            generator.repeat_ngram_blocker = TokensSoFar(generator.repeat_ngram_blocker)
        hyps = []
        for first in range(0, LINES, BATCH):
            ids = [src_vocab.encode(line) for line in lines[first:first + BATCH]]
            src_len = torch.tensor([len(x) for x in ids])
            src = torch.full((len(ids), int(src_len.max())), src_vocab.pad, dtype=torch.long)
            for row, x in enumerate(ids):
                src[row, :len(x)] = torch.tensor(x)
            sample = {"net_input": {"src_tokens": src, "src_lengths": src_len}}
            with torch.no_grad():
                results = generator.generate([wrapped], sample, bos_token=tgt_vocab.bos)
            for nbest in results:
                hyps.append([[" ".join(tgt_vocab.decode(h["tokens"].tolist()[:-1])),
                              round(float(h["score"]), 6)]
                             for h in nbest[:NBEST.get(name, 1)]])
        out["cases"][name] = {"options": {**options, "diverse": diverse,
                                          "nbest": NBEST.get(name, 1)}, "hypotheses": hyps}
    with open(os.path.join(HERE, "fairseq.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
