"""``python -m localllm.daemon.runner --model PATH --socket PATH``: serve one model.

``python -m localllm.daemon.runner --spare-fd FD`` starts a spare runner, which imports ahead
and takes its arguments from the daemon later (:mod:`.spare`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import faulthandler
import gc
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..devices.faults import EXIT_DEVICE_FAULT
from ..kv.prefixcache import PrefixCache, layout_folder
from .protocol import RunnerConfig
from .threads import in_own_thread

if TYPE_CHECKING:
    from ..engine.model import LlamaModel
    from ..memory.plan import MemoryPlan

# How often the runner checks that the daemon that started it is still alive.
_PARENT_CHECK_S = 1.0
# The context per slot when the memory plan could not choose one.
_UNPLANNED_CONTEXT = 4096


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The runner's command line."""
    parser = argparse.ArgumentParser(prog="python -m localllm.daemon.runner", description=__doc__)
    parser.add_argument("--model", required=True, help="GGUF file to load")
    parser.add_argument(
        "--model-part", action="append", default=[], help="further parts of a split GGUF, in order"
    )
    parser.add_argument("--socket", required=True, help="Unix socket to listen on")
    parser.add_argument("--slots", type=int, default=4, help="parallel sequences")
    parser.add_argument("--ctx-per-slot", type=int, default=4096, help="context tokens per slot")
    parser.add_argument("--batch", type=int, default=512, help="tokens per llama_decode")
    parser.add_argument("--kv-cells", type=int, default=0, help="KV cache cells (0 = slots x ctx)")
    parser.add_argument(
        "--ahead", type=int, default=0, help="sequences prefilling waiting prompts (no decoding)"
    )
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0 = physical cores)")
    parser.add_argument(
        "--fixed-threads",
        action="store_true",
        help="keep --threads whatever the machine does (no CPU governor)",
    )
    parser.add_argument(
        "--gpu-layers", type=int, default=-1, help="-1 = all when a GPU backend exists"
    )
    parser.add_argument("--main-gpu", type=int, default=0, help="the GPU that holds the model")
    parser.add_argument(
        "--no-mmap", action="store_true", help="read the GGUF into memory instead of mapping it"
    )
    parser.add_argument("--mlock", action="store_true", help="lock the weights in RAM")
    parser.add_argument(
        "--cpu-repack",
        choices=["on", "off"],
        default=None,
        help="repack weights into llama.cpp's extra CPU buffer types (default: the CPU probe's "
        "decision)",
    )
    parser.add_argument("--kv-cache-type", choices=["f16", "q8_0", "q4_0"], default="f16")
    parser.add_argument("--flash-attention", choices=["auto", "on", "off"], default="auto")
    parser.add_argument(
        "--chat-template", default=None, help="Jinja template overriding the GGUF's"
    )
    parser.add_argument("--log-file", default=None, help="where llama.cpp and the runner log")
    parser.add_argument(
        "--num-draft", type=int, default=0, help="n-gram speculative draft tokens (0 = off)"
    )
    parser.add_argument(
        "--draft-model", default=None, help="GGUF of a draft model (same vocabulary) to draft with"
    )
    parser.add_argument("--draft-name", default=None, help="the draft model's name, for reports")
    parser.add_argument(
        "--kv-cache-dir", default=None, help="root folder for saved prompt prefixes (disk tier)"
    )
    parser.add_argument(
        "--kv-cache-ram", type=int, default=0, help="bytes of RAM for saved prompt prefixes"
    )
    parser.add_argument(
        "--kv-cache-disk", type=int, default=0, help="bytes of disk for saved prompt prefixes"
    )
    parser.add_argument(
        "--ready-fd", type=int, default=None, help="write 'ready' here once serving"
    )
    parser.add_argument(
        "--projector", default=None, help="vision projector GGUF (mmproj) for reading images"
    )
    parser.add_argument(
        "--rpc-worker", action="append", default=[], help="host:port of an RPC worker to split onto"
    )
    parser.add_argument(
        "--rpc-lost",
        action="append",
        default=[],
        help="a worker that died under the previous runner: go on without it if still down",
    )
    parser.add_argument(
        "--memory-plan",
        action="store_true",
        help="plan the load against free memory first: a context of 0 and GPU layers of -1 "
        "are chosen to fit, and a load that cannot fit is refused before allocating",
    )
    parser.add_argument(
        "--reserve",
        action="append",
        default=[],
        metavar="DEVICE=BYTES",
        help="memory other loaded models may still grow into on a device (not free here)",
    )
    parser.add_argument(
        "--mapped-ram", type=int, default=0, help="bytes of other runners' mapped weights"
    )
    parser.add_argument(
        "--gpu-memory", type=int, default=0, help="the most bytes planned on each GPU (0: free)"
    )
    parser.add_argument(
        "--plan-only",
        action="store_true",
        help="print the memory plan (or why nothing fits) as JSON and exit without loading",
    )
    parser.add_argument("--debug", action="store_true", help="log llama.cpp debug output")
    return parser.parse_args(argv)


def _reserved(values: list[str]) -> dict[str, int]:
    reserved: dict[str, int] = {}
    for value in values:
        name, _, amount = value.rpartition("=")
        if not name or not amount.isdigit():
            raise SystemExit(f"--reserve wants DEVICE=BYTES, got {value!r}")
        reserved[name] = reserved.get(name, 0) + int(amount)
    return reserved


def _planned(config: RunnerConfig, plan: MemoryPlan) -> RunnerConfig:
    """``config`` with what the plan chose: context, GPU layers, the prefix cache's RAM, and
    the prefill-ahead sequences that fit in what is left (planned without them).

    Split across RPC workers with no ``num_gpu`` given, the layers stay the split's to place
    (:mod:`.placement`: by each device's free memory, the local CPU's share included); the
    plan checked that the model fits those devices."""
    layers_open = config.rpc_workers and config.n_gpu_layers < 0
    if plan.n_ahead < config.n_ahead:
        logging.getLogger("localllm.runner").info(
            "%d of %d prefill-ahead sequences fit in the memory the plan leaves",
            plan.n_ahead,
            config.n_ahead,
        )
    return dataclasses.replace(
        config,
        n_ahead=plan.n_ahead,
        n_ctx_per_slot=plan.n_ctx_per_slot,
        n_gpu_layers=config.n_gpu_layers if layers_open else plan.n_gpu_layers,
        kv_cache_ram=plan.prefix_cache,
    )


def _report(args: argparse.Namespace, key: str, value: dict[str, Any]) -> None:
    """Tell the daemon the plan's verdict: on stdout for --plan-only, else on the ready pipe
    (a refusal, which ends the runner)."""
    line = json.dumps({key: value}) + "\n"
    if args.plan_only:
        sys.stdout.write(line)
        sys.stdout.flush()
    elif args.ready_fd is not None:
        os.write(args.ready_fd, b"nofit " + line.encode())
        os.close(args.ready_fd)


async def _serve(args: argparse.Namespace) -> int:
    from ..engine.loop import Engine
    from ..engine.model import LlamaModel, ModelLoadError
    from .server import RunnerServer

    config = RunnerConfig(
        model_path=args.model,
        extra_model_paths=args.model_part,
        n_slots=args.slots,
        n_ctx_per_slot=args.ctx_per_slot,
        n_batch=args.batch,
        kv_cells=args.kv_cells,
        n_ahead=args.ahead,
        n_threads=args.threads,
        fixed_threads=args.fixed_threads,
        n_gpu_layers=args.gpu_layers,
        main_gpu=args.main_gpu,
        use_mmap=not args.no_mmap,
        use_mlock=args.mlock,
        kv_cache_type=args.kv_cache_type,
        flash_attention=args.flash_attention,
        chat_template=args.chat_template,
        log_path=args.log_file,
        num_draft=args.num_draft,
        draft_model=args.draft_model,
        draft_name=args.draft_name,
        kv_cache_dir=args.kv_cache_dir,
        kv_cache_ram=args.kv_cache_ram,
        kv_cache_disk=args.kv_cache_disk,
        projector=args.projector,
        cpu_repack=None if args.cpu_repack is None else args.cpu_repack == "on",
        rpc_workers=args.rpc_worker,
        rpc_lost=args.rpc_lost,
        memory_plan=args.memory_plan or args.plan_only,
        memory_reserved=_reserved(args.reserve),
        mapped_ram=args.mapped_ram,
        gpu_memory=args.gpu_memory,
    )
    plan: MemoryPlan | None = None
    kept = False
    if config.memory_plan:
        from ..memory.measure import MeasureError
        from ..memory.plan import DoesNotFit
        from ..memory.plancache import plan_kept

        runner_log = logging.getLogger("localllm.runner")
        # Plans are kept beside the saved prefixes (a real load's only: /api/plan asks anew).
        folder = None if args.plan_only or not config.kv_cache_dir else Path(config.kv_cache_dir)
        try:
            plan, kept = await in_own_thread(
                lambda: plan_kept(config, folder / "plans" if folder else None), "localllm-plan"
            )
        except DoesNotFit as exc:
            runner_log.error("the model does not fit: %s", exc)
            _report(args, "nofit", exc.report.to_dict())
            return 0 if args.plan_only else 3
        except (MeasureError, OSError) as exc:  # llama.cpp cannot lay the model out
            runner_log.error("could not plan the load: %s", exc)
            return 2
        except Exception as exc:  # a planner bug must not make a loadable model unusable
            if args.plan_only:
                runner_log.exception("could not plan the load")
                return 2
            runner_log.warning("no memory plan (%r): loading as asked", exc)
            plan = None
            if config.n_ctx_per_slot == 0:
                config = dataclasses.replace(config, n_ctx_per_slot=_UNPLANNED_CONTEXT)
        if plan is not None:
            for warning in plan.warnings:
                runner_log.warning("%s", warning)
            if args.plan_only:
                _report(args, "plan", plan.to_dict())
                return 0
            config = _planned(config, plan)
    try:
        model = await in_own_thread(lambda: LlamaModel(config), "localllm-load")
    except ModelLoadError as exc:
        logging.getLogger("localllm.runner").error("%s", exc)
        return 2
    draft = None
    if config.draft_model:
        from ..speculation.draft_model import DraftModel

        try:
            draft = await in_own_thread(
                lambda: DraftModel(model, config.draft_model), "localllm-load"
            )
        except ModelLoadError as exc:
            logging.getLogger("localllm.runner").error("%s", exc)
            model.close()
            return 2
    projector = None
    if config.projector is not None:
        from ..engine.vision import VisionProjector

        try:
            projector = await in_own_thread(
                lambda: VisionProjector(config.projector, model), "localllm-load"
            )
        except ModelLoadError as exc:
            logging.getLogger("localllm.runner").error("%s", exc)
            if draft is not None:
                draft.close()
            model.close()
            return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    # The engine thread ending on its own means it crashed: exit, so that the daemon sees the
    # runner die and starts a new one, instead of queueing work for a dead engine.
    def engine_ended() -> None:
        with contextlib.suppress(RuntimeError):  # the loop already closed: we are exiting
            loop.call_soon_threadsafe(stop.set)

    engine = Engine(
        model,
        on_exit=engine_ended,
        prefix_cache=_prefix_cache(config, model),
        num_draft=config.num_draft,
        draft=draft,
    )
    engine.start()
    server = RunnerServer(model, engine, Path(args.socket), projector)
    server.memory_plan = plan.to_dict() if plan is not None else None
    server.memory_plan_kept = kept
    await server.start()
    logging.getLogger("localllm.runner").info(
        "serving %s: %d slots x %d tokens, %d threads, %d GPU layers",
        model.describe(),
        model.n_slots,
        model.n_ctx_per_slot,
        model.n_threads,
        model.n_gpu_layers,
    )
    # What exists now (the modules, the model's Python side) lives as long as the runner: out
    # of the collector's sight, full collections while serving skip it, and so does the final
    # one at exit.
    gc.freeze()
    if args.ready_fd is not None:
        os.write(args.ready_fd, b"ready\n")
        os.close(args.ready_fd)
    loop.call_soon(server.warm_up)  # once the daemon is told, off the load's time

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    parent = os.getppid()

    async def watch_parent() -> None:
        # The daemon may die without stopping us (SIGKILL); an orphan runner would hold
        # memory forever, so exit once we are re-parented.
        while os.getppid() == parent:
            await asyncio.sleep(_PARENT_CHECK_S)
        stop.set()

    watcher = asyncio.create_task(watch_parent())
    await stop.wait()
    watcher.cancel()
    await server.close()
    if projector is not None:
        projector.close()  # prompt preparation, its only user, ended with the server
    await asyncio.to_thread(engine.stop)
    if engine.fault:
        return EXIT_DEVICE_FAULT
    if engine.crashed:
        logging.getLogger("localllm.runner").error("exiting: the engine thread crashed")
        return 1
    return 0


def _model_identity(path: str) -> str:
    """What names a model's weights across restarts: the store's content digest when the file
    is a blob (``sha256-<hex>``), else its path, size and modification time."""
    file = Path(path)
    if file.name.startswith("sha256-"):
        return file.name
    stat = file.stat()
    return f"{file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def _prefix_cache(config: RunnerConfig, model: LlamaModel) -> PrefixCache | None:
    if config.kv_cache_ram <= 0 and config.kv_cache_disk <= 0:
        return None
    import llama_cpp

    # Everything that changes the bytes of a sequence's saved state.
    layout = "|".join(
        [
            config.kv_cache_type,
            f"fa={config.flash_attention}",
            f"llama_cpp={llama_cpp.__version__}",
            model.describe(),
            *config.extra_model_paths,
        ]
    )
    folder = None
    if config.kv_cache_dir and config.kv_cache_disk > 0:
        folder = layout_folder(
            Path(config.kv_cache_dir), _model_identity(config.model_path), layout
        )
    return PrefixCache(folder, config.kv_cache_ram, config.kv_cache_disk if folder else 0)


def main(argv: list[str] | None = None) -> int:
    """Run a runner until SIGTERM."""
    args = parse_args(argv)
    stream = open(args.log_file, "a", buffering=1) if args.log_file else sys.stderr  # noqa: SIM115
    logging.basicConfig(
        stream=stream,
        level=logging.DEBUG if args.debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # A fault in llama.cpp's native code (SIGILL, SIGSEGV) then leaves "Fatal Python error:
    # Illegal instruction" and the faulting thread's stack in the log: the cause line the
    # daemon reports. Only that thread's: walking the others' frames while they run can itself
    # crash the handler (seen: a SIGILL reported as SIGSEGV, its dump cut off mid-frame).
    faulthandler.enable(file=stream, all_threads=False)
    from ..engine.model import route_llama_log

    route_llama_log(stream, debug=args.debug)
    if args.projector is not None:
        from ..engine.vision import route_mtmd_log

        route_mtmd_log()
    try:
        return asyncio.run(_serve(args))
    finally:
        with contextlib.suppress(Exception):
            stream.flush()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--spare-fd"] and len(sys.argv) == 3:
        # A spare started ahead of need: it becomes a runner once given its arguments.
        from .spare import serve_spare

        sys.exit(serve_spare(int(sys.argv[2]), main))
    sys.exit(main())
