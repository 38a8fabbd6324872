#!/usr/bin/env bash
# Prepares what scripts/gpu-check.sh needs on a GPU machine that has no network: the Debian
# packages of the dependencies it lacks (CLI11, nlohmann-json, rapidcheck, xxhash; PCRE2,
# utf8proc, OpenBLAS and cpp-httplib (with the OpenSSL, zlib and Brotli headers its header
# reads) with their run-time libraries, which gpu-check.sh puts on the
# library path),
# downloaded here into .carry/debs (ignored by git). Pass `.carry` in the device tool's carry
# list; gpu-check.sh unpacks them into a private prefix there.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >>.git/info/exclude
mkdir -p .carry/debs
cd .carry/debs
apt-get download libcli11-dev nlohmann-json3-dev librapidcheck-dev libxxhash-dev \
  libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2 libopenblas-dev libopenblas-pthread-dev \
  libopenblas0-pthread libopenblas0 libgfortran5 libcpp-httplib-dev libcpp-httplib0.11 \
  libssl-dev zlib1g-dev libbrotli-dev libbrotli1
ls -1 "$PWD"
