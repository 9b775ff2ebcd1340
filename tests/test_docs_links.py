"""The docs stay honest: links resolve, and the repository speaks of the product.

* **Links.** Every relative Markdown link in `README.md`, `docs/` and `benchmarks/` names a file
  or folder of the repository (an `#anchor` after it is not checked), and every backticked
  repository path that starts with `docs/`, `benchmarks/`, `tests/` or `src/` exists.
* **No narration.** Docs, source, benchmarks and tests describe what the product does; how it
  was built (numbered work periods, "the fifth round", tracker numbers of this project, the
  machines and tools it was built with) stays out. Citations of other projects' issues and pull
  requests ("vLLM issue #2442", "SGLang PR #2904") are sources and stay.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve()

# Committed measurement data (server logs, JSON) is what it is: not scanned.
DATA_DIRS = ("benchmarks/real_vllm/data", "benchmarks/real_gpu/data", "benchmarks/calibration/data")


def _files(patterns: tuple[str, ...]) -> list[Path]:
    found: set[Path] = set()
    for pattern in patterns:
        for path in ROOT.glob(pattern):
            rel = path.relative_to(ROOT).as_posix()
            if path.is_file() and not rel.startswith(DATA_DIRS) and path.resolve() != THIS:
                found.add(path)
    return sorted(found)


MARKDOWN = _files(("README.md", "docs/**/*.md", "benchmarks/**/*.md"))
SCANNED = _files(
    (
        "README.md",
        "docs/**/*.md",
        "benchmarks/**/*.md",
        "benchmarks/**/*.py",
        "benchmarks/**/*.sh",
        "src/**/*.py",
        "tests/**/*.py",
        "setup.py",
        "pyproject.toml",
        "Dockerfile",
        ".ci/*",
    )
)

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`((?:docs|benchmarks|tests|src)/[A-Za-z0-9_./-]+)`")

NARRATION = {
    "a numbered work period": re.compile(
        r"(?<!-)\b(?:work )?sessions? \d+(?:'s|[–-]\d+)?\b(?! turns)", re.I
    ),
    "a numbered round of work": re.compile(
        r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th)"
        r"|earlier|previous|last|next|same|this) round\b",
        re.I,
    ),
    "this project's tracker number": re.compile(
        r"(?<!vLLM )(?<!SGLang )(?<!nccl-tests )(?<!PyTorch )\b(?:issue|PR)s? ?#?\d+", re.I
    ),
    "a work-session reference": re.compile(
        r"\b(?:this|that|the same|one|each) session's? (?:machine|code)\b"
        r"|\b(?:in|during) this session\b",
        re.I,
    ),
    "a provisioning detail": re.compile(
        r"\bdevice (?:call|machine|tool)s?\b|\bcarry=\[|nvidia-h\d00(?:-x\d)?\b"
    ),
    "a workspace path": re.compile(r"/work/"),
}


def test_relative_links_resolve():
    broken = []
    for doc in MARKDOWN:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, a mailto:, or an anchor in the same page
            path = target.split("#", 1)[0]
            if not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)}: ({target})")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_backticked_repository_paths_exist():
    missing = []
    for doc in MARKDOWN:
        for path in CODE_PATH.findall(doc.read_text(encoding="utf-8")):
            path = path.rstrip(".")
            if any(ch in path for ch in "*<>") or (ROOT / path).exists():
                continue
            missing.append(f"{doc.relative_to(ROOT)}: `{path}`")
    assert not missing, "paths that are not in the repository:\n" + "\n".join(missing)


def test_no_narration_of_how_it_was_built():
    found = []
    for path in SCANNED:
        for lineno, line in enumerate(
            path.read_text(encoding="utf-8", errors="replace").splitlines(), 1
        ):
            for what, pattern in NARRATION.items():
                m = pattern.search(line)
                if m:
                    found.append(f"{path.relative_to(ROOT)}:{lineno}: {what}: {m.group(0)!r}")
    assert not found, "say what the product does instead:\n" + "\n".join(found)


def test_the_narration_patterns_catch_what_they_mean_to():
    """Each pattern fires on narration and stays quiet on the product's own words."""
    caught = [
        "A fifth round (session 9): the records on another core",
        "measured in this session's machine",
        "what it measured in this session (2 shared cores)",
        "before issue #12 the planner",
        "the issue 13 helper's run",
        "one device call of 425 s",
        "built with /work/shared/gpu-vllm/build_payload.sh",
    ]
    quiet = [
        "session 5 turns, think 8.2 s",
        "round-robin over both hosts; a 503 round trip; --sessions 16 --turns 4",
        "4 interleaved passes (`--rounds`) of 200 streams",
        "vLLM issue #2442 shows 0.6–1.1 ms NCCL all-reduce kernels",
        "nccl-tests issue #212; SGLang PR #2904",
        "a session resends its history; each session's turns",
    ]
    patterns = list(NARRATION.values())
    assert all(any(p.search(s) for p in patterns) for s in caught), caught
    assert not any(p.search(s) for p in patterns for s in quiet), quiet
