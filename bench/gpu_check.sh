#!/usr/bin/env bash
# The GPU check, for a bare GPU machine that reaches no package registry (its own python3 holds torch):
#   bench/gpu_check.sh OUT_DIR
# installs the kit (`make gpu-kit` put the wheels in .whl/) offline into a target folder, prints the GPU,
# runs bench/gpu_step_bench.py (step time against plain PyTorch at 355M and 3.8B, host waits a step; with
# GPU_STEP_BASELINE=TREE, an earlier commit's tree beside it), the `gpu` tests (the GPU runtime against the
# CPU reference, one host wait a step, exact mode on CUDA for the demo GPT and the Hugging Face families, a
# local-cluster job on the GPU through an eviction) and bench/gpu_bench.py, and writes OUT_DIR/gpu-check.md
# with one log per part. Each part has its own time limit and runs whatever the others did, so one failure
# hides nothing; GPU_CHECK_PARTS (default "step tests bench") picks the parts after the kit and environment.
# Exit status: 0 when every part passed, 1 otherwise.
set -u
out=${1:?usage: bench/gpu_check.sh OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2
mkdir -p "$out" && out=$(cd "$out" && pwd)
py=${PYTHON:-python3}
site=${GPU_KIT_SITE:-/tmp/spotmorph-gpu-site}
report=$out/gpu-check.md
export PYTHONUNBUFFERED=1 PYTHONPATH="$site:$root${PYTHONPATH:+:$PYTHONPATH}" py site out
failed=0
rows=()

# part NAME LIMIT_SECONDS FUNCTION: runs FUNCTION (below) under `timeout`, its output in OUT_DIR/NAME.log.
part() {
    local name=$1 limit=$2 start rc verdict
    shift 2
    start=$(date +%s)
    echo "== $name (at most ${limit} s): $*"
    timeout -k 15 "$limit" bash -c "$1" >"$out/$name.log" 2>&1
    rc=$?
    case $rc in
        0) verdict=passed ;;
        124 | 137) verdict="timed out after ${limit} s" ;;
        *) verdict="failed (exit $rc)" ;;
    esac
    [ "$rc" = 0 ] || failed=1
    rows+=("| $name | $verdict | $(($(date +%s) - start)) |")
    echo "   $verdict"
    tail -n 25 "$out/$name.log"
}

install_kit() {
    shopt -s nullglob
    local wheels=(.whl/*.whl)
    if [ ${#wheels[@]} = 0 ]; then
        echo "no wheels in .whl/: run 'make gpu-kit' on a machine with the package registries first"
        return 1
    fi
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}"
}

environment() {
    nvidia-smi || true
    "$py" - <<'EOF'
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("cuda available:", torch.cuda.is_available(), "devices:", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"  {i}: {p.name}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
import controller.app.daemon, spotmorph.cli, worker_agent.agent.daemon, worker_agent.runtime.process.trainer  # noqa: E401
print("spotmorph imports: ok")
if not torch.cuda.is_available():
    raise SystemExit("no CUDA device: the GPU check needs one")
EOF
}

gpu_tests() {
    # Named files, not tests/: collecting every module would need the Azure SDK, which the kit leaves out.
    "$py" -m pytest -q -p no:cacheprovider -m gpu -rs -n "${GPU_CHECK_WORKERS:-3}" --dist loadgroup --timeout 400 \
        tests/runtime/test_gpu.py tests/runtime/test_dropout.py tests/runtime/test_dropout_fused.py \
        tests/e2e/test_gpu_cluster.py
}

gpu_step() {
    local baseline=()
    [ -n "${GPU_STEP_BASELINE:-}" ] && baseline=(--baseline "$GPU_STEP_BASELINE")
    "$py" bench/gpu_step_bench.py "${baseline[@]}" --profile-dir "$out/profile" && cp docs/benchmarks.md "$out/benchmarks.md"
}

gpu_bench() {
    "$py" bench/gpu_bench.py && cp docs/benchmarks.md "$out/benchmarks.md"
}

export -f install_kit environment gpu_step gpu_tests gpu_bench
part kit "${GPU_CHECK_KIT_SECONDS:-120}" install_kit
part environment 120 environment
parts=" ${GPU_CHECK_PARTS:-step tests bench} "
[[ $parts == *" step "* ]] && part step "${GPU_CHECK_STEP_SECONDS:-300}" gpu_step
[[ $parts == *" tests "* ]] && part tests "${GPU_CHECK_TEST_SECONDS:-300}" gpu_tests
[[ $parts == *" bench "* ]] && part bench "${GPU_CHECK_BENCH_SECONDS:-300}" gpu_bench

{
    echo "# GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
    echo
    echo "| part | verdict | seconds |"
    echo "| --- | --- | --- |"
    printf '%s\n' "${rows[@]}"
    for name in environment step tests bench; do
        [ -f "$out/$name.log" ] || continue
        echo
        echo "## $name (last lines of $name.log)"
        echo
        echo '```'
        tail -n 60 "$out/$name.log" 2>/dev/null
        echo '```'
    done
} >"$report"
echo "report: $report"
exit $failed
