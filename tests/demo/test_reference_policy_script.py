"""`scripts/build_reference_policy.py` runs end to end (two steps) and writes a loadable policy and its card."""

from __future__ import annotations

import json
import os

from repo_paths import REPO
from tiny import run_python
from transformers import AutoModelForCausalLM, AutoTokenizer


def test_build_script_writes_a_loadable_policy(tmp_path):
    script = os.path.join(REPO, "scripts", "build_reference_policy.py")
    run_python(script, "--steps", "2", "--batch-size", "4", "--out", str(tmp_path))
    card = json.loads((tmp_path / "reference_policy.json").read_text())
    assert card["steps"] == 2 and card["n_validation"] == 200 and 0.0 <= card["validation"]["accuracy"] <= 1.0
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert sum(p.numel() for p in model.parameters()) == card["parameters"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.decode(tokenizer("20-5=15 #### 15")["input_ids"]) == "20-5=15 #### 15"
