"""The lines a hunt decodes, drawn the same way by every toolkit's hunt (make_onmt_py_hunt.py,
hunt_fairseq.py, hunt_tensorflow.py) and by the tests that replay their references: Multi30k
training lines (train.lc.tok.en) and test lines (test_2016_flickr, val), an empty line,
one-token lines and lines longer than any training line (several joined). Each (setting, model)
draws its own lines with a generator seeded with both names."""
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "..", "shared", "data", "multi30k")
CORPORA = ("train", "test_2016_flickr", "val")
# lines per (setting, model): from train, test_2016_flickr, val; one-token lines; the chance
# of a long line (it sets the length limit of its whole batch: the costliest line by far)
SIZES = {"default": (2, 1, 1, 1, 0.15), "full": (80, 15, 8, 3, 1.0)}
ONE_TOKEN = [("dog", "hund"), (".", "."), ("a", "ein"), ("xylophonist", "xylophonist"),
             ("two", "zwei")]
PARTS_OF_A_LONG_LINE = (3, 5)  # joined training lines (the longest has 40 words)


def read(name: str, side: str):
    with open(os.path.join(DATA, f"{name}.lc.tok.{side}"), encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def read_corpora() -> dict:
    return {name: (read(name, "en"), read(name, "de")) for name in CORPORA}


def lines_for(name: str, model: str, size: str, corpora: dict):
    """The (source, target) pairs of one (setting, model), an empty line among them."""
    rng = random.Random(f"{name} | {model}")
    counts = SIZES[size]
    pairs = [("", "")]
    for corpus, count in zip(CORPORA, counts):
        src, tgt = corpora[corpus]
        pairs += [(src[i], tgt[i]) for i in rng.sample(range(len(src)), count)]
    pairs += rng.sample(ONE_TOKEN, counts[3])
    src, tgt = corpora["train"]
    if rng.random() < counts[4]:
        start, parts = rng.randrange(len(src) - 10), rng.randint(*PARTS_OF_A_LONG_LINE)
        pairs.append((" ".join(src[start:start + parts]), " ".join(tgt[start:start + parts])))
    rng.shuffle(pairs)
    return pairs
