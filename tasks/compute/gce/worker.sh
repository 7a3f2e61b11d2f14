
# --- Prefect worker on the node's pool, from the node's one environment (its flow runs use
# its interpreter: sys.executable -m prefect.engine) ---
install -m 600 /dev/null /etc/slm-prefect.env
printf 'PREFECT_API_URL=%s\nPREFECT_API_KEY=%s\n' @{prefect_api_url} "$PREFECT_API_KEY" \
  > /etc/slm-prefect.env
# a self-hosted server's auth string, only when it has one (an empty one would be sent)
[ -z "$PREFECT_API_AUTH_STRING" ] || \
  printf 'PREFECT_API_AUTH_STRING=%s\n' "$PREFECT_API_AUTH_STRING" >> /etc/slm-prefect.env
cat > /etc/systemd/system/@{worker_unit}.service <<'UNIT'
@{worker_service}
UNIT
systemctl daemon-reload
systemctl restart @{worker_unit}
