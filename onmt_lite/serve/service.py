"""What the server's endpoints share: its models, limits and keys, and the steps of a request
(keys checked, bodies and form fields read, texts bounded, translations that race the client's
disconnect). Every refusal is an ApiError: a status and a message for the client."""
import asyncio
import json
import logging
from typing import Dict, List, Optional, Set

from fastapi import Request
from starlette.formparsers import MultiPartException

from onmt_lite.serve.batcher import QueueFull
from onmt_lite.serve.forms import NotText, TextFields, charset, pairs
from onmt_lite.serve.limits import LimitError, Limits
from onmt_lite.serve.middleware import disconnected
from onmt_lite.serve.models import ModelUnavailable, Registry, ServedModel, TranslationFailed

logger = logging.getLogger("onmt_lite")


class ApiError(Exception):
    """A refused or failed request: its HTTP ``status``, ``message`` and ``headers``."""

    def __init__(self, status: int, message: str, headers: Optional[Dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


class Service:
    """The served models (``registry``) with the server's ``limits`` and keys. With
    ``api_keys``, translating needs one of them; with ``admin_keys`` or ``api_keys``, the
    endpoints that load, clone or unload models need one of ``admin_keys`` (or, with none
    given, of ``api_keys``)."""

    def __init__(self, registry: Registry, limits: Limits, api_keys: Optional[Set[str]],
                 admin_keys: Optional[Set[str]]):
        self.registry, self.limits = registry, limits
        self.api_keys, self.admin_keys = api_keys, admin_keys
        self.draining = False  # shutting down: no new translation starts

    def check_key(self, key, keys=None) -> None:
        """A client's key, checked against ``keys`` (the API keys unless told)."""
        keys = self.api_keys if keys is None else keys
        if not keys:
            return
        if key is None or key == "":
            raise ApiError(400, "an api_key is required")
        if key not in keys:
            raise ApiError(403, "Invalid API key")

    def check_admin(self, request: Request) -> None:
        """The management endpoints: they change what the server holds in memory."""
        self.check_key(request.query_params.get("api_key") or
                       request.headers.get("x-api-key"), self.admin_keys or self.api_keys)

    async def translate(self, request: Request, model: ServedModel, lines: List[str],
                        n_best: int = None, attention: bool = False):
        """``lines`` translated by ``model``; dropped (their sentences leave the queue or their
        lane) as soon as the client closes its connection: uvicorn does not cancel a request's
        handler when its client goes, so the translation races the client's disconnect."""
        if self.draining:
            raise ApiError(503, "the server is shutting down", {"Retry-After": "5"})
        work = asyncio.ensure_future(asyncio.wait_for(model.translate(lines, n_best, attention),
                                                      self.limits.timeout))
        gone = asyncio.ensure_future(disconnected(request.receive))
        try:
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, gone):
                task.cancel()  # when done, nothing
            await asyncio.gather(work, gone, return_exceptions=True)
        if work.cancelled():
            logger.info("%s %s: the client left before its answer; %d sentences dropped",
                        request.method, request.url.path, len(lines))
            raise ApiError(499, "the client closed its connection")
        try:
            return work.result()
        except QueueFull as err:
            raise ApiError(503, f"the server is busy: {err}",
                           {"Retry-After": str(err.retry_after)}) from None
        except asyncio.TimeoutError:
            raise ApiError(503, f"the translation took over {self.limits.timeout:g} s "
                                "(-timeout)",
                           {"Retry-After": "5"}) from None
        except ModelUnavailable as err:
            raise ApiError(503, str(err)) from None
        except LimitError as err:
            raise ApiError(400, str(err)) from None
        except TranslationFailed as err:  # logged by the batcher
            raise ApiError(500, str(err)) from None

    def check_texts(self, texts: list, what: str) -> None:
        if len(texts) > self.limits.max_sentences:
            raise ApiError(400, f"{what}: {len(texts)} texts, over the limit of "
                                f"{self.limits.max_sentences} (-max_sentences)")
        for number, text in enumerate(texts):
            if len(text) > self.limits.max_chars:
                raise ApiError(400, f"{what}[{number}]: {len(text)} characters, over the limit "
                                    f"of {self.limits.max_chars} (-max_chars)")

    async def json_body(self, request: Request):
        try:
            return json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "the body is not valid JSON") from None

    def onmt_model(self, model_id) -> ServedModel:
        if isinstance(model_id, bool) or not isinstance(model_id, int):
            raise ApiError(400, f"the model id must be an integer, got {model_id!r}")
        model = self.registry.get(model_id)
        if model is None:
            raise ApiError(404, f"No such model '{model_id}'")
        return model

    async def fields(self, request: Request) -> dict:
        """The request's fields: a JSON object, or form fields (urlencoded or multipart) with
        the query string's, as LibreTranslate reads them. A field that is not UTF-8 text (in
        the form's character set) is refused, naming it."""
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "application/json":
            data = await self.json_body(request)
            if not isinstance(data, dict):
                raise ApiError(400, "the JSON body must be an object")
            return data
        try:
            values = dict(pairs(request.scope.get("query_string", b"")))
        except NotText as err:
            raise ApiError(400, f"{err.field} (query string): not valid UTF-8") from None
        if content_type == "application/x-www-form-urlencoded":
            try:
                values.update(pairs(await request.body()))
            except NotText as err:
                raise ApiError(400, f"{err.field}: not valid UTF-8") from None
        elif content_type == "multipart/form-data":
            try:
                form = await TextFields(request.headers, request.stream()).parse()
            except NotText as err:
                raise ApiError(400, f"{err.field[:100]}: not valid "
                                    f"{charset(request).upper()}") from None
            except MultiPartException:
                raise ApiError(400, "the form body cannot be read") from None
            values.update((k, v) for k, v in form.items() if isinstance(v, str))
        if isinstance(values.get("q"), str):
            values["q"] = values["q"].replace("\r\n", "\n")
        return values

    def pair(self, source, target) -> ServedModel:
        """The model that translates ``source`` into ``target`` (LibreTranslate's fields; a
        source "auto" is detected first, see libre_api)."""
        for name, value in (("source", source), ("target", target)):
            if not isinstance(value, str) or not value:
                raise ApiError(400, f"Invalid request: missing {name} parameter")
        source, target = source.lower(), target.lower()
        model = self.registry.by_languages(source, target)
        if model is None:
            known = {m.spec.src_lang for m in self.registry.models.values()}
            what = f"{target} is not supported from {source}" if source in known \
                else f"{source} is not supported"
            raise ApiError(400, what)
        return model


def model_id_of(text: str) -> int:
    """A model id from a path."""
    try:
        return int(text)
    except ValueError:
        raise ApiError(400, f"the model id must be an integer, got {text!r}") from None


def count(value, name: str) -> int:
    """A non-negative integer field, given as a number or (a form's) text."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ApiError(400, f"Invalid request: {name} must be a non-negative integer")
    return value
