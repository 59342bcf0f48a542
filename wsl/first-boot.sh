#!/bin/sh
# First start of the vllm-ternary WSL2 distribution: is the Windows driver's GPU stack
# visible, and will ternary run on it? `ternary doctor` says, with a fix for each problem.
# Exit status is the doctor's (non-zero when a check fails); the log keeps the JSON.
set -u
LOG=/var/log/ternary-first-boot.json
[ -w /var/log ] || LOG="${HOME:-/tmp}/ternary-first-boot.json"
/usr/sbin/ldconfig 2>/dev/null || true
echo "vllm-ternary: checking the GPU stack (ternary doctor) ..."
/opt/ternary/venv/bin/ternary doctor --json > "$LOG" 2>&1
status=$?
/opt/ternary/venv/bin/ternary doctor
if [ "$status" -ne 0 ]; then
    echo "vllm-ternary: some checks failed (see the fixes above; JSON in $LOG)." >&2
fi
exit "$status"
