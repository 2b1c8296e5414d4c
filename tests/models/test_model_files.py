"""Files agentrl writes for a model: modes a serving account can read."""

from __future__ import annotations

import stat

from agentrl.models.gguf import plain_modes


def test_saved_weights_get_the_mode_of_the_other_files(tmp_path, tiny_policy):
    """transformers writes model.safetensors 0600 (a private temporary file) and config.json 0644;
    ``plain_modes`` (run by ``agentrl export`` and the GGUF conversion cache) makes them alike."""
    model, tokenizer = tiny_policy
    model.save_pretrained(tmp_path, safe_serialization=True)
    tokenizer.save_pretrained(tmp_path)
    plain_modes(tmp_path)
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in tmp_path.iterdir()}
    assert modes["model.safetensors"] == modes["config.json"] and len(set(modes.values())) == 1, modes
    assert not (tmp_path / ".agentrl-mode-probe").exists()
