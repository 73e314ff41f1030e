#!/bin/bash
# Several hosts on one machine: each host is a network namespace with its own address and
# host name (node0, node1), joined through a bridge in a third namespace (no address or
# interface is added to the machine's own namespace). mpirun runs in node0 and starts node1's
# daemon through a launch agent that enters node1's namespace where a cluster would use ssh
# (docs/launching.md, "Several hosts"). Checks, all over TCP between the hosts:
#   - TP 2 x DP 2 on two hosts logs the losses of the same layout on one host, with the
#     data-parallel groups across the hosts (--map-by slot) and with the tensor-parallel ones
#     (--map-by node);
#   - a host whose processes are all killed (its MPI daemon too), and a host whose link goes
#     down, end the job within 60 s, with rank 0's start-up line naming the ranks on each host
#     and a line naming the lost host (a waiting rank's, with the rank it waited on, or
#     mpirun's).
#   bash tests/comm/multihost_check.sh [BUILD_DIR]     (default: build; ctest: mpi.MultiHost)
# Needs root (ip netns, veth, bridge, unshare --uts) and Open MPI; where these are missing or
# not permitted it prints "skip: <why>" and exits 77. Prints one PASS/FAIL line per check and
# the output of each failure; exits 1 if any failed. Takes 40 s here (70 s on a loaded
# machine), of which the loss checks 15 to 35 s.
set -u
build=$(cd "${1:-build}" && pwd)
omnitron=$build/omnitron
mpirun=${MPIRUN:-mpirun}
skip() {
  echo "skip: $*"
  exit 77
}
[[ -x $omnitron ]] || { echo "FAIL: no $omnitron (build the omnitron target)"; exit 1; }
[[ $(id -u) == 0 ]] || skip "network namespaces need root (running as uid $(id -u))"
for tool in ip unshare "$mpirun" timeout; do
  command -v $tool >/dev/null || skip "$tool is not installed"
done
$mpirun --version 2>/dev/null | grep -qE "Open MPI|OpenRTE|open-mpi" || skip "mpirun is not Open MPI's (its rsh agent option is used)"

tag=omh$$
# What a run killed without its trap (SIGKILL, e.g. ctest's timeout) left behind.
for ns in $(ip netns list 2>/dev/null | grep -oE '^omh[0-9]+-[a-z0-9]+'); do
  owner=${ns#omh}
  if ! kill -0 "${owner%%-*}" 2>/dev/null; then
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [[ -n $pids ]] && kill -9 $pids 2>/dev/null
    ip netns delete "$ns" 2>/dev/null
  fi
done
work=$(mktemp -d)
namespaces=()
# Ends what runs in the namespaces (they are ours), then removes them: on every exit.
cleanup() {
  local ns pids
  for ns in "${namespaces[@]}"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [[ -n $pids ]] && kill -9 $pids 2>/dev/null
  done
  for ns in "${namespaces[@]}"; do ip netns delete "$ns" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

add_ns() {
  ip netns add "$1" 2>"$work/err" || skip "ip netns add is not permitted here: $(cat "$work/err")"
  namespaces+=("$1")
}
add_ns $tag-sw
ip -n $tag-sw link add br0 type bridge 2>"$work/err" || skip "no bridge device: $(cat "$work/err")"
ip -n $tag-sw link set br0 up
hosts=(node0 node1)
for i in "${!hosts[@]}"; do
  ns=$tag-${hosts[i]}
  add_ns "$ns"
  ip -n $tag-sw link add p$i type veth peer name eth0 netns "$ns" 2>"$work/err" ||
    skip "no veth pair: $(cat "$work/err")"
  ip -n $tag-sw link set p$i master br0 up
  ip -n "$ns" addr add 10.231.0.$((i + 1))/24 dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  echo "${hosts[i]} slots=2" >>"$work/hostfile"
done
ip netns exec $tag-node0 unshare --uts true 2>"$work/err" ||
  skip "unshare --uts is not permitted here: $(cat "$work/err")"
# node1 answers (a refused connection) once the bridge forwards.
for ((t = 0; t < 50; t++)); do
  ip netns exec $tag-node0 timeout 1 bash -c 'exec 3<>/dev/tcp/10.231.0.2/9' 2>&1 |
    grep -q refused && break
  sleep 0.1
done

# The launch agent: "agent HOST COMMAND..." runs COMMAND on HOST as ssh would (through a
# shell), in HOST's network namespace and under its host name.
cat >"$work/agent" <<EOF
#!/bin/bash
host=\$1
shift
exec ip netns exec $tag-\$host unshare --uts /bin/sh -c 'hostname "\$0" && exec /bin/sh -c "\$1"' "\$host" "\$*"
EOF
chmod +x "$work/agent"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI notices a silent host through TCP keepalive on its daemons' connections; its
# default (300 s idle, then 9 probes 20 s apart) is 8 minutes.
keepalive=(--mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2
  --mca oob_tcp_keepalive_probes 3)
# on_node0 ARGS...: runs ARGS in node0's namespace under its host name.
on_node0() {
  ip netns exec $tag-node0 unshare --uts /bin/sh -c 'hostname node0 && exec "$@"' sh "$@"
}
# mpirun_job OUT MPIRUN-OPTIONS... -- TRAIN-FLAGS...: 4 ranks, TP 2, output in OUT.
mpirun_job() {
  local out=$1 opts=()
  shift
  while [[ $1 != -- ]]; do opts+=("$1"); shift; done
  shift
  on_node0 timeout -k 5 90 "$mpirun" -np 4 --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 \
    -x OMP_WAIT_POLICY=passive "${keepalive[@]}" "${opts[@]}" "$omnitron" train --mock-data \
    --vocab-size 64 --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 \
    --micro-batch-size 2 --global-batch-size 8 --lr 3e-3 --log-interval 1 --eval-interval 0 \
    --eval-iters 0 --seed 5 --max-new-tokens 0 --no-progress --tensor-model-parallel-size 2 \
    "$@" >"$out" 2>&1
}
two_hosts=(--hostfile "$work/hostfile" --mca plm_rsh_agent "$work/agent")

failed=0
fail() {
  echo "FAIL $1"
  sed 's/^/    /' "$2" | grep -v '^     iteration' | tail -n 30
  failed=1
}
losses() { grep -o '"lm_loss": [^,]*' "$1" 2>/dev/null; }

echo "multihost check: hosts ${hosts[*]} (namespaces $tag-*), $omnitron"
iters=4
mpirun_job "$work/one.out" -- --train-iters $iters --metrics-file "$work/one.jsonl"
if [[ $(losses "$work/one.jsonl" | wc -l) != "$iters" ]]; then
  fail "TP 2 x DP 2 on one host: expected $iters losses" "$work/one.out"
fi
# Rank 0 says where the ranks run (--map-by slot fills node0 first; node alternates).
declare -A placed=([slot]="node0 (ranks 0-1), node1 (ranks 2-3)" [node]="node0 (ranks 0,2), node1 (ranks 1,3)")
for map in slot node; do
  across=$([[ $map == slot ]] && echo "data-parallel" || echo "tensor-parallel")
  start=$SECONDS
  mpirun_job "$work/$map.out" "${two_hosts[@]}" --map-by $map -- --train-iters $iters \
    --metrics-file "$work/$map.jsonl"
  if ! grep -qxF "omnitron: 4 ranks on 2 hosts: ${placed[$map]}" "$work/$map.out"; then
    fail "--map-by $map: no line 'omnitron: 4 ranks on 2 hosts: ${placed[$map]}'" "$work/$map.out"
  elif [[ -n $(losses "$work/one.jsonl") && $(losses "$work/$map.jsonl") == $(losses "$work/one.jsonl") ]]; then
    echo "PASS TP 2 x DP 2 on two hosts, $across groups across them: the $iters losses of one host ($((SECONDS - start)) s)"
  else
    fail "TP 2 x DP 2 on two hosts ($across groups across them): losses differ from one host's:
$(paste <(losses "$work/one.jsonl") <(losses "$work/$map.jsonl"))" "$work/$map.out"
  fi
done

# lose NAME MAP COMMAND...: a long run across the hosts; once it trains, COMMAND takes node1
# away. The job must end within 60 s, and its output must name node1 as the host lost: the
# line of a rank that waited on a rank there (ours, printed as mpirun ends the job; Open MPI
# 4.1's mpirun drops it in about a third of the runs) or mpirun's own ("Remote daemon ... on
# node node1"), with rank 0's start-up line saying which ranks ran there.
lose() {
  local name=$1 map=$2 out=$work/lose.out metrics=$work/lose.jsonl
  shift 2
  rm -f "$metrics"
  mpirun_job "$out" "${two_hosts[@]}" --map-by $map -- --train-iters 100000 \
    --metrics-file "$metrics" &
  local job=$!
  for ((t = 0; t < 600 && $(losses "$metrics" | wc -l) < 2; t++)); do sleep 0.1; done
  local lost=$SECONDS trained
  trained=$(losses "$metrics" | wc -l)
  "$@"
  wait $job
  local rc=$? took=$((SECONDS - lost))
  if ((trained < 2)); then
    fail "$name: the job did not train across the hosts within 60 s (exit status $rc)" "$out"
  elif ((rc == 0 || rc == 124 || rc == 137 || took > 60)); then
    fail "$name: the job should end within 60 s with an error; exit status $rc after $took s" "$out"
  elif ! grep -qE "^omnitron: 4 ranks on 2 hosts: .*node1 \(ranks [0-9,-]+\)" "$out"; then
    fail "$name: rank 0 did not say which ranks run on node1 (exit status $rc after $took s)" "$out"
  else
    local ours theirs
    ours=$(grep -E "^omnitron \[rank [0-9]+ of 4, host node0\]: .*ranks on other hosts are [0-9]+ on node1" "$out" | head -n 1)
    theirs=$(grep -E "Remote daemon.* on node node1" "$out" | head -n 1)
    if [[ -z $ours && -z $theirs ]]; then
      fail "$name: nothing names node1 as lost (exit status $rc after $took s)" "$out"
    else
      echo "PASS $name: the job ended $took s later, naming node1:"
      local shown=("$(grep -E "^omnitron: 4 ranks" "$out")")
      [[ -n $ours ]] && shown+=("$ours")
      [[ -n $theirs ]] && shown+=("mpirun: $(echo $theirs)")
      printf '    %s\n' "${shown[@]}"
    fi
  fi
}
kill_node1() { kill -9 $(ip netns pids $tag-node1); }
lose "node1's processes killed (its MPI daemon too)" slot kill_node1
lose "node1's link down" node ip -n $tag-node1 link set eth0 down
exit $failed
