#!/usr/bin/env bash
# Screenshots of every panel of `captune app` following a run folder, for
# docs/app.md, on a virtual X server.
#   scripts/app_screenshots.sh NAME RUN_DIR [data and feature options of the run]
# writes docs/app/NAME-<panel>.png. Needs Xvfb and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1 run=$2
shift 2
mkdir -p docs/app
# A display number no server holds (a killed Xvfb leaves its lock file behind).
number=$((70 + $$ % 20))
while [ -e "/tmp/.X$number-lock" ]; do number=$((number + 1)); done
display=":$number"
Xvfb "$display" -screen 0 1400x900x24 -nolisten tcp >/dev/null 2>&1 &
server=$!
trap 'kill $server' EXIT
sleep 1
for tab in losses per-token samples metrics inspector; do
    DISPLAY=$display target/release/captune --device cpu app --follow "$run" "$@" \
        --tab "$tab" --frames 40 --size 1280x800 --overwrite --screenshot "docs/app/$name-$tab.png"
    echo "docs/app/$name-$tab.png"
done
