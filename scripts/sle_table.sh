#!/bin/sh
# The sequence-level table (docs/results.md, after Chen and Jin's (CVPR 2020) Table
# 4): from one MLE checkpoint (by default the demo's), the same number of
# epochs each of SCST (greedy baseline), SCST (mean-of-others baseline),
# SLL-ME and SLE, then every objective on the test split twice: greedy
# captions, and 5 samples per image (temperature 1). Prints two Markdown
# tables.
#
#   scripts/sle_table.sh [MLE_CHECKPOINT] [OUT_DIR]
#
# The shapes world by default; for another data set set DATA (as --data),
# PRESET and RETRIEVER, e.g. DATA=karpathy:PATH PRESET=flickr8k. EPOCHS
# (default 2) and LR (default 5e-5) set the sequence-level runs.
set -eu
BIN=${CAPTUNE:-target/release/captune}
MLE=${1:-runs/demo/mle/checkpoint.safetensors}
OUT=${2:-runs/sle-table}
DATA=${DATA:-shapes}
PRESET=${PRESET:-shapes}
RETRIEVER=${RETRIEVER:-assets/shapes-retriever.safetensors}
EPOCHS=${EPOCHS:-2}
LR=${LR:-5e-5}
mkdir -p "$OUT"
# The script owns OUT: a second run replaces what the first wrote there.
"$BIN" embed --data "$DATA" --checkpoint "$RETRIEVER" --out "$OUT/features.safetensors" --overwrite
common="--data $DATA --features $OUT/features.safetensors --retriever $RETRIEVER"
evaluate() { # checkpoint name
    "$BIN" eval --checkpoint "$1" $common --split test --json --overwrite \
        --results "$OUT/$2-greedy-results.json" > "$OUT/$2-greedy.json"
    "$BIN" eval --checkpoint "$1" $common --split test --json --overwrite --decode sample:5 \
        --results "$OUT/$2-sampled-results.json" > "$OUT/$2-sampled.json"
}
evaluate "$MLE" mle
for run in scst-greedy:scst:--baseline=greedy scst-mean:scst:--baseline=mean sll-me:sll-me: sle:sle:; do
    name=${run%%:*}
    rest=${run#*:}
    objective=${rest%%:*}
    extra=${rest#*:}
    "$BIN" train --preset "$PRESET" --objective "$objective" $extra --lr "$LR" --epochs "$EPOCHS" \
        --init "$MLE" $common --out "$OUT/$name" --overwrite
    evaluate "$OUT/$name/checkpoint.safetensors" "$name"
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
keys = ["CIDEr-D", "BLEU-4", "ROUGE-L", "METEOR", "div1", "div2", "mbleu4", "vocabulary_usage", "mean_length",
        "self_retrieval_r1", "fact_precision", "fact_recall"]
cell = lambda v: "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)
for decoding in ["greedy", "sampled"]:
    print(f"\n{decoding} ({'1 caption' if decoding == 'greedy' else '5 samples'} per image)\n")
    print("| objective | " + " | ".join(keys) + " |")
    print("| --- |" + " ---: |" * len(keys))
    for name in ["mle", "scst-greedy", "scst-mean", "sll-me", "sle"]:
        m = json.load(open(f"{out}/{name}-{decoding}.json"))
        print(f"| {name} | " + " | ".join(cell(m.get(k)) for k in keys) + " |")
PY
