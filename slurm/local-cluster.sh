#!/usr/bin/env bash
# A real single-node Slurm cluster (with accounting) on this machine, for tests and CI.
#
#   bash slurm/local-cluster.sh up      install if missing, start munge, MariaDB, slurmdbd,
#                                       slurmctld and slurmd; wait until the node is idle
#   bash slurm/local-cluster.sh check   ping, node state, accounting, and one job through sbatch+sacct
#   bash slurm/local-cluster.sh down    cancel jobs, stop every daemon by its pid file, remove state
#
# Needs root (it installs Debian packages and writes /etc/slurm) on Debian bookworm; no systemd needed.
# Every daemon's state, logs and pid file live under one folder, $SOLBENCH_SLURM_DIR
# (default /tmp/solbench-slurm). `up` is idempotent: a healthy cluster is left alone, a half-started
# one is torn down and started fresh (a fresh accounting database each time: job ids restart at 1).
# `down` stops only the daemons this script started (by pid file, never by name).
#
# Knobs (environment): SOLBENCH_SLURM_DIR, SOLBENCH_SLURM_CPUS (CPUs the node advertises, default 8:
# more than the machine has, so that several light test jobs run at once), SOLBENCH_SLURM_CLUSTER
# (cluster name, default solbench).
set -euo pipefail

STATE_DIR="${SOLBENCH_SLURM_DIR:-/tmp/solbench-slurm}"
NODE_CPUS="${SOLBENCH_SLURM_CPUS:-8}"
CLUSTER="${SOLBENCH_SLURM_CLUSTER:-solbench}"
CONF_DIR=/etc/slurm
DB_SOCKET="$STATE_DIR/mysql/mysqld.sock"
MUNGE_SOCKET=/run/munge/munge.socket.2
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server mariadb-client)

log() { printf '[local-cluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# wait_for SECONDS DESCRIPTION COMMAND... : poll COMMAND every 0.5 s until it succeeds.
wait_for() {
    local seconds=$1 what=$2; shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "timed out after ${seconds}s waiting for $what"
            return 1
        fi
        sleep 0.5
    done
}

pid_alive() {  # pid_alive PIDFILE
    [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v slurmdbd >/dev/null || missing+=(slurmdbd)
    command -v munged >/dev/null || missing+=(munge)
    command -v mariadbd >/dev/null || missing+=(mariadb-server)
    command -v mariadb >/dev/null || missing+=(mariadb-client)
    ((${#missing[@]} == 0)) && return 0
    [[ $(id -u) == 0 ]] || die "Slurm packages missing (${missing[*]}) and not root: install ${PACKAGES[*]}"
    log "installing ${PACKAGES[*]} (about 45 s)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
}

start_munge() {
    mkdir -p /run/munge "$STATE_DIR/munge"
    chown munge:munge /run/munge "$STATE_DIR/munge"
    chmod 0755 /run/munge
    if [[ -S $MUNGE_SOCKET ]] && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        log "munge already running (not ours: left alone by down)"
        return 0
    fi
    [[ -f /etc/munge/munge.key ]] || runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
    # munged refuses to run as root with its log dir; run it as the munge user.
    runuser -u munge -- munged --force \
        --pid-file="$STATE_DIR/munge/munged.pid" \
        --log-file="$STATE_DIR/munge/munged.log" \
        --seed-file="$STATE_DIR/munge/munged.seed"
    wait_for 15 "munged" bash -c "munge -n | unmunge"
}

start_mariadb() {
    local datadir="$STATE_DIR/mysql/data"
    mkdir -p "$datadir"
    chown -R mysql:mysql "$STATE_DIR/mysql"
    mariadb-install-db --no-defaults --user=mysql --datadir="$datadir" \
        --auth-root-authentication-method=socket --skip-test-db >"$STATE_DIR/mysql/install.log" 2>&1 \
        || { cat "$STATE_DIR/mysql/install.log" >&2; die "mariadb-install-db failed"; }
    runuser -u mysql -- mariadbd --no-defaults --datadir="$datadir" --socket="$DB_SOCKET" \
        --pid-file="$STATE_DIR/mysql/mariadbd.pid" --log-error="$STATE_DIR/mysql/error.log" \
        --skip-networking --skip-log-bin --innodb-buffer-pool-size=32M >/dev/null 2>&1 &
    wait_for 60 "mariadbd" mariadb --no-defaults --socket="$DB_SOCKET" -u root -e "select 1"
    mariadb --no-defaults --socket="$DB_SOCKET" -u root <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
SQL
}

write_configs() {
    local memory
    memory=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)
    mkdir -p "$CONF_DIR" "$STATE_DIR"/{ctld,spool,log}
    cat >"$CONF_DIR/slurm.conf" <<CONF
# Written by solbench slurm/local-cluster.sh: a single-node test cluster. State under $STATE_DIR.
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
KillWait=5
MinJobAge=600
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/spool
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/slurmd.pid
SlurmctldLogFile=$STATE_DIR/log/slurmctld.log
SlurmdLogFile=$STATE_DIR/log/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
NodeName=localhost CPUs=$NODE_CPUS RealMemory=${memory:-1024} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
    cat >"$CONF_DIR/slurmdbd.conf" <<CONF
# Written by solbench slurm/local-cluster.sh.
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$STATE_DIR/slurmdbd.pid
LogFile=$STATE_DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
CONF
    chmod 600 "$CONF_DIR/slurmdbd.conf"
}

healthy() {  # every daemon alive, accounting included (submitit reads job states through sacct)
    pid_alive "$STATE_DIR/slurmctld.pid" && pid_alive "$STATE_DIR/slurmd.pid" \
        && pid_alive "$STATE_DIR/slurmdbd.pid" && pid_alive "$STATE_DIR/mysql/mariadbd.pid" \
        && pid_alive "$STATE_DIR/munge/munged.pid" && scontrol ping 2>/dev/null | grep -q UP \
        && sinfo -h -n localhost -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'
}

cmd_up() {
    if healthy; then
        log "already up (state in $STATE_DIR)"
        return 0
    fi
    [[ $(id -u) == 0 ]] || die "must run as root (starts daemons, writes $CONF_DIR)"
    if [[ -d $STATE_DIR ]]; then
        log "stale or partial cluster state in $STATE_DIR: tearing it down first"
        cmd_down
    fi
    install_packages
    mkdir -p "$STATE_DIR"
    local started=$SECONDS
    start_munge
    start_mariadb
    write_configs
    # slurmdbd reaches MariaDB through its private socket (libmariadb reads MYSQL_UNIX_PORT).
    MYSQL_UNIX_PORT="$DB_SOCKET" slurmdbd
    wait_for 30 "slurmdbd" bash -c "sacctmgr -n show cluster >/dev/null"
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
    slurmctld
    wait_for 30 "slurmctld (scontrol ping)" bash -c "scontrol ping | grep -q UP"
    slurmd -N localhost
    wait_for 60 "node localhost idle" bash -c "sinfo -h -n localhost -o %T | grep -qx idle"
    log "up in $((SECONDS - started)) s: cluster $CLUSTER, node localhost ($NODE_CPUS CPUs), state in $STATE_DIR"
}

cmd_check() {
    scontrol ping | grep -q UP || die "slurmctld does not answer scontrol ping"
    local state
    state=$(sinfo -h -n localhost -o %T)
    [[ $state =~ ^(idle|mixed|allocated)$ ]] || die "node localhost is '$state'"
    sacctmgr -n show cluster format=cluster | grep -qw "$CLUSTER" || die "cluster $CLUSTER not in accounting"
    local out="$STATE_DIR/check.out" job
    job=$(sbatch --parsable --job-name=solbench-check --output="$out" --wrap 'echo ok')
    wait_for 60 "check job $job to complete in accounting" \
        bash -c "sacct -n -X -j $job -o State | grep -q COMPLETED"
    grep -qx ok "$out" || die "check job $job produced no output"
    log "ok: slurmctld up, node $state, accounting on, job $job COMPLETED"
}

stop_pidfile() {  # stop_pidfile NAME PIDFILE
    local name=$1 file=$2 pid
    [[ -s $file ]] || return 0
    pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
        if kill -0 "$pid" 2>/dev/null; then
            log "$name ($pid) ignored SIGTERM: SIGKILL"
            kill -9 "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$file"
}

cmd_down() {
    if scontrol ping 2>/dev/null | grep -q UP; then
        local jobs
        jobs=$(squeue -h -o %i 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            wait_for 20 "jobs to leave the queue" bash -c '[[ -z $(squeue -h -o %i) ]]' || true
        fi
    fi
    stop_pidfile slurmd "$STATE_DIR/slurmd.pid"
    stop_pidfile slurmctld "$STATE_DIR/slurmctld.pid"
    stop_pidfile slurmdbd "$STATE_DIR/slurmdbd.pid"
    stop_pidfile mariadbd "$STATE_DIR/mysql/mariadbd.pid"
    stop_pidfile munged "$STATE_DIR/munge/munged.pid"
    rm -rf "$STATE_DIR"
    log "down"
}

case "${1:-}" in
    up) cmd_up ;;
    check) cmd_check ;;
    down) cmd_down ;;
    *) echo "usage: $0 up|check|down" >&2; exit 2 ;;
esac
