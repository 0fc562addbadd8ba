#!/usr/bin/env bash
# `make ui`: Prefect server + MLflow server on loopback, then serve the `pipeline` and `evaluate`
# deployments.
# Ctrl-C (or SIGTERM to this script) stops all three. Logs: .rollwise/logs/.
# Ports: PREFECT_PORT (4200), MLFLOW_PORT (5000).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BIN="$ROOT/.venv/bin"
STATE="$ROOT/.rollwise"
PREFECT_PORT="${PREFECT_PORT:-4200}"
MLFLOW_PORT="${MLFLOW_PORT:-5000}"
PREFECT_URL="http://127.0.0.1:$PREFECT_PORT"
MLFLOW_URL="http://127.0.0.1:$MLFLOW_PORT"

mkdir -p "$STATE"/{prefect,tmp,dvc-site,dask,logs}
export PREFECT_HOME="$STATE/prefect" PREFECT_SERVER_ANALYTICS_ENABLED=false
export MLFLOW_DISABLE_TELEMETRY=true MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
export DVC_NO_ANALYTICS=1 DVC_SITE_CACHE_DIR="$STATE/dvc-site" DASK_TEMPORARY_DIRECTORY="$STATE/dask"
export HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled TMPDIR="$STATE/tmp"

pgids=()
# Last started, first stopped: the serve process (and any flow run it started) ends while the
# Prefect server it reports to is still up; each group gets 10 s after TERM, then KILL.
stop_all() {
  trap - EXIT INT TERM
  local i pg
  for ((i = ${#pgids[@]} - 1; i >= 0; i--)); do
    pg="${pgids[i]}"
    kill -TERM -- "-$pg" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 -- "-$pg" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pg" 2>/dev/null || true
  done
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in "$PREFECT_PORT" "$MLFLOW_PORT"; do
  port_free "$port" || { echo "port $port is in use (set PREFECT_PORT / MLFLOW_PORT)" >&2; exit 1; }
done

# Each server in its own session (process group), so stop_all can end its workers too.
# The UI hands the browser the API URL from PREFECT_UI_API_URL; unset, Prefect says :4200
# whatever --port is, and the UI on another port cannot reach its API.
PREFECT_UI_API_URL="$PREFECT_URL/api" \
  setsid "$BIN/prefect" server start --host 127.0.0.1 --port "$PREFECT_PORT" \
  >"$STATE/logs/prefect.log" 2>&1 &
pgids+=($!)
# Same store as `dvc repro` without a server (rollwise.track: sqlite:///<root>/mlflow.db), and
# the same artifact folder, so runs logged either way show up here.
setsid "$BIN/mlflow" server --host 127.0.0.1 --port "$MLFLOW_PORT" \
  --backend-store-uri "sqlite:///$ROOT/mlflow.db" --default-artifact-root "$ROOT/mlruns" \
  --workers 1 >"$STATE/logs/mlflow.log" 2>&1 &
pgids+=($!)

wait_healthy() {  # name url log
  for _ in $(seq 240); do
    curl -fsS -o /dev/null --max-time 2 "$2" 2>/dev/null && return 0
    sleep 0.25
  done
  echo "$1 did not become healthy at $2; last lines of $3:" >&2
  tail -n 30 "$3" >&2
  exit 1
}
wait_healthy prefect "$PREFECT_URL/api/health" "$STATE/logs/prefect.log"
wait_healthy mlflow "$MLFLOW_URL/health" "$STATE/logs/mlflow.log"

export PREFECT_API_URL="$PREFECT_URL/api" MLFLOW_TRACKING_URI="$MLFLOW_URL"
cat <<EOF
Prefect UI: $PREFECT_URL   (Deployments: 'pipeline' runs everything, 'evaluate' evaluation alone;
            each run is its own worktree under .rollwise/runs/, see README)
MLflow UI:  $MLFLOW_URL   (experiment 'rollwise'; MLflow 3 opens in GenAI mode: click
            'Model training' at the top left once, or open
            $MLFLOW_URL/#/experiments?workflowType=machine_learning)
Logs: $STATE/logs/   Ctrl-C stops everything.
EOF
# In the background and waited for: bash runs a trap only once its foreground child exits, so a
# TERM sent to this script would otherwise wait on flows.serve forever.
setsid "$BIN/python" -m flows.serve &
pgids+=($!)
wait "$!"
