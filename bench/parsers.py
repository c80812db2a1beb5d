"""Response parsers on adversarial text: parse time at 1x, 2x, 4x and 8x the input.

Every registered parser (``qwen3``, ``search_r1`` and whatever plugins add) parses each case
of the conformance corpus (``rlfactory_core.testing.PARSER_CORPUS``: thousands of broken
``<tool_call>`` blocks, megabytes of ``<think>``, deep and huge JSON, lone surrogates, NUL
bytes, mixtures), built at ``--size`` characters and at 2, 4 and 8 times that. Each parse is
timed ``--runs`` times in CPU seconds of this process (``time.process_time``: on a shared
machine, other processes' work does not count); the fastest counts, and the spread
(slowest / fastest - 1) is printed with it. Linear parsing gives t(8x) / t(1x) near 8;
quadratic near 64. The tests check the
same property with measures that do not depend on the machine (``check_parser_conformance``);
this shows the seconds.

    .venv/bin/python bench/parsers.py                       # 0.5 MB to 4 MB per case (~2 minutes)
    .venv/bin/python bench/parsers.py --size 100000 --runs 5 --parser qwen3
"""

from __future__ import annotations

import argparse
import time

from rlfactory_core.plugins import components
from rlfactory_core.testing import PARSER_CORPUS

SCALES = (1, 2, 4, 8)


def _time(parser, text: str, runs: int) -> tuple[float, float]:
    """(fastest, spread) of ``runs`` parses of ``text``."""
    times = []
    for _ in range(runs):
        start = time.process_time()
        parser.parse(text)
        times.append(time.process_time() - start)
    return min(times), max(times) / min(times) - 1 if min(times) > 0 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=500_000, help="characters of each case at 1x")
    ap.add_argument("--runs", type=int, default=3, help="parses per size; the fastest counts")
    ap.add_argument("--parser", action="append", help="parser names (default: every registered parser)")
    ap.add_argument("--case", action="append", help="case names (default: the whole corpus)")
    args = ap.parse_args()

    registered = {name: component.obj for name, component in components("parser").items()}
    names = args.parser or sorted(registered)
    unknown = [name for name in names if name not in registered]
    if unknown:
        raise SystemExit(f"no parser named {', '.join(unknown)}; registered: {', '.join(sorted(registered))}")
    cases = [case for case in PARSER_CORPUS if not args.case or case.name in args.case]
    if not cases:
        raise SystemExit(f"no case named {', '.join(args.case)}; cases: {', '.join(c.name for c in PARSER_CORPUS)}")

    texts = {case.name: [case.build(args.size * scale) for scale in SCALES] for case in cases}
    header = "".join(f"{f't({scale}x) ms':>12}" for scale in SCALES)
    # CPU time has a coarse clock on some systems; below this a ratio is noise.
    resolution = max(time.get_clock_info("process_time").resolution, 1e-3)
    for name in names:
        parser = registered[name]
        print(f"\nparser {name!r}: {args.size:,} chars at 1x, fastest of {args.runs} runs")
        print(f"{'case':34}{header}{'8x/1x':>8}{'ns/char':>9}{'spread':>8}")
        worst_ratio, worst_spread, total = 0.0, 0.0, 0.0
        for case in cases:
            timings = [_time(parser, text, args.runs) for text in texts[case.name]]
            seconds = [t for t, _ in timings]
            spread = max(s for _, s in timings)
            ratio = seconds[-1] / seconds[0] if seconds[0] >= resolution else float("nan")
            per_char = seconds[-1] / len(texts[case.name][-1]) * 1e9
            worst_ratio = max(worst_ratio, ratio) if ratio == ratio else worst_ratio
            worst_spread, total = max(worst_spread, spread), total + sum(seconds)
            cells = "".join(f"{t * 1e3:12.1f}" for t in seconds)
            print(f"{case.name:34}{cells}{ratio:8.1f}{per_char:9.0f}{spread:8.0%}")
        print(f"worst 8x/1x ratio {worst_ratio:.1f} (linear: 8, quadratic: 64); "
              f"largest spread between runs {worst_spread:.0%}; {total:.1f} s of parsing")


if __name__ == "__main__":
    main()
