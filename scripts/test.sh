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

# Mesa's window-system code warns on every device open without this.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    export XDG_RUNTIME_DIR
    XDG_RUNTIME_DIR=$(mktemp -d)
fi

cargo test --locked "$@"
