
# --- Prefect worker on the node's pool, from the node's one environment (its flow runs use
# its interpreter: sys.executable -m prefect.engine) ---
install -m 600 /dev/null /etc/slm-prefect.env
printf 'PREFECT_API_URL=%s\nPREFECT_API_KEY=%s\n' @{prefect_api_url} "$PREFECT_API_KEY" \
  > /etc/slm-prefect.env
cat > /etc/systemd/system/@{worker_unit}.service <<'UNIT'
@{worker_service}
UNIT
systemctl daemon-reload
systemctl restart @{worker_unit}
