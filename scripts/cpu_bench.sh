#!/usr/bin/env bash
# The CPU backend beside PyTorch (CPU, as many threads as captune) on the
# identical model, each workload as alternating pairs
# (scripts/bench_pairs.py): the `shapes` training step, the SCST step,
# greedy decoding and the CLIP ViT-B/32 image tower. Prints one Markdown
# row per workload (median ratio and range) for docs/results.md.
#
#   scripts/cpu_bench.sh [--pairs 3] [--captune target/release/captune] [--rows train,scst,decode,embed]
#
# Needs torch and transformers (pip install torch transformers) and a
# release build. With --baseline BIN instead of PyTorch, the same rows
# compare two captune binaries (a change's after and before).
set -euo pipefail
cd "$(dirname "$0")/.."

pairs=3
captune=target/release/captune
rows=train,scst,decode,embed
baseline=
while [ $# -gt 0 ]; do
    case "$1" in
        --pairs) pairs=$2; shift 2 ;;
        --captune) captune=$2; shift 2 ;;
        --rows) rows=$2; shift 2 ;;
        --baseline) baseline=$2; shift 2 ;;
        *) echo "cpu_bench.sh: unknown argument $1 (see the script's first lines)" >&2; exit 2 ;;
    esac
done
[ -x "$captune" ] || { echo "no $captune: run cargo build --release first" >&2; exit 1; }

threads=$(nproc)
export OMP_NUM_THREADS=$threads RAYON_NUM_THREADS=$threads
clip=$(mktemp -d)
trap 'rm -rf "$clip"' EXIT

# row LABEL KEY CAPTUNE_ARGS PYTORCH_COMMAND
row() {
    local label=$1 key=$2 ours="$captune --device cpu $3" theirs=$4
    if [ -n "$baseline" ]; then
        theirs="$baseline --device cpu $3"
    fi
    python3 scripts/bench_pairs.py --pairs "$pairs" --key "$key" --label "$label" \
        --captune "$ours" --pytorch "$theirs" | tail -1
}

echo "| workload | pairs | captune | $([ -n "$baseline" ] && echo baseline || echo PyTorch) | ratio, median (range) | peak memory ratio |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for r in ${rows//,/ }; do
    case "$r" in
        train)
            row "shapes training step (tokens/s)" tokens_per_s \
                "bench train --preset shapes --objectives mle --captions synthetic --steps 30 --json" \
                "python3 scripts/bench_torch_captioner.py --preset shapes --steps 30 --json" ;;
        scst)
            row "SCST step, 64 images x 5 samples (steps/s)" steps_per_s \
                "bench scst --preset shapes --steps 10 --json" \
                "python3 scripts/bench_torch_scst.py --preset shapes --steps 10 --json" ;;
        decode)
            row "greedy decoding, batches of 64 (captions/s)" captions_per_s \
                "bench decode --images 500 --json" \
                "python3 scripts/bench_torch_decode.py --images 500 --json" ;;
        embed)
            [ -f "$clip/config.json" ] || python3 scripts/bench_torch_clip_embed.py --random-clip "$clip" >/dev/null 2>&1
            row "CLIP ViT-B/32 image embedding (images/s)" images_per_s \
                "bench embed --clip $clip --images 64 --batch 32 --json" \
                "python3 scripts/bench_torch_clip_embed.py --clip $clip --images 64 --batch 32 --json" ;;
        *) echo "cpu_bench.sh: unknown row $r (train, scst, decode, embed)" >&2; exit 2 ;;
    esac
done
