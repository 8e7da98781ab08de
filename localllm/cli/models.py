"""The CLI's model commands: list, show, rm, cp, create, pull, quantize, stop (``ps`` is in
:mod:`~localllm.cli.ps`).

Each goes through the daemon (:func:`~localllm.cli.common.connect`), which owns the store, as
Ollama's CLI does. Tables and sizes are for people; ``--json`` prints what scripts want.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._format import human_since, human_size, speed_figures, table, tokens_per_second
from .common import (
    UsageError,
    connect,
    file_source,
    load_settings,
    parse_time,
    print_json,
    show_progress,
)

if TYPE_CHECKING:
    from ..client import Client

__all__ = [
    "add_cp_arguments",
    "add_create_arguments",
    "add_list_arguments",
    "add_pull_arguments",
    "add_quantize_arguments",
    "add_rm_arguments",
    "add_show_arguments",
    "add_stop_arguments",
    "cmd_cp",
    "cmd_create",
    "cmd_list",
    "cmd_pull",
    "cmd_quantize",
    "cmd_rm",
    "cmd_show",
    "cmd_stop",
    "pull_model",
    "render_plan",
    "render_show",
]


_QUANT_HELP = "q4_0, q4_K_S, q4_K_M (q4_K), q5_K_M, q6_K, q8_0, f16, f32"


# -- arguments -------------------------------------------------------------------------------


def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL")


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _add_requantize(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-requantize",
        action="store_true",
        help="quantize an already quantized model (loses quality)",
    )


def add_pull_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``pull`` command's arguments."""
    parser.add_argument(
        "model", metavar="MODEL", help="smollm2:135m, hf.co/<user>/<repo>[:<quant>]"
    )
    parser.add_argument(
        "--quant",
        metavar="QUANT",
        help="which quantization of an hf.co repository (default: the best that fits here)",
    )
    parser.add_argument("--quantize", "-q", metavar="QUANT", help="quantize after pulling")
    parser.add_argument("--insecure", action="store_true", help="allow plain HTTP to the registry")


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``list`` command's arguments."""
    _add_json(parser)


def add_show_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``show`` command's arguments."""
    _add_model(parser)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help="machine-readable output")
    group.add_argument("--modelfile", action="store_true", help="show the Modelfile")
    group.add_argument("--parameters", action="store_true", help="show the parameters")
    group.add_argument("--template", action="store_true", help="show the template")
    group.add_argument("--system", action="store_true", help="show the system message")
    group.add_argument("--license", action="store_true", help="show the license")
    parser.add_argument("--verbose", action="store_true", help="with --json: long metadata too")
    parser.add_argument(
        "--hub",
        action="store_true",
        help="hf.co names: the repository's quantizations on the Hub, even once pulled",
    )


def add_rm_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``rm`` command's arguments."""
    parser.add_argument("models", nargs="+", metavar="MODEL")


def add_cp_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``cp`` command's arguments."""
    parser.add_argument("source", metavar="SOURCE")
    parser.add_argument("destination", metavar="DESTINATION")


def add_create_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``create`` command's arguments."""
    parser.add_argument("model", metavar="MODEL", help="name of the new model")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--file", "-f", metavar="MODELFILE", help="a Modelfile (default: ./Modelfile)"
    )
    source.add_argument(
        "--from",
        dest="source",
        metavar="FILE|FOLDER|MODEL",
        help="a .gguf file, a safetensors folder (converted) or a model name",
    )
    parser.add_argument("--quantize", "-q", metavar="QUANT", help=f"quantize to {_QUANT_HELP}")
    _add_requantize(parser)


def add_stop_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``stop`` command's arguments."""
    _add_model(parser)


def add_quantize_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``quantize`` command's arguments."""
    parser.add_argument("source", metavar="SOURCE", help="a model name or a .gguf file")
    parser.add_argument("target", metavar="TARGET", help="name of the new model")
    parser.add_argument(
        "--quantize", "-q", metavar="QUANT", required=True, help=f"target: {_QUANT_HELP}"
    )
    _add_requantize(parser)


# -- list ------------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    """``list``/``ls``: NAME ID SIZE MODIFIED, newest first."""
    with connect() as client:
        models = client.list_models()
    if args.json:
        print_json(models)
        return 0
    rows = []
    for model in models:
        modified = parse_time(model.get("modified_at"))
        rows.append(
            [
                model.get("name", ""),
                str(model.get("digest", ""))[:12],
                human_size(model.get("size", 0)),
                human_since(modified) if modified is not None else "",
            ]
        )
    print(table(["NAME", "ID", "SIZE", "MODIFIED"], rows))
    return 0


# -- show ------------------------------------------------------------------------------------


def _first_lines(text: str, count: int, more_hint: str) -> list[tuple[str, str]]:
    lines = text.strip().splitlines()
    shown = [(line, "") for line in lines[:count]]
    if len(lines) > count:
        shown.append((f"... ({len(lines) - count} more lines; {more_hint} shows all)", ""))
    return shown


def render_show(data: Mapping[str, Any]) -> str:
    """``show``'s sections for people, from the daemon's ``/api/show`` answer."""
    details = data.get("details") or {}
    info = data.get("model_info") or {}
    arch = str(info.get("general.architecture") or details.get("family") or "unknown")

    def fact(key: str) -> str:
        value = info.get(f"{arch}.{key}")
        return str(value) if value is not None else "unknown"

    sections: list[tuple[str, list[tuple[str, str]]]] = [
        (
            "Model",
            [
                ("architecture", arch),
                ("parameters", str(details.get("parameter_size") or "unknown")),
                ("context length", fact("context_length")),
                ("embedding length", fact("embedding_length")),
                ("quantization", str(details.get("quantization_level") or "unknown")),
            ],
        ),
        ("Capabilities", [(str(c), "") for c in data.get("capabilities") or []]),
    ]
    projector = data.get("projector_info") or {}
    if projector:
        # Ollama's show lists a vision model's projector under the model.
        from ..gguf_info import format_parameter_count

        count = projector.get("general.parameter_count")
        sections.insert(
            1,
            (
                "Projector",
                [
                    ("architecture", str(projector.get("general.architecture") or "unknown")),
                    (
                        "parameters",
                        format_parameter_count(count) if isinstance(count, int) else "unknown",
                    ),
                    (
                        "embedding length",
                        str(projector.get("clip.vision.embedding_length", "unknown")),
                    ),
                    ("dimensions", str(projector.get("clip.vision.projection_dim", "unknown"))),
                ],
            ),
        )
    adapters = data.get("adapters") or []
    if adapters:
        sections.insert(1, ("Adapters", [_adapter_row(a) for a in adapters]))
    parameters = []
    for line in str(data.get("parameters") or "").splitlines():
        key, _, value = line.strip().partition(" ")
        parameters.append((key, value.strip()))
    if parameters:
        sections.append(("Parameters", parameters))
    if data.get("system"):
        sections.append(("System", _first_lines(str(data["system"]), 5, "--system")))
    if data.get("license"):
        sections.append(("License", _first_lines(str(data["license"]), 2, "--license")))
    out = []
    for title, rows in sections:
        out.append(f"  {title}")
        width = max((len(key) for key, value in rows if value), default=0) + 4
        out.extend(f"    {key.ljust(width)}{value}".rstrip() for key, value in rows)
        out.append("")
    return "\n".join(out)


def _adapter_row(adapter: Mapping[str, Any]) -> tuple[str, str]:
    """One LoRA adapter in ``show``: its short digest, then scale, rank and size."""
    from .._format import human_size

    digest = str(adapter.get("digest", "")).removeprefix("sha256:")[:12]
    facts = [f"scale {adapter.get('scale', 1.0):g}"]
    if adapter.get("rank"):
        facts.append(f"rank {adapter['rank']}, {adapter.get('tensors', 0)} weights")
    facts.append(human_size(int(adapter.get("size", 0))))
    if adapter.get("problem"):
        facts.append(str(adapter["problem"]))
    name = str(adapter.get("name") or "")
    return f"{name} {digest}".strip(), ", ".join(facts)


def _mib(size: int) -> str:
    return f"{size // (1 << 20):,} MiB"


# What a device holds, in the plan's words.
_PARTS = (("weights", "weights"), ("kv", "KV"), ("compute", "compute"), ("other", "projector"))


def render_plan(answer: Mapping[str, Any]) -> str:
    """The ``Memory plan`` section of ``show``: slots × context, where the layers go and the
    memory per device on this machine (or why the model does not fit)."""
    lines = ["  Memory plan (this machine)"]
    if answer.get("refusal"):
        lines.append(f"    does not fit: {answer['refusal']}")
        return "\n".join(lines) + "\n"
    plan = answer.get("plan") or {}
    chosen = " (chosen by free memory)" if plan.get("context_chosen") else ""
    rows = [("slots × context", f"{plan.get('n_slots')} × {plan.get('n_ctx_per_slot'):,}{chosen}")]
    uses = [u for u in plan.get("uses") or [] if u.get("layers") or u.get("weights")]
    total_layers = (plan.get("n_layer") or 0) + 1
    placed = ", ".join(
        f"{u.get('layers', 0)} on {u.get('device')}" for u in uses if u.get("layers")
    )
    rows.append(("layers", f"{placed} (of {total_layers}, the output layer counted)"))
    budgets = plan.get("budgets") or {}
    for use in uses:
        parts = [f"{label} {_mib(int(use[key]))}" for key, label in _PARTS if use.get(key)]
        total = sum(int(use.get(key) or 0) for key, _ in _PARTS)
        usable = budgets.get(use.get("device"))
        room = f" of {_mib(int(usable))} usable" if usable is not None else ""
        rows.append((str(use.get("device")), f"{_mib(total)}{room} ({', '.join(parts)})"))
    if plan.get("prefix_cache"):
        rows.append(("prefix cache", f"{_mib(int(plan['prefix_cache']))} of RAM at most"))
    rows.append(("processor", str(plan.get("processor", ""))))
    rows.extend(speed_rows(answer.get("speed")))
    if answer.get("loaded"):
        rows.append(("loaded", "yes, by this plan"))
    rows.extend(("warning", str(w)) for w in plan.get("warnings") or [])
    width = max(len(key) for key, _ in rows) + 4
    lines.extend(f"    {key.ljust(width)}{value}" for key, value in rows)
    return "\n".join(lines) + "\n"


def speed_rows(speed: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """``speed`` rows of ``show``'s plan: predicted beside measured tokens/s."""
    figures, why = speed_figures(speed)
    requests = ((speed or {}).get("measured") or {}).get("requests", 0)
    rows = []
    for kind, predicted, measured in figures:
        parts = [f"predicted {tokens_per_second(predicted)} tokens/s"] if predicted else []
        if measured:
            parts.append(f"measured {measured:.0f} ({requests} requests)")
        rows.append((kind, ", ".join(parts)))
    if why:
        rows.append(("speed", f"not predicted: {why}"))
    elif device := ((speed or {}).get("predicted") or {}).get("device"):
        rows.append(("predicted on", str(device)))  # says so for a software device
    return rows


def cmd_show(args: argparse.Namespace) -> int:
    """``show MODEL``: details and the memory plan on this machine, or one part
    (``--modelfile``, ``--template``...), or JSON; for ``hf.co/<user>/<repo>`` not in the
    store (or with ``--hub``), its quantizations on the Hub with their fit and speed here."""
    from .search import is_hub_name, show_hub

    with connect() as client:
        if is_hub_name(args.model) and (shown := show_hub(client, args)) is not None:
            return shown
        data = client.show(args.model, verbose=args.verbose)
        plan: dict[str, Any] | None = None
        if not args.json and not any(
            getattr(args, part)
            for part in ("modelfile", "template", "system", "license", "parameters")
        ):
            from .._exceptions import APIError

            try:
                plan = client.plan(args.model)
            except APIError as exc:  # a runner that could not plan: show says why, once
                plan = {"refusal": f"could not plan ({exc})"}
    for part in ("modelfile", "template", "system", "license", "parameters"):
        if getattr(args, part):
            text = str(data.get(part) or "")
            print(text, end="" if text.endswith("\n") else "\n")
            return 0
    if args.json:
        print_json(data)
        return 0
    print(render_show(data))
    if plan is not None:
        print(render_plan(plan))
    return 0


# -- stop ------------------------------------------------------------------------------------


def _same_model(a: str, b: str) -> bool:
    from .._exceptions import InvalidNameError
    from ..store.names import parse_name

    try:
        return parse_name(a) == parse_name(b)
    except InvalidNameError:
        return a == b


def cmd_stop(args: argparse.Namespace) -> int:
    """``stop MODEL``: unload it now (``keep_alive`` 0), as Ollama's ``stop`` does."""
    with connect() as client:
        loaded = [str(entry.get("name", "")) for entry in client.ps()]
        match = next((name for name in loaded if _same_model(name, args.model)), None)
        if match is None:
            client.show(args.model)  # a bad or unknown name says so (400/404)
            raise UsageError(f'model "{args.model}" is not running')
        client.unload(match)
    return 0


# -- rm and cp -------------------------------------------------------------------------------


def cmd_rm(args: argparse.Namespace) -> int:
    """``rm MODEL...``: remove models (unloading them first)."""
    with connect() as client:
        for name in args.models:
            client.delete(name)
            print(f"deleted '{name}'")
    return 0


def cmd_cp(args: argparse.Namespace) -> int:
    """``cp SOURCE DESTINATION``."""
    with connect() as client:
        client.copy(args.source, args.destination)
    print(f"copied '{args.source}' to '{args.destination}'")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    """``prune``: remove blobs no model uses, partial downloads and leftovers; say what it
    freed."""
    with connect() as client:
        report = client.prune()
    print(report["summary"])
    return 0


# -- create, pull, quantize ------------------------------------------------------------------


def _check_quant(quant: str | None) -> str | None:
    """A known quantization target, checked here so nothing is downloaded for a typo."""
    if quant is None:
        return None
    from ..store.quantize import normalize_quant

    return normalize_quant(quant)


def _source_fields(client: Client, value: str, base: Path | None = None) -> dict[str, Any]:
    """``/api/create`` source fields for a ``--from`` / ``FROM`` value: a GGUF file, a
    safetensors folder (a Hugging Face checkout, converted by the daemon) or a model."""
    from ..store.modelfile import looks_like_path

    settings = load_settings()
    path = Path(value).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    if looks_like_path(value) or path.is_file() or path.is_dir():
        return file_source(client, settings, path)
    return {"from_": value}


def _draft_field(client: Client, value: str) -> str:
    """``/api/create``'s ``draft`` for a Modelfile's ``DRAFT`` value: a model name as is, a
    file as a path the daemon reads or, for a remote daemon, the digest of its upload."""
    from ..store.modelfile import looks_like_path

    path = Path(value).expanduser()
    if not (looks_like_path(value) or path.is_file()):
        return value
    source = file_source(client, load_settings(), path)
    return str(source.get("from_") or next(iter(source["files"].values())))


def _adapter_fields(client: Client, adapters: list[tuple[str, float]]) -> dict[str, Any]:
    """``/api/create``'s ``adapters`` for a Modelfile's ``ADAPTER`` lines: each file as a
    path the daemon reads (a folder too: the daemon says how to convert it) or, for a remote
    daemon, the digest of its upload; with its scale when it is not 1."""
    from ..autostart import is_local
    from ..store.adapters import CONVERT_COMMAND

    local = is_local(load_settings())
    fields: dict[str, Any] = {}
    for file, scale in adapters:
        path = Path(file)
        if local and path.exists():
            origin = str(path)
        elif path.is_dir():
            raise UsageError(
                f"{path} is a folder, not a GGUF adapter; convert it: {CONVERT_COMMAND}"
            )
        elif not path.is_file():
            raise UsageError(f"{path}: no such file (an ADAPTER line)")
        else:
            origin = client.upload_blob(path)
        name = path.name
        while name in fields:  # two adapters of one file name from different folders
            name = f"{name}+"
        fields[name] = origin if scale == 1.0 else {"from": origin, "scale": scale}
    return fields


def _run_create(client: Client, name: str, fields: dict[str, Any]) -> None:
    show_progress(client.create(name, **fields))
    print(f"created '{name}'")


def cmd_create(args: argparse.Namespace) -> int:
    """``create NAME`` from ``--from FILE|FOLDER|MODEL`` or ``-f Modelfile`` (``./Modelfile``
    by default), optionally ``--quantize``; a folder is a safetensors checkout that the
    daemon converts (F16 unless ``--quantize`` says otherwise)."""
    from ..store.modelfile import read_modelfile

    quant = _check_quant(args.quantize)
    modelfile_path: Path | None = Path(args.file).expanduser() if args.file else None
    if args.source is None and modelfile_path is None:
        if not Path("Modelfile").is_file():
            raise UsageError("create needs --from FILE|FOLDER|MODEL or -f Modelfile")
        modelfile_path = Path("Modelfile")
    with connect() as client:
        if modelfile_path is not None:
            modelfile = read_modelfile(modelfile_path)
            fields = {**modelfile.create_fields(), **_source_fields(client, modelfile.from_)}
            if modelfile.draft is not None:
                fields["draft"] = _draft_field(client, modelfile.draft)
            if modelfile.adapters:
                fields["adapters"] = _adapter_fields(client, modelfile.adapters)
            if modelfile.projector is not None:
                # The projector always travels as an uploaded blob in ``files`` (Ollama's
                # create API): the daemon tells it from the model by its ``clip`` header.
                projector = Path(modelfile.projector)
                if not projector.is_file():
                    raise UsageError(f"{projector}: no such file (the second FROM)")
                fields["files"] = {
                    **fields.get("files", {}),
                    projector.name: client.upload_blob(projector),
                }
        else:
            fields = _source_fields(client, args.source)
        fields["quantize"] = quant
        fields["allow_requantize"] = args.allow_requantize or None
        _run_create(client, args.model, {k: v for k, v in fields.items() if v is not None})
    return 0


def pull_model(
    client: Client, name: str, *, insecure: bool = False, quantize: str | None = None
) -> None:
    """Pull ``name`` through the daemon with progress bars on stderr."""
    show_progress(client.pull(name, insecure=insecure, quantize=quantize))


def _with_quant(name: str, quant: str | None) -> str:
    """``hf.co/user/repo`` with ``--quant Q8_0`` → ``hf.co/user/repo:Q8_0``."""
    if quant is None:
        return name
    from ..store.names import parse_name

    parsed = parse_name(name)
    if not parsed.is_huggingface:
        raise UsageError("--quant picks a quantization of a Hugging Face repository (hf.co/...)")
    if parsed.tag not in ("latest", quant) and parsed.tag.lower() != quant.lower():
        raise UsageError(f"{name} already names {parsed.tag}; give the tag or --quant, not both")
    return parsed.with_tag(quant).short


def cmd_pull(args: argparse.Namespace) -> int:
    """``pull MODEL``: download through the daemon; ``--quant`` picks a Hugging Face
    repository's quantization (else the daemon picks the best that fits); ``--quantize``
    stores it converted (the name never holds the download: the daemon quantizes before it
    writes the name)."""
    quant = _check_quant(args.quantize)
    name = _with_quant(args.model, getattr(args, "quant", None))
    with connect() as client:
        pull_model(client, name, insecure=args.insecure, quantize=quant)
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    """``quantize SOURCE TARGET -q QUANT``: a model or GGUF file into a new model."""
    quant = _check_quant(args.quantize)
    with connect() as client:
        fields = _source_fields(client, args.source)
        fields.update(quantize=quant, allow_requantize=args.allow_requantize or None)
        _run_create(client, args.target, {k: v for k, v in fields.items() if v is not None})
    return 0
