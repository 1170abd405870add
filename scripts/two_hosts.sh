#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair (192.0.2.1 and 192.0.2.2, the
# documentation range: nothing routes out of the namespaces), each with a host name of its own, and OpenMPI
# over TCP between them. Then:
#   1. train_llama at dp 2 x tp 2, two ranks per host, must print the same losses as on one host;
#   2. with the link taken down mid-run, every rank and mpiexec must end, with an error and a non-zero exit,
#      within the timeout plus a margin: never a hang.
# Needs root (namespaces, veth); where namespaces cannot be made, it says why and fails. Everything it made is
# removed on every way out.
#
#   ctest -R two_hosts      # or: scripts/two_hosts.sh path/to/train_llama [steps]
# Run by hand, the environment must be that of the other MPI tests (OMPI_ALLOW_RUN_AS_ROOT=1 and so on).
set -euo pipefail

train=$(realpath "${1:?usage: two_hosts.sh path/to/train_llama [steps]}")
steps=${2:-30}
limit=5   # SHARDWISE_TIMEOUT of the link-down run, in seconds
margin=60 # the link-down run must be over within limit + margin seconds of the link going down

tag=$$
ns_a=sw-hostA-$tag ns_b=sw-hostB-$tag
veth_a=swA$tag veth_b=swB$tag # at most 15 characters
addr_a=192.0.2.1 addr_b=192.0.2.2
work=$(mktemp -d /tmp/sw-two-hosts.XXXXXX)

fail() {
  echo "two_hosts: FAILED: $*" >&2
  exit 1
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }
seconds() { printf '%d.%01d' $(($1 / 1000)) $(($1 % 1000 / 100)); }
left_in() { ip netns pids "$1" 2>/dev/null | xargs -r ps -o pid=,args= -p || true; }

# Every way out: kill what still runs in the namespaces (only this script's processes run there), then
# delete them, which takes the veth pair along; then check that nothing of this run is left.
cleanup() {
  local rc=$? ns pids
  set +e
  for ns in "$ns_a" "$ns_b"; do
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
    if ((${#pids[@]})); then
      echo "two_hosts: killing what is left in $ns: $(left_in "$ns" | tr '\n' ';')"
      kill -9 "${pids[@]}"
    fi
  done
  for ns in "$ns_a" "$ns_b"; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      if [[ -z $(ip netns pids "$ns" 2>/dev/null) ]]; then break; fi
      sleep 0.2
    done
    ip netns pids "$ns" >/dev/null 2>&1 && ip netns del "$ns"
  done
  rm -rf "$work"
  if ip netns list | grep -q -- "-$tag\b" || ip -o link | grep -q "sw[AB]$tag\b"; then
    echo "two_hosts: FAILED to remove the namespaces or links of this run" >&2
    rc=1
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for tool in ip unshare mpiexec timeout; do
  command -v "$tool" >/dev/null ||
    fail "$tool is not installed (ip: iproute2, unshare: util-linux, mpiexec: openmpi-bin)"
done

# --- the two hosts ---------------------------------------------------------------------------------------
if ! why=$(ip netns add "$ns_a" 2>&1); then
  fail "cannot create a network namespace: $why. This test needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and" \
    "network namespaces in the kernel; it is not skipped, since it could then never show anything"
fi
ip netns add "$ns_b"
ip link add "$veth_a" netns "$ns_a" type veth peer name "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a"
ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b"
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up
  # TCP gives up on unacknowledged data after ~6 s instead of ~15 min (the default of 15 retries): once the
  # link is dead, mpiexec's order to kill the job never reaches the other host, and only this ends the wait.
  ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_retries2=4
done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up

# OpenMPI starts its daemon on the other host through an "ssh": this one runs the command line inside host
# B's network namespace with a host name of its own (a UTS namespace), so OpenMPI sees two hosts and never
# joins ranks of different hosts through shared memory. Like ssh, it hands the words to a shell.
cat >"$work/rsh" <<EOF
#!/bin/sh
[ "\$1" = "$addr_b" ] || { echo "two_hosts rsh: no host \$1 here" >&2; exit 255; }
shift
exec ip netns exec $ns_b unshare --uts sh -c "hostname host-b && \$*"
EOF
chmod +x "$work/rsh"

# mpiexec runs on host A; two ranks per host; MPI's and OpenMPI's own traffic only over the veth pair. The
# keepalives let each side's runtime notice a dead, idle link in 9 to 19 s rather than 8 minutes, and later than
# the ranks' own timeout, so the ranks' errors come first.
two_hosts=(ip netns exec "$ns_a" unshare --uts sh -c 'hostname host-a && exec "$@"' sh
  mpiexec --host "$addr_a:2,$addr_b:2" -n 4 --oversubscribe --bind-to none
  --mca plm_rsh_agent "$work/rsh"
  --mca btl 'self,vader,tcp' --mca btl_tcp_if_include 192.0.2.0/24 --mca oob_tcp_if_include 192.0.2.0/24
  --mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 3 --mca oob_tcp_keepalive_probes 3)
one_host=(mpiexec -n 4 --oversubscribe --bind-to none)
link_bytes() { ip netns exec "$ns_a" cat "/sys/class/net/$veth_a/statistics/tx_bytes"; }

# --- 1. the same losses on two hosts as on one -----------------------------------------------------------
losses() { # the step lines without their tokens/s, the summary, and the final loss with every digit
  grep -E '^(step |MPI on |final loss )' "$1" | sed -E 's/ +[0-9]+ tokens\/s$//'
}
start=$(now_ms)
timeout -k 10 300 "${one_host[@]}" "$train" "$steps" >"$work/one.txt" 2>&1 ||
  { cat "$work/one.txt"; fail "the one-host run failed"; }
one_ms=$(($(now_ms) - start))
echo "== one host: mpiexec -n 4, $(seconds $one_ms) s"
cat "$work/one.txt"

sent=$(link_bytes)
start=$(now_ms)
timeout -k 10 300 "${two_hosts[@]}" "$train" "$steps" >"$work/two.txt" 2>&1 ||
  { cat "$work/two.txt"; fail "the two-host run failed"; }
two_ms=$(($(now_ms) - start))
sent=$(($(link_bytes) - sent))
echo "== two hosts: 2 ranks on $addr_a + 2 on $addr_b over TCP, $(seconds $two_ms) s," \
  "$((sent / 1000)) kB sent by host A"
cat "$work/two.txt"

[[ $(losses "$work/one.txt" | grep -c '^final loss ') -eq 1 ]] || fail "the one-host run printed no final loss"
[[ $sent -gt 1000000 ]] || fail "only $sent bytes crossed the link: the ranks did not train across the two hosts"
diff <(losses "$work/one.txt") <(losses "$work/two.txt") || fail "the losses on two hosts differ from one host's"
echo "two_hosts: the losses on two hosts equal one host's ($(losses "$work/one.txt" | wc -l) lines compared)"

# --- 2. the link taken down mid-run ----------------------------------------------------------------------
# A short timeout and more steps than it can take; the link goes down a second after rank 0 printed its first
# step, when both hosts are training. Each rank writes its output to a file of its own, on its own host, so
# that host B's errors are seen even though they cannot reach mpiexec any more.
SHARDWISE_TIMEOUT=$limit timeout -k 10 $((limit + margin + 60)) "${two_hosts[@]}" -x SHARDWISE_TIMEOUT \
  --output-filename "$work/ranks" "$train" 100000 >"$work/down.txt" 2>&1 &
run=$!
for _ in $(seq 600); do
  grep -qs '^step ' "$work/down.txt" && break
  kill -0 "$run" 2>/dev/null || break
  sleep 0.1
done
grep -qs '^step ' "$work/down.txt" || { cat "$work/down.txt"; fail "the link-down run printed no step line"; }
sleep 1
ip -n "$ns_a" link set "$veth_a" down
down=$(now_ms)
deadline=$((down + (limit + margin) * 1000))

# Over when mpiexec has ended and nothing runs in either namespace any more (ranks, host B's daemon); the
# time when the last rank ended is noted on the way.
in_both() { ip netns pids "$ns_a"; ip netns pids "$ns_b"; }
ranks_ms='' rank_name=$(basename "$train" | cut -c1-15) # as ps shows a command
while [[ $(now_ms) -lt $deadline ]]; do
  if [[ -z $ranks_ms ]] && ! in_both | xargs -r ps -o comm= -p | grep -qx "$rank_name"; then
    ranks_ms=$(($(now_ms) - down))
  fi
  kill -0 "$run" 2>/dev/null || [[ -n $(in_both) ]] || break
  sleep 0.1
done
took=$(($(now_ms) - down))
[[ -n $ranks_ms || -n $(in_both) ]] || ranks_ms=$took
ended=yes rc=0
if kill -0 "$run" 2>/dev/null; then ended=no; else wait "$run" || rc=$?; fi
echo "== link down: the last rank ended $([[ -n $ranks_ms ]] && echo "$(seconds "$ranks_ms") s after" ||
  echo "not within $(seconds $took) s of") the link going down; all over in $(seconds $took) s; mpiexec ended:" \
  "$ended, exit $rc"
cat "$work/down.txt"
# What each rank wrote: its own timeout error, else OpenMPI's error (its TCP link failed inside MPI), else
# nothing (OpenMPI ended it when a peer's error ended the job).
errors=0 openmpi=0
for rank in 0 1 2 3; do
  out=$(cat "$work"/ranks/*/rank.$rank/stderr 2>/dev/null || true)
  said=$(grep -E '^shardwise: ' <<<"$out" | head -1 | cut -c1-200 || true)
  if [[ -n $said ]]; then
    errors=$((errors + 1))
  else
    said=$(grep -v '^[[:space:]-]*$' <<<"$out" | head -1 | cut -c1-200 || true)
    if [[ -n $said ]]; then openmpi=$((openmpi + 1)); fi
  fi
  echo "rank $rank ($([[ $rank -lt 2 ]] && echo host A || echo host B)): ${said:-nothing}"
done
for ns in "$ns_a" "$ns_b"; do
  [[ -z $(ip netns pids "$ns") ]] || fail "still running in $ns $(seconds $took) s after the link went down:" \
    "$(left_in "$ns" | tr '\n' ';')"
done
[[ $ended == yes ]] || fail "mpiexec still runs $(seconds $took) s after the link went down (a hang)"
[[ $rc -ne 0 && $rc -ne 124 && $rc -ne 137 ]] || fail "mpiexec exited with $rc, not with an error of its own"
# Some rank's timeout error names who did not arrive, or the watchdog of a rank caught in an agreed call's data
# phase names the call it waited in, or OpenMPI reports the dead link (a TCP connection timed out, or mpiexec
# lost the other host's daemon) when every rank was inside MPI's own transfer. grep reads it all (no -q): under
# pipefail, grep -q's early exit would end cat with SIGPIPE and fail the pipeline although the line is there.
cat "$work/down.txt" "$work"/ranks/*/rank.*/std* 2>/dev/null |
  grep -E '^shardwise: rank [0-9]+ ends the job|^shardwise: rank [0-9]+ of mesh axis "[^"]*": [a-z_]+ did not finish within the timeout|Connection timed out|lost communication with a remote daemon' >/dev/null ||
  fail "no rank's error and no error of OpenMPI about the link is in the output"
echo "two_hosts: with the link down, the ranks ended in $(seconds "$ranks_ms") s, mpiexec (exit $rc) and host B's" \
  "daemon in $(seconds $took) s; $errors of 4 ranks wrote a shardwise error, $openmpi only OpenMPI's, the others" \
  "were ended with the job"
