"""What both deployments are asked: a prompt file, a task file (prompts with the expected
answer), or the built-in prompts.

* A prompt file: one prompt per line (``.txt``), or JSONL with a ``prompt`` field per line.
* A task file: JSONL, ``{"prompt": ..., "answer": ...}`` per line (``expected`` is read as
  ``answer`` too); the answers are graded by ``compare.is_correct``.

Errors name the file and the line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class PromptFileError(ValueError):
    """A prompt or task file is wrong; the message names the file and the line."""


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    expected: str | None = None


BUILT_IN = (
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about a lighthouse.",
    "What is 17 multiplied by 23? Answer with the number only.",
    "List three prime numbers greater than 50.",
    "Translate 'good morning, how are you?' into French.",
    "Summarize the plot of Romeo and Juliet in one sentence.",
    "Write a Python function that reverses a string.",
    "What is the capital of Australia?",
    "Give two advantages and two drawbacks of remote work.",
    "Describe the water cycle to a ten-year-old.",
    "What does HTTP status code 404 mean?",
    "Name the planets of the solar system in order from the sun.",
    "Write a short apology email for missing a meeting.",
    "Convert 100 degrees Fahrenheit to Celsius and show the steps.",
    "What is the difference between a list and a tuple in Python?",
    "Suggest a name for a bakery that sells only bread.",
    "Explain what a hash table is in three sentences.",
    "What year did the first person walk on the moon?",
    "Write a SQL query that counts the rows of a table named orders.",
    "Give a one-line definition of entropy in physics.",
    "What is the square root of 144?",
    "Write a limerick about a cat who learns to code.",
    "Explain the difference between weather and climate.",
    "What are the three primary colours of light?",
)
"""Fixed prompts for a quick check when no file is given (prefer your own: the cost of a lower
precision depends on the traffic)."""


def load_prompts(path: str | Path) -> list[Prompt]:
    """A prompt file or a task file (see the module docstring)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise PromptFileError(f"{p}: cannot read the prompt file: {e.strerror}") from None
    out = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if p.suffix == ".txt":
            out.append(Prompt(line.strip()))
            continue
        where = f"{p}:{no}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise PromptFileError(f'{where}: expected {{"prompt": "...", "answer": "..."}}')
        answer = obj.get("answer", obj.get("expected"))
        if answer is not None and not isinstance(answer, str | int | float):
            raise PromptFileError(f"{where}: the answer must be a string, got {answer!r}")
        out.append(Prompt(obj["prompt"], None if answer is None else str(answer)))
    if not out:
        raise PromptFileError(f"{p}: no prompts; write one per line")
    return out
