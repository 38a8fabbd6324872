#!/usr/bin/env bash
# Prepares what scripts/gpu-check.sh needs on a GPU machine that has no network: the Debian
# packages of the header-only and static dependencies (CLI11, nlohmann-json, rapidcheck),
# downloaded here into .carry/debs (ignored by git). Pass `.carry` in the device tool's carry
# list; gpu-check.sh unpacks them into a private prefix there.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >>.git/info/exclude
mkdir -p .carry/debs
cd .carry/debs
apt-get download libcli11-dev nlohmann-json3-dev librapidcheck-dev libxxhash-dev
ls -1 "$PWD"
