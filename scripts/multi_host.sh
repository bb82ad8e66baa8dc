#!/usr/bin/env bash
# Several hosts on one machine: each host a Linux network namespace with a hostname of its own
# (a UTS namespace), joined to the others by a veth link on a bridge, Open MPI over TCP between
# them, the links shaped to an interconnect's bandwidth (and latency, where the kernel has
# netem). A job launched here is, to Open MPI and to xshard, a job over several nodes: ranks
# of one host share memory, ranks of different hosts talk through the network.
#
#   scripts/multi_host.sh check
#       exits 0 when this machine can make the hosts (root, network namespaces, veth
#       links, a bridge), 77 with the reason otherwise (ctest's skip code)
#   scripts/multi_host.sh run [--hosts H] [--rate R] [--latency L] -- COMMAND...
#       makes H hosts (default 2), runs COMMAND with every argument "{mpiexec}" replaced by a
#       launcher taking mpiexec's "-n N program arguments..." (N ranks over the hosts, the
#       first ceil(N/H) on host 1 and so on; "--on 1,3" before the program: over hosts 1 and
#       3 alone), removes the hosts, and exits with COMMAND's
#       status. The environment of COMMAND has XSHARD_MULTI_HOST_DIR (the hosts' state: the
#       launcher, `pids HOST` listing a host's processes).
#   scripts/multi_host.sh up [--hosts H] [--rate R] [--latency L]
#       makes the hosts and prints the launcher's path; `down DIR` removes them.
#
# R is tc's rate (default 10gbit, a cluster's Ethernet); L a delay such as 20us (default
# none; it needs the kernel's sch_netem, without which the script says so and shapes the
# rate alone). Names and the subnet are drawn per instance, so that instances do not meet.
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

# Whether the hosts can be made here; prints the reason when they cannot.
check() {
  if [ "$(id -u)" != 0 ]; then
    echo "multi_host: skipped: making network namespaces needs root" >&2
    return 77
  fi
  for tool in ip tc unshare mpirun; do
    if ! command -v "$tool" >/dev/null; then
      echo "multi_host: skipped: $tool is not installed" >&2
      return 77
    fi
  done
  local probe="xsp$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "multi_host: skipped: this kernel or container refuses network namespaces" >&2
    return 77
  fi
  if ! ip netns exec "$probe" unshare --uts true 2>/dev/null; then
    ip netns del "$probe"
    echo "multi_host: skipped: processes cannot enter a namespace with a hostname of its own" >&2
    return 77
  fi
  ip netns del "$probe"
  if ! ip link add "${probe}a" type veth peer name "${probe}b" 2>/dev/null; then
    echo "multi_host: skipped: this kernel has no veth links" >&2
    return 77
  fi
  ip link del "${probe}a"
  if ! ip link add "${probe}br" type bridge 2>/dev/null; then
    echo "multi_host: skipped: this kernel has no bridges" >&2
    return 77
  fi
  ip link del "${probe}br"
}

hosts=2 rate=10gbit latency=""
parse_shape() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --hosts) hosts=$2; shift 2 ;;
      --rate) rate=$2; shift 2 ;;
      --latency) latency=$2; shift 2 ;;
      --) shift; break ;;
      *) echo "multi_host: unknown option $1" >&2; usage ;;
    esac
  done
  rest=("$@")
  if ! [[ "$hosts" =~ ^[1-9]$ ]]; then
    echo "multi_host: --hosts takes 1 to 9" >&2
    exit 2
  fi
}

# Makes the hosts; sets dir (their state directory).
up() {
  check || exit $?
  local id net
  # An instance's names: xsh<id>, interfaces up to 15 characters; its subnet 10.123.<net>.0/24.
  for _ in $(seq 20); do
    id=$(( (RANDOM % 9000) + 1000 ))
    net=$(( id % 250 ))
    if ! ip link show "xsb$id" >/dev/null 2>&1 &&
      ! ip -o addr show | grep -q " 10\.123\.$net\."; then
      break
    fi
  done
  dir=$(mktemp -d "${TMPDIR:-/tmp}/xshard-multi-host.XXXXXX")
  echo "$id" >"$dir/id"
  ip link add "xsb$id" type bridge
  echo "xsb$id" >>"$dir/links"
  ip addr add "10.123.$net.254/24" dev "xsb$id"
  ip link set "xsb$id" up
  local shaped="rate $rate"
  for h in $(seq "$hosts"); do
    local ns="xsh${id}h$h" here="xsv${id}h$h" there="xsp${id}h$h"
    ip netns add "$ns"
    echo "$ns" >>"$dir/namespaces"
    ip link add "$here" type veth peer name "$there"
    echo "$here" >>"$dir/links"
    ip link set "$there" netns "$ns"
    ip link set "$here" master "xsb$id" up
    ip -n "$ns" addr add "10.123.$net.$h/24" dev "$there"
    ip -n "$ns" link set "$there" up
    ip -n "$ns" link set lo up
    # Each host's outgoing link is shaped: a message between two hosts crosses one.
    if [ -n "$latency" ] &&
      ip netns exec "$ns" tc qdisc add dev "$there" root netem delay "$latency" rate "$rate" \
        2>/dev/null; then
      shaped="rate $rate, delay $latency"
    else
      ip netns exec "$ns" tc qdisc add dev "$there" root tbf rate "$rate" burst 4mb latency 100ms
      if [ -n "$latency" ]; then
        shaped="rate $rate (no delay: this kernel has no sch_netem)"
      fi
    fi
    echo "10.123.$net.$h" >>"$dir/addresses"
  done
  # Open MPI starts its daemon on a host through this agent instead of ssh: the daemon runs in
  # the host's namespace under the host's name, and the ranks it starts inherit both.
  cat >"$dir/agent" <<EOF
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
h=\${1##*.}
shift
exec ip netns exec xsh${id}h\$h unshare --uts sh -c "hostname xshard-host\$h; \$*"
EOF
  # The launcher: mpiexec's "-n N [--oversubscribe] program arguments...", N ranks over the
  # hosts in blocks (over hosts LIST alone with "--on LIST", e.g. --on 1 after host 2 was
  # lost), Open MPI's messages and daemons on this subnet only. Ranks are not bound to
  # cores: every host's daemon sees all of this machine's cores as its own and would bind the
  # first rank of each host to the same core (two ranks spinning on one core answer each
  # other's messages a scheduler slice late: 4 ms instead of 6 us).
  cat >"$dir/mpiexec" <<EOF
#!/bin/bash
set -euo pipefail
n=1
on=\$(seq -s, $hosts)
args=()
while [ \$# -gt 0 ]; do
  case "\$1" in
    -n|-np) n=\$2; shift 2 ;;
    --on) on=\$2; shift 2 ;;
    --oversubscribe) shift ;;
    *) args=("\$@"); break ;;
  esac
done
used=(\${on//,/ })
per=\$(( (n + \${#used[@]} - 1) / \${#used[@]} ))
list=""
for h in "\${used[@]}"; do list="\$list\${list:+,}10.123.$net.\$h:\$per"; done
exec mpirun --oversubscribe --bind-to none --mca plm_rsh_agent "$dir/agent" \\
  --mca oob_tcp_if_include 10.123.$net.0/24 --mca btl_tcp_if_include 10.123.$net.0/24 \\
  --host "\$list" -n "\$n" "\${args[@]}"
EOF
  # pids HOST: the processes running on host HOST (1-based).
  cat >"$dir/pids" <<EOF
#!/bin/sh
exec ip netns pids xsh${id}h\$1
EOF
  chmod +x "$dir/agent" "$dir/mpiexec" "$dir/pids"
  echo "multi_host: $hosts hosts (xshard-host1..$hosts, 10.123.$net.1-$hosts), links $shaped;" \
    "launcher $dir/mpiexec" >&2
}

# Removes the hosts of state directory $1: their processes, namespaces, links and files.
down() {
  local d=$1
  [ -f "$d/id" ] || return 0
  if [ -f "$d/namespaces" ]; then
    for ns in $(cat "$d/namespaces"); do
      ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
      ip netns del "$ns" 2>/dev/null || true
    done
  fi
  if [ -f "$d/links" ]; then
    for l in $(cat "$d/links"); do ip link del "$l" 2>/dev/null || true; done
  fi
  rm -rf "$d"
}

[ $# -ge 1 ] || usage
command=$1
shift
case "$command" in
  check) check ;;
  up)
    parse_shape "$@"
    dir=""
    # Hosts made in part are removed when a step fails; made whole, they are kept.
    trap 'status=$?; [ "$status" = 0 ] || [ -z "$dir" ] || down "$dir"' EXIT
    up
    echo "$dir/mpiexec"
    ;;
  down) down "${1:?down needs the state directory}" ;;
  run)
    parse_shape "$@"
    [ ${#rest[@]} -ge 1 ] || usage
    dir=""
    trap '[ -z "$dir" ] || down "$dir"' EXIT
    trap 'exit 130' INT TERM
    up
    export XSHARD_MULTI_HOST_DIR=$dir
    cmd=()
    for a in "${rest[@]}"; do cmd+=("${a//\{mpiexec\}/$dir/mpiexec}"); done
    status=0
    "${cmd[@]}" || status=$?
    exit "$status"
    ;;
  *) usage ;;
esac
