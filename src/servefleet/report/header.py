"""The report's header: what was measured (or simulated), on what, with which flags and which
workload — as (label, text) rows every format renders (pure)."""

from __future__ import annotations

from servefleet.report.run import RunData, client_protocol
from servefleet.report.verdict import slo_text


def header_rows(run: RunData) -> list[tuple[str, str]]:
    m = run.meta
    rows = [("run", _run_row(run))]
    if run.kind == "simulate":
        rows += _simulated(m.get("deployment") or {})
    else:
        rows += _measured(m)
    rows.append(("workload", _workload(m.get("workload") or {})))
    rows.append(("settings", _settings(run)))
    slos = slo_text(run.slo, run.max_error_rate)
    for name, s in sorted(run.class_slos.items()):
        slos += f"; class {name}: {slo_text(s, run.max_error_rate)}"
    if run.slo_classes is not None:
        slos += f"; judged on classes {', '.join(run.slo_classes)} only, each on its own"
    rows.append(("SLOs", slos))
    if m.get("gpu_telemetry"):
        rows.append(("GPU telemetry", str(m["gpu_telemetry"])))
    return rows


def _run_row(run: RunData) -> str:
    pts = run.sorted_points()
    what = "simulated" if run.kind == "simulate" else "measured"
    loads = f"{pts[0].label} … {pts[-1].label}" if len(pts) > 1 else (pts[0].label if pts else "-")
    status = "complete" if run.complete else "INCOMPLETE (interrupted or killed)"
    return f"{what}, {len(pts)} point(s): {loads}; {status}; folder {run.path or run.name}"


def _simulated(d: dict) -> list[tuple[str, str]]:
    per = f", {d['replicas_per_gpu']} per GPU" if (d.get("replicas_per_gpu") or 1) > 1 else ""
    dep = (
        f"{d.get('model')} ({d.get('dtype')}), {d.get('replicas')} replica(s) × TP={d.get('tp')} "
        f"on {d.get('gpu')}{per}"
    )
    flags = ", ".join(
        f"{k.replace('_', '-')} {_v(d[k])}"
        for k in (
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "gpu_memory_utilization",
            "block_size",
            "enable_prefix_caching",
            "enforce_eager",
        )
        if k in d
    )
    return [("deployment", dep), ("vLLM flags", flags)]


def _measured(m: dict) -> list[tuple[str, str]]:
    t = m.get("target") or {}
    info = m.get("server_info") or {}
    rows = [("target", f"{t.get('model')} at {t.get('url')} ({t.get('endpoint', 'chat')} API)")]
    reps = info.get("replicas")
    if reps:
        r0 = reps[0]
        known = [
            f"{label}{r0[k]}"
            for k, label in (
                ("gpu", ""),
                ("tp", "TP="),
                ("max_num_seqs", "max-num-seqs "),
                ("max_num_batched_tokens", "max-num-batched-tokens "),
            )
            if r0.get(k) is not None
        ]
        names = ", ".join(str(r.get("name") or r.get("url")) for r in reps)
        rows.append(
            (
                "deployment",
                f"{len(reps)} replica(s) behind a servefleet gateway ({names})"
                + (f"; {', '.join(known)}" if known else ""),
            )
        )
    cache = info.get("vllm:cache_config_info")
    if cache:
        rows.append(("KV cache", ", ".join(f"{k.replace('_', '-')} {v}" for k, v in cache.items())))
    sim = info.get("servefleet:sim_info")
    if sim:
        rows.append(("sim-server", ", ".join(f"{k.replace('_', '-')} {v}" for k, v in sim.items())))
    if info.get("version"):
        rows.append(("server version", str(info["version"])))
    s = m.get("settings") or {}
    opts = [
        "keep-alive" if s.get("reuse_connections", True) else "a connection per request",
        "ignore_eos" if s.get("ignore_eos", True) else "no ignore_eos",
    ]
    rows.append(("client", ", ".join(opts)))
    rows.append(("client protocol", client_protocol(m) or "-"))
    return rows


def _workload(w: dict) -> str:
    try:
        from servefleet.workload import WorkloadSpec, describe_workload

        text = describe_workload(WorkloadSpec.model_validate(w))
        return " | ".join(" ".join(x.split()) for x in text.splitlines() if x.strip())
    except Exception:  # a spec this version cannot rebuild (a dataset file gone...)
        classes = ", ".join(w.get("classes") or {}) or "a trace"
        return f"{w.get('name', '?')} ({classes})"


def _settings(run: RunData) -> str:
    s = run.meta.get("settings") or {}
    parts = []
    if s.get("duration"):
        longer = any(
            "--duration extended" in n for p in run.points for n in p.raw.get("notes") or []
        )
        parts.append(
            f"{s['duration']:g} s of arrivals per point"
            + (" (longer where a point's note says so: a whole burst period)" if longer else "")
        )
    if s.get("max_requests"):
        parts.append(f"at most {s['max_requests']} requests")
    parts.append(f"warm-up {s.get('warmup', 0):g} s")
    if s.get("cooldown"):
        parts.append(f"cool-down {s['cooldown']:g} s")
    if s.get("policy"):
        parts.append(f"routing {s['policy']}")
    parts.append(f"seed {s.get('seed', 0)}")
    parts.append(
        "counts cover every request; latency percentiles only those sent inside each "
        "point's window (after the warm-up, before the cool-down)"
    )
    return "; ".join(parts)


def _v(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return f"{v:g}" if isinstance(v, float) else str(v)
