#!/usr/bin/env bash
# The accelerator check, one command: train step and sampler on the 0.5 B shape in
# bf16 (MFU against the device's measured matmul peak, peak device memory), each
# placement mode's step and sampling, the device-to-device weight handoff against a
# parameter server's push + pull, and RL steps of the SmolLM2 config; on a CPU a tiny
# shape and the quickstart's tiny model. Prints one JSON line
# (benchmarks/accelerator_check.py and accelerator_modes.py say what each field is).
#
#   bash benchmarks/accelerator_check.sh [--shape auto|tiny|qwen0.5b] [--rl-steps N] ...
#
# RLAX_CHECK_TIMEOUT_S (default 480): the whole check's limit; past it the check is
# killed and prints {"ok": false, "error": "timeout"}.
#
# A machine without a package registry carries its wheels:
#
#   bash benchmarks/accelerator_check.sh --fetch-wheels DIR cuda|tpu|cpu   # where pip works
#   RLAX_WHEELS=DIR bash benchmarks/accelerator_check.sh ...               # where it does not
#
# With RLAX_WHEELS the check first makes a venv (RLAX_CHECK_VENV, default
# /tmp/rlax-check-venv) and installs rlax-llm with the extra the machine needs
# (RLAX_CHECK_EXTRA: cuda, tpu or cpu; default: tpu if /dev/accel* or /dev/vfio/<n>
# exist, cuda if nvidia-smi runs, else cpu) from DIR alone (pip --no-index).
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
python="${PYTHON:-$here/../.venv/bin/python}"
[ -x "$python" ] || python=python3
limit="${RLAX_CHECK_TIMEOUT_S:-480}"

fail() {  # one JSON line and the status: fail STATUS ERROR
  printf '{"ok": false, "error": "%s"}\n' "$2"
  exit "$1"
}

extra_of() {  # the accelerator extra this machine needs
  if compgen -G "/dev/accel*" >/dev/null || compgen -G "/dev/vfio/[0-9]*" >/dev/null; then
    echo tpu
  elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    echo cuda
  else
    echo cpu
  fi
}

spec_of() {  # sets spec, the requirement for an extra: rlax-llm, rlax-llm[cuda], rlax-llm[tpu]
  case "$1" in
    cpu) spec="rlax-llm" ;;
    cuda | tpu) spec="rlax-llm[$1]" ;;
    *) fail 2 "extra: cuda, tpu or cpu, got '$1'" ;;
  esac
}

if [ "${1:-}" = "--fetch-wheels" ]; then
  [ $# -eq 3 ] || fail 2 "usage: --fetch-wheels DIR cuda|tpu|cpu"
  spec_of "$3"
  mkdir -p "$2" || fail 2 "wheels: cannot make $2"
  # This repository's wheel and every dependency's, for this machine's platform.
  "$python" -m pip wheel --quiet --wheel-dir "$2" "$root${spec#rlax-llm}" >&2 ||
    fail 1 "wheels: pip wheel failed"
  printf '{"ok": true, "wheels": "%s", "files": %s}\n' "$2" "$(ls "$2" | wc -l)"
  exit 0
fi

if [ -n "${RLAX_WHEELS:-}" ]; then
  [ -d "$RLAX_WHEELS" ] || fail 2 "wheels: RLAX_WHEELS=$RLAX_WHEELS is not a folder"
  spec_of "${RLAX_CHECK_EXTRA:-$(extra_of)}"
  venv="${RLAX_CHECK_VENV:-/tmp/rlax-check-venv}"
  "$python" -m venv "$venv" || fail 1 "wheels: cannot make a venv at $venv"
  "$venv/bin/python" -m pip install --quiet --no-index --find-links "$RLAX_WHEELS" "$spec" >&2 ||
    fail 2 "wheels: pip could not install $spec from $RLAX_WHEELS alone"
  python="$venv/bin/python"
fi

out="$(timeout --kill-after=10 "$limit" "$python" "$here/accelerator_check.py" "$@")"
rc=$?
last="$(printf '%s\n' "$out" | tail -n 1)"
if [ "$rc" -eq 0 ] && [ -n "$last" ]; then
  printf '%s\n' "${last%\}}, \"ok\": true}"
elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  printf '{"ok": false, "error": "timeout", "limit_s": %s}\n' "$limit"
else
  printf '{"ok": false, "error": "exit %s"}\n' "$rc"
fi
exit "$rc"
