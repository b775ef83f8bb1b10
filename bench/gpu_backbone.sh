#!/usr/bin/env bash
# Issue 23's backbone measurement on the device: SmolLM2-135M-Instruct with the shipped targets on
# the held-out undo (then long-tools), bench/backbone_envs.py. The device reaches no network and a
# call carries 64 MiB, and the GGUF file is 98 MB: it travels in two halves, .whl/a and .whl/b, one
# per call, two calls in a row (a warm device keeps what a call carried; it is released after ~30 s
# idle, and then .whl/a is gone).
#   here:    bash bench/gpu_backbone.sh prepare            # .whl/a: first half, hash, gguf wheel; .whl/b
#   call 1:  bash bench/gpu_check.sh                       (carry: [".whl/a"]; the session's GPU check)
#   call 2:  bash bench/gpu_backbone.sh run                (carry: [".whl/b"]; at once after call 1)
# Undo (~4M tokens at 1,200 steps) runs first; long-tools is ~12x that and may not fit the lease.
# STEPS (default 1200), ROWS, FRESH (training and fresh rows, default recipe_envs') and ENVS
# (default "undo long-tools") shorten a dry run on CPU; PY is the Python (default python3).
set -euo pipefail
PY=${PY:-python3}
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
case "${1:-}" in
  prepare)
    src=$($PY -c "import sys; sys.path.insert(0, 'examples/smollm2'); import model; print(model.fetch_gguf())")
    rm -rf .whl/a .whl/b && mkdir -p .whl/a .whl/b
    split -n 2 -d "$src" ".whl/$GGUF.part-"
    mv ".whl/$GGUF.part-00" .whl/a/ && mv ".whl/$GGUF.part-01" .whl/b/
    sha256sum "$src" | cut -d' ' -f1 > ".whl/a/$GGUF.sha256"
    $PY -m pip download --no-deps --quiet --disable-pip-version-check -d .whl/a "gguf==0.19.0"
    du -sh .whl/a .whl/b ;;
  run)
    for half in ".whl/a/$GGUF.part-00" ".whl/b/$GGUF.part-01"; do
      if [ ! -f "$half" ]; then
        echo "gpu_backbone: $half is not here: carry [\".whl/a\"] in one call and [\".whl/b\"] in the next," \
             "at once (a released device keeps nothing); 'bash bench/gpu_backbone.sh prepare' writes both" >&2
        exit 2
      fi
    done
    OUT=${OUT:-bench/out}; mkdir -p "$OUT"
    cache=${CRITIC_PRETRAIN_CACHE:-$PWD/bench/out/cache}; mkdir -p "$cache/smollm2-135m"
    cat ".whl/a/$GGUF.part-00" ".whl/b/$GGUF.part-01" > "$cache/smollm2-135m/$GGUF"
    echo "$(cat ".whl/a/$GGUF.sha256")  $cache/smollm2-135m/$GGUF" | sha256sum -c -
    $PY -c "import gguf" 2>/dev/null || $PY -m pip install --no-index --no-deps --quiet .whl/a/gguf-*.whl
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
    model=$(CRITIC_PRETRAIN_CACHE=$cache $PY examples/smollm2/model.py)
    for env in ${ENVS:-undo long-tools}; do
      $PY bench/backbone_envs.py "$model" --envs "$env" --steps "${STEPS:-1200}" ${ROWS:+--rows $ROWS} \
          ${FRESH:+--fresh-rows $FRESH} --work "$PWD/bench/out/work" --json "$OUT/backbone.jsonl" \
          > "$OUT/backbone-$env.log" 2>&1 || echo "gpu_backbone: $env failed, see $OUT/backbone-$env.log" >&2
      grep -E '^\{|WARNING|ERROR|Error|error:' "$OUT/backbone-$env.log" || true
    done ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2 ;;
esac
