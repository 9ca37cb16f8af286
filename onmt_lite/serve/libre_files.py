"""Files translated as LibreTranslate 1.9.6 translates them (argos-translate-files 1.4.4): .txt,
.docx, .html and .srt. A Document holds the texts of an uploaded file to translate (``units``),
each translated as Argos Translate's ``translate`` translates a text, and writes the file back
from their translations (``render``). Parsing and writing run in a thread; the translating is
the server's (libre_file_api).

- .txt: the whole file is one text (its lines its paragraphs); line ends read as Python's text
  mode reads them (``\\r\\n`` and ``\\r`` become ``\\n``).
- .html: as ``format: "html"`` (libre_html), a leading ``<!DOCTYPE html>`` kept aside and put
  back, the result written without unescaping entities.
- .srt: each subtitle's text on one line, translated, wrapped at 40 columns (textwrap.fill);
  indexes, times and line ends kept (``srt``, which parses and writes as pysrt does here).
- .docx: the text of every ``w:t`` run of the body, headers and footers (python-docx),
  each translated alone with the spaces at its ends kept.

Every file is data: never executed, its name only sanitised into the download name, a .docx's
archive checked for its unpacked size before it is read.
"""
import io
import re
import textwrap
import unicodedata
import zipfile
from typing import List

from onmt_lite.serve.libre_html import HtmlPlan, keep_outer_spaces

# argos-translate-files' get_supported_formats, in its order, less those not translated here
EXTENSIONS = (".txt", ".docx", ".html", ".srt")
SAMPLE = 4096  # characters of a file that language detection reads (argos-translate-files')
SRT_WIDTH = 40  # argos-translate-files' textwrap width for subtitles
DOCTYPE = "<!DOCTYPE html>"
MAX_DOCX_ENTRIES = 1000  # files inside a .docx at most
MAX_DOCX_UNPACKED = 32 << 20  # bytes a .docx may unpack to
DOCX_PARTS = re.compile(r"^/word/(document|header\d*|footer\d*)\.xml$")


class FileUnreadable(Exception):
    """An uploaded file that is not what its extension says (the message says why)."""


class Document:
    """An uploaded file's texts to translate and its rebuilding."""

    units: List[str]

    def sample(self) -> str:
        """The text language detection reads (the file's first SAMPLE characters of text)."""
        raise NotImplementedError

    def render(self, translations: List[str]) -> bytes:
        """The translated file, from the translations of ``units`` in their order."""
        raise NotImplementedError

    def characters(self) -> int:
        return sum(len(unit) for unit in self.units)


def text_of(data: bytes, what: str) -> str:
    """A file's bytes as text: UTF-8 (a BOM skipped), line ends as Python's text mode reads."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise FileUnreadable(f"the {what} file is not UTF-8 text") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


class TextFile(Document):
    def __init__(self, data: bytes):
        self.units = [text_of(data, ".txt")]

    def sample(self) -> str:
        return self.units[0][:SAMPLE]

    def render(self, translations: List[str]) -> bytes:
        return translations[0].encode("utf-8")


class HtmlFile(Document):
    def __init__(self, data: bytes):
        content = text_of(data, ".html")
        self.doctype = content.startswith(DOCTYPE)
        self.plan = HtmlPlan(content[len(DOCTYPE):] if self.doctype else content)
        self.units = self.plan.texts()

    def sample(self) -> str:
        return self.plan.text()[:SAMPLE]

    def render(self, translations: List[str]) -> bytes:
        out = self.plan.render(translations, unescape=False)
        return ((DOCTYPE if self.doctype else "") + out).encode("utf-8")


class SubtitleFile(Document):
    def __init__(self, data: bytes):
        import srt
        try:
            raw = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise FileUnreadable("the .srt file is not UTF-8 text") from None
        self.eol = "\r\n" if "\r\n" in raw else "\n"
        try:
            self.subtitles = list(srt.parse(raw))
        except srt.SRTParseError as err:
            raise FileUnreadable(f"the .srt file cannot be read: {str(err)[:200]}") from None
        self.units = [" ".join(s.content.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
                      for s in self.subtitles]

    def sample(self) -> str:
        return "\n".join(s.content for s in self.subtitles)[:SAMPLE]

    def render(self, translations: List[str]) -> bytes:
        import srt
        for subtitle, translation in zip(self.subtitles, translations):
            subtitle.content = textwrap.fill(translation, width=SRT_WIDTH)
        return srt.compose(self.subtitles, reindex=False, eol=self.eol).encode("utf-8")


def check_archive(data: bytes) -> None:
    """Refuses a .docx that is no zip archive, holds too many files or unpacks too large."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError):
        raise FileUnreadable("the .docx file is not a zip archive") from None
    if len(entries) > MAX_DOCX_ENTRIES:
        raise FileUnreadable(f"the .docx file holds {len(entries)} files, over "
                             f"{MAX_DOCX_ENTRIES}")
    unpacked = sum(entry.file_size for entry in entries)
    if unpacked > MAX_DOCX_UNPACKED:
        raise FileUnreadable(f"the .docx file unpacks to {unpacked} bytes, over "
                             f"{MAX_DOCX_UNPACKED}")


class WordFile(Document):
    def __init__(self, data: bytes):
        import docx
        from docx.oxml.ns import qn
        check_archive(data)
        try:
            self.document = docx.Document(io.BytesIO(data))
        except Exception as err:  # noqa: BLE001 -- python-docx raises many kinds on bad input
            raise FileUnreadable(f"the .docx file cannot be read "
                                 f"({type(err).__name__})") from None
        parts = [part for part in self.document.part.package.iter_parts()
                 if DOCX_PARTS.match(str(part.partname)) and hasattr(part, "element")]
        parts.sort(key=lambda part: str(part.partname) != "/word/document.xml")
        self.runs = [t for part in parts for t in part.element.iter(qn("w:t"))]
        self.units = [t.text or "" for t in self.runs]

    def sample(self) -> str:
        return "".join(self.units)[:SAMPLE]

    def render(self, translations: List[str]) -> bytes:
        space = "{http://www.w3.org/XML/1998/namespace}space"
        for run, source, translation in zip(self.runs, self.units, translations):
            run.text = keep_outer_spaces(source, translation) if source else source
            if run.text != run.text.strip():
                run.set(space, "preserve")
        out = io.BytesIO()
        self.document.save(out)
        return out.getvalue()


READERS = {".txt": TextFile, ".docx": WordFile, ".html": HtmlFile, ".srt": SubtitleFile}


def open_document(extension: str, data: bytes) -> Document:
    """The Document of an uploaded file of ``extension`` (one of EXTENSIONS)."""
    return READERS[extension](data)


def secure_filename(name: str) -> str:
    """Werkzeug's secure_filename, as LibreTranslate names stored files: ASCII letters, digits,
    ``_``, ``.`` and ``-`` only, spaces as ``_``, no leading or trailing dots or underscores
    (so no path and no hidden file)."""
    name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii")
    name = name.replace("/", " ").replace("\\", " ")
    name = re.sub(r"[^A-Za-z0-9_.-]", "", "_".join(name.split())).strip("._")
    return name


def translated_name(upload_name: str, extension: str, target: str) -> str:
    """The download name of an upload's translation: ``story.txt`` into German is
    ``story_de.txt`` (argos-translate-files' output name); a name with nothing left once
    sanitised is ``file``."""
    stem = upload_name[:-len(extension)] if upload_name.endswith(extension) else upload_name
    stem = secure_filename(stem)[:100]
    return f"{stem or 'file'}_{secure_filename(target) or 'target'}{extension}"
