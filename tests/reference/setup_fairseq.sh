#!/usr/bin/env bash
# Builds the side virtualenv for make_fairseq.py: fairseq 0.12.2 from its sdist on Python 3.11,
# with onmt_lite installed from this checkout. Usage (from the repository root):
#   bash tests/reference/setup_fairseq.sh [~/fs-peers]
# fairseq 0.12.2 predates Python 3.11: its config dataclasses take instances as defaults (3.11
# wants default_factory), it uses numpy's removed np.int / np.float, and its sdist lacks the
# sources of three optional extensions. Those are fixed below; its search code is untouched.
set -euo pipefail
venv=${1:-$HOME/fs-peers}
work=$(mktemp -d)
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q numpy==1.26.4 cython hydra-core==1.3.2 omegaconf==2.3.0 regex \
    sacrebleu bitarray tqdm cffi packaging wheel pyyaml sentencepiece safetensors pyonmttok \
    subword-nmt torch==2.13.0
"$venv/bin/pip" download -q --no-deps --no-build-isolation --no-binary :all: fairseq==0.12.2 \
    -d "$work"
tar xzf "$work/fairseq-0.12.2.tar.gz" -C "$work"
"$venv/bin/python" - "$work/fairseq-0.12.2" <<'PY'
import pathlib, re, sys
root = pathlib.Path(sys.argv[1])

def edit(path, *pairs, regex=False):
    file = root / path
    text = file.read_text()
    for old, new in pairs:
        changed = re.sub(old, new, text, flags=re.M) if regex else text.replace(old, new)
        assert changed != text, (path, old)
        text = changed
    file.write_text(text)

instance_default = (r"^(\s+\w+: (\w+Config) = )\2\(\)$", r"\1field(default_factory=\2)")
edit("fairseq/dataclass/configs.py", instance_default, regex=True)
edit("fairseq/models/transformer/transformer_config.py", instance_default, regex=True)
edit("fairseq/models/transformer/transformer_config.py",
     ("field(default=QuantNoiseConfig())", "field(default_factory=QuantNoiseConfig)"))
edit("fairseq/dataclass/initialize.py",
     ("v = FairseqConfig.__dataclass_fields__[k].default",
      "f = FairseqConfig.__dataclass_fields__[k]\n"
      "        v = f.default_factory() if callable(f.default_factory) else f.default"))
edit("fairseq/data/data_utils.py", ("np.int,", "np.int64,"))
edit("fairseq/modules/dynamic_crf_layer.py", ('np.float("inf")', 'float("inf")'))
edit("setup.py", ('\nif "READTHEDOCS" in os.environ:',
                  "\nextensions = [e for e in extensions if all(os.path.exists(s) for s in "
                  "e.sources)]\n\nif \"READTHEDOCS\" in os.environ:"))
PY
(cd "$work/fairseq-0.12.2" && MAX_JOBS=2 "$venv/bin/pip" install -q --no-build-isolation --no-deps .)
"$venv/bin/pip" install -q --no-deps -e .
"$venv/bin/python" -c "import fairseq, torch; print('fairseq', fairseq.__version__, 'torch', torch.__version__)"
