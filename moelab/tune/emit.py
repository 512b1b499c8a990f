"""What `moelab tune` prints for the winner: a moelab suite that re-runs it, and the settings a
Megatron-Core, torchtitan, SGLang or plain-library user sets to get the same configuration."""

from __future__ import annotations

import json
from typing import Any

from moelab.core.e2e_spec import resolve_carveout
from moelab.tune.search import Trial, TuneResult
from moelab.tune.space import tuning_of
from moelab.tune.trials import TrialPlan


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


SCHEDULE_SETTINGS = {
    "tbo": "schedule: two-batch overlap (one micro-batch's dispatch/combine under the other's expert GEMMs): "
    "Megatron-Core --overlap-moe-expert-parallel-comm; SGLang --enable-two-batch-overlap",
    "chunked": "schedule: the token pipeline over more micro-batches (moelab e2e mode chunked)",
    "expert": "schedule: expert-chunked pipelining (each group of experts' dispatch/combine under the previous "
    "group's GEMMs, every expert keeping its rows; moelab e2e mode expert)",
    "columns": "schedule: the second expert GEMM and the combine in hidden-column slices (each slice's combine "
    "under the next slice's GEMM, every expert keeping its rows; moelab e2e mode columns)",
}


def framework_settings(plan: TrialPlan, winner: Trial) -> list[str]:
    """Lines a user of Megatron-Core, torchtitan or the library itself sets for the winning configuration:
    the backend's (its tune space's settings), then the schedule's."""
    c = winner.candidate
    k = c.knob_dict()
    tuning = tuning_of(c.backend)
    out = tuning.settings(c.sms, k, plan.workload_for(c.backend)) if tuning is not None else []
    if c.mode == "serial":
        return [*out, "schedule: serial (no micro-batch overlap)"]
    out.append(SCHEDULE_SETTINGS.get(c.mode, f"schedule: {c.mode}"))
    held = resolve_carveout(k.get("carveout", "auto"), c.mode, c.sms)
    if held:
        out.append(
            f"expert GEMMs held to the GPU's SMs minus {held} while the communication runs beside them: "
            f"torch._C._set_sm_carveout_experimental({held}) around the overlapped layer, None after "
            "(moelab e2e knob carveout)"
        )
    return out


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1%}"


def _margin(result: TuneResult, other: Trial | None) -> str:
    """The winner's margin over `other`, with its interval over the final round's starts where it ran
    them (--repeat): 'indistinguishable' where the interval covers no difference."""
    w = result.winner
    text = _pct(result.margin(w, other))
    ci = result.margin_interval(w, other)
    if ci is None:
        return text + (" (one start per job: no interval; --repeat 3 for one)" if other is not None else "")
    verdict = "indistinguishable" if ci[0] <= 0.0 <= ci[1] else "ahead"
    return f"{text} [{_pct(ci[0])}, {_pct(ci[1])}] over {len(w.per_start)} starts: {verdict}"


def summary_lines(plan: TrialPlan, result: TuneResult) -> list[str]:
    w = result.winner
    lines = [
        f"winner: {w.candidate.describe()}: {w.tokens_per_s or 0:.4g} tokens/s per rank (run {w.run_id})",
        f"  margin over the runner-up ({result.runner_up.candidate.describe() if result.runner_up else 'none'}): "
        f"{_margin(result, result.runner_up)}",
        f"  margin over the default settings ({result.default.candidate.describe() if result.default else 'not timed'}): "
        f"{_margin(result, result.default)}",
        f"  search cost: {len(result.trials)} trials over {len(result.run_ids)} runs "
        f"(the full product would be {result.full_product})",
    ]
    return lines
