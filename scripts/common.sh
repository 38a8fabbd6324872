# Shared by scripts/run.sh and scripts/test.sh: install what a fresh Debian machine lacks.
# Sourced, not run.

KVVM_DEBIAN_PACKAGES=(cmake g++ make libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev
  nlohmann-json3-dev librapidcheck-dev libxxhash-dev libssl-dev clang-format)

kvvm_install_dependencies() {
  local missing=()
  for package in "${KVVM_DEBIAN_PACKAGES[@]}"; do
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
