#!/usr/bin/env bash
# The project's test command (the README's second line; .ci/run calls it).
#
# On Linux, GPU tests need a Vulkan driver, the desktop app's window test
# needs Xvfb, and the report's browser test needs chromium. Where one is
# missing this installs it with apt-get: directly as root, through sudo
# otherwise. Where a user without root cannot, it prints the apt-get line
# to run and goes on; the tests that need it are then skipped, and counted
# as skipped in the summary. As root (CI) a failed install stops the run:
# a green result must not hide a whole family of skipped tests. On macOS
# the GPU tests run on Metal and the window test, which drives Xvfb, is
# skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

# Runs a command as root: directly, or through sudo where sudo can ask
# (a terminal) or needs no password.
as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null && { [ -t 0 ] || sudo -n true 2>/dev/null; }; then
        sudo "$@"
    else
        return 1
    fi
}

apt_updated=0
# Installs Debian packages; fails where there is no apt-get or no way to root.
apt_install() {
    command -v apt-get >/dev/null || return 1
    if [ "$apt_updated" = 0 ]; then
        as_root apt-get update -qq || return 1
        apt_updated=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Installs what `what` needs, or says how and sets the skip variable (if
# any: a test that finds no browser skips by itself).
# Usage: need WHAT SKIP_VARIABLE|"" PACKAGE...
need() {
    local what=$1 skip_variable=$2
    shift 2
    echo "test.sh: installing $* for the $what"
    if ! apt_install "$@"; then
        if [ "$(id -u)" = 0 ]; then
            echo "test.sh: apt-get install $* failed as root; fix apt, or install them first." >&2
            exit 1
        fi
        echo "test.sh: could not install them (needs apt-get, and sudo). To run the" >&2
        echo "  $what, run:  sudo apt-get install $*" >&2
        echo "  Going on: those tests are skipped." >&2
        [ -z "$skip_variable" ] || export "$skip_variable=1"
    fi
}

has_vulkan_driver() {
    compgen -G "/usr/share/vulkan/icd.d/*.json" >/dev/null ||
        compgen -G "/etc/vulkan/icd.d/*.json" >/dev/null ||
        compgen -G "/usr/local/share/vulkan/icd.d/*.json" >/dev/null
}

has_browser() {
    command -v chromium >/dev/null || command -v chromium-browser >/dev/null ||
        command -v google-chrome >/dev/null
}

if [ "$(uname -s)" = Darwin ]; then
    export CAPTUNE_SKIP_WINDOW_TEST=1
else
    has_vulkan_driver ||
        need "GPU tests on Mesa's software Vulkan driver (lavapipe)" CAPTUNE_SKIP_GPU_TESTS \
            mesa-vulkan-drivers libvulkan1
    command -v Xvfb >/dev/null ||
        need "desktop app's window test on a virtual X server" CAPTUNE_SKIP_WINDOW_TEST \
            xvfb libxkbcommon-x11-0 libxcursor1 libxrandr2 libxi6
    has_browser || need "report's test in a headless browser" "" chromium
    # Mesa's window-system code warns on every device open without this.
    if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
        export XDG_RUNTIME_DIR
        XDG_RUNTIME_DIR=$(mktemp -d)
    fi
fi

# Tests skipped for want of a GPU, Xvfb, a browser, Flickr8k or
# pycocoevalcap write a line to CAPTUNE_SKIP_LOG (tests/suite/common/mod.rs,
# skip), since cargo test shows nothing of a skip inside a passing test;
# the summary after the tests counts them apart from the tests that ran.
CAPTUNE_SKIP_LOG=$(mktemp)
# The commands the tests run leave METEOR out unless a test asks for it
# (tests/suite/evaluation/meteor.rs): found where pycocoevalcap is
# installed, it would read its 60 MB paraphrase table in every run's
# validation and every eval.
export CAPTUNE_METEOR=none
output=$(mktemp)
times=$(mktemp)
export CAPTUNE_SKIP_LOG
status=0
crashes=0

# Runs `cargo test --locked --no-fail-fast ARGS...`, its output through the
# tee, and records its wall time under LABEL. A run that fails without a
# failed test's result line (a crash, a build error) counts as one failure.
step() {
    local label=$1 start code
    shift
    start=$(date +%s)
    set +e +o pipefail
    cargo test --locked --no-fail-fast "$@" 2>&1 | tee "$output.step"
    code=${PIPESTATUS[0]}
    set -e -o pipefail
    cat "$output.step" >>"$output"
    if [ "$code" != 0 ]; then
        status=$code
        grep -Eq '^test result: .* [1-9][0-9]* failed' "$output.step" || crashes=$((crashes + 1))
    fi
    printf '%-14s %5d s\n' "$label" $(($(date +%s) - start)) >>"$times"
}

# Prints the skips, each step's time and the summary, and exits.
finish() {
    local skipped skips
    skipped=$(sort -u "$CAPTUNE_SKIP_LOG")
    [ -z "$skipped" ] || printf '%s\n' "$skipped" | sed 's/^/SKIPPED (whole or in part): /'
    # A test's name holds "::" but never ": ", which ends it in a skip line.
    skips=$(printf '%s' "$skipped" | awk -F': ' '{ print $1 }' | sort -u | grep -c . || true)
    echo "wall time:"
    sed 's/^/  /' "$times"
    # A test that skipped any part counts as skipped, not passed.
    awk -v skips="$skips" -v crashes="$crashes" '/^test result:/ { passed += $4; failed += $6 }
        END { printf "summary: %d passed, %d failed, %d skipped\n", passed - skips, failed + crashes, skips }' "$output"
    rm -f "$CAPTUNE_SKIP_LOG" "$output" "$output.step" "$times"
    exit "$status"
}

if [ $# -gt 0 ]; then
    # Arguments go on to one plain cargo test.
    step "cargo test" "$@"
    finish
fi

# The build, then each area of the integration tests (the modules of
# tests/suite/main.rs) on its own, so that its wall time shows. An area's
# filter is "AREA::", which no module inside another area's path holds.
step build --no-run
[ "$status" = 0 ] || finish
step unit --lib --bins
others=()
for dir in tests/suite/*/; do
    area=$(basename "$dir")
    [ "$area" = common ] && continue
    others+=(--skip "$area::")
    step "$area" --test suite -- "$area::"
done
# Whatever a module outside the areas holds (nothing, unless one is added).
step "outside areas" --test suite -- "${others[@]}"
step fuzz --test fuzz_loaders
step doc --doc
finish
