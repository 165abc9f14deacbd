"""The PASS/FAIL tally of the CUDA checks (check.py, gpu_check.py).

    from tally import result, finish
    result("name", problems)   # problems: a list of strings; empty: PASS
    finish()                   # "N passed, N failed"; exits 1 on a failure

Each result prints "PASS name", or "FAIL name" and each problem indented
by four spaces, and is counted.
"""
import sys

passed = failed = 0


def result(name, problems):
    """Counts and prints one check: PASS when problems is empty."""
    global passed, failed
    if problems:
        failed += 1
        print(f"FAIL {name}")
        for p in problems:
            print(f"    {p}")
    else:
        passed += 1
        print(f"PASS {name}")


def finish():
    """Prints the totals and exits: 1 when a check failed, else 0."""
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
