#!/bin/sh
# The retriever-in-the-loop table (docs/results.md, after the DiscriTune
# and CLIP-relevance papers' tables). From one MLE checkpoint (by default
# the demo's): the same number of epochs of DiscriTune with in-batch
# distractors, with hard negatives, and of CLIP relevance on every
# image; then the labelled-fraction setting: MLE on a fraction of the
# captions from scratch, and CLIP relevance on the rest from it. Every
# model's greedy captions of the test split are evaluated, in domain and
# (on the shapes world) on the shifted world. Prints Markdown tables.
#
#   scripts/retrieval_table.sh [MLE_CHECKPOINT] [OUT_DIR]
#
# The shapes world by default; for another data set set DATA (as --data),
# PRESET and RETRIEVER, e.g. DATA=karpathy:PATH PRESET=flickr8k (no
# shifted world there). EPOCHS (default 2), LR (default 2e-5) and HARD
# (hard negatives, default 5) set the DiscriTune runs; REL_LR (default
# 2e-4), TAU (default 1) and MIX (relevance's --mle-weight, default 0.2)
# the relevance runs; FRACTION (default 0.02) the labelled fraction,
# FEW_EPOCHS (default 60) and FEW_LR (default 2e-3) its MLE stage.
# STAGES (default "discritune relevance few") picks the runs to make;
# the tables list every model evaluated in OUT_DIR, by this call or an
# earlier one.
set -eu
BIN=${CAPTUNE:-target/release/captune}
MLE=${1:-runs/demo/mle/checkpoint.safetensors}
OUT=${2:-runs/retrieval-table}
DATA=${DATA:-shapes}
PRESET=${PRESET:-shapes}
RETRIEVER=${RETRIEVER:-assets/shapes-retriever.safetensors}
EPOCHS=${EPOCHS:-2}
LR=${LR:-2e-5}
HARD=${HARD:-5}
REL_LR=${REL_LR:-2e-4}
TAU=${TAU:-1}
MIX=${MIX:-0.2}
FRACTION=${FRACTION:-0.02}
FEW_EPOCHS=${FEW_EPOCHS:-60}
FEW_LR=${FEW_LR:-2e-3}
STAGES=${STAGES:-discritune relevance few}
mkdir -p "$OUT"
# The script owns OUT: a second run replaces what the first wrote there.
domains="in-domain"
"$BIN" embed --data "$DATA" --checkpoint "$RETRIEVER" --out "$OUT/features.safetensors" --overwrite
if [ "$DATA" = shapes ]; then
    domains="in-domain shifted"
    "$BIN" embed --data shapes --shapes-domain shifted --checkpoint "$RETRIEVER" \
        --out "$OUT/features-shifted.safetensors" --overwrite
fi
common="--data $DATA --features $OUT/features.safetensors --retriever $RETRIEVER"
evaluate() { # checkpoint name
    "$BIN" eval --checkpoint "$1" $common --split test --json --overwrite \
        --results "$OUT/$2-in-domain-results.json" > "$OUT/$2-in-domain.json"
    if [ "$DATA" = shapes ]; then
        "$BIN" eval --checkpoint "$1" --data shapes --shapes-domain shifted \
            --features "$OUT/features-shifted.safetensors" --retriever "$RETRIEVER" \
            --split test --json --overwrite \
            --results "$OUT/$2-shifted-results.json" > "$OUT/$2-shifted.json"
    fi
}
train() { # name, then train's flags
    name=$1
    shift
    "$BIN" train --preset "$PRESET" $common --out "$OUT/$name" --overwrite "$@"
    evaluate "$OUT/$name/checkpoint.safetensors" "$name"
}
evaluate "$MLE" mle
for stage in $STAGES; do
    case $stage in
    discritune)
        train discritune --init "$MLE" --objective discritune --hard-negatives 0 \
            --lr "$LR" --epochs "$EPOCHS"
        train discritune-hard --init "$MLE" --objective discritune --hard-negatives "$HARD" \
            --lr "$LR" --epochs "$EPOCHS"
        ;;
    relevance)
        train clip-relevance --init "$MLE" --objective clip-relevance --tau "$TAU" \
            --mle-weight "$MIX" --lr "$REL_LR" --epochs "$EPOCHS"
        ;;
    few)
        train mle-few --objective mle --labelled "$FRACTION" --lr "$FEW_LR" \
            --epochs "$FEW_EPOCHS"
        train clip-relevance-few --init "$OUT/mle-few/checkpoint.safetensors" \
            --objective clip-relevance --labelled "$FRACTION" --tau "$TAU" \
            --mle-weight "$MIX" --lr "$REL_LR" --epochs "$EPOCHS"
        ;;
    *)
        echo "retrieval_table.sh: unknown stage $stage" >&2
        exit 2
        ;;
    esac
done
python3 - "$OUT" "$domains" "$FRACTION" <<'PY'
import json, os, sys
out, domains, fraction = sys.argv[1], sys.argv[2].split(), sys.argv[3]
keys = ["p1_among_100", "self_retrieval_r1", "self_retrieval_r5", "clipscore", "refcompare",
        "CIDEr-D", "BLEU-4", "mean_length", "fact_precision", "fact_recall"]
names = {"mle": "MLE (all captions)", "discritune": "DiscriTune, in-batch",
         "discritune-hard": "DiscriTune, + hard negatives",
         "clip-relevance": "CLIP relevance (all captions)",
         "mle-few": f"MLE on {fraction} of the captions",
         "clip-relevance-few": f"{fraction} + CLIP relevance on the rest"}
cell = lambda v: "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)
for domain in domains:
    print(f"\n{domain} (test split, greedy)\n")
    print("| model | " + " | ".join(keys) + " |")
    print("| --- |" + " ---: |" * len(keys))
    for name, label in names.items():
        path = f"{out}/{name}-{domain}.json"
        if os.path.exists(path):
            m = json.load(open(path))
            print(f"| {label} | " + " | ".join(cell(m.get(k)) for k in keys) + " |")
PY
