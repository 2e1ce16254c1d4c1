#!/usr/bin/env bash
# Every GPU figure docs/results.md asks for, in one call on a machine with
# an NVIDIA GPU: captune's Vulkan build beside PyTorch eager on CUDA, each
# pair run alternately on the same card:
#   - matmul GFLOP/s against PyTorch's FP32 (TF32 off) at square sizes;
#   - training steps (shapes preset; a GPT-2-small-sized ClipCap, also with
#     the double-buffered 128x128 matmul kernel);
#   - greedy decoding (both networks), and beam search (GPT-2-sized, captune only);
#   - an LSTM captioner's training step and greedy decoding (SLE's decoder);
#   - an SCST step (shapes preset; GPT-2-small-sized; a trained shapes captioner's);
#   - CLIP ViT-B/32 image embedding (a random CLIP of that shape).
# captune's records carry its dispatches, passes, readbacks and each
# matmul dispatch's workgroups per step.
#
#     scripts/gpu_bench.sh --pack       # here: the stripped release binary and
#                                       # the Vulkan loader into .gpu/, then the call
#     scripts/gpu_bench.sh              # there: every figure, into $OUT
#     scripts/gpu_bench.sh --rehearse [--quick]   # here, on lavapipe, small shapes
#     scripts/gpu_bench.sh --tiles      # there: the large-tile kernel families
#                                       # compared, kernel by kernel and end to end
#
# On the GPU machine it unpacks the carried Vulkan loader where none is
# installed, stops within seconds if captune finds no hardware GPU, gives
# every step a time limit inside one budget (CAPTUNE_BENCH_BUDGET seconds,
# default 420: steps that would start past it are recorded as skipped, the
# most wanted first), and leaves four files in $OUT (else gpu-bench/):
# log.txt, adapter.txt (nvidia-smi and captune info), records.json (every
# step's command, status, seconds and record) and summary.txt (each pair's
# ratio), which it prints last.
#
# --rehearse runs the same steps here: captune on lavapipe, PyTorch on the
# CPU, with small networks (the tiny preset, the tiny CLIP of the tests),
# so that the only thing a real GPU can find is speed. --quick keeps one
# workload of each kind and one alternation. CAPTUNE names the binary
# (default .gpu/captune, else target/release/captune).
set -u
cd "$(dirname "$0")/.."

mode=device
quick=0
tiles=0
for arg in "$@"; do
    case $arg in
        --pack) mode=pack ;;
        --rehearse) mode=rehearse ;;
        --quick) quick=1 ;;
        --tiles) tiles=1 ;;
        *) echo "gpu_bench.sh: unknown argument $arg (--pack, --rehearse, --quick, --tiles)" >&2; exit 2 ;;
    esac
done

if [ "$mode" = pack ]; then
    # Carried to the device machine: a stripped release binary and the
    # Vulkan loader and libglvnd as Debian packages (the image has NVIDIA's
    # driver but may lack them). .gpu/ is ignored by git through .git/info/exclude.
    set -e
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    mkdir -p .gpu/debs /tmp/captune-amd64/partial
    cargo build --release --locked
    strip -o .gpu/captune target/release/captune
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/captune-amd64'
    # shellcheck disable=SC2086
    apt-get $o update -qq &&
        (cd .gpu/debs && apt-get $o download -qq libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2)
    du -sh .gpu
    cat <<'EOF'
Then, through the device tool, one call (limit 480 s):
  run(command="scripts/gpu_bench.sh", carry=[".gpu"], timeout_s=480)
EOF
    exit 0
fi

out=${OUT:-gpu-bench}
mkdir -p "$out"
log="$out/log.txt"
: > "$log"
steps=$(mktemp -d)
: > "$steps/steps.tsv"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
export PYTHONUNBUFFERED=1
captune=${CAPTUNE:-.gpu/captune}
[ -x "$captune" ] || captune=target/release/captune
if [ ! -x "$captune" ]; then
    echo "no captune binary: run scripts/gpu_bench.sh --pack here (or set CAPTUNE)" | tee -a "$log"
    exit 2
fi
start=$(date +%s)
budget=${CAPTUNE_BENCH_BUDGET:-420}

# The Vulkan loader and GL vendor-neutral dispatch (NVIDIA's Vulkan driver
# lives in libGLX_nvidia, which needs libglvnd) where the machine lacks them.
if [ "$mode" = device ]; then
    if ! ldconfig -p | grep -q libvulkan.so.1 || ! ldconfig -p | grep -q libGLdispatch.so.0; then
        for f in .gpu/debs/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done
        ldconfig
    fi
    for lib in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
        [ -d $lib ] && export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    done
    nvidia=/usr/local/nvidia/share
    [ -z "${VK_DRIVER_FILES:-}" ] && [ -e $nvidia/vulkan/icd.d/nvidia_icd.json ] &&
        export VK_DRIVER_FILES=$nvidia/vulkan/icd.d/nvidia_icd.json
    [ -z "${__EGL_VENDOR_LIBRARY_FILENAMES:-}" ] && [ -e $nvidia/glvnd/egl_vendor.d/10_nvidia.json ] &&
        export __EGL_VENDOR_LIBRARY_FILENAMES=$nvidia/glvnd/egl_vendor.d/10_nvidia.json
fi

# step NAME LIMIT COMMAND...: runs COMMAND with a time limit inside the
# budget, its output in $steps/NAME.out, its line in steps.tsv.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$(( start + budget - $(date +%s) ))
    if (( left < 10 )); then
        echo "== $name: skipped, the budget of ${budget} s is spent" | tee -a "$log"
        printf '%s\t%s\t%s\t%s\n' "$name" 124 0 "skipped: $*" >> "$steps/steps.tsv"
        return
    fi
    (( limit > left )) && limit=$left
    echo "== $name (limit ${limit} s): $*" | tee -a "$log"
    local t0 rc
    t0=$(date +%s%N)
    timeout -k 5 "$limit" "$@" > "$steps/$name.out" 2>> "$log"
    rc=$?
    printf '%s\t%s\t%se-3\t%s\n' "$name" "$rc" "$(( ($(date +%s%N) - t0) / 1000000 ))" "$*" \
        >> "$steps/steps.tsv"
    echo "   exit $rc" | tee -a "$log"
}

# Sums the steps up into $out and prints the summary.
finish() {
    python3 scripts/gpu_bench_summary.py "$steps" "$out"
    echo "$(( $(date +%s) - start )) s in all; results in $out/" | tee -a "$log"
    rm -rf "$steps"
}

# The adapter, and a preflight that stops in seconds without a GPU.
adapter="$out/adapter.txt"
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    timeout 60 "$captune" --device gpu info 2>&1
    echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-}"
    ldconfig -p | grep -E 'libvulkan|libGLdispatch|libGLX_nvidia|libnvidia-glcore' 2>&1
    ls /usr/local/nvidia/share/vulkan/icd.d /etc/vulkan/icd.d /usr/share/vulkan/icd.d 2>&1
} > "$adapter"
want='device type: +(DiscreteGpu|IntegratedGpu)'
[ "$mode" = rehearse ] && want='device type: +'
if ! grep -Eq "$want" "$adapter"; then
    echo "preflight: captune found no usable GPU adapter (see adapter.txt); nothing measured" | tee -a "$log"
    cat "$adapter" >> "$log"
    exit 3
fi
echo "preflight: $(grep -m1 '^backend:' "$adapter")" | tee -a "$log"

if [ "$mode" = rehearse ]; then
    torch_device=cpu
    sizes=128,256
    elementwise=1048576
    # A shapes world small enough for lavapipe to train an epoch of.
    world=(--shapes-size 32 --shapes-train 48 --shapes-val 16 --shapes-test 16)
    # SCST steps on lavapipe take seconds each: two timed after one.
    scst=(--steps 2 --warmup 1)
    shapes=(--preset tiny)
    gpt2=(--preset tiny --vocab 400)
    # SLE's LSTM at batch 4, two timed steps: seconds each on lavapipe.
    lstm=(--config scripts/bench/lstm-sle.toml)
    lstm_train=(--batch 4 --steps 2 --warmup 1)
    images=16
    clip=tests/data/clip-tiny
    clip_images=16
    clip_batch=8
else
    torch_device=cuda
    sizes=256,512,1024,2048,4096
    elementwise=16777216
    world=()
    scst=()
    shapes=(--preset shapes)
    gpt2=(--config scripts/bench/gpt2-small.toml --vocab 50257)
    lstm=(--config scripts/bench/lstm-sle.toml)
    lstm_train=()
    images=128
    clip=$steps/clip-b32
    clip_images=256
    clip_batch=64
fi
if ! python3 -c 'import torch' 2>/dev/null; then
    echo "python3 cannot import torch: the PyTorch steps fail and their pairs show as failed" | tee -a "$log"
fi

variant_sizes=gpt2-small
[ "$mode" = rehearse ] && variant_sizes=tiny

if (( tiles )); then
    # Every matmul kernel on a GPT-2-small step's products, then GPT-2
    # training and SCST steps with each large-tile family
    # (CAPTUNE_MATMUL_TILES) beside PyTorch, alternately.
    step matmuls-captune 150 "$captune" --device gpu bench matmuls --sizes "$variant_sizes" --json
    for run in 1 2; do
        for family in shared buffered registers; do
            step "train-gpt2@$family-captune-$run" 90 env CAPTUNE_MATMUL_TILES=$family "$captune" \
                --device gpu bench train "${gpt2[@]}" --captions synthetic --objectives mle --json
        done
        step "train-gpt2-torch-$run" 90 python3 scripts/bench_torch_captioner.py "${gpt2[@]}" --device "$torch_device" --json
        for family in shared buffered registers; do
            step "scst-gpt2@$family-captune-$run" 90 env CAPTUNE_MATMUL_TILES=$family "$captune" \
                --device gpu bench scst "${gpt2[@]}" --steps 3 --warmup 1 --json
        done
        step "scst-gpt2-torch-$run" 90 python3 scripts/bench_torch_scst.py "${gpt2[@]}" --device "$torch_device" --json
    done
    finish
    exit 0
fi

step kernels-captune 90 "$captune" --device gpu bench kernels --sizes "$sizes" \
    --elementwise-len "$elementwise" --json
step kernels-torch 90 python3 scripts/bench_torch_matmul.py --device "$torch_device" \
    --sizes "$sizes" --compare "$steps/kernels-captune.out"

if (( quick )); then
    step matmuls-captune 60 "$captune" --device gpu bench matmuls --sizes tiny --json
fi

runs=2
steps_args=()
# --quick: one alternation, a few steps on a small batch.
(( quick )) && runs=1 && steps_args=(--steps 3 --warmup 1 --batch 8)
for run in $(seq "$runs"); do
    # The first alternation also profiles one more step kernel by kernel.
    profile=()
    (( run == 1 )) && profile=(--profile)
    step "train-shapes-captune-$run" 60 "$captune" --device gpu bench train "${shapes[@]}" \
        "${steps_args[@]}" --objectives mle "${profile[@]}" --json
    step "train-shapes-torch-$run" 60 python3 scripts/bench_torch_captioner.py "${shapes[@]}" \
        "${steps_args[@]}" --device "$torch_device" --json
    step "decode-shapes-captune-$run" 45 "$captune" --device gpu bench decode "${shapes[@]}" --images "$images" "${profile[@]}" --json
    step "decode-shapes-torch-$run" 45 python3 scripts/bench_torch_decode.py "${shapes[@]}" --images "$images" --device "$torch_device" --json
    (( quick )) && break
    step "train-gpt2-captune-$run" 90 "$captune" --device gpu bench train "${gpt2[@]}" --captions synthetic --objectives mle "${profile[@]}" --json
    step "train-gpt2-torch-$run" 90 python3 scripts/bench_torch_captioner.py "${gpt2[@]}" --device "$torch_device" --json
    step "decode-gpt2-captune-$run" 60 "$captune" --device gpu bench decode "${gpt2[@]}" --images "$images" "${profile[@]}" --json
    step "decode-gpt2-torch-$run" 60 python3 scripts/bench_torch_decode.py "${gpt2[@]}" --images "$images" --device "$torch_device" --json
    step "scst-shapes-captune-$run" 60 "$captune" --device gpu bench scst "${shapes[@]}" "${scst[@]}" "${profile[@]}" --json
    step "scst-shapes-torch-$run" 60 python3 scripts/bench_torch_scst.py "${shapes[@]}" --device "$torch_device" --json
    step "scst-gpt2-captune-$run" 90 "$captune" --device gpu bench scst "${gpt2[@]}" "${scst[@]}" "${profile[@]}" --json
    step "scst-gpt2-torch-$run" 90 python3 scripts/bench_torch_scst.py "${gpt2[@]}" --device "$torch_device" --json
    if (( run == 1 )); then
        # Every matmul kernel on a GPT-2-small step's products (tiny ones here).
        step matmuls-captune 150 "$captune" --device gpu bench matmuls --sizes "$variant_sizes" --json
    fi
    # The double-buffered 128x128 kernel end to end, beside this run's pair.
    step "train-gpt2@buffered-captune-$run" 90 env CAPTUNE_MATMUL_TILES=buffered "$captune" \
        --device gpu bench train "${gpt2[@]}" --captions synthetic --objectives mle --json
done

if (( ! quick )); then
    # Beam search: captune only (one read of candidates per step).
    step decode-gpt2-beam-captune 60 "$captune" --device gpu bench decode "${gpt2[@]}" --images "$images" --decode beam:5 --json
    # SLE's LSTM captioner: its time loop's dispatches per step.
    for run in 1 2; do
        step "train-lstm-captune-$run" 60 "$captune" --device gpu bench train "${lstm[@]}" "${lstm_train[@]}" \
            --captions synthetic --objectives mle --json
        step "train-lstm-torch-$run" 60 python3 scripts/bench_torch_lstm.py train "${lstm[@]}" "${lstm_train[@]}" \
            --device "$torch_device" --json
        step "decode-lstm-captune-$run" 45 "$captune" --device gpu bench decode "${lstm[@]}" --images "$images" --json
        step "decode-lstm-torch-$run" 45 python3 scripts/bench_torch_lstm.py decode "${lstm[@]}" --images "$images" \
            --device "$torch_device" --json
    done
    if [ "$mode" = device ]; then
        step make-clip 60 python3 scripts/bench_torch_clip_embed.py --random-clip "$clip"
    fi
    for run in 1 2; do
        step "embed-clip-captune-$run" 60 "$captune" --device gpu bench embed --clip "$clip" \
            --images "$clip_images" --batch "$clip_batch" --json
        step "embed-clip-torch-$run" 60 python3 scripts/bench_torch_clip_embed.py --clip "$clip" \
            --images "$clip_images" --batch "$clip_batch" --device "$torch_device" --json
    done
    # A trained shapes captioner (one epoch), whose SCST samples end where
    # the model ends them: last, as the least wanted.
    step train-shapes-epoch 120 "$captune" --device gpu train "${shapes[@]}" "${world[@]}" --epochs 1 \
        --out "$steps/shapes-run"
    step scst-trained-captune 60 "$captune" --device gpu bench scst "${scst[@]}" \
        --checkpoint "$steps/shapes-run/checkpoint.safetensors" --json
fi

finish
