#!/bin/sh
# RedisStore rendezvous. Starts a private redis-server on a free loopback port in a temporary
# directory, runs the Gloo test through it, then stops that server (by its pid, and only it):
#   1. build/test_gloo on 4 ranks with MUON_TEST_REDIS: every case, plus a world through Redis
#      and a dead Redis (MUON_TEST_REDIS_DEAD: a port checked to refuse connections)
#   2. build/test_gloo --redis on 44 ranks: the Redis cases only, now with subgroups whose rank
#      lists are long enough (over 120 characters) for muon_gloo_subgroup to hash their names
# Ends with one "redis: N passed, M failed" line adding up both runs. A server that cannot be
# started is a failure, not a hang. Skipped when redis-server is not installed (Debian:
# redis-server, which brings redis-cli).
# usage: tests/run_redis.sh BUILD_DIR
build=${1:-build}
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "redis-server not installed: RedisStore test skipped"
  echo "0 passed, 0 failed, 1 skipped"
  exit 0
fi
fail() {
  echo "redis: $*"
  echo "redis: 0 passed, 1 failed"
  exit 1
}
dir=$(mktemp -d "${TMPDIR:-/tmp}/muon-redis-XXXXXX") || fail "mktemp -d failed"
pid=
stop() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    pid=
  fi
}
trap 'stop; rm -rf "$dir"' EXIT
trap 'exit 1' INT TERM HUP

# "refused" when nothing listens on 127.0.0.1:$1, else what redis-cli said (PONG from a Redis)
probe() {
  out=$(timeout 2 redis-cli -h 127.0.0.1 -p "$1" ping 2>&1)
  case $out in
    *"Connection refused"*) echo refused ;;
    *) echo "${out:-no answer}" ;;
  esac
}

# candidate ports in 20000..31999 (below Linux's ephemeral range), spread from this shell's pid
port=
k=0
while [ $k -lt 4 ] && [ -z "$port" ]; do
  p=$((20000 + ($$ + k * 4099) % 12000))
  k=$((k + 1))
  [ "$(probe "$p")" = refused ] || continue
  redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    --daemonize no </dev/null >"$dir/log" 2>&1 &
  pid=$!
  i=0
  while [ $i -lt 50 ]; do # up to 5 s for PING to be answered by this very process
    if ! kill -0 "$pid" 2>/dev/null; then break; fi # it exited: port taken meanwhile, or worse
    if timeout 2 redis-cli -h 127.0.0.1 -p "$p" info server 2>/dev/null | tr -d '\r' |
        grep -qx "process_id:$pid"; then
      port=$p
      break
    fi
    sleep 0.1
    i=$((i + 1))
  done
  if [ -z "$port" ]; then
    echo "redis-server on port $p did not come up; its log:"
    sed 's/^/  /' "$dir/log"
    stop
  fi
done
[ -n "$port" ] || fail "could not start redis-server on a free port (tried $k)"
echo "redis-server pid $pid on 127.0.0.1:$port, directory $dir"

# a loopback port where nothing listens, for the dead-Redis case
dead=
k=0
while [ $k -lt 8 ] && [ -z "$dead" ]; do
  p=$((20000 + ($$ + 6007 + k * 4099) % 12000))
  k=$((k + 1))
  [ "$p" != "$port" ] && [ "$(probe "$p")" = refused ] && dead=$p
done
[ -n "$dead" ] || fail "no closed loopback port found for the dead-Redis case"

passed=0
failed=0
run() { # run RANKS [ARGS]: one muonrun, its rank-0 summary added to the totals
  n=$1
  shift
  MUON_TEST_REDIS="127.0.0.1:$port" MUON_TEST_REDIS_DEAD="127.0.0.1:$dead" \
    "$build/muonrun" -n "$n" --timeout 120 "$build/test_gloo" "$@" >"$dir/out" 2>&1
  rc=$?
  cat "$dir/out"
  line=$(grep -E '^\[0\] [0-9]+ passed, [0-9]+ failed' "$dir/out" | tail -n 1)
  if [ -z "$line" ]; then
    echo "!! test_gloo $* on $n ranks exited $rc without a summary line"
    failed=$((failed + 1))
    return
  fi
  p=$(echo "$line" | sed -E 's/^\[0\] ([0-9]+) passed.*/\1/')
  f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "!! test_gloo $* on $n ranks exited $rc"
    f=1
  fi
  passed=$((passed + p))
  failed=$((failed + f))
}
run 4
run 44 --redis

stop
echo "redis: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
