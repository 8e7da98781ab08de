"""Which llama.cpp pre-tokenizer a byte-level BPE vocabulary needs: data, as llama.cpp has it.

llama.cpp's converter (``get_vocab_base_pre`` in ``convert_hf_to_gguf.py``) encodes one fixed
text with the model's own tokenizer, hashes the token ids (sha256 of their Python list's text)
and looks the hash up in a table: the hash pins both the pre-tokenizer's regex and the
vocabulary. The entries below are that table's rows for the families this converter supports.

A retrained or extended vocabulary (a fine-tune's new tokenizer) hashes to something no table
lists; then the ``pre_tokenizer`` of ``tokenizer.json`` is compared with the regexes llama.cpp
implements (:data:`SPLIT_REGEXES`), and the choice is reported as a note of the conversion.
"""

from __future__ import annotations

__all__ = ["CHECK_TEXT", "KNOWN_HASHES", "SPLIT_REGEXES"]

CHECK_TEXT = "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"  # noqa: E501

KNOWN_HASHES: dict[str, str] = {
    # Qwen/Qwen3-Embedding-0.6B
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",
    # evilfreelancer/ruGPT3XL
    "0fe1cf6eda062318a1af7270f3331a85c539a01778ff948e24388e949c5282f4": "gpt-2",
    # meta-llama/Meta-Llama-3-8B
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",
    # openai-community/gpt2
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",
    # Qwen/Qwen1.5-7B
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",
    # databricks/dbrx-base
    "a8594e3edff7c29c003940395316294b2c623e09894deebbc65f33f1515df79e": "dbrx",
    # abacusai/Smaug-Llama-3-70B-Instruct
    "c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d": "smaug-bpe",
    # mistralai/Mistral-Nemo-Base-2407
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",
    # HuggingFaceTB/SmolLM-135M
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",
    # microsoft/phi-2
    "fcace8b9cac38ce847670c970cd5892031a753a1ef381abd1d9af00f713da085": "phi-2",
    # deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5": "deepseek-r1-qwen",
    # Xenova/gpt-4o
    "ccc2ef013c104be7bae2965776d611e1d7a8a2a9c547dd93a682c9a9fc80352e": "gpt-4o",
    # mistral-community/pixtral-12b
    "0e9433cbbb161f89e264eb32e8e64bfe69e834973ffca5d41d3948a604a3e2a3": "pixtral",
}

# The Split regexes of tokenizer.json's pre_tokenizer that name a llama.cpp pre-tokenizer.
SPLIT_REGEXES: dict[str, str] = {
    # Llama 3's (numbers in groups of up to three digits)
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
    # Qwen2's (single digits)
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
}
