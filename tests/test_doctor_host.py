"""`ragkit doctor` on this machine's facts: RAM capped by the cgroup memory limit (cgroup
file systems written into a temp folder, the layout the kernel uses), "unknown" when RAM
cannot be read, and the exit code of a plan that does not fit (README: 3)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixtures.tiny_kimi import build_tiny_kimi  # noqa: E402

from ragkit.cli import app  # noqa: E402

GiB, MiB = 1024**3, 1024**2
V1_UNLIMITED = "9223372036854771712"  # what cgroup v1 writes for "no limit" (2^63 rounded down to a page)
runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_kimi(tmp_path_factory) -> Path:
    return build_tiny_kimi(tmp_path_factory.mktemp("tiny-kimi-doctor"), n_shards=3)


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def v2(tmp_path: Path, max_: str, current: int = 0, inactive_file: int = 0, own: str = "/") -> tuple[Path, Path]:
    root = write(tmp_path / "cgroup", {"cgroup.controllers": "cpu memory pids\n", "memory.max": max_ + "\n",
                                       "memory.current": f"{current}\n",
                                       "memory.stat": f"anon {current}\nfile 0\ninactive_file {inactive_file}\n"})
    proc = write(tmp_path, {"proc-self-cgroup": f"0::{own}\n"}) / "proc-self-cgroup"
    return root, proc


# ---------------------------------------------------------------------- cgroup parsing

def test_cgroup_v2_limit_and_usage_less_inactive_cache(tmp_path):
    from ragkit.doctor.fit import cgroup_memory

    root, proc = v2(tmp_path, str(2 * GiB), current=1 * GiB, inactive_file=256 * MiB)
    cg = cgroup_memory(root, proc)
    assert (cg.limit, cg.usage, cg.version) == (2 * GiB, 1 * GiB - 256 * MiB, 2)
    assert cg.path == str(root / "memory.max")


def test_cgroup_v2_nested_takes_the_tightest_limit_on_the_path(tmp_path):
    from ragkit.doctor.fit import cgroup_memory

    root, proc = v2(tmp_path, "max", own="/kubepods/pod1/ctr")
    write(root, {"kubepods/memory.max": f"{8 * GiB}\n", "kubepods/pod1/memory.max": f"{3 * GiB}\n",
                 "kubepods/pod1/memory.current": f"{1 * GiB}\n", "kubepods/pod1/ctr/memory.max": "max\n",
                 "kubepods/pod1/ctr/memory.current": f"{512 * MiB}\n"})
    cg = cgroup_memory(root, proc)
    assert cg.limit == 3 * GiB and cg.usage == 1 * GiB  # the pod's limit binds the container
    assert cg.path == str(root / "kubepods/pod1/memory.max")


def test_cgroup_v2_without_a_limit(tmp_path):
    from ragkit.doctor.fit import cgroup_memory

    assert cgroup_memory(*v2(tmp_path, "max")) is None


def test_cgroup_v1(tmp_path):
    from ragkit.doctor.fit import cgroup_memory

    root = write(tmp_path / "cgroup", {"memory/memory.limit_in_bytes": f"{3 * GiB}\n",
                                       "memory/memory.usage_in_bytes": f"{2 * GiB}\n",
                                       "memory/memory.stat": f"cache 5\ninactive_file 7\ntotal_inactive_file {GiB}\n"})
    # the path a container often shows is the host's, absent from its own mount: the mount root is its cgroup
    proc = write(tmp_path, {"proc": "12:pids:/\n4:memory:/docker/0123abcd\n0::/\n"}) / "proc"
    cg = cgroup_memory(root, proc)
    assert (cg.limit, cg.usage, cg.version) == (3 * GiB, 1 * GiB, 1)
    (root / "memory/memory.limit_in_bytes").write_text(V1_UNLIMITED + "\n")
    assert cgroup_memory(root, proc) is None
    # nested (this kind of machine): the process's own folder, then its ancestors
    write(root, {"memory/docker/0123abcd/memory.limit_in_bytes": f"{5 * GiB}\n",
                 "memory/docker/memory.limit_in_bytes": V1_UNLIMITED + "\n"})
    assert cgroup_memory(root, proc).limit == 5 * GiB


def test_no_cgroup_file_system(tmp_path):
    from ragkit.doctor.fit import cgroup_memory

    assert cgroup_memory(tmp_path / "nothing", tmp_path / "no-proc") is None


def test_host_ram_is_capped_by_the_cgroup_limit(tmp_path):
    import psutil

    from ragkit.doctor.fit import host_facts, ram

    physical = psutil.virtual_memory()
    assert physical.total > 512 * MiB
    root, proc = v2(tmp_path, str(512 * MiB), current=100 * MiB)
    h = host_facts(tmp_path, cgroup_root=root, proc_cgroup=proc)
    assert h.ram_total == h.ram_limit == 512 * MiB
    assert 0 < h.ram_available <= 412 * MiB
    assert h.ram_source == f"cgroup v2 {root / 'memory.max'}"
    # a limit above the machine's RAM: the machine's RAM
    root2, proc2 = v2(tmp_path / "big", str(1024 * 1024 * GiB))
    total, avail, limit, _ = ram(root2, proc2)
    assert total == physical.total and limit == 1024 * 1024 * GiB
    assert 0 < avail <= physical.total


def test_this_machine_reports_ram_never_zero():
    from ragkit.doctor.fit import host_facts

    h = host_facts(Path.cwd())
    assert h.ram_total and h.ram_available and 0 < h.ram_available <= h.ram_total
    assert h.ram_source


# ---------------------------------------------------------------------- unknown RAM

@pytest.fixture
def ram_unreadable(monkeypatch, tmp_path):
    """FAKE (unit test): psutil is made to fail, standing in for a platform where it cannot
    read memory, and the cgroup root points at an empty folder."""
    import psutil

    import ragkit.doctor.fit as doctor

    def fail():
        raise OSError("no /proc/meminfo")

    monkeypatch.setattr(psutil, "virtual_memory", fail)
    monkeypatch.setattr(doctor, "CGROUP_ROOT", tmp_path / "no-cgroup", raising=False)
    monkeypatch.setattr(doctor, "PROC_SELF_CGROUP", tmp_path / "no-proc", raising=False)


def test_unknown_ram_is_unknown_not_zero(ram_unreadable, tiny_kimi):
    from ragkit.config import load_settings
    from ragkit.doctor.fit import host_facts, model_facts, plan, ram

    assert ram() == (None, None, None, "unknown")
    h = host_facts(tiny_kimi.parent)
    assert h.ram_total is None and h.ram_available is None
    p = plan(model_facts(tiny_kimi), load_settings(profile="kimi-k2").generator, h)
    assert p.verdict == "unknown" and p.fits is None and p.reasons == [] and p.recommendations == []
    assert any("host RAM could not be read" in n for n in p.notes), p.notes
    assert p.host["ram_total"] is None and p.host["ram_available"] is None


def test_doctor_cli_says_unknown(ram_unreadable, tiny_kimi):
    res = runner.invoke(app, ["doctor", "--profile", "kimi-k2", "--model", str(tiny_kimi)])
    assert res.exit_code == 0, res.output  # not known not to fit
    host = next(ln for ln in res.output.splitlines() if ln.startswith("host"))
    assert host.startswith("host  RAM unknown available of unknown;"), host
    assert "unknown" in res.output.splitlines()  # the verdict line
    assert re.search(r"host RAM could not be read: the CPU side \(\d+\.\d MiB\) was not checked", res.output), res.output
    res = runner.invoke(app, ["doctor", "--profile", "kimi-k2", "--model", str(tiny_kimi), "--json"])
    d = json.loads(res.stdout)
    assert res.exit_code == 0 and d["verdict"] == "unknown" and d["fits"] is None
    assert d["host"]["ram_total"] is None and d["host"]["ram_available"] is None


# ---------------------------------------------------------------------- exit code

def test_doctor_exits_3_when_the_cgroup_limit_is_too_small(monkeypatch, tmp_path, tiny_kimi):
    """The real tiny model and the real planner; only the cgroup root is a temp folder,
    with a 256 MiB limit: less than the 1 GiB the planner keeps for the runtime."""
    import ragkit.doctor.fit as doctor

    root, proc = v2(tmp_path, str(256 * MiB), current=16 * MiB)
    monkeypatch.setattr(doctor, "CGROUP_ROOT", root, raising=False)
    monkeypatch.setattr(doctor, "PROC_SELF_CGROUP", proc, raising=False)
    res = runner.invoke(app, ["doctor", "--profile", "kimi-k2", "--model", str(tiny_kimi), "--json"])
    assert res.exit_code == 3, res.output
    d = json.loads(res.stdout)
    assert d["verdict"] == "no-fit" and d["fits"] is False
    assert d["host"]["ram_total"] == 256 * MiB and d["host"]["ram_limit"] == 256 * MiB
    assert any("host RAM needs" in r for r in d["reasons"])
    res = runner.invoke(app, ["doctor", "--profile", "kimi-k2", "--model", str(tiny_kimi)])
    assert res.exit_code == 3 and "no-fit" in res.output and "cgroup limit 256.0 MiB" in res.output


def test_doctor_exit_code_matches_does_not_fit(monkeypatch, tiny_kimi):
    """FAKE host facts (unit test): a 0.5 GiB machine, so the exit code is checked apart
    from how RAM is read. The CLI's code is the one `ask` exits with on DoesNotFit."""
    import ragkit.doctor.fit as doctor

    monkeypatch.setattr(doctor, "host_facts", lambda path, **kw: doctor.HostFacts(
        ram_total=GiB // 2, ram_available=GiB // 2, disk_free=10 * GiB, disk_path=str(path), gpus=[], gpu_offload=False))
    res = runner.invoke(app, ["doctor", "--profile", "kimi-k2", "--model", str(tiny_kimi), "--json"])
    assert res.exit_code == doctor.DoesNotFit.exit_code == 3, res.output
    assert json.loads(res.stdout)["verdict"] == "no-fit"
