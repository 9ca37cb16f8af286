"""The HTTP application: OpenNMT-py's server API under /translator/, LibreTranslate's API at the
root, the web page at /, /metrics. Every error is a 4xx or 503 with a JSON body: ``{"error":
message}`` (LibreTranslate's shape; under /translator/ also ``"status": "error"``, OpenNMT-py's)."""
import asyncio
import json
import logging
import os
from typing import Dict, List, Optional, Set

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.formparsers import MultiPartException

from onmt_lite.serve.batcher import QueueFull
from onmt_lite.serve.config import ConfError
from onmt_lite.serve.forms import NotText, TextFields, charset, pairs
from onmt_lite.serve.languages import language_name
from onmt_lite.serve.limits import LimitError, Limits
from onmt_lite.serve.metrics import CONTENT_TYPE_LATEST
from onmt_lite.serve.middleware import BodyLimit, InFlight, Measure, disconnected
from onmt_lite.serve.models import ModelUnavailable, Registry, ServedModel, TranslationFailed

logger = logging.getLogger("onmt_lite")
PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "page.html")


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: Optional[Dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def create_app(registry: Registry, limits: Limits = Limits(),
               api_keys: Optional[Set[str]] = None, admin_keys: Optional[Set[str]] = None):
    """The ASGI application serving ``registry``'s models. With ``api_keys``, translating needs
    one of them; with ``admin_keys`` or ``api_keys``, the endpoints that load, clone or unload
    models need one of ``admin_keys`` (or, with none given, of ``api_keys``)."""
    metrics = registry.metrics
    state = {"draining": False}

    async def lifespan(app):
        await asyncio.to_thread(registry.load_at_start)
        yield
        state["draining"] = True  # uvicorn has finished the requests in flight
        await asyncio.to_thread(registry.stop)

    app = FastAPI(title="onmt_lite translation server", lifespan=lifespan,
                  description="OpenNMT-py's server API under /translator/ and LibreTranslate's "
                              "API at the root, over onmt_lite's exact beam search.")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError):
        body = {"error": err.message}
        if request.url.path.startswith("/translator/"):
            body["status"] = "error"
        return JSONResponse(body, status_code=err.status, headers=err.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception):  # never a traceback to a client
        logger.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse({"error": f"internal error ({type(err).__name__})"}, status_code=500)

    app.add_middleware(Measure, metrics=metrics)

    # -- shared steps ---------------------------------------------------------------------
    def check_key(key, keys=api_keys) -> None:
        if not keys:
            return
        if key is None or key == "":
            raise ApiError(400, "an api_key is required")
        if key not in keys:
            raise ApiError(403, "Invalid API key")

    def check_admin(request: Request) -> None:
        """The management endpoints: they change what the server holds in memory."""
        check_key(request.query_params.get("api_key") or request.headers.get("x-api-key"),
                  admin_keys or api_keys)

    async def translate(request: Request, model: ServedModel, lines: List[str],
                        n_best: int = None, attention: bool = False):
        """``lines`` translated by ``model``; dropped (their sentences leave the queue or their
        lane) as soon as the client closes its connection: uvicorn does not cancel a request's
        handler when its client goes, so the translation races the client's disconnect."""
        if state["draining"]:
            raise ApiError(503, "the server is shutting down", {"Retry-After": "5"})
        work = asyncio.ensure_future(asyncio.wait_for(model.translate(lines, n_best, attention),
                                                      limits.timeout))
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
            raise ApiError(503, f"the translation took over {limits.timeout:g} s (-timeout)",
                           {"Retry-After": "5"}) from None
        except ModelUnavailable as err:
            raise ApiError(503, str(err)) from None
        except LimitError as err:
            raise ApiError(400, str(err)) from None
        except TranslationFailed as err:  # logged by the batcher
            raise ApiError(500, str(err)) from None

    def check_texts(texts: list, what: str) -> None:
        if len(texts) > limits.max_sentences:
            raise ApiError(400, f"{what}: {len(texts)} texts, over the limit of "
                                f"{limits.max_sentences} (-max_sentences)")
        for number, text in enumerate(texts):
            if len(text) > limits.max_chars:
                raise ApiError(400, f"{what}[{number}]: {len(text)} characters, over the limit "
                                    f"of {limits.max_chars} (-max_chars)")

    async def json_body(request: Request):
        try:
            return json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "the body is not valid JSON") from None

    # -- OpenNMT-py's server API ------------------------------------------------------------
    def onmt_model(model_id) -> ServedModel:
        if isinstance(model_id, bool) or not isinstance(model_id, int):
            raise ApiError(400, f"the model id must be an integer, got {model_id!r}")
        model = registry.get(model_id)
        if model is None:
            raise ApiError(404, f"No such model '{model_id}'")
        return model

    @app.post("/translator/translate", tags=["OpenNMT-py"],
              summary="Translate [{src, id}, ...] with model id (OpenNMT-py's response: one list "
                      "per n-best rank)")
    async def onmt_translate(request: Request, api_key: Optional[str] = None):
        check_key(api_key or request.headers.get("x-api-key"))
        inputs = await json_body(request)
        if not isinstance(inputs, list) or not inputs:
            raise ApiError(400, 'expected a non-empty list of {"src": text, "id": model id}')
        for number, item in enumerate(inputs):
            if not isinstance(item, dict) or not isinstance(item.get("src"), str):
                raise ApiError(400, f'input {number}: expected {{"src": text, "id": model id}}')
        model = onmt_model(inputs[0].get("id", 0))
        sources = [item["src"] for item in inputs]
        check_texts(sources, "src")
        results = await translate(request, model, sources, attention=model.report_align)
        n_best = model.n_best
        out = [[] for _ in range(n_best)]
        for src, sentence in zip(sources, results):
            # OpenNMT-py puts the outer spaces back (a line of spaces: twice, as it does)
            head, tail = src[:len(src) - len(src.lstrip())], src[len(src.rstrip()):]
            for rank in range(n_best):
                entry = {"src": src, "tgt": head + sentence.texts[rank] + tail, "n_best": n_best,
                         "pred_score": sentence.scores[rank]}
                if model.report_align:  # opt report_align: from the model's attention
                    entry["align"], entry["align_score"] = sentence.alignments[rank]
                out[rank].append(entry)
        return out

    @app.get("/translator/models", tags=["OpenNMT-py"])
    async def onmt_models():
        return [model.describe() for model in registry.models.values()]

    @app.get("/translator/health", tags=["OpenNMT-py"])
    async def onmt_health():
        return {"status": "ok"}

    @app.get("/translator/unload_model/{model_id}", tags=["OpenNMT-py"],
             summary="Unload a model (a clone is removed); an admin key with keys configured")
    async def onmt_unload(model_id: str, request: Request):
        check_admin(request)
        model = onmt_model(_int(model_id))
        await asyncio.to_thread(registry.unload, model.id)
        return {"model_id": model.id, "status": "ok"}

    @app.post("/translator/clone_model/{model_id}", tags=["OpenNMT-py"],
              summary="A copy of a model with other options: body {opt, timeout} (an admin key "
                      "with keys configured; at most -max_models models)")
    async def onmt_clone(model_id: str, request: Request):
        check_admin(request)
        model = onmt_model(_int(model_id))
        data = await json_body(request)
        if not isinstance(data, dict):
            raise ApiError(400, 'expected {"opt": {...}, "timeout": seconds}')
        opt, timeout = data.get("opt"), data.get("timeout", -1)
        if opt is not None and not isinstance(opt, dict):
            raise ApiError(400, "opt must be an object of translate options")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise ApiError(400, "timeout must be a number of seconds (-1: never)")
        try:
            clone = await asyncio.to_thread(registry.clone, model.id, opt, float(timeout))
        except (ConfError, LimitError, ModelUnavailable) as err:
            raise ApiError(400, str(err)) from None
        return {"status": "ok", "model_id": clone.id, "load_time": clone.load_time}

    @app.get("/translator/to_cpu/{model_id}", tags=["OpenNMT-py"])
    async def onmt_to_cpu(model_id: str, request: Request):
        check_admin(request)
        model = onmt_model(_int(model_id))  # models are served on the CPU: nothing to move
        return {"model_id": model.id, "status": "ok"}

    # -- LibreTranslate's API -----------------------------------------------------------------
    async def fields(request: Request) -> dict:
        """The request's fields: a JSON object, or form fields (urlencoded or multipart) with
        the query string's, as LibreTranslate reads them. A field that is not UTF-8 text (in
        the form's character set) is refused, naming it."""
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "application/json":
            data = await json_body(request)
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

    def pair(source, target) -> ServedModel:
        for name, value in (("source", source), ("target", target)):
            if not isinstance(value, str) or not value:
                raise ApiError(400, f"Invalid request: missing {name} parameter")
        source, target = source.lower(), target.lower()
        if source == "auto":
            sources = {m.spec.src_lang for m in registry.models.values()
                       if m.spec.tgt_lang == target}
            if len(sources) != 1:
                raise ApiError(400, "source auto: this server does not detect languages; give "
                                    "the source language")
            source = sources.pop()
        model = registry.by_languages(source, target)
        if model is None:
            known = {m.spec.src_lang for m in registry.models.values()}
            what = f"{target} is not supported from {source}" if source in known \
                else f"{source} is not supported"
            raise ApiError(400, what)
        return model

    @app.post("/translate", tags=["LibreTranslate"],
              summary="Translate q (a text or a list of texts) from source to target")
    async def libre_translate(request: Request):
        data = await fields(request)
        check_key(data.get("api_key"))
        q = data.get("q")
        if q is None or q == "":
            raise ApiError(400, "Invalid request: missing q parameter")
        texts = q if isinstance(q, list) else [q]
        if not all(isinstance(t, str) for t in texts):
            raise ApiError(400, "Invalid request: q must be a text or a list of texts")
        check_texts(texts, "q")
        fmt = data.get("format", "text") or "text"
        if fmt != "text":
            raise ApiError(400, f"format {fmt!r} is not supported; use text")
        alternatives = _count(data.get("alternatives", 0), "alternatives")
        model = pair(data.get("source"), data.get("target"))
        if alternatives + 1 > model.beam_size:
            raise ApiError(400, f"alternatives: at most {model.beam_size - 1} (the model's "
                                f"beam size {model.beam_size}, less one)")
        translated, others = await translate_texts(request, model, texts, alternatives + 1)
        body = {"translatedText": translated if isinstance(q, list) else translated[0]}
        if alternatives:
            body["alternatives"] = others if isinstance(q, list) else others[0]
        if str(data.get("source")).lower() == "auto":
            detected = {"confidence": 0, "language": model.spec.src_lang}
            body["detectedLanguage"] = [detected] * len(texts) if isinstance(q, list) \
                else detected
        return body

    async def translate_texts(request: Request, model: ServedModel, texts: List[str],
                              n_best: int):
        """Each text's translation and alternatives: its lines translated as sentences (empty
        lines kept), the k-th alternative made of each line's k-th hypothesis."""
        lines = [line for text in texts for line in text.split("\n")]
        results = await translate(request, model, lines, n_best)
        translated, others, at = [], [], 0
        for text in texts:
            count = text.count("\n") + 1
            mine = results[at:at + count]
            at += count
            ranks = ["\n".join(s.texts[rank] for s in mine) for rank in range(n_best)]
            translated.append(ranks[0])
            others.append(ranks[1:])
        return translated, others

    @app.get("/languages", tags=["LibreTranslate"],
             summary="The language pairs served: [{code, name, targets}]")
    async def languages():
        targets: Dict[str, List[str]] = {}
        for model in registry.models.values():
            if model.spec.src_lang and model.spec.tgt_lang:
                targets.setdefault(model.spec.src_lang, [])
                if model.spec.tgt_lang not in targets[model.spec.src_lang]:
                    targets[model.spec.src_lang].append(model.spec.tgt_lang)
        return [{"code": code, "name": language_name(code), "targets": sorted(to)}
                for code, to in targets.items()]

    @app.post("/detect", tags=["LibreTranslate"],
              summary="The served source languages, each with confidence 0: this server does "
                      "not detect languages")
    async def detect(request: Request):
        data = await fields(request)
        check_key(data.get("api_key"))
        if not data.get("q"):
            raise ApiError(400, "Invalid request: missing q parameter")
        sources = dict.fromkeys(m.spec.src_lang for m in registry.models.values()
                                if m.spec.src_lang)
        return [{"confidence": 0, "language": code} for code in sources]

    @app.get("/frontend/settings", tags=["LibreTranslate"])
    async def frontend_settings():
        codes = [m.spec for m in registry.models.values() if m.spec.src_lang]
        first = codes[0] if codes else None
        return {"charLimit": limits.max_chars, "frontendTimeout": 500,
                "apiKeys": bool(api_keys), "keyRequired": bool(api_keys), "suggestions": False,
                "filesTranslation": False, "supportedFilesFormat": [],
                "language": {
                    "source": {"code": first.src_lang, "name": language_name(first.src_lang)},
                    "target": {"code": first.tgt_lang, "name": language_name(first.tgt_lang)},
                } if first else {}}

    # -- this server's own -----------------------------------------------------------------
    @app.post("/inspect", tags=["onmt_lite"],
              summary="A text's n-best with scores, and each line's attention (the web page's)")
    async def inspect(request: Request):
        data = await json_body(request)
        if not isinstance(data, dict):
            raise ApiError(400, "the JSON body must be an object")
        check_key(data.get("api_key"))
        q = data.get("q")
        if not isinstance(q, str) or not q.strip():
            raise ApiError(400, "Invalid request: q must be a non-empty text")
        check_texts([q], "q")
        model = pair(data.get("source"), data.get("target"))
        n_best = min(model.beam_size, _count(data.get("n_best", model.beam_size), "n_best") or 1)
        lines = q.split("\n")
        results = await translate(request, model, lines, n_best, attention=True)
        return {"translatedText": "\n".join(s.texts[0] for s in results),
                "nbest": [{"text": "\n".join(s.texts[rank] for s in results),
                           "score": sum(s.scores[rank] for s in results)}
                          for rank in range(n_best)],
                "sentences": [{"source": line, "translation": s.texts[0], "score": s.scores[0],
                               "source_tokens": s.src_tokens, "target_tokens": s.tgt_tokens,
                               "attention": s.attention or []}
                              for line, s in zip(lines, results)]}

    @app.get("/", include_in_schema=False)
    async def page():
        with open(PAGE, encoding="utf-8") as f:
            return HTMLResponse(f.read())

    @app.get("/health", tags=["onmt_lite"], summary="Liveness: the process answers")
    async def health():
        return {"status": "ok"}

    @app.get("/ready", tags=["onmt_lite"],
             summary="Readiness: 200 when every model to load at start is loaded and the server "
                     "is not shutting down; else 503")
    async def ready():
        waiting = [m.id for m in registry.models.values()
                   if m.spec.load and m.state in ("unloaded", "loading")]
        if state["draining"] or waiting:
            why = "shutting down" if state["draining"] else f"loading models {waiting}"
            return JSONResponse({"status": why}, status_code=503)
        return {"status": "ready",
                "models": {str(m.id): m.state for m in registry.models.values()}}

    @app.get("/metrics", tags=["onmt_lite"], summary="Prometheus text format")
    async def prometheus():
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    if limits.max_request_bytes > 0:
        app = BodyLimit(app, limits.max_request_bytes)
    return InFlight(app, limits.max_connections) if limits.max_connections > 0 else app


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ApiError(400, f"the model id must be an integer, got {text!r}") from None


def _count(value, name: str) -> int:
    """A non-negative integer field, given as a number or (a form's) text."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ApiError(400, f"Invalid request: {name} must be a non-negative integer")
    return value
