"""OpenNMT-py's server API under /translator/: translate, models, health, clone, unload, to_cpu
(as OpenNMT-py 3.5.1's onmt_server answers them; errors are HTTP errors, never a 200)."""
import asyncio
from typing import Optional

from fastapi import FastAPI, Request

from onmt_lite.serve.config import ConfError
from onmt_lite.serve.limits import LimitError
from onmt_lite.serve.models import ModelUnavailable
from onmt_lite.serve.service import ApiError, Service, model_id_of


def add_routes(app: FastAPI, service: Service) -> None:
    """The /translator/ endpoints of ``service`` on ``app``."""
    @app.post("/translator/translate", tags=["OpenNMT-py"],
              summary="Translate [{src, id}, ...] with model id (OpenNMT-py's response: one list "
                      "per n-best rank)")
    async def onmt_translate(request: Request, api_key: Optional[str] = None):
        service.check_key(api_key or request.headers.get("x-api-key"))
        inputs = await service.json_body(request)
        if not isinstance(inputs, list) or not inputs:
            raise ApiError(400, 'expected a non-empty list of {"src": text, "id": model id}')
        for number, item in enumerate(inputs):
            if not isinstance(item, dict) or not isinstance(item.get("src"), str):
                raise ApiError(400, f'input {number}: expected {{"src": text, "id": model id}}')
        model = service.onmt_model(inputs[0].get("id", 0))
        sources = [item["src"] for item in inputs]
        service.check_texts(sources, "src")
        results = await service.translate(request, model, sources, attention=model.report_align)
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
        return [model.describe() for model in service.registry.models.values()]

    @app.get("/translator/health", tags=["OpenNMT-py"])
    async def onmt_health():
        return {"status": "ok"}

    @app.get("/translator/unload_model/{model_id}", tags=["OpenNMT-py"],
             summary="Unload a model (a clone is removed); an admin key with keys configured")
    async def onmt_unload(model_id: str, request: Request):
        service.check_admin(request)
        model = service.onmt_model(model_id_of(model_id))
        await asyncio.to_thread(service.registry.unload, model.id)
        return {"model_id": model.id, "status": "ok"}

    @app.post("/translator/clone_model/{model_id}", tags=["OpenNMT-py"],
              summary="A copy of a model with other options: body {opt, timeout} (an admin key "
                      "with keys configured; at most -max_models models)")
    async def onmt_clone(model_id: str, request: Request):
        service.check_admin(request)
        model = service.onmt_model(model_id_of(model_id))
        data = await service.json_body(request)
        if not isinstance(data, dict):
            raise ApiError(400, 'expected {"opt": {...}, "timeout": seconds}')
        opt, timeout = data.get("opt"), data.get("timeout", -1)
        if opt is not None and not isinstance(opt, dict):
            raise ApiError(400, "opt must be an object of translate options")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise ApiError(400, "timeout must be a number of seconds (-1: never)")
        try:
            clone = await asyncio.to_thread(service.registry.clone, model.id, opt, float(timeout))
        except (ConfError, LimitError, ModelUnavailable) as err:
            raise ApiError(400, str(err)) from None
        return {"status": "ok", "model_id": clone.id, "load_time": clone.load_time}

    @app.get("/translator/to_cpu/{model_id}", tags=["OpenNMT-py"])
    async def onmt_to_cpu(model_id: str, request: Request):
        service.check_admin(request)
        # models are served on the CPU: nothing to move
        model = service.onmt_model(model_id_of(model_id))
        return {"model_id": model.id, "status": "ok"}
