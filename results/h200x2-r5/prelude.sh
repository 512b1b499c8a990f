# Sourced by callN.sh on a lent 2-GPU machine (nvidia-h200-x2 or nvidia-h100-x2), from the repository root with
# `.whl` (duckdb, nvtx, platformdirs, nvidia-ml-py wheels) and `.ext` (DeepEP v1.2.1 and the hybrid-ep branch,
# already built in place as results/h200x2/README.md says, plus nccl-tests' build) carried. It builds nothing.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
M="python3 -m moelab.cli.main"
R=/tmp/r5
DB="--db $R/moelab.duckdb --out $R/runs"
LIBS="--backend-path deepep=.ext/deepep-v1 --backend-path hybrid-ep=.ext/hybrid-ep"
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
nvidia-smi topo -m >> "$R/gpu.txt" 2>&1
for lib in .ext/deepep-v1 .ext/hybrid-ep .ext/nccl-tests/build/alltoall_perf; do
  [ -e "$lib" ] || echo "missing $lib: its backend's steps will say so" | tee -a "$R/gpu.txt"
done
# Everything under $R goes back as one archive (at most 8 files return from a call).
finish() { tar -C "$R" --exclude="*.duckdb*" -czf "$OUT/$1.tgz" . ; cp "$R/moelab.duckdb" "$OUT/$1.duckdb" 2>/dev/null; }
