"""LibreTranslate's file translation: ``POST /translate_file`` (multipart: file, source, target,
api_key) answers ``{"translatedFileUrl"}``, and ``GET /download_file/<name>`` gives the
translated file once. The file's texts go through the same sentence path as /translate
(libre_text: every sentence a job of the model's shared batches).

Bounds, each checked before any work starts: the upload's bytes (-max_file_bytes: 413, counted
as it streams in; the body also counts against -max_request_bytes), the characters of its text
(-max_chars, as one q), its sentences (-max_queue). Translated files wait in a private folder
(made by tempfile, readable by this user only) under names of a random uuid: at most
-max_stored_files of them (the oldest dropped beyond), each removed once downloaded or after
FILE_TTL seconds.
"""
import asyncio
import logging
import mimetypes
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from typing import Optional, Tuple

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException

from onmt_lite.serve import libre_api, libre_files, libre_text
from onmt_lite.serve.forms import FileTooLarge, NotText, UploadFields, pairs
from onmt_lite.serve.libre_files import EXTENSIONS, FileUnreadable
from onmt_lite.serve.limits import Limits
from onmt_lite.serve.service import ApiError, Service

logger = logging.getLogger("onmt_lite")

FILE_TTL = 1800.0  # seconds a translated file waits for its download (LibreTranslate's 30 min)
STORED_NAME = re.compile(r"^[0-9a-f]{32}\.[A-Za-z0-9_.-]{1,120}$")


class FileStore:
    """Translated files waiting for their download, in a private temporary folder."""

    def __init__(self, max_files: int = Limits.max_stored_files, ttl: float = FILE_TTL):
        self.max_files, self.ttl = max_files, ttl
        self.folder: Optional[str] = None
        self.stored: "OrderedDict[str, float]" = OrderedDict()  # name: time stored
        self.lock = threading.Lock()

    def put(self, download_name: str, data: bytes) -> str:
        """Stores ``data``; returns its name (a random uuid, then ``download_name``)."""
        with self.lock:
            self._expire()
            while len(self.stored) >= self.max_files:
                oldest, _ = self.stored.popitem(last=False)
                logger.warning("translated file %s dropped before its download: %d files "
                               "wait already", oldest, self.max_files)
                self._remove(oldest)
            if self.folder is None:
                self.folder = tempfile.mkdtemp(prefix="onmt_lite-files-")
            name = f"{uuid.uuid4().hex}.{download_name}"
            fd = os.open(os.path.join(self.folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                         0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self.stored[name] = time.monotonic()
            return name

    def take(self, name: str) -> Optional[bytes]:
        """The stored file ``name``, removed from the store; None if there is none."""
        with self.lock:
            self._expire()
            if not STORED_NAME.match(name) or self.stored.pop(name, None) is None:
                return None
            path = os.path.join(self.folder, name)
            try:
                with open(path, "rb") as f:
                    return f.read()
            finally:
                self._remove(name)

    def close(self) -> None:
        """Removes every stored file and the folder."""
        with self.lock:
            self.stored.clear()
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
                self.folder = None

    def _expire(self) -> None:
        now = time.monotonic()
        while self.stored and now - next(iter(self.stored.values())) > self.ttl:
            name, _ = self.stored.popitem(last=False)
            self._remove(name)

    def _remove(self, name: str) -> None:
        try:
            os.remove(os.path.join(self.folder, name))
        except OSError:
            pass


async def read_upload(request: Request, max_bytes: int) -> Tuple[dict, Optional[UploadFile]]:
    """The fields of a multipart upload (with the query string's) and its file, refused with
    413 as soon as the file is over ``max_bytes``."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        values = dict(pairs(request.scope.get("query_string", b"")))
    except NotText as err:
        raise ApiError(400, f"{err.field} (query string): not valid UTF-8") from None
    if content_type == "application/x-www-form-urlencoded":  # fields, no file
        try:
            values.update(pairs(await request.body()))
        except NotText as err:
            raise ApiError(400, f"{err.field}: not valid UTF-8") from None
    if content_type != "multipart/form-data":
        return values, None
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_bytes + (64 << 10):
        raise ApiError(413, f"the file is over the limit of {max_bytes} bytes")
    try:
        form = await UploadFields(request.headers, request.stream(), max_bytes).parse()
    except FileTooLarge:
        raise ApiError(413, f"the file is over the limit of {max_bytes} bytes") from None
    except NotText as err:
        raise ApiError(400, f"{err.field[:100]}: not valid text") from None
    except MultiPartException as err:
        raise ApiError(400, f"the form body cannot be read: {err}") from None
    upload = None
    for key, value in form.multi_items():
        if isinstance(value, str):
            values[key] = value
        elif key == "file":
            upload = value
    return values, upload


def check_upload(values: dict, upload: Optional[UploadFile]) -> str:
    """LibreTranslate's checks, in its order; the file's extension."""
    if upload is None:
        raise ApiError(400, "Invalid request: missing file parameter")
    for name in ("source", "target"):
        if not values.get(name):
            raise ApiError(400, f"Invalid request: missing {name} parameter")
    if not upload.filename:
        raise ApiError(400, "Invalid request: empty file")
    extension = os.path.splitext(upload.filename)[1]
    if extension not in EXTENSIONS:
        raise ApiError(400, "Invalid request: file format not supported")
    return extension


def add_routes(app: FastAPI, service: Service, store: FileStore) -> None:
    """/translate_file and /download_file of ``service`` on ``app``."""
    @app.post("/translate_file", tags=["LibreTranslate"],
              summary="Translate a file (.txt, .docx, .html, .srt); answers the URL of its "
                      "translation, to download once")
    async def translate_file(request: Request):
        values, upload = await read_upload(request, service.limits.max_file_bytes)
        service.check_key(values.get("api_key"))
        extension = check_upload(values, upload)
        data = await upload.read()
        try:
            document = await asyncio.to_thread(libre_files.open_document, extension, data)
        except FileUnreadable as err:
            raise ApiError(400, f"Invalid request: {err}") from None
        chars = document.characters()
        if chars > service.limits.max_chars:
            raise ApiError(400, f"Invalid request: the file's text ({chars} characters) is over "
                                f"the limit of {service.limits.max_chars} (-max_chars)")
        source = values["source"]
        if source.lower() == "auto":
            source = (await libre_api.detect_source(service, document.sample()))["language"]
        model = libre_api.pair(service, source, values["target"])
        units = document.units
        if model is None or not units:  # a language into itself: the file unchanged
            translations = list(units)
        else:
            splitter = await libre_api.splitter_of(model)
            decode = libre_api.sentence_decoder(service, request, model)
            translations = await libre_text.translate(units, splitter, decode)
        output = await asyncio.to_thread(document.render, translations)
        target = model.spec.tgt_lang if model is not None else values["target"].lower()
        name = libre_files.translated_name(upload.filename, extension, target)
        stored = await asyncio.to_thread(store.put, name, output)
        return {"translatedFileUrl": str(request.url_for("download_file", filename=stored))}

    @app.get("/download_file/{filename}", tags=["LibreTranslate"],
             summary="A translated file (once: it is removed when downloaded)")
    async def download_file(filename: str):
        data = await asyncio.to_thread(store.take, filename)
        if data is None:
            raise ApiError(404, "no such file (a translated file is downloaded once, within "
                                f"{FILE_TTL / 60:g} minutes)")
        download = filename.split(".", 1)[1]
        media = mimetypes.guess_type(download)[0] or "application/octet-stream"
        if media.startswith("text/"):
            media += "; charset=utf-8"
        return Response(data, media_type=media,
                        headers={"Content-Disposition": f"attachment; filename={download}"})
