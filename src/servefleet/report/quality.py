"""The output-quality comparison (``servefleet quality``'s quality.json) as tables: printed by
the command, and a section of the HTML report (``report html`` of a folder that holds one)."""

from __future__ import annotations

from servefleet.report.tables import TableData

QUALITY_FILE = "quality.json"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def _num(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def quality_tables(data: dict) -> list[TableData]:
    s = data["summary"]
    ref, cand = data["reference"], data["candidate"]
    overall = TableData(
        "quality",
        "Output quality: candidate against reference",
        ["measure", "value"],
        [
            ["prompts (failed)", f"{s['prompts']} ({s['errors']})"],
            ["exact match", _pct(s["exact_match_rate"])],
            ["reference tokens differing", _pct(s["differing_token_share"])],
            [
                "prompts diverged; first divergence p50",
                f"{s['diverged']}; token {_num(s['first_divergence_p50'], 0)}",
            ],
            *[
                [f"|Δ logprob| {k} (reference's tokens)", _num(v)]
                for k, v in s["abs_logprob_delta"].items()
            ],
            ["logprobs compared (missing)", f"{s['logprob_deltas']} ({s['missing_logprobs']})"],
        ],
        caption=(
            f"reference {ref['model']} at {ref['url']}; candidate {cand['model']} at "
            f"{cand['url']}; greedy, {data['settings']['max_tokens']} tokens at most, "
            f"{data['settings']['endpoint']} endpoint. Δ logprob: the candidate's logprob of the "
            "reference's token minus the reference's, up to the first divergence."
        ),
    )
    tables = [overall]
    acc = s.get("accuracy")
    if acc:
        rows = [
            [name, _pct(a["value"]), f"{_pct(a['low'])} … {_pct(a['high'])}"]
            for name, a in (("reference", acc["reference"]), ("candidate", acc["candidate"]))
        ]
        d = acc["difference"]
        rows.append(
            [
                "candidate − reference",
                f"{100 * d['value']:+.1f} pts",
                f"{100 * d['low']:+.1f} … {100 * d['high']:+.1f} pts",
            ]
        )
        tables.append(
            TableData(
                "accuracy",
                f"Accuracy on the task file ({acc['graded']} graded prompts)",
                ["side", "accuracy", "95 % interval"],
                rows,
                caption="correct: the expected answer appears in the output (case and spacing "
                "ignored); Wilson intervals per side, a paired normal interval for the difference",
            )
        )
    per = TableData(
        "quality-prompts",
        "Prompts that differ",
        ["#", "first divergence", "tokens differing", "max |Δ logprob|", "reference", "candidate"],
    )
    for p in data["prompts"]:
        if p["exact"] and not p.get("error"):
            continue
        deltas = [abs(x) for x in p["logprob_deltas"]]
        per.rows.append(
            [
                str(p["index"]),
                p["error"]
                or ("-" if p["first_divergence"] is None else str(p["first_divergence"])),
                f"{p['differing']}/{p['compared']}",
                _num(max(deltas)) if deltas else "-",
                p["reference"][:80],
                p["candidate"][:80],
            ]
        )
    if per.rows:
        tables.append(per)
    for t in tables:
        t.marks = [""] * len(t.rows)
    return tables
