#!/usr/bin/env bash
# The accelerator check, one command: train step and sampler on the 0.5 B shape in
# bf16 (MFU against the device's measured matmul peak, peak device memory) and RL
# steps of the SmolLM2 config; on a CPU a tiny shape and the quickstart's tiny model.
# Prints one JSON line (benchmarks/accelerator_check.py says what each field is).
#
#   bash benchmarks/accelerator_check.sh [--shape auto|tiny|qwen0.5b] [--rl-steps N] ...
#
# RLAX_CHECK_TIMEOUT_S (default 480): the whole check's limit; past it the check is
# killed and prints {"ok": false, "error": "timeout"}.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-$here/../.venv/bin/python}"
[ -x "$python" ] || python=python3
limit="${RLAX_CHECK_TIMEOUT_S:-480}"
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
