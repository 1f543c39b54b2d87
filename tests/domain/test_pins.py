from pathlib import Path

import pytest

from domain.pins import PinEntry, PinTableError, read_pins, update_pin_table

FIXTURE = Path(__file__).parents[2] / "sandbox/fixtures/marinskyrl/cloud/iris/gpu_rl_images.py"
SRC, HARBOR = "a" * 40, "b" * 40


def entry(arch, variant, d="c"):
    return PinEntry(architecture=arch, variant=variant, digest="sha256:" + d * 64, tag=f"gpu-rl-{SRC}",
                    source_commit=SRC, harbor_commit=HARBOR)


def test_updates_only_the_rebuilt_entries_and_keeps_constants():
    text = FIXTURE.read_text()
    before = read_pins(text)
    out = update_pin_table(text, [entry("amd64", "standard"), entry("amd64", "megatron", "d")])
    pins = read_pins(out)
    assert pins[("AMD64", "STANDARD")] == {"digest": "sha256:" + "c" * 64, "tag": f"gpu-rl-{SRC}",
                                          "source_commit": SRC, "harbor_commit": HARBOR}
    assert pins[("AMD64", "MEGATRON")]["digest"] == "sha256:" + "d" * 64
    assert pins[("ARM64", "STANDARD")] == before[("ARM64", "STANDARD")]  # other arch untouched
    assert 'SOURCE_COMMIT = "4faf0dee' in out  # constants move only when every entry moved
    compile(out, "gpu_rl_images.py", "exec")


def test_all_entries_move_the_module_constants():
    out = update_pin_table(FIXTURE.read_text(), [entry(a, v) for a in ("amd64", "arm64")
                                                 for v in ("standard", "megatron")])
    assert f'SOURCE_COMMIT = "{SRC}"' in out and f'HARBOR_COMMIT = "{HARBOR}"' in out


def test_fails_closed_on_unknown_entry_and_non_digest():
    text = FIXTURE.read_text()
    with pytest.raises(PinTableError, match=r"no entry for \(RISCV64, STANDARD\)"):
        update_pin_table(text, [entry("riscv64", "standard")])
    bad = entry("amd64", "standard").model_copy(update={"digest": "latest"})
    with pytest.raises(PinTableError, match="non-digest"):
        update_pin_table(text, [bad])
    with pytest.raises(PinTableError, match="no GPU_RL_IMAGES"):
        update_pin_table("X = 1\n", [entry("amd64", "standard")])
