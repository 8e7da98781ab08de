"""Run one pull in its own process, printing each progress event as a JSON line.

``python pull_child.py NAME``: settings come from the environment (LOCALLLM_HOME, HF_ENDPOINT,
LOCALLLM_REGISTRY...). The last line is ``{"done": <manifest digest>}`` on success; the exit
status is 1 with ``{"error": ...}`` on a localllm error.
"""

from __future__ import annotations

import json
import sys

from localllm._exceptions import LocalLLMError
from localllm.settings import Settings
from localllm.sources import PullProgress, pull
from localllm.store.store import Store


def _show(event: PullProgress) -> None:
    print(json.dumps(event.to_json()), flush=True)


def main() -> int:
    settings = Settings.from_env()
    try:
        entry = pull(Store(settings.data_dir), sys.argv[1], settings, on_progress=_show)
    except LocalLLMError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 1
    print(json.dumps({"done": entry.digest}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
