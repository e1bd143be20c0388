#!/usr/bin/env bash
# Builds a libfabric with CUDA support (FI_HMEM_CUDA, loaded at run time: no CUDA library linked) into
# PREFIX, for the ofi backend's GPU-heap path on machines whose libfabric lacks it (distribution
# packages are built without CUDA). What was measured with it: docs/transport.md, "GPU memory".
#   scripts/libfabric-cuda.sh SRC NVML_INCLUDE PREFIX
# SRC: a libfabric source tree (a release tarball, or `git archive v2.6.0` of ofiwg/libfabric: the
# version this was tested with); NVML_INCLUDE: a directory holding nvml.h (libfabric's CUDA code
# includes it; the CUDA toolkit or NVIDIA's go-nvml repository has it; no NVML code is linked);
# PREFIX: where it goes (.deps/libfabric-cuda is what scripts/gpu/30-transport.sh uses).
# Needs autoconf, automake, libtool, pkg-config, patchelf, and CUDA at $CUDA_HOME (/usr/local/cuda).
# Use it with LD_LIBRARY_PATH=PREFIX/lib (weft links libfabric with a RUNPATH, which that overrides).
set -euo pipefail
src=${1:?usage: libfabric-cuda.sh SRC NVML_INCLUDE PREFIX}
nvml=${2:?usage: libfabric-cuda.sh SRC NVML_INCLUDE PREFIX}
prefix=${3:?usage: libfabric-cuda.sh SRC NVML_INCLUDE PREFIX}
cuda=${CUDA_HOME:-/usr/local/cuda}
[ -f "$nvml/nvml.h" ] || { echo "libfabric-cuda.sh: no nvml.h in $nvml" >&2; exit 2; }
[ -f "$cuda/include/cuda_runtime.h" ] || { echo "libfabric-cuda.sh: no CUDA at $cuda (CUDA_HOME)" >&2; exit 2; }
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
cd "$src"
[ -x configure ] || ./autogen.sh
# Only the providers that run without a NIC (tcp, rxm; shm and sm2 take CUDA memory on one host).
./configure --prefix="$prefix" --disable-static --enable-only \
  --enable-tcp=yes --enable-rxm=yes --enable-shm=yes --enable-sm2=yes \
  --with-cuda="$cuda" --enable-cuda-dlopen \
  --with-gdrcopy=no --with-ze=no --with-rocr=no --with-neuron=no --with-synapseai=no \
  --with-lttng=no --with-uring=no --enable-xpmem=no CPPFLAGS="-I$nvml"
make -j"$(nproc)"
make install
# libfabric dlopens "libcudart.so" (unversioned; weft links the runtime statically): a copy beside it,
# found through its own RUNPATH, so the prefix works where no CUDA toolkit is installed.
cp -L "$(ls "$cuda"/lib64/libcudart.so.* | sort -V | tail -1)" "$prefix/lib/libcudart.so"
patchelf --set-rpath '$ORIGIN' "$(readlink -f "$prefix/lib/libfabric.so.1")"
rm -rf "$prefix/lib/libfabric.la" "$prefix/share"
sed -i 's|^prefix=.*|prefix=${pcfiledir}/../..|' "$prefix/lib/pkgconfig/libfabric.pc"  # relocatable
echo "libfabric-cuda.sh: $prefix ($(du -sh "$prefix" | cut -f1)); use LD_LIBRARY_PATH=$prefix/lib"
