#!/usr/bin/env bash
# Issue 23's backbone measurement on the device: SmolLM2-135M-Instruct with the shipped targets on
# the held-out undo (then long-tools), bench/backbone_envs.py. The device reaches no network and a
# call carries 64 MiB, and the GGUF file is 98 MB: it travels in two halves, over two calls in a row
# (the device keeps ignored paths between calls while it is warm; idle release is ~30 s).
#   here:     bash bench/gpu_backbone.sh first      # .whl/: the gguf wheel, the first half, its hash
#   call 1:   bash bench/gpu_check.sh; bash bench/gpu_backbone.sh stash          (carry: [".whl"])
#   here:     bash bench/gpu_backbone.sh second     # .whl/: the second half
#   call 2:   bash bench/gpu_backbone.sh run                                     (carry: [".whl"])
# STEPS (default 1200), ROWS, FRESH (training and fresh rows, default recipe_envs') and ENVS (default
# "undo long-tools") shorten a dry run on CPU; PY is the
# Python (default python3, the device's).
set -euo pipefail
PY=${PY:-python3}
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
PARTS=bench/out/gguf-parts
case "${1:-}" in
  first|second)
    src=$($PY -c "import sys; sys.path.insert(0, 'examples/smollm2'); import model; print(model.fetch_gguf())")
    tmp=$(mktemp -d) && split -n 2 -d "$src" "$tmp/$GGUF.part-"
    rm -rf .whl && mkdir -p .whl
    if [ "$1" = first ]; then
      cp "$tmp/$GGUF.part-00" .whl/ && sha256sum "$src" | cut -d' ' -f1 > .whl/$GGUF.sha256
      $PY -m pip download --no-deps --quiet --disable-pip-version-check -d .whl "gguf==0.19.0"
    else
      cp "$tmp/$GGUF.part-01" .whl/
    fi
    rm -rf "$tmp"; du -sh .whl ;;
  stash)  # on the device, after call 1: keep the first half where the next carry does not replace it
    mkdir -p "$PARTS" && cp .whl/* "$PARTS"/ && ls -la "$PARTS" ;;
  run)
    OUT=${OUT:-bench/out}; mkdir -p "$OUT"
    cache=${CRITIC_PRETRAIN_CACHE:-$PWD/bench/out/cache}; mkdir -p "$cache/smollm2-135m"
    cat "$PARTS/$GGUF.part-00" .whl/$GGUF.part-01 > "$cache/smollm2-135m/$GGUF"
    echo "$(cat "$PARTS/$GGUF.sha256")  $cache/smollm2-135m/$GGUF" | sha256sum -c -
    $PY -c "import gguf" 2>/dev/null || $PY -m pip install --no-index --no-deps --quiet "$PARTS"/gguf-*.whl
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
    model=$(CRITIC_PRETRAIN_CACHE=$cache $PY examples/smollm2/model.py)
    for env in ${ENVS:-undo long-tools}; do  # undo first: ~1,200 x 3,300 tokens; long-tools ~12x that
      $PY bench/backbone_envs.py "$model" --envs "$env" --steps "${STEPS:-1200}" ${ROWS:+--rows $ROWS} ${FRESH:+--fresh-rows $FRESH} --work "$PWD/bench/out/work" \
          --json "$OUT/backbone.jsonl" 2>&1 | grep -E '^\{|error|Error' | tee -a "$OUT/backbone.log"
    done ;;
  *) sed -n 2,10p "$0"; exit 2 ;;
esac
