#!/bin/bash
# Rendered by `slm-nightly gcp image build` (tasks/gcp/image_build.sh, tasks/gcp/image.py): the
# image builder's startup script. Google's runner starts it as root in / at every boot of the
# builder; each step leaves a marker in @{state}, so a boot after an interruption resumes at the
# first step not done. Progress and errors go to the guest attributes @{ns}/* (the command that
# made the builder reads them); the builder is stopped and deleted by that command, or deleted
# by its maximum run time (scheduling.maxRunDuration, instanceTerminationAction DELETE) if
# nobody is waiting.
set -Eeuo pipefail
MD=@{metadata}
STATE=@{state}
SCRATCH=@{scratch}
PROJECT_DIR=@{project_dir}
VENV=$PROJECT_DIR/.venv
attr() {  # attr KEY VALUE: a guest attribute under @{ns}/
  curl -sS -X PUT -H 'Metadata-Flavor: Google' --data-binary "$2" "$MD/guest-attributes/@{ns}/$1" \
    >/dev/null || echo "could not write guest attribute @{ns}/$1" >&2
}
fail() {  # fail MESSAGE: the error and the log's last lines to @{ns}/error, then stop
  local tail_
  tail_=$(tail -n 15 "$STATE/log" 2>/dev/null | tail -c 1200 || true)
  echo "slm-nightly image build failed: $1" >&2
  attr error "$(date +%s) step ${STEP:-start}: ${1:0:1500}; its last lines: $tail_"
  exit 1
}
trap 'rc=$?; fail "line $LINENO: $BASH_COMMAND (exit $rc)"' ERR
mkdir -p "$STATE"
exec > >(tee -a "$STATE/log") 2>&1
BOOT=$(( $(cat "$STATE/boots" 2>/dev/null || echo 0) + 1 ))
echo "$BOOT" > "$STATE/boots"
attr boots "$BOOT"
STEPS=(@{steps})
step() {  # step NAME: run do_NAME unless a marker says it is done
  STEP=$1
  local n=0 i
  for i in "${!STEPS[@@]}"; do [ "${STEPS[$i]}" = "$1" ] && n=$((i + 1)); done
  if [ -e "$STATE/done-$1" ]; then echo "== $1: done before"; return 0; fi
  echo "== step $n/${#STEPS[@@]} $1 (boot $BOOT) $(date -u +%FT%TZ)"
  attr step "$n/${#STEPS[@@]} $1 $(date +%s)"
  "do_$1"
  touch "$STATE/done-$1"
  attr "done-$1" "$(date +%s)"
}

# --- the scratch disk: downloads and intermediates, never in the image ---
# Mounted at every boot without an fstab entry (the image must not wait for a disk it lacks).
if ! mountpoint -q "$SCRATCH"; then
  dev=/dev/disk/by-id/google-@{scratch_device}
  blkid "$dev" >/dev/null 2>&1 || mkfs.ext4 -q -F "$dev"
  mkdir -p "$SCRATCH" && mount "$dev" "$SCRATCH"
fi

# The base image is Google's Deep Learning VM (the profile's [gcp] base_image): the NVIDIA driver
# and the CUDA toolkit with nvcc come with it, so nothing here installs a driver or reboots.
# make: the install below is the Makefile's, as on every clone.
# apt waits for a dpkg lock held at boot (unattended upgrades) instead of failing at once
# (apt.conf(5): DPkg::Lock::Timeout, seconds)
do_packages() {
  apt-get -o DPkg::Lock::Timeout=600 update -q
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q \
    python3.11-venv python3.11-dev make cmake g++ curl
}
do_nvcc() {
  local out
  out=$(@{nvcc} --version) || fail "@{nvcc} --version failed: the base image @{base_image} \
ships no CUDA toolkit — choose a Deep Learning VM family with one ([gcp] base_image)"
  release=$(printf '%s\n' "$out" | sed -n 's/.*release \([0-9][0-9.]*\),.*/\1/p' | head -n 1)
  [ -n "$release" ] || fail "@{nvcc} --version names no release: $out"
  echo "$release" > "$STATE/cuda-release"
  attr cuda "$release"
  # the CUDA runtime on the loader's path: llama-server links libcudart/libcublas shared and
  # systemd starts it with no LD_LIBRARY_PATH
  mkdir -p /etc/ld.so.conf.d
  echo "$(dirname "$(dirname "$(readlink -f @{nvcc})")")/lib64" > /etc/ld.so.conf.d/slm-cuda.conf
  ldconfig
}
@{fetch_code}
do_checkout() {
  id -u @{user} >/dev/null 2>&1 || useradd --system --create-home --home-dir /var/lib/@{user} @{user}
  # a folder this build did not start is never deleted: a fresh builder has none
  if [ -e "$PROJECT_DIR" ] && [ ! -e "$STATE/checkout-started" ]; then
    fail "$PROJECT_DIR exists and this build did not make it: build on a fresh builder"
  fi
  touch "$STATE/checkout-started"
  rm -rf "$PROJECT_DIR"
  fetch_code "$PROJECT_DIR"
  attr code "$(cat "$PROJECT_DIR/.code-version")"
}
# The checkout's own install, as `make` installs every clone (Makefile: llama.cpp built once — here
# its @{variant} variant, the compiler named by CUDACXX — PyTorch's wheels, the project, the
# converters, the install check); the runner starts this script in / (make -C moves into the
# checkout), and the build cache lives on the scratch disk.
do_install() {
  CUDACXX=@{nvcc} SLM_BUILD_CACHE="$SCRATCH/build-cache" \
    make -C "$PROJECT_DIR" install PYTHON=python3.11 LLAMA_VARIANT=@{variant}
}
# The weights of these pins, converted once: gs://@{bucket}/@{weights}/ holds what download,
# convert and quantize leave in $SCRATCH/src, and SHA256SUMS, written last (tasks/gcp/image.py
# ImageBuild.weights). Through the Cloud Storage JSON API as the builder's account (objects.get,
# objects.insert with ifGenerationMatch=0: cloud.google.com/storage/docs/json_api/v1/objects).
WEIGHTS_URL=@{storage}/storage/v1/b/@{bucket}/o/$(printf %s '@{weights}/' | sed 's|/|%2F|g')
enc() { printf %s "$1" | sed 's|/|%2F|g'; }
gcs_get() {  # gcs_get NAME FILE: the object @{weights}/NAME into FILE; prints the HTTP status
  curl -sS --retry 5 -o "$2" -w '%{http_code}' -H "Authorization: Bearer $(gcs_token)" \
    "$WEIGHTS_URL$(enc "$1")?alt=media"
}
gcs_put() {  # gcs_put NAME FILE: FILE as the object @{weights}/NAME, unless the bucket has it
  local got
  got=$(curl -sS --retry 5 -o /dev/null -w '%{http_code}' \
    -H "Authorization: Bearer $(gcs_token)" "$WEIGHTS_URL$(enc "$1")")
  [ "$got" = 200 ] && return 0  # an interrupted publish's: the next build checks it by SHA256SUMS
  got=$(curl -sS --retry 5 -o "$STATE/upload.json" -w '%{http_code}' -X POST -T "$2" \
    -H "Authorization: Bearer $(gcs_token)" -H 'Content-Type: application/octet-stream' \
    "@{storage}/upload/storage/v1/b/@{bucket}/o?uploadType=media&ifGenerationMatch=0&name=$(
      enc "@{weights}/$1")")
  [ "$got" = 200 ] || fail "could not upload gs://@{bucket}/@{weights}/$1: HTTP $got \
$(head -c 300 "$STATE/upload.json") (the builder's account creates objects under weights/: \
gcp setup grants it)"
}
do_cached() {
  local got name sum sums
  got=$(gcs_get SHA256SUMS "$STATE/SHA256SUMS")
  case "$got" in
    404) echo "gs://@{bucket}/@{weights}/ holds no weights: made from the hub, then published"
      return 0 ;;
    200) ;;
    *) fail "could not read gs://@{bucket}/@{weights}/SHA256SUMS: HTTP $got \
$(head -c 300 "$STATE/SHA256SUMS")" ;;
  esac
  rm -rf "$SCRATCH/src" && mkdir -p "$SCRATCH/src"
  while read -r sum name; do
    mkdir -p "$(dirname "$SCRATCH/src/$name")"
    got=$(gcs_get "$name" "$SCRATCH/src/$name")
    [ "$got" = 200 ] || fail "could not download gs://@{bucket}/@{weights}/$name: HTTP $got"
  done < "$STATE/SHA256SUMS"
  # sha256sum's own lines in the message: the log's tail that fail() adds is written by tee,
  # which may not have written them yet
  sums=$(cd "$SCRATCH/src" && sha256sum --check --quiet "$STATE/SHA256SUMS" 2>&1) || fail "the \
weights in gs://@{bucket}/@{weights}/ differ from its SHA256SUMS (${sums//$'\n'/ }\
): delete that folder and build again"
  for s in download convert quantize publish; do touch "$STATE/done-$s"; done
}
do_publish() {
  local name sum
  (cd "$SCRATCH/src" && find . -type f -printf '%P\n' | LC_ALL=C sort | tr '\n' '\0' \
    | xargs -0 sha256sum) > "$STATE/SHA256SUMS"
  while read -r sum name; do gcs_put "$name" "$SCRATCH/src/$name"; done < "$STATE/SHA256SUMS"
  gcs_put SHA256SUMS "$STATE/SHA256SUMS"  # last: a build takes the folder only once it is whole
}
# The published safetensors, at the pinned revisions; intermediates are deleted as they go.
do_download() {
  export HF_HOME="$SCRATCH/hf-dl"
  mkdir -p "$SCRATCH/src"
  "$VENV/bin/hf" download @{model_repo} --revision @{model_revision} --local-dir "$SCRATCH/model-st"
  # --include takes one pattern a flag (huggingface_hub's cli/download.py): further words would
  # be file names, and the patterns ignored
  "$VENV/bin/hf" download @{model_repo} --revision @{model_revision} \
    --include 'tokenizer*' --include 'special_tokens_map.json' --include 'chat_template*' \
    --local-dir "$SCRATCH/src/@{tokenizer_name}"
  "$VENV/bin/hf" download @{base_repo} --revision @{base_revision} \
    --local-dir "$SCRATCH/src/@{base_name}"
  rm -rf "$SCRATCH/hf-dl"
}
do_convert() {
  convert=$(ls "$VENV"/share/slm-nightly/*/convert_hf_to_gguf.py)
  "$VENV/bin/python" "$convert" "$SCRATCH/model-st" --outtype f16 --outfile "$SCRATCH/model-f16.gguf"
  rm -rf "$SCRATCH/model-st"
  "$VENV/bin/python" "$convert" "$SCRATCH/src/@{base_name}" --outtype f16 \
    --outfile "$SCRATCH/src/@{base_gguf_name}"
}
do_quantize() {
  "$VENV/bin/python" -m tasks.image.quantize "$SCRATCH/model-f16.gguf" \
    "$SCRATCH/src/@{model_name}" @{quant}
  rm -f "$SCRATCH/model-f16.gguf"
}
do_weights() {
  "$VENV/bin/slm-nightly" node prepare-weights --profile @{profile} --source "$SCRATCH/src"
  rm -rf "$SCRATCH/src"
}
do_checks() {
  "$VENV/bin/slm-nightly" node prepare-weights --profile @{profile} --check
  local server missing
  server=$(readlink -f "$VENV/bin/llama-server")
  missing=$(ldd "$server" | grep 'not found' || true)
  [ -z "$missing" ] || fail "ldd $server: $(echo "$missing" | tr -s ' \t\n' ' ')— the CUDA \
runtime is not on the loader's path (/etc/ld.so.conf.d/slm-cuda.conf, ldconfig)"
  chown -R @{user}:@{user} "$PROJECT_DIR" @{hf_home}
}
do_seal() {
  "$VENV/bin/python" -c 'import json, sys
m = json.load(open(sys.argv[1]))["files"]
print(m["model"]["sha256"], (m.get("base_gguf") or {}).get("sha256", "-"))' \
    "$(dirname @{model_path})/weights-manifest.json" > "$STATE/sha256"
  attr sha256 "$(cat "$STATE/sha256")"
}

for s in "${STEPS[@@]}"; do step "$s"; done
STEP=done
attr done "$(date +%s) $(cat "$PROJECT_DIR/.code-version") cuda $(cat "$STATE/cuda-release")"
umount "$SCRATCH" || true
# The command that waits on the build stops the builder once it reads `done`; if nobody does,
# it powers off after @{linger} s, its disk kept for an image made by hand.
sleep @{linger}
poweroff
