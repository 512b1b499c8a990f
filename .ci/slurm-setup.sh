#!/usr/bin/env bash
# A one-host SLURM cluster (Debian slurm-wlm) so that tests/launch/test_slurm_real.py runs a real srun; see containers/README.md.
set -euo pipefail
apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge
mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge && chown munge:munge /run/munge
H=$(hostname -s); C=$(nproc)
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=moelab-ci
SlurmctldHost=$H
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
NodeName=$H CPUs=$C RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=$H Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
su -s /bin/sh munge -c /usr/sbin/munged
/usr/sbin/slurmctld && /usr/sbin/slurmd
for i in $(seq 30); do sinfo -h -o %T | grep -qE 'idle|mixed' && break; sleep 1; done; sinfo
