"""LibreTranslate's API at the root: translate, languages, detect, frontend settings (the fields
read from JSON or forms, as LibreTranslate reads them). Texts are cut into sentences and html
into text nodes as LibreTranslate cuts them (libre_text, libre_html); languages are detected as
it detects them (detect); files are translated by libre_file_api."""
import asyncio
from typing import Dict, List, Optional

from fastapi import FastAPI, Request

from onmt_lite.serve import libre_text
from onmt_lite.serve.detect import DetectorUnavailable, detect_languages, fallback
from onmt_lite.serve.languages import language_name
from onmt_lite.serve.libre_files import EXTENSIONS
from onmt_lite.serve.libre_html import translate_html
from onmt_lite.serve.models import ServedModel
from onmt_lite.serve.service import ApiError, Service, count
from onmt_lite.translate.sentences import SentenceSplitter, SplitterUnavailable

FORMATS = ("text", "html")


def check_queueable(service: Service, sentences: List[str]) -> None:
    """Refuses a request whose sentences could never all wait in the model's queue."""
    bound = service.limits.max_queue
    if len(sentences) > bound:
        raise ApiError(400, f"q: {len(sentences)} sentences, over the {bound} a request may "
                            f"queue (-max_queue)")


def sentence_decoder(service: Service, request: Request, model: ServedModel):
    """libre_text's Decode for one request: its sentences, all of them independent jobs of the
    model's shared batches, refused at once when they could never fit its queue."""
    async def decode(sentences: List[str], n_best: int) -> List[List[str]]:
        check_queueable(service, sentences)
        results = await service.translate(request, model, sentences, n_best)
        return [s.texts for s in results]
    return decode


def served_languages(service: Service) -> List[str]:
    """The languages the server translates from or into (LibreTranslate's installed
    languages): those language detection chooses from."""
    codes: List[str] = []
    for model in service.registry.models.values():
        if model.spec.src_lang and model.spec.tgt_lang:
            for code in (model.spec.src_lang, model.spec.tgt_lang):
                if code not in codes:
                    codes.append(code)
    return codes


async def detect(service: Service, q) -> List[dict]:
    """LibreTranslate's /detect answer for ``q`` (a text or a list of texts)."""
    try:
        return await asyncio.to_thread(detect_languages, q, tuple(served_languages(service)))
    except DetectorUnavailable as err:
        raise ApiError(500, str(err)) from None


async def detect_source(service: Service, q) -> dict:
    """The language ``q`` is most likely in, ``{"confidence", "language"}``, its code that of a
    served language (pt and pb, zh and zt stand for each other) when one fits."""
    best = dict((await detect(service, q))[0])
    best["language"] = fallback(best["language"], served_languages(service)) or best["language"]
    return best


async def splitter_of(model: ServedModel) -> SentenceSplitter:
    try:
        return await libre_text.splitter_for(model.spec.src_lang or "")
    except SplitterUnavailable as err:
        raise ApiError(500, str(err)) from None


def pair(service: Service, source, target) -> Optional[ServedModel]:
    """The model that translates ``source`` into ``target``; None when both are one served
    language (LibreTranslate translates a language into itself: the text unchanged)."""
    if isinstance(source, str) and isinstance(target, str) and source \
            and source.lower() == target.lower() and source.lower() in served_languages(service):
        return None
    return service.pair(source, target)


async def unchanged(texts: List[str]) -> List[str]:
    """Argos Translate's IdentityTranslation: a text into its own language."""
    return list(texts)


async def translate_texts(service: Service, request: Request, model: Optional[ServedModel],
                          texts: List[str], fmt: str, n_best: int):
    """Each text's translatedText and alternatives, as LibreTranslate gives them: text
    formatted from its sentences' n-best; html without alternatives. Without a model (a
    language into itself) each text is its own n-best."""
    if model is None:
        plain = unchanged
    else:
        splitter = await splitter_of(model)
        decode = sentence_decoder(service, request, model)

        async def plain(nodes: List[str]) -> List[str]:
            return await libre_text.translate(nodes, splitter, decode)
    if fmt == "html":
        translated = await asyncio.gather(*(translate_html(text, plain) for text in texts))
        return list(translated), [[] for _ in texts]
    if model is None:
        ranked = [[text] * n_best for text in texts]
    else:
        ranked = await libre_text.hypotheses(texts, splitter, decode, n_best)
    answers = [libre_text.answer(text, hyps) for text, hyps in zip(texts, ranked)]
    return [a[0] for a in answers], [a[1] for a in answers]


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
        if fmt not in FORMATS:
            raise ApiError(400, f"format {fmt!r} is not supported; use text or html")
        alternatives = count(data.get("alternatives", 0), "alternatives")
        source, detected = data.get("source"), None
        if isinstance(source, str) and source.lower() == "auto":
            detected = await detect_source(service, texts)
            source = detected["language"]
        model = pair(service, source, data.get("target"))
        if model is not None and alternatives + 1 > model.beam_size:
            raise ApiError(400, f"alternatives: at most {model.beam_size - 1} (the model's "
                                f"beam size {model.beam_size}, less one)")
        translated, others = await translate_texts(service, request, model, texts, fmt,
                                                   alternatives + 1)
        body = {"translatedText": translated if isinstance(q, list) else translated[0]}
        if alternatives:
            body["alternatives"] = others if isinstance(q, list) else others[0]
        if detected is not None:
            body["detectedLanguage"] = [detected] * len(texts) if isinstance(q, list) \
                else detected
        return body

    @app.get("/languages", tags=["LibreTranslate"],
             summary="The languages served: [{code, name, targets}], each language a target of "
                     "itself (its texts unchanged), as LibreTranslate lists them")
    async def languages():
        codes = served_languages(service)
        targets: Dict[str, set] = {code: {code} for code in codes}  # each into itself
        for model in service.registry.models.values():
            if model.spec.src_lang and model.spec.tgt_lang:
                targets[model.spec.src_lang].add(model.spec.tgt_lang)
        return [{"code": code, "name": language_name(code), "targets": sorted(targets[code])}
                for code in codes]

    @app.post("/detect", tags=["LibreTranslate"],
              summary="The languages q may be in, best first: [{confidence, language}] (among "
                      "the languages served)")
    async def detect_route(request: Request):
        data = await service.fields(request)
        service.check_key(data.get("api_key"))
        q = data.get("q")
        if not q:
            raise ApiError(400, "Invalid request: missing q parameter")
        texts = q if isinstance(q, list) else [q]
        if not all(isinstance(t, str) for t in texts):
            raise ApiError(400, "Invalid request: q must be a text or a list of texts")
        service.check_texts(texts, "q")
        return await detect(service, q)

    @app.get("/frontend/settings", tags=["LibreTranslate"])
    async def frontend_settings():
        codes = [m.spec for m in service.registry.models.values() if m.spec.src_lang]
        first = codes[0] if codes else None
        return {"charLimit": service.limits.max_chars, "frontendTimeout": 500,
                "apiKeys": bool(service.api_keys), "keyRequired": bool(service.api_keys),
                "suggestions": False,
                "filesTranslation": True, "supportedFilesFormat": list(EXTENSIONS),
                "language": {  # LibreTranslate's default source: detect
                    "source": {"code": "auto", "name": "Auto Detect"},
                    "target": {"code": first.tgt_lang, "name": language_name(first.tgt_lang)},
                } if first else {}}
