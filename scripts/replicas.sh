#!/usr/bin/env bash
# Starts N `kvvm serve` replicas on free loopback ports behind nginx, as a balancer in front of
# them: least connections first; a replica's 429 (overloaded) or 503 (draining), or a refused
# or broken connection, sends the request on to the next replica; streams (SSE) pass through
# unbuffered. Everything stops when this script exits (Ctrl-C, SIGTERM, or nginx ending).
#
# Usage: scripts/replicas.sh [OPTIONS] [-- KVVM_SERVE_OPTIONS...]
#   -n, --replicas N   replicas to start (default 3)
#   -p, --port PORT    nginx's port (default $KVVM_PORT, else 8000; 0: a free one)
#   --host ADDR        the address nginx listens on (default 127.0.0.1)
#   --model DIR        the checkpoint each replica serves (default models/kvvm-adder)
#   --backend B        cpu, cuda or auto for every replica (default cpu; with cuda the replicas
#                      share the GPU: give each a --kv-budget after --)
#   --tries N          replicas nginx tries for one request: proxy_next_upstream_tries
#                      (default: all of them)
#   --kvvm PATH        a built kvvm binary; without it kvvm is built as scripts/run.sh builds it
#                      (in $KVVM_BUILD_DIR, default build/release)
#   --watch-pid PID    stop everything once process PID ends (a test or a supervisor that
#                      started this script and may die without signalling it)
#   -h, --help         this text
# After --, options for every `kvvm serve` (e.g. -- --max-running 8 --max-queue 16).
# Prints one line per replica ("replica I (pid P) on URL") and one for nginx ("nginx (pid P,
# ...) on URL") once all of them answer, then keeps serving. Logs and nginx's files live in
# a temporary directory, removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
me=scripts/replicas.sh

replicas=3
port=${KVVM_PORT:-8000}
host=127.0.0.1
model=models/kvvm-adder
backend=cpu
tries=""
kvvm=""
watch_pid=""
serve_args=()
need_value() {  # option value
  if [[ -z ${2+x} || $2 == -* && $2 != -- ]]; then
    echo "$me: $1 needs a value (try --help)" >&2
    exit 2
  fi
}
count() {  # option value minimum
  if ! [[ $2 =~ ^[0-9]+$ ]] || (($2 < $3)); then
    echo "$me: $1: '$2' is not a whole number of at least $3" >&2
    exit 2
  fi
}
while (($# > 0)); do
  case $1 in
    -n | --replicas) need_value "$@"; count "$1" "$2" 1; replicas=$2; shift 2 ;;
    -p | --port) need_value "$@"; count "$1" "$2" 0; port=$2; shift 2 ;;
    --host) need_value "$@"; host=$2; shift 2 ;;
    --model) need_value "$@"; model=$2; shift 2 ;;
    --backend) need_value "$@"; backend=$2; shift 2 ;;
    --tries) need_value "$@"; count "$1" "$2" 1; tries=$2; shift 2 ;;
    --kvvm) need_value "$@"; kvvm=$2; shift 2 ;;
    --watch-pid) need_value "$@"; count "$1" "$2" 1; watch_pid=$2; shift 2 ;;
    -h | --help)
      sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    --) shift; serve_args=("$@"); break ;;
    *)
      echo "$me: unknown argument '$1' (try --help)" >&2
      exit 2
      ;;
  esac
done
case $backend in cpu | cuda | auto) ;; *)
  echo "$me: --backend: '$backend' is not cpu, cuda or auto" >&2
  exit 2
  ;;
esac
tries=${tries:-$replicas}
if ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]]; then
  echo "$me: nginx is not installed (Debian: apt-get install nginx; scripts/test.sh does)" >&2
  exit 1
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

if [[ -z $kvvm ]]; then
  # shellcheck source=scripts/common.sh
  source scripts/common.sh
  kvvm_build_cli
  kvvm=$KVVM_CLI
fi
if [[ ! -x $kvvm ]]; then
  echo "$me: $kvvm is not an executable kvvm" >&2
  exit 1
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/kvvm-replicas.XXXXXX")
pids=()
nginx_pid=""
# shellcheck disable=SC2317  # a trap runs it
stop_all() {
  trap - EXIT INT TERM
  # nginx stops taking connections and finishes the requests it carries (QUIT) while the
  # replicas drain (TERM: running requests finish, new ones get 503), so nothing in flight is
  # cut; kill -0 first: a replica may be gone already.
  if [[ -n $nginx_pid ]] && kill -0 "$nginx_pid" 2>/dev/null; then kill -QUIT "$nginx_pid" || true; fi
  local pid
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  for pid in "${pids[@]}" $nginx_pid; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
  echo "$me: stopped"
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the replicas, each on a free port it picks and prints ---------------------------------
urls=()
for ((i = 1; i <= replicas; i++)); do
  "$kvvm" serve --model "$model" --backend "$backend" --port 0 "${serve_args[@]}" \
    >"$dir/replica-$i.log" 2>&1 &
  pids+=("$!")
done
for ((i = 1; i <= replicas; i++)); do
  url=""
  for _ in $(seq 600); do
    url=$(grep -o 'http://[^ ]*' "$dir/replica-$i.log" | head -n 1 || true)
    if [[ -n $url ]] || ! kill -0 "${pids[i - 1]}" 2>/dev/null; then break; fi
    sleep 0.1
  done
  if [[ -z $url ]]; then
    cat "$dir/replica-$i.log" >&2
    echo "$me: replica $i did not come up (its output is above)" >&2
    exit 1
  fi
  urls+=("$url")
done

# --- nginx, in the foreground of its own prefix: no root, nothing outside $dir -------------
write_conf() {  # port
  local servers="" url
  for url in "${urls[@]}"; do
    # max_fails=0: nginx counts a 429 as a failed attempt, and replicas marked down for theirs
    # would leave an overloaded pool with no replica at all; a dead replica costs one refused
    # connection on loopback instead.
    servers+="    server ${url#http://} max_fails=0;"$'\n'
  done
  mkdir -p "$dir/tmp"
  # Under root nginx's workers would switch to nobody, who cannot write into $dir.
  local user=""
  if ((EUID == 0)); then user="user $(id -un) $(id -gn);"; fi
  cat >"$dir/nginx.conf" <<EOF
$user
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
  upstream kvvm {
    least_conn;
$servers    keepalive 32;
  }
  server {
    listen $host:$1;
    client_max_body_size 8m;
    location / {
      proxy_pass http://kvvm;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host \$host;
      # Streams reach the client token by token.
      proxy_buffering off;
      proxy_cache off;
      # A replica refuses (429 overloaded, 503 draining) before any work, so the request goes
      # to the next one, POSTs included (non_idempotent); so does one whose connection failed
      # before its answer began. Once a stream has started it cannot move.
      proxy_next_upstream error timeout http_429 http_503 non_idempotent;
      proxy_next_upstream_tries $tries;
      proxy_connect_timeout 2s;
      # A long generation is not a timeout.
      proxy_read_timeout 3600s;
      proxy_send_timeout 3600s;
      add_header X-Kvvm-Replica \$upstream_addr always;
      # nginx's own 502 / 504 (every try refused or failed, the last on a dead replica or a
      # closed keep-alive connection) become what kvvm answers when overloaded: the live
      # replicas were busy, and the client should retry. A replica's own answers pass through.
      error_page 502 504 = @busy;
    }
    location @busy {
      default_type application/json;
      add_header Retry-After 1 always;
      return 429 '{"error": {"message": "every replica tried is busy or unreachable: retry later", "type": "resource_limit_error", "param": null, "code": "overloaded"}}';
    }
  }
}
EOF
}
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# A free port is drawn below the kernel's ephemeral range, where no outgoing connection (the
# replicas' own clients) holds one.
read -r ephemeral _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || ephemeral=32768
if ((ephemeral < 12000)); then ephemeral=61000; fi
attempts=1
if ((port == 0)); then attempts=20; fi
for ((a = 0; a < attempts; a++)); do
  listen=$port
  if ((port == 0)); then
    listen=$((10000 + (RANDOM * 32768 + RANDOM) % (ephemeral - 10000)))
    port_free "$listen" || continue
  fi
  write_conf "$listen"
  "$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" -g 'daemon off;' \
    >"$dir/nginx.out" 2>&1 &
  nginx_pid=$!
  ready=""
  for _ in $(seq 100); do
    if ! kill -0 "$nginx_pid" 2>/dev/null; then break; fi
    if curl -sf -o /dev/null --max-time 2 "http://$host:$listen/health"; then
      ready=1
      break
    fi
    sleep 0.05
  done
  if [[ -n $ready ]]; then break; fi
  if kill -0 "$nginx_pid" 2>/dev/null; then kill -TERM "$nginx_pid" || true; fi
  wait "$nginx_pid" 2>/dev/null || true
  nginx_pid=""
done
if [[ -z $nginx_pid ]]; then
  cat "$dir/nginx.out" "$dir/error.log" >&2 2>/dev/null || true
  echo "$me: nginx did not come up on $host:$port (its output is above)" >&2
  exit 1
fi

for ((i = 1; i <= replicas; i++)); do
  echo "$me: replica $i (pid ${pids[i - 1]}) on ${urls[i - 1]}"
done
echo "$me: nginx (pid $nginx_pid, least_conn over $replicas replicas, $tries tries a request)" \
  "on http://$host:$listen"
# Serve until nginx ends, a signal ends this script or the watched process ends; a replica
# that dies is routed around. (`sleep & wait`: a signal interrupts wait at once.)
while kill -0 "$nginx_pid" 2>/dev/null; do
  if [[ -n $watch_pid ]] && ! kill -0 "$watch_pid" 2>/dev/null; then
    echo "$me: process $watch_pid ended; stopping" >&2
    exit 0
  fi
  sleep 0.5 &
  wait $! || true
done
code=0
wait "$nginx_pid" || code=$?
nginx_pid=""
echo "$me: nginx exited ($code); its log:" >&2
cat "$dir/error.log" >&2 2>/dev/null || true
exit 1
