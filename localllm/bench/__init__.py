"""Load generation and measurement for ``localllm bench``: the throughput-vs-latency curve of
this machine, measured through the public HTTP API the way users meet it.

The pieces, one module each, from the bottom up:

* :mod:`.drivers`: a :class:`Driver` sends one streamed completion and reports what came back,
  for three server kinds: ``localllm`` (:class:`LocalllmDriver`, through
  :class:`~localllm.client.AsyncClient`), ``ollama`` (:class:`OllamaDriver`,
  ``/api/generate`` over httpx) and ``openai`` (:class:`OpenAIDriver`, ``/v1/completions``
  with SSE: llama-server, vLLM, LM Studio...);
* :mod:`.load`: :func:`run_level` starts N such requests at once and returns one
  :class:`Sample` per request plus the level's wall time (``benchmarks/`` drive their servers
  with it too); :class:`PromptMaker` makes the prompts;
* :mod:`.conversation`: the conversation workload, a replayed multi-turn trace (more users
  than slots, a shared system prompt, histories growing with the server's answers), one turn
  of every user at once (:func:`~.conversation.run_turn`);
* :mod:`.stats`: :class:`Sample`, :class:`Point` (a level summarized by :func:`summarize`),
  :func:`percentile`;
* :mod:`.run`: :class:`Bench` runs a :class:`Workload` (a concurrency sweep, a conversation
  trace, then a prompt-length sweep cold and cached) against one or more :class:`Target` s,
  interleaved level by level so that machine noise hits every target alike;
* :mod:`.compare`: :class:`SpawnedDaemon` starts a private daemon for one ``--compare``
  setting that only a daemon restart can change (``kv_cache_type``, ``num_parallel``,
  ``flash_attention``...), sharing the user's model files through a temporary home (hard
  links, else symbolic links);
* :mod:`.schema`: the JSON document's shape; :mod:`.report`: tables, terminal charts and the
  SVG/PNG/HTML report (rich, plotext, matplotlib: imported only by who shows results).

The command line is :mod:`localllm.cli.bench`.

The workload is a greedy raw completion of a counting prompt ("1, 2, 3, ...") with a unique tag
in front of every request, so answers rarely stop early and no request reuses another's prefix
unless the prompt sweep's cached run asks for exactly that. Prompt lengths are hit by measuring
the server's characters per token once (a one-token request) and cutting the text to length;
the samples keep the token counts the server reported.

The JSON document (:meth:`BenchResult.to_json`, ``--json FILE``) has the shape that
:data:`JSON_SCHEMA` describes (JSON Schema, draft 2020-12)::

    {"schema": "localllm-bench/1", "created_at": ISO time, "localllm_version": str,
     "host": {"platform", "python", "cpus"}, "model": str,
     "workload": {"levels", "prompt_tokens", "answer_tokens", "prompt_lengths",
                  "prefill_answer_tokens", "rounds", "options",
                  "conversation": {"users", "turns", "system_tokens", "turn_tokens"} | null},
     "targets": [{"label", "kind", "url", "model", "options", "setting", "error",
                  "memory": {"kv_cache_type", "kv_cache_type_assumed", "kv_cells",
                             "kv_bytes", "size", "runner_rss"} | null}],
     "points":  [{"target", "sweep", "clients", "prompt_tokens", "cache", "requests", "failed",
                  "errors", "ttft_p50_ms", "ttft_p95_ms", "stream_tps_p50", "aggregate_tps",
                  "queue_ms_p50", "prefill_tps_p50", "cached_tokens_mean",
                  "prompt_tokens_mean", "wall_s"}],
     "ratios":  [{"target", "reference", "sweep", "clients", "prompt_tokens", "cache",
                  "aggregate_tps", "stream_tps_p50", "ttft_p50_ms", "ttft_p95_ms",
                  "prefill_tps_p50"}],
     "samples": [{"target", "sweep", "clients", "prompt_tokens_target", "cache", "round",
                  "client", "start_s", "ok", "error", "status", "ttft_ms", "duration_s",
                  "tokens", "chunks", "stream_tps", "prompt_tokens", "cached_tokens",
                  "server_ttft_ms", "queue_ms", "load_ms", "prefill_tps",
                  "server_decode_tps", "draft_tokens", "draft_accepted"}]}

``sweep`` is ``concurrency``, ``prompt`` or ``conversation``; in the conversation sweep
``clients`` counts the users and ``prompt_tokens`` (``prompt_tokens_target`` in samples) is the
turn, from 1 (the first turn ``cold``, later ones ``warm``).

Times are milliseconds (``_ms``) or seconds (``_s``); rates are tokens per second. A ratio is
the target's figure divided by the reference's (the first target) at the same level. A figure
that could not be measured (every request of a level failed, a server that does not report
it) is ``null``.
"""

from __future__ import annotations

from .._exceptions import BenchError
from .compare import SpawnedDaemon, compare_plan, compare_targets
from .drivers import Driver, LocalllmDriver, OllamaDriver, OpenAIDriver, detect_driver
from .load import PromptMaker, run_level
from .run import (
    DEFAULT_LEVELS,
    DEFAULT_PROMPT_LENGTHS,
    Bench,
    BenchResult,
    Target,
    Workload,
    run_bench,
)
from .schema import JSON_SCHEMA, SCHEMA_ID
from .stats import Point, Sample, percentile, summarize

__all__ = [
    "DEFAULT_LEVELS",
    "DEFAULT_PROMPT_LENGTHS",
    "JSON_SCHEMA",
    "SCHEMA_ID",
    "Bench",
    "BenchError",
    "BenchResult",
    "Driver",
    "LocalllmDriver",
    "OllamaDriver",
    "OpenAIDriver",
    "Point",
    "PromptMaker",
    "Sample",
    "SpawnedDaemon",
    "Target",
    "Workload",
    "compare_plan",
    "compare_targets",
    "detect_driver",
    "percentile",
    "run_bench",
    "run_level",
    "summarize",
]
