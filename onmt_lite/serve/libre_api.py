"""LibreTranslate's API at the root: translate, languages, detect, frontend settings (the fields
read from JSON or forms, as LibreTranslate reads them)."""
from typing import Dict, List

from fastapi import FastAPI, Request

from onmt_lite.serve.languages import language_name
from onmt_lite.serve.models import ServedModel
from onmt_lite.serve.service import ApiError, Service, count


def add_routes(app: FastAPI, service: Service) -> None:
    """LibreTranslate's endpoints of ``service`` on ``app``."""
    @app.post("/translate", tags=["LibreTranslate"],
              summary="Translate q (a text or a list of texts) from source to target")
    async def libre_translate(request: Request):
        data = await service.fields(request)
        service.check_key(data.get("api_key"))
        q = data.get("q")
        if q is None or q == "":
            raise ApiError(400, "Invalid request: missing q parameter")
        texts = q if isinstance(q, list) else [q]
        if not all(isinstance(t, str) for t in texts):
            raise ApiError(400, "Invalid request: q must be a text or a list of texts")
        service.check_texts(texts, "q")
        fmt = data.get("format", "text") or "text"
        if fmt != "text":
            raise ApiError(400, f"format {fmt!r} is not supported; use text")
        alternatives = count(data.get("alternatives", 0), "alternatives")
        model = service.pair(data.get("source"), data.get("target"))
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
        results = await service.translate(request, model, lines, n_best)
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
        for model in service.registry.models.values():
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
        data = await service.fields(request)
        service.check_key(data.get("api_key"))
        if not data.get("q"):
            raise ApiError(400, "Invalid request: missing q parameter")
        sources = dict.fromkeys(m.spec.src_lang for m in service.registry.models.values()
                                if m.spec.src_lang)
        return [{"confidence": 0, "language": code} for code in sources]

    @app.get("/frontend/settings", tags=["LibreTranslate"])
    async def frontend_settings():
        codes = [m.spec for m in service.registry.models.values() if m.spec.src_lang]
        first = codes[0] if codes else None
        return {"charLimit": service.limits.max_chars, "frontendTimeout": 500,
                "apiKeys": bool(service.api_keys), "keyRequired": bool(service.api_keys),
                "suggestions": False,
                "filesTranslation": False, "supportedFilesFormat": [],
                "language": {
                    "source": {"code": first.src_lang, "name": language_name(first.src_lang)},
                    "target": {"code": first.tgt_lang, "name": language_name(first.tgt_lang)},
                } if first else {}}
