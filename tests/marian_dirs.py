"""Tiny randomly initialised Marian models with their tokenizers, written as
``MarianMTModel.save_pretrained`` and ``MarianTokenizer.save_pretrained`` write them."""
import json
import os
import random

import sentencepiece
import torch

WORDS = ("a man woman child dog cat is are riding walking sitting on in the street park bike "
         "red blue green big small two three with and of near water ball playing running").split()
SOURCES = ["A man is riding a bike.", "Two dogs play in the park near water",
           "Qx zebra!", "", "a </s> b", "The small child is walking with a big red ball.",
           ">>de<< a woman", "  spaces   around  "]
OPUS_GENERATION = {"bad_words_ids": "pad", "bos_token_id": 0, "decoder_start_token_id": "pad",
                   "eos_token_id": 0, "forced_eos_token_id": 0, "max_length": 24,
                   "num_beams": 4, "pad_token_id": "pad", "renormalize_logits": True}
TINY_WORDS = "a b ab ba aab".split()  # a tiny vocabulary's text
TWINS = ((2, 3), (4, 5), (6, 7))  # its token ids of equal embeddings and biases, in pairs


def sentences(n: int, seed: int):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10))).capitalize()
            + rng.choice([".", "!", "?", ""]) for _ in range(n)]


def _tiny_sentences(n: int, seed: int):
    rng = random.Random(seed)
    return [" ".join(rng.choice(TINY_WORDS) for _ in range(rng.randint(2, 8))) for _ in range(n)]


def _spm(folder, name: str, seed: int, tiny: bool = False) -> sentencepiece.SentencePieceProcessor:
    """A unigram model of 80 pieces, or ``tiny``: of 10 (7 pieces over TINY_WORDS)."""
    text = os.path.join(folder, f"{name}.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join((_tiny_sentences if tiny else sentences)(300, seed)) + "\n")
    sentencepiece.SentencePieceTrainer.train(input=text, model_prefix=os.path.join(folder, name),
                                             vocab_size=10 if tiny else 80,
                                             model_type="unigram", minloglevel=2)
    os.remove(text)
    os.remove(os.path.join(folder, f"{name}.vocab"))
    os.replace(os.path.join(folder, f"{name}.model"), os.path.join(folder, f"{name}.spm"))
    return sentencepiece.SentencePieceProcessor(model_file=os.path.join(folder, f"{name}.spm"))


def _vocab(*models) -> dict:
    """OPUS-MT's layout: </s> 0, <unk> 1, the pieces, <pad> last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for model in models:
        for i in range(model.get_piece_size()):
            piece = model.id_to_piece(i)
            if piece not in vocab and piece not in ("<s>", "<unk>", "</s>"):
                vocab[piece] = len(vocab)
    vocab[">>de<<"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    return vocab


def write_marian(folder, seed: int = 0, separate: bool = False, bin_weights: bool = False,
                 generation=OPUS_GENERATION, pad_bias: float = 0.0, eos_bias: float = 0.0,
                 tiny_target: bool = False, **config) -> str:
    """Writes a Marian directory; ``config`` overrides MarianConfig values; ``pad_bias`` and
    ``eos_bias`` are added to the pad and </s> tokens' logits.

    ``tiny_target``: a vocabulary of 11 (</s>, <unk>, 7 pieces over TINY_WORDS, >>de<<, <pad>;
    source and target pieces alike) whose pieces come in pairs (2, 3), (4, 5), (6, 7) with
    equal embeddings (the output projection's rows) and biases: the two tokens of a pair always
    tie exactly, and so do two hypotheses that differ only by them."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer
    folder = str(folder)
    os.makedirs(folder, exist_ok=True)
    source, target = _spm(folder, "source", 1, tiny_target), _spm(folder, "target", 2, tiny_target)
    files = {"vocab": os.path.join(folder, "vocab.json")}
    if separate:
        src_vocab, tgt_vocab = _vocab(source), _vocab(target)
        files["target_vocab_file"] = os.path.join(folder, "target_vocab.json")
        with open(files["target_vocab_file"], "w", encoding="utf-8") as f:
            json.dump(tgt_vocab, f)
    else:
        src_vocab = tgt_vocab = _vocab(source, target)
    with open(files["vocab"], "w", encoding="utf-8") as f:
        json.dump(src_vocab, f)
    tokenizer = MarianTokenizer(os.path.join(folder, "source.spm"),
                                os.path.join(folder, "target.spm"), separate_vocabs=separate,
                                **files)
    pad = tgt_vocab["<pad>"]
    settings = dict(vocab_size=len(src_vocab), decoder_vocab_size=len(tgt_vocab), d_model=32,
                    encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                    max_position_embeddings=128, pad_token_id=pad, decoder_start_token_id=pad,
                    eos_token_id=0, forced_eos_token_id=0, scale_embedding=True,
                    activation_function="swish", init_std=0.15,
                    share_encoder_decoder_embeddings=not separate)
    settings.update(config)
    torch.manual_seed(seed)
    model = MarianMTModel(MarianConfig(**settings)).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0, 0.5)
        model.final_logits_bias[0, pad] += pad_bias
        model.final_logits_bias[0, 0] += eos_bias
        if tiny_target:
            outputs = [model.get_output_embeddings().weight, model.model.decoder.embed_tokens.weight]
            for first, second in TWINS:
                model.final_logits_bias[0, second] = model.final_logits_bias[0, first]
                for weight in outputs:
                    weight[second] = weight[first]
    if generation is not None:
        values = {k: ([[pad]] if k == "bad_words_ids" else pad) if v == "pad" else v
                  for k, v in generation.items()}
        model.generation_config = GenerationConfig(**values)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if generation is None and os.path.exists(os.path.join(folder, "generation_config.json")):
        os.remove(os.path.join(folder, "generation_config.json"))
    if bin_weights:  # the older layout: a plain torch state dict
        os.remove(os.path.join(folder, "model.safetensors"))
        torch.save(model.state_dict(), os.path.join(folder, "pytorch_model.bin"))
    return folder


def twin_pieces(folder) -> dict:
    """A tiny_target model's pieces of a pair, each -> the first of its pair ({} for a model
    of the full vocabulary)."""
    with open(os.path.join(str(folder), "vocab.json"), encoding="utf-8") as f:
        pieces = {i: piece for piece, i in json.load(f).items()}
    if len(pieces) > 20:
        return {}
    return {pieces[second]: pieces[first] for first, second in TWINS}


def twin_choice(ours, theirs, twins) -> bool:
    """The two token lists part at twins that neither's common prefix holds: an exact tie,
    whatever penalties that count earlier tokens make of what follows."""
    if not twins:
        return False
    i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if i is None or twins.get(ours[i], ours[i]) != twins.get(theirs[i], theirs[i]):
        return False
    return not {ours[i], theirs[i]} & set(ours[:i])


def generated_ids(sequence, eos: int, pad: int) -> list:
    """A generate() output row without its start token: up to its </s>, or, cut at the
    length limit, without the padding that fills it."""
    generated = sequence[1:]
    if eos in generated:
        return generated[:generated.index(eos) + 1]
    return without_trailing(generated, pad)


def without_trailing(items, pad) -> list:
    """``items`` without the ``pad`` items that end it (ids or pieces)."""
    items = list(items)
    while items and items[-1] == pad:
        items.pop()
    return items


def run_generate(folder, sources, **kwargs):
    """transformers' ``generate`` on a Marian directory: (tokenizer, model, its output with
    scores)."""
    from transformers import MarianMTModel, MarianTokenizer
    tokenizer = MarianTokenizer.from_pretrained(folder)
    model = MarianMTModel.from_pretrained(folder).eval()
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, **kwargs)
    return tokenizer, model, out


def generate(folder, sources, **kwargs):
    """transformers' own translations: (token lists, summed log-probs, decoded texts)."""
    tokenizer, model, out = run_generate(folder, sources, **kwargs)
    steps = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    eos, tokens, scores, texts = model.generation_config.eos_token_id, [], [], []
    for seq, step_scores in zip(out.sequences.tolist(), steps):
        generated = seq[1:]
        length = generated.index(eos) + 1 if eos in generated else len(generated)
        tokens.append(tokenizer.convert_ids_to_tokens(generated[:length]))
        scores.append(float(step_scores[:length].sum()))
        texts.append(tokenizer.decode(seq, skip_special_tokens=True))
    return tokens, scores, texts
