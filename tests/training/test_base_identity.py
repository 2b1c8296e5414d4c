"""The base model's identity that LoRA checkpoints record: one fingerprint whatever transformers
release wrote config.json, records of the first scheme (raw bytes) still accepted, another base refused."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from agentrl.config import ConfigError
from agentrl.training import lora


def _rewrite_version(model_dir, version):
    config = model_dir / "config.json"
    fields = json.loads(config.read_text())
    fields["transformers_version"] = version
    config.write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n")


def _first_scheme(model_dir) -> str:
    """The fingerprint as the code before scheme 2 computed it: config.json's bytes as they are."""
    h = hashlib.sha256((model_dir / "config.json").read_bytes())
    h.update(lora._headers(model_dir))
    return h.hexdigest()[:16]


def test_the_fingerprint_ignores_the_release_that_wrote_the_config(tmp_path, tiny_model_dir):
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    before = lora.identity(str(base))
    _rewrite_version(base, "5.25.0")
    assert lora.identity(str(base))["fingerprint"] == before["fingerprint"]
    assert before["scheme"] == 2
    lora.check_identity(before, str(base), "ckpt")


def test_a_first_scheme_record_from_another_release_is_accepted(tmp_path, tiny_model_dir):
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    _rewrite_version(base, "4.57.0.dev0")
    saved = {"path": "/elsewhere", "fingerprint": _first_scheme(base)}  # no scheme: the first one
    _rewrite_version(base, "5.25.1")
    lora.check_identity(saved, str(base), "ckpt")


@pytest.mark.parametrize("scheme", [None, 2])
def test_another_base_is_refused_naming_both(tmp_path, tiny_model_dir, scheme):
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    saved = lora.identity(str(base)) if scheme else {"path": str(base), "fingerprint": _first_scheme(base)}
    config = json.loads((base / "config.json").read_text())
    config["rms_norm_eps"] = config.get("rms_norm_eps", 1e-6) * 10
    (base / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"fingerprint .* but this run's base model is .*point model.path"):
        lora.check_identity(saved, str(base), "ckpt")
