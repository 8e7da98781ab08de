"""Convert models as the Hub ships them (safetensors, config, tokenizer files) to GGUF.

No torch, no transformers: numpy, ``safetensors`` headers read as memory maps, the ``gguf``
package's writer and llama.cpp's tensor-name tables, ``tokenizers`` and ``sentencepiece``.
One module per model family (``llama.py``, ``qwen2.py``...), as Ollama's ``convert/``.

    family_name(config)                      # config.json alone: convertible? (before a download)
    info = inspect_folder(folder)            # config, index and headers only, each tensor
                                             # checked against the config
    check_tensors(config, parse_header(...)) # the same check on headers read elsewhere
    result = convert_folder(folder, out)     # streams tensor by tensor; out appears complete

Errors are :class:`~localllm._exceptions.ConvertError` subclasses, each bad input (HTTP 400 at
the API): ``NotAFolderError``, ``MissingConfigError``, ``UnsupportedArchitectureError`` (its
``architecture`` and ``supported``), ``MissingTokenizerError``, ``MissingShardError``,
``TruncatedShardError``, ``TensorMismatchError``, ``PickleCheckpointError``. Besides them a
conversion raises ``DiskFullError`` (disk full while writing) and ``OperationCancelledError``
(its ``cancel`` event). ``ConvertResult.notes`` lists what the converter decided for the user
(a pre-tokenizer recognised by its regex, a vision tower left out...): report them.
``FolderInfo.files`` are the files a conversion reads (config, tokenizer files, index, shards).
"""

from __future__ import annotations

from localllm.convert.convert import OUTTYPES, ConvertResult, auto_outtype, convert_folder
from localllm.convert.families import SUPPORTED_ARCHITECTURES, family_name
from localllm.convert.folder import FolderInfo, check_tensors, inspect_folder
from localllm.convert.shards import TensorEntry, header_length, parse_header

__all__ = [
    "OUTTYPES",
    "SUPPORTED_ARCHITECTURES",
    "ConvertResult",
    "FolderInfo",
    "TensorEntry",
    "auto_outtype",
    "check_tensors",
    "convert_folder",
    "family_name",
    "header_length",
    "inspect_folder",
    "parse_header",
]
