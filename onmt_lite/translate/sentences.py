"""Sentences of a paragraph, as LibreTranslate cuts them, and their translations joined back.

LibreTranslate (through Argos Translate, with ``ARGOS_CHUNK_TYPE=SPACY``) cuts a text into
paragraphs at each newline, each paragraph into sentences with spaCy's rule-based
``sentencizer`` on a blank pipeline of the source language (the tokenizer's rules and
exceptions of that language, "Dr." or "3.5" kept whole; no statistical model, nothing
downloaded), translates the sentences, and decodes each paragraph's translated pieces as one
sequence: sentences joined by the space their first piece carries. spaCy is the one splitter
that gives LibreTranslate's cuts exactly; it is imported only when sentences are split (the
``sentences`` and ``serve`` extras install it).
"""
import functools
import sys
import threading
from typing import Callable, List

MULTILINGUAL = "xx"  # spaCy's blank pipeline for a language it has no rules of


class SplitterUnavailable(RuntimeError):
    """Sentences cannot be split here (spaCy is missing); the message says how to install it."""


def _import_spacy():
    """spaCy, without torch where torch is not loaded yet: spaCy's thinc would import it only to
    offer it as a backend, which the sentencizer never uses (the server's own process would
    hold ~185 MiB more for it)."""
    if "torch" in sys.modules:
        import spacy
        return spacy
    sys.modules["torch"] = None  # import torch fails: thinc goes without it
    try:
        import spacy
    finally:
        del sys.modules["torch"]
    return spacy


@functools.lru_cache(maxsize=None)
def _pipeline(language: str):
    try:
        spacy = _import_spacy()
        from spacy.util import get_lang_class
    except ImportError:
        raise SplitterUnavailable(
            "splitting sentences needs spaCy: pip install -e \".[sentences]\"") from None
    try:
        get_lang_class(language)
    except ImportError:  # spaCy has no rules of this language: its multilingual ones
        language = MULTILINGUAL
    nlp = spacy.blank(language)
    nlp.add_pipe("sentencizer")
    return nlp


class SentenceSplitter:
    """The sentences of a paragraph in ``language`` (a code such as "en"), cut as LibreTranslate
    cuts them: spaCy's sentencizer on a blank pipeline of the language (of spaCy's multilingual
    rules for a language spaCy does not know). Thread-safe: one spaCy pipeline serves one
    thread at a time."""

    def __init__(self, language: str):
        self.language = (language or MULTILINGUAL).lower()
        self._nlp = _pipeline(self.language)
        self._lock = threading.Lock()

    def split(self, paragraph: str) -> List[str]:
        """The sentences of ``paragraph`` (a text without newlines), each with the spaces
        spaCy keeps in it; none for an empty paragraph."""
        with self._lock:
            return [sentence.text for sentence in self._nlp(paragraph).sents]


def paragraphs_of(text: str) -> List[str]:
    """A text's paragraphs: its lines, empty ones kept (LibreTranslate cuts at each newline)."""
    return text.split("\n")


def join_sentences(translations: List[str]) -> str:
    """A paragraph's translation from its sentences' translations: LibreTranslate decodes the
    pieces of all of them as one sequence, so each sentence's leading space piece becomes the
    space between it and the one before, and an empty translation adds nothing."""
    return " ".join(t for t in translations if t)


def join_paragraphs(paragraphs: List[str]) -> str:
    """A text's translation from its paragraphs' translations, joined by newlines; as in
    LibreTranslate, the newlines before the first non-empty paragraph are dropped."""
    return "\n".join(paragraphs).lstrip("\n")


def translate_paragraphs(lines: List[str], splitter: SentenceSplitter,
                         translate: Callable[[List[str]], List[str]]) -> List[str]:
    """Each line translated as a paragraph: its sentences translated together in one call of
    ``translate`` (sentences in, their translations out), then joined. One output per line."""
    cuts = [splitter.split(line) for line in lines]
    flat = [sentence for sentences in cuts for sentence in sentences]
    translated = translate(flat) if flat else []
    out, at = [], 0
    for sentences in cuts:
        out.append(join_sentences(translated[at:at + len(sentences)]))
        at += len(sentences)
    return out
