"""The format helpers' time against the answer's length: linear, as their docstrings say.

Command:
  python benchmarks/format_linear.py                    # 64 KB, 256 KB, 1 MB, 4 MB
  python benchmarks/format_linear.py --sizes 65536,1048576 --runs 5

One process: each helper of `rewards/format.py` (`strip_eos`, `r1_format_reward`,
`dominant_script`, `language_consistency`) on answers of each shape a model can emit (long runs
of end tokens, spaces, tags, letters, math, LaTeX commands), at each size. Time is the median
CPU time of this thread (`time.thread_time`) over `--runs` calls, so other processes on the
machine do not count; "x per 16x" is the time at a size over the time at a sixteenth of it:
about 16 for a linear helper, about 256 for a quadratic one. The last row times the
quadratic control, `strip_eos` written as one slice per end string (the slices copy the text
once per end token), on the sizes up to 1 MB.

tests/rewards/test_format.py runs every helper on 1 MB (and `strip_eos` on 16 MB of end
tokens) under a hang guard; the times are measured here, not asserted there.

Results on a 2-core CPU (load average below 0.8), 2026-12-03, 3 runs: the slowest shapes of
each helper and the control. The other rows of the table (45 in all) have ratios of 15.7 to
20.2, or about 1 where the work does not grow (`strip_eos` on an answer that does not end in
an end string).

  python benchmarks/format_linear.py
  helper               shape                       64 KB s  256 KB s    1 MB s    4 MB s x per 16x
  strip_eos            end tokens                    0.006     0.015     0.060     0.241      15.9
  strip_eos            end tokens and newlines       0.004     0.015     0.061     0.245      16.0
  r1_format_reward     end tokens                    0.004     0.015     0.061     0.240      15.9
  r1_format_reward     end tokens and newlines       0.004     0.015     0.061     0.248      16.6
  dominant_script      inline math                   0.016     0.064     0.262     1.080      16.9
  language_consistency inline math                   0.017     0.065     0.267     1.028      16.2
  strip_eos (slicing)  end tokens                    0.006     0.086     1.408         -     217.4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlvr_jax.rewards import format as fmt  # noqa: E402

GOOD = "<think>\nadd them\n</think>\n<answer>\n4\n</answer>"
SHAPES = {
    "end tokens": lambda n: GOOD + "<|im_end|>" * (n // 10),
    "end tokens and newlines": lambda n: GOOD + "<|im_end|>\n" * (n // 11),
    "mixed end tokens": lambda n: GOOD + "</s><|endoftext|><|eot_id|>" * (n // 27),
    "trailing spaces": lambda n: GOOD + " " * n,
    "spaces then an end token": lambda n: GOOD + " " * n + "<|im_end|>",
    "tags": lambda n: "<think></think><answer>" * (n // 23),
    "letters": lambda n: "a" * n,
    "han": lambda n: "中" * n,
    "inline math": lambda n: "$x$" * (n // 3),
    "unclosed math": lambda n: "$$ \\( \\[ $" * (n // 10),
    "commands": lambda n: "\\frac" * (n // 5),
}
HELPERS = {
    "strip_eos": fmt.strip_eos,
    "r1_format_reward": fmt.r1_format_reward,
    "dominant_script": fmt.dominant_script,
    "language_consistency": lambda text: fmt.language_consistency("What is 2+2?", text),
}
CONTROL_MAX = 1 << 20  # the quadratic control takes minutes beyond


def strip_eos_by_slicing(text: str, eos_strings=fmt.EOS_STRINGS) -> str:
    """`strip_eos` with one slice per end string: the same result, quadratic time."""
    text = text.rstrip()
    changed = True
    while changed:
        changed = False
        for eos in eos_strings:
            if eos and text.endswith(eos):
                text = text[: -len(eos)].rstrip()
                changed = True
    return text


def cpu_seconds(fn, text: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.thread_time()
        fn(text)
        times.append(time.thread_time() - start)
    return statistics.median(times)


def label(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="65536,262144,1048576,4194304")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = [(h, s, HELPERS[h]) for h in HELPERS for s in SHAPES]
    rows.append(("strip_eos (slicing)", "end tokens", strip_eos_by_slicing))
    header = f"{'helper':21}{'shape':25}" + "".join(f"{label(n) + ' s':>10}" for n in sizes)
    print(header + f"{'x per 16x':>10}")
    for helper, shape, fn in rows:
        control = fn is strip_eos_by_slicing
        times = {}
        for n in sizes:
            if control and n > CONTROL_MAX:
                continue
            times[n] = cpu_seconds(fn, SHAPES[shape](n), args.runs)
        cells = "".join(f"{times[n]:10.3f}" if n in times else f"{'-':>10}" for n in sizes)
        ratios = [times[n] / times[n // 16] for n in times if n // 16 in times and times[n // 16]]
        ratio = f"{max(ratios):10.1f}" if ratios else f"{'-':>10}"
        print(f"{helper:21}{shape:25}{cells}{ratio}")


if __name__ == "__main__":
    main()
