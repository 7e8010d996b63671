#!/usr/bin/env bash
# Install SkyPilot into its own virtual environment, apart from the project's, once per
# user and machine. SkyPilot pins uvicorn<0.36 and click<8.2 while Meridian's balancers
# run uvicorn 0.54, so the two cannot share one environment: the SkyPilot provider runs
# SkyPilot's SDK under this environment's python (workers/providers/sky_bridge.py).
# A stamp written after a successful import check marks the install done. Prints the
# environment's python on its last line of stdout: set MERIDIAN_SKYPILOT_PYTHON to it.
#
#   install_skypilot.sh           install unless the stamp is there
#   install_skypilot.sh --where   print the python of a finished install, or exit 1
#
#   MERIDIAN_SKYPILOT_VERSION   SkyPilot release (default 0.14.1)
#   MERIDIAN_SKYPILOT_EXTRAS    pip extras for the clouds to use, e.g. "aws,gcp" (default
#                               none: the SDK alone, as the tests need)
#   MERIDIAN_SKYPILOT_ENV       where the environment lives (default
#                               ${XDG_CACHE_HOME:-~/.cache}/meridian/skypilot-VERSION[-EXTRAS])
#   PYTHON                      interpreter that creates the environment (default python3)
set -euo pipefail

version="${MERIDIAN_SKYPILOT_VERSION:-0.14.1}"
extras="${MERIDIAN_SKYPILOT_EXTRAS:-}"
suffix="${extras:+-${extras//,/-}}"
env_dir="${MERIDIAN_SKYPILOT_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/meridian/skypilot-$version$suffix}"
stamp="$env_dir/.meridian-installed"
python="${PYTHON:-python3}"

if [ -f "$stamp" ]; then
  echo "$env_dir/bin/python"
  exit 0
fi
if [ "${1:-}" = "--where" ]; then
  echo "no SkyPilot $version environment at $env_dir (ops/install_skypilot.sh installs it)" >&2
  exit 1
fi

mkdir -p "$(dirname "$env_dir")"
# Two clones installing at once take turns; the second finds the first one's stamp.
exec 9>"$env_dir.lock"
flock 9
if [ -f "$stamp" ]; then
  echo "$env_dir/bin/python"
  exit 0
fi

started=$(date +%s)
echo "installing skypilot${extras:+[$extras]} $version into $env_dir (about 460 MB)" >&2
rm -rf "$env_dir" # a half-made environment from an interrupted run
"$python" -m venv "$env_dir"
"$env_dir/bin/python" -m pip --disable-pip-version-check -q \
  install "skypilot${extras:+[$extras]}==$version" >&2
# The stamp is only written once the SDK imports: a broken environment is retried.
"$env_dir/bin/python" -c "import sky, sky.client.sdk" >&2

finished=$(date +%s)
{
  echo "skypilot${extras:+[$extras]}==$version"
  echo "installed_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "wall_seconds=$((finished - started))"
} >"$stamp"
echo "SkyPilot $version ready in $((finished - started)) s" >&2
echo "$env_dir/bin/python"
