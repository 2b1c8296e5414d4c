"""vLLM worker extension: receive new policy weights in place, without touching the disk.

Loaded inside vLLM's worker processes through ``LLM(worker_extension_cls=...)``; called with
``llm.collective_rpc("agentrl_load_weights", args=(blob,))``. The weights travel as one safetensors
blob because tensors sent through vLLM's RPC arrive as nested lists. vLLM's in-place
``reload_weights`` then runs the model's own weight loading and re-processes the kernel layouts (on
CPU, linear layers are prepacked: assigning to ``param.data`` directly would be ignored).
"""

from __future__ import annotations


class WeightSyncExtension:
    """Mixed into vLLM's worker class (it provides ``reload_weights``)."""

    def agentrl_load_weights(self, blob: bytes) -> int:
        """Load a safetensors blob of checkpoint-format weights; returns how many tensors."""
        from safetensors.torch import load

        state = load(blob)
        self.reload_weights(weights_iterator=iter(state.items()), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(state)
