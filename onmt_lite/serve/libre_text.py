"""Texts translated as LibreTranslate translates them: each cut into paragraphs (lines) and
sentences (translate.sentences), the sentences of all texts decoded as independent jobs of the
server's shared batches, and each text rebuilt from them: the k-th hypothesis of a text made of
the k-th hypothesis of each of its sentences, as Argos Translate builds it.

``/translate`` in text format then applies LibreTranslate's own touches (``improve_formatting``,
entities unescaped, alternatives without repeats); ``translate`` (html text nodes, .txt files)
is Argos Translate's plain ``translate``, without them.
"""
import asyncio
import html
from typing import Awaitable, Callable, Dict, List

from onmt_lite.translate.sentences import (
    SentenceSplitter,
    join_paragraphs,
    join_sentences,
    paragraphs_of,
)

# A function of the server: sentences in, each sentence's n-best translations out.
Decode = Callable[[List[str], int], Awaitable[List[List[str]]]]

PUNCTUATION = ("!", "?", ".", ",", ";", "。")
_splitters: Dict[str, SentenceSplitter] = {}


async def splitter_for(language: str) -> SentenceSplitter:
    """The sentence splitter of a source language, made once (spaCy's import and pipeline take
    a second or two: in a thread, so that the server goes on answering meanwhile)."""
    if language not in _splitters:
        _splitters[language] = await asyncio.to_thread(SentenceSplitter, language)
    return _splitters[language]


class TextPlan:
    """The sentences of ``texts`` (per text, per paragraph), and the texts rebuilt from the
    sentences' translations."""

    def __init__(self, texts: List[str], splitter: SentenceSplitter):
        self.texts = texts
        self.cuts = [[splitter.split(p) for p in paragraphs_of(text)] for text in texts]

    def sentences(self) -> List[str]:
        return [s for paragraphs in self.cuts for sentences in paragraphs for s in sentences]

    def ranked(self, translations: List[List[str]], n_best: int) -> List[List[str]]:
        """Each text's ``n_best`` hypotheses, best first."""
        ranks = [self.rebuild(translations, rank) for rank in range(n_best)]
        return [[ranks[rank][i] for rank in range(n_best)] for i in range(len(self.texts))]

    def rebuild(self, translations: List[List[str]], rank: int) -> List[str]:
        """Each text's ``rank``-th hypothesis from its sentences' n-best ``translations`` (in
        the order of sentences())."""
        out, at = [], 0
        for paragraphs in self.cuts:
            joined = []
            for sentences in paragraphs:
                joined.append(join_sentences([t[rank] for t in
                                              translations[at:at + len(sentences)]]))
                at += len(sentences)
            out.append(join_paragraphs(joined))
        return out


async def hypotheses(texts: List[str], splitter: SentenceSplitter, decode: Decode,
                     n_best: int) -> List[List[str]]:
    """Each text's n-best translations, best first, as Argos Translate's ``hypotheses``."""
    plan = await asyncio.to_thread(TextPlan, texts, splitter)
    sentences = plan.sentences()
    translations = await decode(sentences, n_best) if sentences else []
    return plan.ranked(translations, n_best)


async def translate(texts: List[str], splitter: SentenceSplitter, decode: Decode) -> List[str]:
    """Argos Translate's ``translate``: each text's best translation, nothing more."""
    return [best[0] for best in await hypotheses(texts, splitter, decode, 1)]


def improve_formatting(source: str, translation: str) -> str:
    """LibreTranslate's improve_translation_formatting (its /translate applies it to a whole
    text): the source's final punctuation mark replaces or ends the translation's, a one-word
    source whose translation repeats one word is cut to that word, and the source's case
    (all lower, all upper, its first letter's) is carried over."""
    source = source.strip()
    if not source:
        return ""
    if not translation:
        return source
    if source[-1] in PUNCTUATION:
        if translation[-1] != source[-1]:
            if translation[-1] in PUNCTUATION:
                translation = translation[:-1]
            translation += source[-1]
    elif translation[-1] in PUNCTUATION:
        translation = translation[:-1]
    if len(source) < 20 and " " not in source and " " in translation:
        words = translation.split()
        counts = {w: words.count(w) for w in words}
        if any(c / len(counts) >= 2 for c in counts.values()):
            translation = words[0]
    if source.islower():
        return translation.lower()
    if source.isupper():
        return translation.upper()
    if not translation:
        return source
    if source[0].islower():
        return translation[0].lower() + translation[1:]
    if source[0].isupper():
        return translation[0].upper() + translation[1:]
    return translation


def answer(source: str, ranked: List[str]) -> tuple:
    """LibreTranslate's translatedText and alternatives of ``source`` from its n-best
    hypotheses: each formatted and unescaped; alternatives without the translation itself,
    empty ones or repeats."""
    shown = [html.unescape(improve_formatting(source, text)) for text in ranked]
    seen, alternatives = {shown[0], ""}, []
    for text in shown[1:]:
        if text not in seen:
            seen.add(text)
            alternatives.append(text)
    return shown[0], alternatives
