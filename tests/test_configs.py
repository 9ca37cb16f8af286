"""The shipped training configs, in their smallest form: every key they use is accepted and a
few hundred steps on a toy task (tiny model, tiny data made here) bring perplexity down."""
import logging
import os

import pytest
import yaml
from conftest import ROOT, write_toy_task

from onmt_lite.train.trainer import train

CONFIGS = ["transformer_multi30k.yaml", "rnn_multi30k.yaml"]
SMALL = {"enc_layers": 1, "dec_layers": 1, "hidden_size": 32, "word_vec_size": 32,
         "heads": 2, "transformer_ff": 64, "batch_size": 256, "valid_batch_size": 1024,
         "train_steps": 400, "valid_steps": 50, "save_checkpoint_steps": 400,
         "report_every": 1000, "dropout": 0.0, "warmup_steps": 50, "log_file": None,
         "src_words_min_frequency": 1, "tgt_words_min_frequency": 1}


@pytest.mark.parametrize("name", CONFIGS)
def test_config_trains_in_smallest_form(name, tmp_path):
    with open(os.path.join(ROOT, "configs", name), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    toy, _ = write_toy_task(tmp_path)
    config.update(SMALL, data=toy["data"], save_model=str(tmp_path / "run" / "model"))
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("onmt_lite.train")
    logger.addHandler(handler)
    try:
        train(config, progress=False)
    finally:
        logger.removeHandler(handler)
    ppl = [float(m.split("ppl ")[1].split(";")[0]) for m in records if m.startswith("validation")]
    assert len(ppl) == 8 and ppl[-1] < 0.7 * ppl[0], ppl  # the recipes learn, if slowly here
