"""Makes tests/reference/argos.json: Argos Translate's own translations (argos-translate-lt,
as LibreTranslate runs it) of the first LINES raw test_2016_flickr.en lines by the packages
that ../shared/peers/make-argos-package.sh makes of the sentencepiece fixture, for
test_argos.py. Run it with LibreTranslate's virtualenv, the packages made first:

    bash ../shared/peers/make-argos-package.sh ~/onmt-peers ~/libretranslate-venv \\
        ../shared/fixtures/onmt-py-spm/model.pt ../shared/fixtures/onmt-py-spm/spm.model \\
        en de ~/argos-pkgs/fp32 float32          (and the same into ~/argos-pkgs/int8 int8)
    ~/libretranslate-venv/bin/python tests/reference/make_argos.py ~/argos-pkgs

Each line is translated as one text by ``argostranslate.translate.translate`` in the
environment of ../shared/peers/libretranslate-offline.sh (ARGOS_PACKAGES_DIR, the spaCy
splitter, no package index); ``apply_packaged_translation`` with a splitter that keeps the line
whole gives the same text where the splitter finds one sentence (``whole`` records it, and the
lines where the two differ).
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "..", "..", "..", "shared", "data", "multi30k", "test_2016_flickr.en")
PACKAGE = "translate-en_de-1_0"
LINES = {"fp32": 100, "int8": 100}


def offline_environment(packages: str) -> dict:
    """libretranslate-offline.sh's settings: argos's state in a temporary folder, the spaCy
    splitter, an empty package index, a blank multilingual spaCy pipeline in its cache."""
    state = tempfile.mkdtemp(prefix="argos-state-")
    env = dict(os.environ, XDG_DATA_HOME=f"{state}/data", XDG_CONFIG_HOME=f"{state}/config",
               XDG_CACHE_HOME=f"{state}/cache", ARGOS_PACKAGES_DIR=packages,
               ARGOS_CHUNK_TYPE="SPACY", ARGOS_INTER_THREADS="1", ARGOS_INTRA_THREADS="1")
    os.makedirs(f"{state}/data/argos-translate")
    os.makedirs(f"{state}/config")
    os.makedirs(f"{state}/cache/argos-translate/spacy/senter/model")
    with open(f"{state}/data/argos-translate/index.json", "w") as f:
        f.write("[]")
    subprocess.run([sys.executable, "-c", "import spacy,sys; spacy.blank('xx').to_disk(sys.argv[1])",
                    f"{state}/cache/argos-translate/spacy"], check=True)
    return env


def translate_here(count: int) -> dict:
    """(in the offline environment) argos's translations of the first ``count`` lines."""
    from argostranslate import package, translate

    class WholeLine:
        def split_sentences(self, text):
            return [text]
    with open(SOURCE, encoding="utf-8") as f:
        lines = [next(f).rstrip("\n") for _ in range(count)]
    translation = translate.get_translation_from_codes("en", "de")
    outputs = [translation.translate(line) for line in lines]
    pkg = next(p for p in package.get_installed_packages() if p.from_code == "en")
    import ctranslate2
    translator = ctranslate2.Translator(str(pkg.package_path / "model"), device="cpu",
                                        inter_threads=1, intra_threads=1)
    whole = [translate.apply_packaged_translation(pkg, line, translator, WholeLine(), 1)[0].value
             for line in lines]
    return {"lines": lines, "translations": outputs,
            "differ_from_whole": [i for i, (a, b) in enumerate(zip(outputs, whole)) if a != b]}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--here":
        print(json.dumps(translate_here(int(sys.argv[2])), ensure_ascii=False))
        return
    root = os.path.abspath(os.path.expanduser(sys.argv[1]))
    import argostranslate
    import ctranslate2
    out = {"made_by": "tests/reference/make_argos.py", "ctranslate2": ctranslate2.__version__,
           "argostranslate": getattr(argostranslate, "__version__", "argos-translate-lt"),
           "source": "test_2016_flickr.en", "packages": {}}
    for kind, count in LINES.items():
        env = offline_environment(os.path.join(root, kind))
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--here", str(count)],
                              env=env, check=True, capture_output=True, text=True)
        out["packages"][kind] = json.loads(done.stdout.strip().splitlines()[-1])
    with open(os.path.join(HERE, "argos.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
