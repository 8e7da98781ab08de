"""LoRA adapters in the store, without llama.cpp: the Modelfile's ``ADAPTER`` lines, adapter
layers (Ollama's media type, the scale in the layer's annotations), the checks against the base
model's architecture and tensor shapes, and the runner's pieces that need no model (the KV
tiers' adapter namespaces, the steps' adapter groups)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from lora_support import write_lora_gguf

from localllm._exceptions import AdapterError, GGUFError, LocalLLMError
from localllm.cli.ps import adapter_line
from localllm.daemon.engine.jobs import GenerationJob
from localllm.daemon.engine.slots import Slot, SlotState, choose_slot, prefix_source
from localllm.daemon.kv.prefixcache import PrefixCache
from localllm.daemon.lora.adapters import TURN_SECONDS, TURN_STEPS, StepGroups
from localllm.daemon.lora.adapterset import AdapterSet
from localllm.daemon.runner.protocol import AdapterUse, SamplingOptions
from localllm.gguf_info import inspect_gguf
from localllm.store.adapters import CONVERT_COMMAND, AdapterSource, check_adapter
from localllm.store.manifest import ANNOTATION_SCALE, MEDIA_ADAPTER, Manifest
from localllm.store.modelfile import parse_modelfile, read_modelfile
from localllm.store.models import create_model, load_model, render_modelfile
from localllm.store.store import Store
from localllm.tui.widgets.loaded_model import adapters_text


@pytest.fixture(scope="module")
def lora(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lora_gguf(tmp_path_factory.mktemp("lora") / "a.gguf", tiny_gguf)


def test_modelfile_adapter_lines_with_scales_resolve_next_to_it(tmp_path: Path) -> None:
    parsed = parse_modelfile(
        'FROM base\nADAPTER ./a.gguf\nadapter "./my b.gguf" 0.25\nADAPTER c.gguf -1\n'
    )
    assert parsed.adapters == [("./a.gguf", 1.0), ("./my b.gguf", 0.25), ("c.gguf", -1.0)]
    (tmp_path / "Modelfile").write_text("FROM base\nADAPTER lora/a.gguf 0.5\n")
    assert read_modelfile(tmp_path / "Modelfile").adapters == [
        (str(tmp_path / "lora" / "a.gguf"), 0.5)
    ]


def test_an_adapter_layer_keeps_its_scale_and_is_inherited(
    store: Store, tiny_gguf: Path, lora: Path, tmp_path: Path
) -> None:
    create_model(store, "tiny", gguf_file=tiny_gguf)
    entry = create_model(
        store, "tiny-a", base="tiny", adapters=[AdapterSource(file=lora, scale=0.5)]
    )
    (layer,) = entry.manifest.layers_of(MEDIA_ADAPTER)
    assert layer.size == lora.stat().st_size and layer.annotation(ANNOTATION_SCALE) == "0.5"
    raw = json.loads(entry.manifest.to_bytes())
    assert raw["layers"][-1]["annotations"] == {ANNOTATION_SCALE: "0.5"}
    assert Manifest.from_bytes(entry.manifest.to_bytes()) == entry.manifest
    model = load_model(store, "tiny-a")
    assert [(a.size, a.scale) for a in model.adapters] == [(lora.stat().st_size, 0.5)]
    assert f"ADAPTER {model.adapters[0].path} 0.5" in render_modelfile(model)
    # A model made from it keeps its adapter and adds its own; the same one twice is refused.
    second = write_lora_gguf(tmp_path / "b.gguf", tiny_gguf, seed=7)
    both = create_model(store, "tiny-ab", base="tiny-a", adapters=[AdapterSource(file=second)])
    assert [
        layer.annotation(ANNOTATION_SCALE) for layer in both.manifest.layers_of(MEDIA_ADAPTER)
    ] == [
        "0.5",
        None,  # scale 1: no annotation, the manifest is the one Ollama would write
    ]
    with pytest.raises(LocalLLMError, match="applied already"):
        create_model(store, "twice", base="tiny-a", adapters=[AdapterSource(file=lora)])
    assert not store.exists("twice")


def test_adapters_that_do_not_fit_are_refused_naming_the_first_misfit(
    store: Store, tiny_gguf: Path, smollm2_gguf: Path, tmp_path: Path
) -> None:
    base = inspect_gguf(tiny_gguf)
    bent = write_lora_gguf(tmp_path / "bent.gguf", tiny_gguf, wrong_rank_for="blk.1.attn_v.weight")
    with pytest.raises(AdapterError) as caught:
        check_adapter(bent, base)
    assert "'blk.1.attn_v.weight.lora_a' is 257x8 but 'blk.1.attn_v.weight' is 256x128" in str(
        caught.value
    )
    other = write_lora_gguf(tmp_path / "smol.gguf", smollm2_gguf, targets=("attn_q",))
    with pytest.raises(AdapterError, match=r"tensor 'blk\.0\.attn_q\.weight\.lora_a' is 576x8"):
        check_adapter(other, base)
    stranger = write_lora_gguf(tmp_path / "qwen.gguf", tiny_gguf, architecture="qwen2")
    with pytest.raises(AdapterError, match="'qwen2' architecture but the base model is 'llama'"):
        check_adapter(stranger, base)
    extra = write_lora_gguf(
        tmp_path / "extra.gguf", tiny_gguf, targets=(), extra={"blk.9.attn_q.weight": (256, 256)}
    )
    with pytest.raises(AdapterError, match=r"changes 'blk\.9\.attn_q\.weight', which the base"):
        check_adapter(extra, base)
    with pytest.raises(AdapterError, match=r"general\.type is None, not 'adapter'"):
        check_adapter(tiny_gguf, base)  # a model is no adapter
    # Nothing is written for a create that fails its check.
    create_model(store, "tiny", gguf_file=tiny_gguf)
    with pytest.raises(AdapterError, match=r"blk\.1\.attn_v\.weight"):
        create_model(store, "bent", base="tiny", adapters=[AdapterSource(file=bent)])
    assert not store.exists("bent")
    # And an adapter is no model.
    with pytest.raises(GGUFError, match="is a LoRA adapter"):
        inspect_gguf(bent).require_model()


def test_safetensors_and_peft_adapters_get_the_conversion_command(
    tiny_gguf: Path, tmp_path: Path
) -> None:
    peft = tmp_path / "peft"
    peft.mkdir()
    (peft / "adapter_config.json").write_text('{"r": 8}')
    weights = peft / "adapter_model.safetensors"
    weights.write_bytes((16).to_bytes(8, "little") + b'{"a": 1}        ')
    base = inspect_gguf(tiny_gguf)
    for path, kind in ((peft, "a PEFT adapter folder"), (weights, "a safetensors file")):
        with pytest.raises(AdapterError, match=re.escape(kind)) as caught:
            check_adapter(path, base)
        assert CONVERT_COMMAND in str(caught.value)


def test_saved_prefixes_serve_their_own_adapter_set_only(tmp_path: Path) -> None:
    folder = tmp_path / "kv" / "model"
    cache = PrefixCache(folder, ram_budget=1 << 20, disk_budget=1 << 20)
    prompt = list(range(1, 60))
    cache.save(prompt, b"base-state")
    cache.save(prompt, b"lora-state", "sha256:aa*1.0")
    base = cache.best([*prompt, 7])
    with_lora = cache.best([*prompt, 7], "sha256:aa*1.0")
    assert base is not None and with_lora is not None and base[1] != with_lora[1]
    assert cache.load(base[1]) == b"base-state" and cache.load(with_lora[1]) == b"lora-state"
    assert cache.best(prompt, "sha256:bb*1.0") is None
    cache.persist()  # to disk, read back by the next runner with each namespace kept
    again = PrefixCache(folder, ram_budget=1 << 20, disk_budget=1 << 20)
    found = again.best(prompt, "sha256:aa*1.0")
    assert found is not None and again.load(found[1]) == b"lora-state"
    assert again.best(prompt, "sha256:aa*0.5") is None


def _job(prompt: list[int], adapters: AdapterSet) -> GenerationJob:
    return GenerationJob("j", prompt, SamplingOptions(), None, lambda _: None, adapters=adapters)


def test_slots_share_cells_within_an_adapter_set_and_steps_take_turns() -> None:
    a = AdapterSet.of([AdapterUse("sha256:aa", 1.0)])
    b = AdapterSet.of([AdapterUse("sha256:bb", 0.5), AdapterUse("sha256:cc", 0.0)])
    assert b.key == "sha256:bb*0.5" and AdapterSet.of([AdapterUse("sha256:cc", 0)]) == AdapterSet()
    prompt = list(range(40))
    held, free = Slot(0), Slot(1)
    held.cache, held.adapters = list(prompt), a.key
    # The slot holding the prompt's cells serves it only with the set that computed them; under
    # an adapter set the prompt's last two tokens are evaluated again (slots.fresh_tokens), as a
    # cold prefill evaluates them, so the answer does not depend on what was cached.
    assert choose_slot([held, free], prompt, adapters=a.key) == (held, 38)
    assert choose_slot([held, free], prompt)[1] == 0  # no set: a's cells serve no plain prompt
    assert choose_slot([held, free], prompt, adapters=b.key)[1] == 0
    free.job, free.adapters = _job(prompt, b), b.key
    assert prefix_source(free, [held, free], prompt) is None
    free.adapters = a.key
    assert prefix_source(free, [held, free], prompt) is not None
    # With two sets at work, each step decodes one set's slots, the sets taking turns of
    # TURN_STEPS steps (or TURN_SECONDS, whichever ends first).
    slots = [Slot(i) for i in range(4)]
    for slot, adapters in zip(slots, (a, b, a, AdapterSet()), strict=True):
        slot.job, slot.state = _job(prompt, adapters), SlotState.DECODING
    now = [0.0]
    groups = StepGroups(clock=lambda: now[0])
    turns = [groups.pick(slots) for _ in range(3 * TURN_STEPS)]
    assert [[s.seq_id for s in group] for group, _ in turns[::TURN_STEPS]] == [[3], [0, 2], [1]]
    assert [adapters for _, adapters in turns[TURN_STEPS : 2 * TURN_STEPS]] == [a] * TURN_STEPS
    assert groups.pick(slots)[1] == AdapterSet()  # round again
    now[0] += TURN_SECONDS
    assert groups.pick(slots)[1] == a  # time is up: the next set, however few its steps
    slots[0].state = slots[2].state = SlotState.IDLE  # a's work is done: its turn ends at once
    assert groups.pick(slots)[1] == b
    slots[3].state = SlotState.IDLE
    assert groups.pick(slots) == (slots, b)  # one set at work: every slot, as without LoRA


def test_ps_and_the_dashboard_say_which_runner_and_adapters() -> None:
    entry = {
        "name": "mine:latest",
        "adapters": [
            {"digest": "sha256:" + "3f2a9c8d0e1f" * 5 + "abcd", "scale": 0.5, "size": 3 << 20}
        ],
        "runner": {
            "loaded_by": "base:latest",
            "models": ["base:latest", "mine:latest", "x:latest"],
        },
    }
    line = "mine:latest LoRA 3f2a9c8d0e1f x0.5 (3.1 MB) on the runner of base:latest"
    assert adapter_line(entry) == line + " (also serving x:latest)"
    assert adapters_text(entry).plain == (
        "LoRA 3f2a9c8d0e1f ×0.5 · 3.1 MB · on the runner of base:latest with x:latest"
    )
    assert adapter_line({"name": "plain"}) is None and not adapters_text({"name": "plain"}).plain
