#!/usr/bin/env bash
# The checkpoint benchmark (issue 5), all of it:
#   bash bench/run_checkpoint.sh BENCH_CHECKPOINT_BINARY WORK_DIR [--smoke]
# 1. throughput: save_sharded at TP 4, load_sharded at TP 4 and TP 2, consolidate, each against `cp -r` of the
#    same bytes in the same run, warm and (where drop_caches is writable) cold page cache;
# 2. peak RSS per rank when loading lazily at TP 4 on 4 MPI processes: load_sharded, with only_rank0_reads, with
#    ranks_per_step = 1, and load_consolidated of the consolidated file.
# BENCH_CHECKPOINT_MPIEXEC: the launcher (default: mpiexec -n 4 --oversubscribe --bind-to none), with the
# sandbox's OpenMPI environment set below unless already set. WORK_DIR is removed at the end unless KEEP=1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/openblas_env.sh"  # the kernels the CPU can run
binary=${1:?usage: run_checkpoint.sh BENCH_CHECKPOINT_BINARY WORK_DIR [--smoke]}
dir=${2:?usage: run_checkpoint.sh BENCH_CHECKPOINT_BINARY WORK_DIR [--smoke]}
shift 2
extra=("$@")
launch=${BENCH_CHECKPOINT_MPIEXEC:-mpiexec -n 4 --oversubscribe --bind-to none}
launch=${launch//;/ }  # a CMake list
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); uptime: $(uptime)"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo), $(df -h "$(dirname "$dir")" | awk 'NR == 2 {print $1}')"
mkdir -p "$dir"
"$binary" throughput --dir "$dir" "${extra[@]}"
for mode in sharded rank0 steps consolidated; do
  # shellcheck disable=SC2086
  $launch "$binary" rss --dir "$dir" --mode "$mode" "${extra[@]}"
done
echo "uptime at the end: $(uptime)"
[ "${KEEP:-0}" = 1 ] || rm -rf "$dir"
