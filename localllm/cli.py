"""``localllm``: the command line.

Imports are lazy (inside each command) so ``localllm --help`` stays fast. User errors print
one line on stderr and exit 1; no traceback reaches the terminal for them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .names import ModelName
    from .settings import Settings
    from .store import ModelEntry, Store

__all__ = ["main"]

EXIT_OK = 0
EXIT_USER_ERROR = 1
EXIT_INTERRUPTED = 130


def _settings() -> Settings:
    from .settings import Settings

    return Settings.from_env()


def _store(settings: Settings | None = None) -> Store:
    from .starter import ensure_starter
    from .store import Store

    store = Store((settings or _settings()).data_dir)
    ensure_starter(store)
    return store


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


# -- commands ------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    """List the models in the store."""
    from ._format import human_since, human_size, table

    entries = _store().list()
    if args.json:
        _print_json(
            [
                {
                    "name": e.name.short,
                    "id": e.id,
                    "digest": e.digest,
                    "size": e.size,
                    "modified_at": e.modified,
                }
                for e in entries
            ]
        )
        return EXIT_OK
    rows = [[e.name.short, e.id, human_size(e.size), human_since(e.modified)] for e in entries]
    print(table(["NAME", "ID", "SIZE", "MODIFIED"], rows))
    return EXIT_OK


def _show_sections(model: Any) -> list[tuple[str, list[tuple[str, str]]]]:
    info = model.info
    facts = [
        ("architecture", info.architecture),
        ("parameters", info.parameter_size),
        ("context length", str(info.context_length or "unknown")),
        ("embedding length", str(info.embedding_length or "unknown")),
        ("quantization", info.file_type),
        ("layers", str(info.block_count or "unknown")),
        ("heads", f"{info.head_count} (kv {info.head_count_kv})"),
        ("tokenizer", info.tokenizer_kind),
    ]
    sections: list[tuple[str, list[tuple[str, str]]]] = [("Model", facts)]
    sections.append(("Capabilities", [(c, "") for c in model.capabilities()]))
    if model.parameters:
        params = []
        for key, value in model.parameters.items():
            for item in value if isinstance(value, list) else [value]:
                params.append((key, json.dumps(item) if isinstance(item, str) else str(item)))
        sections.append(("Parameters", params))
    if model.system:
        sections.append(("System", [(line, "") for line in model.system.splitlines()[:5]]))
    if model.template:
        lines = model.template.strip().splitlines()
        shown = [(line, "") for line in lines[:6]]
        if len(lines) > 6:
            shown.append((f"... ({len(lines) - 6} more lines; --template shows all)", ""))
        sections.append(("Template", shown))
    if model.license:
        lines = model.license.strip().splitlines()
        sections.append(("License", [(line, "") for line in lines[:2]]))
    return sections


def cmd_show(args: argparse.Namespace) -> int:
    """Describe one model."""
    from .models import load_model, render_modelfile

    model = load_model(_store(), args.model)
    if args.modelfile:
        print(render_modelfile(model), end="")
        return EXIT_OK
    if args.template:
        print(model.template or "")
        return EXIT_OK
    if args.system:
        print(model.system or "")
        return EXIT_OK
    if args.license:
        print(model.license or "")
        return EXIT_OK
    if args.parameters:
        for key, value in model.parameters.items():
            for item in value if isinstance(value, list) else [value]:
                print(f"{key:<20}{json.dumps(item) if isinstance(item, str) else item}")
        return EXIT_OK
    if args.json:
        _print_json(
            {
                "name": model.name.short,
                "digest": model.entry.digest,
                "details": model.details(),
                "model_info": model.info.summary(),
                "capabilities": model.capabilities(),
                "parameters": model.parameters,
                "system": model.system,
                "template": model.template,
                "license": model.license,
            }
        )
        return EXIT_OK
    for title, rows in _show_sections(model):
        print(f"  {title}")
        width = max((len(k) for k, v in rows if v), default=0) + 4
        for key, value in rows:
            print(f"    {key.ljust(width)}{value}".rstrip())
        print()
    return EXIT_OK


def cmd_rm(args: argparse.Namespace) -> int:
    """Remove models by name."""
    store = _store()
    status = EXIT_OK
    for name in args.models:
        entry = store.delete(name)
        print(f"deleted '{entry.name.short}'")
    return status


def cmd_cp(args: argparse.Namespace) -> int:
    """Copy a model to a new name."""
    entry = _store().copy(args.source, args.destination)
    print(f"copied '{args.source}' to '{entry.name.short}'")
    return EXIT_OK


def cmd_create(args: argparse.Namespace) -> int:
    """Create a model from a local GGUF file or another model, optionally quantizing it."""
    from .gguf_info import inspect_gguf
    from .models import create_model
    from .names import parse_name

    store = _store()
    name = parse_name(args.model)
    if args.source is None:
        raise _UsageError("create needs --from FILE.gguf or --from MODEL")
    source_path = Path(args.source).expanduser()
    looks_like_file = (
        source_path.suffix.lower() == ".gguf" or "/" in args.source or source_path.exists()
    )
    if looks_like_file and not source_path.exists() and args.source.lower().endswith(".gguf"):
        raise _UsageError(f"{args.source}: no such file")
    is_file = looks_like_file and source_path.exists()
    if args.quantize is not None:
        entry = _quantize(store, source_path if is_file else args.source, name, args)
    elif is_file:
        info = inspect_gguf(source_path)
        facts = f"{info.architecture}, {info.parameter_size}, {info.file_type}"
        print(f"importing {source_path.name} ({facts})")
        entry = create_model(store, name, gguf_file=source_path)
    else:
        entry = create_model(store, name, base=args.source)
    print(f"created '{entry.name.short}' ({entry.id})")
    return EXIT_OK


def _quantize(
    store: Store, source: Path | str, name: ModelName, args: argparse.Namespace
) -> ModelEntry:
    from .progress_display import ProgressView
    from .quantize import quantize_model

    with ProgressView() as view:
        return quantize_model(
            store,
            source,
            name,
            args.quantize,
            allow_requantize=args.allow_requantize,
            threads=_settings().num_threads,
            on_progress=view.update,
        )


def cmd_quantize(args: argparse.Namespace) -> int:
    """Quantize a model or a GGUF file into a new model."""
    from .names import parse_name

    store = _store()
    source_path = Path(args.source).expanduser()
    source: Path | str = source_path if source_path.is_file() else args.source
    entry = _quantize(store, source, parse_name(args.target), args)
    print(f"created '{entry.name.short}' ({entry.id})")
    return EXIT_OK


def cmd_pull(args: argparse.Namespace) -> int:
    """Download a model from Hugging Face or an Ollama registry."""
    from .progress_display import ProgressView
    from .sources import pull

    settings = _settings()
    store = _store(settings)
    with ProgressView() as view:
        pull(
            store,
            args.model,
            settings,
            on_progress=view.update,
            quantize=args.quantize,
            insecure=args.insecure,
        )
    return EXIT_OK


def cmd_version(args: argparse.Namespace) -> int:
    """Print the version."""
    from . import __version__

    print(f"localllm version {__version__}")
    return EXIT_OK


class _UsageError(Exception):
    """A mistake in the command line itself."""


# -- parser --------------------------------------------------------------------------------


_QUANT_HELP = "q4_0, q4_K_S, q4_K_M (q4_K), q5_K_M, q6_K, q8_0, f16, f32"


def _add_quantize_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--quantize", "-q", metavar="QUANT", required=required, help=f"target: {_QUANT_HELP}"
    )
    parser.add_argument(
        "--allow-requantize",
        action="store_true",
        help="quantize an already quantized model (loses quality)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``localllm`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="localllm",
        description="Run large language models locally: pull, quantize, serve, chat.",
    )
    parser.add_argument("-v", "--version", action="store_true", help="show the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(
        name: str,
        handler: Callable[[argparse.Namespace], int],
        help_text: str,
        aliases: Sequence[str] = (),
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, help=help_text, description=help_text, aliases=list(aliases)
        )
        sub.set_defaults(handler=handler)
        return sub

    sub = add("list", cmd_list, "List models", aliases=["ls"])
    sub.add_argument("--json", action="store_true", help="machine-readable output")

    sub = add("show", cmd_show, "Show information for a model")
    sub.add_argument("model", help="model name")
    group = sub.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help="machine-readable output")
    group.add_argument("--modelfile", action="store_true", help="show the Modelfile")
    group.add_argument("--template", action="store_true", help="show the chat template")
    group.add_argument("--system", action="store_true", help="show the system prompt")
    group.add_argument("--license", action="store_true", help="show the license")
    group.add_argument("--parameters", action="store_true", help="show the default parameters")

    sub = add("rm", cmd_rm, "Remove one or more models")
    sub.add_argument("models", nargs="+", metavar="MODEL")

    sub = add("cp", cmd_cp, "Copy a model")
    sub.add_argument("source", metavar="SOURCE")
    sub.add_argument("destination", metavar="DESTINATION")

    sub = add("create", cmd_create, "Create a model from a GGUF file or another model")
    sub.add_argument("model", help="name of the new model")
    sub.add_argument(
        "--from", dest="source", metavar="FILE|MODEL", help="a .gguf file or a model name"
    )
    _add_quantize_arguments(sub, required=False)

    sub = add("pull", cmd_pull, "Pull a model from Hugging Face (hf.co/...) or a registry")
    sub.add_argument("model", help="model name: smollm2:135m, hf.co/<user>/<repo>[:<quant>]")
    sub.add_argument(
        "--quantize", "-q", metavar="QUANT", help="quantize after pulling (F16/BF16/F32 sources)"
    )
    sub.add_argument(
        "--insecure", action="store_true", help="allow plain HTTP to the model's registry"
    )

    sub = add("quantize", cmd_quantize, "Quantize a model or a GGUF file into a new model")
    sub.add_argument("source", metavar="SOURCE", help="a model name or a .gguf file")
    sub.add_argument("target", metavar="TARGET", help="name of the new model")
    _add_quantize_arguments(sub, required=True)

    add("version", cmd_version, "Show the version")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``localllm`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        return cmd_version(args)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_OK
    from ._exceptions import LocalLLMError

    try:
        return handler(args)
    except (LocalLLMError, _UsageError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
