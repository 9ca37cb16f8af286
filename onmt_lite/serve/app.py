"""The HTTP application: OpenNMT-py's server API under /translator/, LibreTranslate's API at the
root, the web page at /, /metrics. Every error is a 4xx or 503 with a JSON body: ``{"error":
message}`` (LibreTranslate's shape; under /translator/ also ``"status": "error"``, OpenNMT-py's)."""
import asyncio
import logging
import os
from typing import Optional, Set

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from onmt_lite.serve import libre_api, libre_file_api, libre_text, onmt_api
from onmt_lite.serve.limits import Limits
from onmt_lite.serve.metrics import CONTENT_TYPE_LATEST
from onmt_lite.serve.middleware import BodyLimit, InFlight, Measure
from onmt_lite.serve.models import Registry
from onmt_lite.serve.service import ApiError, Service, count

logger = logging.getLogger("onmt_lite")
PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "page.html")


def create_app(registry: Registry, limits: Limits = Limits(),
               api_keys: Optional[Set[str]] = None, admin_keys: Optional[Set[str]] = None):
    """The ASGI application serving ``registry``'s models (keys: see service.Service)."""
    service = Service(registry, limits, api_keys, admin_keys)
    store = libre_file_api.FileStore(limits.max_stored_files)

    async def lifespan(app):
        await asyncio.to_thread(registry.load_at_start)
        yield
        service.draining = True  # uvicorn has finished the requests in flight
        await asyncio.to_thread(registry.stop)
        store.close()

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

    app.add_middleware(Measure, metrics=registry.metrics)
    onmt_api.add_routes(app, service)
    libre_api.add_routes(app, service)
    libre_file_api.add_routes(app, service, store)
    _add_own_routes(app, service)
    if limits.max_request_bytes > 0:
        app = BodyLimit(app, limits.max_request_bytes)
    return InFlight(app, limits.max_connections) if limits.max_connections > 0 else app


async def inspect_text(service: Service, request: Request, model, q: str, n_best: int) -> dict:
    """The web page's answer: the text translated as /translate translates it, its n-best (each
    text rebuilt from its sentences' k-th hypotheses, scores summed) and each sentence with
    its tokens and attention."""
    splitter = await libre_api.splitter_of(model)
    plan = await asyncio.to_thread(libre_text.TextPlan, [q], splitter)
    sentences = plan.sentences()
    libre_api.check_queueable(service, sentences)
    results = await service.translate(request, model, sentences, n_best, attention=True)
    ranked = plan.ranked([s.texts for s in results], n_best)[0]
    return {"translatedText": libre_text.answer(q, ranked)[0],
            "nbest": [{"text": ranked[rank], "score": sum(s.scores[rank] for s in results)}
                      for rank in range(n_best)],
            "sentences": [{"source": sentence, "translation": s.texts[0], "score": s.scores[0],
                           "source_tokens": s.src_tokens, "target_tokens": s.tgt_tokens,
                           "attention": s.attention or []}
                          for sentence, s in zip(sentences, results)]}


def _add_own_routes(app: FastAPI, service: Service) -> None:
    """This server's own: the web page and its /inspect, the probes, /metrics."""
    @app.post("/inspect", tags=["onmt_lite"],
              summary="A text's n-best with scores, and each sentence's attention (the web page's)")
    async def inspect(request: Request):
        data = await service.json_body(request)
        if not isinstance(data, dict):
            raise ApiError(400, "the JSON body must be an object")
        service.check_key(data.get("api_key"))
        q = data.get("q")
        if not isinstance(q, str) or not q.strip():
            raise ApiError(400, "Invalid request: q must be a non-empty text")
        service.check_texts([q], "q")
        model = service.pair(data.get("source"), data.get("target"))
        n_best = min(model.beam_size, count(data.get("n_best", model.beam_size), "n_best") or 1)
        return await inspect_text(service, request, model, q, n_best)

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
        waiting = [m.id for m in service.registry.models.values()
                   if m.spec.load and m.state in ("unloaded", "loading")]
        if service.draining or waiting:
            why = "shutting down" if service.draining else f"loading models {waiting}"
            return JSONResponse({"status": why}, status_code=503)
        return {"status": "ready",
                "models": {str(m.id): m.state for m in service.registry.models.values()}}

    @app.get("/metrics", tags=["onmt_lite"], summary="Prometheus text format")
    async def prometheus():
        return Response(service.registry.metrics.text(), media_type=CONTENT_TYPE_LATEST)
