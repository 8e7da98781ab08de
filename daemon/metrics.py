"""Prometheus metrics: counters and histograms fed by finished requests, gauges read at scrape.

One :class:`Metrics` per app (its own ``CollectorRegistry``), so several daemons in one test
process do not share counters. Prefill and decode are measured apart, as are TTFT and queueing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from .loadconfig import drafter_label
from .runner.protocol import GenerationResult, Stats
from .scheduler import LoadedModel, Scheduler

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]

# Phases of the first token run from microseconds (parsing) to seconds (a load).
_PHASE_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    10,
)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    """The daemon's metrics registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        """Everything this daemon exports."""
        self._per_model_gauges: list[Gauge] = []
        """Gauges with labels: cleared at each scrape, since the models they name may be gone."""
        self.http_requests = self._counter(
            "localllm_http_requests",
            "HTTP requests answered, by route and status code.",
            ["method", "route", "status"],
        )
        self.requests = self._counter(
            "localllm_requests",
            "Generation requests finished, by model, API and done reason.",
            ["model", "api", "done_reason"],
        )
        self.prompt_tokens = self._counter(
            "localllm_prompt_tokens",
            "Prompt tokens, by model: evaluated (prefilled) or reused from the KV cache.",
            ["model", "kind"],
        )
        self.generated_tokens = self._counter(
            "localllm_generated_tokens", "Tokens generated, by model.", ["model"]
        )
        self.draft_tokens = self._counter(
            "localllm_draft_tokens",
            "Speculative draft tokens verified, by model and outcome (accepted or rejected).",
            ["model", "outcome"],
        )
        self.saved_prefix_bytes = self._gauge(
            "localllm_saved_prefix_bytes",
            "KV state of idle prompt prefixes kept outside the context, by model and tier.",
            ["model", "tier"],
        )
        self.prefix_restores = self._gauge(
            "localllm_prefix_restores",
            "Saved prefixes restored into a slot since the model's runner started.",
            ["model"],
        )
        self.engine_time = self._gauge(
            "localllm_engine_seconds",
            "Seconds of each runner's engine thread since it started, by part: decode "
            "(llama_decode of generation batches), step (the rest of each step: batch building, "
            "sampling, detokenizing, stop checks, handing tokens over), idle (no work), other "
            "(admitting requests, the prefix cache's tiers, embeddings).",
            ["model", "part"],
        )
        self.engine_decodes = self._gauge(
            "localllm_engine_decodes",
            "Generation decodes (steps) each runner's engine ran since it started.",
            ["model"],
        )
        self.embedded_tokens = self._counter(
            "localllm_embedding_tokens", "Tokens embedded, by model.", ["model"]
        )
        self.ttft = self._latency(
            "localllm_time_to_first_token_seconds",
            "Time from arrival at the daemon to the first generated token.",
        )
        self.queue_wait = self._latency(
            "localllm_queue_wait_seconds", "Time a request waited in the runner for a slot."
        )
        self.first_token_phase = Histogram(
            "localllm_first_token_phase_seconds",
            "Where the time to first token went, by model and phase: parse (HTTP, body, "
            "validation), plan, queue, load, handover (to the runner and back), template, "
            "tokenize, wait (in the runner for a slot), prefill, sample, detokenize, relay "
            "(the engine's events back to the daemon), out (to the first byte).",
            ["model", "phase"],
            buckets=_PHASE_BUCKETS,
            registry=self.registry,
        )
        self.prefill = self._latency(
            "localllm_prefill_duration_seconds", "Time spent evaluating prompt tokens."
        )
        self.decode = self._latency(
            "localllm_decode_duration_seconds", "Time from the first generated token to the last."
        )
        self.load = self._latency(
            "localllm_model_load_seconds", "Time to start a runner and load its model."
        )
        self.queue_depth = self._gauge(
            "localllm_queue_depth",
            "Requests waiting for a slot, in the daemon and in the runners' queues.",
        )
        self.loaded_models = self._gauge("localllm_loaded_models", "Models loaded now.")
        self.busy_slots = self._gauge(
            "localllm_busy_slots", "Slots prefilling or decoding.", ["model"]
        )
        self.total_slots = self._gauge("localllm_slots", "Slots of each model.", ["model"])
        self.runner_waiting = self._gauge(
            "localllm_runner_waiting", "Requests waiting inside a runner.", ["model"]
        )
        self.kv_used = self._gauge("localllm_kv_cells_used", "KV cache cells in use.", ["model"])
        self.kv_total = self._gauge("localllm_kv_cells", "KV cache size in cells.", ["model"])
        self.decode_rate = self._gauge(
            "localllm_decode_tokens_per_second",
            "Generated tokens per second over the last seconds, all slots.",
            ["model"],
        )
        self.prefill_rate = self._gauge(
            "localllm_prefill_tokens_per_second",
            "Prompt tokens per second over the last seconds.",
            ["model"],
        )
        self.drafter = self._gauge(
            "localllm_drafter",
            "1 for the drafter of each loaded model's speculative decoding: ngram, "
            "draft:<draft model> or off.",
            ["model", "drafter"],
        )
        self.runner_of = self._gauge(
            "localllm_runner_model",
            "1 for each loaded model and the model whose runner serves it (itself, or the "
            "model that loaded the base GGUF it shares: the base is in memory once).",
            ["model", "runner"],
        )
        self.adapter_bytes = self._gauge(
            "localllm_adapter_bytes",
            "Bytes each LoRA adapter of a loaded model takes on its runner's base model.",
            ["model", "adapter", "runner"],
        )
        self.adapter_switches = self._gauge(
            "localllm_adapter_switches",
            "Steps a runner ran with another LoRA adapter set than the step before.",
            ["model"],
        )
        self.memory_planned = self._gauge(
            "localllm_memory_planned_bytes",
            "Bytes the memory plan gives each loaded model per device, by part: weights, kv, "
            "compute, other (projector, draft), prefix_cache (RAM for saved prompts, at most).",
            ["model", "device", "part"],
        )
        self.memory_used = self._gauge(
            "localllm_memory_used_bytes",
            "Bytes each loaded model's runner holds now per device (the host's RAM: its "
            "resident set; GPU buffers are allocated whole at load, as planned).",
            ["model", "device"],
        )
        self.device_memory = self._gauge(
            "localllm_device_memory_bytes",
            "Memory of each device, free and total: the host's RAM as this daemon may use it "
            "(cgroup-aware), GPUs as llama.cpp reported them at the latest load.",
            ["device", "state"],
        )
        self.threads = self._gauge(
            "localllm_runner_threads",
            "CPU threads of each runner: what decode steps and batch steps (prefill, "
            "embeddings) use now, the runner's own count (max) and the daemon's share (budget).",
            ["model", "kind"],
        )
        self.threads_limit = self._gauge(
            "localllm_runner_threads_limit",
            "1 for what holds each runner's decode thread count where it is: max (its own "
            "count), cpu (other processes use the cores), budget (shared with other working "
            "models), tuner (fewer threads ran faster) or fixed (num_thread, or the governor off).",
            ["model", "limit"],
        )
        self.cpu_others = self._gauge(
            "localllm_cpu_others_cores",
            "Cores other processes used over the last half second, as each runner's governor "
            "read them (/proc/stat).",
            ["model"],
        )
        self.thread_changes = self._gauge(
            "localllm_runner_thread_changes",
            "Changes of each runner's thread counts since it started.",
            ["model"],
        )

    def _counter(self, name: str, documentation: str, labels: Sequence[str]) -> Counter:
        return Counter(name, documentation, labels, registry=self.registry)

    def _gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        """A gauge set at each scrape; one with labels is also cleared first."""
        gauge = Gauge(name, documentation, labels, registry=self.registry)
        if labels:
            self._per_model_gauges.append(gauge)
        return gauge

    def _latency(self, name: str, documentation: str) -> Histogram:
        """Seconds per request, by model."""
        return Histogram(
            name, documentation, ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry
        )

    def observe_first_token(self, model: str, phases: Mapping[str, float]) -> None:
        """Where one request's time to first token went (phase → ms, ``ttft`` the sum)."""
        for phase, ms in phases.items():
            if phase != "ttft":
                self.first_token_phase.labels(model, phase).observe(ms / 1000)

    def observe_load(self, loaded: LoadedModel) -> None:
        """A model finished loading."""
        self.load.labels(loaded.name).observe(loaded.load_seconds)

    def observe_generation(self, model: str, api: str, result: GenerationResult) -> None:
        """A generation request ended."""
        t = result.timings
        self.requests.labels(model, api, result.done_reason).inc()
        self.prompt_tokens.labels(model, "evaluated").inc(max(t.prompt_tokens - t.cached_tokens, 0))
        self.prompt_tokens.labels(model, "cached").inc(t.cached_tokens)
        self.generated_tokens.labels(model).inc(t.completion_tokens)
        if t.completion_tokens:
            self.ttft.labels(model).observe(t.ttft_ms / 1000)
            self.decode.labels(model).observe(t.decode_ms / 1000)
        self.queue_wait.labels(model).observe(t.queued_ms / 1000)
        if t.draft_tokens:
            accepted = min(t.draft_accepted, t.draft_tokens)
            self.draft_tokens.labels(model, "accepted").inc(accepted)
            self.draft_tokens.labels(model, "rejected").inc(t.draft_tokens - accepted)
        self.prefill.labels(model).observe(t.prompt_ms / 1000)

    def _engine_time(self, name: str, stats: Stats) -> None:
        decode, steps = stats.engine_decode_seconds, stats.engine_step_seconds
        idle = stats.engine_idle_seconds
        parts = {
            "decode": decode,
            "step": max(steps - decode, 0.0),
            "idle": idle,
            "other": max(stats.engine_seconds - steps - idle, 0.0),
        }
        for part, seconds in parts.items():
            self.engine_time.labels(name, part).set(seconds)
        self.engine_decodes.labels(name).set(stats.engine_decodes)

    def _memory(self, loaded: list[LoadedModel]) -> None:
        from .memory.plan import HOST
        from .memory.system import host_memory, process_memory

        host = host_memory()
        self.device_memory.labels(HOST, "free").set(host.available)
        self.device_memory.labels(HOST, "total").set(host.total)
        for model in sorted(loaded, key=lambda m: m.loaded_at):
            plan = model.plan
            if plan is None or model.share.owner is not model:
                continue  # a runner shared by several models is counted once
            for device in plan.devices:
                if not device.is_host:  # the latest load's reading wins
                    self.device_memory.labels(device.name, "free").set(device.free)
                    self.device_memory.labels(device.name, "total").set(device.total)
            for use in plan.uses:
                for part in ("weights", "kv", "compute", "other"):
                    self.memory_planned.labels(model.name, use.device, part).set(getattr(use, part))
            self.memory_planned.labels(model.name, HOST, "prefix_cache").set(plan.prefix_cache)
            held = process_memory(model.pid) if model.pid is not None else None
            if held is not None:
                self.memory_used.labels(model.name, HOST).set(held.rss)

    async def render(self, scheduler: Scheduler) -> bytes:
        """Refresh the gauges from the scheduler and runners, then the exposition text."""
        self.queue_depth.set(scheduler.queued)
        loaded = scheduler.loaded()
        self.loaded_models.set(len(loaded))
        for gauge in self._per_model_gauges:
            gauge.clear()  # models unloaded since the last scrape disappear
        self._memory(loaded)
        for model in loaded:
            name = model.name
            self.total_slots.labels(name).set(model.config.n_slots)
            self.drafter.labels(name, drafter_label(model.config)).set(1)
            runner = model.share.owner.name if model.share.owner is not None else name
            self.runner_of.labels(name, runner).set(1)
            for adapter in model.share.describe_adapters(model.model):
                digest = adapter["digest"].removeprefix("sha256:")[:12]
                self.adapter_bytes.labels(name, digest, runner).set(adapter["size"])
            if model.share.owner is not model:
                continue  # the runner's own gauges are reported under the model that loaded it
            stats: Stats | None = await scheduler.stats(model)
            if stats is None:
                continue
            self.adapter_switches.labels(name).set(stats.adapter_switches)
            self.busy_slots.labels(name).set(sum(s.state != "idle" for s in stats.slots))
            self.runner_waiting.labels(name).set(stats.waiting)
            self.kv_used.labels(name).set(stats.kv_cells_used)
            self.kv_total.labels(name).set(stats.kv_cells_total)
            self.decode_rate.labels(name).set(stats.decode_tokens_per_s)
            self.prefill_rate.labels(name).set(stats.prefill_tokens_per_s)
            self.saved_prefix_bytes.labels(name, "ram").set(stats.saved_prefix_ram_bytes)
            self.saved_prefix_bytes.labels(name, "disk").set(stats.saved_prefix_disk_bytes)
            self.prefix_restores.labels(name).set(stats.prefix_restores)
            self._engine_time(name, stats)
            if (threads := stats.threads) is not None:
                for kind in ("decode", "batch", "max", "budget"):
                    self.threads.labels(name, kind).set(getattr(threads, kind))
                self.threads_limit.labels(name, threads.limit).set(1)
                if threads.others is not None:
                    self.cpu_others.labels(name).set(threads.others)
                self.thread_changes.labels(name).set(threads.changes)
        return generate_latest(self.registry)
