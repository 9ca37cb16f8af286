"""HTML translated as LibreTranslate translates it (``format: "html"``, .html files): the
fragment parsed by Beautiful Soup's ``html.parser``, every text node outside the untranslatable
elements translated on its own (spaces at its ends kept), the tree written back and its
entities unescaped.

LibreTranslate does this through argos-translate-files' ``translate_html`` and Argos
Translate's ``translate_tags``; their tag injection never applies (their ``depth`` of a tree is
always 0), so each text node is one unit. Comments, doctypes and other special strings are text
nodes there too: inside a translatable element they are translated, and every string is
written back as plain text (a comment loses its ``<!-- -->``), as LibreTranslate writes it.
Here the text nodes are collected first, so that all their sentences go to the model in one
call, then put back.
"""
import html
from typing import Awaitable, Callable, List

from bs4 import BeautifulSoup
from bs4.element import NavigableString, Tag

# argos-translate-files' NON_TRANSLATEABLE_TAGS
UNTRANSLATED = frozenset(["address", "applet", "audio", "canvas", "code", "embed", "script",
                          "style", "time", "video"])


def parse(fragment: str) -> BeautifulSoup:
    return BeautifulSoup(fragment, "html.parser")


def translatable(tag: Tag) -> bool:
    """An element whose text is translated: not one of UNTRANSLATED, not translate="no"."""
    return tag.name not in UNTRANSLATED and tag.get("translate") != "no"


def text_nodes(soup: BeautifulSoup) -> List[NavigableString]:
    """Every string of the tree, in document order; the ones to translate are those whose
    ancestors are all translatable (see to_translate)."""
    return [node for node in soup.descendants if isinstance(node, NavigableString)]


def to_translate(node: NavigableString) -> bool:
    return all(translatable(parent) for parent in node.parents)


def keep_outer_spaces(source: str, translation: str) -> str:
    """Argos Translate's translate_preserve_formatting: a space at either end of the source is
    kept at that end of the translation."""
    if source[:1] == " " and translation[:1] != " ":
        translation = " " + translation
    if source[-1:] == " " and translation[-1:] != " ":
        translation = translation + " "
    return translation


class HtmlPlan:
    """A fragment's text nodes to translate, and the fragment written back from their
    translations."""

    def __init__(self, fragment: str):
        self.soup = parse(fragment)
        self.nodes = text_nodes(self.soup)
        self.chosen = [i for i, node in enumerate(self.nodes) if to_translate(node)]

    def texts(self) -> List[str]:
        """The text nodes to translate, in document order."""
        return [str(self.nodes[i]) for i in self.chosen]

    def text(self) -> str:
        """Every string of the tree joined (Argos Translate's ``itag.text()``)."""
        return "".join(str(node) for node in self.nodes)

    def render(self, translations: List[str], unescape: bool = True) -> str:
        """The tree with each chosen node replaced by its translation (the spaces at its ends
        kept), every node written back as plain text; unescaped as LibreTranslate's /translate
        answer is, unless told (its .html files are not)."""
        texts = [str(node) for node in self.nodes]
        for i, translation in zip(self.chosen, translations):
            texts[i] = keep_outer_spaces(texts[i], translation)
        for node, text in zip(self.nodes, texts):
            node.replace_with(NavigableString(text))
        return html.unescape(str(self.soup)) if unescape else str(self.soup)


async def translate_html(fragment: str,
                         translate: Callable[[List[str]], Awaitable[List[str]]]) -> str:
    """``fragment`` with its text translated by ``translate`` (texts in, each translated as
    Argos Translate's ``translate`` does: paragraphs, sentences, no formatting fixes)."""
    plan = HtmlPlan(fragment)
    texts = plan.texts()
    return plan.render(await translate(texts) if texts else [])
