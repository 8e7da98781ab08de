"""The shape of the JSON document a benchmark writes (:meth:`~.run.BenchResult.to_json`,
``localllm bench --json FILE``), as JSON Schema (draft 2020-12): :data:`JSON_SCHEMA`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["JSON_SCHEMA", "RATIO_FIGURES", "SCHEMA_ID"]

SCHEMA_ID = "localllm-bench/1"
"""The ``schema`` field of the JSON document; bumped when its shape changes incompatibly."""

_NUM = {"type": ["number", "null"]}
_INT = {"type": ["integer", "null"]}
_STR = {"type": ["string", "null"]}

RATIO_FIGURES = (
    "aggregate_tps",
    "stream_tps_p50",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "prefill_tps_p50",
)
"""The figures of a point that a run compares with the reference's (``ratios`` rows)."""


def _object(properties: dict[str, Any], required: Sequence[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required if required is not None else properties),
    }


def _rows(level: dict[str, Any], figures: dict[str, Any]) -> dict[str, Any]:
    """An array of objects that each name a level of a sweep (target, sweep, clients, prompt
    length, cache: ``level`` adds to or overrides these) and carry ``figures``."""
    where = {
        "target": {"type": "string"},
        "sweep": {"enum": ["concurrency", "prompt", "conversation"]},
        "clients": {"type": "integer"},
        "prompt_tokens": {"type": "integer"},
        "cache": {"enum": ["cold", "warm"]},
    }
    return {"type": "array", "items": _object({**where, **level, **figures})}


JSON_SCHEMA: dict[str, Any] = _object(
    {
        "schema": {"const": SCHEMA_ID},
        "created_at": {"type": "string"},
        "localllm_version": {"type": "string"},
        "host": _object(
            {"platform": {"type": "string"}, "python": {"type": "string"}, "cpus": _INT}
        ),
        "model": {"type": "string"},
        "workload": _object(
            {
                "levels": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                "prompt_tokens": {"type": "integer"},
                "answer_tokens": {"type": "integer"},
                "prompt_lengths": {"type": "array", "items": {"type": "integer"}},
                "prefill_answer_tokens": {"type": "integer"},
                "rounds": {"type": "integer", "minimum": 1},
                "options": {"type": "object"},
                "conversation": {
                    "oneOf": [
                        {"type": "null"},
                        _object(
                            {
                                name: {"type": "integer", "minimum": 1}
                                for name in ("users", "turns", "system_tokens", "turn_tokens")
                            }
                        ),
                    ]
                },
            },
            required=[
                "levels",
                "prompt_tokens",
                "answer_tokens",
                "prompt_lengths",
                "prefill_answer_tokens",
                "rounds",
                "options",
            ],
        ),
        "targets": {
            "type": "array",
            "minItems": 1,
            "items": _object(
                {
                    "label": {"type": "string"},
                    "kind": {"enum": ["localllm", "ollama", "openai"]},
                    "url": {"type": "string"},
                    "model": {"type": "string"},
                    "options": {"type": "object"},
                    "setting": {"type": "object"},
                    "error": _STR,
                    "memory": {
                        "oneOf": [
                            {"type": "null"},
                            _object(
                                {
                                    "kv_cache_type": {"type": "string"},
                                    "kv_cache_type_assumed": {"type": "boolean"},
                                    "kv_cells": _INT,
                                    "kv_bytes": _INT,
                                    "size": _INT,
                                    "runner_rss": _INT,
                                }
                            ),
                        ]
                    },
                }
            ),
        },
        "notes": {"type": "array", "items": {"type": "string"}},
        "points": _rows(
            {"clients": {"type": "integer", "minimum": 1}},
            {
                "requests": {"type": "integer"},
                "failed": {"type": "integer"},
                "errors": {"type": "array", "items": {"type": "string"}},
                "ttft_p50_ms": _NUM,
                "ttft_p95_ms": _NUM,
                "stream_tps_p50": _NUM,
                "aggregate_tps": _NUM,
                "queue_ms_p50": _NUM,
                "prefill_tps_p50": _NUM,
                "cached_tokens_mean": _NUM,
                "prompt_tokens_mean": _NUM,
                "wall_s": {"type": "number"},
            },
        ),
        "ratios": _rows(
            {"reference": {"type": "string"}},
            dict.fromkeys(RATIO_FIGURES, _NUM),
        ),
        "samples": _rows(
            {"prompt_tokens_target": {"type": "integer"}},
            {
                "round": {"type": "integer"},
                "client": {"type": "integer"},
                "start_s": {"type": "number"},
                "ok": {"type": "boolean"},
                "error": _STR,
                "status": _INT,
                "ttft_ms": _NUM,
                "duration_s": _NUM,
                "tokens": {"type": "integer"},
                "chunks": {"type": "integer"},
                "stream_tps": _NUM,
                "prompt_tokens": _INT,
                "cached_tokens": _INT,
                "server_ttft_ms": _NUM,
                "queue_ms": _NUM,
                "load_ms": _NUM,
                "prefill_tps": _NUM,
                "server_decode_tps": _NUM,
                "draft_tokens": _INT,
                "draft_accepted": _INT,
            },
        ),
    }
)
"""JSON Schema of the document :meth:`BenchResult.to_json` returns (and ``--json`` writes)."""
