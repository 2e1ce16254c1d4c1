#!/usr/bin/env bash
# The project's test command (the README's second line; .ci/run calls it).
# GPU tests need a Vulkan driver: where none is installed, this installs
# Mesa's software one (lavapipe) with apt-get when run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

has_vulkan_driver() {
    compgen -G "/usr/share/vulkan/icd.d/*.json" >/dev/null ||
        compgen -G "/etc/vulkan/icd.d/*.json" >/dev/null ||
        compgen -G "/usr/local/share/vulkan/icd.d/*.json" >/dev/null
}

if ! has_vulkan_driver; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test.sh: no Vulkan driver found; installing mesa-vulkan-drivers (lavapipe)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
    else
        echo "test.sh: no Vulkan driver found and cannot install one (needs root and apt-get)." >&2
        echo "  Install one (e.g. sudo apt-get install mesa-vulkan-drivers), or run with" >&2
        echo "  CAPTUNE_SKIP_GPU_TESTS=1 to skip the GPU tests." >&2
        [ "${CAPTUNE_SKIP_GPU_TESTS:-0}" = 1 ] || exit 1
    fi
fi

# The desktop app's window test runs the real window on a virtual X server.
if ! command -v Xvfb >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "test.sh: installing xvfb for the desktop app's window test"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq xvfb libxkbcommon-x11-0 \
            libxcursor1 libxrandr2 libxi6 >/dev/null
    else
        echo "test.sh: no Xvfb and cannot install it (needs root and apt-get); install xvfb," >&2
        echo "  or run with CAPTUNE_SKIP_WINDOW_TEST=1 to skip the window test." >&2
        [ "${CAPTUNE_SKIP_WINDOW_TEST:-0}" = 1 ] || exit 1
    fi
fi

# Mesa's window-system code warns on every device open without this.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    export XDG_RUNTIME_DIR
    XDG_RUNTIME_DIR=$(mktemp -d)
fi

# Tests skipped for want of a GPU, Xvfb, the shared data or pycocoevalcap
# write a line to CAPTUNE_SKIP_LOG (tests/common/mod.rs, skip), since
# cargo test shows nothing of a skip inside a passing test; the summary
# after the tests counts them apart from the tests that ran.
CAPTUNE_SKIP_LOG=$(mktemp)
output=$(mktemp)
export CAPTUNE_SKIP_LOG
# cargo test's own status, through the tee.
set +e +o pipefail
cargo test --locked "$@" 2>&1 | tee "$output"
status=${PIPESTATUS[0]}
set -e -o pipefail
skipped=$(sort -u "$CAPTUNE_SKIP_LOG")
[ -z "$skipped" ] || printf '%s\n' "$skipped" | sed 's/^/SKIPPED (whole or in part): /'
skips=$(printf '%s' "$skipped" | cut -d: -f1 | sort -u | grep -c . || true)
# A test that skipped any part counts as skipped, not passed; a test binary
# that crashed before its result line counts as one failure.
awk -v skips="$skips" -v status="$status" '/^test result:/ { passed += $4; failed += $6 }
    END { if (status != 0 && failed == 0) failed = 1
          printf "summary: %d passed, %d failed, %d skipped\n", passed - skips, failed, skips }' "$output"
rm -f "$CAPTUNE_SKIP_LOG" "$output"
exit "$status"
