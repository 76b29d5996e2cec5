#!/bin/sh
# Several hosts for real: each rank in its own network namespace, talking TCP to the others
# through a router namespace, over shaped links. Made and removed by this script (root only).
#
#   namespaces  muon-<pid>-h, the head: the router (ip_forward) and a private redis-server on
#               10.77.0.1:6379 for Gloo's RedisStore rendezvous; muon-<pid>-r<i>, rank i's host,
#               eth0 = 10.77.<i+1>.2/24, its default route via the head's end of a veth pair
#               (mv<i>, 10.77.<i+1>.1). The addresses exist only inside these namespaces.
#   links       every rank's eth0 and the head's mv<i> are shaped to 1 Gbit/s with tc tbf (a 1
#               Gbit/s NIC per host, both directions), MTU 9000 (jumbo frames).
#   delay, loss netem where the kernel has it (on the head's mv<i>, RTT/2 each way). Else
#               build/netrelay: the head's policy routing sends every packet it forwards between
#               ranks through a TUN device, where netrelay holds it RTT/2 and drops a fraction
#               (real packet loss: TCP retransmits). Redis traffic is never delayed. Each run
#               says which shaping ran. MUON_NETNS_SHAPER=relay forces the relay.
#
# make test (tests/run_netns.sh BUILD_DIR), each 4 ranks, one namespace each:
#   Gloo + Redis: test_dist and fsdp on the 1 Gbit/s links; tp_fsdp (prefetch 2, async) at
#   ~1 ms RTT and 1 % loss; fsdp at ~10 ms RTT: every check line bitwise equal to one device.
#   MPI: mpi/fsdp and mpi/test_dist under mpirun, each rank wrapped in `ip netns exec`, TCP only
#   (btl tcp,self on 10.77.0.0/16), at ~1 ms RTT.
#   Faults (test_netns): after 2 steps and a checkpoint, rank 1's link goes down in the middle of
#   step 3 (ip link set mv1 down); then rank 2's host is cut off (its veth pair deleted). Every
#   rank must return MUON_ERR_COMM or MUON_ERR_TIMEOUT within 2 s + 3 s of the cut with nothing
#   applied; a restarted job on the repaired network resumes from the checkpoint bitwise. Both
#   over Gloo (MUON_GLOO_TIMEOUT=2) and over MPI (mpi/test_netns, MUON_MPI_TIMEOUT=2).
# tests/run_netns.sh --bench BUILD_DIR (make bench): bench_dist's 12-layer list at 4 ranks over
#   1 Gbit/s and ~10 ms RTT, the debug setting against prefetch 2 + async, bytes per rank against
#   the formula; the latency-bound case (256 matrices of 32^2, the whole grid); the 12-layer list
#   at 100 Mbit/s.
#
# Everything the script starts runs under `timeout`; the EXIT trap kills its own processes by
# pid and deletes its namespaces. Without root, ip, redis-server, or where a namespace cannot be
# made: one skipped line with the reason. Ends with "netns: N passed, M failed".
# usage: tests/run_netns.sh [--bench] BUILD_DIR
bench=
if [ "$1" = "--bench" ]; then bench=1; shift; fi
build=${1:-build}
skip() {
  echo "network namespaces: $*: multi-host tests skipped"
  echo "0 passed, 0 failed, 1 skipped"
  exit 0
}
[ "$(id -u)" = 0 ] || skip "not root (ip netns needs CAP_SYS_ADMIN)"
for t in ip tc timeout redis-server redis-cli; do
  command -v $t >/dev/null 2>&1 || skip "$t not installed"
done
for b in netrelay $(if [ -n "$bench" ]; then echo bench_dist; else echo test_netns test_dist fsdp tp_fsdp; fi); do
  [ -x "$build/$b" ] || skip "$build/$b not built"
done

ns=muon-$$
dir=$(mktemp -d "${TMPDIR:-/tmp}/muon-netns-XXXXXX") || { echo "mktemp failed"; echo "netns: 0 passed, 1 failed"; exit 1; }
made=        # namespaces made, for the cleanup
running=     # pids of what runs now (ranks, redis, relay)
cleanup() {
  for p in $running; do kill "$p" 2>/dev/null; done
  sleep 0.2
  for p in $running; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  # what is left inside our namespaces is ours too (mpirun's daemonized orteds)
  for n in $made; do
    for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    ip netns del "$n" 2>/dev/null
  done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# ---- the network ------------------------------------------------------------------------------
addr() { echo "10.77.$(($1 + 1)).2"; }
# tbf at $rate (1 Gbit/s) on DEV in namespace NS
rate=1gbit
shape_rate() {
  tc -n "$1" qdisc replace dev "$2" root handle 1: tbf rate $rate burst 256kb latency 20ms
}
set_rate() {   # set_rate RATE N: every link
  rate=$1
  i=0
  while [ "$i" -lt "$2" ]; do
    shape_rate "$ns-r$i" eth0 && shape_rate "$h" "mv$i" || return 1
    i=$((i + 1))
  done
}
make_net() {   # make_net N: the head and N rank hosts
  h=$ns-h
  ip netns add "$h" 2>"$dir/err" || skip "ip netns add failed: $(cat "$dir/err")"
  made="$h"
  ip netns exec "$h" true 2>"$dir/err" || skip "ip netns exec failed: $(cat "$dir/err")"
  ip -n "$h" link set lo up
  ip -n "$h" addr add 10.77.0.1/32 dev lo
  ip netns exec "$h" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward; echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter;
    echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter' || return 1
  i=0
  while [ "$i" -lt "$1" ]; do
    add_host "$i" || return 1
    i=$((i + 1))
  done
}
add_host() {   # rank I's namespace (kept if it exists) and its link to the head
  r=$ns-r$1
  if ! ip netns list | grep -q "^$r\\b"; then
    ip netns add "$r" || return 1
    made="$made $r"
    ip -n "$r" link set lo up
  fi
  ip -n "$h" link add "mv$1" mtu 9000 type veth peer name eth0 netns "$r" || return 1
  ip -n "$h" addr add "10.77.$(($1 + 1)).1/24" dev "mv$1"
  ip -n "$r" addr add "$(addr "$1")/24" dev eth0
  ip -n "$r" link set eth0 mtu 9000 up
  ip -n "$h" link set "mv$1" up
  ip -n "$r" route add default via "10.77.$(($1 + 1)).1"
  ip -n "$h" rule del iif "mv$1" lookup 100 pref 200 2>/dev/null
  ip -n "$h" rule add iif "mv$1" lookup 100 pref 200   # through the relay when table 100 has a route
  shape_rate "$r" eth0 && shape_rate "$h" "mv$1"
}

# Delay and loss: netem when the kernel has it, else netrelay. shape RTT_MS LOSS_PERCENT N
relay_pid=
shaper=
shape() {
  unshape "$3"
  [ "$1" = 0 ] && [ "$2" = 0 ] && { shaper="tbf $rate"; return 0; }
  half=$(awk "BEGIN { print $1 / 2 }")
  if [ "${MUON_NETNS_SHAPER:-auto}" != relay ] && tc -n "$h" qdisc add dev lo root netem delay 1ms 2>/dev/null; then
    tc -n "$h" qdisc del dev lo root
    i=0
    while [ "$i" -lt "$3" ]; do
      tc -n "$h" qdisc replace dev "mv$i" root handle 1: netem delay "${half}ms" loss "$2%" limit 100000 &&
        tc -n "$h" qdisc add dev "mv$i" parent 1: handle 2: tbf rate $rate burst 256kb latency 20ms || return 1
      i=$((i + 1))
    done
    shaper="tbf $rate + netem delay ${half} ms each way, loss $2 % (head's egress)"
    return 0
  fi
  if [ ! -c /dev/net/tun ]; then shaper="none (no netem, no /dev/net/tun)"; return 1; fi
  ip -n "$h" tuntap add dev mr0 mode tun 2>/dev/null
  ip -n "$h" link set mr0 mtu 9000 up
  ip netns exec "$h" sh -c 'echo 0 > /proc/sys/net/ipv4/conf/mr0/rp_filter'
  loss=$(awk "BEGIN { print $2 / 100 }")
  ip netns exec "$h" timeout -k 2 1800 "$build/netrelay" --dev mr0 --delay-ms "$half" --loss "$loss" --seconds 1800 \
    --seed $(($$ % 1000 + 1)) 2>"$dir/relay.log" &
  relay_pid=$!
  running="$running $relay_pid"
  sleep 0.2
  kill -0 "$relay_pid" 2>/dev/null || { cat "$dir/relay.log"; return 1; }
  ip -n "$h" route replace default dev mr0 table 100
  shaper="tbf $rate + netrelay: ${half} ms each way, loss $2 % per packet (TUN in the head)"
}
unshape() {
  ip -n "$h" route del default table 100 2>/dev/null
  if [ -n "$relay_pid" ]; then
    kill "$relay_pid" 2>/dev/null
    wait "$relay_pid" 2>/dev/null
    sed 's/^/  /' "$dir/relay.log"
    running=$(echo "$running" | sed "s/ $relay_pid\\b//")
    relay_pid=
  fi
  shaper="tbf $rate"
  i=0
  while [ "$i" -lt "$1" ]; do
    tc -n "$h" qdisc show dev "mv$i" 2>/dev/null | grep -q netem && shape_rate "$h" "mv$i"
    i=$((i + 1))
  done
}

redis_pid=
start_redis() {
  ip netns exec "$h" timeout -k 2 1800 redis-server --port 6379 --bind 10.77.0.1 --protected-mode no --save "" --appendonly no \
    --dir "$dir" --daemonize no </dev/null >"$dir/redis.log" 2>&1 &
  redis_pid=$!
  running="$running $redis_pid"
  i=0
  while [ $i -lt 50 ]; do
    ip netns exec "$h" timeout 2 redis-cli -h 10.77.0.1 -p 6379 ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.1
    i=$((i + 1))
  done
  cat "$dir/redis.log"
  return 1
}

# ---- runs -------------------------------------------------------------------------------------
passed=0
failed=0
runno=0
ok() { passed=$((passed + 1)); echo "ok   $*"; }
bad() { failed=$((failed + 1)); echo "FAIL $*"; }

# gloo N SECONDS CMD...: rank i of CMD in namespace i, Redis prefix of its own, $genv added to
# the environment; waits for all. Output in $dir/out.<i>, exit status in $dir/rc.<i>, $dir/out is
# every rank's output, "[i] "-prefixed. start_ranks only starts them ($pids).
genv=
start_ranks() {
  n=$1
  t=$2
  shift 2
  runno=$((runno + 1))
  pids=
  i=0
  while [ "$i" -lt "$n" ]; do
    ip netns exec "$ns-r$i" env $genv MUON_RANK="$i" MUON_WORLD_SIZE="$n" MUON_REDIS="10.77.0.1:6379/run$runno" \
      MUON_GLOO_HOST="$(addr "$i")" timeout -k 3 "$t" "$@" >"$dir/out.$i" 2>&1 &
    pids="$pids $!"
    i=$((i + 1))
  done
  running="$running $pids"
}
gloo() {
  start_ranks "$@"
  collect "$1" $pids
}
collect() {   # collect N PIDS...: waits, writes rc.<i> and the merged out
  n=$1
  shift
  i=0
  for p in "$@"; do
    wait "$p"
    echo $? >"$dir/rc.$i"
    running=$(echo "$running" | sed "s/ $p\\b//")
    i=$((i + 1))
  done
  : >"$dir/out"
  i=0
  while [ "$i" -lt "$n" ]; do
    sed "s/^/[$i] /" "$dir/out.$i" >>"$dir/out"
    i=$((i + 1))
  done
}
all_zero() {   # every rank exited 0
  i=0
  while [ "$i" -lt "$1" ]; do
    [ "$(cat "$dir/rc.$i")" = 0 ] || return 1
    i=$((i + 1))
  done
}
# expect NAME N GREP: passes when every rank exited 0 and rank 0's output has GREP
expect() {
  if all_zero "$2" && grep -q -- "$3" "$dir/out.0"; then
    ok "$1: $(grep -- "$3" "$dir/out.0" | tail -n 1 | cut -c1-100)"
  else
    bad "$1"
    tail -n 12 "$dir/out"
  fi
}
timed() {   # timed NAME N GREP CMD...: the run and its wall time
  name=$1; n=$2; want=$3
  shift 3
  t0=$(date +%s%N)
  "$@"
  expect "$name ($(( ($(date +%s%N) - t0) / 1000000 )) ms, $shaper$launch)" "$n" "$want"
  launch=
}
BITWISE='check: bitwise equal to single device (max |diff| = 0)'
SUMMARY='[0-9]* passed, 0 failed'

# ---- make test ----------------------------------------------------------------------------------
N=4
make_net $N || { echo "netns: could not build the network"; echo "netns: 0 passed, 1 failed"; exit 1; }
start_redis || { echo "netns: redis-server did not come up"; echo "netns: 0 passed, 1 failed"; exit 1; }
echo "namespaces $ns-h (router, redis 10.77.0.1:6379) and $ns-r0..$((N - 1)) (10.77.1.2 .. 10.77.$N.2)"

if [ -n "$bench" ]; then   # make bench: the 12-layer list, the latency-bound case, 100 Mbit/s
  shape 10 0 $N || bad "delay: $shaper"
  genv=OPENBLAS_NUM_THREADS=1
  for args in "--layers 12 --overlap --settings 2:1 --steps 2 --warmup 1" \
              "--overlap --small 256 --dim 32 --round-bytes 4096 --steps 3" \
              "--layers 12 --overlap --settings 2:1 --steps 2 --warmup 1 100mbit"; do
    case $args in *100mbit) set_rate 100mbit $N; shape 10 0 $N; args=${args% 100mbit} ;; esac
    echo "shaping: $shaper"
    t0=$(date +%s)
    gloo $N 900 "$build/bench_dist" $args
    sed -n '/^== bench_dist/,/^-- overlap/p' "$dir/out.0"
    if all_zero $N && grep -q 'bitwise identical' "$dir/out.0"; then ok "bench_dist $args over the shaped network ($(( $(date +%s) - t0 )) s)"
    else bad "bench_dist $args over the shaped network"; tail -n 12 "$dir/out"; fi
  done
  unshape $N
  echo "netns: $passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
fi

shape 0 0 $N
timed "gloo test_dist -n 4" $N "$SUMMARY" gloo $N 120 "$build/test_dist"
timed "gloo fsdp -n 4 --steps 5" $N "$BITWISE" gloo $N 60 "$build/fsdp" --steps 5 --quiet
shape 1 1 $N || bad "delay and loss: $shaper"
timed "gloo tp_fsdp -n 4 --steps 10 --prefetch 2 --async" $N "$BITWISE" gloo $N 60 "$build/tp_fsdp" --steps 10 --quiet --prefetch 2 --async --round-bytes 8192
shape 10 0 $N || bad "delay: $shaper"
timed "gloo fsdp -n 4 --steps 5" $N "$BITWISE" gloo $N 60 "$build/fsdp" --steps 5 --quiet
unshape $N

# MPI across the hosts: mpirun in the head starts one orted per host through an "rsh agent" that
# is `ip netns exec` (as it would ssh to real hosts); the ranks talk TCP only (no shared memory).
# mpi_start only starts it ($mpid); $menv: mpirun's own arguments added (-x VAR=VALUE).
menv=
mpi_start() {   # mpi_start N CMD...
  n=$1
  shift
  hosts=
  i=0
  while [ "$i" -lt "$n" ]; do hosts="$hosts${hosts:+,}$(addr "$i"):1"; i=$((i + 1)); done
  ip netns exec "$h" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 90 \
    mpirun --allow-run-as-root --timeout 80 -n "$n" --host "$hosts" --mca plm_rsh_agent "$dir/agent" \
    --mca plm_rsh_no_tree_spawn 1 --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/16 \
    --mca oob_tcp_if_include 10.77.0.0/16 $menv "$@" >"$dir/out.0" 2>&1 &
  mpid=$!
  running="$running $mpid"
}
# Open MPI's rsh launcher now and then never starts a job's ranks here (mpirun then waits out its
# --timeout and prints only "setpgid ... failed in parent"): mpi_launch starts a job again, once,
# when after 5 s no process of the program runs in any rank's namespace (they start within about
# 0.3 s otherwise); $launch says so.
ranks_running() {   # ranks_running PROGRAM: some process named PROGRAM runs in a rank's namespace
  r=0
  while [ "$r" -lt $N ]; do
    for q in $(ip netns pids "$ns-r$r" 2>/dev/null); do
      [ "$(cat /proc/$q/comm 2>/dev/null)" = "$(echo "$1" | cut -c1-15)" ] && return 0
    done
    r=$((r + 1))
  done
  return 1
}
mpi_launch() {   # mpi_launch N CMD...
  launch=
  mpi_start "$@"
  i=0
  while kill -0 "$mpid" 2>/dev/null && ! ranks_running "$(basename "$2")" && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  if [ $i -ge 50 ] && kill -0 "$mpid" 2>/dev/null; then
    kill "$mpid" 2>/dev/null
    collect 1 $mpid
    launch=", launched twice: mpirun had not started the ranks after 5 s"
    mpi_start "$@"
  fi
}
mpi() {   # mpi N CMD...
  mpi_launch "$@"
  collect 1 $mpid
}
skipped=0
if command -v mpirun >/dev/null 2>&1 && [ -x "$build/mpi/fsdp" ] && [ -x "$build/mpi/test_dist" ] && [ -x "$build/mpi/test_netns" ]; then
  cat >"$dir/agent" <<EOF
#!/bin/sh
# mpirun's rsh agent: "agent HOST COMMAND...", HOST = 10.77.<i+1>.2 is namespace $ns-r<i>
host=\$1
shift
exec ip netns exec "$ns-r\$((\$(echo "\$host" | cut -d. -f3) - 1))" sh -c "\$*"
EOF
  chmod +x "$dir/agent"
  shape 1 1 $N || bad "delay and loss: $shaper"
  timed "mpi fsdp -n 4 --steps 5" 1 "$BITWISE" mpi $N "$build/mpi/fsdp" --steps 5 --quiet
  timed "mpi test_dist -n 4" 1 "$SUMMARY" mpi $N "$build/mpi/test_dist"
  unshape $N
else
  echo "mpirun or $build/mpi/fsdp, test_dist, test_netns not found: MPI across namespaces skipped"
  skipped=1
fi

# after_cut FILES...: each rank's status and its time after the cut, from its "rank R: MUON_ERR_X
# ... T s after the cut" line, on one line.
after_cut() {
  sed -n 's/^rank \([0-9]*\): MUON_ERR_\([A-Z]*\).* \([0-9.-]*\) s after the cut.*/rank \1 \2 \3 s,/p' "$@" |
    tr '\n' ' ' | sed 's/, $//'
}
# fault NAME VICTIM CUT REPAIR: test_netns with the network cut (the shell command CUT) while
# VICTIM waits inside step 3's first exchange; then REPAIR, and a new job resumes.
fault() {
  fd=$dir/ckpt.$2
  mkdir -p "$fd"
  genv=MUON_GLOO_TIMEOUT=2
  t0=$(date +%s%N)
  start_ranks $N 60 "$build/test_netns" "$fd" fault "$2"
  i=0
  while [ ! -e "$fd/paused" ] && [ $i -lt 600 ]; do sleep 0.02; i=$((i + 1)); done
  if [ -e "$fd/paused" ]; then eval "$3"; fi
  : >"$fd/cut"
  collect $N $pids
  genv=
  if all_zero $N; then
    ok "$1 ($(( ($(date +%s%N) - t0) / 1000000 )) ms): after the cut $(after_cut "$dir"/out.*); nothing applied"
  else
    bad "$1"
    grep -h 'after the cut\|FAIL\|  tests' "$dir/out" | head -n 20
  fi
  eval "$4"
  timed "resume from the checkpoint after: $1" $N "$SUMMARY" gloo $N 60 "$build/test_netns" "$fd" resume
}
fault "rank 1's link down mid-step" 1 'ip -n "$h" link set mv1 down' 'ip -n "$h" link set mv1 up'
fault "rank 2's host cut off mid-step (its veth pair deleted)" 2 'ip -n "$h" link del mv2' 'add_host 2'

# mpi_fault NAME VICTIM CUT REPAIR: the same over MPI (mpi/test_netns, MUON_MPI_TIMEOUT=2). Each
# rank writes its verdict to a file (the cut host's orted cannot forward its output) and waits
# for the others' before it exits without MPI_Finalize, which ends the job: mpirun's own exit
# status is not the verdict. The network is repaired once every verdict is in, so that mpirun can
# reach the cut host's orted again and end; a new mpirun job then resumes from the checkpoint.
mfaults=0
mpi_fault() {
  mfaults=$((mfaults + 1))
  fd=$dir/mpi_fault.$mfaults
  mkdir -p "$fd"
  t0=$(date +%s%N)
  menv="-x MUON_MPI_TIMEOUT=2"
  mpi_launch $N "$build/mpi/test_netns" "$fd" fault "$2"
  menv=
  i=0
  while [ ! -e "$fd/paused" ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i + 1)); done
  if [ -e "$fd/paused" ]; then eval "$3"; fi
  : >"$fd/cut"
  i=0
  while [ "$(ls "$fd" | grep -c '^result\.')" -lt $N ] && [ $i -lt 750 ]; do sleep 0.02; i=$((i + 1)); done
  eval "$4"
  i=0
  while kill -0 "$mpid" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
  kill "$mpid" 2>/dev/null
  collect 1 $mpid
  if [ "$(cat "$fd"/result.* 2>/dev/null | grep -c '^1 passed, 0 failed')" = $N ]; then
    ok "mpi: $1 ($(( ($(date +%s%N) - t0) / 1000000 )) ms): after the cut $(after_cut "$fd"/result.*); nothing applied$launch"
  else
    bad "mpi: $1: $(ls "$fd" | grep -c '^result\.') of $N verdicts"
    cat "$fd"/result.* 2>/dev/null | head -n 8
    tail -n 20 "$dir/out.0"
  fi
  timed "mpi: resume from the checkpoint after: $1" 1 "$SUMMARY" mpi $N "$build/mpi/test_netns" "$fd" resume
}
if [ $skipped = 0 ]; then
  mpi_fault "rank 1's link down mid-step" 1 'ip -n "$h" link set mv1 down' 'ip -n "$h" link set mv1 up'
  mpi_fault "rank 2's host cut off mid-step (its veth pair deleted)" 2 'ip -n "$h" link del mv2' 'add_host 2'
fi
if [ $skipped -gt 0 ]; then echo "netns: $passed passed, $failed failed, $skipped skipped"
else echo "netns: $passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
