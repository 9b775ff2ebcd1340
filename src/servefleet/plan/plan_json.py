"""``plan.json``: everything a plan decided and why, as JSON-ready data."""

from __future__ import annotations

from servefleet.sim.command import deployment_dict

from .band import rests_on
from .planner import Plan
from .precision import quality_check
from .search import CandidateResult


def _result_dict(r: CandidateResult) -> dict:
    return {
        "topology": r.candidate.name,
        "variant": r.candidate.variant,
        "tp": r.candidate.deployment.tp,
        "replicas": r.candidate.deployment.replicas,
        "policy": r.candidate.policy,
        "flags": r.candidate.flags.values(),
        "max_rate": r.max_rate if r.best else None,
        "stopped_early_low_load_does_not_help": r.futile,
        "points": [p.to_dict() for p in r.points],
        "wall_seconds": r.wall,
    }


def plan_dict(plan: Plan) -> dict:
    """Everything the plan decided and why, as JSON-ready data (``plan.json``)."""
    req, dep, point = plan.request, plan.deployment, plan.point
    s = req.settings
    return {
        "kind": "plan",
        "request": {
            "model": req.model,
            "gpu": req.gpu,
            "gpus_per_host": req.num_gpus,
            "hosts": req.hosts,
            "workload": req.workload,
            "slo": {
                "ttft": req.slo.ttft,
                "itl": req.slo.itl,
                "percentile": req.slo.percentile,
                "classes": None if req.slo.classes is None else sorted(req.slo.classes),
                "class_limits": {n: {"ttft": t, "itl": i} for n, t, i in req.slo.limits},
            },
            "target_rate": req.target_rate,
            "gpu_price_per_hour": req.gpu_price,
            "dtype": req.dtype,
            "client": req.client.to_dict(),
            "claims": dict(req.claims),
            "search": {
                "window": s.window,
                "warmup": s.warmup,
                "seed": s.seed,
                "rel_tol": s.rel_tol,
                "min_rate": s.min_rate,
                "max_window": s.max_window,
            },
        },
        "model": {
            "name": plan.model.name,
            "params": plan.model.num_params,
            "layers": plan.model.num_layers,
            "heads": plan.model.num_attention_heads,
            "kv_heads": plan.model.num_kv_heads,
            "head_dim": plan.model.head_dim,
        },
        "gpu": {
            "name": plan.gpu.name,
            "memory_bytes": plan.gpu.memory_bytes,
            "hbm_bandwidth": plan.gpu.hbm_bandwidth,
            "flops": dict(plan.gpu.flops),
            "bf16": plan.gpu.bf16,
        },
        "workload": plan.profile.to_dict(plan.glob.block_size),
        "precision": plan.precision.to_dict(),
        "quantization": [q.to_dict() for q in plan.quantization],
        "quality_check": _quality_check(plan),
        "memory": [r.to_dict() for r in plan.memory],
        "flags": plan.flags.to_dict(),
        "physical_bounds": [f.to_dict() for f in plan.slo_findings],
        "topologies": [_result_dict(r) for r in plan.topologies],
        "variants": [_result_dict(r) for r in plan.variants],
        "choice": plan.choice_reason,
        "sustainability": None
        if plan.sustainability is None
        else plan.sustainability.to_dict()
        | {"finalists": [_result_dict(r) for r in plan.sustainability.results]},
        "chosen": {
            "topology": plan.chosen.candidate.name,
            "variant": plan.chosen.candidate.variant,
            "deployment": deployment_dict(dep),
            "policy": plan.chosen.candidate.policy,
            "rate": point.rate,
            "nominal_rate": plan.nominal_rate,
            "recommended_rate": plan.recommended_rate,
            "duration": point.duration,
            "warmup": point.warmup,
            "seed": point.seed,
            "predicted": point.to_dict(),
            "rests_on": rests_on(dep),
            "simulate_command": plan.simulate_command,
        },
        "model_error": plan.model_error.to_dict()
        | {
            "breaks_with_error": plan.breaks_with_error,
            "recommended_with_error": dict(zip(("ttft", "itl"), plan.with_error(), strict=True)),
        },
        "uncertainty_band": plan.band.to_dict() if plan.band else None,
        "settle_ranking": plan.settle,
        "knee_rate": plan.knee_rate,
        "frontier": [f.to_dict() for f in plan.frontier],
        "gateway": plan.gateway.to_dict(),
        "capacity": plan.capacity.to_dict() if plan.capacity else None,
        "cost": plan.cost.to_dict() if plan.cost else None,
        "target_cost": plan.target_cost.to_dict() if plan.target_cost else None,
        "plausibility": [
            f.to_dict()
            for f in [
                *([plan.target_finding] if plan.target_finding else []),
                *plan.claim_findings,
                *plan.prediction_findings,
            ]
        ],
        "fleet": plan.fleet.model_dump(mode="json"),
        "vllm_serve": plan.commands,
        "timing": {
            "search_seconds": plan.search_seconds,
            "stage_seconds": plan.stage_seconds,
            "capacity_check_seconds": plan.capacity_seconds,
            "wall_seconds": plan.wall_seconds,
            "points_simulated": plan.points_simulated,
            "simulation_cpu_seconds": plan.simulation_cpu,
            "jobs": plan.jobs,
        },
    }


def _quality_check(plan: Plan) -> dict | None:
    check = quality_check(
        plan.precision.dtype, plan.request.overrides.kv_cache_dtype, plan.quantization
    )
    return None if check is None else {"offered": check[0], "command": check[1]}
