"""Policies and tokenizers: load any causal LM through transformers, or build tiny local ones.

Two paths, one loader (``load_policy``):
- a local directory or hub name goes through ``AutoModelForCausalLM.from_pretrained``;
- ``"tiny:h128-L8"`` (see ``PRESETS``) builds a randomly initialised Qwen2-architecture model and a
  locally trained byte-level BPE tokenizer once, caches them under ``$AGENTRL_CACHE`` (default
  ``~/.cache/agentrl``), and loads them from there afterwards. Nothing is downloaded.

The tiny tokenizer uses Qwen2's exact normalizer (NFC) and pre-tokenizer (its split regex, which makes
every digit its own token, then byte-level), so even a loader that rebuilds the pipeline from the
vocabulary gets the same ids. We still load it with ``PreTrainedTokenizerFast``: transformers' AutoTokenizer
maps ``model_type=qwen2`` to ``Qwen2Tokenizer``, which rebuilds the pipeline and drops anything that is
not Qwen's (docs/MACHINE.md pitfall). Our tokenizers carry ``"agentrl_tiny": true`` in
tokenizer_config.json so ``agentrl.models.tokenizer.load_tokenizer`` can tell them apart.

Special tokens: ``<|endoftext|>`` (id 0, padding), ``<|im_start|>`` (1), ``<|im_end|>`` (2, end of turn
and EOS); ``<tool_call>`` (3) and ``</tool_call>`` (4) are plain added tokens, as in Qwen2.5.
The chat template is ``agentrl/assets/chat_template.jinja`` (ChatML; tool results are ``tool`` turns).

The parts: ``tiny.py`` (the tiny models and tokenizers), ``loading.py`` (``load_policy``,
``resolve_model_path``), ``gguf.py`` (packaged GGUF checkpoints), ``tokenizer.py``, ``chat.py``; the
names below are re-exported here.
"""

from agentrl.models.loading import count_parameters, load_policy, resolve_model_path, torch_dtype
from agentrl.models.tiny import (
    ADDED_TOKENS,
    CHAT_TEMPLATE_PATH,
    IM_END,
    IM_START,
    PAD_TOKEN,
    PRESETS,
    QWEN2_SPLIT_REGEX,
    SPECIAL_TOKENS,
    TINY_FORMAT,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TinyShape,
    build_tiny_model,
    cache_root,
    chat_template,
    ensure_tiny_base,
    tiny_config,
    train_bpe,
    train_tokenizer,
    wrap_tokenizer,
)

__all__ = [
    "ADDED_TOKENS",
    "CHAT_TEMPLATE_PATH",
    "IM_END",
    "IM_START",
    "PAD_TOKEN",
    "PRESETS",
    "QWEN2_SPLIT_REGEX",
    "SPECIAL_TOKENS",
    "TINY_FORMAT",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TinyShape",
    "build_tiny_model",
    "cache_root",
    "chat_template",
    "count_parameters",
    "ensure_tiny_base",
    "load_policy",
    "resolve_model_path",
    "tiny_config",
    "torch_dtype",
    "train_bpe",
    "train_tokenizer",
    "wrap_tokenizer",
]
