#!/usr/bin/env bash
# Every GPU figure docs/results.md asks for, in one call on a machine with
# an NVIDIA GPU, captune's Vulkan build beside PyTorch eager on CUDA, each
# pair run alternately on the same card:
#   - matmul GFLOP/s against PyTorch's FP32 (TF32 off) at square sizes;
#   - training steps (shapes preset; a GPT-2-small-sized ClipCap);
#   - greedy decoding (both networks), and beam search (GPT-2-sized, captune only);
#   - an SCST step (shapes preset; and a trained shapes captioner's);
#   - CLIP ViT-B/32 image embedding (a random CLIP of that shape).
# captune's JSON records carry its dispatches, passes, readbacks and each
# matmul dispatch's workgroups per step. Results go to OUT (default
# gpu-bench/), one JSON file per run, and a log.
#
#     cargo build --release
#     pip install torch transformers safetensors numpy pillow pycocoevalcap
#     scripts/gpu_bench.sh [OUT] [CAPTUNE]     # CAPTUNE: default target/release/captune
#
# Set VK_DRIVER_FILES to NVIDIA's ICD file where Vulkan does not find it
# (e.g. /usr/share/vulkan/icd.d/nvidia_icd.json).
set -u
cd "$(dirname "$0")/.."
out=${1:-gpu-bench}
captune=${2:-target/release/captune}
mkdir -p "$out"
log="$out/log.txt"
: > "$log"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}

run() { # name, command...
    local name=$1
    shift
    echo "== $name: $*" | tee -a "$log"
    if "$@" > "$out/$name.json" 2>> "$log"; then
        echo "   ok" | tee -a "$log"
    else
        echo "   FAILED (exit $?)" | tee -a "$log"
    fi
}

gpt2=(--config scripts/bench/gpt2-small.toml --vocab 50257)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$log" 2>&1
"$captune" --device gpu info >> "$log" 2>&1

run kernels-captune "$captune" --device gpu bench kernels --json
run kernels-torch python3 scripts/bench_torch_matmul.py --compare "$out/kernels-captune.json"

for pair in 1 2; do
    run "train-shapes-captune-$pair" "$captune" --device gpu bench train --preset shapes --objectives mle --json
    run "train-shapes-torch-$pair" python3 scripts/bench_torch_captioner.py --preset shapes --device cuda --json
    run "train-gpt2-captune-$pair" "$captune" --device gpu bench train "${gpt2[@]}" --captions synthetic --objectives mle --json
    run "train-gpt2-torch-$pair" python3 scripts/bench_torch_captioner.py "${gpt2[@]}" --device cuda --json
    run "decode-shapes-captune-$pair" "$captune" --device gpu bench decode --preset shapes --json
    run "decode-shapes-torch-$pair" python3 scripts/bench_torch_decode.py --preset shapes --device cuda --json
    run "decode-gpt2-captune-$pair" "$captune" --device gpu bench decode "${gpt2[@]}" --json
    run "decode-gpt2-torch-$pair" python3 scripts/bench_torch_decode.py "${gpt2[@]}" --device cuda --json
    # Beam search (captune's counts: one read of candidates per step).
    run "decode-gpt2-beam-captune-$pair" "$captune" --device gpu bench decode "${gpt2[@]}" --decode beam:5 --json
    run "scst-shapes-captune-$pair" "$captune" --device gpu bench scst --preset shapes --json
    run "scst-shapes-torch-$pair" python3 scripts/bench_torch_scst.py --preset shapes --device cuda --json
done

# A trained shapes captioner (one epoch), whose SCST samples end where the
# model ends them.
run "train-shapes-epoch" "$captune" --device gpu train --preset shapes --epochs 1 --out "$out/shapes-run"
for pair in 1 2; do
    run "scst-trained-captune-$pair" "$captune" --device gpu bench scst --checkpoint "$out/shapes-run/checkpoint.safetensors" --json
done

clip="$out/clip-b32"
python3 scripts/bench_torch_clip_embed.py --random-clip "$clip" >> "$log" 2>&1
for pair in 1 2; do
    run "embed-clip-captune-$pair" "$captune" --device gpu bench embed --clip "$clip" --images 256 --batch 64 --json
    run "embed-clip-torch-$pair" python3 scripts/bench_torch_clip_embed.py --clip "$clip" --images 256 --batch 64 --device cuda --json
done
rm -rf "$clip"
echo "results in $out/" | tee -a "$log"
