"""Smoke test of benchmarks/reliability.py: its cheapest hostile cases (no kills, no
training runs, no property suite) end in a named error or a correct result, and its
classifier tells crashes, wrong results and excess apart."""
import time

from benchmarks import reliability as R


def test_cheap_cases_end_in_a_named_error_or_a_correct_result(tmp_path):
    cases = R.select_cases(cheap=True)
    assert len(cases) >= 12 and {c.group for c in cases} >= {"silent wrong results", "crashes",
                                                            "memory and time"}
    assert any(c.isolate for c in cases)  # the forked, memory-limited path too
    ctx = R.Context(tmp_path)
    start = time.perf_counter()
    results = R.run_cases(cases, ctx, echo=lambda line: None)
    assert time.perf_counter() - start < 10
    bad = [(r.case, r.outcome, r.message) for r in results if r.outcome not in R.GOOD]
    assert bad == []
    assert {r.outcome for r in results} == {R.NAMED, R.CORRECT}


def test_the_classifier_tells_the_outcomes_apart(tmp_path):
    ctx = R.Context(tmp_path)

    def outcome(fn, **options):
        return R.run_case(R.Case("crashes", "probe", fn, **options), ctx).outcome

    def raise_value_error():
        raise ValueError("x must be positive, got -1")

    assert outcome(raise_value_error, error=(ValueError,), names=r"x must be positive") == R.NAMED
    assert outcome(raise_value_error, error=(ValueError,), names=r"weights") == R.CRASH
    assert outcome(raise_value_error, error=(TypeError,), names=r"x") == R.CRASH
    assert outcome(raise_value_error, error=(ValueError,), names=r"x", forbid=r"-1") == R.CRASH
    assert outcome(lambda: 1, error=(ValueError,), names=r"x") == R.WRONG  # accepted
    assert outcome(lambda: "fine") == R.CORRECT
    assert outcome(lambda: R.check(False, "off by one")) == R.WRONG
    assert outcome(lambda: [][1]) == R.CRASH
    assert outcome(lambda: time.sleep(0.3), limit=0.1) == R.EXCESSIVE

    def allocate():  # 64 GB: refused by RLIMIT_AS in the forked child
        import torch
        torch.empty(1 << 34)
    assert outcome(allocate, isolate=True, memory_gib=1.0) == R.EXCESSIVE


def test_property_statistics_are_parsed():
    text = """
tests/test_properties.py::test_a:

  - during reuse phase (0.10 seconds):
    - Typical runtimes: ~ 1ms
    - 2 passing, 0 failing, and 0 invalid test cases

  - during generate phase (1.50 seconds):
    - 98 passing, 1 failing, and 7 invalid test cases

tests/test_properties.py::test_b:

  - during generate phase (0.20 seconds):
    - 100 passing, 0 failing, and 0 invalid test cases
"""
    stats = R.parse_statistics(text)
    assert stats["test_a"]["passing"] == 100 and stats["test_a"]["failing"] == 1
    assert stats["test_a"]["invalid"] == 7 and abs(stats["test_a"]["seconds"] - 1.6) < 1e-9
    assert stats["test_b"]["passing"] == 100 and stats["test_b"]["phases"] == "generate"
