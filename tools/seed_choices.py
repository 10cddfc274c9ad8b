"""Seed one card's recorded autotune choices from another's, before recording that card.

Triton keys an autotune result by its own version, the compile target (``cuda`` and the arch, 90
for both the H100 and the H200, with ptxas's version), the kernel's source, the tuning key and the
candidate configurations: nothing else about the card. So on the same stack the choices recorded
on one sm_90 card land in the same cache hash folders on another, and a recording there that
starts from them times those configurations instead of autotuning every fla kernel anew (tens of
seconds a kernel key). What the recording then measures is timed with those configurations, as
any recorded choice is; the manifest names the card each seeded choice was chosen on.

    python tools/seed_choices.py baselines/h200.autotune baselines/h100.autotune --skip-source families/models/

Only hash folders the target lacks are copied (the target's own choices are never replaced);
``--skip-source`` leaves out the choices whose test id holds the text (repeatable).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pytest_attnperf.store import autotune  # noqa: E402


def seed(source: Path, target: Path, skip: tuple[str, ...] = ()) -> tuple[int, int, list[str]]:
    """Copy the choices of ``source`` whose hash folder ``target`` lacks (and whose test id holds
    none of ``skip``) into ``target``, each noted as chosen on the source's card. Returns
    ``(copied, target's own, problems)``; an unreadable manifest raises ``AutotuneError``."""
    theirs, ours = autotune.load_manifest(source), autotune.load_manifest(target)
    card = source.name.removesuffix(".autotune")
    wanted = {h: c for h, c in theirs.items() if h not in ours and not any(s in c.source for s in skip)}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        installed, problems = autotune.install(source, cache)
        produced = {rel: f"{c.source} (chosen on {card})" for rel, c in installed.items() if c.hash_dir in wanted}
        triton = next((c.triton for c in wanted.values() if c.triton), None)
        copied = 0
        if produced:
            copied, _, more = autotune.record(target, cache, produced, triton)
            problems += more
    return copied, len(ours), problems


def main(argv: list[str]) -> int:
    """Seed the target folder; exit 2 naming the manifest that cannot be read."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="the card's folder to copy from, e.g. baselines/h200.autotune")
    parser.add_argument("target", type=Path, help="the card's folder to seed, e.g. baselines/h100.autotune")
    parser.add_argument("--skip-source", action="append", default=[], metavar="TEXT",
                        help="leave out the choices whose test id holds TEXT (repeatable)")
    args = parser.parse_args(argv)
    try:
        copied, kept, problems = seed(args.source, args.target, tuple(args.skip_source))
    except autotune.AutotuneError as exc:
        print(f"seed_choices: {exc}", file=sys.stderr)
        return 2
    print(f"seeded {copied} choices from {args.source} into {args.target} ({kept} of its own kept)",
          *problems, sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
