"""``localllm import ollama``: bring the models of an Ollama store over without downloading.

The import works on the store's files directly, not through the daemon: it is a file-system
job (links, clones, hashing) and the store's locks make it safe while a daemon runs, which
lists the new models at once. Progress goes to stderr like a pull's; the outcome (one line per
model and a total) goes to stdout. The exit status is 1 when any model was skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._exceptions import LocalLLMError
from .commands import EXIT_OK, EXIT_USER_ERROR
from .common import load_settings, notice

__all__ = ["add_import_arguments", "cmd_import"]


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``import`` command's arguments."""
    parser.add_argument("source", choices=["ollama"], help="where from: ollama")
    parser.add_argument("models", nargs="*", metavar="MODEL", help="only these (default: all)")
    parser.add_argument(
        "--models",
        dest="models_dir",
        metavar="DIR",
        help="Ollama's models folder (default: OLLAMA_MODELS, ~/.ollama/models, "
        "/usr/share/ollama/.ollama/models)",
    )


def cmd_import(args: argparse.Namespace) -> int:
    """``localllm import ollama [MODEL...] [--models DIR]``."""
    from ..autostart import is_local
    from ..progress_display import ProgressView
    from ..store.ollama_import import OllamaImporter, find_ollama_store
    from ..store.store import Store

    settings = load_settings()
    if args.models_dir:
        root = Path(args.models_dir).expanduser()
    else:
        found = find_ollama_store(settings)
        if found is None:
            looked = ", ".join(str(p) for p in settings.ollama_model_dirs)
            raise LocalLLMError(
                f"no Ollama store found (looked in {looked}); name one with --models DIR"
            )
        root = found
    store = Store(settings.data_dir)
    if not is_local(settings):
        # The import writes this machine's store; a daemon elsewhere will not see it.
        print(
            f"Note: LOCALLLM_HOST names another machine; importing into {store.root} here",
            file=sys.stderr,
        )
    notice(f"importing from {root} into {store.root}")
    with ProgressView() as view:
        report = OllamaImporter(root, store, progress=view.update).run(args.models)
    if not report.outcomes:
        print(f"no models in the Ollama store at {root}")
        return EXIT_OK
    width = max(len(o.label) for o in report.outcomes)
    for outcome in report.outcomes:
        print(f"{outcome.label:<{width}}  {outcome.describe()}")
    print(report.summary())
    return EXIT_USER_ERROR if report.skipped else EXIT_OK
