#!/usr/bin/env bash
# Tries the README's srun lines on a throwaway one-node Slurm on this machine.
#
# Starts munged (generated key), slurmctld and slurmd from a minimal slurm.conf
# in a temporary folder, waits for the node to be idle, runs the chapter-01
# checker on the mpi backend and dtp-train --strategy ddp under srun, prints a
# report and tears everything down (also on failure or Ctrl-C). Not a CTest
# test: CI does not run it. Needs root (SlurmUser=root for this test only).
set -uo pipefail

usage() {
  cat <<'EOF'
Usage: tools/slurm-check.sh [--build DIR]
       tools/slurm-check.sh --help

Starts a one-node Slurm on localhost (munge, slurmctld, slurmd; everything in a
temporary folder, removed on exit), then runs under srun:
  1. srun --mpi=list                       (which PMI plugins this Slurm has)
  2. the chapter-01 checker, 4 tasks, DTP_BACKEND=mpi, one puzzle's suite
  3. dtp-train --strategy ddp --impl reference, 2 tasks, a few steps
and checks that each exits 0 and prints what it should. Prints one line per
command and its result; exits 0 only if every command passed.

  --build DIR   the build folder with bin/dtp-train and tests/ch01_reference_tests
                (default: build/ next to this script's tools/)
  --help        this text; does nothing else

Runs as root only (it starts daemons as root). Installs slurm-wlm and munge
with apt-get when they are missing. Leaves nothing running: the daemons and
any job step they started are killed by process id on exit.
Environment: SLURM_CHECK_TIMEOUT (seconds per srun command, default 120),
SLURM_CHECK_START_TIMEOUT (seconds for the node to become idle, default 60).
EOF
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$here/build"
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --build) [ $# -ge 2 ] || { echo "slurm-check: --build needs a folder" >&2; exit 2; }
             build="$(cd "$2" 2>/dev/null && pwd)" || { echo "slurm-check: no folder $2" >&2; exit 2; }
             shift 2 ;;
    *) echo "slurm-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "slurm-check: must run as root: it starts munged, slurmctld and slurmd as root" >&2
  echo "             (SlurmUser=root, for this throwaway test cluster only)" >&2
  exit 2
fi

cmd_timeout="${SLURM_CHECK_TIMEOUT:-120}"
start_timeout="${SLURM_CHECK_START_TIMEOUT:-60}"
checker="$build/tests/ch01_reference_tests"
train="$build/bin/dtp-train"
for f in "$checker" "$train" "$build/bin/dtp-train-reference"; do
  [ -x "$f" ] || { echo "slurm-check: $f is missing: build first (./dtp build)" >&2; exit 2; }
done

# --- Packages --------------------------------------------------------------------
missing=()
for tool in slurmctld slurmd srun sinfo scontrol munged; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "slurm-check: missing ${missing[*]}: installing slurm-wlm and munge with apt-get"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge; } \
       >/tmp/slurm-check-apt.log 2>&1; then
    echo "slurm-check: apt-get failed; its output:" >&2
    tail -20 /tmp/slurm-check-apt.log >&2
    exit 1
  fi
fi

# --- Teardown (trap) ----------------------------------------------------------------
tmp="$(mktemp -d /tmp/dtp-slurm-check.XXXXXX)"
chmod 700 "$tmp"
pids=()          # the daemons this script started
report=()        # "PASS|FAIL  what" lines
failures=0

stop_pid() {     # stop_pid PID NAME: TERM, wait up to 10 s, then KILL
  local pid="$1" i
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  echo "slurm-check: $2 (pid $pid) ignored TERM for 10 s: KILL" >&2
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

# Processes started by our slurmd (slurmstepd and the tasks) carry our
# SLURM_CONF in their environment: find them by that, kill them by id.
our_leftovers() {
  local p
  for p in /proc/[0-9]*; do
    p="${p#/proc/}"
    [ "$p" = "$$" ] && continue
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "SLURM_CONF=$tmp/slurm.conf" && echo "$p"
  done
}

teardown() {
  local rc=$? i p
  trap - EXIT INT TERM
  [ -n "${cmd_pid:-}" ] && stop_pid "$cmd_pid" "the running command"   # timeout passes TERM to srun
  if [ -n "${SLURM_CONF:-}" ] && [ -n "${slurmctld_pid:-}" ] && kill -0 "$slurmctld_pid" 2>/dev/null; then
    timeout 10 scancel --user=root >/dev/null 2>&1
    for i in $(seq 1 50); do
      [ -z "$(timeout 5 squeue -h 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    p="${pids[$i]}"; stop_pid "${p%%:*}" "${p#*:}"
  done
  for p in $(our_leftovers); do kill -KILL "$p" 2>/dev/null && echo "slurm-check: killed leftover pid $p"; done
  rm -rf "$tmp"
  local left=""
  for p in "${pids[@]}"; do kill -0 "${p%%:*}" 2>/dev/null && left="$left ${p#*:}(${p%%:*})"; done
  if [ -n "$left" ]; then
    echo "slurm-check: still running:$left" >&2; [ "$rc" -eq 0 ] && rc=1
  elif [ ${#pids[@]} -gt 0 ]; then
    echo "slurm-check: stopped munged, slurmctld and slurmd; removed $tmp"
  fi
  exit "$rc"
}
trap teardown EXIT
trap 'echo "slurm-check: interrupted" >&2; exit 130' INT TERM

show_logs() {
  local f
  for f in "$tmp"/log/*.log; do
    [ -f "$f" ] || continue
    echo "----- $(basename "$f") (last 30 lines) -----"
    tail -30 "$f"
  done
}

# --- munge ----------------------------------------------------------------------
mkdir -p "$tmp"/{munge,log,state,spool,run}
chmod 700 "$tmp"/munge
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$tmp/munge/munge.key"
socket="$tmp/munge/munge.socket"
munged -F --force --key-file="$tmp/munge/munge.key" --socket="$socket" \
  --pid-file="$tmp/munge/munged.pid" --log-file="$tmp/log/munged.log" \
  --seed-file="$tmp/munge/munged.seed" >>"$tmp/log/munged.log" 2>&1 &
pids+=("$!:munged")
for i in $(seq 1 50); do [ -S "$socket" ] && break; sleep 0.2; done
if ! [ -S "$socket" ] || ! munge -S "$socket" -n </dev/null | unmunge -S "$socket" >/dev/null 2>&1; then
  echo "slurm-check: munged did not start (10 s)"; show_logs; exit 1
fi

# --- slurm.conf -------------------------------------------------------------------
free_port() {    # free_port START: the first port from START with nothing listening
  local port="$1"
  while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
  echo "$port"
}
ctld_port="$(free_port 16817)"
slurmd_port="$(free_port $((ctld_port + 1)))"
host="$(hostname -s)"
cpus="$(nproc --all)"
mem_mb="$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)"
export SLURM_CONF="$tmp/slurm.conf"
cat >"$SLURM_CONF" <<EOF
# Written by tools/slurm-check.sh: a throwaway one-node cluster.
ClusterName=dtpcheck
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=check Nodes=$host Default=YES MaxTime=30 State=UP
EOF

slurmctld -D -i -f "$SLURM_CONF" >>"$tmp/log/slurmctld.stderr.log" 2>&1 &
slurmctld_pid=$!
pids+=("$slurmctld_pid:slurmctld")
slurmd -D -f "$SLURM_CONF" -N "$host" >>"$tmp/log/slurmd.stderr.log" 2>&1 &
pids+=("$!:slurmd")

state=""
deadline=$((SECONDS + start_timeout))
while [ $SECONDS -lt $deadline ]; do
  state="$(timeout 5 sinfo -h -n "$host" -o %T 2>/dev/null)"
  [ "$state" = "idle" ] && break
  sleep 1
done
if [ "$state" != "idle" ]; then
  echo "slurm-check: node $host not idle after ${start_timeout} s (state: '${state:-no answer}')"
  timeout 5 scontrol show node "$host" 2>&1 | head -20
  show_logs
  exit 1
fi
echo "slurm-check: one-node Slurm up in $tmp: node $host idle ($cpus CPUs, $mem_mb MB)"

# --- The commands ---------------------------------------------------------------------
# run_check NAME REGEX COUNT [REGEX COUNT ...] -- COMMAND...: passes when
# COMMAND exits 0 within the timeout and each REGEX matches exactly COUNT lines
# of its output (COUNT 0: at least one line).
run_check() {
  local name="$1"; shift
  local specs=() out="$tmp/log/$name.out" rc matches ok=1 why="" seen="" i
  while [ "$1" != "--" ]; do specs+=("$1" "$2"); shift 2; done
  shift
  echo "+ $*"
  # srun waits for resources without end when a request does not fit: the timeout ends it.
  # In the background and waited for, so that Ctrl-C or TERM stops it at once.
  ( cd "$here" && exec timeout -k 10 "$cmd_timeout" "$@" ) >"$out" 2>&1 &
  cmd_pid=$!
  wait "$cmd_pid"
  rc=$?
  cmd_pid=""
  [ "$rc" -eq 0 ] || { ok=0; why="exit $rc"; [ "$rc" -eq 124 ] && why="timed out after $cmd_timeout s"; }
  for ((i = 0; i < ${#specs[@]}; i += 2)); do
    matches="$(grep -cE -- "${specs[i]}" "$out")"
    if { [ "${specs[i+1]}" -eq 0 ] && [ "$matches" -ge 1 ]; } || [ "$matches" -eq "${specs[i+1]}" ]; then
      grep -E -- "${specs[i]}" "$out" | head -1 | cut -c1-100 | sed 's/^/  | /'
      seen="${seen:+$seen, }$matches x /${specs[i]}/"
    else
      ok=0; why="${why:+$why; }$matches line(s) match /${specs[i]}/, wanted ${specs[i+1]/#0/1 or more}"
    fi
  done
  if [ "$ok" -eq 1 ]; then
    report+=("PASS  $name: exit 0; $seen")
  else
    failures=$((failures + 1))
    report+=("FAIL  $name: $why")
    echo "----- output of $name (last 30 lines) -----"; tail -30 "$out"
  fi
}

run_check mpi-list '^[[:space:]]+pmix$' 1 -- srun --mpi=list
echo "  | plugins: $(awk '/^[[:space:]]/ {printf "%s ", $1} /versions available/ {printf "(%s)", $NF}' "$tmp/log/mpi-list.out")"

# The README's srun line for the mpi backend (On GPUs and clusters), with one
# puzzle's suite so it is quick. --overcommit only because this machine has
# fewer cores than tasks. Debian's Open MPI 4.1 needs --mpi=pmix: without it
# (MpiDefault=none) and with --mpi=pmi2 MPI_Init fails ("OMPI was not built
# with SLURM's PMI support").
puzzle="Puzzle1_8_ring_all_reduce"
run_check ch01-mpi '^\[  PASSED  \] [0-9]+ tests?' 4 -- \
  srun --nodes=1 --ntasks=4 --overcommit --mpi=pmix env DTP_BACKEND=mpi \
  "${checker#"$here"/}" "--gtest_filter=$puzzle.*:*/$puzzle.*"

# One MPI world of 2 (not two worlds of 1): one header naming 2 ranks, one summary.
run_check ddp-mpi '^ddp: 2 ranks \(mpi backend\)' 1 '^trained [0-9]+ steps' 1 -- \
  srun --nodes=1 --ntasks-per-node=2 --mpi=pmix env DTP_BACKEND=mpi \
  "${train#"$here"/}" --strategy ddp --impl reference --steps 5

echo
echo "slurm-check report (srun from $(srun --version 2>/dev/null), Open MPI $(ompi_info --parsable 2>/dev/null | awk -F: '/^ompi:version:full:/ {print $4}')):"
for line in "${report[@]}"; do echo "  $line"; done
if [ "$failures" -eq 0 ]; then
  echo "slurm-check: all ${#report[@]} commands passed"
  exit 0
fi
echo "slurm-check: $failures of ${#report[@]} commands failed"
show_logs
exit 1
