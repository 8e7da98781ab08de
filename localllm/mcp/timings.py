"""Where the time of one message went when the model used tools: each model step (with the
daemon's own TTFT, prefill and decode figures), each tool call, each sampling request a
server made, and the time spent waiting for the person to approve, kept apart so that "the
model is slow" and "the tool is slow" can be told apart (``run --verbose``, the TUI)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..run_stats import format_duration

__all__ = ["LoopTimings", "Step"]


@dataclass
class Step:
    """One timed piece of the loop."""

    kind: str
    """``model``, ``tool`` or ``sampling``."""
    label: str
    """``step 2``, ``time/get_current_time``..."""
    seconds: float
    """Wall time, without the wait for approval."""
    final: dict[str, Any] | None = None
    """For model steps and sampling: the daemon's timings (Ollama's field names)."""
    waited: float = 0.0
    """Seconds spent waiting for the person's approval before it."""
    status: str = ""
    """For tools: done, error, timeout, declined, stopped."""


def _seconds(value: float) -> str:
    return format_duration(value * 1e9)


def _model_detail(final: dict[str, Any]) -> str:
    parts = []
    if "ttft_duration" in final:
        parts.append(f"TTFT {_seconds(final['ttft_duration'] / 1e9)}")
    if final.get("prompt_evaluated_count") is not None:
        parts.append(
            f"prefill {final.get('prompt_evaluated_count', 0)} tok "
            f"in {_seconds(final.get('prompt_eval_duration', 0) / 1e9)}"
        )
    if "eval_count" in final:
        parts.append(
            f"decode {final['eval_count']} tok in {_seconds(final.get('eval_duration', 0) / 1e9)}"
        )
    return " · ".join(parts)


@dataclass
class LoopTimings:
    """Every step of one message's loop, in order."""

    steps: list[Step] = field(default_factory=list)
    """What happened, in order."""

    def add(self, step: Step) -> Step:
        """Record ``step``."""
        self.steps.append(step)
        return step

    def total(self, kind: str) -> float:
        """Seconds spent in steps of ``kind``."""
        return sum(step.seconds for step in self.steps if step.kind == kind)

    @property
    def waited(self) -> float:
        """Seconds spent waiting for the person."""
        return sum(step.waited for step in self.steps)

    def summary(self) -> str:
        """One line: time in the model vs in tools (and sampling, and waiting)."""
        models = [s for s in self.steps if s.kind == "model"]
        tools = [s for s in self.steps if s.kind == "tool" and s.status != "declined"]
        sampling = [s for s in self.steps if s.kind == "sampling"]
        prefill = sum((s.final or {}).get("prompt_eval_duration", 0) for s in models) / 1e9
        decode = sum((s.final or {}).get("eval_duration", 0) for s in models) / 1e9
        parts = [
            f"model {_seconds(self.total('model'))} ({len(models)} step"
            f"{'s' if len(models) != 1 else ''}: prefill {_seconds(prefill)}, decode "
            f"{_seconds(decode)})",
            f"tools {_seconds(self.total('tool'))} ({len(tools)} call"
            f"{'s' if len(tools) != 1 else ''})",
        ]
        if sampling:
            parts.append(f"sampling {_seconds(self.total('sampling'))} ({len(sampling)})")
        if self.waited >= 0.001:
            parts.append(f"waiting for you {_seconds(self.waited)}")
        return "loop: " + " · ".join(parts)

    def lines(self) -> list[str]:
        """One line per step, then the summary (``run --verbose``)."""
        width = max((len(f"{s.kind} {s.label}") for s in self.steps), default=0) + 2
        out = []
        for step in self.steps:
            name = f"{step.kind} {step.label}"
            detail = _model_detail(step.final) if step.final else step.status
            waited = (
                f" (after {_seconds(step.waited)} waiting for you)" if step.waited >= 0.001 else ""
            )
            out.append(
                f"{name + ':':<{width}}{_seconds(step.seconds):>9}  {detail}{waited}".rstrip()
            )
        out.append(self.summary())
        return out
