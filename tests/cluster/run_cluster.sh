#!/usr/bin/env bash
# One distrain job on a cluster of network namespaces on this machine (issue #40).
#
#   tests/cluster/run_cluster.sh --distrain build/distrain --relay build/tests/ldc_delay_relay \
#       --out DIR [--namespaces N] [--strategy multi_worker|parameter_server] [--ps M]
#       [--transport tcp|tls] [--rate none|1gbit|10gbit|RATE] [--delay-us D]
#       [--steps S] [--batch-size B] [--epochs E] [--fault none|kill|stop] [--fault-after SEC]
#       [--collective-timeout S] [--time-limit SEC] [--label TEXT] [--results FILE]
#       [--overlap] [--bytes-per-pack B] [--gradient-compression none|bf16|fp16]
#   tests/cluster/run_cluster.sh --probe [--rate R] [--delay-us D] --out DIR ...
#
# What it builds (every name starts with ldc-<id>-, <id> this script's pid):
#   - a hub namespace holding a Linux bridge; one namespace per task (N in all), each with a
#     veth pair whose one end (eth0, 10.213.0.(11+i)/24) is in the task's namespace and whose
#     other end is a port of the bridge in the hub. Nothing is added to the machine's own
#     namespace, and the addresses exist only inside these namespaces.
#   - rate limits (--rate): a tbf qdisc on both ends of every task's veth pair, so each task's
#     link carries at most RATE each way, as a host's NIC would (tbf: no netem on this kernel).
#   - latency (--delay-us D > 0): a namespace ldc-<id>-rly (10.213.0.(101+i), no rate limit)
#     runs tests/cluster/delay_relay.c; the TF_CONFIG names each task by its relay address, the
#     relay forwards to the task after D microseconds each way. So every connection between two
#     tasks crosses the relay: a one-way latency of D plus the relay's own work (and its wait
#     for a core the tasks keep busy; RELAY_FIFO=1 in the environment runs it under
#     SCHED_FIFO instead, docs/scaling.md 11.9).
#   - one distrain process per task namespace, --threads 1, TF_CONFIG and --cluster-token-file,
#     --transport tcp or tls (never auto: the namespaces share /dev/shm and the boot id, and auto
#     would pick shared memory). multi_worker: N workers (worker/0 the chief). parameter_server:
#     a chief, M ps tasks (--ps, default 1) and N - 1 - M workers.
#   - --fault kill|stop: SIGKILL or SIGSTOP the last worker --fault-after seconds after the
#     chief began to train; the others must end with an error naming it within the collective
#     timeout.
#
# --overlap: distrain --overlap-gradients (multi_worker: the gradients all-reduced in buckets
# during the backward pass), with --bytes-per-pack B as the bucket; the chief's summary line
# (all-reduce and exposed milliseconds per pass, the fraction hidden) goes into the result.
# --gradient-compression: the gradients' dtype on the wire (distrain's flag).
#
# Every run is bounded (--time-limit, default 300 s: then every task is killed and the run is
# marked timed_out). Everything is torn down on exit, also on Ctrl-C or an error (trap): the
# tasks and the relay (by pid), then the namespaces, which takes their links and the bridge.
#
# --probe measures the path instead of training: relay_probe.py serves in the second namespace
# and the first sends to it (round trips of 64 bytes, then a 256 MB transfer) at the address
# TF_CONFIG would give, so through the relay when --delay-us is set.
#
# Records one JSON line in --results (default DIR/result.jsonl): the configuration, the chief's
# metrics (steps, train_seconds and step_ms inside the steps, train_wall_seconds and step_wall_ms
# with the waits between them: the period, images/s, test accuracy), bytes on the wire (the sum
# of the tasks' eth0 tx_bytes, total and per step; the relay's, and its CPU seconds,
# relay_cpu_s), the packets each task's rate limits dropped
# (tbf_drops_out: its eth0; tbf_drops_in: its bridge port), every task's exit code, and for a fault the
# error lines naming the lost task and the seconds from the fault to the first survivor's exit.
# Exit status: 0 when the run behaved as expected (no fault: every task exited 0; a fault: the
# survivors failed naming the lost task, before the limit), 1 otherwise, 77 when namespaces
# cannot be created here (not root, no CAP_SYS_ADMIN, no veth/bridge support).
set -uo pipefail

distrain= relay= out= ns_count=4 strategy=multi_worker ps=1 transport=tcp rate=none delay_us=0
steps=200 batch=64 epochs=1 fault=none fault_after=10 coll_timeout=10 time_limit=300 label=
results= probe= overlap= bytes_per_pack= compression=none
while [ $# -gt 0 ]; do
    case $1 in
    --distrain) distrain=$2; shift ;;
    --relay) relay=$2; shift ;;
    --out) out=$2; shift ;;
    --namespaces) ns_count=$2; shift ;;
    --strategy) strategy=$2; shift ;;
    --ps) ps=$2; shift ;;
    --transport) transport=$2; shift ;;
    --rate) rate=$2; shift ;;
    --delay-us) delay_us=$2; shift ;;
    --steps) steps=$2; shift ;;
    --batch-size) batch=$2; shift ;;
    --epochs) epochs=$2; shift ;;
    --fault) fault=$2; shift ;;
    --fault-after) fault_after=$2; shift ;;
    --collective-timeout) coll_timeout=$2; shift ;;
    --time-limit) time_limit=$2; shift ;;
    --label) label=$2; shift ;;
    --results) results=$2; shift ;;
    --overlap) overlap=1 ;;
    --bytes-per-pack) bytes_per_pack=$2; shift ;;
    --gradient-compression) compression=$2; shift ;;
    --probe) probe=1; distrain=${distrain:-/bin/true} ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_cluster.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
    esac
    shift
done
die() { echo "run_cluster.sh: $*" >&2; exit 2; }
[ -x "$distrain" ] || die "--distrain '$distrain' is not an executable"
[ -n "$out" ] || die "--out DIR is required"
case $strategy in multi_worker|parameter_server) ;; *) die "--strategy takes multi_worker or parameter_server" ;; esac
case $transport in tcp|tls) ;; *) die "--transport takes tcp or tls" ;; esac
case $fault in none|kill|stop) ;; *) die "--fault takes none, kill or stop" ;; esac
[[ $rate =~ ^(none|[1-9][0-9]*[mg]bit)$ ]] || die "--rate takes none, NNmbit or NNgbit"
[[ $delay_us =~ ^[0-9]+$ ]] || die "--delay-us takes a whole number of microseconds"
[[ $ns_count =~ ^[0-9]+$ ]] && [ "$ns_count" -ge 2 ] && [ "$ns_count" -le 64 ] ||
    die "--namespaces takes 2 to 64"
if [ "$delay_us" != 0 ]; then [ -x "$relay" ] || die "--delay-us needs --relay (ldc_delay_relay)"; fi
if [ "$strategy" = parameter_server ] && [ $((ns_count - 1 - ps)) -lt 1 ]; then
    die "parameter_server needs a chief, $ps ps and at least one worker: --namespaces >= $((ps + 2))"
fi
mkdir -p "$out" || die "cannot create $out"
out=$(cd "$out" && pwd)
results=${results:-$out/result.jsonl}

id=ldc-$$
hub=$id-hub
rly=$id-rly
declare -a task_ns=() task_pid=() task_name=() made_ns=()
relay_pid=
# Teardown: processes first (a namespace lives on while a process is in it), then namespaces.
cleanup() {
    local p
    for p in "${task_pid[@]}" $relay_pid; do
        [ -n "$p" ] || continue
        kill -KILL "$p" 2>/dev/null
        kill -CONT "$p" 2>/dev/null
    done
    for p in "${task_pid[@]}" $relay_pid; do [ -n "$p" ] && wait "$p" 2>/dev/null; done
    local ns
    for ns in "${made_ns[@]}"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        ip netns del "$ns" 2>/dev/null
    done
    made_ns=()
}
trap cleanup EXIT
trap 'echo "run_cluster.sh: interrupted; tearing down" >&2; exit 130' INT TERM

add_ns() {
    ip netns add "$1" 2>"$out/netns.err" || return 1
    made_ns+=("$1")
    ip -n "$1" link set lo up
}
# Can this process make namespaces at all? (root with CAP_SYS_ADMIN, veth and bridge support)
if ! add_ns "$hub"; then
    echo "run_cluster.sh: SKIP: cannot create a network namespace here ($(head -c 200 "$out/netns.err"));" \
        "the cluster runs need root with CAP_SYS_ADMIN" >&2
    exit 77
fi
if ! ip -n "$hub" link add ldc-br type bridge 2>"$out/netns.err" ||
    ! ip -n "$hub" link set ldc-br up; then
    echo "run_cluster.sh: SKIP: cannot create a bridge ($(head -c 200 "$out/netns.err"))" >&2
    exit 77
fi
# tbf's burst must hold at least a timer tick of data at the rate; 1 ms of it, at least 64 KiB.
burst_for() {
    local r=$1 bps
    case $r in
    *gbit) bps=$(( ${r%gbit} * 1000000000 )) ;;
    *mbit) bps=$(( ${r%mbit} * 1000000 )) ;;
    *) die "--rate takes none, NNmbit or NNgbit" ;;
    esac
    local b=$(( bps / 8 / 1000 ))
    [ $b -lt 65536 ] && b=65536
    echo $b
}
# link NS IP HUBPORT [LIMIT]: a veth pair from NS (eth0, IP/24) to a port of the bridge.
link_ns() {
    local ns=$1 ip=$2 port=$3 limit=$4
    ip -n "$hub" link add "$port" type veth peer name eth0 netns "$ns" || return 1
    ip -n "$hub" link set "$port" master ldc-br up || return 1
    ip -n "$ns" addr add "$ip/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    if [ "$limit" != none ]; then
        local b; b=$(burst_for "$limit")
        ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$limit" burst "$b" latency 50ms || return 1
        ip netns exec "$hub" tc qdisc add dev "$port" root tbf rate "$limit" burst "$b" latency 50ms || return 1
    fi
}
for ((i = 0; i < ns_count; i++)); do
    ns=$id-t$i
    add_ns "$ns" || { echo "run_cluster.sh: ip netns add $ns failed: $(cat "$out/netns.err")" >&2; exit 1; }
    link_ns "$ns" "10.213.0.$((11 + i))" "p$i" "$rate" ||
        { echo "run_cluster.sh: could not link $ns to the bridge" >&2; exit 1; }
    task_ns+=("$ns")
done
port=2222
addr_of() { # the address TF_CONFIG gives task i: the relay's when there is latency
    if [ "$delay_us" != 0 ]; then echo "10.213.0.$((101 + $1)):$port"; else echo "10.213.0.$((11 + $1)):$port"; fi
}
if [ "$delay_us" != 0 ]; then
    add_ns "$rly" || exit 1
    link_ns "$rly" 10.213.0.100 prly none || exit 1
    routes=()
    for ((i = 0; i < ns_count; i++)); do
        ip -n "$rly" addr add "10.213.0.$((101 + i))/24" dev eth0 || exit 1
        routes+=("10.213.0.$((101 + i)):$port=10.213.0.$((11 + i)):$port")
    done
fi

# The relay starts once every task listens (or after 20 s): a connection it accepted for a task
# that is not listening yet could only be closed again, where without the relay the connect is
# refused and retried. (A TLS task that meets such a close in its handshake dies of SIGPIPE:
# OpenSSL's socket BIO writes without MSG_NOSIGNAL.)
listening() { # NS: whether a socket listens on $port there (LISTEN is state 0A in /proc/net/tcp;
    # a task that listens on every interface may hold an IPv6 socket, in /proc/net/tcp6)
    ip netns exec "$1" awk -v p="$(printf ':%04X' $port)" '$2 ~ p"$" && $4 == "0A" { f = 1 } END { exit !f }' \
        /proc/net/tcp /proc/net/tcp6
}
start_relay() { # NS...: the namespaces whose tasks must listen first
    [ "$delay_us" != 0 ] || return 0
    local t ns missing
    for ((t = 0; t < 400; t++)); do
        missing=0
        for ns in "$@"; do listening "$ns" || { missing=1; break; }; done
        [ $missing = 0 ] && break
        sleep 0.05
    done
    # RELAY_FIFO=1: the relay runs under SCHED_FIFO (chrt), so it forwards as soon as data
    # arrive instead of waiting for one of the cores the tasks keep busy
    local prio=()
    [ "${RELAY_FIFO:-0}" = 1 ] && prio=(chrt -f 10)
    ip netns exec "$rly" "${prio[@]}" "$relay" --delay-us "$delay_us" --ready-file "$out/relay.ready" \
        "${routes[@]}" >"$out/relay.log" 2>&1 &
    relay_pid=$!
    for _ in $(seq 100); do [ -s "$out/relay.ready" ] && break; sleep 0.05; done
    [ -s "$out/relay.ready" ] || { echo "run_cluster.sh: the relay did not start: $(cat "$out/relay.log")" >&2; exit 1; }
}
if [ -n "$probe" ]; then
    here=$(cd "$(dirname "$0")" && pwd)
    ip netns exec "${task_ns[1]}" python3 "$here/relay_probe.py" serve $port >"$out/probe_server.log" 2>&1 &
    task_pid+=($!)
    start_relay "${task_ns[1]}" || exit 1
    ip netns exec "${task_ns[0]}" timeout "$time_limit" python3 "$here/relay_probe.py" probe \
        "$(addr_of 1)" >"$out/probe.json" 2>"$out/probe_client.log"
    prc=$?
    cleanup
    [ $prc = 0 ] || { echo "run_cluster.sh: the probe failed: $(tail -3 "$out/probe_client.log")" >&2; exit 1; }
    python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
r = dict({"label": sys.argv[2], "probe": True, "rate": sys.argv[3], "delay_us": int(sys.argv[4])}, **r)
open(sys.argv[5], "a").write(json.dumps(r) + "\n")
print(json.dumps(r))' "$out/probe.json" "$label" "$rate" "$delay_us" "$results"
    exit 0
fi

# The cluster: TF_CONFIG's cluster part and each task's role.
json_list() { local s= a; for a in "$@"; do s+="${s:+,}\"$a\""; done; echo "[$s]"; }
declare -a role=() role_index=()
if [ "$strategy" = multi_worker ]; then
    addrs=(); for ((i = 0; i < ns_count; i++)); do addrs+=("$(addr_of $i)"); role+=(worker); role_index+=($i); done
    cluster="{\"worker\":$(json_list "${addrs[@]}")}"
    victim=$((ns_count - 1))
else
    chief=$(addr_of 0); psa=(); wka=()
    role+=(chief); role_index+=(0)
    for ((i = 1; i <= ps; i++)); do psa+=("$(addr_of $i)"); role+=(ps); role_index+=($((i - 1))); done
    for ((i = ps + 1; i < ns_count; i++)); do wka+=("$(addr_of $i)"); role+=(worker); role_index+=($((i - ps - 1))); done
    cluster="{\"chief\":[\"$chief\"],\"worker\":$(json_list "${wka[@]}"),\"ps\":$(json_list "${psa[@]}")}"
    victim=$((ns_count - 1))
fi
token=$out/token
( umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token" )

common=(--strategy "$strategy" --threads 1 --transport "$transport" --epochs "$epochs"
        --steps-per-epoch "$steps" --batch-size "$batch" --cluster-token-file "$token"
        --collective-timeout "$coll_timeout" --connect-timeout 60)
[ -n "$overlap" ] && common+=(--overlap-gradients)
[ -n "$bytes_per_pack" ] && common+=(--bytes-per-pack "$bytes_per_pack")
[ "$compression" != none ] && common+=(--gradient-compression "$compression")
t_start=$(date +%s.%N)
for ((i = 0; i < ns_count; i++)); do
    tf="{\"cluster\":$cluster,\"task\":{\"type\":\"${role[$i]}\",\"index\":${role_index[$i]}}}"
    name="${role[$i]}/${role_index[$i]}"
    task_name+=("$name")
    extra=()
    [ "$i" = 0 ] && extra=(--metrics-json "$out/metrics.json")
    # The data: the embedded MNIST subset. The cache is this run's own empty folder and the
    # download URL the namespace's own loopback (refused at once), so nothing leaves the machine.
    TF_CONFIG=$tf DIST_CACHE_DIR=$out/cache DIST_MNIST_URL=http://127.0.0.1:9/ ip netns exec "${task_ns[$i]}" "$distrain" "${common[@]}" "${extra[@]}" \
        >"$out/task$i.log" 2>&1 &
    task_pid+=($!)
done

# A parameter_server chief listens nowhere (it connects to the workers and the ps tasks).
if [ "$strategy" = parameter_server ]; then start_relay "${task_ns[@]:1}" || exit 1
else start_relay "${task_ns[@]}" || exit 1; fi

declare -a rc=()
# A child that has exited is a zombie until waited for (kill -0 still succeeds on it).
exited() { local st; st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null); [ -z "$st" ] || [ "$st" = Z ]; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }
fault_t= train_t= victim_name=${task_name[$victim]}
deadline=$(awk -v a="$t_start" -v b="$time_limit" 'BEGIN { printf "%.3f", a + b }')
timed_out=false
first_exit_t=
while :; do
    now=$(date +%s.%N)
    alive=0
    for ((i = 0; i < ns_count; i++)); do
        [ -n "${rc[$i]:-}" ] && continue
        if exited "${task_pid[$i]}"; then
            { wait "${task_pid[$i]}"; } 2>/dev/null; rc[$i]=$?
            if [ -n "$fault_t" ] && [ "$i" != "$victim" ] && [ -z "$first_exit_t" ]; then first_exit_t=$now; fi
        else
            alive=$((alive + 1))
        fi
    done
    # Done when every task exited, or with a fault when every survivor did (a stopped victim
    # never exits by itself).
    survivors_alive=0
    for ((i = 0; i < ns_count; i++)); do
        [ "$i" = "$victim" ] && [ "$fault" != none ] && continue
        [ -z "${rc[$i]:-}" ] && survivors_alive=$((survivors_alive + 1))
    done
    [ "$alive" = 0 ] && break
    [ "$fault" != none ] && [ -n "$fault_t" ] && [ "$survivors_alive" = 0 ] && break
    # Under parameter_server the ps and worker tasks serve until the chief ends, then exit:
    # the job ends with the chief, and the others have 15 s to follow it.
    if [ "$strategy" = parameter_server ] && [ -n "${rc[0]:-}" ]; then
        [ -z "${chief_end:-}" ] && chief_end=$now
        ge "$now" "$(awk -v a="$chief_end" 'BEGIN { printf "%.3f", a + 15 }')" && break
        [ "$fault" != none ] && [ "$survivors_alive" = 0 ] && break
    fi
    # The fault comes --fault-after seconds after the chief has begun to train (its "Epoch 1/"
    # line): the rendezvous of 16 processes on 2 cores takes a varying while.
    if [ "$fault" != none ] && [ -z "$train_t" ] && grep -q "^Epoch 1/" "$out/task0.log"; then
        train_t=$now
    fi
    if [ "$fault" != none ] && [ -z "$fault_t" ] && [ -n "$train_t" ] &&
       ge "$now" "$(awk -v a="$train_t" -v b="$fault_after" 'BEGIN { printf "%.3f", a + b }')" && [ -z "${rc[$victim]:-}" ]; then
        if [ "$fault" = kill ]; then kill -KILL "${task_pid[$victim]}"; else kill -STOP "${task_pid[$victim]}"; fi
        fault_t=$(date +%s.%N)
    fi
    if ge "$now" "$deadline"; then timed_out=true; break; fi
    sleep 0.05
done
t_end=$(date +%s.%N)
# The tasks' bytes on the wire, read before teardown: what each task's eth0 sent.
tx_total=0
for ((i = 0; i < ns_count; i++)); do
    tx=$(ip netns exec "${task_ns[$i]}" cat /sys/class/net/eth0/statistics/tx_bytes)
    tx_total=$((tx_total + tx))
done
relay_tx=0
[ "$delay_us" != 0 ] && relay_tx=$(ip netns exec "$rly" cat /sys/class/net/eth0/statistics/tx_bytes)
# The relay's CPU seconds over the whole job (user + system, from /proc: it is still running),
# set-up and evaluation included: what the model's relay terms price.
relay_cpu=0
if [ -n "$relay_pid" ] && [ -r "/proc/$relay_pid/stat" ]; then
    relay_cpu=$(awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.3f", ($12 + $13) / hz }' \
        "/proc/$relay_pid/stat")
fi
# Packets the rate limits dropped (their queues full: several senders into one link), per
# task: what left its eth0 and what its hub port could not take in.
drops_out=() drops_in=()
qdrops() { ip netns exec "$1" tc -s qdisc show dev "$2" 2>/dev/null |
    awk '/dropped/ { for (i = 1; i < NF; i++) if ($i == "dropped") { gsub(",", "", $(i + 1)); s += $(i + 1) } } END { print s + 0 }'; }
for ((i = 0; i < ns_count; i++)); do
    drops_out+=("$(qdrops "${task_ns[$i]}" eth0)") drops_in+=("$(qdrops "$hub" "p$i")")
done
for ((i = 0; i < ns_count; i++)); do
    if [ -z "${rc[$i]:-}" ]; then
        kill -KILL "${task_pid[$i]}" 2>/dev/null; kill -CONT "${task_pid[$i]}" 2>/dev/null
        { wait "${task_pid[$i]}"; } 2>/dev/null; rc[$i]=$?
    fi
done
cleanup

# The result line.
python3 - "$out" "$results" <<PY
import json, sys, re, os
out, results = sys.argv[1], sys.argv[2]
m = {}
try:
    m = json.load(open(os.path.join(out, "metrics.json")))
except (OSError, ValueError):
    pass
rc = [int(x) for x in "${rc[*]}".split()]
names = "${task_name[*]}".split()
victim = int("$victim")
fault = "$fault"
timed_out = "$timed_out" == "true"
errors = []
named_by = []  # the survivors whose error names the lost task
for i in range(len(rc)):
    if fault != "none" and i == victim:
        continue
    if fault == "none" and rc[i] == 0:
        continue  # a task that succeeded: its retries while the cluster assembled are no error
    try:
        lines = open(os.path.join(out, "task%d.log" % i), errors="replace").read().splitlines()
    except OSError:
        lines = []
    # The line that names the lost task, else the first error line.
    hits = [l for l in lines if not l.startswith("MNIST:") and
            re.search(r"error|lost|no answer|PEER_LOST|TIMEOUT|timed out|failed|refused", l, re.I)]
    named = [l for l in hits if names[victim] in l] if fault != "none" else []
    if named:
        named_by.append(names[i])
    if named or hits:
        errors.append("%s: %s" % (names[i], (named or hits)[0].strip()[:300]))
steps = m.get("steps") or 0
secs = m.get("train_seconds") or 0
wall = m.get("train_wall_seconds") or 0
fault_t = "$fault_t"
first = "$first_exit_t"
vname = names[victim]
expected = False
if fault == "none":
    expected = all(r == 0 for r in rc) and not timed_out
elif not fault_t:
    expected = False  # the job ended before the fault: nothing was tested
    errors.append("the run ended before the fault (--fault-after too long for --steps)")
else:
    survivors = [r for i, r in enumerate(rc) if i != victim]
    named = any(vname in e for e in errors)
    if "$strategy" == "parameter_server" and fault == "kill":
        # A lost ps worker is not fatal: its closure is re-queued; the chief must still finish.
        expected = rc[0] == 0 and not timed_out
    else:
        expected = named and all(r != 0 for r in survivors) and not timed_out
tx = int("$tx_total")
# distrain's chief logs what the overlapped all-reduce did as the strategy goes
ov = None
try:
    for l in open(os.path.join(out, "task0.log"), errors="replace"):
        g = re.search(r"overlap_gradients: replica 0: (\d+) backward passes in (\d+) buckets.*?"
                      r"all-reduce ([0-9.]+) ms per pass, ([0-9.]+) ms of it.*?(\d+)% hidden", l)
        if g:
            ov = {"passes": int(g.group(1)), "buckets": int(g.group(2)),
                  "allreduce_ms_per_pass": float(g.group(3)), "exposed_ms_per_pass": float(g.group(4)),
                  "hidden_pct": int(g.group(5))}
except OSError:
    pass
# each parameter_server worker logs where its closures' time went when the chief shuts it down
phases = {}
if "$strategy" == "parameter_server":
    for i in range(len(rc)):
        try:
            text = open(os.path.join(out, "task%d.log" % i), errors="replace").read()
        except OSError:
            continue
        g = re.search(r"parameter_server (\S+): (\d+) closures; per closure, mean \(most\) in ms: (.*)", text)
        if g:
            d = {"closures": int(g.group(2))}
            for name, mean, most in re.findall(r"([a-z ]+?) ([0-9.]+) \(([0-9.]+)\)", g.group(3)):
                d[name.strip().replace(" ", "_")] = [float(mean), float(most)]
            phases[g.group(1)] = d
line = {
    "label": "$label", "strategy": "$strategy", "namespaces": len(rc), "ps": int("$ps") if "$strategy" == "parameter_server" else 0,
    "transport": "$transport", "rate": "$rate", "delay_us": int("$delay_us"),
    "batch_size": int("$batch"), "steps_asked": int("$steps"), "fault": fault,
    "overlap": "$overlap" == "1", "bytes_per_pack": int("${bytes_per_pack:-0}"), "gradient_compression": "$compression", "overlap_stats": ov,
    "closure_phases_ms": phases or None,
    "steps": steps, "train_seconds": secs, "step_ms": round(1000 * secs / steps, 3) if steps else None,
    "train_wall_seconds": wall, "step_wall_ms": round(1000 * wall / steps, 3) if steps and wall else None,
    "train_images_per_sec": m.get("train_images_per_sec"), "test_accuracy": m.get("test_accuracy"),
    "wall_s": round(float("$t_end") - float("$t_start"), 2),
    "tx_bytes": tx, "tx_bytes_per_step": round(tx / steps) if steps else None,
    "relay_tx_bytes": int("$relay_tx"), "relay_cpu_s": float("$relay_cpu"),
    "relay_fifo": "${RELAY_FIFO:-0}" == "1",
    "tbf_drops_out": dict(zip(names, [int(x) for x in "${drops_out[*]}".split()])),
    "tbf_drops_in": dict(zip(names, [int(x) for x in "${drops_in[*]}".split()])),
    "exit_codes": dict(zip(names, rc)), "timed_out": timed_out,
    "victim": vname if fault != "none" else None,
    "fault_to_first_exit_s": round(float(first) - float(fault_t), 2) if first and fault_t else None,
    "errors": errors[:4], "named_by": named_by, "as_expected": expected,
}
with open(results, "a") as f:
    f.write(json.dumps(line) + "\n")
print(json.dumps(line))
sys.exit(0 if expected else 1)
PY
