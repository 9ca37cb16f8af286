"""Makes tests/reference/onmt_py_batchmates.json: OpenNMT-py 3.5.1's own n-best lists for one
sentence among different batch-mates, on the raw-text fixture (../shared/fixtures/onmt-py-spm,
its translate.yaml: sentencepiece, batch 32), for tests/test_parity_batchmates.py.

The sentence (LINE, outside the Multi30k test set) meets, at its sixth step of beam 5, two
candidates at the beam's edge whose scores differ by float32 rounding only (below 1e-6): which
survives decides whether its n-best search stops at step 11 or runs on. OpenNMT-py's
BeamSearch finishes each sentence from its own rows only (update_finished: ``is_finished_list``
is made anew by every ``advance`` for the live batch and read at the same step; the -65504 mask
goes on the rows that ended at that step, before finished sentences leave the batch), so its
batch-mates change its result only through the float sums of its batch, chiefly the padded
source width (the longest source of the batch, in pieces). The file holds:

- ``widths``: LINE in a batch of two beside a Multi30k line of each source width in WIDTHS
  (pieces), beam 5, 3 best;
- ``batches``: LINE among 31 Multi30k lines (test_2016_flickr and val, seeded draws) in one
  batch of 32 whose longest source is so many pieces, every line's n-best, for each setting
  of SETTINGS and its widths.

OpenNMT-py runs in this process (its InferenceEnginePY, as onmt_translate runs it, one thread as
the fixture's references were made) so that the scores keep every digit. Which widths round
the tie OpenNMT-py's way depends on the CPU's kernels, so the file names the CPU. OpenNMT-py is
not a dependency: run this with the peers virtualenv (../shared/peers/setup-peers.sh), from the
repository root:

    ~/onmt-peers/bin/python tests/reference/make_onmt_py_batchmates.py
"""
import json
import logging
import os
import platform
import random
import warnings

os.environ.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # OpenNMT-py 3.5.1's torch.load

import onmt  # noqa: E402
import sentencepiece  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.path.join(HERE, "..", "..", "..", "shared")
FIXTURE = os.path.join(SHARED, "fixtures", "onmt-py-spm")
DATA = os.path.join(SHARED, "data", "multi30k")
LINE = "Someone is windsurfing in the ocean."
WIDTHS = list(range(10, 35))
BATCH = 32
# setting -> (onmt_translate options, the batches' widths)
SETTINGS = {"beam 5, 3 best": ({"beam_size": 5, "n_best": 3}, (22, 25, 26, 29)),
            "beam 5, 5 best": ({"beam_size": 5, "n_best": 5}, (22, 25))}


def engine(options: dict):
    """OpenNMT-py's inference engine with the fixture's translate.yaml and ``options``."""
    from onmt.bin.translate import _get_parser
    from onmt.inference_engine import InferenceEnginePY
    from onmt.utils.parse import ArgumentParser
    argv = ["-config", "translate.yaml", "-src", "unused"]
    for key, value in options.items():
        argv += [f"-{key}", str(value)]
    opt = _get_parser().parse_args(argv)
    ArgumentParser.validate_translate_opts(opt)
    ArgumentParser._get_all_transform_translate(opt)
    ArgumentParser._validate_transforms_opts(opt)
    ArgumentParser.validate_translate_opts_dynamic(opt)
    return InferenceEnginePY(opt)


def nbest(eng, src: list) -> list:
    """[[(text, score), ...], ...] per line of ``src``, decoded as one batch."""
    scores, preds = eng.infer_list(src)
    return [[[p, float(s)] for p, s in zip(texts, line_scores)]
            for texts, line_scores in zip(preds, scores)]


def batch_of(width: int, pool: list, pieces) -> list:
    """LINE and 31 lines of ``pool`` no wider than ``width`` pieces, the first exactly that."""
    rng = random.Random(f"batchmates {width}")
    widest = next(line for line in pool if pieces(line) == width)
    narrower = [line for line in pool if pieces(line) < width]
    src = [widest] + rng.sample(narrower, BATCH - 2)
    src.insert(rng.randrange(BATCH), LINE)
    return src


def main() -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    os.chdir(FIXTURE)  # translate.yaml names its files relative to the fixture
    spm = sentencepiece.SentencePieceProcessor(model_file="spm.model")

    def pieces(line: str) -> int:
        return len(spm.encode(line))

    pool = []
    for name in ("test_2016_flickr.en", "val.en"):
        with open(os.path.join(DATA, name), encoding="utf-8") as f:
            pool += f.read().split("\n")[:-1]
    out = {"made_by": "tests/reference/make_onmt_py_batchmates.py",
           "opennmt-py": onmt.__version__, "torch": torch.__version__,
           "sentencepiece": sentencepiece.__version__,
           "cpu": f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()}",
           "threads": 1, "line": LINE, "widths": [], "batches": []}
    options = SETTINGS["beam 5, 3 best"][0]
    eng = engine(options)
    for width in WIDTHS:
        mate = next(line for line in pool if pieces(line) == width)
        out["widths"].append({"width": width, "src": [mate, LINE], "options": options,
                              "nbest": nbest(eng, [mate, LINE])})
    eng.terminate()
    for setting, (options, widths) in SETTINGS.items():
        eng = engine(options)
        for width in widths:
            src = batch_of(width, pool, pieces)
            out["batches"].append({"setting": setting, "options": options, "width": width,
                                   "src": src, "nbest": nbest(eng, src)})
        eng.terminate()
    with open(os.path.join(HERE, "onmt_py_batchmates.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
