#!/bin/bash
# The startup script of spotmorph's GCP Spot VMs (docs/gcp.md): the instance template's `startup-script`
# (deploy/gcp/instance-template.json; deploy/gcp/render.jq puts it there). GCE runs it as root at every boot.
# It reads its settings from the instance's metadata (the template's spotmorph-* keys), installs the CUDA build
# of torch and spotmorph (once: a VM started again after a stop keeps its disk), mounts the checkpoint share
# when one is named, trades this VM's instance identity token for its own agent token
# (`spotmorph gcp agent-token`: the controller checks Google's signature and that the VM is in its group),
# and starts the agent under systemd with --cloud gcp (the preempted flag; the guest's shutdown as a notice).
# The node name and instance id are the VM's name: how the controller matches agents to the group's instances.
set -euo pipefail

METADATA=${SPOTMORPH_METADATA_URL:-http://metadata.google.internal}
VENV=/opt/spotmorph/.venv
ETC=/etc/spotmorph

md() { curl -sSf --retry 10 --retry-connrefused -H 'Metadata-Flavor: Google' "$METADATA/computeMetadata/v1/$1"; }
attribute() { md "instance/attributes/$1"; }
optional() { md "instance/attributes/$1" 2>/dev/null || true; }

name=$(md instance/name)
address=$(md instance/network-interfaces/0/ip)
controller=$(attribute spotmorph-controller)
audience=$(attribute spotmorph-audience)
slots=$(optional spotmorph-slots)
checkpoints=$(optional spotmorph-checkpoints)

if ! id spotmorph > /dev/null 2>&1; then
  useradd --system --home-dir /var/lib/spotmorph --shell /usr/sbin/nologin spotmorph
fi
if [ ! -x "$VENV/bin/spotmorph" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q python3-venv nfs-common
  python3 -m venv "$VENV"
  # torch from the CUDA wheel index first: spotmorph's own torch requirement is then met by that build.
  "$VENV/bin/pip" install -q torch --index-url "$(attribute spotmorph-torch-index)"
  "$VENV/bin/pip" install -q "$(attribute spotmorph-package)"
fi

install -d -m 0750 -g spotmorph "$ETC"
attribute spotmorph-ca > "$ETC/ca.pem"
attribute spotmorph-agent-cert > "$ETC/agent.pem"
(umask 027 && attribute spotmorph-agent-key > "$ETC/agent-key.pem")
chgrp spotmorph "$ETC/agent-key.pem"
chmod 0644 "$ETC/ca.pem" "$ETC/agent.pem"

if [ -n "$checkpoints" ]; then  # a Filestore share, HOST:/SHARE
  mkdir -p /mnt/checkpoints
  mountpoint -q /mnt/checkpoints || mount -t nfs -o vers=3,hard,_netdev "$checkpoints" /mnt/checkpoints
  chown spotmorph:spotmorph /mnt/checkpoints
fi

# NCCL and gloo talk over the NIC holding the VM's address (ens4 on GCE's images; gVNIC keeps the name).
nic=$(ip -o -4 addr show | awk -v a="$address" '$4 ~ "^"a"/" {print $2; exit}')
cat > "$ETC/agent.env" << ENV
SPOTMORPH_CONTROLLER=$controller
SPOTMORPH_NODE_NAME=$name
SPOTMORPH_SLOTS=${slots:-auto}
SPOTMORPH_ADDRESS=$address
NCCL_SOCKET_IFNAME=${nic:-ens4}
GLOO_SOCKET_IFNAME=${nic:-ens4}
NCCL_IB_DISABLE=1
ENV

# This VM's own agent token, for the identity token Google signed for it (retried until the controller
# answers and lists this VM; written 0640, group spotmorph).
"$VENV/bin/spotmorph" gcp agent-token --controller "$controller" --audience "$audience" \
  --ca "$ETC/ca.pem" --cert "$ETC/agent.pem" --key "$ETC/agent-key.pem" \
  --metadata-url "$METADATA" --out "$ETC/agent.token" --wait 3600

cat > /etc/systemd/system/spotmorph-agent.service << 'UNIT'
# The spotmorph worker agent on a GCP Spot VM, written by deploy/gcp/startup.sh.
[Unit]
Description=spotmorph worker agent (runs the training processes this VM is assigned)
Wants=network-online.target
After=network-online.target nvidia-persistenced.service

[Service]
Type=exec
User=spotmorph
Group=spotmorph
EnvironmentFile=/etc/spotmorph/agent.env
ExecStart=/opt/spotmorph/.venv/bin/spotmorph agent \
    --cloud gcp --imds-url http://metadata.google.internal \
    --controller ${SPOTMORPH_CONTROLLER} \
    --name ${SPOTMORPH_NODE_NAME} \
    --instance-id ${SPOTMORPH_NODE_NAME} \
    --token-file /etc/spotmorph/agent.token \
    --slots ${SPOTMORPH_SLOTS} \
    --address ${SPOTMORPH_ADDRESS} \
    --ca /etc/spotmorph/ca.pem --cert /etc/spotmorph/agent.pem --key /etc/spotmorph/agent-key.pem \
    --work-dir /var/lib/spotmorph/agent
# A preempted Spot VM shuts down within 30 s: the agent takes the SIGTERM as the notice and hands off.
KillMode=mixed
TimeoutStopSec=25
Restart=always
RestartSec=2
# Exit 2: the controller refused this agent (its token, a name another VM holds); restarting cannot help.
RestartPreventExitStatus=2
StateDirectory=spotmorph/agent
NoNewPrivileges=true
ProtectSystem=full
PrivateTmp=true

[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl enable spotmorph-agent.service
systemctl restart spotmorph-agent.service
