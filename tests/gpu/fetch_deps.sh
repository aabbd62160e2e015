#!/usr/bin/env bash
# Run on the development machine (not the GPU machine) before tests/gpu/check.sh:
# downloads the .deb files of libdist's non-CUDA build dependencies into build-gpudeps/ (ignored
# by git through /build*/) so that the device call can carry them (`carry: ["build-gpudeps"]`);
# check.sh unpacks them under /tmp/gpudeps when the GPU machine lacks a dependency. Nothing is
# installed here.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build-gpudeps
cd build-gpudeps
pkgs=(libdnnl2 libdnnl-dev ocl-icd-libopencl1 libcjson1 libcjson-dev libturbojpeg0 libturbojpeg0-dev
      check libsubunit0 libsubunit-dev libcurl4-openssl-dev zlib1g-dev pkgconf pkgconf-bin libpkgconf3)
apt-get download "${pkgs[@]}"
du -sh .
