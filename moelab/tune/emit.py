"""What `moelab tune` prints for the winner: a moelab suite that re-runs it, and the settings a
Megatron-Core, torchtitan, SGLang or plain-library user sets to get the same configuration."""

from __future__ import annotations

import json
from typing import Any

from moelab.core.e2e_spec import resolve_carveout
from moelab.tune.search import Trial, TuneResult
from moelab.tune.trials import TrialPlan

DEEPEP_DEFAULT_SMS = 20  # deep_ep.Buffer.num_sms


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    return json.dumps(str(v))


def suite_toml(plan: TrialPlan, winner: Trial) -> str:
    """A suite with exactly the winning case (the full e2e profile): `moelab run --suite FILE` re-measures it."""
    c = winner.candidate
    wl = plan.workload_for(c.backend)
    knobs = {k: v for k, v in plan.knobs_for(c, "full").items()}
    lines = [
        f"# moelab tune {plan.tune_id}: the winner, {c.describe()}, {winner.tokens_per_s or 0:.4g} tokens/s per rank",
        f"# re-measure: moelab run --suite THIS_FILE --backend {c.backend} --gpus {plan.launch.nproc_per_node}",
        f'name = "tuned-{c.backend}"',
        f'description = "moelab tune {plan.tune_id} winner: {c.describe()}"',
        "",
        "[workload]",
        f"hidden = {wl.hidden}",
        f"tokens_per_rank = {wl.tokens_per_rank}",
        f"topk = {wl.topk}",
        f"experts_per_rank = {wl.experts_per_rank}",
        f'routing = "{wl.routing.kind}"',
        f"seed = {wl.routing.seed}",
        f'dtype = "{wl.dtype}"',
        "",
        "[axes]",
        f"sms = [{_toml_value(c.sms) if c.sms is not None else chr(34) + 'default' + chr(34)}]",
        "",
        f"[backend.{c.backend}.axes]",
    ]
    lines += [f"{k} = [{_toml_value(v)}]" for k, v in knobs.items()]
    return "\n".join(lines) + "\n"


def framework_settings(plan: TrialPlan, winner: Trial) -> list[str]:
    """Lines a user of Megatron-Core, torchtitan or the library itself sets for the winning configuration."""
    c = winner.candidate
    k = c.knob_dict()
    out: list[str] = []
    if c.backend == "deepep":
        s = c.sms if c.sms is not None else DEEPEP_DEFAULT_SMS
        out.append(f"DeepEP: deep_ep.Buffer.set_num_sms({s})")
        if "nvl_chunk" in k or "combine_nvl_chunk" in k or c.sms is not None:
            out.append(
                f"DeepEP: dispatch config=deep_ep.Config({s}, {k.get('nvl_chunk', 'nvl_chunk')}, nvl_buffer, rdma_chunk, rdma_buffer), "
                f"combine config=deep_ep.Config({s}, {k.get('combine_nvl_chunk', 'nvl_chunk')}, ...) "
                "(unnamed values: Buffer.get_dispatch_config / get_combine_config for the rank count)"
            )
        out.append(
            f"Megatron-Core: --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep --moe-deepep-num-sms {s}"
        )
    elif c.backend == "hybrid-ep":
        hs = c.sms
        comb = k.get("combine_sms", hs)
        out.append(
            f"Hybrid-EP: deep_ep.HybridEPBuffer(..., num_sms_dispatch_api={hs}, num_sms_combine_api={comb})"
            if hs is not None
            else "Hybrid-EP: deep_ep.HybridEPBuffer(...) with its default SM counts"
        )
        if hs is not None:
            out.append(
                f"Megatron-Core: --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-hybridep-num-sms {hs}"
            )
    elif c.backend in ("nccl-a2a", "mxfp8-a2a"):
        if c.sms is not None:
            out.append(
                f"NCCL: communicator for the expert-parallel all-to-all with ncclConfig_t min_ctas = max_ctas = {c.sms} "
                f"(torch: ProcessGroupNCCL.Options().config.min_ctas/max_ctas; or NCCL_MIN_CTAS={c.sms} NCCL_MAX_CTAS={c.sms})"
            )
        out.append("Megatron-Core: --moe-token-dispatcher-type alltoall")
        if c.backend == "mxfp8-a2a":
            wl = plan.workload_for(c.backend)
            out.append(
                "torchtitan: --parallelism.expert_parallel_a2a_dispatch_impl "
                f"{'mxfp8' if wl.dtype == 'mxfp8' else 'bf16'} --parallelism.expert_parallel_a2a_combine_impl "
                f"{k.get('combine_impl', 'mxfp8')}"
            )
    if c.mode == "tbo":
        out.append(
            "schedule: two-batch overlap (one micro-batch's dispatch/combine under the other's expert GEMMs): "
            "Megatron-Core --overlap-moe-expert-parallel-comm; SGLang --enable-two-batch-overlap"
        )
        held = resolve_carveout(k.get("carveout", "auto"), c.mode, c.sms)
        if held:
            out.append(
                f"expert GEMMs held to the GPU's SMs minus {held} while the communication runs beside them: "
                f"torch._C._set_sm_carveout_experimental({held}) around the overlapped layer, None after "
                "(moelab e2e knob carveout)"
            )
    else:
        out.append("schedule: serial (no micro-batch overlap)")
    return out


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1%}"


def summary_lines(plan: TrialPlan, result: TuneResult) -> list[str]:
    w = result.winner
    lines = [
        f"winner: {w.candidate.describe()}: {w.tokens_per_s or 0:.4g} tokens/s per rank (run {w.run_id})",
        f"  margin over the runner-up ({result.runner_up.candidate.describe() if result.runner_up else 'none'}): "
        f"{_pct(result.margin(w, result.runner_up))}",
        f"  margin over the default settings ({result.default.candidate.describe() if result.default else 'not timed'}): "
        f"{_pct(result.margin(w, result.default))}",
        f"  search cost: {len(result.trials)} trials over {len(result.run_ids)} runs "
        f"(the full product would be {result.full_product})",
    ]
    return lines
