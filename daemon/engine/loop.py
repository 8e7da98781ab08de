"""The engine: continuous batching over llama.cpp sequences, on one thread.

Each step is one ``llama_decode`` of one batch holding

1. one token for every slot that is generating, then
2. prompt chunks of slots still prefilling, oldest request first, until the batch is full
   (chunked prefill: a long prompt never stalls other streams).

The KV cache is one stream per slot, as llama-server keeps it (a unified cache only when a
pool smaller than slots x context is asked for): attention in a stream spans that slot's cells
alone, so idle slots' prefixes and long neighbours cost a stream nothing. llama.cpp computes a
batch's sequences in one pass only while their ids are consecutive, so a new request takes the
free slot that keeps the busy ids in the fewest runs.

Prefix caching: a slot keeps its KV cells after its request ends. A new request takes (among
those) the free slot whose cached tokens share the longest prefix with its prompt and prefills
only the rest (at least one token is always evaluated, for fresh logits). Across slots, a
prompt prefix that another sequence already holds comes over with ``llama_memory_seq_cp``: a
copy of that slot's stream, trimmed (in a unified cache the cells are tagged, not copied). A
request whose prefix an older request is prefilling right now waits for it instead of
computing the same prefix twice.

Images (see :mod:`.vision`) are runs of pseudo-tokens in the prompt, so prefix caching treats
them like text; when a slot's prefill reaches one, its embeddings are decoded into the slot's
sequence in a decode of their own between steps (a batch holds tokens or embeddings, not both),
and the text after it goes on in the steps' batches.

Everything here runs on the engine thread; other threads talk to it through :meth:`submit`,
:meth:`cancel`, :meth:`embed` and read :meth:`stats`.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..devices.faults import DeviceFault, decode_failure, injected_fault
from ..devices.governor import Governor, Kind, ThreadChange
from ..devices.spread import WorkerSpread
from ..kv.prefixcache import PrefixCache
from ..kv.tiers import MIN_SAVED_TOKENS, PrefixTiers
from ..lora.adapters import Adapters, StepGroups
from ..runner.protocol import (
    ErrorEvent,
    Event,
    SlotStats,
    Stats,
    Timings,
    TokenEvent,
    TokenLogprob,
)
from ..speculation.draft_model import DraftModel, DraftModelDrafter
from ..speculation.drafting import Speculation
from ..speculation.policy import DraftPolicy
from .admission import AdmissionOrder
from .ahead import Ahead
from .batching import BatchPlan, fill_batch, plan_batch
from .embedding import embed_step
from .jobs import EmbeddingJob, Emit, GenerationJob, done_event, joined_tokens, stopped_error
from .keptlogits import KeptLogits
from .model import LlamaModel
from .sampling import GrammarError, Sampler, logits_at, token_logprobs
from .shift import context_shift
from .slots import (
    MIN_SHARED_WAIT,
    Slot,
    SlotState,
    choose_slot,
    prefix_source,
    should_wait_for,
)
from .text import TextStream
from .vision import is_image_token

__all__ = ["Engine", "EngineTime"]

log = logging.getLogger("localllm.runner.engine")

# Window over which the tokens/s gauges are computed.
_RATE_WINDOW_S = 3.0
# With a KV stream per slot, sharing a prefix another slot holds copies that slot's whole
# stream (every cell of its context, used or not). Same model and CPU: copying a 2,048-cell
# stream made the next decode 10 ms longer, while 7 more prompt tokens in it cost 27 ms, so
# a stream copy pays once it spares about one token per 800 of its cells; taken at half that
# rate here. Not measured with layers on a GPU: there sharing keeps needing MIN_SHARED_WAIT.
_STREAM_CELLS_PER_TOKEN_CPU = 400


@dataclass
class EngineTime:
    """Where the engine thread's time went since it started, in seconds (written by the
    engine thread only; a reader elsewhere sees a snapshot that may lag one step).

    A step is one generation ``llama_decode`` with everything around it: prefix copies
    between slots, the images a prefill reached, planning and filling the batch, sampling,
    detokenizing, stop checks and handing the step's events over. What is neither a step nor
    waiting for work is admitting requests, the prefix cache's tiers and embeddings.
    """

    started: float = 0.0
    """``time.perf_counter()`` when the engine thread started (0: not yet)."""
    idle: float = 0.0
    """Blocked waiting for work, with no slot busy (the current wait not included)."""
    waiting_since: float = 0.0
    """When the current wait for work began (0: not waiting)."""
    steps: float = 0.0
    """In steps, their decodes included."""
    decode: float = 0.0
    """Inside the steps' ``llama_decode`` calls (failed attempts included)."""
    decodes: int = 0
    """Steps' ``llama_decode`` calls."""


class Engine:
    """Continuous batching over a :class:`LlamaModel`'s sequences.

    A request handed to the engine always ends with a ``done`` or ``error`` event, also when
    the engine stops or crashes; ``on_exit`` (called on the engine thread as it ends) lets the
    process exit when the engine thread is gone, so no request can wait for a dead engine.
    """

    def __init__(
        self,
        model: LlamaModel,
        on_exit: Callable[[], None] | None = None,
        prefix_cache: PrefixCache | None = None,
        num_draft: int = 0,
        draft: DraftModel | None = None,
        governor: Governor | None = None,
    ) -> None:
        self.model = model
        self.governor = governor or Governor(
            model.n_threads,
            fixed=model.config.fixed_threads,
            fixed_reason=f"fixed at {model.n_threads} (num_thread, or LOCALLLM_GOVERNOR=off)",
        )
        """Decides each step's CPU thread count (see :mod:`.governor`)."""
        self.governor.on_change = self._threads_changed
        self.spread = WorkerSpread()
        """Keeps llama.cpp's workers off this thread's CPU in a prompt's step."""
        self.prefix_cache = prefix_cache
        """Host-RAM and disk tiers for idle prefixes (None: idle cells are simply dropped)."""
        self.slots = [Slot(i) for i in range(model.n_slots)]
        self._kept = {slot.seq_id: KeptLogits() for slot in self.slots}
        """Each slot's logits of its last prompt (see :mod:`.keptlogits`)."""
        self._keeping: list[KeptLogits] = []
        self.waiting: collections.deque[GenerationJob] = collections.deque()
        self.order = AdmissionOrder()
        """Which waiting request goes next: most cached first, no one past 2x FCFS's wait."""
        self.embeddings: collections.deque[EmbeddingJob] = collections.deque()
        """Embedding jobs in arrival order; one batch of inputs runs between two steps."""
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._rates: collections.deque[tuple[float, int, int]] = collections.deque()
        self._rates_lock = threading.Lock()
        # Held while deciding whether the engine still takes work, so that nothing is queued
        # after the final drain of the inbox.
        self._accepting_lock = threading.Lock()
        self._accepting = True
        self._on_exit = on_exit
        self.requests_total = 0
        self.time = EngineTime()
        """Where the engine thread's time went (for stats: decode against the rest)."""
        self.crashed = False
        """Set when the engine thread ended with an exception."""
        self.fault: str | None = None
        """Why the GPU stopped the engine (:class:`.faults.DeviceFault`), when it did."""
        on_gpu = model.n_gpu_layers > 0
        self._faults = injected_fault(on_gpu)
        self._held: dict[Emit, list[Event]] | None = None
        """While a step's samples are applied: its events by destination, handed over
        together when the step ends (see :meth:`_emit`)."""
        self.tiers = PrefixTiers(model, self.slots, prefix_cache)
        """Moves idle slots' cells to the prefix cache and back."""
        self.speculation = Speculation(model, self.slots, self.tiers, num_draft, draft)
        """Which slots draft, how much, and with what (see :mod:`.drafting`)."""
        self.ahead = Ahead(model, model.config.n_ahead)
        """Sequences that give waiting requests their first token while the slots are busy
        (see :mod:`.ahead`)."""
        self.adapters = Adapters(model)
        """The LoRA adapters loaded on the model; a step runs one adapter set's slots."""
        self._groups = StepGroups()
        if model.unified_kv:
            least_shared = 1  # sequences share cells by tagging them: nothing is copied
        elif on_gpu:
            least_shared = MIN_SHARED_WAIT
        else:
            least_shared = max(1, -(-model.n_ctx_per_slot // _STREAM_CELLS_PER_TOKEN_CPU))
        self._least_shared = least_shared
        """Fewest prompt tokens a prefix shared from another slot must add (see
        _STREAM_CELLS_PER_TOKEN_CPU)."""

    # -- the outside world's interface (any thread) ---------------------------------------

    def start(self) -> None:
        """Start the engine thread."""
        self._thread.start()

    def _put(self, kind: str, payload: Any, refuse: Callable[[], None] | None = None) -> None:
        with self._accepting_lock:
            if self._accepting:
                self._inbox.put((kind, payload))
                self.model.interrupt.set()
                return
        if refuse is not None:
            refuse()

    def submit(self, job: GenerationJob) -> None:
        """Queue a generation; it starts as soon as a slot is free."""
        self._put("generate", job, lambda: job.emit(stopped_error(job.id)))

    def cancel(self, job_id: str) -> None:
        """Cancel a waiting or running generation; it ends with done_reason ``cancel``."""
        self._put("cancel", job_id)

    def embed(self, job: EmbeddingJob) -> None:
        """Queue an embedding job (run between generation steps)."""
        self._put("embed", job, lambda: job.emit(stopped_error(job.id)))

    def call(self, work: Callable[[], None], refuse: Callable[[], None]) -> None:
        """Run ``work`` on the engine thread between steps (loading LoRA adapters: llama.cpp's
        model is touched on that thread only); ``refuse`` runs instead once it stopped."""
        self._put("call", work, refuse)

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel everything, end the thread, then free llama.cpp's resources.

        Call it once nothing else uses the model (prompt preparation reads its vocabulary).
        """
        self._put("stop", None)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            if not self.crashed:
                self.tiers.persist()
            self.model.close()
            if self.speculation.draft is not None:
                self.speculation.draft.close()

    def stats(self) -> Stats:
        """A snapshot of the gauges (approximate while the engine runs)."""
        slots = []
        for slot in self.slots:
            job = slot.job
            state = "idle" if job is None else ("prefill" if slot.prefilling else "decode")  # type: ignore[assignment]
            slots.append(
                SlotStats(
                    id=slot.seq_id,
                    state=state,
                    request_id=job.id if job else None,
                    cached_tokens=len(slot.cache),
                    prompt_tokens=len(job.prompt) if job else 0,
                    prefilled_tokens=min(len(slot.cache), len(job.prompt)) if job else 0,
                    generated_tokens=slot.generated if job else 0,
                )
            )
        now = time.perf_counter()
        with self._rates_lock:
            while self._rates and self._rates[0][0] < now - _RATE_WINDOW_S:
                self._rates.popleft()
            decoded = sum(r[1] for r in self._rates)
            prefilled = sum(r[2] for r in self._rates)
        used = sum(len(s.cache) - s.shared for s in self.slots)
        clock = self.time
        # The finished waits first: a wait that ends between the two reads is then counted
        # once at most (the engine adds it to ``idle`` before clearing ``waiting_since``).
        idle = clock.idle
        if waiting := clock.waiting_since:
            idle += max(now - waiting, 0.0)
        saved = self.prefix_cache.stats() if self.prefix_cache is not None else None
        return Stats(
            slots=slots,
            waiting=len(self.waiting),
            kv_cells_used=max(0, used),
            # The slots' cells: the prefill-ahead sequences' streams are no room for them.
            kv_cells_total=self.model.n_ctx
            if self.model.unified_kv
            else self.model.n_ctx_per_slot * self.model.n_slots,
            decode_tokens_per_s=decoded / _RATE_WINDOW_S,
            prefill_tokens_per_s=prefilled / _RATE_WINDOW_S,
            requests_total=self.requests_total,
            saved_prefix_ram_bytes=saved.ram_bytes if saved else 0,
            saved_prefix_disk_bytes=saved.disk_bytes if saved else 0,
            prefix_restores=saved.restored if saved else 0,
            engine_seconds=now - clock.started if clock.started else 0.0,
            engine_idle_seconds=idle,
            engine_step_seconds=clock.steps,
            engine_decode_seconds=clock.decode,
            engine_decodes=clock.decodes,
            threads=self.governor.state(),
            adapters=self.adapters.stats(self.slots),
            adapter_switches=self.adapters.switches,
        )

    def set_budget(self, threads: int, reason: str) -> None:
        """The daemon's share of the cores (any thread; it applies from the next step)."""
        self.governor.set_budget(threads, reason)

    # -- the engine thread ----------------------------------------------------------------

    def _run(self) -> None:
        clock = self.time
        clock.started = time.perf_counter()
        try:
            while True:
                idle = (
                    not self.waiting
                    and not self.embeddings
                    and not any(slot.busy for slot in self.slots)
                )
                if idle:
                    self.model.interrupt.clear()  # what is sent from now on stops idle work
                if (
                    idle
                    and self._inbox.empty()  # a request already sent goes first
                    and not self.model.interrupt.expected  # or one being prepared
                    and (self.speculation.measure_piece() or self.model.prepare_pieces_step())
                ):
                    # What drafting costs, measured a decode at a time while nothing waits:
                    # a model's first request waits for one decode, not for all of them; the
                    # prompt pieces cache likewise, a millisecond's step at a time.
                    if not self._drain_inbox(block=False):
                        break
                    continue
                clock.waiting_since = time.perf_counter() if idle else 0.0
                if not self._drain_inbox(block=idle):
                    break
                if idle:
                    waited, clock.waiting_since = clock.waiting_since, 0.0
                    clock.idle += time.perf_counter() - waited
                self._admit()
                self._start_ahead()
                self.tiers.evict_idle()
                if self.embeddings:
                    embed_step(
                        self.embeddings, self.model, self.adapters, self.governor, self._use_threads
                    )
                if any(slot.busy for slot in self.slots):
                    stepped = time.perf_counter()
                    self._step()
                    clock.steps += time.perf_counter() - stepped
        except DeviceFault as exc:
            self.crashed, self.fault = True, str(exc)
            log.error("%s: the runner exits", exc)
        except BaseException:
            self.crashed = True
            log.exception("engine thread crashed; the runner exits")
        finally:
            self._shutdown()
            if self._on_exit is not None:
                self._on_exit()

    def _drain_inbox(self, block: bool) -> bool:
        """Handle queued commands; returns False when asked to stop."""
        while True:
            # While idle the governor's readings go on (see Governor.idle_wait).
            wait = self.governor.idle_wait() if block else None
            try:
                kind, payload = self._inbox.get(block=block, timeout=wait)
            except queue.Empty:
                if block:
                    self.governor.tick()
                return True
            block = False
            if kind == "generate":
                self.waiting.append(payload)
            elif kind == "cancel":
                self._cancel(payload)
            elif kind == "embed":
                self.embeddings.append(payload)
            elif kind == "call":
                payload()
            elif kind == "stop":
                return False

    def _cancel(self, job_id: str) -> None:
        for embedding in self.embeddings:
            if embedding.id == job_id:
                self.embeddings.remove(embedding)
                embedding.emit(ErrorEvent(id=job_id, message="cancelled", code="cancelled"))
                return
        for job in list(self.waiting):
            if job.id == job_id:
                if (ahead := self.ahead.holding(job_id)) is not None:
                    self._finish(ahead, "cancel")  # leaves the waiting queue too
                    return
                self.waiting.remove(job)
                if (parked := self.ahead.abandon(job_id)) is not None:
                    self._finish(parked, "cancel")  # with the text it has generated
                    return
                now = time.perf_counter()
                timings = Timings(
                    queued_ms=(now - job.arrived) * 1000, total_ms=(now - job.arrived) * 1000
                )
                timings.prompt_tokens = len(job.prompt)
                job.emit(done_event(job.id, "", "cancel", timings))
                return
        for slot in self.slots:
            if slot.job is not None and slot.job.id == job_id:
                self._finish(slot, "cancel")
                return

    def _admit(self) -> None:
        """Give waiting requests free slots, the most cached request first (see
        :mod:`.admission`; a parked request's prompt is wholly cached), each the slot with the
        longest cached prefix."""
        while self.waiting:
            free = [slot for slot in self.slots if not slot.busy]
            if not free:
                return
            job = self.order.take(self.waiting, free, self.tiers.cache, self.ahead.parked)
            if (ahead := self.ahead.holding(job.id)) is not None:
                # Its prefill ahead is not over: it goes on in the slot (from the ahead
                # sequence's cells, shared as any other sequence's).
                ahead.sampler.close()  # type: ignore[union-attr]
                ahead.job, ahead.sampler, ahead.state = None, None, SlotState.IDLE
            # When the requests waiting now take every free slot, no gap in the busy ids can
            # last, so where each goes is decided by its cached prefix alone.
            fills = len(self.waiting) + 1 >= len(free)
            # (none busy: the runs of busy ids are the same for every slot, none to count)
            busy = (
                None if self.model.unified_kv or fills else [s.seq_id for s in self.slots if s.busy]
            ) or None
            wanted = [waiting.prompt for waiting in self.waiting]
            slot, reuse = choose_slot(free, job.prompt, busy, wanted, job.adapters.key)
            if job.score is not None:
                reuse = 0  # every position's logits are needed: the prompt is evaluated whole
            row = self._kept_row(slot, job)
            if row is not None:
                reuse = len(job.prompt)  # no step: the first token comes from the kept row
            if len(slot.cache) - reuse >= MIN_SAVED_TOKENS:
                self.tiers.save(slot)  # the cells about to be overwritten stay reachable
            if job.id in self.ahead.parked:
                self._resume(job, slot)
                continue
            if job.score is None and row is None:
                reuse = self.tiers.restore(slot, job.prompt, reuse, job.adapters.key)
            if self._occupy(slot, job, reuse) and row is not None:
                self._sample(slot, time.perf_counter(), row)

    def _kept_row(self, slot: Slot, job: GenerationJob) -> Any:
        """The logits ``slot`` kept of exactly ``job``'s prompt, when they may stand for its
        first step (see :mod:`.keptlogits`); else None."""
        kept = self._kept.get(slot.seq_id)
        if (
            kept is None
            or job.score is not None
            or job.images
            or job.options.prefill_only
            or job.id in self.ahead.parked
            or slot.adapters != job.adapters.key
        ):
            return None
        return kept.row_for(job.prompt, slot.cache, job.adapters.key)

    def _occupy(self, slot: Slot, job: GenerationJob, reuse: int) -> bool:
        """Start ``job`` in ``slot`` (a slot or an ahead sequence), whose first ``reuse``
        cells hold the prompt's first tokens. False when its grammar is refused (the request
        has ended with the error)."""
        try:
            sampler = Sampler(
                self.model.vocab,
                self.model.n_vocab,
                job.options,
                job.grammar,
                self.model.n_ctx_per_slot,
            )
        except GrammarError as exc:
            job.emit(ErrorEvent(id=job.id, message=str(exc), code="bad_request"))
            return False
        last_n = job.options.repeat_last_n
        text = [t for t in job.prompt if not is_image_token(t)] if job.images else job.prompt
        sampler.learn_prompt(text if last_n < 0 else text[-last_n:] if last_n else [])
        reuse = job.image_start(reuse)
        self.model.seq_remove(slot.seq_id, reuse)
        slot.cache = slot.cache[:reuse]
        slot.shared = min(slot.shared, reuse)
        slot.adapters = job.adapters.key
        self.adapters.started(job.adapters)
        slot.job = job
        slot.state = SlotState.PREFILLING
        slot.sampler = sampler
        slot.text = TextStream(job.options.stop)
        slot.pending = None
        slot.output = []
        slot.logprobs = []
        max_draft = (
            job.options.num_draft if job.options.num_draft >= 0 else self.speculation.num_draft
        )
        if max_draft > 0:
            slot.drafter = self.speculation.drafter(text, images=bool(job.images))
            slot.policy = DraftPolicy(max_draft=max_draft)
        else:
            slot.drafter = slot.policy = None
        slot.drafted = slot.accepted = 0
        slot.reused = reuse
        slot.generated = 0
        slot.admitted = time.perf_counter()
        slot.first_token_at = 0.0
        slot.first_marks = (0.0, 0.0)
        slot.parked_ms = 0.0
        threads = self.model.threads_now
        slot.threads_min = slot.threads_max = threads
        slot.threads_why = self.governor.explain("decode", threads)
        return True

    def _start_ahead(self) -> None:
        """While every slot is busy, prefill waiting prompts in the free ahead sequences
        (oldest first; see :mod:`.ahead`), each from its longest cached prefix."""
        free = self.ahead.free()
        if not free or not self.waiting or not all(slot.busy for slot in self.slots):
            return
        drafts_with_model = self.speculation.draft is not None
        for job in self.ahead.candidates(self.waiting, drafts_with_model)[: len(free)]:
            slot, reuse = choose_slot(free, job.prompt)
            reuse = self.tiers.restore(slot, job.prompt, reuse)
            if self._occupy(slot, job, reuse):
                free.remove(slot)
            else:
                self.waiting.remove(job)  # it ended with its grammar's error

    def _resume(self, job: GenerationJob, slot: Slot) -> None:
        """A parked request got ``slot``: its cells go back in, and it decodes on."""
        refused = self.ahead.resume(job, slot)
        if refused is None:
            return
        for other in self.slots:  # perhaps no room (a unified cache): make some, try again
            if other is not slot and not other.busy and other.cache:
                self.tiers.evict(other)
        if self.model.restore_seq_state(slot.seq_id, refused):
            slot.cache = list(job.prompt)
        else:
            self._fail(slot, "llama.cpp refused the cells of the prompt prefilled ahead")

    def _share_prefixes(self) -> None:
        """Copy prompt prefixes other sequences hold into prefilling slots; a slot whose
        prefix an older request is still prefilling waits this step (state WAITING)."""
        sequences = [*self.slots, *self.ahead.slots]
        prefilling = sorted(
            (slot for slot in sequences if slot.prefilling),
            key=lambda slot: slot.job.arrived,  # type: ignore[union-attr]
        )
        unified = self.model.unified_kv
        for slot in prefilling:
            job = slot.job
            assert job is not None
            if job.score is not None:
                continue  # a scored prompt is evaluated whole (copied cells have no logits)
            # With a stream per slot, sharing copies a whole stream: once, when the wait is
            # over, and only for enough tokens to pay for the copy (_least_shared).
            if not unified and should_wait_for(slot, prefilling):
                slot.state = SlotState.WAITING
                continue
            source = prefix_source(slot, sequences, job.prompt)
            end = job.image_start(source.end) if source is not None else 0
            if source is not None and end >= len(slot.cache) + self._least_shared:
                start = len(slot.cache)
                self.model.seq_copy(source.slot.seq_id, slot.seq_id, start, end)
                slot.cache.extend(job.prompt[start:end])
                added = end - start
                if unified:  # tagged cells, not copies: the KV-use gauge counts them once
                    slot.shared = end if slot.shared == start else slot.shared + added
                slot.reused += added
            waits = unified and should_wait_for(slot, prefilling)
            slot.state = SlotState.WAITING if waits else SlotState.PREFILLING

    def _step(self) -> None:
        """One llama_decode: plan the batch, decode it, apply the results (images that
        prefills reached are decoded first, each on its own)."""
        self._share_prefixes()
        self._prefill_images()
        sequences = list(self.slots)
        if not any(slot.prefilling for slot in self.slots):
            # The slots' own prompts first: a request holding a slot never waits for the
            # prefill of one that waits for a slot (that would only trade first tokens).
            sequences += self.ahead.this_step()
        group, adapters = self._groups.pick(sequences)
        self.adapters.apply(self.model.ctx, adapters)
        prefill_budget = self.model.batch.capacity
        if any(slot.prefilling for slot in self.slots) and (held := self.governor.batch_tokens()):
            prefill_budget = min(prefill_budget, held)  # other programs hold the threads down
        drafting = True
        adapted = bool(adapters)  # reproducible requests computed as alone (see .batching)
        while True:
            plan = plan_batch(
                group, self.model.batch, self.speculation, prefill_budget, drafting, adapted
            )
            if plan.empty:
                return
            fill_batch(plan, sequences, self.model.batch, apart=adapted)
            kind: Kind = "batch" if any(count for _, count in plan.prefill) else "decode"
            threads = self._use_threads(kind)
            started = time.perf_counter()
            status = self._faults.before_decode() if self._faults else None
            if status is None:
                # a prompt's step after a pause wakes sleeping workers: not onto this CPU
                with self.spread.apart(threads if kind == "batch" else 1):
                    status = self.model.decode()
                self.model.synchronize()  # the device's work is in the timings too
            elapsed = time.perf_counter() - started
            self.time.decode += elapsed
            self.time.decodes += 1
            if status == 0:
                tokens = self.model.batch.size
                self.governor.observe(kind, threads, tokens, elapsed)
                in_batch = len(plan.decoding) + sum(1 for _, count in plan.prefill if count)
                if self.model.unified_kv or in_batch == 1:  # the batches drafts go into
                    self.speculation.costs.observe(tokens, elapsed)
                break
            prefill_in_batch = any(count for _, count in plan.prefill)
            if status == 1 and any(slot.draft for slot in plan.decoding):
                drafting = False  # drafts are the first thing to give up for room
                continue
            if status == 1 and self._make_room(prefill_in_batch, prefill_budget):
                if prefill_in_batch:
                    prefill_budget = max(1, prefill_budget // 2)
                continue
            if status < -1 and self.model.n_gpu_layers > 0:
                gpus = ", ".join(d for d in self.model.allocated if d != "CPU") or "GPU"
                message = decode_failure(status, gpus)
                self._fail_batch(plan, message)
                raise DeviceFault(message)
            self._fail_batch(plan, f"llama_decode failed with status {status}")
            return
        self._held = {}
        try:
            self._apply(plan, sequences)
        finally:
            self._release()
        while self._keeping:  # the first tokens are out: now their rows are copied
            self._keeping.pop().take(self.model.ctx, self.model.n_vocab)
        for slot in self.ahead.slots:
            if slot.job is not None and slot.decoding:  # its first token is out
                self.ahead.park(slot)

    def _emit(self, emit: Emit, event: Event) -> None:
        """Send ``event`` now, or, during a step, once the step's sampling is over.

        Sampling calls into llama.cpp, which releases the GIL: events sent one by one would
        each wake the runner's event loop and cost a socket write of their own. Held, a step
        of 8 streams costs one hand-over per connection, and no event waits longer than the
        rest of its own step's sampling. The text a step adds to one generation (several
        tokens where drafts were accepted) goes out as one event: every event costs a line
        to decode, a relay and an HTTP chunk in the daemon, whatever it holds, and a
        speculating stream would otherwise pay that per token while its step time per token
        shrinks.
        """
        held = self._held
        if held is None:
            emit(event)
            return
        events = held.setdefault(emit, [])
        last = events[-1] if events else None
        if isinstance(event, TokenEvent) and isinstance(last, TokenEvent) and last.id == event.id:
            events[-1] = joined_tokens(last, event)
        else:
            events.append(event)

    def _release(self) -> None:
        """Hand over the events held during a step, in order, one batch per destination
        where the destination takes batches (an ``emit`` with a ``many`` method)."""
        held, self._held = self._held, None
        for emit, events in (held or {}).items():
            many = getattr(emit, "many", None)
            if many is not None:
                many(events)
            else:
                for event in events:
                    emit(event)

    def _apply(self, plan: BatchPlan, sequences: list[Slot]) -> None:
        """Record the evaluated tokens in each slot's cache, then sample."""
        now = time.perf_counter()
        for slot in plan.decoding:
            slot.cache.append(slot.pending)  # type: ignore[arg-type]
        prefilled = 0
        for slot, count in plan.prefill:
            if count:
                start = len(slot.cache)
                slot.cache.extend(slot.job.prompt[start : start + count])  # type: ignore[union-attr]
                prefilled += count
        with self._rates_lock:
            self._rates.append((now, len(plan.decoding), prefilled))
            # Pruned here too: nobody may be reading stats, and the window is all we need.
            while self._rates[0][0] < now - _RATE_WINDOW_S:
                self._rates.popleft()
        for slot in sequences:
            job = slot.job
            if job is not None and job.score is not None and slot.chunk:
                job.score.collect(lambda index, token, job=job: self._logprob(index, token, job))
            if job is not None and slot.batch_index >= 0:
                if job.options.prefill_only:
                    self._finish(slot, "length")  # scored: nothing to generate
                else:
                    self._sample(slot, now)
            slot.batch_index, slot.chunk = -1, 0

    def _prefill_images(self) -> None:
        """Decode the image each prefilling slot has reached, if any, into its sequence; one
        that ends the prompt gives the logits of the first generated token."""
        for slot in self.slots:
            job = slot.job
            if job is None or slot.state is not SlotState.PREFILLING or not job.images:
                continue
            start = len(slot.cache)
            image = job.images.get(start)
            if image is None:
                continue
            if image.data is None:  # decoded once already, then its cells were dropped
                self._fail(slot, "an image's KV cells were lost before the prompt was done")
                continue
            end = start + image.n_tokens
            last = end == len(job.prompt)
            self.adapters.apply(self.model.ctx, job.adapters)
            status, index = self.model.decode_embeddings(
                image.data, image.n_tokens, start, slot.seq_id, last, image.non_causal
            )
            if status == 1:
                for other in self.slots:
                    if not other.busy and other.cache:
                        self.tiers.evict(other)
                self.model.seq_remove(slot.seq_id, start)
                status, index = self.model.decode_embeddings(
                    image.data, image.n_tokens, start, slot.seq_id, last, image.non_causal
                )
            if status != 0:
                self.model.seq_remove(slot.seq_id, start)
                reason = "no room in the KV cache" if status == 1 else f"status {status}"
                self._fail(slot, f"could not evaluate image at prompt position {start}: {reason}")
                continue
            slot.cache.extend(job.prompt[start:end])
            # Later prompts reuse these cells by their pseudo-tokens; the floats can go.
            image.data = None
            self.model.synchronize()  # the image's prefill is over when the device is done
            now = time.perf_counter()
            with self._rates_lock:
                self._rates.append((now, 0, image.n_tokens))
            if last:
                slot.batch_index = index
                self._sample(slot, now)
                slot.batch_index = -1

    def _make_room(self, prefill_in_batch: bool, prefill_budget: int) -> bool:
        """llama_decode found no KV room: free the least recently used idle cache (saved to
        the prefix cache first), then shrink prefill chunks, then end the longest sequence
        (its share of the cache is the most that frees). False if nothing is left to try."""
        idle = [slot for slot in self.slots if not slot.busy and slot.cache]
        if idle:
            self.tiers.evict(min(idle, key=lambda slot: slot.last_used))
            return True
        if prefill_in_batch and prefill_budget > 1:
            return True
        busiest = max((s for s in self.slots if s.busy), key=lambda s: len(s.cache), default=None)
        if busiest is None:
            return False
        self._finish(busiest, "length")
        return True

    def _sample(self, slot: Slot, now: float, row: Any = None) -> None:
        """Sample the slot's next token (from ``row``, kept logits, when given), and go on
        through its draft while the samples agree with it; rejected draft cells leave the KV
        cache."""
        sampler = slot.sampler
        job = slot.job
        assert sampler is not None and job is not None
        if (
            row is None
            and slot.first_token_at == 0.0
            and not job.images
            and (kept := self._kept.get(slot.seq_id)) is not None
        ):
            kept.note(slot.batch_index, job.prompt, slot.adapters)
            self._keeping.append(kept)
        draft = slot.draft
        # Counted first: a token below may end the request, and its timings must never show
        # more drafts accepted than verified.
        slot.drafted += len(draft)
        produced: list[int] = []
        budget = job.budget
        for i, index in enumerate([slot.batch_index, *slot.draft_indices]):
            forced = budget.next_forced() if budget is not None else None
            if forced is not None and not sampler.force(forced):
                budget.abandon()
                forced = None
            token = forced if forced is not None else sampler.sample(self.model.ctx, index, row)
            produced.append(token)
            matched = i < len(draft) and token == draft[i]
            if matched:
                slot.cache.append(token)  # its cell, computed as a draft, is valid
                slot.accepted += 1
            if self._take(slot, token, index, now, row):
                break
            if not matched:
                slot.pending = token
                slot.state = SlotState.DECODING
                break
        if draft:
            # Cells past the accepted tokens hold rejected drafts.
            self.model.seq_remove(slot.seq_id, len(slot.cache), -1)
        if (draft_model := self.speculation.draft) is not None and isinstance(
            slot.drafter, DraftModelDrafter
        ):
            draft_model.rollback(slot.seq_id, slot.cache)
        if slot.policy is not None:
            slot.policy.learn(slot.proposal, produced)
        slot.proposal, slot.draft, slot.draft_indices = [], [], []

    def _take(self, slot: Slot, token: int, index: int, now: float, row: Any = None) -> bool:
        """Account for one generated token; True when it ended the request."""
        job, text = slot.job, slot.text
        assert job is not None and text is not None
        first = slot.first_token_at == 0.0
        if first:
            slot.first_token_at = now
            sampled = time.perf_counter()
            slot.first_marks = (sampled - now, 0.0)
        slot.generated += 1
        if self.model.is_end_of_generation(token):
            self._finish(slot, "stop")
            return True
        slot.output.append(token)
        if slot.drafter is not None:
            slot.drafter.append(token)
        piece_bytes = self.model.piece(token, special=job.render_special)
        if job.budget is not None:
            job.budget.take(piece_bytes)
        if job.options.logprobs:
            slot.logprobs.append(self._logprob(index, token, job, piece_bytes, row))
        piece = text.push(piece_bytes)
        if first:  # the first token's own timings: the time to first token, split
            slot.first_marks = (slot.first_marks[0], time.perf_counter() - sampled)
        if piece:
            self._emit(job.emit, TokenEvent(job.id, piece, slot.take_logprobs()))
        options = job.options
        # Without num_predict a generation makes at most one context's worth of tokens: with
        # context shift it could otherwise run forever on a model that never stops.
        limit = options.num_predict if options.num_predict > 0 else self.model.n_ctx_per_slot
        at_context_end = len(slot.cache) + 1 >= self.model.n_ctx_per_slot
        if text.stopped:
            self._finish(slot, "stop")
            return True
        if slot.generated >= limit or (
            at_context_end and not (options.shift and context_shift(self.model, slot, self.slots))
        ):
            self._finish(slot, "length")
            return True
        return False

    def _logprob(
        self,
        batch_index: int,
        token: int,
        job: GenerationJob,
        piece: bytes | None = None,
        row: Any = None,
    ) -> TokenLogprob:
        logits = logits_at(self.model.ctx, batch_index, self.model.n_vocab, row)
        chosen, top = token_logprobs(logits, token, job.options.top_logprobs)

        def entry(token_id: int, logprob: float, data: bytes | None = None) -> TokenLogprob:
            data = self.model.piece(token_id) if data is None else data
            text = data.decode("utf-8", errors="replace")
            return TokenLogprob(token=text, logprob=logprob, bytes=list(data))

        result = entry(token, chosen, piece if piece is not None else self.model.piece(token, True))
        result.top_logprobs = [entry(t, lp) for t, lp in top]
        return result

    def _use_threads(self, kind: Kind) -> int:
        """Set the thread count the governor chooses for the next decode of ``kind``; the
        requests in the slots remember the fewest and most their steps ran with."""
        threads = self.governor.threads(kind)
        if threads != self.model.threads_now:
            self.model.set_threads(threads)
            if self.speculation.draft is not None:
                self.speculation.draft.model.set_threads(threads)
            why = self.governor.explain(kind, threads)
            for slot in (*self.slots, *self.ahead.slots):
                if slot.job is None:
                    continue
                if threads < slot.threads_min:
                    slot.threads_min, slot.threads_why = threads, why
                slot.threads_max = max(slot.threads_max, threads)
        return threads

    def _threads_changed(self, change: ThreadChange) -> None:
        log.info("%s threads %s", change.kind, change.describe())

    def _finish(self, slot: Slot, reason: str, error: str | None = None) -> None:
        job, text = slot.job, slot.text
        assert job is not None
        now = time.perf_counter()
        tail = text.finish() if text is not None and error is None else ""
        drafter = self.speculation.drafter_name(slot) if slot.drafted else ""
        timings = slot.timings(now, drafter, self.model.n_threads)
        full_text = text.text if text is not None else ""
        if slot.sampler is not None:
            slot.sampler.close()
        # Free the slot before telling anyone: a client that reacts to "done" by asking for
        # stats must see the slot idle.
        slot.job, slot.sampler, slot.text, slot.pending = None, None, None, None
        slot.state = SlotState.IDLE
        slot.last_used = now
        if self.ahead.owns(slot) and job in self.waiting:
            self.waiting.remove(job)  # it ended in its prefill ahead (e.g. at its first token)
        self.requests_total += 1
        logprobs = slot.take_logprobs() if tail else None
        slot.logprobs = []  # tokens of a stop string that was cut leave no text, nor logprobs
        if tail:
            self._emit(job.emit, TokenEvent(id=job.id, text=tail, logprobs=logprobs))
        done = done_event(job.id, full_text, reason, timings, error)
        done.result.stop_sequence = text.stopped_by if text is not None else None
        if job.return_context:
            done.result.context = job.prompt + slot.output
        if job.score is not None:
            done.result.prompt_logprobs = job.score.entries
        done.result.budget_exhausted = job.budget is not None and job.budget.exhausted
        self._emit(job.emit, done)

    def _fail(self, slot: Slot, message: str) -> None:
        self._finish(slot, "error", message)

    def _fail_batch(self, plan: BatchPlan, message: str) -> None:
        """A decode error: fail the requests in the batch and drop their uncertain KV state."""
        in_batch = plan.decoding + [slot for slot, count in plan.prefill if count]
        for slot in in_batch:
            if slot.job is not None:
                self.model.seq_remove(slot.seq_id, 0)
                slot.cache, slot.shared = [], 0
                self._fail(slot, message)
        for slot in (*self.slots, *self.ahead.slots):
            slot.batch_index, slot.chunk = -1, 0

    def _shutdown(self) -> None:
        """End every request the engine holds or has been handed, then free the model."""
        with self._accepting_lock:
            self._accepting = False
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "generate":
                self.waiting.append(payload)
            elif kind == "embed":
                self.embeddings.append(payload)
        for embedding in self.embeddings:
            embedding.emit(stopped_error(embedding.id))
        self.embeddings.clear()
        reason = "error" if self.crashed else "cancel"
        error = None
        if self.crashed:
            error = self.fault or "internal error in the engine (see the runner log)"
        for job in list(self.waiting):
            held = self.ahead.holding(job.id) or self.ahead.abandon(job.id)
            if held is not None:
                self._finish(held, reason, error)  # with what it has generated
                continue
            job.emit(done_event(job.id, "", reason, Timings(prompt_tokens=len(job.prompt)), error))
        self.waiting.clear()
        for slot in self.slots:
            if (job := slot.job) is not None:
                try:
                    self._finish(slot, reason, error)
                except Exception:  # a crash may have left the slot half-updated
                    # _finish may have cleared slot.job before it failed: the job taken above
                    # still gets its final event, so the request ends.
                    log.exception("could not end request %s cleanly", job.id)
                    slot.job, slot.state = None, SlotState.IDLE
                    job.emit(done_event(job.id, "", "error", Timings(), error or "engine stopped"))
