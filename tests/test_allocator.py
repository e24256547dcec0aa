"""Keeping freed memory for reuse (glomo_pyg.allocator): it takes effect, can be turned
off, and a bad setting is named. Each case runs in its own process."""
import os
import subprocess
import sys

import pytest

from glomo_pyg.allocator import _glibc

# allocate and free 64 MiB ten times, then count the page faults of ten more rounds
PROBE = """
import resource, sys, torch
from glomo_pyg.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
def rounds():
    for _ in range(10):
        t = torch.ones(16 << 20)
        del t
rounds()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rounds()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def probe(mode, code=PROBE, **env):
    base = {k: v for k, v in os.environ.items() if k != "GLOMO_MALLOC"}
    out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True,
                         env=dict(base, **env), check=True).stdout.split()
    return out[0] == "True", int(out[1])


def huge_pages_always() -> bool:
    """Transparent huge pages on every mapping: 2 MiB pages fault 512x less often."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fh:
            return "[always]" in fh.read()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _glibc(), reason="glibc's malloc only")
@pytest.mark.skipif(huge_pages_always(), reason="page faults are counted in 4 KiB pages")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    applied, faults = probe("keep")
    assert applied and faults < 1000  # the pages stay mapped
    _, faults = probe("leave")
    assert faults > 100_000  # each 64 MiB block is mapped and faulted in again (16k pages)


@pytest.mark.slow
def test_the_environment_turns_it_off_and_bad_values_are_named(monkeypatch):
    from glomo_pyg.allocator import keep_freed_memory
    from glomo_pyg.cli import console_main

    monkeypatch.setenv("GLOMO_MALLOC", "system")
    assert keep_freed_memory() is False
    if _glibc():
        assert probe("keep", GLOMO_MALLOC="system")[0] is False
    monkeypatch.setenv("GLOMO_MALLOC", "jemalloc")
    with pytest.raises(ValueError, match=r"GLOMO_MALLOC must be one of \('keep', 'system'\), "
                                         r"got 'jemalloc'"):
        keep_freed_memory()
    monkeypatch.setattr(sys, "argv", ["glomo", "syntax", "--predictor", "x", "--treebank",
                                      "y"])
    with pytest.raises(SystemExit, match="glomo: GLOMO_MALLOC must be one of"):
        console_main()  # the executable refuses it before any work


@pytest.mark.slow
def test_importing_or_calling_main_changes_no_process_setting():
    """Only the executable sets malloc up: cli.main() called inside a process (a notebook,
    a test) leaves it as it is, so large blocks are still mapped afresh afterwards."""
    if not _glibc() or huge_pages_always():
        pytest.skip("counts glibc's 4 KiB page faults")
    call_main = ("import glomo_pyg.cli\n"
                 "try:\n"
                 "    glomo_pyg.cli.main(['syntax', '--predictor', '/nonexistent', "
                 "'--treebank', '/nonexistent'])\n"
                 "except SystemExit:\n"
                 "    pass\n"
                 "applied = False")
    code = PROBE.replace('applied = keep_freed_memory() if sys.argv[1] == "keep" else False',
                         call_main)
    assert call_main in code
    assert probe("keep", code)[1] > 100_000
