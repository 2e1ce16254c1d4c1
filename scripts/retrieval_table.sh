#!/bin/sh
# The retriever-in-the-loop table (docs/results.md, after the DiscriTune
# paper's tables): from one MLE checkpoint (by default the demo's), the
# same number of epochs of DiscriTune with in-batch distractors and with
# hard negatives, then every model's greedy captions of the test split,
# in domain and (on the shapes world) on the shifted world. Prints
# Markdown tables.
#
#   scripts/retrieval_table.sh [MLE_CHECKPOINT] [OUT_DIR]
#
# The shapes world by default; for another data set set DATA (as --data),
# PRESET and RETRIEVER, e.g. DATA=karpathy:PATH PRESET=flickr8k (no
# shifted world there). EPOCHS (default 2), LR (default 2e-5) and HARD
# (hard negatives, default 5) set the DiscriTune runs.
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
evaluate "$MLE" mle
for run in discritune:0 discritune-hard:$HARD; do
    name=${run%%:*}
    hard=${run#*:}
    "$BIN" train --preset "$PRESET" --objective discritune --hard-negatives "$hard" \
        --lr "$LR" --epochs "$EPOCHS" --init "$MLE" $common --out "$OUT/$name" --overwrite
    evaluate "$OUT/$name/checkpoint.safetensors" "$name"
done
python3 - "$OUT" "$domains" <<'PY'
import json, sys
out, domains = sys.argv[1], sys.argv[2].split()
keys = ["p1_among_100", "self_retrieval_r1", "self_retrieval_r5", "clipscore", "refcompare",
        "CIDEr-D", "BLEU-4", "mean_length", "fact_precision", "fact_recall"]
cell = lambda v: "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)
for domain in domains:
    print(f"\n{domain} (test split, greedy)\n")
    print("| model | " + " | ".join(keys) + " |")
    print("| --- |" + " ---: |" * len(keys))
    for name in ["mle", "discritune", "discritune-hard"]:
        m = json.load(open(f"{out}/{name}-{domain}.json"))
        print(f"| {name} | " + " | ".join(cell(m.get(k)) for k in keys) + " |")
PY
