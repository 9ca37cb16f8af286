"""Special tokens, numeric sentinels and the int8 engines' names, defined once."""

UNK = "<unk>"
PAD = "<blank>"
BOS = "<s>"
EOS = "</s>"
SPECIALS = (UNK, PAD, BOS, EOS)

# Score given to finished hypotheses and to forbidden </s> (OpenNMT-py's fp16-safe "minus infinity").
FINISHED_SCORE = -65504.0
# Score given to tokens that would repeat a blocked n-gram.
BLOCKED_SCORE = -10e20
# Attention logits at padded source positions.
MASKED_LOGIT = -1e18

# -int8_engine's choices: the quantised engines of torch (auto: its default on this CPU)
INT8_ENGINES = ("auto", "fbgemm", "onednn")
