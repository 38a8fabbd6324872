# Shared by scripts/run.sh and scripts/test.sh: install what a fresh Debian machine lacks, and
# configure a build directory with every option stated. Sourced, not run.

KVVM_DEBIAN_PACKAGES=(cmake g++ make ccache libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev librapidcheck-dev libxxhash-dev libssl-dev clang-format clang
  libopenblas-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev curl libzmq3-dev cppzmq-dev
  libmsgpack-cxx-dev)
# What only the tests need: Node and npm for the real API clients (tests/clients); nginx for
# the replicas behind a balancer; Python's ZeroMQ and msgpack for the independent subscriber of
# the KV-cache events. A package whose command is already there (Node from another source
# bundles npm) is not asked for.
KVVM_TEST_PACKAGES=(nodejs npm python3-jsonschema nginx python3-zmq python3-msgpack)

# kvvm_install_dependencies [EXTRA_PACKAGE ...]: KVVM_DEBIAN_PACKAGES and the extra ones.
kvvm_install_dependencies() {
  local missing=()
  for package in "${KVVM_DEBIAN_PACKAGES[@]}" "$@"; do
    case $package in
      nodejs) command -v node >/dev/null 2>&1 && continue ;;
      npm) command -v npm >/dev/null 2>&1 && continue ;;
    esac
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  echo "kvvm: installing missing Debian packages: ${missing[*]}"
  local sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
}

# Jobs for builds and tests: every core, at least 1.
kvvm_jobs() { nproc 2>/dev/null || echo 2; }

# kvvm_configure PRESET BUILD_DIR [-DOPTION=VALUE ...]
# The preset states every KVVM_* option (CMakePresets.json), so a directory configured before
# by the other script, or by hand, is brought back to what this script needs; the arguments
# after the directory override the preset's. ccache, when present, lets the several build
# directories of one tree share their object files.
kvvm_configure() {
  local preset=$1 dir=$2
  shift 2
  local launcher=()
  if command -v ccache >/dev/null 2>&1; then
    export CCACHE_BASEDIR="$PWD"
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  cmake --preset "$preset" -B "$dir" "${launcher[@]}" "$@" >/dev/null
}

# kvvm_build_cli: installs what is missing, builds the kvvm tool alone (no tests, no
# benchmarks) in ${KVVM_BUILD_DIR:-build/release} and sets KVVM_CLI to its path. Under CI, the
# CI preset (warnings are errors there), so this build shares its objects with scripts/test.sh's
# through ccache.
kvvm_build_cli() {
  kvvm_install_dependencies
  local build_dir=${KVVM_BUILD_DIR:-build/release}
  local preset=release
  if [[ -n ${CI:-} ]]; then preset=ci-release; fi
  kvvm_configure "$preset" "$build_dir" -DKVVM_ENABLE_CUDA="${KVVM_ENABLE_CUDA:-AUTO}" \
    -DKVVM_BUILD_TESTS=OFF -DKVVM_BUILD_BENCH=OFF -DKVVM_BUILD_TOOLS=ON
  cmake --build "$build_dir" -j "$(kvvm_jobs)" --target kvvm_cli
  KVVM_CLI="$build_dir/tools/kvvm/kvvm"
}
