#!/usr/bin/env bash
# netns-cluster.sh — a multi-host Slurm cluster on one machine: one network namespace per node.
#
# Usage: netns-cluster.sh up N | down | status | nodes
#   up N    N namespaces ${PREFIX}1..N (loopback up, a veth pair to the bridge, address NET.(K+1)/15,
#           own hostname wnK through a UTS namespace, an /etc/hosts line), a bridge in the root
#           namespace at NET.1, then slurm-up.sh: slurmctld in the root namespace (reached at NET.1),
#           one slurmd inside each namespace. Idempotent: what already exists is kept; a missing
#           piece (a killed slurmd, a deleted veth) is put back.
#   down    scancel, stop the daemons (slurm-down.sh), delete namespaces, veths and bridge (and those
#           of a killed weftrun's WEFT_EMULATE_NETNS hosts), remove our
#           /etc/hosts lines and this user's stale /dev/shm/weft-* exchange folders (those whose lock
#           no process holds; folders in use by other jobs are left alone). Safe to run twice.
#   status  what exists: namespaces, addresses, link counters, daemons (exit 1 when not fully up).
#   nodes   prints "name address netns veth" per node (for tests and scripts).
# Env: WEFT_NETNS_PREFIX (weft-n), WEFT_NETNS_NODE_PREFIX (wn), WEFT_NETNS_NET (198.18.0; a /15 of
#      the benchmarking range 198.18.0.0/15, never the machine's own network), WEFT_NETNS_BRIDGE
#      (weftbr0), SLURM_STATE_DIR / SLURM_CONF_DEST as for slurm-up.sh. Must run as root.
set -euo pipefail

PREFIX=${WEFT_NETNS_PREFIX:-weft-n}
NPFX=${WEFT_NETNS_NODE_PREFIX:-wn}
NET=${WEFT_NETNS_NET:-198.18.0}
BR=${WEFT_NETNS_BRIDGE:-weftbr0}
STATE=${SLURM_STATE_DIR:-/tmp/slurm-ci}
HERE=$(cd "$(dirname "$0")" && pwd)
MARK="# weft-netns-cluster"
me="netns-cluster.sh"

need_root() {
  [ "$(id -u)" = 0 ] || { echo "$me: must run as root (network namespaces, veths, /etc/hosts)" >&2; exit 1; }
  command -v ip >/dev/null || { echo "$me: 'ip' not found (apt-get install iproute2)" >&2; exit 1; }
  command -v unshare >/dev/null || { echo "$me: 'unshare' not found (util-linux)" >&2; exit 1; }
}

# Nodes that exist now (namespaces ${PREFIX}K), in order.
existing() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+$" | sed "s/^$PREFIX//" | sort -n; }
veth() { echo "weftv$1"; }  # root-side end of node K's pair (the namespace side is eth0)

hosts_remove() {
  [ -f /etc/hosts ] || return 0
  if grep -q "$MARK" /etc/hosts; then
    # rewrite in place (/etc/hosts may be a bind mount: keep the inode)
    local tmp; tmp=$(mktemp); grep -v "$MARK" /etc/hosts >"$tmp" || true; cat "$tmp" >/etc/hosts; rm -f "$tmp"
  fi
}

node_up() {  # $1 = K
  local k=$1 ns="$PREFIX$1" v; v=$(veth "$1")
  local addr="$NET.$((k + 1))"
  [ -e "/run/netns/$ns" ] || ip netns add "$ns"
  ip -n "$ns" link set lo up
  if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
    ip link del "$v" 2>/dev/null || true
    ip link add "$v" type veth peer name "${v}p"
    ip link set "${v}p" netns "$ns"
    ip -n "$ns" link set "${v}p" name eth0
  fi
  ip link set "$v" master "$BR" 2>/dev/null || true
  ip link set "$v" up
  ip -n "$ns" addr replace "$addr/15" dev eth0
  ip -n "$ns" link set eth0 up
  grep -q "^$addr $NPFX$k $MARK\$" /etc/hosts || echo "$addr $NPFX$k $MARK" >>/etc/hosts
}

cmd_up() {
  local n=${1:-}
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 64 ] || { echo "$me up N: N from 1 to 64 (got '${n}')" >&2; exit 2; }
  need_root
  local t0; t0=$(date +%s.%N)
  # nodes beyond N from an earlier, larger cluster go
  for k in $(existing); do [ "$k" -le "$n" ] || node_down "$k"; done
  ip link show "$BR" >/dev/null 2>&1 || ip link add "$BR" type bridge
  ip addr replace "$NET.1/15" dev "$BR"
  ip link set "$BR" up
  grep -q "^$NET.1 weft-ctl $MARK\$" /etc/hosts || echo "$NET.1 weft-ctl $MARK" >>/etc/hosts
  for k in $(seq 1 "$n"); do node_up "$k"; done
  SLURM_STATE_DIR=$STATE SLURM_NETNS_PREFIX=$PREFIX SLURM_NETNS_NET=$NET SLURM_NODE_PREFIX=$NPFX \
    "$HERE/slurm-up.sh" "$n"
  printf '%s: %d namespace nodes up in %.2fs (bridge %s at %s.1)\n' "$me" "$n" \
    "$(echo "$(date +%s.%N) - $t0" | bc)" "$BR" "$NET"
}

node_down() {  # $1 = K
  local ns="$PREFIX$1" v; v=$(veth "$1")
  # processes still in the namespace (stray tasks, a stopped rank): killed by pid, namespace's own
  if [ -e "/run/netns/$ns" ]; then
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -CONT "$pid" 2>/dev/null || true; kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  fi
  ip link del "$v" 2>/dev/null || true
}

stale_shm() {  # this user's node-exchange folders whose lock nobody holds
  local uid; uid=$(id -u)
  for d in /dev/shm/weft-"$uid"-*; do
    [ -d "$d" ] && [ ! -L "$d" ] || continue
    if [ ! -e "$d/lock" ] || flock -n -x "$d/lock" true 2>/dev/null; then rm -rf -- "$d"; fi
  done
}

cmd_down() {
  need_root
  SLURM_STATE_DIR=$STATE "$HERE/slurm-down.sh" || true
  for k in $(existing); do node_down "$k"; done
  for v in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^weftv[0-9]+$' || true); do
    ip link del "$v" 2>/dev/null || true
  done
  ip link del "$BR" 2>/dev/null || true
  # weftrun's own emulated hosts (WEFT_EMULATE_NETNS=on) of a weftrun that was SIGKILLed
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^weft-e[0-9]+-[0-9]+$' || true); do
    pid=${ns#weft-e}; pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null || ip netns del "$ns" 2>/dev/null || true
  done
  for b in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | grep -E '^weftb[0-9]+$' || true); do
    kill -0 "${b#weftb}" 2>/dev/null || ip link del "$b" 2>/dev/null || true
  done
  hosts_remove
  stale_shm
  echo "$me: down"
}

cmd_nodes() {
  for k in $(existing); do echo "$NPFX$k $NET.$((k + 1)) $PREFIX$k $(veth "$k")"; done
}

cmd_status() {
  local ok=0 ks; ks=$(existing)
  [ -n "$ks" ] || { echo "$me: no namespace nodes"; exit 1; }
  ip -br addr show "$BR" 2>/dev/null || { echo "bridge $BR: missing"; ok=1; }
  for k in $ks; do
    local v; v=$(veth "$k")
    local a; a=$(ip -n "$PREFIX$k" -br -4 addr show eth0 2>/dev/null | awk '{print $3}')
    local pidf="$STATE/slurmd-$NPFX$k.pid" d=down
    [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null && d="up (pid $(cat "$pidf"))"
    [ "${d%% *}" = up ] || ok=1
    printf '%s%s  %s  %s  veth %s rx %s tx %s  slurmd %s\n' "$NPFX" "$k" "$PREFIX$k" "${a:-no address}" "$v" \
      "$(cat /sys/class/net/"$v"/statistics/rx_bytes 2>/dev/null || echo -)" \
      "$(cat /sys/class/net/"$v"/statistics/tx_bytes 2>/dev/null || echo -)" "$d"
  done
  if [ -f "$STATE/slurmctld.pid" ] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null; then
    sinfo -N 2>/dev/null || true
  else
    echo "slurmctld: down"; ok=1
  fi
  exit $ok
}

case "${1:-}" in
  up) cmd_up "${2:-}" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  nodes) cmd_nodes ;;
  *) echo "usage: $me up N | down | status | nodes" >&2; exit 2 ;;
esac
