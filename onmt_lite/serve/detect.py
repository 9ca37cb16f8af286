"""Language identification as LibreTranslate 1.9.6 does it (its ``detect.py`` and
``language.detect_languages``), so that confidences match its own: lexilang's word lists for a
text under 20 characters, else langdetect's n-gram profiles with a fixed seed (the same text
always gets the same answer), both limited to the languages the server translates from or
into. Both libraries ship their data; nothing is downloaded.

langdetect draws random n-grams: LibreTranslate seeds its factory with 0; here one factory of
our own, seeded 0, makes a detector per text (each with its own random generator, so that
threads do not share one).
"""
import logging
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence

SHORT = 20  # characters: a shorter text is looked up in lexilang's word lists first
SEED = 0  # LibreTranslate's DetectorFactory.seed
CHINESE = {"zh-cn": "zh", "zh-tw": "zt"}  # langdetect's codes, as Argos Translate's

logger = logging.getLogger("onmt_lite")
_lock = threading.Lock()
_factory = None


class DetectorUnavailable(Exception):
    """langdetect or lexilang is not installed (the serve extra)."""


@dataclass
class Candidate:
    """A language a text may be in: its code, confidence (0 to 100) and the text's length."""
    code: str
    confidence: float
    text_length: int = 0


def _langdetect_factory():
    """langdetect's profiles, loaded once (about a second)."""
    global _factory
    with _lock:
        if _factory is None:
            try:
                from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory
            except ImportError:
                raise DetectorUnavailable("language detection needs langdetect and lexilang "
                                          "(pip install -e \".[serve]\")") from None
            factory = DetectorFactory()
            factory.load_profile(PROFILES_DIRECTORY)
            factory.set_seed(SEED)
            _factory = factory
    return _factory


def prepare() -> None:
    """Loads both detectors' data (for a server to do at start, in a thread)."""
    _langdetect_factory()
    from lexilang.detector import detect
    detect("hello", ())


def detect_text(text: str, codes: Sequence[str]) -> List[Candidate]:
    """LibreTranslate's Detector.detect: ``text``'s likely languages among ``codes``, best
    first (three at most); ``en`` with confidence 0 when none is found."""
    from langdetect.lang_detect_exception import ErrorCode, LangDetectException
    from lexilang.detector import detect as lexilang_detect
    factory = _langdetect_factory()
    if len(text) < SHORT:
        code, confidence = lexilang_detect(text, codes)
        if confidence > 0:
            return [Candidate(code, float(round(confidence * 100)))]
    try:
        detector = factory.create()
        detector.append(text)
        found = [lang for lang in detector.get_probabilities()
                 if CHINESE.get(lang.lang, lang.lang) in codes][:3]
    except LangDetectException as err:
        if err.code == ErrorCode.CantDetectError:
            return [Candidate("en", 0.0)]
        raise
    if not found or found[0].prob == 0:
        return [Candidate("en", 0.0)]
    return [Candidate(CHINESE.get(lang.lang, lang.lang), float(round(lang.prob * 100)))
            for lang in found]


def detect_languages(q, codes: Sequence[str]) -> List[dict]:
    """LibreTranslate's detect_languages: ``q`` (a text or a list of texts) as
    ``[{"confidence", "language"}]``, best first. For a list, each language's confidence is
    averaged over the texts that may be in it, and the languages are ranked by confidence
    weighted by those texts' share of all characters."""
    batch = isinstance(q, list)
    texts = q if batch else [q]
    candidates: List[Candidate] = []
    for text in texts:
        try:
            found = detect_text(text, codes)
        except Exception as err:  # noqa: BLE001 -- LibreTranslate skips such a text
            logger.warning("language detection failed on a text: %s", err)
            continue
        for candidate in found:
            candidate.text_length = len(text)
        candidates.extend(found)
    total = sum(c.text_length for c in candidates)
    if not candidates:
        return [{"confidence": 0.0, "language": "en"}]
    if batch:
        averaged = [average([c for c in candidates if c.code == code]) for code in codes]
        averaged = [c for c in averaged if c is not None]
        candidates = averaged or candidates
    candidates.sort(key=lambda c: 0 if total == 0 else c.confidence * c.text_length / total,
                    reverse=True)
    return [{"confidence": c.confidence, "language": c.code} for c in candidates]


def average(candidates: List[Candidate]) -> Optional[Candidate]:
    """One language's candidates of several texts as one: mean confidence, summed length."""
    if not candidates:
        return None
    first = candidates[0]
    if len(candidates) > 1:
        first.confidence = sum(c.confidence for c in candidates) / len(candidates)
        first.text_length = sum(c.text_length for c in candidates)
    return first


def fallback(code: str, served: Sequence[str]) -> Optional[str]:
    """LibreTranslate's get_language_with_fallback: ``code`` if served, else its variant (pt and
    pb, zh and zt), else None."""
    if code in served:
        return code
    for variant in {"pt": ["pb"], "pb": ["pt"], "zh": ["zt"], "zt": ["zh"]}.get(code, []):
        if variant in served:
            return variant
    return None
