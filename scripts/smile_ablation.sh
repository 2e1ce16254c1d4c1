#!/bin/sh
# The SMILE subsetting ablation (docs/results.md): from one MLE
# checkpoint (by default the demo's), two epochs each of smile,
# smile-random and smile-reverse at the demo's SMILE settings, then every
# metric on the test split, printed as a Markdown table.
#
#   scripts/smile_ablation.sh [MLE_CHECKPOINT] [OUT_DIR]
#
# The shapes world by default; for another data set set DATA (as --data),
# PRESET and RETRIEVER, e.g. DATA=karpathy:PATH PRESET=flickr8k. MLE_WEIGHT
# (default 0.3, the demo's) sets lambda; 0 trains on the subset loss alone.
set -eu
BIN=${CAPTUNE:-target/release/captune}
MLE=${1:-runs/demo/mle/checkpoint.safetensors}
OUT=${2:-runs/ablation}
DATA=${DATA:-shapes}
PRESET=${PRESET:-shapes}
RETRIEVER=${RETRIEVER:-assets/shapes-retriever.safetensors}
MLE_WEIGHT=${MLE_WEIGHT:-0.3}
mkdir -p "$OUT"
# The script owns OUT: a second run replaces what the first wrote there.
"$BIN" embed --data "$DATA" --checkpoint "$RETRIEVER" --out "$OUT/features.safetensors" --overwrite
common="--data $DATA --features $OUT/features.safetensors --retriever $RETRIEVER"
"$BIN" eval --checkpoint "$MLE" $common --split test --json --overwrite --results "$OUT/mle-results.json" > "$OUT/mle.json"
for objective in smile smile-random smile-reverse; do
    "$BIN" train --preset "$PRESET" --objective "$objective" --mle-weight "$MLE_WEIGHT" --lr 5e-4 --epochs 2 \
        --init "$MLE" $common --out "$OUT/$objective" --overwrite
    "$BIN" eval --checkpoint "$OUT/$objective/checkpoint.safetensors" $common --split test --json \
        --overwrite --results "$OUT/$objective-results.json" > "$OUT/$objective.json"
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
keys = ["mean_length", "objects_named", "attributes_per_object", "lexical_diversity", "self_retrieval_r1", "self_retrieval_r5", "clipscore",
        "fact_precision", "fact_recall", "BLEU-4", "CIDEr-D"]
print("| objective | " + " | ".join(keys) + " |")
print("| --- |" + " ---: |" * len(keys))
cell = lambda v: "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)
for name in ["mle", "smile", "smile-random", "smile-reverse"]:
    m = json.load(open(f"{out}/{name}.json"))
    print(f"| {name} | " + " | ".join(cell(m.get(k)) for k in keys) + " |")
PY
