#!/bin/bash
# Rendered by slm-nightly (tasks/compute/gce/startup.sh). Runs as root at every boot.
# Any failure is written to the guest attribute @{error_attribute} before the script exits.
set -Eeuo pipefail
MD=@{metadata}
fail() {  # fail MESSAGE [STATUS]: tell the orchestrator (guest attribute) and stop here
  local msg="${1:0:1500}"
  echo "slm-nightly startup failed: $msg" >&2
  curl -sS -X PUT -H 'Metadata-Flavor: Google' --data-binary "$(date +%s) $msg" \
    "$MD/guest-attributes/@{error_attribute}" >/dev/null \
    || echo "could not write guest attribute @{error_attribute}" >&2
  exit "${2:-1}"
}
trap 'rc=$?; fail "line $LINENO: $BASH_COMMAND (exit $rc)" "$rc"' ERR
secret() {  # secret NAME VAR: Secret Manager secret NAME into VAR, never echoed
  local err value
  err=$(mktemp)
  if ! value=$(gcloud secrets versions access latest --secret="$1" 2>"$err"); then
    fail "reading Secret Manager secret $1 failed: $(head -c 600 "$err") — create it, or grant \
the node's service account roles/secretmanager.secretAccessor on it"
  fi
  rm -f "$err"
  printf -v "$2" '%s' "$value"
}
VPC_IP=$(curl -fsS -H 'Metadata-Flavor: Google' "$MD/network-interfaces/0/ip")
@{secret_lines}@{image_checks}

# --- the service user the engine and the worker run as ---
@{service_user}

install -m 600 /dev/null /etc/slm-engine.env
printf 'VPC_IP=%s\n' "$VPC_IP" > /etc/slm-engine.env
if [ -n "${ENGINE_API_KEY:-}" ]; then printf '@{key_var}=%s\n' "$ENGINE_API_KEY" >> /etc/slm-engine.env; fi

# --- the engine (@{engine}) on the VPC address, port @{port} ---
cat > /usr/local/bin/@{engine_unit}-serve <<'SERVE'
#!/bin/bash
exec @{serve}
SERVE
chmod 755 /usr/local/bin/@{engine_unit}-serve
# ExecStopPost=+ (as root, for the journal; systemd.exec(5) sets SERVICE_RESULT, EXIT_CODE and
# EXIT_STATUS): an engine that failed, not one stopped, is written to the guest attribute
# @{engine_error_attribute} with its last lines, so the orchestrator stops waiting for it
cat > /usr/local/bin/@{engine_unit}-failed <<'FAILED'
#!/bin/bash
[ "${SERVICE_RESULT:-success}" = success ] && exit 0
n=$(( $(cat /run/@{engine_unit}.failures 2>/dev/null || echo 0) + 1 ))
echo "$n" > /run/@{engine_unit}.failures
last=$(journalctl -u @{engine_unit} -n 12 --no-pager -o cat 2>/dev/null | tail -c 1200)
curl -sS -X PUT -H 'Metadata-Flavor: Google' --data-binary \
  "$(date +%s) $SERVICE_RESULT (${EXIT_CODE:-?} ${EXIT_STATUS:-?}), failure $n of this boot; its last lines: $last" \
  "@{metadata}/guest-attributes/@{engine_error_attribute}" >/dev/null || true
FAILED
chmod 755 /usr/local/bin/@{engine_unit}-failed
cat > /etc/systemd/system/@{engine_unit}.service <<'UNIT'
@{engine_service}
UNIT

# --- watcher: metadata @{state_key}=stopped|running stops/starts the engine (frees the GPU) ---
cat > /usr/local/bin/@{watch_unit} <<'WATCH'
#!/bin/bash
MD=@{metadata}
while true; do
  want=$(curl -fsS -H 'Metadata-Flavor: Google' "$MD/attributes/@{state_key}" 2>/dev/null || echo running)
  if [ "$want" = stopped ]; then systemctl stop @{engine_unit}
  elif ! systemctl is-active --quiet @{engine_unit}; then systemctl start @{engine_unit}; fi
  sleep @{watch_seconds}
done
WATCH
chmod 755 /usr/local/bin/@{watch_unit}
cat > /etc/systemd/system/@{watch_unit}.service <<'UNIT'
[Unit]
Description=slm-nightly engine watcher
[Service]
ExecStart=/usr/local/bin/@{watch_unit}
Restart=always
[Install]
WantedBy=multi-user.target
UNIT
systemctl daemon-reload
systemctl restart @{watch_unit}
@{worker}