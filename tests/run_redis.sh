#!/bin/sh
# RedisStore rendezvous: starts a private redis-server on a loopback port, runs the Gloo test
# on 4 ranks with MUON_TEST_REDIS pointing at it, and stops that server (and only that one).
# Skipped when redis-server is not installed (Debian: redis-server).
# usage: tests/run_redis.sh BUILD_DIR
build=$1
if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server not installed: RedisStore test skipped"
  echo "0 passed, 0 failed, 1 skipped"
  exit 0
fi
dir=$(mktemp -d)
port=$((20000 + $$ % 20000))
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize no >"$dir/log" 2>&1 &
pid=$!
i=0
while ! redis-cli -p "$port" ping >/dev/null 2>&1 && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
MUON_TEST_REDIS="127.0.0.1:$port" "$build/muonrun" -n 4 --timeout 120 "$build/test_gloo"
rc=$?
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
rm -rf "$dir"
exit $rc
