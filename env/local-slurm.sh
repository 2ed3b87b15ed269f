#!/usr/bin/env bash
# A real SLURM cluster on this machine, for the `slurm` test tier and for trying jobs locally:
# Debian's slurm-wlm, slurmctld + 3 slurmd ("nodes" n1..n3) on 127.0.0.1, no munge.
#   env/local-slurm.sh install          apt-get install the daemons and clients (needs root)
#   env/local-slurm.sh start DIR        write DIR/slurm.conf, start the daemons, wait for idle nodes
#   env/local-slurm.sh stop DIR         stop the daemons started from DIR
#   env/local-slurm.sh status DIR       sinfo for the cluster in DIR
# Clients find the cluster through SLURM_CONF=DIR/slurm.conf (start prints the export line).
set -euo pipefail

cmd="${1:-}"
dir="${2:-}"
port_base="${RFT_SLURM_PORT:-17800}"
gpus="${RFT_SLURM_GPUS_PER_NODE:-4}"
nodes=(n1 n2 n3)

die() { echo "local-slurm: $*" >&2; exit 2; }
need_dir() { [ -n "$dir" ] || die "usage: $0 $cmd DIR"; mkdir -p "$dir"; dir="$(cd "$dir" && pwd)"; }

install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null; then
    echo "local-slurm: slurm-wlm already installed ($(dpkg-query -W -f='${Version}' slurm-client 2>/dev/null))"; return
  fi
  [ "$(id -u)" = 0 ] || die "installing slurm-wlm needs root: sudo apt-get install slurmctld slurmd slurm-client"
  echo "local-slurm: installing slurmctld slurmd slurm-client (Debian slurm-wlm)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client >/dev/null
}

write_conf() {
  local cpus mem
  cpus="$(nproc)"
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / ${#nodes[@]} / 2 ))
  mkdir -p "$dir/state" "$dir/log"
  cat > "$dir/slurm.conf" <<EOF
ClusterName=rftlocal
SlurmctldHost=localhost
SlurmctldPort=$port_base
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=10
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
GresTypes=gpu
EOF
  # "GPUs" without devices: the nodes look like a GPU cluster's, so job scripts that ask for
  # GPUs run unchanged; the workers find no CUDA device and use their CPU paths.
  echo "AutoDetect=off" > "$dir/gres.conf"
  for n in "${nodes[@]}"; do
    mkdir -p "$dir/dev-$n"
    for g in $(seq 0 $((gpus - 1))); do : > "$dir/dev-$n/gpu$g"; done
    echo "NodeName=$n Name=gpu File=$dir/dev-$n/gpu[0-$((gpus - 1))]" >> "$dir/gres.conf"
  done
  local i=1
  for n in "${nodes[@]}"; do
    echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((port_base + i)) CPUs=$cpus RealMemory=$mem Gres=gpu:$gpus State=UNKNOWN" >> "$dir/slurm.conf"
    i=$((i + 1))
  done
  echo "PartitionName=debug Nodes=$(IFS=,; echo "${nodes[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4" >> "$dir/slurm.conf"
}

start() {
  need_dir
  command -v slurmctld >/dev/null || die "slurm-wlm is not installed: run '$0 install' first"
  export SLURM_CONF="$dir/slurm.conf"
  if [ -f "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    echo "local-slurm: already running from $dir"
  else
    write_conf
    slurmctld -f "$SLURM_CONF" -c -i
    for n in "${nodes[@]}"; do slurmd -f "$SLURM_CONF" -N "$n" -c; done
  fi
  for _ in $(seq 1 60); do
    if [ "$(sinfo -h -o '%t' 2>/dev/null | sort -u | tr -d '\n')" = "idle" ]; then
      echo "local-slurm: ${#nodes[@]} nodes idle; use: export SLURM_CONF=$SLURM_CONF"
      return
    fi
    sleep 1
  done
  sinfo >&2 || true
  tail -20 "$dir/log/slurmctld.log" >&2 || true
  die "nodes did not come up within 60 s (logs in $dir/log)"
}

stop() {
  need_dir
  if [ -f "$dir/slurmctld.pid" ] && kill -0 "$(cat "$dir/slurmctld.pid")" 2>/dev/null; then
    # Cancel jobs first: job steps outlive a killed slurmd.
    SLURM_CONF="$dir/slurm.conf" scancel --quiet --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 1 30); do
      [ -z "$(SLURM_CONF="$dir/slurm.conf" squeue -h -t R,CG 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  for pidfile in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid; do
    [ -f "$pidfile" ] || continue
    pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
  echo "local-slurm: stopped ($dir)"
}

case "$cmd" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) need_dir; SLURM_CONF="$dir/slurm.conf" sinfo ;;
  *) sed -n '2,8p' "$0"; exit 2 ;;
esac
