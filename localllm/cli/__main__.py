"""``python -m localllm.cli`` runs the CLI (as ``python -m localllm`` does)."""

import sys

from .parser import main

sys.exit(main())
