#!/bin/bash
# The slm-nightly orchestrator (`slm-nightly gcp orchestrator`): the checkout under the service
# user @{user}, its environment, the Prefect server with an auth string, the orchestrator's
# worker. Runs as root, at every boot as the VM's startup-script or once by hand
# (`sudo bash orchestrator.sh`); each step is skipped when it is already done.
set -euo pipefail
user=@{user}
dir=@{project_dir}

need=()
for pkg in python3-venv make cmake g++ curl; do  # make: the install below is `make`
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@@]}" -gt 0 ]; then  # needs the Cloud NAT: the VM has no external address
  # waits for a dpkg lock held at boot instead of failing (apt.conf(5): DPkg::Lock::Timeout)
  apt-get -o DPkg::Lock::Timeout=600 update -q
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q "${need[@@]}"
fi

# the service user owns the checkout and runs everything in it; an operator works as it
# (`sudo -iu @{user}`), so every file the commands write is theirs and PREFECT_* is kept
id -u "$user" >/dev/null 2>&1 || useradd --system --create-home --home-dir @{home} \
  --shell /bin/bash "$user"
install -d -o "$user" -g "$user" "$dir"
@{fetch_code}
# the checkout `gcp orchestrator` uploaded (tasks/gcp/code.py), unless it is there already; a
# new one (`gcp orchestrator` again, then this script again) replaces the old one's files
fresh=
if [ "$(cat "$dir/.code-version" 2>/dev/null)" != @{code_version} ]; then
  fetch_code "$dir"
  chown -R "$user": "$dir"
  fresh=1
fi
runuser -u "$user" -- make -C "$dir" install
# the folders the night reads ([sources], [corpus]): the user's, so its runs can write there
@{data_dirs}

# the API's auth string, from Secret Manager into files only root and the user read
install -d -m 750 -o root -g "$user" /etc/slm-nightly
umask 027
@{secrets}
cat > /etc/slm-nightly/prefect.env <<ENV
@{client_env}
ENV
chgrp "$user" /etc/slm-nightly/*.env
# the user's own shell: the venv's commands, the gcp profile, the same server
rc=@{home}/.bashrc
grep -q SLM_NIGHTLY_PROFILE "$rc" 2>/dev/null || cat >> "$rc" <<'RC'
@{bashrc}
RC
chown "$user": "$rc"
@{units}
systemctl daemon-reload
systemctl enable --now @{enable}
# a new checkout: the units run its code from now on
[ -z "$fresh" ] || systemctl restart @{enable}
