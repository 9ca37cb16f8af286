"""Form fields read as text, strictly: a field whose bytes are not text in the form's
character set is refused (NotText), not read as U+FFFD or Latin-1 and translated."""
from typing import List, Tuple
from urllib.parse import unquote_to_bytes

from fastapi import Request
from starlette.formparsers import MultiPartParser


class NotText(Exception):
    """A form field whose bytes are not text in the form's character set."""

    def __init__(self, field: str):
        super().__init__(field)
        self.field = field


class TextFields(MultiPartParser):
    """Starlette's multipart parser, except that a field that is not valid text raises NotText
    (Starlette reads it as Latin-1 instead)."""

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            try:
                bytes(part.data).decode(self._charset)
            except UnicodeDecodeError:
                raise NotText(part.field_name) from None
        super().on_part_end()


class FileTooLarge(Exception):
    """An uploaded file over its limit of bytes."""


class UploadFields(TextFields):
    """TextFields for an upload of one file, refused (FileTooLarge) as soon as the file's bytes
    go over ``max_file_bytes``, before the rest of the body is read."""

    def __init__(self, headers, stream, max_file_bytes: int):
        super().__init__(headers, stream, max_files=1, max_fields=32)
        self.max_file_bytes, self.file_bytes = max_file_bytes, 0

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._current_part.file is not None:
            self.file_bytes += end - start
            if self.file_bytes > self.max_file_bytes:
                raise FileTooLarge(self.max_file_bytes)
        super().on_part_data(data, start, end)


def pairs(raw: bytes) -> List[Tuple[str, str]]:
    """The name=value pairs of a query string or an urlencoded body, percent-decoded and read as
    UTF-8 (Starlette replaces what is not UTF-8 with U+FFFD, silently). Raises NotText naming
    the first field that is not UTF-8."""
    found = []
    for item in raw.split(b"&"):
        if not item:
            continue
        name, _, value = item.partition(b"=")
        name, value = (unquote_to_bytes(part.replace(b"+", b" ")) for part in (name, value))
        try:
            field = name.decode("utf-8")
        except UnicodeDecodeError:
            raise NotText("a field name") from None
        try:
            found.append((field, value.decode("utf-8")))
        except UnicodeDecodeError:
            raise NotText(field[:100]) from None
    return found


def charset(request: Request) -> str:
    """The character set a form's Content-Type names (UTF-8 when none)."""
    for param in request.headers.get("content-type", "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"') or "utf-8"
    return "utf-8"
