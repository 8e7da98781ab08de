"""Saved prompt prefixes: the RAM and disk tiers, and restores in a real runner."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from runner_harness import RunnerHarness, greedy
from tiny_gguf import write_tiny_gguf

from localllm.daemon.kv.prefixcache import PrefixCache, layout_folder
from localllm.daemon.runner import GenerationRequest, GenerationResult, RunnerConfig

# -- the tiers, without llama.cpp ------------------------------------------------------------


def state(n: int, fill: int = 1) -> bytes:
    return bytes([fill % 256]) * n


def test_best_finds_the_longest_shared_start(tmp_path: Path) -> None:
    cache = PrefixCache(tmp_path / "m", ram_budget=1 << 20, disk_budget=1 << 20)
    cache.save([1, 2, 3, 4, 5, 6], state(10))
    cache.save([1, 2, 9, 9], state(10))
    assert cache.best([1, 2, 3, 4, 7]) is not None
    length, key = cache.best([1, 2, 3, 4, 7])  # type: ignore[misc]
    assert length == 4 and cache.tokens(key) == (1, 2, 3, 4, 5, 6)
    assert cache.best([8, 8]) is None
    assert cache.load(key) == state(10)


def test_a_longer_prefix_replaces_the_one_it_extends(tmp_path: Path) -> None:
    cache = PrefixCache(None, ram_budget=1 << 20, disk_budget=0)
    cache.save([1, 2, 3], state(5))
    cache.save([1, 2, 3, 4, 5], state(8))
    cache.save([1, 2], state(3))  # covered by the longer one: not stored
    assert cache.stats().ram_entries == 1
    _, key = cache.best([1, 2, 3])  # type: ignore[misc]
    assert cache.tokens(key) == (1, 2, 3, 4, 5)


def test_ram_overflow_moves_the_least_recently_used_to_disk(tmp_path: Path) -> None:
    folder = tmp_path / "kv" / "model"
    cache = PrefixCache(folder, ram_budget=250, disk_budget=10_000)
    for i in range(3):
        cache.save([100 + i, 1, 2], state(100, i))
    stats = cache.stats()
    assert stats.ram_bytes <= 250 and stats.ram_entries == 2
    assert stats.disk_entries == 1 and len(list(folder.glob("*.kv"))) == 1
    _, key = cache.best([100, 1, 2])  # type: ignore[misc]
    assert cache.load(key) == state(100, 0)  # read back from its file, verified


def test_without_a_disk_tier_ram_overflow_drops_entries() -> None:
    cache = PrefixCache(None, ram_budget=250, disk_budget=0)
    for i in range(3):
        cache.save([200 + i], state(100, i))
    assert cache.best([200]) is None
    assert cache.stats().ram_bytes <= 250


def test_disk_budget_holds_across_the_whole_folder(tmp_path: Path) -> None:
    root = tmp_path / "kv"
    first = PrefixCache(root / "a", ram_budget=0, disk_budget=1_000)
    second = PrefixCache(root / "b", ram_budget=0, disk_budget=1_000)
    for i in range(6):
        first.save([i, 1], state(300, i))
        second.save([i, 2], state(300, i))
    total = sum(p.stat().st_size for p in root.glob("*/*.kv"))
    assert total <= 1_000


def test_saved_prefixes_outlive_the_cache_object(tmp_path: Path) -> None:
    folder = tmp_path / "kv" / "model"
    cache = PrefixCache(folder, ram_budget=1 << 20, disk_budget=1 << 20)
    cache.save([5, 6, 7], state(50, 7))
    cache.persist()
    again = PrefixCache(folder, ram_budget=1 << 20, disk_budget=1 << 20)
    _, key = again.best([5, 6, 7, 8])  # type: ignore[misc]
    assert again.load(key) == state(50, 7)


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_a_damaged_file_is_deleted_never_used(tmp_path: Path, damage: str) -> None:
    folder = tmp_path / "kv" / "model"
    cache = PrefixCache(folder, ram_budget=1 << 20, disk_budget=1 << 20)
    cache.save([5, 6, 7], state(50, 7))
    cache.persist()
    (path,) = folder.glob("*.kv")
    data = path.read_bytes()
    if damage == "flip":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    elif damage == "truncate":
        path.write_bytes(data[:-10])
    else:
        path.write_bytes(b"not a saved prefix at all")
    again = PrefixCache(folder, ram_budget=1 << 20, disk_budget=1 << 20)
    found = again.best([5, 6, 7])
    if found is not None:  # a flipped payload passes the header check; its checksum fails
        assert again.load(found[1]) is None
    assert not path.exists()


def test_models_and_layouts_get_separate_folders(tmp_path: Path) -> None:
    folders = {
        layout_folder(tmp_path, "sha256-aa", "f16"),
        layout_folder(tmp_path, "sha256-bb", "f16"),
        layout_folder(tmp_path, "sha256-aa", "q8_0"),
    }
    assert len(folders) == 3


# -- restores in a real runner -----------------------------------------------------------------

SYSTEM = "kv cache check: " + "a long system prompt that many requests share " * 12


@pytest.fixture(scope="module")
def endless(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("kv") / "endless.gguf", never_ends=True)


def runner_for(model: Path, kv_dir: Path, workdir: Path, slots: int = 1) -> RunnerHarness:
    config = RunnerConfig(
        model_path=str(model),
        n_slots=slots,
        n_ctx_per_slot=1024,
        n_threads=2,
        kv_cache_dir=str(kv_dir),
        kv_cache_ram=64 << 20,
        kv_cache_disk=256 << 20,
    )
    workdir.mkdir(parents=True, exist_ok=True)
    return RunnerHarness(config, workdir)


def ask(prompt: str) -> GenerationRequest:
    return GenerationRequest(id="", prompt=prompt, raw=True, options=greedy(16))


def answer_alone(
    model: Path, kv_dir: Path, workdir: Path, prompt: str
) -> tuple[str, GenerationResult]:
    """One answer from a runner started for it; closing it saves its idle prefix."""
    runner = runner_for(model, kv_dir, workdir)
    try:
        return runner.generate(ask(prompt))
    finally:
        runner.close()


@pytest.fixture
def kv_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "kvcache"


def test_a_restored_prefix_answers_as_a_cold_prefill(
    endless: Path, kv_dir: Path, tmp_path: Path
) -> None:
    runner = runner_for(endless, kv_dir, tmp_path / "r1")
    try:
        cold_text, cold = runner.generate(ask(SYSTEM + "question one"))
        assert cold.timings.cached_tokens == 0
        # Another prompt takes the only slot: the first prefix moves to the RAM tier ...
        runner.generate(ask("something else entirely, long enough to matter " * 4))
        # ... and comes back for the next prompt that shares it.
        warm_text, warm = runner.generate(ask(SYSTEM + "question one"))
        stats = runner.run(runner.client.stats())
    finally:
        runner.close()
    assert stats.prefix_restores == 1
    assert warm.timings.cached_tokens >= cold.timings.prompt_tokens - 16
    assert warm_text == cold_text


def test_saved_prefixes_survive_a_runner_restart_and_never_cross_models(
    endless: Path, kv_dir: Path, tmp_path: Path
) -> None:
    cold_text, cold = answer_alone(endless, kv_dir, tmp_path / "r1", SYSTEM + "question two")
    assert list(kv_dir.glob("*/*.kv"))
    warm_text, warm = answer_alone(endless, kv_dir, tmp_path / "r2", SYSTEM + "question two")
    assert warm.timings.cached_tokens >= cold.timings.prompt_tokens - 16
    assert warm_text == cold_text
    # Another model (other weights) never sees those states.
    other_model = write_tiny_gguf(tmp_path / "other.gguf", never_ends=True, seed=7)
    _, fresh = answer_alone(other_model, kv_dir, tmp_path / "r3", SYSTEM + "question two")
    assert fresh.timings.cached_tokens == 0


def test_a_corrupt_saved_prefix_is_removed_and_the_answer_is_unchanged(
    endless: Path, kv_dir: Path, tmp_path: Path
) -> None:
    cold_text, _ = answer_alone(endless, kv_dir, tmp_path / "r1", SYSTEM + "question three")
    (path,) = kv_dir.glob("*/*.kv")
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    text, result = answer_alone(endless, kv_dir, tmp_path / "r2", SYSTEM + "question three")
    assert result.timings.cached_tokens == 0
    assert text == cold_text
    assert not path.exists() or path.read_bytes() != bytes(data)


def test_a_saved_prompt_comes_back_from_ram_for_its_last_few_tokens(
    endless: Path, kv_dir: Path, tmp_path: Path
) -> None:
    # Two prompts that differ only after a long shared start: taking the only slot, the
    # second keeps the shared start in context, and the first prompt's own ending lives on
    # in the RAM tier alone. Copying those saved cells back costs far less than evaluating
    # even the few prompt tokens they spare.
    runner = runner_for(endless, kv_dir, tmp_path / "r1")
    first = GenerationRequest(id="", prompt=SYSTEM + "question five", raw=True, options=greedy(48))
    other = GenerationRequest(id="", prompt=SYSTEM + "question six", raw=True, options=greedy(48))
    try:
        cold_text, cold = runner.generate(first)
        runner.generate(other)
        warm_text, warm = runner.generate(first)
        stats = runner.run(runner.client.stats())
    finally:
        runner.close()
    assert stats.prefix_restores == 1
    assert warm.timings.cached_tokens == cold.timings.prompt_tokens - 1
    assert warm_text == cold_text
