"""Run every benchmark script in this folder, one after another (``make bench``).

Each script compares against its own named baseline in the same run and prints its table; this runner
only sequences them and reports which ones failed. Figures go into BENCHMARKS.md by hand, with the
command that produced them. Pass script names (e.g. ``bench_foundation_noise``) to run a subset.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    wanted = set(argv if argv is not None else sys.argv[1:])
    scripts = sorted(p for p in here.glob("bench_*.py") if not wanted or p.stem in wanted)
    failed = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        start = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script)])
        print(f"=== {script.name}: exit {rc} after {time.perf_counter() - start:.1f} s ===", flush=True)
        if rc != 0:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
