#!/usr/bin/env bash
# One command for a GPU build of localllm: scripts/gpu-build.sh vulkan|cuda|rocm|metal VENV
#
# Creates (or updates) the virtual environment VENV with localllm from this checkout, builds
# llama-cpp-python for the chosen GPU backend into it (with ggml's RPC backend too, so RPC
# workers work beside a local GPU), and checks the result with `localllm doctor`.
#
# Each flavour's wheel is built from the source distribution into a cache of its own, keyed by
# the llama-cpp-python version, the CMake flags and the patches applied, and installed from
# there with --no-deps: pip's own cache keys a wheel built from a source distribution by the
# source alone, not by CMAKE_ARGS, so a CPU wheel could otherwise come back as a "GPU" one (or
# the other way round). Later runs with the same flags install in seconds.
#
# Environment:
#   LOCALLLM_GPU_CACHE   where built wheels are kept (default ~/.cache/localllm/gpu-wheels)
#   LOCALLLM_GPU_EXTRAS  localllm's extras to install (default "starter"; CI uses "test")
#   LOCALLLM_GPU_CMAKE   more CMake flags for llama.cpp (e.g. -DCMAKE_CUDA_ARCHITECTURES=90)
#   LOCALLLM_GPU_NO_APT  set to 1 to never run apt-get (it is run only as root, for Vulkan)
#   LOCALLLM_GPU_NO_DOCTOR  set to 1 to skip the final `localllm doctor`
#
# Patches: scripts/patches/vulkan-old-headers.patch lets ggml's Vulkan backend build against
# Vulkan headers older than VK_EXT_layer_settings (Debian 12's 1.3.239). It is applied to the
# unpacked source when the installed headers lack that extension, and the build stops with the
# reason when it no longer applies. tests/devices/test_gpu_build.py checks that it applies.
set -euo pipefail

usage() {
  echo "usage: $0 vulkan|cuda|rocm|metal VENV" >&2
  exit 2
}
[ $# -eq 2 ] || usage
flavour="$1"
venv="$2"
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cache_root="${LOCALLLM_GPU_CACHE:-$HOME/.cache/localllm/gpu-wheels}"
extras="${LOCALLLM_GPU_EXTRAS:-starter}"
python="${PYTHON:-python3}"

say() { printf 'gpu-build: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

vulkan_headers_lack_layer_settings() {
  local header
  for header in /usr/include/vulkan/vulkan_core.h "${VULKAN_SDK:-/nonexistent}/include/vulkan/vulkan_core.h"; do
    if [ -f "$header" ]; then
      ! grep -q 'VK_EXT_layer_settings' "$header"
      return
    fi
  done
  return 1
}

apt_install() {
  # Debian and Ubuntu only, as root only: anything else is said, not attempted.
  if [ "${LOCALLLM_GPU_NO_APT:-0}" = 1 ] || ! command -v apt-get >/dev/null; then
    say "install these system packages yourself: $*"
    return 0
  fi
  if [ "$(id -u)" != 0 ]; then
    say "not root: run 'sudo apt-get install -y $*' first if the build fails"
    return 0
  fi
  local missing=()
  local package
  for package in "$@"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

patches=()
case "$flavour" in
  vulkan)
    cmake_flags="-DGGML_VULKAN=on"
    apt_install mesa-vulkan-drivers glslc libvulkan-dev spirv-headers
    command -v glslc >/dev/null || die "glslc (the GLSL compiler) is missing: install the glslc package or the Vulkan SDK"
    if vulkan_headers_lack_layer_settings; then
      patches+=("$here/patches/vulkan-old-headers.patch")
    fi
    ;;
  cuda)
    cmake_flags="-DGGML_CUDA=on"
    command -v nvcc >/dev/null || die "nvcc is missing: install the CUDA toolkit (https://developer.nvidia.com/cuda-downloads) and put its bin/ on PATH"
    ;;
  rocm)
    cmake_flags="-DGGML_HIP=on"
    command -v hipconfig >/dev/null || die "hipconfig is missing: install ROCm (https://rocm.docs.amd.com) and put its bin/ on PATH"
    # ROCm's clang builds the HIP code; llama.cpp's docs set the compilers this way.
    export HIPCXX="${HIPCXX:-$(hipconfig -l)/clang}"
    export HIP_PATH="${HIP_PATH:-$(hipconfig -R)}"
    ;;
  metal)
    cmake_flags="-DGGML_METAL=on"
    [ "$(uname -s)" = Darwin ] || die "Metal builds only on macOS"
    ;;
  *)
    usage
    ;;
esac
cmake_flags="$cmake_flags -DGGML_RPC=on ${LOCALLLM_GPU_CMAKE:-}"

if [ ! -x "$venv/bin/python" ]; then
  say "creating the virtual environment $venv"
  "$python" -m venv "$venv"
fi
vpython="$venv/bin/python"
"$vpython" -m pip install -q --upgrade pip >/dev/null

# The llama-cpp-python that localllm asks for, from pyproject.toml.
spec="$("$vpython" - "$repo/pyproject.toml" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as handle:
    dependencies = tomllib.load(handle)["project"]["dependencies"]
print(next(d for d in dependencies if d.replace("_", "-").startswith("llama-cpp-python")))
EOF
)"

work="$(mktemp -d "${TMPDIR:-/tmp}/localllm-gpu-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# The source distributions are kept beside the wheels: tests/devices/test_gpu_build.py checks that
# the patches apply to the one that was built.
sources="$cache_root/sources"
mkdir -p "$sources"
say "fetching the source of $spec"
"$vpython" -m pip download -q --no-deps --no-binary :all: "$spec" -d "$work/sdist" 2>&1 \
  | grep -v '^WARNING: Location' >&2 || true
sdist="$(ls "$work"/sdist/llama_cpp_python-*.tar.gz 2>/dev/null | head -1)"
[ -n "$sdist" ] || die "could not download the llama-cpp-python source ($spec)"
cp -n "$sdist" "$sources/" 2>/dev/null || true
version="$(basename "$sdist" .tar.gz)"
version="${version#llama_cpp_python-}"

patch_sum="none"
if [ ${#patches[@]} -gt 0 ]; then
  patch_sum="$(cat "${patches[@]}" | sha256sum | cut -c1-12)"
fi
key="$(printf '%s|%s|%s|%s' "$version" "$flavour" "$cmake_flags" "$patch_sum" | sha256sum | cut -c1-16)"
cache="$cache_root/$flavour-$version-$key"
wheel="$(ls "$cache"/llama_cpp_python-*.whl 2>/dev/null | head -1 || true)"

if [ -z "$wheel" ]; then
  say "building llama-cpp-python $version with $cmake_flags (long: 10-30 minutes)"
  tar -xzf "$sdist" -C "$work"
  source_dir="$work/llama_cpp_python-$version"
  for patch_file in ${patches[@]+"${patches[@]}"}; do
    if ! patch -p1 --dry-run -s -d "$source_dir" <"$patch_file" >/dev/null; then
      die "$(basename "$patch_file") does not apply to llama-cpp-python $version: install Vulkan headers with VK_EXT_layer_settings (1.3.261 or later, e.g. the LunarG SDK) or update the patch"
    fi
    say "applying $(basename "$patch_file")"
    patch -p1 -s -d "$source_dir" <"$patch_file"
  done
  mkdir -p "$work/wheel"
  CMAKE_ARGS="$cmake_flags" "$vpython" -m pip wheel -q --no-deps --no-cache-dir \
    -w "$work/wheel" "$source_dir"
  mkdir -p "$cache"
  cp "$work"/wheel/llama_cpp_python-*.whl "$cache/"
  printf '%s\n' "flavour=$flavour" "version=$version" "cmake=$cmake_flags" "patch=$patch_sum" \
    >"$cache/BUILD"
  wheel="$(ls "$cache"/llama_cpp_python-*.whl | head -1)"
else
  say "using the cached build $wheel"
fi

"$vpython" -m pip install -q --force-reinstall --no-deps "$wheel"
# localllm itself, with llama-cpp-python already satisfied by the GPU wheel above.
"$vpython" -m pip install -q -e "$repo[$extras]"

"$vpython" - "$flavour" <<'EOF'
import sys
import llama_cpp
if not llama_cpp.llama_supports_gpu_offload():
    sys.exit(f"gpu-build: the installed llama-cpp-python has no GPU backend ({sys.argv[1]} asked)")
EOF
say "llama-cpp-python $version with $flavour is in $venv"
if [ "${LOCALLLM_GPU_NO_DOCTOR:-0}" != 1 ]; then
  "$venv/bin/localllm" doctor --no-verify
fi
