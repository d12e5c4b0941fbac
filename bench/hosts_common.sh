# shellcheck shell=bash
# Sourced (after `set -euo pipefail`) by the multi-host benchmarks,
# bench/hosts_allreduce.sh and bench/hosts_train.sh: where things are, and
# the steps both take. The Gloo ranks meet at a redis-server in host 0 and
# prove a shared secret ($out/secret) to each other.
# Uses $LOCKSTEP_BUILD_DIR (default build/).
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${LOCKSTEP_BUILD_DIR:-$root/build}"
# shellcheck disable=SC2034  # lockstep: used by the scripts that source this
lockstep="$build/cli/lockstep"
redis_port=6379

# --- inside a test host (scripts/hosts.sh sets HOST, HOSTS, HOST_ADDR, HOST_ADDRS)

# hosts_start_redis OUT: host 0 starts the redis-server (log in OUT/redis.log);
# every host then waits up to 30 s for it to answer.
hosts_start_redis() {
  local out=$1 i
  if [ "$HOST" = 0 ]; then
    redis-server --bind "$HOST_ADDR" --port $redis_port --save "" --appendonly no --protected-mode no \
      > "$out/redis.log" 2>&1 &
  fi
  for ((i = 0; i < 300; i++)); do  # up to 30 s for redis
    [ "$(redis-cli -h "${HOST_ADDRS%%,*}" -p $redis_port ping 2>/dev/null)" = PONG ] && break
    sleep 0.1
  done
}

# hosts_run_ranks PER_HOST OUT FUNCTION: runs `FUNCTION RANK` for each of this
# host's PER_HOST ranks, in the background, with the environment of a Gloo
# rank (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, LOCKSTEP_RENDEZVOUS,
# LOCKSTEP_SECRET_FILE=OUT/secret); waits for all of them and returns the
# status of the last one that failed (0 when none did).
hosts_run_ranks() {
  local per_host=$1 out=$2 fn=$3 l rank p rc=0
  local pids=()
  for ((l = 0; l < per_host; l++)); do
    rank=$((HOST * per_host + l))
    RANK=$rank WORLD_SIZE=$((HOSTS * per_host)) LOCAL_WORLD_SIZE=$per_host \
      LOCKSTEP_RENDEZVOUS="redis://${HOST_ADDRS%%,*}:$redis_port" LOCKSTEP_SECRET_FILE="$out/secret" \
      "$fn" "$rank" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  return $rc
}

# --- the driver ------------------------------------------------------------------

# hosts_prepare OUT BUILD_FIRST: checks that test hosts can run and cleans up
# old ones, builds lockstep (unless BUILD_FIRST is 0), and makes OUT afresh
# with a new shared secret.
hosts_prepare() {
  local out=$1 build_first=$2
  "$root/scripts/hosts.sh" check
  "$root/scripts/hosts.sh" cleanup
  [ "$build_first" -eq 0 ] || LOCKSTEP_BUILD_DIR="$build" LOCKSTEP_TARGETS=lockstep "$root/scripts/build.sh" > /dev/null
  rm -rf "$out"
  mkdir -p "$out"
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$out/secret")
}
