"""Sizing from the machine (outpost/sizing): cgroup v1/v2, affinity and meminfo faked with files,
the GGUF footprint from a header-only GGUF, and the slot / KV / thread decisions."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from outpost.sizing import (
    Asked,
    Cores,
    MachineFiles,
    Memory,
    ModelFootprint,
    NotEnoughMemory,
    int_or_auto,
    plan,
    read_cores,
    read_footprint,
    read_memory,
)
from outpost.sizing.plan import CELL_ALIGN, POSITION_CAP

GiB = 1024**3
MiB = 1024**2
V1_UNLIMITED = "9223372036854771712"


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _machine(tmp_path: Path, cgroup: str, host_gib: float = 20.0, cpus: int = 16) -> MachineFiles:
    _write(
        tmp_path, "proc/meminfo", f"MemTotal: 99999999 kB\nMemAvailable: {int(host_gib * 1024 * 1024)} kB\n"
    )
    _write(tmp_path, "proc/self/cgroup", cgroup)
    (tmp_path / "cg").mkdir(exist_ok=True)
    return MachineFiles(proc=tmp_path / "proc", cgroup_root=tmp_path / "cg", affinity=lambda: cpus)


# --- memory -------------------------------------------------------------------------------------


def test_no_cgroup_limit_means_host_mem_available(tmp_path: Path) -> None:
    files = _machine(tmp_path, "0::/\n", host_gib=20)
    _write(tmp_path, "cg/cgroup.controllers", "cpu memory\n")
    _write(tmp_path, "cg/memory.max", "max\n")
    _write(tmp_path, "cg/memory.current", "123456\n")
    assert read_memory(files) == Memory(20 * GiB, "host MemAvailable")


def test_cgroup_v2_limit_minus_working_set(tmp_path: Path) -> None:
    """A container's memory.max, less what it uses beyond reclaimable file cache, beats the host."""
    files = _machine(tmp_path, "0::/\n", host_gib=20)
    _write(tmp_path, "cg/cgroup.controllers", "cpu memory\n")
    _write(tmp_path, "cg/memory.max", f"{2 * GiB}\n")
    _write(tmp_path, "cg/memory.current", f"{1 * GiB}\n")
    _write(tmp_path, "cg/memory.stat", f"anon 100\nfile 200\ninactive_file {256 * MiB}\nactive_file 5\n")
    assert read_memory(files) == Memory(2 * GiB - (GiB - 256 * MiB), "cgroup v2 memory.max")


def test_cgroup_v2_tightest_ancestor_wins(tmp_path: Path) -> None:
    """Kubernetes puts the pod limit on a parent of the container's group: every level counts."""
    files = _machine(tmp_path, "0::/kubepods/pod1/ctr\n", host_gib=20)
    _write(tmp_path, "cg/cgroup.controllers", "cpu memory\n")
    _write(tmp_path, "cg/kubepods/pod1/ctr/memory.max", "max\n")
    _write(tmp_path, "cg/kubepods/pod1/ctr/memory.current", f"{GiB}\n")
    _write(tmp_path, "cg/kubepods/pod1/memory.max", f"{3 * GiB}\n")
    _write(tmp_path, "cg/kubepods/pod1/memory.current", f"{2 * GiB}\n")
    _write(tmp_path, "cg/kubepods/memory.max", f"{8 * GiB}\n")
    _write(tmp_path, "cg/kubepods/memory.current", f"{2 * GiB}\n")
    assert read_memory(files) == Memory(GiB, "cgroup v2 memory.max")


def test_cgroup_v2_namespaced_path_reads_the_mount(tmp_path: Path) -> None:
    """Inside a container with its own cgroup namespace /proc says "0::/" or a path the mount lacks."""
    files = _machine(tmp_path, "0::/not/visible/here\n", host_gib=20)
    _write(tmp_path, "cg/cgroup.controllers", "memory\n")
    _write(tmp_path, "cg/memory.max", f"{4 * GiB}\n")
    _write(tmp_path, "cg/memory.current", "0\n")
    assert read_memory(files) == Memory(4 * GiB, "cgroup v2 memory.max")


def test_cgroup_v1_limit_in_bytes(tmp_path: Path) -> None:
    files = _machine(tmp_path, "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n", host_gib=20)
    _write(tmp_path, "cg/memory/docker/abc/memory.limit_in_bytes", f"{6 * GiB}\n")
    _write(tmp_path, "cg/memory/docker/abc/memory.usage_in_bytes", f"{2 * GiB}\n")
    _write(tmp_path, "cg/memory/docker/abc/memory.stat", f"cache 5\ntotal_inactive_file {GiB}\n")
    _write(tmp_path, "cg/memory/docker/memory.limit_in_bytes", V1_UNLIMITED)
    _write(tmp_path, "cg/memory/docker/memory.usage_in_bytes", f"{3 * GiB}\n")
    assert read_memory(files) == Memory(5 * GiB, "cgroup v1 memory.limit_in_bytes")


def test_cgroup_v1_unlimited_and_host_smaller(tmp_path: Path) -> None:
    """v1's "no limit" is a huge number; a host with less free memory than a limit wins too."""
    files = _machine(tmp_path, "4:memory:/\n", host_gib=1.5)
    _write(tmp_path, "cg/memory/memory.limit_in_bytes", V1_UNLIMITED)
    _write(tmp_path, "cg/memory/memory.usage_in_bytes", "1000\n")
    assert read_memory(files) == Memory(int(1.5 * GiB), "host MemAvailable")
    _write(tmp_path, "cg/memory/memory.limit_in_bytes", f"{4 * GiB}\n")
    assert read_memory(files) == Memory(int(1.5 * GiB), "host MemAvailable")


def test_cgroup_over_its_limit_reads_zero(tmp_path: Path) -> None:
    files = _machine(tmp_path, "0::/\n")
    _write(tmp_path, "cg/cgroup.controllers", "memory\n")
    _write(tmp_path, "cg/memory.max", f"{GiB}\n")
    _write(tmp_path, "cg/memory.current", f"{2 * GiB}\n")
    assert read_memory(files).available == 0


def test_no_meminfo_and_no_cgroup_falls_back_to_physical_memory(tmp_path: Path) -> None:
    files = MachineFiles(proc=tmp_path / "none", cgroup_root=tmp_path / "none", affinity=lambda: 1)
    memory = read_memory(files)
    assert memory.source == "physical memory" and memory.available > 0


def test_this_machine_reads_something() -> None:
    memory, cores = read_memory(), read_cores()
    assert memory.available > 0 and cores.count >= 1


# --- cores --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        ("max 100000", Cores(16, "CPU affinity")),
        ("200000 100000", Cores(2, "cgroup v2 cpu.max")),
        ("150000 100000", Cores(2, "cgroup v2 cpu.max")),  # --cpus 1.5: rounded up
        ("50000 100000", Cores(1, "cgroup v2 cpu.max")),  # --cpus 0.5: still one thread
        ("3200000 100000", Cores(16, "CPU affinity")),  # a quota above the mask: the mask
    ],
)
def test_cgroup_v2_cpu_max(tmp_path: Path, cpu_max: str, expected: Cores) -> None:
    files = _machine(tmp_path, "0::/\n", cpus=16)
    _write(tmp_path, "cg/cgroup.controllers", "cpu memory\n")
    _write(tmp_path, "cg/cpu.max", cpu_max + "\n")
    assert read_cores(files) == expected


def test_affinity_mask_beats_a_larger_quota(tmp_path: Path) -> None:
    """`taskset -c 0` on a 4-CPU container: one core."""
    files = _machine(tmp_path, "0::/\n", cpus=1)
    _write(tmp_path, "cg/cgroup.controllers", "cpu\n")
    _write(tmp_path, "cg/cpu.max", "400000 100000\n")
    assert read_cores(files) == Cores(1, "CPU affinity")


def test_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    files = _machine(tmp_path, "3:cpu,cpuacct:/docker/abc\n", cpus=8)
    _write(tmp_path, "cg/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "250000\n")
    _write(tmp_path, "cg/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert read_cores(files) == Cores(3, "cgroup v1 cpu.cfs_quota_us")
    _write(tmp_path, "cg/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n")
    assert read_cores(files) == Cores(8, "CPU affinity")


def test_the_real_affinity_mask_is_read() -> None:
    import os

    assert read_cores(MachineFiles(cgroup_root=Path("/nonexistent"))).count == len(os.sched_getaffinity(0))


# --- the model's footprint ----------------------------------------------------------------------


def test_footprint_from_a_gguf_header(tmp_path: Path) -> None:
    """SmolLM2-135M's header: 30 layers, 3 KV heads of 64 dims -> 30*3*128*2 bytes per f16 cell."""
    from gguf import GGUFWriter

    path = tmp_path / "m.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(30)
    writer.add_embedding_length(576)
    writer.add_head_count(9)
    writer.add_head_count_kv(3)
    writer.add_context_length(8192)
    writer.add_token_list([f"t{i}" for i in range(100)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    fp = read_footprint(path)
    assert (fp.n_layer, fp.kv_heads_total, fp.key_length, fp.value_length) == (30, 90, 64, 64)
    assert (fp.n_vocab, fp.n_ctx_train, fp.file_bytes) == (100, 8192, path.stat().st_size)
    assert fp.kv_bytes_per_cell("f16") == 30 * 3 * 128 * 2 == 23040
    assert fp.kv_bytes_per_cell("f32") == 2 * 23040


def test_footprint_with_per_layer_kv_heads_and_explicit_head_sizes(tmp_path: Path) -> None:
    """OpenELM-style per-layer KV heads; key/value lengths given apart from n_embd / n_head."""
    from gguf import GGUFWriter

    path = tmp_path / "m.gguf"
    writer = GGUFWriter(str(path), "openelm")
    writer.add_block_count(3)
    writer.add_embedding_length(1280)
    writer.add_head_count([12, 16, 20])
    writer.add_head_count_kv([3, 4, 5])
    writer.add_key_length(128)
    writer.add_value_length(96)
    writer.add_string("tokenizer.chat_template", "{{ x }}")
    writer.add_array("tokenizer.ggml.scores", [0.5] * 5000)
    writer.add_token_list(["a", "bb", "ccc"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    fp = read_footprint(path)
    assert (fp.kv_heads_total, fp.n_head, fp.key_length, fp.value_length) == (12, 20, 128, 96)
    assert (fp.n_vocab, fp.n_ctx_train) == (3, 0)
    assert fp.kv_bytes_per_cell() == 12 * (128 + 96) * 2


def test_footprint_of_a_non_gguf_is_a_value_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="not a readable GGUF"):
        read_footprint(bad)


# --- decisions ----------------------------------------------------------------------------------

SMOL = ModelFootprint(
    file_bytes=100 * MiB,
    n_layer=30,
    kv_heads_total=90,
    n_head=9,
    key_length=64,
    value_length=64,
    n_embd=576,
    n_vocab=49152,
    n_ctx_train=8192,
)
CELL = SMOL.kv_bytes_per_cell()
BIG = Memory(22 * GiB, "host MemAvailable")


def test_auto_on_this_projects_machine() -> None:
    """2 cores, 22 GiB free: 8 slots of the full trained context, 2 threads."""
    p = plan(SMOL, BIG, Cores(2, "CPU affinity"), Asked())
    assert (p.slots, p.positions, p.n_ctx, p.threads) == (8, 8192, 65536, 2)
    assert p.kv_bytes == 65536 * CELL
    assert p.auto == ("slots", "ctx", "threads")
    assert "22.0 GiB available (host MemAvailable), model 100 MiB, 2 usable cores (CPU affinity)" in p.why()


def test_one_core_gets_four_slots_and_one_thread() -> None:
    p = plan(SMOL, BIG, Cores(1, "CPU affinity"), Asked())
    assert (p.slots, p.threads) == (4, 1)


def test_positions_are_capped_by_the_trained_context_and_the_cap() -> None:
    short = replace(SMOL, n_ctx_train=2048)
    assert plan(short, BIG, Cores(2, "x"), Asked()).positions == 2048
    long = replace(SMOL, n_ctx_train=131072)
    assert plan(long, BIG, Cores(2, "x"), Asked()).positions == POSITION_CAP


def test_little_memory_gives_fewer_positions_then_fewer_slots() -> None:
    cores = Cores(2, "x")
    roomy = plan(SMOL, Memory(int(1.6 * GiB), "cgroup v2 memory.max"), cores, Asked())
    assert roomy.slots == 8 and CELL_ALIGN <= roomy.positions < 8192 and roomy.positions % CELL_ALIGN == 0
    tight = plan(SMOL, Memory(int(1.2 * GiB), "cgroup v2 memory.max"), cores, Asked())
    assert 1 <= tight.slots < 8 and tight.positions >= 2048
    for p, memory in ((roomy, 1.6 * GiB), (tight, 1.2 * GiB)):
        # auto never takes more than half the room beside the weights, buffers and margin.
        assert p.kv_bytes <= (memory - p.reserved_bytes) / 2
    with pytest.raises(NotEnoughMemory, match=r"not enough memory for 1 slot of 256 .* 512 MiB is available"):
        plan(SMOL, Memory(GiB // 2, "cgroup v2 memory.max"), cores, Asked())
    with pytest.raises(NotEnoughMemory, match=r"not enough memory for 64 slots of 256 positions"):
        plan(SMOL, Memory(int(1.2 * GiB), "cgroup v2 memory.max"), cores, Asked(parallel=64))


def test_explicit_values_win() -> None:
    p = plan(SMOL, BIG, Cores(2, "x"), Asked(parallel=3, ctx_size=3000, threads=5))
    assert (p.slots, p.n_ctx, p.threads, p.auto) == (3, 3000, 5, ())
    # -c 0: the trained context (at most 8192) for all slots, as before auto existed.
    assert plan(SMOL, BIG, Cores(2, "x"), Asked(parallel=2, ctx_size=0)).n_ctx == 8192
    # -np given, -c auto: that many slots, the positions memory allows them.
    assert plan(SMOL, BIG, Cores(2, "x"), Asked(parallel=16)).n_ctx == 16 * 8192
    # -c given, -np auto: no slot gets fewer than 256 cells.
    assert plan(SMOL, BIG, Cores(2, "x"), Asked(ctx_size=512)).slots == 2


def test_asking_for_more_than_a_container_has_is_refused(tmp_path: Path) -> None:
    """-c 10000000 in a 4 GiB container (cgroup v2, faked): refused with what it needs and has."""
    files = _machine(tmp_path, "0::/\n", host_gib=20)
    _write(tmp_path, "cg/cgroup.controllers", "cpu memory\n")
    _write(tmp_path, "cg/memory.max", f"{4 * GiB}\n")
    _write(tmp_path, "cg/memory.current", "0\n")
    memory = read_memory(files)
    with pytest.raises(NotEnoughMemory) as info:
        plan(SMOL, memory, read_cores(files), Asked(ctx_size=10_000_000))
    message = str(info.value)
    assert (
        "-c 10000000 with -np 8 needs about 215.6 GiB (214.6 GiB KV cache at 23040 bytes per cell" in message
    )
    assert "but 4.0 GiB is available (cgroup v2 memory.max)" in message
    # The same request fits the host: only the container's limit refuses it.
    plan(SMOL, Memory(300 * GiB, "host MemAvailable"), Cores(2, "x"), Asked(ctx_size=10_000_000))
    # Slots count too: 64 slots of 8192 positions do not fit 4 GiB.
    with pytest.raises(NotEnoughMemory, match="-c 524288 with -np 64"):
        plan(SMOL, memory, Cores(2, "x"), Asked(parallel=64, ctx_size=64 * 8192))
    # With GPU layers the cache may live in device memory: no host-memory refusal.
    plan(SMOL, memory, Cores(2, "x"), Asked(ctx_size=10_000_000, check_memory=False))


def test_flash_attention_off_reserves_the_attention_scores() -> None:
    on = plan(SMOL, BIG, Cores(2, "x"), Asked(parallel=1, ctx_size=65536))
    off = plan(SMOL, BIG, Cores(2, "x"), Asked(parallel=1, ctx_size=65536, flash_attn="off"))
    assert off.reserved_bytes - on.reserved_bytes == 2 * 4 * SMOL.n_head * 512 * 65536
    # A stream per slot: a token attends over its own slot's cells only.
    streams = plan(SMOL, BIG, Cores(2, "x"), Asked(parallel=8, ctx_size=65536, flash_attn="off"))
    pooled = plan(
        SMOL, BIG, Cores(2, "x"), Asked(parallel=8, ctx_size=65536, flash_attn="off", kv_unified="on")
    )
    assert pooled.reserved_bytes - streams.reserved_bytes == 2 * 4 * SMOL.n_head * 512 * (65536 - 8192)


def test_int_or_auto() -> None:
    assert int_or_auto("auto") == "auto" and int_or_auto("AUTO") == "auto" and int_or_auto("8") == 8
    with pytest.raises(argparse.ArgumentTypeError, match="whole number or 'auto'"):
        int_or_auto("eight")


def test_serve_flags_accept_auto_and_numbers(tmp_path: Path) -> None:
    from outpost.cli import build_parser
    from outpost.settings import EngineSettings

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    args = build_parser().parse_args(["serve", "-m", str(model), "-np", "auto", "-c", "4096"])
    assert (args.parallel, args.ctx_size, args.threads) == ("auto", 4096, None)
    defaults = EngineSettings()
    assert (defaults.parallel, defaults.ctx_size, defaults.threads) == ("auto", "auto", "auto")
    given = EngineSettings.model_validate({"parallel": "3", "threads": 2})
    assert (given.parallel, given.threads) == (3, 2)
    from outpost.envflags import use_environment

    argv = ["serve", "-m", str(model), "-c", "4096"]
    parser = build_parser()
    use_environment(
        parser, argv, {"OUTPOST_PARALLEL": "6", "OUTPOST_CTX_SIZE": "auto", "OUTPOST_THREADS": "auto"}
    )
    from_env = parser.parse_args(argv)
    assert (from_env.parallel, from_env.ctx_size, from_env.threads) == (6, 4096, "auto")
    with pytest.raises(ValueError):
        EngineSettings(parallel=0)
