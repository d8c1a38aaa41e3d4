"""CPU seconds of whole `dpfl` processes: `dpfl --version` and `dpfl --help` (target < 0.3 s each: they import
nothing heavy) and `dpfl account gaussian ...` (dp_accounting, no torch), each a fresh interpreter
(``python -m dpfl.cli``, what the installed `dpfl` script runs), timed by ``resource.getrusage(RUSAGE_CHILDREN)``
(user + system time of the finished child), so that the machine's load does not enter as wall time would. Each
command runs ``--repeats`` times; the best and the median are printed, and which of torch, dp_accounting, scipy and
numpy the command imported.

    python benchmarks/cli_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys

COMMANDS = {
    "dpfl --version": ["--version"],
    "dpfl --help": ["--help"],
    "dpfl account gaussian": ["account", "gaussian", "--noise-multiplier", "1.0", "--sampling-rate", "0.01",
                              "--steps", "1000", "--delta", "1e-5"],
}
HEAVY = ("torch", "dp_accounting", "scipy", "numpy")
#: Runs the CLI as `python -m dpfl.cli` does, then names the heavy modules it imported (on stderr, after its output).
PROBE = ("import sys\nfrom dpfl.cli import main\ntry:\n    code = main(sys.argv[1:])\nexcept SystemExit as e:\n"
         "    code = e.code\nprint('imported:', *[m for m in %r if m in sys.modules], file=sys.stderr)\n"
         "sys.exit(code)" % (HEAVY,))


def cpu_seconds(argv: list[str]) -> tuple[float, str]:
    """User + system CPU seconds of one `dpfl ARGV` process, and the heavy modules it imported."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    imported = done.stderr.strip().splitlines()[-1].removeprefix("imported:").strip() or "none"
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), imported


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    for name, argv in COMMANDS.items():
        times, imported = [], ""
        for _ in range(repeats):
            seconds, imported = cpu_seconds(argv)
            times.append(seconds)
        print(f"{name:<24} best {min(times):6.3f} s  median {statistics.median(times):6.3f} s CPU "
              f"({repeats} runs)   imports: {imported}", flush=True)


if __name__ == "__main__":
    main()
